//! GPU tests (skipped without a CUDA GPU; `CVC_REQUIRE_GPU=1` makes a missing GPU a failure):
//! every example's and fixture's training step on the CUDA back end against the f64 reference
//! interpreter, group by group (`cvc_tests::differential`, the code the CPU tests run in CI):
//! every stored value within 1e-4 relative plus the replay's f32 rounding bound. Seeds are
//! fixed (`CVC_SEED` varies them) and never retried: a wrong kernel fails on the first seed.

use cvc_compiler::config::{Optimizer, OptimizerKind, Precision};
use cvc_compiler::front::check_source;
use cvc_compiler::interp::{Session, SplitMix64, Tensor, TensorData};
use cvc_compiler::ir::{DType, Graph, Mode, Op, Value};
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;
use cvc_compiler::target::{CudaTarget, Fp32Products, IndexChoice, KernelConfig, TcHalf, TcMma};
use cvc_runtime::backend::{Backend, HostData, HostTensor};
use cvc_runtime::cuda::CudaBackend;
use cvc_tests::differential::{check_training_steps, from_host, to_host};
use cvc_tests::seed::seed_for;
use num_complex::Complex64;
use std::collections::HashMap;
use std::path::Path;

/// How far the program's own memory plan may differ from the keep-everything plan, relative
/// to each buffer's update: split-K contractions add partial sums with atomics in a varying
/// order, so two runs differ in the last bits and a kink can flip between them (moving a
/// batchnorm's gradients by up to ~1e-2 of their size); a clobbered buffer is off by its
/// whole size.
const PLAN_TOL: f64 = 0.1;

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

fn flat(t: &Tensor) -> Vec<f64> {
    match &t.data {
        TensorData::Real(v) => v.clone(),
        TensorData::Complex(v) => v.iter().flat_map(|z| [z.re, z.im]).collect(),
        TensorData::Int(v) => v.iter().map(|&x| x as f64).collect(),
    }
}

/// Random inputs by name (for the benchmark's steps).
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
        m.insert(name, cvc_tests::differential::round_f32(&t));
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

struct Example {
    name: String,
    program: Program,
    classes: HashMap<String, usize>,
}

fn load(path: &Path, batch: usize, optimizer: Option<Optimizer>) -> Example {
    load_stored(path, batch, optimizer, Default::default())
}

/// [`load`] with activations stored as `half` (`Precision::storage`).
fn load_stored(
    path: &Path,
    batch: usize,
    optimizer: Option<Optimizer>,
    half: cvc_compiler::ir::Storage,
) -> Example {
    load_budgeted(path, batch, optimizer, half, None)
}

/// [`load_stored`] planned under a memory budget (`cvc train --memory-budget`).
fn load_budgeted(
    path: &Path,
    batch: usize,
    optimizer: Option<Optimizer>,
    half: cvc_compiler::ir::Storage,
    memory_budget: Option<u64>,
) -> Example {
    let name = path.display().to_string();
    let src = std::fs::read_to_string(path).expect("readable example");
    let mut checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    if checked.graph.loss.is_none() {
        // An inference-only model (some fixtures): its forward program.
        checked = check_source(&name, &src, Mode::Eval).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    }
    let classes = checked.inputs.iter().filter_map(|i| i.classes.map(|c| (i.name.clone(), c))).collect();
    let optimizer = optimizer.unwrap_or_else(|| checked.train.optimizer.clone());
    let opts = Options { batch, optimizer, half, memory_budget, ..Options::default() };
    let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    Example { name, program, classes }
}

/// The examples compared with the interpreter. The full-size ViT (tens of GFLOP per f64
/// evaluation) is left to its test-size twin `tests/fixtures/ok/vit_tiny.cvnn` (same layers)
/// among the fixtures; `bench/gpu-vit.sh` trains it on the GPU. The 3-D MRI example likewise
/// to `tests/fixtures/ok/mri_volume_tiny.cvnn`.
fn examples() -> Vec<std::path::PathBuf> {
    // polsar_unet.cvnn's twin is tests/fixtures/ok/polsar_unet_tiny.cvnn (fixtures run too).
    cvnn_files("examples")
        .into_iter()
        .filter(|p| !p.ends_with("vit_sar.cvnn") && !p.ends_with("polsar_unet.cvnn"))
        .filter(|p| !p.ends_with("mri_volume.cvnn"))
        .collect()
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

/// One training step of every example (plain SGD at lr 1), every stored value checked
/// against the interpreter replaying its kernel group on the values the GPU read, and the
/// outputs and loss end to end where no discontinuous op precedes them. A crelu/relu input
/// within f32 rounding of 0 no longer fails a correct back end (the replay follows the
/// device's decision at each group boundary and excludes, inside a group, only the elements
/// within rounding of a kink), so no seed is retried.
#[test]
fn every_example_matches_the_interpreter_forward_and_backward() {
    if !gpu_or_skip() {
        return;
    }
    each_file(&examples(), forward_backward);
}

/// The same forward/backward comparison for every fixture of `tests/fixtures/ok` (strided,
/// dilated and non-square convolutions, transposed convolutions, FFTs, tuples, real-only
/// layers; inference-only fixtures compare their forward values).
#[test]
fn every_fixture_matches_the_interpreter_forward_and_backward() {
    if !gpu_or_skip() {
        return;
    }
    each_file(&cvnn_files("tests/fixtures/ok"), forward_backward);
}

/// The CUDA back end for a program, in fp32.
fn cuda(p: &Program) -> Result<Box<dyn Backend>, String> {
    let be = CudaBackend::new(p, Precision::Fp32, &kernels()).map_err(|e| e.0)?;
    eprintln!("{}: {}", p.graph.name, be.compile_info());
    Ok(Box::new(be))
}

/// One step of one file from `rng`'s draws, SGD at lr 1; the mismatches found.
fn forward_backward(path: &Path, rng: &mut SplitMix64) -> Vec<String> {
    forward_backward_on(path, rng, &cuda)
}

/// [`forward_backward`] on the back end `make` builds.
fn forward_backward_on(
    path: &Path,
    rng: &mut SplitMix64,
    make: cvc_tests::differential::MakeBackend,
) -> Vec<String> {
    let sgd =
        Optimizer { kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false }, lr: 1.0, weight_decay: 0.0 };
    let ex = load(path, batch_for(path), Some(sgd));
    check_training_steps(&ex.program, make, 1, PLAN_TOL, rng).unwrap_or_else(|e| panic!("{}: {e}", ex.name))
}

/// This run's kernel choices with 64-bit indices in every kernel (`index=64`) and contraction
/// grids folded into x past 2 blocks along y and z (`yz=2`): the code that batches past 2³¹
/// elements and grids past 65535 blocks run, on shapes the interpreter checks quickly.
fn wide_kernels() -> KernelConfig {
    KernelConfig { index: IndexChoice::Wide, grid_yz: Some(2), ..kernels() }
}

/// The CUDA back end for a program with [`wide_kernels`], in fp32.
fn cuda_wide(p: &Program) -> Result<Box<dyn Backend>, String> {
    let be = CudaBackend::new(p, Precision::Fp32, &wide_kernels()).map_err(|e| e.0)?;
    eprintln!("{} (index=64, yz=2): {}", p.graph.name, be.compile_info());
    Ok(Box::new(be))
}

/// Every example and fixture (elementwise, reductions, batchnorm, pooling, convolutions and
/// their gradients, direct and implicit-GEMM, matmuls, FFTs, gathers and scatters, pads,
/// concatenations, losses, optimizers) and every batched-matmul form, one SGD step with
/// 64-bit indices everywhere and folded contraction grids, against the interpreter group by
/// group: the 64-bit code path checked numerically at sizes where 32-bit would do.
#[test]
fn sixty_four_bit_indexed_kernels_match_the_interpreter() {
    if !gpu_or_skip() {
        return;
    }
    let mut files = examples();
    files.extend(cvnn_files("tests/fixtures/ok"));
    let mut failures = Vec::new();
    for path in &files {
        let mut rng = SplitMix64::new(seed_for(&format!("gpu::wide::{}", path.display())));
        let fails = forward_backward_on(path, &mut rng, &cuda_wide);
        eprintln!("{}: {}", path.display(), if fails.is_empty() { "checked" } else { "FAILS" });
        failures.extend(fails.into_iter().map(|f| format!("{}: {f}", path.display())));
    }
    let program = cvc_tests::matmul_forms::program(3).expect("compiles");
    let mut rng = SplitMix64::new(seed_for("gpu::wide::matmul_forms"));
    let fails = check_training_steps(&program, &cuda_wide, 1, PLAN_TOL, &mut rng).expect("runs");
    failures.extend(fails.into_iter().map(|f| format!("matmul forms: {f}")));
    assert!(failures.is_empty(), "64-bit GPU kernels vs interpreter mismatches:\n{}", failures.join("\n"));
}

/// Two training steps of every example with SGD + momentum: each checked group by group, and
/// the program's real (reusing) memory plan against the keep-everything plan (outputs, loss,
/// every updated parameter and state buffer; [`PLAN_TOL`]).
#[test]
fn every_example_trains_like_the_interpreter_with_the_real_plan() {
    if !gpu_or_skip() {
        return;
    }
    each_file(&examples(), train_two_steps);
}

/// Runs `check` on every file in `paths` with the file's fixed seed (`CVC_SEED` varies it);
/// panics with the mismatches of every file that has any.
fn each_file(paths: &[std::path::PathBuf], check: fn(&Path, &mut SplitMix64) -> Vec<String>) {
    let mut failures = Vec::new();
    for path in paths {
        let mut rng = SplitMix64::new(seed_for(&format!("gpu::{}", path.display())));
        let fails = check(path, &mut rng);
        eprintln!("{}: {}", path.display(), if fails.is_empty() { "checked" } else { "FAILS" });
        failures.extend(fails.into_iter().map(|f| format!("{}: {f}", path.display())));
    }
    assert!(failures.is_empty(), "GPU vs interpreter mismatches:\n{}", failures.join("\n"));
}

/// Every form of the batched matmul and the gradients autodiff makes of them (summed
/// products, broadcast operands, the batch on grid.z or folded into M or K), one SGD step on
/// the GPU against the interpreter, group by group.
#[test]
fn batched_matmul_forms_match_the_interpreter() {
    if !gpu_or_skip() {
        return;
    }
    let program = cvc_tests::matmul_forms::program(3).expect("compiles");
    let mut rng = SplitMix64::new(seed_for("gpu::matmul_forms"));
    let failures = check_training_steps(&program, &cuda, 1, PLAN_TOL, &mut rng).expect("runs");
    assert!(failures.is_empty(), "GPU vs interpreter mismatches:\n{}", failures.join("\n"));
}

/// Two steps of one example from `rng`'s draws; the mismatches found.
fn train_two_steps(path: &Path, rng: &mut SplitMix64) -> Vec<String> {
    // SGD with momentum, as a training run would use; the group-local check compares Adam
    // as well, but the end-to-end plan comparison is relative to each update.
    let sgd = Optimizer {
        kind: OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
        lr: 0.01,
        weight_decay: 0.0,
    };
    let ex = load(path, batch_for(path), Some(sgd));
    check_training_steps(&ex.program, &cuda, 2, PLAN_TOL, rng).unwrap_or_else(|e| panic!("{}: {e}", ex.name))
}

/// The benchmark half of `bench/gpu.sh` (run with `--ignored`): `examples/seed_cnn.cvnn`
/// (or `CVC_BENCH_FILE`, relative to the repository) at batch `CVC_BENCH_BATCH` (default 1024),
/// random data resident on the device as the peers keep it, 3 warm-up steps, then the median
/// of `CVC_BENCH_STEPS` (default 20) synchronised steps, in the precisions of
/// `CVC_BENCH_PRECISIONS` (comma-separated, default fp32,tf32,bf16,fp16).
/// `CVC_BENCH_BUDGET` (e.g. `4.6GiB`) plans under that memory budget, as `--memory-budget`.
/// Prints one JSON line per precision (`mode`, `peak_mib`, `step_ms`, ...) and, for fp32 and
/// bf16 (or those of `CVC_BENCH_PROFILE`, empty for none), a per-kernel profile naming each of the slowest kernels'
/// layers.
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
    let file = std::env::var("CVC_BENCH_FILE").unwrap_or_else(|_| "examples/seed_cnn.cvnn".into());
    let stem = Path::new(&file).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let profiled = precisions_of("CVC_BENCH_PROFILE", "fp32,bf16");
    // `CVC_BENCH_BUDGET=4.6GiB`: plan under a memory budget, as `cvc train --memory-budget`.
    let budget = std::env::var("CVC_BENCH_BUDGET").ok().map(|b| {
        cvc_compiler::units::parse_bytes(&b).unwrap_or_else(|e| panic!("CVC_BENCH_BUDGET={b}: {e}"))
    });
    let mut rng = SplitMix64::new(seed_for("gpu::bench_seed_cnn"));
    for precision in precisions_of("CVC_BENCH_PRECISIONS", "fp32,tf32,bf16,fp16") {
        let t = std::time::Instant::now();
        let ex = load_budgeted(&root.join(&file), batch, None, precision.storage(), budget);
        let compile_s = t.elapsed().as_secs_f64();
        let g = &ex.program.graph;
        let session = Session::new(g, batch, 7);
        let inputs = random_inputs(g, batch, &ex.classes, &mut rng);
        let leaves = leaves_of(g, &session.state, &inputs);
        let t = std::time::Instant::now();
        let mut be = CudaBackend::new(&ex.program, precision, &kernels()).unwrap_or_else(|e| panic!("{e}"));
        let start_s = t.elapsed().as_secs_f64();
        eprintln!(
            "{stem} batch {batch} {precision:?}: plan {compile_s:.2} s, start {start_s:.2} s ({})",
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
            "{{\"mode\": \"cvc_{}\", \"file\": \"{stem}\", \"batch\": {batch}, \"peak_mib\": {:.1}, \"arena_mib\": {:.1}, \"lower_bound_mib\": {:.1}, \"step_ms\": {median:.3}, \"step_ms_min\": {:.3}, \"kernels\": {}, \"loss\": {loss:.5}}}",
            format!("{precision:?}").to_lowercase(),
            mib(peak),
            mib(be.arena_bytes()),
            mib(ex.program.plan.lower_bound_bytes),
            times[0],
            be.module().kernels.len(),
        );
        if profiled.contains(&precision) {
            eprintln!("{precision:?}:");
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
            for (name, ms) in top.iter().take(16) {
                let res = be
                    .kernel_resources(name)
                    .map(|r| {
                        format!(
                            "  [{} regs, {} B local, {} B shared]",
                            r.registers, r.local_bytes, r.shared_bytes
                        )
                    })
                    .unwrap_or_default();
                eprintln!("    {ms:9.3} ms  {name}  {}{res}", kernel_label(&ex.program, name));
            }
            eprintln!("every launch, in order:");
            for (name, ms) in &prof {
                eprintln!("    {ms:9.4} ms  {name}");
            }
            eprint!("{}", roofline(&ex.program, &prof, precision));
        }
    }
}

/// The precisions named by environment variable `key` (comma-separated), else by `default`.
fn precisions_of(key: &str, default: &str) -> Vec<Precision> {
    let list = std::env::var(key).unwrap_or_else(|_| default.into());
    list.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| Precision::from_name(p.trim()).unwrap_or_else(|| panic!("{key}: unknown precision {p}")))
        .collect()
}

/// The layer label of kernel `name` (`k{group}_{kind}`): its group's first node with one.
fn kernel_label(p: &Program, name: &str) -> String {
    let gi = name.strip_prefix('k').and_then(|r| r.split('_').next()).and_then(|x| x.parse::<usize>().ok());
    gi.and_then(|gi| p.groups.get(gi))
        .and_then(|grp| grp.nodes.iter().map(|&v| &p.graph.node(v).origin.label).find(|l| !l.is_empty()))
        .map(|l| format!("({l})"))
        .unwrap_or_default()
}

/// Check mode on the GPU (`--check-numerics`, `docs/NUMERICS.md`): a clean checked step of
/// every example finds nothing (no false alarm from a buffer the scan plan misplaces) and
/// computes the plain step's loss; NaN put into one training sample is named at the op that
/// first reads it, with its `.cvnn` line and the dataset sample.
#[test]
fn check_mode_on_the_gpu_names_nan_data_and_passes_clean_steps() {
    use cvc_runtime::data::{self, Dataset};
    use cvc_runtime::numerics::CheckNumerics;
    use cvc_runtime::session::{Device, Model, SessionOptions};
    use cvc_runtime::train::{train, TrainOptions};
    if !gpu_or_skip() {
        return;
    }
    let mut rng = SplitMix64::new(seed_for("gpu::check_mode"));
    for path in examples() {
        let model = Model::from_file(&path).unwrap();
        let batch = batch_for(&path);
        let opts =
            SessionOptions { device: Device::Cuda, batch, ..SessionOptions::from_config(model.config()) };
        let data = Dataset::synthetic_random(batch, rng.next_u64(), model.inputs()).unwrap();
        let inputs = data.gather(&(0..batch).collect::<Vec<_>>());
        let mut plain = model.session_with(&opts).unwrap();
        let mut checked = model.session_with(&opts).unwrap();
        let a = plain.train_step(&inputs).unwrap().loss;
        let b = checked
            .train_step_checked(&inputs)
            .unwrap_or_else(|f| panic!("{}: false alarm: {}", path.display(), f.render(None)))
            .loss;
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{}: loss {a} plain, {b} checked", path.display());
        assert_eq!(checked.checked_steps(), 1);
    }
    let src = "model Probe {
    input x: c64[B, 6]
    input label: class[B] of 3
    h = x |> linear(5)
    logits = h |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}
train Probe {
    data      = synthetic.random(count = 40, seed = 4)
    split     = 0.8
    batch     = 4
    epochs    = 1
    optimizer = sgd(lr = 0.05)
    seed      = 9
}
";
    let model = Model::from_source("probe.cvnn", src).unwrap();
    let mut data = Dataset::from_source(&model.config().data, model.dir(), model.inputs()).unwrap();
    let order = data::epoch_order(&data::split(data.len, 0.8, 9).train, 9, 0);
    let b = (rng.next_u64() % 4) as usize;
    let s = order[b];
    let (_, x) = data.arrays.iter_mut().find(|(n, _)| n == "x").unwrap();
    let HostData::F32(v) = &mut x.data else { panic!("x is complex") };
    v[s * 12 + 2 * (rng.next_u64() % 6) as usize] = f32::NAN;
    let out = std::env::temp_dir().join(format!("cvc-gpu-check-{}", std::process::id()));
    let opts = TrainOptions {
        device: Device::Cuda,
        check_numerics: CheckNumerics::First,
        ..TrainOptions::from_model(&model, out.clone())
    };
    let e = train(&model, &data, &opts).unwrap_err();
    let _ = std::fs::remove_dir_all(&out);
    let line = src.lines().position(|l| l.contains("linear(5)")).unwrap() + 1;
    for needle in
        [format!("probe.cvnn:{line}:"), format!("batch sample {b} (dataset sample {s})"), "input `x`".into()]
    {
        assert!(e.0.contains(&needle), "`{needle}` missing in:\n{}", e.0);
    }
}

/// Every fused attention variant of `cvc_tests::attention::cases` (both scores, causal, key
/// mask, dropout, heads 7 to 128, odd widths, tails of every tile), one training step at batch
/// 2 on the GPU: the forward with its log-sum-exp, dq and dk‖dv kernels each against the
/// interpreter replaying their group on the values the GPU read, and the loss end to end; then
/// the unfused plan, whose log-sum-exp and forward kernels run apart. Both in fp32 (FMA
/// kernels) and in TF32, where the real score's kernels with heads up to 64 run on tensor cores
/// (`attention_tc.rs`): each kernel within the TF32 bound of
/// `cvc_tests::attention::tensor_core_bound`, the loss within [`END_TO_END_GROSS`]
/// (`CVC_ATTN_PRECISIONS`, default `fp32,tf32`).
#[test]
fn attention_kernels_match_the_interpreter() {
    use cvc_compiler::passes::fusion::GroupKind;
    if !gpu_or_skip() {
        return;
    }
    let mut failures = Vec::new();
    let mut tensor_core = 0;
    for precision in precisions_of("CVC_ATTN_PRECISIONS", "fp32,tf32") {
        let make = |p: &Program| -> Result<Box<dyn Backend>, String> {
            let be = CudaBackend::new(p, precision, &kernels()).map_err(|e| e.0)?;
            Ok(Box::new(be))
        };
        let (numerics, end_tol) = match precision {
            Precision::Fp32 => (Default::default(), cvc_tests::differential::TOL),
            p => (numerics_of(p, &kernels()), END_TO_END_GROSS),
        };
        for c in cvc_tests::attention::cases() {
            // Fused: the forward computes its log-sum-exp (`attn_fwd_lse`); unfused: `attn_lse`
            // and `attn_fwd` apart, as a recomputed forward runs them.
            for (fuse, count) in [(true, 3), (false, 4)] {
                let name = format!("{}{} {precision:?}", c.name(), if fuse { "" } else { " unfused" });
                let program = cvc_tests::attention::program_fused(&c, 2, fuse);
                let attn = program.groups.iter().filter(|g| g.kind == GroupKind::Attention).count();
                assert_eq!(attn, count, "{name}");
                let source = cvc_compiler::back::cuda::generate(
                    &program,
                    &CudaTarget::h200().with_kernels(kernels()).with_precision(precision),
                )
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .source;
                // Kernels calling a tensor-core template (the library defines them without `<`).
                tensor_core += ["attn_tc_fwd<", "attn_tc_dq<", "attn_tc_dkv<"]
                    .iter()
                    .map(|t| source.matches(t).count())
                    .sum::<usize>();
                let mut rng = SplitMix64::new(seed_for(&format!("gpu::{name}")));
                let fails = cvc_tests::differential::check_training_steps_with(
                    &program, &make, 1, PLAN_TOL, &mut rng, numerics, end_tol,
                )
                .unwrap_or_else(|e| panic!("{name}: {e}"));
                eprintln!("{name}: {}", if fails.is_empty() { "checked" } else { "FAILS" });
                failures.extend(fails.into_iter().map(|f| format!("{name}: {f}")));
            }
        }
    }
    eprintln!("{tensor_core} tensor-core attention kernels checked");
    let reduced = precisions_of("CVC_ATTN_PRECISIONS", "fp32,tf32").iter().any(|p| p.tensor_cores());
    if reduced && kernels().attn == cvc_compiler::target::AttnKernel::TensorCore {
        assert!(tensor_core > 0, "no case ran the tensor-core attention kernels");
    }
    assert!(failures.is_empty(), "GPU attention vs interpreter mismatches:\n{}", failures.join("\n"));
}

/// Executed floating-point operations of one attention kernel (an FMA is 2): per (query, key)
/// pair, the score (`4·D`, `8·D` for the magnitude), `Re(dO·conj v)` (`4·Dv`), and the
/// accumulations: `p·v` (`4·Dv`), `g·k` / `g·q` (`4·D`, `8·D` for the magnitude), `p̃·dO`.
fn attention_flops(op: &Op, pairs: f64, d: f64, dv: f64) -> f64 {
    let (spec, parts) = match op {
        Op::AttnLse { spec } => (spec, [1.0, 0.0, 0.0, 0.0]),
        Op::Attention { spec } => (spec, [1.0, 0.0, 0.0, 1.0]),
        Op::AttentionGrad { spec, wrt: cvc_compiler::ir::AttnWrt::Q } => (spec, [1.0, 1.0, 1.0, 0.0]),
        Op::AttentionGrad { spec, .. } => (spec, [1.0, 1.0, 1.0, 1.0]),
        _ => return 0.0,
    };
    let qk = if spec.score == cvc_compiler::ir::AttnScore::Abs { 8.0 * d } else { 4.0 * d };
    pairs * (parts[0] * qk + parts[1] * 4.0 * dv + parts[2] * qk + parts[3] * 4.0 * dv)
}

/// The attention kernels' speed (run with `--ignored`): B = `CVC_BENCH_BATCH` (default 128),
/// H = 3, T = S = 256, D = Dv = 64 (the ViT's attention), real and magnitude scores, and
/// causal with dropout (its pairs counted as the unmasked ones); each kernel timed alone (`profile_step`, the median of 5 profiles) and
/// its executed GFLOP/s printed, forward (attention with its log-sum-exp, one pass) and backward
/// (dq + dk‖dv) summed.
#[test]
#[ignore = "benchmark: run on a GPU"]
fn bench_attention() {
    use cvc_compiler::back::cuda::CudaStep;
    if !gpu_or_skip() {
        return;
    }
    let batch = std::env::var("CVC_BENCH_BATCH").ok().and_then(|s| s.parse().ok()).unwrap_or(128);
    let mut rng = SplitMix64::new(seed_for("gpu::bench_attention"));
    let base = cvc_tests::attention::AttnCase {
        h: 3,
        t: 256,
        s: 256,
        d: 64,
        dv: 64,
        abs: false,
        causal: false,
        mask: false,
        dropout: None,
        layout: cvc_tests::attention::Layout::Separate,
    };
    let variants = [
        base.clone(),
        cvc_tests::attention::AttnCase { abs: true, ..base.clone() },
        cvc_tests::attention::AttnCase { causal: true, dropout: Some((0.1, 1)), ..base.clone() },
    ];
    for (precision, c) in precisions_of("CVC_ATTN_PRECISIONS", "fp32,tf32")
        .into_iter()
        .flat_map(|p| variants.iter().map(move |c| (p, c.clone())))
    {
        let p = cvc_tests::attention::program(&c, batch);
        let leaves = cvc_tests::differential::random_leaves(&p.graph, batch, &mut rng);
        let mut be = CudaBackend::new(&p, precision, &kernels()).unwrap_or_else(|e| panic!("{e}"));
        for (&v, t) in &leaves {
            if be.has_buffer(v) {
                be.upload(v, &to_host(t)).expect("upload");
            }
        }
        for _ in 0..3 {
            be.step().expect("warm-up step");
        }
        let profiles: Vec<Vec<(String, f64)>> = (0..5).map(|_| be.profile_step().expect("profile")).collect();
        // (query, key) pairs a causal mask leaves (the kernels skip hidden tiles).
        let per_head: usize = if c.causal { (0..c.t).map(|i| c.s.min(i + 1)).sum() } else { c.t * c.s };
        let pairs = (batch * c.h * per_head) as f64;
        let (mut fwd, mut bwd) = ((0.0, 0.0), (0.0, 0.0));
        eprintln!("{} {precision:?} at batch {batch}:", c.name());
        for step in &be.module().steps {
            let CudaStep::Launch(l) = step else { continue };
            let g = &p.groups[l.group];
            if g.kind != cvc_compiler::passes::fusion::GroupKind::Attention {
                continue;
            }
            let op = &p.graph.node(*g.nodes.last().expect("node")).op;
            let mut ms: Vec<f64> =
                profiles.iter().filter_map(|pr| pr.iter().find(|(n, _)| n == &l.name).map(|x| x.1)).collect();
            ms.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
            let ms = ms[ms.len() / 2];
            let flops = attention_flops(op, pairs, c.d as f64, c.dv as f64);
            let acc = if matches!(op, Op::AttentionGrad { .. }) { &mut bwd } else { &mut fwd };
            acc.0 += ms;
            acc.1 += flops;
            eprintln!(
                "    {:10} {:16} {ms:8.3} ms {:8.1} GFLOP/s  grid {:?}",
                l.name,
                op.mnemonic(),
                flops / ms * 1e-6,
                l.grid
            );
        }
        println!(
            "{{\"attention\": \"{}\", \"precision\": \"{precision:?}\", \"batch\": {batch}, \"forward_ms\": {:.3}, \"forward_gflops\": {:.1}, \"backward_ms\": {:.3}, \"backward_gflops\": {:.1}}}",
            c.name(),
            fwd.0,
            fwd.1 / fwd.0 * 1e-6,
            bwd.0,
            bwd.1 / bwd.0 * 1e-6
        );
    }
}

/// GPU: the volume layers (strided, dilated and grouped `conv3d`, `conv_transpose3d` with
/// per-axis output padding, 3-D pools by value and by magnitude, `fft3`/`ifft3`) and the
/// 3-D MRI twin (zero-filled `ifft3`, conv3d residual blocks, data consistency) against the
/// interpreter: one SGD step group by group, then two momentum steps with the real plan.
#[test]
fn volume_layers_match_the_interpreter() {
    if !gpu_or_skip() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("root").to_path_buf();
    let files: Vec<std::path::PathBuf> =
        ["tests/fixtures/ok/volume3d.cvnn", "tests/fixtures/ok/mri_volume_tiny.cvnn"]
            .iter()
            .map(|f| root.join(f))
            .collect();
    each_file(&files, forward_backward);
    each_file(&files, train_two_steps);
}

/// Unit roundoff of the format a precision rounds to: bf16 keeps 8 significant bits (2⁻⁸),
/// fp16 and TF32 11 (2⁻¹¹), fp32 24.
fn unit_roundoff(p: Precision) -> f64 {
    match p {
        Precision::Fp32 => 2f64.powi(-24),
        Precision::Tf32 | Precision::Fp16 => 2f64.powi(-11),
        Precision::Bf16 => 2f64.powi(-8),
    }
}

/// The extra rounding of a precision for the local checks: the operands of every
/// contraction (TF32 at `tf32`; at bf16 and fp16 their own 16-bit format, or TF32 under the
/// kernel choice `tc16=tf32`), and the 16-bit store of bf16/fp16 values.
fn numerics_of(p: Precision, kernels: &KernelConfig) -> cvc_tests::differential::Numerics {
    let operand = match p {
        // (`auto` and `wgmma`: the 16-bit products, and TF32 ones where a product has no
        // complex 16-bit operand, which the 16-bit format's bound holds too.)
        Precision::Bf16 | Precision::Fp16 if kernels.tc16 != TcHalf::Tf32 => unit_roundoff(p),
        // `wgmma` (the default on an H200) reads f32 operands as TF32 by truncation: twice
        // rounding's unit.
        _ if p.tensor_cores() && kernels.tc_mma == TcMma::Wgmma => 2.0 * unit_roundoff(Precision::Tf32),
        // fp32 on split TF32 operands (`fp32=3xtf32`): the dropped low·low product and the
        // low parts' rounding, at most 3·2⁻²² of |a||b| (= 2·u for u = 2⁻²¹).
        Precision::Fp32 if kernels.fp32_products == Fp32Products::Tf32x3 => 2f64.powi(-21),
        _ if p.tensor_cores() => unit_roundoff(Precision::Tf32),
        _ => 0.0,
    };
    let store = if p.storage().is_half() { unit_roundoff(p) } else { 0.0 };
    let max_finite = if p == Precision::Fp16 { 65504.0 } else { 0.0 };
    cvc_tests::differential::Numerics { operand, store, max_finite }
}

/// End-to-end tolerance of the per-kernel test's output check: a gross-error bound only (half
/// the outputs' size is off: a wrong kernel). How far rounding carries to the outputs depends
/// on the network's depth and conditioning (a 64-step GRU in bf16: 13% of the logits' norm),
/// which `reduced_precision_end_to_end_error_report` measures; the kernels themselves are
/// checked within their format.
const END_TO_END_GROSS: f64 = 0.5;

/// Every example (and with `CVC_PRECISION_FIXTURES=1` every fixture) trained one step (SGD,
/// lr 1) in TF32, bf16 and fp16 on the GPU, checked kernel by kernel against the f64
/// interpreter replaying it on the device's own operands (`check_training_steps_with`): each
/// stored value within the f32 bound of the replay plus its format's rounding, `2·u_op·Σ|a||b|`
/// for a contraction's operands rounded to TF32 or to the 16-bit format ([`numerics_of`]),
/// and `u·|x|` for a value stored in bf16 (u = 2⁻⁸) or fp16
/// (2⁻¹¹), an fp16 element beyond 65504 stored as an infinity accepted (the loss scaler then
/// skips the step); the outputs and loss end to end within [`END_TO_END_GROSS`] where no
/// decision lies between them and the leaves; the program's plan against the keep-everything
/// plan as in fp32. Files are limited to paths containing one of the comma-separated
/// `CVC_PRECISION_FILES` when set, precisions to those of `CVC_PRECISION_LIST` (default
/// `tf32,bf16,fp16`).
#[test]
fn reduced_precision_kernels_match_the_interpreter_within_their_format() {
    if !gpu_or_skip() {
        return;
    }
    let filter = std::env::var("CVC_PRECISION_FILES").unwrap_or_default();
    let mut files = examples();
    if std::env::var("CVC_PRECISION_FIXTURES").as_deref() == Ok("1") {
        files.extend(cvnn_files("tests/fixtures/ok"));
    }
    files.retain(|p| filter.split(',').any(|f| p.to_string_lossy().contains(f)));
    let precisions = precisions_of("CVC_PRECISION_LIST", "tf32,bf16,fp16");
    let mut rng = SplitMix64::new(seed_for("gpu::reduced_precision_local"));
    let mut failures = Vec::new();
    for path in &files {
        for &precision in &precisions {
            let sgd = Optimizer {
                kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false },
                lr: 1.0,
                weight_decay: 0.0,
            };
            let ex = load_stored(path, batch_for(path), Some(sgd), precision.storage());
            let make = |p: &Program| -> Result<Box<dyn Backend>, String> {
                let be = CudaBackend::new(p, precision, &kernels()).map_err(|e| e.0)?;
                Ok(Box::new(be))
            };
            let end_tol = END_TO_END_GROSS;
            let fails = cvc_tests::differential::check_training_steps_with(
                &ex.program,
                &make,
                1,
                PLAN_TOL,
                &mut rng,
                numerics_of(precision, &kernels()),
                end_tol,
            )
            .unwrap_or_else(|e| panic!("{} {precision:?}: {e}", ex.name));
            println!("{} {precision:?}: {} mismatches", ex.name, fails.len());
            failures.extend(fails.into_iter().map(|f| format!("{} {precision:?}: {f}", ex.name)));
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// How far a reduced-precision step lands from the f64 step, end to end (printed for
/// bench/RESULTS.md; the per-kernel check above is the strict one): one SGD step (lr 1) of
/// every example and fixture in TF32, bf16 and fp16 from the same f32-rounded leaves, the
/// outputs' and the whole gradient's norm-wise relative error in unit roundoffs. Kinks (ReLU,
/// max-pool, magnitude) that flip under rounding move a few elements by their whole size, so
/// this error is not bounded by a multiple of `u`; the test fails only on a gross error (the
/// outputs or gradient off by half their size), which a wrong kernel makes. fp16 steps skipped
/// by the loss scaler are repeated with the halved scale (up to 8 times).
#[test]
fn reduced_precision_end_to_end_error_report() {
    use cvc_compiler::passes::optimizer::{LOSS_SCALE, SKIPPED};
    if !gpu_or_skip() {
        return;
    }
    let filter = std::env::var("CVC_PRECISION_FILES").unwrap_or_default();
    let mut files = examples();
    files.extend(cvnn_files("tests/fixtures/ok"));
    files.retain(|p| p.to_string_lossy().contains(&filter));
    let mut rng = SplitMix64::new(seed_for("gpu::reduced_precision"));
    let mut failures = Vec::new();
    for path in &files {
        let name = path.display().to_string();
        let src = std::fs::read_to_string(path).expect("readable .cvnn");
        let mut checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        if checked.graph.loss.is_none() {
            checked = check_source(&name, &src, Mode::Eval).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        }
        let batch = batch_for(path);
        let sgd = Optimizer {
            kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false },
            lr: 1.0,
            weight_decay: 0.0,
        };
        let base = Options { batch, optimizer: sgd, ..Options::default() };
        let g = &checked.graph;
        let probe = compile(g.clone(), &base).unwrap_or_else(|e| panic!("{name}: {e}"));
        let named = cvc_tests::differential::random_leaves(&probe.graph, batch, &mut rng);
        let named: HashMap<String, Tensor> = named
            .into_iter()
            .map(|(v, t)| (probe.graph.leaf_name(v).expect("leaf").to_string(), t))
            .collect();
        for precision in [Precision::Tf32, Precision::Bf16, Precision::Fp16] {
            let opts = Options { half: precision.storage(), ..base.clone() };
            let program = compile(g.clone(), &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
            let pg = &program.graph;
            // (fp16 adds the loss-scale state and unscaled gradients: a tiny model's arena can
            // grow by those few hundred bytes. A toy bf16 plan can also be slightly larger, where
            // fp32's cheap recomputation finds a trial and bf16's none: `norms.cvnn`, 12,800
            // against 12,288 bytes; `passes::bf16_plans_are_no_larger_than_fp32_plans` bounds
            // that on the CPU.)
            if precision == Precision::Bf16 {
                assert!(
                    program.plan.arena_bytes <= probe.plan.arena_bytes + 1024,
                    "{name} {precision:?}: arena grew from {} to {} bytes",
                    probe.plan.arena_bytes,
                    program.plan.arena_bytes
                );
            }
            // The same leaves by name; leaves only this program has (the loss-scale state)
            // take their initial values.
            let mut leaves = cvc_tests::differential::random_leaves(pg, batch, &mut SplitMix64::new(0));
            for (v, t) in leaves.iter_mut() {
                if let Some(x) = pg.leaf_name(*v).and_then(|n| named.get(n)) {
                    *t = x.clone();
                }
            }
            let want = match cvc_compiler::interp::evaluate(pg, batch, &leaves) {
                Ok(w) => w,
                Err(e) => panic!("{name}: interpreter: {e}"),
            };
            let mut be =
                CudaBackend::new(&program, precision, &kernels()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut tries = 0;
            loop {
                for (&v, t) in &leaves {
                    if program.plan.slot(v).is_some() {
                        be.upload(v, &to_host(t)).unwrap_or_else(|e| panic!("{name}: upload: {}", e.0));
                    }
                }
                be.step().unwrap_or_else(|e| panic!("{name} {precision:?}: step: {}", e.0));
                let (Some(scale), Some(skipped)) = (pg.find_leaf(LOSS_SCALE), pg.find_leaf(SKIPPED)) else {
                    break;
                };
                let k = be.download(skipped).expect("download").f32s()[0];
                if k == 0.0 || tries == 8 {
                    break;
                }
                tries += 1;
                let halved = from_host(&be.download(scale).expect("download"));
                println!(
                    "{name} {precision:?}: step skipped by the loss scaler, again with scale {halved:?}"
                );
                leaves.insert(scale, halved);
            }
            let u = unit_roundoff(precision);
            let mut worst: (f64, String) = (0.0, String::new());
            let mut ends: Vec<(String, Value)> =
                pg.outputs.iter().map(|o| (o.name.clone(), o.value)).collect();
            ends.extend(pg.loss.map(|l| ("loss".to_string(), l)));
            for (what, v) in ends {
                let (Some(w), true) = (want[v.index()].as_ref(), program.plan.slot(v).is_some()) else {
                    continue;
                };
                if w.dtype() == DType::I32 {
                    continue;
                }
                let got = from_host(&be.download(v).expect("download"));
                let e = cvc_tests::differential::rel_err(&got, w);
                if e > worst.0 || e.is_nan() {
                    worst = (e, format!("output {what}"));
                }
            }
            let (mut diff2, mut norm2) = (0.0f64, 0.0f64);
            for (assign, target) in pg.assigns() {
                if !pg.is_param(target) || program.plan.slot(target).is_none() {
                    continue;
                }
                let (Some(w), Some(old)) = (want[assign.index()].as_ref(), leaves.get(&target)) else {
                    continue;
                };
                let got = from_host(&be.download(target).expect("download"));
                let old = old.to_complex_vec();
                for ((a, b), o) in got.to_complex_vec().iter().zip(w.to_complex_vec()).zip(&old) {
                    diff2 += (a - b).norm_sqr();
                    norm2 += (b - o).norm_sqr();
                }
            }
            let grad_err = if norm2 > 0.0 { (diff2 / norm2).sqrt() } else { diff2.sqrt() };
            if worst.0.is_nan() || worst.0 > 0.5 || grad_err.is_nan() || grad_err > 0.5 {
                failures.push(format!(
                    "{name} {precision:?}: {} {:.2e}, gradient {grad_err:.2e}",
                    worst.1, worst.0
                ));
            }
            println!(
                "{name} {precision:?}: {} values in 16 bits, arena {} vs fp32 {}; outputs {:.2e} ({:.1} u, {}); \
                 gradient {grad_err:.2e} ({:.1} u)",
                pg.nodes.handles().filter(|&v| pg.storage(v).is_half()).count(),
                program.plan.arena_bytes,
                probe.plan.arena_bytes,
                worst.0,
                worst.0 / u,
                worst.1,
                grad_err / u,
            );
        }
    }
    assert!(failures.is_empty(), "{} gross errors:\n{}", failures.len(), failures.join("\n"));
}

/// H200 SXM peaks the roofline is measured against: fp32 FMA 67 TFLOP/s, TF32 tensor cores
/// 495 TFLOP/s (dense), HBM3e 4.8 TB/s (NVIDIA's data sheet).
const H200_FP32_TFLOPS: f64 = 67.0;
const H200_TF32_TFLOPS: f64 = 495.0;
const H200_TBPS: f64 = 4.8;

/// Real floating-point operations of a contraction node (a complex multiply-add is 8, real ×
/// complex 4, real 2), from its operand shapes; 0 for other ops.
fn contraction_flops(g: &Graph, v: Value, batch: usize) -> f64 {
    let n = g.node(v);
    let numel = |x: Value| g.ty(x).shape.numel(batch) as f64;
    let dims = |x: Value| g.ty(x).shape.resolve(batch);
    let per_mac = |a: Value, b: Value| match (g.ty(a).dtype, g.ty(b).dtype) {
        (DType::C64, DType::C64) => 8.0,
        (DType::C64, _) | (_, DType::C64) => 4.0,
        _ => 2.0,
    };
    let (a, b) = match n.inputs[..] {
        [a, b, ..] => (a, b),
        _ => return 0.0,
    };
    let taps = |w: &[usize]| w.iter().skip(1).product::<usize>() as f64; // Cg·kh·kw
    let macs = match &n.op {
        // out[N, O, Ho, Wo] · Cg·kh·kw
        Op::Conv2d { .. } => numel(v) * taps(&dims(b)),
        // every input element meets Cg·kh·kw weights
        Op::ConvTranspose2d { .. } => numel(a) * taps(&dims(b)),
        // dy[N, O, Ho, Wo] · Cg·kh·kw (the weight gradient's shape after O)
        Op::Conv2dWeightGrad { .. } => numel(b) * taps(&dims(v)),
        // every element of `a` meets the output's columns
        Op::MatMul { .. } => numel(a) * dims(v).last().copied().unwrap_or(1) as f64,
        _ => return 0.0,
    };
    macs * per_mac(a, b)
}

/// The roofline of one profiled step: per kernel kind, time, achieved TFLOP/s (contractions)
/// and GB/s (bytes of every buffer the kernels read and write once: a lower bound of their
/// traffic), against the H200's peaks. `prof` is `profile_step`'s `(kernel, ms)` list, whose
/// names are `k{group}_{kind}` as code generation gives them.
fn roofline(p: &Program, prof: &[(String, f64)], precision: Precision) -> String {
    let g = &p.graph;
    let batch = p.plan.batch;
    let mut kinds: Vec<(String, f64, f64, f64, usize)> = Vec::new(); // kind, ms, flops, bytes, launches
    for (name, ms) in prof {
        let Some(gi) =
            name.strip_prefix('k').and_then(|r| r.split('_').next()).and_then(|x| x.parse::<usize>().ok())
        else {
            continue;
        };
        let Some(grp) = p.groups.get(gi) else { continue };
        let flops: f64 = grp.nodes.iter().map(|&v| contraction_flops(g, v, batch)).sum();
        let bytes: f64 = grp.inputs.iter().chain(&grp.outputs).map(|&v| g.bytes(v, batch) as f64).sum();
        let kind = name.rsplit('_').next().unwrap_or("?").to_string();
        match kinds.iter_mut().find(|k| k.0 == kind) {
            Some(k) => {
                k.1 += ms;
                k.2 += flops;
                k.3 += bytes;
                k.4 += 1;
            }
            None => kinds.push((kind, *ms, flops, bytes, 1)),
        }
    }
    let peak_tf = if precision.tensor_cores() { H200_TF32_TFLOPS } else { H200_FP32_TFLOPS };
    let mut s = format!(
        "roofline ({precision:?}; peaks {peak_tf} TFLOP/s, {H200_TBPS} TB/s):\n  {:<6} {:>8} {:>9} {:>10} {:>8} {:>10} {:>8}\n",
        "kind", "launches", "ms", "TFLOP/s", "% peak", "GB/s", "% peak"
    );
    kinds.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (kind, ms, flops, bytes, n) in kinds {
        let secs = ms / 1e3;
        let tf = flops / secs / 1e12;
        let gbs = bytes / secs / 1e9;
        s.push_str(&format!(
            "  {kind:<6} {n:>8} {ms:>9.3} {:>10} {:>8} {gbs:>10.1} {:>7.1}%\n",
            if flops > 0.0 { format!("{tf:.2}") } else { "-".into() },
            if flops > 0.0 { format!("{:.1}%", 100.0 * tf / peak_tf) } else { "-".into() },
            100.0 * gbs / (H200_TBPS * 1e3)
        ));
    }
    s
}

/// The roofline of a profile `bench_seed_cnn` printed (`CVC_PROFILE_LOG`: its stderr, the
/// `every launch, in order:` list of its first precision block; `CVC_PROFILE_PRECISION`, default
/// fp32), for the same program (`CVC_BENCH_FILE`, `CVC_BENCH_BATCH`) compiled here (no GPU
/// needed: the plan is deterministic).
#[test]
#[ignore = "reads a profile log of bench_seed_cnn"]
fn roofline_of_a_profile_log() {
    let log = std::env::var("CVC_PROFILE_LOG").expect("CVC_PROFILE_LOG");
    let precision = Precision::from_name(&std::env::var("CVC_PROFILE_PRECISION").unwrap_or("fp32".into()))
        .expect("a precision");
    let text = std::fs::read_to_string(&log).expect("readable log");
    let after = text.split("every launch, in order:").nth(1).expect("a profile in the log");
    let prof: Vec<(String, f64)> = after
        .lines()
        .skip(1) // the rest of the marker's line
        .map_while(|l| {
            let mut w = l.split_whitespace();
            let ms = w.next()?.parse::<f64>().ok()?;
            (w.next()? == "ms").then_some(())?;
            Some((w.next()?.to_string(), ms))
        })
        .collect();
    assert!(!prof.is_empty(), "no launches parsed");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("root").to_path_buf();
    let batch = std::env::var("CVC_BENCH_BATCH").ok().and_then(|s| s.parse().ok()).unwrap_or(1024);
    let file = std::env::var("CVC_BENCH_FILE").unwrap_or_else(|_| "examples/seed_cnn.cvnn".into());
    let ex = load_stored(&root.join(file), batch, None, precision.storage());
    print!("{}", roofline(&ex.program, &prof, precision));
}
