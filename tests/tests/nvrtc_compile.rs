//! Compiles every generated CUDA kernel of every example and `ok` fixture with the real NVRTC
//! for sm_90 (no GPU needed). Skips when NVRTC cannot be loaded, unless `CVC_REQUIRE_NVRTC=1`.

use cvc_compiler::back::cuda;
use cvc_compiler::config::Precision;
use cvc_compiler::front::check_source;
use cvc_compiler::ir::Mode;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::target::{CudaTarget, KernelConfig};
use std::collections::{BTreeMap, HashSet};
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

/// What NVRTC is asked to produce for a module of new kernels.
#[derive(Clone, Copy, PartialEq)]
enum Output {
    /// A cubin (NVRTC and ptxas: what `cvc train` loads).
    Cubin,
    /// PTX only (NVRTC's front end and code generation).
    Ptx,
}

/// The kernels of `module` whose compile key ([`kernel_key`]) is not in `seen` yet, compiled as
/// one module: the prelude, the attention templates when `module` has them, and those kernels
/// under their own names (unique within one module). Kernels repeated with other constants
/// (the layers of a `repeat`, the forward of the train and eval programs, the same block in
/// several files) are compiled once. Returns how many kernels it compiled.
fn compile_new_kernels(
    what: &str,
    module: &cuda::CudaModule,
    seen: &mut HashSet<String>,
    out: Output,
) -> usize {
    let (mut head, chunks) = kernel_chunks(&module.source);
    for lib in cuda::LIBRARIES.iter().filter(|lib| module.source.contains(*lib)) {
        head.push_str(lib);
    }
    let mut new = Vec::new();
    for chunk in chunks {
        let chunk = without_libraries(&chunk);
        let mine: Vec<&String> =
            module.kernels.iter().filter(|k| chunk.contains(&format!(" {k}("))).collect();
        assert!(!mine.is_empty(), "{what}: a kernel chunk names no kernel of the module:\n{chunk}");
        if seen.insert(kernel_key(&chunk, &mine)) {
            let names = mine.into_iter().cloned().collect();
            new.push((chunk, names));
        }
    }
    let count = new.iter().map(|(_, names): &(String, Vec<String>)| names.len()).sum();
    // As the runtime does: units of about `UNIT_BYTES` of kernels (NVRTC's time grows faster
    // than a unit's size), compiled in parallel.
    let mut units: Vec<(String, Vec<String>)> = Vec::new();
    let mut bytes = usize::MAX;
    for (chunk, names) in new {
        if bytes.saturating_add(chunk.len()) > cuda::UNIT_BYTES {
            units.push((head.clone(), Vec::new()));
            bytes = 0;
        }
        bytes += chunk.len();
        let unit = units.last_mut().expect("a unit was just pushed");
        unit.0.push_str(&chunk);
        unit.1.extend(names);
    }
    // (`sm_90a` where the module's contractions use `wgmma`.)
    let arch = module.arch.as_str();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(units.len().max(1));
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let units = &units;
        let jobs: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    units.iter().skip(t).step_by(threads).try_for_each(|u| check_unit(what, u, out, arch))
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err(format!("{what}: a compile thread panicked"))))
            .collect()
    });
    for r in results {
        r.unwrap_or_else(|e| panic!("{e}"));
    }
    count
}

/// Compiles one unit to `out` and checks that every kernel it names is in the result.
fn check_unit(
    what: &str,
    (source, names): &(String, Vec<String>),
    out: Output,
    arch: &str,
) -> Result<(), String> {
    match out {
        Output::Cubin => {
            let cubin = cvc_runtime::cuda::compile_cubin(source, arch).map_err(|e| format!("{what}: {e}"))?;
            if !cubin.starts_with(b"\x7fELF") {
                return Err(format!("{what}: NVRTC's cubin is not an ELF image"));
            }
            for k in names {
                let needle = format!("{k}\0");
                if !cubin.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    return Err(format!("{what}: kernel {k} missing from the cubin"));
                }
            }
        }
        Output::Ptx => {
            let ptx = cvc_runtime::cuda::compile_ptx(source, arch).map_err(|e| format!("{what}: {e}"))?;
            for k in names {
                if !ptx.contains(&format!(".entry {k}(")) {
                    return Err(format!("{what}: {k} missing from the PTX"));
                }
            }
        }
    }
    Ok(())
}

/// A kernel chunk without the template libraries the module emitted just before it.
fn without_libraries(chunk: &str) -> String {
    cuda::LIBRARIES.iter().fold(chunk.to_string(), |c, lib| c.replace(lib, ""))
}

/// What decides whether a kernel compiles: its code without the `// group` comments, its name
/// replaced by a placeholder, and (for [`structure`]) its integer constants zeroed. Kernels
/// that instantiate the attention or recurrence templates keep their constants: the template arguments
/// (extents, tiles) size shared arrays and unrolled loops.
fn kernel_key(chunk: &str, names: &[&String]) -> String {
    let mut code: String = chunk.split_inclusive('\n').filter(|l| !l.starts_with("//")).collect();
    for (i, k) in names.iter().enumerate() {
        code = code.replace(k.as_str(), &format!("KERNEL{i}"));
    }
    if code.contains("attn_") || code.contains("rnn_") {
        code
    } else {
        structure(&code)
    }
}

/// Each model in train and eval mode, at a batch that exercises the batch-dependent
/// constants, generated and compiled to cubins; each kernel of a new [`kernel_key`] once.
#[test]
fn every_generated_kernel_compiles_with_nvrtc_for_sm90() {
    if !nvrtc_or_skip() {
        return;
    }
    let files = cvnn_files();
    assert!(!files.is_empty(), "no .cvnn files found under examples/ or tests/fixtures/ok/");
    let mut seen = HashSet::new();
    let (mut programs, mut compiled) = (0, 0);
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
            let module = cuda::generate(&program, &CudaTarget::h200())
                .unwrap_or_else(|e| panic!("{name} ({mode:?}): {e}"));
            assert!(!module.kernels.is_empty(), "{name}: no kernels generated");
            let n = compile_new_kernels(&format!("{name} ({mode:?})"), &module, &mut seen, Output::Cubin);
            eprintln!("{name} ({mode:?}): {} kernels, {n} of a new structure compiled", module.kernels.len());
            programs += 1;
            compiled += n;
        }
    }
    assert!(programs >= files.len(), "every file compiles at least one program");
    eprintln!("{programs} programs, {compiled} kernels compiled");
}

/// The TF32 tensor-core contraction kernels of every example compile too: the kernels that
/// differ from the same program's fp32 module (the fp32 ones are compiled above).
#[test]
fn tf32_kernels_compile_with_nvrtc_for_sm90() {
    if !nvrtc_or_skip() {
        return;
    }
    let mut compiled = 0;
    for path in cvnn_files().iter().filter(|p| p.parent().is_some_and(|d| d.ends_with("examples"))) {
        let src = std::fs::read_to_string(path).expect("readable .cvnn");
        let name = path.display().to_string();
        let checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        let opts = Options { batch: 5, optimizer: checked.train.optimizer.clone(), ..Options::default() };
        let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let fp32 = cuda::generate(&program, &CudaTarget::h200()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let module = cuda::generate(&program, &CudaTarget::h200().with_precision(Precision::Tf32))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(module.source.contains("mma.sync"), "{name}: no tensor-core kernel generated");
        // The fp32 module's kernels count as seen: only what TF32 changes is compiled here.
        let mut seen = HashSet::new();
        let (_, chunks) = kernel_chunks(&fp32.source);
        for chunk in chunks {
            let chunk = without_libraries(&chunk);
            let mine: Vec<&String> =
                fp32.kernels.iter().filter(|k| chunk.contains(&format!(" {k}("))).collect();
            seen.insert(kernel_key(&chunk, &mine));
        }
        let n = compile_new_kernels(&format!("{name} (tf32)"), &module, &mut seen, Output::Cubin);
        assert!(n > 0, "{name}: TF32 changed no kernel");
        compiled += n;
    }
    eprintln!("{compiled} TF32 kernels compiled");
}

/// Under `precision = bf16 | fp16` every example and `ok` fixture (train and eval programs)
/// stores its activations in 16 bits: the kernels that read or write them differ from the
/// fp32 ones and compile to PTX. bf16 covers every file; fp16 (the same code with the other
/// element types) the examples. Each program really has 16-bit buffers and its arena is
/// smaller than the fp32 one.
#[test]
fn half_precision_kernels_compile_with_nvrtc_for_sm90() {
    if !nvrtc_or_skip() {
        return;
    }
    let mut compiled = 0;
    for precision in [Precision::Bf16, Precision::Fp16] {
        let mut seen = HashSet::new();
        for path in cvnn_files() {
            let example = path.parent().is_some_and(|d| d.ends_with("examples"));
            if precision == Precision::Fp16 && !example {
                continue;
            }
            let src = std::fs::read_to_string(&path).expect("readable .cvnn");
            let name = path.display().to_string();
            for mode in [Mode::Train, Mode::Eval] {
                let checked = check_source(&name, &src, mode).unwrap_or_else(|d| panic!("{name}: {d:?}"));
                if mode == Mode::Train && checked.graph.loss.is_none() {
                    continue;
                }
                // Without the cheap recomputation: its greedy search can take different
                // trials in the two precisions, and the arenas compared here should differ by
                // the storage rule alone. Its clones are kernels of the structures compiled
                // here (copies of forward elementwise and reduction kernels).
                let opts = Options {
                    batch: 3,
                    optimizer: checked.train.optimizer.clone(),
                    half: precision.storage(),
                    cheap_remat: false,
                    ..Options::default()
                };
                let full =
                    compile(checked.graph.clone(), &Options { half: Default::default(), ..opts.clone() })
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
                let g = &program.graph;
                let halves = g.nodes.handles().filter(|&v| g.storage(v).is_half()).count();
                // (A fixture of views and outputs only may have no 16-bit value.)
                assert!(
                    halves > 0 || !example,
                    "{name} ({mode:?}, {precision:?}): no value is stored in 16 bits"
                );
                // The examples must shrink. Tiny fixtures can round to the same aligned arena,
                // or pack their few buffers of mixed widths up to 1 KiB worse than fp32's (the
                // bound of `passes::bf16_plans_are_no_larger_than_fp32_plans`; gru_tiny's
                // inference plan at batch 3: 7,680 bytes against 7,168, once its narrow
                // contractions kept full width).
                let (smaller, full_bytes) = (program.plan.arena_bytes, full.plan.arena_bytes);
                assert!(
                    smaller < full_bytes || (!example && smaller <= full_bytes + 1024),
                    "{name} ({mode:?}, {precision:?}): arena {smaller} is not below fp32's {full_bytes}"
                );
                let module = cuda::generate(&program, &CudaTarget::h200().with_precision(precision))
                    .unwrap_or_else(|e| panic!("{name} ({precision:?}): {e}"));
                compiled += compile_new_kernels(
                    &format!("{name} ({mode:?}, {precision:?})"),
                    &module,
                    &mut seen,
                    Output::Ptx,
                );
                // The native 16-bit products (the default off Hopper; on the H200 the 16-bit
                // operands widen for `wgmma`), with the 4-warp tile (the TF32 default) and the
                // taps' table too, for the examples.
                for spec in ["tc16=native", "tc16=native,tctile=64w4", "tc16=native,tctaps=table"] {
                    if !(example && precision == Precision::Bf16 && mode == Mode::Train) {
                        break;
                    }
                    let kernels = cvc_compiler::target::KernelConfig::parse(spec).expect("a spec");
                    let target = CudaTarget::h200().with_precision(precision).with_kernels(kernels);
                    let module =
                        cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{name} ({spec}): {e}"));
                    compiled +=
                        compile_new_kernels(&format!("{name} ({spec})"), &module, &mut seen, Output::Ptx);
                }
            }
        }
    }
    eprintln!("{compiled} 16-bit kernels compiled");
}

/// The unfused baseline (one kernel per node) also compiles: every op's kernel on its own.
#[test]
fn unfused_kernels_compile_with_nvrtc() {
    if !nvrtc_or_skip() {
        return;
    }
    let mut seen = HashSet::new();
    let mut compiled = 0;
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
        let module = cuda::generate(&program, &CudaTarget::h200()).unwrap_or_else(|e| panic!("{name}: {e}"));
        compiled += compile_new_kernels(&format!("{name} (unfused)"), &module, &mut seen, Output::Ptx);
    }
    eprintln!("{compiled} unfused kernels compiled");
}

/// Every batched-matmul form (the batch on grid.z, folded into M or K, summed with a split
/// K index) compiles, fp32 and TF32; each generated variant is present in the source.
#[test]
fn batched_matmul_kernels_compile_with_nvrtc() {
    if !nvrtc_or_skip() {
        return;
    }
    let program = cvc_tests::matmul_forms::program(3).expect("compiles");
    for precision in [Precision::Fp32, Precision::Tf32] {
        let module = cuda::generate(&program, &CudaTarget::h200().with_precision(precision))
            .unwrap_or_else(|e| panic!("{precision:?}: {e}"));
        // Batched loads index the batch by the group `g`; summed ones split K into (q, r).
        for needle in ["g * 35u + m * 7u + k", "const ix q = k / ", "[g * "] {
            assert!(module.source.contains(needle), "{precision:?}: no `{needle}` in the source");
        }
        let cubin = cvc_runtime::cuda::compile_cubin(&module.source, &module.arch)
            .unwrap_or_else(|e| panic!("{precision:?}: {e}"));
        assert!(cubin.starts_with(b"\x7fELF"), "{precision:?}: NVRTC's cubin is not an ELF image");
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
    units_compile_apart_and_hit_the_cache();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A module as translation units ([`cuda::CudaModule::units`], as the runtime compiles it):
/// the units hold every kernel once, in order, each with the prelude and exactly the template
/// libraries its kernels use; they compile in parallel into cubins that define their
/// kernels, and a second start reads every unit from the cache. (Called by
/// [`second_start_is_a_cache_hit`], which owns `CVC_CACHE_DIR` in this binary.)
fn units_compile_apart_and_hit_the_cache() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
    let path = root.join("tests/fixtures/ok/vit_tiny.cvnn");
    let src = std::fs::read_to_string(&path).expect("readable fixture");
    let checked = check_source(&path.display().to_string(), &src, Mode::Train).expect("checks");
    let opts = Options { batch: 2, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let program = compile(checked.graph, &opts).expect("compiles");
    let module = cuda::generate(&program, &CudaTarget::h200()).expect("generates");
    // Small units, so that the fixture's module splits into several.
    let units = module.units(16 * 1024);
    assert!(units.len() >= 3, "{} units of a {}-byte module", units.len(), module.source.len());
    let listed: Vec<String> = units.iter().flat_map(|u| u.kernels.clone()).collect();
    assert_eq!(listed, module.kernels, "the units list every kernel once, in order");
    let (attention, _) = (cuda::LIBRARIES[0], cuda::LIBRARIES[1]);
    let mut with_attention = 0;
    for u in &units {
        assert!(u.source.starts_with("// Generated by cvc"), "a unit starts with the prelude");
        for k in &u.kernels {
            assert_eq!(
                u.source.matches(&format!(" {k}(char* A)")).count(),
                1,
                "{k} defined once in its unit"
            );
        }
        let calls =
            u.source.contains("attn_fwd<") || u.source.contains("attn_lse<") || u.source.contains("attn_d");
        let has = u.source.contains(attention);
        assert!(!calls || has, "a unit calling the attention templates carries them");
        with_attention += usize::from(has);
    }
    assert!(
        with_attention >= 1 && with_attention < units.len(),
        "only the units that use the templates carry them"
    );
    let (cubins, first) = cvc_runtime::cuda::cached_units(&units, "sm_90").expect("units compile");
    assert_eq!((first.units, first.compiled, first.cache_hit), (units.len(), units.len(), false), "{first}");
    for (cubin, u) in cubins.iter().zip(&units) {
        for k in &u.kernels {
            let needle = format!("{k}\0");
            assert!(
                cubin.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{k} missing from its unit's cubin"
            );
        }
    }
    let (again, second) = cvc_runtime::cuda::cached_units(&units, "sm_90").expect("units load");
    assert!(second.cache_hit && second.compiled == 0, "the second start recompiled: {second}");
    assert_eq!(again, cubins);
    eprintln!("{first}\n{second}");
}

/// The benchmark configuration (seed network, batch 1024, fp32): every batchnorm layer reads
/// its activation in one reduction kernel forward (Σx and Σx² of re and im: one-pass
/// statistics) and one backward (its sums distributed by `passes/distribute.rs`, then merged
/// as siblings by `passes/siblings.rs`), except the first layer's forward sums, which its
/// direct convolution computes (`convstats=fuse`); the sums split over blocks keep f64
/// scratch, and the module compiles.
#[test]
fn seed_network_at_batch_1024_shares_batchnorm_passes_and_compiles() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/seed_cnn.cvnn");
    let src = std::fs::read_to_string(&path).expect("readable example");
    let checked = check_source("seed_cnn.cvnn", &src, Mode::Train).expect("checks");
    let opts = Options { batch: 1024, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let program = compile(checked.graph, &opts).expect("compiles");
    let module = cuda::generate(&program, &CudaTarget::h200()).expect("generates");
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
    assert_eq!(
        launches, 5,
        "3 batchnorm layers × (1 forward + 1 backward) passes, less the first layer's forward"
    );
    let conv_sums = module
        .kernel_code
        .iter()
        .filter(|(code, _)| code.contains("st[ii * 4 + k][tid] += (double)p[k]"))
        .count();
    assert_eq!(conv_sums, 1, "the first convolution sums its output per channel");
    assert!(module.scratch.1 > 0, "split reductions keep f64 partials in scratch");
    assert_eq!(module.scratch.0 % 256, 0);
    assert!(module.scratch.0 >= program.plan.arena_bytes);
    if !nvrtc_or_skip() {
        return;
    }
    let cubin = cvc_runtime::cuda::compile_cubin(&module.source, "sm_90").expect("NVRTC compiles");
    assert!(cubin.starts_with(b"\x7fELF"));
}

/// One program per file for the variant test: the training step (inference where the model
/// has no loss), at batch 64 (large enough for split-K contractions).
fn variant_programs() -> Vec<(String, cvc_compiler::passes::Program)> {
    cvnn_files()
        .iter()
        .map(|path| {
            let src = std::fs::read_to_string(path).expect("readable .cvnn");
            let name = path.file_name().expect("file name").to_string_lossy().into_owned();
            let mut checked =
                check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
            if checked.graph.loss.is_none() {
                checked = check_source(&name, &src, Mode::Eval).unwrap_or_else(|d| panic!("{name}: {d:?}"));
            }
            let opts =
                Options { batch: 64, optimizer: checked.train.optimizer.clone(), ..Options::default() };
            (name.clone(), compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}")))
        })
        .collect()
}

/// A module's source split into the shared prelude and one chunk per kernel (its `// group`
/// comment lines and its code).
fn kernel_chunks(source: &str) -> (String, Vec<String>) {
    let mut prelude = String::new();
    let mut chunks: Vec<String> = Vec::new();
    for line in source.split_inclusive('\n') {
        let starts_kernel =
            line.starts_with("// group ") && chunks.last().is_none_or(|c| c.contains("__global__"));
        if starts_kernel {
            chunks.push(String::new());
        }
        match chunks.last_mut() {
            Some(c) => c.push_str(line),
            None => prelude.push_str(line),
        }
    }
    (prelude, chunks)
}

/// A kernel's code with its integer constants zeroed except array sizes (shapes, offsets,
/// splits and trip counts are constants; `[N]` sizes the shared and register arrays) and its
/// values (`v123`, named after graph nodes) renumbered in order of first use: kernels that
/// differ only in constants and node numbers (the layers of a `repeat`) have the same
/// structure (loops, tiles, shared arrays, atomics, branches), so NVRTC accepts both or
/// neither, and compiling one of them is enough.
fn structure(chunk: &str) -> String {
    let b = chunk.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut values: std::collections::HashMap<&[u8], usize> = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let word_start = i == 0 || !ident(b[i - 1]);
        let digits_from = |j: usize| (j..b.len()).find(|&k| !b[k].is_ascii_digit()).unwrap_or(b.len());
        if word_start && b[i] == b'v' && b.get(i + 1).is_some_and(|c| c.is_ascii_digit()) {
            let end = digits_from(i + 1);
            if b.get(end).is_none_or(|&c| !ident(c)) {
                let next = values.len();
                let n = *values.entry(&b[i..end]).or_insert(next);
                out.extend_from_slice(format!("v{n}").as_bytes());
                i = end;
                continue;
            }
        }
        if !(word_start && b[i].is_ascii_digit()) {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let end = digits_from(i);
        if i > 0 && b[i - 1] == b'[' {
            out.extend_from_slice(&b[i..end]); // an array size: shared memory and registers
        } else {
            out.push(b'0');
        }
        i = end;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Kernels of `source` that declare a shared array named `array` (` Ws[` for the direct
/// convolution, ` Ds[` for the direct weight gradient, ` As[` for the fp32 implicit GEMM;
/// alternatives separated by `|`): a static `__shared__` array, or a pointer into dynamic
/// shared memory (`float2 (*Ac)[16][68] = ...`, the tensor-core GEMM's ring of K tiles).
fn kernels_declaring(source: &str, array: &str) -> usize {
    // (`array` may list alternatives separated by `|`.)
    let declares = |l: &str, a: &str| {
        let name = a.trim().trim_end_matches('[');
        (l.contains("__shared__") && l.contains(a)) || l.contains(&format!("(*{name})["))
    };
    source.lines().filter(|l| array.split('|').any(|a| declares(l, a))).count()
}

/// What a variant must change, judged on the default module of each file and the variant's.
#[derive(Clone, Copy)]
enum Expect {
    /// The source changes exactly in the files whose default module declares this array;
    /// with `gone`, the variant's module declares none.
    ChangesWhere { array: &'static str, gone: bool },
    /// Only files whose default declares the array may change, and at least one does.
    SomeOf(&'static str),
    /// The source may change anywhere a contraction or a split sum is; at least one does.
    Some,
    /// The source stays the same everywhere; the launch list changes in at least one file.
    LaunchesOnly,
}

/// Every kernel choice, both precisions and three devices: each variant's kernels compile with
/// NVRTC for its device's architecture, and each variant changes the generated source where it
/// applies (and only there, where that can be said), so a choice that stops reaching code
/// generation fails here. Kernels a variant leaves unchanged are the default's, which the tests
/// above compile; here each changed kernel of a new [`structure`] is compiled (to PTX), with
/// the prelude.
/// How many changed kernels of one variant, architecture and example NVRTC compiles.
const VARIANT_KERNELS_PER_EXAMPLE: usize = 3;

#[test]
fn every_kernel_variant_changes_what_it_should_and_compiles_with_nvrtc() {
    let nvrtc = nvrtc_or_skip();
    let programs = variant_programs();
    let spec = |s: &str| KernelConfig::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
    let h200 = CudaTarget::h200();
    let a100 = cvc_compiler::target::CudaDevice {
        sm_count: 108,
        compute_capability: (8, 0),
        shared_per_block_optin: 163 * 1024,
        ..cvc_compiler::target::CudaDevice::h200()
    };
    let small = cvc_compiler::target::CudaDevice {
        sm_count: 16,
        shared_per_block: 24 * 1024,
        shared_per_block_optin: 24 * 1024,
        ..cvc_compiler::target::CudaDevice::h200()
    };
    use Expect::*;
    let kernel_variants: Vec<(&str, Expect)> = vec![
        ("conv=gemm", ChangesWhere { array: " Ws[", gone: true }),
        ("conv=direct64", Some),
        ("ck=6", SomeOf(" Ws[")),
        ("ck=9", SomeOf(" Ws[")),
        ("wgrad=gemm", ChangesWhere { array: " Ds[", gone: true }),
        ("wgrad=pf", ChangesWhere { array: " Ds[", gone: false }),
        ("wgrad=ot4pf", ChangesWhere { array: " Ds[", gone: false }),
        ("wgrad=ot2", SomeOf(" Ds[")),
        ("wgrad=ot4", SomeOf(" Ds[")),
        // Tiles by `cp.async` into two pairs of buffers (full-width operands; 16-bit ones
        // keep the register staging).
        ("wgrad=async", SomeOf(" Ds[")),
        ("wgrad=ot4async", SomeOf(" Ds[")),
        ("fill=264", Some),
        ("fill=66", Some),
        ("bk=32", SomeOf(" As[")),
        ("cmul=3m", SomeOf(" As[")),
        ("ftile=128", SomeOf(" As[")),
        ("cmul=3m,ftile=128", SomeOf(" As[")),
        ("grid=64", LaunchesOnly),
        // (`index=64` changes every kernel: the 64-bit code of every kernel compiles in
        // `every_model_at_a_huge_batch_generates_64_bit_kernels_that_compile`.)
        ("yz=2", Some),
        // Tensor-core GEMM choices: TF32 and 16-bit code only (fp32 kernels unchanged). TF32
        // contractions default to `wgmma` (planes in dynamic shared memory, `gemm_smem`); the
        // `mma.sync` forms (`mma=sync`: `Ac`, a complex operand's interleaved plane under the
        // default `async` staging, or the `Ar` planes) are the 16-bit precisions' too.
        ("mma=sync", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("mma=sync,tc=plain", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("mma=sync,tc=prefetch", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("mma=sync,tc=prefetch,tctile=128", SomeOf(" Ar[| Ac[| gemm_smem[")),
        // (3 blocks per SM is the default of the 4-warp TF32 tile.)
        ("mma=sync,tcblocks=2", SomeOf(" Ar[| Ac[| gemm_smem[")),
        // (`tctile=64w4` is the `mma.sync` TF32 default; its 16-bit form compiles in
        // `half_precision_kernels_compile_with_nvrtc_for_sm90`.)
        ("mma=sync,tctile=64", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("mma=sync,tcstages=2", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("mma=sync,tctaps=table", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("mma=sync,tctaps=mask", SomeOf(" Ar[| Ac[| gemm_smem[")),
        // `wgmma` choices (compiled for `sm_90a`, the module's `arch`; the defaults to a cubin
        // in `wgmma_kernels_compile_to_a_cubin_for_sm90a`).
        ("tctile=64", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("tcstages=2", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("tcstages=4", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("tctaps=table", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("tctaps=mask", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("wgwait=1,tcstages=4", SomeOf(" Ar[| Ac[| gemm_smem[")),
        // The row operand through a descriptor instead of registers.
        ("wga=smem", SomeOf(" Ar[| Ac[| gemm_smem[")),
        // Copying warpgroups: one, and three that hand registers over (`setmaxnreg`).
        ("wgprod=1", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("wgprod=3,tctaps=mask", SomeOf(" Ar[| Ac[| gemm_smem[")),
        // Stride-1 convolutions on halo tiles (by default their input gradients alone), and on
        // the implicit GEMM.
        ("tcconv=halo", SomeOf(" Ar[| Ac[| gemm_smem[")),
        ("tcconv=gemm", SomeOf(" Ar[| Ac[| gemm_smem[")),
    ];
    // Kernels that differ from the default module, by architecture, each kind once.
    let mut changed_kernels: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut seen = HashSet::new();
    let mut prelude = String::new();
    // Every file's variants are generated and checked above and below; NVRTC compiles the
    // changed kernels of the examples (their kernel forms cover the fixtures'): compiling
    // every fixture's variants was most of this binary's CI time.
    let examples: HashSet<String> = cvnn_files()
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("examples")))
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    // Of each variant, architecture and example, the first few new kernel structures: a
    // variant's code is one template per kernel kind, so a few instances per example check
    // it, and compiling all of them (about 1,500 contraction kernels) took five minutes.
    let mut per_variant: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    let mut collect_changed = |what: &str, file: &str, base: &str, source: &str, arch: String| {
        if !examples.contains(file) {
            return;
        }
        let (_, before) = kernel_chunks(base);
        let before: Vec<String> = before.iter().map(|c| without_libraries(c)).collect();
        let (p, after) = kernel_chunks(source);
        prelude = p;
        // The default's kernels count as compiled: the tests above compile them for sm_90.
        if arch == "sm_90" {
            seen.extend(before.iter().map(|c| (arch.clone(), structure(c))));
        }
        for c in after.iter().map(|c| without_libraries(c)) {
            let taken = per_variant.entry((what.to_string(), arch.clone(), file.to_string())).or_default();
            if *taken < VARIANT_KERNELS_PER_EXAMPLE
                && !before.contains(&c)
                && seen.insert((arch.clone(), structure(&c)))
            {
                *taken += 1;
                changed_kernels.entry(arch.clone()).or_default().push((format!("{what}, {file}"), c));
            }
        }
    };
    for precision in [Precision::Fp32, Precision::Tf32] {
        let base_target = h200.clone().with_precision(precision);
        let defaults: Vec<_> = programs
            .iter()
            .map(|(f, p)| cuda::generate(p, &base_target).unwrap_or_else(|e| panic!("{f}: {e}")))
            .collect();
        // TF32 against fp32: every file with a contraction changes, and gets tensor-core code.
        if precision == Precision::Tf32 {
            let fp32: Vec<_> = programs
                .iter()
                .map(|(f, p)| cuda::generate(p, &h200).unwrap_or_else(|e| panic!("{f}: {e}")))
                .collect();
            let mut any = false;
            let mut thin_layers_seen = false;
            for (((file, _), f), t) in programs.iter().zip(&fp32).zip(&defaults) {
                let contracts = [" As[", " Ws[", " Ds["].iter().any(|a| kernels_declaring(&f.source, a) > 0);
                assert_eq!(
                    contracts,
                    f.source != t.source,
                    "{file}: tf32 changes exactly the files with contractions"
                );
                let tensor_cores = t.source.contains("mma_tf32(c") || t.source.contains("wgmma_tf32<");
                assert_eq!(contracts, tensor_cores, "{file}: tensor-core kernels");
                // Direct kernels only where fp32 has them too (first layers too thin for tensor
                // cores: conv.rs `too_shallow_for_tensor_cores`).
                for a in [" Ws[", " Ds["] {
                    assert!(
                        kernels_declaring(&t.source, a) <= kernels_declaring(&f.source, a),
                        "{file}: {a}"
                    );
                }
                if file == "seed_cnn.cvnn" {
                    // Its first layer (1 channel × 9 taps) forward and weight gradient.
                    assert_eq!(
                        (kernels_declaring(&t.source, " Ws["), kernels_declaring(&t.source, " Ds[")),
                        (1, 1)
                    );
                    thin_layers_seen = true;
                }
                any |= contracts;
                collect_changed("tf32", file, &f.source, &t.source, t.arch.clone());
            }
            assert!(any, "no file has a contraction");
            assert!(thin_layers_seen, "seed_cnn.cvnn is not among the files");
        }
        let devices = [("a100", a100.clone()), ("small", small.clone())];
        let targets = kernel_variants
            .iter()
            .map(|&(s, e)| (s.to_string(), base_target.clone().with_kernels(spec(s)), e))
            .chain(devices.iter().map(|(n, d)| {
                (n.to_string(), CudaTarget { device: d.clone(), ..base_target.clone() }, Expect::Some)
            }));
        for (what, target, expect) in targets {
            let what = format!("{what} ({precision:?})");
            let mut changed_files = 0;
            let mut launches_changed = false;
            for ((file, program), base) in programs.iter().zip(&defaults) {
                let m = cuda::generate(program, &target).unwrap_or_else(|e| panic!("{what}, {file}: {e}"));
                let changed = m.source != base.source;
                changed_files += changed as usize;
                launches_changed |= m.steps != base.steps;
                match expect {
                    ChangesWhere { array, gone } => {
                        let applies = kernels_declaring(&base.source, array) > 0;
                        assert_eq!(
                            changed, applies,
                            "{what}, {file}: changes exactly where {array:?} is declared"
                        );
                        if gone {
                            assert_eq!(kernels_declaring(&m.source, array), 0, "{what}, {file}");
                        }
                    }
                    SomeOf(array) => {
                        assert!(
                            !changed || kernels_declaring(&base.source, array) > 0,
                            "{what}, {file}: changes a file without {array:?}"
                        );
                    }
                    Some => {}
                    LaunchesOnly => assert!(!changed, "{what}, {file}: the source changed"),
                }
                collect_changed(&what, file, &base.source, &m.source, m.arch.clone());
            }
            // The fp32 GEMM's kernel choices do not apply to TF32 numerics, nor the tensor-core
            // GEMM's to fp32; the direct kernels' apply at TF32 to the few layers too thin for
            // tensor cores, which a choice may leave unchanged (`ck=6` of a 1-channel layer).
            let fp32_only = precision == Precision::Tf32
                && ["bk=", "cmul=", "ftile="].iter().any(|k| what.starts_with(k));
            let thin_only = precision == Precision::Tf32
                && ["conv=", "ck=", "wgrad="].iter().any(|k| what.starts_with(k));
            let tc_only = precision == Precision::Fp32
                && ["tc", "mma=", "wgwait=", "wgprod=", "wga="].iter().any(|k| what.starts_with(k));
            match expect {
                LaunchesOnly => assert!(launches_changed, "{what}: no launch list changed"),
                _ if fp32_only => {
                    assert_eq!(changed_files, 0, "{what}: an fp32 kernel choice changed TF32 code")
                }
                _ if tc_only => {
                    assert_eq!(changed_files, 0, "{what}: a tensor-core kernel choice changed fp32 code")
                }
                _ if thin_only => {}
                _ => assert!(changed_files > 0, "{what}: no file's source changed"),
            }
            eprintln!("{what}: {changed_files} of {} files changed", programs.len());
        }
    }
    let total: usize = changed_kernels.values().map(Vec::len).sum();
    eprintln!("{total} changed kernels to compile");
    if !nvrtc {
        return;
    }
    // One module per architecture and up to 16 kernels, each renamed after its place in the
    // list (the same kernel name has different bodies in different variants).
    let mut compiled = 0;
    // The template libraries go to the prelude (a changed kernel may use one that its module
    // emitted before an unchanged kernel).
    let prelude = format!("{prelude}{}", cuda::LIBRARIES.concat());
    for (arch, kernels) in &changed_kernels {
        for (n, batch) in kernels.chunks(16).enumerate() {
            let mut module = prelude.clone();
            let mut names = Vec::new();
            for (i, (what, chunk)) in batch.iter().enumerate() {
                // `extern "C" __global__ void __launch_bounds__(...) NAME(char* A) {`
                let name = chunk.split("(char* A)").next().and_then(|s| s.rsplit(' ').next());
                let name = name.unwrap_or_else(|| panic!("{what}: a kernel without a name"));
                let renamed = format!("v{n}_{i}_{name}");
                module.push_str(&chunk.replacen(
                    &format!(" {name}(char* A)"),
                    &format!(" {renamed}(char* A)"),
                    1,
                ));
                names.push((what, renamed));
            }
            let ptx = cvc_runtime::cuda::compile_ptx(&module, arch).unwrap_or_else(|e| {
                panic!("{arch}, kernels of {:?}: {e}", names.iter().map(|n| n.0).collect::<Vec<_>>())
            });
            for (what, name) in names {
                assert!(ptx.contains(&format!(".entry {name}(")), "{what}: {name} missing from the PTX");
                compiled += 1;
            }
        }
    }
    assert!(compiled > 0);
    eprintln!("{compiled} changed kernels compiled");
}

/// The TF32 contractions of the seed network and of every batched-matmul form on Hopper's
/// warpgroup products (the H200's default, `mma=wgmma`), a module for `sm_90a` (where alone
/// `wgmma` exists) that ptxas accepts; the same choice on an A100 keeps `mma.sync` and `sm_80`.
#[test]
fn wgmma_kernels_compile_to_a_cubin_for_sm90a() {
    let nvrtc = nvrtc_or_skip();
    let wgmma = KernelConfig::parse("mma=wgmma").expect("a spec");
    let seed =
        cvnn_files().into_iter().find(|p| p.ends_with("examples/seed_cnn.cvnn")).expect("the seed network");
    let src = std::fs::read_to_string(&seed).expect("read");
    let checked = check_source("seed_cnn.cvnn", &src, Mode::Train).unwrap_or_else(|d| panic!("{d:?}"));
    let opts = Options { batch: 64, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let bf16 = Options { half: Precision::Bf16.storage(), ..opts.clone() };
    let bf16 = compile(checked.graph.clone(), &bf16).unwrap_or_else(|e| panic!("{e}"));
    let fp16 = Options { half: Precision::Fp16.storage(), ..opts.clone() };
    let fp16 = compile(checked.graph.clone(), &fp16).unwrap_or_else(|e| panic!("{e}"));
    let programs = [
        ("seed_cnn", compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{e}"))),
        ("matmul forms", cvc_tests::matmul_forms::program(3).expect("compiles")),
    ];
    for (name, program) in &programs {
        let target = CudaTarget::h200().with_precision(Precision::Tf32).with_kernels(wgmma.clone());
        let m = cuda::generate(program, &target).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m.arch, "sm_90a", "{name}");
        let launches = m.kernel_code.iter().filter(|(c, _)| c.contains("wgmma_tf32<")).count();
        assert!(launches > 0 && !m.source.contains("mma_tf32(c"), "{name}: every TF32 GEMM on wgmma");
        let a100 = cvc_compiler::target::CudaDevice {
            compute_capability: (8, 0),
            ..cvc_compiler::target::CudaDevice::h200()
        };
        let old = cuda::generate(program, &CudaTarget { device: a100, ..target.clone() })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(old.arch, "sm_80", "{name}");
        assert!(!old.source.contains("wgmma_tf32<") && old.source.contains("mma_tf32(c"), "{name}");
        if !nvrtc {
            continue;
        }
        let cubin =
            cvc_runtime::cuda::compile_cubin(&m.source, &m.arch).unwrap_or_else(|e| panic!("{name}: {e}"));
        for k in &m.kernels {
            let needle = format!("{k}\0");
            assert!(cubin.windows(needle.len()).any(|w| w == needle.as_bytes()), "{name}: {k} missing");
        }
        eprintln!("{name}: {launches} wgmma kernels, {} bytes of sm_90a cubin", cubin.len());
        // With copying warpgroups (mbarriers; `setmaxnreg` under three copiers, which ptxas
        // accepts only in a kernel whose register budget allows it).
        for spec in ["wgprod=1", "wgprod=3,tctaps=mask"] {
            let kernels = KernelConfig::parse(spec).expect("a spec");
            let target = CudaTarget::h200().with_precision(Precision::Tf32).with_kernels(kernels);
            let m = cuda::generate(program, &target).unwrap_or_else(|e| panic!("{name} {spec}: {e}"));
            assert!(m.source.contains("mbar_wait(&empty[s]"), "{name} {spec}: no copiers");
            let cubin = cvc_runtime::cuda::compile_cubin(&m.source, &m.arch)
                .unwrap_or_else(|e| panic!("{name} {spec}: {e}"));
            eprintln!("{name} {spec}: {} bytes of sm_90a cubin", cubin.len());
        }
        // Stride-1 convolutions and their input gradients on halo tiles: the seed network's
        // second and third layers' input gradients by default, the layers too under
        // `tcconv=halo`.
        if *name == "seed_cnn" {
            let kernels = KernelConfig::parse("tcconv=halo").expect("a spec");
            let target = CudaTarget::h200().with_precision(Precision::Tf32).with_kernels(kernels);
            let m = cuda::generate(program, &target).unwrap_or_else(|e| panic!("{name} tcconv=halo: {e}"));
            let halo = m.kernel_code.iter().filter(|(c, _)| c.contains("fetch_x(")).count();
            assert_eq!(halo, 4, "{name} tcconv=halo: halo-tile kernels");
            let by_default = cuda::generate(program, &CudaTarget::h200().with_precision(Precision::Tf32))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let halo = by_default.kernel_code.iter().filter(|(c, _)| c.contains("fetch_x(")).count();
            assert_eq!(halo, 2, "{name}: halo-tile kernels by default");
            let cubin = cvc_runtime::cuda::compile_cubin(&m.source, &m.arch)
                .unwrap_or_else(|e| panic!("{name} tcconv=halo: {e}"));
            eprintln!("{name} tcconv=halo: {} bytes of sm_90a cubin", cubin.len());
        }
        // fp32 on split TF32 operands (`fp32=3xtf32`), on `wgmma` and on `mma.sync`.
        for spec in ["fp32=3xtf32", "fp32=3xtf32,mma=sync"] {
            let kernels = KernelConfig::parse(spec).expect("a spec");
            let target = CudaTarget::h200().with_precision(Precision::Fp32).with_kernels(kernels);
            let m = cuda::generate(program, &target).unwrap_or_else(|e| panic!("{name} {spec}: {e}"));
            assert!(m.source.contains("tf32_lo(x"), "{name} {spec}: no split operands");
            let cubin = cvc_runtime::cuda::compile_cubin(&m.source, &m.arch)
                .unwrap_or_else(|e| panic!("{name} {spec}: {e}"));
            eprintln!("{name} {spec}: {} bytes of {} cubin", cubin.len(), m.arch);
        }
    }
    // Operands stored in bf16 through `wgmma` (`tc16=tf32`): widened by the copying threads,
    // in the implicit GEMM and in the halo tiles of the input gradients.
    let kernels = KernelConfig::parse("tc16=tf32").expect("a spec");
    let target = CudaTarget::h200().with_precision(Precision::Bf16).with_kernels(kernels);
    let m = cuda::generate(&bf16, &target).unwrap_or_else(|e| panic!("seed_cnn bf16 tc16=tf32: {e}"));
    let widened = |c: &str| c.contains("wgmma_tf32<") && c.contains("(float2)((cbf16s*)");
    let gemm = m.kernel_code.iter().filter(|(c, _)| widened(c) && !c.contains("fetch_x(")).count();
    let halo = m.kernel_code.iter().filter(|(c, _)| widened(c) && c.contains("fetch_x(")).count();
    assert!(gemm >= 4 && halo == 2, "seed_cnn bf16 tc16=tf32: {gemm} GEMMs and {halo} halo tiles widen bf16");
    if nvrtc {
        let cubin = cvc_runtime::cuda::compile_cubin(&m.source, &m.arch)
            .unwrap_or_else(|e| panic!("seed_cnn bf16 tc16=tf32: {e}"));
        eprintln!("seed_cnn bf16 tc16=tf32: {} bytes of {} cubin", cubin.len(), m.arch);
    }
    // 16-bit products on `wgmma` (`tc16=wgmma`, `m64nNk16` in bf16 and f16): ptxas checks the
    // instructions' form, which the host emulation cannot.
    // The weights' expansions staged by kernels of their own (`wexpand=pre`, default; with
    // copying warpgroups too, which that opens to 16-bit products) and by every tile.
    // (The variants at bf16 only: each cubin costs CI about 10 s.)
    let bf16_specs: &[&str] = &["tc16=wgmma", "wgprod=1", "tc16=wgmma,wexpand=tile,tcraw=row"];
    for (precision, program, ty, specs) in
        [(Precision::Bf16, &bf16, "true", bf16_specs), (Precision::Fp16, &fp16, "false", &["tc16=wgmma"])]
    {
        for &spec in specs {
            let kernels = KernelConfig::parse(spec).expect("a spec");
            let target = CudaTarget::h200().with_precision(precision).with_kernels(kernels);
            let m = cuda::generate(program, &target)
                .unwrap_or_else(|e| panic!("seed_cnn {precision:?} {spec}: {e}"));
            let w16 = m.kernel_code.iter().filter(|(c, _)| c.contains(&format!(", {ty}>(c"))).count();
            assert!(w16 >= 5, "seed_cnn {precision:?} {spec}: {w16} contractions on 16-bit wgmma");
            let staged = m.kernels.iter().filter(|k| k.ends_with("_w")).count();
            assert_eq!(
                staged > 0,
                !spec.contains("wexpand=tile"),
                "seed_cnn {precision:?} {spec}: {staged} staged"
            );
            if nvrtc {
                let cubin = cvc_runtime::cuda::compile_cubin(&m.source, &m.arch)
                    .unwrap_or_else(|e| panic!("seed_cnn {precision:?} {spec}: {e}"));
                eprintln!("seed_cnn {precision:?} {spec}: {} bytes of {} cubin", cubin.len(), m.arch);
            }
        }
    }
}

/// TF32 tensor cores (`mma.sync` on TF32) need compute capability 8.0: an older target is an
/// error that says so, not a module NVRTC rejects.
#[test]
fn tf32_for_a_device_without_tf32_is_an_error() {
    let (_, program) = variant_programs().into_iter().find(|(f, _)| f == "seed_cnn.cvnn").expect("seed_cnn");
    let turing = cvc_compiler::target::CudaDevice {
        compute_capability: (7, 5),
        ..cvc_compiler::target::CudaDevice::h200()
    };
    let target = CudaTarget { device: turing, precision: Precision::Tf32, ..CudaTarget::h200() };
    let e = cuda::generate(&program, &target).expect_err("TF32 on sm_75");
    assert!(e.to_string().contains("compute capability 8.0") && e.to_string().contains("sm_75"), "{e}");
    assert!(cuda::generate(&program, &CudaTarget { precision: Precision::Fp32, ..target }).is_ok());
}

/// Every variant of the fused attention kernels (`cvc_tests::attention::cases`: both scores,
/// causal, key mask, dropout, head dimensions 8 to 128, tails of every tile) is generated as
/// its four kernels (log-sum-exp, forward, dq, dk‖dv: no `[T, S]` value in the plan) and the
/// module compiles with NVRTC for sm_90; on a device with half the shared memory per block
/// the kernels take smaller tiles and still compile.
#[test]
fn attention_kernels_compile_with_nvrtc_for_sm90() {
    use cvc_compiler::passes::fusion::GroupKind;
    let nvrtc = nvrtc_or_skip();
    let small = CudaTarget {
        device: cvc_compiler::target::CudaDevice {
            shared_per_block: 24 * 1024,
            shared_per_block_optin: 24 * 1024,
            ..cvc_compiler::target::CudaDevice::h200()
        },
        ..CudaTarget::h200()
    };
    for c in cvc_tests::attention::cases() {
        let name = c.name();
        let program = cvc_tests::attention::program(&c, 3);
        let attn = program.groups.iter().filter(|g| g.kind == GroupKind::Attention).count();
        assert_eq!(attn, 3, "{name}: forward (with the log-sum-exp) and two gradient kernels expected");
        let (t, s) = (c.t, c.s);
        for (v, n) in program.graph.nodes.iter() {
            let shape = n.ty.shape.resolve(3);
            let ts = shape.windows(2).any(|w| (w[0] == t && w[1] == s) || (w[0] == s && w[1] == t));
            assert!(!ts, "{name}: {v} ({}) has a [T, S] shape {shape:?}", n.op.mnemonic());
        }
        for target in [CudaTarget::h200(), small.clone()] {
            let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{name}: {e}"));
            for f in ["attn_fwd_lse<", "attn_dq<", "attn_dkv<"] {
                assert_eq!(module.source.matches(f).count(), 1, "{name}: one call of {f}");
            }
            if !nvrtc {
                continue;
            }
            let cubin = cvc_runtime::cuda::compile_cubin(&module.source, "sm_90")
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            for k in &module.kernels {
                let needle = format!("{k}\0");
                assert!(cubin.windows(needle.len()).any(|w| w == needle.as_bytes()), "{name}: {k} missing");
            }
            eprintln!("{name}: {} kernels, {} bytes of cubin", module.kernels.len(), cubin.len());
        }
    }
}

/// At bf16 a key mask that a kernel made (`step(m)`) is stored in 16 bits, and the attention
/// kernels read it as stored: every masked case's module compiles (it did not while the
/// templates took the mask as `const float*`).
#[test]
fn attention_with_a_16_bit_mask_compiles_with_nvrtc() {
    let nvrtc = nvrtc_or_skip();
    let mut masked = 0;
    for c in cvc_tests::attention::cases().into_iter().filter(|c| c.mask) {
        let name = c.name();
        let program = cvc_tests::attention::program_stored(&c, 3, true, Precision::Bf16.storage());
        let m = program.graph.nodes.iter().find(|(_, n)| n.op.mnemonic() == "step").map(|(v, _)| v);
        let m = m.unwrap_or_else(|| panic!("{name}: no mask"));
        assert!(program.graph.storage(m).is_half(), "{name}: the mask is stored in 16 bits");
        let target = CudaTarget::h200().with_precision(Precision::Bf16);
        let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(module.source.contains("(bf16s*)"), "{name}: a 16-bit operand");
        masked += 1;
        if nvrtc {
            cvc_runtime::cuda::compile_cubin(&module.source, "sm_90")
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    assert!(masked >= 3, "{masked} masked cases");
}

/// A head wider than the kernels' 128 is a user error naming the width, not a panic or an
/// internal error.
#[test]
fn attention_heads_wider_than_128_are_a_user_error() {
    let c = cvc_tests::attention::AttnCase {
        h: 1,
        t: 4,
        s: 4,
        d: 130,
        dv: 8,
        abs: false,
        causal: false,
        mask: false,
        dropout: None,
        layout: cvc_tests::attention::Layout::Separate,
    };
    let program = cvc_tests::attention::program(&c, 2);
    let e = cuda::generate(&program, &CudaTarget::h200()).expect_err("too wide").to_string();
    assert!(e.contains("dimension 130") && e.contains("at most 128"), "{e}");
    assert!(!e.to_lowercase().contains("internal"), "{e}");
}

/// The buffers a launch's kernel group reads and writes, and the largest of them and of its
/// domain in floats (a complex element counts two): what its index type depends on, read
/// from the graph independently of the code generator.
fn largest_touched(program: &cvc_compiler::passes::Program, gi: usize) -> usize {
    let g = &program.graph;
    let batch = program.plan.batch;
    let k = &program.groups[gi];
    let floats = |v: cvc_compiler::ir::Value| {
        let t = g.ty(v);
        t.shape.numel(batch) * if t.dtype == cvc_compiler::ir::DType::C64 { 2 } else { 1 }
    };
    let buffers = k.inputs.iter().chain(&k.outputs).map(|&v| floats(v));
    buffers.chain([k.domain.numel(batch)]).max().unwrap_or(0)
}

/// The kernel chunk of `name` in a module's source (its `// group`, `// index` lines and code).
fn chunk_of<'a>(chunks: &'a [String], name: &str) -> &'a str {
    chunks
        .iter()
        .find(|c| c.contains(&format!(" {name}(char* A)")))
        .unwrap_or_else(|| panic!("no kernel {name} in the source"))
}

/// The seed network at batch 95,000 (about what fills 120 GiB on an H200) and at batch 1024:
/// the index type is chosen per kernel. At 95,000 every kernel touching a buffer of 2³¹
/// floats or more (activations and their gradients, from the graph) indexes with 64 bits,
/// and kernels over small buffers (the parameters' updates) keep 32-bit indices; at 1024
/// every kernel is 32-bit. Each choice shows in the source (`typedef u64 ix;` and the
/// `// index:` line) and in the launch list.
#[test]
fn index_width_is_chosen_per_kernel_from_the_plan() {
    use cvc_compiler::back::cuda::{CudaStep, IndexWidth, INDEX32_LIMIT};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/seed_cnn.cvnn");
    let src = std::fs::read_to_string(&path).expect("readable example");
    for batch in [95_000, 1024] {
        let checked = check_source("seed_cnn.cvnn", &src, Mode::Train).expect("checks");
        let opts = Options { batch, optimizer: checked.train.optimizer.clone(), ..Options::default() };
        let program = compile(checked.graph, &opts).expect("compiles");
        let module = cuda::generate(&program, &CudaTarget::h200()).expect("generates");
        let (_, chunks) = kernel_chunks(&module.source);
        let (mut wide, mut narrow) = (0, 0);
        for step in &module.steps {
            let CudaStep::Launch(l) = step else { continue };
            let largest = largest_touched(&program, l.group);
            assert!(l.index.largest >= largest, "{}: largest extent {} < {largest}", l.name, l.index.largest);
            let chunk = chunk_of(&chunks, &l.name);
            match l.index.width {
                IndexWidth::U64 => {
                    wide += 1;
                    assert!(
                        chunk.contains("typedef u64 ix;") && chunk.contains("// index: 64-bit"),
                        "{chunk}"
                    );
                }
                IndexWidth::U32 => {
                    narrow += 1;
                    assert!(
                        chunk.contains("typedef u32 ix;") && chunk.contains("// index: 32-bit"),
                        "{chunk}"
                    );
                }
            }
            if largest >= INDEX32_LIMIT {
                assert_eq!(
                    l.index.width,
                    IndexWidth::U64,
                    "{} touches {largest} floats at batch {batch}",
                    l.name
                );
            } else if largest < INDEX32_LIMIT / 4 {
                assert_eq!(
                    l.index.width,
                    IndexWidth::U32,
                    "{} touches {largest} floats at batch {batch}",
                    l.name
                );
            }
        }
        eprintln!("batch {batch}: {wide} kernels with 64-bit indices, {narrow} with 32-bit");
        if batch == 1024 {
            assert_eq!(wide, 0, "batch 1024 needs no 64-bit index");
        } else {
            assert!(wide >= 10, "the convolutions, batchnorms and activations of batch 95,000: {wide}");
            assert!(narrow >= 3, "the parameter updates keep 32-bit indices: {narrow}");
        }
    }
}

/// The batch at which `checked`'s largest value holds about `floats` floats.
fn batch_for_floats(checked: &cvc_compiler::front::Checked, floats: usize) -> usize {
    let per_sample = checked
        .graph
        .nodes
        .iter()
        .map(|(_, n)| {
            let f = if n.ty.dtype == cvc_compiler::ir::DType::C64 { 2 } else { 1 };
            (n.ty.shape.numel(2) - n.ty.shape.numel(1)) * f
        })
        .max()
        .unwrap_or(1);
    floats.div_ceil(per_sample.max(1)).max(2)
}

/// Every example and fixture at a batch where its largest value holds 2³³ floats — past
/// what 32-bit indices reach — plan only, nothing allocated: code generation succeeds (no
/// 32-bit refusal; contraction grids within the device's limits or folded), every kernel
/// touching a buffer of 2³¹ floats or more indexes with 64 bits, and with NVRTC every kernel
/// compiles for sm_90 (each kernel structure once, as the variant test does; fp32, and TF32
/// for the examples).
#[test]
fn every_model_at_a_huge_batch_generates_64_bit_kernels_that_compile() {
    use cvc_compiler::back::cuda::{CudaStep, IndexWidth, INDEX32_LIMIT};
    let nvrtc = nvrtc_or_skip();
    let mut seen = HashSet::new();
    let mut todo: Vec<(String, String)> = Vec::new();
    let mut prelude = String::new();
    for path in cvnn_files() {
        let src = std::fs::read_to_string(&path).expect("readable .cvnn");
        let name = path.file_name().expect("file name").to_string_lossy().into_owned();
        let mut checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        if checked.graph.loss.is_none() {
            checked = check_source(&name, &src, Mode::Eval).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        }
        let batch = batch_for_floats(&checked, 1 << 33);
        let opts = Options { batch, optimizer: checked.train.optimizer.clone(), ..Options::default() };
        let program =
            compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name} at batch {batch}: {e}"));
        let example = path.parent().is_some_and(|d| d.ends_with("examples"));
        let precisions: &[Precision] =
            if example { &[Precision::Fp32, Precision::Tf32] } else { &[Precision::Fp32] };
        for &precision in precisions {
            let target = CudaTarget::h200().with_precision(precision);
            let module = cuda::generate(&program, &target)
                .unwrap_or_else(|e| panic!("{name} at batch {batch} ({precision:?}): {e}"));
            let mut wide = 0;
            for step in &module.steps {
                let CudaStep::Launch(l) = step else { continue };
                if largest_touched(&program, l.group) >= INDEX32_LIMIT {
                    assert_eq!(l.index.width, IndexWidth::U64, "{name}: {}", l.name);
                }
                wide += usize::from(l.index.width == IndexWidth::U64);
                let max = target.device.max_grid;
                assert!(
                    l.grid.iter().zip(&max).all(|(&g, &m)| g as usize <= m),
                    "{name}: {} grid {:?}",
                    l.name,
                    l.grid
                );
            }
            assert!(wide > 0 || !example, "{name} at batch {batch}: no 64-bit kernel");
            eprintln!(
                "{name} at batch {batch} ({precision:?}): {wide} of {} kernels 64-bit",
                module.kernels.len()
            );
            // The template libraries (emitted once, before the first kernel using them) go
            // to the prelude, so every attention and recurrence kernel compiles in any module.
            let (p, chunks) = kernel_chunks(&module.source);
            prelude = p;
            let chunks: Vec<String> = chunks.iter().map(|c| without_libraries(c)).collect();
            // NVRTC compiles the examples' new structures (every model's 64-bit kernels are
            // generated and checked above; the fixtures' kernel forms are the examples' and
            // the tests' above): this test's compile share of CI stays small.
            for c in chunks.into_iter().filter(|_| example) {
                if seen.insert(structure(&c)) {
                    todo.push((format!("{name} ({precision:?})"), c));
                }
            }
        }
    }
    if !nvrtc {
        return;
    }
    compile_chunks(&format!("{prelude}{}", cuda::LIBRARIES.concat()), &todo);
}

/// A linear layer at a batch of 5 million samples: its matmul's tiles need more than 65535
/// blocks along y, so the implicit GEMM folds its grid into x; the folded grid covers every
/// tile once, and the module compiles with NVRTC.
#[test]
fn contraction_grids_past_65535_blocks_fold_into_x() {
    use cvc_compiler::back::cuda::CudaStep;
    let src = "model Wide {\n  input x: c64[B, 10]\n  input t: c64[B, 4]\n  y = x |> linear(4, bias = false)\n  output y\n  loss l1(y, t)\n}\n";
    let checked = check_source("wide.cvnn", src, Mode::Train).expect("checks");
    let opts = Options { batch: 5_000_000, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let program = compile(checked.graph, &opts).expect("compiles");
    let module = cuda::generate(&program, &CudaTarget::h200()).expect("generates");
    let (prelude, chunks) = kernel_chunks(&module.source);
    let mut folded = 0;
    for step in &module.steps {
        let CudaStep::Launch(l) = step else { continue };
        // The folded tile row: `(((ix)blockIdx.x / X) % Y)`; X·Y·Z blocks on x alone, at
        // least one per 64-row tile of the 5 million rows.
        if chunk_of(&chunks, &l.name).contains("(((ix)blockIdx.x / ") {
            assert_eq!(l.grid[1..], [1, 1], "{}", l.name);
            assert!(l.grid[0] as usize >= 5_000_000 / 64, "{}: {:?}", l.name, l.grid);
            folded += 1;
        }
    }
    assert!(folded >= 1, "no folded contraction grid:\n{}", module.source);
    if nvrtc_or_skip() {
        let todo: Vec<(String, String)> = chunks.into_iter().map(|c| ("wide".to_string(), c)).collect();
        compile_chunks(&prelude, &todo);
    }
}

/// Compiles kernel chunks to PTX for sm_90, 16 to a module with the prelude, each renamed
/// after its place in the list (kernels of different programs share names).
fn compile_chunks(prelude: &str, todo: &[(String, String)]) {
    for (n, batch) in todo.chunks(16).enumerate() {
        let mut module = prelude.to_string();
        let mut names = Vec::new();
        for (i, (what, chunk)) in batch.iter().enumerate() {
            let name = chunk.split("(char* A)").next().and_then(|s| s.rsplit(' ').next());
            let name = name.unwrap_or_else(|| panic!("{what}: a kernel without a name"));
            let renamed = format!("h{n}_{i}_{name}");
            module.push_str(&chunk.replacen(
                &format!(" {name}(char* A)"),
                &format!(" {renamed}(char* A)"),
                1,
            ));
            names.push((what, renamed));
        }
        let ptx = cvc_runtime::cuda::compile_ptx(&module, "sm_90").unwrap_or_else(|e| {
            panic!("kernels of {:?}: {e}", names.iter().map(|n| n.0).collect::<Vec<_>>())
        });
        for (what, name) in names {
            assert!(ptx.contains(&format!(".entry {name}(")), "{what}: {name} missing from the PTX");
        }
    }
    eprintln!("{} kernels compiled", todo.len());
}

/// Chunked back-propagation through time: the recurrent fixtures with their recurrences
/// back-propagated in chunks (recurrences and their gradients from a checkpointed initial
/// state, a pointer operand of the kernels), and the 4,096-step GRU that `--memory-budget
/// 200MiB` chunks at batch 32, generate kernels that compile with NVRTC for sm_90.
#[test]
fn chunked_recurrence_kernels_compile_with_nvrtc() {
    let nvrtc = nvrtc_or_skip();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let long = "model LongGru {
    input iq:    c64[B, 4096, 2]
    input label: class[B] of 5
    state = iq |> gru(32, returns = last)
    logits = state |> linear(5) |> abs
    output logits
    loss cross_entropy(logits, label)
}";
    let mut cases = Vec::new();
    for (rel, chunk) in [("tests/fixtures/ok/recurrent.cvnn", 2), ("tests/fixtures/ok/recurrent.cvnn", 4)] {
        let src = std::fs::read_to_string(root.join(rel)).expect("readable fixture");
        cases.push((
            format!("{rel} in chunks of {chunk}"),
            src,
            Options { batch: 3, rnn_chunk: Some(chunk), ..Options::default() },
        ));
    }
    let budget = Options { batch: 32, memory_budget: Some(200 << 20), ..Options::default() };
    cases.push(("the 4,096-step GRU under 200 MiB".into(), long.to_string(), budget));
    for (name, src, opts) in cases {
        let checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(program.facts.rnn_chunk.is_some(), "{name}: not chunked");
        let module = cuda::generate(&program, &CudaTarget::h200()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let calls = |f: &str| module.source.lines().filter(|l| l.contains(f)).collect::<Vec<_>>();
        for f in ["rnn_fwd<", "rnn_bwd<"] {
            let (from_state, from_zero): (Vec<&str>, Vec<&str>) =
                calls(f).into_iter().partition(|l| !l.contains("(const float2*)0"));
            assert!(!from_state.is_empty() && !from_zero.is_empty(), "{name}: {f} from h0 and from zeros");
        }
        if !nvrtc {
            continue;
        }
        let cubin = cvc_runtime::cuda::compile_cubin(&module.source, "sm_90")
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for k in &module.kernels {
            let needle = format!("{k}\0");
            assert!(cubin.windows(needle.len()).any(|w| w == needle.as_bytes()), "{name}: {k} missing");
        }
        eprintln!("{name}: {} kernels, {} bytes of cubin", module.kernels.len(), cubin.len());
    }
}

/// Every batched launch of small elementwise and data-movement kernels (`ewbatch`, on by
/// default) holds groups whose blocks may run in any order: none depends on another through
/// the schedule's dependencies (directly or through views and groups between them), and none
/// writes bytes of the real memory plan (buffers reused after they die) that another reads or
/// writes.
/// Every example and fixture at fp32 and bf16; the seed network and the ViT must batch some.
#[test]
fn batched_elementwise_launches_hold_independent_groups() {
    use cvc_compiler::ir::Op;
    use cvc_compiler::passes::fusion::{Fusion, GroupKind};
    let mut batched_in = HashSet::new();
    let files: Vec<PathBuf> = cvnn_files();
    for (path, precision) in files.iter().flat_map(|p| [(p, Precision::Fp32), (p, Precision::Bf16)]) {
        let name = path.file_name().expect("file name").to_string_lossy().into_owned();
        let src = std::fs::read_to_string(path).expect("readable .cvnn");
        let mut checked = check_source(&name, &src, Mode::Train).expect("checks");
        if checked.graph.loss.is_none() {
            checked = check_source(&name, &src, Mode::Eval).expect("checks");
        }
        let opts = Options {
            batch: 64,
            optimizer: checked.train.optimizer.clone(),
            half: precision.storage(),
            ..Options::default()
        };
        let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let module = cuda::generate(&program, &CudaTarget::h200().with_precision(precision))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let g = &program.graph;
        let fusion = Fusion { groups: program.groups.clone(), recomputed: Vec::new() };
        let deps = cvc_compiler::passes::schedule::dependencies(g, &fusion);
        let depends_on = |b: usize, a: usize| {
            let (mut todo, mut seen) = (vec![b], HashSet::new());
            while let Some(x) = todo.pop() {
                for &d in &deps[x] {
                    if d == a {
                        return true;
                    }
                    if seen.insert(d) {
                        todo.push(d);
                    }
                }
            }
            false
        };
        let bytes = |v: cvc_compiler::ir::Value| {
            let s = program.plan.slot(v).unwrap_or_else(|| panic!("{name}: {v} has no buffer"));
            (s.offset, s.offset + s.bytes.max(1))
        };
        let reads = |gi: usize| {
            let k = &program.groups[gi];
            let mut r: Vec<_> = k.inputs.clone();
            for &h in &k.nodes {
                r.extend(g.node(h).inputs.iter().filter(|&&i| program.plan.slot(i).is_some()).copied());
            }
            r.into_iter().map(bytes).collect::<Vec<_>>()
        };
        let writes = |gi: usize| {
            program.groups[gi]
                .outputs
                .iter()
                .map(|&o| match g.node(o).op {
                    // An `Assign` stores into its target's buffer.
                    Op::Assign => bytes(g.node(o).inputs[0]),
                    _ => bytes(o),
                })
                .collect::<Vec<_>>()
        };
        let meet = |a: (usize, usize), b: (usize, usize)| a.0 < b.1 && b.0 < a.1;
        for (code, _) in &module.kernel_code {
            let members: Vec<usize> = code
                .lines()
                .filter_map(|l| l.strip_prefix("// group ")?.split(':').next()?.parse().ok())
                .collect();
            if !code.contains("  else if (blockIdx.x < ") {
                continue;
            }
            batched_in.insert(name.clone());
            assert!(members.len() > 1, "{name}: a batched kernel names {members:?}");
            for (i, &a) in members.iter().enumerate() {
                assert!(
                    matches!(program.groups[a].kind, GroupKind::Elementwise | GroupKind::Movement),
                    "{name}: group {a}"
                );
                for &b in &members[i + 1..] {
                    assert!(!depends_on(b, a), "{name}: batched group {b} depends on group {a}");
                    for (x, y) in [(a, b), (b, a)] {
                        for w in writes(x) {
                            assert!(
                                reads(y).into_iter().chain(writes(y)).all(|r| !meet(w, r)),
                                "{name} ({precision:?}): batched group {x} writes bytes {w:?} that group {y} touches"
                            );
                        }
                    }
                }
            }
        }
    }
    for must in ["seed_cnn.cvnn", "vit_sar.cvnn"] {
        assert!(batched_in.contains(must), "{must}: no batched elementwise launch ({batched_in:?})");
    }
}
