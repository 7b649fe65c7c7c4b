//! Contraction kernels: matmul and the convolution family as one tiled implicit-GEMM template.
//!
//! Every contraction is `C[g][m][n] = Σ_k A[g](m, k) · B[g](k, n)` for `g` over channel
//! groups, where `A` and `B` are gathers generated per op (the convolution's input patches
//! are read in place: no im2col buffer). A block computes a `BM × BN` tile with 16 × 16
//! threads, each holding a `BM/16 × BN/16` register tile, stepping through K 16 at a time
//! through shared memory. When the tiles alone cannot fill the GPU the K range is split over
//! blocks that accumulate into the (zeroed) output with `atomicAdd`.

use super::*;

const BK: usize = 16;

/// K depth of the fp32 kernel's shared-memory tiles: [`BK`], or 32 where the target's kernel
/// choices ask for deep tiles (for measurements: half the barriers per multiply-add, twice
/// the shared memory).
fn fp32_bk(ctx: &Ctx) -> usize {
    if ctx.target.kernels.deep_k_tiles {
        32
    } else {
        BK
    }
}

/// What a contraction's GEMM reads and writes, as C code.
struct Gemm {
    m: usize,
    n: usize,
    k: usize,
    groups: usize,
    ta: DType,
    tb: DType,
    tc: DType,
    /// The element `A(g, m, k)`.
    load_a: Load,
    /// The element `B(g, k, n)`.
    load_b: Load,
    /// The output element `C(g, m, n)` as an lvalue.
    out: String,
    /// Whether consecutive threads should walk `k` (contiguous in memory) when loading.
    a_k_fast: bool,
    b_k_fast: bool,
    /// The convolution taps' table that `load_b` reads (tensor-core kernels).
    taps: Option<TapTable>,
    /// Per-channel sums of a convolution's output that the `wgmma` kernel computes in its
    /// epilogue (`convstats=fuse`; [`contraction_summing`]).
    sums: Option<GemmSums>,
}

/// The sums a `wgmma` convolution computes from the outputs it stores: each block adds its
/// tile's values per channel (f32 over the tile's row, then the quad of threads sharing the
/// row) and stores one f32 partial per channel, accumulator and tile at byte offset
/// `scratch` (`[value][tile]`: 8 MiB for the seed network's conv2 at batch 1024); a second
/// kernel adds each value's partials in f64 in a fixed order (a strided pass, then a tree)
/// and stores the sums, so they do not depend on the order the blocks ran in.
struct GemmSums {
    sums: super::conv::Sums,
    scratch: usize,
    /// Output height × width and width (the coordinates of pixel `n`).
    hw: (usize, usize),
    /// Output channels in all (groups × per group).
    channels: usize,
}

/// A table in shared memory of a convolution's taps, filled once per block: for tap `t` =
/// (channel `c`, kernel row `i`, column `j`), the offset of the element it reads relative to
/// its pixel, `c·plane + dy·row + dx`, and `(dy, dx)` packed in 16 bits each, where
/// `dy = ai·i + by` and `dx = aj·j + bx`. A tensor-core tile's gather of a patch element then
/// costs a shared load (one address per warp: its threads share the tap) and a bounds test,
/// instead of four divisions by constants and the index products (bench/GPU-NOTES.md).
///
/// Under `tctaps=mask` ([`TapGather::Mask`]) the second field is instead the bit `1 << r` of
/// the tap's place `r` in the kernel window (`i·kw + j`), and each thread computes for its
/// pixel, once, the mask of the window's places inside the image ([`TapTable::window_mask`]):
/// an element is then in the image where its bit is set.
struct TapTable {
    /// Whether entries hold the window place, for a mask ([`TapGather::Mask`]).
    mask: bool,
    taps: usize,
    khw: usize,
    kw: usize,
    /// Elements per channel and per row of the tensor read.
    plane: usize,
    row: usize,
    dy: (i64, i64),
    dx: (i64, i64),
}

impl TapTable {
    /// Taps a table holds at most (8 KiB of shared memory).
    const MAX_TAPS: usize = 1024;

    /// The table, where the tensor-core kernels take one and its entries fit their fields.
    fn new(ctx: &Ctx, t: TapTable) -> Option<TapTable> {
        let span = |(a, b): (i64, i64), n: usize| [b, a * (n as i64 - 1) + b];
        let (dys, dxs) = (span(t.dy, t.khw / t.kw), span(t.dx, t.kw));
        let fits16 = dys.iter().chain(&dxs).all(|d| d.abs() < 1 << 15);
        // The largest offset, `c·plane + dy·row + dx` (int arithmetic in the fill).
        let most = |d: [i64; 2]| d.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0);
        let channels = (t.taps / t.khw) as u64;
        let offset = channels * t.plane as u64 + most(dys) * t.row as u64 + most(dxs);
        let fits32 = offset < 1 << 30;
        let gather = ctx.target.kernels.tc_taps;
        let chosen = ctx.tensor_cores() && gather != TapGather::Index;
        // A window's places are the bits of a 32-bit mask. Where a mask does not apply (the
        // weight gradient, whose pixel runs along K; windows of more than 32 taps), `mask`
        // gathers by index.
        let mask = t.mask && gather == TapGather::Mask && t.khw <= 32;
        let chosen = chosen && (mask || gather == TapGather::Table);
        (chosen && t.taps <= Self::MAX_TAPS && fits16 && fits32).then_some(TapTable { mask, ..t })
    }

    /// The declaration of `vm`, the mask of the kernel window's places that fall inside the
    /// `h × w` image for the pixel whose window starts at row `y` and column `x` (C
    /// expressions; place `i·kw + j` reads row `y + dy(i)`, column `x + dx(j)`).
    fn window_mask(&self, y: &str, x: &str, h: usize, w: usize) -> String {
        let TapTable { khw, kw, dy: (ai, by), dx: (aj, bx), .. } = *self;
        let kh = khw / kw;
        let rows: Vec<String> = (0..kh)
            .map(|i| {
                let bits = ((1u64 << kw) - 1) << (i * kw);
                format!("((u32)((int)({y}) + ({})) < {h}u ? {bits}u : 0u)", ai * i as i64 + by)
            })
            .collect();
        let cols: Vec<String> = (0..kw)
            .map(|j| {
                let bits: u64 = (0..kh).map(|i| 1u64 << (i * kw + j)).sum();
                format!("((u32)((int)({x}) + ({})) < {w}u ? {bits}u : 0u)", aj * j as i64 + bx)
            })
            .collect();
        format!("const u32 vm = ({}) & ({});\n      ", rows.join(" | "), cols.join(" | "))
    }

    /// Entries of the table: its taps, and under a mask [`BK`] more that read as no place.
    fn len(&self) -> usize {
        self.taps + if self.mask { BK } else { 0 }
    }

    /// Declarations and the fill loop of the table `taps` (then a barrier), for `threads`.
    fn fill(&self, threads: usize) -> String {
        let TapTable { mask, taps, khw, kw, plane, row, dy: (ai, by), dx: (aj, bx) } = *self;
        let second = if mask { "(int)(1u << r)" } else { "(int)((u32)dy << 16 | ((u32)dx & 0xffffu))" };
        // Under a mask, entries past the taps up to a K tile further read as no place.
        let (len, pad) = if mask {
            (
                self.len(),
                format!("\n  if (threadIdx.x < {BK}u) taps[{taps}u + threadIdx.x] = make_int2(0, 0);"),
            )
        } else {
            (taps, String::new())
        };
        format!(
            "  __shared__ int2 taps[{len}];\n  for (u32 t = threadIdx.x; t < {taps}u; t += {threads}u) {{\n    \
             const int c = (int)(t / {khw}u), r = (int)(t % {khw}u), i = r / {kw}, j = r % {kw};\n    \
             const int dy = i * ({ai}) + ({by}), dx = j * ({aj}) + ({bx});\n    \
             taps[t] = make_int2(c * {plane} + dy * {row} + dx, {second});\n  }}{pad}\n  __syncthreads();\n"
        )
    }
}

fn conj_if(c: bool, x: String) -> String {
    if c {
        format!("cj({x})")
    } else {
        x
    }
}

/// Where a GEMM operand's element lives: `pre` (declarations), `guard` (a condition, empty
/// for none, outside which the element is padding and reads as zero), then the element
/// `ptr[idx]`, conjugated if `conj`. The kernels compute the element's index first
/// ([`Load::index`]) and then load it ([`Load::fetch`]) or copy it asynchronously: the index
/// arithmetic has no branches, so the loads of a tile can all be in flight at once (a gather
/// that returned early for padding put every load in its own branch, and each load waited
/// for its data before the next one was issued: bench/GPU-NOTES.md).
#[derive(Clone)]
struct Load {
    /// Declarations that read only `k`: the tensor-core kernels compute them once for the
    /// elements of a tile that share a `k`.
    pre_k: String,
    /// Declarations that read only the operand's other index (`m` of A, `n` of B), likewise.
    pre_x: String,
    /// Declarations that read both (after the two above).
    pre: String,
    guard: String,
    ptr: String,
    idx: String,
    conj: bool,
    /// Whether `guard` alone makes an element past K zero, for any `k` below K rounded up to a
    /// K tile ([`TapTable`]'s padding under `tctaps=mask`): the `wgmma` fetch then neither
    /// clamps `k` nor tests it, nor tests its row (a row past the operand's extent, clamped to
    /// its last, only reaches outputs that are not stored).
    bounded: bool,
}

/// The index of padding and of elements outside the GEMM's extents (all ones).
const NOIDX: &str = "(ix)~(ix)0";

impl Load {
    /// An element read without padding.
    fn plain(ptr: &str, idx: String, conj: bool) -> Load {
        Load {
            pre_k: String::new(),
            pre_x: String::new(),
            pre: String::new(),
            guard: String::new(),
            ptr: ptr.to_string(),
            idx,
            conj,
            bounded: false,
        }
    }

    /// Every declaration, in order.
    fn pre_all(&self) -> String {
        format!("{}{}{}", self.pre_k, self.pre_x, self.pre)
    }

    /// The body of a lambda returning the element's index into `ptr`, or [`NOIDX`] for
    /// padding; the conjugation is left to the caller.
    fn index(&self) -> String {
        if self.guard.is_empty() {
            format!("{}return {};", self.pre_all(), self.idx)
        } else {
            format!("{}return ({}) ? (ix)({}) : {NOIDX};", self.pre_all(), self.guard, self.idx)
        }
    }

    /// The body of a lambda returning the element's value (`zero` for padding), returning
    /// early for padding: the fp32 kernels' form, where the next tile's loads are issued
    /// before this tile's products and the branch-free [`Load::fetch`] measured 2% slower on
    /// the seed step (2026-12-03, bench/RESULTS.md).
    fn value(&self, zero: &str) -> String {
        let ld = conj_if(self.conj, format!("{}[{}]", self.ptr, self.idx));
        if self.guard.is_empty() {
            format!("{}return {ld};", self.pre_all())
        } else {
            format!("{}if (!({})) return {zero};\n      return {ld};", self.pre_all(), self.guard)
        }
    }

    /// [`Load::fetch`] for an operand stored in the 16-bit format its products use: the
    /// element's bits as they are (`u32` for a complex pair, im in the high half; `unsigned
    /// short` for a real), conjugated by flipping the imaginary half's sign bit.
    fn fetch_bits(&self, at: &str, dst: &str, complex: bool) -> String {
        let (ty, field, flip) =
            if complex { ("u32", "u", " ^ 0x80000000u") } else { ("unsigned short", "b", "") };
        let flip = if self.conj { flip } else { "" };
        format!(
            "const bool ok = {at} != {NOIDX};\n      const {ty} v = {}[ok ? {at} : 0].{field}{flip};\n      {dst} = ok ? v : ({ty})0;",
            self.ptr
        )
    }

    /// Statements storing the element at index `at` (from [`Load::index`], [`NOIDX`] for
    /// zero) into `dst` as `ty`: the load is unconditional (index 0 stands in for padding)
    /// and the zero is selected afterwards, so no branch separates the loads of a tile.
    fn fetch(&self, at: &str, dst: &str, ty: &str, zero: &str) -> String {
        let ld = conj_if(self.conj, format!("({ty}){}[ok ? {at} : 0]", self.ptr));
        format!(
            "const bool ok = {at} != {NOIDX};\n      const {ty} v = {ld};\n      {dst} = ok ? v : {zero};"
        )
    }
}

/// A stride-1 convolution group whose output's per-channel sums `stats` (accepted by
/// [`super::conv::stats_join`]) its `wgmma` kernel computes in its epilogue ([`GemmSums`]),
/// with the kernel that adds the tiles' partials (scratch memory at byte offset `scratch`) as
/// its `post`; `None` where the convolution runs on another kernel or this one cannot sum.
pub(crate) fn contraction_summing(
    ctx: &Ctx,
    group: &KernelGroup,
    name: &str,
    stats: &[&KernelGroup],
    scratch: usize,
) -> CompileResult<Option<Kernel>> {
    let v = *group.nodes.last().ok_or_else(|| internal!("empty contraction group"))?;
    let Op::Conv2d { geom, conj } = &ctx.g.node(v).op else { return Ok(None) };
    // Only where `contraction` would take the `wgmma` GEMM: not the direct kernels, not the
    // halo tiles.
    if !ctx.tensor_cores() || ctx.split_tf32() || super::conv::direct(ctx, v, name, &[], 0)?.is_some() {
        return Ok(None);
    }
    if super::halo::conv(ctx, v, name)?.is_some() {
        return Ok(None);
    }
    let mut gm = conv_gemm(ctx, v, geom, conj)?;
    let [_, o, ho, wo] = dims(&ctx.shape(v))?;
    gm.sums = Some(GemmSums {
        sums: super::conv::Sums::of(ctx, v, stats)?,
        scratch,
        hw: (ho * wo, wo),
        channels: o,
    });
    if !wgmma_serves(ctx, &gm, v) {
        return Ok(None);
    }
    emit_wgmma(ctx, &gm, v, name)
}

/// A contraction group.
pub(crate) fn contraction(ctx: &Ctx, group: &KernelGroup, name: &str) -> CompileResult<Kernel> {
    let v = *group.nodes.last().ok_or_else(|| internal!("empty contraction group"))?;
    if let Some(k) = super::conv::direct(ctx, v, name, &[], 0)? {
        return Ok(k);
    }
    if let Some(k) = super::wgrad::direct(ctx, v, name)? {
        return Ok(k);
    }
    if let Some(k) = super::halo::conv(ctx, v, name)? {
        return Ok(k);
    }
    let node = ctx.g.node(v);
    let tc = node.ty.dtype;
    let (x0, x1) = (node.inputs[0], node.inputs[1]);
    let (t0, t1) = (ctx.dtype(x0), ctx.dtype(x1));
    let (p0, p1, out) = (ctx.ptr(x0)?, ctx.ptr(x1)?, ctx.ptr(v)?);
    let gemm = match &node.op {
        Op::MatMul { trans, conj, sum_batch } => {
            let mm = MatMulShape::new(&ctx.shape(x0), &ctx.shape(x1), *trans, *sum_batch);
            mm.gemm([t0, t1, tc], [&p0, &p1, &out], *trans, *conj)
        }
        Op::Conv2d { geom, conj } => conv_gemm(ctx, v, geom, conj)?,
        Op::ConvTranspose2d { geom, out_hw, conj } => {
            let [nb, o, ho, wo] = dims(&ctx.shape(x0))?;
            let [_, cg, kh, kw] = dims(&ctx.shape(x1))?;
            let [_, c, h, w] = dims(&ctx.shape(v))?;
            debug_assert_eq!([h, w], *out_hw);
            let og = o / geom.groups;
            let khw = kh * kw;
            // With stride 1, output-gradient element (oc, y + pd − i·d, x + pd − j·d) of
            // input pixel (y, x): a taps' table serves it (strided layers also test the
            // stride's divisibility).
            let taps = if geom.stride == [1, 1] {
                TapTable::new(
                    ctx,
                    TapTable {
                        mask: true,
                        taps: og * khw,
                        khw,
                        kw,
                        plane: ho * wo,
                        row: wo,
                        dy: (-(geom.dilation[0] as i64), geom.pad[0] as i64),
                        dx: (-(geom.dilation[1] as i64), geom.pad[1] as i64),
                    },
                )
            } else {
                None
            };
            let load_b = if let Some(t) = taps.as_ref().filter(|t| t.mask) {
                Load {
                    pre_k: "const int2 tp = taps[k];\n      ".into(),
                    pre_x: format!(
                        "const ix b = n / {hw}u, q = n % {hw}u, y = q / {w}u, x = q % {w}u;\n      \
                         const ix pb = (b * {o}u + g * {og}u) * {hwo}u + y * {wo}u + x;\n      {}",
                        t.window_mask("y", "x", ho, wo),
                        hw = h * w,
                        hwo = ho * wo,
                    ),
                    pre: String::new(),
                    guard: "(vm & (u32)tp.y) != 0u".into(),
                    ptr: p0.clone(),
                    idx: "pb + (ix)tp.x".into(),
                    conj: conj[0],
                    bounded: true,
                }
            } else if taps.is_some() {
                Load {
                    pre_k: "const int2 tp = taps[k];\n      ".into(),
                    pre_x: format!(
                        "const ix b = n / {hw}u, q = n % {hw}u, y = q / {w}u, x = q % {w}u;\n      ",
                        hw = h * w
                    ),
                    pre: "const int oy = (int)y + (tp.y >> 16), ox = (int)x + (int)(short)(tp.y & 0xffff);\n      "
                        .into(),
                    guard: format!("(u32)oy < {ho}u && (u32)ox < {wo}u"),
                    ptr: p0.clone(),
                    idx: format!("(b * {o}u + g * {og}u) * {}u + y * {wo}u + x + (ix)tp.x", ho * wo),
                    conj: conj[0],
                    bounded: false,
                }
            } else {
                Load {
                    pre_k: format!(
                        "const ix oc = k / {khw}u, r = k % {khw}u, i = r / {kw}u, j = r % {kw}u;\n      "
                    ),
                    pre_x: format!(
                        "const ix b = n / {hw}u, q = n % {hw}u, y = q / {w}u, x = q % {w}u;\n      ",
                        hw = h * w
                    ),
                    pre: format!(
                        "const int sy = (int)(y + {pd0}u) - (int)(i * {d0}u), sx = (int)(x + {pd1}u) - (int)(j * {d1}u);\n      \
                         const int oy = sy / {s0}, ox = sx / {s1};\n      ",
                        s0 = geom.stride[0],
                        s1 = geom.stride[1],
                        d0 = geom.dilation[0],
                        d1 = geom.dilation[1],
                        pd0 = geom.pad[0],
                        pd1 = geom.pad[1],
                    ),
                    guard: format!(
                        "sy >= 0 && sx >= 0 && sy % {s0} == 0 && sx % {s1} == 0 && oy < {ho} && ox < {wo}",
                        s0 = geom.stride[0],
                        s1 = geom.stride[1],
                    ),
                    ptr: p0.clone(),
                    idx: format!("((b * {o}u + g * {og}u + oc) * {ho}u + (u32)oy) * {wo}u + (u32)ox"),
                    conj: conj[0],
                    bounded: false,
                }
            };
            Gemm {
                m: cg,
                n: nb * h * w,
                k: og * khw,
                groups: geom.groups,
                ta: t1,
                tb: t0,
                tc,
                load_a: Load {
                    pre_k: format!("const ix oc = k / {khw}u, r = k % {khw}u;\n      "),
                    ..Load::plain(&p1, format!("((g * {og}u + oc) * {cg}u + m) * {khw}u + r"), conj[1])
                },
                load_b,
                out: format!("{out}[((n / {hw}u) * {c}u + g * {cg}u + m) * {hw}u + n % {hw}u]", hw = h * w),
                a_k_fast: true,
                b_k_fast: false,
                taps,
                sums: None,
            }
        }
        Op::Conv2dWeightGrad { geom, kernel, conj } => {
            let [nb, c, h, w] = dims(&ctx.shape(x0))?;
            let [_, o, ho, wo] = dims(&ctx.shape(x1))?;
            let [kh, kw] = *kernel;
            let og = o / geom.groups;
            let cg = c / geom.groups;
            let khw = kh * kw;
            let hwo = ho * wo;
            let (load_b, taps) = patch_gather(
                ctx,
                &Patch { tap: "n", pixel: "k", x: &p0, c, cg, h, w, ho, wo, kh, kw, geom, conj: conj[0] },
            );
            Gemm {
                m: og,
                n: cg * khw,
                k: nb * hwo,
                groups: geom.groups,
                ta: t1,
                tb: t0,
                tc,
                load_a: Load::plain(
                    &p1,
                    format!("((k / {hwo}u) * {o}u + g * {og}u + m) * {hwo}u + k % {hwo}u"),
                    conj[1],
                ),
                load_b,
                out: format!("{out}[(g * {og}u + m) * {}u + n]", cg * khw),
                a_k_fast: true,
                b_k_fast: true,
                taps,
                sums: None,
            }
        }
        // Fusion puts only contractions in contraction groups.
        other @ (Op::Input { .. }
        | Op::Param { .. }
        | Op::State { .. }
        | Op::Scalar { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Select
        | Op::Reduce { .. }
        | Op::Reshape
        | Op::Expand
        | Op::Permute { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Concat { .. }
        | Op::Fft { .. }
        | Op::OneHot { .. }
        | Op::Gather
        | Op::ScatterAdd { .. }
        | Op::DropoutMask { .. }
        | Op::AttnLse { .. }
        | Op::Attention { .. }
        | Op::AttentionGrad { .. }
        | Op::Recurrence { .. }
        | Op::RecurrenceGrad { .. }
        | Op::Assign) => return Err(internal!("{v}: {} is not a contraction", other.mnemonic())),
    };
    emit(ctx, &gemm, v, name)
}

/// The GEMM of a `Conv2d` node `v`: output channels × pixels, over channels × taps.
fn conv_gemm(ctx: &Ctx, v: Value, geom: &ConvGeom, conj: &[bool; 2]) -> CompileResult<Gemm> {
    let node = ctx.g.node(v);
    let tc = node.ty.dtype;
    let (x0, x1) = (node.inputs[0], node.inputs[1]);
    let (t0, t1) = (ctx.dtype(x0), ctx.dtype(x1));
    let (p0, p1, out) = (ctx.ptr(x0)?, ctx.ptr(x1)?, ctx.ptr(v)?);
    let [nb, c, h, w] = dims(&ctx.shape(x0))?;
    let [o, cg, kh, kw] = dims(&ctx.shape(x1))?;
    let [_, _, ho, wo] = dims(&ctx.shape(v))?;
    let og = o / geom.groups;
    let kk = cg * kh * kw;
    let (load_b, taps) = patch_gather(
        ctx,
        &Patch { tap: "k", pixel: "n", x: &p0, c, cg, h, w, ho, wo, kh, kw, geom, conj: conj[0] },
    );
    Ok(Gemm {
        m: og,
        n: nb * ho * wo,
        k: kk,
        groups: geom.groups,
        ta: t1,
        tb: t0,
        tc,
        load_a: Load::plain(&p1, format!("(g * {og}u + m) * {kk}u + k"), conj[1]),
        load_b,
        out: format!("{out}[((n / {hwo}u) * {o}u + g * {og}u + m) * {hwo}u + n % {hwo}u]", hwo = ho * wo),
        a_k_fast: true,
        b_k_fast: false,
        taps,
        sums: None,
    })
}

/// The extents of a (batched) matmul and how its batch maps onto the GEMM template.
struct MatMulShape {
    m: usize,
    n: usize,
    k: usize,
    /// Products in the batch (1: a single product).
    batch: usize,
    /// Elements between the batches of `a`, `b` (0: a 2-D operand, read for every batch).
    strides: [usize; 2],
    sum_batch: bool,
}

impl MatMulShape {
    fn new(s0: &[usize], s1: &[usize], trans: [bool; 2], sum_batch: bool) -> MatMulShape {
        let last2 = |s: &[usize]| [s[s.len() - 2], s[s.len() - 1]];
        let (a2, b2) = (last2(s0), last2(s1));
        let (m, k) = if trans[0] { (a2[1], a2[0]) } else { (a2[0], a2[1]) };
        let n = if trans[1] { b2[0] } else { b2[1] };
        let batch_of = |s: &[usize]| s[..s.len() - 2].iter().product::<usize>();
        let stride = |s: &[usize], two: [usize; 2]| if s.len() == 2 { 0 } else { two[0] * two[1] };
        let batch = batch_of(s0).max(batch_of(s1));
        let mut mm = MatMulShape { m, n, k, batch, strides: [stride(s0, a2), stride(s1, b2)], sum_batch };
        // Fold the batch into one product where the layout allows (as the CPU back end does):
        // into M for a row-major `a` times a shared `b`, into K for summed products of a
        // transposed `a` and a row-major `b` (both then step through memory contiguously).
        if batch > 1 && !sum_batch && !trans[0] && mm.strides[1] == 0 {
            mm.m *= batch;
        } else if batch > 1 && sum_batch && trans[0] && !trans[1] {
            mm.k *= batch;
        } else {
            return mm;
        }
        MatMulShape { batch: 1, strides: [0, 0], sum_batch: false, ..mm }
    }

    /// The GEMM: a single product as before; a batch as channel groups (`g` = the batch, on
    /// grid.z); summed products as one product over `K·batch` (`q` = the batch of a K index).
    fn gemm(
        &self,
        [ta, tb, tc]: [DType; 3],
        [p0, p1, out]: [&str; 3],
        trans: [bool; 2],
        conj: [bool; 2],
    ) -> Gemm {
        let MatMulShape { m, n, k, batch, strides: [sa, sb], sum_batch } = *self;
        let a_idx = |kv: &str| if trans[0] { format!("{kv} * {m}u + m") } else { format!("m * {k}u + {kv}") };
        let b_idx = |kv: &str| if trans[1] { format!("n * {k}u + {kv}") } else { format!("{kv} * {n}u + n") };
        let at =
            |stride: usize, g: &str| if stride == 0 { String::new() } else { format!("{g} * {stride}u + ") };
        let (load_a, load_b, out, groups, kk) = if batch <= 1 {
            (
                Load::plain(p0, a_idx("k"), conj[0]),
                Load::plain(p1, b_idx("k"), conj[1]),
                format!("{out}[m * {n}u + n]"),
                1,
                k,
            )
        } else if sum_batch {
            let split = format!("const ix q = k / {k}u, r = k % {k}u;\n      ");
            (
                Load {
                    pre_k: split.clone(),
                    ..Load::plain(p0, format!("{}{}", at(sa, "q"), a_idx("r")), conj[0])
                },
                Load { pre_k: split, ..Load::plain(p1, format!("{}{}", at(sb, "q"), b_idx("r")), conj[1]) },
                format!("{out}[m * {n}u + n]"),
                1,
                k * batch,
            )
        } else {
            (
                Load::plain(p0, format!("{}{}", at(sa, "g"), a_idx("k")), conj[0]),
                Load::plain(p1, format!("{}{}", at(sb, "g"), b_idx("k")), conj[1]),
                format!("{out}[g * {}u + m * {n}u + n]", m * n),
                batch,
                k,
            )
        };
        Gemm {
            m,
            n,
            k: kk,
            groups,
            ta,
            tb,
            tc,
            load_a,
            load_b,
            out,
            a_k_fast: !trans[0],
            b_k_fast: trans[1],
            taps: None,
            sums: None,
        }
    }
}

/// An input patch element of a convolution as a GEMM operand: the index named `tap` runs
/// over (input channel, kernel row, kernel column), the one named `pixel` over (image,
/// output row, output column); padding reads as zero. The convolution (tap = K) and its
/// weight gradient (tap = N) read the same patches.
struct Patch<'a> {
    tap: &'a str,
    pixel: &'a str,
    x: &'a str,
    c: usize,
    cg: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
    kh: usize,
    kw: usize,
    geom: &'a ConvGeom,
    conj: bool,
}

/// The patch element as a [`Load`], and the taps' table it reads where the tensor-core
/// kernels take one.
fn patch_gather(ctx: &Ctx, p: &Patch) -> (Load, Option<TapTable>) {
    let Patch { tap, pixel, x, c, cg, h, w, ho, wo, kh, kw, geom, conj } = *p;
    let table = TapTable::new(
        ctx,
        TapTable {
            // (The weight gradient's pixel runs along K: no mask for a thread's row.)
            mask: tap == "k",
            taps: cg * kh * kw,
            khw: kh * kw,
            kw,
            plane: h * w,
            row: w,
            dy: (geom.dilation[0] as i64, -(geom.pad[0] as i64)),
            dx: (geom.dilation[1] as i64, -(geom.pad[1] as i64)),
        },
    );
    let of_pixel = format!(
        "const ix b = {pixel} / {hwo}u, q = {pixel} % {hwo}u, oh = q / {wo}u, ow = q % {wo}u;\n      ",
        hwo = ho * wo,
    );
    // The declarations of the tap and of the pixel, each with the GEMM index it reads.
    let split = |of_tap: String, both: String, guard: String, idx: String| {
        let (pre_k, pre_x) = if tap == "k" { (of_tap, of_pixel.clone()) } else { (of_pixel.clone(), of_tap) };
        Load { pre_k, pre_x, pre: both, guard, ptr: x.to_string(), idx, conj, bounded: false }
    };
    if let Some(t) = table.as_ref().filter(|t| t.mask) {
        let (s0, s1) = (geom.stride[0], geom.stride[1]);
        let pre_x = format!(
            "const ix b = {pixel} / {hwo}u, q = {pixel} % {hwo}u, oh = q / {wo}u, ow = q % {wo}u;\n      \
             const ix pb = (b * {c}u + g * {cg}u) * {hw}u + oh * {rs}u + ow * {s1}u;\n      {}",
            t.window_mask(&format!("oh * {s0}u"), &format!("ow * {s1}u"), h, w),
            hwo = ho * wo,
            hw = h * w,
            rs = s0 * w,
        );
        let load = Load {
            pre_k: format!("const int2 tp = taps[{tap}];\n      "),
            pre_x,
            pre: String::new(),
            guard: "(vm & (u32)tp.y) != 0u".into(),
            ptr: x.to_string(),
            idx: "pb + (ix)tp.x".into(),
            conj,
            bounded: true,
        };
        return (load, table);
    }
    if table.is_some() {
        let load = split(
            format!("const int2 tp = taps[{tap}];\n      "),
            format!(
                "const int y = (int)(oh * {s0}u) + (tp.y >> 16), x = (int)(ow * {s1}u) + (int)(short)(tp.y & 0xffff);\n      ",
                s0 = geom.stride[0],
                s1 = geom.stride[1],
            ),
            format!("(u32)y < {h}u && (u32)x < {w}u"),
            format!(
                "(b * {c}u + g * {cg}u) * {hw}u + oh * {rs}u + ow * {s1}u + (ix)tp.x",
                hw = h * w,
                rs = geom.stride[0] * w,
                s1 = geom.stride[1],
            ),
        );
        return (load, table);
    }
    let load = split(
        format!("const ix ci = {tap} / {khw}u, r = {tap} % {khw}u, i = r / {kw}u, j = r % {kw}u;\n      ", khw = kh * kw),
        format!(
            "const int y = (int)(oh * {s0}u + i * {d0}u) - {pd0}, x = (int)(ow * {s1}u + j * {d1}u) - {pd1};\n      ",
            s0 = geom.stride[0],
            s1 = geom.stride[1],
            d0 = geom.dilation[0],
            d1 = geom.dilation[1],
            pd0 = geom.pad[0],
            pd1 = geom.pad[1],
        ),
        format!("y >= 0 && y < {h} && x >= 0 && x < {w}"),
        format!("((b * {c}u + g * {cg}u + ci) * {h}u + (u32)y) * {w}u + (u32)x"),
    );
    (load, None)
}

/// The index type of a contraction: its operands and output, the products of its extents
/// over all groups (the gathers combine in-range `m`, `n`, `k`), and the tile origins, which
/// pass the extents by up to a tile (`m0 + BM`, `n0 + BN`, `k0 + BK`), and the end of the
/// last K split before it is clamped (`splits · chunk`).
fn indexing(ctx: &Ctx, gm: &Gemm, v: Value, [bm, bn, bk]: [usize; 3], k_end: usize) -> Indexing {
    let node = ctx.g.node(v);
    let (m, n, k, g) = (gm.m, gm.n, gm.k, gm.groups);
    ctx.indexing(
        &[node.inputs[0], node.inputs[1], v],
        &[g * m * n, g * m * k, g * k * n, g * (m + bm), n + bn, k + bk, k_end],
    )
}

/// `the matmul kernel of y/linear`: the op and its layer, for messages.
fn kernel_name(ctx: &Ctx, v: Value) -> String {
    let n = ctx.g.node(v);
    if n.origin.label.is_empty() {
        format!("the {} kernel", n.op.mnemonic())
    } else {
        format!("the {} kernel of {}", n.op.mnemonic(), n.origin.label)
    }
}

/// The block coordinates of a contraction's grid as C declarations: `g` (the channel group),
/// `split` (of K), and the tile origins `m0`, `n0`.
fn block_coords(grid: &Grid, groups: usize, bm: usize, bn: usize) -> String {
    block_origin(grid, groups, [bm, bn], ["m0", "n0"])
}

/// [`block_coords`] with the tile origins named: `rows` for the grid's y, `cols` for its x.
fn block_origin(grid: &Grid, groups: usize, [bm, bn]: [usize; 2], [rows, cols]: [&str; 2]) -> String {
    let [x, y, z] = &grid.coords;
    format!(
        "  const ix g = {z} % {groups}u, split = {z} / {groups}u;\n  const ix {rows} = {y} * {bm}u, {cols} = {x} * {bn}u;\n"
    )
}

/// The tensor-core kernels' block prologue: the block's coordinates ([`block_coords`]; with
/// `swap`, block rows walk n and block columns m), the taps' table filled by `threads` threads
/// where the gather has one, and the block's K range `[kb, ke)` of its split (`chunk` deep).
fn tile_origin(grid: &Grid, gm: &Gemm, tile: [usize; 2], threads: usize, chunk: usize, swap: bool) -> String {
    let mut c = block_origin(grid, gm.groups, tile, if swap { ["n0", "m0"] } else { ["m0", "n0"] });
    if let Some(t) = &gm.taps {
        c.push_str(&t.fill(threads));
    }
    let _ = writeln!(c, "  const ix kb = split * {chunk}u, ke = min(kb + (ix){chunk}u, (ix){}u);", gm.k);
    c
}

/// Checks that a contraction's shared-memory tiles fit the target device.
fn shared_fits(ctx: &Ctx, v: Value, bytes: usize) -> CompileResult<()> {
    let max = ctx.target.device.shared_per_block;
    if bytes > max {
        return Err(user!(
            "{v}: the contraction's tiles need {bytes} bytes of shared memory per block; the device allows {max}"
        ));
    }
    Ok(())
}

fn dims(s: &[usize]) -> CompileResult<[usize; 4]> {
    s.try_into().map_err(|_| internal!("a convolution operand of shape {s:?} is not 4-D"))
}

fn tile(extent: usize, max: usize) -> usize {
    extent.next_power_of_two().clamp(16, max)
}

/// Split of K over blocks: `(splits, chunk)`. Never for an output stored in 16 bits: partial
/// sums added with atomics would round at every addition.
fn split_k(ctx: &Ctx, gm: &Gemm, v: Value, tiles: usize, bk: usize) -> (usize, usize) {
    let fill = ctx.target.contraction_fill();
    let splits = if tiles < fill && gm.k >= 4 * 1024 && !ctx.storage(v).is_half() {
        fill.div_ceil(tiles).min(gm.k / 1024).max(1)
    } else {
        1
    };
    let chunk = gm.k.div_ceil(splits).div_ceil(bk) * bk;
    (gm.k.div_ceil(chunk), chunk)
}

fn emit(ctx: &Ctx, gm: &Gemm, v: Value, name: &str) -> CompileResult<Kernel> {
    if ctx.tensor_cores() {
        return emit_tf32(ctx, gm, v, name);
    }
    debug_assert!(gm.taps.is_none(), "a taps' table outside the tensor-core kernels");
    let kc = &ctx.target.kernels;
    let bm = tile(gm.m, if kc.fma_tile == FmaTile::Tall { 128 } else { 64 });
    // 64 × 128 tiles for 64-high problems measured slower than 64 × 64 (bench/GPU-NOTES.md).
    let bn = if bm <= 32 { tile(gm.n, 128) } else { tile(gm.n, 64) };
    // Gauss's three products need both operands complex (a real operand already takes two).
    let three = kc.cmul == ComplexProducts::Three && [gm.ta, gm.tb, gm.tc] == [DType::C64; 3];
    // Tiles of As[bk][bm + 1] and Bs[bk][bn + 1] in static shared memory.
    let tile_bytes = |bk: usize| bk * ((bm + 1) * gm.ta.bytes() + (bn + 1) * gm.tb.bytes());
    // (32-deep tiles only up to 64 wide, as measured; and only where they fit the device.)
    let deep = fp32_bk(ctx);
    let bk = if bn <= 64 && tile_bytes(deep) <= ctx.target.device.shared_per_block { deep } else { BK };
    shared_fits(ctx, v, tile_bytes(bk))?;
    let (tm, tn) = (bm / 16, bn / 16);
    let gx = gm.n.div_ceil(bn);
    let gy = gm.m.div_ceil(bm);
    let tiles = gx * gy * gm.groups;
    let (splits, chunk) = split_k(ctx, gm, v, tiles, bk);
    let grid = Grid::new(ctx, [gx, gy, gm.groups * splits], &kernel_name(ctx, v))?;
    let index = indexing(ctx, gm, v, [bm, bn, bk], splits * chunk);
    let (ta, tb, tc) = (ctype(gm.ta), ctype(gm.tb), ctype(gm.tc));
    let mut c = String::new();
    let _ = writeln!(c, "extern \"C\" __global__ void __launch_bounds__(256) {name}(char* A) {{");
    c.push_str(index.typedef());
    let _ = writeln!(c, "  const u32 tid = threadIdx.x, tx = tid % 16u, ty = tid / 16u;");
    c.push_str(&block_coords(&grid, gm.groups, bm, bn));
    let _ = writeln!(c, "  const ix kb = split * {chunk}u, ke = min(kb + (ix){chunk}u, (ix){}u);", gm.k);
    let _ = writeln!(c, "  __shared__ {ta} As[{bk}][{}];", bm + 1);
    let _ = writeln!(c, "  __shared__ {tb} Bs[{bk}][{}];", bn + 1);
    let _ =
        writeln!(c, "  auto LA = [&](ix m, ix k) -> {ta} {{\n      {}\n  }};", gm.load_a.value(czero(gm.ta)));
    let _ =
        writeln!(c, "  auto LB = [&](ix k, ix n) -> {tb} {{\n      {}\n  }};", gm.load_b.value(czero(gm.tb)));
    let zero_acc = if three {
        let _ = writeln!(c, "  float p1[{tm}][{tn}], p2[{tm}][{tn}], p3[{tm}][{tn}];");
        "p1[i][j] = p2[i][j] = p3[i][j] = 0.0f".to_string()
    } else {
        let _ = writeln!(c, "  {tc} acc[{tm}][{tn}];");
        format!("acc[i][j] = {}", czero(gm.tc))
    };
    let _ = writeln!(c, "  #pragma unroll\n  for (int i = 0; i < {tm}; ++i)\n    #pragma unroll\n    for (int j = 0; j < {tn}; ++j) {zero_acc};");
    // The tile loads: each thread gathers `per` elements of A and of B per K step, into
    // registers (`ra`, `rb`), which are then stored to shared memory.
    let mut fetch = String::new();
    let mut store = String::new();
    for (mat, reg, ext, bx, k_fast, len, lname, z, ty) in [
        ("As", "ra", gm.m, bm, gm.a_k_fast, "m", "LA", czero(gm.ta), ta),
        ("Bs", "rb", gm.n, bn, gm.b_k_fast, "n", "LB", czero(gm.tb), tb),
    ] {
        let per = bk * bx / 256;
        let (kk, xx) = if k_fast {
            (format!("e % {bk}u"), format!("e / {bk}u"))
        } else {
            (format!("e / {bx}u"), format!("e % {bx}u"))
        };
        let args = if lname == "LA" { "x, k" } else { "k, x" };
        let _ = writeln!(c, "  {ty} {reg}[{per}];");
        let _ = writeln!(
            fetch,
            "    #pragma unroll\n    for (u32 r = 0; r < {per}u; ++r) {{\n      const u32 e = tid + r * 256u, kk = {kk}, xx = {xx};\n      \
             const ix k = k0 + kk, x = {len}0 + xx;\n      {reg}[r] = (x < {ext}u && k < ke) ? {lname}({args}) : {z};\n    }}"
        );
        let _ = writeln!(
            store,
            "    #pragma unroll\n    for (u32 r = 0; r < {per}u; ++r) {{\n      const u32 e = tid + r * 256u;\n      {mat}[{kk}][{xx}] = {reg}[r];\n    }}"
        );
    }
    let _ = writeln!(c, "  {{\n    const ix k0 = kb;\n{fetch}  }}");
    let _ = writeln!(c, "  for (ix k0 = kb; k0 < ke; k0 += {bk}u) {{");
    c.push_str(&store);
    c.push_str("    __syncthreads();\n");
    // The next tile's loads are issued before this tile's products, so their latency is
    // hidden behind the arithmetic (measured: 1% of the seed step, bench/GPU-NOTES.md).
    let _ = writeln!(c, "    if (k0 + {bk}u < ke) {{\n      const ix k0n = k0 + {bk}u;\n      {{\n        const ix k0 = k0n;\n{fetch}      }}\n    }}");
    let body = if three {
        // t₃'s operand sums once per row and column of the register tile.
        format!(
            "      float sa[{tm}], sb[{tn}];\n      \
             #pragma unroll\n      for (int i = 0; i < {tm}; ++i) sa[i] = a[i].x + a[i].y;\n      \
             #pragma unroll\n      for (int j = 0; j < {tn}; ++j) sb[j] = b[j].x + b[j].y;\n      \
             #pragma unroll\n      for (int i = 0; i < {tm}; ++i)\n        #pragma unroll\n        for (int j = 0; j < {tn}; ++j) {{\n          \
             p1[i][j] = fmaf(a[i].x, b[j].x, p1[i][j]);\n          p2[i][j] = fmaf(a[i].y, b[j].y, p2[i][j]);\n          \
             p3[i][j] = fmaf(sa[i], sb[j], p3[i][j]);\n        }}"
        )
    } else {
        format!("      #pragma unroll\n      for (int i = 0; i < {tm}; ++i)\n        #pragma unroll\n        for (int j = 0; j < {tn}; ++j) mac(acc[i][j], a[i], b[j]);")
    };
    let _ = writeln!(
        c,
        "    #pragma unroll\n    for (int kk = 0; kk < {bk}; ++kk) {{\n      {ta} a[{tm}]; {tb} b[{tn}];\n      \
         #pragma unroll\n      for (int i = 0; i < {tm}; ++i) a[i] = As[kk][ty + i * 16];\n      \
         #pragma unroll\n      for (int j = 0; j < {tn}; ++j) b[j] = Bs[kk][tx + j * 16];\n{body}\n    }}"
    );
    c.push_str("    __syncthreads();\n  }\n");
    let value = if three {
        "const float2 r = make_float2(p1[i][j] - p2[i][j], p3[i][j] - p1[i][j] - p2[i][j]);"
    } else {
        "const auto r = acc[i][j];"
    };
    let store = if splits > 1 { format!("atomic_acc(&{}, r);", gm.out) } else { format!("{} = r;", gm.out) };
    let _ = writeln!(
        c,
        "  #pragma unroll\n  for (int i = 0; i < {tm}; ++i)\n    #pragma unroll\n    for (int j = 0; j < {tn}; ++j) {{\n      \
         const ix m = m0 + ty + i * 16, n = n0 + tx + j * 16;\n      {value}\n      if (m < {}u && n < {}u) {store}\n    }}\n}}",
        gm.m, gm.n
    );
    let zero = if splits > 1 { vec![(ctx.offset(v)?, ctx.bytes(v))] } else { Vec::new() };
    Ok(Kernel {
        code: c,
        grid: grid.launch,
        block: [256, 1, 1],
        zero,
        scratch: 0,
        shared: 0,
        index,
        pre: None,
        post: None,
    })
}

/// The 16-bit format in which [`emit_tf32`] multiplies `gm` natively (`mma.sync.m16n8k16`),
/// or `None` for TF32 products. `tc16=auto` on Hopper: 16-bit `wgmma` pairs where the product
/// has a complex operand stored in the precision's format; else a convolution widened, a
/// matmul native.
fn native_half(ctx: &Ctx, gm: &Gemm, v: Value) -> Option<Half> {
    let kc = &ctx.target.kernels;
    let conv = !matches!(ctx.g.node(v).op, Op::MatMul { .. });
    let native = match kc.tc16_for(&ctx.target.device) {
        TcHalf::Native => true,
        TcHalf::Wgmma => kc.tc16 == TcHalf::Auto && !conv && pair_format(ctx, gm, v).is_none(),
        _ => false,
    };
    match ctx.precision() {
        Precision::Bf16 if native => Some(Half::Bf16),
        Precision::Fp16 if native => Some(Half::F16),
        _ => None,
    }
}

/// Whether [`emit_tf32`] tries the `wgmma` kernel for `gm` (which may still decline it).
fn wgmma_serves(ctx: &Ctx, gm: &Gemm, v: Value) -> bool {
    ctx.target.kernels.tc_mma == TcMma::Wgmma
        && native_half(ctx, gm, v).is_none()
        && (gm.tc == DType::C64) == (gm.ta == DType::C64 || gm.tb == DType::C64)
        && ctx.target.device.compute_capability == (9, 0)
}

/// The tensor-core variant (`Precision::Tf32`, and `Bf16`/`Fp16`, whose 16-bit operands widen
/// to TF32 exactly): the same gathers, with each warp computing a `16·tm × 8·tn`
/// piece of the block tile through `mma.sync.m16n8k8` on TF32 operands. Complex operands are
/// multiplied as real products of their re and im parts (4 for complex × complex, 2 for
/// mixed, 1 for real); in shared memory they are separate re/im planes, or one interleaved
/// `float2` plane under `async` staging (one 8-byte copy per element, one 64-bit load per
/// fragment position).
///
/// How the K tiles reach shared memory is the target's [`TcStaging`]: loaded and stored
/// between two barriers (`plain`); the next tile's loads issued into registers before this
/// tile's products, into the other of two shared buffers (`prefetch`); or copied by
/// `cp.async` into the other buffer while this one is multiplied (`async`, the default, for
/// operands stored in 32 bits; 16-bit ones widen on the way and are staged as `plain`).
/// [`TcTile`] sets the block tile and its warps: by default 4 warps of 32 × 32 for TF32
/// products, 8 of 32 × 16 for 16-bit ones (`Wide`: 8 warps of 32 × 32, twice the block tile).
/// Under `async` staging the K tiles are a ring of `KernelConfig::tc_stages` buffers in
/// dynamic shared memory.
///
/// At `bf16` and `fp16` with [`TcHalf::Native`] (by default for matmuls, and off Hopper), the
/// operands are rounded to the 16-bit format on their way to shared memory instead, stored
/// there K-contiguous
/// (`[x][k]`, so that a fragment register holds two consecutive k), and multiplied 16 deep
/// through `mma.sync.m16n8k16` in 32-deep K tiles (16-deep where K is); staged `plain` or
/// `prefetch` (a copy cannot round).
fn emit_tf32(ctx: &Ctx, gm: &Gemm, v: Value, name: &str) -> CompileResult<Kernel> {
    let kc = &ctx.target.kernels;
    let half = native_half(ctx, gm, v);
    let full = ctx.g.node(v).inputs.iter().all(|&x| !ctx.storage(x).is_half());
    if wgmma_serves(ctx, gm, v) {
        if let Some(k) = emit_wgmma(ctx, gm, v, name)? {
            return Ok(k);
        }
    }
    // K tile depth: two MMA steps per tile, or one 16-deep step where K is no deeper.
    let bk = if half.is_some() && gm.k > BK { 2 * BK } else { BK };
    // (block tile, warps along M, MMA tiles of 16 × 8 per warp along M and N, warps)
    let tile = match kc.tc_tile {
        TcTile::ByPrecision if half.is_some() => TcTile::Narrow,
        TcTile::ByPrecision => TcTile::FourWarps,
        other => other,
    };
    let (bm, bn, wm, tm, tn, warps) = match tile {
        TcTile::FourWarps if gm.m <= 32 => (32, 128, 1, 2, 4, 4),
        TcTile::FourWarps => (64, 64, 2, 2, 4, 4),
        _ if gm.m <= 32 => (32, 128, 1, 2, 2, 8),
        TcTile::Narrow | TcTile::ByPrecision => (64, 64, 2, 2, 2, 8),
        TcTile::Wide if gm.m <= 64 => (64, 128, 2, 2, 4, 8),
        TcTile::Wide => (128, 64, 4, 2, 4, 8),
    };
    let threads = 32 * warps;
    debug_assert_eq!((bm, bn), (16 * tm * wm, 8 * tn * (warps / wm)));
    let gx = gm.n.div_ceil(bn);
    let gy = gm.m.div_ceil(bm);
    let tiles = gx * gy * gm.groups;
    let (splits, chunk) = split_k(ctx, gm, v, tiles, bk);
    let grid = Grid::new(ctx, [gx, gy, gm.groups * splits], &kernel_name(ctx, v))?;
    let index = indexing(ctx, gm, v, [bm, bn, bk], splits * chunk);
    let (ca, cb, cc) = (gm.ta == DType::C64, gm.tb == DType::C64, gm.tc == DType::C64);
    let (ta, tb) = (ctype(gm.ta), ctype(gm.tb));
    let pad = 8;
    // Re (and im) planes per stage: 16 × (x + 8) floats, or (x) × (32 + 8) 16-bit words (rows
    // of 20 words: the fragment loads of a warp hit 32 distinct banks).
    let planes = |x: usize, complex: bool| {
        let plane = if half.is_some() { x * (bk + pad) * 2 } else { bk * (x + pad) * 4 };
        plane * if complex { 2 } else { 1 }
    };
    let stage_bytes = planes(bm, ca) + planes(bn, cb);
    let stored = |load: &Load| stored_as(ctx, v, load);
    let table_bytes = gm.taps.as_ref().map_or(0, |t| 8 * t.len());
    // Two stages in static shared memory (`prefetch`), or in the device's opt-in dynamic
    // shared memory (`async`).
    let two = 2 * stage_bytes + table_bytes <= ctx.target.device.shared_per_block;
    let two_dynamic = 2 * stage_bytes + table_bytes <= ctx.target.device.shared_per_block_optin;
    let staging = match kc.tc_staging {
        TcStaging::Async if !(full && two_dynamic && half.is_none()) => TcStaging::Plain,
        other => other,
    };
    let asynchronous = staging == TcStaging::Async;
    // Asynchronous staging keeps `tc_stages` K tiles in flight where the device's opt-in
    // shared memory holds them (at least two: `two` above), in dynamic shared memory.
    let stages = if asynchronous {
        (2..=kc.tc_stages.max(2))
            .rev()
            .find(|&n| n * stage_bytes + table_bytes <= ctx.target.device.shared_per_block_optin)
            .unwrap_or(2)
    } else if staging != TcStaging::Plain && two {
        2
    } else {
        1
    };
    if !asynchronous {
        shared_fits(ctx, v, stages * stage_bytes + table_bytes)?;
    }
    let mut c = String::new();
    // Registers for 3 blocks per SM at the 16-bit precisions and with 4 warps
    // (KernelConfig::tc_min_blocks).
    let min_blocks = match (kc.tc_min_blocks, half, tile) {
        (Some(n), _, _) => format!(", {n}"),
        (None, Some(_), _) | (None, None, TcTile::FourWarps) => ", 3".to_string(),
        (None, None, _) => String::new(),
    };
    let _ = writeln!(
        c,
        "extern \"C\" __global__ void __launch_bounds__({threads}{min_blocks}) {name}(char* A) {{"
    );
    c.push_str(index.typedef());
    let _ = writeln!(c, "  const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;");
    let _ =
        writeln!(c, "  const u32 wmi = warp % {wm}u, wni = warp / {wm}u, gr = lane >> 2, gc = lane & 3u;");
    c.push_str(&tile_origin(&grid, gm, [bm, bn], threads, chunk, false));
    // Bytes of dynamic shared memory (asynchronous staging): the planes one after another.
    let mut dynamic = 0;
    if asynchronous {
        c.push_str(
            "  extern __shared__ __align__(16) unsigned char gemm_smem[];
",
        );
    }
    for (plane, x, complex) in [("A", bm, ca), ("B", bn, cb)] {
        if asynchronous {
            // A complex operand is one interleaved plane: an 8-byte copy per element, and one
            // 64-bit fragment load gives its re and im. Rows `x + 4` float2 apart (8 words
            // mod 32): the 16 lanes of a half-warp's fragment load hit 32 distinct banks.
            let (ty, name, cols, elt) =
                if complex { ("float2", "c", x + 4, 8) } else { ("float", "r", x + pad, 4) };
            let _ = writeln!(
                c,
                "  {ty} (*{plane}{name})[{bk}][{cols}] = reinterpret_cast<{ty} (*)[{bk}][{cols}]>(gemm_smem + {dynamic});"
            );
            dynamic += stages * bk * cols * elt;
            continue;
        }
        for part in if complex { &["r", "i"][..] } else { &["r"][..] } {
            let _ = match half {
                None => writeln!(c, "  __shared__ float {plane}{part}[{stages}][{bk}][{}];", x + pad),
                Some(_) => writeln!(
                    c,
                    "  __shared__ __align__(16) unsigned short {plane}{part}[{stages}][{x}][{}];",
                    bk + pad
                ),
            };
        }
    }
    // (Asynchronous copies move raw elements: the conjugations are then applied to the
    // imaginary fragments.)
    let _ = writeln!(c, "  auto IA = [&](ix m, ix k) -> ix {{\n      {}\n  }};", gm.load_a.index());
    let _ = writeln!(c, "  auto IB = [&](ix k, ix n) -> ix {{\n      {}\n  }};", gm.load_b.index());
    let _ = writeln!(c, "  float cr[{tm}][{tn}][4] = {{}};");
    if cc {
        let _ = writeln!(c, "  float ci[{tm}][{tn}][4] = {{}};");
    }
    // Per operand, `per` elements per thread and K tile: `fetch` (into registers, or
    // asynchronous copies into stage `s`), `store` (registers into stage `s`).
    let mut fetch = String::new();
    let mut store = String::new();
    for (plane, ext, bx, k_fast, len, cx, ty, load) in [
        ("A", gm.m, bm, gm.a_k_fast, "m", ca, ta, &gm.load_a),
        ("B", gm.n, bn, gm.b_k_fast, "n", cb, tb, &gm.load_b),
    ] {
        let per = bk * bx / threads;
        let (kk, xx) = if k_fast {
            (format!("e % {bk}u"), format!("e / {bk}u"))
        } else {
            (format!("e / {bx}u"), format!("e % {bx}u"))
        };
        let args = if plane == "A" { "x, k" } else { "k, x" };
        let head = format!(
            "    #pragma unroll\n    for (u32 r = 0; r < {per}u; ++r) {{\n      const u32 e = tid + r * {threads}u, kk = {kk}, xx = {xx};\n"
        );
        if asynchronous {
            let copy = if cx {
                format!("cp_async8(&{plane}c[s][kk][xx], src, ok);")
            } else {
                format!("cp_async4(&{plane}r[s][kk][xx], src, ok);")
            };
            let _ = write!(
                fetch,
                "{head}      const ix k = k0 + kk, x = {len}0 + xx;\n      const ix at = (x < {ext}u && k < ke) ? I{plane}({args}) : {NOIDX};\n      \
                 const bool ok = at != {NOIDX};\n      const float* src = (const float*)({ptr} + (ok ? at : 0));\n      \
                 {copy}\n    }}\n",
                ptr = load.ptr,
            );
        } else if half.is_some_and(|h| h.storage() == stored(load)) {
            // Stored in the products' format already: moved bit for bit (no widening and
            // rounding back).
            let reg = format!("r{}", plane.to_lowercase());
            let _ = writeln!(c, "  {} {reg}[{per}];", if cx { "u32" } else { "unsigned short" });
            let _ = write!(
                fetch,
                "{head}      const ix k = k0 + kk, x = {len}0 + xx;\n      const ix at = (x < {ext}u && k < ke) ? I{plane}({args}) : {NOIDX};\n      {}\n    }}\n",
                load.fetch_bits("at", &format!("{reg}[r]"), cx),
            );
            let put = if cx {
                format!("{plane}r[s][xx][kk] = (unsigned short){reg}[r]; {plane}i[s][xx][kk] = (unsigned short)({reg}[r] >> 16);")
            } else {
                format!("{plane}r[s][xx][kk] = {reg}[r];")
            };
            let _ = write!(store, "{head}      {put}\n    }}\n");
        } else {
            let z = czero(if cx { DType::C64 } else { DType::F32 });
            let reg = format!("r{}", plane.to_lowercase());
            let _ = writeln!(c, "  {ty} {reg}[{per}];");
            let _ = write!(
                fetch,
                "{head}      const ix k = k0 + kk, x = {len}0 + xx;\n      const ix at = (x < {ext}u && k < ke) ? I{plane}({args}) : {NOIDX};\n      {}\n    }}\n",
                load.fetch("at", &format!("{reg}[r]"), ty, z),
            );
            let put = match (half, cx) {
                (None, true) => {
                    format!("{plane}r[s][kk][xx] = {reg}[r].x; {plane}i[s][kk][xx] = {reg}[r].y;")
                }
                (None, false) => format!("{plane}r[s][kk][xx] = {reg}[r];"),
                (Some(h), true) => format!(
                    "{plane}r[s][xx][kk] = {f}({reg}[r].x); {plane}i[s][xx][kk] = {f}({reg}[r].y);",
                    f = h.bits()
                ),
                (Some(h), false) => format!("{plane}r[s][xx][kk] = {}({reg}[r]);", h.bits()),
            };
            let _ = write!(store, "{head}      {put}\n    }}\n");
        }
    }
    let products = match half {
        None => mma_products(gm, tm, tn, asynchronous, ctx.split_tf32()),
        Some(h) => mma16_products(gm, tm, tn, bk, h, kc.tc_frag == TcFragments::Ldmatrix),
    };
    let next = format!("k0 + {bk}u < ke");
    match (staging, stages) {
        (TcStaging::Async, _) => {
            // A ring of `stages` buffers: the copies of the next `stages − 1` tiles are in
            // flight while tile k0 is multiplied. One barrier per tile: after it, tile k0 has
            // landed for every thread, and every warp has finished multiplying the tile
            // before it, whose buffer the next copies then refill. (A copy group is
            // committed per tile, empty past the end, so the wait counts stay exact.)
            let ahead = stages - 1;
            let _ = writeln!(
                c,
                "  #pragma unroll\n  for (u32 p = 0; p < {ahead}u; ++p) {{\n    const ix k0 = kb + p * {bk}u; const u32 s = p;\n    if (k0 < ke) {{\n{fetch}    }}\n    cp_async_commit();\n  }}"
            );
            let _ = writeln!(c, "  u32 s = 0, sf = {ahead}u;\n  for (ix k0 = kb; k0 < ke; k0 += {bk}u) {{");
            let _ = writeln!(c, "    cp_async_wait<{}>();\n    __syncthreads();", stages - 2);
            let _ = writeln!(
                c,
                "    if (k0 + {}u < ke) {{\n      const ix k0f = k0 + {}u; const u32 sn = sf;\n      {{\n        const ix k0 = k0f; const u32 s = sn;\n{fetch}      }}\n    }}\n    cp_async_commit();",
                ahead * bk,
                ahead * bk
            );
            c.push_str(&products);
            let _ = writeln!(
                c,
                "    s = s + 1u == {stages}u ? 0u : s + 1u;\n    sf = sf + 1u == {stages}u ? 0u : sf + 1u;\n  }}"
            );
        }
        (TcStaging::Prefetch, _) => {
            // With two stages, one barrier per tile: the stores of tile k0 + 16 go to the other
            // stage, which every warp finished reading before the barrier of tile k0.
            let (decl, flip, tail) = if stages == 2 {
                ("u32", ", s ^= 1u", "")
            } else {
                ("const u32", "", "    __syncthreads();\n")
            };
            let _ = writeln!(c, "  {{\n    const ix k0 = kb;\n{fetch}  }}");
            let _ = writeln!(c, "  {decl} s = 0;\n  for (ix k0 = kb; k0 < ke; k0 += {bk}u{flip}) {{");
            c.push_str(&store);
            c.push_str("    __syncthreads();\n");
            let _ = writeln!(c, "    if ({next}) {{\n      const ix k0n = k0 + {bk}u;\n      {{\n        const ix k0 = k0n;\n{fetch}      }}\n    }}");
            c.push_str(&products);
            let _ = writeln!(c, "{tail}  }}");
        }
        (TcStaging::Plain, _) => {
            let _ = writeln!(c, "  const u32 s = 0;\n  for (ix k0 = kb; k0 < ke; k0 += {bk}u) {{");
            c.push_str(&fetch);
            c.push_str(&store);
            c.push_str("    __syncthreads();\n");
            c.push_str(&products);
            c.push_str("    __syncthreads();\n  }\n");
        }
    }
    let val = if cc { "make_float2(cr[i][j][q], ci[i][j][q])" } else { "cr[i][j][q]" };
    let store =
        if splits > 1 { format!("atomic_acc(&{}, {val});", gm.out) } else { format!("{} = {val};", gm.out) };
    let _ = writeln!(
        c,
        "  #pragma unroll\n  for (int i = 0; i < {tm}; ++i)\n    #pragma unroll\n    for (int j = 0; j < {tn}; ++j)\n      #pragma unroll\n      for (int q = 0; q < 4; ++q) {{\n        \
         const ix m = m0 + wmi * {wmt}u + i * 16u + gr + (q >= 2 ? 8u : 0u), n = n0 + wni * {wnt}u + j * 8u + 2u * gc + (q & 1);\n        \
         if (m < {}u && n < {}u) {store}\n      }}\n}}",
        gm.m,
        gm.n,
        wmt = 16 * tm,
        wnt = 8 * tn,
    );
    let zero = if splits > 1 { vec![(ctx.offset(v)?, ctx.bytes(v))] } else { Vec::new() };
    Ok(Kernel {
        code: c,
        grid: grid.launch,
        block: [threads as u32, 1, 1],
        zero,
        scratch: 0,
        pre: None,
        post: None,
        shared: dynamic,
        index,
    })
}

/// Bytes of an 8 × 4 "core matrix" of TF32 elements, the unit of `wgmma`'s shared-memory
/// operands: 8 rows of 16 contiguous bytes.
const CORE_BYTES: usize = 128;

/// The TF32 GEMM on Hopper's warpgroup instruction ([`TcMma::Wgmma`]): one or two warpgroups
/// (128 threads each) per block, each computing 64 rows of the block's `64·w × N` tile by
/// `wgmma.mma_async.m64nNk8`, whose operands the tensor cores read from shared memory through
/// descriptors. The instruction's rows are the GEMM's m, or its n where m < 64 ≤ n; N is 128,
/// 96, 64 or 32, the width whose tiles copy the fewest elements (64 or 32 under `tctile=64 |
/// 64w4`, 128 under `tctile=128`, narrower where two K tiles would not fit the device's shared
/// memory). The K tiles (16 deep) are copied by `cp.async` into a ring of
/// `KernelConfig::tc_stages` buffers of dynamic shared memory, each operand as K-major planes
/// (re and im apart for a complex one) of core matrices: element `(x, k)` of a plane at float
/// `(x / 8)·128 + (k / 4)·32 + (x % 8)·4 + k % 4`, so the core matrices adjacent along K are
/// 128 bytes apart (the descriptor's leading offset) and those along the rows 512 (its stride
/// offset). Per tile: wait for its copies, make them visible to the async proxy, one barrier;
/// the products of its two 8-deep steps are issued, then the copies of the tile `stages − 1`
/// ahead into the buffer the previous tile used, then the products are waited for. Under
/// `wgwait=1` they are not: the copies go `stages − 2` tiles ahead into the buffer of the tile
/// two back, and each tile waits only for the products of the one before it. `None` where not
/// even two K tiles of 64 columns fit (the `mma.sync` kernels then run the contraction).
///
/// The copies move raw f32 elements: the tensor cores read their upper 19 bits as TF32
/// (truncation), and a conjugated operand's imaginary plane is negated by the instruction's
/// operand scale. A complex product is four real ones (`re += ar·br − ai·bi`,
/// `im += ar·bi + ai·br`), a mixed one two.
///
/// Under `tc16=wgmma` ([`TcHalf::Wgmma`]) a product with a complex operand stored in 16 bits
/// multiplies 16-bit elements (`wgmma16`, `m64nNk16`): that operand's (re, im) pairs are
/// copied raw, one `cp.async` of 4 bytes each, into a single plane laid out as above (a pair
/// where a TF32 element would be, so the plane is a real operand of depth 2K with re and im
/// interleaved and the descriptors are unchanged); the other operand is loaded by its threads,
/// expanded into the planes `[re, −im]` and `[im, re]` (signs of conjugation folded in) and
/// rounded to the 16-bit format. Two products per 16-deep step, the real and the imaginary part.
fn emit_wgmma(ctx: &Ctx, gm: &Gemm, v: Value, name: &str) -> CompileResult<Option<Kernel>> {
    let kc = &ctx.target.kernels;
    // The instruction's rows (64 per warpgroup) are the GEMM's m, or its n where m < 64 ≤ n:
    // 64-row tiles of such a product leave the tensor cores idle for the rows past m (the seed
    // network's conv2 input gradient: m = 32 channels, n = a million pixels).
    let swap = gm.m < 64 && gm.n >= 64;
    let rows = if swap { gm.n } else { gm.m };
    let cols = if swap { gm.m } else { gm.n };
    // The operands by role: (GEMM extent, name of its index, its tile origin, k fast, complex, load).
    let a_op = (gm.m, "m", "m0", gm.a_k_fast, gm.ta == DType::C64, &gm.load_a);
    let b_op = (gm.n, "n", "n0", gm.b_k_fast, gm.tb == DType::C64, &gm.load_b);
    let (row_op, col_op) = if swap { (b_op, a_op) } else { (a_op, b_op) };
    let warpgroups = if rows > 64 { 2 } else { 1 };
    // With `wgprod=N`, N warpgroups after the multiplying ones do all the copies, each a
    // whole K tile at a time.
    // Under `fp32=3xtf32` each operand plane has a twin holding its elements' low parts (see
    // the split below), and every warpgroup copies (the split runs on the copier's elements).
    let split = ctx.split_tf32();
    let copies = if split { 2 } else { 1 };
    // Whether an operand is stored in 16 bits (`precision = bf16 | fp16`, see [`TcHalf`]):
    // such an element cannot be copied by `cp.async`, which moves bytes as they are, so the
    // thread loads it, widens it to f32 (exactly: TF32 holds every bf16 and f16 value) and
    // stores it into the stage itself. Copying warpgroups (`wgprod`) only issue `cp.async`.
    let half_stored = |load: &Load| stored_as(ctx, v, load).is_half();
    let any_half = half_stored(&gm.load_a) || half_stored(&gm.load_b);
    // 16-bit products (`tc16=wgmma`): the format, and whether the operand copied raw (a
    // complex one stored in that format) is the row operand; the other is expanded.
    let pairs = pair_format(ctx, gm, v)
        .filter(|_| kc.tc16_for(&ctx.target.device) == TcHalf::Wgmma)
        .and_then(|half| {
            let raw = |op: &(usize, &str, &str, bool, bool, &Load)| {
                op.4 && stored_as(ctx, v, op.5) == half.storage()
            };
            // (The row tile is the larger: its operand is the one copied raw where both can be;
            // under `tcraw=gather` the one gathered with padding, a convolution's patch, so
            // that the other, a plain load, is the one expanded.)
            let gathered = |op: &(usize, &str, &str, bool, bool, &Load)| !op.5.guard.is_empty();
            let col_first = kc.tc_raw_gather && raw(&col_op) && gathered(&col_op) && !gathered(&row_op);
            if raw(&row_op) && !col_first {
                Some((half, true))
            } else if raw(&col_op) {
                Some((half, false))
            } else {
                None
            }
        });
    // `wexpand=pre`: the expanded operand of 16-bit products, where it is a parameter whose
    // expansion fits the staging buffer, is copied from there as it is, two words an element
    // (`stage_kernel` writes it before the product); the weights' loads, roundings and stores
    // then leave every tile of every block.
    let staged = pairs.filter(|_| kc.tc_expand_pre).and_then(|(_, raw_row)| {
        let x = param_read(ctx, v, if raw_row { col_op.5 } else { row_op.5 })?;
        (8 * ctx.g.ty(x).shape.numel(ctx.batch) <= ctx.stage.1).then_some(x)
    });
    // Whether some copies are the threads' own stores, which the copying warpgroups cannot do.
    let thread_stores = if pairs.is_some() { staged.is_none() } else { any_half };
    let producers = if split || thread_stores { 0 } else { kc.wgmma_producers };
    let spec = producers > 0;
    let consumers = 128 * warpgroups;
    let fetchers = if spec { 128 } else { consumers };
    // 64 columns at most under `tctile=64` or `64w4` (measured: the ViT's tf32 step 80.0 ms
    // with 64, 75.1 with 128; the seed network's 13.9 and 12.8 ms).
    let narrow = matches!(kc.tc_tile, TcTile::Narrow | TcTile::FourWarps);
    let (bm, bk) = (64 * warpgroups, BK);
    let parts = |complex: bool| if complex { 2 } else { 1 };
    let (ca, cb) = (row_op.4, col_op.4);
    // Planes per operand in a stage: re and im apart for a complex one; under `tc16=wgmma` one
    // for the raw operand (its (re, im) pairs) and two for the expanded one.
    let (pa, pb) = match pairs {
        Some((_, true)) => (1, 2),
        Some((_, false)) => (2, 1),
        None => (parts(ca), parts(cb)),
    };
    let table_bytes = gm.taps.as_ref().map_or(0, |t| 8 * t.len());
    let optin = ctx.target.device.shared_per_block_optin;
    // Bytes of one K tile of both operands with `bn` columns.
    let stage_of = |bn: usize| 4 * bk * copies * (pa * bm + pb * bn);
    // Each stage of the ring has two mbarriers (8 bytes each) with a copying warpgroup.
    let bars = if spec { 16 } else { 0 };
    let fits = |bn: usize| 2 * (stage_of(bn) + bars) + table_bytes <= optin;
    // The narrower tile where two stages of the wide one do not fit the device; the `mma.sync`
    // kernels (which can stage one tile in static shared memory) where neither does.
    let threads = consumers + 128 * producers;
    // Of the widths that fit and divide among the threads (see the fetch below), the one
    // whose tiles copy the fewest elements per K step along a block row, tiles · (bm + bn),
    // the widest of those: the copies' instructions bound these kernels more than the
    // products do (bench/RESULTS.md, 2026-12-05 third session). So 288 columns at 64 rows
    // (the seed network's conv2 weight gradient) take three tiles of 96, not three of 128
    // (1.60 → 1.39 ms on an H100), and 32 columns one tile of 32; while 192 columns at 128
    // rows stay two tiles of 128, not three of 64 (a first form of this choice that padded
    // least took those, and the ViT's tf32 step went from 80.8 to 82.5 ms; it is 80.5 now).
    let divides = |bn: usize| fetch_step(col_op.3, bn, fetchers).is_some();
    // `tctile=128` keeps 128 columns (64 where there are no more), as before the other widths.
    let wide = kc.tc_tile == TcTile::Wide;
    let widths: &[usize] = match (narrow, wide) {
        (true, _) => &[64, 32],
        (false, true) if cols <= 64 => &[64],
        (false, true) => &[128, 64],
        (false, false) => &[128, 96, 64, 32],
    };
    let usable = widths.iter().copied().filter(|&bn| fits(bn) && divides(bn));
    let chosen = if wide {
        usable.max()
    } else {
        usable.min_by_key(|&bn| (cols.div_ceil(bn) * (bm + bn), std::cmp::Reverse(bn)))
    };
    let Some(bn) = chosen else {
        return Ok(None);
    };
    let gx = cols.div_ceil(bn);
    let gy = rows.div_ceil(bm);
    let tiles = gx * gy * gm.groups;
    let (splits, chunk) = split_k(ctx, gm, v, tiles, bk);
    // Sums of the output (`convstats=fuse`) take each output once, in a tile whose rows are
    // channels: not under split K, copying warpgroups, swapped tiles or split operands.
    if gm.sums.is_some() && (splits > 1 || spec || swap || split) {
        return Ok(None);
    }
    let grid = Grid::new(ctx, [gx, gy, gm.groups * splits], &kernel_name(ctx, v))?;
    let index = indexing(ctx, gm, v, if swap { [bn, bm, bk] } else { [bm, bn, bk] }, splits * chunk);
    // Floats of a plane of `x` rows, and the descriptor's offsets (bytes).
    let plane = |x: usize| x * bk;
    let (lbo, sbo) = (CORE_BYTES, bk / 4 * CORE_BYTES);
    let stage_floats = copies * (pa * plane(bm) + pb * plane(bn));
    let stage_bytes = 4 * stage_floats;
    // (A tile per copying warpgroup in flight and one being multiplied, where they fit.)
    let most = if spec { kc.tc_stages.max(producers + 1) } else { kc.tc_stages.max(2) };
    let stages = (2..=most).rev().find(|&n| n * (stage_bytes + bars) + table_bytes <= optin).unwrap_or(2);
    // With a tile's products in flight the buffer refilled is the one two tiles back.
    // Row operand in registers (`wga=regs`, the default): each tile's products are waited for
    // before its fragments' registers are loaded again.
    // (Products kept in flight, `wgwait=1`, read A from shared memory.)
    // (16-bit products too: the word of a TF32 fragment element is, in a plane of 16-bit
    // pairs, the register holding that row's two consecutive K, which is the 16-bit A
    // fragment's layout.)
    let a_regs = kc.wgmma_a == WgmmaA::Registers && !spec && !kc.wgmma_inflight;
    let inflight = kc.wgmma_inflight && stages >= 3 && !a_regs;
    let ahead = if inflight { stages - 2 } else { stages - 1 };
    let mut c = String::new();
    let _ = writeln!(c, "extern \"C\" __global__ void __launch_bounds__({threads}, 1) {name}(char* A) {{");
    // Registers per thread: what the block's size leaves each (a multiple of 8, at most 255),
    // or, where the multipliers need more (their accumulators and ~40 more), what the copiers
    // give up for them (`setmaxnreg`). The block's pool is what it was launched with, `threads`
    // × `base`, not the SM's 64K: an increase the pool cannot cover waits forever (a first
    // form that counted 64K hung on the device with 640 threads, 96 registers each).
    let regs = if spec {
        let base = (65536 / threads).min(256) / 8 * 8;
        let inc = (bn * parts(ca || cb) / 2 + 40).div_ceil(8) * 8;
        let inc = inc.min(240);
        let dec = (threads * base)
            .checked_sub(consumers * inc)
            .map(|left| left / (128 * producers) / 8 * 8)
            .unwrap_or(0);
        (inc > base && dec >= 24).then_some((dec.min(base), inc))
    } else {
        None
    };
    c.push_str(index.typedef());
    let _ =
        writeln!(c, "  const u32 tid = threadIdx.x, lane = tid & 31u, wg = tid >> 7, wl = (tid >> 5) & 3u;");
    c.push_str(&tile_origin(&grid, gm, [bm, bn], threads, chunk, swap));
    c.push_str("  extern __shared__ __align__(16) unsigned char gemm_smem[];\n");
    c.push_str("  float* const sm = reinterpret_cast<float*>(gemm_smem);\n");
    // The float offset of element (x, k) in a plane of core matrices.
    c.push_str(
        "  auto CM = [](u32 x, u32 k) -> u32 { return (x >> 3) * 128u + (k >> 2) * 32u + (x & 7u) * 4u + (k & 3u); };\n",
    );
    let mut accumulators = String::new();
    let _ = writeln!(accumulators, "  float cr[{}] = {{}};", bn / 2);
    if ca || cb {
        let _ = writeln!(accumulators, "  float ci[{}] = {{}};", bn / 2);
    }
    if !spec {
        c.push_str(&accumulators);
    }
    // The planes of stage `s`: A's re (and im), then B's; then, split, their low parts'
    // twins (`PArs`, …).
    let mut at = 0;
    let mut plane_at = |name: &str, x: usize, complex: bool, twin: &str, c: &mut String| {
        for part in if complex { ["r", "i"].as_slice() } else { ["r"].as_slice() } {
            let _ = writeln!(
                c,
                "  auto P{name}{part}{twin} = [&](u32 s) -> float* {{ return sm + s * {stage_floats}u + {at}u; }};"
            );
            at += plane(x);
        }
    };
    plane_at("A", bm, pa == 2, "", &mut c);
    plane_at("B", bn, pb == 2, "", &mut c);
    if split {
        plane_at("A", bm, ca, "s", &mut c);
        plane_at("B", bn, cb, "s", &mut c);
    }
    // The split (`fp32=3xtf32`), once a tile's copies have landed: each thread rounds the
    // elements it copied to TF32 in place (which the tensor cores then read exactly) and
    // writes the TF32 rounding of the remainder to the twin plane.
    if a_regs {
        // The thread's place in its warpgroup's A fragments (`wga=regs`, see the products).
        c.push_str("  const u32 fa = wl * 256u + (lane >> 2) * 4u + (lane & 3u);\n");
    }
    let mut split_pass = String::new();
    // Each thread copies `per` elements of an operand's [bx × bk] tile, all at one value of
    // one index: with `k_fast` at k = kq (tid % bk) and rows xq + r·step (xq = tid / bk, step =
    // threads / bk); else at row xq (tid % bx) and k = kq + r·step (kq = tid / bx, step =
    // threads / bx). With `step` a power of two, kq or xq < step fills the low bits that
    // r·step leaves clear, so the element's place in the planes is the thread's `CM(xq, kq)`
    // plus a constant; and what depends on the shared index alone is computed once per tile,
    // not per element: the per-element index arithmetic was most of the K loop's instructions
    // (the seed network's conv2 input gradient: 858 per 8 `wgmma`, offline SASS).
    // The copying threads' own indices (`ft`: the thread among them, with `wgprod=1`).
    let me = if spec { "ft" } else { "tid" };
    let mut fetch_decls = String::new();
    let mut fetch = String::new();
    let mut pre = None;
    // Under `tc16=wgmma`: the 16-bit pair of (lo, hi) as the float whose bits it is.
    if let Some((half, _)) = pairs {
        let _ = writeln!(
            c,
            "  auto PK = [](float lo, float hi) -> float {{ {} q; q = make_float2(lo, hi); return __uint_as_float(q.u); }};",
            match half {
                Half::Bf16 => "cbf16s",
                Half::F16 => "cf16s",
            }
        );
    }
    // The signs of the row and column operands' imaginary parts (conjugation).
    let sign = |conj: bool| if conj { -1 } else { 1 };
    let (sa, sb) = (sign(row_op.5.conj), sign(col_op.5.conj));
    for (op, (ext, len, x0, k_fast, cx, load), bx, is_row) in
        [("A", row_op, bm, true), ("B", col_op, bn, false)]
    {
        // Under `tc16=wgmma`, whether this operand is copied raw, or else expanded with the
        // signs (raw, own) of the imaginary parts.
        let raw = pairs.is_some_and(|(_, r)| r == is_row);
        let signs = if is_row { (sb, sa) } else { (sa, sb) };
        // (Staged: read from the staging buffer, at the parameter's own element index.)
        let staged_here = pairs.is_some() && !raw && staged.is_some();
        let staged_load = Load { ptr: format!("((float2*)(A + {}ull))", ctx.stage.0), ..load.clone() };
        let load = if staged_here { &staged_load } else { load };
        let expand = pairs.filter(|_| !raw && !staged_here).map(|_| signs);
        let per = bk * bx / fetchers;
        let step = fetch_step(k_fast, bx, fetchers)
            .ok_or_else(|| internal!("a {bx} × {bk} wgmma tile does not divide among {fetchers} threads"))?;
        let banks = ctx.target.kernels.tc_fetch_banks;
        let (kq, xq) = if k_fast && banks && step.is_multiple_of(8) {
            // `tcfetch=banks`: lanes 0–3 of a warp take 4 consecutive K (a core-matrix row's
            // 4 words), the next 3 lane bits 8 consecutive rows (the core matrix's rows, 4
            // words apart: 32 banks in all), the rest the K tile's other core matrices and
            // then the rows beyond.
            let quads = bk / 4;
            (
                format!("(({me} & 3u) | ((({me} >> 5u) % {quads}u) << 2u))"),
                format!("((({me} >> 2u) & 7u) | ((({me} >> 5u) / {quads}u) << 3u))"),
            )
        } else if k_fast {
            (format!("{me} % {bk}u"), format!("{me} / {bk}u"))
        } else if banks && bx.is_multiple_of(8) && step >= 2 {
            // Rows consecutive in memory: lanes 0–7 of a warp take 8 consecutive rows (the 8
            // rows of a core matrix, 4 words apart), the next lane bits up to 4 consecutive K
            // (the words between), the rest the row's core matrix and then the K beyond: a
            // core matrix's word of row x and K k lies in bank 4·(x % 8) + k % 4.
            let kb = step.trailing_zeros().min(2);
            let blocks = bx / 8;
            let hi = format!("({me} >> {}u)", 3 + kb);
            (
                format!("((({me} >> 3u) & {}u) | (({hi} / {blocks}u) << {kb}u))", (1 << kb) - 1),
                format!("(({me} & 7u) | (({hi} % {blocks}u) << 3u))"),
            )
        } else {
            (format!("{me} / {bx}u"), format!("{me} % {bx}u"))
        };
        let _ = writeln!(fetch_decls, "  const u32 {op}k = {kq}, {op}x = {xq}, {op}o = CM({op}x, {op}k);");
        // The plane offset of element r relative to the thread's.
        let offset = |r: usize| {
            let d = r * step;
            if k_fast {
                (d >> 3) * 128 + (d & 7) * 4
            } else {
                (d >> 2) * 32 + (d & 3)
            }
        };
        let widen = half_stored(load) && !raw;
        let copy = |r: usize| {
            let at = format!("{op}o + {}u", offset(r));
            // The expanded operand e of a product with the raw r = (rr, ri): the rows
            // [er, −sr·se·ei] and [se·ei, sr·er] (K twice as deep), whose products with r's
            // pairs are the product's re and im.
            if let Some((sr, se)) = expand {
                let neg = |s: i32| if s < 0 { "-" } else { "" };
                return if cx {
                    format!(
                        "const float2 w = (float2){}[ok ? (ix)({}) : (ix)0];\n        \
                         P{op}r(s)[{at}] = ok ? PK(w.x, {}w.y) : 0.0f; P{op}i(s)[{at}] = ok ? PK({}w.y, {}w.x) : 0.0f;",
                        load.ptr,
                        load.idx,
                        neg(-sr * se),
                        neg(se),
                        neg(sr)
                    )
                } else {
                    format!(
                        "const float w = (float){}[ok ? (ix)({}) : (ix)0];\n        \
                         P{op}r(s)[{at}] = ok ? PK(w, 0.0f) : 0.0f; P{op}i(s)[{at}] = ok ? PK(0.0f, {}w) : 0.0f;",
                        load.ptr,
                        load.idx,
                        neg(sr)
                    )
                };
            }
            if raw {
                // One 32-bit (re, im) pair per element.
                return format!("cp_async4(P{op}r(s) + {at}, src, ok);");
            }
            if widen && cx {
                format!(
                    "const float2 w = (float2){}[ok ? (ix)({}) : (ix)0];\n        \
                     P{op}r(s)[{at}] = ok ? w.x : 0.0f; P{op}i(s)[{at}] = ok ? w.y : 0.0f;",
                    load.ptr, load.idx
                )
            } else if widen {
                format!(
                    "const float w = (float){}[ok ? (ix)({}) : (ix)0];\n        P{op}r(s)[{at}] = ok ? w : 0.0f;",
                    load.ptr, load.idx
                )
            } else if cx || staged_here {
                format!("cp_async4(P{op}r(s) + {at}, src, ok);\n        cp_async4(P{op}i(s) + {at}, src + 1, ok);")
            } else {
                format!("cp_async4(P{op}r(s) + {at}, src, ok);")
            }
        };
        if split {
            for r in 0..per {
                for part in if cx { ["r", "i"].as_slice() } else { ["r"].as_slice() } {
                    let at = format!("{op}o + {}u", offset(r));
                    let _ = writeln!(
                        split_pass,
                        "    {{ float* const p = P{op}{part}(s) + {at}; const float x = *p; const u32 h = tf32(x); \
                         P{op}{part}s(s)[{at}] = __uint_as_float(tf32_lo(x, h)); *p = __uint_as_float(h); }}"
                    );
                }
            }
        }
        // A bounded load's guard alone zeroes what lies past K, and its rows past the extent
        // reach no stored output (`Load::bounded`).
        let bounded = load.bounded && !k_fast;
        // Tests that the extents make true everywhere are left out: a row extent that is a
        // multiple of the tile's rows (the tile origin is one), and a K that is a multiple of
        // the K tile (every split's chunk is too, so no tile passes its split's end).
        let rows_whole = ext.is_multiple_of(bx);
        let k_whole = gm.k.is_multiple_of(bk);
        let ok_of = |tests: &[String]| {
            let all: Vec<&String> = tests.iter().chain([&load.guard]).filter(|t| !t.is_empty()).collect();
            if all.is_empty() {
                "true".to_string()
            } else {
                all.iter().map(|t| format!("({t})")).collect::<Vec<_>>().join(" && ")
            }
        };
        let row = |plus: String| {
            if rows_whole {
                format!("const ix {len} = {x0} + {op}x{plus};")
            } else {
                format!("const ix xf = {x0} + {op}x{plus}, {len} = xf < {ext}u ? xf : (ix){}u;", ext - 1)
            }
        };
        let row_test = if rows_whole { String::new() } else { format!("xf < {ext}u") };
        let element = |r: usize| {
            let c = r * step;
            let (varying, tests) = if k_fast {
                (
                    format!(
                        "{}\n        {}",
                        row(format!(" + {c}u")),
                        load.pre_x.replace("\n      ", "\n        ")
                    ),
                    vec![if k_whole { String::new() } else { "kin".to_string() }, row_test.clone()],
                )
            } else if bounded {
                // (Signed: the table's address folds the constant.)
                let k = format!("const int k = (int)(k0 + {op}k) + {c};");
                (format!("{k}\n        {}", load.pre_k.replace("\n      ", "\n        ")), Vec::new())
            } else if k_whole {
                let k = format!("const ix k = k0 + {op}k + {c}u;");
                (
                    format!("{k}\n        {}", load.pre_k.replace("\n      ", "\n        ")),
                    vec![row_test.clone()],
                )
            } else {
                let k = format!("const ix kf = k0 + {op}k + {c}u, k = kf < ke ? kf : ke - 1u;");
                let tests = vec![row_test.clone(), "kf < ke".to_string()];
                (format!("{k}\n        {}", load.pre_k.replace("\n      ", "\n        ")), tests)
            };
            let ok = if bounded { format!("({})", load.guard) } else { ok_of(&tests) };
            let src = if widen || expand.is_some() {
                String::new()
            } else {
                format!(
                    "const float* src = (const float*)({} + (ok ? (ix)({}) : (ix)0));\n        ",
                    load.ptr, load.idx
                )
            };
            format!(
                "{{\n        {varying}{pre}const bool ok = {ok};\n        {src}{copy}\n      }}\n      ",
                pre = load.pre.replace("\n      ", "\n        "),
                copy = copy(r),
            )
        };
        fetch.push_str("    {\n");
        if k_fast {
            if k_whole {
                let _ = write!(fetch, "      const ix k = k0 + {op}k;\n      {}", load.pre_k);
            } else {
                let _ = write!(
                    fetch,
                    "      const ix kf = k0 + {op}k, k = kf < ke ? kf : ke - 1u;\n      const bool kin = kf < ke;\n      {}",
                    load.pre_k
                );
            }
        } else {
            let _ = write!(fetch, "      {}\n      {}", row(String::new()), load.pre_x);
        }
        for r in 0..per {
            fetch.push_str(&element(r));
        }
        fetch.truncate(fetch.trim_end().len());
        fetch.push_str("\n    }\n");
        if let (true, Some(x), Some((half, _))) = (staged_here, staged, pairs) {
            pre = Some((
                format!("{name}_w"),
                Box::new(stage_kernel(ctx, x, half, signs, &format!("{name}_w"))?),
            ));
        }
    }
    // The products of stage `s`: per 8-deep step, (accumulator, A plane, B plane, operand signs).
    let prods: Vec<(&str, &str, &str, i32, i32)> = match (pairs, ca, cb) {
        // 16-bit: the raw operand's pairs by the expanded operand's two planes.
        (Some((_, true)), ..) => vec![("cr", "Ar", "Br", 1, 1), ("ci", "Ar", "Bi", 1, 1)],
        (Some((_, false)), ..) => vec![("cr", "Ar", "Br", 1, 1), ("ci", "Ai", "Br", 1, 1)],
        (None, ca, cb) => match (ca, cb) {
            (true, true) => vec![
                ("cr", "Ar", "Br", 1, 1),
                ("cr", "Ai", "Bi", -sa * sb, 1),
                ("ci", "Ar", "Bi", 1, sb),
                ("ci", "Ai", "Br", sa, 1),
            ],
            (true, false) => vec![("cr", "Ar", "Br", 1, 1), ("ci", "Ai", "Br", sa, 1)],
            (false, true) => vec![("cr", "Ar", "Br", 1, 1), ("ci", "Ar", "Bi", 1, sb)],
            (false, false) => vec![("cr", "Ar", "Br", 1, 1)],
        },
    };
    let mut products = String::new();
    let _ = writeln!(products, "    #pragma unroll\n    for (u32 j = 0; j < {}u; ++j) {{", bk / 8);
    // Split, each product is three: low·high, high·low, high·high.
    let terms: &[(&str, &str)] = if split { &[("s", ""), ("", "s"), ("", "")] } else { &[("", "")] };
    if a_regs {
        // The thread's fragment of each A plane at this 8-deep step (rows 16·wl + lane/4 and
        // + 8, k = 8j + lane%4 and + 4: core matrices 128 floats apart along the rows, 32
        // along K), then a fence: the products read registers just written.
        let mut planes = vec!["Ar"];
        if pa == 2 {
            planes.push("Ai");
        }
        let twins: &[&str] = if split { &["", "s"] } else { &[""] };
        for plane in planes {
            for t in twins {
                let _ = writeln!(
                    products,
                    "      u32 f{plane}{t}[4];\n      {{ const float* const p = P{plane}{t}(s) + wg * {}u + j * 64u + fa; \
                     f{plane}{t}[0] = __float_as_uint(p[0]); f{plane}{t}[1] = __float_as_uint(p[128]); \
                     f{plane}{t}[2] = __float_as_uint(p[32]); f{plane}{t}[3] = __float_as_uint(p[160]); }}",
                    8 * sbo / 4
                );
            }
        }
        products.push_str("      wgmma_fence();\n");
    }
    for (acc, a, b, s_a, s_b) in &prods {
        for (ta, tb) in terms {
            if a_regs {
                let _ = match pairs {
                    Some((half, _)) => writeln!(
                        products,
                        "      wgmma16<{bn}, {}>({acc}, f{a}, wgmma_desc(P{b}(s) + j * 64u, {lbo}u, {sbo}u));",
                        matches!(half, Half::Bf16)
                    ),
                    None => writeln!(
                        products,
                        "      wgmma_tf32<{bn}, {s_a}, {s_b}>({acc}, f{a}{ta}, wgmma_desc(P{b}{tb}(s) + j * 64u, {lbo}u, {sbo}u));"
                    ),
                };
                continue;
            }
            // A warpgroup's 64 rows start 8 core-matrix rows into A's plane per warpgroup;
            // each 8-deep step (16 deep in 16-bit elements) two core matrices along K.
            if let Some((half, _)) = pairs {
                let _ = writeln!(
                    products,
                    "      wgmma16<{bn}, {}>({acc}, wgmma_desc(P{a}(s) + wg * {}u + j * 64u, {lbo}u, {sbo}u), wgmma_desc(P{b}(s) + j * 64u, {lbo}u, {sbo}u));",
                    matches!(half, Half::Bf16),
                    8 * sbo / 4
                );
                continue;
            }
            let _ = writeln!(
                products,
                "      wgmma_tf32<{bn}, {s_a}, {s_b}>({acc}, wgmma_desc(P{a}{ta}(s) + wg * {}u + j * 64u, {lbo}u, {sbo}u), wgmma_desc(P{b}{tb}(s) + j * 64u, {lbo}u, {sbo}u));",
                8 * sbo / 4
            );
        }
    }
    products.push_str("    }\n");
    if spec {
        // Copier `p` fills stage `s = t % stages` with tile `t` (t = p, p + N, …) once the
        // products of tile `t − stages` have released it (`empty`), and its copies arrive on
        // `full` as they land; the multiplying warpgroups wait on `full`, issue the tile's
        // products and, once those of the tile before are done (one group in flight), release
        // that tile's stage.
        let (dec, inc) = match regs {
            Some((dec, inc)) => {
                (format!("    setmaxnreg_dec<{dec}>();\n"), format!("  setmaxnreg_inc<{inc}>();\n"))
            }
            None => (String::new(), String::new()),
        };
        let _ = writeln!(
            c,
            "  __shared__ __align__(8) u64 full[{stages}], empty[{stages}];\n  \
             if (tid == 0u) {{\n    for (u32 s = 0; s < {stages}u; ++s) {{ mbar_init(&full[s], {fetchers}u); mbar_init(&empty[s], {consumers}u); }}\n  }}\n  \
             __syncthreads();\n  const ix tiles = (ke - kb + {}u) / {bk}u;\n  if (wg >= {warpgroups}u) {{\n{dec}    const u32 ft = tid & 127u;\n{}    \
             for (ix t = wg - {warpgroups}u; t < tiles; t += {producers}u) {{\n      const u32 s = t % {stages}u;\n      \
             if (t >= {stages}u) mbar_wait(&empty[s], ((t / {stages}u) & 1u) ^ 1u);\n      const ix k0 = kb + t * {bk}u;\n{}      \
             cp_async_mbar_arrive(&full[s]);\n    }}\n    cp_async_commit();\n    cp_async_wait<0>();\n    return;\n  }}\n{inc}",
            bk - 1,
            fetch_decls.replace("\n  ", "\n    ").replacen("  ", "    ", 1),
            fetch.replace("\n    ", "\n      ").replacen("    ", "      ", 1),
        );
        c.push_str(&accumulators);
        let _ = writeln!(
            c,
            "  u32 s = 0, ph = 0, sp = 0;\n  for (ix t = 0; t < tiles; ++t) {{\n    mbar_wait(&full[s], ph);\n    fence_async_shared();\n    wgmma_fence();"
        );
        c.push_str(&products);
        c.push_str(
            "    wgmma_commit();\n    wgmma_wait<1>();\n    if (t > 0u) mbar_arrive(&empty[sp]);\n    sp = s;\n",
        );
        let _ = writeln!(c, "    if (++s == {stages}u) {{ s = 0; ph ^= 1u; }}\n  }}\n  wgmma_wait<0>();");
    } else {
        c.push_str(&fetch_decls);
        let _ = writeln!(
            c,
            "  #pragma unroll\n  for (u32 p = 0; p < {ahead}u; ++p) {{\n    const ix k0 = kb + p * {bk}u; const u32 s = p;\n    if (k0 < ke) {{\n{fetch}    }}\n    cp_async_commit();\n  }}"
        );
        let _ = writeln!(c, "  u32 s = 0, sf = {ahead}u;\n  for (ix k0 = kb; k0 < ke; k0 += {bk}u) {{");
        let _ = writeln!(
            c,
            "    cp_async_wait<{}>();\n{split_pass}    fence_async_shared();\n    __syncthreads();\n    wgmma_fence();",
            ahead - 1
        );
        c.push_str(&products);
        c.push_str("    wgmma_commit();\n");
        let _ = writeln!(
            c,
            "    if (k0 + {a}u < ke) {{\n      const ix k0f = k0 + {a}u; const u32 sn = sf;\n      {{\n        const ix k0 = k0f; const u32 s = sn;\n{fetch}      }}\n    }}\n    cp_async_commit();",
            a = ahead * bk
        );
        let _ = writeln!(
            c,
            "    wgmma_wait<{}>();\n    s = s + 1u == {stages}u ? 0u : s + 1u;\n    sf = sf + 1u == {stages}u ? 0u : sf + 1u;\n  }}",
            usize::from(inflight)
        );
        if inflight {
            c.push_str("  wgmma_wait<0>();\n");
        }
    }
    let val = if ca || cb { "make_float2(cr[4 * i + q], ci[4 * i + q])" } else { "cr[4 * i + q]" };
    let mut store =
        if splits > 1 { format!("atomic_acc(&{}, {val});", gm.out) } else { format!("{} = {val};", gm.out) };
    if let Some(gs) = &gm.sums {
        let _ = writeln!(c, "  float sp[2][{}] = {{}};", gs.sums.parts);
        let (hwo, wo) = gs.hw;
        let coords = [
            format!("(n / {hwo}u)"),
            format!("(g * {}u + m)", gm.m),
            format!("((n % {hwo}u) / {wo}u)"),
            format!("(n % {wo}u)"),
        ];
        let linear = format!("((n / {hwo}u) * {}u + g * {}u + m) * {hwo}u + n % {hwo}u", gs.channels, gm.m);
        let mut point = String::new();
        gs.sums.point(ctx, v, val, &coords, &linear, "sp[q >> 1]", &mut point)?;
        store = format!("{{\n      {store}\n{point}      }}");
    }
    let _ = writeln!(
        c,
        "  #pragma unroll\n  for (int i = 0; i < {}; ++i)\n    #pragma unroll\n    for (int q = 0; q < 4; ++q) {{\n      \
         const ix {row} = {row}0 + wg * 64u + wl * 16u + (lane >> 2) + (q >= 2 ? 8u : 0u), {col} = {col}0 + i * 8u + 2u * (lane & 3u) + (q & 1);\n      \
         if (m < {}u && n < {}u) {store}\n    }}",
        bn / 8,
        gm.m,
        gm.n,
        row = row_op.1,
        col = col_op.1,
    );
    let mut post = None;
    let mut scratch = 0;
    if let Some(gs) = &gm.sums {
        let parts = gs.sums.parts;
        let values = gs.channels * parts;
        // The four threads of a quad share their rows: their partials meet by shuffles, and
        // the first stores the row's (one channel's) partial of this tile.
        let _ = writeln!(
            c,
            "  #pragma unroll\n  for (int r = 0; r < 2; ++r)\n    #pragma unroll\n    for (int k = 0; k < {parts}; ++k) {{\n      \
             float x = sp[r][k];\n      x += __shfl_xor_sync(0xffffffffu, x, 1);\n      x += __shfl_xor_sync(0xffffffffu, x, 2);\n      sp[r][k] = x;\n    }}\n  \
             if ((lane & 3u) == 0u) {{\n    float* part = (float*)(A + {at}ull) + n0 / {bn}u;\n    \
             #pragma unroll\n    for (int r = 0; r < 2; ++r) {{\n      const ix m = m0 + wg * 64u + wl * 16u + (lane >> 2) + (ix)r * 8u;\n      \
             if (m < {mm}u)\n        #pragma unroll\n        for (int k = 0; k < {parts}; ++k) part[((g * {mm}u + m) * {parts}u + k) * {gx}u] = sp[r][k];\n    }}\n  }}",
            at = gs.scratch,
            mm = gm.m,
        );
        scratch = gx * values * 4;
        let sum_name = format!("{name}_sum");
        let mut k = String::new();
        let _ = writeln!(k, "extern \"C\" __global__ void __launch_bounds__(256) {sum_name}(char* A) {{");
        k.push_str(index.typedef());
        let _ = writeln!(
            k,
            "  const u32 tid = threadIdx.x, q = blockIdx.x;\n  const float* part = (const float*)(A + {at}ull) + (ix)q * {gx}u;\n  double s = 0.0;\n  \
             for (u32 t = tid; t < {gx}u; t += 256u) s += (double)part[t];\n  __shared__ double sh[256];\n  sh[tid] = s;\n  __syncthreads();\n  \
             for (u32 w = 128u; w > 0u; w >>= 1) {{\n    if (tid < w) sh[tid] += sh[tid + w];\n    __syncthreads();\n  }}\n  \
             if (tid == 0u) {{\n    const double s = sh[0];\n    const ix ch = q / {parts}u;\n    const u32 k = q % {parts}u;\n    {{",
            at = gs.scratch,
        );
        gs.sums.store(ctx, &mut k)?;
        k.push_str("    }\n  }\n}\n");
        post = Some((
            sum_name,
            Box::new(Kernel {
                code: k,
                grid: [values as u32, 1, 1],
                block: [256, 1, 1],
                zero: Vec::new(),
                scratch: 0,
                pre: None,
                post: None,
                shared: 0,
                index,
            }),
        ));
    }
    c.push_str("}\n");
    let zero = if splits > 1 { vec![(ctx.offset(v)?, ctx.bytes(v))] } else { Vec::new() };
    Ok(Some(Kernel {
        code: c,
        grid: grid.launch,
        block: [threads as u32, 1, 1],
        zero,
        scratch,
        shared: stages * stage_bytes,
        index,
        pre,
        post,
    }))
}

/// The parameter whose buffer `load` reads, if it reads one (an input of contraction `v`).
fn param_read(ctx: &Ctx, v: Value, load: &Load) -> Option<Value> {
    ctx.g
        .node(v)
        .inputs
        .iter()
        .copied()
        .find(|&x| matches!(ctx.g.node(x).op, Op::Param { .. }) && ctx.ptr(x).is_ok_and(|p| p == load.ptr))
}

/// The kernel of `wexpand=pre` ([`KernelConfig::tc_expand_pre`]): parameter `x`'s elements
/// expanded as a 16-bit product's copying threads would expand them (`emit_wgmma`'s fetch,
/// signs `(sr, se)`: the raw operand's and `x`'s imaginary parts), into the staging buffer at
/// their own indices, two words an element: `[re, −sr·se·im]` and `[se·im, sr·re]` (a real
/// element `[x, 0]` and `[0, sr·x]`) rounded to the format.
pub(super) fn stage_kernel(
    ctx: &Ctx,
    x: Value,
    half: Half,
    (sr, se): (i32, i32),
    name: &str,
) -> CompileResult<Kernel> {
    let n = ctx.g.ty(x).shape.numel(ctx.batch);
    let grid = ctx.grid_for(n, BLOCK as usize);
    let index = ctx.indexing(&[x], &[n, grid as usize * BLOCK as usize]);
    let neg = |s: i32| if s < 0 { "-" } else { "" };
    let (load, words) = if ctx.dtype(x) == DType::C64 {
        (
            "const float2 w = src[i];",
            format!("PK(w.x, {}w.y), PK({}w.y, {}w.x)", neg(-sr * se), neg(se), neg(sr)),
        )
    } else {
        ("const float w = src[i];", format!("PK(w, 0.0f), PK(0.0f, {}w)", neg(sr)))
    };
    let code = format!(
        "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {name}(char* A) {{\n{}  \
         auto PK = [](float lo, float hi) -> float {{ {} q; q = make_float2(lo, hi); return __uint_as_float(q.u); }};\n  \
         const auto src = {};\n  float2* const dst = (float2*)(A + {}ull);\n  \
         for (ix i = (ix)blockIdx.x * {BLOCK}u + threadIdx.x; i < {n}u; i += (ix)gridDim.x * {BLOCK}u) {{\n    \
         {load}\n    dst[i] = make_float2({words});\n  }}\n}}",
        index.typedef(),
        match half {
            Half::Bf16 => "cbf16s",
            Half::F16 => "cf16s",
        },
        ctx.ptr(x)?,
        ctx.stage.0,
    );
    Ok(Kernel::grid_stride(code, grid, index))
}

/// The 16-bit format of contraction `v`'s products as `wgmma` pairs ([`TcHalf::Wgmma`]): the
/// precision's, where an operand is complex and stored in it (that operand is copied raw).
fn pair_format(ctx: &Ctx, gm: &Gemm, v: Value) -> Option<Half> {
    let half = match ctx.precision() {
        Precision::Bf16 => Half::Bf16,
        Precision::Fp16 => Half::F16,
        _ => return None,
    };
    let raw = |t: DType, load: &Load| t == DType::C64 && stored_as(ctx, v, load) == half.storage();
    (raw(gm.ta, &gm.load_a) || raw(gm.tb, &gm.load_b)).then_some(half)
}

/// How a GEMM operand of contraction `v` is stored: as the input whose buffer it reads.
fn stored_as(ctx: &Ctx, v: Value, load: &Load) -> Storage {
    ctx.g
        .node(v)
        .inputs
        .iter()
        .find(|&&x| ctx.ptr(x).is_ok_and(|p| p == load.ptr))
        .map_or(Storage::Full, |&x| ctx.storage(x))
}

/// How far apart the elements one thread copies of a `wgmma` operand tile of `bx` rows × [`BK`]
/// lie, for `threads` threads (see `emit_wgmma`'s fetch): along the rows (`k_fast`: each thread
/// at one k) or along K (each at one row). `None` where the tile does not divide among the
/// threads so, or the step is not a power of two (the planes' offsets would not be constants).
fn fetch_step(k_fast: bool, bx: usize, threads: usize) -> Option<usize> {
    let (step, whole) = if k_fast {
        let step = threads / BK;
        (step, threads.is_multiple_of(BK) && step > 0 && bx.is_multiple_of(step))
    } else {
        let step = threads / bx.min(threads);
        (step, threads.is_multiple_of(bx) && BK.is_multiple_of(step))
    };
    (whole && step.is_power_of_two()).then_some(step)
}

/// The tensor-core products of one K tile of stage `s`: per 8-deep slice, each warp's A
/// fragments (`tm` of 16 × 8, row-major: a0 (r, c), a1 (r+8, c), a2 (r, c+4), a3 (r+8, c+4))
/// and B fragments (`tn` of 8 × 8, col-major: b0 (c, n), b1 (c+4, n)), r = lane/4, c = lane%4,
/// then the real products of the complex ones. `raw`: the planes hold unconjugated elements
/// (asynchronous copies), so a conjugated operand's imaginary fragments are negated here.
/// `split` (`fp32=3xtf32`): each fragment register also has its low part (`…s`, `tf32_lo`),
/// and each real product is three: low·high, high·low, then high·high.
fn mma_products(gm: &Gemm, tm: usize, tn: usize, raw: bool, split: bool) -> String {
    let (ca, cb) = (gm.ta == DType::C64, gm.tb == DType::C64);
    let mut c = String::new();
    c.push_str("    #pragma unroll\n    for (int ks = 0; ks < 16; ks += 8) {\n");
    let sign = |plane: &str, conj: bool| if plane == "i" && conj && raw { "-" } else { "" };
    // Fragment register `arr[idx]` from the value `x`: rounded to TF32, and with `split` its
    // low part into `{arr}s[idx]`.
    let put = |arr: &str, idx: &str, x: &str| {
        if split {
            format!("{{ const float x = {x}; {arr}{idx} = tf32(x); {arr}s{idx} = tf32_lo(x, {arr}{idx}); }}")
        } else {
            format!("{arr}{idx} = tf32({x});")
        }
    };
    let decl = |arr: &str, dims: &str| {
        if split {
            format!("u32 {arr}{dims}, {arr}s{dims};")
        } else {
            format!("u32 {arr}{dims};")
        }
    };
    let mut planes_a = vec!["r"];
    if ca {
        planes_a.push("i");
    }
    let mut planes_b = vec!["r"];
    if cb {
        planes_b.push("i");
    }
    // Interleaved planes (asynchronous copies): one float2 load per fragment position.
    let pair = |plane: &str, (r, i): (&str, &str), idx: &str, conj: bool| {
        let n = if conj { "-" } else { "" };
        format!("{{ const float2 z = {plane}; {} {} }}", put(r, idx, "z.x"), put(i, idx, &format!("{n}z.y")))
    };
    if ca && raw {
        let conj = gm.load_a.conj;
        let at = |q: usize, k: &str, m: &str| {
            pair(&format!("Ac[s][{k}][{m}]"), ("ar", "ai"), &format!("[t][{q}]"), conj)
        };
        let _ = writeln!(
            c,
            "      {} {}\n      #pragma unroll\n      for (int t = 0; t < {tm}; ++t) {{\n        const u32 mb = wmi * {wmt}u + t * 16u + gr;\n        \
             {}\n        {}\n        {}\n        {}\n      }}",
            decl("ar", &format!("[{tm}][4]")),
            decl("ai", &format!("[{tm}][4]")),
            at(0, "ks + gc", "mb"),
            at(1, "ks + gc", "mb + 8u"),
            at(2, "ks + gc + 4u", "mb"),
            at(3, "ks + gc + 4u", "mb + 8u"),
            wmt = 16 * tm,
        );
        planes_a.clear();
    }
    if cb && raw {
        let conj = gm.load_b.conj;
        let at =
            |q: usize, k: &str| pair(&format!("Bc[s][{k}][nb]"), ("br", "bi"), &format!("[t][{q}]"), conj);
        let _ = writeln!(
            c,
            "      {} {}\n      #pragma unroll\n      for (int t = 0; t < {tn}; ++t) {{\n        const u32 nb = wni * {wnt}u + t * 8u + gr;\n        \
             {}\n        {}\n      }}",
            decl("br", &format!("[{tn}][2]")),
            decl("bi", &format!("[{tn}][2]")),
            at(0, "ks + gc"),
            at(1, "ks + gc + 4u"),
            wnt = 8 * tn,
        );
        planes_b.clear();
    }
    for p in &planes_a {
        let n = sign(p, gm.load_a.conj);
        let arr = format!("a{p}");
        let _ = writeln!(c, "      {}", decl(&arr, &format!("[{tm}][4]")));
        let _ = writeln!(
            c,
            "      #pragma unroll\n      for (int t = 0; t < {tm}; ++t) {{\n        const u32 mb = wmi * {wmt}u + t * 16u + gr;\n        \
             {} {}\n        {} {}\n      }}",
            put(&arr, "[t][0]", &format!("{n}A{p}[s][ks + gc][mb]")),
            put(&arr, "[t][1]", &format!("{n}A{p}[s][ks + gc][mb + 8u]")),
            put(&arr, "[t][2]", &format!("{n}A{p}[s][ks + gc + 4u][mb]")),
            put(&arr, "[t][3]", &format!("{n}A{p}[s][ks + gc + 4u][mb + 8u]")),
            wmt = 16 * tm,
        );
    }
    for p in &planes_b {
        let n = sign(p, gm.load_b.conj);
        let arr = format!("b{p}");
        let _ = writeln!(c, "      {}", decl(&arr, &format!("[{tn}][2]")));
        let _ = writeln!(
            c,
            "      #pragma unroll\n      for (int t = 0; t < {tn}; ++t) {{\n        const u32 nb = wni * {wnt}u + t * 8u + gr;\n        \
             {} {}\n      }}",
            put(&arr, "[t][0]", &format!("{n}B{p}[s][ks + gc][nb]")),
            put(&arr, "[t][1]", &format!("{n}B{p}[s][ks + gc + 4u][nb]")),
            wnt = 8 * tn,
        );
    }
    if ca && cb {
        let negate = |from: &str, to: &str| {
            format!("      u32 {to}[{tm}][4];\n      #pragma unroll\n      for (int t = 0; t < {tm}; ++t)\n        #pragma unroll\n        for (int q = 0; q < 4; ++q) {to}[t][q] = {from}[t][q] ^ 0x80000000u;")
        };
        let _ = writeln!(c, "{}", negate("ai", "an"));
        if split {
            let _ = writeln!(c, "{}", negate("ais", "ans"));
        }
    }
    let _ = writeln!(c, "      #pragma unroll\n      for (int i = 0; i < {tm}; ++i)\n        #pragma unroll\n        for (int j = 0; j < {tn}; ++j) {{");
    for (acc, a, b) in complex_products(ca, cb) {
        if split {
            // The small terms first: they are added to the accumulator before the large one.
            let _ = writeln!(c, "          mma_tf32({acc}[i][j], {a}s[i], {b}[j]);");
            let _ = writeln!(c, "          mma_tf32({acc}[i][j], {a}[i], {b}s[j]);");
        }
        let _ = writeln!(c, "          mma_tf32({acc}[i][j], {a}[i], {b}[j]);");
    }
    c.push_str("        }\n    }\n");
    c
}

/// The 16-bit operand format of [`TcHalf::Native`] and [`TcHalf::Wgmma`] products.
#[derive(Clone, Copy)]
pub(super) enum Half {
    Bf16,
    F16,
}

impl Half {
    /// The prelude function rounding an f32 to this format's bits.
    fn bits(self) -> &'static str {
        match self {
            Half::Bf16 => "bf16_bits",
            Half::F16 => "f16_bits",
        }
    }
    /// The storage of values kept in this format.
    pub(super) fn storage(self) -> Storage {
        match self {
            Half::Bf16 => Storage::Bf16,
            Half::F16 => Storage::F16,
        }
    }
    /// The prelude's `m16n8k16` product of this format.
    fn mma(self) -> &'static str {
        match self {
            Half::Bf16 => "mma_bf16",
            Half::F16 => "mma_f16",
        }
    }
}

/// The 16-bit tensor-core products of one `bk`-deep K tile of stage `s` (planes `[x][k]` of
/// 16-bit words): per 16-deep slice, each warp's A fragments (`tm` of 16 × 16, row-major:
/// a0 (r, 2c..2c+1), a1 (r+8, 2c..), a2 (r, 2c+8..), a3 (r+8, 2c+8..)) and B fragments (`tn`
/// of 16 × 8, col-major: b0 (2c..2c+1, n), b1 (2c+8.., n)), r = lane/4, c = lane%4, each
/// register two consecutive k read as one 32-bit word. The conjugations were applied when the
/// tiles were stored.
///
/// With `ldmatrix` the fragments come from `ldmatrix.x4` (one instruction per A fragment and
/// per pair of B fragments, instead of four and four 32-bit shared loads); rows of the planes
/// are 80 bytes, so the eight row addresses of each 8 × 8 matrix hit distinct banks.
fn mma16_products(gm: &Gemm, tm: usize, tn: usize, bk: usize, h: Half, ldmatrix: bool) -> String {
    let (ca, cb) = (gm.ta == DType::C64, gm.tb == DType::C64);
    let mut c = String::new();
    let _ = writeln!(c, "    #pragma unroll\n    for (int ks = 0; ks < {bk}; ks += 16) {{");
    let parts = |complex: bool| if complex { vec!["r", "i"] } else { vec!["r"] };
    let ldsm = ldmatrix && tn.is_multiple_of(2);
    if ldsm {
        for p in parts(ca) {
            // Matrices: rows 0-7 / 8-15 (lanes 0-7 / 8-15) at k 0-7, then the same at k 8-15.
            let _ = writeln!(
                c,
                "      u32 a{p}[{tm}][4];\n      #pragma unroll\n      for (int t = 0; t < {tm}; ++t)\n        ldsm4(a{p}[t], &A{p}[s][wmi * {wmt}u + t * 16u + (lane & 15u)][ks + ((lane >> 4) << 3)]);",
                wmt = 16 * tm,
            );
        }
        for p in parts(cb) {
            // Matrices: B tile t at k 0-7 and 8-15, then tile t + 1 at k 0-7 and 8-15.
            let _ = writeln!(
                c,
                "      u32 b{p}[{tn}][2];\n      #pragma unroll\n      for (int t = 0; t < {tn}; t += 2)\n        ldsm4(&b{p}[t][0], &B{p}[s][wni * {wnt}u + t * 8u + ((lane >> 4) << 3) + (lane & 7u)][ks + (((lane >> 3) & 1u) << 3)]);",
                wnt = 8 * tn,
            );
        }
    }
    for p in parts(ca).into_iter().filter(|_| !ldsm) {
        let _ = writeln!(c, "      u32 a{p}[{tm}][4];");
        let _ = writeln!(
            c,
            "      #pragma unroll\n      for (int t = 0; t < {tm}; ++t) {{\n        const u32 mb = wmi * {wmt}u + t * 16u + gr, kc = ks + 2u * gc;\n        \
             a{p}[t][0] = ld_u32(&A{p}[s][mb][kc]); a{p}[t][1] = ld_u32(&A{p}[s][mb + 8u][kc]);\n        \
             a{p}[t][2] = ld_u32(&A{p}[s][mb][kc + 8u]); a{p}[t][3] = ld_u32(&A{p}[s][mb + 8u][kc + 8u]);\n      }}",
            wmt = 16 * tm,
        );
    }
    for p in parts(cb).into_iter().filter(|_| !ldsm) {
        let _ = writeln!(c, "      u32 b{p}[{tn}][2];");
        let _ = writeln!(
            c,
            "      #pragma unroll\n      for (int t = 0; t < {tn}; ++t) {{\n        const u32 nb = wni * {wnt}u + t * 8u + gr, kc = ks + 2u * gc;\n        \
             b{p}[t][0] = ld_u32(&B{p}[s][nb][kc]); b{p}[t][1] = ld_u32(&B{p}[s][nb][kc + 8u]);\n      }}",
            wnt = 8 * tn,
        );
    }
    if ca && cb {
        // -Im(A) for Re(C): both 16-bit halves' sign bits flipped.
        let _ = writeln!(c, "      u32 an[{tm}][4];\n      #pragma unroll\n      for (int t = 0; t < {tm}; ++t)\n        #pragma unroll\n        for (int q = 0; q < 4; ++q) an[t][q] = ai[t][q] ^ 0x80008000u;");
    }
    let mma = h.mma();
    let _ = writeln!(c, "      #pragma unroll\n      for (int i = 0; i < {tm}; ++i)\n        #pragma unroll\n        for (int j = 0; j < {tn}; ++j) {{");
    for (acc, a, b) in complex_products(ca, cb) {
        let _ = writeln!(c, "          {mma}({acc}[i][j], {a}[i], {b}[j]);");
    }
    c.push_str("        }\n    }\n");
    c
}

/// The real products of a complex GEMM on re/im fragments, as (C plane, A fragment, B
/// fragment): `an` is the negated imaginary part of A.
fn complex_products(ca: bool, cb: bool) -> Vec<(&'static str, &'static str, &'static str)> {
    let mut prods = vec![("cr", "ar", "br")];
    match (ca, cb) {
        (true, true) => {
            prods.push(("cr", "an", "bi"));
            prods.push(("ci", "ar", "bi"));
            prods.push(("ci", "ai", "br"));
        }
        (true, false) => prods.push(("ci", "ai", "br")),
        (false, true) => prods.push(("ci", "ar", "bi")),
        (false, false) => {}
    }
    prods
}
