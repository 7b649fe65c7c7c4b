//! Convolutions: `conv1d`, `conv2d`, `conv_transpose1d`, `conv_transpose2d` (PyTorch semantics
//! and weight layouts); the table also lists the volume convolutions of `conv3d.rs`.

use super::*;

pub(crate) const DEFS: &[OpDef] = &[
    OpDef {
        name: "conv1d",
        signature: "conv1d(out, kernel, stride = 1, pad = 0, dilation = 1, groups = 1, bias = true, init = he | glorot | rayleigh)",
        args: &["out", "kernel", "stride", "pad", "dilation", "groups", "bias", "init"],
        variadic: false,
        operands: (1, 1),
        lower: conv1d,
    },
    OpDef {
        name: "conv2d",
        signature: "conv2d(out, kernel, stride = 1, pad = 0, dilation = 1, groups = 1, bias = true, init = he | glorot | rayleigh)",
        args: &["out", "kernel", "stride", "pad", "dilation", "groups", "bias", "init"],
        variadic: false,
        operands: (1, 1),
        lower: conv2d,
    },
    OpDef {
        name: "conv_transpose1d",
        signature: "conv_transpose1d(out, kernel, stride = 1, pad = 0, output_padding = 0, dilation = 1, groups = 1, bias = true, init = he | glorot | rayleigh)",
        args: &["out", "kernel", "stride", "pad", "output_padding", "dilation", "groups", "bias", "init"],
        variadic: false,
        operands: (1, 1),
        lower: conv_transpose1d,
    },
    OpDef {
        name: "conv_transpose2d",
        signature: "conv_transpose2d(out, kernel, stride = 1, pad = 0, output_padding = 0, dilation = 1, groups = 1, bias = true, init = he | glorot | rayleigh)",
        args: &["out", "kernel", "stride", "pad", "output_padding", "dilation", "groups", "bias", "init"],
        variadic: false,
        operands: (1, 1),
        lower: conv_transpose2d,
    },
    super::conv3d::CONV3D,
    super::conv3d::CONV_TRANSPOSE3D,
];

/// The checked arguments of a forward convolution.
struct ConvArgs {
    out: usize,
    kernel: [usize; 2],
    geom: ConvGeom,
    bias: bool,
}

/// Reads the convolution arguments; 1-D convolutions put everything on the width axis.
fn conv_args(site: &Site, one_d: bool) -> Result<ConvArgs, Diagnostic> {
    let a = &site.args;
    let out = a.count("out", None, 1)?;
    let get = |name: &str, default: Option<usize>, min: usize| -> Result<[usize; 2], Diagnostic> {
        if one_d {
            let v = a.count(name, default, min)?;
            Ok([if min == 0 { 0 } else { 1 }, v])
        } else {
            a.pair(name, default, min)
        }
    };
    let kernel = get("kernel", None, 1)?;
    let stride = get("stride", Some(1), 1)?;
    let pad = get("pad", Some(0), 0)?;
    let dilation = get("dilation", Some(1), 1)?;
    let groups = a.count("groups", Some(1), 1)?;
    let bias = a.flag("bias", true)?;
    Ok(ConvArgs { out, kernel, geom: ConvGeom { stride, pad, dilation, groups }, bias })
}

/// Checks channel/group divisibility; returns the input channel count.
pub(super) fn check_groups(
    ctx: &LowerCtx,
    site: &Site,
    x: &Operand,
    c: usize,
    out: usize,
    groups: usize,
) -> Result<(), Diagnostic> {
    if !c.is_multiple_of(groups) || !out.is_multiple_of(groups) {
        let span = site.args.get("groups").map_or(site.call.span, |a| a.span);
        let ty = ctx.ty(x.value);
        return Err(Diagnostic::error(
            format!(
                "`{}`: groups = {groups} must divide both the input channels ({c}) and `out` ({out})",
                site.call.op
            ),
            span,
            "groups do not divide the channels",
        )
        .with_label(x.span, format!("this is {ty}")));
    }
    Ok(())
}

/// The output extent along one spatial axis, or an error saying the kernel does not fit.
fn out_extent(
    ctx: &LowerCtx,
    site: &Site,
    x: &Operand,
    ca: &ConvArgs,
    a: usize,
    input: usize,
) -> Result<usize, Diagnostic> {
    ca.geom.out_extent(a, input, ca.kernel[a]).ok_or_else(|| {
        let span = ca.geom.dilation[a] * (ca.kernel[a] - 1) + 1;
        let axis = if a == 0 { "height" } else { "width" };
        let mut d = site.operand_error(
            ctx,
            x,
            format!(
                "`{}`: the kernel spans {span} but the padded input {axis} is {}",
                site.call.op,
                input + 2 * ca.geom.pad[a]
            ),
            "kernel larger than the input",
        );
        if let Some(k) = site.args.get("kernel") {
            d = d.with_label(k.span, "kernel set here");
        }
        d.with_help("use a smaller kernel or dilation, more padding, or pool less before this layer")
    })
}

/// The bias `[out]` (as `[1, out, 1, 1]`) added to `y`.
fn add_bias(
    ctx: &mut LowerCtx,
    site: &Site,
    y: Value,
    out: usize,
    fan_in: usize,
    dtype: DType,
) -> Result<Value, Diagnostic> {
    let bound = 1.0 / (fan_in as f64).sqrt();
    let b = ctx.param(site, "bias", Init::Uniform { bound }, TensorType::new(dtype, Shape::fixed(&[out])));
    let b4 = ctx.b.reshape(b, Shape::fixed(&[1, out, 1, 1])).at(site)?;
    ctx.b.add2(y, b4).at(site)
}

/// The dtype of learned weights applied to an input: complex (a real input is cast by the
/// compiler, never materialised).
const WEIGHT_DTYPE: DType = DType::C64;

/// Forward convolution of a 4-D `[N, C, H, W]` value, with the weight's stored shape given.
fn conv_core(
    ctx: &mut LowerCtx,
    site: &Site,
    x: &Operand,
    x4: Value,
    ca: &ConvArgs,
    weight_shape: &[usize],
) -> Result<Value, Diagnostic> {
    let shape = ctx.ty(x4).shape;
    let c = shape.0[1].fixed().expect("checked by caller");
    let (h, w) = (shape.0[2].fixed().expect("checked"), shape.0[3].fixed().expect("checked"));
    check_groups(ctx, site, x, c, ca.out, ca.geom.groups)?;
    out_extent(ctx, site, x, ca, 0, h)?;
    out_extent(ctx, site, x, ca, 1, w)?;
    let cg = c / ca.geom.groups;
    let fan_in = cg * ca.kernel[0] * ca.kernel[1];
    let init = weight_init(site, "he", fan_in, ca.out * ca.kernel[0] * ca.kernel[1])?;
    let wt = ctx.param(site, "weight", init, TensorType::new(WEIGHT_DTYPE, Shape::fixed(weight_shape)));
    let w4 = ctx.b.reshape(wt, Shape::fixed(&[ca.out, cg, ca.kernel[0], ca.kernel[1]])).at(site)?;
    let y = ctx.b.add(Op::Conv2d { geom: ca.geom, conj: [false, false] }, &[x4, w4]).at(site)?;
    if ca.bias {
        add_bias(ctx, site, y, ca.out, fan_in, WEIGHT_DTYPE)
    } else {
        Ok(y)
    }
}

fn conv2d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let ca = conv_args(site, false)?;
    let x = &ops[0];
    need_rank(ctx, site, x, 4..=4, "4-D [B, C, H, W]")?;
    let c = fixed_dim(ctx, site, x, 1, "channel count")?;
    fixed_dim(ctx, site, x, 2, "height")?;
    fixed_dim(ctx, site, x, 3, "width")?;
    let cg = c / ca.geom.groups.max(1);
    conv_core(ctx, site, x, x.value, &ca, &[ca.out, cg, ca.kernel[0], ca.kernel[1]])
}

/// `[B, C, L]` → `[B, C, 1, L]` → conv2d with a `1 × k` kernel → `[B, O, L']`.
fn conv1d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let ca = conv_args(site, true)?;
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, 3..=3, "3-D [B, C, L]")?;
    let c = fixed_dim(ctx, site, x, 1, "channel count")?;
    fixed_dim(ctx, site, x, 2, "length")?;
    let s = &ty.shape.0;
    let x4 = ctx.b.reshape(x.value, Shape(vec![s[0], s[1], Dim::Fixed(1), s[2]])).at(site)?;
    let cg = c / ca.geom.groups.max(1);
    let y = conv_core(ctx, site, x, x4, &ca, &[ca.out, cg, ca.kernel[1]])?;
    let ys = ctx.ty(y).shape;
    ctx.b.reshape(y, Shape(vec![ys.0[0], ys.0[1], ys.0[3]])).at(site)
}

/// Transposed convolution; weight `[C_in, out / groups, kh, kw]` as PyTorch's.
/// Output extent `(H - 1)·stride - 2·pad + dilation·(k - 1) + output_padding + 1`.
fn conv_transpose2d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let ca = conv_args(site, false)?;
    let op_pad = site.args.pair("output_padding", Some(0), 0)?;
    let x = &ops[0];
    need_rank(ctx, site, x, 4..=4, "4-D [B, C, H, W]")?;
    let c = fixed_dim(ctx, site, x, 1, "channel count")?;
    fixed_dim(ctx, site, x, 2, "height")?;
    fixed_dim(ctx, site, x, 3, "width")?;
    let kernel = ca.kernel;
    conv_transpose_core(
        ctx,
        site,
        x,
        x.value,
        &ca,
        op_pad,
        &[c, ca.out / ca.geom.groups.max(1), kernel[0], kernel[1]],
    )
}

/// `[B, C, L]` → `[B, C, 1, L]` → conv_transpose2d with a `1 × k` kernel → `[B, O, L']`;
/// weight `[C_in, out / groups, k]` as PyTorch's.
fn conv_transpose1d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let ca = conv_args(site, true)?;
    let op_pad = [0, site.args.count("output_padding", Some(0), 0)?];
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, 3..=3, "3-D [B, C, L]")?;
    let c = fixed_dim(ctx, site, x, 1, "channel count")?;
    fixed_dim(ctx, site, x, 2, "length")?;
    let s = &ty.shape.0;
    let x4 = ctx.b.reshape(x.value, Shape(vec![s[0], s[1], Dim::Fixed(1), s[2]])).at(site)?;
    let y = conv_transpose_core(
        ctx,
        site,
        x,
        x4,
        &ca,
        op_pad,
        &[c, ca.out / ca.geom.groups.max(1), ca.kernel[1]],
    )?;
    let ys = ctx.ty(y).shape;
    ctx.b.reshape(y, Shape(vec![ys.0[0], ys.0[1], ys.0[3]])).at(site)
}

/// Transposed convolution of a 4-D `[N, C, H, W]` value, with the weight's stored shape given.
fn conv_transpose_core(
    ctx: &mut LowerCtx,
    site: &Site,
    x: &Operand,
    x4: Value,
    ca: &ConvArgs,
    op_pad: [usize; 2],
    weight_shape: &[usize],
) -> Result<Value, Diagnostic> {
    let shape = ctx.ty(x4).shape;
    let c = shape.0[1].fixed().expect("checked by caller");
    let (h, w) = (shape.0[2].fixed().expect("checked"), shape.0[3].fixed().expect("checked"));
    check_groups(ctx, site, x, c, ca.out, ca.geom.groups)?;
    let mut out_hw = [0usize; 2];
    for (a, input) in [h, w].into_iter().enumerate() {
        let g = &ca.geom;
        // Only then does the forward convolution of the output map back onto the input,
        // as PyTorch requires.
        if op_pad[a] >= g.stride[a] {
            let span = site.args.get("output_padding").map_or(site.call.span, |a| a.span);
            return Err(Diagnostic::error(
                format!(
                    "`{}`: output_padding ({}) must be smaller than the stride ({})",
                    site.call.op, op_pad[a], g.stride[a]
                ),
                span,
                "output_padding too large",
            ));
        }
        let full = (input - 1)
            .checked_mul(g.stride[a])
            .and_then(|v| v.checked_add(g.dilation[a] * (ca.kernel[a] - 1) + op_pad[a] + 1))
            .ok_or_else(|| {
                site.error(format!("`{}`: the output extent overflows", site.call.op), "output too large")
            })?;
        if full <= 2 * g.pad[a] {
            let span = site.args.get("pad").map_or(site.call.span, |a| a.span);
            return Err(Diagnostic::error(
                format!(
                    "`{}`: padding {} leaves no output (uncropped extent {full})",
                    site.call.op, g.pad[a]
                ),
                span,
                "padding too large",
            ));
        }
        out_hw[a] = full - 2 * g.pad[a];
    }
    // PyTorch's fans of a [C_in, out / groups, kh, kw] weight.
    let og = ca.out / ca.geom.groups;
    let fan_in = og * ca.kernel[0] * ca.kernel[1];
    let init = weight_init(site, "he", fan_in, c * ca.kernel[0] * ca.kernel[1])?;
    let wt = ctx.param(site, "weight", init, TensorType::new(WEIGHT_DTYPE, Shape::fixed(weight_shape)));
    let w4 = if weight_shape.len() == 4 {
        wt
    } else {
        ctx.b.reshape(wt, Shape::fixed(&[c, og, ca.kernel[0], ca.kernel[1]])).at(site)?
    };
    let y =
        ctx.b.add(Op::ConvTranspose2d { geom: ca.geom, out_hw, conj: [false, false] }, &[x4, w4]).at(site)?;
    if ca.bias {
        add_bias(ctx, site, y, ca.out, fan_in, WEIGHT_DTYPE)
    } else {
        Ok(y)
    }
}
