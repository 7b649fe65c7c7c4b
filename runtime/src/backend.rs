//! The interface every execution back end implements (CPU JIT, CUDA), and host tensors.

use crate::numerics::NonFinite;
use cvc_compiler::ir::{DType, Storage, Value};
use std::fmt;

/// One 16-bit word (little-endian) of a buffer stored as `storage` (bf16 or fp16), widened to f32.
pub fn widen_half(word: [u8; 2], storage: Storage) -> f32 {
    let bits = u16::from_le_bytes(word);
    match storage {
        Storage::Bf16 => half::bf16::from_bits(bits).to_f32(),
        Storage::F16 => half::f16::from_bits(bits).to_f32(),
        Storage::Full => f32::from(bits),
    }
}

/// Bytes of a 16-bit buffer (`storage`) widened to little-endian f32 words, as a full-width
/// buffer of the same values would hold them.
pub fn widen_half_bytes(bytes: &[u8], storage: Storage) -> Vec<u8> {
    bytes.chunks_exact(2).flat_map(|c| widen_half([c[0], c[1]], storage).to_le_bytes()).collect()
}

/// Little-endian f32 words rounded (to nearest even, as the GPU's stores do) to 16-bit words
/// of `storage`.
pub fn narrow_to_half(bytes: &[u8], storage: Storage) -> Vec<u8> {
    bytes
        .chunks_exact(4)
        .flat_map(|c| {
            let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            match storage {
                Storage::Bf16 => half::bf16::from_f32(x).to_bits(),
                _ => half::f16::from_f32(x).to_bits(),
            }
            .to_le_bytes()
        })
        .collect()
}

/// Element storage of a host tensor: f32 (complex interleaved re, im) or i32 (labels, step).
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// Real values, or complex as interleaved `(re, im)` pairs.
    F32(Vec<f32>),
    /// Integer values.
    I32(Vec<i32>),
}

/// A tensor in host memory, laid out as the arena stores it (row-major, complex interleaved).
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: DType,
    /// Concrete shape.
    pub shape: Vec<usize>,
    /// Elements.
    pub data: HostData,
}

impl HostTensor {
    /// A zero tensor.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Self {
        let n: usize = shape.iter().product();
        let data = match dtype {
            DType::F32 => HostData::F32(vec![0.0; n]),
            DType::C64 => HostData::F32(vec![0.0; 2 * n]),
            DType::I32 => HostData::I32(vec![0; n]),
        };
        HostTensor { dtype, shape: shape.to_vec(), data }
    }
    /// A tensor of `dtype`/`shape` holding `values` (one per element, row-major), rounded to
    /// the stored precision: f32 takes the real parts, c64 both, i32 the truncated real parts.
    pub fn from_values(dtype: DType, shape: &[usize], values: &[num_complex::Complex64]) -> Self {
        let data = match dtype {
            DType::F32 => HostData::F32(values.iter().map(|z| z.re as f32).collect()),
            DType::C64 => HostData::F32(values.iter().flat_map(|z| [z.re as f32, z.im as f32]).collect()),
            DType::I32 => HostData::I32(values.iter().map(|z| z.re as i32).collect()),
        };
        HostTensor { dtype, shape: shape.to_vec(), data }
    }
    /// Number of elements (complex counts once).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Bytes as stored.
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.bytes()
    }
    /// The f32 storage (panics on i32 tensors: callers check the dtype first).
    pub fn f32s(&self) -> &[f32] {
        match &self.data {
            HostData::F32(v) => v,
            HostData::I32(_) => panic!("f32s() on an i32 tensor"),
        }
    }
    /// The raw bytes (little-endian), as copied into an arena: the storage itself on a
    /// little-endian machine (no copy: a training step uploads its batch through this), a
    /// converted copy elsewhere.
    pub fn as_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        if cfg!(target_endian = "little") {
            return std::borrow::Cow::Borrowed(match &self.data {
                HostData::F32(v) => bytemuck::cast_slice(v),
                HostData::I32(v) => bytemuck::cast_slice(v),
            });
        }
        std::borrow::Cow::Owned(match &self.data {
            HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        })
    }
    /// Makes `self` a `dtype`/`shape` tensor and returns its storage as (native-endian) bytes
    /// to be overwritten, keeping the allocation when it has room (the contents are stale).
    pub fn reshape_for_overwrite(&mut self, dtype: DType, shape: &[usize]) -> &mut [u8] {
        let n: usize = shape.iter().product::<usize>() * if dtype == DType::C64 { 2 } else { 1 };
        let keep = matches!((&self.data, dtype), (HostData::I32(_), DType::I32))
            || matches!((&self.data, dtype), (HostData::F32(_), DType::F32 | DType::C64));
        if !keep {
            self.data = match dtype {
                DType::I32 => HostData::I32(Vec::new()),
                _ => HostData::F32(Vec::new()),
            };
        }
        self.dtype = dtype;
        self.shape.clear();
        self.shape.extend_from_slice(shape);
        match &mut self.data {
            HostData::F32(v) => {
                v.resize(n, 0.0);
                bytemuck::cast_slice_mut(v)
            }
            HostData::I32(v) => {
                v.resize(n, 0);
                bytemuck::cast_slice_mut(v)
            }
        }
    }
    /// A tensor of `dtype`/`shape` from raw little-endian bytes.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Self {
        let data = match dtype {
            DType::I32 => HostData::I32(
                bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            ),
            _ => HostData::F32(
                bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            ),
        };
        HostTensor { dtype, shape: shape.to_vec(), data }
    }
}

/// A runtime failure (device errors, missing libraries, bad buffers).
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeError(pub String);

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for RuntimeError {}
impl From<cvc_compiler::CompileError> for RuntimeError {
    fn from(e: cvc_compiler::CompileError) -> Self {
        RuntimeError(e.to_string())
    }
}
impl From<String> for RuntimeError {
    fn from(s: String) -> Self {
        RuntimeError(s)
    }
}

/// An execution back end holding one compiled program and its arena.
pub trait Backend {
    /// `cpu` or `cuda:<device name>`.
    fn name(&self) -> String;
    /// Copies `t` into the buffer of `v` (an input, parameter or state).
    fn upload(&mut self, v: Value, t: &HostTensor) -> Result<(), RuntimeError>;
    /// Copies the buffer of `v` (any materialised value) to the host.
    fn download(&mut self, v: Value) -> Result<HostTensor, RuntimeError>;
    /// [`Backend::download`] into `out`, reusing its storage where it has room: a training
    /// loop that hands each step's outputs back allocates (and page-faults) nothing per step,
    /// which for per-pixel outputs of hundreds of MB cost more than the copy. The default
    /// downloads afresh.
    fn download_into(&mut self, v: Value, out: &mut HostTensor) -> Result<(), RuntimeError> {
        *out = self.download(v)?;
        Ok(())
    }
    /// Runs every kernel group of the program once, in schedule order.
    fn step(&mut self) -> Result<(), RuntimeError>;
    /// Runs one step like [`Backend::step`], but after each launch waits for it and scans the
    /// f32/c64 buffers it wrote; stops after the first launch that wrote a NaN or an infinity
    /// and says where (check mode, `crate::numerics`). [`Backend::step`] itself never scans.
    fn step_checked(&mut self) -> Result<Option<NonFinite>, RuntimeError>;
    /// Steps run by [`Backend::step_checked`] so far (tests hold check-off runs to zero).
    fn checked_steps(&self) -> u64;
    /// Host memory the back end holds outside the arena, itemised for the memory report
    /// (label, bytes): JIT code, per-thread workspaces, page-locked staging, ...
    fn host_memory(&self) -> Vec<(String, usize)> {
        Vec::new()
    }
    /// Starts a step without waiting for it; [`Backend::finish`] waits. Back ends that compute
    /// on the calling thread run the whole step here (the default).
    fn launch(&mut self) -> Result<(), RuntimeError> {
        self.step()
    }
    /// Waits for the step [`Backend::launch`] started.
    fn finish(&mut self) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// Whether `launch` returns before the step is done, so the host can prepare the next
    /// batch meanwhile and [`Backend::stage`] it.
    fn overlaps(&self) -> bool {
        false
    }
    /// Copies `t` into host staging memory kept for input `v` (page-locked on a GPU), so that
    /// [`Backend::upload_staged`] later moves it in one fast transfer. `false` where the back
    /// end keeps no staging memory (the caller then uploads with [`Backend::upload`]).
    fn stage(&mut self, _v: Value, _t: &HostTensor) -> Result<bool, RuntimeError> {
        Ok(false)
    }
    /// Uploads what [`Backend::stage`] last put aside for `v`.
    fn upload_staged(&mut self, v: Value) -> Result<(), RuntimeError> {
        Err(RuntimeError(format!("upload of {v}: nothing was staged for it")))
    }
    /// Copies a `dtype`/`shape` tensor given as little-endian bytes (the layout
    /// [`HostTensor::as_bytes`] gives) into the buffer of `v`. Back ends that copy host memory
    /// into an arena take `bytes` straight from the caller's buffer (the Python package hands
    /// NumPy arrays over this way, without a copy); the default goes through a [`HostTensor`].
    fn upload_bytes(
        &mut self,
        v: Value,
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        self.upload(v, &HostTensor::from_bytes(dtype, shape, bytes))
    }
    /// Copies `len` bytes of CUDA device memory at `ptr` (an address in this process's
    /// unified address space, e.g. a PyTorch CUDA tensor's data) into the buffer of `v`,
    /// device to device. An error on back ends without device memory.
    fn upload_device(&mut self, v: Value, _ptr: u64, _len: usize) -> Result<(), RuntimeError> {
        Err(RuntimeError(format!(
            "upload to {v}: the {} back end cannot read CUDA device memory (open the session on cuda, or pass host arrays)",
            self.name()
        )))
    }
    /// Arena size allocated from the plan, in bytes.
    fn arena_bytes(&self) -> usize;
    /// Measured peak memory of the process/device attributable to this back end, in bytes
    /// (CPU: peak RSS; CUDA: driver-reported used memory delta), when known.
    fn measured_peak_bytes(&self) -> Option<usize>;
}
