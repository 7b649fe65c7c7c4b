//! Differential tests: the CPU back end (Cranelift JIT + GEMM) against the f64 reference
//! interpreter, on small graphs of every primitive op and on every example and fixture
//! network (a training step: forward, loss, gradients, optimizer update).
//!
//! Seeds are fixed (`CVC_SEED` varies them; `docs/TESTING.md`). Every value a kernel stores is
//! checked against the interpreter replaying its kernel group on the values the CPU read
//! (`cvc_tests::differential`, the code the GPU tests run): kinks flipped by f32 rounding
//! upstream cannot propagate, so no seed is retried and a wrong kernel fails on the first
//! one. Tolerance: ‖cpu − ref‖ ≤ 1e-4·‖ref‖ plus the replay's f32 rounding bound.

use cvc_compiler::interp::{evaluate, SplitMix64, Tensor};
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::*;
use cvc_compiler::passes::fusion::unfused;
use cvc_compiler::passes::memplan::bump;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;
use cvc_runtime::backend::Backend;
use cvc_runtime::cpu::CpuBackend;
use cvc_tests::differential::{
    check_step_locally, check_training_steps, from_host, keep_every_value, random_leaves, rel_err, to_host,
    LocalReport, TOL,
};
use cvc_tests::seed::seed_for;
use std::collections::HashMap;

fn cpu(p: &Program) -> Result<Box<dyn Backend>, String> {
    Ok(Box::new(CpuBackend::new(p).map_err(|e| e.0)?))
}

/// Uploads `leaves`, runs one step on the CPU and checks it group by group.
fn run_locally(p: &Program, leaves: &HashMap<Value, Tensor>) -> (LocalReport, Box<dyn Backend>) {
    let name = &p.graph.name;
    let mut be = cpu(p).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (&v, t) in leaves {
        if p.plan.slot(v).is_some() {
            be.upload(v, &to_host(t)).unwrap_or_else(|e| panic!("{name}: upload: {}", e.0));
        }
    }
    be.step().unwrap_or_else(|e| panic!("{name}: step: {}", e.0));
    let report = check_step_locally(p, be.as_mut(), leaves).unwrap_or_else(|e| panic!("{name}: {e}"));
    println!("{name}: {}", report.summary());
    (report, be)
}

/// Every non-leaf value of `g`, unfused and bump-planned (each value materialised).
fn unfused_program(g: Graph, batch: usize) -> Program {
    let fusion = unfused(&g);
    let order: Vec<usize> = (0..fusion.groups.len()).collect();
    let plan = bump(&g, &fusion, &order, batch);
    Program { graph: g, groups: fusion.groups, order, plan, facts: Default::default() }
}

/// Builds a graph with `f`, then checks every value unfused (one op per kernel), and the
/// fused program group by group and its outputs end to end (these graphs apply their kinks
/// to leaves only, which both sides read identically).
fn check_graph(name: &str, batch: usize, f: impl Fn(&mut Builder) -> Result<Vec<Value>, String>) {
    let mut rng = SplitMix64::new(seed_for(&format!("cpu_vs_interp::{name}")));
    let mut g = Graph::new(name, Mode::Eval);
    let outs = {
        let mut b = Builder::new(&mut g);
        f(&mut b).unwrap_or_else(|e| panic!("{name}: building the graph: {e}"))
    };
    for (i, v) in outs.iter().enumerate() {
        g.outputs.push(Output { name: format!("out{i}"), value: *v });
    }
    let leaves = random_leaves(&g, batch, &mut rng);
    let p = unfused_program(g.clone(), batch);
    let (report, _) = run_locally(&p, &leaves);
    assert!(report.failures.is_empty(), "{name} (unfused):\n{}", report.failures.join("\n"));
    let opts = Options { batch, fuse: true, ..Options::default() };
    let fused = keep_every_value(&compile(g, &opts).unwrap_or_else(|e| panic!("{name}: pipeline: {e}")));
    let (report, mut be) = run_locally(&fused, &leaves);
    assert!(report.failures.is_empty(), "{name} (fused):\n{}", report.failures.join("\n"));
    let want = evaluate(&fused.graph, batch, &leaves).unwrap_or_else(|e| panic!("{name}: interpreter: {e}"));
    for o in &fused.graph.outputs {
        let got = from_host(&be.download(o.value).unwrap_or_else(|e| panic!("{name}: {}", e.0)));
        let e = rel_err(&got, want[o.value.index()].as_ref().expect("interpreter value"));
        assert!(e <= TOL, "{name} (fused, end to end): {} relative error {e:.3e}", o.name);
    }
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
            Neg,
            Conj,
            Real,
            Imag,
            Abs,
            Abs2,
            Angle,
            ToComplex,
            Exp,
            Sin,
            Cos,
            Tanh,
            Sigmoid,
            Relu,
            Step,
            Gelu,
            GeluGrad,
            GeluTanh,
            GeluTanhGrad,
            StopGrad,
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

/// Gather and scatter-add, real and complex, with indices that include out-of-range ones
/// (a zero row for gather, nothing added for scatter-add) and repeated ones (rows summed).
#[test]
fn gather_and_scatter_add() {
    let name = "gather_scatter";
    let mut rng = SplitMix64::new(seed_for(&format!("cpu_vs_interp::{name}")));
    let mut g = Graph::new(name, Mode::Eval);
    let (idx, outs) = {
        let b = &mut Builder::new(&mut g);
        let idx = input(b, "idx", DType::I32, &[B, F(5)]);
        let mut outs = Vec::new();
        for dt in [DType::F32, DType::C64] {
            let table = param(b, "table", dt, &[7, 3]);
            outs.push(b.add(Op::Gather, &[table, idx]).expect("gather"));
            let src = input(b, "src", dt, &[B, F(5), F(3)]);
            outs.push(b.add(Op::ScatterAdd { rows: 7 }, &[src, idx]).expect("scatter_add"));
        }
        (idx, outs)
    };
    for (i, v) in outs.iter().enumerate() {
        g.outputs.push(Output { name: format!("out{i}"), value: *v });
    }
    let batch = 3;
    let mut leaves = random_leaves(&g, batch, &mut rng);
    // Repeats (2, 2, 2), both ends of the table (0, 6), and indices outside it (-1, 7, 99).
    let ids: Vec<i64> = (0..batch * 5).map(|i| [2, 0, -1, 6, 2, 7, 2, 99, 5, 1][i % 10]).collect();
    leaves.insert(idx, Tensor::int(&[batch, 5], ids));
    let p = unfused_program(g.clone(), batch);
    let (report, mut be) = run_locally(&p, &leaves);
    assert!(report.failures.is_empty(), "{name}:\n{}", report.failures.join("\n"));
    let want = evaluate(&g, batch, &leaves).unwrap_or_else(|e| panic!("{name}: interpreter: {e}"));
    for o in &g.outputs {
        let got = from_host(&be.download(o.value).unwrap_or_else(|e| panic!("{name}: {}", e.0)));
        let e = rel_err(&got, want[o.value.index()].as_ref().expect("interpreter value"));
        assert!(e <= TOL, "{name}: {} relative error {e:.3e}", o.name);
    }
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
                    outs.push(b.add(Op::MatMul { trans, conj, sum_batch: false }, &[a, bb])?);
                }
            }
        }
        Ok(outs)
    });
}

/// The attention primitives with every option, at extents that are not multiples of the CPU
/// blocks (`BLOCK_Q` = 32 queries, `BLOCK_K` = 64 keys), `S ≠ T` and `Dv ≠ D`.
#[test]
fn attention_primitives() {
    let base = AttnSpec {
        heads: AttnHeads::separate(2, 1),
        scale: 0.4,
        score: AttnScore::Real,
        causal: false,
        key_mask: false,
        dropout: None,
    };
    // How q, k and v are laid out: separate tensors, one packed tensor (columns left over
    // before, between and after the heads), or q alone and a packed k ‖ v.
    #[derive(Clone, Copy, PartialEq)]
    enum Operands {
        Separate,
        Packed,
        PackedKv,
    }
    use Operands::*;
    let cases = [
        ("attn_real", base, [37, 70, 4, 3], Separate),
        (
            "attn_abs_causal",
            AttnSpec { score: AttnScore::Abs, causal: true, ..base },
            [40, 33, 3, 5],
            Separate,
        ),
        (
            "attn_masked_dropout",
            AttnSpec { key_mask: true, dropout: Some((0.3, 5)), ..base },
            [9, 66, 2, 2],
            Separate,
        ),
        (
            "attn_everything",
            AttnSpec {
                score: AttnScore::Abs,
                causal: true,
                key_mask: true,
                dropout: Some((0.2, 8)),
                scale: 0.6,
                ..base
            },
            [33, 65, 3, 2],
            Separate,
        ),
        ("attn_packed", AttnSpec { causal: true, ..base }, [37, 37, 4, 3], Packed),
        ("attn_packed_kv", AttnSpec { key_mask: true, ..base }, [35, 66, 3, 5], PackedKv),
    ];
    for (name, spec, [t, s, d, dv], layout) in cases {
        let h = 2;
        let (cols, width) = match layout {
            Separate => ([0; 3], [h * d, h * d, h * dv]),
            Packed => ([1, 2 + h * d, 2 + 2 * h * d], [3 + 2 * h * d + h * dv; 3]),
            PackedKv => ([0, 0, h * d], [h * d, h * (d + dv), h * (d + dv)]),
        };
        let spec = AttnSpec { heads: AttnHeads { n: h, d, dv, cols }, ..spec };
        check_graph(name, 2, |b| {
            let q = input(b, "q", DType::C64, &[B, F(t), F(width[0])]);
            let k = if layout == Packed { q } else { input(b, "k", DType::C64, &[B, F(s), F(width[1])]) };
            let v = if layout == Separate { input(b, "v", DType::C64, &[B, F(s), F(width[2])]) } else { k };
            let d_o = input(b, "do", DType::C64, &[B, F(t), F(h * dv)]);
            let mut extra = Vec::new();
            if spec.key_mask {
                // About a third of the keys padded (a random normal above 0.43).
                let m = input(b, "m", DType::F32, &[B, F(s)]);
                let cut = b.scalar(0.43, 0);
                extra.push(b.binary(BinaryOp::Greater, m, cut)?);
            }
            if spec.dropout.is_some() {
                extra.push(b.leaf(
                    Op::State { name: "step".into(), init: Init::Zeros },
                    TensorType::new(DType::I32, Shape::scalar()),
                ));
            }
            let lse_ops: Vec<Value> =
                [q, k].into_iter().chain(extra.iter().copied().take(usize::from(spec.key_mask))).collect();
            let lse = b.add(Op::AttnLse { spec }, &lse_ops)?;
            let o = b.add(Op::Attention { spec }, &[vec![q, k, v, lse], extra.clone()].concat())?;
            let grad_ops = [vec![q, k, v, o, d_o, lse], extra.clone()].concat();
            let dq = b.add(Op::AttentionGrad { spec, wrt: AttnWrt::Q }, &grad_ops)?;
            let dkv = b.add(Op::AttentionGrad { spec, wrt: AttnWrt::KV }, &grad_ops)?;
            Ok(vec![lse, o, dq, dkv])
        });
    }
}

/// Batched matmuls: both operands batched with `B` among the leading axes, a 2-D operand on
/// either side (the fold into M, or a loop), the summed form (the fold into K, or a loop),
/// every transpose, conjugations and dtype mixes; one batch large enough to be split
/// across threads.
#[test]
fn matmul_batched_forms() {
    check_graph("matmul_batched", 3, |b| {
        let mut outs = Vec::new();
        let (m, k, n) = (5, 7, 3);
        let lead = [B, F(2)];
        let shape = |lead: &[Dim], t: bool, r: usize, c: usize| -> Vec<Dim> {
            lead.iter().copied().chain(if t { [F(c), F(r)] } else { [F(r), F(c)] }).collect()
        };
        // (a batched, b batched, sum_batch)
        for (ba, bb, sum_batch) in
            [(true, true, false), (true, false, false), (false, true, false), (true, true, true)]
        {
            for trans in [[false, false], [true, false], [false, true], [true, true]] {
                for (i, (da, db)) in
                    [(DType::C64, DType::C64), (DType::F32, DType::C64), (DType::C64, DType::F32)]
                        .into_iter()
                        .enumerate()
                {
                    let conj = [i == 0 && trans[0], i != 2 && !trans[1]];
                    let la: &[Dim] = if ba { &lead } else { &[] };
                    let lb: &[Dim] = if bb { &lead } else { &[] };
                    let id = outs.len();
                    let a = input(b, &format!("a{id}"), da, &shape(la, trans[0], m, k));
                    let bv = input(b, &format!("b{id}"), db, &shape(lb, trans[1], k, n));
                    outs.push(b.add(Op::MatMul { trans, conj, sum_batch }, &[a, bv])?);
                }
            }
        }
        // 3·8 products of 16×16×16: split over the batch across threads; and summed.
        let big = [B, F(8), F(16), F(16)];
        let a = input(b, "big_a", DType::C64, &big);
        let bv = input(b, "big_b", DType::F32, &big);
        outs.push(
            b.add(Op::MatMul { trans: [false, true], conj: [true, false], sum_batch: false }, &[a, bv])?,
        );
        outs.push(
            b.add(Op::MatMul { trans: [false, false], conj: [false, false], sum_batch: true }, &[a, bv])?,
        );
        Ok(outs)
    });
}

/// The same forms in a training step (their gradients are summed and broadcast products),
/// through the real pipeline and memory plan: the test the GPU runs in `tests/gpu.rs`.
#[test]
fn matmul_forms_train_like_the_interpreter() {
    let program = cvc_tests::matmul_forms::program(3).expect("compiles");
    let mut rng = SplitMix64::new(seed_for("cpu_vs_interp::matmul_forms"));
    let failures = check_training_steps(&program, &cpu, 2, 0.0, &mut rng).expect("runs");
    assert!(failures.is_empty(), "CPU vs interpreter mismatches:\n{}", failures.join("\n"));
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

/// The compiled step of a network file at `batch`: its training step (its own optimizer),
/// or its inference program when it has no loss.
fn network_program(path: &std::path::Path, batch: usize) -> Program {
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
    let opts = Options { batch, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: pipeline: {e}"))
}

/// The networks checked one test each (so they run in parallel); a test below fails when a
/// new `.cvnn` file is added without being listed here.
const NETWORKS: &[&str] = &[
    "examples/complex_resnet.cvnn",
    "examples/mri_recon.cvnn",
    "examples/polsar_unet.cvnn",
    "examples/mri_volume.cvnn",
    "examples/rf_modulation.cvnn",
    "examples/seed_cnn.cvnn",
    "examples/vit_sar.cvnn",
    "tests/fixtures/ok/activations.cvnn",
    "tests/fixtures/ok/blocks.cvnn",
    "tests/fixtures/ok/dtype_ops.cvnn",
    "tests/fixtures/ok/l1_real_linear.cvnn",
    "tests/fixtures/ok/multi_model.cvnn",
    "tests/fixtures/ok/norms.cvnn",
    "tests/fixtures/ok/polsar_unet_tiny.cvnn",
    "tests/fixtures/ok/residual.cvnn",
    "tests/fixtures/ok/rf_classifier.cvnn",
    "tests/fixtures/ok/seed_cnn.cvnn",
    "tests/fixtures/ok/segmentation_1d.cvnn",
    "tests/fixtures/ok/segmentation_2d.cvnn",
    "tests/fixtures/ok/sequence_matmul.cvnn",
    "tests/fixtures/ok/shape_ops.cvnn",
    "tests/fixtures/ok/spectral.cvnn",
    "tests/fixtures/ok/tokens.cvnn",
    "tests/fixtures/ok/train_full.cvnn",
    "tests/fixtures/ok/tuples.cvnn",
    "tests/fixtures/ok/unused_head.cvnn",
    "tests/fixtures/ok/vit_tiny.cvnn",
    "examples/rf_gru.cvnn",
    "tests/fixtures/ok/gru_tiny.cvnn",
    "tests/fixtures/ok/recurrent.cvnn",
    "tests/fixtures/ok/volume3d.cvnn",
    "tests/fixtures/ok/mri_volume_tiny.cvnn",
];

#[test]
fn every_network_file_is_checked() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for f in network_files() {
        let rel = f.strip_prefix(&root).unwrap_or(&f).to_string_lossy().replace('\\', "/");
        assert!(NETWORKS.contains(&rel.as_str()), "{rel} is not in NETWORKS of cpu_vs_interp.rs");
    }
}

/// Two training steps of one network at batch 2, checked group by group, end to end where
/// meaningful, and with the program's reusing memory plan bitwise equal to the
/// keep-everything plan (the CPU back end is deterministic); see `cvc_tests::differential`.
fn check_network_file(rel: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let program = network_program(&path, 2);
    let mut rng = SplitMix64::new(seed_for(&format!("cpu_vs_interp::{rel}")));
    let fails =
        check_training_steps(&program, &cpu, 2, 0.0, &mut rng).unwrap_or_else(|e| panic!("{rel}: {e}"));
    assert!(fails.is_empty(), "{rel}:\n{}", fails.join("\n"));
}

/// Chunked back-propagation through time on the CPU: the recurrent fixtures' training steps
/// with their recurrences back-propagated in chunks (which recompute each chunk from its
/// checkpoint through `Recurrence`/`RecurrenceGrad` with an initial state), checked group by
/// group against the interpreter as every network is, with chunks that divide `T` and not.
#[test]
fn chunked_recurrences_train_like_the_interpreter() {
    for (rel, chunk) in [
        ("tests/fixtures/ok/recurrent.cvnn", 2),
        ("tests/fixtures/ok/recurrent.cvnn", 4),
        ("tests/fixtures/ok/gru_tiny.cvnn", 3),
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
        let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let checked =
            cvc_compiler::front::check_source(rel, &src, Mode::Train).unwrap_or_else(|_| panic!("{rel}"));
        let opts = Options { batch: 2, rnn_chunk: Some(chunk), ..Options::default() };
        let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{rel}: pipeline: {e}"));
        assert_eq!(program.facts.rnn_chunk, Some(chunk), "{rel}");
        let inits = program
            .graph
            .nodes
            .iter()
            .filter(|(_, n)| matches!(n.op, Op::RecurrenceGrad { spec } if spec.init))
            .count();
        assert!(inits > 0, "{rel}: no chunk starts from a checkpoint");
        let mut rng = SplitMix64::new(seed_for(&format!("cpu_vs_interp::chunked {rel} {chunk}")));
        let fails =
            check_training_steps(&program, &cpu, 2, 0.0, &mut rng).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(fails.is_empty(), "{rel} in chunks of {chunk}:\n{}", fails.join("\n"));
    }
}

/// The check must fail on a real bug, on the first seed: a kernel that computes with one
/// constant off by 1e-3 (relative) in the backward pass of a network with relus after
/// batchnorms (the seed CNN fixture) is found, and only in the groups that use that
/// constant; the same step with the right constant passes.
#[test]
fn a_wrong_constant_in_one_kernel_fails_the_first_seed() {
    let rel = "tests/fixtures/ok/seed_cnn.cvnn";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let program = keep_every_value(&network_program(&path, 2));
    let g = &program.graph;
    let mut rng =
        SplitMix64::new(seed_for("cpu_vs_interp::a_wrong_constant_in_one_kernel_fails_the_first_seed"));
    let leaves = random_leaves(g, 2, &mut rng);
    let (control, _) = run_locally(&program, &leaves);
    assert!(control.failures.is_empty(), "the unchanged kernels fail:\n{}", control.failures.join("\n"));
    // The first constant that scales or shifts a value inside a fused kernel of the
    // backward pass (not 0 or ±1, which a back end may fold).
    let arithmetic = |u: Value, s: Value| {
        matches!(g.node(u).op, Op::Binary(BinaryOp::Mul | BinaryOp::Add | BinaryOp::Sub | BinaryOp::Div))
            && g.node(u).inputs.contains(&s)
    };
    let (group, scalar) = program
        .scheduled()
        .filter(|grp| grp.nodes.len() > 2 && g.node(grp.outputs[0]).origin.label.starts_with("grad("))
        .find_map(|grp| {
            grp.nodes
                .iter()
                .find(|&&v| {
                    matches!(g.node(v).op, Op::Scalar { value, .. } if value.abs() > 1e-3 && value.abs() != 1.0)
                        && grp.nodes.iter().any(|&u| arithmetic(u, v))
                })
                .map(|&v| (grp.clone(), v))
        })
        .expect("a fused backward kernel with a constant");
    let mut wrong = program.clone();
    if let Op::Scalar { value, .. } = &mut wrong.graph.nodes[scalar].op {
        *value *= 1.0 + 1e-3;
    }
    let mut be = cpu(&wrong).expect("compiles");
    for (&v, t) in &leaves {
        if program.plan.slot(v).is_some() {
            be.upload(v, &to_host(t)).expect("upload");
        }
    }
    be.step().expect("step");
    let report = check_step_locally(&program, be.as_mut(), &leaves).expect("checks");
    println!("with {scalar} off by 1e-3: {}\n{}", report.summary(), report.failures.join("\n"));
    assert!(!report.failures.is_empty(), "a wrong constant in {:?} went unnoticed", group.outputs);
    let users: Vec<String> = program
        .scheduled()
        .filter(|grp| grp.nodes.contains(&scalar))
        .flat_map(|grp| grp.outputs.iter().map(|&o| format!("{o} =")))
        .collect();
    for f in &report.failures {
        assert!(users.iter().any(|u| f.contains(u.as_str())), "{f} is not in a kernel using {scalar}");
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
    net_fixture_norms => "tests/fixtures/ok/norms.cvnn",
    net_fixture_residual => "tests/fixtures/ok/residual.cvnn",
    net_fixture_rf_classifier => "tests/fixtures/ok/rf_classifier.cvnn",
    net_fixture_seed_cnn => "tests/fixtures/ok/seed_cnn.cvnn",
    net_fixture_segmentation_1d => "tests/fixtures/ok/segmentation_1d.cvnn",
    net_fixture_segmentation_2d => "tests/fixtures/ok/segmentation_2d.cvnn",
    net_fixture_sequence_matmul => "tests/fixtures/ok/sequence_matmul.cvnn",
    net_fixture_shape_ops => "tests/fixtures/ok/shape_ops.cvnn",
    net_fixture_spectral => "tests/fixtures/ok/spectral.cvnn",
    net_fixture_tokens => "tests/fixtures/ok/tokens.cvnn",
    net_fixture_train_full => "tests/fixtures/ok/train_full.cvnn",
    net_fixture_tuples => "tests/fixtures/ok/tuples.cvnn",
    net_fixture_unused_head => "tests/fixtures/ok/unused_head.cvnn",
    net_fixture_vit_tiny => "tests/fixtures/ok/vit_tiny.cvnn",
    net_fixture_polsar_unet_tiny => "tests/fixtures/ok/polsar_unet_tiny.cvnn",
    net_rf_gru => "examples/rf_gru.cvnn",
    net_fixture_gru_tiny => "tests/fixtures/ok/gru_tiny.cvnn",
    net_fixture_recurrent => "tests/fixtures/ok/recurrent.cvnn",
    net_fixture_volume3d => "tests/fixtures/ok/volume3d.cvnn",
    net_fixture_mri_volume_tiny => "tests/fixtures/ok/mri_volume_tiny.cvnn",
}

/// The full-size ViT (12 layers, 256 tokens, dimension 192) takes minutes on the f64
/// interpreter; vit_tiny covers the same operators in CI. Run with `--ignored` to check it.
#[test]
#[ignore = "minutes on the interpreter; vit_tiny covers the same operators"]
fn net_vit_sar() {
    check_network_file("examples/vit_sar.cvnn");
}

/// The full-size U-Net (64×64 scenes, widths 8 to 64) is slow on the debug-build f64
/// interpreter; polsar_unet_tiny covers the same layers in CI. Run with `--ignored` to check it.
#[test]
#[ignore = "slow on the interpreter; polsar_unet_tiny covers the same operators"]
fn net_polsar_unet() {
    check_network_file("examples/polsar_unet.cvnn");
}

/// The full-size 3-D MRI example (16×32×32 volumes, 8 channels) takes minutes on the f64
/// interpreter; `mri_volume_tiny` covers the same layers in CI. Run with `--ignored`.
#[test]
#[ignore = "minutes on the interpreter; mri_volume_tiny covers the same operators"]
fn net_mri_volume() {
    check_network_file("examples/mri_volume.cvnn");
}

/// The group check's record of how much of an update may be its operands' rounding
/// (`LocalReport::operand_rounding`, which widens `check_training_steps`' plan-vs-plan
/// comparison): all of it for the bias of a convolution right before a batchnorm (the
/// batchnorm removes the bias, so its gradient is a sum that cancels to zero but for rounding),
/// almost none for the last convolution's bias and for the batchnorms' scales. On the CPU, one
/// SGD step of `polsar_unet_tiny` at batch 2 from fresh random leaves.
#[test]
fn operand_rounding_marks_gradients_that_are_rounding_alone() {
    use cvc_compiler::config::{Optimizer, OptimizerKind};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ok/polsar_unet_tiny.cvnn");
    let src = std::fs::read_to_string(&root).expect("the fixture");
    let checked =
        cvc_compiler::front::check_source("polsar_unet_tiny.cvnn", &src, Mode::Train).expect("checks");
    let sgd =
        Optimizer { kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false }, lr: 1.0, weight_decay: 0.0 };
    let opts = Options { batch: 2, optimizer: sgd, ..Options::default() };
    let program = keep_every_value(&compile(checked.graph, &opts).expect("compiles"));
    let mut rng = SplitMix64::new(seed_for("cpu_vs_interp::operand_rounding"));
    let leaves = random_leaves(&program.graph, 2, &mut rng);
    let (report, _) = run_locally(&program, &leaves);
    let g = &program.graph;
    let rounding = |name: &str| {
        let v = g.persistent().find(|&v| g.leaf_name(v) == Some(name)).unwrap_or_else(|| panic!("{name}"));
        report.operand_rounding.get(&v).copied().unwrap_or_else(|| panic!("{name}: no update compared"))
    };
    for before_norm in ["e1.conv2d_0.bias", "e2.conv2d_1.bias", "d1.conv2d_1.bias"] {
        assert_eq!(rounding(before_norm), 1.0, "{before_norm}: a gradient of rounding alone");
    }
    for name in ["logits.conv2d_0.bias", "e1.batchnorm_0.gamma_re", "d1.batchnorm_1.gamma_im"] {
        assert!(rounding(name) < 1e-2, "{name}: {}", rounding(name));
    }
}
