//! Which values are stored as 16-bit floats under `precision = bf16 | fp16`: the rule that the
//! memory plan, the schedule, the reports and the CUDA back end all read.
//!
//! A value is stored in the graph's half format ([`Graph::half`]) when the buffer it lives in
//! (its [`buffer_root`]: views share their source's buffer, assigns their target's) is
//!
//! - a real or complex value with the batch axis in its shape (an activation, an activation
//!   gradient, a saved forward value, a recomputed one), and
//! - computed by an elementwise, movement, contraction or attention kernel.
//!
//! Everything else keeps its dtype's width: parameters, their gradients (no batch axis),
//! optimizer state and running statistics (the "f32 master weights"); data inputs and
//! the values the host reads back (the graph's outputs, the loss), so uploads and downloads
//! need no conversion; reductions (batch and per-sample statistics, loss terms: "reductions in
//! f32"); the attention's log-sum-exp rows (its backward exponentiates against them); dropout
//! masks (their `1/(1-p)` is not a bf16 number); a recurrence's states and the gradient rows
//! of its backward (each step reads the previous step's row back: rounding there would
//! compound over the sequence); scatter-adds (their atomics add in the
//! buffer); and contractions with at most [`NARROW_CONTRACTION`] elements per sample (a
//! classifier head, a pooled feature vector): they save almost no memory in 16 bits, and their
//! long K needs the split over blocks that adds partial sums with atomics, which an output
//! stored in 16 bits would round at every addition (seed network, batch 1024: the `linear(10)`
//! over 16,384 features ran on 16 blocks of 132 SMs, 0.88 ms of a 14 ms step).
//! Integer values are never half.
//!
//! The rule is a pure function of the graph, so nodes that later passes add (remat's
//! recomputations) are classified like the ones they copy.

use super::*;

/// The value whose buffer `v` lives in: views resolve to their source, assigns to their target.
pub fn buffer_root(g: &Graph, mut v: Value) -> Value {
    loop {
        match g.node(v).op.class() {
            OpClass::View | OpClass::Assign => v = g.node(v).inputs[0],
            OpClass::Leaf
            | OpClass::Elementwise
            | OpClass::Reduce
            | OpClass::Movement
            | OpClass::Contraction
            | OpClass::Attention
            | OpClass::Recurrence => return v,
        }
    }
}

/// Contractions with at most this many output elements per sample stay full width.
pub const NARROW_CONTRACTION: usize = 1024;

/// How `v`'s elements are stored (see the module docs for the rule).
pub fn stored(g: &Graph, v: Value) -> Storage {
    if !g.half.is_half() {
        return Storage::Full;
    }
    let r = buffer_root(g, v);
    let n = g.node(r);
    let narrow = n.op.class() == OpClass::Contraction
        && n.ty.shape.batch_power() == 1
        && n.ty.shape.fixed_numel() <= NARROW_CONTRACTION;
    let kernel_made = match &n.op {
        Op::AttnLse { .. } | Op::DropoutMask { .. } | Op::ScatterAdd { .. } => false,
        _ if narrow => false,
        op => matches!(
            op.class(),
            OpClass::Elementwise | OpClass::Movement | OpClass::Contraction | OpClass::Attention
        ),
    };
    let read_back = g.loss.is_some_and(|l| buffer_root(g, l) == r)
        || g.outputs.iter().any(|o| buffer_root(g, o.value) == r);
    if n.ty.dtype != DType::I32 && n.ty.shape.batch_power() > 0 && kernel_made && !read_back {
        g.half
    } else {
        Storage::Full
    }
}

impl Graph {
    /// How `v`'s elements are stored ([`stored`]).
    pub fn storage(&self, v: Value) -> Storage {
        stored(self, v)
    }
    /// Bytes of `v`'s buffer at a batch size, counting its storage (saturating at `usize::MAX`).
    pub fn bytes(&self, v: Value, batch: usize) -> usize {
        let ty = self.ty(v);
        ty.shape.numel(batch).saturating_mul(self.storage(v).elem_bytes(ty.dtype))
    }
    /// Bytes at a batch size, `None` when the count overflows `usize`.
    pub fn checked_bytes(&self, v: Value, batch: usize) -> Option<usize> {
        let ty = self.ty(v);
        ty.shape.checked_numel(batch)?.checked_mul(self.storage(v).elem_bytes(ty.dtype))
    }
    /// The stored element type's name (`c64`, `cbf16`, ...: [`Storage::stored_name`]).
    pub fn stored_name(&self, v: Value) -> &'static str {
        self.storage(v).stored_name(self.ty(v).dtype)
    }
}
