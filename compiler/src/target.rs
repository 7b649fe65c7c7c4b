//! The CUDA target: the facts of the device that code generation depends on, the kernel
//! choices it makes, and the contraction numerics — everything `back::cuda` reads besides the
//! program.
//!
//! [`CudaTarget::h200`] (the [`Default`]) is the fixed target of ahead-of-time emission
//! (`cvc emit --cuda`, CI); the runtime builds one from the attributes it queries at session
//! start ([`CudaDevice::from_queried`]). Kernel choices default to the fastest measured
//! (`bench/GPU-NOTES.md`); [`KernelConfig::parse`] reads the alternatives that
//! `bench/gpu-variants.sh` measures from a short spec such as `conv=gemm,fill=528`.

use crate::config::Precision;
use std::fmt;

/// What code generation needs to know about a CUDA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDevice {
    /// Streaming multiprocessors (132 on an H200).
    pub sm_count: usize,
    /// Compute capability `(major, minor)`: `(9, 0)` on an H200.
    pub compute_capability: (u32, u32),
    /// Shared memory one block may use without opting in, in bytes (48 KiB on every device
    /// since compute capability 2.0). The generated kernels declare their shared memory
    /// statically, which cannot exceed this limit.
    pub shared_per_block: usize,
    /// Shared memory one block may use after opting in, in bytes (227 KiB on an H200);
    /// available to dynamic shared memory only.
    pub shared_per_block_optin: usize,
    /// The largest grid, in blocks along x, y and z.
    pub max_grid: [usize; 3],
}

impl CudaDevice {
    /// An NVIDIA H200 (the GPU the defaults were measured on): 132 SMs, `sm_90`.
    pub fn h200() -> Self {
        CudaDevice {
            sm_count: 132,
            compute_capability: (9, 0),
            shared_per_block: 48 * 1024,
            shared_per_block_optin: 227 * 1024,
            max_grid: [(1 << 31) - 1, 65535, 65535],
        }
    }

    /// A device from the attributes the CUDA driver reports (as its `int`s): multiprocessor
    /// count, compute capability, maximum shared memory per block (default and opt-in) and
    /// maximum grid dimensions. A value that is not positive is an error naming the attribute.
    pub fn from_queried(
        sm_count: i32,
        compute_capability: (i32, i32),
        shared_per_block: i32,
        shared_per_block_optin: i32,
        max_grid: [i32; 3],
    ) -> Result<CudaDevice, String> {
        let positive = |v: i32, what: &str| {
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("the CUDA driver reports {v} for the device's {what}"))
        };
        let (major, minor) = compute_capability;
        let cc = |v: i32, what: &str| {
            u32::try_from(v).map_err(|_| format!("the CUDA driver reports {v} for the {what}"))
        };
        Ok(CudaDevice {
            sm_count: positive(sm_count, "multiprocessor count")?,
            compute_capability: (
                cc(major, "compute capability's major number")?,
                cc(minor, "compute capability's minor number")?,
            ),
            shared_per_block: positive(shared_per_block, "shared memory per block")?,
            // A driver without opt-in reports the default limit (or 0 on old devices).
            shared_per_block_optin: usize::try_from(shared_per_block_optin)
                .unwrap_or(0)
                .max(shared_per_block as usize),
            max_grid: [
                positive(max_grid[0], "maximum grid width")?,
                positive(max_grid[1], "maximum grid height")?,
                positive(max_grid[2], "maximum grid depth")?,
            ],
        })
    }

    /// The architecture NVRTC compiles for: `sm_90` for compute capability 9.0.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }

    /// Blocks that give every SM about eight at once (1056 on an H200): enough that the loads
    /// of many blocks are in flight together. Sums split their reduced range over blocks, and
    /// contractions their K range, until they have this many.
    pub fn fill_blocks(&self) -> usize {
        8 * self.sm_count
    }
}

/// How stride-1 convolutions and their input gradients are computed (in fp32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConvKernel {
    /// The direct kernel (`back/cuda/conv.rs`) for layers with at most 32 output channels per
    /// group, the implicit GEMM above (measured fastest on an H200).
    #[default]
    Direct32,
    /// The direct kernel also for layers with up to 64 output channels per group.
    Direct64,
    /// The implicit GEMM for every convolution.
    Gemm,
}

/// How many output channels each thread of the direct weight-gradient kernel owns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WgradOutputs {
    /// Chosen per layer: four for 8–32 input channels per group, else two (measured).
    #[default]
    ByLayer,
    /// Two for every layer.
    Two,
    /// Four for every layer.
    Four,
}

/// How the direct weight-gradient kernel stages its pixel tiles into shared memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WgradStaging {
    /// Each tile loaded into registers, stored, then multiplied (the default).
    #[default]
    Registers,
    /// The next tile loaded into registers while the current one is multiplied (`pf`;
    /// measured slower on an H200).
    Prefetch,
    /// The next tile copied by `cp.async` into a second pair of buffers while the current one
    /// is multiplied (`async`; full-width operands, devices of compute capability 8.0 on).
    Async,
}

/// How stride-1 weight gradients are computed (in fp32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgradKernel {
    /// The implicit GEMM (no direct kernel).
    Gemm,
    /// The direct kernel of `back/cuda/wgrad.rs`.
    Direct {
        /// Output channels per thread.
        outputs: WgradOutputs,
        /// How pixel tiles reach shared memory.
        staging: WgradStaging,
    },
}

impl Default for WgradKernel {
    fn default() -> Self {
        WgradKernel::Direct { outputs: WgradOutputs::ByLayer, staging: WgradStaging::Registers }
    }
}

/// The integer type the kernels index elements with (`back/cuda`'s module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IndexChoice {
    /// Chosen per kernel from the plan's shapes: 64-bit where an index the kernel forms can
    /// reach 2³¹, else 32-bit (fewer registers, cheaper division by constants).
    #[default]
    Auto,
    /// 64-bit in every kernel: tests the 64-bit code on small shapes.
    Wide,
}

/// The kernel choices of CUDA code generation. The defaults are the fastest measured on an
/// H200; the alternatives exist to be measured against them (`bench/gpu-variants.sh`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelConfig {
    /// Stride-1 convolutions: direct kernel or implicit GEMM.
    pub conv: ConvKernel,
    /// Stride-1 weight gradients: direct kernel (and its variant) or implicit GEMM.
    pub wgrad: WgradKernel,
    /// Blocks a contraction should fill before it stops splitting K (split-K matmuls and
    /// convolutions, the direct weight gradient's pixel splits) — and, when set, the blocks
    /// of a direct convolution that computes its output's sums ([`KernelConfig::conv_stats`];
    /// else 4 per SM); `None`: the device's [`CudaDevice::fill_blocks`].
    pub fill: Option<usize>,
    /// 32-deep K tiles in the fp32 implicit GEMM where tiles are at most 64 wide (half the
    /// barriers per multiply-add, twice the shared memory); `false`: 16-deep tiles.
    pub deep_k_tiles: bool,
    /// Input channels per shared-memory chunk of the direct convolution; `None`: as many as
    /// give 32 taps (3 for a 3 × 3 kernel).
    pub conv_chunk: Option<usize>,
    /// The most blocks a grid-stride kernel (elementwise, movement, one-warp sums) launches:
    /// beyond this, more blocks only add scheduling work while each thread still has
    /// several elements.
    pub grid_stride_blocks: usize,
    /// The integer type of element indices: per kernel from its extents, or 64-bit everywhere.
    pub index: IndexChoice,
    /// The most blocks an implicit-GEMM contraction's grid may have along y and z, below the
    /// device's limit: a grid that needs more is folded into x. `None`: the device's limit
    /// (65535); a small value tests the folded grids on small shapes.
    pub grid_yz: Option<usize>,
    /// How the tensor-core GEMM stages its K tiles in shared memory.
    pub tc_staging: TcStaging,
    /// The tensor-core GEMM's block tile.
    pub tc_tile: TcTile,
    /// How the tensor-core GEMM multiplies at the 16-bit precisions.
    pub tc16: TcHalf,
    /// How the 16-bit tensor-core GEMM loads its fragments from shared memory.
    pub tc_frag: TcFragments,
    /// How the fp32 GEMM multiplies complex by complex operands.
    pub cmul: ComplexProducts,
    /// The fp32 GEMM's block tile.
    pub fma_tile: FmaTile,
    /// How fused attention multiplies at the tensor-core precisions.
    pub attn: AttnKernel,
    /// The least blocks per SM the tensor-core GEMM's registers must allow
    /// (`__launch_bounds__(threads, N)`). `None`: 3 for the 16-bit products (80 registers; the
    /// ViT's matmuls do not spill, the seed network's weight gradients spill up to 188
    /// bytes) and for [`TcTile::FourWarps`] (168 registers, 12 warps per SM; none of the
    /// seed network's TF32 kernels spills), the compiler's choice for TF32 with 8 warps (about
    /// 100 registers: 2 blocks). Measured on
    /// an H200 (bench/RESULTS.md, 2026-12-04): 3 blocks took the ViT's bf16 step from 76.9 to
    /// 71.3 ms and the seed network's from 12.7 to 12.2 ms, but the seed's TF32 step from
    /// 16.7 to 17.3 ms; 4 blocks (64 registers) were slower on the ViT in bf16 (65.9 →
    /// 67.9 ms) and faster on the seed (11.9 → 11.7 ms). The halo tiles of [`TcConv::Halo`]
    /// take it too (`None`: 2 where a tile of 64 output channels leaves room, else 1).
    pub tc_min_blocks: Option<usize>,
    /// K tiles in the ring of shared-memory buffers of the tensor-core GEMM's asynchronous
    /// staging ([`TcStaging::Async`]): `N − 1` tiles are copied while one is multiplied
    /// (fewer where the device's shared memory does not hold `N`; at least 2).
    pub tc_stages: usize,
    /// How the tensor-core GEMM gathers convolution patches ([`TapGather`]).
    pub tc_taps: TapGather,
    /// How the runtime issues a step's kernels and memsets.
    pub launch: LaunchMode,
    /// The tensor-core instruction of the TF32 GEMM: Hopper's warpgroup `wgmma` reading its
    /// operands from shared memory (default, on compute capability 9.0), or `mma.sync` per warp.
    pub tc_mma: TcMma,
    /// Under [`TcMma::Wgmma`]: whether a tile's products stay in flight while the next tile is
    /// waited for and its products issued (`wgmma.wait_group 1`; the copies then run
    /// `tc_stages − 2` tiles ahead, where at least 3 stages fit), or are waited for before the
    /// next tile's barrier (`wait_group 0`, `tc_stages − 1` ahead).
    pub wgmma_inflight: bool,
    /// Under [`TcMma::Wgmma`]: warpgroups of their own that copy the K tiles (`wgprod=N`, 1 to
    /// 3; 0, the default: every warpgroup copies and multiplies). The warpgroups that multiply
    /// then hold only their accumulators, and the copies' index arithmetic runs beside the
    /// products instead of between them; copier `p` fills the tiles `p, p + N, …`. Copiers
    /// and multipliers hand the ring's buffers to each other through `mbarrier`s (a buffer's
    /// copies landed: `cp.async.mbarrier.arrive`; its products done: `mbarrier.arrive`)
    /// instead of block barriers; where the block's threads would get fewer registers than the
    /// multipliers need, the copiers give theirs up (`setmaxnreg`). Measured on an H100
    /// (bench/RESULTS.md, 2026-12-06): 2.6–5% slower than the default on the seed network, so
    /// not the default.
    pub wgmma_producers: usize,
    /// Consecutive outputs one block of a long reduction serves where the domain's innermost
    /// axis is kept (`colout=8|16|32`; a `[B, T, D]` gradient summed over B and T into D
    /// features): 256 / `colout` threads per output, and a warp reads `32 / (256 / colout)`
    /// rows of `colout` consecutive elements each.
    pub column_outputs: usize,
    /// How contractions multiply at `precision = fp32` ([`Fp32Products`]).
    pub fp32_products: Fp32Products,
    /// Under [`TcMma::Wgmma`]: where the instruction reads its row operand ([`WgmmaA`]).
    pub wgmma_a: WgmmaA,
    /// Under [`TcMma::Wgmma`] at `precision = tf32`: the kernel of stride-1 convolutions and
    /// their input gradients ([`TcConv`]).
    pub tc_conv: TcConv,
    /// The most consecutive elements one thread of an elementwise kernel takes per pass of
    /// its grid-stride loop (`ewvec=1|2|4`, default 4): every load of the pass is issued
    /// before its first store, operands that run along the innermost axis are read and written
    /// as one vector of up to 16 bytes, and per-channel operands once. Fewer where the domain's
    /// innermost extent is not a multiple, or where the vectors would pass 16 bytes.
    pub ew_vector: usize,
    /// The most small elementwise and data-movement kernels one launch runs (`ewbatch=N`,
    /// default 16; 1: each its own launch): kernels next to each other in the schedule, each
    /// of at most 2¹⁸ elements, that touch disjoint memory run as one kernel, each over its
    /// own blocks (`back/cuda/kernels.rs` `batches`). A step launches fewer kernels: a
    /// batchnorm's per-channel statistics and updates, the slices of a norm's parameters and
    /// their gradients' concatenations, the optimizer's updates.
    pub ew_batch: usize,
    /// Under [`TcMma::Wgmma`]: how the threads that copy an operand tile whose rows are
    /// consecutive in memory (`tcfetch=rows`, default: a warp's 32 threads take 32 consecutive
    /// rows at one K, which meet in 8 of shared memory's 32 banks in the core-matrix planes) or
    /// 8 consecutive rows at up to 4 consecutive K (`tcfetch=banks`: 32 banks where the tile
    /// lets a thread's K stride reach 4).
    pub tc_fetch_banks: bool,
    /// Under 16-bit `wgmma` products ([`TcHalf::Wgmma`]): where a product's expanded operand
    /// (the one not stored in the 16-bit format) is a parameter, a small kernel before the
    /// product writes its expansion (the `[re, −im]` and `[im, re]` words rounded to the
    /// format) once per step into a staging buffer past the arena, and the product's tiles copy
    /// those words by `cp.async` (`wexpand=pre`, default: the ViT's bf16 step 60.5 → 58.6 ms
    /// on an H100, the seed network's within noise); `wexpand=tile`: every tile of every
    /// block loads the f32 weights, rounds and stores them itself.
    pub tc_expand_pre: bool,
    /// Under 16-bit `wgmma` products, which operand is copied raw where both are complex and
    /// stored in the format (a weight gradient's output gradient and patches): the row
    /// operand (`tcraw=row`) or the one gathered with padding (`tcraw=gather`, default), so
    /// that the operand the copying threads load, round and store twice is a plain load (the
    /// seed network's conv2 and conv3 weight gradients 1.06 → 0.94 and 0.62 → 0.47 ms on an
    /// H100, its bf16 step 7.49 → 7.23 ms).
    pub tc_raw_gather: bool,
    /// Per-channel sums of a stride-1 convolution's output (a batchnorm's statistics: Σre,
    /// Σre², Σim, Σim² right after the first layer) computed by the direct convolution
    /// kernel from the values it stores, instead of by a reduction kernel that reads the
    /// whole output back (`convstats=fuse`, default); `convstats=apart`: a kernel of their own.
    pub conv_stats: bool,
}

/// The `wgmma` kernel of a stride-1 convolution (forward, or its input gradient as a
/// stride-1 transposed convolution) at `precision = tf32` (`compiler/src/back/cuda/halo.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TcConv {
    /// `tcconv=gemm`: the implicit GEMM of `gemm.rs`, which copies every patch element (one per
    /// tap and pixel) into shared memory.
    Gemm,
    /// `tcconv=grad` (default): halo tiles for the input gradients (stride-1 transposed
    /// convolutions), the implicit GEMM for the forward layers. Measured on an H100
    /// (bench/RESULTS.md, 2026-12-06): the halo tiles took the seed network's input gradients
    /// from 1.87 to 1.10 ms (second layer) and 0.61 to 0.50 ms (third), but its forward
    /// layers from 1.16 to 1.29–1.36 ms and 0.58 to 0.60–0.63 ms: the forward weight layout
    /// (output channel outermost) gathers the weight tiles from more scattered addresses.
    #[default]
    Grad,
    /// `tcconv=halo`: each block copies its pixel tile's input rows with their halo once per
    /// 16 input channels, and every tap reads its fragments from that one copy, at the tap's
    /// offset (`halo.rs`), forward layers and input gradients alike. Convolutions it does not
    /// serve (strided, dilated, grouped, real, fewer than 16 input channels, or images whose
    /// rows do not tile 64 or 128 pixels) take the implicit GEMM.
    Halo,
}

/// Where the `wgmma` GEMM's row operand (the instruction's A, 64 rows per warpgroup) is read
/// from (`compiler/src/back/cuda/gemm.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WgmmaA {
    /// `wga=smem`: through a shared-memory descriptor, as the column operand: each product
    /// reads its A tile from shared memory again (a complex product reads each plane twice).
    /// Also what `wgwait=1` and `wgprod=N` use.
    Shared,
    /// `wga=regs` (default): each thread loads its fragment of the warpgroup's A tile from
    /// shared memory into registers once per 8-deep step (four 32-bit loads per plane,
    /// conflict-free) and the products read them there, so the tensor cores read only B from
    /// shared memory; a tile's products are waited for before its registers are loaded again.
    /// Measured on an H100 (bench/RESULTS.md, 2026-12-06 05:00 UTC): the seed network's tf32
    /// step 11.720 → 11.570 ms (its GEMMs 7.615 → 7.394 ms), the ViT's 79.644 → 79.479 ms;
    /// under `fp32=3xtf32` the seed's 26.222 → 26.516 ms.
    #[default]
    Registers,
}

/// How the CUDA back end's contractions multiply at `precision = fp32`
/// (`compiler/src/back/cuda/gemm.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fp32Products {
    /// `fp32=fma`: f32 fused multiply-adds on the CUDA cores, each product rounded once.
    #[default]
    Fma,
    /// `fp32=3xtf32`: on TF32 tensor cores (compute capability 8.0 and newer; FMA elsewhere),
    /// each f32 operand split into a TF32 part and the TF32 rounding of its remainder, `x = h +
    /// l` to about 21 bits, and a product formed as `h·h' + h·l' + l·h'` with f32
    /// accumulation (the split-precision emulation of an f32 GEMM that CUTLASS names 3xTF32):
    /// the dropped `l·l'` is below 2⁻²² of the product, against 2⁻¹¹ for one TF32 product.
    /// The contractions take the tensor-core kernels of `precision = tf32` with three times
    /// their products; the fused attention and everything else stay as at `fma`.
    Tf32x3,
}

/// How the tensor-core GEMM (`compiler/src/back/cuda/gemm.rs`) finds a convolution patch's
/// element for a tap (input channel, kernel row, kernel column) and a pixel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TapGather {
    /// `tctaps=index`: the tap from its index (four divisions by constants per element).
    #[default]
    Index,
    /// `tctaps=table`: a table of the taps in shared memory, filled once per block: one shared
    /// load per element instead of the divisions, then the row and column bounds tests
    /// (offline SASS of the seed network's TF32 `mma.sync` kernels: 753 instead of 790
    /// instructions per 64 `mma` in a weight gradient's loop, 928 instead of 998 in an input
    /// gradient's; its bf16 kernels stop spilling). Measured on an H100 (bench/RESULTS.md,
    /// 2026-12-05 third session): the seed network's tf32 step 13.11 ms with it against 12.59
    /// without (the `wgmma` kernels), its bf16 step 11.29 against 11.50.
    Table,
    /// `tctaps=mask`: the table holds each tap's offset and its place in the kernel window;
    /// each thread computes once, for its pixel, a mask of the window's taps that fall inside
    /// the image (stride-1 transposed and all forward convolutions of at most 32 taps per
    /// window; the others, weight gradients included, as `Index`). An element is then a shared load, a bit test and an
    /// add. Offline SASS in bench/GPU-NOTES.md; not yet measured on a device.
    Mask,
}

/// Which tensor-core instruction the TF32 implicit GEMM (`compiler/src/back/cuda/gemm.rs`)
/// multiplies with, where its operands are stored in 32 bits. Measured side by side on an
/// H200 (bench/RESULTS.md, 2026-12-05): the ViT's tf32 step 82.5 ms with `Sync`, 75.1 with
/// `Wgmma` (0.910×); the seed network's 14.10 and 12.85 ms (0.911×).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TcMma {
    /// `mma.sync.m16n8k8` per warp, on fragments each thread loads from shared memory and
    /// rounds to TF32 (`cvt.rna`); staged, tiled and gathered as [`TcStaging`], [`TcTile`]
    /// and [`KernelConfig::tc_taps`] say. The form of every device before compute
    /// capability 9.0 and of the 16-bit products.
    Sync,
    /// `wgmma.mma_async.m64nNk8` per warpgroup of 128 threads (compute capability 9.0: the
    /// module is compiled for `sm_90a`): the tensor cores read both operands from shared
    /// memory through matrix descriptors, so no thread loads or converts a fragment. The
    /// operands are copied raw (`cp.async`, a ring of [`KernelConfig::tc_stages`] K tiles) into
    /// K-major planes of 8 × 4 "core matrices" and read as TF32 by the tensor cores, which use
    /// their upper 19 bits: operands are truncated, not rounded (twice the unit roundoff of
    /// `Sync`'s rounding). Complex products are four real ones on re / im planes, conjugation
    /// by the instruction's operand negation. The block tile is 64 or 128 rows (one or two
    /// warpgroups; the rows are the GEMM's n where m < 64 ≤ n) by 128, 96, 64 or 32 columns,
    /// the width whose tiles copy the fewest elements (at most 64 under `tctile=64` or `64w4`;
    /// 128 under `tctile=128`, 64 where N ≤ 64);
    /// `wgwait=1` keeps a tile's products in flight ([`KernelConfig::wgmma_inflight`]). Other
    /// precisions, 16-bit operands and devices other than compute capability 9.0 keep `Sync`.
    #[default]
    Wgmma,
}

/// How the CUDA runtime issues a training step's launch list (`runtime/src/cuda`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LaunchMode {
    /// One CUDA graph of the whole list, instantiated at the first step and launched once per
    /// step: the host makes one call instead of one per kernel, and the device runs the
    /// kernels back to back (the ViT's step is about 1,500 launches, a third of them tiny
    /// parameter kernels).
    #[default]
    Graph,
    /// Each kernel and memset launched on the stream in turn.
    Stream,
}

/// How the fused attention kernels (`compiler/src/back/cuda/attention.rs`) form their
/// products at `precision = tf32 | bf16 | fp16`. At fp32, and for the magnitude score or heads
/// wider than 64, they always use FMA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttnKernel {
    /// Every product (`q·kᴴ`, `dO·vᴴ`, `p·v`, `g·k`, `gᵀ·q`, `p̃ᵀ·dO`) on TF32 tensor cores
    /// (`mma.sync.m16n8k8`, f32 accumulation) over the interleaved real view of the complex
    /// rows: `Re(q·conj k)` is the real dot product of the two rows read as `2·D` reals.
    #[default]
    TensorCore,
    /// The fp32 FMA kernels, as at `precision = fp32`.
    Fma,
}

/// How the fp32 (FMA) implicit GEMM forms a complex × complex product
/// (`compiler/src/back/cuda/gemm.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ComplexProducts {
    /// Four real products per complex term: `re = Σ ar·br − ai·bi`, `im = Σ ar·bi + ai·br`.
    #[default]
    Four,
    /// Three (Gauss): `t₁ = Σ ar·br`, `t₂ = Σ ai·bi`, `t₃ = Σ (ar + ai)(br + bi)`, then
    /// `re = t₁ − t₂`, `im = t₃ − t₁ − t₂`. A quarter fewer multiply-adds (the operand sums
    /// are formed once per register-tile row and column), three accumulators per output
    /// instead of two, and an error bound of `Σ (|ar| + |ai|)(|br| + |bi|)` rather than
    /// `Σ |a||b|` on the imaginary part.
    Three,
}

/// The fp32 implicit GEMM's block tile (256 threads on a 16 × 16 grid).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FmaTile {
    /// At most 64 × 64 (32 × 128 for M ≤ 32): register tiles of 4 × 4.
    #[default]
    Narrow,
    /// At most 128 × 64 (M ≥ 128): register tiles of 8 × 4.
    Tall,
}

/// How the 16-bit tensor-core GEMM (`m16n8k16`) reads its operand fragments from shared memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TcFragments {
    /// One 32-bit shared load per fragment register (four per A fragment, two per B fragment).
    Lds,
    /// `ldmatrix.x4`: one instruction per A fragment and per two B fragments.
    #[default]
    Ldmatrix,
}

/// How the tensor-core implicit GEMM (TF32 and the 16-bit precisions) brings each 16-deep K
/// tile into shared memory (`compiler/src/back/cuda/gemm.rs`). Measured side by side on an
/// H200 (bench/RESULTS.md, seed network at batch 1024): TF32 steps of 16.79 ms with `Async`,
/// 17.30 with `Prefetch`, 17.33 with `Plain`; bf16 (whose operands cannot be copied
/// asynchronously) 19.54 ms with `Plain`, 20.43 with `Prefetch`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TcStaging {
    /// Gather, store, barrier, multiply, barrier: the loads wait for the products before them.
    Plain,
    /// The next tile's gathers are issued into registers before this tile's products and
    /// stored into a second shared buffer (one barrier per tile; one buffer, two barriers,
    /// where two do not fit).
    Prefetch,
    /// `cp.async` copies of the next tiles into a ring of buffers ([`KernelConfig::tc_stages`])
    /// in dynamic shared memory while this one is multiplied, one barrier per tile, where
    /// both operands are stored in 32 bits and two buffers fit; otherwise `Plain`
    /// (16-bit operands widen on their way to shared memory, which a copy cannot do).
    #[default]
    Async,
}

/// The tensor-core GEMM's block tile and warps. Measured side by side on an H200
/// (bench/RESULTS.md, 2026-12-04 sixth session): with 4 warps of 32 × 32 at 3 blocks per SM
/// the ViT's tf32 step took 87.4 ms against 96.2 with 8 warps of 32 × 16, the seed network's
/// 14.1 against 15.1; in bf16 the 4 warps were slower (ViT 72.0–74.9 against 65.9 ms, seed
/// 11.3–11.6 against 11.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TcTile {
    /// [`TcTile::FourWarps`] for TF32 products, [`TcTile::Narrow`] for 16-bit ones.
    #[default]
    ByPrecision,
    /// 64 × 64 (32 × 128 for M ≤ 32), 8 warps: warp tiles of 32 × 16.
    Narrow,
    /// 128 × 64 (64 × 128 for M ≤ 64; 32 × 128 for M ≤ 32), 8 warps: warp tiles of 32 × 32.
    Wide,
    /// 64 × 64 (32 × 128 for M ≤ 32) with 4 warps of 32 × 32: per `mma`, half the B
    /// fragment loads and conversions of [`TcTile::Narrow`]'s 32 × 16 warp tiles, and each
    /// thread copies twice the elements per K tile.
    FourWarps,
}

/// How the tensor-core implicit GEMM multiplies at `precision = bf16 | fp16`. Measured side by
/// side on an H200 with `mma.sync` (bench/RESULTS.md, seed network at batch 1024): bf16
/// 16.10 ms with `Native`, 19.70 with `Tf32`; fp16 16.08 and 19.58 ms. With `wgmma`, see
/// [`TcHalf::Auto`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TcHalf {
    /// Where `wgmma` runs (compute capability 9.0 under `mma=wgmma`, the default there):
    /// `Wgmma` for every product with a complex operand stored in the precision's format, and
    /// for the others `Tf32` in the convolution family, `Native` for matmuls; on other
    /// devices `Native` ([`KernelConfig::tc16_for`]). Measured side by side on an H100
    /// (bench/RESULTS.md, 2026-12-07): the seed network's bf16 step 11.19 ms with `Native`,
    /// 9.41 with `Tf32` (its convolutions 8.52 → 6.70 ms), 7.97 with `Wgmma` (5.18 ms); the
    /// ViT's 63.7 ms with matmuls `Native`, 70.5 with `Tf32` (none of its matmuls faster,
    /// 31.6 → 38.4 ms in all), 62.2 with `Wgmma`.
    #[default]
    Auto,
    /// Operands widened to TF32 (exactly, for 16-bit ones; 32-bit ones read as TF32) and
    /// multiplied as at `precision = tf32`: on `wgmma` where it runs, each 16-bit element
    /// loaded, widened and stored into shared memory by its thread (a `cp.async` cannot
    /// widen), 32-bit ones copied raw; else `mma.sync.m16n8k8`.
    Tf32,
    /// Operands rounded to the precision's 16-bit format (32-bit weights too, as PyTorch's
    /// autocast casts them) and multiplied 16 deep (`mma.sync.m16n8k16`, f32 accumulation):
    /// half the shared memory per element, half the instructions per product, no conversion
    /// per fragment.
    Native,
    /// `tc16=wgmma`: 16-bit products on Hopper's warpgroup instruction
    /// (`wgmma.m64nNk16.f32.bf16.bf16` or `.f16.f16`, f32 accumulation) where the product has a
    /// complex operand stored in 16 bits: that operand is copied raw by `cp.async` (each
    /// element's (re, im) pair as one 32-bit word, so its K tile is a real operand twice as
    /// deep, re and im interleaved), and the other is expanded by its copying threads into the
    /// two operands that turn such a product into the complex one (`[re, −im]` and `[im, re]`,
    /// conjugations folded in), rounded to the 16-bit format (32-bit weights too, as under
    /// `Native`). Two products per step instead of the four of a complex TF32 product, each at
    /// twice TF32's rate, and one copy per element of the raw operand instead of two. A product
    /// without a complex 16-bit operand runs as under `Tf32`; off compute capability 9.0 or
    /// `mma=wgmma`, every product as under `Native`. The halo tiles take it too: their staged
    /// input rows are the raw pairs, each fragment register one of them.
    Wgmma,
}

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig {
            conv: ConvKernel::default(),
            wgrad: WgradKernel::default(),
            fill: None,
            deep_k_tiles: false,
            conv_chunk: None,
            grid_stride_blocks: 16384,
            index: IndexChoice::Auto,
            grid_yz: None,
            tc_staging: TcStaging::default(),
            tc_tile: TcTile::default(),
            tc16: TcHalf::default(),
            tc_frag: TcFragments::default(),
            cmul: ComplexProducts::default(),
            fma_tile: FmaTile::default(),
            attn: AttnKernel::default(),
            tc_min_blocks: None,
            tc_stages: 3,
            tc_taps: TapGather::Index,
            launch: LaunchMode::default(),
            tc_mma: TcMma::default(),
            wgmma_inflight: false,
            wgmma_producers: 0,
            column_outputs: 8,
            fp32_products: Fp32Products::Fma,
            wgmma_a: WgmmaA::Registers,
            tc_conv: TcConv::default(),
            ew_vector: 4,
            ew_batch: 16,
            tc_fetch_banks: false,
            tc_expand_pre: true,
            tc_raw_gather: true,
            conv_stats: true,
        }
    }
}

/// The keys of a kernel spec, with their values, for messages and `--help`.
pub const KERNEL_SPEC_KEYS: &str = "conv=direct32|direct64|gemm, wgrad=direct|gemm|ot2|ot4|pf|ot2pf|ot4pf|async|ot2async|ot4async, \
                                    fill=BLOCKS, bk=16|32, ck=CHANNELS, grid=BLOCKS, index=auto|64, yz=BLOCKS, \
                                    tc=plain|prefetch|async, tctile=auto|64|128|64w4, tc16=auto|native|tf32|wgmma, frag=ldmatrix|lds, \
                                    cmul=4m|3m, ftile=64|128, attn=tc|fma, tcblocks=BLOCKS, \
                                    tcstages=2..8, tctaps=index|table|mask, launch=graph|stream, mma=sync|wgmma, wgwait=0|1, wgprod=0..3, \
                                    colout=8|16|32, fp32=fma|3xtf32, wga=regs|smem, tcconv=grad|gemm|halo, ewvec=1|2|4, ewbatch=1..64, tcfetch=rows|banks, wexpand=pre|tile, tcraw=gather|row, convstats=fuse|apart";

impl KernelConfig {
    /// The 16-bit products' form on `device`: [`TcHalf::Auto`] resolved, and
    /// [`TcHalf::Wgmma`] where it cannot run. (Which products take the 16-bit `wgmma` pairs,
    /// and what the others run, is the GEMM's choice: see [`TcHalf::Auto`].)
    pub fn tc16_for(&self, device: &CudaDevice) -> TcHalf {
        match self.tc16 {
            TcHalf::Auto if device.compute_capability == (9, 0) && self.tc_mma == TcMma::Wgmma => {
                TcHalf::Wgmma
            }
            TcHalf::Auto => TcHalf::Native,
            TcHalf::Wgmma if device.compute_capability != (9, 0) || self.tc_mma != TcMma::Wgmma => {
                TcHalf::Native
            }
            other => other,
        }
    }

    /// Reads a kernel spec: comma-separated `key=value` pairs over the defaults, e.g.
    /// `conv=gemm,fill=528` (`default` or an empty spec: the defaults). The keys:
    /// - `conv`: `direct32` (default), `direct64` or `gemm` ([`ConvKernel`]);
    /// - `wgrad`: `direct` (default), `gemm`, or the direct kernel with `ot2` / `ot4` output
    ///   channels per thread and/or `pf` prefetching (`ot4pf`) or `async` copies (`ot2async`)
    ///   ([`WgradKernel`]);
    /// - `fill`: blocks a split-K contraction fills ([`KernelConfig::fill`]);
    /// - `bk`: `16` (default) or `32`, the fp32 GEMM's K tile depth;
    /// - `ck`: input channels per chunk of the direct convolution;
    /// - `grid`: the most blocks of a grid-stride kernel;
    /// - `index`: `auto` (default: 32- or 64-bit indices per kernel, from its extents) or `64`
    ///   (64-bit in every kernel; `CVC_KERNELS=index=64` runs the GPU tests on that code);
    /// - `yz`: the most blocks of an implicit-GEMM grid along y and z ([`KernelConfig::grid_yz`]);
    /// - `tc`: `plain`, `prefetch` or `async` (default), the tensor-core GEMM's staging of K
    ///   tiles ([`TcStaging`]);
    /// - `tctile`: `auto` (default: by precision), `64`, `128` or `64w4` (4 warps), the
    ///   tensor-core GEMM's block tile ([`TcTile`]);
    /// - `tc16`: `auto` (default), `native`, `tf32` or `wgmma`, the tensor-core GEMM's operands at the
    ///   16-bit precisions ([`TcHalf`]);
    /// - `frag`: `ldmatrix` (default) or `lds`, the 16-bit tensor-core GEMM's fragment loads
    ///   ([`TcFragments`]);
    /// - `cmul`: `4m` (default) or `3m`, the fp32 GEMM's complex products ([`ComplexProducts`]);
    /// - `ftile`: `64` (default) or `128`, the fp32 GEMM's block tile ([`FmaTile`]);
    /// - `attn`: `tc` (default) or `fma`, the fused attention's products at the tensor-core
    ///   precisions ([`AttnKernel`]);
    /// - `tcblocks`: the least blocks per SM that the tensor-core GEMM's registers must allow
    ///   ([`KernelConfig::tc_min_blocks`]);
    /// - `tcstages`: 2 to 8, the K tiles of the tensor-core GEMM's asynchronous staging
    ///   ([`KernelConfig::tc_stages`]);
    /// - `tctaps`: `index` (default), `table` or `mask`, how the tensor-core GEMM gathers
    ///   convolution patches ([`TapGather`]);
    /// - `launch`: `graph` (default) or `stream`, how the runtime issues a step ([`LaunchMode`]);
    /// - `mma`: `wgmma` (default; on compute capability 9.0) or `sync`, the TF32 GEMM's
    ///   tensor-core instruction ([`TcMma`]);
    /// - `wgwait`: `0` (default) or `1`, the `wgmma` products kept in flight across a tile
    ///   ([`KernelConfig::wgmma_inflight`]);
    /// - `wgprod`: `0` (default) to `3`, the warpgroups of the `wgmma` GEMM that only copy
    ///   ([`KernelConfig::wgmma_producers`]);
    /// - `colout`: `8` (default), `16` or `32`, the consecutive outputs of a block of a
    ///   reduction that keeps the innermost axis ([`KernelConfig::column_outputs`]);
    /// - `fp32`: `fma` (default) or `3xtf32`, the contractions' products at `precision = fp32`
    ///   ([`Fp32Products`]);
    /// - `wga`: `regs` (default) or `smem`, where `wgmma` reads its row operand ([`WgmmaA`]);
    /// - `tcconv`: `grad` (default), `gemm` or `halo`, the `wgmma` kernel of stride-1
    ///   convolutions and their input gradients ([`TcConv`]);
    /// - `ewvec`: `4` (default), `2` or `1`, the consecutive elements a thread of an
    ///   elementwise kernel takes ([`KernelConfig::ew_vector`]);
    /// - `ewbatch`: `16` (default), from 1 (off) to 64, the most small elementwise and
    ///   data-movement kernels one launch runs ([`KernelConfig::ew_batch`]);
    /// - `tcfetch`: `rows` (default) or `banks`, how the `wgmma` GEMM's copying threads walk a
    ///   tile ([`KernelConfig::tc_fetch_banks`]);
    /// - `wexpand`: `pre` (default) or `tile`, where the 16-bit products expand a parameter
    ///   operand ([`KernelConfig::tc_expand_pre`]);
    /// - `tcraw`: `gather` (default) or `row`, which operand of 16-bit products is copied raw
    ///   ([`KernelConfig::tc_raw_gather`]);
    /// - `convstats`: `fuse` (default) or `apart`, whether a direct convolution computes the
    ///   per-channel sums of its output ([`KernelConfig::conv_stats`]).
    ///
    /// ```
    /// use cvc_compiler::target::{ConvKernel, KernelConfig};
    /// let k = KernelConfig::parse("conv=gemm,fill=528").unwrap();
    /// assert_eq!((k.conv, k.fill), (ConvKernel::Gemm, Some(528)));
    /// assert_eq!(KernelConfig::parse(&k.to_string()).unwrap(), k);
    /// assert!(KernelConfig::parse("conv=fast").is_err());
    /// ```
    pub fn parse(spec: &str) -> Result<KernelConfig, String> {
        let mut k = KernelConfig::default();
        let spec = spec.trim();
        if spec.is_empty() || spec == "default" {
            return Ok(k);
        }
        for item in spec.split(',').map(str::trim) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(format!("kernel choice `{item}` is not `key=value` (keys: {KERNEL_SPEC_KEYS})"));
            };
            let (key, value) = (key.trim(), value.trim());
            let bad = || format!("`{key}={value}`: {key} takes {}", Self::values_of(key));
            let count = || value.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(bad);
            match key {
                "conv" => {
                    k.conv = match value {
                        "direct32" => ConvKernel::Direct32,
                        "direct64" => ConvKernel::Direct64,
                        "gemm" => ConvKernel::Gemm,
                        _ => return Err(bad()),
                    }
                }
                "wgrad" => k.wgrad = Self::parse_wgrad(value).ok_or_else(bad)?,
                "fill" => k.fill = Some(count()?),
                "bk" => {
                    k.deep_k_tiles = match value {
                        "16" => false,
                        "32" => true,
                        _ => return Err(bad()),
                    }
                }
                "ck" => k.conv_chunk = Some(count()?),
                "grid" => k.grid_stride_blocks = count()?,
                "yz" => k.grid_yz = Some(count()?),
                "index" => {
                    k.index = match value {
                        "auto" => IndexChoice::Auto,
                        "64" => IndexChoice::Wide,
                        _ => return Err(bad()),
                    }
                }
                "tc" => {
                    k.tc_staging = match value {
                        "plain" => TcStaging::Plain,
                        "prefetch" => TcStaging::Prefetch,
                        "async" => TcStaging::Async,
                        _ => return Err(bad()),
                    }
                }
                "tctile" => {
                    k.tc_tile = match value {
                        "auto" => TcTile::ByPrecision,
                        "64" => TcTile::Narrow,
                        "128" => TcTile::Wide,
                        "64w4" => TcTile::FourWarps,
                        _ => return Err(bad()),
                    }
                }
                "tc16" => {
                    k.tc16 = match value {
                        "auto" => TcHalf::Auto,
                        "native" => TcHalf::Native,
                        "tf32" => TcHalf::Tf32,
                        "wgmma" => TcHalf::Wgmma,
                        _ => return Err(bad()),
                    }
                }
                "frag" => {
                    k.tc_frag = match value {
                        "ldmatrix" => TcFragments::Ldmatrix,
                        "lds" => TcFragments::Lds,
                        _ => return Err(bad()),
                    }
                }
                "cmul" => {
                    k.cmul = match value {
                        "4m" => ComplexProducts::Four,
                        "3m" => ComplexProducts::Three,
                        _ => return Err(bad()),
                    }
                }
                "ftile" => {
                    k.fma_tile = match value {
                        "64" => FmaTile::Narrow,
                        "128" => FmaTile::Tall,
                        _ => return Err(bad()),
                    }
                }
                "attn" => {
                    k.attn = match value {
                        "tc" => AttnKernel::TensorCore,
                        "fma" => AttnKernel::Fma,
                        _ => return Err(bad()),
                    }
                }
                "tcblocks" => k.tc_min_blocks = Some(count()?),
                "tctaps" => {
                    k.tc_taps = match value {
                        "index" => TapGather::Index,
                        "table" => TapGather::Table,
                        "mask" => TapGather::Mask,
                        _ => return Err(bad()),
                    }
                }
                "tcstages" => k.tc_stages = count().ok().filter(|n| (2..=8).contains(n)).ok_or_else(bad)?,
                "launch" => {
                    k.launch = match value {
                        "graph" => LaunchMode::Graph,
                        "stream" => LaunchMode::Stream,
                        _ => return Err(bad()),
                    }
                }
                "wgwait" => {
                    k.wgmma_inflight = match value {
                        "0" => false,
                        "1" => true,
                        _ => return Err(bad()),
                    }
                }
                "wgprod" => k.wgmma_producers = value.parse().ok().filter(|n| *n <= 3).ok_or_else(bad)?,
                "ewvec" => {
                    k.ew_vector = value.parse().ok().filter(|n| [1, 2, 4].contains(n)).ok_or_else(bad)?
                }
                "ewbatch" => {
                    k.ew_batch = value.parse().ok().filter(|n| (1..=64).contains(n)).ok_or_else(bad)?
                }
                "colout" => {
                    k.column_outputs =
                        value.parse().ok().filter(|n| [8, 16, 32].contains(n)).ok_or_else(bad)?
                }
                "tcconv" => {
                    k.tc_conv = match value {
                        "grad" => TcConv::Grad,
                        "gemm" => TcConv::Gemm,
                        "halo" => TcConv::Halo,
                        _ => return Err(bad()),
                    }
                }
                "tcfetch" => {
                    k.tc_fetch_banks = match value {
                        "rows" => false,
                        "banks" => true,
                        _ => return Err(bad()),
                    }
                }
                "tcraw" => {
                    k.tc_raw_gather = match value {
                        "row" => false,
                        "gather" => true,
                        _ => return Err(bad()),
                    }
                }
                "convstats" => {
                    k.conv_stats = match value {
                        "apart" => false,
                        "fuse" => true,
                        _ => return Err(bad()),
                    }
                }
                "wexpand" => {
                    k.tc_expand_pre = match value {
                        "tile" => false,
                        "pre" => true,
                        _ => return Err(bad()),
                    }
                }
                "wga" => {
                    k.wgmma_a = match value {
                        "smem" => WgmmaA::Shared,
                        "regs" => WgmmaA::Registers,
                        _ => return Err(bad()),
                    }
                }
                "fp32" => {
                    k.fp32_products = match value {
                        "fma" => Fp32Products::Fma,
                        "3xtf32" => Fp32Products::Tf32x3,
                        _ => return Err(bad()),
                    }
                }
                "mma" => {
                    k.tc_mma = match value {
                        "sync" => TcMma::Sync,
                        "wgmma" => TcMma::Wgmma,
                        _ => return Err(bad()),
                    }
                }
                _ => return Err(format!("unknown kernel choice `{key}` (keys: {KERNEL_SPEC_KEYS})")),
            }
        }
        Ok(k)
    }

    fn values_of(key: &str) -> &'static str {
        match key {
            "conv" => "direct32, direct64 or gemm",
            "wgrad" => "direct, gemm, ot2, ot4, pf, ot2pf, ot4pf, async, ot2async or ot4async",
            "bk" => "16 or 32",
            "index" => "auto or 64",
            "tc" => "plain, prefetch or async",
            "tctile" => "auto, 64, 128 or 64w4",
            "tc16" => "auto, native, tf32 or wgmma",
            "frag" => "ldmatrix or lds",
            "cmul" => "4m or 3m",
            "ftile" => "64 or 128",
            "attn" => "tc or fma",
            "launch" => "graph or stream",
            "mma" => "sync or wgmma",
            "wgwait" => "0 or 1",
            "wgprod" => "a number from 0 to 3",
            "colout" => "8, 16 or 32",
            "ewvec" => "1, 2 or 4",
            "ewbatch" => "a number from 1 to 64",
            "fp32" => "fma or 3xtf32",
            "wga" => "regs or smem",
            "tcfetch" => "rows or banks",
            "wexpand" => "tile or pre",
            "convstats" => "fuse or apart",
            "tcraw" => "row or gather",
            "tcconv" => "grad, gemm or halo",
            "tctaps" => "index, table or mask",
            "tcstages" => "a number from 2 to 8",
            _ => "a positive number",
        }
    }

    fn parse_wgrad(value: &str) -> Option<WgradKernel> {
        if value == "gemm" {
            return Some(WgradKernel::Gemm);
        }
        let (outputs, rest) = if let Some(r) = value.strip_prefix("ot2") {
            (WgradOutputs::Two, r)
        } else if let Some(r) = value.strip_prefix("ot4") {
            (WgradOutputs::Four, r)
        } else if let Some(r) = value.strip_prefix("direct") {
            (WgradOutputs::ByLayer, r)
        } else {
            (WgradOutputs::ByLayer, value)
        };
        let staging = match rest {
            "" if !value.is_empty() => WgradStaging::Registers,
            "pf" => WgradStaging::Prefetch,
            "async" => WgradStaging::Async,
            _ => return None,
        };
        Some(WgradKernel::Direct { outputs, staging })
    }
}

impl fmt::Display for KernelConfig {
    /// The spec [`KernelConfig::parse`] reads back: the choices that differ from the
    /// defaults, or `default`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = KernelConfig::default();
        let mut parts = Vec::new();
        if self.conv != d.conv {
            parts.push(match self.conv {
                ConvKernel::Direct32 => "conv=direct32".to_string(),
                ConvKernel::Direct64 => "conv=direct64".to_string(),
                ConvKernel::Gemm => "conv=gemm".to_string(),
            });
        }
        if self.wgrad != d.wgrad {
            parts.push(match self.wgrad {
                WgradKernel::Gemm => "wgrad=gemm".to_string(),
                WgradKernel::Direct { outputs, staging } => {
                    let ot = match outputs {
                        WgradOutputs::ByLayer => "",
                        WgradOutputs::Two => "ot2",
                        WgradOutputs::Four => "ot4",
                    };
                    let pf = match staging {
                        WgradStaging::Registers => "",
                        WgradStaging::Prefetch => "pf",
                        WgradStaging::Async => "async",
                    };
                    format!("wgrad={ot}{pf}")
                }
            });
        }
        if let Some(n) = self.fill {
            parts.push(format!("fill={n}"));
        }
        if self.deep_k_tiles {
            parts.push("bk=32".into());
        }
        if let Some(n) = self.conv_chunk {
            parts.push(format!("ck={n}"));
        }
        if self.grid_stride_blocks != d.grid_stride_blocks {
            parts.push(format!("grid={}", self.grid_stride_blocks));
        }
        if self.index == IndexChoice::Wide {
            parts.push("index=64".into());
        }
        if let Some(n) = self.grid_yz {
            parts.push(format!("yz={n}"));
        }
        if self.tc_staging != d.tc_staging {
            parts.push(
                match self.tc_staging {
                    TcStaging::Plain => "tc=plain",
                    TcStaging::Prefetch => "tc=prefetch",
                    TcStaging::Async => "tc=async",
                }
                .into(),
            );
        }
        if self.tc_tile != d.tc_tile {
            parts.push(
                match self.tc_tile {
                    TcTile::ByPrecision => "tctile=auto",
                    TcTile::Narrow => "tctile=64",
                    TcTile::Wide => "tctile=128",
                    TcTile::FourWarps => "tctile=64w4",
                }
                .into(),
            );
        }
        if self.tc16 != d.tc16 {
            parts.push(
                match self.tc16 {
                    TcHalf::Auto => "tc16=auto",
                    TcHalf::Native => "tc16=native",
                    TcHalf::Tf32 => "tc16=tf32",
                    TcHalf::Wgmma => "tc16=wgmma",
                }
                .into(),
            );
        }
        if self.tc_frag != d.tc_frag {
            parts.push(
                match self.tc_frag {
                    TcFragments::Ldmatrix => "frag=ldmatrix",
                    TcFragments::Lds => "frag=lds",
                }
                .into(),
            );
        }
        if self.cmul != d.cmul {
            parts.push(
                match self.cmul {
                    ComplexProducts::Four => "cmul=4m",
                    ComplexProducts::Three => "cmul=3m",
                }
                .into(),
            );
        }
        if self.fma_tile != d.fma_tile {
            parts.push(
                match self.fma_tile {
                    FmaTile::Narrow => "ftile=64",
                    FmaTile::Tall => "ftile=128",
                }
                .into(),
            );
        }
        if self.attn != d.attn {
            parts.push(
                match self.attn {
                    AttnKernel::TensorCore => "attn=tc",
                    AttnKernel::Fma => "attn=fma",
                }
                .into(),
            );
        }
        if let Some(n) = self.tc_min_blocks {
            parts.push(format!("tcblocks={n}"));
        }
        if self.tc_taps != d.tc_taps {
            parts.push(
                match self.tc_taps {
                    TapGather::Index => "tctaps=index",
                    TapGather::Table => "tctaps=table",
                    TapGather::Mask => "tctaps=mask",
                }
                .into(),
            );
        }
        if self.tc_stages != d.tc_stages {
            parts.push(format!("tcstages={}", self.tc_stages));
        }
        if self.launch != d.launch {
            parts.push(
                match self.launch {
                    LaunchMode::Graph => "launch=graph",
                    LaunchMode::Stream => "launch=stream",
                }
                .into(),
            );
        }
        if self.tc_mma != d.tc_mma {
            parts.push(
                match self.tc_mma {
                    TcMma::Sync => "mma=sync",
                    TcMma::Wgmma => "mma=wgmma",
                }
                .into(),
            );
        }
        if self.wgmma_inflight {
            parts.push("wgwait=1".into());
        }
        if self.wgmma_producers != d.wgmma_producers {
            parts.push(format!("wgprod={}", self.wgmma_producers));
        }
        if self.column_outputs != d.column_outputs {
            parts.push(format!("colout={}", self.column_outputs));
        }
        if self.ew_vector != d.ew_vector {
            parts.push(format!("ewvec={}", self.ew_vector));
        }
        if self.ew_batch != d.ew_batch {
            parts.push(format!("ewbatch={}", self.ew_batch));
        }
        if self.fp32_products == Fp32Products::Tf32x3 {
            parts.push("fp32=3xtf32".into());
        }
        if self.tc_fetch_banks {
            parts.push("tcfetch=banks".into());
        }
        if !self.tc_expand_pre {
            parts.push("wexpand=tile".into());
        }
        if !self.tc_raw_gather {
            parts.push("tcraw=row".into());
        }
        if !self.conv_stats {
            parts.push("convstats=apart".into());
        }
        if self.wgmma_a == WgmmaA::Shared {
            parts.push("wga=smem".into());
        }
        if self.tc_conv != d.tc_conv {
            parts.push(
                match self.tc_conv {
                    TcConv::Grad => "tcconv=grad",
                    TcConv::Gemm => "tcconv=gemm",
                    TcConv::Halo => "tcconv=halo",
                }
                .into(),
            );
        }
        if parts.is_empty() {
            f.write_str("default")
        } else {
            f.write_str(&parts.join(","))
        }
    }
}

/// Everything CUDA code generation generates for: the device, the kernel choices and the
/// contraction numerics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CudaTarget {
    /// The device's facts.
    pub device: CudaDevice,
    /// The kernel choices.
    pub kernels: KernelConfig,
    /// Contraction numerics: fp32, or TF32 tensor cores.
    pub precision: Precision,
}

impl Default for CudaDevice {
    fn default() -> Self {
        CudaDevice::h200()
    }
}

impl CudaTarget {
    /// The fixed target of ahead-of-time emission: an H200 with the default kernel choices,
    /// fp32.
    pub fn h200() -> Self {
        CudaTarget::default()
    }

    /// This target with contractions in `precision`.
    pub fn with_precision(self, precision: Precision) -> Self {
        CudaTarget { precision, ..self }
    }

    /// This target with the kernel choices `kernels`.
    pub fn with_kernels(self, kernels: KernelConfig) -> Self {
        CudaTarget { kernels, ..self }
    }

    /// The most blocks of an implicit-GEMM grid along x, y and z: the device's, with y and z
    /// lowered to the kernel choice [`KernelConfig::grid_yz`] where it is set.
    pub fn max_grid(&self) -> [usize; 3] {
        let [x, y, z] = self.device.max_grid;
        match self.kernels.grid_yz {
            Some(c) => [x, y.min(c), z.min(c)],
            None => [x, y, z],
        }
    }

    /// Blocks a contraction fills before it stops splitting K: the kernel choice, else the
    /// device's [`CudaDevice::fill_blocks`].
    pub fn contraction_fill(&self) -> usize {
        self.kernels.fill.unwrap_or_else(|| self.device.fill_blocks())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_reads_back_from_its_text() {
        for spec in [
            "default",
            "conv=gemm",
            "conv=direct64",
            "wgrad=gemm",
            "wgrad=ot2",
            "wgrad=ot4",
            "wgrad=pf",
            "wgrad=ot4pf",
            "wgrad=ot2pf",
            "wgrad=async",
            "wgrad=ot4async",
            "fill=528",
            "bk=32",
            "ck=6",
            "grid=4096",
            "index=64",
            "yz=2",
            "conv=gemm,wgrad=ot4pf,fill=264,bk=32,ck=9,grid=100,index=64,yz=3",
        ] {
            let k = KernelConfig::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(k.to_string(), spec);
            assert_eq!(KernelConfig::parse(&k.to_string()), Ok(k));
        }
        assert_eq!(KernelConfig::parse("conv=direct32,wgrad=direct,bk=16").unwrap(), KernelConfig::default());
        assert_eq!(KernelConfig::parse("index=auto").unwrap(), KernelConfig::default());
    }

    #[test]
    fn bad_specs_name_the_key_and_its_values() {
        for (spec, says) in [
            ("conv=fast", "conv takes direct32, direct64 or gemm"),
            ("wgrad=ot3", "wgrad takes direct"),
            ("wgrad=", "wgrad takes direct"),
            ("wgrad=pfot4", "wgrad takes direct"),
            ("wgrad=asyncpf", "wgrad takes direct"),
            ("fill=0", "fill takes a positive number"),
            ("ck=x", "ck takes a positive number"),
            ("bk=8", "bk takes 16 or 32"),
            ("index=32", "index takes auto or 64"),
            ("tile=3", "unknown kernel choice `tile`"),
            ("gemm", "is not `key=value`"),
        ] {
            let e = KernelConfig::parse(spec).expect_err(spec);
            assert!(e.contains(says), "{spec}: {e}");
        }
    }

    #[test]
    fn queried_attributes_become_a_device() {
        let d = CudaDevice::from_queried(132, (9, 0), 49152, 232448, [i32::MAX, 65535, 65535]).unwrap();
        assert_eq!(d, CudaDevice { shared_per_block_optin: 232448, ..CudaDevice::h200() });
        assert_eq!((d.arch(), d.fill_blocks()), ("sm_90".to_string(), 1056));
        let e = CudaDevice::from_queried(0, (9, 0), 49152, 0, [1, 1, 1]).unwrap_err();
        assert!(e.contains("multiprocessor count"), "{e}");
        let old = CudaDevice::from_queried(16, (7, 5), 49152, 0, [1, 1, 1]).unwrap();
        assert_eq!((old.arch(), old.shared_per_block_optin), ("sm_75".to_string(), 49152));
    }
}
