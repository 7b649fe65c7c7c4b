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
    let (b, h, t, d) = (ins[0].shape[0], ins[0].shape[1], ins[0].shape[2], ins[0].shape[3]);
    let s = ins[1].shape[2];
    let (v, dv) = if fixed > 2 { (cx(2, "value")?, ins[2].shape[3]) } else { (&[][..], 0) };
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
        let qrow = |i: usize| &q[(bh * t + i) * d..][..d];
        let krow = |j: usize| &k[(bh * s + j) * d..][..d];
        let vrow = |j: usize| &v[(bh * s + j) * dv..][..dv];
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
                    let row = &mut out[(bh * t + i) * dv..][..dv];
                    for (n, &j) in vis.iter().enumerate() {
                        let dp = p[n] * (e[n] + big_e).exp_m1();
                        let w = keep(bb, hh, i, j) * (dp + 2.0 * u * p[n]);
                        row.iter_mut().zip(vrow(j)).for_each(|(r, x)| *r += w * l1(*x));
                    }
                }
                Op::AttentionGrad { wrt, .. } => {
                    let (o, d_o) = (cx(3, "output")?, cx(4, "output gradient")?);
                    let go = &d_o[(bh * t + i) * dv..][..dv];
                    let oi = &o[(bh * t + i) * dv..][..dv];
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
                                let row = &mut out[(bh * t + i) * d..][..d];
                                row.iter_mut().zip(krow(j)).for_each(|(r, x)| *r += wg * l1(*x));
                            }
                            AttnWrt::KV => {
                                let row = &mut out[(bh * s + j) * (d + dv)..][..d + dv];
                                let (dk, dvv) = row.split_at_mut(d);
                                dk.iter_mut().zip(qrow(i)).for_each(|(r, x)| *r += wg * l1(*x));
                                let wp = kp * (dp + 2.0 * u * p[n]);
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
    use cvc_compiler::ir::{dropout_keep, AttnScore, AttnSpec, AttnWrt, Op};
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
                let qi = &q[(bh * t + i) * d..][..d];
                let vis: Vec<usize> = (0..s).filter(|&j| !spec.causal_masked(i, j)).collect();
                let sc: Vec<f64> =
                    vis.iter().map(|&j| spec.scale * dot(qi, &k[(bh * s + j) * d..][..d])).collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l = m + sc.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
                lse[bh * t + i] = Complex64::new(l, 0.0);
                let go = &d_o[(bh * t + i) * dv..][..dv];
                // The forward's output (exact: δ is formed from the stored o in f32) for δ.
                let (mut oi, mut oe) = (vec![zero; dv], vec![zero; dv]);
                for (n, &j) in vis.iter().enumerate() {
                    let p = (sc[n] - l).exp();
                    let w = r(p * keep(i, j));
                    let pe = (sc[n] - lse_given[bh * t + i]).exp() * keep(i, j);
                    for (c, x) in v[(bh * s + j) * dv..][..dv].iter().enumerate() {
                        oi[c] += w * rc(x);
                        oe[c] += pe * x;
                    }
                }
                o[(bh * t + i) * dv..][..dv].copy_from_slice(&oi);
                let delta: f64 = go.iter().zip(&oe).map(|(g, x)| (g * x.conj()).re).sum();
                for (n, &j) in vis.iter().enumerate() {
                    let p = (sc[n] - lse_given[bh * t + i]).exp();
                    let kp = keep(i, j);
                    let dp = dot(go, &v[(bh * s + j) * dv..][..dv]);
                    let g = r(spec.scale * p * (kp * dp - delta));
                    let kj = &k[(bh * s + j) * d..][..d];
                    for (c, x) in kj.iter().enumerate() {
                        dq[(bh * t + i) * d + c] += g * rc(x);
                    }
                    let row = (bh * s + j) * (d + dv);
                    for (c, x) in qi.iter().enumerate() {
                        dkv[row + c] += g * rc(x);
                    }
                    for (c, x) in go.iter().enumerate() {
                        dkv[row + d + c] += r(kp * p) * rc(x);
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
            let spec = AttnSpec { scale: 0.9, score: AttnScore::Real, causal, key_mask: false, dropout };
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
            let (tq, tk, tv) = (ct(&[b, h, t, d], &q), ct(&[b, h, s, d], &k), ct(&[b, h, s, dv], &v));
            let (to, tdo) = (ct(&[b, h, t, dv], &o), ct(&[b, h, t, dv], &d_o));
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
