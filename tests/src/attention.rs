//! Small training programs around one fused attention (IR text), for the CUDA kernel tests:
//! `q = x·wq`, `k = y·wk`, `v = z·wv` (token-major `[B, rows, H·d]`, elementwise by learned
//! weights of the same shape without the batch, so autodiff asks for every attention
//! gradient; or q, k and v as columns of one or two such products, [`Layout`]),
//! `lse = attn_lse(q, k)`, `o = attention(q, k, v, lse)`,
//! loss `Σ Re(o · g)` with a random input `g`. The optional key mask is `step(m)` of a random
//! input (about half the keys masked); dropout reads the `step` state.

use cvc_compiler::config::{Optimizer, OptimizerKind};
use cvc_compiler::ir::parse::parse_graph;
use cvc_compiler::ir::Storage;
use cvc_compiler::passes::pipeline::{compile, Options};
use cvc_compiler::passes::Program;

/// One attention configuration: heads, extents (`T` queries, `S` keys, head widths `D`, `Dv`),
/// the operands' layout and the options of the attention spec.
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
    /// Where the heads lie: separate `q`, `k`, `v` or columns of one packed tensor.
    pub layout: Layout,
}

/// How a case's `q`, `k` and `v` are laid out (`ir::AttnHeads`): every operand is token-major
/// (`[B, rows, C]`, head `h` at columns `cols + h·d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Three tensors `[B, T, H·D]`, `[B, S, H·D]`, `[B, S, H·Dv]`.
    Separate,
    /// One `[B, T, H·(2D + Dv)]` tensor, q ‖ k ‖ v (self-attention's packed in-projection;
    /// needs `T = S`).
    Packed,
    /// `q` alone, `k ‖ v` one `[B, S, H·(D + Dv)]` tensor (cross-attention's packed key-value
    /// projection).
    PackedKv,
}

impl AttnCase {
    /// A short name for messages.
    pub fn name(&self) -> String {
        format!(
            "attn h{} t{} s{} d{} dv{}{}{}{}{}{}",
            self.h,
            self.t,
            self.s,
            self.d,
            self.dv,
            if self.abs { " abs" } else { " real" },
            if self.causal { " causal" } else { "" },
            if self.mask { " mask" } else { "" },
            if self.dropout.is_some() { " dropout" } else { "" },
            match self.layout {
                Layout::Separate => "",
                Layout::Packed => " packed",
                Layout::PackedKv => " packed-kv",
            }
        )
    }
}

/// The variants the kernel tests cover: both scores, causal (T < S and T > S), key mask,
/// dropout, head dimensions 7 to 128 (the narrow and the wide tilings, chunk tails, odd widths), query
/// counts across a 64-row tile and key counts across 32- and 16-key tiles (tails everywhere),
/// and heads read in place from packed projections (row strides wider than the heads).
pub fn cases() -> Vec<AttnCase> {
    let c = |h, t, s, d, dv, abs, causal, mask, dropout| AttnCase {
        h,
        t,
        s,
        d,
        dv,
        abs,
        causal,
        mask,
        dropout,
        layout: Layout::Separate,
    };
    vec![
        c(2, 70, 45, 16, 16, false, false, false, None),
        AttnCase { layout: Layout::PackedKv, ..c(2, 70, 45, 16, 16, false, false, true, None) },
        c(1, 37, 45, 40, 24, true, true, false, None),
        c(2, 70, 70, 64, 64, false, true, true, Some((0.25, 5))),
        AttnCase { layout: Layout::Packed, ..c(3, 70, 70, 32, 32, false, false, false, Some((0.25, 5))) },
        c(1, 20, 33, 100, 128, true, false, true, Some((0.5, 11))),
        c(1, 45, 37, 8, 72, false, true, false, None),
        c(1, 66, 40, 64, 64, true, false, false, Some((0.1, 3))),
        // Odd head widths: the kernels' element-per-element loads instead of pairs.
        c(2, 33, 50, 9, 7, true, false, true, None),
        AttnCase { layout: Layout::Packed, ..c(2, 41, 41, 7, 5, true, true, false, None) },
        c(1, 40, 40, 7, 10, false, true, false, Some((0.2, 9))),
    ]
}

/// The program of `c` in IR text (train mode, batch symbolic).
pub fn program_text(c: &AttnCase) -> String {
    let AttnCase { h, t, s, d, dv, .. } = *c;
    // The operands' columns and where each one's heads start (`AttnHeads::cols`).
    let (cols, wq, wkv) = match c.layout {
        Layout::Separate => ([0, 0, 0], h * d, h * d),
        Layout::Packed => ([0, h * d, 2 * h * d], h * (2 * d + dv), 0),
        Layout::PackedKv => ([0, 0, h * d], h * d, h * (d + dv)),
    };
    assert!(c.layout != Layout::Packed || t == s, "{}: a packed q ‖ k ‖ v needs T = S", c.name());
    let spec = format!(
        "heads={h}, d={d}, dv={dv}, cols={cols:?}, scale={}, score={}, causal={}, key_mask={}, dropout={}",
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
    let mut line = |text: String| {
        g.push_str("  ");
        g.push_str(&text);
        g.push('\n');
    };
    // Each operand is an input times a learned weight of its shape without the batch.
    let operand = |line: &mut dyn FnMut(String), i: usize, name: &str, rows: usize, width: usize| {
        line(format!("%{i} = input[{name}]() : c64[B, {rows}, {width}]  ; Input"));
        line(format!("%{} = param[w{name}, init=Ones]() : c64[{rows}, {width}]  ; Param", i + 4));
        line(format!("%{} = mul(%{i}, %{}) : c64[B, {rows}, {width}]  ; Forward", i + 7, i + 4));
    };
    let (q, k, v) = match c.layout {
        Layout::Separate => {
            operand(&mut line, 0, "x", t, wq);
            operand(&mut line, 1, "y", s, wkv);
            operand(&mut line, 2, "z", s, h * dv);
            ("%7", "%8", "%9")
        }
        Layout::Packed => {
            operand(&mut line, 0, "x", t, wq);
            ("%7", "%7", "%7")
        }
        Layout::PackedKv => {
            operand(&mut line, 0, "x", t, wq);
            operand(&mut line, 1, "y", s, wkv);
            ("%7", "%8", "%8")
        }
    };
    line(format!("%3 = input[g]() : c64[B, {t}, {}]  ; Input", h * dv));
    let mut extra = String::new();
    let mut lse_extra = String::new();
    if c.mask {
        line(format!("%10 = input[m]() : f32[B, {s}]  ; Input"));
        line(format!("%11 = step(%10) : f32[B, {s}]  ; Forward"));
        extra.push_str(", %11");
        lse_extra.push_str(", %11");
    }
    if c.dropout.is_some() {
        line("%12 = state[step, init=Zeros]() : i32[]  ; State".into());
        extra.push_str(", %12");
    }
    let o = format!("c64[B, {t}, {}]", h * dv);
    line(format!("%13 = attn_lse[{lse_spec}]({q}, {k}{lse_extra}) : f32[B, {h}, {t}]  ; Forward"));
    line(format!("%14 = attention[{spec}]({q}, {k}, {v}, %13{extra}) : {o}  ; Forward"));
    line(format!("%15 = mul(%14, %3) : {o}  ; Forward"));
    line(format!("%16 = real(%15) : f32[B, {t}, {}]  ; Forward", h * dv));
    line("%17 = reduce_sum[axes=[0, 1, 2]](%16) : f32[1, 1, 1]  ; Forward".into());
    line("%18 = reshape(%17) : f32[]  ; Forward".into());
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
    program_stored(c, batch, fuse, Storage::Full)
}

/// [`program_fused`] with its activations stored as `half` says (`Precision::storage`).
pub fn program_stored(c: &AttnCase, batch: usize, fuse: bool, half: Storage) -> Program {
    let text = program_text(c);
    let parsed = parse_graph(&text).unwrap_or_else(|e| panic!("{}: {e:?}\n{text}", c.name()));
    let sgd =
        Optimizer { kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false }, lr: 1.0, weight_decay: 0.0 };
    let opts = Options { batch, optimizer: sgd, fuse, half, ..Options::default() };
    compile(parsed.graph, &opts).unwrap_or_else(|e| panic!("{}: {e}", c.name()))
}

/// First-order bound on how far the tensor-core attention kernels (`attention_tc.rs`) may move
/// each element of `op`'s output beyond f32 arithmetic, with every product's operands rounded
/// to a format of unit roundoff `u` (TF32: 2⁻¹¹): per element the sum of the bounds of its
/// real and imaginary parts. `ins` are the op's operands as the device read them (`Attention`:
/// q, k, v, lse, then mask and step; `AttentionGrad`: q, k, v, o, dO, lse, …); `AttnLse` takes
/// q, k (its bound is that of the log-sum-exp a fused forward computes from rounded scores).
///
/// Per visible pair the score `s = scale·Re(q·conj k)` moves by at most
/// `e = 2u·scale·Σ(|qr||kr| + |qi||ki|)`, so `p = exp(s − lse)` by `p·(exp(e) − 1)`, and a
/// log-sum-exp computed from the same scores by `E = Σ_j p·e`; `dP = Re(dO·conj v)` moves by
/// `f = 2u·Σ(|dOr||vr| + |dOi||vi|)`; then each accumulation adds the rounding of its two
/// operands: `o_i` by `Σ_j keep·(δp + 2u·p)·|v_j|`, `dq_i` by `Σ_j (δg + 2u·|g|)·|k_j|` with
/// `g = scale·p·(keep·dP − δ)` and `δg = scale·(δp·|keep·dP − δ| + p·keep·f)`, `dk_j` by
/// `Σ_i (δg + 2u·|g|)·|q_i|` and `dv_j` by `Σ_i keep·(δp + 2u·p)·|dO_i|`.
pub fn tensor_core_bound(
    op: &cvc_compiler::ir::Op,
    ins: &[&cvc_compiler::interp::Tensor],
    u: f64,
) -> Result<Vec<f64>, String> {
    use cvc_compiler::ir::{dropout_keep, AttnSpec, AttnWrt, Op};
    let (spec, fixed) = match op {
        Op::AttnLse { spec } => (AttnSpec { dropout: None, ..*spec }, 2),
        Op::Attention { spec } => (*spec, 4),
        Op::AttentionGrad { spec, .. } => (*spec, 6),
        other => return Err(format!("{} is not an attention op", other.mnemonic())),
    };
    if ins.len() != fixed + spec.extra_operands() {
        return Err("attention operand count".into());
    }
    let cx =
        |i: usize, what: &str| ins[i].as_complex().ok_or_else(|| format!("attention {what} is not complex"));
    let (q, k) = (cx(0, "query")?, cx(1, "key")?);
    // Token-major operands, heads at the columns `spec.heads` gives (`ir::AttnHeads`).
    let hd = spec.heads;
    let (b, h, t, d, s) = (ins[0].shape[0], hd.n, ins[0].shape[1], hd.d, ins[1].shape[1]);
    let (v, dv) = if fixed > 2 { (cx(2, "value")?, hd.dv) } else { (&[][..], 0) };
    let ld: Vec<usize> = ins[..fixed.min(3)].iter().map(|x| x.shape[2]).collect();
    let at = |i: usize, bb: usize, hh: usize, rows: usize, r: usize, w: usize| {
        (bb * rows + r) * ld[i] + hd.cols[i] + hh * w
    };
    // Head `hh` of row `r` in a token-major `[B, rows, H·w]` tensor (o, dO, the outputs).
    let packed = |bb: usize, hh: usize, rows: usize, r: usize, w: usize| ((bb * rows + r) * h + hh) * w;
    let mut extra = ins[fixed..].iter();
    let mask = if spec.key_mask {
        Some(extra.next().and_then(|m| m.as_real()).ok_or("attention mask")?)
    } else {
        None
    };
    let step = match spec.dropout {
        Some(_) => {
            extra.next().and_then(|s| s.as_int()).and_then(|s| s.first().copied()).ok_or("attention step")?
                as u32
        }
        None => 0,
    };
    let lse_at = match op {
        Op::AttnLse { .. } => None,
        Op::Attention { .. } => Some(3),
        _ => Some(5),
    };
    let lse_in = match lse_at {
        Some(i) => Some(ins[i].as_real().ok_or("attention lse is not real")?),
        None => None,
    };
    let abs2 = |a: &[num_complex::Complex64], b: &[num_complex::Complex64]| -> f64 {
        a.iter().zip(b).map(|(x, y)| x.re.abs() * y.re.abs() + x.im.abs() * y.im.abs()).sum()
    };
    let l1 = |z: num_complex::Complex64| z.re.abs() + z.im.abs();
    let visible = |bb: usize, i: usize, j: usize| {
        !spec.causal_masked(i, j) && mask.is_none_or(|m| m[bb * s + j] == 0.0)
    };
    let keep = |bb: usize, hh: usize, i: usize, j: usize| match spec.dropout {
        None => 1.0,
        Some((p, salt)) => {
            let idx = AttnSpec::dropout_index(bb, hh, i, j, h, t, s);
            if dropout_keep(p, salt, step, idx) {
                1.0 / (1.0 - p)
            } else {
                0.0
            }
        }
    };
    let out_len = match op {
        Op::AttnLse { .. } => b * h * t,
        Op::Attention { .. } => b * h * t * dv,
        Op::AttentionGrad { wrt: AttnWrt::Q, .. } => b * h * t * d,
        _ => b * h * s * (d + dv),
    };
    let mut out = vec![0.0; out_len];
    for bh in 0..b * h {
        let (bb, hh) = (bh / h, bh % h);
        let qrow = |i: usize| &q[at(0, bb, hh, t, i, d)..][..d];
        let krow = |j: usize| &k[at(1, bb, hh, s, j, d)..][..d];
        let vrow = |j: usize| &v[at(2, bb, hh, s, j, dv)..][..dv];
        for i in 0..t {
            let vis: Vec<usize> = (0..s).filter(|&j| visible(bb, i, j)).collect();
            let scores: Vec<f64> = vis
                .iter()
                .map(|&j| {
                    spec.scale * qrow(i).iter().zip(krow(j)).map(|(a, c)| (a * c.conj()).re).sum::<f64>()
                })
                .collect();
            // The log-sum-exp the weights are taken against: the operand, else the exact one.
            let lse = match lse_in {
                Some(l) => l[bh * t + i],
                None if vis.is_empty() => 0.0,
                None => {
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    m + scores.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
                }
            };
            let e: Vec<f64> = vis.iter().map(|&j| 2.0 * u * spec.scale * abs2(qrow(i), krow(j))).collect();
            let p: Vec<f64> = scores.iter().map(|x| (x - lse).exp()).collect();
            let big_e: f64 = p.iter().zip(&e).map(|(p, e)| p * e).sum();
            match op {
                Op::AttnLse { .. } => out[bh * t + i] = big_e,
                Op::Attention { .. } => {
                    let row = &mut out[packed(bb, hh, t, i, dv)..][..dv];
                    for (n, &j) in vis.iter().enumerate() {
                        let dp = p[n] * (e[n] + big_e).exp_m1();
                        let w = keep(bb, hh, i, j) * (dp + 2.0 * u * p[n]);
                        row.iter_mut().zip(vrow(j)).for_each(|(r, x)| *r += w * l1(*x));
                    }
                }
                Op::AttentionGrad { wrt, .. } => {
                    let (o, d_o) = (cx(3, "output")?, cx(4, "output gradient")?);
                    let go = &d_o[packed(bb, hh, t, i, dv)..][..dv];
                    let oi = &o[packed(bb, hh, t, i, dv)..][..dv];
                    let delta: f64 = go.iter().zip(oi).map(|(g, x)| (g * x.conj()).re).sum();
                    for (n, &j) in vis.iter().enumerate() {
                        let kp = keep(bb, hh, i, j);
                        let dpij: f64 = go.iter().zip(vrow(j)).map(|(g, x)| (g * x.conj()).re).sum();
                        let f = 2.0 * u * abs2(go, vrow(j));
                        let dp = p[n] * e[n].exp_m1();
                        let g = spec.scale * p[n] * (kp * dpij - delta);
                        let dg = spec.scale * (dp * (kp * dpij - delta).abs() + p[n] * kp * f);
                        let wg = dg + 2.0 * u * g.abs();
                        match wrt {
                            AttnWrt::Q => {
                                let row = &mut out[packed(bb, hh, t, i, d)..][..d];
                                row.iter_mut().zip(krow(j)).for_each(|(r, x)| *r += wg * l1(*x));
                            }
                            AttnWrt::KV => {
                                // Row j of [B, S, H·D + H·Dv]: every head's dk, then every dv.
                                let row = (bb * s + j) * h * (d + dv);
                                let dk = &mut out[row + hh * d..][..d];
                                dk.iter_mut().zip(qrow(i)).for_each(|(r, x)| *r += wg * l1(*x));
                                let wp = kp * (dp + 2.0 * u * p[n]);
                                let dvv = &mut out[row + h * d + hh * dv..][..dv];
                                dvv.iter_mut().zip(go).for_each(|(r, x)| *r += wp * l1(*x));
                            }
                        }
                    }
                }
                _ => unreachable!("matched above"),
            }
        }
    }
    // (The terms above are first order; products of two roundings are below 4u of them.)
    out.iter_mut().for_each(|x| *x *= 1.0 + 4.0 * u);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::tensor_core_bound;
    use cvc_compiler::interp::{SplitMix64, Tensor};
    use cvc_compiler::ir::{dropout_keep, AttnHeads, AttnScore, AttnSpec, AttnWrt, Op};
    use num_complex::Complex64;

    /// Rounds to TF32 (11 significant bits, to nearest, ties away from zero: `cvt.rna`).
    fn tf32(x: f64) -> f64 {
        let bits = x.to_bits();
        f64::from_bits((bits + (1 << 41)) & !((1u64 << 42) - 1))
    }

    /// The tensor-core kernels' arithmetic in f64 with every product operand passed through
    /// `r`: outputs of the fused forward (`o`, `lse`), `dq` and `dk ‖ dv`.
    #[allow(clippy::too_many_arguments)]
    fn emulate(
        spec: &AttnSpec,
        ext: [usize; 6],
        q: &[Complex64],
        k: &[Complex64],
        v: &[Complex64],
        d_o: &[Complex64],
        lse_given: &[f64],
        r: fn(f64) -> f64,
    ) -> [Vec<Complex64>; 4] {
        let [b, h, t, s, d, dv] = ext;
        // Token-major `[B, rows, H·w]`: head `bh % H` of row `r`.
        let at = |bh: usize, rows: usize, r: usize, w: usize| ((bh / h * rows + r) * h + bh % h) * w;
        let rc = |z: &Complex64| Complex64::new(r(z.re), r(z.im));
        let dot = |a: &[Complex64], c: &[Complex64]| -> f64 {
            a.iter().zip(c).map(|(x, y)| rc(x).re * rc(y).re + rc(x).im * rc(y).im).sum()
        };
        let zero = Complex64::new(0.0, 0.0);
        let (mut o, mut lse) = (vec![zero; b * h * t * dv], vec![zero; b * h * t]);
        let (mut dq, mut dkv) = (vec![zero; b * h * t * d], vec![zero; b * h * s * (d + dv)]);
        for bh in 0..b * h {
            let keep = |i: usize, j: usize| match spec.dropout {
                Some((p, salt))
                    if !dropout_keep(p, salt, 3, AttnSpec::dropout_index(bh / h, bh % h, i, j, h, t, s)) =>
                {
                    0.0
                }
                Some((p, _)) => 1.0 / (1.0 - p),
                None => 1.0,
            };
            for i in 0..t {
                let qi = &q[at(bh, t, i, d)..][..d];
                let vis: Vec<usize> = (0..s).filter(|&j| !spec.causal_masked(i, j)).collect();
                let sc: Vec<f64> =
                    vis.iter().map(|&j| spec.scale * dot(qi, &k[at(bh, s, j, d)..][..d])).collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l = m + sc.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
                lse[bh * t + i] = Complex64::new(l, 0.0);
                let go = &d_o[at(bh, t, i, dv)..][..dv];
                // The forward's output (exact: δ is formed from the stored o in f32) for δ.
                let (mut oi, mut oe) = (vec![zero; dv], vec![zero; dv]);
                for (n, &j) in vis.iter().enumerate() {
                    let p = (sc[n] - l).exp();
                    let w = r(p * keep(i, j));
                    let pe = (sc[n] - lse_given[bh * t + i]).exp() * keep(i, j);
                    for (c, x) in v[at(bh, s, j, dv)..][..dv].iter().enumerate() {
                        oi[c] += w * rc(x);
                        oe[c] += pe * x;
                    }
                }
                o[at(bh, t, i, dv)..][..dv].copy_from_slice(&oi);
                let delta: f64 = go.iter().zip(&oe).map(|(g, x)| (g * x.conj()).re).sum();
                for (n, &j) in vis.iter().enumerate() {
                    let p = (sc[n] - lse_given[bh * t + i]).exp();
                    let kp = keep(i, j);
                    let dp = dot(go, &v[at(bh, s, j, dv)..][..dv]);
                    let g = r(spec.scale * p * (kp * dp - delta));
                    let kj = &k[at(bh, s, j, d)..][..d];
                    for (c, x) in kj.iter().enumerate() {
                        dq[at(bh, t, i, d) + c] += g * rc(x);
                    }
                    // Row j of [B, S, H·D + H·Dv]: every head's dk, then every head's dv.
                    let row = (bh / h * s + j) * h * (d + dv);
                    for (c, x) in qi.iter().enumerate() {
                        dkv[row + bh % h * d + c] += g * rc(x);
                    }
                    for (c, x) in go.iter().enumerate() {
                        dkv[row + h * d + bh % h * dv + c] += r(kp * p) * rc(x);
                    }
                }
            }
        }
        [o, lse, dq, dkv]
    }

    /// The bound holds: TF32 rounding of every product operand, emulated in f64, moves each
    /// output element of the forward, its log-sum-exp, dq and dk‖dv by no more than
    /// [`tensor_core_bound`] says, on random operands (causal with dropout included) — and the
    /// bound is not vacuous: it stays within a few hundred roundoffs of the outputs' size.
    #[test]
    fn tensor_core_bound_covers_emulated_tf32_rounding() {
        let u = 2f64.powi(-11);
        let mut rng = SplitMix64::new(0x7f32);
        for (causal, dropout) in [(false, None), (true, Some((0.2, 5)))] {
            let ext @ [b, h, t, s, d, dv] = [2, 2, 13, 17, 6, 5];
            let heads = AttnHeads::separate(h, d);
            let spec = AttnSpec {
                heads: AttnHeads { dv, ..heads },
                scale: 0.9,
                score: AttnScore::Real,
                causal,
                key_mask: false,
                dropout,
            };
            let mut draw = |n: usize| -> Vec<Complex64> {
                (0..n)
                    .map(|_| Complex64::new(3.0 * rng.next_f64() - 1.5, 3.0 * rng.next_f64() - 1.5))
                    .collect()
            };
            let (q, k, v, d_o) =
                (draw(b * h * t * d), draw(b * h * s * d), draw(b * h * s * dv), draw(b * h * t * dv));
            let exact = emulate(&spec, ext, &q, &k, &v, &d_o, &vec![0.0; b * h * t], |x| x);
            let lse: Vec<f64> = exact[1].iter().map(|z| z.re).collect();
            let [o, _, dq, dkv] = emulate(&spec, ext, &q, &k, &v, &d_o, &lse, |x| x);
            let got = emulate(&spec, ext, &q, &k, &v, &d_o, &lse, tf32);
            let ct = |shape: &[usize], x: &[Complex64]| Tensor::complex(shape, x.to_vec());
            let (tq, tk, tv) = (ct(&[b, t, h * d], &q), ct(&[b, s, h * d], &k), ct(&[b, s, h * dv], &v));
            let (to, tdo) = (ct(&[b, t, h * dv], &o), ct(&[b, t, h * dv], &d_o));
            let tl = Tensor::real(&[b, h, t], lse.clone());
            let step = Tensor::int(&[1], vec![3]);
            let mut fwd_ins = vec![&tq, &tk, &tv, &tl];
            let mut grad_ins = vec![&tq, &tk, &tv, &to, &tdo, &tl];
            if dropout.is_some() {
                fwd_ins.push(&step);
                grad_ins.push(&step);
            }
            let checks = [
                ("o", Op::Attention { spec }, fwd_ins.clone(), &o, &got[0]),
                ("lse", Op::AttnLse { spec }, vec![&tq, &tk], &exact[1], &got[1]),
                ("dq", Op::AttentionGrad { spec, wrt: AttnWrt::Q }, grad_ins.clone(), &dq, &got[2]),
                ("dkv", Op::AttentionGrad { spec, wrt: AttnWrt::KV }, grad_ins.clone(), &dkv, &got[3]),
            ];
            for (what, op, ins, want, got) in checks {
                let bound = tensor_core_bound(&op, &ins, u).expect("bound");
                assert_eq!(bound.len(), want.len(), "{what}");
                let (mut worst, mut size) = (0.0f64, 0.0f64);
                for (n, ((w, g), e)) in want.iter().zip(got).zip(&bound).enumerate() {
                    let err = (w.re - g.re).abs() + (w.im - g.im).abs();
                    assert!(
                        err <= *e,
                        "{what} (causal {causal}) element {n}: error {err:.3e} > bound {e:.3e}"
                    );
                    worst = worst.max(*e);
                    size = size.max(w.norm());
                }
                assert!(
                    worst < 500.0 * u * size.max(1.0),
                    "{what}: bound {worst:.3e} vacuous against size {size:.3e}"
                );
            }
        }
    }
}
