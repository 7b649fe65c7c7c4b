//! Recurrence calls of the CPU launch list: the extents and arena offsets of one
//! `Recurrence` or `RecurrenceGrad` node, executed by `runtime/src/cpu/recurrence.rs` as the
//! loop over time steps, samples split across threads (each sample's steps are sequential).

use super::NodeCtx;
use crate::error::{CompileError, CompileResult};
use crate::ir::{Op, RnnSpec};

/// One recurrence launch: every operand contiguous row-major c64, at a byte offset of the arena.
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrenceCall {
    /// Cell, hidden size, direction.
    pub spec: RnnSpec,
    /// `RecurrenceGrad` (back-propagation through time) rather than `Recurrence`.
    pub grad: bool,
    /// Batch.
    pub b: usize,
    /// Steps.
    pub t: usize,
    /// `xp`, `[B, T, G·H]`.
    pub xp: usize,
    /// `W_hh`, `[G·H, H]`.
    pub w: usize,
    /// `b_hh`, `[G·H]`.
    pub bias: usize,
    /// The stored states `[B, T, S·H]` (`grad` only).
    pub hs: Option<usize>,
    /// Their gradient `[B, T, S·H]` (`grad` only).
    pub dhs: Option<usize>,
    /// The initial state `[B, S·H]` (`spec.init` only; zeros without it).
    pub h0: Option<usize>,
    /// The output.
    pub out: usize,
}

impl RecurrenceCall {
    /// f32 words of per-thread workspace: `gh` and the activated gates (`G·H` complex each)
    /// and the state gradient carried to the previous step (`S·H` complex).
    pub fn workspace_words(&self) -> usize {
        let h = self.spec.hidden;
        2 * (2 * self.spec.cell.gates() * h + self.spec.cell.states() * h)
    }
}

/// The recurrence call computing `cx.v`.
pub(crate) fn recurrence(cx: &NodeCtx) -> CompileResult<RecurrenceCall> {
    let (spec, grad) = match &cx.node().op {
        Op::Recurrence { spec } => (*spec, false),
        Op::RecurrenceGrad { spec } => (*spec, true),
        other => return Err(CompileError::internal(format!("{} is not a recurrence", other.mnemonic()))),
    };
    let xp = cx.input(0)?;
    let shape = cx.shape(xp);
    let at = |i: usize| -> CompileResult<usize> { cx.offset(cx.input(i)?) };
    Ok(RecurrenceCall {
        spec,
        grad,
        b: shape[0],
        t: shape[1],
        xp: cx.offset(xp)?,
        w: at(1)?,
        bias: at(2)?,
        hs: if grad { Some(at(3)?) } else { None },
        dhs: if grad { Some(at(4)?) } else { None },
        h0: if spec.init { Some(at(if grad { 5 } else { 3 })?) } else { None },
        out: cx.offset(cx.v)?,
    })
}
