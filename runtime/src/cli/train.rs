//! `cvc train FILE [--device auto|cpu|cuda] [--epochs N] [--batch N] [--out DIR]
//! [--resume | --overwrite] [--seed N] [--memory-budget SIZE] [--check-numerics off|first|always]`:
//! trains with a progress bar, writes `metrics.jsonl` and checkpoints into a locked output
//! folder (see [`crate::run_dir`] and docs/RUNS.md), and prints the memory-liveness summary.

use super::{CliError, CliResult};
use crate::data::Dataset;
use crate::session::{Device, Model};
use crate::train::{self, TrainOptions};
use cvc_compiler::ir::Mode;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Device flag values (`interp`, the reference interpreter, is hidden: for debugging).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceArg {
    /// CUDA when available, else the CPU.
    Auto,
    /// The CPU back end.
    Cpu,
    /// A CUDA GPU (an error when none is usable).
    Cuda,
    /// The f64 reference interpreter (slow).
    #[value(hide = true)]
    Interp,
}

impl From<DeviceArg> for Device {
    fn from(d: DeviceArg) -> Self {
        match d {
            DeviceArg::Auto => Device::Auto,
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda,
            DeviceArg::Interp => Device::Interp,
        }
    }
}

/// Arguments of `cvc train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
    /// Where to run (default: the train section's `device`, else auto).
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Number of epochs (default: the train section's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub epochs: Option<u64>,
    /// Batch size (default: the train section's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: Option<u64>,
    /// Output folder for metrics.jsonl and checkpoints (default: runs/<model>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue the run in OUT from its checkpoints (the model, batch, seed and data must be
    /// the ones it was trained with).
    #[arg(long, conflicts_with = "overwrite")]
    pub resume: bool,
    /// Replace the run in a non-empty OUT (metrics.jsonl and checkpoints; other files stay).
    #[arg(long)]
    pub overwrite: bool,
    /// Seed of initialisation, split and shuffling (default: the train section's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Memory budget for the plan, e.g. 512MiB, 2GB or a byte count: the run stops before
    /// allocating when the plan (with recomputation) does not fit, as `cvc plan` does.
    #[arg(long, value_parser = super::plan::parse_budget)]
    pub memory_budget: Option<u64>,
    /// No progress bar or per-epoch lines (metrics.jsonl is still written).
    #[arg(long, short)]
    pub quiet: bool,
    /// Scan what every kernel writes for NaN/Inf and name the first one's op, line and sample:
    /// `first` checks the first 3 steps (and re-checks a non-finite validation batch),
    /// `always` every step (slow), `off` none (docs/NUMERICS.md).
    #[arg(long, value_enum, default_value = "first")]
    pub check_numerics: crate::numerics::CheckNumerics,
    /// Numerics on the GPU (default: the train section's `precision`): fp32, tf32 (tensor-core
    /// contractions), bf16 or fp16 (activations stored in 16 bits; docs/PRECISION.md). The
    /// CPU back end computes in f32 whatever this says.
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionArg>,
}

/// `--precision` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrecisionArg {
    /// fp32 everywhere.
    Fp32,
    /// TF32 tensor cores for contractions.
    Tf32,
    /// bfloat16 activations, f32 weights and optimizer state.
    Bf16,
    /// IEEE half activations with dynamic loss scaling.
    Fp16,
}

impl From<PrecisionArg> for cvc_compiler::config::Precision {
    fn from(p: PrecisionArg) -> Self {
        use cvc_compiler::config::Precision;
        match p {
            PrecisionArg::Fp32 => Precision::Fp32,
            PrecisionArg::Tf32 => Precision::Tf32,
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::Fp16 => Precision::Fp16,
        }
    }
}

/// Loads and checks a model, printing diagnostics on failure.
pub fn load_model(path: &Path) -> Result<Model, CliError> {
    Model::from_file(path).map_err(|e| match e {
        crate::session::ModelError::Diagnostics { .. } => {
            err!("{}", e.render(std::io::stderr().is_terminal()));
            errln!("error: could not compile `{}`", path.display());
            CliError::Reported
        }
        crate::session::ModelError::Message(m) => CliError::Message(m),
    })
}

/// Runs `cvc train`.
pub fn run(args: &TrainArgs) -> CliResult {
    let model = load_model(&args.file)?;
    let cfg = model.config().clone();
    if !model.has_train_section() {
        errln!(
            "note: {} has no train section for {}; using the defaults (synthetic random data)",
            args.file.display(),
            model.name()
        );
    }
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("runs").join(model.name()));
    let mut opts = TrainOptions::from_model(&model, out);
    if let Some(d) = args.device {
        opts.device = d.into();
    }
    if let Some(e) = args.epochs {
        opts.epochs = e as usize;
    }
    if let Some(b) = args.batch {
        opts.batch = b as usize;
    }
    if let Some(s) = args.seed {
        opts.seed = s;
    }
    if args.memory_budget.is_some() {
        opts.memory_budget = args.memory_budget;
    }
    opts.resume = args.resume;
    opts.overwrite = args.overwrite;
    opts.check_numerics = args.check_numerics;
    if let Some(p) = args.precision {
        opts.precision = p.into();
    }
    opts.verbose = !args.quiet;
    if opts.memory_budget.is_some() {
        // Before the data is read or generated (which can take longer than compiling): a plan
        // over the budget stops here, as in `cvc plan`. The session compiles it again.
        let mode = if model.train_graph().loss.is_some() { Mode::Train } else { Mode::Eval };
        let device = crate::session::resolve_device(opts.device).map_err(|e| CliError::Message(e.0))?.0;
        let half = crate::session::storage_on(device, opts.precision).0;
        model
            .compile_stored(mode, opts.batch, opts.memory_budget, half)
            .map_err(|e| CliError::Message(e.0))?;
    }
    let data = Dataset::from_source(&cfg.data, model.dir(), model.inputs()).map_err(CliError::Message)?;
    if opts.verbose {
        outln!(
            "training {} on {} samples ({} train / {} validation), batch {}, {} epochs -> {}",
            model.name(),
            data.len,
            (cfg.split * data.len as f64).round() as usize,
            data.len - ((cfg.split * data.len as f64).round() as usize).min(data.len),
            opts.batch,
            opts.epochs,
            opts.out.display()
        )?;
    }
    let summary = train::train(&model, &data, &opts).map_err(|e| CliError::Message(e.0))?;
    if opts.verbose {
        out!("{}", summary.memory_report)?;
        outln!(
            "checkpoints: {}/last.safetensors, {}/best.safetensors",
            opts.out.display(),
            opts.out.display()
        )?;
    }
    Ok(())
}
