//! The pass order, written out once in [`STEPS`]: lowering's output → cast placement →
//! autodiff → optimizer → distribution of sums over scaled terms → view canonicalisation →
//! fusion → schedule → sibling sums → rematerialisation (and, when it placed checkpoints, a
//! fresh partition and schedule of the new graph) → memory plan.
//!
//! Each step is followed by [`crate::ir::verify::verify`] in debug builds, by the size check,
//! and by the caller's trace hook (so `cvc emit --ir --after STEP` and the snapshot tests can
//! print the IR after any step). Steps that do not apply (autodiff of an inference graph, the
//! re-partition when remat placed no checkpoint) do not run and are not traced.
//!
//! Under a memory budget a training graph with recurrences whose plan does not fit is
//! compiled again with their backward in chunks of `T/2`, `T/4`, … steps (at least
//! [`MIN_RNN_CHUNK`]; see `autodiff::run_chunked`), keeping the first that fits.

use super::fusion::{Fusion, GroupId};
use super::memplan::ArenaPlan;
use super::{
    autodiff, cast, distribute, fusion, memplan, optimizer, remat, schedule, siblings, views, PipelineFacts,
    Program,
};
use crate::config::Optimizer;
use crate::error::{CompileError, CompileResult};
use crate::ir::*;

/// One step of the pipeline (a pass, or the front end's output for `Lower`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// The lowered graph, as the front end made it.
    Lower,
    /// Real→complex cast placement (`cast.rs`).
    Cast,
    /// The backward pass (`autodiff.rs`); training graphs only.
    Autodiff,
    /// The optimizer update (`optimizer.rs`); training graphs only.
    Optimizer,
    /// Sums distributed over scaled terms (`distribute.rs`).
    Distribute,
    /// Reshapes and broadcasts moved out of elementwise chains (`views.rs`); fusing only.
    Views,
    /// The kernel partition (`fusion.rs`).
    Fusion,
    /// The greedy low-peak schedule (`schedule.rs`).
    Schedule,
    /// Sibling sums moved next to each other (`siblings.rs`).
    Siblings,
    /// Checkpoints placed under a memory budget (`remat.rs`).
    Remat,
    /// The partition of the checkpointed graph; only after remat placed a checkpoint.
    RematFusion,
    /// Its schedule, recomputations deferred; only after remat placed a checkpoint.
    RematSchedule,
    /// Its sibling sums; only after remat placed a checkpoint.
    RematSiblings,
    /// The static memory plan (`memplan.rs`).
    Memplan,
}

/// Every step, in the order it runs.
pub const STEPS: [Step; 14] = [
    Step::Lower,
    Step::Cast,
    Step::Autodiff,
    Step::Optimizer,
    Step::Distribute,
    Step::Views,
    Step::Fusion,
    Step::Schedule,
    Step::Siblings,
    Step::Remat,
    Step::RematFusion,
    Step::RematSchedule,
    Step::RematSiblings,
    Step::Memplan,
];

impl Step {
    /// The step's name, as `cvc emit --ir --after NAME` and the trace hook spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Step::Lower => "lower",
            Step::Cast => "cast",
            Step::Autodiff => "autodiff",
            Step::Optimizer => "optimizer",
            Step::Distribute => "distribute",
            Step::Views => "views",
            Step::Fusion => "fusion",
            Step::Schedule => "schedule",
            Step::Siblings => "siblings",
            Step::Remat => "remat",
            Step::RematFusion => "remat.fusion",
            Step::RematSchedule => "remat.schedule",
            Step::RematSiblings => "remat.siblings",
            Step::Memplan => "memplan",
        }
    }

    /// The step called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Step> {
        STEPS.into_iter().find(|s| s.name() == name)
    }
}

/// The names of the steps, in the order they run (from [`STEPS`]).
pub const PASSES: [&str; STEPS.len()] = {
    let mut names = [""; STEPS.len()];
    let mut i = 0;
    while i < STEPS.len() {
        names[i] = STEPS[i].name();
        i += 1;
    }
    names
};

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
    /// Recompute in the backward pass the stored forward values that are cheap to recompute
    /// (normalised activations, pooled and concatenated maps) wherever that shrinks the
    /// arena, budget or not (`remat.rs`). `false` keeps every value the backward pass reads.
    pub cheap_remat: bool,
    /// Back-propagate recurrences of more than this many steps in chunks of it (checkpointed
    /// states; see `autodiff::run_chunked`). `None`: whole, unless a memory budget needs chunks.
    pub rnn_chunk: Option<usize>,
    /// The 16-bit format of activations and their gradients (`precision = bf16 | fp16` on
    /// the GPU; [`Storage::Full`] elsewhere). Which values it covers: [`crate::ir::storage`].
    pub half: Storage,
    /// Dynamic loss scaling of the training step (`optimizer::add_loss_scale`); always on when
    /// activations are stored in fp16, whose range (6·10⁻⁸ to 65504) a gradient leaves easily.
    pub loss_scaling: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            batch: 1,
            optimizer: Optimizer::default(),
            memory_budget: None,
            fuse: true,
            cheap_remat: true,
            rnn_chunk: None,
            half: Storage::Full,
            loss_scaling: false,
        }
    }
}

/// The shortest recurrence chunk the planner tries under a memory budget: shorter chunks
/// save little more memory (the checkpoints grow) and launch many more kernels.
pub const MIN_RNN_CHUNK: usize = 16;

/// Compiles a lowered graph into a [`Program`].
pub fn compile(graph: Graph, opts: &Options) -> CompileResult<Program> {
    compile_traced(graph, opts, &mut |_, _| {})
}

/// The steps of the longest recurrence of `g` (0 without one).
fn longest_recurrence(g: &Graph) -> usize {
    g.nodes
        .iter()
        .filter(|(_, n)| matches!(n.op, Op::Recurrence { .. }))
        .filter_map(|(_, n)| n.ty.shape.0.get(1).and_then(|d| d.fixed()))
        .max()
        .unwrap_or(0)
}

/// The chunk lengths to try for the recurrences of `g`, longest first: `⌈T/2⌉, ⌈T/4⌉, …` of
/// the longest recurrence, down to [`MIN_RNN_CHUNK`]. Empty without recurrences.
fn rnn_chunk_lengths(g: &Graph) -> Vec<usize> {
    let longest = longest_recurrence(g);
    let mut out = Vec::new();
    let mut parts = 2;
    while longest.div_ceil(parts) >= MIN_RNN_CHUNK && parts <= longest {
        let k = longest.div_ceil(parts);
        if out.last() != Some(&k) {
            out.push(k);
        }
        parts *= 2;
    }
    out
}

/// The most bytes all of a program's values may take together at the planned batch (1 PiB):
/// beyond it no plan is meaningful, and the planner's byte arithmetic stays far from overflow.
pub const MAX_PROGRAM_BYTES: u64 = 1 << 50;

/// Checks that the values of `g` at batch `batch` take at most [`MAX_PROGRAM_BYTES`] together;
/// a user error pointing at the first value past the limit otherwise.
pub fn check_size(g: &Graph, batch: usize) -> CompileResult<()> {
    // The first value past the limit, or `None` when all fit.
    let over = |batch: usize| {
        let mut total: u64 = 0;
        for h in g.nodes.handles() {
            let bytes = g.checked_bytes(h, batch).and_then(|b| u64::try_from(b).ok());
            match bytes.and_then(|b| total.checked_add(b)) {
                Some(t) if t <= MAX_PROGRAM_BYTES => total = t,
                _ => return Some(h),
            }
        }
        None
    };
    let Some(at) = over(batch) else { return Ok(()) };
    let limit = MAX_PROGRAM_BYTES >> 40;
    let (v, message) = match over(1) {
        Some(v1) => (
            v1,
            format!(
                "the values of model `{}` need more than {limit} TiB together even at batch 1 \
                 (one of them is {}): make the layers smaller",
                g.name,
                g.ty(v1)
            ),
        ),
        None => (
            at,
            format!(
                "at batch {batch} the values of model `{}` need more than {limit} TiB together \
                 (one of them is {}): lower --batch",
                g.name,
                g.ty(at)
            ),
        ),
    };
    let span = g.span(v);
    Err(if span.end > span.start {
        CompileError::user_at(span, message)
    } else {
        CompileError::user(message)
    })
}

/// PyTorch's "Expected more than 1 value per channel when training": a training graph whose
/// batchnorm would, at `batch`, take its statistics over one value per channel (batch 1 on a
/// `[B, C]` or `[B, C, 1, 1]` input) normalises every value to 0 and returns β. A user error
/// naming the layer. The batchnorm is found by its running-variance update: the `Assign` of
/// a `running_var*`/`running_vrr` state, whose value comes from a sum over the batch axis.
pub fn check_batch_statistics(g: &Graph, batch: usize) -> CompileResult<()> {
    if g.mode != Mode::Train {
        return Ok(());
    }
    for (_, n) in g.nodes.iter() {
        if !matches!(n.op, Op::Assign) || n.inputs.len() != 2 {
            continue;
        }
        let Op::State { name, .. } = &g.node(n.inputs[0]).op else { continue };
        let stat = name.rsplit('.').next().unwrap_or_default();
        if !(stat.starts_with("running_var") || stat == "running_vrr") {
            continue;
        }
        let Some(sum) = batch_sum_above(g, n.inputs[1]) else { continue };
        let node = g.node(sum);
        let Op::Reduce { axes, .. } = &node.op else { continue };
        let x = g.ty(node.inputs[0]);
        let extents = x.shape.resolve(batch);
        let per_channel: usize = axes.iter().map(|&a| extents[a]).product();
        if per_channel > 1 {
            continue;
        }
        let message = format!(
            "`{}` needs more than one value per channel in training, but at batch {batch} its              input {x} has {per_channel} (PyTorch: \"Expected more than 1 value per channel when \
             training\"): train with a batch of at least 2, or normalise before the spatial axes \
             shrink to 1",
            node.origin.label
        );
        let span = g.span(sum);
        return Err(if span.end > span.start {
            CompileError::user_at(span, message)
        } else {
            CompileError::user(message)
        });
    }
    Ok(())
}

/// The nearest sum over the batch axis (axis 0 of a batch-sized value) that `v` is computed
/// from, searching a few operand levels up.
fn batch_sum_above(g: &Graph, v: Value) -> Option<Value> {
    let mut frontier = vec![v];
    for _ in 0..8 {
        let mut next = Vec::new();
        for u in frontier {
            let n = g.node(u);
            if let Op::Reduce { op: ReduceOp::Sum, axes } = &n.op {
                let x = g.ty(n.inputs[0]);
                if axes.contains(&0) && x.shape.0.first() == Some(&Dim::Batch) {
                    return Some(u);
                }
            }
            next.extend(n.inputs.iter().copied());
        }
        frontier = next;
    }
    None
}

/// The IR verifier, in debug builds: a failure is a compiler bug.
fn verify_after(step: Step, g: &Graph) -> CompileResult<()> {
    if cfg!(debug_assertions) {
        crate::ir::verify::verify(g)
            .map_err(|e| CompileError::internal(format!("invalid IR after {}: {e}", step.name())))?;
    }
    Ok(())
}

/// What the steps have made so far.
struct State {
    graph: Graph,
    facts: PipelineFacts,
    fused: Option<Fusion>,
    order: Option<Vec<GroupId>>,
    /// Recomputed values remat placed (`None`: it placed none, and the re-plan steps skip).
    checkpoints: Option<Vec<Value>>,
    plan: Option<ArenaPlan>,
}

impl State {
    fn fused(&self, step: Step) -> CompileResult<&Fusion> {
        self.fused
            .as_ref()
            .ok_or_else(|| CompileError::internal(format!("{} ran before fusion", step.name())))
    }

    fn order(&mut self, step: Step) -> CompileResult<Vec<GroupId>> {
        self.order
            .take()
            .ok_or_else(|| CompileError::internal(format!("{} ran before schedule", step.name())))
    }

    /// The groups that write a recomputed value (the ones a schedule defers): remat's, which
    /// include the ones before it, or before remat placed any, autodiff's per-chunk ones.
    fn deferred(&self, step: Step) -> CompileResult<Vec<GroupId>> {
        let f = self.fused(step)?;
        let values: Vec<Value> = match &self.checkpoints {
            Some(c) => c.clone(),
            None => self.facts.recomputed.iter().map(|&(v, _)| v).collect(),
        };
        Ok(schedule::groups_writing(f, &values))
    }
}

/// Runs `step`; `Ok(false)` when it does not apply to this graph or these options.
fn run_step(step: Step, s: &mut State, opts: &Options) -> CompileResult<bool> {
    let train = s.graph.mode == Mode::Train;
    match step {
        Step::Lower => {}
        Step::Cast => s.facts.casts = cast::run(&mut s.graph)?,
        Step::Autodiff | Step::Optimizer if !train => return Ok(false),
        Step::Autodiff => {
            // Reported only when some recurrence is longer than a chunk.
            let chunked = opts.rnn_chunk.filter(|&k| longest_recurrence(&s.graph) > k);
            if opts.loss_scaling || opts.half == Storage::F16 {
                optimizer::add_loss_scale(&mut s.graph);
            }
            let ad = autodiff::run_chunked(&mut s.graph, opts.rnn_chunk)?;
            s.facts.grads = ad.grads;
            s.facts.rnn_chunk = chunked;
            let why = |g: &Graph, v: Value| {
                format!(
                    "{} {} recomputed per chunk of the recurrence backward",
                    g.node(v).op.mnemonic(),
                    g.node(v).origin.label
                )
            };
            s.facts.recomputed.extend(ad.recomputed.into_iter().map(|v| (v, why(&s.graph, v))));
        }
        Step::Optimizer => {
            optimizer::run(&mut s.graph, &s.facts.grads, &opts.optimizer)?;
        }
        Step::Distribute => {
            let map = distribute::run(&mut s.graph, &s.facts.kept())?;
            s.facts.remap(&map)?;
        }
        Step::Views if !opts.fuse => return Ok(false),
        Step::Views => {
            let map = views::run(&mut s.graph, &s.facts.kept())?;
            s.facts.remap(&map)?;
        }
        Step::Fusion => s.fused = Some(fusion::run(&s.graph, opts.fuse, &mut s.facts)?),
        Step::Schedule => {
            let deferred = s.deferred(step)?;
            s.order = Some(schedule::order_with(&s.graph, s.fused(step)?, opts.batch, &deferred)?);
        }
        Step::Siblings | Step::RematSiblings => {
            if step == Step::RematSiblings && s.checkpoints.is_none() {
                return Ok(false);
            }
            let deferred = s.deferred(step)?;
            let order = s.order(step)?;
            s.order = Some(siblings::run(&s.graph, s.fused(step)?, opts.batch, &deferred, order)?);
        }
        Step::Remat => {
            let order = s.order(step)?;
            let fused = s.fused(step)?.clone();
            s.checkpoints = remat::run(&mut s.graph, &fused, &order, opts, &mut s.facts)?;
            s.order = Some(order);
        }
        Step::RematFusion | Step::RematSchedule if s.checkpoints.is_none() => return Ok(false),
        // The new graph's partition: the same as remat measured its trials with (no view
        // step and no new facts: the checkpoint only cloned nodes that were already there).
        Step::RematFusion => s.fused = Some(fusion::partition(&s.graph, opts.fuse, &s.facts.kept())),
        Step::RematSchedule => {
            let deferred = s.deferred(step)?;
            s.order = Some(schedule::order_with(&s.graph, s.fused(step)?, opts.batch, &deferred)?);
        }
        Step::Memplan => {
            let order =
                s.order.as_deref().ok_or_else(|| CompileError::internal("memplan ran before schedule"))?;
            // Parameter gradients stay in memory to the step's end, so the runtime can report them.
            s.plan =
                Some(memplan::plan_keeping(&s.graph, s.fused(step)?, order, opts.batch, &s.facts.kept()));
        }
    }
    Ok(true)
}

/// Compiles like [`compile`], calling `trace(step, graph)` after every step that runs with the
/// IR as that step left it (`step` is one of [`PASSES`]). Under a memory budget that the plan
/// misses, a training graph with recurrences is compiled with chunked back-propagation
/// through time (see the module doc); the trace sees only the compilation that is returned.
pub fn compile_traced(
    graph: Graph,
    opts: &Options,
    trace: &mut dyn FnMut(&str, &Graph),
) -> CompileResult<Program> {
    if opts.batch == 0 {
        return Err(CompileError::user("the batch size must be at least 1"));
    }
    check_batch_statistics(&graph, opts.batch)?;
    let chosen = match opts.memory_budget {
        Some(budget) if opts.rnn_chunk.is_none() && graph.mode == Mode::Train => {
            choose_rnn_chunk(&graph, opts, budget)?
        }
        _ => None,
    };
    match chosen {
        Some(k) => run_pipeline(graph, &Options { rnn_chunk: Some(k), ..opts.clone() }, trace),
        None => run_pipeline(graph, opts, trace),
    }
}

/// The recurrence chunk length to compile `graph` with under `budget`: `None` when the whole
/// backward fits (or there is no recurrence), else the longest chunk whose plan fits. When
/// none fits the graph compiles unchunked, as without recurrences: the caller reports that
/// plan's size against the budget, as before chunking existed.
fn choose_rnn_chunk(graph: &Graph, opts: &Options, budget: u64) -> CompileResult<Option<usize>> {
    let lengths = rnn_chunk_lengths(graph);
    if lengths.is_empty() {
        return Ok(None);
    }
    let fits = |o: &Options| -> CompileResult<bool> {
        Ok(run_pipeline(graph.clone(), o, &mut |_, _| {})?.plan.arena_bytes as u64 <= budget)
    };
    if fits(opts)? {
        return Ok(None);
    }
    for k in lengths {
        if fits(&Options { rnn_chunk: Some(k), ..opts.clone() })? {
            return Ok(Some(k));
        }
    }
    Ok(None)
}

/// Runs every step of [`STEPS`] on `graph` with `opts` as they are.
fn run_pipeline(graph: Graph, opts: &Options, trace: &mut dyn FnMut(&str, &Graph)) -> CompileResult<Program> {
    let mut s = State {
        graph,
        facts: PipelineFacts::default(),
        fused: None,
        order: None,
        checkpoints: None,
        plan: None,
    };
    for step in STEPS {
        // Before every step: a pass that rebuilds the arena starts from `Graph::new`.
        s.graph.half = opts.half;
        if !run_step(step, &mut s, opts)? {
            continue;
        }
        s.graph.half = opts.half;
        verify_after(step, &s.graph)?;
        check_size(&s.graph, opts.batch)?;
        s.facts.passes.push(step.name().to_string());
        trace(step.name(), &s.graph);
    }
    let missing = |what: &str| CompileError::internal(format!("the pipeline made no {what}"));
    let fused = s.fused.ok_or_else(|| missing("kernel partition"))?;
    let order = s.order.ok_or_else(|| missing("schedule"))?;
    let plan = s.plan.ok_or_else(|| missing("memory plan"))?;
    Ok(Program { graph: s.graph, groups: fused.groups, order, plan, facts: s.facts })
}
