//! Token embeddings: `embedding(vocab, dim)` looks up one learned row per integer token.

use super::*;

pub(crate) const DEFS: &[OpDef] = &[OpDef {
    name: "embedding",
    signature: "embedding(vocab, dim, real = false)",
    args: &["vocab", "dim", "real"],
    variadic: false,
    operands: (1, 1),
    lower: embedding,
}];

/// `weight[tokens]` with `tokens: class[B, T..] of V` and `weight: [vocab, dim]` (c64 unless
/// `real = true`; `nn.Embedding`'s layout and its `normal(0, 1)` init, complex: variance ½ on
/// each of re and im). Lowered to a `Gather` of rows, whose gradient is a `ScatterAdd` into
/// the weight, so no one-hot matrix is ever formed.
fn embedding(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    let vocab = site.args.count("vocab", None, 1)?;
    let dim = site.args.count("dim", None, 1)?;
    let real = site.args.flag("real", false)?;
    let x = &ops[0];
    let ty = ctx.ty(x.value);
    if ty.dtype != DType::I32 {
        return Err(site
            .operand_error(
                ctx,
                x,
                format!("`embedding` needs integer tokens (a `class[B, ...] of N` input), got {ty}"),
                "not tokens",
            )
            .with_help("declare the tokens as `input ids: class[B, T] of VOCAB`"));
    }
    if let Some(&(classes, decl)) = ctx.classes.get(&x.value) {
        if classes > vocab {
            return Err(site
                .error(
                    format!("`embedding` has {vocab} rows, but the tokens take {classes} values"),
                    format!("tokens up to {} have no row", classes - 1),
                )
                .with_label(decl, format!("declared with {classes} values here"))
                .with_help(format!("write `embedding({classes}, {dim})`")));
        }
    }
    let wdt = if real { DType::F32 } else { DType::C64 };
    let w = ctx.param(
        site,
        "weight",
        Init::Normal { std: 1.0 },
        TensorType::new(wdt, Shape::fixed(&[vocab, dim])),
    );
    ctx.b.add(Op::Gather, &[w, x.value]).at(site)
}
