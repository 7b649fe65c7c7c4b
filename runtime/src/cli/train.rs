//! `cvc train`.

use super::{CliError, CliResult};
use std::path::PathBuf;

/// Arguments of `cvc train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
}

/// Runs `cvc train`.
pub fn run(args: &TrainArgs) -> CliResult {
    Err(CliError::Message(format!("cvc train is not available in this build ({})", args.file.display())))
}
