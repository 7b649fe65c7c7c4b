//! Reading and writing NumPy `.npy` arrays and `.npz` archives as [`HostTensor`]s.
//!
//! Supported element types: `complex64` (and `complex128`, narrowed), `float32` (and
//! `float64`, narrowed), `int32`, `int64` and the smaller integer types (labels). Arrays must
//! be C-ordered. Complex values become interleaved `(re, im)` f32 pairs, as the arena stores
//! them.

use crate::backend::{HostData, HostTensor};
use cvc_compiler::ir::DType;
use npyz::zip;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, Write};
use std::path::Path;

/// An array read from a `.npy` file (or one member of a `.npz`).
#[derive(Clone, Debug, PartialEq)]
pub struct NpyArray {
    /// The NumPy dtype as found in the file (`complex64`, `float32`, `int64`, ...).
    pub numpy_dtype: String,
    /// The array, converted to the arena's element types.
    pub tensor: HostTensor,
}

fn numpy_name(kind: char, size: u64) -> String {
    match kind {
        'c' => format!("complex{}", size * 8),
        'f' => format!("float{}", size * 8),
        'i' => format!("int{}", size * 8),
        'u' => format!("uint{}", size * 8),
        'b' => "bool".into(),
        other => format!("dtype '{other}{size}'"),
    }
}

/// Parses `.npy` bytes from `r` (positioned at the start of the file).
pub fn read_npy(r: impl Read) -> Result<NpyArray, String> {
    let file = npyz::NpyFile::new(r).map_err(|e| format!("not a valid .npy array: {e}"))?;
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    if file.order() == npyz::Order::Fortran {
        return Err("the array is Fortran-ordered; save it with np.ascontiguousarray(...)".into());
    }
    let ts = match file.dtype() {
        npyz::DType::Plain(ts) => ts,
        _ => return Err("unsupported structured (record) dtype".into()),
    };
    let size = ts.size_field();
    let kind = ts.type_char().to_str().chars().next().unwrap_or('?');
    let numpy_dtype = numpy_name(kind, size);
    let big = ts.endianness() == npyz::Endianness::Big;
    let mut bytes = Vec::new();
    file.into_inner().read_to_end(&mut bytes).map_err(|e| format!("reading the array data: {e}"))?;
    let n: usize = shape.iter().product();
    let per = match kind {
        'c' if size == 8 || size == 16 => size as usize,
        'f' if size == 4 || size == 8 => size as usize,
        'i' | 'u' | 'b' if (1..=8).contains(&size) => size as usize,
        _ => return Err(format!("unsupported dtype {numpy_dtype}")),
    };
    if bytes.len() < n * per {
        return Err(format!(
            "the file is truncated: {} data bytes for {n} elements of {numpy_dtype}",
            bytes.len()
        ));
    }
    let word = |i: usize, w: usize| -> u64 {
        let mut b = [0u8; 8];
        let src = &bytes[i * w..(i + 1) * w];
        if big {
            for (k, &x) in src.iter().rev().enumerate() {
                b[k] = x;
            }
        } else {
            b[..w].copy_from_slice(src);
        }
        u64::from_le_bytes(b)
    };
    let float = |i: usize, w: usize| -> Result<f32, String> {
        match w {
            4 => Ok(f32::from_bits(word(i, 4) as u32)),
            8 => Ok(f64::from_bits(word(i, 8)) as f32),
            _ => Err(format!("unsupported dtype {numpy_dtype}")),
        }
    };
    let tensor = match kind {
        'c' => {
            let w = per / 2;
            let v = (0..2 * n).map(|i| float(i, w)).collect::<Result<Vec<_>, _>>()?;
            HostTensor { dtype: DType::C64, shape, data: HostData::F32(v) }
        }
        'f' => {
            let v = (0..n).map(|i| float(i, per)).collect::<Result<Vec<_>, _>>()?;
            HostTensor { dtype: DType::F32, shape, data: HostData::F32(v) }
        }
        'i' | 'u' | 'b' => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                let raw = word(i, per);
                let x: i64 = if kind == 'i' {
                    let sh = 64 - 8 * per as u32;
                    ((raw << sh) as i64) >> sh
                } else {
                    raw as i64
                };
                let y = i32::try_from(x).map_err(|_| format!("element {i} ({x}) does not fit in int32"))?;
                v.push(y);
            }
            HostTensor { dtype: DType::I32, shape, data: HostData::I32(v) }
        }
        _ => unreachable!("kinds filtered above"),
    };
    Ok(NpyArray { numpy_dtype, tensor })
}

/// Reads one `.npy` file.
pub fn load_npy(path: &Path) -> Result<NpyArray, String> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    read_npy(BufReader::new(f)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads every array of a `.npz` archive, in archive order.
pub fn load_npz(path: &Path) -> Result<Vec<(String, NpyArray)>, String> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    read_npz(BufReader::new(f)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads every array of a `.npz` archive from a reader.
pub fn read_npz(r: impl Read + Seek) -> Result<Vec<(String, NpyArray)>, String> {
    let mut zip = zip::ZipArchive::new(r).map_err(|e| format!("not a valid .npz archive: {e}"))?;
    let mut out = Vec::new();
    for i in 0..zip.len() {
        let entry = zip.by_index(i).map_err(|e| format!("reading the archive: {e}"))?;
        let file_name = entry.name().to_string();
        let name = file_name.strip_suffix(".npy").unwrap_or(&file_name).to_string();
        let arr = read_npy(entry).map_err(|e| format!("array '{name}': {e}"))?;
        out.push((name, arr));
    }
    Ok(out)
}

/// The `.npy` bytes (format version 1.0) of a tensor: `complex64`, `float32` or `int32`.
pub fn npy_bytes(t: &HostTensor) -> Vec<u8> {
    let descr = match t.dtype {
        DType::C64 => "<c8",
        DType::F32 => "<f4",
        DType::I32 => "<i4",
    };
    let shape = match t.shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", t.shape[0]),
        _ => format!("({})", t.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.div_ceil(64) * 64 - total));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.bytes());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&t.as_bytes());
    out
}

/// Writes named tensors as an uncompressed `.npz` archive (NumPy's `np.savez` layout), with
/// fixed timestamps so equal arrays give equal files.
pub fn write_npz(w: impl Write + Seek, arrays: &[(&str, &HostTensor)]) -> io::Result<()> {
    let mut zip = zip::ZipWriter::new(w);
    let opts = zip::write::FileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .last_modified_time(zip::DateTime::default())
        .large_file(true);
    for (name, t) in arrays {
        zip.start_file(format!("{name}.npy"), opts)?;
        zip.write_all(&npy_bytes(t))?;
    }
    zip.finish()?;
    Ok(())
}

/// Writes named tensors to a `.npz` file.
pub fn save_npz(path: &Path, arrays: &[(&str, &HostTensor)]) -> Result<(), String> {
    let f = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut w = io::BufWriter::new(f);
    write_npz(&mut w, arrays).map_err(|e| format!("{}: {e}", path.display()))?;
    w.flush().map_err(|e| format!("{}: {e}", path.display()))
}
