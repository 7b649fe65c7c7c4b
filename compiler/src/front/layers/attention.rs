//! Multi-head attention: `attention(heads, ...)`, self- or cross-attention with torchcvnn 0.10's
//! `MultiheadAttention` semantics (packed in-projection, weights `softmax(Re(q·kᴴ)/√d_head)`
//! over the keys, dropout on the weights, out-projection), lowered to batched `MatMul`s and the
//! fused attention primitives (`AttnLse`, `Attention`), so no `[T, S]` value exists.

use super::*;

pub(crate) const DEFS: &[OpDef] = &[OpDef {
    name: "attention",
    signature: "attention(heads, bias = true, score = real | abs, causal = false, dropout = 0.0)",
    args: &["heads", "bias", "score", "causal", "dropout"],
    variadic: false,
    operands: (1, 3),
    lower: attention,
}];

/// `attention(x)` (self), `attention(x, memory)` (cross) or `attention(x, memory, pad)`
/// with `x: [B, T, E]`, `memory: [B, S, E]`, `pad: f32 [B, S]` (nonzero = ignore the key).
fn attention(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let heads = site.args.count("heads", None, 1)?;
    let bias = site.args.flag("bias", true)?;
    let score = match site.args.choice("score", "real", &["real", "abs"])? {
        "abs" => AttnScore::Abs,
        _ => AttnScore::Real,
    };
    let causal = site.args.flag("causal", false)?;
    let p = site.args.float_in("dropout", 0.0, 0.0, 1.0, false)?;
    let x = &ops[0];
    let xt = sequence(ctx, site, x, "input")?;
    let e = fixed_dim(ctx, site, x, 2, "embedding size")?;
    let t = fixed_dim(ctx, site, x, 1, "sequence length")?;
    if e % heads != 0 {
        let arg = site.args.get("heads").map_or(site.call.span, |a| a.span);
        return Err(Diagnostic::error(
            format!("`attention`: the embedding size {e} is not divisible by heads = {heads}"),
            arg,
            "heads must divide the embedding size",
        )
        .with_label(x.span, format!("this is {xt}")));
    }
    let memory = ops.get(1);
    let s = match memory {
        Some(m) => {
            let mt = sequence(ctx, site, m, "memory")?;
            if mt.shape.0[0] != xt.shape.0[0] || mt.shape.0[2] != xt.shape.0[2] {
                return Err(site.operand_error(
                    ctx,
                    m,
                    format!(
                        "`attention`: memory {} does not match the input {} (batch and embedding)",
                        mt.shape, xt.shape
                    ),
                    format!("expects [{}, S, {e}]", xt.shape.0[0]),
                ));
            }
            fixed_dim(ctx, site, m, 1, "memory length")?
        }
        None => t,
    };
    let pad = match ops.get(2) {
        Some(m) => Some(key_mask(ctx, site, m, &xt, s)?),
        None => None,
    };

    // Parameters in torch.nn.MultiheadAttention's layout and names; complex Glorot weights
    // (torchcvnn: complex_xavier_uniform_), zero biases.
    let c64 = |dims: &[usize]| TensorType::new(DType::C64, Shape::fixed(dims));
    let w_in =
        ctx.param(site, "in_proj_weight", Init::Glorot { fan_in: e, fan_out: 3 * e }, c64(&[3 * e, e]));
    let b_in = bias.then(|| ctx.param(site, "in_proj_bias", Init::Zeros, c64(&[3 * e])));
    let w_out = ctx.param(site, "out_proj.weight", Init::Glorot { fan_in: e, fan_out: e }, c64(&[e, e]));
    let b_out = bias.then(|| ctx.param(site, "out_proj.bias", Init::Zeros, c64(&[e])));

    let dropout = if ctx.mode == Mode::Train && p > 0.0 {
        let salt = ctx.next_salt;
        ctx.next_salt += 1;
        Some((p, salt))
    } else {
        None
    };
    let step = dropout.map(|_| ctx.step_counter());
    let d = e / heads;
    let spec = AttnSpec { scale: 1.0 / (d as f64).sqrt(), score, causal, key_mask: pad.is_some(), dropout };
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        // The packed in-projection, as torch's `_in_projection_packed`: one product for
        // self-attention, q from `x` and k, v from `memory` otherwise.
        let (q, k, v) = match memory {
            None => {
                let qkv = project(b, x.value, w_in, b_in)?;
                let part =
                    |b: &mut Builder, i: usize| b.add(Op::Slice { axis: 2, start: i * e, len: e }, &[qkv]);
                (part(b, 0)?, part(b, 1)?, part(b, 2)?)
            }
            Some(m) => {
                let rows = |b: &mut Builder, v: Value, lo: usize, len: usize| {
                    b.add(Op::Slice { axis: 0, start: lo, len }, &[v])
                };
                let wq = rows(b, w_in, 0, e)?;
                let wkv = rows(b, w_in, e, 2 * e)?;
                let (bq, bkv) = match b_in {
                    Some(bi) => (Some(rows(b, bi, 0, e)?), Some(rows(b, bi, e, 2 * e)?)),
                    None => (None, None),
                };
                let q = project(b, x.value, wq, bq)?;
                let kv = project(b, m.value, wkv, bkv)?;
                let k = b.add(Op::Slice { axis: 2, start: 0, len: e }, &[kv])?;
                let v = b.add(Op::Slice { axis: 2, start: e, len: e }, &[kv])?;
                (q, k, v)
            }
        };
        let (q, k, v) = (split_heads(b, q, heads)?, split_heads(b, k, heads)?, split_heads(b, v, heads)?);
        let mut extra: Vec<Value> = pad.into_iter().collect();
        extra.extend(step);
        let lse_ops: Vec<Value> = [q, k].into_iter().chain(pad).collect();
        let lse = b.add(Op::AttnLse { spec }, &lse_ops)?;
        let att_ops: Vec<Value> = [q, k, v, lse].into_iter().chain(extra).collect();
        let o = b.add(Op::Attention { spec }, &att_ops)?;
        // [B, H, T, d] → [B, T, H, d] → [B, T, E], then the out-projection.
        let o = b.add(Op::Permute { perm: vec![0, 2, 1, 3] }, &[o])?;
        let mut shape = b.graph.ty(o).shape.clone();
        shape.0.truncate(2);
        shape.0.push(Dim::Fixed(e));
        let o = b.reshape(o, shape)?;
        project(b, o, w_out, b_out)
    })();
    r.at(site)
}

/// `x · Wᵀ (+ bias)` over the last axis of `x` (torch's `F.linear`: no conjugation).
fn project(b: &mut Builder, x: Value, w: Value, bias: Option<Value>) -> Result<Value, String> {
    let y = b.add(Op::MatMul { trans: [false, true], conj: [false, false], sum_batch: false }, &[x, w])?;
    match bias {
        Some(bi) => b.add2(y, bi),
        None => Ok(y),
    }
}

/// `[B, T, E]` → `[B, H, T, E/H]`: the embedding axis split head-major, as torch's `view`.
fn split_heads(b: &mut Builder, x: Value, heads: usize) -> Result<Value, String> {
    let s = b.graph.ty(x).shape.clone();
    let e = s.0[2].fixed().ok_or("the embedding axis is the batch")?;
    let split = Shape(vec![s.0[0], s.0[1], Dim::Fixed(heads), Dim::Fixed(e / heads)]);
    let x = b.reshape(x, split)?;
    b.add(Op::Permute { perm: vec![0, 2, 1, 3] }, &[x])
}

/// A `[B, T, E]` sequence operand (real or complex).
fn sequence(ctx: &LowerCtx, site: &Site, o: &Operand, what: &str) -> Result<TensorType, Diagnostic> {
    let ty = need_float(ctx, site, o, what)?;
    if ty.shape.rank() != 3 {
        return Err(site.operand_error(
            ctx,
            o,
            format!("`attention` needs a 3-D {what} [B, tokens, embedding], got {}", ty.shape),
            "expects [B, tokens, embedding]",
        ));
    }
    Ok(ty)
}

/// The key-padding mask operand: f32 `[B, S]`, nonzero = ignore that key.
fn key_mask(ctx: &LowerCtx, site: &Site, m: &Operand, x: &TensorType, s: usize) -> Result<Value, Diagnostic> {
    let ty = ctx.ty(m.value);
    let want = Shape(vec![x.shape.0[0], Dim::Fixed(s)]);
    if ty.dtype != DType::F32 || ty.shape != want {
        return Err(site
            .operand_error(
                ctx,
                m,
                format!("`attention`: the key-padding mask must be f32{want}, got {ty}"),
                format!("expects f32{want}"),
            )
            .with_help("nonzero entries mark keys to ignore (PyTorch's key_padding_mask)"));
    }
    Ok(m.value)
}
