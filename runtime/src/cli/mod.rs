//! The `cvc` command line: one module per subcommand, and the output helpers they share.
//!
//! Output goes through [`write_out`] and [`write_err`] (or the `outln!`/`out!`/`errln!`/`err!`
//! macros), never `println!`/`eprintln!`, which panic when a write fails: a full stdout
//! (`cvc plan m.cvnn > /dev/full`) becomes an error with exit code 1, and a failed write to
//! stderr (where there is nowhere left to report anything) is dropped so the exit code stays
//! the one the command chose. A closed pipe (`cvc plan m.cvnn | head -1`) ends the process
//! quietly through the default SIGPIPE action, which `main` restores.

/// Writes formatted text to stdout (flushed); evaluates to a [`CliResult`].
macro_rules! out {
    ($($t:tt)*) => { $crate::cli::write_out(&format!($($t)*)) };
}

/// Writes a formatted line to stdout (flushed); evaluates to a [`CliResult`].
macro_rules! outln {
    ($($t:tt)*) => { $crate::cli::write_out(&format!("{}\n", format_args!($($t)*))) };
}

/// Writes formatted text to stderr, ignoring write errors.
macro_rules! err {
    ($($t:tt)*) => { $crate::cli::write_err(&format!($($t)*)) };
}

/// Writes a formatted line to stderr, ignoring write errors.
macro_rules! errln {
    ($($t:tt)*) => { $crate::cli::write_err(&format!("{}\n", format_args!($($t)*))) };
}

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

/// Writes `text` to stdout and flushes it, so that a write error surfaces here (stdout is
/// line-buffered, and the flush at exit drops its errors). A full disk or any other write
/// error becomes an error naming stdout; a closed pipe ends the command quietly (exit 1, no
/// message) when SIGPIPE is ignored, and kills it quietly otherwise.
pub fn write_out(text: &str) -> CliResult {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::Reported),
        Err(e) => Err(CliError::Message(format!("cannot write to standard output: {e}"))),
    }
}

/// Writes `text` to stderr. A failed write is dropped: stderr is where a failure would be
/// reported, and panicking (as `eprintln!` does) would turn exit code 1 into 101.
pub fn write_err(text: &str) {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// Reports a compile error of `checked`'s model on stderr, against its source (a user error
/// with a span as a labelled excerpt; an internal error says it is a bug in cvc).
pub fn compile_failed(checked: &cvc_compiler::front::Checked, e: &cvc_compiler::CompileError) -> CliError {
    use std::io::IsTerminal;
    let color = std::io::stderr().is_terminal();
    err!("{}", e.render(&checked.file, &checked.src, color));
    CliError::Reported
}
