//! Lowers one checked model to IR: evaluates compile-time values, expands blocks, and hands
//! every operator application to [`layers::lower_layer`], recording a table row for each.

use super::combinators;
use super::layers::{self, Arg, ArgValue, LayerCall, LowerCtx, Operand};
use super::resolve::{self, did_you_mean};
use super::{ModelInput, TableRow};
use crate::diag::Diagnostic;
use crate::ir::{DType, Graph, Mode, Op, Output, Role, Shape, Value};
use cvc_grammar::ast::{self, ArithOp, Expr, ExprKind, ModelItem};
use cvc_grammar::Span;
use std::collections::HashMap;

/// Most operator applications one model may expand to (blocks can nest exponentially).
const MAX_LAYERS: usize = 20_000;

/// A model lowered to a graph, with its inputs, parameters and layer table.
pub struct Lowered {
    /// The graph (outputs and loss set).
    pub graph: Graph,
    /// The declared inputs.
    pub inputs: Vec<ModelInput>,
    /// Parameters in creation order.
    pub params: Vec<layers::ParamInfo>,
    /// One row per input and operator application.
    pub table: Vec<TableRow>,
    /// The model's tensor bindings in source order: name, value, the name's span (for the
    /// warnings about bindings that reach no loss).
    pub bindings: Vec<(String, Value, Span)>,
}

/// What a name or expression evaluates to.
#[derive(Clone, Debug)]
enum Val {
    /// A tensor in the graph.
    Tensor(Value),
    /// A compile-time value.
    Const(ArgValue),
}

/// A scope entry.
#[derive(Clone, Debug)]
enum Entry {
    /// A value and the span that defined it.
    Val(Val, Span),
    /// A binding whose definition failed (its uses are not reported again).
    Poisoned(Span),
}

/// Why evaluation stopped: a new diagnostic, or an error already reported.
enum Fail {
    Diag(Box<Diagnostic>),
    Reported,
}

impl From<Diagnostic> for Fail {
    fn from(d: Diagnostic) -> Self {
        Fail::Diag(Box::new(d))
    }
}

type Res<T> = Result<T, Fail>;

/// Names visible to an expression: model bindings and inputs, or a block's parameters.
struct Scope<'s> {
    names: HashMap<String, Entry>,
    /// The block being expanded (its parameters and the model's constants are the only
    /// names), if any.
    block: Option<&'s str>,
}

struct Lowerer<'m, 'g> {
    ctx: LowerCtx<'g>,
    src: &'m str,
    blocks: HashMap<&'m str, &'m ast::BlockDef>,
    defs: HashMap<&'m str, Span>,
    table: Vec<TableRow>,
    /// Calls per `(binding, op)`, for parameter prefixes.
    counters: HashMap<(String, String), usize>,
    /// The binding being lowered (labels and parameter prefixes).
    binding: String,
    /// Blocks being expanded, innermost last.
    expanding: Vec<&'m str>,
    /// Model-level constants (`width = 16`), visible inside blocks too.
    consts: HashMap<String, (ArgValue, Span)>,
    /// Where the outermost block being expanded is used (table rows show that line).
    use_site: Option<Span>,
    /// The model's tensor bindings so far (see [`Lowered::bindings`]).
    bindings: Vec<(String, Value, Span)>,
    layers: usize,
}

/// Lowers `model` in `mode`. Errors are collected; lowering goes on after a failed binding
/// so that one run reports every independent mistake.
pub fn lower_model(model: &ast::Model, src: &str, mode: Mode) -> Result<Lowered, Vec<Diagnostic>> {
    let mut diags = Vec::new();
    let blocks = resolve::collect_blocks(model, &mut diags);
    let mut graph = Graph::new(&model.name.name, mode);
    let (inputs, table, params, bindings) = {
        let mut l = Lowerer {
            ctx: LowerCtx::new(&mut graph, mode),
            src,
            blocks,
            defs: resolve::definitions(model),
            table: Vec::new(),
            counters: HashMap::new(),
            binding: String::new(),
            expanding: Vec::new(),
            use_site: None,
            consts: HashMap::new(),
            bindings: Vec::new(),
            layers: 0,
        };
        let mut inputs = l.lower_items(model, &mut diags);
        for i in &mut inputs {
            i.ignore_index = l.ctx.ignore_index.get(&i.value).map(|&(k, _)| k);
        }
        (
            inputs,
            std::mem::take(&mut l.table),
            std::mem::take(&mut l.ctx.params),
            std::mem::take(&mut l.bindings),
        )
    };
    if !diags.is_empty() {
        return Err(diags);
    }
    if cfg!(debug_assertions) {
        if let Err(e) = crate::ir::verify::verify(&graph) {
            panic!("IR of model `{}` fails verification after lowering: {e}", model.name.name);
        }
    }
    Ok(Lowered { graph, inputs, params, table, bindings })
}

fn push_fail(diags: &mut Vec<Diagnostic>, f: Fail) {
    if let Fail::Diag(d) = f {
        diags.push(*d);
    }
}

impl<'m> Lowerer<'m, '_> {
    fn lower_items(&mut self, model: &'m ast::Model, diags: &mut Vec<Diagnostic>) -> Vec<ModelInput> {
        let mut scope = Scope { names: HashMap::new(), block: None };
        let mut inputs = Vec::new();
        for item in &model.items {
            match item {
                ModelItem::Input(decl) => {
                    if let Err(d) = self.duplicate_check(&scope, &decl.name) {
                        diags.push(d);
                        continue;
                    }
                    match resolve::input_type(decl) {
                        Ok((ty, classes)) => {
                            self.ctx.b.at(decl.span, Role::Input, decl.name.name.clone());
                            let v = self.ctx.b.leaf(Op::Input { name: decl.name.name.clone() }, ty.clone());
                            if let Some(c) = classes {
                                self.ctx.classes.insert(v, (c, decl.span));
                            }
                            scope
                                .names
                                .insert(decl.name.name.clone(), Entry::Val(Val::Tensor(v), decl.name.span));
                            self.table.push(TableRow {
                                label: decl.name.name.clone(),
                                op: "input".into(),
                                shape: ty.shape.clone(),
                                dtype: ty.dtype,
                                params_complex: 0,
                                params_real: 0,
                                line: decl.span.line_col(self.src).0,
                            });
                            inputs.push(ModelInput {
                                name: decl.name.name.clone(),
                                ty,
                                classes,
                                ignore_index: None,
                                span: decl.span,
                                value: v,
                            });
                        }
                        Err(d) => {
                            diags.push(d);
                            scope.names.insert(decl.name.name.clone(), Entry::Poisoned(decl.name.span));
                        }
                    }
                }
                ModelItem::Param(decl) => {
                    if let Err(d) = self.duplicate_check(&scope, &decl.name) {
                        diags.push(d);
                        continue;
                    }
                    match self.lower_param(decl, &scope) {
                        Ok(v) => {
                            scope
                                .names
                                .insert(decl.name.name.clone(), Entry::Val(Val::Tensor(v), decl.name.span));
                        }
                        Err(f) => {
                            push_fail(diags, f);
                            scope.names.insert(decl.name.name.clone(), Entry::Poisoned(decl.name.span));
                        }
                    }
                }
                ModelItem::Binding(b) => {
                    if let Err(d) = self.duplicate_check(&scope, &b.name) {
                        diags.push(d);
                        continue;
                    }
                    self.binding = b.name.name.clone();
                    match self.eval(&b.value, &scope, false) {
                        Ok(v) => {
                            match &v {
                                Val::Const(c) => {
                                    self.consts.insert(b.name.name.clone(), (c.clone(), b.name.span));
                                }
                                Val::Tensor(t) => self.bindings.push((b.name.name.clone(), *t, b.name.span)),
                            }
                            scope.names.insert(b.name.name.clone(), Entry::Val(v, b.name.span));
                        }
                        Err(f) => {
                            push_fail(diags, f);
                            scope.names.insert(b.name.name.clone(), Entry::Poisoned(b.name.span));
                        }
                    }
                }
                ModelItem::Block(_) | ModelItem::Output(_) | ModelItem::Loss(_) => {}
            }
        }
        self.lower_outputs(model, &scope, diags);
        self.lower_loss(model, &scope, diags);
        if inputs.is_empty() && diags.is_empty() {
            diags.push(
                Diagnostic::error(
                    format!("model `{}` has no input", model.name.name),
                    model.name.span,
                    "no `input` line",
                )
                .with_help("declare one, e.g. `input x: c64[B, 1, 64, 64]`"),
            );
        }
        inputs
    }

    /// Lowers `param NAME: TYPE = INIT` to a `Param` leaf named `NAME`, with its table row.
    fn lower_param(&mut self, decl: &ast::ParamDecl, scope: &Scope) -> Res<Value> {
        let ty = resolve::param_type(decl)?;
        let (init_name, init_span, args): (&str, Span, &[ast::Arg]) =
            match &decl.init.kind {
                ExprKind::Name(n) => (n, decl.init.span, &[]),
                ExprKind::Call { callee, args } if callee.parts.len() == 1 => {
                    (&callee.parts[0].name, callee.span, args)
                }
                _ => return Err(Diagnostic::error(
                    "expected an initialiser",
                    decl.init.span,
                    "not an initialiser",
                )
                .with_note(
                    "initialisers are `zeros`, `ones`, `normal(std = s)`, `uniform(bound = b)` and `glorot`",
                )
                .into()),
            };
        let mut evaluated = Vec::with_capacity(args.len());
        for a in args {
            match self.eval(&a.value, scope, true)? {
                Val::Const(c) => evaluated.push((a.name.as_ref().map(|k| k.name.clone()), c, a.span)),
                Val::Tensor(_) => {
                    return Err(Diagnostic::error(
                        "an initialiser's argument must be a compile-time number",
                        a.value.span,
                        "a tensor",
                    )
                    .into())
                }
            }
        }
        let extents: Vec<usize> = ty.shape.0.iter().filter_map(|d| d.fixed()).collect();
        let init = resolve::param_init(init_name, init_span, &evaluated, &extents)?;
        let name = decl.name.name.clone();
        self.ctx.b.at(decl.span, Role::Param, name.clone());
        let v = self.ctx.declared_param(&name, init, ty.clone());
        let n = ty.shape.fixed_numel();
        let (pc, pr) = if ty.dtype.is_complex() { (n, 2 * n) } else { (0, n) };
        let init_text = &self.src[decl.init.span.range()];
        self.table.push(TableRow {
            label: name,
            op: format!("param = {}", init_text.split_whitespace().collect::<Vec<_>>().join(" ")),
            shape: ty.shape,
            dtype: ty.dtype,
            params_complex: pc,
            params_real: pr,
            line: decl.span.line_col(self.src).0,
        });
        Ok(v)
    }

    fn duplicate_check(&self, scope: &Scope, name: &ast::Ident) -> Result<(), Diagnostic> {
        let first = match scope.names.get(&name.name) {
            Some(Entry::Val(_, s)) | Some(Entry::Poisoned(s)) => *s,
            None => return Ok(()),
        };
        Err(Diagnostic::error(format!("`{}` is defined twice", name.name), name.span, "defined again here")
            .with_label(first, "first defined here")
            .with_help("bindings are immutable: give the new value another name, e.g. `h2`"))
    }

    fn lower_outputs(&mut self, model: &ast::Model, scope: &Scope, diags: &mut Vec<Diagnostic>) {
        let mut seen: HashMap<&str, Span> = HashMap::new();
        for item in &model.items {
            let ModelItem::Output(o) = item else { continue };
            for n in &o.names {
                if let Some(first) = seen.insert(&n.name, n.span) {
                    diags.push(
                        Diagnostic::error(
                            format!("`{}` is an output twice", n.name),
                            n.span,
                            "repeated output",
                        )
                        .with_label(first, "first listed here"),
                    );
                    continue;
                }
                match self.lookup(&n.name, n.span, scope) {
                    Ok(Val::Tensor(v)) => {
                        self.ctx.b.graph.outputs.push(Output { name: n.name.clone(), value: v })
                    }
                    Ok(Val::Const(_)) => diags.push(
                        Diagnostic::error(
                            format!("`{}` is a constant, not a tensor", n.name),
                            n.span,
                            "not a tensor",
                        )
                        .with_help("outputs name tensors computed by the model"),
                    ),
                    Err(f) => push_fail(diags, f),
                }
            }
        }
    }

    fn lower_loss(&mut self, model: &ast::Model, scope: &Scope, diags: &mut Vec<Diagnostic>) {
        let mut first: Option<Span> = None;
        for item in &model.items {
            let ModelItem::Loss(l) = item else { continue };
            if let Some(f) = first {
                diags.push(
                    Diagnostic::error("a model has one loss", l.span, "second loss")
                        .with_label(f, "first loss")
                        .with_help("add the terms into one expression: `loss mse(a, t) + 0.1 * l1(b, t)`"),
                );
                continue;
            }
            first = Some(l.span);
            self.binding = "loss".into();
            match self.eval(&l.value, scope, false) {
                Ok(Val::Tensor(v)) => {
                    let ty = self.ctx.b.graph.ty(v).clone();
                    if ty.dtype != DType::F32 || ty.shape != Shape::scalar() {
                        diags.push(
                            Diagnostic::error(format!("the loss must be a real scalar, got {ty}"), l.value.span, format!("this is {ty}"))
                                .with_help("use a loss operator (`cross_entropy`, `mse`, `l1`), which reduces to one real number"),
                        );
                    } else {
                        self.ctx.b.graph.loss = Some(v);
                    }
                }
                Ok(Val::Const(_)) => diags.push(
                    Diagnostic::error("the loss must be computed from tensors", l.value.span, "a constant")
                        .with_help("write e.g. `loss cross_entropy(logits, label)`"),
                ),
                Err(f) => push_fail(diags, f),
            }
        }
    }

    // ------------------------------------------------------------ expressions

    fn lookup(&self, name: &str, span: Span, scope: &Scope) -> Res<Val> {
        match scope.names.get(name) {
            Some(Entry::Val(v, _)) => return Ok(v.clone()),
            Some(Entry::Poisoned(_)) => return Err(Fail::Reported),
            None => {}
        }
        if let Some(block) = scope.block {
            let mut d = Diagnostic::error(
                format!("unknown name `{name}` in block `{block}`"),
                span,
                "not a parameter of this block",
            );
            let params: Vec<&str> = scope.names.keys().map(String::as_str).collect();
            if let Some(s) = did_you_mean(name, params.iter().copied()) {
                d = d.with_help(format!("did you mean `{s}`?"));
            } else if self.defs.contains_key(name) {
                d = d.with_help(format!(
                    "blocks see their parameters and the model's constants; `{name}` is a tensor: pipe it in, or add a parameter"
                ));
            }
            return Err(d.into());
        }
        if let Some(&def) = self.defs.get(name) {
            if def.start > span.start {
                return Err(Diagnostic::error(
                    format!("`{name}` is used before it is defined"),
                    span,
                    "used here",
                )
                .with_label(def, "defined later here")
                .with_help(format!("move the definition of `{name}` above this line"))
                .into());
            }
        }
        let mut d = Diagnostic::error(format!("unknown name `{name}`"), span, "not defined");
        let names: Vec<&str> = scope.names.keys().map(String::as_str).collect();
        if let Some(s) = did_you_mean(name, names.iter().copied()) {
            d = d.with_help(format!("did you mean `{s}`?"));
        } else if layers::known_ops().contains(&name)
            || self.blocks.contains_key(name)
            || combinators::is_combinator(name)
        {
            d = d.with_help(format!("`{name}` is an operator: apply it with `x |> {name}` or `{name}(x)`"));
        } else {
            d = d.with_help("names are inputs (`input x: ...`) or bindings (`x = ...`) defined above");
        }
        Err(d.into())
    }

    /// Evaluates `e`. `word_ok`: an unknown bare name is a word (`kind = whitening`), not an error.
    fn eval(&mut self, e: &Expr, scope: &Scope, word_ok: bool) -> Res<Val> {
        match &e.kind {
            ExprKind::Int(n) => Ok(Val::Const(ArgValue::Int(*n))),
            ExprKind::Float(x) => Ok(Val::Const(ArgValue::Float(*x))),
            ExprKind::Size(text) => {
                let n = crate::units::parse_bytes(text)
                    .map_err(|err| Diagnostic::error(err.to_string(), e.span, "not a byte size"))?;
                Ok(Val::Const(ArgValue::Int(i64::try_from(n).unwrap_or(i64::MAX))))
            }
            ExprKind::Bool(b) => Ok(Val::Const(ArgValue::Bool(*b))),
            ExprKind::Str(s) => Ok(Val::Const(ArgValue::Str(s.clone()))),
            ExprKind::Range(a, b) => Ok(Val::Const(ArgValue::Range(*a, *b))),
            ExprKind::Name(n) => {
                if word_ok && !scope.names.contains_key(n) {
                    return Ok(Val::Const(ArgValue::Ident(n.clone())));
                }
                self.lookup(n, e.span, scope)
            }
            ExprKind::Tuple(items) => {
                // Integers stay exact; one float makes the whole tuple numbers (`weight = (1, 0.5)`).
                let mut out: Vec<ArgValue> = Vec::with_capacity(items.len());
                for it in items {
                    match self.eval(it, scope, false)? {
                        Val::Const(c @ (ArgValue::Int(_) | ArgValue::Float(_))) => out.push(c),
                        other => {
                            return Err(Diagnostic::error(
                                "tuples hold numbers",
                                it.span,
                                format!("this is {}", describe(&other)),
                            )
                            .with_help("write e.g. `kernel = (3, 5)` or `weight = (1.0, 0.5)`")
                            .into())
                        }
                    }
                }
                let ints: Option<Vec<i64>> =
                    out.iter().map(|c| if let ArgValue::Int(n) = c { Some(*n) } else { None }).collect();
                if let Some(ints) = ints {
                    return Ok(Val::Const(ArgValue::Tuple(ints)));
                }
                let nums = out
                    .iter()
                    .map(|c| match c {
                        ArgValue::Int(n) => *n as f64,
                        ArgValue::Float(x) => *x,
                        _ => unreachable!("only numbers were collected"),
                    })
                    .collect();
                Ok(Val::Const(ArgValue::Numbers(nums)))
            }
            ExprKind::Call { callee, args } => self.apply(callee, args, None, e.span, scope),
            ExprKind::Pipe { head, stages } => {
                let mut cur = match self.eval(head, scope, false)? {
                    Val::Tensor(v) => Operand { value: v, span: head.span },
                    Val::Const(c) => {
                        return Err(Diagnostic::error(
                            "only tensors can be piped",
                            head.span,
                            format!("this is {}", describe(&Val::Const(c))),
                        )
                        .with_help("start a pipeline with an input or a binding: `x |> crelu`")
                        .into())
                    }
                };
                for s in stages {
                    let v = self.apply(&s.callee, &s.args, Some(cur), s.span, scope)?;
                    let Val::Tensor(v) = v else { unreachable_const(s.span)? };
                    cur = Operand { value: v, span: head.span.join(s.span) };
                }
                Ok(Val::Tensor(cur.value))
            }
            ExprKind::Arith { first, rest } => {
                let mut acc = self.eval(first, scope, false)?;
                let mut acc_span = first.span;
                for (op, op_span, rhs) in rest {
                    let r = self.eval(rhs, scope, false)?;
                    let span = acc_span.join(rhs.span);
                    acc = self.arith(*op, *op_span, (acc, acc_span), (r, rhs.span), span)?;
                    acc_span = span;
                }
                Ok(acc)
            }
        }
    }

    /// `a op b` on constants (folded) or tensors (lowered as the layer `+`, `-`, `*`, `/`).
    fn arith(
        &mut self,
        op: ArithOp,
        op_span: Span,
        (a, sa): (Val, Span),
        (b, sb): (Val, Span),
        span: Span,
    ) -> Res<Val> {
        // Constants are folded without building the table text: in a sum of many terms `sa`
        // spans everything so far, and excerpting it at every step made checking quadratic.
        let shown = |this: &Self| format!("{} {} {}", this.excerpt(sa), op.symbol(), this.excerpt(sb));
        match (a, b) {
            (Val::Const(x), Val::Const(y)) => fold(op, op_span, (&x, sa), (&y, sb)).map(Val::Const),
            (Val::Tensor(x), Val::Tensor(y)) => {
                let shown = shown(self);
                let ops = [Operand { value: x, span: sa }, Operand { value: y, span: sb }];
                self.layer(op.symbol(), span, &[], &ops, Some(shown)).map(Val::Tensor)
            }
            (Val::Tensor(x), Val::Const(c)) => {
                let shown = shown(self);
                let c = numeric(c, sb)?;
                let arg = Arg { name: None, value: c, span: sb };
                self.layer(op.symbol(), span, &[arg], &[Operand { value: x, span: sa }], Some(shown))
                    .map(Val::Tensor)
            }
            (Val::Const(c), Val::Tensor(x)) => {
                let shown = shown(self);
                let c = numeric(c, sa)?;
                let arg = Arg { name: None, value: c, span: sa };
                let xo = Operand { value: x, span: sb };
                match op {
                    ArithOp::Add | ArithOp::Mul => self.layer(op.symbol(), span, &[arg], &[xo], Some(shown)).map(Val::Tensor),
                    ArithOp::Sub => {
                        // c - x = (-x) + c
                        let neg_shown = format!("-{}", self.excerpt(sb));
                        let neg = self.layer("-", span, &[], &[xo], Some(neg_shown))?;
                        self.layer("+", span, &[arg], &[Operand { value: neg, span: sb }], Some(shown)).map(Val::Tensor)
                    }
                    ArithOp::Div => Err(Diagnostic::error("a number divided by a tensor is not supported", op_span, "here")
                        .with_help("divide tensors by numbers (`x / 2`), or multiply by a reciprocal computed as a tensor")
                        .into()),
                }
            }
        }
    }

    /// Short source text of an operand for the layer table (`h`, `0.5`, `(...)`).
    fn excerpt(&self, s: Span) -> String {
        // A long span is never shown whole; don't scan it (a chain `x + x + ... + x` asks
        // for the excerpt of a growing prefix at every term).
        if s.range().len() > 256 {
            return "(…)".into();
        }
        let text = self.src.get(s.range()).unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" ");
        if text.chars().count() <= 24 {
            text
        } else {
            "(…)".into()
        }
    }

    /// Applies operator or block `callee` to `piped` (if any) and the call's arguments.
    fn apply(
        &mut self,
        callee: &ast::Path,
        args: &[ast::Arg],
        piped: Option<Operand>,
        span: Span,
        scope: &Scope,
    ) -> Res<Val> {
        let name = callee.text();
        if let Some(block) = self.blocks.get(name.as_str()).copied() {
            return self.expand_block(block, args, piped, span, scope);
        }
        if callee.parts.len() == 1 && combinators::is_combinator(&name) {
            return self.combinator(&name, args, piped, span, scope).map(Val::Tensor);
        }
        if callee.parts.len() > 1 || !layers::known_ops().contains(&name.as_str()) {
            let blocks: Vec<&str> = self.blocks.keys().copied().collect();
            let mut d = resolve::unknown_op(&name, callee.span, &blocks);
            if matches!(scope.names.get(&name), Some(Entry::Val(Val::Tensor(_), _))) {
                d = d.with_help(format!(
                    "`{name}` is a tensor, not an operator; combine tensors with `+`, `*` or `concat(a, b)`"
                ));
            }
            return Err(d.into());
        }
        let mut operands: Vec<Operand> = piped.into_iter().collect();
        let mut cargs = Vec::new();
        for a in args {
            let v = self.eval(&a.value, scope, a.name.is_some() || is_batch_word(&a.value))?;
            match (v, &a.name) {
                (Val::Tensor(t), None) => operands.push(Operand { value: t, span: a.value.span }),
                (Val::Tensor(_), Some(k)) => {
                    return Err(Diagnostic::error(
                        format!("argument `{}` must be a compile-time value, not a tensor", k.name),
                        a.value.span,
                        "a tensor",
                    )
                    .with_help(format!("pass tensors positionally: `{name}(a, b)`"))
                    .into())
                }
                (Val::Const(c), k) => {
                    cargs.push(Arg { name: k.as_ref().map(|k| k.name.clone()), value: c, span: a.span })
                }
            }
        }
        self.layer(&name, span, &cargs, &operands, None).map(Val::Tensor)
    }

    /// Lowers one operator application and records its table row (`shown` replaces the
    /// call text in the table, for arithmetic).
    fn layer(
        &mut self,
        op: &str,
        span: Span,
        args: &[Arg],
        operands: &[Operand],
        shown: Option<String>,
    ) -> Res<Value> {
        self.layers += 1;
        if self.layers > MAX_LAYERS {
            return Err(Diagnostic::error(
                format!("the model expands to more than {MAX_LAYERS} layers"),
                span,
                "while expanding this",
            )
            .with_help("check for blocks that nest many times")
            .into());
        }
        let word = op_word(op);
        let label = format!("{}/{word}", self.binding);
        let k = self.counters.entry((self.binding.clone(), word.to_string())).or_insert(0);
        let prefix = format!("{}.{word}_{k}", self.binding);
        *k += 1;
        let call = LayerCall { op, span, args, label: label.clone(), param_prefix: prefix };
        self.ctx.b.at(span, Role::Forward, label.clone());
        let before = self.ctx.params.len();
        let v = layers::lower_layer(&mut self.ctx, &call, operands)?;
        let (mut pc, mut pr) = (0usize, 0usize);
        for p in &self.ctx.params[before..] {
            let n = p.ty.shape.fixed_numel();
            if p.ty.dtype.is_complex() {
                pc += n;
                pr += 2 * n;
            } else {
                pr += n;
            }
        }
        let ty = self.ctx.b.graph.ty(v).clone();
        self.table.push(TableRow {
            label,
            op: shown.unwrap_or_else(|| call_text(op, args)),
            shape: ty.shape,
            dtype: ty.dtype,
            params_complex: pc,
            params_real: pr,
            line: self.use_site.unwrap_or(span).line_col(self.src).0,
        });
        Ok(v)
    }

    /// `residual(stages)`: `x + stages(x)`; `repeat(n, stages)`: the stages `n` times.
    fn combinator(
        &mut self,
        name: &str,
        args: &[ast::Arg],
        piped: Option<Operand>,
        span: Span,
        scope: &Scope,
    ) -> Res<Value> {
        let usage = if name == "residual" {
            "write `x |> residual(rmsnorm |> attention(heads = 3))`: the stages apply to `x` and the result is added to `x`"
        } else {
            "write `x |> repeat(12, encoder(192))`: the stages apply 12 times in a row"
        };
        let Some(input) = piped else {
            return Err(Diagnostic::error(format!("`{name}` needs a tensor to apply to"), span, "no input")
                .with_help(usage)
                .into());
        };
        let want = if name == "residual" { 1 } else { 2 };
        let positional: Vec<&ast::Arg> = args.iter().filter(|a| a.name.is_none()).collect();
        if let Some(k) = args.iter().find_map(|a| a.name.as_ref()) {
            return Err(Diagnostic::error(
                format!("`{name}` takes no named arguments"),
                k.span,
                format!("not an argument of `{name}`"),
            )
            .with_help(usage)
            .into());
        }
        if positional.len() != want {
            let s = if want == 1 { "" } else { "s" };
            return Err(Diagnostic::error(
                format!("`{name}` takes {want} argument{s}, got {}", positional.len()),
                span,
                format!("{} given", positional.len()),
            )
            .with_help(usage)
            .into());
        }
        let body = positional[want - 1];
        let Some(stages) = combinators::stages(&body.value) else {
            return Err(Diagnostic::error(
                format!("the argument of `{name}` must be stages of a pipeline"),
                body.value.span,
                "not an operator, block or pipeline",
            )
            .with_help(usage)
            .into());
        };
        let times = if name == "repeat" {
            let count = positional[0];
            match self.eval(&count.value, scope, false)? {
                Val::Const(ArgValue::Int(n)) if n >= 1 => n as usize,
                Val::Const(ArgValue::Int(n)) => {
                    return Err(Diagnostic::error(
                        format!("`repeat` needs a count of at least 1, got {n}"),
                        count.value.span,
                        "not a positive count",
                    )
                    .into())
                }
                other => {
                    return Err(Diagnostic::error(
                        "the first argument of `repeat` is how many times to apply the stages",
                        count.value.span,
                        format!("this is {}", describe(&other)),
                    )
                    .with_help(usage)
                    .into())
                }
            }
        } else {
            1
        };
        // Each repetition goes through `apply`, so its layers count against MAX_LAYERS and a
        // huge count stops with that diagnostic instead of running away.
        let mut cur = input;
        for _ in 0..times {
            let start = cur;
            for s in &stages {
                let v = self.apply(&s.callee, s.args, Some(cur), s.span, scope)?;
                let Val::Tensor(v) = v else { unreachable_const(s.span)? };
                cur = Operand { value: v, span: start.span.join(s.span) };
            }
            if name == "residual" {
                let shown = format!("{} + residual", self.excerpt(start.span));
                let ops = [start, cur];
                let v = self.layer("+", span, &[], &ops, Some(shown))?;
                cur = Operand { value: v, span };
            }
        }
        Ok(cur.value)
    }

    /// Expands `block` applied to the piped tensor (or its one tensor argument).
    fn expand_block(
        &mut self,
        block: &'m ast::BlockDef,
        args: &[ast::Arg],
        piped: Option<Operand>,
        span: Span,
        scope: &Scope,
    ) -> Res<Val> {
        let bname = block.name.name.as_str();
        if self.expanding.contains(&bname) {
            // Reported once by resolve::collect_blocks.
            return Err(Fail::Reported);
        }
        if self.expanding.len() >= resolve::MAX_BLOCK_DEPTH {
            let outer = self.expanding.first().copied().unwrap_or(bname);
            return Err(Diagnostic::error(
                format!("blocks nest more than {} deep", resolve::MAX_BLOCK_DEPTH),
                span,
                format!("block `{bname}` used {} blocks deep", self.expanding.len()),
            )
            .with_note(format!("the nesting starts at block `{outer}`"))
            .with_help("call the inner blocks one after another in a pipeline instead of inside each other")
            .into());
        }
        let mut input = piped;
        let mut positional = Vec::new();
        let mut named: Vec<(&ast::Ident, ArgValue, Span)> = Vec::new();
        for a in args {
            // Block arguments are compile-time values, so a bare word (`kind = whitening`,
            // or positionally) is a word unless it names a tensor.
            let v = self.eval(&a.value, scope, true)?;
            match (v, &a.name) {
                (Val::Tensor(t), None) if input.is_none() => {
                    input = Some(Operand { value: t, span: a.value.span })
                }
                (Val::Tensor(_), _) => {
                    return Err(Diagnostic::error(
                        format!("block `{bname}` takes one tensor"),
                        a.value.span,
                        "a second tensor",
                    )
                    .with_label(block.name.span, "block defined here")
                    .with_help(
                        "block parameters are compile-time values; join tensors with `+` or `concat` first",
                    )
                    .into())
                }
                (Val::Const(c), None) => positional.push((c, a.span)),
                (Val::Const(c), Some(k)) => named.push((k, c, a.span)),
            }
        }
        let Some(input) = input else {
            return Err(Diagnostic::error(
                format!("block `{bname}` needs a tensor to apply to"),
                span,
                "no input",
            )
            .with_help(format!("pipe a tensor into it: `x |> {bname}(...)`"))
            .into());
        };
        let params = &block.params;
        let arity = |got: usize| {
            let list = params.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
            let s = if params.len() == 1 { "" } else { "s" };
            Diagnostic::error(
                format!("block `{bname}` takes {} argument{s}, got {got}", params.len()),
                span,
                format!("{got} given"),
            )
            .with_label(block.span.join(block.name.span), format!("defined here as `{bname}({list})`"))
        };
        if positional.len() > params.len() {
            return Err(arity(positional.len() + named.len()).into());
        }
        let mut values: Vec<Option<ArgValue>> = vec![None; params.len()];
        for (i, (c, _)) in positional.into_iter().enumerate() {
            values[i] = Some(c);
        }
        for (k, c, aspan) in named {
            let Some(i) = params.iter().position(|p| p.name == k.name) else {
                let mut d = Diagnostic::error(
                    format!("block `{bname}` has no parameter `{}`", k.name),
                    k.span,
                    "unknown argument",
                )
                .with_label(block.name.span, "block defined here");
                if let Some(s) = did_you_mean(&k.name, params.iter().map(|p| p.name.as_str())) {
                    d = d.with_help(format!("did you mean `{s}`?"));
                }
                return Err(d.into());
            };
            if values[i].is_some() {
                return Err(Diagnostic::error(
                    format!("parameter `{}` of block `{bname}` is given twice", k.name),
                    aspan,
                    "given again",
                )
                .into());
            }
            values[i] = Some(c);
        }
        let given = values.iter().filter(|v| v.is_some()).count();
        if given != params.len() {
            let missing: Vec<&str> = params
                .iter()
                .zip(&values)
                .filter(|(_, v)| v.is_none())
                .map(|(p, _)| p.name.as_str())
                .collect();
            return Err(arity(given).with_help(format!("missing: {}", missing.join(", "))).into());
        }
        let mut inner = Scope { names: HashMap::new(), block: Some(bname) };
        for (n, (c, s)) in &self.consts {
            inner.names.insert(n.clone(), Entry::Val(Val::Const(c.clone()), *s));
        }
        for (p, v) in params.iter().zip(values) {
            if let Some(v) = v {
                inner.names.insert(p.name.clone(), Entry::Val(Val::Const(v), p.span));
            }
        }
        self.expanding.push(bname);
        let outermost = self.use_site.is_none();
        if outermost {
            self.use_site = Some(span);
        }
        let mut cur = input;
        let mut result = Ok(Val::Tensor(cur.value));
        for s in &block.body {
            match self.apply(&s.callee, &s.args, Some(cur), s.span, &inner) {
                Ok(Val::Tensor(v)) => {
                    cur = Operand { value: v, span };
                    result = Ok(Val::Tensor(v));
                }
                Ok(Val::Const(_)) => {
                    result = unreachable_const(s.span);
                    break;
                }
                Err(Fail::Diag(d)) => {
                    result = Err(Fail::Diag(Box::new(
                        d.with_label(span, format!("in this use of block `{bname}`")),
                    )));
                    break;
                }
                Err(f) => {
                    result = Err(f);
                    break;
                }
            }
        }
        self.expanding.pop();
        if outermost {
            self.use_site = None;
        }
        result
    }
}

/// Operators always make tensors; kept as an error rather than a panic.
fn unreachable_const<T>(span: Span) -> Res<T> {
    Err(Diagnostic::error("internal error: an operator produced a constant", span, "here").into())
}

/// Whether a positional argument is the batch word `B` (as in `reshape(B, 16, 4)`).
fn is_batch_word(e: &Expr) -> bool {
    matches!(&e.kind, ExprKind::Name(n) if n == "B")
}

/// The word used in labels and parameter names for an operator.
fn op_word(op: &str) -> &str {
    match op {
        "+" => "add",
        "-" => "sub",
        "*" => "mul",
        "/" => "div",
        o => o,
    }
}

fn describe(v: &Val) -> &'static str {
    match v {
        Val::Tensor(_) => "a tensor",
        Val::Const(ArgValue::Int(_)) => "an integer",
        Val::Const(ArgValue::Float(_)) => "a number",
        Val::Const(ArgValue::Bool(_)) => "a boolean",
        Val::Const(ArgValue::Ident(_)) => "a word",
        Val::Const(ArgValue::Str(_)) => "a string",
        Val::Const(ArgValue::Range(..)) => "a range",
        Val::Const(ArgValue::Tuple(_)) => "a tuple",
        Val::Const(ArgValue::Numbers(_)) => "a tuple of numbers",
    }
}

fn numeric(c: ArgValue, span: Span) -> Res<ArgValue> {
    match c {
        ArgValue::Int(_) | ArgValue::Float(_) => Ok(c),
        other => Err(Diagnostic::error(
            format!("tensor arithmetic takes numbers, not {}", describe(&Val::Const(other))),
            span,
            "not a number",
        )
        .into()),
    }
}

/// Folds compile-time arithmetic: integers stay integers (`/` rounds toward zero), a float
/// on either side makes a float.
fn fold(op: ArithOp, op_span: Span, (a, sa): (&ArgValue, Span), (b, sb): (&ArgValue, Span)) -> Res<ArgValue> {
    let overflow = || -> Fail {
        Diagnostic::error("integer overflow in compile-time arithmetic", sa.join(sb), "overflows i64").into()
    };
    match (a, b) {
        (ArgValue::Int(x), ArgValue::Int(y)) => {
            let r = match op {
                ArithOp::Add => x.checked_add(*y),
                ArithOp::Sub => x.checked_sub(*y),
                ArithOp::Mul => x.checked_mul(*y),
                ArithOp::Div => {
                    if *y == 0 {
                        return Err(Diagnostic::error("division by zero", sb, "this is 0").into());
                    }
                    x.checked_div(*y)
                }
            };
            r.map(ArgValue::Int).ok_or_else(overflow)
        }
        (ArgValue::Int(_) | ArgValue::Float(_), ArgValue::Int(_) | ArgValue::Float(_)) => {
            let f = |v: &ArgValue| match v {
                ArgValue::Int(n) => *n as f64,
                ArgValue::Float(x) => *x,
                _ => 0.0,
            };
            let (x, y) = (f(a), f(b));
            let r = match op {
                ArithOp::Add => x + y,
                ArithOp::Sub => x - y,
                ArithOp::Mul => x * y,
                ArithOp::Div => x / y,
            };
            if !r.is_finite() {
                return Err(Diagnostic::error(
                    "compile-time arithmetic gives a non-finite number",
                    sa.join(sb),
                    "not finite",
                )
                .into());
            }
            Ok(ArgValue::Float(r))
        }
        _ => {
            let bad = if matches!(a, ArgValue::Int(_) | ArgValue::Float(_)) { (b, sb) } else { (a, sa) };
            Err(Diagnostic::error(
                format!("`{}` needs numbers, got {}", op.symbol(), describe(&Val::Const(bad.0.clone()))),
                bad.1,
                "not a number",
            )
            .with_label(op_span, "in this operation")
            .into())
        }
    }
}

/// The call as it appears in the layer table, arguments evaluated: `conv1d(16, kernel = 7, pad = 3)`.
fn call_text(op: &str, args: &[Arg]) -> String {
    if args.is_empty() {
        return op.to_string();
    }
    let parts: Vec<String> = args
        .iter()
        .map(|a| {
            let v = arg_text(&a.value);
            match &a.name {
                Some(k) => format!("{k} = {v}"),
                None => v,
            }
        })
        .collect();
    format!("{op}({})", parts.join(", "))
}

/// An argument value as written.
pub fn arg_text(v: &ArgValue) -> String {
    match v {
        ArgValue::Int(n) => n.to_string(),
        ArgValue::Float(x) => format!("{x:?}"),
        ArgValue::Bool(b) => b.to_string(),
        ArgValue::Ident(s) => s.clone(),
        ArgValue::Str(s) => format!("{s:?}"),
        ArgValue::Range(a, b) => format!("{a}..{b}"),
        ArgValue::Tuple(t) => format!("({})", t.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")),
        ArgValue::Numbers(t) => {
            format!("({})", t.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", "))
        }
    }
}
