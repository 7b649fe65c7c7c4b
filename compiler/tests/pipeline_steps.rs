//! The pipeline's steps: every step that runs is traced under its name from the one table
//! (`pipeline::STEPS` / `PASSES`), in table order; the steps that used to run hidden inside
//! others (views, siblings, remat's re-partition and re-schedule) are steps of their own;
//! the compile errors are classified (user error vs compiler bug).

use cvc_compiler::front::check_source;
use cvc_compiler::ir::Mode;
use cvc_compiler::passes::pipeline::{check_size, compile, compile_traced, Options, Step, PASSES, STEPS};
use cvc_compiler::CompileError;

fn example(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names of the steps that ran, and the final program, for seed_cnn at batch 64.
fn traced(mode: Mode, budget: Option<u64>) -> (Vec<String>, cvc_compiler::passes::Program) {
    traced_with(mode, budget, true)
}

/// [`traced`] with the cheap recomputation of `remat.rs` on or off.
fn traced_with(
    mode: Mode,
    budget: Option<u64>,
    cheap_remat: bool,
) -> (Vec<String>, cvc_compiler::passes::Program) {
    let checked = check_source("seed_cnn.cvnn", &example("seed_cnn.cvnn"), mode).expect("checks");
    let opts = Options {
        batch: 64,
        optimizer: checked.train.optimizer.clone(),
        memory_budget: budget,
        fuse: true,
        rnn_chunk: None,
        cheap_remat,
        ..Options::default()
    };
    let mut names = Vec::new();
    let p =
        compile_traced(checked.graph, &opts, &mut |pass, _| names.push(pass.to_string())).expect("compiles");
    (names, p)
}

#[test]
fn names_come_from_one_table() {
    assert_eq!(PASSES.len(), STEPS.len());
    for (name, step) in PASSES.iter().zip(STEPS) {
        assert_eq!(Step::from_name(name), Some(step), "{name}");
        assert_eq!(step.name(), *name);
    }
    let mut unique = PASSES.to_vec();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), PASSES.len(), "a name is used twice: {PASSES:?}");
    assert_eq!(Step::from_name("nonsense"), None);
}

#[test]
fn training_runs_every_step_but_the_replan_in_table_order() {
    let (names, p) = traced_with(Mode::Train, None, false);
    let want: Vec<&str> = PASSES.iter().copied().filter(|n| !n.starts_with("remat.")).collect();
    assert_eq!(names, want);
    assert_eq!(p.facts.passes, names, "the facts list what the trace saw");
    for hidden in ["views", "siblings"] {
        assert!(names.iter().any(|n| n == hidden), "{hidden} is not a step of its own");
    }
}

/// Without a budget, a cheap recomputation that shrinks the arena (the seed network's
/// batchnorm-CReLU output, read by the next convolution's weight gradient) is kept, and the
/// checkpointed graph is re-planned by the visible steps, every step in table order.
#[test]
fn cheap_recomputation_is_replanned_as_visible_steps() {
    let (names, p) = traced(Mode::Train, None);
    assert_eq!(names, PASSES.to_vec());
    assert!(
        p.facts.recomputed.iter().any(|(_, why)| why.contains("cheaper than storing")),
        "{:?}",
        p.facts.recomputed
    );
    let (_, all_kept) = traced_with(Mode::Train, None, false);
    assert!(p.plan.arena_bytes < all_kept.plan.arena_bytes);
}

#[test]
fn inference_skips_autodiff_and_optimizer() {
    let (names, _) = traced(Mode::Eval, None);
    assert!(!names.iter().any(|n| n == "autodiff" || n == "optimizer"), "{names:?}");
    assert!(names.iter().any(|n| n == "siblings"));
}

/// Under a budget that needs checkpoints, the partition and schedule of the checkpointed graph
/// run as steps of their own, after `remat` and before `memplan`, and the program they make
/// fits the budget that remat measured.
#[test]
fn checkpoints_are_replanned_as_visible_steps() {
    let (_, free) = traced(Mode::Train, None);
    let budget = 3 * free.plan.arena_bytes as u64 / 4;
    let (names, tight) = traced(Mode::Train, Some(budget));
    let at =
        |n: &str| names.iter().position(|x| x == n).unwrap_or_else(|| panic!("{n} did not run: {names:?}"));
    assert!(at("remat") < at("remat.fusion"));
    assert!(at("remat.fusion") < at("remat.schedule"));
    assert!(at("remat.schedule") < at("remat.siblings"));
    assert!(at("remat.siblings") < at("memplan"));
    assert!(tight.plan.arena_bytes as u64 <= budget, "{} > {budget}", tight.plan.arena_bytes);
    assert!(tight.facts.recomputed.iter().any(|(_, why)| why.contains("checkpoint")));
}

#[test]
fn errors_are_classified() {
    let checked = check_source("seed_cnn.cvnn", &example("seed_cnn.cvnn"), Mode::Train).expect("checks");
    let zero = Options { batch: 0, ..Options::default() };
    let e = compile(checked.graph.clone(), &zero).expect_err("batch 0");
    assert!(matches!(e, CompileError::User { .. }), "{e:?}");
    assert!(e.to_string().contains("batch"), "{e}");
    // Far past the size limit: a user error that points at a value of the source.
    let e = check_size(&checked.graph, 1 << 40).expect_err("too large");
    match &e {
        CompileError::User { span: Some(span), message } => {
            assert!(span.end > span.start, "{span:?}");
            assert!(message.contains("lower --batch"), "{message}");
        }
        other => panic!("not a user error with a span: {other:?}"),
    }
    assert!(!e.is_internal());
}
