//! Contractions on the CPU: matmul and the convolution family as packed GEMMs.
//!
//! Every contraction is reduced to [`gemm::gemm`] on real matrices: real×real directly;
//! complex×complex as one real product of the interleaved left operand with the 2×2-expanded
//! right operand; real×complex as one product with the complex operand's interleaved view
//! (2 real multiplies per complex output, not 4); complex×real as two real products (one per
//! component). Convolutions use per-image im2col into a per-thread workspace (never a
//! whole-batch im2col) and split the batch across the worker threads; a 1×1 stride-1
//! convolution skips im2col. Conjugation flags are folded into the packing.

use super::gemm::{self, AMode, BMode, Dest, Operand};
pub use cvc_compiler::back::cpu::{ConvShape, ConvTypes};

/// A strided matrix operand in storage elements of its dtype.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    /// Base pointer (f32 storage; complex interleaved).
    pub ptr: *const f32,
    /// Row stride (elements).
    pub rs: isize,
    /// Column stride (elements).
    pub cs: isize,
    /// Whether elements are complex.
    pub complex: bool,
    /// Whether to conjugate the elements.
    pub conj: bool,
}

/// `C = A·B` (or `+=` when `accumulate`) for `A` m×k, `B` k×n; `C` is row-major with row
/// stride `c_rs` (in elements of its dtype, complex when either operand is).
///
/// # Safety
/// Pointers must address the extents given; `work` holds [`gemm::WORKSPACE_F32`] floats.
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    c_rs: isize,
    accumulate: bool,
    work: &mut [f32],
) {
    match (a.complex, b.complex) {
        (false, false) => gemm::gemm(
            m,
            n,
            k,
            &Operand { ptr: a.ptr, rs: a.rs, cs: a.cs, mode: AMode::Real { sign: 1.0 } },
            &Operand { ptr: b.ptr, rs: b.rs, cs: b.cs, mode: BMode::Real },
            &Dest { ptr: c, rs: c_rs, cs: 1 },
            accumulate,
            work,
        ),
        (true, true) => gemm::gemm(
            m,
            2 * n,
            2 * k,
            &Operand { ptr: a.ptr, rs: a.rs, cs: a.cs, mode: AMode::Interleaved { conj: a.conj } },
            &Operand { ptr: b.ptr, rs: b.rs, cs: b.cs, mode: BMode::Expand { conj: b.conj } },
            &Dest { ptr: c, rs: 2 * c_rs, cs: 1 },
            accumulate,
            work,
        ),
        (false, true) => gemm::gemm(
            m,
            2 * n,
            k,
            &Operand { ptr: a.ptr, rs: a.rs, cs: a.cs, mode: AMode::Real { sign: 1.0 } },
            &Operand { ptr: b.ptr, rs: b.rs, cs: b.cs, mode: BMode::Interleaved { conj: b.conj } },
            &Dest { ptr: c, rs: 2 * c_rs, cs: 1 },
            accumulate,
            work,
        ),
        (true, false) => {
            for part in 0..2 {
                let sign = if part == 1 && a.conj { -1.0 } else { 1.0 };
                gemm::gemm(
                    m,
                    n,
                    k,
                    &Operand { ptr: a.ptr.add(part), rs: 2 * a.rs, cs: 2 * a.cs, mode: AMode::Real { sign } },
                    &Operand { ptr: b.ptr, rs: b.rs, cs: b.cs, mode: BMode::Real },
                    &Dest { ptr: c.add(part), rs: 2 * c_rs, cs: 2 },
                    accumulate,
                    work,
                );
            }
        }
    }
}

/// The output columns `yj` whose input column `yj·stride + off` lies in `0..w`.
fn valid_cols(wo: usize, w: usize, stride: usize, off: isize) -> (usize, usize) {
    let s = stride as isize;
    // Smallest yj with yj·s + off ≥ 0, largest with yj·s + off ≤ w − 1.
    let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
    let hi = if (w as isize - 1 - off) < 0 { 0 } else { (w as isize - 1 - off) / s + 1 };
    let lo = (lo as usize).min(wo);
    (lo, (hi.max(0) as usize).clamp(lo, wo))
}

/// Writes `cols[kidx·s0 + p·s1] = x[c, hi, wi]` (zero outside the image) for the input
/// channels `c0..c0+cg` of one image `x` (`c·h·w` elements of `esize` f32 each).
///
/// # Safety
/// `x` and `cols` must hold the extents implied by `s`.
pub unsafe fn im2col(
    s: &ConvShape,
    x: *const f32,
    c0: usize,
    esize: usize,
    cols: *mut f32,
    s0: usize,
    s1: usize,
) {
    let [_, _, h, w] = s.x;
    let [_, cg, kh, kw] = s.w;
    let [ho, wo] = s.out;
    let g = s.geom;
    let zero_run = |dst: *mut f32, from: usize, to: usize| {
        for yj in from..to {
            for e in 0..esize {
                *dst.add(yj * s1 * esize + e) = 0.0;
            }
        }
    };
    for ci in 0..cg {
        let plane = x.add((c0 + ci) * h * w * esize);
        for ki in 0..kh {
            for kj in 0..kw {
                let kidx = (ci * kh + ki) * kw + kj;
                let row = cols.add(kidx * s0 * esize);
                let off = (kj * g.dilation[1]) as isize - g.pad[1] as isize;
                let (lo, hi_col) = valid_cols(wo, w, g.stride[1], off);
                for yi in 0..ho {
                    let hi = (yi * g.stride[0] + ki * g.dilation[0]) as isize - g.pad[0] as isize;
                    let dst = row.add(yi * wo * s1 * esize);
                    if hi < 0 || hi >= h as isize {
                        zero_run(dst, 0, wo);
                        continue;
                    }
                    let src = plane.add(hi as usize * w * esize);
                    zero_run(dst, 0, lo);
                    zero_run(dst, hi_col, wo);
                    if s1 == 1 && g.stride[1] == 1 {
                        let first = (lo as isize + off) as usize;
                        std::ptr::copy_nonoverlapping(
                            src.add(first * esize),
                            dst.add(lo * esize),
                            (hi_col - lo) * esize,
                        );
                    } else if esize == 2 {
                        // One complex element (8 bytes) per output column.
                        for yj in lo..hi_col {
                            let wj = (yj as isize * g.stride[1] as isize + off) as usize;
                            let v = (src.add(2 * wj) as *const [f32; 2]).read_unaligned();
                            (dst.add(2 * yj * s1) as *mut [f32; 2]).write_unaligned(v);
                        }
                    } else {
                        for yj in lo..hi_col {
                            let wj = (yj as isize * g.stride[1] as isize + off) as usize;
                            for e in 0..esize {
                                *dst.add(yj * s1 * esize + e) = *src.add(wj * esize + e);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Scatter-adds `cols[kidx, p]` (row-major `k×p`) into one image `dx` (channels `c0..c0+cg`).
///
/// # Safety
/// `cols` and `dx` must hold the extents implied by `s`.
pub unsafe fn col2im(s: &ConvShape, cols: *const f32, esize: usize, dx: *mut f32, c0: usize) {
    let [_, _, h, w] = s.x;
    let [_, cg, kh, kw] = s.w;
    let [ho, wo] = s.out;
    let g = s.geom;
    let p = ho * wo;
    for ci in 0..cg {
        let plane = dx.add((c0 + ci) * h * w * esize);
        for ki in 0..kh {
            for kj in 0..kw {
                let kidx = (ci * kh + ki) * kw + kj;
                let row = cols.add(kidx * p * esize);
                let off = (kj * g.dilation[1]) as isize - g.pad[1] as isize;
                let (lo, hi_col) = valid_cols(wo, w, g.stride[1], off);
                for yi in 0..ho {
                    let hi = (yi * g.stride[0] + ki * g.dilation[0]) as isize - g.pad[0] as isize;
                    if hi < 0 || hi >= h as isize {
                        continue;
                    }
                    let dst = plane.add(hi as usize * w * esize);
                    let src = row.add(yi * wo * esize);
                    if g.stride[1] == 1 {
                        let n = (hi_col - lo) * esize;
                        let d = dst.add((lo as isize + off) as usize * esize);
                        let sr = src.add(lo * esize);
                        for i in 0..n {
                            *d.add(i) += *sr.add(i);
                        }
                    } else {
                        for yj in lo..hi_col {
                            let wj = (yj as isize * g.stride[1] as isize + off) as usize;
                            for e in 0..esize {
                                *dst.add(wj * esize + e) += *src.add(yj * esize + e);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn es(c: bool) -> usize {
    if c {
        2
    } else {
        1
    }
}

/// Forward convolution of image `n`: `y[n] = w ⋆ x[n]`.
///
/// # Safety
/// Pointers address whole tensors of the shapes in `s`; `cols` holds `k·p` elements of the
/// input dtype; `work` is gemm workspace.
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_image(
    s: &ConvShape,
    t: ConvTypes,
    n: usize,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    cols: *mut f32,
    work: &mut [f32],
) {
    let [_, c, h, wd] = s.x;
    let (k, p, og) = (s.k(), s.p(), s.og());
    let (ex, ew, ey) = (es(t.x), es(t.w), es(t.x || t.w));
    let xn = x.add(n * c * h * wd * ex);
    let yn = y.add(n * s.w[0] * p * ey);
    for grp in 0..s.geom.groups {
        let c0 = grp * s.w[1];
        let bmat = if s.pointwise() {
            Mat { ptr: xn.add(c0 * h * wd * ex), rs: p as isize, cs: 1, complex: t.x, conj: t.conj[0] }
        } else {
            im2col(s, xn, c0, ex, cols, p, 1);
            Mat { ptr: cols, rs: p as isize, cs: 1, complex: t.x, conj: t.conj[0] }
        };
        let amat =
            Mat { ptr: w.add(grp * og * k * ew), rs: k as isize, cs: 1, complex: t.w, conj: t.conj[1] };
        matmul(og, p, k, amat, bmat, yn.add(grp * og * p * ey), p as isize, false, work);
    }
}

/// Transposed convolution of image `n`: `dx[n] = Σ_o dy[n, o] · w[o]` scattered back.
/// Here `s` is the forward geometry (`s.x` is `dx`'s shape), `t.x` says whether `dy` is complex.
///
/// # Safety
/// As [`conv_image`]; `cols` holds `k·p` elements of the output dtype.
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_transpose_image(
    s: &ConvShape,
    t: ConvTypes,
    n: usize,
    dy: *const f32,
    w: *const f32,
    dx: *mut f32,
    cols: *mut f32,
    work: &mut [f32],
) {
    let [_, c, h, wd] = s.x;
    let (k, p, og) = (s.k(), s.p(), s.og());
    let (edy, ew, eo) = (es(t.x), es(t.w), es(t.x || t.w));
    let dyn_ = dy.add(n * s.w[0] * p * edy);
    let dxn = dx.add(n * c * h * wd * eo);
    if !s.pointwise() {
        for i in 0..c * h * wd * eo {
            *dxn.add(i) = 0.0;
        }
    }
    for grp in 0..s.geom.groups {
        let c0 = grp * s.w[1];
        // cols[k, p] = w_gᵀ[k, og] · dy_g[og, p]
        let amat =
            Mat { ptr: w.add(grp * og * k * ew), rs: 1, cs: k as isize, complex: t.w, conj: t.conj[1] };
        let bmat =
            Mat { ptr: dyn_.add(grp * og * p * edy), rs: p as isize, cs: 1, complex: t.x, conj: t.conj[0] };
        if s.pointwise() {
            matmul(k, p, og, amat, bmat, dxn.add(c0 * h * wd * eo), p as isize, false, work);
        } else {
            matmul(k, p, og, amat, bmat, cols, p as isize, false, work);
            col2im(s, cols, eo, dxn, c0);
        }
    }
}

/// Adds image `n`'s contribution to the weight gradient: `dw_g += dy_g[n] · cols(x[n])ᵀ`.
/// `t.x`: `x` complex; `t.w`: `dy` complex; `t.conj` = (conj x, conj dy).
///
/// # Safety
/// As [`conv_image`]; `cols` holds `p·k` elements of `x`'s dtype (stored transposed).
#[allow(clippy::too_many_arguments)]
pub unsafe fn weight_grad_image(
    s: &ConvShape,
    t: ConvTypes,
    n: usize,
    x: *const f32,
    dy: *const f32,
    dw: *mut f32,
    accumulate: bool,
    cols: *mut f32,
    work: &mut [f32],
) {
    let [_, c, h, wd] = s.x;
    let (k, p, og) = (s.k(), s.p(), s.og());
    let (ex, edy, eo) = (es(t.x), es(t.w), es(t.x || t.w));
    let xn = x.add(n * c * h * wd * ex);
    let dyn_ = dy.add(n * s.w[0] * p * edy);
    for grp in 0..s.geom.groups {
        let c0 = grp * s.w[1];
        let bmat = if s.pointwise() {
            Mat { ptr: xn.add(c0 * h * wd * ex), rs: 1, cs: p as isize, complex: t.x, conj: t.conj[0] }
        } else {
            im2col(s, xn, c0, ex, cols, 1, k);
            Mat { ptr: cols, rs: k as isize, cs: 1, complex: t.x, conj: t.conj[0] }
        };
        let amat =
            Mat { ptr: dyn_.add(grp * og * p * edy), rs: p as isize, cs: 1, complex: t.w, conj: t.conj[1] };
        matmul(og, k, p, amat, bmat, dw.add(grp * og * k * eo), k as isize, accumulate, work);
    }
}
