//! The `cvc` command: check, plan, emit, train, run, eval, data, fmt, report.

use clap::{Parser, Subcommand};
use cvc_runtime::cli::{self, CliError};
use std::process::ExitCode;

/// cvc — a compiler for complex-valued neural networks.
#[derive(Parser, Debug)]
#[command(name = "cvc", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Parse and check a .cvnn file; print the layer table.
    Check(cli::check::CheckArgs),
    /// Compile and print the static plan: kernels, casts, memory.
    Plan(cli::plan::PlanArgs),
    /// Print the IR after a pass, the CUDA source or the Cranelift IR.
    Emit(cli::emit::EmitArgs),
    /// Train a model.
    Train(cli::train::TrainArgs),
    /// One batch forward + backward from given weights and data.
    Run(cli::run::RunArgs),
    /// Accuracy and confusion matrix of given weights on given data.
    Eval(cli::eval::EvalArgs),
    /// Generate a built-in dataset.
    Data(cli::data::DataArgs),
    /// Format .cvnn files canonically (in place; --check for CI).
    Fmt(cli::fmt::FmtArgs),
    /// Write an HTML page of a run: curves, memory timeline, planned vs measured peak.
    Report(cli::report::ReportArgs),
}

/// Restores the default SIGPIPE action, so `cvc ... | head` ends quietly like other Unix
/// tools instead of panicking on a write to a closed pipe (Rust ignores SIGPIPE by default).
fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called once at start-up, before any thread exists; SIG_DFL is a valid action.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    default_sigpipe();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let printed = e.print();
            // clap uses 2 for usage errors; cvc's contract is 1 for every user error. Help and
            // version text that cannot be written (a full stdout) is an error too.
            return match printed {
                _ if e.use_stderr() => ExitCode::from(1),
                Ok(()) => ExitCode::SUCCESS,
                Err(w) => {
                    cli::write_err(&format!("error: cannot write to standard output: {w}\n"));
                    ExitCode::from(1)
                }
            };
        }
    };
    let result = match &cli.command {
        Command::Check(a) => cli::check::run(a),
        Command::Plan(a) => cli::plan::run(a),
        Command::Emit(a) => cli::emit::run(a),
        Command::Train(a) => cli::train::run(a),
        Command::Run(a) => cli::run::run(a),
        Command::Eval(a) => cli::eval::run(a),
        Command::Data(a) => cli::data::run(a),
        Command::Fmt(a) => cli::fmt::run(a),
        Command::Report(a) => cli::report::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Reported) => ExitCode::from(1),
        Err(CliError::Message(m)) => {
            // Not `eprintln!`: it panics (exit 101) when stderr is full.
            cli::write_err(&format!("error: {m}\n"));
            ExitCode::from(1)
        }
    }
}
