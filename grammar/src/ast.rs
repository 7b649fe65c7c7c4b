//! The `.cvnn` syntax tree: every node carries the byte [`Span`] of the text that made it.

use crate::Span;
use serde::Serialize;

/// A whole `.cvnn` file: models and train sections in source order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct File {
    /// The items in source order.
    pub items: Vec<Item>,
    /// The whole file.
    pub span: Span,
}

impl File {
    /// The models, in source order.
    pub fn models(&self) -> impl Iterator<Item = &Model> {
        self.items.iter().filter_map(|i| match i {
            Item::Model(m) => Some(m),
            Item::Train(_) => None,
        })
    }
    /// The train sections, in source order.
    pub fn trains(&self) -> impl Iterator<Item = &Train> {
        self.items.iter().filter_map(|i| match i {
            Item::Train(t) => Some(t),
            Item::Model(_) => None,
        })
    }
}

/// A top-level item.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Item {
    /// `model Name { ... }`.
    Model(Model),
    /// `train Name { ... }`.
    Train(Train),
}

/// A name as written, with its span.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ident {
    /// The text.
    pub name: String,
    /// Where it is.
    pub span: Span,
}

/// `model Name { items }`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Model {
    /// The model's name.
    pub name: Ident,
    /// Inputs, blocks, bindings, outputs and the loss, in source order.
    pub items: Vec<ModelItem>,
    /// The whole model.
    pub span: Span,
}

/// One line (or block definition) of a model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum ModelItem {
    /// `input x: c64[B, 1, 64, 64]`.
    Input(InputDecl),
    /// `param pos: c64[1, 256, 192] = normal(std = 0.02)`.
    Param(ParamDecl),
    /// `block unit(c) { ... }`.
    Block(BlockDef),
    /// `h = expr`.
    Binding(Binding),
    /// `output a, b`.
    Output(OutputDecl),
    /// `loss expr`.
    Loss(LossDecl),
}

/// `input name: type`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InputDecl {
    /// The input's name.
    pub name: Ident,
    /// Its declared type.
    pub ty: InputType,
    /// The whole declaration.
    pub span: Span,
}

/// `param name: type = init`: a learned tensor of fixed shape.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ParamDecl {
    /// The parameter's name (also its name in checkpoints).
    pub name: Ident,
    /// Its declared type, written as an input's (checked by the compiler: no `B`, no `of`).
    pub ty: InputType,
    /// The initialiser: `zeros`, `ones`, `normal(std = s)`, `uniform(bound = b)`, `glorot`.
    pub init: Expr,
    /// The whole declaration.
    pub span: Span,
}

/// `c64[B, 1, 64]`, `f32[B, 128]` or `class[B] of 10`, as written (checked by the compiler).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InputType {
    /// Element type word: `c64`, `f32` or `class`.
    pub elem: Ident,
    /// The dimensions.
    pub dims: Vec<DimExpr>,
    /// `of N` (class labels): the number and its span.
    pub classes: Option<(i64, Span)>,
    /// The whole type.
    pub span: Span,
}

/// One dimension of an input type.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DimExpr {
    /// A number or a name (`B`).
    pub kind: DimKind,
    /// Where it is.
    pub span: Span,
}

/// What a dimension says.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum DimKind {
    /// A constant extent.
    Int(i64),
    /// A symbolic extent (only `B`, the batch, is allowed).
    Name(String),
}

/// `block name(params) { stage stage ... }`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockDef {
    /// The block's name.
    pub name: Ident,
    /// Compile-time parameters.
    pub params: Vec<Ident>,
    /// Stages applied in order, as a pipeline.
    pub body: Vec<Stage>,
    /// The whole definition.
    pub span: Span,
}

/// `name = expr`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Binding {
    /// The bound name.
    pub name: Ident,
    /// Its value.
    pub value: Expr,
    /// The whole line.
    pub span: Span,
}

/// `output a, b`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutputDecl {
    /// The bindings read after a step.
    pub names: Vec<Ident>,
    /// The whole line.
    pub span: Span,
}

/// `loss expr`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LossDecl {
    /// The scalar loss.
    pub value: Expr,
    /// The whole line.
    pub span: Span,
}

/// `train Model { key = value ... }`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Train {
    /// The model trained.
    pub model: Ident,
    /// The settings in source order.
    pub settings: Vec<Setting>,
    /// The whole section.
    pub span: Span,
}

/// `key = value` in a train section.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Setting {
    /// The key.
    pub key: Ident,
    /// The value.
    pub value: Expr,
    /// The whole line.
    pub span: Span,
}

/// A possibly dotted name: `conv2d`, `synthetic.rf`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Path {
    /// The parts between dots.
    pub parts: Vec<Ident>,
    /// The whole name.
    pub span: Span,
}

impl Path {
    /// The name as written, parts joined by `.`.
    pub fn text(&self) -> String {
        self.parts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(".")
    }
}

/// One pipeline stage: an operator or block applied to the piped value.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stage {
    /// The operator or block name.
    pub callee: Path,
    /// Arguments; empty when written without parentheses.
    pub args: Vec<Arg>,
    /// The whole stage.
    pub span: Span,
}

/// A call argument: positional, or `name = value`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Arg {
    /// Keyword, when given.
    pub name: Option<Ident>,
    /// The value.
    pub value: Expr,
    /// The whole argument.
    pub span: Span,
}

/// An expression with its span.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Expr {
    /// What it is.
    pub kind: ExprKind,
    /// Where it is (parentheses included).
    pub span: Span,
}

/// Arithmetic operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ArithOp {
    /// `+`.
    Add,
    /// `-`.
    Sub,
    /// `*`.
    Mul,
    /// `/`.
    Div,
}

impl ArithOp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            ArithOp::Add => "+",
            ArithOp::Sub => "-",
            ArithOp::Mul => "*",
            ArithOp::Div => "/",
        }
    }
}

/// The kinds of expression.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum ExprKind {
    /// An integer literal.
    Int(i64),
    /// A float literal.
    Float(f64),
    /// A number with a unit, as written (`4GiB`, `4g`, `2GB`): a byte size, read by the
    /// compiler's one byte-size parser (`cvc_compiler::units::parse_bytes`), which also
    /// reports unknown units.
    Size(String),
    /// `true` / `false`.
    Bool(bool),
    /// A string literal (escapes resolved).
    Str(String),
    /// `a..b`.
    Range(f64, f64),
    /// A name: a tensor, a block parameter, or a word such as `whitening`.
    Name(String),
    /// `(a, b, ...)`.
    Tuple(Vec<Expr>),
    /// `f(args)`.
    Call {
        /// The callee.
        callee: Path,
        /// The arguments.
        args: Vec<Arg>,
    },
    /// A left-associative chain of operators of one precedence level: `a + b - c`.
    Arith {
        /// The first operand.
        first: Box<Expr>,
        /// Each operator (with its span) and its right operand.
        rest: Vec<(ArithOp, Span, Expr)>,
    },
    /// `head |> stage |> stage`.
    Pipe {
        /// The value piped in.
        head: Box<Expr>,
        /// The stages, applied left to right.
        stages: Vec<Stage>,
    },
}
