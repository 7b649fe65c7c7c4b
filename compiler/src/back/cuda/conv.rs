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
pub(crate) fn direct(ctx: &Ctx, v: Value, name: &str) -> CompileResult<Option<Kernel>> {
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
    // Every index is one of the three tensors' (the image `b` multiplies the strides).
    let index = ctx.indexing(&[x, w, v], &[]);
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
    let _ = writeln!(c, "extern \"C\" __global__ void __launch_bounds__(256) {name}(char* A) {{");
    c.push_str(index.typedef());
    let _ = writeln!(c, "  const u32 tid = threadIdx.x, tx = tid % 16u, ty = tid / 16u;");
    let _ = writeln!(c, "  const ix g = blockIdx.z;\n  const u32 m0 = blockIdx.y * {bm}u;");
    let _ = writeln!(
        c,
        "  const ix b = blockIdx.x / {t}u;\n  const u32 tile = blockIdx.x % {t}u, y0 = (tile / {tiles_x}u) * {th}u, x0 = (tile % {tiles_x}u) * {TW}u;",
        t = tiles_y * tiles_x
    );
    let _ = writeln!(c, "  __shared__ {ta} Ws[{taps}][{bm}];");
    let _ = writeln!(c, "  __shared__ {tb} Xs[{ck}][{hr}][{hc}];");
    let _ = writeln!(c, "  {ta} rw[{per_w}];\n  {tb} rx[{per_x}];");
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
         if (m < {m}u && y < {hout}u && x < {wout}u) {po}[((b * {cout}u + g * {m}u + m) * {hout}u + y) * {wout}u + x] = acc[ii][jj];\n    }}\n}}",
        m = d.m,
        hout = d.hout,
        wout = d.wout,
        cout = d.cout,
    );
    Ok(Some(Kernel {
        code: c,
        grid: [blocks as u32, d.m.div_ceil(bm) as u32, d.groups as u32],
        block: [256, 1, 1],
        zero: Vec::new(),
        scratch: 0,
        pre: None,
        shared: 0,
        index,
    }))
}
