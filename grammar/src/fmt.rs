//! The canonical layout of `.cvnn` text (`cvc fmt`), built on the pest parse tree.
//!
//! The formatter re-emits every token of the parse tree in source order and decides only the
//! whitespace between them, so a formatted file parses to the same AST by construction (the
//! tests compare the ASTs and the lowered IR anyway). Comments are recovered from the text
//! between tokens and kept where they were: on their own line or after the code of a line.
//!
//! The style, written to match the examples in the repository:
//! - 4 spaces of indentation per open `{`, `(` or `[`; a line that continues an expression
//!   (a pipeline broken before `|>`) is indented one more level;
//! - every item of a `model` or `train` section on its own line, the sections' braces on the
//!   lines of their header and after their last item; one blank line between sections;
//! - line breaks inside items (a pipeline per stage, a block body per line) are the author's
//!   and are kept; runs of blank lines shrink to one, none after `{` or before `}`;
//! - one space around `=`, `|>` and binary operators, after `,` and `:`, none inside
//!   brackets or before `(` of a call;
//! - in consecutive `input` lines the types are aligned, in consecutive settings of a
//!   `train` section the `=`, and comments that end consecutive lines share a column.

use crate::parser::{CvnnParser, Rule};
use crate::ParseError;
use pest::iterators::Pair;
use pest::Parser as _;

/// Formats a whole `.cvnn` source canonically. Fails with the parser's error when `src` does
/// not parse; formatting a formatted text returns it unchanged.
pub fn format_source(src: &str) -> Result<String, ParseError> {
    // The parser's checks and messages (nesting depth, friendly syntax errors) come first.
    crate::parse(src)?;
    let mut pairs = CvnnParser::parse(Rule::file, src).map_err(|e| internal(format!("{e}")))?;
    let file = pairs.next().ok_or_else(|| internal("empty parse".into()))?;
    let mut toks = Vec::new();
    walk(file, src, &mut toks)?;
    let lines = layout(src, &toks);
    Ok(render(lines))
}

fn internal(message: String) -> ParseError {
    ParseError {
        span: crate::Span::new(0, 0),
        message: format!("internal error in the formatter: {message}"),
        label: String::new(),
        help: None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A name, keyword, number, size, range or string.
    Word,
    Open(u8),
    Close(u8),
    Comma,
    Colon,
    Equals,
    Dot,
    /// `|>`, `+`, `-`, `*`, `/`.
    Operator,
    Comment,
}

/// Where a token starts something that the layout puts on a line of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Starts {
    Nothing,
    /// A `model` or `train` section.
    Section,
    /// An item of a model or a setting of a train section.
    Item,
    /// A stage of a block body (its line breaks are the author's).
    Stage,
}

/// What the text up to and including a token is aligned with on neighbouring lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Head {
    /// `input name:` (the types line up).
    Input,
    /// A setting's name (the `=` line up).
    Setting,
}

#[derive(Clone, Debug)]
struct Tok {
    start: usize,
    end: usize,
    kind: Kind,
    starts: Starts,
    head: Option<Head>,
    /// `(` of a call or block parameter list, `[` of a shape: no space before.
    attached: bool,
    /// `{`/`}` of a model or train section.
    section_brace: bool,
}

impl Tok {
    fn new(start: usize, end: usize, kind: Kind) -> Self {
        Tok { start, end, kind, starts: Starts::Nothing, head: None, attached: false, section_brace: false }
    }
}

/// Rules whose text is one token, even when pest records parts of it.
fn is_token_rule(r: Rule) -> bool {
    matches!(r, Rule::range | Rule::string)
}

fn walk(pair: Pair<'_, Rule>, src: &str, toks: &mut Vec<Tok>) -> Result<(), ParseError> {
    let rule = pair.as_rule();
    let (start, end) = (pair.as_span().start(), pair.as_span().end());
    let first = toks.len();
    let children: Vec<Pair<'_, Rule>> =
        if is_token_rule(rule) { Vec::new() } else { pair.into_inner().collect() };
    if children.is_empty() {
        if start < end {
            let kind = match rule {
                Rule::pipe_op | Rule::add_op | Rule::mul_op => Kind::Operator,
                Rule::comma => Kind::Comma,
                _ => Kind::Word,
            };
            toks.push(Tok::new(start, end, kind));
        }
    } else {
        let mut pos = start;
        for child in children {
            let child_start = child.as_span().start();
            let child_end = child.as_span().end();
            lex_gap(src, pos, child_start, rule, toks)?;
            walk(child, src, toks)?;
            pos = child_end;
        }
        lex_gap(src, pos, end, rule, toks)?;
    }
    if let Some(t) = toks[first..].iter_mut().find(|t| t.kind != Kind::Comment) {
        match rule {
            Rule::model | Rule::train => t.starts = Starts::Section,
            Rule::input_decl
            | Rule::param_decl
            | Rule::block_def
            | Rule::output_decl
            | Rule::loss_decl
            | Rule::binding => t.starts = Starts::Item,
            Rule::setting => {
                t.starts = Starts::Item;
                t.head = Some(Head::Setting);
            }
            _ => {}
        }
    }
    if rule == Rule::block_body {
        mark_stages(toks, first);
    }
    Ok(())
}

/// Marks the first token of each stage directly inside a block body (the stages not behind
/// a `|>`), so a body written one stage per line keeps that layout.
fn mark_stages(toks: &mut [Tok], first: usize) {
    let mut depth = 0usize;
    let mut expect_stage = true;
    for t in &mut toks[first..] {
        match t.kind {
            Kind::Comment => continue,
            Kind::Open(_) => depth += 1,
            Kind::Close(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth == 0 && t.kind == Kind::Word && expect_stage && t.starts == Starts::Nothing {
            t.starts = Starts::Stage;
        }
        // A new stage follows a complete one: after a name or a closing `)` at depth 0,
        // unless a `.` or `|>` continues it.
        expect_stage = depth == 0 && matches!(t.kind, Kind::Word | Kind::Close(_));
    }
}

/// Turns the text between two parse-tree tokens (whitespace, comments, literal punctuation
/// of the grammar) into tokens; `rule` is the rule whose literal the punctuation is.
fn lex_gap(src: &str, from: usize, to: usize, rule: Rule, toks: &mut Vec<Tok>) -> Result<(), ParseError> {
    let bytes = src.as_bytes();
    let mut i = from;
    while i < to {
        let c = bytes[i];
        let kind = match c {
            b' ' | b'\t' | b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            b'#' => {
                let mut j = i;
                while j < to && bytes[j] != b'\n' {
                    j += 1;
                }
                toks.push(Tok::new(i, j, Kind::Comment));
                i = j;
                continue;
            }
            b'(' | b'[' | b'{' => Kind::Open(c),
            b')' | b']' | b'}' => Kind::Close(c),
            b',' => Kind::Comma,
            b':' => Kind::Colon,
            b'=' => Kind::Equals,
            b'.' => Kind::Dot,
            _ => {
                return Err(internal(format!("unexpected text at byte {i} between tokens of {rule:?}")));
            }
        };
        let mut t = Tok::new(i, i + 1, kind);
        t.attached = matches!((c, rule), (b'(', Rule::call_args | Rule::block_def) | (b'[', _));
        t.section_brace = matches!(c, b'{' | b'}') && matches!(rule, Rule::model | Rule::train);
        if c == b':' && rule == Rule::input_decl {
            t.head = Some(Head::Input);
        }
        toks.push(t);
        i += 1;
    }
    Ok(())
}

/// One output line before alignment.
#[derive(Debug, Default)]
struct Line {
    indent: usize,
    text: String,
    /// Byte length of the aligned head of `text`, and what it aligns with.
    head: Option<(usize, Head)>,
    /// A comment after the code.
    comment: Option<String>,
    blank: bool,
}

/// Whether a space separates `prev` and `next` on one line.
fn space_between(prev: &Tok, next: &Tok) -> bool {
    match (prev.kind, next.kind) {
        (_, Kind::Close(b'}')) => true,
        (_, Kind::Close(_) | Kind::Comma | Kind::Colon | Kind::Dot) => false,
        (Kind::Open(b'{'), _) => true,
        (Kind::Open(_) | Kind::Dot, _) => false,
        (_, Kind::Open(_)) if next.attached => false,
        _ => true,
    }
}

/// The indentation of a line starting with `next`, `depth` brackets deep, after `prev`.
fn indent_of(next: Option<&Tok>, depth: usize, prev: Option<&Tok>) -> usize {
    let Some(t) = next else { return 0 };
    if let Kind::Close(_) = t.kind {
        return depth.saturating_sub(1);
    }
    let continues =
        t.starts == Starts::Nothing && prev.is_some_and(|p| !matches!(p.kind, Kind::Open(_) | Kind::Comma));
    depth + usize::from(continues)
}

fn layout(src: &str, toks: &[Tok]) -> Vec<Line> {
    let mut lines: Vec<Line> = Vec::new();
    let mut cur = Line::default();
    let mut depth = 0usize;
    let mut prev: Option<&Tok> = None;
    let mut prev_code: Option<&Tok> = None;
    // Whether the current line began with an item, so its head may be aligned.
    let mut line_is_item = false;
    for (i, t) in toks.iter().enumerate() {
        let text = src[t.start..t.end].trim_end();
        let mut breaks = match prev {
            None => 0,
            Some(p) => src[p.end..t.start].matches('\n').count().min(2),
        };
        if let Some(p) = prev {
            if p.kind == Kind::Comment {
                breaks = breaks.max(1);
            }
            match t.starts {
                Starts::Section if p.kind != Kind::Comment => breaks = 2,
                Starts::Section | Starts::Item => breaks = breaks.max(1),
                _ => {}
            }
            if t.section_brace && matches!(t.kind, Kind::Close(_)) {
                breaks = breaks.max(1);
            }
            if matches!(p.kind, Kind::Open(_)) || matches!(t.kind, Kind::Close(_)) {
                breaks = breaks.min(1);
            }
        }
        if t.kind == Kind::Comment && breaks == 0 && !cur.text.is_empty() {
            cur.comment = Some(text.to_string());
            prev = Some(t);
            continue;
        }
        if breaks > 0 {
            lines.push(std::mem::take(&mut cur));
            if breaks == 2 {
                lines.push(Line { blank: true, ..Line::default() });
            }
        }
        if cur.text.is_empty() {
            let next_code = if t.kind == Kind::Comment {
                toks[i..].iter().find(|n| n.kind != Kind::Comment)
            } else {
                Some(t)
            };
            cur.indent = match next_code {
                // A comment before `}` belongs to the block it closes.
                Some(n) if t.kind == Kind::Comment && matches!(n.kind, Kind::Close(_)) => depth,
                n => indent_of(n, depth, prev_code),
            };
            line_is_item = t.starts == Starts::Item;
        } else if prev_code.is_some_and(|p| space_between(p, t)) {
            cur.text.push(' ');
        }
        cur.text.push_str(text);
        match t.kind {
            Kind::Open(_) => depth += 1,
            Kind::Close(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
        if let (Some(h), true) = (t.head, line_is_item) {
            cur.head.get_or_insert((cur.text.len(), h));
        }
        if t.kind != Kind::Comment {
            prev_code = Some(t);
        }
        prev = Some(t);
    }
    lines.push(cur);
    // The first line is empty when the file starts with its first token; keep no leading
    // or trailing empty lines.
    while lines.first().is_some_and(|l| l.text.is_empty() && l.comment.is_none()) {
        lines.remove(0);
    }
    while lines.last().is_some_and(|l| l.text.is_empty() && l.comment.is_none()) {
        lines.pop();
    }
    align_heads(&mut lines);
    lines
}

/// Pads the heads of consecutive lines of one kind (and indentation) to the same width.
fn align_heads(lines: &mut [Line]) {
    let key = |l: &Line| match l.head {
        Some((end, h)) if end < l.text.len() => Some((h, l.indent)),
        _ => None,
    };
    let mut i = 0;
    while i < lines.len() {
        let Some(k) = key(&lines[i]) else {
            i += 1;
            continue;
        };
        let mut j = i;
        while j < lines.len() && key(&lines[j]) == Some(k) {
            j += 1;
        }
        let widest = lines[i..j].iter().filter_map(|l| l.head.map(|h| width(&l.text[..h.0]))).max();
        for l in &mut lines[i..j] {
            if let (Some((end, _)), Some(w)) = (l.head, widest) {
                let pad = " ".repeat(w - width(&l.text[..end]));
                l.text.insert_str(end, &pad);
            }
        }
        i = j;
    }
}

fn width(s: &str) -> usize {
    s.chars().count()
}

fn render(lines: Vec<Line>) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        // Comments ending consecutive lines share the column two past the longest code.
        let mut j = i;
        while j < lines.len() && lines[j].comment.is_some() && !lines[j].text.is_empty() {
            j += 1;
        }
        let run = if j > i { j } else { i + 1 };
        let column = lines[i..run].iter().map(|l| l.indent * 4 + width(&l.text)).max().unwrap_or(0) + 2;
        for l in &lines[i..run] {
            if !l.blank {
                let code = format!("{}{}", "    ".repeat(l.indent), l.text);
                out.push_str(&code);
                if let Some(c) = &l.comment {
                    if !l.text.is_empty() {
                        out.push_str(&" ".repeat(column - width(&code)));
                    }
                    out.push_str(c);
                }
            }
            out.push('\n');
        }
        i = run;
    }
    out
}
