//! The pass order, written out once: lowering's output → cast placement → autodiff →
//! optimizer → distribution of sums over scaled terms → fusion → schedule → rematerialisation → memory plan.
//!
//! Each IR-changing pass is followed by [`crate::ir::verify::verify`] in debug builds, and by
//! the caller's trace hook (so `cvc emit --ir --after PASS` and the snapshot tests can print
//! the IR after any pass).

use super::fusion::Fusion;
use super::{
    autodiff, cast, distribute, fusion, memplan, optimizer, remat, schedule, PipelineFacts, Program,
};
use crate::config::Optimizer;
use crate::ir::*;

/// The names of the passes, in the order they run (`lower` is the front end's output).
pub const PASSES: [&str; 9] =
    ["lower", "cast", "autodiff", "optimizer", "distribute", "fusion", "schedule", "remat", "memplan"];

/// What to compile for.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// The batch size the memory plan is made for.
    pub batch: usize,
    /// The optimizer whose update is compiled into a training step.
    pub optimizer: Optimizer,
    /// Checkpoint (recompute contractions in the backward pass) until the arena fits.
    pub memory_budget: Option<u64>,
    /// Fuse elementwise chains (`false`: one kernel per node, the baseline).
    pub fuse: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { batch: 1, optimizer: Optimizer::default(), memory_budget: None, fuse: true }
    }
}

/// Compiles a lowered graph into a [`Program`].
pub fn compile(graph: Graph, opts: &Options) -> Result<Program, String> {
    compile_traced(graph, opts, &mut |_, _| {})
}

/// The most bytes all of a program's values may take together at the planned batch (1 PiB):
/// beyond it no plan is meaningful, and the planner's byte arithmetic stays far from overflow.
pub const MAX_PROGRAM_BYTES: u64 = 1 << 50;

/// Checks that the values of `g` at batch `batch` take at most [`MAX_PROGRAM_BYTES`] together.
pub fn check_size(g: &Graph, batch: usize) -> Result<(), String> {
    // The first value past the limit, or `None` when all fit.
    let over = |batch: usize| {
        let mut total: u64 = 0;
        for (_, n) in g.nodes.iter() {
            let bytes = n.ty.checked_bytes(batch).and_then(|b| u64::try_from(b).ok());
            match bytes.and_then(|b| total.checked_add(b)) {
                Some(t) if t <= MAX_PROGRAM_BYTES => total = t,
                _ => return Some(&n.ty),
            }
        }
        None
    };
    let Some(ty) = over(batch) else { return Ok(()) };
    let limit = MAX_PROGRAM_BYTES >> 40;
    Err(match over(1) {
        Some(ty1) => format!(
            "the values of model `{}` need more than {limit} TiB together even at batch 1 \
             (one of them is {ty1}): make the layers smaller",
            g.name
        ),
        None => format!(
            "at batch {batch} the values of model `{}` need more than {limit} TiB together \
             (one of them is {ty}): lower --batch",
            g.name
        ),
    })
}

fn check(pass: &str, g: &Graph) -> Result<(), String> {
    if cfg!(debug_assertions) {
        crate::ir::verify::verify(g).map_err(|e| format!("internal error: invalid IR after {pass}: {e}"))?;
    }
    Ok(())
}

/// Compiles like [`compile`], calling `trace(pass, graph)` after every pass with the IR as
/// that pass left it.
pub fn compile_traced(
    mut graph: Graph,
    opts: &Options,
    trace: &mut dyn FnMut(&str, &Graph),
) -> Result<Program, String> {
    if opts.batch == 0 {
        return Err("the batch size must be at least 1".into());
    }
    let batch = opts.batch;
    let mut facts = PipelineFacts::default();
    let mut done = |pass: &str, g: &Graph, facts: &mut PipelineFacts| -> Result<(), String> {
        check(pass, g)?;
        check_size(g, batch)?;
        facts.passes.push(pass.to_string());
        trace(pass, g);
        Ok(())
    };
    done("lower", &graph, &mut facts)?;

    facts.casts = cast::run(&mut graph)?;
    done("cast", &graph, &mut facts)?;

    if graph.mode == Mode::Train {
        let ad = autodiff::run(&mut graph)?;
        facts.grads = ad.grads;
        done("autodiff", &graph, &mut facts)?;
        optimizer::run(&mut graph, &facts.grads, &opts.optimizer)?;
        done("optimizer", &graph, &mut facts)?;
    }

    let map = distribute::run(&mut graph)?;
    super::remat::remap(&mut facts, &map);
    done("distribute", &graph, &mut facts)?;

    let mut fused: Fusion = fusion::run(&mut graph, opts.fuse, &mut facts)?;
    done("fusion", &graph, &mut facts)?;

    let mut order = schedule::run(&graph, &fused, opts.batch)?;
    done("schedule", &graph, &mut facts)?;

    remat::run(&mut graph, &mut fused, &mut order, opts, &mut facts)?;
    done("remat", &graph, &mut facts)?;

    // Parameter gradients stay in memory to the step's end, so the runtime can report them.
    let keep: Vec<Value> = facts.grads.iter().map(|&(_, d)| d).collect();
    let plan = memplan::plan_keeping(&graph, &fused, &order, opts.batch, &keep);
    done("memplan", &graph, &mut facts)?;

    Ok(Program { graph, groups: fused.groups, order, plan, facts })
}
