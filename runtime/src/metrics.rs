//! Training metrics: per-epoch records (`metrics.jsonl`), step timing, accuracy and
//! confusion matrices, and peak-memory measurement.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

/// One line of `metrics.jsonl`: what an epoch did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpochMetrics {
    /// Epoch number, from 1.
    pub epoch: usize,
    /// Mean training loss over the epoch's steps.
    pub train_loss: f64,
    /// Training accuracy over the epoch, when the model classifies.
    pub train_acc: Option<f64>,
    /// Mean validation loss (`null` without a validation set).
    pub val_loss: Option<f64>,
    /// Validation accuracy, when the model classifies and a validation set exists (per pixel
    /// for a segmentation model, ignored pixels excluded).
    pub val_acc: Option<f64>,
    /// Mean intersection over union of the validation set's classes, for a segmentation
    /// model (labels with spatial axes); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_miou: Option<f64>,
    /// Learning rate used in the epoch.
    pub lr: f64,
    /// Median wall time of one training step, in milliseconds.
    pub step_ms: f64,
    /// Training samples per second over the epoch.
    pub samples_per_s: f64,
    /// Arena bytes of the training program's plan.
    pub planned_arena_bytes: usize,
    /// Measured peak bytes (CPU: peak resident set of the process; CUDA: device memory).
    pub measured_peak_bytes: Option<usize>,
    /// Under dynamic loss scaling (`precision = fp16`): training steps skipped in this epoch
    /// because a gradient overflowed (the update kept the old values).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped_steps: Option<u64>,
    /// Under dynamic loss scaling: the loss scale at the epoch's end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// Where the training steps' wall time went: the median of each phase over the epoch's
    /// timed steps (absent when no step was timed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_phases_ms: Option<StepPhases>,
}

/// Where one training step's wall time goes on the host, in milliseconds. The phases run one
/// after another and add up to the step's time (`step_ms` is their sum's median, up to the
/// loop's bookkeeping).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StepPhases {
    /// Copying the batch into the arena (from page-locked staging memory when it was staged
    /// during the previous step) and the step's counters.
    pub upload: f64,
    /// Starting the step's kernels. A back end that computes on the calling thread (the CPU)
    /// runs the whole step here.
    pub launch: f64,
    /// Host work overlapped with the device's step: gathering and staging the next batch,
    /// counting the previous step's predictions. Time the device spends idle, if this takes
    /// longer than the step's kernels, shows as a short `wait`.
    pub overlapped: f64,
    /// Waiting for the device to finish the step.
    pub wait: f64,
    /// Reading the loss and the model's outputs back to the host.
    pub download: f64,
}

impl StepPhases {
    /// The per-phase medians of a list of steps' phases.
    pub fn median_of(steps: &[StepPhases]) -> Option<StepPhases> {
        if steps.is_empty() {
            return None;
        }
        let m = |f: fn(&StepPhases) -> f64| median(&steps.iter().map(f).collect::<Vec<_>>());
        Some(StepPhases {
            upload: m(|p| p.upload),
            launch: m(|p| p.launch),
            overlapped: m(|p| p.overlapped),
            wait: m(|p| p.wait),
            download: m(|p| p.download),
        })
    }
}

impl EpochMetrics {
    /// The record as one JSON line (no trailing newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("metrics serialise")
    }
}

/// Appends one record to a `metrics.jsonl` file.
pub fn append_jsonl(path: &Path, m: &EpochMetrics) -> Result<(), String> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{}", m.to_json_line()).map_err(|e| format!("{}: {e}", path.display()))
}

/// Median of a list of numbers (0 when empty).
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Index of the largest of `row` (first on ties).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// Classes up to which [`Confusion::render`] prints the whole matrix; beyond, it prints the
/// most frequent confusions and the classes recalled worst (a 10,000² table is unreadable).
pub const RENDER_FULL_CLASSES: usize = 32;

/// Heap bytes one (true, predicted) entry of a [`Confusion`] takes at most (key, count and
/// B-tree node overhead), for the memory report.
pub const CONFUSION_ENTRY_BYTES: usize = 32;

/// One batch's (true, predicted) counts before they join a [`Confusion`]: a dense
/// `classes × classes` table where that is small (a per-pixel batch counts millions of
/// pixels, and a B-tree update per pixel cost more than the step on the GPU), else the pairs
/// themselves, sorted and counted once per batch.
enum Tally {
    Dense { classes: usize, counts: Vec<u64> },
    Pairs(Vec<(u32, u32)>),
}

/// Classes up to which a batch is counted in a dense table (256² counts, 512 KiB).
const DENSE_TALLY_CLASSES: usize = 256;

impl Tally {
    fn new(classes: usize) -> Tally {
        if classes <= DENSE_TALLY_CLASSES {
            Tally::Dense { classes, counts: vec![0; classes * classes] }
        } else {
            Tally::Pairs(Vec::new())
        }
    }
    fn count(&mut self, t: u32, p: u32) {
        match self {
            Tally::Dense { classes, counts } => counts[t as usize * *classes + p as usize] += 1,
            Tally::Pairs(v) => v.push((t, p)),
        }
    }
    /// The nonzero counts.
    fn pairs(self) -> Vec<((u32, u32), u64)> {
        match self {
            Tally::Dense { classes, counts } => counts
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(i, &n)| (((i / classes) as u32, (i % classes) as u32), n))
                .collect(),
            Tally::Pairs(mut v) => {
                v.sort_unstable();
                let mut out: Vec<((u32, u32), u64)> = Vec::new();
                for pair in v {
                    match out.last_mut() {
                        Some((last, n)) if *last == pair => *n += 1,
                        _ => out.push((pair, 1)),
                    }
                }
                out
            }
        }
    }
}

/// A confusion matrix, stored sparsely: one count per (true, predicted) pair that occurred,
/// so its memory grows with the samples seen (at most `classes²` pairs), not with `classes²`
/// (a dense 10,000-class matrix of u64 is 800 MB).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confusion {
    /// Number of classes.
    pub classes: usize,
    /// Counts of the (true, predicted) pairs seen.
    pub counts: BTreeMap<(u32, u32), u64>,
    total: u64,
    correct: u64,
    /// A label value that is never counted (a loss's `ignore_index`), besides those outside
    /// `0..classes`; an in-range one is also left out of [`Confusion::mean_iou`].
    pub ignore_index: Option<i64>,
}

impl Confusion {
    /// An empty matrix for `classes` classes.
    pub fn new(classes: usize) -> Self {
        Confusion { classes, counts: BTreeMap::new(), total: 0, correct: 0, ignore_index: None }
    }
    /// An empty matrix that skips the label value `ignore_index`.
    pub fn ignoring(classes: usize, ignore_index: Option<i64>) -> Self {
        Confusion { ignore_index, ..Confusion::new(classes) }
    }
    /// Adds a batch of per-pixel real logits `[n, classes, pixels]` (row-major) against labels
    /// `[n, pixels]`: one count per pixel whose label is a class and not the ignore index.
    pub fn add_pixels(&mut self, logits: &[f32], labels: &[i32], pixels: usize) {
        let c = self.classes;
        if c == 0 || pixels == 0 {
            return;
        }
        let samples: Vec<(&[f32], &[i32])> =
            logits.chunks_exact(c * pixels).zip(labels.chunks_exact(pixels)).collect();
        let threads = crate::par::threads_for(std::mem::size_of_val(logits));
        let ignore = self.ignore_index;
        let tallies = crate::par::map_chunks(&samples, threads, |samples| {
            let mut tally = Tally::new(c);
            let mut best = vec![0u32; pixels];
            let mut top = vec![0f32; pixels];
            for &(sample, labels) in samples {
                // argmax over the class axis (stride `pixels`), one class plane at a time so
                // that every read is sequential; ties take the first class (strictly greater
                // wins).
                top.copy_from_slice(&sample[..pixels]);
                best.fill(0);
                for k in 1..c {
                    let plane = &sample[k * pixels..(k + 1) * pixels];
                    for ((t, b), &x) in top.iter_mut().zip(best.iter_mut()).zip(plane) {
                        if x > *t {
                            *t = x;
                            *b = k as u32;
                        }
                    }
                }
                for (&l, &p) in labels.iter().zip(&best) {
                    if l >= 0 && (l as usize) < c && ignore != Some(l as i64) {
                        tally.count(l as u32, p);
                    }
                }
            }
            tally
        });
        for tally in tallies {
            self.merge(tally);
        }
    }
    /// Adds a batch's counts to the matrix.
    fn merge(&mut self, tally: Tally) {
        for ((t, p), n) in tally.pairs() {
            *self.counts.entry((t, p)).or_insert(0) += n;
            self.total += n;
            if t == p {
                self.correct += n;
            }
        }
    }
    /// Mean over classes of `TP / (TP + FP + FN)`, over the classes that occur as a label or
    /// a prediction (an in-range ignore index excluded); 0 when nothing was counted.
    pub fn mean_iou(&self) -> f64 {
        let mut tp: BTreeMap<u32, u64> = BTreeMap::new();
        let mut union: BTreeMap<u32, u64> = BTreeMap::new();
        for (&(t, p), &n) in &self.counts {
            if t == p {
                *tp.entry(t).or_insert(0) += n;
                *union.entry(t).or_insert(0) += n;
            } else {
                *union.entry(t).or_insert(0) += n;
                *union.entry(p).or_insert(0) += n;
            }
        }
        let skip = self.ignore_index.and_then(|k| u32::try_from(k).ok());
        let ious: Vec<f64> = union
            .iter()
            .filter(|(&c, _)| Some(c) != skip)
            .map(|(c, &u)| tp.get(c).copied().unwrap_or(0) as f64 / u as f64)
            .collect();
        if ious.is_empty() {
            return 0.0;
        }
        ious.iter().sum::<f64>() / ious.len() as f64
    }
    /// Adds a batch of real logits `[n, classes]` (row-major) against labels (labels outside
    /// `0..classes` are not counted).
    pub fn add(&mut self, logits: &[f32], labels: &[i32]) {
        let c = self.classes;
        if c == 0 {
            return;
        }
        let mut tally = Tally::new(c);
        for (row, &l) in logits.chunks_exact(c).zip(labels) {
            let p = argmax(row);
            if l >= 0 && (l as usize) < c && self.ignore_index != Some(l as i64) {
                tally.count(l as u32, p as u32);
            }
        }
        self.merge(tally);
    }
    /// The count of samples of class `t` predicted as `p`.
    pub fn get(&self, t: usize, p: usize) -> u64 {
        self.counts.get(&(t as u32, p as u32)).copied().unwrap_or(0)
    }
    /// Samples counted.
    pub fn total(&self) -> u64 {
        self.total
    }
    /// Correct predictions over all samples (0 when empty).
    pub fn accuracy(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        self.correct as f64 / self.total as f64
    }
    /// Heap bytes the matrix holds (an estimate: B-tree entries with their node overhead).
    pub fn heap_bytes(&self) -> usize {
        // A B-tree node holds up to 11 entries of (8-byte key, 8-byte count) plus its
        // header: 32 bytes an entry covers nodes down to half full.
        self.counts.len() * CONFUSION_ENTRY_BYTES
    }
    /// The matrix as a text table (rows true classes, columns predictions) for up to
    /// [`RENDER_FULL_CLASSES`] classes; beyond, the most frequent confusions and the classes
    /// with the lowest recall.
    pub fn render(&self, names: &[String]) -> String {
        let c = self.classes;
        let label = |i: usize| names.get(i).cloned().unwrap_or_else(|| i.to_string());
        if c > RENDER_FULL_CLASSES {
            return self.render_summary(&label);
        }
        let w = (0..c).map(|i| label(i).len()).max().unwrap_or(1).max(6);
        let mut s = format!("{:>w0$}", "true\\pred", w0 = w.max(9));
        for j in 0..c {
            s.push_str(&format!(" {:>w$}", label(j)));
        }
        s.push('\n');
        for i in 0..c {
            s.push_str(&format!("{:>w$}", label(i), w = w.max(9)));
            for j in 0..c {
                s.push_str(&format!(" {:>w$}", self.get(i, j)));
            }
            s.push('\n');
        }
        s
    }

    fn render_summary(&self, label: &dyn Fn(usize) -> String) -> String {
        let mut s = format!(
            "{} classes: the full matrix is not printed; {} of {} (true, predicted) pairs occurred\n",
            self.classes,
            self.counts.len(),
            self.classes as u128 * self.classes as u128
        );
        let mut wrong: Vec<(u64, u32, u32)> =
            self.counts.iter().filter(|((t, p), _)| t != p).map(|(&(t, p), &n)| (n, t, p)).collect();
        wrong.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        s.push_str("most frequent confusions (true -> predicted: samples):\n");
        for (n, t, p) in wrong.iter().take(10) {
            s.push_str(&format!("  {} -> {}: {n}\n", label(*t as usize), label(*p as usize)));
        }
        let mut per_class: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for (&(t, p), &n) in &self.counts {
            let e = per_class.entry(t).or_insert((0, 0));
            e.1 += n;
            if t == p {
                e.0 += n;
            }
        }
        let mut recall: Vec<(f64, u32, u64)> =
            per_class.iter().map(|(&t, &(r, n))| (r as f64 / n as f64, t, n)).collect();
        recall.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        s.push_str("lowest recall (class: correct of samples):\n");
        for (r, t, n) in recall.iter().take(10) {
            s.push_str(&format!("  {}: {:.1}% of {n}\n", label(*t as usize), 100.0 * r));
        }
        s
    }
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), when available.
pub fn peak_rss_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes as a short human string (`1.5 MiB`): the compiler's one formatter, re-exported for
/// embedders.
pub use cvc_compiler::units::human_bytes;
