//! `param NAME: TYPE = INIT` declarations: lowering (a `Param` leaf named `NAME`, its table
//! row, PyTorch's Glorot fans), training (the optimizer updates it like layer weights), the
//! draws of the new `normal` initialiser, and the errors for bad types, initialisers and names.

use cvc_compiler::front::check_source;
use cvc_compiler::init::{init_values, SplitMix64};
use cvc_compiler::ir::*;
use cvc_compiler::passes::pipeline::{compile, Options};

const TOKENS: &str = include_str!("../../tests/fixtures/ok/tokens.cvnn");

fn init_of(g: &Graph, name: &str) -> Init {
    let v = g.params().find(|&p| g.leaf_name(p) == Some(name)).unwrap_or_else(|| panic!("no param {name}"));
    g.init_of(v).expect("a param").clone()
}

#[test]
fn params_are_named_leaves_with_their_inits_and_rows() {
    let c = check_source("tokens.cvnn", TOKENS, Mode::Train).unwrap_or_else(|d| panic!("{d:?}"));
    assert_eq!(init_of(&c.graph, "pos"), Init::Normal { std: 0.02 });
    // PyTorch's fans of a [6, 8] tensor: fan_in = 8, fan_out = 6.
    assert_eq!(init_of(&c.graph, "gain"), Init::Glorot { fan_in: 8, fan_out: 6 });
    assert_eq!(init_of(&c.graph, "shift"), Init::Uniform { bound: 0.1 });
    assert_eq!(init_of(&c.graph, "tok.embedding_0.weight"), Init::Normal { std: 1.0 });
    let names: Vec<&str> = c.params.iter().map(|p| p.name.as_str()).collect();
    for n in ["pos", "gain", "shift", "tok.embedding_0.weight", "gate.embedding_0.weight"] {
        assert!(names.contains(&n), "{n} not among {names:?}");
    }
    let row = c.table.iter().find(|r| r.label == "pos").expect("a table row for pos");
    assert_eq!(row.op, "param = normal(std = 0.02)");
    assert_eq!((row.params_complex, row.params_real, row.line), (48, 96, 7));
    assert_eq!(row.shape, Shape::fixed(&[1, 6, 8]));
}

#[test]
fn params_are_trained_by_the_optimizer() {
    let c = check_source("tokens.cvnn", TOKENS, Mode::Train).unwrap_or_else(|d| panic!("{d:?}"));
    let opts = Options { batch: 2, optimizer: c.train.optimizer.clone(), ..Options::default() };
    let p = compile(c.graph, &opts).expect("compiles");
    let g = &p.graph;
    for name in ["pos", "gain", "shift", "tok.embedding_0.weight"] {
        let v = g.params().find(|&q| g.leaf_name(q) == Some(name)).expect("param");
        assert!(g.assigns().any(|(_, t)| t == v), "{name} has no optimizer update");
    }
}

#[test]
fn normal_init_splits_the_variance_of_complex_values() {
    let mut rng = SplitMix64::new(3);
    let n = 40_000;
    let z = init_values(&Init::Normal { std: 0.5 }, DType::C64, &[n], &mut rng);
    let mean_sq =
        |f: &dyn Fn(&num_complex::Complex64) -> f64| z.iter().map(|v| f(v).powi(2)).sum::<f64>() / n as f64;
    // E|z|² = std² = 0.25, half of it on each part; 40k draws: a few % of sampling error.
    assert!((mean_sq(&|v| v.norm()) - 0.25).abs() < 0.01);
    assert!((mean_sq(&|v| v.re) - 0.125).abs() < 0.006);
    assert!((mean_sq(&|v| v.im) - 0.125).abs() < 0.006);
    let x = init_values(&Init::Normal { std: 0.5 }, DType::F32, &[n], &mut rng);
    assert!(x.iter().all(|v| v.im == 0.0));
    assert!((x.iter().map(|v| v.re * v.re).sum::<f64>() / n as f64 - 0.25).abs() < 0.01);
}

/// The first error of a model with `line` added after an input `x: c64[B, 4]`.
fn error_of(line: &str) -> String {
    let src =
        format!("model M {{\n    input x: c64[B, 4]\n    {line}\n    y = x |> crelu\n    output y\n}}\n");
    match check_source("m.cvnn", &src, Mode::Eval) {
        Ok(_) => panic!("`{line}` should be rejected"),
        Err(d) => {
            let d = &d[0];
            let at = &src[d.primary.span.range()];
            format!(
                "{} @ `{at}`{}",
                d.message,
                d.help.as_deref().map(|h| format!(" | {h}")).unwrap_or_default()
            )
        }
    }
}

#[test]
fn bad_params_are_errors_with_spans() {
    let cases = [
        ("param p: c64[B, 4] = zeros", "no batch `B` @ `B`"),
        ("param p: class[4] of 3 = zeros", "not `class` @ `class`"),
        ("param p: f32[4] of 3 = zeros", "takes no `of N` @ `3`"),
        ("param p: f33[4] = zeros", "did you mean `f32`?"),
        ("param p: c64[0] = zeros", "not positive @ `0`"),
        ("param p: c64[4] = normall(std = 0.1)", "unknown initialiser `normall` @ `normall`"),
        ("param p: c64[4] = normal(std = -1.0)", "must be positive"),
        ("param p: c64[4] = normal(mean = 0.0)", "has no argument `mean`"),
        ("param p: c64[4] = uniform", "needs its bound"),
        ("param p: c64[4] = zeros(1)", "takes no arguments"),
        ("param p: c64[4] = glorot", "two dimensions or more @ `glorot`"),
        ("param p: c64[4] = 0.5", "expected an initialiser @ `0.5`"),
        ("param x: c64[4] = zeros", "`x` is defined twice @ `x`"),
        ("param p: c64[4] = normal(std = x)", "compile-time number"),
    ];
    for (line, want) in cases {
        let got = error_of(line);
        assert!(got.contains(want), "`{line}`: got `{got}`, want `{want}`");
    }
}

#[test]
fn params_are_values_usable_below_their_declaration() {
    let ok =
        "model M {\n    input x: c64[B, 4]\n    param s: f32[1] = ones\n    y = x * s + x\n    output y\n}\n";
    check_source("m.cvnn", ok, Mode::Eval).unwrap_or_else(|d| panic!("{d:?}"));
    let early =
        "model M {\n    input x: c64[B, 4]\n    y = x * s\n    param s: f32[1] = ones\n    output y\n}\n";
    let d = check_source("m.cvnn", early, Mode::Eval).expect_err("used before definition");
    assert!(d[0].message.contains("used before it is defined"), "{}", d[0].message);
}
