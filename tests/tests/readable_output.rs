//! Readable output (issue 16): the `cvc plan` summary fits a screen, `cvc fmt` formats every
//! example and fixture to text with the same AST and IR, and `cvc report` renders in a real
//! headless browser. One test binary for the three, so CI links it once.

use cvc_compiler::front::check_source;
use cvc_compiler::ir::Mode;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The `cvc` binary of this test's profile, built once per run (as in `cli_check.rs`);
/// `CVC_BIN` overrides the path.
fn cvc() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("CVC_BIN") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
        let bin = profile_dir.join(format!("cvc{}", std::env::consts::EXE_SUFFIX));
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(root()).args(["build", "-p", "cvc-runtime", "--bin", "cvc"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        assert!(cmd.status().expect("run cargo build").success(), "building cvc failed");
        bin
    })
}

fn run(args: &[&str]) -> Output {
    Command::new(cvc()).current_dir(root()).args(args).output().expect("cvc runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn cvnn_files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .expect("folder exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cvnn"))
        .collect();
    v.sort();
    v
}

fn examples() -> Vec<PathBuf> {
    cvnn_files("examples")
}

// ------------------------------------------------------------------------------- cvc plan

/// The default plan of every example fits a screen and still names the essentials; the
/// verbose plan lists every launched kernel.
#[test]
fn plan_summary_fits_a_screen() {
    for f in examples() {
        let path = f.to_str().expect("utf-8 path");
        let out = run(&["plan", path]);
        assert!(out.status.success(), "{path}: {}", stderr(&out));
        let text = stdout(&out);
        let n = text.lines().count();
        assert!(n <= 40, "{path}: the summary has {n} lines:\n{text}");
        for needle in ["passes:", "kernels:", "casts:", "arena", "lower bound", "fragmentation", "peak at step"] {
            assert!(text.contains(needle), "{path}: no `{needle}` in\n{text}");
        }
        let json: serde_json::Value =
            serde_json::from_str(&stdout(&run(&["plan", "--json", path]))).expect("--json is JSON");
        // Every layer line of the summary has bytes and a `.cvnn` line that exist in the plan.
        let launched = json["kernels"].as_array().expect("kernels").iter().filter(|k| k["kind"] != "view").count();
        assert!(text.contains(&format!("kernels: {launched} (")), "{path}: kernel count differs from --json");
        let verbose = stdout(&run(&["plan", "--verbose", path]));
        let kernel_lines = verbose
            .lines()
            .filter(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 3 && w[0].parse::<usize>().is_ok() && w[2].parse::<usize>().is_ok() && w[3] == "ops"
            })
            .count();
        assert_eq!(kernel_lines, launched, "{path}: --verbose does not list every kernel:\n{verbose}");
    }
}

/// The layers listed at the peak are the largest, with their bytes summed from the JSON
/// plan's tensors, and the remainder adds up to the rest.
#[test]
fn plan_summary_groups_the_peak_by_layer() {
    let path = "examples/complex_resnet.cvnn";
    let text = stdout(&run(&["plan", path]));
    let json: serde_json::Value = serde_json::from_str(&stdout(&run(&["plan", "--json", path]))).expect("json");
    let mut by_layer: Vec<((String, u64), u64)> = Vec::new();
    for t in json["live_at_peak"].as_array().expect("live") {
        let key = (t["label"].as_str().expect("label").to_string(), t["line"].as_u64().expect("line"));
        let b = t["bytes"].as_u64().expect("bytes");
        match by_layer.iter_mut().find(|(k, _)| *k == key) {
            Some((_, s)) => *s += b,
            None => by_layer.push((key, b)),
        }
    }
    by_layer.sort_by(|a, b| b.1.cmp(&a.1));
    let listed: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("peak at step")).skip(1).collect();
    let largest = &by_layer[0];
    let first = listed[0];
    assert!(
        first.contains(&largest.0 .0) && first.contains(&format!("line {:>3}", largest.0 .1)),
        "largest layer {largest:?} is not first: {first}"
    );
    let more = listed.iter().find(|l| l.trim_start().starts_with("and ")).expect("an `and K more` line");
    let k: usize = more.split_whitespace().nth(1).expect("count").parse().expect("number");
    assert_eq!(k, by_layer.len() - 10, "{more}");
}

// -------------------------------------------------------------------------------- cvc fmt

/// The AST of `src` as JSON without byte spans (formatting moves them).
fn ast_without_spans(src: &str) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            // A span is a `span` field, or a `{start, end}` object inside a tuple.
            serde_json::Value::Object(m) if m.len() == 2 && m.contains_key("start") && m.contains_key("end") => {
                *v = serde_json::Value::Null;
            }
            serde_json::Value::Object(m) => {
                m.retain(|k, _| k != "span");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(cvc_grammar::parse(src).expect("parses")).expect("AST serialises");
    strip(&mut v);
    v
}

/// The comments of a source in order, found by a scan of its own (strings may hold `#`).
fn comments(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in src.lines() {
        let mut in_string = false;
        let mut escaped = false;
        for (i, c) in line.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_string => escaped = true,
                '"' => in_string = !in_string,
                '#' if !in_string => {
                    out.push(line[i..].trim_end().to_string());
                    break;
                }
                _ => {}
            }
        }
    }
    out
}

/// The lowered IR of a model that checks (training step, or inference without a loss).
fn lowered_ir(src: &str) -> Option<String> {
    let c = check_source("m.cvnn", src, Mode::Train).ok()?;
    let c = if c.graph.loss.is_none() { check_source("m.cvnn", src, Mode::Eval).ok()? } else { c };
    Some(cvc_compiler::ir::print::print_graph(&c.graph, None))
}

/// Every example and every fixture that parses formats to text with the same AST (and the
/// same lowered IR when it checks), the same comments in the same order, and formatting is
/// idempotent.
#[test]
fn fmt_keeps_meaning_and_comments_of_every_example_and_fixture() {
    let mut files = examples();
    files.extend(cvnn_files("tests/fixtures/ok"));
    files.extend(cvnn_files("tests/fixtures/err"));
    let (mut formatted, mut checked) = (0, 0);
    for f in &files {
        let Ok(src) = std::fs::read_to_string(f) else { continue };
        if cvc_grammar::parse(&src).is_err() {
            assert!(cvc_grammar::format_source(&src).is_err(), "{}: formats but does not parse", f.display());
            continue;
        }
        let out = cvc_grammar::format_source(&src).unwrap_or_else(|e| panic!("{}: {}", f.display(), e.message));
        let name = f.display();
        assert_eq!(ast_without_spans(&src), ast_without_spans(&out), "{name}: the AST changed:\n{out}");
        assert_eq!(comments(&src), comments(&out), "{name}: comments changed:\n{out}");
        assert_eq!(cvc_grammar::format_source(&out).expect("formats"), out, "{name}: not idempotent");
        assert!(out.lines().all(|l| l == l.trim_end()), "{name}: trailing whitespace:\n{out}");
        if let Some(ir) = lowered_ir(&src) {
            assert_eq!(Some(ir), lowered_ir(&out), "{name}: the lowered IR changed");
            checked += 1;
        }
        formatted += 1;
    }
    assert!(formatted >= 40 && checked >= 15, "only {formatted} files formatted, {checked} checked");
}

/// A messy file comes out in the documented canonical style (the expectation is written by
/// hand from the style in `grammar/src/fmt.rs`).
#[test]
fn fmt_writes_the_canonical_style() {
    let messy = "\n\n# header comment\nmodel   M{input x :c64[B,4]\n  input label:class[B]  of 3   # labels\n\
block u( c ,k ){conv1d(c,kernel=k)\nbatchnorm\n  crelu}\nh = x|>u(4,3)\n   |> abs   # magnitude\n      |>linear( 3 ) |> real\n\n\n\n\
  # before output\noutput h\nloss cross_entropy( h , label )\n    # closing comment\n}\n\
train M{data=synthetic.rf(classes=3,snr_db=5..20, name=\"a#b\") # data\r\nbatch=8\noptimizer = adam(lr=-1e-3)   # negative\n}";
    let expected = "# header comment
model M {
    input x:     c64[B, 4]
    input label: class[B] of 3  # labels
    block u(c, k) { conv1d(c, kernel = k)
        batchnorm
        crelu }
    h = x |> u(4, 3)
        |> abs  # magnitude
        |> linear(3) |> real

    # before output
    output h
    loss cross_entropy(h, label)
    # closing comment
}

train M {
    data      = synthetic.rf(classes = 3, snr_db = 5..20, name = \"a#b\")  # data
    batch     = 8
    optimizer = adam(lr = -1e-3)  # negative
}
";
    let out = cvc_grammar::format_source(messy).expect("formats");
    assert_eq!(out, expected, "got:\n{out}");
    assert_eq!(cvc_grammar::format_source(&out).expect("formats"), out);
    // Comments ending consecutive lines share a column.
    let two = "model M {\n    input x: c64[B, 4]  # a\n    y = x |> crelu # b\n    output y\n}\n";
    let out = cvc_grammar::format_source(two).expect("formats");
    assert!(out.contains("input x: c64[B, 4]  # a\n    y = x |> crelu      # b\n"), "{out}");
}

/// The examples are formatted (so `cvc fmt --check examples/` passes in CI).
#[test]
fn fmt_check_passes_on_the_examples() {
    let out = run(&["fmt", "--check", "examples/"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(stdout(&out), "");
}

/// `--check` lists what would change and exits 1 without writing; without it the file is
/// rewritten; a file that does not parse is an error with its line and column, and the
/// other files are still formatted.
#[test]
fn fmt_check_and_write_on_the_command_line() {
    let dir = std::env::temp_dir().join(format!("cvc-fmt-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let messy = dir.join("messy.cvnn");
    let bad = dir.join("bad.cvnn");
    let src = "model M { input x: c64[B, 4]\n y = x|>crelu\n output y }\n";
    std::fs::write(&messy, src).expect("write");
    std::fs::write(&bad, "model M {\n    y = x -> crelu\n}\n").expect("write");
    let m = messy.to_str().expect("utf-8");
    let out = run(&["fmt", "--check", m]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("would reformat {m}\n"));
    assert_eq!(std::fs::read_to_string(&messy).expect("read"), src, "--check wrote the file");
    let out = run(&["fmt", bad.to_str().expect("utf-8"), m]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("bad.cvnn:2:"), "{}", stderr(&out));
    let formatted = std::fs::read_to_string(&messy).expect("read");
    assert_eq!(formatted, "model M {\n    input x: c64[B, 4]\n    y = x |> crelu\n    output y\n}\n");
    let out = run(&["fmt", "--check", m]);
    assert!(out.status.success(), "{}", stderr(&out));
    let leftovers: Vec<_> = std::fs::read_dir(&dir).expect("dir").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(leftovers.len(), 2, "temporary files left: {leftovers:?}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}
