//! Small training programs around one fused attention (IR text), for the CUDA kernel tests:
//! `q = x·wq`, `k = y·wk`, `v = z·wv` (elementwise by learned `[H, ·, ·]` weights, so autodiff
//! asks for every attention gradient), `lse = attn_lse(q, k)`, `o = attention(q, k, v, lse)`,
//! loss `Σ Re(o · g)` with a random input `g`. The optional key mask is `step(m)` of a random
//! input (about half the keys masked); dropout reads the `step` state.

use cvc_compiler::config::{Optimizer, OptimizerKind};
use cvc_compiler::ir::parse::parse_graph;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;
use std::fmt::Write;

/// One attention configuration: extents of `q [B, H, T, D]`, `k [B, H, S, D]`,
/// `v [B, H, S, Dv]` and the options of the attention spec.
#[derive(Clone, Debug)]
pub struct AttnCase {
    /// Heads.
    pub h: usize,
    /// Queries.
    pub t: usize,
    /// Keys.
    pub s: usize,
    /// Query/key head dimension.
    pub d: usize,
    /// Value head dimension.
    pub dv: usize,
    /// Magnitude score (`|q·kᴴ|`) instead of the real part.
    pub abs: bool,
    /// Causal mask.
    pub causal: bool,
    /// Key-padding mask operand.
    pub mask: bool,
    /// Dropout `(p, salt)` on the weights.
    pub dropout: Option<(f64, u32)>,
}

impl AttnCase {
    /// A short name for messages.
    pub fn name(&self) -> String {
        format!(
            "attn h{} t{} s{} d{} dv{}{}{}{}{}",
            self.h,
            self.t,
            self.s,
            self.d,
            self.dv,
            if self.abs { " abs" } else { " real" },
            if self.causal { " causal" } else { "" },
            if self.mask { " mask" } else { "" },
            if self.dropout.is_some() { " dropout" } else { "" }
        )
    }
}

/// The variants the kernel tests cover: both scores, causal (T < S and T > S), key mask,
/// dropout, head dimensions 7 to 128 (the narrow and the wide tilings, chunk tails, odd widths), query
/// counts across a 64-row tile and key counts across 32- and 16-key tiles (tails everywhere).
pub fn cases() -> Vec<AttnCase> {
    let c =
        |h, t, s, d, dv, abs, causal, mask, dropout| AttnCase { h, t, s, d, dv, abs, causal, mask, dropout };
    vec![
        c(2, 70, 45, 16, 16, false, false, false, None),
        c(1, 37, 45, 40, 24, true, true, false, None),
        c(2, 70, 70, 64, 64, false, true, true, Some((0.25, 5))),
        c(1, 20, 33, 100, 128, true, false, true, Some((0.5, 11))),
        c(1, 45, 37, 8, 72, false, true, false, None),
        c(1, 66, 40, 64, 64, true, false, false, Some((0.1, 3))),
        // Odd head widths: the kernels' element-per-element loads instead of pairs.
        c(2, 33, 50, 9, 7, true, false, true, None),
        c(1, 40, 40, 7, 10, false, true, false, Some((0.2, 9))),
    ]
}

/// The program of `c` in IR text (train mode, batch symbolic).
pub fn program_text(c: &AttnCase) -> String {
    let AttnCase { h, t, s, d, dv, .. } = *c;
    let spec = format!(
        "scale={}, score={}, causal={}, key_mask={}, dropout={}",
        1.0 / (d as f64).sqrt(),
        if c.abs { "Abs" } else { "Real" },
        c.causal,
        c.mask,
        match c.dropout {
            Some((p, salt)) => format!("[{p}, {salt}]"),
            None => "none".into(),
        }
    );
    // Dropout does not change the log-sum-exp: its spec carries none (and no step operand).
    let lse_spec = match c.dropout {
        Some(_) => spec.replace(&spec[spec.find("dropout=").unwrap_or(spec.len())..], "dropout=none"),
        None => spec.clone(),
    };
    let mut g = String::from("graph attn (Train) {\n");
    let _ = writeln!(g, "  %0 = input[x]() : c64[B, {h}, {t}, {d}]  ; Input");
    let _ = writeln!(g, "  %1 = input[y]() : c64[B, {h}, {s}, {d}]  ; Input");
    let _ = writeln!(g, "  %2 = input[z]() : c64[B, {h}, {s}, {dv}]  ; Input");
    let _ = writeln!(g, "  %3 = input[g]() : c64[B, {h}, {t}, {dv}]  ; Input");
    let _ = writeln!(g, "  %4 = param[wq, init=Ones]() : c64[{h}, {t}, {d}]  ; Param");
    let _ = writeln!(g, "  %5 = param[wk, init=Ones]() : c64[{h}, {s}, {d}]  ; Param");
    let _ = writeln!(g, "  %6 = param[wv, init=Ones]() : c64[{h}, {s}, {dv}]  ; Param");
    let _ = writeln!(g, "  %7 = mul(%0, %4) : c64[B, {h}, {t}, {d}]  ; Forward");
    let _ = writeln!(g, "  %8 = mul(%1, %5) : c64[B, {h}, {s}, {d}]  ; Forward");
    let _ = writeln!(g, "  %9 = mul(%2, %6) : c64[B, {h}, {s}, {dv}]  ; Forward");
    let mut extra = String::new();
    let mut lse_extra = String::new();
    if c.mask {
        let _ = writeln!(g, "  %10 = input[m]() : f32[B, {s}]  ; Input");
        let _ = writeln!(g, "  %11 = step(%10) : f32[B, {s}]  ; Forward");
        extra.push_str(", %11");
        lse_extra.push_str(", %11");
    }
    if c.dropout.is_some() {
        let _ = writeln!(g, "  %12 = state[step, init=Zeros]() : i32[]  ; State");
        extra.push_str(", %12");
    }
    let _ = writeln!(g, "  %13 = attn_lse[{lse_spec}](%7, %8{lse_extra}) : f32[B, {h}, {t}]  ; Forward");
    let _ =
        writeln!(g, "  %14 = attention[{spec}](%7, %8, %9, %13{extra}) : c64[B, {h}, {t}, {dv}]  ; Forward");
    let _ = writeln!(g, "  %15 = mul(%14, %3) : c64[B, {h}, {t}, {dv}]  ; Forward");
    let _ = writeln!(g, "  %16 = real(%15) : f32[B, {h}, {t}, {dv}]  ; Forward");
    let _ = writeln!(g, "  %17 = reduce_sum[axes=[0, 1, 2, 3]](%16) : f32[1, 1, 1, 1]  ; Forward");
    let _ = writeln!(g, "  %18 = reshape(%17) : f32[]  ; Forward");
    g.push_str("  loss = %18\n}\n");
    g
}

/// The compiled training step of `c` at `batch` (plain SGD at lr 1, as the differential
/// tests use: a parameter's update is its gradient).
pub fn program(c: &AttnCase, batch: usize) -> Program {
    program_fused(c, batch, true)
}

/// [`program`], or with `fuse = false` its one-node-per-kernel baseline: the log-sum-exp then
/// has a kernel of its own and the forward reads it (`attn_lse` and `attn_fwd` on CUDA, which
/// the fused plan runs only for a forward recomputed under a memory budget).
pub fn program_fused(c: &AttnCase, batch: usize, fuse: bool) -> Program {
    let text = program_text(c);
    let parsed = parse_graph(&text).unwrap_or_else(|e| panic!("{}: {e:?}\n{text}", c.name()));
    let sgd =
        Optimizer { kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false }, lr: 1.0, weight_decay: 0.0 };
    let opts = Options { batch, optimizer: sgd, fuse, ..Options::default() };
    compile(parsed.graph, &opts).unwrap_or_else(|e| panic!("{}: {e}", c.name()))
}
