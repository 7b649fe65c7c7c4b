//! Fused recurrences on the CPU: `Recurrence` (the cell applied step by step) and
//! `RecurrenceGrad` (back-propagation through time, gates recomputed from the stored states),
//! optionally from a given initial state `h0` (whose gradient the backward then writes into
//! the last step's row, as `ir::Op::RecurrenceGrad` says), in f32 with complex values
//! interleaved. A sample's steps are sequential; samples are split
//! across the pool's threads, each with its own workspace, writing disjoint output rows.

use super::pool::Pool;
use cvc_compiler::back::cpu::RecurrenceCall;
use cvc_compiler::ir::RnnCell;

/// A complex f32 with the arena's interleaved layout.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct C {
    re: f32,
    im: f32,
}

impl C {
    fn add(self, o: C) -> C {
        C { re: self.re + o.re, im: self.im + o.im }
    }
    fn sub(self, o: C) -> C {
        C { re: self.re - o.re, im: self.im - o.im }
    }
    fn mul(self, o: C) -> C {
        C { re: self.re * o.re - self.im * o.im, im: self.re * o.im + self.im * o.re }
    }
    /// `self · conj(o)`.
    fn mulc(self, o: C) -> C {
        C { re: self.re * o.re + self.im * o.im, im: self.im * o.re - self.re * o.im }
    }
    fn split(self, f: fn(f32) -> f32) -> C {
        C { re: f(self.re), im: f(self.im) }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The gradient through the split sigmoid with output `s`: `s(1 − s)` per part.
fn dsig(s: C, g: C) -> C {
    C { re: s.re * (1.0 - s.re) * g.re, im: s.im * (1.0 - s.im) * g.im }
}

/// The gradient through the split tanh with output `y`: `1 − y²` per part.
fn dtanh(y: C, g: C) -> C {
    C { re: (1.0 - y.re * y.re) * g.re, im: (1.0 - y.im * y.im) * g.im }
}

/// Raw arena pointers of one call.
#[derive(Clone, Copy)]
struct Ptrs {
    xp: *const C,
    w: *const C,
    bias: *const C,
    hs: *const C,
    dhs: *const C,
    h0: *const C,
    out: *mut C,
}

// SAFETY: the pointers address the arena, which outlives the call; threads read the operands
// and write the output rows of their own samples only (see `run`).
unsafe impl Send for Ptrs {}
// SAFETY: as for Send.
unsafe impl Sync for Ptrs {}

/// Runs `call` on the pool; `workspace(t)` is thread `t`'s recurrence workspace.
///
/// # Safety
/// The offsets of `call` address its operands inside the arena at `base`; `workspace(t)`
/// points at `call.workspace_words()` f32 owned by thread `t`.
pub unsafe fn run(
    pool: &Pool,
    base: *mut u8,
    workspace: &(dyn Fn(usize) -> *mut f32 + Sync),
    call: &RecurrenceCall,
) {
    let at = |o: Option<usize>| o.map_or(std::ptr::null(), |o| base.add(o) as *const C);
    let p = Ptrs {
        xp: at(Some(call.xp)),
        w: at(Some(call.w)),
        bias: at(Some(call.bias)),
        hs: at(call.hs),
        dhs: at(call.dhs),
        h0: at(call.h0),
        out: base.add(call.out) as *mut C,
    };
    let h = call.spec.hidden;
    let work = call.b * call.t * call.spec.cell.gates() * h * h;
    let parts =
        if pool.threads() > 1 && call.b >= 2 && work >= 1 << 14 { pool.threads().min(call.b) } else { 1 };
    let job = |th: usize| {
        let per = call.b.div_ceil(parts);
        let (lo, hi) = ((th * per).min(call.b), ((th + 1) * per).min(call.b));
        // SAFETY: thread `th` owns its workspace and the output rows of samples `lo..hi`.
        unsafe {
            let ws = workspace(th) as *mut C;
            for b in lo..hi {
                if call.grad {
                    backward(call, &p, ws, b);
                } else {
                    forward(call, &p, ws, b);
                }
            }
        }
    };
    if parts > 1 {
        pool.run(&job);
    } else {
        job(0);
    }
}

/// `W_hh` `[G·H, H]` and `b_hh` `[G·H]`.
struct Hidden<'a> {
    w: &'a [C],
    bias: &'a [C],
}

/// `gh = W_hh·prev + b_hh` into `gh` and the activated gates into `act` for step input `x`
/// (`prev` empty before the first step).
fn gates(cell: RnnCell, h: usize, x: &[C], hid: &Hidden, prev: Option<&[C]>, gh: &mut [C], act: &mut [C]) {
    let (w, bias) = (hid.w, hid.bias);
    for (i, g) in gh.iter_mut().enumerate() {
        let mut acc = bias[i];
        if let Some(prev) = prev {
            for (wj, pj) in w[i * h..(i + 1) * h].iter().zip(&prev[..h]) {
                acc = acc.add(wj.mul(*pj));
            }
        }
        *g = acc;
    }
    for u in 0..h {
        act[u] = x[u].add(gh[u]).split(sigmoid);
        act[h + u] = x[h + u].add(gh[h + u]).split(sigmoid);
        match cell {
            RnnCell::Gru => act[2 * h + u] = x[2 * h + u].add(act[u].mul(gh[2 * h + u])).split(f32::tanh),
            RnnCell::Lstm => {
                act[2 * h + u] = x[2 * h + u].add(gh[2 * h + u]).split(f32::tanh);
                act[3 * h + u] = x[3 * h + u].add(gh[3 * h + u]).split(sigmoid);
            }
        }
    }
}

/// The initial state of sample `b` (`None`: zeros).
///
/// # Safety
/// As [`run`].
unsafe fn initial<'a>(call: &RecurrenceCall, p: &Ptrs, b: usize) -> Option<&'a [C]> {
    let sw = call.spec.cell.states() * call.spec.hidden;
    (!p.h0.is_null()).then(|| std::slice::from_raw_parts(p.h0.add(b * sw), sw))
}

/// The steps of sample `b`.
///
/// # Safety
/// As [`run`]; `ws` holds `call.workspace_words()` f32.
unsafe fn forward(call: &RecurrenceCall, p: &Ptrs, ws: *mut C, b: usize) {
    let (cell, h, t) = (call.spec.cell, call.spec.hidden, call.t);
    let (gw, sw) = (cell.gates() * h, cell.states() * h);
    let xp = std::slice::from_raw_parts(p.xp.add(b * t * gw), t * gw);
    let w = std::slice::from_raw_parts(p.w, gw * h);
    let bias = std::slice::from_raw_parts(p.bias, gw);
    let out = std::slice::from_raw_parts_mut(p.out.add(b * t * sw), t * sw);
    let gh = std::slice::from_raw_parts_mut(ws, gw);
    let act = std::slice::from_raw_parts_mut(ws.add(gw), gw);
    let h0 = initial(call, p, b);
    for s in 0..t {
        let tt = call.spec.time(s, t);
        let (prev, cur) = if s == 0 {
            (h0, &mut out[tt * sw..(tt + 1) * sw])
        } else {
            let tp = call.spec.time(s - 1, t);
            // Rows `tp` and `tt` are adjacent and distinct.
            let (lo, hi) = out.split_at_mut(tt.max(tp) * sw);
            if tp < tt {
                (Some(&lo[tp * sw..]), &mut hi[..sw])
            } else {
                (Some(&hi[..sw]), &mut lo[tt * sw..])
            }
        };
        let prev: Option<&[C]> = prev.map(|p| &p[..sw]);
        gates(cell, h, &xp[tt * gw..(tt + 1) * gw], &Hidden { w, bias }, prev, gh, act);
        for u in 0..h {
            let hp = prev.map_or(C::default(), |p| p[u]);
            match cell {
                RnnCell::Gru => {
                    let z = act[h + u];
                    cur[u] = C { re: 1.0 - z.re, im: -z.im }.mul(act[2 * h + u]).add(z.mul(hp));
                }
                RnnCell::Lstm => {
                    let cp = prev.map_or(C::default(), |p| p[h + u]);
                    let c = act[h + u].mul(cp).add(act[u].mul(act[2 * h + u]));
                    cur[h + u] = c;
                    cur[u] = act[3 * h + u].mul(c.split(f32::tanh));
                }
            }
        }
    }
}

/// Back-propagation through the steps of sample `b`.
///
/// # Safety
/// As [`run`]; `ws` holds `call.workspace_words()` f32.
unsafe fn backward(call: &RecurrenceCall, p: &Ptrs, ws: *mut C, b: usize) {
    let (cell, h, t) = (call.spec.cell, call.spec.hidden, call.t);
    let (gw, sw) = (cell.gates() * h, cell.states() * h);
    let width = call.spec.grad_width();
    let xp = std::slice::from_raw_parts(p.xp.add(b * t * gw), t * gw);
    let w = std::slice::from_raw_parts(p.w, gw * h);
    let bias = std::slice::from_raw_parts(p.bias, gw);
    let hs = std::slice::from_raw_parts(p.hs.add(b * t * sw), t * sw);
    let dhs = std::slice::from_raw_parts(p.dhs.add(b * t * sw), t * sw);
    let out = std::slice::from_raw_parts_mut(p.out.add(b * t * width), t * width);
    let gh = std::slice::from_raw_parts_mut(ws, gw);
    let act = std::slice::from_raw_parts_mut(ws.add(gw), gw);
    let carry = std::slice::from_raw_parts_mut(ws.add(2 * gw), sw);
    let h0 = initial(call, p, b);
    let last = call.spec.time(t - 1, t);
    out[last * width + 2 * gw..(last + 1) * width].copy_from_slice(&dhs[last * sw..(last + 1) * sw]);
    for s in (0..t).rev() {
        let tt = call.spec.time(s, t);
        let prev = if s > 0 {
            let tp = call.spec.time(s - 1, t);
            Some(&hs[tp * sw..(tp + 1) * sw])
        } else {
            h0
        };
        gates(cell, h, &xp[tt * gw..(tt + 1) * gw], &Hidden { w, bias }, prev, gh, act);
        let row = &mut out[tt * width..(tt + 1) * width];
        let (d, dstate) = row.split_at_mut(2 * gw);
        let (dx, dgh) = d.split_at_mut(gw);
        for u in 0..h {
            let dh = dstate[u];
            let hp = prev.map_or(C::default(), |p| p[u]);
            match cell {
                RnnCell::Gru => {
                    let (r, z, n) = (act[u], act[h + u], act[2 * h + u]);
                    let dn_pre = dtanh(n, dh.mulc(C { re: 1.0 - z.re, im: -z.im }));
                    let dr_pre = dsig(r, dn_pre.mulc(gh[2 * h + u]));
                    let dz_pre = dsig(z, dh.mulc(hp.sub(n)));
                    dx[u] = dr_pre;
                    dx[h + u] = dz_pre;
                    dx[2 * h + u] = dn_pre;
                    dgh[u] = dr_pre;
                    dgh[h + u] = dz_pre;
                    dgh[2 * h + u] = dn_pre.mulc(r);
                    carry[u] = dh.mulc(z);
                }
                RnnCell::Lstm => {
                    let (i, f, g, o) = (act[u], act[h + u], act[2 * h + u], act[3 * h + u]);
                    let cp = prev.map_or(C::default(), |p| p[h + u]);
                    let tc = hs[tt * sw + h + u].split(f32::tanh);
                    let dc = dstate[h + u].add(dtanh(tc, dh.mulc(o)));
                    let parts = [
                        dsig(i, dc.mulc(g)),
                        dsig(f, dc.mulc(cp)),
                        dtanh(g, dc.mulc(i)),
                        dsig(o, dh.mulc(tc)),
                    ];
                    for (k, v) in parts.into_iter().enumerate() {
                        dx[k * h + u] = v;
                        dgh[k * h + u] = v;
                    }
                    carry[u] = C::default();
                    carry[h + u] = dc.mulc(f);
                }
            }
        }
        if s > 0 || h0.is_some() {
            // The previous state's share of gh: conj(W_hh)ᵀ·dgh.
            for (i, dg) in dgh.iter().enumerate() {
                for (c, wij) in carry[..h].iter_mut().zip(&w[i * h..(i + 1) * h]) {
                    *c = c.add(dg.mulc(*wij));
                }
            }
            if s > 0 {
                let tp = call.spec.time(s - 1, t);
                for k in 0..sw {
                    out[tp * width + 2 * gw + k] = dhs[tp * sw + k].add(carry[k]);
                }
            } else {
                // h0's gradient, in the last step's row (its state gradient was read already).
                out[last * width + 2 * gw..(last + 1) * width].copy_from_slice(&carry[..sw]);
            }
        }
    }
}
