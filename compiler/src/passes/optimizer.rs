//! The optimizer update as IR: PyTorch's sgd, adam and adamw, complex parameters as R².
//!
//! Per parameter the pass appends its state leaves (`<param>.momentum`, `<param>.exp_avg`,
//! `<param>.exp_avg_sq`) and the update nodes ending in `Assign`s of the parameter and its
//! state. The learning rate is the state scalar [`LR`] (the runtime overwrites it each epoch
//! for the schedule); Adam's step count is the state scalar [`STEP`], incremented by an
//! `Assign`, and its bias corrections `1 - βᵗ` are computed as `1 - exp(t·ln β)`.
//!
//! Under dynamic loss scaling (`precision = fp16`: [`add_loss_scale`] runs before autodiff,
//! which then seeds the backward with the scale `S` instead of 1) the pass divides every
//! gradient by `S` before the update, and guards the update as PyTorch's `GradScaler` does:
//! when any gradient holds an infinity or NaN, every `Assign` of the update keeps its target's
//! old value (the step is skipped: parameters, moments and Adam's step count unchanged), `S`
//! halves and the skip counter [`SKIPPED`] grows; after [`GROWTH_INTERVAL`] finite steps in a
//! row `S` doubles. All of it is graph state, so checkpoints carry it and the runtime only
//! reads [`LOSS_SCALE`] and [`SKIPPED`] for its reports.
//!
//! Complex parameters follow PyTorch's `view_as_real` semantics: the second moment is kept
//! per component, in a complex buffer whose re holds the average of `Re(g)²` and im that of
//! `Im(g)²`, and the Adam step divides each component by its own denominator.

use crate::config::{Optimizer, OptimizerKind};
use crate::ir::builder::Builder;
use crate::ir::*;
use cvc_grammar::Span;

/// Name of the learning-rate state scalar (f32 `[]`).
pub const LR: &str = "optimizer.lr";
/// Name of Adam's step-count state scalar (f32 `[]`, 0 before the first step).
pub const STEP: &str = "optimizer.t";

/// Name of the loss-scale state scalar (f32 `[]`) of dynamic loss scaling.
pub const LOSS_SCALE: &str = "amp.loss_scale";
/// Name of the state scalar counting finite steps since the scale last changed.
pub const GOOD_STEPS: &str = "amp.good_steps";
/// Name of the state scalar counting skipped (non-finite) steps since training began.
pub const SKIPPED: &str = "amp.skipped_steps";
/// The first loss scale (PyTorch's `GradScaler(init_scale=2.0**16)`).
pub const INIT_SCALE: f64 = 65536.0;
/// Finite steps after which the scale doubles (PyTorch's `growth_interval`).
pub const GROWTH_INTERVAL: f64 = 2000.0;

/// Adds the loss-scale state leaf that turns on dynamic loss scaling: autodiff seeds the
/// backward with it and [`run`] unscales and guards the update. A training graph only.
pub fn add_loss_scale(g: &mut Graph) -> Value {
    if let Some(v) = g.find_leaf(LOSS_SCALE) {
        return v;
    }
    let mut b = Builder::new(g);
    b.at(Span::default(), Role::State, LOSS_SCALE);
    b.leaf(
        Op::State { name: LOSS_SCALE.into(), init: Init::Constant(INIT_SCALE) },
        TensorType::new(DType::F32, Shape::scalar()),
    )
}

/// What the optimizer pass appended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptimizerFacts {
    /// The learning-rate state leaf.
    pub lr: Value,
    /// Adam's step counter, for adam and adamw.
    pub step: Option<Value>,
    /// Every optimizer state leaf, with the parameter it belongs to (the learning rate and
    /// the step counter name no parameter).
    pub states: Vec<(Option<Value>, Value)>,
    /// The `Assign` nodes, parameters and state alike.
    pub assigns: Vec<Value>,
}

/// Appends the update of every `(param, grad)` pair for `opt`.
pub fn run(g: &mut Graph, grads: &[(Value, Value)], opt: &Optimizer) -> Result<OptimizerFacts, String> {
    for &(p, dp) in grads {
        if !matches!(g.node(p).op, Op::Param { .. }) {
            return Err(format!("optimizer: {p} is not a parameter"));
        }
        if g.ty(p) != g.ty(dp) {
            return Err(format!("optimizer: gradient {} does not match parameter {}", g.ty(dp), g.ty(p)));
        }
    }
    let loss_scale = g.find_leaf(LOSS_SCALE);
    let mut u = Update { b: Builder::new(g), facts: None, ok: None };
    u.b.at(Span::default(), Role::State, LR);
    let lr = u.state(LR, Init::Constant(opt.lr), TensorType::new(DType::F32, Shape::scalar()), None);
    u.facts = Some(OptimizerFacts { lr, step: None, states: vec![(None, lr)], assigns: Vec::new() });
    let (grads, finite) = match loss_scale {
        Some(scale) => u.unscale(grads, scale)?,
        None => (grads.to_vec(), None),
    };
    u.ok = finite;
    let grads = grads.as_slice();
    match opt.kind {
        OptimizerKind::Sgd { momentum, nesterov } => {
            for &(p, dp) in grads {
                u.sgd(p, dp, lr, momentum, nesterov, opt.weight_decay)?;
            }
        }
        OptimizerKind::Adam { beta1, beta2, eps } | OptimizerKind::AdamW { beta1, beta2, eps } => {
            let decoupled = matches!(opt.kind, OptimizerKind::AdamW { .. });
            let shared = u.adam_shared(lr, beta1, beta2)?;
            for &(p, dp) in grads {
                u.adam(p, dp, &shared, AdamHyper { beta1, beta2, eps, wd: opt.weight_decay, decoupled })?;
            }
        }
    }
    if let (Some(scale), Some(ok)) = (loss_scale, finite) {
        u.ok = None;
        u.scale_update(scale, ok)?;
    }
    let facts = u.facts.take().ok_or("optimizer: facts missing")?;
    verify::verify(g).map_err(|e| format!("optimizer produced invalid IR: {e}"))?;
    Ok(facts)
}

/// `(parameter, gradient)` pairs.
type Grads = Vec<(Value, Value)>;

/// Adam's per-step values shared by every parameter.
struct AdamShared {
    /// `lr / (1 - β₁ᵗ)`.
    step_size: Value,
    /// `sqrt(1 - β₂ᵗ)`.
    sqrt_bc2: Value,
    /// The learning rate.
    lr: Value,
}

/// Adam's hyper-parameters.
#[derive(Clone, Copy)]
struct AdamHyper {
    beta1: f64,
    beta2: f64,
    eps: f64,
    wd: f64,
    decoupled: bool,
}

struct Update<'g> {
    b: Builder<'g>,
    facts: Option<OptimizerFacts>,
    /// Under loss scaling, the flag (1: every gradient finite) that each update's `Assign` is
    /// guarded by: `select(ok, new, old)`.
    ok: Option<Value>,
}

impl Update<'_> {
    /// A state leaf (reused when the graph already has one of that name).
    fn state(&mut self, name: &str, init: Init, ty: TensorType, owner: Option<Value>) -> Value {
        if let Some(v) = self.b.graph.find_leaf(name) {
            return v;
        }
        let v = self.b.leaf(Op::State { name: name.into(), init }, ty);
        if let Some(f) = &mut self.facts {
            f.states.push((owner, v));
        }
        v
    }

    /// Stamps the nodes that follow as the update of `p`.
    fn at_param(&mut self, p: Value) -> String {
        let name = self.b.graph.leaf_name(p).unwrap_or_default().to_string();
        let span = self.b.graph.span(p);
        self.b.at(span, Role::Update, format!("update({name})"));
        name
    }

    fn assign(&mut self, target: Value, value: Value) -> Result<(), String> {
        let value = match self.ok {
            Some(ok) => self.b.add(Op::Select, &[ok, value, target])?,
            None => value,
        };
        let a = self.b.add(Op::Assign, &[target, value])?;
        if let Some(f) = &mut self.facts {
            f.assigns.push(a);
        }
        Ok(())
    }

    /// The gradients divided by the loss scale, and the flag `ok` (1 when every gradient is
    /// finite, else 0): `Σ |g|²` over all of them is finite exactly then (an overflow of the
    /// sum itself counts as non-finite, as it would overflow the update too), and `x − x` is 0
    /// for a finite `x` and NaN otherwise.
    fn unscale(&mut self, grads: &[(Value, Value)], scale: Value) -> Result<(Grads, Option<Value>), String> {
        self.b.at(Span::default(), Role::Update, "update(loss scale)");
        let inv = self.b.unary(UnaryOp::Recip, scale)?;
        let mut total: Option<Value> = None;
        let mut out = Vec::new();
        for &(p, dp) in grads {
            let rank = self.b.graph.ty(dp).shape.rank();
            let sq = self.b.unary(UnaryOp::Abs2, dp)?;
            let axes: Vec<usize> = (0..rank).collect();
            let s = if rank == 0 { sq } else { self.b.sum(sq, &axes)? };
            let s = self.b.reshape(s, Shape::scalar())?;
            total = Some(match total {
                Some(t) => self.b.add2(t, s)?,
                None => s,
            });
            self.at_param(p);
            out.push((p, self.b.mul(dp, inv)?));
        }
        let Some(total) = total else { return Ok((out, None)) };
        self.b.at(Span::default(), Role::Update, "update(loss scale)");
        let zero = self.b.sub(total, total)?;
        let z = self.b.scalar(0.0, 0);
        let ok = self.b.binary(BinaryOp::Equal, zero, z)?;
        Ok((out, Some(ok)))
    }

    /// The scale's own update (halve on a skipped step, double after [`GROWTH_INTERVAL`]
    /// finite ones in a row) and the skip counter.
    fn scale_update(&mut self, scale: Value, ok: Value) -> Result<(), String> {
        let scalar = TensorType::new(DType::F32, Shape::scalar());
        self.b.at(Span::default(), Role::State, GOOD_STEPS);
        let good = self.state(GOOD_STEPS, Init::Zeros, scalar.clone(), None);
        self.b.at(Span::default(), Role::State, SKIPPED);
        let skipped = self.state(SKIPPED, Init::Zeros, scalar, None);
        self.b.at(Span::default(), Role::Update, "update(loss scale)");
        let one = self.b.scalar(1.0, 0);
        let good_next = self.b.add2(good, one)?;
        let interval = self.b.scalar(GROWTH_INTERVAL, 0);
        let grow = self.b.binary(BinaryOp::Equal, good_next, interval)?;
        let doubled = self.b.scale(scale, 2.0)?;
        let halved = self.b.scale(scale, 0.5)?;
        let grown = self.b.add(Op::Select, &[grow, doubled, scale])?;
        let scale_new = self.b.add(Op::Select, &[ok, grown, halved])?;
        let zero = self.b.scalar(0.0, 0);
        let good_kept = self.b.add(Op::Select, &[grow, zero, good_next])?;
        let good_new = self.b.add(Op::Select, &[ok, good_kept, zero])?;
        let one_minus_ok = self.b.sub(one, ok)?;
        let skipped_new = self.b.add2(skipped, one_minus_ok)?;
        self.assign(scale, scale_new)?;
        self.assign(good, good_new)?;
        self.assign(skipped, skipped_new)
    }

    /// `a + c·b` for a constant `c`.
    fn axpy(&mut self, a: Value, c: f64, b: Value) -> Result<Value, String> {
        let cb = self.b.scale(b, c)?;
        self.b.add2(a, cb)
    }

    /// A moment buffer of `p`'s type named `<param>.<suffix>`.
    fn moment(&mut self, p: Value, name: &str, suffix: &str) -> Value {
        let ty = self.b.graph.ty(p).clone();
        let (span, origin) = (self.b.span, self.b.origin.clone());
        self.b.at(self.b.graph.span(p), Role::State, format!("{name}.{suffix}"));
        let v = self.state(&format!("{name}.{suffix}"), Init::Zeros, ty, Some(p));
        self.b.span = span;
        self.b.origin = origin;
        v
    }

    /// torch.optim.SGD with dampening 0.
    fn sgd(
        &mut self,
        p: Value,
        dp: Value,
        lr: Value,
        momentum: f64,
        nesterov: bool,
        wd: f64,
    ) -> Result<(), String> {
        let name = self.at_param(p);
        let mut d = dp;
        if wd != 0.0 {
            d = self.axpy(d, wd, p)?;
        }
        if momentum != 0.0 {
            let buf = self.moment(p, &name, "momentum");
            let scaled = self.b.scale(buf, momentum)?;
            let buf_new = self.b.add2(scaled, d)?;
            self.assign(buf, buf_new)?;
            d = if nesterov { self.axpy(d, momentum, buf_new)? } else { buf_new };
        }
        let step = self.b.mul(d, lr)?;
        let p_new = self.b.sub(p, step)?;
        self.assign(p, p_new)
    }

    /// `t ← t + 1` and the bias corrections of this step.
    fn adam_shared(&mut self, lr: Value, beta1: f64, beta2: f64) -> Result<AdamShared, String> {
        self.b.at(Span::default(), Role::State, STEP);
        let t = self.state(STEP, Init::Zeros, TensorType::new(DType::F32, Shape::scalar()), None);
        if let Some(f) = &mut self.facts {
            f.step = Some(t);
        }
        self.b.at(Span::default(), Role::Update, "update(optimizer)");
        let one = self.b.scalar(1.0, 0);
        let t_new = self.b.add2(t, one)?;
        self.assign(t, t_new)?;
        let bc1 = self.bias_correction(t_new, beta1)?;
        let bc2 = self.bias_correction(t_new, beta2)?;
        let step_size = self.b.div(lr, bc1)?;
        let sqrt_bc2 = self.b.unary(UnaryOp::Sqrt, bc2)?;
        Ok(AdamShared { step_size, sqrt_bc2, lr })
    }

    /// `1 - βᵗ = 1 - exp(t·ln β)` (exactly 1 when β = 0).
    fn bias_correction(&mut self, t: Value, beta: f64) -> Result<Value, String> {
        if beta == 0.0 {
            return Ok(self.b.scalar(1.0, 0));
        }
        let tl = self.b.scale(t, beta.ln())?;
        let pow = self.b.unary(UnaryOp::Exp, tl)?;
        let one = self.b.scalar(1.0, 0);
        self.b.sub(one, pow)
    }

    /// torch.optim.Adam / AdamW for one parameter.
    fn adam(&mut self, p: Value, dp: Value, s: &AdamShared, h: AdamHyper) -> Result<(), String> {
        let name = self.at_param(p);
        let complex = self.b.graph.ty(p).dtype.is_complex();
        let mut d = dp;
        let mut base = p;
        if h.wd != 0.0 && h.decoupled {
            let lr_wd = self.b.scale(s.lr, h.wd)?;
            let one = self.b.scalar(1.0, 0);
            let keep = self.b.sub(one, lr_wd)?;
            base = self.b.mul(p, keep)?;
        } else if h.wd != 0.0 {
            d = self.axpy(d, h.wd, p)?;
        }
        let m = self.moment(p, &name, "exp_avg");
        let v = self.moment(p, &name, "exp_avg_sq");
        let m_scaled = self.b.scale(m, h.beta1)?;
        let m_new = self.axpy(m_scaled, 1.0 - h.beta1, d)?;
        let sq = if complex {
            let re = self.b.unary(UnaryOp::Real, d)?;
            let im = self.b.unary(UnaryOp::Imag, d)?;
            let re2 = self.b.mul(re, re)?;
            let im2 = self.b.mul(im, im)?;
            self.b.binary(BinaryOp::Complex, re2, im2)?
        } else {
            self.b.mul(d, d)?
        };
        let v_scaled = self.b.scale(v, h.beta2)?;
        let v_new = self.axpy(v_scaled, 1.0 - h.beta2, sq)?;
        self.assign(m, m_new)?;
        self.assign(v, v_new)?;
        let ratio = if complex {
            let mr = self.b.unary(UnaryOp::Real, m_new)?;
            let mi = self.b.unary(UnaryOp::Imag, m_new)?;
            let vr = self.b.unary(UnaryOp::Real, v_new)?;
            let vi = self.b.unary(UnaryOp::Imag, v_new)?;
            let rr = self.component_ratio(mr, vr, s, h.eps)?;
            let ri = self.component_ratio(mi, vi, s, h.eps)?;
            self.b.binary(BinaryOp::Complex, rr, ri)?
        } else {
            self.component_ratio(m_new, v_new, s, h.eps)?
        };
        let step = self.b.mul(ratio, s.step_size)?;
        let p_new = self.b.sub(base, step)?;
        self.assign(p, p_new)
    }

    /// `m / (sqrt(v)/sqrt(1 - β₂ᵗ) + ε)` on real values.
    fn component_ratio(&mut self, m: Value, v: Value, s: &AdamShared, eps: f64) -> Result<Value, String> {
        let root = self.b.unary(UnaryOp::Sqrt, v)?;
        let corrected = self.b.div(root, s.sqrt_bc2)?;
        let e = self.b.scalar(eps, 0);
        let denom = self.b.add2(corrected, e)?;
        self.b.div(m, denom)
    }
}
