//! A training graph holding every form of the batched `MatMul` (both operands batched, a 2-D
//! operand on either side, the summed product; transposes, conjugations, real and complex
//! operands), so a back end's forward products and the gradients autodiff makes of them
//! (summed products of a broadcast weight, broadcast products of a summed one) are compared
//! with the interpreter in one step: on the CPU in CI, on the GPU through `tests/gpu.rs`.

use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::*;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;

/// The program of one SGD step of `loss = Σ |product|²` over the forms, at `batch`.
pub fn program(batch: usize) -> Result<Program, String> {
    use Dim::{Batch as B, Fixed as F};
    let mut g = Graph::new("matmul_forms", Mode::Train);
    {
        let mut b = Builder::new(&mut g);
        let param = |b: &mut Builder, name: &str, dt: DType, dims: &[usize]| {
            b.leaf(
                Op::Param { name: name.into(), init: Init::Glorot { fan_in: 7, fan_out: 5 } },
                TensorType::new(dt, Shape::fixed(dims)),
            )
        };
        let input = |b: &mut Builder, name: &str, dt: DType, dims: &[Dim]| {
            b.leaf(Op::Input { name: name.into() }, TensorType::new(dt, Shape(dims.to_vec())))
        };
        let mm = |trans, conj, sum_batch| Op::MatMul { trans, conj, sum_batch };
        let c = DType::C64;
        let f = DType::F32;
        let mut outs = Vec::new();
        // Tokens times a shared weight (nn.Linear): the batch folds into M; dW folds into K.
        let x = input(&mut b, "x", c, &[B, F(2), F(5), F(7)]);
        let w1 = param(&mut b, "w1", f, &[3, 7]);
        outs.push(b.add(mm([false, true], [false, false], false), &[x, w1])?);
        // A transposed batched operand times a shared conjugated weight: a loop over the batch.
        let xt = input(&mut b, "xt", c, &[B, F(7), F(5)]);
        let w2 = param(&mut b, "w2", c, &[7, 4]);
        outs.push(b.add(mm([true, false], [false, true], false), &[xt, w2])?);
        // A shared left operand: dW is a summed product with a batched right operand.
        let w3 = param(&mut b, "w3", c, &[7, 5]);
        let y = input(&mut b, "y", f, &[B, F(2), F(3), F(7)]);
        outs.push(b.add(mm([true, true], [true, false], false), &[w3, y])?);
        // Both batched (q·kᴴ), with fixed leading axes so both get gradients.
        let q = param(&mut b, "q", c, &[2, 5, 7]);
        let k = param(&mut b, "k", c, &[2, 6, 7]);
        outs.push(b.add(mm([false, true], [false, true], false), &[q, k])?);
        // A summed product of two batched operands that do not fold (a row-major a).
        let s1 = param(&mut b, "s1", c, &[3, 5, 7]);
        let s2 = param(&mut b, "s2", f, &[3, 4, 7]);
        outs.push(b.add(mm([false, true], [true, false], true), &[s1, s2])?);
        let mut loss = None;
        for o in outs {
            let p = b.unary(UnaryOp::Abs2, o)?;
            let axes: Vec<usize> = (0..b.graph.ty(p).shape.rank()).collect();
            let s = b.sum(p, &axes)?;
            let s = b.reshape(s, Shape::scalar())?;
            loss = Some(match loss {
                None => s,
                Some(l) => b.add2(l, s)?,
            });
        }
        b.graph.loss = loss;
    }
    compile(g, &Options { batch, ..Options::default() }).map_err(|e| e.to_string())
}
