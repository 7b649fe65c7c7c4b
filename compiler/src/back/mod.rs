//! Code generators. Each turns a [`crate::passes::Program`] into a module a runtime only
//! executes: [`cpu`] (Cranelift functions + a launch list of native calls), [`cuda`] (CUDA C
//! for NVRTC + a launch list). [`clif`] lowers loop kernels to Cranelift IR for [`cpu`].

pub mod clif;
pub mod cpu;
pub mod cuda;
