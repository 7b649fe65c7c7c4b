//! `cvc._cvc`: the Python extension module behind the `cvc` package. It mirrors the Rust
//! embedding API (`cvc_runtime::session`): [`model::PyModel`] and [`session::PySession`],
//! with NumPy / PyTorch inputs ([`inputs`]), PyTorch-layout state dicts ([`state`]) and
//! cvc's errors as Python exceptions ([`errors`]).

mod errors;
mod inputs;
mod model;
mod outputs;
mod session;
mod state;

use pyo3::prelude::*;

/// The extension module: classes, exceptions and the test hooks.
#[pymodule]
fn _cvc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<model::PyModel>()?;
    m.add_class::<session::PySession>()?;
    m.add_class::<session::PyStepResult>()?;
    m.add("Error", py.get_type::<errors::Error>())?;
    m.add("CompileError", py.get_type::<errors::CompileError>())?;
    m.add("DataError", py.get_type::<errors::DataError>())?;
    m.add_function(wrap_pyfunction!(inputs::staging_copies, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Whether a CUDA driver and GPU are usable by cvc (what `device="auto"` checks).
#[pyfunction]
fn cuda_available() -> bool {
    cvc_runtime::cuda::available().is_ok()
}
