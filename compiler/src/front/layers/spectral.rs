//! Spectral ops: `fft`, `ifft` along one axis, `fft2`, `ifft2` over the last two axes, `fft3`,
//! `ifft3` over the last three (a volume's depth, height and width): one `Fft` per axis.

use super::*;

const fn spec(
    name: &'static str,
    signature: &'static str,
    args: &'static [&'static str],
    lower: LowerFn,
) -> OpDef {
    OpDef { name, signature, args, variadic: false, operands: (1, 1), lower }
}

pub(crate) const DEFS: &[OpDef] = &[
    spec("fft", "fft(axis = -1, norm = backward | ortho | forward)", &["axis", "norm"], fft),
    spec("ifft", "ifft(axis = -1, norm = backward | ortho | forward)", &["axis", "norm"], ifft),
    spec("fft2", "fft2(norm = backward | ortho | forward)", &["norm"], fft2),
    spec("ifft2", "ifft2(norm = backward | ortho | forward)", &["norm"], ifft2),
    spec("fft3", "fft3(norm = backward | ortho | forward)", &["norm"], fft3),
    spec("ifft3", "ifft3(norm = backward | ortho | forward)", &["norm"], ifft3),
];

fn norm_arg(site: &Site) -> Result<FftNorm, Diagnostic> {
    Ok(match site.args.choice("norm", "backward", &["backward", "ortho", "forward"])? {
        "ortho" => FftNorm::Ortho,
        "forward" => FftNorm::Forward,
        _ => FftNorm::Backward,
    })
}

/// The operand as a complex value (a real one is read as `x + 0i`).
fn as_complex(ctx: &mut LowerCtx, site: &Site, x: &Operand) -> Result<Value, Diagnostic> {
    let ty = need_float(ctx, site, x, "tensor")?;
    if ty.dtype.is_complex() {
        Ok(x.value)
    } else {
        ctx.b.unary(UnaryOp::ToComplex, x.value).at(site)
    }
}

fn transform(
    ctx: &mut LowerCtx,
    site: &Site,
    ops: &[Operand],
    axes: &[usize],
    inverse: bool,
) -> Result<Value, Diagnostic> {
    let norm = norm_arg(site)?;
    for &a in axes {
        fixed_dim(ctx, site, &ops[0], a, "transform length")?;
    }
    let mut v = as_complex(ctx, site, &ops[0])?;
    for &axis in axes {
        v = ctx.b.add(Op::Fft { axis, inverse, norm }, &[v]).at(site)?;
    }
    Ok(v)
}

fn one_axis(ctx: &mut LowerCtx, site: &Site, ops: &[Operand], inverse: bool) -> Result<Value, Diagnostic> {
    let rank = need_rank(ctx, site, &ops[0], 1..=usize::MAX, "non-scalar")?.shape.rank();
    let axis = site.args.axis("axis", -1, rank)?;
    transform(ctx, site, ops, &[axis], inverse)
}

fn two_axes(ctx: &mut LowerCtx, site: &Site, ops: &[Operand], inverse: bool) -> Result<Value, Diagnostic> {
    let rank = need_rank(ctx, site, &ops[0], 2..=usize::MAX, "[..., H, W]")?.shape.rank();
    transform(ctx, site, ops, &[rank - 2, rank - 1], inverse)
}

fn fft(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    one_axis(ctx, site, ops, false)
}
fn ifft(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    one_axis(ctx, site, ops, true)
}
fn fft2(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    two_axes(ctx, site, ops, false)
}
fn ifft2(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    two_axes(ctx, site, ops, true)
}

fn three_axes(ctx: &mut LowerCtx, site: &Site, ops: &[Operand], inverse: bool) -> Result<Value, Diagnostic> {
    let rank = need_rank(ctx, site, &ops[0], 3..=usize::MAX, "[..., D, H, W]")?.shape.rank();
    transform(ctx, site, ops, &[rank - 3, rank - 2, rank - 1], inverse)
}

fn fft3(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    three_axes(ctx, site, ops, false)
}
fn ifft3(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    three_axes(ctx, site, ops, true)
}
