//! `cvc eval`.

use super::{CliError, CliResult};
use std::path::PathBuf;

/// Arguments of `cvc eval`.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
}

/// Runs `cvc eval`.
pub fn run(args: &EvalArgs) -> CliResult {
    Err(CliError::Message(format!("cvc eval is not available in this build ({})", args.file.display())))
}
