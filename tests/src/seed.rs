//! How every randomised test of the workspace picks its seed: one definition, one variable.
//!
//! Tests are deterministic by default: each test's seed is a fixed function of its name, so a
//! failure in CI fails the same way on every machine and every rerun. `CVC_SEED=<u64>` (decimal
//! or `0x` hex) changes the base that every test's seed is derived from, to explore other
//! inputs; a failing test prints the base it ran with, and the same `CVC_SEED` replays it.
//!
//! This file is the `seed` module of `cvc-tests` and is also included by path
//! (`#[path = "../../tests/src/seed.rs"] mod seed;`) into the compiler's and the runtime's
//! integration tests, which cannot depend on `cvc-tests` (it depends on them). It therefore
//! uses nothing but `std`.

/// The environment variable that varies every test seed at once.
pub const SEED_VAR: &str = "CVC_SEED";

/// The base seed when [`SEED_VAR`] is unset.
pub const DEFAULT_BASE: u64 = 0x5EED_C0DE;

/// The base seed: [`SEED_VAR`] when set (a malformed value is a test failure, not a silent
/// fallback), else [`DEFAULT_BASE`].
///
/// # Panics
/// When `CVC_SEED` is set but is not a `u64` in decimal or `0x` hex.
pub fn base_seed() -> u64 {
    match std::env::var(SEED_VAR) {
        Err(_) => DEFAULT_BASE,
        Ok(s) => {
            let t = s.trim();
            let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => t.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{SEED_VAR}={s:?} is not a u64 (decimal or 0x hex)"))
        }
    }
}

/// The seed of the test (or case) called `name`: the base seed mixed with a hash of the name,
/// so tests draw independent streams. Prints the name, the base and the seed (shown by
/// `cargo test` for failing tests) so a failure says how to replay it.
///
/// # Panics
/// As [`base_seed`].
pub fn seed_for(name: &str) -> u64 {
    let base = base_seed();
    // FNV-1a of the name, then a SplitMix64 finaliser so nearby bases give unrelated seeds.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = base ^ h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let seed = z ^ (z >> 31);
    eprintln!("{name}: seed {seed:#x} from base {base:#x} (replay: {SEED_VAR}={base:#x})");
    seed
}
