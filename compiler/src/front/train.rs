//! The checked `train` section: data source, split, batch, epochs, optimizer, schedule, seed,
//! device, memory budget, precision.

use serde::Serialize;

/// Where training data comes from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum DataSource {
    /// The built-in synthetic RF modulation dataset (`synthetic.rf(...)`).
    SyntheticRf {
        /// Number of modulation classes (first `classes` of BPSK, QPSK, 8PSK, 16QAM, 64QAM, ...).
        classes: usize,
        /// Samples per burst.
        length: usize,
        /// SNR range in dB, drawn uniformly.
        snr_db: (f64, f64),
        /// Number of bursts.
        count: usize,
        /// Generator seed.
        seed: u64,
    },
    /// Synthetic random data shaped like the declared inputs (`synthetic.random(count = N)`),
    /// for benchmarks and smoke tests.
    SyntheticRandom {
        /// Number of samples.
        count: usize,
        /// Generator seed.
        seed: u64,
    },
    /// A `.npz` file whose arrays are named after the model's inputs (path relative to the
    /// `.cvnn` file).
    Npz {
        /// The path as written.
        path: String,
    },
}

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

/// Learning-rate schedule, evaluated per epoch by the runtime (the lr is a state input).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Schedule {
    /// Constant learning rate.
    Constant,
    /// Multiply by `gamma` every `every` epochs.
    Step {
        /// Period in epochs.
        every: usize,
        /// Factor.
        gamma: f64,
    },
    /// Cosine annealing from the base lr to `min_lr` over the run's epochs.
    Cosine {
        /// Final learning rate.
        min_lr: f64,
    },
}

/// Device request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum DeviceChoice {
    /// GPU when a CUDA driver and device exist, else CPU.
    Auto,
    /// CPU (Cranelift JIT).
    Cpu,
    /// CUDA GPU; an error when none exists.
    Cuda,
}

/// Matmul/conv numerics on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Precision {
    /// Plain fp32.
    Fp32,
    /// TF32 tensor cores for contractions.
    Tf32,
}

/// A checked `train` section.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrainConfig {
    /// The model trained.
    pub model: String,
    /// Data source.
    pub data: DataSource,
    /// Fraction of samples used for training; the rest validates.
    pub split: f64,
    /// Batch size.
    pub batch: usize,
    /// Epochs.
    pub epochs: usize,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// Learning-rate schedule.
    pub schedule: Schedule,
    /// Seed for initialisation, shuffling and dropout.
    pub seed: u64,
    /// Device request.
    pub device: DeviceChoice,
    /// Memory budget in bytes for the plan (rematerialise/checkpoint to fit), if any.
    pub memory_budget: Option<u64>,
    /// Contraction numerics on the GPU.
    pub precision: Precision,
}

impl TrainConfig {
    /// Defaults for a model without a `train` section (used by `cvc plan`/`run`).
    pub fn defaults(model: &str) -> Self {
        TrainConfig {
            model: model.into(),
            data: DataSource::SyntheticRandom { count: 1024, seed: 0 },
            split: 0.9,
            batch: 32,
            epochs: 1,
            optimizer: Optimizer::default(),
            schedule: Schedule::Constant,
            seed: 0,
            device: DeviceChoice::Auto,
            memory_budget: None,
            precision: Precision::Fp32,
        }
    }
}
