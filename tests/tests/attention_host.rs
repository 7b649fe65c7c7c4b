//! The CUDA back end's fused attention kernels (the FMA templates of `back/cuda/attention.rs`
//! and, at `tf32`, the tensor-core ones of `attention_tc.rs`), compiled for the host and run on
//! every variant of `cvc_tests::attention::cases`: separate,
//! packed `q ‖ k ‖ v` and packed `k ‖ v` operands, both scores, causal, key mask, dropout, odd
//! head widths, tails of every tile; fused (the forward with its log-sum-exp) and unfused.
//! No GPU: the module's attention template libraries and kernels are compiled for the host
//! and run under an emulation of a CUDA block (`cvc_tests::hostcuda`). Each launch runs on an arena holding the interpreter's values of its operands
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
use cvc_compiler::ir::{Storage, Value};
use cvc_compiler::passes::fusion::GroupKind;
use cvc_compiler::target::CudaTarget;
use cvc_tests::attention::{cases, program_stored, tensor_core_bound};
use cvc_tests::differential::random_leaves;
use cvc_tests::hostcuda::{flat, rounded_as, run_group, HostLaunch, HostSource};
use cvc_tests::seed::seed_for;
use std::collections::HashMap;

/// One attention launch of a case's module.
struct Launch {
    case: String,
    program: usize,
    host: HostLaunch,
    group: usize,
    /// It calls a tensor-core template (`attn_tc_*`).
    tensor_cores: bool,
}

/// Every attention launch of every case at `precision`, built into one host program and run
/// against the interpreter; returns the launches and how many of them used tensor cores.
fn check(precision: Precision) -> (usize, usize) {
    let target = CudaTarget::h200().with_precision(precision);
    let mut programs = Vec::new();
    let mut launches = Vec::new();
    let mut source = HostSource::default();
    let mut libraries = false;
    for c in cases() {
        for fuse in [true, false] {
            let case = format!("{}{} {precision:?}", c.name(), if fuse { "" } else { " unfused" });
            let program = program_stored(&c, 2, fuse, precision.storage());
            let module = cuda::generate(&program, &target).unwrap_or_else(|e| panic!("{case}: {e}"));
            if !libraries {
                source.library(&module, LIBRARIES[0]);
                source.library(&module, LIBRARIES[2]);
                libraries = true;
            }
            let p = programs.len();
            for step in &module.steps {
                let CudaStep::Launch(l) = step else { continue };
                if program.groups[l.group].kind != GroupKind::Attention {
                    continue;
                }
                assert_eq!(l.block[1..], [1, 1], "{case}: a one-dimensional block");
                let at = module.kernels.iter().position(|k| k == &l.name).expect("a kernel of the module");
                // Kernel names repeat across cases: each case's get a prefix.
                let name = format!("c{p}_{}", l.name);
                source.kernel(&module, &l.name, &name);
                launches.push(Launch {
                    case: case.clone(),
                    program: p,
                    host: HostLaunch { name, grid: l.grid, threads: l.block[0], shared: l.shared_bytes },
                    group: l.group,
                    tensor_cores: module.kernel_code[at].0.contains("attn_tc_"),
                });
            }
            programs.push(program);
        }
    }
    let host = source.build(&format!("attention-{precision:?}"));

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
                .enumerate()
                .map(|(i, t)| t.map(|t| rounded_as(&t, g.storage(Value::from_index(i)))))
                .collect()
        });
        let group = &program.groups[launch.group];
        let operands: HashMap<Value, Tensor> = group
            .inputs
            .iter()
            .map(|&i| (i, values[i.index()].clone().expect("an evaluated operand")))
            .collect();
        let replay = replay_group(g, batch, &group.nodes, &operands)
            .unwrap_or_else(|e| panic!("{}: replaying {}: {e}", launch.case, launch.host.name));
        for (o, got) in run_group(&host, program, launch.group, std::slice::from_ref(&launch.host), 0, values)
            .unwrap_or_else(|e| panic!("{} {}: {e}", launch.case, launch.host.name))
        {
            let want_t = replay.values.get(&o).expect("a replayed output");
            let want = flat(want_t);
            assert_eq!(got.len(), want.len(), "{} {}: {o}'s length", launch.case, launch.host.name);
            // Per element: f32 arithmetic over at most a few hundred terms of magnitude ≲ the
            // output's own, plus the TF32 operand rounding's bound where tensor cores ran (one
            // bound per complex element, its real and imaginary parts together).
            let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            // A 16-bit output's own rounding (bf16 2⁻⁸, IEEE half 2⁻¹¹).
            let store = match g.storage(o) {
                Storage::Full => 0.0,
                Storage::Bf16 => 1.0 / 256.0,
                Storage::F16 => TF32_UNIT_ROUNDOFF,
            };
            let per = if matches!(want_t.data, TensorData::Complex(_)) { 2 } else { 1 };
            let extra = if launch.tensor_cores {
                let node = g.node(o);
                let ins: Vec<&Tensor> = node
                    .inputs
                    .iter()
                    .map(|i| operands.get(i).or_else(|| replay.values.get(i)).expect("an attention operand"))
                    .collect();
                tensor_core_bound(&node.op, &ins, TF32_UNIT_ROUNDOFF)
                    .unwrap_or_else(|e| panic!("{} {}: {e}", launch.case, launch.host.name))
            } else {
                vec![0.0; want.len() / per]
            };
            let worst = got
                .iter()
                .zip(&want)
                .enumerate()
                .map(|(i, (&a, &b))| (i, (a as f64 - b).abs() - extra[i / per] - store * b.abs()))
                .fold((0, f64::NEG_INFINITY), |w, x| if x.1 > w.1 || x.1.is_nan() { x } else { w });
            checked += 1;
            if worst.1.is_nan() || worst.1 > 2e-4 * scale {
                failures.push(format!(
                    "{} {} ({}): element {} is {} where the interpreter gives {} (bound {:.3e} + {:.3e})",
                    launch.case,
                    launch.host.name,
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

#[test]
fn bf16_attention_kernels_compiled_for_the_host_match_the_interpreter() {
    // Operands and outputs stored in bf16, the real score's products on TF32 tensor cores.
    let (_, tc) = check(Precision::Bf16);
    assert!(tc >= 12, "only {tc} tensor-core attention launches");
}
