//! `cvc run FILE --weights W.safetensors --data D.npz [--grads OUT.safetensors] [--out OUT.npz]`
//! `[--check-numerics off|first|always]`:
//! one forward + backward pass over the whole data file as one batch, from given weights;
//! prints the loss and writes the outputs (and the loss) and the parameter gradients, for
//! checking cvc against another framework.

use super::train::{load_model, DeviceArg};
use super::{CliError, CliResult};
use crate::backend::{HostData, HostTensor};
use crate::checkpoint;
use crate::data::{npy, Dataset};
use crate::numerics::CheckNumerics;
use crate::session::{Device, SessionOptions};
use cvc_compiler::ir::DType;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Arguments of `cvc run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
    /// Parameters (and optionally state) as safetensors.
    #[arg(long)]
    pub weights: PathBuf,
    /// Input arrays as `.npz`, named after the model's inputs; all samples form one batch.
    #[arg(long)]
    pub data: PathBuf,
    /// Write the parameter gradients here (safetensors, names as the parameters).
    #[arg(long)]
    pub grads: Option<PathBuf>,
    /// Write the outputs and the loss here (`.npz`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where to run.
    #[arg(long, value_enum, default_value = "auto")]
    pub device: DeviceArg,
    /// Scan what every kernel writes for NaN/Inf and name the first one's op, line and sample
    /// (`first` and `always` check the one step; `off` reports a non-finite loss unlocated).
    #[arg(long, value_enum, default_value = "first")]
    pub check_numerics: CheckNumerics,
}

/// Runs `cvc run`.
pub fn run(args: &RunArgs) -> CliResult {
    let model = load_model(&args.file)?;
    let data = Dataset::load_npz(&args.data, model.inputs()).map_err(CliError::Message)?;
    let mut opts = SessionOptions::from_config(model.config());
    opts.device = Device::from(args.device);
    opts.batch = data.len;
    let mut session = model.session_with(&opts).map_err(|e| CliError::Message(e.0))?;
    if let Some(n) = session.note() {
        errln!("note: {n}");
    }
    session.load_weights(&args.weights).map_err(|e| CliError::Message(e.0))?;
    let weights = args.weights.display().to_string();
    if let Some(e) = session.non_finite_state(&weights).map_err(|e| CliError::Message(e.0))? {
        return Err(CliError::Message(e.0));
    }
    let all: Vec<usize> = (0..data.len).collect();
    let inputs = data.gather(&all);
    let report = if args.check_numerics == CheckNumerics::Off {
        session.train_step(&inputs).map_err(|e| CliError::Message(e.0))?
    } else {
        session.train_step_checked(&inputs).map_err(|f| {
            CliError::Message(format!("{}: {}", args.data.display(), f.render(Some(all.as_slice()))))
        })?
    };
    if !report.loss.is_finite() {
        return Err(CliError::Message(format!(
            "{}: the loss is {} (rerun with --check-numerics first to name the op that made it)",
            args.data.display(),
            report.loss
        )));
    }
    outln!("loss {:.8}  ({} samples, {})", report.loss, data.len, session.device_name())?;
    if let Some(path) = &args.grads {
        let grads = session.gradients().map_err(|e| CliError::Message(e.0))?;
        let mut meta = BTreeMap::new();
        meta.insert("loss".to_string(), format!("{:e}", report.loss));
        checkpoint::save(path, &grads, &meta).map_err(CliError::Message)?;
        outln!("wrote {} gradients to {}", grads.len(), path.display())?;
    }
    if let Some(path) = &args.out {
        let loss = HostTensor { dtype: DType::F32, shape: vec![], data: HostData::F32(vec![report.loss]) };
        let mut arrays: Vec<(&str, &HostTensor)> =
            report.outputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        if !report.outputs.iter().any(|(n, _)| n == "loss") {
            arrays.push(("loss", &loss));
        }
        npy::save_npz(path, &arrays).map_err(CliError::Message)?;
        outln!(
            "wrote outputs {} to {}",
            arrays.iter().map(|a| a.0).collect::<Vec<_>>().join(", "),
            path.display()
        )?;
    }
    Ok(())
}
