//! Byte spans into the `.cvnn` source, carried by every AST and IR node.

use serde::Serialize;

/// A half-open byte range `start..end` into one source text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Span {
    /// First byte of the range.
    pub start: u32,
    /// One past the last byte of the range.
    pub end: u32,
}

impl Span {
    /// A span covering `start..end`.
    pub fn new(start: usize, end: usize) -> Self {
        Span { start: start as u32, end: end as u32 }
    }

    /// The smallest span covering both `self` and `other`.
    pub fn join(self, other: Span) -> Span {
        Span { start: self.start.min(other.start), end: self.end.max(other.end) }
    }

    /// The range as `usize` offsets, for slicing the source.
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }

    /// 1-based line and column of `start` in `src`.
    pub fn line_col(self, src: &str) -> (usize, usize) {
        let upto = &src[..(self.start as usize).min(src.len())];
        let line = upto.matches('\n').count() + 1;
        let col = upto.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, col)
    }
}

/// Line starts of a source text, for turning many byte offsets into line numbers
/// (a binary search each, where [`Span::line`] scans the text).
#[derive(Clone, Debug)]
pub struct LineIndex {
    starts: Vec<usize>,
    len: usize,
}

impl LineIndex {
    /// Indexes `src`.
    pub fn new(src: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(src.bytes().enumerate().filter(|&(_, b)| b == b'\n').map(|(i, _)| i + 1));
        LineIndex { starts, len: src.len() }
    }

    /// 1-based line of byte offset `at` (clamped to the text).
    pub fn line(&self, at: usize) -> usize {
        self.starts.partition_point(|&s| s <= at.min(self.len))
    }

    /// Length in bytes of the indexed text.
    pub fn text_len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index agrees with `line_col` at every offset of texts with empty lines, CRLF,
    /// multi-byte characters and no final newline.
    #[test]
    fn line_index_agrees_with_line_col() {
        for src in ["", "a", "\n", "ab\n\ncd\r\nλé\nlast", "x\ny\n", "\n\n\n"] {
            let idx = LineIndex::new(src);
            for at in 0..=src.len() {
                if !src.is_char_boundary(at) {
                    continue;
                }
                let want = Span { start: at as u32, end: at as u32 }.line_col(src).0;
                assert_eq!(idx.line(at), want, "{src:?} at {at}");
            }
            assert_eq!(idx.line(src.len() + 5), idx.line(src.len()));
        }
    }
}
