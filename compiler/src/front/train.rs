//! The checked `train` section: data source, split, batch, epochs, optimizer, schedule, seed,
//! device, memory budget, precision.

use crate::config::{Optimizer, Precision};
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
    /// The built-in synthetic SAR dataset (`synthetic.sar(...)`): complex image chips of one
    /// vehicle (point scatterers, body return, radar shadow) on textured clutter.
    SyntheticSar {
        /// Number of vehicle classes (first `classes` of tank, truck, car, radar, launcher, apc).
        classes: usize,
        /// Image side in pixels.
        size: usize,
        /// Signal-to-clutter ratio range in dB, drawn uniformly.
        scr_db: (f64, f64),
        /// Looks of the clutter texture.
        looks: usize,
        /// Number of images.
        count: usize,
        /// Generator seed.
        seed: u64,
    },
    /// The built-in synthetic PolSAR segmentation dataset (`synthetic.polsar(...)`): scenes of
    /// 3-channel complex scattering vectors in random regions of `classes` scattering
    /// classes, with per-pixel labels (boundary and frame pixels unlabelled).
    SyntheticPolsar {
        /// Number of scattering classes (first `classes` of surface, double_bounce, volume,
        /// oriented, helix).
        classes: usize,
        /// Scene side in pixels.
        size: usize,
        /// Voronoi regions per scene.
        regions: usize,
        /// Per-region gain range in dB (±).
        gain_db: f64,
        /// Distance of the class covariances from their mean, in (0, 1].
        contrast: f64,
        /// Number of scenes.
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
    /// The built-in synthetic 3-D MRI dataset (`synthetic.mri3d(...)`): ellipsoid phantom
    /// volumes with a smooth phase, their undersampled k-space and the sampling mask.
    SyntheticMri3d {
        /// Slices per volume.
        depth: usize,
        /// Height and width of a volume.
        size: usize,
        /// Acceleration (about `1 / accel` of the phase-encoding lines kept).
        accel: f64,
        /// Number of volumes.
        count: usize,
        /// Generator seed.
        seed: u64,
    },
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
    /// `recompute = auto` (true, the default): the planner recomputes cheap stored values in
    /// the backward pass wherever that shrinks the arena; `budget` (false): only what a memory
    /// budget needs (`passes::pipeline::Options::cheap_remat`).
    pub cheap_remat: bool,
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
            cheap_remat: true,
        }
    }
}
