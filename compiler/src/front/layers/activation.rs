//! Activations: complex ones (crelu, modrelu, zrelu, cardioid), split ones (split_tanh,
//! split_sigmoid, cgelu) and real ones (relu, tanh, sigmoid, gelu).

use super::*;

const fn act(name: &'static str, signature: &'static str, lower: LowerFn) -> OpDef {
    OpDef { name, signature, args: &[], variadic: false, operands: (1, 1), lower }
}

pub(crate) const DEFS: &[OpDef] = &[
    act("crelu", "crelu", crelu),
    act("modrelu", "modrelu", modrelu),
    act("zrelu", "zrelu", zrelu),
    act("cardioid", "cardioid", cardioid),
    act("split_tanh", "split_tanh", split_tanh),
    act("split_sigmoid", "split_sigmoid", split_sigmoid),
    act("cgelu", "cgelu", cgelu),
    OpDef {
        name: "gelu",
        signature: "gelu(approximate = none | tanh)",
        args: &["approximate"],
        variadic: false,
        operands: (1, 1),
        lower: gelu,
    },
    act("relu", "relu", relu),
    act("tanh", "tanh", tanh),
    act("sigmoid", "sigmoid", sigmoid),
];

/// The operand's type, which must be complex (`real_alt` names the real counterpart).
fn need_complex(ctx: &LowerCtx, site: &Site, x: &Operand, real_alt: &str) -> Result<TensorType, Diagnostic> {
    let ty = need_float(ctx, site, x, "tensor")?;
    if !ty.dtype.is_complex() {
        return Err(site
            .operand_error(
                ctx,
                x,
                format!("`{}` needs a complex tensor, got {ty}", site.call.op),
                "real tensor here",
            )
            .with_help(format!("{} is for complex tensors; use {real_alt}", site.call.op)));
    }
    Ok(ty)
}

/// The operand's type, which must be real (`complex_alt` names the complex counterpart).
fn need_real(ctx: &LowerCtx, site: &Site, x: &Operand, complex_alt: &str) -> Result<TensorType, Diagnostic> {
    let ty = need_float(ctx, site, x, "tensor")?;
    if ty.dtype.is_complex() {
        return Err(site
            .operand_error(
                ctx,
                x,
                format!("`{}` needs a real tensor, got {ty}", site.call.op),
                "complex tensor here",
            )
            .with_help(format!(
                "{} is for real tensors; use {complex_alt} (or take `abs` first)",
                site.call.op
            )));
    }
    Ok(ty)
}

/// `f(re) + i·f(im)` for a complex value, `f(x)` for a real one.
fn split(ctx: &mut LowerCtx, site: &Site, x: Value, f: UnaryOp) -> Result<Value, Diagnostic> {
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        if !b.graph.ty(x).dtype.is_complex() {
            return b.unary(f, x);
        }
        let re = b.unary(UnaryOp::Real, x)?;
        let im = b.unary(UnaryOp::Imag, x)?;
        let re = b.unary(f, re)?;
        let im = b.unary(f, im)?;
        b.binary(BinaryOp::Complex, re, im)
    })();
    r.at(site)
}

/// `relu(re) + i·relu(im)`.
fn crelu(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    need_complex(ctx, site, &ops[0], "relu")?;
    split(ctx, site, ops[0].value, UnaryOp::Relu)
}

fn split_tanh(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    need_float(ctx, site, &ops[0], "tensor")?;
    split(ctx, site, ops[0].value, UnaryOp::Tanh)
}

fn split_sigmoid(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    need_float(ctx, site, &ops[0], "tensor")?;
    split(ctx, site, ops[0].value, UnaryOp::Sigmoid)
}

/// GELU of a real tensor: exact (`x·Φ(x)`, PyTorch's default) or, with `approximate = tanh`,
/// the tanh form (PyTorch's `approximate="tanh"`).
fn gelu(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let f = match site.args.choice("approximate", "none", &["none", "tanh"])? {
        "tanh" => UnaryOp::GeluTanh,
        _ => UnaryOp::Gelu,
    };
    need_real(ctx, site, &ops[0], "cgelu")?;
    ctx.b.unary(f, ops[0].value).at(site)
}

/// CGELU (torchcvnn): exact GELU on re and im separately.
fn cgelu(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    need_complex(ctx, site, &ops[0], "gelu")?;
    split(ctx, site, ops[0].value, UnaryOp::Gelu)
}

fn relu(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    need_real(ctx, site, &ops[0], "crelu, modrelu or zrelu")?;
    ctx.b.unary(UnaryOp::Relu, ops[0].value).at(site)
}

fn tanh(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    need_real(ctx, site, &ops[0], "split_tanh")?;
    ctx.b.unary(UnaryOp::Tanh, ops[0].value).at(site)
}

fn sigmoid(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    need_real(ctx, site, &ops[0], "split_sigmoid")?;
    ctx.b.unary(UnaryOp::Sigmoid, ops[0].value).at(site)
}

/// `relu(|z| + b)·z / max(|z|, 1e-12)` with a learned real bias `b` per channel (axis 1),
/// initialised to 0.
fn modrelu(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    let ty = need_complex(ctx, site, x, "relu")?;
    if ty.shape.rank() < 2 {
        return Err(site.operand_error(
            ctx,
            x,
            format!("`modrelu` needs a [B, C, ...] tensor (one bias per channel), got {}", ty.shape),
            "no channel axis",
        ));
    }
    let c = fixed_dim(ctx, site, x, 1, "channel count")?;
    let bias = ctx.param(site, "bias", Init::Zeros, TensorType::new(DType::F32, Shape::fixed(&[c])));
    let cs = channel_shape(ty.shape.rank(), Dim::Fixed(c));
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let bias = b.reshape(bias, cs)?;
        let m = b.unary(UnaryOp::Abs, x.value)?;
        let mb = b.add2(m, bias)?;
        let r = b.unary(UnaryOp::Relu, mb)?;
        let tiny = b.scalar(1e-12, 0);
        let den = b.binary(BinaryOp::Max, m, tiny)?;
        let scale = b.div(r, den)?;
        b.mul(x.value, scale)
    })();
    r.at(site)
}

/// `z` where `re z > 0` and `im z > 0`, else 0.
fn zrelu(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    need_complex(ctx, site, x, "relu")?;
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let re = b.unary(UnaryOp::Real, x.value)?;
        let im = b.unary(UnaryOp::Imag, x.value)?;
        let zero = b.scalar(0.0, 0);
        let pr = b.binary(BinaryOp::Greater, re, zero)?;
        let pi = b.binary(BinaryOp::Greater, im, zero)?;
        let mask = b.mul(pr, pi)?;
        b.mul(x.value, mask)
    })();
    r.at(site)
}

/// `0.5·(1 + cos(angle z))·z` (Virtue et al. 2017).
fn cardioid(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let x = &ops[0];
    need_complex(ctx, site, x, "relu")?;
    let b = &mut ctx.b;
    let r = (|| -> Result<Value, String> {
        let a = b.unary(UnaryOp::Angle, x.value)?;
        let c = b.unary(UnaryOp::Cos, a)?;
        let one = b.scalar(1.0, 0);
        let s = b.add2(c, one)?;
        let h = b.scale(s, 0.5)?;
        b.mul(x.value, h)
    })();
    r.at(site)
}
