//! `cvc report RUN | MODEL.cvnn [--batch N] [--out FILE]`: one self-contained HTML page (inline
//! CSS, script and SVG; nothing fetched) with the loss and accuracy curves of a run folder's
//! `metrics.jsonl`, the memory timeline of its `plan.json` (written by `cvc train`, see
//! [`crate::run_plan`]) and the planned vs measured peak. Given a model file instead, the
//! page shows its plan alone.

use super::{CliError, CliResult};
use std::path::{Path, PathBuf};

/// The page; `__TITLE__` and `__DATA__` are filled in.
const PAGE: &str = include_str!("report.html");

/// Arguments of `cvc report`.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// A run folder written by `cvc train` (metrics.jsonl, plan.json), or a `.cvnn` file.
    pub path: PathBuf,
    /// Batch size to plan a `.cvnn` file for (default: its train section's batch).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Where to write the page (default: RUN/report.html, or MODEL.report.html next to the
    /// model file).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
}

/// Runs `cvc report`.
pub fn run(args: &ReportArgs) -> CliResult {
    if args.batch == Some(0) {
        return Err(CliError::Message("--batch must be at least 1".into()));
    }
    let (title, metrics, plan, default_out) = if args.path.is_dir() {
        if args.batch.is_some() {
            return Err(CliError::Message(
                "--batch is for a model file; a run folder's plan has the batch it was trained with".into(),
            ));
        }
        let (metrics, plan) = read_run(&args.path)?;
        (args.path.display().to_string(), metrics, plan, args.path.join("report.html"))
    } else {
        let checked = super::plan::load(&args.path, false)?;
        let opts = super::plan::options(&checked, args.batch, None, true, Default::default());
        let mut program = cvc_compiler::passes::pipeline::compile(checked.graph.clone(), &opts)
            .map_err(|e| super::compile_failed(&checked, &e))?;
        program.facts.set_lines(&checked.src);
        let plan = crate::run_plan::document(&program, &checked.src, "none (plan only)", None, "");
        (args.path.display().to_string(), Vec::new(), Some(plan), args.path.with_extension("report.html"))
    };
    let out = args.out.clone().unwrap_or(default_out);
    let data = serde_json::json!({ "title": title, "metrics": metrics, "plan": plan });
    let page = render(&title, &data);
    crate::checkpoint::write_atomic(&out, page.as_bytes())?;
    outln!("wrote {}", out.display())?;
    Ok(())
}

/// The page for `data` (`{title, metrics: [epoch records], plan: plan.json | null}`).
pub fn render(title: &str, data: &serde_json::Value) -> String {
    // `</` inside the JSON would end the script element early; `<\/` is the same JSON string.
    let json = serde_json::to_string(data).expect("report data serialises").replace("</", "<\\/");
    let title = title.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    PAGE.replacen("__TITLE__", &title, 1).replacen("__DATA__", &json, 1)
}

/// Reads a run folder: the epoch records of `metrics.jsonl` and `plan.json` (either may be
/// missing, not both).
fn read_run(dir: &Path) -> Result<(Vec<serde_json::Value>, Option<serde_json::Value>), CliError> {
    let metrics_path = dir.join("metrics.jsonl");
    let plan_path = dir.join("plan.json");
    if !metrics_path.exists() && !plan_path.exists() {
        return Err(CliError::Message(format!(
            "`{}` has neither metrics.jsonl nor plan.json: is it a run folder of `cvc train`?",
            dir.display()
        )));
    }
    let mut metrics = Vec::new();
    if metrics_path.exists() {
        let text = std::fs::read_to_string(&metrics_path)
            .map_err(|e| format!("cannot read `{}`: {e}", metrics_path.display()))?;
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: not a JSON record: {e}", metrics_path.display(), i + 1))?;
            if !v.get("epoch").is_some_and(|e| e.is_u64())
                || !v.get("train_loss").is_some_and(|l| l.is_number())
            {
                return Err(CliError::Message(format!(
                    "{}:{}: an epoch record needs `epoch` and `train_loss`",
                    metrics_path.display(),
                    i + 1
                )));
            }
            metrics.push(v);
        }
    }
    let plan = if plan_path.exists() {
        let text = std::fs::read_to_string(&plan_path)
            .map_err(|e| format!("cannot read `{}`: {e}", plan_path.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("`{}` is not JSON: {e}", plan_path.display()))?;
        if v.get("version").and_then(|v| v.as_u64()) != Some(crate::run_plan::VERSION) {
            return Err(CliError::Message(format!(
                "`{}` is not a plan of this cvc (version {} expected): train the run again",
                plan_path.display(),
                crate::run_plan::VERSION
            )));
        }
        Some(v)
    } else {
        None
    };
    Ok((metrics, plan))
}
