//! Diagnostics: an error with labelled spans, rendered like rustc's (file:line:col, the
//! source line, the span underlined, a help line).

use crate::front::limits::MAX_EXCERPT_LINE;
use ariadne::{Config, Label, Report, ReportKind, Source};
use cvc_grammar::Span;
use std::borrow::Cow;

/// A labelled span in a diagnostic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiagLabel {
    /// Where.
    pub span: Span,
    /// What to say there.
    pub message: String,
}

/// Whether a diagnostic stops compilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// The source cannot be compiled.
    Error,
    /// The source compiles, but probably not as meant.
    Warning,
}

/// A user-facing error (or warning) about a `.cvnn` source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// One-line summary.
    pub message: String,
    /// The primary span (underlined first).
    pub primary: DiagLabel,
    /// Secondary spans (e.g. the earlier definition of a duplicate name).
    pub secondary: Vec<DiagLabel>,
    /// How to fix it, when known.
    pub help: Option<String>,
    /// Extra facts.
    pub notes: Vec<String>,
}

impl Diagnostic {
    /// An error at `span` with `label` under it.
    pub fn error(message: impl Into<String>, span: Span, label: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            message: message.into(),
            primary: DiagLabel { span, message: label.into() },
            secondary: Vec::new(),
            help: None,
            notes: Vec::new(),
        }
    }
    /// A warning at `span` with `label` under it.
    pub fn warning(message: impl Into<String>, span: Span, label: impl Into<String>) -> Self {
        Diagnostic { severity: Severity::Warning, ..Diagnostic::error(message, span, label) }
    }
    /// Adds a help line.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
    /// Adds a note.
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }
    /// Adds a secondary label.
    pub fn with_label(mut self, span: Span, message: impl Into<String>) -> Self {
        self.secondary.push(DiagLabel { span, message: message.into() });
        self
    }

    /// Renders the diagnostic against `src` (named `file`), with or without colour.
    ///
    /// `src` may be the text as read or as the front end saw it
    /// ([`crate::front::check::normalize_source`]): it is normalised again (idempotent), so
    /// the `file:line:col` in the message and the excerpt agree for CR-only line ends and a
    /// leading byte-order mark. A line longer than [`MAX_EXCERPT_LINE`] is shown as a window
    /// around the error, so a long line under many diagnostics cannot blow up the output.
    pub fn render(&self, file: &str, src: &str, color: bool) -> String {
        let src = display_text(src);
        let src = src.as_ref();
        let long = |s: Span| line_around(src, s.start as usize).len() > MAX_EXCERPT_LINE;
        if long(self.primary.span) || self.secondary.iter().any(|l| long(l.span)) {
            return self.render_window(file, src);
        }
        let clamp = |s: Span| {
            let len = src.len();
            let a = (s.start as usize).min(len);
            let b = (s.end as usize).clamp(a, len);
            // ariadne works in chars; convert byte offsets.
            let ca = src[..a].chars().count();
            let cb = ca + src[a..b].chars().count();
            ca..cb.max(ca)
        };
        let (line, col) = self.primary.span.line_col(src);
        let mut out = Vec::new();
        let kind = match self.severity {
            Severity::Error => ReportKind::Error,
            Severity::Warning => ReportKind::Warning,
        };
        let mut rep = Report::build(kind, (file, clamp(self.primary.span)))
            .with_config(Config::default().with_color(color))
            .with_message(format!("{} ({file}:{line}:{col})", self.message))
            .with_label(Label::new((file, clamp(self.primary.span))).with_message(&self.primary.message));
        for l in &self.secondary {
            rep = rep.with_label(Label::new((file, clamp(l.span))).with_message(&l.message));
        }
        if let Some(h) = &self.help {
            rep = rep.with_help(h);
        }
        for n in &self.notes {
            rep = rep.with_note(n);
        }
        if rep.finish().write((file, Source::from(src)), &mut out).is_err() {
            let what = match self.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            return format!("{what}: {} at {file}:{line}:{col}\n", self.message);
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Diagnostic {
    fn severity_word(&self) -> &'static str {
        match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }

    /// The compact form for spans on long lines: the message with `file:line:col`, then a
    /// window of the line around each label with a caret under its start.
    fn render_window(&self, file: &str, src: &str) -> String {
        let (line, col) = self.primary.span.line_col(src);
        let mut out = format!("{}: {} ({file}:{line}:{col})\n", self.severity_word(), self.message);
        for (i, l) in std::iter::once(&self.primary).chain(&self.secondary).enumerate() {
            let (ln, c) = l.span.line_col(src);
            let (text, caret) = window(src, l.span);
            if i > 0 {
                out.push_str(&format!("   = {file}:{ln}:{c}:\n"));
            }
            let gutter = ln.to_string();
            let pad = " ".repeat(gutter.len());
            out.push_str(&format!(
                " {pad} |\n {gutter} | {text}\n {pad} | {}^ {}\n",
                " ".repeat(caret),
                l.message
            ));
        }
        if let Some(h) = &self.help {
            out.push_str(&format!("   = help: {h}\n"));
        }
        for n in &self.notes {
            out.push_str(&format!("   = note: {n}\n"));
        }
        out
    }
}

/// The text of the line holding byte `at` (without its line break).
fn line_around(src: &str, at: usize) -> &str {
    let at = floor_boundary(src, at.min(src.len()));
    let start = src[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = src[at..].find('\n').map_or(src.len(), |i| at + i);
    src[start..end].trim_end_matches('\r')
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// At most [`MAX_EXCERPT_LINE`] bytes of the line holding `span.start`, centred on it (`…`
/// marks a cut), and the column (in chars) of the span's start within that window.
fn window(src: &str, span: Span) -> (String, usize) {
    let at = floor_boundary(src, (span.start as usize).min(src.len()));
    let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = line_around(src, at);
    let off = at - line_start;
    let half = MAX_EXCERPT_LINE / 2;
    let a = floor_boundary(line, off.saturating_sub(half).min(line.len()));
    let b = floor_boundary(line, (off + half).min(line.len()));
    let mut text = String::new();
    if a > 0 {
        text.push('…');
    }
    text.push_str(&line[a..b]);
    if b < line.len() {
        text.push('…');
    }
    let caret = usize::from(a > 0) + line[a..off.clamp(a, b)].chars().count();
    (text, caret)
}

/// `src` as the front end reads it ([`crate::front::check::normalize_source`]) with the line
/// separators that the excerpt renderer (ariadne) breaks lines at but the language does not
/// (vertical tab, form feed, NEL, U+2028, U+2029) blanked to spaces of the same byte length,
/// so that every line count agrees with [`Span::line_col`].
fn display_text(src: &str) -> Cow<'_, str> {
    let norm = crate::front::check::normalize_source(src);
    const OTHER: [char; 5] = ['\x0B', '\x0C', '\u{85}', '\u{2028}', '\u{2029}'];
    if !norm.contains(OTHER) {
        return norm;
    }
    let mut out = String::with_capacity(norm.len());
    for c in norm.chars() {
        if OTHER.contains(&c) {
            out.extend(std::iter::repeat_n(' ', c.len_utf8()));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}
