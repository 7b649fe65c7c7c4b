//! cvc's runtime: executes compiled plans on the CPU (Cranelift JIT) or an NVIDIA GPU (NVRTC),
//! trains models, loads data, writes checkpoints, and holds the `cvc` command line.

pub mod backend;
pub mod cli;
