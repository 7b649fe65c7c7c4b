//! The built-in synthetic SAR dataset: single-channel complex image chips of one vehicle on
//! ground clutter, in the manner of MSTAR's target chips. A class is a vehicle type: a
//! footprint (length and width, or a disc) and a set of dominant point scatterers laid out on
//! it (hull corners, a turret ring and gun barrel, a cab, launch tubes, a dish rim, ...), each
//! class its own size and pattern. Per image the vehicle is placed near the centre of the
//! chip with a random offset, a random aspect (rotation over 360°), a small scale jitter, a
//! random gain and a random amplitude and phase per scatterer. The image is formed as in a
//! real SAR chip: the point scatterers through a windowed-sinc point spread function, a weak
//! diffuse return from the vehicle's body, complex Gaussian ground clutter at a random
//! signal-to-clutter ratio with `looks`-look gamma texture (K-distributed clutter), and the
//! vehicle's radar shadow (clutter attenuated behind the vehicle, away from the radar on
//! the left). Deterministic for a seed: image `i` depends only on `(seed, i)` and the
//! settings.
//!
//! What tells the classes apart is what tells real vehicles apart in SAR: their extent (the
//! footprint, its shadow and where the bright points lie) and the pattern of their dominant
//! scatterers. No pixel's magnitude gives the class away on its own: the aspect, position and
//! gain are random (`runtime/tests/synthetic_sar.rs` checks that a linear model on `|x|` is
//! far from solving it, and that a small complex ViT learns it).

use crate::backend::{HostData, HostTensor};
use cvc_compiler::front::limits;
use cvc_compiler::init::SplitMix64;
use cvc_compiler::ir::DType;
use std::f64::consts::PI;

/// The vehicle types, in class order; a dataset of `classes` classes uses the first `classes`.
pub const SHAPES: [&str; 6] = ["tank", "truck", "car", "radar", "launcher", "apc"];

/// Half-width, in pixels, of the window of the point spread function.
const PSF_HALF: i64 = 3;

/// Power of the body's diffuse return below the mean power of the dominant scatterers, dB.
const BODY_DB: f64 = 6.0;

/// Attenuation of the clutter in the vehicle's radar shadow, dB.
const SHADOW_DB: f64 = 12.0;

/// Largest offset of the vehicle's centre from the chip's centre, per axis, as a fraction of
/// the image side.
const OFFSET: f64 = 0.1;

/// Smallest image side.
pub const MIN_SIZE: usize = 8;

/// Settings of a synthetic SAR dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct SarConfig {
    /// Number of classes (the first `classes` vehicle types of [`SHAPES`]).
    pub classes: usize,
    /// Image side in pixels (images are `size × size`).
    pub size: usize,
    /// Signal-to-clutter ratio range in dB (mean power of the dominant scatterers over the
    /// clutter's power per pixel), drawn uniformly per image.
    pub scr_db: (f64, f64),
    /// Number of looks of the clutter's texture (its intensity is multiplied by a
    /// Gamma(L, 1/L) factor per pixel; fewer looks, spikier clutter).
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

/// A dominant point scatterer of a vehicle: its place on the body (`u` along the length,
/// positive forward, `v` across, both in image sides) and its relative amplitude.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scatterer {
    /// Position along the vehicle, in image sides.
    pub u: f64,
    /// Position across the vehicle, in image sides.
    pub v: f64,
    /// Amplitude relative to the image's gain.
    pub amp: f64,
}

/// A vehicle type: its footprint, the length of its radar shadow and its dominant scatterers.
#[derive(Clone, Debug, PartialEq)]
pub struct Vehicle {
    /// The class name (one of [`SHAPES`]).
    pub name: &'static str,
    /// Footprint length (along `u`), in image sides; a round footprint's diameter.
    pub length: f64,
    /// Footprint width (along `v`), in image sides.
    pub width: f64,
    /// A disc of diameter `length` instead of a rectangle.
    pub round: bool,
    /// Length of the shadow behind the vehicle (its height over the tangent of the radar's
    /// depression angle), in image sides.
    pub shadow: f64,
    /// The dominant point scatterers.
    pub scatterers: Vec<Scatterer>,
}

impl Vehicle {
    /// Whether body coordinates `(u, v)` (image sides) lie on the footprint.
    pub fn covers(&self, u: f64, v: f64) -> bool {
        if self.round {
            u.hypot(v) <= self.length / 2.0
        } else {
            u.abs() <= self.length / 2.0 && v.abs() <= self.width / 2.0
        }
    }

    /// The largest distance of a footprint point or scatterer from the centre.
    fn reach(&self) -> f64 {
        let body = if self.round { self.length / 2.0 } else { (self.length / 2.0).hypot(self.width / 2.0) };
        self.scatterers.iter().map(|s| s.u.hypot(s.v)).fold(body, f64::max)
    }
}

/// The vehicle of class `class` (an index into [`SHAPES`]). Sizes are fractions of the image
/// side; the scatterer layouts follow the parts that dominate real vehicles' SAR returns.
pub fn vehicle(class: usize) -> Vehicle {
    // `k` evenly spaced scatterers from a to b, ends included.
    fn line(a: (f64, f64), b: (f64, f64), k: usize, amp: f64) -> Vec<Scatterer> {
        (0..k)
            .map(|j| {
                let t = if k == 1 { 0.5 } else { j as f64 / (k - 1) as f64 };
                Scatterer { u: a.0 + t * (b.0 - a.0), v: a.1 + t * (b.1 - a.1), amp }
            })
            .collect()
    }
    fn point(u: f64, v: f64, amp: f64) -> Scatterer {
        Scatterer { u, v, amp }
    }
    let name = SHAPES[class];
    let (length, width, round, shadow, scatterers) = match name {
        // Compact hull, a turret ring with a bright centre and a gun barrel reaching far past
        // the front.
        "tank" => {
            let mut s = vec![
                point(0.16, 0.11, 1.0),
                point(0.16, -0.11, 1.0),
                point(-0.16, 0.11, 1.0),
                point(-0.16, -0.11, 1.0),
            ];
            s.extend(line((-0.10, 0.11), (0.10, 0.11), 3, 0.5));
            s.extend(line((-0.10, -0.11), (0.10, -0.11), 3, 0.5));
            s.extend((0..6).map(|j| {
                let a = PI * j as f64 / 3.0;
                point(-0.02 + 0.055 * a.cos(), 0.055 * a.sin(), 0.8)
            }));
            s.push(point(-0.02, 0.0, 1.4));
            s.extend(line((0.09, 0.0), (0.34, 0.0), 5, 0.7));
            (0.32, 0.22, false, 0.05, s)
        }
        // Long and narrow: a bright cab block at the front, a cargo box behind it.
        "truck" => {
            let mut s: Vec<Scatterer> = [0.18, 0.215, 0.25]
                .iter()
                .flat_map(|&u| [point(u, 0.05, 1.2), point(u, -0.05, 1.2)])
                .collect();
            s.extend(line((-0.19, 0.07), (0.12, 0.07), 6, 0.6));
            s.extend(line((-0.19, -0.07), (0.12, -0.07), 6, 0.6));
            s.extend(line((-0.25, 0.07), (-0.25, -0.07), 3, 1.1));
            (0.50, 0.14, false, 0.09, s)
        }
        // A box: scatterers all along its outline, two bright ones on the sloped front.
        "apc" => {
            let mut s = line((0.21, 0.09), (0.21, -0.09), 4, 0.8);
            s.extend(line((-0.21, 0.09), (-0.21, -0.09), 4, 0.8));
            s.extend(line((-0.14, 0.09), (0.14, 0.09), 5, 0.8));
            s.extend(line((-0.14, -0.09), (0.14, -0.09), 5, 0.8));
            s.extend([point(0.16, 0.045, 1.3), point(0.16, -0.045, 1.3)]);
            (0.42, 0.18, false, 0.08, s)
        }
        // Small: corners, wheel arches and the roof.
        "car" => {
            let s = vec![
                point(0.10, 0.05, 1.0),
                point(0.10, -0.05, 1.0),
                point(-0.10, 0.05, 1.0),
                point(-0.10, -0.05, 1.0),
                point(0.0, 0.05, 0.7),
                point(0.0, -0.05, 0.7),
                point(-0.02, 0.0, 0.9),
            ];
            (0.20, 0.10, false, 0.04, s)
        }
        // A cab and two long parallel launch tubes, outriggers at the rear.
        "launcher" => {
            let mut s = vec![
                point(0.20, 0.07, 1.1),
                point(0.20, -0.07, 1.1),
                point(0.235, 0.07, 1.1),
                point(0.235, -0.07, 1.1),
            ];
            s.extend(line((-0.22, 0.045), (0.12, 0.045), 8, 0.7));
            s.extend(line((-0.22, -0.045), (0.12, -0.045), 8, 0.7));
            s.extend([point(-0.24, 0.11, 1.0), point(-0.24, -0.11, 1.0)]);
            (0.48, 0.22, false, 0.10, s)
        }
        // A large round antenna: a ring of rim scatterers around a bright mast, a tall
        // shadow.
        "radar" => {
            let mut s: Vec<Scatterer> = (0..16)
                .map(|j| {
                    let a = 2.0 * PI * j as f64 / 16.0;
                    point(0.18 * a.cos(), 0.18 * a.sin(), 0.8)
                })
                .collect();
            s.extend([point(0.0, 0.0, 1.3), point(0.03, 0.0, 1.3), point(-0.03, 0.0, 1.3)]);
            (0.40, 0.40, true, 0.14, s)
        }
        other => unreachable!("{other} is not a vehicle"),
    };
    Vehicle { name, length, width, round, shadow, scatterers }
}

/// Windowed sinc: the response of an ideal band-limited imager at offset `d` pixels, with a
/// Hann taper so that the window of ±[`PSF_HALF`] pixels holds it.
fn psf(d: f64) -> f64 {
    let s = if d.abs() < 1e-12 { 1.0 } else { (PI * d).sin() / (PI * d) };
    let w = 0.5 * (1.0 + (PI * d / (PSF_HALF as f64 + 1.0)).cos());
    s * w
}

/// A circular complex Gaussian number of unit power.
fn cnormal(rng: &mut SplitMix64) -> C {
    let s = std::f64::consts::FRAC_1_SQRT_2;
    (s * rng.normal(), s * rng.normal())
}

/// An `L`-look texture factor for an amplitude: `√g`, `g ~ Gamma(L, 1/L)` (mean 1).
fn texture(rng: &mut SplitMix64, looks: usize) -> f64 {
    let g: f64 = (0..looks).map(|_| -(1.0 - rng.next_f64()).ln()).sum::<f64>() / looks as f64;
    g.sqrt()
}

/// One `size × size` image (row-major) of a vehicle of class `class`.
fn scene(class: usize, cfg: &SarConfig, rng: &mut SplitMix64) -> Vec<C> {
    let n = cfg.size;
    let side = n as f64;
    let v = vehicle(class);
    // Pose: near the centre, any aspect, ±5% scale, gain ×0.5…×2 (log-uniform).
    let scale = side * rng.uniform(0.95, 1.05);
    let mid = (side - 1.0) / 2.0;
    let cx = mid + side * rng.uniform(-OFFSET, OFFSET);
    let cy = mid + side * rng.uniform(-OFFSET, OFFSET);
    let rot = rng.uniform(0.0, 2.0 * PI);
    let (sr, cr) = rot.sin_cos();
    let gain = 1.0;
    // Pixel (x, y) to body coordinates (image sides).
    let body = |x: f64, y: f64| {
        let (dx, dy) = ((x - cx) / scale, (y - cy) / scale);
        (cr * dx + sr * dy, -sr * dx + cr * dy)
    };
    let covers = |x: f64, y: f64| {
        let (u, w) = body(x, y);
        v.covers(u, w)
    };
    let mut img = vec![(0.0, 0.0); n * n];
    let mut power = 0.0;
    for s in &v.scatterers {
        // A little jitter of each scatterer's place, its amplitude and phase per image (a
        // scatterer's return changes with the aspect).
        let (ju, jv) = (s.u + 0.004 * rng.normal(), s.v + 0.004 * rng.normal());
        let x = cx + scale * (cr * ju - sr * jv);
        let y = cy + scale * (sr * ju + cr * jv);
        let amp = gain * s.amp * rng.uniform(0.5, 1.5);
        let phase = rng.uniform(0.0, 2.0 * PI);
        let a = (amp * phase.cos(), amp * phase.sin());
        power += amp * amp;
        let (x0, y0) = (x.round() as i64, y.round() as i64);
        for py in (y0 - PSF_HALF).max(0)..=(y0 + PSF_HALF).min(n as i64 - 1) {
            let hy = psf(py as f64 - y);
            for px in (x0 - PSF_HALF).max(0)..=(x0 + PSF_HALF).min(n as i64 - 1) {
                let h = hy * psf(px as f64 - x);
                let p = &mut img[py as usize * n + px as usize];
                p.0 += h * a.0;
                p.1 += h * a.1;
            }
        }
    }
    let mean_power = power / v.scatterers.len() as f64;
    let (lo, hi) = cfg.scr_db;
    let scr = if hi > lo { rng.uniform(lo, hi) } else { lo };
    let clutter = (mean_power * 10f64.powf(-scr / 10.0)).sqrt();
    let diffuse = (mean_power * 10f64.powf(-BODY_DB / 10.0)).sqrt();
    let shade = 10f64.powf(-SHADOW_DB / 20.0);
    // The radar looks from the left (small x): the shadow of a point on the footprint falls up
    // to `shadow` image sides to its right. Pixels far from the vehicle skip the test.
    let shadow_px = v.shadow * scale;
    let steps = (shadow_px / 0.5).ceil().max(1.0) as usize;
    let near = v.reach() * scale + shadow_px + 2.0;
    for (k, p) in img.iter_mut().enumerate() {
        let (x, y) = ((k % n) as f64, (k / n) as f64);
        let close = (x - cx).hypot(y - cy) <= near;
        let on = close && covers(x, y);
        let amp = if on {
            diffuse
        } else if close && (1..=steps).any(|j| covers(x - shadow_px * j as f64 / steps as f64, y)) {
            clutter * shade
        } else {
            clutter
        };
        let z = cnormal(rng);
        let m = amp * texture(rng, cfg.looks);
        p.0 += m * z.0;
        p.1 += m * z.1;
    }
    img
}
