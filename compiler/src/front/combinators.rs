//! Stage combinators: `residual(stages)` and `repeat(n, stages)`, pipelines taken as arguments.
//!
//! A transformer layer is two residual joins (`x + attn(norm(x))`, then `x + mlp(norm(x))`)
//! repeated a dozen times. Without combinators every join needs a binding of its own, so a
//! 12-layer model is 48 lines of bindings; with them it is `repeat(12, encoder(192, 768, 3))`.
//! The argument is an ordinary expression that the grammar already parses (`rmsnorm |>
//! attention(heads = 3)`): a combinator reads it as a list of stages instead of evaluating it,
//! so no new syntax is needed and `cvc fmt` lays it out like any call.

use cvc_grammar::ast::{self, Expr, ExprKind};
use cvc_grammar::Span;

/// The combinator names: reserved like operator names (a block cannot take them).
pub const COMBINATORS: [&str; 2] = ["residual", "repeat"];

/// Whether `name` is a combinator.
pub fn is_combinator(name: &str) -> bool {
    COMBINATORS.contains(&name)
}

/// One stage of a pipeline given as an argument: the operator or block and its arguments.
#[derive(Clone, Debug)]
pub struct StageRef<'a> {
    /// The operator or block name.
    pub callee: std::borrow::Cow<'a, ast::Path>,
    /// Its arguments (empty for a bare name).
    pub args: &'a [ast::Arg],
    /// The stage's text.
    pub span: Span,
}

/// The stages of `e` read as a pipeline applied to an implicit input: `f`, `f(a)`,
/// `f |> g(b) |> h`. `None` when `e` is something else (a number, a tuple, arithmetic).
pub fn stages(e: &Expr) -> Option<Vec<StageRef<'_>>> {
    fn head(e: &Expr) -> Option<StageRef<'_>> {
        match &e.kind {
            ExprKind::Call { callee, args } => {
                Some(StageRef { callee: std::borrow::Cow::Borrowed(callee), args, span: e.span })
            }
            ExprKind::Name(n) => {
                let ident = ast::Ident { name: n.clone(), span: e.span };
                let path = ast::Path { parts: vec![ident], span: e.span };
                Some(StageRef { callee: std::borrow::Cow::Owned(path), args: &[], span: e.span })
            }
            _ => None,
        }
    }
    match &e.kind {
        ExprKind::Pipe { head: h, stages } => {
            let mut out = vec![head(h)?];
            out.extend(stages.iter().map(|s| StageRef {
                callee: std::borrow::Cow::Borrowed(&s.callee),
                args: &s.args,
                span: s.span,
            }));
            Some(out)
        }
        _ => Some(vec![head(e)?]),
    }
}

/// The argument of combinator call `args` that holds its stages: the last positional
/// argument (`residual(f |> g)`, `repeat(12, f)`).
pub fn stage_arg(args: &[ast::Arg]) -> Option<&ast::Arg> {
    args.iter().rev().find(|a| a.name.is_none())
}

/// Every stage reachable from a stage `callee(args)`, through nested combinators, for the
/// checks that walk block bodies (unknown operators, recursive blocks).
pub fn flatten<'a>(callee: &'a ast::Path, args: &'a [ast::Arg], span: Span, out: &mut Vec<StageRef<'a>>) {
    out.push(StageRef { callee: std::borrow::Cow::Borrowed(callee), args, span });
    if callee.parts.len() == 1 && is_combinator(&callee.parts[0].name) {
        if let Some(inner) = stage_arg(args).and_then(|a| stages(&a.value)) {
            for s in inner {
                match s.callee {
                    std::borrow::Cow::Borrowed(p) => flatten(p, s.args, s.span, out),
                    std::borrow::Cow::Owned(_) => out.push(s),
                }
            }
        }
    }
}
