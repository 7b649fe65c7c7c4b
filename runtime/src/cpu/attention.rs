//! Fused attention on the CPU: `AttnLse` (online log-sum-exp), `Attention` and its gradients
//! as blocked loops over (query block × key block). Each thread holds one block of scores in
//! its workspace, so no `[T, S]` buffer ever exists; the backward recomputes the weights block
//! by block from `lse`. Work is split over (batch·head, query block) — over key blocks for
//! `dk ‖ dv` — so every thread writes disjoint output rows.
//!
//! Masked weights are carried as the score `-inf`: their `p = exp(-inf - lse) = 0` drops them
//! from every sum, and a row with no visible key keeps `lse = 0` and zero output/gradients.

use super::pool::Pool;
use cvc_compiler::back::cpu::{AttentionCall, AttnKind, BLOCK_K, BLOCK_Q};
use cvc_compiler::ir::{dropout_keep, AttnScore, AttnSpec, AttnWrt};
use std::ops::Range;

/// Raw arena pointers of one call (complex operands interleaved re, im).
#[derive(Clone, Copy)]
struct Ptrs {
    q: *const f32,
    k: *const f32,
    v: *const f32,
    lse: *const f32,
    o: *const f32,
    d_o: *const f32,
    mask: *const f32,
    out: *mut f32,
    step: u32,
}

// SAFETY: the pointers address the arena, which outlives the call; threads only read the
// operands and write disjoint output rows (see `run`).
unsafe impl Send for Ptrs {}
// SAFETY: as for Send: shared references only read the pointers.
unsafe impl Sync for Ptrs {}

/// The per-thread block buffers, carved from one workspace of
/// [`cvc_compiler::back::cpu::ATTENTION_WORKSPACE_WORDS`] f32.
struct Block {
    /// `c = q·kᴴ`, interleaved, `BLOCK_Q × BLOCK_K`.
    c: *mut f32,
    /// Scores, then weights `p`, `BLOCK_Q × BLOCK_K`.
    p: *mut f32,
    /// One f32 per query row (δ), and one more (row max).
    row: *mut f32,
}

impl Block {
    /// # Safety
    /// `ws` addresses `ATTENTION_WORKSPACE_WORDS` f32.
    unsafe fn new(ws: *mut f32) -> Block {
        let n = BLOCK_Q * BLOCK_K;
        Block { c: ws, p: ws.add(2 * n), row: ws.add(5 * n) }
    }
}

/// Complex-value offsets of head `bh % H` of batch row `bh / H` (see `AttentionCall`).
impl Ptrs {
    /// Row `i` of the query.
    unsafe fn q(&self, a: &AttentionCall, bh: usize, i: usize) -> *const f32 {
        self.q.add(2 * (((bh / a.h) * a.t + i) * a.ld[0] + (bh % a.h) * a.d))
    }
    /// Row `j` of the key.
    unsafe fn k(&self, a: &AttentionCall, bh: usize, j: usize) -> *const f32 {
        self.k.add(2 * (((bh / a.h) * a.s + j) * a.ld[1] + (bh % a.h) * a.d))
    }
    /// Row `j` of the value.
    unsafe fn v(&self, a: &AttentionCall, bh: usize, j: usize) -> *const f32 {
        self.v.add(2 * (((bh / a.h) * a.s + j) * a.ld[2] + (bh % a.h) * a.dv))
    }
}

/// Complex-value offset of head `bh % H`'s row `r` in a token-major `[B, rows, H·w]` tensor.
fn packed(a: &AttentionCall, bh: usize, rows: usize, r: usize, w: usize) -> usize {
    ((bh / a.h) * rows + r) * a.h * w + (bh % a.h) * w
}

/// Runs `call` on the pool; `workspace(t)` is thread `t`'s attention workspace.
///
/// # Safety
/// The offsets of `call` address its operands inside the arena at `base` (the compiler
/// resolved them from the memory plan); `workspace(t)` points at
/// `ATTENTION_WORKSPACE_WORDS` f32 owned by thread `t`.
pub unsafe fn run(
    pool: &Pool,
    base: *mut u8,
    workspace: &(dyn Fn(usize) -> *mut f32 + Sync),
    call: &AttentionCall,
) {
    let at = |o: Option<usize>| o.map_or(std::ptr::null(), |o| base.add(o) as *const f32);
    let ptrs = Ptrs {
        q: at(Some(call.q)),
        k: at(Some(call.k)),
        v: at(call.v),
        lse: at(call.lse),
        o: at(call.o),
        d_o: at(call.d_o),
        mask: at(call.mask),
        out: base.add(call.out) as *mut f32,
        step: call.step.map_or(0, |s| *(base.add(s) as *const i32) as u32),
    };
    let by_keys = call.kind == AttnKind::Grad(AttnWrt::KV);
    let blocks = if by_keys { call.s.div_ceil(BLOCK_K) } else { call.t.div_ceil(BLOCK_Q) };
    let units = call.b * call.h * blocks;
    let threads = pool.threads();
    let work = call.b * call.h * call.t * call.s * (call.d + call.dv.max(1));
    let parts = if threads > 1 && work >= 1 << 15 && units >= 2 { threads } else { 1 };
    let job = |th: usize| {
        let per = units.div_ceil(parts);
        let (lo, hi) = ((th * per).min(units), ((th + 1) * per).min(units));
        // SAFETY: thread `th` owns its workspace and the output rows of units `lo..hi`.
        unsafe {
            let blk = Block::new(workspace(th));
            for u in lo..hi {
                let (bh, blkno) = (u / blocks, u % blocks);
                match call.kind {
                    AttnKind::Lse => lse_rows(call, &ptrs, &blk, bh, blkno * BLOCK_Q),
                    AttnKind::Forward => forward_rows(call, &ptrs, &blk, bh, blkno * BLOCK_Q),
                    AttnKind::Grad(AttnWrt::Q) => dq_rows(call, &ptrs, &blk, bh, blkno * BLOCK_Q),
                    AttnKind::Grad(AttnWrt::KV) => dkv_rows(call, &ptrs, &blk, bh, blkno * BLOCK_K),
                }
            }
        }
    };
    if parts > 1 {
        pool.run(&job);
    } else {
        job(0);
    }
}

/// Fills `blk.c` and `blk.p` (scores, `-inf` where masked) for queries `rows` and keys `cols`
/// of head `bh`.
///
/// # Safety
/// As [`run`]; the block fits the workspace (at most `BLOCK_Q` rows, `BLOCK_K` columns).
unsafe fn scores(
    a: &AttentionCall,
    p: &Ptrs,
    blk: &Block,
    bh: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    let (i0, ni, j0, nj) = (rows.start, rows.len(), cols.start, cols.len());
    let d = a.d;
    let b = bh / a.h;
    for ii in 0..ni {
        let i = i0 + ii;
        let q = p.q(a, bh, i);
        for jj in 0..nj {
            let j = j0 + jj;
            let at = ii * BLOCK_K + jj;
            let masked = a.spec.causal_masked(i, j) || (!p.mask.is_null() && *p.mask.add(b * a.s + j) != 0.0);
            if masked {
                *blk.p.add(at) = f32::NEG_INFINITY;
                *blk.c.add(2 * at) = 0.0;
                *blk.c.add(2 * at + 1) = 0.0;
                continue;
            }
            let k = p.k(a, bh, j);
            let (mut re, mut im) = (0.0f32, 0.0f32);
            for x in 0..d {
                let (qr, qi) = (*q.add(2 * x), *q.add(2 * x + 1));
                let (kr, ki) = (*k.add(2 * x), *k.add(2 * x + 1));
                // q · conj(k)
                re += qr * kr + qi * ki;
                im += qi * kr - qr * ki;
            }
            *blk.c.add(2 * at) = re;
            *blk.c.add(2 * at + 1) = im;
            let s = match a.spec.score {
                AttnScore::Real => re,
                AttnScore::Abs => re.hypot(im),
            };
            *blk.p.add(at) = a.spec.scale as f32 * s;
        }
    }
}

/// The dropout factor of weight `(bh, i, j)`: 0 or `1/(1-p)`, 1 without dropout.
fn keep(a: &AttentionCall, step: u32, bh: usize, i: usize, j: usize) -> f32 {
    match a.spec.dropout {
        None => 1.0,
        Some((p, salt)) => {
            let idx = AttnSpec::dropout_index(bh / a.h, bh % a.h, i, j, a.h, a.t, a.s);
            if dropout_keep(p, salt, step, idx) {
                (1.0 / (1.0 - p)) as f32
            } else {
                0.0
            }
        }
    }
}

/// Turns the scores of `blk.p` into weights `exp(s - lse_i)` (0 where masked).
///
/// # Safety
/// As [`scores`].
unsafe fn weights(a: &AttentionCall, p: &Ptrs, blk: &Block, bh: usize, i0: usize, ni: usize, nj: usize) {
    for ii in 0..ni {
        let l = *p.lse.add(bh * a.t + i0 + ii);
        for jj in 0..nj {
            let w = blk.p.add(ii * BLOCK_K + jj);
            *w = (*w - l).exp();
        }
    }
}

/// `lse` of queries `i0..` of head `bh`, by the online (running max) log-sum-exp.
///
/// # Safety
/// As [`run`].
unsafe fn lse_rows(a: &AttentionCall, p: &Ptrs, blk: &Block, bh: usize, i0: usize) {
    let ni = BLOCK_Q.min(a.t - i0);
    let (m, l) = (blk.row, blk.row.add(BLOCK_Q));
    for ii in 0..ni {
        *m.add(ii) = f32::NEG_INFINITY;
        *l.add(ii) = 0.0;
    }
    for j0 in (0..a.s).step_by(BLOCK_K) {
        let nj = BLOCK_K.min(a.s - j0);
        scores(a, p, blk, bh, i0..i0 + ni, j0..j0 + nj);
        for ii in 0..ni {
            let row = blk.p.add(ii * BLOCK_K);
            let bmax = (0..nj).map(|jj| *row.add(jj)).fold(f32::NEG_INFINITY, f32::max);
            let mnew = bmax.max(*m.add(ii));
            if mnew == f32::NEG_INFINITY {
                continue; // every key so far masked
            }
            let sum: f32 = (0..nj).map(|jj| (*row.add(jj) - mnew).exp()).sum();
            *l.add(ii) = *l.add(ii) * (*m.add(ii) - mnew).exp() + sum;
            *m.add(ii) = mnew;
        }
    }
    for ii in 0..ni {
        let (mm, ll) = (*m.add(ii), *l.add(ii));
        *p.out.add(bh * a.t + i0 + ii) = if ll > 0.0 { mm + ll.ln() } else { 0.0 };
    }
}

/// `o_i = Σ_j keep·p_ij v_j` for queries `i0..` of head `bh`.
///
/// # Safety
/// As [`run`].
unsafe fn forward_rows(a: &AttentionCall, p: &Ptrs, blk: &Block, bh: usize, i0: usize) {
    let (ni, dv) = (BLOCK_Q.min(a.t - i0), a.dv);
    let row = |ii: usize| p.out.add(2 * packed(a, bh, a.t, i0 + ii, dv));
    for ii in 0..ni {
        std::ptr::write_bytes(row(ii), 0, 2 * dv);
    }
    for j0 in (0..a.s).step_by(BLOCK_K) {
        let nj = BLOCK_K.min(a.s - j0);
        scores(a, p, blk, bh, i0..i0 + ni, j0..j0 + nj);
        weights(a, p, blk, bh, i0, ni, nj);
        for ii in 0..ni {
            let o = row(ii);
            for jj in 0..nj {
                let w = *blk.p.add(ii * BLOCK_K + jj) * keep(a, p.step, bh, i0 + ii, j0 + jj);
                if w == 0.0 {
                    continue;
                }
                let v = p.v(a, bh, j0 + jj);
                for x in 0..2 * dv {
                    *o.add(x) += w * *v.add(x);
                }
            }
        }
    }
}

/// `Re(Σ_x a_x · conj(b_x))` over `n` complex values.
///
/// # Safety
/// Both address `n` complex values.
unsafe fn re_dot_conj(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut acc = 0.0f32;
    for x in 0..2 * n {
        acc += *a.add(x) * *b.add(x);
    }
    acc
}

/// The complex score gradient `g_ij` of one weight (see `ir::op::Op::AttentionGrad`) from
/// `p_ij`, `dP_ij` (already times keep) and `δ_i`, with `c_ij` at `c`.
///
/// # Safety
/// `c` addresses one complex value.
unsafe fn score_grad(a: &AttentionCall, w: f32, dp: f32, delta: f32, c: *const f32) -> (f32, f32) {
    let ds = a.spec.scale as f32 * w * (dp - delta);
    match a.spec.score {
        AttnScore::Real => (ds, 0.0),
        AttnScore::Abs => {
            let (re, im) = (*c, *c.add(1));
            let n = re.hypot(im);
            if n > 0.0 {
                (ds * re / n, ds * im / n)
            } else {
                (0.0, 0.0)
            }
        }
    }
}

/// `dq_i = Σ_j g_ij k_j` for queries `i0..` of head `bh`.
///
/// # Safety
/// As [`run`].
unsafe fn dq_rows(a: &AttentionCall, p: &Ptrs, blk: &Block, bh: usize, i0: usize) {
    let (ni, d, dv) = (BLOCK_Q.min(a.t - i0), a.d, a.dv);
    let row = |ii: usize| p.out.add(2 * packed(a, bh, a.t, i0 + ii, d));
    let orow = |ii: usize| 2 * packed(a, bh, a.t, i0 + ii, dv);
    for ii in 0..ni {
        std::ptr::write_bytes(row(ii), 0, 2 * d);
        *blk.row.add(ii) = re_dot_conj(p.d_o.add(orow(ii)), p.o.add(orow(ii)), dv);
    }
    for j0 in (0..a.s).step_by(BLOCK_K) {
        let nj = BLOCK_K.min(a.s - j0);
        scores(a, p, blk, bh, i0..i0 + ni, j0..j0 + nj);
        weights(a, p, blk, bh, i0, ni, nj);
        for ii in 0..ni {
            let go = p.d_o.add(orow(ii));
            let dq = row(ii);
            for jj in 0..nj {
                let at = ii * BLOCK_K + jj;
                let w = *blk.p.add(at);
                if w == 0.0 {
                    continue;
                }
                let dp = keep(a, p.step, bh, i0 + ii, j0 + jj) * re_dot_conj(go, p.v(a, bh, j0 + jj), dv);
                let (gr, gi) = score_grad(a, w, dp, *blk.row.add(ii), blk.c.add(2 * at));
                let k = p.k(a, bh, j0 + jj);
                for x in 0..d {
                    let (kr, ki) = (*k.add(2 * x), *k.add(2 * x + 1));
                    *dq.add(2 * x) += gr * kr - gi * ki;
                    *dq.add(2 * x + 1) += gr * ki + gi * kr;
                }
            }
        }
    }
}

/// `dk_j = Σ_i conj(g_ij) q_i` and `dv_j = Σ_i keep·p_ij dO_i` for keys `j0..` of head `bh`.
///
/// # Safety
/// As [`run`].
unsafe fn dkv_rows(a: &AttentionCall, p: &Ptrs, blk: &Block, bh: usize, j0: usize) {
    let (nj, d, dv) = (BLOCK_K.min(a.s - j0), a.d, a.dv);
    // Row `j` of `[B, S, H·d + H·dv]`: every head's dk, then every head's dv.
    let w_row = a.h * (d + dv);
    let (b, hh) = (bh / a.h, bh % a.h);
    let dk_row = |jj: usize| p.out.add(2 * ((b * a.s + j0 + jj) * w_row + hh * d));
    let dv_row = |jj: usize| p.out.add(2 * ((b * a.s + j0 + jj) * w_row + a.h * d + hh * dv));
    for jj in 0..nj {
        std::ptr::write_bytes(dk_row(jj), 0, 2 * d);
        std::ptr::write_bytes(dv_row(jj), 0, 2 * dv);
    }
    for i0 in (0..a.t).step_by(BLOCK_Q) {
        let ni = BLOCK_Q.min(a.t - i0);
        scores(a, p, blk, bh, i0..i0 + ni, j0..j0 + nj);
        weights(a, p, blk, bh, i0, ni, nj);
        for ii in 0..ni {
            let r = 2 * packed(a, bh, a.t, i0 + ii, dv);
            let go = p.d_o.add(r);
            let delta = re_dot_conj(go, p.o.add(r), dv);
            let q = p.q(a, bh, i0 + ii);
            for jj in 0..nj {
                let at = ii * BLOCK_K + jj;
                let w = *blk.p.add(at);
                if w == 0.0 {
                    continue;
                }
                let kp = keep(a, p.step, bh, i0 + ii, j0 + jj);
                let dp = kp * re_dot_conj(go, p.v(a, bh, j0 + jj), dv);
                let (gr, gi) = score_grad(a, w, dp, delta, blk.c.add(2 * at));
                let dk = dk_row(jj);
                for x in 0..d {
                    // conj(g) · q
                    let (qr, qi) = (*q.add(2 * x), *q.add(2 * x + 1));
                    *dk.add(2 * x) += gr * qr + gi * qi;
                    *dk.add(2 * x + 1) += gr * qi - gi * qr;
                }
                let pv = kp * w;
                if pv != 0.0 {
                    let dvv = dv_row(jj);
                    for x in 0..2 * dv {
                        *dvv.add(x) += pv * *go.add(x);
                    }
                }
            }
        }
    }
}
