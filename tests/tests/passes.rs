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
