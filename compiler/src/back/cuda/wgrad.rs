//! Direct weight-gradient kernel for stride-1 convolutions: output-gradient and input tiles
//! staged in shared memory, every tap of the kernel accumulated from them in registers.
//!
//! The implicit GEMM of `gemm.rs` computes `dW[o][c][i][j] = Σ_p dy[o][p] · x[c][p + (i, j)]`
//! by gathering one input element per (tap, pixel) pair: nine gathers, each with its own
//! index arithmetic, per input element of a 3×3 layer. Here a block stages a `TH × TW` pixel
//! tile of `dy` (all of the block's output channels) and the matching input tile with its
//! halo (the block's input channels), each element loaded from global memory once.
//!
//! Thread `(ci, oi)` owns one input channel, `OT` output channels and all `kh × kw` taps: it
//! walks the tile's pixels along each row with a `kh × kw` window of the staged input in
//! registers, so each pixel costs `kh` input loads and `OT` output-gradient loads from shared
//! memory for `OT·kh·kw` complex multiply-adds. A layer with fewer input channels than a
//! block has channel threads (a first layer's single channel) gives the spare threads rows of
//! the tile instead. Blocks split the pixels (images × tiles) and add their partial sums into
//! the zeroed gradient with `atomicAdd`, as split-K does.
//!
//! Tiles reach shared memory through registers (load, store, barrier, multiply), by default;
//! `wgrad=pf` loads the next tile into registers during the products, and `wgrad=async` copies
//! it by `cp.async` into a second pair of buffers (conjugating where the products read it).

use super::*;
use crate::target::{WgradKernel, WgradOutputs, WgradStaging};

/// Pixel tile: `TH` rows of `TW` columns (layers with fewer input channels than a block has
/// channel threads use taller, narrower tiles: see `direct`).
const TW: usize = 16;
const TH: usize = 4;

/// The kernel variant; the target's [`WgradKernel`] overrides it for measurements: `Gemm`
/// turns the direct kernel off, [`WgradOutputs::Two`] / [`WgradOutputs::Four`] give each
/// thread two / four output channels, `staging` says how a pixel tile reaches shared memory
/// ([`WgradStaging`]).
struct Variant {
    ot: usize,
    staging: WgradStaging,
}

/// The variant for a layer with `cg` input channels per group. Measured on an H200
/// (bench/GPU-NOTES.md): four output channels per thread are faster for the seed network's
/// 32-input-channel layer (3.45 vs 3.61 ms), two for its 64-channel one (1.84 vs 1.91 ms),
/// where four would leave each block half as many pixels; prefetching was slower in both.
/// Layers with fewer than 8 input channels take two, which leaves 16 threads per output
/// channel group for rows of the pixel tile; so do layers with fewer than 16 output channels
/// per group, which four would leave with a block less than half full (`direct` then falls
/// back to the implicit GEMM).
fn variant(choice: WgradKernel, cg: usize, og: usize) -> Option<Variant> {
    let WgradKernel::Direct { outputs, staging } = choice else {
        return None;
    };
    let ot = match outputs {
        WgradOutputs::Four => 4,
        WgradOutputs::Two => 2,
        WgradOutputs::ByLayer if (8..=32).contains(&cg) && og >= 16 => 4,
        WgradOutputs::ByLayer => 2,
    };
    Some(Variant { ot, staging })
}

/// The direct kernel of a `Conv2dWeightGrad` node with stride 1 and dilation 1, or `None`
/// where the implicit GEMM serves (strided or dilated layers, outputs narrower or shorter than
/// a tile, fewer than 8 output channels per group, kernels of more than 9 taps, layers wide
/// enough for tensor cores at a reduced precision).
pub(crate) fn direct(ctx: &Ctx, v: Value, name: &str) -> CompileResult<Option<Kernel>> {
    let node = ctx.g.node(v);
    let Op::Conv2dWeightGrad { geom, kernel, conj } = &node.op else {
        return Ok(None);
    };
    if geom.stride != [1, 1] || geom.dilation != [1, 1] {
        return Ok(None);
    }
    let (x, dy) = (node.inputs[0], node.inputs[1]);
    let dims = |s: Vec<usize>| -> Option<[usize; 4]> { s.try_into().ok() };
    let (Some([nb, c, h, w]), Some([_, o, ho, wo])) = (dims(ctx.shape(x)), dims(ctx.shape(dy))) else {
        return Ok(None);
    };
    let [kh, kw] = *kernel;
    let groups = geom.groups;
    let (og, cg) = (o / groups, c / groups);
    if ctx.tensor_cores() && !super::conv::too_shallow_for_tensor_cores(cg * kh * kw) {
        return Ok(None);
    }
    let Some(var) = variant(ctx.target.kernels.wgrad, cg, og) else {
        return Ok(None);
    };
    let ot = var.ot;
    // Threads along output channels (`no`, each with `ot` channels) × `nc` others: `cl`
    // channel lanes × `pl` pixel lanes. With fewer input channels than `nc` (a first layer's
    // one channel) the spare threads take rows of the pixel tile instead (`pl` > 1), which
    // is then `pl` rows high and 8 columns wide to keep the staged output gradient in
    // shared memory.
    let no = og.div_ceil(ot).next_power_of_two().clamp(8, 32);
    let nc = 256 / no;
    let bo = no * ot;
    let cl = if cg >= nc { nc } else { cg.next_power_of_two() };
    let pl = nc / cl;
    let (th, tw) = if pl == 1 { (TH, TW) } else { (pl.max(TH), 8) };
    let (xh, xw) = (th + kh - 1, tw + kw - 1);
    // Odd strides (in complex elements) keep the threads of a warp on distinct banks.
    // With pixel lanes the threads of a warp also differ in row: odd row strides (in complex
    // elements) keep those rows on distinct banks too.
    let (drs, xrs) = if pl == 1 { (tw, xw) } else { (tw | 1, xw | 1) };
    let xsp = (xh * xrs) | 1;
    let dsp = (th * drs) | 1;
    let (t_dy, t_x, t_out) = (ctx.dtype(dy), ctx.dtype(x), node.ty.dtype);
    let elt = |d: DType| if d == DType::C64 { 8 } else { 4 };
    let smem = bo * dsp * elt(t_dy) + cl * xsp * elt(t_x);
    // `cp.async` copies need full-width operands (a copy cannot widen) and two pairs of
    // buffers; where they do not fit, the tiles go through registers.
    let full = !ctx.storage(dy).is_half() && !ctx.storage(x).is_half();
    let copies = var.staging == WgradStaging::Async
        && full
        && ctx.target.device.compute_capability >= (8, 0)
        && 2 * smem <= ctx.target.device.shared_per_block_optin;
    let tiles_y = ho.div_ceil(th);
    let tiles_x = wo.div_ceil(tw);
    let tiles = nb * tiles_y * tiles_x;
    // The pixel lanes' sums are added in the staged output gradient's shared memory.
    let reduce_fits = pl == 1 || bo * dsp * elt(t_dy) >= 256 * ot * kh * kw * elt(t_out);
    if pl > 16
        || !reduce_fits
        || og < bo / 2
        || wo < tw
        || ho < th
        || kh * kw > 9
        || smem > ctx.target.device.shared_per_block
        || tiles > ctx.target.device.max_grid[0]
    {
        return Ok(None);
    }
    // Every index is one of the three tensors' (the image `b` multiplies the strides).
    let index = ctx.indexing(&[x, dy, v], &[]);
    let (cchunks, ochunks) = (cg.div_ceil(cl), og.div_ceil(bo));
    let base_blocks = cchunks * ochunks * groups;
    let max_grid = ctx.target.device.max_grid;
    if base_blocks > max_grid[2] || cchunks > max_grid[1] {
        return Ok(None);
    }
    let splits = ctx.target.contraction_fill().div_ceil(base_blocks).clamp(1, tiles);
    let (ta, tb, tc) = (ctype(t_dy), ctype(t_x), ctype(t_out));
    let (px, pdy, pw) = (ctx.ptr(x)?, ctx.ptr(dy)?, ctx.ptr(v)?);
    // Conjugation where a value is first in registers: at the global load, or (copies land in
    // shared memory unchanged) at the shared-memory read.
    let ([load_x, load_d], [read_x, read_d]) = if copies { ([false; 2], *conj) } else { (*conj, [false; 2]) };
    let at_load = |on: bool, e: String| if on { format!("cj({e})") } else { e };
    let per_d = (bo * th * tw).div_ceil(256);
    let per_x = (cl * xh * xw).div_ceil(256);
    let (pad0, pad1) = (geom.pad[0] as i64, geom.pad[1] as i64);
    let mut s = String::new();
    let prefetch = var.staging == WgradStaging::Prefetch;
    let min_blocks = if prefetch { 1 } else { 2 };
    let _ =
        writeln!(s, "extern \"C\" __global__ void __launch_bounds__(256, {min_blocks}) {name}(char* A) {{");
    s.push_str(index.typedef());
    let _ = writeln!(
        s,
        "  const u32 tid = threadIdx.x, ci = tid % {cl}u, pli = (tid % {nc}u) / {cl}u, oi = tid / {nc}u;"
    );
    let _ = writeln!(
        s,
        "  const u32 c0 = blockIdx.y * {cl}u, o0 = (blockIdx.z / {groups}u) * {bo}u;\n  const ix g = blockIdx.z % {groups}u;"
    );
    let _ = writeln!(
        s,
        "  const u32 t_begin = (u32)(((unsigned long long)blockIdx.x * {tiles}ull) / {splits}ull), \
         t_end = (u32)(((unsigned long long)(blockIdx.x + 1u) * {tiles}ull) / {splits}ull);"
    );
    if copies {
        // Two pairs of buffers in dynamic shared memory: `Ds` / `Xs` point at the pair of the
        // tile being multiplied.
        let _ = writeln!(
            s,
            "  extern __shared__ __align__(16) unsigned char gemm_smem[];\n  \
             {ta}* const Dsb = reinterpret_cast<{ta}*>(gemm_smem);\n  \
             {tb}* const Xsb = reinterpret_cast<{tb}*>(gemm_smem + {}u);\n  {ta}* Ds = Dsb;\n  {tb}* Xs = Xsb;",
            2 * bo * dsp * elt(t_dy)
        );
    } else {
        let _ = writeln!(s, "  __shared__ {ta} Ds[{}];", bo * dsp);
        let _ = writeln!(s, "  __shared__ {tb} Xs[{}];", cl * xsp);
        let _ = writeln!(s, "  {ta} rd[{per_d}];\n  {tb} rx[{per_x}];");
    }
    let _ = writeln!(s, "  {tc} acc[{ot}][{kh}][{kw}];");
    let _ = writeln!(
        s,
        "  #pragma unroll\n  for (int t = 0; t < {ot}; ++t)\n    #pragma unroll\n    for (int i = 0; i < {kh}; ++i)\n      \
         #pragma unroll\n      for (int j = 0; j < {kw}; ++j) acc[t][i][j] = {};",
        czero(t_out)
    );
    // The two loops over a pixel tile `tl`'s elements, indented by `ind`: per element of the
    // output gradient (`e`, its channel `oc`, pixel `y`, `x`) the statements `d_tail`, per
    // element of the input with its halo (`e`, channel `cc`, pixel `y`, `x`) `x_tail`.
    let (d_ok, d_at) = (
        format!("oc < {og}u && y < {ho}u && x < {wo}u"),
        format!("((b * {o}u + g * {og}u + oc) * {ho}u + y) * {wo}u + x"),
    );
    let (x_ok, x_at) = (
        format!("cc < {cg}u && y >= 0 && y < {h} && x >= 0 && x < {w}"),
        format!("((b * {c}u + g * {cg}u + cc) * {h}u + (u32)y) * {w}u + (u32)x"),
    );
    let (tot_d, tot_x, pd, xhw) = (bo * th * tw, cl * xh * xw, th * tw, xh * xw);
    let tile_loops = |ind: &str, d_tail: &[String], x_tail: &[String]| {
        let i2 = format!("{ind}  ");
        format!(
            "{ind}const ix b = tl / {tyx}u;\n{ind}const u32 tt = tl % {tyx}u, y0 = (tt / {tiles_x}u) * {th}u, x0 = (tt % {tiles_x}u) * {tw}u;\n\
             {ind}#pragma unroll\n{ind}for (u32 r = 0; r < {per_d}u; ++r) {{\n{i2}const u32 e = tid + r * 256u, ol = e / {pd}u, p = e % {pd}u;\n\
             {i2}const u32 oc = o0 + ol, y = y0 + p / {tw}u, x = x0 + p % {tw}u;\n{i2}{}\n{ind}}}\n\
             {ind}#pragma unroll\n{ind}for (u32 r = 0; r < {per_x}u; ++r) {{\n{i2}const u32 e = tid + r * 256u, cl = e / {xhw}u, q = e % {xhw}u;\n\
             {i2}const u32 cc = c0 + cl;\n{i2}const int y = (int)y0 - {pad0} + (int)(q / {xw}u), x = (int)x0 - {pad1} + (int)(q % {xw}u);\n\
             {i2}{}\n{ind}}}\n",
            d_tail.join(&format!("\n{i2}")),
            x_tail.join(&format!("\n{i2}")),
            tyx = tiles_y * tiles_x,
        )
    };
    // Global loads of pixel tile `tl` into registers (zero outside the tensors).
    let fetch = format!(
        "    {{\n{}    }}\n",
        tile_loops(
            "      ",
            &[format!(
                "rd[r] = (e < {tot_d}u && {d_ok}) ? {} : {};",
                at_load(load_d, format!("{pdy}[{d_at}]")),
                czero(t_dy)
            )],
            &[format!(
                "rx[r] = (e < {tot_x}u && {x_ok}) ? {} : {};",
                at_load(load_x, format!("{px}[{x_at}]")),
                czero(t_x)
            )],
        )
    );
    // Offset of element `e` within its channel's staged tile (rows padded where `pl` > 1).
    let within = |n: usize, w: usize, rs: usize| {
        if rs == w {
            format!("e % {n}u")
        } else {
            format!("((e % {n}u) / {w}u) * {rs}u + e % {w}u")
        }
    };
    let (d_in, x_in) = (within(th * tw, tw, drs), within(xh * xw, xw, xrs));
    // Where element `e` lies in a buffer of the staged output gradient / input.
    let (d_slot, x_slot) =
        (format!("(e / {pd}u) * {dsp}u + {d_in}"), format!("(e / {xhw}u) * {xsp}u + {x_in}"));
    let store = format!(
        "    #pragma unroll\n    for (u32 r = 0; r < {per_d}u; ++r) {{\n      const u32 e = tid + r * 256u;\n      \
         if (e < {tot_d}u) Ds[{d_slot}] = rd[r];\n    }}\n    \
         #pragma unroll\n    for (u32 r = 0; r < {per_x}u; ++r) {{\n      const u32 e = tid + r * 256u;\n      \
         if (e < {tot_x}u) Xs[{x_slot}] = rx[r];\n    }}\n"
    );
    // The products of one pixel tile: per row, a kh × kw window of the staged input slides
    // along the columns (one new column of kh values per pixel).
    let mut body = String::new();
    let _ = writeln!(body, "    for (u32 r = pli; r < {th}u; r += {pl}u) {{");
    let _ = writeln!(body, "      const {tb}* xr = &Xs[ci * {xsp}u + r * {xrs}u];");
    let _ = writeln!(body, "      const {ta}* dr = &Ds[oi * {dsp}u + r * {drs}u];");
    let _ = writeln!(body, "      {tb} win[{kh}][{kw}];");
    if kw > 1 {
        let _ = writeln!(
            body,
            "      #pragma unroll\n      for (int i = 0; i < {kh}; ++i)\n        #pragma unroll\n        for (int j = 0; j + 1 < {kw}; ++j) win[i][j + 1] = {};",
            at_load(read_x, format!("xr[i * {xrs} + j]"))
        );
    }
    let _ = writeln!(body, "      #pragma unroll\n      for (int col = 0; col < {tw}; ++col) {{");
    let _ = writeln!(
        body,
        "        #pragma unroll\n        for (int i = 0; i < {kh}; ++i) {{\n          \
         #pragma unroll\n          for (int j = 0; j + 1 < {kw}; ++j) win[i][j] = win[i][j + 1];\n          \
         win[i][{kw1}] = {};\n        }}",
        at_load(read_x, format!("xr[i * {xrs} + col + {kw1}]", kw1 = kw - 1)),
        kw1 = kw - 1
    );
    let _ = writeln!(
        body,
        "        #pragma unroll\n        for (int t = 0; t < {ot}; ++t) {{\n          const {ta} d = {};\n          \
         #pragma unroll\n          for (int i = 0; i < {kh}; ++i)\n            #pragma unroll\n            for (int j = 0; j < {kw}; ++j) mac(acc[t][i][j], d, win[i][j]);\n        }}",
        at_load(read_d, format!("dr[t * {no} * {dsp} + col]"))
    );
    body.push_str("      }\n    }\n");
    if copies {
        // Tile `tl` copied into pair `buf` (zeros outside the tensors: a copy of size 0).
        let (dn, xn) = (bo * dsp, cl * xsp);
        let (cpd, cpx) = (copy_fn(t_dy), copy_fn(t_x));
        let _ = writeln!(
            s,
            "  auto issue = [&](u32 tl, u32 buf) {{\n{}  }};",
            tile_loops(
                "    ",
                &[
                    format!("const bool ok = {d_ok};"),
                    format!("const ix at = ok ? {d_at} : 0u;"),
                    format!(
                        "if (e < {tot_d}u) {cpd}(Dsb + buf * {dn}u + {d_slot}, (const float*)&{pdy}[at], ok);"
                    ),
                ],
                &[
                    format!("const bool ok = {x_ok};"),
                    format!("const ix at = ok ? {x_at} : 0u;"),
                    format!(
                        "if (e < {tot_x}u) {cpx}(Xsb + buf * {xn}u + {x_slot}, (const float*)&{px}[at], ok);"
                    ),
                ],
            )
        );
        let _ = writeln!(
            s,
            "  if (t_begin < t_end) issue(t_begin, 0u);\n  cp_async_commit();\n  \
             for (u32 tl = t_begin, ti = 0u; tl < t_end; ++tl, ++ti) {{\n    \
             if (tl + 1u < t_end) issue(tl + 1u, (ti + 1u) & 1u);\n    cp_async_commit();\n    \
             cp_async_wait<1>();\n    __syncthreads();\n    Ds = Dsb + (ti & 1u) * {dn}u;\n    Xs = Xsb + (ti & 1u) * {xn}u;"
        );
    } else if prefetch {
        let _ = writeln!(s, "  if (t_begin < t_end) {{\n    const u32 tl = t_begin;\n{fetch}  }}");
        let _ = writeln!(s, "  for (u32 t0 = t_begin; t0 < t_end; ++t0) {{");
        s.push_str(&store);
        s.push_str("    __syncthreads();\n");
        let _ = writeln!(s, "    if (t0 + 1u < t_end) {{\n      const u32 tl = t0 + 1u;\n{fetch}    }}");
    } else {
        let _ = writeln!(s, "  for (u32 tl = t_begin; tl < t_end; ++tl) {{");
        s.push_str(&fetch);
        s.push_str(&store);
        s.push_str("    __syncthreads();\n");
    }
    s.push_str(&body);
    s.push_str("    __syncthreads();\n  }\n");
    // Pixel lanes first add their partial sums in shared memory (the staged output gradient's
    // space), so one thread per (channel, output channels) issues the atomics: a first layer
    // has few weights, and every block adding into them from 16 lanes would serialise on them.
    if pl > 1 {
        let acc_n = ot * kh * kw;
        let _ = writeln!(
            s,
            "  __syncthreads();\n  {tc}* red = ({tc}*)Ds;\n  #pragma unroll\n  for (int t = 0; t < {ot}; ++t)\n    #pragma unroll\n    for (int i = 0; i < {kh}; ++i)\n      \
             #pragma unroll\n      for (int j = 0; j < {kw}; ++j) red[((t * {kh} + i) * {kw} + j) * 256 + tid] = acc[t][i][j];\n  __syncthreads();\n  \
             if (pli != 0u) return;\n  #pragma unroll\n  for (int k = 0; k < {acc_n}; ++k)\n    for (u32 p = 1u; p < {pl}u; ++p) {{\n      \
             {tc}& a = acc[k / {khw}][(k / {kw}) % {kh}][k % {kw}];\n      a = add(a, red[k * 256 + tid + p * {cl}u]);\n    }}",
            khw = kh * kw
        );
    }
    let _ = writeln!(
        s,
        "  const u32 cc = c0 + ci;\n  if (cc >= {cg}u) return;\n  #pragma unroll\n  for (int t = 0; t < {ot}; ++t) {{\n    \
         const u32 oc = o0 + oi + (u32)t * {no}u;\n    if (oc >= {og}u) continue;\n    \
         #pragma unroll\n    for (int i = 0; i < {kh}; ++i)\n      #pragma unroll\n      for (int j = 0; j < {kw}; ++j)\n        \
         atomic_acc(&{pw}[((g * {og}u + oc) * {cg}u + cc) * {khw}u + i * {kw}u + j], acc[t][i][j]);\n  }}\n}}",
        khw = kh * kw
    );
    Ok(Some(Kernel {
        code: s,
        grid: [splits as u32, cchunks as u32, (groups * ochunks) as u32],
        block: [256, 1, 1],
        zero: vec![(ctx.offset(v)?, ctx.bytes(v))],
        scratch: 0,
        pre: None,
        post: None,
        shared: if copies { 2 * smem } else { 0 },
        index,
    }))
}

/// The `cp.async` helper of the prelude that copies one element of dtype `d`.
fn copy_fn(d: DType) -> &'static str {
    if d == DType::C64 {
        "cp_async8"
    } else {
        "cp_async4"
    }
}
