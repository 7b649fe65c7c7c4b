//! Tests of the layer library (`front::layers`): output types of every operator, diagnostics
//! for bad calls, and numerical agreement with independent naive f64 formulas, evaluated by
//! the reference interpreter. Random inputs have fixed seeds (`CVC_SEED` varies them; see
//! `docs/TESTING.md`).

#![allow(clippy::result_large_err)] // Diagnostic by value, as the layer interface returns it.

use cvc_compiler::front::layers::{
    known_ops, lower_layer, Arg, ArgValue, LayerCall, LowerCtx, Operand, ParamInfo,
};
use cvc_compiler::interp::{evaluate, Tensor, TensorData};
use cvc_compiler::ir::verify::verify;
use cvc_compiler::ir::*;
use cvc_compiler::Diagnostic;
use cvc_grammar::Span;
use num_complex::Complex64 as C;
use std::collections::HashMap;

#[path = "../../tests/src/seed.rs"]
mod seed;

// ---------------------------------------------------------------- random numbers

/// SplitMix64: a tiny seeded generator (no rand crate).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let u = self.uniform().max(1e-300);
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The test's fixed seed (varied by `CVC_SEED`; see `tests/src/seed.rs`).
fn rng(test: &str) -> Rng {
    Rng(seed::seed_for(&format!("layers::{test}")))
}

// ---------------------------------------------------------------- building graphs

fn sp(a: usize) -> Span {
    Span::new(a, a + 1)
}

fn pos(v: ArgValue) -> Arg {
    Arg { name: None, value: v, span: sp(50) }
}

fn kw(name: &str, v: ArgValue) -> Arg {
    Arg { name: Some(name.into()), value: v, span: sp(60) }
}

fn int(v: i64) -> ArgValue {
    ArgValue::Int(v)
}

fn word(w: &str) -> ArgValue {
    ArgValue::Ident(w.into())
}

fn f32t(dims: &[Dim]) -> TensorType {
    TensorType::new(DType::F32, Shape(dims.to_vec()))
}

fn c64t(dims: &[Dim]) -> TensorType {
    TensorType::new(DType::C64, Shape(dims.to_vec()))
}

fn i32t(dims: &[Dim]) -> TensorType {
    TensorType::new(DType::I32, Shape(dims.to_vec()))
}

const B: Dim = Dim::Batch;
#[allow(non_snake_case)]
fn F(n: usize) -> Dim {
    Dim::Fixed(n)
}

/// One lowered layer: the graph, its input leaves, the output and the parameters made.
struct Case {
    g: Graph,
    inputs: Vec<Value>,
    out: Value,
    params: Vec<ParamInfo>,
}

/// Lowers `op(args)` applied to fresh inputs of the given types.
fn lower(mode: Mode, op: &str, args: &[Arg], inputs: &[TensorType]) -> Result<Case, Diagnostic> {
    let mut g = Graph::new("t", mode);
    let (inputs, out, params) = {
        let mut ctx = LowerCtx::new(&mut g, mode);
        let ins: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| ctx.b.leaf(Op::Input { name: format!("in{i}") }, t.clone()))
            .collect();
        let operands: Vec<Operand> =
            ins.iter().enumerate().map(|(i, &v)| Operand { value: v, span: sp(10 + i) }).collect();
        let call =
            LayerCall { op, span: sp(0), args, label: format!("t/{op}"), param_prefix: format!("t.{op}_0") };
        let out = lower_layer(&mut ctx, &call, &operands)?;
        (ins, out, ctx.params)
    };
    verify(&g).unwrap_or_else(|e| panic!("`{op}` made an invalid graph: {e}"));
    Ok(Case { g, inputs, out, params })
}

fn ok(mode: Mode, op: &str, args: &[Arg], inputs: &[TensorType]) -> Case {
    lower(mode, op, args, inputs).unwrap_or_else(|d| panic!("`{op}` failed: {d:?}"))
}

fn err(op: &str, args: &[Arg], inputs: &[TensorType]) -> Diagnostic {
    match lower(Mode::Train, op, args, inputs) {
        Ok(_) => panic!("`{op}` should have been rejected"),
        Err(d) => d,
    }
}

/// A random tensor of type `ty` at batch `batch` (i32: labels below `classes`).
fn random(ty: &TensorType, batch: usize, rng: &mut Rng, classes: usize) -> Tensor {
    let shape = ty.shape.resolve(batch);
    let n: usize = shape.iter().product();
    match ty.dtype {
        DType::F32 => Tensor::real(&shape, (0..n).map(|_| rng.normal()).collect()),
        DType::C64 => Tensor::complex(&shape, (0..n).map(|_| C::new(rng.normal(), rng.normal())).collect()),
        DType::I32 => Tensor::int(&shape, (0..n).map(|_| rng.below(classes.max(1)) as i64).collect()),
    }
}

/// Random values for every leaf (states positive, the step counter 0), with overrides.
fn leaves(case: &Case, batch: usize, rng: &mut Rng, given: &[(Value, Tensor)]) -> HashMap<Value, Tensor> {
    let mut m: HashMap<Value, Tensor> = given.iter().cloned().collect();
    for (h, n) in case.g.nodes.iter() {
        if m.contains_key(&h) {
            continue;
        }
        match &n.op {
            Op::Input { .. } | Op::Param { .. } => {
                m.insert(h, random(&n.ty, batch, rng, 3));
            }
            Op::State { name, .. } => {
                let mut t = random(&n.ty, batch, rng, 1);
                if let TensorData::Real(v) = &mut t.data {
                    // Variances in [0.5, ∞); covariances small enough to stay positive definite.
                    let off_diagonal = name.ends_with("vri");
                    v.iter_mut().for_each(|x| {
                        *x = if off_diagonal { x.clamp(-2.0, 2.0) * 0.1 } else { 0.5 + x.abs() }
                    });
                }
                if let TensorData::Int(v) = &mut t.data {
                    v.iter_mut().for_each(|x| *x = 7);
                }
                m.insert(h, t);
            }
            _ => {}
        }
    }
    m
}

fn run(case: &Case, batch: usize, leaves: &HashMap<Value, Tensor>) -> Vec<Option<Tensor>> {
    evaluate(&case.g, batch, leaves).unwrap_or_else(|e| panic!("interpreter: {e}"))
}

fn cx(t: &Tensor) -> Vec<C> {
    match &t.data {
        TensorData::Complex(v) => v.clone(),
        TensorData::Real(v) => v.iter().map(|&x| C::new(x, 0.0)).collect(),
        TensorData::Int(v) => v.iter().map(|&x| C::new(x as f64, 0.0)).collect(),
    }
}

fn re(t: &Tensor) -> Vec<f64> {
    match &t.data {
        TensorData::Real(v) => v.clone(),
        other => panic!("expected a real tensor, got {:?}", other.dtype()),
    }
}

fn param(case: &Case, suffix: &str) -> Value {
    case.params
        .iter()
        .find(|p| p.name.ends_with(suffix))
        .unwrap_or_else(|| panic!("no parameter *{suffix}"))
        .value
}

fn state(case: &Case, suffix: &str) -> Value {
    case.g
        .nodes
        .iter()
        .find(|(_, n)| matches!(&n.op, Op::State { name, .. } if name.ends_with(suffix)))
        .unwrap_or_else(|| panic!("no state *{suffix}"))
        .0
}

/// The value assigned to state/param `target`.
fn assigned(case: &Case, vals: &[Option<Tensor>], target: Value) -> Tensor {
    let (h, _) = case
        .g
        .nodes
        .iter()
        .find(|(_, n)| matches!(n.op, Op::Assign) && n.inputs[0] == target)
        .expect("an assign to the target");
    vals[h.index()].clone().expect("assigned value")
}

fn close(got: &[C], want: &[C], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).norm();
        assert!(err <= tol * (1.0 + w.norm()), "{what}[{i}]: got {g}, want {w} (error {err:e})");
    }
}

fn close_re(got: &[f64], want: &[f64], tol: f64, what: &str) {
    let g: Vec<C> = got.iter().map(|&x| C::new(x, 0.0)).collect();
    let w: Vec<C> = want.iter().map(|&x| C::new(x, 0.0)).collect();
    close(&g, &w, tol, what);
}

// ---------------------------------------------------------------- output types of every op

#[test]
fn every_known_op_lowers_with_the_expected_type() {
    let x4 = c64t(&[B, F(4), F(8), F(8)]);
    let x3 = c64t(&[B, F(4), F(16)]);
    let r2 = f32t(&[B, F(6)]);
    let c2 = c64t(&[B, F(6)]);
    let x5 = c64t(&[B, F(2), F(5), F(5), F(8)]);
    let cases: Vec<(&str, Vec<Arg>, Vec<TensorType>, TensorType)> = vec![
        ("linear", vec![pos(int(5))], vec![r2.clone()], c64t(&[B, F(5)])),
        ("linear", vec![pos(int(5)), kw("real", ArgValue::Bool(true))], vec![r2.clone()], f32t(&[B, F(5)])),
        ("linear", vec![pos(int(5))], vec![x3.clone()], c64t(&[B, F(4), F(5)])),
        ("matmul", vec![], vec![x3.clone(), c64t(&[B, F(16), F(3)])], c64t(&[B, F(4), F(3)])),
        (
            "matmul",
            vec![kw("transpose_b", ArgValue::Bool(true)), kw("conj_b", ArgValue::Bool(true))],
            vec![x3.clone(), x3.clone()],
            c64t(&[B, F(4), F(4)]),
        ),
        ("matmul", vec![], vec![f32t(&[F(2), F(4)]), x3.clone()], c64t(&[B, F(2), F(16)])),
        ("matmul", vec![], vec![f32t(&[B, F(4), F(16)]), f32t(&[F(16), F(2)])], f32t(&[B, F(4), F(2)])),
        (
            "conv1d",
            vec![pos(int(8)), kw("kernel", int(3)), kw("pad", int(1))],
            vec![x3.clone()],
            c64t(&[B, F(8), F(16)]),
        ),
        (
            "conv2d",
            vec![pos(int(8)), kw("kernel", int(3)), kw("stride", int(2))],
            vec![x4.clone()],
            c64t(&[B, F(8), F(3), F(3)]),
        ),
        (
            "conv_transpose2d",
            vec![
                pos(int(2)),
                kw("kernel", int(3)),
                kw("stride", int(2)),
                kw("pad", int(1)),
                kw("output_padding", int(1)),
            ],
            vec![x4.clone()],
            c64t(&[B, F(2), F(16), F(16)]),
        ),
        ("batchnorm", vec![], vec![x4.clone()], x4.clone()),
        ("batchnorm", vec![kw("kind", word("whitening"))], vec![x3.clone()], x3.clone()),
        ("batchnorm", vec![], vec![r2.clone()], r2.clone()),
        ("layernorm", vec![], vec![x3.clone()], x3.clone()),
        ("layernorm", vec![kw("axes", int(2)), kw("kind", word("naive"))], vec![x3.clone()], x3.clone()),
        ("layernorm", vec![kw("affine", ArgValue::Bool(false))], vec![r2.clone()], r2.clone()),
        ("rmsnorm", vec![kw("axes", int(2))], vec![x3.clone()], x3.clone()),
        ("rmsnorm", vec![], vec![r2.clone()], r2.clone()),
        ("attention", vec![kw("heads", int(2))], vec![c64t(&[B, F(5), F(8)])], c64t(&[B, F(5), F(8)])),
        ("crelu", vec![], vec![x4.clone()], x4.clone()),
        ("modrelu", vec![], vec![x3.clone()], x3.clone()),
        ("zrelu", vec![], vec![x4.clone()], x4.clone()),
        ("cardioid", vec![], vec![x4.clone()], x4.clone()),
        ("split_tanh", vec![], vec![c2.clone()], c2.clone()),
        ("split_sigmoid", vec![], vec![c2.clone()], c2.clone()),
        ("cgelu", vec![], vec![c2.clone()], c2.clone()),
        ("gelu", vec![], vec![r2.clone()], r2.clone()),
        ("gelu", vec![kw("approximate", word("tanh"))], vec![r2.clone()], r2.clone()),
        ("embedding", vec![pos(int(20)), pos(int(4))], vec![i32t(&[B, F(6)])], c64t(&[B, F(6), F(4)])),
        (
            "embedding",
            vec![pos(int(20)), pos(int(4)), kw("real", ArgValue::Bool(true))],
            vec![i32t(&[B])],
            f32t(&[B, F(4)]),
        ),
        ("relu", vec![], vec![r2.clone()], r2.clone()),
        ("tanh", vec![], vec![r2.clone()], r2.clone()),
        ("sigmoid", vec![], vec![r2.clone()], r2.clone()),
        ("avgpool1d", vec![pos(int(3))], vec![x3.clone()], c64t(&[B, F(4), F(5)])),
        ("avgpool2d", vec![pos(int(2))], vec![x4.clone()], c64t(&[B, F(4), F(4), F(4)])),
        ("maxpool1d", vec![pos(int(2))], vec![x3.clone()], c64t(&[B, F(4), F(8)])),
        ("maxpool2d", vec![pos(int(3))], vec![x4.clone()], c64t(&[B, F(4), F(2), F(2)])),
        ("global_avgpool", vec![], vec![x4.clone()], c64t(&[B, F(4)])),
        ("adaptive_avgpool", vec![pos(int(3))], vec![x4.clone()], c64t(&[B, F(4), F(3), F(3)])),
        ("upsample1d", vec![pos(int(2))], vec![x3.clone()], c64t(&[B, F(4), F(32)])),
        (
            "upsample2d",
            vec![pos(int(2)), kw("mode", word("linear"))],
            vec![x4.clone()],
            c64t(&[B, F(4), F(16), F(16)]),
        ),
        ("groupnorm", vec![pos(int(2))], vec![x4.clone()], x4.clone()),
        ("instancenorm", vec![], vec![x3.clone()], x3.clone()),
        (
            "conv_transpose1d",
            vec![pos(int(2)), pos(int(2)), kw("stride", int(2))],
            vec![x3.clone()],
            c64t(&[B, F(2), F(32)]),
        ),
        ("dice", vec![], vec![f32t(&[B, F(3), F(8)]), i32t(&[B, F(8)])], f32t(&[])),
        ("dropout", vec![pos(ArgValue::Float(0.25))], vec![x4.clone()], x4.clone()),
        ("+", vec![], vec![x4.clone(), f32t(&[F(4), F(1), F(1)])], x4.clone()),
        ("-", vec![], vec![r2.clone(), r2.clone()], r2.clone()),
        ("-", vec![], vec![c2.clone()], c2.clone()),
        ("*", vec![pos(ArgValue::Float(2.0))], vec![c2.clone()], c2.clone()),
        ("/", vec![], vec![r2.clone(), c2.clone()], c2.clone()),
        ("scale", vec![pos(ArgValue::Float(0.5))], vec![c2.clone()], c2.clone()),
        ("conj", vec![], vec![c2.clone()], c2.clone()),
        ("abs", vec![], vec![c2.clone()], r2.clone()),
        ("abs2", vec![], vec![c2.clone()], r2.clone()),
        ("angle", vec![], vec![c2.clone()], r2.clone()),
        ("real", vec![], vec![c2.clone()], r2.clone()),
        ("imag", vec![], vec![c2.clone()], r2.clone()),
        ("complex", vec![], vec![r2.clone(), r2.clone()], c2.clone()),
        ("polar", vec![], vec![r2.clone(), r2.clone()], c2.clone()),
        ("flatten", vec![], vec![x4.clone()], c64t(&[B, F(256)])),
        (
            "reshape",
            vec![pos(word("B")), pos(int(-1)), pos(int(4))],
            vec![x4.clone()],
            c64t(&[B, F(64), F(4)]),
        ),
        ("concat", vec![kw("axis", int(1))], vec![x4.clone(), x4.clone()], c64t(&[B, F(8), F(8), F(8)])),
        (
            "split",
            vec![pos(int(1)), pos(int(3)), kw("axis", int(1)), kw("index", int(1))],
            vec![x4.clone()],
            c64t(&[B, F(3), F(8), F(8)]),
        ),
        ("permute", vec![pos(int(0)), pos(int(2)), pos(int(1))], vec![x3.clone()], c64t(&[B, F(16), F(4)])),
        ("transpose", vec![pos(int(1)), pos(int(-1))], vec![x3.clone()], c64t(&[B, F(16), F(4)])),
        ("transpose", vec![pos(int(0)), pos(int(1))], vec![x3.clone()], c64t(&[F(4), B, F(16)])),
        ("sum", vec![kw("axis", int(1))], vec![x3.clone()], c64t(&[B, F(16)])),
        (
            "sum",
            vec![pos(ArgValue::Tuple(vec![0, -1])), kw("keepdim", ArgValue::Bool(true))],
            vec![x3.clone()],
            c64t(&[F(1), F(4), F(1)]),
        ),
        ("mean", vec![kw("axis", ArgValue::Tuple(vec![1, 2]))], vec![x3.clone()], c64t(&[B])),
        ("mean", vec![kw("axis", int(0))], vec![r2.clone()], f32t(&[F(6)])),
        ("softmax", vec![], vec![r2.clone()], r2.clone()),
        ("log_softmax", vec![kw("axis", int(0))], vec![r2.clone()], r2.clone()),
        ("fft", vec![], vec![x3.clone()], x3.clone()),
        ("ifft", vec![kw("axis", int(1)), kw("norm", word("ortho"))], vec![x3.clone()], x3.clone()),
        ("fft2", vec![], vec![f32t(&[B, F(8), F(8)])], c64t(&[B, F(8), F(8)])),
        ("ifft2", vec![], vec![x4.clone()], x4.clone()),
        ("fft3", vec![], vec![x5.clone()], x5.clone()),
        (
            "ifft3",
            vec![kw("norm", word("ortho"))],
            vec![f32t(&[B, F(4), F(6), F(8)])],
            c64t(&[B, F(4), F(6), F(8)]),
        ),
        (
            "conv3d",
            vec![
                pos(int(3)),
                kw("kernel", ArgValue::Tuple(vec![3, 1, 3])),
                kw("stride", int(2)),
                kw("pad", int(1)),
            ],
            vec![x5.clone()],
            c64t(&[B, F(3), F(3), F(4), F(4)]),
        ),
        (
            "conv_transpose3d",
            vec![pos(int(2)), pos(int(2)), kw("stride", ArgValue::Tuple(vec![1, 2, 2]))],
            vec![x5.clone()],
            c64t(&[B, F(2), F(6), F(10), F(16)]),
        ),
        ("avgpool3d", vec![pos(int(2))], vec![x5.clone()], c64t(&[B, F(2), F(2), F(2), F(4)])),
        (
            "maxpool3d",
            vec![pos(int(3)), kw("stride", int(2)), kw("pad", int(1))],
            vec![f32t(&[B, F(2), F(5), F(5), F(8)])],
            f32t(&[B, F(2), F(3), F(3), F(4)]),
        ),
        ("gru", vec![pos(int(8))], vec![c64t(&[B, F(5), F(3)])], c64t(&[B, F(5), F(8)])),
        (
            "lstm",
            vec![
                pos(int(4)),
                kw("layers", int(2)),
                kw("bidirectional", ArgValue::Bool(true)),
                kw("returns", word("last")),
            ],
            vec![f32t(&[B, F(5), F(3)])],
            c64t(&[B, F(8)]),
        ),
        ("cross_entropy", vec![], vec![r2.clone(), i32t(&[B])], f32t(&[])),
        ("mse", vec![], vec![c2.clone(), c2.clone()], f32t(&[])),
        ("l1", vec![], vec![c2.clone(), r2.clone()], f32t(&[])),
    ];
    let mut covered: Vec<&str> = Vec::new();
    for (op, args, inputs, want) in &cases {
        for mode in [Mode::Train, Mode::Eval] {
            let case = ok(mode, op, args, inputs);
            assert_eq!(case.g.ty(case.out), want, "`{op}` in {mode:?}");
        }
        covered.push(op);
    }
    for op in known_ops() {
        assert!(covered.contains(op), "`{op}` has no type test");
    }
}

#[test]
fn parameters_are_named_typed_and_recorded() {
    let case = ok(
        Mode::Train,
        "conv2d",
        &[pos(int(8)), kw("kernel", ArgValue::Tuple(vec![3, 5]))],
        &[c64t(&[B, F(2), F(9), F(9)])],
    );
    let names: Vec<&str> = case.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["t.conv2d_0.weight", "t.conv2d_0.bias"]);
    assert_eq!(case.params[0].ty, c64t(&[F(8), F(2), F(3), F(5)]));
    for p in &case.params {
        assert_eq!(case.g.node(p.value).origin.role, Role::Param);
        assert_eq!(case.g.ty(p.value), &p.ty);
    }
    assert_eq!(case.g.node(case.out).origin.role, Role::Forward);
    assert_eq!(case.g.node(case.out).origin.label, "t/conv2d");

    let case = ok(
        Mode::Train,
        "conv1d",
        &[pos(int(4)), pos(int(5)), kw("bias", ArgValue::Bool(false))],
        &[f32t(&[B, F(2), F(9)])],
    );
    assert_eq!(case.params.len(), 1);
    assert_eq!(case.params[0].ty, c64t(&[F(4), F(2), F(5)]), "conv1d weight as PyTorch's [O, C, k]");

    let case = ok(
        Mode::Train,
        "conv_transpose2d",
        &[pos(int(6)), pos(int(3)), kw("groups", int(2))],
        &[c64t(&[B, F(4), F(5), F(5)])],
    );
    assert_eq!(case.params[0].ty, c64t(&[F(4), F(3), F(3), F(3)]), "weight [C_in, out/groups, kh, kw]");
}

#[test]
fn weight_initialisers_follow_the_init_argument_and_pytorch_fans() {
    let init_of = |case: &Case| match &case.g.node(case.params[0].value).op {
        Op::Param { init, .. } => init.clone(),
        other => panic!("not a param: {other:?}"),
    };
    let x = c64t(&[B, F(4), F(6), F(6)]);
    let case = ok(
        Mode::Train,
        "conv2d",
        &[pos(int(8)), pos(int(3)), kw("groups", int(2))],
        std::slice::from_ref(&x),
    );
    assert_eq!(init_of(&case), Init::He { fan_in: 2 * 9 });
    let case = ok(
        Mode::Train,
        "conv2d",
        &[pos(int(8)), pos(int(3)), kw("init", word("rayleigh"))],
        std::slice::from_ref(&x),
    );
    assert_eq!(init_of(&case), Init::Rayleigh { fan_in: 4 * 9, fan_out: 8 * 9 });
    let case =
        ok(Mode::Train, "conv_transpose2d", &[pos(int(6)), pos(int(3)), kw("init", word("glorot"))], &[x]);
    assert_eq!(init_of(&case), Init::Glorot { fan_in: 6 * 9, fan_out: 4 * 9 });
    let case = ok(Mode::Train, "linear", &[pos(int(5))], &[f32t(&[B, F(7)])]);
    assert_eq!(init_of(&case), Init::Glorot { fan_in: 7, fan_out: 5 });
    let case = ok(Mode::Train, "linear", &[pos(int(5)), kw("init", word("he"))], &[f32t(&[B, F(7)])]);
    assert_eq!(init_of(&case), Init::He { fan_in: 7 });
    let d = err("linear", &[pos(int(5)), kw("init", word("xavier"))], &[f32t(&[B, F(7)])]);
    assert!(d.message.contains("`xavier`"), "{}", d.message);
}

#[test]
fn batchnorm_state_and_updates_depend_on_mode() {
    let x = c64t(&[B, F(3), F(4), F(4)]);
    let train = ok(Mode::Train, "batchnorm", &[], std::slice::from_ref(&x));
    let eval = ok(Mode::Eval, "batchnorm", &[], &[x]);
    let count = |c: &Case, f: &dyn Fn(&Node) -> bool| c.g.nodes.iter().filter(|(_, n)| f(n)).count();
    let is_assign = |n: &Node| matches!(n.op, Op::Assign);
    let is_state = |n: &Node| matches!(n.op, Op::State { .. });
    assert_eq!(count(&train, &is_assign), 4, "running mean/var for re and im");
    assert_eq!(count(&eval, &is_assign), 0);
    assert_eq!(count(&train, &is_state), 4);
    assert_eq!(count(&eval, &is_state), 4);
    for (_, n) in train.g.nodes.iter().filter(|(_, n)| is_assign(n)) {
        assert_eq!(n.origin.role, Role::Update);
    }
    assert_eq!(train.params.len(), 4, "gamma/beta for re and im");
    let noaffine = ok(Mode::Train, "batchnorm", &[kw("affine", ArgValue::Bool(false))], &[f32t(&[B, F(3)])]);
    assert!(noaffine.params.is_empty());
}

#[test]
fn dropout_makes_one_step_counter_and_fresh_salts() {
    let mut g = Graph::new("t", Mode::Train);
    let mut ctx = LowerCtx::new(&mut g, Mode::Train);
    let x = ctx.b.leaf(Op::Input { name: "x".into() }, c64t(&[B, F(8)]));
    let args = [pos(ArgValue::Float(0.5))];
    let call =
        LayerCall { op: "dropout", span: sp(0), args: &args, label: "d".into(), param_prefix: "d".into() };
    let y1 = lower_layer(&mut ctx, &call, &[Operand { value: x, span: sp(1) }]).expect("dropout");
    let y2 = lower_layer(&mut ctx, &call, &[Operand { value: y1, span: sp(1) }]).expect("dropout");
    drop(ctx);
    verify(&g).expect("valid graph");
    let steps: Vec<_> =
        g.nodes.iter().filter(|(_, n)| matches!(&n.op, Op::State { name, .. } if name == "step")).collect();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].1.ty, i32t(&[]));
    let salts: Vec<u32> = g
        .nodes
        .iter()
        .filter_map(|(_, n)| match n.op {
            Op::DropoutMask { salt, .. } => Some(salt),
            _ => None,
        })
        .collect();
    assert_eq!(salts.len(), 2);
    assert_ne!(salts[0], salts[1]);
    assert_eq!(g.ty(y2), &c64t(&[B, F(8)]));
}

// ---------------------------------------------------------------- diagnostics

fn help(d: &Diagnostic) -> &str {
    d.help.as_deref().unwrap_or("")
}

#[test]
fn unknown_argument_lists_the_accepted_ones() {
    let d = err("conv2d", &[pos(int(8)), kw("kernal", int(3))], &[c64t(&[B, F(1), F(8), F(8)])]);
    assert_eq!(d.primary.span, sp(60), "points at the argument");
    assert!(d.message.contains("unknown argument `kernal`"), "{}", d.message);
    assert!(help(&d).contains("did you mean `kernel`"), "{}", help(&d));
    assert!(help(&d).contains("out, kernel, stride, pad, dilation, groups, bias"), "{}", help(&d));
}

#[test]
fn unknown_operator_suggests_a_close_name() {
    let d = err("batchnrom", &[], &[c64t(&[B, F(1)])]);
    assert!(d.message.contains("unknown operator"));
    assert!(help(&d).contains("`batchnorm`"), "{}", help(&d));
}

#[test]
fn wrong_argument_types_and_counts() {
    let x = c64t(&[B, F(2), F(8), F(8)]);
    let d = err("conv2d", &[pos(int(4)), kw("kernel", ArgValue::Str("3".into()))], std::slice::from_ref(&x));
    assert!(d.message.contains("`kernel`") && d.message.contains("integer"), "{}", d.message);
    let d = err("conv2d", &[pos(int(4))], std::slice::from_ref(&x));
    assert!(d.message.contains("missing its required argument `kernel`"), "{}", d.message);
    assert!(help(&d).contains("conv2d(out, kernel"), "{}", help(&d));
    let d = err("linear", &[], &[f32t(&[B, F(3)])]);
    assert!(d.message.contains("`out`"), "{}", d.message);
    let d = err("batchnorm", &[kw("kind", word("whiten"))], std::slice::from_ref(&x));
    assert!(help(&d).contains("whitening"), "{}", help(&d));
    let d = err("batchnorm", &[kw("affine", int(1))], std::slice::from_ref(&x));
    assert!(d.message.contains("`affine`"), "{}", d.message);
    let d = err(
        "linear",
        &[pos(int(3)), pos(ArgValue::Bool(true)), pos(ArgValue::Bool(true)), pos(word("he")), pos(int(1))],
        &[f32t(&[B, F(3)])],
    );
    assert!(d.message.contains("too many arguments"), "{}", d.message);
    let d = err("linear", &[pos(int(3)), kw("out", int(4))], &[f32t(&[B, F(3)])]);
    assert!(d.message.contains("given twice"), "{}", d.message);
    let d = err("cross_entropy", &[], &[f32t(&[B, F(3)])]);
    assert!(d.message.contains("takes 2 tensor operands"), "{}", d.message);
}

#[test]
fn invalid_numbers_are_rejected() {
    let x = c64t(&[B, F(2), F(8), F(8)]);
    for (args, needle) in [
        (vec![pos(int(0)), kw("kernel", int(3))], "`out`"),
        (vec![pos(int(-4)), kw("kernel", int(3))], "`out`"),
        (vec![pos(int(4)), kw("kernel", int(0))], "`kernel`"),
        (vec![pos(int(4)), kw("kernel", int(3)), kw("stride", int(0))], "`stride`"),
        (vec![pos(int(4)), kw("kernel", int(3)), kw("pad", int(-1))], "`pad`"),
        (vec![pos(int(4)), kw("kernel", ArgValue::Tuple(vec![3, 3, 3]))], "`kernel`"),
        (vec![pos(int(4)), kw("kernel", int(3)), kw("groups", int(3))], "groups"),
        (vec![pos(int(1 << 40)), kw("kernel", int(3))], "too large"),
    ] {
        let d = err("conv2d", &args, std::slice::from_ref(&x));
        assert!(d.message.contains(needle), "{needle}: {}", d.message);
    }
    let d = err("conv2d", &[pos(int(4)), kw("kernel", int(9))], std::slice::from_ref(&x));
    assert!(d.primary.label_contains("kernel larger than the input"), "{d:?}");
    let d = err("maxpool2d", &[pos(int(9))], std::slice::from_ref(&x));
    assert!(d.message.contains("larger than the input"), "{}", d.message);
    let d = err("dropout", &[pos(ArgValue::Float(1.0))], std::slice::from_ref(&x));
    assert!(d.message.contains("`p`"), "{}", d.message);
    let d = err("batchnorm", &[kw("eps", ArgValue::Float(0.0))], std::slice::from_ref(&x));
    assert!(d.message.contains("`eps`"), "{}", d.message);
    let d = err("reshape", &[pos(word("B")), pos(int(7))], std::slice::from_ref(&x));
    assert!(d.message.contains("element counts differ"), "{}", d.message);
    let d = err(
        "conv_transpose2d",
        &[pos(int(2)), pos(int(3)), kw("stride", int(2)), kw("output_padding", int(2))],
        std::slice::from_ref(&x),
    );
    assert!(d.message.contains("smaller than the stride"), "{}", d.message);
    let d = err("conv_transpose2d", &[pos(int(2)), pos(int(1)), kw("pad", int(5))], std::slice::from_ref(&x));
    assert!(d.message.contains("leaves no output"), "{}", d.message);
    let d = err("split", &[pos(int(1)), pos(int(2)), kw("index", int(0))], &[x]);
    assert!(d.message.contains("add up to 3"), "{}", d.message);
}

trait LabelText {
    fn label_contains(&self, s: &str) -> bool;
}
impl LabelText for cvc_compiler::diag::DiagLabel {
    fn label_contains(&self, s: &str) -> bool {
        self.message.contains(s)
    }
}

#[test]
fn shape_and_dtype_misuse_get_a_help_line() {
    let d = err("linear", &[pos(int(10))], &[c64t(&[B])]);
    assert!(d.message.contains("rank 2 or more"), "{}", d.message);
    assert!(d.secondary.iter().any(|l| l.span == sp(10) && l.message.contains("c64[B]")));

    let d = err("matmul", &[], &[c64t(&[B, F(6), F(4)]), c64t(&[B, F(6), F(4)])]);
    assert!(d.message.contains("inner extents differ"), "{}", d.message);
    assert!(help(&d).contains("transpose_b = true"), "{}", help(&d));
    let d = err("matmul", &[], &[c64t(&[B, F(4), F(3)]), c64t(&[B, F(5), F(3), F(2)])]);
    assert!(d.message.contains("batch axes differ"), "{}", d.message);
    assert_eq!(d.secondary.len(), 2, "both operands labelled");
    let d = err("matmul", &[], &[c64t(&[B, F(4)]), c64t(&[F(4)])]);
    assert!(d.message.contains("second operand"), "{}", d.message);
    let d = err("matmul", &[], &[i32t(&[B, F(4), F(4)]), c64t(&[F(4), F(4)])]);
    assert!(d.message.contains("i32"), "{}", d.message);

    let d = err("+", &[], &[c64t(&[B, F(32), F(8), F(8)]), c64t(&[B, F(64), F(8), F(8)])]);
    assert!(d.message.contains("shape mismatch"), "{}", d.message);
    assert!(help(&d).contains("channel counts differ (32 vs 64)"), "{}", help(&d));
    assert!(help(&d).contains("conv2d(64, kernel = 1)"), "{}", help(&d));
    assert_eq!(d.secondary.len(), 2, "both operands labelled");

    let d = err("cross_entropy", &[], &[c64t(&[B, F(10)]), i32t(&[B])]);
    assert_eq!(help(&d), "take `abs` (or `real`) of the logits first");

    let d = err("crelu", &[], &[f32t(&[B, F(10)])]);
    assert_eq!(help(&d), "crelu is for complex tensors; use relu");

    let d = err("relu", &[], &[c64t(&[B, F(10)])]);
    assert!(help(&d).contains("crelu"), "{}", help(&d));

    let d = err("cross_entropy", &[], &[f32t(&[B, F(10)]), f32t(&[B])]);
    assert!(help(&d).contains("class[B] of 10"), "{}", help(&d));

    let d = err("abs", &[], &[i32t(&[B])]);
    assert!(d.message.contains("i32"), "{}", d.message);

    let d = err("complex", &[], &[c64t(&[B, F(2)]), f32t(&[B, F(2)])]);
    assert!(help(&d).contains("real"), "{}", help(&d));

    let d = err("mse", &[], &[c64t(&[B, F(2)]), c64t(&[B, F(3)])]);
    assert!(d.message.contains("target"), "{}", d.message);

    let d = err("concat", &[], &[c64t(&[B, F(2), F(4)]), c64t(&[B, F(2), F(5)])]);
    assert!(d.message.contains("differ on another axis"), "{}", d.message);

    let d = err("conv2d", &[pos(int(4)), pos(int(3))], &[c64t(&[B, F(2), F(8)])]);
    assert!(d.message.contains("4-D"), "{}", d.message);
}

// ---------------------------------------------------------------- numerics: dense and conv

/// Lowers, fills every leaf at random (with overrides), evaluates; returns leaves and values.
fn eval_case(
    case: &Case,
    batch: usize,
    rng: &mut Rng,
    given: &[(Value, Tensor)],
) -> (HashMap<Value, Tensor>, Vec<Option<Tensor>>) {
    let l = leaves(case, batch, rng, given);
    let v = run(case, batch, &l);
    (l, v)
}

fn out(case: &Case, vals: &[Option<Tensor>]) -> Tensor {
    vals[case.out.index()].clone().expect("output value")
}

#[test]
fn linear_matches_a_naive_product() {
    let mut r = rng("linear");
    for (input, real_w, lead) in [
        (DType::F32, false, vec![B]),
        (DType::C64, false, vec![B]),
        (DType::C64, true, vec![B]),
        (DType::F32, true, vec![B]),
        (DType::C64, false, vec![B, F(2), F(3)]),
        (DType::F32, true, vec![B, F(3)]),
    ] {
        let (n, i, o) = (3, 5, 4);
        let ty = TensorType::new(input, Shape(lead.iter().copied().chain([F(i)]).collect()));
        let rows: usize = ty.shape.resolve(n).iter().product::<usize>() / i;
        let case =
            ok(Mode::Train, "linear", &[pos(int(o as i64)), kw("real", ArgValue::Bool(real_w))], &[ty]);
        assert_eq!(case.g.ty(param(&case, ".weight")).shape, Shape::fixed(&[o, i]), "[out, in] as nn.Linear");
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let x = cx(&l[&case.inputs[0]]);
        let w = cx(&l[&param(&case, ".weight")]);
        let b = cx(&l[&param(&case, ".bias")]);
        // y[.., o] = b[o] + Σ_k x[.., k] · W[o, k], every leading index a row.
        let mut want = vec![C::new(0.0, 0.0); rows * o];
        for ri in 0..rows {
            for oi in 0..o {
                want[ri * o + oi] = b[oi] + (0..i).map(|k| x[ri * i + k] * w[oi * i + k]).sum::<C>();
            }
        }
        close(&cx(&out(&case, &vals)), &want, 1e-12, "linear");
    }
}

/// `nn.Linear` weights from PyTorch (non-square and square, complex64), loaded by name into
/// `linear`, give PyTorch's outputs (`tests/reference/linear/make.py`): the layout is
/// PyTorch's, so a square weight cannot load silently transposed.
#[test]
fn linear_loads_pytorch_nn_linear_weights() {
    let text = include_str!("../../tests/reference/linear/nn_linear.txt");
    let mut lines = text.lines();
    let mut cases = 0;
    while let Some(head) = lines.next() {
        let dims: Vec<usize> = head.split_whitespace().skip(1).map(|d| d.parse().expect("dim")).collect();
        let [n, t, i, o] = dims[..] else { panic!("case line `{head}`") };
        let mut tensor = |name: &str, shape: &[usize]| {
            let line = lines.next().expect("a tensor line");
            let mut w = line.split_whitespace();
            assert_eq!(w.next(), Some(name), "reference line order");
            let v: Vec<f64> = w.map(|x| x.parse().expect("value")).collect();
            assert_eq!(v.len(), 2 * shape.iter().product::<usize>(), "{name} size");
            Tensor::complex(shape, v.chunks(2).map(|p| C::new(p[0], p[1])).collect())
        };
        let (x, w, b, y) = (
            tensor("x", &[n, t, i]),
            tensor("weight", &[o, i]),
            tensor("bias", &[o]),
            tensor("y", &[n, t, o]),
        );
        let case = ok(Mode::Eval, "linear", &[pos(int(o as i64))], &[c64t(&[B, F(t), F(i)])]);
        let given = [(case.inputs[0], x), (param(&case, ".weight"), w), (param(&case, ".bias"), b)];
        let (_, vals) = eval_case(&case, n, &mut rng("linear_torch"), &given);
        // PyTorch computed in complex64: agreement to f32 rounding of the sums.
        close(&cx(&out(&case, &vals)), &cx(&y), 1e-5, &format!("nn.Linear({i}, {o})"));
        cases += 1;
    }
    assert_eq!(cases, 2, "a non-square and a square weight");
}

/// `matmul` between activations against a naive product, `transpose_b`/`conj_b` as PyTorch's
/// `a @ b.mH` (and `b.mT`), with a shared 2-D operand on either side.
#[test]
fn matmul_matches_a_naive_product() {
    let mut r = rng("matmul");
    let (m, k, n) = (3, 4, 2);
    for (tb, cb, a_lead, b_lead) in [
        (false, false, vec![B, F(2)], vec![B, F(2)]),
        (true, true, vec![B], vec![B]),
        (true, false, vec![B], vec![]),
        (false, true, vec![], vec![B, F(2)]),
    ] {
        let ta = c64t(&a_lead.iter().copied().chain([F(m), F(k)]).collect::<Vec<_>>());
        let bdims = if tb { [F(n), F(k)] } else { [F(k), F(n)] };
        let tbt = TensorType::new(DType::F32, Shape(b_lead.iter().copied().chain(bdims).collect()));
        let tbt = if cb { c64t(&tbt.shape.0) } else { tbt };
        let args = [kw("transpose_b", ArgValue::Bool(tb)), kw("conj_b", ArgValue::Bool(cb))];
        let case = ok(Mode::Train, "matmul", &args, &[ta.clone(), tbt.clone()]);
        let batch = 2;
        let (l, vals) = eval_case(&case, batch, &mut r, &[]);
        let (a, bv) = (cx(&l[&case.inputs[0]]), cx(&l[&case.inputs[1]]));
        let count = |t: &TensorType| t.shape.resolve(batch).iter().product::<usize>();
        let p = (count(&ta) / (m * k)).max(count(&tbt) / (k * n));
        let (sa, sb) = (if a_lead.is_empty() { 0 } else { m * k }, if b_lead.is_empty() { 0 } else { k * n });
        let mut want = vec![C::new(0.0, 0.0); p * m * n];
        for q in 0..p {
            for i in 0..m {
                for j in 0..n {
                    want[(q * m + i) * n + j] = (0..k)
                        .map(|r| {
                            let bij = if tb { bv[q * sb + j * k + r] } else { bv[q * sb + r * n + j] };
                            a[q * sa + i * k + r] * if cb { bij.conj() } else { bij }
                        })
                        .sum::<C>();
                }
            }
        }
        close(&cx(&out(&case, &vals)), &want, 1e-12, "matmul");
    }
}

/// Naive PyTorch conv2d (cross-correlation) in f64.
#[allow(clippy::too_many_arguments)]
fn conv2d_ref(
    x: &[C],
    [n, c, h, w]: [usize; 4],
    wt: &[C],
    [o, cg, kh, kw]: [usize; 4],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
) -> (Vec<C>, [usize; 2]) {
    let ho = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) / stride[0] + 1;
    let wo = (w + 2 * pad[1] - dil[1] * (kw - 1) - 1) / stride[1] + 1;
    let og = o / groups;
    let mut y = vec![C::new(0.0, 0.0); n * o * ho * wo];
    for ni in 0..n {
        for oi in 0..o {
            let g = oi / og;
            for yi in 0..ho {
                for xi in 0..wo {
                    let mut acc = C::new(0.0, 0.0);
                    for ci in 0..cg {
                        for a in 0..kh {
                            for bb in 0..kw {
                                let hy = (yi * stride[0] + a * dil[0]) as i64 - pad[0] as i64;
                                let wx = (xi * stride[1] + bb * dil[1]) as i64 - pad[1] as i64;
                                if hy < 0 || wx < 0 || hy >= h as i64 || wx >= w as i64 {
                                    continue;
                                }
                                let cin = g * cg + ci;
                                let xv = x[((ni * c + cin) * h + hy as usize) * w + wx as usize];
                                acc += xv * wt[((oi * cg + ci) * kh + a) * kw + bb];
                            }
                        }
                    }
                    y[((ni * o + oi) * ho + yi) * wo + xi] = acc;
                }
            }
        }
    }
    (y, [ho, wo])
}

fn add_channel_bias(y: &mut [C], o: usize, per: usize, b: &[C]) {
    for (i, v) in y.iter_mut().enumerate() {
        *v += b[(i / per) % o];
    }
}

#[test]
fn conv2d_matches_naive_loops() {
    let mut r = rng("conv2d");
    for trial in 0..8 {
        let groups = 1 + r.below(2);
        let (c, o) = (groups * (1 + r.below(2)), groups * (1 + r.below(3)));
        let (kh, kwid) = (1 + r.below(3), 1 + r.below(3));
        let stride = [1 + r.below(2), 1 + r.below(3)];
        let pad = [r.below(2), r.below(3)];
        let dil = [1 + r.below(2), 1 + r.below(2)];
        let h = dil[0] * (kh - 1) + 1 + r.below(4);
        let w = dil[1] * (kwid - 1) + 1 + r.below(5);
        let bias = trial % 2 == 0;
        let dtype = if trial % 3 == 0 { DType::F32 } else { DType::C64 };
        let args = vec![
            pos(int(o as i64)),
            kw("kernel", ArgValue::Tuple(vec![kh as i64, kwid as i64])),
            kw("stride", ArgValue::Tuple(vec![stride[0] as i64, stride[1] as i64])),
            kw("pad", ArgValue::Tuple(vec![pad[0] as i64, pad[1] as i64])),
            kw("dilation", ArgValue::Tuple(vec![dil[0] as i64, dil[1] as i64])),
            kw("groups", int(groups as i64)),
            kw("bias", ArgValue::Bool(bias)),
        ];
        let ty = TensorType::new(dtype, Shape(vec![B, F(c), F(h), F(w)]));
        let case = ok(Mode::Train, "conv2d", &args, &[ty]);
        let n = 2;
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let x = cx(&l[&case.inputs[0]]);
        let wt = cx(&l[&param(&case, ".weight")]);
        let (mut want, [ho, wo]) =
            conv2d_ref(&x, [n, c, h, w], &wt, [o, c / groups, kh, kwid], stride, pad, dil, groups);
        if bias {
            add_channel_bias(&mut want, o, ho * wo, &cx(&l[&param(&case, ".bias")]));
        }
        let got = out(&case, &vals);
        assert_eq!(got.shape, [n, o, ho, wo], "trial {trial}");
        close(&cx(&got), &want, 1e-12, &format!("conv2d trial {trial}"));
    }
}

#[test]
fn conv1d_matches_naive_loops() {
    let mut r = rng("conv1d");
    let (c, o, k, len) = (2, 4, 3, 11);
    let args = [
        pos(int(o as i64)),
        pos(int(k as i64)),
        kw("stride", int(2)),
        kw("pad", int(2)),
        kw("dilation", int(2)),
        kw("groups", int(2)),
    ];
    let case = ok(Mode::Train, "conv1d", &args, &[c64t(&[B, F(c), F(len)])]);
    let n = 3;
    let (l, vals) = eval_case(&case, n, &mut r, &[]);
    let x = cx(&l[&case.inputs[0]]);
    let wt = cx(&l[&param(&case, ".weight")]);
    let (mut want, [_, lo]) =
        conv2d_ref(&x, [n, c, 1, len], &wt, [o, c / 2, 1, k], [1, 2], [0, 2], [1, 2], 2);
    add_channel_bias(&mut want, o, lo, &cx(&l[&param(&case, ".bias")]));
    let got = out(&case, &vals);
    assert_eq!(got.shape, [n, o, lo]);
    close(&cx(&got), &want, 1e-12, "conv1d");
}

#[test]
fn conv_transpose2d_matches_a_naive_scatter() {
    let mut r = rng("conv_transpose2d");
    for trial in 0..4 {
        let groups = 1 + trial % 2;
        let (ci, co) = (2 * groups, 3 * groups);
        let k = 2 + r.below(2);
        let (s, p, d) = (1 + r.below(2), r.below(2), 1 + r.below(2));
        let op = if s > 1 { r.below(s) } else { 0 };
        let (h, w) = (3 + r.below(2), 2 + r.below(3));
        let args = [
            pos(int(co as i64)),
            pos(int(k as i64)),
            kw("stride", int(s as i64)),
            kw("pad", int(p as i64)),
            kw("output_padding", int(op as i64)),
            kw("dilation", int(d as i64)),
            kw("groups", int(groups as i64)),
        ];
        let case = ok(Mode::Train, "conv_transpose2d", &args, &[c64t(&[B, F(ci), F(h), F(w)])]);
        let n = 2;
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let x = cx(&l[&case.inputs[0]]);
        let wt = cx(&l[&param(&case, ".weight")]);
        let b = cx(&l[&param(&case, ".bias")]);
        let ho = (h - 1) * s + d * (k - 1) + op + 1 - 2 * p;
        let wo = (w - 1) * s + d * (k - 1) + op + 1 - 2 * p;
        let (cig, cog) = (ci / groups, co / groups);
        let mut want = vec![C::new(0.0, 0.0); n * co * ho * wo];
        for ni in 0..n {
            for cin in 0..ci {
                let g = cin / cig;
                for yi in 0..h {
                    for xi in 0..w {
                        let xv = x[((ni * ci + cin) * h + yi) * w + xi];
                        for oc in 0..cog {
                            for a in 0..k {
                                for bb in 0..k {
                                    let oy = (yi * s + a * d) as i64 - p as i64;
                                    let ox = (xi * s + bb * d) as i64 - p as i64;
                                    if oy < 0 || ox < 0 || oy >= ho as i64 || ox >= wo as i64 {
                                        continue;
                                    }
                                    let cout = g * cog + oc;
                                    want[((ni * co + cout) * ho + oy as usize) * wo + ox as usize] +=
                                        xv * wt[((cin * cog + oc) * k + a) * k + bb];
                                }
                            }
                        }
                    }
                }
            }
        }
        add_channel_bias(&mut want, co, ho * wo, &b);
        let got = out(&case, &vals);
        assert_eq!(got.shape, [n, co, ho, wo], "trial {trial}");
        close(&cx(&got), &want, 1e-12, &format!("conv_transpose2d trial {trial}"));
    }
}

// ---------------------------------------------------------------- numerics: normalisation

/// Per-channel (axis 1) mean and biased variance of a real [N, C, S] layout.
fn channel_stats(x: &[f64], n: usize, c: usize, s: usize) -> (Vec<f64>, Vec<f64>) {
    let cnt = (n * s) as f64;
    let mut mean = vec![0.0; c];
    let mut var = vec![0.0; c];
    for ci in 0..c {
        let vals: Vec<f64> =
            (0..n).flat_map(|ni| (0..s).map(move |si| (ni * c + ci) * s + si)).map(|i| x[i]).collect();
        mean[ci] = vals.iter().sum::<f64>() / cnt;
        var[ci] = vals.iter().map(|v| (v - mean[ci]).powi(2)).sum::<f64>() / cnt;
    }
    (mean, var)
}

#[test]
fn naive_batchnorm_matches_the_formula_in_both_modes() {
    let mut r = rng("batchnorm_naive");
    let (n, c, h, w) = (3, 2, 2, 3);
    let s = h * w;
    let eps = 1e-3;
    let m = 0.2;
    let args =
        [kw("kind", word("naive")), kw("eps", ArgValue::Float(eps)), kw("momentum", ArgValue::Float(m))];
    let ty = c64t(&[B, F(c), F(h), F(w)]);
    for mode in [Mode::Train, Mode::Eval] {
        let case = ok(mode, "batchnorm", &args, std::slice::from_ref(&ty));
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let x = cx(&l[&case.inputs[0]]);
        let got = cx(&out(&case, &vals));
        let mut want = vec![C::new(0.0, 0.0); x.len()];
        for (part, sfx) in [(0, "_re"), (1, "_im")] {
            let xp: Vec<f64> = x.iter().map(|z| if part == 0 { z.re } else { z.im }).collect();
            let (bm, bv) = channel_stats(&xp, n, c, s);
            let rm = re(&l[&state(&case, &format!("running_mean{sfx}"))]);
            let rv = re(&l[&state(&case, &format!("running_var{sfx}"))]);
            let (mean, var) =
                if mode == Mode::Train { (bm.clone(), bv.clone()) } else { (rm.clone(), rv.clone()) };
            let g = re(&l[&param(&case, &format!("gamma{sfx}"))]);
            let b = re(&l[&param(&case, &format!("beta{sfx}"))]);
            for (i, v) in xp.iter().enumerate() {
                let ci = (i / s) % c;
                let y = (v - mean[ci]) / (var[ci] + eps).sqrt() * g[ci] + b[ci];
                if part == 0 {
                    want[i].re = y;
                } else {
                    want[i].im = y;
                }
            }
            if mode == Mode::Train {
                let cnt = (n * s) as f64;
                let nm: Vec<f64> = (0..c).map(|ci| (1.0 - m) * rm[ci] + m * bm[ci]).collect();
                let nv: Vec<f64> =
                    (0..c).map(|ci| (1.0 - m) * rv[ci] + m * bv[ci] * cnt / (cnt - 1.0)).collect();
                let target = state(&case, &format!("running_mean{sfx}"));
                close_re(&re(&assigned(&case, &vals, target)), &nm, 1e-12, "running mean");
                let target = state(&case, &format!("running_var{sfx}"));
                close_re(&re(&assigned(&case, &vals, target)), &nv, 1e-12, "running var");
            }
        }
        close(&got, &want, 1e-10, &format!("batchnorm {mode:?}"));
    }
}

#[test]
fn real_batchnorm_is_ordinary_batchnorm() {
    let mut r = rng("batchnorm_real");
    let (n, c) = (5, 3);
    for kind in ["naive", "whitening"] {
        let case = ok(Mode::Train, "batchnorm", &[kw("kind", word(kind))], &[f32t(&[B, F(c)])]);
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let x = re(&l[&case.inputs[0]]);
        let (mean, var) = channel_stats(&x, n, c, 1);
        let g = re(&l[&param(&case, "gamma")]);
        let b = re(&l[&param(&case, "beta")]);
        let want: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, v)| (v - mean[i % c]) / (var[i % c] + 1e-5).sqrt() * g[i % c] + b[i % c])
            .collect();
        close_re(&re(&out(&case, &vals)), &want, 1e-10, kind);
    }
}

/// Per-channel complex mean and covariance (Vrr, Vri, Vii) of [N, C, S].
fn complex_stats(z: &[C], n: usize, c: usize, s: usize) -> Vec<(C, f64, f64, f64)> {
    (0..c)
        .map(|ci| {
            let vals: Vec<C> =
                (0..n).flat_map(|ni| (0..s).map(move |si| (ni * c + ci) * s + si)).map(|i| z[i]).collect();
            let cnt = vals.len() as f64;
            let mu = vals.iter().sum::<C>() / cnt;
            let (mut rr, mut ri, mut ii) = (0.0, 0.0, 0.0);
            for v in &vals {
                let d = v - mu;
                rr += d.re * d.re;
                ri += d.re * d.im;
                ii += d.im * d.im;
            }
            (mu, rr / cnt, ri / cnt, ii / cnt)
        })
        .collect()
}

/// `V^{-1/2}` of a symmetric positive 2×2 matrix by eigendecomposition (independent of the
/// closed form the lowering uses).
fn inv_sqrt_2x2(a: f64, b: f64, d: f64) -> [[f64; 2]; 2] {
    let tr = a + d;
    let disc = (((a - d) / 2.0).powi(2) + b * b).sqrt();
    let (l1, l2) = (tr / 2.0 + disc, tr / 2.0 - disc);
    let (v1, v2) = if b.abs() > 1e-300 {
        let v1 = [l1 - d, b];
        let v2 = [l2 - d, b];
        let n1 = (v1[0] * v1[0] + v1[1] * v1[1]).sqrt();
        let n2 = (v2[0] * v2[0] + v2[1] * v2[1]).sqrt();
        ([v1[0] / n1, v1[1] / n1], [v2[0] / n2, v2[1] / n2])
    } else if a >= d {
        ([1.0, 0.0], [0.0, 1.0])
    } else {
        ([0.0, 1.0], [1.0, 0.0])
    };
    let (s1, s2) = (1.0 / l1.sqrt(), 1.0 / l2.sqrt());
    let mut m = [[0.0; 2]; 2];
    for i in 0..2 {
        for j in 0..2 {
            m[i][j] = s1 * v1[i] * v1[j] + s2 * v2[i] * v2[j];
        }
    }
    m
}

#[test]
fn whitening_batchnorm_gives_identity_covariance_per_channel() {
    let mut r = rng("batchnorm_whitening");
    let (n, c, len) = (4, 3, 6);
    let args = [
        kw("kind", word("whitening")),
        kw("affine", ArgValue::Bool(false)),
        kw("eps", ArgValue::Float(1e-12)),
    ];
    let case = ok(Mode::Train, "batchnorm", &args, &[c64t(&[B, F(c), F(len)])]);
    // Correlated re/im parts so the covariance is far from diagonal.
    let x: Vec<C> = (0..n * c * len)
        .map(|_| {
            let (a, b) = (r.normal(), r.normal());
            C::new(2.0 * a + 0.3, 0.8 * a + 0.5 * b - 1.0)
        })
        .collect();
    let xt = Tensor::complex(&[n, c, len], x);
    let (_, vals) = eval_case(&case, n, &mut r, &[(case.inputs[0], xt)]);
    let y = cx(&out(&case, &vals));
    for (ci, (mu, rr, ri, ii)) in complex_stats(&y, n, c, len).into_iter().enumerate() {
        let what = format!("channel {ci}");
        assert!(mu.norm() < 1e-9, "{what}: mean {mu}");
        assert!(
            (rr - 1.0).abs() < 1e-8 && (ii - 1.0).abs() < 1e-8 && ri.abs() < 1e-8,
            "{what}: cov {rr} {ri} {ii}"
        );
    }
}

#[test]
fn whitening_batchnorm_matches_the_formula_with_affine_and_running_stats() {
    let mut r = rng("batchnorm_whitening_affine");
    let (n, c, h, w) = (3, 2, 2, 2);
    let s = h * w;
    let eps = 1e-2;
    let m = 0.1;
    let args = [kw("kind", word("whitening")), kw("eps", ArgValue::Float(eps))];
    for mode in [Mode::Train, Mode::Eval] {
        let case = ok(mode, "batchnorm", &args, &[c64t(&[B, F(c), F(h), F(w)])]);
        let mut given = Vec::new();
        // A positive-definite running covariance for eval.
        let vrr: Vec<f64> = (0..c).map(|_| 0.5 + r.uniform()).collect();
        let vii: Vec<f64> = (0..c).map(|_| 0.5 + r.uniform()).collect();
        let vri: Vec<f64> =
            (0..c).map(|i| 0.4 * (vrr[i] * vii[i]).sqrt() * (2.0 * r.uniform() - 1.0)).collect();
        given.push((state(&case, "running_vrr"), Tensor::real(&[c], vrr.clone())));
        given.push((state(&case, "running_vii"), Tensor::real(&[c], vii.clone())));
        given.push((state(&case, "running_vri"), Tensor::real(&[c], vri.clone())));
        let (l, vals) = eval_case(&case, n, &mut r, &given);
        let x = cx(&l[&case.inputs[0]]);
        let stats = complex_stats(&x, n, c, s);
        let rmean = cx(&l[&state(&case, "running_mean")]);
        let (grr, gri, gii) = (
            re(&l[&param(&case, "gamma_rr")]),
            re(&l[&param(&case, "gamma_ri")]),
            re(&l[&param(&case, "gamma_ii")]),
        );
        let beta = cx(&l[&param(&case, ".beta")]);
        let mut want = vec![C::new(0.0, 0.0); x.len()];
        for (i, z) in x.iter().enumerate() {
            let ci = (i / s) % c;
            let (mu, a, b, d) =
                if mode == Mode::Train { stats[ci] } else { (rmean[ci], vrr[ci], vri[ci], vii[ci]) };
            let wm = inv_sqrt_2x2(a + eps, b, d + eps);
            let (xr, xi) = ((z - mu).re, (z - mu).im);
            let (tr, ti) = (wm[0][0] * xr + wm[0][1] * xi, wm[1][0] * xr + wm[1][1] * xi);
            want[i] = C::new(grr[ci] * tr + gri[ci] * ti, gri[ci] * tr + gii[ci] * ti) + beta[ci];
        }
        close(&cx(&out(&case, &vals)), &want, 1e-9, &format!("whitening {mode:?}"));
        if mode == Mode::Train {
            let cnt = (n * s) as f64;
            let f = cnt / (cnt - 1.0);
            let old = re(&l[&state(&case, "running_vri")]);
            let want: Vec<f64> = (0..c).map(|ci| (1.0 - m) * old[ci] + m * stats[ci].2 * f).collect();
            close_re(&re(&assigned(&case, &vals, state(&case, "running_vri"))), &want, 1e-12, "running vri");
            let want: Vec<C> = (0..c).map(|ci| rmean[ci] * (1.0 - m) + stats[ci].0 * m).collect();
            close(&cx(&assigned(&case, &vals, state(&case, "running_mean"))), &want, 1e-12, "running mean");
        }
    }
}

#[test]
fn real_layernorm_and_rmsnorm_match_their_formulas() {
    let mut r = rng("layernorm");
    let (n, c, len) = (3, 2, 4);
    for (op, axes) in [("layernorm", 1), ("layernorm", 2), ("rmsnorm", 1), ("rmsnorm", 2)] {
        let ty = f32t(&[B, F(c), F(len)]);
        let case = ok(Mode::Train, op, &[kw("axes", int(axes))], &[ty]);
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let x = re(&l[&case.inputs[0]]);
        let g = re(&l[&param(&case, "weight")]);
        let per = if axes == 1 { len } else { c * len };
        let bias = (op == "layernorm").then(|| re(&l[&param(&case, "bias")]));
        let mut want = vec![0.0; x.len()];
        for (row, chunk) in x.chunks(per).enumerate() {
            let mean = if op == "layernorm" { chunk.iter().sum::<f64>() / per as f64 } else { 0.0 };
            let var = chunk.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / per as f64;
            for j in 0..per {
                let b = bias.as_ref().map_or(0.0, |b| b[j]);
                want[row * per + j] = (chunk[j] - mean) / (var + 1e-5).sqrt() * g[j] + b;
            }
        }
        close_re(&re(&out(&case, &vals)), &want, 1e-10, op);
    }
}

#[test]
fn complex_layernorm_whitens_or_standardises_each_sample_row() {
    let mut r = rng("layernorm_complex");
    let (n, c, len) = (3, 2, 64);
    for kind in ["whitening", "naive"] {
        let args =
            [kw("kind", word(kind)), kw("affine", ArgValue::Bool(false)), kw("eps", ArgValue::Float(1e-9))];
        let case = ok(Mode::Train, "layernorm", &args, &[c64t(&[B, F(c), F(len)])]);
        // Correlated re/im, so whitening and naive differ.
        let x: Vec<C> = (0..n * c * len)
            .map(|_| {
                let (a, b) = (r.normal(), r.normal());
                C::new(2.0 * a + 0.5, a + 0.3 * b - 1.0)
            })
            .collect();
        let xin = Tensor::complex(&[n, c, len], x);
        let (_, vals) = eval_case(&case, n, &mut r, &[(case.inputs[0], xin)]);
        let y = cx(&out(&case, &vals));
        for row in y.chunks(len) {
            let m = row.iter().sum::<C>() / len as f64;
            let vrr = row.iter().map(|z| z.re * z.re).sum::<f64>() / len as f64;
            let vii = row.iter().map(|z| z.im * z.im).sum::<f64>() / len as f64;
            let vri = row.iter().map(|z| z.re * z.im).sum::<f64>() / len as f64;
            assert!(m.norm() < 1e-9, "{kind}: mean {m}");
            assert!((vrr - 1.0).abs() < 1e-6 && (vii - 1.0).abs() < 1e-6, "{kind}: variances {vrr} {vii}");
            if kind == "whitening" {
                assert!(vri.abs() < 1e-6, "whitening leaves covariance {vri}");
            } else {
                assert!(vri.abs() > 0.1, "naive keeps the correlation, got {vri}");
            }
        }
    }
}

#[test]
fn norm_parameters_have_complextorch_names_shapes_and_initial_values() {
    let x = c64t(&[B, F(3), F(4)]);
    let case = ok(Mode::Train, "layernorm", &[kw("axes", int(2))], std::slice::from_ref(&x));
    let names: Vec<(String, TensorType)> =
        case.params.iter().map(|p| (p.name.clone(), p.ty.clone())).collect();
    let pre = "t.layernorm_0";
    assert_eq!(
        names,
        vec![
            (format!("{pre}.weight"), f32t(&[F(2), F(2), F(3), F(4)])),
            (format!("{pre}.bias"), f32t(&[F(2), F(3), F(4)])),
        ]
    );
    let w = param(&case, "weight");
    assert_eq!(case.g.init_of(w), Some(&Init::Eye2 { scale: std::f64::consts::FRAC_1_SQRT_2 }));
    let vals = cvc_compiler::init::init_values(
        &Init::Eye2 { scale: 0.5 },
        DType::F32,
        &[2, 2, 3],
        &mut cvc_compiler::init::SplitMix64::new(1),
    );
    let got: Vec<f64> = vals.iter().map(|z| z.re).collect();
    assert_eq!(got, [0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5]);
    let case = ok(Mode::Train, "rmsnorm", &[], &[x]);
    let names: Vec<String> = case.params.iter().map(|p| p.name.clone()).collect();
    assert_eq!(names, ["t.rmsnorm_0.weight"]);
    assert_eq!(case.g.ty(param(&case, "weight")), &f32t(&[F(2), F(2), F(4)]));
}

#[test]
fn reductions_and_softmax_match_direct_loops() {
    let mut r = rng("reduce");
    let (n, a, k) = (2, 3, 5);
    let case = ok(Mode::Train, "softmax", &[kw("axis", int(1))], &[f32t(&[B, F(a), F(k)])]);
    let (l, vals) = eval_case(&case, n, &mut r, &[]);
    let x = re(&l[&case.inputs[0]]);
    let y = re(&out(&case, &vals));
    let case = ok(Mode::Train, "log_softmax", &[kw("axis", int(1))], &[f32t(&[B, F(a), F(k)])]);
    let (_, vals) = eval_case(&case, n, &mut r, &[(case.inputs[0], Tensor::real(&[n, a, k], x.clone()))]);
    let ly = re(&out(&case, &vals));
    for ni in 0..n {
        for ki in 0..k {
            let col: Vec<f64> = (0..a).map(|ai| x[(ni * a + ai) * k + ki]).collect();
            let z: f64 = col.iter().map(|v| v.exp()).sum();
            for (ai, c) in col.iter().enumerate() {
                let i = (ni * a + ai) * k + ki;
                assert!((y[i] - c.exp() / z).abs() < 1e-12, "softmax");
                assert!((ly[i] - (c - z.ln())).abs() < 1e-12, "log_softmax");
            }
        }
    }
    // mean over (0, 2) of a complex tensor, keepdim: [1, a, 1].
    let case = ok(
        Mode::Train,
        "mean",
        &[kw("axis", ArgValue::Tuple(vec![0, -1])), kw("keepdim", ArgValue::Bool(true))],
        &[c64t(&[B, F(a), F(k)])],
    );
    let (l, vals) = eval_case(&case, n, &mut r, &[]);
    let x = cx(&l[&case.inputs[0]]);
    let got = out(&case, &vals);
    assert_eq!(got.shape, [1, a, 1]);
    let want: Vec<C> = (0..a)
        .map(|ai| {
            (0..n)
                .flat_map(|ni| (0..k).map(move |ki| (ni, ki)))
                .map(|(ni, ki)| x[(ni * a + ai) * k + ki])
                .sum::<C>()
                / (n * k) as f64
        })
        .collect();
    close(&cx(&got), &want, 1e-12, "mean");
    // transpose(0, -1) of [B, a, k] is [k, a, B].
    let case = ok(Mode::Train, "transpose", &[pos(int(0)), pos(int(-1))], &[c64t(&[B, F(a), F(k)])]);
    let (l, vals) = eval_case(&case, n, &mut r, &[]);
    let x = cx(&l[&case.inputs[0]]);
    let got = out(&case, &vals);
    assert_eq!(got.shape, [k, a, n]);
    let want: Vec<C> = (0..k)
        .flat_map(|ki| (0..a).flat_map(move |ai| (0..n).map(move |ni| (ni, ai, ki))))
        .map(|(ni, ai, ki)| x[(ni * a + ai) * k + ki])
        .collect();
    close(&cx(&got), &want, 0.0, "transpose");
}

#[test]
fn norm_reduce_and_softmax_misuse_is_explained() {
    let d = err("softmax", &[], &[c64t(&[B, F(4)])]);
    assert!(help(&d).contains("abs") && help(&d).contains("real"), "{}", help(&d));
    let d = err("log_softmax", &[kw("axis", int(2))], &[f32t(&[B, F(4)])]);
    assert!(d.message.contains("out of range"), "{}", d.message);
    let d = err("mean", &[], &[f32t(&[B, F(4)])]);
    assert!(d.message.contains("missing its required argument `axis`"), "{}", d.message);
    let d = err("sum", &[kw("axis", ArgValue::Tuple(vec![1, -1]))], &[f32t(&[B, F(4)])]);
    assert!(d.message.contains("twice"), "{}", d.message);
    let d = err("layernorm", &[kw("axes", int(2))], &[c64t(&[B, F(4)])]);
    assert!(d.message.contains("batch"), "{}", d.message);
    let d = err("rmsnorm", &[kw("axes", int(3))], &[c64t(&[B, F(4)])]);
    assert!(d.message.contains("last 3 axes"), "{}", d.message);
    let d = err("transpose", &[pos(int(1))], &[c64t(&[B, F(4)])]);
    assert!(d.message.contains("axis1"), "{}", d.message);
}

// ---------------------------------------------------------------- numerics: activations

fn gelu_tanh_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

/// `x·Φ(x)`, with the normal CDF `Φ` integrated by Simpson's rule (no erf involved).
fn gelu_ref(x: f64) -> f64 {
    let n = 2000;
    let h = x / n as f64;
    let f = |t: f64| (-0.5 * t * t).exp();
    let mut s = f(0.0) + f(x);
    for i in 1..n {
        s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    let cdf = 0.5 + s * h / 3.0 / (2.0 * std::f64::consts::PI).sqrt();
    x * cdf
}

fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn activations_match_their_formulas() {
    let mut r = rng("activations");
    let shape = [B, F(3), F(5)];
    let n = 2;
    type Formula = fn(C) -> C;
    let complex_cases: [(&str, Formula); 6] = [
        ("crelu", |z| C::new(z.re.max(0.0), z.im.max(0.0))),
        ("zrelu", |z| if z.re > 0.0 && z.im > 0.0 { z } else { C::new(0.0, 0.0) }),
        ("cardioid", |z| z * 0.5 * (1.0 + z.arg().cos())),
        ("split_tanh", |z| C::new(z.re.tanh(), z.im.tanh())),
        ("split_sigmoid", |z| C::new(sigmoid_ref(z.re), sigmoid_ref(z.im))),
        ("cgelu", |z| C::new(gelu_ref(z.re), gelu_ref(z.im))),
    ];
    for (op, f) in complex_cases {
        let case = ok(Mode::Train, op, &[], &[c64t(&shape)]);
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let want: Vec<C> = cx(&l[&case.inputs[0]]).into_iter().map(f).collect();
        close(&cx(&out(&case, &vals)), &want, 1e-12, op);
    }
    type RealFormula = fn(f64) -> f64;
    let real_cases: [(&str, RealFormula, Vec<Arg>); 6] = [
        ("relu", |x| x.max(0.0), vec![]),
        ("tanh", f64::tanh, vec![]),
        ("sigmoid", sigmoid_ref, vec![]),
        ("gelu", gelu_ref, vec![]),
        ("gelu", gelu_tanh_ref, vec![kw("approximate", word("tanh"))]),
        ("split_tanh", f64::tanh, vec![]),
    ];
    for (op, f, args) in real_cases {
        let case = ok(Mode::Train, op, &args, &[f32t(&shape)]);
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let want: Vec<f64> = re(&l[&case.inputs[0]]).into_iter().map(f).collect();
        close_re(&re(&out(&case, &vals)), &want, 1e-12, op);
    }
}

#[test]
fn embedding_gathers_rows_of_its_weight() {
    let mut r = rng("embedding");
    let (vocab, dim, n, t) = (5, 3, 2, 4);
    for real in [false, true] {
        let args = [pos(int(vocab as i64)), pos(int(dim as i64)), kw("real", ArgValue::Bool(real))];
        let case = ok(Mode::Train, "embedding", &args, &[i32t(&[B, F(t)])]);
        let w = param(&case, ".weight");
        let info = case.params.iter().find(|p| p.value == w).expect("weight recorded");
        assert_eq!(info.name, "t.embedding_0.weight");
        assert_eq!(info.ty.shape, Shape::fixed(&[vocab, dim]));
        assert_eq!(info.ty.dtype, if real { DType::F32 } else { DType::C64 });
        assert!(matches!(&case.g.node(w).op, Op::Param { init: Init::Normal { std }, .. } if *std == 1.0));
        // A gather, not a one-hot product.
        assert!(case.g.nodes.iter().any(|(_, n)| matches!(n.op, Op::Gather)));
        assert!(!case.g.nodes.iter().any(|(_, n)| matches!(n.op, Op::OneHot { .. } | Op::MatMul { .. })));
        let ids: Vec<i64> = (0..n * t).map(|_| r.below(vocab) as i64).collect();
        let (l, vals) = eval_case(&case, n, &mut r, &[(case.inputs[0], Tensor::int(&[n, t], ids.clone()))]);
        let table = cx(&l[&w]);
        let want: Vec<C> =
            ids.iter().flat_map(|&i| table[i as usize * dim..(i as usize + 1) * dim].to_vec()).collect();
        close(&cx(&out(&case, &vals)), &want, 0.0, "embedding");
    }
    let d = err("embedding", &[pos(int(5)), pos(int(3))], &[c64t(&[B, F(4)])]);
    assert!(d.message.contains("integer tokens"), "{}", d.message);
}

#[test]
fn modrelu_matches_its_formula_and_is_safe_at_zero() {
    let mut r = rng("modrelu");
    let (n, c, len) = (2, 3, 4);
    let case = ok(Mode::Train, "modrelu", &[], &[c64t(&[B, F(c), F(len)])]);
    let mut x: Vec<C> = (0..n * c * len).map(|_| C::new(r.normal(), r.normal())).collect();
    x[0] = C::new(0.0, 0.0);
    let bias: Vec<f64> = (0..c).map(|_| r.normal()).collect();
    let given = [
        (case.inputs[0], Tensor::complex(&[n, c, len], x.clone())),
        (param(&case, ".bias"), Tensor::real(&[c], bias.clone())),
    ];
    let (_, vals) = eval_case(&case, n, &mut r, &given);
    let want: Vec<C> = x
        .iter()
        .enumerate()
        .map(|(i, z)| {
            let m = z.norm();
            let a = (m + bias[(i / len) % c]).max(0.0);
            if m == 0.0 {
                C::new(0.0, 0.0)
            } else {
                z * (a / m)
            }
        })
        .collect();
    let got = cx(&out(&case, &vals));
    assert!(got.iter().all(|z| z.re.is_finite() && z.im.is_finite()));
    close(&got, &want, 1e-12, "modrelu");
}

// ---------------------------------------------------------------- numerics: pooling, dropout

#[test]
fn pooling_matches_naive_windows() {
    let mut r = rng("pooling");
    let (n, c, h, w) = (2, 2, 5, 7);
    for (op, k, complex) in
        [("avgpool2d", 2, true), ("maxpool2d", 2, true), ("maxpool2d", 3, false), ("avgpool2d", 3, false)]
    {
        let ty =
            TensorType::new(if complex { DType::C64 } else { DType::F32 }, Shape(vec![B, F(c), F(h), F(w)]));
        let case = ok(Mode::Train, op, &[pos(int(k as i64))], &[ty]);
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let x = cx(&l[&case.inputs[0]]);
        let (ho, wo) = (h / k, w / k);
        let mut want = Vec::new();
        for nc in 0..n * c {
            for yi in 0..ho {
                for xi in 0..wo {
                    let win: Vec<C> =
                        (0..k * k).map(|t| x[(nc * h + yi * k + t / k) * w + xi * k + t % k]).collect();
                    want.push(if op == "avgpool2d" {
                        win.iter().sum::<C>() / (k * k) as f64
                    } else if complex {
                        // The first element of largest magnitude.
                        win.iter().fold(win[0], |best, &z| if z.norm() > best.norm() { z } else { best })
                    } else {
                        win.iter().fold(win[0], |best, &z| if z.re > best.re { z } else { best })
                    });
                }
            }
        }
        let got = out(&case, &vals);
        assert_eq!(got.shape, [n, c, ho, wo], "{op}");
        close(&cx(&got), &want, 1e-12, op);
    }
    for (op, k) in [("avgpool1d", 3), ("maxpool1d", 2)] {
        let len = 8;
        let case = ok(Mode::Train, op, &[pos(int(k as i64))], &[c64t(&[B, F(c), F(len)])]);
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let x = cx(&l[&case.inputs[0]]);
        let lo = len / k;
        let mut want = Vec::new();
        for nc in 0..n * c {
            for j in 0..lo {
                let win = &x[nc * len + j * k..nc * len + j * k + k];
                want.push(if op == "avgpool1d" {
                    win.iter().sum::<C>() / k as f64
                } else {
                    win.iter().fold(win[0], |best, &z| if z.norm() > best.norm() { z } else { best })
                });
            }
        }
        close(&cx(&out(&case, &vals)), &want, 1e-12, op);
    }
    let case = ok(Mode::Train, "global_avgpool", &[], &[c64t(&[B, F(c), F(h), F(w)])]);
    let (l, vals) = eval_case(&case, n, &mut r, &[]);
    let x = cx(&l[&case.inputs[0]]);
    let want: Vec<C> =
        (0..n * c).map(|nc| x[nc * h * w..(nc + 1) * h * w].iter().sum::<C>() / (h * w) as f64).collect();
    close(&cx(&out(&case, &vals)), &want, 1e-12, "global_avgpool");
}

#[test]
fn dropout_uses_the_shared_hash_and_is_the_identity_in_eval() {
    let mut r = rng("dropout");
    let p = 0.3;
    let ty = c64t(&[B, F(64)]);
    let n = 4;
    let case = ok(Mode::Train, "dropout", &[pos(ArgValue::Float(p))], std::slice::from_ref(&ty));
    let (l, vals) = eval_case(&case, n, &mut r, &[]);
    let x = cx(&l[&case.inputs[0]]);
    let got = cx(&out(&case, &vals));
    let salt = case
        .g
        .nodes
        .iter()
        .find_map(|(_, nd)| match nd.op {
            Op::DropoutMask { salt, .. } => Some(salt),
            _ => None,
        })
        .expect("a mask");
    let step = match &l[&state(&case, "step")].data {
        TensorData::Int(v) => v[0] as u32,
        _ => panic!("step is i32"),
    };
    let mut kept = 0;
    for (i, (g, z)) in got.iter().zip(&x).enumerate() {
        let keep = dropout_keep(p, salt, step, i as u32);
        kept += usize::from(keep);
        let want = if keep { z / (1.0 - p) } else { C::new(0.0, 0.0) };
        assert!((g - want).norm() < 1e-12, "element {i}");
    }
    let frac = kept as f64 / x.len() as f64;
    assert!((frac - (1.0 - p)).abs() < 0.15, "kept {frac}");
    let case = ok(Mode::Eval, "dropout", &[pos(ArgValue::Float(p))], &[ty]);
    assert_eq!(case.out, case.inputs[0]);
}

// ---------------------------------------------------------------- numerics: elementwise, shape

#[test]
fn elementwise_ops_match_complex_arithmetic() {
    let mut r = rng("elementwise");
    let n = 2;
    let full = c64t(&[B, F(3), F(2)]);
    let chan = f32t(&[F(3), F(1)]);
    type Pair = fn(C, C) -> C;
    let cases: [(&str, Pair); 4] =
        [("+", |a, b| a + b), ("-", |a, b| a - b), ("*", |a, b| a * b), ("/", |a, b| a / b)];
    for (op, f) in cases {
        for (ta, tb) in
            [(full.clone(), chan.clone()), (chan.clone(), full.clone()), (full.clone(), full.clone())]
        {
            let case = ok(Mode::Train, op, &[], &[ta.clone(), tb.clone()]);
            let (l, vals) = eval_case(&case, n, &mut r, &[]);
            let (a, b) = (&l[&case.inputs[0]], &l[&case.inputs[1]]);
            let (av, bv) = (cx(a), cx(b));
            let get = |t: &Tensor, v: &[C], i: usize| if t.shape.len() == 3 { v[i] } else { v[(i / 2) % 3] };
            let want: Vec<C> = (0..n * 6).map(|i| f(get(a, &av, i), get(b, &bv, i))).collect();
            close(&cx(&out(&case, &vals)), &want, 1e-12, op);
        }
    }
    type One = fn(C) -> C;
    let unary: [(&str, Vec<Arg>, One); 9] = [
        ("conj", vec![], |z| z.conj()),
        ("abs", vec![], |z| C::new(z.norm(), 0.0)),
        ("abs2", vec![], |z| C::new(z.norm_sqr(), 0.0)),
        ("angle", vec![], |z| C::new(z.arg(), 0.0)),
        ("real", vec![], |z| C::new(z.re, 0.0)),
        ("imag", vec![], |z| C::new(z.im, 0.0)),
        ("scale", vec![pos(ArgValue::Float(-1.5))], |z| z * -1.5),
        ("*", vec![pos(ArgValue::Float(2.5))], |z| z * 2.5),
        ("-", vec![], |z| -z),
    ];
    for (op, args, f) in unary {
        let case = ok(Mode::Train, op, &args, std::slice::from_ref(&full));
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let want: Vec<C> = cx(&l[&case.inputs[0]]).into_iter().map(f).collect();
        close(&cx(&out(&case, &vals)), &want, 1e-12, op);
    }
    let real = f32t(&[B, F(4)]);
    for (op, f) in [
        ("complex", (|a: f64, b: f64| C::new(a, b)) as fn(f64, f64) -> C),
        ("polar", |m, t| C::from_polar(m, t)),
    ] {
        let case = ok(Mode::Train, op, &[], &[real.clone(), real.clone()]);
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let (a, b) = (re(&l[&case.inputs[0]]), re(&l[&case.inputs[1]]));
        let want: Vec<C> = a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect();
        close(&cx(&out(&case, &vals)), &want, 1e-12, op);
    }
}

#[test]
fn shape_ops_move_the_right_elements() {
    let mut r = rng("shape");
    let n = 2;
    let (c, h, w) = (4, 2, 3);
    let x4 = c64t(&[B, F(c), F(h), F(w)]);
    // flatten and reshape keep row-major order.
    for (op, args) in [("flatten", vec![]), ("reshape", vec![pos(word("B")), pos(int(6)), pos(int(-1))])] {
        let case = ok(Mode::Train, op, &args, std::slice::from_ref(&x4));
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        close(&cx(&out(&case, &vals)), &cx(&l[&case.inputs[0]]), 0.0, op);
    }
    // concat along axis 1, then split back out.
    let y4 = c64t(&[B, F(2), F(h), F(w)]);
    let case = ok(Mode::Train, "concat", &[kw("axis", int(1))], &[x4.clone(), y4.clone()]);
    let (l, vals) = eval_case(&case, n, &mut r, &[]);
    let (a, b) = (cx(&l[&case.inputs[0]]), cx(&l[&case.inputs[1]]));
    let per = h * w;
    let mut want = Vec::new();
    for ni in 0..n {
        want.extend_from_slice(&a[ni * c * per..(ni + 1) * c * per]);
        want.extend_from_slice(&b[ni * 2 * per..(ni + 1) * 2 * per]);
    }
    close(&cx(&out(&case, &vals)), &want, 0.0, "concat");
    let case = ok(
        Mode::Train,
        "split",
        &[pos(int(1)), pos(int(2)), pos(int(1)), kw("axis", int(1)), kw("index", int(1))],
        std::slice::from_ref(&x4),
    );
    let (l, vals) = eval_case(&case, n, &mut r, &[]);
    let a = cx(&l[&case.inputs[0]]);
    let want: Vec<C> = (0..n).flat_map(|ni| a[(ni * c + 1) * per..(ni * c + 3) * per].to_vec()).collect();
    close(&cx(&out(&case, &vals)), &want, 0.0, "split");
    // permute(0, 2, 3, 1): channels last.
    let case = ok(Mode::Train, "permute", &[pos(int(0)), pos(int(2)), pos(int(3)), pos(int(1))], &[x4]);
    let (l, vals) = eval_case(&case, n, &mut r, &[]);
    let a = cx(&l[&case.inputs[0]]);
    let mut want = Vec::new();
    for ni in 0..n {
        for yi in 0..h {
            for xi in 0..w {
                for ci in 0..c {
                    want.push(a[((ni * c + ci) * h + yi) * w + xi]);
                }
            }
        }
    }
    close(&cx(&out(&case, &vals)), &want, 0.0, "permute");
}

// ---------------------------------------------------------------- numerics: spectral

/// Naive DFT of `x` (shape `shape`) along `axis`.
fn dft_ref(x: &[C], shape: &[usize], axis: usize, inverse: bool, scale: f64) -> Vec<C> {
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let sign = if inverse { 1.0 } else { -1.0 };
    let mut y = vec![C::new(0.0, 0.0); x.len()];
    for o in 0..outer {
        for i in 0..inner {
            for k in 0..len {
                let mut acc = C::new(0.0, 0.0);
                for t in 0..len {
                    let ang = sign * 2.0 * std::f64::consts::PI * (k * t) as f64 / len as f64;
                    acc += x[(o * len + t) * inner + i] * C::from_polar(1.0, ang);
                }
                y[(o * len + k) * inner + i] = acc * scale;
            }
        }
    }
    y
}

#[test]
fn fft_matches_a_naive_dft() {
    let mut r = rng("fft");
    let n = 2;
    let dims = [3usize, 5];
    let ty = c64t(&[B, F(dims[0]), F(dims[1])]);
    let shape = [n, dims[0], dims[1]];
    for (op, axis, norm) in [
        ("fft", -1i64, "backward"),
        ("ifft", -1, "backward"),
        ("fft", 1, "ortho"),
        ("ifft", 2, "forward"),
        ("fft", 2, "forward"),
    ] {
        let args = [kw("axis", int(axis)), kw("norm", ArgValue::Str(norm.into()))];
        let case = ok(Mode::Train, op, &args, std::slice::from_ref(&ty));
        let (l, vals) = eval_case(&case, n, &mut r, &[]);
        let ax = if axis < 0 { 2 } else { axis as usize };
        let len = shape[ax] as f64;
        let inverse = op == "ifft";
        let scale = match (norm, inverse) {
            ("ortho", _) => 1.0 / len.sqrt(),
            ("backward", false) | ("forward", true) => 1.0,
            _ => 1.0 / len,
        };
        let want = dft_ref(&cx(&l[&case.inputs[0]]), &shape, ax, inverse, scale);
        close(&cx(&out(&case, &vals)), &want, 1e-10, &format!("{op} axis {axis} {norm}"));
    }
    // fft2 of a real image, then ifft2 recovers it.
    let img = f32t(&[B, F(4), F(6)]);
    let case = ok(Mode::Train, "fft2", &[], &[img]);
    let (l, vals) = eval_case(&case, n, &mut r, &[]);
    let x = cx(&l[&case.inputs[0]]);
    let shape = [n, 4, 6];
    let want = dft_ref(&dft_ref(&x, &shape, 1, false, 1.0), &shape, 2, false, 1.0);
    let spectrum = out(&case, &vals);
    close(&cx(&spectrum), &want, 1e-10, "fft2");
    let back = ok(Mode::Train, "ifft2", &[], &[c64t(&[B, F(4), F(6)])]);
    let (_, vals) = eval_case(&back, n, &mut r, &[(back.inputs[0], spectrum)]);
    close(&cx(&out(&back, &vals)), &x, 1e-10, "ifft2(fft2(x))");
}

// ---------------------------------------------------------------- numerics: losses

#[test]
fn cross_entropy_matches_the_hand_formula() {
    let mut r = rng("cross_entropy");
    let (n, k) = (5, 4);
    let case = ok(Mode::Train, "cross_entropy", &[], &[f32t(&[B, F(k)]), i32t(&[B])]);
    // Large logits check the max shift.
    let logits: Vec<f64> = (0..n * k).map(|_| 40.0 * r.normal()).collect();
    let labels: Vec<i64> = (0..n).map(|_| r.below(k) as i64).collect();
    let given = [
        (case.inputs[0], Tensor::real(&[n, k], logits.clone())),
        (case.inputs[1], Tensor::int(&[n], labels.clone())),
    ];
    let (_, vals) = eval_case(&case, n, &mut r, &given);
    let mut want = 0.0;
    for bi in 0..n {
        let row = &logits[bi * k..(bi + 1) * k];
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        want += lse - row[labels[bi] as usize];
    }
    want /= n as f64;
    let got = out(&case, &vals);
    assert!(got.shape.is_empty());
    close_re(&re(&got), &[want], 1e-12, "cross_entropy");
}

#[test]
fn regression_losses_match_their_means() {
    let mut r = rng("losses");
    let n = 3;
    for (op, f) in [("mse", (|d: C| d.norm_sqr()) as fn(C) -> f64), ("l1", |d| d.norm())] {
        for tt in [c64t(&[B, F(2), F(3)]), f32t(&[B, F(2), F(3)])] {
            let case = ok(Mode::Train, op, &[], &[c64t(&[B, F(2), F(3)]), tt]);
            let (l, vals) = eval_case(&case, n, &mut r, &[]);
            let (p, t) = (cx(&l[&case.inputs[0]]), cx(&l[&case.inputs[1]]));
            let want = p.iter().zip(&t).map(|(a, b)| f(a - b)).sum::<f64>() / p.len() as f64;
            let got = out(&case, &vals);
            assert!(got.shape.is_empty());
            close_re(&re(&got), &[want], 1e-12, op);
        }
    }
}

// ---------------------------------------------------------------- gradients through every layer

/// Appends `L = Σ Re(y · probe)` (a random real linear functional of the output) and the
/// gradients of `L` w.r.t. the float inputs and every parameter; returns `(loss, [(leaf, grad)])`.
fn probe_loss(case: &mut Case) -> (Value, Vec<(Value, Value)>) {
    let yt = case.g.ty(case.out).clone();
    let mut wrt: Vec<Value> =
        case.inputs.iter().copied().filter(|&v| case.g.ty(v).dtype != DType::I32).collect();
    wrt.extend(case.params.iter().map(|p| p.value));
    let loss = {
        let mut b = builder::Builder::new(&mut case.g);
        let probe = b.leaf(Op::Input { name: "probe".into() }, yt.clone());
        let m = b.mul(case.out, probe).expect("probe product");
        let r = if yt.dtype.is_complex() { b.unary(UnaryOp::Real, m).expect("real part") } else { m };
        let axes: Vec<usize> = (0..yt.shape.rank()).collect();
        let s = if axes.is_empty() { r } else { b.sum(r, &axes).expect("sum") };
        b.reshape(s, Shape::scalar()).expect("scalar loss")
    };
    let grads = cvc_compiler::passes::autodiff::gradients(&mut case.g, loss, &wrt).expect("autodiff");
    verify(&case.g).expect("valid graph after autodiff");
    (loss, wrt.into_iter().zip(grads).collect())
}

/// Perturbs element `k` of leaf `v` (real part, or imaginary part when `imag`) by `d`.
fn perturbed(l: &HashMap<Value, Tensor>, v: Value, k: usize, imag: bool, d: f64) -> HashMap<Value, Tensor> {
    let mut m = l.clone();
    let t = m.get_mut(&v).expect("leaf");
    match &mut t.data {
        TensorData::Real(x) => x[k] += d,
        TensorData::Complex(x) => {
            if imag {
                x[k].im += d
            } else {
                x[k].re += d
            }
        }
        TensorData::Int(_) => unreachable!("integer leaves are not differentiated"),
    }
    m
}

/// Central finite differences on a few random elements of every differentiated leaf,
/// against the autodiff gradient (conjugate-Wirtinger: `∂L/∂x + i ∂L/∂y`).
fn gradcheck(op: &str, args: &[Arg], inputs: &[TensorType], mode: Mode, rng: &mut Rng) {
    let mut case = ok(mode, op, args, inputs);
    let (loss, grads) = probe_loss(&mut case);
    let batch = 3;
    let l = leaves(&case, batch, rng, &[]);
    let vals = run(&case, batch, &l);
    let loss_at =
        |m: &HashMap<Value, Tensor>| re(&run(&case, batch, m)[loss.index()].clone().expect("loss"))[0];
    let h = 1e-6;
    for (w, gv) in grads {
        let g = cx(vals[gv.index()].as_ref().expect("gradient"));
        let complex = case.g.ty(w).dtype.is_complex();
        for _ in 0..4 {
            let k = rng.below(g.len());
            for imag in [false, true] {
                if imag && !complex {
                    continue;
                }
                let fd = (loss_at(&perturbed(&l, w, k, imag, h)) - loss_at(&perturbed(&l, w, k, imag, -h)))
                    / (2.0 * h);
                let an = if imag { g[k].im } else { g[k].re };
                let name = case.g.leaf_name(w).unwrap_or("?").to_string();
                assert!(
                    (fd - an).abs() <= 1e-5 * (1.0 + fd.abs()),
                    "`{op}` ({mode:?}): d loss / d {name}[{k}].{} = {fd} by finite differences, {an} by autodiff",
                    if imag { "im" } else { "re" }
                );
            }
        }
    }
}

#[test]
fn gradients_through_every_layer_match_finite_differences() {
    let mut r = rng("gradcheck");
    let x4 = c64t(&[B, F(2), F(4), F(4)]);
    let x3 = c64t(&[B, F(2), F(6)]);
    let c2 = c64t(&[B, F(4)]);
    let r2 = f32t(&[B, F(4)]);
    let cases: Vec<(&str, Vec<Arg>, Vec<TensorType>)> = vec![
        ("linear", vec![pos(int(3))], vec![r2.clone()]),
        ("linear", vec![pos(int(3))], vec![c2.clone()]),
        ("linear", vec![pos(int(3))], vec![x3.clone()]),
        (
            "matmul",
            vec![kw("transpose_b", ArgValue::Bool(true)), kw("conj_b", ArgValue::Bool(true))],
            vec![x3.clone(), x3.clone()],
        ),
        ("matmul", vec![], vec![x3.clone(), f32t(&[F(6), F(3)])]),
        ("matmul", vec![kw("conj_b", ArgValue::Bool(true))], vec![f32t(&[F(3), F(2)]), x3.clone()]),
        ("conv2d", vec![pos(int(2)), pos(int(3)), kw("pad", int(1)), kw("stride", int(2))], vec![x4.clone()]),
        ("conv1d", vec![pos(int(2)), pos(int(3)), kw("dilation", int(2))], vec![x3.clone()]),
        ("conv_transpose2d", vec![pos(int(2)), pos(int(3)), kw("stride", int(2))], vec![x4.clone()]),
        ("batchnorm", vec![], vec![x4.clone()]),
        ("batchnorm", vec![kw("kind", word("whitening"))], vec![x3.clone()]),
        ("batchnorm", vec![], vec![r2.clone()]),
        ("layernorm", vec![], vec![x3.clone()]),
        ("layernorm", vec![kw("axes", int(2)), kw("kind", word("naive"))], vec![x3.clone()]),
        ("layernorm", vec![kw("axes", int(2))], vec![f32t(&[B, F(2), F(6)])]),
        ("rmsnorm", vec![kw("axes", int(2))], vec![x3.clone()]),
        ("rmsnorm", vec![], vec![r2.clone()]),
        ("softmax", vec![], vec![f32t(&[B, F(2), F(6)])]),
        ("log_softmax", vec![kw("axis", int(1))], vec![f32t(&[B, F(2), F(6)])]),
        ("sum", vec![kw("axis", ArgValue::Tuple(vec![0, 2]))], vec![x3.clone()]),
        ("mean", vec![kw("axis", int(-1)), kw("keepdim", ArgValue::Bool(true))], vec![x3.clone()]),
        ("transpose", vec![pos(int(0)), pos(int(2))], vec![x3.clone()]),
        ("crelu", vec![], vec![c2.clone()]),
        ("modrelu", vec![], vec![x3.clone()]),
        ("zrelu", vec![], vec![c2.clone()]),
        ("cardioid", vec![], vec![c2.clone()]),
        ("split_tanh", vec![], vec![c2.clone()]),
        ("split_sigmoid", vec![], vec![c2.clone()]),
        ("cgelu", vec![], vec![c2.clone()]),
        ("gelu", vec![], vec![r2.clone()]),
        ("gelu", vec![kw("approximate", word("tanh"))], vec![r2.clone()]),
        ("embedding", vec![pos(int(3)), pos(int(2))], vec![i32t(&[B, F(5)])]),
        ("embedding", vec![pos(int(4)), pos(int(3)), kw("real", ArgValue::Bool(true))], vec![i32t(&[B])]),
        ("relu", vec![], vec![r2.clone()]),
        ("avgpool2d", vec![pos(int(2))], vec![c64t(&[B, F(2), F(5), F(4)])]),
        ("maxpool2d", vec![pos(int(2))], vec![x4.clone()]),
        ("maxpool1d", vec![pos(int(3))], vec![x3.clone()]),
        ("global_avgpool", vec![], vec![x4.clone()]),
        ("dropout", vec![pos(ArgValue::Float(0.5))], vec![c2.clone()]),
        ("+", vec![], vec![c2.clone(), r2.clone()]),
        ("*", vec![], vec![c2.clone(), c2.clone()]),
        ("/", vec![], vec![r2.clone(), c2.clone()]),
        ("abs", vec![], vec![c2.clone()]),
        ("angle", vec![], vec![c2.clone()]),
        ("polar", vec![], vec![r2.clone(), r2.clone()]),
        ("concat", vec![], vec![x4.clone(), x4.clone()]),
        ("split", vec![pos(int(1)), pos(int(3)), kw("axis", int(-1)), kw("index", int(1))], vec![x4.clone()]),
        ("permute", vec![pos(int(2)), pos(int(0)), pos(int(1))], vec![x3.clone()]),
        ("fft", vec![kw("norm", word("ortho"))], vec![x3.clone()]),
        ("ifft2", vec![], vec![x4.clone()]),
        ("cross_entropy", vec![], vec![r2.clone(), i32t(&[B])]),
        ("mse", vec![], vec![c2.clone(), c2.clone()]),
        ("l1", vec![], vec![c2.clone(), r2.clone()]),
    ];
    for (op, args, inputs) in &cases {
        gradcheck(op, args, inputs, Mode::Train, &mut r);
    }
    gradcheck("batchnorm", &[kw("kind", word("whitening"))], &[x4], Mode::Eval, &mut r);
}

// ---------------------------------------------------------------- robustness

/// Random argument lists and operand types for every operator: lowering returns a diagnostic
/// or a valid graph, never panics.
#[test]
fn random_calls_never_panic() {
    let mut r = rng("random_calls");
    let names = [
        "out",
        "kernel",
        "stride",
        "pad",
        "dilation",
        "groups",
        "bias",
        "axis",
        "index",
        "kind",
        "p",
        "eps",
        "norm",
        "c",
        "init",
        "value",
        "real",
        "axes",
        "keepdim",
        "axis0",
        "axis1",
        "vocab",
        "dim",
        "approximate",
        "scale",
        "size",
        "mode",
        "weight",
        "ignore_index",
        "label_smoothing",
        "smooth",
        "count_include_pad",
        "align_corners",
        "affine",
        "output_padding",
        "transpose_b",
        "conj_b",
    ];
    let values = |r: &mut Rng| match r.below(9) {
        0 => int(r.below(7) as i64 - 2),
        1 => int(i64::MAX - r.below(3) as i64),
        2 => int(i64::MIN + r.below(3) as i64),
        3 => ArgValue::Float([0.5, -1.0, f64::NAN, f64::INFINITY, 1e300][r.below(5)]),
        4 => ArgValue::Bool(r.below(2) == 0),
        5 => word(["B", "whitening", "ortho", "he", "x"][r.below(5)]),
        6 => ArgValue::Str("naive".into()),
        7 => ArgValue::Range(0.0, 1.0),
        8 if r.below(3) == 0 => {
            ArgValue::Numbers((0..r.below(4)).map(|i| [0.5, -1.0, f64::NAN][i % 3]).collect())
        }
        _ => ArgValue::Tuple((0..r.below(4)).map(|_| r.below(5) as i64 - 1).collect()),
    };
    let dims = |r: &mut Rng| -> Vec<Dim> {
        (0..[0, 1, 2, 2, 3, 3, 4, 4, 4, 5][r.below(10)])
            .map(|i| if i == 0 && r.below(4) > 0 { B } else { F(1 + r.below(6)) })
            .collect()
    };
    let mut lowered = 0;
    for _ in 0..30_000 {
        let op = known_ops()[r.below(known_ops().len())];
        let args: Vec<Arg> = (0..r.below(5))
            .map(|_| {
                if r.below(2) == 0 {
                    pos(values(&mut r))
                } else {
                    kw(names[r.below(names.len())], values(&mut r))
                }
            })
            .collect();
        let count = [1, 1, 1, 2, 2, 0, 3][r.below(7)];
        let inputs: Vec<TensorType> = (0..count)
            .map(|_| {
                let dt = [DType::F32, DType::C64, DType::C64, DType::I32][r.below(4)];
                TensorType::new(dt, Shape(dims(&mut r)))
            })
            .collect();
        let mode = if r.below(2) == 0 { Mode::Train } else { Mode::Eval };
        // `lower` verifies the graph of every successful call.
        lowered += usize::from(lower(mode, op, &args, &inputs).is_ok());
    }
    eprintln!("{lowered} of 30000 random calls lowered");
    assert!(lowered > 300, "the random calls should often be valid");
}
