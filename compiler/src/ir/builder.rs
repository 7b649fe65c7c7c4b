//! Type inference for every primitive op, and a [`Builder`] that appends type-checked nodes.

use super::*;

/// Broadcasts two shapes NumPy-style (right-aligned; extent 1 repeats).
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Result<Shape, String> {
    let rank = a.rank().max(b.rank());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.rank() >= rank { a.0[i + a.rank() - rank] } else { Dim::Fixed(1) };
        let db = if i + b.rank() >= rank { b.0[i + b.rank() - rank] } else { Dim::Fixed(1) };
        let d = match (da, db) {
            (x, y) if x == y => x,
            (Dim::Fixed(1), y) => y,
            (x, Dim::Fixed(1)) => x,
            _ => return Err(format!("shapes {a} and {b} do not broadcast")),
        };
        out.push(d);
    }
    Ok(Shape(out))
}

/// Whether `from` broadcasts to exactly `to`.
pub fn broadcasts_to(from: &Shape, to: &Shape) -> bool {
    from.rank() <= to.rank() && broadcast_shapes(from, to).is_ok_and(|s| &s == to)
}

fn mixed(a: DType, b: DType) -> Result<DType, String> {
    match (a, b) {
        (DType::I32, _) | (_, DType::I32) => Err("i32 values take no arithmetic".into()),
        (DType::F32, DType::F32) => Ok(DType::F32),
        _ => Ok(DType::C64),
    }
}

fn need(dt: DType, want: DType, what: &str) -> Result<(), String> {
    if dt == want {
        Ok(())
    } else {
        Err(format!("{what} needs {want}, got {dt}"))
    }
}

fn dims4(s: &Shape, what: &str) -> Result<[Dim; 4], String> {
    if s.rank() != 4 {
        return Err(format!("{what} needs a 4-D tensor (N, C, H, W), got {s}"));
    }
    Ok([s.0[0], s.0[1], s.0[2], s.0[3]])
}

fn fixed(d: Dim, what: &str) -> Result<usize, String> {
    d.fixed().ok_or_else(|| format!("{what} cannot be the batch size B"))
}

/// The type of a (batched) matmul: `[P..., m, k]·[P..., k, n]` after the transposes, equal
/// leading axes or a 2-D operand broadcast over them; `sum_batch` sums the product over `P...`.
fn matmul_type(
    a: &TensorType,
    b: &TensorType,
    trans: [bool; 2],
    sum_batch: bool,
) -> Result<TensorType, String> {
    let (sa, sb) = (&a.shape, &b.shape);
    if sa.rank() < 2 || sb.rank() < 2 {
        return Err(format!("matmul needs operands of rank 2 or more, got {sa} and {sb}"));
    }
    let (ra, rb) = (sa.rank(), sb.rank());
    let batch: &[Dim] = match (ra, rb) {
        _ if ra == rb && sa.0[..ra - 2] == sb.0[..rb - 2] => &sa.0[..ra - 2],
        (2, _) => &sb.0[..rb - 2],
        (_, 2) => &sa.0[..ra - 2],
        _ => {
            return Err(format!(
                "matmul batch axes differ: {sa} and {sb} (they must be equal, or one operand 2-D)"
            ))
        }
    };
    if sum_batch && (ra == 2 || rb == 2) {
        return Err(format!("matmul sum_batch needs batch axes on both operands, got {sa} and {sb}"));
    }
    let last2 = |s: &Shape, t: bool| {
        let (r, c) = (s.0[s.rank() - 2], s.0[s.rank() - 1]);
        if t {
            (c, r)
        } else {
            (r, c)
        }
    };
    let (m, ka) = last2(sa, trans[0]);
    let (kb, n) = last2(sb, trans[1]);
    if ka != kb {
        return Err(format!("matmul inner extents differ: {ka} vs {kb}"));
    }
    let mut out = if sum_batch { Vec::new() } else { batch.to_vec() };
    out.extend([m, n]);
    Ok(TensorType::new(mixed(a.dtype, b.dtype)?, Shape(out)))
}

/// The result type of `op` applied to operands of types `inputs`. `requested` is the
/// target shape for ops that take one (`Reshape`, `Expand`, `DropoutMask`).
pub fn infer(op: &Op, inputs: &[&TensorType], requested: Option<&Shape>) -> Result<TensorType, String> {
    let arity = |n: usize| -> Result<(), String> {
        if inputs.len() == n {
            Ok(())
        } else {
            Err(format!("{} takes {n} operands, got {}", op.mnemonic(), inputs.len()))
        }
    };
    let req = || requested.cloned().ok_or_else(|| format!("{} needs a target shape", op.mnemonic()));
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::State { .. } => {
            arity(0)?;
            Err("leaf types are given, not inferred".into())
        }
        Op::Scalar { .. } => {
            arity(0)?;
            Ok(TensorType::new(DType::F32, Shape::scalar()))
        }
        Op::Unary(u) => {
            arity(1)?;
            let t = inputs[0];
            use UnaryOp::*;
            let dtype = match u {
                Neg | Conj | StopGrad => {
                    if t.dtype == DType::I32 {
                        return Err(format!("{u:?} needs f32 or c64"));
                    }
                    t.dtype
                }
                Real | Imag | Abs | Abs2 | Angle => {
                    if t.dtype == DType::I32 {
                        return Err(format!("{u:?} needs f32 or c64"));
                    }
                    DType::F32
                }
                ToComplex => {
                    need(t.dtype, DType::F32, "to_complex")?;
                    DType::C64
                }
                Exp | Log | Sqrt | Rsqrt | Recip | Sin | Cos | Tanh | Sigmoid | Relu | Step | Gelu
                | GeluGrad | GeluTanh | GeluTanhGrad => {
                    need(t.dtype, DType::F32, &format!("{u:?}").to_lowercase())?;
                    DType::F32
                }
            };
            Ok(TensorType::new(dtype, t.shape.clone()))
        }
        Op::Binary(b) => {
            arity(2)?;
            let (x, y) = (inputs[0], inputs[1]);
            let shape = broadcast_shapes(&x.shape, &y.shape)?;
            use BinaryOp::*;
            let dtype = match b {
                Add | Sub | Mul => mixed(x.dtype, y.dtype)?,
                Div => mixed(x.dtype, y.dtype)?,
                Max | Greater => {
                    need(x.dtype, DType::F32, "max/greater")?;
                    need(y.dtype, DType::F32, "max/greater")?;
                    DType::F32
                }
                Equal => {
                    if x.dtype == DType::C64 || y.dtype == DType::C64 {
                        return Err("equal needs real operands".into());
                    }
                    DType::F32
                }
                Complex => {
                    need(x.dtype, DType::F32, "complex (real part)")?;
                    need(y.dtype, DType::F32, "complex (imaginary part)")?;
                    DType::C64
                }
            };
            Ok(TensorType::new(dtype, shape))
        }
        Op::Select => {
            arity(3)?;
            need(inputs[0].dtype, DType::F32, "select condition")?;
            let s = broadcast_shapes(&inputs[0].shape, &inputs[1].shape)?;
            let s = broadcast_shapes(&s, &inputs[2].shape)?;
            Ok(TensorType::new(mixed(inputs[1].dtype, inputs[2].dtype)?, s))
        }
        Op::Reduce { op: r, axes } => {
            arity(1)?;
            let t = inputs[0];
            if axes.windows(2).any(|w| w[0] >= w[1]) || axes.iter().any(|&a| a >= t.shape.rank()) {
                return Err(format!("bad reduction axes {axes:?} for {}", t.shape));
            }
            match r {
                ReduceOp::Sum | ReduceOp::MaxMag => {
                    if t.dtype == DType::I32 {
                        return Err("cannot reduce i32".into());
                    }
                }
                ReduceOp::Max => need(t.dtype, DType::F32, "reduce_max")?,
            }
            let mut s = t.shape.clone();
            for &a in axes {
                s.0[a] = Dim::Fixed(1);
            }
            Ok(TensorType::new(t.dtype, s))
        }
        Op::Reshape => {
            arity(1)?;
            let to = req()?;
            let from = &inputs[0].shape;
            if from.fixed_numel() != to.fixed_numel() || from.batch_power() != to.batch_power() {
                return Err(format!("cannot reshape {from} to {to}: element counts differ"));
            }
            Ok(TensorType::new(inputs[0].dtype, to))
        }
        Op::Expand => {
            arity(1)?;
            let to = req()?;
            if !broadcasts_to(&inputs[0].shape, &to) {
                return Err(format!("cannot expand {} to {to}", inputs[0].shape));
            }
            Ok(TensorType::new(inputs[0].dtype, to))
        }
        Op::Permute { perm } => {
            arity(1)?;
            let s = &inputs[0].shape;
            let mut seen = perm.clone();
            seen.sort_unstable();
            if seen != (0..s.rank()).collect::<Vec<_>>() {
                return Err(format!("{perm:?} is not a permutation of the axes of {s}"));
            }
            Ok(TensorType::new(inputs[0].dtype, Shape(perm.iter().map(|&p| s.0[p]).collect())))
        }
        Op::Slice { axis, start, len } => {
            arity(1)?;
            let s = &inputs[0].shape;
            let ext = fixed(*s.0.get(*axis).ok_or("slice axis out of range")?, "a sliced axis")?;
            if start + len > ext || *len == 0 {
                return Err(format!("slice {start}..{} out of range 0..{ext}", start + len));
            }
            let mut o = s.clone();
            o.0[*axis] = Dim::Fixed(*len);
            Ok(TensorType::new(inputs[0].dtype, o))
        }
        Op::Pad { axis, before, after } => {
            arity(1)?;
            let s = &inputs[0].shape;
            let ext = fixed(*s.0.get(*axis).ok_or("pad axis out of range")?, "a padded axis")?;
            let mut o = s.clone();
            o.0[*axis] = Dim::Fixed(ext + before + after);
            Ok(TensorType::new(inputs[0].dtype, o))
        }
        Op::Concat { axis } => {
            if inputs.is_empty() {
                return Err("concat needs at least one operand".into());
            }
            let first = &inputs[0].shape;
            if *axis >= first.rank() {
                return Err("concat axis out of range".into());
            }
            let mut total = 0;
            let mut dtype = inputs[0].dtype;
            for t in inputs {
                if t.shape.rank() != first.rank()
                    || (0..first.rank()).any(|i| i != *axis && t.shape.0[i] != first.0[i])
                {
                    return Err(format!("cannot concatenate {} and {} along axis {axis}", first, t.shape));
                }
                total += fixed(t.shape.0[*axis], "a concatenated axis")?;
                dtype = mixed(dtype, t.dtype)?;
            }
            let mut o = first.clone();
            o.0[*axis] = Dim::Fixed(total);
            Ok(TensorType::new(dtype, o))
        }
        Op::MatMul { trans, sum_batch, .. } => {
            arity(2)?;
            matmul_type(inputs[0], inputs[1], *trans, *sum_batch)
        }
        Op::Conv2d { geom, .. } => {
            arity(2)?;
            let [n, c, h, w] = dims4(&inputs[0].shape, "conv2d input")?;
            let [o, cg, kh, kw] = dims4(&inputs[1].shape, "conv2d weight")?;
            let (c, cg, o) = (fixed(c, "channels")?, fixed(cg, "channels")?, fixed(o, "channels")?);
            let (kh, kw) = (fixed(kh, "kernel")?, fixed(kw, "kernel")?);
            if geom.groups == 0 || c != cg * geom.groups || o % geom.groups != 0 {
                return Err(format!(
                    "conv2d channels: input has {c}, weight expects {cg}×{} groups",
                    geom.groups
                ));
            }
            let ho = geom
                .out_extent(0, fixed(h, "height")?, kh)
                .ok_or("conv2d kernel larger than the padded input height")?;
            let wo = geom
                .out_extent(1, fixed(w, "width")?, kw)
                .ok_or("conv2d kernel larger than the padded input width")?;
            Ok(TensorType::new(
                mixed(inputs[0].dtype, inputs[1].dtype)?,
                Shape(vec![n, Dim::Fixed(o), Dim::Fixed(ho), Dim::Fixed(wo)]),
            ))
        }
        Op::ConvTranspose2d { geom, out_hw, .. } => {
            arity(2)?;
            let [n, o, ho, wo] = dims4(&inputs[0].shape, "conv_transpose2d input")?;
            let [ow, cg, kh, kw] = dims4(&inputs[1].shape, "conv_transpose2d weight")?;
            if o != ow {
                return Err(format!("conv_transpose2d: input has {o} channels, weight {ow}"));
            }
            let (kh, kw) = (fixed(kh, "kernel")?, fixed(kw, "kernel")?);
            for a in 0..2 {
                let got = geom.out_extent(a, out_hw[a], [kh, kw][a]);
                let want = fixed([ho, wo][a], "spatial extent")?;
                if got != Some(want) {
                    return Err(format!(
                        "conv_transpose2d: output extent {} does not map back to {want}",
                        out_hw[a]
                    ));
                }
            }
            let c = fixed(cg, "channels")? * geom.groups;
            Ok(TensorType::new(
                mixed(inputs[0].dtype, inputs[1].dtype)?,
                Shape(vec![n, Dim::Fixed(c), Dim::Fixed(out_hw[0]), Dim::Fixed(out_hw[1])]),
            ))
        }
        Op::Conv2dWeightGrad { geom, kernel, .. } => {
            arity(2)?;
            let [_, c, h, w] = dims4(&inputs[0].shape, "conv2d_weight_grad input")?;
            let [_, o, ho, wo] = dims4(&inputs[1].shape, "conv2d_weight_grad gradient")?;
            let (h, w) = (fixed(h, "height")?, fixed(w, "width")?);
            if geom.out_extent(0, h, kernel[0]) != o_fixed(ho)
                || geom.out_extent(1, w, kernel[1]) != o_fixed(wo)
            {
                return Err("conv2d_weight_grad: extents do not match the geometry".into());
            }
            let c = fixed(c, "channels")?;
            if c % geom.groups != 0 {
                return Err("conv2d_weight_grad: channels not divisible by groups".into());
            }
            Ok(TensorType::new(
                mixed(inputs[0].dtype, inputs[1].dtype)?,
                Shape(vec![o, Dim::Fixed(c / geom.groups), Dim::Fixed(kernel[0]), Dim::Fixed(kernel[1])]),
            ))
        }
        Op::Fft { axis, .. } => {
            arity(1)?;
            need(inputs[0].dtype, DType::C64, "fft")?;
            let d = *inputs[0].shape.0.get(*axis).ok_or("fft axis out of range")?;
            fixed(d, "the transformed axis")?;
            Ok(inputs[0].clone())
        }
        Op::OneHot { classes } => {
            arity(1)?;
            need(inputs[0].dtype, DType::I32, "one_hot")?;
            let mut s = inputs[0].shape.clone();
            s.0.push(Dim::Fixed(*classes));
            Ok(TensorType::new(DType::F32, s))
        }
        Op::Gather => {
            arity(2)?;
            let (table, idx) = (inputs[0], inputs[1]);
            if table.dtype == DType::I32 {
                return Err("gather needs an f32 or c64 table".into());
            }
            need(idx.dtype, DType::I32, "gather indices")?;
            if table.shape.rank() != 2 {
                return Err(format!("gather needs a 2-D table (rows, width), got {}", table.shape));
            }
            fixed(table.shape.0[0], "the gather table's rows")?;
            let width = fixed(table.shape.0[1], "the gather table's width")?;
            let mut s = idx.shape.clone();
            s.0.push(Dim::Fixed(width));
            Ok(TensorType::new(table.dtype, s))
        }
        Op::ScatterAdd { rows } => {
            arity(2)?;
            let (src, idx) = (inputs[0], inputs[1]);
            if src.dtype == DType::I32 {
                return Err("scatter_add needs f32 or c64 values".into());
            }
            need(idx.dtype, DType::I32, "scatter_add indices")?;
            let Some((&last, lead)) = src.shape.0.split_last() else {
                return Err("scatter_add needs values with a row axis".into());
            };
            if lead != idx.shape.0.as_slice() {
                return Err(format!("scatter_add: values {} do not match indices {}", src.shape, idx.shape));
            }
            let width = fixed(last, "the scattered rows' width")?;
            if *rows == 0 {
                return Err("scatter_add needs at least one row".into());
            }
            Ok(TensorType::new(src.dtype, Shape(vec![Dim::Fixed(*rows), Dim::Fixed(width)])))
        }
        Op::DropoutMask { p, .. } => {
            arity(1)?;
            need(inputs[0].dtype, DType::I32, "dropout step counter")?;
            if !(0.0..1.0).contains(p) {
                return Err(format!("dropout probability {p} is not in [0, 1)"));
            }
            Ok(TensorType::new(DType::F32, req()?))
        }
        Op::AttnLse { spec } => {
            arity(2 + usize::from(spec.key_mask))?;
            let d = attn_dims(spec, inputs[0], inputs[1], None)?;
            // The log-sum-exp is taken before dropout: it reads no step counter.
            attn_extras(&AttnSpec { dropout: None, ..*spec }, &d, &inputs[2..])?;
            Ok(TensorType::new(DType::F32, Shape(vec![d.b, Dim::Fixed(d.h), Dim::Fixed(d.t)])))
        }
        Op::Attention { spec } => {
            arity(4 + spec.extra_operands())?;
            let d = attn_dims(spec, inputs[0], inputs[1], Some(inputs[2]))?;
            attn_lse_operand(&d, inputs[3])?;
            attn_extras(spec, &d, &inputs[4..])?;
            Ok(TensorType::new(DType::C64, d.shape(d.t, d.h * d.dv)))
        }
        Op::AttentionGrad { spec, wrt } => {
            arity(6 + spec.extra_operands())?;
            let d = attn_dims(spec, inputs[0], inputs[1], Some(inputs[2]))?;
            for (t, what) in [(inputs[3], "attention output"), (inputs[4], "attention output gradient")] {
                need(t.dtype, DType::C64, what)?;
                if t.shape != d.shape(d.t, d.h * d.dv) {
                    return Err(format!("{what} is {}, expected {}", t.shape, d.shape(d.t, d.h * d.dv)));
                }
            }
            attn_lse_operand(&d, inputs[5])?;
            attn_extras(spec, &d, &inputs[6..])?;
            Ok(TensorType::new(
                DType::C64,
                match wrt {
                    AttnWrt::Q => d.shape(d.t, d.h * d.d),
                    AttnWrt::KV => d.shape(d.s, d.h * (d.d + d.dv)),
                },
            ))
        }
        Op::Recurrence { spec } => {
            arity(spec.forward_operands())?;
            let (b, t) = rnn_operands(spec, inputs)?;
            rnn_init(spec, b, inputs.get(3))?;
            let width = spec.cell.states() * spec.hidden;
            Ok(TensorType::new(DType::C64, Shape(vec![b, Dim::Fixed(t), Dim::Fixed(width)])))
        }
        Op::RecurrenceGrad { spec } => {
            arity(spec.grad_operands())?;
            let (b, t) = rnn_operands(spec, inputs)?;
            rnn_init(spec, b, inputs.get(5))?;
            let want = Shape(vec![b, Dim::Fixed(t), Dim::Fixed(spec.cell.states() * spec.hidden)]);
            for (ty, what) in [(inputs[3], "recurrence states"), (inputs[4], "recurrence state gradient")] {
                need(ty.dtype, DType::C64, what)?;
                if ty.shape != want {
                    return Err(format!("{what} is {}, expected {want}", ty.shape));
                }
            }
            Ok(TensorType::new(DType::C64, Shape(vec![b, Dim::Fixed(t), Dim::Fixed(spec.grad_width())])))
        }
        Op::Assign => {
            arity(2)?;
            if inputs[0].shape != inputs[1].shape {
                return Err(format!("assign: {} vs {}", inputs[0].shape, inputs[1].shape));
            }
            if inputs[0].dtype != inputs[1].dtype {
                return Err(format!("assign: {} vs {}", inputs[0].dtype, inputs[1].dtype));
            }
            Ok(inputs[0].clone())
        }
    }
}

/// Checks `[xp (c64 [B, T, G·H]), w_hh (c64 [G·H, H]), b_hh (c64 [G·H])]` of a recurrence and
/// returns `(B, T)`.
fn rnn_operands(spec: &RnnSpec, inputs: &[&TensorType]) -> Result<(Dim, usize), String> {
    let h = spec.hidden;
    let gh = spec.cell.gates() * h;
    if h == 0 {
        return Err("recurrence hidden size 0".into());
    }
    for (ty, what) in [
        (inputs[0], "recurrence input projection"),
        (inputs[1], "recurrence weight"),
        (inputs[2], "recurrence bias"),
    ] {
        need(ty.dtype, DType::C64, what)?;
    }
    let xp = &inputs[0].shape;
    if xp.rank() != 3 || xp.0[2] != Dim::Fixed(gh) {
        return Err(format!("recurrence input projection is {xp}, expected [B, T, {gh}]"));
    }
    let t = fixed(xp.0[1], "the recurrence's time axis")?;
    if t == 0 {
        return Err("recurrence over 0 steps".into());
    }
    if inputs[1].shape != Shape::fixed(&[gh, h]) {
        return Err(format!("recurrence weight is {}, expected [{gh}, {h}]", inputs[1].shape));
    }
    if inputs[2].shape != Shape::fixed(&[gh]) {
        return Err(format!("recurrence bias is {}, expected [{gh}]", inputs[2].shape));
    }
    Ok((xp.0[0], t))
}

/// Checks the initial state `h0` (c64 `[B, S·H]`) of a recurrence with `spec.init`.
fn rnn_init(spec: &RnnSpec, b: Dim, h0: Option<&&TensorType>) -> Result<(), String> {
    let Some(h0) = h0.filter(|_| spec.init) else { return Ok(()) };
    need(h0.dtype, DType::C64, "recurrence initial state")?;
    let want = Shape(vec![b, Dim::Fixed(spec.cell.states() * spec.hidden)]);
    if h0.shape != want {
        return Err(format!("recurrence initial state is {}, expected {want}", h0.shape));
    }
    Ok(())
}

/// The extents of an attention: `B`, heads, queries, keys, head features (see [`AttnHeads`]).
struct AttnDims {
    b: Dim,
    h: usize,
    t: usize,
    s: usize,
    d: usize,
    dv: usize,
}

impl AttnDims {
    /// A token-major `[B, rows, cols]` shape.
    fn shape(&self, rows: usize, cols: usize) -> Shape {
        Shape(vec![self.b, Dim::Fixed(rows), Dim::Fixed(cols)])
    }
}

fn attn_dims(
    spec: &AttnSpec,
    q: &TensorType,
    k: &TensorType,
    v: Option<&TensorType>,
) -> Result<AttnDims, String> {
    if !spec.scale.is_finite() {
        return Err(format!("attention scale {} is not finite", spec.scale));
    }
    if let Some((p, _)) = spec.dropout {
        if !(0.0..1.0).contains(&p) {
            return Err(format!("attention dropout probability {p} is not in [0, 1)"));
        }
    }
    let hd = spec.heads;
    if hd.n == 0 || hd.d == 0 || hd.dv == 0 {
        return Err(format!("attention with {} heads of {} / {} features", hd.n, hd.d, hd.dv));
    }
    // `[B, rows, C]` with the heads of operand `i` inside its `C` columns.
    let three = |t: &TensorType, i: usize, what: &str| -> Result<(Dim, usize), String> {
        need(t.dtype, DType::C64, what)?;
        if t.shape.rank() != 3 {
            return Err(format!("{what} needs a 3-D tensor (B, tokens, features), got {}", t.shape));
        }
        let rows = fixed(t.shape.0[1], &format!("the token axis of the {what}"))?;
        let c = fixed(t.shape.0[2], &format!("the feature axis of the {what}"))?;
        if hd.cols[i] + hd.width(i) > c {
            return Err(format!(
                "the {what}'s {} heads of {} features from column {} pass its {c} columns",
                hd.n,
                hd.width(i) / hd.n,
                hd.cols[i]
            ));
        }
        Ok((t.shape.0[0], rows))
    };
    let (b, t) = three(q, 0, "attention query")?;
    let (kb, s) = three(k, 1, "attention key")?;
    if kb != b {
        return Err(format!("attention key {} does not match query {}", k.shape, q.shape));
    }
    if let Some(v) = v {
        if three(v, 2, "attention value")? != (b, s) {
            return Err(format!("attention value {} does not match key {}", v.shape, k.shape));
        }
    }
    Ok(AttnDims { b, h: hd.n, t, s, d: hd.d, dv: hd.dv })
}

fn attn_lse_operand(d: &AttnDims, lse: &TensorType) -> Result<(), String> {
    need(lse.dtype, DType::F32, "attention log-sum-exp")?;
    let want = Shape(vec![d.b, Dim::Fixed(d.h), Dim::Fixed(d.t)]);
    if lse.shape != want {
        return Err(format!("attention log-sum-exp is {}, expected {want}", lse.shape));
    }
    Ok(())
}

/// The optional trailing operands: the key mask f32 `[B, S]`, then the i32 step scalar.
fn attn_extras(spec: &AttnSpec, d: &AttnDims, extra: &[&TensorType]) -> Result<(), String> {
    let mut rest = extra.iter();
    if spec.key_mask {
        let m = rest.next().ok_or("attention key mask operand missing")?;
        need(m.dtype, DType::F32, "attention key mask")?;
        let want = Shape(vec![d.b, Dim::Fixed(d.s)]);
        if m.shape != want {
            return Err(format!("attention key mask is {}, expected {want}", m.shape));
        }
    }
    if spec.dropout.is_some() {
        let st = rest.next().ok_or("attention dropout step operand missing")?;
        need(st.dtype, DType::I32, "attention dropout step counter")?;
        if st.shape.rank() != 0 {
            return Err(format!("attention dropout step counter is {}, expected a scalar", st.shape));
        }
    }
    Ok(())
}

fn o_fixed(d: Dim) -> Option<usize> {
    d.fixed()
}

/// Appends type-checked nodes to a graph, stamping each with the current span and origin.
pub struct Builder<'g> {
    /// The graph being built.
    pub graph: &'g mut Graph,
    /// Span given to new nodes.
    pub span: Span,
    /// Origin given to new nodes.
    pub origin: Origin,
}

impl<'g> Builder<'g> {
    /// A builder appending to `graph`.
    pub fn new(graph: &'g mut Graph) -> Self {
        Builder { graph, span: Span::default(), origin: Origin { role: Role::Forward, label: String::new() } }
    }

    /// Sets the span and origin of the nodes that follow.
    pub fn at(&mut self, span: Span, role: Role, label: impl Into<String>) -> &mut Self {
        self.span = span;
        self.origin = Origin { role, label: label.into() };
        self
    }

    /// Appends `op(inputs)` with an inferred type.
    pub fn add(&mut self, op: Op, inputs: &[Value]) -> Result<Value, String> {
        self.add_shaped(op, inputs, None)
    }

    /// Appends `op(inputs)`, passing a target shape (reshape, expand, dropout mask).
    pub fn add_shaped(&mut self, op: Op, inputs: &[Value], shape: Option<&Shape>) -> Result<Value, String> {
        let tys: Vec<&TensorType> = inputs.iter().map(|&v| self.graph.ty(v)).collect();
        let ty = infer(&op, &tys, shape)?;
        Ok(self.push(op, inputs.to_vec(), ty))
    }

    /// Appends a leaf of a given type (`Input`, `Param`, `State`).
    pub fn leaf(&mut self, op: Op, ty: TensorType) -> Value {
        self.push(op, Vec::new(), ty)
    }

    fn push(&mut self, op: Op, inputs: Vec<Value>, ty: TensorType) -> Value {
        let node = Node { op, inputs, ty, origin: self.origin.clone() };
        self.graph.nodes.append(node, self.span)
    }

    /// `value * B^batch_exp` as an f32 scalar.
    pub fn scalar(&mut self, value: f64, batch_exp: i32) -> Value {
        let ty = TensorType::new(DType::F32, Shape::scalar());
        self.push(Op::Scalar { value, batch_exp }, Vec::new(), ty)
    }
    /// Elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: Value) -> Result<Value, String> {
        self.add(Op::Unary(op), &[x])
    }
    /// Elementwise binary op.
    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Result<Value, String> {
        self.add(Op::Binary(op), &[a, b])
    }
    /// `a + b`.
    pub fn add2(&mut self, a: Value, b: Value) -> Result<Value, String> {
        self.binary(BinaryOp::Add, a, b)
    }
    /// `a - b`.
    pub fn sub(&mut self, a: Value, b: Value) -> Result<Value, String> {
        self.binary(BinaryOp::Sub, a, b)
    }
    /// `a * b`.
    pub fn mul(&mut self, a: Value, b: Value) -> Result<Value, String> {
        self.binary(BinaryOp::Mul, a, b)
    }
    /// `a / b`.
    pub fn div(&mut self, a: Value, b: Value) -> Result<Value, String> {
        self.binary(BinaryOp::Div, a, b)
    }
    /// `x * c` for a constant `c`.
    pub fn scale(&mut self, x: Value, c: f64) -> Result<Value, String> {
        let s = self.scalar(c, 0);
        self.mul(x, s)
    }
    /// Sum over `axes` (kept as extent 1).
    pub fn sum(&mut self, x: Value, axes: &[usize]) -> Result<Value, String> {
        self.add(Op::Reduce { op: ReduceOp::Sum, axes: axes.to_vec() }, &[x])
    }
    /// Reshape (a view).
    pub fn reshape(&mut self, x: Value, shape: Shape) -> Result<Value, String> {
        if self.graph.ty(x).shape == shape {
            return Ok(x);
        }
        self.add_shaped(Op::Reshape, &[x], Some(&shape))
    }
    /// Materialised broadcast to `shape`.
    pub fn expand(&mut self, x: Value, shape: Shape) -> Result<Value, String> {
        if self.graph.ty(x).shape == shape {
            return Ok(x);
        }
        self.add_shaped(Op::Expand, &[x], Some(&shape))
    }
}
