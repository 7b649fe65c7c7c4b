//! The per-sample norms, softmax and reductions of issue 11 against PyTorch: complextorch
//! 2.1.1's `LayerNorm`/`RMSNorm`, torch.nn's `LayerNorm`, `RMSNorm`, `softmax`, `log_softmax`,
//! `sum`, `mean` (`tests/reference/norms/make.py`, values in its `.npz` files).
//!
//! Each case compiles a one-stage model `y = x |> <call>` from the source text, loads the
//! reference input and parameters under cvc's names (which are the PyTorch module's names
//! under the layer prefix, so the state dict loads as is), and compares the f64 interpreter's
//! output and the gradients of `L = Σ Re(conj(w)·y)` w.r.t. the input and every parameter.

use cvc_compiler::interp::{evaluate, Tensor};
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::*;
use cvc_compiler::passes::autodiff::gradients;
use cvc_runtime::data::npy::load_npz;
use cvc_tests::differential::from_host;
use std::collections::HashMap;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("reference/norms")
}

/// `Σ Re(conj(w)·y)` (real `y`: `Σ w·y`) as a scalar, `w` the input `probe`.
fn probe_loss(b: &mut Builder, y: Value) -> Result<(Value, Value), String> {
    let ty = b.graph.ty(y).clone();
    let w = b.leaf(Op::Input { name: "probe".into() }, ty.clone());
    let p = if ty.dtype.is_complex() {
        let cw = b.unary(UnaryOp::Conj, w)?;
        let m = b.mul(cw, y)?;
        b.unary(UnaryOp::Real, m)?
    } else {
        b.mul(w, y)?
    };
    let axes: Vec<usize> = (0..ty.shape.rank()).collect();
    let s = if axes.is_empty() { p } else { b.sum(p, &axes)? };
    Ok((w, b.reshape(s, Shape::scalar())?))
}

/// The largest elementwise difference relative to the reference's largest magnitude.
fn max_rel(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape, want.shape, "shapes differ");
    let (g, w) = (got.to_complex_vec(), want.to_complex_vec());
    let scale = w.iter().map(|z| z.norm()).fold(0.0f64, f64::max).max(1e-30);
    g.iter().zip(&w).map(|(a, b)| (a - b).norm()).fold(0.0, f64::max) / scale
}

fn run_case(case: &serde_json::Value) {
    let name = case["name"].as_str().expect("name");
    let dims: Vec<String> = case["dims"].as_array().expect("dims").iter().map(|d| d.to_string()).collect();
    let src = format!(
        "model M {{\n    input x: {}[B, {}]\n    y = x |> {}\n    output y\n}}\n",
        case["dtype"].as_str().expect("dtype"),
        dims.join(", "),
        case["call"].as_str().expect("call")
    );
    let checked = cvc_compiler::front::check_source(name, &src, Mode::Train)
        .unwrap_or_else(|d| panic!("{name}: {:?}\n{src}", d.first().map(|d| d.message.clone())));
    let mut g = checked.graph;
    let y = g.outputs[0].value;
    let x = g.find_leaf("x").expect("input x");
    let params: Vec<String> = case["params"]
        .as_array()
        .expect("params")
        .iter()
        .map(|p| p.as_str().expect("param").to_string())
        .collect();
    let mut wrt = vec![x];
    for p in &params {
        wrt.push(g.find_leaf(p).unwrap_or_else(|| panic!("{name}: cvc has no parameter `{p}`")));
    }
    let cvc_params: Vec<String> = checked.params.iter().map(|p| p.name.clone()).collect();
    assert_eq!(cvc_params, params, "{name}: cvc's parameters are not PyTorch's");
    let (probe, loss) = {
        let mut b = Builder::new(&mut g);
        probe_loss(&mut b, y).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let grads = gradients(&mut g, loss, &wrt).unwrap_or_else(|e| panic!("{name}: autodiff: {e}"));
    let arrays: HashMap<String, Tensor> = load_npz(&dir().join(format!("{name}.npz")))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .into_iter()
        .map(|(k, a)| (k, from_host(&a.tensor)))
        .collect();
    let get = |k: &str| arrays.get(k).unwrap_or_else(|| panic!("{name}: no `{k}` in the reference")).clone();
    let mut leaves = HashMap::from([(x, get("x")), (probe, get("probe"))]);
    for (p, &v) in params.iter().zip(&wrt[1..]) {
        let t = get(&format!("param.{p}"));
        assert_eq!(t.shape, g.ty(v).shape.resolve(2), "{name}: shape of `{p}`");
        leaves.insert(v, t);
    }
    let vals = evaluate(&g, 2, &leaves).unwrap_or_else(|e| panic!("{name}: interpreter: {e}"));
    let val = |v: Value| vals[v.index()].clone().expect("evaluated");
    // The references are f64 values stored in f32: 1e-6 covers their rounding.
    let tol = 1e-6;
    let e = max_rel(&val(y), &get("y"));
    assert!(e <= tol, "{name}: output differs from PyTorch by {e:.2e} (relative)");
    let what = std::iter::once("x".to_string()).chain(params.iter().cloned());
    for (w, &dv) in what.zip(&grads) {
        let e = max_rel(&val(dv), &get(&format!("grad.{w}")));
        assert!(e <= tol, "{name}: gradient w.r.t. `{w}` differs from PyTorch by {e:.2e} (relative)");
    }
}

#[test]
fn norms_softmax_and_reductions_match_pytorch() {
    let index = std::fs::read_to_string(dir().join("cases.json")).expect("cases.json");
    let cases: serde_json::Value = serde_json::from_str(&index).expect("cases.json is JSON");
    let cases = cases.as_array().expect("a list of cases");
    assert!(cases.len() >= 10, "the reference covers every operator");
    for case in cases {
        run_case(case);
    }
}
