//! The `.cvnn` language: grammar (`cvnn.pest`), AST with byte spans, parser.
//!
//! ```
//! let file = cvc_grammar::parse("model M { input x: c64[B, 4]\n y = x |> crelu\n output y }").unwrap();
//! assert_eq!(file.models().count(), 1);
//! ```

pub mod ast;
pub mod fmt;
pub mod parser;
pub mod span;
pub use fmt::format_source;
pub use parser::{parse, ParseError};
pub use span::{LineIndex, Span};
