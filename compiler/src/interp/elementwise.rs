//! Elementwise ops of the interpreter: unary, binary (broadcasting, mixed dtypes) and select.

use super::layout::broadcast_map;
use super::tensor::{Tensor, TensorData};
use crate::ir::{BinaryOp, UnaryOp};
use num_complex::Complex64;

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_A: f64 = 0.044_715;

/// Exact GELU, `x·Φ(x) = 0.5x(1 + erf(x/√2))` (PyTorch's default).
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
}

/// Derivative of [`gelu`]: `Φ(x) + x·φ(x)`.
pub fn gelu_grad(x: f64) -> f64 {
    let phi = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2)) + x * phi
}

/// `tanh`-approximated GELU.
pub fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_A * x * x * x)).tanh())
}

/// Derivative of [`gelu_tanh`].
pub fn gelu_tanh_grad(x: f64) -> f64 {
    let u = SQRT_2_OVER_PI * (x + GELU_A * x * x * x);
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_A * x * x);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
}

fn real_fn(op: UnaryOp) -> Option<fn(f64) -> f64> {
    use UnaryOp::*;
    Some(match op {
        Exp => f64::exp,
        Log => f64::ln,
        Sqrt => f64::sqrt,
        Rsqrt => |x| 1.0 / x.sqrt(),
        Recip => |x| 1.0 / x,
        Sin => f64::sin,
        Cos => f64::cos,
        Tanh => f64::tanh,
        Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
        Relu => |x| if x > 0.0 { x } else { 0.0 },
        Step => |x| if x > 0.0 { 1.0 } else { 0.0 },
        Gelu => gelu,
        GeluGrad => gelu_grad,
        GeluTanh => gelu_tanh,
        GeluTanhGrad => gelu_tanh_grad,
        // Defined on their own in `unary` (they are not `f64 → f64` on every dtype).
        Neg | Conj | Real | Imag | Abs | Abs2 | Angle | ToComplex | StopGrad => return None,
    })
}

/// `op` applied to every element of `x`.
pub fn unary(op: UnaryOp, x: &Tensor) -> Result<TensorData, String> {
    use UnaryOp::*;
    let data = match (&x.data, op) {
        (TensorData::Int(_), _) => return Err(format!("{op:?} of an i32 tensor")),
        (TensorData::Real(v), Neg) => TensorData::Real(v.iter().map(|a| -a).collect()),
        (TensorData::Real(v), Conj | StopGrad | Real) => TensorData::Real(v.clone()),
        (TensorData::Real(v), Imag) => TensorData::Real(vec![0.0; v.len()]),
        (TensorData::Real(v), Abs) => TensorData::Real(v.iter().map(|a| a.abs()).collect()),
        (TensorData::Real(v), Abs2) => TensorData::Real(v.iter().map(|a| a * a).collect()),
        (TensorData::Real(v), Angle) => TensorData::Real(v.iter().map(|a| 0f64.atan2(*a)).collect()),
        (TensorData::Real(v), ToComplex) => {
            TensorData::Complex(v.iter().map(|&a| Complex64::new(a, 0.0)).collect())
        }
        (
            TensorData::Real(v),
            Exp | Log | Sqrt | Rsqrt | Recip | Sin | Cos | Tanh | Sigmoid | Relu | Step | Gelu | GeluGrad
            | GeluTanh | GeluTanhGrad,
        ) => {
            let f = real_fn(op).ok_or_else(|| format!("{op:?} has no real form"))?;
            TensorData::Real(v.iter().map(|&a| f(a)).collect())
        }
        (TensorData::Complex(v), Neg) => TensorData::Complex(v.iter().map(|a| -a).collect()),
        (TensorData::Complex(v), Conj) => TensorData::Complex(v.iter().map(|a| a.conj()).collect()),
        (TensorData::Complex(v), StopGrad) => TensorData::Complex(v.clone()),
        (TensorData::Complex(v), Real) => TensorData::Real(v.iter().map(|a| a.re).collect()),
        (TensorData::Complex(v), Imag) => TensorData::Real(v.iter().map(|a| a.im).collect()),
        (TensorData::Complex(v), Abs) => TensorData::Real(v.iter().map(|a| a.norm()).collect()),
        (TensorData::Complex(v), Abs2) => TensorData::Real(v.iter().map(|a| a.norm_sqr()).collect()),
        (TensorData::Complex(v), Angle) => TensorData::Real(v.iter().map(|a| a.arg()).collect()),
        (
            TensorData::Complex(_),
            ToComplex | Exp | Log | Sqrt | Rsqrt | Recip | Sin | Cos | Tanh | Sigmoid | Relu | Step | Gelu
            | GeluGrad | GeluTanh | GeluTanhGrad,
        ) => return Err(format!("{op:?} of a complex tensor")),
    };
    Ok(data)
}

/// Real or complex elements broadcast to an output shape.
enum Num {
    R(Vec<f64>),
    C(Vec<Complex64>),
}

fn spread(t: &Tensor, to: &[usize], complex: bool) -> Result<Num, String> {
    let idx = broadcast_map(&t.shape, to)?;
    Ok(match (t.data.gather(&idx), complex) {
        (TensorData::Complex(v), _) => Num::C(v),
        (TensorData::Real(v), false) => Num::R(v),
        (TensorData::Real(v), true) => Num::C(v.into_iter().map(|x| Complex64::new(x, 0.0)).collect()),
        (TensorData::Int(v), false) => Num::R(v.into_iter().map(|x| x as f64).collect()),
        (TensorData::Int(v), true) => Num::C(v.into_iter().map(|x| Complex64::new(x as f64, 0.0)).collect()),
    })
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// `p / q` without overflow or underflow of `|q|²` (Smith's algorithm; exact for real `q`).
pub fn complex_div(p: Complex64, q: Complex64) -> Complex64 {
    if q.im == 0.0 {
        return Complex64::new(p.re / q.re, p.im / q.re);
    }
    if q.re.abs() >= q.im.abs() {
        let r = q.im / q.re;
        let d = q.re + q.im * r;
        Complex64::new((p.re + p.im * r) / d, (p.im - p.re * r) / d)
    } else {
        let r = q.re / q.im;
        let d = q.re * r + q.im;
        Complex64::new((p.re * r + p.im) / d, (p.im * r - p.re) / d)
    }
}

/// `op(a, b)` broadcast to `out` (the node's resolved shape).
pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, out: &[usize]) -> Result<TensorData, String> {
    use BinaryOp::*;
    let complex = a.dtype().is_complex() || b.dtype().is_complex();
    if complex && matches!(op, Max | Complex | Greater | Equal) {
        return Err(format!("{op:?} of complex operands"));
    }
    let (x, y) = (spread(a, out, complex)?, spread(b, out, complex)?);
    Ok(match (x, y) {
        (Num::R(x), Num::R(y)) => {
            if op == Complex {
                return Ok(TensorData::Complex(
                    x.iter().zip(&y).map(|(&r, &i)| Complex64::new(r, i)).collect(),
                ));
            }
            let f: fn(f64, f64) -> f64 = match op {
                Add => |p, q| p + q,
                Sub => |p, q| p - q,
                Mul => |p, q| p * q,
                Div => |p, q| p / q,
                Max => f64::max,
                Greater => |p, q| flag(p > q),
                Equal => |p, q| flag(p == q),
                Complex => unreachable!("handled above"),
            };
            TensorData::Real(x.iter().zip(&y).map(|(&p, &q)| f(p, q)).collect())
        }
        (Num::C(x), Num::C(y)) => {
            let f: fn(Complex64, Complex64) -> Complex64 = match op {
                Add => |p, q| p + q,
                Sub => |p, q| p - q,
                Mul => |p, q| p * q,
                Div => complex_div,
                Max | Complex | Greater | Equal => unreachable!("rejected above"),
            };
            TensorData::Complex(x.iter().zip(&y).map(|(&p, &q)| f(p, q)).collect())
        }
        _ => unreachable!("spread gives both operands the same kind"),
    })
}

/// `cond > 0 ? a : b`, broadcast to `out`.
pub fn select(cond: &Tensor, a: &Tensor, b: &Tensor, out: &[usize]) -> Result<TensorData, String> {
    let complex = a.dtype().is_complex() || b.dtype().is_complex();
    let c = match spread(cond, out, false)? {
        Num::R(c) => c,
        Num::C(_) => return Err("select condition is complex".into()),
    };
    Ok(match (spread(a, out, complex)?, spread(b, out, complex)?) {
        (Num::R(x), Num::R(y)) => {
            TensorData::Real((0..c.len()).map(|i| if c[i] > 0.0 { x[i] } else { y[i] }).collect())
        }
        (Num::C(x), Num::C(y)) => {
            TensorData::Complex((0..c.len()).map(|i| if c[i] > 0.0 { x[i] } else { y[i] }).collect())
        }
        _ => unreachable!("spread gives both operands the same kind"),
    })
}
