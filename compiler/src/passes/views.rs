//! View canonicalisation, the pipeline step before fusion's partitioning: moves reshapes and
//! materialised broadcasts (`Expand`) out of elementwise chains so the chains fuse into
//! their consumers instead of being stored.
//!
//! - A reshape of an elementwise chain feeding a reduction (the pooling window view of an
//!   activation) is *hoisted*: the chain is re-emitted in the reshaped index space, reading
//!   reshaped (free) views of its stored operands, so the pooling reduction computes
//!   normalise→activation in its prologue from the convolution output.
//! - An `Expand` is kept *pending* (as its small source) and absorbed by elementwise users,
//!   which broadcast their operands anyway; a reshape of a pending expand (the gradient of a
//!   pooling window sum) makes its elementwise users run in the reshaped index space, and
//!   reductions over them map their axes, so no broadcast copy is ever stored.
//!
//! Every rewrite is an identity on values: elementwise ops commute with broadcasting and
//! with reshapes that keep the row-major element order.

use super::rewrite::{eliminate_dead, Rewriter, ValueMap};
use crate::ir::*;
use std::collections::HashMap;
use std::ops::Range;

/// Pairs of axis ranges `(from, to)` with equal extent products covering two shapes of the
/// same element count, in order. The batch dimension must map to itself alone.
pub type AxisGroups = Vec<(Range<usize>, Range<usize>)>;

/// The axis groups between `from` and `to`, if `to` is a reshape of `from` that keeps `B`.
pub fn axis_groups(from: &Shape, to: &Shape) -> Option<AxisGroups> {
    let (a, b) = (&from.0, &to.0);
    let (mut i, mut j) = (0, 0);
    let mut groups = Vec::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == Dim::Batch && b[j] == Dim::Batch {
            groups.push((i..i + 1, j..j + 1));
            i += 1;
            j += 1;
            continue;
        }
        let (i0, j0) = (i, j);
        let (mut pa, mut pb) = (1usize, 1usize);
        if i < a.len() {
            pa = a[i].fixed()?;
            i += 1;
        }
        if j < b.len() {
            pb = b[j].fixed()?;
            j += 1;
        }
        while pa != pb {
            if pa < pb {
                pa *= a.get(i)?.fixed()?;
                i += 1;
            } else {
                pb *= b.get(j)?.fixed()?;
                j += 1;
            }
        }
        groups.push((i0..i, j0..j));
    }
    Some(groups)
}

/// The shape an operand broadcast against `from` takes in `to`'s index space, if it can
/// (each axis group of the operand is either whole or all ones).
pub fn map_operand(op: &Shape, from: &Shape, to: &Shape, groups: &AxisGroups) -> Option<Shape> {
    if op.rank() > from.rank() {
        return None;
    }
    let mut padded = vec![Dim::Fixed(1); from.rank() - op.rank()];
    padded.extend(op.0.iter().copied());
    let mut out = Vec::with_capacity(to.rank());
    for (fr, tr) in groups {
        let od = &padded[fr.clone()];
        if od == &from.0[fr.clone()] {
            out.extend_from_slice(&to.0[tr.clone()]);
        } else if od.iter().all(|&d| d == Dim::Fixed(1)) {
            out.extend(std::iter::repeat_n(Dim::Fixed(1), tr.len()));
        } else {
            return None;
        }
    }
    Some(Shape(out))
}

/// Reduction axes of `from` mapped to `to`: every group is reduced whole or not at all.
fn map_axes(axes: &[usize], groups: &AxisGroups) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for (fr, tr) in groups {
        let n = fr.clone().filter(|a| axes.contains(a)).count();
        if n == fr.len() && n > 0 {
            out.extend(tr.clone());
        } else if n > 0 {
            return None;
        } else if fr.is_empty() {
            continue;
        }
    }
    Some(out)
}

/// An old value not emitted yet: `Reshape_{full→old shape}(Broadcast_{src→full}(src))`
/// (`groups` is `None` when there is no reshape, and `full` is then the old shape).
#[derive(Clone)]
struct Pending {
    src: Value,
    full: Shape,
    groups: Option<AxisGroups>,
    materialised: Option<Value>,
}

struct Canon<'a> {
    rw: Rewriter<'a>,
    pending: Vec<Option<Pending>>,
    /// Hoisted copies of old elementwise values in a reshaped index space.
    hoisted: HashMap<(Value, Shape), Value>,
    /// Reshapes emitted so far, by (new value, shape), so each view is made once.
    views: HashMap<(Value, Shape), Value>,
}

fn is_elementwise_node(n: &Node) -> bool {
    n.op.is_elementwise() && !n.op.is_leaf()
}

impl<'a> Canon<'a> {
    fn old(&self) -> &'a Graph {
        self.rw.old
    }

    /// The new value standing for old `v`, emitting a pending broadcast/reshape if needed.
    fn value(&mut self, v: Value) -> Result<Value, String> {
        let Some(p) = self.pending[v.index()].clone() else { return self.rw.mapped(v) };
        if let Some(m) = p.materialised {
            return Ok(m);
        }
        let mut x = p.src;
        if self.rw.new.ty(x).shape != p.full {
            x = self.rw.emit(Op::Expand, vec![x], v, Some(&p.full))?;
        }
        if p.groups.is_some() {
            let s = self.old().ty(v).shape.clone();
            x = self.rw.emit(Op::Reshape, vec![x], v, Some(&s))?;
        }
        if let Some(p) = self.pending[v.index()].as_mut() {
            p.materialised = Some(x);
        }
        self.rw.map.set(v, x);
        Ok(x)
    }

    /// Old value `v` (broadcast against shape `from`) in the index space `to`.
    fn in_space(
        &mut self,
        v: Value,
        from: &Shape,
        to: &Shape,
        groups: &AxisGroups,
        like: Value,
    ) -> Result<Option<Value>, String> {
        let g = self.old();
        let n = g.node(v);
        if n.ty.shape.rank() == 0 {
            return self.value(v).map(Some);
        }
        if let Some(p) = self.pending[v.index()].clone().filter(|p| p.materialised.is_none()) {
            match &p.groups {
                Some(_) if p.full == *to && n.ty.shape == *from => return Ok(Some(p.src)),
                None => {
                    let src_shape = self.rw.new.ty(p.src).shape.clone();
                    if let Some(ms) = map_operand(&src_shape, from, to, groups) {
                        return self.view(p.src, &ms, like).map(Some);
                    }
                }
                Some(_) => {}
            }
        } else if n.ty.shape == *from && is_elementwise_node(n) && self.pending[v.index()].is_none() {
            return self.hoist(v, from, to, groups);
        }
        let Some(ms) = map_operand(&n.ty.shape, from, to, groups) else { return Ok(None) };
        let x = self.value(v)?;
        self.view(x, &ms, like).map(Some)
    }

    /// A reshape of new value `x` to `shape`, made once.
    fn view(&mut self, x: Value, shape: &Shape, like: Value) -> Result<Value, String> {
        if self.rw.new.ty(x).shape == *shape {
            return Ok(x);
        }
        if let Some(&v) = self.views.get(&(x, shape.clone())) {
            return Ok(v);
        }
        let v = self.rw.emit(Op::Reshape, vec![x], like, Some(shape))?;
        self.views.insert((x, shape.clone()), v);
        Ok(v)
    }

    /// Re-emits the elementwise chain of old `v` (shape `from`) in index space `to`.
    fn hoist(
        &mut self,
        v: Value,
        from: &Shape,
        to: &Shape,
        groups: &AxisGroups,
    ) -> Result<Option<Value>, String> {
        if let Some(&h) = self.hoisted.get(&(v, to.clone())) {
            return Ok(Some(h));
        }
        let n = self.old().node(v);
        let mut ins = Vec::with_capacity(n.inputs.len());
        for &o in &n.inputs {
            match self.in_space(o, from, to, groups, v)? {
                Some(x) => ins.push(x),
                None => return Ok(None),
            }
        }
        let h = self.rw.emit(n.op.clone(), ins, v, None)?;
        if self.rw.new.ty(h).shape != *to {
            return Ok(None);
        }
        self.hoisted.insert((v, to.clone()), h);
        Ok(Some(h))
    }

    fn copy_materialised(&mut self, v: Value) -> Result<(), String> {
        for &i in &self.old().node(v).inputs {
            self.value(i)?;
        }
        self.rw.copy(v)?;
        Ok(())
    }

    fn step(&mut self, v: Value, users: &[Vec<Value>]) -> Result<(), String> {
        let g = self.old();
        let n = g.node(v);
        match &n.op {
            Op::Expand => {
                let src = self.value(n.inputs[0])?;
                self.pending[v.index()] =
                    Some(Pending { src, full: n.ty.shape.clone(), groups: None, materialised: None });
                return Ok(());
            }
            Op::Reshape => {
                let x = n.inputs[0];
                let fuses = users[v.index()].iter().any(|&u| {
                    let un = g.node(u);
                    un.op.is_elementwise() || matches!(un.op, Op::Reduce { .. })
                });
                if let Some(p) = self.pending[x.index()].clone() {
                    if p.groups.is_none() {
                        if let Some(groups) = axis_groups(&n.ty.shape, &p.full) {
                            self.pending[v.index()] = Some(Pending {
                                src: p.src,
                                full: p.full,
                                groups: Some(groups),
                                materialised: None,
                            });
                            return Ok(());
                        }
                    }
                } else if fuses && is_elementwise_node(g.node(x)) {
                    let from = &g.ty(x).shape;
                    if let Some(groups) = axis_groups(from, &n.ty.shape) {
                        if let Some(h) = self.hoist(x, from, &n.ty.shape, &groups)? {
                            self.rw.map.set(v, h);
                            return Ok(());
                        }
                    }
                }
                return self.copy_materialised(v);
            }
            _ => {}
        }
        let has_pending = n.inputs.iter().any(|i| self.pending[i.index()].is_some());
        if !has_pending {
            self.rw.copy(v)?;
            return Ok(());
        }
        if is_elementwise_node(n) {
            if self.elementwise(v)? {
                return Ok(());
            }
        } else if let Op::Reduce { op, axes } = &n.op {
            let p = self.pending[n.inputs[0].index()].clone();
            if let Some((p, groups)) = p.as_ref().and_then(|p| Some((p, p.groups.as_ref()?))) {
                if let Some(ax) = map_axes(axes, groups) {
                    let mut src = p.src;
                    if self.rw.new.ty(src).shape != p.full {
                        src = self.rw.emit(Op::Expand, vec![src], v, Some(&p.full))?;
                    }
                    let r = self.rw.emit(Op::Reduce { op: *op, axes: ax }, vec![src], v, None)?;
                    let back = self.rw.emit(Op::Reshape, vec![r], v, Some(&n.ty.shape))?;
                    self.rw.map.set(v, back);
                    return Ok(());
                }
            }
        }
        self.copy_materialised(v)
    }

    /// Emits elementwise `v` over pending operands; false when it must be copied instead.
    fn elementwise(&mut self, v: Value) -> Result<bool, String> {
        let g = self.old();
        let n = g.node(v);
        let lead = n.inputs.iter().find_map(|&i| {
            let p = self.pending[i.index()].as_ref()?;
            Some((i, p.full.clone(), p.groups.clone()?))
        });
        let mut ins = Vec::with_capacity(n.inputs.len());
        let (full, groups) = match lead {
            Some((li, lp_full, groups)) => {
                let s = &n.ty.shape;
                if g.ty(li).shape != *s {
                    return Ok(false);
                }
                for &o in &n.inputs {
                    match self.in_space(o, s, &lp_full, &groups, v)? {
                        Some(x) => ins.push(x),
                        None => return Ok(false),
                    }
                }
                (lp_full, Some(groups))
            }
            None => {
                for &o in &n.inputs {
                    match &self.pending[o.index()] {
                        Some(p) if p.materialised.is_none() => ins.push(p.src),
                        _ => ins.push(self.value(o)?),
                    }
                }
                (n.ty.shape.clone(), None)
            }
        };
        let u = self.rw.emit(n.op.clone(), ins, v, None)?;
        let ut = self.rw.new.ty(u).clone();
        if groups.is_none() && ut == n.ty {
            self.rw.map.set(v, u);
        } else {
            self.pending[v.index()] = Some(Pending { src: u, full, groups, materialised: None });
        }
        Ok(true)
    }
}

/// Rewrites `g` as described in the module doc; the values in `keep` (parameter gradients)
/// and the outputs and loss stay stored as they are. Returns the old→new value map.
pub fn run(g: &mut Graph, keep: &[Value]) -> Result<ValueMap, String> {
    let old = g.clone();
    let users = old.users();
    let mut c = Canon {
        rw: Rewriter::new(&old),
        pending: vec![None; old.nodes.len()],
        hoisted: HashMap::new(),
        views: HashMap::new(),
    };
    for v in old.nodes.handles() {
        c.step(v, &users)?;
    }
    let mut roots: Vec<Value> = old.outputs.iter().map(|o| o.value).collect();
    roots.extend(old.loss);
    roots.extend(keep.iter().copied());
    for r in roots {
        c.value(r)?;
    }
    let (built, map) = c.rw.finish()?;
    // A kept value that no operation reads (the zero gradient of a parameter the loss does not
    // use, whose broadcast the users absorbed) must survive the clean-up: it is a root too.
    let keep: Vec<Value> = keep.iter().map(|&k| map.get(k)).collect::<Result<_, _>>()?;
    let (clean, dce) = eliminate_dead(&built, &keep)?;
    *g = clean;
    Ok(map.then(&dce))
}
