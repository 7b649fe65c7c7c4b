//! cvc's runtime: executes compiled plans on the CPU (Cranelift JIT) or an NVIDIA GPU (NVRTC),
//! trains models, loads data, writes checkpoints, and holds the `cvc` command line.

pub mod backend;
pub mod buffers;
pub mod checkpoint;
pub mod cli;
pub mod cpu;
pub mod cuda;
pub mod data;
pub mod files;
pub mod interp_backend;
pub mod metrics;
pub mod numerics;
pub mod par;
pub mod run_dir;
pub mod run_plan;
pub mod session;
pub mod timeline;
pub mod train;
