//! Seeded initialisation of parameters and state buffers: the SplitMix64 generator, the
//! per-buffer stream (`seed ^ fnv1a(name)`), and the draw of every [`Init`].
//!
//! The runtime initialises its buffers with it, and the reference interpreter's session does
//! the same, so both start from identical values; the runtime never depends on the
//! interpreter for it.

use crate::ir::{DType, Init};
use num_complex::Complex64;
use std::f64::consts::PI;

/// The SplitMix64 generator (Steele, Lea, Flood 2014): small, fast, reproducible everywhere.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A uniform number in `[0, 1)` (53 random bits).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// A uniform number in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }
    /// A standard normal number (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * PI * u2).cos()
    }
}

/// A 64-bit FNV-1a hash, used to give every named buffer its own random stream.
pub fn name_hash(name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01B3);
    }
    h
}

/// The values of a tensor of `dtype` and `shape` (row-major, one per element) initialised by
/// `init` from `rng`. Real tensors use the real parts; integer tensors their truncation.
///
/// Glorot and He draw normals of the documented variance (complex: half of it on each of re
/// and im). Rayleigh draws a magnitude of scale `σ = 1/sqrt(fan_in + fan_out)` and a uniform
/// phase (real tensors take the real part of that sample). Uniform draws re and im
/// independently. Eye2 depends on the element's position only. Normal draws variance `std²`
/// (complex: half on each of re and im). Integer tensors take the constant part only (zeros,
/// ones, the constant).
pub fn init_values(init: &Init, dtype: DType, shape: &[usize], rng: &mut SplitMix64) -> Vec<Complex64> {
    let n: usize = shape.iter().product();
    let sample = |rng: &mut SplitMix64, k: usize| -> Complex64 {
        match *init {
            Init::Zeros => Complex64::new(0.0, 0.0),
            Init::Ones => Complex64::new(1.0, 0.0),
            Init::Constant(c) => Complex64::new(c, 0.0),
            Init::Glorot { fan_in, fan_out } => gaussian(rng, dtype, 2.0 / (fan_in + fan_out).max(1) as f64),
            Init::He { fan_in } => gaussian(rng, dtype, 2.0 / fan_in.max(1) as f64),
            Init::Rayleigh { fan_in, fan_out } => {
                let sigma = 1.0 / ((fan_in + fan_out).max(1) as f64).sqrt();
                let mag = sigma * (-2.0 * (1.0 - rng.next_f64()).ln()).sqrt();
                let phase = rng.uniform(-PI, PI);
                Complex64::from_polar(mag, phase)
            }
            Init::Uniform { bound } => {
                let re = rng.uniform(-bound, bound);
                let im = if dtype == DType::C64 { rng.uniform(-bound, bound) } else { 0.0 };
                Complex64::new(re, im)
            }
            Init::Eye2 { scale } => {
                let [i, j] = eye2_index(shape, k);
                Complex64::new(if i == j { scale } else { 0.0 }, 0.0)
            }
            Init::Normal { std } => gaussian(rng, dtype, std * std),
        }
    };
    (0..n).map(|k| sample(rng, k)).collect()
}

/// The indices along the first two axes of row-major element `k` of `shape` (0 for an axis
/// the shape lacks), for [`Init::Eye2`].
fn eye2_index(shape: &[usize], k: usize) -> [usize; 2] {
    let d1 = shape.get(1).copied().unwrap_or(1).max(1);
    let inner = shape.iter().skip(2).product::<usize>().max(1);
    let i = if shape.is_empty() { 0 } else { k / (d1 * inner) };
    [i, (k / inner) % d1]
}

fn gaussian(rng: &mut SplitMix64, dtype: DType, variance: f64) -> Complex64 {
    if dtype == DType::C64 {
        let s = (variance / 2.0).sqrt();
        Complex64::new(s * rng.normal(), s * rng.normal())
    } else {
        Complex64::new(variance.sqrt() * rng.normal(), 0.0)
    }
}
