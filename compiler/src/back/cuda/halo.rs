//! Stride-1 convolutions and their input gradients on Hopper's `wgmma` from a staged halo tile
//! (input gradients by default, [`TcConv::Grad`]; forward layers too under `tcconv=halo`).
//!
//! The implicit GEMM of `gemm.rs` copies its patch operand element by element into
//! shared memory: for a 3 × 3 layer every input element is copied nine times, once per tap,
//! each copy with its own index arithmetic, and those copies bound the seed network's
//! convolution kernels more than their products do (bench/GPU-NOTES.md). Here a block of 64 or
//! 128 output pixels (whole image rows) copies the input rows its pixels read, with their halo
//! and zeros outside the image, once per 16 input channels; every tap then reads the same copy
//! at its own offset. The product's rows are the pixels: each thread loads its fragment of A
//! (`wgmma`'s row operand, from registers) straight from the staged rows, at the position of
//! its fragment's pixel plus the tap's offset, so no K-major copy of the patch exists. The
//! weights (B, the output channels) go through the ring of K tiles of the GEMM: per tile one
//! tap and 16 input channels, copied by `cp.async` into K-major core-matrix planes.
//!
//! K runs over input-channel chunks, and within a chunk over taps. The chunk's input rows are
//! copied together with the first weight tile of the chunk, `stages − 1` tiles ahead, into the
//! other of two buffers; a tile waits for its copies, one barrier, issues its products, the
//! copies of the tile `stages − 1` ahead, and waits for its products (as `wgwait=0`).
//!
//! A transposed convolution with stride 1 (a convolution's input gradient) is the same
//! correlation with mirrored taps and the weight's channel axes swapped (as in `conv.rs`).
//!
//! Complex operands are staged interleaved (re, im): a fragment element is one 8-byte load
//! that gives both the real and the imaginary fragment. Each input channel's plane is padded
//! to a float2 count of 4 or 12 modulo 16, so the four channels and eight pixels of a
//! half-warp's loads fall on 32 distinct banks.
//!
//! Under `tc16=wgmma` (16-bit products, see `gemm.rs`'s `emit_wgmma`) the input rows stored in
//! bf16 or f16 are staged as their raw 32-bit (re, im) pairs, copied by `cp.async`, and each
//! register of a thread's 16-deep fragment is one such pair (the fragment's two consecutive
//! K are re and im of one channel); the weights are expanded into `[re, −im]` and `[im, re]`
//! planes rounded to the format, and each 8-channel step is two products, re and im. A plane
//! is padded to 8 or 24 words modulo 32 (the same 32 distinct banks).

use super::gemm::Half;
use super::*;
use crate::target::{TcConv, TcHalf, TcMma};

/// Input channels per staged chunk and per K tile: two 8-deep `wgmma` steps.
const KC: usize = 16;

/// The halo-tile kernel of a stride-1 `ConvTranspose2d` node (or `Conv2d` under
/// [`TcConv::Halo`]) at `precision = tf32` (or `bf16 | fp16` under `tc16=tf32`, widened, or
/// `tc16=wgmma`, in 16-bit pairs), or `None` where the implicit GEMM serves: other
/// kernel choices or precisions, devices other than compute capability 9.0, strided, dilated
/// or grouped layers,
/// real or 16-bit operands, fewer than 16 input channels or a count not a multiple of 16, a
/// single tap, output channels that no `wgmma` width divides, images whose rows do not tile
/// 64 or 128 pixels, or tiles that do not fit the device's shared memory.
pub(crate) fn conv(ctx: &Ctx, v: Value, name: &str) -> CompileResult<Option<Kernel>> {
    let kc = &ctx.target.kernels;
    // At the 16-bit precisions under `tc16=tf32` (`auto`'s choice here) the products are TF32
    // too: the input rows and the output stored in 16 bits, the (32-bit) weights read as TF32.
    // Under `tc16=wgmma` the products are 16-bit (`pairs`): the input rows' (re, im) pairs are
    // copied raw and each fragment register is one of them; the weights expanded into
    // `[re, −im]` and `[im, re]` planes rounded to the format (see `gemm.rs`'s `emit_wgmma`).
    // (An input not stored in the format, a model's 32-bit input, takes the TF32 products.)
    let choice = kc.tc16_for(&ctx.target.device);
    let pairs = match ctx.precision() {
        Precision::Bf16 => Some(Half::Bf16),
        Precision::Fp16 => Some(Half::F16),
        _ => None,
    }
    .filter(|h| {
        choice == TcHalf::Wgmma
            && ctx.g.node(v).inputs.first().is_some_and(|&x| ctx.storage(x) == h.storage())
    });
    let tf32_products = match ctx.precision() {
        Precision::Tf32 => true,
        Precision::Bf16 | Precision::Fp16 => matches!(choice, TcHalf::Tf32 | TcHalf::Wgmma),
        _ => false,
    };
    if kc.tc_conv == TcConv::Gemm
        || kc.tc_mma != TcMma::Wgmma
        || !tf32_products
        || ctx.target.device.compute_capability != (9, 0)
    {
        return Ok(None);
    }
    let node = ctx.g.node(v);
    let (x, w) = (node.inputs[0], node.inputs[1]);
    if [x, w, v].iter().any(|&u| ctx.dtype(u) != DType::C64) || ctx.storage(w).is_half() {
        return Ok(None);
    }
    // A 16-bit input cannot be copied by `cp.async` (which moves bytes as they are): each
    // thread loads its elements, widens them (exactly) and stores them into the buffer.
    let x_half = ctx.storage(x).is_half();
    let dims = |s: Vec<usize>| -> Option<[usize; 4]> { s.try_into().ok() };
    let (Some(xs), Some(ws), Some(os)) = (dims(ctx.shape(x)), dims(ctx.shape(w)), dims(ctx.shape(v))) else {
        return Ok(None);
    };
    let (geom, conj, transposed) = match &node.op {
        Op::Conv2d { geom, conj } if kc.tc_conv == TcConv::Halo => (geom, conj, false),
        Op::ConvTranspose2d { geom, conj, .. } => (geom, conj, true),
        _ => return Ok(None),
    };
    if geom.stride != [1, 1] || geom.dilation != [1, 1] || geom.groups != 1 {
        return Ok(None);
    }
    let [nb, cin, hin, win] = xs;
    let [_, cout, hout, wout] = os;
    let [kh, kw] = [ws[2], ws[3]];
    let taps = kh * kw;
    // Output channels per block: one `wgmma` width.
    let bn = match cout {
        32 | 64 | 96 | 128 => cout,
        c if c % 128 == 0 => 128,
        c if c % 64 == 0 => 64,
        _ => return Ok(None),
    };
    let hw = hout * wout;
    let Some(bm) = [128, 64].into_iter().find(|&bm| hw % bm == 0 && bm % wout == 0) else {
        return Ok(None);
    };
    if cin % KC != 0 || taps < 2 {
        return Ok(None);
    }
    // K tiles per output tile.
    let tiles = cin / KC * taps;
    let warpgroups = bm / 64;
    let threads = 128 * warpgroups;
    // The staged rows: `rows` output rows read `rows + kh − 1` input rows of `wout + kw − 1`
    // columns; a channel's plane padded to 4 or 12 float2 modulo 16 (see the module's note).
    let rows = bm / wout;
    let pitch = wout + kw - 1;
    let positions = (rows + kh - 1) * pitch;
    // (In 32-bit pairs, 8 or 24 modulo 32 words: the four channels' eight pixels likewise.)
    let plane = match pairs {
        None => (positions..).find(|p| p % 16 == 4 || p % 16 == 12).unwrap_or(positions),
        Some(_) => (positions..).find(|p| p % 32 == 8 || p % 32 == 24).unwrap_or(positions),
    };
    // Words per element of the staged rows.
    let elem = if pairs.is_some() { 1 } else { 2 };
    let x_floats = 2 * KC * plane * elem;
    let stage_floats = 2 * bn * KC;
    let optin = ctx.target.device.shared_per_block_optin;
    // The ring: `stages − 1` tiles ahead, at most a chunk's taps (a chunk's rows are copied
    // with its first tile into the buffer of the chunk two back, whose last tile must be done).
    let most = kc.tc_stages.clamp(2, taps + 1);
    let Some(stages) = (2..=most).rev().find(|&s| 4 * (x_floats + s * stage_floats) <= optin) else {
        return Ok(None);
    };
    let ahead = stages - 1;
    let shared = 4 * (x_floats + stages * stage_floats);
    let tiles_per_image = hw / bm;
    // Two blocks per SM where their accumulators (64 a thread) leave the registers for it and
    // two tiles fit the SM's shared memory (1 KiB more than a block may opt in to, each block
    // reserving 1 KiB); `tcblocks=N` overrides.
    let min_blocks = match kc.tc_min_blocks {
        Some(n) => n.clamp(1, 2048 / threads),
        None if bn <= 64 && 2 * (shared + 1024) <= optin + 1024 => 2,
        None => 1,
    };
    // Each block runs `per_block` consecutive output tiles, one after the other, as one stream
    // of K tiles: the next output tile's first rows and weights are copied while the current
    // one's last products run. As many blocks as stay resident at once, so that no block
    // starts late. (Measured on an H100 against one output tile per block: the same step
    // times, bench/GPU-NOTES.md; kept because it never waits for a tile's first copies.)
    let resident = (1..=min_blocks).rev().find(|&k| k * (shared + 1024) <= optin + 1024).unwrap_or(1);
    let out_tiles = nb * tiles_per_image;
    let slots = (ctx.target.device.sm_count * resident / (cout / bn)).max(1);
    let per_block = out_tiles.div_ceil(slots);
    let blocks_y = out_tiles.div_ceil(per_block);
    let grid = Grid::new(ctx, [cout / bn, blocks_y, 1], &format!("the halo-tile kernel of {v}"))?;
    let index = ctx.indexing(&[x, w, v], &[nb * tiles_per_image * bm, cout * cin * taps * 2]);
    let (px, pw, po) = (ctx.ptr(x)?, ctx.ptr(w)?, ctx.ptr(v)?);
    // Input row / column of the staged rows' first element relative to the tile's first
    // output pixel, and the staged row / column a weight tap reads relative to its pixel.
    let (base_y, base_x) = if transposed {
        (geom.pad[0] as i64 - (kh - 1) as i64, geom.pad[1] as i64 - (kw - 1) as i64)
    } else {
        (-(geom.pad[0] as i64), -(geom.pad[1] as i64))
    };
    let (tap_row, tap_col) = if transposed {
        (format!("({}u - t / {kw}u)", kh - 1), format!("({}u - t % {kw}u)", kw - 1))
    } else {
        (format!("(t / {kw}u)"), format!("(t % {kw}u)"))
    };
    // Float index of the real part of weight (output channel `n`, input channel `c`, tap `t`).
    let widx = if transposed {
        format!("2u * ((({{c}}) * {cout}u + ({{n}})) * {taps}u + t)")
    } else {
        format!("2u * ((({{n}}) * {cin}u + ({{c}})) * {taps}u + t)")
    };
    let mut c = String::new();
    let _ = writeln!(
        c,
        "extern \"C\" __global__ void __launch_bounds__({threads}, {min_blocks}) {name}(char* A) {{"
    );
    c.push_str(index.typedef());
    let [gx, gy, _] = &grid.coords;
    let _ = writeln!(
        c,
        "  const u32 tid = threadIdx.x, lane = tid & 31u, wg = tid >> 7, wl = (tid >> 5) & 3u;\n  \
         const ix n0 = {gx} * {bn}u, pt0 = {gy} * {per_block}u;\n  \
         const u32 fend = (u32)min((ix){per_block}u, (ix){out_tiles}u - pt0) * {tiles}u;\n  \
         extern __shared__ __align__(16) unsigned char gemm_smem[];\n  \
         {xs_type}* const xs = reinterpret_cast<{xs_type}*>(gemm_smem);\n  \
         float* const bs = reinterpret_cast<float*>(gemm_smem) + {x_floats}u;\n  \
         auto PBr = [&](u32 s) -> float* {{ return bs + s * {stage_floats}u; }};\n  \
         auto PBi = [&](u32 s) -> float* {{ return bs + s * {stage_floats}u + {}u; }};\n  \
         float cr[{h}] = {{}};\n  float ci[{h}] = {{}};",
        bn * KC,
        h = bn / 2,
        xs_type = if pairs.is_some() { "u32" } else { "float2" },
    );
    // The thread's fragment rows (pixels 16·wl + lane/4 and + 8 of its warpgroup's 64) as
    // positions in the staged rows, in the plane of its fragment column (channel lane % 4).
    let _ = writeln!(
        c,
        "  const u32 pr = wg * 64u + wl * 16u + (lane >> 2), pr8 = pr + 8u;\n  \
         const u32 xo0 = (lane & 3u) * {plane}u + (pr / {wout}u) * {pitch}u + pr % {wout}u;\n  \
         const u32 xo1 = (lane & 3u) * {plane}u + (pr8 / {wout}u) * {pitch}u + pr8 % {wout}u;"
    );
    // The chunk's rows: element q of the 16 planes, consecutive threads along a row.
    let total_x = KC * positions;
    let per_x = total_x.div_ceil(threads);
    let in_range =
        if total_x.is_multiple_of(threads) { String::new() } else { format!("if (q < {total_x}u) ") };
    let _ = writeln!(
        c,
        "  const float* const xg = reinterpret_cast<const float*>({px});\n  \
         auto fetch_x = [&](ix pt, u32 c0, u32 xb) {{\n    \
         const ix b = pt / {tiles_per_image}u;\n    const int y0 = (int)((pt % {tiles_per_image}u) * {}u);\n    #pragma unroll\n    for (u32 e = 0; e < {per_x}u; ++e) {{\n      \
         const u32 q = tid + e * {threads}u;\n      {in_range}{{\n        \
         const u32 ch = q / {positions}u, p = q % {positions}u;\n        \
         const int y = y0 + ({base_y}) + (int)(p / {pitch}u), xx = ({base_x}) + (int)(p % {pitch}u);\n        \
         const bool ok = (u32)y < {hin}u && (u32)xx < {win}u;\n        \
         const ix at = ((b * {cin}u + c0 + ch) * {hin}u + (ix)(ok ? y : 0)) * {win}u + (ix)(ok ? xx : 0);\n        \
         {copy}\n      }}\n    }}\n  }};",
        rows,
        copy = if pairs.is_some() {
            format!(
                "cp_async4(reinterpret_cast<float*>(xs + xb * {}u + ch * {plane}u + p), (const float*)({px} + at), ok);",
                KC * plane
            )
        } else if x_half {
            format!(
                "const float2 w = (float2){px}[ok ? at : (ix)0];\n        xs[xb * {}u + ch * {plane}u + p] = ok ? w : make_float2(0.0f, 0.0f);",
                KC * plane
            )
        } else {
            format!("cp_async8(xs + xb * {}u + ch * {plane}u + p, xg + 2u * at, ok);", KC * plane)
        },
    );
    // The weights of tap `t`, input channels [c0, c0 + 16), output channels [n0, n0 + bn):
    // element (n, k) at the thread's k = (tid / 8) % 16 and n = 8·(tid / 128) + tid % 8 + r·step,
    // so a warp's 32 copies are 8 rows by 4 columns of the planes (32 distinct banks).
    let per_b = bn * KC / threads;
    let step = threads / 16;
    let cm_step = step / 8 * 128;
    let wi = |n: &str, ch: &str| widx.replace("{n}", n).replace("{c}", ch);
    let sign = |conj: bool| if conj { -1 } else { 1 };
    let (sa, sb) = (sign(conj[0]), sign(conj[1]));
    let neg = |s: i32| if s < 0 { "-" } else { "" };
    // `wexpand=pre` (see `gemm.rs`'s `emit_wgmma`): the weights' expansion written once per
    // step into the staging buffer by a kernel before this one, and copied from there as it is
    // (two words an element, at the weight's own indices).
    let staged = pairs.filter(|_| {
        kc.tc_expand_pre
            && matches!(ctx.g.node(w).op, Op::Param { .. })
            && 8 * ctx.g.ty(w).shape.numel(ctx.batch) <= ctx.stage.1
    });
    let pre = match staged {
        Some(half) => {
            let pre_name = format!("{name}_w");
            Some((pre_name.clone(), Box::new(super::gemm::stage_kernel(ctx, w, half, (sa, sb), &pre_name)?)))
        }
        None => None,
    };
    let pw = if staged.is_some() { format!("((float2*)(A + {}ull))", ctx.stage.0) } else { pw };
    let copy_b = match pairs.filter(|_| staged.is_none()) {
        // The expansion of weight w by the input's pairs x: [wr, −sx·sw·wi] and [sw·wi, sx·wr].
        Some(half) => format!(
            "const float2 w = *reinterpret_cast<const float2*>(wg_ + wix);\n      \
             {{ {t} q; q = make_float2(w.x, {}w.y); PBr(s)[bo + r * {cm_step}u] = __uint_as_float(q.u); }}\n      \
             {{ {t} q; q = make_float2({}w.y, {}w.x); PBi(s)[bo + r * {cm_step}u] = __uint_as_float(q.u); }}",
            neg(-sa * sb),
            neg(sb),
            neg(sa),
            t = match half {
                Half::Bf16 => "cbf16s",
                Half::F16 => "cf16s",
            },
        ),
        None => format!(
            "cp_async4(PBr(s) + bo + r * {cm_step}u, wg_ + wix, true);\n      \
             cp_async4(PBi(s) + bo + r * {cm_step}u, wg_ + wix + 1u, true);"
        ),
    };
    let _ = writeln!(
        c,
        "  const u32 bk = (tid >> 3) & 15u, bn_ = (tid >> 7) * 8u + (tid & 7u);\n  \
         const u32 bo = (bn_ >> 3) * 128u + (bk >> 2) * 32u + (bn_ & 7u) * 4u + (bk & 3u);\n  \
         const float* const wg_ = reinterpret_cast<const float*>({pw});\n  \
         auto fetch_b = [&](u32 c0, u32 t, u32 s) {{\n    #pragma unroll\n    for (u32 r = 0; r < {per_b}u; ++r) {{\n      \
         const ix wix = {};\n      \
         {copy_b}\n    }}\n  }};",
        wi(&format!("n0 + bn_ + r * {step}u"), "c0 + bk"),
    );
    let _ = writeln!(
        c,
        "  auto fetch = [&](u32 f) {{\n    const u32 q = f % {tiles}u / {taps}u, t = f % {taps}u;\n    \
         if (t == 0u) fetch_x(pt0 + f / {tiles}u, q * {KC}u, (f / {taps}u) & 1u);\n    fetch_b(q * {KC}u, t, f % {stages}u);\n  }};\n  \
         #pragma unroll\n  for (u32 f = 0; f < {ahead}u; ++f) {{\n    if (f < fend) fetch(f);\n    cp_async_commit();\n  }}\n  \
         u32 s = 0;\n  for (u32 f = 0; f < fend; ++f) {{\n    cp_async_wait<{}>();\n    fence_async_shared();\n    __syncthreads();\n    wgmma_fence();\n    \
         const u32 t = f % {taps}u;\n    \
         const {xs_type}* const xa = xs + ((f / {taps}u) & 1u) * {} + {tap_row} * {pitch}u + {tap_col};\n    \
         #pragma unroll\n    for (u32 j = 0; j < 2u; ++j) {{\n      \
         const {xs_type} a0 = xa[xo0 + j * {}u], a1 = xa[xo1 + j * {}u], a2 = xa[xo0 + j * {}u + {}u], a3 = xa[xo1 + j * {}u + {}u];\n      \
         {fragments}\n      \
         wgmma_fence();",
        ahead - 1,
        KC * plane,
        8 * plane,
        8 * plane,
        8 * plane,
        4 * plane,
        8 * plane,
        4 * plane,
        xs_type = if pairs.is_some() { "u32" } else { "float2" },
        // A fragment register is one staged pair (16-bit), or one part of a staged element.
        fragments = if pairs.is_some() {
            "const u32 fA[4] = {a0, a1, a2, a3};"
        } else {
            "const u32 fAr[4] = {__float_as_uint(a0.x), __float_as_uint(a1.x), __float_as_uint(a2.x), __float_as_uint(a3.x)};\n      \
             const u32 fAi[4] = {__float_as_uint(a0.y), __float_as_uint(a1.y), __float_as_uint(a2.y), __float_as_uint(a3.y)};"
        },
    );
    let (lbo, sbo) = (128, KC / 4 * 128);
    if let Some(half) = pairs {
        let bf = matches!(half, Half::Bf16);
        for (acc, b) in [("cr", "Br"), ("ci", "Bi")] {
            let _ = writeln!(
                c,
                "      wgmma16<{bn}, {bf}>({acc}, fA, wgmma_desc(P{b}(s) + j * 64u, {lbo}u, {sbo}u));"
            );
        }
    }
    for (acc, a, b, s_a, s_b) in [
        ("cr", "Ar", "Br", 1, 1),
        ("cr", "Ai", "Bi", -sa * sb, 1),
        ("ci", "Ar", "Bi", 1, sb),
        ("ci", "Ai", "Br", sa, 1),
    ]
    .into_iter()
    .filter(|_| pairs.is_none())
    {
        let _ = writeln!(
            c,
            "      wgmma_tf32<{bn}, {s_a}, {s_b}>({acc}, f{a}, wgmma_desc(P{b}(s) + j * 64u, {lbo}u, {sbo}u));"
        );
    }
    let _ = writeln!(
        c,
        "    }}\n    wgmma_commit();\n    if (f + {ahead}u < fend) fetch(f + {ahead}u);\n    cp_async_commit();\n    wgmma_wait<0>();\n    \
         s = s + 1u == {stages}u ? 0u : s + 1u;\n    \
         if (f % {tiles}u != {}u) continue;"
        ,
        tiles - 1
    );
    let _ = writeln!(
        c,
        "    // The output tile is done: its values out, the accumulators cleared.\n    \
         const ix pt = pt0 + f / {tiles}u, b = pt / {tiles_per_image}u, p0 = (pt % {tiles_per_image}u) * {bm}u;\n    \
         #pragma unroll\n    for (int i = 0; i < {}; ++i)\n      #pragma unroll\n      for (int q = 0; q < 4; ++q) {{\n        \
         const ix p = p0 + wg * 64u + wl * 16u + (lane >> 2) + (q >= 2 ? 8u : 0u), n = n0 + i * 8u + 2u * (lane & 3u) + (q & 1);\n        \
         {po}[(b * {cout}u + n) * {hw}u + p] = make_float2(cr[4 * i + q], ci[4 * i + q]);\n        \
         cr[4 * i + q] = 0.0f;\n        ci[4 * i + q] = 0.0f;\n      }}\n  }}\n}}",
        bn / 8,
    );
    Ok(Some(Kernel {
        code: c,
        grid: grid.launch,
        block: [threads as u32, 1, 1],
        zero: Vec::new(),
        scratch: 0,
        pre,
        post: None,
        shared,
        index,
    }))
}
