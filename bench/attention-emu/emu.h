// A CUDA block on CPU threads for main.cpp: 256 std::threads per block, __syncthreads as a
// barrier, __shfl_xor_sync through a block-wide slot array (the kernels shuffle in uniform
// control flow), __shared__ as function statics (one block runs at a time).
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <algorithm>
struct float2 { float x, y; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
typedef unsigned int u32;
typedef unsigned long long u64;
struct Dim3 { int x; };
thread_local Dim3 threadIdx;
Dim3 blockIdx;
std::barrier<>* g_bar;
static inline void __syncthreads() { g_bar->arrive_and_wait(); }
static float g_slots[256];
static inline float __shfl_xor_sync(unsigned, float v, int off) {
  g_slots[threadIdx.x] = v; __syncthreads();
  float r = g_slots[threadIdx.x ^ off]; __syncthreads(); return r;
}
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define INF __int_as_float(0x7f800000)
static inline u32 dropout_hash(u32 salt, u32 step, u32 index) {
  u32 x = index ^ (salt * 0x9E3779B9u) ^ (step * 0x85EBCA6Bu);
  x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;
  return x;
}
template <class F> void launch(int blocks, F f) {
  for (int b = 0; b < blocks; ++b) {
    blockIdx.x = b;
    std::barrier<> bar(256);
    g_bar = &bar;
    std::vector<std::thread> th;
    for (int t = 0; t < 256; ++t) th.emplace_back([&, t] { threadIdx.x = t; f(); });
    for (auto& x : th) x.join();
  }
}
