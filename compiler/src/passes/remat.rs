//! Rematerialisation under a memory budget (checkpointing).
//!
//! Cheap values (normalise, activation, pooling prologues, casts) are already recomputed by
//! the fusion pass, which inlines them into every kernel that reads them instead of storing
//! them. With a memory budget this pass goes further: while the plan does not fit, it takes
//! the largest stored contraction output that the backward pass reads, clones the
//! contraction right before its first backward reader, and keeps the clone when the arena
//! shrinks. The schedule runs a clone only when a reader needs it, so the original dies
//! after the forward pass. Each trial is measured with a fresh partition, schedule and memory
//! plan; after the pass, the pipeline runs those as steps of their own (`remat.fusion`,
//! `remat.schedule`, `remat.siblings`) on the graph with the checkpoints kept.

use super::fusion::{self, Fusion, GroupId};
use super::pipeline::Options;
use super::rewrite::{eliminate_dead, Rewriter, ValueMap};
use super::{memplan, schedule, siblings, PipelineFacts};
use crate::ir::*;

/// Most checkpoints tried before giving up on a budget.
const MAX_TRIES: usize = 32;

/// Checkpoints contractions until the plan fits `opts.memory_budget` (when there is one and
/// the graph trains), measuring each trial with the same partition, schedule and memory plan
/// the pipeline runs afterwards; records each recomputation in `facts.recomputed`. Returns
/// the recomputed values (in the rewritten graph) when it placed a checkpoint, so the
/// pipeline re-partitions and re-schedules the new graph with them deferred; `None` when the
/// graph is unchanged. A plan that still does not fit is left for the caller to report.
pub fn run(
    g: &mut Graph,
    fused: &Fusion,
    order: &[GroupId],
    opts: &Options,
    facts: &mut PipelineFacts,
) -> Result<Option<Vec<Value>>, String> {
    let Some(budget) = opts.memory_budget else { return Ok(None) };
    if g.mode != Mode::Train {
        return Ok(None);
    }
    // Recomputations placed before (autodiff's, per chunk of a recurrence) stay deferred.
    let mut deferred: Vec<Value> = facts.recomputed.iter().map(|&(v, _)| v).collect();
    let mut placed = false;
    let mut fused = fused.clone();
    let mut arena = memplan::plan_keeping(g, &fused, order, opts.batch, &facts.kept()).arena_bytes;
    let mut tried: Vec<String> = Vec::new();
    for _ in 0..MAX_TRIES {
        if arena as u64 <= budget {
            break;
        }
        let Some(v) = candidate(g, &fused, opts.batch, &tried) else { break };
        tried.push(g.node(v).origin.label.clone() + &v.to_string());
        let Some((ng, map, clone)) = checkpoint(g, v, &facts.kept())? else { continue };
        let mut trial = facts.clone();
        trial.remap(&map)?;
        // An earlier clone that this rewrite removed no longer exists, so nothing waits for it.
        let mut defer_now: Vec<Value> = deferred.iter().filter_map(|&d| map.lookup(d)).collect();
        defer_now.push(clone);
        let (nf, no) = replan(&ng, opts, &trial.kept(), &defer_now)?;
        let na = memplan::plan_keeping(&ng, &nf, &no, opts.batch, &trial.kept()).arena_bytes;
        if na < arena {
            let what = format!(
                "{} {} recomputed in the backward pass (checkpoint for the memory budget)",
                ng.node(clone).op.mnemonic(),
                g.node(v).origin.label
            );
            *facts = trial;
            facts.recomputed.push((clone, what));
            deferred = defer_now;
            *g = ng;
            fused = nf;
            arena = na;
            placed = true;
        }
    }
    Ok(placed.then_some(deferred))
}

/// The partition and schedule of a checkpointed graph: the pipeline's `remat.fusion`,
/// `remat.schedule` and `remat.siblings` steps, which run exactly this after [`run`].
fn replan(
    g: &Graph,
    opts: &Options,
    keep: &[Value],
    deferred: &[Value],
) -> Result<(Fusion, Vec<GroupId>), String> {
    let f = fusion::partition(g, opts.fuse, keep);
    let groups = schedule::groups_writing(&f, deferred);
    let order = schedule::order_with(g, &f, opts.batch, &groups)?;
    let order = siblings::run(g, &f, opts.batch, &groups, order)?;
    Ok((f, order))
}

/// The largest stored forward contraction output read by the backward pass, not tried yet.
fn candidate(g: &Graph, fused: &Fusion, batch: usize, tried: &[String]) -> Option<Value> {
    let users = g.users();
    let mat = fused.materialized(g);
    g.nodes
        .iter()
        .filter(|(h, n)| {
            n.op.is_contraction()
                && n.origin.role == Role::Forward
                && mat[h.index()]
                && !backward_readers(g, &users, *h).1.is_empty()
                && !tried.contains(&(n.origin.label.clone() + &h.to_string()))
        })
        .max_by_key(|(h, _)| (g.bytes(*h, batch), std::cmp::Reverse(*h)))
        .map(|(h, _)| h)
}

fn is_backward(n: &Node) -> bool {
    matches!(n.origin.role, Role::Backward | Role::Update)
}

/// The forward elementwise and view nodes computed from `v` (recomputable from it), and the
/// backward nodes that read `v` or one of them.
fn backward_readers(g: &Graph, users: &[Vec<Value>], v: Value) -> (Vec<bool>, Vec<Value>) {
    let mut chain = vec![false; g.nodes.len()];
    let mut readers = Vec::new();
    let mut stack = vec![v];
    let mut seen = vec![false; g.nodes.len()];
    while let Some(x) = stack.pop() {
        for &u in &users[x.index()] {
            let un = g.node(u);
            if is_backward(un) {
                if !readers.contains(&u) {
                    readers.push(u);
                }
            } else if (un.op.is_elementwise() || matches!(un.op, Op::Reshape)) && !seen[u.index()] {
                seen[u.index()] = true;
                chain[u.index()] = true;
                stack.push(u);
            }
        }
    }
    readers.sort();
    (chain, readers)
}

struct Checkpoint<'a, 'g> {
    rw: &'a mut Rewriter<'g>,
    v: Value,
    chain: Vec<bool>,
    clones: Vec<Option<Value>>,
}

impl Checkpoint<'_, '_> {
    /// The recomputed copy of `x` (`v` or a node of its chain), emitted on first use.
    fn ensure(&mut self, x: Value) -> Result<Value, String> {
        if let Some(c) = self.clones[x.index()] {
            return Ok(c);
        }
        let g = self.rw.old;
        let n = g.node(x);
        let inputs = self.operands(n)?;
        let origin = Origin { role: Role::Backward, label: format!("recompute({})", n.origin.label) };
        let c = self.rw.push(Node { op: n.op.clone(), inputs, ty: n.ty.clone(), origin }, g.span(x));
        self.clones[x.index()] = Some(c);
        Ok(c)
    }

    /// The operands of `n` in the new graph: recomputed copies of `v` and its chain, the
    /// mapped values of everything else.
    fn operands(&mut self, n: &Node) -> Result<Vec<Value>, String> {
        n.inputs
            .iter()
            .map(|&i| if i == self.v || self.chain[i.index()] { self.ensure(i) } else { self.rw.mapped(i) })
            .collect()
    }
}

/// A checkpointed graph, the old→new value map, and the recomputed value.
pub type Checkpointed = (Graph, ValueMap, Value);

/// A copy of `g` where the backward pass recomputes `v` (and the forward elementwise values
/// it reads from `v`) right before it needs them, instead of reading the stored ones.
/// Returns the graph, the old→new value map and the recomputed `v`; the values in `keep`
/// (parameter gradients) survive the clean-up.
pub fn checkpoint(g: &Graph, v: Value, keep: &[Value]) -> Result<Option<Checkpointed>, String> {
    let users = g.users();
    let (chain, readers) = backward_readers(g, &users, v);
    if readers.is_empty() {
        return Ok(None);
    }
    let mut rw = Rewriter::new(g);
    let mut cp = Checkpoint { rw: &mut rw, v, chain, clones: vec![None; g.nodes.len()] };
    for h in g.nodes.handles() {
        if readers.binary_search(&h).is_ok() {
            let n = g.node(h);
            let inputs = cp.operands(n)?;
            let node = Node { op: n.op.clone(), inputs, ty: n.ty.clone(), origin: n.origin.clone() };
            let nv = cp.rw.push(node, g.span(h));
            cp.rw.map.set(h, nv);
        } else {
            cp.rw.copy(h)?;
        }
    }
    let clone =
        cp.clones[v.index()].ok_or_else(|| format!("checkpoint: no backward reader recomputed {v}"))?;
    let (rewritten, first) = rw.finish()?;
    // Forward values that only the backward pass read are now dead.
    let keep: Vec<Value> = keep.iter().map(|&k| first.get(k)).collect::<Result<_, _>>()?;
    let (graph, dce) = eliminate_dead(&rewritten, &keep)?;
    let clone = dce.get(clone).map_err(|e| format!("checkpoint: the recomputed {v}: {e}"))?;
    Ok(Some((graph, first.then(&dce), clone)))
}
