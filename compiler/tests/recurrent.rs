//! The `gru` and `lstm` layers and their primitives in the reference interpreter: against
//! PyTorch (complextorch's `GRU` / `LSTM`, `tests/reference/rnn/make.py`), the text form of
//! the primitives, and the layers' diagnostics.

#![allow(clippy::result_large_err)] // Diagnostic by value, as the layer interface returns it.

use cvc_compiler::front::layers::{lower_layer, Arg, ArgValue, LayerCall, LowerCtx, Operand, ParamInfo};
use cvc_compiler::interp::{evaluate, Tensor};
use cvc_compiler::ir::builder::Builder;
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
    assert_eq!(it.next(), Some("c"), "{name}: complex tensors only");
    let dims: Vec<usize> = it.next().expect("dims").split(',').map(|d| d.parse().expect("dim")).collect();
    let vals: Vec<f64> = it.map(|v| v.parse().expect("number")).collect();
    let t = Tensor::complex(&dims, vals.chunks(2).map(|p| C::new(p[0], p[1])).collect());
    assert_eq!(t.data.len(), dims.iter().product::<usize>(), "{name}: element count");
    (name, t)
}

fn reference_cases() -> Vec<RefCase> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/rnn/cases.txt");
    let text = std::fs::read_to_string(path).expect("tests/reference/rnn/cases.txt");
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

fn int_arg(name: &str, v: i64, at: usize) -> Arg {
    Arg { name: Some(name.into()), value: ArgValue::Int(v), span: sp(at) }
}

/// Lowers `op(x; args)` on an input of type `ty`, returning the graph, input, output,
/// parameters, or the diagnostic.
fn lower(
    op: &str,
    ty: TensorType,
    args: &[Arg],
) -> Result<(Graph, Value, Value, Vec<ParamInfo>), Diagnostic> {
    let mut g = Graph::new(op, Mode::Train);
    let (x, out, params) = {
        let mut ctx = LowerCtx::new(&mut g, Mode::Train);
        let x = ctx.b.leaf(Op::Input { name: "x".into() }, ty);
        let call =
            LayerCall { op, span: sp(0), args, label: format!("r/{op}"), param_prefix: "r.rnn_0".into() };
        let out = lower_layer(&mut ctx, &call, &[Operand { value: x, span: sp(10) }])?;
        (x, out, ctx.params)
    };
    verify(&g).expect("valid IR");
    Ok((g, x, out, params))
}

fn max_rel(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape, want.shape);
    let (a, b) = (got.to_complex_vec(), want.to_complex_vec());
    let scale = b.iter().map(|z| z.norm()).fold(0.0, f64::max).max(1e-12);
    a.iter().zip(&b).map(|(x, y)| (x - y).norm()).fold(0.0, f64::max) / scale
}

#[test]
fn interpreter_matches_complextorch_values_and_gradients() {
    let cases = reference_cases();
    assert_eq!(cases.len(), 4, "cases.txt holds four cases");
    for c in &cases {
        let x_ref = &c.tensors["x"];
        let ty = TensorType::new(
            DType::C64,
            Shape(vec![Dim::Batch, Dim::Fixed(x_ref.shape[1]), Dim::Fixed(x_ref.shape[2])]),
        );
        let args = vec![
            int_arg("hidden", c.opts["hidden"].parse().expect("hidden"), 40),
            int_arg("layers", c.opts["layers"].parse().expect("layers"), 41),
            Arg {
                name: Some("bidirectional".into()),
                value: ArgValue::Bool(c.opts["bidirectional"] == "1"),
                span: sp(42),
            },
            Arg {
                name: Some("returns".into()),
                value: ArgValue::Ident(c.opts["output"].clone()),
                span: sp(43),
            },
        ];
        let (mut g, x, out, params) =
            lower(&c.opts["cell"], ty, &args).unwrap_or_else(|d| panic!("{}: {d:?}", c.name));
        // L = Σ Re(conj(w) · y), as make.py.
        let (w, loss) = {
            let mut b = Builder::new(&mut g);
            let ty = b.graph.ty(out).clone();
            let w = b.leaf(Op::Input { name: "w".into() }, ty.clone());
            let cw = b.unary(UnaryOp::Conj, w).unwrap();
            let p = b.mul(cw, out).unwrap();
            let r = b.unary(UnaryOp::Real, p).unwrap();
            let axes: Vec<usize> = (0..ty.shape.rank()).collect();
            let s = b.sum(r, &axes).unwrap();
            (w, b.reshape(s, Shape::scalar()).unwrap())
        };
        g.loss = Some(loss);
        let mut wrt = vec![x];
        wrt.extend(params.iter().map(|p| p.value));
        let grads = gradients(&mut g, loss, &wrt).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        verify(&g).unwrap();
        let mut leaves = HashMap::from([(x, x_ref.clone()), (w, c.tensors["w"].clone())]);
        let mut names = vec!["x".to_string()];
        for p in &params {
            let short = p.name.strip_prefix("r.rnn_0.").expect("prefix");
            let t = c.tensors.get(short).unwrap_or_else(|| panic!("{}: no reference for {short}", c.name));
            leaves.insert(p.value, t.clone());
            names.push(short.to_string());
        }
        assert_eq!(
            leaves.len(),
            c.tensors.len() / 2,
            "{}: every reference parameter is a cvc parameter",
            c.name
        );
        let vals = evaluate(&g, x_ref.shape[0], &leaves).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let val = |v: Value| vals[v.index()].as_ref().expect("value");
        let e = max_rel(val(out), &c.tensors["y"]);
        assert!(e < 1e-10, "{}: output differs from complextorch by {e:.2e} (relative)", c.name);
        for (name, &dv) in names.iter().zip(&grads) {
            let e = max_rel(val(dv), &c.tensors[&format!("grad.{name}")]);
            assert!(
                e < 1e-9,
                "{}: gradient of {name} differs from complextorch by {e:.2e} (relative)",
                c.name
            );
        }
    }
}

#[test]
fn each_direction_is_one_batched_projection_and_one_loop() {
    let ty = TensorType::new(DType::C64, Shape(vec![Dim::Batch, Dim::Fixed(64), Dim::Fixed(2)]));
    let args = [
        int_arg("hidden", 3, 1),
        int_arg("layers", 2, 2),
        Arg { name: Some("bidirectional".into()), value: ArgValue::Bool(true), span: sp(3) },
    ];
    let (g, _, out, params) = lower("lstm", ty, &args).unwrap();
    let count = |f: &dyn Fn(&Op) -> bool| g.nodes.iter().filter(|(_, n)| f(&n.op)).count();
    // Two layers × two directions: four loops and four input projections, none per step.
    assert_eq!(count(&|op| matches!(op, Op::Recurrence { .. })), 4);
    assert_eq!(count(&|op| matches!(op, Op::MatMul { .. })), 4);
    assert_eq!(params.len(), 16);
    assert_eq!(g.ty(out).shape, Shape(vec![Dim::Batch, Dim::Fixed(64), Dim::Fixed(6)]));
    let names: Vec<&str> = params.iter().map(|p| p.name.strip_prefix("r.rnn_0.").unwrap()).collect();
    assert_eq!(&names[..4], ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]);
    assert_eq!(names[4], "weight_ih_l0_reverse");
    assert_eq!(g.ty(params[8].value).shape, Shape::fixed(&[12, 6]), "layer 1 reads both directions");
}

#[test]
fn bad_arguments_and_inputs_are_diagnosed() {
    let seq = TensorType::new(DType::C64, Shape(vec![Dim::Batch, Dim::Fixed(5), Dim::Fixed(2)]));
    let flat = TensorType::new(DType::C64, Shape(vec![Dim::Batch, Dim::Fixed(5)]));
    let labels = TensorType::new(DType::I32, Shape(vec![Dim::Batch, Dim::Fixed(5), Dim::Fixed(2)]));
    let msg = |op: &str, ty: &TensorType, args: &[Arg]| match lower(op, ty.clone(), args) {
        Ok(_) => panic!("{op} on {ty} with {args:?} lowered"),
        Err(d) => d.message.clone(),
    };
    let m = msg("gru", &flat, &[int_arg("hidden", 4, 1)]);
    assert!(m.contains("needs a sequence [B, T, features]"), "{m}");
    let m = msg("lstm", &labels, &[int_arg("hidden", 4, 1)]);
    assert!(m.contains("class labels"), "{m}");
    let m = msg("gru", &seq, &[int_arg("hidden", 0, 1)]);
    assert!(m.contains("hidden"), "{m}");
    let m = msg("gru", &seq, &[int_arg("hidden", 2, 1), int_arg("layers", 0, 2)]);
    assert!(m.contains("layers"), "{m}");
    let bad_output =
        Arg { name: Some("returns".into()), value: ArgValue::Ident("final".into()), span: sp(3) };
    let m = msg("lstm", &seq, &[int_arg("hidden", 2, 1), bad_output]);
    assert!(m.contains("`final` is not a valid `returns`"), "{m}");
    let m = msg("gru", &seq, &[]);
    assert!(m.contains("hidden"), "{m}");
}
