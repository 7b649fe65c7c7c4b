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
    let scale = 1.0 / (d as f64).sqrt();
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        // The packed in-projection, as torch's `_in_projection_packed`: one product for
        // self-attention, q from `x` and k, v from `memory` otherwise. The attention reads
        // its heads where the projection left them (`AttnHeads::cols`): no slice, head split
        // or permute is stored, and its output `[B, T, E]` is the out-projection's input.
        let (q, k, v, cols) = match memory {
            None => {
                let qkv = project(b, x.value, w_in, b_in)?;
                (qkv, qkv, qkv, [0, e, 2 * e])
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
                (q, kv, kv, [0, 0, e])
            }
        };
        let heads = AttnHeads { n: heads, d, dv: d, cols };
        let spec = AttnSpec { heads, scale, score, causal, key_mask: pad.is_some(), dropout };
        let mut extra: Vec<Value> = pad.into_iter().collect();
        extra.extend(step);
        let lse_ops: Vec<Value> = [q, k].into_iter().chain(pad).collect();
        let lse = b.add(Op::AttnLse { spec }, &lse_ops)?;
        let att_ops: Vec<Value> = [q, k, v, lse].into_iter().chain(extra).collect();
        let o = b.add(Op::Attention { spec }, &att_ops)?;
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
