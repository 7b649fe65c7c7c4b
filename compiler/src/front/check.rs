//! The front end's driver: parse, choose the model, lower it, check the train section, and
//! warn about what compiles but is probably not meant (bindings that reach no loss).

use super::{limits, lower, resolve, train_check, Checked, TrainConfig};
use crate::diag::Diagnostic;
use crate::ir::{Graph, Mode, Op, Value};
use cvc_grammar::ast::Item;
use cvc_grammar::Span;

/// The text the front end parses: `src` without a leading UTF-8 byte-order mark, and with
/// every lone carriage return (old Mac line ends) turned into a line feed. The second keeps
/// byte offsets, so parser spans, [`Span::line_col`] and the rendered excerpt count the same
/// lines (a `#` comment ends at the CR, as an editor shows it). Idempotent; borrowed when
/// nothing changes. Spans of diagnostics refer to this text.
pub fn normalize_source(src: &str) -> std::borrow::Cow<'_, str> {
    let body = src.strip_prefix('\u{feff}').unwrap_or(src);
    let b = body.as_bytes();
    let lone_cr = |i: usize| b[i] == b'\r' && b.get(i + 1) != Some(&b'\n');
    if !(0..b.len()).any(lone_cr) {
        return std::borrow::Cow::Borrowed(body);
    }
    let fixed: Vec<u8> = (0..b.len()).map(|i| if lone_cr(i) { b'\n' } else { b[i] }).collect();
    // Only ASCII CR bytes were replaced by ASCII LF bytes: still UTF-8.
    std::borrow::Cow::Owned(String::from_utf8(fixed).expect("CR -> LF keeps UTF-8"))
}

/// Checks `.cvnn` source text named `file`. The text is first normalised
/// ([`normalize_source`]: BOM skipped, CR-only line ends accepted); spans and
/// [`Checked::src`] refer to the normalised text.
pub fn check_source(file: &str, src: &str, mode: Mode) -> Result<Checked, Vec<Diagnostic>> {
    let src = normalize_source(src);
    let src = src.as_ref();
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
    let warnings = unused_by_loss(&lowered.graph, &lowered.bindings);
    Ok(Checked {
        warnings,
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

/// Warnings for the bindings of a training graph that the loss does not depend on: their
/// parameters get zero gradients, which is legal (an auxiliary head read at inference) but
/// usually a forgotten loss term. Only the first binding of each unused chain is reported
/// (`aux = trunk |> linear(2)`, not every binding computed from `aux`).
pub fn unused_by_loss(g: &Graph, bindings: &[(String, Value, Span)]) -> Vec<Diagnostic> {
    let Some(loss) = g.loss else { return Vec::new() };
    let mut reaches = vec![false; g.nodes.len()];
    reaches[loss.index()] = true;
    for h in g.nodes.handles().rev() {
        if reaches[h.index()] {
            for &i in &g.node(h).inputs {
                reaches[i.index()] = true;
            }
        }
    }
    // The values computed from an earlier unused binding (reported through that one).
    let mut reported = vec![false; g.nodes.len()];
    let mut out = Vec::new();
    for (name, v, span) in bindings {
        if reaches[v.index()] || reported[v.index()] || matches!(g.node(*v).op, Op::Input { .. }) {
            continue;
        }
        let mut covered = vec![false; g.nodes.len()];
        covered[v.index()] = true;
        for (h, n) in g.nodes.iter().skip(v.index() + 1) {
            if n.inputs.iter().any(|i| covered[i.index()]) {
                covered[h.index()] = true;
            }
        }
        for (r, c) in reported.iter_mut().zip(&covered) {
            *r |= c;
        }
        let params = unused_params(g, &reaches, &covered);
        let output = g.outputs.iter().find(|o| covered[o.value.index()]).map(|o| o.name.as_str());
        let label = match output {
            Some(o) if o == name => "an output, but no loss term reads it".to_string(),
            Some(o) => format!("output `{o}` is computed from it, but no loss term reads either"),
            None => "no loss term reads it".to_string(),
        };
        let mut d = Diagnostic::warning(format!("`{name}` reaches no loss"), *span, label);
        if params > 0 {
            d = d.with_note(format!(
                "training gives its {params} parameter tensor{} zero gradients",
                if params == 1 { "" } else { "s" }
            ));
        }
        out.push(
            d.with_help(format!("add a term for `{name}` to the loss, or remove it if it is not needed")),
        );
    }
    out
}

/// The parameters that the values marked in `covered` read (directly or through ops) and
/// the loss does not.
fn unused_params(g: &Graph, reaches: &[bool], covered: &[bool]) -> usize {
    let mut seen = vec![false; g.nodes.len()];
    let mut stack: Vec<Value> = g.nodes.handles().filter(|h| covered[h.index()]).collect();
    let mut count = 0;
    while let Some(x) = stack.pop() {
        if reaches[x.index()] || std::mem::replace(&mut seen[x.index()], true) {
            continue;
        }
        if matches!(g.node(x).op, Op::Param { .. }) {
            count += 1;
        }
        stack.extend(g.node(x).inputs.iter().copied());
    }
    count
}

/// Checks raw bytes: text that is not UTF-8 is reported at the first bad byte.
pub fn check_bytes(file: &str, bytes: &[u8], mode: Mode) -> Result<Checked, Vec<Diagnostic>> {
    // Offsets of a non-UTF-8 error count from after the byte-order mark, as all spans do.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
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
    // A FIFO would block the open until a writer appears, and a device would be read until
    // the limit: refuse anything but a regular file before opening it.
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        let kind = special_kind(&meta);
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("it is {kind}")));
    }
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

/// What a path that is not a regular file is, in words.
fn special_kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "not a regular file but a FIFO (named pipe)";
        }
        if t.is_char_device() || t.is_block_device() {
            return "not a regular file but a device";
        }
        if t.is_socket() {
            return "not a regular file but a socket";
        }
    }
    "not a regular file"
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

/// Renders the diagnostics against `src`, one after another: at most
/// [`limits::MAX_DIAGNOSTICS`] of them, then a line saying how many more there are (so a
/// file with thousands of errors gives a bounded report).
pub fn render_all(file: &str, src: &str, diags: &[Diagnostic], color: bool) -> String {
    let mut out = String::new();
    for d in diags.iter().take(limits::MAX_DIAGNOSTICS) {
        if src.is_empty() {
            // Nothing to show a line of: a one-line error keeps the message readable.
            let what = match d.severity {
                crate::diag::Severity::Error => "error",
                crate::diag::Severity::Warning => "warning",
            };
            out.push_str(&format!("{what}: {}\n", d.message));
            if let Some(h) = &d.help {
                out.push_str(&format!("  help: {h}\n"));
            }
            continue;
        }
        out.push_str(&d.render(file, src, color));
    }
    if diags.len() > limits::MAX_DIAGNOSTICS {
        let rest = &diags[limits::MAX_DIAGNOSTICS..];
        let errors = rest.iter().filter(|d| d.severity == crate::diag::Severity::Error).count();
        let warnings = rest.len() - errors;
        let mut parts = Vec::new();
        if errors > 0 {
            parts.push(format!("{errors} more error{}", if errors == 1 { "" } else { "s" }));
        }
        if warnings > 0 {
            parts.push(format!("{warnings} more warning{}", if warnings == 1 { "" } else { "s" }));
        }
        out.push_str(&format!(
            "note: {} not shown (at most {} are); fix the ones above and check again\n",
            parts.join(" and "),
            limits::MAX_DIAGNOSTICS
        ));
    }
    out
}
