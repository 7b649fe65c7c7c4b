//! The CUDA back end: queries the device (SM count, shared memory per block, compute
//! capability, grid limits) into the `CudaTarget` the kernels are generated for, compiles the
//! generated CUDA C with NVRTC (cached on disk), carves one device allocation into the plan's
//! buffers and replays the launch list each step.
//!
//! cudarc loads libcuda, libnvrtc at run time and panics when a library is missing, so every
//! entry point first checks that the library can be opened ([`available`], [`nvrtc_version`]).

use crate::backend::{Backend, HostTensor, RuntimeError};
use crate::numerics::{self, CheckedBuffer, NonFinite};
use cudarc::driver::{result, sys};
use cvc_compiler::back::cuda::{self, CompileUnit, CudaModule, CudaStep};
use cvc_compiler::config::Precision;
use cvc_compiler::ir::{DType, Storage, Value};
use cvc_compiler::passes::memplan::Slot;
use cvc_compiler::passes::Program;
use cvc_compiler::target::{CudaDevice, CudaTarget, KernelConfig, LaunchMode};
use cvc_compiler::units::human_bytes;
use sha2::{Digest, Sha256};
use std::cell::Cell;
use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;
use std::time::Instant;

fn driver_err(what: &str) -> impl Fn(result::DriverError) -> RuntimeError + '_ {
    move |e| RuntimeError(format!("CUDA {what} failed: {e}"))
}

/// Name of the first CUDA device, or why the GPU cannot be used (no driver library, no device).
pub fn available() -> Result<String, String> {
    // SAFETY: loading libcuda runs only the driver's own initialisers; cudarc panics (caught
    // here) rather than misbehaving when the library or a symbol is missing.
    let present = std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    if !present {
        return Err("no CUDA driver found (libcuda.so could not be loaded)".into());
    }
    std::panic::catch_unwind(|| -> Result<String, String> {
        result::init().map_err(|e| format!("the CUDA driver failed to initialise: {e}"))?;
        let n = result::device::get_count().map_err(|e| format!("cannot count CUDA devices: {e}"))?;
        if n < 1 {
            return Err("the CUDA driver reports no device".into());
        }
        let dev = result::device::get(0).map_err(|e| format!("cannot open CUDA device 0: {e}"))?;
        result::device::get_name(dev).map_err(|e| format!("cannot read the device name: {e}"))
    })
    .unwrap_or_else(|_| Err("the CUDA driver library is unusable".into()))
}

/// The facts of CUDA device 0 that code generation reads (SM count, compute capability,
/// shared memory, grid limits), without creating a context or allocating; or why the GPU
/// cannot be used.
pub fn device_facts() -> Result<CudaDevice, String> {
    available()?;
    let dev = result::device::get(0).map_err(|e| format!("cannot open CUDA device 0: {e}"))?;
    query_device(dev).map_err(|e| e.0)
}

/// NVRTC's version `(major, minor)`, or why NVRTC cannot be loaded.
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    use cudarc::nvrtc::sys as nv;
    // SAFETY: as in `available`, for libnvrtc.
    let present = std::panic::catch_unwind(|| unsafe { nv::is_culib_present() }).unwrap_or(false);
    if !present {
        return Err("NVRTC not found (libnvrtc.so.13 or libnvrtc.so could not be loaded; put its directory on LD_LIBRARY_PATH)".into());
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded (checked above); the two pointers are valid `i32`s.
    unsafe { nv::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| format!("nvrtcVersion failed: {e:?}"))?;
    Ok((major, minor))
}

/// What NVRTC produces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Output {
    Ptx,
    Cubin,
}

/// `nvrtcGetPTXSize` / `nvrtcGetCUBINSize`.
type SizeQuery = unsafe fn(cudarc::nvrtc::sys::nvrtcProgram, *mut usize) -> cudarc::nvrtc::sys::nvrtcResult;
/// `nvrtcGetPTX` / `nvrtcGetCUBIN`.
type OutputQuery =
    unsafe fn(cudarc::nvrtc::sys::nvrtcProgram, *mut std::ffi::c_char) -> cudarc::nvrtc::sys::nvrtcResult;

/// An NVRTC program, destroyed on drop (also when compilation or a query fails).
struct NvrtcProgram(cudarc::nvrtc::sys::nvrtcProgram);

impl NvrtcProgram {
    fn create(src: &CStr, name: &CStr) -> Result<NvrtcProgram, String> {
        use cudarc::nvrtc::sys as nv;
        let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: `src` and `name` are NUL-terminated and outlive the call (NVRTC copies
        // them); no headers are passed (count 0, null arrays); `prog` is written on success.
        unsafe {
            nv::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        }
        .result()
        .map_err(|e| format!("nvrtcCreateProgram failed: {e:?}"))?;
        Ok(NvrtcProgram(prog))
    }

    /// Compiles with `opts`; the error is the compiler's log.
    fn compile(&self, opts: &[CString]) -> Result<(), String> {
        use cudarc::nvrtc::sys as nv;
        let ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `self.0` is a live program; `ptrs` holds `ptrs.len()` NUL-terminated
        // strings owned by `opts`, which outlives the call.
        let compiled = unsafe { nv::nvrtcCompileProgram(self.0, ptrs.len() as i32, ptrs.as_ptr()) };
        compiled.result().map_err(|_| self.log())
    }

    /// The compilation log (empty when NVRTC has none).
    fn log(&self) -> String {
        use cudarc::nvrtc::sys as nv;
        let mut size = 0usize;
        // SAFETY: `self.0` is a live program; `size` is written on success.
        if unsafe { nv::nvrtcGetProgramLogSize(self.0, &mut size) }.result().is_err() || size <= 1 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` has the `size` bytes NVRTC just said the log takes (NUL included).
        if unsafe { nv::nvrtcGetProgramLog(self.0, buf.as_mut_ptr() as *mut _) }.result().is_err() {
            return String::new();
        }
        CStr::from_bytes_until_nul(&buf).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// The compiled PTX or cubin.
    fn output(&self, output: Output) -> Result<Vec<u8>, String> {
        use cudarc::nvrtc::sys as nv;
        let (get_size, get): (SizeQuery, OutputQuery) = match output {
            Output::Ptx => (nv::nvrtcGetPTXSize, nv::nvrtcGetPTX),
            Output::Cubin => (nv::nvrtcGetCUBINSize, nv::nvrtcGetCUBIN),
        };
        let mut size = 0usize;
        // SAFETY: `self.0` is a live, compiled program; `size` is written on success.
        unsafe { get_size(self.0, &mut size) }.result().map_err(|e| format!("NVRTC output size: {e:?}"))?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` has exactly the `size` bytes NVRTC just said the output takes.
        unsafe { get(self.0, buf.as_mut_ptr() as *mut _) }
            .result()
            .map_err(|e| format!("NVRTC output: {e:?}"))?;
        Ok(buf)
    }
}

impl Drop for NvrtcProgram {
    fn drop(&mut self) {
        // SAFETY: `self.0` was created by `nvrtcCreateProgram` and is destroyed only here.
        let _ = unsafe { cudarc::nvrtc::sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

fn nvrtc_compile(source: &str, arch: &str, output: Output) -> Result<Vec<u8>, String> {
    nvrtc_version()?;
    let src = CString::new(source).map_err(|_| "CUDA source contains a NUL byte".to_string())?;
    let name = c"cvc_module.cu";
    let arch_opt = match output {
        Output::Ptx => format!("--gpu-architecture={}", arch.replace("sm_", "compute_")),
        Output::Cubin => format!("--gpu-architecture={arch}"),
    };
    let opts: Vec<CString> = [arch_opt.as_str(), "--std=c++17"]
        .iter()
        .map(|o| CString::new(*o).map_err(|_| format!("NVRTC option {o:?} contains a NUL byte")))
        .collect::<Result<_, _>>()?;
    let prog = NvrtcProgram::create(&src, name)?;
    prog.compile(&opts)
        .map_err(|log| format!("NVRTC rejected the generated CUDA source for {arch}:\n{log}"))?;
    prog.output(output)
}

/// Compiles CUDA C `source` to PTX for `arch` (e.g. `sm_90`) with NVRTC. Needs no GPU.
pub fn compile_ptx(source: &str, arch: &str) -> Result<String, String> {
    let bytes = nvrtc_compile(source, arch, Output::Ptx)?;
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// Compiles CUDA C `source` to a cubin for `arch` (e.g. `sm_90`) with NVRTC. Needs no GPU.
pub fn compile_cubin(source: &str, arch: &str) -> Result<Vec<u8>, String> {
    nvrtc_compile(source, arch, Output::Cubin)
}

/// The on-disk cache directory: `$CVC_CACHE_DIR`, else the user cache dir's `cvc/`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("CVC_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    dirs::cache_dir().map(|d| d.join("cvc"))
}

/// How the module was obtained at start-up.
#[derive(Clone, Debug)]
pub struct CompileInfo {
    /// Target architecture (`sm_90` on an H200).
    pub arch: String,
    /// Number of kernels in the module.
    pub kernels: usize,
    /// Translation units the kernels were split into ([`CudaModule::units`]).
    pub units: usize,
    /// Units NVRTC compiled (the others came from the cache).
    pub compiled: usize,
    /// Threads the compiled units were spread over.
    pub threads: usize,
    /// Seconds spent compiling and reading the cache.
    pub seconds: f64,
    /// Whether every unit came from the on-disk cache.
    pub cache_hit: bool,
    /// The cache directory (or, for one unit, its file), when a cache directory exists.
    pub cache_path: Option<PathBuf>,
    /// NVRTC version used (or that the cache key names).
    pub nvrtc: (i32, i32),
}

impl std::fmt::Display for CompileInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = self.nvrtc;
        let how = if self.cache_hit {
            format!("loaded from the cache (NVRTC {major}.{minor}, no compilation)")
        } else if self.compiled < self.units {
            format!(
                "compiled with NVRTC {major}.{minor} ({} of {} units, {} from the cache, {} threads)",
                self.compiled,
                self.units,
                self.units - self.compiled,
                self.threads
            )
        } else if self.units > 1 {
            format!("compiled with NVRTC {major}.{minor} ({} units, {} threads)", self.units, self.threads)
        } else {
            format!("compiled with NVRTC {major}.{minor}")
        };
        write!(f, "{} kernels for {} {how} in {:.2} s", self.kernels, self.arch, self.seconds)?;
        if let Some(p) = &self.cache_path {
            write!(f, " ({})", p.display())?;
        }
        Ok(())
    }
}

/// The cache file of `source` compiled for `arch` by NVRTC `nvrtc`: named by the sha256 of
/// all three.
fn cache_file(source: &str, arch: &str, nvrtc: (i32, i32)) -> Option<PathBuf> {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update([0]);
    h.update(arch.as_bytes());
    h.update(format!("\0nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    cache_dir().map(|d| d.join(format!("{key}.{arch}.cubin")))
}

/// A cached cubin, when the file exists and is not empty.
fn read_cached(path: &Option<PathBuf>) -> Option<Vec<u8>> {
    std::fs::read(path.as_ref()?).ok().filter(|b| !b.is_empty())
}

/// Writes a cubin to the cache atomically (a temporary file, then a rename). Best effort: a
/// read-only cache directory only costs a recompile next time.
fn write_cached(path: &Option<PathBuf>, cubin: &[u8]) {
    let Some(p) = path else { return };
    if let Some(dir) = p.parent() {
        if std::fs::create_dir_all(dir).is_ok() {
            // A name of its own per write: units compile on several threads.
            static WRITES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = p.with_extension(format!("tmp{}.{n}", std::process::id()));
            if std::fs::write(&tmp, cubin).is_ok() && std::fs::rename(&tmp, p).is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
        }
    }
}

/// Compiles `source` for `arch` through the on-disk cache keyed by sha256 of source, arch and
/// NVRTC version. Returns the cubin and how it was obtained.
pub fn cached_cubin(source: &str, arch: &str, kernels: usize) -> Result<(Vec<u8>, CompileInfo), String> {
    let nvrtc = nvrtc_version()?;
    let path = cache_file(source, arch, nvrtc);
    let t = Instant::now();
    let (cubin, hit) = match read_cached(&path) {
        Some(bytes) => (bytes, true),
        None => {
            let cubin = compile_cubin(source, arch)?;
            write_cached(&path, &cubin);
            (cubin, false)
        }
    };
    let info = CompileInfo {
        arch: arch.into(),
        kernels,
        units: 1,
        compiled: usize::from(!hit),
        threads: 1,
        seconds: t.elapsed().as_secs_f64(),
        cache_hit: hit,
        cache_path: path,
        nvrtc,
    };
    Ok((cubin, info))
}

/// Compiles the translation units of a module for `arch`, each through the on-disk cache
/// (one cubin per unit, keyed as in [`cached_cubin`]); the units not in the cache compile in
/// parallel, on up to one thread per core. Returns one cubin per unit, in order.
pub fn cached_units(units: &[CompileUnit], arch: &str) -> Result<(Vec<Vec<u8>>, CompileInfo), String> {
    let nvrtc = nvrtc_version()?;
    let t = Instant::now();
    let paths: Vec<Option<PathBuf>> = units.iter().map(|u| cache_file(&u.source, arch, nvrtc)).collect();
    let mut cubins: Vec<Option<Vec<u8>>> = paths.iter().map(read_cached).collect();
    let missing: Vec<usize> = (0..units.len()).filter(|&i| cubins[i].is_none()).collect();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = cores.min(missing.len()).max(1);
    if !missing.is_empty() {
        // Each thread takes the next missing unit until none is left (units differ in size).
        let next = std::sync::atomic::AtomicUsize::new(0);
        // Per thread: the (unit, cubin) pairs it compiled, or the first NVRTC error.
        type Compiled = Result<Vec<(usize, Vec<u8>)>, String>;
        let results: Vec<Compiled> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(&i) = missing.get(at) else { return Ok(done) };
                            let cubin = compile_cubin(&units[i].source, arch)?;
                            write_cached(&paths[i], &cubin);
                            done.push((i, cubin));
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|_| Err("an NVRTC compile thread panicked".to_string())))
                .collect()
        });
        for r in results {
            for (i, cubin) in r? {
                cubins[i] = Some(cubin);
            }
        }
    }
    let cubins = cubins
        .into_iter()
        .enumerate()
        .map(|(i, c)| c.ok_or_else(|| format!("unit {i} of the CUDA module was neither cached nor compiled")))
        .collect::<Result<Vec<_>, _>>()?;
    let cache_path = if units.len() == 1 { paths[0].clone() } else { cache_dir() };
    let info = CompileInfo {
        arch: arch.into(),
        kernels: units.iter().map(|u| u.kernels.len()).sum(),
        units: units.len(),
        compiled: missing.len(),
        threads: if missing.is_empty() { 0 } else { threads },
        seconds: t.elapsed().as_secs_f64(),
        cache_hit: missing.is_empty(),
        cache_path,
        nvrtc,
    };
    Ok((cubins, info))
}

/// The facts code generation needs about `device`, from the driver's attributes.
fn query_device(device: sys::CUdevice) -> Result<CudaDevice, RuntimeError> {
    use sys::CUdevice_attribute as A;
    let attr = |a: A| {
        // SAFETY: `device` was returned by `cuDeviceGet`, and reading an attribute has no
        // other precondition.
        unsafe { result::device::get_attribute(device, a) }.map_err(driver_err("attribute query"))
    };
    CudaDevice::from_queried(
        attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
        attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        [
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
        ],
    )
    .map_err(RuntimeError)
}

enum Action {
    Launch { f: sys::CUfunction, grid: [u32; 3], block: [u32; 3], shared: u32, name: String },
    Zero { offset: usize, bytes: usize },
}

/// A compiled program resident on the GPU: module, one arena, the launch list.
pub struct CudaBackend {
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// One loaded module per translation unit ([`CudaModule::units`]).
    modules: Vec<sys::CUmodule>,
    actions: Vec<Action>,
    arena: sys::CUdeviceptr,
    arena_bytes: usize,
    /// Per value: dtype, concrete shape and slot.
    values: Vec<(DType, Vec<usize>, Option<Slot>)>,
    /// How each value is stored (16-bit activations under `precision = bf16 | fp16`).
    storage: Vec<Storage>,
    free_before: usize,
    peak: Cell<usize>,
    name: String,
    compile: CompileInfo,
    generated: CudaModule,
    target: CudaTarget,
    /// Page-locked host buffers of staged inputs (`Backend::stage`): pointer and bytes
    /// staged, per value; freed on drop.
    staging: Vec<(Value, *mut u8, usize, usize)>,
    /// Per action, the buffers check mode scans after it (`numerics::scan_plan`).
    scan_after: Vec<Vec<CheckedBuffer>>,
    checked_steps: u64,
    /// The launch list as one instantiated CUDA graph ([`LaunchMode::Graph`]), made at the
    /// first step.
    graph: Option<StepGraph>,
}

/// A step's launch list as a CUDA graph: one chain of kernel and memset nodes in list order
/// (each node depends on the one before, as on a stream), and its executable form.
struct StepGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl CudaBackend {
    /// Queries device 0, generates `program`'s kernels for it (with `precision` and the kernel
    /// choices `kernels`), compiles them (or loads them from the cache), loads them, and
    /// allocates the arena: the only device allocation the back end makes. Prints one
    /// `cuda: ...` line to stderr saying how the module was obtained (see [`CompileInfo`]).
    pub fn new(
        program: &Program,
        precision: Precision,
        kernels: &KernelConfig,
    ) -> Result<CudaBackend, RuntimeError> {
        let name = available().map_err(RuntimeError)?;
        // From here on, `Drop` releases whatever the steps below acquired when one fails.
        let mut backend = CudaBackend::attach(name)?;
        let device = query_device(backend.device)?;
        let target = CudaTarget { device, kernels: kernels.clone(), precision };
        backend.generated = cuda::generate(program, &target)
            .map_err(|e| RuntimeError(format!("CUDA code generation: {e}")))?;
        let arch = backend.generated.arch.clone();
        backend.load_module(&arch)?;
        backend.allocate_arena(program)?;
        let groups: Vec<Option<usize>> = backend
            .generated
            .steps
            .iter()
            .map(|s| match s {
                CudaStep::Launch(l) => Some(l.group),
                CudaStep::Zero { .. } => None,
            })
            .collect();
        backend.scan_after = numerics::scan_plan(program, &groups);
        backend.target = target;
        backend.sample_memory();
        Ok(backend)
    }

    /// A back end bound to device 0's primary context, with no module or arena yet.
    fn attach(name: String) -> Result<CudaBackend, RuntimeError> {
        let device = result::device::get(0).map_err(driver_err("device lookup"))?;
        // SAFETY: `device` was just returned by `cuDeviceGet`; the retained context is
        // released exactly once: here if binding it fails, else by the back end's `Drop`
        // (the back end owns it once binding succeeds).
        let ctx = unsafe { result::primary_ctx::retain(device) }.map_err(driver_err("context creation"))?;
        // SAFETY: `ctx` is the live primary context just retained.
        if let Err(e) = unsafe { result::ctx::set_current(ctx) } {
            // SAFETY: the retain above is undone once, and nothing else holds `ctx`.
            let _ = unsafe { result::primary_ctx::release(device) };
            return Err(driver_err("context binding")(e));
        }
        let mut backend = CudaBackend {
            device,
            ctx,
            modules: Vec::new(),
            actions: Vec::new(),
            graph: None,
            arena: 0,
            arena_bytes: 0,
            values: Vec::new(),
            storage: Vec::new(),
            free_before: 0,
            peak: Cell::new(0),
            name,
            compile: CompileInfo {
                arch: String::new(),
                kernels: 0,
                units: 0,
                compiled: 0,
                threads: 0,
                seconds: 0.0,
                cache_hit: false,
                cache_path: None,
                nvrtc: (0, 0),
            },
            generated: CudaModule {
                source: String::new(),
                kernel_code: Vec::new(),
                steps: Vec::new(),
                kernels: Vec::new(),
                scratch: (0, 0),
                arch: String::new(),
            },
            target: CudaTarget::default(),
            staging: Vec::new(),
            scan_after: Vec::new(),
            checked_steps: 0,
        };
        // Measured before the module and arena exist, so the peak counts both.
        backend.free_before = result::mem_get_info().map_err(driver_err("memory query"))?.0;
        Ok(backend)
    }

    /// Compiles (or loads from the cache) the generated source for `arch` as its translation
    /// units, loads one module per unit and resolves every launch of the step to its kernel.
    fn load_module(&mut self, arch: &str) -> Result<(), RuntimeError> {
        let units = self.generated.units(cuda::UNIT_BYTES);
        let (cubins, info) = cached_units(&units, arch).map_err(RuntimeError)?;
        // One line on stderr so every start reports compile time or the cache hit.
        crate::cli::write_err(&format!("cuda: {info}\n"));
        self.compile = info;
        let mut unit_of = std::collections::HashMap::new();
        for (cubin, unit) in cubins.iter().zip(&units) {
            // SAFETY: `cubin` is a complete cubin image NVRTC produced (or the cache holds,
            // keyed by its source, arch and NVRTC version) and outlives the call, which copies
            // it; the back end's context is current (bound by `attach`), and `Drop` unloads
            // every module pushed here.
            let module = unsafe { result::module::load_data(cubin.as_ptr() as *const c_void) }
                .map_err(driver_err("module load"))?;
            self.modules.push(module);
            for k in &unit.kernels {
                unit_of.insert(k.as_str(), module);
            }
        }
        for step in &self.generated.steps {
            self.actions.push(match step {
                CudaStep::Launch(l) => {
                    let cname = CString::new(l.name.as_str())
                        .map_err(|_| RuntimeError(format!("kernel name {:?} contains a NUL byte", l.name)))?;
                    let module = *unit_of.get(l.name.as_str()).ok_or_else(|| {
                        RuntimeError(format!("internal error: kernel {} is in no unit of the module", l.name))
                    })?;
                    // SAFETY: `module` is one loaded above, alive until `Drop`.
                    let f = unsafe { result::module::get_function(module, cname) }
                        .map_err(driver_err(&format!("lookup of kernel {}", l.name)))?;
                    // Dynamic shared memory beyond the default 48 KiB per block is an opt-in
                    // per kernel (the code generator checked it against the device's limit).
                    if l.shared_bytes > 0 {
                        // SAFETY: `f` is a kernel of a loaded module; the attribute only raises
                        // the dynamic shared memory its launches may ask for.
                        unsafe {
                            result::function::set_function_attribute(
                                f,
                                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                l.shared_bytes as i32,
                            )
                        }
                        .map_err(driver_err(&format!("shared memory opt-in of kernel {}", l.name)))?;
                    }
                    Action::Launch {
                        f,
                        grid: l.grid,
                        block: l.block,
                        shared: l.shared_bytes,
                        name: l.name.clone(),
                    }
                }
                CudaStep::Zero { offset, bytes } => Action::Zero { offset: *offset, bytes: *bytes },
            });
        }
        Ok(())
    }

    /// Allocates the arena (the plan's buffers, then the scratch memory: the 16-bit products'
    /// staged weights and the reductions' partials) and records the dtype, shape and slot of
    /// every value.
    fn allocate_arena(&mut self, program: &Program) -> Result<(), RuntimeError> {
        self.arena_bytes = program.plan.arena_bytes;
        // One allocation: the plan's arena, then the scratch (zeroed once: the reductions'
        // counters return to 0 at the end of every kernel that uses them; the staged weights
        // are written before they are read).
        let (scratch_at, scratch_bytes) = self.generated.scratch;
        let total = if scratch_bytes > 0 { scratch_at + scratch_bytes } else { program.plan.arena_bytes };
        // SAFETY: the back end's context is current; `Drop` frees the allocation once.
        self.arena = unsafe { result::malloc_sync(total.max(256)) }.map_err(|e| {
            // Say what did not fit and what to do: the usual cause is a batch chosen for a
            // memory budget (`cvc plan --max-batch`) run without that budget, so the plan has
            // none of the recomputation that made it fit.
            let free = result::mem_get_info().map(|(free, _)| format!("{} free", human_bytes(free as u64)));
            RuntimeError(format!(
                "CUDA arena allocation failed: {e}: the plan needs {} on the GPU ({}); lower the \
                 batch, or pass the budget the batch was chosen for (`--memory-budget`, e.g. the \
                 one given to `cvc plan --max-batch`) so the planner recomputes values to fit it",
                human_bytes(total as u64),
                free.unwrap_or_else(|why| format!("free memory unknown: {why}"))
            ))
        })?;
        if scratch_bytes > 0 {
            // SAFETY: `[scratch_at, scratch_at + scratch_bytes)` lies inside the `total` bytes
            // just allocated, and no kernel runs yet.
            unsafe { result::memset_d8_sync(self.arena + scratch_at as u64, 0, scratch_bytes) }
                .map_err(driver_err("scratch zeroing"))?;
        }
        let g = &program.graph;
        self.values = g
            .nodes
            .iter()
            .map(|(h, n)| (n.ty.dtype, n.ty.shape.resolve(program.plan.batch), program.plan.slot(h)))
            .collect();
        self.storage = g.nodes.handles().map(|h| g.storage(h)).collect();
        Ok(())
    }

    /// The target the kernels were generated for: the queried device, the kernel choices and
    /// the numerics.
    pub fn target(&self) -> &CudaTarget {
        &self.target
    }

    /// How the module was compiled or loaded (time, cache hit, cache file).
    pub fn compile_info(&self) -> &CompileInfo {
        &self.compile
    }

    /// Whether `v` has a buffer in the arena (leaves no kernel reads may have none).
    pub fn has_buffer(&self, v: Value) -> bool {
        self.values.get(v.index()).is_some_and(|x| x.2.is_some())
    }

    /// The generated module (source and launch list).
    pub fn module(&self) -> &CudaModule {
        &self.generated
    }

    fn bind(&self) -> Result<(), RuntimeError> {
        // SAFETY: `self.ctx` is the primary context this back end retained; it stays alive
        // until `Drop` releases it.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(driver_err("context binding"))
    }

    fn sample_memory(&self) {
        if let Ok((free, _)) = result::mem_get_info() {
            let used = self.free_before.saturating_sub(free);
            if used > self.peak.get() {
                self.peak.set(used);
            }
        }
    }

    /// How `v` is stored.
    fn storage_of(&self, v: Value) -> Storage {
        self.storage.get(v.index()).copied().unwrap_or_default()
    }

    fn slot(&self, v: Value) -> Result<(DType, Vec<usize>, Slot), RuntimeError> {
        let (dt, shape, slot) = self
            .values
            .get(v.index())
            .cloned()
            .ok_or_else(|| RuntimeError(format!("{v} is not a value of this program")))?;
        let slot = slot.ok_or_else(|| RuntimeError(format!("{v} has no buffer in the memory plan")))?;
        Ok((dt, shape, slot))
    }

    /// Runs one step with an event pair around every action; returns `(kernel, ms)` in
    /// launch order. For profiles only: it waits for each kernel before the next.
    pub fn profile_step(&mut self) -> Result<Vec<(String, f64)>, RuntimeError> {
        self.bind()?;
        let stream: sys::CUstream = std::ptr::null_mut();
        let start =
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(driver_err("event"))?;
        let end = match result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT) {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: `start` was just created and is used nowhere else.
                let _ = unsafe { result::event::destroy(start) };
                return Err(driver_err("event")(e));
            }
        };
        let mut times = Vec::new();
        let mut outcome = Ok(());
        // SAFETY (the event calls below): `start` and `end` are live events of the current
        // context, destroyed only after the loop; the stream is the legacy default stream.
        for a in &self.actions {
            let r = (|| -> Result<f32, RuntimeError> {
                // SAFETY: see above.
                unsafe { result::event::record(start, stream) }.map_err(driver_err("event record"))?;
                run_action(self.arena, a)?;
                // SAFETY: see above.
                unsafe { result::event::record(end, stream) }.map_err(driver_err("event record"))?;
                // SAFETY: see above.
                unsafe { result::event::synchronize(end) }
                    .map_err(|e| RuntimeError(format!("kernel failed: {e}")))?;
                // SAFETY: see above; both events have completed (synchronised).
                unsafe { result::event::elapsed(start, end) }.map_err(driver_err("event timing"))
            })();
            match r {
                Ok(ms) => times.push((a.label(), ms as f64)),
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        // SAFETY: both events are live, and no recorded work refers to them any more (the
        // last record was synchronised, or failed).
        unsafe {
            let _ = result::event::destroy(start);
            let _ = result::event::destroy(end);
        }
        outcome.map(|_| times)
    }
}

/// What one kernel of a module holds on an SM, from the driver: registers per thread, local
/// memory (spills) per thread in bytes, and static shared memory per block in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelResources {
    /// Registers per thread.
    pub registers: i32,
    /// Local memory per thread (register spills, local arrays), bytes.
    pub local_bytes: i32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: i32,
}

impl CudaBackend {
    /// The driver's [`KernelResources`] of the launched kernel `name`, if the step launches it.
    pub fn kernel_resources(&self, name: &str) -> Option<KernelResources> {
        use sys::CUfunction_attribute_enum as A;
        let f = self.actions.iter().find_map(|a| match a {
            Action::Launch { f, name: n, .. } if n == name => Some(*f),
            _ => None,
        })?;
        // SAFETY: `f` is a function of a module this backend loaded and still holds.
        let get = |attr| unsafe { result::function::get_function_attribute(f, attr) }.ok();
        Some(KernelResources {
            registers: get(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            shared_bytes: get(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        })
    }
}

impl Action {
    fn label(&self) -> String {
        match self {
            Action::Launch { name, .. } => name.clone(),
            Action::Zero { bytes, .. } => format!("memset({bytes} B)"),
        }
    }
}

/// The launch list `actions` as one instantiated graph: a chain of nodes in list order, so
/// the graph runs exactly what the list runs, in the same order.
fn build_graph(
    ctx: sys::CUcontext,
    arena: sys::CUdeviceptr,
    actions: &[Action],
) -> Result<StepGraph, RuntimeError> {
    let fail =
        |what: &str, e: sys::CUresult| RuntimeError(format!("building the step's CUDA graph: {what}: {e:?}"));
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: creates an empty graph owned by the returned `StepGraph` (or destroyed below).
    let r = unsafe { sys::cuGraphCreate(&mut graph, 0) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(fail("cuGraphCreate", r));
    }
    let destroy = |graph| {
        // SAFETY: `graph` was created above and is not used after this.
        unsafe { sys::cuGraphDestroy(graph) };
    };
    let mut prev: Option<sys::CUgraphNode> = None;
    for a in actions {
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        let deps: Vec<sys::CUgraphNode> = prev.into_iter().collect();
        let r = match a {
            Action::Zero { offset, bytes } => {
                let p = sys::CUDA_MEMSET_NODE_PARAMS {
                    dst: arena + *offset as u64,
                    pitch: *bytes,
                    value: 0,
                    elementSize: 1,
                    width: *bytes,
                    height: 1,
                };
                // SAFETY: `graph` is live, `deps` holds the previous node of this graph (or is
                // empty), and the range lies inside the arena, as for the stream memset.
                unsafe { sys::cuGraphAddMemsetNode(&mut node, graph, deps.as_ptr(), deps.len(), &p, ctx) }
            }
            Action::Launch { f, grid, block, shared, .. } => {
                let mut base = arena;
                let mut params = [&mut base as *mut sys::CUdeviceptr as *mut c_void];
                let p = sys::CUDA_KERNEL_NODE_PARAMS_v2 {
                    func: *f,
                    gridDimX: grid[0],
                    gridDimY: grid[1],
                    gridDimZ: grid[2],
                    blockDimX: block[0],
                    blockDimY: block[1],
                    blockDimZ: block[2],
                    sharedMemBytes: *shared,
                    kernelParams: params.as_mut_ptr(),
                    extra: std::ptr::null_mut(),
                    kern: std::ptr::null_mut(),
                    ctx: std::ptr::null_mut(),
                };
                // SAFETY: as for `run_action`'s launch: `f`'s one parameter is `char* A`, and the
                // driver copies the parameter values into the node during this call.
                unsafe { sys::cuGraphAddKernelNode_v2(&mut node, graph, deps.as_ptr(), deps.len(), &p) }
            }
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            destroy(graph);
            return Err(fail(&format!("adding {}", a.label()), r));
        }
        prev = Some(node);
    }
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: `graph` is complete; `exec` is owned by the returned `StepGraph`.
    let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
    if r != sys::CUresult::CUDA_SUCCESS {
        destroy(graph);
        return Err(fail("cuGraphInstantiate", r));
    }
    Ok(StepGraph { graph, exec })
}

/// Issues one action on the legacy default stream.
fn run_action(arena: sys::CUdeviceptr, a: &Action) -> Result<(), RuntimeError> {
    let stream: sys::CUstream = std::ptr::null_mut();
    match a {
        // SAFETY: the memory plan puts every zeroed range inside the arena allocation.
        Action::Zero { offset, bytes } => unsafe {
            result::memset_d8_async(arena + *offset as u64, 0, *bytes, stream).map_err(driver_err("memset"))
        },
        Action::Launch { f, grid, block, shared, name } => {
            let mut base = arena;
            let mut params = [&mut base as *mut sys::CUdeviceptr as *mut c_void];
            // SAFETY: `f` is a kernel of the loaded module, whose only parameter is `char* A`:
            // `params` holds one pointer to a device pointer, which the driver copies at the
            // launch. Every address the kernel computes from `A` lies in the arena and its
            // scratch, as the memory plan and code generation lay them out.
            unsafe {
                result::launch_kernel(
                    *f,
                    (grid[0], grid[1], grid[2]),
                    (block[0], block[1], block[2]),
                    *shared,
                    stream,
                    &mut params,
                )
            }
            .map_err(|e| RuntimeError(format!("launch of {name} failed: {e}")))
        }
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        format!("cuda:{}", self.name)
    }

    fn upload(&mut self, v: Value, t: &HostTensor) -> Result<(), RuntimeError> {
        self.bind()?;
        let (dt, shape, slot) = self.slot(v)?;
        if dt != t.dtype || shape.iter().product::<usize>() != t.numel() {
            return Err(RuntimeError(format!(
                "upload to {v}: expected {dt}{shape:?}, got {}{:?}",
                t.dtype, t.shape
            )));
        }
        let bytes = match self.storage_of(v) {
            Storage::Full => t.as_bytes(),
            half => std::borrow::Cow::Owned(crate::backend::narrow_to_half(&t.as_bytes(), half)),
        };
        if bytes.len() > slot.bytes {
            return Err(RuntimeError(format!(
                "upload to {v}: {} bytes into a {}-byte buffer",
                bytes.len(),
                slot.bytes
            )));
        }
        // SAFETY: `bytes.len() <= slot.bytes` (checked above) and the slot lies inside the
        // arena; the copy is synchronous, so `bytes` outlives it.
        unsafe { result::memcpy_htod_sync(self.arena + slot.offset as u64, &bytes) }
            .map_err(driver_err("upload"))
    }

    fn upload_bytes(
        &mut self,
        v: Value,
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        self.bind()?;
        let (dt, want, slot) = self.slot(v)?;
        let bytes = match self.storage_of(v) {
            Storage::Full => std::borrow::Cow::Borrowed(bytes),
            half => std::borrow::Cow::Owned(crate::backend::narrow_to_half(bytes, half)),
        };
        if dt != dtype || want.as_slice() != shape || bytes.len() > slot.bytes {
            return Err(RuntimeError(format!(
                "upload to {v}: expected {dt}{want:?} ({} bytes), got {dtype}{shape:?} ({} bytes)",
                slot.bytes,
                bytes.len()
            )));
        }
        // SAFETY: `bytes.len() <= slot.bytes` (checked above) and the slot lies inside the
        // arena; the copy is synchronous, so `bytes` outlives it.
        unsafe { result::memcpy_htod_sync(self.arena + slot.offset as u64, &bytes) }
            .map_err(driver_err("upload"))
    }

    fn upload_device(&mut self, v: Value, ptr: u64, len: usize) -> Result<(), RuntimeError> {
        self.bind()?;
        let (_, _, slot) = self.slot(v)?;
        if self.storage_of(v).is_half() {
            return Err(RuntimeError(format!(
                "upload to {v}: the buffer holds 16-bit values; device memory is copied without conversion"
            )));
        }
        if len > slot.bytes {
            return Err(RuntimeError(format!(
                "upload to {v}: {len} bytes of device memory into a {}-byte buffer",
                slot.bytes
            )));
        }
        // SAFETY: the destination range lies inside the arena (`len <= slot.bytes`); the
        // caller guarantees `ptr..ptr + len` is live device memory of this process (a DLPack
        // tensor it holds for the call). The copy is synchronous on the legacy default
        // stream, which orders it after the producer's work on blocking streams.
        unsafe { result::memcpy_dtod_sync(self.arena + slot.offset as u64, ptr, len) }
            .map_err(driver_err("device-to-device upload"))
    }

    fn download(&mut self, v: Value) -> Result<HostTensor, RuntimeError> {
        self.bind()?;
        let (dt, shape, slot) = self.slot(v)?;
        let storage = self.storage_of(v);
        let n: usize = shape.iter().product::<usize>() * storage.elem_bytes(dt);
        let mut bytes = vec![0u8; n.min(slot.bytes)];
        // SAFETY: `bytes` has at most `slot.bytes` bytes, read from inside the arena; the copy
        // is synchronous.
        unsafe { result::memcpy_dtoh_sync(&mut bytes, self.arena + slot.offset as u64) }
            .map_err(driver_err("download"))?;
        if storage.is_half() && dt != DType::I32 {
            bytes = crate::backend::widen_half_bytes(&bytes, storage);
        }
        Ok(HostTensor::from_bytes(dt, &shape, &bytes))
    }

    fn download_into(&mut self, v: Value, out: &mut HostTensor) -> Result<(), RuntimeError> {
        let storage = self.storage_of(v);
        if storage.is_half() || cfg!(target_endian = "big") {
            *out = self.download(v)?;
            return Ok(());
        }
        self.bind()?;
        let (dt, shape, slot) = self.slot(v)?;
        let bytes = out.reshape_for_overwrite(dt, &shape);
        if bytes.len() > slot.bytes {
            return Err(RuntimeError(format!(
                "download of {v}: {} bytes from a {}-byte buffer",
                bytes.len(),
                slot.bytes
            )));
        }
        // SAFETY: `bytes.len() <= slot.bytes` (checked above), read from inside the arena; the
        // copy is synchronous.
        unsafe { result::memcpy_dtoh_sync(bytes, self.arena + slot.offset as u64) }
            .map_err(driver_err("download"))
    }

    fn step(&mut self) -> Result<(), RuntimeError> {
        self.launch()?;
        self.finish()
    }

    fn launch(&mut self) -> Result<(), RuntimeError> {
        self.bind()?;
        if self.target.kernels.launch == LaunchMode::Graph && !self.actions.is_empty() {
            if self.graph.is_none() {
                self.graph = Some(build_graph(self.ctx, self.arena, &self.actions)?);
            }
            let exec = self.graph.as_ref().map(|g| g.exec).expect("built above");
            // SAFETY: `exec` was instantiated from this back end's launch list in its context,
            // which is current; its kernels read and write only the arena, as a launch of the
            // list would.
            return unsafe { sys::cuGraphLaunch(exec, std::ptr::null_mut()) }
                .result()
                .map_err(|e| RuntimeError(format!("launch of the step's CUDA graph failed: {e}")));
        }
        for a in &self.actions {
            run_action(self.arena, a)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), RuntimeError> {
        self.bind()?;
        result::ctx::synchronize()
            .map_err(|e| RuntimeError(format!("a CUDA kernel failed during the step: {e}")))?;
        self.sample_memory();
        Ok(())
    }

    /// Check mode: after each launch, waits for the device and copies the buffers the
    /// launch completed to the host to scan them. Slow, and only run when asked for.
    fn step_checked(&mut self) -> Result<Option<NonFinite>, RuntimeError> {
        self.bind()?;
        if self.scan_after.len() != self.actions.len() {
            return Err(RuntimeError(format!(
                "internal error: check mode has a scan list for {} of {} actions",
                self.scan_after.len(),
                self.actions.len()
            )));
        }
        self.checked_steps += 1;
        let mut host = Vec::new();
        for (a, after) in self.actions.iter().zip(&self.scan_after) {
            run_action(self.arena, a)?;
            if after.is_empty() {
                continue;
            }
            result::ctx::synchronize()
                .map_err(|e| RuntimeError(format!("{} failed during a checked step: {e}", a.label())))?;
            for buf in after {
                host.resize(buf.bytes, 0u8);
                // SAFETY: the buffer is a slot of the plan, inside the arena; the copy is
                // synchronous and `host` holds exactly `buf.bytes` bytes.
                unsafe { result::memcpy_dtoh_sync(&mut host, self.arena + buf.offset as u64) }
                    .map_err(driver_err("check-mode download"))?;
                if let Some(found) = numerics::scan(buf, &host) {
                    return Ok(Some(found));
                }
            }
        }
        result::ctx::synchronize()
            .map_err(|e| RuntimeError(format!("a CUDA kernel failed during the step: {e}")))?;
        self.sample_memory();
        Ok(None)
    }

    fn checked_steps(&self) -> u64 {
        self.checked_steps
    }

    fn host_memory(&self) -> Vec<(String, usize)> {
        let staged: usize = self.staging.iter().map(|s| s.2).sum();
        vec![
            ("page-locked input staging".to_string(), staged),
            ("CUDA module source".to_string(), self.generated.source.len()),
        ]
    }

    fn overlaps(&self) -> bool {
        true
    }

    fn stage(&mut self, v: Value, t: &HostTensor) -> Result<bool, RuntimeError> {
        self.bind()?;
        let (dt, shape, slot) = self.slot(v)?;
        let bytes = t.as_bytes();
        if dt != t.dtype || shape.iter().product::<usize>() != t.numel() || bytes.len() > slot.bytes {
            return Err(RuntimeError(format!(
                "staging for {v}: expected {dt}{shape:?}, got {}{:?}",
                t.dtype, t.shape
            )));
        }
        let i = match self.staging.iter().position(|s| s.0 == v) {
            Some(i) => i,
            None => {
                // One page-locked buffer per input, the size of its arena slot, kept for the
                // back end's life: a transfer from it runs at full bus speed, while one from
                // pageable memory goes through the driver's bounce buffers.
                // SAFETY: a plain page-locked allocation (flags 0) in the current context,
                // freed once, by `Drop`.
                let ptr = unsafe { result::malloc_host(slot.bytes.max(1), 0) }
                    .map_err(driver_err("page-locked staging allocation"))?;
                self.staging.push((v, ptr as *mut u8, slot.bytes, 0));
                self.staging.len() - 1
            }
        };
        let (_, ptr, cap, len) = &mut self.staging[i];
        debug_assert!(bytes.len() <= *cap);
        // SAFETY: `ptr` points to `cap` bytes of page-locked memory owned by this back end
        // and no transfer from it is in flight (uploads from it are synchronous); nothing else
        // refers to it while `dst` lives.
        let dst = unsafe { std::slice::from_raw_parts_mut(*ptr, bytes.len()) };
        crate::par::copy(dst, &bytes);
        *len = bytes.len();
        Ok(true)
    }

    fn upload_staged(&mut self, v: Value) -> Result<(), RuntimeError> {
        self.bind()?;
        let (_, _, slot) = self.slot(v)?;
        let &(_, ptr, _, len) = self
            .staging
            .iter()
            .find(|s| s.0 == v)
            .ok_or_else(|| RuntimeError(format!("upload of {v}: nothing was staged for it")))?;
        // SAFETY: `len` bytes at `ptr` were written by `stage` and stay valid until drop.
        let src = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
        // SAFETY: `len <= slot.bytes` (checked by `stage`) and the slot lies inside the
        // arena; the copy is synchronous.
        unsafe { result::memcpy_htod_sync(self.arena + slot.offset as u64, src) }
            .map_err(driver_err("upload"))
    }

    fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    fn measured_peak_bytes(&self) -> Option<usize> {
        self.sample_memory();
        Some(self.peak.get())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // SAFETY: every handle below was created by this back end and is released once,
        // here: the arena only when it was made (non-zero), the modules that were loaded, after
        // the context finished all work that uses them; the primary context last.
        unsafe {
            if result::ctx::set_current(self.ctx).is_ok() {
                let _ = result::ctx::synchronize();
                if let Some(g) = self.graph.take() {
                    let _ = sys::cuGraphExecDestroy(g.exec);
                    let _ = sys::cuGraphDestroy(g.graph);
                }
                if self.arena != 0 {
                    let _ = result::free_sync(self.arena);
                }
                for &module in &self.modules {
                    let _ = result::module::unload(module);
                }
                for &(_, ptr, _, _) in &self.staging {
                    let _ = result::free_host(ptr as *mut c_void);
                }
            }
            let _ = result::primary_ctx::release(self.device);
        }
    }
}
