//! The `attention` layer and its primitives in the reference interpreter: against PyTorch
//! (torchcvnn 0.10's `multi_head_attention_forward`, and an explicit PyTorch computation for
//! the options torchcvnn lacks; `tests/reference/attention/make.py`), the empty-row rule, the
//! text form, and the layer's diagnostics.

#![allow(clippy::result_large_err)] // Diagnostic by value, as the layer interface returns it.

use cvc_compiler::front::layers::{lower_layer, Arg, ArgValue, LayerCall, LowerCtx, Operand, ParamInfo};
use cvc_compiler::interp::{evaluate, Tensor};
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::parse::parse_graph;
use cvc_compiler::ir::print::print_graph;
use cvc_compiler::ir::verify::verify;
use cvc_compiler::ir::*;
use cvc_compiler::passes::autodiff::gradients;
use cvc_compiler::Diagnostic;
use cvc_grammar::Span;
use num_complex::Complex64 as C;
use std::collections::HashMap;

fn sp(a: usize) -> Span {
    Span::new(a, a + 1)
}

/// One reference case of `cases.txt`: its options and named tensors.
struct RefCase {
    name: String,
    opts: HashMap<String, String>,
    tensors: HashMap<String, Tensor>,
}

fn parse_tensor(line: &str) -> (String, Tensor) {
    let mut it = line.split(' ');
    let name = it.next().expect("name").to_string();
    let kind = it.next().expect("kind");
    let dims: Vec<usize> = it.next().expect("dims").split(',').map(|d| d.parse().expect("dim")).collect();
    let vals: Vec<f64> = it.map(|v| v.parse().expect("number")).collect();
    let t = if kind == "c" {
        Tensor::complex(&dims, vals.chunks(2).map(|p| C::new(p[0], p[1])).collect())
    } else {
        Tensor::real(&dims, vals)
    };
    assert_eq!(t.data.len(), dims.iter().product::<usize>(), "{name}: element count");
    (name, t)
}

fn reference_cases() -> Vec<RefCase> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/attention/cases.txt");
    let text = std::fs::read_to_string(path).expect("tests/reference/attention/cases.txt");
    let mut cases = Vec::new();
    let mut cur: Option<RefCase> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("case ") {
            let mut words = rest.split(' ');
            let name = words.next().expect("case name").to_string();
            let opts = words.filter_map(|w| w.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect();
            cur = Some(RefCase { name, opts, tensors: HashMap::new() });
        } else if line == "end" {
            cases.push(cur.take().expect("case before end"));
        } else {
            let (n, t) = parse_tensor(line);
            cur.as_mut().expect("tensor inside a case").tensors.insert(n, t);
        }
    }
    cases
}

/// The graph of one `attention` call on inputs shaped as the case's tensors (batch fixed),
/// its inputs, output and parameters.
fn lower_case(c: &RefCase) -> (Graph, Vec<Value>, Value, Vec<ParamInfo>) {
    let fixed = |t: &Tensor, dt: DType| {
        let mut dims: Vec<Dim> = t.shape.iter().map(|&n| Dim::Fixed(n)).collect();
        dims[0] = Dim::Batch;
        TensorType::new(dt, Shape(dims))
    };
    let mut names = vec!["x"];
    if c.opts["cross"] == "1" {
        names.push("memory");
    }
    if c.opts["pad"] == "1" {
        names.push("pad");
    }
    let mut g = Graph::new(&c.name, Mode::Train);
    let mut args = vec![Arg {
        name: Some("heads".into()),
        value: ArgValue::Int(c.opts["heads"].parse().expect("heads")),
        span: sp(40),
    }];
    args.push(Arg { name: Some("bias".into()), value: ArgValue::Bool(c.opts["bias"] == "1"), span: sp(41) });
    args.push(Arg {
        name: Some("score".into()),
        value: ArgValue::Ident(c.opts["score"].clone()),
        span: sp(42),
    });
    args.push(Arg {
        name: Some("causal".into()),
        value: ArgValue::Bool(c.opts["causal"] == "1"),
        span: sp(43),
    });
    let (ins, out, params) = {
        let mut ctx = LowerCtx::new(&mut g, Mode::Train);
        let ins: Vec<Value> = names
            .iter()
            .map(|n| {
                let t = &c.tensors[*n];
                let dt = if *n == "pad" { DType::F32 } else { DType::C64 };
                ctx.b.leaf(Op::Input { name: n.to_string() }, fixed(t, dt))
            })
            .collect();
        let operands: Vec<Operand> =
            ins.iter().enumerate().map(|(i, &v)| Operand { value: v, span: sp(10 + i) }).collect();
        let call = LayerCall {
            op: "attention",
            span: sp(0),
            args: &args,
            label: "a/attention".into(),
            param_prefix: "a.attention_0".into(),
        };
        let out = lower_layer(&mut ctx, &call, &operands).unwrap_or_else(|d| panic!("{}: {d:?}", c.name));
        (ins, out, ctx.params)
    };
    verify(&g).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    (g, ins, out, params)
}

fn max_rel(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape, want.shape);
    let (a, b) = (got.to_complex_vec(), want.to_complex_vec());
    let scale = b.iter().map(|z| z.norm()).fold(0.0, f64::max).max(1e-12);
    a.iter().zip(&b).map(|(x, y)| (x - y).norm()).fold(0.0, f64::max) / scale
}

#[test]
fn interpreter_matches_pytorch_values_and_gradients() {
    let cases = reference_cases();
    assert_eq!(cases.len(), 4, "cases.txt holds four cases");
    for c in &cases {
        let (mut g, ins, out, params) = lower_case(c);
        // L = Σ Re(conj(w) · y), as make.py.
        let (w, loss) = {
            let mut b = Builder::new(&mut g);
            let ty = b.graph.ty(out).clone();
            let w = b.leaf(Op::Input { name: "w".into() }, ty.clone());
            let cw = b.unary(UnaryOp::Conj, w).unwrap();
            let p = b.mul(cw, out).unwrap();
            let r = b.unary(UnaryOp::Real, p).unwrap();
            let s = b.sum(r, &[0, 1, 2]).unwrap();
            (w, b.reshape(s, Shape::scalar()).unwrap())
        };
        g.loss = Some(loss);
        let mut wrt = ins.clone();
        wrt.extend(params.iter().map(|p| p.value));
        let grads = gradients(&mut g, loss, &wrt).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        verify(&g).unwrap();
        let batch = c.tensors["x"].shape[0];
        let mut leaves = HashMap::new();
        for (&v, n) in ins.iter().zip(["x", "memory", "pad"].iter().filter(|n| c.tensors.contains_key(**n))) {
            leaves.insert(v, c.tensors[*n].clone());
        }
        for p in &params {
            let short = p.name.strip_prefix("a.attention_0.").expect("prefix");
            leaves.insert(p.value, c.tensors[short].clone());
        }
        leaves.insert(w, c.tensors["w"].clone());
        let vals = evaluate(&g, batch, &leaves).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let val = |v: Value| vals[v.index()].as_ref().expect("value");
        let e = max_rel(val(out), &c.tensors["y"]);
        assert!(e < 1e-10, "{}: output differs from PyTorch by {e:.2e} (relative)", c.name);
        let mut names: Vec<String> = ["x", "memory", "pad"]
            .iter()
            .filter(|n| c.tensors.contains_key(**n))
            .map(|n| n.to_string())
            .collect();
        names.extend(params.iter().map(|p| p.name.strip_prefix("a.attention_0.").unwrap().to_string()));
        for (name, &dv) in names.iter().zip(&grads) {
            if name == "pad" {
                continue; // a mask has no gradient (zeros in cvc, none in PyTorch)
            }
            let want = &c.tensors[&format!("grad.{name}")];
            let e = max_rel(val(dv), want);
            assert!(e < 1e-9, "{}: gradient of {name} differs from PyTorch by {e:.2e} (relative)", c.name);
        }
    }
}

fn input(b: &mut Builder, name: &str, dt: DType, dims: &[usize]) -> Value {
    b.leaf(Op::Input { name: name.into() }, TensorType::new(dt, Shape::fixed(dims)))
}

#[test]
fn a_row_without_visible_keys_has_zero_lse_output_and_gradients() {
    // Causal attention with key 0 padded: query row 0 sees no key at all.
    let spec = AttnSpec {
        heads: AttnHeads::separate(1, 2),
        scale: 0.5,
        score: AttnScore::Real,
        causal: true,
        key_mask: true,
        dropout: None,
    };
    let mut g = Graph::new("empty_row", Mode::Train);
    let (q, k, v, lse, o, dq, dkv) = {
        let mut b = Builder::new(&mut g);
        let q = input(&mut b, "q", DType::C64, &[1, 3, 2]);
        let k = input(&mut b, "k", DType::C64, &[1, 3, 2]);
        let v = input(&mut b, "v", DType::C64, &[1, 3, 2]);
        let m = input(&mut b, "m", DType::F32, &[1, 3]);
        let d_o = input(&mut b, "do", DType::C64, &[1, 3, 2]);
        let lse = b.add(Op::AttnLse { spec }, &[q, k, m]).unwrap();
        let o = b.add(Op::Attention { spec }, &[q, k, v, lse, m]).unwrap();
        let dq = b.add(Op::AttentionGrad { spec, wrt: AttnWrt::Q }, &[q, k, v, o, d_o, lse, m]).unwrap();
        let dkv = b.add(Op::AttentionGrad { spec, wrt: AttnWrt::KV }, &[q, k, v, o, d_o, lse, m]).unwrap();
        (q, k, v, lse, o, dq, dkv)
    };
    let z = |s: &[usize], seed: f64| {
        let n: usize = s.iter().product();
        Tensor::complex(s, (0..n).map(|i| C::new((i as f64 * seed).sin(), (i as f64 + seed).cos())).collect())
    };
    let mut leaves = HashMap::new();
    leaves.insert(q, z(&[1, 3, 2], 0.7));
    leaves.insert(k, z(&[1, 3, 2], 1.3));
    leaves.insert(v, z(&[1, 3, 2], 2.1));
    leaves.insert(Value::from_index(3), Tensor::real(&[1, 3], vec![1.0, 0.0, 0.0]));
    leaves.insert(Value::from_index(4), z(&[1, 3, 2], 0.4));
    let vals = evaluate(&g, 1, &leaves).unwrap();
    let get = |v: Value| vals[v.index()].clone().unwrap();
    let lse_v = get(lse).to_real_vec().unwrap();
    assert_eq!(lse_v[0], 0.0, "lse of the empty row");
    // Row 1 sees key 1 only: lse = its score, output = v_1.
    let (qv, kv, vv) = (get(q).to_complex_vec(), get(k).to_complex_vec(), get(v).to_complex_vec());
    let c11 = qv[2] * kv[2].conj() + qv[3] * kv[3].conj();
    assert!((lse_v[1] - 0.5 * c11.re).abs() < 1e-12, "lse of a one-key row");
    let ov = get(o).to_complex_vec();
    assert_eq!(&ov[0..2], &[C::new(0.0, 0.0); 2], "output of the empty row");
    assert!((ov[2] - vv[2]).norm() < 1e-12 && (ov[3] - vv[3]).norm() < 1e-12, "one-key row copies v");
    let dqv = get(dq).to_complex_vec();
    assert_eq!(&dqv[0..2], &[C::new(0.0, 0.0); 2], "dq of the empty row");
    // Key 0 is padded: no query reaches it, so its dk and dv are zero.
    let dkvv = get(dkv).to_complex_vec();
    assert_eq!(&dkvv[0..4], &[C::new(0.0, 0.0); 4], "dk, dv of the padded key");
    assert!(dkvv[4..].iter().any(|z| z.norm() > 0.0), "the other keys get gradients");
}

#[test]
fn attention_ops_print_and_parse_back() {
    let text = "graph a (Train) {
  %0 = input[q]() : c64[B, 5, 6]  ; Input
  %1 = input[kv]() : c64[B, 4, 19]  ; Input
  %2 = input[v]() : c64[B, 4, 12]  ; Input
  %3 = input[pad]() : f32[B, 4]  ; Input
  %4 = state[step, init=Zeros]() : i32[]  ; State
  %5 = attn_lse[heads=2, d=3, dv=6, cols=[0, 1, 0], scale=0.5, score=Abs, causal=true, key_mask=true, dropout=none](%0, %1, %3) : f32[B, 2, 5]  ; Forward
  %6 = attention[heads=2, d=3, dv=6, cols=[0, 1, 0], scale=0.5, score=Abs, causal=true, key_mask=true, dropout=[0.25, 9]](%0, %1, %2, %5, %3, %4) : c64[B, 5, 12]  ; Forward
  %7 = attention_grad[heads=2, d=3, dv=6, cols=[0, 1, 7], scale=0.5, score=Abs, causal=true, key_mask=true, dropout=[0.25, 9], wrt=KV](%0, %1, %1, %6, %6, %5, %3, %4) : c64[B, 4, 18]  ; Backward
}
";
    let p = parse_graph(text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_graph(&p.graph, None), text);
    // Types are checked: a mask of the wrong length, a missing step operand.
    let bad = text.replace("f32[B, 4]  ; Input", "f32[B, 5]  ; Input");
    let e = parse_graph(&bad).expect_err("mask shape");
    assert!(e.message.contains("key mask"), "{e}");
    let bad = text.replace("(%0, %1, %2, %5, %3, %4)", "(%0, %1, %2, %5, %3)");
    let e = parse_graph(&bad).expect_err("operand count");
    assert!(e.message.contains("takes 6 operands"), "{e}");
    // Heads that pass their operand's columns.
    let bad = text.replace("cols=[0, 1, 7]", "cols=[0, 1, 8]");
    let e = parse_graph(&bad).expect_err("value columns");
    assert!(e.message.contains("pass its 19 columns"), "{e}");
    let bad = text.replace("cols=[0, 1, 7]", "cols=[0, 1]");
    let e = parse_graph(&bad).expect_err("three columns");
    assert!(e.message.contains("a list of 3"), "{e}");
}

fn lower_err(args: &[Arg], inputs: &[TensorType]) -> Diagnostic {
    let mut g = Graph::new("t", Mode::Train);
    let mut ctx = LowerCtx::new(&mut g, Mode::Train);
    let ins: Vec<Operand> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| Operand {
            value: ctx.b.leaf(Op::Input { name: format!("in{i}") }, t.clone()),
            span: sp(10 + i),
        })
        .collect();
    let call = LayerCall {
        op: "attention",
        span: sp(0),
        args,
        label: "t/attention".into(),
        param_prefix: "t.attention_0".into(),
    };
    match lower_layer(&mut ctx, &call, &ins) {
        Ok(_) => panic!("should be rejected"),
        Err(d) => d,
    }
}

#[test]
fn layer_errors_point_at_their_cause() {
    let heads = |h: i64| vec![Arg { name: Some("heads".into()), value: ArgValue::Int(h), span: sp(40) }];
    let c = |dims: &[Dim]| TensorType::new(DType::C64, Shape(dims.to_vec()));
    let (b, f) = (Dim::Batch, Dim::Fixed);
    let d = lower_err(&heads(4), &[c(&[b, f(5), f(6)])]);
    assert!(d.message.contains("not divisible by heads = 4"), "{}", d.message);
    assert_eq!(d.primary.span, sp(40), "the label is on the heads argument");
    let d = lower_err(&heads(2), &[c(&[b, f(6)])]);
    assert!(d.message.contains("3-D input"), "{}", d.message);
    let d = lower_err(&heads(2), &[c(&[b, f(5), f(6)]), c(&[b, f(3), f(4)])]);
    assert!(d.message.contains("does not match the input"), "{}", d.message);
    let pad = TensorType::new(DType::F32, Shape(vec![b, f(4)]));
    let d = lower_err(&heads(2), &[c(&[b, f(5), f(6)]), c(&[b, f(3), f(6)]), pad.clone()]);
    assert!(d.message.contains("key-padding mask must be f32[B, 3]"), "{}", d.message);
    let cpad = TensorType::new(DType::C64, Shape(vec![b, f(3)]));
    let d = lower_err(&heads(2), &[c(&[b, f(5), f(6)]), c(&[b, f(3), f(6)]), cpad]);
    assert!(d.message.contains("key-padding mask"), "{}", d.message);
    let labels = TensorType::new(DType::I32, Shape(vec![b, f(5), f(6)]));
    let d = lower_err(&heads(2), &[labels]);
    assert!(d.message.contains("class labels"), "{}", d.message);
}
