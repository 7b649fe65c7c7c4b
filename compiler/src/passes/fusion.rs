//! Fusion: partitions the graph into kernel groups (one generated kernel each).

use crate::ir::*;
use serde::Serialize;

/// Index of a group in [`Fusion::groups`].
pub type GroupId = usize;

/// What kind of kernel a group becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum GroupKind {
    /// One loop over `domain`: evaluates `nodes` (elementwise ops, `Scalar`s and `Assign`s, in
    /// dependency order) per element and stores each value in `outputs`. Operands outside the
    /// group are read from `inputs`, broadcast to `domain`; a node whose shape is smaller than
    /// `domain` is evaluated at every domain point (broadcast, recomputed). An `Assign` in
    /// `outputs` stores its value operand into the assign's slot, which the plan makes the
    /// target's slot; `Assign`s come last in `nodes`, so every input of an element is loaded
    /// before anything is stored. A single-output group's output may share the slot of an
    /// input of the same shape (in place): each element is loaded before it is overwritten.
    Elementwise,
    /// An elementwise prologue over `domain` (the reduction's input shape), the `Reduce` node,
    /// and optionally an elementwise epilogue over the reduction's output shape (see
    /// [`KernelGroup::reduce_parts`]). Without an epilogue the `Reduce` node is last in `nodes`
    /// and is the only output; with one, the outputs are the epilogue's and the sum itself is
    /// never stored (an average pool's `sum × ¼`: one kernel writes the mean).
    Reduce,
    /// One contraction node (`MatMul`, `Conv2d`, `ConvTranspose2d`, `Conv2dWeightGrad`).
    Contraction,
    /// One fused attention node (`AttnLse`, `Attention`, `AttentionGrad`): one kernel that
    /// never stores the `[T, S]` weights.
    Attention,
    /// One fused recurrence node (`Recurrence`, `RecurrenceGrad`): the loop over the time
    /// axis in one launch.
    Recurrence,
    /// One data-movement or special node: `Expand`, `Permute`, `Slice`, `Pad`, `Concat`,
    /// `Fft`, `OneHot`, `DropoutMask`.
    Movement,
    /// A `Reshape`: the output shares its input's buffer; no code runs.
    View,
}

/// A set of nodes compiled into one kernel.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelGroup {
    /// Kernel kind.
    pub kind: GroupKind,
    /// Nodes computed inside the kernel, operands before users.
    pub nodes: Vec<Value>,
    /// Materialised values the kernel reads (not computed inside it).
    pub inputs: Vec<Value>,
    /// Values the kernel writes to memory (a subset of `nodes`).
    pub outputs: Vec<Value>,
    /// Iteration space (elementwise: the outputs' shape; reduce: the reduction input's shape;
    /// otherwise the single node's output shape).
    pub domain: Shape,
}

impl KernelGroup {
    /// The parts of a reduction group: the prologue (evaluated at every domain point), the
    /// `Reduce` node, and the epilogue (evaluated once per output element of the reduction,
    /// after it; empty unless [`merge_epilogues`] folded an elementwise group in). A scalar
    /// may appear in both parts: each part evaluates its own. `None` for other kinds.
    pub fn reduce_parts(&self, g: &Graph) -> Option<(&[Value], Value, &[Value])> {
        if self.kind != GroupKind::Reduce {
            return None;
        }
        let at = self.nodes.iter().position(|&v| matches!(g.node(v).op, Op::Reduce { .. }))?;
        Some((&self.nodes[..at], self.nodes[at], &self.nodes[at + 1..]))
    }
}

/// The partition of a graph into kernel groups.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Fusion {
    /// All groups, in a valid dependency order.
    pub groups: Vec<KernelGroup>,
    /// Values recomputed inside more than one group instead of being stored.
    pub recomputed: Vec<Value>,
}

impl Fusion {
    /// Whether `v` is written to memory by some group (or is a leaf that lives in memory).
    pub fn materialized(&self, g: &Graph) -> Vec<bool> {
        let mut m = vec![false; g.nodes.len()];
        for (h, n) in g.nodes.iter() {
            if n.op.is_leaf() && !matches!(n.op, Op::Scalar { .. }) {
                m[h.index()] = true;
            }
        }
        for grp in &self.groups {
            for &o in &grp.outputs {
                m[o.index()] = true;
            }
        }
        m
    }
}

/// Places every non-leaf node in a group of its own (scalars are inlined into elementwise
/// users). The baseline that the fusing partition is measured against.
pub fn unfused(g: &Graph) -> Fusion {
    let users = g.users();
    let mut groups = Vec::new();
    for (h, n) in g.nodes.iter() {
        let scalar_needed = matches!(n.op, Op::Scalar { .. })
            && (users[h.index()].iter().any(|&u| !g.node(u).op.is_elementwise())
                || g.outputs.iter().any(|o| o.value == h)
                || g.loss == Some(h));
        if n.op.is_leaf() && !scalar_needed {
            continue;
        }
        let kind = kind_of(&n.op);
        let mut nodes = Vec::new();
        let mut inputs = Vec::new();
        for &i in &n.inputs {
            let inline_scalar = matches!(g.node(i).op, Op::Scalar { .. }) && kind == GroupKind::Elementwise;
            if inline_scalar {
                if !nodes.contains(&i) {
                    nodes.push(i);
                }
            } else if !inputs.contains(&i) {
                inputs.push(i);
            }
        }
        nodes.push(h);
        let domain = match kind {
            GroupKind::Reduce => g.ty(n.inputs[0]).shape.clone(),
            _ => n.ty.shape.clone(),
        };
        groups.push(KernelGroup { kind, nodes, inputs, outputs: vec![h], domain });
    }
    Fusion { groups, recomputed: Vec::new() }
}

/// Most elementwise nodes a value may inline (recompute) from its materialised inputs before
/// it is stored instead: the cap that keeps recomputation cheap. 64 holds a batchnorm +
/// activation backward chain recomputed from the forward activation (with 48 the seed
/// network stored two such chains as 64 MiB temporaries at its peak; bench/GPU-NOTES.md).
pub const INLINE_CAP: usize = 64;

/// Most distinct full-size stored tensors a chain of batched sums may read before its last sum is
/// stored instead: the node cap bounds arithmetic, this one bounds memory traffic. A
/// pre-norm transformer's residual stream `x + a₁ + m₁ + a₂ + …` is one add per block: under
/// the node cap alone every reader of the last block's input re-added all 25 stored branch
/// outputs (the ViT example's norm and gradient kernels read up to 40 stored `[B, 256, 192]`
/// tensors a launch, 195 GiB a step in all; 137 GiB with this cap, the arena the same). Only
/// adds and subtractions of operands of their own shape count: other cones (a norm's
/// backward) read a few tensors many ways, and a cap on them stores gradients as
/// temporaries that grow the arena (tried: the seed network 141.7 → 150.6 MiB).
pub const INLINE_READS_CAP: usize = 2;

/// The kind of group a node roots when it is materialised.
fn kind_of(op: &Op) -> GroupKind {
    match op.class() {
        OpClass::View => GroupKind::View,
        // A leaf roots a group only as a scalar that is stored (an output, a loss).
        OpClass::Elementwise | OpClass::Assign | OpClass::Leaf => GroupKind::Elementwise,
        OpClass::Reduce => GroupKind::Reduce,
        OpClass::Contraction => GroupKind::Contraction,
        OpClass::Attention => GroupKind::Attention,
        OpClass::Recurrence => GroupKind::Recurrence,
        OpClass::Movement => GroupKind::Movement,
    }
}

/// Whether a user can evaluate its operand inline, per element of its loop.
fn inlines_operands(op: &Op) -> bool {
    match op.class() {
        OpClass::Elementwise | OpClass::Assign | OpClass::Reduce => true,
        OpClass::Leaf
        | OpClass::View
        | OpClass::Movement
        | OpClass::Contraction
        | OpClass::Attention
        | OpClass::Recurrence => false,
    }
}

/// Which values must be written to memory: leaves, outputs, the results of reductions,
/// contractions, movement and views, and elementwise values that a non-elementwise user
/// reads or whose inline cone exceeds [`INLINE_CAP`] or [`INLINE_READS_CAP`] (except the parts of a real/imag
/// combine, which are always computed inside the combine's kernel).
pub fn materialization(g: &Graph) -> Vec<bool> {
    materialization_keeping(g, &[])
}

/// [`materialization`], with the values in `keep` (parameter gradients) stored too.
pub fn materialization_keeping(g: &Graph, keep: &[Value]) -> Vec<bool> {
    let users = g.users();
    let mut roots = vec![false; g.nodes.len()];
    for &k in keep {
        roots[k.index()] = true;
    }
    for o in &g.outputs {
        roots[o.value.index()] = true;
    }
    if let Some(l) = g.loss {
        roots[l.index()] = true;
    }
    let mut mat = vec![false; g.nodes.len()];
    // The distinct inlined nodes each value would recompute; `None` once past the cap.
    let mut cone: Vec<Option<Vec<Value>>> = vec![Some(Vec::new()); g.nodes.len()];
    // The distinct full-size stored tensors each value's cone reads.
    let mut reads: Vec<Vec<Value>> = vec![Vec::new(); g.nodes.len()];
    for (h, n) in g.nodes.iter() {
        let i = h.index();
        let us = &users[i];
        let foreign_user = us.iter().any(|&u| !inlines_operands(&g.node(u).op));
        mat[i] = match (&n.op, n.op.class()) {
            (Op::Scalar { .. }, _) => roots[i] || foreign_user,
            (_, OpClass::Leaf) => true,
            (_, OpClass::Elementwise) => {
                let mut set = Some(vec![h]);
                // A sum's chain reads: the stored full-size operands of it and of the sums it
                // inlines. Other inlined nodes end the chain (a norm's backward reads a few
                // tensors many ways and recomputes cheaply; only a chain of adds grows by a
                // stored tensor per node).
                // Batch-free sums (a parameter's gradient assembled from padded pieces) are a
                // few bytes: recomputing them costs nothing, a kernel of their own a launch.
                let sum =
                    matches!(n.op, Op::Binary(BinaryOp::Add | BinaryOp::Sub)) && n.ty.shape.batch_power() > 0;
                let mut read: Vec<Value> = Vec::new();
                for &o in n.inputs.iter().filter(|_| sum) {
                    let from: &[Value] = if !mat[o.index()] {
                        &reads[o.index()]
                    } else if g.ty(o).shape == n.ty.shape && !matches!(g.node(o).op, Op::Scalar { .. }) {
                        std::slice::from_ref(&o)
                    } else {
                        &[]
                    };
                    for &v in from {
                        if !read.contains(&v) {
                            read.push(v);
                        }
                    }
                }
                for o in n.inputs.iter().filter(|o| !mat[o.index()]) {
                    set = match (set, &cone[o.index()]) {
                        (Some(mut s), Some(os)) => {
                            for &v in os {
                                if !s.contains(&v) {
                                    s.push(v);
                                }
                            }
                            (s.len() <= INLINE_CAP).then_some(s)
                        }
                        _ => None,
                    };
                }
                let only_combined = !us.is_empty()
                    && us.iter().all(|&u| matches!(g.node(u).op, Op::Binary(BinaryOp::Complex)));
                let over = set.is_none() || read.len() > INLINE_READS_CAP;
                cone[i] = set;
                reads[i] = read;
                let m = roots[i] || us.is_empty() || foreign_user || (over && !only_combined);
                if m {
                    cone[i] = Some(Vec::new());
                    reads[i].clear();
                }
                m
            }
            (
                _,
                OpClass::Reduce
                | OpClass::View
                | OpClass::Movement
                | OpClass::Contraction
                | OpClass::Attention
                | OpClass::Recurrence
                | OpClass::Assign,
            ) => true,
        };
    }
    mat
}

/// The fusing partition: every materialised non-leaf value roots one group; elementwise
/// operands that are not materialised are inlined (recomputed) into every group that reads
/// them; `Assign`s of the same shape that read a common tensor share one kernel.
pub fn fuse(g: &Graph) -> Fusion {
    fuse_keeping(g, &[])
}

/// [`fuse`], with the values in `keep` (parameter gradients) written to memory.
pub fn fuse_keeping(g: &Graph, keep: &[Value]) -> Fusion {
    let mat = materialization_keeping(g, keep);
    let mut groups = Vec::new();
    for (h, n) in g.nodes.iter() {
        if !mat[h.index()] || (n.op.is_leaf() && !matches!(n.op, Op::Scalar { .. })) {
            continue;
        }
        let kind = kind_of(&n.op);
        let mut nodes = vec![h];
        let mut inputs = Vec::new();
        if matches!(kind, GroupKind::Elementwise | GroupKind::Reduce) {
            let mut stack: Vec<Value> = n.inputs.clone();
            while let Some(o) = stack.pop() {
                let on = g.node(o);
                let inline =
                    matches!(on.op, Op::Scalar { .. }) || (on.op.is_elementwise() && !mat[o.index()]);
                if inline {
                    if !nodes.contains(&o) {
                        nodes.push(o);
                        stack.extend(on.inputs.iter().copied());
                    }
                } else if !inputs.contains(&o) {
                    inputs.push(o);
                }
            }
        } else {
            for &o in &n.inputs {
                if !inputs.contains(&o) {
                    inputs.push(o);
                }
            }
        }
        nodes.sort();
        inputs.sort();
        let domain = match kind {
            GroupKind::Reduce => g.ty(n.inputs[0]).shape.clone(),
            _ => n.ty.shape.clone(),
        };
        groups.push(KernelGroup { kind, nodes, inputs, outputs: vec![h], domain });
    }
    let groups = merge_assigns(g, groups);
    let groups = merge_attention_lse(g, groups);
    let groups = merge_epilogues(g, groups, keep);
    let recomputed = recomputed_values(g, &groups);
    Fusion { groups, recomputed }
}

/// Merges elementwise groups that only write `Assign`s, have one domain and read a common
/// tensor of that shape (an optimizer's moments and parameter update): one kernel reads the
/// gradient once. Assigns are moved last so every element is read before it is written.
fn merge_assigns(g: &Graph, groups: Vec<KernelGroup>) -> Vec<KernelGroup> {
    let only_assigns = |k: &KernelGroup| {
        k.kind == GroupKind::Elementwise && k.outputs.iter().all(|&o| matches!(g.node(o).op, Op::Assign))
    };
    let mut parent: Vec<usize> = (0..groups.len()).collect();
    fn find(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    let mut owner: std::collections::HashMap<(Value, Shape), usize> = std::collections::HashMap::new();
    for (gi, k) in groups.iter().enumerate() {
        if !only_assigns(k) {
            continue;
        }
        for &i in &k.inputs {
            if g.ty(i).shape != k.domain || g.ty(i).shape.rank() == 0 {
                continue;
            }
            match owner.get(&(i, k.domain.clone())) {
                Some(&o) => {
                    let (a, b) = (find(&mut parent, o), find(&mut parent, gi));
                    if a != b {
                        parent[b.max(a)] = a.min(b);
                    }
                }
                None => {
                    owner.insert((i, k.domain.clone()), gi);
                }
            }
        }
    }
    let mut merged: Vec<Option<KernelGroup>> = groups.into_iter().map(Some).collect();
    for gi in 0..merged.len() {
        let r = find(&mut parent, gi);
        if r != gi {
            let k = merged[gi].take().expect("each group merged once");
            let into = merged[r].as_mut().expect("root kept");
            for v in k.nodes {
                if !into.nodes.contains(&v) {
                    into.nodes.push(v);
                }
            }
            into.outputs.extend(k.outputs);
            for v in k.inputs {
                if !into.inputs.contains(&v) {
                    into.inputs.push(v);
                }
            }
        }
    }
    let mut out: Vec<KernelGroup> = merged.into_iter().flatten().collect();
    for k in &mut out {
        k.nodes.sort_by_key(|&v| (matches!(g.node(v).op, Op::Assign), v));
        k.inputs.retain(|i| !k.nodes.contains(i));
        k.inputs.sort();
        k.outputs.sort();
    }
    out
}

/// Moves each `AttnLse` into the group of its first user when that is the `Attention` of the
/// same queries, keys and mask: one kernel then computes the log-sum-exp and the output in one
/// pass over the keys (online softmax), instead of computing every score twice. The group
/// writes both; the backward (and a recomputed forward) read the stored log-sum-exp.
fn merge_attention_lse(g: &Graph, groups: Vec<KernelGroup>) -> Vec<KernelGroup> {
    let users = g.users();
    let mut lse_group: std::collections::HashMap<Value, usize> = std::collections::HashMap::new();
    for (gi, k) in groups.iter().enumerate() {
        if k.kind == GroupKind::Attention
            && k.nodes.len() == 1
            && matches!(g.node(k.nodes[0]).op, Op::AttnLse { .. })
        {
            lse_group.insert(k.nodes[0], gi);
        }
    }
    let mut absorbed = vec![false; groups.len()];
    let mut merges: Vec<(usize, Value)> = Vec::new();
    for (gi, k) in groups.iter().enumerate() {
        let &[a] = &k.nodes[..] else { continue };
        let an = g.node(a);
        let Op::Attention { spec } = &an.op else { continue };
        let Some(&l) = an.inputs.get(3) else { continue };
        let Some(&li) = lse_group.get(&l) else { continue };
        let ln = g.node(l);
        let Op::AttnLse { spec: ls } = &ln.op else { continue };
        let first_user = users[l.index()].iter().copied().min();
        let mask_same = !spec.key_mask || ln.inputs.get(2) == an.inputs.get(4);
        let same = ls.scale == spec.scale
            && ls.score == spec.score
            && ls.causal == spec.causal
            && ls.key_mask == spec.key_mask
            && ln.inputs[..2] == an.inputs[..2]
            && mask_same;
        if same && first_user == Some(a) && !absorbed[li] {
            absorbed[li] = true;
            merges.push((gi, l));
        }
    }
    let mut groups = groups;
    for (gi, l) in merges {
        let k = &mut groups[gi];
        k.nodes.insert(0, l);
        k.outputs.insert(0, l);
        k.inputs.retain(|&i| i != l);
        for &i in &g.node(l).inputs {
            if !k.inputs.contains(&i) {
                k.inputs.push(i);
            }
        }
        k.inputs.sort();
    }
    groups.into_iter().zip(absorbed).filter(|(_, a)| !a).map(|(k, _)| k).collect()
}

/// Folds an elementwise group into the reduction whose result it alone reads, as the
/// reduction's epilogue, when it runs over exactly the reduction's output shape and writes no
/// `Assign`: the sum is then never stored, and one kernel writes what the elementwise group
/// wrote. An average pool is the case that matters: its window sum went to memory in f32 and a
/// second kernel read it back to store `sum × ¼` (at bf16, the seed network's first pool
/// wrote and read 256 MiB for a 128 MiB result). The merged group takes the elementwise
/// group's place in the list: every input of either is computed before it.
pub fn merge_epilogues(g: &Graph, groups: Vec<KernelGroup>, keep: &[Value]) -> Vec<KernelGroup> {
    let kept = |v: Value| keep.contains(&v) || g.loss == Some(v) || g.outputs.iter().any(|o| o.value == v);
    let mut readers: std::collections::HashMap<Value, Vec<usize>> = std::collections::HashMap::new();
    for (gi, k) in groups.iter().enumerate() {
        for &i in &k.inputs {
            readers.entry(i).or_default().push(gi);
        }
    }
    // `into[e] = r`: elementwise group `e` becomes the epilogue of reduction group `r`.
    let mut into: Vec<Option<usize>> = vec![None; groups.len()];
    let mut taken = vec![false; groups.len()];
    for (ri, k) in groups.iter().enumerate() {
        let Some((pro, red, epi)) = k.reduce_parts(g) else { continue };
        if !epi.is_empty() || k.outputs != [red] || kept(red) {
            continue;
        }
        let Some(&[ei]) = readers.get(&red).map(|r| r.as_slice()) else { continue };
        let e = &groups[ei];
        let fits = ei > ri
            && e.kind == GroupKind::Elementwise
            && e.domain == g.ty(red).shape
            && !e.outputs.is_empty()
            && e.outputs.iter().all(|&o| !matches!(g.node(o).op, Op::Assign))
            // Each part evaluates its own nodes: only scalars may be in both.
            && e.nodes.iter().all(|v| !pro.contains(v) || matches!(g.node(*v).op, Op::Scalar { .. }));
        if fits && into[ei].is_none() && !taken[ri] {
            into[ei] = Some(ri);
            taken[ri] = true;
        }
    }
    let mut slots: Vec<Option<KernelGroup>> = groups.into_iter().map(Some).collect();
    for ei in 0..slots.len() {
        let Some(ri) = into[ei] else { continue };
        let mut r = slots[ri].take().expect("a reduction takes one epilogue");
        let e = slots[ei].take().expect("an epilogue joins one reduction");
        let red = r.outputs[0];
        r.nodes.extend(e.nodes);
        r.outputs = e.outputs;
        for i in e.inputs {
            if i != red && !r.inputs.contains(&i) {
                r.inputs.push(i);
            }
        }
        r.inputs.sort();
        slots[ei] = Some(r);
    }
    slots.into_iter().flatten().collect()
}

/// Non-scalar values computed inside more than one group.
fn recomputed_values(g: &Graph, groups: &[KernelGroup]) -> Vec<Value> {
    let mut count = vec![0usize; g.nodes.len()];
    for k in groups {
        for &v in &k.nodes {
            count[v.index()] += 1;
        }
    }
    g.nodes
        .iter()
        .filter(|(h, n)| count[h.index()] > 1 && !matches!(n.op, Op::Scalar { .. }))
        .map(|(h, _)| h)
        .collect()
}

/// Real/imag combines (`Binary(Complex)`) with a part that another kernel wrote to memory
/// only so that the combine could read it back: the copies the fusion must avoid.
pub fn combines_materialized(g: &Graph, fusion: &Fusion) -> usize {
    let mat = fusion.materialized(g);
    let users = g.users();
    g.nodes
        .iter()
        .filter(|(_, n)| matches!(n.op, Op::Binary(BinaryOp::Complex)))
        .filter(|(_, n)| {
            n.inputs.iter().any(|&p| {
                let pn = g.node(p);
                mat[p.index()]
                    && !pn.op.is_leaf()
                    && pn.op.is_elementwise()
                    && users[p.index()].iter().all(|&u| matches!(g.node(u).op, Op::Binary(BinaryOp::Complex)))
            })
        })
        .count()
}

/// The partition the pipeline uses: the fusing one with the values in `keep` (parameter
/// gradients) stored, or the one-node-per-kernel baseline when `fuse` is false.
pub fn partition(g: &Graph, fuse: bool, keep: &[Value]) -> Fusion {
    if fuse {
        fuse_keeping(g, keep)
    } else {
        unfused(g)
    }
}

/// The fusion pass: [`partition`] (the graph has been through `views` when fusing), with the
/// combines and recomputed values recorded in `facts`.
pub fn run(g: &Graph, fuse_nodes: bool, facts: &mut super::PipelineFacts) -> Result<Fusion, String> {
    let f = partition(g, fuse_nodes, &facts.kept());
    facts.combines_materialized = combines_materialized(g, &f);
    let mut kernels_of = vec![0usize; g.nodes.len()];
    for k in &f.groups {
        for &v in &k.nodes {
            kernels_of[v.index()] += 1;
        }
    }
    for &v in &f.recomputed {
        let kernels = kernels_of[v.index()];
        let n = g.node(v);
        facts.recomputed.push((
            v,
            format!(
                "{} {} recomputed in {kernels} kernels instead of stored",
                n.op.mnemonic(),
                n.origin.label
            ),
        ));
    }
    Ok(f)
}
