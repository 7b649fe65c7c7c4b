//! The arena timeline as an SVG picture: x = schedule step, y = arena offset, one rectangle
//! per stored value coloured by what it holds, the peak step marked, a legend, and axes in
//! readable units.

use crate::buffers::{line_of, BufferKind};
use cvc_compiler::passes::Program;
use cvc_compiler::units::human_bytes;
use std::fmt::Write as _;

const WIDTH: f64 = 1200.0;
const HEIGHT: f64 = 720.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

const KINDS: [BufferKind; 5] = [
    BufferKind::Param,
    BufferKind::OptimizerState,
    BufferKind::Activation,
    BufferKind::Gradient,
    BufferKind::BackwardTemp,
];

fn colour(k: BufferKind) -> &'static str {
    match k {
        BufferKind::Param => "#4c72b0",
        BufferKind::OptimizerState => "#8172b3",
        BufferKind::Activation => "#55a868",
        BufferKind::Gradient => "#c44e52",
        BufferKind::BackwardTemp => "#dd8452",
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A round tick spacing of about `span / target` in bytes: 1, 2 or 5 times a power of 2^10
/// multiple (so labels read as whole MiB/GiB where possible).
fn tick_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(1.0);
    let mut unit = 1.0;
    while unit * 1024.0 <= raw {
        unit *= 1024.0;
    }
    let m = raw / unit;
    let nice = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0]
        .into_iter()
        .find(|&n| n >= m)
        .unwrap_or(1024.0);
    nice * unit
}

/// A byte count for an axis: binary units without trailing zeros (`512 MiB`, `1.5 GiB`).
fn tick_label(b: u64) -> String {
    let h = human_bytes(b);
    match h.split_once(' ') {
        Some((num, unit)) if num.contains('.') => {
            format!("{} {unit}", num.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => h,
    }
}

fn step_tick(steps: f64, target: f64) -> f64 {
    let raw = (steps / target).max(1.0);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * p).find(|&v| v >= raw).unwrap_or(10.0 * p)
}

/// Renders the plan of `p` (`src` gives source lines for the tooltips).
pub fn render_svg(p: &Program, src: &str) -> String {
    let lines = cvc_grammar::LineIndex::new(src);
    let plan = &p.plan;
    let steps = plan.steps.max(1) as f64;
    let arena = plan.arena_bytes.max(1) as f64;
    let pw = WIDTH - LEFT - RIGHT;
    let ph = HEIGHT - TOP - BOTTOM;
    let x = |step: f64| LEFT + step / steps * pw;
    let y = |off: f64| TOP + ph - off / arena * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{} — arena over the schedule ({}, batch {})</text>"#,
        escape(&p.graph.name),
        match p.graph.mode {
            cvc_compiler::ir::Mode::Train => "training step",
            cvc_compiler::ir::Mode::Eval => "inference",
        },
        plan.batch
    );
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="42" fill="#444">arena {} · lower bound {} · fragmentation {:.2}% · {}</text>"##,
        human_bytes(plan.arena_bytes as u64),
        human_bytes(plan.lower_bound_bytes as u64),
        plan.fragmentation_pct(),
        escape(&plan.heuristic)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#f7f7f7" stroke="#999"/>"##
    );

    // Buffers: one rectangle per value stored (a buffer written in place holds several).
    for b in &plan.buffers {
        let iv = &b.interval;
        for (i, &v) in iv.values.iter().enumerate() {
            let from = iv.starts[i];
            let to = iv.starts.get(i + 1).map_or(iv.last + 1, |&n| n);
            let kind = BufferKind::of(p, v);
            let (x0, x1) = (x(from as f64), x(to.max(from + 1) as f64));
            let (y0, y1) = (y((b.offset + iv.bytes) as f64), y(b.offset as f64));
            let n = p.graph.node(v);
            let line = line_of(&p.graph, v, &lines);
            let _ = writeln!(
                s,
                r#"<rect x="{x0:.2}" y="{y0:.2}" width="{:.2}" height="{:.2}" fill="{}" fill-opacity="0.85" stroke="white" stroke-width="0.3"><title>{v} {} {} ({}) steps {from}..{} line {line}</title></rect>"#,
                (x1 - x0).max(0.5),
                (y1 - y0).max(0.5),
                colour(kind),
                escape(&n.origin.label),
                n.ty,
                human_bytes(iv.bytes as u64),
                to.saturating_sub(1).max(from),
            );
        }
    }

    // Axes: y in binary units, x in steps.
    let ystep = tick_step(arena, 8.0);
    let mut t = 0.0;
    while t <= arena + 0.5 {
        let yy = y(t);
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{yy:.1}" x2="{LEFT}" y2="{yy:.1}" stroke="#333"/>"##,
            LEFT - 5.0
        );
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd" stroke-width="0.5"/>"##,
            LEFT + pw
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 8.0,
            yy + 4.0,
            tick_label(t as u64)
        );
        t += ystep;
    }
    let xstep = step_tick(steps, 10.0);
    let mut t = 0.0;
    while t <= steps + 0.5 {
        let xx = x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#333"/>"##,
            TOP + ph,
            TOP + ph + 5.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + ph + 18.0,
            t as u64
        );
        t += xstep;
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">schedule step (kernel)</text>"#,
        LEFT + pw / 2.0,
        HEIGHT - 14.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">arena offset</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );

    // The peak step and the lower bound.
    let px = x(plan.peak_step as f64 + 0.5);
    let _ = writeln!(
        s,
        r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#000" stroke-width="1.5" stroke-dasharray="6 4"/>"##,
        TOP + ph
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-weight="bold">peak (step {})</text>"#,
        px + 4.0,
        TOP + 14.0,
        plan.peak_step
    );
    let ly = y(plan.lower_bound_bytes as f64);
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="#000" stroke-width="1" stroke-dasharray="2 3"/>"##,
        LEFT + pw
    );

    // Legend.
    let lx = LEFT + pw + 20.0;
    let _ = writeln!(s, r#"<text x="{lx}" y="{:.1}" font-weight="bold">buffer holds</text>"#, TOP + 10.0);
    for (i, k) in KINDS.iter().enumerate() {
        let ly = TOP + 24.0 + i as f64 * 22.0;
        let _ = writeln!(s, r#"<rect x="{lx}" y="{ly}" width="16" height="14" fill="{}"/>"#, colour(*k));
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, lx + 22.0, ly + 11.5, k.name());
    }
    let ly = TOP + 24.0 + KINDS.len() as f64 * 22.0 + 10.0;
    let _ = writeln!(
        s,
        r##"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="#000" stroke-dasharray="6 4"/>"##,
        lx + 16.0
    );
    let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">peak step</text>"#, lx + 22.0, ly + 4.0);
    let ly = ly + 22.0;
    let _ = writeln!(
        s,
        r##"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="#000" stroke-dasharray="2 3"/>"##,
        lx + 16.0
    );
    let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">lower bound</text>"#, lx + 22.0, ly + 4.0);
    s.push_str("</svg>\n");
    s
}
