//! `cvc eval FILE --weights W.safetensors --data D.npz [--batch N] [--check-numerics MODE]`:
//! inference-mode loss, accuracy and confusion matrix of given weights on given data (pixel
//! accuracy and mean IoU for a segmentation model).

use super::train::{load_model, DeviceArg};
use super::{CliError, CliResult};
use crate::data::synthetic_polsar::CLASSES as POLSAR_CLASSES;
use crate::data::synthetic_rf::MODULATIONS;
use crate::data::synthetic_sar::SHAPES;
use crate::data::Dataset;
use crate::metrics::Confusion;
use crate::session::{Device, SessionOptions};
use crate::train::{validate, Classifier};
use cvc_compiler::front::train::DataSource;
use std::path::PathBuf;

/// Arguments of `cvc eval`.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
    /// Parameters and state as safetensors (e.g. runs/<model>/best.safetensors).
    #[arg(long)]
    pub weights: PathBuf,
    /// Input arrays as `.npz`, named after the model's inputs.
    #[arg(long)]
    pub data: PathBuf,
    /// Samples per evaluation batch.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// Where to run.
    #[arg(long, value_enum, default_value = "auto")]
    pub device: DeviceArg,
    /// NaN/Inf checks: `first` re-runs a batch whose loss or class scores are non-finite in
    /// check mode to name the op, line and sample; `always` checks every batch; `off` reports
    /// the batch only.
    #[arg(long, value_enum, default_value = "first")]
    pub check_numerics: crate::numerics::CheckNumerics,
}

/// Runs `cvc eval`.
pub fn run(args: &EvalArgs) -> CliResult {
    let model = load_model(&args.file)?;
    let data = Dataset::load_npz(&args.data, model.eval_inputs()).map_err(CliError::Message)?;
    let mut opts = SessionOptions::from_config(model.config());
    opts.device = Device::from(args.device);
    let mut session = model.session_with(&opts).map_err(|e| CliError::Message(e.0))?;
    if let Some(n) = session.note() {
        errln!("note: {n}");
    }
    session.load_weights(&args.weights).map_err(|e| CliError::Message(e.0))?;
    let weights = args.weights.display().to_string();
    if let Some(e) = session.non_finite_state(&weights).map_err(|e| CliError::Message(e.0))? {
        return Err(CliError::Message(e.0));
    }
    let classifier = Classifier::find(&model);
    let all: Vec<usize> = (0..data.len).collect();
    let (loss, cm) =
        validate(&mut session, &data, &all, args.batch as usize, classifier.as_ref(), args.check_numerics)
            .map_err(|e| CliError::Message(format!("{}: {}", args.data.display(), e.0)))?;
    outln!("{} samples of {}", data.len, args.data.display())?;
    if let Some(l) = loss {
        outln!("loss      {l:.6}")?;
    }
    match (cm, &classifier) {
        (Some(cm), Some(c)) if data.array(&c.label).is_some() && c.segments => {
            print_segmentation(&cm, &model, c)
        }
        (Some(cm), Some(c)) if data.array(&c.label).is_some() => print_confusion(&cm, &model, c.classes),
        _ => outln!("(no class labels: accuracy needs a `class[B] of N` input and a [B, N] real output)"),
    }
}

/// Pixel accuracy and mean IoU of a segmentation model (labels with spatial axes), then the
/// per-pixel confusion matrix.
fn print_segmentation(cm: &Confusion, model: &crate::session::Model, c: &Classifier) -> CliResult {
    let skipped = c.ignore_index.map(|k| format!(", label {k} ignored")).unwrap_or_default();
    outln!(
        "pixel accuracy  {:.2}%  ({} of {} pixels{skipped})",
        100.0 * cm.accuracy(),
        (cm.accuracy() * cm.total() as f64).round(),
        cm.total()
    )?;
    outln!("mean IoU        {:.2}%", 100.0 * cm.mean_iou())?;
    // synthetic.polsar's classes have names (the scattering mechanisms).
    let polsar = matches!(model.config().data, DataSource::SyntheticPolsar { .. })
        && c.classes <= POLSAR_CLASSES.len();
    let names: Vec<String> =
        (0..c.classes).map(|i| if polsar { POLSAR_CLASSES[i].to_string() } else { i.to_string() }).collect();
    out!("{}", cm.render(&names))
}

fn print_confusion(cm: &Confusion, model: &crate::session::Model, classes: usize) -> CliResult {
    outln!(
        "accuracy  {:.2}%  ({} of {})",
        100.0 * cm.accuracy(),
        (cm.accuracy() * cm.total() as f64).round(),
        cm.total()
    )?;
    let rf = matches!(model.config().data, DataSource::SyntheticRf { .. }) && classes <= MODULATIONS.len();
    let sar = matches!(model.config().data, DataSource::SyntheticSar { .. }) && classes <= SHAPES.len();
    let names: Vec<String> = (0..classes)
        .map(|i| {
            if rf {
                MODULATIONS[i].to_string()
            } else if sar {
                SHAPES[i].to_string()
            } else {
                i.to_string()
            }
        })
        .collect();
    out!("{}", cm.render(&names))
}
