//! The error type of the compiler's public API: a user error (the model, its options or the
//! target ask for something that cannot be compiled; the message says what to change) or an
//! internal error (the compiler broke one of its own invariants: a bug).
//!
//! Internal helpers may keep returning `Result<_, String>`: a plain message converts into
//! [`CompileError::Internal`] with `?`, so a user error is always constructed on purpose
//! ([`CompileError::user`], [`CompileError::user_at`]), never by accident.

use crate::diag::Diagnostic;
use cvc_grammar::Span;
use std::fmt;

/// Why compilation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileError {
    /// The input cannot be compiled as asked. `span` points into the `.cvnn` source when the
    /// cause has a place there (a layer that does not fit the target, a value too large).
    User {
        /// What is wrong and what to do about it.
        message: String,
        /// Where in the source, when known.
        span: Option<Span>,
    },
    /// The front end rejected the source: one or more diagnostics with spans.
    Source(Vec<Diagnostic>),
    /// A compiler bug: an invariant of the IR or a pass did not hold.
    Internal {
        /// What broke.
        message: String,
    },
}

impl CompileError {
    /// A user error without a source location.
    pub fn user(message: impl Into<String>) -> Self {
        CompileError::User { message: message.into(), span: None }
    }
    /// A user error pointing at `span` of the source.
    pub fn user_at(span: Span, message: impl Into<String>) -> Self {
        CompileError::User { message: message.into(), span: Some(span) }
    }
    /// An internal error (a bug).
    pub fn internal(message: impl Into<String>) -> Self {
        CompileError::Internal { message: message.into() }
    }
    /// Whether this is a compiler bug rather than a problem with the input.
    pub fn is_internal(&self) -> bool {
        matches!(self, CompileError::Internal { .. })
    }
    /// The message, without the location (diagnostics: their summaries, one per line).
    pub fn message(&self) -> String {
        match self {
            CompileError::User { message, .. } | CompileError::Internal { message } => message.clone(),
            CompileError::Source(d) => d.iter().map(|d| d.message.as_str()).collect::<Vec<_>>().join("\n"),
        }
    }
    /// Renders the error against the source it came from (`file` names it), with labels where
    /// the error has a span.
    pub fn render(&self, file: &str, src: &str, color: bool) -> String {
        match self {
            CompileError::Source(d) => d.iter().map(|d| d.render(file, src, color)).collect(),
            CompileError::User { message, span: Some(span) } => {
                Diagnostic::error(message.clone(), *span, "here").render(file, src, color)
            }
            CompileError::User { message, span: None } => format!("error: {message}\n"),
            CompileError::Internal { message } => format!(
                "internal compiler error: {message}\n  (this is a bug in cvc, not in {file}: please report it with the file)\n"
            ),
        }
    }
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompileError::User { message, .. } => f.write_str(message),
            CompileError::Source(_) => f.write_str(&self.message()),
            CompileError::Internal { message } => write!(f, "internal compiler error: {message}"),
        }
    }
}

impl std::error::Error for CompileError {}

impl From<String> for CompileError {
    /// A bare message is an internal error: user errors are constructed on purpose.
    fn from(message: String) -> Self {
        CompileError::Internal { message }
    }
}

impl From<Vec<Diagnostic>> for CompileError {
    fn from(d: Vec<Diagnostic>) -> Self {
        CompileError::Source(d)
    }
}

/// Result of a public compiler entry point.
pub type CompileResult<T> = Result<T, CompileError>;
