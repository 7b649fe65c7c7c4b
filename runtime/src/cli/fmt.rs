//! `cvc fmt FILE... [--check]`: formats `.cvnn` files canonically ([`cvc_grammar::fmt`]), in
//! place and atomically; `--check` changes nothing and exits 1 listing the files that would
//! change (for CI). A folder stands for the `.cvnn` files under it.

use super::{CliError, CliResult};
use cvc_compiler::diag::Diagnostic;
use cvc_compiler::front::check::MAX_SOURCE_BYTES;
use cvc_compiler::front::render_all;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Arguments of `cvc fmt`.
#[derive(clap::Args, Debug)]
pub struct FmtArgs {
    /// `.cvnn` files, or folders to search for them.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Change nothing; list the files that are not formatted and exit 1 if there are any.
    #[arg(long)]
    pub check: bool,
}

/// Runs `cvc fmt`.
pub fn run(args: &FmtArgs) -> CliResult {
    let mut files = Vec::new();
    for f in &args.files {
        collect(f, &mut files)?;
    }
    let (mut unformatted, mut failed) = (Vec::new(), false);
    for file in &files {
        // A file that cannot be read or parsed is reported and the others are still done.
        match format_file(file) {
            Formatted::Same => {}
            Formatted::Changed(_) if args.check => unformatted.push(file.display().to_string()),
            Formatted::Changed(text) => {
                // The rename gives a new file: keep the old one's permissions.
                let perms = std::fs::metadata(file).map(|m| m.permissions());
                if let Err(e) = crate::checkpoint::write_atomic(file, text.as_bytes()) {
                    errln!("error: cannot write `{}`: {e}", file.display());
                    failed = true;
                } else if let Ok(p) = perms {
                    let _ = std::fs::set_permissions(file, p);
                }
            }
            Formatted::Invalid => failed = true,
        }
    }
    if !unformatted.is_empty() {
        let mut out = String::new();
        for f in &unformatted {
            out.push_str(&format!("would reformat {f}\n"));
        }
        super::plan::print_out(&out)?;
    }
    if failed {
        return Err(CliError::Reported);
    }
    if !unformatted.is_empty() {
        let n = unformatted.len();
        return Err(CliError::Message(format!(
            "{n} file{} not formatted: run `cvc fmt` on {}",
            if n == 1 { " is" } else { "s are" },
            if n == 1 { "it" } else { "them" }
        )));
    }
    Ok(())
}

/// `path` itself when it is a file, else the `.cvnn` files under it, sorted.
fn collect(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), CliError> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    if !meta.is_dir() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| format!("cannot read folder `{}`: {e}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "cvnn") {
            out.push(p);
        }
    }
    Ok(())
}

enum Formatted {
    Same,
    Changed(String),
    /// The file does not parse (reported on stderr).
    Invalid,
}

/// Formats one file; a file that cannot be read or is not a `.cvnn` text is reported on
/// stderr as [`Formatted::Invalid`].
fn format_file(path: &Path) -> Formatted {
    match read_and_format(path) {
        Ok(f) => f,
        Err(m) => {
            errln!("error: {m}");
            Formatted::Invalid
        }
    }
}

fn read_and_format(path: &Path) -> Result<Formatted, String> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read `{name}`: {e}"))?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return Err(format!(
            "`{name}` is larger than {} MiB; is it really a .cvnn file?",
            MAX_SOURCE_BYTES >> 20
        ));
    }
    let src = match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            return Err(format!(
                "`{name}` is not UTF-8 text (byte {at} is 0x{:02x}): save the file as UTF-8",
                e.as_bytes()[at]
            ));
        }
    };
    match cvc_grammar::format_source(&src) {
        Ok(text) if text == src => Ok(Formatted::Same),
        Ok(text) => Ok(Formatted::Changed(text)),
        Err(e) => {
            let mut d = Diagnostic::error(e.message, e.span, e.label);
            if let Some(h) = e.help {
                d = d.with_help(h);
            }
            eprint!("{}", render_all(&name, &src, &[d], std::io::stderr().is_terminal()));
            errln!("error: `{name}` was not formatted: it does not parse");
            Ok(Formatted::Invalid)
        }
    }
}
