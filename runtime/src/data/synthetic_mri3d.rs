//! The built-in synthetic 3-D MRI dataset: complex volumes of random ellipsoid phantoms with
//! a smooth phase, their k-space (3-D DFT), a variable-density random undersampling mask and
//! the undersampled k-space. Deterministic for a seed: volume `i` depends only on
//! `(seed, i)` and the settings.
//!
//! - Phantom: a large outer ellipsoid of intensity 1 and 2–5 inner ones of intensity
//!   ±(0.2…0.6) (added where they overlap, as the Shepp–Logan phantom), each with a random
//!   centre, semi-axes and rotation about the depth axis, in coordinates `[-1, 1]³`.
//! - Phase: `p0 + p1·x + p2·y + p3·z + p4·(x² + y²)` with random coefficients (smooth, as
//!   coil and field-inhomogeneity phase is).
//! - k-space: `K = fftn(image)` over depth, height and width, unnormalised (PyTorch's
//!   `torch.fft.fftn(norm = "backward")`), DC at index 0, so the model's
//!   `ifft3` (`norm = backward`) gives the image back.
//! - Mask: Cartesian 3-D sampling as in a scanner: the readout (width) is fully sampled, the
//!   two phase-encoding axes (depth, height) are undersampled. The centre block (lines less
//!   than `max(1, n/8)` from DC along both axes) is always sampled; elsewhere a line is kept with
//!   probability `λ·(1 − r)²`, `r` its normalised distance from the k-space centre, `λ` set
//!   so that on average `1 / accel` of the lines are kept. A new mask per volume.
//!
//! Arrays: `kspace` (c64, `mask · K`), `mask` (f32, 0 or 1, repeated along the width) and
//! `target` (c64, the fully sampled image), each `[count, 1, depth, size, size]`.

use crate::backend::{HostData, HostTensor};
use cvc_compiler::front::limits;
use cvc_compiler::init::SplitMix64;
use cvc_compiler::ir::DType;
use num_complex::Complex64;
use rustfft::FftPlanner;
use std::f64::consts::PI;

/// Smallest extent of each axis.
pub const MIN_EXTENT: usize = 4;

/// The names of the three arrays, in the order of [`Mri3dData`].
pub const ARRAYS: [&str; 3] = ["kspace", "mask", "target"];

/// Settings of a synthetic 3-D MRI dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct Mri3dConfig {
    /// Depth of a volume (slices).
    pub depth: usize,
    /// Height and width of a volume.
    pub size: usize,
    /// Acceleration: the mask keeps about `1 / accel` of the phase-encoding lines.
    pub accel: f64,
    /// Number of volumes.
    pub count: usize,
    /// Generator seed.
    pub seed: u64,
}

impl Mri3dConfig {
    /// Checks the settings, with a message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [("depth", self.depth), ("size", self.size)] {
            if v < MIN_EXTENT {
                return Err(format!("synthetic.mri3d: {name} = {v} is too small (at least {MIN_EXTENT})"));
            }
        }
        if !self.accel.is_finite() || !(1.0..=32.0).contains(&self.accel) {
            return Err(format!("synthetic.mri3d: accel = {} is outside 1..=32", self.accel));
        }
        if self.count == 0 {
            return Err("synthetic.mri3d: count must be at least 1".into());
        }
        let limit = limits::max_data_bytes()?;
        limits::dataset_bytes(
            "synthetic.mri3d",
            self.count as u64,
            sample_bytes(self.depth, self.size),
            limit,
        )
        .map_err(|e| format!("{e}; {}", limits::data_limit_help()))?;
        Ok(())
    }
}

/// Bytes of one sample: two c64 volumes and one f32 volume of `depth × size × size`.
pub fn sample_bytes(depth: usize, size: usize) -> u64 {
    (depth as u64).saturating_mul(size as u64).saturating_mul(size as u64).saturating_mul(8 + 4 + 8)
}

/// The generated volumes, each `[count, 1, depth, size, size]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Mri3dData {
    /// Undersampled k-space (c64): the mask times the full k-space.
    pub kspace: HostTensor,
    /// The sampling mask (f32, 0 or 1).
    pub mask: HostTensor,
    /// The fully sampled image (c64).
    pub target: HostTensor,
}

/// Generates the dataset.
pub fn generate(cfg: &Mri3dConfig) -> Result<Mri3dData, String> {
    cfg.validate()?;
    let (d, s) = (cfg.depth, cfg.size);
    let n = d * s * s;
    let mut kspace = Vec::with_capacity(2 * cfg.count * n);
    let mut mask = Vec::with_capacity(cfg.count * n);
    let mut target = Vec::with_capacity(2 * cfg.count * n);
    let mut planner = FftPlanner::<f64>::new();
    let lambda = density_scale(d, s, cfg.accel);
    for i in 0..cfg.count {
        let mut rng = SplitMix64::new(volume_seed(cfg.seed, i as u64));
        let img = phantom(d, s, &mut rng);
        let mut k = img.clone();
        fft3(&mut k, [d, s, s], &mut planner);
        let lines = sample_lines(d, s, lambda, &mut rng);
        for (j, (z, x)) in img.iter().zip(&k).enumerate() {
            let keep = lines[j / s];
            target.extend([z.re as f32, z.im as f32]);
            let m = if keep { 1.0 } else { 0.0 };
            mask.push(m as f32);
            kspace.extend([(m * x.re) as f32, (m * x.im) as f32]);
        }
    }
    let shape = vec![cfg.count, 1, d, s, s];
    Ok(Mri3dData {
        kspace: HostTensor { dtype: DType::C64, shape: shape.clone(), data: HostData::F32(kspace) },
        mask: HostTensor { dtype: DType::F32, shape: shape.clone(), data: HostData::F32(mask) },
        target: HostTensor { dtype: DType::C64, shape, data: HostData::F32(target) },
    })
}

/// The generator state of volume `i`: a hash of `(seed, i)`.
fn volume_seed(seed: u64, i: u64) -> u64 {
    let base = SplitMix64::new(seed ^ 0x4D52_495F_3344_5631).next_u64();
    SplitMix64::new(base ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

/// A `d × s × s` phantom (row-major, depth first) with a smooth phase.
fn phantom(d: usize, s: usize, rng: &mut SplitMix64) -> Vec<Complex64> {
    // (centre, semi-axes, rotation about the depth axis, intensity); coordinates (z, y, x).
    let mut ells = vec![(
        [rng.uniform(-0.05, 0.05), rng.uniform(-0.05, 0.05), rng.uniform(-0.05, 0.05)],
        [rng.uniform(0.7, 0.9), rng.uniform(0.6, 0.85), rng.uniform(0.6, 0.85)],
        rng.uniform(0.0, PI),
        1.0,
    )];
    let inner = 2 + (rng.next_u64() % 4) as usize;
    for _ in 0..inner {
        let sign = if rng.next_f64() < 0.5 { -1.0 } else { 1.0 };
        ells.push((
            [rng.uniform(-0.35, 0.35), rng.uniform(-0.35, 0.35), rng.uniform(-0.35, 0.35)],
            [rng.uniform(0.15, 0.4), rng.uniform(0.1, 0.35), rng.uniform(0.1, 0.35)],
            rng.uniform(0.0, PI),
            sign * rng.uniform(0.2, 0.6),
        ));
    }
    let p = [
        rng.uniform(-PI, PI),
        rng.uniform(-1.0, 1.0),
        rng.uniform(-1.0, 1.0),
        rng.uniform(-1.0, 1.0),
        rng.uniform(-0.5, 0.5),
    ];
    let coord = |i: usize, n: usize| 2.0 * (i as f64 + 0.5) / n as f64 - 1.0;
    let mut out = Vec::with_capacity(d * s * s);
    for iz in 0..d {
        let z = coord(iz, d);
        for iy in 0..s {
            let y = coord(iy, s);
            for ix in 0..s {
                let x = coord(ix, s);
                let mut m = 0.0;
                for (c, a, rot, v) in &ells {
                    let (sr, cr) = rot.sin_cos();
                    let (dy, dx) = (y - c[1], x - c[2]);
                    let (u, w) = (cr * dx + sr * dy, -sr * dx + cr * dy);
                    let q = ((z - c[0]) / a[0]).powi(2) + (w / a[1]).powi(2) + (u / a[2]).powi(2);
                    if q <= 1.0 {
                        m += v;
                    }
                }
                let phase = p[0] + p[1] * x + p[2] * y + p[3] * z + p[4] * (x * x + y * y);
                out.push(Complex64::from_polar(m, phase));
            }
        }
    }
    out
}

/// In-place unnormalised forward DFT over the three axes of a row-major `dims` volume.
pub fn fft3(v: &mut [Complex64], dims: [usize; 3], planner: &mut FftPlanner<f64>) {
    fft_axes(v, dims, planner, false);
}

/// In-place inverse DFT (scaled by `1 / n`, PyTorch's `ifftn(norm = "backward")`) over the
/// three axes of a row-major `dims` volume.
pub fn ifft3(v: &mut [Complex64], dims: [usize; 3], planner: &mut FftPlanner<f64>) {
    fft_axes(v, dims, planner, true);
    let scale = 1.0 / (dims[0] * dims[1] * dims[2]) as f64;
    for x in v.iter_mut() {
        *x *= scale;
    }
}

fn fft_axes(v: &mut [Complex64], dims: [usize; 3], planner: &mut FftPlanner<f64>, inverse: bool) {
    for axis in 0..3 {
        let len = dims[axis];
        let stride: usize = dims[axis + 1..].iter().product();
        let fft = if inverse { planner.plan_fft_inverse(len) } else { planner.plan_fft_forward(len) };
        let mut line = vec![Complex64::new(0.0, 0.0); len];
        let outer = v.len() / (len * stride);
        for o in 0..outer {
            for inner in 0..stride {
                let base = o * len * stride + inner;
                for (j, x) in line.iter_mut().enumerate() {
                    *x = v[base + j * stride];
                }
                fft.process(&mut line);
                for (j, x) in line.iter().enumerate() {
                    v[base + j * stride] = *x;
                }
            }
        }
    }
}

/// The normalised distance of phase-encoding line `(kz, ky)` from the k-space centre (DC at
/// index 0, so frequencies wrap): 0 at DC, 1 at the corners.
fn radius(kz: usize, ky: usize, d: usize, s: usize) -> f64 {
    let f = |k: usize, n: usize| k.min(n - k) as f64 / (n as f64 / 2.0);
    ((f(kz, d).powi(2) + f(ky, s).powi(2)) / 2.0).sqrt()
}

/// Whether line `(kz, ky)` lies in the always-sampled centre block: less than `max(1, n/8)`
/// from DC along both axes.
fn in_centre(kz: usize, ky: usize, d: usize, s: usize) -> bool {
    let half = |n: usize| (n / 8).max(1);
    kz.min(d - kz) < half(d) && ky.min(s - ky) < half(s)
}

/// The probability of keeping a line outside the centre block.
fn keep_probability(kz: usize, ky: usize, d: usize, s: usize, lambda: f64) -> f64 {
    if in_centre(kz, ky, d, s) {
        1.0
    } else {
        (lambda * (1.0 - radius(kz, ky, d, s)).powi(2)).min(1.0)
    }
}

/// The `λ` for which the expected fraction of kept lines is `1 / accel` (bisection; the
/// fraction grows with `λ`). At `accel = 1` every line is kept.
fn density_scale(d: usize, s: usize, accel: f64) -> f64 {
    let want = 1.0 / accel;
    let frac = |lambda: f64| {
        let mut sum = 0.0;
        for kz in 0..d {
            for ky in 0..s {
                sum += keep_probability(kz, ky, d, s, lambda);
            }
        }
        sum / (d * s) as f64
    };
    let (mut lo, mut hi) = (0.0, 1e6);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if frac(mid) < want {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// The kept phase-encoding lines, `[kz · s + ky]`.
fn sample_lines(d: usize, s: usize, lambda: f64, rng: &mut SplitMix64) -> Vec<bool> {
    let mut lines = Vec::with_capacity(d * s);
    for kz in 0..d {
        for ky in 0..s {
            lines.push(rng.next_f64() < keep_probability(kz, ky, d, s, lambda));
        }
    }
    lines
}
