//! Evaluation of a whole graph, node by node in arena order, with the semantics of `ir::op`.

use super::attention::AttnOperands;
use super::contract::{dft, matmul, pair, planes, run_pair, ConvDims};
use super::elementwise::{binary, select, unary};
use super::layout::{broadcast_map, strided_offsets, strides};
use super::tensor::{Tensor, TensorData};
use crate::ir::*;
use num_complex::Complex64;
use std::collections::HashMap;

/// Every node's value (indexed by [`Value::index`]) for batch size `batch`, given the values
/// of the leaves (`Input`, `Param`, `State`). An `Assign` node's value is the new content of
/// its target; targets themselves keep their old value throughout the evaluation.
pub fn evaluate(
    g: &Graph,
    batch: usize,
    leaves: &HashMap<Value, Tensor>,
) -> Result<Vec<Option<Tensor>>, String> {
    let mut vals: Vec<Option<Tensor>> = Vec::with_capacity(g.nodes.len());
    for (h, node) in g.nodes.iter() {
        let shape = node.ty.shape.resolve(batch);
        let ctx = || format!("{h} = {}{}", node.op.mnemonic(), crate::ir::print::attrs(&node.op));
        let data = eval_node(h, node, &vals, &shape, batch, leaves).map_err(|e| format!("{}: {e}", ctx()))?;
        let data = coerce(data, node.ty.dtype).map_err(|e| format!("{}: {e}", ctx()))?;
        if data.len() != shape.iter().product::<usize>() {
            return Err(format!("{}: made {} elements for shape {shape:?}", ctx(), data.len()));
        }
        vals.push(Some(Tensor { shape, data }));
    }
    Ok(vals)
}

/// Converts a result to the node's dtype where the op's mixed-dtype rule allows it.
fn coerce(data: TensorData, dtype: DType) -> Result<TensorData, String> {
    match (data, dtype) {
        (TensorData::Real(v), DType::C64) => {
            Ok(TensorData::Complex(v.into_iter().map(|x| Complex64::new(x, 0.0)).collect()))
        }
        (d, t) if d.dtype() == t => Ok(d),
        (d, t) => Err(format!("computed {} but the node is {t}", d.dtype())),
    }
}

fn operand(vals: &[Option<Tensor>], v: Value) -> Result<&Tensor, String> {
    vals.get(v.index()).and_then(|t| t.as_ref()).ok_or_else(|| format!("operand {v} has no value"))
}

fn eval_node(
    h: Value,
    node: &Node,
    vals: &[Option<Tensor>],
    out: &[usize],
    batch: usize,
    leaves: &HashMap<Value, Tensor>,
) -> Result<TensorData, String> {
    let ins: Vec<&Tensor> = node.inputs.iter().map(|&v| operand(vals, v)).collect::<Result<_, _>>()?;
    let x = || ins.first().copied().ok_or_else(|| "missing operand".to_string());
    Ok(match &node.op {
        Op::Input { name } | Op::Param { name, .. } | Op::State { name, .. } => {
            let t = leaves.get(&h).ok_or_else(|| format!("no value given for leaf `{name}`"))?;
            if t.shape != out || t.dtype() != node.ty.dtype {
                return Err(format!(
                    "leaf `{name}` is {}{out:?} but was given {}{:?}",
                    node.ty.dtype,
                    t.dtype(),
                    t.shape
                ));
            }
            t.data.clone()
        }
        Op::Scalar { value, batch_exp } => TensorData::Real(vec![value * (batch as f64).powi(*batch_exp)]),
        Op::Unary(u) => unary(*u, x()?)?,
        Op::Binary(b) => binary(*b, ins[0], ins[1], out)?,
        Op::Select => select(ins[0], ins[1], ins[2], out)?,
        Op::Reduce { op, axes: _ } => reduce(*op, x()?, out)?,
        Op::Reshape => x()?.data.clone(),
        Op::Expand => x()?.data.gather(&broadcast_map(&x()?.shape, out)?),
        Op::Permute { perm } => {
            let s = strides(&x()?.shape);
            let st: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
            x()?.data.gather(&strided_offsets(out, &st, 0))
        }
        Op::Slice { axis, start, .. } => {
            let s = strides(&x()?.shape);
            x()?.data.gather(&strided_offsets(out, &s, start * s[*axis]))
        }
        Op::Pad { axis, before, .. } => {
            let src = x()?;
            let s = strides(out);
            let mut t = Tensor::zeros(src.dtype(), out).data;
            scatter(&mut t, &src.data, &strided_offsets(&src.shape, &s, before * s[*axis]))?;
            t
        }
        Op::Concat { axis } => {
            let s = strides(out);
            let mut t = Tensor::zeros(node.ty.dtype, out).data;
            let mut at = 0;
            for piece in &ins {
                let d = coerce(piece.data.clone(), node.ty.dtype)?;
                scatter(&mut t, &d, &strided_offsets(&piece.shape, &s, at * s[*axis]))?;
                at += piece.shape[*axis];
            }
            t
        }
        Op::MatMul { trans, conj, sum_batch } => {
            let (a, b) = (ins[0], ins[1]);
            let (ash, bsh) = (&a.shape[..], &b.shape[..]);
            run_pair(
                pair(a, b, *conj)?,
                |p, q| matmul(p, ash, q, bsh, *trans, *sum_batch),
                |p, q| matmul(p, ash, q, bsh, *trans, *sum_batch),
            )
        }
        Op::Conv2d { geom, conj } => {
            let d = conv_dims(&ins[0].shape, &ins[1].shape, [out[2], out[3]], *geom)?;
            let (p, q) = planes(ins[0], ins[1], *conj)?;
            d.conv(&p, &q).into_data()
        }
        Op::ConvTranspose2d { geom, conj, .. } => {
            let (dy, w) = (ins[0], ins[1]);
            let c = w.shape[1] * geom.groups;
            let d =
                conv_dims(&[dy.shape[0], c, out[2], out[3]], &w.shape, [dy.shape[2], dy.shape[3]], *geom)?;
            let (p, q) = planes(dy, w, *conj)?;
            d.transpose(&p, &q).into_data()
        }
        Op::Conv2dWeightGrad { geom, conj, .. } => {
            let (xx, dy) = (ins[0], ins[1]);
            let d = conv_dims(&xx.shape, out, [dy.shape[2], dy.shape[3]], *geom)?;
            let (p, q) = planes(xx, dy, *conj)?;
            d.weight_grad(&p, &q).into_data()
        }
        Op::Fft { axis, inverse, norm } => {
            let t = x()?;
            let v = t.as_complex().ok_or("fft of a non-complex tensor")?;
            TensorData::Complex(dft(v, &t.shape, *axis, *inverse, *norm))
        }
        Op::OneHot { classes } => {
            let labels = x()?.as_int().ok_or("one_hot of a non-integer tensor")?;
            let mut v = vec![0.0; labels.len() * classes];
            for (i, &l) in labels.iter().enumerate() {
                if l >= 0 && (l as usize) < *classes {
                    v[i * classes + l as usize] = 1.0;
                }
            }
            TensorData::Real(v)
        }
        Op::Gather => gather_rows(ins[0], ins[1])?,
        Op::ScatterAdd { rows } => scatter_add_rows(ins[0], ins[1], *rows)?,
        Op::DropoutMask { p, salt } => {
            let step =
                x()?.as_int().and_then(|s| s.first().copied()).ok_or("dropout step is not an i32 scalar")?;
            let n: usize = out.iter().product();
            let keep = 1.0 / (1.0 - p);
            TensorData::Real(
                (0..n)
                    .map(|i| if dropout_keep(*p, *salt, step as u32, i as u32) { keep } else { 0.0 })
                    .collect(),
            )
        }
        Op::AttnLse { spec } => TensorData::Real(AttnOperands::new(*spec, &ins, 2)?.lse()),
        Op::Attention { spec } => {
            let lse = ins[3].as_real().ok_or("attention lse is not real")?;
            TensorData::Complex(AttnOperands::new(*spec, &ins, 4)?.forward(lse))
        }
        Op::AttentionGrad { spec, wrt } => {
            let o = ins[3].as_complex().ok_or("attention output is not complex")?;
            let d_o = ins[4].as_complex().ok_or("attention output gradient is not complex")?;
            let lse = ins[5].as_real().ok_or("attention lse is not real")?;
            TensorData::Complex(AttnOperands::new(*spec, &ins, 6)?.grad(o, d_o, lse, *wrt))
        }
        Op::Recurrence { spec } | Op::RecurrenceGrad { spec } => {
            let c = |i: usize| {
                ins[i].as_complex().ok_or_else(|| format!("recurrence operand {i} is not complex"))
            };
            let rnn = super::recurrence::Rnn {
                spec: *spec,
                b: ins[0].shape[0],
                t: ins[0].shape[1],
                xp: c(0)?,
                w: c(1)?,
                bias: c(2)?,
                h0: if spec.init {
                    Some(c(if matches!(node.op, Op::Recurrence { .. }) { 3 } else { 5 })?)
                } else {
                    None
                },
            };
            TensorData::Complex(match node.op {
                Op::Recurrence { .. } => rnn.forward(),
                _ => rnn.grad(c(3)?, c(4)?),
            })
        }
        Op::Assign => ins[1].data.clone(),
    })
}

/// `table[idx[i], :]` for every index (zero rows for indices outside the table).
fn gather_rows(table: &Tensor, idx: &Tensor) -> Result<TensorData, String> {
    let idx = idx.as_int().ok_or("gather indices are not integers")?;
    let [rows, width] = table.shape[..] else { return Err("gather table is not 2-D".into()) };
    let row = |i: i64| (i >= 0 && (i as usize) < rows).then(|| i as usize * width);
    Ok(match &table.data {
        TensorData::Real(t) => TensorData::Real(
            idx.iter()
                .flat_map(|&i| match row(i) {
                    Some(r) => t[r..r + width].to_vec(),
                    None => vec![0.0; width],
                })
                .collect(),
        ),
        TensorData::Complex(t) => TensorData::Complex(
            idx.iter()
                .flat_map(|&i| match row(i) {
                    Some(r) => t[r..r + width].to_vec(),
                    None => vec![Complex64::new(0.0, 0.0); width],
                })
                .collect(),
        ),
        TensorData::Int(_) => return Err("gather of an integer table".into()),
    })
}

/// `out[v, :] = Σ_{i: idx[i] = v} src[i, :]` (indices outside `0..rows` add nothing).
fn scatter_add_rows(src: &Tensor, idx: &Tensor, rows: usize) -> Result<TensorData, String> {
    let idx = idx.as_int().ok_or("scatter_add indices are not integers")?;
    let width = *src.shape.last().ok_or("scatter_add of a scalar")?;
    let mut out = Tensor::zeros(src.dtype(), &[rows, width]).data;
    for (n, &i) in idx.iter().enumerate() {
        if i < 0 || i as usize >= rows {
            continue;
        }
        let (o, s) = (i as usize * width, n * width);
        match (&mut out, &src.data) {
            (TensorData::Real(d), TensorData::Real(v)) => {
                d[o..o + width].iter_mut().zip(&v[s..s + width]).for_each(|(a, b)| *a += b)
            }
            (TensorData::Complex(d), TensorData::Complex(v)) => {
                d[o..o + width].iter_mut().zip(&v[s..s + width]).for_each(|(a, b)| *a += b)
            }
            _ => return Err("scatter_add of integer values".into()),
        }
    }
    Ok(out)
}

fn conv_dims(x: &[usize], w: &[usize], out: [usize; 2], geom: ConvGeom) -> Result<ConvDims, String> {
    if x.len() != 4 || w.len() != 4 {
        return Err("convolution operands must be 4-D".into());
    }
    if w[0].checked_rem(geom.groups) != Some(0) {
        return Err("output channels not divisible by groups".into());
    }
    Ok(ConvDims { x: [x[0], x[1], x[2], x[3]], w: [w[0], w[1], w[2], w[3]], out, geom })
}

fn scatter(dst: &mut TensorData, src: &TensorData, idx: &[usize]) -> Result<(), String> {
    match (dst, src) {
        (TensorData::Real(d), TensorData::Real(s)) => idx.iter().zip(s).for_each(|(&i, &v)| d[i] = v),
        (TensorData::Complex(d), TensorData::Complex(s)) => idx.iter().zip(s).for_each(|(&i, &v)| d[i] = v),
        (TensorData::Int(d), TensorData::Int(s)) => idx.iter().zip(s).for_each(|(&i, &v)| d[i] = v),
        _ => return Err("mixed dtypes in a copy".into()),
    }
    Ok(())
}

/// Reduction of `x` to `out` (reduced axes have extent 1). Max and MaxMag keep the first of
/// equal candidates in row-major order.
fn reduce(op: ReduceOp, x: &Tensor, out: &[usize]) -> Result<TensorData, String> {
    let map = broadcast_map(out, &x.shape)?;
    let n: usize = out.iter().product();
    Ok(match (&x.data, op) {
        (TensorData::Real(v), ReduceOp::Sum) => {
            let mut acc = vec![0.0; n];
            map.iter().zip(v).for_each(|(&o, &e)| acc[o] += e);
            TensorData::Real(acc)
        }
        (TensorData::Complex(v), ReduceOp::Sum) => {
            let mut acc = vec![Complex64::new(0.0, 0.0); n];
            map.iter().zip(v).for_each(|(&o, &e)| acc[o] += e);
            TensorData::Complex(acc)
        }
        (TensorData::Real(v), ReduceOp::Max | ReduceOp::MaxMag) => {
            let key = |e: f64| if op == ReduceOp::Max { e } else { e.abs() };
            let mut best: Vec<Option<f64>> = vec![None; n];
            for (&o, &e) in map.iter().zip(v) {
                if best[o].is_none_or(|b| key(e) > key(b)) {
                    best[o] = Some(e);
                }
            }
            TensorData::Real(best.into_iter().map(|b| b.unwrap_or(f64::NEG_INFINITY)).collect())
        }
        (TensorData::Complex(v), ReduceOp::MaxMag) => {
            let mut best: Vec<Option<Complex64>> = vec![None; n];
            for (&o, &e) in map.iter().zip(v) {
                if best[o].is_none_or(|b| e.norm() > b.norm()) {
                    best[o] = Some(e);
                }
            }
            TensorData::Complex(best.into_iter().map(|b| b.unwrap_or_default()).collect())
        }
        (d, op) => return Err(format!("reduce {op:?} of a {} tensor", d.dtype())),
    })
}
