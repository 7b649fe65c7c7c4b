//! Checkpoints: safetensors round trip, PyTorch's `view_as_real` layout for complex tensors,
//! atomic replacement, shape conformance errors, and the learning-rate schedules.

use cvc_compiler::front::train::Schedule;
use cvc_compiler::ir::DType;
use cvc_runtime::backend::{HostData, HostTensor};
use cvc_runtime::checkpoint::{self, conform};
use cvc_runtime::train::lr_at;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cvc-ckpt-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sample() -> Vec<(String, HostTensor)> {
    vec![
        (
            "dense.weight".into(),
            HostTensor {
                dtype: DType::C64,
                shape: vec![2, 2],
                data: HostData::F32(vec![1.0, -1.0, 2.0, 0.5, 3.0, 0.0, -4.0, 8.0]),
            },
        ),
        (
            "norm.running_var".into(),
            HostTensor { dtype: DType::F32, shape: vec![3], data: HostData::F32(vec![0.1, 0.2, 0.3]) },
        ),
        ("step".into(), HostTensor { dtype: DType::I32, shape: vec![], data: HostData::I32(vec![17]) }),
    ]
}

#[test]
fn round_trip_with_metadata() {
    let dir = tmp("rt");
    let path = dir.join("last.safetensors");
    let mut meta = BTreeMap::new();
    meta.insert("epoch".to_string(), "3".to_string());
    checkpoint::save(&path, &sample(), &meta).unwrap();
    let ck = checkpoint::load(&path).unwrap();
    assert_eq!(ck.meta("epoch"), Some("3"));
    assert_eq!(ck.metadata.get(checkpoint::COMPLEX_KEY), None);
    for (name, t) in sample() {
        assert_eq!(ck.get(&name, &path).unwrap(), &t, "{name}");
    }
    let e = ck.get("nope", &path).unwrap_err();
    assert!(e.contains("nope") && e.contains("last.safetensors"), "{e}");
}

#[test]
fn complex_tensors_use_the_view_as_real_layout() {
    let bytes = checkpoint::to_bytes(&sample(), &BTreeMap::new()).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w = st.tensor("dense.weight").unwrap();
    assert_eq!(w.dtype(), safetensors::Dtype::F32);
    assert_eq!(w.shape(), &[2, 2, 2]);
    let vals: Vec<f32> =
        w.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    // [i, j, 0] is the real part and [i, j, 1] the imaginary part of element (i, j).
    assert_eq!(vals, vec![1.0, -1.0, 2.0, 0.5, 3.0, 0.0, -4.0, 8.0]);
    let s = st.tensor("step").unwrap();
    assert_eq!((s.dtype(), s.shape()), (safetensors::Dtype::I32, &[][..]));
}

#[test]
fn foreign_real_layout_conforms_to_a_complex_leaf() {
    let path = PathBuf::from("torch.safetensors");
    let t =
        HostTensor { dtype: DType::F32, shape: vec![2, 2], data: HostData::F32(vec![1.0, 2.0, 3.0, 4.0]) };
    let c = conform(&t, DType::C64, &[2], "w", &path).unwrap();
    assert_eq!((c.dtype, c.shape.clone()), (DType::C64, vec![2]));
    assert_eq!(c.data, t.data);
    let e = conform(&t, DType::C64, &[3], "w", &path).unwrap_err();
    assert!(e.contains("torch.safetensors") && e.contains("'w'") && e.contains("[3]"), "{e}");
}

#[test]
fn atomic_write_replaces_and_leaves_no_temporaries() {
    let dir = tmp("atomic");
    let path = dir.join("last.safetensors");
    std::fs::write(&path, b"old contents").unwrap();
    checkpoint::save(&path, &sample(), &BTreeMap::new()).unwrap();
    assert!(checkpoint::load(&path).is_ok());
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["last.safetensors".to_string()]);
    // A failed write (missing folder) reports the path and leaves the old file alone.
    let bad = dir.join("missing").join("x.safetensors");
    let e = checkpoint::save(&bad, &sample(), &BTreeMap::new()).unwrap_err();
    assert!(e.contains("missing"), "{e}");
    assert!(checkpoint::load(&path).is_ok());
}

#[test]
fn corrupt_files_are_errors() {
    let dir = tmp("corrupt");
    let path = dir.join("bad.safetensors");
    std::fs::write(&path, b"\x10\0\0\0\0\0\0\0{not json}").unwrap();
    let e = checkpoint::load(&path).unwrap_err();
    assert!(e.contains("bad.safetensors"), "{e}");
    let e = checkpoint::load(&dir.join("absent.safetensors")).unwrap_err();
    assert!(e.contains("absent.safetensors"), "{e}");
}

#[test]
fn schedules_follow_their_formulas() {
    let c = Schedule::Constant;
    assert_eq!(lr_at(&c, 0.1, 5, 10), 0.1);
    let s = Schedule::Step { every: 3, gamma: 0.5 };
    let got: Vec<f64> = (0..7).map(|e| lr_at(&s, 1.0, e, 7)).collect();
    assert_eq!(got, vec![1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]);
    let cos = Schedule::Cosine { min_lr: 0.0 };
    assert_eq!(lr_at(&cos, 1.0, 0, 4), 1.0);
    assert!((lr_at(&cos, 1.0, 2, 4) - 0.5).abs() < 1e-12);
    // PyTorch CosineAnnealingLR(T_max=4) at epoch 1: (1 + cos(π/4)) / 2.
    assert!((lr_at(&cos, 1.0, 1, 4) - 0.853_553_390_593_273_8).abs() < 1e-12);
    let floor = Schedule::Cosine { min_lr: 0.1 };
    assert!((lr_at(&floor, 1.0, 4, 4) - 0.1).abs() < 1e-12);
}
