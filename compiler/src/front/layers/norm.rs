//! Normalisation: `batchnorm` (naive re/im and whitening, Trabelsi et al. 2018), `layernorm`.

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
        signature: "layernorm(eps = 1e-5, affine = true)",
        args: &["eps", "affine"],
        variadic: false,
        operands: (1, 1),
        lower: layernorm,
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

/// Layer normalisation over every non-batch axis; complex values normalise re and im
/// separately (naive), each with its own γ, β of the normalised shape.
fn layernorm(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let na = NormArgs {
        momentum: 0.0,
        eps: site.args.positive("eps", 1e-5)?,
        affine: site.args.flag("affine", true)?,
    };
    let x = &ops[0];
    let ty = need_rank(ctx, site, x, 2..=usize::MAX, "[B, ...]")?;
    for a in 1..ty.shape.rank() {
        fixed_dim(ctx, site, x, a, "extent")?;
    }
    if !ty.dtype.is_complex() {
        return ln_real(ctx, site, x.value, "", &na);
    }
    let re = ctx.b.unary(UnaryOp::Real, x.value).at(site)?;
    let im = ctx.b.unary(UnaryOp::Imag, x.value).at(site)?;
    let re = ln_real(ctx, site, re, "_re", &na)?;
    let im = ln_real(ctx, site, im, "_im", &na)?;
    ctx.b.binary(BinaryOp::Complex, re, im).at(site)
}

fn ln_real(
    ctx: &mut LowerCtx,
    site: &Site,
    v: Value,
    suffix: &str,
    na: &NormArgs,
) -> Result<Value, Diagnostic> {
    let shape = ctx.ty(v).shape;
    let axes: Vec<usize> = (1..shape.rank()).collect();
    let inv = inv_count(ctx, &shape, &axes);
    let b = &mut ctx.b;
    let y = (|| -> Result<Value, String> {
        let s = b.sum(v, &axes)?;
        let mean = b.mul(s, inv)?;
        let xc = b.sub(v, mean)?;
        let sq = b.mul(xc, xc)?;
        let ss = b.sum(sq, &axes)?;
        let var = b.mul(ss, inv)?;
        let e = b.scalar(na.eps, 0);
        let ve = b.add2(var, e)?;
        let rs = b.unary(UnaryOp::Rsqrt, ve)?;
        b.mul(xc, rs)
    })()
    .at(site)?;
    if !na.affine {
        return Ok(y);
    }
    let norm_shape = Shape(shape.0[1..].to_vec());
    let pty = TensorType::new(DType::F32, norm_shape);
    let g = ctx.param(site, &format!("gamma{suffix}"), Init::Ones, pty.clone());
    let be = ctx.param(site, &format!("beta{suffix}"), Init::Zeros, pty);
    let b = &mut ctx.b;
    let y = b.mul(y, g).at(site)?;
    b.add2(y, be).at(site)
}
