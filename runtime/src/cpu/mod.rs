//! The CPU back end: executes the [`CpuModule`](cvc_compiler::back::cpu::CpuModule) the compiler generated
//! (`cvc_compiler::back::cpu`) — Cranelift-JIT loop kernels, packed-GEMM contractions, rustfft,
//! strided data movement — in one arena allocated at load. It never looks at the IR: every
//! geometry and offset comes resolved in the module's launch list.
//!
//! Construction ([`CpuBackend::new`]) does every allocation: the arena (`plan.arena_bytes`),
//! the JIT code, per-thread GEMM/im2col workspaces, FFT plans and scratch, the worker pool.
//! [`Backend::step`] then runs the schedule without touching the heap (the
//! `runtime/tests/no_alloc.rs` test counts allocations to prove it). Work is split over the
//! batch (convolutions), over rows (matmul) or over the outer loop (generated kernels) on
//! `CVC_THREADS` threads (default: 2, at most the available cores).

pub mod attention;
pub mod contract;
pub mod fft;
pub mod gemm;
pub mod jit;
pub mod movement;
pub mod pool;
pub mod recurrence;

use crate::backend::{Backend, HostTensor, RuntimeError};
use crate::numerics::{self, CheckedBuffer, NonFinite};
use contract::Mat;
use cvc_compiler::back::clif::host_config;
use cvc_compiler::back::cpu::{self as gen, ConvCall, CpuCall, MatMulCall, MatOperand};
use cvc_compiler::ir::{DType, Value};
use cvc_compiler::passes::fusion::GroupId;
use cvc_compiler::passes::memplan::Slot;
use cvc_compiler::passes::Program;
use fft::AxisFft;
use jit::{CompiledKernel, JitKernels};
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

/// The matrix `op` of the module, starting at `(row0, col0)`, in the arena at `base`.
fn mat_at(op: &MatOperand, base: *mut u8, row0: usize, col0: usize) -> Mat {
    let words = if op.complex { 2 } else { 1 };
    let elems = row0 as isize * op.rs + col0 as isize * op.cs;
    // The pointer is only formed here; its use by the GEMM is covered by the launch's SAFETY
    // argument (offsets and extents come from the plan).
    let ptr = (base.wrapping_add(op.offset) as *const f32).wrapping_offset(elems * words);
    Mat { ptr, rs: op.rs, cs: op.cs, complex: op.complex, conj: op.conj }
}

/// Operands `a`, `b` and the output pointer of product `q` of a matmul's batch.
fn batch_operands(mm: &MatMulCall, base: *mut u8, q: usize) -> (Mat, Mat, *mut f32) {
    let [sa, sb, sc] = mm.batch_strides;
    let words = |complex: bool| if complex { 2 } else { 1 };
    let shift = |op: &MatOperand, stride: usize| MatOperand {
        offset: op.offset + q * stride * words(op.complex) * 4,
        ..*op
    };
    let c = base.wrapping_add(mm.c + q * sc * words(mm.c_complex) * 4) as *mut f32;
    (mat_at(&shift(&mm.a, sa), base, 0, 0), mat_at(&shift(&mm.b, sb), base, 0, 0), c)
}

/// `m` moved to element `(row0, col0)`.
fn mat_shift(m: &Mat, row0: usize, col0: usize) -> Mat {
    let words = if m.complex { 2 } else { 1 };
    let elems = row0 as isize * m.rs + col0 as isize * m.cs;
    Mat { ptr: m.ptr.wrapping_offset(elems * words), ..*m }
}

/// What one launch runs: a JIT-compiled loop, a planned FFT (it owns buffers), or a native call
/// executed straight from the module's description.
enum Kernel {
    Loop(CompiledKernel),
    Fft(Box<AxisFft>),
    Native(Box<CpuCall>),
}

/// Per-thread workspace.
struct Scratch {
    gemm: Vec<f32>,
    cols: Vec<f32>,
    dw: Vec<f32>,
    attn: Vec<f32>,
    rnn: Vec<f32>,
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
    /// The kernel group of each launch, for check mode.
    launch_groups: Vec<GroupId>,
    /// Per launch, the buffers to scan after it: built by the first checked step.
    scan_after: Option<Vec<Vec<CheckedBuffer>>>,
    checked_steps: u64,
}

// SAFETY: the backend exclusively owns its arena, code and workspaces; raw pointers in it
// point only into memory it owns.
unsafe impl Send for CpuBackend {}

fn thread_count() -> usize {
    let avail = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    match std::env::var("CVC_THREADS").ok().and_then(|s| s.parse::<usize>().ok()) {
        Some(n) if n >= 1 => n,
        _ => avail.min(2),
    }
}

impl CpuBackend {
    /// Generates the CPU module of `program`, JIT-compiles its loop kernels and allocates its
    /// arena and workspaces (the program is cloned; the backend owns its copy).
    pub fn new(program: &Program) -> Result<CpuBackend, RuntimeError> {
        if program.graph.half.is_half() {
            // The session compiles full-width programs for the CPU (and says so once).
            return Err(RuntimeError(format!(
                "the CPU back end computes and stores in f32; this program stores activations as {} \
                 (compile it with Storage::Full)",
                program.graph.half.name()
            )));
        }
        let program = program.clone();
        let threads = thread_count();
        let module = gen::generate(&program, host_config()?)?;
        let jit = JitKernels::compile(&module)?;
        let arena = ArenaBuf::new(module.arena_bytes)?;
        let launch_groups = module.launches.iter().map(|l| l.group).collect();
        let kernels = module
            .launches
            .into_iter()
            .map(|l| match l.call {
                CpuCall::Loop { kernel } => {
                    jit.kernels.get(kernel).map(|&k| Kernel::Loop(k)).ok_or_else(|| {
                        RuntimeError(format!("group {}: loop kernel {kernel} was not compiled", l.group))
                    })
                }
                CpuCall::Fft(f) => Ok(Kernel::Fft(Box::new(AxisFft::new(&f)))),
                call => Ok(Kernel::Native(Box::new(call))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let scratch = (0..threads)
            .map(|_| Scratch {
                gemm: vec![0.0; gemm::WORKSPACE_F32],
                cols: vec![0.0; module.workspace.cols_words],
                dw: vec![0.0; module.workspace.dw_words],
                attn: vec![0.0; module.workspace.attn_words],
                rnn: vec![0.0; module.workspace.rnn_words],
            })
            .collect();
        Ok(CpuBackend {
            program,
            arena,
            kernels,
            scratch,
            pool: Pool::new(threads),
            _jit: jit,
            launch_groups,
            scan_after: None,
            checked_steps: 0,
        })
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

/// Splits `0..n` into `parts` contiguous ranges; returns range `i`.
fn chunk(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let per = n.div_ceil(parts.max(1));
    ((i * per).min(n), ((i + 1) * per).min(n))
}

/// Which per-image routine a convolution-family call runs.
#[derive(Clone, Copy)]
enum ConvKind {
    Forward,
    Transpose,
}

impl CpuBackend {
    /// Runs one launch.
    ///
    /// # Safety
    /// `sh.base` is this backend's arena and `sh.scratch` its per-thread workspaces, sized from
    /// the module the kernel came from: the compiler resolved every offset and extent from the
    /// memory plan, which places each buffer inside the arena.
    unsafe fn run_kernel(pool: &Pool, sh: Shared, k: &mut Kernel) {
        let threads = pool.threads();
        match k {
            Kernel::Loop(ck) => {
                let ck = *ck;
                if threads > 1 && ck.work >= 16_384 && ck.rows >= threads {
                    pool.run(&|t| {
                        let (lo, hi) = chunk(ck.rows, threads, t);
                        if lo < hi {
                            // SAFETY: threads run disjoint outer ranges of the kernel.
                            unsafe { (ck.f)(sh.base() as i64, lo as i64, hi as i64) };
                        }
                    });
                } else {
                    (ck.f)(sh.base() as i64, 0, ck.rows as i64);
                }
            }
            Kernel::Fft(f) => f.run(sh.base()),
            Kernel::Native(call) => Self::run_native(pool, sh, call),
        }
    }

    /// Runs a native call of the module.
    ///
    /// # Safety
    /// As [`CpuBackend::run_kernel`].
    unsafe fn run_native(pool: &Pool, sh: Shared, call: &CpuCall) {
        let base = sh.base();
        match call {
            CpuCall::MatMul(mm) => Self::run_matmul(pool, sh, mm),
            CpuCall::Conv(c) => Self::run_conv(pool, sh, c, ConvKind::Forward),
            CpuCall::ConvTranspose(c) => Self::run_conv(pool, sh, c, ConvKind::Transpose),
            CpuCall::WeightGrad(c) => Self::run_weight_grad(pool, sh, c),
            CpuCall::Copy(c) => movement::copy(c, base),
            CpuCall::Pad { out, bytes, copy } => {
                movement::zero(base, *out, *bytes);
                movement::copy(copy, base);
            }
            CpuCall::Concat(pieces) => {
                for c in pieces {
                    movement::copy(c, base);
                }
            }
            CpuCall::OneHot { labels, out, rows, classes } => {
                movement::one_hot(base, *labels, *out, *rows, *classes)
            }
            CpuCall::Gather(r) => movement::gather_rows(base, r),
            CpuCall::ScatterAdd(r) => movement::scatter_add_rows(base, r),
            CpuCall::Dropout { step, out, n, p, salt } => {
                movement::dropout_mask(base, *step, *out, *n, *p, *salt)
            }
            CpuCall::Attention(a) => {
                // SAFETY: thread `t` is below the thread count; each uses its own entry.
                let ws = |t: usize| unsafe { (*sh.scratch(t)).attn.as_mut_ptr() };
                attention::run(pool, base, &ws, a)
            }
            CpuCall::Recurrence(r) => {
                // SAFETY: thread `t` is below the thread count; each uses its own entry.
                let ws = |t: usize| unsafe { (*sh.scratch(t)).rnn.as_mut_ptr() };
                recurrence::run(pool, base, &ws, r)
            }
            // Planned at load into `Kernel::Loop` / `Kernel::Fft`.
            CpuCall::Loop { .. } | CpuCall::Fft(_) => {
                unreachable!("loop kernels and FFTs are planned into their own kernels at load")
            }
        }
    }

    /// A matmul: a single product split over rows (or columns when wider than tall) across
    /// threads; a batch of products split over the batch when it has a product per thread,
    /// else one product after the other, each split; summed products one after the other,
    /// each accumulating into the output.
    ///
    /// # Safety
    /// As [`CpuBackend::run_kernel`].
    unsafe fn run_matmul(pool: &Pool, sh: Shared, mm: &MatMulCall) {
        let threads = pool.threads();
        let MatMulCall { m, n, k, batch, sum_batch, .. } = *mm;
        if batch > 1 && !sum_batch && threads > 1 && batch >= threads && batch * m * n * k >= 1 << 16 {
            pool.run(&|t: usize| {
                // SAFETY: thread `t` owns scratch entry `t` and the output batches `lo..hi`.
                unsafe {
                    let s = &mut *sh.scratch(t);
                    let (lo, hi) = chunk(batch, threads, t);
                    for q in lo..hi {
                        let (a, b, c) = batch_operands(mm, sh.base(), q);
                        contract::matmul(m, n, k, a, b, c, n as isize, false, &mut s.gemm);
                    }
                }
            });
            return;
        }
        for q in 0..batch {
            Self::run_product(pool, sh, mm, q, sum_batch && q > 0);
        }
    }

    /// Product `q` of a matmul's batch, split over rows (or columns) across threads; added to
    /// the output when `accumulate`.
    ///
    /// # Safety
    /// As [`CpuBackend::run_kernel`].
    unsafe fn run_product(pool: &Pool, sh: Shared, mm: &MatMulCall, q: usize, accumulate: bool) {
        let threads = pool.threads();
        let MatMulCall { m, n, k, c_complex, .. } = *mm;
        let cw = if c_complex { 2 } else { 1 };
        let split_m = m >= n;
        let par = threads > 1 && m * n * k >= 1 << 16 && (if split_m { m } else { n }) >= threads;
        let parts = if par { threads } else { 1 };
        let job = |t: usize| {
            // SAFETY: thread `t` owns scratch entry `t` and output rows/columns `lo..hi`.
            unsafe {
                let s = &mut *sh.scratch(t);
                let (lo, hi) = chunk(if split_m { m } else { n }, parts, t);
                if lo >= hi {
                    return;
                }
                let (a, b, out) = batch_operands(mm, sh.base(), q);
                let (am, bm, cp) = if split_m {
                    (mat_shift(&a, lo, 0), b, out.add(lo * n * cw))
                } else {
                    (a, mat_shift(&b, 0, lo), out.add(lo * cw))
                };
                let (mm, nn) = if split_m { (hi - lo, n) } else { (m, hi - lo) };
                contract::matmul(mm, nn, k, am, bm, cp, n as isize, accumulate, &mut s.gemm);
            }
        };
        if par {
            pool.run(&job);
        } else {
            job(0);
        }
    }

    /// A forward or transposed convolution, images split across threads.
    ///
    /// # Safety
    /// As [`CpuBackend::run_kernel`].
    unsafe fn run_conv(pool: &Pool, sh: Shared, c: &ConvCall, kind: ConvKind) {
        let threads = pool.threads();
        let ConvCall { shape: s, types: t, x, w, y, .. } = *c;
        pool.run(&|th| {
            // SAFETY: thread `th` owns scratch entry `th` and the output images `lo..hi`.
            unsafe {
                let sc = &mut *sh.scratch(th);
                let (lo, hi) = chunk(s.x[0], threads, th);
                let base = sh.base();
                let (x, w, y) =
                    (base.add(x) as *const f32, base.add(w) as *const f32, base.add(y) as *mut f32);
                for img in lo..hi {
                    match kind {
                        ConvKind::Forward => {
                            contract::conv_image(&s, t, img, x, w, y, sc.cols.as_mut_ptr(), &mut sc.gemm)
                        }
                        ConvKind::Transpose => contract::conv_transpose_image(
                            &s,
                            t,
                            img,
                            x,
                            w,
                            y,
                            sc.cols.as_mut_ptr(),
                            &mut sc.gemm,
                        ),
                    }
                }
            }
        });
    }

    /// A weight gradient: each thread adds its images into a private copy (the first thread
    /// into the output), then the copies are summed into the output.
    ///
    /// # Safety
    /// As [`CpuBackend::run_kernel`].
    unsafe fn run_weight_grad(pool: &Pool, sh: Shared, c: &ConvCall) {
        let threads = pool.threads();
        let ConvCall { shape: s, types: t, x, w: dy, y: dw, out_words } = *c;
        let len = s.w.iter().product::<usize>() * out_words;
        pool.run(&|th| {
            // SAFETY: thread 0 writes the output, thread `th > 0` only its own scratch copy.
            unsafe {
                let sc = &mut *sh.scratch(th);
                let (lo, hi) = chunk(s.x[0], threads, th);
                let base = sh.base();
                let dst = if th == 0 { base.add(dw) as *mut f32 } else { sc.dw.as_mut_ptr() };
                if lo >= hi {
                    std::ptr::write_bytes(dst, 0, len);
                }
                let (x, dy) = (base.add(x) as *const f32, base.add(dy) as *const f32);
                for img in lo..hi {
                    contract::weight_grad_image(
                        &s,
                        t,
                        img,
                        x,
                        dy,
                        dst,
                        img > lo,
                        sc.cols.as_mut_ptr(),
                        &mut sc.gemm,
                    );
                }
            }
        });
        let out = sh.base().add(dw) as *mut f32;
        for th in 1..threads {
            let part = &(*sh.scratch(th)).dw;
            for (i, v) in part[..len].iter().enumerate() {
                *out.add(i) += v;
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

    fn upload_bytes(
        &mut self,
        v: Value,
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        let slot = self.slot(v)?;
        let ty = self.program.graph.ty(v);
        let want = ty.shape.resolve(self.program.plan.batch);
        if dtype != ty.dtype || shape != want.as_slice() || bytes.len() != slot.bytes {
            return Err(RuntimeError(format!(
                "upload to {v}: expected {}{want:?} ({} bytes), got {dtype}{shape:?} ({} bytes)",
                ty.dtype,
                slot.bytes,
                bytes.len()
            )));
        }
        // SAFETY: the slot lies inside the arena (the plan sized it) and `bytes` has exactly
        // its length (checked above); a caller's buffer never aliases the arena.
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

    fn download_into(&mut self, v: Value, out: &mut HostTensor) -> Result<(), RuntimeError> {
        if cfg!(target_endian = "big") {
            *out = self.download(v)?;
            return Ok(());
        }
        let slot = self.slot(v)?;
        let ty = self.program.graph.ty(v);
        let shape = ty.shape.resolve(self.program.plan.batch);
        let bytes = ty.bytes(self.program.plan.batch);
        let dst = out.reshape_for_overwrite(ty.dtype, &shape);
        if dst.len() != bytes {
            return Err(RuntimeError(format!(
                "download of {v}: {} bytes for a {bytes}-byte value",
                dst.len()
            )));
        }
        // SAFETY: the slot lies inside the arena and holds `bytes` bytes of this value.
        let raw = unsafe { std::slice::from_raw_parts(self.arena.ptr.add(slot.offset), bytes) };
        dst.copy_from_slice(raw);
        Ok(())
    }

    fn step(&mut self) -> Result<(), RuntimeError> {
        let sh = Shared { base: self.arena.ptr, scratch: self.scratch.as_mut_ptr() };
        for k in self.kernels.iter_mut() {
            // SAFETY: `sh` points at this backend's arena and workspaces, which `new` sized
            // from the module every kernel came from.
            unsafe { Self::run_kernel(&self.pool, sh, k) };
        }
        Ok(())
    }

    fn step_checked(&mut self) -> Result<Option<NonFinite>, RuntimeError> {
        self.checked_steps += 1;
        let groups: Vec<Option<GroupId>> = self.launch_groups.iter().map(|&g| Some(g)).collect();
        let scans = self.scan_after.get_or_insert_with(|| numerics::scan_plan(&self.program, &groups));
        let sh = Shared { base: self.arena.ptr, scratch: self.scratch.as_mut_ptr() };
        for (k, after) in self.kernels.iter_mut().zip(scans.iter()) {
            // SAFETY: as in `step`.
            unsafe { Self::run_kernel(&self.pool, sh, k) };
            for buf in after {
                // SAFETY: the buffer is a slot of the plan, inside the arena, and the launch
                // that wrote it has returned (the pool joins its threads).
                let bytes = unsafe { std::slice::from_raw_parts(self.arena.ptr.add(buf.offset), buf.bytes) };
                if let Some(found) = numerics::scan(buf, bytes) {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    fn checked_steps(&self) -> u64 {
        self.checked_steps
    }

    fn host_memory(&self) -> Vec<(String, usize)> {
        let words: usize = self
            .scratch
            .iter()
            .map(|s| s.gemm.len() + s.cols.len() + s.dw.len() + s.attn.len() + s.rnn.len())
            .sum();
        let fft: usize = self
            .kernels
            .iter()
            .map(|k| match k {
                Kernel::Fft(f) => f.buffer_bytes(),
                _ => 0,
            })
            .sum();
        let mut items = vec![(format!("CPU workspaces ({} threads)", self.threads()), 4 * words)];
        if fft > 0 {
            items.push(("FFT plans and buffers".to_string(), fft));
        }
        items.push(("JIT code".to_string(), self._jit.code_bytes()));
        items
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
