//! GPU tests (skipped without a CUDA GPU; `CVC_REQUIRE_GPU=1` makes a missing GPU a failure):
//! every example's forward values, loss and parameter gradients on the CUDA back end against
//! the f64 reference interpreter, on fresh random inputs, within a relative error of 1e-4.

use cvc_compiler::config::{Optimizer, OptimizerKind, Precision};
use cvc_compiler::front::check_source;
use cvc_compiler::interp::{evaluate, Session, SplitMix64, Tensor, TensorData};
use cvc_compiler::ir::{DType, Graph, Mode, Op, Value};
use cvc_compiler::passes::fusion::Fusion;
use cvc_compiler::passes::memplan::{bump, storage_root};
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;
use cvc_compiler::target::KernelConfig;
use cvc_runtime::backend::{Backend, HostData, HostTensor};
use cvc_runtime::cuda::CudaBackend;
use num_complex::Complex64;
use std::collections::HashMap;
use std::path::Path;

const TOL: f64 = 1e-4;

/// Fresh seeds a failing example is retried on (activation kinks; see the forward/backward
/// test): with about half of complex_resnet's seeds flipping one, four retries leave a 3%
/// chance that a correct back end fails a run.
const RETRIES: u64 = 4;

fn gpu_or_skip() -> bool {
    match cvc_runtime::cuda::available() {
        Ok(name) => {
            eprintln!("GPU: {name}");
            true
        }
        Err(why) => {
            if std::env::var("CVC_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("CVC_REQUIRE_GPU=1 but no GPU: {why}");
            }
            eprintln!("skipping: {why}");
            false
        }
    }
}

/// The CUDA kernel choices of this run: the spec in `CVC_KERNELS` (e.g. `conv=gemm,fill=528`,
/// see `KernelConfig::parse`; `bench/gpu-variants.sh` sets it per variant), else the defaults.
fn kernels() -> KernelConfig {
    let spec = std::env::var("CVC_KERNELS").unwrap_or_default();
    let k = KernelConfig::parse(&spec).unwrap_or_else(|e| panic!("CVC_KERNELS={spec}: {e}"));
    eprintln!("kernels: {k}");
    k
}

fn seed() -> u64 {
    let s = std::env::var("CVC_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    eprintln!("seed {s} (set CVC_TEST_SEED={s} to repeat)");
    s
}

fn to_host(t: &Tensor) -> HostTensor {
    let data = match &t.data {
        TensorData::Real(v) => HostData::F32(v.iter().map(|&x| x as f32).collect()),
        TensorData::Complex(v) => HostData::F32(v.iter().flat_map(|z| [z.re as f32, z.im as f32]).collect()),
        TensorData::Int(v) => HostData::I32(v.iter().map(|&x| x as i32).collect()),
    };
    HostTensor { dtype: t.dtype(), shape: t.shape.clone(), data }
}

fn from_host(h: &HostTensor) -> Tensor {
    match (&h.data, h.dtype) {
        (HostData::I32(v), _) => Tensor::int(&h.shape, v.iter().map(|&x| x as i64).collect()),
        (HostData::F32(v), DType::C64) => Tensor::complex(
            &h.shape,
            v.chunks_exact(2).map(|c| Complex64::new(c[0] as f64, c[1] as f64)).collect(),
        ),
        (HostData::F32(v), _) => Tensor::real(&h.shape, v.iter().map(|&x| x as f64).collect()),
    }
}

/// Rounds a reference tensor to f32, so GPU and interpreter start from identical values.
fn round(t: &Tensor) -> Tensor {
    from_host(&to_host(t))
}

fn flat(t: &Tensor) -> Vec<f64> {
    match &t.data {
        TensorData::Real(v) => v.clone(),
        TensorData::Complex(v) => v.iter().flat_map(|z| [z.re, z.im]).collect(),
        TensorData::Int(v) => v.iter().map(|&x| x as f64).collect(),
    }
}

/// `‖a − b‖ / ‖b‖` (absolute when `b` is zero).
fn rel_err(got: &Tensor, want: &Tensor) -> f64 {
    let (a, b) = (flat(got), flat(want));
    assert_eq!(a.len(), b.len(), "element counts differ");
    let d: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    let n: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    if a.iter().any(|x| x.is_nan()) {
        return f64::INFINITY;
    }
    if n == 0.0 {
        d
    } else {
        d / n
    }
}

fn random_inputs(
    g: &Graph,
    batch: usize,
    classes: &HashMap<String, usize>,
    rng: &mut SplitMix64,
) -> HashMap<String, Tensor> {
    let mut m = HashMap::new();
    for v in g.inputs() {
        let n = g.node(v);
        let name = g.leaf_name(v).expect("input name").to_string();
        let shape = n.ty.shape.resolve(batch);
        let count: usize = shape.iter().product();
        let t = match n.ty.dtype {
            DType::F32 => Tensor::real(&shape, (0..count).map(|_| rng.normal()).collect()),
            DType::C64 => Tensor::complex(
                &shape,
                (0..count).map(|_| Complex64::new(rng.normal(), rng.normal())).collect(),
            ),
            DType::I32 => {
                let k = classes.get(&name).copied().unwrap_or(2) as u64;
                Tensor::int(&shape, (0..count).map(|_| (rng.next_u64() % k) as i64).collect())
            }
        };
        m.insert(name, round(&t));
    }
    m
}

fn leaves_of(
    g: &Graph,
    state: &HashMap<String, Tensor>,
    inputs: &HashMap<String, Tensor>,
) -> HashMap<Value, Tensor> {
    let mut l = HashMap::new();
    for (h, n) in g.nodes.iter() {
        let name = match &n.op {
            Op::Input { name } | Op::Param { name, .. } | Op::State { name, .. } => name,
            _ => continue,
        };
        let t = inputs.get(name).or_else(|| state.get(name)).unwrap_or_else(|| panic!("no value for {name}"));
        l.insert(h, t.clone());
    }
    l
}

fn upload_leaves(be: &mut CudaBackend, g: &Graph, leaves: &HashMap<Value, Tensor>) {
    for (&v, t) in leaves {
        if be.has_buffer(v) {
            be.upload(v, &to_host(t))
                .unwrap_or_else(|e| panic!("upload {}: {e}", g.leaf_name(v).unwrap_or("?")));
        }
    }
}

fn norm(t: &Tensor) -> f64 {
    flat(t).iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// ‖x‖₂ of the input of the reduction that computes `v` (through views), else 0.
fn summand_norm(g: &Graph, want: &[Option<Tensor>], mut v: Value) -> f64 {
    loop {
        let n = g.node(v);
        match n.op {
            Op::Reshape | Op::Unary(_) => v = n.inputs[0],
            Op::Reduce { .. } => return want[n.inputs[0].index()].as_ref().map(norm).unwrap_or(0.0),
            _ => return 0.0,
        }
    }
}

struct Example {
    name: String,
    program: Program,
    classes: HashMap<String, usize>,
}

fn load(path: &Path, batch: usize, optimizer: Option<Optimizer>) -> Example {
    let name = path.display().to_string();
    let src = std::fs::read_to_string(path).expect("readable example");
    let mut checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    if checked.graph.loss.is_none() {
        // An inference-only model (some fixtures): its forward program.
        checked = check_source(&name, &src, Mode::Eval).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    }
    let classes = checked.inputs.iter().filter_map(|i| i.classes.map(|c| (i.name.clone(), c))).collect();
    let optimizer = optimizer.unwrap_or_else(|| checked.train.optimizer.clone());
    let opts = Options { batch, optimizer, ..Options::default() };
    let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    Example { name, program, classes }
}

fn examples() -> Vec<std::path::PathBuf> {
    cvnn_files("examples")
}

/// The `.cvnn` files of a folder of the repository, sorted.
fn cvnn_files(dir: &str) -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("root").join(dir);
    let mut v: Vec<_> = std::fs::read_dir(root)
        .expect("a folder of .cvnn files")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cvnn"))
        .collect();
    v.sort();
    v
}

/// Test batches: small, so the interpreter is quick and few activations sit near a kink.
fn batch_for(path: &Path) -> usize {
    let p = path.to_string_lossy();
    if p.contains("seed_cnn") {
        3
    } else if p.contains("complex_resnet") {
        2
    } else {
        4
    }
}

/// One training step of every example with plain SGD at lr 1 and a no-reuse memory plan, so
/// every value the kernels store stays readable: each stored value, the outputs, the loss and
/// every parameter gradient (read directly, or as `p_old − p_new`) must match the interpreter.
/// On the GPU, steps that gather and stage the next batch (page-locked memory) while the
/// device runs train on the same batches as plain steps: the first step is bit-identical and
/// every later loss and output agrees to 1e-3 of the outputs' scale. (Not bitwise: split-K and
/// weight-gradient kernels add partial sums with atomics in a varying order, and Adam turns
/// last-bit differences of near-zero gradients into steps of up to the learning rate, which
/// is therefore set to 1e-5 here; a stale or wrong batch moves the logits by about their own
/// size.) The RF example at its own batch size, four steps; the third uploads an unstaged copy
/// of its batch.
#[test]
fn overlapped_steps_equal_plain_steps_on_the_gpu() {
    use cvc_runtime::data::Dataset;
    use cvc_runtime::session::{Device, Model, SessionOptions, StagedBatch};
    if !gpu_or_skip() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("root").to_path_buf();
    let m = Model::from_file(root.join("examples/rf_modulation.cvnn")).expect("loads");
    let sopts = SessionOptions { device: Device::Cuda, ..SessionOptions::from_config(m.config()) };
    let d = Dataset::from_source(&m.config().data, m.dir(), m.inputs()).expect("synthetic data");
    let n = sopts.batch;
    let batches: Vec<Vec<usize>> = (0..4).map(|i| (i * n..(i + 1) * n).collect()).collect();
    let mut plain = m.session_with(&sopts).expect("session");
    plain.set_lr(1e-5).expect("lr");
    assert!(plain.overlaps(), "the CUDA back end runs steps asynchronously");
    let want: Vec<_> = batches
        .iter()
        .map(|b| {
            let r = plain.train_step(&d.gather(b)).expect("step");
            (r.loss, r.outputs)
        })
        .collect();
    let mut overlapped = m.session_with(&sopts).expect("session");
    overlapped.set_lr(1e-5).expect("lr");
    let mut got = Vec::new();
    let mut pending = Some(StagedBatch::new(d.gather(&batches[0])));
    for i in 0..batches.len() {
        let mut inputs = pending.take().expect("batch");
        if i == 2 {
            // A fresh batch with the same tensors: uploaded directly (not from staging).
            inputs = StagedBatch::new(inputs.batch().to_vec());
        }
        let (r, next) = overlapped
            .train_step_overlapped(&inputs, || batches.get(i + 1).map(|b| d.gather(b)))
            .expect("step");
        pending = next;
        got.push((r.loss, r.outputs));
    }
    assert_eq!(got[0], want[0], "the first step reads the same batch and weights");
    let logits = |o: &[(String, HostTensor)]| -> Vec<f32> {
        match &o.iter().find(|(n, _)| n == "logits").expect("logits").1.data {
            HostData::F32(v) => v.clone(),
            other => panic!("real logits expected, got {other:?}"),
        }
    };
    for (i, ((gl, go), (wl, wo))) in got.iter().zip(&want).enumerate() {
        let (g, w) = (logits(go), logits(wo));
        let scale = w.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
        let diff = g.iter().zip(&w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!(
            "step {}: loss {gl} vs {wl}, largest logit difference {diff:.2e} (scale {scale:.2})",
            i + 1
        );
        assert!(diff <= 1e-3 * scale, "step {}: logits differ by {diff} (scale {scale})", i + 1);
        assert!((gl - wl).abs() <= 1e-3 * wl.abs(), "step {}: loss {gl} vs {wl}", i + 1);
    }
}

#[test]
fn every_example_matches_the_interpreter_forward_and_backward() {
    if !gpu_or_skip() {
        return;
    }
    // A crelu/relu input within f32 rounding of 0 can take different sides here and in the
    // interpreter; through batchnorm that one element moves every upstream gradient by about
    // 1e-4..1e-3 (seen: the largest error at a `grad(…/crelu)` value, everything after it
    // exact). With ~10⁵ activations per example and stored values within ~3e-6 of the
    // interpreter, a flip somewhere is likely in the deeper examples (complex_resnet: about
    // half its seeds; the signature is a batchnorm whose β gradient is off by ~1e-2 while its
    // γ gradient matches to 1e-6, since the flipped element has x̂ ≈ 0). So a failing seed is
    // retried on up to four fresh seeds and the example passes when one of them does: a
    // wrong kernel fails every seed, by far more than 1e-4.
    every_example_on_some_seed(forward_backward);
}

/// The same forward/backward comparison for every fixture of `tests/fixtures/ok` (strided,
/// dilated and non-square convolutions, transposed convolutions, FFTs, tuples, real-only
/// layers; inference-only fixtures compare their forward values).
#[test]
fn every_fixture_matches_the_interpreter_forward_and_backward() {
    if !gpu_or_skip() {
        return;
    }
    each_on_some_seed(&cvnn_files("tests/fixtures/ok"), forward_backward);
}

/// One forward and backward pass of one example from `rng`'s draws; the mismatches found.
fn forward_backward(path: &Path, rng: &mut SplitMix64) -> Vec<String> {
    let path = path.to_path_buf();
    let sgd =
        Optimizer { kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false }, lr: 1.0, weight_decay: 0.0 };
    let mut failures = Vec::new();
    let batch = batch_for(&path);
    let mut ex = load(&path, batch, Some(sgd));
    let g = ex.program.graph.clone();
    let fusion = Fusion { groups: ex.program.groups.clone(), recomputed: Vec::new() };
    ex.program.plan = bump(&g, &fusion, &ex.program.order, batch);
    let materialized = fusion.materialized(&g);
    let session = Session::new(&g, batch, rng.next_u64());
    let mut state: HashMap<String, Tensor> =
        session.state.iter().map(|(k, t)| (k.clone(), round(t))).collect();
    // The learning rate is a state input in some programs: make it exactly 1.
    for (k, t) in state.iter_mut() {
        if k == "lr" || k.ends_with(".lr") {
            *t = Tensor { shape: t.shape.clone(), data: TensorData::Real(vec![1.0; t.numel()]) };
        }
    }
    let inputs = random_inputs(&g, batch, &ex.classes, rng);
    let leaves = leaves_of(&g, &state, &inputs);
    let want = evaluate(&g, batch, &leaves).unwrap_or_else(|e| panic!("{}: interpreter: {e}", ex.name));
    let mut be = CudaBackend::new(&ex.program, Precision::Fp32, &kernels())
        .unwrap_or_else(|e| panic!("{}: {e}", ex.name));
    eprintln!("{}: {}", ex.name, be.compile_info());
    upload_leaves(&mut be, &g, &leaves);
    be.step().unwrap_or_else(|e| panic!("{}: step: {e}", ex.name));
    let mut worst: Vec<(f64, String)> = Vec::new();
    let mut checked = 0;
    for (h, n) in g.nodes.iter() {
        // Persistent buffers (and views of them) hold the updated values after the step.
        let root = storage_root(&g, h);
        if !materialized[h.index()] || n.op.is_leaf() || g.node(root).op.is_persistent() {
            continue;
        }
        let got = from_host(&be.download(h).unwrap_or_else(|e| panic!("{}: download {h}: {e}", ex.name)));
        let w = want[h.index()].as_ref().expect("interpreter value");
        let e = rel_err(&got, w);
        worst.push((e, format!("{h} {} [{}]", n.op.mnemonic(), n.origin.label)));
        checked += 1;
    }
    worst.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
    eprintln!("{}: {checked} stored values compared; largest relative errors:", ex.name);
    for (e, what) in worst.iter().take(4) {
        eprintln!("    {e:.2e}  {what}");
    }
    // Outputs and loss.
    let mut crit: Vec<(String, Value)> =
        g.outputs.iter().map(|o| (format!("output {}", o.name), o.value)).collect();
    if let Some(l) = g.loss {
        crit.push(("loss".into(), l));
    }
    for (what, v) in crit {
        let got = from_host(&be.download(v).expect("download output"));
        let e = rel_err(&got, want[v.index()].as_ref().expect("value"));
        eprintln!("    {what}: {e:.2e}");
        if e.is_nan() || e > TOL {
            failures.push(format!("{}: {what} relative error {e:.2e}", ex.name));
        }
    }
    // Gradients: directly when stored, else from the SGD update at lr 1.
    let assigns: HashMap<Value, Value> =
        g.nodes.iter().filter(|(_, n)| matches!(n.op, Op::Assign)).map(|(h, n)| (n.inputs[0], h)).collect();
    for &(p, dp) in &ex.program.facts.grads {
        let pname = g.leaf_name(p).unwrap_or("?").to_string();
        let want_g = want[dp.index()].as_ref().expect("gradient value");
        let got_g = if materialized[dp.index()] {
            from_host(&be.download(dp).expect("download gradient"))
        } else {
            let new_p = flat(&from_host(&be.download(p).expect("download parameter")));
            let old_p = flat(leaves.get(&p).expect("old parameter"));
            assert!(assigns.contains_key(&p), "{pname} is never updated");
            let d: Vec<f64> = old_p.iter().zip(&new_p).map(|(a, b)| a - b).collect();
            match want_g.dtype() {
                DType::C64 => {
                    Tensor::complex(&want_g.shape, d.chunks(2).map(|c| Complex64::new(c[0], c[1])).collect())
                }
                _ => Tensor::real(&want_g.shape, d),
            }
        };
        let e = rel_err(&got_g, want_g);
        // A gradient that is a sum can vanish (a bias before batchnorm): then fp32 can
        // only be asked for an error small against the summands, ‖x‖₂ of its reduction.
        let floor = summand_norm(&g, &want, dp) * 1e-5 / norm(want_g).max(1e-300);
        eprintln!(
            "    grad {pname}: {e:.2e}{}",
            if materialized[dp.index()] { "" } else { " (from the update)" }
        );
        // The update path loses the low bits of p: allow f32 rounding of |p| relative to |g|.
        let tol = if materialized[dp.index()] {
            TOL
        } else {
            let pn = flat(leaves.get(&p).expect("p")).iter().map(|x| x * x).sum::<f64>().sqrt();
            let gn = flat(want_g).iter().map(|x| x * x).sum::<f64>().sqrt();
            TOL.max(2.0 * f32::EPSILON as f64 * pn / gn.max(1e-30))
        }
        .max(floor);
        if e.is_nan() || e > tol {
            failures.push(format!(
                "{}: gradient of {pname} relative error {e:.2e} (tolerance {tol:.1e})",
                ex.name
            ));
        }
    }
    failures
}

/// Two training steps of every example with SGD + momentum and the real (reusing) memory
/// plan: outputs, loss, every updated parameter and state buffer match the interpreter.
///
/// A crelu/relu input that lands within f32 rounding of 0 may fall on different sides on the
/// GPU and in the interpreter, and through batchnorm that one element moves every upstream
/// gradient a little (see the forward/backward test): a failing seed is reported and retried
/// on up to four fresh seeds; the example passes when one of them does.
#[test]
fn every_example_trains_like_the_interpreter_with_the_real_plan() {
    if !gpu_or_skip() {
        return;
    }
    every_example_on_some_seed(train_two_steps);
}

/// Runs `check` on every example with the test seed; an example whose check fails is retried
/// on up to [`RETRIES`] fresh seeds and passes when one of them does (see the forward/backward
/// test for why). Panics with the mismatches of the examples that fail them all.
fn every_example_on_some_seed(check: fn(&Path, &mut SplitMix64) -> Vec<String>) {
    each_on_some_seed(&examples(), check);
}

/// Runs `check` on every file in `paths`, retrying a failing seed as described above.
fn each_on_some_seed(paths: &[std::path::PathBuf], check: fn(&Path, &mut SplitMix64) -> Vec<String>) {
    let s = seed();
    let mut failures = Vec::new();
    for path in paths {
        let fails = check(path, &mut SplitMix64::new(s));
        if fails.is_empty() {
            eprintln!("{}: checked", path.display());
            continue;
        }
        eprintln!(
            "{}: seed {s} failed (retrying on {RETRIES} more seeds):\n{}",
            path.display(),
            fails.join("\n")
        );
        let retried =
            (1..=RETRIES).map(|r| s.wrapping_add(r.wrapping_mul(0x9E37_79B9_7F4A_7C15))).find(|&s2| {
                let fails = check(path, &mut SplitMix64::new(s2));
                let verdict = if fails.is_empty() { "passes" } else { "fails" };
                eprintln!("{}: retry seed {s2}: {verdict}", path.display());
                fails.is_empty()
            });
        if retried.is_none() {
            failures.push(format!(
                "{}: seed {s} and all {RETRIES} retry seeds fail:\n{}",
                path.display(),
                fails.join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "GPU vs interpreter mismatches:\n{}", failures.join("\n"));
}

/// Two steps of one example from `rng`'s draws; the mismatches found.
fn train_two_steps(path: &Path, rng: &mut SplitMix64) -> Vec<String> {
    let path = path.to_path_buf();
    let mut failures = Vec::new();
    let batch = batch_for(&path);
    // SGD with momentum: Adam would turn the rounding noise of a vanishing gradient (a
    // bias before batchnorm) into a full-size step, in any fp32 implementation.
    let sgd = Optimizer {
        kind: OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
        lr: 0.01,
        weight_decay: 0.0,
    };
    let ex = load(&path, batch, Some(sgd));
    let g = &ex.program.graph;
    let mut session = Session::new(g, batch, rng.next_u64());
    session.state = session.state.iter().map(|(k, t)| (k.clone(), round(t))).collect();
    let mut be = CudaBackend::new(&ex.program, Precision::Fp32, &kernels())
        .unwrap_or_else(|e| panic!("{}: {e}", ex.name));
    let grad_of: HashMap<Value, Value> = ex.program.facts.grads.iter().copied().collect();
    for step in 0..2 {
        // Both sides start every step from the same (f32) state, so each step's update is
        // compared on its own rather than after rounding differences have compounded.
        session.state = session.state.iter().map(|(k, t)| (k.clone(), round(t))).collect();
        let inputs = random_inputs(g, batch, &ex.classes, rng);
        let leaves = leaves_of(g, &session.state, &inputs);
        for (&v, t) in &leaves {
            if be.has_buffer(v) {
                be.upload(v, &to_host(t)).unwrap_or_else(|e| panic!("{}: upload: {e}", ex.name));
            }
        }
        let out = session.step(g, &inputs).unwrap_or_else(|e| panic!("{}: interpreter: {e}", ex.name));
        be.step().unwrap_or_else(|e| panic!("{}: step: {e}", ex.name));
        let mut check = |what: String, got: Tensor, want: &Tensor| {
            let e = rel_err(&got, want);
            if e.is_nan() || e > TOL {
                failures.push(format!("{} step {step}: {what} relative error {e:.2e}", ex.name));
            }
        };
        for o in &g.outputs {
            let got = from_host(&be.download(o.value).expect("output"));
            check(format!("output {}", o.name), got, &out.outputs[&o.name]);
        }
        if let (Some(l), Some(want)) = (g.loss, out.loss) {
            let got = from_host(&be.download(l).expect("loss"));
            check("loss".into(), got, &Tensor::scalar(want));
        }
        for v in g.persistent() {
            let name = g.leaf_name(v).expect("name").to_string();
            // Momentum buffers enter the parameters' updates, checked here.
            if g.node(v).ty.dtype == DType::I32 || !be.has_buffer(v) || name.ends_with(".momentum") {
                continue;
            }
            // Compare the update (new − old): relative to it, allowing the f32 rounding
            // of the stored value and, for a parameter whose gradient is a sum, the fp32
            // error of that sum against its summands (vanishing gradients).
            let old = flat(&leaves[&v]);
            let got = flat(&from_host(&be.download(v).expect("state")));
            let want = flat(&session.state[&name]);
            let du_got: Vec<f64> = got.iter().zip(&old).map(|(a, b)| a - b).collect();
            let du_want: Vec<f64> = want.iter().zip(&old).map(|(a, b)| a - b).collect();
            let d = du_got.iter().zip(&du_want).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            let un = du_want.iter().map(|x| x * x).sum::<f64>().sqrt();
            let wn = want.iter().map(|x| x * x).sum::<f64>().sqrt();
            if un == 0.0 && d == 0.0 {
                continue;
            }
            let floor = grad_of.get(&v).map_or(0.0, |&dp| 0.01 * summand_norm(g, &out.values, dp) * 1e-5);
            let tol = TOL * un + 2.0 * f32::EPSILON as f64 * wn + floor;
            if d.is_nan() || d > tol {
                failures.push(format!(
                    "{} step {step}: update of {name}: error {:.2e} of {un:.2e} (allowed {tol:.2e})",
                    ex.name, d
                ));
            }
        }
    }
    failures
}

/// The benchmark half of `bench/gpu.sh` (run with `--ignored`): `examples/seed_cnn.cvnn` at
/// batch `CVC_BENCH_BATCH` (default 1024), data resident on the device as the peers keep it,
/// 3 warm-up steps, then the median of `CVC_BENCH_STEPS` (default 20) synchronised steps.
/// Prints one JSON line (`mode`, `peak_mib`, `step_ms`, ...) and a per-kernel profile.
#[test]
#[ignore = "benchmark: run by bench/gpu.sh on a GPU"]
fn bench_seed_cnn() {
    if !gpu_or_skip() {
        return;
    }
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|s| s.parse().ok()).unwrap_or(d);
    let batch = env("CVC_BENCH_BATCH", 1024);
    let steps = env("CVC_BENCH_STEPS", 20);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("root").to_path_buf();
    let mut rng = SplitMix64::new(seed());
    for precision in [Precision::Fp32, Precision::Tf32] {
        let t = std::time::Instant::now();
        let ex = load(&root.join("examples/seed_cnn.cvnn"), batch, None);
        let compile_s = t.elapsed().as_secs_f64();
        let g = &ex.program.graph;
        let session = Session::new(g, batch, 7);
        let inputs = random_inputs(g, batch, &ex.classes, &mut rng);
        let leaves = leaves_of(g, &session.state, &inputs);
        let t = std::time::Instant::now();
        let mut be = CudaBackend::new(&ex.program, precision, &kernels()).unwrap_or_else(|e| panic!("{e}"));
        let start_s = t.elapsed().as_secs_f64();
        eprintln!(
            "seed_cnn batch {batch} {precision:?}: plan {compile_s:.2} s, start {start_s:.2} s ({})",
            be.compile_info()
        );
        for (&v, t) in &leaves {
            if be.has_buffer(v) {
                be.upload(v, &to_host(t)).expect("upload");
            }
        }
        for _ in 0..3 {
            be.step().expect("warm-up step");
        }
        let mut times = Vec::new();
        for _ in 0..steps {
            let t = std::time::Instant::now();
            be.step().expect("step");
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        let median = times[times.len() / 2];
        let loss = g.loss.map(|l| flat(&from_host(&be.download(l).expect("loss")))[0]).unwrap_or(f64::NAN);
        let peak = be.measured_peak_bytes().unwrap_or(0);
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        println!(
            "{{\"mode\": \"cvc_{}\", \"batch\": {batch}, \"peak_mib\": {:.1}, \"arena_mib\": {:.1}, \"lower_bound_mib\": {:.1}, \"step_ms\": {median:.3}, \"step_ms_min\": {:.3}, \"kernels\": {}, \"loss\": {loss:.5}}}",
            format!("{precision:?}").to_lowercase(),
            mib(peak),
            mib(be.arena_bytes()),
            mib(ex.program.plan.lower_bound_bytes),
            times[0],
            be.module().kernels.len(),
        );
        if precision == Precision::Fp32 {
            let prof = be.profile_step().expect("profile");
            let total: f64 = prof.iter().map(|p| p.1).sum();
            let mut by_kind: HashMap<&str, (f64, usize)> = HashMap::new();
            for (name, ms) in &prof {
                let kind = name.rsplit('_').next().unwrap_or("?");
                let e = by_kind.entry(if name.starts_with("memset") { "memset" } else { kind }).or_default();
                e.0 += ms;
                e.1 += 1;
            }
            eprintln!("profile (kernels run one at a time, {total:.2} ms in all):");
            let mut kinds: Vec<_> = by_kind.into_iter().collect();
            kinds.sort_by(|a, b| b.1 .0.partial_cmp(&a.1 .0).expect("finite"));
            for (k, (ms, n)) in kinds {
                eprintln!("    {k:8} {n:4} launches {ms:9.3} ms");
            }
            let mut top = prof.clone();
            top.sort_by(|a, b| b.1.partial_cmp(&a.1).expect("finite"));
            for (name, ms) in top.iter().take(12) {
                eprintln!("    {ms:9.3} ms  {name}");
            }
            eprintln!("every launch, in order:");
            for (name, ms) in &prof {
                eprintln!("    {ms:9.4} ms  {name}");
            }
        }
    }
}
