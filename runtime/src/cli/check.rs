//! `cvc check FILE [--json]`: parse and check a `.cvnn` file, print its layer table
//! (binding/op, output shape with the symbolic batch `B`, dtype, parameters) and totals, and
//! its warnings (bindings and outputs that reach no loss) on stderr; warnings keep exit 0.

use super::{CliError, CliResult};
use cvc_compiler::config::OptimizerKind;
use cvc_compiler::front::{self, train, Checked, TableRow};
use cvc_compiler::ir::{Dim, Mode, Shape};
use serde_json::{json, Value as Json};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `cvc check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The `.cvnn` file.
    pub file: PathBuf,
    /// Print the table as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `cvc check`.
pub fn run(args: &CheckArgs) -> CliResult {
    match front::check_file(&args.file, Mode::Train) {
        Ok(c) => {
            if !c.warnings.is_empty() {
                let color = std::io::stderr().is_terminal();
                err!("{}", front::render_all(&c.file, &c.src, &c.warnings, color));
            }
            if args.json {
                let text = serde_json::to_string_pretty(&to_json(&c))
                    .map_err(|e| CliError::Message(e.to_string()))?;
                outln!("{text}")
            } else {
                out!("{}", table_text(&c))
            }
        }
        Err((src, diags)) => {
            let color = std::io::stderr().is_terminal();
            err!("{}", front::render_all(&args.file.display().to_string(), &src, &diags, color));
            let n = diags.len();
            errln!(
                "error: could not check `{}` ({n} error{})",
                args.file.display(),
                if n == 1 { "" } else { "s" }
            );
            Err(CliError::Reported)
        }
    }
}

/// A parameter count: `288 c (576 r)`, `32 r`, or `288 c + 32 r (608 r)`.
pub fn params_text(complex: usize, real: usize) -> String {
    let real_only = real.saturating_sub(2 * complex);
    match (complex, real_only) {
        (0, 0) => "0".into(),
        (0, r) => format!("{} r", group(r)),
        (c, 0) => format!("{} c ({} r)", group(c), group(real)),
        (c, r) => format!("{} c + {} r ({} r)", group(c), group(r), group(real)),
    }
}

/// `1234567` → `1,234,567`.
fn group(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn totals(c: &Checked) -> (usize, usize) {
    c.table.iter().fold((0, 0), |(pc, pr), r| (pc + r.params_complex, pr + r.params_real))
}

/// The human-readable report: header, table, totals, outputs, loss and training settings.
pub fn table_text(c: &Checked) -> String {
    let head = ["layer", "op", "output", "dtype", "params", "line"];
    let rows: Vec<[String; 6]> = c
        .table
        .iter()
        .map(|r: &TableRow| {
            [
                r.label.clone(),
                r.op.clone(),
                r.shape.to_string(),
                r.dtype.to_string(),
                params_text(r.params_complex, r.params_real),
                r.line.to_string(),
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 6]| -> String {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(width).enumerate() {
            let pad = w - cell.chars().count();
            if i == 5 {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            } else {
                s.push_str(cell);
                s.push_str(&" ".repeat(pad));
                s.push_str("  ");
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let rule = "─".repeat(width.iter().sum::<usize>() + 2 * 5) + "\n";
    let mut out = format!("model {} ({})\n", c.model, c.file);
    out.push_str(&rule);
    out.push_str(&line(head));
    out.push_str(&rule);
    for r in &rows {
        out.push_str(&line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]));
    }
    out.push_str(&rule);
    let (pc, pr) = totals(c);
    let real_only = pr.saturating_sub(2 * pc);
    out.push_str(&format!(
        "parameters: {} complex + {} real = {} real scalars ({})\n",
        group(pc),
        group(real_only),
        group(pr),
        cvc_compiler::units::human_bytes(pr as u64 * 4)
    ));
    for o in &c.graph.outputs {
        out.push_str(&format!("output {}: {}\n", o.name, c.graph.ty(o.value)));
    }
    if let Some(l) = c.graph.loss {
        out.push_str(&format!("loss: {}\n", c.graph.ty(l)));
    }
    if c.has_train_section {
        out.push_str(&format!("train: {}\n", train_text(&c.train)));
    }
    out
}

/// One line summarising the training settings.
fn train_text(t: &train::TrainConfig) -> String {
    let data = match &t.data {
        train::DataSource::SyntheticRf { classes, length, snr_db, count, seed } => {
            format!("synthetic.rf(classes = {classes}, length = {length}, snr_db = {}..{}, count = {count}, seed = {seed})", snr_db.0, snr_db.1)
        }
        train::DataSource::SyntheticSar { classes, size, scr_db, looks, count, seed } => {
            format!("synthetic.sar(count = {count}, size = {size}, classes = {classes}, scr_db = {}..{}, looks = {looks}, seed = {seed})", scr_db.0, scr_db.1)
        }
        train::DataSource::SyntheticPolsar { classes, size, regions, gain_db, contrast, count, seed } => {
            format!("synthetic.polsar(count = {count}, size = {size}, classes = {classes}, regions = {regions}, gain_db = {gain_db}, contrast = {contrast}, seed = {seed})")
        }
        train::DataSource::SyntheticRandom { count, seed } => {
            format!("synthetic.random(count = {count}, seed = {seed})")
        }
        train::DataSource::Npz { path } => format!("npz({path:?})"),
        train::DataSource::SyntheticMri3d { depth, size, accel, count, seed } => {
            format!("synthetic.mri3d(count = {count}, depth = {depth}, size = {size}, accel = {accel}, seed = {seed})")
        }
    };
    let opt = match &t.optimizer.kind {
        OptimizerKind::Sgd { momentum, nesterov } => {
            format!("sgd(lr = {}, momentum = {momentum}, nesterov = {nesterov})", t.optimizer.lr)
        }
        OptimizerKind::Adam { .. } => format!("adam(lr = {})", t.optimizer.lr),
        OptimizerKind::AdamW { .. } => {
            format!("adamw(lr = {}, weight_decay = {})", t.optimizer.lr, t.optimizer.weight_decay)
        }
    };
    let sched = match &t.schedule {
        train::Schedule::Constant => "constant lr".to_string(),
        train::Schedule::Cosine { min_lr } => format!("cosine(min_lr = {min_lr})"),
        train::Schedule::Step { every, gamma } => format!("step(every = {every}, gamma = {gamma})"),
    };
    let mut s = format!(
        "{data}, batch {}, {} epoch{}, {opt}, {sched}, seed {}",
        t.batch,
        t.epochs,
        if t.epochs == 1 { "" } else { "s" },
        t.seed
    );
    if let Some(b) = t.memory_budget {
        s.push_str(&format!(", memory budget {}", cvc_compiler::units::human_bytes(b)));
    }
    s
}

fn shape_json(s: &Shape) -> Json {
    Json::Array(
        s.0.iter()
            .map(|d| match d {
                Dim::Batch => json!("B"),
                Dim::Fixed(n) => json!(n),
            })
            .collect(),
    )
}

/// The same report as JSON.
pub fn to_json(c: &Checked) -> Json {
    let (pc, pr) = totals(c);
    let layers: Vec<Json> = c
        .table
        .iter()
        .map(|r| {
            json!({
                "label": r.label, "op": r.op, "shape": shape_json(&r.shape), "dtype": r.dtype.name(),
                "params_complex": r.params_complex, "params_real": r.params_real, "line": r.line,
            })
        })
        .collect();
    let inputs: Vec<Json> = c
        .inputs
        .iter()
        .map(|i| json!({ "name": i.name, "shape": shape_json(&i.ty.shape), "dtype": i.ty.dtype.name(), "classes": i.classes }))
        .collect();
    let outputs: Vec<Json> = c
        .graph
        .outputs
        .iter()
        .map(|o| {
            let ty = c.graph.ty(o.value);
            json!({ "name": o.name, "shape": shape_json(&ty.shape), "dtype": ty.dtype.name() })
        })
        .collect();
    let loss = c.graph.loss.map(|l| {
        let ty = c.graph.ty(l);
        json!({ "shape": shape_json(&ty.shape), "dtype": ty.dtype.name() })
    });
    json!({
        "file": c.file,
        "model": c.model,
        "inputs": inputs,
        "layers": layers,
        "outputs": outputs,
        "loss": loss,
        "totals": { "params_complex": pc, "params_real": pr, "param_bytes": pr * 4 },
        "train": if c.has_train_section { serde_json::to_value(&c.train).unwrap_or(Json::Null) } else { Json::Null },
    })
}
