//! `cvc run`.

use super::{CliError, CliResult};
use std::path::PathBuf;

/// Arguments of `cvc run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
}

/// Runs `cvc run`.
pub fn run(args: &RunArgs) -> CliResult {
    Err(CliError::Message(format!("cvc run is not available in this build ({})", args.file.display())))
}
