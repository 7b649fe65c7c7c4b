//! What a training step is compiled with, beside the model: the optimizer whose update the
//! `optimizer` pass appends, and the numerics of contractions on the GPU.
//!
//! These are compiler concepts, read by passes and back ends; the front end fills them from a
//! `train` section (`front::train_check`), and an embedder may build them directly.

use serde::Serialize;

/// Optimizer algorithm. Complex parameters are treated as R² (as PyTorch does).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum OptimizerKind {
    /// SGD with optional (Nesterov) momentum, PyTorch semantics.
    Sgd {
        /// Momentum factor (0 = plain SGD).
        momentum: f64,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// Adam (L2 weight decay added to the gradient, as torch.optim.Adam).
    Adam {
        /// β₁.
        beta1: f64,
        /// β₂.
        beta2: f64,
        /// ε.
        eps: f64,
    },
    /// AdamW (decoupled weight decay, as torch.optim.AdamW).
    AdamW {
        /// β₁.
        beta1: f64,
        /// β₂.
        beta2: f64,
        /// ε.
        eps: f64,
    },
}

/// Optimizer with its learning rate and weight decay.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Optimizer {
    /// The algorithm.
    pub kind: OptimizerKind,
    /// Base learning rate.
    pub lr: f64,
    /// Weight decay (L2 for sgd/adam, decoupled for adamw).
    pub weight_decay: f64,
}

impl Default for Optimizer {
    fn default() -> Self {
        Optimizer { kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false }, lr: 1e-2, weight_decay: 0.0 }
    }
}

/// Matmul/conv numerics on the GPU (an input of CUDA code generation: see
/// [`crate::target::CudaTarget`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Precision {
    /// Plain fp32.
    #[default]
    Fp32,
    /// TF32 tensor cores for contractions.
    Tf32,
    /// Activations, their gradients and saved forward values stored as bfloat16 (complex: a
    /// pair), computed in f32; contractions on tensor cores with f32 accumulation; parameters,
    /// their gradients, optimizer state and reductions in f32.
    Bf16,
    /// As [`Precision::Bf16`] with IEEE half floats, and dynamic loss scaling (skipped steps
    /// are reported).
    Fp16,
}

impl Precision {
    /// Every precision, in the order the docs list them.
    pub const ALL: [Precision; 4] = [Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16];
    /// The train section's spelling (`fp32`, `tf32`, `bf16`, `fp16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }
    /// The precision spelled `name`.
    pub fn from_name(name: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.name() == name)
    }
    /// How activations are stored on the GPU under this precision.
    pub fn storage(self) -> crate::ir::Storage {
        match self {
            Precision::Fp32 | Precision::Tf32 => crate::ir::Storage::Full,
            Precision::Bf16 => crate::ir::Storage::Bf16,
            Precision::Fp16 => crate::ir::Storage::F16,
        }
    }
    /// Whether contractions run on tensor cores (TF32 `mma.sync` with f32 accumulation: a
    /// bf16 or fp16 operand widens to a TF32 number exactly, so the products are the ones a
    /// 16-bit MMA would form).
    pub fn tensor_cores(self) -> bool {
        self != Precision::Fp32
    }
}
