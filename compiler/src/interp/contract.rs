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

/// `op(a)·op(b)` where `a` is stored with shape `ash` and `b` with `bsh` (rank ≥ 2), `op` an
/// optional transpose of the last two axes (conjugation is applied by [`pair`]). The leading
/// axes are equal, or one operand is 2-D and reused for every batch (see `Op::MatMul`).
/// Returns the `[P..., M, N]` product, or with `sum_batch` its `[M, N]` sum over `P...`.
pub fn matmul<T: Elem>(
    a: &[T],
    ash: &[usize],
    b: &[T],
    bsh: &[usize],
    trans: [bool; 2],
    sum_batch: bool,
) -> Vec<T> {
    let last2 = |s: &[usize]| [s[s.len() - 2], s[s.len() - 1]];
    let (a2, b2) = (last2(ash), last2(bsh));
    let batches = |s: &[usize]| s[..s.len() - 2].iter().product::<usize>();
    let (pa, pb) = (batches(ash), batches(bsh));
    let p = pa.max(pb);
    let (m, k) = if trans[0] { (a2[1], a2[0]) } else { (a2[0], a2[1]) };
    let n = if trans[1] { b2[0] } else { b2[1] };
    // A 2-D operand (one batch) is read at offset 0 for every batch.
    let (sa, sb) = (if pa == 1 { 0 } else { a2[0] * a2[1] }, if pb == 1 { 0 } else { b2[0] * b2[1] });
    let mut out = vec![T::zero(); if sum_batch { m * n } else { p * m * n }];
    for q in 0..p {
        let (a, b) = (&a[q * sa..], &b[q * sb..]);
        let at = |i: usize, r: usize| if trans[0] { a[r * a2[1] + i] } else { a[i * a2[1] + r] };
        let bt = |r: usize, j: usize| if trans[1] { b[j * b2[1] + r] } else { b[r * b2[1] + j] };
        let base = if sum_batch { 0 } else { q * m * n };
        for i in 0..m {
            for j in 0..n {
                let mut acc = T::zero();
                for r in 0..k {
                    acc = acc + at(i, r) * bt(r, j);
                }
                out[base + i * n + j] = out[base + i * n + j] + acc;
            }
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

/// Real and imaginary planes of a convolution operand; `im` is absent when the whole
/// computation is real. Planar f64 loops keep the interpreter usable in debug builds.
pub struct Planes {
    /// Real parts.
    pub re: Vec<f64>,
    /// Imaginary parts (complex computation only).
    pub im: Option<Vec<f64>>,
}

impl Planes {
    /// Zeros of `n` elements, complex when `complex`.
    fn zeros(n: usize, complex: bool) -> Planes {
        Planes { re: vec![0.0; n], im: complex.then(|| vec![0.0; n]) }
    }
    /// The planes as tensor data.
    pub fn into_data(self) -> TensorData {
        match self.im {
            None => TensorData::Real(self.re),
            Some(im) => {
                TensorData::Complex(self.re.into_iter().zip(im).map(|(r, i)| Complex64::new(r, i)).collect())
            }
        }
    }
}

/// Both operands as planes of a common kind, each conjugated when its flag is set.
pub fn planes(a: &Tensor, b: &Tensor, conj: [bool; 2]) -> Result<(Planes, Planes), String> {
    Ok(match pair(a, b, conj)? {
        Pair::Real(x, y) => (Planes { re: x, im: None }, Planes { re: y, im: None }),
        Pair::Complex(x, y) => {
            let split = |v: Vec<Complex64>| Planes {
                re: v.iter().map(|z| z.re).collect(),
                im: Some(v.iter().map(|z| z.im).collect()),
            };
            (split(x), split(y))
        }
    })
}

/// One output row of a convolution tap: `count` elements starting at `x` (step `stride[1]`)
/// in the input and at `y` (step 1) in the output, all multiplied by weight element `w`.
#[derive(Clone, Copy)]
struct Row {
    x: usize,
    w: usize,
    y: usize,
    count: usize,
}

impl ConvDims {
    /// Calls `f` for every (weight tap, output row) pair of the forward convolution, with
    /// the output columns whose input column lies inside the image.
    fn rows(&self, mut f: impl FnMut(Row)) {
        let [n, c, h, w] = self.x;
        let [o, cg, kh, kw] = self.w;
        let [ho, wo] = self.out;
        let g = self.geom;
        let og = o / g.groups;
        let (s1, d1, p1) = (g.stride[1] as isize, g.dilation[1] as isize, g.pad[1] as isize);
        for kj in 0..kw {
            // Columns yj with 0 <= yj*s1 + kj*d1 - p1 < w.
            let off = kj as isize * d1 - p1;
            let j0 = if off >= 0 { 0 } else { ((-off + s1 - 1) / s1) as usize };
            let last = w as isize - 1 - off;
            let j1 = if last < 0 { 0 } else { ((last / s1) as usize + 1).min(wo) };
            if j0 >= j1 {
                continue;
            }
            let count = j1 - j0;
            let x_col = (j0 as isize * s1 + off) as usize;
            for b in 0..n {
                for oc in 0..o {
                    let grp = oc / og;
                    for ci in 0..cg {
                        let ic = grp * cg + ci;
                        for ki in 0..kh {
                            let widx = ((oc * cg + ci) * kh + ki) * kw + kj;
                            for yi in 0..ho {
                                let hi = (yi * g.stride[0] + ki * g.dilation[0]) as isize - g.pad[0] as isize;
                                if hi < 0 || hi >= h as isize {
                                    continue;
                                }
                                let x = ((b * c + ic) * h + hi as usize) * w + x_col;
                                let y = ((b * o + oc) * ho + yi) * wo + j0;
                                f(Row { x, w: widx, y, count });
                            }
                        }
                    }
                }
            }
        }
    }

    // The inner loops below index plain slices with `while` loops: in unoptimised (debug)
    // builds, iterator adapters and `Vec` indexing cost a call per element.

    /// Forward convolution `y = x ⋆ w` (PyTorch's conv2d).
    pub fn conv(&self, x: &Planes, w: &Planes) -> Planes {
        let s = self.geom.stride[1];
        let mut y = Planes::zeros(self.x[0] * self.w[0] * self.out[0] * self.out[1], x.im.is_some());
        let (xr, wr): (&[f64], &[f64]) = (&x.re, &w.re);
        let yr: &mut [f64] = &mut y.re;
        match (x.im.as_deref(), w.im.as_deref(), y.im.as_deref_mut()) {
            (Some(xi), Some(wi), Some(yi)) => self.rows(|r| {
                let (a, bb) = (wr[r.w], wi[r.w]);
                let (mut k, mut j, end) = (r.x, r.y, r.y + r.count);
                while j < end {
                    let (p, q) = (xr[k], xi[k]);
                    yr[j] += p * a - q * bb;
                    yi[j] += p * bb + q * a;
                    k += s;
                    j += 1;
                }
            }),
            _ => self.rows(|r| {
                let a = wr[r.w];
                let (mut k, mut j, end) = (r.x, r.y, r.y + r.count);
                while j < end {
                    yr[j] += xr[k] * a;
                    k += s;
                    j += 1;
                }
            }),
        }
        y
    }

    /// Transposed convolution: `dx[xi] += dy[yi]·w[wi]` over the forward index triples.
    pub fn transpose(&self, dy: &Planes, w: &Planes) -> Planes {
        let s = self.geom.stride[1];
        let mut dx = Planes::zeros(self.x.iter().product(), dy.im.is_some());
        let (yr, wr): (&[f64], &[f64]) = (&dy.re, &w.re);
        let xr: &mut [f64] = &mut dx.re;
        match (dy.im.as_deref(), w.im.as_deref(), dx.im.as_deref_mut()) {
            (Some(yi), Some(wi), Some(xi)) => self.rows(|r| {
                let (a, bb) = (wr[r.w], wi[r.w]);
                let (mut k, mut j, end) = (r.x, r.y, r.y + r.count);
                while j < end {
                    let (p, q) = (yr[j], yi[j]);
                    xr[k] += p * a - q * bb;
                    xi[k] += p * bb + q * a;
                    k += s;
                    j += 1;
                }
            }),
            _ => self.rows(|r| {
                let a = wr[r.w];
                let (mut k, mut j, end) = (r.x, r.y, r.y + r.count);
                while j < end {
                    xr[k] += yr[j] * a;
                    k += s;
                    j += 1;
                }
            }),
        }
        dx
    }

    /// Weight gradient: `dw[wi] += dy[yi]·x[xi]` over the forward index triples.
    pub fn weight_grad(&self, x: &Planes, dy: &Planes) -> Planes {
        let s = self.geom.stride[1];
        let mut dw = Planes::zeros(self.w.iter().product(), x.im.is_some());
        let (xr, yr): (&[f64], &[f64]) = (&x.re, &dy.re);
        let wr: &mut [f64] = &mut dw.re;
        match (x.im.as_deref(), dy.im.as_deref(), dw.im.as_deref_mut()) {
            (Some(xi), Some(yi), Some(wi)) => self.rows(|r| {
                let (mut re, mut im) = (0.0, 0.0);
                let (mut k, mut j, end) = (r.x, r.y, r.y + r.count);
                while j < end {
                    let (p, q, u, v) = (yr[j], yi[j], xr[k], xi[k]);
                    re += p * u - q * v;
                    im += p * v + q * u;
                    k += s;
                    j += 1;
                }
                wr[r.w] += re;
                wi[r.w] += im;
            }),
            _ => self.rows(|r| {
                let mut acc = 0.0;
                let (mut k, mut j, end) = (r.x, r.y, r.y + r.count);
                while j < end {
                    acc += yr[j] * xr[k];
                    k += s;
                    j += 1;
                }
                wr[r.w] += acc;
            }),
        }
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
