//! The embedding API: compile a `.cvnn` model, pick a device, load and save weights, run
//! training steps and inference, and read the memory plan, from a Rust program.
//!
//! ```no_run
//! use cvc_runtime::session::{Device, Model};
//! use cvc_runtime::data::Dataset;
//!
//! let model = Model::from_file("examples/rf_modulation.cvnn")?;
//! let mut session = model.session(Device::Cpu)?;
//! let data = Dataset::synthetic_random(64, 1, model.inputs())?;
//! let batch: Vec<usize> = (0..session.batch()).collect();
//! let report = session.train_step(&data.gather(&batch))?;
//! println!("loss {} with an arena of {} bytes", report.loss, session.plan().arena_bytes);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::backend::{Backend, HostData, HostTensor, RuntimeError};
use crate::checkpoint::{self, Checkpoint};
use crate::data::InputSpec;
use crate::interp_backend::{to_interp, InterpBackend};
use crate::metrics::StepPhases;
use crate::numerics::{self, BadOperand, NonFinite, NumericsFinding};
use cvc_compiler::config::Precision;
use cvc_compiler::front::train::{DeviceChoice, TrainConfig};
use cvc_compiler::init::{init_values, name_hash, SplitMix64};
use cvc_compiler::ir::{DType, Graph, Mode, Storage, Value};
use cvc_compiler::passes::memplan::ArenaPlan;
use cvc_compiler::passes::optimizer::LR;
use cvc_compiler::passes::pipeline::{self, Options};
use cvc_compiler::passes::Program;
use cvc_compiler::target::KernelConfig;
use cvc_compiler::Diagnostic;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where a session runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// CUDA when a driver and a device are found, else the CPU (with a note on stderr).
    Auto,
    /// The CPU back end (Cranelift JIT).
    Cpu,
    /// The CUDA back end; an error when no GPU is usable.
    Cuda,
    /// The f64 reference interpreter (slow; for debugging and tests).
    Interp,
}

impl From<DeviceChoice> for Device {
    fn from(d: DeviceChoice) -> Self {
        match d {
            DeviceChoice::Auto => Device::Auto,
            DeviceChoice::Cpu => Device::Cpu,
            DeviceChoice::Cuda => Device::Cuda,
        }
    }
}

/// Why a model could not be built: diagnostics on the source, or another failure.
#[derive(Debug, Clone)]
pub enum ModelError {
    /// The front end rejected the source.
    Diagnostics {
        /// File name shown in the report.
        file: String,
        /// The source text.
        src: String,
        /// The errors.
        diags: Vec<Diagnostic>,
    },
    /// Anything else (unreadable file, compile failure).
    Message(String),
}

impl ModelError {
    /// The error as text, the diagnostics rendered with source excerpts.
    pub fn render(&self, color: bool) -> String {
        match self {
            ModelError::Diagnostics { file, src, diags } => {
                cvc_compiler::front::render_all(file, src, diags, color)
            }
            ModelError::Message(m) => m.clone(),
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(false))
    }
}

impl std::error::Error for ModelError {}

impl From<ModelError> for RuntimeError {
    fn from(e: ModelError) -> Self {
        RuntimeError(e.render(false))
    }
}

/// A checked model: its training and inference graphs and its `train` section.
#[derive(Clone, Debug)]
pub struct Model {
    file: String,
    dir: PathBuf,
    src: String,
    train_graph: Graph,
    eval_graph: Graph,
    config: TrainConfig,
    has_train_section: bool,
    inputs: Vec<InputSpec>,
    eval_inputs: Vec<InputSpec>,
}

impl Model {
    /// Reads and checks a `.cvnn` file (in training and in inference mode).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        let path = path.as_ref();
        let max = cvc_compiler::front::check::MAX_SOURCE_BYTES;
        let bytes = crate::files::read_regular(path, "model file", max, "").map_err(ModelError::Message)?;
        let src = String::from_utf8(bytes).map_err(|e| {
            ModelError::Message(format!(
                "cannot read {}: not UTF-8 text (byte {} is invalid); save it as UTF-8",
                path.display(),
                e.utf8_error().valid_up_to()
            ))
        })?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Model::build(&path.display().to_string(), &src, dir)
    }

    /// Checks `.cvnn` source text; `name` is the file name used in diagnostics.
    ///
    /// ```
    /// let src = "model Tiny {\n  input x: c64[B, 4]\n  input label: class[B] of 2\n  \
    ///            logits = x |> linear(2) |> abs\n  output logits\n  \
    ///            loss cross_entropy(logits, label)\n}\n";
    /// let model = cvc_runtime::session::Model::from_source("tiny.cvnn", src).unwrap();
    /// assert_eq!(model.name(), "Tiny");
    /// assert_eq!(model.inputs().len(), 2);
    /// ```
    pub fn from_source(name: &str, src: &str) -> Result<Model, ModelError> {
        Model::build(name, src, PathBuf::new())
    }

    fn build(file: &str, src: &str, dir: PathBuf) -> Result<Model, ModelError> {
        let check = |mode: Mode| {
            cvc_compiler::front::check_source(file, src, mode).map_err(|diags| ModelError::Diagnostics {
                file: file.to_string(),
                src: src.to_string(),
                diags,
            })
        };
        let train = check(Mode::Train)?;
        let eval = check(Mode::Eval)?;
        let labels = |name: &str| {
            let i = train.inputs.iter().find(|i| i.name == name);
            (i.and_then(|i| i.classes), i.and_then(|i| i.ignore_index))
        };
        let inputs = InputSpec::from_graph(&train.graph, &labels);
        let eval_inputs = InputSpec::from_graph(&eval.graph, &labels);
        Ok(Model {
            file: file.to_string(),
            dir,
            src: src.to_string(),
            config: train.train.clone(),
            has_train_section: train.has_train_section,
            train_graph: train.graph,
            eval_graph: eval.graph,
            inputs,
            eval_inputs,
        })
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.train_graph.name
    }
    /// The file name given when the model was built.
    pub fn file(&self) -> &str {
        &self.file
    }
    /// The folder relative data paths of the `train` section are resolved against.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The source text.
    pub fn source(&self) -> &str {
        &self.src
    }
    /// The `train` section (defaults when the file has none).
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }
    /// Whether the file has a `train` section for this model.
    pub fn has_train_section(&self) -> bool {
        self.has_train_section
    }
    /// The data inputs of a training step (data and labels).
    pub fn inputs(&self) -> &[InputSpec] {
        &self.inputs
    }
    /// The data inputs of inference.
    pub fn eval_inputs(&self) -> &[InputSpec] {
        &self.eval_inputs
    }
    /// The lowered training graph (before the passes).
    pub fn train_graph(&self) -> &Graph {
        &self.train_graph
    }
    /// The lowered inference graph (before the passes).
    pub fn eval_graph(&self) -> &Graph {
        &self.eval_graph
    }
    /// 1-based source line of a byte offset.
    pub fn line_of(&self, span: cvc_grammar::Span) -> usize {
        span.line_col(&self.src).0
    }

    /// Compiles the training (`Mode::Train`) or inference graph at a batch size. With a
    /// memory budget, a plan whose arena does not fit is an error (the same rule as `cvc
    /// plan`), returned before any back end allocates the arena.
    pub fn compile(
        &self,
        mode: Mode,
        batch: usize,
        memory_budget: Option<u64>,
    ) -> Result<Program, RuntimeError> {
        self.compile_stored(mode, batch, memory_budget, Storage::Full)
    }

    /// Compiles like [`Model::compile`] with activations stored as `half` (the CUDA back end's
    /// `precision = bf16 | fp16`; see [`cvc_compiler::ir::storage`]).
    pub fn compile_stored(
        &self,
        mode: Mode,
        batch: usize,
        memory_budget: Option<u64>,
        half: Storage,
    ) -> Result<Program, RuntimeError> {
        let graph = match mode {
            Mode::Train => self.train_graph.clone(),
            Mode::Eval => self.eval_graph.clone(),
        };
        let opts = Options {
            batch,
            optimizer: self.config.optimizer.clone(),
            memory_budget,
            half,
            cheap_remat: self.config.cheap_remat,
            ..Options::default()
        };
        let program = pipeline::compile(graph, &opts).map_err(|e| {
            RuntimeError(match &e {
                cvc_compiler::CompileError::User { span: Some(_), .. } => {
                    e.render(&self.file, &self.src, false)
                }
                _ if e.is_internal() => format!(
                    "{}: compiling {}: {e} (this is a bug in cvc, not in the model: please report it)",
                    self.file,
                    self.name()
                ),
                _ => format!("{}: compiling {}: {e}", self.file, self.name()),
            })
        })?;
        match crate::cli::plan::budget_error(program.plan.arena_bytes as u64, memory_budget) {
            Some(m) => Err(RuntimeError(format!("{}: {m}", self.file))),
            None => Ok(program),
        }
    }

    /// A session on `device` with the `train` section's batch, seed and memory budget.
    /// With [`Device::Auto`] and no usable GPU, prints a one-line note to stderr.
    pub fn session(&self, device: impl Into<Device>) -> Result<Session, RuntimeError> {
        let opts = SessionOptions { device: device.into(), ..SessionOptions::from_config(&self.config) };
        let s = self.session_with(&opts)?;
        if let Some(n) = s.note() {
            crate::cli::write_err(&format!("note: {n}\n"));
        }
        Ok(s)
    }

    /// A session with explicit options.
    pub fn session_with(&self, opts: &SessionOptions) -> Result<Session, RuntimeError> {
        Session::new(self, opts)
    }
}

/// How to build a [`Session`].
#[derive(Clone, Debug, PartialEq)]
pub struct SessionOptions {
    /// Device request.
    pub device: Device,
    /// Batch size of training steps.
    pub batch: usize,
    /// Seed of the parameter initialisation.
    pub seed: u64,
    /// Memory budget for the training plan, in bytes.
    pub memory_budget: Option<u64>,
    /// Contraction numerics on the GPU.
    pub precision: Precision,
}

impl SessionOptions {
    /// The options a `train` section gives.
    pub fn from_config(c: &TrainConfig) -> Self {
        SessionOptions {
            device: c.device.into(),
            batch: c.batch,
            seed: c.seed,
            memory_budget: c.memory_budget,
            precision: c.precision,
        }
    }
}

/// One batch of named input tensors (what `Dataset::gather` returns).
pub type Batch = Vec<(String, HostTensor)>;

/// A batch for [`Session::train_step_overlapped`]: either fresh ([`StagedBatch::new`]) or one
/// the session has already copied into the back end's staging memory (returned by the previous
/// call). It owns its tensors and gives them out read-only, so a staged copy cannot go stale.
#[derive(Debug)]
pub struct StagedBatch {
    batch: Batch,
    /// The session's staging generation this batch was staged in; 0: not staged.
    token: u64,
}

impl StagedBatch {
    /// A batch that has not been staged (it is uploaded directly).
    pub fn new(batch: Batch) -> Self {
        StagedBatch { batch, token: 0 }
    }
    /// The tensors.
    pub fn batch(&self) -> &[(String, HostTensor)] {
        &self.batch
    }
    /// The tensors, by value.
    pub fn into_batch(self) -> Batch {
        self.batch
    }
}

/// What a training step returned.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// The loss of the batch (before the update).
    pub loss: f32,
    /// The model's outputs, by name.
    pub outputs: Vec<(String, HostTensor)>,
    /// Where the step's wall time went on the host.
    pub phases: StepPhases,
}

/// What an evaluation returned.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalReport {
    /// The loss, when the inference graph has one and every input it reads was given.
    pub loss: Option<f32>,
    /// The model's outputs, by name.
    pub outputs: Vec<(String, HostTensor)>,
}

/// Why a checked step failed: a non-finite value located in the source, or another error.
#[derive(Clone, Debug, PartialEq)]
pub enum StepFailure {
    /// Check mode found a NaN or an infinity.
    NonFinite(Box<NumericsFinding>),
    /// Any other failure.
    Error(RuntimeError),
}

impl StepFailure {
    /// The failure as text; `samples[b]` is the dataset sample of batch sample `b`.
    pub fn render(&self, samples: Option<&[usize]>) -> String {
        match self {
            StepFailure::NonFinite(f) => f.render(samples),
            StepFailure::Error(e) => e.0.clone(),
        }
    }
}

impl From<RuntimeError> for StepFailure {
    fn from(e: RuntimeError) -> Self {
        StepFailure::Error(e)
    }
}

impl From<StepFailure> for RuntimeError {
    fn from(f: StepFailure) -> Self {
        RuntimeError(f.render(None))
    }
}

/// A compiled program with the back end that runs it.
struct Exec {
    program: Program,
    backend: Box<dyn Backend>,
    /// The train-state version last copied in (inference programs only).
    synced: u64,
}

/// The device chosen for `request`, and a note when `Auto` fell back to the CPU.
pub fn resolve_device(request: Device) -> Result<(Device, Option<String>), RuntimeError> {
    match request {
        Device::Auto => match crate::cuda::available() {
            Ok(_) => Ok((Device::Cuda, None)),
            Err(why) => Ok((Device::Cpu, Some(format!("no usable CUDA GPU ({why}); training on the CPU")))),
        },
        Device::Cuda => match crate::cuda::available() {
            Ok(_) => Ok((Device::Cuda, None)),
            Err(why) => Err(RuntimeError(format!("--device cuda: no usable CUDA GPU: {why}"))),
        },
        other => Ok((other, None)),
    }
}

/// How activations are stored for `precision` on `device`: the precision's 16-bit format on
/// CUDA; full width elsewhere, with the note saying so (the CPU back end computes in f32).
pub fn storage_on(device: Device, precision: Precision) -> (Storage, Option<String>) {
    let half = precision.storage();
    match device {
        Device::Cuda => (half, None),
        _ if half.is_half() => (
            Storage::Full,
            Some(format!(
                "precision {} applies on CUDA GPUs; the {} computes and stores in f32",
                precision.name(),
                if device == Device::Interp { "reference interpreter" } else { "CPU back end" }
            )),
        ),
        _ => (Storage::Full, None),
    }
}

fn backend_for(
    device: Device,
    program: &Program,
    precision: Precision,
) -> Result<Box<dyn Backend>, RuntimeError> {
    Ok(match device {
        Device::Cpu | Device::Auto => Box::new(crate::cpu::CpuBackend::new(program)?),
        Device::Cuda => {
            Box::new(crate::cuda::CudaBackend::new(program, precision, &KernelConfig::default())?)
        }
        Device::Interp => Box::new(InterpBackend::new(program)),
    })
}

/// A model's parameters and state on one device, with its training and inference programs.
///
/// ```
/// use cvc_runtime::data::Dataset;
/// use cvc_runtime::session::{Device, Model};
///
/// let src = "model Tiny {\n  input x: c64[B, 4]\n  input label: class[B] of 2\n  \
///            logits = x |> linear(2) |> abs\n  output logits\n  \
///            loss cross_entropy(logits, label)\n}\n\
///            train Tiny {\n  batch = 8\n  optimizer = adam(lr = 0.05)\n}\n";
/// let model = Model::from_source("tiny.cvnn", src).unwrap();
/// let mut session = model.session(Device::Cpu).unwrap();
/// let data = Dataset::synthetic_random(8, 0, model.inputs()).unwrap();
/// let batch = data.gather(&(0..8).collect::<Vec<_>>());
/// let first = session.train_step(&batch).unwrap().loss;
/// for _ in 0..30 {
///     session.train_step(&batch).unwrap();
/// }
/// assert!(session.train_step(&batch).unwrap().loss < first); // it fits the batch
/// let outputs = session.infer(&batch).unwrap();
/// assert_eq!((outputs[0].0.as_str(), outputs[0].1.shape.clone()), ("logits", vec![8, 2]));
/// assert!(session.plan().arena_bytes > 0);
/// ```
pub struct Session {
    model: Model,
    device: Device,
    note: Option<String>,
    precision: Precision,
    train: Exec,
    evals: Vec<Exec>,
    /// `i32` scalar state that no `Assign` writes (the dropout step): the runtime counts it.
    counters: Vec<(Value, String, i32)>,
    /// Generation of the batch in the back end's staging memory (0: none); the last one
    /// handed out, for `train_step_overlapped`.
    staged: u64,
    /// Generations handed out so far.
    stagings: u64,
    version: u64,
    lr: f32,
    memory_budget: Option<u64>,
    /// The outputs of an earlier step, handed back for the next download to reuse.
    recycled: Vec<(String, HostTensor)>,
}

impl Session {
    fn new(model: &Model, opts: &SessionOptions) -> Result<Session, RuntimeError> {
        let (device, note) = resolve_device(opts.device)?;
        let (half, half_note) = storage_on(device, opts.precision);
        let note = match (note, half_note) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        // A model without a loss has no training step: its parameters live in an inference
        // program, so weights can still be loaded and `infer` run.
        let mode = if model.train_graph.loss.is_some() { Mode::Train } else { Mode::Eval };
        let program = model.compile_stored(mode, opts.batch, opts.memory_budget, half)?;
        let backend = backend_for(device, &program, opts.precision)?;
        let mut train = Exec { program, backend, synced: 0 };
        let counters = unassigned_counters(&train.program.graph);
        initialise(&mut train, opts.seed)?;
        let lr = model.config.optimizer.lr as f32;
        Ok(Session {
            model: model.clone(),
            device,
            note,
            precision: opts.precision,
            train,
            evals: Vec::new(),
            counters,
            staged: 0,
            stagings: 0,
            version: 1,
            lr,
            memory_budget: opts.memory_budget,
            recycled: Vec::new(),
        })
    }

    /// The model this session runs.
    pub fn model(&self) -> &Model {
        &self.model
    }
    /// The device actually used (never `Auto`).
    pub fn device(&self) -> Device {
        self.device
    }
    /// Whether the training back end runs a step while the host goes on (a GPU), so the
    /// host can prepare the next batch meanwhile ([`Session::train_step`] still waits).
    pub fn overlaps(&self) -> bool {
        self.train.backend.overlaps()
    }

    /// The back end's name (`cpu`, `cuda:<gpu>`, `interp`).
    pub fn device_name(&self) -> String {
        self.train.backend.name()
    }
    /// Why `Auto` chose the CPU, if it did.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }
    /// The batch size of training steps.
    pub fn batch(&self) -> usize {
        self.train.program.plan.batch
    }
    /// The training program's static memory plan.
    pub fn plan(&self) -> &ArenaPlan {
        &self.train.program.plan
    }
    /// The compiled training program.
    pub fn program(&self) -> &Program {
        &self.train.program
    }
    /// Measured peak memory of the training back end, when known.
    pub fn measured_peak_bytes(&self) -> Option<usize> {
        self.train.backend.measured_peak_bytes()
    }
    /// The current learning rate.
    pub fn lr(&self) -> f32 {
        self.lr
    }

    /// Sets the learning rate used by the following steps (the `optimizer.lr` state scalar).
    pub fn set_lr(&mut self, lr: f32) -> Result<(), RuntimeError> {
        if let Some(v) = self.train.program.graph.find_leaf(LR) {
            let t = HostTensor { dtype: DType::F32, shape: vec![], data: HostData::F32(vec![lr]) };
            self.train.backend.upload(v, &t)?;
        }
        self.lr = lr;
        Ok(())
    }

    /// One training step on a batch: forward, loss, backward and the optimizer update.
    /// `inputs` holds one tensor per model input (`[batch, ...]`), by name.
    pub fn train_step(&mut self, inputs: &[(String, HostTensor)]) -> Result<StepReport, RuntimeError> {
        let phases = self.begin_step(inputs, false)?;
        self.end_step(phases)
    }

    /// [`Session::train_step`] in check mode (`crate::numerics`): every launch is followed by
    /// a scan of what it wrote, and the first NaN or infinity stops the step with a
    /// [`StepFailure::NonFinite`] naming the op, its `.cvnn` line and the batch sample. The
    /// step's state is then partly updated: treat the session as broken.
    pub fn train_step_checked(&mut self, inputs: &[(String, HostTensor)]) -> Result<StepReport, StepFailure> {
        self.staged = 0;
        upload_inputs(&mut self.train, inputs, true)?;
        for (v, _, c) in &self.counters {
            let t = HostTensor { dtype: DType::I32, shape: vec![], data: HostData::I32(vec![*c]) };
            self.train.backend.upload(*v, &t)?;
        }
        if let Some(nf) = self.train.backend.step_checked()? {
            return Err(StepFailure::NonFinite(Box::new(locate(&mut self.train, &self.model, nf))));
        }
        Ok(self.end_step(StepPhases::default())?)
    }

    /// Steps run in check mode so far, over the training and inference programs.
    pub fn checked_steps(&self) -> u64 {
        self.train.backend.checked_steps() + self.evals.iter().map(|e| e.backend.checked_steps()).sum::<u64>()
    }

    /// The first parameter or state tensor holding a NaN or an infinity, as an error naming
    /// it (`what` says where the weights come from); `None` when all are finite.
    pub fn non_finite_state(&mut self, what: &str) -> Result<Option<RuntimeError>, RuntimeError> {
        Ok(numerics::non_finite_tensor(&self.state_tensors()?, what))
    }

    /// Host memory the back ends hold outside their arenas (label, bytes), and the arenas of
    /// the inference programs compiled so far.
    pub fn host_memory(&self) -> Vec<(String, usize)> {
        let mut items = self.train.backend.host_memory();
        for e in &self.evals {
            items.push((
                format!("inference arena (batch {})", e.program.plan.batch),
                e.program.plan.arena_bytes,
            ));
            items.extend(e.backend.host_memory().into_iter().map(|(l, b)| (format!("{l} (inference)"), b)));
        }
        items
    }

    /// A training step during which the host prepares the next batch: uploads `inputs` (from
    /// the back end's staging memory when the previous call staged them), starts the step,
    /// calls `next` while the device computes, copies what it returns into staging memory
    /// (page-locked on a GPU), then waits for the step. Returns the step's report and the next
    /// batch, to pass as `inputs` of the next call. Start with [`StagedBatch::new`]. On a back
    /// end that computes on the calling thread this is `train_step` followed by `next()`.
    pub fn train_step_overlapped(
        &mut self,
        inputs: &StagedBatch,
        next: impl FnOnce() -> Option<Batch>,
    ) -> Result<(StepReport, Option<StagedBatch>), RuntimeError> {
        let staged = inputs.token != 0 && inputs.token == self.staged;
        self.staged = 0;
        let mut phases = self.begin_step(&inputs.batch, staged)?;
        let t = Instant::now();
        let next = next().map(StagedBatch::new);
        let next = match next {
            Some(mut b) => {
                if self.train.backend.overlaps() && stage_inputs(&mut self.train, &b.batch)? {
                    self.stagings += 1;
                    self.staged = self.stagings;
                    b.token = self.stagings;
                }
                Some(b)
            }
            None => None,
        };
        phases.overlapped = ms_since(t);
        let report = self.end_step(phases)?;
        Ok((report, next))
    }

    /// Uploads a step's inputs (from staging memory when `staged`) and counters and starts it;
    /// returns the time of the two.
    fn begin_step(
        &mut self,
        inputs: &[(String, HostTensor)],
        staged: bool,
    ) -> Result<StepPhases, RuntimeError> {
        let t = Instant::now();
        if staged {
            upload_staged_inputs(&mut self.train, inputs)?;
        } else {
            self.staged = 0;
            upload_inputs(&mut self.train, inputs, true)?;
        }
        for (v, _, c) in &self.counters {
            let t = HostTensor { dtype: DType::I32, shape: vec![], data: HostData::I32(vec![*c]) };
            self.train.backend.upload(*v, &t)?;
        }
        let upload = ms_since(t);
        let t = Instant::now();
        self.train.backend.launch()?;
        Ok(StepPhases { upload, launch: ms_since(t), ..StepPhases::default() })
    }

    /// Hands a step's outputs back: the next step downloads into their buffers instead of
    /// allocating new ones (a per-pixel output can be hundreds of MB a step).
    pub fn recycle_outputs(&mut self, outputs: Vec<(String, HostTensor)>) {
        self.recycled = outputs;
    }

    /// Waits for the step `begin_step` started and reads its loss and outputs; `phases` has
    /// the times of what came before.
    fn end_step(&mut self, mut phases: StepPhases) -> Result<StepReport, RuntimeError> {
        let t = Instant::now();
        self.train.backend.finish()?;
        phases.wait = ms_since(t);
        let t = Instant::now();
        for c in &mut self.counters {
            c.2 = c.2.wrapping_add(1);
        }
        self.version += 1;
        let g = &self.train.program.graph;
        let loss_v =
            g.loss.ok_or_else(|| RuntimeError(format!("model {} declares no loss to train", g.name)))?;
        let loss = scalar(&self.train.backend.download(loss_v)?)?;
        let outputs = download_outputs(&mut self.train, std::mem::take(&mut self.recycled))?;
        phases.download = ms_since(t);
        Ok(StepReport { loss, outputs, phases })
    }

    /// Runs the inference program on a batch of any size (compiled once per size). Inputs the
    /// inference graph reads but `inputs` lacks (labels, for pure inference) are zeros, and
    /// the loss is then not reported.
    pub fn evaluate(&mut self, inputs: &[(String, HostTensor)]) -> Result<EvalReport, RuntimeError> {
        let n = inputs.first().and_then(|(_, t)| t.shape.first().copied());
        self.evaluate_with(n, |exec| upload_inputs(exec, inputs, false))
    }

    /// The inference step of [`Session::evaluate`] at batch `n` (the first input's leading
    /// extent), with `upload` binding the inputs (it says whether every input was given).
    fn evaluate_with(
        &mut self,
        n: Option<usize>,
        upload: impl FnOnce(&mut Exec) -> Result<bool, RuntimeError>,
    ) -> Result<EvalReport, RuntimeError> {
        let n = n.ok_or_else(|| RuntimeError("evaluate: no input tensors given".into()))?;
        let idx = self.eval_exec(n)?;
        self.sync_eval(idx)?;
        let exec = &mut self.evals[idx];
        let complete = upload(exec)?;
        exec.backend.step()?;
        let loss = match (exec.program.graph.loss, complete) {
            (Some(l), true) => Some(scalar(&exec.backend.download(l)?)?),
            _ => None,
        };
        let outputs = download_outputs(exec, Vec::new())?;
        Ok(EvalReport { loss, outputs })
    }

    /// [`Session::evaluate`] in check mode: the first NaN or infinity a launch writes stops
    /// it with a [`StepFailure::NonFinite`] naming its source.
    pub fn evaluate_checked(&mut self, inputs: &[(String, HostTensor)]) -> Result<EvalReport, StepFailure> {
        let n = inputs
            .first()
            .and_then(|(_, t)| t.shape.first().copied())
            .ok_or_else(|| RuntimeError("evaluate: no input tensors given".into()))?;
        let idx = self.eval_exec(n)?;
        self.sync_eval(idx)?;
        let exec = &mut self.evals[idx];
        let complete = upload_inputs(exec, inputs, false)?;
        if let Some(nf) = exec.backend.step_checked()? {
            return Err(StepFailure::NonFinite(Box::new(locate(exec, &self.model, nf))));
        }
        let loss = match (exec.program.graph.loss, complete) {
            (Some(l), true) => Some(scalar(&exec.backend.download(l)?)?),
            _ => None,
        };
        let outputs = download_outputs(exec, Vec::new())?;
        Ok(EvalReport { loss, outputs })
    }

    /// The model's outputs for a batch (inference mode: running statistics, no dropout).
    pub fn infer(
        &mut self,
        inputs: &[(String, HostTensor)],
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        Ok(self.evaluate(inputs)?.outputs)
    }

    /// The gradient of every parameter from the last training step, by parameter name.
    /// An error when the program did not keep a gradient in memory.
    pub fn gradients(&mut self) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        let g = &self.train.program.graph;
        let mut out = Vec::new();
        for &(p, dp) in &self.train.program.facts.grads {
            let name = g.leaf_name(p).unwrap_or("?").to_string();
            if matches!(self.device, Device::Cpu | Device::Cuda) && self.train.program.plan.slot(dp).is_none()
            {
                return Err(RuntimeError(format!(
                    "the gradient of {name} is not kept in memory by the compiled program"
                )));
            }
            out.push((name, self.train.backend.download(dp)?));
        }
        Ok(out)
    }

    /// Dynamic loss scaling's state (`precision = fp16` on the GPU): the current loss scale and
    /// the steps skipped so far for a non-finite gradient; `None` without loss scaling.
    pub fn loss_scaling(&mut self) -> Result<Option<(f64, u64)>, RuntimeError> {
        use cvc_compiler::passes::optimizer::{LOSS_SCALE, SKIPPED};
        let g = &self.train.program.graph;
        let (Some(scale), Some(skipped)) = (g.find_leaf(LOSS_SCALE), g.find_leaf(SKIPPED)) else {
            return Ok(None);
        };
        let read = |be: &mut Box<dyn Backend>, v: Value| -> Result<f64, RuntimeError> {
            Ok(be.download(v)?.f32s().first().copied().unwrap_or(f32::NAN) as f64)
        };
        let s = read(&mut self.train.backend, scale)?;
        let k = read(&mut self.train.backend, skipped)?;
        Ok(Some((s, k as u64)))
    }

    /// Every parameter and state buffer, by leaf name, in arena order.
    pub fn state_tensors(&mut self) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        let g = &self.train.program.graph;
        let leaves: Vec<(Value, String)> =
            g.persistent().map(|v| (v, g.leaf_name(v).unwrap_or_default().to_string())).collect();
        let mut out = Vec::new();
        for (v, name) in leaves {
            let t = match self.counters.iter().find(|c| c.0 == v) {
                Some((_, _, c)) => {
                    HostTensor { dtype: DType::I32, shape: vec![], data: HostData::I32(vec![*c]) }
                }
                None => self.train.backend.download(v)?,
            };
            out.push((name, t));
        }
        Ok(out)
    }

    /// Writes parameters and state to a safetensors file (atomically), with metadata.
    pub fn save_checkpoint(
        &mut self,
        path: &Path,
        metadata: &BTreeMap<String, String>,
    ) -> Result<(), RuntimeError> {
        let tensors = self.state_tensors()?;
        let mut meta = metadata.clone();
        meta.insert("model".into(), self.model.name().to_string());
        checkpoint::save(path, &tensors, &meta).map_err(RuntimeError)
    }

    /// Writes parameters and state to a safetensors file (atomically).
    pub fn save_weights(&mut self, path: impl AsRef<Path>) -> Result<(), RuntimeError> {
        self.save_checkpoint(path.as_ref(), &BTreeMap::new())
    }

    /// Loads parameters (all required) and state (optional: missing buffers keep their
    /// values) from a safetensors file; returns the checkpoint's metadata.
    pub fn load_weights(&mut self, path: impl AsRef<Path>) -> Result<BTreeMap<String, String>, RuntimeError> {
        let path = path.as_ref();
        let ck = checkpoint::load(path).map_err(RuntimeError)?;
        self.load_checkpoint(&ck, path)?;
        Ok(ck.metadata)
    }

    /// Loads from an already-read checkpoint (`file` names it in errors).
    pub fn load_checkpoint(&mut self, ck: &Checkpoint, file: &Path) -> Result<(), RuntimeError> {
        let g = &self.train.program.graph;
        let batch = self.train.program.plan.batch;
        let leaves: Vec<(Value, String, bool, DType, Vec<usize>)> = g
            .persistent()
            .map(|v| {
                let ty = g.ty(v);
                let name = g.leaf_name(v).unwrap_or_default().to_string();
                (v, name, g.is_param(v), ty.dtype, ty.shape.resolve(batch))
            })
            .collect();
        let missing: Vec<&str> =
            leaves.iter().filter(|l| l.2 && !ck.tensors.contains_key(&l.1)).map(|l| l.1.as_str()).collect();
        if !missing.is_empty() {
            return Err(RuntimeError(format!(
                "{}: missing parameter{} {} (the file has: {})",
                file.display(),
                if missing.len() > 1 { "s" } else { "" },
                missing.join(", "),
                ck.tensors.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        let mut converted = Vec::new();
        for (v, name, _, dtype, shape) in &leaves {
            if let Some(t) = ck.tensors.get(name) {
                converted
                    .push((*v, checkpoint::conform(t, *dtype, shape, name, file).map_err(RuntimeError)?));
            }
        }
        for (v, t) in converted {
            if let Some(c) = self.counters.iter_mut().find(|c| c.0 == v) {
                if let HostData::I32(x) = &t.data {
                    c.2 = x[0];
                }
            }
            if self.train.program.graph.leaf_name(v) == Some(LR) {
                if let HostData::F32(x) = &t.data {
                    self.lr = x[0];
                }
            }
            self.train.backend.upload(v, &t)?;
        }
        self.version += 1;
        Ok(())
    }

    fn eval_exec(&mut self, batch: usize) -> Result<usize, RuntimeError> {
        if let Some(i) = self.evals.iter().position(|e| e.program.plan.batch == batch) {
            return Ok(i);
        }
        let (half, _) = storage_on(self.device, self.precision);
        let program = self.model.compile_stored(Mode::Eval, batch, self.memory_budget, half)?;
        let backend = backend_for(self.device, &program, self.precision)?;
        self.evals.push(Exec { program, backend, synced: 0 });
        Ok(self.evals.len() - 1)
    }

    /// Copies parameters and state (by leaf name) from the training program to inference
    /// program `idx` when they changed since the last copy.
    fn sync_eval(&mut self, idx: usize) -> Result<(), RuntimeError> {
        if self.evals[idx].synced == self.version {
            return Ok(());
        }
        let eg = &self.evals[idx].program.graph;
        let names: Vec<(Value, String)> =
            eg.persistent().map(|v| (v, eg.leaf_name(v).unwrap_or_default().to_string())).collect();
        for (ev, name) in names {
            let Some(tv) = self.train.program.graph.find_leaf(&name) else { continue };
            let t = match self.counters.iter().find(|c| c.0 == tv) {
                Some((_, _, c)) => {
                    HostTensor { dtype: DType::I32, shape: vec![], data: HostData::I32(vec![*c]) }
                }
                None => self.train.backend.download(tv)?,
            };
            self.evals[idx].backend.upload(ev, &t)?;
        }
        self.evals[idx].synced = self.version;
        Ok(())
    }
}

/// Turns a back end's first non-finite element into a finding in the source: replays the
/// group in f64 on the operands the back end read, so the op named is the first node of the
/// group whose value is non-finite (a fused kernel only writes its last nodes), and lists the
/// operands that were already non-finite. Replay is best effort: where an operand cannot be
/// read back (a view with no buffer of its own) the written value is named.
fn locate(exec: &mut Exec, model: &Model, nf: NonFinite) -> NumericsFinding {
    let batch = exec.program.plan.batch;
    let nodes = exec.program.groups.get(nf.group).map(|grp| (grp.nodes.clone(), grp.inputs.clone()));
    let (nodes, inputs) = nodes.unwrap_or_default();
    let mut operands = std::collections::HashMap::new();
    let mut bad = Vec::new();
    let mut complete = true;
    for &v in &inputs {
        let Ok(t) = exec.backend.download(v) else {
            complete = false;
            continue;
        };
        let g = &exec.program.graph;
        if let Some((i, x)) = numerics::first_non_finite_host(&t) {
            let root = cvc_compiler::passes::memplan::storage_root(g, v);
            let (name, is_input) = numerics::operand_name(g, root);
            bad.push(BadOperand {
                name,
                line: model.line_of(g.span(v)),
                kind: numerics::kind(x),
                batch_sample: numerics::batch_sample(g, batch, v, i),
                is_input,
            });
        }
        operands.insert(v, to_interp(&t));
    }
    let g = &exec.program.graph;
    let mut at = (nf.value, nf.element, nf.found);
    if complete {
        if let Ok(r) = cvc_compiler::interp::replay::replay_group(g, batch, &nodes, &operands) {
            let first = nodes.iter().find_map(|&v| {
                let t = crate::interp_backend::from_interp(r.values.get(&v)?);
                numerics::first_non_finite_host(&t).map(|(i, x)| (v, i, x))
            });
            if let Some(f) = first {
                at = f;
            }
        }
    }
    let (v, element, found) = at;
    let n = g.node(v);
    let shape = n.ty.shape.resolve(batch);
    let (line, col) = g.span(v).line_col(model.source());
    NumericsFinding {
        kind: numerics::kind(found),
        op: n.op.mnemonic(),
        label: n.origin.label.clone(),
        value: v.to_string(),
        group: nf.group,
        file: model.file().to_string(),
        line,
        col,
        ty: format!("{}{shape:?}", n.ty.dtype),
        index: numerics::unravel(element, &shape),
        batch_sample: numerics::batch_sample(g, batch, v, element),
        operands: bad,
    }
}

fn unassigned_counters(g: &Graph) -> Vec<(Value, String, i32)> {
    let assigned: Vec<Value> = g.assigns().map(|(_, target)| target).collect();
    g.persistent()
        .filter(|&v| {
            let t = g.ty(v);
            t.dtype == DType::I32 && t.shape.rank() == 0 && !assigned.contains(&v)
        })
        .map(|v| (v, g.leaf_name(v).unwrap_or_default().to_string(), 0))
        .collect()
}

/// Initialises every parameter and state buffer from its `Init`: leaf `name` draws from
/// `SplitMix64(seed ^ fnv1a(name))`, as the reference interpreter's session does.
fn initialise(exec: &mut Exec, seed: u64) -> Result<(), RuntimeError> {
    let g = &exec.program.graph;
    let batch = exec.program.plan.batch;
    let mut values = Vec::new();
    for v in g.persistent() {
        let (Some(name), Some(init)) = (g.leaf_name(v), g.init_of(v)) else { continue };
        let ty = g.ty(v);
        let mut rng = SplitMix64::new(seed ^ name_hash(name));
        let t = init_values(init, ty.dtype, &ty.shape.resolve(batch), &mut rng);
        values.push((v, HostTensor::from_values(ty.dtype, &ty.shape.resolve(batch), &t)));
    }
    for (v, t) in values {
        exec.backend.upload(v, &t)?;
    }
    Ok(())
}

/// Uploads every input leaf of the program from `inputs` by name. With `require`, a missing
/// input is an error; otherwise it is zero-filled and the function returns `false`.
fn upload_inputs(
    exec: &mut Exec,
    inputs: &[(String, HostTensor)],
    require: bool,
) -> Result<bool, RuntimeError> {
    let mut complete = true;
    for (v, name, dtype, shape) in input_leaves(exec) {
        match inputs.iter().find(|(n, _)| *n == name) {
            Some((_, t)) => {
                if t.dtype != dtype || t.shape != shape {
                    return Err(RuntimeError(format!(
                        "input '{name}': expected {dtype} {shape:?}, got {} {:?}",
                        t.dtype, t.shape
                    )));
                }
                exec.backend.upload(v, t)?;
            }
            None if require => return Err(RuntimeError(format!("no data given for input '{name}'"))),
            None => {
                complete = false;
                exec.backend.upload(v, &HostTensor::zeros(dtype, &shape))?;
            }
        }
    }
    Ok(complete)
}

/// The graph's input leaves: value, name, dtype and concrete shape.
fn input_leaves(exec: &Exec) -> Vec<(Value, String, DType, Vec<usize>)> {
    let g = &exec.program.graph;
    let batch = exec.program.plan.batch;
    g.inputs()
        .map(|v| {
            (v, g.leaf_name(v).unwrap_or_default().to_string(), g.ty(v).dtype, g.ty(v).shape.resolve(batch))
        })
        .collect()
}

/// The tensor of `inputs` named `name`, checked against the leaf's dtype and shape.
fn find_input<'a>(
    inputs: &'a [(String, HostTensor)],
    name: &str,
    dtype: DType,
    shape: &[usize],
) -> Result<&'a HostTensor, RuntimeError> {
    let (_, t) = inputs
        .iter()
        .find(|(n, _)| n == name)
        .ok_or_else(|| RuntimeError(format!("no data given for input '{name}'")))?;
    if t.dtype != dtype || t.shape != shape {
        return Err(RuntimeError(format!(
            "input '{name}': expected {dtype} {shape:?}, got {} {:?}",
            t.dtype, t.shape
        )));
    }
    Ok(t)
}

/// Stages every input of the next batch in the back end's staging memory; `false` when the
/// back end keeps none (nothing is staged then).
fn stage_inputs(exec: &mut Exec, inputs: &[(String, HostTensor)]) -> Result<bool, RuntimeError> {
    for (v, name, dtype, shape) in input_leaves(exec) {
        let t = find_input(inputs, &name, dtype, &shape)?;
        if !exec.backend.stage(v, t)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Uploads every input from staging memory (`stage_inputs` staged exactly these tensors).
fn upload_staged_inputs(exec: &mut Exec, inputs: &[(String, HostTensor)]) -> Result<(), RuntimeError> {
    for (v, name, dtype, shape) in input_leaves(exec) {
        find_input(inputs, &name, dtype, &shape)?;
        exec.backend.upload_staged(v)?;
    }
    Ok(())
}

/// Downloads the program's outputs, into the buffers of `spare` (an earlier step's outputs,
/// matched by name) where there are any.
fn download_outputs(
    exec: &mut Exec,
    spare: Vec<(String, HostTensor)>,
) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
    let mut spare: HashMap<String, HostTensor> = spare.into_iter().collect();
    let outs: Vec<(String, Value)> =
        exec.program.graph.outputs.iter().map(|o| (o.name.clone(), o.value)).collect();
    outs.into_iter()
        .map(|(n, v)| {
            let t = match spare.remove(&n) {
                Some(mut t) => {
                    exec.backend.download_into(v, &mut t)?;
                    t
                }
                None => exec.backend.download(v)?,
            };
            Ok((n, t))
        })
        .collect()
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn scalar(t: &HostTensor) -> Result<f32, RuntimeError> {
    match &t.data {
        HostData::F32(v) if !v.is_empty() => Ok(v[0]),
        _ => Err(RuntimeError("the loss is not a real scalar".into())),
    }
}

/// Where the elements of a borrowed input tensor ([`TensorRef`]) are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorBytes<'a> {
    /// Host memory in the arena's layout (row-major, little-endian, complex interleaved).
    Host(&'a [u8]),
    /// CUDA device memory of this process (same layout): an address and a length in bytes.
    Cuda {
        /// The device address.
        ptr: u64,
        /// Bytes to copy.
        len: usize,
    },
}

/// An input tensor borrowed from its owner (a NumPy array, a DLPack tensor): uploaded
/// straight from its memory, without an intermediate [`HostTensor`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef<'a> {
    /// Element type.
    pub dtype: DType,
    /// Concrete shape.
    pub shape: Vec<usize>,
    /// The elements.
    pub data: TensorBytes<'a>,
}

/// Uploads borrowed inputs by name (see [`upload_inputs`]; missing ones are zero-filled
/// unless `require`).
fn upload_input_refs(
    exec: &mut Exec,
    inputs: &[(String, TensorRef<'_>)],
    require: bool,
) -> Result<bool, RuntimeError> {
    let mut complete = true;
    for (v, name, dtype, shape) in input_leaves(exec) {
        match inputs.iter().find(|(n, _)| *n == name) {
            Some((_, t)) => {
                if t.dtype != dtype || t.shape != shape {
                    return Err(RuntimeError(format!(
                        "input '{name}': expected {dtype} {shape:?}, got {} {:?}",
                        t.dtype, t.shape
                    )));
                }
                match t.data {
                    TensorBytes::Host(b) => exec.backend.upload_bytes(v, dtype, &shape, b)?,
                    TensorBytes::Cuda { ptr, len } => {
                        let want = shape.iter().product::<usize>() * dtype.bytes();
                        if len != want {
                            return Err(RuntimeError(format!(
                                "input '{name}': {len} bytes of device memory for a {want}-byte tensor"
                            )));
                        }
                        exec.backend.upload_device(v, ptr, len)?
                    }
                }
            }
            None if require => return Err(RuntimeError(format!("no data given for input '{name}'"))),
            None => {
                complete = false;
                exec.backend.upload(v, &HostTensor::zeros(dtype, &shape))?;
            }
        }
    }
    Ok(complete)
}

/// Steps and evaluation on borrowed inputs ([`TensorRef`]): what the Python package calls, so
/// NumPy arrays and CUDA tensors reach the arena without an intermediate copy.
impl Session {
    /// [`Session::train_step`] on borrowed inputs.
    pub fn train_step_refs(
        &mut self,
        inputs: &[(String, TensorRef<'_>)],
    ) -> Result<StepReport, RuntimeError> {
        self.staged = 0;
        upload_input_refs(&mut self.train, inputs, true)?;
        for (v, _, c) in &self.counters {
            let t = HostTensor { dtype: DType::I32, shape: vec![], data: HostData::I32(vec![*c]) };
            self.train.backend.upload(*v, &t)?;
        }
        self.train.backend.launch()?;
        self.end_step(StepPhases::default())
    }

    /// [`Session::evaluate`] on borrowed inputs.
    pub fn evaluate_refs(&mut self, inputs: &[(String, TensorRef<'_>)]) -> Result<EvalReport, RuntimeError> {
        let n = inputs.first().and_then(|(_, t)| t.shape.first().copied());
        self.evaluate_with(n, |exec| upload_input_refs(exec, inputs, false))
    }

    /// Whether the leaf `name` of the training program is a trainable parameter (not state).
    pub fn is_parameter(&self, name: &str) -> bool {
        let g = &self.train.program.graph;
        g.find_leaf(name).is_some_and(|v| g.is_param(v))
    }
}
