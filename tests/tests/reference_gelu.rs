//! The interpreter's GELU family against PyTorch (`tests/reference/gelu/make.py`): exact and
//! tanh `gelu` and torchcvnn's `CGELU`, through the front end (`gelu`, `gelu(approximate =
//! tanh)`, `cgelu`), forward and gradient (autodiff of `Σ w·f(x)`, complex
//! `Σ Re(conj(w)·f(z))`), and the derivative primitives with their own gradients (the
//! second derivatives autodiff uses for double backward).

use cvc_compiler::front::check_source;
use cvc_compiler::interp::{evaluate, Tensor};
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::*;
use cvc_compiler::passes::autodiff::gradients;
use num_complex::Complex64;
use serde_json::Value as Json;
use std::collections::HashMap;

fn reference() -> Json {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("reference/gelu/gelu.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("gelu.json")).expect("valid JSON")
}

fn reals(j: &Json, key: &str) -> Vec<f64> {
    j[key].as_array().unwrap_or_else(|| panic!("{key}")).iter().map(|v| v.as_f64().expect("number")).collect()
}

fn complexes(j: &Json, key: &str) -> Vec<Complex64> {
    j[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key}"))
        .iter()
        .map(|p| Complex64::new(p[0].as_f64().expect("re"), p[1].as_f64().expect("im")))
        .collect()
}

/// Agreement to 1e-12 relative to the magnitude (both sides are f64; erf differs in the last bits).
fn close(what: &str, got: &[Complex64], want: &[Complex64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-12 * (1.0 + w.norm());
        assert!((g - w).norm() <= tol, "{what}[{i}]: interpreter {g}, PyTorch {w}");
    }
}

fn as_c(v: &[f64]) -> Vec<Complex64> {
    v.iter().map(|&x| Complex64::new(x, 0.0)).collect()
}

/// Appends `Σ Re(conj(w)·out)` (real: `Σ w·out`) with `w` a new input, returns (loss, w).
fn weighted_sum(g: &mut Graph, out: Value) -> (Value, Value) {
    let mut b = Builder::new(g);
    let ty = b.graph.ty(out).clone();
    let w = b.leaf(Op::Input { name: "w".into() }, ty.clone());
    let p = if ty.dtype.is_complex() {
        let cw = b.unary(UnaryOp::Conj, w).unwrap();
        let p = b.mul(cw, out).unwrap();
        b.unary(UnaryOp::Real, p).unwrap()
    } else {
        b.mul(w, out).unwrap()
    };
    let axes: Vec<usize> = (0..ty.shape.rank()).collect();
    let s = b.sum(p, &axes).unwrap();
    (b.reshape(s, Shape::scalar()).unwrap(), w)
}

/// Value and gradient of the layer `op` (`.cvnn` text) on `x`, weighted by `w`.
fn layer(op: &str, dtype: &str, x: Tensor, w: Tensor) -> (Vec<Complex64>, Vec<Complex64>) {
    let n = x.shape[1];
    let src = format!("model M {{\n    input x: {dtype}[B, {n}]\n    y = x |> {op}\n    output y\n}}\n");
    let mut g = check_source("m.cvnn", &src, Mode::Eval).unwrap_or_else(|d| panic!("{op}: {d:?}")).graph;
    let (xin, y) = (g.inputs().next().expect("input"), g.outputs[0].value);
    let (loss, win) = weighted_sum(&mut g, y);
    let dx = gradients(&mut g, loss, &[xin]).expect("autodiff")[0];
    let vals = evaluate(&g, 1, &HashMap::from([(xin, x), (win, w)])).expect("evaluates");
    let get = |v: Value| vals[v.index()].as_ref().expect("value").to_complex_vec();
    (get(y), get(dx))
}

#[test]
fn gelu_exact_and_tanh_match_pytorch() {
    let j = reference();
    let x = reals(&j, "x");
    let w = reals(&j, "w");
    let n = x.len();
    for (op, key) in [("gelu", "gelu"), ("gelu(approximate = tanh)", "gelu_tanh")] {
        let (y, dx) = layer(op, "f32", Tensor::real(&[1, n], x.clone()), Tensor::real(&[1, n], w.clone()));
        close(op, &y, &as_c(&reals(&j, key)));
        close(&format!("grad {op}"), &dx, &as_c(&reals(&j, &format!("{key}_grad"))));
    }
}

#[test]
fn cgelu_matches_torchcvnn() {
    let j = reference();
    let z = complexes(&j, "z");
    let n = z.len();
    let (y, dz) =
        layer("cgelu", "c64", Tensor::complex(&[1, n], z), Tensor::complex(&[1, n], complexes(&j, "wz")));
    close("cgelu", &y, &complexes(&j, "cgelu"));
    close("grad cgelu", &dz, &complexes(&j, "cgelu_grad"));
}

#[test]
fn gelu_derivative_primitives_match_pytorch_double_backward() {
    let j = reference();
    let x = reals(&j, "x");
    let n = x.len();
    for (op, key) in [(UnaryOp::GeluGrad, "gelu"), (UnaryOp::GeluTanhGrad, "gelu_tanh")] {
        let mut g = Graph::new("d", Mode::Eval);
        let (xin, d1) = {
            let mut b = Builder::new(&mut g);
            let xin = b.leaf(Op::Input { name: "x".into() }, TensorType::new(DType::F32, Shape::fixed(&[n])));
            (xin, b.unary(op, xin).unwrap())
        };
        let (loss, win) = weighted_sum(&mut g, d1);
        let dx = gradients(&mut g, loss, &[xin]).expect("autodiff")[0];
        let leaves =
            HashMap::from([(xin, Tensor::real(&[n], x.clone())), (win, Tensor::real(&[n], vec![1.0; n]))]);
        let vals = evaluate(&g, 1, &leaves).expect("evaluates");
        let get = |v: Value| vals[v.index()].as_ref().expect("value").to_complex_vec();
        close(&format!("{op:?}"), &get(d1), &as_c(&reals(&j, &format!("{key}_d1"))));
        close(&format!("grad {op:?}"), &get(dx), &as_c(&reals(&j, &format!("{key}_d2"))));
    }
}
