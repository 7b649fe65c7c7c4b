//! Attention calls of the CPU launch list: the extents and arena offsets of one `AttnLse`,
//! `Attention` or `AttentionGrad` node, executed by `runtime/src/cpu/attention.rs` as a
//! blocked loop (query block × key block) that never stores the `[T, S]` weights.

use super::NodeCtx;
use crate::error::{CompileError, CompileResult};
use crate::ir::{AttnSpec, AttnWrt, Op};

/// Queries per block of the CPU attention loops.
pub const BLOCK_Q: usize = 32;
/// Keys per block of the CPU attention loops.
pub const BLOCK_K: usize = 64;

/// f32 words of per-thread workspace one attention call needs: per block of
/// `BLOCK_Q × BLOCK_K` weights, `c = q·kᴴ` (complex), the weights `p` and the complex
/// score gradient `g`; plus one f32 per query of the block (row statistics).
pub const WORKSPACE_WORDS: usize = BLOCK_Q * BLOCK_K * 5 + BLOCK_Q * 2;

/// Which attention primitive a call computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnKind {
    /// `AttnLse`: f32 `[B, H, T]`.
    Lse,
    /// `Attention`: c64 `[B, T, H·Dv]`.
    Forward,
    /// `AttentionGrad`: `dq` or `dk ‖ dv`.
    Grad(AttnWrt),
}

/// One attention launch. Operands are token-major at byte offsets of the arena: `q` rows of
/// `ld[0]` complex values (`T` per batch row), head `h` at `h·d` from the offset; `k` and `v`
/// likewise (`S` rows of `ld[1]`, `ld[2]`); `o`, `d_o` and the forward's output `[B, T, H·dv]`,
/// `dq` `[B, T, H·d]`, `dk ‖ dv` `[B, S, H·d + H·dv]`; `lse` f32 `[B, H, T]`.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionCall {
    /// What it computes.
    pub kind: AttnKind,
    /// Scale, score, masks, dropout.
    pub spec: AttnSpec,
    /// Batch, heads, queries, keys, query/key features, value features (0 for `Lse`).
    pub b: usize,
    /// Heads.
    pub h: usize,
    /// Queries.
    pub t: usize,
    /// Keys.
    pub s: usize,
    /// Query/key features.
    pub d: usize,
    /// Value features (0 for `Lse`).
    pub dv: usize,
    /// Head 0 of row 0 of the query (its operand's offset plus its first column).
    pub q: usize,
    /// Head 0 of row 0 of the key.
    pub k: usize,
    /// Head 0 of row 0 of the value (not `Lse`).
    pub v: Option<usize>,
    /// Row strides of the query, key and value operands, in complex values.
    pub ld: [usize; 3],
    /// f32 `[B, H, T]` (not `Lse`).
    pub lse: Option<usize>,
    /// The forward output `o`, c64 `[B, T, H·Dv]` (`Grad` only).
    pub o: Option<usize>,
    /// The gradient of `o` (`Grad` only).
    pub d_o: Option<usize>,
    /// f32 `[B, S]` key mask (when `spec.key_mask`).
    pub mask: Option<usize>,
    /// i32 step counter (when `spec.dropout` is set).
    pub step: Option<usize>,
    /// The output.
    pub out: usize,
}

/// The attention call computing `cx.v`.
pub(crate) fn attention(cx: &NodeCtx) -> CompileResult<AttentionCall> {
    let (spec, kind, fixed) = match &cx.node().op {
        Op::AttnLse { spec } => (*spec, AttnKind::Lse, 2),
        Op::Attention { spec } => (*spec, AttnKind::Forward, 4),
        Op::AttentionGrad { spec, wrt } => (*spec, AttnKind::Grad(*wrt), 6),
        other => return Err(CompileError::internal(format!("{} is not an attention op", other.mnemonic()))),
    };
    let hd = spec.heads;
    let (q, k) = (cx.input(0)?, cx.input(1)?);
    let three = |x: crate::ir::Value| -> CompileResult<[usize; 3]> {
        match cx.shape(x)[..] {
            [b, rows, cols] => Ok([b, rows, cols]),
            _ => Err(CompileError::internal(format!("attention operand {x} is not of rank 3"))),
        }
    };
    let [b, t, lq] = three(q)?;
    let [_, s, lk] = three(k)?;
    let (h, d) = (hd.n, hd.d);
    // The first head's first element of operand `i`: 8 bytes per complex value.
    let head0 = |i: usize| -> CompileResult<usize> { Ok(cx.offset(cx.input(i)?)? + 8 * hd.cols[i]) };
    let at = |i: usize| -> CompileResult<usize> { cx.offset(cx.input(i)?) };
    let (v, dv, lv) =
        if fixed > 2 { (Some(head0(2)?), hd.dv, three(cx.input(2)?)?[2]) } else { (None, 0, 0) };
    let lse = match kind {
        AttnKind::Lse => None,
        AttnKind::Forward => Some(at(3)?),
        AttnKind::Grad(_) => Some(at(5)?),
    };
    let (o, d_o) = match kind {
        AttnKind::Grad(_) => (Some(at(3)?), Some(at(4)?)),
        _ => (None, None),
    };
    let mut next = fixed;
    let mask = if spec.key_mask {
        next += 1;
        Some(at(next - 1)?)
    } else {
        None
    };
    // `AttnLse` has no step operand: dropout follows the softmax.
    let step = if spec.dropout.is_some() && kind != AttnKind::Lse { Some(at(next)?) } else { None };
    Ok(AttentionCall {
        kind,
        spec,
        b,
        h,
        t,
        s,
        d,
        dv,
        q: head0(0)?,
        k: head0(1)?,
        v,
        ld: [lq, lk, lv],
        lse,
        o,
        d_o,
        mask,
        step,
        out: cx.offset(cx.v)?,
    })
}
