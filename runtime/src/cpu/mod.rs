//! The CPU back end: Cranelift-JIT loop kernels, packed-GEMM contractions, rustfft, and
//! strided data movement, all working in one arena allocated at load.
//!
//! Construction ([`CpuBackend::new`]) does every allocation: the arena (`plan.arena_bytes`),
//! the JIT code, per-thread GEMM/im2col workspaces, FFT plans and scratch, the worker pool.
//! [`Backend::step`] then runs the schedule without touching the heap (the
//! `runtime/tests/no_alloc.rs` test counts allocations to prove it). Work is split over the
//! batch (convolutions), over rows (matmul) or over the outer loop (generated kernels) on
//! `CVC_THREADS` threads (default: 2, at most the available cores).

pub mod contract;
pub mod fft;
pub mod gemm;
pub mod jit;
pub mod movement;
pub mod pool;

use crate::backend::{Backend, HostTensor, RuntimeError};
use contract::{ConvShape, ConvTypes, Mat};
use cvc_compiler::ir::{DType, Op, Value};
use cvc_compiler::passes::fusion::GroupKind;
use cvc_compiler::passes::memplan::Slot;
use cvc_compiler::passes::Program;
use fft::AxisFft;
use jit::{CompiledKernel, JitKernels};
use movement::StridedCopy;
use pool::Pool;
use std::alloc::Layout;

/// A zero-initialised, 256-byte-aligned byte buffer: the step's whole working memory.
struct ArenaBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl ArenaBuf {
    fn new(bytes: usize) -> Result<ArenaBuf, RuntimeError> {
        let layout = Layout::from_size_align(bytes.max(256), 256)
            .map_err(|e| RuntimeError(format!("arena of {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(RuntimeError(format!("cannot allocate an arena of {bytes} bytes")));
        }
        Ok(ArenaBuf { ptr, layout })
    }
}

impl Drop for ArenaBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// A matrix operand located in the arena.
#[derive(Clone, Copy, Debug)]
struct MatAt {
    off: usize,
    rs: isize,
    cs: isize,
    complex: bool,
    conj: bool,
}

impl MatAt {
    fn at(&self, base: *mut u8, row0: usize, col0: usize) -> Mat {
        let words = if self.complex { 2 } else { 1 };
        let elems = row0 as isize * self.rs + col0 as isize * self.cs;
        // SAFETY (of the caller's later use): offsets come from the plan.
        let ptr = unsafe { (base.add(self.off) as *const f32).offset(elems * words) };
        Mat { ptr, rs: self.rs, cs: self.cs, complex: self.complex, conj: self.conj }
    }
}

/// What one scheduled group runs.
enum Kernel {
    Loop(CompiledKernel),
    MatMul { m: usize, n: usize, k: usize, a: MatAt, b: MatAt, c: usize, c_complex: bool },
    Conv { s: ConvShape, t: ConvTypes, x: usize, w: usize, y: usize },
    ConvTranspose { s: ConvShape, t: ConvTypes, dy: usize, w: usize, dx: usize },
    WeightGrad { s: ConvShape, t: ConvTypes, x: usize, dy: usize, dw: usize, words: usize },
    Copy(StridedCopy),
    Pad { out: usize, bytes: usize, copy: StridedCopy },
    Concat(Vec<StridedCopy>),
    OneHot { labels: usize, out: usize, rows: usize, classes: usize },
    Dropout { step: usize, out: usize, n: usize, p: f64, salt: u32 },
    Fft(Box<AxisFft>),
}

/// Per-thread workspace.
struct Scratch {
    gemm: Vec<f32>,
    cols: Vec<f32>,
    dw: Vec<f32>,
}

/// Raw pointers handed to worker threads (each thread touches disjoint memory).
#[derive(Clone, Copy)]
struct Shared {
    base: *mut u8,
    scratch: *mut Scratch,
}
// SAFETY: threads write disjoint output ranges and their own scratch entry.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    // Methods (not field reads) so closures capture the whole `Sync` struct.
    fn base(&self) -> *mut u8 {
        self.base
    }
    fn scratch(&self, t: usize) -> *mut Scratch {
        // SAFETY: `t` is below the thread count, the length of the scratch vector.
        unsafe { self.scratch.add(t) }
    }
}

/// The CPU back end: one program, its arena and its compiled kernels.
pub struct CpuBackend {
    program: Program,
    arena: ArenaBuf,
    kernels: Vec<Kernel>,
    scratch: Vec<Scratch>,
    pool: Pool,
    _jit: JitKernels,
}

// SAFETY: the backend exclusively owns its arena, code and workspaces; raw pointers in it
// point only into memory it owns.
unsafe impl Send for CpuBackend {}

fn words(d: DType) -> usize {
    if d == DType::C64 {
        2
    } else {
        1
    }
}

fn thread_count() -> usize {
    let avail = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    match std::env::var("CVC_THREADS").ok().and_then(|s| s.parse::<usize>().ok()) {
        Some(n) if n >= 1 => n,
        _ => avail.min(2),
    }
}

impl CpuBackend {
    /// Compiles `program` for the CPU and allocates its arena and workspaces (the program is
    /// cloned; the backend owns its copy).
    pub fn new(program: &Program) -> Result<CpuBackend, RuntimeError> {
        let program = program.clone();
        let threads = thread_count();
        let jit = JitKernels::compile(&program)?;
        let arena = ArenaBuf::new(program.plan.arena_bytes)?;
        let mut kernels = Vec::new();
        let (mut cols_words, mut dw_words) = (0usize, 0usize);
        for &gid in &program.order {
            let grp = &program.groups[gid];
            let k = match grp.kind {
                GroupKind::View => continue,
                GroupKind::Elementwise | GroupKind::Reduce => Kernel::Loop(
                    *jit.kernels
                        .get(&gid)
                        .ok_or_else(|| RuntimeError(format!("group {gid} was not compiled")))?,
                ),
                GroupKind::Contraction | GroupKind::Movement => {
                    let v = *grp.nodes.last().ok_or_else(|| RuntimeError(format!("group {gid} is empty")))?;
                    let k = build_node_kernel(&program, v)?;
                    match &k {
                        Kernel::Conv { s, .. } | Kernel::ConvTranspose { s, .. } if !s.pointwise() => {
                            cols_words = cols_words.max(2 * s.k() * s.p());
                        }
                        Kernel::WeightGrad { s, words, .. } => {
                            if !s.pointwise() {
                                cols_words = cols_words.max(2 * s.k() * s.p());
                            }
                            dw_words = dw_words.max(s.w.iter().product::<usize>() * words);
                        }
                        _ => {}
                    }
                    k
                }
            };
            kernels.push(k);
        }
        let scratch = (0..threads)
            .map(|_| Scratch {
                gemm: vec![0.0; gemm::WORKSPACE_F32],
                cols: vec![0.0; cols_words],
                dw: vec![0.0; dw_words],
            })
            .collect();
        Ok(CpuBackend { program, arena, kernels, scratch, pool: Pool::new(threads), _jit: jit })
    }

    /// The program this backend runs.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Threads a step runs on.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    fn slot(&self, v: Value) -> Result<Slot, RuntimeError> {
        if v.index() >= self.program.graph.nodes.len() {
            return Err(RuntimeError(format!("value {v} is not in the program")));
        }
        self.program.plan.slot(v).ok_or_else(|| {
            RuntimeError(format!(
                "value {v} ({}) is not materialised in the arena",
                self.program.graph.node(v).op.mnemonic()
            ))
        })
    }
}

fn slot_of(p: &Program, v: Value) -> Result<usize, RuntimeError> {
    p.plan.slot(v).map(|s| s.offset).ok_or_else(|| {
        RuntimeError(format!("value {v} ({}) has no arena slot", p.graph.node(v).op.mnemonic()))
    })
}

fn dims4(s: &[usize]) -> Result<[usize; 4], RuntimeError> {
    s.try_into().map_err(|_| RuntimeError(format!("expected a 4-D shape, got {s:?}")))
}

/// Builds the kernel of a contraction or movement node.
fn build_node_kernel(p: &Program, v: Value) -> Result<Kernel, RuntimeError> {
    let g = &p.graph;
    let n = g.node(v);
    let batch = p.plan.batch;
    let shape = |x: Value| g.ty(x).shape.resolve(batch);
    let cplx = |x: Value| g.ty(x).dtype.is_complex();
    let out = slot_of(p, v)?;
    let out_shape = shape(v);
    if out_shape.len() > movement::MAX_RANK {
        return Err(RuntimeError(format!("{v}: rank {} exceeds {}", out_shape.len(), movement::MAX_RANK)));
    }
    let contiguous = movement::strides(&out_shape);
    let ow = words(n.ty.dtype);
    let input = |i: usize| n.inputs[i];
    Ok(match &n.op {
        Op::MatMul { trans, conj } => {
            let (a, b) = (input(0), input(1));
            let (sa, sb) = (shape(a), shape(b));
            let (m, k) = if trans[0] { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
            let nn = if trans[1] { sb[0] } else { sb[1] };
            let (ars, acs) = if trans[0] { (1, sa[1] as isize) } else { (sa[1] as isize, 1) };
            let (brs, bcs) = if trans[1] { (1, sb[1] as isize) } else { (sb[1] as isize, 1) };
            Kernel::MatMul {
                m,
                n: nn,
                k,
                a: MatAt { off: slot_of(p, a)?, rs: ars, cs: acs, complex: cplx(a), conj: conj[0] },
                b: MatAt { off: slot_of(p, b)?, rs: brs, cs: bcs, complex: cplx(b), conj: conj[1] },
                c: out,
                c_complex: n.ty.dtype.is_complex(),
            }
        }
        Op::Conv2d { geom, conj } => {
            let (x, w) = (input(0), input(1));
            let o = dims4(&out_shape)?;
            let s = ConvShape { x: dims4(&shape(x))?, w: dims4(&shape(w))?, out: [o[2], o[3]], geom: *geom };
            let t = ConvTypes { x: cplx(x), w: cplx(w), conj: *conj };
            Kernel::Conv { s, t, x: slot_of(p, x)?, w: slot_of(p, w)?, y: out }
        }
        Op::ConvTranspose2d { geom, conj, .. } => {
            let (dy, w) = (input(0), input(1));
            let d = dims4(&shape(dy))?;
            let s = ConvShape { x: dims4(&out_shape)?, w: dims4(&shape(w))?, out: [d[2], d[3]], geom: *geom };
            let t = ConvTypes { x: cplx(dy), w: cplx(w), conj: *conj };
            Kernel::ConvTranspose { s, t, dy: slot_of(p, dy)?, w: slot_of(p, w)?, dx: out }
        }
        Op::Conv2dWeightGrad { geom, conj, .. } => {
            let (x, dy) = (input(0), input(1));
            let d = dims4(&shape(dy))?;
            let s = ConvShape { x: dims4(&shape(x))?, w: dims4(&out_shape)?, out: [d[2], d[3]], geom: *geom };
            let t = ConvTypes { x: cplx(x), w: cplx(dy), conj: *conj };
            Kernel::WeightGrad { s, t, x: slot_of(p, x)?, dy: slot_of(p, dy)?, dw: out, words: ow }
        }
        Op::Expand | Op::Permute { .. } | Op::Slice { .. } => {
            let x = input(0);
            let xs = shape(x);
            let xst = movement::strides(&xs);
            let iw = words(g.ty(x).dtype);
            let (src, src_strides) = match &n.op {
                Op::Expand => {
                    let lead = out_shape.len() - xs.len();
                    let st = (0..out_shape.len())
                        .map(|d| if d < lead || xs[d - lead] == 1 { 0 } else { xst[d - lead] })
                        .collect();
                    (slot_of(p, x)?, st)
                }
                Op::Permute { perm } => (slot_of(p, x)?, perm.iter().map(|&q| xst[q]).collect()),
                Op::Slice { axis, start, .. } => {
                    (slot_of(p, x)? + start * xst[*axis] as usize * iw * 4, xst.clone())
                }
                _ => unreachable!("matched above"),
            };
            Kernel::Copy(StridedCopy {
                shape: out_shape,
                src,
                src_strides,
                dst: out,
                dst_strides: contiguous,
                src_words: iw,
                dst_words: ow,
            })
        }
        Op::Pad { axis, before, .. } => {
            let x = input(0);
            let xs = shape(x);
            Kernel::Pad {
                out,
                bytes: n.ty.bytes(batch),
                copy: StridedCopy {
                    shape: xs.clone(),
                    src: slot_of(p, x)?,
                    src_strides: movement::strides(&xs),
                    dst: out + before * contiguous[*axis] as usize * ow * 4,
                    dst_strides: contiguous,
                    src_words: words(g.ty(x).dtype),
                    dst_words: ow,
                },
            }
        }
        Op::Concat { axis } => {
            let mut pieces = Vec::new();
            let mut at = 0usize;
            for &x in &n.inputs {
                let xs = shape(x);
                pieces.push(StridedCopy {
                    shape: xs.clone(),
                    src: slot_of(p, x)?,
                    src_strides: movement::strides(&xs),
                    dst: out + at * contiguous[*axis] as usize * ow * 4,
                    dst_strides: contiguous.clone(),
                    src_words: words(g.ty(x).dtype),
                    dst_words: ow,
                });
                at += xs[*axis];
            }
            Kernel::Concat(pieces)
        }
        Op::OneHot { classes } => {
            let x = input(0);
            Kernel::OneHot {
                labels: slot_of(p, x)?,
                out,
                rows: g.ty(x).shape.numel(batch),
                classes: *classes,
            }
        }
        Op::DropoutMask { p: prob, salt } => Kernel::Dropout {
            step: slot_of(p, input(0))?,
            out,
            n: n.ty.shape.numel(batch),
            p: *prob,
            salt: *salt,
        },
        Op::Fft { axis, inverse, norm } => {
            let x = input(0);
            let scale = norm.scale(out_shape[*axis], *inverse);
            Kernel::Fft(Box::new(AxisFft::new(&out_shape, *axis, *inverse, scale, slot_of(p, x)?, out)))
        }
        op => return Err(RuntimeError(format!("{v}: the CPU back end has no kernel for {}", op.mnemonic()))),
    })
}

/// Splits `0..n` into `parts` contiguous ranges; returns range `i`.
fn chunk(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let per = n.div_ceil(parts.max(1));
    ((i * per).min(n), ((i + 1) * per).min(n))
}

impl CpuBackend {
    fn run_kernel(pool: &Pool, sh: Shared, k: &mut Kernel) {
        let base = sh.base();
        let threads = pool.threads();
        // SAFETY (whole function): every offset and extent was derived from the plan at load,
        // which places each buffer inside the arena; threads write disjoint ranges.
        unsafe {
            match k {
                Kernel::Loop(ck) => {
                    let ck = *ck;
                    if threads > 1 && ck.work >= 16_384 && ck.rows >= threads {
                        pool.run(&|t| {
                            let (lo, hi) = chunk(ck.rows, threads, t);
                            if lo < hi {
                                (ck.f)(sh.base() as i64, lo as i64, hi as i64);
                            }
                        });
                    } else {
                        (ck.f)(base as i64, 0, ck.rows as i64);
                    }
                }
                Kernel::MatMul { m, n, k, a, b, c, c_complex } => {
                    let (m, n, kk, a, b, c, cw) = (*m, *n, *k, *a, *b, *c, if *c_complex { 2 } else { 1 });
                    let split_m = m >= n;
                    let par =
                        threads > 1 && m * n * kk >= 1 << 16 && (if split_m { m } else { n }) >= threads;
                    let parts = if par { threads } else { 1 };
                    let job = |t: usize| {
                        let s = &mut *sh.scratch(t);
                        let (lo, hi) = chunk(if split_m { m } else { n }, parts, t);
                        if lo >= hi {
                            return;
                        }
                        let (am, bm, cp) = if split_m {
                            (
                                a.at(sh.base(), lo, 0),
                                b.at(sh.base(), 0, 0),
                                (sh.base().add(c) as *mut f32).add(lo * n * cw),
                            )
                        } else {
                            (
                                a.at(sh.base(), 0, 0),
                                b.at(sh.base(), 0, lo),
                                (sh.base().add(c) as *mut f32).add(lo * cw),
                            )
                        };
                        let (mm, nn) = if split_m { (hi - lo, n) } else { (m, hi - lo) };
                        contract::matmul(mm, nn, kk, am, bm, cp, n as isize, false, &mut s.gemm);
                    };
                    if par {
                        pool.run(&job);
                    } else {
                        job(0);
                    }
                }
                Kernel::Conv { s, t, x, w, y } => {
                    let (s, t) = (*s, *t);
                    let (x, w, y) =
                        (base.add(*x) as *const f32, base.add(*w) as *const f32, base.add(*y) as *mut f32);
                    let (x, w, y) = (x as usize, w as usize, y as usize);
                    pool.run(&|th| {
                        let sc = &mut *sh.scratch(th);
                        let (lo, hi) = chunk(s.x[0], threads, th);
                        for img in lo..hi {
                            contract::conv_image(
                                &s,
                                t,
                                img,
                                x as *const f32,
                                w as *const f32,
                                y as *mut f32,
                                sc.cols.as_mut_ptr(),
                                &mut sc.gemm,
                            );
                        }
                    });
                }
                Kernel::ConvTranspose { s, t, dy, w, dx } => {
                    let (s, t) = (*s, *t);
                    let (dy, w, dx) = (base.add(*dy) as usize, base.add(*w) as usize, base.add(*dx) as usize);
                    pool.run(&|th| {
                        let sc = &mut *sh.scratch(th);
                        let (lo, hi) = chunk(s.x[0], threads, th);
                        for img in lo..hi {
                            contract::conv_transpose_image(
                                &s,
                                t,
                                img,
                                dy as *const f32,
                                w as *const f32,
                                dx as *mut f32,
                                sc.cols.as_mut_ptr(),
                                &mut sc.gemm,
                            );
                        }
                    });
                }
                Kernel::WeightGrad { s, t, x, dy, dw, words } => {
                    let (s, t) = (*s, *t);
                    let len = s.w.iter().product::<usize>() * *words;
                    let (x, dy, dw) = (base.add(*x) as usize, base.add(*dy) as usize, base.add(*dw) as usize);
                    pool.run(&|th| {
                        let sc = &mut *sh.scratch(th);
                        let (lo, hi) = chunk(s.x[0], threads, th);
                        let dst = if th == 0 { dw as *mut f32 } else { sc.dw.as_mut_ptr() };
                        if lo >= hi {
                            std::ptr::write_bytes(dst, 0, len);
                        }
                        for img in lo..hi {
                            contract::weight_grad_image(
                                &s,
                                t,
                                img,
                                x as *const f32,
                                dy as *const f32,
                                dst,
                                img > lo,
                                sc.cols.as_mut_ptr(),
                                &mut sc.gemm,
                            );
                        }
                    });
                    let out = dw as *mut f32;
                    for th in 1..threads {
                        let part = &(*sh.scratch(th)).dw;
                        for (i, v) in part[..len].iter().enumerate() {
                            *out.add(i) += v;
                        }
                    }
                }
                Kernel::Copy(c) => c.run(base),
                Kernel::Pad { out, bytes, copy } => {
                    movement::zero(base, *out, *bytes);
                    copy.run(base);
                }
                Kernel::Concat(pieces) => {
                    for c in pieces.iter() {
                        c.run(base);
                    }
                }
                Kernel::OneHot { labels, out, rows, classes } => {
                    movement::one_hot(base, *labels, *out, *rows, *classes)
                }
                Kernel::Dropout { step, out, n, p, salt } => {
                    movement::dropout_mask(base, *step, *out, *n, *p, *salt)
                }
                Kernel::Fft(f) => f.run(base),
            }
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn upload(&mut self, v: Value, t: &HostTensor) -> Result<(), RuntimeError> {
        let slot = self.slot(v)?;
        let ty = self.program.graph.ty(v);
        let want = ty.shape.resolve(self.program.plan.batch);
        if t.dtype != ty.dtype || t.shape != want {
            return Err(RuntimeError(format!(
                "upload to {v}: expected {}{want:?}, got {}{:?}",
                ty.dtype, t.dtype, t.shape
            )));
        }
        let bytes = t.as_bytes();
        if bytes.len() != slot.bytes {
            return Err(RuntimeError(format!(
                "upload to {v}: {} bytes for a {}-byte buffer",
                bytes.len(),
                slot.bytes
            )));
        }
        // SAFETY: the slot lies inside the arena (the plan sized it).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.arena.ptr.add(slot.offset), bytes.len())
        };
        Ok(())
    }

    fn download(&mut self, v: Value) -> Result<HostTensor, RuntimeError> {
        let slot = self.slot(v)?;
        let ty = self.program.graph.ty(v);
        let shape = ty.shape.resolve(self.program.plan.batch);
        let bytes = ty.bytes(self.program.plan.batch);
        // SAFETY: the slot lies inside the arena and holds `bytes` bytes of this value.
        let raw = unsafe { std::slice::from_raw_parts(self.arena.ptr.add(slot.offset), bytes) };
        Ok(HostTensor::from_bytes(ty.dtype, &shape, raw))
    }

    fn step(&mut self) -> Result<(), RuntimeError> {
        let sh = Shared { base: self.arena.ptr, scratch: self.scratch.as_mut_ptr() };
        for k in self.kernels.iter_mut() {
            Self::run_kernel(&self.pool, sh, k);
        }
        Ok(())
    }

    fn arena_bytes(&self) -> usize {
        self.program.plan.arena_bytes
    }

    fn measured_peak_bytes(&self) -> Option<usize> {
        peak_rss_bytes()
    }
}

/// Peak resident set size of this process (`VmHWM` in `/proc/self/status`), in bytes.
pub fn peak_rss_bytes() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
