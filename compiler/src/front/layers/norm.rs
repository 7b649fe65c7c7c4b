//! Normalisation: `batchnorm` (naive re/im and whitening, Trabelsi et al. 2018), and the
//! per-sample `layernorm` and `rmsnorm` over trailing axes (complextorch 2.1.1's definitions).

use super::*;

pub(crate) const DEFS: &[OpDef] = &[
    OpDef {
        name: "batchnorm",
        signature: "batchnorm(kind = naive | whitening, momentum = 0.1, eps = 1e-5, affine = true)",
        args: &["kind", "momentum", "eps", "affine"],
        variadic: false,
        operands: (1, 1),
        lower: batchnorm,
    },
    OpDef {
        name: "layernorm",
        signature: "layernorm(axes = 1, kind = whitening | naive, eps = 1e-5, affine = true)",
        args: &["axes", "kind", "eps", "affine"],
        variadic: false,
        operands: (1, 1),
        lower: layernorm,
    },
    OpDef {
        name: "rmsnorm",
        signature: "rmsnorm(axes = 1, eps = 1e-5, affine = true)",
        args: &["axes", "eps", "affine"],
        variadic: false,
        operands: (1, 1),
        lower: rmsnorm,
    },
];

/// Checked batchnorm/layernorm settings.
struct NormArgs {
    momentum: f64,
    eps: f64,
    affine: bool,
}

/// Runs `f` with new nodes labelled [`Role::Update`] (running-statistic updates).
fn as_update<T>(ctx: &mut LowerCtx, f: impl FnOnce(&mut LowerCtx) -> T) -> T {
    let saved = ctx.b.origin.role;
    ctx.b.origin.role = Role::Update;
    let r = f(ctx);
    ctx.b.origin.role = saved;
    r
}

/// `n / (n - 1)` for the element count on `axes` (unbiased-variance correction, as PyTorch
/// applies to running variances).
fn bessel(ctx: &mut LowerCtx, shape: &Shape, axes: &[usize]) -> Result<Value, String> {
    let n = count_value(ctx, shape, axes);
    let one = ctx.b.scalar(1.0, 0);
    let nm1 = ctx.b.sub(n, one)?;
    ctx.b.div(n, nm1)
}

fn batchnorm(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let kind = site.args.choice("kind", "naive", &["naive", "whitening"])?;
    let na = NormArgs {
        momentum: site.args.float_in("momentum", 0.1, 0.0, 1.0, true)?,
        eps: site.args.positive("eps", 1e-5)?,
        affine: site.args.flag("affine", true)?,
    };
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, 2..=usize::MAX, "[B, C, ...]")?;
    let c = fixed_dim(ctx, site, x, 1, "channel count")?;
    let axes: Vec<usize> = (0..ty.shape.rank()).filter(|&a| a != 1).collect();
    if ty.shape.fixed_numel() / c == 1 && ty.shape.batch_power() == 0 && ctx.mode == Mode::Train {
        return Err(site.operand_error(
            ctx,
            x,
            "`batchnorm` needs more than one value per channel".into(),
            "one value per channel",
        ));
    }
    if !ty.dtype.is_complex() {
        return bn_real(ctx, site, x.value, "", c, &axes, &na);
    }
    match kind {
        "naive" => {
            let re = ctx.b.unary(UnaryOp::Real, x.value).at(site)?;
            let im = ctx.b.unary(UnaryOp::Imag, x.value).at(site)?;
            let re = bn_real(ctx, site, re, "_re", c, &axes, &na)?;
            let im = bn_real(ctx, site, im, "_im", c, &axes, &na)?;
            ctx.b.binary(BinaryOp::Complex, re, im).at(site)
        }
        _ => bn_whitening(ctx, site, x.value, c, &axes, &na),
    }
}

/// Per-channel `(v - mean) / sqrt(var + eps)·γ + β` of a real value, channel axis 1.
fn bn_real(
    ctx: &mut LowerCtx,
    site: &Site,
    v: Value,
    suffix: &str,
    c: usize,
    axes: &[usize],
    na: &NormArgs,
) -> Result<Value, Diagnostic> {
    let shape = ctx.ty(v).shape;
    let cs = channel_shape(shape.rank(), Dim::Fixed(c));
    let stat_ty = TensorType::new(DType::F32, Shape::fixed(&[c]));
    let rm = ctx.state(site, &format!("running_mean{suffix}"), Init::Zeros, stat_ty.clone());
    let rv = ctx.state(site, &format!("running_var{suffix}"), Init::Ones, stat_ty.clone());
    let b = &mut ctx.b;
    let (xc, var) = if ctx.mode == Mode::Train {
        let inv = inv_count(ctx, &shape, axes);
        let b = &mut ctx.b;
        // One pass over the activations for both statistics: var = E[x²] − E[x]². The sums
        // accumulate in f64 (the CPU after short f32 partial sums), so the cancellation costs
        // about 1e-7…1e-6 × (1 + mean²/var) relative; the clamp at 0 keeps a constant
        // channel's rounding from making the variance negative. (The centred two-pass form
        // reads the activations twice; docs/LANGUAGE.md, bench/GPU-NOTES.md.)
        let s = b.sum(v, axes).at(site)?;
        let mean = b.mul(s, inv).at(site)?;
        let xc = b.sub(v, mean).at(site)?;
        let sq = b.mul(v, v).at(site)?;
        let ss = b.sum(sq, axes).at(site)?;
        let ex2 = b.mul(ss, inv).at(site)?;
        let m2 = b.mul(mean, mean).at(site)?;
        let d = b.sub(ex2, m2).at(site)?;
        let var = b.unary(UnaryOp::Relu, d).at(site)?;
        ctx.running_update(site, rm, mean, na.momentum)?;
        let unbiased = as_update(ctx, |ctx| {
            let f = bessel(ctx, &shape, axes)?;
            ctx.b.mul(var, f)
        })
        .at(site)?;
        ctx.running_update(site, rv, unbiased, na.momentum)?;
        (xc, var)
    } else {
        let mean = b.reshape(rm, cs.clone()).at(site)?;
        let var = b.reshape(rv, cs.clone()).at(site)?;
        (b.sub(v, mean).at(site)?, var)
    };
    let b = &mut ctx.b;
    let e = b.scalar(na.eps, 0);
    let ve = b.add2(var, e).at(site)?;
    let rs = b.unary(UnaryOp::Rsqrt, ve).at(site)?;
    let y = b.mul(xc, rs).at(site)?;
    if !na.affine {
        return Ok(y);
    }
    let g = ctx.param(site, &format!("gamma{suffix}"), Init::Ones, stat_ty.clone());
    let be = ctx.param(site, &format!("beta{suffix}"), Init::Zeros, stat_ty);
    let b = &mut ctx.b;
    let g = b.reshape(g, cs.clone()).at(site)?;
    let be = b.reshape(be, cs).at(site)?;
    let y = b.mul(y, g).at(site)?;
    b.add2(y, be).at(site)
}

/// Complex whitening batchnorm: centre, multiply by the inverse square root of the per-channel
/// 2×2 covariance `[[Vrr, Vri], [Vri, Vii]]` (+ eps on the diagonal), then a learned 2×2 γ
/// and complex β.
fn bn_whitening(
    ctx: &mut LowerCtx,
    site: &Site,
    x: Value,
    c: usize,
    axes: &[usize],
    na: &NormArgs,
) -> Result<Value, Diagnostic> {
    let shape = ctx.ty(x).shape;
    let cs = channel_shape(shape.rank(), Dim::Fixed(c));
    let f32c = TensorType::new(DType::F32, Shape::fixed(&[c]));
    let rmean = ctx.state(site, "running_mean", Init::Zeros, TensorType::new(DType::C64, Shape::fixed(&[c])));
    let rvrr = ctx.state(site, "running_vrr", Init::Constant(0.5), f32c.clone());
    let rvri = ctx.state(site, "running_vri", Init::Zeros, f32c.clone());
    let rvii = ctx.state(site, "running_vii", Init::Constant(0.5), f32c.clone());
    let (xr, xi, vrr, vri, vii) = if ctx.mode == Mode::Train {
        let inv = inv_count(ctx, &shape, axes);
        let b = &mut ctx.b;
        let s = b.sum(x, axes).at(site)?;
        let mean = b.mul(s, inv).at(site)?;
        let xc = b.sub(x, mean).at(site)?;
        let xr = b.unary(UnaryOp::Real, xc).at(site)?;
        let xi = b.unary(UnaryOp::Imag, xc).at(site)?;
        let mut moment = |p: Value, q: Value| -> Result<Value, String> {
            let m = b.mul(p, q)?;
            let s = b.sum(m, axes)?;
            b.mul(s, inv)
        };
        let vrr = moment(xr, xr).at(site)?;
        let vri = moment(xr, xi).at(site)?;
        let vii = moment(xi, xi).at(site)?;
        ctx.running_update(site, rmean, mean, na.momentum)?;
        let [uvrr, uvri, uvii] = as_update(ctx, |ctx| -> Result<[Value; 3], String> {
            let f = bessel(ctx, &shape, axes)?;
            Ok([ctx.b.mul(vrr, f)?, ctx.b.mul(vri, f)?, ctx.b.mul(vii, f)?])
        })
        .at(site)?;
        ctx.running_update(site, rvrr, uvrr, na.momentum)?;
        ctx.running_update(site, rvri, uvri, na.momentum)?;
        ctx.running_update(site, rvii, uvii, na.momentum)?;
        (xr, xi, vrr, vri, vii)
    } else {
        let b = &mut ctx.b;
        let mean = b.reshape(rmean, cs.clone()).at(site)?;
        let xc = b.sub(x, mean).at(site)?;
        let xr = b.unary(UnaryOp::Real, xc).at(site)?;
        let xi = b.unary(UnaryOp::Imag, xc).at(site)?;
        let vrr = b.reshape(rvrr, cs.clone()).at(site)?;
        let vri = b.reshape(rvri, cs.clone()).at(site)?;
        let vii = b.reshape(rvii, cs.clone()).at(site)?;
        (xr, xi, vrr, vri, vii)
    };
    let (wr, wi) = whiten(&mut ctx.b, xr, xi, vrr, vri, vii, na.eps).at(site)?;
    if !na.affine {
        return ctx.b.binary(BinaryOp::Complex, wr, wi).at(site);
    }
    let inv_sqrt2 = std::f64::consts::FRAC_1_SQRT_2;
    let grr = ctx.param(site, "gamma_rr", Init::Constant(inv_sqrt2), f32c.clone());
    let gri = ctx.param(site, "gamma_ri", Init::Zeros, f32c.clone());
    let gii = ctx.param(site, "gamma_ii", Init::Constant(inv_sqrt2), f32c);
    let beta = ctx.param(site, "beta", Init::Zeros, TensorType::new(DType::C64, Shape::fixed(&[c])));
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let grr = b.reshape(grr, cs.clone())?;
        let gri = b.reshape(gri, cs.clone())?;
        let gii = b.reshape(gii, cs.clone())?;
        let beta = b.reshape(beta, cs.clone())?;
        let (a1, a2) = (b.mul(grr, wr)?, b.mul(gri, wi)?);
        let yr = b.add2(a1, a2)?;
        let (a3, a4) = (b.mul(gri, wr)?, b.mul(gii, wi)?);
        let yi = b.add2(a3, a4)?;
        let y = b.binary(BinaryOp::Complex, yr, yi)?;
        b.add2(y, beta)
    })();
    r.at(site)
}

/// `W·(xr, xi)` with `W = V^{-1/2}` in closed form: `s = sqrt(det V)`, `t = sqrt(tr V + 2s)`,
/// `W = [[Vii + s, -Vri], [-Vri, Vrr + s]] / (s·t)`, after adding `eps` to the diagonal.
fn whiten(
    b: &mut Builder,
    xr: Value,
    xi: Value,
    vrr: Value,
    vri: Value,
    vii: Value,
    eps: f64,
) -> Result<(Value, Value), String> {
    let e = b.scalar(eps, 0);
    let vrr = b.add2(vrr, e)?;
    let vii = b.add2(vii, e)?;
    let p = b.mul(vrr, vii)?;
    let q = b.mul(vri, vri)?;
    let det = b.sub(p, q)?;
    let s = b.unary(UnaryOp::Sqrt, det)?;
    let tr = b.add2(vrr, vii)?;
    let s2 = b.add2(s, s)?;
    let t2 = b.add2(tr, s2)?;
    let t = b.unary(UnaryOp::Sqrt, t2)?;
    let st = b.mul(s, t)?;
    let inv = b.unary(UnaryOp::Recip, st)?;
    let a = b.add2(vii, s)?;
    let wrr = b.mul(a, inv)?;
    let d = b.add2(vrr, s)?;
    let wii = b.mul(d, inv)?;
    let m = b.mul(vri, inv)?;
    let wri = b.unary(UnaryOp::Neg, m)?;
    let (r1, r2) = (b.mul(wrr, xr)?, b.mul(wri, xi)?);
    let yr = b.add2(r1, r2)?;
    let (i1, i2) = (b.mul(wri, xr)?, b.mul(wii, xi)?);
    let yi = b.add2(i1, i2)?;
    Ok((yr, yi))
}

/// How a complex layer norm scales the centred values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LayerNormKind {
    /// Multiply `(re, im)` by the inverse square root of their 2×2 covariance (complextorch's
    /// `LayerNorm`).
    Whitening,
    /// Divide re and im each by its own standard deviation: the whitening with the
    /// covariance's off-diagonal term taken as 0.
    Naive,
}

/// A per-sample normalisation over the last `axes` axes of a value: the settings of
/// `layernorm`/`rmsnorm`, for layers that normalise inside (an attention's q/k norm).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SampleNorm<'a> {
    /// How many trailing axes each statistic covers (`normalized_shape` is their extents).
    pub(crate) axes: usize,
    /// Complex layer norms only: whitening or naive.
    pub(crate) kind: LayerNormKind,
    /// Added to the variance (layernorm: to the covariance's diagonal) or the mean square.
    pub(crate) eps: f64,
    /// Whether the learned affine map (and layernorm's bias) follows.
    pub(crate) affine: bool,
    /// Put before the parameter names under the layer's prefix: `""` gives
    /// `<prefix>.weight`, `"q_norm."` gives `<prefix>.q_norm.weight`.
    pub(crate) params: &'a str,
}

impl SampleNorm<'static> {
    /// The settings of a `layernorm`/`rmsnorm` call (`kind` is read by `layernorm` only).
    fn from_args(site: &Site, with_kind: bool) -> Result<Self, Diagnostic> {
        let kind = if with_kind {
            match site.args.choice("kind", "whitening", &["whitening", "naive"])? {
                "naive" => LayerNormKind::Naive,
                _ => LayerNormKind::Whitening,
            }
        } else {
            LayerNormKind::Whitening
        };
        Ok(SampleNorm {
            axes: site.args.count("axes", Some(1), 1)?,
            kind,
            eps: site.args.positive("eps", 1e-5)?,
            affine: site.args.flag("affine", true)?,
            params: "",
        })
    }
}

fn layernorm(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let n = SampleNorm::from_args(site, true)?;
    layer_norm(ctx, site, &ops[0], &n)
}

fn rmsnorm(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let n = SampleNorm::from_args(site, false)?;
    rms_norm(ctx, site, &ops[0], &n)
}

/// The last `k` axes of `x` (the normalised ones) and their extents, which must be fixed: a
/// statistic per sample never mixes samples.
fn trailing_axes(
    ctx: &LowerCtx,
    site: &Site,
    x: &Operand,
    k: usize,
) -> Result<(Vec<usize>, Vec<usize>), Diagnostic> {
    let ty = need_float(ctx, site, x, "tensor")?;
    let rank = ty.shape.rank();
    if k > rank {
        return Err(site
            .operand_error(
                ctx,
                x,
                format!(
                    "`{}(axes = {k})` normalises over the last {k} axes, but the operand has {rank}",
                    site.call.op
                ),
                format!("needs at least {k} axes"),
            )
            .with_help(format!("choose `axes` between 1 and {rank}")));
    }
    let axes: Vec<usize> = (rank - k..rank).collect();
    let mut extents = Vec::with_capacity(k);
    for &a in &axes {
        let Some(e) = ty.shape.0[a].fixed() else {
            return Err(site
                .operand_error(
                    ctx,
                    x,
                    format!(
                        "`{}(axes = {k})` would normalise over axis {a}, the batch B: its statistics are per sample",
                        site.call.op
                    ),
                    "batch axis among the normalised ones",
                )
                .with_help("normalise over fewer trailing axes; `batchnorm` takes statistics across the batch"));
        };
        extents.push(e);
    }
    Ok((axes, extents))
}

/// Layer normalisation of each sample over the last `n.axes` axes of `x`, as complextorch
/// 2.1.1's `LayerNorm` (complex, `kind = whitening`) or `torch.nn.LayerNorm` (real): centre,
/// scale (2×2 whitening of `(re, im)`, or each part by its standard deviation when naive),
/// then `weight [2, 2, *shape]` as a 2×2 map of `(re, im)` plus `bias [2, *shape]` (real
/// input: `weight`, `bias` `[*shape]`). Every statistic is a mean (biased variance).
pub(crate) fn layer_norm(
    ctx: &mut LowerCtx,
    site: &Site,
    x: &Operand,
    n: &SampleNorm,
) -> Result<Value, Diagnostic> {
    let (axes, ns) = trailing_axes(ctx, site, x, n.axes)?;
    let shape = ctx.ty(x.value).shape;
    let inv = inv_count(ctx, &shape, &axes);
    let complex = ctx.ty(x.value).dtype.is_complex();
    let b = &mut ctx.b;
    let moment = |b: &mut Builder, p: Value, q: Value| -> Result<Value, String> {
        let m = b.mul(p, q)?;
        let s = b.sum(m, &axes)?;
        b.mul(s, inv)
    };
    let centred = (|| -> Result<Value, String> {
        let s = b.sum(x.value, &axes)?;
        let mean = b.mul(s, inv)?;
        b.sub(x.value, mean)
    })()
    .at(site)?;
    if !complex {
        let y = (|| -> Result<Value, String> {
            let var = moment(b, centred, centred)?;
            let e = b.scalar(n.eps, 0);
            let ve = b.add2(var, e)?;
            let rs = b.unary(UnaryOp::Rsqrt, ve)?;
            b.mul(centred, rs)
        })()
        .at(site)?;
        return real_affine(ctx, site, y, &ns, n, true);
    }
    let (wr, wi) = (|| -> Result<(Value, Value), String> {
        let xr = b.unary(UnaryOp::Real, centred)?;
        let xi = b.unary(UnaryOp::Imag, centred)?;
        let vrr = moment(b, xr, xr)?;
        let vii = moment(b, xi, xi)?;
        match n.kind {
            LayerNormKind::Whitening => {
                let vri = moment(b, xr, xi)?;
                whiten(b, xr, xi, vrr, vri, vii, n.eps)
            }
            LayerNormKind::Naive => {
                let e = b.scalar(n.eps, 0);
                let (vre, vie) = (b.add2(vrr, e)?, b.add2(vii, e)?);
                let (rr, ri) = (b.unary(UnaryOp::Rsqrt, vre)?, b.unary(UnaryOp::Rsqrt, vie)?);
                Ok((b.mul(xr, rr)?, b.mul(xi, ri)?))
            }
        }
    })()
    .at(site)?;
    complex_affine(ctx, site, wr, wi, &ns, n, true)
}

/// RMS normalisation of each sample over the last `n.axes` axes of `x`, as complextorch
/// 2.1.1's `RMSNorm`: `x / sqrt(mean |x|² + eps)`, then `weight [2, 2, *shape]` as a 2×2 map
/// of `(re, im)` (no bias). A real input is `torch.nn.RMSNorm` with `weight [*shape]`.
pub(crate) fn rms_norm(
    ctx: &mut LowerCtx,
    site: &Site,
    x: &Operand,
    n: &SampleNorm,
) -> Result<Value, Diagnostic> {
    let (axes, ns) = trailing_axes(ctx, site, x, n.axes)?;
    let shape = ctx.ty(x.value).shape;
    let inv = inv_count(ctx, &shape, &axes);
    let complex = ctx.ty(x.value).dtype.is_complex();
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let a2 = b.unary(UnaryOp::Abs2, x.value)?;
        let s = b.sum(a2, &axes)?;
        let ms = b.mul(s, inv)?;
        let e = b.scalar(n.eps, 0);
        let me = b.add2(ms, e)?;
        b.unary(UnaryOp::Rsqrt, me)
    })()
    .at(site)?;
    if !complex || !n.affine {
        let y = b.mul(x.value, r).at(site)?;
        return real_affine(ctx, site, y, &ns, n, false);
    }
    let (yr, yi) = (|| -> Result<(Value, Value), String> {
        let xr = b.unary(UnaryOp::Real, x.value)?;
        let xi = b.unary(UnaryOp::Imag, x.value)?;
        Ok((b.mul(xr, r)?, b.mul(xi, r)?))
    })()
    .at(site)?;
    complex_affine(ctx, site, yr, yi, &ns, n, false)
}

/// `y · weight (+ bias)` with real parameters of the normalised shape (`torch.nn.LayerNorm`'s
/// and `RMSNorm`'s affine); `y` unchanged without affine.
fn real_affine(
    ctx: &mut LowerCtx,
    site: &Site,
    y: Value,
    ns: &[usize],
    n: &SampleNorm,
    bias: bool,
) -> Result<Value, Diagnostic> {
    if !n.affine {
        return Ok(y);
    }
    let pty = TensorType::new(DType::F32, Shape::fixed(ns));
    let w = ctx.param(site, &format!("{}weight", n.params), Init::Ones, pty.clone());
    let y = ctx.b.mul(y, w).at(site)?;
    if !bias {
        return Ok(y);
    }
    let be = ctx.param(site, &format!("{}bias", n.params), Init::Zeros, pty);
    ctx.b.add2(y, be).at(site)
}

/// `complex(W·(re, im) + bias)` with complextorch's real parameters `weight [2, 2, *shape]`
/// (initialised to `I/√2`) and, when `bias`, `bias [2, *shape]`; `complex(re, im)` without
/// affine.
fn complex_affine(
    ctx: &mut LowerCtx,
    site: &Site,
    re: Value,
    im: Value,
    ns: &[usize],
    n: &SampleNorm,
    bias: bool,
) -> Result<Value, Diagnostic> {
    if !n.affine {
        return ctx.b.binary(BinaryOp::Complex, re, im).at(site);
    }
    let with = |lead: &[usize]| TensorType::new(DType::F32, Shape::fixed(&[lead, ns].concat()));
    let scale = std::f64::consts::FRAC_1_SQRT_2;
    let w = ctx.param(site, &format!("{}weight", n.params), Init::Eye2 { scale }, with(&[2, 2]));
    let be = bias.then(|| ctx.param(site, &format!("{}bias", n.params), Init::Zeros, with(&[2])));
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let target = Shape::fixed(ns);
        // The parameters viewed as `[4, *shape]` and `[2, *shape]`: each entry `w[i, j]` (or
        // `bias[i]`) is one slice of a view shared by all of them, as a `[*shape]` value that
        // broadcasts over the sample's leading axes, so the gradient's pieces of a parameter
        // join into one concatenation.
        let rows = |b: &mut Builder, p: Value, n: usize| b.reshape(p, Shape::fixed(&[&[n], ns].concat()));
        let wr = rows(b, w, 4)?;
        let br = match be {
            Some(be) => Some(rows(b, be, 2)?),
            None => None,
        };
        let entry = |b: &mut Builder, v: Value, at: usize| -> Result<Value, String> {
            let v = b.add(Op::Slice { axis: 0, start: at, len: 1 }, &[v])?;
            b.reshape(v, target.clone())
        };
        let part = |b: &mut Builder, row: usize| -> Result<Value, String> {
            let (w0, w1) = (entry(b, wr, 2 * row)?, entry(b, wr, 2 * row + 1)?);
            let (a, c) = (b.mul(w0, re)?, b.mul(w1, im)?);
            let y = b.add2(a, c)?;
            match br {
                Some(br) => {
                    let bi = entry(b, br, row)?;
                    b.add2(y, bi)
                }
                None => Ok(y),
            }
        };
        let yr = part(b, 0)?;
        let yi = part(b, 1)?;
        b.binary(BinaryOp::Complex, yr, yi)
    })();
    r.at(site)
}
