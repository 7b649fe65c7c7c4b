//! NaN and infinities named at their source (`--check-numerics`), non-finite validation and
//! weights as errors, and the memory report's itemisation against the measured peak: issue
//! 15's reproductions, each on small models that train in well under a second.

#[path = "../../tests/src/seed.rs"]
mod seed;

use cvc_compiler::init::SplitMix64;
use cvc_runtime::backend::{HostData, HostTensor};
use cvc_runtime::checkpoint;
use cvc_runtime::data::{self, npy, Dataset};
use cvc_runtime::metrics::Confusion;
use cvc_runtime::numerics::{CheckNumerics, FIRST_STEPS};
use cvc_runtime::session::{Device, Model, SessionOptions};
use cvc_runtime::train::{train, TrainOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A two-layer classifier whose first consumer of `x` (the `linear(5)`) has a line of its own.
/// No activation between the layers: `crelu` maps NaN to 0, which would hide NaN data from
/// the loss (check mode still names it; see the first test).
fn probe_src(data_seed: u64, count: usize, split: f64, extra: &str) -> String {
    probe_src_with(data_seed, count, split, extra, "", "sgd(lr = 0.05)")
}

fn probe_src_with(data_seed: u64, count: usize, split: f64, extra: &str, act: &str, opt: &str) -> String {
    format!(
        "model Probe {{
    input x: c64[B, 6]
    input label: class[B] of 3
    h = x |> linear(5){act}
    logits = h |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}}
train Probe {{
    data      = synthetic.random(count = {count}, seed = {data_seed})
    split     = {split}
    batch     = 4
    epochs    = 2
    optimizer = {opt}
    seed      = 9
{extra}}}
"
    )
}

/// 1-based line of the first line of `src` containing `needle`.
fn line_of(src: &str, needle: &str) -> usize {
    src.lines().position(|l| l.contains(needle)).expect("needle in the source") + 1
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cvc-numerics-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Sets element `k` of sample `s` of the c64 `[N, 6]` input `x` to NaN (its real part).
fn poison(data: &mut Dataset, s: usize, k: usize) {
    let (_, t) = data.arrays.iter_mut().find(|(n, _)| n == "x").unwrap();
    let HostData::F32(v) = &mut t.data else { panic!("x is complex") };
    v[(s * 6 + k) * 2] = f32::NAN;
}

fn setup(name: &str, count: usize, split: f64) -> (Model, Dataset, String, SplitMix64) {
    let mut rng = SplitMix64::new(seed::seed_for(name));
    let src = probe_src(rng.next_u64() % 1000, count, split, "");
    let model = Model::from_source("probe.cvnn", &src).unwrap();
    let data = Dataset::from_source(&model.config().data, model.dir(), model.inputs()).unwrap();
    (model, data, src, rng)
}

fn opts(model: &Model, device: Device, out: PathBuf, check: CheckNumerics) -> TrainOptions {
    TrainOptions { device, check_numerics: check, ..TrainOptions::from_model(model, out) }
}

#[test]
fn nan_in_one_training_sample_names_the_first_op_that_reads_it_its_line_and_the_sample() {
    for device in [Device::Interp, Device::Cpu] {
        let (model, mut data, src, mut rng) = setup("numerics::nan_in_training_sample", 40, 0.8);
        let split = data::split(data.len, 0.8, 9);
        let order = data::epoch_order(&split.train, 9, 0);
        // A sample of the first batch (checked by default), a random element of it.
        let b = (rng.next_u64() % 4) as usize;
        let k = (rng.next_u64() % 6) as usize;
        let s = order[b];
        poison(&mut data, s, k);
        let dir = tmp(&format!("train-{device:?}"));
        let e = train(&model, &data, &opts(&model, device, dir.clone(), CheckNumerics::First)).unwrap_err();
        let line = line_of(&src, "linear(5)");
        for needle in [
            "NaN".to_string(),
            "epoch 1 step 1".to_string(),
            format!("probe.cvnn:{line}:"),
            format!("batch sample {b} (dataset sample {s})"),
            "input `x`".to_string(),
            "the data is not finite".to_string(),
        ] {
            assert!(e.0.contains(&needle), "{device:?}: `{needle}` missing in:\n{}", e.0);
        }
        assert!(!dir.join("best.safetensors").exists(), "{device:?}: a broken run saved best");
        // Check mode off: still an error, and it says how to locate the value.
        let e =
            train(&model, &data, &opts(&model, device, tmp("train-off"), CheckNumerics::Off)).unwrap_err();
        assert!(e.0.contains("NaN") && e.0.contains("--check-numerics always"), "{device:?}: {}", e.0);
    }
}

#[test]
fn check_mode_off_runs_no_scans_and_checking_does_not_change_the_losses() {
    let (model, data, _, _) = setup("numerics::check_mode_off", 40, 0.8);
    let run = |check| train(&model, &data, &opts(&model, Device::Cpu, tmp("checks"), check)).unwrap();
    let off = run(CheckNumerics::Off);
    assert_eq!(off.checked_steps, 0, "check mode off must never scan");
    let first = run(CheckNumerics::First);
    assert_eq!(first.checked_steps, FIRST_STEPS as u64);
    let always = run(CheckNumerics::Always);
    // 32 training samples in batches of 4 and 8 validation samples in 2 chunks, 2 epochs.
    assert_eq!(always.checked_steps, 2 * (8 + 2));
    for (a, b) in off.epochs.iter().zip(&always.epochs) {
        assert_eq!(a.train_loss, b.train_loss, "a checked step computes what a plain one does");
        assert_eq!(a.val_loss, b.val_loss);
    }
}

#[test]
fn nan_in_validation_data_only_is_an_error_naming_the_sample_and_nothing_is_saved() {
    for device in [Device::Interp, Device::Cpu] {
        let (model, mut data, src, mut rng) = setup("numerics::nan_in_validation", 40, 0.8);
        let split = data::split(data.len, 0.8, 9);
        let s = split.val[(rng.next_u64() % split.val.len() as u64) as usize];
        poison(&mut data, s, (rng.next_u64() % 6) as usize);
        for check in [CheckNumerics::First, CheckNumerics::Off] {
            let dir = tmp(&format!("val-{device:?}-{check:?}"));
            let e = train(&model, &data, &opts(&model, device, dir.clone(), check)).unwrap_err();
            assert!(e.0.contains("validation after epoch 1"), "{device:?} {check:?}: {}", e.0);
            if check == CheckNumerics::First {
                let line = line_of(&src, "linear(5)");
                assert!(e.0.contains(&format!("(dataset sample {s})")), "{device:?}: {}", e.0);
                assert!(e.0.contains(&format!("probe.cvnn:{line}:")), "{device:?}: {}", e.0);
            } else {
                assert!(e.0.contains("the loss is NaN"), "{device:?}: {}", e.0);
            }
            assert!(!dir.join("best.safetensors").exists() && !dir.join("last.safetensors").exists());
            let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap_or_default();
            assert!(!metrics.contains("null"), "no epoch record with a null validation loss: {metrics}");
        }
    }
}

#[test]
fn an_update_that_breaks_the_model_in_the_last_step_is_an_error_and_nothing_broken_is_saved() {
    // With crelu between the layers, NaN in a training sample never reaches the loss (relu
    // maps NaN to 0) but the weight gradient of the first layer does. The sample is put in the
    // last batch of the (one) epoch, past the steps checked by default: every loss is finite
    // and the run's last update makes the weights NaN. The run must stop before saving, naming
    // the broken tensor; check mode `always` names the op and the sample at that step.
    let mut rng = SplitMix64::new(seed::seed_for("numerics::last_update_breaks"));
    let src = probe_src_with(rng.next_u64() % 1000, 40, 0.8, "", " |> crelu", "sgd(lr = 0.05)");
    let model = Model::from_source("probe.cvnn", &src).unwrap();
    let mut data = Dataset::from_source(&model.config().data, model.dir(), model.inputs()).unwrap();
    let split = data::split(data.len, 0.8, 9);
    let order = data::epoch_order(&split.train, 9, 0);
    let b = (rng.next_u64() % 4) as usize;
    let s = order[order.len() - 4 + b];
    poison(&mut data, s, (rng.next_u64() % 6) as usize);
    for check in [CheckNumerics::First, CheckNumerics::Always] {
        let dir = tmp(&format!("broken-{check:?}"));
        let o = TrainOptions { epochs: 1, ..opts(&model, Device::Cpu, dir.clone(), check) };
        let e = train(&model, &data, &o).unwrap_err();
        if check == CheckNumerics::First {
            assert!(
                e.0.contains("after epoch 1") && e.0.contains("tensor `") && e.0.contains("holds NaN"),
                "{}",
                e.0
            );
        } else {
            assert!(e.0.contains("epoch 1 step 8") && e.0.contains("non-finite value"), "{}", e.0);
            assert!(e.0.contains(&format!("batch sample {b} (dataset sample {s})")), "{}", e.0);
        }
        assert!(!dir.join("best.safetensors").exists() && !dir.join("last.safetensors").exists());
    }
}

fn cvc(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cvc")).current_dir(dir).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn write_npz(path: &Path, data: &Dataset) {
    let arrays: Vec<(&str, &HostTensor)> = data.arrays.iter().map(|(n, t)| (n.as_str(), t)).collect();
    npy::save_npz(path, &arrays).unwrap();
}

#[test]
fn run_and_eval_refuse_non_finite_weights_and_name_nan_data() {
    let (model, mut data, src, mut rng) = setup("numerics::run_eval", 12, 0.8);
    let dir = tmp("cli");
    std::fs::write(dir.join("probe.cvnn"), &src).unwrap();
    write_npz(&dir.join("d.npz"), &data);
    let sopts = SessionOptions { device: Device::Cpu, ..SessionOptions::from_config(model.config()) };
    let mut session = model.session_with(&sopts).unwrap();
    session.save_weights(dir.join("ok.safetensors")).unwrap();
    // The weights with one element of one parameter set to +Inf.
    let mut tensors = session.state_tensors().unwrap();
    let victim = (rng.next_u64() % tensors.len() as u64) as usize;
    let name = tensors[victim].0.clone();
    if let HostData::F32(v) = &mut tensors[victim].1.data {
        v[0] = f32::INFINITY;
    } else {
        panic!("{name} is not a float tensor");
    }
    checkpoint::save(&dir.join("bad.safetensors"), &tensors, &Default::default()).unwrap();
    for cmd in ["eval", "run"] {
        let o = cvc(
            &dir,
            &[cmd, "probe.cvnn", "--weights", "ok.safetensors", "--data", "d.npz", "--device", "cpu"],
        );
        assert!(o.status.success(), "{cmd}: {}", text(&o));
        let o = cvc(
            &dir,
            &[cmd, "probe.cvnn", "--weights", "bad.safetensors", "--data", "d.npz", "--device", "cpu"],
        );
        assert_eq!(o.status.code(), Some(1), "{cmd}: {}", text(&o));
        let t = text(&o);
        assert!(
            t.contains(&format!("tensor `{name}` holds +Inf")) && t.contains("bad.safetensors"),
            "{cmd}: {t}"
        );
        assert!(!t.contains("accuracy") && !t.contains("loss "), "{cmd} printed a result: {t}");
    }
    // NaN in one sample of the data: both commands name the op's line and the sample.
    let s = (rng.next_u64() % data.len as u64) as usize;
    poison(&mut data, s, 0);
    write_npz(&dir.join("nan.npz"), &data);
    let line = line_of(&src, "linear(5)");
    for cmd in ["eval", "run"] {
        let o = cvc(
            &dir,
            &[cmd, "probe.cvnn", "--weights", "ok.safetensors", "--data", "nan.npz", "--device", "cpu"],
        );
        assert_eq!(o.status.code(), Some(1), "{cmd}: {}", text(&o));
        let t = text(&o);
        assert!(
            t.contains(&format!("probe.cvnn:{line}:")) && t.contains(&format!("(dataset sample {s})")),
            "{cmd}: {t}"
        );
    }
}

#[test]
fn sparse_confusion_counts_match_a_dense_count() {
    let mut rng = SplitMix64::new(seed::seed_for("numerics::sparse_confusion"));
    for classes in [3usize, 40] {
        let n = 200;
        let logits: Vec<f32> = (0..n * classes).map(|_| (rng.next_u64() % 1000) as f32).collect();
        let labels: Vec<i32> = (0..n).map(|_| (rng.next_u64() % classes as u64) as i32).collect();
        let mut cm = Confusion::new(classes);
        cm.add(&logits, &labels);
        let mut dense = vec![vec![0u64; classes]; classes];
        for (i, &l) in labels.iter().enumerate() {
            let row = &logits[i * classes..(i + 1) * classes];
            // First maximum, as argmax breaks ties.
            let p = (0..classes).fold(0, |b, j| if row[j] > row[b] { j } else { b });
            dense[l as usize][p] += 1;
        }
        let right: u64 = (0..classes).map(|i| dense[i][i]).sum();
        assert_eq!(cm.total(), n as u64);
        assert_eq!(cm.accuracy(), right as f64 / n as f64);
        for (t, row) in dense.iter().enumerate() {
            for (p, &c) in row.iter().enumerate() {
                assert_eq!(cm.get(t, p), c, "({t}, {p})");
            }
        }
        assert!(cm.heap_bytes() <= n * cvc_runtime::metrics::CONFUSION_ENTRY_BYTES);
        let names: Vec<String> = (0..classes).map(|i| format!("c{i}")).collect();
        let r = cm.render(&names);
        if classes <= cvc_runtime::metrics::RENDER_FULL_CLASSES {
            assert_eq!(r.lines().count(), classes + 1, "{r}");
        } else {
            assert!(r.contains("most frequent confusions") && r.contains("lowest recall"), "{r}");
        }
    }
}

/// Parses `12.3 MiB` (as `human_bytes` writes it) into bytes.
fn parse_bytes(s: &str) -> f64 {
    let mut it = s.split_whitespace();
    let x: f64 = it.next().unwrap().parse().unwrap();
    let unit = it.next().unwrap();
    let k = ["B", "KiB", "MiB", "GiB"].iter().position(|u| *u == unit).unwrap();
    x * 1024f64.powi(k as i32)
}

/// The value after `label` on its line of the memory report.
fn report_value(report: &str, label: &str) -> f64 {
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("{label}: {report}"));
    let rest = line.trim_start()[label.len()..].trim_start();
    let end = rest.find("iB").map(|i| i + 2).unwrap_or(rest.len());
    parse_bytes(&rest[..end])
}

/// Bytes the measured peak RSS may exceed planned + itemised by: the `cvc` binary's own
/// resident code and data, the allocator's slack, the compiler's graphs and the kernel
/// compilation's transient memory (measured at 20–30 MiB for a debug build).
const RUNTIME_MARGIN: f64 = 64.0 * 1024.0 * 1024.0;

#[test]
fn a_10000_class_model_peaks_within_a_margin_of_planned_plus_itemised() {
    let dir = tmp("wide");
    let src = "model Wide {
    input x: c64[B, 16]
    input label: class[B] of 10000
    logits = x |> linear(10000) |> abs
    output logits
    loss cross_entropy(logits, label)
}
train Wide {
    data      = synthetic.random(count = 48, seed = 3)
    split     = 0.75
    batch     = 12
    epochs    = 1
    optimizer = sgd(lr = 0.01)
    seed      = 2
}
";
    std::fs::write(dir.join("wide.cvnn"), src).unwrap();
    let o = cvc(&dir, &["train", "wide.cvnn", "--device", "cpu", "--out", "run"]);
    assert!(o.status.success(), "{}", text(&o));
    let report = String::from_utf8_lossy(&o.stdout).to_string();
    for item in [
        "dataset in host memory",
        "input batches",
        "metrics (confusion counts)",
        "JIT code",
        "runtime and libraries",
    ] {
        assert!(report.contains(item), "the report itemises {item}:\n{report}");
    }
    let itemised = report_value(&report, "planned + itemised");
    let measured = report_value(&report, "measured peak");
    assert!(
        measured <= itemised + RUNTIME_MARGIN,
        "measured {measured} exceeds planned + itemised {itemised} by more than the margin:\n{report}"
    );
    assert!(measured >= 0.5 * itemised, "itemised {itemised} is far above measured {measured}:\n{report}");
}

/// The scan plan of check mode covers every buffer a step writes exactly once, after the last
/// launch of the group that writes it, on the CPU's and the CUDA back end's launch lists
/// (the CUDA module is generated for the fixed H200 target: no GPU needed). A misplaced scan
/// would read a buffer before its kernel ran (a false alarm) or never (a missed NaN). A clean
/// checked CPU step finds nothing.
#[test]
fn the_scan_plan_covers_every_written_buffer_once_after_its_last_launch() {
    use cvc_compiler::back::{cpu as cpu_gen, cuda as cuda_gen};
    use cvc_compiler::ir::Mode;
    use cvc_runtime::numerics::{scan_plan, written_buffers};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("examples");
    for name in ["rf_modulation.cvnn", "complex_resnet.cvnn", "mri_recon.cvnn", "seed_cnn.cvnn"] {
        let model = Model::from_file(root.join(name)).unwrap();
        let program = model.compile(Mode::Train, 2, None).unwrap();
        let cpu = cpu_gen::generate(&program, cvc_compiler::back::clif::host_config().unwrap()).unwrap();
        let cuda = cuda_gen::generate(&program, &cvc_compiler::target::CudaTarget::h200()).unwrap();
        let lists: [(&str, Vec<Option<usize>>); 2] = [
            ("cpu", cpu.launches.iter().map(|l| Some(l.group)).collect()),
            (
                "cuda",
                cuda.steps
                    .iter()
                    .map(|s| match s {
                        cuda_gen::CudaStep::Launch(l) => Some(l.group),
                        cuda_gen::CudaStep::Zero { .. } => None,
                    })
                    .collect(),
            ),
        ];
        // A clean checked step raises no alarm (the default checks every run's first steps);
        // the convolutional examples take 6-12 s a step in a debug build, so two suffice.
        let step = matches!(name, "rf_modulation.cvnn" | "mri_recon.cvnn");
        let opts =
            SessionOptions { device: Device::Cpu, batch: 2, ..SessionOptions::from_config(model.config()) };
        if step {
            let mut session = model.session_with(&opts).unwrap();
            let data = Dataset::synthetic_random(2, seed::seed_for(name), model.inputs()).unwrap();
            let r = session.train_step_checked(&data.gather(&[0, 1]));
            assert!(r.is_ok(), "{name}: false alarm: {}", r.err().unwrap().render(None));
        }
        let expected: Vec<_> = program.order.iter().flat_map(|&g| written_buffers(&program, g)).collect();
        assert!(!expected.is_empty(), "{name}: nothing to scan");
        for (backend, groups) in lists {
            let plan = scan_plan(&program, &groups);
            let scanned: Vec<_> = plan.iter().flatten().copied().collect();
            assert_eq!(scanned, expected, "{name} on {backend}: every buffer once, in schedule order");
            for (i, after) in plan.iter().enumerate() {
                for buf in after {
                    // No later launch computes the group of a buffer scanned after launch `i`.
                    assert!(
                        !groups[i + 1..].contains(&Some(buf.group)),
                        "{name} on {backend}: group {} scanned after launch {i}, before its last launch",
                        buf.group
                    );
                }
            }
        }
    }
}
