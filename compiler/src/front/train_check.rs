//! Checks a `train` section against the model it names and fills a [`TrainConfig`].

use super::resolve::did_you_mean;
use super::train::*;
use super::{limits, ModelInput};
use crate::config::{Optimizer, OptimizerKind, Precision};
use crate::diag::Diagnostic;
use crate::ir::{DType, Dim};
use cvc_grammar::ast::{self, ArithOp, Expr, ExprKind};
use cvc_grammar::Span;
use std::collections::HashMap;

/// The keys a train section accepts.
pub const TRAIN_KEYS: [&str; 11] = [
    "data",
    "split",
    "batch",
    "epochs",
    "optimizer",
    "schedule",
    "seed",
    "device",
    "memory_budget",
    "precision",
    "recompute",
];

/// A compile-time value of a train setting.
#[derive(Clone, Debug)]
enum TVal {
    Int(i64),
    Float(f64),
    Size(u64),
    Bool(bool),
    Str(String),
    Range(f64, f64),
    Word(String),
    Call(String, Vec<TArg>),
    Tuple,
}

#[derive(Clone, Debug)]
struct TArg {
    name: Option<ast::Ident>,
    value: TVal,
    span: Span,
}

fn describe(v: &TVal) -> &'static str {
    match v {
        TVal::Int(_) => "an integer",
        TVal::Float(_) => "a number",
        TVal::Size(_) => "a size",
        TVal::Bool(_) => "a boolean",
        TVal::Str(_) => "a string",
        TVal::Range(..) => "a range",
        TVal::Word(_) => "a name",
        TVal::Call(..) => "a call",
        TVal::Tuple => "a tuple",
    }
}

fn eval(e: &Expr) -> Result<TVal, Diagnostic> {
    Ok(match &e.kind {
        ExprKind::Int(n) => TVal::Int(*n),
        ExprKind::Float(x) => TVal::Float(*x),
        ExprKind::Size(text) => TVal::Size(
            crate::units::parse_bytes(text)
                .map_err(|err| Diagnostic::error(err.to_string(), e.span, "not a byte size"))?,
        ),
        ExprKind::Bool(b) => TVal::Bool(*b),
        ExprKind::Str(s) => TVal::Str(s.clone()),
        ExprKind::Range(a, b) => TVal::Range(*a, *b),
        ExprKind::Name(n) => TVal::Word(n.clone()),
        ExprKind::Tuple(_) => TVal::Tuple,
        ExprKind::Call { callee, args } => {
            let mut out = Vec::with_capacity(args.len());
            for a in args {
                out.push(TArg { name: a.name.clone(), value: eval(&a.value)?, span: a.span });
            }
            TVal::Call(callee.text(), out)
        }
        ExprKind::Arith { first, rest } => {
            // `first` is evaluated once: twice per level made nested groups
            // `((1 + 1) + 1) + ...` exponential in their depth.
            let head = eval(first)?;
            let mut acc = number(&head, first.span, "arithmetic")?;
            let mut all_int = matches!(head, TVal::Int(_));
            for (op, _, rhs) in rest {
                let v = eval(rhs)?;
                all_int &= matches!(v, TVal::Int(_)) && *op != ArithOp::Div;
                let y = number(&v, rhs.span, "arithmetic")?;
                acc = match op {
                    ArithOp::Add => acc + y,
                    ArithOp::Sub => acc - y,
                    ArithOp::Mul => acc * y,
                    ArithOp::Div => acc / y,
                };
            }
            if !acc.is_finite() {
                return Err(Diagnostic::error("arithmetic gives a non-finite number", e.span, "not finite"));
            }
            if all_int && acc.abs() < 9.0e15 {
                TVal::Int(acc as i64)
            } else {
                TVal::Float(acc)
            }
        }
        ExprKind::Pipe { .. } => {
            return Err(Diagnostic::error(
                "pipelines belong in a model, not a train section",
                e.span,
                "not a setting value",
            ))
        }
    })
}

fn number(v: &TVal, span: Span, what: &str) -> Result<f64, Diagnostic> {
    match v {
        TVal::Int(n) => Ok(*n as f64),
        TVal::Float(x) => Ok(*x),
        other => Err(Diagnostic::error(
            format!("{what} needs a number, got {}", describe(other)),
            span,
            "not a number",
        )),
    }
}

fn int_at_least(v: &TVal, span: Span, what: &str, min: i64) -> Result<i64, Diagnostic> {
    match v {
        TVal::Int(n) if *n >= min => Ok(*n),
        TVal::Int(n) => {
            Err(Diagnostic::error(format!("`{what}` must be at least {min}, got {n}"), span, "too small"))
        }
        other => Err(Diagnostic::error(
            format!("`{what}` must be an integer, got {}", describe(other)),
            span,
            "not an integer",
        )),
    }
}

fn positive(v: &TVal, span: Span, what: &str) -> Result<usize, Diagnostic> {
    int_at_least(v, span, what, 1).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

fn real_in(v: &TVal, span: Span, what: &str, lo: f64, hi: f64) -> Result<f64, Diagnostic> {
    let x = number(v, span, &format!("`{what}`"))?;
    if x < lo || x > hi {
        return Err(Diagnostic::error(
            format!("`{what}` must lie in [{lo}, {hi}], got {x}"),
            span,
            "out of range",
        ));
    }
    Ok(x)
}

/// Binds a call's arguments to `params` (positional in order, or by keyword).
fn bind<'a>(
    what: &str,
    params: &[&'static str],
    args: &'a [TArg],
    call_span: Span,
) -> Result<HashMap<&'static str, (&'a TVal, Span)>, Diagnostic> {
    let mut out: HashMap<&'static str, (&TVal, Span)> = HashMap::new();
    let statics = params;
    let mut pos = 0;
    for a in args {
        let key = match &a.name {
            Some(k) => match statics.iter().find(|p| **p == k.name) {
                Some(p) => *p,
                None => {
                    let mut d = Diagnostic::error(
                        format!("`{what}` has no argument `{}`", k.name),
                        k.span,
                        "unknown argument",
                    )
                    .with_note(format!("`{what}` takes {}", params.join(", ")));
                    if let Some(s) = did_you_mean(&k.name, params.iter().copied()) {
                        d = d.with_help(format!("did you mean `{s}`?"));
                    }
                    return Err(d);
                }
            },
            None => {
                let Some(p) = statics.get(pos) else {
                    return Err(Diagnostic::error(
                        format!("`{what}` takes at most {} arguments", params.len()),
                        a.span,
                        "extra argument",
                    )
                    .with_label(call_span, format!("`{what}` takes {}", params.join(", "))));
                };
                pos += 1;
                p
            }
        };
        if out.insert(key, (&a.value, a.span)).is_some() {
            return Err(Diagnostic::error(
                format!("argument `{key}` of `{what}` is given twice"),
                a.span,
                "given again",
            ));
        }
    }
    Ok(out)
}

/// The callee and arguments of a value that may be written `name` or `name(args)`.
fn call_parts(v: &TVal) -> Option<(&str, &[TArg])> {
    match v {
        TVal::Word(w) => Some((w.as_str(), &[])),
        TVal::Call(c, a) => Some((c.as_str(), a.as_slice())),
        _ => None,
    }
}

fn unknown_choice(key: &str, got: &str, choices: &[&str], span: Span) -> Diagnostic {
    let d = Diagnostic::error(format!("unknown {key} `{got}`"), span, format!("unknown {key}")).with_note(
        format!("{key}s: {}", choices.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")),
    );
    match did_you_mean(got, choices.iter().copied()) {
        Some(s) => d.with_help(format!("did you mean `{s}`?")),
        None => d,
    }
}

/// Checks `train` (whose model is `model`, with `inputs`) and returns its configuration.
pub fn check_train(
    train: &ast::Train,
    model: &str,
    inputs: &[ModelInput],
) -> Result<TrainConfig, Vec<Diagnostic>> {
    let mut cfg = TrainConfig::defaults(model);
    let mut diags = Vec::new();
    let mut seen: HashMap<&str, Span> = HashMap::new();
    for s in &train.settings {
        let key = s.key.name.as_str();
        if !TRAIN_KEYS.contains(&key) {
            let mut d =
                Diagnostic::error(format!("unknown train setting `{key}`"), s.key.span, "not a setting")
                    .with_note(format!("settings: {}", TRAIN_KEYS.join(", ")));
            if let Some(sug) = did_you_mean(key, TRAIN_KEYS.iter().copied()) {
                d = d.with_help(format!("did you mean `{sug}`?"));
            }
            diags.push(d);
            continue;
        }
        if let Some(first) = seen.insert(key, s.key.span) {
            diags.push(
                Diagnostic::error(format!("`{key}` is set twice"), s.key.span, "set again here")
                    .with_label(first, "first set here"),
            );
            continue;
        }
        let r = eval(&s.value).and_then(|v| apply(&mut cfg, key, &v, s.value.span, inputs));
        if let Err(d) = r {
            diags.push(d);
        }
    }
    if let Optimizer { kind: OptimizerKind::Sgd { momentum, nesterov: true }, .. } = cfg.optimizer {
        if momentum <= 0.0 {
            let span = train
                .settings
                .iter()
                .find(|s| s.key.name == "optimizer")
                .map_or(train.span, |s| s.value.span);
            diags.push(
                Diagnostic::error(
                    "Nesterov momentum needs a momentum above 0",
                    span,
                    "nesterov = true with momentum 0",
                )
                .with_help("add e.g. `momentum = 0.9`"),
            );
        }
    }
    if diags.is_empty() {
        Ok(cfg)
    } else {
        Err(diags)
    }
}

fn apply(
    cfg: &mut TrainConfig,
    key: &str,
    v: &TVal,
    span: Span,
    inputs: &[ModelInput],
) -> Result<(), Diagnostic> {
    match key {
        "data" => cfg.data = data_source(v, span, inputs)?,
        "split" => {
            let x = number(v, span, "`split`")?;
            if !(x > 0.0 && x <= 1.0) {
                return Err(Diagnostic::error(
                    format!("`split` must lie in (0, 1], got {x}"),
                    span,
                    "out of range",
                )
                .with_help("`split` is the fraction of samples used for training, e.g. `split = 0.9`"));
            }
            cfg.split = x;
        }
        "batch" => cfg.batch = positive(v, span, "batch")?,
        "epochs" => cfg.epochs = positive(v, span, "epochs")?,
        "seed" => cfg.seed = int_at_least(v, span, "seed", 0)? as u64,
        "optimizer" => cfg.optimizer = optimizer(v, span)?,
        "schedule" => cfg.schedule = schedule(v, span)?,
        "device" => {
            cfg.device = match v {
                TVal::Word(w) if w == "auto" => DeviceChoice::Auto,
                TVal::Word(w) if w == "cpu" => DeviceChoice::Cpu,
                TVal::Word(w) if w == "cuda" => DeviceChoice::Cuda,
                TVal::Word(w) if w == "gpu" => {
                    return Err(unknown_choice("device", w, &["auto", "cpu", "cuda"], span)
                        .with_help("write `device = cuda`"))
                }
                TVal::Word(w) => return Err(unknown_choice("device", w, &["auto", "cpu", "cuda"], span)),
                other => {
                    return Err(Diagnostic::error(
                        format!("`device` is `auto`, `cpu` or `cuda`, got {}", describe(other)),
                        span,
                        "not a device",
                    ))
                }
            }
        }
        "precision" => {
            cfg.precision = match v {
                TVal::Word(w) => match Precision::from_name(w) {
                    Some(p) => p,
                    None => {
                        return Err(unknown_choice(
                            "precision",
                            w,
                            &Precision::ALL.map(Precision::name),
                            span,
                        ))
                    }
                },
                other => {
                    return Err(Diagnostic::error(
                        format!("`precision` is `fp32`, `tf32`, `bf16` or `fp16`, got {}", describe(other)),
                        span,
                        "not a precision",
                    ))
                }
            }
        }
        "recompute" => {
            cfg.cheap_remat = match v {
                TVal::Word(w) if w == "auto" => true,
                TVal::Word(w) if w == "budget" => false,
                TVal::Word(w) => {
                    return Err(Diagnostic::error(
                        format!("unknown recompute policy `{w}`"),
                        span,
                        "unknown policy",
                    )
                    .with_note(
                        "`recompute` is `auto` (recompute cheap values wherever the plan shrinks) or \
                         `budget` (only what `memory_budget` needs)",
                    ))
                }
                other => {
                    return Err(Diagnostic::error(
                        format!("`recompute` is `auto` or `budget`, got {}", describe(other)),
                        span,
                        "not a recompute policy",
                    ))
                }
            }
        }
        _ => {
            // memory_budget
            let bytes = match v {
                TVal::Size(n) => *n,
                TVal::Int(n) if *n > 0 => *n as u64,
                other => {
                    return Err(Diagnostic::error(
                        format!("`memory_budget` must be a size such as `4GiB`, got {}", describe(other)),
                        span,
                        "not a size",
                    )
                    .with_help("write `memory_budget = 4GiB`, `512MiB`, or a number of bytes"))
                }
            };
            if bytes == 0 {
                return Err(Diagnostic::error("`memory_budget` must be more than 0 bytes", span, "zero"));
            }
            cfg.memory_budget = Some(bytes);
        }
    }
    Ok(())
}

fn data_source(v: &TVal, span: Span, inputs: &[ModelInput]) -> Result<DataSource, Diagnostic> {
    const SOURCES: [&str; 6] =
        ["synthetic.rf", "synthetic.sar", "synthetic.polsar", "synthetic.random", "npz", "synthetic.mri3d"];
    let Some((name, args)) = call_parts(v) else {
        return Err(Diagnostic::error(
            format!("`data` names a data source, got {}", describe(v)),
            span,
            "not a data source",
        )
        .with_help("write `synthetic.rf(...)`, `synthetic.sar(...)`, `synthetic.polsar(...)`, `synthetic.random(count = 1024)` or `npz(\"data.npz\")`"));
    };
    match name {
        "synthetic.rf" => {
            let a = bind(name, &["classes", "length", "snr_db", "count", "seed"], args, span)?;
            let get_usize = |k: &str, d: usize| a.get(k).map_or(Ok(d), |(v, s)| positive(v, *s, k));
            let classes = get_usize("classes", 5)?;
            let length = get_usize("length", 512)?;
            let count = get_usize("count", 10_000)?;
            let seed = a.get("seed").map_or(Ok(0), |(v, s)| int_at_least(v, *s, "seed", 0))? as u64;
            let snr_db = match a.get("snr_db") {
                None => (0.0, 20.0),
                Some((TVal::Range(lo, hi), s)) => {
                    if lo > hi {
                        return Err(Diagnostic::error(
                            format!("empty SNR range {lo}..{hi}"),
                            *s,
                            "low end above high end",
                        ));
                    }
                    (*lo, *hi)
                }
                Some((TVal::Int(n), _)) => (*n as f64, *n as f64),
                Some((TVal::Float(x), _)) => (*x, *x),
                Some((other, s)) => {
                    return Err(Diagnostic::error(
                        format!("`snr_db` is a range such as `0..20`, got {}", describe(other)),
                        *s,
                        "not a range",
                    ))
                }
            };
            const MAX_CLASSES: usize = 8;
            if !(2..=MAX_CLASSES).contains(&classes) {
                let s = a.get("classes").map_or(span, |(_, s)| *s);
                return Err(Diagnostic::error(
                    format!("synthetic.rf has 2 to {MAX_CLASSES} modulation classes, got {classes}"),
                    s,
                    "out of range",
                ));
            }
            check_rf_inputs(inputs, classes, length, span)?;
            // A burst is `length` c64 samples plus its i32 label.
            let per_sample = (length as u64).saturating_mul(8).saturating_add(4);
            check_data_size(name, count, per_sample, a.get("count").map_or(span, |(_, s)| *s))?;
            Ok(DataSource::SyntheticRf { classes, length, snr_db, count, seed })
        }
        "synthetic.sar" => {
            let a = bind(name, &["count", "size", "classes", "scr_db", "looks", "seed"], args, span)?;
            let get_usize = |k: &str, d: usize| a.get(k).map_or(Ok(d), |(v, s)| positive(v, *s, k));
            let count = get_usize("count", 4000)?;
            let size = get_usize("size", 64)?;
            let classes = get_usize("classes", 4)?;
            let looks = get_usize("looks", 4)?;
            let seed = a.get("seed").map_or(Ok(0), |(v, s)| int_at_least(v, *s, "seed", 0))? as u64;
            let scr_db = match a.get("scr_db") {
                None => (10.0, 20.0),
                Some((v, s)) => db_range(v, *s, "scr_db")?,
            };
            // The generator's limits (runtime/src/data/synthetic_sar.rs): six vehicles, images
            // of at least 8 pixels, 1 to 64 looks.
            const MAX_CLASSES: usize = 6;
            let at = |k: &str| a.get(k).map_or(span, |(_, s)| *s);
            if !(2..=MAX_CLASSES).contains(&classes) {
                return Err(Diagnostic::error(
                    format!("synthetic.sar has 2 to {MAX_CLASSES} target classes (tank, truck, car, radar, launcher, apc), got {classes}"),
                    at("classes"),
                    "out of range",
                ));
            }
            if size < 8 {
                return Err(Diagnostic::error(
                    format!("synthetic.sar images are at least 8 pixels wide, got size = {size}"),
                    at("size"),
                    "too small",
                ));
            }
            if looks > 64 {
                return Err(Diagnostic::error(
                    format!("synthetic.sar has 1 to 64 speckle looks, got {looks}"),
                    at("looks"),
                    "out of range",
                ));
            }
            check_sar_inputs(inputs, classes, size, span)?;
            // An image is size² c64 pixels plus its i32 label.
            let per_sample = (size as u64).saturating_mul(size as u64).saturating_mul(8).saturating_add(4);
            check_data_size(name, count, per_sample, at("count"))?;
            Ok(DataSource::SyntheticSar { classes, size, scr_db, looks, count, seed })
        }
        "synthetic.polsar" => {
            let a = bind(
                name,
                &["count", "size", "classes", "regions", "gain_db", "contrast", "seed"],
                args,
                span,
            )?;
            let get_usize = |k: &str, d: usize| a.get(k).map_or(Ok(d), |(v, s)| positive(v, *s, k));
            let count = get_usize("count", 2000)?;
            let size = get_usize("size", 64)?;
            let classes = get_usize("classes", 5)?;
            let regions = get_usize("regions", 8)?;
            let gain_db = a.get("gain_db").map_or(Ok(3.0), |(v, s)| real_in(v, *s, "gain_db", 0.0, 20.0))?;
            let contrast =
                a.get("contrast").map_or(Ok(1.0), |(v, s)| real_in(v, *s, "contrast", 0.0, 1.0))?;
            let seed = a.get("seed").map_or(Ok(0), |(v, s)| int_at_least(v, *s, "seed", 0))? as u64;
            // The generator's limits (runtime/src/data/synthetic_polsar.rs): five classes,
            // scenes of at least 8 pixels, 1 to 256 regions, a contrast above 0.
            const MAX_CLASSES: usize = 5;
            let at = |k: &str| a.get(k).map_or(span, |(_, s)| *s);
            if !(2..=MAX_CLASSES).contains(&classes) {
                return Err(Diagnostic::error(
                    format!("synthetic.polsar has 2 to {MAX_CLASSES} scattering classes (surface, double_bounce, volume, oriented, helix), got {classes}"),
                    at("classes"),
                    "out of range",
                ));
            }
            if size < 8 {
                return Err(Diagnostic::error(
                    format!("synthetic.polsar scenes are at least 8 pixels wide, got size = {size}"),
                    at("size"),
                    "too small",
                ));
            }
            if regions > 256 {
                return Err(Diagnostic::error(
                    format!("synthetic.polsar has 1 to 256 regions per scene, got {regions}"),
                    at("regions"),
                    "out of range",
                ));
            }
            if contrast == 0.0 {
                return Err(Diagnostic::error(
                    "synthetic.polsar needs a contrast above 0 (at 0 every class has the same covariance)",
                    at("contrast"),
                    "no contrast",
                ));
            }
            check_polsar_inputs(inputs, classes, size, span)?;
            // A scene is 3·size² c64 values plus size² i32 labels.
            let per_sample = (size as u64).saturating_mul(size as u64).saturating_mul(3 * 8 + 4);
            check_data_size(name, count, per_sample, at("count"))?;
            Ok(DataSource::SyntheticPolsar { classes, size, regions, gain_db, contrast, count, seed })
        }
        "synthetic.random" => {
            let a = bind(name, &["count", "seed"], args, span)?;
            let count = a.get("count").map_or(Ok(1024), |(v, s)| positive(v, *s, "count"))?;
            let seed = a.get("seed").map_or(Ok(0), |(v, s)| int_at_least(v, *s, "seed", 0))? as u64;
            let per_sample = inputs.iter().fold(0u64, |acc, i| {
                acc.saturating_add(
                    (i.ty.shape.fixed_numel() as u64).saturating_mul(i.ty.dtype.bytes() as u64),
                )
            });
            check_data_size(name, count, per_sample, a.get("count").map_or(span, |(_, s)| *s))?;
            Ok(DataSource::SyntheticRandom { count, seed })
        }
        "npz" => {
            let a = bind(name, &["path"], args, span)?;
            match a.get("path") {
                Some((TVal::Str(p), _)) if !p.is_empty() => Ok(DataSource::Npz { path: p.clone() }),
                Some((other, s)) => Err(Diagnostic::error(
                    format!("`npz` takes a file path string, got {}", describe(other)),
                    *s,
                    "not a path",
                )
                .with_help("write `npz(\"data.npz\")`")),
                None => Err(Diagnostic::error("`npz` needs a file path", span, "no path")
                    .with_help("write `npz(\"data.npz\")`")),
            }
        }
        "synthetic.mri3d" => {
            let a = bind(name, &["count", "depth", "size", "accel", "seed"], args, span)?;
            let get_usize = |k: &str, d: usize| a.get(k).map_or(Ok(d), |(v, s)| positive(v, *s, k));
            let count = get_usize("count", 256)?;
            let depth = get_usize("depth", 16)?;
            let size = get_usize("size", 32)?;
            let accel = a.get("accel").map_or(Ok(4.0), |(v, s)| real_in(v, *s, "accel", 1.0, 32.0))?;
            let seed = a.get("seed").map_or(Ok(0), |(v, s)| int_at_least(v, *s, "seed", 0))? as u64;
            let at = |k: &str| a.get(k).map_or(span, |(_, s)| *s);
            // The generator's limit (runtime/src/data/synthetic_mri3d.rs).
            for (k, v) in [("depth", depth), ("size", size)] {
                if v < 4 {
                    return Err(Diagnostic::error(
                        format!(
                            "synthetic.mri3d volumes are at least 4 voxels along each axis, got {k} = {v}"
                        ),
                        at(k),
                        "too small",
                    ));
                }
            }
            check_mri3d_inputs(inputs, depth, size, span)?;
            // Two c64 volumes and an f32 mask per sample.
            let voxels = (depth as u64).saturating_mul(size as u64).saturating_mul(size as u64);
            check_data_size(name, count, voxels.saturating_mul(20), at("count"))?;
            Ok(DataSource::SyntheticMri3d { depth, size, accel, count, seed })
        }
        other => Err(unknown_choice("data source", other, &SOURCES, span)),
    }
}

/// synthetic.mri3d yields three `[B, 1, depth, size, size]` arrays, fed by name: `kspace`
/// (c64), `mask` (f32) and `target` (c64); the model must declare each.
fn check_mri3d_inputs(
    inputs: &[ModelInput],
    depth: usize,
    size: usize,
    span: Span,
) -> Result<(), Diagnostic> {
    let want = [Dim::Batch, Dim::Fixed(1), Dim::Fixed(depth), Dim::Fixed(size), Dim::Fixed(size)];
    let shape = format!("[B, 1, {depth}, {size}, {size}]");
    for (name, dtype) in [("kspace", DType::C64), ("mask", DType::F32), ("target", DType::C64)] {
        let Some(i) = inputs.iter().find(|i| i.name == name) else {
            return Err(Diagnostic::error(
                format!("synthetic.mri3d provides `{name}`, but the model has no input of that name"),
                span,
                "an array has nowhere to go",
            )
            .with_help(format!("declare `input {name}: {}{shape}` in the model", dtype_word(dtype))));
        };
        if i.ty.dtype != dtype || i.ty.shape.0[..] != want[..] {
            return Err(Diagnostic::error(
                format!(
                    "synthetic.mri3d feeds `{name}` as {}{shape}, but the input is {}",
                    dtype_word(dtype),
                    i.ty
                ),
                span,
                format!("{depth}×{size}×{size} volumes"),
            )
            .with_label(i.span, "this input")
            .with_help(format!(
                "declare `input {name}: {}{shape}`, or set `depth` and `size` to match",
                dtype_word(dtype)
            )));
        }
    }
    Ok(())
}

fn dtype_word(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::C64 => "c64",
        DType::I32 => "i32",
    }
}

/// A synthetic dataset of `count` samples of `per_sample` bytes must fit the data limit
/// ([`limits::max_data_bytes`]): refused here, at `cvc check`, rather than by an allocation
/// failure (an abort) when `cvc train` generates it.
fn check_data_size(source: &str, count: usize, per_sample: u64, span: Span) -> Result<(), Diagnostic> {
    let limit =
        limits::max_data_bytes().map_err(|e| Diagnostic::error(e, span, "while checking this size"))?;
    limits::dataset_bytes(source, count as u64, per_sample, limit)
        .map(|_| ())
        .map_err(|e| Diagnostic::error(e, span, "too many samples").with_help(limits::data_limit_help()))
}

/// synthetic.rf yields bursts of `length` complex samples and labels of `classes` classes:
/// the model needs one complex input of that many samples and one matching label input.
fn check_rf_inputs(
    inputs: &[ModelInput],
    classes: usize,
    length: usize,
    span: Span,
) -> Result<(), Diagnostic> {
    let labels: Vec<&ModelInput> = inputs.iter().filter(|i| i.ty.dtype == DType::I32).collect();
    let signals: Vec<&ModelInput> = inputs.iter().filter(|i| i.ty.dtype != DType::I32).collect();
    let Some(label) = labels.first() else {
        return Err(Diagnostic::error(
            "synthetic.rf provides class labels, but the model has no label input",
            span,
            "labels have nowhere to go",
        )
        .with_help(format!("declare `input label: class[B] of {classes}` in the model")));
    };
    if label.classes != Some(classes) {
        return Err(Diagnostic::error(
            format!(
                "synthetic.rf makes {classes} classes, but input `{}` has {}",
                label.name,
                label.classes.unwrap_or(0)
            ),
            span,
            format!("{classes} classes"),
        )
        .with_label(label.span, "declared here")
        .with_help(format!("make both the same, e.g. `classes = {}`", label.classes.unwrap_or(0))));
    }
    let Some(sig) = signals.first() else {
        return Err(Diagnostic::error(
            "synthetic.rf provides IQ bursts, but the model has no complex input",
            span,
            "no input to feed",
        )
        .with_help(format!("declare `input iq: c64[B, 1, {length}]` in the model")));
    };
    let per_sample = sig.ty.shape.fixed_numel();
    if sig.ty.dtype != DType::C64 || per_sample != length || signals.len() != 1 {
        return Err(Diagnostic::error(
            format!("synthetic.rf feeds one c64 input of {length} samples (`c64[B, 1, {length}]`), but input `{}` is {}", sig.name, sig.ty),
            span,
            format!("bursts of {length} samples"),
        )
        .with_label(sig.span, "this input")
        .with_help(format!("declare `input {}: c64[B, 1, {length}]`, or set `length = {per_sample}`", sig.name)));
    }
    Ok(())
}

/// A dB range argument: `lo..hi`, or one number for a fixed value.
fn db_range(v: &TVal, span: Span, what: &str) -> Result<(f64, f64), Diagnostic> {
    match v {
        TVal::Range(lo, hi) if lo > hi => {
            Err(Diagnostic::error(format!("empty `{what}` range {lo}..{hi}"), span, "low end above high end"))
        }
        TVal::Range(lo, hi) => Ok((*lo, *hi)),
        TVal::Int(n) => Ok((*n as f64, *n as f64)),
        TVal::Float(x) => Ok((*x, *x)),
        other => Err(Diagnostic::error(
            format!("`{what}` is a range such as `5..15`, got {}", describe(other)),
            span,
            "not a range",
        )),
    }
}

/// synthetic.sar yields `c64[B, 1, size, size]` images and labels of `classes` classes: the
/// model needs one complex input of exactly that shape and one matching label input.
fn check_sar_inputs(
    inputs: &[ModelInput],
    classes: usize,
    size: usize,
    span: Span,
) -> Result<(), Diagnostic> {
    let labels: Vec<&ModelInput> = inputs.iter().filter(|i| i.ty.dtype == DType::I32).collect();
    let images: Vec<&ModelInput> = inputs.iter().filter(|i| i.ty.dtype != DType::I32).collect();
    let Some(label) = labels.first() else {
        return Err(Diagnostic::error(
            "synthetic.sar provides class labels, but the model has no label input",
            span,
            "labels have nowhere to go",
        )
        .with_help(format!("declare `input label: class[B] of {classes}` in the model")));
    };
    if label.classes != Some(classes) {
        return Err(Diagnostic::error(
            format!(
                "synthetic.sar makes {classes} classes, but input `{}` has {}",
                label.name,
                label.classes.unwrap_or(0)
            ),
            span,
            format!("{classes} classes"),
        )
        .with_label(label.span, "declared here")
        .with_help(format!("make both the same, e.g. `classes = {}`", label.classes.unwrap_or(0))));
    }
    image_input(
        &images,
        span,
        size,
        &ImageFeed {
            source: "synthetic.sar",
            provides: "complex images",
            channels: 1,
            feeds: format!("{size}×{size} images"),
            note: "",
            label: format!("{size}×{size} images"),
        },
    )
}

/// synthetic.polsar yields `c64[B, 3, size, size]` scenes and per-pixel labels
/// `class[B, size, size] of classes` whose unlabelled pixels carry the loss's `ignore_index`:
/// the model needs one complex input and one label input of exactly those shapes, and a loss
/// that reads the labels (so that an ignore index exists).
fn check_polsar_inputs(
    inputs: &[ModelInput],
    classes: usize,
    size: usize,
    span: Span,
) -> Result<(), Diagnostic> {
    let labels: Vec<&ModelInput> = inputs.iter().filter(|i| i.ty.dtype == DType::I32).collect();
    let images: Vec<&ModelInput> = inputs.iter().filter(|i| i.ty.dtype != DType::I32).collect();
    let Some(label) = labels.first() else {
        return Err(Diagnostic::error(
            "synthetic.polsar provides per-pixel class labels, but the model has no label input",
            span,
            "labels have nowhere to go",
        )
        .with_help(format!("declare `input label: class[B, {size}, {size}] of {classes}` in the model")));
    };
    let want_label = [Dim::Batch, Dim::Fixed(size), Dim::Fixed(size)];
    if label.classes != Some(classes) || label.ty.shape.0[..] != want_label[..] {
        return Err(Diagnostic::error(
            format!(
                "synthetic.polsar makes per-pixel labels of {classes} classes (`class[B, {size}, {size}] of {classes}`), but input `{}` is class{} of {}",
                label.name,
                label.ty.shape,
                label.classes.unwrap_or(0)
            ),
            span,
            format!("{size}×{size} labels of {classes} classes"),
        )
        .with_label(label.span, "declared here")
        .with_help(format!("declare `input {}: class[B, {size}, {size}] of {classes}`, or change `size`/`classes` to match", label.name)));
    }
    if label.ignore_index.is_none() {
        return Err(Diagnostic::error(
            format!("synthetic.polsar leaves boundary pixels unlabelled, but no loss reads `{}`", label.name),
            span,
            "unlabelled pixels need an ignore_index",
        )
        .with_label(label.span, "declared here")
        .with_help(format!(
            "add `loss cross_entropy(logits, {}, ignore_index = 255)` (any index outside the classes)",
            label.name
        )));
    }
    if let Some(k) = label.ignore_index.filter(|&k| (0..classes as i64).contains(&k)) {
        return Err(Diagnostic::error(
            format!("synthetic.polsar marks unlabelled pixels with the loss's ignore_index {k}, which is one of its classes 0..{classes}"),
            span,
            "the ignore label would hide a class",
        )
        .with_label(label.span, "declared here")
        .with_help("use an ignore_index outside the classes, e.g. the default -100 or 255"));
    }
    image_input(
        &images,
        span,
        size,
        &ImageFeed {
            source: "synthetic.polsar",
            provides: "complex scattering vectors",
            channels: 3,
            feeds: format!("3-channel {size}×{size} scenes"),
            note: ": HH, HV, VV",
            label: format!("3×{size}×{size} scenes"),
        },
    )
}

/// What a built-in image dataset feeds its one complex input, for [`image_input`]'s messages.
struct ImageFeed {
    source: &'static str,
    provides: &'static str,
    channels: usize,
    feeds: String,
    note: &'static str,
    label: String,
}

/// Checks that the model has exactly one complex input `c64[B, channels, size, size]` for a
/// built-in image dataset (synthetic.sar, synthetic.polsar) to feed.
fn image_input(images: &[&ModelInput], span: Span, size: usize, f: &ImageFeed) -> Result<(), Diagnostic> {
    let (source, c) = (f.source, f.channels);
    let Some(img) = images.first() else {
        return Err(Diagnostic::error(
            format!("{source} provides {}, but the model has no complex input", f.provides),
            span,
            "no input to feed",
        )
        .with_help(format!("declare `input image: c64[B, {c}, {size}, {size}]` in the model")));
    };
    let want = [Dim::Batch, Dim::Fixed(c), Dim::Fixed(size), Dim::Fixed(size)];
    if img.ty.dtype != DType::C64 || img.ty.shape.0[..] != want[..] || images.len() != 1 {
        return Err(Diagnostic::error(
            format!(
                "{source} feeds one c64 input of {} (`c64[B, {c}, {size}, {size}]`{}), but input `{}` is {}",
                f.feeds, f.note, img.name, img.ty
            ),
            span,
            f.label.clone(),
        )
        .with_label(img.span, "this input")
        .with_help(format!(
            "declare `input {}: c64[B, {c}, {size}, {size}]`, or set `size` to match",
            img.name
        )));
    }
    Ok(())
}

fn optimizer(v: &TVal, span: Span) -> Result<Optimizer, Diagnostic> {
    const OPTS: [&str; 3] = ["sgd", "adam", "adamw"];
    let Some((name, args)) = call_parts(v) else {
        return Err(Diagnostic::error(format!("`optimizer` names an optimizer, got {}", describe(v)), span, "not an optimizer")
            .with_help("write `sgd(lr = 0.01, momentum = 0.9)`, `adam(lr = 1e-3)` or `adamw(lr = 1e-3, weight_decay = 0.01)`"));
    };
    let num =
        |a: &HashMap<&str, (&TVal, Span)>, k: &str, d: f64, lo: f64, hi: f64| -> Result<f64, Diagnostic> {
            a.get(k).map_or(Ok(d), |(v, s)| real_in(v, *s, k, lo, hi))
        };
    match name {
        "sgd" => {
            let a = bind(name, &["lr", "momentum", "nesterov", "weight_decay"], args, span)?;
            let nesterov = match a.get("nesterov") {
                None => false,
                Some((TVal::Bool(b), _)) => *b,
                Some((other, s)) => {
                    return Err(Diagnostic::error(
                        format!("`nesterov` is `true` or `false`, got {}", describe(other)),
                        *s,
                        "not a boolean",
                    ))
                }
            };
            Ok(Optimizer {
                kind: OptimizerKind::Sgd { momentum: num(&a, "momentum", 0.0, 0.0, 1.0)?, nesterov },
                lr: num(&a, "lr", 1e-2, 0.0, 1e3)?,
                weight_decay: num(&a, "weight_decay", 0.0, 0.0, 1e3)?,
            })
        }
        "adam" | "adamw" => {
            let a = bind(name, &["lr", "beta1", "beta2", "eps", "weight_decay"], args, span)?;
            let (beta1, beta2) = (num(&a, "beta1", 0.9, 0.0, 1.0)?, num(&a, "beta2", 0.999, 0.0, 1.0)?);
            let eps = num(&a, "eps", 1e-8, 0.0, 1.0)?;
            let wd_default = if name == "adamw" { 1e-2 } else { 0.0 };
            let kind = if name == "adam" {
                OptimizerKind::Adam { beta1, beta2, eps }
            } else {
                OptimizerKind::AdamW { beta1, beta2, eps }
            };
            Ok(Optimizer {
                kind,
                lr: num(&a, "lr", 1e-3, 0.0, 1e3)?,
                weight_decay: num(&a, "weight_decay", wd_default, 0.0, 1e3)?,
            })
        }
        other => Err(unknown_choice("optimizer", other, &OPTS, span)),
    }
}

fn schedule(v: &TVal, span: Span) -> Result<Schedule, Diagnostic> {
    const SCHEDULES: [&str; 3] = ["constant", "cosine", "step"];
    let Some((name, args)) = call_parts(v) else {
        return Err(Diagnostic::error(
            format!("`schedule` names a schedule, got {}", describe(v)),
            span,
            "not a schedule",
        )
        .with_help("write `constant`, `cosine(min_lr = 1e-5)` or `step(every = 2, gamma = 0.5)`"));
    };
    match name {
        "constant" => {
            bind(name, &[], args, span)?;
            Ok(Schedule::Constant)
        }
        "cosine" => {
            let a = bind(name, &["min_lr"], args, span)?;
            Ok(Schedule::Cosine {
                min_lr: a.get("min_lr").map_or(Ok(0.0), |(v, s)| real_in(v, *s, "min_lr", 0.0, 1e3))?,
            })
        }
        "step" => {
            let a = bind(name, &["every", "gamma"], args, span)?;
            let every = match a.get("every") {
                Some((v, s)) => positive(v, *s, "every")?,
                None => {
                    return Err(Diagnostic::error(
                        "`step` needs `every` (epochs between decays)",
                        span,
                        "missing `every`",
                    )
                    .with_help("write `step(every = 2, gamma = 0.5)`"))
                }
            };
            Ok(Schedule::Step {
                every,
                gamma: a.get("gamma").map_or(Ok(0.1), |(v, s)| real_in(v, *s, "gamma", 0.0, 1.0))?,
            })
        }
        other => Err(unknown_choice("schedule", other, &SCHEDULES, span)),
    }
}

#[cfg(test)]
mod byte_size_tests {
    use crate::front::check_source;
    use crate::ir::Mode;

    fn budget(value: &str) -> Result<Option<u64>, (String, usize, usize)> {
        let src = format!("model M {{ input x: c64[B, 4] }}\ntrain M {{ memory_budget = {value} }}\n");
        match check_source("m.cvnn", &src, Mode::Eval) {
            Ok(c) => Ok(c.train.memory_budget),
            Err(d) => {
                let (line, col) = d[0].primary.span.line_col(&src);
                Err((d[0].message.clone(), line, col))
            }
        }
    }

    fn recompute(value: &str) -> Result<bool, String> {
        let src = format!("model M {{ input x: c64[B, 4] }}\ntrain M {{ recompute = {value} }}\n");
        check_source("m.cvnn", &src, Mode::Eval)
            .map(|c| c.train.cheap_remat)
            .map_err(|d| d[0].message.clone())
    }

    /// `recompute = auto` (the default) or `budget`; anything else names the choices.
    #[test]
    fn recompute_policy_is_auto_or_budget() {
        assert_eq!(recompute("auto"), Ok(true));
        assert_eq!(recompute("budget"), Ok(false));
        assert_eq!(recompute("never"), Err("unknown recompute policy `never`".to_string()));
        assert!(recompute("1").unwrap_err().contains("`recompute` is `auto` or `budget`"));
        let src = "model M { input x: c64[B, 4] }\ntrain M { batch = 2 }\n";
        assert!(check_source("m.cvnn", src, Mode::Eval).expect("checks").train.cheap_remat);
    }

    /// The train section reads sizes with the command line's parser: `4g` is 4 GiB there too.
    #[test]
    fn train_section_sizes_use_the_shared_parser() {
        assert_eq!(budget("4g"), Ok(Some(4 << 30)));
        assert_eq!(budget("4GiB"), Ok(Some(4 << 30)));
        assert_eq!(budget("1.5GiB"), Ok(Some(3 << 29)));
        assert_eq!(budget("2GB"), Ok(Some(2_000_000_000)));
        assert_eq!(budget("512m"), Ok(Some(512 << 20)));
        assert_eq!(budget("1000"), Ok(Some(1000)));
    }

    #[test]
    fn bad_sizes_are_diagnostics_at_the_value() {
        let (msg, line, col) = budget("4XB").expect_err("unknown unit");
        assert!(msg.contains("unknown byte unit `xb`"), "{msg}");
        assert_eq!((line, col), (2, 27));
        let (msg, ..) = budget("99999999999TiB").expect_err("too large");
        assert!(msg.contains("too large"), "{msg}");
        let (msg, ..) = budget("0GiB").expect_err("zero");
        assert!(msg.contains("more than 0"), "{msg}");
    }
}
