//! Elementwise, reduction and data-movement kernels of the CUDA back end.

use super::*;
use std::collections::HashMap;

/// The index of a (broadcast) operand of shape `shape` at a point of `domain` whose
/// coordinates are the C expressions `coords` and whose linear index is `linear`.
fn index_in(shape: &[usize], domain: &[usize], coords: &[String], linear: &str) -> String {
    if shape == domain {
        return linear.to_string();
    }
    if shape.iter().product::<usize>() <= 1 {
        return "0u".into();
    }
    let r = shape.len();
    let d = domain.len();
    let st = strides(shape);
    let mut terms = Vec::new();
    for j in 0..r {
        if shape[j] == 1 || j + d < r {
            continue;
        }
        let a = d - r + j;
        if st[j] == 1 {
            terms.push(coords[a].clone());
        } else {
            terms.push(format!("{} * {}u", coords[a], st[j]));
        }
    }
    if terms.is_empty() {
        "0u".into()
    } else {
        terms.join(" + ")
    }
}

/// A condition true at exactly one domain point per element of an output of `shape`
/// (the point whose broadcast coordinates are 0), or `None` when every point owns one.
fn owner_guard(shape: &[usize], domain: &[usize], coords: &[String]) -> Option<String> {
    if shape == domain {
        return None;
    }
    let r = shape.len();
    let d = domain.len();
    let mut conds = Vec::new();
    for a in 0..d {
        let ext = if a + r >= d { shape[a + r - d] } else { 1 };
        if ext == 1 && domain[a] > 1 {
            conds.push(format!("{} == 0u", coords[a]));
        }
    }
    if conds.is_empty() {
        None
    } else {
        Some(conds.join(" && "))
    }
}

/// Emits the loads of `inputs` and the evaluation of `nodes` at one domain point; returns
/// the C variable of every value, those of `vars` (values already computed) included.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_values(
    ctx: &Ctx,
    nodes: &[Value],
    inputs: &[Value],
    domain: &[usize],
    coords: &[String],
    linear: &str,
    out: &mut String,
    mut vars: HashMap<Value, String>,
) -> CompileResult<HashMap<Value, String>> {
    for &v in inputs {
        let name = format!("v{}", v.index());
        let idx = index_in(&ctx.shape(v), domain, coords, linear);
        let _ = writeln!(out, "    const {} {name} = {}[{idx}];", ctype(ctx.dtype(v)), ctx.ptr(v)?);
        vars.insert(v, name);
    }
    for &v in nodes {
        let n = ctx.g.node(v);
        let opnd = |i: usize| -> CompileResult<String> {
            let o = n.inputs[i];
            vars.get(&o)
                .cloned()
                .ok_or_else(|| internal!("{v}: operand {o} is neither computed in its kernel nor read by it"))
        };
        let odt = |i: usize| ctx.dtype(n.inputs[i]);
        let as_f = |i: usize, s: String| if odt(i) == DType::I32 { format!("(float){s}") } else { s };
        let expr = match &n.op {
            Op::Scalar { value, batch_exp } => flit(value * (ctx.batch as f64).powi(*batch_exp)),
            Op::Unary(u) => {
                let x = opnd(0)?;
                use UnaryOp::*;
                match u {
                    Neg => format!("neg({x})"),
                    Conj => format!("cj({x})"),
                    Real => format!("re({x})"),
                    Imag => format!("im({x})"),
                    Abs => format!("absv({x})"),
                    Abs2 => format!("abs2({x})"),
                    Angle => format!("angle({x})"),
                    ToComplex => format!("cpx({x})"),
                    Exp => format!("expf({x})"),
                    Log => format!("logf({x})"),
                    Sqrt => format!("sqrtf({x})"),
                    Rsqrt => format!("(1.0f / sqrtf({x}))"),
                    Recip => format!("(1.0f / {x})"),
                    Sin => format!("sinf({x})"),
                    Cos => format!("cosf({x})"),
                    Tanh => format!("tanhf({x})"),
                    Sigmoid => format!("sigm({x})"),
                    Relu => format!("relu({x})"),
                    Step => format!("stepf({x})"),
                    Gelu => format!("gelu_erf({x})"),
                    GeluGrad => format!("gelu_erf_grad({x})"),
                    GeluTanh => format!("gelu({x})"),
                    GeluTanhGrad => format!("gelu_grad({x})"),
                    StopGrad => x,
                }
            }
            Op::Binary(b) => {
                let (a, c) = (opnd(0)?, opnd(1)?);
                use BinaryOp::*;
                match b {
                    Add => format!("add({a}, {c})"),
                    Sub => format!("sub({a}, {c})"),
                    Mul => format!("mul({a}, {c})"),
                    Div => format!("dvd({a}, {c})"),
                    Max => format!("maxf({a}, {c})"),
                    Complex => format!("make_float2({a}, {c})"),
                    Greater => format!("gtf({a}, {c})"),
                    Equal => format!("eqf({}, {})", as_f(0, a), as_f(1, c)),
                }
            }
            Op::Select => {
                let (c, a, b) = (opnd(0)?, opnd(1)?, opnd(2)?);
                if n.ty.dtype == DType::C64 {
                    format!("({c} > 0.0f ? cpx({a}) : cpx({b}))")
                } else {
                    format!("({c} > 0.0f ? {a} : {b})")
                }
            }
            Op::Assign => opnd(1)?,
            // Fusion keeps leaves, reductions, contractions and movement out of loops.
            other @ (Op::Input { .. }
            | Op::Param { .. }
            | Op::State { .. }
            | Op::Reduce { .. }
            | Op::Reshape
            | Op::Expand
            | Op::Permute { .. }
            | Op::Slice { .. }
            | Op::Pad { .. }
            | Op::Concat { .. }
            | Op::MatMul { .. }
            | Op::Conv2d { .. }
            | Op::ConvTranspose2d { .. }
            | Op::Conv2dWeightGrad { .. }
            | Op::Fft { .. }
            | Op::OneHot { .. }
            | Op::DropoutMask { .. }
            | Op::AttnLse { .. }
            | Op::Attention { .. }
            | Op::AttentionGrad { .. }
            | Op::Recurrence { .. }
            | Op::RecurrenceGrad { .. }
            | Op::Gather
            | Op::ScatterAdd { .. }) => {
                return Err(internal!(
                    "{v}: {} cannot be computed in an elementwise kernel",
                    other.mnemonic()
                ))
            }
        };
        let name = format!("v{}", v.index());
        let _ = writeln!(out, "    const {} {name} = {expr};", ctype(n.ty.dtype));
        vars.insert(v, name);
    }
    Ok(vars)
}

/// Coordinate variables `c0..` of a linear index `i` over `domain`.
fn emit_coords(domain: &[usize], linear: &str, out: &mut String) -> Vec<String> {
    let st = strides(domain);
    let mut names = Vec::new();
    for a in 0..domain.len() {
        let name = format!("c{a}");
        let e = if a == 0 {
            format!("{linear} / {}u", st[0])
        } else if st[a] == 1 {
            format!("{linear} % {}u", domain[a])
        } else {
            format!("({linear} / {}u) % {}u", st[a], domain[a])
        };
        let _ = writeln!(out, "    const ix {name} = {e};");
        names.push(name);
    }
    names
}

fn grid_stride_open(n: usize, out: &mut String) {
    let _ = writeln!(
        out,
        "  for (ix i = (ix)blockIdx.x * blockDim.x + threadIdx.x; i < {n}u; i += (ix)blockDim.x * gridDim.x) {{"
    );
}

/// The opening of a kernel with 256 threads per block: its signature and the `ix` typedef.
fn open_kernel(name: &str, index: &Indexing) -> String {
    format!("extern \"C\" __global__ void __launch_bounds__({BLOCK}) {name}(char* A) {{\n{}", index.typedef())
}

/// An elementwise group: one loop over the domain, storing every output.
pub(crate) fn elementwise(ctx: &Ctx, group: &KernelGroup, name: &str) -> CompileResult<Kernel> {
    let part = elementwise_loop(ctx, group, None)?;
    let mut code = open_kernel(name, &part.index);
    code.push_str(&part.code);
    code.push_str("}\n");
    Ok(Kernel::grid_stride(code, part.grid, part.index))
}

/// The grid-stride loop of an elementwise group, and the grid and index type it needs.
struct EwLoop {
    code: String,
    grid: u32,
    index: Indexing,
}

/// The blocks of a grid-stride loop over `items` items, one per thread: on a grid of its own
/// (`first` is `None`), as the target's `grid` cap allows; as a member of a batched kernel,
/// one pass (a member has at most [`BATCH_ELEMENTS`] elements), so the source does not
/// depend on that cap.
fn loop_grid(ctx: &Ctx, items: usize, first: Option<u32>) -> u32 {
    match first {
        None => ctx.grid_for(items, BLOCK as usize),
        Some(_) => items.div_ceil(BLOCK as usize).max(1) as u32,
    }
}

/// Where a grid-stride loop's blocks are: the whole grid (`None`), or `Some(first)`, its own
/// range of a batched kernel's grid from block `first` on (its stride is then its own grid).
fn loop_head(first: Option<u32>, grid: u32) -> (String, String) {
    match first {
        None => ("(ix)blockIdx.x".to_string(), "gridDim.x".to_string()),
        Some(f) => (format!("(ix)(blockIdx.x - {f}u)"), format!("{grid}u")),
    }
}

/// The loop of [`elementwise`] (or of [`elementwise_vector`] where a thread takes several
/// consecutive elements), over the blocks `first` names (see [`loop_head`]).
fn elementwise_loop(ctx: &Ctx, group: &KernelGroup, first: Option<u32>) -> CompileResult<EwLoop> {
    let domain = group.domain.resolve(ctx.batch);
    let n: usize = domain.iter().product();
    let width = vector_width(ctx, group, &domain)?;
    if width > 1 {
        return elementwise_vector(ctx, group, &domain, width, first);
    }
    let grid = loop_grid(ctx, n, first);
    let buffers: Vec<Value> = group.inputs.iter().chain(&group.outputs).copied().collect();
    let index = ctx.indexing(&buffers, &[n, grid as usize * BLOCK as usize]);
    let (block, stride) = loop_head(first, grid);
    let mut code = String::new();
    let _ = writeln!(
        code,
        "  for (ix i = {block} * blockDim.x + threadIdx.x; i < {n}u; i += (ix)blockDim.x * {stride}) {{"
    );
    let coords = emit_coords(&domain, "i", &mut code);
    let vars =
        emit_values(ctx, &group.nodes, &group.inputs, &domain, &coords, "i", &mut code, HashMap::new())?;
    for &o in &group.outputs {
        let var = vars.get(&o).ok_or_else(|| format!("{o}: output of a kernel that does not compute it"))?;
        let shape = ctx.shape(o);
        let idx = index_in(&shape, &domain, &coords, "i");
        let store = format!("{}[{idx}] = {var};", ctx.ptr(o)?);
        guarded_store(owner_guard(&shape, &domain, &coords), &store, &mut code);
    }
    code.push_str("  }\n");
    Ok(EwLoop { code, grid, index })
}

/// The most elements of an elementwise group that [`batches`] puts into a batched kernel:
/// launches of groups this small are dominated by the launch itself (per-channel statistics,
/// normalisation parameters and their updates, the optimizer's updates of small parameters).
pub(crate) const BATCH_ELEMENTS: usize = 1 << 18;

/// Whether `k` may be a member of a batched launch: an elementwise group or a data-movement
/// group other than `ScatterAdd` (which accumulates into memory zeroed before its launch), of
/// at most [`BATCH_ELEMENTS`] elements.
pub(crate) fn batchable(ctx: &Ctx, k: &KernelGroup) -> bool {
    let kind = match k.kind {
        GroupKind::Elementwise => true,
        GroupKind::Movement => {
            k.nodes.last().is_some_and(|&v| !matches!(ctx.g.node(v).op, Op::ScatterAdd { .. }))
        }
        _ => false,
    };
    kind && k.domain.resolve(ctx.batch).iter().product::<usize>() <= BATCH_ELEMENTS
}

/// Whether the elementwise or data-movement group `next` can join the run of small groups `run`
/// (consecutive in the schedule; views between them) in one batched launch
/// ([`elementwise_batch`]): the target's `ewbatch` allows one more, every group is small
/// ([`BATCH_ELEMENTS`]), and no group writes memory that another reads or writes. The blocks
/// of the members run in no particular order, so a later member may neither read an earlier
/// one's output (directly or through a view) nor overwrite a buffer an earlier one still
/// reads (the memory plan reuses buffers that died); each member alone may work in place.
pub(crate) fn batches(ctx: &Ctx, run: &[&KernelGroup], next: &KernelGroup) -> bool {
    let small = |k: &KernelGroup| batchable(ctx, k);
    if run.is_empty()
        || run.len() >= ctx.target.kernels.ew_batch
        || !small(next)
        || !run.iter().all(|k| small(k))
    {
        return false;
    }
    let range = |v: Value| ctx.offset(v).ok().map(|o| (o, o + ctx.bytes(v)));
    let overlap = |a: Option<(usize, usize)>, b: Option<(usize, usize)>| match (a, b) {
        (Some(a), Some(b)) => a.0 < b.1 && b.0 < a.1,
        _ => true,
    };
    // Every buffer a group reads: its inputs and the leaves its nodes touch without listing
    // them (an `Assign`'s target).
    let reads = |k: &KernelGroup| -> Vec<Option<(usize, usize)>> {
        let mut r: Vec<Option<(usize, usize)>> = k.inputs.iter().map(|&i| range(i)).collect();
        for &h in &k.nodes {
            let leaves = ctx.g.node(h).inputs.iter().filter(|&&i| ctx.g.node(i).op.is_leaf());
            // A leaf without a buffer (a constant) is no memory at all.
            r.extend(leaves.map(|&i| range(i)).filter(Option::is_some));
        }
        r
    };
    let writes =
        |k: &KernelGroup| -> Vec<Option<(usize, usize)>> { k.outputs.iter().map(|&o| range(o)).collect() };
    let (next_reads, next_writes) = (reads(next), writes(next));
    run.iter().all(|k| {
        let (r, w) = (reads(k), writes(k));
        next_writes.iter().all(|&a| r.iter().chain(&w).all(|&b| !overlap(a, b)))
            && next_reads.iter().all(|&a| w.iter().all(|&b| !overlap(a, b)))
    })
}

/// Small elementwise and data-movement groups in one launch (see [`batches`]): each member
/// keeps the loop it has alone, over its own range of the grid's blocks, and the index type is
/// the widest any member needs.
pub(crate) fn batch(ctx: &Ctx, run: &[&KernelGroup], name: &str) -> CompileResult<Kernel> {
    let mut first = 0u32;
    let mut parts = Vec::new();
    for k in run {
        let part = match k.kind {
            GroupKind::Movement => movement_loop(ctx, k, Some(first))?,
            _ => elementwise_loop(ctx, k, Some(first))?,
        };
        first += part.grid;
        parts.push((first, part));
    }
    let index = parts
        .iter()
        .map(|(_, p)| p.index)
        .max_by_key(|i| (i.width, i.largest))
        .ok_or_else(|| internal!("an empty batch of elementwise kernels"))?;
    let mut code = open_kernel(name, &index);
    for (i, (end, part)) in parts.iter().enumerate() {
        let _ = writeln!(code, "  {}if (blockIdx.x < {end}u) {{", if i == 0 { "" } else { "else " });
        code.push_str(&part.code);
        code.push_str("  }\n");
    }
    code.push_str("}\n");
    Ok(Kernel::grid_stride(code, first, index))
}

/// Points a reduction's thread folds per trip of its loop (a sum's f32 partial covers them).
const REDUCE_UNROLL: usize = 4;

/// Accumulator of a reduction: its scalar parts, and the code that folds values into it.
struct Acc {
    /// `(C type, suffix, initial value)` of each part.
    parts: Vec<(&'static str, &'static str, String)>,
}

impl Acc {
    fn of(op: ReduceOp, dt: DType) -> Acc {
        let p = |t, s, i: &str| (t, s, i.to_string());
        let parts = match (op, dt) {
            (ReduceOp::Sum, DType::C64) => vec![p("double", "x", "0.0"), p("double", "y", "0.0")],
            (ReduceOp::Sum, _) => vec![p("double", "x", "0.0")],
            (ReduceOp::Max, _) => vec![p("float", "x", "-INF")],
            (ReduceOp::MaxMag, DType::C64) => {
                vec![
                    p("float", "x", "0.0f"),
                    p("float", "y", "0.0f"),
                    p("float", "m", "-1.0f"),
                    p("ix", "i", "~(ix)0"),
                ]
            }
            (ReduceOp::MaxMag, _) => {
                vec![p("float", "x", "0.0f"), p("float", "m", "-1.0f"), p("ix", "i", "~(ix)0")]
            }
        };
        Acc { parts }
    }
    fn decl(&self, out: &mut String, base: &str) {
        for (t, s, i) in &self.parts {
            let _ = writeln!(out, "    {t} {base}{s} = {i};");
        }
    }
    /// Folds the element `x` (index `r`) into accumulator `a`.
    fn fold(op: ReduceOp, dt: DType, a: &str, x: &str, r: &str) -> String {
        match (op, dt) {
            (ReduceOp::Sum, DType::C64) => format!("{a}x += (double){x}.x; {a}y += (double){x}.y;"),
            (ReduceOp::Sum, _) => format!("{a}x += (double){x};"),
            (ReduceOp::Max, _) => format!("if ({x} > {a}x) {a}x = {x};"),
            (ReduceOp::MaxMag, DType::C64) => format!(
                "{{ float mm = abs2({x}); if (mm > {a}m) {{ {a}x = {x}.x; {a}y = {x}.y; {a}m = mm; {a}i = {r}; }} }}"
            ),
            (ReduceOp::MaxMag, _) => format!("{{ float mm = fabsf({x}); if (mm > {a}m) {{ {a}x = {x}; {a}m = mm; {a}i = {r}; }} }}"),
        }
    }
    /// Declarations of the f32 partial `p` that a sum adds [`REDUCE_UNROLL`] points into before
    /// they reach its f64 accumulator (nothing for the other reductions, which fold in f32).
    fn partial_decl(op: ReduceOp, dt: DType, p: &str) -> String {
        match (op, dt) {
            (ReduceOp::Sum, DType::C64) => format!("    float {p}x = 0.0f, {p}y = 0.0f;\n"),
            (ReduceOp::Sum, _) => format!("    float {p}x = 0.0f;\n"),
            _ => String::new(),
        }
    }
    /// Folds `x` into the f32 partial `p` of a sum; `None` for reductions without one.
    fn partial_fold(op: ReduceOp, dt: DType, p: &str, x: &str) -> Option<String> {
        match (op, dt) {
            (ReduceOp::Sum, DType::C64) => Some(format!("{p}x += {x}.x; {p}y += {x}.y;")),
            (ReduceOp::Sum, _) => Some(format!("{p}x += {x};")),
            _ => None,
        }
    }
    /// Adds the f32 partial `p` to the accumulator `a`.
    fn partial_flush(op: ReduceOp, dt: DType, a: &str, p: &str) -> String {
        match (op, dt) {
            (ReduceOp::Sum, DType::C64) => format!("    {a}x += (double){p}x; {a}y += (double){p}y;\n"),
            (ReduceOp::Sum, _) => format!("    {a}x += (double){p}x;\n"),
            _ => String::new(),
        }
    }
    /// Merges accumulator `b` into `a` (keeping the first of equal candidates).
    fn merge(op: ReduceOp, dt: DType, a: &str, b: &str) -> String {
        match (op, dt) {
            (ReduceOp::Sum, DType::C64) => format!("{a}x += {b}x; {a}y += {b}y;"),
            (ReduceOp::Sum, _) => format!("{a}x += {b}x;"),
            (ReduceOp::Max, _) => format!("if ({b}x > {a}x) {a}x = {b}x;"),
            (ReduceOp::MaxMag, DType::C64) => format!(
                "if ({b}m > {a}m || ({b}m == {a}m && {b}i < {a}i)) {{ {a}x = {b}x; {a}y = {b}y; {a}m = {b}m; {a}i = {b}i; }}"
            ),
            (ReduceOp::MaxMag, _) => {
                format!("if ({b}m > {a}m || ({b}m == {a}m && {b}i < {a}i)) {{ {a}x = {b}x; {a}m = {b}m; {a}i = {b}i; }}")
            }
        }
    }
    fn result(op: ReduceOp, dt: DType, a: &str) -> String {
        match (op, dt) {
            (ReduceOp::Sum, DType::C64) => format!("make_float2((float){a}x, (float){a}y)"),
            (ReduceOp::Sum, _) => format!("(float){a}x"),
            (ReduceOp::Max, _) => format!("{a}x"),
            (ReduceOp::MaxMag, DType::C64) => format!("make_float2({a}x, {a}y)"),
            (ReduceOp::MaxMag, _) => format!("{a}x"),
        }
    }
}

/// Whether `next` can join the reductions `run` (already one kernel) in a single pass: all are
/// sums over the same domain and axes, `next` reads nothing the run writes, and no output
/// shares memory with any input or other output (the memory plan may reuse a buffer that dies
/// at one member for a later member's output; then they stay separate kernels).
pub(crate) fn joins(ctx: &Ctx, run: &[&KernelGroup], next: &KernelGroup) -> bool {
    let key = |k: &KernelGroup| match k.reduce_parts(ctx.g).map(|(_, red, _)| &ctx.g.node(red).op) {
        Some(Op::Reduce { op: ReduceOp::Sum, axes }) => Some((k.domain.resolve(ctx.batch), axes.clone())),
        _ => None,
    };
    let Some(first) = run.first() else { return false };
    if key(next).is_none() || key(next) != key(first) {
        return false;
    }
    let range = |v: Value| ctx.offset(v).ok().map(|o| (o, o + ctx.bytes(v)));
    let mut outs = Vec::new();
    let mut ins = Vec::new();
    for k in run.iter().copied().chain([next]) {
        for &o in &k.outputs {
            outs.push((o, range(o)));
        }
        for &i in &k.inputs {
            ins.push((i, range(i)));
        }
    }
    if next.inputs.iter().any(|i| run.iter().any(|k| k.outputs.contains(i))) {
        return false;
    }
    let overlap = |a: Option<(usize, usize)>, b: Option<(usize, usize)>| match (a, b) {
        (Some(a), Some(b)) => a.0 < b.1 && b.0 < a.1,
        _ => true,
    };
    outs.iter().enumerate().all(|(i, &(_, r))| {
        ins.iter().all(|&(_, q)| !overlap(r, q)) && outs[i + 1..].iter().all(|&(_, q)| !overlap(r, q))
    })
}

/// Reduction groups over one domain: each an elementwise prologue folded into its `Reduce`
/// node (last in `nodes`). Several groups (see [`joins`]) share one pass over the domain:
/// every input is loaded once per point and each sum keeps its own accumulator.
/// One thread, one warp or one block (optionally several, for sums) per output element.
///
/// When the reduced range is split over blocks, each block stores its f64 partial sums in
/// scratch memory at byte offset `scratch` (past the plan's arena), and the last block of each
/// output to finish (an atomic counter per output) adds them in split order and stores the
/// result: the sum stays in f64 until its one final rounding and does not depend on the order
/// the blocks ran in. (Rounding each partial to f32 first costs near-cancelling sums, such as a
/// batchnorm's `Σ dy`, most of their digits. The f32 partials of [`REDUCE_UNROLL`] points
/// that each thread adds first round at most three times per four points, wherever the sum
/// stands: their errors do not grow with the reduced range.)
pub(crate) fn reduce(
    ctx: &Ctx,
    groups: &[&KernelGroup],
    name: &str,
    scratch: usize,
) -> CompileResult<Kernel> {
    let group = *groups.first().ok_or_else(|| internal!("no reduction group"))?;
    let mut reds = Vec::new();
    let mut prologue: Vec<Value> = Vec::new();
    // The operands the prologues read over the domain; each epilogue's own, read once per
    // output element.
    let mut inputs: Vec<Value> = Vec::new();
    let mut epilogues: Vec<(&[Value], Vec<Value>, &[Value])> = Vec::new();
    for k in groups {
        let (pro, red, epi) =
            k.reduce_parts(ctx.g).ok_or_else(|| internal!("a reduction group without a reduction"))?;
        let rn = ctx.g.node(red);
        let (op, axes) = match &rn.op {
            Op::Reduce { op, axes } => (*op, axes.clone()),
            other => return Err(internal!("{red}: a reduction group reduces by {}", other.mnemonic())),
        };
        reds.push((red, rn.inputs[0], op, axes, rn.ty.dtype));
        for &v in pro {
            if !prologue.contains(&v) {
                prologue.push(v);
            }
        }
        let read_by = |part: &[Value], v: Value| part.iter().any(|&n| ctx.g.node(n).inputs.contains(&v));
        for &v in &k.inputs {
            if (read_by(pro, v) || rn.inputs[0] == v) && !inputs.contains(&v) {
                inputs.push(v);
            }
        }
        let epi_in: Vec<Value> = k.inputs.iter().copied().filter(|&v| read_by(epi, v)).collect();
        epilogues.push((epi, epi_in, &k.outputs[..]));
    }
    let (op, axes) = (reds[0].2, reds[0].3.clone());
    let red = reds[0].0;
    let domain = group.domain.resolve(ctx.batch);
    let dn: usize = domain.iter().product();
    let out_shape = ctx.shape(red);
    let o_n: usize = out_shape.iter().product();
    let r_n: usize = axes.iter().map(|&a| domain[a]).product();
    // Lanes per output and splits of the reduced range over blocks: enough blocks for eight
    // per SM (the device's `fill_blocks`), so the loads of many blocks are in flight at once.
    let fill = ctx.target.device.fill_blocks();
    // A block of 256 threads serves `per_block` outputs: one, or `colout` consecutive
    // ones where the domain's innermost axis is kept (a `[B, T, D]` gradient summed over B and
    // T into D features), so that the block's threads read consecutive addresses; with one
    // output per block its 256 lanes read one element every D.
    let column = !axes.contains(&(domain.len() - 1)) && domain.last().is_some_and(|&d| d > 1);
    let (lanes, splits, per_block) = if r_n <= 32 {
        (1usize, 1usize, 1usize)
    } else if r_n <= 4096 || o_n >= 2048 {
        (32, 1, 1)
    } else {
        let per_block = if column { ctx.target.kernels.column_outputs } else { 1 };
        // At least 4096 points per split and lane group (1024 in columns: 32 lanes an output).
        let least = if column { 1024 } else { 4096 };
        let s = if op == ReduceOp::Sum && o_n.div_ceil(per_block) < fill {
            fill.div_ceil(o_n.div_ceil(per_block))
                .min(r_n.div_ceil(least))
                .min(ctx.target.device.max_grid[1])
                .max(1)
        } else {
            1
        };
        (BLOCK as usize / per_block, s, per_block)
    };
    // Consecutive points of the innermost (reduced) axis a lane takes at once, as one vector
    // per operand along that axis (`ewvec`); the splits start at multiples of it.
    let width =
        if axes.contains(&(domain.len() - 1)) { vector_width_of(ctx, &inputs, &[], &domain)? } else { 1 };
    let chunk = r_n.div_ceil(splits).next_multiple_of(width);
    let accs: Vec<Acc> = reds.iter().map(|r| Acc::of(r.2, r.4)).collect();
    let dstr = strides(&domain);
    let ostr = strides(&out_shape);
    let kept: Vec<usize> = (0..domain.len()).filter(|a| !axes.contains(a)).collect();
    // Strides of the reduced index over the reduced axes.
    let mut rstr = vec![0usize; domain.len()];
    let mut s = 1;
    for &a in axes.iter().rev() {
        rstr[a] = s;
        s *= domain[a];
    }
    // Whether a block's 256 threads serve `per_block` outputs, merging through shared memory.
    let blockwide = lanes * per_block == BLOCK as usize;
    let grid_x = if blockwide {
        ctx.grid_for(o_n.div_ceil(per_block), 1)
    } else {
        ctx.grid_for(o_n * lanes, BLOCK as usize)
    };
    let parts: usize = accs.iter().map(|a| a.parts.len()).sum();
    let mut buffers: Vec<Value> = inputs.clone();
    for (_, epi_in, outs) in &epilogues {
        buffers.extend(epi_in.iter().chain(outs.iter()).copied());
    }
    // Besides the buffers: the domain, the threads of the grid-stride loop over outputs, the
    // split reduced range and the partial sums in scratch memory.
    let index =
        ctx.indexing(&buffers, &[dn, grid_x as usize * BLOCK as usize, splits * chunk, splits * o_n * parts]);
    let mut code = open_kernel(name, &index);
    if blockwide {
        // Thread `slot` of each group of `per_block` serves output `ob + slot`; `lane` numbers the
        // threads of one output. The loop over output groups has the same trips in every thread
        // of the block (its barriers need them all).
        let _ = writeln!(
            code,
            "  const u32 slot = threadIdx.x % {per_block}u, lane = threadIdx.x / {per_block}u;"
        );
        for (j, acc) in accs.iter().enumerate() {
            for (t, s, _) in &acc.parts {
                let _ = writeln!(code, "  __shared__ {t} sh{j}{s}[{}];", BLOCK as usize / 32 * per_block);
            }
        }
        let _ = writeln!(
            code,
            "  for (ix ob = (ix)blockIdx.x * {per_block}u; ob < {o_n}u; ob += (ix)gridDim.x * {per_block}u) {{\n    const ix o = ob + slot;"
        );
    } else {
        let _ = writeln!(code, "  const u32 lane = threadIdx.x % {lanes}u;");
        let _ = writeln!(code, "  const ix first = ((ix)blockIdx.x * blockDim.x + threadIdx.x) / {lanes}u;");
        let _ = writeln!(code, "  const ix stride = ((ix)gridDim.x * blockDim.x) / {lanes}u;");
        let _ = writeln!(code, "  for (ix o = first; o < {o_n}u; o += stride) {{");
    }
    for (j, acc) in accs.iter().enumerate() {
        acc.decl(&mut code, &format!("a{j}"));
    }
    let _ = writeln!(
        code,
        "    const ix rb = {};",
        if splits > 1 { format!("(ix)blockIdx.y * {chunk}u") } else { "0u".into() }
    );
    let _ = writeln!(
        code,
        "    const ix re_ = {}min(rb + (ix){chunk}u, (ix){r_n}u);",
        if per_block > 1 { format!("o >= {o_n}u ? rb : ") } else { String::new() }
    );
    // Operands that do not vary along the reduced axes (a batchnorm's per-channel statistics
    // and affine weights) and what is computed from them alone are read once per output, before
    // the loop: the seed network's batchnorm backward read eight per-channel values beside each
    // activation. Past the last output of a group (`per_block` > 1, where the loop has no
    // trips) they are read at the last output, in bounds.
    let outer_in: Vec<Value> = inputs
        .iter()
        .copied()
        .filter(|&v| {
            let sh = ctx.shape(v);
            let (r, d) = (sh.len(), domain.len());
            sh != domain && axes.iter().all(|&a| a + r < d || sh[a + r - d] == 1)
        })
        .collect();
    let mut outer_nodes: Vec<Value> = Vec::new();
    for &v in &prologue {
        let n = ctx.g.node(v);
        if n.inputs.iter().all(|i| outer_in.contains(i) || outer_nodes.contains(i)) {
            outer_nodes.push(v);
        }
    }
    let mut hoisted = HashMap::new();
    if !outer_in.is_empty() || !outer_nodes.is_empty() {
        let oh = if per_block > 1 {
            let _ = writeln!(code, "    const ix oh = min(o, (ix){}u);", o_n - 1);
            "oh"
        } else {
            "o"
        };
        let mut hc = Vec::new();
        for a in 0..domain.len() {
            if kept.contains(&a) && domain[a] > 1 {
                let _ = writeln!(code, "    const ix h{a} = ({oh} / {}u) % {}u;", ostr[a], domain[a]);
                hc.push(format!("h{a}"));
            } else {
                hc.push("0u".to_string());
            }
        }
        hoisted = emit_values(ctx, &outer_nodes, &outer_in, &domain, &hc, "0u", &mut code, HashMap::new())?;
    }
    let inner_in: Vec<Value> = inputs.iter().copied().filter(|v| !outer_in.contains(v)).collect();
    let inner_nodes: Vec<Value> = prologue.iter().copied().filter(|v| !outer_nodes.contains(v)).collect();
    // Four points per trip, unrolled so that their loads are in flight at once (no stores
    // inside). Sums add the four in f32 and then the f32 partial to the f64 accumulator: one
    // conversion to f64 per four points instead of one per point (conversions to f64 run at a
    // sixteenth of the FP32 rate on sm_90; the seed network's batchnorm backward folds eight
    // sums per point), at a cost of at most three f32 roundings per four points.
    // The trips whose points all lie in range run without a test per point; the rest, at most
    // one trip, tests each (the seed network's batchnorm sums spent 5 of their 56 instructions
    // a point on the test and its branch, offline SASS).
    let mut body = String::new();
    let mut coords = Vec::new();
    for a in 0..domain.len() {
        let e = if kept.contains(&a) {
            format!("(o / {}u) % {}u", ostr[a], domain[a])
        } else {
            format!("(r / {}u) % {}u", rstr[a], domain[a])
        };
        let _ = writeln!(body, "    const ix c{a} = {e};");
        coords.push(format!("c{a}"));
    }
    // The linear index from runs of adjacent axes that are all kept or all reduced: one
    // division and one remainder per run instead of per axis.
    let mut lin: Vec<String> = Vec::new();
    let mut a = 0;
    while a < domain.len() {
        let reduced = axes.contains(&a);
        let mut b = a;
        while b + 1 < domain.len() && axes.contains(&(b + 1)) == reduced {
            b += 1;
        }
        let size: usize = domain[a..=b].iter().product();
        if size > 1 {
            let (idx, st) = if reduced { ("r", rstr[b]) } else { ("o", ostr[b]) };
            lin.push(format!("(({idx} / {st}u) % {size}u) * {}u", dstr[b]));
        }
        a = b + 1;
    }
    let linear = if lin.is_empty() { "0u".to_string() } else { lin.join(" + ") };
    let _ = writeln!(body, "    const ix li = {linear};");
    let fold = |vars: &HashMap<Value, String>, r: &str, body: &mut String| -> CompileResult<()> {
        for (j, &(red, x, op, _, dt)) in reds.iter().enumerate() {
            let xv = vars
                .get(&x)
                .ok_or_else(|| format!("{red}: its operand {x} is not available in the kernel"))?;
            let fold = match Acc::partial_fold(op, dt, &format!("p{j}"), xv) {
                Some(f) => f,
                None => Acc::fold(op, dt, &format!("a{j}"), xv, r),
            };
            let _ = writeln!(body, "    {fold}");
        }
        Ok(())
    };
    if width == 1 {
        let vars = emit_values(ctx, &inner_nodes, &inner_in, &domain, &coords, "li", &mut body, hoisted)?;
        fold(&vars, "r", &mut body)?;
    } else {
        // `width` consecutive points from `r` on: the operands along the innermost axis as one
        // vector each, the others (constant along it) once; then point by point.
        let last = domain.len() - 1;
        emit_vector_loads(ctx, &inner_in, &domain, &coords, "li", width, &mut body)?;
        for k in 0..width {
            let vars = open_vector_point(ctx, &inner_in, &domain, k, &mut body, hoisted.clone());
            let mut cs = coords.clone();
            cs[last] = format!("({} + {k}u)", coords[last]);
            let vars =
                emit_values(ctx, &inner_nodes, &[], &domain, &cs, &format!("(li + {k}u)"), &mut body, vars)?;
            fold(&vars, &format!("(r + {k}u)"), &mut body)?;
            body.push_str("    }\n");
        }
    }
    let trip = |code: &mut String, tested: bool| {
        for (j, &(_, _, op, _, dt)) in reds.iter().enumerate() {
            let _ = write!(code, "{}", Acc::partial_decl(op, dt, &format!("p{j}")));
        }
        let _ = writeln!(
            code,
            "    #pragma unroll\n    for (u32 u = 0; u < {REDUCE_UNROLL}u; ++u) {{\n    const ix r = r4 + u * {}u;\n    {}{{",
            lanes * width,
            if tested { "if (r < re_) " } else { "" }
        );
        code.push_str(&body);
        code.push_str("    }\n    }\n");
        for (j, &(_, _, op, _, dt)) in reds.iter().enumerate() {
            let _ = write!(code, "{}", Acc::partial_flush(op, dt, &format!("a{j}"), &format!("p{j}")));
        }
    };
    let _ = writeln!(
        code,
        "    ix r4 = rb + lane{};\n    for (; r4 + {}u < re_; r4 += {}u) {{",
        if width > 1 { format!(" * {width}u") } else { String::new() },
        (REDUCE_UNROLL - 1) * lanes * width,
        REDUCE_UNROLL * lanes * width
    );
    trip(&mut code, false);
    code.push_str("    }\n    if (r4 < re_) {\n");
    trip(&mut code, true);
    code.push_str("    }\n");
    if lanes >= 32 || (blockwide && per_block < 32) {
        // Warp tree: the first `per_block` threads of each warp end with the warp's
        // accumulators (of outputs `ob + slot`; with 32 outputs a block, each thread of a warp
        // serves its own and there is nothing to fold).
        let _ = writeln!(code, "    for (int off = 16; off >= {per_block}; off >>= 1) {{");
        for (j, (acc, r)) in accs.iter().zip(&reds).enumerate() {
            for (t, s, _) in &acc.parts {
                let _ = writeln!(code, "      {t} b{j}{s} = __shfl_down_sync(0xffffffffu, a{j}{s}, off);");
            }
            let _ = writeln!(code, "      {}", Acc::merge(r.2, r.4, &format!("a{j}"), &format!("b{j}")));
        }
        code.push_str("    }\n");
    }
    if blockwide {
        let _ = writeln!(code, "    if ((threadIdx.x & 31u) < {per_block}u) {{");
        for (j, acc) in accs.iter().enumerate() {
            for (_, s, _) in &acc.parts {
                let _ = writeln!(code, "      sh{j}{s}[(threadIdx.x >> 5) * {per_block}u + slot] = a{j}{s};");
            }
        }
        code.push_str("    }\n    __syncthreads();\n    if (lane == 0u) {\n");
        let _ = writeln!(code, "      for (u32 w = 1; w < {}u; ++w) {{", BLOCK / 32);
        for (j, (acc, r)) in accs.iter().zip(&reds).enumerate() {
            for (t, s, _) in &acc.parts {
                let _ = writeln!(code, "        {t} b{j}{s} = sh{j}{s}[w * {per_block}u + slot];");
            }
            let _ = writeln!(code, "        {}", Acc::merge(r.2, r.4, &format!("a{j}"), &format!("b{j}")));
        }
        code.push_str("      }\n    }\n    __syncthreads();\n");
    }
    // The thread that stores an output (past the last output in a group of `per_block`: none).
    let lead = if per_block > 1 { format!("lane == 0u && o < {o_n}u") } else { "lane == 0u".to_string() };
    let mut scratch_bytes = 0;
    if splits > 1 {
        // Partials: double [splits][o_n][parts]; then one u32 counter per output, which the
        // last block puts back to 0 for the next step (the runtime zeroes scratch once).
        let counters = scratch + splits * o_n * parts * 8;
        scratch_bytes = counters + 4 * o_n - scratch;
        let _ = writeln!(code, "    if ({lead}) {{");
        let _ = writeln!(
            code,
            "      double* part = (double*)(A + {scratch}ull) + ((ix)blockIdx.y * {o_n}u + o) * {parts}u;"
        );
        let mut k = 0;
        for (j, acc) in accs.iter().enumerate() {
            for (_, s, _) in &acc.parts {
                let _ = writeln!(code, "      part[{k}] = a{j}{s};");
                k += 1;
            }
        }
        code.push_str("      __threadfence();\n");
        let _ = writeln!(code, "      u32* count = (u32*)(A + {counters}ull) + o;");
        let _ = writeln!(code, "      if (atomicAdd(count, 1u) == {}u) {{", splits - 1);
        code.push_str("        __threadfence();\n");
        for (j, acc) in accs.iter().enumerate() {
            for (_, s, _) in &acc.parts {
                let _ = writeln!(code, "        a{j}{s} = 0.0;");
            }
        }
        let _ = writeln!(code, "        for (u32 s = 0; s < {splits}u; ++s) {{");
        let _ = writeln!(
            code,
            "          volatile double* q = (volatile double*)(A + {scratch}ull) + ((ix)s * {o_n}u + o) * {parts}u;"
        );
        let mut k = 0;
        for (j, acc) in accs.iter().enumerate() {
            for (_, s, _) in &acc.parts {
                let _ = writeln!(code, "          a{j}{s} += q[{k}];");
                k += 1;
            }
        }
        code.push_str("        }\n");
        for (j, &(red, _, op, _, dt)) in reds.iter().enumerate() {
            let res = Acc::result(op, dt, &format!("a{j}"));
            code.push_str(&store_result(ctx, red, &res, &epilogues[j], &out_shape)?);
        }
        code.push_str("        *count = 0u;\n      }\n    }\n");
    } else {
        for (j, &(red, _, op, _, dt)) in reds.iter().enumerate() {
            let res = Acc::result(op, dt, &format!("a{j}"));
            let _ = writeln!(code, "    if ({lead}) {{");
            code.push_str(&store_result(ctx, red, &res, &epilogues[j], &out_shape)?);
            code.push_str("    }\n");
        }
    }
    code.push_str("  }\n}\n");
    Ok(Kernel {
        code,
        grid: [grid_x, splits as u32, 1],
        block: [BLOCK, 1, 1],
        zero: Vec::new(),
        scratch: scratch_bytes,
        pre: None,
        post: None,
        shared: 0,
        index,
    })
}

/// Stores reduction `red`'s result `res` (an expression) at output element `o`: as it is, or,
/// where its group has an epilogue (`fusion::merge_epilogues`), through the epilogue's nodes,
/// whose operands are read at that element and whose outputs are stored there; the sum itself
/// is then not stored. Its own scope, so its names may shadow the kernel's.
fn store_result(
    ctx: &Ctx,
    red: Value,
    res: &str,
    (epi, epi_in, outs): &(&[Value], Vec<Value>, &[Value]),
    out_shape: &[usize],
) -> CompileResult<String> {
    let mut code = String::from("    {\n");
    if epi.is_empty() {
        let _ = writeln!(code, "    {}[o] = {res};", ctx.ptr(red)?);
    } else {
        let ostr = strides(out_shape);
        let coords: Vec<String> = (0..out_shape.len())
            .map(|a| {
                if out_shape[a] > 1 {
                    format!("((o / {}u) % {}u)", ostr[a], out_shape[a])
                } else {
                    "0u".into()
                }
            })
            .collect();
        let name = format!("v{}", red.index());
        let _ = writeln!(code, "    const {} {name} = {res};", ctype(ctx.dtype(red)));
        let vars = HashMap::from([(red, name)]);
        let vars = emit_values(ctx, epi, epi_in, out_shape, &coords, "o", &mut code, vars)?;
        for &out in outs.iter() {
            let v = vars.get(&out).ok_or_else(|| internal!("{out}: an epilogue's output is not computed"))?;
            let idx = index_in(&ctx.shape(out), out_shape, &coords, "o");
            let _ = writeln!(code, "    {}[{idx}] = {v};", ctx.ptr(out)?);
        }
    }
    code.push_str("    }\n");
    Ok(code)
}

/// Whether operand `v` of an elementwise group over `domain` runs along the domain's
/// innermost axis (its index then moves by one with that coordinate; otherwise the index does
/// not depend on it).
fn runs_along(ctx: &Ctx, v: Value, domain: &[usize]) -> bool {
    let last = domain.last().copied().unwrap_or(1);
    last > 1 && ctx.shape(v).last() == Some(&last)
}

/// The loads of `inputs` at the first of `width` consecutive points (coordinates `coords`,
/// linear index `linear`): one vector `w<N>` per operand along the innermost axis, one value
/// `v<N>` per operand constant along it.
fn emit_vector_loads(
    ctx: &Ctx,
    inputs: &[Value],
    domain: &[usize],
    coords: &[String],
    linear: &str,
    width: usize,
    out: &mut String,
) -> CompileResult<()> {
    for &v in inputs {
        let idx = index_in(&ctx.shape(v), domain, coords, linear);
        let (n, ptr) = (v.index(), ctx.ptr(v)?);
        if runs_along(ctx, v, domain) {
            let stored = stored_ctype(ctx.storage(v), ctx.dtype(v));
            let _ = writeln!(out, "    const vec<{width}, {stored}> w{n} = vld<{width}>({ptr} + {idx});");
        } else {
            let _ = writeln!(out, "    const {} v{n} = {ptr}[{idx}];", ctype(ctx.dtype(v)));
        }
    }
    Ok(())
}

/// Opens the scope of point `u` of a vector: names each of `inputs` there (`v<N>`, element `u`
/// of its vector where it has one) and returns `vars` with them.
fn open_vector_point(
    ctx: &Ctx,
    inputs: &[Value],
    domain: &[usize],
    u: usize,
    out: &mut String,
    mut vars: HashMap<Value, String>,
) -> HashMap<Value, String> {
    out.push_str("    {\n");
    for &v in inputs {
        let var = format!("v{}", v.index());
        if runs_along(ctx, v, domain) {
            let _ = writeln!(out, "    const {} {var} = w{}.e[{u}];", ctype(ctx.dtype(v)), v.index());
        }
        vars.insert(v, var);
    }
    vars
}

/// A store, under the owner guard `guard` where there is one.
fn guarded_store(guard: Option<String>, store: &str, out: &mut String) {
    match guard {
        Some(c) => {
            let _ = writeln!(out, "    if ({c}) {store}");
        }
        None => {
            let _ = writeln!(out, "    {store}");
        }
    }
}

/// Consecutive elements per thread of an elementwise group ([`KernelConfig::ew_vector`]
/// (crate::target::KernelConfig) at most): the largest of 4 and 2 that divides the domain's
/// innermost extent and keeps every vector of an operand along that axis within 16 bytes and
/// aligned; 1 where none does.
fn vector_width(ctx: &Ctx, group: &KernelGroup, domain: &[usize]) -> CompileResult<usize> {
    vector_width_of(ctx, &group.inputs, &group.outputs, domain)
}

/// [`vector_width`] of the buffers `inputs` and `outputs`.
fn vector_width_of(ctx: &Ctx, inputs: &[Value], outputs: &[Value], domain: &[usize]) -> CompileResult<usize> {
    let Some(&last) = domain.last() else { return Ok(1) };
    let mut widest = 0;
    let mut offsets = Vec::new();
    for &v in inputs.iter().chain(outputs) {
        if runs_along(ctx, v, domain) {
            widest = widest.max(ctx.storage(v).elem_bytes(ctx.dtype(v)));
            offsets.push(ctx.offset(v)?);
        }
    }
    Ok([4, 2]
        .into_iter()
        .find(|&u| {
            u <= ctx.target.kernels.ew_vector
                && last % u == 0
                && u * widest <= 16
                && offsets.iter().all(|o| o % (u * widest).max(1) == 0)
        })
        .unwrap_or(1))
}

/// An elementwise group with `width` consecutive elements per thread and pass: the operands
/// along the innermost axis read as one vector each and the others once, every element
/// computed, then the outputs stored (vectors where they run along that axis). With every
/// load of a pass ahead of its first store, a thread has all of them in flight at once.
fn elementwise_vector(
    ctx: &Ctx,
    group: &KernelGroup,
    domain: &[usize],
    width: usize,
    first: Option<u32>,
) -> CompileResult<EwLoop> {
    let n: usize = domain.iter().product();
    let passes = n / width;
    let grid = loop_grid(ctx, passes, first);
    let buffers: Vec<Value> = group.inputs.iter().chain(&group.outputs).copied().collect();
    let index = ctx.indexing(&buffers, &[n, grid as usize * BLOCK as usize * width]);
    let (block, stride) = loop_head(first, grid);
    let mut code = String::new();
    let _ = writeln!(
        code,
        "  for (ix j = {block} * blockDim.x + threadIdx.x; j < {passes}u; j += (ix)blockDim.x * {stride}) {{\n    const ix i = j * {width}u;"
    );
    let coords = emit_coords(domain, "i", &mut code);
    let last = coords.len() - 1;
    let stored = |v: Value| stored_ctype(ctx.storage(v), ctx.dtype(v));
    emit_vector_loads(ctx, &group.inputs, domain, &coords, "i", width, &mut code)?;
    for &o in &group.outputs {
        if runs_along(ctx, o, domain) {
            let _ = writeln!(code, "    vec<{width}, {}> w{};", stored(o), o.index());
        } else {
            let _ = writeln!(code, "    {} r{}[{width}];", ctype(ctx.dtype(o)), o.index());
        }
    }
    // The coordinates and linear index of element `u` of the pass.
    let at = |u: usize| {
        let mut cs = coords.clone();
        cs[last] = format!("({} + {u}u)", coords[last]);
        (cs, format!("(i + {u}u)"))
    };
    for u in 0..width {
        let (cs, linear) = at(u);
        let vars = open_vector_point(ctx, &group.inputs, domain, u, &mut code, HashMap::new());
        let vars = emit_values(ctx, &group.nodes, &[], domain, &cs, &linear, &mut code, vars)?;
        for &o in &group.outputs {
            let var =
                vars.get(&o).ok_or_else(|| format!("{o}: output of a kernel that does not compute it"))?;
            let slot = if runs_along(ctx, o, domain) { 'w' } else { 'r' };
            let _ = writeln!(
                code,
                "    {slot}{}{}[{u}] = {var};",
                o.index(),
                if slot == 'w' { ".e" } else { "" }
            );
        }
        code.push_str("    }\n");
    }
    for &o in &group.outputs {
        let shape = ctx.shape(o);
        if runs_along(ctx, o, domain) {
            // The owner guard of an output along the innermost axis does not name that axis.
            let store = format!(
                "vst<{width}>({} + {}, w{});",
                ctx.ptr(o)?,
                index_in(&shape, domain, &coords, "i"),
                o.index()
            );
            guarded_store(owner_guard(&shape, domain, &coords), &store, &mut code);
        } else {
            for u in 0..width {
                let (cs, linear) = at(u);
                let store = format!(
                    "{}[{}] = r{}[{u}];",
                    ctx.ptr(o)?,
                    index_in(&shape, domain, &cs, &linear),
                    o.index()
                );
                guarded_store(owner_guard(&shape, domain, &cs), &store, &mut code);
            }
        }
    }
    code.push_str("  }\n");
    Ok(EwLoop { code, grid, index })
}

/// A data-movement or special node: one thread per output element.
pub(crate) fn movement(ctx: &Ctx, group: &KernelGroup, name: &str) -> CompileResult<Kernel> {
    let v = *group.nodes.last().ok_or_else(|| internal!("empty movement group"))?;
    if let Op::ScatterAdd { rows } = ctx.g.node(v).op {
        return scatter_add(ctx, v, rows, name);
    }
    let part = movement_loop(ctx, group, None)?;
    let mut code = open_kernel(name, &part.index);
    code.push_str(&part.code);
    code.push_str("}\n");
    Ok(Kernel::grid_stride(code, part.grid, part.index))
}

/// The loop of [`movement`] over the blocks `first` names (see [`loop_head`]); not for
/// `ScatterAdd`, whose output is zeroed first.
fn movement_loop(ctx: &Ctx, group: &KernelGroup, first: Option<u32>) -> CompileResult<EwLoop> {
    let v = *group.nodes.last().ok_or_else(|| internal!("empty movement group"))?;
    let n = ctx.g.node(v);
    let oshape = ctx.shape(v);
    let on: usize = oshape.iter().product();
    let odt = n.ty.dtype;
    let out = ctx.ptr(v)?;
    let grid = loop_grid(ctx, on, first);
    let buffers: Vec<Value> = n.inputs.iter().copied().chain([v]).collect();
    let index = ctx.indexing(&buffers, &[on, grid as usize * BLOCK as usize]);
    let mut code = String::new();
    if let Op::DropoutMask { .. } = n.op {
        let _ = writeln!(code, "  const u32 step = (u32)(*{});", ctx.ptr(n.inputs[0])?);
    }
    let (block, stride) = loop_head(first, grid);
    let _ = writeln!(
        code,
        "  for (ix i = {block} * blockDim.x + threadIdx.x; i < {on}u; i += (ix)blockDim.x * {stride}) {{"
    );
    let coords = emit_coords(&oshape, "i", &mut code);
    let promote = |x: String, from: DType| {
        if odt == DType::C64 && from != DType::C64 {
            format!("cpx({x})")
        } else {
            x
        }
    };
    let linear_of = |shape: &[usize], cs: &[String]| -> String {
        let st = strides(shape);
        let t: Vec<String> = cs.iter().zip(&st).map(|(c, s)| format!("{c} * {s}u")).collect();
        if t.is_empty() {
            "0u".into()
        } else {
            t.join(" + ")
        }
    };
    let body = match &n.op {
        Op::Expand => {
            let x = n.inputs[0];
            let idx = index_in(&ctx.shape(x), &oshape, &coords, "i");
            format!("{out}[i] = {}[{idx}];", ctx.ptr(x)?)
        }
        Op::Permute { perm } => {
            let x = n.inputs[0];
            let ish = ctx.shape(x);
            let ist = strides(&ish);
            let t: Vec<String> =
                perm.iter().enumerate().map(|(a, &p)| format!("c{a} * {}u", ist[p])).collect();
            let idx = if t.is_empty() { "0u".into() } else { t.join(" + ") };
            format!("{out}[i] = {}[{idx}];", ctx.ptr(x)?)
        }
        Op::Slice { axis, start, .. } => {
            let x = n.inputs[0];
            let mut cs = coords.clone();
            cs[*axis] = format!("({} + {start}u)", coords[*axis]);
            format!("{out}[i] = {}[{}];", ctx.ptr(x)?, linear_of(&ctx.shape(x), &cs))
        }
        Op::Pad { axis, before, .. } => {
            let x = n.inputs[0];
            let ish = ctx.shape(x);
            let ext = ish[*axis];
            let mut cs = coords.clone();
            cs[*axis] = format!("({} - {before}u)", coords[*axis]);
            format!(
                "{out}[i] = ({c} >= {before}u && {c} < {}u) ? {}[{}] : {};",
                before + ext,
                ctx.ptr(x)?,
                linear_of(&ish, &cs),
                czero(odt),
                c = coords[*axis]
            )
        }
        Op::Concat { axis } => {
            let mut s = String::new();
            let mut off = 0;
            for (k, &x) in n.inputs.iter().enumerate() {
                let ish = ctx.shape(x);
                let mut cs = coords.clone();
                cs[*axis] = format!("({} - {off}u)", coords[*axis]);
                let load = promote(format!("{}[{}]", ctx.ptr(x)?, linear_of(&ish, &cs)), ctx.dtype(x));
                off += ish[*axis];
                if k + 1 == n.inputs.len() {
                    let _ = write!(s, "{out}[i] = {load};");
                } else {
                    let _ = write!(s, "if ({} < {off}u) {out}[i] = {load}; else ", coords[*axis]);
                }
            }
            s
        }
        Op::Fft { axis, inverse, norm } => {
            let x = n.inputs[0];
            let len = oshape[*axis];
            let inner: usize = oshape[axis + 1..].iter().product();
            let scale = norm.scale(len, *inverse);
            let sign = if *inverse { "" } else { "-" };
            format!(
                "const ix k = {c};\n    const auto* row = {p} + (i - k * {inner}u);\n    \
                 double sx = 0.0, sy = 0.0;\n    ix m = 0u;\n    \
                 for (ix j = 0; j < {len}u; ++j) {{\n      float s, c; sincospif({sign}2.0f * (float)m / {len}.0f, &s, &c);\n      \
                 const float2 z = row[j * {inner}u];\n      sx += (double)z.x * c - (double)z.y * s;\n      sy += (double)z.x * s + (double)z.y * c;\n      \
                 m += k; if (m >= {len}u) m -= {len}u;\n    }}\n    \
                 {out}[i] = make_float2((float)(sx * {scale:e}), (float)(sy * {scale:e}));",
                c = coords[*axis],
                p = ctx.ptr(x)?,
            )
        }
        Op::OneHot { classes } => {
            let x = n.inputs[0];
            format!("{out}[i] = ({}[i / {classes}u] == (int)(i % {classes}u)) ? 1.0f : 0.0f;", ctx.ptr(x)?)
        }
        Op::Gather => {
            let (table, idx) = (n.inputs[0], n.inputs[1]);
            let [rows, width] = ctx.shape(table)[..] else {
                return Err(internal!("{v}: gather table is not 2-D"));
            };
            format!(
                "const int r = {ix}[i / {width}u];\n    \
                 {out}[i] = (r >= 0 && r < {rows}) ? {t}[(ix)r * {width}u + i % {width}u] : {z};",
                ix = ctx.ptr(idx)?,
                t = ctx.ptr(table)?,
                z = czero(odt),
            )
        }
        Op::DropoutMask { p, salt } => {
            let threshold = ((1.0 - p) * 16_777_216.0) as u32;
            let keep = flit(1.0 / (1.0 - p));
            // The hash's index is the element index wrapped to 32 bits, as `ir::dropout_keep`'s.
            format!("{out}[i] = ((dropout_hash({salt}u, step, (u32)i) >> 8) < {threshold}u) ? {keep} : 0.0f;")
        }
        other @ (Op::Input { .. }
        | Op::Param { .. }
        | Op::State { .. }
        | Op::Scalar { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Select
        | Op::Reduce { .. }
        | Op::Reshape
        | Op::MatMul { .. }
        | Op::Conv2d { .. }
        | Op::ConvTranspose2d { .. }
        | Op::Conv2dWeightGrad { .. }
        | Op::AttnLse { .. }
        | Op::Attention { .. }
        | Op::AttentionGrad { .. }
        | Op::Recurrence { .. }
        | Op::RecurrenceGrad { .. }
        | Op::ScatterAdd { .. }
        | Op::Assign) => return Err(internal!("{v}: {} is not a data-movement op", other.mnemonic())),
    };
    let _ = writeln!(code, "    {body}");
    code.push_str("  }\n");
    Ok(EwLoop { code, grid, index })
}

/// `ScatterAdd`: one thread per source element adds it into its row of the zeroed output with
/// `atomicAdd` (complex: one atomic per part). Rows hit by several indices therefore sum in
/// an order that may change from run to run (as split-K contractions; the CPU back end and
/// the interpreter sum in index order). Indices outside `0..rows` add nothing.
fn scatter_add(ctx: &Ctx, v: Value, rows: usize, name: &str) -> CompileResult<Kernel> {
    let n = ctx.g.node(v);
    let (src, idx) = (n.inputs[0], n.inputs[1]);
    let sn: usize = ctx.shape(src).iter().product();
    let width = *ctx.shape(v).last().ok_or_else(|| internal!("{v}: scatter_add output is a scalar"))?;
    let grid = ctx.grid_for(sn, BLOCK as usize);
    let index = ctx.indexing(&[src, idx, v], &[sn, grid as usize * BLOCK as usize]);
    let mut code = open_kernel(name, &index);
    grid_stride_open(sn, &mut code);
    let _ = writeln!(
        code,
        "    const int r = {ix}[i / {width}u];\n    \
         if (r >= 0 && r < {rows}) atomic_acc(&{out}[(ix)r * {width}u + i % {width}u], {s}[i]);",
        ix = ctx.ptr(idx)?,
        out = ctx.ptr(v)?,
        s = ctx.ptr(src)?,
    );
    code.push_str("  }\n}\n");
    Ok(Kernel { zero: vec![(ctx.offset(v)?, ctx.bytes(v))], ..Kernel::grid_stride(code, grid, index) })
}
