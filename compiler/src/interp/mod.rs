//! The reference interpreter: executes the IR with plain loops in f64 / complex f64.
//!
//! It is the oracle every back end and every gradient is tested against, never a fast path.
//! Each op follows the semantics written in [`crate::ir::op`]; a value of dtype `f32` is held
//! as f64, `c64` as [`num_complex::Complex64`], `i32` as i64.

mod attention;
pub mod check;
mod contract;
mod elementwise;
mod eval;
mod init;
mod layout;
mod recurrence;
pub mod replay;
mod session;
mod tensor;

pub use elementwise::{complex_div, gelu, gelu_grad};
pub use eval::evaluate;
pub use init::{init_tensor, name_hash, SplitMix64};
pub use layout::{broadcast_map, strides};
pub use session::{Session, StepOutputs};
pub use tensor::{Tensor, TensorData};
