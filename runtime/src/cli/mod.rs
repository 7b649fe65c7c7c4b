//! The `cvc` command line: one module per subcommand.

pub mod check;
pub mod data;
pub mod emit;
pub mod eval;
pub mod fmt;
pub mod plan;
pub mod report;
pub mod run;
pub mod train;

/// Why a command failed. Every variant exits with code 1: a user error, already explained.
#[derive(Debug)]
pub enum CliError {
    /// Diagnostics were already printed to stderr.
    Reported,
    /// A message to print as `error: ...`.
    Message(String),
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Reported => f.write_str("errors reported above"),
            CliError::Message(m) => f.write_str(m),
        }
    }
}

impl From<String> for CliError {
    fn from(m: String) -> Self {
        CliError::Message(m)
    }
}

/// Result of a subcommand.
pub type CliResult = Result<(), CliError>;

/// Reports a compile error of `checked`'s model on stderr, against its source (a user error
/// with a span as a labelled excerpt; an internal error says it is a bug in cvc).
pub fn compile_failed(checked: &cvc_compiler::front::Checked, e: &cvc_compiler::CompileError) -> CliError {
    use std::io::IsTerminal;
    let color = std::io::stderr().is_terminal();
    eprint!("{}", e.render(&checked.file, &checked.src, color));
    CliError::Reported
}
