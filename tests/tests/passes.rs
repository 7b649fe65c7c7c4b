//! Pass snapshots: for every fixture in `fixtures/ok/`, one insta snapshot of what the passes
//! decided, in a form a reviewer reads whole: the kernel partition in schedule order, the
//! casts, and the memory plan in summary, at batch 4 (a training step when the model has a
//! loss). What each pass does to the IR is pinned by `compiler/tests/filetests/`.

use cvc_compiler::front::check_source;
use cvc_compiler::ir::{Mode, Value};
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_grammar::LineIndex;
use cvc_runtime::buffers::{line_of, BufferKind};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ok");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixture dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cvnn"))
        .collect();
    v.sort();
    v
}

/// Compiles one fixture at batch 4 (a training step when the model has a loss).
fn compiled(path: &Path) -> (String, cvc_compiler::passes::Program) {
    let name = path.file_name().expect("file name").to_string_lossy().to_string();
    let src = std::fs::read_to_string(path).expect("fixture reads");
    let mut checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    if checked.graph.loss.is_none() {
        checked = check_source(&name, &src, Mode::Eval).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    }
    let opts = Options {
        batch: 4,
        optimizer: checked.train.optimizer.clone(),
        memory_budget: None,
        fuse: true,
        rnn_chunk: None,
        ..Options::default()
    };
    let mut program = compile(checked.graph.clone(), &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    program.facts.set_lines(&src);
    (src, program)
}

/// The ops of a kernel, each mnemonic once in first-use order with its count (`mul×3`), so a
/// fused kernel of fifty nodes stays one readable line.
fn ops_text(g: &cvc_compiler::ir::Graph, nodes: &[Value]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for &v in nodes {
        let m = g.node(v).op.mnemonic();
        match counts.iter_mut().find(|(n, _)| *n == m) {
            Some((_, c)) => *c += 1,
            None => counts.push((m, 1)),
        }
    }
    let items: Vec<String> =
        counts.into_iter().map(|(m, c)| if c > 1 { format!("{m}×{c}") } else { m }).collect();
    items.join(" ")
}

/// The snapshot text of one fixture: what a reviewer reads to see what the passes decided.
/// The kernel partition (one line per kernel in schedule order: kind, domain, the ops it
/// computes, the source line of its first output), the casts placed or folded, and the memory
/// plan in summary (arena against the lower bound, buffer count, the largest buffers alive at
/// the peak with their lines). The IR itself is tested pass by pass in the compiler's filetests.
fn passes_text(path: &Path) -> String {
    let (src, p) = compiled(path);
    let lines = LineIndex::new(&src);
    let g = &p.graph;
    let at = |v: Value| match line_of(g, v, &lines) {
        0 => String::new(),
        l => format!("  @{l}"),
    };
    let mut out = String::new();
    let mode = if g.mode == Mode::Train { "training step" } else { "inference" };
    let _ = writeln!(out, "{} ({mode}, batch {})", g.name, p.plan.batch);
    let _ = writeln!(out, "\nkernels: {} in schedule order", p.order.len());
    for (step, &gi) in p.order.iter().enumerate() {
        let k = &p.groups[gi];
        let _ = writeln!(
            out,
            "  {step:>3} {:<11} {:<18} {}{}",
            format!("{:?}", k.kind).to_lowercase(),
            k.domain.to_string(),
            ops_text(g, &k.nodes),
            k.outputs.first().map_or(String::new(), |&o| at(o))
        );
    }
    let _ = writeln!(out, "\ncasts: {}", p.facts.casts.len());
    for c in &p.facts.casts {
        let _ = writeln!(out, "  line {:>3}: {}", c.line, c.what);
    }
    let _ = writeln!(out, "combines materialised: {}", p.facts.combines_materialized);
    let _ = writeln!(out, "recomputed: {} values", p.facts.recomputed.len());
    let plan = &p.plan;
    let _ = writeln!(out, "\nmemory (batch {}):", plan.batch);
    let _ = writeln!(out, "  arena        {:>10} bytes ({})", plan.arena_bytes, plan.heuristic);
    let _ = writeln!(out, "  lower bound  {:>10} bytes", plan.lower_bound_bytes);
    let _ = writeln!(out, "  persistent   {:>10} bytes", plan.persistent_bytes);
    let _ = writeln!(out, "  buffers      {:>10}", plan.buffers.len());
    let mut live = plan.live_at_peak.clone();
    live.sort_by_key(|&v| (std::cmp::Reverse(g.ty(v).bytes(plan.batch)), v));
    const SHOWN: usize = 8;
    let _ = writeln!(
        out,
        "  peak at step {} of {}: {} buffers alive; the {} largest:",
        plan.peak_step,
        plan.steps,
        live.len(),
        live.len().min(SHOWN)
    );
    for &v in live.iter().take(SHOWN) {
        let n = g.node(v);
        let _ = writeln!(
            out,
            "    {:>9} B  {:<18} {:<16} {}{}",
            n.ty.bytes(plan.batch),
            BufferKind::of(&p, v).name(),
            n.ty.to_string(),
            if n.origin.label.is_empty() { n.op.mnemonic() } else { n.origin.label.clone() },
            at(v)
        );
    }
    out
}

#[test]
fn kernels_casts_and_memory_per_fixture() {
    let files = fixtures();
    assert!(!files.is_empty(), "no fixtures in fixtures/ok");
    for path in files {
        let name = path.file_name().expect("file name").to_string_lossy().to_string();
        let text = passes_text(&path);
        insta::with_settings!({ omit_expression => true }, {
            insta::assert_snapshot!(name.as_str(), text);
        });
    }
}

/// The same program compiled twice plans identically (snapshots depend on it).
#[test]
fn planning_is_deterministic() {
    for path in fixtures() {
        assert_eq!(passes_text(&path), passes_text(&path), "{}", path.display());
    }
}

fn seed_cnn() -> cvc_compiler::front::Checked {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/seed_cnn.cvnn");
    let src = std::fs::read_to_string(&path).expect("example reads");
    check_source("seed_cnn.cvnn", &src, Mode::Train).expect("checks")
}

/// Memory budgets on the command line read sizes with the compiler's one parser, and refuse 0.
#[test]
fn memory_budgets_parse_with_the_shared_byte_parser() {
    use cvc_runtime::cli::plan::parse_budget;
    assert_eq!(parse_budget("4GiB"), Ok(4 << 30));
    assert_eq!(parse_budget("4g"), Ok(4 << 30));
    assert_eq!(parse_budget("1.5 GiB"), Ok(3 << 29));
    assert_eq!(parse_budget("2GB"), Ok(2_000_000_000));
    assert_eq!(parse_budget("1_000"), Ok(1000));
    for bad in ["", "GiB", "4XB", "-1GiB", "0", "1e999GB", "99999999999TiB"] {
        assert!(parse_budget(bad).is_err(), "{bad:?} parsed");
    }
}

/// The JSON plan carries the documented keys, consistent with the program it describes.
#[test]
fn plan_json_has_the_documented_keys() {
    let c = seed_cnn();
    let opts = cvc_runtime::cli::plan::options(&c, Some(8), None, true, Default::default());
    let mut p = cvc_compiler::passes::pipeline::compile(c.graph.clone(), &opts).expect("compiles");
    p.facts.set_lines(&c.src);
    let j = cvc_runtime::cli::plan::json(&p, &c.src);
    for key in [
        "batch",
        "arena_bytes",
        "lower_bound_bytes",
        "param_bytes",
        "kernels",
        "casts",
        "combines_materialized",
        "recomputed",
        "peak_step",
        "fragmentation_pct",
    ] {
        assert!(j.get(key).is_some(), "missing key {key}");
    }
    assert_eq!(j["batch"], 8);
    assert_eq!(j["kernels"].as_array().expect("list").len(), p.groups.len());
    assert!(j["arena_bytes"].as_u64() >= j["lower_bound_bytes"].as_u64());
    assert_eq!(j["combines_materialized"], 0);
    // Every value alive at the peak points at a line of the source.
    for t in j["live_at_peak"].as_array().expect("list") {
        let label = t["label"].as_str().unwrap_or("");
        if !label.starts_with("optimizer.") {
            assert!(t["line"].as_u64().unwrap_or(0) > 0, "{t}");
        }
    }
}

/// `--max-batch`: the batch found fits the budget and the next one does not.
#[test]
fn largest_batch_is_the_last_that_fits() {
    let c = seed_cnn();
    let opts = cvc_runtime::cli::plan::options(&c, Some(6), None, true, Default::default());
    let budget =
        cvc_compiler::passes::pipeline::compile(c.graph.clone(), &opts).expect("compiles").plan.arena_bytes
            as u64;
    let cvc_runtime::cli::plan::LargestBatch { batch, program: p, capped } =
        cvc_runtime::cli::plan::largest_batch(&c, budget, true, &cvc_runtime::cli::plan::Backend::Cpu)
            .expect("plans")
            .expect("batch 1 fits");
    assert_eq!(capped, None, "the CPU back end has no limit besides memory");
    assert!(batch >= 6, "batch {batch}");
    assert!(p.plan.arena_bytes as u64 <= budget);
    let next = cvc_runtime::cli::plan::options(&c, Some(batch + 1), Some(budget), true, Default::default());
    let over = cvc_compiler::passes::pipeline::compile(c.graph.clone(), &next).expect("compiles");
    assert!(over.plan.arena_bytes as u64 > budget, "batch {} also fits", batch + 1);
}

/// The timeline draws one rectangle per stored value, a legend and the peak.
#[test]
fn timeline_draws_every_buffer() {
    let c = seed_cnn();
    let opts = cvc_runtime::cli::plan::options(&c, Some(4), None, true, Default::default());
    let p = cvc_compiler::passes::pipeline::compile(c.graph.clone(), &opts).expect("compiles");
    let svg = cvc_runtime::timeline::render_svg(&p, &c.src);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let stored: usize = p.plan.buffers.iter().map(|b| b.interval.values.len()).sum();
    assert_eq!(svg.matches("<title>").count(), stored);
    for word in
        ["parameter", "gradient", "optimizer state", "forward activation", "backward temporary", "peak (step"]
    {
        assert!(svg.contains(word), "no {word}");
    }
}

/// The plans of `precision = bf16` (activations, their gradients and the saved forward
/// values in 16 bits) against fp32's, for every example and fixture at the GPU tests' batch:
/// never more than 1 KiB larger, and at the seed network's benchmark batch (1024) at most
/// 0.55 of the fp32 arena (issue 13's target; 0.51 measured on the H200). The 1 KiB covers
/// toy plans where f32 parameters, optimizer state and 256-byte alignment dominate and the
/// cheap recomputation that shrinks the fp32 plan finds no trial that shrinks the 16-bit one:
/// `norms.cvnn` at batch 4 plans 12,800 bytes in bf16 against 12,288 in fp32 (2026-12-03).
#[test]
fn bf16_plans_are_no_larger_than_fp32_plans() {
    use cvc_compiler::config::Precision;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("examples"))
        .expect("examples dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cvnn"))
        .collect();
    files.sort();
    files.extend(fixtures());
    let arena = |path: &Path, batch: usize, precision: Precision| {
        let name = path.display().to_string();
        let src = std::fs::read_to_string(path).expect("readable .cvnn");
        let mut checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        if checked.graph.loss.is_none() {
            checked = check_source(&name, &src, Mode::Eval).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        }
        let opts = Options {
            batch,
            optimizer: checked.train.optimizer.clone(),
            half: precision.storage(),
            ..Options::default()
        };
        compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}")).plan.arena_bytes
    };
    let mut grew = Vec::new();
    for path in &files {
        let p = path.to_string_lossy();
        let batch = if p.contains("seed_cnn") {
            3
        } else if p.contains("complex_resnet") {
            2
        } else {
            4
        };
        let (full, half) = (arena(path, batch, Precision::Fp32), arena(path, batch, Precision::Bf16));
        if half > full + 1024 {
            grew.push(format!("{p}: bf16 {half} bytes, fp32 {full}"));
        }
    }
    assert!(grew.is_empty(), "bf16 plans more than 1 KiB larger than fp32's:\n{}", grew.join("\n"));
    let seed = root.join("examples/seed_cnn.cvnn");
    let (full, half) = (arena(&seed, 1024, Precision::Fp32), arena(&seed, 1024, Precision::Bf16));
    assert!(
        half as f64 <= 0.55 * full as f64,
        "seed network at batch 1024: bf16 arena {half} bytes is {:.3} of fp32's {full}",
        half as f64 / full as f64
    );
}
