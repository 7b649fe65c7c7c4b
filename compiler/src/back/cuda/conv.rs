//! Direct convolution kernels for stride-1 convolutions and their input gradients: a block
//! stages a tile of the input with its halo in shared memory once per channel chunk, and
//! every tap of the kernel reads it from there.
//!
//! The implicit GEMM of `gemm.rs` gathers one input element per (tap, output pixel) pair, so
//! a 3×3 convolution issues nine loads, each with its own index arithmetic, for every input
//! element a tile touches; with 32 output channels per tile (the input gradient of the seed
//! network's second convolution) that gather work rivals the multiply-adds. Here each input
//! element of a tile is loaded from global memory once per channel chunk, and each thread
//! keeps a column of the staged tile in registers across the kernel's rows of taps.
//!
//! A block computes `BM` output channels × a `TH × 16` pixel tile of one image with 256
//! threads: thread `(tx, ty)` owns pixel column `tx` (all `TH` rows) and channels
//! `ty + 16·i`. The reduction runs over input channels `CK` at a time (all taps of each),
//! and the next chunk is loaded into registers while the current one is multiplied.
//!
//! `ConvTranspose2d` with stride 1 is the same correlation with the taps mirrored and the
//! weight's two channel axes swapped, so both share this template.

use super::*;
use crate::target::ConvKernel;

/// Output-tile width in pixels (one per `tx`).
const TW: usize = 16;

/// The most shared memory the staged weight and input tiles may take (the bound the kernel
/// was written and measured with, below the 48 KiB of static shared memory a block may
/// declare; a device with less lowers it).
const MAX_STAGED_BYTES: usize = 40 * 1024;

/// What differs between a convolution and the input gradient of one.
struct Direct {
    nb: usize,
    /// Channels of the input tensor, its height and width.
    cin: usize,
    hin: usize,
    win: usize,
    /// Channels of the output tensor, its height and width.
    cout: usize,
    hout: usize,
    wout: usize,
    groups: usize,
    /// Input channels reduced per group, output channels per group.
    red: usize,
    m: usize,
    kh: usize,
    kw: usize,
    dil: [usize; 2],
    pad: [usize; 2],
    /// Input gradient (mirrored taps, swapped weight channels) rather than a convolution.
    transposed: bool,
    conj: [bool; 2],
}

/// Whether a contraction of `depth` terms per output (or, for a weight gradient, `depth`
/// outputs per output channel) is too thin for the tensor-core GEMM at `precision = tf32 |
/// bf16 | fp16`: its tiles are 16 or 32 deep (32 to 128 wide), so a first layer's one input
/// channel × 9 taps leaves most of every tile's products idle while the gathers cost the
/// same. The direct FMA kernels then serve it (in f32, which the reduced precisions allow).
/// Measured on an H200 (bench/RESULTS.md, 2026-12-04): the seed network's first layer took
/// 0.61 ms forward and 1.76 ms for its weight gradient on tensor cores in tf32, against 0.36
/// and 0.49 ms for the direct kernels in fp32.
pub(crate) fn too_shallow_for_tensor_cores(depth: usize) -> bool {
    depth < 32
}

/// The direct kernel of a stride-1 `Conv2d` or `ConvTranspose2d` node, or `None` where the
/// implicit GEMM serves better (strided, narrow or short outputs, very large kernels, tiles
/// that do not fit the device, reductions deep enough for tensor cores at a reduced precision) or where the target's [`ConvKernel::Gemm`] asks for the
/// implicit GEMM (to measure one against the other).
///
/// With `stats` (reduction groups that [`stats_join`] accepted) the kernel also computes
/// those per-channel sums from the values it stores: its blocks then loop over the tiles
/// (a few per SM), each thread folds its outputs into f64 accumulators, and the last block of
/// each channel block adds the blocks' partials (scratch memory at byte offset `scratch`)
/// in block order, so the sums do not depend on the order the blocks ran in.
pub(crate) fn direct(
    ctx: &Ctx,
    v: Value,
    name: &str,
    stats: &[&KernelGroup],
    scratch: usize,
) -> CompileResult<Option<Kernel>> {
    let choice = ctx.target.kernels.conv;
    if choice == ConvKernel::Gemm {
        return Ok(None);
    }
    let node = ctx.g.node(v);
    let (x, w) = (node.inputs[0], node.inputs[1]);
    let dims = |s: Vec<usize>| -> Option<[usize; 4]> { s.try_into().ok() };
    let (Some(xs), Some(ws), Some(os)) = (dims(ctx.shape(x)), dims(ctx.shape(w)), dims(ctx.shape(v))) else {
        return Ok(None);
    };
    // A convolution reduces over the weight's second axis; its input gradient (the same
    // correlation with mirrored taps) over the first, per group.
    let (geom, conj, transposed) = match &node.op {
        Op::Conv2d { geom, conj } if geom.stride == [1, 1] => (geom, conj, false),
        Op::ConvTranspose2d { geom, conj, .. } if geom.stride == [1, 1] => (geom, conj, true),
        _ => return Ok(None),
    };
    let (red, m) = if transposed { (ws[0] / geom.groups, ws[1]) } else { (ws[1], ws[0] / geom.groups) };
    let d = Direct {
        nb: xs[0],
        cin: xs[1],
        hin: xs[2],
        win: xs[3],
        cout: os[1],
        hout: os[2],
        wout: os[3],
        groups: geom.groups,
        red,
        m,
        kh: ws[2],
        kw: ws[3],
        dil: geom.dilation,
        pad: geom.pad,
        transposed,
        conj: *conj,
    };
    // Measured on an H200 (bench/GPU-NOTES.md): with 32 output channels per tile the direct
    // kernel beats the implicit GEMM (whose gathers are then amortised over only 32
    // channels); with 64 the implicit GEMM is faster. `ConvKernel::Direct64` uses the
    // direct kernel for wider layers too (64 × 128-pixel tiles).
    if d.m > 32 && choice != ConvKernel::Direct64 {
        return Ok(None);
    }
    let khw = d.kh * d.kw;
    if ctx.tensor_cores() && !too_shallow_for_tensor_cores(d.red * khw) {
        return Ok(None);
    }
    // Channels per shared-memory chunk (one barrier pair each); the target's `conv_chunk`
    // overrides it for measurements.
    let ck = ctx.target.kernels.conv_chunk.unwrap_or(32 / khw).clamp(1, d.red);
    let bm = if d.m > 32 { 64 } else { 32 };
    let th = 8;
    let hr = th + (d.kh - 1) * d.dil[0];
    let hc = TW + (d.kw - 1) * d.dil[1];
    let smem = (ck * khw * bm + ck * hr * hc) * 8;
    let tiles_y = d.hout.div_ceil(th);
    let tiles_x = d.wout.div_ceil(TW);
    let blocks = d.nb * tiles_y * tiles_x;
    // Narrow or short outputs (a 1-D convolution is 1 pixel high) would leave most of a
    // 16 × 8 pixel tile idle: the implicit GEMM tiles them without waste. Staged tiles stay
    // within the kernel's own bound and the device's limit; a grid the device cannot launch
    // falls back to the implicit GEMM too.
    let max_grid = ctx.target.device.max_grid;
    if d.wout < TW
        || d.hout < th
        || khw > 49
        || smem > MAX_STAGED_BYTES.min(ctx.target.device.shared_per_block)
        || blocks > max_grid[0]
        || d.m.div_ceil(bm) > max_grid[1]
        || d.groups > max_grid[2]
    {
        return Ok(None);
    }
    let sums = Sums::of(ctx, v, stats)?;
    // With sums, the blocks an SM holds loop over the tiles (`fill=BLOCKS` sets how many):
    // 4 of a kernel whose input channels fit one chunk (64 registers, as without sums), 2 of
    // one that prefetches the next chunk (about 120 registers without sums; NVRTC, sm_90).
    let per_sm = if d.red <= ck { STATS_BLOCKS_PER_SM } else { STATS_BLOCKS_PER_SM / 2 };
    let resident = ctx.target.kernels.fill.unwrap_or(per_sm * ctx.target.device.sm_count);
    let grid_x = if sums.is_empty() { blocks } else { blocks.min(resident.max(1)) };
    let grid_yz = d.m.div_ceil(bm) * d.groups;
    let (values_per_block, scratch_bytes) =
        (bm * sums.parts, grid_x * grid_yz * bm * sums.parts * 8 + 4 * grid_yz);
    // Every index is one of the three tensors' (the image `b` multiplies the strides), or of
    // the sums' partials.
    let mut buffers = vec![x, w, v];
    buffers.extend(sums.each.iter().map(|s| s.red).chain(sums.inputs.iter().copied()));
    let index = ctx.indexing(&buffers, &[scratch_bytes / 8]);
    let (tw_, tx_, tc_) = (ctx.dtype(w), ctx.dtype(x), ctx.dtype(v));
    let (ta, tb, tc) = (ctype(tw_), ctype(tx_), ctype(tc_));
    let (px, pw, po) = (ctx.ptr(x)?, ctx.ptr(w)?, ctx.ptr(v)?);
    let (tm, tn) = (bm / 16, th);
    let taps = ck * khw;
    // First input row/column of the halo relative to the tile's first output pixel, and the
    // halo row/column each tap reads (relative to the thread's own pixel).
    let (base_y, base_x) = if d.transposed {
        (d.pad[0] as i64 - ((d.kh - 1) * d.dil[0]) as i64, d.pad[1] as i64 - ((d.kw - 1) * d.dil[1]) as i64)
    } else {
        (-(d.pad[0] as i64), -(d.pad[1] as i64))
    };
    let tap_row = |i: usize| if d.transposed { (d.kh - 1 - i) * d.dil[0] } else { i * d.dil[0] };
    let tap_col = |j: usize| if d.transposed { (d.kw - 1 - j) * d.dil[1] } else { j * d.dil[1] };
    let og_stride = if d.transposed { d.m } else { d.red };
    // Weight element (output channel `m`, reduced channel `c`, tap `t`) of group `g`.
    let widx = if d.transposed {
        format!("((g * {red}u + c) * {og_stride}u + m) * {khw}u + t", red = d.red)
    } else {
        format!("((g * {mm}u + m) * {og_stride}u + c) * {khw}u + t", mm = d.m)
    };
    let cj = |c: bool, e: String| if c { format!("cj({e})") } else { e };
    let wload = cj(d.conj[1], format!("{pw}[{widx}]"));
    let xload = cj(
        d.conj[0],
        format!(
            "{px}[((b * {cin}u + g * {red}u + c) * {hin}u + (u32)y) * {win}u + (u32)x]",
            cin = d.cin,
            red = d.red,
            hin = d.hin,
            win = d.win
        ),
    );
    let per_w = (taps * bm).div_ceil(256);
    let per_x = (ck * hr * hc).div_ceil(256);
    let mut c = String::new();
    // With sums, that many blocks must fit an SM (one chunk: 64 registers, no spill at bf16
    // and 8 bytes at fp32 for the seed network's first layer; NVRTC, sm_90a).
    let bounds = if sums.is_empty() { "256".to_string() } else { format!("256, {per_sm}") };
    let _ = writeln!(c, "extern \"C\" __global__ void __launch_bounds__({bounds}) {name}(char* A) {{");
    c.push_str(index.typedef());
    let _ = writeln!(c, "  const u32 tid = threadIdx.x, tx = tid % 16u, ty = tid / 16u;");
    let _ = writeln!(c, "  const ix g = blockIdx.z;\n  const u32 m0 = blockIdx.y * {bm}u;");
    // One tile per block, or with sums a loop over tiles (the same trips in every thread).
    let blk = if sums.is_empty() { "blockIdx.x" } else { "blk" };
    let tile_of = format!(
        "  const ix b = {blk} / {t}u;\n  const u32 tile = {blk} % {t}u, y0 = (tile / {tiles_x}u) * {th}u, x0 = (tile % {tiles_x}u) * {TW}u;",
        t = tiles_y * tiles_x
    );
    if sums.is_empty() {
        let _ = writeln!(c, "{tile_of}");
    }
    let _ = writeln!(c, "  __shared__ {ta} Ws[{taps}][{bm}];");
    let _ = writeln!(c, "  __shared__ {tb} Xs[{ck}][{hr}][{hc}];");
    let _ = writeln!(c, "  {ta} rw[{per_w}];\n  {tb} rx[{per_x}];");
    if !sums.is_empty() {
        // Each thread's f64 accumulators, in shared memory (a column per thread): in registers
        // they took the kernel from 64 to 96 (2 blocks per SM instead of 4; NVRTC, sm_90a).
        let _ = writeln!(c, "  __shared__ double st[{}][256];", tm * sums.parts);
        let _ = writeln!(
            c,
            "  #pragma unroll\n  for (int k = 0; k < {}; ++k) st[k][tid] = 0.0;",
            tm * sums.parts
        );
        let _ = writeln!(c, "  for (ix blk = blockIdx.x; blk < {blocks}u; blk += gridDim.x) {{\n{tile_of}");
    }
    let _ = writeln!(c, "  {tc} acc[{tm}][{tn}];");
    let _ = writeln!(
        c,
        "  #pragma unroll\n  for (int i = 0; i < {tm}; ++i)\n    #pragma unroll\n    for (int j = 0; j < {tn}; ++j) acc[i][j] = {};",
        czero(tc_)
    );
    // Loads of channel chunk `c0` into registers.
    let fetch = format!(
        "    #pragma unroll\n    for (u32 r = 0; r < {per_w}u; ++r) {{\n      const u32 e = tid + r * 256u, t = e % {khw}u, cc = (e / {khw}u) % {ck}u, mm = e / {taps}u;\n      \
         const u32 c = c0 + cc, m = m0 + mm;\n      rw[r] = (e < {tot_w}u && c < {red}u && m < {m}u) ? {wload} : {zw};\n    }}\n    \
         #pragma unroll\n    for (u32 r = 0; r < {per_x}u; ++r) {{\n      const u32 e = tid + r * 256u, cc = e / {hrc}u, q = e % {hrc}u;\n      \
         const u32 c = c0 + cc;\n      const int y = (int)y0 + ({base_y}) + (int)(q / {hc}u), x = (int)x0 + ({base_x}) + (int)(q % {hc}u);\n      \
         rx[r] = (e < {tot_x}u && c < {red}u && y >= 0 && y < {hin} && x >= 0 && x < {win}) ? {xload} : {zx};\n    }}\n",
        tot_w = taps * bm,
        tot_x = ck * hr * hc,
        red = d.red,
        m = d.m,
        hrc = hr * hc,
        hin = d.hin,
        win = d.win,
        zw = czero(tw_),
        zx = czero(tx_),
    );
    let store = format!(
        "    #pragma unroll\n    for (u32 r = 0; r < {per_w}u; ++r) {{\n      const u32 e = tid + r * 256u;\n      \
         if (e < {tot_w}u) Ws[e % {taps}u][e / {taps}u] = rw[r];\n    }}\n    \
         #pragma unroll\n    for (u32 r = 0; r < {per_x}u; ++r) {{\n      const u32 e = tid + r * 256u;\n      \
         if (e < {tot_x}u) Xs[e / {hrc}u][(e % {hrc}u) / {hc}u][e % {hc}u] = rx[r];\n    }}\n",
        tot_w = taps * bm,
        tot_x = ck * hr * hc,
        hrc = hr * hc,
    );
    let _ = writeln!(c, "  {{\n    const u32 c0 = 0u;\n{fetch}  }}");
    let _ = writeln!(c, "  for (u32 c0 = 0u; c0 < {red}u; c0 += {ck}u) {{", red = d.red);
    c.push_str(&store);
    c.push_str("    __syncthreads();\n");
    let _ = writeln!(c, "    if (c0 + {ck}u < {red}u) {{\n      const u32 c0n = c0 + {ck}u;\n      {{\n        const u32 c0 = c0n;\n{fetch}      }}\n    }}", red = d.red);
    // Every tap of the chunk, unrolled: a column of the staged input (one per kernel column)
    // stays in registers for all kernel rows.
    for cc in 0..ck {
        for j in 0..d.kw {
            let _ = writeln!(c, "    {{\n      {tb} col[{hr}];");
            let _ = writeln!(
                c,
                "      #pragma unroll\n      for (int r = 0; r < {hr}; ++r) col[r] = Xs[{cc}][r][tx + {}u];",
                tap_col(j)
            );
            for i in 0..d.kh {
                let t = (cc * d.kh + i) * d.kw + j;
                let _ = writeln!(
                    c,
                    "      {{\n        {ta} a[{tm}];\n        #pragma unroll\n        for (int ii = 0; ii < {tm}; ++ii) a[ii] = Ws[{t}][ty + ii * 16];\n        \
                     #pragma unroll\n        for (int ii = 0; ii < {tm}; ++ii)\n          #pragma unroll\n          for (int jj = 0; jj < {tn}; ++jj) mac(acc[ii][jj], a[ii], col[jj + {}]);\n      }}",
                    tap_row(i)
                );
            }
            c.push_str("    }\n");
        }
    }
    c.push_str("    __syncthreads();\n  }\n");
    let _ = writeln!(
        c,
        "  #pragma unroll\n  for (int ii = 0; ii < {tm}; ++ii)\n    #pragma unroll\n    for (int jj = 0; jj < {tn}; ++jj) {{\n      \
         const u32 m = m0 + ty + ii * 16, y = y0 + jj, x = x0 + tx;\n      \
         if (m < {m}u && y < {hout}u && x < {wout}u) {po}[((b * {cout}u + g * {m}u + m) * {hout}u + y) * {wout}u + x] = acc[ii][jj];\n    }}",
        m = d.m,
        hout = d.hout,
        wout = d.wout,
        cout = d.cout,
    );
    if !sums.is_empty() {
        sums.fold(ctx, v, &d, tm, tn, &mut c)?;
        c.push_str("  }\n");
        sums.finish(ctx, &d, bm, values_per_block, scratch, &mut c)?;
    }
    c.push_str("}\n");
    Ok(Some(Kernel {
        code: c,
        grid: [grid_x as u32, d.m.div_ceil(bm) as u32, d.groups as u32],
        block: [256, 1, 1],
        zero: Vec::new(),
        scratch: if sums.is_empty() { 0 } else { scratch_bytes },
        pre: None,
        post: None,
        shared: 0,
        index,
    }))
}

/// Blocks per SM of a direct convolution that computes sums, where its input channels fit
/// one chunk (half that where they do not): its blocks loop over the tiles, and four blocks
/// of 256 threads are what an SM holds at 64 registers a thread (the kernel's launch bounds
/// ask for that), so every block runs from the start (no second wave to wait for) and the
/// last block adds one partial per block.
const STATS_BLOCKS_PER_SM: usize = 4;

/// The most f64 accumulators (a real sum one, a complex sum two) per output channel of a
/// direct convolution's sums: a batchnorm's four statistics.
const MAX_STATS_PARTS: usize = 4;

/// Whether reduction group `next` can be computed inside the direct convolution of group
/// `conv`, joining the groups `run` already there: the target fuses such sums
/// ([`KernelConfig::conv_stats`](crate::target::KernelConfig::conv_stats)), the convolution is
/// a stride-1 `Conv2d`, and `next` sums, per channel (over the batch and both spatial axes),
/// an elementwise function of the convolution's output (and of per-channel operands such as
/// a bias) into a full-width buffer that shares no memory with the convolution's operands,
/// its output, the sums' operands or the run's sums. (Whether
/// the direct kernel serves the convolution at all is [`direct`]'s to decide.)
pub(crate) fn stats_join(ctx: &Ctx, conv: &KernelGroup, run: &[&KernelGroup], next: &KernelGroup) -> bool {
    let (&[v], true) = (&conv.nodes[..], ctx.target.kernels.conv_stats) else { return false };
    let node = ctx.g.node(v);
    if !matches!(&node.op, Op::Conv2d { geom, .. } if geom.stride == [1, 1]) {
        return false;
    }
    let Some((_, red, epi)) = next.reduce_parts(ctx.g) else { return false };
    let sum_per_channel =
        matches!(&ctx.g.node(red).op, Op::Reduce { op: ReduceOp::Sum, axes } if axes[..] == [0, 2, 3]);
    let parts = |k: &KernelGroup| k.reduce_parts(ctx.g).map_or(0, |(_, r, _)| ctx.dtype(r).bytes() / 4);
    let domain = ctx.shape(v);
    let fits = sum_per_channel
        && epi.is_empty()
        && next.inputs.contains(&v)
        && next.inputs.iter().all(|&u| u == v || per_channel(&ctx.shape(u), &domain))
        && next.domain.resolve(ctx.batch) == domain
        && ctx.storage(red) == Storage::Full
        && matches!(ctx.dtype(red), DType::F32 | DType::C64)
        && run.iter().copied().chain([next]).map(parts).sum::<usize>() <= MAX_STATS_PARTS;
    if !fits {
        return false;
    }
    let range = |v: Value| ctx.offset(v).ok().map(|o| (o, o + ctx.bytes(v)));
    let Some(r) = range(red) else { return false };
    let mut others: Vec<Value> = node.inputs.clone();
    others.extend(next.inputs.iter().copied());
    others.extend(run.iter().flat_map(|k| k.outputs.iter().copied()));
    others.iter().all(|&o| range(o).is_some_and(|q| q.1 <= r.0 || r.1 <= q.0))
}

/// Whether a tensor of `shape` broadcast to `domain` (`[N, C, H, W]`) is constant but along
/// the channel axis: a bias the sums' prologue adds (`conv2d(…, bias = true)` before a
/// batchnorm), read at each output's channel.
fn per_channel(shape: &[usize], domain: &[usize]) -> bool {
    let lead = domain.len().checked_sub(shape.len());
    lead.is_some_and(|lead| {
        shape.iter().enumerate().all(|(j, &e)| e == 1 || (j + lead == 1 && e == domain[1]))
    })
}

/// One per-channel sum of a direct convolution's output (a `Reduce` group it computes).
pub(crate) struct Sum {
    /// The reduction node (its buffer gets the sum).
    pub red: Value,
    /// The value summed (computed from the output by the prologue).
    pub operand: Value,
    /// First accumulator (of one, or two for a complex sum).
    pub part: usize,
    pub complex: bool,
}

/// The sums a convolution computes, with their prologues (the direct kernel's, or the
/// `wgmma` GEMM's epilogue: `gemm.rs`).
pub(crate) struct Sums {
    pub each: Vec<Sum>,
    /// The prologues' nodes, in graph order (each once).
    pub prologue: Vec<Value>,
    /// What the prologues read besides the convolution's output (per-channel operands).
    pub inputs: Vec<Value>,
    /// Accumulators per output channel.
    pub parts: usize,
}

impl Sums {
    pub(crate) fn of(ctx: &Ctx, v: Value, stats: &[&KernelGroup]) -> CompileResult<Sums> {
        let mut each = Vec::new();
        let mut prologue: Vec<Value> = Vec::new();
        let mut inputs: Vec<Value> = Vec::new();
        let mut parts = 0;
        for k in stats {
            for &u in &k.inputs {
                if u != v && !inputs.contains(&u) {
                    inputs.push(u);
                }
            }
            let (pro, red, _) =
                k.reduce_parts(ctx.g).ok_or_else(|| internal!("a convolution's sum is not a reduction"))?;
            let complex = ctx.dtype(red) == DType::C64;
            let operand = ctx.g.node(red).inputs[0];
            if operand != v && !pro.contains(&operand) {
                return Err(internal!("{red}: its operand {operand} is not computed from the convolution"));
            }
            each.push(Sum { red, operand, part: parts, complex });
            parts += if complex { 2 } else { 1 };
            for &p in pro {
                if !prologue.contains(&p) {
                    prologue.push(p);
                }
            }
        }
        prologue.sort();
        Ok(Sums { each, prologue, inputs, parts })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.each.is_empty()
    }

    /// The statements that store the sum `s` (a double) of accumulator `k` of channel `ch`
    /// (names in the C scope) into its reduction's buffer.
    pub(crate) fn store(&self, ctx: &Ctx, c: &mut String) -> CompileResult<()> {
        for s in &self.each {
            let at = ctx.offset(s.red)?;
            if s.complex {
                let _ = writeln!(
                    c,
                    "      if (k == {p0}u || k == {p1}u) ((float*)(A + {at}ull))[ch * 2u + (k - {p0}u)] = (float)s;",
                    p0 = s.part,
                    p1 = s.part + 1
                );
            } else {
                let _ = writeln!(c, "      if (k == {}u) ((float*)(A + {at}ull))[ch] = (float)s;", s.part);
            }
        }
        Ok(())
    }

    /// The prologues at one output element of `v` whose value is the C expression `value`
    /// (rounded here to how the output is stored, as the sum kernel would read it), at
    /// coordinates `coords` and linear index `linear`; each sum's operand is added to the f32
    /// partial `{acc}[part]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn point(
        &self,
        ctx: &Ctx,
        v: Value,
        value: &str,
        coords: &[String],
        linear: &str,
        acc: &str,
        c: &mut String,
    ) -> CompileResult<()> {
        let stored = stored_ctype(ctx.storage(v), ctx.dtype(v));
        let (t, n) = (ctype(ctx.dtype(v)), v.index());
        let _ = writeln!(c, "      {stored} s_;\n      s_ = {value};\n      const {t} v{n} = s_;");
        let vars = std::collections::HashMap::from([(v, format!("v{n}"))]);
        let vars = super::kernels::emit_values(
            ctx,
            &self.prologue,
            &self.inputs,
            &ctx.shape(v),
            coords,
            linear,
            c,
            vars,
        )?;
        for s in &self.each {
            let x =
                vars.get(&s.operand).ok_or_else(|| internal!("{}: its operand is not computed", s.red))?;
            if s.complex {
                let _ = writeln!(c, "      {acc}[{}] += {x}.x; {acc}[{}] += {x}.y;", s.part, s.part + 1);
            } else {
                let _ = writeln!(c, "      {acc}[{}] += {x};", s.part);
            }
        }
        Ok(())
    }

    /// After a tile's stores: each thread adds, per channel, its column's values (as stored,
    /// 16-bit formats rounded) through the prologues into f32 partials, then those into `st`.
    fn fold(
        &self,
        ctx: &Ctx,
        v: Value,
        d: &Direct,
        tm: usize,
        tn: usize,
        c: &mut String,
    ) -> CompileResult<()> {
        let _ = writeln!(c, "  #pragma unroll\n  for (int ii = 0; ii < {tm}; ++ii) {{");
        let _ = writeln!(c, "    float p[{}];", self.parts);
        let _ = writeln!(c, "    #pragma unroll\n    for (int k = 0; k < {}; ++k) p[k] = 0.0f;", self.parts);
        let _ = writeln!(
            c,
            "    #pragma unroll\n    for (int jj = 0; jj < {tn}; ++jj) {{\n      const u32 m = m0 + ty + ii * 16, y = y0 + jj, x = x0 + tx;\n      \
             if (m < {m}u && y < {hout}u && x < {wout}u) {{",
            m = d.m,
            hout = d.hout,
            wout = d.wout,
        );
        let coords = ["b".to_string(), format!("(g * {}u + m)", d.m), "y".into(), "x".into()];
        let linear = format!("((b * {}u + g * {}u + m) * {}u + y) * {}u + x", d.cout, d.m, d.hout, d.wout);
        self.point(ctx, v, "acc[ii][jj]", &coords, &linear, "p", c)?;
        let _ = writeln!(
            c,
            "      }}\n    }}\n    #pragma unroll\n    for (int k = 0; k < {p}; ++k) st[ii * {p} + k][tid] += (double)p[k];\n  }}",
            p = self.parts
        );
        Ok(())
    }

    /// After the tiles: the first of the 16 threads of a channel row adds their accumulators
    /// in order and stores the block's partial; the last block of each channel block to
    /// finish adds the partials in block order and stores the sums.
    fn finish(
        &self,
        ctx: &Ctx,
        d: &Direct,
        bm: usize,
        per_block: usize,
        scratch: usize,
        c: &mut String,
    ) -> CompileResult<()> {
        let parts = self.parts;
        // Threads per summed value in the last block, each over a range of blocks.
        let share = (256 / per_block).max(1);
        let _ = writeln!(
            c,
            "  __syncthreads();\n  const ix cb = (ix)blockIdx.z * gridDim.y + blockIdx.y;\n  double* part = (double*)(A + {scratch}ull);\n  \
             if (tx == 0u) {{\n    #pragma unroll\n    for (int k = 0; k < {n}; ++k) {{\n      double s = 0.0;\n      \
             for (u32 l = 0u; l < 16u; ++l) s += st[k][tid + l];\n      \
             part[(cb * gridDim.x + blockIdx.x) * {per_block}u + (ty + (k / {parts}) * 16u) * {parts}u + k % {parts}] = s;\n    }}\n  }}",
            n = (bm / 16) * parts
        );
        let counters = format!(
            "((u32*)(A + {scratch}ull + (ix)gridDim.y * gridDim.z * gridDim.x * {}ull))",
            per_block * 8
        );
        let _ = writeln!(
            c,
            "  __threadfence();\n  __syncthreads();\n  __shared__ u32 last;\n  \
             if (tid == 0u) last = atomicAdd({counters} + cb, 1u) == gridDim.x - 1u;\n  __syncthreads();\n  if (!last) return;\n  __threadfence();"
        );
        let _ = writeln!(
            c,
            "  __shared__ double fin[256];\n  {{\n    const u32 q = tid % {per_block}u, h = tid / {per_block}u, per = (gridDim.x + {share}u - 1u) / {share}u;\n    \
             double s = 0.0;\n    if (h < {share}u)\n      for (u32 k = h * per; k < min((h + 1u) * per, (u32)gridDim.x); ++k) s += __ldcg(part + (cb * gridDim.x + k) * {per_block}u + q);\n    \
             fin[tid] = s;\n  }}\n  __syncthreads();"
        );
        let _ = writeln!(
            c,
            "  if (tid < {per_block}u) {{\n    double s = fin[tid];\n    for (u32 h = 1u; h < {share}u; ++h) s += fin[h * {per_block}u + tid];\n    \
             const u32 m = blockIdx.y * {bm}u + tid / {parts}u, k = tid % {parts}u;\n    const ix ch = (ix)blockIdx.z * {mm}u + m;\n    if (m < {mm}u) {{",
            mm = d.m
        );
        self.store(ctx, c)?;
        let _ = writeln!(c, "    }}\n  }}\n  if (tid == 0u) {counters}[cb] = 0u;");
        Ok(())
    }
}
