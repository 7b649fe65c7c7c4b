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
}
