//! The training loop: epochs of shuffled batches, validation, the learning-rate schedule,
//! `metrics.jsonl`, atomic checkpoints (`last`, `best`), exact resume, and the
//! memory-liveness summary.
//!
//! Determinism: initial values depend on `(seed, leaf name)`, the train/validation split
//! on the seed, the batch order of epoch `e` on `(seed, e)`, and every other bit of state
//! (parameters, optimizer moments, step counters, running statistics) is in the checkpoint,
//! so a run resumed from `last.safetensors` computes exactly the losses of an
//! uninterrupted run on a deterministic back end.
//!
//! An epoch ends by writing `best` (when it improved), then `last`, then its line of
//! `metrics.jsonl`, and only then printing its summary: a full stdout or log disk cannot
//! cost a checkpoint, and a crash at any point leaves a pair `--resume` continues exactly
//! (the invariant and its repair are in [`crate::run_dir`]). The checkpoint metadata
//! records what makes a resume exact — the seed, the batch, a hash of the model's training
//! graph, its optimizer, schedule, split and precision, and a hash of the data — and
//! `--resume` refuses a checkpoint that differs, saying what differs. (The epoch count is
//! not checked: a run may be resumed with more epochs; a cosine schedule then follows the
//! new total.)

use crate::backend::{HostData, HostTensor, RuntimeError};
use crate::data::{self, Dataset};
use crate::metrics::{self, Confusion, EpochMetrics, StepPhases};
use crate::numerics::CheckNumerics;
use crate::run_dir::{self, Reuse, RunDir};
use crate::session::{Batch, Device, Model, Session, SessionOptions, StagedBatch, StepFailure};
use cvc_compiler::config::Precision;
use cvc_compiler::front::train::Schedule;
use cvc_compiler::ir::DType;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Settings of a training run (the `train` section, overridden by command-line flags).
#[derive(Clone, Debug, PartialEq)]
pub struct TrainOptions {
    /// Device request.
    pub device: Device,
    /// Number of epochs (the total, also when resuming).
    pub epochs: usize,
    /// Batch size.
    pub batch: usize,
    /// Seed of initialisation, split and shuffling.
    pub seed: u64,
    /// Memory budget for the plan, in bytes.
    pub memory_budget: Option<u64>,
    /// Output folder: `metrics.jsonl`, `last.safetensors`, `best.safetensors`.
    pub out: PathBuf,
    /// Continue from `out/last.safetensors`.
    pub resume: bool,
    /// Replace the run files in a non-empty `out` (without it, and without `resume`, a
    /// non-empty folder is refused).
    pub overwrite: bool,
    /// Draw a progress bar and print a line per epoch.
    pub verbose: bool,
    /// Which steps are checked for NaN and infinities (`--check-numerics`).
    pub check_numerics: CheckNumerics,
    /// Numerics on the GPU (`precision`, `--precision`).
    pub precision: Precision,
}

impl TrainOptions {
    /// The options a model's `train` section gives, writing to `out`.
    pub fn from_model(model: &Model, out: PathBuf) -> Self {
        let c = model.config();
        TrainOptions {
            device: c.device.into(),
            epochs: c.epochs,
            batch: c.batch,
            seed: c.seed,
            memory_budget: c.memory_budget,
            out,
            resume: false,
            overwrite: false,
            verbose: false,
            check_numerics: CheckNumerics::default(),
            precision: c.precision,
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainSummary {
    /// One record per epoch run by this call (a resumed run omits the earlier ones).
    pub epochs: Vec<EpochMetrics>,
    /// The memory-liveness summary text.
    pub memory_report: String,
    /// The device used.
    pub device: String,
    /// Steps run in check mode (`--check-numerics`), training and validation.
    pub checked_steps: u64,
    /// Host memory outside the arena, itemised as in the memory report (label, bytes).
    pub outside_arena: Vec<(String, usize)>,
}

/// The learning rate of epoch `epoch` (0-based) of `epochs`: constant, step decay
/// (`lr·γ^⌊e/every⌋`), or cosine annealing to `min_lr` (PyTorch's `CosineAnnealingLR` with
/// `T_max = epochs`, stepped per epoch).
pub fn lr_at(schedule: &Schedule, base: f64, epoch: usize, epochs: usize) -> f64 {
    match *schedule {
        Schedule::Constant => base,
        Schedule::Step { every, gamma } => base * gamma.powi((epoch / every.max(1)) as i32),
        Schedule::Cosine { min_lr } => {
            let t = epoch as f64 / epochs.max(1) as f64;
            min_lr + 0.5 * (base - min_lr) * (1.0 + (std::f64::consts::PI * t).cos())
        }
    }
}

/// Which output holds class scores and which input holds labels, when the model classifies
/// (one label per sample) or segments (one label per pixel).
#[derive(Clone, Debug, PartialEq)]
pub struct Classifier {
    /// Name of the real `[B, classes, ...spatial]` output.
    pub output: String,
    /// Name of the label input (`class[B, ...spatial] of classes`).
    pub label: String,
    /// Number of classes.
    pub classes: usize,
    /// Labels per sample: 1 for a classifier, the pixel count for a segmentation model.
    pub pixels: usize,
    /// Whether the labels have spatial axes (pixel accuracy and mean IoU).
    pub segments: bool,
    /// The label value never counted (the loss's `ignore_index`).
    pub ignore_index: Option<i64>,
}

impl Classifier {
    /// Finds the classification output of a model: the first real output of shape
    /// `[B, classes, ...spatial]` where some input is `class[B, ...spatial] of classes`.
    pub fn find(model: &Model) -> Option<Classifier> {
        let label = model.inputs().iter().find(|i| i.classes.is_some())?;
        let classes = label.classes?;
        let spatial = label.sample_shape().ok()?;
        let mut want = vec![1, classes];
        want.extend(&spatial);
        let g = model.eval_graph();
        let out = g.outputs.iter().find(|o| {
            let t = g.ty(o.value);
            t.dtype == DType::F32 && t.shape.resolve(1) == want
        })?;
        Some(Classifier {
            output: out.name.clone(),
            label: label.name.clone(),
            classes,
            pixels: spatial.iter().product(),
            segments: !spatial.is_empty(),
            ignore_index: label.ignore_index,
        })
    }

    /// An empty confusion matrix for this model's classes.
    pub fn confusion(&self) -> Confusion {
        Confusion::ignoring(self.classes, self.ignore_index)
    }

    /// Adds a batch's outputs and labels to a confusion matrix.
    pub fn add(&self, cm: &mut Confusion, outputs: &[(String, HostTensor)], inputs: &[(String, HostTensor)]) {
        let logits = outputs.iter().find(|(n, _)| *n == self.output).map(|(_, t)| &t.data);
        let labels = inputs.iter().find(|(n, _)| *n == self.label).map(|(_, t)| &t.data);
        if let (Some(HostData::F32(l)), Some(HostData::I32(y))) = (logits, labels) {
            if self.segments {
                cm.add_pixels(l, y, self.pixels);
            } else {
                cm.add(l, y);
            }
        }
    }
}

/// Validation over `indices` in chunks of `batch` (the last chunk at its own size).
/// Returns the sample-weighted mean loss and the confusion matrix.
///
/// A non-finite loss (or non-finite class scores) is an error, never a `null` in the
/// metrics: the chunk is evaluated again in check mode (unless `check` is off) so the error
/// names the op, its `.cvnn` line and the dataset sample that made it. With
/// [`CheckNumerics::Always`] every chunk is checked.
pub fn validate(
    session: &mut Session,
    data: &Dataset,
    indices: &[usize],
    batch: usize,
    classifier: Option<&Classifier>,
    check: CheckNumerics,
) -> Result<(Option<f64>, Option<Confusion>), RuntimeError> {
    if indices.is_empty() {
        return Ok((None, None));
    }
    let mut cm = classifier.map(|c| c.confusion());
    let mut loss_sum = 0.0;
    let mut have_loss = true;
    for chunk in indices.chunks(batch.max(1)) {
        let inputs = data.gather(chunk);
        let located =
            |f: StepFailure| RuntimeError(format!("{}: {}", samples_text(chunk), f.render(Some(chunk))));
        let r = if check == CheckNumerics::Always {
            session.evaluate_checked(&inputs).map_err(located)?
        } else {
            session.evaluate(&inputs)?
        };
        let scores_bad = classifier.is_some_and(|c| {
            r.outputs
                .iter()
                .any(|(n, t)| *n == c.output && crate::numerics::first_non_finite_host(t).is_some())
        });
        if r.loss.is_some_and(|l| !l.is_finite()) || scores_bad {
            let what = match r.loss {
                Some(l) if !l.is_finite() => format!("the loss is {l}"),
                _ => "the class scores are not finite".to_string(),
            };
            if check != CheckNumerics::Off {
                session.evaluate_checked(&inputs).map_err(located)?;
            }
            return Err(RuntimeError(format!(
                "{}: {what} (run with --check-numerics first or always to find the op that made it)",
                samples_text(chunk)
            )));
        }
        match r.loss {
            Some(l) => loss_sum += l as f64 * chunk.len() as f64,
            None => have_loss = false,
        }
        if let (Some(c), Some(cm)) = (classifier, cm.as_mut()) {
            c.add(cm, &r.outputs, &inputs);
        }
    }
    let loss = have_loss.then(|| loss_sum / indices.len() as f64);
    Ok((loss, cm))
}

/// `evaluating dataset samples 40..=47` (a chunk's dataset indices as a range when contiguous,
/// else their count: the finding names the sample itself).
fn samples_text(chunk: &[usize]) -> String {
    match (chunk.first(), chunk.last()) {
        (Some(a), Some(b)) if b - a + 1 == chunk.len() => format!("evaluating dataset samples {a}..={b}"),
        _ => format!("evaluating {} dataset samples", chunk.len()),
    }
}

/// Trains `model` on `data`. Writes `metrics.jsonl` and checkpoints into `opts.out`.
pub fn train(model: &Model, data: &Dataset, opts: &TrainOptions) -> Result<TrainSummary, RuntimeError> {
    let cfg = model.config();
    let reuse = match (opts.resume, opts.overwrite) {
        (true, _) => Reuse::Resume,
        (false, true) => Reuse::Overwrite,
        (false, false) => Reuse::Fresh,
    };
    // Held (locked) until this function returns.
    let run = RunDir::open(&opts.out, reuse).map_err(RuntimeError)?;
    let sopts = SessionOptions {
        device: opts.device,
        batch: opts.batch,
        seed: opts.seed,
        memory_budget: opts.memory_budget,
        precision: opts.precision,
    };
    // Before the session allocates an arena for the batch.
    let split = data::split(data.len, cfg.split, opts.seed);
    if split.train.len() < opts.batch {
        return Err(RuntimeError(format!(
            "the training set has {} samples (split = {} of {}), fewer than one batch of {}",
            split.train.len(),
            cfg.split,
            data.len,
            opts.batch
        )));
    }
    let mut session = model.session_with(&sopts)?;
    if let (Some(n), true) = (session.note(), opts.verbose) {
        crate::cli::write_err(&format!("note: {n}\n"));
    }
    let classifier = Classifier::find(model);
    let metrics_path = run.file(run_dir::METRICS);
    let last_path = run.file(run_dir::LAST);
    let best_path = run.file(run_dir::BEST);
    let identity = run_identity(model, data, opts);

    let mut start = 0;
    let mut best: Option<f64> = None;
    let mut best_epoch: Option<usize> = None;
    if opts.resume {
        let rp = run_dir::resume_point(&run).map_err(RuntimeError)?;
        check_identity(&rp.checkpoint.metadata, &identity, &rp.file)?;
        session.load_checkpoint(&rp.checkpoint, &rp.file)?;
        start = rp.epoch;
        best = rp.best_score;
        best_epoch = rp.best_epoch;
        run_dir::repair_metrics(&metrics_path, start, rp.checkpoint.meta("metrics")).map_err(RuntimeError)?;
    }

    let steps = split.train.len() / opts.batch;
    let mut records = Vec::new();
    // Steps of this run so far: `--check-numerics first` checks the first few.
    let mut run_step = 0;
    for epoch in start..opts.epochs {
        let lr = lr_at(&cfg.schedule, cfg.optimizer.lr, epoch, opts.epochs);
        session.set_lr(lr as f32)?;
        let order = data::epoch_order(&split.train, opts.seed, epoch);
        let bar = progress_bar(steps, epoch, opts.epochs, opts.verbose);
        let skipped_before = session.loss_scaling()?.map(|(_, k)| k);
        let mut loss_sum = 0.0;
        let mut times = Vec::with_capacity(steps);
        let mut phases = Vec::with_capacity(steps);
        let mut train_cm = classifier.as_ref().map(|c| c.confusion());
        let t_epoch = Instant::now();
        let chunks: Vec<&[usize]> = order.chunks_exact(opts.batch).collect();
        // On a GPU the next batch is gathered and staged, and the previous step's predictions
        // counted, while the device runs the step; elsewhere that happens after the step's
        // timing. `CVC_OVERLAP=0` turns it off (to measure one against the other), and
        // `CVC_OVERLAP=1` takes the overlapped path on any back end (on the CPU it runs the
        // same work in sequence: tests compare the two paths there).
        let overlap = match std::env::var("CVC_OVERLAP").as_deref() {
            Ok("0") => false,
            Ok("1") => true,
            _ => session.overlaps(),
        };
        let mut pending = chunks.first().map(|c| StagedBatch::new(data.gather(c)));
        // The batch before the current one: its buffers take the next gather.
        let mut spare: Option<Batch> = None;
        // With overlap, the outputs of the step before the current one, whose predictions
        // (against the labels in `spare`) are counted while the device runs the current step.
        let mut uncounted: Option<Batch> = None;
        for i in 0..chunks.len() {
            let staged = pending.take().ok_or_else(|| RuntimeError("internal error: no batch".into()))?;
            let next_chunk = chunks.get(i + 1).copied();
            let checked = opts.check_numerics.checks_step(run_step);
            if !overlap || checked {
                // This step does not overlap: the previous step's predictions are counted now.
                if let (Some(outputs), Some(inputs)) = (uncounted.take(), spare.as_ref()) {
                    if let (Some(c), Some(cm)) = (&classifier, train_cm.as_mut()) {
                        c.add(cm, &outputs, inputs);
                    }
                    session.recycle_outputs(outputs);
                }
            }
            let t0 = Instant::now();
            let r = if checked {
                // Check mode: no overlap, every launch scanned. Only timed when every step is
                // checked: a few slow first steps would skew a short epoch's median.
                let r = session.train_step_checked(staged.batch()).map_err(|f| {
                    bar.abandon();
                    RuntimeError(format!(
                        "epoch {} step {} (checked by --check-numerics): {}",
                        epoch + 1,
                        i + 1,
                        f.render(Some(chunks[i]))
                    ))
                })?;
                if opts.check_numerics == CheckNumerics::Always {
                    times.push(t0.elapsed().as_secs_f64() * 1e3);
                }
                pending = next_chunk.map(|c| StagedBatch::new(data.gather_reusing(c, spare.take())));
                r
            } else if overlap {
                let mut counted = None;
                let prepare = || {
                    if let (Some(outputs), Some(inputs)) = (uncounted.take(), spare.as_ref()) {
                        if let (Some(c), Some(cm)) = (&classifier, train_cm.as_mut()) {
                            c.add(cm, &outputs, inputs);
                        }
                        counted = Some(outputs);
                    }
                    next_chunk.map(|c| data.gather_reusing(c, spare.take()))
                };
                let (r, next) = session.train_step_overlapped(&staged, prepare)?;
                times.push(t0.elapsed().as_secs_f64() * 1e3);
                phases.push(r.phases);
                if let Some(outputs) = counted {
                    session.recycle_outputs(outputs);
                }
                pending = next;
                r
            } else {
                let r = session.train_step(staged.batch())?;
                times.push(t0.elapsed().as_secs_f64() * 1e3);
                phases.push(r.phases);
                pending = next_chunk.map(|c| StagedBatch::new(data.gather_reusing(c, spare.take())));
                r
            };
            run_step += 1;
            let inputs = staged.batch();
            if !r.loss.is_finite() {
                bar.abandon();
                return Err(RuntimeError(format!(
                    "the loss became {} at epoch {} step {}; rerun with --check-numerics always to \
                     name the op, its line and the sample that made it, or try a smaller learning \
                     rate (now {lr:e})",
                    r.loss,
                    epoch + 1,
                    i + 1
                )));
            }
            loss_sum += r.loss as f64;
            if overlap && next_chunk.is_some() {
                // Counted during the next step (the last step's are counted below).
                uncounted = Some(r.outputs);
            } else {
                if let (Some(c), Some(cm)) = (&classifier, train_cm.as_mut()) {
                    c.add(cm, &r.outputs, inputs);
                }
                session.recycle_outputs(r.outputs);
            }
            let rate = ((i + 1) * opts.batch) as f64 / t_epoch.elapsed().as_secs_f64().max(1e-9);
            let acc =
                train_cm.as_ref().map(|c| format!(" acc {:.1}%", 100.0 * c.accuracy())).unwrap_or_default();
            bar.set_message(format!("loss {:.4}{acc} {rate:.0} samples/s", loss_sum / (i + 1) as f64));
            bar.inc(1);
            spare = Some(staged.into_batch());
        }
        let train_secs = t_epoch.elapsed().as_secs_f64();
        bar.finish_and_clear();
        // An update that broke the model is caught here, before anything is saved: no
        // checkpoint (last or best) ever holds a non-finite parameter.
        let kept = match epoch {
            0 => "no checkpoint was written".to_string(),
            e => format!("the checkpoints keep epoch {e}"),
        };
        let broken = format!(
            "after epoch {} (lr {lr:e}) the updates made the model non-finite; {kept}; rerun with \
             --check-numerics always to name the step, op and sample, or try a smaller learning rate",
            epoch + 1
        );
        if let Some(e) = session.non_finite_state(&broken)? {
            return Err(e);
        }
        let (val_loss, val_cm) =
            validate(&mut session, data, &split.val, opts.batch, classifier.as_ref(), opts.check_numerics)
                .map_err(|e| RuntimeError(format!("validation after epoch {}: {e}", epoch + 1)))?;
        let m = EpochMetrics {
            epoch: epoch + 1,
            train_loss: loss_sum / steps.max(1) as f64,
            train_acc: train_cm.as_ref().map(|c| c.accuracy()),
            val_loss,
            val_acc: val_cm.as_ref().map(|c| c.accuracy()),
            val_miou: val_cm
                .as_ref()
                .filter(|_| classifier.as_ref().is_some_and(|c| c.segments))
                .map(|c| c.mean_iou()),
            lr,
            step_ms: metrics::median(&times),
            step_phases_ms: StepPhases::median_of(&phases),
            samples_per_s: (steps * opts.batch) as f64 / train_secs.max(1e-9),
            planned_arena_bytes: session.plan().arena_bytes,
            measured_peak_bytes: session.measured_peak_bytes(),
            skipped_steps: None,
            loss_scale: None,
        };
        let m = match session.loss_scaling()? {
            Some((scale, skipped)) => EpochMetrics {
                skipped_steps: Some(skipped - skipped_before.unwrap_or(0).min(skipped)),
                loss_scale: Some(scale),
                ..m
            },
            None => m,
        };
        // Higher accuracy is better; without one, lower validation (or training) loss.
        let score = m.val_acc.or(m.val_loss.map(|l| -l)).unwrap_or(-m.train_loss);
        let improved = best.is_none_or(|b| score > b);
        if improved {
            best = Some(score);
            best_epoch = Some(epoch + 1);
        }
        let mut meta: BTreeMap<String, String> =
            identity.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        meta.insert("epoch".to_string(), (epoch + 1).to_string());
        meta.insert("score".to_string(), format!("{score:e}"));
        if let (Some(b), Some(e)) = (best, best_epoch) {
            meta.insert("best".to_string(), format!("{b:e}"));
            meta.insert("best_epoch".to_string(), e.to_string());
        }
        // The epoch's metrics line travels with its checkpoint, so a crash before the line
        // is appended loses nothing (`run_dir::repair_metrics`).
        meta.insert("metrics".to_string(), m.to_json_line());
        // Best before last, both before the metrics line and the printed summary: the
        // invariant of `run_dir`.
        if improved {
            session.save_checkpoint(&best_path, &meta)?;
        }
        session.save_checkpoint(&last_path, &meta)?;
        metrics::append_jsonl(&metrics_path, &m).map_err(RuntimeError)?;
        run_dir::crash_point("metrics.line");
        if opts.verbose {
            crate::cli::write_out(&format!("{}\n", epoch_line(&m, opts.epochs)))
                .map_err(|e| RuntimeError(e.to_string()))?;
        }
        records.push(m);
    }
    let outside_arena = outside_arena(&session, data, classifier.as_ref());
    let memory_report = memory_report(&session, &outside_arena);
    // What `cvc report` draws: the plan's timeline and the measured peak.
    crate::run_plan::write(&opts.out, &session).map_err(RuntimeError)?;
    Ok(TrainSummary {
        epochs: records,
        memory_report,
        device: session.device_name(),
        checked_steps: session.checked_steps(),
        outside_arena,
    })
}

/// Short hex SHA-256 of some bytes (64 bits: enough to tell runs apart, short enough to read).
fn short_hash(parts: &[&[u8]]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in parts {
        // Length-prefixed, so that parts cannot run into each other.
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// What a resumed run must share with the checkpoint to continue it exactly, as metadata
/// `(key, value)` pairs: the seed, the batch, the training graph (hashed, printed without
/// source positions, so comments and layout may change), the optimizer settings, and the
/// data (its source and a hash of its arrays).
pub fn run_identity(model: &Model, data: &Dataset, opts: &TrainOptions) -> Vec<(&'static str, String)> {
    let cfg = model.config();
    let graph = cvc_compiler::ir::print::print_graph(model.train_graph(), None);
    let optimizer = format!(
        "optimizer {}, schedule {}, split {}, precision {}",
        json(&cfg.optimizer),
        json(&cfg.schedule),
        cfg.split,
        json(&opts.precision)
    );
    let mut parts: Vec<Vec<u8>> = Vec::new();
    for (name, t) in &data.arrays {
        parts.push(name.as_bytes().to_vec());
        parts.push(format!("{} {:?}", t.dtype, t.shape).into_bytes());
        parts.push(t.as_bytes().into_owned());
    }
    let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
    vec![
        ("seed", opts.seed.to_string()),
        ("batch", opts.batch.to_string()),
        ("model_hash", short_hash(&[graph.as_bytes()])),
        ("optimizer", optimizer),
        ("data", format!("{}, {} samples", json(&cfg.data), data.len)),
        ("data_hash", short_hash(&refs)),
    ]
}

/// Compact JSON of a train-section setting (for metadata and messages).
fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("<{e}>"))
}

/// Refuses to resume from `file` when its metadata differs from this run's identity, naming
/// what differs and what to do. Keys a checkpoint lacks (written before they existed) are
/// not checked.
fn check_identity(
    meta: &BTreeMap<String, String>,
    identity: &[(&'static str, String)],
    file: &Path,
) -> Result<(), RuntimeError> {
    let mut differs = Vec::new();
    for (key, now) in identity {
        let Some(then) = meta.get(*key) else { continue };
        if then == now {
            continue;
        }
        let what = match *key {
            "seed" => format!("seed {then}, this run seed {now} (--seed)"),
            "batch" => format!("batch {then}, this run batch {now} (--batch)"),
            "model_hash" => format!(
                "a different model (training graph hash {then}, this run's {now}: layers, shapes or loss changed)"
            ),
            "optimizer" => format!("{then}; this run: {now}"),
            // The source may be spelled differently (a path from another folder): the hash decides.
            "data" if meta.get("data_hash").map(String::as_str) == identity_value(identity, "data_hash") => continue,
            "data" => format!("data {then}; this run: {now}"),
            "data_hash" if meta.get("data").map(String::as_str) != identity_value(identity, "data") => continue,
            "data_hash" => format!("data with the same description but different contents (hash {then}, this run's {now})"),
            _ => format!("{key} {then}, this run {now}"),
        };
        differs.push(what);
    }
    if differs.is_empty() {
        return Ok(());
    }
    Err(RuntimeError(format!(
        "--resume: {} was trained with {}: resume with the settings it was trained with, or start a new \
         run with --overwrite or another --out",
        file.display(),
        differs.join("; with ")
    )))
}

fn identity_value<'a>(identity: &'a [(&'static str, String)], key: &str) -> Option<&'a str> {
    identity.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str())
}

fn progress_bar(steps: usize, epoch: usize, epochs: usize, verbose: bool) -> ProgressBar {
    if !verbose {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(format!("epoch {}/{epochs}", epoch + 1));
    bar
}

/// The one-line summary of an epoch.
pub fn epoch_line(m: &EpochMetrics, epochs: usize) -> String {
    let pct = |x: Option<f64>| x.map(|a| format!(" acc {:5.1}%", 100.0 * a)).unwrap_or_default();
    let miou = m.val_miou.map(|x| format!(" mIoU {:5.1}%", 100.0 * x)).unwrap_or_default();
    let val = match m.val_loss {
        Some(l) => format!("  val loss {l:.4}{}{miou}", pct(m.val_acc)),
        None => format!("{}{miou}", pct(m.val_acc)),
    };
    format!(
        "epoch {}/{epochs}  train loss {:.4}{}{val}  lr {:.2e}  {:.2} ms/step  {:.0} samples/s",
        m.epoch,
        m.train_loss,
        pct(m.train_acc),
        m.lr,
        m.step_ms,
        m.samples_per_s
    ) + &match (m.skipped_steps, m.loss_scale) {
        (Some(k), Some(s)) => format!("  loss scale {s:e} ({k} steps skipped)"),
        _ => String::new(),
    }
}

/// What a training run holds in host memory outside the training arena (label, bytes): the
/// dataset, the gathered input batches and downloaded outputs, the metrics buffers, the
/// checkpoint copies, and what the back ends hold (inference arenas, workspaces, code).
pub fn outside_arena(
    session: &Session,
    data: &Dataset,
    classifier: Option<&Classifier>,
) -> Vec<(String, usize)> {
    let dataset: usize = data.arrays.iter().map(|(_, t)| t.bytes()).sum();
    let batch = session.batch();
    let per_sample = dataset / data.len.max(1);
    let g = &session.program().graph;
    let outputs: usize = g.outputs.iter().map(|o| g.ty(o.value).bytes(batch)).sum();
    // The loop holds the batch being trained on, the next one and a spare (whose buffers the
    // gather after next reuses), and one step's downloaded outputs.
    let batches = 3 * batch * per_sample + outputs;
    let mut items = vec![
        (format!("dataset in host memory ({} samples)", data.len), dataset),
        ("input batches (3) and step outputs".to_string(), batches),
    ];
    if let Some(c) = classifier {
        // Two sparse confusion matrices (training, validation): at most one entry per sample.
        let pairs = data.len.min(c.classes.saturating_mul(c.classes));
        items.push(("metrics (confusion counts)".to_string(), pairs * metrics::CONFUSION_ENTRY_BYTES));
    }
    // Saving a checkpoint downloads every parameter and state buffer and serialises them.
    items.push(("checkpoint copies (2 x parameters+state)".to_string(), 2 * session.plan().persistent_bytes));
    items.extend(session.host_memory());
    items
}

/// The memory-liveness summary: planned arena, lower bound, measured peak, what lives
/// outside the arena (`outside`, from [`outside_arena`]), the remainder of the measured peak
/// ("runtime and libraries"), and the tensors alive at the planned peak with the `.cvnn` line
/// that made each.
pub fn memory_report(session: &Session, outside: &[(String, usize)]) -> String {
    let plan = session.plan();
    let model = session.model();
    let g = &session.program().graph;
    let mut s = format!("memory (batch {}, {}):\n", plan.batch, session.device_name());
    s.push_str(&format!("  planned arena   {:>12}\n", metrics::human_bytes(plan.arena_bytes as u64)));
    s.push_str(&format!(
        "  lower bound     {:>12}  (fragmentation {:.1}%)\n",
        metrics::human_bytes(plan.lower_bound_bytes as u64),
        plan.fragmentation_pct()
    ));
    s.push_str(&format!(
        "  parameters+state{:>12}  (inside the arena)\n",
        metrics::human_bytes(plan.persistent_bytes as u64)
    ));
    s.push_str("  outside the arena (host memory):\n");
    for (label, bytes) in outside {
        s.push_str(&format!("    {:>12}  {label}\n", metrics::human_bytes(*bytes as u64)));
    }
    let itemised = plan.arena_bytes + outside.iter().map(|x| x.1).sum::<usize>();
    let host = session.device() != Device::Cuda;
    if host {
        s.push_str(&format!("  planned + itemised {:>9}\n", metrics::human_bytes(itemised as u64)));
    }
    match session.measured_peak_bytes() {
        Some(b) => {
            s.push_str(&format!(
                "  measured peak   {:>12}  ({})\n",
                metrics::human_bytes(b as u64),
                peak_kind(session)
            ));
            if host {
                let rest = b as i64 - itemised as i64;
                let sign = if rest < 0 { "-" } else { "" };
                s.push_str(&format!(
                    "  runtime and libraries {sign}{}  (measured - planned - itemised: binary, allocator, compiler)\n",
                    metrics::human_bytes(rest.unsigned_abs())
                ));
            }
        }
        None => s.push_str("  measured peak   unknown\n"),
    }
    let mut live: Vec<(usize, String)> = plan
        .live_at_peak
        .iter()
        .map(|&v| {
            let bytes = plan.slot(v).map(|sl| sl.bytes).unwrap_or_else(|| g.bytes(v, plan.batch));
            let n = g.node(v);
            let line = model.line_of(g.span(v));
            let ty = format!("{}{:?}", g.stored_name(v), n.ty.shape.resolve(plan.batch));
            (
                bytes,
                format!(
                    "{:>10}  {ty:<22} {:<34} line {line}",
                    metrics::human_bytes(bytes as u64),
                    n.origin.label
                ),
            )
        })
        .collect();
    live.sort_by_key(|x| std::cmp::Reverse(x.0));
    s.push_str(&format!(
        "  alive at the peak (step {} of {}): {} tensors\n",
        plan.peak_step + 1,
        session.program().order.len(),
        live.len()
    ));
    for (_, l) in live.iter().take(12) {
        s.push_str(&format!("    {l}\n"));
    }
    if live.len() > 12 {
        let rest: usize = live[12..].iter().map(|x| x.0).sum();
        s.push_str(&format!("    ... {} more ({})\n", live.len() - 12, metrics::human_bytes(rest as u64)));
    }
    s
}

fn peak_kind(session: &Session) -> &'static str {
    match session.device() {
        Device::Cuda => "device memory",
        _ => "peak RSS of the process",
    }
}
