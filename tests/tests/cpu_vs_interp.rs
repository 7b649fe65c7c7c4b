//! Differential tests: the CPU back end (Cranelift JIT + GEMM) against the f64 reference
//! interpreter, on small graphs of every primitive op and on every example and fixture
//! network (forward outputs, loss, parameter gradients). Fresh random inputs each run; the
//! seed is printed (set `CVC_SEED` to replay). Tolerance: ‖cpu − ref‖ / ‖ref‖ ≤ 1e-4.

use cvc_compiler::interp::{evaluate, SplitMix64, Tensor, TensorData};
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::*;
use cvc_compiler::passes::fusion::unfused;
use cvc_compiler::passes::memplan::bump;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;
use cvc_runtime::backend::{Backend, HostData, HostTensor};
use cvc_runtime::cpu::CpuBackend;
use num_complex::Complex64;
use std::collections::HashMap;

const TOL: f64 = 1e-4;

fn seed() -> u64 {
    let s = std::env::var("CVC_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7)
    });
    println!("seed {s} (replay with CVC_SEED={s})");
    s
}

/// Random leaf values: inputs normal; parameters their initialiser plus normal noise (so zero
/// biases still test their broadcasting); state its initialiser (moments, running statistics
/// and step counters must be meaningful); labels in range of the one-hot that reads them.
fn random_leaves(g: &Graph, batch: usize, rng: &mut SplitMix64) -> HashMap<Value, Tensor> {
    let users = g.users();
    let mut leaves = HashMap::new();
    for (h, n) in g.nodes.iter() {
        let shape = n.ty.shape.resolve(batch);
        match &n.op {
            Op::Input { .. } => {}
            Op::State { init, .. } => {
                leaves.insert(h, cvc_compiler::interp::init_tensor(init, n.ty.dtype, &shape, rng));
                continue;
            }
            Op::Param { init, .. } => {
                let mut t = cvc_compiler::interp::init_tensor(init, n.ty.dtype, &shape, rng);
                match &mut t.data {
                    TensorData::Real(v) => v.iter_mut().for_each(|x| *x += 0.1 * rng.normal()),
                    TensorData::Complex(v) => v
                        .iter_mut()
                        .for_each(|z| *z += Complex64::new(0.1 * rng.normal(), 0.1 * rng.normal())),
                    TensorData::Int(_) => {}
                }
                leaves.insert(h, t);
                continue;
            }
            _ => continue,
        }
        let count: usize = shape.iter().product();
        let t = match n.ty.dtype {
            DType::F32 => {
                Tensor { shape, data: TensorData::Real((0..count).map(|_| rng.normal()).collect()) }
            }
            DType::C64 => Tensor {
                shape,
                data: TensorData::Complex(
                    (0..count).map(|_| Complex64::new(rng.normal(), rng.normal())).collect(),
                ),
            },
            DType::I32 => {
                let classes = users[h.index()]
                    .iter()
                    .find_map(|&u| match g.node(u).op {
                        Op::OneHot { classes } => Some(classes),
                        _ => None,
                    })
                    .unwrap_or(1000);
                let data = (0..count).map(|_| (rng.next_u64() % classes as u64) as i64).collect();
                Tensor { shape, data: TensorData::Int(data) }
            }
        };
        leaves.insert(h, t);
    }
    leaves
}

/// f64 → the f32 host layout; f32-rounded back into the leaves so both sides see the same input.
fn to_host(t: &Tensor, dtype: DType) -> HostTensor {
    let data = match &t.data {
        TensorData::Real(v) => HostData::F32(v.iter().map(|&x| x as f32).collect()),
        TensorData::Complex(v) => HostData::F32(v.iter().flat_map(|z| [z.re as f32, z.im as f32]).collect()),
        TensorData::Int(v) => HostData::I32(v.iter().map(|&x| x as i32).collect()),
    };
    HostTensor { dtype, shape: t.shape.clone(), data }
}

fn round_f32(t: &mut Tensor) {
    match &mut t.data {
        TensorData::Real(v) => v.iter_mut().for_each(|x| *x = *x as f32 as f64),
        TensorData::Complex(v) => {
            v.iter_mut().for_each(|z| *z = Complex64::new(z.re as f32 as f64, z.im as f32 as f64))
        }
        TensorData::Int(_) => {}
    }
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

/// Reference norms below this are compared absolutely: such values are zero in exact
/// arithmetic (the gradient of a bias that batch norm removes) and f32 rounding noise is all
/// either side can show.
const NORM_FLOOR: f64 = 1e-3;

/// ‖a − b‖ / max(‖b‖, [`NORM_FLOOR`]).
fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    num / norm(b).max(NORM_FLOOR)
}

fn norm(b: &[f64]) -> f64 {
    b.iter().map(|y| y * y).sum::<f64>().sqrt()
}

/// Runs one step on the CPU and the interpreter and compares `check` (value, label) pairs.
/// An `Assign` is checked through its target's buffer after the step.
fn compare(
    program: &Program,
    check: &[(Value, String)],
    rng: &mut SplitMix64,
) -> Result<Vec<String>, String> {
    compare_norms(program, check, rng).map(|(f, _)| f)
}

/// As [`compare`], also returning the labels whose reference norm is below [`NORM_FLOOR`].
fn compare_norms(
    program: &Program,
    check: &[(Value, String)],
    rng: &mut SplitMix64,
) -> Result<(Vec<String>, Vec<String>), String> {
    let g = &program.graph;
    let batch = program.plan.batch;
    let mut leaves = random_leaves(g, batch, rng);
    leaves.values_mut().for_each(round_f32);
    let want = evaluate(g, batch, &leaves)?;
    let mut cpu = CpuBackend::new(program).map_err(|e| e.0)?;
    for (&v, t) in &leaves {
        if program.plan.slot(v).is_some() {
            cpu.upload(v, &to_host(t, g.ty(v).dtype)).map_err(|e| e.0)?;
        }
    }
    cpu.step().map_err(|e| e.0)?;
    println!("{}: comparing {} values", g.name, check.len());
    let mut failures = Vec::new();
    let mut degenerate = Vec::new();
    for (v, label) in check {
        let read = if matches!(g.node(*v).op, Op::Assign) { g.node(*v).inputs[0] } else { *v };
        let got = host_flat(&cpu.download(read).map_err(|e| e.0)?);
        let exp = flat(want[v.index()].as_ref().ok_or("interpreter made no value")?);
        let e = rel_err(&got, &exp);
        if e.is_nan() || e > TOL {
            failures.push(format!("{label} ({v} = {}): relative error {e:.3e}", g.node(*v).op.mnemonic()));
        }
        if norm(&exp) < NORM_FLOOR {
            degenerate.push(label.clone());
        }
    }
    Ok((failures, degenerate))
}

/// Every non-leaf value of `g`, unfused and bump-planned (each value materialised).
fn unfused_program(g: Graph, batch: usize) -> Program {
    let fusion = unfused(&g);
    let order: Vec<usize> = (0..fusion.groups.len()).collect();
    let plan = bump(&g, &fusion, &order, batch);
    Program { graph: g, groups: fusion.groups, order, plan, facts: Default::default() }
}

fn all_computed(p: &Program) -> Vec<(Value, String)> {
    let mat = p.plan.slots.iter().map(|s| s.is_some()).collect::<Vec<_>>();
    p.graph
        .nodes
        .iter()
        .filter(|(h, n)| !n.op.is_leaf() && (mat[h.index()] || matches!(n.op, Op::Assign)))
        .map(|(h, n)| (h, n.origin.label.clone()))
        .collect()
}

/// Builds a graph with `f`, then checks every computed value unfused, and the outputs fused.
fn check_graph(name: &str, batch: usize, f: impl Fn(&mut Builder) -> Result<Vec<Value>, String>) {
    let mut rng = SplitMix64::new(seed());
    let mut g = Graph::new(name, Mode::Eval);
    let outs = {
        let mut b = Builder::new(&mut g);
        f(&mut b).unwrap_or_else(|e| panic!("{name}: building the graph: {e}"))
    };
    for (i, v) in outs.iter().enumerate() {
        g.outputs.push(Output { name: format!("out{i}"), value: *v });
    }
    let p = unfused_program(g.clone(), batch);
    let failures = compare(&p, &all_computed(&p), &mut rng).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(failures.is_empty(), "{name} (unfused):\n{}", failures.join("\n"));
    let opts = Options { batch, fuse: true, ..Options::default() };
    let fused = compile(g, &opts).unwrap_or_else(|e| panic!("{name}: pipeline: {e}"));
    let outs: Vec<(Value, String)> = fused.graph.outputs.iter().map(|o| (o.value, o.name.clone())).collect();
    let failures = compare(&fused, &outs, &mut rng).unwrap_or_else(|e| panic!("{name} (fused): {e}"));
    assert!(failures.is_empty(), "{name} (fused):\n{}", failures.join("\n"));
}

fn input(b: &mut Builder, name: &str, dtype: DType, dims: &[Dim]) -> Value {
    b.leaf(Op::Input { name: name.into() }, TensorType::new(dtype, Shape(dims.to_vec())))
}

fn param(b: &mut Builder, name: &str, dtype: DType, dims: &[usize]) -> Value {
    b.leaf(Op::Param { name: name.into(), init: Init::Zeros }, TensorType::new(dtype, Shape::fixed(dims)))
}

use Dim::{Batch as B, Fixed as F};

#[test]
fn unary_ops_real() {
    check_graph("unary_real", 3, |b| {
        let x = input(b, "x", DType::F32, &[B, F(5), F(7)]);
        let sq = b.unary(UnaryOp::Abs2, x)?;
        let half = b.scalar(0.5, 0);
        let pos = b.add2(sq, half)?;
        let mut outs = Vec::new();
        use UnaryOp::*;
        for op in [
            Neg, Conj, Real, Imag, Abs, Abs2, Angle, ToComplex, Exp, Sin, Cos, Tanh, Sigmoid, Relu, Step,
            Gelu, GeluGrad, StopGrad,
        ] {
            outs.push(b.unary(op, x)?);
        }
        for op in [Log, Sqrt, Rsqrt, Recip] {
            outs.push(b.unary(op, pos)?);
        }
        Ok(outs)
    });
}

#[test]
fn unary_ops_complex() {
    check_graph("unary_complex", 2, |b| {
        let z = input(b, "z", DType::C64, &[B, F(3), F(4)]);
        use UnaryOp::*;
        [Neg, Conj, Real, Imag, Abs, Abs2, Angle, StopGrad].into_iter().map(|op| b.unary(op, z)).collect()
    });
}

#[test]
fn binary_ops_broadcast_and_mixed() {
    check_graph("binary", 3, |b| {
        let xr = input(b, "xr", DType::F32, &[B, F(4), F(5)]);
        let xc = input(b, "xc", DType::C64, &[B, F(4), F(5)]);
        let yr = input(b, "yr", DType::F32, &[F(4), F(1)]);
        let yc = input(b, "yc", DType::C64, &[F(5)]);
        let mut outs = Vec::new();
        use BinaryOp::*;
        for op in [Add, Sub, Mul, Div] {
            for (p, q) in [(xr, yr), (xr, yc), (xc, yr), (xc, yc), (yr, xc), (yc, xr)] {
                outs.push(b.binary(op, p, q)?);
            }
        }
        outs.push(b.binary(Max, xr, yr)?);
        outs.push(b.binary(Greater, xr, yr)?);
        outs.push(b.binary(Equal, xr, xr)?);
        outs.push(b.binary(Complex, xr, yr)?);
        let cond = b.unary(UnaryOp::Step, xr)?;
        outs.push(b.add(Op::Select, &[cond, xc, yr])?);
        outs.push(b.add(Op::Select, &[yr, xr, xr])?);
        Ok(outs)
    });
}

#[test]
fn reductions() {
    check_graph("reduce", 3, |b| {
        let x = input(b, "x", DType::F32, &[B, F(4), F(5), F(6)]);
        let z = input(b, "z", DType::C64, &[B, F(4), F(5), F(6)]);
        let mut outs = Vec::new();
        for axes in [vec![0], vec![1], vec![3], vec![0, 2, 3], vec![1, 2], vec![0, 1, 2, 3]] {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::MaxMag] {
                outs.push(b.add(Op::Reduce { op, axes: axes.clone() }, &[x])?);
            }
            for op in [ReduceOp::Sum, ReduceOp::MaxMag] {
                outs.push(b.add(Op::Reduce { op, axes: axes.clone() }, &[z])?);
            }
        }
        // An elementwise prologue that fuses into the reduction.
        let e = b.unary(UnaryOp::Exp, x)?;
        let s = b.scalar(2.0, -1);
        let m = b.mul(e, s)?;
        outs.push(b.sum(m, &[1, 3])?);
        Ok(outs)
    });
}

#[test]
fn movement_ops() {
    check_graph("movement", 2, |b| {
        let x = input(b, "x", DType::C64, &[B, F(3), F(4)]);
        let r = input(b, "r", DType::F32, &[B, F(3), F(2)]);
        let v = input(b, "v", DType::F32, &[F(3), F(1)]);
        let labels = input(b, "labels", DType::I32, &[B]);
        let step = b.leaf(
            Op::State { name: "t".into(), init: Init::Zeros },
            TensorType::new(DType::I32, Shape::scalar()),
        );
        let mut outs = vec![
            b.expand(v, Shape(vec![B, F(3), F(5)]))?,
            b.add(Op::Permute { perm: vec![2, 0, 1] }, &[x])?,
            b.add(Op::Slice { axis: 2, start: 1, len: 2 }, &[x])?,
            b.add(Op::Pad { axis: 1, before: 2, after: 1 }, &[x])?,
            b.add(Op::Concat { axis: 2 }, &[x, r, x])?,
            b.add(Op::OneHot { classes: 5 }, &[labels])?,
            b.add_shaped(Op::DropoutMask { p: 0.3, salt: 17 }, &[step], Some(&Shape(vec![B, F(3), F(4)])))?,
        ];
        for (axis, inverse, norm) in
            [(2, false, FftNorm::Backward), (1, true, FftNorm::Ortho), (1, false, FftNorm::Forward)]
        {
            outs.push(b.add(Op::Fft { axis, inverse, norm }, &[x])?);
        }
        let flat = b.reshape(x, Shape(vec![B, F(12)]))?;
        outs.push(b.unary(UnaryOp::Conj, flat)?);
        Ok(outs)
    });
}

#[test]
fn matmul_all_forms() {
    check_graph("matmul", 2, |b| {
        let mut outs = Vec::new();
        for (da, db) in [
            (DType::F32, DType::F32),
            (DType::C64, DType::C64),
            (DType::F32, DType::C64),
            (DType::C64, DType::F32),
        ] {
            for trans in [[false, false], [true, false], [false, true], [true, true]] {
                for conj in [[false, false], [true, false], [false, true]] {
                    let (m, k, n) = (7, 19, 9);
                    let sa = if trans[0] { [k, m] } else { [m, k] };
                    let sb = if trans[1] { [n, k] } else { [k, n] };
                    let a = param(b, "a", da, &sa);
                    let bb = param(b, "b", db, &sb);
                    outs.push(b.add(Op::MatMul { trans, conj }, &[a, bb])?);
                }
            }
        }
        Ok(outs)
    });
}

fn geoms() -> Vec<ConvGeom> {
    vec![
        ConvGeom { stride: [1, 1], pad: [1, 1], dilation: [1, 1], groups: 1 },
        ConvGeom { stride: [2, 1], pad: [0, 2], dilation: [1, 2], groups: 1 },
        ConvGeom { stride: [1, 2], pad: [1, 0], dilation: [1, 1], groups: 2 },
        ConvGeom { stride: [1, 1], pad: [0, 0], dilation: [1, 1], groups: 1 },
    ]
}

#[test]
fn convolutions() {
    check_graph("conv", 3, |b| {
        let mut outs = Vec::new();
        for (gi, geom) in geoms().into_iter().enumerate() {
            let (c, o, h, w) = (4, 6, 9, 8);
            let (kh, kw) = if gi == 3 { (1, 1) } else { (3, 2) };
            for (dx, dw) in [
                (DType::F32, DType::F32),
                (DType::C64, DType::C64),
                (DType::F32, DType::C64),
                (DType::C64, DType::F32),
            ] {
                for conj in [[false, false], [true, true]] {
                    let x = input(b, "x", dx, &[B, F(c), F(h), F(w)]);
                    let wt = param(b, "w", dw, &[o, c / geom.groups, kh, kw]);
                    let y = b.add(Op::Conv2d { geom, conj }, &[x, wt])?;
                    outs.push(y);
                    let ty = b.graph.ty(y).shape.clone();
                    let dy = input(b, "dy", dw, &ty.0);
                    outs.push(b.add(Op::ConvTranspose2d { geom, out_hw: [h, w], conj }, &[dy, wt])?);
                    outs.push(b.add(Op::Conv2dWeightGrad { geom, kernel: [kh, kw], conj }, &[x, dy])?);
                }
            }
        }
        Ok(outs)
    });
}

#[test]
fn assign_updates_persistent_buffers() {
    check_graph("assign", 2, |b| {
        let p = param(b, "p", DType::C64, &[3, 4]);
        let x = input(b, "x", DType::F32, &[F(3), F(4)]);
        let lr = b.scalar(0.1, 0);
        let d = b.mul(x, lr)?;
        let newp = b.sub(p, d)?;
        let a = b.add(Op::Assign, &[p, newp])?;
        let s = b.sum(newp, &[0, 1])?;
        let _ = a;
        Ok(vec![s])
    });
}

/// The `.cvnn` files of the examples and the passing fixtures.
fn network_files() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in ["examples", "tests/fixtures/ok"] {
        if let Ok(rd) = std::fs::read_dir(root.join(dir)) {
            for e in rd.flatten() {
                if e.path().extension().is_some_and(|x| x == "cvnn") {
                    files.push(e.path());
                }
            }
        }
    }
    files.sort();
    files
}

/// Forward outputs, loss and every parameter gradient of a training graph (autodiff run, every
/// value materialised), then the whole fused training step (outputs, loss and the updated
/// parameters and optimizer state written by `Assign`), CPU vs interpreter.
fn check_network(path: &std::path::Path, batch: usize, rng: &mut SplitMix64) -> Vec<String> {
    let name = path.display().to_string();
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let check_in = |mode| match cvc_compiler::front::check_source(&name, &src, mode) {
        Ok(c) => c,
        Err(d) => panic!("{name}: does not check: {:?}", d.first().map(|d| d.message.clone())),
    };
    let mut checked = check_in(Mode::Train);
    if checked.graph.loss.is_none() {
        // A model without a loss has no training step: check its inference graph.
        checked = check_in(Mode::Eval);
    }
    let mut fails = Vec::new();
    let mut g = checked.graph.clone();
    cvc_compiler::passes::cast::run(&mut g).unwrap_or_else(|e| panic!("{name}: cast: {e}"));
    let mut check: Vec<(Value, String)> =
        g.outputs.iter().map(|o| (o.value, format!("output {}", o.name))).collect();
    if g.mode == Mode::Train && g.loss.is_some() {
        let ad =
            cvc_compiler::passes::autodiff::run(&mut g).unwrap_or_else(|e| panic!("{name}: autodiff: {e}"));
        for (p, dp) in ad.grads {
            check.push((dp, format!("grad {}", g.leaf_name(p).unwrap_or("?"))));
        }
    }
    if let Some(l) = g.loss {
        check.push((l, "loss".into()));
    }
    let p = unfused_program(g, batch);
    if std::env::var_os("CVC_DIFF_ALL").is_some() {
        // Debugging aid: compare every value, to find the first op that differs.
        check = all_computed(&p);
    }
    // Parameters whose gradient is zero in exact arithmetic: their optimizer update divides
    // rounding noise by rounding noise (Adam), so it is not compared.
    let mut degenerate_params = Vec::new();
    match compare_norms(&p, &check, rng) {
        Ok((f, d)) => {
            fails.extend(f.into_iter().map(|f| format!("{name} (unfused): {f}")));
            degenerate_params
                .extend(d.into_iter().filter_map(|l| l.strip_prefix("grad ").map(str::to_string)));
        }
        Err(e) => fails.push(format!("{name} (unfused): {e}")),
    }
    let opts = Options { batch, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let prog = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: pipeline: {e}"));
    let mut check: Vec<(Value, String)> =
        prog.graph.outputs.iter().map(|o| (o.value, format!("output {}", o.name))).collect();
    if let Some(l) = prog.graph.loss {
        check.push((l, "loss".into()));
    }
    for (h, n) in prog.graph.nodes.iter() {
        if matches!(n.op, Op::Assign) {
            let target = prog.graph.leaf_name(n.inputs[0]).unwrap_or("?");
            let skip = degenerate_params.iter().any(|p| target == p || target.starts_with(&format!("{p}.")));
            if !skip {
                check.push((h, format!("update of {target}")));
            }
        }
    }
    let check: Vec<(Value, String)> = check
        .into_iter()
        .filter(|(v, _)| matches!(prog.graph.node(*v).op, Op::Assign) || prog.plan.slot(*v).is_some())
        .collect();
    match compare(&prog, &check, rng) {
        Ok(f) => fails.extend(f.into_iter().map(|f| format!("{name} (fused step): {f}"))),
        Err(e) => fails.push(format!("{name} (fused step): {e}")),
    }
    fails
}

/// The networks checked one test each (so they run in parallel); a test below fails when a
/// new `.cvnn` file is added without being listed here.
const NETWORKS: &[&str] = &[
    "examples/complex_resnet.cvnn",
    "examples/mri_recon.cvnn",
    "examples/rf_modulation.cvnn",
    "examples/seed_cnn.cvnn",
    "tests/fixtures/ok/activations.cvnn",
    "tests/fixtures/ok/blocks.cvnn",
    "tests/fixtures/ok/dtype_ops.cvnn",
    "tests/fixtures/ok/l1_real_linear.cvnn",
    "tests/fixtures/ok/multi_model.cvnn",
    "tests/fixtures/ok/residual.cvnn",
    "tests/fixtures/ok/rf_classifier.cvnn",
    "tests/fixtures/ok/seed_cnn.cvnn",
    "tests/fixtures/ok/shape_ops.cvnn",
    "tests/fixtures/ok/spectral.cvnn",
    "tests/fixtures/ok/train_full.cvnn",
    "tests/fixtures/ok/tuples.cvnn",
    "tests/fixtures/ok/unused_head.cvnn",
];

#[test]
fn every_network_file_is_checked() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for f in network_files() {
        let rel = f.strip_prefix(&root).unwrap_or(&f).to_string_lossy().replace('\\', "/");
        assert!(NETWORKS.contains(&rel.as_str()), "{rel} is not in NETWORKS of cpu_vs_interp.rs");
    }
}

/// Checks one network. Relu's derivative (`step`) and comparisons are discontinuous: when a
/// batch-normalised value lands within f32 rounding of 0, CPU and interpreter may take
/// different sides and one element of a gradient legitimately differs (a few runs in a
/// hundred for the larger networks). So a failing seed is reported and the check is repeated
/// on two more fresh seeds, both of which must pass; a real bug fails every seed.
fn check_network_file(rel: &str) {
    let s = seed();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let fails = check_network(&path, 2, &mut SplitMix64::new(s));
    if fails.is_empty() {
        return;
    }
    println!("seed {s} failed (retrying on two more seeds):\n{}", fails.join("\n"));
    for retry in 1..=2u64 {
        let s2 = s.wrapping_add(retry.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let fails = check_network(&path, 2, &mut SplitMix64::new(s2));
        assert!(fails.is_empty(), "seed {s} and retry seed {s2} both fail:\n{}", fails.join("\n"));
    }
}

macro_rules! network_tests {
    ($($name:ident => $file:expr),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check_network_file($file);
            }
        )*
    };
}

network_tests! {
    net_complex_resnet => "examples/complex_resnet.cvnn",
    net_mri_recon => "examples/mri_recon.cvnn",
    net_rf_modulation => "examples/rf_modulation.cvnn",
    net_seed_cnn => "examples/seed_cnn.cvnn",
    net_fixture_activations => "tests/fixtures/ok/activations.cvnn",
    net_fixture_blocks => "tests/fixtures/ok/blocks.cvnn",
    net_fixture_dtype_ops => "tests/fixtures/ok/dtype_ops.cvnn",
    net_fixture_l1_real_linear => "tests/fixtures/ok/l1_real_linear.cvnn",
    net_fixture_multi_model => "tests/fixtures/ok/multi_model.cvnn",
    net_fixture_residual => "tests/fixtures/ok/residual.cvnn",
    net_fixture_rf_classifier => "tests/fixtures/ok/rf_classifier.cvnn",
    net_fixture_seed_cnn => "tests/fixtures/ok/seed_cnn.cvnn",
    net_fixture_shape_ops => "tests/fixtures/ok/shape_ops.cvnn",
    net_fixture_spectral => "tests/fixtures/ok/spectral.cvnn",
    net_fixture_train_full => "tests/fixtures/ok/train_full.cvnn",
    net_fixture_tuples => "tests/fixtures/ok/tuples.cvnn",
    net_fixture_unused_head => "tests/fixtures/ok/unused_head.cvnn",
}
