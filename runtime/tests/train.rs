//! The training runtime end to end on small models: sessions against the reference
//! interpreter, seeded determinism, exact resume, weights round trips, the lr state, and
//! error messages for bad weights.

use cvc_compiler::interp::{self, Tensor};
use cvc_runtime::backend::{HostData, HostTensor};
use cvc_runtime::data::Dataset;
use cvc_runtime::interp_backend::to_interp;
use cvc_runtime::session::{Device, Model, SessionOptions, StagedBatch};
use cvc_runtime::train::{train, TrainOptions};
use std::collections::HashMap;
use std::path::PathBuf;

const TINY: &str = "model Tiny {
    input x: c64[B, 1, 16]
    input label: class[B] of 3
    logits = x |> conv1d(4, kernel = 3, pad = 1) |> batchnorm(kind = naive) |> modrelu
               |> global_avgpool |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}
train Tiny {
    data      = synthetic.random(count = 80, seed = 5)
    split     = 0.8
    batch     = 8
    epochs    = 2
    optimizer = adam(lr = 1e-2)
    schedule  = cosine(min_lr = 1e-3)
    seed      = 11
}
";

/// The devices every test runs on: the reference-interpreter back end and the CPU back end.
const DEVICES: [Device; 2] = [Device::Interp, Device::Cpu];

fn model() -> Model {
    Model::from_source("tiny.cvnn", TINY).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cvc-train-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn opts(m: &Model, device: Device, out: PathBuf) -> TrainOptions {
    TrainOptions { device, ..TrainOptions::from_model(m, out) }
}

fn data(m: &Model) -> Dataset {
    Dataset::from_source(&m.config().data, m.dir(), m.inputs()).unwrap()
}

fn max_rel(a: &HostTensor, b: &HostTensor) -> f64 {
    let (HostData::F32(x), HostData::F32(y)) = (&a.data, &b.data) else { panic!("f32 tensors") };
    let scale = x.iter().map(|v| v.abs()).fold(1e-6f32, f32::max) as f64;
    x.iter().zip(y).map(|(p, q)| (p - q).abs() as f64 / scale).fold(0.0, f64::max)
}

#[test]
fn session_steps_match_the_reference_interpreter() {
    let m = model();
    let d = data(&m);
    for device in DEVICES {
        let sopts = SessionOptions { device, ..SessionOptions::from_config(m.config()) };
        let mut s = m.session_with(&sopts).unwrap();
        let g = s.program().graph.clone();
        let mut reference = interp::Session::new(&g, s.batch(), sopts.seed);
        for step in 0..3 {
            let idx: Vec<usize> = (step * 8..step * 8 + 8).collect();
            let inputs = d.gather(&idx);
            let got = s.train_step(&inputs).unwrap();
            let ins: HashMap<String, Tensor> =
                inputs.iter().map(|(n, t)| (n.clone(), to_interp(t))).collect();
            let want = reference.step(&g, &ins).unwrap().loss.unwrap();
            let rel = (got.loss as f64 - want).abs() / want.abs().max(1e-6);
            assert!(rel < 1e-4, "{device:?} step {step}: loss {} vs reference {want}", got.loss);
        }
    }
}

#[test]
fn same_seed_same_losses_and_resume_is_exact() {
    let m = model();
    let d = data(&m);
    for device in DEVICES {
        let dir = tmp(&format!("resume-{device:?}"));
        let full = train(&m, &d, &opts(&m, device, dir.join("full"))).unwrap();
        assert_eq!(full.epochs.len(), 2);
        let again = train(&m, &d, &opts(&m, device, dir.join("again"))).unwrap();
        let first =
            train(&m, &d, &TrainOptions { epochs: 1, ..opts(&m, device, dir.join("split")) }).unwrap();
        let rest =
            train(&m, &d, &TrainOptions { resume: true, ..opts(&m, device, dir.join("split")) }).unwrap();
        assert_eq!((first.epochs.len(), rest.epochs.len()), (1, 1));
        let pick =
            |e: &cvc_runtime::metrics::EpochMetrics| (e.epoch, e.train_loss, e.val_loss, e.val_acc, e.lr);
        let a: Vec<_> = full.epochs.iter().map(pick).collect();
        let b: Vec<_> = again.epochs.iter().map(pick).collect();
        let c: Vec<_> = first.epochs.iter().chain(&rest.epochs).map(pick).collect();
        assert_eq!(a, b, "{device:?}: same seed, same losses");
        assert_eq!(a, c, "{device:?}: 1 epoch + resume 1 equals 2 epochs");
        // The cosine schedule: base lr in epoch 1, halfway to min_lr in epoch 2.
        assert!((a[0].4 - 1e-2).abs() < 1e-15);
        assert!((a[1].4 - (1e-3 + 0.5 * (1e-2 - 1e-3))).abs() < 1e-12);
        let lines = std::fs::read_to_string(dir.join("split/metrics.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 2);
        let other = train(&m, &d, &TrainOptions { seed: 12, ..opts(&m, device, dir.join("other")) }).unwrap();
        assert_ne!(other.epochs[0].train_loss, full.epochs[0].train_loss);
    }
}

#[test]
fn weights_round_trip_and_inference_uses_them() {
    let m = model();
    let d = data(&m);
    for device in DEVICES {
        let dir = tmp(&format!("weights-{device:?}"));
        let sopts = SessionOptions { device, ..SessionOptions::from_config(m.config()) };
        let mut a = m.session_with(&sopts).unwrap();
        let idx: Vec<usize> = (0..8).collect();
        a.train_step(&d.gather(&idx)).unwrap();
        a.train_step(&d.gather(&idx)).unwrap();
        let path = dir.join("w.safetensors");
        a.save_weights(&path).unwrap();
        let eval_idx: Vec<usize> = (0..5).collect();
        let want = a.infer(&d.gather(&eval_idx)).unwrap();
        let mut b = m.session_with(&SessionOptions { seed: 99, ..sopts.clone() }).unwrap();
        let fresh = b.infer(&d.gather(&eval_idx)).unwrap();
        assert!(
            max_rel(&fresh[0].1, &want[0].1) > 1e-3,
            "{device:?}: a different seed gives different outputs"
        );
        b.load_weights(&path).unwrap();
        let got = b.infer(&d.gather(&eval_idx)).unwrap();
        assert_eq!(got[0].1.shape, vec![5, 3]);
        assert!(max_rel(&got[0].1, &want[0].1) < 1e-6, "{device:?}: loaded weights reproduce the outputs");
        // Parameters and optimizer state are all in the file, with the same values.
        let sa = a.state_tensors().unwrap();
        let sb = b.state_tensors().unwrap();
        assert_eq!(sa, sb);
    }
}

#[test]
fn zero_learning_rate_freezes_parameters() {
    let m = model();
    let d = data(&m);
    let sopts = SessionOptions { device: Device::Cpu, ..SessionOptions::from_config(m.config()) };
    let mut s = m.session_with(&sopts).unwrap();
    let params = |s: &mut cvc_runtime::session::Session| -> Vec<(String, HostTensor)> {
        let names: Vec<String> =
            s.program().graph.params().map(|v| s.program().graph.leaf_name(v).unwrap().to_string()).collect();
        s.state_tensors().unwrap().into_iter().filter(|(n, _)| names.contains(n)).collect()
    };
    let before = params(&mut s);
    s.set_lr(0.0).unwrap();
    s.train_step(&d.gather(&(0..8).collect::<Vec<_>>())).unwrap();
    assert_eq!(params(&mut s), before);
    s.set_lr(1e-2).unwrap();
    s.train_step(&d.gather(&(0..8).collect::<Vec<_>>())).unwrap();
    assert_ne!(params(&mut s), before);
}

#[test]
fn bad_weights_name_the_file_and_the_tensor() {
    let m = model();
    let dir = tmp("badweights");
    let sopts = SessionOptions { device: Device::Interp, ..SessionOptions::from_config(m.config()) };
    let mut s = m.session_with(&sopts).unwrap();
    let path = dir.join("w.safetensors");
    s.save_weights(&path).unwrap();
    // Drop one parameter and reshape another.
    let mut tensors: Vec<(String, HostTensor)> = s.state_tensors().unwrap();
    let first = s
        .program()
        .graph
        .params()
        .next()
        .map(|v| s.program().graph.leaf_name(v).unwrap().to_string())
        .unwrap();
    tensors.retain(|(n, _)| n != &first);
    let partial = dir.join("partial.safetensors");
    cvc_runtime::checkpoint::save(&partial, &tensors, &Default::default()).unwrap();
    let e = s.load_weights(&partial).unwrap_err().0;
    assert!(e.contains("partial.safetensors") && e.contains(&first), "{e}");
    let mut tensors = s.state_tensors().unwrap();
    let t = tensors.iter_mut().find(|(n, _)| n == &first).unwrap();
    t.1 = HostTensor::zeros(t.1.dtype, &[1, 2, 3]);
    let shaped = dir.join("shaped.safetensors");
    cvc_runtime::checkpoint::save(&shaped, &tensors, &Default::default()).unwrap();
    let e = s.load_weights(&shaped).unwrap_err().0;
    assert!(e.contains("shaped.safetensors") && e.contains(&first) && e.contains("[1, 2, 3]"), "{e}");
    let e = s.load_weights(dir.join("absent.safetensors")).unwrap_err().0;
    assert!(e.contains("absent.safetensors"), "{e}");
}

#[test]
fn inputs_are_checked_before_a_step() {
    let m = model();
    let mut s = m
        .session_with(&SessionOptions { device: Device::Interp, ..SessionOptions::from_config(m.config()) })
        .unwrap();
    let d = data(&m);
    let mut inputs = d.gather(&(0..8).collect::<Vec<_>>());
    inputs.pop();
    let e = s.train_step(&inputs).unwrap_err().0;
    assert!(e.contains("label"), "{e}");
    let wrong = d.gather(&(0..4).collect::<Vec<_>>());
    let e = s.train_step(&wrong).unwrap_err().0;
    assert!(e.contains("input 'x'") && e.contains("[4, 1, 16]"), "{e}");
}

#[test]
fn gradients_match_the_reference_interpreter() {
    let m = model();
    let d = data(&m);
    let sopts = SessionOptions { device: Device::Cpu, ..SessionOptions::from_config(m.config()) };
    let mut s = m.session_with(&sopts).unwrap();
    let g = s.program().graph.clone();
    let grads = s.program().facts.grads.clone();
    let mut reference = interp::Session::new(&g, s.batch(), sopts.seed);
    let inputs = d.gather(&(8..16).collect::<Vec<_>>());
    s.train_step(&inputs).unwrap();
    let ins: HashMap<String, Tensor> = inputs.iter().map(|(n, t)| (n.clone(), to_interp(t))).collect();
    let want = reference.step(&g, &ins).unwrap();
    let got = s.gradients().unwrap();
    assert_eq!(got.len(), grads.len());
    let refs: Vec<HostTensor> = grads
        .iter()
        .map(|(_, dp)| cvc_runtime::interp_backend::from_interp(want.values[dp.index()].as_ref().unwrap()))
        .collect();
    let amax = |t: &HostTensor| t.f32s().iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    let global = refs.iter().map(amax).fold(0.0, f64::max);
    for (((name, t), (p, _)), r) in got.iter().zip(&grads).zip(&refs) {
        assert_eq!(g.leaf_name(*p), Some(name.as_str()));
        // Relative to the tensor's largest element; gradients that vanish analytically (a
        // bias before batchnorm: a sum of terms that cancel in f32) are compared against 1%
        // of the largest gradient instead.
        let scale = amax(r).max(1e-2 * global);
        let err = t.f32s().iter().zip(r.f32s()).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
        assert!(err <= 1e-4 * scale, "gradient of {name}: max error {err:e}, scale {scale:e}");
    }
}

#[test]
fn inference_only_models_load_weights_and_infer() {
    let src = "model M {\n    input x: c64[B, 8]\n    y = x |> linear(4) |> crelu\n    output y\n}\n";
    let m = Model::from_source("m.cvnn", src).unwrap();
    let sopts = SessionOptions { device: Device::Cpu, batch: 3, ..SessionOptions::from_config(m.config()) };
    let mut s = m.session_with(&sopts).unwrap();
    let d = Dataset::synthetic_random(3, 4, m.eval_inputs()).unwrap();
    let inputs = d.gather(&[0, 1, 2]);
    let e = s.train_step(&inputs).unwrap_err().0;
    assert!(e.contains("no loss"), "{e}");
    let y = s.infer(&inputs).unwrap();
    assert_eq!((y[0].0.as_str(), y[0].1.shape.clone()), ("y", vec![3, 4]));
    let dir = tmp("noloss");
    s.save_weights(dir.join("w.safetensors")).unwrap();
    let mut t = m.session_with(&SessionOptions { seed: 5, ..sopts }).unwrap();
    t.load_weights(dir.join("w.safetensors")).unwrap();
    assert_eq!(t.infer(&inputs).unwrap(), y);
}

/// Steps that prepare the next batch while the device runs (`train_step_overlapped`, batches
/// passed back as returned, one of them replaced by an unstaged copy) give bit-identical
/// losses, outputs and weights to plain steps.
#[test]
fn overlapped_steps_equal_plain_steps() {
    let m = model();
    let d = data(&m);
    for device in DEVICES {
        let sopts = SessionOptions { device, ..SessionOptions::from_config(m.config()) };
        let batches: Vec<Vec<usize>> = (0..4).map(|i| (i * 8..i * 8 + 8).collect()).collect();
        let mut plain = m.session_with(&sopts).unwrap();
        let want: Vec<_> = batches
            .iter()
            .map(|b| {
                let r = plain.train_step(&d.gather(b)).unwrap();
                (r.loss, r.outputs)
            })
            .collect();
        let mut overlapped = m.session_with(&sopts).unwrap();
        let mut got = Vec::new();
        let mut pending = Some(StagedBatch::new(d.gather(&batches[0])));
        for i in 0..batches.len() {
            let mut inputs = pending.take().unwrap();
            if i == 2 {
                // A fresh batch with the same tensors: uploaded directly, same result.
                inputs = StagedBatch::new(inputs.batch().to_vec());
            }
            let (r, next) = overlapped
                .train_step_overlapped(&inputs, || batches.get(i + 1).map(|b| d.gather(b)))
                .unwrap();
            assert_eq!(next.is_some(), i + 1 < batches.len());
            pending = next;
            got.push((r.loss, r.outputs));
        }
        assert_eq!(got, want, "{device:?}");
        assert_eq!(overlapped.state_tensors().unwrap(), plain.state_tensors().unwrap(), "{device:?}");
    }
}
