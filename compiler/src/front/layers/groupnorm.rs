//! Per-sample normalisation over channel groups: `groupnorm(groups)` and `instancenorm`
//! (`groupnorm` with one channel per group), as PyTorch's `GroupNorm` and `InstanceNorm1d/2d`
//! (`track_running_stats = False`: batch statistics in training and evaluation alike).
//!
//! Complex inputs use the naive definition of cvc's `batchnorm(kind = naive)`: the real and
//! imaginary parts are normalised separately, each with its own per-channel γ, β
//! (`gamma_re`, `beta_re`, `gamma_im`, `beta_im`). Statistics are the biased mean and
//! variance over the group's channels and every spatial position of one sample.

use super::*;

pub(crate) const DEFS: &[OpDef] = &[
    OpDef {
        name: "groupnorm",
        signature: "groupnorm(groups, eps = 1e-5, affine = true)",
        args: &["groups", "eps", "affine"],
        variadic: false,
        operands: (1, 1),
        lower: groupnorm,
    },
    OpDef {
        name: "instancenorm",
        signature: "instancenorm(eps = 1e-5, affine = false)",
        args: &["eps", "affine"],
        variadic: false,
        operands: (1, 1),
        lower: instancenorm,
    },
];

fn groupnorm(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let groups = site.args.count("groups", None, 1)?;
    let eps = site.args.positive("eps", 1e-5)?;
    let affine = site.args.flag("affine", true)?;
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, 2..=usize::MAX, "[B, C, ...]")?;
    let c = fixed_dim(ctx, site, x, 1, "channel count")?;
    if !c.is_multiple_of(groups) {
        let span = site.args.get("groups").map_or(site.call.span, |a| a.span);
        return Err(Diagnostic::error(
            format!("`groupnorm`: groups = {groups} does not divide the {c} channels"),
            span,
            "groups do not divide the channels",
        )
        .with_label(x.span, format!("this is {ty}")));
    }
    group_norm(ctx, site, x, groups, eps, affine)
}

fn instancenorm(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let eps = site.args.positive("eps", 1e-5)?;
    let affine = site.args.flag("affine", false)?;
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, 3..=usize::MAX, "[B, C, spatial...]")?;
    let c = fixed_dim(ctx, site, x, 1, "channel count")?;
    // PyTorch: "Expected more than 1 spatial element when training": one element normalises
    // to zero (and its gradient vanishes).
    if ty.shape.fixed_numel() / c.max(1) == 1 {
        return Err(site.operand_error(
            ctx,
            x,
            "`instancenorm` needs more than one spatial element per channel".into(),
            "one spatial element",
        ));
    }
    group_norm(ctx, site, x, c, eps, affine)
}

fn group_norm(
    ctx: &mut LowerCtx,
    site: &Site,
    x: &Operand,
    groups: usize,
    eps: f64,
    affine: bool,
) -> Result<Value, Diagnostic> {
    let ty = ctx.ty(x.value);
    for a in 2..ty.shape.rank() {
        fixed_dim(ctx, site, x, a, "spatial extent")?;
    }
    if !ty.dtype.is_complex() {
        return gn_real(ctx, site, x.value, "", groups, eps, affine);
    }
    let re = ctx.b.unary(UnaryOp::Real, x.value).at(site)?;
    let im = ctx.b.unary(UnaryOp::Imag, x.value).at(site)?;
    let re = gn_real(ctx, site, re, "_re", groups, eps, affine)?;
    let im = gn_real(ctx, site, im, "_im", groups, eps, affine)?;
    ctx.b.binary(BinaryOp::Complex, re, im).at(site)
}

/// `(v − mean) / sqrt(var + eps)` per sample and group of `[B, C, ...]` (a `[B, G, C/G, ...]`
/// view), then `·γ + β` per channel.
fn gn_real(
    ctx: &mut LowerCtx,
    site: &Site,
    v: Value,
    suffix: &str,
    groups: usize,
    eps: f64,
    affine: bool,
) -> Result<Value, Diagnostic> {
    let shape = ctx.ty(v).shape;
    let c = shape.0[1].fixed().expect("checked by caller");
    let mut grouped = shape.0.clone();
    grouped.splice(1..2, [Dim::Fixed(groups), Dim::Fixed(c / groups)]);
    let grouped = Shape(grouped);
    let axes: Vec<usize> = (2..grouped.rank()).collect();
    let inv = inv_count(ctx, &grouped, &axes);
    let b = &mut ctx.b;
    let y = (|| -> Result<Value, String> {
        let g = b.reshape(v, grouped.clone())?;
        let s = b.sum(g, &axes)?;
        let mean = b.mul(s, inv)?;
        let xc = b.sub(g, mean)?;
        let sq = b.mul(xc, xc)?;
        let ss = b.sum(sq, &axes)?;
        let var = b.mul(ss, inv)?;
        let e = b.scalar(eps, 0);
        let ve = b.add2(var, e)?;
        let rs = b.unary(UnaryOp::Rsqrt, ve)?;
        let y = b.mul(xc, rs)?;
        b.reshape(y, shape.clone())
    })()
    .at(site)?;
    if !affine {
        return Ok(y);
    }
    let cs = channel_shape(shape.rank(), Dim::Fixed(c));
    let pty = TensorType::new(DType::F32, Shape::fixed(&[c]));
    let g = ctx.param(site, &format!("gamma{suffix}"), Init::Ones, pty.clone());
    let be = ctx.param(site, &format!("beta{suffix}"), Init::Zeros, pty);
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let g = b.reshape(g, cs.clone())?;
        let be = b.reshape(be, cs)?;
        let y = b.mul(y, g)?;
        b.add2(y, be)
    })();
    r.at(site)
}
