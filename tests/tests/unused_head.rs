//! A model with an auxiliary output head that the loss does not use
//! (`tests/fixtures/ok/unused_head.cvnn`), tried as a user would: a training step through the
//! whole pipeline on the CPU back end, the interpreter back end and (when there is a GPU) the
//! CUDA back end. Every parameter gradient
//! must have its parameter's shape and match the f64 interpreter's autodiff of the
//! unoptimised graph (and central finite differences of the interpreter's loss); the head's
//! parameters get exact zeros, and the step leaves them as SGD leaves a parameter with a zero
//! gradient. `cvc check` warns (exit 0) that `aux` reaches no loss, and `cvc emit --ir
//! --after NAME` takes every step name of the pipeline.

use cvc_compiler::interp::{evaluate, Tensor, TensorData};
use cvc_compiler::ir::{Graph, Value};
use cvc_compiler::passes::pipeline::PASSES;
use cvc_compiler::passes::{autodiff, cast};
use cvc_runtime::backend::{HostData, HostTensor};
use cvc_runtime::data::Dataset;
use cvc_runtime::interp_backend::to_interp;
use cvc_runtime::session::{Device, Model, SessionOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const FIXTURE: &str = "tests/fixtures/ok/unused_head.cvnn";
const BATCH: usize = 5;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn flat(t: &Tensor) -> Vec<f64> {
    match &t.data {
        TensorData::Real(v) => v.clone(),
        TensorData::Complex(v) => v.iter().flat_map(|z| [z.re, z.im]).collect(),
        TensorData::Int(v) => v.iter().map(|&x| x as f64).collect(),
    }
}

fn host_flat(h: &HostTensor) -> Vec<f64> {
    match &h.data {
        HostData::F32(v) => v.iter().map(|&x| x as f64).collect(),
        HostData::I32(v) => v.iter().map(|&x| x as f64).collect(),
    }
}

fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    let n: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    d / n.max(1e-30)
}

/// The reference: the front end's graph with casts placed and autodiff appended, no other
/// pass, evaluated in f64 on the given leaf values. Returns the loss and each parameter's
/// gradient by name.
struct Reference {
    graph: Graph,
    grads: Vec<(Value, Value)>,
    leaves: HashMap<Value, Tensor>,
}

impl Reference {
    fn new(model: &Model, state: &[(String, HostTensor)], inputs: &[(String, HostTensor)]) -> Self {
        let mut graph = model.train_graph().clone();
        cast::run(&mut graph).expect("cast");
        let grads = autodiff::run(&mut graph).expect("autodiff").grads;
        let by_name: HashMap<&str, &HostTensor> =
            state.iter().chain(inputs).map(|(n, t)| (n.as_str(), t)).collect();
        let mut leaves = HashMap::new();
        for (h, n) in graph.nodes.iter() {
            if n.op.is_leaf() && !matches!(n.op, cvc_compiler::ir::Op::Scalar { .. }) {
                let name = graph.leaf_name(h).expect("leaf name");
                leaves
                    .insert(h, to_interp(by_name.get(name).unwrap_or_else(|| panic!("no value for {name}"))));
            }
        }
        Reference { graph, grads, leaves }
    }

    fn loss_and_grads(&self, leaves: &HashMap<Value, Tensor>) -> (f64, HashMap<String, Tensor>) {
        let vals = evaluate(&self.graph, BATCH, leaves).expect("interpreter");
        let value = |v: Value| vals[v.index()].clone().expect("evaluated");
        let loss = flat(&value(self.graph.loss.expect("loss")))[0];
        let grads = self
            .grads
            .iter()
            .map(|&(p, d)| (self.graph.leaf_name(p).expect("param").to_string(), value(d)))
            .collect();
        (loss, grads)
    }

    /// `∂L/∂Re p[i]` by central differences of the f64 loss.
    fn finite_difference(&self, param: &str, i: usize) -> f64 {
        let p = self.graph.params().find(|&p| self.graph.leaf_name(p) == Some(param)).expect("param");
        let eps = 1e-6;
        let at = |delta: f64| {
            let mut leaves = self.leaves.clone();
            let t = leaves.get_mut(&p).expect("param leaf");
            match &mut t.data {
                TensorData::Real(v) => v[i] += delta,
                TensorData::Complex(v) => v[i].re += delta,
                TensorData::Int(_) => unreachable!("parameters are not integers"),
            }
            self.loss_and_grads(&leaves).0
        };
        (at(eps) - at(-eps)) / (2.0 * eps)
    }
}

fn check_on(device: Device) {
    let model = Model::from_file(root().join(FIXTURE)).expect("fixture checks");
    let opts =
        SessionOptions { device, batch: BATCH, seed: 11, ..SessionOptions::from_config(model.config()) };
    let mut session = model.session_with(&opts).expect("session");
    let before = session.state_tensors().expect("state");
    let data = Dataset::synthetic_random(BATCH, 3, model.inputs()).expect("data");
    let all: Vec<usize> = (0..BATCH).collect();
    let inputs = data.gather(&all);
    let report = session.train_step(&inputs).expect("step");
    let grads = session.gradients().expect("gradients");
    let after = session.state_tensors().expect("state");

    let reference = Reference::new(&model, &before, &inputs);
    let (loss, want) = reference.loss_and_grads(&reference.leaves);
    assert!(
        (report.loss as f64 - loss).abs() <= 1e-4 * loss.abs().max(1.0),
        "{device:?}: loss {} vs {loss}",
        report.loss
    );
    let g = model.train_graph();
    assert_eq!(grads.len(), g.params().count(), "{device:?}: one gradient per parameter");
    let mut aux_seen = 0;
    for (name, got) in &grads {
        let p = g.params().find(|&p| g.leaf_name(p) == Some(name)).unwrap_or_else(|| panic!("{name}?"));
        let ty = g.ty(p);
        assert_eq!(got.shape, ty.shape.resolve(BATCH), "{device:?}: shape of the gradient of {name}");
        assert_eq!(got.dtype, ty.dtype, "{device:?}: dtype of the gradient of {name}");
        let got = host_flat(got);
        let want = flat(&want[name]);
        if name.starts_with("aux") {
            aux_seen += 1;
            assert!(got.iter().all(|&x| x == 0.0), "{device:?}: {name} reaches no loss, gradient {got:?}");
            assert!(want.iter().all(|&x| x == 0.0), "reference gradient of {name} is {want:?}");
            // A zero gradient under plain SGD leaves the parameter as it was.
            let old = before.iter().find(|(n, _)| n == name).expect("before");
            let new = after.iter().find(|(n, _)| n == name).expect("after");
            assert_eq!(host_flat(&old.1), host_flat(&new.1), "{device:?}: {name} changed");
        } else {
            let e = rel_err(&got, &want);
            assert!(e <= 1e-4, "{device:?}: gradient of {name}: relative error {e:.2e}");
        }
    }
    assert_eq!(aux_seen, 2, "the aux head has a weight and a bias");
    // The reference itself agrees with finite differences (a trunk weight and the head).
    for (param, i) in
        [("trunk.linear_0.weight", 3), ("logits.linear_0.weight", 1), ("aux.linear_0.weight", 0)]
    {
        let w = reference.graph.params().find(|&p| reference.graph.leaf_name(p) == Some(param));
        assert!(
            w.is_some(),
            "no parameter {param} (have {:?})",
            grads.iter().map(|g| &g.0).collect::<Vec<_>>()
        );
        let fd = reference.finite_difference(param, i);
        let ad = flat(&want[param])[2 * i];
        assert!((fd - ad).abs() <= 1e-5 + 1e-4 * ad.abs(), "{param}[{i}]: autodiff {ad}, differences {fd}");
    }
}

#[test]
fn unused_head_gets_zero_gradients_of_its_shape_on_cpu() {
    check_on(Device::Cpu);
}

#[test]
fn unused_head_gets_zero_gradients_of_its_shape_in_interpreter() {
    check_on(Device::Interp);
}

/// The same on the CUDA back end; skipped without a usable GPU unless `CVC_REQUIRE_GPU=1`.
#[test]
fn unused_head_gets_zero_gradients_of_its_shape_on_cuda() {
    match cvc_runtime::cuda::available() {
        Ok(_) => check_on(Device::Cuda),
        Err(e) if std::env::var_os("CVC_REQUIRE_GPU").is_none() => eprintln!("skipped (no GPU: {e})"),
        Err(e) => panic!("CVC_REQUIRE_GPU is set but no GPU is usable: {e}"),
    }
}

/// The `cvc` binary of this test's profile, built once per run (`CVC_BIN` overrides it).
fn cvc() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("CVC_BIN") {
            return PathBuf::from(p);
        }
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root())
            .args(["build", "-p", "cvc-runtime", "--bin", "cvc"])
            .status()
            .expect("cargo build");
        assert!(status.success(), "building cvc failed");
        let exe = std::env::current_exe().expect("test executable");
        exe.parent().and_then(Path::parent).expect("target/<profile>").join("cvc")
    })
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(cvc()).current_dir(root()).args(args).output().expect("run cvc");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// `cvc check` warns about the head with its line, and still succeeds.
#[test]
fn check_warns_about_outputs_that_reach_no_loss() {
    let (code, _, stderr) = run(&["check", FIXTURE]);
    assert_eq!(code, Some(0), "stderr:\n{stderr}");
    assert!(stderr.to_lowercase().contains("warning"), "no warning:\n{stderr}");
    assert!(stderr.contains("`aux`") && stderr.contains("no loss"), "stderr:\n{stderr}");
    assert!(stderr.contains("unused_head.cvnn:9:"), "no location of `aux` in:\n{stderr}");
    assert!(stderr.contains("2 parameter tensors"), "stderr:\n{stderr}");
    assert!(!stderr.contains("`logits`") && !stderr.contains("`trunk`"), "stderr:\n{stderr}");
}

/// `cvc emit --ir --after NAME` accepts every step name of the pipeline's table: the IR after
/// each step that runs for this model (its training step recomputes a value in the backward
/// pass, so the re-plan steps run too, and their IR has the recomputed copy); for a model
/// whose steps do not include them (no loss: inference only) a clear error for the re-plan
/// steps and for autodiff; the list of names for an unknown one.
#[test]
fn emit_prints_the_ir_after_every_step() {
    for name in PASSES {
        let (code, stdout, stderr) = run(&["emit", "--ir", "--after", name, FIXTURE]);
        assert_eq!(code, Some(0), "{name}: {stderr}");
        assert!(stdout.contains("aux"), "{name}: no IR printed:\n{stdout}");
        if name.starts_with("remat.") {
            assert!(stdout.contains("recompute("), "{name}: no recomputed value:\n{stdout}");
        }
    }
    for name in PASSES.iter().filter(|n| n.starts_with("remat.")) {
        let (code, _, stderr) = run(&["emit", "--ir", "--after", name, "tests/fixtures/ok/blocks.cvnn"]);
        assert_eq!(code, Some(1), "{name}: {stderr}");
        assert!(stderr.contains("does not run") && stderr.contains("checkpoint"), "{name}: {stderr}");
    }
    let (code, _, stderr) = run(&["emit", "--ir", "--after", "nonsense", FIXTURE]);
    assert_eq!(code, Some(1));
    assert!(PASSES.iter().all(|n| stderr.contains(n)), "{stderr}");
}
