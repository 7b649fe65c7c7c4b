//! Name resolution that needs no values: picks the model a file is about, checks input
//! types, collects blocks (duplicates, shadowing, unknown operators in bodies, self-use),
//! and finds where every binding is defined (for "used before definition" errors).

use super::combinators;
use super::layers::{self, ArgValue};
use crate::diag::Diagnostic;
use crate::ir::{DType, Dim, Init, Shape, TensorType};
use cvc_grammar::ast::{self, DimKind, ModelItem};
use cvc_grammar::Span;
use std::collections::HashMap;

/// The closest candidate to `word` when it is close enough to be a likely typo.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| (edit_distance(word, c), c))
        .filter(|&(d, c)| d <= 2.max(c.len() / 3) && d < c.len().max(word.len()))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Chooses the model to check: the one a train section names, else the only one.
pub fn choose_model<'f>(file: &'f ast::File, src: &str) -> Result<&'f ast::Model, Vec<Diagnostic>> {
    let mut diags = Vec::new();
    let mut seen: HashMap<&str, Span> = HashMap::new();
    for m in file.models() {
        if let Some(first) = seen.insert(&m.name.name, m.name.span) {
            diags.push(
                Diagnostic::error(
                    format!("model `{}` is defined twice", m.name.name),
                    m.name.span,
                    "second definition",
                )
                .with_label(first, "first defined here")
                .with_help("rename one of the models"),
            );
        }
    }
    let trains: Vec<&ast::Train> = file.trains().collect();
    for t in trains.iter().skip(1) {
        diags.push(
            Diagnostic::error("a file holds at most one train section", t.span, "second train section")
                .with_label(trains[0].span, "first train section")
                .with_help("merge the settings into one `train` section"),
        );
    }
    let models: Vec<&ast::Model> = file.models().collect();
    if models.is_empty() {
        let (msg, label) = if src.trim().is_empty() {
            ("empty file", "nothing here")
        } else {
            ("no model in this file", "expected a model")
        };
        diags.push(
            Diagnostic::error(msg, trains.first().map_or(Span::new(0, 0), |t| t.span), label)
                .with_help("a .cvnn file defines `model Name { input x: c64[B, 16] ... }`"),
        );
        return Err(diags);
    }
    let chosen = if let Some(t) = trains.first() {
        match models.iter().find(|m| m.name.name == t.model.name) {
            Some(m) => Some(*m),
            None => {
                let mut d = Diagnostic::error(
                    format!("train section names model `{}`, which this file does not define", t.model.name),
                    t.model.span,
                    "no such model",
                );
                d = match did_you_mean(&t.model.name, models.iter().map(|m| m.name.name.as_str())) {
                    Some(s) => d.with_help(format!("did you mean `{s}`?")),
                    None => d.with_help(format!(
                        "models in this file: {}",
                        models.iter().map(|m| format!("`{}`", m.name.name)).collect::<Vec<_>>().join(", ")
                    )),
                };
                diags.push(d);
                None
            }
        }
    } else if models.len() == 1 {
        Some(models[0])
    } else {
        diags.push(
            Diagnostic::error("several models and no train section", models[1].name.span, "second model")
                .with_label(models[0].name.span, "first model")
                .with_help(format!("add `train {} {{ }}` to choose the model to check", models[0].name.name)),
        );
        None
    };
    match chosen {
        Some(m) if diags.is_empty() => Ok(m),
        _ => Err(diags),
    }
}

/// A checked input declaration's type: the IR type and the class count of labels.
pub fn input_type(decl: &ast::InputDecl) -> Result<(TensorType, Option<usize>), Diagnostic> {
    let t = &decl.ty;
    let dtype = match t.elem.name.as_str() {
        "c64" => DType::C64,
        "f32" => DType::F32,
        "class" => DType::I32,
        other => {
            let mut d = Diagnostic::error(
                format!("unknown element type `{other}`"),
                t.elem.span,
                "not an element type",
            )
            .with_note("inputs are `c64[...]` (complex), `f32[...]` (real) or `class[B] of N` (labels)");
            if let Some(s) = did_you_mean(other, ["c64", "f32", "class"]) {
                d = d.with_help(format!("did you mean `{s}`?"));
            } else if other.starts_with('c') {
                d = d.with_help("complex tensors are `c64` (two f32)");
            } else if other.starts_with('f') || other.starts_with('i') {
                d = d.with_help("real tensors are `f32`");
            }
            return Err(d);
        }
    };
    let mut dims = Vec::with_capacity(t.dims.len());
    for (i, d) in t.dims.iter().enumerate() {
        let dim = match &d.kind {
            DimKind::Name(n) if n == "B" => {
                if i != 0 {
                    return Err(Diagnostic::error(
                        "the batch `B` must be the first dimension",
                        d.span,
                        "batch here",
                    )
                    .with_help("inputs are batched along their first axis: write `[B, ...]`"));
                }
                Dim::Batch
            }
            DimKind::Name(n) => {
                return Err(Diagnostic::error(format!("unknown dimension `{n}`"), d.span, "not a dimension")
                    .with_help("dimensions are numbers, and `B` (the batch size) for the first"));
            }
            DimKind::Int(n) if *n >= 1 => {
                if i == 0 {
                    return Err(Diagnostic::error(
                        "the first dimension of an input must be the batch `B`",
                        d.span,
                        "expected `B`",
                    )
                    .with_help(format!(
                        "write `[B, {}]`",
                        t.dims
                            .iter()
                            .filter(|d| !matches!(&d.kind, DimKind::Name(n) if n == "B"))
                            .map(|d| dim_text(&d.kind))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                Dim::Fixed(usize::try_from(*n).unwrap_or(usize::MAX))
            }
            DimKind::Int(n) => {
                return Err(Diagnostic::error(
                    format!("dimension {n} is not positive"),
                    d.span,
                    "must be at least 1",
                ));
            }
        };
        dims.push(dim);
    }
    let numel = dims.iter().filter_map(|d| d.fixed()).try_fold(1usize, |a, n| a.checked_mul(n));
    if numel.is_none_or(|n| n > (1usize << 40)) {
        return Err(Diagnostic::error("input is too large", t.span, "more than 2^40 elements per sample"));
    }
    let classes = match (dtype, t.classes) {
        (DType::I32, Some((n, _))) if n >= 2 => Some(n as usize),
        (DType::I32, Some((n, span))) => {
            return Err(Diagnostic::error(
                format!("a classifier needs at least 2 classes, got {n}"),
                span,
                "too few classes",
            ));
        }
        (DType::I32, None) => {
            return Err(Diagnostic::error("class labels need a class count", t.span, "missing `of N`")
                .with_help(format!("write `{} of 10` for 10 classes", src_text(t))));
        }
        (_, Some((_, span))) => {
            return Err(Diagnostic::error("only class labels take `of N`", span, "not a class input")
                .with_help("write `class[B] of N` for labels, or drop `of N`"));
        }
        (_, None) => None,
    };
    Ok((TensorType::new(dtype, Shape(dims)), classes))
}

/// A checked `param` declaration's type: `c64` or `f32` with fixed positive extents.
pub fn param_type(decl: &ast::ParamDecl) -> Result<TensorType, Diagnostic> {
    let t = &decl.ty;
    let dtype = match t.elem.name.as_str() {
        "c64" => DType::C64,
        "f32" => DType::F32,
        other => {
            let mut d = Diagnostic::error(
                format!("a param is `c64` or `f32`, not `{other}`"),
                t.elem.span,
                "not a parameter element type",
            )
            .with_note("learned tensors are complex (`c64[...]`) or real (`f32[...]`)");
            if other == "class" {
                d = d.with_help("class labels are data: declare them with `input`");
            } else if let Some(s) = did_you_mean(other, ["c64", "f32"]) {
                d = d.with_help(format!("did you mean `{s}`?"));
            }
            return Err(d);
        }
    };
    if let Some((_, span)) = t.classes {
        return Err(Diagnostic::error("a param takes no `of N`", span, "only class inputs take `of N`"));
    }
    if t.dims.is_empty() {
        return Err(Diagnostic::error("a param needs at least one dimension", t.span, "no dimensions")
            .with_help(format!("write e.g. `{}[1]` for a single learned number", t.elem.name)));
    }
    let mut dims = Vec::with_capacity(t.dims.len());
    for d in &t.dims {
        match &d.kind {
            DimKind::Int(n) if *n >= 1 => dims.push(Dim::Fixed(usize::try_from(*n).unwrap_or(usize::MAX))),
            DimKind::Int(n) => {
                return Err(Diagnostic::error(
                    format!("dimension {n} is not positive"),
                    d.span,
                    "must be at least 1",
                ))
            }
            DimKind::Name(n) if n == "B" => {
                return Err(Diagnostic::error(
                    "a param has a fixed shape: no batch `B`",
                    d.span,
                    "batch here",
                )
                .with_help(
                    "use extent 1 and let broadcasting repeat it over the batch, e.g. `[1, 256, 192]`",
                ))
            }
            DimKind::Name(n) => {
                return Err(Diagnostic::error(format!("unknown dimension `{n}`"), d.span, "not a dimension")
                    .with_help("a param's dimensions are numbers"))
            }
        }
    }
    let numel = dims.iter().filter_map(|d| d.fixed()).try_fold(1usize, |a, n| a.checked_mul(n));
    if numel.is_none_or(|n| n > (1usize << 40)) {
        return Err(Diagnostic::error("param is too large", t.span, "more than 2^40 elements"));
    }
    Ok(TensorType::new(dtype, Shape(dims)))
}

/// The initialisers a `param` accepts, as written.
pub const PARAM_INITS: [&str; 5] = ["zeros", "ones", "normal", "uniform", "glorot"];

/// The [`Init`] of a `param` declaration: initialiser `name` (at `span`) with its evaluated
/// arguments `(keyword, value, span)`, for a parameter of extents `shape`.
///
/// `glorot` takes PyTorch's fans (`fan_in = shape[1]·r`, `fan_out = shape[0]·r`, `r` the
/// product of the remaining extents), so it needs two dimensions or more, as
/// `torch.nn.init.xavier_normal_`.
pub fn param_init(
    name: &str,
    span: Span,
    args: &[(Option<String>, ArgValue, Span)],
    shape: &[usize],
) -> Result<Init, Diagnostic> {
    let usage = "initialisers are `zeros`, `ones`, `normal(std = s)`, `uniform(bound = b)` and `glorot`";
    let (key, default): (Option<&str>, Option<f64>) = match name {
        "zeros" | "ones" | "glorot" => (None, None),
        "normal" => (Some("std"), Some(1.0)),
        "uniform" => (Some("bound"), None),
        other => {
            let mut d =
                Diagnostic::error(format!("unknown initialiser `{other}`"), span, "not an initialiser")
                    .with_note(usage);
            if let Some(s) = did_you_mean(other, PARAM_INITS) {
                d = d.with_help(format!("did you mean `{s}`?"));
            }
            return Err(d);
        }
    };
    let mut value = default;
    for (i, (k, v, aspan)) in args.iter().enumerate() {
        let Some(key) = key else {
            return Err(Diagnostic::error(
                format!("`{name}` takes no arguments"),
                *aspan,
                "unexpected argument",
            )
            .with_note(usage));
        };
        if i > 0 || k.as_deref().is_some_and(|k| k != key) {
            let what = k.as_deref().map_or("a second argument".to_string(), |k| format!("argument `{k}`"));
            return Err(Diagnostic::error(format!("`{name}` has no {what}"), *aspan, "unexpected argument")
                .with_help(format!("write `{name}({key} = ...)`")));
        }
        let x = match v {
            ArgValue::Int(n) => *n as f64,
            ArgValue::Float(x) => *x,
            _ => {
                return Err(Diagnostic::error(format!("`{key}` must be a number"), *aspan, "not a number")
                    .with_help(format!("write `{name}({key} = 0.02)`")))
            }
        };
        if !(x.is_finite() && x > 0.0) {
            return Err(Diagnostic::error(
                format!("`{key}` must be positive, got {x}"),
                *aspan,
                "not positive",
            ));
        }
        value = Some(x);
    }
    Ok(match name {
        "zeros" => Init::Zeros,
        "ones" => Init::Ones,
        "normal" => Init::Normal { std: value.unwrap_or(1.0) },
        "uniform" => match value {
            Some(bound) => Init::Uniform { bound },
            None => {
                return Err(Diagnostic::error("`uniform` needs its bound", span, "no bound")
                    .with_help("write `uniform(bound = 0.1)` for values in [-0.1, 0.1]"))
            }
        },
        _ => {
            if shape.len() < 2 {
                return Err(Diagnostic::error(
                    "`glorot` needs a param with two dimensions or more",
                    span,
                    "fans undefined for one dimension",
                )
                .with_help("use `normal(std = ...)` or `uniform(bound = ...)` for a vector"));
            }
            let r: usize = shape[2..].iter().product();
            Init::Glorot { fan_in: shape[1] * r, fan_out: shape[0] * r }
        }
    })
}

fn dim_text(k: &DimKind) -> String {
    match k {
        DimKind::Int(n) => n.to_string(),
        DimKind::Name(n) => n.clone(),
    }
}

fn src_text(t: &ast::InputType) -> String {
    format!("{}[{}]", t.elem.name, t.dims.iter().map(|d| dim_text(&d.kind)).collect::<Vec<_>>().join(", "))
}

/// Collects a model's blocks, reporting duplicates, blocks that shadow operators, duplicate
/// parameters, unknown operators in bodies and blocks that use themselves.
pub fn collect_blocks<'m>(
    model: &'m ast::Model,
    diags: &mut Vec<Diagnostic>,
) -> HashMap<&'m str, &'m ast::BlockDef> {
    let mut blocks: HashMap<&str, &ast::BlockDef> = HashMap::new();
    for item in &model.items {
        let ModelItem::Block(b) = item else { continue };
        if layers::known_ops().contains(&b.name.name.as_str()) || combinators::is_combinator(&b.name.name) {
            diags.push(
                Diagnostic::error(
                    format!("block `{}` has the name of an operator", b.name.name),
                    b.name.span,
                    "shadows the operator",
                )
                .with_help("choose another name for the block"),
            );
            continue;
        }
        if let Some(first) = blocks.get(b.name.name.as_str()) {
            diags.push(
                Diagnostic::error(
                    format!("block `{}` is defined twice", b.name.name),
                    b.name.span,
                    "second definition",
                )
                .with_label(first.name.span, "first defined here"),
            );
            continue;
        }
        let mut params: HashMap<&str, Span> = HashMap::new();
        for p in &b.params {
            if let Some(first) = params.insert(&p.name, p.span) {
                diags.push(
                    Diagnostic::error(
                        format!("parameter `{}` appears twice in block `{}`", p.name, b.name.name),
                        p.span,
                        "repeated",
                    )
                    .with_label(first, "first here"),
                );
            }
        }
        blocks.insert(&b.name.name, b);
    }
    let names: Vec<&str> = blocks.keys().copied().collect();
    let mut bodies: Vec<&&ast::BlockDef> = blocks.values().collect();
    bodies.sort_by_key(|b| b.span.start);
    for b in bodies {
        for s in b.body.iter().flat_map(body_stages) {
            let callee = s.callee.text();
            if !blocks.contains_key(callee.as_str())
                && !layers::known_ops().contains(&callee.as_str())
                && !combinators::is_combinator(&callee)
            {
                diags.push(unknown_op(&callee, s.callee.span, &names));
            }
        }
        if let Some(cycle) = find_cycle(b, &blocks) {
            diags.push(
                Diagnostic::error(
                    format!("block `{}` uses itself", b.name.name),
                    b.name.span,
                    "recursive block",
                )
                .with_note(format!("the chain is {cycle}"))
                .with_help(
                    "blocks expand inline, so they cannot recurse; repeat the block in the pipeline instead",
                ),
            );
        }
    }
    blocks
}

/// A block-body stage and the stages inside its combinator arguments (`residual(f |> g)`).
fn body_stages(s: &ast::Stage) -> Vec<combinators::StageRef<'_>> {
    let mut out = Vec::new();
    combinators::flatten(&s.callee, &s.args, s.span, &mut out);
    out
}

/// How deeply blocks may nest inside each other (lowering reports deeper uses).
pub const MAX_BLOCK_DEPTH: usize = 64;

/// The chain `a → b → a` when block `start` reaches itself (within [`MAX_BLOCK_DEPTH`] steps).
fn find_cycle(start: &ast::BlockDef, blocks: &HashMap<&str, &ast::BlockDef>) -> Option<String> {
    fn walk<'a>(
        b: &'a ast::BlockDef,
        target: &str,
        blocks: &HashMap<&str, &'a ast::BlockDef>,
        path: &mut Vec<&'a str>,
        explored: &mut std::collections::HashSet<&'a str>,
    ) -> bool {
        if path.len() > MAX_BLOCK_DEPTH {
            return false;
        }
        for s in b.body.iter().flat_map(body_stages) {
            let c = s.callee.text();
            if c == target {
                return true;
            }
            if let Some(next) = blocks.get(c.as_str()) {
                let name = next.name.name.as_str();
                if path.contains(&name) || explored.contains(name) {
                    continue;
                }
                path.push(name);
                if walk(next, target, blocks, path, explored) {
                    return true;
                }
                path.pop();
                explored.insert(name);
            }
        }
        false
    }
    let mut path = vec![start.name.name.as_str()];
    let mut explored = std::collections::HashSet::new();
    walk(start, &start.name.name, blocks, &mut path, &mut explored).then(|| {
        path.push(&start.name.name);
        path.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(" → ")
    })
}

/// "unknown operator" with a did-you-mean over operators and blocks.
pub fn unknown_op(name: &str, span: Span, blocks: &[&str]) -> Diagnostic {
    let d = Diagnostic::error(format!("unknown operator `{name}`"), span, "not an operator or block");
    let cands = layers::known_ops().iter().copied().chain(blocks.iter().copied());
    match did_you_mean(name, cands) {
        Some(s) => d.with_help(format!("did you mean `{s}`?")),
        None => d.with_note("see docs/LANGUAGE.md for the operator table"),
    }
}

/// Where each binding name is first defined (for "used before its definition").
pub fn definitions(model: &ast::Model) -> HashMap<&str, Span> {
    let mut defs = HashMap::new();
    for item in &model.items {
        match item {
            ModelItem::Binding(b) => {
                defs.entry(b.name.name.as_str()).or_insert(b.name.span);
            }
            ModelItem::Input(i) => {
                defs.entry(i.name.name.as_str()).or_insert(i.name.span);
            }
            ModelItem::Param(p) => {
                defs.entry(p.name.name.as_str()).or_insert(p.name.span);
            }
            _ => {}
        }
    }
    defs
}
