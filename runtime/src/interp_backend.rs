//! A [`Backend`] over the f64 reference interpreter: slow, exact, and independent of code
//! generation. Used to test the training runtime and behind the hidden `--device interp`.
//!
//! Leaves (inputs, parameters, state) are kept by [`Value`] as interpreter tensors; a step
//! evaluates the whole graph and then applies every `Assign` to its target leaf, as a
//! compiled back end's arena would (rounded to f32, as an arena stores them). [`HostTensor`]s (f32) are converted on upload/download.

use crate::backend::{Backend, HostData, HostTensor, RuntimeError};
use crate::metrics::peak_rss_bytes;
use crate::numerics::NonFinite;
use cvc_compiler::interp::{evaluate, Tensor, TensorData};
use cvc_compiler::ir::{DType, Graph, Value};
use cvc_compiler::passes::fusion::KernelGroup;
use cvc_compiler::passes::Program;
use num_complex::Complex64;
use std::collections::HashMap;

/// Converts a host tensor (f32, complex interleaved) to an interpreter tensor (f64).
pub fn to_interp(t: &HostTensor) -> Tensor {
    let data = match (&t.data, t.dtype) {
        (HostData::F32(v), DType::C64) => {
            TensorData::Complex(v.chunks_exact(2).map(|p| Complex64::new(p[0] as f64, p[1] as f64)).collect())
        }
        (HostData::F32(v), _) => TensorData::Real(v.iter().map(|&x| x as f64).collect()),
        (HostData::I32(v), _) => TensorData::Int(v.iter().map(|&x| x as i64).collect()),
    };
    Tensor { shape: t.shape.clone(), data }
}

/// Converts an interpreter tensor to a host tensor, rounding to f32 (integers saturate to i32).
pub fn from_interp(t: &Tensor) -> HostTensor {
    let (dtype, data) = match &t.data {
        TensorData::Real(v) => (DType::F32, HostData::F32(v.iter().map(|&x| x as f32).collect())),
        TensorData::Complex(v) => {
            (DType::C64, HostData::F32(v.iter().flat_map(|z| [z.re as f32, z.im as f32]).collect()))
        }
        TensorData::Int(v) => (
            DType::I32,
            HostData::I32(v.iter().map(|&x| x.clamp(i32::MIN as i64, i32::MAX as i64) as i32).collect()),
        ),
    };
    HostTensor { dtype, shape: t.shape.clone(), data }
}

/// The reference interpreter as a back end for one program.
pub struct InterpBackend {
    graph: Graph,
    batch: usize,
    arena_bytes: usize,
    leaves: HashMap<Value, Tensor>,
    values: Vec<Option<Tensor>>,
    groups: Vec<KernelGroup>,
    checked_steps: u64,
}

impl InterpBackend {
    /// A back end for `program`; leaves start as zeros until uploaded.
    pub fn new(program: &Program) -> Self {
        let graph = program.graph.clone();
        let batch = program.plan.batch;
        let mut leaves = HashMap::new();
        for h in graph.bound_leaves() {
            let ty = graph.ty(h);
            leaves.insert(h, Tensor::zeros(ty.dtype, &ty.shape.resolve(batch)));
        }
        InterpBackend {
            graph,
            batch,
            arena_bytes: program.plan.arena_bytes,
            leaves,
            values: Vec::new(),
            groups: program.groups.clone(),
            checked_steps: 0,
        }
    }
}

impl Backend for InterpBackend {
    fn name(&self) -> String {
        "interp".into()
    }

    fn upload(&mut self, v: Value, t: &HostTensor) -> Result<(), RuntimeError> {
        if !self.leaves.contains_key(&v) {
            return Err(RuntimeError(format!("upload: {v} is not an input, parameter or state")));
        }
        let n = self.graph.node(v);
        let shape = n.ty.shape.resolve(self.batch);
        if t.dtype != n.ty.dtype || t.shape != shape {
            return Err(RuntimeError(format!(
                "upload to {}: expected {} {shape:?}, got {} {:?}",
                self.graph.leaf_name(v).unwrap_or("?"),
                n.ty.dtype,
                t.dtype,
                t.shape
            )));
        }
        self.leaves.insert(v, to_interp(t));
        Ok(())
    }

    fn download(&mut self, v: Value) -> Result<HostTensor, RuntimeError> {
        if let Some(t) = self.leaves.get(&v) {
            return Ok(from_interp(t));
        }
        match self.values.get(v.index()).and_then(|t| t.as_ref()) {
            Some(t) => Ok(from_interp(t)),
            None => Err(RuntimeError(format!("download: {v} has no value (run a step first)"))),
        }
    }

    fn step(&mut self) -> Result<(), RuntimeError> {
        let values = evaluate(&self.graph, self.batch, &self.leaves).map_err(RuntimeError)?;
        for (h, target) in self.graph.assigns() {
            let new =
                values[h.index()].as_ref().ok_or_else(|| RuntimeError(format!("{h} was not computed")))?;
            // Persistent buffers are f32 in every back end: round as storing them would.
            self.leaves.insert(target, to_interp(&from_interp(new)));
        }
        self.values = values;
        Ok(())
    }

    /// Evaluates the whole step, then names the first node in graph order (a topological
    /// order, so before every user) whose value rounds to a non-finite f32; the step's
    /// updates are applied only when every value is finite.
    fn step_checked(&mut self) -> Result<Option<NonFinite>, RuntimeError> {
        self.checked_steps += 1;
        let values = evaluate(&self.graph, self.batch, &self.leaves).map_err(RuntimeError)?;
        for (h, n) in self.graph.nodes.iter() {
            if n.op.is_leaf() {
                continue;
            }
            let Some(t) = values[h.index()].as_ref() else { continue };
            let Some((element, found)) = crate::numerics::first_non_finite_host(&from_interp(t)) else {
                continue;
            };
            // A node no group computes is not part of the compiled step.
            let Some(group) = self.groups.iter().position(|g| g.nodes.contains(&h)) else { continue };
            self.values = values;
            return Ok(Some(NonFinite { group, value: h, element, found }));
        }
        self.values = values;
        for (h, target) in self.graph.assigns() {
            let new = self.values[h.index()]
                .as_ref()
                .ok_or_else(|| RuntimeError(format!("{h} was not computed")))?;
            self.leaves.insert(target, to_interp(&from_interp(new)));
        }
        Ok(None)
    }

    fn checked_steps(&self) -> u64 {
        self.checked_steps
    }

    fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    fn measured_peak_bytes(&self) -> Option<usize> {
        peak_rss_bytes()
    }
}
