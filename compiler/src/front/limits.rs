//! The limits on sizes that come from users' files, flags and `.cvnn` text, in one place so
//! that `cvc check` and the runtime refuse the same inputs with the same numbers. Each limit
//! is documented for users in `docs/LIMITS.md`; the two that real work may need to raise
//! read an environment variable.

use crate::units::{human_bytes, parse_bytes};

/// Default of [`max_data_bytes`]: 16 GiB of samples held in memory.
pub const DEFAULT_MAX_DATA_BYTES: u64 = 16 << 30;

/// Environment variable that raises (or lowers) [`max_data_bytes`], e.g. `64GiB`.
pub const MAX_DATA_BYTES_VAR: &str = "CVC_MAX_DATA_BYTES";

/// Default of [`max_weights_bytes`]: 16 GiB of safetensors file.
pub const DEFAULT_MAX_WEIGHTS_BYTES: u64 = 16 << 30;

/// Environment variable that raises (or lowers) [`max_weights_bytes`].
pub const MAX_WEIGHTS_BYTES_VAR: &str = "CVC_MAX_WEIGHTS_BYTES";

/// Largest ratio of decompressed to compressed bytes accepted for a deflated `.npz` member
/// once it is past [`NPZ_RATIO_FREE_BYTES`]. Real arrays compress far less (noise ~1.1x,
/// small integer labels ~20x); a zip bomb needs ~1000x.
pub const DEFAULT_NPZ_MAX_RATIO: u64 = 100;

/// Environment variable that raises [`npz_max_ratio`].
pub const NPZ_MAX_RATIO_VAR: &str = "CVC_NPZ_MAX_RATIO";

/// A deflated `.npz` member may decompress to this many bytes whatever its ratio (a small,
/// highly regular array such as constant labels is not a bomb).
pub const NPZ_RATIO_FREE_BYTES: u64 = 64 << 20;

/// At most this many diagnostics are rendered; the rest are counted ("N more errors not shown").
pub const MAX_DIAGNOSTICS: usize = 20;

/// Source lines longer than this many bytes are shown as a window around the error instead
/// of whole (a 24 KB line repeated under every diagnostic is what made the output quadratic).
pub const MAX_EXCERPT_LINE: usize = 200;

fn bytes_var(var: &str, default: u64) -> Result<u64, String> {
    match std::env::var(var) {
        Ok(v) => match parse_bytes(&v) {
            Ok(0) => Err(format!("{var}={v}: the limit must be more than 0 bytes")),
            Ok(b) => Ok(b),
            Err(e) => Err(format!("{var}={v}: {e}")),
        },
        Err(std::env::VarError::NotPresent) => Ok(default),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{var} is not valid UTF-8")),
    }
}

/// The most bytes of samples a dataset may hold in memory (synthetic or read from `.npz`/
/// `.npy`): [`DEFAULT_MAX_DATA_BYTES`] unless [`MAX_DATA_BYTES_VAR`] says otherwise. An
/// unparsable variable is an error naming it.
pub fn max_data_bytes() -> Result<u64, String> {
    bytes_var(MAX_DATA_BYTES_VAR, DEFAULT_MAX_DATA_BYTES)
}

/// The largest safetensors file (`--weights`, checkpoints) read: [`DEFAULT_MAX_WEIGHTS_BYTES`]
/// unless [`MAX_WEIGHTS_BYTES_VAR`] says otherwise.
pub fn max_weights_bytes() -> Result<u64, String> {
    bytes_var(MAX_WEIGHTS_BYTES_VAR, DEFAULT_MAX_WEIGHTS_BYTES)
}

/// The accepted decompression ratio of `.npz` members: [`DEFAULT_NPZ_MAX_RATIO`] unless
/// [`NPZ_MAX_RATIO_VAR`] holds another positive integer.
pub fn npz_max_ratio() -> Result<u64, String> {
    match std::env::var(NPZ_MAX_RATIO_VAR) {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(r) if r >= 1 => Ok(r),
            _ => Err(format!("{NPZ_MAX_RATIO_VAR}={v}: write a whole number of at least 1, e.g. 1000")),
        },
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_NPZ_MAX_RATIO),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{NPZ_MAX_RATIO_VAR} is not valid UTF-8")),
    }
}

/// The bytes of `count` samples of `per_sample` bytes each, or an error when the product
/// overflows or exceeds `limit`. `what` names the data ("synthetic.random", a file).
pub fn dataset_bytes(what: &str, count: u64, per_sample: u64, limit: u64) -> Result<u64, String> {
    // A saturated per-sample size (from a length near 2^64) is shown as what it is.
    let show = |b: Option<u64>| match b {
        Some(b) if b < u64::MAX => human_bytes(b),
        _ => "more than 16 EiB".to_string(),
    };
    let total = count.checked_mul(per_sample);
    match total {
        Some(t) if t <= limit => Ok(t),
        _ => Err(format!(
            "{what}: {count} samples of {} each is {}, more than the data limit of {}",
            show(Some(per_sample)),
            show(total),
            human_bytes(limit)
        )),
    }
}

/// The help line of a data-limit error: how to raise it.
pub fn data_limit_help() -> String {
    format!(
        "use fewer samples, or raise the limit with the environment variable {MAX_DATA_BYTES_VAR} (e.g. {MAX_DATA_BYTES_VAR}=64GiB); see docs/LIMITS.md"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products that overflow `u64` and products above the limit are both errors; the
    /// message names the count and the limit.
    #[test]
    fn dataset_bytes_checks_overflow_and_limit() {
        assert_eq!(dataset_bytes("d", 10, 8, 80), Ok(80));
        let e = dataset_bytes("d", 11, 8, 80).unwrap_err();
        assert!(e.contains("11 samples") && e.contains("80 B"), "{e}");
        let e = dataset_bytes("d", u64::MAX, 2, u64::MAX).unwrap_err();
        assert!(e.contains("more than 16 EiB"), "{e}");
    }
}
