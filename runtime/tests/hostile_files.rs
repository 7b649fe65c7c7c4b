//! Hostile and corrupt inputs through the `cvc` binary: `.npz` files whose headers declare
//! more than they hold (2^62 labels, overflowing shapes, truncated data), wrong dtypes, a
//! deflate bomb, FIFOs, devices and directories where files belong, corrupt safetensors,
//! and sizes from flags and the language past the data limit. Every case must end with exit
//! code 1 and a message that names the file, the array or tensor, and the numbers, never
//! with a panic (101), an abort or a hang. The files are generated here, from seeded data.

use cvc_compiler::ir::DType;
use cvc_runtime::backend::{HostData, HostTensor};
use cvc_runtime::checkpoint;
use cvc_runtime::data::npy;
use npyz::zip;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "../../tests/src/seed.rs"]
mod seed;

/// A model that trains from `data.npz` (8 complex features, 3 classes).
const TINY: &str = "model Tiny {
    input x: c64[B, 8]
    input label: class[B] of 3
    logits = x |> linear(8) |> crelu |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}
train Tiny {
    data      = npz(\"data.npz\")
    split     = 0.75
    batch     = 8
    epochs    = 1
    optimizer = sgd(lr = 0.05)
    seed      = 2
}
";

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cvc-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `cvc` in `dir` with a deadline: a hang (a FIFO read) fails the test instead of
/// blocking CI.
fn cvc(dir: &Path, args: &[&str]) -> Output {
    cvc_env(dir, args, &[])
}

fn cvc_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cvc"))
        .current_dir(dir)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("cvc {args:?} still running after 60 s (a hang?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Asserts exit code 1 and that the output holds every `needle`.
fn fails_with(o: &Output, needles: &[&str]) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(1), "expected exit code 1, got {:?}:\n{t}", o.status);
    assert!(!t.contains("panicked"), "{t}");
    for n in needles {
        assert!(t.contains(n), "missing `{n}` in:\n{t}");
    }
}

/// `.npy` bytes with a hand-written header (any descr and shape text) and raw data.
fn raw_npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.div_ceil(64) * 64 - total));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Writes an `.npz` of raw members (`name.npy`, bytes), stored or deflated.
fn write_npz(path: &Path, members: &[(&str, Vec<u8>)], deflate: bool) {
    let f = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let method = if deflate { zip::CompressionMethod::Deflated } else { zip::CompressionMethod::Stored };
    let opts = zip::write::FileOptions::default().compression_method(method).large_file(true);
    for (name, bytes) in members {
        z.start_file(format!("{name}.npy"), opts).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}

/// `n` samples of seeded random features and labels for [`TINY`].
fn good_arrays(n: usize) -> (HostTensor, HostTensor) {
    let mut rng = cvc_compiler::init::SplitMix64::new(seed::seed_for("hostile_files::good_arrays"));
    let x = HostTensor {
        dtype: DType::C64,
        shape: vec![n, 8],
        data: HostData::F32((0..n * 16).map(|_| rng.normal() as f32).collect()),
    };
    let label = HostTensor {
        dtype: DType::I32,
        shape: vec![n],
        data: HostData::I32((0..n).map(|i| (i % 3) as i32).collect()),
    };
    (x, label)
}

fn x_npy(n: usize) -> Vec<u8> {
    npy::npy_bytes(&good_arrays(n).0)
}

/// A folder with `tiny.cvnn` and `data.npz` made of `members`.
fn setup(name: &str, members: &[(&str, Vec<u8>)], deflate: bool) -> PathBuf {
    let dir = tmp(name);
    std::fs::write(dir.join("tiny.cvnn"), TINY).unwrap();
    write_npz(&dir.join("data.npz"), members, deflate);
    dir
}

/// `train`, `run` and `eval` all read `data.npz` and must fail on it the same way.
fn all_commands_fail(dir: &Path, needles: &[&str]) {
    for args in [
        vec!["train", "tiny.cvnn", "--device", "cpu", "--out", "run", "-q"],
        vec!["run", "tiny.cvnn", "--weights", "w.safetensors", "--data", "data.npz", "--device", "cpu"],
        vec!["eval", "tiny.cvnn", "--weights", "w.safetensors", "--data", "data.npz", "--device", "cpu"],
    ] {
        let o = cvc(dir, &args);
        fails_with(&o, needles);
    }
}

#[test]
fn labels_of_2_pow_62_elements_without_data_are_refused_before_allocation() {
    // int8 labels: 2^62 bytes, under 2^64 but far over the data limit.
    let label = raw_npy("<i1", "(4611686018427387904,)", &[]);
    let dir = setup("huge-labels", &[("x", x_npy(16)), ("label", label)], false);
    all_commands_fail(
        &dir,
        &["data.npz", "'label'", "4611686018427387904", "data limit", "CVC_MAX_DATA_BYTES"],
    );
    let run = ["run", "tiny.cvnn", "--weights", "w.safetensors", "--data", "data.npz", "--device", "cpu"];
    // Under a raised limit the same header is still refused: the file holds no data.
    let o = cvc_env(&dir, &run, &[("CVC_MAX_DATA_BYTES", "8000000000000000000")]);
    fails_with(&o, &["'label'", "truncated", "declares 4611686018427387904 data bytes", "only 0"]);
    // A limit that does not parse is an error naming the variable.
    let o = cvc_env(&dir, &run, &[("CVC_MAX_DATA_BYTES", "lots")]);
    fails_with(&o, &["CVC_MAX_DATA_BYTES=lots"]);
    // int64 labels: 2^65 bytes overflow u64 and are refused as such.
    let label = raw_npy("<i8", "(4611686018427387904,)", &[]);
    let dir = setup("huge-labels-64", &[("x", x_npy(16)), ("label", label)], false);
    all_commands_fail(&dir, &["data.npz", "'label'", "(4611686018427387904)", "16 EiB"]);
}

#[test]
fn shapes_whose_element_count_overflows_are_errors() {
    let x = raw_npy("<c8", "(4294967296, 4294967296, 8)", &[0u8; 64]);
    let dir = setup("overflow", &[("x", x), ("label", npy::npy_bytes(&good_arrays(16).1))], false);
    all_commands_fail(&dir, &["data.npz", "'x'", "(4294967296, 4294967296, 8)", "16 EiB"]);
}

#[test]
fn truncated_arrays_name_the_declared_and_present_bytes() {
    let mut x = x_npy(16);
    x.truncate(x.len() - 40);
    let dir = setup("truncated", &[("x", x), ("label", npy::npy_bytes(&good_arrays(16).1))], false);
    all_commands_fail(&dir, &["data.npz", "'x'", "truncated", "declares 1024 data bytes", "only 984"]);
}

#[test]
fn wrong_dtypes_name_the_array_and_both_types() {
    let labels: Vec<u8> = (0..16).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let dir = setup("dtype", &[("x", x_npy(16)), ("label", raw_npy("<f4", "(16,)", &labels))], false);
    all_commands_fail(&dir, &["data.npz", "'label'", "int32/int64", "float32"]);
    let dir =
        setup("text-dtype", &[("x", x_npy(16)), ("label", raw_npy("<U3", "(16,)", &[0u8; 192]))], false);
    all_commands_fail(&dir, &["data.npz", "'label'", "unsupported dtype"]);
}

/// A real deflate bomb: 96 MiB of zeros that compress to ~100 KB (ratio ~1000). It is refused
/// from its header, before the member is inflated, with the member and the limit named; a
/// raised ratio lets the same (genuine) file through to the shape check.
#[test]
fn a_deflate_bomb_stops_at_its_header() {
    let n = 96 << 20 >> 3; // complex64 elements of 96 MiB
    let bomb = raw_npy("<c8", &format!("({}, 8)", n / 8), &vec![0u8; n * 8]);
    let dir = setup("bomb", &[("x", bomb), ("label", npy::npy_bytes(&good_arrays(16).1))], true);
    let compressed = std::fs::metadata(dir.join("data.npz")).unwrap().len();
    assert!(compressed < 1 << 20, "the bomb should be small: {compressed} bytes");
    let start = Instant::now();
    all_commands_fail(&dir, &["data.npz", "'x' (x.npy)", "zip bomb", "at most 100x", "CVC_NPZ_MAX_RATIO"]);
    assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
    let o = cvc_env(
        &dir,
        &["run", "tiny.cvnn", "--weights", "w.safetensors", "--data", "data.npz", "--device", "cpu"],
        &[("CVC_NPZ_MAX_RATIO", "5000")],
    );
    // Past the decompression check, the 96 MiB array is read and validated: 1572864 samples
    // of x but 16 labels.
    fails_with(&o, &["'label' has 16 samples", "1572864"]);
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    let ok = Command::new("mkfifo").arg(path).status().unwrap().success();
    assert!(ok, "mkfifo {}", path.display());
}

/// FIFOs, devices and directories are refused for every file the CLI reads, without
/// blocking on them or reading them.
#[cfg(unix)]
#[test]
fn paths_that_are_not_regular_files_are_refused() {
    let dir = tmp("special");
    std::fs::write(dir.join("tiny.cvnn"), TINY.replace("data.npz", "fifo.npz")).unwrap();
    mkfifo(&dir.join("fifo.npz"));
    mkfifo(&dir.join("fifo.cvnn"));
    mkfifo(&dir.join("fifo.safetensors"));
    std::fs::create_dir_all(dir.join("folder.cvnn")).unwrap();
    write_npz(
        &dir.join("good.npz"),
        &[("x", x_npy(16)), ("label", npy::npy_bytes(&good_arrays(16).1))],
        false,
    );

    let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cpu", "--out", "run", "-q"]);
    fails_with(&o, &["fifo.npz", "FIFO"]);
    for cmd in ["run", "eval"] {
        let o = cvc(
            &dir,
            &[cmd, "tiny.cvnn", "--weights", "w.safetensors", "--data", "fifo.npz", "--device", "cpu"],
        );
        fails_with(&o, &["fifo.npz", "FIFO"]);
        let o =
            cvc(&dir, &[cmd, "tiny.cvnn", "--weights", "/dev/zero", "--data", "good.npz", "--device", "cpu"]);
        fails_with(&o, &["/dev/zero", "character device"]);
        let o = cvc(
            &dir,
            &[cmd, "tiny.cvnn", "--weights", "fifo.safetensors", "--data", "good.npz", "--device", "cpu"],
        );
        fails_with(&o, &["fifo.safetensors", "FIFO"]);
        let o = cvc(&dir, &[cmd, "tiny.cvnn", "--weights", ".", "--data", "good.npz", "--device", "cpu"]);
        fails_with(&o, &["directory"]);
    }
    for cmd in ["check", "plan", "train"] {
        let o = cvc(&dir, &[cmd, "fifo.cvnn"]);
        fails_with(&o, &["fifo.cvnn", "not a regular file"]);
        let o = cvc(&dir, &[cmd, "folder.cvnn"]);
        fails_with(&o, &["folder.cvnn", "directory"]);
        let o = cvc(&dir, &[cmd, "/dev/zero"]);
        fails_with(&o, &["/dev/zero"]);
    }
}

/// Safetensors headers that declare more than the file holds, sizes that overflow, byte
/// ranges that disagree with the shape, and tensors whose shape is not the model's: each
/// error names the tensor.
#[test]
fn corrupt_weights_name_the_tensor() {
    let dir = setup("weights", &[("x", x_npy(16)), ("label", npy::npy_bytes(&good_arrays(16).1))], false);
    let o = cvc(&dir, &["train", "tiny.cvnn", "--device", "cpu", "--out", "run", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let good = std::fs::read(dir.join("run/last.safetensors")).unwrap();
    let ck = checkpoint::load(&dir.join("run/last.safetensors")).unwrap();
    let (pname, p) = ck.tensors.iter().find(|(_, t)| t.dtype == DType::C64).expect("a complex parameter");

    let run = |file: &str| {
        cvc(&dir, &["run", "tiny.cvnn", "--weights", file, "--data", "data.npz", "--device", "cpu"])
    };
    // Cut off the last 100 bytes: the last tensor's range runs past the end.
    std::fs::write(dir.join("cut.safetensors"), &good[..good.len() - 100]).unwrap();
    fails_with(&run("cut.safetensors"), &["cut.safetensors", "tensor '", "truncated"]);
    // A header length past the end of the file.
    let mut bad = good.clone();
    bad[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(dir.join("len.safetensors"), &bad).unwrap();
    fails_with(&run("len.safetensors"), &["len.safetensors", "header declares 18446744073709551615 bytes"]);
    // Hand-made headers: an overflowing shape, and a shape that disagrees with its range.
    let header = |json: &str| {
        let mut b = (json.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(json.as_bytes());
        b.extend_from_slice(&[0u8; 16]);
        b
    };
    std::fs::write(
        dir.join("huge.safetensors"),
        header(r#"{"w":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,16]}}"#),
    )
    .unwrap();
    fails_with(&run("huge.safetensors"), &["tensor 'w'", "16 EiB"]);
    std::fs::write(
        dir.join("range.safetensors"),
        header(r#"{"w":{"dtype":"F32","shape":[1000],"data_offsets":[0,16]}}"#),
    )
    .unwrap();
    fails_with(&run("range.safetensors"), &["tensor 'w'", "declares 4000 bytes", "span 16"]);
    // A well-formed file whose parameter has the wrong shape for the model.
    let mut tensors: Vec<(String, HostTensor)> = ck.tensors.clone().into_iter().collect();
    for (n, t) in &mut tensors {
        if n == pname {
            let mut shape = p.shape.clone();
            shape[0] += 1;
            let len = shape.iter().product::<usize>() * 2;
            *t = HostTensor { dtype: DType::C64, shape, data: HostData::F32(vec![0.5; len]) };
        }
    }
    checkpoint::save(&dir.join("shape.safetensors"), &tensors, &Default::default()).unwrap();
    fails_with(&run("shape.safetensors"), &[&format!("tensor '{pname}'"), "the model expects"]);
}

/// Sample counts from flags and the language past the data limit are errors (exit 1), not
/// allocation aborts; a batch larger than the training set is reported before compiling.
#[test]
fn counts_from_flags_and_the_language_are_bounded() {
    let dir = tmp("counts");
    for args in [
        vec!["data", "rf", "--out", "d.npz", "--count", "1000000000000"],
        vec!["data", "rf", "--out", "d.npz", "--count", "18446744073709551615"],
        vec!["data", "rf", "--out", "d.npz", "--length", "18446744073709551615"],
    ] {
        let o = cvc(&dir, &args);
        fails_with(&o, &["synthetic.rf", "data limit", "CVC_MAX_DATA_BYTES"]);
        assert!(!dir.join("d.npz").exists());
    }
    let src = TINY.replace("npz(\"data.npz\")", "synthetic.random(count = 99999999999999)");
    std::fs::write(dir.join("big.cvnn"), &src).unwrap();
    let line = src.lines().position(|l| l.contains("99999999999999")).unwrap() + 1;
    let col = src.lines().nth(line - 1).unwrap().find("count").unwrap() + 1;
    for cmd in ["check", "train"] {
        let o = cvc(&dir, &[cmd, "big.cvnn"]);
        fails_with(&o, &[&format!("big.cvnn:{line}:{col}"), "99999999999999 samples", "data limit"]);
    }
    // A lower limit applies to `cvc check` as well.
    let small = TINY.replace("npz(\"data.npz\")", "synthetic.random(count = 5000)");
    std::fs::write(dir.join("small.cvnn"), &small).unwrap();
    let o = cvc_env(&dir, &["check", "small.cvnn"], &[("CVC_MAX_DATA_BYTES", "100KiB")]);
    fails_with(&o, &["5000 samples of 68 B", "100.0 KiB"]);
    let o = cvc(&dir, &["check", "small.cvnn"]);
    assert!(o.status.success(), "{}", text(&o));

    let o =
        cvc(&dir, &["train", "small.cvnn", "--device", "cpu", "--batch", "20000000", "--out", "run", "-q"]);
    fails_with(&o, &["fewer than one batch of 20000000"]);
}

/// The library entry points refuse the same headers (no CLI in between).
#[test]
fn npy_headers_are_checked_before_reading_data() {
    // A format-2 header that declares 4 GiB of header text.
    let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
    v2.extend_from_slice(&u32::MAX.to_le_bytes());
    let e = npy::read_npy(std::io::Cursor::new(v2)).unwrap_err();
    assert!(e.contains("header declares 4294967295 bytes"), "{e}");
    let e = npy::read_npy_limited(
        std::io::Cursor::new(raw_npy("<f4", "(1000,)", &[0u8; 4000])),
        npy::ReadLimits::bytes(3999),
    )
    .unwrap_err();
    assert!(e.contains("declares 3.9 KiB (4000 bytes)") && e.contains("3.9 KiB"), "{e}");
    let ok = npy::read_npy_limited(
        std::io::Cursor::new(raw_npy("<f4", "(1000,)", &[0u8; 4000])),
        npy::ReadLimits::bytes(4000),
    )
    .unwrap();
    assert_eq!(ok.tensor.shape, vec![1000]);
}

/// Many compressed members, each under the ratio-free size, are limited together: the
/// archive's compressed members may not expand past the ratio either.
#[test]
fn many_small_bombs_are_limited_together() {
    let n = 40 << 20; // bytes of zeros per member
    let member = raw_npy("|u1", &format!("({n},)"), &vec![0u8; n]);
    let dir = tmp("small-bombs");
    let path = dir.join("many.npz");
    write_npz(&path, &[("a", member.clone()), ("b", member.clone()), ("c", member)], true);
    let f = std::fs::File::open(&path).unwrap();
    let e = npy::read_npz_limited(std::io::BufReader::new(f), 1 << 40, 100).unwrap_err();
    assert!(
        e.starts_with("array 'b' (b.npy)") && e.contains("zip bomb") && e.contains("at most 100x"),
        "{e}"
    );
    // One such member alone is accepted (under the ratio-free 64 MiB).
    let one = dir.join("one.npz");
    write_npz(&one, &[("a", raw_npy("|u1", &format!("({n},)"), &vec![0u8; n]))], true);
    let f = std::fs::File::open(&one).unwrap();
    let arrays = npy::read_npz_limited(std::io::BufReader::new(f), 1 << 40, 100).unwrap();
    assert_eq!(arrays[0].1.tensor.shape, vec![n]);
}
