//! Upsampling: `upsample1d` on `[B, C, L]` and `upsample2d` on `[B, C, H, W]` by an integer
//! `scale`, `mode = nearest | linear` (linear on both axes of `upsample2d` is bilinear), as
//! PyTorch's `F.interpolate(x, scale_factor = s, mode, align_corners = False)`.
//!
//! Lowered to existing primitives rather than a new movement primitive: an integer scale makes
//! the index rule periodic, so every back end, autodiff and fusion already handle it.
//! - nearest: output `i` reads input `floor(i / s)`: a reshape to `[.., L, 1, ..]`, an expand
//!   to `[.., L, s, ..]` and a reshape to `[.., L·s, ..]`.
//! - linear (`align_corners = false`): output `i = s·j + k` reads the source coordinate
//!   `(i + 0.5)/s − 0.5 = j + d_k`, `d_k = (k + 0.5)/s − 0.5` (clamped at 0 at the start; the
//!   upper neighbour clamped to `L − 1`). So phase `k` is `(1 − d_k)·x[j] + d_k·x[j+1]` when
//!   `d_k ≥ 0`, else `|d_k|·x[j−1] + (1 − |d_k|)·x[j]`, with `x` edge-replicated (which is
//!   exactly PyTorch's clamping). The `s` phases are stacked next to the axis and merged.
//!   Bilinear interpolation weights are products of the two axes' weights, so 2-D applies the
//!   1-D rule to the height, then to the width.

use super::*;

pub(crate) const DEFS: &[OpDef] = &[
    OpDef {
        name: "upsample1d",
        signature: "upsample1d(scale, mode = nearest | linear, align_corners = false)",
        args: &["scale", "mode", "align_corners"],
        variadic: false,
        operands: (1, 1),
        lower: upsample1d,
    },
    OpDef {
        name: "upsample2d",
        signature: "upsample2d(scale, mode = nearest | linear, align_corners = false)",
        args: &["scale", "mode", "align_corners"],
        variadic: false,
        operands: (1, 1),
        lower: upsample2d,
    },
];

fn upsample1d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    upsample(ctx, site, ops, 1)
}

fn upsample2d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    upsample(ctx, site, ops, 2)
}

fn upsample(ctx: &mut LowerCtx, site: &Site, ops: &[Operand], dims: usize) -> Result<Value, Diagnostic> {
    let scale: Vec<usize> = if dims == 1 {
        vec![site.args.count("scale", None, 1)?]
    } else {
        site.args.pair("scale", None, 1)?.to_vec()
    };
    let linear = site.args.choice("mode", "nearest", &["nearest", "linear"])? == "linear";
    if site.args.flag("align_corners", false)? {
        let arg = site.args.get("align_corners").expect("given");
        return Err(site
            .args
            .bad(
                arg,
                format!("`{}`: align_corners = true is not supported", site.call.op),
                "only align_corners = false",
            )
            .with_help("cvc upsamples by integer scales with PyTorch's default align_corners = false"));
    }
    let x = &ops[0];
    let layout = if dims == 1 { "3-D [B, C, L]" } else { "4-D [B, C, H, W]" };
    need_rank(ctx, site, x, dims + 2..=dims + 2, layout)?;
    let mut extents = Vec::with_capacity(dims);
    for (i, &s) in scale.iter().enumerate() {
        let e = fixed_dim(ctx, site, x, 2 + i, "spatial extent")?;
        if e.checked_mul(s).is_none_or(|n| n > args::MAX_COUNT as usize) {
            return Err(
                site.error(format!("`{}`: the upsampled extent overflows", site.call.op), "too large")
            );
        }
        extents.push(e);
    }
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let mut v = x.value;
        for (i, (&s, &e)) in scale.iter().zip(&extents).enumerate() {
            if s == 1 {
                continue;
            }
            v = if linear { linear_axis(b, v, 2 + i, e, s)? } else { nearest_axis(b, v, 2 + i, s)? };
        }
        Ok(v)
    })();
    r.at(site)
}

/// `[.., L, ..]` → `[.., L·s, ..]`, each element repeated `s` times.
fn nearest_axis(b: &mut Builder, v: Value, axis: usize, s: usize) -> Result<Value, String> {
    let shape = b.graph.ty(v).shape.clone();
    let mut col = shape.0.clone();
    col.insert(axis + 1, Dim::Fixed(1));
    let col = b.reshape(v, Shape(col.clone()))?;
    let mut wide = b.graph.ty(col).shape.0.clone();
    wide[axis + 1] = Dim::Fixed(s);
    let wide = b.expand(col, Shape(wide))?;
    merge(b, wide, &shape, axis, s)
}

/// `[.., L, s, ..]` → `[.., L·s, ..]` (`shape` is the shape before the phase axis).
fn merge(b: &mut Builder, v: Value, shape: &Shape, axis: usize, s: usize) -> Result<Value, String> {
    let mut out = shape.0.clone();
    out[axis] = Dim::Fixed(shape.0[axis].fixed().expect("spatial extents are fixed") * s);
    b.reshape(v, Shape(out))
}

/// Linear interpolation along `axis` (extent `e`) by the integer scale `s`; see the module doc.
fn linear_axis(b: &mut Builder, v: Value, axis: usize, e: usize, s: usize) -> Result<Value, String> {
    let shape = b.graph.ty(v).shape.clone();
    let first = b.add(Op::Slice { axis, start: 0, len: 1 }, &[v])?;
    let last = b.add(Op::Slice { axis, start: e - 1, len: 1 }, &[v])?;
    let edged = b.add(Op::Concat { axis }, &[first, v, last])?;
    let prev = b.add(Op::Slice { axis, start: 0, len: e }, &[edged])?;
    let next = b.add(Op::Slice { axis, start: 2, len: e }, &[edged])?;
    let mut col = shape.0.clone();
    col.insert(axis + 1, Dim::Fixed(1));
    let mut phases = Vec::with_capacity(s);
    for k in 0..s {
        let d = (k as f64 + 0.5) / s as f64 - 0.5;
        let (other, w) = if d >= 0.0 { (next, d) } else { (prev, -d) };
        let y = if w == 0.0 {
            v
        } else {
            let here = b.scale(v, 1.0 - w)?;
            let there = b.scale(other, w)?;
            b.add2(here, there)?
        };
        phases.push(b.reshape(y, Shape(col.clone()))?);
    }
    let stacked = b.add(Op::Concat { axis: axis + 1 }, &phases)?;
    merge(b, stacked, &shape, axis, s)
}
