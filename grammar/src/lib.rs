//! The `.cvnn` language: grammar (`cvnn.pest`), AST with byte spans, parser.

pub mod span;
pub use span::Span;
