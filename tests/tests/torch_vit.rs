//! PyTorch parity of a complex vision transformer: the PyTorch model of
//! `tests/reference/vit/make.py` (torchcvnn 0.10's MultiheadAttention without q/k norms,
//! complextorch 2.1.1's RMSNorm, CGELU, torch.nn's complex Linear and Conv2d) saved its
//! state dict under cvc's names, one batch, its logits, loss and every parameter gradient.
//! The weights load into `tests/fixtures/ok/vit_tiny.cvnn` as they are (PyTorch layouts, no
//! renaming) and one training step on the interpreter and on the CPU back end must give the
//! same logits, loss and gradients (before the step's update).
//!
//! Tolerances, relative to the largest magnitude of each reference tensor: the interpreter
//! computes in f64 on the f32 weights, as make.py does, so only the f32 storage of the results
//! (~6e-8) and summation order differ: 2e-5. The CPU back end computes in f32 through two
//! layers of attention, softmax and norms: 2e-4 for logits and loss, 1e-3 for gradients.

use cvc_runtime::backend::{HostData, HostTensor};
use cvc_runtime::checkpoint;
use cvc_runtime::data::Dataset;
use cvc_runtime::session::{Device, Model, SessionOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const FIXTURE: &str = "tests/fixtures/ok/vit_tiny.cvnn";
const REFERENCE: &str = "tests/reference/vit";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The values of a tensor as f64 (complex interleaved re, im).
fn values(t: &HostTensor) -> Vec<f64> {
    match &t.data {
        HostData::F32(v) => v.iter().map(|&x| x as f64).collect(),
        HostData::I32(v) => v.iter().map(|&x| x as f64).collect(),
    }
}

/// max |got − want| / max |want|.
fn rel_err(got: &HostTensor, want: &HostTensor) -> f64 {
    let (g, w) = (values(got), values(want));
    assert_eq!(g.len(), w.len(), "element counts differ");
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    g.iter().zip(&w).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// Tolerances of one back end.
struct Tol {
    outputs: f64,
    grads: f64,
}

fn compare_on(device: Device, tol: Tol) {
    let root = root();
    let reference = root.join(REFERENCE);
    let expected_path = reference.join("expected.safetensors");
    let expected = checkpoint::load(&expected_path).expect("expected values (run make.py)").tensors;
    let model = Model::from_file(root.join(FIXTURE)).expect("vit_tiny checks");
    let data = Dataset::load_npz(&reference.join("data.npz"), model.inputs()).expect("reference batch");
    let opts = SessionOptions { device, batch: data.len, ..SessionOptions::from_config(model.config()) };
    let mut session = model.session_with(&opts).expect("session");
    session.load_weights(reference.join("weights.safetensors")).expect("PyTorch weights load unchanged");

    let all: Vec<usize> = (0..data.len).collect();
    let report = session.train_step(&data.gather(&all)).expect("training step");
    let grads: BTreeMap<String, HostTensor> = session.gradients().expect("gradients").into_iter().collect();

    let want_loss = values(&expected["loss"])[0];
    let loss_err = (report.loss as f64 - want_loss).abs() / want_loss.abs();
    assert!(
        loss_err <= tol.outputs,
        "{device:?}: loss {} vs PyTorch {want_loss} (rel {loss_err:.2e})",
        report.loss
    );

    let logits = report.outputs.iter().find(|(n, _)| n == "logits").map(|(_, t)| t).expect("logits output");
    assert_eq!(logits.shape, expected["logits"].shape, "{device:?}: logits shape");
    let e = rel_err(logits, &expected["logits"]);
    assert!(
        e <= tol.outputs,
        "{device:?}: logits differ from PyTorch by {e:.2e} (tolerance {:.0e})",
        tol.outputs
    );

    // One gradient per PyTorch parameter, same names, shapes and dtypes, and no other.
    let want_names: Vec<&str> = expected.keys().filter_map(|k| k.strip_prefix("grad.")).collect();
    let got_names: Vec<&str> = grads.keys().map(|s| s.as_str()).collect();
    assert_eq!(got_names, want_names, "{device:?}: parameter names differ from the PyTorch state dict");
    let mut worst = (0.0f64, String::new());
    let mut failures = Vec::new();
    for (name, got) in &grads {
        let want = &expected[&format!("grad.{name}")];
        assert_eq!((got.dtype, &got.shape), (want.dtype, &want.shape), "{device:?}: gradient of {name}");
        assert!(values(want).iter().any(|&x| x != 0.0), "reference gradient of {name} is all zeros");
        let e = rel_err(got, want);
        if e > worst.0 {
            worst = (e, name.clone());
        }
        if e > tol.grads {
            failures.push(format!("{name}: {e:.2e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{device:?}: gradients differ from PyTorch beyond {:.0e}:\n{}",
        tol.grads,
        failures.join("\n")
    );
    eprintln!(
        "{device:?}: loss rel {loss_err:.2e}, logits rel {e:.2e}, worst gradient {} rel {:.2e}",
        worst.1, worst.0
    );
}

#[test]
fn vit_tiny_matches_pytorch_on_the_interpreter() {
    compare_on(Device::Interp, Tol { outputs: 2e-5, grads: 2e-5 });
}

#[test]
fn vit_tiny_matches_pytorch_on_the_cpu() {
    compare_on(Device::Cpu, Tol { outputs: 2e-4, grads: 1e-3 });
}

/// The reference files are what make.py writes: every complex tensor is listed as such, and
/// the weights hold exactly the parameters the gradients are given for (a stale or hand-edited
/// fixture fails here with a readable message rather than as a numeric mismatch).
#[test]
fn reference_files_are_consistent() {
    let reference = root().join(REFERENCE);
    let w = checkpoint::load(&reference.join("weights.safetensors")).expect("weights").tensors;
    let e = checkpoint::load(&reference.join("expected.safetensors")).expect("expected").tensors;
    for (name, t) in &w {
        let g = e.get(&format!("grad.{name}")).unwrap_or_else(|| panic!("no gradient for {name}"));
        assert_eq!((g.dtype, &g.shape), (t.dtype, &t.shape), "{name}");
    }
    assert_eq!(e.len(), w.len() + 2, "expected.safetensors holds logits, loss and one gradient per weight");
    assert_eq!(e["loss"].shape, Vec::<usize>::new());
}
