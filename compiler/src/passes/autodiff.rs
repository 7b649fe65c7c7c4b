//! Reverse-mode autodiff over the whole graph, with PyTorch's conjugate-Wirtinger convention.
//!
//! The gradient of a real loss `L` w.r.t. `z = x + iy` is `∂L/∂x + i ∂L/∂y`; for a
//! holomorphic `w = f(z)` it propagates as `ḡ_z = conj(f'(z)) · ḡ_w` (so `Mul` gives
//! `ḡ_a = ḡ·conj(b)`). A real operand of a complex op takes the real part of its complex
//! gradient; a broadcast operand sums over the broadcast axes. Every backward node has
//! [`Role::Backward`], the label `grad(<primal label>)` and the span of the primal node.
//!
//! With a chunk length `K` ([`run_chunked`]) a recurrence of more than `K` steps is
//! back-propagated chunk by chunk (truncation-free BPTT with checkpoints): each chunk's states
//! are recomputed from the stored state before it, so the backward's temporaries are
//! `[B, K, ·]` and the forward's `[B, T, ·]` states are read only at the checkpoints.

use crate::ir::builder::Builder;
use crate::ir::*;
use std::collections::HashMap;

/// What [`run`] found: the gradient of the loss for every parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AutodiffFacts {
    /// `(parameter, gradient)` pairs, in arena order of the parameters.
    pub grads: Vec<(Value, Value)>,
    /// Forward values the backward recomputes chunk by chunk (chunked back-propagation
    /// through time): the schedule runs them only when the chunk needs them.
    pub recomputed: Vec<Value>,
}

/// Appends the backward pass of `g.loss` w.r.t. every `Param`, and verifies the graph.
pub fn run(g: &mut Graph) -> Result<AutodiffFacts, String> {
    run_chunked(g, None)
}

/// [`run`], back-propagating every recurrence of more than `rnn_chunk` steps in chunks of
/// that many steps (see the module doc); `None`: one `RecurrenceGrad` per recurrence.
pub fn run_chunked(g: &mut Graph, rnn_chunk: Option<usize>) -> Result<AutodiffFacts, String> {
    let loss = g.loss.ok_or("autodiff: the graph has no loss")?;
    let params: Vec<Value> = g.params().collect();
    let (grads, recomputed) = sweep(g, loss, &params, rnn_chunk)?;
    verify::verify(g).map_err(|e| format!("autodiff produced invalid IR: {e}"))?;
    Ok(AutodiffFacts { grads: params.into_iter().zip(grads).collect(), recomputed })
}

/// Appends nodes computing `∂loss/∂wrt[i]` (conjugate-Wirtinger for complex values) and
/// returns them in order. A value the loss does not depend on gets zeros. Only nodes on a
/// path from some `wrt` to `loss` are differentiated.
pub fn gradients(g: &mut Graph, loss: Value, wrt: &[Value]) -> Result<Vec<Value>, String> {
    gradients_chunked(g, loss, wrt, None)
}

/// [`gradients`] with recurrences of more than `rnn_chunk` steps back-propagated in chunks.
pub fn gradients_chunked(
    g: &mut Graph,
    loss: Value,
    wrt: &[Value],
    rnn_chunk: Option<usize>,
) -> Result<Vec<Value>, String> {
    Ok(sweep(g, loss, wrt, rnn_chunk)?.0)
}

/// The reverse sweep: the gradients of `wrt`, and the forward values recomputed per chunk.
fn sweep(
    g: &mut Graph,
    loss: Value,
    wrt: &[Value],
    rnn_chunk: Option<usize>,
) -> Result<(Vec<Value>, Vec<Value>), String> {
    if rnn_chunk == Some(0) {
        return Err("autodiff: the recurrence chunk length must be at least 1".into());
    }
    if g.ty(loss).dtype != DType::F32 {
        return Err(format!("autodiff: the loss must be real, it is {}", g.ty(loss)));
    }
    for &w in wrt {
        if g.ty(w).dtype == DType::I32 {
            return Err(format!("autodiff: cannot differentiate w.r.t. the i32 value {w}"));
        }
    }
    let n = g.nodes.len();
    let mut active = vec![false; n];
    for &w in wrt {
        active[w.index()] = true;
    }
    for (h, node) in g.nodes.iter() {
        if node.inputs.iter().any(|i| active[i.index()]) {
            active[h.index()] = true;
        }
    }
    let mut to_loss = vec![false; n];
    to_loss[loss.index()] = true;
    for h in g.nodes.handles().rev() {
        if to_loss[h.index()] {
            for &i in &g.node(h).inputs {
                to_loss[i.index()] = true;
            }
        }
    }
    for (a, t) in active.iter_mut().zip(&to_loss) {
        *a &= *t;
    }

    let mut ad = Reverse {
        b: Builder::new(g),
        contribs: vec![Vec::new(); n],
        total: vec![None; n],
        rnn_chunk,
        splits: HashMap::new(),
        recomputed: Vec::new(),
    };
    if active[loss.index()] {
        ad.at(loss);
        // Under dynamic loss scaling (fp16) the backward starts from the scale, not from 1:
        // every gradient is the scaled one, and the optimizer divides it back out.
        let one = match ad.b.graph.find_leaf(super::optimizer::LOSS_SCALE) {
            Some(scale) => scale,
            None => ad.b.scalar(1.0, 0),
        };
        let shape = ad.b.graph.ty(loss).shape.clone();
        let seed = ad.b.expand(one, shape)?;
        ad.contribs[loss.index()].push(seed);
    }
    for h in (0..n).rev().map(Handle::from_index) {
        if !active[h.index()] || ad.contribs[h.index()].is_empty() {
            continue;
        }
        ad.at(h);
        let gout = ad.sum(h)?;
        ad.total[h.index()] = Some(gout);
        let node = ad.b.graph.node(h).clone();
        let need: Vec<bool> = node.inputs.iter().map(|i| active[i.index()]).collect();
        if !need.iter().any(|&x| x) {
            continue;
        }
        let parts = ad.backprop(h, &node, gout, &need)?;
        for (k, part) in parts.into_iter().enumerate() {
            if let (Some(c), true) = (part, need[k]) {
                let target = node.inputs[k];
                let c = ad.fit(c, target)?;
                ad.contribs[target.index()].push(c);
            }
        }
    }
    let grads = wrt
        .iter()
        .map(|&w| match ad.total[w.index()] {
            Some(v) => Ok(v),
            None => {
                ad.at(w);
                ad.zeros(ad.b.graph.ty(w).clone())
            }
        })
        .collect::<Result<_, String>>()?;
    Ok((grads, ad.recomputed))
}

/// Builder state of one reverse sweep.
struct Reverse<'g> {
    b: Builder<'g>,
    /// Gradient contributions from each value's users, not yet summed.
    contribs: Vec<Vec<Value>>,
    /// The summed gradient of each value once its users are done.
    total: Vec<Option<Value>>,
    /// Chunk length of chunked back-propagation through time.
    rnn_chunk: Option<usize>,
    /// Gradients that are a concatenation of chunks (a chunked recurrence's `dxp`), so that
    /// reductions and contractions over the chunked axis can run chunk by chunk and the
    /// concatenation itself dies unread.
    splits: HashMap<Value, Split>,
    /// Forward values recomputed per chunk of a recurrence (see [`AutodiffFacts`]).
    recomputed: Vec<Value>,
}

/// How many producers up a chunk's input projection is recomputed from sliced operands: the
/// bias add, the matmul and a cast (deeper layers are read sliced, not recomputed).
const PROJECTION_DEPTH: usize = 3;

/// A value that is the concatenation of `pieces` (each with its start) along `axis`.
#[derive(Clone, Debug)]
struct Split {
    axis: usize,
    pieces: Vec<(usize, Value)>,
}

/// What the back-propagation through (a chunk of) a recurrence gives.
struct Bptt {
    /// `dxp`, when asked for.
    dx: Option<Value>,
    /// `dgh`, when `W_hh` or `b_hh` needs it.
    dgh: Option<Value>,
    /// `dW_hh`, when asked for.
    dw: Option<Value>,
    /// The gradient of `h0`, `[B, S·H]`, when there is an `h0`.
    dh0: Option<Value>,
}

/// Exclusive or, for composing conjugation flags (`conj(conj^a(x)) = conj^(!a)(x)`).
fn xor(a: bool, b: bool) -> bool {
    a ^ b
}

impl Reverse<'_> {
    /// Stamps the nodes that follow as the backward of `primal`.
    fn at(&mut self, primal: Value) {
        let g = &*self.b.graph;
        let n = g.node(primal);
        let name = if !n.origin.label.is_empty() {
            n.origin.label.clone()
        } else if let Some(leaf) = g.leaf_name(primal) {
            leaf.to_string()
        } else {
            format!("{primal}")
        };
        let span = g.span(primal);
        self.b.at(span, Role::Backward, format!("grad({name})"));
    }

    fn ty(&self, v: Value) -> &TensorType {
        self.b.graph.ty(v)
    }

    fn is_complex(&self, v: Value) -> bool {
        self.ty(v).dtype.is_complex()
    }

    fn sum(&mut self, h: Value) -> Result<Value, String> {
        let parts = std::mem::take(&mut self.contribs[h.index()]);
        let parts = self.join_pads(parts)?;
        let mut acc = parts[0];
        for &p in &parts[1..] {
            acc = self.b.add2(acc, p)?;
        }
        Ok(acc)
    }

    /// Gradient contributions that pad the pieces of one tensor (the gradients of its slices:
    /// a packed projection's q, k and v, the entries of a 2 × 2 weight) joined into one
    /// `Concat` where the pieces tile an axis: one kernel writes the tensor once, where every
    /// pad wrote all of it and the sum read each one back. Pads of the same range are added
    /// first, as one pad of their summed pieces (joined the same way, recursively). Pads
    /// that leave gaps or overlap stay as they are.
    fn join_pads(&mut self, parts: Vec<Value>) -> Result<Vec<Value>, String> {
        if parts.len() < 2 {
            return Ok(parts);
        }
        let pad_of = |g: &Graph, v: Value| match g.node(v).op {
            Op::Pad { axis, before, after } => Some((axis, before, after)),
            _ => None,
        };
        let mut out = Vec::new();
        let mut same: Vec<((usize, usize, usize), Vec<Value>)> = Vec::new();
        for p in parts {
            match pad_of(self.b.graph, p) {
                Some(key) => match same.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, pads)) => pads.push(p),
                    None => same.push((key, vec![p])),
                },
                None => out.push(p),
            }
        }
        let mut pads: Vec<((usize, usize, usize), Value)> = Vec::new();
        for ((axis, before, after), group) in same {
            if group.len() == 1 {
                pads.push(((axis, before, after), group[0]));
                continue;
            }
            let inner: Vec<Value> = group.iter().map(|&p| self.b.graph.node(p).inputs[0]).collect();
            let inner = self.join_pads(inner)?;
            let mut acc = inner[0];
            for &x in &inner[1..] {
                acc = self.b.add2(acc, x)?;
            }
            pads.push(((axis, before, after), self.b.add(Op::Pad { axis, before, after }, &[acc])?));
        }
        let mut axes: Vec<usize> = pads.iter().map(|((a, _, _), _)| *a).collect();
        axes.sort_unstable();
        axes.dedup();
        for axis in axes {
            let mut on: Vec<(usize, usize, Value)> =
                pads.iter().filter(|((a, _, _), _)| *a == axis).map(|&((_, b, af), p)| (b, af, p)).collect();
            if on.len() < 2 {
                continue;
            }
            on.sort_by_key(|&(b, _, _)| b);
            let mut at = 0;
            let mut pieces = Vec::with_capacity(on.len());
            for &(before, _, p) in &on {
                let piece = self.b.graph.node(p).inputs[0];
                if before != at {
                    break;
                }
                at += self.fixed_extent(piece, axis)?;
                pieces.push(piece);
            }
            if pieces.len() != on.len() || on.last().is_some_and(|&(_, after, _)| after != 0) {
                continue;
            }
            pads.retain(|((a, _, _), _)| *a != axis);
            out.push(self.b.add(Op::Concat { axis }, &pieces)?);
        }
        out.extend(pads.into_iter().map(|(_, p)| p));
        Ok(out)
    }

    fn scalar(&mut self, c: f64) -> Value {
        self.b.scalar(c, 0)
    }

    fn un(&mut self, op: UnaryOp, x: Value) -> Result<Value, String> {
        self.b.unary(op, x)
    }

    fn bin(&mut self, op: BinaryOp, a: Value, b: Value) -> Result<Value, String> {
        self.b.binary(op, a, b)
    }

    fn conj(&mut self, x: Value) -> Result<Value, String> {
        if self.is_complex(x) {
            self.un(UnaryOp::Conj, x)
        } else {
            Ok(x)
        }
    }

    /// Zeros of type `ty` (a scalar, made complex if needed, then expanded).
    fn zeros(&mut self, ty: TensorType) -> Result<Value, String> {
        let mut z = self.scalar(0.0);
        if ty.dtype.is_complex() {
            z = self.bin(BinaryOp::Complex, z, z)?;
        }
        self.b.expand(z, ty.shape)
    }

    /// `d` where `d > 0`, else 1: a denominator that is safe at zero.
    fn safe_denominator(&mut self, d: Value) -> Result<Value, String> {
        let zero = self.scalar(0.0);
        let one = self.scalar(1.0);
        let pos = self.bin(BinaryOp::Greater, d, zero)?;
        self.b.add(Op::Select, &[pos, d, one])
    }

    /// Brings a gradient contribution to the dtype and shape of `target`.
    fn fit(&mut self, c: Value, target: Value) -> Result<Value, String> {
        let want = self.ty(target).clone();
        let mut c = c;
        match (self.ty(c).dtype, want.dtype) {
            (DType::C64, DType::F32) => c = self.un(UnaryOp::Real, c)?,
            (DType::F32, DType::C64) => c = self.un(UnaryOp::ToComplex, c)?,
            _ => {}
        }
        let have = self.ty(c).shape.clone();
        if have == want.shape {
            return Ok(c);
        }
        let (r, t) = (have.rank(), want.shape.rank());
        if t > r {
            return Err(format!("autodiff: gradient of shape {have} cannot fit {}", want.shape));
        }
        let lead = r - t;
        let axes: Vec<usize> = (0..r)
            .filter(|&i| i < lead || (want.shape.0[i - lead] == Dim::Fixed(1) && have.0[i] != Dim::Fixed(1)))
            .collect();
        if !axes.is_empty() {
            c = match self.splits.get(&c).filter(|s| axes.contains(&s.axis)).cloned() {
                // A sum over the chunked axis: the sum of the chunks' sums.
                Some(split) => {
                    let mut acc = None;
                    for (_, piece) in split.pieces {
                        let part = self.b.sum(piece, &axes)?;
                        acc = Some(match acc {
                            Some(a) => self.b.add2(a, part)?,
                            None => part,
                        });
                    }
                    acc.ok_or("autodiff: a split gradient without pieces")?
                }
                None => self.b.sum(c, &axes)?,
            };
        }
        self.b.reshape(c, want.shape)
    }

    /// The gradient contributions of node `h` to its operands (`None` = no gradient).
    fn backprop(
        &mut self,
        h: Value,
        node: &Node,
        g: Value,
        need: &[bool],
    ) -> Result<Vec<Option<Value>>, String> {
        let ins = &node.inputs;
        Ok(match &node.op {
            Op::Unary(u) => vec![self.unary(*u, ins[0], h, g)?],
            Op::Binary(b) => self.binary(*b, ins[0], ins[1], h, g, need)?,
            Op::Select => {
                let zero = self.scalar(0.0);
                let ga = if need[1] { Some(self.b.add(Op::Select, &[ins[0], g, zero])?) } else { None };
                let gb = if need[2] { Some(self.b.add(Op::Select, &[ins[0], zero, g])?) } else { None };
                vec![None, ga, gb]
            }
            Op::Reduce { op, axes } => vec![Some(self.reduce(*op, axes, ins[0], h, g)?)],
            Op::Reshape => {
                let s = self.ty(ins[0]).shape.clone();
                vec![Some(self.b.reshape(g, s)?)]
            }
            Op::Expand => vec![Some(g)],
            Op::Permute { perm } => {
                let mut inv = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i;
                }
                vec![Some(self.b.add(Op::Permute { perm: inv }, &[g])?)]
            }
            Op::Slice { axis, start, len } => {
                let ext = self.fixed_extent(ins[0], *axis)?;
                let pad = Op::Pad { axis: *axis, before: *start, after: ext - start - len };
                vec![Some(self.b.add(pad, &[g])?)]
            }
            Op::Pad { axis, before, .. } => {
                let len = self.fixed_extent(ins[0], *axis)?;
                vec![Some(self.b.add(Op::Slice { axis: *axis, start: *before, len }, &[g])?)]
            }
            Op::Concat { axis } => {
                let mut at = 0;
                let mut out = Vec::with_capacity(ins.len());
                for (k, &piece) in ins.iter().enumerate() {
                    let len = self.fixed_extent(piece, *axis)?;
                    out.push(if need[k] {
                        Some(self.b.add(Op::Slice { axis: *axis, start: at, len }, &[g])?)
                    } else {
                        None
                    });
                    at += len;
                }
                out
            }
            Op::MatMul { trans, conj, sum_batch } => {
                self.matmul(*trans, *conj, *sum_batch, ins[0], ins[1], g, need)?
            }
            Op::Conv2d { geom, conj } => {
                let [c0, c1] = *conj;
                let hw = self.spatial(ins[0])?;
                let kernel = self.spatial(ins[1])?;
                let gx = Op::ConvTranspose2d { geom: *geom, out_hw: hw, conj: [c0, xor(!c1, c0)] };
                let gw = Op::Conv2dWeightGrad { geom: *geom, kernel, conj: [xor(!c0, c1), c1] };
                vec![self.maybe(need[0], gx, &[g, ins[1]])?, self.maybe(need[1], gw, &[ins[0], g])?]
            }
            Op::ConvTranspose2d { geom, conj, .. } => {
                let [c0, c1] = *conj;
                let kernel = self.spatial(ins[1])?;
                let ga = Op::Conv2d { geom: *geom, conj: [c0, xor(!c1, c0)] };
                let gw = Op::Conv2dWeightGrad { geom: *geom, kernel, conj: [c1, xor(!c0, c1)] };
                vec![self.maybe(need[0], ga, &[g, ins[1]])?, self.maybe(need[1], gw, &[g, ins[0]])?]
            }
            Op::Conv2dWeightGrad { geom, conj, .. } => {
                let [c0, c1] = *conj;
                let hw = self.spatial(ins[0])?;
                let gx = Op::ConvTranspose2d { geom: *geom, out_hw: hw, conj: [xor(!c1, c0), c0] };
                let gdy = Op::Conv2d { geom: *geom, conj: [xor(!c0, c1), c1] };
                vec![self.maybe(need[0], gx, &[ins[1], g])?, self.maybe(need[1], gdy, &[ins[0], g])?]
            }
            Op::Fft { axis, inverse, norm } => {
                let adj = Op::Fft { axis: *axis, inverse: !inverse, norm: norm.adjoint() };
                vec![Some(self.b.add(adj, &[g])?)]
            }
            Op::Gather => {
                let rows = self.fixed_extent(ins[0], 0)?;
                vec![self.maybe(need[0], Op::ScatterAdd { rows }, &[g, ins[1]])?, None]
            }
            Op::ScatterAdd { .. } => vec![self.maybe(need[0], Op::Gather, &[g, ins[1]])?, None],
            Op::Attention { spec } => self.attention(*spec, h, ins, g, need)?,
            Op::AttentionGrad { .. } => {
                return Err("autodiff: the second derivative of attention is not supported".into())
            }
            Op::Recurrence { spec } => self.recurrence(*spec, h, ins, g, need)?,
            Op::RecurrenceGrad { .. } => {
                return Err("autodiff: the second derivative of a recurrence is not supported".into())
            }
            // `lse` is a helper of `Attention`, whose rule is the full derivative.
            Op::AttnLse { .. }
            | Op::Input { .. }
            | Op::Param { .. }
            | Op::State { .. }
            | Op::Scalar { .. }
            | Op::OneHot { .. }
            | Op::DropoutMask { .. }
            | Op::Assign => vec![None; ins.len()],
        })
    }

    /// `o = attention(q, k, v; lse, mask, step)`: `dq` from `AttentionGrad{Q}`, `dk` and `dv`
    /// from `AttentionGrad{KV}` (one kernel for both); `lse`, mask and step get none. Each
    /// part is padded to its operand's columns where the heads fill only some of them (a
    /// packed in-projection): the pads of one tensor's q, k and v then tile its last axis and
    /// [`Reverse::join_pads`] stores them as one `Concat`. A packed `k ‖ v` operand (k and v
    /// the same value, v's heads right after k's) takes `dk ‖ dv` whole.
    fn attention(
        &mut self,
        spec: AttnSpec,
        o: Value,
        ins: &[Value],
        g: Value,
        need: &[bool],
    ) -> Result<Vec<Option<Value>>, String> {
        let hd = spec.heads;
        let mut operands = vec![ins[0], ins[1], ins[2], o, g, ins[3]];
        operands.extend_from_slice(&ins[4..]);
        let mut parts = vec![None, None, None];
        if need[0] {
            let dq = self.b.add(Op::AttentionGrad { spec, wrt: AttnWrt::Q }, &operands)?;
            parts[0] = Some(self.embed_columns(dq, ins[0], hd.cols[0])?);
        }
        if need[1] || need[2] {
            let dkv = self.b.add(Op::AttentionGrad { spec, wrt: AttnWrt::KV }, &operands)?;
            let (wk, wv) = (hd.width(1), hd.width(2));
            if ins[1] == ins[2] && hd.cols[2] == hd.cols[1] + wk {
                parts[1] = Some(self.embed_columns(dkv, ins[1], hd.cols[1])?);
            } else {
                if need[1] {
                    let dk = self.b.add(Op::Slice { axis: 2, start: 0, len: wk }, &[dkv])?;
                    parts[1] = Some(self.embed_columns(dk, ins[1], hd.cols[1])?);
                }
                if need[2] {
                    let dv = self.b.add(Op::Slice { axis: 2, start: wk, len: wv }, &[dkv])?;
                    parts[2] = Some(self.embed_columns(dv, ins[2], hd.cols[2])?);
                }
            }
        }
        parts.resize(ins.len(), None);
        Ok(parts)
    }

    /// `part` (`[B, T, w]`) as the gradient of `operand` (`[B, T, C]`), whose columns
    /// `at .. at + w` it is: padded with zeros to `C` columns where `w < C`.
    fn embed_columns(&mut self, part: Value, operand: Value, at: usize) -> Result<Value, String> {
        let c = self.fixed_extent(operand, 2)?;
        let w = self.fixed_extent(part, 2)?;
        if w == c {
            return Ok(part);
        }
        self.b.add(Op::Pad { axis: 2, before: at, after: c - at - w }, &[part])
    }

    /// `hs = recurrence(xp, w_hh, b_hh, (h0))`: one `RecurrenceGrad` runs the steps backwards
    /// and gives `dxp` and `dgh` (the gradient of `gh = W_hh·h_prev + b_hh` at every step); the
    /// weight and bias gradients are then ordinary reductions outside the loop: `dW_hh` the
    /// matmul gradient of `h_prev·W_hhᵀ` (a `sum_batch` product over `B` of `dghᵀ·conj(h_prev)`),
    /// `db_hh` the sum of `dgh` over `B` and `T` (by [`Reverse::fit`]). Longer than the chunk
    /// length: [`Reverse::recurrence_chunked`].
    fn recurrence(
        &mut self,
        spec: RnnSpec,
        hs: Value,
        ins: &[Value],
        g: Value,
        need: &[bool],
    ) -> Result<Vec<Option<Value>>, String> {
        let t = self.fixed_extent(ins[0], 1)?;
        // A recurrence with its own `h0` is already a chunk (and is never chunked again).
        if let Some(k) = self.rnn_chunk.filter(|&k| k < t && !spec.init) {
            return self.recurrence_chunked(spec, hs, ins, g, need, k);
        }
        let h0 = ins.get(3).copied();
        let r = self.bptt(spec, [ins[0], ins[1], ins[2]], hs, g, h0, need[0], need[1] || need[2], need[1])?;
        let mut parts = vec![r.dx, r.dw, r.dgh.filter(|_| need[2])];
        if h0.is_some() {
            parts.push(r.dh0.filter(|_| need[3]));
        }
        Ok(parts)
    }

    /// Chunked back-propagation through time, last chunk (in step order) first. Chunk
    /// `[s, e)` of the times recomputes its states with a `Recurrence` from the checkpoint (the
    /// forward's state before its first step, `hs[s-1]`, or `hs[e]` reversed; none for the
    /// first chunk), back-propagates `dhs[s..e]` plus the carry of the chunk after it (added
    /// at its last step) and hands its `h0` gradient on as the next carry. `dW_hh` and `db_hh`
    /// are sums over the chunks; `dxp` the concatenation of the chunks' `dx`, recorded as a
    /// [`Split`] so the input projection's weight and bias gradients run chunk by chunk too.
    fn recurrence_chunked(
        &mut self,
        spec: RnnSpec,
        hs: Value,
        ins: &[Value],
        g: Value,
        need: &[bool],
        k: usize,
    ) -> Result<Vec<Option<Value>>, String> {
        let (xp, w, bias) = (ins[0], ins[1], ins[2]);
        let t = self.fixed_extent(xp, 1)?;
        let sw = spec.cell.states() * spec.hidden;
        let batch = self.ty(hs).shape.0[0];
        let mut chunks: Vec<(usize, usize)> = (0..t).step_by(k).map(|s| (s, (s + k).min(t))).collect();
        if !spec.reverse {
            chunks.reverse();
        }
        let (mut carry, mut dw, mut db) = (None, None, None);
        let mut dxs = Vec::new();
        for (s, e) in chunks {
            let len = e - s;
            let first = if spec.reverse { e == t } else { s == 0 };
            let h0 = if first {
                None
            } else {
                let at = if spec.reverse { e } else { s - 1 };
                let h = self.b.add(Op::Slice { axis: 1, start: at, len: 1 }, &[hs])?;
                Some(self.b.reshape(h, Shape(vec![batch, Dim::Fixed(sw)]))?)
            };
            let xc = self.time_slice(xp, s, len, PROJECTION_DEPTH)?;
            let mut operands = vec![xc, w, bias];
            operands.extend(h0);
            let chunk_spec = RnnSpec { init: h0.is_some(), ..spec };
            let hc = self.b.add(Op::Recurrence { spec: chunk_spec }, &operands)?;
            self.recomputed.push(hc);
            let dhs = self.time_chunk(g, s, len)?;
            let carried = match carry {
                Some(c) => {
                    let c = self.b.reshape(c, Shape(vec![batch, Dim::Fixed(1), Dim::Fixed(sw)]))?;
                    let before = if spec.reverse { 0 } else { len - 1 };
                    Some(self.b.add(Op::Pad { axis: 1, before, after: len - 1 - before }, &[c])?)
                }
                None => None,
            };
            let dhc = match (dhs, carried) {
                (Some(d), Some(c)) => self.b.add2(d, c)?,
                (Some(d), None) => d,
                (None, Some(c)) => c,
                (None, None) => self.zeros(TensorType::new(
                    DType::C64,
                    Shape(vec![batch, Dim::Fixed(len), Dim::Fixed(sw)]),
                ))?,
            };
            let r = self.bptt(spec, [xc, w, bias], hc, dhc, h0, need[0], need[1] || need[2], need[1])?;
            carry = r.dh0;
            if let Some(dx) = r.dx {
                dxs.push((s, dx));
            }
            if let Some(d) = r.dw {
                dw = Some(match dw {
                    Some(a) => self.b.add2(a, d)?,
                    None => d,
                });
            }
            if let (true, Some(dgh)) = (need[2], r.dgh) {
                let d = self.fit(dgh, bias)?;
                db = Some(match db {
                    Some(a) => self.b.add2(a, d)?,
                    None => d,
                });
            }
        }
        let dx = if dxs.is_empty() {
            None
        } else {
            dxs.sort_by_key(|&(s, _)| s);
            let pieces: Vec<Value> = dxs.iter().map(|&(_, v)| v).collect();
            let whole = self.b.add(Op::Concat { axis: 1 }, &pieces)?;
            self.splits.insert(whole, Split { axis: 1, pieces: dxs });
            Some(whole)
        };
        Ok(vec![dx, dw, db])
    }

    /// `v[:, s..s + len]` of a forward `[B, T, ·]` value, recomputed from the same slice of its
    /// operands where `v` is elementwise or a matmul whose rows are the time steps (the input
    /// projection `x·W_ihᵀ + b_ih`), so that a chunk reads `[B, K, ·]` and the forward's whole
    /// `[B, T, G·H]` projection dies with the forward recurrence. Operands broadcast over time
    /// are read whole; anything else, or anything `depth` producers up, is sliced as it is.
    fn time_slice(&mut self, v: Value, s: usize, len: usize, depth: usize) -> Result<Value, String> {
        let node = self.b.graph.node(v).clone();
        let rank = self.ty(v).shape.rank();
        let recompute = depth > 0
            && node.origin.role == Role::Forward
            && rank == 3
            && match node.op {
                Op::Unary(_) | Op::Binary(_) => true,
                Op::MatMul { trans: [false, _], sum_batch: false, .. } => {
                    self.ty(node.inputs[0]).shape.rank() == 3 && self.ty(node.inputs[1]).shape.rank() == 2
                }
                _ => false,
            };
        if !recompute {
            let slice = self.b.add(Op::Slice { axis: 1, start: s, len }, &[v])?;
            self.recomputed.push(slice);
            return Ok(slice);
        }
        let mut operands = Vec::with_capacity(node.inputs.len());
        for (k, &x) in node.inputs.iter().enumerate() {
            let ty = self.ty(x).shape.clone();
            // A matmul's weight, or an operand broadcast over the time axis, is read whole.
            let whole = (matches!(node.op, Op::MatMul { .. }) && k == 1)
                || ty.rank() < rank
                || ty.0[1] == Dim::Fixed(1);
            operands.push(if whole { x } else { self.time_slice(x, s, len, depth - 1)? });
        }
        let c = self.b.add(node.op.clone(), &operands)?;
        self.recomputed.push(c);
        Ok(c)
    }

    /// Steps `s..s + len` of the state gradient `g` (`[B, T, S·H]`), `None` where they are all
    /// zero. A gradient that is a zero padding along time (a `returns = last` slice's) is cut
    /// from its unpadded part, so the padded `[B, T, S·H]` value is never stored.
    fn time_chunk(&mut self, g: Value, s: usize, len: usize) -> Result<Option<Value>, String> {
        let node = self.b.graph.node(g);
        let Op::Pad { axis: 1, before, .. } = node.op else {
            return Ok(Some(self.b.add(Op::Slice { axis: 1, start: s, len }, &[g])?));
        };
        let inner = node.inputs[0];
        let n = self.fixed_extent(inner, 1)?;
        let (lo, hi) = (s.max(before), (s + len).min(before + n));
        if lo >= hi {
            return Ok(None);
        }
        let mut part = inner;
        if hi - lo < n {
            part = self.b.add(Op::Slice { axis: 1, start: lo - before, len: hi - lo }, &[inner])?;
        }
        if hi - lo < len {
            part = self.b.add(Op::Pad { axis: 1, before: lo - s, after: s + len - hi }, &[part])?;
        }
        Ok(Some(part))
    }

    /// One `RecurrenceGrad` over `hs = recurrence(xp, w_hh, b_hh, (h0))` with state gradient
    /// `dhs`: `dxp` (when `need_x`), `dgh` (when `need_gh`), `dW_hh` (when `need_w`) and, with
    /// an `h0`, its gradient (the state part of the last step's row, see `Op::RecurrenceGrad`).
    #[allow(clippy::too_many_arguments)]
    fn bptt(
        &mut self,
        spec: RnnSpec,
        [xp, w, bias]: [Value; 3],
        hs: Value,
        dhs: Value,
        h0: Option<Value>,
        need_x: bool,
        need_gh: bool,
        need_w: bool,
    ) -> Result<Bptt, String> {
        let spec = RnnSpec { init: h0.is_some(), ..spec };
        let (h, gw, sw) = (spec.hidden, spec.cell.gates() * spec.hidden, spec.cell.states() * spec.hidden);
        let t = self.fixed_extent(xp, 1)?;
        let mut operands = vec![xp, w, bias, hs, dhs];
        operands.extend(h0);
        let grad = self.b.add(Op::RecurrenceGrad { spec }, &operands)?;
        let dx = self.maybe(need_x, Op::Slice { axis: 2, start: 0, len: gw }, &[grad])?;
        let mut r = Bptt { dx, dgh: None, dw: None, dh0: None };
        if need_gh || need_w {
            let dgh = self.b.add(Op::Slice { axis: 2, start: gw, len: gw }, &[grad])?;
            r.dgh = Some(dgh);
            if need_w {
                // The state each step started from: the previous step's `h` (zero, or `h0`,
                // first).
                let mut hh = hs;
                if spec.cell.states() > 1 {
                    hh = self.b.add(Op::Slice { axis: 2, start: 0, len: h }, &[hh])?;
                }
                let prev = match h0 {
                    None => {
                        let (before, after, start) = if spec.reverse { (0, 1, 1) } else { (1, 0, 0) };
                        let padded = self.b.add(Op::Pad { axis: 1, before, after }, &[hh])?;
                        self.b.add(Op::Slice { axis: 1, start, len: t }, &[padded])?
                    }
                    Some(h0) => {
                        let batch = self.ty(h0).shape.0[0];
                        let mut first =
                            self.b.reshape(h0, Shape(vec![batch, Dim::Fixed(1), Dim::Fixed(sw)]))?;
                        if spec.cell.states() > 1 {
                            first = self.b.add(Op::Slice { axis: 2, start: 0, len: h }, &[first])?;
                        }
                        if t == 1 {
                            first
                        } else {
                            let start = usize::from(spec.reverse);
                            let rest = self.b.add(Op::Slice { axis: 1, start, len: t - 1 }, &[hh])?;
                            let parts = if spec.reverse { [rest, first] } else { [first, rest] };
                            self.b.add(Op::Concat { axis: 1 }, &parts)?
                        }
                    }
                };
                r.dw = self
                    .matmul([false, true], [false, false], false, prev, w, dgh, &[false, true])?
                    .swap_remove(1);
            }
        }
        if let Some(h0) = h0 {
            let last = spec.time(t - 1, t);
            let row = self.b.add(Op::Slice { axis: 1, start: last, len: 1 }, &[grad])?;
            let d = self.b.add(Op::Slice { axis: 2, start: 2 * gw, len: sw }, &[row])?;
            let shape = self.ty(h0).shape.clone();
            r.dh0 = Some(self.b.reshape(d, shape)?);
        }
        Ok(r)
    }

    fn maybe(&mut self, needed: bool, op: Op, operands: &[Value]) -> Result<Option<Value>, String> {
        if needed {
            Ok(Some(self.b.add(op, operands)?))
        } else {
            Ok(None)
        }
    }

    fn fixed_extent(&self, v: Value, axis: usize) -> Result<usize, String> {
        self.ty(v).shape.0[axis].fixed().ok_or_else(|| format!("autodiff: axis {axis} of {v} is the batch"))
    }

    /// The last two extents of a 4-D value (spatial size or kernel size).
    fn spatial(&self, v: Value) -> Result<[usize; 2], String> {
        let r = self.ty(v).shape.rank();
        Ok([self.fixed_extent(v, r - 2)?, self.fixed_extent(v, r - 1)?])
    }

    fn unary(&mut self, u: UnaryOp, x: Value, y: Value, g: Value) -> Result<Option<Value>, String> {
        use BinaryOp::{Complex, Div, Mul, Sub};
        use UnaryOp::*;
        let complex = self.is_complex(x);
        let r = match u {
            Neg => self.un(Neg, g)?,
            Conj => self.conj(g)?,
            Real if complex => self.un(ToComplex, g)?,
            Real => g,
            Imag if complex => {
                let zero = self.scalar(0.0);
                self.bin(Complex, zero, g)?
            }
            Imag | Step | StopGrad => return Ok(None),
            Angle if !complex => return Ok(None),
            Abs => {
                let safe = self.safe_denominator(y)?;
                let unit = self.bin(Div, x, safe)?;
                self.bin(Mul, g, unit)?
            }
            Abs2 => {
                let gx = self.bin(Mul, g, x)?;
                self.b.scale(gx, 2.0)?
            }
            Angle => {
                // ∂θ/∂x = -y/|z|², ∂θ/∂y = x/|z|²  ⇒  ḡ_z = ḡ·(i z)/|z|².
                let a2 = self.un(Abs2, x)?;
                let safe = self.safe_denominator(a2)?;
                let (re, im) = (self.un(Real, x)?, self.un(Imag, x)?);
                let neg_im = self.un(Neg, im)?;
                let iz = self.bin(Complex, neg_im, re)?;
                let giz = self.bin(Mul, iz, g)?;
                self.bin(Div, giz, safe)?
            }
            ToComplex => self.un(Real, g)?,
            Exp => self.bin(Mul, g, y)?,
            Log => self.bin(Div, g, x)?,
            Sqrt => {
                let half = self.b.scale(g, 0.5)?;
                self.bin(Div, half, y)?
            }
            Rsqrt => {
                let y2 = self.bin(Mul, y, y)?;
                let y3 = self.bin(Mul, y2, y)?;
                let d = self.b.scale(y3, -0.5)?;
                self.bin(Mul, g, d)?
            }
            Recip => {
                let y2 = self.bin(Mul, y, y)?;
                let d = self.un(Neg, y2)?;
                self.bin(Mul, g, d)?
            }
            Sin => {
                let c = self.un(Cos, x)?;
                self.bin(Mul, g, c)?
            }
            Cos => {
                let s = self.un(Sin, x)?;
                let d = self.un(Neg, s)?;
                self.bin(Mul, g, d)?
            }
            Tanh => {
                let one = self.scalar(1.0);
                let y2 = self.bin(Mul, y, y)?;
                let d = self.bin(Sub, one, y2)?;
                self.bin(Mul, g, d)?
            }
            Sigmoid => {
                let one = self.scalar(1.0);
                let om = self.bin(Sub, one, y)?;
                let d = self.bin(Mul, y, om)?;
                self.bin(Mul, g, d)?
            }
            Relu => {
                let s = self.un(Step, x)?;
                self.bin(Mul, g, s)?
            }
            Gelu => {
                let d = self.un(GeluGrad, x)?;
                self.bin(Mul, g, d)?
            }
            GeluGrad => {
                // gelu''(x) = φ(x)·(2 − x²), φ the standard normal density.
                let x2 = self.bin(Mul, x, x)?;
                let e = self.b.scale(x2, -0.5)?;
                let e = self.un(Exp, e)?;
                let phi = self.b.scale(e, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
                let two = self.scalar(2.0);
                let k = self.bin(Sub, two, x2)?;
                let d = self.bin(Mul, phi, k)?;
                self.bin(Mul, g, d)?
            }
            GeluTanh => {
                let d = self.un(GeluTanhGrad, x)?;
                self.bin(Mul, g, d)?
            }
            GeluTanhGrad => {
                let d = self.gelu_second_derivative(x)?;
                self.bin(Mul, g, d)?
            }
        };
        Ok(Some(r))
    }

    /// `gelu''(x)` for the tanh form: with `u = c(x + a x³)`, `t = tanh u`:
    /// `(1 - t²)·[u' + ½x(u'' - 2t u'²)]`, `u' = c(1 + 3a x²)`, `u'' = 6ca x`.
    fn gelu_second_derivative(&mut self, x: Value) -> Result<Value, String> {
        use BinaryOp::{Add, Mul, Sub};
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let a = 0.044_715;
        let x2 = self.bin(Mul, x, x)?;
        let cx2 = self.b.scale(x2, c * a)?;
        let cc = self.scalar(c);
        let inner = self.bin(Add, cx2, cc)?;
        let u = self.bin(Mul, x, inner)?;
        let t = self.un(UnaryOp::Tanh, u)?;
        let one = self.scalar(1.0);
        let t2 = self.bin(Mul, t, t)?;
        let s = self.bin(Sub, one, t2)?;
        let du0 = self.b.scale(x2, 3.0 * c * a)?;
        let du = self.bin(Add, du0, cc)?;
        let ddu = self.b.scale(x, 6.0 * c * a)?;
        let du2 = self.bin(Mul, du, du)?;
        let tdu2 = self.bin(Mul, t, du2)?;
        let tdu2x2 = self.b.scale(tdu2, 2.0)?;
        let diff = self.bin(Sub, ddu, tdu2x2)?;
        let halfx = self.b.scale(x, 0.5)?;
        let term = self.bin(Mul, halfx, diff)?;
        let br = self.bin(Add, du, term)?;
        self.bin(Mul, s, br)
    }

    fn binary(
        &mut self,
        op: BinaryOp,
        a: Value,
        b: Value,
        y: Value,
        g: Value,
        need: &[bool],
    ) -> Result<Vec<Option<Value>>, String> {
        use BinaryOp::*;
        Ok(match op {
            Add => vec![Some(g), Some(g)],
            Sub => {
                let nb = if need[1] { Some(self.un(UnaryOp::Neg, g)?) } else { None };
                vec![Some(g), nb]
            }
            Mul => {
                let ga = if need[0] {
                    let cb = self.conj(b)?;
                    Some(self.bin(Mul, g, cb)?)
                } else {
                    None
                };
                let gb = if need[1] {
                    let ca = self.conj(a)?;
                    Some(self.bin(Mul, g, ca)?)
                } else {
                    None
                };
                vec![ga, gb]
            }
            Div => {
                let cb = self.conj(b)?;
                let ga = self.bin(Div, g, cb)?;
                let gb = if need[1] {
                    let cy = self.conj(y)?;
                    let t = self.bin(Mul, ga, cy)?;
                    Some(self.un(UnaryOp::Neg, t)?)
                } else {
                    None
                };
                vec![Some(ga), gb]
            }
            Max => {
                let zero = self.scalar(0.0);
                let b_wins = self.bin(Greater, b, a)?;
                let ga = if need[0] { Some(self.b.add(Op::Select, &[b_wins, zero, g])?) } else { None };
                let gb = if need[1] { Some(self.b.add(Op::Select, &[b_wins, g, zero])?) } else { None };
                vec![ga, gb]
            }
            Complex => {
                let ga = if need[0] { Some(self.un(UnaryOp::Real, g)?) } else { None };
                let gb = if need[1] { Some(self.un(UnaryOp::Imag, g)?) } else { None };
                vec![ga, gb]
            }
            Greater | Equal => vec![None, None],
        })
    }

    /// Sum: broadcast back. Max/MaxMag: split the gradient evenly between the elements equal
    /// to the result (a valid subgradient; ties have measure zero on continuous data).
    fn reduce(
        &mut self,
        op: ReduceOp,
        axes: &[usize],
        x: Value,
        y: Value,
        g: Value,
    ) -> Result<Value, String> {
        use BinaryOp::{Div, Equal, Mul};
        match op {
            ReduceOp::Sum => {
                let s = self.ty(x).shape.clone();
                return self.b.expand(g, s);
            }
            ReduceOp::Max | ReduceOp::MaxMag => {}
        }
        let mask = if self.is_complex(x) {
            let (xr, yr) = (self.un(UnaryOp::Real, x)?, self.un(UnaryOp::Real, y)?);
            let (xi, yi) = (self.un(UnaryOp::Imag, x)?, self.un(UnaryOp::Imag, y)?);
            let er = self.bin(Equal, xr, yr)?;
            let ei = self.bin(Equal, xi, yi)?;
            self.bin(Mul, er, ei)?
        } else {
            self.bin(Equal, x, y)?
        };
        let count = self.b.sum(mask, axes)?;
        let share = self.bin(Div, mask, count)?;
        self.bin(Mul, share, g)
    }

    /// Gradients of `C = op(A)·op(B)`: `ḡ_{A'} = ḡ·B'^H`, `ḡ_{B'} = A'^H·ḡ`, mapped back
    /// through each operand's transpose and conjugation flags, batch by batch. A 2-D operand
    /// broadcast over the other's batch axes gets the sum over the batches of its gradient,
    /// which is itself one `sum_batch` matmul; the gradients of a `sum_batch` product are
    /// batched products with the 2-D `ḡ` broadcast. So every gradient stays a `MatMul`.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &mut self,
        trans: [bool; 2],
        conj: [bool; 2],
        sum_batch: bool,
        a: Value,
        b: Value,
        g: Value,
        need: &[bool],
    ) -> Result<Vec<Option<Value>>, String> {
        let ([ta, tb], [ca, cb]) = (trans, conj);
        let (a2, b2) = (self.ty(a).shape.rank() == 2, self.ty(b).shape.rank() == 2);
        // Sum over the batches exactly where the operand was broadcast.
        let sa = !sum_batch && a2 && !b2;
        let sb = !sum_batch && b2 && !a2;
        let mm = |trans, conj, sum_batch| Op::MatMul { trans, conj, sum_batch };
        let split = self.splits.get(&g).filter(|s| s.axis + 2 == self.ty(g).shape.rank()).cloned();
        let ga = if !need[0] {
            None
        } else if let Some(split) = split.clone().filter(|_| !ta && !sa && !sum_batch) {
            // `g` is chunked along its rows, which are `ḡ_A`'s rows: one product per chunk,
            // concatenated (and recorded as chunked again), so the whole `g` is never read.
            let op = mm([false, !tb], [ca, xor(!cb, ca)], sa);
            let mut pieces = Vec::new();
            for &(start, piece) in &split.pieces {
                pieces.push((start, self.b.add(op.clone(), &[piece, b])?));
            }
            let parts: Vec<Value> = pieces.iter().map(|&(_, v)| v).collect();
            let whole = self.b.add(Op::Concat { axis: split.axis }, &parts)?;
            self.splits.insert(whole, Split { axis: split.axis, pieces });
            Some(whole)
        } else if !ta {
            self.maybe(true, mm([false, !tb], [ca, xor(!cb, ca)], sa), &[g, b])?
        } else {
            self.maybe(true, mm([tb, true], [xor(!cb, ca), ca], sa), &[b, g])?
        };
        let gb = if !need[1] {
            None
        } else if let Some(split) = split.filter(|_| !sum_batch) {
            // `g` is chunked along its rows, which `ḡ_B` contracts: one product per chunk with
            // the matching rows of `A`, summed.
            let rows = self.ty(a).shape.rank() - if ta { 1 } else { 2 };
            let mut acc = None;
            for (start, piece) in split.pieces {
                let len = self.fixed_extent(piece, split.axis)?;
                let ak = self.b.add(Op::Slice { axis: rows, start, len }, &[a])?;
                let part = if !tb {
                    self.b.add(mm([!ta, false], [xor(!ca, cb), cb], sb), &[ak, piece])?
                } else {
                    self.b.add(mm([true, ta], [cb, xor(!ca, cb)], sb), &[piece, ak])?
                };
                acc = Some(match acc {
                    Some(x) => self.b.add2(x, part)?,
                    None => part,
                });
            }
            acc
        } else if !tb {
            self.maybe(true, mm([!ta, false], [xor(!ca, cb), cb], sb), &[a, g])?
        } else {
            self.maybe(true, mm([true, ta], [cb, xor(!ca, cb)], sb), &[g, a])?
        };
        Ok(vec![ga, gb])
    }
}
