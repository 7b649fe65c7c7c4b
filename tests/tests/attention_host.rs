//! The CUDA back end's fused attention kernels (the FMA templates of `back/cuda/attention.rs`),
//! compiled for the host and run on every variant of `cvc_tests::attention::cases`: separate,
//! packed `q ‖ k ‖ v` and packed `k ‖ v` operands, both scores, causal, key mask, dropout, odd
//! head widths, tails of every tile; fused (the forward with its log-sum-exp) and unfused.
//! No GPU: the module's attention template library and kernels are compiled with the host's
//! C++ compiler (`$CXX`, else `c++` or `g++`) under a small emulation of a CUDA block (256
//! threads that meet at a barrier for `__syncthreads`, shared memory as statics, warp shuffles
//! through a shared exchange). Each launch runs on an arena holding the interpreter's values of
//! its operands (rounded to f32) at the plan's offsets, and what it writes is compared with the
//! interpreter replaying its group on those operands. So CI checks the kernels' indexing (heads
//! read in place from strided rows, token-major outputs) that only a GPU run checked before;
//! the tensor-core kernels (`attention_tc.rs`, PTX `mma.sync`) still need one.

use cvc_compiler::back::cuda::{self, CudaStep, LIBRARIES};
use cvc_compiler::interp::replay::replay_group;
use cvc_compiler::interp::{evaluate, SplitMix64, Tensor, TensorData};
use cvc_compiler::ir::Value;
use cvc_compiler::passes::fusion::GroupKind;
use cvc_compiler::passes::Program;
use cvc_compiler::target::CudaTarget;
use cvc_tests::attention::{cases, program_fused};
use cvc_tests::differential::random_leaves;
use cvc_tests::seed::seed_for;
use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// What a CUDA block needs on the host: the vector types, the thread and block indices, a
/// barrier of the block's 256 threads and shuffles through a shared exchange (every shuffle of
/// these kernels is reached by all threads of the block, as `__syncthreads` is).
const PRELUDE: &str = r#"#include <barrier>
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
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct Dim3 { unsigned x, y, z; };
thread_local Dim3 threadIdx, blockIdx;
static Dim3 blockDim = {256, 1, 1}, gridDim = {1, 1, 1};
static std::barrier<>* block_barrier;
static inline void __syncthreads() { block_barrier->arrive_and_wait(); }
static float shuffle_exchange[256];
static inline float __shfl_xor_sync(unsigned, float v, int lanes) {
  const unsigned t = threadIdx.x;
  shuffle_exchange[t] = v;
  __syncthreads();
  const float r = shuffle_exchange[t ^ (unsigned)lanes];
  __syncthreads();
  return r;
}
#define INF INFINITY
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
"#;

/// `main(arena, kernel, blocks)`: runs `blocks` blocks of the named kernel, one after another,
/// on the arena file and writes it back.
const MAIN: &str = r#"
int main(int argc, char** argv) {
  if (argc != 4) return 2;
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
  const unsigned blocks = (unsigned)atoi(argv[3]);
  gridDim = Dim3{blocks, 1, 1};
  std::barrier<> bar(256);
  block_barrier = &bar;
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 256; ++t)
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
    group: usize,
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
        .arg(launch.blocks.to_string())
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

#[test]
fn attention_kernels_compiled_for_the_host_match_the_interpreter() {
    let dir = std::env::temp_dir().join(format!("cvc-attention-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let mut programs = Vec::new();
    let mut launches = Vec::new();
    let mut code = String::from(PRELUDE);
    let mut table = String::from(
        "struct Entry { const char* name; void (*f)(char*); };\nstatic const Entry KERNELS[] = {\n",
    );
    let mut defined_hash = false;
    for c in cases() {
        for fuse in [true, false] {
            let case = format!("{}{}", c.name(), if fuse { "" } else { " unfused" });
            let program = program_fused(&c, 2, fuse);
            let module =
                cuda::generate(&program, &CudaTarget::h200()).unwrap_or_else(|e| panic!("{case}: {e}"));
            if !defined_hash {
                code.push_str(function(
                    &module.source,
                    "static __device__ __forceinline__ u32 dropout_hash(",
                ));
                code.push_str(LIBRARIES[0]);
                defined_hash = true;
            }
            let p = programs.len();
            for step in &module.steps {
                let CudaStep::Launch(l) = step else { continue };
                if program.groups[l.group].kind != GroupKind::Attention {
                    continue;
                }
                assert_eq!(l.block, [256, 1, 1], "{case}: the FMA attention kernels run 256 threads");
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
                    group: l.group,
                });
                assert_eq!(l.grid[1..], [1, 1], "{case}: a one-dimensional grid");
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
            let want = flat(replay.values.get(&o).expect("a replayed output"));
            assert_eq!(got.len(), want.len(), "{} {}: {o}'s length", launch.case, launch.name);
            // f32 arithmetic over at most a few hundred terms of magnitude ≲ the output's own.
            let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            let worst = got
                .iter()
                .zip(&want)
                .enumerate()
                .map(|(i, (&a, &b))| (i, (a as f64 - b).abs()))
                .fold((0, 0.0f64), |w, x| if x.1 > w.1 || x.1.is_nan() { x } else { w });
            checked += 1;
            if worst.1.is_nan() || worst.1 > 2e-4 * scale {
                failures.push(format!(
                    "{} {} ({}): element {} is {} where the interpreter gives {} (scale {scale:.3})",
                    launch.case,
                    launch.name,
                    g.node(o).op.mnemonic(),
                    worst.0,
                    got[worst.0],
                    want[worst.0]
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{checked} attention outputs of {} launches checked on the host", launches.len());
    assert!(checked >= 3 * cases().len() * 2, "too few attention outputs checked: {checked}");
    assert!(
        failures.is_empty(),
        "host-compiled attention kernels vs the interpreter:\n{}",
        failures.join("\n")
    );
}
