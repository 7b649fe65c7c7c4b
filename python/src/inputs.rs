//! A batch from Python (a dict input name → array) as borrowed tensors for the session.
//!
//! Zero-copy rules: a C-contiguous NumPy array of the input's own dtype (complex64, float32,
//! int32) is read in place; PyTorch CPU tensors arrive through `numpy.asarray` (which shares
//! their memory); a CUDA tensor, when the session is on CUDA, is read through its DLPack
//! capsule and copied device to device into the arena. Anything else (another dtype of the
//! same kind, a strided view, a list) is converted once, and the conversion is counted by
//! [`staging_copies`] so tests can show which inputs were read in place.

use crate::errors::data_error;
use cvc_compiler::ir::{DType, Shape};
use cvc_runtime::session::{TensorBytes, TensorRef};
use numpy::{
    Complex32, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicU64, Ordering};

/// Inputs converted (copied) on their way in, since the module was loaded.
static COPIES: AtomicU64 = AtomicU64::new(0);

/// How many inputs were copied (converted to the input's dtype, made contiguous, or moved
/// between host and device) before upload, since `cvc` was imported. An input read in place
/// does not count. For tests of the zero-copy rules.
#[pyfunction]
pub fn staging_copies() -> u64 {
    COPIES.load(Ordering::Relaxed)
}

fn copied() {
    COPIES.fetch_add(1, Ordering::Relaxed);
}

/// What one model input expects: name, dtype, shape with the batch resolved, the declared
/// type (for messages) and, for labels, the class count.
pub struct Expected {
    /// The input's name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Concrete shape.
    pub shape: Vec<usize>,
    /// The declared shape (with `B`).
    pub declared: Shape,
    /// Class count of a label input.
    pub classes: Option<usize>,
}

/// An input held for the duration of an upload: a read-only NumPy array, or a DLPack
/// capsule whose device memory is borrowed (the capsule is not consumed, so its producer's
/// destructor frees it when it is dropped after the upload).
pub enum Held<'py> {
    /// complex64 elements.
    C64(PyReadonlyArrayDyn<'py, Complex32>),
    /// float32 elements.
    F32(PyReadonlyArrayDyn<'py, f32>),
    /// int32 elements.
    I32(PyReadonlyArrayDyn<'py, i32>),
    /// CUDA device memory.
    Cuda {
        /// Keeps the producer's tensor alive until the upload is done.
        _capsule: Bound<'py, PyAny>,
        /// Device address of the first element.
        ptr: u64,
        /// Bytes.
        len: usize,
    },
}

impl Held<'_> {
    /// The address of the elements (host or device), for the buffer-address tests.
    pub fn address(&self) -> u64 {
        match self {
            Held::C64(a) => a.as_array().as_ptr() as u64,
            Held::F32(a) => a.as_array().as_ptr() as u64,
            Held::I32(a) => a.as_array().as_ptr() as u64,
            Held::Cuda { ptr, .. } => *ptr,
        }
    }
    /// `"host"` or `"cuda"`.
    pub fn place(&self) -> &'static str {
        match self {
            Held::Cuda { .. } => "cuda",
            _ => "host",
        }
    }
    /// The borrowed tensor.
    pub fn tensor(&self, e: &Expected) -> PyResult<TensorRef<'_>> {
        let data = match self {
            Held::C64(a) => TensorBytes::Host(bytes_of(a.as_slice()?)),
            Held::F32(a) => TensorBytes::Host(bytes_of(a.as_slice()?)),
            Held::I32(a) => TensorBytes::Host(bytes_of(a.as_slice()?)),
            Held::Cuda { ptr, len, .. } => TensorBytes::Cuda { ptr: *ptr, len: *len },
        };
        Ok(TensorRef { dtype: e.dtype, shape: e.shape.clone(), data })
    }
}

/// The bytes of a slice of plain numbers (f32, i32, or pairs of f32).
fn bytes_of<T: numpy::Element>(s: &[T]) -> &[u8] {
    // SAFETY: `T` is f32, i32 or Complex32 (two f32, `repr(C)`): plain data without padding,
    // so every byte of the slice is initialised; the byte slice borrows the same memory for
    // the same lifetime.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// NumPy's name of a cvc dtype.
pub fn numpy_name(d: DType) -> &'static str {
    match d {
        DType::C64 => "complex64",
        DType::F32 => "float32",
        DType::I32 => "int32",
    }
}

/// Reads `batch` (a dict name → array) against the expected inputs. With `require`, every
/// input must be present; otherwise missing ones are left out (the session zero-fills them).
/// `cuda`: the session is on CUDA, so CUDA tensors are read through DLPack.
pub fn read_batch<'py>(
    batch: &Bound<'py, PyDict>,
    expected: &[Expected],
    require: bool,
    cuda: bool,
) -> PyResult<Vec<(String, Held<'py>)>> {
    let names: Vec<&str> = expected.iter().map(|e| e.name.as_str()).collect();
    for key in batch.keys() {
        let key: String = key.extract().map_err(|_| data_error("batch keys must be input names (str)"))?;
        if !names.contains(&key.as_str()) {
            return Err(data_error(format!(
                "the batch has '{key}', which is not an input of the model (inputs: {})",
                names.join(", ")
            )));
        }
    }
    let mut out = Vec::new();
    for e in expected {
        match batch.get_item(&e.name)? {
            Some(obj) => out.push((e.name.clone(), read_input(&obj, e, cuda)?)),
            None if require => {
                return Err(data_error(format!(
                    "the batch has no '{}' (expected {} {:?}; inputs: {})",
                    e.name,
                    numpy_name(e.dtype),
                    e.shape,
                    names.join(", ")
                )))
            }
            None => {}
        }
    }
    Ok(out)
}

/// `[32, 1, 128] (c64[B, 1, 128] with B = 32)`.
fn want_text(e: &Expected) -> String {
    format!(
        "{} {:?} ({}{} with B = {})",
        numpy_name(e.dtype),
        e.shape,
        e.dtype,
        e.declared,
        e.shape.first().copied().unwrap_or(0)
    )
}

fn read_input<'py>(obj: &Bound<'py, PyAny>, e: &Expected, cuda: bool) -> PyResult<Held<'py>> {
    let py = obj.py();
    if obj.hasattr("__dlpack_device__")? {
        let (kind, id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
        if kind == DL_CUDA {
            if cuda {
                return read_cuda(obj, e, id);
            }
            // A CUDA tensor for a CPU session: one copy to the host.
            copied();
            let host = obj.call_method0("cpu")?;
            return read_host(py, &host, e);
        }
    }
    read_host(py, obj, e)
}

/// A host array: `numpy.asarray` (no copy for arrays and CPU tensors), then a conversion
/// only when the dtype or the layout does not fit.
fn read_host<'py>(py: Python<'py>, obj: &Bound<'py, PyAny>, e: &Expected) -> PyResult<Held<'py>> {
    let np = py.import("numpy")?;
    // A tensor that requires grad refuses `__array__`; its data is the same without autograd.
    let obj = if obj.getattr("requires_grad").and_then(|r| r.extract::<bool>()).unwrap_or(false) {
        obj.call_method0("detach")?
    } else {
        obj.clone()
    };
    let arr = np.call_method1("asarray", (&obj,)).map_err(|err| {
        data_error(format!(
            "input '{}': expected an array {}, got something NumPy cannot read: {err}",
            e.name,
            want_text(e)
        ))
    })?;
    let untyped = arr.cast::<PyUntypedArray>()?;
    let kind: String = untyped.dtype().getattr("kind")?.extract()?;
    let fits_kind = match e.dtype {
        DType::C64 => kind == "c",
        DType::F32 => kind == "f",
        DType::I32 => kind == "i" || kind == "u",
    };
    let got = format!("{} {:?}", untyped.dtype(), untyped.shape());
    if !fits_kind {
        return Err(data_error(format!(
            "input '{}': expected {}, got {got}{}",
            e.name,
            want_text(e),
            match e.dtype {
                DType::C64 if kind == "f" =>
                    " (a real array for a complex input: convert with .astype(numpy.complex64))",
                DType::I32 => " (class labels are integers)",
                _ => "",
            }
        )));
    }
    if untyped.shape() != e.shape.as_slice() {
        return Err(data_error(format!("input '{}': expected {}, got {got}", e.name, want_text(e))));
    }
    let target = numpy_name(e.dtype);
    let exact = untyped.dtype().getattr("name")?.extract::<String>()? == target;
    // Aligned and in native byte order, which `asarray` gives for anything it did not copy
    // from a foreign buffer; `ascontiguousarray` fixes either.
    let flags = arr.getattr("flags")?;
    let aligned: bool = flags.getattr("aligned")?.extract()?;
    let native: bool = untyped.dtype().getattr("isnative")?.extract()?;
    if e.dtype == DType::I32 && !exact && untyped.len() > 0 {
        // Another integer type: values outside i32 would wrap in the cast.
        let (lo, hi): (i128, i128) =
            (arr.call_method0("min")?.extract()?, arr.call_method0("max")?.extract()?);
        if lo < i32::MIN as i128 || hi > i32::MAX as i128 {
            return Err(data_error(format!("input '{}': values {lo}..={hi} do not fit in int32", e.name)));
        }
    }
    let arr = if exact && untyped.is_c_contiguous() && aligned && native {
        arr
    } else {
        copied();
        let kw = PyDict::new(py);
        kw.set_item("dtype", target)?;
        np.call_method("ascontiguousarray", (&arr,), Some(&kw))?
    };
    let held = match e.dtype {
        DType::C64 => {
            Held::C64(arr.cast::<PyArrayDyn<Complex32>>()?.try_readonly().map_err(|err| busy(e, err))?)
        }
        DType::F32 => Held::F32(arr.cast::<PyArrayDyn<f32>>()?.try_readonly().map_err(|err| busy(e, err))?),
        DType::I32 => {
            let a = arr.cast::<PyArrayDyn<i32>>()?.try_readonly().map_err(|err| busy(e, err))?;
            check_labels(&a, e)?;
            Held::I32(a)
        }
    };
    Ok(held)
}

/// A NumPy array another thread holds a writable borrow of (through the numpy crate).
fn busy(e: &Expected, err: numpy::BorrowError) -> PyErr {
    data_error(format!("input '{}': the array is being written elsewhere ({err})", e.name))
}

/// Class labels must lie in `0..classes`: the loss would read past the logits otherwise.
fn check_labels(a: &PyReadonlyArrayDyn<'_, i32>, e: &Expected) -> PyResult<()> {
    let Some(k) = e.classes else { return Ok(()) };
    if let Some(bad) = a.as_slice()?.iter().find(|&&l| l < 0 || l as usize >= k) {
        return Err(data_error(format!(
            "input '{}': class labels must lie in 0..{k} (`class[B] of {k}`), found {bad}",
            e.name
        )));
    }
    Ok(())
}

/// DLPack's `kDLCUDA`.
const DL_CUDA: i32 = 2;

/// DLPack's `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// DLPack's `DLTensor` (the ABI every producer shares since DLPack 0.2).
#[repr(C)]
struct DlTensor {
    data: *mut std::ffi::c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// The DLPack type code and bit width of a cvc dtype.
fn dl_type(d: DType) -> (u8, u8) {
    match d {
        DType::C64 => (5, 64),
        DType::F32 => (2, 32),
        DType::I32 => (0, 32),
    }
}

/// A CUDA tensor through its DLPack capsule: checked against the input and borrowed in
/// place. A tensor of another dtype or a strided one is converted on the device first
/// (`.to(dtype)` / `.contiguous()`, counted as a copy): still no host round trip.
fn read_cuda<'py>(obj: &Bound<'py, PyAny>, e: &Expected, device_id: i32) -> PyResult<Held<'py>> {
    if device_id != 0 {
        return Err(data_error(format!(
            "input '{}': the tensor is on cuda:{device_id}, but cvc's session runs on cuda:0",
            e.name
        )));
    }
    let py = obj.py();
    let target = numpy_name(e.dtype);
    let mut obj = obj.clone();
    if let Ok(dtype) = obj.getattr("dtype") {
        let name = dtype.str()?.to_string();
        if !name.ends_with(target) {
            let torch = py.import("torch")?;
            obj = obj.call_method1("to", (torch.getattr(target)?,))?;
            copied();
        }
    }
    if obj.hasattr("is_contiguous")? && !obj.call_method0("is_contiguous")?.extract::<bool>()? {
        obj = obj.call_method0("contiguous")?;
        copied();
    }
    let kw = PyDict::new(py);
    // Stream 1, CUDA's legacy default stream (the one the runtime's synchronous copies run
    // on): the producer makes it wait for the work that wrote the tensor.
    kw.set_item("stream", 1)?;
    let capsule = obj.call_method("__dlpack__", (), Some(&kw))?;
    // SAFETY: `capsule` is a live Python object; `PyCapsule_GetPointer` checks its type and
    // name and returns null (with an exception set) on a mismatch.
    let managed = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dltensor".as_ptr()) };
    if managed.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            data_error(format!("input '{}': __dlpack__ did not return a DLPack capsule", e.name))
        }));
    }
    // SAFETY: a "dltensor" capsule holds a `DLManagedTensor`, whose first field is the
    // `DLTensor`; the producer keeps it valid while the (unconsumed) capsule lives.
    let t = unsafe { &*(managed as *const DlTensor) };
    let (code, bits) = dl_type(e.dtype);
    if t.device.device_type != DL_CUDA || t.dtype.code != code || t.dtype.bits != bits || t.dtype.lanes != 1 {
        return Err(data_error(format!(
            "input '{}': expected a CUDA {target} tensor, the DLPack tensor has type code {} bits {} on device type {}",
            e.name, t.dtype.code, t.dtype.bits, t.device.device_type
        )));
    }
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    // SAFETY: `shape` (and `strides` when not null) point to `ndim` values (DLPack's contract).
    let shape: Vec<usize> =
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }.iter().map(|&d| d as usize).collect();
    if shape != e.shape {
        return Err(data_error(format!(
            "input '{}': expected {}, got a CUDA tensor {shape:?}",
            e.name,
            want_text(e)
        )));
    }
    if !t.strides.is_null() {
        // SAFETY: see above.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut want = 1i64;
        for (d, &s) in shape.iter().zip(strides).rev() {
            if *d > 1 && s != want {
                return Err(data_error(format!("input '{}': the CUDA tensor is not contiguous", e.name)));
            }
            want *= *d as i64;
        }
    }
    let len = shape.iter().product::<usize>() * e.dtype.bytes();
    let ptr = t.data as u64 + t.byte_offset;
    Ok(Held::Cuda { _capsule: capsule, ptr, len })
}
