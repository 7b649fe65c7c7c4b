//! Planner tests: placements never overlap live buffers, every buffer is written before it is
//! read, the arena is at least the lower bound (property tests over random intervals and
//! random graphs), and the rewriting passes (cast placement, distribution of sums, view
//! canonicalisation, checkpointing) compute the same values as the graph they rewrite
//! (reference interpreter).

use cvc_compiler::front::check_source;
use cvc_compiler::interp::check::random_tensor;
use cvc_compiler::interp::{evaluate, SplitMix64, Tensor};
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::*;
use cvc_compiler::passes::fusion::{self, GroupKind};
use cvc_compiler::passes::liveness::LiveInterval;
use cvc_compiler::passes::memplan::{self, align, storage_root, ALIGN};
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::{cast, distribute, remat, schedule, views, Program};
use proptest::prelude::*;
use std::collections::HashMap;

#[path = "../../tests/src/seed.rs"]
mod seed;

/// A proptest configuration with `cases` cases and a fixed RNG seed (proptest's default is
/// a fresh random seed per run), varied by `CVC_SEED` like every other test seed.
fn fixed_cases(cases: u32, block: &str) -> ProptestConfig {
    let seed = seed::seed_for(&format!("planner::proptest {block}"));
    ProptestConfig {
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..ProptestConfig::with_cases(cases)
    }
}

// ---------------------------------------------------------------------------------------
// Placement over random intervals.

fn interval_strategy() -> impl Strategy<Value = Vec<LiveInterval>> {
    prop::collection::vec((0usize..40, 0usize..15, 1usize..5000, prop::bool::weighted(0.1)), 1..60).prop_map(
        |v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (first, len, bytes, persistent))| LiveInterval {
                    values: vec![Value::from_index(i)],
                    starts: vec![if persistent { 0 } else { first }],
                    first: if persistent { 0 } else { first },
                    last: if persistent { 54 } else { first + len },
                    bytes: align(bytes),
                    persistent,
                })
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(fixed_cases(200, "placements"))]
    #[test]
    fn placements_never_overlap_live_buffers(ivs in interval_strategy()) {
        let steps = ivs.iter().map(|iv| iv.last + 1).max().unwrap_or(1);
        let (lb, _) = memplan::lower_bound(&ivs, steps);
        for p in [memplan::greedy_by_size(&ivs), memplan::best_fit_in_order(&ivs), memplan::best_fit_by_size(&ivs)] {
            memplan::validate(&ivs, &p).map_err(TestCaseError::fail)?;
            prop_assert!(p.arena_bytes >= lb, "arena {} below the lower bound {lb}", p.arena_bytes);
            prop_assert!(p.offsets.iter().all(|o| o % ALIGN == 0));
            let total: usize = ivs.iter().map(|iv| iv.bytes).sum();
            prop_assert!(p.arena_bytes <= total);
        }
    }
}

/// The lower bound of disjoint-in-time buffers is the largest one; all fit at offset 0.
#[test]
fn disjoint_buffers_share_one_range() {
    let ivs: Vec<LiveInterval> = (0..5)
        .map(|i| LiveInterval {
            values: vec![Value::from_index(i)],
            starts: vec![2 * i],
            first: 2 * i,
            last: 2 * i + 1,
            bytes: 256 * (i + 1),
            persistent: false,
        })
        .collect();
    let p = memplan::greedy_by_size(&ivs);
    assert_eq!(p.arena_bytes, 256 * 5);
    assert!(p.offsets.iter().all(|&o| o == 0));
    assert_eq!(memplan::lower_bound(&ivs, 10).0, 256 * 5);
}

// ---------------------------------------------------------------------------------------
// Random graphs through the whole pipeline.

/// A random training graph: a chain of elementwise, reduction, movement and contraction
/// ops over a complex input, ending in a real loss.
fn random_graph(ops: &[(u8, u8)]) -> Graph {
    let mut g = Graph::new("random", Mode::Train);
    let mut b = Builder::new(&mut g);
    b.at(Default::default(), Role::Input, "x");
    let x = b.leaf(
        Op::Input { name: "x".into() },
        TensorType::new(DType::C64, Shape(vec![Dim::Batch, Dim::Fixed(4), Dim::Fixed(6)])),
    );
    let mut vals = vec![x];
    for (i, &(kind, pick)) in ops.iter().enumerate() {
        let a = vals[pick as usize % vals.len()];
        let label = format!("op{i}");
        b.at(Default::default(), Role::Forward, label.clone());
        let ty = b.graph.ty(a).clone();
        let v = match kind % 9 {
            0 => b.unary(UnaryOp::Neg, a),
            1 => {
                let r = if ty.dtype == DType::C64 { b.unary(UnaryOp::Real, a).unwrap() } else { a };
                let i2 = if ty.dtype == DType::C64 { b.unary(UnaryOp::Imag, a).unwrap() } else { a };
                let r = b.unary(UnaryOp::Relu, r).unwrap();
                b.binary(BinaryOp::Complex, r, i2)
            }
            2 => {
                b.at(Default::default(), Role::Param, label.clone());
                let p = b.leaf(
                    Op::Param { name: format!("p{i}"), init: Init::Ones },
                    TensorType::new(
                        DType::F32,
                        Shape::fixed(&[ty.shape.0[ty.shape.rank() - 1].fixed().unwrap_or(1)]),
                    ),
                );
                b.at(Default::default(), Role::Forward, label.clone());
                b.mul(a, p)
            }
            3 if ty.shape.rank() == 3 => {
                let s = b.sum(a, &[2]).unwrap();
                b.expand(s, ty.shape.clone()).and_then(|e| b.add2(e, a))
            }
            4 if ty.shape.rank() == 3 => {
                let d = ty.shape.0.clone();
                let n = d[1].fixed().unwrap() * d[2].fixed().unwrap();
                let r = b.reshape(a, Shape(vec![Dim::Batch, Dim::Fixed(n)])).unwrap();
                b.at(Default::default(), Role::Param, label.clone());
                let w = b.leaf(
                    Op::Param { name: format!("w{i}"), init: Init::Ones },
                    TensorType::new(DType::C64, Shape::fixed(&[n, n])),
                );
                b.at(Default::default(), Role::Forward, label.clone());
                let m = b
                    .add(
                        Op::MatMul { trans: [false, false], conj: [false, false], sum_batch: false },
                        &[r, w],
                    )
                    .unwrap();
                b.reshape(m, ty.shape.clone())
            }
            5 if ty.shape.rank() == 3 && ty.shape.0[2] == Dim::Fixed(6) => {
                let r = b
                    .reshape(a, Shape(vec![Dim::Batch, Dim::Fixed(4), Dim::Fixed(3), Dim::Fixed(2)]))
                    .unwrap();
                let s = b.sum(r, &[3]).unwrap();
                let s = b.scale(s, 0.5).unwrap();
                let e = b.expand(s, r_shape(&ty)).unwrap();
                b.reshape(e, ty.shape.clone()).and_then(|e| b.mul(e, a))
            }
            6 => b.unary(UnaryOp::Conj, a),
            7 if ty.dtype == DType::F32 => b.unary(UnaryOp::ToComplex, a),
            _ => {
                let m = b.unary(UnaryOp::Abs2, a).unwrap();
                b.unary(UnaryOp::ToComplex, m)
            }
        };
        vals.push(v.expect("random op type-checks"));
    }
    let last = *vals.last().expect("one value");
    b.at(Default::default(), Role::Forward, "loss");
    let m = b.unary(UnaryOp::Abs2, last).unwrap();
    let axes: Vec<usize> = (0..b.graph.ty(m).shape.rank()).collect();
    let s = b.sum(m, &axes).unwrap();
    let l = b.reshape(s, Shape::scalar()).unwrap();
    g.loss = Some(l);
    g.outputs.push(Output { name: "y".into(), value: last });
    g
}

fn r_shape(ty: &TensorType) -> Shape {
    let _ = ty;
    Shape(vec![Dim::Batch, Dim::Fixed(4), Dim::Fixed(3), Dim::Fixed(2)])
}

fn optimizer_choice(i: usize) -> cvc_compiler::config::Optimizer {
    use cvc_compiler::config::{Optimizer, OptimizerKind};
    let kind = match i {
        0 => OptimizerKind::Sgd { momentum: 0.0, nesterov: false },
        1 => OptimizerKind::Sgd { momentum: 0.9, nesterov: true },
        _ => OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
    };
    Optimizer { kind, lr: 1e-2, weight_decay: 0.0 }
}

/// Simulates the arena: every read finds the bytes its value's buffer last received.
fn check_written_before_read(p: &Program) -> Result<(), String> {
    let g = &p.graph;
    let blocks = p.plan.arena_bytes / ALIGN + 1;
    let mut owner: Vec<Option<Value>> = vec![None; blocks];
    let range = |v: Value| {
        let s = p.plan.slot(v).ok_or_else(|| format!("{v} has no slot"))?;
        Ok::<_, String>(s.offset / ALIGN..(s.offset + align(s.bytes)) / ALIGN)
    };
    for (h, n) in g.nodes.iter() {
        if n.op.is_leaf() && !matches!(n.op, Op::Scalar { .. }) {
            for b in range(h)? {
                owner[b] = Some(h);
            }
        }
    }
    let mut overwritten: Vec<bool> = vec![false; g.nodes.len()];
    for (step, &gi) in p.order.iter().enumerate() {
        let k = &p.groups[gi];
        for &i in &k.inputs {
            let root = storage_root(g, i);
            if overwritten[root.index()] {
                return Err(format!("step {step}: {i} is read after an assign overwrote {root}"));
            }
            let holder = range(i)?
                .map(|b| owner[b])
                .find(|&o| o != Some(root) && o.is_some_and(|o| storage_root(g, o) != root));
            if let Some(other) = holder {
                return Err(format!("step {step}: {i} is read but its bytes hold {other:?}"));
            }
            if range(i)?.any(|b| owner[b].is_none()) {
                return Err(format!("step {step}: {i} is read before it is written"));
            }
        }
        if k.kind == GroupKind::View {
            continue;
        }
        for &o in &k.outputs {
            let root = storage_root(g, o);
            for b in range(o)? {
                owner[b] = Some(root);
            }
            if matches!(g.node(o).op, Op::Assign) {
                overwritten[root.index()] = true;
            }
        }
    }
    // After the step: outputs, the loss and every parameter gradient are still readable.
    let mut kept: Vec<Value> = g.outputs.iter().map(|o| o.value).collect();
    kept.extend(g.loss);
    kept.extend(p.facts.grads.iter().map(|&(_, d)| d));
    for v in kept {
        let root = storage_root(g, v);
        if range(v)?.any(|b| owner[b].map(|o| storage_root(g, o)) != Some(root)) {
            return Err(format!("{v} does not survive to the end of the step"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(fixed_cases(48, "random_graphs"))]
    #[test]
    fn random_graphs_plan_soundly(
        ops in prop::collection::vec((0u8..9, 0u8..255), 1..12),
        batch in 1usize..5,
        fuse in any::<bool>(),
        budget in prop::option::of(256u64..20_000),
        opt in 0usize..3,
    ) {
        let g = random_graph(&ops);
        let optimizer = optimizer_choice(opt);
        let opts = Options { batch, fuse, memory_budget: budget, optimizer, rnn_chunk: None, ..Options::default() };
        let p = compile(g, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
        schedule::validate(&p.graph, &fusion::Fusion { groups: p.groups.clone(), recomputed: vec![] }, &p.order)
            .map_err(TestCaseError::fail)?;
        let ivs: Vec<LiveInterval> = p.plan.buffers.iter().map(|b| b.interval.clone()).collect();
        let placement = memplan::Placement { offsets: p.plan.buffers.iter().map(|b| b.offset).collect(), arena_bytes: p.plan.arena_bytes };
        memplan::validate(&ivs, &placement).map_err(TestCaseError::fail)?;
        prop_assert!(p.plan.arena_bytes >= p.plan.lower_bound_bytes);
        check_written_before_read(&p).map_err(TestCaseError::fail)?;
        if fuse {
            prop_assert_eq!(p.facts.combines_materialized, 0);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Rewrites preserve values (reference interpreter).

fn leaves(g: &Graph, batch: usize, rng: &mut SplitMix64) -> HashMap<String, Tensor> {
    let users = g.users();
    let mut out = HashMap::new();
    for (h, n) in g.nodes.iter() {
        if let Some(name) = g.leaf_name(h) {
            let bound = users[h.index()]
                .iter()
                .filter_map(|&u| match g.node(u).op {
                    Op::OneHot { classes } => Some(classes),
                    Op::Gather => g.ty(g.node(u).inputs[0]).shape.0[0].fixed(),
                    _ => None,
                })
                .min()
                .unwrap_or(2);
            let mut t = random_tensor(n.ty.dtype, &n.ty.shape.resolve(batch), bound, rng);
            if matches!(n.op, Op::State { .. }) && n.ty.dtype != DType::I32 {
                // Second moments and counters must be non-negative.
                if let cvc_compiler::interp::TensorData::Real(v) = &mut t.data {
                    v.iter_mut().for_each(|x| *x = x.abs());
                }
            }
            out.insert(name.to_string(), t);
        }
    }
    out
}

/// Evaluates `g`: its outputs, loss and assigned values, keyed by name.
fn results(
    g: &Graph,
    batch: usize,
    named: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>, String> {
    let mut map = HashMap::new();
    for h in g.nodes.handles() {
        if let Some(name) = g.leaf_name(h) {
            map.insert(h, named.get(name).ok_or_else(|| format!("no leaf {name}"))?.clone());
        }
    }
    let vals = evaluate(g, batch, &map)?;
    let mut out = Vec::new();
    for o in &g.outputs {
        out.push((format!("output {}", o.name), vals[o.value.index()].clone().expect("value")));
    }
    if let Some(l) = g.loss {
        out.push(("loss".into(), vals[l.index()].clone().expect("value")));
    }
    for (h, n) in g.nodes.iter() {
        if matches!(n.op, Op::Assign) {
            let name = g.leaf_name(n.inputs[0]).expect("assign target is a leaf");
            out.push((format!("assign {name}"), vals[h.index()].clone().expect("value")));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn assert_same(what: &str, a: &[(String, Tensor)], b: &[(String, Tensor)]) {
    assert_eq!(a.len(), b.len(), "{what}: different result sets");
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        assert_eq!(na, nb, "{what}");
        let d = ta.max_abs_diff(tb).unwrap_or(f64::INFINITY);
        let scale = ta.to_complex_vec().iter().map(|z| z.norm()).fold(1.0, f64::max);
        assert!(d <= 1e-9 * scale, "{what}: {na} differs by {d} (scale {scale})");
    }
}

fn example(name: &str) -> String {
    let path = format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Cast placement, autodiff + optimizer, distribution of sums, view canonicalisation and a
/// checkpoint each leave
/// every output, the loss and every updated buffer unchanged.
fn rewrites_preserve_values(file: &str, batch: usize) {
    let src = example(file);
    let checked = check_source(file, &src, Mode::Train).unwrap_or_else(|d| panic!("{file}: {d:?}"));
    let s = seed::seed_for(&format!("planner::rewrites_preserve_values {file}"));
    let mut rng = SplitMix64::new(s);
    let mut g = checked.graph.clone();
    if g.loss.is_none() {
        return;
    }
    let named = leaves(&g, batch, &mut rng);
    let before = results(&g, batch, &named).expect("lowered graph evaluates");
    cast::run(&mut g).expect("cast pass");
    assert_same(
        &format!("{file}: cast (seed {s})"),
        &before,
        &results(&g, batch, &named).expect("evaluates"),
    );

    let ad = cvc_compiler::passes::autodiff::run(&mut g).expect("autodiff");
    let opt = checked.train.optimizer.clone();
    cvc_compiler::passes::optimizer::run(&mut g, &ad.grads, &opt).expect("optimizer");
    let mut named = named;
    for (k, t) in leaves(&g, batch, &mut rng) {
        named.entry(k).or_insert(t);
    }
    let trained = results(&g, batch, &named).expect("training graph evaluates");
    let mut h = g.clone();
    distribute::run(&mut h, &[]).expect("distribute");
    verify::verify(&h).expect("distributed IR verifies");
    assert_same(
        &format!("{file}: distribute (seed {s})"),
        &trained,
        &results(&h, batch, &named).expect("evaluates"),
    );
    views::run(&mut h, &[]).expect("views");
    verify::verify(&h).expect("canonical IR verifies");
    assert_same(
        &format!("{file}: views (seed {s})"),
        &trained,
        &results(&h, batch, &named).expect("evaluates"),
    );

    let f = fusion::fuse(&h);
    let checkpointed = h
        .nodes
        .iter()
        .filter(|(_, n)| n.op.is_contraction() && n.origin.role == Role::Forward)
        .find_map(|(v, _)| remat::checkpoint(&h, v, &[]).expect("checkpoint"));
    if let Some((c, _, clone)) = checkpointed {
        verify::verify(&c).expect("checkpointed IR verifies");
        assert_eq!(c.node(clone).origin.role, Role::Backward);
        assert_same(
            &format!("{file}: checkpoint (seed {s})"),
            &trained,
            &results(&c, batch, &named).expect("evaluates"),
        );
    }
    // Every forward elementwise, reduction and concatenation recomputed for the backward pass
    // at once (what the cheap recomputation of `remat.rs` does a few at a time).
    let cheap: Vec<Value> = h
        .nodes
        .iter()
        .filter(|(_, n)| {
            n.origin.role == Role::Forward
                && (n.op.is_elementwise() || matches!(n.op, Op::Reduce { .. } | Op::Concat { .. }))
        })
        .map(|(v, _)| v)
        .collect();
    if let Some((c, _, clones)) = remat::checkpoint_all(&h, &cheap, &[]).expect("checkpoint_all") {
        verify::verify(&c).expect("checkpointed IR verifies");
        assert!(clones.iter().all(|&(_, clone)| c.node(clone).origin.role == Role::Backward));
        assert_same(
            &format!("{file}: cheap recomputation of {} values (seed {s})", clones.len()),
            &trained,
            &results(&c, batch, &named).expect("evaluates"),
        );
    }
    assert_eq!(fusion::combines_materialized(&h, &f), 0, "{file}");
}

#[test]
fn seed_cnn_rewrites_preserve_values() {
    rewrites_preserve_values("seed_cnn.cvnn", 1);
}

#[test]
fn rf_modulation_rewrites_preserve_values() {
    rewrites_preserve_values("rf_modulation.cvnn", 2);
}

#[test]
fn complex_resnet_rewrites_preserve_values() {
    rewrites_preserve_values("complex_resnet.cvnn", 1);
}

#[test]
fn mri_recon_rewrites_preserve_values() {
    rewrites_preserve_values("mri_recon.cvnn", 1);
}

/// A memory budget checkpoints the first convolution of the seed network and the plan
/// shrinks; the recomputation is reported.
#[test]
fn budget_checkpoints_the_seed_network() {
    let src = example("seed_cnn.cvnn");
    let checked = check_source("seed_cnn.cvnn", &src, Mode::Train).expect("checks");
    let opts = Options {
        batch: 1024,
        optimizer: checked.train.optimizer.clone(),
        memory_budget: None,
        fuse: true,
        rnn_chunk: None,
        ..Options::default()
    };
    let free = compile(checked.graph.clone(), &opts).expect("compiles");
    let budget = 3 * free.plan.arena_bytes as u64 / 4;
    let tight = compile(checked.graph, &Options { memory_budget: Some(budget), ..opts }).expect("compiles");
    assert!(tight.plan.arena_bytes as u64 <= budget, "{} > {budget}", tight.plan.arena_bytes);
    assert!(tight
        .facts
        .recomputed
        .iter()
        .any(|(v, why)| { tight.graph.node(*v).op.is_contraction() && why.contains("checkpoint") }));
    check_written_before_read(&tight).expect("sound plan");
}

/// The U-Net under a budget it cannot meet: every contraction checkpoint that shrinks the
/// arena is kept (a plan over the budget is the caller's to report), and the plan stays
/// sound. At batch 32: 159.6 MiB storing every value the backward pass reads, 132.4 MiB with
/// the cheap recomputations made without a budget, 114.9 MiB with every checkpoint as well.
#[test]
fn budget_checkpoints_the_unet() {
    let src = example("polsar_unet.cvnn");
    let checked = check_source("polsar_unet.cvnn", &src, Mode::Train).expect("checks");
    let opts = Options { batch: 32, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let stored =
        compile(checked.graph.clone(), &Options { cheap_remat: false, ..opts.clone() }).expect("compiles");
    let free = compile(checked.graph.clone(), &opts).expect("compiles");
    let tight = compile(checked.graph, &Options { memory_budget: Some(1), ..opts }).expect("compiles");
    let mib = |p: &Program| p.plan.arena_bytes as f64 / (1 << 20) as f64;
    let (s, f, t) = (mib(&stored), mib(&free), mib(&tight));
    assert!(f < 0.9 * s, "cheap recomputation: {f:.1} MiB vs {s:.1} MiB");
    assert!(t < f && t < 0.8 * s, "budget: {t:.1} MiB vs {f:.1} and {s:.1} MiB");
    assert!(tight
        .facts
        .recomputed
        .iter()
        .any(|(v, why)| tight.graph.node(*v).op.is_contraction() && why.contains("checkpoint")));
    check_written_before_read(&tight).expect("sound plan");
}

/// The acceptance figures of the seed network at batch 1024.
#[test]
fn seed_cnn_plan_meets_targets() {
    let src = example("seed_cnn.cvnn");
    let checked = check_source("seed_cnn.cvnn", &src, Mode::Train).expect("checks");
    let opts = Options {
        batch: 1024,
        optimizer: checked.train.optimizer.clone(),
        memory_budget: None,
        fuse: true,
        rnn_chunk: None,
        ..Options::default()
    };
    let p = compile(checked.graph, &opts).expect("compiles");
    let gib = 1u64 << 30;
    assert!((p.plan.arena_bytes as u64) * 10 <= 26 * gib, "arena {} > 2.6 GiB", p.plan.arena_bytes);
    assert!(p.plan.fragmentation_pct() <= 5.0, "fragmentation {}", p.plan.fragmentation_pct());
    assert_eq!(p.facts.combines_materialized, 0);
    let base = compile(
        check_source("seed_cnn.cvnn", &src, Mode::Train).expect("checks").graph,
        &Options { fuse: false, ..opts },
    )
    .expect("compiles unfused");
    assert!(p.plan.arena_bytes < base.plan.arena_bytes, "fusion does not beat the unfused baseline");
}

/// The arena simulation catches a plan that puts live buffers on top of each other.
#[test]
fn arena_simulation_catches_overlaps() {
    let g = random_graph(&[(4, 0), (1, 1), (5, 2), (2, 3)]);
    let mut p = compile(g, &Options { batch: 3, ..Options::default() }).expect("compiles");
    check_written_before_read(&p).expect("the real plan is sound");
    assert!(p.groups.len() > 5, "the random graph has {} kernels", p.groups.len());
    for s in p.plan.slots.iter_mut().flatten() {
        s.offset = 0;
    }
    assert!(check_written_before_read(&p).is_err(), "overlapping buffers went unnoticed");
}

// ---------------------------------------------------------------------------------------
// Cast placement on hand-built graphs.

/// Builds `f(x)` for a real input `x: f32[B, 8]` and a complex input `y: c64[B, 2, 4]`.
fn cast_graph(body: impl FnOnce(&mut Builder, Value, Value) -> Value) -> Graph {
    let mut g = Graph::new("casts", Mode::Eval);
    let mut b = Builder::new(&mut g);
    b.at(Default::default(), Role::Input, "x");
    let x = b.leaf(
        Op::Input { name: "x".into() },
        TensorType::new(DType::F32, Shape(vec![Dim::Batch, Dim::Fixed(8)])),
    );
    let y = b.leaf(
        Op::Input { name: "y".into() },
        TensorType::new(DType::C64, Shape(vec![Dim::Batch, Dim::Fixed(2), Dim::Fixed(4)])),
    );
    b.at(Default::default(), Role::Forward, "f");
    let out = body(&mut b, x, y);
    g.outputs.push(Output { name: "out".into(), value: out });
    g
}

/// Runs the cast pass, checks the values are unchanged, and returns the sites and the
/// number of `ToComplex` nodes left.
fn place_casts(g: Graph) -> (Vec<String>, usize, Graph) {
    let s = seed::seed_for(&format!("planner::place_casts {}", g.name));
    let mut rng = SplitMix64::new(s);
    let named = leaves(&g, 3, &mut rng);
    let before = results(&g, 3, &named).expect("evaluates");
    let mut h = g;
    let sites = cast::run(&mut h).expect("cast pass");
    verify::verify(&h).expect("verifies");
    assert_same(&format!("casts (seed {s})"), &before, &results(&h, 3, &named).expect("evaluates"));
    let left = h.nodes.iter().filter(|(_, n)| matches!(n.op, Op::Unary(UnaryOp::ToComplex))).count();
    (sites.into_iter().map(|c| c.what).collect(), left, h)
}

#[test]
fn cast_folds_into_a_complex_matmul() {
    let g = cast_graph(|b, x, _| {
        let c = b.unary(UnaryOp::ToComplex, x).unwrap();
        b.at(Default::default(), Role::Param, "w");
        let w = b.leaf(
            Op::Param { name: "w".into(), init: Init::Ones },
            TensorType::new(DType::C64, Shape::fixed(&[8, 3])),
        );
        b.add(Op::MatMul { trans: [false, false], conj: [false, false], sum_batch: false }, &[c, w]).unwrap()
    });
    let (sites, left, _) = place_casts(g);
    assert_eq!(sites, vec!["folded into matmul"]);
    assert_eq!(left, 0);
}

#[test]
fn cast_sinks_past_views_and_real_ops_then_folds() {
    let g = cast_graph(|b, x, y| {
        let c = b.unary(UnaryOp::ToComplex, x).unwrap();
        let r = b.reshape(c, Shape(vec![Dim::Batch, Dim::Fixed(2), Dim::Fixed(4)])).unwrap();
        let n = b.unary(UnaryOp::Neg, r).unwrap();
        b.add2(n, y).unwrap()
    });
    let (sites, left, h) = place_casts(g);
    assert_eq!(sites, vec!["folded into add"]);
    assert_eq!(left, 0);
    // The reshape and the negation now run on real data (half the bytes).
    for (_, n) in h.nodes.iter() {
        if matches!(n.op, Op::Reshape | Op::Unary(UnaryOp::Neg)) {
            assert_eq!(n.ty.dtype, DType::F32, "{:?} stayed complex", n.op);
        }
    }
}

#[test]
fn cast_materialises_only_for_the_fft() {
    let g = cast_graph(|b, x, _| {
        let c = b.unary(UnaryOp::ToComplex, x).unwrap();
        let f = b.add(Op::Fft { axis: 1, inverse: false, norm: FftNorm::Backward }, &[c]).unwrap();
        b.add2(f, c).unwrap()
    });
    let (sites, left, _) = place_casts(g);
    // The add still reads the real data (4 bytes an element, not 8): only the fft needs
    // the complex copy.
    assert_eq!(sites, vec!["materialised before fft", "folded into add"]);
    assert_eq!(left, 1);
}

#[test]
fn cast_sinks_past_a_real_contraction_to_the_output() {
    let g = cast_graph(|b, x, _| {
        let c = b.unary(UnaryOp::ToComplex, x).unwrap();
        b.at(Default::default(), Role::Param, "w");
        let w = b.leaf(
            Op::Param { name: "w".into(), init: Init::Ones },
            TensorType::new(DType::F32, Shape::fixed(&[8, 3])),
        );
        b.add(Op::MatMul { trans: [false, false], conj: [false, false], sum_batch: false }, &[c, w]).unwrap()
    });
    let (sites, left, h) = place_casts(g);
    assert_eq!(sites, vec!["materialised before the output"]);
    assert_eq!(left, 1);
    let mm = h.nodes.iter().find(|(_, n)| matches!(n.op, Op::MatMul { .. })).expect("matmul kept").1;
    assert_eq!(mm.ty.dtype, DType::F32, "the matmul runs on real data");
}

proptest! {
    #![proptest_config(fixed_cases(40, "random_rewrites"))]
    /// Cast placement, autodiff + optimizer, distribution of sums and view canonicalisation
    /// keep every output,
    /// the loss and every update of random graphs (pooling-like reshapes and broadcasts
    /// included), checked in the reference interpreter.
    #[test]
    fn random_graph_rewrites_preserve_values(ops in prop::collection::vec((0u8..9, 0u8..255), 1..10), salt in any::<u64>()) {
        let mut g = random_graph(&ops);
        let mut rng = SplitMix64::new(salt);
        let named0 = leaves(&g, 2, &mut rng);
        let before = results(&g, 2, &named0).map_err(TestCaseError::fail)?;
        cast::run(&mut g).map_err(TestCaseError::fail)?;
        let after = results(&g, 2, &named0).map_err(TestCaseError::fail)?;
        assert_same(&format!("cast, ops {ops:?}"), &before, &after);
        let ad = cvc_compiler::passes::autodiff::run(&mut g).map_err(TestCaseError::fail)?;
        cvc_compiler::passes::optimizer::run(&mut g, &ad.grads, &Default::default()).map_err(TestCaseError::fail)?;
        let mut named = named0;
        for (k, t) in leaves(&g, 2, &mut rng) {
            named.entry(k).or_insert(t);
        }
        let trained = results(&g, 2, &named).map_err(TestCaseError::fail)?;
        distribute::run(&mut g, &[]).map_err(TestCaseError::fail)?;
        verify::verify(&g).map_err(TestCaseError::fail)?;
        assert_same(&format!("distribute, ops {ops:?}"), &trained, &results(&g, 2, &named).map_err(TestCaseError::fail)?);
        views::run(&mut g, &[]).map_err(TestCaseError::fail)?;
        verify::verify(&g).map_err(TestCaseError::fail)?;
        assert_same(&format!("views, ops {ops:?}"), &trained, &results(&g, 2, &named).map_err(TestCaseError::fail)?);
    }
}

/// Every example and fixture network plans soundly (arena simulation), fused and unfused,
/// with and without a tight budget, and fused plans never copy a real/imag combine.
#[test]
fn every_network_plans_soundly() {
    let root = format!("{}/..", env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["examples", "tests/fixtures/ok"] {
        let mut v: Vec<_> = std::fs::read_dir(format!("{root}/{dir}"))
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "cvnn"))
            .collect();
        v.sort();
        files.extend(v);
    }
    assert!(files.len() >= 4);
    for path in files {
        let name = path.display().to_string();
        let src = std::fs::read_to_string(&path).expect("reads");
        let mut checked = check_source(&name, &src, Mode::Train).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        if checked.graph.loss.is_none() {
            checked = check_source(&name, &src, Mode::Eval).expect("checks");
        }
        for (fuse, budget) in [(true, None), (false, None), (true, Some(1u64))] {
            let opts = Options {
                batch: 3,
                optimizer: checked.train.optimizer.clone(),
                memory_budget: budget,
                fuse,
                rnn_chunk: None,
                ..Options::default()
            };
            let p = compile(checked.graph.clone(), &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
            check_written_before_read(&p)
                .unwrap_or_else(|e| panic!("{name} (fuse {fuse}, budget {budget:?}): {e}"));
            assert!(p.plan.arena_bytes >= p.plan.lower_bound_bytes, "{name}");
            if fuse {
                assert_eq!(p.facts.combines_materialized, 0, "{name}");
                // A tiny plan's fragmentation is a few odd-sized holes: bound it in bytes there
                // (segmentation_2d at batch 3: a 66 KiB arena, 4.8 KiB over its lower bound
                // since its norms' parameter gradients are joined into concatenations).
                let waste = p.plan.arena_bytes.saturating_sub(p.plan.lower_bound_bytes);
                assert!(
                    p.plan.fragmentation_pct() <= 5.0 || waste <= 8192,
                    "{name}: {}% ({waste} bytes)",
                    p.plan.fragmentation_pct()
                );
            }
        }
    }
}

/// A batchnorm-like backward sum, `Σ_b (d·x − expand(s)·x − s2·c)` with `s = Σ_b d·x` and a
/// per-feature `s2` from another sum: the pass splits it into sums of `d·x`, `x` and `c`
/// scaled afterwards, so no sum over the batch reads another one's result; the values
/// (interpreter, random inputs) are unchanged.
#[test]
fn distribute_splits_sums_that_wait_for_sums() {
    let mut g = Graph::new("distribute", Mode::Train);
    let mut b = Builder::new(&mut g);
    let full = Shape(vec![Dim::Batch, Dim::Fixed(5)]);
    b.at(Default::default(), Role::Input, "x");
    let x = b.leaf(Op::Input { name: "x".into() }, TensorType::new(DType::F32, full.clone()));
    b.at(Default::default(), Role::Input, "d");
    let d = b.leaf(Op::Input { name: "d".into() }, TensorType::new(DType::C64, full.clone()));
    b.at(Default::default(), Role::Input, "c");
    let c = b.leaf(Op::Input { name: "c".into() }, TensorType::new(DType::C64, full.clone()));
    b.at(Default::default(), Role::Backward, "bn");
    let dx = b.mul(d, x).unwrap();
    let s = b.sum(dx, &[0]).unwrap();
    let s2 = b.sum(c, &[0]).unwrap();
    let se = b.expand(s, full.clone()).unwrap();
    let t1 = b.mul(se, x).unwrap();
    let t2 = b.mul(s2, c).unwrap();
    let e = b.sub(dx, t1).unwrap();
    let e = b.sub(e, t2).unwrap();
    let y = b.sum(e, &[0]).unwrap();
    g.outputs.push(Output { name: "y".into(), value: y });
    let before = g.clone();
    let map = distribute::run(&mut g, &[]).expect("distribute");
    verify::verify(&g).expect("verifies");
    assert!(map.lookup(y).is_some(), "the output survives");
    // No sum over the batch reads a value computed from another sum.
    let mut from_sum = vec![false; g.nodes.len()];
    for (v, n) in g.nodes.iter() {
        let reads_sum = n.inputs.iter().any(|i| from_sum[i.index()]);
        if matches!(n.op, Op::Reduce { .. }) {
            assert!(!reads_sum, "{v} still waits for another sum");
        }
        from_sum[v.index()] = reads_sum || matches!(n.op, Op::Reduce { .. });
    }
    let sums = |g: &Graph| g.nodes.iter().filter(|(_, n)| matches!(n.op, Op::Reduce { .. })).count();
    assert_eq!(
        (sums(&before), sums(&g)),
        (3, 3),
        "Σ d·x, Σ c and the output's sum become Σ d·x and Σ c (reused) and Σ x"
    );
    let s = seed::seed_for("planner::distribute_splits_sums_that_wait_for_sums");
    let mut rng = SplitMix64::new(s);
    let named = leaves(&before, 3, &mut rng);
    assert_same(
        &format!("distribute (seed {s})"),
        &results(&before, 3, &named).expect("evaluates"),
        &results(&g, 3, &named).expect("evaluates"),
    );
}

/// A ViT-like stack (two self-attention layers with residuals and an activation) at `tokens`
/// tokens, 48 features.
fn vit_block(tokens: usize) -> String {
    format!(
        "model VitBlock {{
    input x: c64[B, {tokens}, 48]
    input label: class[B] of 4
    a = x |> attention(heads = 3)
    r = a + x
    h = r |> crelu |> attention(heads = 3)
    y = h + r
    logits = y |> abs |> global_avgpool |> linear(4) |> real
    output logits
    loss cross_entropy(logits, label)
}}
"
    )
}

/// Attention never stores its `[T, S]` weights: at T = 1024 no value of the training step
/// has T·T elements per sample, and the planned arena grows linearly in T (256 → 1024 tokens:
/// at most 4.5×, where a stored score matrix would make it ~16×).
#[test]
fn attention_memory_is_linear_in_tokens() {
    let arena = |tokens: usize| {
        let src = vit_block(tokens);
        let checked = check_source("vit_block.cvnn", &src, Mode::Train).unwrap_or_else(|d| panic!("{d:?}"));
        let opts = Options {
            batch: 2,
            optimizer: checked.train.optimizer.clone(),
            memory_budget: None,
            fuse: true,
            rnn_chunk: None,
            ..Options::default()
        };
        let p = compile(checked.graph, &opts).expect("compiles");
        check_written_before_read(&p).expect("sound plan");
        let per_sample = |v: Value| p.graph.ty(v).shape.numel(1);
        let (worst, n) =
            p.graph.nodes.handles().map(|v| (v, per_sample(v))).max_by_key(|&(_, n)| n).expect("nodes");
        assert!(
            n < tokens * tokens,
            "T = {tokens}: {worst} ({}) holds {n} elements per sample, T·T = {}",
            p.graph.node(worst).op.mnemonic(),
            tokens * tokens
        );
        assert!(p.graph.nodes.iter().any(|(_, n)| matches!(n.op, Op::AttentionGrad { .. })));
        p.plan.arena_bytes
    };
    let (small, large) = (arena(256), arena(1024));
    assert!(large * 2 <= small * 9, "arena {large} bytes at T = 1024 vs {small} at T = 256: not linear in T");
}

/// A deep residual stack: the stream `x + f₁ + f₂ + …` is stored every few blocks, so no
/// kernel re-adds the branch outputs of every block before it (memory traffic that grew with
/// depth: in the ViT example a launch read up to 40 stored `[B, 256, 192]` tensors), and the
/// arena holds no more than when the sums were recomputed: the stored sums replace branch
/// outputs that only the recomputation kept alive (the examples' arenas did not change).
#[test]
fn residual_streams_are_stored_every_few_blocks() {
    let src = "model Deep {
        input x: c64[B, 32]
        input label: class[B] of 4
        block layer(d) { residual(linear(d) |> cgelu) }
        y = x |> repeat(16, layer(32))
        logits = y |> linear(4) |> abs
        output logits
        loss cross_entropy(logits, label)
    }
    train Deep { optimizer = adam(lr = 1e-3) }";
    let checked = check_source("deep.cvnn", src, Mode::Train).expect("checks");
    let opts = Options { batch: 8, optimizer: checked.train.optimizer.clone(), ..Options::default() };
    let p = compile(checked.graph, &opts).expect("compiles");
    let g = &p.graph;
    let stream = Shape(vec![Dim::Batch, Dim::Fixed(32)]);
    let mut widest = 0;
    for k in &p.groups {
        if matches!(k.kind, GroupKind::Elementwise | GroupKind::Reduce) && k.domain == stream {
            let full = k.inputs.iter().filter(|&&i| g.ty(i).shape == stream).count();
            widest = widest.max(full);
        }
    }
    // With the sums recomputed the last block's kernels read all 17 (checked).
    assert!(widest <= 4, "a kernel reads {widest} stored [B, 32] tensors");
    check_written_before_read(&p).expect("sound plan");
}
