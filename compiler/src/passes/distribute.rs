//! Distributes sums over scaled terms: `Σ_A (a + s·b) = Σ_A a + s·Σ_A b` when `s` is constant
//! along the summed axes `A` and is itself computed from a reduction, so the sum no longer
//! waits for that reduction and can share one pass over the data with it.
//!
//! Autodiff of a batchnorm produces exactly this shape: the gradient of the mean collects
//! `Σ (dy·r − dvar·(x − μ))`-like terms where `dvar` is a per-channel value that is itself a
//! sum over the batch. Left alone, the backward pass reads the layer's activations twice, once
//! for `dvar` and once for the sum that needs it; distributed, every sum reads only values the
//! forward pass left, and the schedule's sibling step (`siblings.rs`) puts them in one kernel.
//!
//! Only sums whose scale factors depend on a reduction are rewritten (elsewhere splitting a
//! sum would add work without removing a pass), and only when every term has the summed
//! value's full shape (a broadcast term would need its replication count).

use super::rewrite::{eliminate_dead, Rewriter, ValueMap};
use crate::ir::*;
use std::collections::HashMap;

/// How deep the term decomposition looks through `add`/`sub`/`neg`/`mul` chains.
const MAX_DEPTH: usize = 12;

/// One term of a sum: `sign · Π factors · term`.
struct Term {
    sign: f64,
    factors: Vec<Value>,
    term: Value,
}

/// Rewrites the sums of `g` as described in the module doc; the values in `keep` (parameter
/// gradients) survive the clean-up. Returns the old→new value map.
pub fn run(g: &mut Graph, keep: &[Value]) -> Result<ValueMap, String> {
    let old = g.clone();
    // Which values are computed from a reduction (directly or through any chain of ops).
    let mut from_reduce = vec![false; old.nodes.len()];
    for (v, n) in old.nodes.iter() {
        from_reduce[v.index()] =
            matches!(n.op, Op::Reduce { .. }) || n.inputs.iter().any(|i| from_reduce[i.index()]);
    }
    // Existing sums by (operand, axes): a distributed term that is already summed reuses it.
    let mut sums: HashMap<(Value, Vec<usize>), Value> = HashMap::new();
    for (v, n) in old.nodes.iter() {
        if let Op::Reduce { op: ReduceOp::Sum, axes } = &n.op {
            sums.entry((n.inputs[0], axes.clone())).or_insert(v);
        }
    }
    let mut rw = Rewriter::new(&old);
    let mut changed = false;
    for v in old.nodes.handles() {
        let n = old.node(v);
        let plan = match &n.op {
            Op::Reduce { op: ReduceOp::Sum, axes } => split(&old, n.inputs[0], axes, &from_reduce),
            _ => None,
        };
        match plan {
            Some(terms) => match emit(&mut rw, v, &terms, &sums)? {
                Some(nv) => {
                    rw.map.set(v, nv);
                    changed = true;
                }
                // Mixed dtypes that would change the sum's type: keep it (what was emitted
                // is unused and removed below).
                None => {
                    rw.copy(v)?;
                }
            },
            None => {
                rw.copy(v)?;
            }
        }
    }
    if !changed {
        return Ok(ValueMap::identity(&old));
    }
    let (rewritten, first) = rw.finish()?;
    let keep: Vec<Value> = keep.iter().map(|&k| first.get(k)).collect::<Result<_, _>>()?;
    let (clean, second) = eliminate_dead(&rewritten, &keep)?;
    *g = clean;
    Ok(first.then(&second))
}

/// Whether `v` is constant along `axes` of a value of rank `rank` (NumPy broadcasting: a
/// missing leading axis or an extent of 1).
fn invariant(g: &Graph, v: Value, rank: usize, axes: &[usize]) -> bool {
    let s = &g.ty(v).shape.0;
    let lead = rank.saturating_sub(s.len());
    axes.iter().all(|&a| a < lead || s[a - lead] == Dim::Fixed(1))
}

/// The terms of `Σ_axes x` when it is worth distributing (some term is scaled by a value
/// from a reduction), else `None`.
fn split(g: &Graph, x: Value, axes: &[usize], from_reduce: &[bool]) -> Option<Vec<Term>> {
    let shape = g.ty(x).shape.clone();
    let rank = shape.rank();
    let mut terms = Vec::new();
    let mut scaled = false;
    // A factor constant along `axes` that comes from a reduction (seen through an `expand`,
    // which autodiff puts on broadcast gradients).
    let scale = |v: Value| -> Option<Value> {
        let n = g.node(v);
        let s = if matches!(n.op, Op::Expand) { n.inputs[0] } else { v };
        (invariant(g, s, rank, axes) && from_reduce[s.index()]).then_some(s)
    };
    let mut stack = vec![(x, 1.0, Vec::new(), 0usize)];
    while let Some((v, sign, factors, depth)) = stack.pop() {
        let n = g.node(v);
        // Only full-shaped values are split further: the sum of a broadcast operand would
        // need its replication count, so such an `add` stays one term.
        let full = |v: Value| g.ty(v).shape == shape;
        let deeper = depth < MAX_DEPTH && n.inputs.iter().all(|&i| full(i) || scale(i).is_some());
        match (&n.op, n.inputs.as_slice()) {
            (Op::Binary(BinaryOp::Add), &[a, b]) if deeper && full(a) && full(b) => {
                stack.push((a, sign, factors.clone(), depth + 1));
                stack.push((b, sign, factors, depth + 1));
            }
            (Op::Binary(BinaryOp::Sub), &[a, b]) if deeper && full(a) && full(b) => {
                stack.push((a, sign, factors.clone(), depth + 1));
                stack.push((b, -sign, factors, depth + 1));
            }
            (Op::Unary(UnaryOp::Neg), &[a]) if deeper => stack.push((a, -sign, factors, depth + 1)),
            (Op::Binary(BinaryOp::Mul), &[a, b])
                if deeper && (scale(a).is_some() && full(b) || scale(b).is_some() && full(a)) =>
            {
                let (s, t) = match scale(a) {
                    Some(s) if full(b) => (s, b),
                    _ => (scale(b).expect("checked"), a),
                };
                scaled = true;
                let mut f = factors;
                f.push(s);
                stack.push((t, sign, f, depth + 1));
            }
            _ => terms.push(Term { sign, factors, term: v }),
        }
    }
    scaled.then_some(terms)
}

/// Emits `Σ_i sign_i · Π factors_i · Σ_axes term_i` for old sum `v`, one sum per distinct
/// term (their coefficients added first, on the small per-channel values); `None` when the
/// result would not have the old sum's type.
fn emit(
    rw: &mut Rewriter,
    v: Value,
    terms: &[Term],
    sums: &HashMap<(Value, Vec<usize>), Value>,
) -> Result<Option<Value>, String> {
    let op = rw.old.node(v).op.clone();
    let Op::Reduce { axes, .. } = &op else {
        return Err(format!("internal error: {v} is not a sum"));
    };
    // Group the terms by value, keeping first-appearance order (deterministic output).
    let mut order: Vec<Value> = Vec::new();
    for t in terms {
        if !order.contains(&t.term) {
            order.push(t.term);
        }
    }
    let bin =
        |rw: &mut Rewriter, op: BinaryOp, a: Value, b: Value| rw.emit(Op::Binary(op), vec![a, b], v, None);
    let mut total: Option<Value> = None;
    for t in order {
        let existing = sums.get(&(t, axes.clone())).and_then(|&e| rw.map.lookup(e));
        let sum = match existing {
            Some(e) => e,
            None => rw.emit(op.clone(), vec![rw.mapped(t)?], v, None)?,
        };
        // The coefficient: Σ over this term's occurrences of sign · Π factors.
        let mut coef: Option<Value> = None;
        let mut count = 0.0;
        for occ in terms.iter().filter(|o| o.term == t) {
            let mut prod: Option<Value> = None;
            for &f in &occ.factors {
                let f = rw.mapped(f)?;
                prod = Some(match prod {
                    None => f,
                    Some(p) => bin(rw, BinaryOp::Mul, p, f)?,
                });
            }
            match prod {
                None => count += occ.sign,
                Some(p) => {
                    let p =
                        if occ.sign < 0.0 { rw.emit(Op::Unary(UnaryOp::Neg), vec![p], v, None)? } else { p };
                    coef = Some(match coef {
                        None => p,
                        Some(c) => bin(rw, BinaryOp::Add, c, p)?,
                    });
                }
            }
        }
        // Unscaled occurrences add `count` to the coefficient.
        let scaled = match (coef, count) {
            (None, 1.0) => sum,
            (None, -1.0) => rw.emit(Op::Unary(UnaryOp::Neg), vec![sum], v, None)?,
            (c, k) => {
                let c = match (c, k) {
                    (Some(c), 0.0) => c,
                    (Some(c), k) => {
                        let s = scalar(rw, k, v);
                        bin(rw, BinaryOp::Add, c, s)?
                    }
                    (None, k) => scalar(rw, k, v),
                };
                bin(rw, BinaryOp::Mul, c, sum)?
            }
        };
        total = Some(match total {
            None => scaled,
            Some(acc) => bin(rw, BinaryOp::Add, acc, scaled)?,
        });
    }
    let out = total.ok_or("a sum with no terms")?;
    Ok((rw.old.ty(v) == rw.new.ty(out)).then_some(out))
}

/// The f32 scalar `k` (span and origin of old value `like`).
fn scalar(rw: &mut Rewriter, k: f64, like: Value) -> Value {
    let node = Node {
        op: Op::Scalar { value: k, batch_exp: 0 },
        inputs: Vec::new(),
        ty: TensorType::new(DType::F32, Shape::fixed(&[])),
        origin: rw.old.node(like).origin.clone(),
    };
    let span = rw.old.span(like);
    rw.push(node, span)
}
