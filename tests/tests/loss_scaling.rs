//! Dynamic loss scaling (`precision = fp16`; `optimizer.rs`), checked where it is exact: on the
//! f64 interpreter and on the CPU back end, which run the same IR the GPU runs. A scaled step
//! updates like an unscaled one; a step whose gradient is not finite changes no parameter,
//! moment or step count, halves the scale and counts a skip; 2000 finite steps double it.

use cvc_compiler::config::{Optimizer, OptimizerKind};
use cvc_compiler::front::check_source;
use cvc_compiler::interp::{evaluate, SplitMix64, Tensor, TensorData};
use cvc_compiler::ir::{Graph, Mode, Op, Value};
use cvc_compiler::passes::optimizer::{GOOD_STEPS, GROWTH_INTERVAL, INIT_SCALE, LOSS_SCALE, SKIPPED};
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;
use cvc_runtime::backend::Backend;
use cvc_runtime::cpu::CpuBackend;
use cvc_tests::differential::{check_training_steps, random_leaves, rel_err};
use cvc_tests::seed::seed_for;
use std::collections::HashMap;

const SRC: &str = "model Scaled {
  input x: c64[B, 6]
  input label: class[B] of 3
  logits = x |> linear(5) |> crelu |> linear(3) |> abs
  output logits
  loss cross_entropy(logits, label)
}
";

fn program(scaling: bool) -> Program {
    let checked = check_source("scaled.cvnn", SRC, Mode::Train).expect("checks");
    let adam = Optimizer {
        kind: OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
        lr: 1e-2,
        weight_decay: 0.0,
    };
    let opts = Options { batch: 4, optimizer: adam, loss_scaling: scaling, ..Options::default() };
    compile(checked.graph, &opts).expect("compiles")
}

fn leaf(g: &Graph, name: &str) -> Value {
    g.find_leaf(name).unwrap_or_else(|| panic!("no leaf {name}"))
}

fn scalar(t: &Tensor) -> f64 {
    match &t.data {
        TensorData::Real(v) => v[0],
        other => panic!("not a real scalar: {other:?}"),
    }
}

/// The value each persistent buffer holds after one interpreted step, by name.
fn step(g: &Graph, leaves: &HashMap<Value, Tensor>) -> HashMap<String, Tensor> {
    let vals = evaluate(g, 4, leaves).expect("evaluates");
    g.assigns()
        .map(|(a, t)| (g.leaf_name(t).expect("named").to_string(), vals[a.index()].clone().expect("value")))
        .collect()
}

/// The leaves of `scaled` that `plain` also has, taken from `plain_leaves` (same names).
fn shared_leaves(
    plain: &Graph,
    plain_leaves: &HashMap<Value, Tensor>,
    scaled: &Graph,
) -> HashMap<Value, Tensor> {
    let mut out = random_leaves(scaled, 4, &mut SplitMix64::new(1));
    for (v, t) in plain_leaves {
        let name = plain.leaf_name(*v).expect("leaf");
        out.insert(leaf(scaled, name), t.clone());
    }
    out
}

#[test]
fn a_scaled_step_updates_like_an_unscaled_one() {
    let (plain, scaled) = (program(false), program(true));
    let (pg, sg) = (&plain.graph, &scaled.graph);
    assert!(pg.find_leaf(LOSS_SCALE).is_none() && sg.find_leaf(LOSS_SCALE).is_some());
    let mut rng = SplitMix64::new(seed_for("loss_scaling::same_update"));
    let leaves = random_leaves(pg, 4, &mut rng);
    let sl = shared_leaves(pg, &leaves, sg);
    assert_eq!(scalar(&sl[&leaf(sg, LOSS_SCALE)]), INIT_SCALE, "the first scale is PyTorch's 2^16");
    let (want, got) = (step(pg, &leaves), step(sg, &sl));
    let mut params = 0;
    for (name, w) in &want {
        let e = rel_err(&got[name], w);
        assert!(e < 1e-12, "{name}: the scaled step differs by {e:.2e}");
        params += usize::from(pg.is_param(leaf(pg, name)));
    }
    assert!(params >= 4, "the model's weights and biases are updated");
    assert_eq!(scalar(&got[LOSS_SCALE]), INIT_SCALE, "one finite step keeps the scale");
    assert_eq!(scalar(&got[GOOD_STEPS]), 1.0);
    assert_eq!(scalar(&got[SKIPPED]), 0.0);
}

#[test]
fn a_non_finite_gradient_skips_the_step_and_halves_the_scale() {
    let scaled = program(true);
    let g = &scaled.graph;
    let mut rng = SplitMix64::new(seed_for("loss_scaling::skip"));
    let mut leaves = random_leaves(g, 4, &mut rng);
    // One input value of infinity makes the logits, the loss and every weight gradient non-finite.
    let x = leaf(g, "x");
    match &mut leaves.get_mut(&x).expect("x").data {
        TensorData::Complex(v) => v[3].re = f64::INFINITY,
        other => panic!("x is {other:?}"),
    }
    leaves.insert(leaf(g, GOOD_STEPS), Tensor::real(&[], vec![17.0]));
    let got = step(g, &leaves);
    for (name, new) in &got {
        let v = leaf(g, name);
        if matches!(g.node(v).op, Op::Param { .. })
            || name.ends_with("exp_avg")
            || name.ends_with("exp_avg_sq")
        {
            assert_eq!(rel_err(new, &leaves[&v]), 0.0, "{name} changed on a skipped step");
        }
    }
    assert_eq!(scalar(&got["optimizer.t"]), scalar(&leaves[&leaf(g, "optimizer.t")]), "Adam's t advanced");
    assert_eq!(scalar(&got[LOSS_SCALE]), INIT_SCALE / 2.0);
    assert_eq!(scalar(&got[GOOD_STEPS]), 0.0, "a skip restarts the finite-step count");
    assert_eq!(scalar(&got[SKIPPED]), 1.0);
}

#[test]
fn the_scale_doubles_after_the_growth_interval() {
    let scaled = program(true);
    let g = &scaled.graph;
    let mut rng = SplitMix64::new(seed_for("loss_scaling::grow"));
    let mut leaves = random_leaves(g, 4, &mut rng);
    leaves.insert(leaf(g, GOOD_STEPS), Tensor::real(&[], vec![GROWTH_INTERVAL - 2.0]));
    let once = step(g, &leaves);
    assert_eq!((scalar(&once[LOSS_SCALE]), scalar(&once[GOOD_STEPS])), (INIT_SCALE, GROWTH_INTERVAL - 1.0));
    leaves.insert(leaf(g, GOOD_STEPS), Tensor::real(&[], vec![GROWTH_INTERVAL - 1.0]));
    let twice = step(g, &leaves);
    assert_eq!((scalar(&twice[LOSS_SCALE]), scalar(&twice[GOOD_STEPS])), (2.0 * INIT_SCALE, 0.0));
}

/// The CPU back end runs the guarded update (selects, the finite check) as the interpreter
/// does, group by group, over two steps.
#[test]
fn the_cpu_back_end_runs_the_guarded_update_like_the_interpreter() {
    let scaled = program(true);
    let cpu = |p: &Program| -> Result<Box<dyn Backend>, String> {
        Ok(Box::new(CpuBackend::new(p).map_err(|e| e.0)?))
    };
    let mut rng = SplitMix64::new(seed_for("loss_scaling::cpu"));
    let fails = check_training_steps(&scaled, &cpu, 2, 0.1, &mut rng).expect("runs");
    assert!(fails.is_empty(), "{fails:?}");
}
