//! cvc's compiler: front end (check + lower), typed graph IR, passes, reference interpreter,
//! and the code generators the runtime executes.
//!
//! The pipeline (see `passes::pipeline` for the pass order):
//! `.cvnn` → `front` (parse, resolve, infer, diagnose) → `ir` → `passes` → `back::{cuda, clif}`.

// Errors are `Diagnostic`s returned by value on the cold path; boxing them would only add
// noise at every call site of the front end.
#![allow(clippy::result_large_err)]

pub mod back;
pub mod config;
pub mod diag;
pub mod error;
pub mod front;
pub mod init;
pub mod interp;
pub mod ir;
pub mod passes;
pub mod target;
pub mod units;

pub use diag::Diagnostic;
pub use error::{CompileError, CompileResult};
