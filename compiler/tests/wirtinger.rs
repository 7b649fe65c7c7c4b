//! Hand-derived checks of the conjugate-Wirtinger convention (PyTorch's): the gradient of a
//! real loss `L` w.r.t. `z = x + iy` is `∂L/∂x + i ∂L/∂y`.

use cvc_compiler::interp::{evaluate, Tensor};
use cvc_compiler::ir::builder::Builder;
use cvc_compiler::ir::verify::verify;
use cvc_compiler::ir::*;
use cvc_compiler::passes::autodiff::{gradients, run};
use num_complex::Complex64;
use std::collections::HashMap;

fn c(re: f64, im: f64) -> Complex64 {
    Complex64::new(re, im)
}

/// Builds a scalar loss from scalar inputs (`c64[]` for each complex value given, `f32[]` for
/// each real one), differentiates it w.r.t. all inputs and returns the gradients' values.
fn grads_of(
    values: &[Result<f64, Complex64>],
    build: impl Fn(&mut Builder, &[Value]) -> Value,
) -> Vec<Complex64> {
    let mut g = Graph::new("wirtinger", Mode::Train);
    let (xs, loss) = {
        let mut b = Builder::new(&mut g);
        let xs: Vec<Value> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let dt = if v.is_ok() { DType::F32 } else { DType::C64 };
                b.leaf(Op::Input { name: format!("x{i}") }, TensorType::new(dt, Shape::scalar()))
            })
            .collect();
        let l = build(&mut b, &xs);
        (xs, l)
    };
    let grads = gradients(&mut g, loss, &xs).unwrap();
    verify(&g).unwrap();
    let leaves: HashMap<Value, Tensor> = xs
        .iter()
        .zip(values)
        .map(|(&x, v)| {
            let t = match v {
                Ok(r) => Tensor::real(&[], vec![*r]),
                Err(z) => Tensor::complex(&[], vec![*z]),
            };
            (x, t)
        })
        .collect();
    let vals = evaluate(&g, 1, &leaves).unwrap();
    grads.iter().map(|d| vals[d.index()].as_ref().unwrap().to_complex_vec()[0]).collect()
}

fn close(a: Complex64, b: Complex64) -> bool {
    (a - b).norm() <= 1e-12 * (1.0 + b.norm())
}

fn assert_grads(got: &[Complex64], want: &[Complex64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(close(*g, *w), "gradient {g}, expected {w} (all: {got:?})");
    }
}

#[test]
fn abs_squared_at_3_plus_4i_is_6_plus_8i() {
    let got = grads_of(&[Err(c(3.0, 4.0))], |b, x| b.unary(UnaryOp::Abs2, x[0]).unwrap());
    assert_grads(&got, &[c(6.0, 8.0)]);
    // The same through z·conj(z) (a product of a value with its conjugate).
    let got = grads_of(&[Err(c(3.0, 4.0))], |b, x| {
        let cz = b.unary(UnaryOp::Conj, x[0]).unwrap();
        let p = b.mul(x[0], cz).unwrap();
        b.unary(UnaryOp::Real, p).unwrap()
    });
    assert_grads(&got, &[c(6.0, 8.0)]);
}

#[test]
fn real_part_of_a_product() {
    // L = Re(z·w) = xa − yb ⇒ ∂L/∂z = a − ib = conj(w), ∂L/∂w = conj(z).
    let (z, w) = (c(1.0, 2.0), c(3.0, -1.0));
    let got = grads_of(&[Err(z), Err(w)], |b, x| {
        let p = b.mul(x[0], x[1]).unwrap();
        b.unary(UnaryOp::Real, p).unwrap()
    });
    assert_grads(&got, &[w.conj(), z.conj()]);
    // L = Im(z·w) = xb + ya ⇒ ∂L/∂z = b + ia, ∂L/∂w = y + ix (w = a + ib, z = x + iy).
    let got = grads_of(&[Err(z), Err(w)], |b, x| {
        let p = b.mul(x[0], x[1]).unwrap();
        b.unary(UnaryOp::Imag, p).unwrap()
    });
    assert_grads(&got, &[c(w.im, w.re), c(z.im, z.re)]);
}

#[test]
fn conjugate() {
    // L = Re(conj(z)·w) = xa + yb ⇒ ∂L/∂z = a + ib = w.
    let (z, w) = (c(-0.5, 2.0), c(1.5, 0.25));
    let got = grads_of(&[Err(z), Err(w)], |b, x| {
        let cz = b.unary(UnaryOp::Conj, x[0]).unwrap();
        let p = b.mul(cz, x[1]).unwrap();
        b.unary(UnaryOp::Real, p).unwrap()
    });
    assert_grads(&got, &[w, z]);
}

#[test]
fn real_operand_of_a_complex_product() {
    // L = Re(r·w) = r·a ⇒ ∂L/∂r = a (real), ∂L/∂w = r.
    let got = grads_of(&[Ok(2.0), Err(c(3.0, 4.0))], |b, x| {
        let p = b.mul(x[0], x[1]).unwrap();
        b.unary(UnaryOp::Real, p).unwrap()
    });
    assert_grads(&got, &[c(3.0, 0.0), c(2.0, 0.0)]);
}

#[test]
fn abs_near_and_at_zero() {
    let abs = |b: &mut Builder, x: &[Value]| b.unary(UnaryOp::Abs, x[0]).unwrap();
    assert_grads(&grads_of(&[Err(c(3.0, 4.0))], abs), &[c(0.6, 0.8)]);
    let s = std::f64::consts::FRAC_1_SQRT_2;
    assert_grads(&grads_of(&[Err(c(1e-200, 1e-200))], abs), &[c(s, s)]);
    let at_zero = grads_of(&[Err(c(0.0, 0.0))], abs);
    assert!(at_zero[0].re.is_finite() && at_zero[0].im.is_finite());
    assert_grads(&at_zero, &[c(0.0, 0.0)]);
    let real_zero = grads_of(&[Ok(0.0)], abs);
    assert_grads(&real_zero, &[c(0.0, 0.0)]);
}

#[test]
fn angle() {
    // θ = atan2(y, x): ∂θ/∂x = −y/|z|², ∂θ/∂y = x/|z|².
    let angle = |b: &mut Builder, x: &[Value]| b.unary(UnaryOp::Angle, x[0]).unwrap();
    assert_grads(&grads_of(&[Err(c(1.0, 1.0))], angle), &[c(-0.5, 0.5)]);
    assert_grads(&grads_of(&[Err(c(0.0, 0.0))], angle), &[c(0.0, 0.0)]);
}

#[test]
fn mse_on_a_complex_parameter_via_run() {
    // L = |p − t|² for a parameter p ⇒ ∂L/∂p = 2(p − t).
    let mut g = Graph::new("mse", Mode::Train);
    let (p, t) = {
        let mut b = Builder::new(&mut g);
        let ty = TensorType::new(DType::C64, Shape::fixed(&[2]));
        let p = b.leaf(Op::Param { name: "p".into(), init: Init::Zeros }, ty.clone());
        let t = b.leaf(Op::Input { name: "t".into() }, ty);
        let d = b.sub(p, t).unwrap();
        let a = b.unary(UnaryOp::Abs2, d).unwrap();
        let s = b.sum(a, &[0]).unwrap();
        let l = b.reshape(s, Shape::scalar()).unwrap();
        b.graph.loss = Some(l);
        (p, t)
    };
    let facts = run(&mut g).unwrap();
    assert_eq!(facts.grads.len(), 1);
    assert_eq!(facts.grads[0].0, p);
    let dp = facts.grads[0].1;
    assert_eq!(g.node(dp).origin.role, Role::Backward);
    assert!(g.node(dp).origin.label.starts_with("grad("), "{}", g.node(dp).origin.label);
    let (pv, tv) = ([c(1.0, -2.0), c(0.5, 0.5)], [c(0.0, 1.0), c(2.0, -1.0)]);
    let leaves =
        HashMap::from([(p, Tensor::complex(&[2], pv.to_vec())), (t, Tensor::complex(&[2], tv.to_vec()))]);
    let vals = evaluate(&g, 1, &leaves).unwrap();
    let got = vals[dp.index()].as_ref().unwrap().to_complex_vec();
    let want: Vec<Complex64> = pv.iter().zip(&tv).map(|(p, t)| 2.0 * (p - t)).collect();
    assert_grads(&got, &want);
}

#[test]
fn unreachable_values_get_zero_gradients() {
    let got = grads_of(&[Err(c(1.0, 2.0)), Ok(3.0)], |b, x| b.unary(UnaryOp::Abs2, x[1]).unwrap());
    assert_grads(&got, &[c(0.0, 0.0), c(6.0, 0.0)]);
}
