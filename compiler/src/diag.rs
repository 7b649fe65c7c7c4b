//! Diagnostics: an error with labelled spans, rendered like rustc's (file:line:col, the
//! source line, the span underlined, a help line).

use ariadne::{Config, Label, Report, ReportKind, Source};
use cvc_grammar::Span;

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
    pub fn render(&self, file: &str, src: &str, color: bool) -> String {
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
