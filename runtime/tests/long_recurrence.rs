//! `cvc plan` and `cvc train` of a 4,096-step GRU under `--memory-budget` on the CPU: the
//! whole backward does not fit, the recurrence backward in chunks (checkpointed states) does,
//! and a training epoch of a tiny synthetic dataset runs within the budget.

use std::path::PathBuf;
use std::process::{Command, Output};

const LONG_GRU: &str = "model LongGru {
    input iq:    c64[B, 4096, 2]
    input label: class[B] of 5
    state = iq |> gru(32, returns = last)
    logits = state |> linear(5) |> abs
    output logits
    loss cross_entropy(logits, label)
}
train LongGru {
    data      = synthetic.random(count = 4, seed = 1)
    split     = 0.5
    batch     = 2
    epochs    = 1
    optimizer = adam(lr = 1e-3)
    seed      = 2
}
";

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("cvc-long-recurrence-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("long.cvnn"), LONG_GRU).unwrap();
    d
}

fn cvc(dir: &PathBuf, args: &[&str]) -> (bool, String) {
    let o: Output = Command::new(env!("CARGO_BIN_EXE_cvc")).current_dir(dir).args(args).output().unwrap();
    (
        o.status.success(),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

#[test]
fn a_4096_step_gru_trains_within_the_budget_in_chunks() {
    let d = dir();
    // Batch 2: about 28 MiB unchunked, so a 16 MiB budget needs chunks.
    let (ok, free) = cvc(&d, &["plan", "long.cvnn"]);
    assert!(ok && !free.contains("in chunks of"), "{free}");
    let (ok, plan) = cvc(&d, &["plan", "long.cvnn", "--memory-budget", "16MiB"]);
    assert!(ok, "{plan}");
    assert!(plan.contains("recurrence backward in chunks of"), "{plan}");
    let (ok, json) = cvc(&d, &["plan", "long.cvnn", "--memory-budget", "16MiB", "--json"]);
    assert!(ok, "{json}");
    let j: serde_json::Value = serde_json::from_str(&json).expect("json");
    let k = j["rnn_chunk"].as_u64().expect("rnn_chunk");
    assert!((16..4096).contains(&k), "{k}");
    assert!(j["arena_bytes"].as_u64().unwrap() <= 16 << 20, "{json}");
    let (ok, out) =
        cvc(&d, &["train", "long.cvnn", "--device", "cpu", "--memory-budget", "16MiB", "--out", "run"]);
    assert!(ok, "{out}");
    assert!(out.contains("epoch 1/1") && !out.contains("NaN"), "{out}");
    assert!(d.join("run/last.safetensors").exists(), "{out}");
    let _ = std::fs::remove_dir_all(&d);
}
