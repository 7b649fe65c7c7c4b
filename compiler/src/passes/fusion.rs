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
    /// group are read from `inputs`, broadcast to `domain`. An `Assign` in `outputs` stores its
    /// value operand into the assign's slot, which the plan makes the target's slot.
    Elementwise,
    /// An elementwise prologue over `domain` (the reduction's input shape) followed by the
    /// `Reduce` node, which is last in `nodes` and is the only output.
    Reduce,
    /// One contraction node (`MatMul`, `Conv2d`, `ConvTranspose2d`, `Conv2dWeightGrad`).
    Contraction,
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
            && users[h.index()].iter().any(|&u| !g.node(u).op.is_elementwise())
            || (matches!(n.op, Op::Scalar { .. })
                && g.outputs.iter().any(|o| o.value == h));
        if n.op.is_leaf() && !scalar_needed {
            continue;
        }
        let kind = match &n.op {
            Op::Reshape => GroupKind::View,
            op if op.is_elementwise() || matches!(op, Op::Assign) => GroupKind::Elementwise,
            Op::Reduce { .. } => GroupKind::Reduce,
            op if op.is_contraction() => GroupKind::Contraction,
            _ => GroupKind::Movement,
        };
        let mut nodes = Vec::new();
        let mut inputs = Vec::new();
        for &i in &n.inputs {
            let inline_scalar = matches!(g.node(i).op, Op::Scalar { .. })
                && matches!(kind, GroupKind::Elementwise | GroupKind::Reduce)
                && kind != GroupKind::Reduce;
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
