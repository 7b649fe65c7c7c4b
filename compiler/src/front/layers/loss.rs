//! Losses (each an f32 scalar of shape `[]`): `cross_entropy` (per sample or per pixel, with
//! PyTorch's `weight`, `ignore_index` and `label_smoothing`), `dice` (soft Dice over classes),
//! `mse` (complex `|z − t|²`), `l1`.

use super::*;

pub(crate) const DEFS: &[OpDef] = &[
    OpDef {
        name: "cross_entropy",
        signature: "cross_entropy(logits, labels, weight = (w0, w1, ...), ignore_index = -100, label_smoothing = 0.0)",
        args: &["weight", "ignore_index", "label_smoothing"],
        variadic: false,
        operands: (2, 2),
        lower: cross_entropy,
    },
    OpDef {
        name: "dice",
        signature: "dice(logits, labels, ignore_index = -100, smooth = 1e-5)",
        args: &["ignore_index", "smooth"],
        variadic: false,
        operands: (2, 2),
        lower: dice,
    },
    OpDef {
        name: "mse",
        signature: "mse(prediction, target)",
        args: &[],
        variadic: false,
        operands: (2, 2),
        lower: mse,
    },
    OpDef {
        name: "l1",
        signature: "l1(prediction, target)",
        args: &[],
        variadic: false,
        operands: (2, 2),
        lower: l1,
    },
];

/// The checked operands of a classification loss: logits `f32[B, C, ...spatial]` and labels
/// `i32[B, ...spatial]`.
struct ClassOperands {
    classes: usize,
    logits: TensorType,
}

fn class_operands(ctx: &LowerCtx, site: &Site, ops: &[Operand]) -> Result<ClassOperands, Diagnostic> {
    let (lo, la) = (&ops[0], &ops[1]);
    let op = site.call.op;
    let lt = ctx.ty(lo.value);
    if lt.dtype == DType::C64 {
        return Err(site
            .operand_error(ctx, lo, format!("`{op}` needs real logits, got {lt}"), "complex logits")
            .with_help("take `abs` (or `real`) of the logits first"));
    }
    if lt.dtype == DType::I32 || lt.shape.rank() < 2 {
        return Err(site.operand_error(
            ctx,
            lo,
            format!("`{op}` needs logits of type f32[B, classes, ...spatial], got {lt}"),
            "expects f32[B, classes, ...]",
        ));
    }
    let classes = fixed_dim(ctx, site, lo, 1, "class count")?;
    let tt = ctx.ty(la.value);
    // The labels are the logits without the class axis: one label per sample (or per pixel).
    let mut want = lt.shape.0.clone();
    want.remove(1);
    let want = Shape(want);
    if tt.dtype != DType::I32 || tt.shape != want {
        let mut d = site
            .operand_error(
                ctx,
                la,
                format!("`{op}` needs class labels i32{want} for logits {}, got {tt}", lt.shape),
                if want.rank() == 1 {
                    "expects one class label per sample"
                } else {
                    "expects one class label per pixel"
                },
            )
            .with_help(format!("declare the labels as `class{want} of {classes}`"));
        if lt.shape.rank() > 2 && tt.dtype == DType::I32 && tt.shape.rank() == 1 {
            d = d.with_note(
                "logits with spatial axes take per-pixel labels; for one label per sample, \
                 insert `flatten |> linear(classes)` before the loss",
            );
        }
        return Err(d);
    }
    // A label of class c ≥ width would pick no logit: its loss would be logsumexp alone.
    if let Some(&(declared, decl)) = ctx.classes.get(&la.value) {
        if declared != classes {
            return Err(Diagnostic::error(
                format!("`{op}`: the labels have {declared} classes but the logits are {classes} wide"),
                site.call.span,
                "class counts differ",
            )
            .with_label(lo.span, format!("{classes} logits per sample"))
            .with_label(decl, format!("declared with {declared} classes"))
            .with_help(format!(
                "make the last layer before the loss `linear({declared})`, or declare the labels `of {classes}`"
            )));
        }
    }
    Ok(ClassOperands { classes, logits: lt })
}

/// Reads `ignore_index` (PyTorch's default −100) and records it on the label input, so the
/// data loader accepts it besides `0..classes` and the metrics skip those pixels.
fn ignore_index(ctx: &mut LowerCtx, site: &Site, labels: Value) -> Result<i64, Diagnostic> {
    let ignore = site.args.int_opt("ignore_index")?.map_or(-100, |(v, _)| v);
    if let Some((prev, span)) = ctx.ignore_index.get(&labels).copied() {
        if prev != ignore {
            let at = site.args.get("ignore_index").map_or(site.call.span, |a| a.span);
            return Err(Diagnostic::error(
                format!("the labels are read with ignore_index = {prev} by another loss, here {ignore}"),
                at,
                "a different ignore_index",
            )
            .with_label(span, format!("ignore_index = {prev} here"))
            .with_help("use one ignore_index per label input"));
        }
    } else {
        ctx.ignore_index.insert(labels, (ignore, site.call.span));
    }
    Ok(ignore)
}

/// The per-pixel pieces every class loss shares, on `[B, C, ...spatial]` (class axis 1).
struct PixelTerms {
    /// `x − max(x)` (the max behind a stop-gradient).
    shifted: Value,
    /// `log Σ_c exp(shifted)`, `[B, 1, ...]`.
    lse: Value,
    /// One-hot labels moved to axis 1, `[B, C, ...]` (ignored and out-of-range labels: zeros).
    onehot: Value,
    /// `1` on counted pixels, `0` on ignored ones, `[B, 1, ...]`.
    valid: Value,
}

fn pixel_terms(
    b: &mut Builder,
    x: Value,
    labels: Value,
    classes: usize,
    rank: usize,
    ignore: Option<usize>,
) -> Result<PixelTerms, String> {
    let m = b.add(Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, &[x])?;
    let m = b.unary(UnaryOp::StopGrad, m)?;
    let shifted = b.sub(x, m)?;
    let e = b.unary(UnaryOp::Exp, shifted)?;
    let s = b.sum(e, &[1])?;
    let lse = b.unary(UnaryOp::Log, s)?;
    let oh = b.add(Op::OneHot { classes }, &[labels])?;
    // OneHot appends the class axis: [B, S.., C] → [B, C, S..].
    let onehot = if rank > 2 {
        let mut perm = vec![0, rank - 1];
        perm.extend(1..rank - 1);
        b.add(Op::Permute { perm }, &[oh])?
    } else {
        oh
    };
    // The data loader admits labels in 0..C and the ignore index only, so a pixel counts
    // exactly when its label is a class other than `ignore`.
    let valid = match ignore {
        Some(k) => {
            let col = b.add(Op::Slice { axis: 1, start: k, len: 1 }, &[onehot])?;
            let one = b.scalar(1.0, 0);
            b.sub(one, col)?
        }
        None => b.sum(onehot, &[1])?,
    };
    Ok(PixelTerms { shifted, lse, onehot, valid })
}

/// `[w_0·v[:, 0], w_1·v[:, 1], ...]` along the class axis 1 (a per-class constant factor).
fn class_scaled(b: &mut Builder, v: Value, weights: &[f64]) -> Result<Value, String> {
    let mut cols = Vec::with_capacity(weights.len());
    for (c, &w) in weights.iter().enumerate() {
        let col = b.add(Op::Slice { axis: 1, start: c, len: 1 }, &[v])?;
        cols.push(if w == 1.0 { col } else { b.scale(col, w)? });
    }
    b.add(Op::Concat { axis: 1 }, &cols)
}

/// Cross-entropy as PyTorch's `F.cross_entropy(logits, labels, weight, ignore_index,
/// label_smoothing)` with `reduction = "mean"`: with `-log p = lse − x`, the true-class
/// weight `w_y` (0 on ignored pixels) and `ε` the smoothing,
/// `L = Σ_i [(1−ε)·w_{y_i}·(−log p_{i,y_i}) + (ε/C)·m_i·Σ_c w_c·(−log p_{i,c})] / Σ_i w_{y_i}`,
/// `m_i` = 1 on counted pixels. Without arguments on `[B, C]` logits it is the batch mean
/// of `logsumexp(x) − x[label]` (the original lowering, kept so kernels stay identical).
fn cross_entropy(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let co = class_operands(ctx, site, ops)?;
    let (lo, la) = (&ops[0], &ops[1]);
    let classes = co.classes;
    let weight = site.args.numbers("weight", 0.0)?;
    if let Some((w, span)) = &weight {
        if w.len() != classes {
            return Err(Diagnostic::error(
                format!(
                    "`cross_entropy`: `weight` has {} values but the logits have {classes} classes",
                    w.len()
                ),
                *span,
                format!("{} values", w.len()),
            )
            .with_label(lo.span, format!("{classes} classes"))
            .with_help("give one weight per class"));
        }
    }
    let smoothing = site.args.float_in("label_smoothing", 0.0, 0.0, 1.0, true)?;
    let given_ignore = site.args.get("ignore_index").is_some();
    let ignore = ignore_index(ctx, site, la.value)?;
    let rank = co.logits.shape.rank();
    if rank == 2 && weight.is_none() && smoothing == 0.0 && !given_ignore {
        return sample_cross_entropy(ctx, site, lo, la, classes);
    }
    let in_range = usize::try_from(ignore).ok().filter(|&k| k < classes);
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let t = pixel_terms(b, lo.value, la.value, classes, rank, in_range)?;
        let nlogp = b.sub(t.lse, t.shifted)?;
        // The weight of each pixel's true class, zero on ignored pixels.
        let truth = match &weight {
            Some((w, _)) => {
                let mut w = w.clone();
                if let Some(k) = in_range {
                    w[k] = 0.0;
                }
                class_scaled(b, t.onehot, &w)?
            }
            None if in_range.is_some() => b.mul(t.onehot, t.valid)?,
            None => t.onehot,
        };
        let all: Vec<usize> = (0..rank).collect();
        let denom = b.sum(truth, &all)?;
        let picked = b.mul(truth, nlogp)?;
        let mut num = b.sum(picked, &all)?;
        if smoothing > 0.0 {
            let per_class = match &weight {
                Some((w, _)) => class_scaled(b, nlogp, w)?,
                None => nlogp,
            };
            let spread = b.sum(per_class, &[1])?;
            let counted = b.mul(spread, t.valid)?;
            let smooth = b.sum(counted, &all)?;
            let keep = b.scale(num, 1.0 - smoothing)?;
            let add = b.scale(smooth, smoothing / classes as f64)?;
            num = b.add2(keep, add)?;
        }
        let mean = b.div(num, denom)?;
        b.reshape(mean, Shape::scalar())
    })();
    r.at(site)
}

/// Mean over the batch of `logsumexp(x) − x[label]`, with the max shift behind a stop-gradient.
fn sample_cross_entropy(
    ctx: &mut LowerCtx,
    site: &Site,
    lo: &Operand,
    la: &Operand,
    classes: usize,
) -> Result<Value, Diagnostic> {
    let lt = ctx.ty(lo.value);
    let inv_b = inv_count(ctx, &lt.shape, &[0]);
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let x = lo.value;
        let m = b.add(Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, &[x])?;
        let m = b.unary(UnaryOp::StopGrad, m)?;
        let xs = b.sub(x, m)?;
        let e = b.unary(UnaryOp::Exp, xs)?;
        let s = b.sum(e, &[1])?;
        let l = b.unary(UnaryOp::Log, s)?;
        let lse = b.add2(l, m)?;
        let oh = b.add(Op::OneHot { classes }, &[la.value])?;
        let xo = b.mul(x, oh)?;
        let picked = b.sum(xo, &[1])?;
        let per = b.sub(lse, picked)?;
        let tot = b.sum(per, &[0, 1])?;
        let mean = b.mul(tot, inv_b)?;
        b.reshape(mean, Shape::scalar())
    })();
    r.at(site)
}

/// Soft Dice loss on softmax probabilities `p` against one-hot labels `g`, both zero on
/// ignored pixels, summed over the batch and every pixel per class:
/// `L = 1 − mean_c (2·Σ p_c·g_c + s) / (Σ p_c + Σ g_c + s)`, the mean over every class except
/// an in-range `ignore_index`; `s = smooth`.
fn dice(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let co = class_operands(ctx, site, ops)?;
    let (lo, la) = (&ops[0], &ops[1]);
    let classes = co.classes;
    let smooth = site.args.float_in("smooth", 1e-5, 0.0, f64::INFINITY, false)?;
    let ignore = ignore_index(ctx, site, la.value)?;
    let in_range = usize::try_from(ignore).ok().filter(|&k| k < classes);
    if classes == 1 && in_range.is_some() {
        return Err(site.error(
            "`dice`: the only class is the ignore_index: no class is left to score".into(),
            "no class left",
        ));
    }
    let rank = co.logits.shape.rank();
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let t = pixel_terms(b, lo.value, la.value, classes, rank, in_range)?;
        let logp = b.sub(t.shifted, t.lse)?;
        let p = b.unary(UnaryOp::Exp, logp)?;
        let p = b.mul(p, t.valid)?;
        let g = if in_range.is_some() { b.mul(t.onehot, t.valid)? } else { t.onehot };
        let axes: Vec<usize> = (0..rank).filter(|&a| a != 1).collect();
        let pg = b.mul(p, g)?;
        let inter = b.sum(pg, &axes)?;
        let ps = b.sum(p, &axes)?;
        let gs = b.sum(g, &axes)?;
        let s = b.scalar(smooth, 0);
        let two_i = b.scale(inter, 2.0)?;
        let top = b.add2(two_i, s)?;
        let bottom = b.add2(ps, gs)?;
        let bottom = b.add2(bottom, s)?;
        let per_class = b.div(top, bottom)?;
        let mut total = b.sum(per_class, &[1])?;
        let mut counted = classes;
        if let Some(k) = in_range {
            let col = b.add(Op::Slice { axis: 1, start: k, len: 1 }, &[per_class])?;
            total = b.sub(total, col)?;
            counted -= 1;
        }
        let mean = b.scale(total, 1.0 / counted as f64)?;
        let one = b.scalar(1.0, 0);
        let loss = b.sub(one, mean)?;
        b.reshape(loss, Shape::scalar())
    })();
    r.at(site)
}

/// `mean(f(prediction − target))` over every element, with `f = |·|²` or `|·|`.
fn mean_error(ctx: &mut LowerCtx, site: &Site, ops: &[Operand], f: UnaryOp) -> Result<Value, Diagnostic> {
    let (p, t) = (&ops[0], &ops[1]);
    let pt = need_float(ctx, site, p, "prediction")?;
    let tt = need_float(ctx, site, t, "target")?;
    if pt.shape != tt.shape {
        return Err(Diagnostic::error(
            format!("`{}`: the prediction is {} but the target is {}", site.call.op, pt.shape, tt.shape),
            site.call.span,
            "shapes differ",
        )
        .with_label(p.span, format!("this is {pt}"))
        .with_label(t.span, format!("this is {tt}"))
        .with_help("the prediction and the target must have the same shape"));
    }
    let axes: Vec<usize> = (0..pt.shape.rank()).collect();
    let inv = inv_count(ctx, &pt.shape, &axes);
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let d = b.sub(p.value, t.value)?;
        let e = b.unary(f, d)?;
        let s = if axes.is_empty() { e } else { b.sum(e, &axes)? };
        let m = b.mul(s, inv)?;
        b.reshape(m, Shape::scalar())
    })();
    r.at(site)
}

/// `mean |z − t|²` (complex or real).
fn mse(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    mean_error(ctx, site, ops, UnaryOp::Abs2)
}

/// `mean |z − t|`.
fn l1(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    mean_error(ctx, site, ops, UnaryOp::Abs)
}
