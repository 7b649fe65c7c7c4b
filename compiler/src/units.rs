//! Byte sizes: the one parser of sizes written by users (`memory_budget = 4GiB` in a `train`
//! section, `--memory-budget 4g` on the command line) and the one formatter of byte counts in
//! reports (`1.5 MiB`).
//!
//! Accepted forms (documented for users in `docs/LANGUAGE.md`, "Byte sizes"): a decimal number
//! (`_` may separate digits, a fraction is allowed) followed by an optional unit, case-insensitive:
//!
//! | unit | factor |
//! |---|---|
//! | none, `B` | 1 |
//! | `KiB`, `MiB`, `GiB`, `TiB` and the one-letter `k`, `m`, `g`, `t` | 1024, 1024², 1024³, 1024⁴ |
//! | `KB` (or `kB`), `MB`, `GB`, `TB` | 1000, 1000², 1000³, 1000⁴ |
//!
//! The one-letter forms are binary because that is what the tools users know by them read them
//! as (`docker --memory 4g`, `java -Xmx4g`). A fractional result is rounded to the nearest byte.
//! Exponents (`1e9`), signs and sizes of 2⁶⁴ bytes or more are errors.

use std::fmt;

/// Why a byte size did not parse. The `Display` text names the input and says what to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ByteSizeError {
    /// Nothing but blanks.
    Empty,
    /// The number part is missing or malformed (`GiB`, `-1GiB`, `1..2MiB`).
    BadNumber(String),
    /// A unit this parser does not know (`4XB`).
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit as written.
        unit: String,
    },
    /// Scientific notation (`1e9`): ambiguous next to units, so refused with a hint.
    Exponent(String),
    /// The size is 2⁶⁴ bytes or more.
    TooLarge(String),
}

impl fmt::Display for ByteSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const FORMS: &str = "write e.g. 4GiB, 4g, 512MiB, 2GB or 1000000";
        match self {
            ByteSizeError::Empty => write!(f, "empty byte size ({FORMS})"),
            ByteSizeError::BadNumber(s) => write!(f, "`{s}` is not a byte size ({FORMS})"),
            ByteSizeError::UnknownUnit { input, unit } => write!(
                f,
                "unknown byte unit `{unit}` in `{input}` (use B, KiB, MiB, GiB, TiB, k, m, g, t, KB, MB, GB or TB)"
            ),
            ByteSizeError::Exponent(s) => write!(f, "`{s}`: exponents are not accepted in byte sizes; {FORMS}"),
            ByteSizeError::TooLarge(s) => write!(f, "byte size `{s}` is too large: it must be below 16 EiB"),
        }
    }
}

impl std::error::Error for ByteSizeError {}

/// The factor of a unit (lower-cased), `None` when unknown.
fn unit_factor(unit: &str) -> Option<u64> {
    Some(match unit {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    })
}

/// Parses a byte size in the forms of the module doc, exactly (integer arithmetic: `1.5GiB` is
/// `1610612736`, not a float's neighbour of it). Zero is a valid size; callers that need a
/// positive one say so in their own words.
pub fn parse_bytes(s: &str) -> Result<u64, ByteSizeError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(ByteSizeError::Empty);
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim_start().to_ascii_lowercase();
    let bad = || ByteSizeError::BadNumber(s.to_string());
    if num.is_empty() {
        return Err(bad());
    }
    if unit.starts_with('e') && unit[1..].starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+') {
        return Err(ByteSizeError::Exponent(s.to_string()));
    }
    let factor = unit_factor(&unit)
        .ok_or_else(|| ByteSizeError::UnknownUnit { input: s.to_string(), unit: unit.clone() })?;
    let digits = num.replace('_', "");
    let (whole, frac) = digits.split_once('.').unwrap_or((&digits, ""));
    let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    let dangling_dot = digits.contains('.') && frac.is_empty();
    if whole.is_empty()
        || dangling_dot
        || !all_digits(whole)
        || !all_digits(frac)
        || num.starts_with('_')
        || num.ends_with('_')
    {
        return Err(bad());
    }
    let too_large = || ByteSizeError::TooLarge(s.to_string());
    // value = (whole · 10^f + frac) · factor / 10^f in u128: for every size below 2^64 the
    // product stays below 2^127, so only sizes that are too large anyway can fail the checked
    // arithmetic. Fraction digits past the 18th move the value by under a millionth of a byte.
    let frac = &frac[..frac.len().min(18)];
    let scale = 10u128.pow(frac.len() as u32);
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    let frac_v: u128 = if frac.is_empty() { 0 } else { frac.parse().map_err(|_| bad())? };
    let mantissa = whole.checked_mul(scale).and_then(|w| w.checked_add(frac_v)).ok_or_else(too_large)?;
    let scaled = mantissa.checked_mul(factor as u128).ok_or_else(too_large)?;
    let rounded = (scaled + scale / 2) / scale;
    u64::try_from(rounded).map_err(|_| too_large())
}

/// A byte count for people: bytes below 1 KiB exactly (`300 B`), then binary units with one
/// decimal (`13.5 KiB`, `1.5 GiB`, up to TiB).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut x = b as f64 / 1024.0;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    format!("{x:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_decimal_and_short_units() {
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("4g"), Ok(4 << 30));
        assert_eq!(parse_bytes("4G"), Ok(4 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("512m"), Ok(512 << 20));
        assert_eq!(parse_bytes("3k"), Ok(3072));
        assert_eq!(parse_bytes("2t"), Ok(2 << 40));
        assert_eq!(parse_bytes("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("2kB"), Ok(2_000));
        assert_eq!(parse_bytes("1.5TB"), Ok(1_500_000_000_000));
        assert_eq!(parse_bytes("1_000"), Ok(1000));
        assert_eq!(parse_bytes("1000B"), Ok(1000));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("  7  "), Ok(7));
    }

    #[test]
    fn fractions_round_to_the_nearest_byte_exactly() {
        // 0.3 KiB = 307.2 B; 0.7 KiB = 716.8 B.
        assert_eq!(parse_bytes("0.3KiB"), Ok(307));
        assert_eq!(parse_bytes("0.7KiB"), Ok(717));
        assert_eq!(parse_bytes("0.5B"), Ok(1));
        // f64 would lose the last digit of this one.
        assert_eq!(parse_bytes("9007199254740993"), Ok(9_007_199_254_740_993));
        assert_eq!(parse_bytes("1.0000000000000000000000000000000000001GiB"), Ok(1 << 30));
    }

    #[test]
    fn malformed_sizes_are_typed_errors() {
        assert_eq!(parse_bytes(""), Err(ByteSizeError::Empty));
        assert_eq!(parse_bytes("   "), Err(ByteSizeError::Empty));
        for bad in ["GiB", "-1GiB", "1..2MiB", ".5GiB", "_1", "1_", "1.GiB", "1.GiB x"] {
            assert!(
                matches!(
                    parse_bytes(bad),
                    Err(ByteSizeError::BadNumber(_) | ByteSizeError::UnknownUnit { .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_bytes("4XB"),
            Err(ByteSizeError::UnknownUnit { input: "4XB".into(), unit: "xb".into() })
        );
        assert_eq!(parse_bytes("1e9"), Err(ByteSizeError::Exponent("1e9".into())));
        assert_eq!(parse_bytes("1e-3GB"), Err(ByteSizeError::Exponent("1e-3GB".into())));
        assert_eq!(parse_bytes("junk"), Err(ByteSizeError::BadNumber("junk".into())));
        let msg = parse_bytes("4XB").unwrap_err().to_string();
        assert!(msg.contains("`xb`") && msg.contains("GiB"), "{msg}");
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_bytes("18446744073709551616"),
            Err(ByteSizeError::TooLarge("18446744073709551616".into()))
        );
        assert!(matches!(parse_bytes("16777216TiB"), Err(ByteSizeError::TooLarge(_))));
        assert_eq!(parse_bytes("16777215TiB"), Ok(16_777_215 << 40));
        assert!(matches!(parse_bytes("1e999GB"), Err(ByteSizeError::Exponent(_))));
        assert!(matches!(parse_bytes(&"9".repeat(60)), Err(ByteSizeError::TooLarge(_))));
        assert!(matches!(parse_bytes(&format!("{}GiB", "9".repeat(20))), Err(ByteSizeError::TooLarge(_))));
    }

    #[test]
    fn human_bytes_picks_the_largest_unit_below_the_value() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.0 KiB");
        assert_eq!(human_bytes(13_824), "13.5 KiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert_eq!(human_bytes(5 << 40), "5.0 TiB");
        assert_eq!(human_bytes(u64::MAX), "16777216.0 TiB");
    }

    #[test]
    fn formatted_sizes_parse_back_within_rounding() {
        // Every formatted value reads back as a size within half a unit of the last digit.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x >> (x % 60);
            let text = human_bytes(b);
            let back = parse_bytes(&text).expect("formatted size parses");
            let unit = if b < 1024 { 1 } else { 1u64 << (10 * ((63 - b.leading_zeros()) / 10).min(4)) };
            assert!(back.abs_diff(b) <= unit / 20 + 1, "{b} → {text} → {back}");
        }
    }
}
