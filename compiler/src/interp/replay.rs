//! Group-local replay: one kernel group evaluated on given operand values (a device's), with a
//! first-order bound on the f32 rounding of every element and the elements whose value hangs
//! on a branch taken within that rounding of its threshold (a kink).
//!
//! Comparing a back end with the interpreter end to end fails legitimately when an activation
//! input lands within f32 rounding of its kink: the device and the f64 interpreter take
//! different sides, and batchnorm spreads the difference to every upstream gradient. Replaying
//! each group on the device's own inputs stops that propagation (the interpreter follows the
//! device's decisions at group boundaries); inside one group, [`GroupReplay::uncertain`] names
//! the few elements whose f32 evaluation may branch the other way, so a comparison excludes
//! exactly those and nothing else.
//!
//! The error model assumes each elementwise op of the device rounds its result with a relative
//! error of at most [`ROUNDING`] (transcendental functions [`ROUNDING_FN`]) and propagates
//! operand errors to first order. Operands supplied from outside the group are exact (they are
//! what the device read). Contractions, transforms and movement only read exact operands in a
//! fused program; their own rounding is left to the caller's relative tolerance.

use super::eval::evaluate;
use super::layout::broadcast_map;
use super::tensor::Tensor;
use crate::ir::*;
use num_complex::Complex64;
use std::collections::HashMap;

/// Relative rounding error of one f32 arithmetic op (`+ − × ÷`, √): one ulp, doubled to
/// cover a complex product's or quotient's several roundings.
pub const ROUNDING: f64 = 2.0 * f32::EPSILON as f64;

/// Relative error of one f32 transcendental function (`exp`, `tanh`, ...) on a device: a few
/// ulps (CUDA's and libm's single-precision functions are accurate to 1-4 ulps).
pub const ROUNDING_FN: f64 = 8.0 * f32::EPSILON as f64;

/// A decision (step, comparison, select, largest magnitude) is uncertain when its margin is
/// within this multiple of the error bound of its operands.
pub const KINK_MARGIN: f64 = 4.0;

/// The values of one group's nodes recomputed in f64, with their rounding model.
#[derive(Clone, Debug, Default)]
pub struct GroupReplay {
    /// The value of every node of the group, by its handle in the original graph.
    pub values: HashMap<Value, Tensor>,
    /// Per node, a first-order bound on `|f32 evaluation − exact value|` of each element.
    pub error_bound: HashMap<Value, Vec<f64>>,
    /// Per node, the elements whose value depends on a decision taken within rounding of its
    /// threshold (absent when no element does).
    pub uncertain: HashMap<Value, Vec<bool>>,
}

/// Evaluates the group `nodes` (operands before users, as a kernel group lists them) of `g` at
/// `batch`, reading every operand computed outside the group from `operands`. `Scalar`
/// operands that are not listed are evaluated inline, as kernels inline them.
///
/// # Errors
/// An operand neither in the group, in `operands`, nor a scalar; or an interpreter error.
pub fn replay_group(
    g: &Graph,
    batch: usize,
    nodes: &[Value],
    operands: &HashMap<Value, Tensor>,
) -> Result<GroupReplay, String> {
    let mut snapped = HashMap::new();
    let (sub, vals, mut bounds, mut masks) = loop {
        let sub = SubGraph::build(g, nodes, operands, &snapped)?;
        let vals = evaluate(&sub.graph, batch, &sub.leaves)?;
        let (bounds, masks, snaps) = analyse(&sub, &vals)?;
        if snaps.is_empty() || !snapped.is_empty() {
            break (sub, vals, bounds, masks);
        }
        snapped = snaps;
    };
    let mut replay = GroupReplay::default();
    for (h, _) in sub.graph.nodes.iter() {
        let orig = sub.original[h.index()];
        if sub.is_operand[h.index()] {
            continue;
        }
        let t = vals[h.index()].clone().ok_or_else(|| format!("{orig} was not computed"))?;
        replay.values.insert(orig, t);
        replay.error_bound.insert(orig, std::mem::take(&mut bounds[h.index()]));
        if let Some(m) = masks[h.index()].take() {
            replay.uncertain.insert(orig, m);
        }
    }
    Ok(replay)
}

/// Per-element error bounds, uncertain elements, and the `Equal` operands to snap: an
/// `Equal(a, b)` whose operands are within rounding of each other compares a value that the
/// kernel recomputes with a stored copy of the same computation (max pooling's backward
/// compares the recomputed input with the stored maximum), which the device evaluates bitwise
/// alike. The replay then takes them as equal, as the device does, by re-evaluating the group
/// with `a` replaced there by `b` (a near-tie of two different candidates is the one case this
/// misjudges: two inputs within ~1e-6 of each other, relative).
#[allow(clippy::type_complexity)]
fn analyse(
    sub: &SubGraph,
    vals: &[Option<Tensor>],
) -> Result<(Vec<Vec<f64>>, Vec<Option<Vec<bool>>>, HashMap<Value, Tensor>), String> {
    let mut bounds: Vec<Vec<f64>> = Vec::with_capacity(sub.graph.nodes.len());
    let mut masks: Vec<Option<Vec<bool>>> = Vec::with_capacity(sub.graph.nodes.len());
    let mut snaps = HashMap::new();
    for (h, node) in sub.graph.nodes.iter() {
        let value = |v: Value| vals[v.index()].as_ref().ok_or_else(|| format!("{v} was not computed"));
        let out = value(h)?;
        let ins: Vec<Operand> = node
            .inputs
            .iter()
            .map(|&i| {
                Ok(Operand { value: value(i)?, bound: &bounds[i.index()], mask: masks[i.index()].as_deref() })
            })
            .collect::<Result<_, String>>()?;
        let (bound, mut mask) = rounding_of(&node.op, &ins, out)
            .map_err(|e| format!("{} ({}): {e}", sub.original[h.index()], node.op.mnemonic()))?;
        if let (Op::Binary(BinaryOp::Equal), Some(m)) = (&node.op, &mask) {
            // Equal's uncertain elements are snapped (see above), not excluded.
            let (a, b) = (Spread::new(&ins[0], &out.shape)?, Spread::new(&ins[1], &out.shape)?);
            let mut v = a.value.clone();
            for i in 0..v.len() {
                if m[i] && a.mask.as_ref().is_none_or(|am| !am[i]) && b.mask.as_ref().is_none_or(|bm| !bm[i])
                {
                    v[i] = Complex64::new(b.value[i].re, v[i].im);
                }
            }
            let data = v.iter().map(|z| z.re).collect();
            snaps.insert(sub.original[h.index()], Tensor::real(&out.shape, data));
            mask = merge(a.mask.clone(), b.mask.as_deref());
        }
        bounds.push(bound);
        masks.push(mask);
    }
    Ok((bounds, masks, snaps))
}

/// The group as a graph of its own: operands become `Input` leaves.
struct SubGraph {
    graph: Graph,
    leaves: HashMap<Value, Tensor>,
    /// The original handle of each sub-graph node.
    original: Vec<Value>,
    /// Whether a sub-graph node stands for an operand read from outside the group.
    is_operand: Vec<bool>,
}

impl SubGraph {
    /// `snapped`: `Equal` nodes whose first operand is replaced by the given tensor.
    fn build(
        g: &Graph,
        nodes: &[Value],
        operands: &HashMap<Value, Tensor>,
        snapped: &HashMap<Value, Tensor>,
    ) -> Result<SubGraph, String> {
        let mut s = SubGraph {
            graph: Graph::new(&g.name, g.mode),
            leaves: HashMap::new(),
            original: Vec::new(),
            is_operand: Vec::new(),
        };
        let mut map: HashMap<Value, Value> = HashMap::new();
        for &h in nodes {
            let node = g.node(h);
            let mut inputs = Vec::with_capacity(node.inputs.len());
            for &i in &node.inputs {
                if let Some(&m) = map.get(&i) {
                    inputs.push(m);
                    continue;
                }
                let m = if let Some(t) = operands.get(&i) {
                    let leaf = Node {
                        op: Op::Input { name: format!("operand {i}") },
                        inputs: Vec::new(),
                        ty: g.ty(i).clone(),
                        origin: g.node(i).origin.clone(),
                    };
                    let m = s.push(leaf, g.span(i), i, true);
                    s.leaves.insert(m, t.clone());
                    m
                } else if matches!(g.node(i).op, Op::Scalar { .. }) {
                    s.push(g.node(i).clone(), g.span(i), i, true)
                } else {
                    return Err(format!("{h} reads {i}, which is neither in its group nor given"));
                };
                map.insert(i, m);
                inputs.push(m);
            }
            if let Some(t) = snapped.get(&h) {
                let leaf = Node {
                    op: Op::Input { name: format!("snapped operand of {h}") },
                    inputs: Vec::new(),
                    ty: TensorType::new(g.ty(node.inputs[0]).dtype, node.ty.shape.clone()),
                    origin: node.origin.clone(),
                };
                let m = s.push(leaf, g.span(h), node.inputs[0], true);
                s.leaves.insert(m, t.clone());
                inputs[0] = m;
            }
            let copy = Node { inputs, ..node.clone() };
            let m = s.push(copy, g.span(h), h, false);
            map.insert(h, m);
        }
        Ok(s)
    }

    fn push(&mut self, node: Node, span: cvc_grammar::Span, original: Value, operand: bool) -> Value {
        self.original.push(original);
        self.is_operand.push(operand);
        self.graph.nodes.append(node, span)
    }
}

/// An operand of a node during the rounding analysis.
struct Operand<'a> {
    value: &'a Tensor,
    bound: &'a [f64],
    mask: Option<&'a [bool]>,
}

impl Operand<'_> {
    /// Whether every element is exact (read from outside the group, or computed exactly).
    fn exact(&self) -> bool {
        self.bound.iter().all(|&e| e == 0.0)
    }
}

/// The error bound and the uncertain elements of one node's value `out`, from its operands.
fn rounding_of(op: &Op, ins: &[Operand], out: &Tensor) -> Result<(Vec<f64>, Option<Vec<bool>>), String> {
    let n = out.numel();
    let mag: Vec<f64> = out.to_complex_vec().iter().map(|z| z.norm()).collect();
    // Operands broadcast to the output's shape (elementwise ops).
    let spread = |k: usize| -> Result<Spread, String> { Spread::new(&ins[k], &out.shape) };
    let exact = || (vec![0.0; n], None);
    Ok(match op {
        Op::Input { .. } | Op::Param { .. } | Op::State { .. } => exact(),
        // A scalar constant rounds once to f32.
        Op::Scalar { .. } => (mag.iter().map(|m| ROUNDING * m).collect(), None),
        Op::Unary(u) => {
            let x = spread(0)?;
            let mut bound = Vec::with_capacity(n);
            let mut mask = x.mask.clone();
            for (i, &o) in mag.iter().enumerate() {
                let (z, e) = (x.value[i], x.bound[i]);
                let a = z.norm();
                let (b, kink) = unary_bound(*u, z, a, e, o);
                bound.push(b);
                if kink {
                    mask.get_or_insert_with(|| vec![false; n])[i] = true;
                }
            }
            (bound, mask)
        }
        Op::Binary(b) => {
            let (x, y) = (spread(0)?, spread(1)?);
            let mut mask = merge(x.mask.clone(), y.mask.as_deref());
            let mut bound = Vec::with_capacity(n);
            for (i, &o) in mag.iter().enumerate() {
                let (p, q) = (x.value[i], y.value[i]);
                let (ep, eq) = (x.bound[i], y.bound[i]);
                let (bd, kink) = binary_bound(*b, p, q, ep, eq, o);
                bound.push(bd);
                if kink {
                    mask.get_or_insert_with(|| vec![false; n])[i] = true;
                }
            }
            (bound, mask)
        }
        Op::Select => {
            let (c, x, y) = (spread(0)?, spread(1)?, spread(2)?);
            let mut mask = merge(merge(c.mask.clone(), x.mask.as_deref()), y.mask.as_deref());
            let mut bound = Vec::with_capacity(n);
            for i in 0..n {
                let cond = c.value[i].re;
                bound.push(if cond > 0.0 { x.bound[i] } else { y.bound[i] });
                if decision_uncertain(cond, c.bound[i]) {
                    mask.get_or_insert_with(|| vec![false; n])[i] = true;
                }
            }
            (bound, mask)
        }
        Op::Reduce { op: r, .. } => reduce_bound(*r, &ins[0], out)?,
        Op::Reshape => (ins[0].bound.to_vec(), ins[0].mask.map(<[bool]>::to_vec)),
        Op::Assign => (ins[1].bound.to_vec(), ins[1].mask.map(<[bool]>::to_vec)),
        Op::OneHot { .. } | Op::DropoutMask { .. } => exact(),
        // Data movement copies elements: exact operands give an exact result. Kernel groups
        // never move inexact values (movement is a group of its own); should one, every
        // element is taken as bounded by the worst operand error and uncertain when any is.
        Op::Expand
        | Op::Permute { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Concat { .. }
        | Op::Gather
        | Op::ScatterAdd { .. }
        | Op::MatMul { .. }
        | Op::Conv2d { .. }
        | Op::ConvTranspose2d { .. }
        | Op::Conv2dWeightGrad { .. }
        | Op::AttnLse { .. }
        | Op::Attention { .. }
        | Op::AttentionGrad { .. }
        | Op::Recurrence { .. }
        | Op::RecurrenceGrad { .. }
        | Op::Fft { .. } => {
            if ins.iter().all(|o| o.exact() && o.mask.is_none()) {
                // Contractions' and transforms' own rounding is relative to the result: the
                // caller's relative tolerance covers it.
                exact()
            } else if op.is_contraction()
                || matches!(op.class(), OpClass::Attention | OpClass::Recurrence)
                || matches!(op, Op::Fft { .. })
            {
                return Err("a contraction of values computed in the same kernel is not modelled".into());
            } else {
                let worst = ins.iter().flat_map(|o| o.bound.iter().copied()).fold(0.0, f64::max);
                let any = ins.iter().any(|o| o.mask.is_some_and(|m| m.iter().any(|&b| b)));
                (vec![worst; n], any.then(|| vec![true; n]))
            }
        }
    })
}

/// An operand broadcast to the output's shape.
struct Spread {
    value: Vec<Complex64>,
    bound: Vec<f64>,
    mask: Option<Vec<bool>>,
}

impl Spread {
    fn new(o: &Operand, to: &[usize]) -> Result<Spread, String> {
        let map = broadcast_map(&o.value.shape, to)?;
        let z = o.value.to_complex_vec();
        Ok(Spread {
            value: map.iter().map(|&i| z[i]).collect(),
            bound: map.iter().map(|&i| o.bound[i]).collect(),
            mask: o.mask.map(|m| map.iter().map(|&i| m[i]).collect()),
        })
    }
}

fn merge(a: Option<Vec<bool>>, b: Option<&[bool]>) -> Option<Vec<bool>> {
    match (a, b) {
        (Some(mut a), Some(b)) => {
            a.iter_mut().zip(b).for_each(|(x, &y)| *x |= y);
            Some(a)
        }
        (a, None) => a,
        (None, Some(b)) => Some(b.to_vec()),
    }
}

/// Whether the sign of `x` (known to within `e`) may differ in f32: `x` itself is within the
/// margin of 0. An exact operand (`e == 0`) is read identically by both sides.
/// An exact zero is taken as structural (the imaginary part of a real value cast to complex,
/// a difference of two copies): both sides compute it exactly, while a rounding error that
/// cancels to exactly 0.0 in f64 has probability zero on random inputs.
fn decision_uncertain(x: f64, e: f64) -> bool {
    e > 0.0 && x != 0.0 && x.abs() <= KINK_MARGIN * e
}

/// `(bound, uncertain)` of a unary op at one element: operand `z` (`|z| = a`) known to within
/// `e`, result magnitude `o`.
fn unary_bound(u: UnaryOp, z: Complex64, a: f64, e: f64, o: f64) -> (f64, bool) {
    use UnaryOp::*;
    // The error of f(x ± e) for an f with |f'| ≤ lipschitz on the interval.
    let lip = |l: f64| l * e + ROUNDING_FN * o;
    // Away from 0, the relative perturbation of the operand; near it, unbounded.
    let away = |f: &dyn Fn(f64) -> f64| if a > e { f(a - e) } else { f64::INFINITY };
    match u {
        Neg | Conj | Real | Imag | StopGrad | ToComplex | Relu => (e, false),
        Abs => (e + ROUNDING * o, false),
        Abs2 => (2.0 * a * e + e * e + ROUNDING * o, false),
        Angle => {
            // atan2 jumps from π to −π across the negative real axis, and is undefined at 0.
            let cut = z.re < 0.0 && decision_uncertain(z.im, e);
            let origin = decision_uncertain(a, e);
            (away(&|m| e / m) + ROUNDING_FN * o, cut || origin)
        }
        Exp => (o * e.exp_m1() + ROUNDING_FN * o, false),
        Log => (away(&|m| e / m) + ROUNDING_FN * o, false),
        Sqrt => (if a > 2.0 * e { e / (2.0 * (a - e).sqrt()) } else { e.sqrt() } + ROUNDING * o, false),
        Rsqrt => (away(&|m| 1.0 / m.sqrt() - 1.0 / a.sqrt()) + ROUNDING_FN * o, false),
        Recip => (away(&|m| e / (a * m)) + ROUNDING * o, false),
        Sin | Cos => (e + ROUNDING_FN, false),
        Tanh => (lip(1.0), false),
        Sigmoid => (lip(0.25), false),
        // |gelu'| ≤ 1.13 and |gelu''| ≤ 0.8; the device evaluates them through several ops,
        // each rounding relative to the operand's size.
        // (The same bounds hold for the exact form and the tanh approximation.)
        Gelu | GeluTanh => (lip(1.13) + ROUNDING_FN * a, false),
        GeluGrad | GeluTanhGrad => (lip(0.8) + ROUNDING_FN * (1.0 + a), false),
        Step => (0.0, decision_uncertain(z.re, e)),
    }
}

/// `(bound, uncertain)` of a binary op at one element: operands `p`, `q` known to within `ep`,
/// `eq`, result magnitude `o`.
fn binary_bound(b: BinaryOp, p: Complex64, q: Complex64, ep: f64, eq: f64, o: f64) -> (f64, bool) {
    use BinaryOp::*;
    let (a, c) = (p.norm(), q.norm());
    match b {
        Add | Sub => (ep + eq + ROUNDING * o, false),
        Mul => (a * eq + c * ep + ep * eq + ROUNDING * o, false),
        Div => {
            let d = if c > eq { (ep + o * eq) / (c - eq) } else { f64::INFINITY };
            (d + 2.0 * ROUNDING * o, false)
        }
        Max => (ep.max(eq), false),
        Complex => (ep + eq, false),
        Greater | Equal => (0.0, decision_uncertain(p.re - q.re, ep + eq)),
    }
}

/// `(bound, uncertain)` of a reduction: sums add their summands' bounds and an f32
/// accumulation error of `4·√n·ε·‖summands‖₂` per output (pairwise and f64-partial sums do
/// better; this is the accumulation the comparison must allow); max keeps the largest bound;
/// the largest magnitude is uncertain where another candidate of a different value is within
/// rounding of it.
fn reduce_bound(r: ReduceOp, x: &Operand, out: &Tensor) -> Result<(Vec<f64>, Option<Vec<bool>>), String> {
    let n = out.numel();
    let map = broadcast_map(&out.shape, &x.value.shape)?;
    let z = x.value.to_complex_vec();
    let mut mask: Option<Vec<bool>> = None;
    if let Some(m) = x.mask {
        for (&o, &b) in map.iter().zip(m) {
            if b {
                mask.get_or_insert_with(|| vec![false; n])[o] = true;
            }
        }
    }
    let mut bound = vec![0.0; n];
    match r {
        ReduceOp::Sum => {
            let mut sq = vec![0.0; n];
            let mut count = vec![0usize; n];
            for (k, &o) in map.iter().enumerate() {
                bound[o] += x.bound[k];
                sq[o] += z[k].norm_sqr();
                count[o] += 1;
            }
            for o in 0..n {
                bound[o] += 4.0 * (count[o] as f64).sqrt() * f32::EPSILON as f64 * sq[o].sqrt();
            }
        }
        ReduceOp::Max | ReduceOp::MaxMag => {
            for (k, &o) in map.iter().enumerate() {
                bound[o] = f64::max(bound[o], x.bound[k]);
            }
        }
    }
    if r == ReduceOp::MaxMag {
        let best: Vec<Complex64> = out.to_complex_vec();
        for (k, &o) in map.iter().enumerate() {
            let gap = best[o].norm() - z[k].norm();
            // Magnitudes are known to within the bounds; the candidates must also differ.
            let e = bound[o] + x.bound[k];
            if e > 0.0 && gap.abs() <= KINK_MARGIN * e && (best[o] - z[k]).norm() > e {
                mask.get_or_insert_with(|| vec![false; n])[o] = true;
            }
        }
    }
    Ok((bound, mask))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::builder::Builder;

    fn input(b: &mut Builder, name: &str, dims: &[usize]) -> Value {
        b.leaf(Op::Input { name: name.into() }, TensorType::new(DType::F32, Shape::fixed(dims)))
    }

    /// `step(x·s − t)` for `x·s` within rounding of `t` is uncertain; far from it, or for a
    /// step of an operand read from memory (exact), it is not.
    #[test]
    fn a_step_within_rounding_of_its_kink_is_uncertain() {
        let mut g = Graph::new("kink", Mode::Eval);
        let mut b = Builder::new(&mut g);
        let x = input(&mut b, "x", &[3]);
        let s = input(&mut b, "s", &[3]);
        let t = input(&mut b, "t", &[3]);
        let xs = b.mul(x, s).unwrap();
        let d = b.sub(xs, t).unwrap();
        let st = b.unary(UnaryOp::Step, d).unwrap();
        let direct = b.unary(UnaryOp::Step, x).unwrap();
        let ops = HashMap::from([
            (x, Tensor::real(&[3], vec![1.0, 1.0, 0.0])),
            (s, Tensor::real(&[3], vec![3.0, 3.0, 1.0])),
            // Element 0: 3 − (3 + 1e-9), within rounding; element 1: far; element 2: x = 0.
            (t, Tensor::real(&[3], vec![3.0 + 1e-9, 1.0, 0.0])),
        ]);
        let r = replay_group(&g, 1, &[xs, d, st, direct], &ops).unwrap();
        assert_eq!(r.uncertain.get(&st), Some(&vec![true, false, false]));
        assert!(!r.uncertain.contains_key(&direct), "a step of an exact operand is certain");
        assert_eq!(r.values[&st].as_real().unwrap(), &[0.0, 1.0, 0.0]);
        // The uncertainty follows the element into later nodes of the group.
        let mut g2 = g.clone();
        let mut b = Builder::new(&mut g2);
        let y = b.mul(st, x).unwrap();
        let r = replay_group(&g2, 1, &[xs, d, st, y], &ops).unwrap();
        assert_eq!(r.uncertain.get(&y), Some(&vec![true, false, false]));
    }

    /// A sum over an uncertain element is uncertain at that output only; its bound holds
    /// the accumulation error.
    #[test]
    fn reductions_collect_uncertainty_per_output() {
        let mut g = Graph::new("sum", Mode::Eval);
        let mut b = Builder::new(&mut g);
        let x = input(&mut b, "x", &[2, 2]);
        let t = input(&mut b, "t", &[2, 2]);
        let half = b.scalar(0.5, 0);
        let h = b.mul(x, half).unwrap();
        let d = b.sub(h, t).unwrap();
        let zero = b.scalar(0.0, 0);
        let gt = b.binary(BinaryOp::Greater, d, zero).unwrap();
        let s = b.sum(gt, &[1]).unwrap();
        let ops = HashMap::from([
            (x, Tensor::real(&[2, 2], vec![0.3, 2.0, 4.0, 4.0])),
            (t, Tensor::real(&[2, 2], vec![0.15 + 1e-10, 0.0, 1.0, 1.0])),
        ]);
        let r = replay_group(&g, 1, &[half, h, d, zero, gt, s], &ops).unwrap();
        assert_eq!(r.uncertain.get(&s), Some(&vec![true, false]));
        assert_eq!(r.values[&s].as_real().unwrap(), &[1.0, 2.0]);
    }

    /// An operand that is neither given nor in the group is an error, not a silent zero.
    #[test]
    fn a_missing_operand_is_an_error() {
        let mut g = Graph::new("missing", Mode::Eval);
        let mut b = Builder::new(&mut g);
        let x = input(&mut b, "x", &[2]);
        let y = b.unary(UnaryOp::Exp, x).unwrap();
        let e = replay_group(&g, 1, &[y], &HashMap::new()).unwrap_err();
        assert!(e.contains("neither in its group nor given"), "{e}");
    }
}
