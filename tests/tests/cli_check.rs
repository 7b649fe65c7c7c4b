//! `cvc check` as a user runs it: the built binary, its exit codes (0 ok, 1 user error,
//! never 101), its table and JSON on stdout and its diagnostics on stderr, snapshotted with
//! the workspace path replaced by `[ROOT]`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The `cvc` binary of this test's profile: `target/<profile>/cvc`, next to the `deps/`
/// folder holding this test. `CARGO_BIN_EXE_cvc` exists only inside the runtime crate, so
/// the binary is (re)built here once per run, which is a no-op when it is up to date and
/// keeps a stale binary from being tested. `CVC_BIN` overrides the path.
fn cvc() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("CVC_BIN") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
        let bin = profile_dir.join(format!("cvc{}", std::env::consts::EXE_SUFFIX));
        {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.current_dir(root()).args(["build", "-p", "cvc-runtime", "--bin", "cvc"]);
            if profile_dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("run cargo build");
            assert!(status.success(), "building cvc failed");
        }
        assert!(bin.exists(), "cvc binary not found at {}; build it with `cargo build`", bin.display());
        bin
    })
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(cvc()).current_dir(root()).args(args).output().expect("run cvc");
    assert_ne!(
        out.status.code(),
        Some(101),
        "cvc panicked on {args:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace(&root().display().to_string(), "[ROOT]")
}

fn cvnn(dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cvnn"))
        .map(|p| format!("{dir}/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    v.sort();
    v
}

#[test]
fn every_example_and_ok_fixture_exits_0() {
    let mut files = cvnn("examples");
    files.extend(cvnn("tests/fixtures/ok"));
    for f in files {
        let out = run(&["check", &f]);
        assert_eq!(out.status.code(), Some(0), "{f}:\n{}", text(&out.stderr));
        // Only the fixture made to have a head that reaches no loss gets a warning.
        let warns = f.ends_with("unused_head.cvnn");
        assert_eq!(!out.stderr.is_empty(), warns, "{f}: stderr {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("parameters:"), "{f}: no totals");
    }
}

#[test]
fn every_err_fixture_exits_1_with_a_located_diagnostic() {
    for f in cvnn("tests/fixtures/err") {
        let out = run(&["check", &f]);
        assert_eq!(out.status.code(), Some(1), "{f}: expected exit 1");
        assert!(out.stdout.is_empty(), "{f}: printed a table despite errors");
        let err = text(&out.stderr);
        let name = f.rsplit('/').next().unwrap();
        let located = err.contains(&format!("{f}:")) || name.starts_with("empty");
        assert!(located, "{f}: no file:line:col in\n{err}");
        assert!(!err.contains('\u{1b}'), "{f}: colour codes while stderr is not a terminal");
    }
}

#[test]
fn table_snapshot() {
    // Fixtures, not examples, so that tuning an example does not churn this snapshot.
    let out = run(&["check", "tests/fixtures/ok/rf_classifier.cvnn"]);
    assert_eq!(out.status.code(), Some(0));
    insta::assert_snapshot!("check_rf_classifier_stdout", text(&out.stdout));
}

#[test]
fn json_snapshot_and_totals() {
    let out = run(&["check", "tests/fixtures/ok/seed_cnn.cvnn", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    // Totals equal the sum of the layer rows, and 2 reals per complex parameter at least.
    let layers = v["layers"].as_array().unwrap();
    let sum = |k: &str| layers.iter().map(|l| l[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(v["totals"]["params_complex"].as_u64().unwrap(), sum("params_complex"));
    assert_eq!(v["totals"]["params_real"].as_u64().unwrap(), sum("params_real"));
    assert_eq!(v["totals"]["param_bytes"].as_u64().unwrap(), 4 * sum("params_real"));
    assert_eq!(v["outputs"][0]["shape"], serde_json::json!(["B", 10]));
    insta::assert_snapshot!("check_seed_cnn_json", stdout);
}

#[test]
fn error_snapshot() {
    let out = run(&["check", "tests/fixtures/err/block_arity.cvnn"]);
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!("check_block_arity_stderr", text(&out.stderr));
}

#[test]
fn missing_file_and_directory_are_user_errors() {
    let out = run(&["check", "tests/fixtures/no_such_file.cvnn"]);
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!("check_missing_file_stderr", text(&out.stderr));
    let out = run(&["check", "tests/fixtures"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read"));
}

#[test]
fn usage_errors_exit_1() {
    let out = run(&["check"]);
    assert_eq!(out.status.code(), Some(1));
    let out = run(&["check", "examples/seed_cnn.cvnn", "--jsn"]);
    assert_eq!(out.status.code(), Some(1));
}

/// A batch whose byte counts overflow `usize` (or pass 1 PiB) is a user error naming
/// `--batch`, for `plan` and every `emit` target, in training and inference.
#[test]
fn huge_batch_is_a_user_error() {
    let file = "tests/fixtures/ok/l1_real_linear.cvnn";
    for batch in ["18446744073709551615", "99999999999999"] {
        for args in [
            vec!["plan", "--batch", batch, file],
            vec!["plan", "--eval", "--json", "--batch", batch, file],
            vec!["emit", "--ir", "--batch", batch, file],
            vec!["emit", "--clif", "--batch", batch, file],
            vec!["emit", "--cuda", "--eval", "--batch", batch, file],
        ] {
            let out = run(&args);
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            let err = text(&out.stderr);
            assert!(
                err.contains(&format!("at batch {batch}")) && err.contains("lower --batch"),
                "{args:?}: {err}"
            );
        }
    }
    // A budget far beyond any plan stops the search instead of overflowing.
    let out = run(&["plan", "--max-batch", "1000TiB", file]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("largest batch that fits in 1000.0 TiB: at least "));
}

/// A binary file is a located "not UTF-8" error whose snippet holds no control bytes.
#[test]
fn binary_file_prints_no_control_bytes() {
    let dir = std::env::temp_dir().join(format!("cvc-binary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("garbage.cvnn");
    std::fs::write(&file, b"\x1a\x1b[2J\x07ab\xff\xfe\x00\x1b]0;x\x07").unwrap();
    let out = run(&["check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("is not UTF-8 text (byte 8 is 0xff)"), "{err}");
    assert!(!err.chars().any(|c| c.is_control() && c != '\n'), "control bytes in: {err:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A model whose weights alone pass 1 PiB checks, but `plan`, `emit` and `plan --max-batch`
/// say the layers are too large (not "lower --batch", and not "0 B of parameters").
#[test]
fn model_too_large_at_batch_1_is_a_user_error() {
    let dir = std::env::temp_dir().join(format!("cvc-huge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("huge.cvnn");
    std::fs::write(
        &file,
        "model M {\n    input x: c64[B, 16777216]\n    y = x |> linear(16777216)\n    output y\n}\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    assert_eq!(run(&["check", f]).status.code(), Some(0));
    for args in [vec!["plan", f], vec!["plan", "--max-batch", "1TiB", f], vec!["emit", "--cuda", f]] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains("even at batch 1") && err.contains("c64[16777216, 16777216]"),
            "{args:?}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `emit --ir --after autodiff` on an inference compile says why the pass did not run.
#[test]
fn emit_after_a_training_pass_in_inference_says_why() {
    let out = run(&["emit", "--ir", "--after", "autodiff", "--eval", "examples/seed_cnn.cvnn"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--eval compiles inference only"));
    let out = run(&["emit", "--ir", "--after", "optimizer", "tests/fixtures/ok/shape_ops.cvnn"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("declares no `loss`"), "{}", text(&out.stderr));
    let out = run(&["emit", "--ir", "--after", "bogus", "examples/seed_cnn.cvnn"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("unknown pass `bogus`; the passes are: lower, cast"));
}

/// An endless device is refused without being read (it is not a regular file), and an
/// oversized file after 16 MiB, not read until memory runs out.
#[test]
fn endless_or_oversized_input_is_refused() {
    if std::path::Path::new("/dev/zero").exists() {
        for cmd in ["check", "plan"] {
            let out = run(&[cmd, "/dev/zero"]);
            assert_eq!(out.status.code(), Some(1));
            let err = text(&out.stderr);
            assert!(err.contains("cannot read `/dev/zero`: it is not a regular file but a device"), "{err}");
        }
    }
    // A sparse file of 17 MiB: regular, but over the source limit.
    let big = std::env::temp_dir().join(format!("cvc-oversized-{}.cvnn", std::process::id()));
    std::fs::File::create(&big).unwrap().set_len(17 << 20).unwrap();
    let shown = big.display().to_string();
    for cmd in ["check", "plan"] {
        let out = run(&[cmd, &shown]);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(err.contains(&format!("cannot read `{shown}`: it is larger than 16 MiB")), "{err}");
    }
    let _ = std::fs::remove_file(&big);
}

/// `--max-batch` searches the batch itself, so `--batch`, `--memory-budget` and
/// `--timeline` beside it are usage errors rather than silently ignored.
#[test]
fn max_batch_conflicts_are_usage_errors() {
    let e = "examples/seed_cnn.cvnn";
    for other in [["--batch", "3"], ["--memory-budget", "1GiB"], ["--timeline", "t.svg"]] {
        let out = run(&["plan", "--max-batch", "1GiB", other[0], other[1], e]);
        assert_eq!(out.status.code(), Some(1), "{other:?}");
        assert!(text(&out.stderr).contains("cannot be used with"), "{other:?}");
    }
}

/// Byte counts in exponent notation, zero, or past 16 EiB are refused with the reason.
#[test]
fn bad_byte_counts_say_why() {
    let e = "examples/seed_cnn.cvnn";
    for (flag, value, why) in [
        ("--memory-budget", "1e99GiB", "exponents are not accepted"),
        ("--memory-budget", "0", "at least 1 byte"),
        ("--max-batch", "99999999999999999999GiB", "below 16 EiB"),
        ("--max-batch", "junk", "is not a byte size"),
    ] {
        let out = run(&["plan", flag, value, e]);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}");
        assert!(text(&out.stderr).contains(why), "{flag} {value}: {}", text(&out.stderr));
    }
}

/// `plan --max-batch --device cuda` offers only a batch the CUDA back end can generate: a
/// linear layer of 2²⁴ outputs has 2¹⁸ column tiles of 64, and one row of tiles per 64
/// samples; past 65535 rows (the grid's limit along y) the grid is folded into x, where
/// 2¹⁸ · 65536 blocks pass the 2³¹ − 1 a CUDA grid holds. Plan only, nothing allocated: the
/// CUDA search is capped at 65535 · 64 samples and says why; the CPU back end, with no such
/// limit, offers a larger batch for the same budget; and the plan at the capped batch lists
/// 64-bit kernels, while one sample more is refused.
#[test]
fn max_batch_is_capped_by_the_cuda_back_end_and_says_why() {
    let dir = std::env::temp_dir().join(format!("cvc-capped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("wide.cvnn");
    std::fs::write(
        &file,
        "model W {\n    input x: c64[B, 1]\n    y = x |> linear(16777216, bias = false)\n    output y\n}\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let batch_of = |out: &Output| -> usize {
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        v["max_batch"].as_u64().expect("max_batch") as usize
    };
    let cuda = run(&["plan", "--max-batch", "1000TiB", "--device", "cuda", "--eval", "--json", f]);
    assert_eq!(cuda.status.code(), Some(0), "{}", text(&cuda.stderr));
    let v: serde_json::Value = serde_json::from_slice(&cuda.stdout).expect("JSON");
    let capped = &v["capped_by_backend"];
    let why = capped["reason"].as_str().unwrap_or_default();
    assert!(why.contains("2147483647") && why.contains("lower the batch"), "{v}");
    let batch = batch_of(&cuda);
    assert_eq!(capped["refused_batch"].as_u64(), Some(batch as u64 + 1), "{v}");
    assert_eq!(batch, 65535 * 64, "{v}");
    let human = run(&["plan", "--max-batch", "1000TiB", "--device", "cuda", "--eval", f]);
    let out = text(&human.stdout);
    assert!(out.contains(&format!(": {batch} (")) && out.contains("capped by the back end: batch"), "{out}");
    let cpu = run(&["plan", "--max-batch", "1000TiB", "--device", "cpu", "--eval", "--json", f]);
    assert_eq!(cpu.status.code(), Some(0), "{}", text(&cpu.stderr));
    assert!(batch_of(&cpu) > batch, "the CPU back end has no grid limit");
    let at = batch.to_string();
    let plan = run(&["plan", "--batch", &at, "--device", "cuda", "--eval", f]);
    assert_eq!(plan.status.code(), Some(0), "{}", text(&plan.stderr));
    assert!(text(&plan.stdout).contains("with 64-bit indices"), "{}", text(&plan.stdout));
    let over = (batch + 1).to_string();
    let refused = run(&["plan", "--batch", &over, "--device", "cuda", "--eval", f]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stderr).contains("cannot run this plan"), "{}", text(&refused.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--max-batch` says when its batch fits only with recomputation, and the flags it suggests
/// plan that batch within the budget (without the budget the same batch plans larger).
#[test]
fn max_batch_suggests_the_budget_its_batch_needs() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed_cnn.cvnn");
    let out = run(&["plan", "--max-batch", "256MiB", "--device", "cpu", file]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    let line = stdout.lines().find(|l| l.contains("values recomputed")).unwrap_or_else(|| panic!("{stdout}"));
    let flags: Vec<&str> = line.split('`').nth(1).expect("a quoted command").split_whitespace().collect();
    assert_eq!(flags[0], "--batch");
    assert_eq!(flags[2], "--memory-budget");
    let arena = |args: &[&str]| -> f64 {
        let out = run(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out.stderr));
        let s = text(&out.stdout);
        let l = s.lines().find(|l| l.trim_start().starts_with("arena")).unwrap_or_else(|| panic!("{s}"));
        let v: Vec<&str> = l.split_whitespace().collect();
        let n: f64 = v[1].parse().expect("a number");
        n * match v[2] {
            "KiB" => 1024.0,
            "MiB" => 1024.0 * 1024.0,
            "GiB" => 1024.0 * 1024.0 * 1024.0,
            u => panic!("unit {u}"),
        }
    };
    let budgeted = arena(&["plan", "--device", "cpu", flags[0], flags[1], flags[2], flags[3], file]);
    let plain = arena(&["plan", "--device", "cpu", flags[0], flags[1], file]);
    assert!(budgeted <= 256.0 * 1024.0 * 1024.0, "{budgeted} bytes over the 256 MiB budget");
    assert!(plain > budgeted, "without the budget the plan is not larger: {plain} vs {budgeted}");
}

/// `plan --precision bf16 --device cuda` plans 16-bit activations (the stored dtypes are
/// listed, and the arena shrinks); the CPU plan of the same flags stays full width; a
/// precision that does not exist is exit code 1 naming the choices.
#[test]
fn plan_precision_bf16_on_cuda_stores_activations_in_16_bits() {
    let e = "examples/seed_cnn.cvnn";
    let arena = |out: &Output| -> u64 {
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        v["arena_bytes"].as_u64().expect("arena_bytes")
    };
    let full = run(&["plan", "--device", "cuda", "--json", e]);
    let half = run(&["plan", "--device", "cuda", "--precision", "bf16", "--json", e]);
    let cpu = run(&["plan", "--device", "cpu", "--precision", "bf16", "--json", e]);
    for o in [&full, &half, &cpu] {
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    }
    let (f, h, c) = (arena(&full), arena(&half), arena(&cpu));
    assert!((h as f64) < 0.6 * f as f64, "bf16 arena {h} vs fp32 {f}");
    assert_eq!(c, f, "the CPU computes and stores in f32");
    let v: serde_json::Value = serde_json::from_slice(&half.stdout).expect("JSON");
    let dtypes: Vec<&str> =
        v["live_at_peak"].as_array().expect("live").iter().filter_map(|b| b["dtype"].as_str()).collect();
    assert!(dtypes.contains(&"cbf16") && dtypes.contains(&"c64"), "{dtypes:?}");
    let human = run(&["plan", "--device", "cuda", "--precision", "bf16", e]);
    assert!(text(&human.stdout).contains("activations stored in bf16"), "{}", text(&human.stdout));
    let bad = run(&["plan", "--precision", "fp8", e]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("bf16"), "{}", text(&bad.stderr));
}

/// The train section's `recompute` reaches the planner: the U-Net's plan with `recompute =
/// budget` keeps every value the backward pass reads and is larger than the default
/// (`auto`), whose verbose plan lists the recomputed values; a policy that does not exist is
/// exit code 1 naming the file, line and column.
#[test]
fn recompute_policy_of_the_train_section_reaches_the_planner() {
    let src = std::fs::read_to_string(root().join("examples/polsar_unet.cvnn")).expect("example");
    let dir = std::env::temp_dir().join(format!("cvc-recompute-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let with = |policy: &str| {
        let f = dir.join(format!("unet_{policy}.cvnn"));
        let text =
            src.replacen("    seed      = 1\n", &format!("    seed      = 1\n    recompute = {policy}\n"), 1);
        assert!(text.contains("recompute"), "the example's train section changed");
        std::fs::write(&f, text).expect("write");
        f.display().to_string()
    };
    let arena = |f: &str| -> u64 {
        let out = run(&["plan", "--device", "cpu", "--json", "--batch", "8", f]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        v["arena_bytes"].as_u64().expect("arena_bytes")
    };
    let (auto, budget) = (arena(&with("auto")), arena(&with("budget")));
    assert!((auto as f64) < 0.9 * budget as f64, "auto {auto} vs budget {budget}");
    let verbose = run(&["plan", "--device", "cpu", "--batch", "8", "-v", &with("auto")]);
    assert!(text(&verbose.stdout).contains("recompute(e1/crelu)"), "{}", text(&verbose.stdout));
    let bad = run(&["plan", &with("never")]);
    assert_eq!(bad.status.code(), Some(1));
    let err = text(&bad.stderr);
    assert!(err.contains("unknown recompute policy `never`") && err.contains("unet_never.cvnn:47:"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
