//! Data loading: `.npz` round trips, NumPy dtype conversions, validation errors against the
//! declared inputs, the synthetic RF dataset's determinism and balance, splits and shuffles.

use cvc_compiler::ir::{DType, Dim, Shape, TensorType};
use cvc_runtime::backend::{HostData, HostTensor};
use cvc_runtime::data::npy::{self, NpyArray};
use cvc_runtime::data::synthetic_rf::{generate, RfConfig};
use cvc_runtime::data::{epoch_order, split, Dataset, InputSpec};
use std::io::Cursor;

#[path = "../../tests/src/seed.rs"]
mod seed;

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cvc-data-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn specs(len: usize, classes: usize) -> Vec<InputSpec> {
    vec![
        InputSpec {
            name: "iq".into(),
            ty: TensorType::new(DType::C64, Shape(vec![Dim::Batch, Dim::Fixed(1), Dim::Fixed(len)])),
            classes: None,
            ignore_index: None,
        },
        InputSpec {
            name: "label".into(),
            ty: TensorType::new(DType::I32, Shape(vec![Dim::Batch])),
            classes: Some(classes),
            ignore_index: None,
        },
    ]
}

fn arr(name: &str, numpy: &str, t: HostTensor) -> (String, NpyArray) {
    (name.to_string(), NpyArray { numpy_dtype: numpy.into(), tensor: t })
}

#[test]
fn npz_round_trip_keeps_dtypes_shapes_and_values() {
    let c = HostTensor {
        dtype: DType::C64,
        shape: vec![2, 3],
        data: HostData::F32((0..12).map(|i| i as f32 * 0.5 - 1.0).collect()),
    };
    let f = HostTensor { dtype: DType::F32, shape: vec![4], data: HostData::F32(vec![1.5, -2.0, 3.25, 0.0]) };
    let i = HostTensor { dtype: DType::I32, shape: vec![3], data: HostData::I32(vec![0, 7, -3]) };
    let s = HostTensor { dtype: DType::F32, shape: vec![], data: HostData::F32(vec![42.0]) };
    let path = tmp("rt").join("a.npz");
    npy::save_npz(&path, &[("c", &c), ("f", &f), ("i", &i), ("s", &s)]).unwrap();
    let back = npy::load_npz(&path).unwrap();
    let names: Vec<&str> = back.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["c", "f", "i", "s"]);
    assert_eq!(back[0].1.numpy_dtype, "complex64");
    assert_eq!(back[0].1.tensor, c);
    assert_eq!(back[1].1.tensor, f);
    assert_eq!(back[2].1.numpy_dtype, "int32");
    assert_eq!(back[2].1.tensor, i);
    assert_eq!(back[3].1.tensor, s);
}

/// A `.npy` with a given descr and raw little-endian data, as NumPy writes it.
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

#[test]
fn int64_float64_and_complex128_are_narrowed() {
    let labels: Vec<u8> = [3i64, -1, 9].iter().flat_map(|x| x.to_le_bytes()).collect();
    let a = npy::read_npy(Cursor::new(raw_npy("<i8", "(3,)", &labels))).unwrap();
    assert_eq!(a.numpy_dtype, "int64");
    assert_eq!(a.tensor.data, HostData::I32(vec![3, -1, 9]));

    let f: Vec<u8> = [0.25f64, -8.5].iter().flat_map(|x| x.to_le_bytes()).collect();
    let b = npy::read_npy(Cursor::new(raw_npy("<f8", "(2,)", &f))).unwrap();
    assert_eq!((b.numpy_dtype.as_str(), b.tensor.dtype), ("float64", DType::F32));
    assert_eq!(b.tensor.data, HostData::F32(vec![0.25, -8.5]));

    let z: Vec<u8> = [1.0f64, 2.0, -3.0, 4.5].iter().flat_map(|x| x.to_le_bytes()).collect();
    let c = npy::read_npy(Cursor::new(raw_npy("<c16", "(2,)", &z))).unwrap();
    assert_eq!(c.tensor.dtype, DType::C64);
    assert_eq!(c.tensor.data, HostData::F32(vec![1.0, 2.0, -3.0, 4.5]));

    let big: Vec<u8> = 5i32.to_be_bytes().to_vec();
    let d = npy::read_npy(Cursor::new(raw_npy(">i4", "(1,)", &big))).unwrap();
    assert_eq!(d.tensor.data, HostData::I32(vec![5]));
}

#[test]
fn bad_npy_files_give_errors_not_panics() {
    assert!(npy::read_npy(Cursor::new(b"not numpy".to_vec())).is_err());
    let short = raw_npy("<f4", "(4,)", &[0u8; 8]);
    let e = npy::read_npy(Cursor::new(short)).unwrap_err();
    assert!(e.contains("truncated"), "{e}");
    let e = npy::read_npy(Cursor::new(raw_npy("<U3", "(1,)", &[0u8; 12]))).unwrap_err();
    assert!(e.contains("unsupported"), "{e}");
    let e = npy::read_npy(Cursor::new(raw_npy("<i8", "(1,)", &(1i64 << 40).to_le_bytes()))).unwrap_err();
    assert!(e.contains("int32"), "{e}");
    let path = tmp("bad").join("junk.npz");
    std::fs::write(&path, b"PK junk").unwrap();
    let e = npy::load_npz(&path).unwrap_err();
    assert!(e.contains("junk.npz"), "{e}");
}

fn rf_arrays(n: usize, len: usize) -> Vec<(String, NpyArray)> {
    let d = generate(&RfConfig { classes: 3, length: len, snr_db: (0.0, 10.0), count: n, seed: 1 }).unwrap();
    vec![arr("iq", "complex64", d.iq), arr("label", "int32", d.label)]
}

#[test]
fn validation_accepts_matching_arrays() {
    let d = Dataset::from_arrays(rf_arrays(10, 16), &specs(16, 3), "d.npz").unwrap();
    assert_eq!(d.len, 10);
    let b = d.gather(&[3, 0]);
    assert_eq!(b[0].1.shape, vec![2, 1, 16]);
    assert_eq!(b[1].1.data, HostData::I32(vec![0, 0]));
    let full = d.array("iq").unwrap().f32s();
    assert_eq!(&b[0].1.f32s()[..32], &full[3 * 32..4 * 32]);
}

#[test]
fn validation_names_missing_arrays() {
    let mut a = rf_arrays(4, 16);
    a.retain(|(n, _)| n != "label");
    a.push(arr("y", "int32", HostTensor::zeros(DType::I32, &[4])));
    let e = Dataset::from_arrays(a, &specs(16, 3), "d.npz").unwrap_err();
    assert!(e.contains("d.npz") && e.contains("'label'") && e.contains("class[B] of 3"), "{e}");
    assert!(e.contains("has: iq, y"), "{e}");
}

#[test]
fn validation_names_array_expected_and_found() {
    // Wrong dtype: float32 where complex64 is declared.
    let mut a = rf_arrays(4, 16);
    a[0] = arr("iq", "float32", HostTensor::zeros(DType::F32, &[4, 1, 16]));
    let e = Dataset::from_arrays(a, &specs(16, 3), "d.npz").unwrap_err();
    assert!(
        e.contains("'iq'") && e.contains("complex64 [N, 1, 16]") && e.contains("found float32 [4, 1, 16]"),
        "{e}"
    );
    // Wrong shape.
    let mut a = rf_arrays(4, 16);
    a[0] = arr("iq", "complex64", HostTensor::zeros(DType::C64, &[4, 2, 16]));
    let e = Dataset::from_arrays(a, &specs(16, 3), "d.npz").unwrap_err();
    assert!(e.contains("found complex64 [4, 2, 16]"), "{e}");
    // Sample counts disagree.
    let mut a = rf_arrays(4, 16);
    a[1] = arr("label", "int64", HostTensor::zeros(DType::I32, &[5]));
    let e = Dataset::from_arrays(a, &specs(16, 3), "d.npz").unwrap_err();
    assert!(e.contains("5 samples") && e.contains("4"), "{e}");
    // A label outside the classes.
    let mut a = rf_arrays(4, 16);
    a[1] = arr(
        "label",
        "int64",
        HostTensor { dtype: DType::I32, shape: vec![4], data: HostData::I32(vec![0, 1, 3, 2]) },
    );
    let e = Dataset::from_arrays(a, &specs(16, 3), "d.npz").unwrap_err();
    assert!(e.contains("label 3 at index 2") && e.contains("0..3"), "{e}");
}

#[test]
fn synthetic_rf_is_deterministic_balanced_and_normalised() {
    let seed = seed::seed_for("data::synthetic_rf_is_deterministic_balanced_and_normalised");
    let cfg = RfConfig { classes: 5, length: 128, snr_db: (0.0, 20.0), count: 103, seed };
    let a = generate(&cfg).unwrap();
    let b = generate(&cfg).unwrap();
    assert_eq!(a, b);
    let c = generate(&RfConfig { seed: seed + 1, ..cfg.clone() }).unwrap();
    assert_ne!(a.iq, c.iq);
    // A longer dataset starts with the same bursts: burst i depends on (seed, i) only.
    let d = generate(&RfConfig { count: 110, ..cfg.clone() }).unwrap();
    assert_eq!(&d.iq.f32s()[..a.iq.f32s().len()], a.iq.f32s());
    assert_eq!(a.iq.shape, vec![103, 1, 128]);
    let HostData::I32(labels) = &a.label.data else { panic!("labels are i32") };
    let mut counts = [0usize; 5];
    for &l in labels {
        counts[l as usize] += 1;
    }
    assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1, "{counts:?}");
    // Unit signal power plus noise: mean power between 1 and 2 (SNR ≥ 0 dB).
    let v = a.iq.f32s();
    let power: f64 = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / (103.0 * 128.0);
    assert!((1.0..2.0).contains(&power), "{power}");
    assert!(v.iter().all(|x| x.is_finite()));
}

#[test]
fn synthetic_rf_rejects_bad_settings() {
    let ok = RfConfig { classes: 5, length: 64, snr_db: (0.0, 20.0), count: 10, seed: 0 };
    assert!(generate(&RfConfig { classes: 9, ..ok.clone() }).unwrap_err().contains("classes"));
    assert!(generate(&RfConfig { count: 0, ..ok.clone() }).unwrap_err().contains("count"));
    assert!(generate(&RfConfig { snr_db: (10.0, 0.0), ..ok.clone() }).unwrap_err().contains("snr_db"));
    assert!(generate(&RfConfig { length: 2, ..ok }).unwrap_err().contains("length"));
}

#[test]
fn split_and_epoch_order_are_seeded_partitions() {
    let s = split(100, 0.9, 3);
    assert_eq!((s.train.len(), s.val.len()), (90, 10));
    let mut all: Vec<usize> = s.train.iter().chain(&s.val).copied().collect();
    all.sort();
    assert_eq!(all, (0..100).collect::<Vec<_>>());
    assert_eq!(s, split(100, 0.9, 3));
    assert_ne!(s, split(100, 0.9, 4));
    let e0 = epoch_order(&s.train, 3, 0);
    assert_eq!(e0, epoch_order(&s.train, 3, 0));
    assert_ne!(e0, epoch_order(&s.train, 3, 1));
    let mut sorted = e0.clone();
    sorted.sort();
    let mut t = s.train.clone();
    t.sort();
    assert_eq!(sorted, t);
}

#[test]
fn synthetic_random_follows_the_inputs() {
    let d = Dataset::synthetic_random(20, 9, &specs(8, 4)).unwrap();
    assert_eq!(d.len, 20);
    assert_eq!(d.arrays[0].1.shape, vec![20, 1, 8]);
    let HostData::I32(l) = &d.arrays[1].1.data else { panic!() };
    assert!(l.iter().all(|&x| (0..4).contains(&x)));
    assert_eq!(d, Dataset::synthetic_random(20, 9, &specs(8, 4)).unwrap());
}

#[test]
fn synthetic_rf_bursts_are_independent() {
    // Noise-dominated bursts of one class: a burst must not be a shifted copy of another.
    let cfg = RfConfig { classes: 2, length: 256, snr_db: (-40.0, -40.0), count: 12, seed: 3 };
    let d = generate(&cfg).unwrap();
    let v = d.iq.f32s();
    let burst = |i: usize| &v[i * 512..(i + 1) * 512];
    for i in 0..10 {
        for j in [i + 2, i + 1] {
            if j >= 12 {
                continue;
            }
            let (a, b) = (burst(i), burst(j));
            for shift in 0..128 {
                let n = 512 - shift;
                let dot: f64 = (0..n).map(|k| a[k + shift] as f64 * b[k] as f64).sum();
                let na: f64 = (0..n).map(|k| (a[k + shift] as f64).powi(2)).sum();
                let nb: f64 = (0..n).map(|k| (b[k] as f64).powi(2)).sum();
                let c = dot / (na * nb).sqrt();
                assert!(c.abs() < 0.5, "bursts {i} and {j} correlate ({c:.3}) at shift {shift}");
            }
        }
    }
}

/// Gathering into an earlier batch's buffers gives the same tensors as a fresh gather, keeps
/// those buffers (no new allocation), and ignores buffers of another layout.
#[test]
fn gather_reusing_equals_gather_and_keeps_the_buffers() {
    let d = Dataset::synthetic_random(40, 9, &specs(16, 4)).unwrap();
    let a: Vec<usize> = vec![3, 17, 0, 25, 8];
    let b: Vec<usize> = vec![39, 1, 12, 30, 22];
    let first = d.gather(&a);
    let ptr = |batch: &[(String, HostTensor)]| match &batch[0].1.data {
        HostData::F32(v) => v.as_ptr() as usize,
        HostData::I32(v) => v.as_ptr() as usize,
    };
    let before = ptr(&first);
    let again = d.gather_reusing(&b, Some(first));
    assert_eq!(again, d.gather(&b));
    assert_eq!(ptr(&again), before, "the earlier batch's buffer is reused");
    // A batch of other inputs (swapped order) is not reused, and the result is still right.
    let mut swapped = d.gather(&a);
    swapped.reverse();
    assert_eq!(d.gather_reusing(&b, Some(swapped)), d.gather(&b));
}
