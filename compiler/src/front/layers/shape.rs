//! Shape ops: `flatten`, `reshape`, `concat`, `split`, `permute`, `transpose`.

use super::*;

pub(crate) const DEFS: &[OpDef] = &[
    OpDef {
        name: "flatten",
        signature: "flatten",
        args: &[],
        variadic: false,
        operands: (1, 1),
        lower: flatten,
    },
    OpDef {
        name: "reshape",
        signature: "reshape(d1, d2, ...)   (`B` allowed, one extent may be -1)",
        args: &[],
        variadic: true,
        operands: (1, 1),
        lower: reshape,
    },
    OpDef {
        name: "concat",
        signature: "concat(a, b, ..., axis = 1)",
        args: &["axis"],
        variadic: false,
        operands: (2, usize::MAX),
        lower: concat,
    },
    OpDef {
        name: "split",
        signature: "split(size1, size2, ..., axis = 1, index = i)",
        args: &["axis", "index"],
        variadic: true,
        operands: (1, 1),
        lower: split,
    },
    OpDef {
        name: "permute",
        signature: "permute(axis0, axis1, ...)",
        args: &[],
        variadic: true,
        operands: (1, 1),
        lower: permute,
    },
    OpDef {
        name: "transpose",
        signature: "transpose(axis0, axis1)",
        args: &["axis0", "axis1"],
        variadic: false,
        operands: (1, 1),
        lower: transpose,
    },
];

/// `[B, d1, d2, ...]` → `[B, d1·d2·...]`.
fn flatten(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, 2..=usize::MAX, "[B, ...]")?;
    let mut n = 1;
    for a in 1..ty.shape.rank() {
        n = fixed_dim(ctx, site, x, a, "extent")?.saturating_mul(n);
    }
    ctx.b.reshape(x.value, Shape(vec![ty.shape.0[0], Dim::Fixed(n)])).at(site)
}

/// A view with new extents; `B` stands for the batch, `-1` for the one inferred extent.
fn reshape(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    let ty = need_float(ctx, site, x, "tensor")?;
    let dims = site.args.rest_ints(true)?;
    if dims.is_empty() {
        return Err(site
            .error("`reshape` needs the target extents".into(), "no extents given")
            .with_help("write e.g. `reshape(B, 16, 4)`; `B` is the batch size and one extent may be -1"));
    }
    let mut out = Vec::new();
    let mut infer_at = None;
    let mut known = 1usize;
    for &(d, span) in &dims {
        match d {
            None => out.push(Dim::Batch),
            Some(-1) if infer_at.is_none() => {
                infer_at = Some(out.len());
                out.push(Dim::Fixed(1));
            }
            Some(v) if v >= 1 => {
                known = known.saturating_mul(v as usize);
                out.push(Dim::Fixed(v as usize));
            }
            Some(v) => {
                return Err(Diagnostic::error(
                    format!("invalid extent {v} in `reshape`"),
                    span,
                    "extents must be positive (one may be -1)",
                ))
            }
        }
    }
    let total = ty.shape.fixed_numel();
    if let Some(i) = infer_at {
        if total % known != 0 {
            return Err(site.operand_error(
                ctx,
                x,
                format!("`reshape`: {} elements cannot be split into extents of {known}", ty.shape),
                "no integer extent fits -1",
            ));
        }
        out[i] = Dim::Fixed(total / known);
    }
    let target = Shape(out);
    if target.fixed_numel() != total || target.batch_power() != ty.shape.batch_power() {
        return Err(site
            .operand_error(
                ctx,
                x,
                format!("`reshape`: cannot view {} as {target}: element counts differ", ty.shape),
                format!("{target} has a different element count"),
            )
            .with_help("the product of the extents (and the number of `B`s) must stay the same"));
    }
    ctx.b.reshape(x.value, target).at(site)
}

/// Concatenation along `axis`; the other extents must agree.
fn concat(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let first = need_float(ctx, site, &ops[0], "tensor")?;
    let axis = site.args.axis("axis", 1, first.shape.rank())?;
    for o in &ops[1..] {
        let t = need_float(ctx, site, o, "tensor")?;
        let same_rank = t.shape.rank() == first.shape.rank();
        let bad =
            !same_rank || (0..first.shape.rank()).any(|i| i != axis && t.shape.0[i] != first.shape.0[i]);
        if bad {
            return Err(Diagnostic::error(
                format!("`concat` along axis {axis}: {} and {} differ on another axis", first.shape, t.shape),
                site.call.span,
                "these shapes do not line up",
            )
            .with_label(ops[0].span, format!("this is {first}"))
            .with_label(o.span, format!("this is {t}"))
            .with_help("all extents except the concatenation axis must be equal"));
        }
    }
    for o in ops {
        fixed_dim(ctx, site, o, axis, "extent on the concatenation axis")?;
    }
    let vals: Vec<Value> = ops.iter().map(|o| o.value).collect();
    ctx.b.add(Op::Concat { axis }, &vals).at(site)
}

/// Piece `index` of `x` cut along `axis` into the given sizes.
fn split(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    let ty = need_float(ctx, site, x, "tensor")?;
    let axis = site.args.axis("axis", 1, ty.shape.rank())?;
    let sizes = site.args.rest_ints(false)?;
    if sizes.is_empty() {
        return Err(site
            .error("`split` needs the sizes of the pieces".into(), "no sizes given")
            .with_help("write e.g. `split(16, 16, axis = 1, index = 0)`"));
    }
    let mut starts = Vec::new();
    let mut total = 0usize;
    for &(s, span) in &sizes {
        let s = s.expect("integers only");
        if s < 1 {
            return Err(Diagnostic::error(
                format!("invalid piece size {s} in `split`"),
                span,
                "sizes must be positive",
            ));
        }
        starts.push(total);
        total = total.saturating_add(usize::try_from(s).unwrap_or(usize::MAX));
    }
    let e = fixed_dim(ctx, site, x, axis, "extent on the split axis")?;
    if total != e {
        return Err(site.operand_error(
            ctx,
            x,
            format!("`split`: the sizes add up to {total} but axis {axis} has extent {e}"),
            "sizes do not cover the axis",
        ));
    }
    let index = site.args.count("index", None, 0)?;
    if index >= sizes.len() {
        let arg = site.args.get("index").expect("required");
        return Err(site.args.bad(
            arg,
            format!("`split` makes {} pieces, so index {index} is out of range", sizes.len()),
            format!("valid indices are 0 to {}", sizes.len() - 1),
        ));
    }
    let len = sizes[index].0.expect("integers only") as usize;
    ctx.b.add(Op::Slice { axis, start: starts[index], len }, &[x.value]).at(site)
}

/// Axis permutation: output axis `i` is input axis `perm[i]`.
fn permute(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    let ty = need_float(ctx, site, x, "tensor")?;
    let perm: Vec<i64> = site.args.rest_ints(false)?.iter().map(|p| p.0.expect("integers only")).collect();
    let rank = ty.shape.rank() as i64;
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..rank).collect::<Vec<_>>() {
        return Err(site
            .operand_error(
                ctx,
                x,
                format!("`permute({perm:?})` is not a permutation of the {rank} axes of {}", ty.shape),
                "not a permutation",
            )
            .with_help(format!("list each axis 0..{} exactly once", rank - 1)));
    }
    let perm = perm.iter().map(|&p| p as usize).collect();
    ctx.b.add(Op::Permute { perm }, &[x.value]).at(site)
}

/// Swaps two axes (negative counts from the end), as `torch.transpose`. The batch axis may
/// move: the IR carries `B` at any position (only model inputs must lead with it), and a layer
/// that needs `[B, ...]` afterwards says so in its own error.
fn transpose(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    let ty = need_float(ctx, site, x, "tensor")?;
    for name in ["axis0", "axis1"] {
        if site.args.get(name).is_none() {
            return Err(site.args.missing(name));
        }
    }
    let a = site.args.axis("axis0", 0, ty.shape.rank())?;
    let c = site.args.axis("axis1", 0, ty.shape.rank())?;
    if a == c {
        return Ok(x.value);
    }
    let mut perm: Vec<usize> = (0..ty.shape.rank()).collect();
    perm.swap(a, c);
    ctx.b.add(Op::Permute { perm }, &[x.value]).at(site)
}
