//! Compiles every generated CUDA kernel of every example and `ok` fixture with the real NVRTC
//! for sm_90 (no GPU needed). Skips when NVRTC cannot be loaded, unless `CVC_REQUIRE_NVRTC=1`.

use cvc_compiler::back::cuda;
use cvc_compiler::config::Precision;
use cvc_compiler::front::check_source;
use cvc_compiler::ir::Mode;
use cvc_compiler::passes::pipeline::{compile, Options};
use std::path::{Path, PathBuf};

fn nvrtc_or_skip() -> bool {
    match cvc_runtime::cuda::nvrtc_version() {
        Ok((major, minor)) => {
            eprintln!("NVRTC {major}.{minor}");
            true
        }
        Err(why) => {
            if std::env::var("CVC_REQUIRE_NVRTC").as_deref() == Ok("1") {
                panic!("CVC_REQUIRE_NVRTC=1 but NVRTC is unavailable: {why}");
            }
            eprintln!("skipping: {why}");
            false
        }
    }
}

fn cvnn_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
    let mut files = Vec::new();
    for dir in [root.join("examples"), root.join("tests/fixtures/ok")] {
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "cvnn") {
                    files.push(p);
                }
            }
        }
    }
    files.sort();
    files
}

/// Each model in train and eval mode, at a batch that exercises the batch-dependent
/// constants, generated and compiled as one module per program.
#[test]
fn every_generated_kernel_compiles_with_nvrtc_for_sm90() {
    if !nvrtc_or_skip() {
        return;
    }
    let files = cvnn_files();
    assert!(!files.is_empty(), "no .cvnn files found under examples/ or tests/fixtures/ok/");
    let mut compiled = 0;
    for path in &files {
        let src = std::fs::read_to_string(path).expect("readable .cvnn");
        let name = path.display().to_string();
        for mode in [Mode::Train, Mode::Eval] {
            let checked = match check_source(&name, &src, mode) {
                Ok(c) => c,
                Err(d) => panic!("{name} ({mode:?}) does not check: {d:?}"),
            };
            if mode == Mode::Train && checked.graph.loss.is_none() {
                continue; // no loss: nothing to train, the eval program covers the model
            }
            let opts = Options { batch: 3, optimizer: checked.train.optimizer.clone(), ..Options::default() };
            let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name} ({mode:?}): {e}"));
            let module = cuda::generate(&program, Precision::Fp32)
                .unwrap_or_else(|e| panic!("{name} ({mode:?}): {e}"));
            assert!(!module.kernels.is_empty(), "{name}: no kernels generated");
            let cubin = cvc_runtime::cuda::compile_cubin(&module.source, "sm_90")
                .unwrap_or_else(|e| panic!("{name} ({mode:?}): {e}"));
            assert!(cubin.starts_with(b"\x7fELF"), "{name}: NVRTC's cubin is not an ELF image");
            for k in &module.kernels {
                let needle = format!("{k}\0");
                assert!(
                    cubin.windows(needle.len()).any(|w| w == needle.as_bytes()),
                    "{name}: kernel {k} missing from the cubin"
                );
            }
            eprintln!("{name} ({mode:?}): {} kernels, {} bytes of cubin", module.kernels.len(), cubin.len());
            compiled += 1;
        }
    }
    assert!(compiled >= files.len(), "every file compiles at least one program");
}

/// The TF32 tensor-core contraction kernels of every example compile too.
#[test]
fn tf32_kernels_compile_with_nvrtc_for_sm90() {
    if !nvrtc_or_skip() {
        return;
    }
    for path in cvnn_files().iter().filter(|p| p.parent().is_some_and(|d| d.ends_with("examples"))) {
        let src = std::fs::read_to_string(path).expect("readable .cvnn");
        let name = path.display().to_string();
        let checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        let opts = Options { batch: 5, optimizer: checked.train.optimizer.clone(), ..Options::default() };
        let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let module = cuda::generate(&program, Precision::Tf32).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(module.source.contains("mma.sync"), "{name}: no tensor-core kernel generated");
        let cubin = cvc_runtime::cuda::compile_cubin(&module.source, "sm_90")
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(cubin.starts_with(b"\x7fELF"), "{name}: NVRTC's cubin is not an ELF image");
    }
}

/// The unfused baseline (one kernel per node) also compiles: every op's kernel on its own.
#[test]
fn unfused_kernels_compile_with_nvrtc() {
    if !nvrtc_or_skip() {
        return;
    }
    for path in cvnn_files() {
        let src = std::fs::read_to_string(&path).expect("readable .cvnn");
        let name = path.display().to_string();
        let mut checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        if checked.graph.loss.is_none() {
            checked = check_source(&name, &src, Mode::Eval).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        }
        let opts = Options {
            batch: 2,
            fuse: false,
            optimizer: checked.train.optimizer.clone(),
            ..Options::default()
        };
        let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let source = cuda::emit_source(&program).unwrap_or_else(|e| panic!("{name}: {e}"));
        cvc_runtime::cuda::compile_ptx(&source, "sm_90").unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// The on-disk cache: the first start compiles, a second start with the same source, arch
/// and NVRTC version reads the cubin back instead of compiling.
#[test]
fn second_start_is_a_cache_hit() {
    if !nvrtc_or_skip() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("cvc-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Only this test reads CVC_CACHE_DIR in this binary.
    std::env::set_var("CVC_CACHE_DIR", &dir);
    let nonce =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let src = format!("// {nonce}\nextern \"C\" __global__ void k(float* x) {{ x[threadIdx.x] *= 2.0f; }}\n");
    let (first, info1) = cvc_runtime::cuda::cached_cubin(&src, "sm_90", 1).expect("compile");
    assert!(!info1.cache_hit, "a fresh cache directory cannot hit");
    let (second, info2) = cvc_runtime::cuda::cached_cubin(&src, "sm_90", 1).expect("cache read");
    assert!(info2.cache_hit, "the second start recompiled: {info2}");
    assert_eq!(first, second);
    assert_eq!(info1.cache_path, info2.cache_path);
    let (_, info3) =
        cvc_runtime::cuda::cached_cubin(&format!("{src}// changed\n"), "sm_90", 1).expect("compile");
    assert!(!info3.cache_hit, "a changed source must not hit");
    eprintln!("{info1}\n{info2}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The benchmark configuration (seed network, batch 1024, fp32): every batchnorm layer reads
/// its activation in one reduction kernel forward (Σx and Σx² of re and im: one-pass
/// statistics) and one backward (its sums distributed by `passes/distribute.rs`, then merged
/// as siblings by `passes/siblings.rs`), the sums split over blocks keep f64 scratch, and the
/// module compiles.
#[test]
fn seed_network_at_batch_1024_shares_batchnorm_passes_and_compiles() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/seed_cnn.cvnn");
    let src = std::fs::read_to_string(&path).expect("readable example");
    let checked = check_source("seed_cnn.cvnn", &src, Mode::Train).expect("checks");
    let opts = Options { batch: 1024, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let program = compile(checked.graph, &opts).expect("compiles");
    let module = cuda::generate(&program, Precision::Fp32).expect("generates");
    let is_bn_reduce = |gi: usize| {
        let k = &program.groups[gi];
        k.kind == cvc_compiler::passes::fusion::GroupKind::Reduce
            && k.nodes.last().is_some_and(|&v| program.graph.node(v).origin.label.contains("batchnorm"))
    };
    let groups = (0..program.groups.len()).filter(|&gi| is_bn_reduce(gi)).count();
    let launches = module
        .steps
        .iter()
        .filter(|s| matches!(s, cuda::CudaStep::Launch(l) if is_bn_reduce(l.group)))
        .count();
    assert_eq!(groups, 36, "3 batchnorm layers × (4 forward + 8 backward) sums");
    assert_eq!(launches, 6, "3 batchnorm layers × (1 forward + 1 backward) passes");
    assert!(module.scratch.1 > 0, "split reductions keep f64 partials in scratch");
    assert_eq!(module.scratch.0 % 256, 0);
    assert!(module.scratch.0 >= program.plan.arena_bytes);
    if !nvrtc_or_skip() {
        return;
    }
    let cubin = cvc_runtime::cuda::compile_cubin(&module.source, "sm_90").expect("NVRTC compiles");
    assert!(cubin.starts_with(b"\x7fELF"));
}
