//! Cast placement: real values stay real (half the bytes) as long as possible; a real→complex
//! cast is folded into the consumer that first needs complex numbers, and materialised only
//! where a consumer needs complex storage (an FFT, an imaginary part, an assign, an output).
//!
//! The pass walks the graph once, in order. A `ToComplex(x)` is not copied: its value is
//! held *pending* as "`x`, read as `x + 0i`". At each user the pending cast is
//! - *folded* when the user accepts mixed operands and still yields the same complex type
//!   (elementwise arithmetic, `Select`, the matmul/convolution family, which then compute two
//!   real products instead of four);
//! - *sunk* past the user when the user computes the same thing on the real part alone
//!   (`Neg`, views and data movement, sums, contractions with real weights, arithmetic with
//!   real operands): the user is emitted on real data and its own value becomes pending;
//! - *materialised* otherwise, once, shared by every such user.
//!
//! Mixed real/complex operands written directly by lowering are reported as folded casts too.

use super::rewrite::{eliminate_dead, Rewriter};
use super::CastSite;
use crate::ir::builder::infer;
use crate::ir::*;

/// A cast waiting for a consumer: the new real value, and its materialised copy once made.
#[derive(Clone, Copy)]
struct Pending {
    real: Value,
    materialised: Option<Value>,
}

/// How a user treats a pending cast operand.
enum Treatment {
    Fold,
    Sink,
    Materialise,
}

fn treatment(op: &Op, result: &TensorType, folded: Result<TensorType, String>) -> Treatment {
    let Ok(t) = folded else { return Treatment::Materialise };
    if needs_complex_storage(op) {
        return Treatment::Materialise;
    }
    if t == *result {
        return Treatment::Fold;
    }
    let real_result = t.shape == result.shape && t.dtype == DType::F32 && result.dtype == DType::C64;
    if real_result && sinks(op) {
        Treatment::Sink
    } else {
        Treatment::Materialise
    }
}

/// Whether `op` must read a pending cast as stored complex numbers: an FFT, an imaginary part,
/// an assign or a concatenation of stored pieces.
fn needs_complex_storage(op: &Op) -> bool {
    match op {
        Op::Fft { .. } | Op::Assign | Op::Concat { .. } | Op::Unary(UnaryOp::Imag) => true,
        Op::Unary(
            UnaryOp::Neg
            | UnaryOp::Conj
            | UnaryOp::Real
            | UnaryOp::Abs
            | UnaryOp::Abs2
            | UnaryOp::Angle
            | UnaryOp::ToComplex
            | UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Recip
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Relu
            | UnaryOp::Step
            | UnaryOp::Gelu
            | UnaryOp::GeluGrad
            | UnaryOp::GeluTanh
            | UnaryOp::GeluTanhGrad
            | UnaryOp::StopGrad,
        )
        | Op::Input { .. }
        | Op::Param { .. }
        | Op::State { .. }
        | Op::Scalar { .. }
        | Op::Binary(_)
        | Op::Select
        | Op::Reduce { .. }
        | Op::Reshape
        | Op::Expand
        | Op::Permute { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::MatMul { .. }
        | Op::Conv2d { .. }
        | Op::ConvTranspose2d { .. }
        | Op::Conv2dWeightGrad { .. }
        | Op::AttnLse { .. }
        | Op::Attention { .. }
        | Op::AttentionGrad { .. }
        | Op::Recurrence { .. }
        | Op::RecurrenceGrad { .. }
        | Op::OneHot { .. }
        | Op::Gather
        | Op::ScatterAdd { .. }
        | Op::DropoutMask { .. } => false,
    }
}

/// Whether a cast may sink past `op` when `op` on the real part alone gives the real part of
/// the result: everything but a max (the complex max compares magnitudes, not real parts).
fn sinks(op: &Op) -> bool {
    match op {
        Op::Reduce { op: ReduceOp::Max, .. } => false,
        Op::Reduce { op: ReduceOp::Sum | ReduceOp::MaxMag, .. } => true,
        Op::Input { .. }
        | Op::Param { .. }
        | Op::State { .. }
        | Op::Scalar { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Select
        | Op::Reshape
        | Op::Expand
        | Op::Permute { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Concat { .. }
        | Op::MatMul { .. }
        | Op::Conv2d { .. }
        | Op::ConvTranspose2d { .. }
        | Op::Conv2dWeightGrad { .. }
        | Op::Fft { .. }
        | Op::OneHot { .. }
        | Op::Gather
        | Op::ScatterAdd { .. }
        | Op::DropoutMask { .. }
        | Op::Assign => true,
        // Attention's weights are a softmax of a nonlinear score: a real part alone does not
        // give the real part of the result.
        Op::AttnLse { .. } | Op::Attention { .. } | Op::AttentionGrad { .. } => false,
        // A recurrence's cell is nonlinear in its operands.
        Op::Recurrence { .. } | Op::RecurrenceGrad { .. } => false,
    }
}

/// Places and folds real→complex casts; returns every cast site (lines are filled in by
/// [`super::PipelineFacts::set_lines`]).
pub fn run(g: &mut Graph) -> Result<Vec<CastSite>, String> {
    let mut sites = Vec::new();
    let (old, _) = eliminate_dead(g, &[])?;
    let mut rw = Rewriter::new(&old);
    let mut pending: Vec<Option<Pending>> = vec![None; old.nodes.len()];
    for v in old.nodes.handles() {
        let n = old.node(v);
        if matches!(n.op, Op::Unary(UnaryOp::ToComplex)) {
            let x = n.inputs[0];
            let real = match pending[x.index()] {
                Some(p) => p.real,
                None => rw.mapped(x)?,
            };
            pending[v.index()] = Some(Pending { real, materialised: None });
            continue;
        }
        if n.inputs.iter().all(|i| pending[i.index()].is_none()) {
            let nv = rw.copy(v)?;
            if is_mixed(&old, n) {
                sites.push(site(&old, v, nv, format!("folded into {} (mixed operands)", n.op.mnemonic())));
            }
            continue;
        }
        // Operands with the pending casts read as their real values.
        let real_inputs: Vec<Value> = n
            .inputs
            .iter()
            .map(|&i| match pending[i.index()] {
                Some(p) => Ok(p.real),
                None => rw.mapped(i),
            })
            .collect::<Result<_, String>>()?;
        let folded = {
            let tys: Vec<&TensorType> = real_inputs.iter().map(|&i| rw.new.ty(i)).collect();
            infer(&n.op, &tys, Some(&n.ty.shape))
        };
        match treatment(&n.op, &n.ty, folded) {
            Treatment::Fold => {
                let nv = rw.emit(n.op.clone(), real_inputs, v, Some(&n.ty.shape))?;
                rw.map.set(v, nv);
                sites.push(site(&old, v, nv, format!("folded into {}", n.op.mnemonic())));
            }
            Treatment::Sink => {
                let nv = rw.emit(n.op.clone(), real_inputs, v, Some(&n.ty.shape))?;
                pending[v.index()] = Some(Pending { real: nv, materialised: None });
            }
            Treatment::Materialise => {
                let mut inputs = Vec::with_capacity(n.inputs.len());
                for &i in &n.inputs {
                    inputs.push(materialise(&mut rw, &mut pending, &mut sites, i, &n.op)?);
                }
                let nv = rw.emit(n.op.clone(), inputs, v, Some(&n.ty.shape))?;
                rw.map.set(v, nv);
            }
        }
    }
    let mut roots: Vec<Value> = old.outputs.iter().map(|o| o.value).collect();
    roots.extend(old.loss);
    for r in roots {
        if pending[r.index()].is_some() {
            let what = Op::Input { name: "the output".into() };
            materialise(&mut rw, &mut pending, &mut sites, r, &what)?;
        }
    }
    *g = rw.finish()?.0;
    Ok(sites)
}

/// The complex value of old value `i`: its mapped value, or its pending cast materialised.
fn materialise(
    rw: &mut Rewriter<'_>,
    pending: &mut [Option<Pending>],
    sites: &mut Vec<CastSite>,
    i: Value,
    user: &Op,
) -> Result<Value, String> {
    let Some(p) = pending[i.index()] else { return rw.mapped(i) };
    if let Some(m) = p.materialised {
        return Ok(m);
    }
    let m = rw.emit(Op::Unary(UnaryOp::ToComplex), vec![p.real], i, None)?;
    pending[i.index()] = Some(Pending { real: p.real, materialised: Some(m) });
    rw.map.set(i, m);
    let before = match user {
        Op::Input { name } => name.clone(),
        op => op.mnemonic(),
    };
    sites.push(site(rw.old, i, m, format!("materialised before {before}")));
    Ok(m)
}

fn is_mixed(g: &Graph, n: &Node) -> bool {
    let reads_complex_arith = n.op.is_elementwise() || n.op.is_contraction();
    let data = if matches!(n.op, Op::Select) { &n.inputs[1..] } else { &n.inputs[..] };
    reads_complex_arith
        && !matches!(n.op, Op::Binary(BinaryOp::Complex))
        && n.ty.dtype == DType::C64
        && data.iter().any(|&i| g.ty(i).dtype == DType::F32 && g.ty(i).shape.rank() > 0)
}

/// A cast site at old value `old_v` (for its span), now represented by new value `new_v`.
fn site(g: &Graph, old_v: Value, new_v: Value, what: String) -> CastSite {
    CastSite { value: Some(new_v), line: 0, span: g.span(old_v), what }
}
