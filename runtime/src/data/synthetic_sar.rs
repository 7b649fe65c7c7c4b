//! The built-in synthetic SAR dataset: single-channel complex images of one target on
//! clutter. A target is a set of point scatterers laid out in a class-specific shape (a line,
//! a cross, an L, a ring, a T, a 3×4 grid), placed at a random position with a random
//! rotation, size, amplitude and phase per scatterer, imaged through a windowed-sinc point
//! spread function, then complex Gaussian clutter is added at a random signal-to-clutter
//! ratio and the image is multiplied by L-look gamma speckle. Deterministic for a seed:
//! image `i` depends only on `(seed, i)` and the settings.
//!
//! Why it is not trivially separable: every shape has the same number of scatterers and the
//! same total amplitude on average, and the position, rotation and gain are random, so the
//! class is in the spatial arrangement of the bright points, not in any pixel's expected
//! magnitude (a linear model on `|x|` stays near chance: `runtime/tests/synthetic_sar.rs`).

use crate::backend::{HostData, HostTensor};
use cvc_compiler::front::limits;
use cvc_compiler::init::SplitMix64;
use cvc_compiler::ir::DType;
use std::f64::consts::PI;

/// The target shapes, in class order; a dataset of `classes` classes uses the first `classes`.
pub const SHAPES: [&str; 6] = ["line", "cross", "ell", "ring", "tee", "grid"];

/// Point scatterers per target (the same for every shape, so counting bright points or
/// summing energy does not tell the classes apart).
pub const SCATTERERS: usize = 12;

/// Half-width, in pixels, of the window of the point spread function.
const PSF_HALF: i64 = 3;

/// Smallest image side.
pub const MIN_SIZE: usize = 8;

/// Settings of a synthetic SAR dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct SarConfig {
    /// Number of classes (the first `classes` of [`SHAPES`]).
    pub classes: usize,
    /// Image side in pixels (images are `size × size`).
    pub size: usize,
    /// Signal-to-clutter ratio range in dB (mean scatterer power over clutter power per
    /// pixel), drawn uniformly per image.
    pub scr_db: (f64, f64),
    /// Number of looks of the multiplicative speckle (intensity ~ Gamma(L, 1/L); more looks,
    /// less speckle).
    pub looks: usize,
    /// Number of images.
    pub count: usize,
    /// Generator seed.
    pub seed: u64,
}

impl SarConfig {
    /// Checks the settings, with a message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.classes < 2 || self.classes > SHAPES.len() {
            return Err(format!(
                "synthetic.sar: classes = {} is outside 2..={} (available: {})",
                self.classes,
                SHAPES.len(),
                SHAPES.join(", ")
            ));
        }
        if self.size < MIN_SIZE {
            return Err(format!(
                "synthetic.sar: size = {} is too small (at least {MIN_SIZE} pixels)",
                self.size
            ));
        }
        if self.looks == 0 || self.looks > 64 {
            return Err(format!("synthetic.sar: looks = {} is outside 1..=64", self.looks));
        }
        if self.count == 0 {
            return Err("synthetic.sar: count must be at least 1".into());
        }
        let (lo, hi) = self.scr_db;
        if !lo.is_finite() || !hi.is_finite() || lo > hi {
            return Err(format!("synthetic.sar: scr_db = {lo}..{hi} is not a valid range"));
        }
        // The whole set is held in memory (and written at once by `cvc data sar`): it must
        // fit the data limit before anything is allocated.
        let limit = limits::max_data_bytes()?;
        limits::dataset_bytes("synthetic.sar", self.count as u64, sample_bytes(self.size), limit)
            .map_err(|e| format!("{e}; {}", limits::data_limit_help()))?;
        Ok(())
    }
}

/// Bytes of one sample: a `size × size` c64 image and an i32 label.
pub fn sample_bytes(size: usize) -> u64 {
    (size as u64).saturating_mul(size as u64).saturating_mul(8).saturating_add(4)
}

/// The generated images: `image` is `c64 [count, 1, size, size]`, `label` is `i32 [count]`.
#[derive(Clone, Debug, PartialEq)]
pub struct SarData {
    /// The complex images.
    pub image: HostTensor,
    /// The class of each image (an index into [`SHAPES`]).
    pub label: HostTensor,
}

/// Generates the dataset. Labels cycle through the classes (`label[i] = i % classes`), so the
/// classes are balanced to within one image.
pub fn generate(cfg: &SarConfig) -> Result<SarData, String> {
    cfg.validate()?;
    let n = cfg.size * cfg.size;
    let mut image = Vec::with_capacity(2 * cfg.count * n);
    let mut labels = Vec::with_capacity(cfg.count);
    for i in 0..cfg.count {
        let class = i % cfg.classes;
        let mut rng = SplitMix64::new(image_seed(cfg.seed, i as u64));
        for z in scene(class, cfg, &mut rng) {
            image.push(z.0 as f32);
            image.push(z.1 as f32);
        }
        labels.push(class as i32);
    }
    Ok(SarData {
        image: HostTensor {
            dtype: DType::C64,
            shape: vec![cfg.count, 1, cfg.size, cfg.size],
            data: HostData::F32(image),
        },
        label: HostTensor { dtype: DType::I32, shape: vec![cfg.count], data: HostData::I32(labels) },
    })
}

/// The generator state of image `i`: a hash of `(seed, i)`, so images start at unrelated
/// points of the sequence (as synthetic.rf's bursts).
fn image_seed(seed: u64, i: u64) -> u64 {
    let base = SplitMix64::new(seed ^ 0x5341_525F_494D_4731).next_u64();
    SplitMix64::new(base ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

type C = (f64, f64);

/// The scatterer layout of a shape in unit coordinates (every point within radius ~1 of the
/// origin), [`SCATTERERS`] points.
pub fn template(class: usize) -> Vec<(f64, f64)> {
    let n = SCATTERERS;
    // `k` evenly spaced points from a to b, ends included.
    let seg = |a: (f64, f64), b: (f64, f64), k: usize| -> Vec<(f64, f64)> {
        (0..k)
            .map(|j| {
                let t = if k == 1 { 0.5 } else { j as f64 / (k - 1) as f64 };
                (a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1))
            })
            .collect()
    };
    let pts: Vec<(f64, f64)> = match SHAPES[class] {
        "line" => seg((-1.0, 0.0), (1.0, 0.0), n),
        "cross" => {
            // Two arms of 6 points each, neither through the exact centre (no doubled point).
            let mut p = seg((-1.0, 0.0), (-0.2, 0.0), 3);
            p.extend(seg((0.2, 0.0), (1.0, 0.0), 3));
            p.extend(seg((0.0, -1.0), (0.0, -0.2), 3));
            p.extend(seg((0.0, 0.2), (0.0, 1.0), 3));
            p
        }
        "ell" => {
            let mut p = seg((-0.7, -0.7), (0.9, -0.7), 6);
            p.extend(seg((-0.7, -0.38), (-0.7, 0.9), 6));
            p
        }
        "ring" => (0..n)
            .map(|j| {
                let a = 2.0 * PI * j as f64 / n as f64;
                (0.8 * a.cos(), 0.8 * a.sin())
            })
            .collect(),
        "tee" => {
            let mut p = seg((-0.9, 0.8), (0.9, 0.8), 6);
            p.extend(seg((0.0, 0.45), (0.0, -1.0), 6));
            p
        }
        "grid" => (0..n).map(|j| (-0.75 + 0.5 * (j % 4) as f64, -0.6 + 0.6 * (j / 4) as f64)).collect(),
        other => unreachable!("{other} is not a shape"),
    };
    debug_assert_eq!(pts.len(), n);
    pts
}

/// Windowed sinc: the response of an ideal band-limited imager at offset `d` pixels, with a
/// Hann taper so that the window of ±[`PSF_HALF`] pixels holds it.
fn psf(d: f64) -> f64 {
    let s = if d.abs() < 1e-12 { 1.0 } else { (PI * d).sin() / (PI * d) };
    let w = 0.5 * (1.0 + (PI * d / (PSF_HALF as f64 + 1.0)).cos());
    s * w
}

/// One `size × size` image (row-major) of a target of shape `class`.
fn scene(class: usize, cfg: &SarConfig, rng: &mut SplitMix64) -> Vec<C> {
    let size = cfg.size as f64;
    let mut img = vec![(0.0, 0.0); cfg.size * cfg.size];
    // Size: the target spans 30–45% of the image side; it fits inside with the PSF's margin.
    let radius = size * rng.uniform(0.15, 0.225);
    let margin = radius + 1.5;
    let cx = rng.uniform(margin, size - 1.0 - margin);
    let cy = rng.uniform(margin, size - 1.0 - margin);
    let rot = rng.uniform(0.0, 2.0 * PI);
    let (sr, cr) = rot.sin_cos();
    let gain = (rng.uniform(-1.0, 1.0) * 10f64.ln() / 2.0).exp(); // 1/√10 … √10
    let mut power = 0.0;
    for (ux, uy) in template(class) {
        // Jitter each point a little so shapes are not exact templates.
        let (jx, jy) = (ux + 0.06 * rng.normal(), uy + 0.06 * rng.normal());
        let x = cx + radius * (cr * jx - sr * jy);
        let y = cy + radius * (sr * jx + cr * jy);
        let amp = gain * rng.uniform(0.5, 1.5);
        let phase = rng.uniform(0.0, 2.0 * PI);
        let a = (amp * phase.cos(), amp * phase.sin());
        power += amp * amp;
        let (x0, y0) = (x.round() as i64, y.round() as i64);
        for py in (y0 - PSF_HALF).max(0)..=(y0 + PSF_HALF).min(cfg.size as i64 - 1) {
            let hy = psf(py as f64 - y);
            for px in (x0 - PSF_HALF).max(0)..=(x0 + PSF_HALF).min(cfg.size as i64 - 1) {
                let h = hy * psf(px as f64 - x);
                let p = &mut img[py as usize * cfg.size + px as usize];
                p.0 += h * a.0;
                p.1 += h * a.1;
            }
        }
    }
    // Clutter: circular complex Gaussian with power = mean scatterer power / SCR.
    let (lo, hi) = cfg.scr_db;
    let scr = if hi > lo { rng.uniform(lo, hi) } else { lo };
    let sigma = (power / SCATTERERS as f64 * 10f64.powf(-scr / 10.0) / 2.0).sqrt();
    let looks = cfg.looks;
    for p in &mut img {
        let z = (p.0 + sigma * rng.normal(), p.1 + sigma * rng.normal());
        // L-look speckle: intensity factor Gamma(L, 1/L) (mean 1), applied to the amplitude.
        let g: f64 = (0..looks).map(|_| -(1.0 - rng.next_f64()).ln()).sum::<f64>() / looks as f64;
        let m = g.sqrt();
        *p = (z.0 * m, z.1 * m);
    }
    img
}
