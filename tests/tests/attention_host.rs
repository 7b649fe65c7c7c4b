//! The CUDA back end's fused attention kernels (the FMA templates of `back/cuda/attention.rs`
//! and, at `tf32`, the tensor-core ones of `attention_tc.rs`), compiled for the host and run on
//! every variant of `cvc_tests::attention::cases`: separate,
//! packed `q ‖ k ‖ v` and packed `k ‖ v` operands, both scores, causal, key mask, dropout, odd
//! head widths, tails of every tile; fused (the forward with its log-sum-exp) and unfused.
//! No GPU: the module's attention template library and kernels are compiled with the host's
//! C++ compiler (`$CXX`, else `c++` or `g++`) under a small emulation of a CUDA block (its
//! threads meet at a barrier for `__syncthreads`, shared memory as statics, warp shuffles and
//! `mma.sync.m16n8k8` TF32 products through a shared exchange, `cvt.rna.tf32` as its bit
//! rounding). Each launch runs on an arena holding the interpreter's values of its operands
//! (rounded to f32) at the plan's offsets, and what it writes is compared with the interpreter
//! replaying its group on those operands: within f32 arithmetic for the FMA kernels, within
//! `cvc_tests::attention::tensor_core_bound` more for the tensor-core ones. So CI checks the
//! kernels' indexing (heads read in place from strided rows, token-major outputs, fragment
//! layouts) that only a GPU run checked before; the hardware's own `mma` accumulation order is
//! what the GPU tests still add.

use cvc_compiler::back::cuda::{self, CudaStep, LIBRARIES};
use cvc_compiler::config::Precision;
use cvc_compiler::interp::replay::replay_group;
use cvc_compiler::interp::{evaluate, SplitMix64, Tensor, TensorData};
use cvc_compiler::ir::Value;
use cvc_compiler::passes::fusion::GroupKind;
use cvc_compiler::passes::Program;
use cvc_compiler::target::CudaTarget;
use cvc_tests::attention::{cases, program_fused, tensor_core_bound};
use cvc_tests::differential::random_leaves;
use cvc_tests::seed::seed_for;
use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// What a CUDA block needs on the host: the vector types, the thread and block indices, a
/// barrier of the block's threads, and shuffles and TF32 `mma` through a shared exchange (every
/// shuffle and `mma` of these kernels is reached by all threads of the block, as
/// `__syncthreads` is; a kernel for which that fails would hang, and the watchdog ends it).
const PRELUDE: &str = r#"#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
typedef unsigned int u32;
typedef unsigned long long u64;
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
struct Dim3 { unsigned x, y, z; };
thread_local Dim3 threadIdx, blockIdx;
static Dim3 blockDim = {256, 1, 1}, gridDim = {1, 1, 1};
static std::barrier<>* block_barrier;
static inline void __syncthreads() { block_barrier->arrive_and_wait(); }
static float shuffle_exchange[1024];
static inline float __shfl_xor_sync(unsigned, float v, int lanes) {
  const unsigned t = threadIdx.x;
  shuffle_exchange[t] = v;
  __syncthreads();
  const float r = shuffle_exchange[t ^ (unsigned)lanes];
  __syncthreads();
  return r;
}
// cvt.rna.tf32.f32: to 10 mantissa bits, to nearest, ties away from zero.
static inline u32 tf32(float x) {
  u32 b;
  memcpy(&b, &x, 4);
  if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0x1000u) & 0xffffe000u;
  return b;
}
static inline float word(u32 b) { float x; memcpy(&x, &b, 4); return x; }
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 of each warp: A 16 x 8 (a0 = A[g][t],
// a1 = A[g + 8][t], a2 = A[g][t + 4], a3 = A[g + 8][t + 4]), B 8 x 8 (b0 = B[t][g],
// b1 = B[t + 4][g]), C 16 x 8 (c0, c1 = C[g][2t, 2t + 1], c2, c3 = C[g + 8][..]), g = lane / 4,
// t = lane % 4; products and sums in f32.
static u32 mma_a[1024][4], mma_b[1024][2];
static inline void mma_tf32(float* d, const u32* a, const u32* b) {
  const unsigned me = threadIdx.x, w0 = me & ~31u, lane = me & 31u, g = lane >> 2, t = lane & 3u;
  for (int i = 0; i < 4; ++i) mma_a[me][i] = a[i];
  mma_b[me][0] = b[0];
  mma_b[me][1] = b[1];
  __syncthreads();
  for (int c = 0; c < 4; ++c) {
    const unsigned r = g + (c >= 2 ? 8u : 0u), n = 2u * t + (c & 1u);
    float acc = d[c];
    for (unsigned k = 0; k < 8; ++k) {
      const float x = word(mma_a[w0 + (r % 8u) * 4u + k % 4u][(r >= 8u ? 1 : 0) + (k >= 4u ? 2 : 0)]);
      const float y = word(mma_b[w0 + n * 4u + k % 4u][k >= 4u ? 1 : 0]);
      acc = fmaf(x, y, acc);
    }
    d[c] = acc;
  }
  __syncthreads();
}
// The block's dynamic shared memory (`extern __shared__` on the device).
static unsigned char* dynamic_shared;
#define INF INFINITY
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
"#;

/// `main(arena, kernel, blocks, threads, shared)`: runs `blocks` blocks of `threads` threads of
/// the named kernel (with `shared` bytes of dynamic shared memory), one block after another, on
/// the arena file and writes it back; gives up after a minute (a hung barrier).
const MAIN: &str = r#"
int main(int argc, char** argv) {
  if (argc != 6) return 2;
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
  const unsigned blocks = (unsigned)atoi(argv[3]), nthreads = (unsigned)atoi(argv[4]);
  if (nthreads == 0 || nthreads > 1024) return 2;
  gridDim = Dim3{blocks, 1, 1};
  blockDim = Dim3{nthreads, 1, 1};
  std::vector<unsigned char> shared((size_t)atol(argv[5]) + 16);
  dynamic_shared = shared.data();
  std::barrier<> bar(nthreads);
  block_barrier = &bar;
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < nthreads; ++t)
    threads.emplace_back([=] {
      threadIdx = Dim3{t, 0, 0};
      for (unsigned b = 0; b < blocks; ++b) {
        blockIdx = Dim3{b, 0, 0};
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

/// One attention launch of a case's module.
struct Launch {
    case: String,
    program: usize,
    name: String,
    blocks: u32,
    threads: u32,
    shared: u32,
    group: usize,
    /// It calls a tensor-core template (`attn_tc_*`).
    tensor_cores: bool,
}

/// The host's C++ compiler.
fn cxx() -> String {
    let candidates: Vec<String> =
        std::env::var("CXX").into_iter().chain(["c++".into(), "g++".into()]).collect();
    for c in &candidates {
        if std::process::Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()) {
            return c.clone();
        }
    }
    panic!("no C++ compiler (tried {candidates:?}): install g++ (.ci/run does) or set CXX");
}

/// The text of the function that starts with `head` in `source`, up to its closing line.
fn function<'a>(source: &'a str, head: &str) -> &'a str {
    let at = source.find(head).unwrap_or_else(|| panic!("the module defines no `{head}`"));
    let end = source[at..].find("\n}\n").map(|e| at + e + 3).expect("the function's end");
    &source[at..end]
}

/// A real or complex tensor's elements as f32 words (complex as re, im).
fn floats(t: &Tensor) -> Vec<f32> {
    flat(t).into_iter().map(|x| x as f32).collect()
}

fn flat(t: &Tensor) -> Vec<f64> {
    match &t.data {
        TensorData::Real(v) => v.clone(),
        TensorData::Complex(v) => v.iter().flat_map(|z| [z.re, z.im]).collect(),
        TensorData::Int(v) => v.iter().map(|&x| x as f64).collect(),
    }
}

/// `t` as the kernel reads it: rounded to f32.
fn rounded(t: &Tensor) -> Tensor {
    let data = match &t.data {
        TensorData::Real(v) => TensorData::Real(v.iter().map(|&x| x as f32 as f64).collect()),
        TensorData::Complex(v) => TensorData::Complex(
            v.iter().map(|z| num_complex::Complex64::new(z.re as f32 as f64, z.im as f32 as f64)).collect(),
        ),
        TensorData::Int(v) => TensorData::Int(v.clone()),
    };
    Tensor { shape: t.shape.clone(), data }
}

/// Runs `launch` of `program` on the host program `exe` with the operands `values` and
/// returns what it wrote, per output value.
fn run(
    exe: &Path,
    dir: &Path,
    program: &Program,
    launch: &Launch,
    values: &[Option<Tensor>],
) -> Vec<(Value, Vec<f32>)> {
    let group = &program.groups[launch.group];
    let plan = &program.plan;
    let mut arena = vec![0u8; plan.arena_bytes];
    let slot = |v: Value| plan.slot(v).unwrap_or_else(|| panic!("{}: {v} has no slot", launch.case));
    for &i in &group.inputs {
        let t = values[i.index()].as_ref().expect("an evaluated operand");
        let s = slot(i);
        let bytes: Vec<u8> = match &t.data {
            TensorData::Int(v) => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
            _ => floats(t).iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        assert_eq!(bytes.len(), s.bytes, "{}: {i}'s bytes", launch.case);
        arena[s.offset..s.offset + s.bytes].copy_from_slice(&bytes);
    }
    let file = dir.join("arena.bin");
    std::fs::write(&file, &arena).expect("write the arena");
    let out = std::process::Command::new(exe)
        .arg(&file)
        .arg(&launch.name)
        .args([launch.blocks, launch.threads, launch.shared].map(|n| n.to_string()))
        .output()
        .expect("the host program runs");
    assert!(
        out.status.success(),
        "{} {}: {}",
        launch.case,
        launch.name,
        String::from_utf8_lossy(&out.stderr)
    );
    let arena = std::fs::read(&file).expect("read the arena");
    group
        .outputs
        .iter()
        .map(|&o| {
            let s = slot(o);
            let got = arena[s.offset..s.offset + s.bytes]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (o, got)
        })
        .collect()
}

/// Every attention launch of every case at `precision`, built into one host program and run
/// against the interpreter; returns the launches and how many of them used tensor cores.
fn check(precision: Precision) -> (usize, usize) {
    let dir = std::env::temp_dir().join(format!("cvc-attention-host-{precision:?}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let target = CudaTarget::h200().with_precision(precision);
    let mut programs = Vec::new();
    let mut launches = Vec::new();
    let mut code = String::from(PRELUDE);
    let mut table = String::from(
        "struct Entry { const char* name; void (*f)(char*); };\nstatic const Entry KERNELS[] = {\n",
    );
    let mut libraries = false;
    for c in cases() {
        for fuse in [true, false] {
            let case = format!("{}{} {precision:?}", c.name(), if fuse { "" } else { " unfused" });
            let program = program_fused(&c, 2, fuse);
            let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{case}: {e}"));
            if !libraries {
                code.push_str(function(
                    &module.source,
                    "static __device__ __forceinline__ u32 dropout_hash(",
                ));
                code.push_str(LIBRARIES[0]);
                // The dynamic shared memory is the host program's buffer.
                let smem = "extern __shared__ __align__(16) u32 attn_tc_dyn[];";
                assert!(LIBRARIES[2].contains(smem), "the tensor-core library's shared memory");
                code.push_str(&LIBRARIES[2].replace(smem, "u32* attn_tc_dyn = (u32*)dynamic_shared;"));
                libraries = true;
            }
            let p = programs.len();
            for step in &module.steps {
                let CudaStep::Launch(l) = step else { continue };
                if program.groups[l.group].kind != GroupKind::Attention {
                    continue;
                }
                assert_eq!(
                    (l.grid[1], l.grid[2], l.block[1], l.block[2]),
                    (1, 1, 1, 1),
                    "{case}: one-dimensional"
                );
                let at = module.kernels.iter().position(|k| k == &l.name).expect("a kernel of the module");
                let (text, _) = &module.kernel_code[at];
                // Kernel names repeat across cases: each case's get a prefix.
                let name = format!("c{p}_{}", l.name);
                code.push_str(&text.replace(&format!(" {}(char* A)", l.name), &format!(" {name}(char* A)")));
                let _ = writeln!(table, "  {{\"{name}\", {name}}},");
                launches.push(Launch {
                    case: case.clone(),
                    program: p,
                    name,
                    blocks: l.grid[0],
                    threads: l.block[0],
                    shared: l.shared_bytes,
                    group: l.group,
                    tensor_cores: text.contains("attn_tc_"),
                });
            }
            programs.push(program);
        }
    }
    table.push_str("};\n");
    code.push_str(&table);
    code.push_str(MAIN);
    let src = dir.join("attention.cpp");
    let exe: PathBuf = dir.join("attention");
    std::fs::write(&src, &code).expect("write the C++ source");
    let built = std::process::Command::new(cxx())
        .args(["-O1", "-std=c++20", "-pthread", "-w", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("the C++ compiler runs");
    assert!(built.status.success(), "host build failed:\n{}", String::from_utf8_lossy(&built.stderr));

    let mut failures = Vec::new();
    let mut checked = 0;
    let mut evaluated: HashMap<usize, Vec<Option<Tensor>>> = HashMap::new();
    for launch in &launches {
        let program = &programs[launch.program];
        let g = &program.graph;
        let batch = program.plan.batch;
        // The interpreter's value of every node on fresh random leaves, rounded to f32 as the
        // arena holds them.
        let values = evaluated.entry(launch.program).or_insert_with(|| {
            let mut rng = SplitMix64::new(seed_for(&format!("attention_host::{}", launch.case)));
            let leaves = random_leaves(g, batch, &mut rng);
            evaluate(g, batch, &leaves)
                .unwrap_or_else(|e| panic!("{}: {e}", launch.case))
                .into_iter()
                .map(|t| t.map(|t| rounded(&t)))
                .collect()
        });
        let group = &program.groups[launch.group];
        let operands: HashMap<Value, Tensor> = group
            .inputs
            .iter()
            .map(|&i| (i, values[i.index()].clone().expect("an evaluated operand")))
            .collect();
        let replay = replay_group(g, batch, &group.nodes, &operands)
            .unwrap_or_else(|e| panic!("{}: replaying {}: {e}", launch.case, launch.name));
        for (o, got) in run(&exe, &dir, program, launch, values) {
            let want_t = replay.values.get(&o).expect("a replayed output");
            let want = flat(want_t);
            assert_eq!(got.len(), want.len(), "{} {}: {o}'s length", launch.case, launch.name);
            // Per element: f32 arithmetic over at most a few hundred terms of magnitude ≲ the
            // output's own, plus the TF32 operand rounding's bound where tensor cores ran (one
            // bound per complex element, its real and imaginary parts together).
            let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            let per = if matches!(want_t.data, TensorData::Complex(_)) { 2 } else { 1 };
            let extra = if launch.tensor_cores {
                let node = g.node(o);
                let ins: Vec<&Tensor> = node
                    .inputs
                    .iter()
                    .map(|i| operands.get(i).or_else(|| replay.values.get(i)).expect("an attention operand"))
                    .collect();
                tensor_core_bound(&node.op, &ins, TF32_UNIT_ROUNDOFF)
                    .unwrap_or_else(|e| panic!("{} {}: {e}", launch.case, launch.name))
            } else {
                vec![0.0; want.len() / per]
            };
            let worst = got
                .iter()
                .zip(&want)
                .enumerate()
                .map(|(i, (&a, &b))| (i, (a as f64 - b).abs() - extra[i / per]))
                .fold((0, f64::NEG_INFINITY), |w, x| if x.1 > w.1 || x.1.is_nan() { x } else { w });
            checked += 1;
            if worst.1.is_nan() || worst.1 > 2e-4 * scale {
                failures.push(format!(
                    "{} {} ({}): element {} is {} where the interpreter gives {} (bound {:.3e} + {:.3e})",
                    launch.case,
                    launch.name,
                    g.node(o).op.mnemonic(),
                    worst.0,
                    got[worst.0],
                    want[worst.0],
                    extra[worst.0 / per],
                    2e-4 * scale
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let tc = launches.iter().filter(|l| l.tensor_cores).count();
    eprintln!(
        "{precision:?}: {checked} attention outputs of {} launches ({tc} on tensor cores) checked",
        launches.len()
    );
    assert!(checked >= 3 * cases().len() * 2, "too few attention outputs checked: {checked}");
    assert!(
        failures.is_empty(),
        "host-compiled attention kernels vs the interpreter:\n{}",
        failures.join("\n")
    );
    (launches.len(), tc)
}

/// TF32's unit roundoff (10 stored mantissa bits, rounded to nearest).
const TF32_UNIT_ROUNDOFF: f64 = 1.0 / 2048.0;

#[test]
fn fma_attention_kernels_compiled_for_the_host_match_the_interpreter() {
    let (_, tc) = check(Precision::Fp32);
    assert_eq!(tc, 0, "fp32 runs no tensor cores");
}

#[test]
fn tensor_core_attention_kernels_compiled_for_the_host_match_the_interpreter() {
    let (_, tc) = check(Precision::Tf32);
    // The real score's cases with heads up to 64 run on tensor cores (forward, dq, dk‖dv).
    assert!(tc >= 12, "only {tc} tensor-core attention launches");
}
