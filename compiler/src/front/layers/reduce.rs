//! Reductions along axes: `sum` and `mean` (PyTorch's `dim`/`keepdim`), and the real
//! `softmax`/`log_softmax`, max-shifted as cross-entropy's log-softmax is.

use super::*;

pub(crate) const DEFS: &[OpDef] = &[
    OpDef {
        name: "sum",
        signature: "sum(axis, keepdim = false)",
        args: &["axis", "keepdim"],
        variadic: false,
        operands: (1, 1),
        lower: sum,
    },
    OpDef {
        name: "mean",
        signature: "mean(axis, keepdim = false)",
        args: &["axis", "keepdim"],
        variadic: false,
        operands: (1, 1),
        lower: mean,
    },
    OpDef {
        name: "softmax",
        signature: "softmax(axis = -1)",
        args: &["axis"],
        variadic: false,
        operands: (1, 1),
        lower: softmax,
    },
    OpDef {
        name: "log_softmax",
        signature: "log_softmax(axis = -1)",
        args: &["axis"],
        variadic: false,
        operands: (1, 1),
        lower: log_softmax,
    },
];

/// The `axis` argument of a reduction (an integer or a tuple, negative counting from the
/// end), as sorted unique axes of a tensor of rank `rank`.
fn reduce_axes(site: &Site, rank: usize) -> Result<Vec<usize>, Diagnostic> {
    let Some(arg) = site.args.get("axis") else {
        return Err(site.args.missing("axis"));
    };
    let given = match &arg.value {
        ArgValue::Int(v) => vec![*v],
        ArgValue::Tuple(t) if !t.is_empty() => t.clone(),
        ArgValue::Tuple(_) => {
            return Err(site.args.bad(
                arg,
                format!("`{}` needs at least one axis", site.call.op),
                "empty tuple",
            ))
        }
        v => {
            return Err(site.args.bad(
                arg,
                format!("argument `axis` of `{}` must be an integer or a tuple of integers", site.call.op),
                format!("this is {}", args::kind_name(v)),
            ))
        }
    };
    let mut axes = Vec::with_capacity(given.len());
    for &v in &given {
        let Some(a) = args::resolve_axis(v, rank) else {
            return Err(site.args.bad(
                arg,
                format!("axis {v} is out of range for a tensor of rank {rank}"),
                format!("valid axes are {} to {}", -(rank as i64), rank as i64 - 1),
            ));
        };
        if axes.contains(&a) {
            return Err(site.args.bad(
                arg,
                format!("`{}` lists axis {a} twice", site.call.op),
                "repeated axis",
            ));
        }
        axes.push(a);
    }
    axes.sort_unstable();
    Ok(axes)
}

/// `Σ` (or the mean, `scale_by_count`) of `x` over its `axis` argument; the reduced axes are
/// dropped unless `keepdim`.
fn reduce(
    ctx: &mut LowerCtx,
    site: &Site,
    ops: &[Operand],
    scale_by_count: bool,
) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    let ty = need_float(ctx, site, x, "tensor")?;
    let axes = reduce_axes(site, ty.shape.rank())?;
    let keepdim = site.args.flag("keepdim", false)?;
    let inv = scale_by_count.then(|| inv_count(ctx, &ty.shape, &axes));
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let s = b.sum(x.value, &axes)?;
        let s = match inv {
            Some(inv) => b.mul(s, inv)?,
            None => s,
        };
        if keepdim {
            return Ok(s);
        }
        let kept = ty.shape.0.iter().enumerate().filter(|(a, _)| !axes.contains(a)).map(|(_, d)| *d);
        b.reshape(s, Shape(kept.collect()))
    })();
    r.at(site)
}

fn sum(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    reduce(ctx, site, ops, false)
}

fn mean(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    reduce(ctx, site, ops, true)
}

/// `x − m` and `Σ exp(x − m)` along `axis`, `m` the maximum behind a stop-gradient (the shift
/// changes no value and no gradient, only the range of `exp`).
fn shifted_exp_sum(
    ctx: &mut LowerCtx,
    site: &Site,
    x: &Operand,
) -> Result<(Value, Value, Value), Diagnostic> {
    let ty = need_float(ctx, site, x, "tensor")?;
    if ty.dtype.is_complex() {
        return Err(site
            .operand_error(
                ctx,
                x,
                format!("`{}` needs a real tensor, got {ty}", site.call.op),
                "complex input",
            )
            .with_help(format!("take `abs` (or `real`) first: `x |> abs |> {}`", site.call.op)));
    }
    let axis = site.args.axis("axis", -1, ty.shape.rank())?;
    let b = &mut ctx.b;
    let r = (|| -> Result<(Value, Value, Value), String> {
        let m = b.add(Op::Reduce { op: ReduceOp::Max, axes: vec![axis] }, &[x.value])?;
        let m = b.unary(UnaryOp::StopGrad, m)?;
        let xs = b.sub(x.value, m)?;
        let e = b.unary(UnaryOp::Exp, xs)?;
        let s = b.sum(e, &[axis])?;
        Ok((xs, e, s))
    })();
    r.at(site)
}

/// `exp(x − m) / Σ exp(x − m)` along `axis` (real input).
fn softmax(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let (_, e, s) = shifted_exp_sum(ctx, site, &ops[0])?;
    ctx.b.div(e, s).at(site)
}

/// `(x − m) − log Σ exp(x − m)` along `axis` (real input).
fn log_softmax(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let (xs, _, s) = shifted_exp_sum(ctx, site, &ops[0])?;
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let l = b.unary(UnaryOp::Log, s)?;
        b.sub(xs, l)
    })();
    r.at(site)
}
