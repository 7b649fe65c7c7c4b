//! JIT-compiles the loop kernels of a program with Cranelift and keeps their code alive.

use crate::backend::RuntimeError;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, FuncId, Linkage, Module};
use cvc_compiler::back::clif::helpers::{helpers, Helper};
use cvc_compiler::back::clif::{is_loop_kernel, lower};
use cvc_compiler::passes::Program;
use std::collections::HashMap;

/// A compiled loop kernel: `f(arena_base, lo, hi)` runs outer iterations `lo..hi`.
pub type KernelFn = unsafe extern "C" fn(i64, i64, i64);

/// One JIT-compiled kernel.
#[derive(Clone, Copy)]
pub struct CompiledKernel {
    /// Entry point.
    pub f: KernelFn,
    /// Outer-loop extent.
    pub rows: usize,
    /// Elements of the iteration domain.
    pub work: usize,
}

/// The JIT module owning the machine code of every loop kernel of one program.
pub struct JitKernels {
    module: Option<JITModule>,
    /// Compiled kernels by group id.
    pub kernels: HashMap<usize, CompiledKernel>,
}

fn err(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError(format!("CPU code generation: {e}"))
}

impl JitKernels {
    /// Lowers and compiles every `Elementwise`/`Reduce` group of `program`.
    pub fn compile(program: &Program) -> Result<JitKernels, RuntimeError> {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").map_err(err)?;
        let isa =
            cranelift_native::builder().map_err(err)?.finish(settings::Flags::new(flags)).map_err(err)?;
        let config = isa.frontend_config();
        let mut jb = JITBuilder::with_isa(isa, default_libcall_names());
        for (_, name, ptr) in helpers() {
            jb.symbol(name, ptr);
        }
        let mut module = JITModule::new(jb);
        let mut helper_ids: HashMap<Helper, FuncId> = HashMap::new();
        for (h, name, _) in helpers() {
            let id = module
                .declare_function(name, Linkage::Import, &h.signature(config.default_call_conv))
                .map_err(err)?;
            helper_ids.insert(h, id);
        }
        let mut ids = Vec::new();
        let mut ctx = module.make_context();
        for &gid in &program.order {
            if !is_loop_kernel(program.groups[gid].kind) {
                continue;
            }
            let lowered = lower::lower_group(program, gid, config, &mut |func, h| {
                module.declare_func_in_func(helper_ids[&h], func)
            })
            .map_err(err)?;
            let id = module
                .declare_function(
                    &format!("cvc_group_{gid}"),
                    Linkage::Local,
                    &lower::kernel_signature(config.default_call_conv),
                )
                .map_err(err)?;
            ctx.func = lowered.func;
            module.define_function(id, &mut ctx).map_err(|e| err(format!("group {gid}: {e:?}")))?;
            module.clear_context(&mut ctx);
            ids.push((gid, id, lowered.rows, lowered.work));
        }
        module.finalize_definitions().map_err(err)?;
        let mut kernels = HashMap::new();
        for (gid, id, rows, work) in ids {
            let ptr = module.get_finalized_function(id);
            // SAFETY: the function was generated with `kernel_signature` (three i64, no result)
            // in the platform's default calling convention, which is `extern "C"`.
            let f: KernelFn = unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) };
            kernels.insert(gid, CompiledKernel { f, rows, work });
        }
        Ok(JitKernels { module: Some(module), kernels })
    }
}

impl Drop for JitKernels {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: the kernels map dies with `self`; no function pointer outlives it.
            unsafe { m.free_memory() };
        }
    }
}
