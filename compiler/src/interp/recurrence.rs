//! The fused recurrences (`Recurrence`, `RecurrenceGrad`) in f64: the GRU and LSTM cells of
//! complextorch step by step, and back-propagation through time with the gates recomputed
//! from the stored states (the meaning in `ir::op`, written as directly as possible),
//! optionally from a given initial state `h0` whose gradient the backward then delivers.

use crate::ir::{RnnCell, RnnSpec};
use num_complex::Complex64 as C;

fn split(z: C, f: fn(f64) -> f64) -> C {
    C::new(f(z.re), f(z.im))
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `σ(Re z) + i σ(Im z)`.
fn sig(z: C) -> C {
    split(z, sigmoid)
}

/// `tanh(Re z) + i tanh(Im z)`.
fn tanh(z: C) -> C {
    split(z, f64::tanh)
}

/// The gradient through a split activation with per-part derivative `d`: `d_re·Re g + i d_im·Im g`.
fn through(d: C, g: C) -> C {
    C::new(d.re * g.re, d.im * g.im)
}

/// Per-part derivative of the split sigmoid from its output `s`.
fn dsig(s: C) -> C {
    C::new(s.re * (1.0 - s.re), s.im * (1.0 - s.im))
}

/// Per-part derivative of the split tanh from its output `y`.
fn dtanh(y: C) -> C {
    C::new(1.0 - y.re * y.re, 1.0 - y.im * y.im)
}

/// Extents and operands of one recurrence: `xp [B, T, G·H]`, `w [G·H, H]`, `bias [G·H]`,
/// `h0 [B, S·H]` (the state before the first step; `None`: zeros).
pub(crate) struct Rnn<'a> {
    pub spec: RnnSpec,
    pub b: usize,
    pub t: usize,
    pub xp: &'a [C],
    pub w: &'a [C],
    pub bias: &'a [C],
    pub h0: Option<&'a [C]>,
}

/// The gates of one step, recomputed from the previous state.
struct Gates {
    /// Activated gates, `G·H` (GRU `r, z, n`; LSTM `i, f, g, o`).
    act: Vec<C>,
    /// `gh = W_hh·h_prev + b_hh`, `G·H`.
    gh: Vec<C>,
}

impl<'a> Rnn<'a> {
    fn gh_width(&self) -> usize {
        self.spec.cell.gates() * self.spec.hidden
    }
    fn state_width(&self) -> usize {
        self.spec.cell.states() * self.spec.hidden
    }

    /// The gates at time `tt` of sample `b` from the previous state `prev` (`S·H`, zeros
    /// before the first step).
    fn gates(&self, b: usize, tt: usize, prev: &[C]) -> Gates {
        let (h, gw) = (self.spec.hidden, self.gh_width());
        let x = &self.xp[(b * self.t + tt) * gw..][..gw];
        let gh: Vec<C> =
            (0..gw).map(|i| (0..h).map(|j| self.w[i * h + j] * prev[j]).sum::<C>() + self.bias[i]).collect();
        let mut act = vec![C::new(0.0, 0.0); gw];
        for u in 0..h {
            match self.spec.cell {
                RnnCell::Gru => {
                    act[u] = sig(x[u] + gh[u]);
                    act[h + u] = sig(x[h + u] + gh[h + u]);
                    act[2 * h + u] = tanh(x[2 * h + u] + act[u] * gh[2 * h + u]);
                }
                RnnCell::Lstm => {
                    act[u] = sig(x[u] + gh[u]);
                    act[h + u] = sig(x[h + u] + gh[h + u]);
                    act[2 * h + u] = tanh(x[2 * h + u] + gh[2 * h + u]);
                    act[3 * h + u] = sig(x[3 * h + u] + gh[3 * h + u]);
                }
            }
        }
        Gates { act, gh }
    }

    /// The state after the step (`S·H`) from the gates and the previous state.
    fn state(&self, g: &Gates, prev: &[C]) -> Vec<C> {
        let h = self.spec.hidden;
        let one = C::new(1.0, 0.0);
        let mut out = vec![C::new(0.0, 0.0); self.state_width()];
        for u in 0..h {
            match self.spec.cell {
                RnnCell::Gru => {
                    let (z, n) = (g.act[h + u], g.act[2 * h + u]);
                    out[u] = (one - z) * n + z * prev[u];
                }
                RnnCell::Lstm => {
                    let (i, f, gg, o) = (g.act[u], g.act[h + u], g.act[2 * h + u], g.act[3 * h + u]);
                    let c = f * prev[h + u] + i * gg;
                    out[h + u] = c;
                    out[u] = o * tanh(c);
                }
            }
        }
        out
    }

    /// The state before step `s` of sample `b`, read from the stored states `hs` (before the
    /// first step: `h0`, or `zeros`).
    fn prev<'h>(&self, hs: &'h [C], b: usize, s: usize, zeros: &'h [C]) -> &'h [C]
    where
        'a: 'h,
    {
        if s == 0 {
            let sw = self.state_width();
            self.h0.map_or(zeros, |h0| &h0[b * sw..][..sw])
        } else {
            let sw = self.state_width();
            &hs[(b * self.t + self.spec.time(s - 1, self.t)) * sw..][..sw]
        }
    }

    /// `Recurrence`: c64 `[B, T, S·H]`.
    pub fn forward(&self) -> Vec<C> {
        let sw = self.state_width();
        let zeros = vec![C::new(0.0, 0.0); sw];
        let mut hs = vec![C::new(0.0, 0.0); self.b * self.t * sw];
        for b in 0..self.b {
            for s in 0..self.t {
                let prev = self.prev(&hs, b, s, &zeros).to_vec();
                let g = self.gates(b, self.spec.time(s, self.t), &prev);
                let st = self.state(&g, &prev);
                let tt = self.spec.time(s, self.t);
                hs[(b * self.t + tt) * sw..][..sw].copy_from_slice(&st);
            }
        }
        hs
    }

    /// `RecurrenceGrad`: c64 `[B, T, 2·G·H + S·H]` from the stored states `hs` and their
    /// gradient `dhs` (both `[B, T, S·H]`).
    pub fn grad(&self, hs: &[C], dhs: &[C]) -> Vec<C> {
        let (h, gw, sw) = (self.spec.hidden, self.gh_width(), self.state_width());
        let width = self.spec.grad_width();
        let zero = C::new(0.0, 0.0);
        let zeros = vec![zero; sw];
        let mut out = vec![zero; self.b * self.t * width];
        for b in 0..self.b {
            let last = self.spec.time(self.t - 1, self.t);
            let row = (b * self.t + last) * width;
            out[row + 2 * gw..row + width].copy_from_slice(&dhs[(b * self.t + last) * sw..][..sw]);
            for s in (0..self.t).rev() {
                let tt = self.spec.time(s, self.t);
                let prev = self.prev(hs, b, s, &zeros);
                let g = self.gates(b, tt, prev);
                let row = (b * self.t + tt) * width;
                let dstate: Vec<C> = out[row + 2 * gw..row + width].to_vec();
                let mut dx = vec![zero; gw];
                let mut dgh = vec![zero; gw];
                // What the previous state receives besides `W_hhᴴ·dgh`.
                let mut direct = vec![zero; sw];
                for u in 0..h {
                    let dh = dstate[u];
                    match self.spec.cell {
                        RnnCell::Gru => {
                            let (r, z, n) = (g.act[u], g.act[h + u], g.act[2 * h + u]);
                            let dn = dh * (C::new(1.0, 0.0) - z).conj();
                            let dz = dh * (prev[u] - n).conj();
                            direct[u] = dh * z.conj();
                            let dn_pre = through(dtanh(n), dn);
                            let dr = dn_pre * g.gh[2 * h + u].conj();
                            let dz_pre = through(dsig(z), dz);
                            let dr_pre = through(dsig(r), dr);
                            dx[u] = dr_pre;
                            dx[h + u] = dz_pre;
                            dx[2 * h + u] = dn_pre;
                            dgh[u] = dr_pre;
                            dgh[h + u] = dz_pre;
                            dgh[2 * h + u] = dn_pre * r.conj();
                        }
                        RnnCell::Lstm => {
                            let (i, f, gg, o) = (g.act[u], g.act[h + u], g.act[2 * h + u], g.act[3 * h + u]);
                            let c = hs[(b * self.t + tt) * sw + h + u];
                            let tc = tanh(c);
                            let d_o = dh * tc.conj();
                            let dc = dstate[h + u] + through(dtanh(tc), dh * o.conj());
                            let di = dc * gg.conj();
                            let dg = dc * i.conj();
                            let df = dc * prev[h + u].conj();
                            direct[h + u] = dc * f.conj();
                            let parts = [
                                through(dsig(i), di),
                                through(dsig(f), df),
                                through(dtanh(gg), dg),
                                through(dsig(o), d_o),
                            ];
                            for (k, p) in parts.into_iter().enumerate() {
                                dx[k * h + u] = p;
                                dgh[k * h + u] = p;
                            }
                        }
                    }
                }
                out[row..row + gw].copy_from_slice(&dx);
                out[row + gw..row + 2 * gw].copy_from_slice(&dgh);
                // The carry goes to the previous step's row, or from the first step to `h0`'s
                // gradient in the last step's row (whose state gradient was read already).
                if s > 0 || self.h0.is_some() {
                    let (tp, given) = if s > 0 {
                        let tp = self.spec.time(s - 1, self.t);
                        (tp, Some(tp))
                    } else {
                        (last, None)
                    };
                    let prow = (b * self.t + tp) * width;
                    for k in 0..sw {
                        let mut acc = given.map_or(zero, |tp| dhs[(b * self.t + tp) * sw + k]) + direct[k];
                        if k < h {
                            acc += (0..gw).map(|i| self.w[i * h + k].conj() * dgh[i]).sum::<C>();
                        }
                        out[prow + 2 * gw + k] = acc;
                    }
                }
            }
        }
        out
    }
}
