//! The synthetic SAR dataset: deterministic per (seed, image), balanced, shaped as declared,
//! bad settings refused with the field named, vehicles that fit the chip, and its difficulty
//! and learnability: a linear classifier on the pixel magnitudes stays far from solving it,
//! features of the vehicle's extent (invariant to position and aspect) tell the classes apart,
//! and a two-layer complex ViT of examples/vit_sar.cvnn's layer kinds learns it.

use cvc_compiler::ir::{DType, Dim, Shape, TensorType};
use cvc_runtime::backend::HostData;
use cvc_runtime::data::synthetic_sar::{generate, vehicle, SarConfig, SHAPES};
use cvc_runtime::data::{split, Dataset, InputSpec};
use cvc_runtime::session::{Device, Model};
use cvc_runtime::train::{train, TrainOptions};

#[path = "../../tests/src/seed.rs"]
mod seed;
use seed::seed_for;

fn cfg(classes: usize, size: usize, count: usize, seed: u64) -> SarConfig {
    SarConfig { classes, size, scr_db: (10.0, 20.0), looks: 4, count, seed }
}

#[test]
fn synthetic_sar_is_deterministic_balanced_and_shaped() {
    let seed = seed_for("synthetic_sar::deterministic");
    let c = cfg(4, 24, 41, seed);
    let a = generate(&c).unwrap();
    assert_eq!(a, generate(&c).unwrap());
    assert_eq!(a.image.shape, vec![41, 1, 24, 24]);
    assert_eq!(a.image.dtype, DType::C64);
    assert_ne!(a.image, generate(&SarConfig { seed: seed + 1, ..c.clone() }).unwrap().image);
    // A longer dataset starts with the same images: image i depends on (seed, i) only.
    let longer = generate(&SarConfig { count: 45, ..c.clone() }).unwrap();
    assert_eq!(&longer.image.f32s()[..a.image.f32s().len()], a.image.f32s());
    let HostData::I32(labels) = &a.label.data else { panic!("labels are i32") };
    let mut counts = [0usize; 4];
    for &l in labels {
        counts[l as usize] += 1;
    }
    assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1, "{counts:?}");
    assert!(a.image.f32s().iter().all(|x| x.is_finite()));
    // Complex, not real: the imaginary parts carry as much power as the real parts.
    let v = a.image.f32s();
    let (re, im): (f64, f64) =
        v.chunks(2).fold((0.0, 0.0), |(r, i), z| (r + (z[0] as f64).powi(2), i + (z[1] as f64).powi(2)));
    assert!((0.7..1.4).contains(&(re / im)), "re/im power {re} / {im}");
}

#[test]
fn synthetic_sar_rejects_bad_settings() {
    let ok = cfg(4, 16, 4, 0);
    let err = |c: SarConfig| generate(&c).unwrap_err();
    assert!(err(SarConfig { classes: 7, ..ok.clone() }).contains("classes = 7"));
    assert!(err(SarConfig { classes: 1, ..ok.clone() }).contains("classes = 1"));
    assert!(err(SarConfig { size: 4, ..ok.clone() }).contains("size = 4"));
    assert!(err(SarConfig { looks: 0, ..ok.clone() }).contains("looks = 0"));
    assert!(err(SarConfig { count: 0, ..ok.clone() }).contains("count"));
    assert!(err(SarConfig { scr_db: (9.0, 1.0), ..ok.clone() }).contains("scr_db"));
    assert!(err(SarConfig { scr_db: (f64::NAN, 1.0), ..ok.clone() }).contains("scr_db"));
    // Too large for the data limit: refused before anything is allocated.
    let e = err(SarConfig { size: 1 << 20, count: 1 << 20, ..ok });
    assert!(e.contains("data limit") && e.contains("synthetic.sar"), "{e}");
}

#[test]
fn every_vehicle_fits_the_chip_and_has_its_own_extent() {
    let mut extents = Vec::new();
    for (class, name) in SHAPES.iter().enumerate() {
        let v = vehicle(class);
        assert_eq!(v.name, *name);
        assert!(v.scatterers.len() >= 5, "{name}: {} scatterers", v.scatterers.len());
        for (i, a) in v.scatterers.iter().enumerate() {
            // Within the chip wherever the centre and aspect put it (offset up to 0.1 side per
            // axis, 5% scale): reach·1.05 + 0.1·√2 < 0.5.
            assert!(a.u.hypot(a.v) <= 0.34, "{name}: scatterer {a:?} too far out");
            assert!(a.amp > 0.0, "{name}: scatterer {a:?}");
            for b in &v.scatterers[i + 1..] {
                assert!((a.u - b.u).hypot(a.v - b.v) > 0.02, "{name}: scatterers {a:?} and {b:?} coincide");
            }
        }
        assert!(v.length / 2.0 <= 0.34 && v.width <= v.length && v.shadow > 0.0, "{name}: {v:?}");
        assert!(v.covers(0.0, 0.0) && !v.covers(v.length, 0.0), "{name}: footprint");
        extents.push((v.length, v.width, v.round));
    }
    // No two classes share a footprint: the extent tells vehicles apart as in real SAR.
    for (i, a) in extents.iter().enumerate() {
        for b in &extents[i + 1..] {
            assert_ne!(a, b, "two vehicles of the same footprint");
        }
    }
}

#[test]
fn the_dataset_feeds_a_model_by_dtype_whatever_the_names() {
    let inputs = vec![
        InputSpec {
            name: "sar".into(),
            ty: TensorType::new(
                DType::C64,
                Shape(vec![Dim::Batch, Dim::Fixed(1), Dim::Fixed(16), Dim::Fixed(16)]),
            ),
            classes: None,
            ignore_index: None,
        },
        InputSpec {
            name: "y".into(),
            ty: TensorType::new(DType::I32, Shape(vec![Dim::Batch])),
            classes: Some(3),
            ignore_index: None,
        },
    ];
    let d = Dataset::synthetic_sar(&cfg(3, 16, 9, 1), &inputs).unwrap();
    assert_eq!(d.len, 9);
    assert_eq!(d.array("sar").unwrap().shape, vec![9, 1, 16, 16]);
    assert!(d.array("y").is_some());
    // A model of 32×32 images does not take 16×16 ones.
    let e = Dataset::synthetic_sar(&cfg(3, 32, 9, 1), &inputs[..]).map(|_| ());
    assert!(e.is_err());
}

/// Multinomial logistic regression by full-batch gradient descent (f64, L2 penalty) on
/// standardised features; returns the accuracy on the validation rows.
fn logistic_accuracy(x: &[Vec<f64>], y: &[usize], classes: usize, train: &[usize], val: &[usize]) -> f64 {
    let d = x[0].len();
    let n = train.len() as f64;
    let mut mean = vec![0.0; d];
    let mut var = vec![0.0; d];
    for &i in train {
        for (m, v) in mean.iter_mut().zip(&x[i]) {
            *m += v / n;
        }
    }
    for &i in train {
        for ((s, v), m) in var.iter_mut().zip(&x[i]).zip(&mean) {
            *s += (v - m) * (v - m) / n;
        }
    }
    // Rows with a trailing 1 for the bias.
    let z: Vec<Vec<f64>> = x
        .iter()
        .map(|r| {
            let mut row: Vec<f64> =
                r.iter().zip(&mean).zip(&var).map(|((v, m), s)| (v - m) / (s.sqrt() + 1e-12)).collect();
            row.push(1.0);
            row
        })
        .collect();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f64>();
    let mut w = vec![vec![0.0; d + 1]; classes];
    let (lr, l2) = (0.5, 1e-3);
    // 40 steps: with more features than training rows the model fits the training set early;
    // more steps change the validation accuracy little and cost seconds in the dev profile.
    for _ in 0..40 {
        let mut g = vec![vec![0.0; d + 1]; classes];
        for &i in train {
            let s: Vec<f64> = w.iter().map(|wc| dot(wc, &z[i])).collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
            let tot: f64 = e.iter().sum();
            for (c, gc) in g.iter_mut().enumerate() {
                let r = (e[c] / tot - if y[i] == c { 1.0 } else { 0.0 }) / n;
                for (gj, zj) in gc.iter_mut().zip(&z[i]) {
                    *gj += r * zj;
                }
            }
        }
        for (wc, gc) in w.iter_mut().zip(&g) {
            for (j, (wj, gj)) in wc.iter_mut().zip(gc).enumerate() {
                *wj -= lr * (gj + if j < d { l2 * *wj } else { 0.0 });
            }
        }
    }
    let right = val
        .iter()
        .filter(|&&i| {
            let s: Vec<f64> = w.iter().map(|wc| dot(wc, &z[i])).collect();
            (0..classes).max_by(|&a, &b| s[a].total_cmp(&s[b])) == Some(y[i])
        })
        .count();
    right as f64 / val.len() as f64
}

/// Features of the vehicle's extent in one image's magnitudes, invariant to its position and
/// aspect: with the median intensity as the clutter level, the number of bright pixels (10 dB
/// above it) near their centroid, the spread of those along and across their main axis (the
/// vehicle's length and width), the peak, and the number of dark pixels (8 dB below) around
/// them (its shadow).
fn extent_features(mag: &[f64], size: usize) -> Vec<f64> {
    let int: Vec<f64> = mag.iter().map(|m| m * m).collect();
    let mut sorted = int.clone();
    sorted.sort_by(f64::total_cmp);
    let med = sorted[sorted.len() / 2].max(1e-30);
    let at = |k: usize| ((k % size) as f64, (k / size) as f64);
    let bright: Vec<(f64, f64, f64)> = (0..int.len())
        .filter(|&k| int[k] > 10.0 * med)
        .map(|k| {
            let (x, y) = at(k);
            (x, y, (int[k] / med).ln())
        })
        .collect();
    let centroid = |pts: &[(f64, f64, f64)]| {
        let w: f64 = pts.iter().map(|p| p.2).sum::<f64>().max(1e-9);
        (pts.iter().map(|p| p.0 * p.2).sum::<f64>() / w, pts.iter().map(|p| p.1 * p.2).sum::<f64>() / w)
    };
    // Two passes: clutter spikes far from the vehicle out of the second.
    let (cx, cy) = centroid(&bright);
    let r = 0.3 * size as f64;
    let near: Vec<(f64, f64, f64)> =
        bright.iter().copied().filter(|p| (p.0 - cx).hypot(p.1 - cy) <= r).collect();
    let (cx, cy) = centroid(&near);
    let w: f64 = near.iter().map(|p| p.2).sum::<f64>().max(1e-9);
    let (mut sxx, mut syy, mut sxy) = (0.0, 0.0, 0.0);
    for p in &near {
        let (dx, dy) = (p.0 - cx, p.1 - cy);
        sxx += p.2 * dx * dx / w;
        syy += p.2 * dy * dy / w;
        sxy += p.2 * dx * dy / w;
    }
    let (tr, det) = (sxx + syy, sxx * syy - sxy * sxy);
    let disc = (tr * tr / 4.0 - det).max(0.0).sqrt();
    let (l1, l2) = ((tr / 2.0 + disc).max(0.0).sqrt(), (tr / 2.0 - disc).max(0.0).sqrt());
    let dark = (0..int.len())
        .filter(|&k| {
            let (x, y) = at(k);
            int[k] < med / 6.3 && (x - cx).hypot(y - cy) <= r
        })
        .count();
    vec![
        (1.0 + near.len() as f64).ln(),
        l1,
        l2,
        l2 / (l1 + 1e-9),
        (sorted[sorted.len() - 1] / med).ln(),
        dark as f64,
    ]
}

/// The images' magnitudes and labels.
fn magnitudes(c: &SarConfig) -> (Vec<Vec<f64>>, Vec<usize>) {
    let d = generate(c).unwrap();
    let HostData::I32(labels) = &d.label.data else { panic!() };
    let px = c.size * c.size;
    let mags = d
        .image
        .f32s()
        .chunks(2 * px)
        .map(|img| img.chunks(2).map(|z| (z[0] as f64).hypot(z[1] as f64)).collect())
        .collect();
    (mags, labels.iter().map(|&l| l as usize).collect())
}

#[test]
fn linear_on_magnitudes_fails_where_extent_features_succeed() {
    let seed = seed_for("synthetic_sar::difficulty");
    // The default settings (10–20 dB, 4 looks) at 32×32.
    let (size, count, classes) = (32, 400, 4);
    let (mags, y) = magnitudes(&cfg(classes, size, count, seed));
    let s = split(count, 0.75, seed);
    let linear = logistic_accuracy(&mags, &y, classes, &s.train, &s.val);
    let extent: Vec<Vec<f64>> = mags.iter().map(|m| extent_features(m, size)).collect();
    let shaped = logistic_accuracy(&extent, &y, classes, &s.train, &s.val);
    eprintln!(
        "validation accuracy: linear on |x| {:.1}%, extent features {:.1}%",
        100.0 * linear,
        100.0 * shaped
    );
    // Chance is 25%; 100 validation images put one standard deviation of chance at ~4%. The
    // vehicles sit near the chip's centre, so bright pixels there say something about their
    // size even to a linear model (~70%), but it does not solve the task; six invariant
    // features of the extent do (~95%).
    assert!(linear < 0.8, "a linear model on |x| reaches {:.1}% validation accuracy", 100.0 * linear);
    assert!(shaped > 0.85, "extent features reach only {:.1}%", 100.0 * shaped);
    assert!(shaped > linear + 0.15, "extent features {shaped} vs linear {linear}");
}

/// examples/vit_sar.cvnn's layer kinds at a test size: conv patch embedding (patch 4 on
/// 24×24, 36 tokens), a learned position embedding, two pre-norm encoder layers (dim 16,
/// 2 heads, MLP 32), final norm, mean over tokens, complex linear head, magnitudes.
const VIT: &str = "model VitSarTest {
    input image: c64[B, 1, 24, 24]
    input label: class[B] of 4
    param pos: c64[1, 36, 16] = normal(std = 0.02)
    block encoder(dim, hidden, heads) {
        residual(rmsnorm(axes = 1) |> attention(heads = heads))
        residual(rmsnorm(axes = 1) |> linear(hidden) |> cgelu |> rmsnorm(axes = 1) |> linear(dim) |> cgelu)
    }
    tokens = image |> conv2d(16, kernel = 4, stride = 4) |> reshape(B, 16, 36) |> transpose(1, 2)
    x = tokens + pos |> repeat(2, encoder(16, 32, 2))
    logits = x |> rmsnorm(axes = 1) |> mean(axis = 1) |> linear(4) |> abs
    output logits
    loss cross_entropy(logits, label)
}
train VitSarTest {
    data      = synthetic.sar(count = 2000, size = 24, classes = 4, seed = SEED)
    split     = 0.8
    batch     = 32
    epochs    = 8
    optimizer = adam(lr = 3e-3)
    schedule  = cosine(min_lr = 1e-4)
    seed      = 1
}
";

/// Slow for CI (about a minute at opt-level 1 on two cores) and a weak bound: the tiny ViT
/// learns slowly (`linear_on_magnitudes_fails_where_extent_features_succeed` is the cheap
/// check that the labels are in the images). Run with `--ignored`.
#[test]
#[ignore = "about a minute of CPU training"]
fn a_small_complex_vit_learns_it() {
    let seed = seed_for("synthetic_sar::vit") % 1_000_000;
    let src = VIT.replace("SEED", &seed.to_string());
    let m = Model::from_source("vit_sar_test.cvnn", &src).unwrap();
    let d = Dataset::from_source(&m.config().data, m.dir(), m.inputs()).unwrap();
    let out = std::env::temp_dir().join(format!("cvc-sar-vit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let t = std::time::Instant::now();
    let run =
        train(&m, &d, &TrainOptions { device: Device::Cpu, ..TrainOptions::from_model(&m, out.clone()) })
            .unwrap();
    let _ = std::fs::remove_dir_all(&out);
    let acc: Vec<f64> = run.epochs.iter().map(|e| e.val_acc.unwrap_or(0.0)).collect();
    eprintln!("validation accuracy per epoch {acc:?} in {:.0} s", t.elapsed().as_secs_f64());
    // Chance is 25%; 400 validation images put one standard deviation of chance at ~2%.
    let best = acc.iter().cloned().fold(0.0, f64::max);
    assert!(best > 0.4, "the ViT reaches only {:.1}% validation accuracy: {acc:?}", 100.0 * best);
}
