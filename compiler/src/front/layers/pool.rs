//! Pooling: `avgpool1d/2d`, `maxpool1d/2d` (by magnitude on complex values), `global_avgpool`.
//!
//! A window pool with kernel `k` has stride `k` and floors: the remainder of each spatial axis
//! is sliced off, the axis is split into `[extent / k, k]` by a reshape (a view), and the
//! window axes are reduced.

use super::*;

const fn pool(name: &'static str, signature: &'static str, lower: LowerFn) -> OpDef {
    OpDef { name, signature, args: &["kernel"], variadic: false, operands: (1, 1), lower }
}

pub(crate) const DEFS: &[OpDef] = &[
    pool("avgpool1d", "avgpool1d(kernel)", avgpool1d),
    pool("avgpool2d", "avgpool2d(kernel)", avgpool2d),
    pool("maxpool1d", "maxpool1d(kernel)", maxpool1d),
    pool("maxpool2d", "maxpool2d(kernel)", maxpool2d),
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

/// Pools the last `dims` axes of `[B, C, ...]` in non-overlapping windows.
fn window_pool(
    ctx: &mut LowerCtx,
    site: &Site,
    ops: &[Operand],
    dims: usize,
    max: bool,
) -> Result<Value, Diagnostic> {
    let kernel: Vec<usize> = if dims == 1 {
        vec![site.args.count("kernel", None, 1)?]
    } else {
        site.args.pair("kernel", None, 1)?.to_vec()
    };
    let x = &ops[0];
    let layout = if dims == 1 { "3-D [B, C, L]" } else { "4-D [B, C, H, W]" };
    let ty = need_rank(ctx, site, x, dims + 2..=dims + 2, layout)?;
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
