//! The primitive operations of the graph IR and their exact meaning.
//!
//! Every `.cvnn` layer lowers to these primitives (batchnorm becomes reductions and
//! elementwise ops, pooling a view plus a reduction, cross-entropy a log-softmax built
//! from `Reduce`/`Exp`/`Log`). Autodiff, the interpreter and every back end therefore
//! implement only this table.
//!
//! Conventions shared by all back ends:
//! - Elementwise ops broadcast their inputs to the output shape NumPy-style (shapes aligned
//!   on the right; an input extent of 1 repeats). Mixed real/complex inputs are allowed where
//!   listed: the real operand is read as `x + 0i` (a folded cast, see `passes::cast`).
//! - Complex numbers are stored interleaved (re, im) as two f32.
//! - Gradients follow PyTorch's conjugate-Wirtinger convention: the gradient of a real loss
//!   `L` w.r.t. `z = x + iy` is `∂L/∂x + i ∂L/∂y`.

use serde::Serialize;

/// Initialiser of a parameter or state buffer (applied by the runtime, seeded).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones (real), or `1 + 0i` (complex).
    Ones,
    /// A constant value (real part; imaginary part 0).
    Constant(f64),
    /// Complex Glorot: variance `2 / (fan_in + fan_out)` split equally between re and im
    /// (real tensors: the full variance, normal distribution).
    Glorot { fan_in: usize, fan_out: usize },
    /// Complex He: variance `2 / fan_in` split equally between re and im (real: full).
    He { fan_in: usize },
    /// Rayleigh-distributed magnitude with scale `1 / sqrt(fan_in + fan_out)`, uniform phase.
    Rayleigh { fan_in: usize, fan_out: usize },
    /// Uniform in `[-bound, bound]` (biases, as PyTorch's default).
    Uniform { bound: f64 },
}

/// Elementwise functions of one input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum UnaryOp {
    /// `-x` (f32, c64).
    Neg,
    /// Complex conjugate (c64 → c64; identity on f32).
    Conj,
    /// Real part (c64 → f32).
    Real,
    /// Imaginary part (c64 → f32).
    Imag,
    /// `|x|` (f32 → f32, c64 → f32).
    Abs,
    /// `|x|²` (f32 → f32, c64 → f32).
    Abs2,
    /// `atan2(im, re)` (c64 → f32; f32: 0 or π).
    Angle,
    /// `x + 0i` (f32 → c64). Placed and folded by the cast pass.
    ToComplex,
    /// `e^x` (f32).
    Exp,
    /// Natural log (f32).
    Log,
    /// Square root (f32).
    Sqrt,
    /// `1/sqrt(x)` (f32).
    Rsqrt,
    /// `1/x` (f32).
    Recip,
    /// `sin x` (f32).
    Sin,
    /// `cos x` (f32).
    Cos,
    /// `tanh x` (f32).
    Tanh,
    /// `1/(1+e^-x)` (f32).
    Sigmoid,
    /// `max(x, 0)` (f32).
    Relu,
    /// Heaviside: `1` where `x > 0`, else `0` (f32). Relu's derivative.
    Step,
    /// GELU, tanh approximation: `0.5x(1+tanh(√(2/π)(x+0.044715x³)))` (f32).
    Gelu,
    /// Derivative of [`UnaryOp::Gelu`] (f32).
    GeluGrad,
    /// Identity whose gradient is zero (used for log-softmax's max shift).
    StopGrad,
}

/// Elementwise functions of two inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum BinaryOp {
    /// `a + b` (f32/c64, mixed allowed).
    Add,
    /// `a - b` (f32/c64, mixed allowed).
    Sub,
    /// `a * b` (f32/c64, mixed allowed).
    Mul,
    /// `a / b` (f32/f32, c64/f32, c64/c64).
    Div,
    /// `max(a, b)` (f32).
    Max,
    /// `a + ib` (f32, f32 → c64): the real/imag combine; never materialises a copy.
    Complex,
    /// `1` where `a > b`, else `0` (f32).
    Greater,
    /// `1` where `a == b`, else `0` (f32).
    Equal,
}

/// Reduction kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum ReduceOp {
    /// Sum (f32, c64).
    Sum,
    /// Maximum (f32).
    Max,
    /// The element of largest magnitude (c64 → c64; f32: largest `|x|`); ties take the first.
    MaxMag,
}

/// Normalisation of a discrete Fourier transform, as NumPy's `norm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum FftNorm {
    /// Forward unscaled, inverse scaled by `1/n`.
    Backward,
    /// Both scaled by `1/sqrt(n)`.
    Ortho,
    /// Forward scaled by `1/n`, inverse unscaled.
    Forward,
}

impl FftNorm {
    /// The scale applied by a transform of length `n` in the given direction.
    pub fn scale(self, n: usize, inverse: bool) -> f64 {
        let n = n as f64;
        match (self, inverse) {
            (FftNorm::Ortho, _) => 1.0 / n.sqrt(),
            (FftNorm::Backward, false) | (FftNorm::Forward, true) => 1.0,
            (FftNorm::Backward, true) | (FftNorm::Forward, false) => 1.0 / n,
        }
    }
    /// The norm whose transform in the other direction is this one's adjoint.
    pub fn adjoint(self) -> FftNorm {
        match self {
            FftNorm::Backward => FftNorm::Forward,
            FftNorm::Ortho => FftNorm::Ortho,
            FftNorm::Forward => FftNorm::Backward,
        }
    }
}

/// Geometry of a 2-D convolution (1-D convolutions are lowered with height 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ConvGeom {
    /// Stride `(h, w)`.
    pub stride: [usize; 2],
    /// Zero padding on each side `(h, w)`.
    pub pad: [usize; 2],
    /// Dilation `(h, w)`.
    pub dilation: [usize; 2],
    /// Channel groups.
    pub groups: usize,
}

impl ConvGeom {
    /// Output extent of a forward convolution along axis `a` (0 = h, 1 = w).
    pub fn out_extent(&self, a: usize, input: usize, kernel: usize) -> Option<usize> {
        let span = self.dilation[a] * (kernel - 1) + 1;
        let padded = input + 2 * self.pad[a];
        if kernel == 0 || padded < span {
            return None;
        }
        Some((padded - span) / self.stride[a] + 1)
    }
}

/// An IR operation. Operand order is given per variant; see the module doc for conventions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Op {
    /// Data fed each step (`name` is the `.cvnn` input). No operands.
    Input { name: String },
    /// Trainable parameter, persistent across steps. `name` is `<binding>.<param>`.
    Param { name: String, init: Init },
    /// Persistent non-trainable buffer: running statistics, optimizer moments, the step counter.
    State { name: String, init: Init },
    /// The f32 scalar `value * B^batch_exp` (shape `[]`); `batch_exp = -1` makes a batch mean.
    Scalar { value: f64, batch_exp: i32 },
    /// Elementwise unary op. Operands: `[x]`.
    Unary(UnaryOp),
    /// Elementwise binary op with broadcasting. Operands: `[a, b]`.
    Binary(BinaryOp),
    /// `cond > 0 ? a : b`, broadcasting. Operands: `[cond (f32), a, b]`.
    Select,
    /// Reduction over `axes` (sorted, unique); reduced axes keep extent 1. Operands: `[x]`.
    Reduce { op: ReduceOp, axes: Vec<usize> },
    /// Same elements, new shape (a view: no copy). Operands: `[x]`.
    Reshape,
    /// Repeat size-1 axes to the output shape (a materialised broadcast). Operands: `[x]`.
    Expand,
    /// Axis permutation: output axis `i` is input axis `perm[i]`. Operands: `[x]`.
    Permute { perm: Vec<usize> },
    /// `x[.., start..start+len, ..]` along `axis`. Operands: `[x]`.
    Slice { axis: usize, start: usize, len: usize },
    /// Zero padding along `axis`. Operands: `[x]`.
    Pad { axis: usize, before: usize, after: usize },
    /// Concatenation along `axis`. Operands: the pieces, in order.
    Concat { axis: usize },
    /// `op(a) · op(b)`, batched over leading axes; `op` = optional transpose then optional
    /// conjugate of the last two axes. Operands `[a ([P..., M, K] after op), b ([P..., K, N]
    /// after op)]`: the leading axes `P...` (possibly containing `B`) are the same in both, or
    /// one operand is 2-D and is broadcast over the other's `P...` (no `P` at all: the plain
    /// matrix product). Output `[P..., M, N]`; with `sum_batch` it is `[M, N]`, the sum over
    /// `P...` of the per-batch products (both operands then have the same, non-empty `P...`):
    /// the weight gradient of a broadcast operand, never materialising `[P..., M, N]`.
    /// Dtypes may mix (real stays real).
    MatMul { trans: [bool; 2], conj: [bool; 2], sum_batch: bool },
    /// Cross-correlation as PyTorch's conv2d. Operands `[x (N,C,H,W), w (O, C/groups, kh, kw)]`;
    /// `conj[i]` conjugates operand `i` first. Dtypes may mix.
    Conv2d { geom: ConvGeom, conj: [bool; 2] },
    /// Transposed convolution (the adjoint of `Conv2d` w.r.t. its input), as PyTorch's
    /// conv_transpose2d with `output_padding` chosen so the result is `out_hw`.
    /// Operands `[dy (N,O,Ho,Wo), w (O, C/groups, kh, kw)]`; output `(N, C, out_hw)`.
    ConvTranspose2d { geom: ConvGeom, out_hw: [usize; 2], conj: [bool; 2] },
    /// The adjoint of `Conv2d` w.r.t. its weight: `dw = Σ dy ⋆ op(x)`.
    /// Operands `[x (N,C,H,W), dy (N,O,Ho,Wo)]`; output `(O, C/groups, kernel)`.
    Conv2dWeightGrad { geom: ConvGeom, kernel: [usize; 2], conj: [bool; 2] },
    /// Discrete Fourier transform along `axis` (c64 → c64); sign `-` forward, `+` inverse.
    Fft { axis: usize, inverse: bool, norm: FftNorm },
    /// One-hot rows: i32 labels `[..]` → f32 `[.., classes]`. Out-of-range labels give zeros.
    OneHot { classes: usize },
    /// Inverted-dropout mask (f32, values `0` or `1/(1-p)`), from a counter-based hash of
    /// `(salt, step, element index)` that every back end computes identically
    /// (see `crate::ir::dropout_keep`). Operands: `[step (i32 scalar state)]`.
    DropoutMask { p: f64, salt: u32 },
    /// Overwrite a persistent buffer (`Param`/`State`) with `value` at the end of its reads.
    /// Operands `[target, value]`; result type is the target's; nothing may read the result.
    Assign,
}

/// How an op computes its value, for passes that treat whole classes of ops alike (see
/// [`Op::class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// No operands: `Input`, `Param`, `State`, `Scalar` (a scalar is also elementwise: it
    /// is inlined into elementwise loops).
    Leaf,
    /// Each output element from the same-index operand elements: `Unary`, `Binary`, `Select`.
    Elementwise,
    /// A reduction over axes.
    Reduce,
    /// A reshape: the same elements in the same order (no code runs).
    View,
    /// Data movement or a special producer: `Expand`, `Permute`, `Slice`, `Pad`, `Concat`,
    /// `Fft`, `OneHot`, `DropoutMask`.
    Movement,
    /// The matmul/convolution family.
    Contraction,
    /// The overwrite of a persistent buffer.
    Assign,
}

impl Op {
    /// Whether the op computes each output element from the same-index input elements
    /// (after broadcasting), so it can be fused into a loop over the output.
    pub fn is_elementwise(&self) -> bool {
        self.class() == OpClass::Elementwise || matches!(self, Op::Scalar { .. })
    }
    /// Whether the op is a graph leaf (no operands).
    pub fn is_leaf(&self) -> bool {
        self.class() == OpClass::Leaf
    }
    /// Whether the op is a contraction (matmul/convolution family).
    pub fn is_contraction(&self) -> bool {
        self.class() == OpClass::Contraction
    }
    /// Whether the op's value lives across steps (parameters and state).
    pub fn is_persistent(&self) -> bool {
        match self {
            Op::Param { .. } | Op::State { .. } => true,
            Op::Input { .. }
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
            | Op::MatMul { .. }
            | Op::Conv2d { .. }
            | Op::ConvTranspose2d { .. }
            | Op::Conv2dWeightGrad { .. }
            | Op::Fft { .. }
            | Op::OneHot { .. }
            | Op::DropoutMask { .. }
            | Op::Assign => false,
        }
    }
    /// The op's class, which decides how passes and back ends treat it. Written as one
    /// exhaustive match, so a new primitive does not compile until it is classified.
    pub fn class(&self) -> OpClass {
        match self {
            Op::Input { .. } | Op::Param { .. } | Op::State { .. } | Op::Scalar { .. } => OpClass::Leaf,
            Op::Unary(_) | Op::Binary(_) | Op::Select => OpClass::Elementwise,
            Op::Reduce { .. } => OpClass::Reduce,
            Op::Reshape => OpClass::View,
            Op::Expand
            | Op::Permute { .. }
            | Op::Slice { .. }
            | Op::Pad { .. }
            | Op::Concat { .. }
            | Op::Fft { .. }
            | Op::OneHot { .. }
            | Op::DropoutMask { .. } => OpClass::Movement,
            Op::MatMul { .. }
            | Op::Conv2d { .. }
            | Op::ConvTranspose2d { .. }
            | Op::Conv2dWeightGrad { .. } => OpClass::Contraction,
            Op::Assign => OpClass::Assign,
        }
    }
    /// Short mnemonic used by the text form.
    pub fn mnemonic(&self) -> String {
        match self {
            Op::Input { .. } => "input".into(),
            Op::Param { .. } => "param".into(),
            Op::State { .. } => "state".into(),
            Op::Scalar { .. } => "scalar".into(),
            Op::Unary(u) => format!("{u:?}").to_lowercase(),
            Op::Binary(b) => format!("{b:?}").to_lowercase(),
            Op::Select => "select".into(),
            Op::Reduce { op, .. } => format!("reduce_{}", format!("{op:?}").to_lowercase()),
            Op::Reshape => "reshape".into(),
            Op::Expand => "expand".into(),
            Op::Permute { .. } => "permute".into(),
            Op::Slice { .. } => "slice".into(),
            Op::Pad { .. } => "pad".into(),
            Op::Concat { .. } => "concat".into(),
            Op::MatMul { .. } => "matmul".into(),
            Op::Conv2d { .. } => "conv2d".into(),
            Op::ConvTranspose2d { .. } => "conv_transpose2d".into(),
            Op::Conv2dWeightGrad { .. } => "conv2d_weight_grad".into(),
            Op::Fft { inverse, .. } => if *inverse { "ifft" } else { "fft" }.into(),
            Op::OneHot { .. } => "one_hot".into(),
            Op::DropoutMask { .. } => "dropout_mask".into(),
            Op::Assign => "assign".into(),
        }
    }
}

/// The dropout hash shared by every back end: keep element `index` at `step` when this
/// returns true. A 32-bit integer mix (lowbias32) of `salt`, `step` and `index`.
pub fn dropout_keep(p: f64, salt: u32, step: u32, index: u32) -> bool {
    let h = dropout_hash(salt, step, index);
    // Compare in 24-bit fixed point so f32-only back ends reproduce it exactly.
    let threshold = ((1.0 - p) * 16_777_216.0) as u32;
    (h >> 8) < threshold
}

/// The raw 32-bit hash behind [`dropout_keep`].
pub fn dropout_hash(salt: u32, step: u32, index: u32) -> u32 {
    let mut x = index ^ salt.wrapping_mul(0x9E37_79B9) ^ step.wrapping_mul(0x85EB_CA6B);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846C_A68B);
    x ^= x >> 16;
    x
}
