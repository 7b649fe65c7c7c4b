//! The front end's driver: parse, choose the model, lower it, check the train section.

use super::{lower, resolve, train_check, Checked, TrainConfig};
use crate::diag::Diagnostic;
use crate::ir::Mode;
use cvc_grammar::ast::Item;
use cvc_grammar::Span;

/// Checks `.cvnn` source text named `file`.
pub fn check_source(file: &str, src: &str, mode: Mode) -> Result<Checked, Vec<Diagnostic>> {
    let ast = cvc_grammar::parse(src).map_err(|e| {
        let mut d = Diagnostic::error(e.message, e.span, e.label);
        if let Some(h) = e.help {
            d = d.with_help(h);
        }
        vec![d]
    })?;
    let model = resolve::choose_model(&ast, src)?;
    let mut diags = Vec::new();
    let mut chosen = None;
    for item in &ast.items {
        let Item::Model(m) = item else { continue };
        match lower::lower_model(m, src, mode) {
            Ok(l) if std::ptr::eq(m, model) => chosen = Some(l),
            Ok(_) => {}
            Err(d) => diags.extend(d),
        }
    }
    let train_ast = ast.trains().next();
    let lowered = match chosen {
        Some(l) if diags.is_empty() => l,
        _ => return Err(diags),
    };
    let train = match train_ast {
        Some(t) => train_check::check_train(t, &model.name.name, &lowered.inputs)?,
        None => TrainConfig::defaults(&model.name.name),
    };
    Ok(Checked {
        file: file.to_string(),
        src: src.to_string(),
        model: model.name.name.clone(),
        graph: lowered.graph,
        inputs: lowered.inputs,
        params: lowered.params,
        table: lowered.table,
        train,
        has_train_section: train_ast.is_some(),
    })
}

/// Checks raw bytes: text that is not UTF-8 is reported at the first bad byte.
pub fn check_bytes(file: &str, bytes: &[u8], mode: Mode) -> Result<Checked, Vec<Diagnostic>> {
    match std::str::from_utf8(bytes) {
        Ok(src) => check_source(file, src, mode),
        Err(e) => {
            let at = e.valid_up_to();
            Err(vec![Diagnostic::error(
                format!("`{file}` is not UTF-8 text (byte {at} is 0x{:02x})", bytes[at]),
                Span::new(at, at),
                "invalid UTF-8 here",
            )
            .with_help("save the file as UTF-8")])
        }
    }
}

/// Checks a file on disk. On failure returns the source (lossily decoded; empty when the file
/// could not be read) with the diagnostics; an unreadable file gives a diagnostic whose message says why.
pub fn check_file(path: &std::path::Path, mode: Mode) -> Result<Checked, (String, Vec<Diagnostic>)> {
    let name = path.display().to_string();
    let bytes = read_limited(path).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_string(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
            _ if path.is_dir() => "it is a directory".to_string(),
            _ => e.to_string(),
        };
        (String::new(), vec![Diagnostic::error(format!("cannot read `{name}`: {why}"), Span::new(0, 0), why)])
    })?;
    // Up to the first invalid byte the lossy text has the same offsets, so a non-UTF-8
    // diagnostic still points at the right line and column.
    // Control characters become `?` of the same byte length, so a binary file's snippet
    // cannot send escape sequences to the terminal.
    check_bytes(&name, &bytes, mode).map_err(|d| (printable(&String::from_utf8_lossy(&bytes)), d))
}

/// The largest `.cvnn` file read (16 MiB); a larger one (or an endless device such as
/// `/dev/zero`) is an error instead of a read until memory runs out.
pub const MAX_SOURCE_BYTES: u64 = 16 << 20;

/// Reads `path`, failing with `InvalidData` past [`MAX_SOURCE_BYTES`].
fn read_limited(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(MAX_SOURCE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it is larger than {} MiB; is it really a .cvnn file?", MAX_SOURCE_BYTES >> 20),
        ));
    }
    Ok(bytes)
}

/// `text` with control characters other than line breaks and tabs replaced by as many `?`
/// as their UTF-8 length (byte offsets stay valid).
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let bad = c.is_control() && !matches!(c, '\n' | '\r' | '\t');
            let n = if bad { c.len_utf8() } else { 1 };
            std::iter::repeat_n(if bad { '?' } else { c }, n)
        })
        .collect()
}

/// Renders every diagnostic against `src`, one after another.
pub fn render_all(file: &str, src: &str, diags: &[Diagnostic], color: bool) -> String {
    let mut out = String::new();
    for d in diags {
        if src.is_empty() {
            // Nothing to show a line of: a one-line error keeps the message readable.
            out.push_str(&format!("error: {}\n", d.message));
            if let Some(h) = &d.help {
                out.push_str(&format!("  help: {h}\n"));
            }
            continue;
        }
        out.push_str(&d.render(file, src, color));
    }
    out
}
