//! Chunked back-propagation through time (`autodiff::run_chunked`): the same gradients as
//! one `RecurrenceGrad` per recurrence in the reference interpreter, for GRU and LSTM in both
//! directions and chunk lengths that do and do not divide `T`; the planner's choice of a chunk
//! length under `--memory-budget`.

use cvc_compiler::front::check_source;
use cvc_compiler::interp::check::random_tensor;
use cvc_compiler::interp::{evaluate, SplitMix64, Tensor};
use cvc_compiler::ir::*;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::{autodiff, cast};
use std::collections::HashMap;

/// A model whose recurrences cover both cells and directions; the input goes through a
/// trainable linear layer first, so `dxp` reaches a gradient of the sequence too.
fn model(t: usize) -> String {
    format!(
        "model Chunks {{
    input x:     c64[B, {t}, 3]
    input label: class[B] of 3
    seq = x |> linear(4) |> gru(3, bidirectional = true)
    both = seq |> lstm(2, bidirectional = true, returns = last)
    mixed = seq |> lstm(2) |> gru(2, returns = last)
    logits = concat(both, mixed, axis = 1) |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}}"
    )
}

/// The lowered training graph of `src` with casts placed (autodiff's input in the pipeline).
fn lowered(src: &str) -> Graph {
    let mut g = check_source("chunks.cvnn", src, Mode::Train)
        .unwrap_or_else(|d| panic!("{:?}", d.first().map(|d| d.message.clone())))
        .graph;
    cast::run(&mut g).expect("casts");
    g
}

/// Random values of every leaf of `g` at `batch` (labels in `0..3`).
fn leaves(g: &Graph, batch: usize, seed: u64) -> HashMap<Value, Tensor> {
    let mut rng = SplitMix64::new(seed);
    g.nodes
        .iter()
        .filter(|(_, n)| matches!(n.op, Op::Input { .. } | Op::Param { .. } | Op::State { .. }))
        .map(|(h, n)| (h, random_tensor(n.ty.dtype, &n.ty.shape.resolve(batch), 3, &mut rng)))
        .collect()
}

/// Every parameter's gradient (parameter name → values) with recurrences chunked by `chunk`.
fn grads(src: &str, chunk: Option<usize>, batch: usize, seed: u64) -> Vec<(String, Vec<f64>)> {
    let mut g = lowered(src);
    let leaf = leaves(&g, batch, seed);
    let facts = autodiff::run_chunked(&mut g, chunk).expect("autodiff");
    let recurrences = g.nodes.iter().filter(|(_, n)| matches!(n.op, Op::Recurrence { .. })).count();
    // The forward's 6 recurrences, plus one recomputation per chunk of each when chunked.
    let t = g.ty(g.nodes.handles().find(|&h| matches!(g.node(h).op, Op::Recurrence { .. })).unwrap()).shape.0
        [1]
    .fixed()
    .unwrap();
    let want = match chunk {
        Some(k) if k < t => 6 + 6 * t.div_ceil(k),
        _ => 6,
    };
    assert_eq!(recurrences, want, "recurrences with chunk {chunk:?}");
    let vals = evaluate(&g, batch, &leaf).expect("interpreter");
    facts
        .grads
        .iter()
        .map(|&(p, d)| {
            let name = g.leaf_name(p).unwrap_or_default().to_string();
            let t = vals[d.index()].as_ref().expect("gradient value");
            let flat = t.to_complex_vec().iter().flat_map(|z| [z.re, z.im]).collect();
            (name, flat)
        })
        .collect()
}

fn max_rel(got: &[f64], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
    got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

#[test]
fn chunked_gradients_equal_the_whole_backward() {
    let t = 7;
    let src = model(t);
    let whole = grads(&src, None, 2, 11);
    assert!(whole.iter().all(|(_, v)| v.iter().any(|x| *x != 0.0)), "every gradient is nonzero");
    for k in [1, 2, 3, 4, 6, 7, 9] {
        let chunked = grads(&src, Some(k), 2, 11);
        assert_eq!(chunked.len(), whole.len());
        for ((name, got), (_, want)) in chunked.iter().zip(&whole) {
            let e = max_rel(got, want);
            assert!(e < 1e-12, "chunk {k}: {name} differs by {e:.3e} (relative)");
        }
    }
}

/// The check above must be able to fail: the same chunked graph with the carry between two
/// chunks dropped (the `Add` of the carry to a chunk's state gradient turned into a plain
/// reshape of that gradient) gives different gradients.
#[test]
fn a_lost_carry_is_detected() {
    let src = model(6);
    let whole = grads(&src, None, 2, 5);
    let mut g = lowered(&src);
    let leaf = leaves(&g, 2, 5);
    let facts = autodiff::run_chunked(&mut g, Some(3)).expect("autodiff");
    let add = g
        .nodes
        .handles()
        .find(|&h| {
            let n = g.node(h);
            matches!(n.op, Op::Binary(BinaryOp::Add))
                && n.inputs.iter().any(|&i| matches!(g.node(i).op, Op::Pad { axis: 1, .. }))
        })
        .expect("a carry added to a chunk's state gradient");
    let kept = g.node(add).inputs[0];
    g.nodes[add].op = Op::Reshape;
    g.nodes[add].inputs = vec![kept];
    let vals = evaluate(&g, 2, &leaf).expect("interpreter");
    let worst = facts
        .grads
        .iter()
        .zip(&whole)
        .map(|(&(_, d), (_, want))| {
            let got: Vec<f64> = vals[d.index()]
                .as_ref()
                .unwrap()
                .to_complex_vec()
                .iter()
                .flat_map(|z| [z.re, z.im])
                .collect();
            max_rel(&got, want)
        })
        .fold(0.0, f64::max);
    assert!(worst > 1e-6, "a chunked backward without its carry went unnoticed ({worst:.3e})");
}

/// `cvc plan` of a 4,096-step GRU at batch 32: 450 MiB without a budget (as before chunked
/// back-propagation existed), within 200 MiB with `--memory-budget 200MiB` by chunking.
#[test]
fn a_long_gru_plans_within_the_budget_by_chunking() {
    let src = "model LongGru {
    input iq:    c64[B, 4096, 2]
    input label: class[B] of 5
    state = iq |> gru(32, returns = last)
    logits = state |> linear(5) |> abs
    output logits
    loss cross_entropy(logits, label)
}";
    let checked = check_source("long_gru.cvnn", src, Mode::Train).expect("checks");
    let opts = Options { batch: 32, ..Options::default() };
    let free = compile(checked.graph.clone(), &opts).expect("plan");
    assert_eq!(free.facts.rnn_chunk, None);
    let mib = 1u64 << 20;
    assert!(free.plan.arena_bytes as u64 > 400 * mib, "{}", free.plan.arena_bytes);
    // A budget the whole backward fits compiles the same graph and plan as no budget.
    let roomy = compile(checked.graph.clone(), &Options { memory_budget: Some(1 << 30), ..opts.clone() })
        .expect("plan");
    assert_eq!(roomy.facts.rnn_chunk, None);
    assert_eq!(roomy.plan.arena_bytes, free.plan.arena_bytes);
    assert_eq!(
        cvc_compiler::ir::print::print_graph(&roomy.graph, None),
        cvc_compiler::ir::print::print_graph(&free.graph, None)
    );
    let budget = 200 * mib;
    let tight = compile(checked.graph, &Options { memory_budget: Some(budget), ..opts }).expect("plan");
    let k = tight.facts.rnn_chunk.expect("the recurrence backward is chunked");
    assert!(k < 4096 && 4096 % k == 0, "chunk {k}");
    assert!(tight.plan.arena_bytes as u64 <= budget, "{} > {budget}", tight.plan.arena_bytes);
}

/// With a trainable layer before a chunked recurrence, the gradient of its input is formed
/// chunk by chunk too: no backward value spans all `T` steps of the gate width `G·H` (the
/// concatenation of the chunks' `dxp` is never read).
#[test]
fn a_chunked_recurrence_after_a_layer_keeps_no_whole_sequence_gradient() {
    let src = "model Front {
    input x:     c64[B, 512, 2]
    input label: class[B] of 5
    state = x |> linear(8) |> gru(32, returns = last)
    logits = state |> linear(5) |> abs
    output logits
    loss cross_entropy(logits, label)
}";
    let checked = check_source("front.cvnn", src, Mode::Train).expect("checks");
    let opts = Options { batch: 4, rnn_chunk: Some(64), ..Options::default() };
    let p = compile(checked.graph, &opts).expect("compiles");
    assert_eq!(p.facts.rnn_chunk, Some(64));
    let whole: Vec<String> = p
        .graph
        .nodes
        .iter()
        .filter(|(_, n)| n.origin.role == Role::Backward)
        .filter(|(_, n)| {
            let d = &n.ty.shape.0;
            d.len() == 3 && d[1].fixed() == Some(512) && d[2].fixed() == Some(96)
        })
        .map(|(h, n)| format!("{h} {} {}", n.op.mnemonic(), n.origin.label))
        .collect();
    assert!(whole.is_empty(), "whole-sequence gradients: {whole:?}");
}

/// The text form carries `init=true` (printed only when set) and reads it back: a chunked
/// graph prints, parses and prints the same; a recurrence with `init=true` but no `h0`, or
/// with an `h0` of the wrong width, is refused with the reason.
#[test]
fn initial_states_round_trip_through_the_text_form() {
    use cvc_compiler::ir::parse::parse_graph;
    use cvc_compiler::ir::print::print_graph;
    let mut g = lowered(&model(5));
    autodiff::run_chunked(&mut g, Some(2)).expect("autodiff");
    let text = print_graph(&g, None);
    assert!(text.contains("recurrence[cell=Gru, hidden=3, reverse=false, init=true]"), "{text}");
    assert!(text.contains("recurrence_grad[cell=Lstm, hidden=2, reverse=true, init=true]"), "{text}");
    assert!(text.contains("recurrence[cell=Gru, hidden=3, reverse=false]"), "{text}");
    let parsed = parse_graph(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_graph(&parsed.graph, None), text);
    // The first recurrence from a checkpoint: `... init=true](%xp, %w, %b, %h0) : ...`.
    let line = text.lines().find(|l| l.contains("= recurrence[") && l.contains("init=true]")).expect("one");
    let args = &line[line.find("](").unwrap() + 2..line.find(") :").unwrap()];
    let ops: Vec<&str> = args.split(", ").collect();
    let without = text.replacen(line, &line.replace(args, &ops[..3].join(", ")), 1);
    let e = parse_graph(&without).expect_err("h0 missing");
    assert!(e.message.contains("takes 4 operands"), "{e}");
    let swapped = [ops[0], ops[1], ops[2], ops[0]].join(", ");
    let e = parse_graph(&text.replacen(line, &line.replace(args, &swapped), 1)).expect_err("h0 of xp's type");
    assert!(e.message.contains("recurrence initial state is [B, "), "{e}");
}
