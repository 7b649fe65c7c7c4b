//! `cvc.Session`: parameters and state on one device with the compiled training and
//! inference programs (Rust: `cvc_runtime::session::Session`).

use crate::errors::{data_error, guard, runtime_error};
use crate::inputs::{read_batch, Held};
use crate::model::expected;
use crate::outputs::{dict_of, json_to_python};
use crate::state::{is_optimizer_state, torch_name};
use cvc_compiler::ir::DType;
use cvc_runtime::backend::{HostData, HostTensor};
use cvc_runtime::checkpoint::Checkpoint;
use cvc_runtime::session::{Device, Session, TensorRef};
use cvc_runtime::train::Classifier;
use numpy::{Complex32, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// A model's parameters and state on one device, with its compiled programs. Made by
/// `Model.session(...)`.
// `unsendable`: the back ends hold device handles and raw arena pointers tied to the thread
// that made them.
#[pyclass(name = "Session", module = "cvc", unsendable)]
pub struct PySession {
    session: Session,
    classifier: Option<Classifier>,
    /// Where each input of the last step or evaluation was read from: (name, place, address).
    last_inputs: Vec<(String, &'static str, u64)>,
}

/// What a training step returned: the loss (before the update), metrics and the outputs.
#[pyclass(name = "StepResult", module = "cvc", frozen, get_all)]
pub struct PyStepResult {
    /// The batch's loss, computed before the optimizer update.
    loss: f64,
    /// `accuracy` (and `correct`, `count`) for a classifier, else empty.
    metrics: Py<PyDict>,
    /// The model's outputs by name (NumPy arrays, or torch tensors with `as_torch=True`).
    outputs: Py<PyDict>,
}

#[pymethods]
impl PyStepResult {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!("StepResult(loss={}, metrics={})", self.loss, self.metrics.bind(py))
    }
}

impl PySession {
    pub fn new(session: Session) -> PySession {
        let classifier = Classifier::find(session.model());
        PySession { session, classifier, last_inputs: Vec::new() }
    }

    /// The names of the trainable parameters (the rest of the state is buffers).
    fn params(&mut self) -> PyResult<HashSet<String>> {
        let leaves = self.session.state_tensors().map_err(runtime_error)?;
        Ok(leaves.into_iter().map(|(n, _)| n).filter(|n| self.session.is_parameter(n)).collect())
    }

    /// Reads a batch and runs `f` on the borrowed tensors.
    fn with_batch<'py, T>(
        &mut self,
        batch: &Bound<'py, PyDict>,
        train: bool,
        f: impl FnOnce(&mut Session, &[(String, TensorRef<'_>)]) -> PyResult<T>,
    ) -> PyResult<(T, Vec<(String, Held<'py>)>)> {
        let model = self.session.model();
        let (specs, n) = if train {
            (model.inputs(), self.session.batch())
        } else {
            let n = batch_rows(batch)?;
            (model.eval_inputs(), n)
        };
        let want = expected(specs, n);
        let cuda = self.session.device() == Device::Cuda;
        let held = read_batch(batch, &want, train, cuda)?;
        if held.is_empty() {
            return Err(data_error("the batch is empty: give a dict input name → array"));
        }
        let refs: Vec<(String, TensorRef<'_>)> = held
            .iter()
            .map(|(name, h)| {
                let e = want.iter().find(|e| &e.name == name).expect("read_batch keeps known names");
                h.tensor(e).map(|t| (name.clone(), t))
            })
            .collect::<PyResult<_>>()?;
        self.last_inputs = held.iter().map(|(n, h)| (n.clone(), h.place(), h.address())).collect();
        let r = f(&mut self.session, &refs)?;
        Ok((r, held))
    }

    /// Accuracy of class scores in `outputs` against the labels in `held`.
    fn metrics<'py>(
        &self,
        py: Python<'py>,
        outputs: &[(String, HostTensor)],
        held: &[(String, Held<'py>)],
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let Some(c) = &self.classifier else { return Ok(d) };
        let labels = held.iter().find(|(n, _)| *n == c.label).map(|(_, h)| h);
        let logits = outputs.iter().find(|(n, _)| *n == c.output).map(|(_, t)| &t.data);
        if let (Some(Held::I32(y)), Some(HostData::F32(l))) = (labels, logits) {
            let mut cm = c.confusion();
            if c.segments {
                cm.add_pixels(l, y.as_slice()?, c.pixels);
            } else {
                cm.add(l, y.as_slice()?);
            }
            d.set_item("accuracy", cm.accuracy())?;
            d.set_item("correct", (0..c.classes).map(|i| cm.get(i, i)).sum::<u64>())?;
            d.set_item("count", cm.total())?;
        }
        Ok(d)
    }

    /// Parameters and state in PyTorch's names and layouts (optimizer state with `optimizer`).
    fn torch_state(&mut self, optimizer: bool) -> PyResult<Vec<(String, HostTensor)>> {
        let params = self.params()?;
        let is_param = |n: &str| params.contains(n);
        let tensors = self.session.state_tensors().map_err(runtime_error)?;
        Ok(tensors
            .into_iter()
            .filter(|(n, _)| optimizer || !is_optimizer_state(n, &is_param))
            .map(|(n, t)| (torch_name(&n, &is_param), t))
            .collect())
    }
}

/// The row count of a batch: the first dimension of its first array.
fn batch_rows(batch: &Bound<'_, PyDict>) -> PyResult<usize> {
    let (_, first) = batch.iter().next().ok_or_else(|| data_error("the batch is empty"))?;
    let shape = first.getattr("shape").map_err(|_| data_error("batch values must be arrays or tensors"))?;
    let dims: Vec<usize> = shape.extract()?;
    dims.first()
        .copied()
        .filter(|&n| n > 0)
        .ok_or_else(|| data_error("batch arrays need a batch dimension of at least 1"))
}

/// A host tensor from a NumPy-readable value of `dtype`.
fn host_tensor(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>, dtype: DType) -> PyResult<HostTensor> {
    let np = py.import("numpy")?;
    let value = if value.hasattr("detach")? {
        value.call_method0("detach")?.call_method0("cpu")?
    } else {
        value.clone()
    };
    let target = crate::inputs::numpy_name(dtype);
    let kw = PyDict::new(py);
    kw.set_item("dtype", target)?;
    let arr = np
        .call_method("ascontiguousarray", (&value,), Some(&kw))
        .map_err(|e| data_error(format!("state dict entry '{name}': expected a {target} array: {e}")))?;
    let shape = arr.cast::<PyUntypedArray>()?.shape().to_vec();
    let data = match dtype {
        DType::C64 => {
            let a = arr.cast::<PyArrayDyn<Complex32>>()?.readonly();
            HostData::F32(a.as_slice()?.iter().flat_map(|z| [z.re, z.im]).collect())
        }
        DType::F32 => HostData::F32(arr.cast::<PyArrayDyn<f32>>()?.readonly().as_slice()?.to_vec()),
        DType::I32 => HostData::I32(arr.cast::<PyArrayDyn<i32>>()?.readonly().as_slice()?.to_vec()),
    };
    Ok(HostTensor { dtype, shape, data })
}

#[pymethods]
impl PySession {
    /// The back end's name: `cpu`, `cuda:<gpu>` or `interp`.
    #[getter]
    fn device(&self) -> String {
        self.session.device_name()
    }

    /// The batch size of training steps.
    #[getter]
    fn batch(&self) -> usize {
        self.session.batch()
    }

    /// Why `device="auto"` chose the CPU, if it did.
    #[getter]
    fn note(&self) -> Option<String> {
        self.session.note().map(str::to_string)
    }

    /// The learning rate of the following steps (settable: a schedule written in Python).
    #[getter]
    fn get_lr(&self) -> f32 {
        self.session.lr()
    }

    #[setter]
    fn set_lr(&mut self, lr: f32) -> PyResult<()> {
        guard(|| self.session.set_lr(lr).map_err(runtime_error))
    }

    /// The model this session runs.
    #[getter]
    fn model(&self) -> crate::model::PyModel {
        crate::model::PyModel { model: self.session.model().clone() }
    }

    /// One training step (forward, loss, backward, optimizer update) on `batch`, a dict
    /// input name → array with `session.batch` rows. Returns a `StepResult`.
    #[pyo3(signature = (batch, as_torch = false))]
    fn train_step(
        &mut self,
        py: Python<'_>,
        batch: &Bound<'_, PyDict>,
        as_torch: bool,
    ) -> PyResult<PyStepResult> {
        guard(|| {
            let (report, held) =
                self.with_batch(batch, true, |s, refs| s.train_step_refs(refs).map_err(runtime_error))?;
            let metrics = self.metrics(py, &report.outputs, &held)?;
            Ok(PyStepResult {
                loss: report.loss as f64,
                metrics: metrics.unbind(),
                outputs: dict_of(py, &report.outputs, as_torch)?.unbind(),
            })
        })
    }

    /// The inference program on a batch of any size: a dict `loss` (None unless every input
    /// the loss reads was given), `metrics` and `outputs`.
    #[pyo3(signature = (batch, as_torch = false))]
    fn evaluate(
        &mut self,
        py: Python<'_>,
        batch: &Bound<'_, PyDict>,
        as_torch: bool,
    ) -> PyResult<Py<PyDict>> {
        guard(|| {
            let (report, held) =
                self.with_batch(batch, false, |s, refs| s.evaluate_refs(refs).map_err(runtime_error))?;
            let d = PyDict::new(py);
            d.set_item("loss", report.loss.map(f64::from))?;
            d.set_item("metrics", self.metrics(py, &report.outputs, &held)?)?;
            d.set_item("outputs", dict_of(py, &report.outputs, as_torch)?)?;
            Ok(d.unbind())
        })
    }

    /// The model's outputs for a batch of any size (inference mode: running statistics, no
    /// dropout); labels may be left out.
    #[pyo3(signature = (batch, as_torch = false))]
    fn infer(&mut self, py: Python<'_>, batch: &Bound<'_, PyDict>, as_torch: bool) -> PyResult<Py<PyDict>> {
        guard(|| {
            let (report, _) =
                self.with_batch(batch, false, |s, refs| s.evaluate_refs(refs).map_err(runtime_error))?;
            Ok(dict_of(py, &report.outputs, as_torch)?.unbind())
        })
    }

    /// The gradient of the loss on `batch` with respect to every parameter, at the current
    /// parameters, in PyTorch's names and layouts. Parameters, optimizer state and running
    /// statistics are left as they were (the step's update is undone).
    #[pyo3(signature = (batch, as_torch = false))]
    fn gradients(
        &mut self,
        py: Python<'_>,
        batch: &Bound<'_, PyDict>,
        as_torch: bool,
    ) -> PyResult<Py<PyDict>> {
        guard(|| {
            let saved: BTreeMap<String, HostTensor> =
                self.session.state_tensors().map_err(runtime_error)?.into_iter().collect();
            let lr = self.session.lr();
            let step = self.with_batch(batch, true, |s, refs| s.train_step_refs(refs).map_err(runtime_error));
            let grads = step.and_then(|_| self.session.gradients().map_err(runtime_error));
            let ck = Checkpoint { tensors: saved, metadata: BTreeMap::new() };
            self.session.load_checkpoint(&ck, Path::new("the saved state")).map_err(runtime_error)?;
            self.session.set_lr(lr).map_err(runtime_error)?;
            let params = self.params()?;
            let is_param = |n: &str| params.contains(n);
            let torch: Vec<(String, HostTensor)> =
                grads?.into_iter().map(|(n, g)| (torch_name(&n, &is_param), g)).collect();
            Ok(dict_of(py, &torch, as_torch)?.unbind())
        })
    }

    /// Parameters and layer buffers (running statistics) by PyTorch name, in PyTorch's
    /// layouts (see the package README's name map); `optimizer=True` adds the optimizer's
    /// moments and counters under cvc's names.
    #[pyo3(signature = (optimizer = false, as_torch = false))]
    fn state_dict(&mut self, py: Python<'_>, optimizer: bool, as_torch: bool) -> PyResult<Py<PyDict>> {
        guard(|| {
            let state = self.torch_state(optimizer)?;
            Ok(dict_of(py, &state, as_torch)?.unbind())
        })
    }

    /// Loads a state dict (`state_dict()`'s names and layouts: a PyTorch module's
    /// `state_dict()` of the equivalent network). Every parameter is required; buffers and
    /// optimizer state are optional. With `strict`, a key the session does not know is a
    /// `DataError` (PyTorch's `num_batches_tracked` is always ignored).
    #[pyo3(signature = (state, strict = true))]
    fn load_state_dict(&mut self, py: Python<'_>, state: &Bound<'_, PyDict>, strict: bool) -> PyResult<()> {
        guard(|| {
            let params = self.params()?;
            let is_param = |n: &str| params.contains(n);
            let leaves = self.session.state_tensors().map_err(runtime_error)?;
            let mut by_torch: BTreeMap<String, (String, DType, Vec<usize>)> = BTreeMap::new();
            for (n, t) in &leaves {
                by_torch.insert(torch_name(n, &is_param), (n.clone(), t.dtype, t.shape.clone()));
            }
            let mut tensors = BTreeMap::new();
            for (k, v) in state.iter() {
                let key: String = k.extract().map_err(|_| data_error("state dict keys must be str"))?;
                let Some((name, dtype, shape)) = by_torch.get(&key) else {
                    if strict && !key.ends_with("num_batches_tracked") {
                        let known: Vec<&str> = by_torch.keys().map(String::as_str).collect();
                        return Err(data_error(format!(
                            "state dict entry '{key}' is not a tensor of this model (it has: {})",
                            known.join(", ")
                        )));
                    }
                    continue;
                };
                let t = host_tensor(py, &key, &v, *dtype)?;
                if &t.shape != shape {
                    return Err(data_error(format!(
                        "state dict entry '{key}': expected shape {shape:?} ({}), got {:?}",
                        crate::inputs::numpy_name(*dtype),
                        t.shape
                    )));
                }
                tensors.insert(name.clone(), t);
            }
            let ck = Checkpoint { tensors, metadata: BTreeMap::new() };
            self.session.load_checkpoint(&ck, Path::new("state dict")).map_err(runtime_error)
        })
    }

    /// Writes parameters and state (optimizer included) to a safetensors file, atomically;
    /// `metadata` (str → str) is stored with it. The file is what `cvc train` writes.
    #[pyo3(signature = (path, metadata = None))]
    fn save(&mut self, path: PathBuf, metadata: Option<BTreeMap<String, String>>) -> PyResult<()> {
        guard(|| self.session.save_checkpoint(&path, &metadata.unwrap_or_default()).map_err(runtime_error))
    }

    /// Loads parameters and state from a safetensors file (`save`'s or `cvc train`'s);
    /// returns its metadata.
    fn load(&mut self, path: PathBuf) -> PyResult<BTreeMap<String, String>> {
        guard(|| {
            if !path.exists() {
                return Err(data_error(format!("{}: no such checkpoint file", path.display())));
            }
            self.session.load_weights(&path).map_err(runtime_error)
        })
    }

    /// The training program's memory plan, as `Model.plan` gives it.
    fn plan(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        guard(|| {
            let json = cvc_runtime::cli::plan::json(self.session.program(), self.session.model().source());
            Ok(json_to_python(py, &json)?.unbind())
        })
    }

    /// Measured peak memory of the training back end in bytes, when known.
    #[getter]
    fn measured_peak_bytes(&self) -> Option<usize> {
        self.session.measured_peak_bytes()
    }

    /// For tests of the zero-copy rules: where each input of the last step or evaluation was
    /// read from, as a dict name → (`"host"` | `"cuda"`, address of the first element).
    fn _last_input_addresses(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let d = PyDict::new(py);
        for (n, place, addr) in &self.last_inputs {
            d.set_item(n, (*place, *addr))?;
        }
        Ok(d.unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "<cvc.Session {} on {}, batch {}>",
            self.session.model().name(),
            self.session.device_name(),
            self.session.batch()
        )
    }
}
