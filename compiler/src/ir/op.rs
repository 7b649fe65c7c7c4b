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
    /// Uniform in `[-bound, bound]` (biases, as PyTorch's default); complex: re and im
    /// drawn independently.
    Uniform { bound: f64 },
    /// A `[2, 2, ...]` tensor holding `scale · I₂` along its first two axes, the same at every
    /// trailing index: the 2×2 affine weight of complextorch's `LayerNorm`/`RMSNorm`, which act
    /// on `(re, im)` (initialised to `I / √2`).
    Eye2 { scale: f64 },
    /// Normal with mean 0 and standard deviation `std` (real), or complex normal with
    /// `E|z|² = std²`: variance `std²/2` on each of re and im (as the Glorot rule splits it).
    Normal { std: f64 },
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
    /// Exact GELU: `0.5x(1+erf(x/√2))` = `x·Φ(x)` (f32), PyTorch's default `gelu`.
    Gelu,
    /// Derivative of [`UnaryOp::Gelu`]: `Φ(x) + x·φ(x)` (f32).
    GeluGrad,
    /// GELU, tanh approximation: `0.5x(1+tanh(√(2/π)(x+0.044715x³)))` (f32), PyTorch's
    /// `gelu(approximate="tanh")`.
    GeluTanh,
    /// Derivative of [`UnaryOp::GeluTanh`] (f32).
    GeluTanhGrad,
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

/// How an attention score is formed from `c = q·kᴴ` (complex): its real part or magnitude.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum AttnScore {
    /// `s = scale · Re(c)` (torchcvnn's MultiheadAttention).
    Real,
    /// `s = scale · |c|`.
    Abs,
}

/// Where the heads of an attention lie in its operands. Every operand is token-major,
/// `[B, T, C]` (`[B, S, C]` for keys and values): head `h` of the query reads columns
/// `cols[0] + h·d .. cols[0] + (h+1)·d` of its operand, the key `cols[1] + h·d ..` and the
/// value `cols[2] + h·dv ..`. So the heads of a packed in-projection `[B, T, 3E]` are read
/// where they lie (no slice, reshape or permute is stored), and the outputs are token-major
/// too: `o` is `[B, T, H·dv]`, `dq` `[B, T, H·d]`, `dk ‖ dv` `[B, S, H·d + H·dv]` (every
/// head's `dk`, then every head's `dv`: the layout of a packed `k ‖ v` operand).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct AttnHeads {
    /// Heads `H`.
    pub n: usize,
    /// Query and key features per head.
    pub d: usize,
    /// Value features per head.
    pub dv: usize,
    /// The first column of head 0 in the query, key and value operands.
    pub cols: [usize; 3],
}

impl AttnHeads {
    /// `n` heads of `d` features each (values too) at column 0 of separate operands.
    pub fn separate(n: usize, d: usize) -> AttnHeads {
        AttnHeads { n, d, dv: d, cols: [0; 3] }
    }
    /// Columns the heads of operand `i` (0 query, 1 key, 2 value) span: `H·d` or `H·dv`.
    pub fn width(&self, i: usize) -> usize {
        self.n * if i == 2 { self.dv } else { self.d }
    }
}

/// Options shared by the attention primitives ([`Op::AttnLse`], [`Op::Attention`],
/// [`Op::AttentionGrad`]). The operand lists end with the optional operands these flags ask
/// for: the key mask (when `key_mask`), then the step counter (when `dropout` is set).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct AttnSpec {
    /// The heads and where they lie in the operands.
    pub heads: AttnHeads,
    /// `s_ij = scale · Re(c_ij)` or `scale · |c_ij|`.
    pub scale: f64,
    /// How the score is formed from `c = q·kᴴ`.
    pub score: AttnScore,
    /// Key `j > i` is masked for query `i` (top-left aligned, as PyTorch's `tril`).
    pub causal: bool,
    /// An extra operand: the key-padding mask, f32 `[B, S]`; nonzero = ignore that key.
    pub key_mask: bool,
    /// `(p, salt)`: dropout on the attention weights, one keep decision per `(b, h, i, j)`
    /// from [`dropout_keep`]; an extra operand, the i32 step counter.
    pub dropout: Option<(f64, u32)>,
}

impl AttnSpec {
    /// How many optional operands (mask, step) follow the fixed ones.
    pub fn extra_operands(&self) -> usize {
        usize::from(self.key_mask) + usize::from(self.dropout.is_some())
    }
    /// Whether key `j` is masked for query `i` by the causal rule.
    pub fn causal_masked(&self, i: usize, j: usize) -> bool {
        self.causal && j > i
    }
    /// The element index the dropout hash of weight `(b, h, i, j)` is taken at:
    /// `((b·H + h)·T + i)·S + j`, wrapping in u32 as every back end computes it.
    pub fn dropout_index(b: usize, h: usize, i: usize, j: usize, heads: usize, t: usize, s: usize) -> u32 {
        let bh = (b as u32).wrapping_mul(heads as u32).wrapping_add(h as u32);
        bh.wrapping_mul(t as u32).wrapping_add(i as u32).wrapping_mul(s as u32).wrapping_add(j as u32)
    }
}

/// Which gradient an [`Op::AttentionGrad`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum AttnWrt {
    /// `dq`: c64 `[B, T, H·D]`.
    Q,
    /// `dk ‖ dv` along the last axis: c64 `[B, S, H·D + H·Dv]` (autodiff slices the two apart
    /// unless its operands are one packed `k ‖ v`).
    KV,
}

/// The cell of a fused recurrence ([`Op::Recurrence`], [`Op::RecurrenceGrad`]): complextorch's
/// `GRUCell` / `LSTMCell` (complex linear maps, split sigmoid and tanh `f(Re z) + i f(Im z)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum RnnCell {
    /// Gates `r, z, n` (in that order, as `torch.nn.GRU`); state `h`.
    Gru,
    /// Gates `i, f, g, o` (in that order, as `torch.nn.LSTM`); state `h ‖ c`.
    Lstm,
}

impl RnnCell {
    /// Gate blocks `G` of the projections (`[G·H, ..]` weights).
    pub fn gates(self) -> usize {
        match self {
            RnnCell::Gru => 3,
            RnnCell::Lstm => 4,
        }
    }
    /// State blocks `S` per step (`h`, or `h ‖ c`).
    pub fn states(self) -> usize {
        match self {
            RnnCell::Gru => 1,
            RnnCell::Lstm => 2,
        }
    }
}

/// What a fused recurrence computes: its cell, hidden size `H`, direction and whether it
/// starts from a given state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct RnnSpec {
    /// The cell.
    pub cell: RnnCell,
    /// Hidden units `H`.
    pub hidden: usize,
    /// Runs `t = T-1 … 0` (the backward direction of a bidirectional layer).
    pub reverse: bool,
    /// An extra last operand `h0`, c64 `[B, S·H]`: the state before the first step (zeros
    /// without it). Chunked back-propagation through time (`passes::autodiff`) starts each
    /// chunk's recomputation from a checkpointed state this way.
    pub init: bool,
}

impl RnnSpec {
    /// The time index of the `s`-th step of `t` steps.
    pub fn time(&self, s: usize, t: usize) -> usize {
        if self.reverse {
            t - 1 - s
        } else {
            s
        }
    }
    /// Width `2·G·H + S·H` of one step of [`Op::RecurrenceGrad`]'s output.
    pub fn grad_width(&self) -> usize {
        (2 * self.cell.gates() + self.cell.states()) * self.hidden
    }
    /// Operands of [`Op::Recurrence`] (3, or 4 with `h0`).
    pub fn forward_operands(&self) -> usize {
        3 + usize::from(self.init)
    }
    /// Operands of [`Op::RecurrenceGrad`] (5, or 6 with `h0`).
    pub fn grad_operands(&self) -> usize {
        5 + usize::from(self.init)
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
    /// Rows of a table by index: `out[i.., :] = table[idx[i..], :]`. Operands
    /// `[table (V, D) f32/c64 with fixed extents, idx (i32) [..]]`; output `[.., D]` of the
    /// table's dtype. An index outside `0..V` gives a zero row (as `OneHot`'s labels).
    Gather,
    /// The adjoint of [`Op::Gather`] w.r.t. its table: `out[v, :] = Σ_{i: idx[i] = v} src[i.., :]`.
    /// Operands `[src [.., D] f32/c64, idx (i32) [..]]` (idx the shape of `src` without its
    /// last axis); output `(rows, D)`. Indices outside `0..rows` add nothing.
    ScatterAdd { rows: usize },
    /// Inverted-dropout mask (f32, values `0` or `1/(1-p)`), from a counter-based hash of
    /// `(salt, step, element index)` that every back end computes identically
    /// (see `crate::ir::dropout_keep`). Operands: `[step (i32 scalar state)]`.
    DropoutMask { p: f64, salt: u32 },
    /// Log-sum-exp of the attention scores of each query row: `lse_i = log Σ_j exp(s_ij)` over
    /// the unmasked keys `j`, with `s_ij` as [`AttnSpec`] says. Operands `[q (c64 [B, T, ..]),
    /// k (c64 [B, S, ..]), (mask f32 [B, S])]`, heads where [`AttnHeads`] says; output f32
    /// `[B, H, T]`. A row whose keys are
    /// all masked has `lse = 0` (never `+inf`), and [`Op::Attention`] gives it output 0.
    /// A helper of `Attention`: it receives no gradient (see `Attention`). Dropout acts after
    /// the softmax, so `spec.dropout` is ignored here and there is no step operand.
    AttnLse { spec: AttnSpec },
    /// Softmax attention from a precomputed `lse`: `o_i = Σ_j keep_ij · p_ij · v_j` with
    /// `p_ij = exp(s_ij − lse_i)` over unmasked keys and `keep_ij = dropout_keep(p, salt,
    /// step, idx)/(1−p)` (1 without dropout; `idx` from [`AttnSpec::dropout_index`]).
    /// Operands `[q, k, v (c64 [B, S, ..]), lse (f32 [B, H, T]), (mask), (step)]`; output
    /// c64 `[B, T, H·Dv]` (head-major columns, as torch's `transpose(1, 2).reshape`). Its gradient is the full derivative of softmax attention w.r.t.
    /// `q`, `k` and `v` (through [`Op::AttentionGrad`]); `lse` gets none. Never stores the
    /// `[T, S]` weights: one kernel, blocked over keys.
    Attention { spec: AttnSpec },
    /// Gradients of [`Op::Attention`] (p̃ = keep·p): `dV_j = Σ_i p̃_ij dO_i`,
    /// `dP_ij = keep_ij · Re(Σ_d dO_id conj(v_jd))`, `δ_i = Re(Σ_d dO_id conj(o_id))`,
    /// `dS_ij = p_ij (dP_ij − δ_i)`; real score: `dq_i = scale Σ_j dS_ij k_j`,
    /// `dk_j = scale Σ_i dS_ij q_i`; abs score with `g_ij = scale dS_ij c_ij/|c_ij|` (0 where
    /// `c = 0`): `dq_i = Σ_j g_ij k_j`, `dk_j = Σ_i conj(g_ij) q_i`.
    /// Operands `[q, k, v, o, d_o (c64 [B, T, H·Dv]), lse, (mask), (step)]`; output `dq` c64
    /// `[B, T, H·D]` (`wrt = Q`) or `dk ‖ dv` c64 `[B, S, H·D + H·Dv]` (`wrt = KV`).
    AttentionGrad { spec: AttnSpec, wrt: AttnWrt },
    /// A recurrence over the time axis (a loop of `T` steps, never unrolled). Operands
    /// `[xp (c64 [B, T, G·H]), w_hh (c64 [G·H, H]), b_hh (c64 [G·H]), (h0 (c64 [B, S·H]))]`:
    /// `xp` is the input projection `x·W_ihᵀ + b_ih` of every step (one batched matmul outside
    /// the loop); `h0` (when `spec.init`) the state before the first step. Step `s` at time
    /// `t = spec.time(s, T)` forms `gh = W_hh·h_prev + b_hh` from the previous step's state
    /// (before the first: `h0`, or zero without it), then the cell: GRU `r = σ(x_r + gh_r)`,
    /// `z = σ(x_z + gh_z)`, `n = tanh(x_n + r·gh_n)`, `h = (1 − z)·n + z·h_prev`; LSTM
    /// `i, f, o = σ(x + gh)`, `g = tanh(x_g + gh_g)`, `c = f·c_prev + i·g`, `h = o·tanh(c)`;
    /// `σ`/`tanh` split (`f(Re) + i f(Im)`), products complex. Output c64 `[B, T, S·H]`:
    /// the state after each step (`h`, or `h ‖ c`). Its gradient is [`Op::RecurrenceGrad`].
    Recurrence { spec: RnnSpec },
    /// Back-propagation through time of [`Op::Recurrence`]: the steps in reverse order,
    /// gates recomputed from the stored states. Operands `[xp, w_hh, b_hh, hs (the forward
    /// output), dhs (its gradient), (h0)]`; output c64 `[B, T, 2·G·H + S·H]`: per step the
    /// gradient of the input projection `dx` (`G·H`), of the hidden projection `dgh` (`G·H`;
    /// differs from `dx` only in GRU's `n` block, `dx_n·conj(r)`) and the total gradient of the
    /// state after the step (`S·H`: `dhs` plus what the later steps carry back). With `h0`
    /// (`spec.init`) the state part of the last step's row (`t = T-1`, or `t = 0` reversed),
    /// whose value there is just `dhs`, holds instead the gradient of `h0`: what the first step
    /// carries back, `W_hhᴴ·dgh` plus the cell's direct share. `dW_hh` and `db_hh` are ordinary
    /// reductions of `dgh` outside the loop (see `passes::autodiff`).
    RecurrenceGrad { spec: RnnSpec },
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
    /// `Fft`, `OneHot`, `Gather`, `ScatterAdd`, `DropoutMask`.
    Movement,
    /// The matmul/convolution family.
    Contraction,
    /// Fused attention (`AttnLse`, `Attention`, `AttentionGrad`): a contraction of its own
    /// kind, each one kernel that never stores the `[T, S]` weights; never fused with others.
    Attention,
    /// A fused recurrence (`Recurrence`, `RecurrenceGrad`): a loop over the time axis in one
    /// kernel; never fused with others.
    Recurrence,
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
            | Op::Gather
            | Op::ScatterAdd { .. }
            | Op::DropoutMask { .. }
            | Op::AttnLse { .. }
            | Op::Attention { .. }
            | Op::AttentionGrad { .. }
            | Op::Recurrence { .. }
            | Op::RecurrenceGrad { .. }
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
            | Op::Gather
            | Op::ScatterAdd { .. }
            | Op::DropoutMask { .. } => OpClass::Movement,
            Op::MatMul { .. }
            | Op::Conv2d { .. }
            | Op::ConvTranspose2d { .. }
            | Op::Conv2dWeightGrad { .. } => OpClass::Contraction,
            Op::AttnLse { .. } | Op::Attention { .. } | Op::AttentionGrad { .. } => OpClass::Attention,
            Op::Recurrence { .. } | Op::RecurrenceGrad { .. } => OpClass::Recurrence,
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
            Op::Gather => "gather".into(),
            Op::ScatterAdd { .. } => "scatter_add".into(),
            Op::DropoutMask { .. } => "dropout_mask".into(),
            Op::AttnLse { .. } => "attn_lse".into(),
            Op::Attention { .. } => "attention".into(),
            Op::AttentionGrad { .. } => "attention_grad".into(),
            Op::Recurrence { .. } => "recurrence".into(),
            Op::RecurrenceGrad { .. } => "recurrence_grad".into(),
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
