//! A training or inference session in the interpreter: persistent buffers across steps.

use super::eval::evaluate;
use super::init::{init_tensor, name_hash, SplitMix64};
use super::tensor::Tensor;
use crate::ir::*;
use std::collections::HashMap;

/// Parameters and state of one model, kept across steps, by leaf name.
#[derive(Clone, Debug)]
pub struct Session {
    /// Batch size every step runs at.
    pub batch: usize,
    /// Current value of every `Param` and `State` leaf, by name.
    pub state: HashMap<String, Tensor>,
}

/// What one step made.
#[derive(Clone, Debug)]
pub struct StepOutputs {
    /// The graph's named outputs.
    pub outputs: HashMap<String, Tensor>,
    /// The loss value, when the graph has one (its first element).
    pub loss: Option<f64>,
    /// Every node's value (as [`evaluate`] returns them).
    pub values: Vec<Option<Tensor>>,
}

impl Session {
    /// A session whose parameters and state are initialised from their `Init`s. Each leaf
    /// draws from its own generator seeded with `seed ^ fnv1a(name)`, so a leaf's initial
    /// value depends only on the seed and its name (not on which other leaves exist).
    pub fn new(g: &Graph, batch: usize, seed: u64) -> Session {
        let mut state = HashMap::new();
        for v in g.persistent() {
            let n = g.node(v);
            if let Op::Param { name, init } | Op::State { name, init } = &n.op {
                let mut rng = SplitMix64::new(seed ^ name_hash(name));
                let shape = n.ty.shape.resolve(batch);
                state.insert(name.clone(), init_tensor(init, n.ty.dtype, &shape, &mut rng));
            }
        }
        Session { batch, state }
    }

    /// The leaf values for one evaluation: inputs by name from `inputs`, the rest from the
    /// session's state.
    pub fn leaves(
        &self,
        g: &Graph,
        inputs: &HashMap<String, Tensor>,
    ) -> Result<HashMap<Value, Tensor>, String> {
        let mut leaves = HashMap::new();
        for (h, n) in g.nodes.iter() {
            let (name, source) = match &n.op {
                Op::Input { name } => (name, inputs),
                Op::Param { name, .. } | Op::State { name, .. } => (name, &self.state),
                _ => continue,
            };
            let t = source.get(name).ok_or_else(|| format!("no value for `{name}`"))?;
            leaves.insert(h, t.clone());
        }
        Ok(leaves)
    }

    /// Runs one step: evaluates the graph, then applies every `Assign` to the state. Scalar
    /// `i32` states that no `Assign` writes (the dropout step counter) are then incremented,
    /// as the runtime does between steps.
    pub fn step(&mut self, g: &Graph, inputs: &HashMap<String, Tensor>) -> Result<StepOutputs, String> {
        let leaves = self.leaves(g, inputs)?;
        let values = evaluate(g, self.batch, &leaves)?;
        let value = |v: Value| values[v.index()].clone().ok_or_else(|| format!("{v} was not computed"));
        let mut assigned = Vec::new();
        for (h, n) in g.nodes.iter() {
            if matches!(n.op, Op::Assign) {
                let name = g.leaf_name(n.inputs[0]).ok_or("assign to a non-leaf")?.to_string();
                assigned.push(name.clone());
                self.state.insert(name, value(h)?);
            }
        }
        for v in g.persistent() {
            let n = g.node(v);
            let name = g.leaf_name(v).unwrap_or_default().to_string();
            if n.ty.dtype == DType::I32 && n.ty.shape.rank() == 0 && !assigned.contains(&name) {
                if let Some(Tensor { data: super::TensorData::Int(c), .. }) = self.state.get_mut(&name) {
                    c[0] += 1;
                }
            }
        }
        let mut outputs = HashMap::new();
        for o in &g.outputs {
            outputs.insert(o.name.clone(), value(o.value)?);
        }
        let loss = match g.loss {
            Some(l) => Some(value(l)?.to_real_vec()?.first().copied().ok_or("the loss is empty")?),
            None => None,
        };
        Ok(StepOutputs { outputs, loss, values })
    }
}
