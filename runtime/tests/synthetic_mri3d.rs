//! The synthetic 3-D MRI dataset: deterministic per (seed, volume), shaped as declared, its
//! k-space the masked 3-D DFT of the target (checked with a direct DFT, not the generator's
//! FFT), its masks Cartesian (full readout), variable-density and at the requested
//! acceleration, bad settings refused with the field named; and the zero-filled baseline that
//! `examples/mri_volume.cvnn` has to beat.

use cvc_compiler::ir::{DType, Dim, Shape, TensorType};
use cvc_runtime::data::synthetic_mri3d::{generate, ifft3, Mri3dConfig};
use cvc_runtime::data::{Dataset, InputSpec};
use num_complex::Complex64;

#[path = "../../tests/src/seed.rs"]
mod seed;
use seed::seed_for;

fn cfg(depth: usize, size: usize, accel: f64, count: usize, seed: u64) -> Mri3dConfig {
    Mri3dConfig { depth, size, accel, count, seed }
}

fn complex(v: &[f32]) -> Vec<Complex64> {
    v.chunks(2).map(|p| Complex64::new(p[0] as f64, p[1] as f64)).collect()
}

#[test]
fn volumes_are_deterministic_and_shaped() {
    let seed = seed_for("synthetic_mri3d::deterministic");
    let c = cfg(4, 6, 3.0, 5, seed);
    let a = generate(&c).unwrap();
    assert_eq!(a, generate(&c).unwrap());
    for t in [&a.kspace, &a.mask, &a.target] {
        assert_eq!(t.shape, vec![5, 1, 4, 6, 6]);
    }
    assert_eq!((a.kspace.dtype, a.mask.dtype, a.target.dtype), (DType::C64, DType::F32, DType::C64));
    assert_ne!(a.target, generate(&Mri3dConfig { seed: seed + 1, ..c.clone() }).unwrap().target);
    // Volume i depends on (seed, i) only: a longer dataset starts with the same volumes.
    let longer = generate(&Mri3dConfig { count: 7, ..c.clone() }).unwrap();
    assert_eq!(&longer.target.f32s()[..a.target.f32s().len()], a.target.f32s());
    assert_eq!(&longer.mask.f32s()[..a.mask.f32s().len()], a.mask.f32s());
}

/// `kspace = mask · DFT₃(target)`, with the DFT summed directly (`e^{−2πi k·n / N}`), and
/// the generator's inverse FFT gives the target back from the full k-space.
#[test]
fn kspace_is_the_masked_dft_of_the_target() {
    let (d, s) = (4, 5);
    let a = generate(&cfg(d, s, 2.0, 2, seed_for("synthetic_mri3d::dft"))).unwrap();
    let n = d * s * s;
    let target = complex(a.target.f32s());
    let kspace = complex(a.kspace.f32s());
    let mask = a.mask.f32s();
    let tau = 2.0 * std::f64::consts::PI;
    for v in 0..2 {
        let img = &target[v * n..(v + 1) * n];
        let mut full = vec![Complex64::new(0.0, 0.0); n];
        for (k, out) in full.iter_mut().enumerate() {
            let (kz, ky, kx) = (k / (s * s), (k / s) % s, k % s);
            for (j, x) in img.iter().enumerate() {
                let (z, y, w) = (j / (s * s), (j / s) % s, j % s);
                let ph = -tau
                    * ((kz * z) as f64 / d as f64 + (ky * y) as f64 / s as f64 + (kx * w) as f64 / s as f64);
                *out += x * Complex64::from_polar(1.0, ph);
            }
        }
        let scale = full.iter().map(|z| z.norm()).fold(0.0, f64::max);
        for k in 0..n {
            let m = mask[v * n + k] as f64;
            assert!(m == 0.0 || m == 1.0, "mask value {m}");
            let want = full[k] * m;
            let got = kspace[v * n + k];
            assert!((got - want).norm() <= 1e-5 * scale, "volume {v}, k {k}: {got} vs {want}");
        }
        let mut back = full.clone();
        ifft3(&mut back, [d, s, s], &mut rustfft::FftPlanner::new());
        for (b, x) in back.iter().zip(img) {
            assert!((b - x).norm() < 1e-5, "{b} vs {x}");
        }
    }
}

/// The readout (width) is sampled fully, the centre always, the periphery more sparsely than
/// the middle band, and about 1/accel of the lines overall; each volume has its own mask.
#[test]
fn masks_are_cartesian_variable_density_at_the_acceleration() {
    let (d, s, count) = (16, 32, 24);
    for accel in [2.0, 4.0, 8.0] {
        let a = generate(&cfg(d, s, accel, count, seed_for("synthetic_mri3d::masks"))).unwrap();
        let m = a.mask.f32s();
        let line = |v: usize, kz: usize, ky: usize| m[((v * d + kz) * s + ky) * s];
        let (mut kept, mut inner, mut inner_n, mut outer, mut outer_n) = (0.0, 0.0, 0, 0.0, 0);
        for v in 0..count {
            for kz in 0..d {
                for ky in 0..s {
                    let base = ((v * d + kz) * s + ky) * s;
                    assert!(m[base..base + s].iter().all(|&x| x == m[base]), "readout not full");
                    let x = line(v, kz, ky) as f64;
                    kept += x;
                    let fz = kz.min(d - kz) as f64 / (d as f64 / 2.0);
                    let fy = ky.min(s - ky) as f64 / (s as f64 / 2.0);
                    let r = ((fz * fz + fy * fy) / 2.0).sqrt();
                    if r < 0.3 {
                        inner += x;
                        inner_n += 1;
                    } else if r > 0.6 {
                        outer += x;
                        outer_n += 1;
                    }
                }
            }
            assert_eq!(line(v, 0, 0), 1.0, "DC not sampled");
            assert_eq!(line(v, 1, 1), 1.0, "centre not sampled");
        }
        let frac = kept / (count * d * s) as f64;
        assert!((frac - 1.0 / accel).abs() < 0.15 / accel + 0.01, "accel {accel}: kept {frac}");
        assert!(inner / inner_n as f64 > 1.5 * outer / outer_n as f64, "accel {accel}: not variable density");
        let per = d * s * s;
        assert_ne!(&m[..per], &m[per..2 * per], "volumes share a mask");
    }
}

#[test]
fn bad_settings_name_the_field() {
    let e = generate(&cfg(2, 32, 4.0, 1, 0)).unwrap_err();
    assert!(e.contains("depth = 2"), "{e}");
    let e = generate(&cfg(16, 3, 4.0, 1, 0)).unwrap_err();
    assert!(e.contains("size = 3"), "{e}");
    let e = generate(&cfg(16, 32, 0.5, 1, 0)).unwrap_err();
    assert!(e.contains("accel = 0.5"), "{e}");
    let e = generate(&cfg(16, 32, 4.0, 0, 0)).unwrap_err();
    assert!(e.contains("count"), "{e}");
}

/// The inputs `kspace`, `mask`, `target` are fed by name; a missing one is named.
#[test]
fn dataset_feeds_the_inputs_by_name() {
    let spec = |name: &str, dtype| InputSpec {
        name: name.into(),
        ty: TensorType::new(
            dtype,
            Shape(vec![Dim::Batch, Dim::Fixed(1), Dim::Fixed(4), Dim::Fixed(8), Dim::Fixed(8)]),
        ),
        classes: None,
        ignore_index: None,
    };
    let inputs = vec![spec("target", DType::C64), spec("kspace", DType::C64), spec("mask", DType::F32)];
    let c = cfg(4, 8, 4.0, 3, 1);
    let ds = Dataset::synthetic_mri3d(&c, &inputs).unwrap();
    assert_eq!(ds.len, 3);
    let names: Vec<&str> = ds.arrays.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["target", "kspace", "mask"]);
    // A model that reads fewer of the arrays gets only those.
    assert_eq!(Dataset::synthetic_mri3d(&c, &inputs[..2]).unwrap().arrays.len(), 2);
    let e =
        Dataset::synthetic_mri3d(&c, &[spec("kspace", DType::C64), spec("image", DType::C64)]).unwrap_err();
    assert!(e.contains("'image'"), "{e}");
}

/// The zero-filled reconstruction `ifft3(kspace)` against the target, as the complex mse
/// of `examples/mri_volume.cvnn` (mean |z − t|² over every voxel), on that example's data:
/// the baseline a trained model must beat. Undersampling loses energy, so it is well above 0,
/// and below the mse of predicting zeros.
#[test]
fn zero_filled_baseline_of_the_example() {
    let (d, s) = (16, 32);
    let a = generate(&cfg(d, s, 4.0, 160, 3)).unwrap();
    let n = d * s * s;
    let k = complex(a.kspace.f32s());
    let t = complex(a.target.f32s());
    let mut planner = rustfft::FftPlanner::new();
    let (mut err, mut energy) = (0.0, 0.0);
    for v in 0..160 {
        let mut z = k[v * n..(v + 1) * n].to_vec();
        ifft3(&mut z, [d, s, s], &mut planner);
        for (x, y) in z.iter().zip(&t[v * n..(v + 1) * n]) {
            err += (x - y).norm_sqr();
            energy += y.norm_sqr();
        }
    }
    let (mse, zero) = (err / (160 * n) as f64, energy / (160 * n) as f64);
    println!("zero-filled mse {mse:.5}, mse of zeros {zero:.5}");
    assert!(mse > 0.01 * zero && mse < 0.5 * zero, "zero-filled mse {mse}, zeros {zero}");
}
