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
    /// `Attention`: c64 `[B, H, T, Dv]`.
    Forward,
    /// `AttentionGrad`: `dq` or `dk ‖ dv`.
    Grad(AttnWrt),
}

/// One attention launch: every operand contiguous row-major, at a byte offset of the arena.
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
    /// c64 `[B, H, T, D]`.
    pub q: usize,
    /// c64 `[B, H, S, D]`.
    pub k: usize,
    /// c64 `[B, H, S, Dv]` (not `Lse`).
    pub v: Option<usize>,
    /// f32 `[B, H, T]` (not `Lse`).
    pub lse: Option<usize>,
    /// The forward output `o` and its gradient `d_o`, c64 `[B, H, T, Dv]` (`Grad` only).
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
    let q = cx.input(0)?;
    let k = cx.input(1)?;
    let [b, h, t, d] = cx.dims4(q)?;
    let s = cx.dims4(k)?[2];
    let at = |i: usize| -> CompileResult<usize> { cx.offset(cx.input(i)?) };
    let (v, dv) = if fixed > 2 { (Some(at(2)?), cx.dims4(cx.input(2)?)?[3]) } else { (None, 0) };
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
        q: cx.offset(q)?,
        k: cx.offset(k)?,
        v,
        lse,
        o,
        d_o,
        mask,
        step,
        out: cx.offset(cx.v)?,
    })
}
