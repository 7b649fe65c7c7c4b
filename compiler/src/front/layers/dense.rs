//! Dense layers: `linear` (a learned weight) and `matmul` (a product of two activations).

use super::*;

pub(crate) const DEFS: &[OpDef] = &[
    OpDef {
        name: "linear",
        signature: "linear(out, bias = true, real = false, init = glorot | he | rayleigh)",
        args: &["out", "bias", "real", "init"],
        variadic: false,
        operands: (1, 1),
        lower: linear,
    },
    OpDef {
        name: "matmul",
        signature: "matmul(a, b, transpose_b = false, conj_b = false)",
        args: &["transpose_b", "conj_b"],
        variadic: false,
        operands: (2, 2),
        lower: matmul,
    },
];

/// `x · Wᵀ + b` on the last axis, as PyTorch's `nn.Linear`: `x: [.., in]` (rank ≥ 2), `W:
/// [out, in]` (c64 unless `real = true`), `b: [out]`, result `[.., out]`. A rank-3-or-more
/// input is a batched matmul with `W` broadcast over the leading axes (no reshape, no copy).
/// A real input is multiplied by the complex weight directly (MatMul mixes dtypes).
fn linear(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let out = site.args.count("out", None, 1)?;
    let bias = site.args.flag("bias", true)?;
    let real = site.args.flag("real", false)?;
    let x = &ops[0];
    let ty = need_float(ctx, site, x, "input")?;
    if ty.shape.rank() < 2 {
        return Err(site.operand_error(
            ctx,
            x,
            format!("`linear` needs an input [.., features] of rank 2 or more, got {}", ty.shape),
            "expects [.., features]",
        ));
    }
    let fan_in = fixed_dim(ctx, site, x, ty.shape.rank() - 1, "feature count")?;
    let wdt = if real { DType::F32 } else { DType::C64 };
    let init = weight_init(site, "glorot", fan_in, out)?;
    let w = ctx.param(site, "weight", init, TensorType::new(wdt, Shape::fixed(&[out, fan_in])));
    let mm = Op::MatMul { trans: [false, true], conj: [false, false], sum_batch: false };
    let mut y = ctx.b.add(mm, &[x.value, w]).at(site)?;
    if bias {
        let bound = 1.0 / (fan_in as f64).sqrt();
        let b = ctx.param(site, "bias", Init::Uniform { bound }, TensorType::new(wdt, Shape::fixed(&[out])));
        y = ctx.b.add2(y, b).at(site)?;
    }
    Ok(y)
}

/// `a · op(b)` between two tensors, batched over the leading axes as `torch.matmul`:
/// `a: [.., m, k]`, `b: [.., k, n]` (`[.., n, k]` with `transpose_b`; `conj_b` conjugates
/// it), result `[.., m, n]`. The leading axes are the same in both, or one operand is 2-D and
/// shared by every batch (cvc broadcasts no other way). Real and complex operands mix.
fn matmul(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let transpose_b = site.args.flag("transpose_b", false)?;
    let conj_b = site.args.flag("conj_b", false)?;
    let (a, b) = (&ops[0], &ops[1]);
    let ta = need_float(ctx, site, a, "operand")?;
    let tb = need_float(ctx, site, b, "operand")?;
    for (o, t, which) in [(a, &ta, "first"), (b, &tb, "second")] {
        if t.shape.rank() < 2 {
            return Err(site.operand_error(
                ctx,
                o,
                format!("`matmul` needs matrices [.., rows, columns]; the {which} operand is {}", t.shape),
                "expects rank 2 or more",
            ));
        }
    }
    let (sa, sb) = (&ta.shape.0, &tb.shape.0);
    let (ra, rb) = (sa.len(), sb.len());
    if ra > 2 && rb > 2 && sa[..ra - 2] != sb[..rb - 2] {
        return Err(site
            .error(
                format!("`matmul` batch axes differ: {} vs {}", ta.shape, tb.shape),
                "the leading axes must be the same",
            )
            .with_label(a.span, format!("this is {ta}"))
            .with_label(b.span, format!("this is {tb}"))
            .with_help(
                "the leading axes must match exactly, or one operand must be 2-D (shared by every batch)",
            ));
    }
    let k = sa[ra - 1];
    let kb = if transpose_b { sb[rb - 1] } else { sb[rb - 2] };
    if k != kb {
        let layout = if transpose_b { "[.., n, k] (transpose_b)" } else { "[.., k, n]" };
        return Err(site
            .error(
                format!("`matmul` inner extents differ: a has {k} columns, b has {kb} as k in {layout}"),
                "inner extents differ",
            )
            .with_label(a.span, format!("this is {ta}"))
            .with_label(b.span, format!("this is {tb}"))
            .with_help(if transpose_b {
                "without `transpose_b = true`, b is read as [.., k, n]".to_string()
            } else {
                "with `transpose_b = true`, b is read as [.., n, k]".to_string()
            }));
    }
    let op = Op::MatMul { trans: [false, transpose_b], conj: [false, conj_b], sum_batch: false };
    ctx.b.add(op, &[a.value, b.value]).at(site)
}
