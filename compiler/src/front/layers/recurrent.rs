//! Recurrent layers: `gru(hidden, ...)` and `lstm(hidden, ...)` with complextorch's complex
//! `GRUCell`/`LSTMCell` over a `[B, T, F]` sequence (PyTorch's `batch_first = True`), in
//! `torch.nn.GRU`/`LSTM`'s parameter layout. Each direction of each layer lowers to one batched
//! `MatMul` for the input projection of every step and one `Recurrence` (the time loop).

use super::*;

pub(crate) const DEFS: &[OpDef] = &[
    OpDef {
        name: "gru",
        signature: "gru(hidden, layers = 1, bidirectional = false, returns = sequence | last)",
        args: &["hidden", "layers", "bidirectional", "returns"],
        variadic: false,
        operands: (1, 1),
        lower: gru,
    },
    OpDef {
        name: "lstm",
        signature: "lstm(hidden, layers = 1, bidirectional = false, returns = sequence | last)",
        args: &["hidden", "layers", "bidirectional", "returns"],
        variadic: false,
        operands: (1, 1),
        lower: lstm,
    },
];

fn gru(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    recurrent(ctx, site, &ops[0], RnnCell::Gru)
}

fn lstm(ctx: &mut LowerCtx, site: &Site, ops: &[Operand]) -> Result<Value, Diagnostic> {
    recurrent(ctx, site, &ops[0], RnnCell::Lstm)
}

/// `x: [B, T, F]` (real or complex) → `[B, T, D·H]` (`returns = sequence`: every step's `h`
/// of the last layer, directions concatenated) or `[B, D·H]` (`returns = last`: the final
/// state of each direction of the last layer, as PyTorch's `h_n[-D:]` side by side: the
/// forward direction's `h` at `t = T-1`, the backward direction's at `t = 0`).
fn recurrent(ctx: &mut LowerCtx, site: &Site, x: &Operand, cell: RnnCell) -> Result<Value, Diagnostic> {
    let hidden = site.args.count("hidden", None, 1)?;
    let layers = site.args.count("layers", Some(1), 1)?;
    let bidirectional = site.args.flag("bidirectional", false)?;
    let last = site.args.choice("returns", "sequence", &["sequence", "last"])? == "last";
    let ty = need_float(ctx, site, x, "input")?;
    if ty.shape.rank() != 3 {
        return Err(site
            .operand_error(
                ctx,
                x,
                format!("`{}` needs a sequence [B, T, features], got {}", site.call.op, ty.shape),
                "expects [B, T, features]",
            )
            .with_help("the time axis is axis 1 (PyTorch's batch_first = True); `permute(0, 2, 1)` turns a conv1d's [B, C, T] into [B, T, C]"));
    }
    let t = fixed_dim(ctx, site, x, 1, "sequence length")?;
    let mut features = fixed_dim(ctx, site, x, 2, "feature count")?;
    let gw = cell.gates() * hidden;
    // torch.nn.GRU/LSTM's reset_parameters: every weight and bias U(-1/√H, 1/√H) (complex:
    // re and im drawn independently).
    let init = || Init::Uniform { bound: 1.0 / (hidden as f64).sqrt() };
    let c64 = |dims: &[usize]| TensorType::new(DType::C64, Shape::fixed(dims));
    let mut seq = x.value;
    let mut finals = Vec::new();
    for layer in 0..layers {
        let mut outs = Vec::new();
        finals.clear();
        for reverse in [false, true].into_iter().take(if bidirectional { 2 } else { 1 }) {
            let suffix = format!("l{layer}{}", if reverse { "_reverse" } else { "" });
            let w_ih = ctx.param(site, &format!("weight_ih_{suffix}"), init(), c64(&[gw, features]));
            let w_hh = ctx.param(site, &format!("weight_hh_{suffix}"), init(), c64(&[gw, hidden]));
            let b_ih = ctx.param(site, &format!("bias_ih_{suffix}"), init(), c64(&[gw]));
            let b_hh = ctx.param(site, &format!("bias_hh_{suffix}"), init(), c64(&[gw]));
            let spec = RnnSpec { cell, hidden, reverse, init: false };
            let b = &mut ctx.b;
            let h = (|| -> Result<Value, String> {
                let mm = Op::MatMul { trans: [false, true], conj: [false, false], sum_batch: false };
                let xp = b.add(mm, &[seq, w_ih])?;
                let xp = b.add2(xp, b_ih)?;
                let hs = b.add(Op::Recurrence { spec }, &[xp, w_hh, b_hh])?;
                if cell.states() > 1 {
                    b.add(Op::Slice { axis: 2, start: 0, len: hidden }, &[hs])
                } else {
                    Ok(hs)
                }
            })()
            .at(site)?;
            let end = if reverse { 0 } else { t - 1 };
            finals.push((h, end));
            outs.push(h);
        }
        seq = if outs.len() == 1 { outs[0] } else { ctx.b.add(Op::Concat { axis: 2 }, &outs).at(site)? };
        features = outs.len() * hidden;
    }
    if !last {
        return Ok(seq);
    }
    let b = &mut ctx.b;
    (|| -> Result<Value, String> {
        let mut parts = Vec::new();
        for (h, end) in finals {
            parts.push(b.add(Op::Slice { axis: 1, start: end, len: 1 }, &[h])?);
        }
        let joined = if parts.len() == 1 { parts[0] } else { b.add(Op::Concat { axis: 2 }, &parts)? };
        let batch = b.graph.ty(joined).shape.0[0];
        b.reshape(joined, Shape(vec![batch, Dim::Fixed(features)]))
    })()
    .at(site)
}
