//! Memory plan: one arena, a static offset for every materialised buffer.

use super::fusion::{Fusion, GroupId};
use super::liveness::{analyze_keeping, LiveInterval};
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
    /// Every buffer with its lifetime and offset (empty for the [`bump`] baseline).
    pub buffers: Vec<PlacedBuffer>,
    /// Arena size each placement heuristic reached, `(name, bytes)`.
    pub candidates: Vec<(String, usize)>,
    /// Number of schedule steps.
    pub steps: usize,
}

/// A buffer of the plan: its lifetime over the schedule and its place in the arena.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlacedBuffer {
    /// Lifetime and the values stored.
    pub interval: LiveInterval,
    /// Byte offset in the arena.
    pub offset: usize,
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
pub fn storage_root(g: &Graph, v: Value) -> Value {
    crate::ir::storage::buffer_root(g, v)
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
        let bytes = g.bytes(h, batch);
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
        buffers: Vec::new(),
        candidates: Vec::new(),
        steps: order.len(),
    }
}

/// A placement: the offset of each interval (same order) and the arena size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Offset of each interval.
    pub offsets: Vec<usize>,
    /// Arena bytes (end of the highest buffer).
    pub arena_bytes: usize,
}

/// Places `intervals` in the order given by `rank`, each at the gap among already placed,
/// time-overlapping buffers chosen by `best_fit` (smallest gap that fits) or first fit
/// (lowest gap that fits). Persistent buffers go first, stacked from offset 0.
fn place(
    intervals: &[LiveInterval],
    rank: &mut dyn FnMut(&LiveInterval) -> (usize, usize),
    best_fit: bool,
) -> Placement {
    let mut offsets = vec![0usize; intervals.len()];
    let mut base = 0;
    for (i, iv) in intervals.iter().enumerate() {
        if iv.persistent {
            offsets[i] = base;
            base += iv.bytes;
        }
    }
    let mut todo: Vec<usize> = (0..intervals.len()).filter(|&i| !intervals[i].persistent).collect();
    todo.sort_by_key(|&i| (rank(&intervals[i]), i));
    // Placed buffers as (offset, end, index), kept sorted by (offset, end): the gap search
    // walks them in address order without sorting per buffer (plans of deep models place
    // tens of thousands of buffers, many alive at once).
    let mut placed: Vec<(usize, usize, usize)> = Vec::new();
    let mut arena = base;
    for i in todo {
        let iv = &intervals[i];
        let mut best: Option<(usize, usize)> = None; // (gap size, offset)
        let mut cursor = base;
        for &(lo, hi, p) in &placed {
            if !intervals[p].overlaps(iv) {
                continue;
            }
            if lo > cursor {
                let gap = lo - cursor;
                if gap >= iv.bytes {
                    let better = match best {
                        None => true,
                        Some((g, _)) => best_fit && gap < g,
                    };
                    if better {
                        best = Some((gap, cursor));
                    }
                }
            }
            cursor = cursor.max(hi);
        }
        let offset = best.map_or(cursor, |(_, o)| o);
        offsets[i] = offset;
        arena = arena.max(offset + iv.bytes);
        let entry = (offset, offset + iv.bytes, i);
        let at = placed.partition_point(|&(lo, hi, _)| (lo, hi) <= (entry.0, entry.1));
        placed.insert(at, entry);
    }
    Placement { offsets, arena_bytes: arena }
}

/// TFLite's greedy-by-size: largest buffers first, each at the lowest gap that fits.
pub fn greedy_by_size(intervals: &[LiveInterval]) -> Placement {
    place(intervals, &mut |iv| (usize::MAX - iv.bytes, iv.first), false)
}

/// Best fit in schedule order: buffers by first step, each in the smallest gap that fits.
pub fn best_fit_in_order(intervals: &[LiveInterval]) -> Placement {
    place(intervals, &mut |iv| (iv.first, usize::MAX - iv.bytes), true)
}

/// Largest first, each in the smallest gap that fits.
pub fn best_fit_by_size(intervals: &[LiveInterval]) -> Placement {
    place(intervals, &mut |iv| (usize::MAX - iv.bytes, iv.first), true)
}

/// Max over steps of the bytes alive at once (no placement can use less).
pub fn lower_bound(intervals: &[LiveInterval], steps: usize) -> (usize, usize) {
    let mut live = vec![0usize; steps.max(1)];
    for iv in intervals {
        for l in &mut live[iv.first..=iv.last.min(steps.max(1) - 1)] {
            *l += iv.bytes;
        }
    }
    let (peak_step, &peak) =
        live.iter().enumerate().max_by_key(|&(i, &b)| (b, std::cmp::Reverse(i))).expect("one step");
    (peak, peak_step)
}

/// Checks a placement: buffers alive at a common step never share bytes.
pub fn validate(intervals: &[LiveInterval], p: &Placement) -> Result<(), String> {
    for (i, a) in intervals.iter().enumerate() {
        if p.offsets[i] + a.bytes > p.arena_bytes {
            return Err(format!("buffer {i} ends past the arena"));
        }
        for (j, b) in intervals.iter().enumerate().skip(i + 1) {
            let disjoint = p.offsets[i] + a.bytes <= p.offsets[j] || p.offsets[j] + b.bytes <= p.offsets[i];
            if a.overlaps(b) && !disjoint && a.bytes > 0 && b.bytes > 0 {
                return Err(format!("buffers {i} and {j} are alive together and overlap in memory"));
            }
        }
    }
    Ok(())
}

/// The memory plan of a scheduled program at `batch`: liveness with in-place reuse, then
/// the smallest of three placements (greedy by size, best fit in schedule order, best fit by
/// size).
pub fn plan(g: &Graph, fusion: &Fusion, order: &[GroupId], batch: usize) -> ArenaPlan {
    plan_keeping(g, fusion, order, batch, &[])
}

/// [`plan`], with the values in `keep` (parameter gradients) alive to the end of the step.
pub fn plan_keeping(
    g: &Graph,
    fusion: &Fusion,
    order: &[GroupId],
    batch: usize,
    keep: &[Value],
) -> ArenaPlan {
    let live = analyze_keeping(g, fusion, order, batch, keep);
    let intervals = &live.intervals;
    let candidates = [
        ("greedy by size (first fit)", greedy_by_size(intervals)),
        ("best fit in schedule order", best_fit_in_order(intervals)),
        ("best fit by size", best_fit_by_size(intervals)),
    ];
    let (name, best) = candidates.iter().min_by_key(|(_, p)| p.arena_bytes).expect("three candidates");
    let (lower_bound_bytes, peak_step) = lower_bound(intervals, live.steps);
    let mut slots: Vec<Option<Slot>> = vec![None; g.nodes.len()];
    for h in g.nodes.handles() {
        if let Some(b) = live.buffer_of[h.index()] {
            slots[h.index()] = Some(Slot { offset: best.offsets[b], bytes: g.bytes(h, batch) });
        }
    }
    let mut param_bytes = 0;
    let mut persistent_bytes = 0;
    for (_, n) in g.nodes.iter() {
        if matches!(n.op, Op::Param { .. }) {
            param_bytes += n.ty.bytes(batch);
        }
        if n.op.is_persistent() {
            persistent_bytes += n.ty.bytes(batch);
        }
    }
    let live_at_peak = intervals
        .iter()
        .filter(|iv| iv.first <= peak_step && peak_step <= iv.last)
        .filter_map(|iv| {
            iv.values
                .iter()
                .rev()
                .find(|v| live.value_range[v.index()].is_some_and(|(f, _)| f <= peak_step))
                .or(iv.values.first())
                .copied()
        })
        .collect();
    ArenaPlan {
        batch,
        arena_bytes: best.arena_bytes,
        lower_bound_bytes,
        param_bytes,
        persistent_bytes,
        slots,
        peak_step,
        live_at_peak,
        heuristic: name.to_string(),
        buffers: intervals
            .iter()
            .zip(&best.offsets)
            .map(|(iv, &offset)| PlacedBuffer { interval: iv.clone(), offset })
            .collect(),
        candidates: candidates.iter().map(|(n, p)| (n.to_string(), p.arena_bytes)).collect(),
        steps: live.steps,
    }
}
