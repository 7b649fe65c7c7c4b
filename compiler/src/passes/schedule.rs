//! Scheduling: a topological order of the kernel groups chosen to keep few bytes alive.
//!
//! Greedy list scheduling: among the groups whose dependencies have run, take the one that
//! frees the most bytes net of what it allocates (so an optimizer update runs as soon as its
//! gradient is ready, and the gradient dies), ties broken by the fusion order. Groups marked
//! as recomputations (remat's checkpoints, the chunks of a recurrence's backward) run only
//! when nothing else is ready and a reader at the end of their chain then can run. Besides data dependencies, every
//! group that reads a parameter or state buffer runs before the `Assign` that overwrites it.
//! The pipeline's next step, `siblings` ([`super::siblings::run`]), moves sums over the same
//! data next to each other, so a back end can compute them in one pass.

use super::fusion::{Fusion, GroupId, GroupKind};
use super::memplan::{align, storage_root};
use crate::ir::*;

/// The groups each group must wait for: producers of its inputs, and, for a group holding an
/// `Assign`, every other group that reads the assigned buffer.
pub fn dependencies(g: &Graph, fusion: &Fusion) -> Vec<Vec<GroupId>> {
    let mut producer: Vec<Option<GroupId>> = vec![None; g.nodes.len()];
    for (gi, k) in fusion.groups.iter().enumerate() {
        for &o in &k.outputs {
            producer[o.index()] = Some(gi);
        }
    }
    let mut readers: Vec<Vec<GroupId>> = vec![Vec::new(); g.nodes.len()];
    for (gi, k) in fusion.groups.iter().enumerate() {
        for &i in &k.inputs {
            let r = storage_root(g, i).index();
            if !readers[r].contains(&gi) {
                readers[r].push(gi);
            }
        }
    }
    let mut deps: Vec<Vec<GroupId>> = vec![Vec::new(); fusion.groups.len()];
    for (gi, k) in fusion.groups.iter().enumerate() {
        let mut d = Vec::new();
        for &i in &k.inputs {
            if let Some(p) = producer[i.index()] {
                d.push(p);
            }
        }
        for &o in &k.outputs {
            if matches!(g.node(o).op, Op::Assign) {
                let target = storage_root(g, o).index();
                d.extend(readers[target].iter().copied());
            }
        }
        d.sort_unstable();
        d.dedup();
        d.retain(|&p| p != gi);
        deps[gi] = d;
    }
    deps
}

/// Checks that `order` runs every group once, after its dependencies.
pub fn validate(g: &Graph, fusion: &Fusion, order: &[GroupId]) -> Result<(), String> {
    let deps = dependencies(g, fusion);
    let mut pos = vec![usize::MAX; fusion.groups.len()];
    for (s, &gi) in order.iter().enumerate() {
        if gi >= pos.len() || pos[gi] != usize::MAX {
            return Err(format!("group {gi} is scheduled twice or does not exist"));
        }
        pos[gi] = s;
    }
    for (gi, d) in deps.iter().enumerate() {
        if pos[gi] == usize::MAX {
            return Err(format!("group {gi} is never scheduled"));
        }
        if let Some(&p) = d.iter().find(|&&p| pos[p] > pos[gi]) {
            return Err(format!("group {gi} runs before group {p} it depends on"));
        }
    }
    Ok(())
}

/// Orders the groups for a low peak at `batch` (see the module doc).
pub fn run(g: &Graph, fusion: &Fusion, batch: usize) -> Result<Vec<GroupId>, String> {
    order_with(g, fusion, batch, &[])
}

/// The groups that write one of `values` (the recomputations a schedule defers).
pub fn groups_writing(fusion: &Fusion, values: &[Value]) -> Vec<GroupId> {
    (0..fusion.groups.len())
        .filter(|&i| fusion.groups[i].outputs.iter().any(|o| values.contains(o)))
        .collect()
}

/// Like [`run`], with the groups in `deferred` (recomputations) run as late as possible.
pub fn order_with(
    g: &Graph,
    fusion: &Fusion,
    batch: usize,
    deferred: &[GroupId],
) -> Result<Vec<GroupId>, String> {
    let n = fusion.groups.len();
    let deps = dependencies(g, fusion);
    let mut succs: Vec<Vec<GroupId>> = vec![Vec::new(); n];
    for (gi, d) in deps.iter().enumerate() {
        for &p in d {
            succs[p].push(gi);
        }
    }
    let mut waiting: Vec<usize> = deps.iter().map(|d| d.len()).collect();
    let is_deferred = deferred_flags(n, deferred);

    // Remaining readers of each buffer (storage root), by group.
    let mut pinned = vec![false; g.nodes.len()];
    for o in &g.outputs {
        pinned[storage_root(g, o.value).index()] = true;
    }
    if let Some(l) = g.loss {
        pinned[storage_root(g, l).index()] = true;
    }
    for (h, node) in g.nodes.iter() {
        if node.op.is_persistent() {
            pinned[h.index()] = true;
        }
    }
    let mut remaining = vec![0usize; g.nodes.len()];
    let reads: Vec<Vec<usize>> = fusion
        .groups
        .iter()
        .map(|k| {
            let mut r: Vec<usize> = k.inputs.iter().map(|&i| storage_root(g, i).index()).collect();
            r.sort_unstable();
            r.dedup();
            r
        })
        .collect();
    for r in &reads {
        for &b in r {
            remaining[b] += 1;
        }
    }
    let bytes = |v: usize| align(g.bytes(Value::from_index(v), batch)) as i64;
    let allocates: Vec<i64> = fusion
        .groups
        .iter()
        .map(|k| {
            if k.kind == GroupKind::View {
                return 0;
            }
            k.outputs.iter().filter(|&&o| storage_root(g, o) == o).map(|o| bytes(o.index())).sum()
        })
        .collect();

    let mut ready: Vec<GroupId> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    let mut done = vec![false; n];
    while !ready.is_empty() {
        let wanted = |gi: GroupId, done: &[bool]| wanted(gi, done, &is_deferred, &succs, &deps, WANT_DEPTH);
        let score = |gi: GroupId| -> i64 {
            let freed: i64 =
                reads[gi].iter().filter(|&&b| remaining[b] == 1 && !pinned[b]).map(|&b| bytes(b)).sum();
            freed - allocates[gi]
        };
        // A recomputation runs only when nothing else is ready.
        let eager = ready.iter().any(|&gi| !is_deferred[gi]);
        let pick = ready
            .iter()
            .enumerate()
            .filter(|(_, &gi)| if eager { !is_deferred[gi] } else { wanted(gi, &done) })
            .max_by_key(|(_, &gi)| (score(gi), std::cmp::Reverse(gi)))
            .or_else(|| ready.iter().enumerate().min_by_key(|(_, &gi)| gi))
            .map(|(i, _)| i);
        let Some(pick) = pick else { break };
        let gi = ready.swap_remove(pick);
        done[gi] = true;
        order.push(gi);
        for &b in &reads[gi] {
            remaining[b] -= 1;
        }
        for &s in &succs[gi] {
            waiting[s] -= 1;
            if waiting[s] == 0 {
                ready.push(s);
            }
        }
    }
    if order.len() != n {
        return Err(format!(
            "internal error: the kernel groups have a dependency cycle ({} of {n} scheduled)",
            order.len()
        ));
    }
    Ok(order)
}

/// How far [`wanted`] follows a chain of deferred groups (beyond it, a group counts as wanted).
const WANT_DEPTH: usize = 8;

/// Whether group `gi` may run now: it is not deferred, or it is and one of its successors
/// could run right after it (its other producers done or deferred) and is itself wanted. So
/// a chain of recomputations (a chunk's input projection, then the chunk's states) starts
/// only when the reader at its end is otherwise ready.
fn wanted(
    gi: GroupId,
    done: &[bool],
    is_deferred: &[bool],
    succs: &[Vec<GroupId>],
    deps: &[Vec<GroupId>],
    depth: usize,
) -> bool {
    if !is_deferred[gi] || depth == 0 {
        return true;
    }
    succs[gi].iter().any(|&s| {
        !done[s]
            && deps[s].iter().all(|&p| p == gi || done[p] || is_deferred[p])
            && wanted(s, done, is_deferred, succs, deps, depth - 1)
    })
}

/// `flags[gi]`: whether group `gi` is one of `deferred`.
pub fn deferred_flags(groups: usize, deferred: &[GroupId]) -> Vec<bool> {
    let mut flags = vec![false; groups];
    for &d in deferred {
        if let Some(f) = flags.get_mut(d) {
            *f = true;
        }
    }
    flags
}
