//! The built-in synthetic PolSAR segmentation dataset: scenes of 3-channel complex
//! scattering vectors `k = (S_hh, √2·S_hv, S_vv)` per pixel, partitioned into random Voronoi
//! regions, each region of one of K scattering classes. A pixel of class `c` is a circular
//! complex Gaussian vector with the class's 3×3 covariance `C_c` (single-look: the speckle is
//! the Gaussian itself, so a covariance estimated over `n` pixels is complex Wishart with `n`
//! looks), scaled by a random per-region gain. Labels are per pixel; pixels on a boundary
//! between regions of different classes and on the image's outer frame are unlabelled (the
//! label input's `ignore_index`). Deterministic for a seed: scene `i` depends only on
//! `(seed, i)` and the settings.
//!
//! Why it is not trivially separable: every class has the same expected span (total power,
//! `tr C = 1`) and the per-region gain (log-uniform over ±`gain_db`) hides what is left of
//! the intensity, so one pixel says little; the class is in the polarimetric structure
//! (co-/cross-polar power ratios, the HH–VV correlation and its phase, HH–HV correlation),
//! which a model has to estimate from second-order statistics over a neighbourhood
//! (`runtime/tests/synthetic_polsar.rs` checks both).

use crate::backend::{HostData, HostTensor};
use cvc_compiler::front::limits;
use cvc_compiler::init::SplitMix64;
use cvc_compiler::ir::DType;
use std::f64::consts::{FRAC_1_SQRT_2, PI};

/// The scattering classes, in class order; a dataset of `classes` classes uses the first
/// `classes`.
pub const CLASSES: [&str; 5] = ["surface", "double_bounce", "volume", "oriented", "helix"];

/// Smallest scene side.
pub const MIN_SIZE: usize = 8;

/// Most Voronoi regions per scene.
pub const MAX_REGIONS: usize = 256;

/// Half-width, in pixels, of the unlabelled band on each side of a boundary between regions
/// of different classes (a pixel closer than this to the bisector of two cells is ignored).
pub const BOUNDARY_HALF_WIDTH: f64 = 1.0;

/// Settings of a synthetic PolSAR dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct PolsarConfig {
    /// Number of classes (the first `classes` of [`CLASSES`]).
    pub classes: usize,
    /// Scene side in pixels (scenes are `size × size`).
    pub size: usize,
    /// Voronoi cells per scene (each draws its class uniformly).
    pub regions: usize,
    /// Per-region gain range in dB: the gain is `10^(u·gain_db/10)`, `u` uniform in −1..1.
    pub gain_db: f64,
    /// How far each class covariance is from the classes' mean covariance, in (0, 1]: 1 is
    /// the pure mechanisms of [`covariance`], smaller values mix every class towards the
    /// mean (harder).
    pub contrast: f64,
    /// Number of scenes.
    pub count: usize,
    /// Generator seed.
    pub seed: u64,
    /// The label of unlabelled pixels (the loss's `ignore_index`).
    pub ignore_index: i32,
}

impl PolsarConfig {
    /// Checks the settings, with a message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.classes < 2 || self.classes > CLASSES.len() {
            return Err(format!(
                "synthetic.polsar: classes = {} is outside 2..={} (available: {})",
                self.classes,
                CLASSES.len(),
                CLASSES.join(", ")
            ));
        }
        if self.size < MIN_SIZE {
            return Err(format!(
                "synthetic.polsar: size = {} is too small (at least {MIN_SIZE} pixels)",
                self.size
            ));
        }
        if self.regions == 0 || self.regions > MAX_REGIONS {
            return Err(format!("synthetic.polsar: regions = {} is outside 1..={MAX_REGIONS}", self.regions));
        }
        if !self.gain_db.is_finite() || !(0.0..=20.0).contains(&self.gain_db) {
            return Err(format!("synthetic.polsar: gain_db = {} is outside 0..=20", self.gain_db));
        }
        if !self.contrast.is_finite() || self.contrast <= 0.0 || self.contrast > 1.0 {
            return Err(format!("synthetic.polsar: contrast = {} is outside (0, 1]", self.contrast));
        }
        if self.count == 0 {
            return Err("synthetic.polsar: count must be at least 1".into());
        }
        if (0..self.classes as i32).contains(&self.ignore_index) {
            return Err(format!(
                "synthetic.polsar: the ignore label {} is one of the classes 0..{}",
                self.ignore_index, self.classes
            ));
        }
        // The whole set is held in memory (and written at once by `cvc data polsar`): it
        // must fit the data limit before anything is allocated.
        let limit = limits::max_data_bytes()?;
        limits::dataset_bytes("synthetic.polsar", self.count as u64, sample_bytes(self.size), limit)
            .map_err(|e| format!("{e}; {}", limits::data_limit_help()))?;
        Ok(())
    }
}

/// Bytes of one sample: a `3 × size × size` c64 scene and `size × size` i32 labels.
pub fn sample_bytes(size: usize) -> u64 {
    (size as u64).saturating_mul(size as u64).saturating_mul(3 * 8 + 4)
}

/// The generated scenes: `image` is `c64 [count, 3, size, size]` (channels HH, √2·HV, VV),
/// `label` is `i32 [count, size, size]`.
#[derive(Clone, Debug, PartialEq)]
pub struct PolsarData {
    /// The scattering vectors.
    pub image: HostTensor,
    /// The class of each pixel (an index into [`CLASSES`]) or the ignore label.
    pub label: HostTensor,
}

type C = (f64, f64);

fn cmul(a: C, b: C) -> C {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

fn conj(a: C) -> C {
    (a.0, -a.1)
}

/// A 3×3 Hermitian matrix, row-major.
pub type Cov = [[C; 3]; 3];

/// `Σ w·u·uᴴ` over the scattering mechanisms `(w, u)`.
fn mixture(parts: &[(f64, [C; 3])]) -> Cov {
    let mut m = [[(0.0, 0.0); 3]; 3];
    for (w, u) in parts {
        for (i, row) in m.iter_mut().enumerate() {
            for (j, e) in row.iter_mut().enumerate() {
                let p = cmul(u[i], conj(u[j]));
                e.0 += w * p.0;
                e.1 += w * p.1;
            }
        }
    }
    m
}

/// The covariance `E[k·kᴴ]` of class `class`, trace 1, before contrast: a mixture of
/// canonical mechanisms in the lexicographic basis `(S_hh, √2·S_hv, S_vv)` — odd bounce
/// `(1, 0, 1)/√2`, even bounce `(1, 0, −1)/√2`, a dihedral rotated by 22.5°
/// `(cos 2θ, √2·sin 2θ, −cos 2θ)/√2`, a left helix `(1, i√2, −1)/2` — and random-dipole
/// volume scattering `diag`-dominant `[[3, 0, 1], [0, 2, 0], [1, 0, 3]] / 8`.
pub fn covariance(class: usize) -> Cov {
    let r = FRAC_1_SQRT_2;
    let surface = [(r, 0.0), (0.0, 0.0), (r, 0.0)];
    let double = [(r, 0.0), (0.0, 0.0), (-r, 0.0)];
    let t = 2.0 * PI / 16.0; // 2θ for θ = 22.5°
    let oriented = [(r * t.cos(), 0.0), (t.sin(), 0.0), (-r * t.cos(), 0.0)];
    let helix = [(0.5, 0.0), (0.0, r), (-0.5, 0.0)];
    let mut volume = [[(0.0, 0.0); 3]; 3];
    volume[0][0] = (3.0 / 8.0, 0.0);
    volume[2][2] = (3.0 / 8.0, 0.0);
    volume[1][1] = (2.0 / 8.0, 0.0);
    volume[0][2] = (1.0 / 8.0, 0.0);
    volume[2][0] = (1.0 / 8.0, 0.0);
    let (mech, v): (Vec<(f64, [C; 3])>, f64) = match CLASSES[class] {
        "surface" => (vec![(0.8, surface), (0.1, double)], 0.1),
        "double_bounce" => (vec![(0.15, surface), (0.75, double)], 0.1),
        "volume" => (vec![(0.1, surface), (0.1, double)], 0.8),
        "oriented" => (vec![(0.1, surface), (0.6, oriented)], 0.3),
        "helix" => (vec![(0.2, surface), (0.5, helix)], 0.3),
        other => unreachable!("{other} is not a class"),
    };
    let mut m = mixture(&mech);
    for (row, vrow) in m.iter_mut().zip(&volume) {
        for (e, ve) in row.iter_mut().zip(vrow) {
            e.0 += v * ve.0;
            e.1 += v * ve.1;
        }
    }
    m
}

/// The covariances of the first `classes` classes at a `contrast`:
/// `C'_c = contrast·C_c + (1 − contrast)·mean_c C_c`.
pub fn class_covariances(classes: usize, contrast: f64) -> Vec<Cov> {
    let pure: Vec<Cov> = (0..classes).map(covariance).collect();
    let mut mean = [[(0.0, 0.0); 3]; 3];
    for c in &pure {
        for i in 0..3 {
            for j in 0..3 {
                mean[i][j].0 += c[i][j].0 / classes as f64;
                mean[i][j].1 += c[i][j].1 / classes as f64;
            }
        }
    }
    pure.iter()
        .map(|c| {
            let mut m = *c;
            for i in 0..3 {
                for j in 0..3 {
                    m[i][j].0 = contrast * c[i][j].0 + (1.0 - contrast) * mean[i][j].0;
                    m[i][j].1 = contrast * c[i][j].1 + (1.0 - contrast) * mean[i][j].1;
                }
            }
            m
        })
        .collect()
}

/// The lower-triangular `L` with `L·Lᴴ = m` (a tiny ridge keeps the rank-deficient pure
/// mechanisms factorisable).
fn cholesky(m: &Cov) -> Cov {
    let mut l = [[(0.0, 0.0); 3]; 3];
    for i in 0..3 {
        for j in 0..=i {
            let mut s = m[i][j];
            let (ri, rj) = (l[i], l[j]);
            for (a, b) in ri.iter().zip(&rj).take(j) {
                let p = cmul(*a, conj(*b));
                s.0 -= p.0;
                s.1 -= p.1;
            }
            if i == j {
                l[i][i] = ((s.0 + 1e-9).max(1e-9).sqrt(), 0.0);
            } else {
                let d = l[j][j].0;
                l[i][j] = (s.0 / d, s.1 / d);
            }
        }
    }
    l
}

/// Generates the dataset.
pub fn generate(cfg: &PolsarConfig) -> Result<PolsarData, String> {
    cfg.validate()?;
    let n = cfg.size * cfg.size;
    let factors: Vec<Cov> = class_covariances(cfg.classes, cfg.contrast).iter().map(cholesky).collect();
    // Each scene has its own seed, so the scenes are generated on several threads (a
    // benchmark's 36,864 scenes took minutes on one) and come out the same.
    let scenes: Vec<usize> = (0..cfg.count).collect();
    let threads = crate::par::threads_for(cfg.count * n * 28);
    let parts = crate::par::map_chunks(&scenes, threads, |chunk| {
        let mut image = Vec::with_capacity(2 * 3 * n * chunk.len());
        let mut labels = Vec::with_capacity(n * chunk.len());
        for &i in chunk {
            let mut rng = SplitMix64::new(scene_seed(cfg.seed, i as u64));
            let (img, lab) = scene(cfg, &factors, &mut rng);
            image.extend(img.iter().map(|&x| x as f32));
            labels.extend(lab);
        }
        (image, labels)
    });
    let mut image = Vec::with_capacity(2 * 3 * n * cfg.count);
    let mut labels = Vec::with_capacity(n * cfg.count);
    for (img, lab) in parts {
        image.extend_from_slice(&img);
        labels.extend_from_slice(&lab);
    }
    Ok(PolsarData {
        image: HostTensor {
            dtype: DType::C64,
            shape: vec![cfg.count, 3, cfg.size, cfg.size],
            data: HostData::F32(image),
        },
        label: HostTensor {
            dtype: DType::I32,
            shape: vec![cfg.count, cfg.size, cfg.size],
            data: HostData::I32(labels),
        },
    })
}

/// The generator state of scene `i`: a hash of `(seed, i)`, as synthetic.sar's images.
fn scene_seed(seed: u64, i: u64) -> u64 {
    let base = SplitMix64::new(seed ^ 0x504F_4C53_4152_5347).next_u64();
    SplitMix64::new(base ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

/// One scene: the interleaved `(re, im)` values of `[3, size, size]` and the labels of
/// `[size, size]`.
fn scene(cfg: &PolsarConfig, factors: &[Cov], rng: &mut SplitMix64) -> (Vec<f64>, Vec<i32>) {
    let s = cfg.size;
    let cells: Vec<(f64, f64, usize, f64)> = (0..cfg.regions)
        .map(|_| {
            let x = rng.uniform(0.0, s as f64);
            let y = rng.uniform(0.0, s as f64);
            let class = (rng.next_u64() % cfg.classes as u64) as usize;
            let gain = 10f64.powf(rng.uniform(-1.0, 1.0) * cfg.gain_db / 10.0);
            (x, y, class, gain)
        })
        .collect();
    let mut img = vec![0.0; 2 * 3 * s * s];
    let mut lab = vec![0i32; s * s];
    for py in 0..s {
        for px in 0..s {
            let (x, y) = (px as f64 + 0.5, py as f64 + 0.5);
            let d2 = |c: &(f64, f64, usize, f64)| (c.0 - x).powi(2) + (c.1 - y).powi(2);
            let near =
                (0..cells.len()).min_by(|&a, &b| d2(&cells[a]).total_cmp(&d2(&cells[b]))).expect("a cell");
            let (cx, cy, class, gain) = cells[near];
            // Distance to the nearest bisector with a cell of another class: the pixel is on
            // a boundary when it is within BOUNDARY_HALF_WIDTH of it.
            let on_boundary = cells.iter().enumerate().any(|(j, o)| {
                if j == near || o.2 == class {
                    return false;
                }
                let sep = ((o.0 - cx).powi(2) + (o.1 - cy).powi(2)).sqrt();
                sep > 0.0 && (d2(o) - d2(&cells[near])) / (2.0 * sep) < BOUNDARY_HALF_WIDTH
            });
            let frame = px == 0 || py == 0 || px == s - 1 || py == s - 1;
            lab[py * s + px] = if on_boundary || frame { cfg.ignore_index } else { class as i32 };
            // k = √gain · L·n, n ~ CN(0, I): E[k·kᴴ] = gain · C.
            let nz: [C; 3] =
                std::array::from_fn(|_| (rng.normal() * FRAC_1_SQRT_2, rng.normal() * FRAC_1_SQRT_2));
            let l = &factors[class];
            let g = gain.sqrt();
            for (ch, row) in l.iter().enumerate() {
                let mut k = (0.0, 0.0);
                for (lij, nj) in row.iter().zip(&nz) {
                    let p = cmul(*lij, *nj);
                    k.0 += p.0;
                    k.1 += p.1;
                }
                let at = 2 * ((ch * s + py) * s + px);
                img[at] = g * k.0;
                img[at + 1] = g * k.1;
            }
        }
    }
    (img, lab)
}
