//! `cvc.Model`: a checked `.cvnn` model (Rust: `cvc_runtime::session::Model`).

use crate::errors::{bad_argument, guard, model_error, runtime_error};
use crate::inputs::{numpy_name, Expected};
use crate::outputs::json_to_python;
use crate::session::PySession;
use cvc_compiler::config::Precision;
use cvc_compiler::ir::{DType, Dim, Mode};
use cvc_runtime::cli::{check, plan};
use cvc_runtime::data::InputSpec;
use cvc_runtime::session::{Device, Model, SessionOptions};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// A checked `.cvnn` model: its training and inference graphs and its `train` section.
///
/// Build one with `Model.from_file(path)` or `Model.from_source(text)`; a model the front
/// end rejects raises `cvc.CompileError`.
#[pyclass(name = "Model", module = "cvc", frozen)]
pub struct PyModel {
    pub(crate) model: Model,
}

/// The expected inputs of `specs` at batch `batch`.
pub fn expected(specs: &[InputSpec], batch: usize) -> Vec<Expected> {
    specs
        .iter()
        .map(|s| Expected {
            name: s.name.clone(),
            dtype: s.ty.dtype,
            shape: s.ty.shape.resolve(batch),
            declared: s.ty.shape.clone(),
            classes: s.classes,
        })
        .collect()
}

fn device_of(name: &str) -> PyResult<Device> {
    match name {
        "auto" => Ok(Device::Auto),
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda),
        "interp" => Ok(Device::Interp),
        other => {
            Err(bad_argument(format!("device={other:?}: expected \"auto\", \"cpu\", \"cuda\" or \"interp\"")))
        }
    }
}

fn precision_of(name: &str) -> PyResult<Precision> {
    Precision::from_name(name).ok_or_else(|| {
        bad_argument(format!("precision={name:?}: expected \"fp32\", \"tf32\", \"bf16\" or \"fp16\""))
    })
}

fn shape_list(py: Python<'_>, shape: &cvc_compiler::ir::Shape) -> PyResult<Py<PyAny>> {
    let dims: Vec<Py<PyAny>> = shape
        .0
        .iter()
        .map(|d| match d {
            Dim::Batch => "B".into_pyobject(py).map(|o| o.into_any().unbind()),
            Dim::Fixed(n) => n.into_pyobject(py).map(|o| o.into_any().unbind()),
        })
        .collect::<Result<_, _>>()?;
    Ok(pyo3::types::PyList::new(py, dims)?.into_any().unbind())
}

#[pymethods]
impl PyModel {
    /// Reads and checks a `.cvnn` file; raises `cvc.CompileError` on a rejected model.
    #[staticmethod]
    fn from_file(py: Python<'_>, path: PathBuf) -> PyResult<PyModel> {
        guard(|| Model::from_file(&path).map(|model| PyModel { model }).map_err(|e| model_error(py, &e)))
    }

    /// Checks `.cvnn` source text; `name` is the file name diagnostics show.
    #[staticmethod]
    #[pyo3(signature = (text, name = "<string>"))]
    fn from_source(py: Python<'_>, text: &str, name: &str) -> PyResult<PyModel> {
        guard(|| {
            Model::from_source(name, text).map(|model| PyModel { model }).map_err(|e| model_error(py, &e))
        })
    }

    /// The model's name.
    #[getter]
    fn name(&self) -> String {
        self.model.name().to_string()
    }

    /// The file name given when the model was built.
    #[getter]
    fn file(&self) -> String {
        self.model.file().to_string()
    }

    /// The inputs of a training step: a list of dicts with `name`, `dtype` (NumPy's name),
    /// `shape` (`"B"` for the batch) and `classes` (labels) or None.
    #[getter]
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<Py<PyDict>>> {
        self.model
            .inputs()
            .iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("name", &s.name)?;
                d.set_item("dtype", numpy_name(s.ty.dtype))?;
                d.set_item("shape", shape_list(py, &s.ty.shape)?)?;
                d.set_item("classes", s.classes)?;
                Ok(d.unbind())
            })
            .collect()
    }

    /// The batch size of the `train` section (its default when the file has none).
    #[getter]
    fn batch(&self) -> usize {
        self.model.config().batch
    }

    /// The layer table, as `cvc check --json` prints it: a list of dicts with `label`, `op`,
    /// `shape`, `dtype`, `params_complex`, `params_real` and `line`.
    fn check(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        guard(|| {
            let c = cvc_compiler::front::check_source(self.model.file(), self.model.source(), Mode::Train)
                .map_err(|diags| {
                    let e = cvc_runtime::session::ModelError::Diagnostics {
                        file: self.model.file().to_string(),
                        src: self.model.source().to_string(),
                        diags,
                    };
                    model_error(py, &e)
                })?;
            let json = check::to_json(&c);
            Ok(json_to_python(py, &json["layers"])?.unbind())
        })
    }

    /// The static memory plan of a training step at `batch` (default: the `train`
    /// section's), as `cvc plan --json` gives it: `arena_bytes`, `lower_bound_bytes`,
    /// `live_at_peak` (each tensor with `bytes`, `kind`, `label` and its `.cvnn` `line`),
    /// kernels, passes. `mode="eval"` plans inference instead.
    #[pyo3(signature = (batch = None, mode = "train", memory_budget = None))]
    fn plan(
        &self,
        py: Python<'_>,
        batch: Option<usize>,
        mode: &str,
        memory_budget: Option<u64>,
    ) -> PyResult<Py<PyAny>> {
        let mode = match mode {
            "train" => Mode::Train,
            "eval" => Mode::Eval,
            other => return Err(bad_argument(format!("mode={other:?}: expected \"train\" or \"eval\""))),
        };
        let batch = batch.unwrap_or(self.model.config().batch);
        if batch == 0 {
            return Err(bad_argument("batch must be at least 1"));
        }
        guard(|| {
            let budget = memory_budget.or(self.model.config().memory_budget);
            let p = self.model.compile(mode, batch, budget).map_err(runtime_error)?;
            Ok(json_to_python(py, &plan::json(&p, self.model.source()))?.unbind())
        })
    }

    /// A session: parameters initialised from the `train` section's seed, on `device`
    /// (`"auto"`: CUDA when usable, else the CPU), with training steps of `batch` rows.
    /// `precision`: `"fp32"`, `"tf32"` (GPU contractions), `"bf16"` or `"fp16"` (16-bit
    /// activations on the GPU; the CPU computes in f32). Unset arguments come from the
    /// `train` section.
    #[pyo3(signature = (device = "auto", batch = None, precision = None, seed = None, memory_budget = None))]
    fn session(
        &self,
        device: &str,
        batch: Option<usize>,
        precision: Option<&str>,
        seed: Option<u64>,
        memory_budget: Option<u64>,
    ) -> PyResult<PySession> {
        let defaults = SessionOptions::from_config(self.model.config());
        let opts = SessionOptions {
            device: device_of(device)?,
            batch: batch.unwrap_or(defaults.batch),
            seed: seed.unwrap_or(defaults.seed),
            memory_budget: memory_budget.or(defaults.memory_budget),
            precision: precision.map(precision_of).transpose()?.unwrap_or(defaults.precision),
        };
        if opts.batch == 0 {
            return Err(bad_argument("batch must be at least 1"));
        }
        guard(|| {
            let s = self.model.session_with(&opts).map_err(runtime_error)?;
            Ok(PySession::new(s))
        })
    }

    fn __repr__(&self) -> String {
        let inputs: Vec<String> = self
            .model
            .inputs()
            .iter()
            .map(|s| format!("{}: {}{}", s.name, dtype_word(s.ty.dtype), s.ty.shape))
            .collect();
        format!("<cvc.Model {} ({}) inputs {}>", self.model.name(), self.model.file(), inputs.join(", "))
    }
}

fn dtype_word(d: DType) -> String {
    d.to_string()
}
