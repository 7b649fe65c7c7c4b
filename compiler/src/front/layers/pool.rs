//! Pooling: `avgpool1d/2d/3d`, `maxpool1d/2d/3d` (by magnitude on complex values), with
//! `stride` and `pad` as PyTorch's; `adaptive_avgpool(size)`; `global_avgpool`.
//!
//! A window pool whose stride is its kernel and without padding floors: the remainder of each
//! spatial axis is sliced off, the axis is split into `[extent / k, k]` by a reshape (a view),
//! and the window axes are reduced. Any other stride or padding gathers the `k` window
//! offsets of each axis as `k` strided slices (a slice, a split and a slice: views and
//! copies, no new primitive) stacked next to the axis and reduced, one axis after the other:
//! a window's sum, maximum and largest-magnitude element are those of its rows' results.

use super::*;

const fn pool(name: &'static str, signature: &'static str, lower: LowerFn) -> OpDef {
    OpDef { name, signature, args: &["kernel", "stride", "pad"], variadic: false, operands: (1, 1), lower }
}

const fn avg(name: &'static str, signature: &'static str, lower: LowerFn) -> OpDef {
    OpDef {
        name,
        signature,
        args: &["kernel", "stride", "pad", "count_include_pad"],
        variadic: false,
        operands: (1, 1),
        lower,
    }
}

pub(crate) const DEFS: &[OpDef] = &[
    avg("avgpool1d", "avgpool1d(kernel, stride = kernel, pad = 0, count_include_pad = true)", avgpool1d),
    avg("avgpool2d", "avgpool2d(kernel, stride = kernel, pad = 0, count_include_pad = true)", avgpool2d),
    pool("maxpool1d", "maxpool1d(kernel, stride = kernel, pad = 0)", maxpool1d),
    pool("maxpool2d", "maxpool2d(kernel, stride = kernel, pad = 0)", maxpool2d),
    avg("avgpool3d", "avgpool3d(kernel, stride = kernel, pad = 0, count_include_pad = true)", avgpool3d),
    pool("maxpool3d", "maxpool3d(kernel, stride = kernel, pad = 0)", maxpool3d),
    OpDef {
        name: "adaptive_avgpool",
        signature: "adaptive_avgpool(size)",
        args: &["size"],
        variadic: false,
        operands: (1, 1),
        lower: adaptive_avgpool,
    },
    OpDef {
        name: "global_avgpool",
        signature: "global_avgpool",
        args: &[],
        variadic: false,
        operands: (1, 1),
        lower: global_avgpool,
    },
];

fn avgpool1d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    window_pool(ctx, site, ops, 1, false)
}
fn avgpool2d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    window_pool(ctx, site, ops, 2, false)
}
fn maxpool1d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    window_pool(ctx, site, ops, 1, true)
}
fn maxpool2d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    window_pool(ctx, site, ops, 2, true)
}
fn avgpool3d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    window_pool(ctx, site, ops, 3, false)
}
fn maxpool3d(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    window_pool(ctx, site, ops, 3, true)
}

/// The layout a `dims`-D window pool reads, for errors.
fn layout(dims: usize) -> &'static str {
    match dims {
        1 => "3-D [B, C, L]",
        2 => "4-D [B, C, H, W]",
        _ => "5-D [B, C, D, H, W]",
    }
}

/// An integer (1-D), an integer or pair (2-D) or an integer or triple (3-D) argument, with a
/// default per axis.
fn spatial_arg(
    site: &Site,
    name: &str,
    dims: usize,
    default: Option<&[usize]>,
    min: usize,
) -> Result<Vec<usize>, Diagnostic> {
    if site.args.get(name).is_none() {
        if let Some(d) = default {
            return Ok(d[..dims].to_vec());
        }
    }
    Ok(match dims {
        1 => vec![site.args.count(name, None, min)?],
        2 => site.args.pair(name, None, min)?.to_vec(),
        _ => site.args.triple(name, None, min)?.to_vec(),
    })
}

/// Pools the last `dims` axes of `[B, C, ...]`: output extent `(e + 2·pad − k) / stride + 1`
/// (floored, as PyTorch's `ceil_mode = false`). Average pooling divides by the window size
/// (`count_include_pad = true`, PyTorch's default) or by the number of unpadded elements in
/// the window; max pooling never picks a padded element.
fn window_pool(
    ctx: &mut LowerCtx,
    site: &Site,
    ops: &[Operand],
    dims: usize,
    max: bool,
) -> Result<Value, Diagnostic> {
    let kernel = spatial_arg(site, "kernel", dims, None, 1)?;
    let stride = spatial_arg(site, "stride", dims, Some(&kernel), 1)?;
    let pad = spatial_arg(site, "pad", dims, Some(&[0, 0, 0]), 0)?;
    let include_pad = if max { true } else { site.args.flag("count_include_pad", true)? };
    if stride == kernel && pad.iter().all(|&p| p == 0) {
        return strided_free_pool(ctx, site, ops, dims, max, &kernel);
    }
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, dims + 2..=dims + 2, layout(dims))?;
    let mut axes = Vec::with_capacity(dims);
    for i in 0..dims {
        let axis = 2 + i;
        let e = fixed_dim(ctx, site, x, axis, "spatial extent")?;
        let (k, s, p) = (kernel[i], stride[i], pad[i]);
        // PyTorch's rule: a window never lies entirely in the padding.
        if p > k / 2 {
            let span = site.args.get("pad").map_or(site.call.span, |a| a.span);
            return Err(Diagnostic::error(
                format!("`{}`: pad {p} is more than half the kernel {k}", site.call.op),
                span,
                "padding too large",
            )
            .with_help(format!("use pad <= {}", k / 2)));
        }
        if k > e + 2 * p {
            let mut d = site.operand_error(
                ctx,
                x,
                format!(
                    "`{}`: window {k} is larger than the padded input extent {} (axis {axis})",
                    site.call.op,
                    e + 2 * p
                ),
                "kernel larger than the input",
            );
            if let Some(a) = site.args.get("kernel") {
                d = d.with_label(a.span, "kernel set here");
            }
            return Err(d);
        }
        axes.push(AxisWindow { axis, extent: e, k, s, p, n: (e + 2 * p - k) / s + 1 });
    }
    let complex = ty.dtype.is_complex();
    let reduce = match (max, complex) {
        (false, _) => ReduceOp::Sum,
        (true, false) => ReduceOp::Max,
        (true, true) => ReduceOp::MaxMag,
    };
    let rank = ty.shape.rank();
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let mut v = x.value;
        let mut counts = None;
        for w in &axes {
            // Real maxima must never pick a padded zero: padding gets −1e30 instead.
            let fill = if reduce == ReduceOp::Max && w.p > 0 {
                let ones = ones_along(b, rank, w.axis, w.extent)?;
                let inside = w.pad(b, ones)?;
                let one = b.scalar(1.0, 0);
                let outside = b.sub(inside, one)?;
                Some(b.scale(outside, 1e30)?)
            } else {
                None
            };
            let padded = w.pad(b, v)?;
            let padded = match fill {
                Some(f) => b.add2(padded, f)?,
                None => padded,
            };
            v = w.reduce(b, padded, reduce)?;
            if !max && !include_pad && w.p > 0 {
                let ones = ones_along(b, rank, w.axis, w.extent)?;
                let inside = w.pad(b, ones)?;
                let c = w.reduce(b, inside, ReduceOp::Sum)?;
                counts = Some(match counts {
                    Some(prev) => b.mul(prev, c)?,
                    None => c,
                });
            }
        }
        if max {
            return Ok(v);
        }
        match counts {
            Some(c) => {
                // Axes without padding count their full kernel.
                let rest: usize = axes.iter().filter(|w| w.p == 0).map(|w| w.k).product();
                let c = if rest == 1 { c } else { b.scale(c, rest as f64)? };
                b.div(v, c)
            }
            None => b.scale(v, 1.0 / axes.iter().map(|w| w.k).product::<usize>() as f64),
        }
    })();
    r.at(site)
}

/// One spatial axis of a strided or padded window pool.
struct AxisWindow {
    axis: usize,
    extent: usize,
    k: usize,
    s: usize,
    p: usize,
    /// Output extent.
    n: usize,
}

impl AxisWindow {
    /// Zero padding of `p` before and after, plus the zeros the last offset's strided slice
    /// runs over (never read): the padded extent is at least `k − 1 + s·n`.
    fn pad(&self, b: &mut Builder, v: Value) -> Result<Value, String> {
        let len = self.extent + 2 * self.p;
        let tail = (self.k - 1 + self.s * self.n).saturating_sub(len);
        if self.p == 0 && tail == 0 {
            return Ok(v);
        }
        b.add(Op::Pad { axis: self.axis, before: self.p, after: self.p + tail }, &[v])
    }

    /// `out[.., j, ..] = reduce_r v[.., r + s·j, ..]` over the window offsets `r < k`.
    fn reduce(&self, b: &mut Builder, v: Value, op: ReduceOp) -> Result<Value, String> {
        let (a, n, s) = (self.axis, self.n, self.s);
        let shape = b.graph.ty(v).shape.clone();
        let mut picks = Vec::with_capacity(self.k);
        for r in 0..self.k {
            let run = b.add(Op::Slice { axis: a, start: r, len: s * n }, &[v])?;
            // [.., s·n, ..] → [.., n, s, ..] → element 0 of each stride: [.., n, 1, ..].
            let mut split = shape.0.clone();
            split.splice(a..=a, [Dim::Fixed(n), Dim::Fixed(s)]);
            let grid = b.reshape(run, Shape(split))?;
            let pick =
                if s == 1 { grid } else { b.add(Op::Slice { axis: a + 1, start: 0, len: 1 }, &[grid])? };
            picks.push(pick);
        }
        let windows = if picks.len() == 1 { picks[0] } else { b.add(Op::Concat { axis: a + 1 }, &picks)? };
        let red = b.add(Op::Reduce { op, axes: vec![a + 1] }, &[windows])?;
        let mut out = shape.0;
        out[a] = Dim::Fixed(n);
        b.reshape(red, Shape(out))
    }
}

/// Ones of shape `[1, .., extent (at axis), .., 1]` (rank `rank`): the in-bounds mask that
/// padding turns into a count or a fill.
fn ones_along(b: &mut Builder, rank: usize, axis: usize, extent: usize) -> Result<Value, String> {
    let one = b.scalar(1.0, 0);
    let one = b.reshape(one, Shape::fixed(&vec![1; rank]))?;
    let mut dims = vec![1; rank];
    dims[axis] = extent;
    b.expand(one, Shape::fixed(&dims))
}

/// Pools the last `dims` axes of `[B, C, ...]` in non-overlapping windows (stride = kernel,
/// no padding).
fn strided_free_pool(
    ctx: &mut LowerCtx,
    site: &Site,
    ops: &[Operand],
    dims: usize,
    max: bool,
    kernel: &[usize],
) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, dims + 2..=dims + 2, layout(dims))?;
    let mut v = x.value;
    let mut split = vec![ty.shape.0[0], ty.shape.0[1]];
    let mut merged = split.clone();
    let mut window_axes = Vec::new();
    for (i, &k) in kernel.iter().enumerate() {
        let axis = 2 + i;
        let e = fixed_dim(ctx, site, x, axis, "spatial extent")?;
        if k > e {
            let mut d = site.operand_error(
                ctx,
                x,
                format!("`{}`: window {k} is larger than the input extent {e} (axis {axis})", site.call.op),
                "kernel larger than the input",
            );
            if let Some(a) = site.args.get("kernel") {
                d = d.with_label(a.span, "kernel set here");
            }
            return Err(d);
        }
        let n = e / k;
        if n * k != e {
            v = ctx.b.add(Op::Slice { axis, start: 0, len: n * k }, &[v]).at(site)?;
        }
        split.extend([Dim::Fixed(n), Dim::Fixed(k)]);
        merged.push(Dim::Fixed(n));
        window_axes.push(3 + 2 * i);
    }
    let complex = ty.dtype.is_complex();
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let w = b.reshape(v, Shape(split))?;
        let red = if !max {
            let s = b.sum(w, &window_axes)?;
            b.scale(s, 1.0 / kernel.iter().product::<usize>() as f64)?
        } else {
            let op = if complex { ReduceOp::MaxMag } else { ReduceOp::Max };
            b.add(Op::Reduce { op, axes: window_axes.clone() }, &[w])?
        };
        b.reshape(red, Shape(merged))
    })();
    r.at(site)
}

/// PyTorch's `adaptive_avg_pool1d/2d`: output bin `i` of an axis of extent `e` averages
/// `[floor(i·e/o), ceil((i+1)·e/o))`. `[B, C, L]` takes `size = o`, `[B, C, H, W]` takes
/// `size = o` or `(oh, ow)`. Bins of equal width are a split and a sum; uneven ones a slice
/// and a sum each, joined.
fn adaptive_avgpool(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, 3..=4, "3-D [B, C, L] or 4-D [B, C, H, W]")?;
    let dims = ty.shape.rank() - 2;
    let size = spatial_arg(site, "size", dims, None, 1)?;
    let mut extents = Vec::with_capacity(dims);
    for (i, &o) in size.iter().enumerate() {
        let e = fixed_dim(ctx, site, x, 2 + i, "spatial extent")?;
        if o > e {
            let span = site.args.get("size").map_or(site.call.span, |a| a.span);
            return Err(Diagnostic::error(
                format!(
                    "`adaptive_avgpool`: output size {o} is larger than the input extent {e} (axis {})",
                    2 + i
                ),
                span,
                "more bins than elements",
            )
            .with_label(x.span, format!("this is {ty}")));
        }
        extents.push(e);
    }
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let mut v = x.value;
        for (i, (&o, &e)) in size.iter().zip(&extents).enumerate() {
            let a = 2 + i;
            let shape = b.graph.ty(v).shape.clone();
            let mut out = shape.0.clone();
            out[a] = Dim::Fixed(o);
            if e % o == 0 {
                let mut split = shape.0.clone();
                split.splice(a..=a, [Dim::Fixed(o), Dim::Fixed(e / o)]);
                let grid = b.reshape(v, Shape(split))?;
                let s = b.sum(grid, &[a + 1])?;
                let m = b.scale(s, o as f64 / e as f64)?;
                v = b.reshape(m, Shape(out))?;
                continue;
            }
            let mut bins = Vec::with_capacity(o);
            for j in 0..o {
                let start = j * e / o;
                let end = ((j + 1) * e).div_ceil(o);
                let piece = b.add(Op::Slice { axis: a, start, len: end - start }, &[v])?;
                let s = b.sum(piece, &[a])?;
                bins.push(b.scale(s, 1.0 / (end - start) as f64)?);
            }
            v = b.add(Op::Concat { axis: a }, &bins)?;
        }
        Ok(v)
    })();
    r.at(site)
}

/// Mean over every spatial axis: `[B, C, ...]` → `[B, C]`.
fn global_avgpool(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, 3..=usize::MAX, "[B, C, spatial...]")?;
    let axes: Vec<usize> = (2..ty.shape.rank()).collect();
    for &a in &axes {
        fixed_dim(ctx, site, x, a, "spatial extent")?;
    }
    let inv = inv_count(ctx, &ty.shape, &axes);
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let s = b.sum(x.value, &axes)?;
        let m = b.mul(s, inv)?;
        b.reshape(m, Shape(ty.shape.0[..2].to_vec()))
    })();
    r.at(site)
}
