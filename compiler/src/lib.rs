//! cvc's compiler: front end (check + lower), typed graph IR, passes, reference interpreter,
//! and the code generators the runtime executes.
//!
//! The pipeline (see `passes::pipeline` for the pass order):
//! `.cvnn` → `front` (parse, resolve, infer, diagnose) → `ir` → `passes` → `back::{cuda, clif}`.

pub mod back;
pub mod diag;
pub mod front;
pub mod interp;
pub mod ir;
pub mod passes;

pub use diag::Diagnostic;
