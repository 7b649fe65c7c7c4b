//! CUDA C code generation: every kernel group of a [`Program`] becomes one `extern "C"
//! __global__` kernel of one module, with a launch list the runtime replays; the runtime
//! compiles the module with NVRTC as translation units of consecutive kernels
//! ([`CudaModule::units`]).
//!
//! Conventions of the generated code:
//! - every kernel takes one parameter, the arena's base address (`char* A`); each buffer's
//!   byte offset from the memory plan is baked into the source as a constant, so a step is a
//!   fixed sequence of launches with one pointer argument and no allocation;
//! - `f32` is `float`, `c64` is `float2` (interleaved re, im), `i32` is `int`; mixed real and
//!   complex operands use overloaded helpers (`add(float2, float)`, ...) so a real operand is
//!   read as `x + 0i` without a materialised cast, and a real × complex product is two real
//!   multiplies;
//! - every kernel indexes elements with the integer type `ix`, a `typedef` at the top of its
//!   body chosen per kernel from the plan's shapes ([`Ctx::indexing`]): `u32` when every
//!   index it can form stays below 2³¹ — the elements of every buffer it touches, counted in
//!   floats (a complex element is two), its iteration domain, the threads of a grid-stride
//!   loop, the products of a contraction's extents — and `u64` otherwise (the kernel choice
//!   `index=64` forces `u64` everywhere, to test that code on small shapes). 32-bit indices
//!   are kept where they suffice: fewer registers, and a division by a constant is a 32-bit
//!   multiply-high instead of a 64-bit one. A generator writes every index that can grow
//!   with the batch (linear indices, coordinates multiplied by strides, tile origins,
//!   `blockIdx` products: `(ix)blockIdx.x * blockDim.x`) in `ix`; thread-local offsets inside
//!   a tile stay `u32`. A new kernel calls `ctx.indexing(values, extents)` with every
//!   buffer it reads or writes and any extent not bounded by them, emits
//!   `Indexing::typedef` first, and returns the [`Indexing`] in its [`Kernel`]; the
//!   launch list records it ([`KernelLaunch::index`]);
//! - elementwise, reduction and data-movement kernels use grid-stride loops over `ix`;
//! - grids: x up to the device's 2³¹ − 1 blocks, y and z up to 65535; grid-stride kernels
//!   clamp their grid, and a contraction whose tiles need more than 65535 blocks along y or
//!   z folds its grid into x (`Grid`);
//! - contractions (`MatMul`, `Conv2d`, `ConvTranspose2d`, `Conv2dWeightGrad`) are one tiled
//!   implicit-GEMM template (shared-memory tiles of 16 × BM and 16 × BN, a 16 × 16 thread
//!   grid with a register micro-tile, the next K tile loaded into registers while the current
//!   one is multiplied, no im2col buffer), split along K with `atomicAdd` into a zeroed
//!   output when the output alone has too few tiles to fill the GPU; with `Precision::Tf32`
//!   the same tiles are multiplied on tensor cores (`mma.sync`, TF32; 4 warps of 32 × 32 per
//!   block, K tiles copied by `cp.async` into a ring in dynamic shared memory). In fp32,
//!   stride-1 convolutions and input gradients with at most 32 output channels per group use
//!   the direct kernel of `conv.rs` instead (measured faster there, slower above), and
//!   stride-1 weight gradients the direct kernel of `wgrad.rs` (staged tiles, a sliding
//!   window of taps in registers, partial sums added with atomics); at the reduced
//!   precisions only layers too thin for tensor-core tiles do (fewer than 32 terms per
//!   output: a first layer's one channel × 9 taps, `conv::too_shallow_for_tensor_cores`);
//! - small elementwise and data-movement kernels that the schedule put next to each other and
//!   that touch disjoint memory are one launch (`ewbatch`), each over its own range of the
//!   blocks;
//! - sibling sums that the schedule put next to each other (same domain and axes) are one
//!   kernel; a sum split over blocks keeps f64 partials in scratch memory past the arena
//!   ([`CudaModule::scratch`]) and its last block adds them in order (deterministic);
//! - `AttnLse`, `Attention` and `AttentionGrad` are one flash-style kernel each
//!   (`attention.rs`): scores recomputed per tile in registers and shared memory, never a
//!   `[T, S]` buffer, deterministic (no atomics); at tensor-core precisions the real score's
//!   kernels are those of `attention_tc.rs` (every product an `mma.sync`, tiles in dynamic
//!   shared memory, `Kernel::shared` bytes);
//! - `Recurrence` and `RecurrenceGrad` are one persistent kernel each (`recurrence.rs`): a
//!   block per sample runs every time step, barriers between steps;
//! - `Fft` is a direct DFT per output element (O(n²) per row, twiddles by `sincospi` of the
//!   exact `(j·k) mod n`, accumulated in f64);
//! - sums accumulate in f64 (complex: two f64) for accuracy; `Max`/`MaxMag` keep the first
//!   of equal candidates, as the interpreter does.

/// An internal error (an invariant of the program or of code generation did not hold), with
/// a formatted message. User errors (a model too large for the target) are built on purpose
/// with `user!`.
macro_rules! internal {
    ($($t:tt)*) => {
        $crate::error::CompileError::internal(format!($($t)*))
    };
}

/// A user error (the model or the target asks for what this back end cannot generate), with a
/// formatted message.
macro_rules! user {
    ($($t:tt)*) => {
        $crate::error::CompileError::user(format!($($t)*))
    };
}

mod attention;
mod attention_tc;
mod conv;
mod gemm;
mod halo;
mod kernels;
mod recurrence;
mod wgrad;

/// The template libraries a module carries once, before the first kernel that uses them (fused
/// attention, fused recurrences); tests that compile kernels one at a time put them back.
pub const LIBRARIES: [&str; 3] = [attention::LIB, recurrence::LIB, attention_tc::LIB];

use crate::config::Precision;
use crate::error::CompileResult;
use crate::ir::*;
use crate::passes::fusion::{GroupKind, KernelGroup};
use crate::passes::memplan::ArenaPlan;
use crate::passes::Program;
use crate::target::{
    ComplexProducts, CudaTarget, FmaTile, IndexChoice, TapGather, TcFragments, TcHalf, TcMma, TcStaging,
    TcTile, WgmmaA,
};
use std::fmt::Write;

/// Threads per block of the generated kernels.
pub const BLOCK: u32 = 256;

/// One kernel launch of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelLaunch {
    /// The kernel's `extern "C"` name in the module.
    pub name: String,
    /// Grid size (x, y, z).
    pub grid: [u32; 3],
    /// Block size (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    /// Index of the kernel group (into `Program::groups`) this launch computes.
    pub group: usize,
    /// The integer type of the kernel's element indices, and why.
    pub index: Indexing,
}

/// One action of a step, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaStep {
    /// Launch a kernel of the module with the arena base as its only argument.
    Launch(KernelLaunch),
    /// Zero `bytes` bytes of the arena at `offset` (before a split-K or split reduction
    /// that accumulates with atomics).
    Zero {
        /// Byte offset in the arena.
        offset: usize,
        /// Byte count.
        bytes: usize,
    },
}

/// The generated CUDA module of a program: source plus the launch list of one step.
#[derive(Clone, Debug)]
pub struct CudaModule {
    /// CUDA C++ source of every kernel, as one translation unit (what `cvc emit --cuda`
    /// prints); the runtime compiles it as [`CudaModule::units`].
    pub source: String,
    /// Per kernel (in the order of `kernels`): its code with the comment lines before it,
    /// and the template libraries it uses (indices into [`LIBRARIES`]).
    pub kernel_code: Vec<(String, Vec<usize>)>,
    /// The actions of one step, in schedule order.
    pub steps: Vec<CudaStep>,
    /// Names of all kernels in the module.
    pub kernels: Vec<String>,
    /// Scratch memory past the plan's arena, `(offset, bytes)`: the f64 partial sums of
    /// reductions split over blocks, and their counters. The runtime allocates it with the
    /// arena (one allocation) and zeroes it once.
    pub scratch: (usize, usize),
    /// The architecture NVRTC compiles the module for: the device's (`sm_90`), or its
    /// architecture-specific variant (`sm_90a`) where a kernel uses `wgmma`
    /// ([`crate::target::TcMma::Wgmma`]), which exists only there.
    pub arch: String,
}

/// One translation unit of a module: the prelude, the template libraries its kernels use,
/// and a run of consecutive kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileUnit {
    /// CUDA C++ source.
    pub source: String,
    /// The kernels it defines.
    pub kernels: Vec<String>,
}

/// Source bytes of kernels per [`CompileUnit`]. NVRTC's time grows faster than linearly in a
/// unit's size (measured on the ViT's 2.5 MB module: 181 s as one unit, 150 s of CPU time as
/// eight, bench/GPU-NOTES.md), and units compile in parallel.
pub const UNIT_BYTES: usize = 64 * 1024;

impl CudaModule {
    /// The module split into translation units of consecutive kernels, each about
    /// `unit_bytes` of kernel source (at least one kernel), so that NVRTC can compile them
    /// apart and in parallel. The split depends only on the module, so each unit's source,
    /// and its cache key, is the same on every start.
    pub fn units(&self, unit_bytes: usize) -> Vec<CompileUnit> {
        let mut units = Vec::new();
        let mut at = 0;
        while at < self.kernel_code.len() {
            let mut end = at;
            let mut bytes = 0;
            while end < self.kernel_code.len()
                && (end == at || bytes + self.kernel_code[end].0.len() <= unit_bytes)
            {
                bytes += self.kernel_code[end].0.len();
                end += 1;
            }
            let mut libs: Vec<usize> =
                self.kernel_code[at..end].iter().flat_map(|k| k.1.iter().copied()).collect();
            libs.sort_unstable();
            libs.dedup();
            let mut source = String::from(PRELUDE);
            for l in libs {
                source.push_str(LIBRARIES[l]);
            }
            for (code, _) in &self.kernel_code[at..end] {
                source.push_str(code);
            }
            units.push(CompileUnit { source, kernels: self.kernels[at..end].to_vec() });
            at = end;
        }
        units
    }
}

/// The CUDA C source of every kernel of `program` for `target`, as `cvc emit --cuda` prints
/// (for [`CudaTarget::h200`]).
pub fn emit_source(program: &Program, target: &CudaTarget) -> CompileResult<String> {
    generate(program, target).map(|m| m.source)
}

/// Generates the module and launch list of `program` for `target`.
///
/// With `Precision::Tf32` contractions run on TF32 tensor cores (`mma.sync.m16n8k8`,
/// fp32 accumulation); everything else is identical to fp32. The target's device bounds the
/// shared memory and grids of the kernels, and its kernel choices pick between the direct and
/// implicit-GEMM kernels and their tilings.
pub fn generate(program: &Program, target: &CudaTarget) -> CompileResult<CudaModule> {
    if target.precision.tensor_cores() && target.device.compute_capability < (8, 0) {
        return Err(user!(
            "precision {} needs tensor cores of compute capability 8.0 or newer; the target is {} (use precision = fp32)",
            target.precision.name(),
            target.device.arch()
        ));
    }
    if program.graph.half.is_half() && program.graph.half != target.precision.storage() {
        return Err(internal!(
            "the program stores activations as {} but the target's precision is {}",
            program.graph.half.name(),
            target.precision.name()
        ));
    }
    let scratch_start = program.plan.arena_bytes.next_multiple_of(256);
    // The staging buffer of the parameters' expansions under `wexpand=pre`
    // ([`KernelConfig::tc_expand_pre`](crate::target::KernelConfig::tc_expand_pre)): one, at
    // the start of the scratch memory, as large as the largest parameter's (two 32-bit words
    // per element). Each expansion is written by the kernel launched just before the product
    // that reads it, and launches run in order, so the products share it.
    let stage_bytes = if target.kernels.tc_expand_pre
        && target.precision.storage().is_half()
        && target.kernels.tc16_for(&target.device) == crate::target::TcHalf::Wgmma
    {
        let g = &program.graph;
        g.params().map(|p| 8 * g.ty(p).shape.numel(program.plan.batch)).max().unwrap_or(0)
    } else {
        0
    };
    let ctx = Ctx {
        g: &program.graph,
        plan: &program.plan,
        batch: program.plan.batch,
        target,
        stage: (scratch_start, stage_bytes),
    };
    let mut source = String::new();
    source.push_str(PRELUDE);
    let mut steps = Vec::new();
    let mut kernels = Vec::new();
    let mut kernel_code = Vec::new();
    let mut scratch_end = (scratch_start + stage_bytes).next_multiple_of(256);
    let group_at = |gi: usize| {
        program.groups.get(gi).ok_or_else(|| internal!("schedule names group {gi}, which does not exist"))
    };
    // The attention templates are emitted once, before the first attention kernel.
    let mut attention_lib = false;
    let mut recurrence_lib = false;
    let mut at = 0;
    while at < program.order.len() {
        let gi = program.order[at];
        let group = group_at(gi)?;
        at += 1;
        let name = format!("k{gi}_{}", kind_tag(group));
        // Groups the schedule put next to each other (views between them launch nothing)
        // that become one kernel: sibling sums (one pass over their common domain), and small
        // elementwise and data-movement kernels that touch disjoint memory (per-channel
        // arithmetic, parameter updates and slices: one launch, each over its own blocks).
        let mut run = vec![group];
        let mut ids = vec![gi];
        let join: Option<JoinTest> = if group.kind == GroupKind::Reduce {
            Some(kernels::joins)
        } else if kernels::batchable(&ctx, group) {
            Some(kernels::batches)
        } else {
            None
        };
        if let Some(join) = join {
            let (more, more_ids, end) = following(program, at, |k, so_far| {
                let mut joined = run.clone();
                joined.extend_from_slice(so_far);
                join(&ctx, &joined, k)
            })?;
            run.extend(more);
            ids.extend(more_ids);
            at = end;
        }
        // Per-channel sums of a convolution's output right after it (a batchnorm's
        // statistics) run inside the convolution when its kernel is the direct one or the
        // `wgmma` GEMM (whose tiles' partials a second kernel then adds).
        let mut with_sums = None;
        if group.kind == GroupKind::Contraction {
            let (sums, sum_ids, end) =
                following(program, at, |k, so_far| conv::stats_join(&ctx, group, so_far, k))?;
            if !sums.is_empty() {
                let v = *group.nodes.last().ok_or_else(|| internal!("empty contraction group"))?;
                with_sums = match conv::direct(&ctx, v, &name, &sums, scratch_end)? {
                    Some(k) => Some(k),
                    None => gemm::contraction_summing(&ctx, group, &name, &sums, scratch_end)?,
                };
                if with_sums.is_some() {
                    run.extend(sums);
                    ids.extend(sum_ids);
                    at = end;
                }
            }
        }
        let mut libs = Vec::new();
        let out = match group.kind {
            GroupKind::View => continue,
            GroupKind::Elementwise | GroupKind::Movement if run.len() > 1 => {
                kernels::batch(&ctx, &run, &name)?
            }
            GroupKind::Elementwise => kernels::elementwise(&ctx, group, &name)?,
            GroupKind::Reduce => kernels::reduce(&ctx, &run, &name, scratch_end)?,
            GroupKind::Movement => kernels::movement(&ctx, group, &name)?,
            GroupKind::Contraction => match with_sums {
                Some(k) => k,
                None => gemm::contraction(&ctx, group, &name)?,
            },
            GroupKind::Attention => {
                if !attention_lib {
                    source.push_str(attention::LIB);
                    source.push_str(attention_tc::LIB);
                    attention_lib = true;
                }
                libs.extend([0, 2]);
                attention::kernel(&ctx, group, &name)?
            }
            GroupKind::Recurrence => {
                if !recurrence_lib {
                    source.push_str(recurrence::LIB);
                    recurrence_lib = true;
                }
                libs.push(1);
                recurrence::kernel(&ctx, group, &name)?
            }
        };
        // A kernel that prepares an operand of this one (`wexpand=pre`) runs just before it.
        if let Some((pre_name, pre)) = &out.pre {
            let code = format!(
                "// group {gi}: the staged operand of {name}\n// index: {}\n{}\n",
                pre.index, pre.code
            );
            source.push_str(&code);
            kernel_code.push((code, Vec::new()));
            steps.push(CudaStep::Launch(pre.launch(pre_name, gi)));
            kernels.push(pre_name.clone());
        }
        let mut code = String::new();
        for (id, k) in ids.iter().zip(&run) {
            let _ = writeln!(code, "// group {id}: {}", describe(&ctx, k));
        }
        let _ = writeln!(code, "// index: {}", out.index);
        code.push_str(&out.code);
        code.push('\n');
        source.push_str(&code);
        kernel_code.push((code, libs));
        scratch_end = (scratch_end + out.scratch).next_multiple_of(256);
        steps.extend(out.zero.iter().map(|&(offset, bytes)| CudaStep::Zero { offset, bytes }));
        steps.push(CudaStep::Launch(out.launch(&name, gi)));
        kernels.push(name);
        // A kernel that finishes this one's work (`convstats=fuse` on a GEMM) runs just after.
        if let Some((post_name, post)) = &out.post {
            let code = format!(
                "// group {gi}: the sums of {}\n// index: {}\n{}\n",
                kernels[kernels.len() - 1],
                post.index,
                post.code
            );
            source.push_str(&code);
            kernel_code.push((code, Vec::new()));
            steps.push(CudaStep::Launch(post.launch(post_name, gi)));
            kernels.push(post_name.clone());
        }
    }
    // `wgmma` is an instruction of the architecture-specific target only (ptxas rejects it for
    // `sm_90`); such a module runs on compute capability 9.0 alone, which is what it was made for.
    let arch = if kernel_code.iter().any(|(code, _)| code.contains("wgmma_tf32") || code.contains("wgmma16<"))
    {
        format!("{}a", target.device.arch())
    } else {
        target.device.arch()
    };
    Ok(CudaModule {
        source,
        kernel_code,
        steps,
        kernels,
        scratch: (scratch_start, scratch_end - scratch_start),
        arch,
    })
}

/// Whether a group can join the run of groups before it in one kernel ([`kernels::joins`],
/// [`kernels::batches`]).
type JoinTest = fn(&Ctx, &[&KernelGroup], &KernelGroup) -> bool;

/// The groups from position `at` of `program`'s schedule on that `joins` accepts one after
/// another (given the ones accepted so far; views between them are skipped, as they launch
/// nothing), their ids, and the position after the last one accepted (`at` if none).
fn following<'p>(
    program: &'p Program,
    at: usize,
    mut joins: impl FnMut(&'p KernelGroup, &[&'p KernelGroup]) -> bool,
) -> CompileResult<(Vec<&'p KernelGroup>, Vec<crate::passes::fusion::GroupId>, usize)> {
    let (mut groups, mut ids, mut end) = (Vec::new(), Vec::new(), at);
    for (next, &gi) in program.order.iter().enumerate().skip(at) {
        let k = program
            .groups
            .get(gi)
            .ok_or_else(|| internal!("schedule names group {gi}, which does not exist"))?;
        if k.kind == GroupKind::View {
            continue;
        }
        if !joins(k, &groups) {
            break;
        }
        groups.push(k);
        ids.push(gi);
        end = next + 1;
    }
    Ok((groups, ids, end))
}

fn kind_tag(g: &KernelGroup) -> &'static str {
    match g.kind {
        GroupKind::Elementwise => "ew",
        GroupKind::Reduce => "red",
        GroupKind::Contraction => "gemm",
        GroupKind::Attention => "attn",
        GroupKind::Recurrence => "rnn",
        GroupKind::Movement => "mov",
        GroupKind::View => "view",
    }
}

fn describe(ctx: &Ctx, group: &KernelGroup) -> String {
    let ops: Vec<String> =
        group.nodes.iter().map(|&v| format!("{v}={}", ctx.g.node(v).op.mnemonic())).collect();
    let mut s = ops.join(" ");
    if let Some(&last) = group.nodes.last() {
        let label = &ctx.g.node(last).origin.label;
        if !label.is_empty() {
            let _ = write!(s, "  [{}]", label.replace("*/", "* /"));
        }
    }
    s
}

/// One generated kernel: its code, launch shape and the arena ranges to zero first.
pub(crate) struct Kernel {
    pub code: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub zero: Vec<(usize, usize)>,
    /// Bytes of scratch memory the kernel uses (at the offset it was given).
    pub scratch: usize,
    /// Dynamic shared memory per block in bytes (0: the kernel's shared memory is static).
    pub shared: usize,
    /// The integer type of its element indices ([`Ctx::indexing`]).
    pub index: Indexing,
    /// A kernel launched just before this one, with its name: the expansion of a parameter
    /// operand into the staging buffer (`wexpand=pre`).
    pub pre: Option<(String, Box<Kernel>)>,
    /// A kernel launched just after this one, with its name: the sum of a `wgmma`
    /// convolution's per-tile partials (`convstats=fuse`), in the scratch this one was given.
    pub post: Option<(String, Box<Kernel>)>,
}

impl Kernel {
    /// The launch of this kernel, named `name`, for group `group`.
    fn launch(&self, name: &str, group: usize) -> KernelLaunch {
        KernelLaunch {
            name: name.to_string(),
            grid: self.grid,
            block: self.block,
            shared_bytes: self.shared as u32,
            group,
            index: self.index,
        }
    }

    /// A one-dimensional grid of `grid` blocks of [`BLOCK`] threads (the grid-stride
    /// elementwise and movement kernels), with no zeroing, scratch or dynamic shared memory.
    fn grid_stride(code: String, grid: u32, index: Indexing) -> Kernel {
        Kernel {
            code,
            grid: [grid, 1, 1],
            block: [BLOCK, 1, 1],
            zero: Vec::new(),
            scratch: 0,
            shared: 0,
            index,
            pre: None,
            post: None,
        }
    }
}

/// The integer type of a kernel's element indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IndexWidth {
    /// `u32`: every index the kernel forms stays below 2³¹.
    U32,
    /// `u64`.
    U64,
}

impl IndexWidth {
    /// Bits of the type (32 or 64).
    pub fn bits(self) -> u32 {
        match self {
            IndexWidth::U32 => 32,
            IndexWidth::U64 => 64,
        }
    }
}

/// The largest extent a kernel with 32-bit indices may touch: every index it forms, and a
/// grid-stride index plus the grid's stride, stays below 2³².
pub const INDEX32_LIMIT: usize = 1 << 31;

/// Why a kernel has the index type it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexReason {
    /// Chosen from the extents the kernel touches ([`Ctx::indexing`]).
    Extents,
    /// 64-bit because the kernel choice `index=64` asks for it.
    Forced,
    /// The kernel's code always indexes with 64 bits (the attention templates' `size_t`
    /// offsets, formed once per tile).
    Template,
}

/// How one kernel indexes elements and why: its [`IndexWidth`] and the largest extent it
/// touches (in floats for complex buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Indexing {
    /// The integer type.
    pub width: IndexWidth,
    /// The largest extent the kernel touches: elements of a buffer (a complex element counts
    /// two floats), its domain, the threads of its grid-stride loop or a product of its
    /// contraction's extents.
    pub largest: usize,
    /// Why the type is what it is.
    pub reason: IndexReason,
}

impl Indexing {
    /// 64-bit indices of a kernel whose code always uses them ([`IndexReason::Template`]).
    pub(crate) fn template(largest: usize) -> Indexing {
        Indexing { width: IndexWidth::U64, largest, reason: IndexReason::Template }
    }

    /// The `typedef` of `ix` that opens a kernel's body (the `// index:` line above the
    /// kernel says why).
    pub(crate) fn typedef(&self) -> &'static str {
        match self.width {
            IndexWidth::U32 => "  typedef u32 ix;\n",
            IndexWidth::U64 => "  typedef u64 ix;\n",
        }
    }
}

impl std::fmt::Display for Indexing {
    /// `64-bit (largest extent 12451840000 ≥ 2^31)`, `32-bit (largest extent 4096 < 2^31)`,
    /// `64-bit (forced by index=64; largest extent 4096)`, or `64-bit (size_t offsets of the
    /// kernel's template; largest extent 4096)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (bits, n) = (self.width.bits(), self.largest);
        match (self.reason, self.width) {
            (IndexReason::Extents, IndexWidth::U64) => write!(f, "{bits}-bit (largest extent {n} ≥ 2^31)"),
            (IndexReason::Extents, IndexWidth::U32) => write!(f, "{bits}-bit (largest extent {n} < 2^31)"),
            (IndexReason::Forced, _) => write!(f, "{bits}-bit (forced by index=64; largest extent {n})"),
            (IndexReason::Template, _) => {
                write!(f, "{bits}-bit (size_t offsets of the kernel's template; largest extent {n})")
            }
        }
    }
}

/// A launch grid of `[x, y, z]` blocks and the C expressions of each block coordinate. Grids
/// within the device's limits use `blockIdx` as it is; a grid with more than the device
/// allows along y or z is folded into x (`blockIdx.x` = x + X·(y + Y·z), at most 2³¹ − 1
/// blocks), so a contraction's extents are limited only by the total number of blocks.
pub(crate) struct Grid {
    /// The launch grid.
    pub launch: [u32; 3],
    /// C expressions (of type `ix`) of the block's x, y and z coordinates.
    pub coords: [String; 3],
}

impl Grid {
    /// The grid of `blocks`, folded when y or z exceed the device (an error naming `what`
    /// when even the folded grid does not fit).
    pub fn new(ctx: &Ctx, blocks: [usize; 3], what: &str) -> CompileResult<Grid> {
        let max = ctx.target.max_grid();
        if blocks.iter().zip(&max).all(|(b, m)| b <= m) {
            return Ok(Grid {
                launch: blocks.map(|b| b as u32),
                coords: ["(ix)blockIdx.x".into(), "(ix)blockIdx.y".into(), "(ix)blockIdx.z".into()],
            });
        }
        let total = blocks.iter().try_fold(1usize, |a, &b| a.checked_mul(b)).unwrap_or(usize::MAX);
        if total > max[0] {
            return Err(user!(
                "{what} needs {} × {} × {} = {total} blocks; a CUDA grid holds at most {} \
                 (the device's limit along x): lower the batch",
                blocks[0],
                blocks[1],
                blocks[2],
                max[0]
            ));
        }
        let [x, y, _] = blocks;
        Ok(Grid {
            launch: [total as u32, 1, 1],
            coords: [
                format!("((ix)blockIdx.x % {x}u)"),
                format!("(((ix)blockIdx.x / {x}u) % {y}u)"),
                format!("((ix)blockIdx.x / {}u)", x * y),
            ],
        })
    }
}

/// What kernel generators read: the graph, the memory plan, the batch size, the target.
pub(crate) struct Ctx<'a> {
    pub g: &'a Graph,
    pub plan: &'a ArenaPlan,
    pub batch: usize,
    pub target: &'a CudaTarget,
    /// The staging buffer of `wexpand=pre`: byte offset and size (0: none).
    pub stage: (usize, usize),
}

impl Ctx<'_> {
    /// Contraction numerics.
    pub fn precision(&self) -> Precision {
        self.target.precision
    }
    /// Whether fp32 contractions run as three TF32 tensor-core products of split operands
    /// (`fp32=3xtf32`, [`Fp32Products`](crate::target::Fp32Products); devices with tensor cores).
    pub fn split_tf32(&self) -> bool {
        self.target.precision == Precision::Fp32
            && self.target.kernels.fp32_products == crate::target::Fp32Products::Tf32x3
            && self.target.device.compute_capability >= (8, 0)
    }
    /// Whether contractions run on the tensor-core kernels: at the reduced precisions, and at
    /// fp32 under [`Ctx::split_tf32`].
    pub fn tensor_cores(&self) -> bool {
        self.precision().tensor_cores() || self.split_tf32()
    }
    /// Grid size of a grid-stride loop over `n` items with `per_block` items per block pass
    /// (at most the target's [`KernelConfig::grid_stride_blocks`](crate::target::KernelConfig)).
    pub fn grid_for(&self, n: usize, per_block: usize) -> u32 {
        let cap = self.target.kernels.grid_stride_blocks.min(self.target.device.max_grid[0]).max(1);
        n.div_ceil(per_block.max(1)).clamp(1, cap) as u32
    }
    /// The index type of a kernel that reads or writes the buffers `values` and forms
    /// indices up to `extents` besides (its domain, the threads of a grid-stride loop,
    /// products of a contraction's extents): 64-bit when any of them, counted in floats for
    /// complex buffers, reaches [`INDEX32_LIMIT`], or when the target's kernel choices force
    /// it; 32-bit otherwise.
    pub fn indexing(&self, values: &[Value], extents: &[usize]) -> Indexing {
        let floats = |v: Value| {
            let n = self.g.ty(v).shape.numel(self.batch);
            if self.dtype(v) == DType::C64 {
                n.saturating_mul(2)
            } else {
                n
            }
        };
        let largest = values.iter().map(|&v| floats(v)).chain(extents.iter().copied()).max().unwrap_or(0);
        if largest >= INDEX32_LIMIT {
            Indexing { width: IndexWidth::U64, largest, reason: IndexReason::Extents }
        } else if self.target.kernels.index == IndexChoice::Wide {
            Indexing { width: IndexWidth::U64, largest, reason: IndexReason::Forced }
        } else {
            Indexing { width: IndexWidth::U32, largest, reason: IndexReason::Extents }
        }
    }
    /// Concrete shape of `v`.
    pub fn shape(&self, v: Value) -> Vec<usize> {
        self.g.ty(v).shape.resolve(self.batch)
    }
    /// Dtype of `v`.
    pub fn dtype(&self, v: Value) -> DType {
        self.g.ty(v).dtype
    }
    /// Byte offset of `v`'s buffer in the arena.
    pub fn offset(&self, v: Value) -> CompileResult<usize> {
        self.plan.slots.get(v.index()).copied().flatten().map(|s| s.offset).ok_or_else(|| {
            internal!(
                "{v} ({}) is used by a kernel but has no buffer in the memory plan",
                self.g.node(v).op.mnemonic()
            )
        })
    }
    /// A typed pointer expression to `v`'s buffer: `float*`, `float2*`, `int*`, or for a
    /// value stored in 16 bits one of the prelude's `bf16s`, `cbf16s`, `f16s`, `cf16s`
    /// (read and written like the full-width element).
    pub fn ptr(&self, v: Value) -> CompileResult<String> {
        Ok(format!("(({}*)(A + {}ull))", stored_ctype(self.g.storage(v), self.dtype(v)), self.offset(v)?))
    }
    /// How `v` is stored.
    pub fn storage(&self, v: Value) -> Storage {
        self.g.storage(v)
    }
    /// Bytes of `v`'s buffer.
    pub fn bytes(&self, v: Value) -> usize {
        self.g.bytes(v, self.batch)
    }
}

/// The C type of a dtype.
pub(crate) fn ctype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::C64 => "float2",
        DType::I32 => "int",
    }
}

/// The C element type of a buffer of `dtype` stored as `storage`.
pub(crate) fn stored_ctype(storage: Storage, d: DType) -> &'static str {
    match (storage, d) {
        (Storage::Full, d) | (_, d @ DType::I32) => ctype(d),
        (Storage::Bf16, DType::F32) => "bf16s",
        (Storage::Bf16, DType::C64) => "cbf16s",
        (Storage::F16, DType::F32) => "f16s",
        (Storage::F16, DType::C64) => "cf16s",
    }
}

/// The zero of a dtype as a C expression.
pub(crate) fn czero(d: DType) -> &'static str {
    match d {
        DType::F32 => "0.0f",
        DType::C64 => "make_float2(0.0f, 0.0f)",
        DType::I32 => "0",
    }
}

/// An f32 literal (exactly the f32 nearest `x`).
pub(crate) fn flit(x: f64) -> String {
    let f = x as f32;
    if f.is_nan() {
        "__int_as_float(0x7fc00000)".into()
    } else if f.is_infinite() {
        if f > 0.0 {
            "__int_as_float(0x7f800000)".into()
        } else {
            "__int_as_float(0xff800000)".into()
        }
    } else {
        format!("{f:?}f")
    }
}

/// Row-major strides of a shape.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Helpers every kernel may use.
const PRELUDE: &str = r#"// Generated by cvc: CUDA C for NVRTC. Complex values are float2 (re, im) interleaved.
typedef unsigned int u32;
typedef unsigned long long u64;
#define INF __int_as_float(0x7f800000)
static __device__ __forceinline__ float2 cpx(float a) { return make_float2(a, 0.0f); }
static __device__ __forceinline__ float2 cpx(float2 a) { return a; }
static __device__ __forceinline__ float add(float a, float b) { return a + b; }
static __device__ __forceinline__ float2 add(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
static __device__ __forceinline__ float2 add(float2 a, float b) { return make_float2(a.x + b, a.y); }
static __device__ __forceinline__ float2 add(float a, float2 b) { return make_float2(a + b.x, b.y); }
static __device__ __forceinline__ float sub(float a, float b) { return a - b; }
static __device__ __forceinline__ float2 sub(float2 a, float2 b) { return make_float2(a.x - b.x, a.y - b.y); }
static __device__ __forceinline__ float2 sub(float2 a, float b) { return make_float2(a.x - b, a.y); }
static __device__ __forceinline__ float2 sub(float a, float2 b) { return make_float2(a - b.x, -b.y); }
static __device__ __forceinline__ float mul(float a, float b) { return a * b; }
static __device__ __forceinline__ float2 mul(float2 a, float2 b) { return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }
static __device__ __forceinline__ float2 mul(float2 a, float b) { return make_float2(a.x * b, a.y * b); }
static __device__ __forceinline__ float2 mul(float a, float2 b) { return make_float2(a * b.x, a * b.y); }
static __device__ __forceinline__ float dvd(float a, float b) { return a / b; }
static __device__ __forceinline__ float2 dvd(float2 a, float b) { return make_float2(a.x / b, a.y / b); }
static __device__ __forceinline__ float2 dvd(float2 a, float2 b) {
  float d = b.x * b.x + b.y * b.y;
  return make_float2((a.x * b.x + a.y * b.y) / d, (a.y * b.x - a.x * b.y) / d);
}
static __device__ __forceinline__ float2 dvd(float a, float2 b) { return dvd(cpx(a), b); }
static __device__ __forceinline__ float neg(float a) { return -a; }
static __device__ __forceinline__ float2 neg(float2 a) { return make_float2(-a.x, -a.y); }
static __device__ __forceinline__ float cj(float a) { return a; }
static __device__ __forceinline__ float2 cj(float2 a) { return make_float2(a.x, -a.y); }
static __device__ __forceinline__ float re(float a) { return a; }
static __device__ __forceinline__ float re(float2 a) { return a.x; }
static __device__ __forceinline__ float im(float a) { return 0.0f; }
static __device__ __forceinline__ float im(float2 a) { return a.y; }
static __device__ __forceinline__ float absv(float a) { return fabsf(a); }
static __device__ __forceinline__ float absv(float2 a) { return hypotf(a.x, a.y); }
static __device__ __forceinline__ float abs2(float a) { return a * a; }
static __device__ __forceinline__ float abs2(float2 a) { return a.x * a.x + a.y * a.y; }
static __device__ __forceinline__ float angle(float a) { return atan2f(0.0f, a); }
static __device__ __forceinline__ float angle(float2 a) { return atan2f(a.y, a.x); }
static __device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float relu(float x) { return x > 0.0f ? x : 0.0f; }
static __device__ __forceinline__ float stepf(float x) { return x > 0.0f ? 1.0f : 0.0f; }
static __device__ __forceinline__ float gelu(float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
static __device__ __forceinline__ float gelu_grad(float x) {
  const float k = 0.7978845608028654f;
  float t = tanhf(k * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x * x);
}
// Exact GELU (PyTorch's default): x·Φ(x) with CUDA's erff (2 ulp), and its derivative.
static __device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
static __device__ __forceinline__ float gelu_erf_grad(float x) {
  return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * 0.3989422804014327f * expf(-0.5f * x * x);
}
static __device__ __forceinline__ float maxf(float a, float b) { return a > b ? a : b; }
static __device__ __forceinline__ float gtf(float a, float b) { return a > b ? 1.0f : 0.0f; }
static __device__ __forceinline__ float eqf(float a, float b) { return a == b ? 1.0f : 0.0f; }
// Multiply-accumulate of the contraction kernels: real x complex is two real products.
static __device__ __forceinline__ void mac(float& c, float a, float b) { c = fmaf(a, b, c); }
static __device__ __forceinline__ void mac(float2& c, float2 a, float2 b) {
  c.x = fmaf(a.x, b.x, c.x); c.x = fmaf(-a.y, b.y, c.x);
  c.y = fmaf(a.x, b.y, c.y); c.y = fmaf(a.y, b.x, c.y);
}
static __device__ __forceinline__ void mac(float2& c, float2 a, float b) { c.x = fmaf(a.x, b, c.x); c.y = fmaf(a.y, b, c.y); }
static __device__ __forceinline__ void mac(float2& c, float a, float2 b) { c.x = fmaf(a, b.x, c.x); c.y = fmaf(a, b.y, c.y); }
// U consecutive elements of a buffer as one load or store (elementwise kernels, `ewvec`): one
// instruction of 4, 8 or 16 bytes where U elements fill one, else element by element. The
// caller's index is a multiple of U, and buffers start at multiples of 256 bytes.
template <int U, typename T> struct alignas(sizeof(T) * U < 16 ? sizeof(T) * U : 16) vec { T e[U]; };
template <int U, typename T> static __device__ __forceinline__ vec<U, T> vld(const T* p) {
  vec<U, T> r;
  constexpr int B = (int)sizeof(T) * U;
  if constexpr (B == 16) *(uint4*)&r = *(const uint4*)p;
  else if constexpr (B == 8) *(uint2*)&r = *(const uint2*)p;
  else if constexpr (B == 4) *(u32*)&r = *(const u32*)p;
  else { for (int u = 0; u < U; ++u) r.e[u] = p[u]; }
  return r;
}
template <int U, typename T> static __device__ __forceinline__ void vst(T* p, const vec<U, T>& v) {
  constexpr int B = (int)sizeof(T) * U;
  if constexpr (B == 16) *(uint4*)p = *(const uint4*)&v;
  else if constexpr (B == 8) *(uint2*)p = *(const uint2*)&v;
  else if constexpr (B == 4) *(u32*)p = *(const u32*)&v;
  else { for (int u = 0; u < U; ++u) p[u] = v.e[u]; }
}
// TF32 tensor-core product: d += a (16×8, row) · b (8×8, col), fp32 accumulate.
static __device__ __forceinline__ u32 tf32(float x) {
  u32 r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r;
}
// The low part of an f32 split into TF32 parts (fp32=3xtf32): `x − hi`, rounded to TF32.
static __device__ __forceinline__ u32 tf32_lo(float x, u32 hi) { return tf32(x - __uint_as_float(hi)); }
static __device__ __forceinline__ void mma_tf32(float* d, const u32* a, const u32* b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// 16-bit tensor-core products: d += a (16×16, row) · b (16×8, col), fp32 accumulate; each
// register holds two consecutive k (the lower k in the low half).
static __device__ __forceinline__ void mma_bf16(float* d, const u32* a, const u32* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ __forceinline__ void mma_f16(float* d, const u32* a, const u32* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ __forceinline__ unsigned short bf16_bits(float x) {
  unsigned short b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(x)); return b;
}
static __device__ __forceinline__ unsigned short f16_bits(float x) {
  unsigned short b; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(x)); return b;
}
static __device__ __forceinline__ u32 ld_u32(const unsigned short* p) { return *(const u32*)p; }
// Four 8 x 8 matrices of 16-bit words from shared memory (sm_75+): lanes 8i..8i+7 give the
// row addresses of matrix i; register i of lane t holds row t/4, words 2(t%4), 2(t%4)+1 of it.
static __device__ __forceinline__ void ldsm4(u32* r, const unsigned short* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((u32)__cvta_generic_to_shared(p)));
}
// Asynchronous 4-byte copy global -> shared (sm_80+), zero-filled when `ok` is false (the
// source is then not read); a commit closes a group, wait<N> leaves at most N groups pending.
static __device__ __forceinline__ void cp_async4(float* dst, const float* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
    :: "r"((u32)__cvta_generic_to_shared(dst)), "l"(src), "r"(ok ? 4u : 0u) : "memory");
}
// The same for one complex element (8 bytes: re, im), into an interleaved float2 plane.
static __device__ __forceinline__ void cp_async8(float2* dst, const float* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;"
    :: "r"((u32)__cvta_generic_to_shared(dst)), "l"(src), "r"(ok ? 8u : 0u) : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
// Warpgroup products of Hopper (sm_90a only; gemm.rs, `TcMma::Wgmma`). The descriptor of a
// K-major operand in shared memory without swizzling: its start address, and the byte
// distances between 8-row, 16-byte "core matrices" adjacent along K (lbo) and along M or N
// (sbo), each in units of 16 bytes.
static __device__ __forceinline__ u64 wgmma_desc(const float* p, u32 lbo, u32 sbo) {
  return (u64)((((u32)__cvta_generic_to_shared(p)) & 0x3ffffu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}
static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }
// Makes this thread's writes to shared memory (st.shared, completed cp.async) visible to the
// tensor cores' reads, which go through the async proxy.
static __device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Barriers in shared memory between the warpgroups of a `wgmma` GEMM with a copying warpgroup
// (gemm.rs, `wgprod=1`): one completes a phase when `count` arrivals have come; a wait on
// `parity` returns once the phase of that parity has completed. `cp_async_mbar_arrive` is the
// arrival of this thread, made when all its earlier `cp.async` copies have landed.
static __device__ __forceinline__ void mbar_init(u64* b, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"((u32)__cvta_generic_to_shared(b)), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(u64* b) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}" :: "r"((u32)__cvta_generic_to_shared(b)) : "memory");
}
static __device__ __forceinline__ void cp_async_mbar_arrive(u64* b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"((u32)__cvta_generic_to_shared(b)) : "memory");
}
// Registers per thread of the executing warpgroup, down to or up to N (sm_90a), so copying
// warpgroups leave theirs to the multiplying ones.
template <int N> static __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N)); }
template <int N> static __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N)); }
static __device__ __forceinline__ void mbar_wait(u64* b, u32 parity) {
  u32 done;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done) : "r"((u32)__cvta_generic_to_shared(b)), "r"(parity) : "memory");
  } while (!done);
}
// d (the warpgroup's 64 x N f32 tile, N = 64 or 128: thread t of warp w holds rows 16w + t/4
// (+8), columns 8i + 2(t%4) (+1) in d[4i .. 4i + 3]) += (SA·A) (64 x 8) · (SB·B) (8 x N), A and
// B read as TF32 through their descriptors, SA and SB = ±1.
template <int N, int SA, int SB> static __device__ __forceinline__ void wgmma_tf32(float* d, u64 a, u64 b) {
  if constexpr (N == 32) {
    asm volatile("{\n wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 1, %18, %19;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "n"(SA), "n"(SB) : "memory");
  } else if constexpr (N == 96) {
    asm volatile("{\n wgmma.mma_async.sync.aligned.m64n96k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, %48, %49, 1, %50, %51;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "l"(a), "l"(b), "n"(SA), "n"(SB) : "memory");
  } else if constexpr (N == 64) {
    asm volatile("{\n wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, 1, %34, %35;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "n"(SA), "n"(SB) : "memory");
  } else {
    static_assert(N == 128, "wgmma_tf32: N is 32, 64, 96 or 128");
    asm volatile("{\n wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, 1, %66, %67;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "n"(SA), "n"(SB) : "memory");
  }
}
// The same with A from registers (`wga=regs`): thread t of warp w holds the TF32 words of A
// rows 16w + t/4 (a[0], a[2]) and 16w + t/4 + 8 (a[1], a[3]), columns t%4 (a[0], a[1]) and
// t%4 + 4 (a[2], a[3]), the layout of mma.m16n8k8's A fragment.
template <int N, int SA, int SB> static __device__ __forceinline__ void wgmma_tf32(float* d, const u32* a, u64 b) {
  if constexpr (N == 32) {
    asm volatile("{\n wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, 1, %21, %22;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(SA), "n"(SB) : "memory");
  } else if constexpr (N == 96) {
    asm volatile("{\n wgmma.mma_async.sync.aligned.m64n96k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, {%48,%49,%50,%51}, %52, 1, %53, %54;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(SA), "n"(SB) : "memory");
  } else if constexpr (N == 64) {
    asm volatile("{\n wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, %37, %38;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(SA), "n"(SB) : "memory");
  } else {
    static_assert(N == 128, "wgmma_tf32: N is 32, 64, 96 or 128");
    asm volatile("{\n wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, %69, %70;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(SA), "n"(SB) : "memory");
  }
}
// d (as for wgmma_tf32) += A (64 x 16) · B (16 x N) in 16-bit operands (BF: bf16, else f16),
// both K-major through their descriptors: a core matrix is 8 rows of 8 elements (16 bytes), so
// a 16-deep step spans two of them along K, as an 8-deep TF32 step does (gemm.rs,
// `tc16=wgmma`: the complex products' signs are folded into the operands).
template <int N, bool BF> static __device__ __forceinline__ void wgmma16(float* d, u64 a, u64 b) {
  if constexpr (BF) {
    if constexpr (N == 32) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 1, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b) : "memory");
    } else if constexpr (N == 96) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, %48, %49, 1, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "l"(a), "l"(b) : "memory");
    } else if constexpr (N == 64) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, 1, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b) : "memory");
    } else {
      static_assert(N == 128, "wgmma16: N is 32, 64, 96 or 128");
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, 1, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b) : "memory");
    }
  } else {
    if constexpr (N == 32) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 1, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b) : "memory");
    } else if constexpr (N == 96) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, %48, %49, 1, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "l"(a), "l"(b) : "memory");
    } else if constexpr (N == 64) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, 1, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b) : "memory");
    } else {
      static_assert(N == 128, "wgmma16: N is 32, 64, 96 or 128");
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, 1, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b) : "memory");
    }
  }
}
// The same with A from registers: thread t of warp w holds the 16-bit pairs of A rows 16w + t/4
// (a[0], a[2]) and 16w + t/4 + 8 (a[1], a[3]), columns 2(t%4), 2(t%4) + 1 (a[0], a[1]) and 8
// more (a[2], a[3]), the lower column in the low half: mma.m16n8k16's A fragment.
template <int N, bool BF> static __device__ __forceinline__ void wgmma16(float* d, const u32* a, u64 b) {
  if constexpr (BF) {
    if constexpr (N == 32) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, 1, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b) : "memory");
    } else if constexpr (N == 96) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, {%48,%49,%50,%51}, %52, 1, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b) : "memory");
    } else if constexpr (N == 64) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b) : "memory");
    } else {
      static_assert(N == 128, "wgmma16: N is 32, 64, 96 or 128");
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b) : "memory");
    }
  } else {
    if constexpr (N == 32) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, 1, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b) : "memory");
    } else if constexpr (N == 96) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, {%48,%49,%50,%51}, %52, 1, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b) : "memory");
    } else if constexpr (N == 64) {
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b) : "memory");
    } else {
      static_assert(N == 128, "wgmma16: N is 32, 64, 96 or 128");
      asm volatile("{\n wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b) : "memory");
    }
  }
}
// 16-bit storage (precision = bf16 | fp16, ir/storage.rs): an element widens to f32 when read
// and rounds to nearest even when written, so kernels index these like float / float2 arrays.
struct __align__(2) bf16s {
  unsigned short b;
  __device__ __forceinline__ operator float() const { return __uint_as_float((u32)b << 16); }
  __device__ __forceinline__ bf16s& operator=(float x) {
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(x)); return *this;
  }
};
struct __align__(4) cbf16s {
  u32 u;  // im in the high half, re in the low half: (re, im) in memory order
  __device__ __forceinline__ operator float2() const {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  }
  __device__ __forceinline__ cbf16s& operator=(float2 z) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(z.y), "f"(z.x)); return *this;
  }
};
struct __align__(2) f16s {
  unsigned short b;
  __device__ __forceinline__ operator float() const { float r; asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(b)); return r; }
  __device__ __forceinline__ f16s& operator=(float x) {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(x)); return *this;
  }
};
struct __align__(4) cf16s {
  u32 u;
  __device__ __forceinline__ operator float2() const {
    float a, b;
    asm("{.reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h;}" : "=f"(a), "=f"(b) : "r"(u));
    return make_float2(a, b);
  }
  __device__ __forceinline__ cf16s& operator=(float2 z) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(z.y), "f"(z.x)); return *this;
  }
};
static __device__ __forceinline__ void atomic_acc(float* p, float v) { atomicAdd(p, v); }
static __device__ __forceinline__ void atomic_acc(float2* p, float2 v) { atomicAdd(&p->x, v.x); atomicAdd(&p->y, v.y); }
// The dropout hash of cvc_compiler::ir::dropout_hash (lowbias32 of salt, step, index).
static __device__ __forceinline__ u32 dropout_hash(u32 salt, u32 step, u32 index) {
  u32 x = index ^ (salt * 0x9E3779B9u) ^ (step * 0x85EBCA6Bu);
  x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;
  return x;
}

"#;
