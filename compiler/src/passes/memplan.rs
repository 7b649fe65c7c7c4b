//! Memory plan: one arena, a static offset for every materialised buffer.

use super::fusion::{Fusion, GroupId, GroupKind};
use crate::ir::*;
use serde::Serialize;

/// Alignment of every buffer in the arena (bytes).
pub const ALIGN: usize = 256;

/// Where a buffer lives in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Slot {
    /// Byte offset from the arena's start (a multiple of [`ALIGN`]).
    pub offset: usize,
    /// Size in bytes (unpadded).
    pub bytes: usize,
}

/// The static memory plan of one program at one batch size.
#[derive(Clone, Debug, Serialize)]
pub struct ArenaPlan {
    /// The batch size the plan is for.
    pub batch: usize,
    /// Total arena size in bytes.
    pub arena_bytes: usize,
    /// Max over the schedule of the bytes live at once: no placement can beat it.
    pub lower_bound_bytes: usize,
    /// Bytes of parameters.
    pub param_bytes: usize,
    /// Bytes of parameters and state (live for the whole step and across steps).
    pub persistent_bytes: usize,
    /// The slot of each value by `Value::index()`; `None` when never materialised.
    pub slots: Vec<Option<Slot>>,
    /// Position in the schedule (index into the group order) where live bytes peak.
    pub peak_step: usize,
    /// Values alive at the peak.
    pub live_at_peak: Vec<Value>,
    /// Name of the placement heuristic that won.
    pub heuristic: String,
}

impl ArenaPlan {
    /// `(arena - lower bound) / arena`, in percent.
    pub fn fragmentation_pct(&self) -> f64 {
        if self.arena_bytes == 0 {
            return 0.0;
        }
        100.0 * (self.arena_bytes - self.lower_bound_bytes.min(self.arena_bytes)) as f64
            / self.arena_bytes as f64
    }
    /// The slot of `v`, if materialised.
    pub fn slot(&self, v: Value) -> Option<Slot> {
        self.slots[v.index()]
    }
}

/// Rounds up to [`ALIGN`].
pub fn align(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// The buffer a value's memory belongs to: views resolve to their source, assigns to their target.
pub fn storage_root(g: &Graph, mut v: Value) -> Value {
    loop {
        match g.node(v).op {
            Op::Reshape | Op::Assign => v = g.node(v).inputs[0],
            _ => return v,
        }
    }
}

/// A plan with no reuse: every materialised buffer gets its own range. The baseline.
pub fn bump(g: &Graph, fusion: &Fusion, order: &[GroupId], batch: usize) -> ArenaPlan {
    let materialized = fusion.materialized(g);
    let mut slots: Vec<Option<Slot>> = vec![None; g.nodes.len()];
    let mut offset = 0;
    let mut param_bytes = 0;
    let mut persistent_bytes = 0;
    for (h, n) in g.nodes.iter() {
        if !materialized[h.index()] || storage_root(g, h) != h {
            continue;
        }
        let bytes = n.ty.bytes(batch);
        slots[h.index()] = Some(Slot { offset, bytes });
        offset += align(bytes);
        if matches!(n.op, Op::Param { .. }) {
            param_bytes += bytes;
        }
        if n.op.is_persistent() {
            persistent_bytes += bytes;
        }
    }
    for h in g.nodes.handles() {
        if slots[h.index()].is_none() && materialized[h.index()] {
            slots[h.index()] = slots[storage_root(g, h).index()];
        }
    }
    let _ = order.iter().map(|&i| fusion.groups[i].kind == GroupKind::View);
    ArenaPlan {
        batch,
        arena_bytes: offset,
        lower_bound_bytes: offset,
        param_bytes,
        persistent_bytes,
        slots,
        peak_step: order.len().saturating_sub(1),
        live_at_peak: Vec::new(),
        heuristic: "bump (no reuse)".into(),
    }
}
