//! Gradient checking in the interpreter: analytic gradients against central finite
//! differences in f64, per coordinate or along random directions.
//!
//! Used by the autodiff tests and by back-end tests that want an oracle for gradients. The
//! convention checked is PyTorch's conjugate Wirtinger: the gradient of a real `L` w.r.t.
//! `z = x + iy` is `∂L/∂x + i ∂L/∂y`, so its real part is compared with the difference
//! quotient along `x` and its imaginary part with the one along `y`.

use super::eval::evaluate;
use super::init::SplitMix64;
use super::tensor::{Tensor, TensorData};
use crate::ir::*;
use num_complex::Complex64;
use std::collections::HashMap;

/// A tensor of standard-normal entries (complex: both parts), or integers in `0..int_bound`.
pub fn random_tensor(dtype: DType, shape: &[usize], int_bound: usize, rng: &mut SplitMix64) -> Tensor {
    let n: usize = shape.iter().product();
    let data = match dtype {
        DType::F32 => TensorData::Real((0..n).map(|_| rng.normal()).collect()),
        DType::C64 => {
            TensorData::Complex((0..n).map(|_| Complex64::new(rng.normal(), rng.normal())).collect())
        }
        DType::I32 => {
            TensorData::Int((0..n).map(|_| (rng.next_u64() % int_bound.max(1) as u64) as i64).collect())
        }
    };
    Tensor { shape: shape.to_vec(), data }
}

/// Random values for every `Input` of `g`, scaled by `scale`; integer inputs (labels) are
/// drawn below the smallest `OneHot` class count or `Gather` table that reads them (2 when
/// none does).
pub fn random_inputs(g: &Graph, batch: usize, scale: f64, rng: &mut SplitMix64) -> HashMap<Value, Tensor> {
    let users = g.users();
    let mut out = HashMap::new();
    for v in g.inputs() {
        let ty = g.ty(v);
        let bound = users[v.index()]
            .iter()
            .filter_map(|&u| match g.node(u).op {
                Op::OneHot { classes } => Some(classes),
                Op::Gather => g.ty(g.node(u).inputs[0]).shape.0[0].fixed(),
                _ => None,
            })
            .min()
            .unwrap_or(2);
        let mut t = random_tensor(ty.dtype, &ty.shape.resolve(batch), bound, rng);
        scale_tensor(&mut t, scale);
        out.insert(v, t);
    }
    out
}

fn scale_tensor(t: &mut Tensor, s: f64) {
    match &mut t.data {
        TensorData::Real(v) => v.iter_mut().for_each(|x| *x *= s),
        TensorData::Complex(v) => v.iter_mut().for_each(|x| *x *= s),
        TensorData::Int(_) => {}
    }
}

/// The (real) value of `loss` for the given leaves.
pub fn loss_value(
    g: &Graph,
    batch: usize,
    leaves: &HashMap<Value, Tensor>,
    loss: Value,
) -> Result<f64, String> {
    let vals = evaluate(g, batch, leaves)?;
    let t = vals[loss.index()].as_ref().ok_or("loss not computed")?;
    t.to_real_vec()?.iter().copied().reduce(|a, b| a + b).ok_or_else(|| "empty loss".into())
}

/// How a gradient check went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GradCheckReport {
    /// Coordinates (or directions) compared.
    pub checked: usize,
    /// The largest error seen, `|analytic - numeric| / max(1, |analytic|, |numeric|)`.
    pub worst: f64,
}

/// Settings of a gradient check.
#[derive(Clone, Copy, Debug)]
pub struct GradCheckConfig {
    /// Finite-difference step.
    pub eps: f64,
    /// Largest accepted error (see [`GradCheckReport::worst`]).
    pub tol: f64,
    /// At most this many coordinates per checked leaf (chosen at random); `None` = all.
    pub max_coords: Option<usize>,
}

impl Default for GradCheckConfig {
    fn default() -> Self {
        GradCheckConfig { eps: 1e-6, tol: 1e-6, max_coords: None }
    }
}

fn rel_err(a: f64, n: f64) -> f64 {
    (a - n).abs() / 1f64.max(a.abs()).max(n.abs())
}

/// Adds `delta` to element `index` of a real or complex tensor (`imag` picks the part).
fn nudge(t: &mut Tensor, index: usize, imag: bool, delta: f64) {
    match &mut t.data {
        TensorData::Real(v) => v[index] += delta,
        TensorData::Complex(v) if imag => v[index].im += delta,
        TensorData::Complex(v) => v[index].re += delta,
        TensorData::Int(_) => {}
    }
}

/// Compares, coordinate by coordinate, the gradients `pairs = (leaf, grad)` that `full`
/// computes with central differences of `loss` evaluated on `fwd` (the same graph before
/// autodiff, so it shares handles with `full`). Returns an error naming the first mismatch.
/// A coordinate that fails is retried once with `eps / 10`, so a kink crossed by chance
/// (relu, max) does not fail the check; a wrong gradient fails both.
#[allow(clippy::too_many_arguments)]
pub fn check_coordinates(
    fwd: &Graph,
    full: &Graph,
    batch: usize,
    leaves: &HashMap<Value, Tensor>,
    loss: Value,
    pairs: &[(Value, Value)],
    cfg: GradCheckConfig,
    rng: &mut SplitMix64,
) -> Result<GradCheckReport, String> {
    let vals = evaluate(full, batch, leaves)?;
    let mut report = GradCheckReport::default();
    for &(leaf, grad) in pairs {
        let analytic = vals[grad.index()].as_ref().ok_or("gradient not computed")?.to_complex_vec();
        let base = leaves.get(&leaf).ok_or("gradient of a leaf with no value")?;
        let parts: &[bool] = if base.dtype().is_complex() { &[false, true] } else { &[false] };
        let mut coords: Vec<(usize, bool)> =
            (0..base.numel()).flat_map(|i| parts.iter().map(move |&p| (i, p))).collect();
        if let Some(k) = cfg.max_coords {
            while coords.len() > k {
                let drop = (rng.next_u64() % coords.len() as u64) as usize;
                coords.swap_remove(drop);
            }
        }
        for (i, imag) in coords {
            let a = if imag { analytic[i].im } else { analytic[i].re };
            let mut err = f64::INFINITY;
            let mut numeric = 0.0;
            for eps in [cfg.eps, cfg.eps / 10.0] {
                let mut at = leaves.clone();
                let t = at.get_mut(&leaf).ok_or("leaf vanished")?;
                nudge(t, i, imag, eps);
                let up = loss_value(fwd, batch, &at, loss)?;
                let t = at.get_mut(&leaf).ok_or("leaf vanished")?;
                nudge(t, i, imag, -2.0 * eps);
                let down = loss_value(fwd, batch, &at, loss)?;
                numeric = (up - down) / (2.0 * eps);
                err = rel_err(a, numeric);
                if err <= cfg.tol {
                    break;
                }
            }
            report.checked += 1;
            report.worst = report.worst.max(err);
            if err > cfg.tol || !a.is_finite() {
                let name = fwd.leaf_name(leaf).unwrap_or("?");
                let part = if imag { "im" } else { "re" };
                return Err(format!(
                    "gradient of `{name}` [{i}].{part}: autodiff {a:.12e}, finite differences {numeric:.12e} (error {err:.2e})"
                ));
            }
        }
    }
    Ok(report)
}

/// Compares directional derivatives along `directions` random unit directions over all
/// checked leaves at once: `Re Σ conj(grad)·v` against `(L(θ+εv) - L(θ-εv)) / 2ε`. Cheap
/// for whole networks (two evaluations per direction). A direction that fails is retried
/// once with `eps / 10`, so a kink crossed by chance (relu, max) does not fail the check.
#[allow(clippy::too_many_arguments)]
pub fn check_directions(
    fwd: &Graph,
    full: &Graph,
    batch: usize,
    leaves: &HashMap<Value, Tensor>,
    loss: Value,
    pairs: &[(Value, Value)],
    directions: usize,
    cfg: GradCheckConfig,
    rng: &mut SplitMix64,
) -> Result<GradCheckReport, String> {
    let vals = evaluate(full, batch, leaves)?;
    let mut report = GradCheckReport::default();
    for _ in 0..directions {
        let mut dir: Vec<(Value, Tensor)> = Vec::new();
        let mut norm2 = 0.0;
        for &(leaf, _) in pairs {
            let base = leaves.get(&leaf).ok_or("gradient of a leaf with no value")?;
            let t = random_tensor(base.dtype(), &base.shape, 1, rng);
            norm2 += t.to_complex_vec().iter().map(|z| z.norm_sqr()).sum::<f64>();
            dir.push((leaf, t));
        }
        let inv = 1.0 / norm2.sqrt().max(1e-300);
        dir.iter_mut().for_each(|(_, t)| scale_tensor(t, inv));
        let mut analytic = 0.0;
        for (&(_, grad), (_, v)) in pairs.iter().zip(&dir) {
            let gv = vals[grad.index()].as_ref().ok_or("gradient not computed")?.to_complex_vec();
            analytic += gv.iter().zip(v.to_complex_vec()).map(|(g, v)| (g.conj() * v).re).sum::<f64>();
        }
        let mut err = f64::INFINITY;
        let mut numeric = 0.0;
        for eps in [cfg.eps, cfg.eps / 10.0] {
            let shifted = |s: f64| -> Result<f64, String> {
                let mut at = leaves.clone();
                for (leaf, v) in &dir {
                    let t = at.get_mut(leaf).ok_or("leaf vanished")?;
                    axpy(t, s, v);
                }
                loss_value(fwd, batch, &at, loss)
            };
            numeric = (shifted(eps)? - shifted(-eps)?) / (2.0 * eps);
            err = rel_err(analytic, numeric);
            if err <= cfg.tol {
                break;
            }
        }
        report.checked += 1;
        report.worst = report.worst.max(err);
        if err > cfg.tol || !analytic.is_finite() {
            return Err(format!(
                "directional derivative: autodiff {analytic:.12e}, finite differences {numeric:.12e} (error {err:.2e})"
            ));
        }
    }
    Ok(report)
}

fn axpy(t: &mut Tensor, s: f64, v: &Tensor) {
    match (&mut t.data, &v.data) {
        (TensorData::Real(a), TensorData::Real(b)) => a.iter_mut().zip(b).for_each(|(x, y)| *x += s * y),
        (TensorData::Complex(a), TensorData::Complex(b)) => {
            a.iter_mut().zip(b).for_each(|(x, y)| *x += s * y)
        }
        _ => {}
    }
}
