//! `cvc emit`: print the IR after any pass, the generated CUDA C, the Cranelift IR, or the CPU
//! module's launch list.

use super::plan::{load, options, print_out};
use super::{compile_failed, CliError, CliResult};
use cvc_compiler::ir::print::print_graph;
use cvc_compiler::passes::pipeline::{compile, compile_traced, PASSES};
use cvc_compiler::target::{CudaTarget, KernelConfig};
use std::path::PathBuf;

/// Arguments of `cvc emit`.
#[derive(clap::Args, Debug)]
pub struct EmitArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
    /// Print the IR (after the pass named by `--after`, default the last).
    #[arg(long, group = "what")]
    pub ir: bool,
    /// Print the CUDA C source of every kernel.
    #[arg(long, group = "what")]
    pub cuda: bool,
    /// Print the Cranelift IR of every kernel.
    #[arg(long, group = "what")]
    pub clif: bool,
    /// Print the CPU module's launch list (loop kernels and native calls with their resolved
    /// geometry and arena offsets).
    #[arg(long, group = "what")]
    pub cpu: bool,
    /// With `--ir`: the pipeline step after which to print (`lower`, `cast`, ... `memplan`:
    /// an unknown name lists them all).
    #[arg(long, requires = "ir")]
    pub after: Option<String>,
    /// Batch size (default: the train section's batch).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Compile inference only (no backward pass or optimizer update).
    #[arg(long)]
    pub eval: bool,
    /// With `--cuda`: kernel choices over the defaults, e.g. `conv=gemm,fill=528` (keys:
    /// conv=direct32|direct64|gemm, wgrad=direct|gemm|ot2|ot4|pf|ot2pf|ot4pf|async|ot2async|ot4async, fill=BLOCKS,
    /// bk=16|32, ck=CHANNELS, grid=BLOCKS, index=auto|64, yz=BLOCKS, tc=plain|prefetch|async,
    /// tctile=auto|64|128|64w4, tc16=auto|native|tf32|wgmma, frag=ldmatrix|lds, cmul=4m|3m, ftile=64|128,
    /// attn=tc|fma, tcblocks=BLOCKS, tcstages=2..8, tctaps=index|table|mask, launch=graph|stream,
    /// mma=sync|wgmma, wgwait=0|1, wgprod=0..3, colout=8|16|32, fp32=fma|3xtf32, wga=regs|smem, tcconv=grad|gemm|halo, ewvec=1|2|4, tcfetch=rows|banks, wexpand=pre|tile, tcraw=gather|row, convstats=fuse|apart). The device is always an H200 (132 SMs, sm_90; `mma=wgmma` code is for
    /// sm_90a).
    #[arg(long, requires = "cuda", value_name = "SPEC")]
    pub kernels: Option<String>,
}

/// Runs `cvc emit`.
pub fn run(args: &EmitArgs) -> CliResult {
    if !(args.ir || args.cuda || args.clif || args.cpu) {
        return Err(CliError::Message("say what to emit: --ir, --cuda, --clif or --cpu".into()));
    }
    if args.batch == Some(0) {
        return Err(CliError::Message("--batch must be at least 1".into()));
    }
    let after = args.after.as_deref().unwrap_or("memplan");
    if !PASSES.contains(&after) {
        return Err(CliError::Message(format!(
            "unknown pass `{after}`; the passes are: {}",
            PASSES.join(", ")
        )));
    }
    let checked = load(&args.file, args.eval)?;
    // CUDA source is generated with the train section's precision, and so its storage.
    let half = if args.cuda { checked.train.precision.storage() } else { Default::default() };
    let opts = options(&checked, args.batch, None, true, half);
    if args.ir {
        let mut text = None;
        let src = checked.src.clone();
        let program = compile_traced(checked.graph.clone(), &opts, &mut |pass, g| {
            if pass == after {
                text = Some(print_graph(g, Some(&src)));
            }
        })
        .map_err(|e| compile_failed(&checked, &e))?;
        let _ = program;
        return match text {
            Some(t) => print_out(&t),
            None => {
                let why = match after {
                    "remat.fusion" | "remat.schedule" | "remat.siblings" => {
                        "rematerialisation placed no checkpoint (it runs for a training step under a \
                         memory budget that the plan exceeds)"
                            .to_string()
                    }
                    _ => {
                        let mode = if args.eval {
                            "--eval compiles inference only"
                        } else {
                            "the model declares no `loss`, so it compiles for inference only"
                        };
                        format!("{mode}, without autodiff or optimizer passes")
                    }
                };
                Err(CliError::Message(format!("pass `{after}` does not run for this model: {why}")))
            }
        };
    }
    let program = compile(checked.graph.clone(), &opts).map_err(|e| compile_failed(&checked, &e))?;
    let text = if args.cuda {
        let kernels = KernelConfig::parse(args.kernels.as_deref().unwrap_or_default())
            .map_err(|e| CliError::Message(format!("--kernels: {e}")))?;
        let target = CudaTarget::h200().with_kernels(kernels).with_precision(checked.train.precision);
        cvc_compiler::back::cuda::emit_source(&program, &target)
            .map_err(|e| CliError::Message(e.to_string()))?
    } else if args.cpu {
        let config = cvc_compiler::back::clif::host_config().map_err(CliError::Message)?;
        cvc_compiler::back::cpu::generate(&program, config)
            .map_err(|e| CliError::Message(e.to_string()))?
            .to_string()
    } else {
        cvc_compiler::back::clif::emit_text(&program).map_err(CliError::Message)?
    };
    print_out(&text)
}
