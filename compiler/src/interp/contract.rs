//! Contractions and transforms of the interpreter: matmul, the convolution family, the DFT.

use super::tensor::{Tensor, TensorData};
use crate::ir::{ConvGeom, FftNorm};
use num_complex::Complex64;
use std::ops::{Add, Mul};

/// A scalar the contractions work on (f64 or Complex64).
pub trait Elem: Copy + Add<Output = Self> + Mul<Output = Self> {
    /// Additive identity.
    fn zero() -> Self;
    /// Complex conjugate (identity on reals).
    fn conj(self) -> Self;
}

impl Elem for f64 {
    fn zero() -> Self {
        0.0
    }
    fn conj(self) -> Self {
        self
    }
}

impl Elem for Complex64 {
    fn zero() -> Self {
        Complex64::new(0.0, 0.0)
    }
    fn conj(self) -> Self {
        Complex64::conj(&self)
    }
}

/// Both operands as reals, or both as complex numbers (a real operand read as `x + 0i`),
/// each conjugated when its flag is set.
pub enum Pair {
    /// Two real operands.
    Real(Vec<f64>, Vec<f64>),
    /// At least one complex operand.
    Complex(Vec<Complex64>, Vec<Complex64>),
}

/// Promotes two operands to a common kind and applies the conj flags.
pub fn pair(a: &Tensor, b: &Tensor, conj: [bool; 2]) -> Result<Pair, String> {
    match (&a.data, &b.data) {
        (TensorData::Int(_), _) | (_, TensorData::Int(_)) => Err("contraction of an i32 tensor".into()),
        (TensorData::Real(x), TensorData::Real(y)) => Ok(Pair::Real(x.clone(), y.clone())),
        _ => {
            let cj = |v: Vec<Complex64>, c: bool| {
                if c {
                    v.into_iter().map(|z| z.conj()).collect()
                } else {
                    v
                }
            };
            Ok(Pair::Complex(cj(a.to_complex_vec(), conj[0]), cj(b.to_complex_vec(), conj[1])))
        }
    }
}

/// Wraps a contraction's result in the matching [`TensorData`].
pub fn run_pair(
    p: Pair,
    real: impl FnOnce(&[f64], &[f64]) -> Vec<f64>,
    complex: impl FnOnce(&[Complex64], &[Complex64]) -> Vec<Complex64>,
) -> TensorData {
    match p {
        Pair::Real(a, b) => TensorData::Real(real(&a, &b)),
        Pair::Complex(a, b) => TensorData::Complex(complex(&a, &b)),
    }
}

/// `op(a)·op(b)` where `a` is stored `ash` and `b` `bsh` (2-D), `op` an optional transpose
/// (conjugation is applied by [`pair`]). Returns the M×N product.
pub fn matmul<T: Elem>(a: &[T], ash: [usize; 2], b: &[T], bsh: [usize; 2], trans: [bool; 2]) -> Vec<T> {
    let (m, k) = if trans[0] { (ash[1], ash[0]) } else { (ash[0], ash[1]) };
    let n = if trans[1] { bsh[0] } else { bsh[1] };
    let at = |i: usize, p: usize| if trans[0] { a[p * ash[1] + i] } else { a[i * ash[1] + p] };
    let bt = |p: usize, j: usize| if trans[1] { b[j * bsh[1] + p] } else { b[p * bsh[1] + j] };
    let mut out = vec![T::zero(); m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = T::zero();
            for p in 0..k {
                acc = acc + at(i, p) * bt(p, j);
            }
            out[i * n + j] = acc;
        }
    }
    out
}

/// The geometry of one convolution: input `(n, c, h, w)`, weight `(o, cg, kh, kw)`,
/// output spatial `(ho, wo)`.
#[derive(Clone, Copy, Debug)]
pub struct ConvDims {
    /// Batch, input channels, input height, input width.
    pub x: [usize; 4],
    /// Output channels, channels per group, kernel height, kernel width.
    pub w: [usize; 4],
    /// Output height and width.
    pub out: [usize; 2],
    /// Stride, padding, dilation, groups.
    pub geom: ConvGeom,
}

impl ConvDims {
    /// Calls `f(x_index, w_index, y_index)` for every multiply-add of the forward convolution.
    fn each(&self, mut f: impl FnMut(usize, usize, usize)) {
        let [n, c, h, w] = self.x;
        let [o, cg, kh, kw] = self.w;
        let [ho, wo] = self.out;
        let g = self.geom;
        let og = o / g.groups;
        for b in 0..n {
            for oc in 0..o {
                let grp = oc / og;
                for ci in 0..cg {
                    let ic = grp * cg + ci;
                    for ki in 0..kh {
                        for kj in 0..kw {
                            let widx = ((oc * cg + ci) * kh + ki) * kw + kj;
                            for yi in 0..ho {
                                let hi = (yi * g.stride[0] + ki * g.dilation[0]) as isize - g.pad[0] as isize;
                                if hi < 0 || hi >= h as isize {
                                    continue;
                                }
                                for yj in 0..wo {
                                    let wj =
                                        (yj * g.stride[1] + kj * g.dilation[1]) as isize - g.pad[1] as isize;
                                    if wj < 0 || wj >= w as isize {
                                        continue;
                                    }
                                    let xidx = ((b * c + ic) * h + hi as usize) * w + wj as usize;
                                    let yidx = ((b * o + oc) * ho + yi) * wo + yj;
                                    f(xidx, widx, yidx);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Forward convolution `y = x ⋆ w` (PyTorch's conv2d).
    pub fn conv<T: Elem>(&self, x: &[T], w: &[T]) -> Vec<T> {
        let mut y = vec![T::zero(); self.x[0] * self.w[0] * self.out[0] * self.out[1]];
        self.each(|xi, wi, yi| y[yi] = y[yi] + x[xi] * w[wi]);
        y
    }

    /// Transposed convolution: `dx[xi] += dy[yi]·w[wi]` over the forward index triples.
    pub fn transpose<T: Elem>(&self, dy: &[T], w: &[T]) -> Vec<T> {
        let mut dx = vec![T::zero(); self.x.iter().product()];
        self.each(|xi, wi, yi| dx[xi] = dx[xi] + dy[yi] * w[wi]);
        dx
    }

    /// Weight gradient: `dw[wi] += dy[yi]·x[xi]` over the forward index triples.
    pub fn weight_grad<T: Elem>(&self, x: &[T], dy: &[T]) -> Vec<T> {
        let mut dw = vec![T::zero(); self.w.iter().product()];
        self.each(|xi, wi, yi| dw[wi] = dw[wi] + dy[yi] * x[xi]);
        dw
    }
}

/// DFT along `axis` of a complex tensor of `shape`, sign `-` forward and `+` inverse,
/// scaled as `norm` says.
pub fn dft(x: &[Complex64], shape: &[usize], axis: usize, inverse: bool, norm: FftNorm) -> Vec<Complex64> {
    let n = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let sign = if inverse { 1.0 } else { -1.0 };
    let scale = norm.scale(n, inverse);
    let twiddle: Vec<Complex64> = (0..n.max(1))
        .map(|j| Complex64::from_polar(1.0, sign * 2.0 * std::f64::consts::PI * j as f64 / n as f64))
        .collect();
    let mut out = vec![Complex64::new(0.0, 0.0); x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            for k in 0..n {
                let mut acc = Complex64::new(0.0, 0.0);
                for j in 0..n {
                    acc += x[at(j)] * twiddle[(j * k) % n];
                }
                out[at(k)] = acc * scale;
            }
        }
    }
    out
}
