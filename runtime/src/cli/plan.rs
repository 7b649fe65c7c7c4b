//! `cvc plan`: compile a model and print its static plan — passes, kernels, casts, combines,
//! recomputed values, arena size against the lower bound, the tensors alive at the peak —
//! the largest batch for a memory budget, and a timeline picture of the arena.
//!
//! The plan is for the back end `cvc train` would use (`--device`, else the train section's,
//! else a GPU when one is usable): for CUDA the kernels are generated too (for the GPU, or
//! without one for the H200 of ahead-of-time emission), so the plan lists which kernels index
//! with 64 bits, and `--max-batch` offers only a batch whose kernels the back end can
//! generate (capping by any limit that remains, and saying which).

use super::train::DeviceArg;
use super::{CliError, CliResult};
use crate::buffers::{line_of, BufferKind};
use cvc_compiler::back::cuda::{CudaModule, CudaStep, IndexWidth};
use cvc_compiler::front::train::DeviceChoice;
use cvc_compiler::front::{check_file, render_all, Checked};
use cvc_compiler::ir::{Mode, Storage, Value};
use cvc_compiler::passes::fusion::GroupKind;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;
use cvc_compiler::target::CudaTarget;
use cvc_compiler::units::human_bytes;
use cvc_compiler::CompileError;
use cvc_grammar::LineIndex;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Arguments of `cvc plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
    /// Batch size to plan for (default: the train section's batch).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// Recompute (checkpoint) until the arena fits this many bytes, e.g. `4GiB`.
    #[arg(long, value_parser = parse_budget)]
    pub memory_budget: Option<u64>,
    /// Print the largest batch whose plan fits this many bytes, e.g. `8GiB`.
    #[arg(long, value_parser = parse_budget, conflicts_with_all = ["batch", "memory_budget", "timeline"])]
    pub max_batch: Option<u64>,
    /// Write an SVG picture of the arena over the schedule to this file.
    #[arg(long)]
    pub timeline: Option<PathBuf>,
    /// Plan inference only (no backward pass or optimizer update).
    #[arg(long)]
    pub eval: bool,
    /// Plan the unfused baseline (one kernel per node).
    #[arg(long)]
    pub no_fuse: bool,
    /// Print every kernel, recomputed value and tensor alive at the peak (the default is a
    /// summary that fits a screen).
    #[arg(long, short)]
    pub verbose: bool,
    /// The back end to plan for, as `cvc train --device` (default: the train section's
    /// `device`, else auto: CUDA when a GPU is usable, else the CPU). For CUDA the kernels are
    /// generated as well (for the GPU found, else for an H200).
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Numerics to plan for, as `cvc train --precision` (default: the train section's): on
    /// CUDA, bf16 and fp16 store activations in 16 bits (docs/PRECISION.md); the CPU plan is
    /// full width whatever this says.
    #[arg(long, value_enum)]
    pub precision: Option<super::train::PrecisionArg>,
}

/// The back end a plan is for: what `--max-batch` must be able to run.
#[derive(Clone, Debug)]
pub enum Backend {
    /// The CPU back end: no limit besides memory (its kernels index with `usize`).
    Cpu,
    /// The CUDA back end for `target`.
    Cuda {
        /// The device, kernel choices and numerics the kernels are generated for (boxed: a
        /// target is large next to the CPU variant).
        target: Box<CudaTarget>,
        /// Whether `target`'s device is the GPU of this machine (else the H200 defaults).
        queried: bool,
    },
}

impl Backend {
    /// The back end for `device` (else the train section's device): CUDA for `cuda`, and for
    /// `auto` when a GPU is usable; the CPU otherwise (the interpreter has no limits either).
    /// The CUDA target is the GPU's when there is one, else the H200 of ahead-of-time
    /// emission (`cvc emit --cuda`), with the train section's precision.
    pub fn resolve(device: Option<DeviceArg>, c: &Checked) -> Backend {
        let gpu = || crate::cuda::device_facts();
        let want_cuda = match device {
            Some(DeviceArg::Cuda) => true,
            Some(DeviceArg::Cpu | DeviceArg::Interp) => false,
            Some(DeviceArg::Auto) => gpu().is_ok(),
            None => match c.train.device {
                DeviceChoice::Cuda => true,
                DeviceChoice::Cpu => false,
                DeviceChoice::Auto => gpu().is_ok(),
            },
        };
        if !want_cuda {
            return Backend::Cpu;
        }
        let (device, queried) = match gpu() {
            Ok(d) => (d, true),
            Err(_) => (cvc_compiler::target::CudaDevice::h200(), false),
        };
        let target = CudaTarget { device, ..CudaTarget::h200() }.with_precision(c.train.precision);
        Backend::Cuda { target: Box::new(target), queried }
    }

    /// The kernels of `p` on this back end: the CUDA module (`None` on the CPU), or the
    /// back end's error when it cannot generate them (a user error: a limit of the back end
    /// at this batch; an internal error: a bug).
    pub fn generate(&self, p: &Program) -> Result<Option<CudaModule>, CompileError> {
        match self {
            Backend::Cpu => Ok(None),
            Backend::Cuda { target, .. } => cvc_compiler::back::cuda::generate(p, target).map(Some),
        }
    }

    /// How activations are stored on this back end: the precision's 16-bit format on CUDA
    /// (`bf16`, `fp16`), full width on the CPU (which computes and stores in f32).
    pub fn half(&self) -> Storage {
        match self {
            Backend::Cpu => Storage::Full,
            Backend::Cuda { target, .. } => target.precision.storage(),
        }
    }

    /// `CUDA (sm_90, this machine's GPU)`, `CUDA (sm_90, an H200: no GPU here)` or `CPU`.
    pub fn describe(&self) -> String {
        match self {
            Backend::Cpu => "CPU".into(),
            Backend::Cuda { target, queried: true } => {
                format!("CUDA ({}, this machine's GPU)", target.device.arch())
            }
            Backend::Cuda { target, queried: false } => {
                format!("CUDA ({}, planned for an H200: no usable GPU here)", target.device.arch())
            }
        }
    }
}

/// Parses a memory budget (`--memory-budget`, `--max-batch`): a byte size in the forms of
/// [`cvc_compiler::units::parse_bytes`] (`4GiB`, `4g`, `512MiB`, `2GB`, `1000000`), at least 1 byte.
pub fn parse_budget(s: &str) -> Result<u64, String> {
    match cvc_compiler::units::parse_bytes(s) {
        Ok(0) => Err(format!("`{s}` is not a usable memory budget: it must be at least 1 byte")),
        Ok(b) => Ok(b),
        Err(e) => Err(e.to_string()),
    }
}

/// The error when a plan's arena of `arena_bytes` exceeds a memory budget, else `None`: one
/// rule and one message for `cvc plan` and for every session `train`, `run` and `eval` open
/// (which check it before allocating anything).
pub fn budget_error(arena_bytes: u64, budget: Option<u64>) -> Option<String> {
    let b = budget?;
    (arena_bytes > b).then(|| {
        format!(
            "the plan needs {} but the memory budget is {}: lower the batch or raise the budget",
            human_bytes(arena_bytes),
            human_bytes(b)
        )
    })
}

/// Writes `text` to stdout ([`super::write_out`]: a write error is an error, a closed pipe
/// ends output quietly).
pub fn print_out(text: &str) -> CliResult {
    super::write_out(text)
}

/// Checks a `.cvnn` file for planning: a training step when the model has a loss (and
/// `eval` is false), inference otherwise. Diagnostics are printed to stderr.
pub fn load(file: &Path, eval: bool) -> Result<Checked, CliError> {
    let report = |src: String, diags: Vec<cvc_compiler::Diagnostic>| {
        let name = file.display().to_string();
        err!("{}", render_all(&name, &src, &diags, std::io::stderr().is_terminal()));
        CliError::Reported
    };
    let mode = if eval { Mode::Eval } else { Mode::Train };
    let checked = check_file(file, mode).map_err(|(src, d)| report(src, d))?;
    if mode == Mode::Train && checked.graph.loss.is_none() {
        return check_file(file, Mode::Eval).map_err(|(src, d)| report(src, d));
    }
    Ok(checked)
}

/// Compile options for a checked model, with activations stored as `half` (the train
/// section's precision on the CUDA back end: [`Backend::half`]).
pub fn options(c: &Checked, batch: Option<usize>, budget: Option<u64>, fuse: bool, half: Storage) -> Options {
    Options {
        batch: batch.unwrap_or(c.train.batch),
        optimizer: c.train.optimizer.clone(),
        memory_budget: budget.or(c.train.memory_budget),
        fuse,
        rnn_chunk: None,
        half,
        loss_scaling: false,
        cheap_remat: c.train.cheap_remat,
    }
}

/// Runs `cvc plan`.
pub fn run(args: &PlanArgs) -> CliResult {
    if args.batch == Some(0) {
        return Err(CliError::Message("--batch must be at least 1".into()));
    }
    let mut checked = load(&args.file, args.eval)?;
    if let Some(p) = args.precision {
        checked.train.precision = p.into();
    }
    let fuse = !args.no_fuse;
    let backend = Backend::resolve(args.device, &checked);
    if let Some(budget) = args.max_batch {
        return max_batch(&checked, budget, fuse, args.json, &backend);
    }
    let opts = options(&checked, args.batch, args.memory_budget, fuse, backend.half());
    let mut program =
        compile(checked.graph.clone(), &opts).map_err(|e| super::compile_failed(&checked, &e))?;
    program.facts.set_lines(&checked.src);
    let module = backend.generate(&program).map_err(|e| {
        CliError::Message(format!(
            "the back end {} cannot run this plan at batch {}: {}",
            backend.describe(),
            program.plan.batch,
            e.message()
        ))
    })?;
    if let Some(path) = &args.timeline {
        let svg = crate::timeline::render_svg(&program, &checked.src);
        std::fs::write(path, svg).map_err(|e| format!("cannot write `{}`: {e}", path.display()))?;
    }
    if args.json {
        let mut j = json(&program, &checked.src);
        j["backend"] = backend_json(&backend, module.as_ref(), &program);
        print_out(&format!("{}\n", serde_json::to_string_pretty(&j).expect("plan serialises")))?;
    } else {
        let text = if args.verbose {
            summary(&program, &checked.src, &checked.model)
        } else {
            brief(&program, &checked.src, &checked.model)
        };
        print_out(&text)?;
        print_out(&backend_text(&backend, module.as_ref(), &program, args.verbose))?;
    }
    if let Some(m) = budget_error(program.plan.arena_bytes as u64, opts.memory_budget) {
        return Err(CliError::Message(m));
    }
    Ok(())
}

/// The largest batch `cvc plan --max-batch` offers.
#[derive(Debug)]
pub struct LargestBatch {
    /// The batch.
    pub batch: usize,
    /// Its program.
    pub program: Program,
    /// When a larger batch fits the budget but the back end cannot run it: the batch that
    /// fits and the back end's reason (the limit, and what to do).
    pub capped: Option<(usize, String)>,
}

/// The largest batch whose plan fits `budget` (with checkpointing allowed) and whose kernels
/// `backend` can generate, by doubling then bisection over plans (both conditions only get
/// harder as the batch grows). `None` when batch 1 does not fit the budget.
pub fn largest_batch(
    c: &Checked,
    budget: u64,
    fuse: bool,
    backend: &Backend,
) -> Result<Option<LargestBatch>, CompileError> {
    // The program at `b` when it fits and runs; else why not (`Err` of the back end's
    // limit when only the back end refuses it).
    let fits = |b: usize| -> Result<Result<Program, Option<String>>, CompileError> {
        if cvc_compiler::passes::pipeline::check_size(&c.graph, b).is_err() {
            return Ok(Err(None));
        }
        let p = compile(c.graph.clone(), &options(c, Some(b), Some(budget), fuse, backend.half()))?;
        if p.plan.arena_bytes as u64 > budget {
            return Ok(Err(None));
        }
        match backend.generate(&p) {
            // The scratch memory past the arena (the sums' partials, the staged weights) must
            // fit the budget too.
            Ok(Some(m)) if m.scratch.1 > 0 && (m.scratch.0 + m.scratch.1) as u64 > budget => Ok(Err(None)),
            Ok(_) => Ok(Ok(p)),
            Err(e) if e.is_internal() => Err(e),
            Err(e) => Ok(Err(Some(e.message()))),
        }
    };
    let mut best = match fits(1)? {
        Ok(p) => p,
        Err(Some(why)) => return Err(CompileError::user(format!("even batch 1 cannot run: {why}"))),
        Err(None) => return Ok(None),
    };
    // `hi` is always refused; `why` is the back end's reason for refusing it, if it was the
    // back end (not the budget) that did.
    let (mut lo, mut hi) = (1usize, 2usize);
    let mut why = loop {
        match fits(hi)? {
            Ok(p) => {
                best = p;
                lo = hi;
                if hi >= 1 << 24 {
                    return Ok(Some(LargestBatch { batch: lo, program: best, capped: None }));
                }
                hi *= 2;
            }
            Err(why) => break why,
        }
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match fits(mid)? {
            Ok(p) => {
                best = p;
                lo = mid;
            }
            Err(w) => {
                hi = mid;
                why = w;
            }
        }
    }
    Ok(Some(LargestBatch { batch: lo, program: best, capped: why.map(|w| (hi, w)) }))
}

fn max_batch(c: &Checked, budget: u64, fuse: bool, as_json: bool, backend: &Backend) -> CliResult {
    match largest_batch(c, budget, fuse, backend).map_err(|e| super::compile_failed(c, &e))? {
        None => {
            cvc_compiler::passes::pipeline::check_size(&c.graph, 1)
                .map_err(|e| super::compile_failed(c, &e))?;
            Err(CliError::Message(format!(
                "even batch 1 needs more than {} ({} of parameters and state alone)",
                human_bytes(budget),
                human_bytes(
                    compile(c.graph.clone(), &options(c, Some(1), None, fuse, backend.half()))
                        .map(|p| p.plan.persistent_bytes as u64)
                        .unwrap_or(0)
                )
            )))
        }
        Some(LargestBatch { batch, program: p, capped }) => {
            if as_json {
                let v = serde_json::json!({
                    "budget_bytes": budget,
                    "max_batch": batch,
                    "arena_bytes": p.plan.arena_bytes,
                    "lower_bound_bytes": p.plan.lower_bound_bytes,
                    "backend": backend.describe(),
                    "recomputed_values": p.facts.recomputed.len(),
                    "rnn_chunk": p.facts.rnn_chunk,
                    "capped_by_backend": capped.as_ref().map(|(b, why)| serde_json::json!({
                        "refused_batch": b,
                        "reason": why,
                    })),
                });
                print_out(&format!("{}\n", serde_json::to_string_pretty(&v).expect("serialises")))?;
            } else {
                // The search stops doubling at 2^24: a larger batch may fit too.
                let at_least = if batch >= 1 << 24 { "at least " } else { "" };
                print_out(&format!(
                    "largest batch that fits in {}: {at_least}{batch} (arena {}, lower bound {}; back end {})\n",
                    human_bytes(budget),
                    human_bytes(p.plan.arena_bytes as u64),
                    human_bytes(p.plan.lower_bound_bytes as u64),
                    backend.describe(),
                ))?;
                if let Some((refused, why)) = &capped {
                    print_out(&format!(
                        "capped by the back end: batch {refused} fits in memory, but {why}\n"
                    ))?;
                }
                // The batch fits only with the recomputation the planner adds under this
                // budget: a run at that batch needs the same budget, or its plan is larger.
                // (Cheap recomputations are made without a budget too: only checkpoints count.)
                let recomputed =
                    p.facts.recomputed.iter().filter(|(_, why)| why.contains("checkpoint")).count();
                let how = match (recomputed, p.facts.rnn_chunk) {
                    (0, None) => None,
                    (n, None) => Some(format!("{n} values recomputed")),
                    (0, Some(k)) => Some(format!("the recurrence backward in chunks of {k} steps")),
                    (n, Some(k)) => Some(format!(
                        "{n} values recomputed and the recurrence backward in chunks of {k} steps"
                    )),
                };
                if let Some(how) = how {
                    print_out(&format!(
                        "it fits with {how}: train it with `--batch {batch} --memory-budget {}`\n",
                        human_bytes(budget).replace(' ', "")
                    ))?;
                }
            }
            Ok(())
        }
    }
}

fn kernel_label(p: &Program, gi: usize) -> String {
    let k = &p.groups[gi];
    let g = &p.graph;
    let main = k.outputs.iter().map(|&o| {
        let n = g.node(o);
        if n.origin.label.is_empty() {
            n.op.mnemonic()
        } else {
            format!("{} {}", n.op.mnemonic(), n.origin.label)
        }
    });
    main.collect::<Vec<_>>().join(", ")
}

fn kind_name(k: GroupKind) -> &'static str {
    match k {
        GroupKind::Elementwise => "elementwise",
        GroupKind::Reduce => "reduce",
        GroupKind::Contraction => "contraction",
        GroupKind::Attention => "attention",
        GroupKind::Recurrence => "recurrence",
        GroupKind::Movement => "movement",
        GroupKind::View => "view",
    }
}

/// How many layers `cvc plan` lists among the tensors alive at the peak, and how many casts.
const TOP_LAYERS: usize = 10;
const TOP_CASTS: usize = 5;

/// The plan in at most 40 lines: passes, kernel counts by kind, casts, memory, and the layers
/// holding the most bytes at the peak. [`summary`] is the full listing (`--verbose`).
pub fn brief(p: &Program, src: &str, model: &str) -> String {
    let lines = LineIndex::new(src);
    let g = &p.graph;
    let plan = &p.plan;
    let mut s = String::new();
    let mode = match g.mode {
        Mode::Train => "training step",
        Mode::Eval => "inference",
    };
    let _ = writeln!(s, "plan {model} ({mode}, batch {})", plan.batch);
    let _ = writeln!(s, "passes: {}", p.facts.passes.join(" → "));
    let mut counts = std::collections::BTreeMap::new();
    for k in p.groups.iter().filter(|k| k.kind != GroupKind::View) {
        *counts.entry(kind_name(k.kind)).or_insert(0usize) += 1;
    }
    let launched: usize = counts.values().sum();
    let views = p.groups.len() - launched;
    let per: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let per = if per.is_empty() { String::new() } else { format!(" ({})", per.join(", ")) };
    let _ = writeln!(s, "kernels: {launched}{per}, {views} views (no launch)");
    let _ = writeln!(s, "casts: {}", p.facts.casts.len());
    for c in p.facts.casts.iter().take(TOP_CASTS) {
        let _ = writeln!(s, "  line {:>3}: {}", c.line, c.what);
    }
    if p.facts.casts.len() > TOP_CASTS {
        let _ = writeln!(s, "  and {} more", p.facts.casts.len() - TOP_CASTS);
    }
    let _ = writeln!(
        s,
        "combines materialised: {}; recomputed: {} values",
        p.facts.combines_materialized,
        p.facts.recomputed.len()
    );
    if let Some(k) = p.facts.rnn_chunk {
        let _ = writeln!(s, "{}", chunk_line(k));
    }
    let _ = writeln!(s, "\nmemory (batch {}):", plan.batch);
    let _ = writeln!(s, "  arena        {:>12}  ({})", human_bytes(plan.arena_bytes as u64), plan.heuristic);
    if p.graph.half.is_half() {
        let _ = writeln!(
            s,
            "  at the peak  {}  (activations stored in {}: docs/PRECISION.md)",
            bytes_by_dtype(p),
            p.graph.half.name()
        );
    }
    let _ = writeln!(
        s,
        "  lower bound  {:>12}  (fragmentation {:.2}%)",
        human_bytes(plan.lower_bound_bytes as u64),
        plan.fragmentation_pct()
    );
    let _ = writeln!(
        s,
        "  persistent   {:>12}  (parameters {}, and state)",
        human_bytes(plan.persistent_bytes as u64),
        human_bytes(plan.param_bytes as u64)
    );
    let layers = peak_layers(p, &lines);
    let total: usize = layers.iter().map(|l| l.bytes).sum();
    let _ = writeln!(
        s,
        "\npeak at step {} of {}: {} in {} tensors; by layer:",
        plan.peak_step,
        plan.steps,
        human_bytes(total as u64),
        plan.live_at_peak.len()
    );
    for l in layers.iter().take(TOP_LAYERS) {
        let at = if l.line > 0 { format!("line {:>3}", l.line) } else { "        ".into() };
        let _ = writeln!(
            s,
            "  {:>12}  {at}  {:<28} {} × {}",
            human_bytes(l.bytes as u64),
            l.layer,
            l.tensors,
            l.kinds.join(", ")
        );
    }
    if layers.len() > TOP_LAYERS {
        let rest: usize = layers[TOP_LAYERS..].iter().map(|l| l.bytes).sum();
        let _ = writeln!(s, "  and {} more layers ({})", layers.len() - TOP_LAYERS, human_bytes(rest as u64));
    }
    let _ = writeln!(s, "\n(--verbose lists every kernel, recomputed value and tensor; --json for tools)");
    s
}

/// The tensors alive at the peak of one layer (one `.cvnn` line and label).
struct PeakLayer {
    layer: String,
    line: usize,
    bytes: usize,
    tensors: usize,
    /// What the tensors hold (`forward activation`, `gradient`, ...), distinct, in order met.
    kinds: Vec<&'static str>,
}

/// The bytes alive at the peak per stored dtype, largest first: `cbf16 40.0 MiB, f32 1.2 MiB`.
pub fn bytes_by_dtype(p: &Program) -> String {
    let g = &p.graph;
    let mut sums: Vec<(&'static str, usize)> = Vec::new();
    for &v in &p.plan.live_at_peak {
        let b = g.bytes(v, p.plan.batch);
        match sums.iter_mut().find(|(n, _)| *n == g.stored_name(v)) {
            Some((_, s)) => *s += b,
            None => sums.push((g.stored_name(v), b)),
        }
    }
    sums.sort_by_key(|&(n, b)| (std::cmp::Reverse(b), n));
    sums.iter().map(|(n, b)| format!("{n} {}", human_bytes(*b as u64))).collect::<Vec<_>>().join(", ")
}

/// The values alive at the peak grouped by layer, largest first.
fn peak_layers(p: &Program, lines: &LineIndex) -> Vec<PeakLayer> {
    let g = &p.graph;
    let plan = &p.plan;
    let mut out: Vec<PeakLayer> = Vec::new();
    let mut live = plan.live_at_peak.clone();
    live.sort_by_key(|&v| std::cmp::Reverse(g.bytes(v, plan.batch)));
    for v in live {
        let n = g.node(v);
        let layer = if n.origin.label.is_empty() { n.op.mnemonic() } else { n.origin.label.clone() };
        let line = line_of(g, v, lines);
        let bytes = g.bytes(v, plan.batch);
        let kind = BufferKind::of(p, v).name();
        match out.iter_mut().find(|l| l.layer == layer && l.line == line) {
            Some(l) => {
                l.bytes += bytes;
                l.tensors += 1;
                if !l.kinds.contains(&kind) {
                    l.kinds.push(kind);
                }
            }
            None => out.push(PeakLayer { layer, line, bytes, tensors: 1, kinds: vec![kind] }),
        }
    }
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.line.cmp(&b.line)).then(a.layer.cmp(&b.layer)));
    out
}

/// The human-readable plan in full (`--verbose`): every kernel and tensor.
pub fn summary(p: &Program, src: &str, model: &str) -> String {
    let lines = LineIndex::new(src);
    let g = &p.graph;
    let plan = &p.plan;
    let mut s = String::new();
    let mode = match g.mode {
        Mode::Train => "training step",
        Mode::Eval => "inference",
    };
    let _ = writeln!(s, "plan {model} ({mode}, batch {})", plan.batch);
    let _ = writeln!(s, "passes: {}", p.facts.passes.join(" → "));
    let mut counts = std::collections::BTreeMap::new();
    for k in &p.groups {
        *counts.entry(kind_name(k.kind)).or_insert(0usize) += 1;
    }
    let per: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    if per.is_empty() {
        let _ = writeln!(s, "\nkernels: 0");
    } else {
        let _ = writeln!(s, "\nkernels: {} ({})", p.groups.len(), per.join(", "));
    }
    for (step, &gi) in p.order.iter().enumerate() {
        let k = &p.groups[gi];
        if k.kind == GroupKind::View {
            continue;
        }
        let line = k.outputs.first().map_or(0, |&o| line_of(g, o, &lines));
        let _ = writeln!(
            s,
            "  {step:>4}  {:<11} {:>3} ops  {:<22} {}{}",
            kind_name(k.kind),
            k.nodes.len(),
            k.domain.to_string(),
            kernel_label(p, gi),
            if line > 0 { format!("  @{line}") } else { String::new() }
        );
    }
    let _ = writeln!(s, "\ncasts: {}", p.facts.casts.len());
    for c in &p.facts.casts {
        let _ = writeln!(s, "  line {:>3}: {}", c.line, c.what);
    }
    let _ = writeln!(s, "combines materialised: {}", p.facts.combines_materialized);
    let _ = writeln!(s, "recomputed: {} values", p.facts.recomputed.len());
    if let Some(k) = p.facts.rnn_chunk {
        let _ = writeln!(s, "{}", chunk_line(k));
    }
    // One line per source layer: which values it recomputes instead of storing.
    let mut by_layer: Vec<(String, usize, Vec<String>)> = Vec::new();
    for (v, why) in &p.facts.recomputed {
        let n = g.node(*v);
        let key = (n.origin.label.clone(), line_of(g, *v, &lines));
        let item = if why.contains("checkpoint") {
            format!("{} (checkpoint)", n.op.mnemonic())
        } else {
            n.op.mnemonic()
        };
        match by_layer.iter_mut().find(|(l, ln, _)| (l, *ln) == (&key.0, key.1)) {
            Some((_, _, items)) => items.push(item),
            None => by_layer.push((key.0, key.1, vec![item])),
        }
    }
    for (label, line, items) in by_layer {
        let at = if line > 0 { format!(" @{line}") } else { String::new() };
        let mut counts: Vec<(String, usize)> = Vec::new();
        for it in &items {
            match counts.iter_mut().find(|(m, _)| m == it) {
                Some((_, c)) => *c += 1,
                None => counts.push((it.clone(), 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let list: Vec<String> =
            counts.iter().map(|(m, c)| if *c > 1 { format!("{m} ×{c}") } else { m.clone() }).collect();
        let _ = writeln!(s, "  {label}{at}: {} ({})", items.len(), list.join(", "));
    }
    let _ = writeln!(s, "\nmemory (batch {}):", plan.batch);
    let _ = writeln!(
        s,
        "  arena        {:>12}  ({} bytes, {})",
        human_bytes(plan.arena_bytes as u64),
        plan.arena_bytes,
        plan.heuristic
    );
    let _ = writeln!(
        s,
        "  lower bound  {:>12}  ({} bytes)",
        human_bytes(plan.lower_bound_bytes as u64),
        plan.lower_bound_bytes
    );
    let _ = writeln!(s, "  fragmentation {:.2}%", plan.fragmentation_pct());
    let _ = writeln!(s, "  parameters   {:>12}", human_bytes(plan.param_bytes as u64));
    let _ = writeln!(
        s,
        "  persistent   {:>12}  (parameters and state)",
        human_bytes(plan.persistent_bytes as u64)
    );
    for (name, bytes) in &plan.candidates {
        let _ = writeln!(s, "  heuristic {name}: {}", human_bytes(*bytes as u64));
    }
    let _ = writeln!(s, "\npeak at step {} of {}; alive there:", plan.peak_step, plan.steps);
    let mut live: Vec<Value> = plan.live_at_peak.clone();
    live.sort_by_key(|&v| std::cmp::Reverse(g.bytes(v, plan.batch)));
    for v in live {
        let n = g.node(v);
        let line = line_of(g, v, &lines);
        let _ = writeln!(
            s,
            "  {:>12}  {:<18} {:<16} {}{}",
            human_bytes(g.bytes(v, plan.batch) as u64),
            BufferKind::of(p, v).name(),
            format!("{}{}", g.stored_name(v), n.ty.shape),
            if n.origin.label.is_empty() { n.op.mnemonic() } else { n.origin.label.clone() },
            if line > 0 { format!("  @{line}") } else { String::new() }
        );
    }
    s
}

/// The plan as JSON (keys documented in `cvc plan --help`'s module doc).
pub fn json(p: &Program, src: &str) -> serde_json::Value {
    let lines = LineIndex::new(src);
    let g = &p.graph;
    let plan = &p.plan;
    let value_bytes = |v: Value| match plan.slots.get(v.index()) {
        Some(Some(slot)) => slot.bytes,
        _ => g.ty(v).bytes(plan.batch),
    };
    let kernels: Vec<serde_json::Value> = p
        .order
        .iter()
        .map(|&gi| {
            let k = &p.groups[gi];
            serde_json::json!({
                // The group's index: the back ends name its kernels after it (`k30_attn` on
                // CUDA), so a profile's lines can be matched with these entries.
                "group": gi,
                "kind": kind_name(k.kind),
                "nodes": k.nodes.len(),
                "domain": k.domain.to_string(),
                "inputs": k.inputs.iter().map(|i| i.index()).collect::<Vec<_>>(),
                "outputs": k.outputs.iter().map(|o| o.index()).collect::<Vec<_>>(),
                // What the launch moves through memory (at the plan's storage widths): the
                // traffic that fusion and recomputation trade against arena bytes.
                "read_bytes": k.inputs.iter().map(|&i| value_bytes(i)).sum::<usize>(),
                "written_bytes": k.outputs.iter().map(|&o| value_bytes(o)).sum::<usize>(),
                "label": kernel_label(p, gi),
            })
        })
        .collect();
    let casts: Vec<serde_json::Value> =
        p.facts.casts.iter().map(|c| serde_json::json!({"line": c.line, "what": c.what})).collect();
    let recomputed: Vec<serde_json::Value> = p
        .facts
        .recomputed
        .iter()
        .map(|(v, why)| serde_json::json!({"value": v.index(), "line": line_of(g, *v, &lines), "why": why}))
        .collect();
    let live: Vec<serde_json::Value> = plan
        .live_at_peak
        .iter()
        .map(|&v| {
            serde_json::json!({
                "value": v.index(),
                "bytes": g.bytes(v, plan.batch),
                "dtype": g.stored_name(v),
                "kind": BufferKind::of(p, v).name(),
                "label": g.node(v).origin.label,
                "line": line_of(g, v, &lines),
            })
        })
        .collect();
    serde_json::json!({
        "model": g.name,
        "mode": format!("{:?}", g.mode).to_lowercase(),
        "batch": plan.batch,
        "passes": p.facts.passes,
        "arena_bytes": plan.arena_bytes,
        "lower_bound_bytes": plan.lower_bound_bytes,
        "param_bytes": plan.param_bytes,
        "persistent_bytes": plan.persistent_bytes,
        "fragmentation_pct": plan.fragmentation_pct(),
        "heuristic": plan.heuristic,
        "kernels": kernels,
        "kernel_count": p.groups.len(),
        "casts": casts,
        "combines_materialized": p.facts.combines_materialized,
        "recomputed": recomputed,
        "rnn_chunk": p.facts.rnn_chunk,
        "peak_step": plan.peak_step,
        "steps": plan.steps,
        "live_at_peak": live,
    })
}

/// The report line of chunked back-propagation through time in chunks of `k` steps.
fn chunk_line(k: usize) -> String {
    format!("recurrence backward in chunks of {k} steps (states recomputed from checkpoints)")
}

/// The CUDA kernels of a plan by index type: `(launches, 64-bit launches)` and the 64-bit
/// ones as `(kernel name, group label, largest extent)`.
fn wide_kernels(module: &CudaModule, p: &Program) -> (usize, Vec<(String, String, usize)>) {
    let mut launches = 0;
    let mut wide = Vec::new();
    for step in &module.steps {
        if let CudaStep::Launch(l) = step {
            launches += 1;
            if l.index.width == IndexWidth::U64 {
                wide.push((l.name.clone(), kernel_label(p, l.group), l.index.largest));
            }
        }
    }
    (launches, wide)
}

/// The back end's part of the plan: for CUDA, how many kernels index with 64 bits (and
/// with `verbose`, which, with the extent that makes them).
fn backend_text(backend: &Backend, module: Option<&CudaModule>, p: &Program, verbose: bool) -> String {
    let Some(module) = module else {
        return format!("\nback end: {} (usize indices)\n", backend.describe());
    };
    let (launches, wide) = wide_kernels(module, p);
    let mut s = format!(
        "\nback end: {}: {launches} launches, {} with 64-bit indices, {} with 32-bit\n",
        backend.describe(),
        wide.len(),
        launches - wide.len()
    );
    if verbose {
        for (name, label, largest) in &wide {
            let _ = writeln!(s, "  {name:<12} 64-bit  largest extent {largest:>14}  {label}");
        }
    } else if let Some(max) = wide.iter().map(|w| w.2).max() {
        let _ = writeln!(s, "  (largest extent {max}; --verbose lists the 64-bit kernels)");
    }
    s
}

/// The back end's part of the JSON plan: its name and, for CUDA, every launch's kernel,
/// group, index bits and largest extent.
fn backend_json(backend: &Backend, module: Option<&CudaModule>, p: &Program) -> serde_json::Value {
    let kernels: Vec<serde_json::Value> = module
        .map(|m| {
            m.steps
                .iter()
                .filter_map(|s| match s {
                    CudaStep::Launch(l) => Some(serde_json::json!({
                        "name": l.name,
                        "group": l.group,
                        "label": kernel_label(p, l.group),
                        "index_bits": l.index.width.bits(),
                        "largest_extent": l.index.largest,
                    })),
                    CudaStep::Zero { .. } => None,
                })
                .collect()
        })
        .unwrap_or_default();
    serde_json::json!({ "name": backend.describe(), "kernels": kernels })
}
