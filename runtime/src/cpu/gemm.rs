//! Single-threaded f32 matrix multiply with packing into caller-owned workspace.
//!
//! Why not the `gemm` crate: it allocates its packing buffers on every call, and the CPU back
//! end promises no heap allocation inside a step. This is the classic Goto/BLIS structure
//! (pack a `KC×NC` panel of B and an `MC×KC` block of A, then a 6×16 register-tiled
//! micro-kernel, AVX2+FMA when the CPU has it) with the packing step doing the complex work:
//! a complex operand is read as its interleaved real view, and a complex right-hand side can
//! be expanded to the 2×2 real block form `[[re, im], [-im, re]]`, so a complex product is one
//! real product of twice the depth and width (no separate re/im planes needed).

/// Micro-tile rows.
pub const MR: usize = 6;
/// Micro-tile columns.
pub const NR: usize = 16;
/// Depth of one packed block.
pub const KC: usize = 256;
/// Rows of one packed A block (a multiple of [`MR`]).
pub const MC: usize = 96;
/// Columns of one packed B panel (a multiple of [`NR`]).
pub const NC: usize = 2048;

/// f32 elements of packing workspace one thread needs.
pub const WORKSPACE_F32: usize = MC * KC + KC * NC;

/// How the left operand's real matrix is read from memory.
#[derive(Clone, Copy, Debug)]
pub enum AMode {
    /// Real storage, each element times `sign`.
    Real { sign: f32 },
    /// Complex storage read as a real matrix of twice the columns (`re, im` of element
    /// `(i, p)` are columns `2p, 2p+1`); `conj` negates the imaginary columns.
    Interleaved { conj: bool },
}

/// How the right operand's real matrix is read from memory.
#[derive(Clone, Copy, Debug)]
pub enum BMode {
    /// Real storage.
    Real,
    /// Complex storage read as a real matrix of twice the columns; `conj` negates `im`.
    Interleaved { conj: bool },
    /// Complex storage expanded to twice the rows and columns: element `(p, j)` becomes the
    /// block `[[re, im], [-im, re]]` (after an optional conjugation), so that
    /// `interleaved(A) · expand(B) = interleaved(A·B)`.
    Expand { conj: bool },
}

/// A strided operand: `ptr` to f32 storage, strides in storage elements (complex elements
/// for the complex modes).
#[derive(Clone, Copy, Debug)]
pub struct Operand<M> {
    /// Base pointer.
    pub ptr: *const f32,
    /// Row stride.
    pub rs: isize,
    /// Column stride.
    pub cs: isize,
    /// Addressing mode.
    pub mode: M,
}

/// The real matrix `C` written by [`gemm`]: `ptr` with strides in f32 elements.
#[derive(Clone, Copy, Debug)]
pub struct Dest {
    /// Base pointer.
    pub ptr: *mut f32,
    /// Row stride.
    pub rs: isize,
    /// Column stride.
    pub cs: isize,
}

#[inline(always)]
unsafe fn a_at(a: &Operand<AMode>, i: usize, q: usize) -> f32 {
    match a.mode {
        AMode::Real { sign } => sign * *a.ptr.offset(i as isize * a.rs + q as isize * a.cs),
        AMode::Interleaved { conj } => {
            let x = *a.ptr.offset(2 * (i as isize * a.rs + (q / 2) as isize * a.cs) + (q & 1) as isize);
            if conj && q & 1 == 1 {
                -x
            } else {
                x
            }
        }
    }
}

#[inline(always)]
unsafe fn b_at(b: &Operand<BMode>, p: usize, j: usize) -> f32 {
    match b.mode {
        BMode::Real => *b.ptr.offset(p as isize * b.rs + j as isize * b.cs),
        BMode::Interleaved { conj } => {
            let x = *b.ptr.offset(2 * (p as isize * b.rs + (j / 2) as isize * b.cs) + (j & 1) as isize);
            if conj && j & 1 == 1 {
                -x
            } else {
                x
            }
        }
        BMode::Expand { conj } => {
            let base = b.ptr.offset(2 * ((p / 2) as isize * b.rs + (j / 2) as isize * b.cs));
            let (re, im) = (*base, if conj { -*base.add(1) } else { *base.add(1) });
            match (p & 1, j & 1) {
                (0, 0) | (1, 1) => re,
                (0, _) => im,
                _ => -im,
            }
        }
    }
}

/// Packs rows `i0..i0+mc`, depth `p0..p0+kc` of A into `MR`-row slivers (zero-padded).
unsafe fn pack_a(a: &Operand<AMode>, i0: usize, mc: usize, p0: usize, kc: usize, out: &mut [f32]) {
    let mut o = 0;
    for ib in (0..mc).step_by(MR) {
        let rows = MR.min(mc - ib);
        if matches!(a.mode, AMode::Real { sign } if sign == 1.0) && a.cs == 1 {
            for p in 0..kc {
                for r in 0..MR {
                    out[o + r] = if r < rows {
                        *a.ptr.offset((i0 + ib + r) as isize * a.rs + (p0 + p) as isize)
                    } else {
                        0.0
                    };
                }
                o += MR;
            }
        } else {
            for p in 0..kc {
                for r in 0..MR {
                    out[o + r] = if r < rows { a_at(a, i0 + ib + r, p0 + p) } else { 0.0 };
                }
                o += MR;
            }
        }
    }
}

/// Packs depth `p0..p0+kc`, columns `j0..j0+nc` of B into `NR`-column slivers (zero-padded).
unsafe fn pack_b(b: &Operand<BMode>, p0: usize, kc: usize, j0: usize, nc: usize, out: &mut [f32]) {
    let mut o = 0;
    for jb in (0..nc).step_by(NR) {
        let cols = NR.min(nc - jb);
        let full = cols == NR && b.cs == 1;
        if full && matches!(b.mode, BMode::Real) {
            for p in 0..kc {
                let src = b.ptr.offset((p0 + p) as isize * b.rs + (j0 + jb) as isize);
                std::ptr::copy_nonoverlapping(src, out.as_mut_ptr().add(o), NR);
                o += NR;
            }
        } else if let (true, BMode::Expand { conj } | BMode::Interleaved { conj }) = (full, b.mode) {
            // Contiguous complex columns: `NR` real columns are `NR/2` complex ones.
            let expand = matches!(b.mode, BMode::Expand { .. });
            let sign = if conj { -1.0f32 } else { 1.0 };
            let jc = ((j0 + jb) / 2) as isize;
            if has_avx2_fma() {
                pack_b_complex_avx2(b, p0, kc, jc, expand, conj, out.as_mut_ptr().add(o));
                o += kc * NR;
                continue;
            }
            for p in 0..kc {
                let row = p0 + p;
                let (k, r) = if expand { (row / 2, row & 1) } else { (row, 0) };
                let src = b.ptr.offset(2 * (k as isize * b.rs + jc));
                let dst = &mut out[o..o + NR];
                for q in 0..NR / 2 {
                    let (re, im) = (*src.add(2 * q), sign * *src.add(2 * q + 1));
                    if r == 0 {
                        dst[2 * q] = re;
                        dst[2 * q + 1] = im;
                    } else {
                        dst[2 * q] = -im;
                        dst[2 * q + 1] = re;
                    }
                }
                o += NR;
            }
        } else {
            for p in 0..kc {
                for c in 0..NR {
                    out[o + c] = if c < cols { b_at(b, p0 + p, j0 + jb + c) } else { 0.0 };
                }
                o += NR;
            }
        }
    }
}

/// The contiguous complex case of [`pack_b`] for one `NR`-column sliver starting at complex
/// column `jc`: `kc` rows of `NR` floats written to `out`, 8 complex values per vector.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_b_complex_avx2(
    b: &Operand<BMode>,
    p0: usize,
    kc: usize,
    jc: isize,
    expand: bool,
    conj: bool,
    out: *mut f32,
) {
    use std::arch::x86_64::*;
    let odd = _mm256_castsi256_ps(_mm256_setr_epi32(0, i32::MIN, 0, i32::MIN, 0, i32::MIN, 0, i32::MIN));
    let even = _mm256_castsi256_ps(_mm256_setr_epi32(i32::MIN, 0, i32::MIN, 0, i32::MIN, 0, i32::MIN, 0));
    let cmask = if conj { odd } else { _mm256_setzero_ps() };
    for p in 0..kc {
        let row = p0 + p;
        let (k, r) = if expand { (row / 2, row & 1) } else { (row, 0) };
        let src = b.ptr.offset(2 * (k as isize * b.rs + jc));
        let dst = out.add(p * NR);
        // `[re, im]` pairs (conjugated if asked); the odd rows of the expansion are `[-im, re]`.
        let mut v0 = _mm256_xor_ps(_mm256_loadu_ps(src), cmask);
        let mut v1 = _mm256_xor_ps(_mm256_loadu_ps(src.add(8)), cmask);
        if r == 1 {
            v0 = _mm256_xor_ps(_mm256_permute_ps(v0, 0xB1), even);
            v1 = _mm256_xor_ps(_mm256_permute_ps(v1, 0xB1), even);
        }
        _mm256_storeu_ps(dst, v0);
        _mm256_storeu_ps(dst.add(8), v1);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pack_b_complex_avx2(
    _b: &Operand<BMode>,
    _p0: usize,
    _kc: usize,
    _jc: isize,
    _expand: bool,
    _conj: bool,
    _out: *mut f32,
) {
    unreachable!("has_avx2_fma() is false off x86_64")
}

/// `C = A·B` (or `C += A·B` when `accumulate`), `A` m×k, `B` k×n as real matrices.
///
/// # Safety
/// The operands must address valid memory for the given extents and strides; `C` must not
/// overlap `A` or `B`. `work` must hold at least [`WORKSPACE_F32`] elements.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: &Operand<AMode>,
    b: &Operand<BMode>,
    c: &Dest,
    accumulate: bool,
    work: &mut [f32],
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    *c.ptr.offset(i as isize * c.rs + j as isize * c.cs) = 0.0;
                }
            }
        }
        return;
    }
    let (pa, pb) = work.split_at_mut(MC * KC);
    let simd = has_avx2_fma();
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            pack_b(b, p0, kc, j0, nc, pb);
            let acc = accumulate || p0 > 0;
            for i0 in (0..m).step_by(MC) {
                let mc = MC.min(m - i0);
                pack_a(a, i0, mc, p0, kc, pa);
                for jb in (0..nc).step_by(NR) {
                    for ib in (0..mc).step_by(MR) {
                        let ap = pa.as_ptr().add(ib * kc);
                        let bp = pb.as_ptr().add(jb * kc);
                        let rows = MR.min(mc - ib);
                        let cols = NR.min(nc - jb);
                        let base = c.ptr.offset((i0 + ib) as isize * c.rs + (j0 + jb) as isize * c.cs);
                        if simd && cols == NR && c.cs == 1 {
                            // Full-width tile, contiguous rows: the kernel writes C's `rows` rows itself.
                            kernel_avx2_direct(kc, ap, bp, base, c.rs, rows, acc);
                            continue;
                        }
                        let mut tile = [0f32; MR * NR];
                        if simd {
                            kernel_avx2(kc, ap, bp, &mut tile);
                        } else {
                            kernel_generic(kc, ap, bp, &mut tile);
                        }
                        for r in 0..rows {
                            let row = base.offset(r as isize * c.rs);
                            if acc {
                                for q in 0..cols {
                                    *row.offset(q as isize * c.cs) += tile[r * NR + q];
                                }
                            } else {
                                for q in 0..cols {
                                    *row.offset(q as isize * c.cs) = tile[r * NR + q];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Whether the AVX2+FMA micro-kernel can run here.
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

unsafe fn kernel_generic(kc: usize, a: *const f32, b: *const f32, tile: &mut [f32; MR * NR]) {
    for p in 0..kc {
        for r in 0..MR {
            let x = *a.add(p * MR + r);
            for q in 0..NR {
                tile[r * NR + q] += x * *b.add(p * NR + q);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2(kc: usize, a: *const f32, b: *const f32, tile: &mut [f32; MR * NR]) {
    use std::arch::x86_64::*;
    let mut c = [[_mm256_setzero_ps(); 2]; MR];
    for p in 0..kc {
        let b0 = _mm256_loadu_ps(b.add(p * NR));
        let b1 = _mm256_loadu_ps(b.add(p * NR + 8));
        let ap = a.add(p * MR);
        for (r, cr) in c.iter_mut().enumerate() {
            let x = _mm256_broadcast_ss(&*ap.add(r));
            cr[0] = _mm256_fmadd_ps(x, b0, cr[0]);
            cr[1] = _mm256_fmadd_ps(x, b1, cr[1]);
        }
    }
    for (r, cr) in c.iter().enumerate() {
        _mm256_storeu_ps(tile.as_mut_ptr().add(r * NR), cr[0]);
        _mm256_storeu_ps(tile.as_mut_ptr().add(r * NR + 8), cr[1]);
    }
}

/// As [`kernel_avx2`], but stores (or, with `acc`, adds) the first `rows` rows of the `MR×NR`
/// tile straight into `C` at `c` with row stride `rs` and unit column stride, skipping the
/// scratch tile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2_direct(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    rs: isize,
    rows: usize,
    acc: bool,
) {
    use std::arch::x86_64::*;
    let mut t = [[_mm256_setzero_ps(); 2]; MR];
    for p in 0..kc {
        let b0 = _mm256_loadu_ps(b.add(p * NR));
        let b1 = _mm256_loadu_ps(b.add(p * NR + 8));
        let ap = a.add(p * MR);
        for (r, tr) in t.iter_mut().enumerate() {
            let x = _mm256_broadcast_ss(&*ap.add(r));
            tr[0] = _mm256_fmadd_ps(x, b0, tr[0]);
            tr[1] = _mm256_fmadd_ps(x, b1, tr[1]);
        }
    }
    for (r, tr) in t.iter().enumerate().take(rows) {
        let row = c.offset(r as isize * rs);
        if acc {
            _mm256_storeu_ps(row, _mm256_add_ps(_mm256_loadu_ps(row), tr[0]));
            _mm256_storeu_ps(row.add(8), _mm256_add_ps(_mm256_loadu_ps(row.add(8)), tr[1]));
        } else {
            _mm256_storeu_ps(row, tr[0]);
            _mm256_storeu_ps(row.add(8), tr[1]);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel_avx2_direct(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    rs: isize,
    rows: usize,
    acc: bool,
) {
    let mut tile = [0f32; MR * NR];
    kernel_generic(kc, a, b, &mut tile);
    for r in 0..rows {
        for q in 0..NR {
            let d = c.offset(r as isize * rs + q as isize);
            *d = if acc { *d + tile[r * NR + q] } else { tile[r * NR + q] };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel_avx2(kc: usize, a: *const f32, b: *const f32, tile: &mut [f32; MR * NR]) {
    kernel_generic(kc, a, b, tile)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn real_product_matches_naive_loops() {
        let (m, n, k) = (13, 37, 300);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0).collect();
        let mut c = vec![0f32; m * n];
        let mut work = vec![0f32; WORKSPACE_F32];
        // SAFETY: the operands and the output are vectors of exactly the extents passed, and
        // `work` holds WORKSPACE_F32 floats.
        unsafe {
            gemm(
                m,
                n,
                k,
                &Operand { ptr: a.as_ptr(), rs: k as isize, cs: 1, mode: AMode::Real { sign: 1.0 } },
                &Operand { ptr: b.as_ptr(), rs: n as isize, cs: 1, mode: BMode::Real },
                &Dest { ptr: c.as_mut_ptr(), rs: n as isize, cs: 1 },
                false,
                &mut work,
            );
        }
        let want = naive(m, n, k, &a, &b);
        for (x, y) in c.iter().zip(&want) {
            assert!((x - y).abs() <= 1e-3 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    /// Complex × complex through the expanded right operand (and complex real-view products
    /// through the interleaved one), with every conjugation, both accumulate modes, and widths
    /// that hit the full-sliver fast paths and the ragged edge; checked against f64 loops.
    #[test]
    fn complex_products_match_naive_loops() {
        let seed = 0x5eed_c0de_u64;
        println!("seed {seed:#x}");
        let mut state = seed;
        let mut rnd = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let mut work = vec![0f32; WORKSPACE_F32];
        for &(m, n, k) in &[(7usize, 24usize, 19usize), (13, 40, 150), (6, 8, 1)] {
            let a: Vec<f32> = (0..2 * m * k).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..2 * k * n).map(|_| rnd()).collect();
            let c0: Vec<f32> = (0..2 * m * n).map(|_| rnd()).collect();
            for (ca, cb, acc) in
                [(false, false, false), (true, false, true), (false, true, false), (true, true, true)]
            {
                let at = |i: usize, p: usize| {
                    let (re, im) = (a[2 * (i * k + p)] as f64, a[2 * (i * k + p) + 1] as f64);
                    (re, if ca { -im } else { im })
                };
                let bt = |p: usize, j: usize| {
                    let (re, im) = (b[2 * (p * n + j)] as f64, b[2 * (p * n + j) + 1] as f64);
                    (re, if cb { -im } else { im })
                };
                let mut c = c0.clone();
                // SAFETY: the operands and the output are vectors of exactly the extents passed, and
                // `work` holds WORKSPACE_F32 floats.
                unsafe {
                    gemm(
                        m,
                        2 * n,
                        2 * k,
                        &Operand {
                            ptr: a.as_ptr(),
                            rs: k as isize,
                            cs: 1,
                            mode: AMode::Interleaved { conj: ca },
                        },
                        &Operand { ptr: b.as_ptr(), rs: n as isize, cs: 1, mode: BMode::Expand { conj: cb } },
                        &Dest { ptr: c.as_mut_ptr(), rs: 2 * n as isize, cs: 1 },
                        acc,
                        &mut work,
                    );
                }
                for i in 0..m {
                    for j in 0..n {
                        let (mut re, mut im) = (0f64, 0f64);
                        for p in 0..k {
                            let ((ar, ai), (br, bi)) = (at(i, p), bt(p, j));
                            re += ar * br - ai * bi;
                            im += ar * bi + ai * br;
                        }
                        if acc {
                            re += c0[2 * (i * n + j)] as f64;
                            im += c0[2 * (i * n + j) + 1] as f64;
                        }
                        let (x, y) = (c[2 * (i * n + j)] as f64, c[2 * (i * n + j) + 1] as f64);
                        assert!((x - re).abs() <= 1e-4 * (1.0 + re.abs()), "re ({m},{n},{k}) {x} vs {re}");
                        assert!((y - im).abs() <= 1e-4 * (1.0 + im.abs()), "im ({m},{n},{k}) {y} vs {im}");
                    }
                }
                // Real left operand (the real parts of `a`) times the interleaved view of `b`.
                let ar: Vec<f32> = (0..m * k).map(|q| a[2 * q]).collect();
                let mut c = vec![0f32; 2 * m * n];
                // SAFETY: the operands and the output are vectors of exactly the extents passed, and
                // `work` holds WORKSPACE_F32 floats.
                unsafe {
                    gemm(
                        m,
                        2 * n,
                        k,
                        &Operand { ptr: ar.as_ptr(), rs: k as isize, cs: 1, mode: AMode::Real { sign: 1.0 } },
                        &Operand {
                            ptr: b.as_ptr(),
                            rs: n as isize,
                            cs: 1,
                            mode: BMode::Interleaved { conj: cb },
                        },
                        &Dest { ptr: c.as_mut_ptr(), rs: 2 * n as isize, cs: 1 },
                        false,
                        &mut work,
                    );
                }
                for i in 0..m {
                    for j in 0..n {
                        let (mut re, mut im) = (0f64, 0f64);
                        for p in 0..k {
                            let (br, bi) = bt(p, j);
                            re += ar[i * k + p] as f64 * br;
                            im += ar[i * k + p] as f64 * bi;
                        }
                        let (x, y) = (c[2 * (i * n + j)] as f64, c[2 * (i * n + j) + 1] as f64);
                        assert!((x - re).abs() <= 1e-4 * (1.0 + re.abs()), "{x} vs {re}");
                        assert!((y - im).abs() <= 1e-4 * (1.0 + im.abs()), "{y} vs {im}");
                    }
                }
            }
        }
    }
}
