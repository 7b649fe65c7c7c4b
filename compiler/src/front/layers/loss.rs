//! Losses (each an f32 scalar of shape `[]`): `cross_entropy`, `mse` (complex `|z − t|²`), `l1`.

use super::*;

pub(crate) const DEFS: &[OpDef] = &[
    OpDef {
        name: "cross_entropy",
        signature: "cross_entropy(logits, labels)",
        args: &[],
        variadic: false,
        operands: (2, 2),
        lower: cross_entropy,
    },
    OpDef {
        name: "mse",
        signature: "mse(prediction, target)",
        args: &[],
        variadic: false,
        operands: (2, 2),
        lower: mse,
    },
    OpDef {
        name: "l1",
        signature: "l1(prediction, target)",
        args: &[],
        variadic: false,
        operands: (2, 2),
        lower: l1,
    },
];

/// Mean over the batch of `logsumexp(x) − x[label]`, with the max shift behind a stop-gradient.
fn cross_entropy(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let (lo, la) = (&ops[0], &ops[1]);
    let lt = ctx.ty(lo.value);
    if lt.dtype == DType::C64 {
        return Err(site
            .operand_error(ctx, lo, format!("`cross_entropy` needs real logits, got {lt}"), "complex logits")
            .with_help("take `abs` (or `real`) of the logits first"));
    }
    if lt.dtype == DType::I32 || lt.shape.rank() != 2 {
        let mut d = site.operand_error(
            ctx,
            lo,
            format!("`cross_entropy` needs logits of type f32[B, classes], got {lt}"),
            "expects f32[B, classes]",
        );
        if lt.shape.rank() > 2 {
            d = d.with_help("insert `flatten |> linear(classes)` before the loss");
        }
        return Err(d);
    }
    let classes = fixed_dim(ctx, site, lo, 1, "class count")?;
    let tt = ctx.ty(la.value);
    if tt.dtype != DType::I32 || tt.shape.rank() != 1 || tt.shape.0[0] != lt.shape.0[0] {
        return Err(site
            .operand_error(
                ctx,
                la,
                format!("`cross_entropy` needs class labels i32[{}], got {tt}", lt.shape.0[0]),
                "expects one class label per sample",
            )
            .with_help(format!("declare the labels as `class[B] of {classes}`")));
    }
    // A label of class c ≥ width would pick no logit: its loss would be logsumexp alone.
    if let Some(&(declared, decl)) = ctx.classes.get(&la.value) {
        if declared != classes {
            return Err(Diagnostic::error(
                format!(
                    "`cross_entropy`: the labels have {declared} classes but the logits are {classes} wide"
                ),
                site.call.span,
                "class counts differ",
            )
            .with_label(lo.span, format!("{classes} logits per sample"))
            .with_label(decl, format!("declared with {declared} classes"))
            .with_help(format!(
                "make the last layer before the loss `linear({declared})`, or declare the labels `of {classes}`"
            )));
        }
    }
    let inv_b = inv_count(ctx, &lt.shape, &[0]);
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let x = lo.value;
        let m = b.add(Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, &[x])?;
        let m = b.unary(UnaryOp::StopGrad, m)?;
        let xs = b.sub(x, m)?;
        let e = b.unary(UnaryOp::Exp, xs)?;
        let s = b.sum(e, &[1])?;
        let l = b.unary(UnaryOp::Log, s)?;
        let lse = b.add2(l, m)?;
        let oh = b.add(Op::OneHot { classes }, &[la.value])?;
        let xo = b.mul(x, oh)?;
        let picked = b.sum(xo, &[1])?;
        let per = b.sub(lse, picked)?;
        let tot = b.sum(per, &[0, 1])?;
        let mean = b.mul(tot, inv_b)?;
        b.reshape(mean, Shape::scalar())
    })();
    r.at(site)
}

/// `mean(f(prediction − target))` over every element, with `f = |·|²` or `|·|`.
fn mean_error(ctx: &mut LowerCtx, site: &Site, ops: &[Operand], f: UnaryOp) -> Result<Value, Diagnostic> {
    let (p, t) = (&ops[0], &ops[1]);
    let pt = need_float(ctx, site, p, "prediction")?;
    let tt = need_float(ctx, site, t, "target")?;
    if pt.shape != tt.shape {
        return Err(Diagnostic::error(
            format!("`{}`: the prediction is {} but the target is {}", site.call.op, pt.shape, tt.shape),
            site.call.span,
            "shapes differ",
        )
        .with_label(p.span, format!("this is {pt}"))
        .with_label(t.span, format!("this is {tt}"))
        .with_help("the prediction and the target must have the same shape"));
    }
    let axes: Vec<usize> = (0..pt.shape.rank()).collect();
    let inv = inv_count(ctx, &pt.shape, &axes);
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let d = b.sub(p.value, t.value)?;
        let e = b.unary(f, d)?;
        let s = if axes.is_empty() { e } else { b.sum(e, &axes)? };
        let m = b.mul(s, inv)?;
        b.reshape(m, Shape::scalar())
    })();
    r.at(site)
}

/// `mean |z − t|²` (complex or real).
fn mse(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    mean_error(ctx, site, ops, UnaryOp::Abs2)
}

/// `mean |z − t|`.
fn l1(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    mean_error(ctx, site, ops, UnaryOp::Abs)
}
