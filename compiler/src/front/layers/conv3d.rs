//! Volume convolutions: `conv3d` and `conv_transpose3d` on `[B, C, D, H, W]`, PyTorch semantics
//! and weight layouts (`[out, in / groups, kd, kh, kw]` and `[in, out / groups, kd, kh, kw]`).
//!
//! Lowered onto the 2-D contractions, not a new primitive, so autodiff, fusion, the
//! interpreter and both back ends handle them unchanged. The batch `B` is symbolic and cannot
//! absorb the depth, so the depth is folded into the rows: the depth slices are stacked along
//! the height (`[.., D, H, W]` → `[.., D·H', W]`), each slice padded to `H'` rows so that one
//! 2-D kernel never mixes two slices in an output row that is kept.
//!
//! - `conv3d`: the `kd` depth taps of every output slice are gathered as `kd` strided depth
//!   slices of the (depth-padded) input, stacked next to the channels (`[B, C·kd, D', H, W]`,
//!   channel `c·kd + z`, which is exactly the weight's `[out, in / groups, kd, ..]` order read
//!   as `[out, in·kd / groups, kh, kw]`), so the whole layer is one `Conv2d` with stride
//!   `(sh, sw)`: each slice is zero-padded to `H' = roundup(H + 2·ph, sh)` rows (PyTorch's
//!   padding plus rows no kept output reads), and the rows between slices' outputs are
//!   sliced away. Memory: the stacked input is `kd / sd` times the input.
//! - `conv_transpose3d`: one `ConvTranspose2d` with the `kd` taps folded into its output
//!   channels (the weight read as `[in, out·kd / groups, kh, kw]`) gives every tap's
//!   contribution of every input slice; slices are padded to `H'` rows with
//!   `H'·sh ≥ (H − 1)·sh + dh·(kh − 1) + 1 + output_padding` so their outputs never overlap.
//!   Tap `z` of input slice `i` lands on output depth `i·sd + z·dd − pd`: each tap is
//!   spread by the stride (zeros between), shifted into place (a slice and a pad) and the
//!   `kd` taps are added. Memory: `kd` times the output.

use super::conv::check_groups;
use super::*;

pub(crate) const CONV3D: OpDef = OpDef {
    name: "conv3d",
    signature: "conv3d(out, kernel, stride = 1, pad = 0, dilation = 1, groups = 1, bias = true, init = he | glorot | rayleigh)",
    args: &["out", "kernel", "stride", "pad", "dilation", "groups", "bias", "init"],
    variadic: false,
    operands: (1, 1),
    lower: conv3d,
};

pub(crate) const CONV_TRANSPOSE3D: OpDef = OpDef {
    name: "conv_transpose3d",
    signature: "conv_transpose3d(out, kernel, stride = 1, pad = 0, output_padding = 0, dilation = 1, groups = 1, bias = true, init = he | glorot | rayleigh)",
    args: &["out", "kernel", "stride", "pad", "output_padding", "dilation", "groups", "bias", "init"],
    variadic: false,
    operands: (1, 1),
    lower: conv_transpose3d,
};

/// The dtype of the learned weights (a real input is cast by the compiler).
const WEIGHT_DTYPE: DType = DType::C64;

/// The checked arguments of a volume convolution, per axis `(depth, height, width)`.
struct Args3 {
    out: usize,
    kernel: [usize; 3],
    stride: [usize; 3],
    pad: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
    bias: bool,
}

impl Args3 {
    fn read(site: &Site) -> Result<Args3, Diagnostic> {
        let a = &site.args;
        Ok(Args3 {
            out: a.count("out", None, 1)?,
            kernel: a.triple("kernel", None, 1)?,
            stride: a.triple("stride", Some(1), 1)?,
            pad: a.triple("pad", Some(0), 0)?,
            dilation: a.triple("dilation", Some(1), 1)?,
            groups: a.count("groups", Some(1), 1)?,
            bias: a.flag("bias", true)?,
        })
    }
    /// The extent one kernel covers along axis `a`.
    fn span(&self, a: usize) -> usize {
        self.dilation[a] * (self.kernel[a] - 1) + 1
    }
    fn volume(&self) -> usize {
        self.kernel.iter().product()
    }
}

const AXES: [&str; 3] = ["depth", "height", "width"];

/// Checks `x` is `[B, C, D, H, W]` with fixed extents; returns `(C, [D, H, W])`.
fn volume_input(ctx: &LowerCtx, site: &Site, x: &Operand) -> Result<(usize, [usize; 3]), Diagnostic> {
    need_rank(ctx, site, x, 5..=5, "5-D [B, C, D, H, W]")?;
    let c = fixed_dim(ctx, site, x, 1, "channel count")?;
    let mut n = [0; 3];
    for (a, e) in n.iter_mut().enumerate() {
        *e = fixed_dim(ctx, site, x, 2 + a, AXES[a])?;
    }
    Ok((c, n))
}

/// The bias `[out]` (as `[1, out, 1, 1, 1]`) added to `y`.
fn add_bias5(
    ctx: &mut LowerCtx,
    site: &Site,
    y: Value,
    out: usize,
    fan_in: usize,
) -> Result<Value, Diagnostic> {
    let bound = 1.0 / (fan_in as f64).sqrt();
    let b =
        ctx.param(site, "bias", Init::Uniform { bound }, TensorType::new(WEIGHT_DTYPE, Shape::fixed(&[out])));
    let b5 = ctx.b.reshape(b, Shape::fixed(&[1, out, 1, 1, 1])).at(site)?;
    ctx.b.add2(y, b5).at(site)
}

fn fixed(dims: &[usize]) -> Vec<Dim> {
    dims.iter().map(|&d| Dim::Fixed(d)).collect()
}

/// `[B]` followed by `dims`.
fn batched(batch: Dim, dims: &[usize]) -> Shape {
    let mut s = vec![batch];
    s.extend(fixed(dims));
    Shape(s)
}

fn conv3d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let ca = Args3::read(site)?;
    let x = &ops[0];
    let (c, n) = volume_input(ctx, site, x)?;
    check_groups(ctx, site, x, c, ca.out, ca.groups)?;
    let mut o = [0; 3];
    for a in 0..3 {
        let padded = n[a] + 2 * ca.pad[a];
        if padded < ca.span(a) {
            let mut d = site.operand_error(
                ctx,
                x,
                format!(
                    "`conv3d`: the kernel spans {} but the padded input {} is {padded}",
                    ca.span(a),
                    AXES[a]
                ),
                "kernel larger than the input",
            );
            if let Some(k) = site.args.get("kernel") {
                d = d.with_label(k.span, "kernel set here");
            }
            return Err(d.with_help(
                "use a smaller kernel or dilation, more padding, or pool less before this layer",
            ));
        }
        o[a] = (padded - ca.span(a)) / ca.stride[a] + 1;
    }
    let cg = c / ca.groups;
    let [kd, kh, kw] = ca.kernel;
    let fan_in = cg * ca.volume();
    let init = weight_init(site, "he", fan_in, ca.out * ca.volume())?;
    let wt = ctx.param(
        site,
        "weight",
        init,
        TensorType::new(WEIGHT_DTYPE, Shape::fixed(&[ca.out, cg, kd, kh, kw])),
    );
    let batch = ctx.ty(x.value).shape.0[0];
    let [h, w] = [n[1], n[2]];
    let [sd, sh, _] = ca.stride;
    let (pd, ph) = (ca.pad[0], ca.pad[1]);
    let dd = ca.dilation[0];
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        // Depth: pad, then tap z of output slice j reads padded slice z·dd + j·sd.
        let need = dd * (kd - 1) + sd * o[0];
        let tail = need.saturating_sub(n[0] + 2 * pd);
        let xp = if pd + tail > 0 {
            b.add(Op::Pad { axis: 2, before: pd, after: pd + tail }, &[x.value])?
        } else {
            x.value
        };
        let mut taps = Vec::with_capacity(kd);
        for z in 0..kd {
            let run = b.add(Op::Slice { axis: 2, start: z * dd, len: sd * o[0] }, &[xp])?;
            let tap = if sd == 1 {
                run
            } else {
                let grid = b.reshape(run, batched(batch, &[c, o[0], sd, h, w]))?;
                b.add(Op::Slice { axis: 3, start: 0, len: 1 }, &[grid])?
            };
            taps.push(b.reshape(tap, batched(batch, &[c, 1, o[0], h, w]))?);
        }
        let stacked = if kd == 1 { taps[0] } else { b.add(Op::Concat { axis: 2 }, &taps)? };
        let v = b.reshape(stacked, batched(batch, &[c * kd, o[0], h, w]))?;
        // Height: each slice padded to hp rows (a multiple of the stride), slices stacked.
        let hp = (h + 2 * ph).div_ceil(sh) * sh;
        let v = if hp > h { b.add(Op::Pad { axis: 3, before: ph, after: hp - h - ph }, &[v])? } else { v };
        let v = b.reshape(v, batched(batch, &[c * kd, o[0] * hp, w]))?;
        // Rows after the last slice so that it, too, yields hp / sh output rows.
        let extra = ca.span(1).saturating_sub(sh);
        let v = if extra > 0 { b.add(Op::Pad { axis: 2, before: 0, after: extra }, &[v])? } else { v };
        let w4 = b.reshape(wt, Shape::fixed(&[ca.out, cg * kd, kh, kw]))?;
        let geom = ConvGeom {
            stride: [sh, ca.stride[2]],
            pad: [0, ca.pad[2]],
            dilation: [ca.dilation[1], ca.dilation[2]],
            groups: ca.groups,
        };
        let y = b.add(Op::Conv2d { geom, conj: [false, false] }, &[v, w4])?;
        let q = hp / sh;
        let y = b.reshape(y, batched(batch, &[ca.out, o[0], q, o[2]]))?;
        if q > o[1] {
            b.add(Op::Slice { axis: 3, start: 0, len: o[1] }, &[y])
        } else {
            Ok(y)
        }
    })();
    let y = r.at(site)?;
    if ca.bias {
        add_bias5(ctx, site, y, ca.out, fan_in)
    } else {
        Ok(y)
    }
}

fn conv_transpose3d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let ca = Args3::read(site)?;
    let op_pad = site.args.triple("output_padding", Some(0), 0)?;
    let x = &ops[0];
    let (c, n) = volume_input(ctx, site, x)?;
    check_groups(ctx, site, x, c, ca.out, ca.groups)?;
    // Uncropped extents `full` and outputs `o`, as PyTorch's conv_transpose3d.
    let mut full = [0; 3];
    let mut o = [0; 3];
    for a in 0..3 {
        if op_pad[a] >= ca.stride[a] {
            let span = site.args.get("output_padding").map_or(site.call.span, |a| a.span);
            return Err(Diagnostic::error(
                format!(
                    "`conv_transpose3d`: output_padding ({}) must be smaller than the stride ({}) along the {}",
                    op_pad[a], ca.stride[a], AXES[a]
                ),
                span,
                "output_padding too large",
            ));
        }
        let f = (n[a] - 1)
            .checked_mul(ca.stride[a])
            .and_then(|v| v.checked_add(ca.span(a) + op_pad[a]))
            .filter(|&v| v <= args::MAX_COUNT as usize)
            .ok_or_else(|| {
                site.error("`conv_transpose3d`: the output extent overflows".into(), "output too large")
            })?;
        if f <= 2 * ca.pad[a] {
            let span = site.args.get("pad").map_or(site.call.span, |a| a.span);
            return Err(Diagnostic::error(
                format!(
                    "`conv_transpose3d`: padding {} leaves no output {} (uncropped extent {f})",
                    ca.pad[a], AXES[a]
                ),
                span,
                "padding too large",
            ));
        }
        full[a] = f;
        o[a] = f - 2 * ca.pad[a];
    }
    let og = ca.out / ca.groups;
    let [kd, kh, kw] = ca.kernel;
    let fan_in = og * ca.volume();
    let init = weight_init(site, "he", fan_in, c * ca.volume())?;
    let wt =
        ctx.param(site, "weight", init, TensorType::new(WEIGHT_DTYPE, Shape::fixed(&[c, og, kd, kh, kw])));
    let batch = ctx.ty(x.value).shape.0[0];
    let [d, h, w] = n;
    let [sd, sh, _] = ca.stride;
    let (pd, ph) = (ca.pad[0], ca.pad[1]);
    let dd = ca.dilation[0];
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        // Height: slices of hq rows whose outputs (hq·sh rows each) cannot overlap.
        let hq = full[1].div_ceil(sh).max(h);
        let v =
            if hq > h { b.add(Op::Pad { axis: 3, before: 0, after: hq - h }, &[x.value])? } else { x.value };
        let v = b.reshape(v, batched(batch, &[c, d * hq, w]))?;
        let w4 = b.reshape(wt, Shape::fixed(&[c, og * kd, kh, kw]))?;
        let rows = (d * hq - 1) * sh + ca.span(1);
        let geom = ConvGeom {
            stride: [sh, ca.stride[2]],
            pad: [0, ca.pad[2]],
            dilation: [ca.dilation[1], ca.dilation[2]],
            groups: ca.groups,
        };
        let y = b.add(Op::ConvTranspose2d { geom, out_hw: [rows, o[2]], conj: [false, false] }, &[v, w4])?;
        // Exactly hq·sh rows per slice: the rows past the last slice's block (or missing from
        // it) come from its padding rows only, so they are zeros.
        let block = d * hq * sh;
        let y = match rows.cmp(&block) {
            std::cmp::Ordering::Greater => b.add(Op::Slice { axis: 2, start: 0, len: block }, &[y])?,
            std::cmp::Ordering::Less => b.add(Op::Pad { axis: 2, before: 0, after: block - rows }, &[y])?,
            std::cmp::Ordering::Equal => y,
        };
        let y = b.reshape(y, batched(batch, &[ca.out, kd, d, hq * sh, o[2]]))?;
        let y = b.add(Op::Slice { axis: 4, start: ph, len: o[1] }, &[y])?;
        // Depth: tap z of input slice i lands on output i·sd + z·dd − pd.
        let spread_len = d * sd;
        let mut sum: Option<Value> = None;
        for z in 0..kd {
            let offset = (z * dd) as i64 - pd as i64;
            let src = (-offset).max(0) as usize;
            let dst = offset.max(0) as usize;
            if src >= spread_len || dst >= o[0] {
                continue;
            }
            let len = (spread_len - src).min(o[0] - dst);
            let tap = b.add(Op::Slice { axis: 2, start: z, len: 1 }, &[y])?;
            let tap = if sd == 1 {
                b.reshape(tap, batched(batch, &[ca.out, d, o[1], o[2]]))?
            } else {
                let col = b.reshape(tap, batched(batch, &[ca.out, d, 1, o[1], o[2]]))?;
                let col = b.add(Op::Pad { axis: 3, before: 0, after: sd - 1 }, &[col])?;
                b.reshape(col, batched(batch, &[ca.out, spread_len, o[1], o[2]]))?
            };
            let tap = if src > 0 || len < spread_len {
                b.add(Op::Slice { axis: 2, start: src, len }, &[tap])?
            } else {
                tap
            };
            let after = o[0] - dst - len;
            let tap =
                if dst + after > 0 { b.add(Op::Pad { axis: 2, before: dst, after }, &[tap])? } else { tap };
            sum = Some(match sum {
                Some(s) => b.add2(s, tap)?,
                None => tap,
            });
        }
        match sum {
            Some(s) => Ok(s),
            // Every tap falls into the cropped padding or between strided slices: the
            // output (before the bias) is zero, with a zero gradient.
            None => {
                let one = b.add(Op::Slice { axis: 2, start: 0, len: 1 }, &[y])?;
                let one = b.reshape(one, batched(batch, &[ca.out, 1, o[1], o[2]]))?;
                let zero = b.scale(one, 0.0)?;
                if o[0] > 1 {
                    b.add(Op::Pad { axis: 2, before: 0, after: o[0] - 1 }, &[zero])
                } else {
                    Ok(zero)
                }
            }
        }
    })();
    let y = r.at(site)?;
    if ca.bias {
        add_bias5(ctx, site, y, ca.out, fan_in)
    } else {
        Ok(y)
    }
}
