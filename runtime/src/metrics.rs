//! Training metrics: per-epoch records (`metrics.jsonl`), step timing, accuracy and
//! confusion matrices, and peak-memory measurement.

use serde::Serialize;
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
    /// Validation accuracy, when the model classifies and a validation set exists.
    pub val_acc: Option<f64>,
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

/// A confusion matrix: `counts[true][predicted]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Confusion {
    /// Counts by true class, then predicted class.
    pub counts: Vec<Vec<u64>>,
}

impl Confusion {
    /// An empty matrix for `classes` classes.
    pub fn new(classes: usize) -> Self {
        Confusion { counts: vec![vec![0; classes]; classes] }
    }
    /// Adds a batch of real logits `[n, classes]` (row-major) against labels.
    pub fn add(&mut self, logits: &[f32], labels: &[i32]) {
        let c = self.counts.len();
        for (row, &l) in logits.chunks_exact(c).zip(labels) {
            let p = argmax(row);
            if (l as usize) < c {
                self.counts[l as usize][p] += 1;
            }
        }
    }
    /// Samples counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().flatten().sum()
    }
    /// Correct predictions over all samples (0 when empty).
    pub fn accuracy(&self) -> f64 {
        let total = self.total();
        if total == 0 {
            return 0.0;
        }
        let right: u64 = (0..self.counts.len()).map(|i| self.counts[i][i]).sum();
        right as f64 / total as f64
    }
    /// The matrix as a text table, rows true classes, columns predictions.
    pub fn render(&self, names: &[String]) -> String {
        let c = self.counts.len();
        let label = |i: usize| names.get(i).cloned().unwrap_or_else(|| i.to_string());
        let w = (0..c).map(|i| label(i).len()).max().unwrap_or(1).max(6);
        let mut s = format!("{:>w0$}", "true\\pred", w0 = w.max(9));
        for j in 0..c {
            s.push_str(&format!(" {:>w$}", label(j)));
        }
        s.push('\n');
        for i in 0..c {
            s.push_str(&format!("{:>w$}", label(i), w = w.max(9)));
            for j in 0..c {
                s.push_str(&format!(" {:>w$}", self.counts[i][j]));
            }
            s.push('\n');
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
