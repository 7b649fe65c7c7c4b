//! The CUDA back end's contraction kernels (implicit-GEMM convolutions, their input and weight
//! gradients, dense layers; the direct kernels where the plan picks them) compiled for the host
//! and run against the interpreter, in fp32 (FMA tiles), in TF32 (tensor-core tiles) and in
//! bf16 (16-bit activations and products) under the staging, tile, gather and fragment choices
//! of the target (`KernelConfig`). No GPU: the kernels run
//! under the emulated CUDA block of `cvc_tests::hostcuda` (`mma.sync` TF32 and `cp.async`
//! included). Each launch runs on an arena holding the interpreter's values of its operands
//! (rounded to f32) and what it writes must match the interpreter's replay of its group on
//! them within f32 accumulation, plus TF32 operand rounding (`2·u·Σ|a||b|`, u = 2⁻¹¹) where
//! tensor cores ran. The layers cover every gather form: padded, strided, rectangular,
//! dilated, grouped, 1 × 1 and transposed convolutions, a first layer too thin for tensor
//! cores, and dense layers.

use cvc_compiler::back::cuda::{self, CudaStep};
use cvc_compiler::config::Precision;
use cvc_compiler::front::check_source;
use cvc_compiler::interp::replay::replay_group;
use cvc_compiler::interp::{evaluate, SplitMix64, Tensor, TensorData};
use cvc_compiler::ir::{Mode, Storage, Value};
use cvc_compiler::passes::fusion::GroupKind;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;
use cvc_compiler::target::{CudaDevice, CudaTarget, KernelConfig};
use cvc_tests::differential::{magnitude, random_leaves};
use cvc_tests::hostcuda::{flat, rounded_as, run_group, HostLaunch, HostSource};
use cvc_tests::seed::seed_for;
use std::collections::HashMap;

/// Every gather form, trained so that each layer has its weight and input gradients too; the
/// first layer (9 terms per output) is one that the reduced precisions run on the direct FMA
/// kernels (`conv.rs::too_shallow_for_tensor_cores`).
const SOURCE: &str = r#"
model Contractions {
    input x:     c64[B, 1, 16, 16]
    input label: class[B] of 3
    y = x |> conv2d(4, kernel = 3, pad = 1, bias = false) |> avgpool2d(2)
          |> conv2d(8, kernel = 3, pad = 1, bias = false)
          |> conv2d(8, kernel = (3, 5), pad = (1, 2), stride = (2, 1), bias = false)
          |> conv2d(8, kernel = 3, pad = 2, dilation = 2, groups = 2, bias = false)
          WIDE|> conv2d(6, kernel = 1, bias = false)
          |> conv_transpose2d(4, kernel = 3, stride = 2, pad = 1, output_padding = 1, bias = false)
          |> flatten |> linear(72) |> crelu |> linear(96) |> crelu |> linear(3) |> abs
    output y
    loss cross_entropy(y, label)
}

train Contractions {
    data      = synthetic.random(count = 16, seed = 1)
    batch     = 3
    optimizer = sgd(lr = 1e-3)
}
"#;

/// Which tensor-core instruction a launch's kernel multiplies with, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TensorCores {
    None,
    /// `mma.sync` on TF32 operands rounded to nearest.
    Sync,
    /// `mma.sync` on 16-bit operands (bf16 or f16).
    Sync16,
    /// `wgmma` (f32 operands truncated to TF32).
    Wgmma,
    /// `wgmma` on 16-bit operands (`tc16=wgmma`: a complex operand's raw pairs by the other's
    /// expansion, rounded to the 16-bit format).
    Wgmma16,
}

/// A replay's values by IR value.
type Replayed = HashMap<Value, Tensor>;

/// TF32's (and IEEE half's) unit roundoff: 10 stored mantissa bits, rounded to nearest.
const TF32_UNIT_ROUNDOFF: f64 = 1.0 / 2048.0;
/// The operand error of a product of split TF32 operands (`fp32=3xtf32`): each operand is
/// `h + l` with `h` rounded to TF32 (`|l| ≤ 2⁻¹¹|x|`) and `l` rounded to TF32 (`2⁻²²|x|`); the
/// dropped `l·l'` and the two rounded low parts leave at most `3·2⁻²²|a||b|`, within
/// `2·u·|a||b|` for this `u`.
const SPLIT_TF32_UNIT: f64 = 1.0 / (1u64 << 21) as f64;
/// bfloat16's unit roundoff: 7 stored mantissa bits.
const BF16_UNIT_ROUNDOFF: f64 = 1.0 / 256.0;

/// The network's training step, its activations stored as `precision` stores them.
fn program(precision: Precision) -> Program {
    // At 32 bits, a 64-channel layer too (its weight gradient: 64 rows by 72 columns, which
    // `wgmma` tiles 96 wide); its sums would pass fp16's range.
    let wide = match precision {
        Precision::Bf16 | Precision::Fp16 => "",
        _ => "|> conv2d(64, kernel = 3, pad = 1, bias = false) ",
    };
    compiled(&SOURCE.replace("WIDE", wide), precision)
}

/// The training step of `source` at batch 3, its activations stored as `precision` stores them.
fn compiled(source: &str, precision: Precision) -> Program {
    let checked = check_source("contractions.cvnn", source, Mode::Train).unwrap_or_else(|d| panic!("{d:?}"));
    let opts = Options {
        batch: 3,
        optimizer: checked.train.optimizer.clone(),
        half: precision.storage(),
        ..Options::default()
    };
    compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{e}"))
}

/// Every contraction launch of the program under each of `specs` at `precision`, run on the
/// host against the interpreter; returns the launches checked, how many ran tensor cores, how
/// many of those `wgmma`, and how many of those with two warpgroups (a tile of 128 rows).
fn check(precision: Precision, specs: &[&str]) -> (usize, usize, usize, usize) {
    check_program(&program(precision), precision, specs, &CudaDevice::h200())
}

/// [`check`] on the contractions of `program`, generated for `device`.
fn check_program(
    program: &Program,
    precision: Precision,
    specs: &[&str],
    device: &CudaDevice,
) -> (usize, usize, usize, usize) {
    let g = &program.graph;
    let batch = program.plan.batch;
    let mut source = HostSource::default();
    let mut launches = Vec::new();
    for (si, spec) in specs.iter().enumerate() {
        let kernels = KernelConfig::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let target = CudaTarget { device: device.clone(), ..CudaTarget::h200() }
            .with_precision(precision)
            .with_kernels(kernels);
        let module = cuda::generate(program, &target).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let arena = module.scratch.0 + module.scratch.1;
        // The launches before a group's own that stage its operand (`wexpand=pre`).
        let mut before: Vec<HostLaunch> = Vec::new();
        let steps: Vec<&cuda::KernelLaunch> = module
            .steps
            .iter()
            .filter_map(|s| if let CudaStep::Launch(l) = s { Some(l) } else { None })
            .collect();
        for (li, l) in steps.iter().enumerate() {
            if program.groups[l.group].kind != GroupKind::Contraction {
                continue;
            }
            assert_eq!(l.block[1..], [1, 1], "{spec} {}: a one-dimensional block", l.name);
            let at = module.kernels.iter().position(|k| k == &l.name).expect("a kernel of the module");
            let name = format!("v{si}_{}", l.name);
            source.kernel(&module, &l.name, &name);
            let code = &module.kernel_code[at].0;
            let tensor_cores = if code.contains("wgmma16<") {
                TensorCores::Wgmma16
            } else if code.contains("wgmma_tf32<") {
                TensorCores::Wgmma
            } else if code.contains("mma_tf32(") {
                TensorCores::Sync
            } else if ["mma_bf16(", "mma_f16("].iter().any(|m| code.contains(m)) {
                TensorCores::Sync16
            } else {
                TensorCores::None
            };
            let host = HostLaunch { name, grid: l.grid, threads: l.block[0], shared: l.shared_bytes };
            if steps.get(li + 1).is_some_and(|next| next.group == l.group) {
                before.push(host);
                continue;
            }
            let host: Vec<HostLaunch> = before.drain(..).chain([host]).collect();
            // Split TF32 operands (`fp32=3xtf32`): the split's bound, not TF32's.
            let split = code.contains("tf32_lo(");
            // A split of K over blocks accumulates with atomics into a zeroed output.
            launches.push((spec.to_string(), host, l.group, tensor_cores, split, arena));
        }
    }
    // (One folder per test: tests of one precision run side by side.)
    let tag: String = format!("{}{}", device.sm_count, specs.concat())
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let host = source.build(&format!("gemm-{precision:?}-{tag}"));
    let mut rng = SplitMix64::new(seed_for(&format!("gemm_host::{precision:?}")));
    let leaves = random_leaves(g, batch, &mut rng);
    // Every value as its buffer holds it (f32, or the 16-bit format).
    let values: Vec<Option<Tensor>> = evaluate(g, batch, &leaves)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.map(|t| rounded_as(&t, g.storage(Value::from_index(i)))))
        .collect();
    let mut failures = Vec::new();
    // Per group: the interpreter's outputs, and Σ|a||b| per output element.
    let mut cache: HashMap<usize, (Replayed, Replayed)> = HashMap::new();
    for (spec, run, gi, tensor_cores, split, arena) in &launches {
        let launch = run.last().expect("a group's own launch");
        let group = &program.groups[*gi];
        let (want, mag) = cache.entry(*gi).or_insert_with(|| {
            let operands: HashMap<Value, Tensor> =
                group.inputs.iter().map(|&i| (i, values[i.index()].clone().expect("an operand"))).collect();
            let want =
                replay_group(g, batch, &group.nodes, &operands).unwrap_or_else(|e| panic!("{e}")).values;
            let abs: HashMap<Value, Tensor> = operands.iter().map(|(&v, t)| (v, magnitude(t))).collect();
            let mag = replay_group(g, batch, &group.nodes, &abs).unwrap_or_else(|e| panic!("{e}")).values;
            (want, mag)
        });
        let outs =
            run_group(&host, program, *gi, run, *arena, &values).unwrap_or_else(|e| panic!("{spec}: {e}"));
        for (o, got) in outs {
            let w = flat(&want[&o]);
            let m = mag[&o].to_complex_vec();
            let per = if matches!(want[&o].data, TensorData::Complex(_)) { 2 } else { 1 };
            assert_eq!(got.len(), w.len(), "{spec} {}: {o}'s length", launch.name);
            // Operand rounding of the products: TF32 (also 16-bit operands under
            // `tc16=tf32`, the H200's default for convolutions) or the 16-bit format itself
            // (f16's unit is TF32's); a 16-bit output's own rounding.
            let u = match (*tensor_cores, precision) {
                (TensorCores::None, _) => 0.0,
                _ if *split => SPLIT_TF32_UNIT,
                // `wgmma` reads f32 operands as TF32 by truncation: twice rounding's unit.
                (TensorCores::Wgmma, _) => 2.0 * TF32_UNIT_ROUNDOFF,
                (TensorCores::Sync16 | TensorCores::Wgmma16, Precision::Bf16) => BF16_UNIT_ROUNDOFF,
                (TensorCores::Sync | TensorCores::Sync16 | TensorCores::Wgmma16, _) => TF32_UNIT_ROUNDOFF,
            };
            let store = match g.storage(o) {
                Storage::Full => 0.0,
                Storage::F16 => TF32_UNIT_ROUNDOFF,
                _ => BF16_UNIT_ROUNDOFF,
            };
            let worst = got
                .iter()
                .zip(&w)
                .enumerate()
                .map(|(i, (&a, &b))| {
                    let s = m[i / per].norm();
                    // f32 accumulation over at most a few hundred terms, plus the operands'
                    // rounding, plus the output's own.
                    let allowed = (2.01 * u + 4e-5) * s + store * b.abs() + 1e-6;
                    (i, (a as f64 - b).abs() / allowed)
                })
                .fold((0, 0.0f64), |x, y| if y.1 > x.1 || y.1.is_nan() { y } else { x });
            if worst.1.is_nan() || worst.1 > 1.0 {
                failures.push(format!(
                    "{spec} {} ({}): element {} is {} where the interpreter gives {} ({:.2}x the bound)",
                    launch.name,
                    g.node(o).op.mnemonic(),
                    worst.0,
                    got[worst.0],
                    w[worst.0],
                    worst.1
                ));
            }
        }
    }
    let tc = launches.iter().filter(|l| l.3 != TensorCores::None).count();
    let split = launches.iter().filter(|l| l.4).count();
    // At fp32 the tensor cores run only on split operands; elsewhere never split.
    let want_split = if precision == Precision::Fp32 { tc } else { 0 };
    assert_eq!(split, want_split, "launches with split TF32 operands at {precision:?}");
    let on_wgmma = |t: TensorCores| matches!(t, TensorCores::Wgmma | TensorCores::Wgmma16);
    let wgmma = launches.iter().filter(|l| on_wgmma(l.3)).count();
    let two =
        launches.iter().filter(|l| on_wgmma(l.3) && l.1.last().is_some_and(|h| h.threads == 256)).count();
    eprintln!("{precision:?}: {wgmma} wgmma launches, {two} of them with two warpgroups");
    eprintln!("{precision:?}: {} contraction launches ({tc} on tensor cores) checked", launches.len());
    assert!(
        failures.is_empty(),
        "host-compiled contraction kernels vs the interpreter:\n{}",
        failures.join("\n")
    );
    (launches.len(), tc, wgmma, two)
}

#[test]
fn fp32_contraction_kernels_compiled_for_the_host_match_the_interpreter() {
    let (n, tc, ..) = check(Precision::Fp32, &["", "cmul=3m", "ftile=128", "conv=gemm,wgrad=gemm"]);
    assert!(n >= 4 * 12, "{n} launches");
    assert_eq!(tc, 0);
}

#[test]
fn fp32_split_tf32_contraction_kernels_compiled_for_the_host_match_the_interpreter() {
    // `fp32=3xtf32`: the tensor-core kernels on split operands, held to the split's bound (a
    // missing low-part product exceeds it 1.2 to 6 times): `wgmma` with 2 and 3 K
    // tiles and the taps' table, and `mma.sync` under asynchronous (interleaved complex
    // planes) and register staging (separate re / im planes).
    let specs = [
        "fp32=3xtf32",
        "fp32=3xtf32,tcstages=2,tctaps=table",
        "fp32=3xtf32,wga=smem",
        "fp32=3xtf32,mma=sync",
        "fp32=3xtf32,mma=sync,tc=prefetch",
    ];
    let (n, tc, wgmma, two) = check(Precision::Fp32, &specs);
    assert!(tc >= specs.len() * 8, "only {tc} of {n} launches ran tensor cores");
    assert!(wgmma >= 3 * 8 && wgmma < tc, "{wgmma} of {tc} tensor-core launches on wgmma");
    assert!(two >= 2, "the 128-row tiles (two warpgroups) did not run");
    assert!(tc < n, "the first layer's direct kernels did not run");
}

#[test]
fn tf32_contraction_kernels_compiled_for_the_host_match_the_interpreter() {
    // Per-warp `mma.sync` (`mma=sync`, the form of devices before Hopper): its defaults (4-warp
    // tiles, a ring of 3 K tiles), the taps' table, 2 and 4 stages, the 8-warp and 128-wide
    // tiles, and the register-staged forms.
    let specs = [
        "mma=sync",
        "mma=sync,tctaps=table",
        "mma=sync,tctaps=mask",
        "mma=sync,tcstages=2",
        "mma=sync,tcstages=4",
        "mma=sync,tctile=64",
        "mma=sync,tctile=128",
        "mma=sync,tc=prefetch",
        "mma=sync,tc=plain",
    ];
    let (n, tc, wgmma, _) = check(Precision::Tf32, &specs);
    assert!(tc >= specs.len() * 8, "only {tc} of {n} launches ran tensor cores");
    assert!(tc < n, "the first layer's direct kernels did not run");
    assert_eq!(wgmma, 0, "wgmma under `mma=sync`");
}

#[test]
fn tf32_wgmma_contraction_kernels_compiled_for_the_host_match_the_interpreter() {
    // Hopper's warpgroup products (the default on compute capability 9.0): the default ring
    // of 3 K tiles and 128 columns, 64 columns, 2 tiles, the taps' table and its window masks
    // (whose padding past K the layers of 36, 72 and 120 taps read), the products kept in
    // flight (3 and 4 tiles), the row operand from shared memory (128 and 64 columns); every
    // contraction but the thin first layer's on `wgmma`, the weight gradient of `linear(72)`
    // on 128-row tiles.
    let specs = [
        "",
        "tctile=64",
        "tcstages=2",
        "tctaps=table",
        "tctaps=mask",
        "wgwait=1",
        "wgwait=1,tcstages=4",
        "wga=smem",
        "wga=smem,tctile=64",
    ];
    let (n, tc, wgmma, two) = check(Precision::Tf32, &specs);
    assert!(tc >= specs.len() * 8, "only {tc} of {n} launches ran tensor cores");
    assert_eq!(wgmma, tc, "every tensor-core launch on wgmma");
    assert!(two >= specs.len(), "the 128-row tiles (two warpgroups) did not run");
    assert!(tc < n, "the first layer's direct kernels did not run");
    // Products with m < 64 ≤ n take n as the instruction's rows, and the narrowest ones 32
    // columns: `check` ran every contraction of the module, these included.
    let target = CudaTarget::h200().with_precision(Precision::Tf32);
    let module = cuda::generate(&program(Precision::Tf32), &target).unwrap_or_else(|e| panic!("{e}"));
    let has = |s: &str| module.kernel_code.iter().any(|(code, _)| code.contains(s));
    assert!(has("const ix n0 = "), "no contraction with n as the instruction's rows");
    assert!(has("wgmma_tf32<32, "), "no contraction with 32-column tiles");
    assert!(has("wgmma_tf32<96, "), "no contraction with 96-column tiles");
    // By default (`wga=regs`) every `wgmma` kernel reads its row operand from registers; under
    // `wga=smem`, none.
    let in_registers = |spec: &str| {
        let kernels = KernelConfig::parse(spec).expect("a spec");
        let target = CudaTarget::h200().with_precision(Precision::Tf32).with_kernels(kernels);
        let module = cuda::generate(&program(Precision::Tf32), &target).unwrap_or_else(|e| panic!("{e}"));
        let wgmma: Vec<&String> =
            module.kernel_code.iter().map(|(code, _)| code).filter(|c| c.contains("wgmma_tf32<")).collect();
        (wgmma.iter().filter(|c| c.contains("const u32 fa = ")).count(), wgmma.len())
    };
    let (regs, all) = in_registers("default");
    assert!(all >= 8 && regs == all, "default: {regs} of {all} wgmma kernels with A in registers");
    let (regs, all) = in_registers("wga=smem");
    assert!(all >= 8 && regs == 0, "wga=smem: {regs} of {all} wgmma kernels with A in registers");
}

#[test]
fn tf32_wgmma_kernels_with_copying_warpgroups_match_the_interpreter() {
    // `wgprod=N`: N warpgroups only copy, and hand the ring's buffers to the multiplying ones
    // through mbarriers. One copier with a ring of 2 tiles (every tile after the first two
    // waits for its buffer's release), with the default ring and with the taps' table; two
    // copiers; three with the window masks, which give registers up to the multipliers
    // (`setmaxnreg`), as two do
    // beside two multipliers. The host's
    // copies land at the latest their arrival allows in half the blocks and the products run
    // at the latest their waits allow, so a buffer released or refilled too early computes
    // wrong values here.
    let specs =
        ["wgprod=1", "wgprod=1,tcstages=2", "wgprod=1,tctaps=table", "wgprod=2", "wgprod=3,tctaps=mask"];
    let (n, tc, wgmma, _) = check(Precision::Tf32, &specs);
    assert!(tc >= specs.len() * 8, "only {tc} of {n} launches ran tensor cores");
    assert_eq!(wgmma, tc, "every tensor-core launch on wgmma");
    for spec in specs {
        let kernels = KernelConfig::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let target = CudaTarget::h200().with_precision(Precision::Tf32).with_kernels(kernels);
        let module = cuda::generate(&program(Precision::Tf32), &target).unwrap_or_else(|e| panic!("{e}"));
        let wgmma: Vec<&String> =
            module.kernel_code.iter().map(|(code, _)| code).filter(|c| c.contains("wgmma_tf32<")).collect();
        assert!(!wgmma.is_empty(), "{spec}: no wgmma kernel");
        for code in &wgmma {
            assert!(code.contains("mbar_wait(&empty[s]"), "{spec}: a wgmma kernel without copiers:\n{code}");
        }
        // One copier leaves every thread at least the 168 registers a multiplier needs (384
        // threads); with three, 512 or 640 threads get 128 or fewer.
        let gives_up = wgmma.iter().any(|c| c.contains("setmaxnreg_dec<"));
        if spec.starts_with("wgprod=1") {
            assert!(!gives_up, "{spec}: registers handed over");
        } else if spec.starts_with("wgprod=3") {
            assert!(gives_up, "{spec}: no registers handed over");
        }
    }
}

/// Stride-1 layers that the halo-tile kernels (`tcconv=halo`) take: 16 to 96 input channels,
/// rectangular kernels with and without padding (one of 3 taps, fewer than the ring of 8), images of two tiles of 128 pixels (8 rows) and
/// of three tiles of 64 (4 rows), 32, 64 and 96 output channels; their input gradients are
/// transposed convolutions of the same shapes.
const HALO_SOURCE: &str = r#"
model Halo {
    input x:     c64[B, 16, 16, 16]
    input label: class[B] of 3
    y = x |> conv2d(32, kernel = 3, pad = 1, bias = false)
          |> conv2d(32, kernel = (3, 1), pad = (1, 0), bias = false)
          |> conv2d(32, kernel = (3, 5), pad = (1, 2), bias = false)
          |> conv2d(64, kernel = (5, 3), pad = (0, 1), bias = false)
          |> conv2d(96, kernel = 3, pad = 1, bias = false)
          |> flatten |> linear(3) |> abs
    output y
    loss cross_entropy(y, label)
}

train Halo {
    data      = synthetic.random(count = 16, seed = 1)
    batch     = 3
    optimizer = sgd(lr = 1e-3)
}
"#;

#[test]
fn tf32_halo_tile_convolutions_match_the_interpreter() {
    // The default ring, two tiles, and a ring longer than a chunk's taps allow (clamped); on
    // the H200 a block per output tile, on a device of one SM each block runs several output
    // tiles in a row (up to 9; the last block fewer where they do not divide evenly).
    let specs = ["tcconv=halo", "tcconv=halo,tcstages=2", "tcconv=halo,tcstages=8"];
    let program = compiled(HALO_SOURCE, Precision::Tf32);
    let one_sm = CudaDevice { sm_count: 1, ..CudaDevice::h200() };
    // The halo-tile kernels' code in the TF32 module under `spec` for `device`.
    let halo_kernels = |spec: &str, device: &CudaDevice| -> Vec<String> {
        let kernels = KernelConfig::parse(spec).expect("a spec");
        let target = CudaTarget { device: device.clone(), ..CudaTarget::h200() }
            .with_precision(Precision::Tf32)
            .with_kernels(kernels);
        let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{spec}: {e}"));
        module.kernel_code.into_iter().map(|(code, _)| code).filter(|c| c.contains("fetch_x(")).collect()
    };
    for device in [CudaDevice::h200(), one_sm] {
        let (n, tc, wgmma, two) = check_program(&program, Precision::Tf32, &specs, &device);
        assert_eq!(wgmma, tc, "every tensor-core launch on wgmma");
        assert!(two >= specs.len(), "no halo tile of 128 pixels ran");
        eprintln!("halo on {} SMs: {n} launches, {tc} on tensor cores", device.sm_count);
        // One output tile per block on the H200, several on one SM.
        let single = halo_kernels("tcconv=halo", &device)
            .iter()
            .filter(|c| c.contains("pt0 = (ix)blockIdx.y * 1u;"))
            .count();
        assert_eq!(single, if device.sm_count == 1 { 0 } else { 9 }, "{} SMs", device.sm_count);
    }
    // Every stride-1 convolution and input gradient on the halo tiles: 5 forward, 4 input
    // gradients; 32-, 64- and 96-column products.
    let h200 = CudaDevice::h200();
    let halo = halo_kernels("tcconv=halo", &h200);
    assert_eq!(halo.len(), 9, "halo-tile kernels");
    for width in ["wgmma_tf32<32, ", "wgmma_tf32<64, ", "wgmma_tf32<96, "] {
        assert!(halo.iter().any(|c| c.contains(width)), "no halo tile with {width}");
    }
    // By default (`tcconv=grad`) the input gradients alone; under `tcconv=gemm` none.
    assert_eq!(halo_kernels("default", &h200).len(), 4);
    assert_eq!(halo_kernels("tcconv=gemm", &h200).len(), 0);
}

#[test]
fn bf16_contraction_kernels_compiled_for_the_host_match_the_interpreter() {
    // Activations stored in bf16; native 16-bit products with ldmatrix or plain fragment
    // loads, 16-bit operands widened onto TF32 `wgmma` products (`tc16=tf32`), and 16-bit
    // products on `wgmma` (the default on the H200).
    let specs = ["tc16=native", "tc16=native,frag=lds", "tc16=tf32", ""];
    let (n, tc, wgmma, _) = check(Precision::Bf16, &specs);
    assert!(tc >= specs.len() * 8 && tc < n, "{tc} of {n} launches ran tensor cores");
    assert!(wgmma >= 8, "{wgmma} launches of 16-bit operands widened for wgmma");
}

#[test]
fn fp16_contraction_kernels_compiled_for_the_host_match_the_interpreter() {
    // Activations stored as IEEE halves: native f16 products, TF32 ones (f16 widens to
    // TF32 exactly: both keep 10 mantissa bits), and f16 products on `wgmma` (the default).
    let specs = ["tc16=native", "tc16=tf32", ""];
    let (n, tc, wgmma, _) = check(Precision::Fp16, &specs);
    assert!(tc >= 8 * specs.len() && tc < n, "{tc} of {n} launches ran tensor cores");
    assert!(wgmma >= 8, "{wgmma} launches of 16-bit operands widened for wgmma");
}

/// At `bf16` under `tc16=tf32` the halo tiles take the stride-1 layers as at `tf32`: their
/// input rows, stored in 16 bits, are loaded, widened and stored into the buffer by each
/// thread (a `cp.async` cannot widen), the weights copied as at `tf32`, the output rounded
/// to bf16 where it is stored.
#[test]
fn bf16_halo_tiles_widen_their_rows_and_match_the_interpreter() {
    let program = compiled(HALO_SOURCE, Precision::Bf16);
    let specs = ["tcconv=halo,tc16=tf32"];
    let h200 = CudaDevice::h200();
    let (n, tc, wgmma, two) = check_program(&program, Precision::Bf16, &specs, &h200);
    // The convolutions on `wgmma` (the linear layer's matmuls keep the 16-bit products).
    assert!(wgmma >= 9 && tc == n, "{wgmma} of {tc} tensor-core launches on wgmma");
    assert!(two >= specs.len(), "no halo tile of 128 pixels ran");
    eprintln!("bf16 halo: {n} launches, {tc} on tensor cores");
    let target = CudaTarget::h200()
        .with_precision(Precision::Bf16)
        .with_kernels(KernelConfig::parse(specs[0]).expect("a spec"));
    let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{e}"));
    let halo: Vec<&String> =
        module.kernel_code.iter().map(|(c, _)| c).filter(|c| c.contains("fetch_x(")).collect();
    assert_eq!(halo.len(), 9, "halo-tile kernels at bf16");
    // All but the first layer's forward, whose rows are the model's (32-bit) input.
    let widening = halo.iter().filter(|c| c.contains("(float2)((cbf16s*)")).count();
    assert_eq!(widening, 8, "halo tiles that widen bf16 rows");
    // At the native 16-bit products no halo tile.
    let target = CudaTarget::h200()
        .with_precision(Precision::Bf16)
        .with_kernels(KernelConfig::parse("tc16=native").expect("a spec"));
    let native = cuda::generate(&program, &target).expect("a module");
    assert!(native.kernel_code.iter().all(|(c, _)| !c.contains("fetch_x(")));
}

/// Under `tc16=wgmma` the products with a complex operand stored in 16 bits run on `wgmma`'s
/// 16-bit form: that operand's (re, im) pairs copied raw by `cp.async`, the other operand
/// expanded into `[re, −im]` and `[im, re]` (conjugations folded in) and rounded to bf16.
/// Covered: the raw operand as the row and as the column operand, conjugated operands (the
/// weight gradients), tiles of one and of two warpgroups, and the halo tiles (input
/// gradients by default, forward layers under `tcconv=halo`), whose fragment registers are
/// the staged pairs themselves, as they are the plane's words where the implicit GEMM loads
/// its A fragments into registers (`wga=regs`, the default); a mutation of the expansion's signs or of the raw copy's place
/// fails it.
#[test]
fn bf16_wgmma16_products_match_the_interpreter() {
    let program = compiled(HALO_SOURCE, Precision::Bf16);
    // (The default on the H200 but for the weights, expanded here by every tile, where the
    // mutations of the expansion's signs show; the staged form is
    // `staged_weight_expansions_match_the_interpreter`'s. A fragments from registers by
    // default, through descriptors under `wga=smem`.)
    let specs = ["tc16=wgmma,wexpand=tile,tcraw=row", "tcconv=halo,wga=smem,wexpand=tile"];
    let h200 = CudaDevice::h200();
    let (n, tc, wgmma, two) = check_program(&program, Precision::Bf16, &specs, &h200);
    eprintln!(
        "bf16 wgmma16: {n} launches, {tc} on tensor cores, {wgmma} on wgmma, {two} with two warpgroups"
    );
    let target = CudaTarget::h200()
        .with_precision(Precision::Bf16)
        .with_kernels(KernelConfig::parse(specs[0]).expect("a spec"));
    let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{e}"));
    let w16: Vec<&String> =
        module.kernel_code.iter().map(|(c, _)| c).filter(|c| c.contains("wgmma16<")).collect();
    // Every convolution, input and weight gradient but the first layer's forward (its input is
    // the model's 32-bit one) and weight gradient, on 16-bit `wgmma`.
    assert!(w16.len() >= 12, "{} kernels on 16-bit wgmma", w16.len());
    assert!(two >= 2, "{two} launches with two warpgroups");
    let raw_col = w16.iter().filter(|c| c.contains("cp_async4(PBr(s)")).count();
    let raw_row = w16.iter().filter(|c| c.contains("cp_async4(PAr(s)")).count();
    assert!(raw_col > 0 && raw_row > 0, "raw operand as row {raw_row}, as column {raw_col} times");
    let conj = w16.iter().filter(|c| c.contains("PK(w.x, w.y)") || c.contains("PK(-w.y")).count();
    assert!(conj > 0, "no expansion with a conjugated operand");
    assert!(module.arch.ends_with('a'), "{}: 16-bit wgmma needs the sm_90a target", module.arch);
    // The input gradients on halo tiles of 16-bit pairs (all but the first layer's, which has
    // no input gradient); under `tcconv=halo` the forward layers too but the first.
    let halo = |spec: &str| {
        let target = CudaTarget::h200()
            .with_precision(Precision::Bf16)
            .with_kernels(KernelConfig::parse(spec).expect("a spec"));
        let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{e}"));
        module.kernel_code.iter().filter(|(c, _)| c.contains("fetch_x(") && c.contains("wgmma16<")).count()
    };
    assert_eq!(halo(specs[0]), 4, "halo tiles of 16-bit pairs");
    assert_eq!(halo(specs[1]), 8, "halo tiles of 16-bit pairs under tcconv=halo");
}

/// `setmaxnreg` moves registers within the block's pool, which is what it was launched with:
/// `threads` × the registers each thread gets under `__launch_bounds__(threads, 1)` (the SM's
/// 64K over the threads, in multiples of 8; ptxas reports that count for these kernels). An
/// increase the pool cannot cover never returns on the device, which the host emulation (a
/// no-op there) cannot show: the seed network under `wgprod=3` hung on an H100 with two
/// multiplying warpgroups beside three copiers (640 threads), whose split was computed from
/// the SM's 64K. Checked here by arithmetic on every kernel that hands registers over, at the
/// batch of the benchmark.
#[test]
fn copies_across_the_banks_match_the_interpreter() {
    // `tcfetch=banks`: a warp's copies of a row-contiguous tile take 8 rows at up to 4 K, so
    // that their 32 words of the core-matrix planes lie in 32 banks; at bf16 (raw pairs and
    // expanded rows) and at tf32 (planes of f32).
    let spec = ["tcfetch=banks"];
    let h200 = CudaDevice::h200();
    for precision in [Precision::Bf16, Precision::Tf32] {
        let program = compiled(HALO_SOURCE, precision);
        let (n, _, wgmma, _) = check_program(&program, precision, &spec, &h200);
        eprintln!("{precision:?} tcfetch=banks: {n} launches, {wgmma} on wgmma");
        assert!(wgmma >= 8, "{precision:?}: {wgmma} launches on wgmma");
        let target = CudaTarget::h200()
            .with_precision(precision)
            .with_kernels(KernelConfig::parse(spec[0]).expect("a spec"));
        let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{e}"));
        let count = |form: &str| module.kernel_code.iter().filter(|(c, _)| c.contains(form)).count();
        let (rows, ks) = (count("x = ((tid & 7u) | "), count("k = ((tid & 3u) | "));
        eprintln!("{precision:?}: {rows} kernels copy 8 rows at 2 or 4 K, {ks} 4 K of 8 rows");
        assert!(rows >= 1 && ks >= 4, "{precision:?}: {rows} and {ks} kernels copy across the banks");
    }
}

#[test]
fn staged_weight_expansions_match_the_interpreter() {
    // `wexpand=pre` (default): a kernel before each 16-bit product whose expanded operand is
    // a weight writes the expansion once into the staging buffer, and the product copies it
    // by `cp.async` — implicit GEMMs (forward convolutions, dense layers), halo tiles (input
    // gradients), conjugated operands, and (bf16) copying warpgroups (`wgprod=1`, open to
    // 16-bit products once no thread stores its own copies). `tcraw=gather` (default): the
    // weight gradients copy their patches raw and expand the output gradient. (The forms
    // before both, `wexpand=tile,tcraw=row`, run in `bf16_wgmma16_products_match_the_
    // interpreter`; at fp16 the default alone, on the layers of `SOURCE`: `HALO_SOURCE`'s
    // sums pass fp16's range. Each spec here costs CI about 20 s.)
    let h200 = CudaDevice::h200();
    let cases: [(Precision, &str, usize, &[&str]); 2] =
        [(Precision::Bf16, HALO_SOURCE, 8, &["", "wgprod=1"]), (Precision::Fp16, SOURCE, 3, &[""])];
    for (precision, source, least, specs) in cases {
        let program = compiled(&source.replace("WIDE", ""), precision);
        let (n, _, wgmma, _) = check_program(&program, precision, specs, &h200);
        eprintln!("{precision:?} staged weights: {n} launches, {wgmma} on wgmma");
        for &spec in specs {
            let target = CudaTarget::h200()
                .with_precision(precision)
                .with_kernels(KernelConfig::parse(spec).expect("a spec"));
            let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{e}"));
            let staged = module.kernels.iter().filter(|k| k.ends_with("_w")).count();
            let readers = module
                .kernel_code
                .iter()
                .filter(|(c, _)| {
                    c.contains("wgmma16<") && c.contains(&format!("(A + {}ull)", module.scratch.0))
                })
                .count();
            let producers =
                module.kernel_code.iter().filter(|(c, _)| c.contains("cp_async_mbar_arrive")).count();
            eprintln!("{precision:?} {spec}: {staged} staged weights, {readers} products read them, {producers} with copying warpgroups");
            // (`HALO_SOURCE`: conv2..conv5's forward and input gradient and the dense layer.)
            assert!(staged >= least && readers == staged, "{spec}: {staged} staged, {readers} readers");
            let largest =
                program.graph.params().map(|p| program.graph.ty(p).shape.numel(3)).max().unwrap_or(0);
            assert!(module.scratch.1 >= 8 * largest, "{spec}: staging of {} bytes", module.scratch.1);
            if spec.contains("wgprod") {
                assert!(producers >= 2, "{spec}: {producers} kernels with copying warpgroups");
            }
            let gradients = module
                .kernel_code
                .iter()
                .filter(|(c, _)| c.contains("conv2d_weight_grad") && c.contains("wgmma16<"))
                .collect::<Vec<_>>();
            let raw_patches = gradients.iter().filter(|(c, _)| c.contains("cp_async4(PBr(s)")).count();
            assert!(
                raw_patches >= 1,
                "{spec}: {raw_patches} of {} weight gradients copy patches raw",
                gradients.len()
            );
        }
    }
}

#[test]
fn register_handover_fits_the_blocks_pool() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the repository root");
    let src = std::fs::read_to_string(root.join("examples/seed_cnn.cvnn")).expect("the seed network");
    let checked = check_source("seed_cnn.cvnn", &src, Mode::Train).unwrap_or_else(|d| panic!("{d:?}"));
    let opts = Options { batch: 1024, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let program = compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{e}"));
    let number = |code: &str, after: &str, until: char| -> Option<usize> {
        let at = code.find(after)? + after.len();
        code[at..].split(until).next()?.trim().parse().ok()
    };
    let mut handovers = 0;
    let mut widest = 0;
    for spec in ["wgprod=2", "wgprod=3", "wgprod=3,tctaps=mask", "wgprod=2,tctile=128"] {
        let kernels = KernelConfig::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let target = CudaTarget::h200().with_precision(Precision::Tf32).with_kernels(kernels);
        let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{spec}: {e}"));
        for (code, _) in &module.kernel_code {
            let Some(dec) = number(code, "setmaxnreg_dec<", '>') else { continue };
            let inc = number(code, "setmaxnreg_inc<", '>').expect("an increase beside the decrease");
            let threads = number(code, "__launch_bounds__(", ',').expect("launch bounds");
            let multipliers = 128 * number(code, "if (wg >= ", 'u').expect("the copiers' branch");
            let pool = threads * ((65536 / threads).min(256) / 8 * 8);
            let used = multipliers * inc + (threads - multipliers) * dec;
            assert!(
                used <= pool,
                "{spec}: {threads} threads, {multipliers} multiplying with {inc} registers, the rest \
                 copying with {dec}: {used} registers of a pool of {pool}"
            );
            assert!(
                (24..=256).contains(&dec) && inc <= 256 && dec % 8 == 0 && inc % 8 == 0,
                "{spec}: {dec}, {inc}"
            );
            handovers += 1;
            widest = widest.max(threads);
        }
    }
    assert!(handovers > 0, "no kernel handed registers over");
    assert_eq!(widest, 640, "no kernel with two multiplying warpgroups beside three copiers");
}
