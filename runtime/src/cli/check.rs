//! `cvc check`.

use super::{CliError, CliResult};
use std::path::PathBuf;

/// Arguments of `cvc check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
}

/// Runs `cvc check`.
pub fn run(args: &CheckArgs) -> CliResult {
    Err(CliError::Message(format!("cvc check is not available in this build ({})", args.file.display())))
}
