//! The IR's text form: one line per node, `%id = op[attrs](operands) : type  ; role label @line`.

use super::*;
use std::fmt::Write;

/// Attributes of an op in the text form (empty when it has none).
pub fn attrs(op: &Op) -> String {
    match op {
        Op::Input { name } => format!("[{name}]"),
        Op::Param { name, init } | Op::State { name, init } => format!("[{name}, init={init:?}]"),
        Op::Scalar { value, batch_exp } => {
            if *batch_exp == 0 {
                format!("[{value}]")
            } else {
                format!("[{value}*B^{batch_exp}]")
            }
        }
        Op::Reduce { axes, .. } => format!("[axes={axes:?}]"),
        Op::Permute { perm } => format!("[perm={perm:?}]"),
        Op::Slice { axis, start, len } => format!("[axis={axis}, {start}..{}]", start + len),
        Op::Pad { axis, before, after } => format!("[axis={axis}, {before}, {after}]"),
        Op::Concat { axis } => format!("[axis={axis}]"),
        // `sum_batch` is written only when set, so the text of every plain matmul is unchanged.
        Op::MatMul { trans, conj, sum_batch } => {
            let sum = if *sum_batch { ", sum_batch" } else { "" };
            format!("[trans={trans:?}, conj={conj:?}{sum}]")
        }
        Op::Conv2d { geom, conj } => format!("[{}, conj={conj:?}]", geom_text(geom)),
        Op::ConvTranspose2d { geom, out_hw, conj } => {
            format!("[{}, out={out_hw:?}, conj={conj:?}]", geom_text(geom))
        }
        Op::Conv2dWeightGrad { geom, kernel, conj } => {
            format!("[{}, kernel={kernel:?}, conj={conj:?}]", geom_text(geom))
        }
        Op::Fft { axis, norm, .. } => format!("[axis={axis}, norm={norm:?}]"),
        Op::OneHot { classes } => format!("[classes={classes}]"),
        Op::ScatterAdd { rows } => format!("[rows={rows}]"),
        Op::DropoutMask { p, salt } => format!("[p={p}, salt={salt}]"),
        Op::AttnLse { spec } | Op::Attention { spec } => format!("[{}]", attn_text(spec)),
        Op::AttentionGrad { spec, wrt } => format!("[{}, wrt={wrt:?}]", attn_text(spec)),
        Op::Recurrence { spec } | Op::RecurrenceGrad { spec } => {
            // `init` only when set, so the text of a recurrence without `h0` reads as before.
            let init = if spec.init { ", init=true" } else { "" };
            format!("[cell={:?}, hidden={}, reverse={}{init}]", spec.cell, spec.hidden, spec.reverse)
        }
        _ => String::new(),
    }
}

fn attn_text(s: &AttnSpec) -> String {
    let dropout = match s.dropout {
        Some((p, salt)) => format!("[{p}, {salt}]"),
        None => "none".into(),
    };
    let h = &s.heads;
    format!(
        "heads={}, d={}, dv={}, cols={:?}, scale={}, score={:?}, causal={}, key_mask={}, dropout={dropout}",
        h.n, h.d, h.dv, h.cols, s.scale, s.score, s.causal, s.key_mask
    )
}

fn geom_text(g: &ConvGeom) -> String {
    format!("stride={:?}, pad={:?}, dilation={:?}, groups={}", g.stride, g.pad, g.dilation, g.groups)
}

/// One node as a line of text, with its source line when `src` is given.
pub fn node_line(g: &Graph, v: Value, src: Option<&str>) -> String {
    let n = g.node(v);
    let ops: Vec<String> = n.inputs.iter().map(|i| i.to_string()).collect();
    let mut s = format!("{v} = {}{}({}) : {}", n.op.mnemonic(), attrs(&n.op), ops.join(", "), n.ty);
    let _ = write!(s, "  ; {:?}", n.origin.role);
    if !n.origin.label.is_empty() {
        let _ = write!(s, " {}", n.origin.label);
    }
    if let Some(src) = src {
        let sp = g.span(v);
        if sp.end > 0 && (sp.end as usize) <= src.len() {
            let _ = write!(s, " @{}", sp.line_col(src).0);
        }
    }
    s
}

/// The whole graph as text.
pub fn print_graph(g: &Graph, src: Option<&str>) -> String {
    let mut s = format!("graph {} ({:?}) {{\n", g.name, g.mode);
    for v in g.nodes.handles() {
        let _ = writeln!(s, "  {}", node_line(g, v, src));
    }
    for o in &g.outputs {
        let _ = writeln!(s, "  output {} = {}", o.name, o.value);
    }
    if let Some(l) = g.loss {
        let _ = writeln!(s, "  loss = {l}");
    }
    s.push_str("}\n");
    s
}
