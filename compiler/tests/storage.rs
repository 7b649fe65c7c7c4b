//! The 16-bit storage rule (`ir::storage`) on the examples: what is stored in bf16/fp16 and
//! what keeps full width, and what it does to the memory plan.

use cvc_compiler::front::check_source;
use cvc_compiler::ir::*;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;

fn example(name: &str) -> String {
    let path = format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn plan(name: &str, batch: usize, half: Storage) -> Program {
    let src = example(name);
    let checked = check_source(name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
    let opts = Options { batch, optimizer: checked.train.optimizer.clone(), half, ..Options::default() };
    compile(checked.graph, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// In the seed CNN under bf16: every convolution output and every activation gradient with
/// the batch axis is 16-bit, except the narrow output of the `linear(10)` head (full width, so
/// its 16,384-long K can be split over blocks); parameters, their gradients, optimizer state, batch statistics,
/// the data input, the outputs and the loss keep full width; bytes follow the storage.
#[test]
fn the_seed_network_stores_activations_and_their_gradients_in_bf16() {
    let p = plan("seed_cnn.cvnn", 8, Storage::Bf16);
    let g = &p.graph;
    let (mut convs, mut matmuls) = (0, 0);
    for (v, n) in g.nodes.iter() {
        let s = g.storage(v);
        let batched = n.ty.shape.batch_power() > 0;
        match &n.op {
            Op::Conv2d { .. } | Op::ConvTranspose2d { .. } => {
                assert_eq!(s, Storage::Bf16, "{v} {}: a convolution's output", n.origin.label);
                convs += 1;
            }
            Op::Param { .. } | Op::State { .. } | Op::Input { .. } | Op::Reduce { .. } => {
                assert_eq!(s, Storage::Full, "{v} {} ({})", n.origin.label, n.op.mnemonic());
            }
            Op::Conv2dWeightGrad { .. } => assert_eq!(s, Storage::Full, "{v}: a weight gradient"),
            Op::MatMul { .. } if batched => {
                let narrow = n.ty.shape.fixed_numel() <= cvc_compiler::ir::storage::NARROW_CONTRACTION;
                assert_eq!(narrow, n.ty.shape.fixed_numel() == 10, "{v} {}: {}", n.origin.label, n.ty.shape);
                let want = if narrow { Storage::Full } else { Storage::Bf16 };
                assert_eq!(s, want, "{v} {} {}: a matmul's output", n.origin.label, n.ty.shape);
                matmuls += 1;
            }
            _ if !batched => assert_eq!(s, Storage::Full, "{v} {}: no batch axis", n.origin.label),
            _ => {}
        }
        let elem = match (s, n.ty.dtype) {
            (Storage::Full, d) => d.bytes(),
            (_, DType::C64) => 4,
            (_, DType::F32) => 2,
            (_, DType::I32) => 4,
        };
        assert_eq!(g.bytes(v, 8), n.ty.shape.numel(8) * elem, "{v}: bytes of {}", g.stored_name(v));
    }
    // Three forward convolutions and the input gradients of the second and third.
    assert_eq!(convs, 5, "forward convolutions and input gradients");
    // The head's forward product ([B, 10], full width) and its input gradient ([B, 16384], bf16).
    assert_eq!(matmuls, 2, "the linear layer's batched products");
    for o in &g.outputs {
        assert_eq!(g.storage(o.value), Storage::Full, "output {} is read back", o.name);
    }
    let backward =
        g.nodes.iter().filter(|(v, n)| n.origin.role == Role::Backward && g.storage(*v).is_half()).count();
    assert!(backward > 0, "activation gradients are 16-bit");
}

/// The arena of a 16-bit plan: the seed CNN at batch 1024 needs at most 0.55× the fp32
/// arena in bf16 and fp16 (the memory target, planned), and a plan without 16-bit
/// storage is the fp32 one byte for byte.
#[test]
fn sixteen_bit_storage_halves_the_seed_networks_arena() {
    let full = plan("seed_cnn.cvnn", 1024, Storage::Full);
    for half in [Storage::Bf16, Storage::F16] {
        let p = plan("seed_cnn.cvnn", 1024, half);
        let ratio = p.plan.arena_bytes as f64 / full.plan.arena_bytes as f64;
        eprintln!("{}: {} vs {} bytes ({ratio:.3})", half.name(), p.plan.arena_bytes, full.plan.arena_bytes);
        assert!(ratio <= 0.55, "{}: arena ratio {ratio:.3}", half.name());
        assert_eq!(p.plan.param_bytes, full.plan.param_bytes, "parameters stay f32");
    }
    let again = plan("seed_cnn.cvnn", 1024, Storage::Full);
    assert_eq!(again.plan.arena_bytes, full.plan.arena_bytes);
}

/// fp16 turns on dynamic loss scaling (its state scalars exist); bf16 does not need it.
#[test]
fn fp16_plans_carry_the_loss_scale_and_bf16_plans_do_not() {
    use cvc_compiler::passes::optimizer::{LOSS_SCALE, SKIPPED};
    let f16 = plan("seed_cnn.cvnn", 4, Storage::F16);
    assert!(f16.graph.find_leaf(LOSS_SCALE).is_some() && f16.graph.find_leaf(SKIPPED).is_some());
    let bf16 = plan("seed_cnn.cvnn", 4, Storage::Bf16);
    assert!(bf16.graph.find_leaf(LOSS_SCALE).is_none());
}
