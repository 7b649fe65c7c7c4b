//! Pass snapshots: for every fixture in `fixtures/ok/`, one insta snapshot holding the IR
//! after each pass that changes it, the kernel partition in schedule order, and the plan
//! summary with exact sizes at batch 4 (a training step when the model has a loss).

use cvc_compiler::front::check_source;
use cvc_compiler::ir::print::print_graph;
use cvc_compiler::ir::Mode;
use cvc_compiler::passes::pipeline::{compile_traced, Options};
use cvc_runtime::cli::plan::summary;
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

/// The snapshot text of one fixture.
fn passes_text(path: &Path) -> String {
    let name = path.file_name().expect("file name").to_string_lossy().to_string();
    let src = std::fs::read_to_string(path).expect("fixture reads");
    let mut checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    if checked.graph.loss.is_none() {
        checked = check_source(&name, &src, Mode::Eval).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    }
    let opts =
        Options { batch: 4, optimizer: checked.train.optimizer.clone(), memory_budget: None, fuse: true };
    let mut out = String::new();
    let mut last = String::new();
    let mut program = compile_traced(checked.graph.clone(), &opts, &mut |pass, g| {
        let ir = print_graph(g, Some(&src));
        if ir == last {
            let _ = writeln!(out, "=== after {pass}: IR unchanged\n");
        } else {
            let _ = writeln!(out, "=== after {pass}\n{ir}");
            last = ir;
        }
    })
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    program.facts.set_lines(&src);
    let _ = writeln!(out, "=== kernel groups (schedule order)");
    for (step, &gi) in program.order.iter().enumerate() {
        let k = &program.groups[gi];
        let list =
            |vs: &[cvc_compiler::ir::Value]| vs.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" ");
        let _ = writeln!(
            out,
            "{step:>3} {:?} {} nodes=[{}] in=[{}] out=[{}]",
            k.kind,
            k.domain,
            list(&k.nodes),
            list(&k.inputs),
            list(&k.outputs)
        );
    }
    let _ = writeln!(out, "\n=== plan\n{}", summary(&program, &src, &checked.model));
    out
}

#[test]
fn ir_after_each_pass_and_plan() {
    let files = fixtures();
    assert!(!files.is_empty(), "no fixtures in fixtures/ok");
    for path in files {
        let name = path.file_name().expect("file name").to_string_lossy().to_string();
        let text = passes_text(&path);
        insta::with_settings!({ snapshot_suffix => name.clone(), prepend_module_to_snapshot => false, omit_expression => true }, {
            insta::assert_snapshot!("passes", text);
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

#[test]
fn byte_counts_parse_in_binary_and_decimal_units() {
    use cvc_runtime::cli::plan::parse_bytes;
    assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
    assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
    assert_eq!(parse_bytes("1.5 GiB"), Ok(3 << 29));
    assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
    assert_eq!(parse_bytes("1_000"), Ok(1000));
    for bad in ["", "GiB", "4XB", "-1GiB", "0", "1e999GB"] {
        assert!(parse_bytes(bad).is_err(), "{bad:?} parsed");
    }
}

/// The JSON plan carries the documented keys, consistent with the program it describes.
#[test]
fn plan_json_has_the_documented_keys() {
    let c = seed_cnn();
    let opts = cvc_runtime::cli::plan::options(&c, Some(8), None, true);
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
    let opts = cvc_runtime::cli::plan::options(&c, Some(6), None, true);
    let budget =
        cvc_compiler::passes::pipeline::compile(c.graph.clone(), &opts).expect("compiles").plan.arena_bytes
            as u64;
    let (batch, p) =
        cvc_runtime::cli::plan::largest_batch(&c, budget, true).expect("plans").expect("batch 1 fits");
    assert!(batch >= 6, "batch {batch}");
    assert!(p.plan.arena_bytes as u64 <= budget);
    let next = cvc_runtime::cli::plan::options(&c, Some(batch + 1), Some(budget), true);
    let over = cvc_compiler::passes::pipeline::compile(c.graph.clone(), &next).expect("compiles");
    assert!(over.plan.arena_bytes as u64 > budget, "batch {} also fits", batch + 1);
}

/// The timeline draws one rectangle per stored value, a legend and the peak.
#[test]
fn timeline_draws_every_buffer() {
    let c = seed_cnn();
    let opts = cvc_runtime::cli::plan::options(&c, Some(4), None, true);
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
