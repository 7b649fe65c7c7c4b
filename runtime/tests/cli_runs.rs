//! Reliability of `cvc` as a process (issue 15): output errors (stdout to `/dev/full` for
//! every subcommand, stderr to `/dev/full`, a closed pipe), and the run folder of `cvc
//! train` — kill -9 at seeded random times then `--resume` equals an uninterrupted run,
//! crashes injected between checkpoint files keep the best one, non-empty folders are
//! refused unless `--resume`/`--overwrite`, the lock, resume mismatch errors, and the memory
//! budget enforced before anything is allocated.
//!
//! Everything runs on the CPU with tiny models (each case takes well under a second of
//! training). Unix only: it uses `/dev/full`, signals and pids.
#![cfg(unix)]

#[path = "../../tests/src/seed.rs"]
mod seed;

use cvc_runtime::checkpoint;
use std::fs::{self, File};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Instant;

/// A classifier: most commands and the output tests.
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

/// A regression (no accuracy: the best epoch is the lowest validation loss, which moves every
/// epoch), trained with Adam so the checkpoints carry moments and a step counter too.
const REG: &str = "model Reg {
    input x: c64[B, 6]
    input y: c64[B, 2]
    out = x |> linear(6) |> crelu |> linear(2)
    output out
    loss mse(out, y)
}
train Reg {
    data      = synthetic.random(count = 96, seed = 3)
    split     = 0.75
    batch     = 8
    epochs    = 8
    optimizer = adam(lr = 3e-3)
    schedule  = cosine(min_lr = 1e-4)
    seed      = 5
}
";

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cvc-runs-test-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cvc"));
    c.current_dir(dir).args(args).env_remove(cvc_runtime::run_dir::CRASH_ENV);
    c
}

fn cvc(dir: &Path, args: &[&str]) -> Output {
    cmd(dir, args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn full() -> File {
    fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full exists on Linux")
}

/// Exit code 1 with `needle` in the output, and no panic.
fn assert_fails(o: &Output, needle: &str, what: &str) {
    assert_eq!(o.status.code(), Some(1), "{what}: {}", text(o));
    assert!(text(o).contains(needle), "{what} should mention `{needle}`: {}", text(o));
    assert!(!text(o).contains("panicked"), "{what}: {}", text(o));
}

/// A folder with the tiny model, a trained run and an `.npz` for `run`/`eval`.
fn tiny_setup(name: &str) -> PathBuf {
    let dir = tmp(name);
    fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cpu", "--out", "run", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    // The model's synthetic data as an `.npz` for `run` and `eval`.
    let m = cvc_runtime::session::Model::from_file(dir.join("tiny.cvnn")).unwrap();
    let d = cvc_runtime::data::Dataset::from_source(&m.config().data, m.dir(), m.inputs()).unwrap();
    let arrays: Vec<(&str, &cvc_runtime::backend::HostTensor)> =
        d.arrays.iter().map(|(n, t)| (n.as_str(), t)).collect();
    cvc_runtime::data::npy::save_npz(&dir.join("d.npz"), &arrays).unwrap();
    dir
}

#[test]
fn every_subcommand_with_a_full_stdout_exits_1_with_an_error() {
    let dir = tiny_setup("full-stdout");
    // `fmt --check` prints the files it would change.
    fs::write(dir.join("unformatted.cvnn"), TINY.replace("    ", "  ")).unwrap();
    let w = ["--weights", "run/last.safetensors", "--data", "d.npz", "--device", "cpu"];
    let mut cases: Vec<Vec<&str>> = vec![
        vec!["check", "tiny.cvnn"],
        vec!["check", "tiny.cvnn", "--json"],
        vec!["plan", "tiny.cvnn"],
        vec!["plan", "tiny.cvnn", "--json"],
        vec!["plan", "tiny.cvnn", "--max-batch", "1GiB"],
        vec!["emit", "tiny.cvnn", "--clif"],
        vec!["emit", "tiny.cvnn", "--cpu"],
        vec!["emit", "tiny.cvnn", "--cuda"],
        vec!["emit", "tiny.cvnn", "--ir", "--after", "autodiff"],
        vec!["train", "tiny.cvnn", "--device", "cpu", "--out", "full-train"],
        vec!["data", "rf", "--out", "rf.npz", "--classes", "3", "--length", "16", "--count", "4"],
        vec!["--help"],
        vec!["--version"],
        vec!["train", "--help"],
        vec!["report", "tiny.cvnn", "-o", "tiny.html"],
        vec!["fmt", "--check", "unformatted.cvnn"],
    ];
    let mut run = vec!["run", "tiny.cvnn"];
    run.extend(w);
    let mut eval = vec!["eval", "tiny.cvnn"];
    eval.extend(w);
    cases.push(run);
    cases.push(eval);
    for args in &cases {
        let o = cmd(&dir, args).stdout(full()).output().unwrap();
        assert_fails(&o, "cannot write to standard output", &format!("{args:?} > /dev/full"));
    }
    // The epoch lines come after the epoch's checkpoints: `-q` prints nothing, so the run
    // succeeds; a full stdout stops a run at its first line, before any epoch.
    assert!(!dir.join("full-train/last.safetensors").exists());
}

#[test]
fn a_full_stderr_keeps_exit_code_1() {
    let dir = tmp("full-stderr");
    fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    fs::write(dir.join("bad.cvnn"), TINY.replace("linear(3)", "linear(3, bogus = 1)")).unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["check", "absent.cvnn"],
        vec!["check", "bad.cvnn"],
        vec!["plan", "bad.cvnn"],
        vec!["train", "bad.cvnn", "--device", "cpu"],
        vec!["train", "tiny.cvnn", "--epochs", "0"],
        vec!["train", "tiny.cvnn", "--device", "cpu", "--memory-budget", "1KiB"],
        vec!["eval", "tiny.cvnn", "--weights", "nope.safetensors", "--data", "nope.npz"],
        vec!["frobnicate"],
    ];
    for args in &cases {
        let o = cmd(&dir, args).stderr(full()).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?} 2> /dev/full: {}", text(&o));
    }
    // Both full: a command that would succeed fails on stdout and cannot say so; still 1.
    let o = cmd(&dir, &["check", "tiny.cvnn"]).stdout(full()).stderr(full()).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
}

/// The writing end of a pipe whose reading end is already closed.
fn closed_pipe() -> Stdio {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: `pipe` fills both descriptors on success; the reading end is closed at once and
    // the writing end is owned by the returned `Stdio` alone.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0, "pipe");
        libc::close(fds[0]);
        Stdio::from(OwnedFd::from_raw_fd(fds[1]))
    }
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let dir = tmp("pipe");
    fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    for args in [vec!["emit", "tiny.cvnn", "--cpu"], vec!["plan", "tiny.cvnn"], vec!["check", "tiny.cvnn"]] {
        // A pipe whose reading end is closed before the command starts, as `| head -0` would
        // leave it: the first write gets SIGPIPE (or EPIPE) however short the output is and
        // however fast the command. (Closing the end after spawning raced with a fast
        // command, whose write could land in the pipe's buffer first.)
        let o = cmd(&dir, &args).stdout(closed_pipe()).stderr(Stdio::piped()).output().unwrap();
        let quiet = o.status.signal() == Some(libc::SIGPIPE) || o.status.code() == Some(1);
        assert!(quiet, "{args:?}: {:?} {}", o.status, text(&o));
        assert!(o.stderr.is_empty(), "{args:?} should end quietly: {}", text(&o));
    }
    // `| head -1`: reads one line, then closes.
    let mut child = cmd(&dir, &["emit", "tiny.cvnn", "--cpu"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 64];
    let n = std::io::Read::read(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    assert!(n > 0);
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success() || o.status.signal() == Some(libc::SIGPIPE), "{:?}", o.status);
    assert!(o.stderr.is_empty(), "{}", text(&o));
}

/// What a run's files hold that must not depend on interruptions: the metrics lines without
/// timings, and both checkpoints' tensors and epochs.
#[derive(Debug)]
struct RunState {
    metrics: Vec<serde_json::Value>,
    last: checkpoint::Checkpoint,
    best: checkpoint::Checkpoint,
}

fn run_state(out: &Path) -> RunState {
    let metrics = fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            for k in ["step_ms", "step_phases_ms", "samples_per_s", "measured_peak_bytes"] {
                v.as_object_mut().unwrap().remove(k);
            }
            v
        })
        .collect();
    let load = |name: &str| {
        let mut ck = checkpoint::load(&out.join(name)).unwrap();
        // The metadata's own copy of the metrics line holds timings too.
        ck.metadata.remove("metrics");
        ck
    };
    RunState { metrics, last: load("last.safetensors"), best: load("best.safetensors") }
}

/// Two runs' states are equal, with a short message naming the first difference (the full
/// states are pages of numbers).
fn assert_same_run(got: &RunState, want: &RunState, what: &str) {
    for (i, (g, w)) in got.metrics.iter().zip(&want.metrics).enumerate() {
        assert_eq!(g, w, "{what}: metrics line {}", i + 1);
    }
    assert_eq!(got.metrics.len(), want.metrics.len(), "{what}: metrics lines");
    for (name, g, w) in [("last", &got.last, &want.last), ("best", &got.best, &want.best)] {
        assert_eq!(g.metadata, w.metadata, "{what}: {name}.safetensors metadata");
        assert_eq!(
            g.tensors.keys().collect::<Vec<_>>(),
            w.tensors.keys().collect::<Vec<_>>(),
            "{what}: {name}"
        );
        for (t, gt) in &g.tensors {
            assert!(gt == &w.tensors[t], "{what}: tensor {t} of {name}.safetensors differs");
        }
    }
}

/// No temporaries and no lock once a run has finished.
fn assert_clean(out: &Path) {
    let names: Vec<String> =
        fs::read_dir(out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["best.safetensors", "last.safetensors", "metrics.jsonl", "plan.json"], "{names:?}");
}

/// Arguments of a Reg run into `out`: resume when the folder has a checkpoint, else a fresh
/// run replacing whatever a killed run left.
fn reg_args(dir: &Path, out: &str) -> Vec<String> {
    let has_ck =
        dir.join(out).join("last.safetensors").exists() || dir.join(out).join("best.safetensors").exists();
    let mode = if has_ck { "--resume" } else { "--overwrite" };
    ["train", "reg.cvnn", "--device", "cpu", "-q", "--out", out, mode].iter().map(|s| s.to_string()).collect()
}

#[test]
fn killed_at_random_times_and_resumed_equals_an_uninterrupted_run() {
    let dir = tmp("kill");
    fs::write(dir.join("reg.cvnn"), REG).unwrap();
    let o = cvc(&dir, &["train", "reg.cvnn", "--device", "cpu", "-q", "--out", "ref"]);
    assert!(o.status.success(), "{}", text(&o));
    let reference = run_state(&dir.join("ref"));
    assert_eq!(reference.metrics.len(), 8);
    // One epoch's training time: kills land up to two epochs after the chosen one.
    let sps = reference.metrics[0]["samples_per_s"].as_f64().unwrap_or(1e4);
    let epoch_us = (72.0 / sps * 1e6) as u64;

    let mut state = seed::seed_for("killed_at_random_times_and_resumed_equals_an_uninterrupted_run");
    let mut next = move |n: u64| {
        // SplitMix64, reduced to [0, n).
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    };
    let out = dir.join("killed");
    let lines = || fs::read_to_string(out.join("metrics.jsonl")).map(|t| t.lines().count()).unwrap_or(0);
    let mut kills = Vec::new();
    let mut finished = false;
    while !finished && kills.len() < 6 {
        let args = reg_args(&dir, "killed");
        let mut child = cmd(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // A seeded random moment: after a random number of this run's epochs (0: during start
        // up or the first epoch), then a random delay of up to two epochs.
        let now = lines();
        let target = now + next((8 - now.min(8)) as u64) as usize;
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while lines() < target && child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        std::thread::sleep(std::time::Duration::from_micros(next(2 * epoch_us)));
        // SAFETY: the pid is our own child's, not yet reaped (`wait` below reaps it).
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGKILL);
        }
        let status: ExitStatus = child.wait().unwrap();
        if status.success() {
            finished = true;
        } else {
            assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
            kills.push(lines());
        }
    }
    if !finished {
        let args = reg_args(&dir, "killed");
        let o = cvc(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{}", text(&o));
    }
    eprintln!("killed with these many metrics lines on disk: {kills:?}");
    assert!(kills.iter().any(|&n| n > 0 && n < 8), "no kill landed mid-run: {kills:?}");
    assert_same_run(&run_state(&out), &reference, &format!("after kills at {kills:?}"));
    assert_clean(&out);
}

/// The epochs (1-based) whose checkpoint became the best, from a run's metrics: the lowest
/// validation loss so far (Reg has no accuracy).
fn improvements(metrics: &[serde_json::Value]) -> Vec<usize> {
    let mut best = f64::INFINITY;
    let mut out = Vec::new();
    for m in metrics {
        let l = m["val_loss"].as_f64().unwrap();
        if l < best {
            best = l;
            out.push(m["epoch"].as_u64().unwrap() as usize);
        }
    }
    out
}

#[test]
fn a_crash_between_checkpoint_files_keeps_the_best_and_resumes_exactly() {
    let dir = tmp("crash");
    fs::write(dir.join("reg.cvnn"), REG).unwrap();
    let o = cvc(&dir, &["train", "reg.cvnn", "--device", "cpu", "-q", "--out", "ref"]);
    assert!(o.status.success(), "{}", text(&o));
    let reference = run_state(&dir.join("ref"));
    let imp = improvements(&reference.metrics);
    assert!(imp.len() >= 2, "the test needs a run whose best moves at least twice: {imp:?}");
    // The last improving epoch after the first: a crash there has an older best to lose.
    let k = imp.len();
    let e = imp[k - 1];
    let points = [
        format!("best.tmp:{k}"),
        format!("best:{k}"),
        format!("last.tmp:{e}"),
        format!("last:{e}"),
        format!("metrics.line:{e}"),
        "best:1".to_string(),
    ];
    for (i, point) in points.iter().enumerate() {
        let out = format!("run{i}");
        let o = cmd(&dir, &["train", "reg.cvnn", "--device", "cpu", "-q", "--out", &out])
            .env(cvc_runtime::run_dir::CRASH_ENV, point)
            .output()
            .unwrap();
        assert_eq!(o.status.signal(), Some(libc::SIGABRT), "{point}: {:?} {}", o.status, text(&o));
        let best = checkpoint::load(&dir.join(&out).join("best.safetensors")).unwrap();
        let best_epoch: usize = best.meta("epoch").unwrap().parse().unwrap();
        // Whatever the crash point, the best on disk is never older than the best before it.
        // The best on disk is the best of the epochs finished before the crash: never older.
        let want = match point.as_str() {
            p if p.starts_with("best.tmp") => imp[k - 2],
            "best:1" => 1,
            _ => e,
        };
        assert_eq!(best_epoch, want, "{point}");
        let o = cvc(&dir, &["train", "reg.cvnn", "--device", "cpu", "-q", "--out", &out, "--resume"]);
        assert!(o.status.success(), "{point}: {}", text(&o));
        if point.starts_with("best:") || point.starts_with("last.tmp") {
            assert!(text(&o).contains("stopped between writing the two"), "{point}: {}", text(&o));
        }
        if point.contains(".tmp") {
            assert!(text(&o).contains("removed 1 temporary file"), "{point}: {}", text(&o));
        }
        assert_same_run(&run_state(&dir.join(&out)), &reference, point);
        assert_clean(&dir.join(&out));
    }
}

#[test]
fn a_non_empty_folder_needs_resume_or_overwrite() {
    let dir = tmp("reuse");
    fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    let train = |extra: &[&str]| {
        let mut a = vec!["train", "tiny.cvnn", "--device", "cpu", "-q", "--out", "run"];
        a.extend(extra);
        cvc(&dir, &a)
    };
    let o = train(&[]);
    assert!(o.status.success(), "{}", text(&o));
    let metrics = fs::read(dir.join("run/metrics.jsonl")).unwrap();
    let best = fs::read(dir.join("run/best.safetensors")).unwrap();
    let o = train(&[]);
    assert_fails(&o, "is not empty", "a second run into the folder");
    assert!(text(&o).contains("--resume") && text(&o).contains("--overwrite"), "{}", text(&o));
    assert_eq!(fs::read(dir.join("run/metrics.jsonl")).unwrap(), metrics, "refused runs change nothing");
    assert_eq!(fs::read(dir.join("run/best.safetensors")).unwrap(), best);
    assert_fails(&train(&["--resume", "--overwrite"]), "--overwrite", "both flags");
    // A user's file stays; the run's files are replaced (same seed: same contents again).
    fs::write(dir.join("run/notes.txt"), "mine").unwrap();
    // Shaped like a temporary, but not of a run file: the user's too.
    fs::write(dir.join("run/.notes.txt.tmp-12"), "mine").unwrap();
    let o = train(&["--overwrite", "--epochs", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(fs::read_to_string(dir.join("run/notes.txt")).unwrap(), "mine");
    assert!(dir.join("run/.notes.txt.tmp-12").exists());
    assert_eq!(fs::read_to_string(dir.join("run/metrics.jsonl")).unwrap().lines().count(), 2);
    // Any other file makes a folder non-empty too.
    fs::create_dir_all(dir.join("other")).unwrap();
    fs::write(dir.join("other/x"), "").unwrap();
    let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cpu", "-q", "--out", "other"]);
    assert_fails(&o, "is not empty (x)", "a folder with a user's file");
}

#[test]
fn the_lock_keeps_a_second_run_out_and_a_stale_one_is_taken_over() {
    let dir = tmp("lock");
    fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    fs::create_dir_all(dir.join("run")).unwrap();
    // A live holder: this test process, holding the flock as a run does.
    {
        use std::io::Write as _;
        use std::os::unix::io::AsRawFd as _;
        let mut held = File::create(dir.join("run/train.lock")).unwrap();
        write!(held, "{}", std::process::id()).unwrap();
        // SAFETY: a valid open descriptor, owned by `held` for the whole block.
        assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cpu", "-q", "--out", "run"]);
        assert_fails(&o, "in use by another `cvc train`", "a locked folder");
        assert!(text(&o).contains(&format!("pid {}", std::process::id())), "{}", text(&o));
        assert!(dir.join("run/train.lock").exists(), "someone else's lock stays");
    }
    // A lock file a crashed run left (its pid: a child that has exited) and a temporary.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    fs::write(dir.join("run/train.lock"), format!("{dead}\n")).unwrap();
    fs::write(dir.join("run/.last.safetensors.tmp-4194999"), b"torn").unwrap();
    let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cpu", "-q", "--out", "run"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("of process {dead}, which ended without releasing it")),
        "{}",
        text(&o)
    );
    assert!(text(&o).contains(".last.safetensors.tmp-4194999"), "{}", text(&o));
    assert_clean(&dir.join("run"));
    // Two runs started together into one folder: exactly one trains, the other is refused.
    let spawn = || {
        cmd(&dir, &["train", "tiny.cvnn", "--device", "cpu", "-q", "--out", "pair", "--epochs", "3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let ok = [&a, &b].iter().filter(|o| o.status.success()).count();
    assert_eq!(ok, 1, "{}\n---\n{}", text(&a), text(&b));
    let refused = if a.status.success() { &b } else { &a };
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(refused).contains("in use by another") || text(refused).contains("is not empty"),
        "{}",
        text(refused)
    );
    assert_eq!(fs::read_to_string(dir.join("pair/metrics.jsonl")).unwrap().lines().count(), 3);
}

#[test]
fn resume_refuses_another_model_batch_seed_or_data() {
    let dir = tmp("mismatch");
    fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cpu", "-q", "--out", "run"]);
    assert!(o.status.success(), "{}", text(&o));
    let before = fs::read(dir.join("run/last.safetensors")).unwrap();
    fs::write(dir.join("wider.cvnn"), TINY.replace("linear(8)", "linear(6)")).unwrap();
    fs::write(dir.join("lr.cvnn"), TINY.replace("lr = 0.05", "lr = 0.01")).unwrap();
    fs::write(dir.join("data.cvnn"), TINY.replace("count = 64, seed = 1", "count = 64, seed = 9")).unwrap();
    // Comments and layout do not change the model.
    fs::write(dir.join("comment.cvnn"), format!("# the same model\n\n{TINY}")).unwrap();
    let resume = |file: &str, extra: &[&str]| {
        let mut a = vec!["train", file, "--device", "cpu", "-q", "--out", "run", "--resume", "--epochs", "2"];
        a.extend(extra);
        cvc(&dir, &a)
    };
    let o = resume("tiny.cvnn", &["--batch", "4"]);
    assert_fails(&o, "batch 8, this run batch 4", "--batch");
    assert!(text(&o).contains("or start a new run with --overwrite or another --out"), "{}", text(&o));
    assert_fails(&resume("tiny.cvnn", &["--seed", "3"]), "seed 2, this run seed 3", "--seed");
    assert_fails(&resume("wider.cvnn", &[]), "a different model", "another model");
    assert_fails(&resume("lr.cvnn", &[]), "\"lr\":0.01", "another optimizer");
    assert_fails(&resume("data.cvnn", &[]), "\"seed\":9", "other data");
    assert_eq!(fs::read(dir.join("run/last.safetensors")).unwrap(), before, "refused resumes change nothing");
    let o = resume("comment.cvnn", &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(fs::read_to_string(dir.join("run/metrics.jsonl")).unwrap().lines().count(), 2);
}

#[test]
fn train_enforces_the_memory_budget_like_plan() {
    let dir = tmp("budget");
    fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    fs::write(
        dir.join("section.cvnn"),
        TINY.replace("seed      = 2", "seed      = 2\n    memory_budget = 2KiB"),
    )
    .unwrap();
    let plan = cvc(&dir, &["plan", "tiny.cvnn", "--memory-budget", "2KiB"]);
    assert_fails(&plan, "the memory budget is 2.0 KiB", "plan");
    let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cpu", "--out", "flag", "--memory-budget", "2KiB"]);
    assert_fails(&o, "the memory budget is 2.0 KiB", "train --memory-budget");
    assert!(!dir.join("flag/last.safetensors").exists() && !dir.join("flag/train.lock").exists());
    let o = cvc(&dir, &["train", "section.cvnn", "--device", "cpu", "--out", "section"]);
    assert_fails(&o, "the memory budget is 2.0 KiB", "the train section's memory_budget");
    // Before the data is read: with data that does not exist, the budget is what is reported.
    fs::write(
        dir.join("nodata.cvnn"),
        TINY.replace("synthetic.random(count = 64, seed = 1)", "npz(\"absent.npz\")"),
    )
    .unwrap();
    let o =
        cvc(&dir, &["train", "nodata.cvnn", "--device", "cpu", "--out", "nodata", "--memory-budget", "2KiB"]);
    assert_fails(&o, "the memory budget is 2.0 KiB", "budget before data");
    assert!(!text(&o).contains("absent.npz"), "{}", text(&o));
    let o = cvc(&dir, &["plan", "section.cvnn"]);
    assert_fails(&o, "the memory budget is 2.0 KiB", "plan of the train section's budget");
    for sub in ["plan", "train"] {
        let o = cvc(&dir, &[sub, "tiny.cvnn", "--memory-budget", "0"]);
        assert_fails(&o, "at least 1 byte", &format!("{sub} --memory-budget 0"));
    }
    // A budget the plan fits: the run trains.
    let o = cvc(
        &dir,
        &["train", "tiny.cvnn", "--device", "cpu", "-q", "--out", "fits", "--memory-budget", "1GiB"],
    );
    assert!(o.status.success(), "{}", text(&o));
}

/// `cvc emit --cuda` generates for the train section's precision (a 16-bit one stores the
/// activations in 16 bits and multiplies on tensor cores: a matmul's 16-bit products by
/// default, `tc16=native` too), `--kernels tc16=tf32` chooses the TF32 products over the
/// 16-bit ones there (`wgmma` for the H200 that `emit` targets without a GPU), and
/// `tc16=wgmma` the 16-bit `wgmma` products.
#[test]
fn emit_cuda_follows_the_train_sections_precision() {
    let dir = tmp("emit-precision");
    for (precision, storage, mma) in [("bf16", "bf16s", "mma_bf16(c"), ("fp16", "f16s", "mma_f16(c")] {
        let file = format!("tiny_{precision}.cvnn");
        fs::write(
            dir.join(&file),
            TINY.replace("    epochs", &format!("    precision = {precision}\n    epochs")),
        )
        .unwrap();
        for spec in ["default", "tc16=native"] {
            let o = cvc(&dir, &["emit", &file, "--cuda", "--kernels", spec]);
            assert!(o.status.success(), "{precision}: {}", text(&o));
            let cuda = String::from_utf8_lossy(&o.stdout);
            assert!(cuda.contains(&format!("({storage}*)")), "{precision} {spec}: no 16-bit buffer");
            let tf32 = cuda.contains("wgmma_tf32<") || cuda.contains("mma_tf32(c");
            assert!(cuda.contains(mma) && !tf32, "{precision} {spec}: not 16-bit products");
        }
        let o = cvc(&dir, &["emit", &file, "--cuda", "--kernels", "tc16=tf32"]);
        assert!(o.status.success(), "{precision}: {}", text(&o));
        let cuda = String::from_utf8_lossy(&o.stdout);
        // TF32 products: `wgmma`, or `mma.sync` where a contraction does not suit it.
        let tf32 = cuda.contains("wgmma_tf32<") || cuda.contains("mma_tf32(c");
        assert!(tf32 && !cuda.contains(mma), "{precision}, tc16=tf32: not TF32 products");
        // 16-bit products on `wgmma` where a complex operand is stored in 16 bits.
        let o = cvc(&dir, &["emit", &file, "--cuda", "--kernels", "tc16=wgmma"]);
        assert!(o.status.success(), "{precision}: {}", text(&o));
        let cuda = String::from_utf8_lossy(&o.stdout);
        let form = if precision == "bf16" { ", true>(c" } else { ", false>(c" };
        assert!(
            cuda.contains(form) && !cuda.contains(mma),
            "{precision}, tc16=wgmma: not 16-bit wgmma products"
        );
    }
}
