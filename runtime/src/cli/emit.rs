//! `cvc emit`.

use super::{CliError, CliResult};
use std::path::PathBuf;

/// Arguments of `cvc emit`.
#[derive(clap::Args, Debug)]
pub struct EmitArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
}

/// Runs `cvc emit`.
pub fn run(args: &EmitArgs) -> CliResult {
    Err(CliError::Message(format!("cvc emit is not available in this build ({})", args.file.display())))
}
