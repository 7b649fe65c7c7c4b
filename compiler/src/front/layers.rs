//! The layer library: validates a layer call's arguments and lowers it to IR primitives.
//!
//! Interface between the syntax side of the front end (`front::lower`, which resolves names,
//! expands blocks and evaluates compile-time arithmetic) and the operator table. Every `.cvnn`
//! operator (`conv2d`, `batchnorm`, `crelu`, `cross_entropy`, `+`, ...) is lowered here.

use crate::diag::Diagnostic;
use crate::ir::builder::Builder;
use crate::ir::*;
use cvc_grammar::Span;

/// A compile-time argument value (block parameters already substituted and evaluated).
#[derive(Clone, Debug, PartialEq)]
pub enum ArgValue {
    /// Integer literal (or integer arithmetic result).
    Int(i64),
    /// Float literal.
    Float(f64),
    /// `true` / `false`.
    Bool(bool),
    /// A bare word that is not a tensor name (e.g. `kind = whitening`).
    Ident(String),
    /// A string literal.
    Str(String),
    /// `a..b`.
    Range(f64, f64),
    /// `(a, b, ...)` tuple of integers, e.g. `kernel = (3, 5)`.
    Tuple(Vec<i64>),
}

/// One argument of a layer call.
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    /// Keyword, or `None` when positional.
    pub name: Option<String>,
    /// The value.
    pub value: ArgValue,
    /// Span of the whole argument (`kernel = 3`).
    pub span: Span,
}

/// A tensor operand with the span that named it (for error labels).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Operand {
    /// The IR value.
    pub value: Value,
    /// Where the operand came from (the piped expression or the argument name).
    pub span: Span,
}

/// A layer call: `op(args)` applied to tensor operands (the piped value first, then the
/// tensor-valued positional arguments such as `concat(a, b)` or `cross_entropy(logits, label)`).
#[derive(Clone, Debug)]
pub struct LayerCall<'a> {
    /// Operator name as written (`conv2d`, `+`, `cross_entropy`, ...).
    pub op: &'a str,
    /// Span of the call (name and argument list).
    pub span: Span,
    /// Non-tensor arguments in source order.
    pub args: &'a [Arg],
    /// Label for reports: `<binding>/<op>` (e.g. `features/conv1d`, `logits/linear`).
    pub label: String,
    /// Parameter-name prefix: `<binding>.<op><index>` so names are unique and stable,
    /// e.g. `features.conv1d_0` giving parameters `features.conv1d_0.weight`.
    pub param_prefix: String,
}

/// A parameter created while lowering, for the `cvc check` table.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamInfo {
    /// `<binding>.<param>` name.
    pub name: String,
    /// The IR value.
    pub value: Value,
    /// Type of the parameter.
    pub ty: TensorType,
}

/// State for lowering one model.
pub struct LowerCtx<'g> {
    /// Appends nodes.
    pub b: Builder<'g>,
    /// Train (batch statistics, dropout) or eval (running statistics, no dropout).
    pub mode: Mode,
    /// Parameters created so far, in creation order.
    pub params: Vec<ParamInfo>,
    /// The i32 step counter state, created on first use (dropout).
    pub step: Option<Value>,
    /// Next dropout salt.
    pub next_salt: u32,
}

impl<'g> LowerCtx<'g> {
    /// A context appending to `graph`.
    pub fn new(graph: &'g mut Graph, mode: Mode) -> Self {
        LowerCtx { b: Builder::new(graph), mode, params: Vec::new(), step: None, next_salt: 1 }
    }
}
