//! Reading and writing NumPy `.npy` arrays and `.npz` archives as [`HostTensor`]s.
//!
//! Supported element types: `complex64` (and `complex128`, narrowed), `float32` (and
//! `float64`, narrowed), `int32`, `int64` and the smaller integer types (labels). Arrays must
//! be C-ordered. Complex values become interleaved `(re, im)` f32 pairs, as the arena stores
//! them.

use crate::backend::{HostData, HostTensor};
use crate::files;
use cvc_compiler::front::limits;
use cvc_compiler::ir::DType;
use cvc_compiler::units::human_bytes;
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

/// The largest `.npy` header accepted (NumPy itself refuses headers over 10,000 bytes unless
/// told otherwise); a format-2 header may declare up to 4 GiB, which would be allocated.
pub const MAX_HEADER_BYTES: u64 = 1 << 16;

/// How much an array being read may hold: checked against the header before any data is
/// read or allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// The most bytes of data the array may declare (what is left of the dataset limit,
    /// [`cvc_compiler::front::limits::max_data_bytes`]).
    pub max_bytes: u64,
    /// Bytes the container says follow the start of the `.npy` data (the file's length, or a
    /// `.npz` member's uncompressed size), when known.
    pub available: Option<u64>,
    /// For a deflated `.npz` member: the most bytes it may decompress to, and why.
    pub inflate: Option<InflateCap>,
}

/// The decompression limit of one compressed `.npz` member. It counts the compressed members
/// before it too, so an archive of many small bombs (each under the ratio-free size) is
/// stopped like one big one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InflateCap {
    /// The member's compressed size.
    pub compressed: u64,
    /// Compressed bytes of the archive's earlier compressed members.
    pub before_compressed: u64,
    /// Bytes those earlier members decompressed to.
    pub before_inflated: u64,
    /// The accepted ratio of decompressed to compressed bytes.
    pub ratio: u64,
}

impl InflateCap {
    /// The most bytes the compressed members up to this one may decompress to together: any
    /// ratio up to [`limits::NPZ_RATIO_FREE_BYTES`], `ratio` above that.
    pub fn archive_limit(&self) -> u64 {
        self.compressed
            .saturating_add(self.before_compressed)
            .saturating_mul(self.ratio)
            .max(limits::NPZ_RATIO_FREE_BYTES)
    }
}

impl ReadLimits {
    /// Only the dataset limit: no container size known, no decompression.
    pub fn bytes(max_bytes: u64) -> ReadLimits {
        ReadLimits { max_bytes, available: None, inflate: None }
    }
}

/// Parses `.npy` bytes from `r` (positioned at the start of the file) under the default data
/// limit ([`cvc_compiler::front::limits::max_data_bytes`]).
pub fn read_npy(r: impl Read) -> Result<NpyArray, String> {
    read_npy_limited(r, ReadLimits::bytes(limits::max_data_bytes()?))
}

/// Reads the magic, version and header length, refusing a header longer than
/// [`MAX_HEADER_BYTES`]; returns the bytes read (to hand to the `.npy` parser again) and the
/// total size of the preamble and header.
fn read_preamble(r: &mut impl Read) -> Result<(Vec<u8>, u64), String> {
    let bad = |why: &str| format!("not a valid .npy array: {why}");
    let mut pre = vec![0u8; 8];
    r.read_exact(&mut pre).map_err(|_| bad("shorter than the .npy preamble"))?;
    if &pre[..6] != b"\x93NUMPY" {
        return Err(bad("it does not start with the \\x93NUMPY magic"));
    }
    let width = match pre[6] {
        1 => 2,
        2 | 3 => 4,
        v => return Err(bad(&format!("format version {v}.{} is not 1, 2 or 3", pre[7]))),
    };
    let mut len = [0u8; 4];
    r.read_exact(&mut len[..width]).map_err(|_| bad("shorter than the .npy preamble"))?;
    pre.extend_from_slice(&len[..width]);
    let header = u32::from_le_bytes(len) as u64;
    if header > MAX_HEADER_BYTES {
        return Err(bad(&format!(
            "its header declares {header} bytes, more than the {MAX_HEADER_BYTES} accepted"
        )));
    }
    let mut text = vec![0u8; header as usize];
    r.read_exact(&mut text).map_err(|_| bad("the header is cut short"))?;
    check_shape_product(&String::from_utf8_lossy(&text))?;
    pre.extend_from_slice(&text);
    Ok((pre, 8 + width as u64 + header))
}

/// Refuses a header whose `shape` has more elements than a `u64` counts, before the `.npy`
/// parser multiplies the dimensions itself (unchecked). A header this scan cannot read is
/// left to the parser, which reports it.
fn check_shape_product(header: &str) -> Result<(), String> {
    let Some(key) = header.find("'shape'").or_else(|| header.find("\"shape\"")) else { return Ok(()) };
    let rest = header[key + 7..].trim_start().strip_prefix(':').unwrap_or("").trim_start();
    let Some(body) = rest.strip_prefix('(').or_else(|| rest.strip_prefix('[')) else { return Ok(()) };
    let Some(end) = body.find([')', ']']) else { return Ok(()) };
    let dims: Vec<&str> = body[..end].split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    let mut product: Option<u64> = Some(1);
    for d in &dims {
        // (Python 2 NumPy wrote long integers with an `L` suffix.)
        let Ok(n) = d.trim_end_matches(['L', 'l']).replace('_', "").parse::<u64>() else { return Ok(()) };
        product = product.and_then(|p| p.checked_mul(n));
    }
    if product.is_none() {
        return Err(format!(
            "shape ({}) declares more elements than can be counted (over 2^64): more bytes than can be addressed (over 16 EiB)",
            dims.join(", ")
        ));
    }
    Ok(())
}

/// Parses `.npy` bytes from `r` under `lim`. The declared shape's byte count is computed
/// with checked arithmetic and compared with the limit and the bytes available before any
/// data is read, so a header declaring 2^62 elements is an error, not an allocation.
pub fn read_npy_limited(r: impl Read, lim: ReadLimits) -> Result<NpyArray, String> {
    read_npy_counted(r, lim).map(|(a, _)| a)
}

/// [`read_npy_limited`], also returning the bytes read (preamble, header and data).
fn read_npy_counted(mut r: impl Read, lim: ReadLimits) -> Result<(NpyArray, u64), String> {
    let (pre, header_bytes) = read_preamble(&mut r)?;
    let file = npyz::NpyFile::new(io::Cursor::new(pre).chain(r))
        .map_err(|e| format!("not a valid .npy array: {e}"))?;
    let dims: Vec<u64> = file.shape().to_vec();
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
    let per = match kind {
        'c' if size == 8 || size == 16 => size as usize,
        'f' if size == 4 || size == 8 => size as usize,
        'i' | 'u' | 'b' if (1..=8).contains(&size) => size as usize,
        _ => return Err(format!("unsupported dtype {numpy_dtype}")),
    };
    let shown = format!("({})", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "));
    let elems = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let needed = elems.and_then(|n| n.checked_mul(per as u64));
    let Some(needed) = needed.filter(|&b| usize::try_from(b).is_ok()) else {
        return Err(format!(
            "shape {shown} of {numpy_dtype} declares more bytes than can be addressed (over 16 EiB)"
        ));
    };
    if needed > lim.max_bytes {
        return Err(format!(
            "shape {shown} of {numpy_dtype} declares {} ({needed} bytes), more than the data limit allows ({}); {}",
            human_bytes(needed),
            human_bytes(lim.max_bytes),
            limits::data_limit_help()
        ));
    }
    if let Some(cap) = lim.inflate {
        let total = needed.saturating_add(header_bytes).saturating_add(cap.before_inflated);
        let compressed = cap.compressed.saturating_add(cap.before_compressed);
        if total > cap.archive_limit() {
            return Err(format!(
                "the compressed members up to this one would decompress to {} from {} ({}x); past {} an archive's compressed members may expand at most {}x (zip bomb?); raise the ratio with the environment variable {} if the file is genuine, see docs/LIMITS.md",
                human_bytes(total),
                human_bytes(compressed),
                total / compressed.max(1),
                human_bytes(limits::NPZ_RATIO_FREE_BYTES),
                cap.ratio,
                limits::NPZ_MAX_RATIO_VAR
            ));
        }
    }
    if let Some(avail) = lim.available {
        let data = avail.saturating_sub(header_bytes);
        if needed > data {
            return Err(format!(
                "the file is truncated: shape {shown} of {numpy_dtype} declares {needed} data bytes, but only {data} are present"
            ));
        }
    }
    let n = (needed / per as u64) as usize;
    // Capacity from what the container holds, not from the header alone: read_to_end grows
    // the buffer only as far as data actually arrives.
    let mut bytes = Vec::with_capacity(lim.available.map_or(0, |a| needed.min(a)) as usize);
    file.into_inner()
        .take(needed)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading the array data: {e}"))?;
    if (bytes.len() as u64) < needed {
        return Err(format!(
            "the file is truncated: shape {shown} of {numpy_dtype} declares {needed} data bytes, but only {} are present",
            bytes.len()
        ));
    }
    let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
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
    Ok((NpyArray { numpy_dtype, tensor }, header_bytes + needed))
}

/// Reads one `.npy` file (a regular file, under the data limit).
pub fn load_npy(path: &Path) -> Result<NpyArray, String> {
    let (f, len) = files::open_regular(path, "data file")?;
    let lim = ReadLimits { available: Some(len), ..ReadLimits::bytes(limits::max_data_bytes()?) };
    read_npy_limited(BufReader::new(f), lim).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads every array of a `.npz` archive (a regular file), in archive order, under the data
/// and decompression limits ([`cvc_compiler::front::limits`]).
pub fn load_npz(path: &Path) -> Result<Vec<(String, NpyArray)>, String> {
    let (f, _) = files::open_regular(path, "data file")?;
    read_npz(BufReader::new(f)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads every array of a `.npz` archive from a reader under the default limits.
pub fn read_npz(r: impl Read + Seek) -> Result<Vec<(String, NpyArray)>, String> {
    read_npz_limited(r, limits::max_data_bytes()?, limits::npz_max_ratio()?)
}

/// Reads every array of a `.npz` archive: all members together may hold at most `max_bytes`
/// of data, and a deflated member may expand at most `ratio` times (past
/// [`limits::NPZ_RATIO_FREE_BYTES`]). Errors name the member.
pub fn read_npz_limited(
    r: impl Read + Seek,
    max_bytes: u64,
    ratio: u64,
) -> Result<Vec<(String, NpyArray)>, String> {
    let mut zip = zip::ZipArchive::new(r).map_err(|e| format!("not a valid .npz archive: {e}"))?;
    let mut out = Vec::new();
    let mut left = max_bytes;
    let (mut before_compressed, mut before_inflated) = (0u64, 0u64);
    for i in 0..zip.len() {
        let entry = zip.by_index(i).map_err(|e| format!("reading the archive: {e}"))?;
        let file_name = entry.name().to_string();
        let name = file_name.strip_suffix(".npy").unwrap_or(&file_name).to_string();
        let compressed = entry.compression() != zip::CompressionMethod::Stored;
        let inflate = compressed.then(|| InflateCap {
            compressed: entry.compressed_size(),
            before_compressed,
            before_inflated,
            ratio,
        });
        if compressed {
            before_compressed = before_compressed.saturating_add(entry.compressed_size());
        }
        let lim = ReadLimits { max_bytes: left, available: Some(entry.size()), inflate };
        let (arr, consumed) =
            read_npy_counted(entry, lim).map_err(|e| format!("array '{name}' ({file_name}): {e}"))?;
        if compressed {
            // What the member inflated to, as the reader consumed it: header and data.
            before_inflated = before_inflated.saturating_add(consumed);
        }
        left = left.saturating_sub(arr.tensor.bytes() as u64);
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
