//! Dense layers: `linear`.

use super::*;

pub(crate) const DEFS: &[OpDef] = &[OpDef {
    name: "linear",
    signature: "linear(out, bias = true, real = false, init = glorot | he | rayleigh)",
    args: &["out", "bias", "real", "init"],
    variadic: false,
    operands: (1, 1),
    lower: linear,
}];

/// `x · W + b` with `x: [B, in]`, `W: [in, out]` (c64 unless `real = true`), `b: [out]`.
/// A real input is multiplied by the complex weight directly (MatMul mixes dtypes).
fn linear(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let out = site.args.count("out", None, 1)?;
    let bias = site.args.flag("bias", true)?;
    let real = site.args.flag("real", false)?;
    let x = &ops[0];
    let ty = need_float(ctx, site, x, "input")?;
    if ty.shape.rank() != 2 {
        let mut d = site.operand_error(
            ctx,
            x,
            format!("`linear` needs a 2-D input [B, features], got {}", ty.shape),
            "expects [B, features]",
        );
        if ty.shape.rank() > 2 {
            d = d.with_help("insert `flatten` before `linear`");
        }
        return Err(d);
    }
    let fan_in = fixed_dim(ctx, site, x, 1, "feature count")?;
    let wdt = if real { DType::F32 } else { DType::C64 };
    let init = weight_init(site, "glorot", fan_in, out)?;
    let w = ctx.param(site, "weight", init, TensorType::new(wdt, Shape::fixed(&[fan_in, out])));
    let mut y = ctx
        .b
        .add(Op::MatMul { trans: [false, false], conj: [false, false], sum_batch: false }, &[x.value, w])
        .at(site)?;
    if bias {
        let bound = 1.0 / (fan_in as f64).sqrt();
        let b = ctx.param(site, "bias", Init::Uniform { bound }, TensorType::new(wdt, Shape::fixed(&[out])));
        y = ctx.b.add2(y, b).at(site)?;
    }
    Ok(y)
}
