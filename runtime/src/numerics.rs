//! Numerics checking (`--check-numerics`): after each launch of a step, the buffers the
//! launch wrote are scanned for NaN and ±Inf, and the first non-finite value is named at its
//! source — the IR op and layer that produced it, its `.cvnn` line, and the batch sample —
//! like PyTorch's anomaly detection, but pointing at the model's text.
//!
//! The back ends only find the first bad element ([`Backend::step_checked`]); the session
//! turns it into a [`NumericsFinding`]: it replays the kernel group in f64 on the operands
//! the back end read, so the op named is the first node *inside* a fused group whose value is
//! non-finite, and it names the operands that were already non-finite (NaN in the data).
//!
//! Checking is opt-in per step: [`Backend::step`] never scans, so a run with checking off
//! pays one flag test per step and nothing else.
//!
//! [`Backend::step_checked`]: crate::backend::Backend::step_checked
//! [`Backend::step`]: crate::backend::Backend::step

use crate::backend::{HostData, HostTensor, RuntimeError};
use cvc_compiler::ir::Storage;
use cvc_compiler::ir::{DType, Dim, Graph, Op, Value};
use cvc_compiler::passes::fusion::{GroupId, GroupKind};
use cvc_compiler::passes::memplan::storage_root;
use cvc_compiler::passes::Program;
use std::fmt::Write;

/// When a training run checks numerics.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CheckNumerics {
    /// Never (no scans at all).
    Off,
    /// The first [`FIRST_STEPS`] training steps of the run, and every validation or
    /// evaluation batch whose loss or outputs are non-finite (re-run with checks).
    #[default]
    First,
    /// Every step and every validation batch (slow: each launch waits and is scanned).
    Always,
}

/// Steps checked at the start of a run with [`CheckNumerics::First`]: enough to catch NaN in
/// the data of the first batches and a model that diverges at once, cheap enough to be on by
/// default.
pub const FIRST_STEPS: usize = 3;

impl CheckNumerics {
    /// Whether training step `step` (0-based, counted from the start of this run) is checked.
    pub fn checks_step(self, step: usize) -> bool {
        match self {
            CheckNumerics::Off => false,
            CheckNumerics::First => step < FIRST_STEPS,
            CheckNumerics::Always => true,
        }
    }
}

/// The first non-finite element a back end found after a launch.
#[derive(Clone, Debug, PartialEq)]
pub struct NonFinite {
    /// The kernel group of the launch (index into `Program::groups`).
    pub group: GroupId,
    /// The value whose buffer holds it.
    pub value: Value,
    /// Row-major element index in the value (complex elements count once).
    pub element: usize,
    /// The element (the real or imaginary part that is not finite).
    pub found: f32,
}

/// A buffer one group writes that can hold non-finite values (f32 or c64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckedBuffer {
    /// The group writing it.
    pub group: GroupId,
    /// The value written (an `Assign` names the update; its bytes are the target's).
    pub value: Value,
    /// Byte offset in the arena.
    pub offset: usize,
    /// Bytes of the value.
    pub bytes: usize,
    /// Whether elements are complex (two words each).
    pub complex: bool,
    /// How the words are stored (f32, or bf16/fp16 under a 16-bit precision).
    pub storage: Storage,
}

/// The f32/c64 buffers group `gid` writes, in the group's node order.
pub fn written_buffers(program: &Program, gid: GroupId) -> Vec<CheckedBuffer> {
    let g = &program.graph;
    let Some(grp) = program.groups.get(gid) else { return Vec::new() };
    if grp.kind == GroupKind::View {
        return Vec::new();
    }
    grp.outputs
        .iter()
        .filter_map(|&v| {
            let ty = g.ty(v);
            if ty.dtype == DType::I32 {
                return None;
            }
            let slot = program.plan.slot(storage_root(g, v))?;
            let bytes = g.bytes(v, program.plan.batch).min(slot.bytes);
            Some(CheckedBuffer {
                group: gid,
                value: v,
                offset: slot.offset,
                bytes,
                complex: ty.dtype == DType::C64,
                storage: g.storage(v),
            })
        })
        .collect()
}

/// What to scan after each launch: `launch_groups[i]` is the group launch `i` computes (`None`
/// for actions that are not a group's kernel, e.g. a zeroing). A group is scanned after its
/// last launch, together with any earlier group of the schedule not scanned yet (a kernel that
/// computes several adjacent groups is listed under one of them); what remains is scanned after
/// the last launch.
pub fn scan_plan(program: &Program, launch_groups: &[Option<GroupId>]) -> Vec<Vec<CheckedBuffer>> {
    let pos_of = |gid: GroupId| program.order.iter().position(|&o| o == gid);
    let mut plan = vec![Vec::new(); launch_groups.len()];
    let mut next = 0;
    for i in 0..launch_groups.len() {
        let Some(gid) = launch_groups[i] else { continue };
        let later = launch_groups[i + 1..].iter().flatten().next();
        if later == Some(&gid) {
            continue;
        }
        let Some(pos) = pos_of(gid) else { continue };
        let upto = if later.is_none() { program.order.len() } else { pos + 1 };
        if upto > next {
            for &o in &program.order[next..upto] {
                plan[i].extend(written_buffers(program, o));
            }
            next = upto;
        }
    }
    plan
}

/// The first word of `bytes` (little-endian f32s) that is NaN or infinite, with its value.
pub fn first_non_finite(bytes: &[u8]) -> Option<(usize, f32)> {
    first_non_finite_stored(bytes, Storage::Full)
}

/// The first word of `bytes`, stored as `storage` (f32, bf16 or fp16 words), that is NaN or
/// infinite, with its value widened to f32.
pub fn first_non_finite_stored(bytes: &[u8], storage: Storage) -> Option<(usize, f32)> {
    match storage {
        Storage::Full => bytes.chunks_exact(4).enumerate().find_map(|(i, c)| {
            let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            (!x.is_finite()).then_some((i, x))
        }),
        Storage::Bf16 | Storage::F16 => bytes.chunks_exact(2).enumerate().find_map(|(i, c)| {
            let x = crate::backend::widen_half([c[0], c[1]], storage);
            (!x.is_finite()).then_some((i, x))
        }),
    }
}

/// Scans one buffer's bytes; a non-finite word becomes a [`NonFinite`] of its value.
pub fn scan(buf: &CheckedBuffer, bytes: &[u8]) -> Option<NonFinite> {
    first_non_finite_stored(bytes, buf.storage).map(|(w, x)| NonFinite {
        group: buf.group,
        value: buf.value,
        element: if buf.complex { w / 2 } else { w },
        found: x,
    })
}

/// The first non-finite element of a host tensor (element index, value).
pub fn first_non_finite_host(t: &HostTensor) -> Option<(usize, f32)> {
    match &t.data {
        HostData::F32(v) => v.iter().position(|x| !x.is_finite()).map(|i| {
            let per = if t.dtype == DType::C64 { 2 } else { 1 };
            (i / per, v[i])
        }),
        HostData::I32(_) => None,
    }
}

/// `NaN`, `+Inf` or `-Inf`.
pub fn kind(x: f32) -> &'static str {
    if x.is_nan() {
        "NaN"
    } else if x > 0.0 {
        "+Inf"
    } else {
        "-Inf"
    }
}

/// Row-major multi-index of element `i` of `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            idx[k] = i % d;
            i /= d;
        }
    }
    idx
}

/// The batch sample of element `element` of `v`: its index along the value's batch axis
/// (the first `B` of its symbolic shape), when it has one.
pub fn batch_sample(g: &Graph, batch: usize, v: Value, element: usize) -> Option<usize> {
    let ty = g.ty(v);
    let axis = ty.shape.0.iter().position(|d| *d == Dim::Batch)?;
    Some(unravel(element, &ty.shape.resolve(batch))[axis])
}

/// An operand of the bad op that was already non-finite when the op read it.
#[derive(Clone, Debug, PartialEq)]
pub struct BadOperand {
    /// How the operand is called: `input x`, `parameter w`, or its layer label.
    pub name: String,
    /// Its `.cvnn` line.
    pub line: usize,
    /// `NaN`, `+Inf` or `-Inf`.
    pub kind: &'static str,
    /// The batch sample of its first bad element, when it has a batch axis.
    pub batch_sample: Option<usize>,
    /// Whether it is a data input (the data holds the non-finite value).
    pub is_input: bool,
}

/// The first non-finite value of a checked step, located in the model's source.
#[derive(Clone, Debug, PartialEq)]
pub struct NumericsFinding {
    /// `NaN`, `+Inf` or `-Inf`.
    pub kind: &'static str,
    /// The IR op's mnemonic (`mul`, `exp`, `matmul`, `assign`...).
    pub op: String,
    /// The layer or binding (the value's origin label, e.g. `features/linear`).
    pub label: String,
    /// The value's IR name (`%14`).
    pub value: String,
    /// The kernel group it was computed in.
    pub group: GroupId,
    /// The `.cvnn` file.
    pub file: String,
    /// 1-based line and column of the op in the file.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// The value's type, e.g. `f32[8, 4]`.
    pub ty: String,
    /// Multi-index of the first bad element.
    pub index: Vec<usize>,
    /// Index along the batch axis of the first bad element, when the value has one.
    pub batch_sample: Option<usize>,
    /// Operands that were already non-finite (e.g. the data input).
    pub operands: Vec<BadOperand>,
}

impl NumericsFinding {
    /// The finding as an error message; `samples[b]` is the dataset sample of batch sample
    /// `b`, when the caller knows it.
    pub fn render(&self, samples: Option<&[usize]>) -> String {
        let sample = |b: usize| match samples.and_then(|s| s.get(b)) {
            Some(d) => format!("batch sample {b} (dataset sample {d})"),
            None => format!("batch sample {b}"),
        };
        let mut s = format!(
            "non-finite value ({}) produced by `{}` at {}:{}:{} (layer `{}`, value {} {}, kernel group {})",
            self.kind, self.op, self.file, self.line, self.col, self.label, self.value, self.ty, self.group
        );
        let at = match self.batch_sample {
            Some(b) => format!(" = {}", sample(b)),
            None => " (no batch axis)".to_string(),
        };
        let _ = write!(s, "\n  first bad element {:?}{at}", self.index);
        for o in &self.operands {
            let at = o.batch_sample.map(|b| format!(" at {}", sample(b))).unwrap_or_default();
            let why = if o.is_input { ": the data is not finite" } else { "" };
            let _ =
                write!(s, "\n  its operand {} (line {}) already holds {}{at}{why}", o.name, o.line, o.kind);
        }
        if self.operands.is_empty() {
            s.push_str("\n  its operands are finite: this op made the value (overflow, 0/0, log of 0 or a negative, ...)");
        }
        s
    }
}

/// How an operand is called in a finding.
pub fn operand_name(g: &Graph, v: Value) -> (String, bool) {
    match &g.node(v).op {
        Op::Input { name } => (format!("input `{name}`"), true),
        Op::Param { name, .. } => (format!("parameter `{name}`"), false),
        Op::State { name, .. } => (format!("state `{name}`"), false),
        _ => (format!("`{}` ({v})", g.node(v).origin.label), false),
    }
}

/// The first parameter or state tensor holding a non-finite value, as an error message naming
/// it (`what` says where the tensors come from, e.g. a weights file).
pub fn non_finite_tensor(tensors: &[(String, HostTensor)], what: &str) -> Option<RuntimeError> {
    tensors.iter().find_map(|(name, t)| {
        let (i, x) = first_non_finite_host(t)?;
        Some(RuntimeError(format!(
            "{what}: tensor `{name}` holds {} at element {:?} of {}{:?}; a model with non-finite weights computes nothing meaningful",
            kind(x),
            unravel(i, &t.shape),
            t.dtype,
            t.shape
        )))
    })
}
