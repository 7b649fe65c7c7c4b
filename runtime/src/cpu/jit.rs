//! JIT-compiles the loop kernels of a [`CpuModule`] with Cranelift and keeps their code alive.

use crate::backend::RuntimeError;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};
use cvc_compiler::back::clif::helpers::helpers;
use cvc_compiler::back::clif::lower;
use cvc_compiler::back::cpu::CpuModule;

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
    /// Compiled kernels, in the order of `CpuModule::loops`.
    pub kernels: Vec<CompiledKernel>,
    code_bytes: usize,
}

fn err(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError(format!("CPU code generation: {e}"))
}

impl JitKernels {
    /// Compiles every loop kernel of `module` (functions the compiler lowered), linking the
    /// helpers by the index the compiler named them with.
    pub fn compile(module: &CpuModule) -> Result<JitKernels, RuntimeError> {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").map_err(err)?;
        let isa =
            cranelift_native::builder().map_err(err)?.finish(settings::Flags::new(flags)).map_err(err)?;
        let config = isa.frontend_config();
        let mut jb = JITBuilder::with_isa(isa, default_libcall_names());
        for (_, name, ptr) in helpers() {
            jb.symbol(name, ptr);
        }
        let mut jit = JITModule::new(jb);
        // Helper `i` must get function id `i`: the kernels call it as user name `u0:i`.
        for (i, (h, name, _)) in helpers().into_iter().enumerate() {
            let id = jit
                .declare_function(name, Linkage::Import, &h.signature(config.default_call_conv))
                .map_err(err)?;
            if id.as_u32() as usize != i {
                return Err(err(format!("helper {name} was declared as function {id}, expected {i}")));
            }
        }
        let mut ids = Vec::new();
        let mut code_bytes = 0;
        let mut ctx = jit.make_context();
        for k in &module.loops {
            let id = jit
                .declare_function(
                    &format!("cvc_group_{}", k.group),
                    Linkage::Local,
                    &lower::kernel_signature(config.default_call_conv),
                )
                .map_err(err)?;
            ctx.func = k.func.clone();
            jit.define_function(id, &mut ctx).map_err(|e| err(format!("group {}: {e:?}", k.group)))?;
            code_bytes += ctx.compiled_code().map_or(0, |c| c.code_buffer().len());
            jit.clear_context(&mut ctx);
            ids.push((id, k.rows, k.work));
        }
        jit.finalize_definitions().map_err(err)?;
        let kernels = ids
            .into_iter()
            .map(|(id, rows, work)| {
                let ptr = jit.get_finalized_function(id);
                // SAFETY: the function was generated with `kernel_signature` (three i64, no
                // result) in the platform's default calling convention, which is `extern "C"`.
                let f: KernelFn = unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) };
                CompiledKernel { f, rows, work }
            })
            .collect();
        Ok(JitKernels { module: Some(jit), kernels, code_bytes })
    }

    /// Bytes of machine code of the kernels (for the memory report).
    pub fn code_bytes(&self) -> usize {
        self.code_bytes
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
