//! Code generators: Cranelift IR for the CPU JIT, CUDA C for NVRTC.

pub mod clif;
pub mod cuda;
