//! Differential checking of a back end against the f64 reference interpreter, group by group.
//!
//! # Why local
//! An end-to-end comparison (every value from the same leaves, device vs interpreter) fails
//! legitimately: a relu/step/greater/select/max-by-magnitude input within f32 rounding of its
//! kink takes one side on the device and the other in f64, and batchnorm spreads that one
//! element to every upstream gradient. Retrying on other seeds papered over it, and also let
//! a bug that shows on 4 seeds of 5 pass. Instead, [`check_step_locally`] compiles the
//! program as usual but with a memory plan that keeps every materialised value
//! ([`keep_every_value`]: same kernels, other offsets), runs one step, downloads every stored
//! value, and checks each kernel group against the interpreter evaluated on the values *the
//! device* read ([`cvc_compiler::interp::replay`]). A kink flipped upstream can no longer
//! propagate: the interpreter follows the device's decisions at every group boundary. Inside
//! a group, the replay bounds each element's f32 rounding and names the elements whose value
//! hangs on a decision within that rounding; only those are excluded, and a value with more
//! than a few of them fails (the bound would be too loose to mean anything).
//!
//! Each check is deterministic for its seed: a wrong kernel fails on the first one.
//!
//! # What else is compared
//! [`check_training_steps`] adds the end-to-end comparisons that stay meaningful: the forward
//! outputs and loss against the interpreter from the same leaves when no discontinuous op
//! precedes them, and the program's own (reusing) memory plan against the keep-everything
//! plan after every step: bitwise on a deterministic back end, else within a tolerance that a
//! kink flip cannot reach and a clobbered buffer exceeds.

use cvc_compiler::interp::replay::{replay_group, GroupReplay, ROUNDING};
use cvc_compiler::interp::{evaluate, init_tensor, SplitMix64, Tensor, TensorData};
use cvc_compiler::ir::{BinaryOp, DType, Graph, Op, ReduceOp, UnaryOp, Value};
use cvc_compiler::passes::fusion::{Fusion, GroupKind};
use cvc_compiler::passes::memplan::{bump, storage_root};
use cvc_compiler::passes::Program;
use cvc_runtime::backend::{Backend, HostData, HostTensor};
use num_complex::Complex64;
use std::collections::HashMap;

/// Relative tolerance of a compared value: `‖device − reference‖ ≤ TOL·‖reference‖` plus the
/// replay's rounding bound.
pub const TOL: f64 = 1e-4;

/// Elements of one value that may be excluded as within rounding of a kink before the value
/// fails: `max(EXCLUDED_MIN, EXCLUDED_FRACTION · n)`.
pub const EXCLUDED_MIN: usize = 8;

/// See [`EXCLUDED_MIN`].
pub const EXCLUDED_FRACTION: f64 = 0.01;

/// A host tensor as the interpreter holds it (f64, complex f64, i64).
pub fn from_host(h: &HostTensor) -> Tensor {
    match (&h.data, h.dtype) {
        (HostData::I32(v), _) => Tensor::int(&h.shape, v.iter().map(|&x| x as i64).collect()),
        (HostData::F32(v), DType::C64) => Tensor::complex(
            &h.shape,
            v.chunks_exact(2).map(|c| Complex64::new(c[0] as f64, c[1] as f64)).collect(),
        ),
        (HostData::F32(v), _) => Tensor::real(&h.shape, v.iter().map(|&x| x as f64).collect()),
    }
}

/// An interpreter tensor in the arena's layout (f32, complex interleaved, i32).
pub fn to_host(t: &Tensor) -> HostTensor {
    let data = match &t.data {
        TensorData::Real(v) => HostData::F32(v.iter().map(|&x| x as f32).collect()),
        TensorData::Complex(v) => HostData::F32(v.iter().flat_map(|z| [z.re as f32, z.im as f32]).collect()),
        TensorData::Int(v) => HostData::I32(v.iter().map(|&x| x as i32).collect()),
    };
    HostTensor { dtype: t.dtype(), shape: t.shape.clone(), data }
}

/// `t` rounded to what the device stores, so both sides start from identical values.
pub fn round_f32(t: &Tensor) -> Tensor {
    from_host(&to_host(t))
}

/// Random leaf values, f32-rounded: inputs normal; parameters their initialiser plus normal
/// noise of 0.1 (so zero biases still test their broadcasting); state its initialiser
/// (moments, running statistics and step counters must be meaningful); labels in range of
/// the one-hot that reads them.
pub fn random_leaves(g: &Graph, batch: usize, rng: &mut SplitMix64) -> HashMap<Value, Tensor> {
    let users = g.users();
    let mut leaves = HashMap::new();
    for (h, n) in g.nodes.iter() {
        let shape = n.ty.shape.resolve(batch);
        let t = match &n.op {
            Op::Input { .. } => random_input(g, &users[h.index()], n.ty.dtype, &shape, rng),
            Op::State { init, .. } => init_tensor(init, n.ty.dtype, &shape, rng),
            Op::Param { init, .. } => {
                let mut t = init_tensor(init, n.ty.dtype, &shape, rng);
                match &mut t.data {
                    TensorData::Real(v) => v.iter_mut().for_each(|x| *x += 0.1 * rng.normal()),
                    TensorData::Complex(v) => v
                        .iter_mut()
                        .for_each(|z| *z += Complex64::new(0.1 * rng.normal(), 0.1 * rng.normal())),
                    TensorData::Int(_) => {}
                }
                t
            }
            _ => continue,
        };
        leaves.insert(h, round_f32(&t));
    }
    leaves
}

/// Fresh values for the `Input` leaves only (a later training step's batch).
pub fn random_inputs(g: &Graph, batch: usize, rng: &mut SplitMix64) -> HashMap<Value, Tensor> {
    let users = g.users();
    g.inputs()
        .map(|v| {
            let n = g.node(v);
            let shape = n.ty.shape.resolve(batch);
            (v, round_f32(&random_input(g, &users[v.index()], n.ty.dtype, &shape, rng)))
        })
        .collect()
}

fn random_input(g: &Graph, users: &[Value], dtype: DType, shape: &[usize], rng: &mut SplitMix64) -> Tensor {
    let count: usize = shape.iter().product();
    match dtype {
        DType::F32 => Tensor::real(shape, (0..count).map(|_| rng.normal()).collect()),
        DType::C64 => {
            Tensor::complex(shape, (0..count).map(|_| Complex64::new(rng.normal(), rng.normal())).collect())
        }
        DType::I32 => {
            let classes = users
                .iter()
                .find_map(|&u| match g.node(u).op {
                    Op::OneHot { classes } => Some(classes),
                    Op::Gather => g.ty(g.node(u).inputs[0]).shape.0[0].fixed(),
                    _ => None,
                })
                .unwrap_or(2);
            Tensor::int(shape, (0..count).map(|_| (rng.next_u64() % classes as u64) as i64).collect())
        }
    }
}

/// `p` with a memory plan in which no two values share memory, so every value a kernel
/// stores is still readable after the step. The kernel groups and their order are unchanged.
pub fn keep_every_value(p: &Program) -> Program {
    let fusion = Fusion { groups: p.groups.clone(), recomputed: Vec::new() };
    let plan = bump(&p.graph, &fusion, &p.order, p.plan.batch);
    Program {
        graph: p.graph.clone(),
        groups: p.groups.clone(),
        order: p.order.clone(),
        plan,
        facts: p.facts.clone(),
    }
}

/// What [`check_step_locally`] found.
#[derive(Clone, Debug, Default)]
pub struct LocalReport {
    /// Kernel groups replayed.
    pub groups: usize,
    /// Stored values compared.
    pub values: usize,
    /// Elements excluded as within rounding of a kink (over all values).
    pub excluded: usize,
    /// One line per value that does not match.
    pub failures: Vec<String>,
    /// The largest `error / allowed` ratios, with the value they belong to.
    pub worst: Vec<(f64, String)>,
    /// Elements a 16-bit format stored as infinities because their value lies beyond its
    /// range ([`Numerics::max_finite`]).
    pub overflowed: usize,
    /// Per value compared, its rounding allowance relative to its size: `2·‖bound‖` (the
    /// replay's per-element rounding bounds, plus the stored value's rounding) over the norm
    /// of the reference value (of the update, for an `Assign`). Above 1 the value is zero but
    /// for rounding (a sum that cancels).
    pub relative_rounding: HashMap<Value, f64>,
    /// Per buffer an `Assign` updates, the largest relative rounding (capped at 1) of the
    /// values its update reads: how much of the update may be rounding of its operands (the
    /// gradient).
    pub operand_rounding: HashMap<Value, f64>,
}

impl LocalReport {
    /// A summary line and the few largest ratios (printed by the tests).
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} groups, {} values compared, {} elements within rounding of a kink excluded",
            self.groups, self.values, self.excluded
        );
        if self.overflowed > 0 {
            s.push_str(&format!(", {} beyond the 16-bit format's range", self.overflowed));
        }
        for (r, what) in self.worst.iter().take(3) {
            s.push_str(&format!("\n    error/allowed {r:.2e}  {what}"));
        }
        s
    }
}

/// Checks one step that `be` has just run on `program` (whose plan must keep every value,
/// [`keep_every_value`]) from the leaf values `leaves` (every `Input`, `Param` and `State` the
/// step read, as uploaded). Every kernel group is replayed in the interpreter on the values
/// the device read, and each value it stored is compared with the replay (see the module
/// doc); an `Assign` is compared through its target's buffer as an update (`new − old`).
///
/// # Errors
/// A download or replay that fails (not a mismatch: those are in the report).
pub fn check_step_locally(
    program: &Program,
    be: &mut dyn Backend,
    leaves: &HashMap<Value, Tensor>,
) -> Result<LocalReport, String> {
    check_step_locally_with(program, be, leaves, Numerics::default())
}

/// The rounding a back end adds beyond f32 arithmetic (`precision = tf32 | bf16 | fp16`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Numerics {
    /// Unit roundoff of a contraction's operands (TF32 tensor cores: 2⁻¹¹; 0 for fp32 FMA):
    /// an output element may move by `2·u·Σ|a||b|` over its terms.
    pub operand: f64,
    /// Unit roundoff of a value stored in 16 bits (bf16: 2⁻⁸, fp16: 2⁻¹¹): each element of
    /// such a value may move by `u·|x|` when it is stored.
    pub store: f64,
    /// The largest finite value of the 16-bit format (fp16: 65504; 0: no limit): an element
    /// whose reference lies beyond it is stored as an infinity, which is the format's
    /// behaviour (under loss scaling the step is then skipped), not a kernel's error.
    pub max_finite: f64,
}

/// [`check_step_locally`] with the extra rounding of `numerics` in every allowed bound: a
/// kernel's output must still match its replay on the device's own operands (so rounding of
/// earlier kernels, and decisions they took, cannot add up), within what its format allows.
pub fn check_step_locally_with(
    program: &Program,
    be: &mut dyn Backend,
    leaves: &HashMap<Value, Tensor>,
    numerics: Numerics,
) -> Result<LocalReport, String> {
    let g = &program.graph;
    let mut device = DeviceValues { be, leaves, batch: program.plan.batch, cache: HashMap::new() };
    let mut report = LocalReport::default();
    for group in program.scheduled() {
        if group.kind == GroupKind::View {
            continue;
        }
        let mut operands = HashMap::new();
        for &i in &group.inputs {
            operands.insert(i, device.read(g, i)?);
        }
        // Leaves the group touches without listing them as inputs (an `Assign`'s target).
        for &h in &group.nodes {
            for &i in &g.node(h).inputs {
                if is_memory_leaf(&g.node(i).op) && !operands.contains_key(&i) {
                    operands.insert(i, device.read(g, i)?);
                }
            }
        }
        let replay = replay_group(g, program.plan.batch, &group.nodes, &operands)
            .map_err(|e| format!("replaying the group of {}: {e}", describe(g, group.nodes[0])))?;
        report.groups += 1;
        // Σ|a||b| of a contraction group's product: the same contraction of the operands'
        // magnitudes.
        let magnitudes = if numerics.operand > 0.0 && group.kind == GroupKind::Contraction {
            let abs: HashMap<Value, Tensor> = operands.iter().map(|(&v, t)| (v, magnitude(t))).collect();
            Some(
                replay_group(g, program.plan.batch, &group.nodes, &abs)
                    .map_err(|e| format!("replaying magnitudes of {}: {e}", describe(g, group.nodes[0])))?,
            )
        } else {
            None
        };
        for &o in &group.outputs {
            let mut got = device.written(g, o)?;
            if numerics.max_finite > 0.0 && g.storage(o).is_half() {
                if let Some(want) = replay.values.get(&o) {
                    report.overflowed += overflow_to_reference(&mut got, want, numerics.max_finite);
                }
            }
            let old = match g.node(o).op {
                Op::Assign => Some(&operands[&g.node(o).inputs[0]]),
                _ => None,
            };
            let mut extra: Vec<f64> = Vec::new();
            if let Some(m) = magnitudes.as_ref().and_then(|m| m.values.get(&o)) {
                extra = m.to_complex_vec().iter().map(|z| 2.0 * numerics.operand * z.norm()).collect();
            }
            // Attention on tensor cores: its products' operand rounding, propagated through
            // the softmax ([`crate::attention::tensor_core_bound`]), on the operands the device
            // read (a fused forward's log-sum-exp as its replay computed it).
            if numerics.operand > 0.0 && group.kind == GroupKind::Attention {
                let node = g.node(o);
                let ins = node
                    .inputs
                    .iter()
                    .map(|i| operands.get(i).or_else(|| replay.values.get(i)))
                    .collect::<Option<Vec<&Tensor>>>()
                    .ok_or_else(|| {
                        format!("{}: an attention operand was neither read nor replayed", describe(g, o))
                    })?;
                extra = crate::attention::tensor_core_bound(&node.op, &ins, numerics.operand)
                    .map_err(|e| format!("{}: {e}", describe(g, o)))?;
            }
            if g.storage(o).is_half() {
                let w = replay.values.get(&o).map(|t| t.to_complex_vec()).unwrap_or_default();
                extra.resize(w.len(), 0.0);
                for (e, z) in extra.iter_mut().zip(&w) {
                    *e += numerics.store * z.norm();
                }
            }
            let mut c = compare_value(&replay, o, &got, old, &extra)?;
            if let (Some(f), true) = (&mut c.failure, c.excluded > 0) {
                let decisions: Vec<String> = group
                    .nodes
                    .iter()
                    .filter(|&&v| discontinuous(&g.node(v).op))
                    .map(|&v| format!("{v} = {}({})", g.node(v).op.mnemonic(), operand_list(g, v)))
                    .collect();
                f.push_str(&format!("; decisions in its kernel: {}", decisions.join(", ")));
            }
            report.values += 1;
            report.excluded += c.excluded;
            report.relative_rounding.insert(o, c.relative_rounding);
            if let Op::Assign = g.node(o).op {
                // (An operand read through a reshape is its source's value.)
                let source = |mut i: Value| {
                    while let Op::Reshape = g.node(i).op {
                        i = g.node(i).inputs[0];
                    }
                    i
                };
                let of_operands = group
                    .inputs
                    .iter()
                    .filter_map(|&i| report.relative_rounding.get(&source(i)))
                    .fold(0.0f64, |m, &r| m.max(r.min(1.0)));
                report.operand_rounding.insert(g.node(o).inputs[0], of_operands);
            }
            report.worst.push((c.ratio, describe(g, o)));
            if let Some(why) = c.failure {
                report.failures.push(format!("{}: {why}", describe(g, o)));
            }
        }
    }
    report.worst.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
    report.worst.truncate(8);
    Ok(report)
}

/// `v = mnemonic [label]`, for messages.
pub fn describe(g: &Graph, v: Value) -> String {
    let n = g.node(v);
    format!("{v} = {} [{}]", n.op.mnemonic(), n.origin.label)
}

fn operand_list(g: &Graph, v: Value) -> String {
    g.node(v)
        .inputs
        .iter()
        .map(|i| format!("{i} {}", g.node(*i).op.mnemonic()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_memory_leaf(op: &Op) -> bool {
    matches!(op, Op::Input { .. } | Op::Param { .. } | Op::State { .. })
}

/// The values the device read and wrote, downloaded once each.
struct DeviceValues<'a> {
    be: &'a mut dyn Backend,
    leaves: &'a HashMap<Value, Tensor>,
    batch: usize,
    cache: HashMap<Value, Tensor>,
}

impl DeviceValues<'_> {
    /// What a group read as `v`: leaves (and views of them) as uploaded before the step,
    /// since an `Assign` overwrites them later in the step; anything else as stored.
    fn read(&mut self, g: &Graph, v: Value) -> Result<Tensor, String> {
        let root = storage_root(g, v);
        if is_memory_leaf(&g.node(root).op) && !matches!(g.node(v).op, Op::Assign) {
            let t = self
                .leaves
                .get(&root)
                .ok_or_else(|| format!("no value given for leaf {}", describe(g, root)))?;
            return Ok(Tensor { shape: g.ty(v).shape.resolve(self.batch), data: t.data.clone() });
        }
        self.written(g, v)
    }

    /// The content of `v`'s buffer after the step (an `Assign`: its target's new value).
    fn written(&mut self, g: &Graph, v: Value) -> Result<Tensor, String> {
        if let Some(t) = self.cache.get(&v) {
            return Ok(t.clone());
        }
        let read = if matches!(g.node(v).op, Op::Assign) { storage_root(g, v) } else { v };
        let h = self.be.download(read).map_err(|e| format!("download {}: {}", describe(g, v), e.0))?;
        let mut t = from_host(&h);
        if matches!(g.node(v).op, Op::Assign) {
            // The target's buffer, in the assign's shape (they agree up to views).
            t.shape = g.ty(v).shape.resolve(self.batch);
        }
        self.cache.insert(v, t.clone());
        Ok(t)
    }
}

/// Replaces the non-finite parts of `got` whose reference part lies beyond `max` (what a
/// format of that range stores as an infinity) by the reference; returns how many.
fn overflow_to_reference(got: &mut Tensor, want: &Tensor, max: f64) -> usize {
    let mut n = 0;
    let mut fix = |g: &mut f64, w: f64| {
        if !g.is_finite() && w.abs() >= max * (1.0 - 1e-3) {
            *g = w;
            n += 1;
        }
    };
    match (&mut got.data, &want.data) {
        (TensorData::Real(a), TensorData::Real(b)) => a.iter_mut().zip(b).for_each(|(g, &w)| fix(g, w)),
        (TensorData::Complex(a), TensorData::Complex(b)) => a.iter_mut().zip(b).for_each(|(g, w)| {
            fix(&mut g.re, w.re);
            fix(&mut g.im, w.im);
        }),
        _ => {}
    }
    n
}

/// `t` with every element replaced by its magnitude (same dtype; complex values as their
/// modulus): a contraction replayed on these gives `Σ|a||b|` per output element.
pub fn magnitude(t: &Tensor) -> Tensor {
    match &t.data {
        TensorData::Real(v) => Tensor::real(&t.shape, v.iter().map(|x| x.abs()).collect()),
        TensorData::Complex(v) => {
            Tensor::complex(&t.shape, v.iter().map(|z| Complex64::new(z.norm(), 0.0)).collect())
        }
        TensorData::Int(v) => Tensor::int(&t.shape, v.clone()),
    }
}

/// The verdict on one stored value.
struct Compared {
    ratio: f64,
    excluded: usize,
    failure: Option<String>,
    /// The rounding part of the allowed difference (`2·‖bound‖` plus the stored rounding)
    /// over the norm of the reference value or update.
    relative_rounding: f64,
}

/// Compares the device's `got` for `v` with the replay: `‖got − ref‖ ≤ TOL·‖scale‖ +
/// 2·‖bound‖` over the elements not excluded, where `scale` is the reference value, or for an
/// `Assign` (with the target's `old` value) the update `ref − old`, plus the f32 rounding of
/// the stored value.
fn compare_value(
    replay: &GroupReplay,
    v: Value,
    got: &Tensor,
    old: Option<&Tensor>,
    extra: &[f64],
) -> Result<Compared, String> {
    let want = replay.values.get(&v).ok_or_else(|| format!("the replay made no value for {v}"))?;
    let fail = |why: String| {
        Ok(Compared { ratio: f64::INFINITY, excluded: 0, failure: Some(why), relative_rounding: 0.0 })
    };
    if got.shape != want.shape || got.dtype() != want.dtype() {
        return fail(format!(
            "device value is {}{:?}, reference {}{:?}",
            got.dtype(),
            got.shape,
            want.dtype(),
            want.shape
        ));
    }
    if let (Some(a), Some(b)) = (got.as_int(), want.as_int()) {
        let wrong = a.iter().zip(b).filter(|(x, y)| x != y).count();
        return if wrong == 0 {
            Ok(Compared { ratio: 0.0, excluded: 0, failure: None, relative_rounding: 0.0 })
        } else {
            fail(format!("{wrong} of {} integers differ", a.len()))
        };
    }
    let (a, b) = (got.to_complex_vec(), want.to_complex_vec());
    let base = old.map(|o| o.to_complex_vec());
    let bound = &replay.error_bound[&v];
    let mask = replay.uncertain.get(&v);
    let (mut d2, mut s2, mut e2, mut w2, mut excluded) = (0.0, 0.0, 0.0, 0.0, 0);
    for i in 0..a.len() {
        if mask.is_some_and(|m| m[i]) {
            excluded += 1;
            continue;
        }
        if !b[i].re.is_finite() || !b[i].im.is_finite() {
            if a[i].re.is_finite() && a[i].im.is_finite() {
                return fail(format!("element {i}: device {} where the reference is {}", a[i], b[i]));
            }
            continue;
        }
        d2 += (a[i] - b[i]).norm_sqr();
        let s = base.as_ref().map_or(b[i], |o| b[i] - o[i]);
        s2 += s.norm_sqr();
        w2 += b[i].norm_sqr();
        // The format's own rounding (`extra`) is a bound as the replay's is: added per element.
        let e = bound[i] + extra.get(i).copied().unwrap_or(0.0);
        e2 += e * e;
    }
    let stored = if old.is_some() { 2.0 * ROUNDING * w2.sqrt() } else { 0.0 };
    let rounding = 2.0 * e2.sqrt() + stored;
    let relative_rounding = if rounding == 0.0 { 0.0 } else { rounding / s2.sqrt() };
    let allowed = TOL * s2.sqrt() + rounding;
    let d = d2.sqrt();
    let ratio = if d == 0.0 { 0.0 } else { d / allowed };
    let limit = EXCLUDED_MIN.max((EXCLUDED_FRACTION * a.len() as f64) as usize);
    let failure = if d.is_nan() || ratio > 1.0 {
        let what = if old.is_some() { "update" } else { "value" };
        Some(format!(
            "‖device − reference‖ = {d:.3e} > allowed {allowed:.3e} ({what} norm {:.3e}, {} elements, {excluded} excluded)",
            s2.sqrt(),
            a.len()
        ))
    } else if excluded > limit {
        Some(format!("{excluded} of {} elements within rounding of a kink (more than {limit}): the check would be void", a.len()))
    } else {
        None
    };
    Ok(Compared { ratio, excluded, failure, relative_rounding })
}

/// Whether an op's value jumps (not merely bends) at some input: a decision that f32 and f64
/// may take differently near its threshold.
pub fn discontinuous(op: &Op) -> bool {
    match op {
        Op::Unary(u) => matches!(u, UnaryOp::Step | UnaryOp::Angle),
        Op::Binary(b) => matches!(b, BinaryOp::Greater | BinaryOp::Equal),
        Op::Select => true,
        Op::Reduce { op, .. } => *op == ReduceOp::MaxMag,
        _ => false,
    }
}

/// Whether none of `values` depends on a [`discontinuous`] op: then an end-to-end comparison
/// from the same leaves is meaningful (continuous kinks like relu move values by rounding).
pub fn continuous_ancestry(g: &Graph, values: &[Value]) -> bool {
    let mut seen = vec![false; g.nodes.len()];
    let mut stack: Vec<Value> = values.to_vec();
    while let Some(v) = stack.pop() {
        if std::mem::replace(&mut seen[v.index()], true) {
            continue;
        }
        if discontinuous(&g.node(v).op) {
            return false;
        }
        stack.extend(g.node(v).inputs.iter().copied());
    }
    true
}

/// Makes a back end for a program (the CPU's or the GPU's constructor).
pub type MakeBackend<'a> = &'a dyn Fn(&Program) -> Result<Box<dyn Backend>, String>;

/// Runs `steps` training steps of `program` on two back ends made by `make`: one with the
/// program's own memory plan and one with [`keep_every_value`]. Every step of the second is
/// checked group by group ([`check_step_locally`]); on the first step its outputs and loss are
/// also compared end to end with the interpreter when [`continuous_ancestry`] allows; after
/// every step the outputs and loss of the two back ends must agree to `plan_tol` relative to
/// their size, and every persistent buffer to `plan_tol` relative to the step's update of it
/// (0: bitwise, for a deterministic back end; a GPU whose split-K contractions add with
/// atomics in varying order needs room for a kink flip between its own two runs, which moves
/// a batchnorm's gradients by ~1e-3..1e-2 of their size, while a clobbered buffer is off by
/// its whole size). With `plan_tol` above 0 a buffer may also differ by twice the part of its
/// update that may be the rounding of the update's operands
/// ([`LocalReport::operand_rounding`]): all of it for a gradient that is zero but for
/// rounding, nothing to speak of for any other. Returns the mismatches; prints a summary per
/// step.
pub fn check_training_steps(
    program: &Program,
    make: MakeBackend,
    steps: usize,
    plan_tol: f64,
    rng: &mut SplitMix64,
) -> Result<Vec<String>, String> {
    check_training_steps_with(program, make, steps, plan_tol, rng, Numerics::default(), TOL)
}

/// [`check_training_steps`] for a back end with the extra rounding of `numerics` (local
/// checks: [`check_step_locally_with`]) and end-to-end outputs within `end_tol` relative.
pub fn check_training_steps_with(
    program: &Program,
    make: MakeBackend,
    steps: usize,
    plan_tol: f64,
    rng: &mut SplitMix64,
    numerics: Numerics,
    end_tol: f64,
) -> Result<Vec<String>, String> {
    let g = &program.graph;
    let batch = program.plan.batch;
    let kept = keep_every_value(program);
    let mut be_kept = make(&kept)?;
    let mut be_real = make(program)?;
    let mut leaves = random_leaves(g, batch, rng);
    let mut failures = Vec::new();
    for step in 0..steps {
        if step > 0 {
            leaves.extend(random_inputs(g, batch, rng));
            for v in g.persistent() {
                if kept.plan.slot(v).is_some() {
                    let h =
                        be_kept.download(v).map_err(|e| format!("download {}: {}", describe(g, v), e.0))?;
                    leaves.insert(v, from_host(&h));
                }
            }
        }
        for (be, p) in [(&mut be_kept, &kept), (&mut be_real, program)] {
            for (&v, t) in &leaves {
                // After the first step the back end keeps its own parameters and state.
                let fresh = step == 0 || matches!(g.node(v).op, Op::Input { .. });
                if fresh && p.plan.slot(v).is_some() {
                    be.upload(v, &to_host(t)).map_err(|e| format!("upload {}: {}", describe(g, v), e.0))?;
                }
            }
            be.step().map_err(|e| format!("step {step}: {}", e.0))?;
        }
        let mut local = check_step_locally_with(&kept, be_kept.as_mut(), &leaves, numerics)?;
        println!("{} step {step}: {}", g.name, local.summary());
        failures.extend(local.failures.drain(..).map(|f| format!("step {step}: {f}")));
        let mut ends: Vec<(String, Value)> =
            g.outputs.iter().map(|o| (format!("output {}", o.name), o.value)).collect();
        if let Some(l) = g.loss {
            ends.push(("loss".into(), l));
        }
        let ends: Vec<(String, Value)> =
            ends.into_iter().filter(|(_, v)| kept.plan.slot(*v).is_some()).collect();
        let end_values: Vec<Value> = ends.iter().map(|e| e.1).collect();
        if step == 0 && continuous_ancestry(g, &end_values) {
            let want = evaluate(g, batch, &leaves)?;
            for (what, v) in &ends {
                let got = from_host(&be_kept.download(*v).map_err(|e| e.0)?);
                let w = want[v.index()].as_ref().ok_or("the interpreter made no value")?;
                let e = rel_err(&got, w);
                println!("    end to end: {what} {e:.2e}");
                if e.is_nan() || e > end_tol {
                    failures.push(format!("step 0: {what} end to end: relative error {e:.2e}"));
                }
            }
        }
        // The reusing plan computes what the keep-everything plan computes. Outputs and loss
        // relative to their size, buffers relative to this step's update of them, plus twice
        // the part of the update that may be its operands' rounding: the plan decides which
        // kernels join (a join that would overwrite an operand in the reusing plan is refused),
        // so the two plans may sum in different orders, and an update whose gradient is zero
        // but for rounding (the bias of a convolution right before a batchnorm) then differs by
        // as much as it measures.
        let mut compared: Vec<(String, Value, Option<&Tensor>)> =
            ends.iter().map(|(w, v)| (w.clone(), *v, None)).collect();
        for v in g.persistent() {
            if program.plan.slot(v).is_some() && kept.plan.slot(v).is_some() {
                compared.push((format!("buffer {}", g.leaf_name(v).unwrap_or("?")), v, leaves.get(&v)));
            }
        }
        for (what, v, old) in compared {
            if program.plan.slot(v).is_none() {
                continue;
            }
            let a = from_host(&be_real.download(v).map_err(|e| e.0)?);
            let b = from_host(&be_kept.download(v).map_err(|e| e.0)?);
            if a == b {
                continue;
            }
            let d = rel_err(&a, &b) * norm(&b);
            let scale = match old {
                Some(o) => norm_diff(&b, o) + 4.0 * ROUNDING * norm(&b),
                None => norm(&b),
            };
            // (A `plan_tol` of 0 asks for identical results: no allowance then.)
            let rounding = match old {
                Some(o) if plan_tol > 0.0 => {
                    2.0 * local.operand_rounding.get(&v).copied().unwrap_or(0.0) * norm_diff(&b, o)
                }
                _ => 0.0,
            };
            if d.is_nan() || d > plan_tol * scale + rounding {
                failures.push(format!(
                    "step {step}: {what}: the program's memory plan differs from the keep-everything plan by {d:.2e} (allowed {plan_tol:.0e} of {scale:.2e} + rounding {rounding:.2e})"
                ));
            }
        }
    }
    Ok(failures)
}

fn norm(t: &Tensor) -> f64 {
    t.to_complex_vec().iter().map(|z| z.norm_sqr()).sum::<f64>().sqrt()
}

fn norm_diff(a: &Tensor, b: &Tensor) -> f64 {
    a.to_complex_vec().iter().zip(b.to_complex_vec()).map(|(p, q)| (p - q).norm_sqr()).sum::<f64>().sqrt()
}

/// `‖a − b‖ / ‖b‖` (absolute when `b` is zero; infinite when shapes differ or `a` has NaNs
/// that `b` does not).
pub fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    if a.shape != b.shape {
        return f64::INFINITY;
    }
    let (x, y) = (a.to_complex_vec(), b.to_complex_vec());
    let mut d = 0.0;
    let mut n = 0.0;
    for (p, q) in x.iter().zip(&y) {
        if p.is_nan() && q.is_nan() {
            continue;
        }
        d += (p - q).norm_sqr();
        n += q.norm_sqr();
    }
    if d == 0.0 {
        0.0
    } else if n == 0.0 {
        d.sqrt()
    } else {
        (d / n).sqrt()
    }
}
