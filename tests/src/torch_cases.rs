//! The PyTorch reference-case harness: a case of a `tests/reference/<topic>/cases.json`
//! (written by the `make.py` next to it) names an operator, its arguments, inputs and
//! parameters, PyTorch's output and the gradients of `Σ Re(conj(w)·out)` (or of a scalar
//! output). [`run_case`] lowers the operator through the layer library, evaluates it and
//! its gradients with the f64 interpreter, compares both with PyTorch, and checks the same
//! gradients against central finite differences.

use crate::seed;
use cvc_compiler::front::layers::{lower_layer, Arg, ArgValue, LayerCall, LowerCtx, Operand};
use cvc_compiler::interp::check::{check_coordinates, GradCheckConfig};
use cvc_compiler::interp::{evaluate, SplitMix64, Tensor, TensorData};
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::verify::verify;
use cvc_compiler::ir::*;
use cvc_compiler::passes::autodiff::gradients;
use cvc_grammar::Span;
use num_complex::Complex64;
use serde_json::Value as Json;
use std::collections::HashMap;

/// The case list of `tests/reference/<topic>/cases.json`.
pub fn cases(topic: &str) -> Vec<Json> {
    let path = format!("{}/reference/{topic}/cases.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let doc: Json = serde_json::from_str(&text).expect("cases.json parses");
    doc["cases"].as_array().expect("a case list").clone()
}

/// Runs every case of `topic`; returns the failures, one line each.
pub fn failures(topic: &str, cases: &[Json]) -> Vec<String> {
    let mut failed = Vec::new();
    for c in cases {
        let name = c["name"].as_str().expect("name");
        match run_case(topic, c) {
            Ok(()) => eprintln!("{name}: matches PyTorch"),
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    failed
}

fn dtype(t: &Json) -> DType {
    match t["dtype"].as_str().expect("dtype") {
        "f32" => DType::F32,
        "c64" => DType::C64,
        _ => DType::I32,
    }
}

fn dims(t: &Json) -> Vec<usize> {
    t["shape"].as_array().expect("shape").iter().map(|d| d.as_u64().expect("extent") as usize).collect()
}

fn tensor(t: &Json) -> Tensor {
    let shape = dims(t);
    let data: Vec<f64> =
        t["data"].as_array().expect("data").iter().map(|v| v.as_f64().expect("number")).collect();
    match dtype(t) {
        DType::F32 => Tensor::real(&shape, data),
        DType::C64 => Tensor::complex(&shape, data.chunks(2).map(|p| Complex64::new(p[0], p[1])).collect()),
        DType::I32 => Tensor::int(&shape, data.iter().map(|&v| v as i64).collect()),
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    match &t.data {
        TensorData::Real(v) => v.clone(),
        TensorData::Complex(v) => v.iter().flat_map(|z| [z.re, z.im]).collect(),
        TensorData::Int(v) => v.iter().map(|&x| x as f64).collect(),
    }
}

fn arg_value(v: &Json) -> ArgValue {
    match v {
        Json::Bool(b) => ArgValue::Bool(*b),
        Json::String(s) => ArgValue::Ident(s.clone()),
        Json::Number(n) if n.is_i64() => ArgValue::Int(n.as_i64().expect("i64")),
        Json::Number(n) => ArgValue::Float(n.as_f64().expect("f64")),
        Json::Array(items) if items.iter().all(|x| x.is_i64()) => {
            ArgValue::Tuple(items.iter().map(|x| x.as_i64().expect("i64")).collect())
        }
        Json::Array(items) => ArgValue::Numbers(items.iter().map(|x| x.as_f64().expect("number")).collect()),
        other => panic!("argument {other}"),
    }
}

/// Max |a − b| / (1 + |b|) over the elements.
fn close(got: &[f64], want: &[f64], tol: f64, what: &str) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, PyTorch has {}", got.len(), want.len()));
    }
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        if (a - b).abs() > tol * (1.0 + b.abs()) {
            return Err(format!("{what}[{i}]: cvc {a}, PyTorch {b}"));
        }
    }
    Ok(())
}

/// One case: forward and gradients against PyTorch (relative 1e-9 and 1e-8) and the
/// gradients against finite differences; the seed of the latter is named after `topic`.
pub fn run_case(topic: &str, c: &Json) -> Result<(), String> {
    let op = c["op"].as_str().expect("op");
    let args: Vec<Arg> = c["args"]
        .as_object()
        .expect("args")
        .iter()
        .map(|(k, v)| Arg { name: Some(k.clone()), value: arg_value(v), span: Span::new(40, 41) })
        .collect();
    let inputs: Vec<&Json> = c["inputs"].as_array().expect("inputs").iter().collect();
    let batch = dims(inputs[0])[0];
    let mut g = Graph::new("reference", Mode::Train);
    let (ins, out, params) = {
        let mut ctx = LowerCtx::new(&mut g, Mode::Train);
        let ins: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut shape: Vec<Dim> = dims(t).into_iter().map(Dim::Fixed).collect();
                shape[0] = Dim::Batch;
                ctx.b.leaf(Op::Input { name: format!("in{i}") }, TensorType::new(dtype(t), Shape(shape)))
            })
            .collect();
        let operands: Vec<Operand> = ins
            .iter()
            .enumerate()
            .map(|(i, &v)| Operand { value: v, span: Span::new(10 + i, 11 + i) })
            .collect();
        let call = LayerCall {
            op,
            span: Span::new(0, 1),
            args: &args,
            label: format!("t/{op}"),
            param_prefix: "t.p".into(),
        };
        let out = lower_layer(&mut ctx, &call, &operands).map_err(|d| format!("lowering: {}", d.message))?;
        (ins, out, ctx.params)
    };
    verify(&g)?;
    let mut leaves = HashMap::new();
    for (&v, t) in ins.iter().zip(&inputs) {
        leaves.insert(v, tensor(t));
    }
    let param_json = c["params"].as_array().expect("params");
    if param_json.len() != params.len() {
        return Err(format!("{} parameters, the reference has {}", params.len(), param_json.len()));
    }
    for (p, t) in params.iter().zip(param_json) {
        let t = tensor(t);
        if t.shape != g.ty(p.value).shape.resolve(batch) {
            return Err(format!("parameter {} is {}, the reference {:?}", p.name, g.ty(p.value), t.shape));
        }
        leaves.insert(p.value, t);
    }
    // The loss: the op's scalar output, or Σ Re(conj(w)·out) with PyTorch's random w.
    let loss = if c["weight"].is_null() {
        out
    } else {
        let w = tensor(&c["weight"]);
        let ty = g.ty(out).clone();
        let mut b = Builder::new(&mut g);
        let wv = b.leaf(Op::Input { name: "w".into() }, ty.clone());
        let prod = if ty.dtype.is_complex() {
            let cw = b.unary(UnaryOp::Conj, wv)?;
            let p = b.mul(cw, out)?;
            b.unary(UnaryOp::Real, p)?
        } else {
            b.mul(wv, out)?
        };
        let axes: Vec<usize> = (0..ty.shape.rank()).collect();
        let s = b.sum(prod, &axes)?;
        let l = b.reshape(s, Shape::scalar())?;
        leaves.insert(wv, w);
        l
    };
    g.loss = Some(loss);
    let fwd = g.clone();
    let mut wrt: Vec<(Value, &Json)> = Vec::new();
    for ((&v, _), gr) in ins.iter().zip(&inputs).zip(c["grads"].as_array().expect("grads")) {
        if !gr.is_null() {
            wrt.push((v, gr));
        }
    }
    for (p, gr) in params.iter().zip(c["param_grads"].as_array().expect("param grads")) {
        wrt.push((p.value, gr));
    }
    let targets: Vec<Value> = wrt.iter().map(|(v, _)| *v).collect();
    let grads = gradients(&mut g, loss, &targets)?;
    verify(&g)?;
    let vals = evaluate(&g, batch, &leaves)?;
    let got = vals[out.index()].as_ref().ok_or("no output value")?;
    let want = tensor(&c["out"]);
    if got.shape != want.shape {
        return Err(format!("output shape {:?}, PyTorch {:?}", got.shape, want.shape));
    }
    close(&values(got), &values(&want), 1e-9, "output")?;
    for ((v, gr), &dv) in wrt.iter().zip(&grads) {
        let got = vals[dv.index()].as_ref().ok_or("no gradient value")?;
        close(&values(got), &values(&tensor(gr)), 1e-8, &format!("gradient of {v}"))?;
    }
    // The same gradients against finite differences (an oracle independent of PyTorch).
    let pairs: Vec<(Value, Value)> = targets.iter().copied().zip(grads).collect();
    let mut rng = SplitMix64::new(seed::seed_for(&format!("{topic}::{}", c["name"])));
    let cfg = GradCheckConfig { eps: 1e-6, tol: 1e-6, max_coords: Some(24) };
    check_coordinates(&fwd, &g, batch, &leaves, loss, &pairs, cfg, &mut rng)?;
    Ok(())
}
