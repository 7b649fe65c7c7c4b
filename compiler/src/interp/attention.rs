//! The attention primitives of the interpreter (`AttnLse`, `Attention`, `AttentionGrad`):
//! plain O(T·S) loops per query row, the formulas of `ir::op` written out once.

use super::tensor::Tensor;
use crate::ir::{dropout_keep, AttnScore, AttnSpec, AttnWrt};
use num_complex::Complex64;

/// The operands of one attention op, split by role, with the extents read off them.
pub struct AttnOperands<'a> {
    spec: AttnSpec,
    q: &'a [Complex64],
    k: &'a [Complex64],
    v: &'a [Complex64],
    mask: Option<&'a [f64]>,
    step: u32,
    /// Columns of the query, key and value operands (their row strides).
    ld: [usize; 3],
    /// Batch, heads, queries, keys, query/key features, value features.
    b: usize,
    h: usize,
    t: usize,
    s: usize,
    d: usize,
    dv: usize,
}

fn complex<'a>(t: &'a Tensor, what: &str) -> Result<&'a [Complex64], String> {
    t.as_complex().ok_or_else(|| format!("attention {what} is not complex"))
}

impl<'a> AttnOperands<'a> {
    /// Reads `[q, k, (v, …fixed), (mask), (step)]`: `fixed` operands come before the extras
    /// (2 for `AttnLse`, 4 for `Attention`, 6 for `AttentionGrad`); `v` is operand 2 when
    /// `fixed > 2`.
    pub fn new(spec: AttnSpec, ins: &[&'a Tensor], fixed: usize) -> Result<Self, String> {
        // `AttnLse` (2 fixed operands) takes no step counter: dropout follows the softmax.
        let spec = if fixed == 2 { AttnSpec { dropout: None, ..spec } } else { spec };
        if ins.len() != fixed + spec.extra_operands() || ins.len() < 2 {
            return Err("attention operand count".into());
        }
        let (q, k) = (complex(ins[0], "query")?, complex(ins[1], "key")?);
        let v = if fixed > 2 { complex(ins[2], "value")? } else { &[] };
        let hd = spec.heads;
        let (sq, sk) = (&ins[0].shape, &ins[1].shape);
        let (b, h, t, d, s) = (sq[0], hd.n, sq[1], hd.d, sk[1]);
        let dv = if fixed > 2 { hd.dv } else { 0 };
        let lv = if fixed > 2 { ins[2].shape[2] } else { 0 };
        let ld = [sq[2], sk[2], lv];
        let mut extra = ins[fixed..].iter();
        let mask = match spec.key_mask {
            true => Some(extra.next().and_then(|m| m.as_real()).ok_or("attention mask is not real")?),
            false => None,
        };
        let step = match spec.dropout {
            Some(_) => extra
                .next()
                .and_then(|s| s.as_int())
                .and_then(|s| s.first().copied())
                .ok_or("attention step")? as u32,
            None => 0,
        };
        Ok(AttnOperands { spec, q, k, v, mask, step, ld, b, h, t, s, d, dv })
    }

    /// Whether key `j` is visible to query `i` of batch row `b`.
    fn visible(&self, b: usize, i: usize, j: usize) -> bool {
        !self.spec.causal_masked(i, j) && self.mask.is_none_or(|m| m[b * self.s + j] == 0.0)
    }

    /// Where head `bh % H` of row `r` of batch row `bh / H` starts in operand `i` (0 q, 1 k,
    /// 2 v) of `rows` rows per batch row.
    fn at(&self, i: usize, bh: usize, rows: usize, r: usize) -> usize {
        let w = if i == 2 { self.dv } else { self.d };
        ((bh / self.h) * rows + r) * self.ld[i] + self.spec.heads.cols[i] + (bh % self.h) * w
    }

    /// Where head `bh % H` of row `r` starts in a token-major `[B, rows, H·w]` tensor.
    fn packed(&self, bh: usize, rows: usize, r: usize, w: usize) -> usize {
        ((bh / self.h) * rows + r) * self.h * w + (bh % self.h) * w
    }

    /// `c = q_i · conj(k_j)` and the score `s` it gives, for the head `bh = b·H + h`.
    fn score(&self, bh: usize, i: usize, j: usize) -> (Complex64, f64) {
        let q = &self.q[self.at(0, bh, self.t, i)..][..self.d];
        let k = &self.k[self.at(1, bh, self.s, j)..][..self.d];
        let c: Complex64 = q.iter().zip(k).map(|(a, b)| a * b.conj()).sum();
        let s = match self.spec.score {
            AttnScore::Real => c.re,
            AttnScore::Abs => c.norm(),
        };
        (c, self.spec.scale * s)
    }

    /// The dropout factor `keep_ij` (1 without dropout).
    fn keep(&self, bh: usize, i: usize, j: usize) -> f64 {
        match self.spec.dropout {
            None => 1.0,
            Some((p, salt)) => {
                let idx = AttnSpec::dropout_index(bh / self.h, bh % self.h, i, j, self.h, self.t, self.s);
                if dropout_keep(p, salt, self.step, idx) {
                    1.0 / (1.0 - p)
                } else {
                    0.0
                }
            }
        }
    }

    /// `lse` of every row, f32 `[B, H, T]` (0 for a row without visible keys).
    pub fn lse(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.b * self.h * self.t);
        for bh in 0..self.b * self.h {
            for i in 0..self.t {
                let scores: Vec<f64> = (0..self.s)
                    .filter(|&j| self.visible(bh / self.h, i, j))
                    .map(|j| self.score(bh, i, j).1)
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                out.push(if scores.is_empty() {
                    0.0
                } else {
                    m + scores.iter().map(|s| (s - m).exp()).sum::<f64>().ln()
                });
            }
        }
        out
    }

    /// The weight `p_ij = exp(s_ij − lse_i)` and `c_ij`, or `None` for a masked key.
    fn weight(&self, lse: &[f64], bh: usize, i: usize, j: usize) -> Option<(f64, Complex64)> {
        self.visible(bh / self.h, i, j).then(|| {
            let (c, s) = self.score(bh, i, j);
            ((s - lse[bh * self.t + i]).exp(), c)
        })
    }

    /// The attention output, c64 `[B, T, H·Dv]`.
    pub fn forward(&self, lse: &[f64]) -> Vec<Complex64> {
        let mut o = vec![Complex64::new(0.0, 0.0); self.b * self.h * self.t * self.dv];
        for bh in 0..self.b * self.h {
            for i in 0..self.t {
                let row = &mut o[self.packed(bh, self.t, i, self.dv)..][..self.dv];
                for j in 0..self.s {
                    if let Some((p, _)) = self.weight(lse, bh, i, j) {
                        let w = p * self.keep(bh, i, j);
                        let v = &self.v[self.at(2, bh, self.s, j)..][..self.dv];
                        row.iter_mut().zip(v).for_each(|(r, x)| *r += w * x);
                    }
                }
            }
        }
        o
    }

    /// `dq` (c64 `[B, T, H·D]`) or `dk ‖ dv` (c64 `[B, S, H·D + H·Dv]`) from the output `o`
    /// (`[B, T, H·Dv]`), its gradient `d_o` and `lse`.
    pub fn grad(&self, o: &[Complex64], d_o: &[Complex64], lse: &[f64], wrt: AttnWrt) -> Vec<Complex64> {
        let (d, dv) = (self.d, self.dv);
        let zero = Complex64::new(0.0, 0.0);
        let mut dq = vec![zero; if wrt == AttnWrt::Q { self.b * self.h * self.t * d } else { 0 }];
        let mut dkv = vec![zero; if wrt == AttnWrt::KV { self.b * self.h * self.s * (d + dv) } else { 0 }];
        for bh in 0..self.b * self.h {
            for i in 0..self.t {
                let row = self.packed(bh, self.t, i, dv);
                let (go, oi) = (&d_o[row..][..dv], &o[row..][..dv]);
                let delta: f64 = go.iter().zip(oi).map(|(g, x)| (g * x.conj()).re).sum();
                for j in 0..self.s {
                    let Some((p, c)) = self.weight(lse, bh, i, j) else { continue };
                    let keep = self.keep(bh, i, j);
                    let v = &self.v[self.at(2, bh, self.s, j)..][..dv];
                    let dp = keep * go.iter().zip(v).map(|(g, x)| (g * x.conj()).re).sum::<f64>();
                    let ds = p * (dp - delta);
                    // g = ∂s/∂c-weighted factor: real score `scale·dS`, abs score
                    // `scale·dS·c/|c|` (0 at c = 0, where |c| has no derivative).
                    let g = match self.spec.score {
                        AttnScore::Real => Complex64::new(self.spec.scale * ds, 0.0),
                        AttnScore::Abs if c.norm() > 0.0 => self.spec.scale * ds * c / c.norm(),
                        AttnScore::Abs => zero,
                    };
                    match wrt {
                        AttnWrt::Q => {
                            let k = &self.k[self.at(1, bh, self.s, j)..][..d];
                            let out = &mut dq[self.packed(bh, self.t, i, d)..][..d];
                            out.iter_mut().zip(k).for_each(|(r, x)| *r += g * x);
                        }
                        AttnWrt::KV => {
                            // Row `j` of `[B, S, H·D + H·Dv]`: every head's dk, then every dv.
                            let q = &self.q[self.at(0, bh, self.t, i)..][..d];
                            let (bb, hh) = (bh / self.h, bh % self.h);
                            let base = (bb * self.s + j) * self.h * (d + dv);
                            let dk = &mut dkv[base + hh * d..][..d];
                            dk.iter_mut().zip(q).for_each(|(r, x)| *r += g.conj() * x);
                            let dvv = &mut dkv[base + self.h * d + hh * dv..][..dv];
                            dvv.iter_mut().zip(go).for_each(|(r, x)| *r += keep * p * x);
                        }
                    }
                }
            }
        }
        if wrt == AttnWrt::Q {
            dq
        } else {
            dkv
        }
    }
}
