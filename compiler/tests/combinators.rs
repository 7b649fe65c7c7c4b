//! `residual(stages)` and `repeat(n, stages)`: a model written with them computes the same
//! function as the same model written out with one binding per join (the independent
//! reference), and misuse is a diagnostic with a span.

use cvc_compiler::front::check::check_source;
use cvc_compiler::front::Checked;
use cvc_compiler::init::SplitMix64;
use cvc_compiler::interp::check::random_tensor;
use cvc_compiler::interp::{evaluate, Tensor, TensorData};
use cvc_compiler::ir::*;
use std::collections::HashMap;

#[path = "../../tests/src/seed.rs"]
mod seed;

fn check(src: &str) -> Checked {
    match check_source("t.cvnn", src, Mode::Eval) {
        Ok(c) => c,
        Err(d) => panic!("{src}\n{d:#?}"),
    }
}

fn errors(src: &str) -> String {
    match check_source("t.cvnn", src, Mode::Eval) {
        Ok(_) => panic!("expected an error:\n{src}"),
        Err(d) => d.iter().map(|d| format!("{d:?}")).collect::<Vec<_>>().join("\n"),
    }
}

/// The parameter and input leaves of `c`, in creation order.
fn leaves(c: &Checked) -> Vec<(Value, String, TensorType)> {
    c.graph
        .nodes
        .iter()
        .filter_map(|(h, n)| match &n.op {
            Op::Param { name, .. } | Op::Input { name } => Some((h, name.clone(), n.ty.clone())),
            _ => None,
        })
        .collect()
}

/// Evaluates two models on the same random inputs and parameters (matched in creation order,
/// which must agree in shape and dtype) and returns the outputs of each.
fn run_both(a: &Checked, b: &Checked, batch: usize, test: &str) -> (Vec<Tensor>, Vec<Tensor>) {
    let (la, lb) = (leaves(a), leaves(b));
    assert_eq!(la.len(), lb.len(), "leaf counts differ: {la:?} vs {lb:?}");
    let mut rng = SplitMix64::new(seed::seed_for(&format!("combinators::{test}")));
    let (mut ma, mut mb) = (HashMap::new(), HashMap::new());
    for ((va, na, ta), (vb, nb, tb)) in la.iter().zip(&lb) {
        assert_eq!(ta, tb, "leaf {na} vs {nb}");
        let t = random_tensor(ta.dtype, &ta.shape.resolve(batch), 4, &mut rng);
        ma.insert(*va, t.clone());
        mb.insert(*vb, t);
    }
    let outs = |c: &Checked, m: &HashMap<Value, Tensor>| {
        let vals = evaluate(&c.graph, batch, m).unwrap();
        c.graph.outputs.iter().map(|o| vals[o.value.index()].clone().unwrap()).collect::<Vec<_>>()
    };
    (outs(a, &ma), outs(b, &mb))
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape, b.shape);
    match (&a.data, &b.data) {
        (TensorData::Complex(x), TensorData::Complex(y)) => {
            x.iter().zip(y).map(|(p, q)| (p - q).norm()).fold(0.0, f64::max)
        }
        (TensorData::Real(x), TensorData::Real(y)) => {
            x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0, f64::max)
        }
        _ => panic!("dtypes differ"),
    }
}

const COMBINED: &str = "
model M {
    input x: c64[B, 6]
    block layer(d) {
        residual(linear(d) |> crelu)
        residual(linear(d) |> modrelu |> linear(d))
    }
    y = x |> repeat(3, layer(6)) |> residual(crelu)
    output y
}
";

const WRITTEN_OUT: &str = "
model M {
    input x: c64[B, 6]
    a0 = x |> linear(6) |> crelu
    h0 = x + a0
    b0 = h0 |> linear(6) |> modrelu |> linear(6)
    x1 = h0 + b0
    a1 = x1 |> linear(6) |> crelu
    h1 = x1 + a1
    b1 = h1 |> linear(6) |> modrelu |> linear(6)
    x2 = h1 + b1
    a2 = x2 |> linear(6) |> crelu
    h2 = x2 + a2
    b2 = h2 |> linear(6) |> modrelu |> linear(6)
    x3 = h2 + b2
    c = x3 |> crelu
    y = x3 + c
    output y
}
";

#[test]
fn repeat_of_residual_blocks_equals_the_model_written_out() {
    let (a, b) = (check(COMBINED), check(WRITTEN_OUT));
    let (oa, ob) = run_both(&a, &b, 5, "written_out");
    assert_eq!(oa.len(), 1);
    let d = max_diff(&oa[0], &ob[0]);
    assert!(d < 1e-12, "outputs differ by {d}");
    // The output really depends on the stacked layers (not a pass-through).
    let x = leaves(&a).into_iter().find(|l| l.1 == "x").unwrap();
    assert_eq!(oa[0].shape, x.2.shape.resolve(5));
}

#[test]
fn repeated_layers_get_distinct_parameters_in_order() {
    let c = check(COMBINED);
    let names: Vec<&str> = c.params.iter().map(|p| p.name.as_str()).collect();
    // 3 repetitions × (3 linears with weight and bias + modrelu's bias).
    assert_eq!(names.len(), 21, "{names:?}");
    let unique: std::collections::HashSet<&&str> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    assert!(names[0].starts_with("y.linear_0."), "{names:?}");
    assert!(names[19].starts_with("y.linear_8."), "{names:?}");
    assert_eq!(names.iter().filter(|n| n.starts_with("y.modrelu_")).count(), 3);
}

#[test]
fn a_pipeline_of_one_name_and_a_nested_repeat_work() {
    let nested = "model M { input x: c64[B, 4]  y = x |> repeat(2, repeat(2, residual(crelu)))  output y }";
    let flat = "model M { input x: c64[B, 4]  y = x |> repeat(4, residual(crelu))  output y }";
    let (a, b) = (check(nested), check(flat));
    let (oa, ob) = run_both(&a, &b, 3, "nested");
    assert!(max_diff(&oa[0], &ob[0]) < 1e-12);
    // Independently: x ↦ x + crelu(x), four times, element by element.
    let x = leaves(&a).into_iter().find(|l| l.1 == "x").unwrap();
    let mut rng = SplitMix64::new(seed::seed_for("combinators::nested"));
    let input = random_tensor(x.2.dtype, &x.2.shape.resolve(3), 4, &mut rng);
    let (TensorData::Complex(xs), TensorData::Complex(ys)) = (&input.data, &oa[0].data) else { panic!() };
    for (x, y) in xs.iter().zip(ys) {
        let mut v = *x;
        for _ in 0..4 {
            v += num_complex::Complex64::new(v.re.max(0.0), v.im.max(0.0));
        }
        assert!((v - y).norm() < 1e-12, "{x} ↦ {y}, expected {v}");
    }
}

#[test]
fn misuse_is_reported_with_a_span() {
    let cases = [
        ("model M { input x: c64[B, 4]  y = residual(crelu)  output y }", "needs a tensor to apply to"),
        ("model M { input x: c64[B, 4]  y = x |> repeat(0, crelu)  output y }", "at least 1"),
        ("model M { input x: c64[B, 4]  y = x |> repeat(crelu)  output y }", "takes 2 arguments"),
        ("model M { input x: c64[B, 4]  y = x |> repeat(2.5, crelu)  output y }", "how many times"),
        ("model M { input x: c64[B, 4]  y = x |> residual(3)  output y }", "must be stages"),
        ("model M { input x: c64[B, 4]  y = x |> residual(crelu, crelu)  output y }", "takes 1 argument"),
        ("model M { input x: c64[B, 4]  y = x |> residual(times = 2)  output y }", "no named arguments"),
        ("model M { input x: c64[B, 4]  block residual(c) { crelu }  y = x |> crelu  output y }", "name of an operator"),
        ("model M { input x: c64[B, 4]  block b(c) { residual(crelu |> frobnicate) }  y = x |> b(1)  output y }", "unknown operator `frobnicate`"),
        ("model M { input x: c64[B, 4]  block b(c) { residual(b(c)) }  y = x |> b(1)  output y }", "uses itself"),
        ("model M { input x: c64[B, 4]  y = x |> residual(linear(3))  output y }", "broadcast"),
    ];
    for (src, want) in cases {
        let got = errors(src);
        assert!(got.contains(want), "for {src}\nwanted `{want}` in\n{got}");
        assert!(got.contains("span"), "no span in {got}");
    }
}

#[test]
fn a_huge_repeat_count_stops_at_the_layer_limit() {
    let src = "model M { input x: c64[B, 4]  y = x |> repeat(1000000000, crelu)  output y }";
    let got = errors(src);
    assert!(got.contains("more than"), "{got}");
}
