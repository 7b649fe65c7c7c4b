//! The `cvc train`, `run`, `eval` and `data` commands as a user runs them: a tiny model
//! trained for one epoch on the CPU in a temporary folder, the files they write, and exit
//! code 1 with a clear message for bad flags, data and weights.
//!
//! (This lives in the runtime crate, not in `tests/`, because Cargo builds a binary for and
//! exposes `CARGO_BIN_EXE_cvc` to integration tests of the binary's own package only.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TINY: &str = "model Tiny {
    input x: c64[B, 8]
    input label: class[B] of 3
    logits = x |> linear(8) |> crelu |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}
train Tiny {
    data      = synthetic.random(count = 64, seed = 1)
    split     = 0.75
    batch     = 8
    epochs    = 1
    optimizer = sgd(lr = 0.05, momentum = 0.9)
    seed      = 2
}
";

const RF: &str = "model Rf {
    input iq:    c64[B, 1, 32]
    input label: class[B] of 3
    logits = iq |> conv1d(4, kernel = 3, pad = 1) |> modrelu |> global_avgpool |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}
train Rf {
    data      = synthetic.rf(classes = 3, length = 32, snr_db = 10..20, count = 48, seed = 7)
    split     = 0.75
    batch     = 12
    epochs    = 1
    optimizer = adam(lr = 1e-2)
    seed      = 1
}
";

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cvc-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cvc(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cvc")).current_dir(dir).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn train_one_epoch_on_the_cpu_writes_metrics_and_checkpoints() {
    let dir = tmp("train");
    std::fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cpu", "--out", "run"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("planned arena") && out.contains("lower bound") && out.contains("measured peak"),
        "{out}"
    );
    assert!(out.contains("alive at the peak") && out.contains("line "), "{out}");
    let metrics = std::fs::read_to_string(dir.join("run/metrics.jsonl")).unwrap();
    let lines: Vec<&str> = metrics.lines().collect();
    assert_eq!(lines.len(), 1);
    let m: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(m["epoch"], 1);
    for key in ["train_loss", "val_loss", "val_acc", "step_ms", "planned_arena_bytes", "measured_peak_bytes"]
    {
        let v = m[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {m}"));
        assert!(v.is_finite() && v >= 0.0, "{key} = {v}");
    }
    assert!(m["planned_arena_bytes"].as_u64().unwrap() > 0);
    assert!(dir.join("run/last.safetensors").exists() && dir.join("run/best.safetensors").exists());
    // Default output folder: runs/<model>.
    let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cpu", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(dir.join("runs/Tiny/metrics.jsonl").exists());
}

#[test]
fn bad_flags_and_inputs_exit_with_1_and_say_why() {
    let dir = tmp("flags");
    std::fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    std::fs::write(
        dir.join("npz.cvnn"),
        TINY.replace("synthetic.random(count = 64, seed = 1)", "npz(\"missing.npz\")"),
    )
    .unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["train", "tiny.cvnn", "--epochs", "0"], "epochs"),
        (vec!["train", "tiny.cvnn", "--device", "gpu"], "gpu"),
        (vec!["train", "tiny.cvnn", "--batch", "many"], "many"),
        (vec!["train", "tiny.cvnn", "--memory-budget", "12 parsecs"], "parsecs"),
        (vec!["train", "absent.cvnn"], "absent.cvnn"),
        (vec!["train", "tiny.cvnn", "--out", "fresh", "--resume"], "last.safetensors"),
        (vec!["train", "tiny.cvnn", "--batch", "1000"], "fewer than one batch"),
        (vec!["eval", "tiny.cvnn", "--weights", "nope.safetensors", "--data", "nope.npz"], "nope.npz"),
    ];
    for (args, needle) in cases {
        let o = cvc(&dir, &args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?} should mention {needle}: {}", text(&o));
        assert!(!text(&o).contains("panicked"), "{args:?}: {}", text(&o));
    }
    let o = cvc(&dir, &["train", "npz.cvnn", "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("missing.npz"), "{}", text(&o));
    if cvc_runtime::cuda::available().is_err() {
        let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cuda"]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("CUDA"), "{}", text(&o));
    }
}

#[test]
fn data_run_and_eval_work_together() {
    let dir = tmp("rf");
    std::fs::write(dir.join("rf.cvnn"), RF).unwrap();
    let o = cvc(
        &dir,
        &["data", "rf", "--out", "d.npz", "--classes", "3", "--length", "32", "--count", "20", "--seed", "4"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = cvc(&dir, &["train", "rf.cvnn", "--device", "cpu", "--out", "run", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = cvc(
        &dir,
        &[
            "eval",
            "rf.cvnn",
            "--weights",
            "run/best.safetensors",
            "--data",
            "d.npz",
            "--device",
            "cpu",
            "--batch",
            "8",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("accuracy") && text(&o).contains("BPSK"), "{}", text(&o));
    let o = cvc(
        &dir,
        &[
            "run",
            "rf.cvnn",
            "--weights",
            "run/last.safetensors",
            "--data",
            "d.npz",
            "--device",
            "cpu",
            "--grads",
            "g.safetensors",
            "--out",
            "o.npz",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let grads = cvc_runtime::checkpoint::load(&dir.join("g.safetensors")).unwrap();
    let weights = cvc_runtime::checkpoint::load(&dir.join("run/last.safetensors")).unwrap();
    assert!(!grads.tensors.is_empty());
    for (name, g) in &grads.tensors {
        let w = weights.tensors.get(name).unwrap_or_else(|| panic!("gradient {name} names no parameter"));
        assert_eq!((g.dtype, &g.shape), (w.dtype, &w.shape), "{name}");
    }
    let outs = cvc_runtime::data::npy::load_npz(&dir.join("o.npz")).unwrap();
    let names: Vec<&str> = outs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["logits", "loss"]);
    assert_eq!(outs[0].1.tensor.shape, vec![20, 3]);
    // Data that does not match the model: the error names the array and both shapes.
    let o =
        cvc(&dir, &["data", "rf", "--out", "long.npz", "--classes", "3", "--length", "64", "--count", "4"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = cvc(
        &dir,
        &["eval", "rf.cvnn", "--weights", "run/best.safetensors", "--data", "long.npz", "--device", "cpu"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("'iq'") && text(&o).contains("[N, 1, 32]") && text(&o).contains("[4, 1, 64]"),
        "{}",
        text(&o)
    );
    // Weights of another model.
    std::fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    let o = cvc(
        &dir,
        &["eval", "tiny.cvnn", "--weights", "run/best.safetensors", "--data", "d.npz", "--device", "cpu"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(!text(&o).contains("panicked"), "{}", text(&o));
}

/// A per-pixel model on synthetic.polsar: `cvc train` reads the dataset from the train
/// section (unlabelled pixels as the loss's ignore_index 255) and reports pixel accuracy and
/// mIoU; `cvc data polsar` writes the same kind of scenes, which `cvc eval` scores with the
/// scattering classes' names.
#[test]
fn polsar_data_train_and_eval_work_together() {
    const POLSAR: &str = "model P {
    input image: c64[B, 3, 16, 16]
    input label: class[B, 16, 16] of 3
    logits = image |> conv2d(4, kernel = 3, pad = 1) |> crelu |> conv2d(3, kernel = 1) |> abs
    output logits
    loss cross_entropy(logits, label, ignore_index = 255)
}
train P {
    data = synthetic.polsar(count = 12, size = 16, classes = 3, regions = 4, seed = 1)
    batch = 4
    epochs = 1
    optimizer = adam(lr = 1e-2)
    device = cpu
}
";
    let dir = tmp("polsar");
    std::fs::write(dir.join("p.cvnn"), POLSAR).unwrap();
    let o = cvc(&dir, &["train", "p.cvnn", "--out", "run", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let metrics = std::fs::read_to_string(dir.join("run/metrics.jsonl")).unwrap();
    assert!(metrics.contains("val_miou"), "{metrics}");
    let args = [
        "data",
        "polsar",
        "--out",
        "p.npz",
        "--size",
        "16",
        "--classes",
        "3",
        "--count",
        "6",
        "--regions",
        "4",
        "--ignore-index",
        "255",
    ];
    let o = cvc(&dir, &args);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("image complex64 [6, 3, 16, 16], label int32 [6, 16, 16]"), "{}", text(&o));
    let o = cvc(
        &dir,
        &["eval", "p.cvnn", "--weights", "run/last.safetensors", "--data", "p.npz", "--device", "cpu"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("pixel accuracy") && t.contains("label 255 ignored") && t.contains("surface"), "{t}");
    // A file whose unlabelled pixels carry another label than the model's ignore_index.
    let o =
        cvc(&dir, &["data", "polsar", "--out", "q.npz", "--size", "16", "--classes", "3", "--count", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = cvc(
        &dir,
        &["eval", "p.cvnn", "--weights", "run/last.safetensors", "--data", "q.npz", "--device", "cpu"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("label -100"), "{}", text(&o));
}

/// The training loop's overlapped path (`CVC_OVERLAP=1`: the previous step's predictions are
/// counted, and the next batch gathered, while the device runs a step; on the CPU the same
/// work runs in sequence) gives the same training accuracy, loss and validation metrics as
/// the plain path, across the switch from the first checked steps to overlapped ones; and
/// metrics.jsonl says where each step's time went.
#[test]
fn overlapped_training_loop_counts_what_the_plain_one_counts() {
    const SEG: &str = "model S {
    input image: c64[B, 3, 8, 8]
    input label: class[B, 8, 8] of 3
    logits = image |> conv2d(4, kernel = 3, pad = 1) |> crelu |> conv2d(3, kernel = 1) |> abs
    output logits
    loss cross_entropy(logits, label, ignore_index = 255)
}
train S {
    data = synthetic.polsar(count = 48, size = 8, classes = 3, regions = 3, seed = 4)
    split = 0.75
    batch = 4
    epochs = 2
    optimizer = adam(lr = 1e-2)
    device = cpu
}
";
    let dir = tmp("overlap");
    std::fs::write(dir.join("s.cvnn"), SEG).unwrap();
    let run = |mode: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_cvc"))
            .current_dir(&dir)
            .env("CVC_OVERLAP", mode)
            .args(["train", "s.cvnn", "--out", &format!("run{mode}"), "-q"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let metrics = std::fs::read_to_string(dir.join(format!("run{mode}/metrics.jsonl"))).unwrap();
        metrics
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|m| m.get("train_loss").is_some())
            .collect::<Vec<_>>()
    };
    let (plain, overlapped) = (run("0"), run("1"));
    assert_eq!(plain.len(), 2);
    for (a, b) in plain.iter().zip(&overlapped) {
        for key in ["train_loss", "train_acc", "val_loss", "val_acc", "val_miou"] {
            assert!(a[key].is_number(), "{key} missing in {a}");
            assert_eq!(a[key], b[key], "{key}: plain {a} vs overlapped {b}");
        }
        for m in [a, b] {
            let p = &m["step_phases_ms"];
            for phase in ["upload", "launch", "overlapped", "wait", "download"] {
                let v = p[phase].as_f64().unwrap_or_else(|| panic!("{phase} missing in {m}"));
                assert!(v.is_finite() && v >= 0.0, "{phase} = {v}");
            }
        }
    }
}
