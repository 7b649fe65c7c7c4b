//! `cvc plan`.

use super::{CliError, CliResult};
use std::path::PathBuf;

/// Arguments of `cvc plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
}

/// Runs `cvc plan`.
pub fn run(args: &PlanArgs) -> CliResult {
    Err(CliError::Message(format!("cvc plan is not available in this build ({})", args.file.display())))
}
