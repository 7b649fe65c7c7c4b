//! CUDA kernels of the fused recurrences (`Recurrence`, `RecurrenceGrad`): one persistent
//! launch per op, one block per sample running all `T` steps in order (a sample's steps depend
//! only on that sample, so `__syncthreads` between steps is the only synchronisation). Each
//! thread owns hidden units `u ≡ threadIdx.x (mod blockDim.x)`: it forms the `G` rows of
//! `gh = W_hh·h_prev + b_hh` for its units and applies the cell; the backward recomputes the
//! gates from the stored states and carries `W_hhᴴ·dgh` to the previous step after a barrier.
//! An initial state `h0` (chunked back-propagation through time) is a pointer operand, null
//! when absent; its gradient is the first step's carry, written into the last step's row.

use super::{Ctx, Kernel};
use crate::error::CompileResult;
use crate::ir::{DType, Op, RnnCell};
use crate::passes::fusion::KernelGroup;

/// The device functions, emitted once per module before the first recurrence kernel.
pub(crate) const LIB: &str = r#"// Fused complex recurrences (back/cuda/recurrence.rs): complextorch's GRU/LSTM cells, split
// sigmoid/tanh; one block per sample, all steps in one launch.
static __device__ __forceinline__ float2 rnn_mul(float2 a, float2 b) { return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }
// a * conj(b)
static __device__ __forceinline__ float2 rnn_mulc(float2 a, float2 b) { return make_float2(a.x * b.x + a.y * b.y, a.y * b.x - a.x * b.y); }
static __device__ __forceinline__ float2 rnn_add(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
static __device__ __forceinline__ float2 rnn_sub(float2 a, float2 b) { return make_float2(a.x - b.x, a.y - b.y); }
static __device__ __forceinline__ float rnn_sigf(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float2 rnn_sig(float2 z) { return make_float2(rnn_sigf(z.x), rnn_sigf(z.y)); }
static __device__ __forceinline__ float2 rnn_tanh(float2 z) { return make_float2(tanhf(z.x), tanhf(z.y)); }
// Through a split activation from its output: sigmoid' = s(1 - s), tanh' = 1 - y^2 per part.
static __device__ __forceinline__ float2 rnn_dsig(float2 s, float2 g) { return make_float2(s.x * (1.0f - s.x) * g.x, s.y * (1.0f - s.y) * g.y); }
static __device__ __forceinline__ float2 rnn_dtanh(float2 y, float2 g) { return make_float2((1.0f - y.x * y.x) * g.x, (1.0f - y.y * y.y) * g.y); }
// The previous step's state row: h0's (null: none) on the first step, else a stored state
// (the two may be stored in different formats: 16-bit activations, full-width states).
template <typename A, typename B>
struct rnn_rows {
  const A* a;
  const B* b;
  __device__ __forceinline__ float2 operator[](int i) const { return a ? (float2)a[i] : (float2)b[i]; }
  __device__ __forceinline__ explicit operator bool() const { return a != nullptr || b != nullptr; }
};
// gh row `row` = W_hh[row, :] . prev + b_hh[row] (prev = 0: the bias alone).
template <int H, typename TW, typename TB, typename P>
static __device__ __forceinline__ float2 rnn_row(const TW* __restrict__ w, const TB* __restrict__ bias, const P& prev, int row) {
  float2 acc = bias[row];
  if (prev) {
    const auto* wr = w + (size_t)row * H;
    for (int j = 0; j < H; ++j) acc = rnn_add(acc, rnn_mul(wr[j], prev[j]));
  }
  return acc;
}
// The activated gates of unit u (GRU: r z n; LSTM: i f g o) and gh of GRU's n block.
template <int LSTM, int H, typename TX, typename TW, typename TB, typename P>
static __device__ __forceinline__ void rnn_gates(const TX* x, const TW* w, const TB* bias, const P& prev, int u, float2* a, float2* ghn) {
  if (LSTM) {
    a[0] = rnn_sig(rnn_add(x[u], rnn_row<H>(w, bias, prev, u)));
    a[1] = rnn_sig(rnn_add(x[H + u], rnn_row<H>(w, bias, prev, H + u)));
    a[2] = rnn_tanh(rnn_add(x[2 * H + u], rnn_row<H>(w, bias, prev, 2 * H + u)));
    a[3] = rnn_sig(rnn_add(x[3 * H + u], rnn_row<H>(w, bias, prev, 3 * H + u)));
  } else {
    a[0] = rnn_sig(rnn_add(x[u], rnn_row<H>(w, bias, prev, u)));
    a[1] = rnn_sig(rnn_add(x[H + u], rnn_row<H>(w, bias, prev, H + u)));
    *ghn = rnn_row<H>(w, bias, prev, 2 * H + u);
    a[2] = rnn_tanh(rnn_add(x[2 * H + u], rnn_mul(a[0], *ghn)));
  }
}
template <int LSTM, int H, int T, int REV, typename TX, typename TW, typename TB, typename T0, typename TO>
static __device__ void rnn_fwd(const TX* __restrict__ xp, const TW* __restrict__ w, const TB* __restrict__ bias, const T0* h0, TO* out) {
  constexpr int G = LSTM ? 4 : 3, SW = (LSTM ? 2 : 1) * H;
  xp += (size_t)blockIdx.x * T * G * H;
  out += (size_t)blockIdx.x * T * SW;
  if (h0) h0 += (size_t)blockIdx.x * SW;
  for (int s = 0; s < T; ++s) {
    const int t = REV ? T - 1 - s : s;
    const rnn_rows<T0, TO> prev = s == 0 ? rnn_rows<T0, TO>{h0, nullptr}
                                         : rnn_rows<T0, TO>{nullptr, out + (size_t)(REV ? t + 1 : t - 1) * SW};
    const auto* x = xp + (size_t)t * G * H;
    auto* o = out + (size_t)t * SW;
    for (int u = threadIdx.x; u < H; u += blockDim.x) {
      float2 a[4], ghn;
      rnn_gates<LSTM, H>(x, w, bias, prev, u, a, &ghn);
      const float2 hp = prev ? prev[u] : make_float2(0.0f, 0.0f);
      if (LSTM) {
        const float2 cp = prev ? prev[H + u] : make_float2(0.0f, 0.0f);
        const float2 c = rnn_add(rnn_mul(a[1], cp), rnn_mul(a[0], a[2]));
        o[H + u] = c;
        o[u] = rnn_mul(a[3], rnn_tanh(c));
      } else {
        const float2 one_z = make_float2(1.0f - a[1].x, -a[1].y);
        o[u] = rnn_add(rnn_mul(one_z, a[2]), rnn_mul(a[1], hp));
      }
    }
    __syncthreads();
  }
}
template <int LSTM, int H, int T, int REV, typename TX, typename TW, typename TB, typename TS, typename TD, typename T0, typename TO>
static __device__ void rnn_bwd(const TX* __restrict__ xp, const TW* __restrict__ w, const TB* __restrict__ bias, const TS* __restrict__ hs, const TD* __restrict__ dhs, const T0* h0, TO* out) {
  constexpr int G = LSTM ? 4 : 3, GH = G * H, SW = (LSTM ? 2 : 1) * H, W = 2 * GH + SW;
  const float2 zero = make_float2(0.0f, 0.0f);
  xp += (size_t)blockIdx.x * T * GH;
  hs += (size_t)blockIdx.x * T * SW;
  dhs += (size_t)blockIdx.x * T * SW;
  out += (size_t)blockIdx.x * T * W;
  if (h0) h0 += (size_t)blockIdx.x * SW;
  const int last = REV ? 0 : T - 1;
  for (int k = threadIdx.x; k < SW; k += blockDim.x) out[(size_t)last * W + 2 * GH + k] = dhs[(size_t)last * SW + k];
  __syncthreads();
  for (int s = T - 1; s >= 0; --s) {
    const int t = REV ? T - 1 - s : s, tp = REV ? t + 1 : t - 1;
    const rnn_rows<T0, TS> prev = s == 0 ? rnn_rows<T0, TS>{h0, nullptr} : rnn_rows<T0, TS>{nullptr, hs + (size_t)tp * SW};
    // The carry's target: the previous step's row, or h0's gradient in the last step's row
    // (read already), which receives no dhs.
    const TD* dp = s == 0 ? nullptr : dhs + (size_t)tp * SW;
    const auto* x = xp + (size_t)t * GH;
    auto* o = out + (size_t)t * W;
    auto* po = out + (size_t)(s == 0 ? last : tp) * W;
    for (int u = threadIdx.x; u < H; u += blockDim.x) {
      float2 a[4], ghn;
      rnn_gates<LSTM, H>(x, w, bias, prev, u, a, &ghn);
      const float2 dh = o[2 * GH + u];
      if (LSTM) {
        const float2 cp = prev ? prev[H + u] : make_float2(0.0f, 0.0f);
        const float2 tc = rnn_tanh(hs[(size_t)t * SW + H + u]);
        const float2 d_o = rnn_mulc(dh, tc);
        const float2 dc = rnn_add(o[2 * GH + H + u], rnn_dtanh(tc, rnn_mulc(dh, a[3])));
        const float2 p[4] = {rnn_dsig(a[0], rnn_mulc(dc, a[2])), rnn_dsig(a[1], rnn_mulc(dc, cp)),
                             rnn_dtanh(a[2], rnn_mulc(dc, a[0])), rnn_dsig(a[3], d_o)};
        for (int k = 0; k < 4; ++k) {
          o[k * H + u] = p[k];
          o[GH + k * H + u] = p[k];
        }
        if (prev) {
          po[2 * GH + u] = dp ? dp[u] : zero;
          po[2 * GH + H + u] = rnn_add(dp ? dp[H + u] : zero, rnn_mulc(dc, a[1]));
        }
      } else {
        const float2 hp = prev ? prev[u] : zero;
        const float2 dn = rnn_mulc(dh, make_float2(1.0f - a[1].x, -a[1].y));
        const float2 dz = rnn_mulc(dh, rnn_sub(hp, a[2]));
        const float2 dn_pre = rnn_dtanh(a[2], dn);
        const float2 dr_pre = rnn_dsig(a[0], rnn_mulc(dn_pre, ghn));
        const float2 dz_pre = rnn_dsig(a[1], dz);
        o[u] = dr_pre;
        o[H + u] = dz_pre;
        o[2 * H + u] = dn_pre;
        o[GH + u] = dr_pre;
        o[GH + H + u] = dz_pre;
        o[GH + 2 * H + u] = rnn_mulc(dn_pre, a[0]);
        if (prev) po[2 * GH + u] = rnn_add(dp ? dp[u] : zero, rnn_mulc(dh, a[1]));
      }
    }
    __syncthreads();
    if (prev) {
      // The previous state's share of gh: conj(W_hh)^T . dgh.
      for (int u = threadIdx.x; u < H; u += blockDim.x) {
        float2 acc = make_float2(0.0f, 0.0f);
        for (int i = 0; i < GH; ++i) acc = rnn_add(acc, rnn_mulc(o[GH + i], w[(size_t)i * H + u]));
        po[2 * GH + u] = rnn_add(po[2 * GH + u], acc);
      }
      __syncthreads();
    }
  }
}
"#;

/// Threads per block: the hidden units, rounded up to a warp, at most 256.
fn block_of(hidden: usize) -> u32 {
    hidden.next_multiple_of(32).min(256) as u32
}

/// The kernel of one recurrence group.
pub(crate) fn kernel(ctx: &Ctx, group: &KernelGroup, name: &str) -> CompileResult<Kernel> {
    let v = *group.nodes.last().ok_or_else(|| internal!("empty recurrence group"))?;
    let node = ctx.g.node(v);
    let (spec, grad) = match &node.op {
        Op::Recurrence { spec } => (*spec, false),
        Op::RecurrenceGrad { spec } => (*spec, true),
        other => return Err(internal!("{v}: {} is not a recurrence", other.mnemonic())),
    };
    let ins = &node.inputs;
    if ins.len() != if grad { spec.grad_operands() } else { spec.forward_operands() }
        || ins.iter().any(|&x| ctx.dtype(x) != DType::C64)
    {
        return Err(internal!("{v}: malformed {} operands", node.op.mnemonic()));
    }
    let [b, t, _] = ctx.shape(ins[0])[..] else {
        return Err(internal!("{v}: the recurrence input projection is not of rank 3"));
    };
    if b > ctx.target.device.max_grid[0] {
        return Err(user!("a recurrence over a batch of {b} exceeds the device's grid"));
    }
    // Sample offsets are `size_t` (64-bit at every size, as in the attention templates);
    // offsets within one sample's steps are `int`.
    if t.saturating_mul(spec.grad_width()).saturating_mul(2) >= super::INDEX32_LIMIT {
        return Err(user!(
            "a recurrence of {t} steps keeps {} floats per sample, more than its kernel's 32-bit \
             per-sample indexing: shorten the sequence or the hidden size",
            t * spec.grad_width() * 2
        ));
    }
    let largest = ins.iter().chain([&v]).map(|&x| ctx.g.ty(x).shape.numel(ctx.batch).saturating_mul(2)).max();
    let index = super::Indexing::template(largest.unwrap_or(0));
    let lstm = u8::from(spec.cell == RnnCell::Lstm);
    let tpl = format!("{lstm}, {}, {t}, {}", spec.hidden, u8::from(spec.reverse));
    let p = |i: usize| ctx.ptr(ins[i]);
    let h0 = match ins.get(if grad { 5 } else { 3 }) {
        Some(&h0) => ctx.ptr(h0)?,
        None => "(const float2*)0".to_string(),
    };
    let call = if grad {
        format!(
            "rnn_bwd<{tpl}>({}, {}, {}, {}, {}, {h0}, {});",
            p(0)?,
            p(1)?,
            p(2)?,
            p(3)?,
            p(4)?,
            ctx.ptr(v)?
        )
    } else {
        format!("rnn_fwd<{tpl}>({}, {}, {}, {h0}, {});", p(0)?, p(1)?, p(2)?, ctx.ptr(v)?)
    };
    let block = block_of(spec.hidden);
    let code =
        format!("extern \"C\" __global__ void __launch_bounds__({block}) {name}(char* A) {{\n  {call}\n}}\n");
    Ok(Kernel {
        code,
        grid: [b as u32, 1, 1],
        block: [block, 1, 1],
        zero: Vec::new(),
        scratch: 0,
        pre: None,
        post: None,
        shared: 0,
        index,
    })
}
