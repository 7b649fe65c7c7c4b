//! Shared code of the cross-crate tests: how a test seed is chosen ([`seed`]) and the
//! differential check of a back end against the reference interpreter ([`differential`]),
//! which the CPU tests run in CI and the GPU tests run on a device through the same code, and
//! the harness of the stored PyTorch reference cases ([`torch_cases`]), and generated CUDA
//! kernels compiled for the host ([`hostcuda`]).

pub mod attention;
pub mod differential;
pub mod hostcuda;
pub mod matmul_forms;
pub mod seed;
pub mod torch_cases;
