//! Host tensors to NumPy arrays (complex64 / float32 / int32, the tensor's shape), and on
//! request to PyTorch tensors sharing the arrays' memory (`torch.from_numpy`).

use cvc_compiler::ir::DType;
use cvc_runtime::backend::{HostData, HostTensor};
use numpy::{Complex32, PyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A NumPy array holding a copy of `t` (the arena's memory is reused by the next step).
pub fn to_numpy<'py>(py: Python<'py>, t: &HostTensor) -> PyResult<Bound<'py, PyAny>> {
    let flat = match (&t.data, t.dtype) {
        (HostData::F32(v), DType::C64) => {
            let z: Vec<Complex32> = v.chunks_exact(2).map(|p| Complex32::new(p[0], p[1])).collect();
            PyArray1::from_vec(py, z).into_any()
        }
        (HostData::F32(v), _) => PyArray1::from_slice(py, v).into_any(),
        (HostData::I32(v), _) => PyArray1::from_slice(py, v).into_any(),
    };
    flat.call_method1("reshape", (t.shape.clone(),))
}

/// `to_numpy`, then `torch.from_numpy` when `as_torch`.
pub fn to_python<'py>(py: Python<'py>, t: &HostTensor, as_torch: bool) -> PyResult<Bound<'py, PyAny>> {
    let a = to_numpy(py, t)?;
    if as_torch {
        py.import("torch")?.call_method1("from_numpy", (a,))
    } else {
        Ok(a)
    }
}

/// A dict name → array of `tensors`, in their order.
pub fn dict_of<'py>(
    py: Python<'py>,
    tensors: &[(String, HostTensor)],
    as_torch: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, t) in tensors {
        d.set_item(name, to_python(py, t, as_torch)?)?;
    }
    Ok(d)
}

/// A JSON value as Python objects (dicts, lists, numbers, strings), through `json.loads`.
pub fn json_to_python<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (v.to_string(),))
}
