//! The CUDA back end's whole training step compiled for the host: every kernel of the step
//! (elementwise, reductions, movement, contractions, attention) runs under the emulated CUDA
//! block of `cvc_tests::hostcuda` in launch order on one arena, and each value it stores is
//! checked against the interpreter replaying its kernel group on the values the kernels read
//! (`cvc_tests::differential::check_step_locally`, what the GPU tests run on a device). No GPU:
//! CI runs the generated CUDA code this way.
//!
//! The sizes are chosen for the reduction kernels' forms: the seed network at batch 2 sums
//! 8,192 points per channel (a sum split over blocks, with partials in scratch memory), and a
//! token model at batch 70 sums 4,480 tokens into each of 6 features (a block serving 8
//! consecutive outputs, two of them past the last feature). Both read per-channel (or
//! per-feature) operands once per output, before the loop over the summed points. (Attention
//! kernels have their own host test, `attention_host.rs`, at sizes the emulation runs quickly.)

use cvc_compiler::config::{Optimizer, OptimizerKind, Precision};
use cvc_compiler::front::check_source;
use cvc_compiler::interp::SplitMix64;
use cvc_compiler::ir::Mode;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::target::{CudaTarget, KernelConfig};
use cvc_runtime::backend::Backend;
use cvc_tests::differential::{check_step_locally_with, keep_every_value, random_leaves, to_host, Numerics};
use cvc_tests::hostcuda::HostCudaBackend;
use cvc_tests::seed::seed_for;
use std::path::Path;

/// Token features through both norms (torchcvnn's and complextorch's per-sample forms).
const TOKENS: &str = r#"
model Tokens {
    input x:     c64[B, 64, 8]
    input label: class[B] of 3
    logits = x |> rmsnorm(axes = 1) |> linear(6) |> cgelu |> layernorm(axes = 1) |> linear(6)
        |> mean(axis = 1) |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}
"#;

/// One step of `file` (relative to the repository root) at `batch` on the host-compiled CUDA
/// kernels, checked kernel group by kernel group; returns the step's kernel code.
fn check_file(file: &str, batch: usize) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the repository root");
    let src = std::fs::read_to_string(root.join(file)).expect("a readable .cvnn file");
    check_source_text(file, &src, batch, "default")
}

/// [`check_file`] of source text, `file` naming it, under the kernel choices `spec`.
fn check_source_text(file: &str, src: &str, batch: usize, spec: &str) -> String {
    check_at_precision(file, src, batch, spec, Precision::Fp32)
}

/// [`check_source_text`] with the activations stored and multiplied as `precision` does.
fn check_at_precision(file: &str, src: &str, batch: usize, spec: &str, precision: Precision) -> String {
    let checked = check_source(file, src, Mode::Train).unwrap_or_else(|d| panic!("{file}: {d:?}"));
    // Plain SGD at lr 1: every parameter's update is its gradient, checked as `new − old`.
    let sgd =
        Optimizer { kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false }, lr: 1.0, weight_decay: 0.0 };
    let opts = Options { batch, optimizer: sgd, half: precision.storage(), ..Options::default() };
    let program = keep_every_value(&compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{file}: {e}")));
    let tag: String = format!("{file}-{spec}-{precision:?}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let kernels = KernelConfig::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let target = CudaTarget::h200().with_precision(precision).with_kernels(kernels);
    let mut be = HostCudaBackend::new(&program, &target, &tag).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut rng = SplitMix64::new(seed_for(&format!("cuda_host::{file}")));
    let leaves = random_leaves(&program.graph, batch, &mut rng);
    for (&v, t) in &leaves {
        if program.plan.slot(v).is_some() {
            be.upload(v, &to_host(t)).unwrap_or_else(|e| panic!("{file}: upload: {}", e.0));
        }
    }
    be.step().unwrap_or_else(|e| panic!("{file}: step: {}", e.0));
    // At bf16, every product's operands and every stored value are rounded to 8 bits; at
    // tf32, the products' operands to 11 bits.
    let numerics = match precision {
        Precision::Bf16 => Numerics { operand: 1.0 / 256.0, store: 1.0 / 256.0, max_finite: 0.0 },
        Precision::Tf32 => Numerics { operand: 1.0 / 2048.0, ..Numerics::default() },
        _ => Numerics::default(),
    };
    let report = check_step_locally_with(&program, &mut be, &leaves, numerics)
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    println!("{file} at batch {batch}, kernels {spec}: {}", report.summary());
    assert!(report.failures.is_empty(), "{file}:\n{}", report.failures.join("\n"));
    assert!(report.values > 0, "{file}: nothing was compared");
    be.module().source.clone()
}

#[test]
fn seed_network_step_on_host_compiled_cuda_matches_the_interpreter() {
    let code = check_file("examples/seed_cnn.cvnn", 2);
    assert!(code.contains("vld<2>(((float2*)"), "elementwise kernels read two complex values at once");
    // Batchnorm's sums over 2 × 64 × 64 points per channel: split over blocks, the
    // per-channel statistics and weights read before the loop.
    assert!(code.contains("(ix)blockIdx.y * 4096u"), "a reduction split over blocks");
    assert!(code.contains("const ix h1 = "), "per-channel operands read once per output");
    // The first layer's batchnorm sums inside its direct convolution; the first pool's mean
    // written by its window sum (at this batch the planner keeps the second pool's sum, which
    // the backward pass reads to recompute the mean).
    assert!(code.contains("][tid] += (double)p[k];"), "a convolution that sums its output per channel");
    let pool_mean = |l: &str| {
        l.starts_with("// group") && l.contains("=reduce_sum %") && l.ends_with("=mul  [logits/avgpool2d]")
    };
    assert!(code.lines().any(pool_mean), "a pool's window sum with its mean as the epilogue");
    // Small per-channel kernels (a batchnorm's statistics, parameter updates) batched into
    // one launch, each over its own blocks.
    assert!(code.contains("  else if (blockIdx.x < "), "small elementwise kernels batched into one launch");
}

#[test]
fn seed_network_at_bf16_on_host_compiled_cuda_matches_the_interpreter() {
    // 16-bit activations: elementwise kernels take four (re, im) pairs per thread and pass,
    // one 16-byte load or store per operand along the image rows (fp32 takes two complex
    // values, 16 bytes too).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the repository root");
    let src = std::fs::read_to_string(root.join("examples/seed_cnn.cvnn")).expect("the seed network");
    // `fill=5`: the first layer's convolution, which sums its output per channel, runs its
    // 64 tiles in 5 blocks (13 or 12 each) and adds 5 partials a channel.
    let code = check_at_precision("examples/seed_cnn.cvnn", &src, 2, "fill=5", Precision::Bf16);
    assert!(code.contains("blk += gridDim.x"), "a convolution's blocks loop over its tiles");
    // conv2 and conv3 on the 16-bit `wgmma` GEMM sum their outputs per channel in the
    // epilogue; a second kernel adds the tiles' partials.
    assert_eq!(code.matches("_gemm_sum(char* A)").count(), 2, "two GEMMs that sum their output");
    assert!(code.contains("vld<4>(((cbf16s*)"), "16-byte loads of four bf16 pairs");
    assert!(code.contains("vst<4>(((cbf16s*)"), "16-byte stores of four bf16 pairs");
}

#[test]
fn seed_network_weight_gradients_from_asynchronous_copies_match_the_interpreter() {
    // `wgrad=async`: the direct weight-gradient kernels (all three layers in fp32) copy each
    // pixel tile by `cp.async` into the second pair of buffers while the current one is
    // multiplied; the conjugated operand is conjugated where it is read from shared memory.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the repository root");
    let src = std::fs::read_to_string(root.join("examples/seed_cnn.cvnn")).expect("the seed network");
    // `fill=4`: few blocks, so that each runs many tiles through both pairs of buffers.
    let code = check_source_text("examples/seed_cnn.cvnn", &src, 2, "wgrad=async,fill=4");
    let copying = code
        .split("// group ")
        .filter(|k| k.lines().next().is_some_and(|l| l.contains("conv2d_weight_grad")))
        .filter(|k| k.contains("issue(tl + 1u"))
        .count();
    assert_eq!(copying, 3, "every weight gradient on asynchronous copies");
}

/// A mean over 9,000 points per output: its sum is split over blocks and the scale by 1/9000
/// is the sum's epilogue, run by the last block of each output.
const LONG_MEAN: &str = r#"
model LongMean {
    input x:     c64[B, 9000, 2]
    input label: class[B] of 2
    logits = x |> mean(axis = 1) |> flatten |> linear(2) |> abs
    output logits
    loss cross_entropy(logits, label)
}
"#;

#[test]
fn a_split_sum_with_an_epilogue_on_host_compiled_cuda_matches_the_interpreter() {
    let code = check_source_text("long_mean.cvnn", LONG_MEAN, 1, "default");
    let kernel = code
        .split("// group ")
        .find(|k| k.lines().next().is_some_and(|l| l.contains("=reduce_sum %") && l.contains("=mul  [")))
        .expect("a sum with its scale as the epilogue");
    assert!(kernel.contains("atomicAdd(count, 1u)"), "the sum split over blocks:\n{kernel}");
}

/// A convolution with a bias before a batchnorm: the statistics' prologue adds the bias, a
/// per-channel operand the convolution's sums read at each output's channel.
const BIAS_NORM: &str = r#"
model BiasNorm {
    input x:     c64[B, 2, 16, 16]
    input label: class[B] of 3
    logits = x |> conv2d(8, kernel = 3, pad = 1) |> batchnorm(kind = naive) |> crelu |> avgpool2d(4)
        |> flatten |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}
"#;

#[test]
fn a_convolution_summing_its_biased_output_on_host_compiled_cuda_matches_the_interpreter() {
    // `fill=2`: 6 tiles (3 images of 2) in 2 blocks of 3 each.
    for precision in [Precision::Fp32, Precision::Bf16] {
        let code = check_at_precision("bias_norm.cvnn", BIAS_NORM, 3, "fill=2", precision);
        let conv = code
            .split("k0_gemm(char* A)")
            .nth(1)
            .and_then(|k| k.split("\n}\n").next())
            .expect("the convolution");
        assert!(
            conv.contains("blk += gridDim.x"),
            "{precision:?}: the convolution computes its sums:\n{conv}"
        );
        assert!(
            conv.contains("[(g * 8u + m)];"),
            "{precision:?}: the sums read the bias per channel:\n{conv}"
        );
    }
}

#[test]
fn token_model_step_on_host_compiled_cuda_matches_the_interpreter() {
    // Sums over 70 × 64 tokens into 6 features, in blocks of 8 consecutive features (32
    // threads each: a warp folds four of its threads per feature), and under `colout=16` and
    // `colout=32` (16 and 8 threads per feature: a warp folds two, or none).
    for spec in ["default", "colout=16", "colout=32"] {
        let code = check_source_text("tokens.cvnn", TOKENS, 70, spec);
        assert!(
            code.contains("const ix oh = min(o, (ix)5u);"),
            "{spec}: per-feature operands read once per output"
        );
        let per_block = match spec {
            "default" => 8,
            s => s["colout=".len()..].parse().expect("a width"),
        };
        assert!(
            code.contains(&format!("const u32 slot = threadIdx.x % {per_block}u")),
            "{spec}: no block of {per_block} consecutive outputs:\n{}",
            code.lines().filter(|l| l.contains("slot =")).collect::<Vec<_>>().join("\n")
        );
        // The norms' parameters sliced into their pieces, several slices in one launch.
        let batched_slices = code.split("\n}\n").any(|k| {
            k.contains("  else if (blockIdx.x < ")
                && k.lines().filter(|l| l.contains("=slice  [")).count() > 1
        });
        assert!(batched_slices, "{spec}: no launch of several slices");
    }
}

/// Networks whose convolutions compute their batchnorm sums (`convstats=fuse`: direct
/// kernels over one or several channel chunks, and the `wgmma` GEMMs at tf32 and bf16), at
/// small batches. Minutes under the emulation: run by hand
/// (`cargo test -p cvc-tests --test cuda_host -- --ignored`).
#[test]
#[ignore = "minutes on the host; the seed and bias tests above cover the same kernels in CI"]
fn examples_with_summing_convolutions_on_host_compiled_cuda_match_the_interpreter() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the repository root");
    let runs = [
        ("examples/seed_cnn.cvnn", 2, Precision::Tf32),
        ("examples/complex_resnet.cvnn", 1, Precision::Fp32),
        ("examples/complex_resnet.cvnn", 1, Precision::Bf16),
        ("examples/complex_resnet.cvnn", 1, Precision::Tf32),
        ("examples/polsar_unet.cvnn", 1, Precision::Fp32),
        ("examples/polsar_unet.cvnn", 1, Precision::Bf16),
    ];
    for (file, batch, precision) in runs {
        let src = std::fs::read_to_string(root.join(file)).expect("a readable example");
        let code = check_at_precision(file, &src, batch, "default", precision);
        let summing = code.contains("blk += gridDim.x") || code.contains("_gemm_sum(char* A)");
        assert!(summing, "{file} {precision:?}: no convolution computes its sums");
    }
}
