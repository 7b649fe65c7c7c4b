//! The segmentation operators (per-pixel `cross_entropy`, `dice`, `upsample1d/2d`, strided
//! and padded pooling, `adaptive_avgpool`, `conv_transpose1d`, `groupnorm`, `instancenorm`)
//! against PyTorch: each case of `tests/reference/segmentation/cases.json` (written by
//! `make.py` next to it) is lowered by the layer library, evaluated by the f64 interpreter and
//! compared with PyTorch's output and gradients; the same gradients are also checked against
//! central finite differences (`cvc_tests::torch_cases`).

use cvc_compiler::interp::SplitMix64;
use cvc_compiler::ir::*;
use cvc_tests::torch_cases;

#[path = "../src/seed.rs"]
mod seed;

/// Every reference case, forward and backward, against PyTorch and finite differences.
#[test]
fn operators_match_pytorch() {
    let cases = torch_cases::cases("segmentation");
    assert!(cases.len() >= 20, "cases.json holds {} cases", cases.len());
    let failed = torch_cases::failures("segmentation", &cases);
    assert!(failed.is_empty(), "{} of {} cases differ:\n{}", failed.len(), cases.len(), failed.join("\n"));
}

/// Batchnorm in training over one value per channel (batch 1 of `[B, C]`) is a plan-time
/// error naming the layer, as PyTorch's "Expected more than 1 value per channel"; batch 2,
/// or the same layer in inference, compiles.
#[test]
fn batchnorm_with_one_value_per_channel_is_a_plan_error() {
    use cvc_compiler::passes::pipeline::{compile, Options};
    let src = "model M {\n    input x: c64[B, 3, 1, 1]\n    input label: class[B] of 2\n    \
               h = x |> batchnorm |> flatten |> linear(2) |> abs\n    output h\n    loss cross_entropy(h, label)\n}\n";
    let graph = |mode| cvc_compiler::front::check_source("bn.cvnn", src, mode).expect("checks").graph;
    let opts = |batch| Options { batch, ..Options::default() };
    let Err(err) = compile(graph(Mode::Train), &opts(1)) else { panic!("batch 1 is rejected") };
    let err = err.to_string();
    assert!(err.contains("h/batchnorm"), "{err}");
    assert!(err.contains("more than one value per channel"), "{err}");
    assert!(err.contains("[B, 3, 1, 1]"), "{err}");
    compile(graph(Mode::Train), &opts(2)).expect("batch 2 compiles");
    compile(graph(Mode::Eval), &opts(1)).expect("inference uses the running statistics");
}

/// The data loader admits the ignore index of the loss besides `0..classes`, and nothing else.
#[test]
fn labels_admit_the_ignore_index_only() {
    let src = "model M {\n    input x: c64[B, 2, 3]\n    input label: class[B, 3] of 2\n    \
               logits = x |> conv1d(2, kernel = 1) |> abs\n    output logits\n    \
               loss cross_entropy(logits, label, ignore_index = 7)\n}\n";
    let model = cvc_runtime::session::Model::from_source("seg.cvnn", src).expect("compiles");
    let label = model.inputs().iter().find(|i| i.name == "label").expect("label input");
    assert_eq!(label.ignore_index, Some(7));
    let make = |labels: Vec<i32>| {
        use cvc_runtime::backend::{HostData, HostTensor};
        use cvc_runtime::data::npy::NpyArray;
        let x = HostTensor { dtype: DType::C64, shape: vec![2, 2, 3], data: HostData::F32(vec![0.5; 24]) };
        let y = HostTensor { dtype: DType::I32, shape: vec![2, 3], data: HostData::I32(labels) };
        let arrays = vec![
            ("x".to_string(), NpyArray { numpy_dtype: "complex64".into(), tensor: x }),
            ("label".to_string(), NpyArray { numpy_dtype: "int64".into(), tensor: y }),
        ];
        cvc_runtime::data::Dataset::from_arrays(arrays, model.inputs(), "t.npz")
    };
    make(vec![0, 1, 7, 7, 0, 1]).expect("0, 1 and the ignore index load");
    let Err(e) = make(vec![0, 1, 2, 7, 0, 1]) else { panic!("label 2 is rejected") };
    assert!(e.contains("label 2") && e.contains("ignore_index 7"), "{e}");
}

/// Pixel accuracy and mean IoU of [`Confusion::add_pixels`] against a direct count over
/// random per-pixel logits `[n, C, P]`, with an in-range ignore index.
#[test]
fn pixel_accuracy_and_mean_iou_match_a_direct_count() {
    use cvc_runtime::metrics::Confusion;
    let (n, c, p, ignore) = (3usize, 4usize, 10usize, 2i32);
    let mut rng = SplitMix64::new(seed::seed_for("segmentation::metrics"));
    let logits: Vec<f32> = (0..n * c * p).map(|_| rng.normal() as f32).collect();
    let labels: Vec<i32> = (0..n * p).map(|_| (rng.next_u64() % c as u64) as i32).collect();
    let mut cm = Confusion::ignoring(c, Some(ignore as i64));
    cm.add_pixels(&logits[..c * p], &labels[..p], p);
    cm.add_pixels(&logits[c * p..], &labels[p..], p);
    // Direct: argmax per pixel, then per-class intersection and union.
    let (mut correct, mut total) = (0usize, 0usize);
    let (mut inter, mut union) = (vec![0usize; c], vec![0usize; c]);
    for s in 0..n {
        for q in 0..p {
            let y = labels[s * p + q];
            if y == ignore {
                continue;
            }
            let score = |k: usize| logits[s * c * p + k * p + q];
            let pred = (0..c).fold(0, |b, k| if score(k) > score(b) { k } else { b });
            total += 1;
            if pred == y as usize {
                correct += 1;
                inter[pred] += 1;
                union[pred] += 1;
            } else {
                union[pred] += 1;
                union[y as usize] += 1;
            }
        }
    }
    let ious: Vec<f64> = (0..c)
        .filter(|&k| k != ignore as usize && union[k] > 0)
        .map(|k| inter[k] as f64 / union[k] as f64)
        .collect();
    assert_eq!(cm.total(), total as u64);
    assert!((cm.accuracy() - correct as f64 / total as f64).abs() < 1e-12);
    let miou = ious.iter().sum::<f64>() / ious.len() as f64;
    assert!((cm.mean_iou() - miou).abs() < 1e-12, "{} vs {miou}", cm.mean_iou());
}

/// Every (true, predicted) count of [`Confusion::add`] and [`Confusion::add_pixels`] against
/// a direct count, on logits with many ties (first class wins) and labels outside the classes,
/// for a few classes (counted per batch in a dense table) and for 300 (counted as sorted
/// pairs), and for a batch large enough to be counted on several threads.
#[test]
fn confusion_counts_match_a_direct_count_with_ties() {
    use cvc_runtime::metrics::Confusion;
    // (The last case's 10 MB of logits are counted on two or more threads.)
    for (c, p, n) in [(5usize, 7usize, 40usize), (300, 3, 40), (5, 4096, 128)] {
        let mut rng = SplitMix64::new(seed::seed_for(&format!("segmentation::confusion{c}")));
        // Scores from {0, 1, 2}: most pixels tie between several classes.
        let logits: Vec<f32> = (0..n * c * p).map(|_| (rng.next_u64() % 3) as f32).collect();
        let labels: Vec<i32> = (0..n * p).map(|_| (rng.next_u64() % (c as u64 + 2)) as i32 - 1).collect();
        let mut direct = std::collections::BTreeMap::new();
        for s in 0..n {
            for q in 0..p {
                let y = labels[s * p + q];
                if y < 0 || y as usize >= c {
                    continue;
                }
                let score = |k: usize| logits[s * c * p + k * p + q];
                let pred = (0..c).fold(0, |b, k| if score(k) > score(b) { k } else { b });
                *direct.entry((y as u32, pred as u32)).or_insert(0u64) += 1;
            }
        }
        let mut cm = Confusion::new(c);
        cm.add_pixels(&logits[..n / 2 * c * p], &labels[..n / 2 * p], p);
        cm.add_pixels(&logits[n / 2 * c * p..], &labels[n / 2 * p..], p);
        assert_eq!(cm.counts, direct, "{c} classes, per pixel");
        // One pixel per sample: the classifier's `add` on the same scores as `[n·p, c]` rows.
        let rows: Vec<f32> = (0..n * p)
            .flat_map(|r| (0..c).map(move |k| (r / p, k, r % p)))
            .map(|(s, k, q)| logits[s * c * p + k * p + q])
            .collect();
        let mut flat = Confusion::new(c);
        flat.add(&rows, &labels);
        assert_eq!(flat.counts, direct, "{c} classes, per sample");
        assert_eq!(flat.total(), direct.values().sum::<u64>());
    }
}
