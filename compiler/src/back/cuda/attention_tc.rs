//! Fused complex attention on TF32 tensor cores: the `Attention` forward (with or without its
//! log-sum-exp) and `AttentionGrad{Q,KV}` of the real score at `precision = tf32 | bf16 |
//! fp16`, as flash-style kernels whose every product is an `mma.sync.m16n8k8` (TF32 operands,
//! f32 accumulation) and that never store a `[B, H, T, S]` value.
//!
//! The complex rows are read as interleaved reals: with `q` and `k` rows of `D` complex
//! numbers, `Re(q·conj k) = Σ (qr·kr + qi·ki)` is the real dot product of the two rows seen
//! as `2·D` reals, and `p·v` (`p` real) is the real product of `p` with `v`'s rows seen the
//! same way; so the score, `Re(dO·conj v)`, `p·v`, `g·k`, `gᵀ·q` and `p̃ᵀ·dO` are six real
//! GEMMs of depth `2·D` (or over keys / queries). The layout, shared by the three templates of
//! [`LIB`]:
//! - 128 threads (4 warps); each warp owns 16 rows of the block's 64-row tile (queries for the
//!   forward and dq, keys for dk‖dv) and keeps its accumulators in the `mma` C layout;
//! - tiles are staged in dynamic shared memory as TF32 words (rounded to nearest once, when
//!   staged), the width padded to a multiple of 8 with zeros and each row `8m + 4` words apart,
//!   so that every fragment load of a warp touches 32 distinct banks;
//! - the scores' accumulator tile is used directly as the A fragment of the next product: the
//!   8 keys of one `mma` step are taken in the order (0, 2, 4, 6 | 1, 3, 5, 7), which the C
//!   layout holds per thread, and the B fragment reads the staged rows in the same order;
//! - softmax statistics per row are merged over the 4 lanes that hold a row (two shuffles);
//!   masks, dropout (`ir::dropout_keep`), `lse = 0` for a row with no unmasked key, and the
//!   skipped causal tiles are those of the FMA kernels (`attention.rs`);
//! - the forward keeps its queries' fragments in registers (64 keys per step); dq keeps its
//!   queries' fragments in registers and stages dO once (32 keys per step); dk‖dv stages its
//!   64 keys and values once and 32 queries per step. No atomics: each output element is
//!   written once, by one thread.
//!
//! The magnitude score (`|q·kᴴ|` needs the imaginary part too) and heads wider than 64 run on
//! the FMA kernels; so does `AttnLse` alone, whose exact statistics any forward may read.
//! `KernelConfig::attn = fma` keeps every attention kernel on FMA, to measure side by side.

use crate::ir::*;

/// The widest head (`D` and `Dv`, complex) the tensor-core kernels are written for: 128 reals
/// per row, 64 accumulator registers per thread.
pub const MAX_HEAD: usize = 64;

/// Threads per block.
pub const THREADS: usize = 128;

/// Rows of the tile each block owns (16 per warp).
const ROWS: usize = 64;

/// Shared row stride in 4-byte words of a head of `d` complex numbers: `2·d` reals padded to a
/// multiple of 8, plus 4 (conflict-free fragment loads).
fn stride(d: usize) -> usize {
    (2 * d).div_ceil(8) * 8 + 4
}

/// Keys (forward, dq) or queries (dk‖dv) per step of a kernel.
fn step_rows(op: &Op) -> usize {
    match op {
        Op::Attention { .. } => 64,
        _ => 32,
    }
}

/// Dynamic shared memory of the tensor-core kernel of `op`, in bytes, as the templates of
/// [`LIB`] lay it out.
pub fn shared_bytes(op: &Op, d: usize, dv: usize) -> usize {
    let (sk, sv, n) = (stride(d), stride(dv), step_rows(op));
    let words = match op {
        // K and V of a step; the queries are staged there once, first.
        Op::Attention { .. } => (n * (sk + sv)).max(ROWS * sk),
        // K and V of a step (the queries first), dO of the tile, δ and lse of its rows.
        Op::AttentionGrad { wrt: AttnWrt::Q, .. } => (n * (sk + sv)).max(ROWS * sk) + ROWS * sv + 2 * ROWS,
        // The block's K and V, q and dO of a step, δ and lse of the step's rows.
        Op::AttentionGrad { wrt: AttnWrt::KV, .. } => ROWS * (sk + sv) + n * (sk + sv) + 2 * n,
        _ => 0,
    };
    4 * words
}

/// Whether `op` of heads `d`, `dv` runs on the tensor-core kernels.
pub fn applies(op: &Op, d: usize, dv: usize) -> bool {
    let spec = match op {
        Op::Attention { spec } | Op::AttentionGrad { spec, .. } => spec,
        _ => return false,
    };
    spec.score == AttnScore::Real && d <= MAX_HEAD && dv <= MAX_HEAD
}

/// Blocks per head: tiles of 64 queries (forward, dq) or 64 keys (dk‖dv).
pub fn tiles(op: &Op, t: usize, s: usize) -> usize {
    match op {
        Op::AttentionGrad { wrt: AttnWrt::KV, .. } => s.div_ceil(ROWS),
        _ => t.div_ceil(ROWS),
    }
}

/// The tensor-core attention templates, emitted after [`super::attention::LIB`] (whose
/// `attn_valid`, `attn_keep`, `attn_index`, `attn_grad` and `attn_rows` they use).
pub const LIB: &str = r#"// Tensor-core fused attention (back/cuda/attention_tc.rs): 128 threads, 4 warps of 16 rows,
// complex rows read as 2 DC interleaved reals, staged as TF32 words.
template <int DC>
struct AttnTcW {
  static constexpr int WP = (2 * DC + 7) / 8 * 8;  // the real width, a multiple of the mma depth
  static constexpr int SW = WP + 4;                // the shared row stride, 8m + 4 words
  static constexpr int KS = WP / 8;                // mma steps (or n tiles) across the width
};
static __device__ __forceinline__ u32* attn_tc_smem() {
  extern __shared__ __align__(16) u32 attn_tc_dyn[];
  return attn_tc_dyn;
}
// Rows [r0, r0 + R) of an N x DC complex matrix with rows LD elements apart into dst (R rows of
// SW words, TF32), zero past row N and past column 2 DC.
template <int R, int N, int DC, int LD, typename T_src>
static __device__ __forceinline__ void attn_tc_stage(u32* dst, const T_src* __restrict__ src, int r0) {
  constexpr int HP = AttnTcW<DC>::WP / 2, SW = AttnTcW<DC>::SW;
  for (int e = threadIdx.x; e < R * HP; e += 128) {
    const int r = e / HP, c = e - r * HP, gr = r0 + r;
    float2 w = make_float2(0.0f, 0.0f);
    if (gr < N && c < DC) w = src[(size_t)gr * LD + c];
    *reinterpret_cast<uint2*>(dst + r * SW + 2 * c) = make_uint2(tf32(w.x), tf32(w.y));
  }
}
// The A fragment (16 x 8, row-major) of staged rows row0 .. row0 + 15, columns 8 ks ...
template <int SW>
static __device__ __forceinline__ void attn_tc_a(u32 (&a)[4], const u32* s, int row0, int ks) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const u32* p = s + (row0 + g) * SW + 8 * ks + t;
  a[0] = p[0]; a[1] = p[8 * SW]; a[2] = p[4]; a[3] = p[8 * SW + 4];
}
// The B fragment b[k][n] = s[n0 + n][8 ks + k]: a product with the staged rows' transpose.
template <int SW>
static __device__ __forceinline__ void attn_tc_bt(u32 (&b)[2], const u32* s, int n0, int ks) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const u32* p = s + (n0 + g) * SW + 8 * ks + t;
  b[0] = p[0]; b[1] = p[4];
}
// The B fragment of staged rows k0 .. k0 + 7 (the depth) in the order of attn_tc_pa (k = t is
// row 2t, k = t + 4 row 2t + 1), columns 8 nt ...
template <int SW>
static __device__ __forceinline__ void attn_tc_b(u32 (&b)[2], const u32* s, int k0, int nt) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const u32* p = s + (k0 + 2 * t) * SW + 8 * nt + g;
  b[0] = p[0]; b[1] = p[SW];
}
// An accumulator tile (C layout: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)) as the A
// fragment of a product over its 8 columns, taken in the order (0, 2, 4, 6 | 1, 3, 5, 7).
static __device__ __forceinline__ void attn_tc_pa(u32 (&a)[4], const float (&c)[4]) {
  a[0] = tf32(c[0]); a[1] = tf32(c[2]); a[2] = tf32(c[1]); a[3] = tf32(c[3]);
}
// acc[n] += A · Bᵀ: the warp's 16 staged rows of a (from row 16 warp) times the transpose of
// the staged rows of b, both of depth 8 KS (TF32 words, rows SW apart), N column tiles of 8.
template <int KS, int N, int SW>
static __device__ __forceinline__ void attn_tc_abt(float (&acc)[N][4], const u32* a_rows, const u32* b_rows) {
  const int warp = threadIdx.x >> 5;
  #pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    u32 a[4];
    attn_tc_a<SW>(a, a_rows, 16 * warp, kk);
    #pragma unroll
    for (int n = 0; n < N; ++n) {
      u32 b[2];
      attn_tc_bt<SW>(b, b_rows, 8 * n, kk);
      mma_tf32(acc[n], a, b);
    }
  }
}
// acc[n] += P · s: the KT accumulator tiles of p (8 columns each, as A fragments through
// attn_tc_pa) times the staged rows s of depth 8 KT, output columns 8 n for n < KS.
template <int KT, int KS, int SW>
static __device__ __forceinline__ void attn_tc_pv(float (&acc)[KS][4], const float (&p)[KT][4], const u32* s) {
  #pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
    u32 a[4];
    attn_tc_pa(a, p[kt]);
    #pragma unroll
    for (int n = 0; n < KS; ++n) {
      u32 b[2];
      attn_tc_b<SW>(b, s, 8 * kt, n);
      mma_tf32(acc[n], a, b);
    }
  }
}

// Attention: o_i = sum_j keep_ij exp(s_ij - lse_i) v_j; with LSE_OUT, lse_i computed in the same
// pass (online softmax: running max and sum per row, the output rescaled) and written.
template <int H, int T, int S, int D, int DV, int LQ, int LK, int LV, int CAUSAL, int MASK, int DROP, int LSE_OUT, typename T_q, typename T_k, typename T_v, typename T_out, typename T_m>
static __device__ void attn_tc_fwd(const T_q* __restrict__ q, const T_k* __restrict__ k,
    const T_v* __restrict__ v, float* __restrict__ lse, const T_m* __restrict__ mask,
    T_out* __restrict__ out, float scale, u32 thr, float keep, u32 salt, u32 step) {
  using WK = AttnTcW<D>;
  using WV = AttnTcW<DV>;
  constexpr int BM = 64, BN = 64, TILES = (T + BM - 1) / BM;
  u32* ks = attn_tc_smem();
  u32* vs = ks + BN * WK::SW;
  const int bh = blockIdx.x / TILES, i0 = (blockIdx.x % TILES) * BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const auto* qb = q + (size_t)(bh / H) * T * LQ + (bh % H) * D;
  const auto* kb = k + (size_t)(bh / H) * S * LK + (bh % H) * D;
  const auto* vb = v + (size_t)(bh / H) * S * LV + (bh % H) * DV;
  // The output's rows: [B, T, H DV], head-major columns.
  auto* ob = out + (size_t)(bh / H) * T * (H * DV) + (bh % H) * DV;
  const T_m* mrow = MASK ? mask + (size_t)(bh / H) * S : mask;
  // The warp's query fragments stay in registers (staged once where the keys go).
  u32 qa[WK::KS][4];
  attn_tc_stage<BM, T, D, LQ>(ks, qb, i0);
  __syncthreads();
  #pragma unroll
  for (int kk = 0; kk < WK::KS; ++kk) attn_tc_a<WK::SW>(qa[kk], ks, 16 * warp, kk);
  const int rows[2] = {i0 + 16 * warp + g, i0 + 16 * warp + g + 8};
  float m[2] = {-INF, -INF}, l[2] = {0.0f, 0.0f}, lr[2] = {0.0f, 0.0f};
  if (!LSE_OUT) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) lr[h] = rows[h] < T ? lse[(size_t)bh * T + rows[h]] : 0.0f;
  }
  float o[WV::KS][4];
  #pragma unroll
  for (int n = 0; n < WV::KS; ++n) { o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f; }
  const int jend = CAUSAL ? (S < i0 + BM ? S : i0 + BM) : S;
  for (int j0 = 0; j0 < jend; j0 += BN) {
    __syncthreads();
    attn_tc_stage<BN, S, D, LK>(ks, kb, j0);
    attn_tc_stage<BN, S, DV, LV>(vs, vb, j0);
    __syncthreads();
    float sc[BN / 8][4];
    #pragma unroll
    for (int n = 0; n < BN / 8; ++n) { sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f; }
    #pragma unroll
    for (int kk = 0; kk < WK::KS; ++kk) {
      #pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        u32 b[2];
        attn_tc_bt<WK::SW>(b, ks, 8 * n, kk);
        mma_tf32(sc[n], qa[kk], b);
      }
    }
    float tmax[2] = {-INF, -INF};
    #pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = rows[e >> 1], j = j0 + 8 * n + 2 * t + (e & 1);
        sc[n][e] = attn_valid<T, S, CAUSAL, MASK>(i, j, mrow) ? scale * sc[n][e] : -INF;
        tmax[e >> 1] = fmaxf(tmax[e >> 1], sc[n][e]);
      }
    }
    if (LSE_OUT) {
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 1));
        tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 2));
        const float mn = fmaxf(m[h], tmax[h]);
        // (No key of the row so far: nothing to rescale, and exp(-inf - -inf) is not a number.)
        const float corr = mn == -INF ? 1.0f : expf(m[h] - mn);
        m[h] = mn;
        l[h] *= corr;
        #pragma unroll
        for (int n = 0; n < WV::KS; ++n) { o[n][2 * h] *= corr; o[n][2 * h + 1] *= corr; }
      }
    }
    #pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, i = rows[h], j = j0 + 8 * n + 2 * t + (e & 1);
        float p = sc[n][e] == -INF ? 0.0f : expf(sc[n][e] - (LSE_OUT ? m[h] : lr[h]));
        if (LSE_OUT) l[h] += p;
        if (DROP && p != 0.0f) p *= attn_keep(thr, keep, salt, step, attn_index<T, S>(bh, i, j));
        sc[n][e] = p;
      }
    }
    attn_tc_pv<BN / 8, WV::KS, WV::SW>(o, sc, vs);
  }
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    float inv = 1.0f;
    if (LSE_OUT) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
      inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    }
    const int i = rows[h];
    if (i < T) {
      if (LSE_OUT && t == 0) lse[(size_t)bh * T + i] = l[h] > 0.0f ? m[h] + logf(l[h]) : 0.0f;
      #pragma unroll
      for (int n = 0; n < WV::KS; ++n) {
        const int c = 4 * n + t;
        if (c < DV) ob[(size_t)i * (H * DV) + c] = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
      }
    }
  }
}

// AttentionGrad w.r.t. q: dq_i = sum_j g_ij k_j, g_ij = scale p_ij (keep_ij dP_ij - delta_i).
template <int H, int T, int S, int D, int DV, int LQ, int LK, int LV, int CAUSAL, int MASK, int DROP, typename T_q, typename T_k, typename T_v, typename T_o, typename T_dout, typename T_dq, typename T_m>
static __device__ void attn_tc_dq(const T_q* __restrict__ q, const T_k* __restrict__ k,
    const T_v* __restrict__ v, const T_o* __restrict__ o, const T_dout* __restrict__ dout,
    const float* __restrict__ lse, const T_m* __restrict__ mask, T_dq* __restrict__ dq,
    float scale, u32 thr, float keep, u32 salt, u32 step) {
  using WK = AttnTcW<D>;
  using WV = AttnTcW<DV>;
  constexpr int BM = 64, BN = 32, TILES = (T + BM - 1) / BM;
  constexpr int KV = BN * (WK::SW + WV::SW), QW = BM * WK::SW, AREA = KV > QW ? KV : QW;
  u32* ks = attn_tc_smem();
  u32* vs = ks + BN * WK::SW;
  u32* dos = ks + AREA;
  float* delta_s = reinterpret_cast<float*>(dos + BM * WV::SW);
  float* lse_s = delta_s + BM;
  const int bh = blockIdx.x / TILES, i0 = (blockIdx.x % TILES) * BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const auto* qb = q + (size_t)(bh / H) * T * LQ + (bh % H) * D;
  const auto* kb = k + (size_t)(bh / H) * S * LK + (bh % H) * D;
  const auto* vb = v + (size_t)(bh / H) * S * LV + (bh % H) * DV;
  // o, dO: [B, T, H DV]; dq: [B, T, H D] (head-major columns).
  const size_t orow = (size_t)(bh / H) * T * (H * DV) + (bh % H) * DV;
  const auto* dob = dout + orow;
  auto* dqb = dq + (size_t)(bh / H) * T * (H * D) + (bh % H) * D;
  const T_m* mrow = MASK ? mask + (size_t)(bh / H) * S : mask;
  attn_rows<T, DV, H * DV, BM, 128>(o + orow, dob, lse + (size_t)bh * T, i0, delta_s, lse_s);
  attn_tc_stage<BM, T, D, LQ>(ks, qb, i0);
  attn_tc_stage<BM, T, DV, H * DV>(dos, dob, i0);
  __syncthreads();
  u32 qa[WK::KS][4];
  #pragma unroll
  for (int kk = 0; kk < WK::KS; ++kk) attn_tc_a<WK::SW>(qa[kk], ks, 16 * warp, kk);
  const int r[2] = {16 * warp + g, 16 * warp + g + 8};
  float acc[WK::KS][4];
  #pragma unroll
  for (int n = 0; n < WK::KS; ++n) { acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f; }
  const int jend = CAUSAL ? (S < i0 + BM ? S : i0 + BM) : S;
  for (int j0 = 0; j0 < jend; j0 += BN) {
    __syncthreads();
    attn_tc_stage<BN, S, D, LK>(ks, kb, j0);
    attn_tc_stage<BN, S, DV, LV>(vs, vb, j0);
    __syncthreads();
    float sc[BN / 8][4], dp[BN / 8][4];
    #pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) { sc[n][e] = 0.0f; dp[n][e] = 0.0f; }
    }
    #pragma unroll
    for (int kk = 0; kk < WK::KS; ++kk) {
      #pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        u32 b[2];
        attn_tc_bt<WK::SW>(b, ks, 8 * n, kk);
        mma_tf32(sc[n], qa[kk], b);
      }
    }
    attn_tc_abt<WV::KS, BN / 8, WV::SW>(dp, dos, vs);
    #pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rr = r[e >> 1], i = i0 + rr, j = j0 + 8 * n + 2 * t + (e & 1);
        float gv = 0.0f;
        if (attn_valid<T, S, CAUSAL, MASK>(i, j, mrow)) {
          const float kp = DROP ? attn_keep(thr, keep, salt, step, attn_index<T, S>(bh, i, j)) : 1.0f;
          float pt;
          gv = attn_grad<0>(sc[n][e], 0.0f, dp[n][e], lse_s[rr], delta_s[rr], scale, kp, pt).x;
        }
        sc[n][e] = gv;
      }
    }
    attn_tc_pv<BN / 8, WK::KS, WK::SW>(acc, sc, ks);
  }
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = i0 + r[h];
    if (i < T) {
      #pragma unroll
      for (int n = 0; n < WK::KS; ++n) {
        const int c = 4 * n + t;
        if (c < D) dqb[(size_t)i * (H * D) + c] = make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
      }
    }
  }
}

// AttentionGrad w.r.t. k and v: dk_j = sum_i g_ij q_i, dv_j = sum_i p~_ij dO_i, written to row
// j of out [B, S, H D + H DV] (every head's dk, then every head's dv). A block owns 64 keys (16 per warp, their K and V staged
// once) and runs over the query tiles 32 at a time; the scores are formed transposed (keys as
// rows), so p~ and g are already the A fragments of the accumulations.
template <int H, int T, int S, int D, int DV, int LQ, int LK, int LV, int CAUSAL, int MASK, int DROP, typename T_q, typename T_k, typename T_v, typename T_o, typename T_dout, typename T_dkv, typename T_m>
static __device__ void attn_tc_dkv(const T_q* __restrict__ q, const T_k* __restrict__ k,
    const T_v* __restrict__ v, const T_o* __restrict__ o, const T_dout* __restrict__ dout,
    const float* __restrict__ lse, const T_m* __restrict__ mask, T_dkv* __restrict__ dkv,
    float scale, u32 thr, float keep, u32 salt, u32 step) {
  using WK = AttnTcW<D>;
  using WV = AttnTcW<DV>;
  constexpr int BN = 64, BM = 32, TILES = (S + BN - 1) / BN;
  u32* ks = attn_tc_smem();
  u32* vs = ks + BN * WK::SW;
  u32* qs = vs + BN * WV::SW;
  u32* dos = qs + BM * WK::SW;
  float* delta_s = reinterpret_cast<float*>(dos + BM * WV::SW);
  float* lse_s = delta_s + BM;
  const int bh = blockIdx.x / TILES, j0 = (blockIdx.x % TILES) * BN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const auto* qb = q + (size_t)(bh / H) * T * LQ + (bh % H) * D;
  const auto* kb = k + (size_t)(bh / H) * S * LK + (bh % H) * D;
  const auto* vb = v + (size_t)(bh / H) * S * LV + (bh % H) * DV;
  const auto* ob = o + (size_t)(bh / H) * T * (H * DV) + (bh % H) * DV;
  const auto* dob = dout + (size_t)(bh / H) * T * (H * DV) + (bh % H) * DV;
  const T_m* mrow = MASK ? mask + (size_t)(bh / H) * S : mask;
  attn_tc_stage<BN, S, D, LK>(ks, kb, j0);
  attn_tc_stage<BN, S, DV, LV>(vs, vb, j0);
  const int keys[2] = {j0 + 16 * warp + g, j0 + 16 * warp + g + 8};
  float dk[WK::KS][4], dv[WV::KS][4];
  #pragma unroll
  for (int n = 0; n < WK::KS; ++n) { dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f; }
  #pragma unroll
  for (int n = 0; n < WV::KS; ++n) { dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f; }
  // With a causal mask, query tiles that end before the first key see none of these keys.
  for (int i0 = CAUSAL ? (j0 / BM) * BM : 0; i0 < T; i0 += BM) {
    __syncthreads();
    attn_rows<T, DV, H * DV, BM, 128>(ob, dob, lse + (size_t)bh * T, i0, delta_s, lse_s);
    attn_tc_stage<BM, T, D, LQ>(qs, qb, i0);
    attn_tc_stage<BM, T, DV, H * DV>(dos, dob, i0);
    __syncthreads();
    float st[BM / 8][4], dpt[BM / 8][4];
    #pragma unroll
    for (int n = 0; n < BM / 8; ++n) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) { st[n][e] = 0.0f; dpt[n][e] = 0.0f; }
    }
    attn_tc_abt<WK::KS, BM / 8, WK::SW>(st, ks, qs);
    attn_tc_abt<WV::KS, BM / 8, WV::SW>(dpt, vs, dos);
    #pragma unroll
    for (int n = 0; n < BM / 8; ++n) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rq = 8 * n + 2 * t + (e & 1), i = i0 + rq, j = keys[e >> 1];
        float pt = 0.0f, gv = 0.0f;
        if (attn_valid<T, S, CAUSAL, MASK>(i, j, mrow)) {
          const float kp = DROP ? attn_keep(thr, keep, salt, step, attn_index<T, S>(bh, i, j)) : 1.0f;
          gv = attn_grad<0>(st[n][e], 0.0f, dpt[n][e], lse_s[rq], delta_s[rq], scale, kp, pt).x;
        }
        st[n][e] = pt;
        dpt[n][e] = gv;
      }
    }
    attn_tc_pv<BM / 8, WV::KS, WV::SW>(dv, st, dos);
    attn_tc_pv<BM / 8, WK::KS, WK::SW>(dk, dpt, qs);
  }
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = keys[h];
    if (j < S) {
      auto* row = dkv + ((size_t)(bh / H) * S + j) * (H * (D + DV));
      #pragma unroll
      for (int n = 0; n < WK::KS; ++n) {
        const int c = 4 * n + t;
        if (c < D) row[(bh % H) * D + c] = make_float2(dk[n][2 * h], dk[n][2 * h + 1]);
      }
      #pragma unroll
      for (int n = 0; n < WV::KS; ++n) {
        const int c = 4 * n + t;
        if (c < DV) row[H * D + (bh % H) * DV + c] = make_float2(dv[n][2 * h], dv[n][2 * h + 1]);
      }
    }
  }
}

"#;
