//! Pass filetests (Cranelift's model): every `filetests/<pass>/*.ir` holds a header, a small
//! hand-written input graph and, after `; expected:`, what the pass must make of it (the IR
//! after the pass and the facts it reports). `CVC_BLESS=1 cargo test -p cvc-compiler --test
//! filetests` rewrites the expectations with what the passes now produce (review the diff).
//!
//! Header lines (before the graph), all optional but `pass`:
//! - `; pass: NAME` — the pass to run (see [`run_pass`]);
//! - `; batch: N` — the batch size for the passes that plan (default 4);
//! - `; grads: %P -> %G, ...` — parameter/gradient pairs (optimizer, and kept gradients);
//! - `; optimizer: sgd|adam|adamw key=value ...` — `lr`, `momentum`, `nesterov`, `beta1`,
//!   `beta2`, `eps`, `weight_decay`;
//! - `; memory_budget: SIZE` — the remat budget.
//!
//! Other `;` lines are comments: say which behaviour the case pins down.
//!
//! A second test reads back the IR of every fixture after every pass: printing, parsing and
//! printing again must give the same text.

use cvc_compiler::config::{Optimizer, OptimizerKind};
use cvc_compiler::front::check_source;
use cvc_compiler::ir::parse::parse_graph;
use cvc_compiler::ir::print::print_graph;
use cvc_compiler::ir::{Graph, Mode, Value};
use cvc_compiler::passes::fusion::{self, Fusion};
use cvc_compiler::passes::pipeline::{compile_traced, Options};
use cvc_compiler::passes::{
    autodiff, cast, distribute, memplan, optimizer, remat, schedule, siblings, views, PipelineFacts,
};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What the header of a filetest asks for.
#[derive(Default)]
struct Header {
    pass: String,
    batch: usize,
    grads: Vec<(Value, Value)>,
    optimizer: Optimizer,
    memory_budget: Option<u64>,
}

const EXPECTED: &str = "; expected:";

fn filetests() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let mut out = Vec::new();
    let mut dirs = vec![root];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "ir") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Parses `; key: value` header lines; `%N` names refer to the input's written numbers.
fn header(text: &str, ids: &std::collections::HashMap<usize, Value>) -> Result<Header, String> {
    let mut h = Header { batch: 4, ..Header::default() };
    let value = |s: &str| -> Result<Value, String> {
        let n: usize =
            s.trim().strip_prefix('%').and_then(|n| n.parse().ok()).ok_or(format!("`{s}` is not a %N"))?;
        ids.get(&n).copied().ok_or(format!("%{n} is not in the input graph"))
    };
    for line in text.lines().take_while(|l| !l.trim_start().starts_with("graph")) {
        let Some((key, val)) = line.trim().strip_prefix(';').and_then(|l| l.split_once(':')) else {
            continue;
        };
        let val = val.trim();
        match key.trim() {
            "pass" => h.pass = val.to_string(),
            "batch" => h.batch = val.parse().map_err(|_| format!("batch `{val}`"))?,
            "memory_budget" => {
                h.memory_budget = Some(cvc_compiler::units::parse_bytes(val).map_err(|e| e.to_string())?)
            }
            "grads" => {
                for pair in val.split(',') {
                    let (p, g) = pair.split_once("->").ok_or(format!("grads: `{pair}` is not `%P -> %G`"))?;
                    h.grads.push((value(p)?, value(g)?));
                }
            }
            "optimizer" => h.optimizer = optimizer_of(val)?,
            _ => {}
        }
    }
    if h.pass.is_empty() {
        return Err("no `; pass: NAME` header".into());
    }
    Ok(h)
}

fn optimizer_of(text: &str) -> Result<Optimizer, String> {
    let mut words = text.split_whitespace();
    let mut opt = Optimizer::default();
    let (mut b1, mut b2, mut eps, mut momentum, mut nesterov) = (0.9, 0.999, 1e-8, 0.0, false);
    let kind = words.next().unwrap_or("sgd");
    for kv in words {
        let (k, v) = kv.split_once('=').ok_or(format!("optimizer: `{kv}` is not key=value"))?;
        let num = || v.parse::<f64>().map_err(|_| format!("optimizer: `{v}` is not a number"));
        match k {
            "lr" => opt.lr = num()?,
            "weight_decay" => opt.weight_decay = num()?,
            "momentum" => momentum = num()?,
            "nesterov" => nesterov = v == "true",
            "beta1" => b1 = num()?,
            "beta2" => b2 = num()?,
            "eps" => eps = num()?,
            _ => return Err(format!("optimizer: unknown key `{k}`")),
        }
    }
    opt.kind = match kind {
        "sgd" => OptimizerKind::Sgd { momentum, nesterov },
        "adam" => OptimizerKind::Adam { beta1: b1, beta2: b2, eps },
        "adamw" => OptimizerKind::AdamW { beta1: b1, beta2: b2, eps },
        k => return Err(format!("optimizer: unknown kind `{k}`")),
    };
    Ok(opt)
}

fn list(vs: &[Value]) -> String {
    vs.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" ")
}

/// The kernel groups of `f`, in `order` when given (else in fusion order).
fn groups_text(f: &Fusion, order: Option<&[usize]>) -> String {
    let all: Vec<usize> = (0..f.groups.len()).collect();
    let mut s = String::new();
    for &gi in order.unwrap_or(&all) {
        let k = &f.groups[gi];
        let _ = writeln!(
            s,
            "  g{gi} {:?} {} nodes=[{}] in=[{}] out=[{}]",
            k.kind,
            k.domain,
            list(&k.nodes),
            list(&k.inputs),
            list(&k.outputs)
        );
    }
    if !f.recomputed.is_empty() {
        let _ = writeln!(s, "  recomputed: {}", list(&f.recomputed));
    }
    s
}

/// Runs one pass (with the passes it needs before it) on `g`, as the pipeline runs it, and
/// returns the text the filetest compares: the IR after the pass and the facts it reports.
/// The one place that knows how each pass is called, so a pipeline change is one edit here.
fn run_pass(h: &Header, mut g: Graph, src: &str) -> Result<String, String> {
    let ir = |g: &Graph| print_graph(g, Some(src));
    let keep: Vec<Value> = h.grads.iter().map(|&(_, d)| d).collect();
    let mut out = String::new();
    match h.pass.as_str() {
        "cast" => {
            let casts = cast::run(&mut g)?;
            out += &ir(&g);
            let _ = writeln!(out, "casts:");
            for c in casts {
                let at = c.value.map_or_else(|| "-".to_string(), |v| v.to_string());
                let _ = writeln!(out, "  {at}: {}", c.what);
            }
        }
        "autodiff" => {
            let facts = autodiff::run(&mut g)?;
            out += &ir(&g);
            let pairs: Vec<String> = facts.grads.iter().map(|(p, d)| format!("{p} -> {d}")).collect();
            let _ = writeln!(out, "grads: {}", pairs.join(", "));
        }
        "optimizer" => {
            optimizer::run(&mut g, &h.grads, &h.optimizer)?;
            out += &ir(&g);
        }
        "distribute" => {
            distribute::run(&mut g, &keep)?;
            out += &ir(&g);
        }
        "views" => {
            views::run(&mut g, &keep)?;
            out += &ir(&g);
        }
        "fusion" => {
            let f = fusion::fuse_keeping(&g, &keep);
            let _ = writeln!(out, "groups:\n{}", groups_text(&f, None));
        }
        "schedule" => {
            let f = fusion::fuse_keeping(&g, &keep);
            let order = schedule::run(&g, &f, h.batch)?;
            let _ = writeln!(out, "order:\n{}", groups_text(&f, Some(&order)));
        }
        "siblings" => {
            // The sibling step alone, on the fusion order (a valid schedule) as its input.
            let f = fusion::fuse_keeping(&g, &keep);
            let deps = schedule::dependencies(&g, &f);
            let order = (0..f.groups.len()).collect();
            let order = siblings::gather(&g, &f, h.batch, &deps, &vec![false; f.groups.len()], order);
            schedule::validate(&g, &f, &order)?;
            let _ = writeln!(out, "order:\n{}", groups_text(&f, Some(&order)));
        }
        "remat" => {
            let mut f = fusion::fuse_keeping(&g, &keep);
            let mut order = schedule::run(&g, &f, h.batch)?;
            let before = memplan::plan_keeping(&g, &f, &order, h.batch, &keep).arena_bytes;
            let opts = Options {
                batch: h.batch,
                optimizer: h.optimizer.clone(),
                memory_budget: h.memory_budget,
                fuse: true,
                rnn_chunk: None,
                ..Options::default()
            };
            let mut facts = PipelineFacts { grads: h.grads.clone(), ..PipelineFacts::default() };
            // `remat` and the re-plan steps after it (`remat.fusion`, `remat.schedule`,
            // `remat.siblings`), as the pipeline runs them when a checkpoint was placed.
            let checkpoints = remat::run(&mut g, &f, &order, &opts, &mut facts)?;
            let keep: Vec<Value> = facts.grads.iter().map(|&(_, d)| d).collect();
            if let Some(c) = checkpoints {
                f = fusion::partition(&g, true, &keep);
                let deferred = schedule::groups_writing(&f, &c);
                order = schedule::order_with(&g, &f, h.batch, &deferred)?;
                order = siblings::run(&g, &f, h.batch, &deferred, order)?;
            }
            let after = memplan::plan_keeping(&g, &f, &order, h.batch, &keep).arena_bytes;
            out += &ir(&g);
            let _ = writeln!(out, "arena: {before} -> {after} bytes");
            for (v, why) in &facts.recomputed {
                let _ = writeln!(out, "recomputed {v}: {why}");
            }
            let _ = writeln!(out, "order:\n{}", groups_text(&f, Some(&order)));
        }
        "memplan" => {
            let f = fusion::fuse_keeping(&g, &keep);
            let order = schedule::run(&g, &f, h.batch)?;
            let plan = memplan::plan_keeping(&g, &f, &order, h.batch, &keep);
            let _ = writeln!(out, "order:\n{}", groups_text(&f, Some(&order)));
            let _ = writeln!(
                out,
                "arena {} bytes, lower bound {}, persistent {}, peak at step {} of {}",
                plan.arena_bytes, plan.lower_bound_bytes, plan.persistent_bytes, plan.peak_step, plan.steps
            );
            let _ = writeln!(out, "live at peak: {}", list(&plan.live_at_peak));
            for (v, slot) in g.nodes.handles().zip(&plan.slots) {
                if let Some(s) = slot {
                    let _ = writeln!(out, "  {v} @{} +{}", s.offset, s.bytes);
                }
            }
        }
        p => return Err(format!("unknown pass `{p}`")),
    }
    Ok(out)
}

/// Runs one filetest; `Err` holds the report of a failure.
fn check_file(path: &Path, bless: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (input, expected) = match text.split_once(&format!("\n{EXPECTED}\n")) {
        Some((i, e)) => (i.to_string() + "\n", e.to_string()),
        None => (text.clone(), String::new()),
    };
    let parsed = parse_graph(&input).map_err(|e| format!("input:{e}"))?;
    let h = header(&input, &parsed.ids)?;
    let got =
        run_pass(&h, parsed.graph, &parsed.source).map_err(|e| format!("pass {} failed: {e}", h.pass))?;
    if got == expected {
        return Ok(());
    }
    if bless {
        let new = format!("{}{EXPECTED}\n{got}", input);
        return std::fs::write(path, new).map_err(|e| e.to_string());
    }
    Err(format!("--- expected\n{expected}--- got\n{got}"))
}

#[test]
fn pass_filetests() {
    let bless = std::env::var("CVC_BLESS").is_ok_and(|v| v == "1");
    let files = filetests();
    assert!(files.len() >= 20, "only {} filetests", files.len());
    let mut failures = Vec::new();
    for f in &files {
        if let Err(e) = check_file(f, bless) {
            failures.push(format!("=== {}\n{e}", f.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} filetests failed (CVC_BLESS=1 rewrites expectations; review the diff):\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

/// Every step named in the pipeline has filetests. The re-plan steps after a checkpoint
/// (`remat.fusion`, `remat.schedule`, `remat.siblings`) run in the `remat` filetests, which
/// follow the pipeline's whole checkpoint sequence.
#[test]
fn every_pass_has_filetests() {
    let files = filetests();
    for pass in
        cvc_compiler::passes::pipeline::PASSES.iter().filter(|p| **p != "lower" && !p.starts_with("remat."))
    {
        let n = files
            .iter()
            .filter(|f| f.parent().and_then(|d| d.file_name()).is_some_and(|d| d == *pass))
            .count();
        assert!(n >= 2, "pass {pass} has {n} filetests");
    }
}

/// print ∘ parse ∘ print = print on the IR of every fixture after every pass.
#[test]
fn printed_ir_of_every_fixture_reads_back() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/ok");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cvnn"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for path in files {
        let name = path.file_name().expect("name").to_string_lossy().to_string();
        let src = std::fs::read_to_string(&path).expect("reads");
        {
            let mut checked =
                check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
            if checked.graph.loss.is_none() {
                checked = check_source(&name, &src, Mode::Eval).unwrap_or_else(|d| panic!("{name}: {d:?}"));
            }
            let mode = checked.graph.mode;
            let opts = Options {
                batch: 2,
                optimizer: checked.train.optimizer.clone(),
                memory_budget: None,
                fuse: true,
                rnn_chunk: None,
                ..Options::default()
            };
            let mut failures = Vec::new();
            compile_traced(checked.graph.clone(), &opts, &mut |pass, g| {
                let printed = print_graph(g, Some(&src));
                match parse_graph(&printed) {
                    Ok(p) => {
                        if print_graph(&p.graph, Some(&p.source)) != printed {
                            failures.push(format!("{pass}: reprinted text differs"));
                        }
                    }
                    Err(e) => failures.push(format!("{pass}: {e}")),
                }
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(failures.is_empty(), "{name} ({mode:?}): {failures:?}");
        }
    }
}
