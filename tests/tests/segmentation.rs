//! The segmentation operators (per-pixel `cross_entropy`, `dice`, `upsample1d/2d`, strided
//! and padded pooling, `adaptive_avgpool`, `conv_transpose1d`, `groupnorm`, `instancenorm`)
//! against PyTorch: each case of `tests/reference/segmentation/cases.json` (written by
//! `make.py` next to it) is lowered by the layer library, evaluated by the f64 interpreter and
//! compared with PyTorch's output and gradients; the same gradients are also checked against
//! central finite differences.

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

#[path = "../src/seed.rs"]
mod seed;

fn cases() -> Vec<Json> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/reference/segmentation/cases.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let doc: Json = serde_json::from_str(&text).expect("cases.json parses");
    doc["cases"].as_array().expect("a case list").clone()
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

fn run_case(c: &Json) -> Result<(), String> {
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
    let mut rng = SplitMix64::new(seed::seed_for(&format!("segmentation::{}", c["name"])));
    let cfg = GradCheckConfig { eps: 1e-6, tol: 1e-6, max_coords: Some(24) };
    check_coordinates(&fwd, &g, batch, &leaves, loss, &pairs, cfg, &mut rng)?;
    Ok(())
}

/// Every reference case, forward and backward, against PyTorch and finite differences.
#[test]
fn operators_match_pytorch() {
    let cases = cases();
    assert!(cases.len() >= 20, "cases.json holds {} cases", cases.len());
    let mut failed = Vec::new();
    for c in &cases {
        let name = c["name"].as_str().expect("name");
        match run_case(c) {
            Ok(()) => eprintln!("{name}: matches PyTorch"),
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    assert!(failed.is_empty(), "{} of {} cases differ:\n{}", failed.len(), cases.len(), failed.join("\n"));
}

/// Batchnorm in training over one value per channel (batch 1 of `[B, C]`) is a plan-time
/// error naming the layer, as PyTorch's "Expected more than 1 value per channel"; batch 2,
/// or the same layer in inference, compiles.
#[test]
fn batchnorm_with_one_value_per_channel_is_a_plan_error() {
    use cvc_compiler::passes::pipeline::{compile, Options};
    let src = "model M {\n    input x: c64[B, 3, 1, 1]\n    input label: class[B] of 2\n    \
               h = x |> batchnorm |> flatten |> linear(2) |> abs\n    output h\n    loss cross_entropy(h, label)\n}\n";
    let graph = |mode| cvc_compiler::front::check_source("bn.cvnn", src, mode).expect("checks").graph;
    let opts = |batch| Options { batch, ..Options::default() };
    let Err(err) = compile(graph(Mode::Train), &opts(1)) else { panic!("batch 1 is rejected") };
    let err = err.to_string();
    assert!(err.contains("h/batchnorm"), "{err}");
    assert!(err.contains("more than one value per channel"), "{err}");
    assert!(err.contains("[B, 3, 1, 1]"), "{err}");
    compile(graph(Mode::Train), &opts(2)).expect("batch 2 compiles");
    compile(graph(Mode::Eval), &opts(1)).expect("inference uses the running statistics");
}

/// The data loader admits the ignore index of the loss besides `0..classes`, and nothing else.
#[test]
fn labels_admit_the_ignore_index_only() {
    let src = "model M {\n    input x: c64[B, 2, 3]\n    input label: class[B, 3] of 2\n    \
               logits = x |> conv1d(2, kernel = 1) |> abs\n    output logits\n    \
               loss cross_entropy(logits, label, ignore_index = 7)\n}\n";
    let model = cvc_runtime::session::Model::from_source("seg.cvnn", src).expect("compiles");
    let label = model.inputs().iter().find(|i| i.name == "label").expect("label input");
    assert_eq!(label.ignore_index, Some(7));
    let make = |labels: Vec<i32>| {
        use cvc_runtime::backend::{HostData, HostTensor};
        use cvc_runtime::data::npy::NpyArray;
        let x = HostTensor { dtype: DType::C64, shape: vec![2, 2, 3], data: HostData::F32(vec![0.5; 24]) };
        let y = HostTensor { dtype: DType::I32, shape: vec![2, 3], data: HostData::I32(labels) };
        let arrays = vec![
            ("x".to_string(), NpyArray { numpy_dtype: "complex64".into(), tensor: x }),
            ("label".to_string(), NpyArray { numpy_dtype: "int64".into(), tensor: y }),
        ];
        cvc_runtime::data::Dataset::from_arrays(arrays, model.inputs(), "t.npz")
    };
    make(vec![0, 1, 7, 7, 0, 1]).expect("0, 1 and the ignore index load");
    let Err(e) = make(vec![0, 1, 2, 7, 0, 1]) else { panic!("label 2 is rejected") };
    assert!(e.contains("label 2") && e.contains("ignore_index 7"), "{e}");
}

/// Pixel accuracy and mean IoU of [`Confusion::add_pixels`] against a direct count over
/// random per-pixel logits `[n, C, P]`, with an in-range ignore index.
#[test]
fn pixel_accuracy_and_mean_iou_match_a_direct_count() {
    use cvc_runtime::metrics::Confusion;
    let (n, c, p, ignore) = (3usize, 4usize, 10usize, 2i32);
    let mut rng = SplitMix64::new(seed::seed_for("segmentation::metrics"));
    let logits: Vec<f32> = (0..n * c * p).map(|_| rng.normal() as f32).collect();
    let labels: Vec<i32> = (0..n * p).map(|_| (rng.next_u64() % c as u64) as i32).collect();
    let mut cm = Confusion::ignoring(c, Some(ignore as i64));
    cm.add_pixels(&logits[..c * p], &labels[..p], p);
    cm.add_pixels(&logits[c * p..], &labels[p..], p);
    // Direct: argmax per pixel, then per-class intersection and union.
    let (mut correct, mut total) = (0usize, 0usize);
    let (mut inter, mut union) = (vec![0usize; c], vec![0usize; c]);
    for s in 0..n {
        for q in 0..p {
            let y = labels[s * p + q];
            if y == ignore {
                continue;
            }
            let score = |k: usize| logits[s * c * p + k * p + q];
            let pred = (0..c).fold(0, |b, k| if score(k) > score(b) { k } else { b });
            total += 1;
            if pred == y as usize {
                correct += 1;
                inter[pred] += 1;
                union[pred] += 1;
            } else {
                union[pred] += 1;
                union[y as usize] += 1;
            }
        }
    }
    let ious: Vec<f64> = (0..c)
        .filter(|&k| k != ignore as usize && union[k] > 0)
        .map(|k| inter[k] as f64 / union[k] as f64)
        .collect();
    assert_eq!(cm.total(), total as u64);
    assert!((cm.accuracy() - correct as f64 / total as f64).abs() < 1e-12);
    let miou = ious.iter().sum::<f64>() / ious.len() as f64;
    assert!((cm.mean_iou() - miou).abs() < 1e-12, "{} vs {miou}", cm.mean_iou());
}
