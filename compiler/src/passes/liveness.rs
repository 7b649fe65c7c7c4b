//! Liveness over a schedule: which buffers exist, and from which step to which step.
//!
//! A buffer is the storage of a materialised value: views share their source's buffer and
//! `Assign`s their target's. Parameters and state live for the whole step (and across
//! steps); inputs live from the step's start; outputs and the loss live to its end. An
//! elementwise kernel may write an output into the buffer of an input of identical size
//! whose last use is that kernel (in place): the two values then share one buffer.

use super::fusion::{Fusion, GroupId, GroupKind};
use super::memplan::{align, storage_root};
use crate::ir::*;

/// One buffer's lifetime: live from the start of step `first` to the end of step `last`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LiveInterval {
    /// The values stored in the buffer over its life (more than one when written in place),
    /// in the order they are written.
    pub values: Vec<Value>,
    /// The step at which each of `values` is written (same order; `first` for the first).
    pub starts: Vec<usize>,
    /// First schedule step at which the buffer holds data.
    pub first: usize,
    /// Last schedule step that reads it.
    pub last: usize,
    /// Size in bytes, rounded up to [`super::memplan::ALIGN`].
    pub bytes: usize,
    /// Parameters and state: live across steps, placed at fixed offsets below the rest.
    pub persistent: bool,
}

impl LiveInterval {
    /// Whether two buffers are alive at a common step.
    pub fn overlaps(&self, other: &LiveInterval) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// The buffers of a scheduled program, and for each value (by index) its buffer, if any.
#[derive(Clone, Debug)]
pub struct Liveness {
    /// Every buffer.
    pub intervals: Vec<LiveInterval>,
    /// The buffer of each materialised value, views and assigns included.
    pub buffer_of: Vec<Option<usize>>,
    /// Each stored value's own live range `(first, last)` inside its buffer.
    pub value_range: Vec<Option<(usize, usize)>>,
    /// Number of schedule steps.
    pub steps: usize,
}

impl Liveness {
    /// Bytes live at each step.
    pub fn live_bytes(&self) -> Vec<usize> {
        let mut live = vec![0usize; self.steps.max(1)];
        for iv in &self.intervals {
            for l in &mut live[iv.first..=iv.last] {
                *l += iv.bytes;
            }
        }
        live
    }
}

/// Computes the buffers and their lifetimes for `order` at `batch`, with in-place reuse.
pub fn analyze(g: &Graph, fusion: &Fusion, order: &[GroupId], batch: usize) -> Liveness {
    analyze_keeping(g, fusion, order, batch, &[])
}

/// [`analyze`], with the values in `keep` (parameter gradients) alive to the end of the step,
/// so the runtime can read them after it.
pub fn analyze_keeping(
    g: &Graph,
    fusion: &Fusion,
    order: &[GroupId],
    batch: usize,
    keep: &[Value],
) -> Liveness {
    let steps = order.len();
    let end = steps.saturating_sub(1);
    let n = g.nodes.len();
    let materialized = fusion.materialized(g);
    let mut range: Vec<Option<(usize, usize)>> = vec![None; n];
    let mut pinned = vec![false; n];
    for &k in keep {
        pinned[storage_root(g, k).index()] = true;
    }
    for o in &g.outputs {
        pinned[storage_root(g, o.value).index()] = true;
    }
    if let Some(l) = g.loss {
        pinned[storage_root(g, l).index()] = true;
    }
    for (h, node) in g.nodes.iter() {
        if !materialized[h.index()] || storage_root(g, h) != h {
            continue;
        }
        if node.op.is_persistent() {
            range[h.index()] = Some((0, end));
        } else if matches!(node.op, Op::Input { .. }) {
            range[h.index()] = Some((0, 0));
        }
    }
    for (s, &gi) in order.iter().enumerate() {
        for &o in &fusion.groups[gi].outputs {
            let r = storage_root(g, o);
            if r == o {
                range[r.index()] = Some((s, s));
            }
        }
    }
    for (s, &gi) in order.iter().enumerate() {
        for &i in &fusion.groups[gi].inputs {
            let r = storage_root(g, i).index();
            if let Some((_, last)) = range[r].as_mut() {
                *last = (*last).max(s);
            }
        }
    }
    for (i, p) in pinned.iter().enumerate() {
        if *p {
            if let Some((_, last)) = range[i].as_mut() {
                *last = end;
            }
        }
    }

    // Buffers: one per root, except in-place outputs joining an input's buffer.
    let mut buffer_of: Vec<Option<usize>> = vec![None; n];
    let mut intervals: Vec<LiveInterval> = Vec::new();
    let bytes_of = |v: Value| align(g.bytes(v, batch));
    let new_buffer = |v: Value, intervals: &mut Vec<LiveInterval>, buffer_of: &mut Vec<Option<usize>>| {
        let (first, last) = range[v.index()].expect("materialised value has a range");
        buffer_of[v.index()] = Some(intervals.len());
        intervals.push(LiveInterval {
            values: vec![v],
            starts: vec![first],
            first,
            last,
            bytes: bytes_of(v),
            persistent: g.node(v).op.is_persistent(),
        });
    };
    for (h, node) in g.nodes.iter() {
        if range[h.index()].is_some() && node.op.is_leaf() && !matches!(node.op, Op::Scalar { .. }) {
            new_buffer(h, &mut intervals, &mut buffer_of);
        }
    }
    for (s, &gi) in order.iter().enumerate() {
        let k = &fusion.groups[gi];
        let mut claimed: Vec<usize> = Vec::new();
        for &o in &k.outputs {
            if storage_root(g, o) != o || range[o.index()].is_none() {
                continue;
            }
            // Only a single-output kernel: its one store comes after every load of the element.
            let donor =
                if k.kind == GroupKind::Elementwise && k.outputs.len() == 1 && g.ty(o).shape == k.domain {
                    in_place_donor(g, k, o, s, &range, &pinned, &buffer_of, &claimed, &bytes_of)
                } else {
                    None
                };
            match donor {
                Some(b) => {
                    claimed.push(b);
                    let iv = &mut intervals[b];
                    iv.values.push(o);
                    iv.starts.push(s);
                    iv.last = iv.last.max(range[o.index()].expect("range").1);
                    buffer_of[o.index()] = Some(b);
                }
                None => new_buffer(o, &mut intervals, &mut buffer_of),
            }
        }
    }
    for h in g.nodes.handles() {
        if buffer_of[h.index()].is_none() && materialized[h.index()] {
            buffer_of[h.index()] = buffer_of[storage_root(g, h).index()];
        }
    }
    Liveness { intervals, buffer_of, value_range: range, steps }
}

/// The buffer an elementwise output may take over: an input read at the same index, of the
/// same size, not persistent, not an input or output of the step, last read by this group.
#[allow(clippy::too_many_arguments)]
fn in_place_donor(
    g: &Graph,
    k: &super::fusion::KernelGroup,
    o: Value,
    step: usize,
    range: &[Option<(usize, usize)>],
    pinned: &[bool],
    buffer_of: &[Option<usize>],
    claimed: &[usize],
    bytes_of: &dyn Fn(Value) -> usize,
) -> Option<usize> {
    for &i in &k.inputs {
        let r = storage_root(g, i);
        let rn = g.node(r);
        if rn.op.is_leaf() || pinned[r.index()] || bytes_of(r) != bytes_of(o) {
            continue;
        }
        if range[r.index()].map(|(_, l)| l) != Some(step) {
            continue;
        }
        // Every read of that buffer in this kernel must be at the output's own index.
        let same_index = k.inputs.iter().filter(|&&j| storage_root(g, j) == r).all(|&j| {
            g.ty(j).shape == k.domain
                && g.storage(j).elem_bytes(g.ty(j).dtype) == g.storage(o).elem_bytes(g.ty(o).dtype)
        });
        let Some(b) = buffer_of[r.index()] else { continue };
        if same_index && !claimed.contains(&b) {
            return Some(b);
        }
    }
    None
}
