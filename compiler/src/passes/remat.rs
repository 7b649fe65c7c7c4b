//! Rematerialisation: recomputing stored values in the backward pass, with or without a
//! memory budget.
//!
//! Cheap values (normalise, activation, pooling prologues, casts) are already recomputed by
//! the fusion pass, which inlines them into every *fused* kernel that reads them instead of
//! storing them. A contraction cannot inline them (it reads stored operands), so a
//! normalised activation feeding a convolution is stored in the forward pass and kept until
//! the convolution's weight gradient reads it, next to the pre-activation that the
//! normalisation's own gradient keeps anyway. Two searches go further:
//!
//! 1. Cheap recomputation (always, in training; `Options::cheap_remat`): among the values
//!    alive at the plan's peak, the largest output of an elementwise, reduction or
//!    concatenation kernel that the backward pass reads is cloned right before its first
//!    backward reader (together with the other values of its layer line, e.g. the same norm
//!    in every block, when that shrinks the arena more), so the forward copy dies as soon as
//!    the forward pass is done with it. The clone re-reads what the backward pass keeps
//!    anyway (the convolution output, the batch statistics): one extra pass over memory
//!    instead of a stored copy. PyTorch's `torch.compile` makes the same trade with its
//!    min-cut partitioner, which recomputes pointwise ops rather than saving them.
//! 2. Under a memory budget, while the plan does not fit: the largest stored contraction
//!    output that the backward pass reads is cloned right before its first backward reader
//!    (checkpointing), which costs the contraction again.
//!
//! Every trial is measured with a fresh partition, schedule and memory plan and kept only
//! when the arena shrinks. The schedule runs a clone only when a reader needs it. After the
//! pass, the pipeline runs the partition, schedule and sibling steps as steps of their own
//! (`remat.fusion`, `remat.schedule`, `remat.siblings`) on the graph with the clones kept.

use super::fusion::{self, Fusion, GroupId, GroupKind};
use super::pipeline::Options;
use super::rewrite::{eliminate_dead, Rewriter, ValueMap};
use super::{memplan, schedule, siblings, PipelineFacts};
use crate::ir::*;

/// Most checkpoints tried before giving up on a budget.
const MAX_TRIES: usize = 32;

/// Recomputes in the backward pass what is cheap to recompute and shrinks the arena, then,
/// under a memory budget (when there is one), checkpoints contractions until the plan fits.
/// Both measure each trial with the same partition, schedule and memory plan the pipeline
/// runs afterwards and keep it only when the arena shrinks; each recomputation is recorded
/// in `facts.recomputed`. Returns the recomputed values (in the rewritten graph) when a
/// trial was kept, so the pipeline re-partitions and re-schedules the new graph with them
/// deferred; `None` when the graph is unchanged. A plan that still does not fit its budget
/// is left for the caller to report.
pub fn run(
    g: &mut Graph,
    fused: &Fusion,
    order: &[GroupId],
    opts: &Options,
    facts: &mut PipelineFacts,
) -> Result<Option<Vec<Value>>, String> {
    if g.mode != Mode::Train || (opts.memory_budget.is_none() && !opts.cheap_remat) {
        return Ok(None);
    }
    let mut t = Trials {
        // Recomputations placed before (autodiff's, per chunk of a recurrence) stay deferred.
        deferred: facts.recomputed.iter().map(|&(v, _)| v).collect(),
        placed: false,
        fused: fused.clone(),
        plan: memplan::plan_keeping(g, fused, order, opts.batch, &facts.kept()),
        tried: Vec::new(),
    };
    if opts.cheap_remat {
        // Values alive at the peak, largest first: only they can lower it. A kept trial moves
        // the peak, so the candidates are taken afresh from each new plan. The candidates of
        // one layer line (a repeated block's norm in every layer) are tried together first,
        // then the largest alone, so a deep network needs a few trials, not one per layer.
        let mut misses = 0;
        while misses < CHEAP_MISSES {
            let group = cheap_candidates(g, &t.fused, &t.plan, opts.batch, &t.tried);
            let Some(&first) = group.first() else { break };
            const WHY: &str = "recomputed in the backward pass (cheaper than storing it)";
            // The whole line and its largest value alone: the smaller arena wins (recomputing
            // every copy at once is not always better: it moves the peak differently).
            let all = if group.len() > 1 { t.trial(g, &group, opts, facts, WHY)? } else { None };
            let one = t.trial(g, &[first], opts, facts, WHY)?;
            let best = match (all, one) {
                (Some(a), Some(o)) => Some(if o.plan.arena_bytes < a.plan.arena_bytes { o } else { a }),
                (a, o) => a.or(o),
            };
            misses = match best {
                Some(b) => {
                    t.commit(b, g, facts);
                    0
                }
                None => misses + 1,
            };
        }
    }
    if let Some(budget) = opts.memory_budget {
        for _ in 0..MAX_TRIES {
            if t.plan.arena_bytes as u64 <= budget {
                break;
            }
            let Some(v) = candidate(g, &t.fused, opts.batch, &t.tried) else { break };
            const WHY: &str = "recomputed in the backward pass (checkpoint for the memory budget)";
            if let Some(b) = t.trial(g, &[v], opts, facts, WHY)? {
                t.commit(b, g, facts);
            }
        }
    }
    Ok(t.placed.then_some(t.deferred))
}

/// Consecutive cheap trials that did not shrink the arena before the search stops.
const CHEAP_MISSES: usize = 4;

/// The state of the search: the current partition and plan, what was tried and kept.
struct Trials {
    deferred: Vec<Value>,
    placed: bool,
    fused: Fusion,
    plan: memplan::ArenaPlan,
    tried: Vec<String>,
}

/// A checkpointed graph measured: what [`Trials::commit`] makes current.
struct Trial {
    graph: Graph,
    facts: PipelineFacts,
    deferred: Vec<Value>,
    fused: Fusion,
    plan: memplan::ArenaPlan,
}

impl Trials {
    /// The graph with the values `vs` checkpointed (see [`checkpoint_all`]), partitioned,
    /// scheduled and planned; `None` when the backward pass reads none of them or the arena
    /// does not shrink.
    fn trial(
        &mut self,
        g: &Graph,
        vs: &[Value],
        opts: &Options,
        facts: &PipelineFacts,
        why: &str,
    ) -> Result<Option<Trial>, String> {
        self.tried.extend(vs.iter().map(|&v| key(g, v)));
        let Some((graph, map, placed)) = checkpoint_all(g, vs, &facts.kept())? else { return Ok(None) };
        let mut facts = facts.clone();
        facts.remap(&map)?;
        // An earlier clone that this rewrite removed no longer exists, so nothing waits for it.
        let mut deferred: Vec<Value> = self.deferred.iter().filter_map(|&d| map.lookup(d)).collect();
        deferred.extend(placed.iter().map(|&(_, c)| c));
        let (fused, order) = replan(&graph, opts, &facts.kept(), &deferred)?;
        let plan = memplan::plan_keeping(&graph, &fused, &order, opts.batch, &facts.kept());
        if plan.arena_bytes >= self.plan.arena_bytes {
            return Ok(None);
        }
        for (v, clone) in placed {
            let what = format!("{} {} {why}", graph.node(clone).op.mnemonic(), g.node(v).origin.label);
            facts.recomputed.push((clone, what));
        }
        Ok(Some(Trial { graph, facts, deferred, fused, plan }))
    }

    /// Makes a trial's graph, facts, partition and plan the current ones.
    fn commit(&mut self, t: Trial, g: &mut Graph, facts: &mut PipelineFacts) {
        *g = t.graph;
        *facts = t.facts;
        self.deferred = t.deferred;
        self.fused = t.fused;
        self.plan = t.plan;
        self.placed = true;
    }
}

/// How a tried value is remembered across rewrites (which renumber values).
fn key(g: &Graph, v: Value) -> String {
    g.node(v).origin.label.clone() + &v.to_string()
}

/// The values alive at the plan's peak that the forward pass stores for the backward pass and
/// that are cheap to recompute there: outputs of elementwise, reduction or data-movement
/// kernels (a normalised activation, a pooled or concatenated map), never of a contraction,
/// attention, recurrence or FFT, whose recomputation costs real work. Returns the largest
/// one first, followed by the others from the same layer line (the same op of a repeated
/// block), largest first; empty when there is none left to try.
fn cheap_candidates(
    g: &Graph,
    fused: &Fusion,
    plan: &memplan::ArenaPlan,
    batch: usize,
    tried: &[String],
) -> Vec<Value> {
    let users = g.users();
    let mut cheap = vec![false; g.nodes.len()];
    for grp in &fused.groups {
        let movement = grp.kind == GroupKind::Movement
            && grp.nodes.iter().all(|&n| {
                matches!(
                    g.node(n).op,
                    Op::Concat { .. } | Op::Slice { .. } | Op::Pad { .. } | Op::Permute { .. } | Op::Expand
                )
            });
        if movement || matches!(grp.kind, GroupKind::Elementwise | GroupKind::Reduce) {
            for &o in &grp.outputs {
                cheap[o.index()] = true;
            }
        }
    }
    let mut found: Vec<Value> = plan
        .live_at_peak
        .iter()
        .copied()
        .filter(|&v| {
            let n = g.node(v);
            cheap[v.index()]
                && n.origin.role == Role::Forward
                && n.ty.shape.batch_power() > 0
                && !backward_readers(g, &users, v).1.is_empty()
                && !tried.contains(&key(g, v))
        })
        .collect();
    found.sort_by_key(|&v| (std::cmp::Reverse(g.bytes(v, batch)), v));
    let Some(&first) = found.first() else { return found };
    let line = |v: Value| (g.node(v).origin.label.clone(), g.span(v).start);
    let same = line(first);
    let mut group = vec![first];
    group.extend(found.iter().copied().skip(1).filter(|&v| line(v) == same));
    group
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
                && !tried.contains(&key(g, *h))
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
    /// The checkpointed values.
    root: Vec<bool>,
    /// The forward elementwise and view nodes computed from them.
    chain: Vec<bool>,
    clones: Vec<Option<Value>>,
}

impl Checkpoint<'_, '_> {
    /// The recomputed copy of `x` (a root or a node of the chain), emitted on first use.
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

    /// The operands of `n` in the new graph: recomputed copies of the roots and their chain,
    /// the mapped values of everything else.
    fn operands(&mut self, n: &Node) -> Result<Vec<Value>, String> {
        n.inputs
            .iter()
            .map(|&i| {
                if self.root[i.index()] || self.chain[i.index()] {
                    self.ensure(i)
                } else {
                    self.rw.mapped(i)
                }
            })
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
    Ok(checkpoint_all(g, &[v], keep)?.and_then(|(graph, map, clones)| {
        let clone = clones.first()?.1;
        Some((graph, map, clone))
    }))
}

/// A graph checkpointed at several values, the old→new value map, and `(value, its
/// recomputed copy)` per value.
pub type CheckpointedAll = (Graph, ValueMap, Vec<(Value, Value)>);

/// [`checkpoint`] of several values in one rewrite: returns the graph, the old→new value
/// map and `(v, its recomputed copy)` for each value of `vs` that the backward pass reads;
/// `None` when it reads none of them.
pub fn checkpoint_all(g: &Graph, vs: &[Value], keep: &[Value]) -> Result<Option<CheckpointedAll>, String> {
    let users = g.users();
    let mut root = vec![false; g.nodes.len()];
    let mut chain = vec![false; g.nodes.len()];
    let mut readers = Vec::new();
    let mut roots = Vec::new();
    for &v in vs {
        let (c, r) = backward_readers(g, &users, v);
        if r.is_empty() || root[v.index()] {
            continue;
        }
        root[v.index()] = true;
        roots.push(v);
        for (dst, src) in chain.iter_mut().zip(c) {
            *dst |= src;
        }
        readers.extend(r);
    }
    if roots.is_empty() {
        return Ok(None);
    }
    readers.sort();
    readers.dedup();
    let mut rw = Rewriter::new(g);
    let mut cp = Checkpoint { rw: &mut rw, root, chain, clones: vec![None; g.nodes.len()] };
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
    let clones: Vec<(Value, Value)> = roots
        .iter()
        .map(|&v| {
            cp.clones[v.index()]
                .map(|c| (v, c))
                .ok_or_else(|| format!("checkpoint: no backward reader recomputed {v}"))
        })
        .collect::<Result<_, _>>()?;
    let (rewritten, first) = rw.finish()?;
    // Forward values that only the backward pass read are now dead.
    let keep: Vec<Value> = keep.iter().map(|&k| first.get(k)).collect::<Result<_, _>>()?;
    let (graph, dce) = eliminate_dead(&rewritten, &keep)?;
    let clones = clones
        .into_iter()
        .map(|(v, c)| dce.get(c).map(|c| (v, c)).map_err(|e| format!("checkpoint: the recomputed {v}: {e}")))
        .collect::<Result<_, _>>()?;
    Ok(Some((graph, first.then(&dce), clones)))
}
