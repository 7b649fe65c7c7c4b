//! The IR's text form read back: parses what [`super::print::print_graph`] writes, so IR can be
//! written by hand (the pass filetests under `compiler/tests/filetests/`), diffed and re-read.
//!
//! The grammar is the printer's, line by line:
//! ```text
//! graph NAME (Train|Eval) {
//!   %ID = MNEMONIC[ATTRS](%ID, ...) : DTYPE[DIMS]  ; ROLE LABEL @LINE
//!   output NAME = %ID
//!   loss = %ID
//! }
//! ```
//! Hand-written text may also hold blank lines and `;` comment lines, and may number values
//! freely (each `%ID` is defined once, before its uses); printing renumbers them in order.
//! Types are checked as written against the op's inference ([`super::verify::verify`]), so an
//! input that parses is valid IR. Errors name the line and column.
//!
//! Source lines (`@LINE`) are kept through a synthetic source text ([`ParsedGraph::source`])
//! whose line `n` each such node's span points at: `print_graph(&p.graph, Some(&p.source))`
//! prints them again.

use super::*;
use cvc_grammar::Span;
use std::collections::HashMap;
use std::fmt;

/// A parsed graph and the synthetic source its spans point into.
#[derive(Clone, Debug)]
pub struct ParsedGraph {
    /// The graph.
    pub graph: Graph,
    /// Text of blank lines, as many as the largest `@LINE`: node spans index it.
    pub source: String,
    /// The value each written `%ID` names (hand-written text may number values freely).
    pub ids: HashMap<usize, Value>,
}

/// A parse error at a 1-based line and column of the IR text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IrParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub col: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for IrParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.col, self.message)
    }
}

impl std::error::Error for IrParseError {}

/// Every unary op, in declaration order (see [`unary_slot`]).
const UNARY: [UnaryOp; 24] = {
    use UnaryOp::*;
    [
        Neg,
        Conj,
        Real,
        Imag,
        Abs,
        Abs2,
        Angle,
        ToComplex,
        Exp,
        Log,
        Sqrt,
        Rsqrt,
        Recip,
        Sin,
        Cos,
        Tanh,
        Sigmoid,
        Relu,
        Step,
        Gelu,
        GeluGrad,
        StopGrad,
        GeluTanh,
        GeluTanhGrad,
    ]
};

/// Position of `u` in [`UNARY`]: an exhaustive match, so a new variant fails to compile here
/// until the table lists it.
#[cfg(test)]
fn unary_slot(u: UnaryOp) -> usize {
    use UnaryOp::*;
    match u {
        Neg => 0,
        Conj => 1,
        Real => 2,
        Imag => 3,
        Abs => 4,
        Abs2 => 5,
        Angle => 6,
        ToComplex => 7,
        Exp => 8,
        Log => 9,
        Sqrt => 10,
        Rsqrt => 11,
        Recip => 12,
        Sin => 13,
        Cos => 14,
        Tanh => 15,
        Sigmoid => 16,
        Relu => 17,
        Step => 18,
        Gelu => 19,
        GeluGrad => 20,
        StopGrad => 21,
        GeluTanh => 22,
        GeluTanhGrad => 23,
    }
}

/// Every binary op (see [`binary_slot`]).
const BINARY: [BinaryOp; 8] = {
    use BinaryOp::*;
    [Add, Sub, Mul, Div, Max, Complex, Greater, Equal]
};

/// Position of `b` in [`BINARY`] (exhaustive, as [`unary_slot`]).
#[cfg(test)]
fn binary_slot(b: BinaryOp) -> usize {
    use BinaryOp::*;
    match b {
        Add => 0,
        Sub => 1,
        Mul => 2,
        Div => 3,
        Max => 4,
        Complex => 5,
        Greater => 6,
        Equal => 7,
    }
}

/// Every reduction kind (see [`reduce_slot`]).
const REDUCE: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::MaxMag];

#[cfg(test)]
fn reduce_slot(r: ReduceOp) -> usize {
    match r {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 1,
        ReduceOp::MaxMag => 2,
    }
}

/// A cursor over one line of text, for errors with columns.
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
}

type Res<T> = Result<T, IrParseError>;

impl<'a> Cursor<'a> {
    fn err<T>(&self, message: impl Into<String>) -> Res<T> {
        self.err_at(self.pos, message)
    }
    fn err_at<T>(&self, pos: usize, message: impl Into<String>) -> Res<T> {
        let col = self.text[..pos.min(self.text.len())].chars().count() + 1;
        Err(IrParseError { line: self.line, col, message: message.into() })
    }
    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }
    fn skip_ws(&mut self) {
        let r = self.rest();
        self.pos += r.len() - r.trim_start().len();
    }
    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, s: &str) -> Res<()> {
        if self.eat(s) {
            Ok(())
        } else {
            let found =
                self.rest().chars().next().map_or("the end of the line".to_string(), |c| format!("`{c}`"));
            self.err(format!("expected `{s}`, found {found}"))
        }
    }
    /// A run of characters accepted by `ok` (at least one).
    fn word(&mut self, what: &str, ok: impl Fn(char) -> bool) -> Res<&'a str> {
        self.skip_ws();
        let r = self.rest();
        let n = r.find(|c: char| !ok(c)).unwrap_or(r.len());
        if n == 0 {
            return self.err(format!("expected {what}"));
        }
        self.pos += n;
        Ok(&r[..n])
    }
    fn ident(&mut self) -> Res<&'a str> {
        self.word("a name", |c| c.is_alphanumeric() || c == '_')
    }
    fn number<T: std::str::FromStr>(&mut self, what: &str) -> Res<T> {
        let start = {
            self.skip_ws();
            self.pos
        };
        let w = self.word(what, |c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))?;
        w.parse().or_else(|_| self.err_at(start, format!("`{w}` is not {what}")))
    }
    fn usize(&mut self) -> Res<usize> {
        let start = {
            self.skip_ws();
            self.pos
        };
        let w = self.word("a non-negative integer", |c| c.is_ascii_digit())?;
        w.parse().or_else(|_| self.err_at(start, format!("`{w}` is too large")))
    }
    fn f64(&mut self) -> Res<f64> {
        self.number("a number")
    }
    fn bool(&mut self) -> Res<bool> {
        self.skip_ws();
        if self.eat("true") {
            Ok(true)
        } else if self.eat("false") {
            Ok(false)
        } else {
            self.err("expected `true` or `false`")
        }
    }
    /// `[a, b, ...]` of items read by `item`.
    fn list<T>(&mut self, mut item: impl FnMut(&mut Self) -> Res<T>) -> Res<Vec<T>> {
        self.expect("[")?;
        let mut v = Vec::new();
        if self.eat("]") {
            return Ok(v);
        }
        loop {
            v.push(item(self)?);
            if self.eat("]") {
                return Ok(v);
            }
            self.expect(",")?;
        }
    }
    fn pair<T>(&mut self, item: impl FnMut(&mut Self) -> Res<T>) -> Res<[T; 2]> {
        let start = self.pos;
        let v = self.list(item)?;
        <[T; 2]>::try_from(v).or_else(|_| self.err_at(start, "expected a list of two items"))
    }
    /// `key=` then the value.
    fn key(&mut self, key: &str) -> Res<()> {
        self.expect(key)?;
        self.expect("=")
    }
    /// A `%ID` reference.
    fn value_id(&mut self) -> Res<(usize, usize)> {
        self.skip_ws();
        let at = self.pos;
        self.expect("%")?;
        let id = self.word("a value number", |c| c.is_ascii_digit())?;
        let n = id.parse().or_else(|_| self.err_at(at, format!("value number `{id}` is too large")))?;
        Ok((n, at))
    }
}

/// Parses a graph in the text form of [`super::print::print_graph`].
pub fn parse_graph(text: &str) -> Result<ParsedGraph, IrParseError> {
    let mut lines = text.lines().enumerate().map(|(i, l)| Cursor { text: l, pos: 0, line: i + 1 });
    let significant = |c: &Cursor| {
        let t = c.text.trim();
        !t.is_empty() && !t.starts_with(';')
    };
    let Some(mut head) = lines.by_ref().find(significant) else {
        return Err(IrParseError { line: 1, col: 1, message: "expected `graph NAME (Train|Eval) {`".into() });
    };
    head.expect("graph")?;
    let name = head.word("a graph name", |c| !c.is_whitespace() && c != '(')?.to_string();
    head.expect("(")?;
    let mode = match head.ident()? {
        "Train" => Mode::Train,
        "Eval" => Mode::Eval,
        m => return head.err_at(head.pos - m.len(), format!("unknown mode `{m}` (Train or Eval)")),
    };
    head.expect(")")?;
    head.expect("{")?;
    end_of_line(&mut head)?;

    let mut b =
        GraphText { graph: Graph::new(&name, mode), ids: HashMap::new(), lines: Vec::new(), max_line: 0 };
    let mut closed = false;
    let mut last_line = head.line;
    for mut c in lines {
        last_line = c.line;
        if !significant(&c) {
            continue;
        }
        if closed {
            return c.err("text after the closing `}` of the graph");
        }
        c.skip_ws();
        if c.eat("}") {
            end_of_line(&mut c)?;
            closed = true;
        } else if c.rest().starts_with("output ") {
            c.expect("output")?;
            let name = c.word("an output name", |ch| !ch.is_whitespace() && ch != '=')?.to_string();
            c.expect("=")?;
            let value = b.operand(&mut c)?;
            end_of_line(&mut c)?;
            b.graph.outputs.push(Output { name, value });
        } else if c.rest().starts_with("loss ") || c.rest().starts_with("loss=") {
            c.expect("loss")?;
            c.expect("=")?;
            let v = b.operand(&mut c)?;
            end_of_line(&mut c)?;
            if b.graph.loss.replace(v).is_some() {
                return c.err("a second `loss` line");
            }
        } else {
            b.node(&mut c)?;
        }
    }
    if !closed {
        return Err(IrParseError { line: last_line, col: 1, message: "the graph has no closing `}`".into() });
    }
    b.finish()
}

fn end_of_line(c: &mut Cursor) -> Res<()> {
    c.skip_ws();
    if c.rest().is_empty() {
        Ok(())
    } else {
        c.err(format!("unexpected `{}`", c.rest()))
    }
}

/// The graph being built, with the written value numbers and the text line of each node.
struct GraphText {
    graph: Graph,
    ids: HashMap<usize, Value>,
    lines: Vec<usize>,
    max_line: usize,
}

impl GraphText {
    fn operand(&self, c: &mut Cursor) -> Res<Value> {
        let (id, at) = c.value_id()?;
        match self.ids.get(&id) {
            Some(&v) => Ok(v),
            None => c.err_at(at, format!("%{id} is not defined above")),
        }
    }

    fn node(&mut self, c: &mut Cursor) -> Res<()> {
        let (id, at) = c.value_id()?;
        if self.ids.contains_key(&id) {
            return c.err_at(at, format!("%{id} is defined twice"));
        }
        c.expect("=")?;
        let op_at = {
            c.skip_ws();
            c.pos
        };
        let mnemonic = c.ident()?;
        let op = op_with_attrs(c, mnemonic, op_at)?;
        c.expect("(")?;
        let mut inputs = Vec::new();
        if !c.eat(")") {
            loop {
                inputs.push(self.operand(c)?);
                if c.eat(")") {
                    break;
                }
                c.expect(",")?;
            }
        }
        c.expect(":")?;
        let ty_at = {
            c.skip_ws();
            c.pos
        };
        let ty = tensor_type(c)?;
        c.expect(";")?;
        let role = match c.ident()? {
            "Input" => Role::Input,
            "Param" => Role::Param,
            "State" => Role::State,
            "Forward" => Role::Forward,
            "Backward" => Role::Backward,
            "Update" => Role::Update,
            r => return c.err_at(c.pos - r.len(), format!("unknown role `{r}`")),
        };
        // The label is the rest of the line, less a trailing ` @LINE`.
        let rest = c.rest().trim();
        let (label, line) = match rest.rsplit_once('@') {
            Some((l, n))
                if !n.is_empty()
                    && n.bytes().all(|b| b.is_ascii_digit())
                    && (l.is_empty() || l.ends_with(' ')) =>
            {
                let n: usize = n.parse().or_else(|_| c.err("source line number too large"))?;
                if n == 0 {
                    return c.err("source lines count from 1");
                }
                (l.trim_end(), Some(n))
            }
            _ => (rest, None),
        };
        let arity = expected_arity(&op);
        if let Some(n) = arity {
            if inputs.len() != n {
                return c.err_at(op_at, format!("`{mnemonic}` takes {n} operands, got {}", inputs.len()));
            }
        } else if inputs.is_empty() {
            return c.err_at(op_at, format!("`{mnemonic}` takes at least one operand"));
        }
        if !op.is_leaf() || matches!(op, Op::Scalar { .. }) {
            let tys: Vec<&TensorType> = inputs.iter().map(|&i| self.graph.ty(i)).collect();
            match builder::infer(&op, &tys, Some(&ty.shape)) {
                Ok(t) if t == ty => {}
                Ok(t) => {
                    return c.err_at(
                        ty_at,
                        format!("type {ty} written, but `{mnemonic}` of these operands is {t}"),
                    )
                }
                Err(e) => return c.err_at(op_at, e),
            }
        }
        let span = match line {
            Some(n) => {
                self.max_line = self.max_line.max(n);
                Span::new(n - 1, n)
            }
            None => Span::default(),
        };
        let origin = Origin { role, label: label.to_string() };
        let v = self.graph.nodes.append(Node { op, inputs, ty, origin }, span);
        self.ids.insert(id, v);
        self.lines.push(c.line);
        Ok(())
    }

    fn finish(self) -> Result<ParsedGraph, IrParseError> {
        if let Err(e) = verify::verify(&self.graph) {
            // Messages start with the offending `%N:`; point at that node's line.
            let node =
                e.strip_prefix('%').and_then(|r| r.split(':').next()).and_then(|n| n.parse::<usize>().ok());
            let line = node.and_then(|n| self.lines.get(n).copied()).unwrap_or(1);
            return Err(IrParseError { line, col: 1, message: format!("invalid IR: {e}") });
        }
        Ok(ParsedGraph { graph: self.graph, source: "\n".repeat(self.max_line), ids: self.ids })
    }
}

/// Operand count of an op, `None` for `concat` (one or more).
fn expected_arity(op: &Op) -> Option<usize> {
    Some(match op {
        Op::Input { .. } | Op::Param { .. } | Op::State { .. } | Op::Scalar { .. } => 0,
        Op::Unary(_)
        | Op::Reduce { .. }
        | Op::Reshape
        | Op::Expand
        | Op::Permute { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Fft { .. }
        | Op::OneHot { .. }
        | Op::DropoutMask { .. } => 1,
        Op::Gather | Op::ScatterAdd { .. } => 2,
        Op::Binary(_)
        | Op::MatMul { .. }
        | Op::Conv2d { .. }
        | Op::ConvTranspose2d { .. }
        | Op::Conv2dWeightGrad { .. }
        | Op::Assign => 2,
        Op::Select => 3,
        Op::AttnLse { spec } => 2 + usize::from(spec.key_mask),
        Op::Attention { spec } => 4 + spec.extra_operands(),
        Op::AttentionGrad { spec, .. } => 6 + spec.extra_operands(),
        Op::Recurrence { spec } => spec.forward_operands(),
        Op::RecurrenceGrad { spec } => spec.grad_operands(),
        Op::Concat { .. } => return None,
    })
}

/// `f32[B, 3]`.
fn tensor_type(c: &mut Cursor) -> Res<TensorType> {
    let at = c.pos;
    let dtype = match c.ident()? {
        "f32" => DType::F32,
        "c64" => DType::C64,
        "i32" => DType::I32,
        d => return c.err_at(at, format!("unknown dtype `{d}` (f32, c64 or i32)")),
    };
    let dims = c.list(|c| if c.eat("B") { Ok(Dim::Batch) } else { c.usize().map(Dim::Fixed) })?;
    Ok(TensorType::new(dtype, Shape(dims)))
}

/// Mnemonics of the ops with bracketed attributes besides leaves and reductions.
const WITH_ATTRS: [&str; 18] = [
    "permute",
    "slice",
    "pad",
    "concat",
    "matmul",
    "conv2d",
    "conv_transpose2d",
    "conv2d_weight_grad",
    "fft",
    "ifft",
    "one_hot",
    "dropout_mask",
    "attn_lse",
    "attention",
    "attention_grad",
    "scatter_add",
    "recurrence",
    "recurrence_grad",
];

/// The op named `mnemonic` with its bracketed attributes (as [`super::print::attrs`] writes them).
fn op_with_attrs(c: &mut Cursor, mnemonic: &str, at: usize) -> Res<Op> {
    let geom = |c: &mut Cursor| -> Res<ConvGeom> {
        c.key("stride")?;
        let stride = c.pair(Cursor::usize)?;
        c.expect(",")?;
        c.key("pad")?;
        let pad = c.pair(Cursor::usize)?;
        c.expect(",")?;
        c.key("dilation")?;
        let dilation = c.pair(Cursor::usize)?;
        c.expect(",")?;
        c.key("groups")?;
        let groups = c.usize()?;
        Ok(ConvGeom { stride, pad, dilation, groups })
    };
    let conj = |c: &mut Cursor| -> Res<[bool; 2]> {
        c.expect(",")?;
        c.key("conj")?;
        c.pair(Cursor::bool)
    };
    if let Some(&u) = UNARY.iter().find(|u| Op::Unary(**u).mnemonic() == mnemonic) {
        return Ok(Op::Unary(u));
    }
    if let Some(&b) = BINARY.iter().find(|b| Op::Binary(**b).mnemonic() == mnemonic) {
        return Ok(Op::Binary(b));
    }
    let op = match mnemonic {
        "input" => {
            c.expect("[")?;
            let name = c.word("an input name", |ch| ch != ']')?.to_string();
            c.expect("]")?;
            return Ok(Op::Input { name });
        }
        "param" | "state" => {
            c.expect("[")?;
            let r = c.rest();
            let Some(n) = r.find(", init=") else { return c.err("expected `NAME, init=INIT`") };
            let name = r[..n].to_string();
            c.pos += n;
            c.expect(",")?;
            c.key("init")?;
            let init = init(c)?;
            c.expect("]")?;
            return Ok(if mnemonic == "param" { Op::Param { name, init } } else { Op::State { name, init } });
        }
        "scalar" => {
            c.expect("[")?;
            let value = c.number::<f64>("a number")?;
            let batch_exp = if c.eat("*") {
                c.expect("B")?;
                c.expect("^")?;
                c.number::<i32>("an integer")?
            } else {
                0
            };
            c.expect("]")?;
            return Ok(Op::Scalar { value, batch_exp });
        }
        "select" => Op::Select,
        "reshape" => Op::Reshape,
        "expand" => Op::Expand,
        "assign" => Op::Assign,
        "gather" => Op::Gather,
        m if !m.starts_with("reduce_") && !WITH_ATTRS.contains(&m) => {
            return c.err_at(at, format!("unknown op `{m}`"));
        }
        _ => {
            c.expect("[")?;
            let op = match mnemonic {
                m if m.starts_with("reduce_") => {
                    let Some(&op) =
                        REDUCE.iter().find(|r| Op::Reduce { op: **r, axes: vec![] }.mnemonic() == m)
                    else {
                        return c.err_at(at, format!("unknown reduction `{m}`"));
                    };
                    c.key("axes")?;
                    Op::Reduce { op, axes: c.list(Cursor::usize)? }
                }
                "permute" => {
                    c.key("perm")?;
                    Op::Permute { perm: c.list(Cursor::usize)? }
                }
                "slice" => {
                    c.key("axis")?;
                    let axis = c.usize()?;
                    c.expect(",")?;
                    let start = c.usize()?;
                    c.expect("..")?;
                    let end_at = c.pos;
                    let end = c.usize()?;
                    if end < start {
                        return c.err_at(end_at, format!("slice end {end} is before its start {start}"));
                    }
                    Op::Slice { axis, start, len: end - start }
                }
                "pad" => {
                    c.key("axis")?;
                    let axis = c.usize()?;
                    c.expect(",")?;
                    let before = c.usize()?;
                    c.expect(",")?;
                    let after = c.usize()?;
                    Op::Pad { axis, before, after }
                }
                "concat" => {
                    c.key("axis")?;
                    Op::Concat { axis: c.usize()? }
                }
                "matmul" => {
                    c.key("trans")?;
                    let trans = c.pair(Cursor::bool)?;
                    let conj = conj(c)?;
                    let sum_batch = c.eat(",") && {
                        c.expect("sum_batch")?;
                        true
                    };
                    Op::MatMul { trans, conj, sum_batch }
                }
                "conv2d" => {
                    let geom = geom(c)?;
                    Op::Conv2d { geom, conj: conj(c)? }
                }
                "conv_transpose2d" => {
                    let geom = geom(c)?;
                    c.expect(",")?;
                    c.key("out")?;
                    let out_hw = c.pair(Cursor::usize)?;
                    Op::ConvTranspose2d { geom, out_hw, conj: conj(c)? }
                }
                "conv2d_weight_grad" => {
                    let geom = geom(c)?;
                    c.expect(",")?;
                    c.key("kernel")?;
                    let kernel = c.pair(Cursor::usize)?;
                    Op::Conv2dWeightGrad { geom, kernel, conj: conj(c)? }
                }
                "fft" | "ifft" => {
                    c.key("axis")?;
                    let axis = c.usize()?;
                    c.expect(",")?;
                    c.key("norm")?;
                    let norm_at = c.pos;
                    let norm = match c.ident()? {
                        "Backward" => FftNorm::Backward,
                        "Ortho" => FftNorm::Ortho,
                        "Forward" => FftNorm::Forward,
                        n => {
                            return c.err_at(
                                norm_at,
                                format!("unknown FFT norm `{n}` (Backward, Ortho, Forward)"),
                            )
                        }
                    };
                    Op::Fft { axis, inverse: mnemonic == "ifft", norm }
                }
                "one_hot" => {
                    c.key("classes")?;
                    Op::OneHot { classes: c.usize()? }
                }
                "scatter_add" => {
                    c.key("rows")?;
                    Op::ScatterAdd { rows: c.usize()? }
                }
                "dropout_mask" => {
                    c.key("p")?;
                    let p = c.f64()?;
                    c.expect(",")?;
                    c.key("salt")?;
                    Op::DropoutMask { p, salt: c.number("a 32-bit salt")? }
                }
                "attn_lse" => Op::AttnLse { spec: attn_spec(c)? },
                "attention" => Op::Attention { spec: attn_spec(c)? },
                "attention_grad" => {
                    let spec = attn_spec(c)?;
                    c.expect(",")?;
                    c.key("wrt")?;
                    let wrt_at = c.pos;
                    let wrt = match c.ident()? {
                        "Q" => AttnWrt::Q,
                        "KV" => AttnWrt::KV,
                        w => return c.err_at(wrt_at, format!("unknown attention gradient `{w}` (Q or KV)")),
                    };
                    Op::AttentionGrad { spec, wrt }
                }
                "recurrence" => Op::Recurrence { spec: rnn_spec(c)? },
                "recurrence_grad" => Op::RecurrenceGrad { spec: rnn_spec(c)? },
                m => return c.err_at(at, format!("unknown op `{m}`")),
            };
            c.expect("]")?;
            op
        }
    };
    Ok(op)
}

/// `cell=Gru|Lstm, hidden=H, reverse=B` then `, init=true` when the op has an `h0` operand.
fn rnn_spec(c: &mut Cursor) -> Res<RnnSpec> {
    c.key("cell")?;
    let cell_at = c.pos;
    let cell = match c.ident()? {
        "Gru" => RnnCell::Gru,
        "Lstm" => RnnCell::Lstm,
        w => return c.err_at(cell_at, format!("unknown recurrent cell `{w}` (Gru or Lstm)")),
    };
    c.expect(",")?;
    c.key("hidden")?;
    let hidden = c.usize()?;
    c.expect(",")?;
    c.key("reverse")?;
    let reverse = c.bool()?;
    let init = if c.eat(",") {
        c.key("init")?;
        c.bool()?
    } else {
        false
    };
    Ok(RnnSpec { cell, hidden, reverse, init })
}

/// `heads=N, d=D, dv=DV, cols=[Q, K, V], scale=S, score=Real|Abs, causal=B, key_mask=B,
/// dropout=none|[P, SALT]`.
fn attn_spec(c: &mut Cursor) -> Res<AttnSpec> {
    let field = |c: &mut Cursor, name: &str| -> Res<usize> {
        c.key(name)?;
        let n = c.usize()?;
        c.expect(",")?;
        Ok(n)
    };
    let (n, d, dv) = (field(c, "heads")?, field(c, "d")?, field(c, "dv")?);
    c.key("cols")?;
    let cols_at = c.pos;
    let cols: [usize; 3] = match c.list(|c| c.usize())?.try_into() {
        Ok(cols) => cols,
        Err(_) => return c.err_at(cols_at, "attention columns are a list of 3 (query, key, value)"),
    };
    c.expect(",")?;
    let heads = AttnHeads { n, d, dv, cols };
    c.key("scale")?;
    let scale = c.f64()?;
    c.expect(",")?;
    c.key("score")?;
    let score_at = c.pos;
    let score = match c.ident()? {
        "Real" => AttnScore::Real,
        "Abs" => AttnScore::Abs,
        s => return c.err_at(score_at, format!("unknown attention score `{s}` (Real or Abs)")),
    };
    c.expect(",")?;
    c.key("causal")?;
    let causal = c.bool()?;
    c.expect(",")?;
    c.key("key_mask")?;
    let key_mask = c.bool()?;
    c.expect(",")?;
    c.key("dropout")?;
    let dropout = if c.eat("none") {
        None
    } else {
        c.expect("[")?;
        let p = c.f64()?;
        c.expect(",")?;
        let salt = c.number("a 32-bit salt")?;
        c.expect("]")?;
        Some((p, salt))
    };
    Ok(AttnSpec { heads, scale, score, causal, key_mask, dropout })
}

/// An initialiser as `{:?}` writes it: `Zeros`, `Constant(0.5)`, `Glorot { fan_in: 3, fan_out: 4 }`.
fn init(c: &mut Cursor) -> Res<Init> {
    let at = {
        c.skip_ws();
        c.pos
    };
    let field = |c: &mut Cursor, name: &str| -> Res<usize> {
        c.expect(name)?;
        c.expect(":")?;
        c.usize()
    };
    Ok(match c.ident()? {
        "Zeros" => Init::Zeros,
        "Ones" => Init::Ones,
        "Constant" => {
            c.expect("(")?;
            let v = c.f64()?;
            c.expect(")")?;
            Init::Constant(v)
        }
        "Glorot" | "Rayleigh" => {
            let kind = &c.text[at..c.pos];
            c.expect("{")?;
            let fan_in = field(c, "fan_in")?;
            c.expect(",")?;
            let fan_out = field(c, "fan_out")?;
            c.expect("}")?;
            if kind == "Glorot" {
                Init::Glorot { fan_in, fan_out }
            } else {
                Init::Rayleigh { fan_in, fan_out }
            }
        }
        "He" => {
            c.expect("{")?;
            let fan_in = field(c, "fan_in")?;
            c.expect("}")?;
            Init::He { fan_in }
        }
        "Uniform" => {
            c.expect("{")?;
            c.expect("bound")?;
            c.expect(":")?;
            let bound = c.f64()?;
            c.expect("}")?;
            Init::Uniform { bound }
        }
        "Eye2" => {
            c.expect("{")?;
            c.expect("scale")?;
            c.expect(":")?;
            let scale = c.f64()?;
            c.expect("}")?;
            Init::Eye2 { scale }
        }
        "Normal" => {
            c.expect("{")?;
            c.expect("std")?;
            c.expect(":")?;
            let std = c.f64()?;
            c.expect("}")?;
            Init::Normal { std }
        }
        i => return c.err_at(at, format!("unknown initialiser `{i}`")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::print::print_graph;

    #[test]
    fn op_tables_list_every_variant_once() {
        for (i, u) in UNARY.iter().enumerate() {
            assert_eq!(unary_slot(*u), i);
        }
        for (i, b) in BINARY.iter().enumerate() {
            assert_eq!(binary_slot(*b), i);
        }
        for (i, r) in REDUCE.iter().enumerate() {
            assert_eq!(reduce_slot(*r), i);
        }
    }

    const SMALL: &str = "graph m (Train) {
  %0 = input[x]() : f32[B, 3]  ; Input x @2
  %1 = param[w, init=Glorot { fan_in: 3, fan_out: 3 }]() : c64[3]  ; Param w @3
  %2 = mul(%0, %1) : c64[B, 3]  ; Forward y/mul @4
  %3 = abs2(%2) : f32[B, 3]  ; Forward y/abs2 @4
  %4 = reduce_sum[axes=[0, 1]](%3) : f32[1, 1]  ; Forward loss
  %5 = reshape(%4) : f32[]  ; Forward loss
  %6 = scalar[0.5*B^-1]() : f32[]  ; Forward
  %7 = mul(%5, %6) : f32[]  ; Forward mean loss @7
  output y = %2
  loss = %7
}
";

    #[test]
    fn printed_text_reads_back_identically() {
        let p = parse_graph(SMALL).expect("parses");
        assert_eq!(print_graph(&p.graph, Some(&p.source)), SMALL);
        assert_eq!(
            p.graph.node(Value::from_index(1)).op,
            Op::Param { name: "w".into(), init: Init::Glorot { fan_in: 3, fan_out: 3 } }
        );
        assert_eq!(p.graph.loss, Some(Value::from_index(7)));
    }

    #[test]
    fn hand_numbering_and_comments_are_accepted_and_renumbered() {
        let text = "; a comment\ngraph g (Eval) {\n\n  %10 = input[a]() : f32[2]  ; Input\n  ; inside\n  %20 = neg(%10) : f32[2]  ; Forward n\n  output n = %20\n}\n";
        let p = parse_graph(text).expect("parses");
        let printed = print_graph(&p.graph, None);
        assert_eq!(printed, "graph g (Eval) {\n  %0 = input[a]() : f32[2]  ; Input\n  %1 = neg(%0) : f32[2]  ; Forward n\n  output n = %1\n}\n");
    }

    fn error_of(text: &str) -> IrParseError {
        parse_graph(text).expect_err("must not parse")
    }

    #[test]
    fn errors_name_line_and_column() {
        let head = "graph g (Eval) {\n  %0 = input[a]() : f32[2]  ; Input\n";
        let e = error_of(&format!("{head}  %1 = nope(%0) : f32[2]  ; Forward\n}}\n"));
        assert_eq!((e.line, e.col), (3, 8), "{e}");
        assert!(e.message.contains("unknown op `nope`"), "{e}");
        let e = error_of(&format!("{head}  %1 = neg(%7) : f32[2]  ; Forward\n}}\n"));
        assert_eq!((e.line, e.col), (3, 12), "{e}");
        assert!(e.message.contains("%7 is not defined"), "{e}");
        let e = error_of(&format!("{head}  %1 = abs(%0) : c64[2]  ; Forward\n}}\n"));
        assert_eq!((e.line, e.col), (3, 18), "{e}");
        assert!(e.message.contains("f32[2]"), "{e}");
        let e = error_of(&format!("{head}  %1 = add(%0) : f32[2]  ; Forward\n}}\n"));
        assert!(e.message.contains("takes 2 operands"), "{e}");
        let e = error_of(&format!("{head}  %0 = neg(%0) : f32[2]  ; Forward\n}}\n"));
        assert!(e.message.contains("defined twice"), "{e}");
        let e = error_of(&format!("{head}  %1 = neg(%0) : f32[2]  ; Sideways\n}}\n"));
        assert!(e.message.contains("unknown role"), "{e}");
        let e = error_of(head);
        assert_eq!(e.line, 2);
        assert!(e.message.contains("closing"), "{e}");
        let e = error_of("graph g (Sometimes) {\n}\n");
        assert_eq!((e.line, e.col), (1, 10), "{e}");
        let e = error_of(&format!("{head}  %1 = reduce_sum[axes=[0](%0) : f32[1]  ; Forward\n}}\n"));
        assert_eq!(e.line, 3);
        let e = error_of(&format!("{head}  %1 = slice[axis=0, 2..1](%0) : f32[1]  ; Forward\n}}\n"));
        assert!(e.message.contains("before its start"), "{e}");
        let e = error_of(&format!("{head}}}\nmore\n"));
        assert!(e.message.contains("after the closing"), "{e}");
        // A read of an assign's result is caught by the verifier, at the reader's line.
        let e = error_of(
            "graph g (Train) {\n  %0 = param[w, init=Zeros]() : f32[2]  ; Param\n  %1 = input[a]() : f32[2]  ; Input\n  %2 = assign(%0, %1) : f32[2]  ; Update\n  %3 = neg(%2) : f32[2]  ; Update\n}\n",
        );
        assert_eq!(e.line, 5, "{e}");
        assert!(e.message.contains("assign"), "{e}");
    }

    #[test]
    fn every_attribute_form_reads_back() {
        let text = "graph a (Train) {
  %0 = input[x]() : c64[B, 2, 8, 8]  ; Input x
  %1 = param[k, init=He { fan_in: 18 }]() : c64[4, 2, 3, 3]  ; Param k
  %2 = conv2d[stride=[1, 1], pad=[1, 1], dilation=[1, 1], groups=1, conj=[false, false]](%0, %1) : c64[B, 4, 8, 8]  ; Forward c
  %3 = conv_transpose2d[stride=[1, 1], pad=[1, 1], dilation=[1, 1], groups=1, out=[8, 8], conj=[false, true]](%2, %1) : c64[B, 2, 8, 8]  ; Backward
  %4 = conv2d_weight_grad[stride=[1, 1], pad=[1, 1], dilation=[1, 1], groups=1, kernel=[3, 3], conj=[true, false]](%0, %2) : c64[4, 2, 3, 3]  ; Backward
  %5 = fft[axis=3, norm=Ortho](%2) : c64[B, 4, 8, 8]  ; Forward
  %6 = ifft[axis=3, norm=Backward](%5) : c64[B, 4, 8, 8]  ; Forward
  %7 = permute[perm=[0, 2, 3, 1]](%6) : c64[B, 8, 8, 4]  ; Forward
  %8 = slice[axis=3, 1..3](%7) : c64[B, 8, 8, 2]  ; Forward
  %9 = pad[axis=3, 1, 1](%8) : c64[B, 8, 8, 4]  ; Forward
  %10 = concat[axis=3](%9, %7) : c64[B, 8, 8, 8]  ; Forward
  %11 = reduce_maxmag[axes=[3]](%10) : c64[B, 8, 8, 1]  ; Forward
  %12 = state[step, init=Zeros]() : i32[]  ; State
  %13 = dropout_mask[p=0.25, salt=7](%12) : f32[B, 8, 8, 1]  ; Forward
  %14 = param[m, init=Uniform { bound: 0.125 }]() : f32[8, 8]  ; Param
  %15 = param[n, init=Rayleigh { fan_in: 8, fan_out: 8 }]() : c64[8, 8]  ; Param
  %16 = matmul[trans=[true, false], conj=[false, true]](%14, %15) : c64[8, 8]  ; Forward
  %17 = state[s, init=Constant(-1.5)]() : f32[]  ; State
  %18 = state[o, init=Ones]() : f32[]  ; State
  %19 = input[labels]() : i32[B]  ; Input
  %20 = one_hot[classes=10](%19) : f32[B, 10]  ; Forward
  %21 = scalar[-0.0001]() : f32[]  ; Forward
  %22 = select(%13, %11, %11) : c64[B, 8, 8, 1]  ; Forward
  %23 = expand(%17) : f32[B, 10]  ; Forward
  %24 = assign(%17, %21) : f32[]  ; Update
  %25 = input[q]() : c64[B, 5, 6]  ; Input
  %26 = input[k]() : c64[B, 4, 18]  ; Input
  %27 = input[v]() : c64[B, 4, 12]  ; Input
  %28 = input[pad]() : f32[B, 4]  ; Input
  %29 = attn_lse[heads=2, d=3, dv=6, cols=[0, 0, 0], scale=0.5, score=Abs, causal=true, key_mask=true, dropout=none](%25, %26, %28) : f32[B, 2, 5]  ; Forward
  %30 = attention[heads=2, d=3, dv=6, cols=[0, 6, 0], scale=0.5, score=Real, causal=false, key_mask=false, dropout=[0.25, 9]](%25, %26, %27, %29, %12) : c64[B, 5, 12]  ; Forward
  %31 = attention_grad[heads=2, d=3, dv=6, cols=[0, 0, 6], scale=0.5, score=Real, causal=false, key_mask=false, dropout=[0.25, 9], wrt=KV](%25, %26, %26, %30, %30, %29, %12) : c64[B, 4, 18]  ; Backward
  %32 = attention_grad[heads=2, d=3, dv=6, cols=[0, 0, 0], scale=0.5, score=Abs, causal=true, key_mask=true, dropout=none, wrt=Q](%25, %26, %27, %30, %30, %29, %28) : c64[B, 5, 6]  ; Backward
  %33 = param[e, init=Normal { std: 0.02 }]() : c64[10, 8]  ; Param
  %34 = gather(%33, %19) : c64[B, 8]  ; Forward
  %35 = scatter_add[rows=10](%34, %19) : c64[10, 8]  ; Backward
  %36 = gelutanh(%14) : f32[8, 8]  ; Forward
  %37 = gelutanhgrad(%36) : f32[8, 8]  ; Backward
  %38 = input[xp]() : c64[B, 5, 6]  ; Input
  %39 = param[w_hh, init=Zeros]() : c64[6, 2]  ; Param
  %40 = param[b_hh, init=Zeros]() : c64[6]  ; Param
  %41 = recurrence[cell=Gru, hidden=2, reverse=true](%38, %39, %40) : c64[B, 5, 2]  ; Forward
  %42 = recurrence_grad[cell=Gru, hidden=2, reverse=true](%38, %39, %40, %41, %41) : c64[B, 5, 14]  ; Backward
}
";
        let p = parse_graph(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(print_graph(&p.graph, None), text);
    }
}
