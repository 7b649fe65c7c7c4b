//! Elementwise ops: `+ - * /`, `scale`, `conj`, `abs`, `abs2`, `angle`, `real`, `imag`,
//! `complex(re, im)`, `polar(m, θ)`, and `dropout` (a mask product).

use super::*;

const fn binop(name: &'static str, signature: &'static str, lower: LowerFn) -> OpDef {
    OpDef { name, signature, args: &["value"], variadic: false, operands: (1, 2), lower }
}

const fn unop(name: &'static str, lower: LowerFn) -> OpDef {
    OpDef { name, signature: name, args: &[], variadic: false, operands: (1, 1), lower }
}

pub(crate) const DEFS: &[OpDef] = &[
    binop("+", "a + b", add),
    binop("-", "a - b", sub),
    binop("*", "a * b", mul),
    binop("/", "a / b", div),
    OpDef {
        name: "scale",
        signature: "scale(c)",
        args: &["c"],
        variadic: false,
        operands: (1, 1),
        lower: scale,
    },
    unop("conj", conj),
    unop("abs", abs),
    unop("abs2", abs2),
    unop("angle", angle),
    unop("real", real),
    unop("imag", imag),
    OpDef {
        name: "complex",
        signature: "complex(re, im)",
        args: &[],
        variadic: false,
        operands: (2, 2),
        lower: complex,
    },
    OpDef {
        name: "polar",
        signature: "polar(magnitude, phase)",
        args: &[],
        variadic: false,
        operands: (2, 2),
        lower: polar,
    },
    OpDef {
        name: "dropout",
        signature: "dropout(p = 0.5)",
        args: &["p"],
        variadic: false,
        operands: (1, 1),
        lower: dropout,
    },
];

/// Checks that `a` and `b` broadcast together; a mismatch names the first differing axis.
pub(crate) fn check_broadcast(
    ctx: &LowerCtx,
    site: &Site,
    a: &Operand,
    b: &Operand,
) -> Result<Shape, Diagnostic> {
    let (ta, tb) = (ctx.ty(a.value), ctx.ty(b.value));
    if let Ok(s) = builder::broadcast_shapes(&ta.shape, &tb.shape) {
        return Ok(s);
    }
    let (ra, rb) = (ta.shape.rank(), tb.shape.rank());
    let rank = ra.max(rb);
    let mut help = None;
    for i in 0..rank {
        let (Some(ia), Some(ib)) = ((i + ra).checked_sub(rank), (i + rb).checked_sub(rank)) else { continue };
        let (da, db) = (ta.shape.0[ia], tb.shape.0[ib]);
        if da != db && da != Dim::Fixed(1) && db != Dim::Fixed(1) {
            help = Some(if i == 1 && ra == rb && rank >= 2 {
                let projection = match rank {
                    2 => format!("`linear({db})`"),
                    3 => format!("`conv1d({db}, kernel = 1)`"),
                    _ => format!("`conv2d({db}, kernel = 1)`"),
                };
                format!("the channel counts differ ({da} vs {db}): project one side first, e.g. with {projection}")
            } else {
                format!("axis {i} differs ({da} vs {db}); shapes broadcast only where one extent is 1")
            });
            break;
        }
    }
    let mut d = Diagnostic::error(
        format!("shape mismatch in `{}`: {} vs {}", site.call.op, ta.shape, tb.shape),
        site.call.span,
        "these shapes do not broadcast",
    );
    if a.span != site.call.span {
        d = d.with_label(a.span, format!("this is {ta}"));
    }
    if b.span != site.call.span && b.span != a.span {
        d = d.with_label(b.span, format!("this is {tb}"));
    }
    if let Some(h) = help {
        d = d.with_help(h);
    }
    Err(d)
}

/// `a ∘ b` for two tensors, or `x ∘ value` for a tensor and a numeric argument.
fn arith(ctx: &mut LowerCtx, site: &Site, ops: &[Operand], op: BinaryOp) -> Result<Value, Diagnostic> {
    let value = site.args.get("value");
    if ops.len() == 2 {
        if let Some(v) = value {
            return Err(site.args.bad(
                v,
                format!("`{}` takes two operands, not three", site.call.op),
                "extra operand",
            ));
        }
        need_float(ctx, site, &ops[0], "operand")?;
        let tb = need_float(ctx, site, &ops[1], "operand")?;
        check_broadcast(ctx, site, &ops[0], &ops[1])?;
        let (mut a, b) = (ops[0].value, ops[1].value);
        if op == BinaryOp::Div && tb.dtype.is_complex() && !ctx.ty(a).dtype.is_complex() {
            a = ctx.b.unary(UnaryOp::ToComplex, a).at(site)?;
        }
        return ctx.b.binary(op, a, b).at(site);
    }
    need_float(ctx, site, &ops[0], "operand")?;
    let x = ops[0].value;
    let Some(_) = value else {
        if op == BinaryOp::Sub {
            return ctx.b.unary(UnaryOp::Neg, x).at(site);
        }
        return Err(site.error(format!("`{}` needs two operands", site.call.op), "one operand given"));
    };
    let c = site.args.float("value", 0.0)?;
    let s = ctx.b.scalar(c, 0);
    ctx.b.binary(op, x, s).at(site)
}

fn add(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    arith(ctx, site, ops, BinaryOp::Add)
}
fn sub(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    arith(ctx, site, ops, BinaryOp::Sub)
}
fn mul(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    arith(ctx, site, ops, BinaryOp::Mul)
}
fn div(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    arith(ctx, site, ops, BinaryOp::Div)
}

/// `x · c` for a real constant `c`.
fn scale(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    if site.args.get("c").is_none() {
        return Err(site.args.missing("c"));
    }
    let c = site.args.float("c", 1.0)?;
    need_float(ctx, site, &ops[0], "tensor")?;
    ctx.b.scale(ops[0].value, c).at(site)
}

fn unary(ctx: &mut LowerCtx, site: &Site, ops: &[Operand], op: UnaryOp) -> Result<Value, Diagnostic> {
    need_float(ctx, site, &ops[0], "tensor")?;
    ctx.b.unary(op, ops[0].value).at(site)
}

fn conj(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    unary(ctx, site, ops, UnaryOp::Conj)
}
fn abs(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    unary(ctx, site, ops, UnaryOp::Abs)
}
fn abs2(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    unary(ctx, site, ops, UnaryOp::Abs2)
}
fn angle(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    unary(ctx, site, ops, UnaryOp::Angle)
}
fn real(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    unary(ctx, site, ops, UnaryOp::Real)
}
fn imag(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    unary(ctx, site, ops, UnaryOp::Imag)
}

/// Both operands must be real (`complex`, `polar`).
fn need_two_real(ctx: &LowerCtx, site: &Site, ops: &[Operand]) -> Result<(), Diagnostic> {
    for o in ops {
        let ty = need_float(ctx, site, o, "tensor")?;
        if ty.dtype.is_complex() {
            return Err(site
                .operand_error(
                    ctx,
                    o,
                    format!("`{}` combines two real tensors, but this operand is complex", site.call.op),
                    "expected a real tensor",
                )
                .with_help("take `real`, `imag`, `abs` or `angle` of it first"));
        }
    }
    check_broadcast(ctx, site, &ops[0], &ops[1]).map(|_| ())
}

/// `re + i·im`.
fn complex(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    need_two_real(ctx, site, ops)?;
    ctx.b.binary(BinaryOp::Complex, ops[0].value, ops[1].value).at(site)
}

/// `m·cos θ + i·m·sin θ`.
fn polar(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    need_two_real(ctx, site, ops)?;
    let (m, th) = (ops[0].value, ops[1].value);
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let c = b.unary(UnaryOp::Cos, th)?;
        let s = b.unary(UnaryOp::Sin, th)?;
        let re = b.mul(m, c)?;
        let im = b.mul(m, s)?;
        b.binary(BinaryOp::Complex, re, im)
    })();
    r.at(site)
}

/// Inverted dropout in training (one mask shared by re and im); the identity in eval.
fn dropout(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let p = site.args.float_in("p", 0.5, 0.0, 1.0, false)?;
    let x = &ops[0];
    let ty = need_float(ctx, site, x, "tensor")?;
    if ctx.mode == Mode::Eval || p == 0.0 {
        return Ok(x.value);
    }
    let step = ctx.step_counter();
    let salt = ctx.next_salt;
    ctx.next_salt += 1;
    let mask = ctx.b.add_shaped(Op::DropoutMask { p, salt }, &[step], Some(&ty.shape)).at(site)?;
    ctx.b.mul(x.value, mask).at(site)
}
