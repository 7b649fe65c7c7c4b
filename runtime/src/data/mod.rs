//! Training data: `.npy`/`.npz` files and the built-in synthetic datasets, validated against
//! the model's declared inputs, split into train and validation sets and batched.

pub mod npy;
pub mod synthetic_mri3d;
pub mod synthetic_polsar;
pub mod synthetic_rf;
pub mod synthetic_sar;

use crate::backend::{HostData, HostTensor};
use cvc_compiler::front::limits;
use cvc_compiler::front::train::DataSource;
use cvc_compiler::init::SplitMix64;
use cvc_compiler::ir::{DType, Dim, Graph, TensorType};
use std::path::Path;

/// A data input the model declares: the arrays a dataset must provide.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSpec {
    /// The input's name (the array name in a `.npz`).
    pub name: String,
    /// Element type and shape (the first dimension is the batch `B`).
    pub ty: TensorType,
    /// For class labels, the number of classes.
    pub classes: Option<usize>,
    /// For class labels, the one value admitted besides `0..classes` (the `ignore_index` of
    /// the loss that reads them: unlabelled pixels).
    pub ignore_index: Option<i64>,
}

/// The class count and ignore index of a label input, by input name (`(None, None)` for
/// other inputs).
pub type LabelsOf<'a> = dyn Fn(&str) -> (Option<usize>, Option<i64>) + 'a;

impl InputSpec {
    /// The data inputs of a graph, in arena order. `labels` gives the class count and the
    /// ignore index of label inputs by name (from the front end's declarations and losses).
    pub fn from_graph(g: &Graph, labels: &LabelsOf) -> Vec<InputSpec> {
        g.inputs()
            .filter_map(|v| {
                let name = g.leaf_name(v)?.to_string();
                let (classes, ignore_index) = labels(&name);
                Some(InputSpec { ty: g.ty(v).clone(), classes, ignore_index, name })
            })
            .collect()
    }
    /// The declared type as the user wrote it (`class[B] of 5`, `c64[B, 1, 512]`).
    pub fn describe(&self) -> String {
        match self.classes {
            Some(c) => format!("class{} of {c}", self.ty.shape),
            None => self.ty.to_string(),
        }
    }
    /// The per-sample shape (the declared shape without the leading batch dimension).
    pub fn sample_shape(&self) -> Result<Vec<usize>, String> {
        let dims = &self.ty.shape.0;
        if dims.first() != Some(&Dim::Batch) {
            return Err(format!(
                "input '{}' ({}) has no leading batch dimension B",
                self.name,
                self.describe()
            ));
        }
        dims[1..]
            .iter()
            .map(|d| {
                d.fixed().ok_or_else(|| format!("input '{}' uses B outside the first dimension", self.name))
            })
            .collect()
    }
}

fn numpy_of(dt: DType) -> &'static str {
    match dt {
        DType::F32 => "float32",
        DType::C64 => "complex64",
        DType::I32 => "int32/int64",
    }
}

/// A dataset held in memory: one array per model input, all with `len` samples along axis 0.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// The arrays, in the order of the model's inputs.
    pub arrays: Vec<(String, HostTensor)>,
    /// Number of samples.
    pub len: usize,
}

impl Dataset {
    /// Validates named arrays against the model's inputs and keeps those the model reads.
    /// `source` names the data (a file path) in error messages. Errors name the array, the
    /// expected and the found shape and dtype, every missing array, and out-of-range labels.
    pub fn from_arrays(
        mut found: Vec<(String, npy::NpyArray)>,
        inputs: &[InputSpec],
        source: &str,
    ) -> Result<Dataset, String> {
        let missing: Vec<String> = inputs
            .iter()
            .filter(|i| !found.iter().any(|(n, _)| n == &i.name))
            .map(|i| format!("'{}' ({})", i.name, i.describe()))
            .collect();
        if !missing.is_empty() {
            let have: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
            return Err(format!(
                "{source}: missing array{} {} (the file has: {})",
                if missing.len() > 1 { "s" } else { "" },
                missing.join(", "),
                if have.is_empty() { "no arrays".to_string() } else { have.join(", ") }
            ));
        }
        let mut arrays = Vec::new();
        let mut len: Option<(usize, String)> = None;
        for spec in inputs {
            let pos = found.iter().position(|(n, _)| n == &spec.name).expect("checked above");
            let (name, arr) = found.swap_remove(pos);
            let sample = spec.sample_shape()?;
            let t = arr.tensor;
            let shape_ok = t.shape.len() == sample.len() + 1 && t.shape[1..] == sample[..];
            if t.dtype != spec.ty.dtype || !shape_ok {
                return Err(format!(
                    "{source}: array '{name}' should be {} {} (model input {}), found {} {:?}",
                    numpy_of(spec.ty.dtype),
                    fmt_shape("N", &sample),
                    spec.describe(),
                    arr.numpy_dtype,
                    t.shape
                ));
            }
            let n = t.shape[0];
            match &len {
                Some((m, other)) if *m != n => {
                    return Err(format!(
                        "{source}: array '{name}' has {n} samples but '{other}' has {m}; all arrays need the same first dimension"
                    ))
                }
                _ => len = Some((n, name.clone())),
            }
            if let (Some(c), HostData::I32(v)) = (spec.classes, &t.data) {
                let ignored = |x: i32| spec.ignore_index == Some(x as i64);
                if let Some((i, &bad)) =
                    v.iter().enumerate().find(|(_, &x)| (x < 0 || x as usize >= c) && !ignored(x))
                {
                    let also = match spec.ignore_index {
                        Some(k) if k < 0 || k as usize >= c => format!(" or the ignore_index {k}"),
                        _ => String::new(),
                    };
                    return Err(format!(
                        "{source}: array '{name}' holds label {bad} at index {i}, outside 0..{c}{also} (input {})",
                        spec.describe()
                    ));
                }
            }
            arrays.push((name, t));
        }
        let len = len.map(|(n, _)| n).unwrap_or(0);
        if len == 0 {
            return Err(format!("{source}: the data holds no samples"));
        }
        Ok(Dataset { arrays, len })
    }

    /// Loads and validates a `.npz` archive.
    pub fn load_npz(path: &Path, inputs: &[InputSpec]) -> Result<Dataset, String> {
        let found = npy::load_npz(path)?;
        Dataset::from_arrays(found, inputs, &path.display().to_string())
    }

    /// The synthetic RF dataset, validated against the inputs: the bursts feed the model's
    /// complex input and the classes its label input, whatever their names (`cvc data rf`
    /// names the arrays `iq` and `label`).
    pub fn synthetic_rf(cfg: &synthetic_rf::RfConfig, inputs: &[InputSpec]) -> Result<Dataset, String> {
        let d = synthetic_rf::generate(cfg)?;
        let named = |pick: &dyn Fn(&InputSpec) -> bool, default: &str| {
            inputs.iter().find(|i| pick(i)).map_or(default.to_string(), |i| i.name.clone())
        };
        let iq_name = named(&|i| i.ty.dtype == DType::C64, "iq");
        let label_name = named(&|i| i.classes.is_some(), "label");
        let found = vec![
            (iq_name, npy::NpyArray { numpy_dtype: "complex64".into(), tensor: d.iq }),
            (label_name, npy::NpyArray { numpy_dtype: "int32".into(), tensor: d.label }),
        ];
        Dataset::from_arrays(found, inputs, "synthetic.rf")
    }

    /// The synthetic SAR dataset, validated against the inputs: the images feed the model's
    /// complex input and the classes its label input, whatever their names (`cvc data sar`
    /// names the arrays `image` and `label`).
    pub fn synthetic_sar(cfg: &synthetic_sar::SarConfig, inputs: &[InputSpec]) -> Result<Dataset, String> {
        let d = synthetic_sar::generate(cfg)?;
        let named = |pick: &dyn Fn(&InputSpec) -> bool, default: &str| {
            inputs.iter().find(|i| pick(i)).map_or(default.to_string(), |i| i.name.clone())
        };
        let image_name = named(&|i| i.ty.dtype == DType::C64, "image");
        let label_name = named(&|i| i.classes.is_some(), "label");
        let found = vec![
            (image_name, npy::NpyArray { numpy_dtype: "complex64".into(), tensor: d.image }),
            (label_name, npy::NpyArray { numpy_dtype: "int32".into(), tensor: d.label }),
        ];
        Dataset::from_arrays(found, inputs, "synthetic.sar")
    }

    /// The synthetic PolSAR dataset, validated against the inputs: the scenes feed the
    /// model's complex input and the per-pixel classes its label input, whatever their names
    /// (`cvc data polsar` names the arrays `image` and `label`). Unlabelled pixels get the
    /// label input's `ignore_index` (the loss's), whatever `cfg.ignore_index` says.
    pub fn synthetic_polsar(
        cfg: &synthetic_polsar::PolsarConfig,
        inputs: &[InputSpec],
    ) -> Result<Dataset, String> {
        let label = inputs.iter().find(|i| i.classes.is_some());
        let mut cfg = cfg.clone();
        if let Some(k) = label.and_then(|l| l.ignore_index) {
            cfg.ignore_index = i32::try_from(k).map_err(|_| {
                format!("synthetic.polsar: the labels' ignore_index {k} does not fit an int32 label")
            })?;
        } else if let Some(l) = label {
            return Err(format!(
                "synthetic.polsar leaves boundary pixels unlabelled, but no loss reads input '{}' with an ignore_index; use cross_entropy or dice on it",
                l.name
            ));
        }
        let d = synthetic_polsar::generate(&cfg)?;
        let named = |pick: &dyn Fn(&InputSpec) -> bool, default: &str| {
            inputs.iter().find(|i| pick(i)).map_or(default.to_string(), |i| i.name.clone())
        };
        let image_name = named(&|i| i.ty.dtype == DType::C64, "image");
        let label_name = named(&|i| i.classes.is_some(), "label");
        let found = vec![
            (image_name, npy::NpyArray { numpy_dtype: "complex64".into(), tensor: d.image }),
            (label_name, npy::NpyArray { numpy_dtype: "int32".into(), tensor: d.label }),
        ];
        Dataset::from_arrays(found, inputs, "synthetic.polsar")
    }

    /// The synthetic 3-D MRI dataset, validated against the inputs, which it feeds by name
    /// (`kspace`, `mask`, `target`).
    pub fn synthetic_mri3d(
        cfg: &synthetic_mri3d::Mri3dConfig,
        inputs: &[InputSpec],
    ) -> Result<Dataset, String> {
        let d = synthetic_mri3d::generate(cfg)?;
        let [k, m, t] = synthetic_mri3d::ARRAYS;
        let found = vec![
            (k.to_string(), npy::NpyArray { numpy_dtype: "complex64".into(), tensor: d.kspace }),
            (m.to_string(), npy::NpyArray { numpy_dtype: "float32".into(), tensor: d.mask }),
            (t.to_string(), npy::NpyArray { numpy_dtype: "complex64".into(), tensor: d.target }),
        ];
        Dataset::from_arrays(found, inputs, "synthetic.mri3d")
    }

    /// Random data shaped like the inputs: normal reals and complex numbers, uniform labels.
    pub fn synthetic_random(count: usize, seed: u64, inputs: &[InputSpec]) -> Result<Dataset, String> {
        if count == 0 {
            return Err("synthetic.random: count must be at least 1".into());
        }
        // The same size check as `cvc check` makes (limits::dataset_bytes), for callers that
        // build a dataset without checking a train section.
        let mut per_sample = 0u64;
        for spec in inputs {
            let elems = spec.sample_shape()?.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
            per_sample = elems
                .and_then(|e| e.checked_mul(spec.ty.dtype.bytes() as u64))
                .and_then(|b| b.checked_add(per_sample))
                .unwrap_or(u64::MAX);
        }
        let limit = limits::max_data_bytes()?;
        limits::dataset_bytes("synthetic.random", count as u64, per_sample, limit)
            .map_err(|e| format!("{e}; {}", limits::data_limit_help()))?;
        let mut rng = SplitMix64::new(seed ^ 0x7261_6E64_6F6D_0001);
        let mut arrays = Vec::new();
        for spec in inputs {
            let sample = spec.sample_shape()?;
            let mut shape = vec![count];
            shape.extend_from_slice(&sample);
            let n: usize = shape.iter().product();
            let data = match spec.ty.dtype {
                DType::F32 => HostData::F32((0..n).map(|_| rng.normal() as f32).collect()),
                DType::C64 => {
                    HostData::F32((0..2 * n).map(|_| (rng.normal() / 2f64.sqrt()) as f32).collect())
                }
                DType::I32 => {
                    let c = spec.classes.unwrap_or(2).max(1) as u64;
                    HostData::I32((0..n).map(|_| (rng.next_u64() % c) as i32).collect())
                }
            };
            arrays.push((spec.name.clone(), HostTensor { dtype: spec.ty.dtype, shape, data }));
        }
        Ok(Dataset { arrays, len: count })
    }

    /// The dataset a `train` section names; `base` is the `.cvnn` file's folder (relative
    /// `.npz` paths are resolved against it).
    pub fn from_source(src: &DataSource, base: &Path, inputs: &[InputSpec]) -> Result<Dataset, String> {
        match src {
            DataSource::SyntheticRf { classes, length, snr_db, count, seed } => {
                let cfg = synthetic_rf::RfConfig {
                    classes: *classes,
                    length: *length,
                    snr_db: *snr_db,
                    count: *count,
                    seed: *seed,
                };
                Dataset::synthetic_rf(&cfg, inputs)
            }
            DataSource::SyntheticSar { classes, size, scr_db, looks, count, seed } => {
                let cfg = synthetic_sar::SarConfig {
                    classes: *classes,
                    size: *size,
                    scr_db: *scr_db,
                    looks: *looks,
                    count: *count,
                    seed: *seed,
                };
                Dataset::synthetic_sar(&cfg, inputs)
            }
            DataSource::SyntheticPolsar { classes, size, regions, gain_db, contrast, count, seed } => {
                let cfg = synthetic_polsar::PolsarConfig {
                    classes: *classes,
                    size: *size,
                    regions: *regions,
                    gain_db: *gain_db,
                    contrast: *contrast,
                    count: *count,
                    seed: *seed,
                    ignore_index: -100,
                };
                Dataset::synthetic_polsar(&cfg, inputs)
            }
            DataSource::SyntheticRandom { count, seed } => Dataset::synthetic_random(*count, *seed, inputs),
            DataSource::Npz { path } => Dataset::load_npz(&base.join(path), inputs),
            DataSource::SyntheticMri3d { depth, size, accel, count, seed } => {
                let cfg = synthetic_mri3d::Mri3dConfig {
                    depth: *depth,
                    size: *size,
                    accel: *accel,
                    count: *count,
                    seed: *seed,
                };
                Dataset::synthetic_mri3d(&cfg, inputs)
            }
        }
    }

    /// The samples at `indices`, one tensor per input (`[indices.len(), ...]`), in input order.
    pub fn gather(&self, indices: &[usize]) -> Vec<(String, HostTensor)> {
        self.gather_reusing(indices, None)
    }

    /// [`Dataset::gather`] into the buffers of an earlier batch where they fit (same inputs in
    /// the same order): a training loop that hands its last batch back allocates no new
    /// batch memory, whose first touch (page faults on a fresh 32 MiB allocation) can cost
    /// more than the copy.
    pub fn gather_reusing(
        &self,
        indices: &[usize],
        reuse: Option<Vec<(String, HostTensor)>>,
    ) -> Vec<(String, HostTensor)> {
        let mut old = reuse.unwrap_or_default().into_iter();
        self.arrays
            .iter()
            .map(|(name, t)| {
                let per = t.numel() / t.shape[0].max(1);
                let mut shape = t.shape.clone();
                shape[0] = indices.len();
                let spare = old.next().filter(|(n, o)| n == name && o.dtype == t.dtype).map(|(_, o)| o.data);
                let data = match &t.data {
                    HostData::F32(v) => {
                        let w = if t.dtype == DType::C64 { 2 * per } else { per };
                        let mut out = match spare {
                            Some(HostData::F32(o)) => o,
                            _ => Vec::new(),
                        };
                        gather_rows(v, w, indices, &mut out);
                        HostData::F32(out)
                    }
                    HostData::I32(v) => {
                        let mut out = match spare {
                            Some(HostData::I32(o)) => o,
                            _ => Vec::new(),
                        };
                        gather_rows(v, per, indices, &mut out);
                        HostData::I32(out)
                    }
                };
                (name.clone(), HostTensor { dtype: t.dtype, shape, data })
            })
            .collect()
    }

    /// The array of input `name`, if present.
    pub fn array(&self, name: &str) -> Option<&HostTensor> {
        self.arrays.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

/// Rows `indices` (of `w` elements each) of `v` into `out`, which keeps its allocation (and
/// its touched pages) when it already has the size; split over threads for a large batch.
fn gather_rows<T: Copy + Default + Send + Sync>(v: &[T], w: usize, indices: &[usize], out: &mut Vec<T>) {
    if out.len() != w * indices.len() {
        out.clear();
        out.resize(w * indices.len(), T::default());
    }
    let threads = crate::par::threads_for(std::mem::size_of_val(out.as_slice()));
    crate::par::zip_chunks(indices, out, w, threads, |rows, out| {
        for (&i, o) in rows.iter().zip(out.chunks_exact_mut(w.max(1))) {
            o.copy_from_slice(&v[i * w..(i + 1) * w]);
        }
    });
}

fn fmt_shape(first: &str, rest: &[usize]) -> String {
    let mut s = format!("[{first}");
    for d in rest {
        s.push_str(&format!(", {d}"));
    }
    s.push(']');
    s
}

/// Sample indices of the training and validation sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// Training samples.
    pub train: Vec<usize>,
    /// Validation samples.
    pub val: Vec<usize>,
}

/// Shuffles `0..len` with `seed` and cuts it: the first `round(fraction · len)` samples train,
/// the rest validate. A fraction of 1 leaves no validation set.
pub fn split(len: usize, fraction: f64, seed: u64) -> Split {
    let mut idx: Vec<usize> = (0..len).collect();
    shuffle(&mut idx, &mut SplitMix64::new(seed ^ 0x7370_6C69_7400_0000));
    let cut = ((fraction.clamp(0.0, 1.0) * len as f64).round() as usize).min(len);
    let val = idx.split_off(cut);
    Split { train: idx, val }
}

/// The order of the training samples in epoch `epoch` (0-based): a seeded shuffle that
/// depends only on `(seed, epoch)`, so a resumed run sees the same batches.
pub fn epoch_order(train: &[usize], seed: u64, epoch: usize) -> Vec<usize> {
    let mut idx = train.to_vec();
    let mut rng =
        SplitMix64::new(seed ^ 0x6570_6F63_6800_0000 ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    shuffle(&mut idx, &mut rng);
    idx
}

/// Fisher–Yates shuffle.
pub fn shuffle<T>(v: &mut [T], rng: &mut SplitMix64) {
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch gathered into a reused buffer, on several threads (12 MB of rows), equals the
    /// rows copied one by one; a buffer of another size is resized.
    #[test]
    fn gathered_rows_equal_the_rows() {
        let (rows, w) = (1500usize, 2048usize);
        let v: Vec<f32> = (0..rows * w).map(|i| i as f32).collect();
        let mut rng = SplitMix64::new(7);
        let indices: Vec<usize> = (0..rows).map(|_| (rng.next_u64() % rows as u64) as usize).collect();
        let want: Vec<f32> = indices.iter().flat_map(|&i| v[i * w..(i + 1) * w].iter().copied()).collect();
        let mut out = vec![-1.0; 3];
        gather_rows(&v, w, &indices, &mut out);
        assert!(out == want);
        let keep = out.as_ptr();
        gather_rows(&v, w, &indices, &mut out);
        assert!(out == want && out.as_ptr() == keep, "the second gather reuses the buffer");
    }
}
