//! `cvc data`.

use super::{CliError, CliResult};
use std::path::PathBuf;

/// Arguments of `cvc data`.
#[derive(clap::Args, Debug)]
pub struct DataArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
}

/// Runs `cvc data`.
pub fn run(args: &DataArgs) -> CliResult {
    Err(CliError::Message(format!("cvc data is not available in this build ({})", args.file.display())))
}
