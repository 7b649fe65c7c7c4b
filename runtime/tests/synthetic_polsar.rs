//! The synthetic PolSAR dataset: deterministic per (seed, scene), shaped as declared, labels
//! in range with unlabelled boundary and frame pixels, bad settings refused with the field
//! named, and its difficulty: one pixel's power does not tell the classes apart, while the
//! covariance estimated over a small window does (a nearest-covariance rule), so the labels
//! are in the local second-order statistics.

use cvc_compiler::ir::{DType, Dim, Shape, TensorType};
use cvc_runtime::backend::HostData;
use cvc_runtime::data::synthetic_polsar::{class_covariances, generate, PolsarConfig, CLASSES};
use cvc_runtime::data::{Dataset, InputSpec};

#[path = "../../tests/src/seed.rs"]
mod seed;
use seed::seed_for;

fn cfg(classes: usize, size: usize, count: usize, seed: u64) -> PolsarConfig {
    PolsarConfig { classes, size, regions: 6, gain_db: 3.0, contrast: 1.0, count, seed, ignore_index: -100 }
}

fn labels(d: &cvc_runtime::data::synthetic_polsar::PolsarData) -> &[i32] {
    let HostData::I32(l) = &d.label.data else { panic!("labels are i32") };
    l
}

#[test]
fn synthetic_polsar_is_deterministic_and_shaped_with_unlabelled_borders() {
    let seed = seed_for("synthetic_polsar::deterministic");
    let c = cfg(5, 24, 7, seed);
    let a = generate(&c).unwrap();
    assert_eq!(a, generate(&c).unwrap());
    assert_eq!((a.image.dtype, a.image.shape.clone()), (DType::C64, vec![7, 3, 24, 24]));
    assert_eq!((a.label.dtype, a.label.shape.clone()), (DType::I32, vec![7, 24, 24]));
    assert_ne!(a.image, generate(&PolsarConfig { seed: seed + 1, ..c.clone() }).unwrap().image);
    // Scene i depends on (seed, i) only: a longer dataset starts with the same scenes.
    let longer = generate(&PolsarConfig { count: 9, ..c.clone() }).unwrap();
    assert_eq!(&longer.image.f32s()[..a.image.f32s().len()], a.image.f32s());
    assert!(a.image.f32s().iter().all(|x| x.is_finite()));
    let l = labels(&a);
    assert!(l.iter().all(|&x| x == -100 || (0..5).contains(&x)), "labels outside 0..5 and -100");
    let s = 24;
    for (i, scene) in l.chunks(s * s).enumerate() {
        // The outer frame is unlabelled.
        for k in 0..s {
            for at in [k, (s - 1) * s + k, k * s, k * s + s - 1] {
                assert_eq!(scene[at], -100, "scene {i}: frame pixel {at} is labelled");
            }
        }
        // Two different labels never touch: a boundary band separates them.
        for y in 0..s {
            for x in 0..s - 1 {
                let (p, q) = (scene[y * s + x], scene[y * s + x + 1]);
                assert!(
                    p == q || p == -100 || q == -100,
                    "scene {i}: labels {p} and {q} touch at ({x}, {y})"
                );
            }
        }
    }
    let ignored = l.iter().filter(|&&x| x == -100).count();
    assert!(ignored > 4 * 7 * 23, "only {ignored} unlabelled pixels (the frames alone have {})", 4 * 7 * 23);
    assert!(ignored < l.len() / 2, "{ignored} of {} pixels unlabelled", l.len());
    // More than one class per scene on average, and every class somewhere.
    let mut seen = [false; 5];
    for &x in l.iter().filter(|&&x| x >= 0) {
        seen[x as usize] = true;
    }
    assert!(seen.iter().all(|&s| s), "{seen:?}");
    // The ignore label is the configured one.
    let other = generate(&PolsarConfig { ignore_index: 255, ..c }).unwrap();
    assert!(labels(&other).iter().all(|&x| x == 255 || (0..5).contains(&x)));
    assert_eq!(labels(&other).iter().filter(|&&x| x == 255).count(), ignored);
}

#[test]
fn synthetic_polsar_rejects_bad_settings() {
    let ok = cfg(4, 16, 2, 0);
    let err = |c: PolsarConfig| generate(&c).unwrap_err();
    assert!(err(PolsarConfig { classes: 6, ..ok.clone() }).contains("classes = 6"));
    assert!(err(PolsarConfig { classes: 1, ..ok.clone() }).contains("classes = 1"));
    assert!(err(PolsarConfig { size: 4, ..ok.clone() }).contains("size = 4"));
    assert!(err(PolsarConfig { regions: 0, ..ok.clone() }).contains("regions = 0"));
    assert!(err(PolsarConfig { gain_db: f64::NAN, ..ok.clone() }).contains("gain_db"));
    assert!(err(PolsarConfig { contrast: 0.0, ..ok.clone() }).contains("contrast"));
    assert!(err(PolsarConfig { count: 0, ..ok.clone() }).contains("count"));
    assert!(err(PolsarConfig { ignore_index: 2, ..ok.clone() }).contains("ignore label 2"));
    let e = err(PolsarConfig { size: 1 << 20, count: 1 << 20, ..ok });
    assert!(e.contains("data limit") && e.contains("synthetic.polsar"), "{e}");
}

/// The sample covariance of the labelled pixels of each class, divided by its trace, is the
/// class's covariance (the per-region gains scale whole regions, not their structure).
#[test]
fn pixels_follow_their_class_covariance() {
    let c = PolsarConfig { regions: 4, ..cfg(5, 32, 40, seed_for("synthetic_polsar::covariance")) };
    let d = generate(&c).unwrap();
    let (v, l) = (d.image.f32s(), labels(&d));
    let n = 32 * 32;
    let mut sums = vec![[[(0.0f64, 0.0f64); 3]; 3]; 5];
    for (p, &lab) in l.iter().enumerate() {
        if lab < 0 {
            continue;
        }
        let (scene, pix) = (p / n, p % n);
        let k: Vec<(f64, f64)> = (0..3)
            .map(|ch| {
                let at = 2 * ((scene * 3 + ch) * n + pix);
                (v[at] as f64, v[at + 1] as f64)
            })
            .collect();
        for i in 0..3 {
            for j in 0..3 {
                // k_i · conj(k_j)
                let e = &mut sums[lab as usize][i][j];
                e.0 += k[i].0 * k[j].0 + k[i].1 * k[j].1;
                e.1 += k[i].1 * k[j].0 - k[i].0 * k[j].1;
            }
        }
    }
    let want = class_covariances(5, 1.0);
    for (class, (s, w)) in sums.iter().zip(&want).enumerate() {
        let tr = s[0][0].0 + s[1][1].0 + s[2][2].0;
        assert!(tr > 0.0, "class {} has no pixels", CLASSES[class]);
        for i in 0..3 {
            for j in 0..3 {
                let (re, im) = (s[i][j].0 / tr, s[i][j].1 / tr);
                assert!(
                    (re - w[i][j].0).abs() < 0.03 && (im - w[i][j].1).abs() < 0.03,
                    "{}: C[{i}][{j}] = {re:.3}{im:+.3}i, want {:.3}{:+.3}i",
                    CLASSES[class],
                    w[i][j].0,
                    w[i][j].1
                );
            }
        }
    }
}

/// One pixel's power is a poor guide (nearest class by log-span: well below the window rule),
/// the trace-normalised 5×5-window covariance nearest to a class's is a good one.
#[test]
fn local_covariance_separates_the_classes_and_one_pixel_does_not() {
    let c = cfg(5, 32, 24, seed_for("synthetic_polsar::difficulty"));
    let d = generate(&c).unwrap();
    let (v, l) = (d.image.f32s(), labels(&d));
    let (s, n) = (32usize, 32 * 32);
    let want = class_covariances(5, 1.0);
    let k = |scene: usize, ch: usize, y: usize, x: usize| {
        let at = 2 * ((scene * 3 + ch) * n + y * s + x);
        (v[at] as f64, v[at + 1] as f64)
    };
    let (mut window_ok, mut span_ok, mut total) = (0usize, 0usize, 0usize);
    // The single-pixel rule: log-span nearest to each class's mean log-span (from the data).
    let span = |scene: usize, y: usize, x: usize| {
        (0..3).map(|ch| k(scene, ch, y, x)).map(|z| z.0 * z.0 + z.1 * z.1).sum::<f64>().max(1e-30).ln()
    };
    let mut mean_span = [(0.0, 0usize); 5];
    for (p, &lab) in l.iter().enumerate().filter(|(_, &x)| x >= 0) {
        let (sc, y, x) = (p / n, (p % n) / s, p % s);
        mean_span[lab as usize].0 += span(sc, y, x);
        mean_span[lab as usize].1 += 1;
    }
    for (p, &lab) in l.iter().enumerate() {
        let (sc, y, x) = (p / n, (p % n) / s, p % s);
        if lab < 0 || y < 2 || x < 2 || y + 2 >= s || x + 2 >= s {
            continue;
        }
        let mut t = [[(0.0f64, 0.0f64); 3]; 3];
        for yy in y - 2..=y + 2 {
            for xx in x - 2..=x + 2 {
                let z: Vec<_> = (0..3).map(|ch| k(sc, ch, yy, xx)).collect();
                for i in 0..3 {
                    for j in 0..3 {
                        t[i][j].0 += z[i].0 * z[j].0 + z[i].1 * z[j].1;
                        t[i][j].1 += z[i].1 * z[j].0 - z[i].0 * z[j].1;
                    }
                }
            }
        }
        let tr = t[0][0].0 + t[1][1].0 + t[2][2].0;
        let dist = |w: &[[(f64, f64); 3]; 3]| {
            (0..9)
                .map(|e| {
                    (t[e / 3][e % 3].0 / tr - w[e / 3][e % 3].0).powi(2)
                        + (t[e / 3][e % 3].1 / tr - w[e / 3][e % 3].1).powi(2)
                })
                .sum::<f64>()
        };
        let best = (0..5).min_by(|&a, &b| dist(&want[a]).total_cmp(&dist(&want[b]))).unwrap();
        window_ok += (best == lab as usize) as usize;
        let sp = span(sc, y, x);
        let by_span = (0..5)
            .min_by(|&a, &b| {
                let m = |c: usize| mean_span[c].0 / mean_span[c].1.max(1) as f64;
                (sp - m(a)).abs().total_cmp(&(sp - m(b)).abs())
            })
            .unwrap();
        span_ok += (by_span == lab as usize) as usize;
        total += 1;
    }
    let (window, one) = (window_ok as f64 / total as f64, span_ok as f64 / total as f64);
    println!("5×5 window covariance: {window:.3}, one pixel's span: {one:.3} ({total} pixels)");
    assert!(window > 0.8, "the window covariance rule reaches only {window:.3}");
    assert!(one < 0.35, "one pixel's power already separates the classes ({one:.3})");
}

#[test]
fn the_dataset_feeds_a_model_by_dtype_with_the_losses_ignore_index() {
    let spec = |ignore: Option<i64>| {
        vec![
            InputSpec {
                name: "scene".into(),
                ty: TensorType::new(
                    DType::C64,
                    Shape(vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(16), Dim::Fixed(16)]),
                ),
                classes: None,
                ignore_index: None,
            },
            InputSpec {
                name: "y".into(),
                ty: TensorType::new(DType::I32, Shape(vec![Dim::Batch, Dim::Fixed(16), Dim::Fixed(16)])),
                classes: Some(3),
                ignore_index: ignore,
            },
        ]
    };
    let d = Dataset::synthetic_polsar(&cfg(3, 16, 5, 1), &spec(Some(255))).unwrap();
    assert_eq!(d.len, 5);
    assert_eq!(d.array("scene").unwrap().shape, vec![5, 3, 16, 16]);
    let HostData::I32(y) = &d.array("y").unwrap().data else { panic!("i32 labels") };
    assert!(y.contains(&255) && !y.contains(&-100), "unlabelled pixels carry the loss's ignore_index");
    // Labels nobody reads with an ignore_index cannot hold unlabelled pixels.
    let e = Dataset::synthetic_polsar(&cfg(3, 16, 5, 1), &spec(None)).unwrap_err();
    assert!(e.contains("ignore_index") && e.contains("'y'"), "{e}");
    // A model of 32×32 scenes does not take 16×16 ones.
    assert!(Dataset::synthetic_polsar(&cfg(3, 32, 5, 1), &spec(Some(-100))).is_err());
}
