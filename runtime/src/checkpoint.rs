//! Checkpoints in the safetensors format, written atomically.
//!
//! Layout, compatible with PyTorch: a complex tensor of shape `S` is stored as an f32 tensor
//! of shape `S + [2]` (`torch.view_as_real`); real tensors as f32, integer state (the step
//! counter) as i32. Names are the IR leaf names: parameters `<binding>.<param>`, state
//! buffers (optimizer moments, running statistics, the step) under their own names. The
//! safetensors metadata holds run information (epoch, seeds) as strings, plus `cvc.complex`:
//! the comma-separated names of the tensors stored in the `[..., 2]` layout.

use crate::backend::{HostData, HostTensor};
use crate::files;
use cvc_compiler::front::limits;
use cvc_compiler::ir::DType;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

/// Metadata key listing the complex tensors.
pub const COMPLEX_KEY: &str = "cvc.complex";

/// A checkpoint read back: tensors in their arena layout (complex tensors interleaved again)
/// and the metadata strings.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Tensors by name, in the file's order (sorted by name).
    pub tensors: BTreeMap<String, HostTensor>,
    /// Metadata strings (without [`COMPLEX_KEY`]).
    pub metadata: BTreeMap<String, String>,
}

impl Checkpoint {
    /// The tensor called `name`, or an error naming the file and the tensor.
    pub fn get(&self, name: &str, file: &Path) -> Result<&HostTensor, String> {
        self.tensors
            .get(name)
            .ok_or_else(|| format!("{}: no tensor named '{name}' in the checkpoint", file.display()))
    }
    /// A metadata value.
    pub fn meta(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(|s| s.as_str())
    }
}

/// Serialises tensors and metadata to safetensors bytes (complex as `[..., 2]` f32).
pub fn to_bytes(
    tensors: &[(String, HostTensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, String> {
    let raw: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, t)| {
            let (dtype, mut shape) = match t.dtype {
                DType::F32 | DType::C64 => (Dtype::F32, t.shape.clone()),
                DType::I32 => (Dtype::I32, t.shape.clone()),
            };
            if t.dtype == DType::C64 {
                shape.push(2);
            }
            (name.clone(), dtype, shape, t.as_bytes().into_owned())
        })
        .collect();
    let views = raw
        .iter()
        .map(|(n, d, s, b)| TensorView::new(*d, s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("checkpoint tensor layout: {e}"))?;
    let mut meta: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let complex: Vec<&str> =
        tensors.iter().filter(|(_, t)| t.dtype == DType::C64).map(|(n, _)| n.as_str()).collect();
    meta.insert(COMPLEX_KEY.into(), complex.join(","));
    safetensors::serialize(views, Some(meta)).map_err(|e| format!("writing safetensors: {e}"))
}

/// Checks a safetensors header against the bytes that follow it, naming the tensor whose
/// declared size (shape × dtype, in checked arithmetic) disagrees with its byte range or runs
/// past the end of the file. The safetensors crate checks the same, but its errors do not say
/// which tensor or how many bytes.
fn check_header(bytes: &[u8], file: &Path) -> Result<(), String> {
    let f = file.display();
    if bytes.len() < 8 {
        return Err(format!(
            "{f}: not a valid safetensors file: {} bytes, shorter than the 8-byte header length",
            bytes.len()
        ));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let data_len = (bytes.len() - 8) as u64;
    if n > data_len {
        return Err(format!(
            "{f}: not a valid safetensors file: the header declares {n} bytes but the file holds {data_len} after the length"
        ));
    }
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n as usize]).map_err(|e| {
            format!("{f}: not a valid safetensors file: the header is not a JSON object: {e}")
        })?;
    let available = data_len - n;
    for (name, info) in &header {
        if name == "__metadata__" {
            continue;
        }
        let bad = |why: String| format!("{f}: tensor '{name}': {why}");
        let dtype = info.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| bad("no dtype".into()))?;
        let width: u64 = match dtype {
            "F64" | "I64" | "U64" => 8,
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
            // Other (sub-byte) types are refused below with the dtype named.
            _ => 1,
        };
        let shape = info
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no shape".into()))?
            .iter()
            .map(|d| d.as_u64().ok_or_else(|| bad(format!("shape entry {d} is not a size"))))
            .collect::<Result<Vec<u64>, _>>()?;
        let offsets = info
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .filter(|o| o.len() == 2)
            .and_then(|o| Some((o[0].as_u64()?, o[1].as_u64()?)))
            .ok_or_else(|| bad("data_offsets is not a pair of byte offsets".into()))?;
        let declared = shape.iter().try_fold(width, |acc, &d| acc.checked_mul(d));
        let Some(declared) = declared else {
            return Err(bad(format!("shape {shape:?} of {dtype} declares more than 16 EiB")));
        };
        let (start, end) = offsets;
        if end < start || end - start != declared {
            return Err(bad(format!(
                "shape {shape:?} of {dtype} declares {declared} bytes, but its data_offsets [{start}, {end}] span {}",
                end.saturating_sub(start)
            )));
        }
        if end > available {
            return Err(bad(format!(
                "its data ends at byte {end} of the data section, but the file holds only {available} data bytes (truncated?)"
            )));
        }
    }
    Ok(())
}

/// Parses safetensors bytes. `file` names the source in errors; sizes are checked against
/// the bytes held before any tensor is converted.
pub fn from_bytes(bytes: &[u8], file: &Path) -> Result<Checkpoint, String> {
    check_header(bytes, file)?;
    let what =
        |e: safetensors::SafeTensorError| format!("{}: not a valid safetensors file: {e}", file.display());
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(what)?;
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(what)?;
    let mut metadata: BTreeMap<String, String> =
        meta.metadata().clone().unwrap_or_default().into_iter().collect();
    let complex: Vec<String> = metadata
        .remove(COMPLEX_KEY)
        .map(|s| s.split(',').filter(|x| !x.is_empty()).map(String::from).collect())
        .unwrap_or_default();
    let mut tensors = BTreeMap::new();
    for (name, view) in st.tensors() {
        let mut shape = view.shape().to_vec();
        let t = match view.dtype() {
            Dtype::F32 => {
                let is_complex = complex.contains(&name);
                if is_complex {
                    if shape.last() != Some(&2) {
                        return Err(format!(
                            "{}: tensor '{name}' is marked complex but its shape {shape:?} does not end in 2",
                            file.display()
                        ));
                    }
                    shape.pop();
                }
                let dtype = if is_complex { DType::C64 } else { DType::F32 };
                HostTensor::from_bytes(dtype, &shape, view.data())
            }
            Dtype::I32 => HostTensor::from_bytes(DType::I32, &shape, view.data()),
            other => {
                return Err(format!(
                    "{}: tensor '{name}' has dtype {other:?}; cvc checkpoints hold F32 and I32 only",
                    file.display()
                ))
            }
        };
        tensors.insert(name, t);
    }
    Ok(Checkpoint { tensors, metadata })
}

/// Writes a checkpoint atomically: a temporary file in the same folder, flushed and synced,
/// then renamed over `path` (readers see the old or the new file, never a torn one).
pub fn save(
    path: &Path,
    tensors: &[(String, HostTensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<(), String> {
    let bytes = to_bytes(tensors, metadata)?;
    write_atomic(path, &bytes)
}

/// Writes `bytes` to `path` atomically (temp file in the same folder + fsync + rename + fsync
/// of the folder). The temporary is `.<name>.tmp-<pid>`; one a crash leaves behind is removed
/// by the next `cvc train` in that folder ([`crate::run_dir`]), which also documents the
/// fault-injection points `<stem>.tmp` and `<stem>` passed here.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    let name =
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "checkpoint".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let stem = path.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let err = |e: std::io::Error| format!("{}: {e}", tmp.display());
    let result = (|| {
        let mut f = File::create(&tmp).map_err(err)?;
        f.write_all(bytes).map_err(err)?;
        f.sync_all().map_err(err)?;
        drop(f);
        crate::run_dir::crash_point(&format!("{stem}.tmp"));
        fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))?;
        // Persist the rename itself; not every platform can open a folder, so best effort.
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        crate::run_dir::crash_point(&stem);
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Reads a checkpoint file: a regular file (not a FIFO or a device such as `/dev/zero`) of at
/// most [`limits::max_weights_bytes`], whose header's tensor sizes must match the bytes the
/// file holds (checked by [`from_bytes`]).
pub fn load(path: &Path) -> Result<Checkpoint, String> {
    let max = limits::max_weights_bytes()?;
    let raise = format!(
        "raise the limit with the environment variable {} if the file is genuine (see docs/LIMITS.md)",
        limits::MAX_WEIGHTS_BYTES_VAR
    );
    let bytes = files::read_regular(path, "weights file", max, &raise)?;
    from_bytes(&bytes, path)
}

/// Converts a checkpoint tensor to the type a model leaf expects, with an error naming the
/// file, the tensor, and both shapes. A complex leaf also accepts an f32 tensor of shape
/// `shape + [2]` written by another tool without the `cvc.complex` marker.
pub fn conform(
    t: &HostTensor,
    dtype: DType,
    shape: &[usize],
    name: &str,
    file: &Path,
) -> Result<HostTensor, String> {
    if t.dtype == dtype && t.shape == shape {
        return Ok(t.clone());
    }
    if dtype == DType::C64
        && t.dtype == DType::F32
        && t.shape.len() == shape.len() + 1
        && t.shape[..shape.len()] == *shape
        && t.shape.last() == Some(&2)
    {
        if let HostData::F32(v) = &t.data {
            return Ok(HostTensor { dtype, shape: shape.to_vec(), data: HostData::F32(v.clone()) });
        }
    }
    let show = |d: DType, s: &[usize]| {
        if d == DType::C64 {
            format!("c64 {s:?} (stored f32 {s:?}+[2])")
        } else {
            format!("{d} {s:?}")
        }
    };
    Err(format!(
        "{}: tensor '{name}' is {}, the model expects {}",
        file.display(),
        show(t.dtype, &t.shape),
        show(dtype, shape)
    ))
}
