//! Generated CUDA kernels compiled for the host and run on the CPU, for the tests that check
//! the CUDA back end's kernels in CI, where there is no GPU (`tests/tests/attention_host.rs`,
//! `tests/tests/gemm_host.rs`, and whole steps through [`HostCudaBackend`] in
//! `tests/tests/cuda_host.rs`).
//!
//! The kernels' text is taken from a [`CudaModule`] as generated, the module's plain helper
//! functions with it, and compiled with the host's C++ compiler (`$CXX`, else `c++` or `g++`)
//! under a small emulation of a CUDA block: one host thread per CUDA thread, which meet at a
//! barrier for `__syncthreads`; `__shared__` arrays as statics and dynamic shared memory as one
//! buffer (blocks run one after another); warp shuffles through an exchange guarded by a
//! barrier of the warp's threads; `mma.sync` products (TF32 m16n8k8, bf16 and f16 m16n8k16)
//! and `ldmatrix` through a block-wide exchange, `wgmma` (TF32 m64n64k8 and m64n128k8 from
//! shared-memory descriptors) per thread, the format conversions by bit arithmetic (16-bit
//! storage included); `cp.async` copies and `wgmma` products run as late as the kernel's
//! waits allow (a valid schedule of asynchronous work, and the one that exposes a buffer
//! refilled too early); atomics as `std::atomic_ref`, `mbarrier`s as atomic words that
//! waiting threads sleep on. A shuffle must be reached by every thread of its warp, and an
//! `mma` by every thread of the block, as a barrier must; a kernel that breaks that hangs,
//! and the host program gives up after a minute. The hardware's own `mma` accumulation order
//! is the one thing this cannot show.

use cvc_compiler::back::cuda::{CudaModule, CudaStep, LIBRARIES};
use cvc_compiler::interp::{Tensor, TensorData};
use cvc_compiler::ir::DType;
use cvc_compiler::ir::{Storage, Value};
use cvc_compiler::passes::Program;
use cvc_compiler::target::CudaTarget;
use cvc_runtime::backend::{narrow_to_half, widen_half_bytes, Backend, HostTensor, RuntimeError};
use cvc_runtime::numerics::NonFinite;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Host definitions of what the generated kernels use from CUDA.
const EMULATION: &str = r#"#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
typedef unsigned int u32;
typedef unsigned long long u64;
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct int2 { int x, y; };
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline float __int_as_float(int b) { float x; memcpy(&x, &b, 4); return x; }
static inline float __uint_as_float(u32 b) { float x; memcpy(&x, &b, 4); return x; }
static inline u32 __float_as_uint(float x) { u32 b; memcpy(&b, &x, 4); return b; }
template <typename T> static inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> static inline T max(T a, T b) { return a < b ? b : a; }
struct Dim3 { unsigned x, y, z; };
thread_local Dim3 threadIdx, blockIdx;
static Dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
static std::barrier<>* block_barrier;
static inline void __syncthreads() { block_barrier->arrive_and_wait(); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// Shuffles meet at their warp's barrier (the warp's threads, or the block's last few): the
// lanes of one warp must all reach a shuffle, as on the device, but other warps need not.
static std::barrier<>* warp_barriers[32];
static inline void warp_sync() { warp_barriers[threadIdx.x >> 5]->arrive_and_wait(); }
static float shuffle_exchange[1024];
static inline float __shfl_xor_sync(unsigned, float v, int lanes) {
  const unsigned t = threadIdx.x;
  shuffle_exchange[t] = v;
  warp_sync();
  const float r = shuffle_exchange[t ^ (unsigned)lanes];
  warp_sync();
  return r;
}
template <typename T> static inline T __shfl_down_sync(unsigned, T v, int lanes) {
  static T exchange[1024];
  const unsigned t = threadIdx.x;
  exchange[t] = v;
  warp_sync();
  const T r = (t & 31u) + (unsigned)lanes < 32u ? exchange[t + (unsigned)lanes] : v;
  warp_sync();
  return r;
}
template <typename T> static inline T __ldcg(const T* p) { return *(const volatile T*)p; }
static inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
static inline double atomicAdd(double* p, double v) { return std::atomic_ref<double>(*p).fetch_add(v); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
"#;

/// The PTX-backed helpers of the module's prelude, as the host computes them.
const PTX_HELPERS: &str = r#"
// cvt.rna.tf32.f32: to 10 mantissa bits, to nearest, ties away from zero.
static inline u32 tf32(float x) {
  u32 b;
  memcpy(&b, &x, 4);
  if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0x1000u) & 0xffffe000u;
  return b;
}
static inline u32 tf32_lo(float x, u32 hi) { return tf32(x - __uint_as_float(hi)); }
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 of each warp: A 16 x 8 (a0 = A[g][t],
// a1 = A[g + 8][t], a2 = A[g][t + 4], a3 = A[g + 8][t + 4]), B 8 x 8 (b0 = B[t][g],
// b1 = B[t + 4][g]), C 16 x 8 (c0, c1 = C[g][2t, 2t + 1], c2, c3 = C[g + 8][..]), g = lane / 4,
// t = lane % 4; products and sums in f32.
static u32 mma_a[1024][4], mma_b[1024][2];
// One warp's m16n8kK product from the registers its lanes hold (exchanged through mma_a and
// mma_b): A(w0, r, k) and B(w0, k, n) read an operand element of the warp at lane w0.
template <unsigned K, typename FA, typename FB>
static inline void mma_exchange(float* d, const u32* a, const u32* b, FA A, FB B) {
  const unsigned me = threadIdx.x, w0 = me & ~31u, lane = me & 31u, g = lane >> 2, t = lane & 3u;
  for (int i = 0; i < 4; ++i) mma_a[me][i] = a[i];
  mma_b[me][0] = b[0];
  mma_b[me][1] = b[1];
  __syncthreads();
  for (int c = 0; c < 4; ++c) {
    const unsigned r = g + (c >= 2 ? 8u : 0u), n = 2u * t + (c & 1u);
    float acc = d[c];
    for (unsigned k = 0; k < K; ++k) acc = fmaf(A(w0, r, k), B(w0, k, n), acc);
    d[c] = acc;
  }
  __syncthreads();
}
static inline void mma_tf32(float* d, const u32* a, const u32* b) {
  mma_exchange<8>(d, a, b,
    [](unsigned w0, unsigned r, unsigned k) { return __uint_as_float(mma_a[w0 + (r % 8u) * 4u + k % 4u][(r >= 8u) + 2 * (k >= 4u)]); },
    [](unsigned w0, unsigned k, unsigned n) { return __uint_as_float(mma_b[w0 + n * 4u + k % 4u][k >= 4u]); });
}
// 16-bit formats: cvt.rn (to nearest even) to bf16 and IEEE half, and back.
static inline unsigned short bf16_bits(float x) {
  u32 b;
  memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((b >> 16) | 0x40u);
  return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
static inline unsigned short f16_bits(float x) {
  const _Float16 h = (_Float16)x;
  unsigned short b;
  memcpy(&b, &h, 2);
  return b;
}
static inline float f16_value(unsigned short b) { _Float16 h; memcpy(&h, &b, 2); return (float)h; }
static inline u32 ld_u32(const unsigned short* p) { u32 r; memcpy(&r, p, 4); return r; }
struct __align__(2) bf16s {
  unsigned short b;
  operator float() const { return __uint_as_float((u32)b << 16); }
  bf16s& operator=(float x) { b = bf16_bits(x); return *this; }
};
struct __align__(4) cbf16s {
  u32 u;  // im in the high half, re in the low half
  operator float2() const { return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u)); }
  cbf16s& operator=(float2 z) { u = ((u32)bf16_bits(z.y) << 16) | bf16_bits(z.x); return *this; }
};
struct __align__(2) f16s {
  unsigned short b;
  operator float() const { return f16_value(b); }
  f16s& operator=(float x) { b = f16_bits(x); return *this; }
};
struct __align__(4) cf16s {
  u32 u;
  operator float2() const { return make_float2(f16_value((unsigned short)(u & 0xffffu)), f16_value((unsigned short)(u >> 16))); }
  cf16s& operator=(float2 z) { u = ((u32)f16_bits(z.y) << 16) | f16_bits(z.x); return *this; }
};
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: A 16 x 16 (a0 = A[g][2t, 2t + 1],
// a1 = A[g + 8][2t, ..], a2 = A[g][2t + 8, ..], a3 = A[g + 8][2t + 8, ..]), B 16 x 8
// (b0 = B[2t, 2t + 1][g], b1 = B[2t + 8, ..][g]), each register the lower k in its low half;
// C as in the TF32 product.
template <bool BF>
static inline float half_word(u32 r, int hi) {
  const unsigned short b = (unsigned short)(hi ? r >> 16 : r & 0xffffu);
  return BF ? __uint_as_float((u32)b << 16) : f16_value(b);
}
template <bool BF>
static inline void mma_16(float* d, const u32* a, const u32* b) {
  mma_exchange<16>(d, a, b,
    [](unsigned w0, unsigned r, unsigned k) {
      return half_word<BF>(mma_a[w0 + (r % 8u) * 4u + (k % 8u) / 2u][(r >= 8u) + 2 * (k >= 8u)], k % 2u);
    },
    [](unsigned w0, unsigned k, unsigned n) { return half_word<BF>(mma_b[w0 + n * 4u + (k % 8u) / 2u][k >= 8u], k % 2u); });
}
static inline void mma_bf16(float* d, const u32* a, const u32* b) { mma_16<true>(d, a, b); }
static inline void mma_f16(float* d, const u32* a, const u32* b) { mma_16<false>(d, a, b); }
// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lanes 8i .. 8i + 7 give the row addresses of
// matrix i; register i of lane t holds row t / 4, words 2(t % 4), 2(t % 4) + 1 of it.
static const unsigned short* ldsm_rows[1024];
static inline void ldsm4(u32* r, const unsigned short* p) {
  const unsigned me = threadIdx.x, w0 = me & ~31u, lane = me & 31u;
  ldsm_rows[me] = p;
  __syncthreads();
  for (unsigned i = 0; i < 4; ++i) r[i] = ld_u32(ldsm_rows[w0 + 8u * i + lane / 4u] + 2u * (lane % 4u));
  __syncthreads();
}
// Warpgroup products are done as late as their waits allow: each thread queues them in groups
// (the open one, closed by a commit) and runs a group only when a wait no longer lets it be
// pending. Asynchronous copies land as late as that too in the blocks of odd index (a kernel
// that reads a tile before waiting for its copies reads stale data there) and at once in the
// others (one that refills a buffer which products still in flight read overwrites it there).
// Either way a wrong schedule computes wrong values here, as it may on the device.
#include <deque>
#include <functional>
struct AsyncQueue {
  std::vector<std::function<void()>> open;
  std::deque<std::vector<std::function<void()>>> groups;
  void commit() { groups.push_back(std::move(open)); open.clear(); }
  void wait(size_t pending) {
    while (groups.size() > pending) {
      for (auto& f : groups.front()) f();
      groups.pop_front();
    }
  }
};
thread_local AsyncQueue cp_queue, wgmma_queue;
static inline bool copies_land_late() { return (blockIdx.x + blockIdx.y + blockIdx.z) % 2u == 1u; }
static inline void cp_async4(float* dst, const float* src, bool ok) {
  auto copy = [=] { *dst = ok ? *src : 0.0f; };
  if (copies_land_late()) cp_queue.open.push_back(copy); else copy();
}
static inline void cp_async8(float2* dst, const float* src, bool ok) {
  auto copy = [=] { *dst = ok ? make_float2(src[0], src[1]) : make_float2(0.0f, 0.0f); };
  if (copies_land_late()) cp_queue.open.push_back(copy); else copy();
}
static inline void cp_async_commit() { cp_queue.commit(); }
template <int N> static inline void cp_async_wait() { cp_queue.wait(N); }
static inline void atomic_acc(float* p, float v) { atomicAdd(p, v); }
static inline void atomic_acc(float2* p, float2 v) { atomicAdd(&p->x, v.x); atomicAdd(&p->y, v.y); }
// The block's dynamic shared memory (`extern __shared__` on the device).
static unsigned char* dynamic_shared;
// wgmma (sm_90a), as the PTX ISA defines it for K-major operands without swizzling: a
// descriptor holds the operand's start in shared memory (here an offset into the block's
// dynamic shared memory), the byte distance between core matrices (8 rows of 16 bytes)
// adjacent along K (bits 16-29) and along the rows (bits 32-45), each >> 4. Each thread
// computes its own accumulator elements, when a wait makes the product's group complete
// (above); the tensor cores read an f32 operand as TF32 by its upper 19 bits.
static inline u64 wgmma_desc(const float* p, u32 lbo, u32 sbo) {
  const u32 off = (u32)((const unsigned char*)p - dynamic_shared);
  return (u64)((off & 0x3ffffu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}
static inline void wgmma_fence() {}
static inline void wgmma_commit() { wgmma_queue.commit(); }
template <int N> static inline void wgmma_wait() { wgmma_queue.wait(N); }
static inline void fence_async_shared() {}
// mbarrier: the pending arrivals in bits 0-19, the count in bits 20-39, the phase's parity in
// bit 40. An arrival made by `cp.async.mbarrier.arrive` lands this thread's copies first (the
// latest they may land), then arrives.
static inline void mbar_init(u64* b, u32 count) { std::atomic_ref<u64>(*b).store((u64)count | (u64)count << 20); }
static inline void mbar_arrive(u64* b) {
  std::atomic_ref<u64> a(*b);
  u64 v = a.load();
  for (;;) {
    const u64 pending = v & 0xfffffu, count = (v >> 20) & 0xfffffu, phase = (v >> 40) & 1u;
    const u64 next = pending > 1 ? v - 1 : (count | count << 20 | (phase ^ 1u) << 40);
    if (a.compare_exchange_weak(v, next)) {
      if (pending == 1) a.notify_all();
      return;
    }
  }
}
static inline void cp_async_mbar_arrive(u64* b) {
  cp_queue.commit();
  cp_queue.wait(0);
  mbar_arrive(b);
}
template <int N> static inline void setmaxnreg_dec() {}
template <int N> static inline void setmaxnreg_inc() {}
static inline void mbar_wait(u64* b, u32 parity) {
  std::atomic_ref<u64> a(*b);
  for (u64 v = a.load(); ((v >> 40) & 1u) == parity; v = a.load()) a.wait(v);
}
static inline float wgmma_element(u64 desc, unsigned r, unsigned k) {
  const size_t start = (size_t)(desc & 0x3fffu) << 4, lbo = (size_t)((desc >> 16) & 0x3fffu) << 4,
               sbo = (size_t)((desc >> 32) & 0x3fffu) << 4;
  u32 b;
  memcpy(&b, dynamic_shared + start + (r / 8u) * sbo + (k / 4u) * lbo + (r % 8u) * 16u + (k % 4u) * 4u, 4);
  return __uint_as_float(b & 0xffffe000u);
}
// m64nNk8: thread t of warp w of the warpgroup holds D rows 16w + t/4 (+8), columns
// 8i + 2(t%4) (+1) in d[4i .. 4i + 3]; A is 64 x 8 (rows m), B 8 x N stored as N rows n of K.
// `A(r, k)` gives A's element.
template <int N, int SA, int SB, typename FA> static inline void wgmma_now(float* d, FA A, u64 b) {
  const unsigned t = threadIdx.x % 128u, w = t / 32u, lane = t % 32u;
  for (unsigned i = 0; i < N / 8; ++i)
    for (unsigned q = 0; q < 4; ++q) {
      const unsigned r = 16u * w + lane / 4u + (q >= 2 ? 8u : 0u), n = 8u * i + 2u * (lane % 4u) + (q & 1u);
      float acc = d[4 * i + q];
      for (unsigned k = 0; k < 8; ++k) acc = fmaf((float)SA * A(r, k), (float)SB * wgmma_element(b, n, k), acc);
      d[4 * i + q] = acc;
    }
}
template <int N, int SA, int SB> static inline void wgmma_tf32(float* d, u64 a, u64 b) {
  wgmma_queue.open.push_back([=] { wgmma_now<N, SA, SB>(d, [a](unsigned r, unsigned k) { return wgmma_element(a, r, k); }, b); });
}
// 16-bit operands (`tc16=wgmma`): element (r, k) of a K-major operand of 16-bit elements, its
// core matrices 8 rows of 8 elements (16 bytes); A is 64 x 16, B 16 x N, as above otherwise.
template <bool BF> static inline float wgmma_element16(u64 desc, unsigned r, unsigned k) {
  const size_t start = (size_t)(desc & 0x3fffu) << 4, lbo = (size_t)((desc >> 16) & 0x3fffu) << 4,
               sbo = (size_t)((desc >> 32) & 0x3fffu) << 4;
  unsigned short h;
  memcpy(&h, dynamic_shared + start + (r / 8u) * sbo + (k / 8u) * lbo + (r % 8u) * 16u + (k % 8u) * 2u, 2);
  return BF ? __uint_as_float((u32)h << 16) : f16_value(h);
}
// The product once it runs, `A(r, k)` giving A's element (as `wgmma_now`, 16 deep).
template <int N, bool BF, typename FA> static inline void wgmma16_now(float* d, FA A, u64 b) {
  const unsigned t = threadIdx.x % 128u, w = t / 32u, lane = t % 32u;
  for (unsigned i = 0; i < N / 8; ++i)
    for (unsigned q = 0; q < 4; ++q) {
      const unsigned r = 16u * w + lane / 4u + (q >= 2 ? 8u : 0u), n = 8u * i + 2u * (lane % 4u) + (q & 1u);
      float acc = d[4 * i + q];
      for (unsigned k = 0; k < 16; ++k) acc = fmaf(A(r, k), wgmma_element16<BF>(b, n, k), acc);
      d[4 * i + q] = acc;
    }
}
template <int N, bool BF> static inline void wgmma16(float* d, u64 a, u64 b) {
  wgmma_queue.open.push_back([=] { wgmma16_now<N, BF>(d, [a](unsigned r, unsigned k) { return wgmma_element16<BF>(a, r, k); }, b); });
}
// With A from registers (16-bit pairs, mma.m16n8k16's A fragment: thread t of warp w holds rows
// 16w + t/4 (+8) in a[0] (a[1]), columns 2(t%4), 2(t%4) + 1 there and 8 more in a[2], a[3]).
static u32 wgmma16_ra[1024][4];
template <int N, bool BF> static inline void wgmma16(float* d, const u32* a, u64 b) {
  const unsigned me = threadIdx.x, w0 = me & ~127u;
  for (int i = 0; i < 4; ++i) wgmma16_ra[me][i] = a[i];
  __syncthreads();
  auto A = std::make_shared<std::vector<float>>(64 * 16);
  for (unsigned r = 0; r < 64; ++r)
    for (unsigned k = 0; k < 16; ++k) {
      const u32 word = wgmma16_ra[w0 + (r / 16u) * 32u + (r % 8u) * 4u + (k % 8u) / 2u][(r % 16u >= 8u) + 2u * (k >= 8u)];
      const unsigned short h = (unsigned short)(k % 2u ? word >> 16 : word & 0xffffu);
      (*A)[r * 16 + k] = BF ? __uint_as_float((u32)h << 16) : f16_value(h);
    }
  __syncthreads();
  wgmma_queue.open.push_back([=] { wgmma16_now<N, BF>(d, [A](unsigned r, unsigned k) { return (*A)[r * 16 + k]; }, b); });
}
// With A from registers (`wga=regs`): the warpgroup's 64 x 8 A gathered from its threads'
// fragments when the product is issued (thread t of warp w: rows 16w + t/4 (+8) in a[0] (a[1]),
// columns t%4 (+4) in a[0] (a[2])), read as TF32 by truncation; B as above, when it runs.
static u32 wgmma_ra[1024][4];
template <int N, int SA, int SB> static inline void wgmma_tf32(float* d, const u32* a, u64 b) {
  const unsigned me = threadIdx.x, w0 = me & ~127u;
  for (int i = 0; i < 4; ++i) wgmma_ra[me][i] = a[i];
  __syncthreads();
  auto A = std::make_shared<std::vector<float>>(64 * 8);
  for (unsigned r = 0; r < 64; ++r)
    for (unsigned k = 0; k < 8; ++k) {
      const u32 bits = wgmma_ra[w0 + (r / 16u) * 32u + (r % 8u) * 4u + k % 4u][(r % 16u >= 8u) + 2u * (k >= 4u)];
      (*A)[r * 8 + k] = __uint_as_float(bits & 0xffffe000u);
    }
  __syncthreads();
  wgmma_queue.open.push_back([=] { wgmma_now<N, SA, SB>(d, [A](unsigned r, unsigned k) { return (*A)[r * 8 + k]; }, b); });
}
"#;

/// `main(arena, kernel, gx, gy, gz, threads, shared)`: runs the grid's blocks of `threads`
/// threads of the named kernel (with `shared` bytes of dynamic shared memory), one block after
/// another, on the arena file and writes it back; gives up after a minute (a hung barrier).
const MAIN: &str = r#"
int main(int argc, char** argv) {
  if (argc != 8) return 2;
  std::thread([] { std::this_thread::sleep_for(std::chrono::seconds(60)); fprintf(stderr, "hung\n"); _Exit(4); }).detach();
  void (*kernel)(char*) = nullptr;
  for (const auto& k : KERNELS) if (!strcmp(k.name, argv[2])) kernel = k.f;
  if (!kernel) { fprintf(stderr, "no kernel %s\n", argv[2]); return 2; }
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 3;
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* arena = (char*)aligned_alloc(256, (n + 255) / 256 * 256);
  if (fread(arena, 1, n, f) != (size_t)n) return 3;
  fclose(f);
  const Dim3 grid = {(unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]), (unsigned)atoi(argv[5])};
  const unsigned nthreads = (unsigned)atoi(argv[6]);
  if (nthreads == 0 || nthreads > 1024) return 2;
  gridDim = grid;
  blockDim = Dim3{nthreads, 1, 1};
  std::vector<unsigned char> shared((size_t)atol(argv[7]) + 16);
  dynamic_shared = shared.data();
  std::barrier<> bar(nthreads);
  block_barrier = &bar;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  for (unsigned w = 0; w * 32 < nthreads; ++w) {
    warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, nthreads - w * 32)));
    warp_barriers[w] = warps.back().get();
  }
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < nthreads; ++t)
    threads.emplace_back([=] {
      threadIdx = Dim3{t, 0, 0};
      for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
          for (unsigned x = 0; x < grid.x; ++x) {
            blockIdx = Dim3{x, y, z};
            kernel(arena);
            __syncthreads();
          }
    });
  for (auto& t : threads) t.join();
  f = fopen(argv[1], "wb");
  if (!f || fwrite(arena, 1, n, f) != (size_t)n) return 3;
  fclose(f);
  return 0;
}
"#;

/// One kernel launch as the host program runs it.
#[derive(Clone, Debug)]
pub struct HostLaunch {
    /// The kernel's name in the host program.
    pub name: String,
    /// Grid size (x, y, z).
    pub grid: [u32; 3],
    /// Threads per block (a one-dimensional block).
    pub threads: u32,
    /// Dynamic shared memory in bytes.
    pub shared: u32,
}

/// The C++ source of a host program being assembled: the emulation, the plain helpers of the
/// first module added, template libraries, kernels and their table.
#[derive(Default)]
pub struct HostSource {
    code: String,
    table: String,
    helpers: bool,
}

impl HostSource {
    /// The emulation and the plain helper functions of `module`'s prelude (element arithmetic,
    /// the dropout hash), once; its PTX-backed helpers are the emulation's.
    fn helpers(&mut self, module: &CudaModule) {
        if self.helpers {
            return;
        }
        self.helpers = true;
        self.code.push_str(EMULATION);
        let s = &module.source;
        let typedefs = "typedef unsigned long long u64;\n";
        let from = s.find(typedefs).map(|i| i + typedefs.len()).expect("the module's prelude");
        let to = s.find("// TF32 tensor-core product").expect("the module's PTX helpers");
        self.code.push_str(&s[from..to]);
        self.code.push_str(PTX_HELPERS);
        let hash = "static __device__ __forceinline__ u32 dropout_hash(";
        let at = s.find(hash).expect("the dropout hash");
        let end = s[at..].find("\n}\n").map(|e| at + e + 3).expect("the dropout hash's end");
        self.code.push_str(&s[at..end]);
    }

    /// A template library of the module (`back::cuda::LIBRARIES`), after the helpers.
    pub fn library(&mut self, module: &CudaModule, text: &str) {
        self.helpers(module);
        let smem = "extern __shared__ __align__(16) u32 attn_tc_dyn[];";
        self.code.push_str(&text.replace(smem, "u32* attn_tc_dyn = (u32*)dynamic_shared;"));
    }

    /// Kernel `name` of `module` under the name `as_name` (names repeat across modules).
    pub fn kernel(&mut self, module: &CudaModule, name: &str, as_name: &str) {
        self.helpers(module);
        let at = module.kernels.iter().position(|k| k == name).expect("a kernel of the module");
        let (text, _) = &module.kernel_code[at];
        let text = text.replace(&format!(" {name}(char* A)"), &format!(" {as_name}(char* A)")).replace(
            "extern __shared__ __align__(16) unsigned char gemm_smem[];",
            "unsigned char* gemm_smem = dynamic_shared;",
        );
        self.code.push_str(&text);
        let _ = writeln!(self.table, "  {{\"{as_name}\", {as_name}}},");
    }

    /// Compiles the program in a fresh folder named after `tag`.
    pub fn build(self, tag: &str) -> HostProgram {
        let dir = std::env::temp_dir().join(format!("cvc-host-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let mut code = self.code;
        code.push_str(
            "struct Entry { const char* name; void (*f)(char*); };\nstatic const Entry KERNELS[] = {\n",
        );
        code.push_str(&self.table);
        code.push_str("};\n");
        code.push_str(MAIN);
        let src = dir.join("kernels.cpp");
        let exe = dir.join("kernels");
        std::fs::write(&src, &code).expect("write the C++ source");
        let built = std::process::Command::new(cxx())
            .args(["-O1", "-std=c++20", "-pthread", "-w", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("the C++ compiler runs");
        assert!(built.status.success(), "host build failed:\n{}", String::from_utf8_lossy(&built.stderr));
        HostProgram { dir, exe }
    }
}

/// A compiled host program of kernels.
pub struct HostProgram {
    dir: PathBuf,
    exe: PathBuf,
}

impl HostProgram {
    /// Runs `launch` on `arena` (the plan's arena, in and out).
    pub fn run(&self, arena: &mut Vec<u8>, launch: &HostLaunch) -> Result<(), String> {
        let file = self.dir.join("arena.bin");
        std::fs::write(&file, &*arena).map_err(|e| e.to_string())?;
        let [x, y, z] = launch.grid;
        let out = std::process::Command::new(&self.exe)
            .arg(&file)
            .arg(&launch.name)
            .args([x, y, z, launch.threads, launch.shared].map(|n| n.to_string()))
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("{}: {}", launch.name, String::from_utf8_lossy(&out.stderr)));
        }
        *arena = std::fs::read(&file).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The folder of its files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for HostProgram {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The host's C++ compiler: `$CXX`, else `c++` or `g++`.
pub fn cxx() -> String {
    let candidates: Vec<String> =
        std::env::var("CXX").into_iter().chain(["c++".into(), "g++".into()]).collect();
    for c in &candidates {
        if std::process::Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()) {
            return c.clone();
        }
    }
    panic!("no C++ compiler (tried {candidates:?}): install g++ (.ci/run does) or set CXX");
}

/// The elements of a tensor, complex ones as (re, im).
pub fn flat(t: &Tensor) -> Vec<f64> {
    match &t.data {
        TensorData::Real(v) => v.clone(),
        TensorData::Complex(v) => v.iter().flat_map(|z| [z.re, z.im]).collect(),
        TensorData::Int(v) => v.iter().map(|&x| x as f64).collect(),
    }
}

/// `t` as a kernel reads it from an f32 arena: rounded to f32.
pub fn rounded(t: &Tensor) -> Tensor {
    rounded_as(t, Storage::Full)
}

/// `t` as a kernel reads it from a buffer of storage `s`: rounded to f32 or to the 16-bit
/// format.
pub fn rounded_as(t: &Tensor, s: Storage) -> Tensor {
    let r = |x: f64| match s {
        Storage::Full => x as f32 as f64,
        half => half_value(half, half_bits(half, x)) as f64,
    };
    let data = match &t.data {
        TensorData::Real(v) => TensorData::Real(v.iter().map(|&x| r(x)).collect()),
        TensorData::Complex(v) => {
            TensorData::Complex(v.iter().map(|z| num_complex::Complex64::new(r(z.re), r(z.im))).collect())
        }
        TensorData::Int(v) => TensorData::Int(v.clone()),
    };
    Tensor { shape: t.shape.clone(), data }
}

/// `x` (rounded to f32 first) in a 16-bit format, to nearest even.
pub fn half_bits(s: Storage, x: f64) -> u16 {
    let x = x as f32;
    match s {
        Storage::F16 => f16_from_f32(x),
        _ => {
            let b = x.to_bits();
            if x.is_nan() {
                return ((b >> 16) | 0x40) as u16;
            }
            ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
        }
    }
}

/// The value of 16-bit word `b` in format `s`.
pub fn half_value(s: Storage, b: u16) -> f32 {
    match s {
        Storage::F16 => f16_to_f32(b),
        _ => f32::from_bits((b as u32) << 16),
    }
}

/// IEEE binary16 of `x`, to nearest even (overflow to infinity, subnormals kept).
fn f16_from_f32(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = x.abs();
    if a.is_nan() {
        return sign | 0x7e00;
    }
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    // Scale so that one unit in the last place of the half result is one: half has 10 stored
    // bits; normal halves have exponents from -14.
    let e = if a < 2f32.powi(-14) { -14 } else { a.log2().floor() as i32 };
    let ulp = 2f64.powi(e - 10);
    let q = (a as f64 / ulp).round_ties_even();
    let v = q * ulp;
    // Assemble from the rounded value (it may have carried into the next binade).
    if v < 2f64.powi(-14) {
        return sign | v.mul_add(2f64.powi(24), 0.0) as u16;
    }
    let e2 = v.log2().floor() as i32;
    let m = (v / 2f64.powi(e2) - 1.0) * 1024.0;
    sign | (((e2 + 15) as u16) << 10) | (m.round() as u16)
}

/// The value of IEEE binary16 `b`.
fn f16_to_f32(b: u16) -> f32 {
    let sign = if b & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 10) & 0x1f) as i32;
    let m = (b & 0x3ff) as f64;
    let v = match e {
        0 => m * 2f64.powi(-24),
        31 => {
            if m == 0.0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        }
        _ => (1.0 + m / 1024.0) * 2f64.powi(e - 15),
    };
    (sign * v) as f32
}

/// Runs `launches` in order, which compute group `group` of `program` (a kernel that stages an
/// operand in the module's scratch memory, then the group's own), on an arena of
/// `arena_bytes` (at least the plan's: the module's scratch past it) that holds `values` of the
/// group's inputs at their slots, and returns what they wrote to each of the group's outputs.
pub fn run_group(
    host: &HostProgram,
    program: &Program,
    group: usize,
    launches: &[HostLaunch],
    arena_bytes: usize,
    values: &[Option<Tensor>],
) -> Result<Vec<(Value, Vec<f32>)>, String> {
    let group = &program.groups[group];
    let plan = &program.plan;
    let mut arena = vec![0u8; arena_bytes.max(plan.arena_bytes)];
    let slot = |v: Value| plan.slot(v).ok_or_else(|| format!("{v} has no slot"));
    for &i in &group.inputs {
        let t = values[i.index()].as_ref().ok_or_else(|| format!("{i} was not evaluated"))?;
        let s = slot(i)?;
        let bytes: Vec<u8> = match (&t.data, program.graph.storage(i)) {
            (TensorData::Int(v), _) => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
            (_, Storage::Full) => flat(t).iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
            (_, half) => flat(t).iter().flat_map(|&x| half_bits(half, x).to_le_bytes()).collect(),
        };
        if bytes.len() != s.bytes {
            return Err(format!("{i} has {} bytes, its slot {}", bytes.len(), s.bytes));
        }
        arena[s.offset..s.offset + s.bytes].copy_from_slice(&bytes);
    }
    for launch in launches {
        host.run(&mut arena, launch)?;
    }
    group
        .outputs
        .iter()
        .map(|&o| {
            let s = slot(o)?;
            let bytes = &arena[s.offset..s.offset + s.bytes];
            let got = match program.graph.storage(o) {
                Storage::Full => {
                    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
                }
                half => bytes
                    .chunks_exact(2)
                    .map(|b| half_value(half, u16::from_le_bytes([b[0], b[1]])))
                    .collect(),
            };
            Ok((o, got))
        })
        .collect()
}

/// A CUDA step run on the host: every launch of a [`CudaModule`] (elementwise, reduction,
/// movement, contraction, attention and recurrence kernels alike) under the emulated block, on
/// one arena laid out as the plan lays out the device's (the plan's buffers, then the module's
/// scratch). A [`Backend`], so the differential checks that run on the GPU
/// (`cvc_tests::differential::check_step_locally`) run the same code in CI.
pub struct HostCudaBackend {
    program: Program,
    module: CudaModule,
    host: HostProgram,
    arena: Vec<u8>,
}

impl HostCudaBackend {
    /// Generates `program` for `target` and compiles every kernel for the host; `tag` names
    /// the build folder (tests running side by side need their own).
    pub fn new(program: &Program, target: &CudaTarget, tag: &str) -> Result<Self, String> {
        let module = cvc_compiler::back::cuda::generate(program, target).map_err(|e| e.to_string())?;
        let mut source = HostSource::default();
        let mut libs: Vec<usize> = module.kernel_code.iter().flat_map(|(_, l)| l.iter().copied()).collect();
        libs.sort_unstable();
        libs.dedup();
        for l in libs {
            source.library(&module, LIBRARIES[l]);
        }
        for name in &module.kernels {
            source.kernel(&module, name, name);
        }
        let host = source.build(tag);
        let (at, bytes) = module.scratch;
        let arena = vec![0u8; (at + bytes).max(program.plan.arena_bytes)];
        Ok(HostCudaBackend { program: program.clone(), module, host, arena })
    }

    /// The generated module.
    pub fn module(&self) -> &CudaModule {
        &self.module
    }

    fn place(&self, v: Value) -> Result<(DType, Vec<usize>, Storage, usize, usize), RuntimeError> {
        let g = &self.program.graph;
        if v.index() >= g.nodes.len() {
            return Err(RuntimeError(format!("{v} is not a value of this program")));
        }
        let slot = self
            .program
            .plan
            .slot(v)
            .ok_or_else(|| RuntimeError(format!("{v} has no buffer in the plan")))?;
        let ty = g.ty(v);
        Ok((ty.dtype, ty.shape.resolve(self.program.plan.batch), g.storage(v), slot.offset, slot.bytes))
    }
}

impl Backend for HostCudaBackend {
    fn name(&self) -> String {
        "cuda-on-host".into()
    }

    fn upload(&mut self, v: Value, t: &HostTensor) -> Result<(), RuntimeError> {
        let (dt, shape, storage, at, room) = self.place(v)?;
        if dt != t.dtype || shape.iter().product::<usize>() != t.numel() {
            return Err(RuntimeError(format!(
                "upload to {v}: expected {dt}{shape:?}, got {}{:?}",
                t.dtype, t.shape
            )));
        }
        let bytes = match storage {
            Storage::Full => t.as_bytes().into_owned(),
            half => narrow_to_half(&t.as_bytes(), half),
        };
        if bytes.len() > room {
            return Err(RuntimeError(format!("upload to {v}: {} bytes into {room}", bytes.len())));
        }
        self.arena[at..at + bytes.len()].copy_from_slice(&bytes);
        Ok(())
    }

    fn download(&mut self, v: Value) -> Result<HostTensor, RuntimeError> {
        let (dt, shape, storage, at, room) = self.place(v)?;
        let n = (shape.iter().product::<usize>() * storage.elem_bytes(dt)).min(room);
        let mut bytes = self.arena[at..at + n].to_vec();
        if storage.is_half() && dt != DType::I32 {
            bytes = widen_half_bytes(&bytes, storage);
        }
        Ok(HostTensor::from_bytes(dt, &shape, &bytes))
    }

    fn step(&mut self) -> Result<(), RuntimeError> {
        for step in &self.module.steps {
            match step {
                CudaStep::Zero { offset, bytes } => self.arena[*offset..offset + bytes].fill(0),
                CudaStep::Launch(l) => {
                    let launch = HostLaunch {
                        name: l.name.clone(),
                        grid: l.grid,
                        threads: l.block[0],
                        shared: l.shared_bytes,
                    };
                    self.host.run(&mut self.arena, &launch).map_err(RuntimeError)?;
                }
            }
        }
        Ok(())
    }

    fn step_checked(&mut self) -> Result<Option<NonFinite>, RuntimeError> {
        Err(RuntimeError("the host emulation of the CUDA back end has no check mode".into()))
    }

    fn checked_steps(&self) -> u64 {
        0
    }

    fn arena_bytes(&self) -> usize {
        self.arena.len()
    }

    fn measured_peak_bytes(&self) -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::{half_bits, half_value};
    use cvc_compiler::ir::Storage;

    #[test]
    fn half_formats_round_to_nearest_even() {
        // IEEE binary16 words of known values (ties to even, subnormals, overflow).
        let f16 = [
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65520.0, 0x7c00),
            (2f64.powi(-24), 0x0001),
            (2f64.powi(-14), 0x0400),
            (1.0 / 3.0, 0x3555),
            (0.1, 0x2e66),
            (1.0 + 2f64.powi(-11), 0x3c00),
            (1.0 + 3.0 * 2f64.powi(-11), 0x3c02),
        ];
        for (x, w) in f16 {
            assert_eq!(half_bits(Storage::F16, x), w, "f16 of {x}");
            // Every word's value converts back to the word.
            assert_eq!(half_bits(Storage::F16, half_value(Storage::F16, w) as f64), w, "f16 word {w:#06x}");
        }
        assert_eq!(half_value(Storage::F16, 0x3555), 0.333_251_95);
        // bfloat16: the high half of the f32, to nearest even.
        let bf16 = [
            (1.0, 0x3f80),
            (-2.0, 0xc000),
            (1.0 + 2f64.powi(-8), 0x3f80),
            (1.0 + 3.0 * 2f64.powi(-8), 0x3f82),
        ];
        for (x, w) in bf16 {
            assert_eq!(half_bits(Storage::Bf16, x), w, "bf16 of {x}");
        }
        assert_eq!(half_value(Storage::Bf16, 0x3f82), 1.015625);
    }
}
