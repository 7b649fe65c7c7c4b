//! CPU code generation: turns a [`Program`] into a [`CpuModule`] — the Cranelift function of
//! every loop kernel (lowered by [`crate::back::clif`]) plus the launch list of one step, in
//! which every native call (contraction, data movement, FFT) carries its geometry and arena
//! offsets, resolved here.
//!
//! This mirrors [`crate::back::cuda::CudaModule`]: the runtime (`runtime/src/cpu`) JIT-compiles
//! the functions and replays the list; it never looks at the IR. A new primitive is therefore
//! one match arm in [`call_of`] (or in the loop lowering), checked by the Rust compiler.
//!
//! Conventions of the launch list:
//! - offsets are bytes from the arena base; strides are in elements of the operand's dtype
//!   (complex counts once);
//! - f32 is one 4-byte word, c64 two (interleaved re, im), i32 one;
//! - loop kernels have the signature `(arena_base, lo, hi)` and run outer iterations `lo..hi`,
//!   so the runtime may split `0..rows` across threads.

mod attention;
mod contraction;
mod movement;
mod recurrence;

pub use attention::{
    AttentionCall, AttnKind, BLOCK_K, BLOCK_Q, WORKSPACE_WORDS as ATTENTION_WORKSPACE_WORDS,
};
pub use contraction::{ConvCall, ConvShape, ConvTypes, MatMulCall, MatOperand};
pub use movement::{strides, FftCall, StridedCopy, MAX_RANK};
pub use recurrence::RecurrenceCall;

use crate::back::clif::helpers::{helpers, Helper};
use crate::back::clif::lower::{lower_group, Importer};
use crate::error::{CompileError, CompileResult};
use crate::ir::*;
use crate::passes::fusion::{GroupId, GroupKind};
use crate::passes::Program;
use cranelift_codegen::ir::{ExtFuncData, ExternalName, Function, UserExternalName};
use cranelift_codegen::isa::TargetFrontendConfig;

/// One Cranelift loop kernel of the module.
#[derive(Clone, Debug)]
pub struct LoopKernel {
    /// The kernel group (index into `Program::groups`) it computes.
    pub group: GroupId,
    /// The function, `(arena_base, lo, hi)`. It calls helper `i` of
    /// [`crate::back::clif::helpers::helpers`] through the user external name `u0:i`, so a JIT
    /// that declares the helpers first, in that order, links them by index.
    pub func: Function,
    /// Iterations of the outermost loop.
    pub rows: usize,
    /// Elements of the iteration domain (to decide whether to split across threads).
    pub work: usize,
}

/// What one launch computes.
#[derive(Clone, Debug)]
pub enum CpuCall {
    /// Loop kernel `kernel` (index into [`CpuModule::loops`]) over its whole row range.
    Loop {
        /// Index into [`CpuModule::loops`].
        kernel: usize,
    },
    /// A dense matrix product.
    MatMul(MatMulCall),
    /// A forward convolution: `x` input, `w` weight, `y` output.
    Conv(ConvCall),
    /// A transposed convolution: `x` is `dy`, `w` the weight, `y` the input gradient `dx`.
    ConvTranspose(ConvCall),
    /// A convolution's weight gradient: `x` input, `w` is `dy`, `y` the weight gradient.
    WeightGrad(ConvCall),
    /// A strided copy (expand, permute, slice).
    Copy(StridedCopy),
    /// Zero `bytes` bytes at `out`, then copy the unpadded input into place.
    Pad {
        /// Output byte offset.
        out: usize,
        /// Output bytes.
        bytes: usize,
        /// The copy of the input into the interior.
        copy: StridedCopy,
    },
    /// Concatenation: one copy per piece.
    Concat(Vec<StridedCopy>),
    /// One-hot rows of i32 labels (out-of-range labels give a zero row).
    OneHot {
        /// Labels' byte offset.
        labels: usize,
        /// Output byte offset (f32 `rows × classes`).
        out: usize,
        /// Number of labels.
        rows: usize,
        /// Classes per row.
        classes: usize,
    },
    /// Rows of a table by index: `out[i, :] = table[idx[i], :]` (zeros for an index outside
    /// `0..rows`).
    Gather(RowsCall),
    /// The adjoint of [`CpuCall::Gather`]: zero `out` (`rows` rows), then add row `i` of the
    /// source (at `table`) into row `idx[i]`, in index order (indices outside `0..rows` add
    /// nothing).
    ScatterAdd(RowsCall),
    /// An inverted-dropout mask from [`crate::ir::dropout_keep`].
    Dropout {
        /// Byte offset of the i32 step counter.
        step: usize,
        /// Output byte offset (f32).
        out: usize,
        /// Elements.
        n: usize,
        /// Drop probability.
        p: f64,
        /// Per-layer salt.
        salt: u32,
    },
    /// A discrete Fourier transform along one axis.
    Fft(FftCall),
    /// A fused attention op (`AttnLse`, `Attention`, `AttentionGrad`): blocked over queries
    /// and keys, one block of weights per thread, never a `[T, S]` buffer.
    Attention(AttentionCall),
    /// A fused recurrence (`Recurrence`, `RecurrenceGrad`): the time loop, samples split
    /// across threads.
    Recurrence(RecurrenceCall),
}

/// Geometry of a [`CpuCall::Gather`] or [`CpuCall::ScatterAdd`]: whole rows of `row_words`
/// f32 words (a complex element is two) moved between a table of `rows` rows and `n` indexed rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowsCall {
    /// Byte offset of the table (gather) or of the indexed rows (scatter-add).
    pub src: usize,
    /// Byte offset of the `n` i32 indices.
    pub idx: usize,
    /// Output byte offset.
    pub out: usize,
    /// Number of indices.
    pub n: usize,
    /// Rows of the table.
    pub rows: usize,
    /// f32 words per row.
    pub row_words: usize,
}

/// One action of a step: the group it computes and the call.
#[derive(Clone, Debug)]
pub struct CpuLaunch {
    /// Index of the kernel group (into `Program::groups`).
    pub group: GroupId,
    /// What to run.
    pub call: CpuCall,
}

/// Per-thread workspace the launch list needs beyond the arena, in f32 words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Workspace {
    /// im2col columns of one image of the largest non-pointwise convolution (complex-sized).
    pub cols_words: usize,
    /// A private copy of the largest weight gradient (threads other than the first add their
    /// images' contributions there; the runtime sums the copies).
    pub dw_words: usize,
    /// One block of attention scores and weights ([`ATTENTION_WORKSPACE_WORDS`]) when the
    /// module has an attention call, else 0.
    pub attn_words: usize,
    /// The gates and carried gradient of one recurrence step (the largest
    /// [`RecurrenceCall::workspace_words`]), else 0.
    pub rnn_words: usize,
}

/// The CPU module of a program: loop kernels, the launch list of one step, workspace sizes.
#[derive(Clone, Debug)]
pub struct CpuModule {
    /// Loop kernels in schedule order.
    pub loops: Vec<LoopKernel>,
    /// The launches of one step, in schedule order.
    pub launches: Vec<CpuLaunch>,
    /// Per-thread workspace.
    pub workspace: Workspace,
    /// Bytes of the arena the offsets address.
    pub arena_bytes: usize,
}

/// Imports helper `h` into `func` under the user name `u0:i`, `i` its index in [`helpers`].
fn import_by_index(func: &mut Function, h: Helper) -> cranelift_codegen::ir::FuncRef {
    let index = helpers().iter().position(|(k, _, _)| *k == h).expect("every helper is listed") as u32;
    let cc = func.signature.call_conv;
    let signature = func.import_signature(h.signature(cc));
    let name = func.declare_imported_user_function(UserExternalName { namespace: 0, index });
    func.import_function(ExtFuncData {
        name: ExternalName::user(name),
        signature,
        colocated: false,
        patchable: false,
    })
}

/// Generates the CPU module of `program` for a host whose Cranelift frontend configuration is
/// `config` (calling convention and pointer width: [`crate::back::clif::host_config`]).
pub fn generate(program: &Program, config: TargetFrontendConfig) -> CompileResult<CpuModule> {
    let mut loops = Vec::new();
    let mut launches = Vec::new();
    let mut workspace = Workspace::default();
    let import: &mut Importer = &mut import_by_index;
    for &gid in &program.order {
        let grp = program.groups.get(gid).ok_or_else(|| {
            CompileError::internal(format!("schedule names group {gid}, which does not exist"))
        })?;
        let call = match grp.kind {
            GroupKind::View => continue,
            GroupKind::Elementwise | GroupKind::Reduce => {
                let k = lower_group(program, gid, config, import)?;
                loops.push(LoopKernel { group: gid, func: k.func, rows: k.rows, work: k.work });
                CpuCall::Loop { kernel: loops.len() - 1 }
            }
            // An attention group with its log-sum-exp fused (`fusion::merge_attention_lse`):
            // the CPU computes the two in turn, each blocked over the keys.
            GroupKind::Attention if grp.nodes.len() > 1 => {
                for &v in &grp.nodes {
                    let call = call_of(program, v)?;
                    workspace = workspace.max(&call);
                    launches.push(CpuLaunch { group: gid, call });
                }
                continue;
            }
            GroupKind::Contraction | GroupKind::Movement | GroupKind::Attention | GroupKind::Recurrence => {
                let v = *grp
                    .nodes
                    .last()
                    .ok_or_else(|| CompileError::internal(format!("group {gid} has no nodes")))?;
                let call = call_of(program, v)?;
                workspace = workspace.max(&call);
                call
            }
        };
        launches.push(CpuLaunch { group: gid, call });
    }
    Ok(CpuModule { loops, launches, workspace, arena_bytes: program.plan.arena_bytes })
}

impl Workspace {
    /// The workspace that covers both `self` and `call`.
    fn max(self, call: &CpuCall) -> Workspace {
        let cols = |c: &ConvCall| if c.shape.pointwise() { 0 } else { 2 * c.shape.k() * c.shape.p() };
        match call {
            CpuCall::Conv(c) | CpuCall::ConvTranspose(c) => {
                Workspace { cols_words: self.cols_words.max(cols(c)), ..self }
            }
            CpuCall::WeightGrad(c) => Workspace {
                cols_words: self.cols_words.max(cols(c)),
                dw_words: self.dw_words.max(c.shape.w.iter().product::<usize>() * c.out_words),
                ..self
            },
            CpuCall::Attention(_) => Workspace { attn_words: ATTENTION_WORKSPACE_WORDS, ..self },
            CpuCall::Recurrence(r) => {
                Workspace { rnn_words: self.rnn_words.max(r.workspace_words()), ..self }
            }
            CpuCall::Loop { .. }
            | CpuCall::MatMul(_)
            | CpuCall::Copy(_)
            | CpuCall::Pad { .. }
            | CpuCall::Concat(_)
            | CpuCall::OneHot { .. }
            | CpuCall::Gather(_)
            | CpuCall::ScatterAdd(_)
            | CpuCall::Dropout { .. }
            | CpuCall::Fft(_) => self,
        }
    }
}

/// f32 words per element.
pub(crate) fn words(complex: bool) -> usize {
    if complex {
        2
    } else {
        1
    }
}

/// What the generator reads about one node: its graph, plan and batch.
pub(crate) struct NodeCtx<'a> {
    pub program: &'a Program,
    pub v: Value,
}

impl NodeCtx<'_> {
    pub fn graph(&self) -> &Graph {
        &self.program.graph
    }
    pub fn node(&self) -> &Node {
        self.program.graph.node(self.v)
    }
    pub fn input(&self, i: usize) -> CompileResult<Value> {
        self.node().inputs.get(i).copied().ok_or_else(|| {
            CompileError::internal(format!("{} ({}) has no operand {i}", self.v, self.node().op.mnemonic()))
        })
    }
    pub fn shape(&self, x: Value) -> Vec<usize> {
        self.program.graph.ty(x).shape.resolve(self.program.plan.batch)
    }
    pub fn complex(&self, x: Value) -> bool {
        self.program.graph.ty(x).dtype.is_complex()
    }
    pub fn numel(&self, x: Value) -> usize {
        self.program.graph.ty(x).shape.numel(self.program.plan.batch)
    }
    /// Byte offset of `x`'s buffer.
    pub fn offset(&self, x: Value) -> CompileResult<usize> {
        self.program.plan.slot(x).map(|s| s.offset).ok_or_else(|| {
            CompileError::internal(format!(
                "{x} ({}) is used by a CPU kernel but has no buffer in the memory plan",
                self.program.graph.node(x).op.mnemonic()
            ))
        })
    }
    /// The 4-D shape of `x`.
    pub fn dims4(&self, x: Value) -> CompileResult<[usize; 4]> {
        let s = self.shape(x);
        s.as_slice().try_into().map_err(|_| {
            CompileError::internal(format!(
                "{x} ({}) should be 4-D for a convolution, is {s:?}",
                self.program.graph.node(x).op.mnemonic()
            ))
        })
    }
}

/// The native call computing value `v`, the last node of a contraction or movement group.
fn call_of(program: &Program, v: Value) -> CompileResult<CpuCall> {
    let cx = NodeCtx { program, v };
    let op = &cx.node().op;
    match op {
        Op::MatMul { trans, conj, sum_batch } => {
            contraction::matmul(&cx, *trans, *conj, *sum_batch).map(CpuCall::MatMul)
        }
        Op::Conv2d { geom, conj } => contraction::conv(&cx, *geom, *conj).map(CpuCall::Conv),
        Op::ConvTranspose2d { geom, conj, .. } => {
            contraction::conv_transpose(&cx, *geom, *conj).map(CpuCall::ConvTranspose)
        }
        Op::Conv2dWeightGrad { geom, conj, .. } => {
            contraction::weight_grad(&cx, *geom, *conj).map(CpuCall::WeightGrad)
        }
        Op::Expand => movement::expand(&cx).map(CpuCall::Copy),
        Op::Permute { perm } => movement::permute(&cx, perm).map(CpuCall::Copy),
        Op::Slice { axis, start, .. } => movement::slice(&cx, *axis, *start).map(CpuCall::Copy),
        Op::Pad { axis, before, .. } => movement::pad(&cx, *axis, *before),
        Op::Concat { axis } => movement::concat(&cx, *axis).map(CpuCall::Concat),
        Op::OneHot { classes } => {
            let labels = cx.input(0)?;
            Ok(CpuCall::OneHot {
                labels: cx.offset(labels)?,
                out: cx.offset(v)?,
                rows: cx.numel(labels),
                classes: *classes,
            })
        }
        Op::Gather => {
            let (table, idx) = (cx.input(0)?, cx.input(1)?);
            let shape = cx.shape(table);
            Ok(CpuCall::Gather(RowsCall {
                src: cx.offset(table)?,
                idx: cx.offset(idx)?,
                out: cx.offset(v)?,
                n: cx.numel(idx),
                rows: shape[0],
                row_words: shape[1] * words(cx.complex(table)),
            }))
        }
        Op::ScatterAdd { rows } => {
            let (src, idx) = (cx.input(0)?, cx.input(1)?);
            let width = cx.shape(v)[1];
            Ok(CpuCall::ScatterAdd(RowsCall {
                src: cx.offset(src)?,
                idx: cx.offset(idx)?,
                out: cx.offset(v)?,
                n: cx.numel(idx),
                rows: *rows,
                row_words: width * words(cx.complex(v)),
            }))
        }
        Op::DropoutMask { p, salt } => Ok(CpuCall::Dropout {
            step: cx.offset(cx.input(0)?)?,
            out: cx.offset(v)?,
            n: cx.numel(v),
            p: *p,
            salt: *salt,
        }),
        Op::Fft { axis, inverse, norm } => movement::fft(&cx, *axis, *inverse, *norm).map(CpuCall::Fft),
        Op::AttnLse { .. } | Op::Attention { .. } | Op::AttentionGrad { .. } => {
            attention::attention(&cx).map(CpuCall::Attention)
        }
        Op::Recurrence { .. } | Op::RecurrenceGrad { .. } => {
            recurrence::recurrence(&cx).map(CpuCall::Recurrence)
        }
        // Loop-kernel ops and views never end a contraction or movement group: fusion puts
        // them in elementwise/reduce/view groups, which `generate` lowers elsewhere.
        Op::Input { .. }
        | Op::Param { .. }
        | Op::State { .. }
        | Op::Scalar { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Select
        | Op::Reduce { .. }
        | Op::Reshape
        | Op::Assign => Err(CompileError::internal(format!(
            "{v} ({}) ends a contraction or movement group, but is computed by loop kernels or views",
            op.mnemonic()
        ))),
    }
}

impl std::fmt::Display for CpuModule {
    /// The launch list, one line per launch (`cvc emit --cpu`): the group, what runs, the
    /// resolved geometry and the arena offsets (`@byte`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "; CPU module: {} loop kernels, {} launches, arena {} bytes, per-thread workspace {} + {} f32",
            self.loops.len(),
            self.launches.len(),
            self.arena_bytes,
            self.workspace.cols_words,
            self.workspace.dw_words
        )?;
        for l in &self.launches {
            write!(f, "group {:>4}: ", l.group)?;
            match &l.call {
                CpuCall::Loop { kernel } => {
                    let k = &self.loops[*kernel];
                    writeln!(f, "loop kernel {kernel} ({} rows, {} elements)", k.rows, k.work)
                }
                CpuCall::MatMul(m) => writeln!(
                    f,
                    "matmul {}x{}x{}  a@{} (rs {}, cs {}{}{})  b@{} (rs {}, cs {}{}{}) -> c@{}{}{}",
                    m.m,
                    m.k,
                    m.n,
                    m.a.offset,
                    m.a.rs,
                    m.a.cs,
                    if m.a.complex { ", c64" } else { "" },
                    if m.a.conj { ", conj" } else { "" },
                    m.b.offset,
                    m.b.rs,
                    m.b.cs,
                    if m.b.complex { ", c64" } else { "" },
                    if m.b.conj { ", conj" } else { "" },
                    m.c,
                    if m.c_complex { " c64" } else { "" },
                    batch_text(m)
                ),
                CpuCall::Conv(c) => conv_line(f, "conv2d", c),
                CpuCall::ConvTranspose(c) => conv_line(f, "conv_transpose2d", c),
                CpuCall::WeightGrad(c) => conv_line(f, "conv2d_weight_grad", c),
                CpuCall::Copy(c) => copy_line(f, "copy", c),
                CpuCall::Pad { out, bytes, copy } => {
                    write!(f, "zero {bytes} bytes @{out}, then ")?;
                    copy_line(f, "copy", copy)
                }
                CpuCall::Concat(pieces) => {
                    writeln!(f, "concat of {} pieces", pieces.len())?;
                    for c in pieces {
                        write!(f, "             ")?;
                        copy_line(f, "copy", c)?;
                    }
                    Ok(())
                }
                CpuCall::OneHot { labels, out, rows, classes } => {
                    writeln!(f, "one_hot {rows} labels @{labels} of {classes} classes -> @{out}")
                }
                CpuCall::Gather(r) => writeln!(
                    f,
                    "gather {} rows of {} words @{} by {} indices @{} -> @{}",
                    r.rows, r.row_words, r.src, r.n, r.idx, r.out
                ),
                CpuCall::ScatterAdd(r) => writeln!(
                    f,
                    "scatter_add {} rows of {} words @{} by indices @{} into {} rows -> @{}",
                    r.n, r.row_words, r.src, r.idx, r.rows, r.out
                ),
                CpuCall::Dropout { step, out, n, p, salt } => {
                    writeln!(f, "dropout_mask p={p} salt={salt} step@{step} -> {n} f32 @{out}")
                }
                CpuCall::Fft(t) => writeln!(
                    f,
                    "{} {:?} axis {} scale {} @{} -> @{}",
                    if t.inverse { "ifft" } else { "fft" },
                    t.shape,
                    t.axis,
                    t.scale,
                    t.src,
                    t.dst
                ),
                CpuCall::Attention(a) => attention_line(f, a),
                CpuCall::Recurrence(r) => {
                    let opt = |o: Option<usize>| o.map_or("-".to_string(), |o| format!("@{o}"));
                    writeln!(
                        f,
                        "{} {:?} [{}, {}, {}] reverse={}  xp@{} w@{} b@{} hs{} dhs{}{} -> @{}",
                        if r.grad { "recurrence_grad" } else { "recurrence" },
                        r.spec.cell,
                        r.b,
                        r.t,
                        r.spec.hidden,
                        r.spec.reverse,
                        r.xp,
                        r.w,
                        r.bias,
                        opt(r.hs),
                        opt(r.dhs),
                        r.h0.map_or(String::new(), |o| format!(" h0@{o}")),
                        r.out
                    )
                }
            }?;
        }
        Ok(())
    }
}

fn attention_line(f: &mut std::fmt::Formatter<'_>, a: &AttentionCall) -> std::fmt::Result {
    let what = match a.kind {
        AttnKind::Lse => "attn_lse".to_string(),
        AttnKind::Forward => "attention".to_string(),
        AttnKind::Grad(w) => format!("attention_grad {w:?}"),
    };
    let opt = |o: Option<usize>| o.map_or("-".to_string(), |o| format!("@{o}"));
    writeln!(
        f,
        "{what} [{}, {}, {}x{}, {}/{}] {}  q@{} k@{} v{} rows {:?} lse{} o{} do{} mask{} step{} -> @{}",
        a.b,
        a.h,
        a.t,
        a.s,
        a.d,
        a.dv,
        crate::ir::print::attrs(&Op::Attention { spec: a.spec }),
        a.q,
        a.k,
        opt(a.v),
        a.ld,
        opt(a.lse),
        opt(a.o),
        opt(a.d_o),
        opt(a.mask),
        opt(a.step),
        a.out
    )
}

/// The batch part of a matmul's line (empty for a single product, so plain matmuls print as before).
fn batch_text(m: &MatMulCall) -> String {
    if m.batch <= 1 {
        return String::new();
    }
    let [a, b, c] = m.batch_strides;
    let sum = if m.sum_batch { ", summed" } else { "" };
    format!("  ×{} batches (strides a {a}, b {b}, c {c}{sum})", m.batch)
}

fn conv_line(f: &mut std::fmt::Formatter<'_>, what: &str, c: &ConvCall) -> std::fmt::Result {
    let g = c.shape.geom;
    writeln!(
        f,
        "{what} x{:?} w{:?} out{:?} stride {:?} pad {:?} dilation {:?} groups {}  @{} @{} -> @{}{}",
        c.shape.x,
        c.shape.w,
        c.shape.out,
        g.stride,
        g.pad,
        g.dilation,
        g.groups,
        c.x,
        c.w,
        c.y,
        if c.out_words == 2 { " c64" } else { "" }
    )
}

fn copy_line(f: &mut std::fmt::Formatter<'_>, what: &str, c: &StridedCopy) -> std::fmt::Result {
    writeln!(
        f,
        "{what} {:?} @{} strides {:?} -> @{} strides {:?} ({} -> {} words)",
        c.shape, c.src, c.src_strides, c.dst, c.dst_strides, c.src_words, c.dst_words
    )
}
