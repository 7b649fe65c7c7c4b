//! Parses `.cvnn` text into the [`ast`](crate::ast) with pest, and turns pest's failures into
//! a [`ParseError`] that says, in words, what was expected and what was found.

use crate::ast::*;
use crate::Span;
use pest::error::{ErrorVariant, InputLocation};
use pest::iterators::Pair;
use pest::Parser as _;
use pest_derive::Parser;

#[derive(Parser)]
#[grammar = "../cvnn.pest"]
pub(crate) struct CvnnParser;

/// Deepest nesting of brackets accepted; deeper input is refused before parsing, so that
/// neither the parser nor the checker can run out of stack.
pub const MAX_NESTING: usize = 32;

/// A syntax error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Where the parser stopped.
    pub span: Span,
    /// One-line summary, e.g. "expected `=` or `|>`, found `)`".
    pub message: String,
    /// Text to underline the span with.
    pub label: String,
    /// How to fix it, when a fix is known.
    pub help: Option<String>,
}

/// Parses a whole `.cvnn` source.
pub fn parse(src: &str) -> Result<File, ParseError> {
    pest::set_error_detail(true);
    check_nesting(src)?;
    let mut pairs = CvnnParser::parse(Rule::file, src).map_err(|e| convert_error(src, e))?;
    let file = pairs.next().ok_or_else(|| ParseError {
        span: Span::new(0, 0),
        message: "empty parse".into(),
        label: String::new(),
        help: None,
    })?;
    build_file(file)
}

fn check_nesting(src: &str) -> Result<(), ParseError> {
    let bytes = src.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(ParseError {
                        span: Span::new(i, i + 1),
                        message: format!("brackets nested deeper than {MAX_NESTING} levels"),
                        label: "too deep".into(),
                        help: Some("name intermediate values with bindings instead".into()),
                    });
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The words a rule stands for in "expected ..." messages.
fn rule_word(rule: Rule) -> Option<&'static str> {
    Some(match rule {
        Rule::EOI => "end of file",
        Rule::model | Rule::kw_model => "`model`",
        Rule::train | Rule::kw_train => "`train`",
        Rule::input_decl | Rule::kw_input => "`input`",
        Rule::param_decl | Rule::kw_param => "`param`",
        Rule::block_def | Rule::kw_block => "`block`",
        Rule::output_decl | Rule::kw_output => "`output`",
        Rule::loss_decl | Rule::kw_loss => "`loss`",
        Rule::kw_of => "`of`",
        Rule::binding | Rule::setting | Rule::kwarg => "`name = value`",
        Rule::ident | Rule::name | Rule::callee | Rule::param_list => "a name",
        Rule::input_type => "a type such as `c64[B, 64]`",
        Rule::dim => "a dimension (a number or `B`)",
        Rule::block_body | Rule::stage => "an operator",
        Rule::expr
        | Rule::sum
        | Rule::product
        | Rule::call
        | Rule::group
        | Rule::range
        | Rule::string
        | Rule::str_body
        | Rule::boolean => "an expression",
        Rule::int | Rule::float | Rule::size => "a number",
        Rule::call_args => "`(`",
        Rule::pipe_op => "`|>`",
        Rule::add_op => "`+` or `-`",
        Rule::mul_op => "`*` or `/`",
        _ => return None,
    })
}

/// Describes what the parser found at byte `pos`.
fn found_at(src: &str, pos: usize) -> (String, Span) {
    let rest = &src[pos.min(src.len())..];
    let Some(c) = rest.chars().next().filter(|_| !rest.trim().is_empty()) else {
        return ("end of file".into(), Span::new(pos, pos));
    };
    if c.is_ascii_alphanumeric() || c == '_' {
        let len = rest
            .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '.'))
            .unwrap_or(rest.len());
        let word = rest[..len].trim_end_matches('.');
        return (format!("`{word}`"), Span::new(pos, pos + word.len()));
    }
    let two = rest.get(..2).unwrap_or("");
    if two == "|>" || two == ".." {
        return (format!("`{two}`"), Span::new(pos, pos + 2));
    }
    let shown = match c {
        '\n' | '\r' => "end of line".to_string(),
        '\t' => "a tab".to_string(),
        c if c.is_control() => format!("character U+{:04X}", c as u32),
        '`' => "a backtick".to_string(),
        c => format!("`{c}`"),
    };
    (shown, Span::new(pos, pos + c.len_utf8()))
}

fn convert_error(src: &str, e: pest::error::Error<Rule>) -> ParseError {
    let mut pos = match e.location {
        InputLocation::Pos(p) => p,
        InputLocation::Span((a, _)) => a,
    };
    let mut rules: Vec<Rule> = match &e.variant {
        ErrorVariant::ParsingError { positives, .. } => positives.clone(),
        ErrorVariant::CustomError { .. } => Vec::new(),
    };
    let mut tokens: Vec<String> = Vec::new();
    if let Some(att) = e.parse_attempts() {
        // Literal tokens (`,`, `)`, `=`, keywords) are tracked separately from rules and may
        // have got further than any rule: report the furthest point.
        if att.max_position > pos {
            pos = att.max_position;
            rules.clear();
        }
        if att.max_position == pos {
            tokens = att.expected_tokens().iter().map(|t| t.to_string()).collect();
        }
    }
    let words = expected_words(&rules, &tokens);
    let expected = match words.len() {
        0 => "something else".to_string(),
        1 => words[0].clone(),
        n => format!("{} or {}", words[..n - 1].join(", "), words[n - 1]),
    };
    if pos >= src.trim_end().len() {
        // At the end of the text: point just after the last token, not past trailing newlines.
        pos = src.trim_end().len();
    }
    let (found, span) = found_at(src, pos);
    let help = suggest(src, pos, &words);
    ParseError {
        span,
        message: format!("expected {expected}, found {found}"),
        label: format!("expected {expected}"),
        help,
    }
}

/// Orders what the parser wanted: punctuation, keywords, then kinds of thing.
fn expected_words(rules: &[Rule], tokens: &[String]) -> Vec<String> {
    const PUNCT: [&str; 10] = ["=", ":", ",", ")", "]", "}", "{", "(", "[", ".."];
    const KEYWORDS: [&str; 8] = ["model", "train", "block", "input", "param", "output", "loss", "of"];
    let mut words: Vec<String> = Vec::new();
    fn push(words: &mut Vec<String>, w: String) {
        if !words.contains(&w) {
            words.push(w);
        }
    }
    // `(` also starts a parenthesised expression or an optional argument list: only worth
    // naming when nothing else explains it.
    let optional_args =
        rules.contains(&Rule::call_args) || rules.iter().any(|r| rule_word(*r) == Some("an expression"));
    for p in PUNCT {
        if tokens.iter().any(|t| t == p) && !(p == "(" && optional_args) {
            push(&mut words, format!("`{p}`"));
        }
    }
    for k in KEYWORDS {
        if tokens.iter().any(|t| t == k) {
            push(&mut words, format!("`{k}`"));
        }
    }
    let mut operator = tokens.iter().any(|t| t == "|>");
    for r in rules {
        match r {
            Rule::pipe_op | Rule::add_op | Rule::mul_op => operator = true,
            Rule::call_args => {}
            r => {
                if let Some(w) = rule_word(*r) {
                    push(&mut words, w.to_string());
                }
            }
        }
    }
    if operator {
        push(&mut words, "an operator (`|>`, `+`, `-`, `*`, `/`)".to_string());
    }
    if words.is_empty() && tokens.iter().any(|t| t == "a..z") {
        push(&mut words, "a name".to_string());
    }
    words
}

/// Hints for common slips, keyed on what the parser wanted and what is there.
fn suggest(src: &str, pos: usize, words: &[String]) -> Option<String> {
    let rest = &src[pos.min(src.len())..];
    let at_word = |w: &str| {
        rest.starts_with(w) && !rest[w.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
    };
    if src.trim().is_empty() {
        return Some("a .cvnn file holds `model Name { ... }` and optionally `train Name { ... }`".into());
    }
    if rest.starts_with("->") || rest.starts_with('>') {
        return Some("pipelines use `|>`: `x |> conv2d(32, kernel = 3)`".into());
    }
    if rest.starts_with(':') && words.iter().any(|w| w == "`=`") {
        return Some("settings and keyword arguments use `=`, e.g. `batch = 64`".into());
    }
    if ["model", "block", "input", "param", "output", "loss", "train", "of"].iter().any(|k| at_word(k))
        && words.iter().any(|w| w == "an expression")
    {
        return Some("this word is reserved by the language; choose another name".into());
    }
    let before = src[..pos.min(src.len())].trim_end();
    let prev_word = before.rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or("");
    if rest.starts_with('=')
        && ["input", "param", "output", "loss", "model", "block", "train"].contains(&prev_word)
    {
        return Some(
            "`input`, `param`, `output` and `loss` cannot be bound with `=`: choose another name".into(),
        );
    }
    if rest.trim().is_empty() && words.iter().any(|w| w == "`}`") {
        return Some("a `{` above is not closed: add `}` after its last line".into());
    }
    if words.iter().any(|w| w == "`model`") && words.iter().any(|w| w == "`train`") {
        return Some("a .cvnn file holds `model Name { ... }` and `train Name { ... }` sections".into());
    }
    None
}

// ------------------------------------------------------------------ building the AST

/// The span of a pair without the whitespace and comments that pest's implicit
/// `WHITESPACE*` leaves at its end when an optional trailing part is absent.
fn span_of(p: &Pair<Rule>) -> Span {
    let s = p.as_span();
    let text = s.as_str().as_bytes();
    // Children come in order, so the last one ends last; it may itself carry trailing space.
    let inner_end = p.clone().into_inner().last().map_or(s.end(), |c| span_of(&c).end as usize);
    let mut end = inner_end.max(s.start());
    let mut i = end - s.start();
    while i < text.len() {
        match text[i] {
            b'#' => {
                while i < text.len() && text[i] != b'\n' {
                    i += 1;
                }
            }
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            _ => {
                i += 1;
                end = s.start() + i;
            }
        }
    }
    Span::new(s.start(), end)
}

fn ident(p: Pair<Rule>) -> Ident {
    Ident { name: p.as_str().to_string(), span: span_of(&p) }
}

fn err(span: Span, message: impl Into<String>, label: impl Into<String>) -> ParseError {
    ParseError { span, message: message.into(), label: label.into(), help: None }
}

fn build_file(p: Pair<Rule>) -> Result<File, ParseError> {
    let span = span_of(&p);
    let mut items = Vec::new();
    for c in p.into_inner() {
        match c.as_rule() {
            Rule::model => items.push(Item::Model(build_model(c)?)),
            Rule::train => items.push(Item::Train(build_train(c)?)),
            _ => {}
        }
    }
    Ok(File { items, span })
}

fn build_model(p: Pair<Rule>) -> Result<Model, ParseError> {
    let span = span_of(&p);
    let mut it = p.into_inner().filter(|c| c.as_rule() != Rule::kw_model);
    let name = ident(it.next().expect("grammar: model name"));
    let mut items = Vec::new();
    for c in it {
        let s = span_of(&c);
        let item = match c.as_rule() {
            Rule::input_decl => {
                let mut i = c.into_inner().filter(|c| c.as_rule() != Rule::kw_input);
                let name = ident(i.next().expect("grammar: input name"));
                let ty = build_input_type(i.next().expect("grammar: input type"))?;
                ModelItem::Input(InputDecl { name, ty, span: s })
            }
            Rule::param_decl => {
                let mut i = c.into_inner().filter(|c| c.as_rule() != Rule::kw_param);
                let name = ident(i.next().expect("grammar: param name"));
                let ty = build_input_type(i.next().expect("grammar: param type"))?;
                let init = build_expr(i.next().expect("grammar: param init"))?;
                ModelItem::Param(ParamDecl { name, ty, init, span: s })
            }
            Rule::block_def => ModelItem::Block(build_block(c)?),
            Rule::output_decl => ModelItem::Output(OutputDecl {
                names: c.into_inner().filter(|c| c.as_rule() == Rule::ident).map(ident).collect(),
                span: s,
            }),
            Rule::loss_decl => {
                let e = c.into_inner().find(|c| c.as_rule() == Rule::expr).expect("grammar: loss expr");
                ModelItem::Loss(LossDecl { value: build_expr(e)?, span: s })
            }
            Rule::binding => {
                let mut i = c.into_inner();
                let name = ident(i.next().expect("grammar: binding name"));
                let value = build_expr(i.next().expect("grammar: binding value"))?;
                ModelItem::Binding(Binding { name, value, span: s })
            }
            _ => continue,
        };
        items.push(item);
    }
    Ok(Model { name, items, span })
}

fn build_input_type(p: Pair<Rule>) -> Result<InputType, ParseError> {
    let span = span_of(&p);
    let mut it = p.into_inner();
    let elem = ident(it.next().expect("grammar: element type"));
    let mut dims = Vec::new();
    let mut classes = None;
    for c in it {
        match c.as_rule() {
            Rule::dim => {
                let d = c.into_inner().next().expect("grammar: dim");
                let s = span_of(&d);
                let kind = match d.as_rule() {
                    Rule::int => DimKind::Int(parse_int(&d)?),
                    _ => DimKind::Name(d.as_str().to_string()),
                };
                dims.push(DimExpr { kind, span: s });
            }
            Rule::int => classes = Some((parse_int(&c)?, span_of(&c))),
            _ => {}
        }
    }
    Ok(InputType { elem, dims, classes, span })
}

fn build_block(p: Pair<Rule>) -> Result<BlockDef, ParseError> {
    let span = span_of(&p);
    let mut name = None;
    let mut params = Vec::new();
    let mut body = Vec::new();
    for c in p.into_inner() {
        match c.as_rule() {
            Rule::ident => name = Some(ident(c)),
            Rule::param_list => params = c.into_inner().map(ident).collect(),
            Rule::block_body => {
                for s in c.into_inner().filter(|s| s.as_rule() == Rule::stage) {
                    body.push(build_stage(s)?);
                }
            }
            _ => {}
        }
    }
    Ok(BlockDef { name: name.expect("grammar: block name"), params, body, span })
}

fn build_train(p: Pair<Rule>) -> Result<Train, ParseError> {
    let span = span_of(&p);
    let mut it = p.into_inner().filter(|c| c.as_rule() != Rule::kw_train);
    let model = ident(it.next().expect("grammar: train model"));
    let mut settings = Vec::new();
    for c in it {
        let s = span_of(&c);
        let mut i = c.into_inner();
        let key = ident(i.next().expect("grammar: setting key"));
        let value = build_expr(i.next().expect("grammar: setting value"))?;
        settings.push(Setting { key, value, span: s });
    }
    Ok(Train { model, settings, span })
}

fn build_stage(p: Pair<Rule>) -> Result<Stage, ParseError> {
    let span = span_of(&p);
    let mut it = p.into_inner();
    let callee = build_path(it.next().expect("grammar: stage callee"));
    let args = match it.next() {
        Some(a) => build_args(a)?,
        None => Vec::new(),
    };
    Ok(Stage { callee, args, span })
}

fn build_path(p: Pair<Rule>) -> Path {
    let span = span_of(&p);
    Path { parts: p.into_inner().map(ident).collect(), span }
}

fn build_args(p: Pair<Rule>) -> Result<Vec<Arg>, ParseError> {
    let mut args = Vec::new();
    for a in p.into_inner() {
        let span = span_of(&a);
        match a.as_rule() {
            Rule::kwarg => {
                let mut i = a.into_inner();
                let name = ident(i.next().expect("grammar: kwarg name"));
                let value = build_expr(i.next().expect("grammar: kwarg value"))?;
                args.push(Arg { name: Some(name), value, span });
            }
            _ => args.push(Arg { name: None, value: build_expr(a)?, span }),
        }
    }
    Ok(args)
}

fn build_expr(p: Pair<Rule>) -> Result<Expr, ParseError> {
    let span = span_of(&p);
    match p.as_rule() {
        Rule::expr => {
            let mut it = p.into_inner();
            let head = build_expr(it.next().expect("grammar: pipe head"))?;
            let mut stages = Vec::new();
            for c in it.filter(|c| c.as_rule() == Rule::stage) {
                stages.push(build_stage(c)?);
            }
            if stages.is_empty() {
                return Ok(head);
            }
            Ok(Expr { kind: ExprKind::Pipe { head: Box::new(head), stages }, span })
        }
        Rule::sum | Rule::product => {
            let mut it = p.into_inner();
            let first = build_expr(it.next().expect("grammar: operand"))?;
            let mut rest = Vec::new();
            while let Some(op) = it.next() {
                let o = match op.as_str() {
                    "+" => ArithOp::Add,
                    "-" => ArithOp::Sub,
                    "*" => ArithOp::Mul,
                    _ => ArithOp::Div,
                };
                let rhs = build_expr(it.next().expect("grammar: right operand"))?;
                rest.push((o, span_of(&op), rhs));
            }
            if rest.is_empty() {
                return Ok(first);
            }
            Ok(Expr { kind: ExprKind::Arith { first: Box::new(first), rest }, span })
        }
        Rule::int => Ok(Expr { kind: ExprKind::Int(parse_int(&p)?), span }),
        Rule::float => Ok(Expr { kind: ExprKind::Float(parse_float(&p)?), span }),
        Rule::size => Ok(Expr { kind: ExprKind::Size(p.as_str().to_string()), span }),
        Rule::boolean => Ok(Expr { kind: ExprKind::Bool(p.as_str() == "true"), span }),
        Rule::string => {
            let body = p.into_inner().next().map_or("", |b| b.as_str());
            Ok(Expr { kind: ExprKind::Str(unescape(body)), span })
        }
        Rule::range => {
            let mut it = p.into_inner();
            let a = it.next().expect("grammar: range start");
            let b = it.next().expect("grammar: range end");
            Ok(Expr { kind: ExprKind::Range(number(&a)?, number(&b)?), span })
        }
        Rule::name => Ok(Expr { kind: ExprKind::Name(p.as_str().to_string()), span }),
        Rule::group => {
            let mut items = Vec::new();
            let mut commas = 0;
            for c in p.into_inner() {
                if c.as_rule() == Rule::comma {
                    commas += 1;
                } else {
                    items.push(build_expr(c)?);
                }
            }
            if items.len() == 1 && commas == 0 {
                let inner = items.pop().expect("one item");
                return Ok(Expr { kind: inner.kind, span });
            }
            Ok(Expr { kind: ExprKind::Tuple(items), span })
        }
        Rule::call => {
            let mut it = p.into_inner();
            let callee = build_path(it.next().expect("grammar: callee"));
            let args = build_args(it.next().expect("grammar: call args"))?;
            Ok(Expr { kind: ExprKind::Call { callee, args }, span })
        }
        r => Err(err(span, format!("unexpected {r:?}"), "here")),
    }
}

fn parse_int(p: &Pair<Rule>) -> Result<i64, ParseError> {
    p.as_str().parse::<i64>().map_err(|_| {
        err(span_of(p), format!("integer `{}` is too large", p.as_str()), "out of range")
            .with_help("integers must lie within ±9223372036854775807")
    })
}

fn parse_float(p: &Pair<Rule>) -> Result<f64, ParseError> {
    match p.as_str().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(err(span_of(p), format!("number `{}` is out of range", p.as_str()), "not a finite f64")),
    }
}

fn number(p: &Pair<Rule>) -> Result<f64, ParseError> {
    match p.as_rule() {
        Rule::int => parse_int(p).map(|v| v as f64),
        _ => parse_float(p),
    }
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(o) => out.push(o),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl ParseError {
    fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}
