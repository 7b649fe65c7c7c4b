//! cvc's errors as Python exceptions, and the panic guard every entry point runs under.
//!
//! `cvc.Error` is the base (a `RuntimeError`); `cvc.CompileError` carries the first
//! diagnostic's `file`, `line` and `column` and the rendered report as `str(e)`;
//! `cvc.DataError` (also a `ValueError`) names the input and what was expected.

use cvc_runtime::backend::RuntimeError;
use cvc_runtime::session::ModelError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

pyo3::create_exception!(cvc, Error, PyRuntimeError, "Base class of the errors cvc raises.");
pyo3::create_exception!(
    cvc,
    CompileError,
    Error,
    "A `.cvnn` model was rejected: `file`, `line` and `column` locate the first diagnostic; \
     `str(e)` is the rendered report with source excerpts."
);
pyo3::create_exception!(
    cvc,
    DataError,
    Error,
    "An input, state dict or checkpoint does not fit the model: the message names the tensor \
     and the expected shape and dtype."
);

/// A `DataError` with `message`.
pub fn data_error(message: impl Into<String>) -> PyErr {
    DataError::new_err(message.into())
}

/// A runtime failure: input mismatches (`input '...'`, `no data given`, `missing parameter`)
/// are data errors, the rest `cvc.Error`.
pub fn runtime_error(e: RuntimeError) -> PyErr {
    let m = e.0;
    let is_data = m.starts_with("input '")
        || m.starts_with("no data given")
        || m.contains("missing parameter")
        || m.contains("checkpoint")
        || m.contains("safetensors");
    if is_data {
        DataError::new_err(m)
    } else {
        Error::new_err(m)
    }
}

/// A model error: diagnostics become a `CompileError` located at the first one.
pub fn model_error(py: Python<'_>, e: &ModelError) -> PyErr {
    match e {
        ModelError::Diagnostics { file, src, diags } => {
            let (line, column) = diags.first().map_or((0, 0), |d| d.primary.span.line_col(src));
            located(py, e.render(false), file, line, column)
        }
        ModelError::Message(m) => Error::new_err(m.clone()),
    }
}

/// A `CompileError` with its location attributes set.
pub fn located(py: Python<'_>, message: String, file: &str, line: usize, column: usize) -> PyErr {
    let err = CompileError::new_err(message);
    let value = err.value(py);
    // Setting attributes on a fresh exception instance cannot fail short of memory
    // exhaustion; the error itself is still raised if it does.
    let _ = value.setattr("file", file);
    let _ = value.setattr("line", line);
    let _ = value.setattr("column", column);
    err
}

/// Runs `f`, turning a panic into `cvc.Error` (so a bug in cvc raises an exception instead of
/// unwinding into the interpreter as PyO3's `PanicException`, a `BaseException` that
/// `except Exception` does not catch).
pub fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::new_err(format!(
                "internal error in cvc: {what} (this is a bug in cvc, not in your code: please report it)"
            )))
        }
    }
}

/// `ValueError` for a bad argument (a device name, a batch size).
pub fn bad_argument(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}
