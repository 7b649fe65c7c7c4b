//! Fused complex attention on CUDA: `Attention` (with the `AttnLse` it reads, which
//! `fusion::merge_attention_lse` puts in its group) and `AttentionGrad{Q,KV}` each become one
//! flash-style kernel that never stores a `[B, H, T, S]` value.
//!
//! Every kernel is a thin `extern "C"` wrapper around one of four templates of [`LIB`]
//! (emitted once per module, before the first attention kernel), instantiated with the
//! group's extents, options and tiles, so loops over the head dimension unroll and the tails
//! of `T`, `S`, `D` and `Dv` are guards on compile-time constants. The layout of all four:
//! - one block of 256 threads per (b·H + h, tile), the tile index fastest, so the blocks of
//!   one head run together and share its K/V in L2; a 1-D grid (no 65535 limit on `B·H`);
//! - scores of a `BM`-query × `BN`-key tile (`BM = 16·RM`, `BN = 16·RN`: 64 × 64 where it
//!   fits, 64 × 32 for the gradient w.r.t. k and v, the magnitude score's dq and heads wider
//!   than 64) on a 16 × 16 thread grid with an `RM × RN`
//!   register micro-tile, contracted over the head dimension in chunks of 16 staged in shared
//!   memory (rows padded to 17 `float2`, so the key reads are free of bank conflicts);
//!   `Re(q·conj k)` is two real FMAs per term, the magnitude score adds the imaginary part;
//! - masks (causal, key padding) and the dropout hash of `ir::dropout_keep` are evaluated per
//!   score, never stored; key (query) tiles that a causal mask hides entirely are skipped;
//! - `AttnLse` alone (`attn_lse`, where no forward shares its operands): online max/sum per
//!   row in registers, merged over the 16 lanes of a row by shuffles; `lse = 0` for a row with
//!   no unmasked key (its output and gradients are then 0, since every `p` of the row is 0);
//! - `Attention` with its `AttnLse` (`attn_fwd_lse`): per key tile the rows' running max
//!   (shuffles over the 16 lanes of a row) and per-lane sums of `exp(s − m)`, the output tile
//!   rescaled by `exp(m_old − m_new)`; `p̃ = keep · exp(s − m)` is staged in shared memory,
//!   then the V tile (32 or 16 keys at a time, where the score chunks were) is accumulated
//!   into an `RM × ⌈Dv/16⌉` register tile of `o`; at the end `o /= l` and `lse = m + log l`
//!   are written. One score pass instead of two (ViT layer at batch 128: 0.824 → 0.578 ms).
//!   An `Attention` whose log-sum-exp comes from elsewhere (a recomputed forward) runs
//!   `attn_fwd`: `p̃ = keep · exp(s − lse)`, no rescaling;
//! - `AttentionGrad{Q}`: per query tile `δ_i = Re Σ dO·conj(o)` first, then per key tile the
//!   scores, `dP̃ = Re(dO·conj v)`, `dS = p (keep·dP̃ − δ)` and `dq += g·k` with `g` the real
//!   `scale·dS` or, for the magnitude score, `scale·dS·c/|c|` (K staged as V is forward);
//! - `AttentionGrad{KV}`: per key tile a loop over query tiles recomputing the same `p̃` and
//!   `g` (and `δ` of each query tile), then `dv += p̃ᵀ·dO` and `dk += gᵀ·q` (`conj(g)` for the
//!   magnitude score) over the tile's queries, `RC` rows at a time staged where the score
//!   chunks were;
//! - no atomics: each output element is written once, by one thread (deterministic);
//! - global indices are 64-bit (`size_t`), so `B·H·T·D` may pass 2³¹; the dropout index is
//!   the contract's wrapping `u32` `((b·H + h)·T + i)·S + j`.
//!
//! Shared memory is static, so it must fit the device's default per-block limit (48 KiB):
//! the largest tiles that fit are chosen ([`tiles`]; about 34 KiB at a head of 64), down to
//! 16 × 16 tiles for small devices.

use super::{attention_tc, flit, Ctx, Kernel, BLOCK};
use crate::error::CompileResult;
use crate::ir::*;
use crate::passes::fusion::KernelGroup;
use crate::target::AttnKernel;

/// The largest head dimension (`D` and `Dv`) the kernels are written for.
pub const MAX_HEAD: usize = 128;

/// The tiles of one kernel: `rm`, `rn` (a `16·rm`-query × `16·rn`-key score tile) and, for
/// the gradient w.r.t. k and v, `rc` query rows staged per accumulation pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tiles {
    rm: usize,
    rn: usize,
    rc: usize,
}

/// Static shared memory of a kernel with tiles `t`, in bytes, as the templates of [`LIB`]
/// declare it; `d`, `dv` the head dimensions.
fn shared_bytes(op: &Op, t: Tiles, d: usize, dv: usize) -> usize {
    let (bm, bn) = (16 * t.rm, 16 * t.rn);
    let chunks = (bm + bn) * 17 * 8;
    let abs = matches!(op, Op::AttentionGrad { spec, .. } if spec.score == AttnScore::Abs);
    let gi = if abs { bm * (bn + 1) * 4 } else { (bn + 1) * 4 };
    // The V (K) rows of the forward (dq) accumulation are staged where the score chunks were.
    let staged = |h: usize| if h > 64 { 16 } else { bn.min(32) } * h * 8;
    match op {
        Op::AttnLse { .. } => chunks,
        Op::Attention { .. } => chunks.max(staged(dv)) + bm * (bn + 1) * 4,
        Op::AttentionGrad { wrt: AttnWrt::Q, .. } => {
            chunks.max(staged(d)) + bm * (bn + 1) * 4 + gi + 2 * bm * 4
        }
        Op::AttentionGrad { wrt: AttnWrt::KV, .. } => {
            // (Rows of BN + 2 scores, 8-byte aligned.)
            let gi = if abs { bm * (bn + 2) * 4 } else { (bn + 2) * 4 };
            chunks.max(t.rc * (d + dv) * 8) + 2 * bm * (bn + 2) * 4 + gi + 2 * bm * 4
        }
        _ => 0,
    }
}

/// The largest tiles of `op` whose shared memory fits `limit` bytes: 64 queries × 64 keys
/// (32 for heads wider than 64, where the register tiles grow) when they fit, else smaller,
/// down to 16 × 16.
fn tiles(op: &Op, d: usize, dv: usize, limit: usize) -> Option<Tiles> {
    let head = match op {
        Op::AttnLse { .. } => 0,
        Op::Attention { .. } => dv,
        _ => d.max(dv),
    };
    let rc = if d.max(dv) > 64 { 8 } else { 16 };
    let candidates = [
        Tiles { rm: 4, rn: if head > 64 { 2 } else { 4 }, rc },
        Tiles { rm: 4, rn: 2, rc },
        Tiles { rm: 4, rn: 1, rc: 8 },
        Tiles { rm: 2, rn: 1, rc: 4 },
        Tiles { rm: 1, rn: 1, rc: 4 },
    ];
    candidates.into_iter().find(|&t| shared_bytes(op, t, d, dv) <= limit)
}

/// The kernel of an attention group.
pub(crate) fn kernel(ctx: &Ctx, group: &KernelGroup, name: &str) -> CompileResult<Kernel> {
    let v = *group.nodes.last().ok_or_else(|| internal!("empty attention group"))?;
    let node = ctx.g.node(v);
    // The log-sum-exp fused into the forward (`fusion::merge_attention_lse`): written by the
    // same kernel, in one pass over the keys.
    let fused_lse = match &group.nodes[..] {
        [l, a] if matches!(node.op, Op::Attention { .. }) && ctx.g.node(*a).inputs.get(3) == Some(l) => {
            Some(*l)
        }
        [_] => None,
        _ => return Err(internal!("{v}: an attention group of {} nodes", group.nodes.len())),
    };
    let (spec, fixed) = match &node.op {
        Op::AttnLse { spec } => (spec, 2),
        Op::Attention { spec } => (spec, 4),
        Op::AttentionGrad { spec, .. } => (spec, 6),
        other => return Err(internal!("{v}: {} is not an attention op", other.mnemonic())),
    };
    let ins = &node.inputs;
    // The optional operands follow the fixed ones: the key mask, then (not for `AttnLse`,
    // which dropout does not change) the step counter.
    let dropout = spec.dropout.filter(|_| fixed > 2);
    let want = fixed + usize::from(spec.key_mask) + usize::from(dropout.is_some());
    if ins.len() != want {
        return Err(internal!("{v}: {} has {} operands, expected {want}", node.op.mnemonic(), ins.len()));
    }
    let (q, k) = (ins[0], ins[1]);
    let hd = spec.heads;
    let [b, t, lq] = ctx.shape(q)[..] else {
        return Err(internal!("{v}: the attention query is not of rank 3"));
    };
    let [_, s, lk] = ctx.shape(k)[..] else {
        return Err(internal!("{v}: the attention key is not of rank 3"));
    };
    let (h, d) = (hd.n, hd.d);
    let (dv, lv) = if fixed > 2 { (hd.dv, ctx.shape(ins[2]).get(2).copied().unwrap_or(0)) } else { (d, 0) };
    // Every template reads its operands' heads at their first column, rows `L*` apart.
    let strides = if fixed > 2 { format!("{lq}, {lk}, {lv}") } else { format!("{lq}, {lk}") };
    let head0 = |i: usize| -> CompileResult<String> {
        let p = ctx.ptr(ins[i])?;
        Ok(if hd.cols[i] == 0 { p } else { format!("({p} + {})", hd.cols[i]) })
    };
    for &x in &ins[..fixed.min(3)] {
        if ctx.dtype(x) != DType::C64 {
            return Err(internal!("{v}: attention operand {x} is {:?}, expected c64", ctx.dtype(x)));
        }
    }
    if d == 0 || dv == 0 || t == 0 || s == 0 {
        return Err(internal!("{v}: attention with an empty extent ({t} queries, {s} keys, heads {d}/{dv})"));
    }
    if d > MAX_HEAD || dv > MAX_HEAD {
        return Err(user!(
            "attention heads of dimension {} are too wide for the CUDA back end's fused kernels (at most {MAX_HEAD})",
            d.max(dv)
        ));
    }
    // The tensor-core kernels (`attention_tc.rs`) where the precision and the score allow
    // them and their dynamic shared memory fits the device's opt-in limit.
    let tc_shared = attention_tc::shared_bytes(&node.op, d, dv);
    let tc = ctx.precision().tensor_cores()
        && ctx.target.kernels.attn == AttnKernel::TensorCore
        && attention_tc::applies(&node.op, d, dv)
        && tc_shared <= ctx.target.device.shared_per_block_optin;
    let limit = ctx.target.device.shared_per_block;
    let tl = tiles(&node.op, d, dv, limit).ok_or_else(|| {
        user!("the fused attention kernels need more shared memory than the device's {limit} bytes per block")
    })?;
    let mask = if spec.key_mask { ctx.ptr(ins[fixed])? } else { "(const float*)0".into() };
    let (thr, keep, salt, step) = match dropout {
        Some((p, salt)) => {
            let step = ins[fixed + usize::from(spec.key_mask)];
            if ctx.dtype(step) != DType::I32 {
                return Err(internal!(
                    "{v}: the dropout step operand is {:?}, expected i32",
                    ctx.dtype(step)
                ));
            }
            (
                ((1.0 - p) * 16_777_216.0) as u32,
                flit(1.0 / (1.0 - p)),
                salt,
                format!("(u32)(*{})", ctx.ptr(step)?),
            )
        }
        None => (0, "1.0f".into(), 0, "0u".into()),
    };
    let flags = format!(
        "{}, {}, {}, {}, {}, {}",
        u8::from(spec.score == AttnScore::Abs),
        u8::from(spec.causal),
        u8::from(spec.key_mask),
        u8::from(dropout.is_some()),
        tl.rm,
        tl.rn
    );
    let opts = format!("{}, {thr}u, {keep}, {salt}u, {step}", flit(spec.scale));
    let (q, k, out) = (head0(0)?, head0(1)?, ctx.ptr(v)?);
    let tc_flags =
        format!("{}, {}, {}", u8::from(spec.causal), u8::from(spec.key_mask), u8::from(dropout.is_some()));
    let (call, tiles) = match &node.op {
        _ if tc => {
            let mut operands = vec![head0(2)?];
            for &x in &ins[3..fixed] {
                operands.push(ctx.ptr(x)?);
            }
            let operands = operands.join(", ");
            let (f, flags) = match &node.op {
                Op::Attention { .. } => {
                    ("attn_tc_fwd", format!("{tc_flags}, {}", u8::from(fused_lse.is_some())))
                }
                Op::AttentionGrad { wrt: AttnWrt::Q, .. } => ("attn_tc_dq", tc_flags),
                _ => ("attn_tc_dkv", tc_flags),
            };
            (
                format!(
                    "{f}<{h}, {t}, {s}, {d}, {dv}, {strides}, {flags}>({q}, {k}, {operands}, {mask}, {out}, {opts});"
                ),
                attention_tc::tiles(&node.op, t, s),
            )
        }
        Op::AttnLse { .. } => (
            format!("attn_lse<{h}, {t}, {s}, {d}, {strides}, {flags}>({q}, {k}, {mask}, {out}, {opts});"),
            t.div_ceil(16 * tl.rm),
        ),
        Op::Attention { .. } => (
            format!(
                "{}<{h}, {t}, {s}, {d}, {dv}, {strides}, {flags}>({q}, {k}, {}, {}, {mask}, {out}, {opts});",
                if fused_lse.is_some() { "attn_fwd_lse" } else { "attn_fwd" },
                head0(2)?,
                ctx.ptr(ins[3])?,
            ),
            t.div_ceil(16 * tl.rm),
        ),
        Op::AttentionGrad { wrt, .. } => {
            let (f, flags, tiles) = match wrt {
                AttnWrt::Q => ("attn_dq", flags, t.div_ceil(16 * tl.rm)),
                AttnWrt::KV => ("attn_dkv", format!("{flags}, {}", tl.rc), s.div_ceil(16 * tl.rn)),
            };
            (
                format!(
                    "{f}<{h}, {t}, {s}, {d}, {dv}, {strides}, {flags}>({q}, {k}, {}, {}, {}, {}, {mask}, {out}, {opts});",
                    head0(2)?,
                    ctx.ptr(ins[3])?,
                    ctx.ptr(ins[4])?,
                    ctx.ptr(ins[5])?,
                ),
                tiles,
            )
        }
        other => return Err(internal!("{v}: {} is not an attention op", other.mnemonic())),
    };
    let blocks = b * h * tiles;
    let max = ctx.target.device.max_grid[0];
    if blocks > max || b * h * t.max(s) * d.max(dv) >= 1 << 62 {
        let rows = match &node.op {
            _ if tc => 64,
            Op::AttentionGrad { wrt: AttnWrt::KV, .. } => 16 * tl.rn,
            _ => 16 * tl.rm,
        };
        return Err(user!(
            "attention over {} heads of {t} queries needs {blocks} blocks of {rows} rows, more than the \
             {max} blocks a CUDA grid holds along x: lower the batch",
            b * h,
        ));
    }
    // The templates index with `size_t` offsets (64-bit) at every size: they form them once
    // per tile, not per element.
    let largest = ins.iter().chain([&v]).map(|&x| ctx.g.ty(x).shape.numel(ctx.batch).saturating_mul(2)).max();
    let index = super::Indexing::template(largest.unwrap_or(0));
    let threads = if tc { attention_tc::THREADS as u32 } else { BLOCK };
    let code = format!(
        "extern \"C\" __global__ void __launch_bounds__({threads}) {name}(char* A) {{\n  {call}\n}}\n"
    );
    Ok(Kernel {
        code,
        grid: [blocks as u32, 1, 1],
        block: [threads, 1, 1],
        zero: Vec::new(),
        scratch: 0,
        pre: None,
        post: None,
        shared: if tc { tc_shared } else { 0 },
        index,
    })
}

/// The attention templates, emitted once per module before the first attention kernel.
pub const LIB: &str = r#"// Fused complex attention (back/cuda/attention.rs): 256 threads, a 16 x 16 thread grid, a
// score tile of BM = 16 RM queries x BN = 16 RN keys.
// A head's rows are an N x W matrix with a row stride of LD elements (LD = H W for a
// token-major [B, N, H W] tensor, more when the heads are columns of a packed projection).
// Rows [r0, r0 + R) x columns [c0, c0 + 16) of it into dst (zero outside).
template <int R, int N, int W, int LD, typename T_src>
static __device__ __forceinline__ void attn_stage16(float2 (*dst)[17], const T_src* __restrict__ src, int r0, int c0) {
  for (int e = threadIdx.x; e < R * 16; e += 256) {
    const int r = e >> 4, c = e & 15, gr = r0 + r, gc = c0 + c;
    dst[r][c] = (gr < N && gc < W) ? src[(size_t)gr * LD + gc] : make_float2(0.0f, 0.0f);
  }
}
// Rows [r0, r0 + R) of an N x W matrix of row stride LD into dst[R * W] (zero past row N).
template <int R, int N, int W, int LD, typename T_src>
static __device__ __forceinline__ void attn_stage_rows(float2* dst, const T_src* __restrict__ src, int r0) {
  const auto* s = src + (size_t)r0 * LD;
  const int n = (N - r0 < R ? N - r0 : R) * W;
  for (int e = threadIdx.x; e < R * W; e += 256)
    dst[e] = e < n ? s[(size_t)(e / W) * LD + e % W] : make_float2(0.0f, 0.0f);
}
// A thread's columns of a W-wide row, C of them, for threads t < L side by side: with P
// (W even) pairs 2t + e % 2 + 2L (e / 2), so that two neighbouring elements load from shared
// memory as one 16-byte word (half the load instructions of the accumulation loops); else
// t + L e.
template <int W, int L, bool P>
struct AttnCols {
  static constexpr int C = P ? 2 * ((W + 2 * L - 1) / (2 * L)) : (W + L - 1) / L;
  static constexpr int STEP = P ? 2 : 1;
  static __device__ __forceinline__ int col(int t, int e) { return P ? 2 * t + (e & 1) + 2 * L * (e >> 1) : t + L * e; }
};
// The element at p (w0) and, with P, the one after it (w1; p is then 16-byte aligned).
template <bool P>
static __device__ __forceinline__ void attn_ld2(const float2* p, float2& w0, float2& w1) {
  if constexpr (P) {
    const float4 w = *reinterpret_cast<const float4*>(p);
    w0 = make_float2(w.x, w.y);
    w1 = make_float2(w.z, w.w);
  } else {
    w0 = p[0];
    w1 = w0;
  }
}
// cr[a][b] (+ i ci[a][b] when IM) = sum over w < W of x[i0 + ty + 16a][w] * conj(y[j0 + tx + 16b][w]),
// x an NX x W and y an NY x W matrix (row strides LX, LY), in chunks of 16 columns staged in xs
// and ys (zero-padded).
template <int RM, int RN, int NX, int NY, int W, int IM, int LX, int LY, typename T_x, typename T_y>
static __device__ __forceinline__ void attn_dots(float (&cr)[RM][RN], float (&ci)[RM][RN],
    const T_x* __restrict__ x, const T_y* __restrict__ y, int i0, int j0, float2 (*xs)[17], float2 (*ys)[17]) {
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  #pragma unroll
  for (int a = 0; a < RM; ++a) {
    #pragma unroll
    for (int b = 0; b < RN; ++b) { cr[a][b] = 0.0f; ci[a][b] = 0.0f; }
  }
  for (int w0 = 0; w0 < W; w0 += 16) {
    __syncthreads();
    attn_stage16<16 * RM, NX, W, LX>(xs, x, i0, w0);
    attn_stage16<16 * RN, NY, W, LY>(ys, y, j0, w0);
    __syncthreads();
    #pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      float2 xa[RM], yb[RN];
      #pragma unroll
      for (int a = 0; a < RM; ++a) xa[a] = xs[ty + 16 * a][kk];
      #pragma unroll
      for (int b = 0; b < RN; ++b) yb[b] = ys[tx + 16 * b][kk];
      #pragma unroll
      for (int a = 0; a < RM; ++a) {
        #pragma unroll
        for (int b = 0; b < RN; ++b) {
          cr[a][b] = fmaf(xa[a].x, yb[b].x, fmaf(xa[a].y, yb[b].y, cr[a][b]));
          if (IM) ci[a][b] = fmaf(xa[a].y, yb[b].x, fmaf(-xa[a].x, yb[b].y, ci[a][b]));
        }
      }
    }
  }
}
// Whether key j takes part in query i's softmax. The mask is read as it is stored (f32, or a
// 16-bit format where a kernel made it at bf16/fp16).
template <int T, int S, int CAUSAL, int MASK, typename T_m>
static __device__ __forceinline__ bool attn_valid(int i, int j, const T_m* __restrict__ mrow) {
  return i < T && j < S && (!CAUSAL || j <= i) && (!MASK || (float)mrow[j] == 0.0f);
}
// The score from c = q.conj(k): scale * Re(c), or scale * |c|.
template <int ABS>
static __device__ __forceinline__ float attn_score(float cr, float ci, float scale) {
  return ABS ? scale * sqrtf(cr * cr + ci * ci) : scale * cr;
}
// The dropout factor keep_ij of ir::dropout_keep (0 or 1/(1-p)).
static __device__ __forceinline__ float attn_keep(u32 thr, float keep, u32 salt, u32 step, u32 idx) {
  return (dropout_hash(salt, step, idx) >> 8) < thr ? keep : 0.0f;
}
// The wrapping u32 index ((b H + h) T + i) S + j of the dropout hash.
template <int T, int S>
static __device__ __forceinline__ u32 attn_index(int bh, int i, int j) {
  return ((u32)bh * (u32)T + (u32)i) * (u32)S + (u32)j;
}

// AttnLse: lse_i = log sum_j exp(s_ij) over the unmasked keys (0 when there is none).
template <int H, int T, int S, int D, int LQ, int LK, int ABS, int CAUSAL, int MASK, int DROP, int RM, int RN, typename T_q, typename T_k, typename T_m>
static __device__ void attn_lse(const T_q* __restrict__ q, const T_k* __restrict__ k,
    const T_m* __restrict__ mask, float* __restrict__ lse, float scale, u32, float, u32, u32) {
  constexpr int BM = 16 * RM, BN = 16 * RN, TILES = (T + BM - 1) / BM;
  __shared__ float2 xs[BM][17], ys[BN][17];
  const int bh = blockIdx.x / TILES, i0 = (blockIdx.x % TILES) * BM;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const auto* qb = q + (size_t)(bh / H) * T * LQ + (bh % H) * D;
  const auto* kb = k + (size_t)(bh / H) * S * LK + (bh % H) * D;
  const T_m* mrow = MASK ? mask + (size_t)(bh / H) * S : mask;
  float m[RM], l[RM];
  #pragma unroll
  for (int a = 0; a < RM; ++a) { m[a] = -INF; l[a] = 0.0f; }
  const int jend = CAUSAL ? (S < i0 + BM ? S : i0 + BM) : S;
  for (int j0 = 0; j0 < jend; j0 += BN) {
    float cr[RM][RN], ci[RM][RN];
    attn_dots<RM, RN, T, S, D, ABS, LQ, LK>(cr, ci, qb, kb, i0, j0, xs, ys);
    #pragma unroll
    for (int a = 0; a < RM; ++a) {
      #pragma unroll
      for (int b = 0; b < RN; ++b) {
        const int i = i0 + ty + 16 * a, j = j0 + tx + 16 * b;
        if (attn_valid<T, S, CAUSAL, MASK>(i, j, mrow)) {
          const float s = attn_score<ABS>(cr[a][b], ci[a][b], scale);
          if (s > m[a]) { l[a] = l[a] * expf(m[a] - s) + 1.0f; m[a] = s; }
          else l[a] += expf(s - m[a]);
        }
      }
    }
  }
  // Merge the 16 lanes of each row (lanes 16t .. 16t + 15 of a warp share ty).
  #pragma unroll
  for (int a = 0; a < RM; ++a) {
    #pragma unroll
    for (int off = 8; off > 0; off >>= 1) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[a], off);
      const float lo = __shfl_xor_sync(0xffffffffu, l[a], off);
      const float mm = m[a] > mo ? m[a] : mo;
      if (mm != -INF) {
        l[a] = (l[a] > 0.0f ? l[a] * expf(m[a] - mm) : 0.0f) + (lo > 0.0f ? lo * expf(mo - mm) : 0.0f);
        m[a] = mm;
      }
    }
    const int i = i0 + ty + 16 * a;
    if (tx == 0 && i < T) lse[(size_t)bh * T + i] = l[a] > 0.0f ? m[a] + logf(l[a]) : 0.0f;
  }
}

// acc += P * V for one key tile of the forward kernels: the weights of rows ty + 16a are in
// `ps`, the tile's value rows are staged through `vs` VC at a time.
template <int RM, int BN, int VC, int CV, int S, int DV, int LV, typename T_v>
static __device__ __forceinline__ void attn_pv(float2 (&acc)[RM][CV], const float (*ps)[BN + 1], float2* vs,
    const T_v* __restrict__ vb, int j0, int ty, int tx) {
  for (int v0 = 0; v0 < BN; v0 += VC) {
    __syncthreads();
    attn_stage_rows<VC, S, DV, LV>(vs, vb, j0 + v0);
    __syncthreads();
    #pragma unroll 4
    for (int jj = 0; jj < VC; ++jj) {
      float pa[RM];
      #pragma unroll
      for (int a = 0; a < RM; ++a) pa[a] = ps[ty + 16 * a][v0 + jj];
      #pragma unroll
      for (int e = 0; e < CV; ++e) {
        if (tx + 16 * e < DV) {
          const float2 w = vs[jj * DV + tx + 16 * e];
          #pragma unroll
          for (int a = 0; a < RM; ++a) {
            acc[a][e].x = fmaf(pa[a], w.x, acc[a][e].x);
            acc[a][e].y = fmaf(pa[a], w.y, acc[a][e].y);
          }
        }
      }
    }
  }
}

// Attention: o_i = sum_j keep_ij exp(s_ij - lse_i) v_j.
template <int H, int T, int S, int D, int DV, int LQ, int LK, int LV, int ABS, int CAUSAL, int MASK, int DROP, int RM, int RN, typename T_q, typename T_k, typename T_v, typename T_out, typename T_m>
static __device__ void attn_fwd(const T_q* __restrict__ q, const T_k* __restrict__ k,
    const T_v* __restrict__ v, const float* __restrict__ lse, const T_m* __restrict__ mask,
    T_out* __restrict__ out, float scale, u32 thr, float keep, u32 salt, u32 step) {
  constexpr int BM = 16 * RM, BN = 16 * RN, CV = (DV + 15) / 16, TILES = (T + BM - 1) / BM;
  // The V tile is staged VC keys at a time where the score chunks were.
  constexpr int VC = DV > 64 ? 16 : (BN < 32 ? BN : 32);
  constexpr int CHUNK_BYTES = (BM + BN) * 17 * 8, V_BYTES = VC * DV * 8;
  __shared__ __align__(16) char raw[CHUNK_BYTES > V_BYTES ? CHUNK_BYTES : V_BYTES];
  float2 (*xs)[17] = (float2 (*)[17])raw;
  float2 (*ys)[17] = (float2 (*)[17])(raw + BM * 17 * 8);
  float2* vs = (float2*)raw;
  __shared__ float ps[BM][BN + 1];
  const int bh = blockIdx.x / TILES, i0 = (blockIdx.x % TILES) * BM;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const auto* qb = q + (size_t)(bh / H) * T * LQ + (bh % H) * D;
  const auto* kb = k + (size_t)(bh / H) * S * LK + (bh % H) * D;
  const auto* vb = v + (size_t)(bh / H) * S * LV + (bh % H) * DV;
  // The output's rows: [B, T, H DV], head-major columns.
  auto* ob = out + (size_t)(bh / H) * T * (H * DV) + (bh % H) * DV;
  const T_m* mrow = MASK ? mask + (size_t)(bh / H) * S : mask;
  float lr[RM];
  float2 acc[RM][CV];
  #pragma unroll
  for (int a = 0; a < RM; ++a) {
    const int i = i0 + ty + 16 * a;
    lr[a] = i < T ? lse[(size_t)bh * T + i] : 0.0f;
    #pragma unroll
    for (int e = 0; e < CV; ++e) acc[a][e] = make_float2(0.0f, 0.0f);
  }
  const int jend = CAUSAL ? (S < i0 + BM ? S : i0 + BM) : S;
  for (int j0 = 0; j0 < jend; j0 += BN) {
    float cr[RM][RN], ci[RM][RN];
    attn_dots<RM, RN, T, S, D, ABS, LQ, LK>(cr, ci, qb, kb, i0, j0, xs, ys);
    #pragma unroll
    for (int a = 0; a < RM; ++a) {
      #pragma unroll
      for (int b = 0; b < RN; ++b) {
        const int i = i0 + ty + 16 * a, j = j0 + tx + 16 * b;
        float p = 0.0f;
        if (attn_valid<T, S, CAUSAL, MASK>(i, j, mrow)) {
          p = expf(attn_score<ABS>(cr[a][b], ci[a][b], scale) - lr[a]);
          if (DROP) p *= attn_keep(thr, keep, salt, step, attn_index<T, S>(bh, i, j));
        }
        ps[ty + 16 * a][tx + 16 * b] = p;
      }
    }
    attn_pv<RM, BN, VC, CV, S, DV, LV>(acc, ps, vs, vb, j0, ty, tx);
  }
  #pragma unroll
  for (int a = 0; a < RM; ++a) {
    const int i = i0 + ty + 16 * a;
    if (i < T) {
      #pragma unroll
      for (int e = 0; e < CV; ++e)
        if (tx + 16 * e < DV) ob[(size_t)i * (H * DV) + tx + 16 * e] = acc[a][e];
    }
  }
}

// Attention and its log-sum-exp in one pass over the keys (online softmax): per key tile each
// row's running max m and (per lane) sum l of exp(s - m), the output rescaled by
// exp(m_old - m_new); at the end o = acc / l and lse = m + log l, both 0 for a row with no
// unmasked key. Dropout scales the output's weights, not l (it does not change lse).
template <int H, int T, int S, int D, int DV, int LQ, int LK, int LV, int ABS, int CAUSAL, int MASK, int DROP, int RM, int RN, typename T_q, typename T_k, typename T_v, typename T_out, typename T_m>
static __device__ void attn_fwd_lse(const T_q* __restrict__ q, const T_k* __restrict__ k,
    const T_v* __restrict__ v, float* __restrict__ lse, const T_m* __restrict__ mask,
    T_out* __restrict__ out, float scale, u32 thr, float keep, u32 salt, u32 step) {
  constexpr int BM = 16 * RM, BN = 16 * RN, CV = (DV + 15) / 16, TILES = (T + BM - 1) / BM;
  constexpr int VC = DV > 64 ? 16 : (BN < 32 ? BN : 32);
  constexpr int CHUNK_BYTES = (BM + BN) * 17 * 8, V_BYTES = VC * DV * 8;
  __shared__ __align__(16) char raw[CHUNK_BYTES > V_BYTES ? CHUNK_BYTES : V_BYTES];
  float2 (*xs)[17] = (float2 (*)[17])raw;
  float2 (*ys)[17] = (float2 (*)[17])(raw + BM * 17 * 8);
  float2* vs = (float2*)raw;
  __shared__ float ps[BM][BN + 1];
  const int bh = blockIdx.x / TILES, i0 = (blockIdx.x % TILES) * BM;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const auto* qb = q + (size_t)(bh / H) * T * LQ + (bh % H) * D;
  const auto* kb = k + (size_t)(bh / H) * S * LK + (bh % H) * D;
  const auto* vb = v + (size_t)(bh / H) * S * LV + (bh % H) * DV;
  // The output's rows: [B, T, H DV], head-major columns.
  auto* ob = out + (size_t)(bh / H) * T * (H * DV) + (bh % H) * DV;
  const T_m* mrow = MASK ? mask + (size_t)(bh / H) * S : mask;
  float m[RM], l[RM];
  float2 acc[RM][CV];
  #pragma unroll
  for (int a = 0; a < RM; ++a) {
    m[a] = -INF;
    l[a] = 0.0f;
    #pragma unroll
    for (int e = 0; e < CV; ++e) acc[a][e] = make_float2(0.0f, 0.0f);
  }
  const int jend = CAUSAL ? (S < i0 + BM ? S : i0 + BM) : S;
  for (int j0 = 0; j0 < jend; j0 += BN) {
    float cr[RM][RN], ci[RM][RN];
    attn_dots<RM, RN, T, S, D, ABS, LQ, LK>(cr, ci, qb, kb, i0, j0, xs, ys);
    #pragma unroll
    for (int a = 0; a < RM; ++a) {
      const int i = i0 + ty + 16 * a;
      float tmax = -INF;
      #pragma unroll
      for (int b = 0; b < RN; ++b) {
        const int j = j0 + tx + 16 * b;
        cr[a][b] = attn_valid<T, S, CAUSAL, MASK>(i, j, mrow) ? attn_score<ABS>(cr[a][b], ci[a][b], scale) : -INF;
        tmax = fmaxf(tmax, cr[a][b]);
      }
      // The tile's row max over the 16 lanes of the row (lanes 16t .. 16t + 15 share ty).
      #pragma unroll
      for (int off = 8; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
      const float mn = fmaxf(m[a], tmax);
      // (No key of the row so far: nothing to rescale, and exp(-inf - -inf) is not a number.)
      const float corr = mn == -INF ? 1.0f : expf(m[a] - mn);
      m[a] = mn;
      l[a] *= corr;
      #pragma unroll
      for (int e = 0; e < CV; ++e) { acc[a][e].x *= corr; acc[a][e].y *= corr; }
      #pragma unroll
      for (int b = 0; b < RN; ++b) {
        const int j = j0 + tx + 16 * b;
        float p = cr[a][b] == -INF ? 0.0f : expf(cr[a][b] - mn);
        l[a] += p;
        if (DROP && p != 0.0f) p *= attn_keep(thr, keep, salt, step, attn_index<T, S>(bh, i, j));
        ps[ty + 16 * a][tx + 16 * b] = p;
      }
    }
    attn_pv<RM, BN, VC, CV, S, DV, LV>(acc, ps, vs, vb, j0, ty, tx);
  }
  #pragma unroll
  for (int a = 0; a < RM; ++a) {
    #pragma unroll
    for (int off = 8; off > 0; off >>= 1) l[a] += __shfl_xor_sync(0xffffffffu, l[a], off);
    const int i = i0 + ty + 16 * a;
    const float inv = l[a] > 0.0f ? 1.0f / l[a] : 0.0f;
    if (i < T) {
      if (tx == 0) lse[(size_t)bh * T + i] = l[a] > 0.0f ? m[a] + logf(l[a]) : 0.0f;
      #pragma unroll
      for (int e = 0; e < CV; ++e)
        if (tx + 16 * e < DV)
          ob[(size_t)i * (H * DV) + tx + 16 * e] = make_float2(acc[a][e].x * inv, acc[a][e].y * inv);
    }
  }
}

// delta_i = Re sum_d dO_id conj(o_id) and lse_i of the BM query rows from i0 into shared memory
// (NT / BM threads per row of a block of NT threads; the tensor-core kernels of
// attention_tc.rs call it too); ob, dob (rows of LD elements) and lb point at the head's rows.
template <int T, int DV, int LD, int BM, int NT, typename T_ob, typename T_dob>
static __device__ __forceinline__ void attn_rows(const T_ob* __restrict__ ob, const T_dob* __restrict__ dob,
    const float* __restrict__ lb, int i0, float* delta_s, float* lse_s) {
  constexpr int L = NT / BM;
  const int r = threadIdx.x / L, part = threadIdx.x % L, i = i0 + r;
  float acc = 0.0f;
  if (i < T) {
    for (int e = part; e < DV; e += L) {
      const float2 g = dob[(size_t)i * LD + e], o = ob[(size_t)i * LD + e];
      acc = fmaf(g.x, o.x, fmaf(g.y, o.y, acc));
    }
  }
  #pragma unroll
  for (int off = L / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (part == 0) { delta_s[r] = acc; lse_s[r] = i < T ? lb[i] : 0.0f; }
}

// The score-gradient factor of one (query, key) pair: p~ = keep p (returned in pt) and
// g = scale p (keep dP~ - delta) (times c/|c| for the magnitude score; 0 where c = 0).
template <int ABS>
static __device__ __forceinline__ float2 attn_grad(float cr, float ci, float dp, float lse_i, float delta_i,
    float scale, float kp, float& pt) {
  const float mag = ABS ? sqrtf(cr * cr + ci * ci) : 0.0f;
  const float p = expf((ABS ? scale * mag : scale * cr) - lse_i);
  pt = kp * p;
  const float ds = scale * p * (kp * dp - delta_i);
  if (!ABS) return make_float2(ds, 0.0f);
  if (mag == 0.0f) return make_float2(0.0f, 0.0f);
  const float f = ds / mag;
  return make_float2(f * cr, f * ci);
}

// AttentionGrad w.r.t. q: dq_i = sum_j g_ij k_j.
template <int H, int T, int S, int D, int DV, int LQ, int LK, int LV, int ABS, int CAUSAL, int MASK, int DROP, int RM, int RN, typename T_q, typename T_k, typename T_v, typename T_o, typename T_dout, typename T_dq, typename T_m>
static __device__ void attn_dq(const T_q* __restrict__ q, const T_k* __restrict__ k,
    const T_v* __restrict__ v, const T_o* __restrict__ o, const T_dout* __restrict__ dout,
    const float* __restrict__ lse, const T_m* __restrict__ mask, T_dq* __restrict__ dq,
    float scale, u32 thr, float keep, u32 salt, u32 step) {
  constexpr int BM = 16 * RM, BN = 16 * RN, CD = (D + 15) / 16, TILES = (T + BM - 1) / BM;
  // The K tile is staged KC keys at a time where the score chunks were.
  constexpr int KC = D > 64 ? 16 : (BN < 32 ? BN : 32);
  constexpr int CHUNK_BYTES = (BM + BN) * 17 * 8, K_BYTES = KC * D * 8;
  __shared__ __align__(16) char raw[CHUNK_BYTES > K_BYTES ? CHUNK_BYTES : K_BYTES];
  float2 (*xs)[17] = (float2 (*)[17])raw;
  float2 (*ys)[17] = (float2 (*)[17])(raw + BM * 17 * 8);
  float2* kt = (float2*)raw;
  __shared__ float gr_s[BM][BN + 1];
  __shared__ float gi_s[ABS ? BM : 1][BN + 1];
  __shared__ float delta_s[BM], lse_s[BM];
  const int bh = blockIdx.x / TILES, i0 = (blockIdx.x % TILES) * BM;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const auto* qb = q + (size_t)(bh / H) * T * LQ + (bh % H) * D;
  const auto* kb = k + (size_t)(bh / H) * S * LK + (bh % H) * D;
  const auto* vb = v + (size_t)(bh / H) * S * LV + (bh % H) * DV;
  // o, dO: [B, T, H DV]; dq: [B, T, H D] (head-major columns).
  const size_t orow = (size_t)(bh / H) * T * (H * DV) + (bh % H) * DV;
  const auto* dob = dout + orow;
  auto* dqb = dq + (size_t)(bh / H) * T * (H * D) + (bh % H) * D;
  const T_m* mrow = MASK ? mask + (size_t)(bh / H) * S : mask;
  attn_rows<T, DV, H * DV, BM, 256>(o + orow, dob, lse + (size_t)bh * T, i0, delta_s, lse_s);
  float2 acc[RM][CD];
  #pragma unroll
  for (int a = 0; a < RM; ++a) {
    #pragma unroll
    for (int e = 0; e < CD; ++e) acc[a][e] = make_float2(0.0f, 0.0f);
  }
  const int jend = CAUSAL ? (S < i0 + BM ? S : i0 + BM) : S;
  for (int j0 = 0; j0 < jend; j0 += BN) {
    float cr[RM][RN], ci[RM][RN], dp[RM][RN], unused[RM][RN];
    attn_dots<RM, RN, T, S, D, ABS, LQ, LK>(cr, ci, qb, kb, i0, j0, xs, ys);
    attn_dots<RM, RN, T, S, DV, 0, H * DV, LV>(dp, unused, dob, vb, i0, j0, xs, ys);
    #pragma unroll
    for (int a = 0; a < RM; ++a) {
      #pragma unroll
      for (int b = 0; b < RN; ++b) {
        const int r = ty + 16 * a, i = i0 + r, j = j0 + tx + 16 * b;
        float2 g = make_float2(0.0f, 0.0f);
        if (attn_valid<T, S, CAUSAL, MASK>(i, j, mrow)) {
          const float kp = DROP ? attn_keep(thr, keep, salt, step, attn_index<T, S>(bh, i, j)) : 1.0f;
          float pt;
          g = attn_grad<ABS>(cr[a][b], ci[a][b], dp[a][b], lse_s[r], delta_s[r], scale, kp, pt);
        }
        gr_s[r][tx + 16 * b] = g.x;
        if (ABS) gi_s[ABS ? r : 0][tx + 16 * b] = g.y;
      }
    }
    for (int k0 = 0; k0 < BN; k0 += KC) {
      __syncthreads();
      attn_stage_rows<KC, S, D, LK>(kt, kb, j0 + k0);
      __syncthreads();
      #pragma unroll 4
      for (int jj = 0; jj < KC; ++jj) {
        float2 ga[RM];
        #pragma unroll
        for (int a = 0; a < RM; ++a)
          ga[a] = make_float2(gr_s[ty + 16 * a][k0 + jj], ABS ? gi_s[ABS ? ty + 16 * a : 0][k0 + jj] : 0.0f);
        #pragma unroll
        for (int e = 0; e < CD; ++e) {
          if (tx + 16 * e < D) {
            const float2 w = kt[jj * D + tx + 16 * e];
            #pragma unroll
            for (int a = 0; a < RM; ++a) {
              acc[a][e].x = fmaf(ga[a].x, w.x, acc[a][e].x);
              acc[a][e].y = fmaf(ga[a].x, w.y, acc[a][e].y);
              if (ABS) {
                acc[a][e].x = fmaf(-ga[a].y, w.y, acc[a][e].x);
                acc[a][e].y = fmaf(ga[a].y, w.x, acc[a][e].y);
              }
            }
          }
        }
      }
    }
  }
  #pragma unroll
  for (int a = 0; a < RM; ++a) {
    const int i = i0 + ty + 16 * a;
    if (i < T) {
      #pragma unroll
      for (int e = 0; e < CD; ++e)
        if (tx + 16 * e < D) dqb[(size_t)i * (H * D) + tx + 16 * e] = acc[a][e];
    }
  }
}

// AttentionGrad w.r.t. k and v: dk_j = sum_i g_ij q_i (conj(g_ij) for the magnitude score),
// dv_j = sum_i p~_ij dO_i, written to row j of out [B, S, H D + H DV] (every head's dk, then
// every head's dv: columns h D .. and H D + h DV ..). A block owns BN
// keys; each thread accumulates two neighbouring ones (their p~ and g load as one 8-byte word:
// rows of BN + 2), 512 / BN threads per key pair; the queries' rows are staged RC at a time
// where the score chunks were.
template <int H, int T, int S, int D, int DV, int LQ, int LK, int LV, int ABS, int CAUSAL, int MASK, int DROP, int RM, int RN, int RC, typename T_q, typename T_k, typename T_v, typename T_o, typename T_dout, typename T_dkv, typename T_m>
static __device__ void attn_dkv(const T_q* __restrict__ q, const T_k* __restrict__ k,
    const T_v* __restrict__ v, const T_o* __restrict__ o, const T_dout* __restrict__ dout,
    const float* __restrict__ lse, const T_m* __restrict__ mask, T_dkv* __restrict__ dkv,
    float scale, u32 thr, float keep, u32 salt, u32 step) {
  constexpr int BM = 16 * RM, BN = 16 * RN, TILES = (S + BN - 1) / BN, L = 512 / BN, BP = BN + 2;
  using ColsK = AttnCols<D, L, D % 2 == 0>;
  using ColsV = AttnCols<DV, L, DV % 2 == 0>;
  constexpr int CK = ColsK::C, CV = ColsV::C;
  constexpr int CHUNK_BYTES = (BM + BN) * 17 * 8, ROW_BYTES = RC * (D + DV) * 8;
  __shared__ __align__(16) char raw[CHUNK_BYTES > ROW_BYTES ? CHUNK_BYTES : ROW_BYTES];
  float2 (*xs)[17] = (float2 (*)[17])raw;
  float2 (*ys)[17] = (float2 (*)[17])(raw + BM * 17 * 8);
  float2* qr = (float2*)raw;
  float2* dor = (float2*)raw + RC * D;
  __shared__ __align__(8) float pt_s[BM][BP], gr_s[BM][BP];
  __shared__ __align__(8) float gi_s[ABS ? BM : 1][BP];
  __shared__ float delta_s[BM], lse_s[BM];
  const int bh = blockIdx.x / TILES, j0 = (blockIdx.x % TILES) * BN;
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const int kr = threadIdx.x / L, kc = threadIdx.x % L;
  const auto* qb = q + (size_t)(bh / H) * T * LQ + (bh % H) * D;
  const auto* kb = k + (size_t)(bh / H) * S * LK + (bh % H) * D;
  const auto* vb = v + (size_t)(bh / H) * S * LV + (bh % H) * DV;
  const auto* ob = o + (size_t)(bh / H) * T * (H * DV) + (bh % H) * DV;
  const auto* dob = dout + (size_t)(bh / H) * T * (H * DV) + (bh % H) * DV;
  const T_m* mrow = MASK ? mask + (size_t)(bh / H) * S : mask;
  float2 dk[2][CK], dv[2][CV];
  #pragma unroll
  for (int u = 0; u < 2; ++u) {
    #pragma unroll
    for (int e = 0; e < CK; ++e) dk[u][e] = make_float2(0.0f, 0.0f);
    #pragma unroll
    for (int e = 0; e < CV; ++e) dv[u][e] = make_float2(0.0f, 0.0f);
  }
  // With a causal mask, query tiles that end before the first key see none of these keys.
  for (int i0 = CAUSAL ? (j0 / BM) * BM : 0; i0 < T; i0 += BM) {
    __syncthreads();
    attn_rows<T, DV, H * DV, BM, 256>(ob, dob, lse + (size_t)bh * T, i0, delta_s, lse_s);
    float cr[RM][RN], ci[RM][RN], dp[RM][RN], unused[RM][RN];
    attn_dots<RM, RN, T, S, D, ABS, LQ, LK>(cr, ci, qb, kb, i0, j0, xs, ys);
    attn_dots<RM, RN, T, S, DV, 0, H * DV, LV>(dp, unused, dob, vb, i0, j0, xs, ys);
    #pragma unroll
    for (int a = 0; a < RM; ++a) {
      #pragma unroll
      for (int b = 0; b < RN; ++b) {
        const int r = ty + 16 * a, i = i0 + r, c = tx + 16 * b, j = j0 + c;
        float2 g = make_float2(0.0f, 0.0f);
        float pt = 0.0f;
        if (attn_valid<T, S, CAUSAL, MASK>(i, j, mrow)) {
          const float kp = DROP ? attn_keep(thr, keep, salt, step, attn_index<T, S>(bh, i, j)) : 1.0f;
          g = attn_grad<ABS>(cr[a][b], ci[a][b], dp[a][b], lse_s[r], delta_s[r], scale, kp, pt);
        }
        pt_s[r][c] = pt;
        gr_s[r][c] = g.x;
        if (ABS) gi_s[ABS ? r : 0][c] = g.y;
      }
    }
    const int rows = T - i0 < BM ? T - i0 : BM;
    for (int ic = 0; ic < rows; ic += RC) {
      __syncthreads();
      attn_stage_rows<RC, T, D, LQ>(qr, qb, i0 + ic);
      attn_stage_rows<RC, T, DV, H * DV>(dor, dob, i0 + ic);
      __syncthreads();
      #pragma unroll 2
      for (int ii = 0; ii < RC; ++ii) {
        const float2 pt = *reinterpret_cast<const float2*>(&pt_s[ic + ii][2 * kr]);
        const float2 gx = *reinterpret_cast<const float2*>(&gr_s[ic + ii][2 * kr]);
        const float2 gy = ABS ? *reinterpret_cast<const float2*>(&gi_s[ABS ? ic + ii : 0][2 * kr]) : make_float2(0.0f, 0.0f);
        const float pu[2] = {pt.x, pt.y}, gxu[2] = {gx.x, gx.y}, gyu[2] = {gy.x, gy.y};
        #pragma unroll
        for (int e = 0; e < CK; e += ColsK::STEP) {
          const int c = ColsK::col(kc, e);
          if (c < D) {
            float2 w[2];
            attn_ld2<D % 2 == 0>(&qr[ii * D + c], w[0], w[1]);
            #pragma unroll
            for (int s = 0; s < ColsK::STEP; ++s) {
              #pragma unroll
              for (int u = 0; u < 2; ++u) {
                float2& ac = dk[u][e + s];
                ac.x = fmaf(gxu[u], w[s].x, ac.x);
                ac.y = fmaf(gxu[u], w[s].y, ac.y);
                if (ABS) {
                  ac.x = fmaf(gyu[u], w[s].y, ac.x);
                  ac.y = fmaf(-gyu[u], w[s].x, ac.y);
                }
              }
            }
          }
        }
        #pragma unroll
        for (int e = 0; e < CV; e += ColsV::STEP) {
          const int c = ColsV::col(kc, e);
          if (c < DV) {
            float2 w[2];
            attn_ld2<DV % 2 == 0>(&dor[ii * DV + c], w[0], w[1]);
            #pragma unroll
            for (int s = 0; s < ColsV::STEP; ++s) {
              #pragma unroll
              for (int u = 0; u < 2; ++u) {
                float2& ac = dv[u][e + s];
                ac.x = fmaf(pu[u], w[s].x, ac.x);
                ac.y = fmaf(pu[u], w[s].y, ac.y);
              }
            }
          }
        }
      }
    }
  }
  #pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int j = j0 + 2 * kr + u;
    if (j < S) {
      auto* row = dkv + ((size_t)(bh / H) * S + j) * (H * (D + DV));
      #pragma unroll
      for (int e = 0; e < CK; ++e)
        if (ColsK::col(kc, e) < D) row[(bh % H) * D + ColsK::col(kc, e)] = dk[u][e];
      #pragma unroll
      for (int e = 0; e < CV; ++e)
        if (ColsV::col(kc, e) < DV) row[H * D + (bh % H) * DV + ColsV::col(kc, e)] = dv[u][e];
    }
  }
}

"#;
