//! The layer library: validates a layer call's arguments and lowers it to IR primitives.
//!
//! Interface between the syntax side of the front end (`front::lower`, which resolves names,
//! expands blocks and evaluates compile-time arithmetic) and the operator table. Every `.cvnn`
//! operator (`conv2d`, `batchnorm`, `crelu`, `cross_entropy`, `+`, ...) is lowered here, one
//! file per family. [`lower_layer`] binds the arguments to the operator's parameter names,
//! checks the operand count, then calls the family's lowering, which checks operand shapes
//! and dtypes and appends primitives through [`LowerCtx::b`].
//!
//! Operand conventions (what the caller passes in `operands`):
//! - the piped value first, then the tensor-valued positional arguments in source order
//!   (`concat(a, b)`, `cross_entropy(logits, label)`, `complex(re, im)`, `a + b`);
//! - `+ - * /` take two tensors, or one tensor and one numeric argument (`x * 2.0` is
//!   `*` with operand `x` and args `[2.0]`); `-` with one tensor and no argument negates;
//! - variadic integer arguments are positional: `reshape(B, 16, 4)`, `split(16, 16, axis = 1,
//!   index = 0)`, `permute(0, 2, 1)`.

// Every lowering returns the crate's `Diagnostic` by value (the interface `front::lower`
// calls); errors are the cold path and end the compilation, so their size does not matter.
#![allow(clippy::result_large_err)]

mod activation;
mod args;
mod attention;
mod conv;
mod conv3d;
mod dense;
mod elementwise;
mod embedding;
mod groupnorm;
mod loss;
mod norm;
mod pool;
mod recurrent;
mod reduce;
mod shape;
mod spectral;
mod upsample;

use crate::diag::Diagnostic;
use crate::ir::builder::Builder;
use crate::ir::*;
use args::Args;
use cvc_grammar::Span;
use std::collections::HashMap;
use std::sync::OnceLock;

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
    /// `(a, b, ...)` tuple holding at least one non-integer number, e.g. the per-class
    /// `weight = (1.0, 0.5)` of `cross_entropy` (all-integer tuples stay [`ArgValue::Tuple`]).
    Numbers(Vec<f64>),
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
    /// The declared class count of every `class[..] of N` input, with the declaration's span:
    /// losses check it against the logits' width.
    pub classes: HashMap<Value, (usize, Span)>,
    /// The `ignore_index` each class loss reads its labels with, with the loss's span: one per
    /// label input (the data loader admits it besides `0..classes`).
    pub ignore_index: HashMap<Value, (i64, Span)>,
}

impl<'g> LowerCtx<'g> {
    /// A context appending to `graph`.
    pub fn new(graph: &'g mut Graph, mode: Mode) -> Self {
        LowerCtx {
            b: Builder::new(graph),
            mode,
            params: Vec::new(),
            step: None,
            next_salt: 1,
            classes: HashMap::new(),
            ignore_index: HashMap::new(),
        }
    }

    /// The type of `v`.
    pub fn ty(&self, v: Value) -> TensorType {
        self.b.graph.ty(v).clone()
    }

    /// Creates the trainable parameter `<prefix>.<name>` and records it in [`LowerCtx::params`].
    fn param(&mut self, site: &Site, name: &str, init: Init, ty: TensorType) -> Value {
        let full = format!("{}.{name}", site.call.param_prefix);
        let saved = self.b.origin.role;
        self.b.origin.role = Role::Param;
        let v = self.b.leaf(Op::Param { name: full.clone(), init }, ty.clone());
        self.b.origin.role = saved;
        self.params.push(ParamInfo { name: full, value: v, ty });
        v
    }

    /// Creates the trainable parameter of a `param NAME: TYPE = INIT` declaration, named
    /// `NAME` (no layer prefix), and records it in [`LowerCtx::params`]. The caller sets the
    /// origin (span, label).
    pub(crate) fn declared_param(&mut self, name: &str, init: Init, ty: TensorType) -> Value {
        let saved = self.b.origin.role;
        self.b.origin.role = Role::Param;
        let v = self.b.leaf(Op::Param { name: name.to_string(), init }, ty.clone());
        self.b.origin.role = saved;
        self.params.push(ParamInfo { name: name.to_string(), value: v, ty });
        v
    }

    /// Creates the persistent non-trainable buffer `<prefix>.<name>` (running statistics).
    fn state(&mut self, site: &Site, name: &str, init: Init, ty: TensorType) -> Value {
        let full = format!("{}.{name}", site.call.param_prefix);
        let saved = self.b.origin.role;
        self.b.origin.role = Role::State;
        let v = self.b.leaf(Op::State { name: full, init }, ty);
        self.b.origin.role = saved;
        v
    }

    /// The i32 scalar step counter (`State "step"`), created on first use; the runtime
    /// increments it after each step.
    fn step_counter(&mut self) -> Value {
        if let Some(s) = self.step {
            return s;
        }
        let existing = self.b.graph.find_leaf("step");
        let s = existing.unwrap_or_else(|| {
            let saved =
                std::mem::replace(&mut self.b.origin, Origin { role: Role::State, label: "step".into() });
            let v = self.b.leaf(
                Op::State { name: "step".into(), init: Init::Zeros },
                TensorType::new(DType::I32, Shape::scalar()),
            );
            self.b.origin = saved;
            v
        });
        self.step = Some(s);
        s
    }

    /// `target ← (1 - m)·target + m·value` (a running-statistic update), with
    /// [`Role::Update`] origin. `value` is reshaped to the target's shape.
    fn running_update(
        &mut self,
        site: &Site,
        target: Value,
        value: Value,
        momentum: f64,
    ) -> Result<(), Diagnostic> {
        let saved = self.b.origin.role;
        self.b.origin.role = Role::Update;
        let r = (|| {
            let shape = self.b.graph.ty(target).shape.clone();
            let v = self.b.reshape(value, shape)?;
            let keep = self.b.scale(target, 1.0 - momentum)?;
            let add = self.b.scale(v, momentum)?;
            let new = self.b.add2(keep, add)?;
            self.b.add(Op::Assign, &[target, new]).map(|_| ())
        })();
        self.b.origin.role = saved;
        r.at(site)
    }
}

/// One call being lowered: the call and its bound arguments.
pub(crate) struct Site<'c> {
    /// The call.
    pub(crate) call: &'c LayerCall<'c>,
    /// The call's arguments, bound to the operator's parameter names.
    pub(crate) args: Args<'c>,
}

impl Site<'_> {
    /// An error about operand `o` (primary label on the call, secondary on the operand).
    pub(crate) fn operand_error(
        &self,
        ctx: &LowerCtx,
        o: &Operand,
        message: String,
        label: impl Into<String>,
    ) -> Diagnostic {
        let ty = ctx.ty(o.value);
        let d = Diagnostic::error(message, self.call.span, label);
        if o.span == self.call.span {
            d.with_note(format!("the operand is {ty}"))
        } else {
            d.with_label(o.span, format!("this is {ty}"))
        }
    }

    /// An error at the call itself.
    pub(crate) fn error(&self, message: String, label: impl Into<String>) -> Diagnostic {
        Diagnostic::error(message, self.call.span, label)
    }
}

/// Converts builder errors (strings) into diagnostics at the call's span.
pub(crate) trait AtSite<T> {
    /// The error as a diagnostic at `site`'s call.
    fn at(self, site: &Site) -> Result<T, Diagnostic>;
}

impl<T> AtSite<T> for Result<T, String> {
    fn at(self, site: &Site) -> Result<T, Diagnostic> {
        self.map_err(|e| site.error(format!("`{}`: {e}", site.call.op), "while lowering this layer"))
    }
}

/// Lowering function of one operator.
pub(crate) type LowerFn = fn(&mut LowerCtx, &Site, &[Operand]) -> Result<Value, Diagnostic>;

/// One row of the operator table.
#[derive(Clone, Copy)]
pub(crate) struct OpDef {
    /// Operator name as written in `.cvnn`.
    pub(crate) name: &'static str,
    /// Signature shown in help lines.
    pub(crate) signature: &'static str,
    /// Argument names, positional order first.
    pub(crate) args: &'static [&'static str],
    /// Whether extra positional arguments are collected (reshape, split, permute).
    pub(crate) variadic: bool,
    /// Minimum and maximum number of tensor operands.
    pub(crate) operands: (usize, usize),
    /// The lowering.
    pub(crate) lower: LowerFn,
}

/// The operator families in documentation order, each with its table rows.
const FAMILIES: [(&str, &[OpDef]); 15] = [
    ("dense", dense::DEFS),
    ("embedding", embedding::DEFS),
    ("convolution", conv::DEFS),
    ("normalisation", norm::DEFS),
    ("group normalisation", groupnorm::DEFS),
    ("activation", activation::DEFS),
    ("pooling", pool::DEFS),
    ("reduction", reduce::DEFS),
    ("upsampling", upsample::DEFS),
    ("elementwise", elementwise::DEFS),
    ("shape", shape::DEFS),
    ("spectral", spectral::DEFS),
    ("losses", loss::DEFS),
    ("attention", attention::DEFS),
    ("recurrent", recurrent::DEFS),
];

fn table() -> &'static [&'static OpDef] {
    static TABLE: OnceLock<Vec<&'static OpDef>> = OnceLock::new();
    TABLE.get_or_init(|| FAMILIES.iter().flat_map(|(_, f)| f.iter()).collect())
}

/// The operator table of `docs/LANGUAGE.md`, rendered from the signatures above (one row per
/// family, every operator's signature as `cvc check` shows it), so the documentation cannot
/// list an operator the compiler lacks or miss one it has. A test compares it with the file.
pub fn operator_table_markdown() -> String {
    let mut s = String::from("| family | operators |\n| --- | --- |\n");
    for (family, defs) in FAMILIES {
        // `|` inside a signature (`kind = naive | whitening`) would end the table cell.
        let sigs: Vec<String> = defs
            .iter()
            .map(|d| {
                let sig = d.signature.replace('|', "\\|");
                // A signature holding a backtick needs a double-backtick code span.
                if sig.contains('`') {
                    format!("`` {sig} ``")
                } else {
                    format!("`{sig}`")
                }
            })
            .collect();
        s.push_str(&format!("| {family} | {} |\n", sigs.join(", ")));
    }
    s
}

/// Every operator name the library lowers (for "did you mean" suggestions).
pub fn known_ops() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| table().iter().map(|d| d.name).collect())
}

/// The signature of operator `op` as shown in help lines (`conv2d(out, kernel, ...)`).
pub fn signature(op: &str) -> Option<&'static str> {
    table().iter().find(|d| d.name == op).map(|d| d.signature)
}

/// Checks `call` against the operator table and lowers it, appending nodes to `ctx.b`'s graph
/// with `call.span` and a [`Role::Forward`] origin labelled `call.label`.
pub fn lower_layer(ctx: &mut LowerCtx, call: &LayerCall, operands: &[Operand]) -> Result<Value, Diagnostic> {
    let Some(def) = table().iter().find(|d| d.name == call.op) else {
        let d = Diagnostic::error(format!("unknown operator `{}`", call.op), call.span, "not a known layer");
        return Err(match args::suggest(call.op, known_ops().iter().copied()) {
            Some(s) => d.with_help(format!("did you mean `{s}`?")),
            None => d.with_help(format!("known operators: {}", known_ops().join(", "))),
        });
    };
    let (lo, hi) = def.operands;
    if operands.len() < lo || operands.len() > hi {
        let want = if lo == hi {
            format!("{lo}")
        } else if hi == usize::MAX {
            format!("at least {lo}")
        } else {
            format!("{lo} to {hi}")
        };
        let s = if want == "1" { "" } else { "s" };
        return Err(Diagnostic::error(
            format!("`{}` takes {want} tensor operand{s}, got {}", call.op, operands.len()),
            call.span,
            "wrong number of tensor operands",
        )
        .with_help(format!("the signature is `{}`", def.signature)));
    }
    let args = Args::parse(call, def.signature, def.args, def.variadic)?;
    let site = Site { call, args };
    ctx.b.at(call.span, Role::Forward, call.label.clone());
    (def.lower)(ctx, &site, operands)
}

// ---- helpers shared by the families ----

/// An f32 or c64 tensor type (`what` names the operand in errors); rejects i32.
pub(crate) fn need_float(
    ctx: &LowerCtx,
    site: &Site,
    o: &Operand,
    what: &str,
) -> Result<TensorType, Diagnostic> {
    let ty = ctx.ty(o.value);
    if ty.dtype == DType::I32 {
        return Err(site.operand_error(
            ctx,
            o,
            format!("`{}` needs a real or complex {what}, got class labels (i32)", site.call.op),
            "labels take no arithmetic",
        ));
    }
    Ok(ty)
}

/// Checks the rank of `o`'s type to be in `ranks`, with `expect` describing the layout.
pub(crate) fn need_rank(
    ctx: &LowerCtx,
    site: &Site,
    o: &Operand,
    ranks: std::ops::RangeInclusive<usize>,
    expect: &str,
) -> Result<TensorType, Diagnostic> {
    let ty = need_float(ctx, site, o, "tensor")?;
    if !ranks.contains(&ty.shape.rank()) {
        return Err(site.operand_error(
            ctx,
            o,
            format!("`{}` needs a {expect} tensor, got {}", site.call.op, ty.shape),
            format!("expects {expect}"),
        ));
    }
    Ok(ty)
}

/// The constant extent of axis `axis`, or an error naming it (`B` is not allowed there).
pub(crate) fn fixed_dim(
    ctx: &LowerCtx,
    site: &Site,
    o: &Operand,
    axis: usize,
    what: &str,
) -> Result<usize, Diagnostic> {
    let ty = ctx.ty(o.value);
    ty.shape.0[axis].fixed().ok_or_else(|| {
        site.operand_error(
            ctx,
            o,
            format!("`{}` needs a fixed {what} (axis {axis}), but it is the batch size B", site.call.op),
            "batch-sized axis here",
        )
    })
}

/// The weight initialiser chosen by a layer's `init` argument (`glorot`, `he` or `rayleigh`),
/// given the weight's fans as PyTorch computes them.
pub(crate) fn weight_init(
    site: &Site,
    default: &'static str,
    fan_in: usize,
    fan_out: usize,
) -> Result<Init, Diagnostic> {
    Ok(match site.args.choice("init", default, &["glorot", "he", "rayleigh"])? {
        "he" => Init::He { fan_in },
        "rayleigh" => Init::Rayleigh { fan_in, fan_out },
        _ => Init::Glorot { fan_in, fan_out },
    })
}

/// `[1, c, 1, ...]` of rank `rank` (a per-channel broadcast shape, channel axis 1).
pub(crate) fn channel_shape(rank: usize, c: Dim) -> Shape {
    let mut s = vec![Dim::Fixed(1); rank];
    if rank > 1 {
        s[1] = c;
    } else if rank == 1 {
        s[0] = c;
    }
    Shape(s)
}

/// The scalar `1 / (number of elements of `shape` on `axes`)`, batch extents symbolic.
pub(crate) fn inv_count(ctx: &mut LowerCtx, shape: &Shape, axes: &[usize]) -> Value {
    let mut fixed = 1usize;
    let mut bp = 0i32;
    for &a in axes {
        match shape.0[a] {
            Dim::Batch => bp += 1,
            Dim::Fixed(n) => fixed = fixed.saturating_mul(n),
        }
    }
    ctx.b.scalar(1.0 / fixed as f64, -bp)
}

/// The element count of `shape` on `axes` as an f32 scalar value (`n`, batch symbolic).
pub(crate) fn count_value(ctx: &mut LowerCtx, shape: &Shape, axes: &[usize]) -> Value {
    let mut fixed = 1usize;
    let mut bp = 0i32;
    for &a in axes {
        match shape.0[a] {
            Dim::Batch => bp += 1,
            Dim::Fixed(n) => fixed = fixed.saturating_mul(n),
        }
    }
    ctx.b.scalar(fixed as f64, bp)
}
