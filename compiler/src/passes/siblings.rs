//! Sibling reductions side by side: the pipeline step after scheduling moves sums over the
//! same domain and axes next to each other, so a back end can compute them in one pass over
//! the data.
//!
//! Batch normalisation is the case that matters: its statistics (the mean of the real and of
//! the imaginary part, then their variances) and, in the backward pass, the sums of the
//! upstream gradient and of its product with the normalised input are separate `Reduce`
//! groups over the same activation. The greedy schedule interleaves them with the small
//! per-channel kernels between them, and each then reads the whole activation again. Here a
//! later sum is moved right after an earlier one when it does not depend on it; the small
//! groups it waits for (per-channel arithmetic, views) move ahead of the earlier sum. Only
//! groups with small outputs move, so the peak of the schedule changes by a few bytes at
//! most, and never a recomputation (those run as late as possible on purpose).
//!
//! The order stays a valid schedule: every moved group still runs after everything it
//! depends on ([`super::schedule::validate`] checks this in the tests).

use super::fusion::{Fusion, GroupId, GroupKind};
use super::schedule;
use crate::ir::*;

/// How far ahead (in groups) a sibling is looked for.
const WINDOW: usize = 48;
/// Largest output, in bytes at the planned batch, of a group that may move earlier.
const SMALL: usize = 1 << 20;

/// What makes two reductions siblings: the same domain and the same reduced axes.
fn sum_key<'a>(g: &'a Graph, fusion: &'a Fusion, gi: GroupId) -> Option<(&'a Shape, &'a [usize])> {
    let k = &fusion.groups[gi];
    let (_, red, _) = k.reduce_parts(g)?;
    match &g.node(red).op {
        Op::Reduce { op: ReduceOp::Sum, axes } => Some((&k.domain, axes.as_slice())),
        _ => None,
    }
}

fn small(g: &Graph, fusion: &Fusion, gi: GroupId, batch: usize) -> bool {
    let k = &fusion.groups[gi];
    k.kind == GroupKind::View || k.outputs.iter().all(|&o| g.bytes(o, batch) <= SMALL)
}

/// The siblings step: [`gather`] over the schedule `order` of `fusion`, where the groups in
/// `deferred` (recomputations) stay where the schedule put them. The result is checked to be
/// a valid schedule.
pub fn run(
    g: &Graph,
    fusion: &Fusion,
    batch: usize,
    deferred: &[GroupId],
    order: Vec<GroupId>,
) -> Result<Vec<GroupId>, String> {
    let deps = schedule::dependencies(g, fusion);
    let flags = schedule::deferred_flags(fusion.groups.len(), deferred);
    let order = gather(g, fusion, batch, &deps, &flags, order);
    if cfg!(debug_assertions) {
        schedule::validate(g, fusion, &order).map_err(|e| format!("siblings broke the schedule: {e}"))?;
    }
    Ok(order)
}

/// Reorders `order` so that sibling sums (same domain, same axes) follow each other where the
/// dependencies allow (see the module doc). `deps[gi]` are the groups `gi` waits for;
/// `deferred[gi]` marks recomputations, which never move.
pub fn gather(
    g: &Graph,
    fusion: &Fusion,
    batch: usize,
    deps: &[Vec<GroupId>],
    deferred: &[bool],
    mut order: Vec<GroupId>,
) -> Vec<GroupId> {
    let n = fusion.groups.len();
    // Position in `order` of the groups from `p` to the candidate; valid where `stamp` is
    // the current `epoch` (everything else runs before `p`).
    let mut pos = vec![0usize; n];
    let mut stamp = vec![0usize; n];
    let mut epoch = 0;
    let mut p = 0;
    while p < order.len() {
        let Some(key) = sum_key(g, fusion, order[p]).filter(|_| small(g, fusion, order[p], batch)) else {
            p += 1;
            continue;
        };
        // The run of siblings starting at `p` occupies positions p .. p + run.
        let mut run = 1;
        let mut q = p + 1;
        while q < order.len() && q < p + run + WINDOW {
            let c = order[q];
            let sibling = !deferred[c] && sum_key(g, fusion, c) == Some(key) && small(g, fusion, c, batch);
            if !sibling {
                q += 1;
                continue;
            }
            epoch += 1;
            for (i, &gi) in order.iter().enumerate().take(q + 1).skip(p) {
                pos[gi] = i;
                stamp[gi] = epoch;
            }
            // The groups between the run and `c` that `c` needs, transitively.
            let lo = p + run;
            let mut needed = vec![false; q - lo];
            let mut ok = true;
            let mut stack = vec![c];
            while let Some(x) = stack.pop() {
                for &d in deps[x].iter().filter(|&&d| stamp[d] == epoch) {
                    let dp = pos[d];
                    if (p..lo).contains(&dp) {
                        ok = false; // depends on a member of the run
                    } else if (lo..q).contains(&dp) && !needed[dp - lo] {
                        needed[dp - lo] = true;
                        stack.push(d);
                    }
                }
            }
            let movable = |i: usize| {
                let d = order[lo + i];
                !deferred[d] && small(g, fusion, d, batch)
            };
            if !ok || (0..needed.len()).any(|i| needed[i] && !movable(i)) {
                q += 1;
                continue;
            }
            // New order: what `c` needs, the run, `c`, then the rest in their old order.
            let moved: Vec<GroupId> =
                (0..needed.len()).filter(|&i| needed[i]).map(|i| order[lo + i]).collect();
            let rest: Vec<GroupId> =
                (0..needed.len()).filter(|&i| !needed[i]).map(|i| order[lo + i]).collect();
            let members: Vec<GroupId> = order[p..lo].to_vec();
            let mut next = Vec::with_capacity(order.len());
            next.extend_from_slice(&order[..p]);
            next.extend_from_slice(&moved);
            next.extend_from_slice(&members);
            next.push(c);
            next.extend_from_slice(&rest);
            next.extend_from_slice(&order[q + 1..]);
            order = next;
            p += moved.len();
            run += 1;
            q = p + run;
        }
        p += run;
    }
    order
}
