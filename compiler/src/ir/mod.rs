//! The typed graph IR shared by every pass and back end.
//!
//! A [`Graph`] is an arena of [`Node`]s; a node is one primitive [`Op`] applied to earlier
//! nodes and names one value. Invariants (checked by [`verify::verify`] after every pass in
//! debug builds):
//! - a node's operands occur in the arena before it (the arena order is a topological order);
//! - every node has a [`TensorType`] consistent with its op and operands (as
//!   [`builder::infer`] computes it);
//! - every node keeps the source span of the `.cvnn` text that made it, and an [`Origin`]
//!   saying what role the value plays (forward activation, gradient, ...), so plans and memory
//!   reports can point back at a line;
//! - nothing reads the result of an [`Op::Assign`].

pub mod arena;
pub mod builder;
pub mod op;
pub mod parse;
pub mod print;
pub mod storage;
pub mod types;
pub mod verify;

pub use arena::{Arena, Handle};
pub use op::*;
pub use types::*;

use cvc_grammar::Span;
use serde::Serialize;

/// A value in the graph (the node that computes it).
pub type Value = Handle<Node>;

/// What a value is for; drives memory-report colours and rematerialisation choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Role {
    /// Fed by the data loader each step.
    Input,
    /// A trainable parameter.
    Param,
    /// Optimizer moments, running statistics, the step counter.
    State,
    /// Computed by the forward pass.
    Forward,
    /// Computed by the backward pass (gradients and their temporaries).
    Backward,
    /// Computed by the optimizer update.
    Update,
}

/// Where a value came from, for reports: its role and the `.cvnn` binding or layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Origin {
    /// The role of the value.
    pub role: Role,
    /// Human-readable label, e.g. `features/conv1d` or `grad(features/conv1d)`.
    pub label: String,
}

/// One IR node: an op, its operands, and the type of the value it makes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// Operands; each occurs earlier in the arena.
    pub inputs: Vec<Value>,
    /// Type of the result.
    pub ty: TensorType,
    /// Role and label for reports.
    pub origin: Origin,
}

/// A named value the caller reads after a step (loss, logits, predictions).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Output {
    /// Name (`loss`, or the `.cvnn` binding given to `output`).
    pub name: String,
    /// The value.
    pub value: Value,
}

/// Whether a graph computes a training step or inference only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Mode {
    /// Forward, loss, backward and optimizer update; batchnorm uses batch statistics.
    Train,
    /// Forward only; batchnorm uses running statistics; dropout is the identity.
    Eval,
}

/// A whole program: one step of training or one inference call.
#[derive(Clone, Debug)]
pub struct Graph {
    /// The nodes, in a topological order.
    pub nodes: Arena<Node>,
    /// Values read by the caller after a step.
    pub outputs: Vec<Output>,
    /// The scalar loss, when the model declares one.
    pub loss: Option<Value>,
    /// Train or eval.
    pub mode: Mode,
    /// The model's name.
    pub name: String,
    /// The 16-bit format activations and their gradients are stored in ([`Storage::Full`]:
    /// none); which values it applies to is [`storage::stored`]'s rule.
    pub half: Storage,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: &str, mode: Mode) -> Self {
        Graph {
            nodes: Arena::new(),
            outputs: Vec::new(),
            loss: None,
            mode,
            name: name.into(),
            half: Storage::Full,
        }
    }
    /// The node computing `v`.
    pub fn node(&self, v: Value) -> &Node {
        &self.nodes[v]
    }
    /// The type of `v`.
    pub fn ty(&self, v: Value) -> &TensorType {
        &self.nodes[v].ty
    }
    /// The source span of `v`.
    pub fn span(&self, v: Value) -> Span {
        self.nodes.span(v)
    }
    /// For every value, the values that read it (in arena order).
    pub fn users(&self) -> Vec<Vec<Value>> {
        let mut users = vec![Vec::new(); self.nodes.len()];
        for (h, n) in self.nodes.iter() {
            for &i in &n.inputs {
                if !users[i.index()].contains(&h) {
                    users[i.index()].push(h);
                }
            }
        }
        users
    }
    /// Trainable parameters in arena order.
    pub fn params(&self) -> impl Iterator<Item = Value> + '_ {
        self.nodes.iter().filter(|(_, n)| matches!(n.op, Op::Param { .. })).map(|(h, _)| h)
    }
    /// Persistent buffers (parameters and state) in arena order.
    pub fn persistent(&self) -> impl Iterator<Item = Value> + '_ {
        self.nodes.iter().filter(|(_, n)| n.op.is_persistent()).map(|(h, _)| h)
    }
    /// Data inputs in arena order.
    pub fn inputs(&self) -> impl Iterator<Item = Value> + '_ {
        self.nodes.iter().filter(|(_, n)| matches!(n.op, Op::Input { .. })).map(|(h, _)| h)
    }
    /// The name of a leaf (`Input`, `Param`, `State`), if `v` is one.
    pub fn leaf_name(&self, v: Value) -> Option<&str> {
        match &self.nodes[v].op {
            Op::Input { name } | Op::Param { name, .. } | Op::State { name, .. } => Some(name),
            _ => None,
        }
    }
    /// Looks a named leaf up.
    pub fn find_leaf(&self, name: &str) -> Option<Value> {
        self.nodes.handles().find(|&h| self.leaf_name(h) == Some(name))
    }
    /// The initialiser of a persistent buffer (`Param`, `State`), if `v` is one.
    pub fn init_of(&self, v: Value) -> Option<&Init> {
        match &self.nodes[v].op {
            Op::Param { init, .. } | Op::State { init, .. } => Some(init),
            _ => None,
        }
    }
    /// Whether `v` is a trainable parameter.
    pub fn is_param(&self, v: Value) -> bool {
        matches!(self.nodes[v].op, Op::Param { .. })
    }
    /// Leaves a runtime binds by name: data inputs, parameters and state, in arena order.
    pub fn bound_leaves(&self) -> impl Iterator<Item = Value> + '_ {
        self.nodes
            .iter()
            .filter(|(_, n)| matches!(n.op, Op::Input { .. }) || n.op.is_persistent())
            .map(|(h, _)| h)
    }
    /// The updates of one step: `(assign node, persistent target)` pairs, in arena order. The
    /// target holds the assign's value after the step.
    pub fn assigns(&self) -> impl Iterator<Item = (Value, Value)> + '_ {
        self.nodes.iter().filter(|(_, n)| matches!(n.op, Op::Assign)).map(|(h, n)| (h, n.inputs[0]))
    }
}
