//! `plan.json` of a run folder: the memory plan of the training step as `cvc report` draws it
//! (bytes alive per schedule step, every buffer with its offset, lifetime, layer and `.cvnn`
//! line) with the planned arena, the lower bound and the measured peak.

use crate::buffers::{line_of, BufferKind};
use cvc_compiler::ir::Mode;
use cvc_compiler::passes::Program;
use cvc_grammar::LineIndex;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;

/// Version of the document's layout; `cvc report` refuses other versions.
pub const VERSION: u64 = 1;

/// The plan document of `p`, compiled from `src`. `measured_peak` is the back end's
/// measured peak (bytes) and `measured_kind` what was measured, when known.
pub fn document(
    p: &Program,
    src: &str,
    device: &str,
    measured_peak: Option<usize>,
    measured_kind: &str,
) -> serde_json::Value {
    let lines = LineIndex::new(src);
    let g = &p.graph;
    let plan = &p.plan;
    let steps = plan.steps.max(1);
    let mut alive = vec![0usize; steps];
    let mut source_lines: BTreeMap<usize, String> = BTreeMap::new();
    let buffers: Vec<serde_json::Value> = plan
        .buffers
        .iter()
        .map(|b| {
            let iv = &b.interval;
            for s in alive.iter_mut().take(iv.last.min(steps - 1) + 1).skip(iv.first) {
                *s += iv.bytes;
            }
            let values: Vec<serde_json::Value> = iv
                .values
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let from = iv.starts[i];
                    let to = iv.starts.get(i + 1).map_or(iv.last, |&n| n.saturating_sub(1).max(from));
                    let n = g.node(v);
                    let line = line_of(g, v, &lines);
                    if line > 0 {
                        source_lines.entry(line).or_insert_with(|| line_text(src, line));
                    }
                    json!({
                        "from": from,
                        "to": to,
                        "kind": BufferKind::of(p, v).name(),
                        "label": if n.origin.label.is_empty() { n.op.mnemonic() } else { n.origin.label.clone() },
                        "line": line,
                        "type": n.ty.to_string(),
                    })
                })
                .collect();
            json!({
                "offset": b.offset,
                "bytes": iv.bytes,
                "first": iv.first,
                "last": iv.last,
                "persistent": iv.persistent,
                "values": values,
            })
        })
        .collect();
    json!({
        "version": VERSION,
        "model": g.name,
        "mode": match g.mode { Mode::Train => "train", Mode::Eval => "eval" },
        "device": device,
        "batch": plan.batch,
        "steps": plan.steps,
        "peak_step": plan.peak_step,
        "arena_bytes": plan.arena_bytes,
        "lower_bound_bytes": plan.lower_bound_bytes,
        "persistent_bytes": plan.persistent_bytes,
        "param_bytes": plan.param_bytes,
        "fragmentation_pct": plan.fragmentation_pct(),
        "heuristic": plan.heuristic,
        "measured_peak_bytes": measured_peak,
        "measured_peak_kind": measured_kind,
        "alive_bytes": alive,
        "buffers": buffers,
        "source_lines": source_lines,
    })
}

fn line_text(src: &str, line: usize) -> String {
    src.lines().nth(line - 1).unwrap_or("").trim().to_string()
}

/// Writes `plan.json` of a training session into its run folder (atomically).
pub fn write(dir: &Path, session: &crate::session::Session) -> Result<(), String> {
    let kind = match session.device() {
        crate::session::Device::Cuda => "device memory",
        _ => "peak RSS of the process",
    };
    let doc = document(
        session.program(),
        session.model().source(),
        &session.device_name(),
        session.measured_peak_bytes(),
        kind,
    );
    let text = serde_json::to_string(&doc).map_err(|e| format!("plan.json: {e}"))?;
    crate::checkpoint::write_atomic(&dir.join(crate::run_dir::PLAN), text.as_bytes())
}
