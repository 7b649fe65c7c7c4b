//! Rematerialisation under a memory budget (checkpointing).
//!
//! Cheap values (normalise, activation, pooling prologues, casts) are already recomputed by
//! the fusion pass, which inlines them into every kernel that reads them instead of storing
//! them. With a memory budget this pass goes further: while the plan does not fit, it takes
//! the largest stored contraction output that the backward pass reads, clones the
//! contraction right before its first backward reader, and keeps the clone when the arena
//! shrinks. The schedule runs a clone only when a reader needs it, so the original dies
//! after the forward pass.

use super::fusion::{self, Fusion, GroupId};
use super::pipeline::Options;
use super::rewrite::{eliminate_dead_mapped, Rewriter};
use super::{memplan, schedule, PipelineFacts};
use crate::ir::*;

/// Most checkpoints tried before giving up on a budget.
const MAX_TRIES: usize = 32;

/// Checkpoints contractions until the plan fits `opts.memory_budget` (when there is one and
/// the graph trains); records each recomputation in `facts.recomputed`. A plan that still
/// does not fit is left for the caller to report.
pub fn run(
    g: &mut Graph,
    fused: &mut Fusion,
    order: &mut Vec<GroupId>,
    opts: &Options,
    facts: &mut PipelineFacts,
) -> Result<(), String> {
    let Some(budget) = opts.memory_budget else { return Ok(()) };
    if g.mode != Mode::Train {
        return Ok(());
    }
    let mut deferred: Vec<Value> = Vec::new();
    let keep = |f: &PipelineFacts| -> Vec<Value> { f.grads.iter().map(|&(_, d)| d).collect() };
    let mut arena = memplan::plan_keeping(g, fused, order, opts.batch, &keep(facts)).arena_bytes;
    let mut tried: Vec<String> = Vec::new();
    for _ in 0..MAX_TRIES {
        if arena as u64 <= budget {
            break;
        }
        let Some(v) = candidate(g, fused, opts.batch, &tried) else { break };
        tried.push(g.node(v).origin.label.clone() + &v.to_string());
        let Some((ng, map, clone)) = checkpoint(g, v)? else { continue };
        let mut trial = facts.clone();
        remap(&mut trial, &map);
        let nf = if opts.fuse { fusion::fuse_keeping(&ng, &keep(&trial)) } else { fusion::unfused(&ng) };
        let mut defer_now: Vec<Value> = deferred.iter().filter_map(|d| map[d.index()]).collect();
        defer_now.push(clone);
        let groups: Vec<GroupId> = (0..nf.groups.len())
            .filter(|&i| nf.groups[i].outputs.iter().any(|o| defer_now.contains(o)))
            .collect();
        let no = schedule::order_with(&ng, &nf, opts.batch, &groups)?;
        let na = memplan::plan_keeping(&ng, &nf, &no, opts.batch, &keep(&trial)).arena_bytes;
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
            *fused = nf;
            *order = no;
            arena = na;
        }
    }
    Ok(())
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
        .max_by_key(|(h, n)| (n.ty.bytes(batch), std::cmp::Reverse(*h)))
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
    fn ensure(&mut self, x: Value) -> Value {
        if let Some(c) = self.clones[x.index()] {
            return c;
        }
        let g = self.rw.old;
        let n = g.node(x);
        let inputs: Vec<Value> = n
            .inputs
            .iter()
            .map(|&i| if i == self.v || self.chain[i.index()] { self.ensure(i) } else { self.rw.mapped(i) })
            .collect();
        let origin = Origin { role: Role::Backward, label: format!("recompute({})", n.origin.label) };
        let c = self.rw.push(Node { op: n.op.clone(), inputs, ty: n.ty.clone(), origin }, g.span(x));
        self.clones[x.index()] = Some(c);
        c
    }
}

/// A checkpointed graph, the old→new value map, and the recomputed value.
pub type Checkpointed = (Graph, Vec<Option<Value>>, Value);

/// A copy of `g` where the backward pass recomputes `v` (and the forward elementwise values
/// it reads from `v`) right before it needs them, instead of reading the stored ones.
/// Returns the graph, the old→new value map and the recomputed `v`.
pub fn checkpoint(g: &Graph, v: Value) -> Result<Option<Checkpointed>, String> {
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
            let inputs: Vec<Value> = n
                .inputs
                .iter()
                .map(|&i| if i == v || cp.chain[i.index()] { cp.ensure(i) } else { cp.rw.mapped(i) })
                .collect();
            let node = Node { op: n.op.clone(), inputs, ty: n.ty.clone(), origin: n.origin.clone() };
            let nv = cp.rw.push(node, g.span(h));
            cp.rw.map[h.index()] = Some(nv);
        } else {
            cp.rw.copy(h);
        }
    }
    let clone = cp.clones[v.index()].expect("a backward reader recomputed v");
    let first_map = rw.map.clone();
    // Forward values that only the backward pass read are now dead.
    let (graph, dce) = eliminate_dead_mapped(&rw.finish());
    let map = first_map.iter().map(|m| m.and_then(|x| dce[x.index()])).collect();
    let clone = dce[clone.index()].expect("the clone is read");
    Ok(Some((graph, map, clone)))
}

/// Rewrites the values recorded in `facts` through an old→new map.
pub fn remap(facts: &mut PipelineFacts, map: &[Option<Value>]) {
    let m = |v: Value| map.get(v.index()).copied().flatten().unwrap_or(v);
    for (p, d) in &mut facts.grads {
        *p = m(*p);
        *d = m(*d);
    }
    for c in &mut facts.casts {
        c.value = m(c.value);
    }
    for (v, _) in &mut facts.recomputed {
        *v = m(*v);
    }
}
