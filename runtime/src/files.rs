//! Opening the files users name (`.cvnn` sources, data, weights, checkpoints) so that only
//! regular files are read: a FIFO would block the run forever, `/dev/zero` or `/dev/urandom`
//! would be read until memory runs out, and a directory gives an obscure OS error. Every
//! error names what the file is for and says what to give instead.

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

/// What kind of non-regular file `m` is, in words.
fn kind_of(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

/// Opens `path` for reading if it is a regular file (symbolic links are followed), and
/// returns it with its length. `what` names the file's role in errors ("data file",
/// "weights"). The type is checked before opening, because opening a FIFO blocks until a
/// writer appears, and again on the open handle, in case the path changed in between.
pub fn open_regular(path: &Path, what: &str) -> Result<(File, u64), String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{what} {shown}: no such file"),
        std::io::ErrorKind::PermissionDenied => format!("{what} {shown}: permission denied"),
        _ => format!("{what} {shown}: {e}"),
    })?;
    let refuse = |m: &Metadata| {
        format!("{what} {shown}: is {}, not a regular file; give the path of a file on disk", kind_of(m))
    };
    if !meta.is_file() {
        return Err(refuse(&meta));
    }
    let file = File::open(path).map_err(|e| format!("{what} {shown}: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("{what} {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(refuse(&meta));
    }
    Ok((file, meta.len()))
}

/// Reads the whole of a regular file of at most `max_bytes` bytes. A larger file is refused
/// before it is read (and a file that grows while being read stops at the limit), with an
/// error naming both sizes; `raise` says how to raise the limit (appended to the message
/// when not empty).
pub fn read_regular(path: &Path, what: &str, max_bytes: u64, raise: &str) -> Result<Vec<u8>, String> {
    let (file, len) = open_regular(path, what)?;
    let too_big = |size: &str| {
        let mut m = format!(
            "{what} {}: is {size}, more than the limit of {}",
            path.display(),
            cvc_compiler::units::human_bytes(max_bytes)
        );
        if !raise.is_empty() {
            m.push_str("; ");
            m.push_str(raise);
        }
        m
    };
    if len > max_bytes {
        return Err(too_big(&cvc_compiler::units::human_bytes(len)));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_big("growing while being read"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cvc-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A regular file is read whole; a directory and a file over the limit are refused with
    /// messages that name the role, the path and the sizes.
    #[test]
    fn reads_regular_files_only() {
        let d = tmp("regular");
        let f = d.join("a.bin");
        std::fs::write(&f, [7u8; 100]).unwrap();
        assert_eq!(read_regular(&f, "data file", 100, "").unwrap(), vec![7u8; 100]);
        let e = read_regular(&f, "data file", 99, "raise it").unwrap_err();
        assert!(
            e.contains("data file") && e.contains("100 B") && e.contains("99 B") && e.ends_with("raise it"),
            "{e}"
        );
        let e = read_regular(&d, "weights", 1 << 20, "").unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
        let e = read_regular(&d.join("missing"), "weights", 1 << 20, "").unwrap_err();
        assert!(e.contains("no such file"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Character devices are refused without reading them.
    #[cfg(unix)]
    #[test]
    fn refuses_devices() {
        let e = read_regular(Path::new("/dev/zero"), "weights", 1 << 20, "").unwrap_err();
        assert!(e.contains("/dev/zero") && e.contains("character device"), "{e}");
    }
}
