//! Contractions on the CPU: the operands, extents and offsets of matmuls and convolutions,
//! resolved from the IR for the runtime's packed GEMM.

use super::{words, NodeCtx};
use crate::error::CompileResult;
use crate::ir::ConvGeom;

/// A strided matrix operand in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatOperand {
    /// Byte offset of element `(0, 0)`.
    pub offset: usize,
    /// Row stride, in elements.
    pub rs: isize,
    /// Column stride, in elements.
    pub cs: isize,
    /// Whether elements are complex.
    pub complex: bool,
    /// Whether to conjugate the elements.
    pub conj: bool,
}

/// `c = a · b` for `a` m×k, `b` k×n (transposes folded into the strides); `c` is row-major.
/// A batched product repeats this `batch` times, stepping each operand by its batch stride
/// (0: the same matrix for every batch); with `sum_batch` the products add up into one `c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatMulCall {
    /// Rows of the output.
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// Contracted extent.
    pub k: usize,
    /// Left operand.
    pub a: MatOperand,
    /// Right operand.
    pub b: MatOperand,
    /// Output byte offset.
    pub c: usize,
    /// Whether the output is complex.
    pub c_complex: bool,
    /// Number of products (1: a single matrix product).
    pub batch: usize,
    /// Elements between consecutive batches of `a`, `b` and `c` (0: reused).
    pub batch_strides: [usize; 3],
    /// Whether the `batch` products are summed into `c` (its batch stride is then 0).
    pub sum_batch: bool,
}

/// Resolved extents of one convolution: input `(n, c, h, w)`, weight `(o, cg, kh, kw)`,
/// output `(ho, wo)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvShape {
    /// Input extents.
    pub x: [usize; 4],
    /// Weight extents.
    pub w: [usize; 4],
    /// Output height and width.
    pub out: [usize; 2],
    /// Geometry.
    pub geom: ConvGeom,
}

impl ConvShape {
    /// Rows of the im2col matrix of one group: `cg·kh·kw`.
    pub fn k(&self) -> usize {
        self.w[1] * self.w[2] * self.w[3]
    }
    /// Columns of the im2col matrix: `ho·wo`.
    pub fn p(&self) -> usize {
        self.out[0] * self.out[1]
    }
    /// Whether the convolution is a plain 1×1, stride-1, unpadded channel mix (no im2col).
    pub fn pointwise(&self) -> bool {
        let g = self.geom;
        self.w[2] == 1 && self.w[3] == 1 && g.stride == [1, 1] && g.pad == [0, 0]
    }
    /// Output channels per group.
    pub fn og(&self) -> usize {
        self.w[0] / self.geom.groups
    }
}

/// Which operands of a convolution are complex, and their conjugation flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTypes {
    /// Input (`x`, or `dy` for the transpose) is complex.
    pub x: bool,
    /// Weight (or `dy` for the weight gradient) is complex.
    pub w: bool,
    /// Conjugation flags as the op carries them (operand 0, operand 1).
    pub conj: [bool; 2],
}

/// One convolution-family call. The roles of `x`, `w`, `y` per call kind are listed on
/// [`super::CpuCall`]; `shape` always describes the forward convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvCall {
    /// Extents of the forward convolution.
    pub shape: ConvShape,
    /// Operand types.
    pub types: ConvTypes,
    /// Byte offset of operand 0.
    pub x: usize,
    /// Byte offset of operand 1.
    pub w: usize,
    /// Byte offset of the result.
    pub y: usize,
    /// f32 words per result element.
    pub out_words: usize,
}

pub(super) fn matmul(
    cx: &NodeCtx,
    trans: [bool; 2],
    conj: [bool; 2],
    sum_batch: bool,
) -> CompileResult<MatMulCall> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let (sa, sb) = (cx.shape(a), cx.shape(b));
    let last2 = |s: &[usize]| [s[s.len() - 2], s[s.len() - 1]];
    let (a2, b2) = (last2(&sa), last2(&sb));
    let (m, k) = if trans[0] { (a2[1], a2[0]) } else { (a2[0], a2[1]) };
    let n = if trans[1] { b2[0] } else { b2[1] };
    // Row-major storage: transposing swaps the strides.
    let (ars, acs) = if trans[0] { (1, a2[1] as isize) } else { (a2[1] as isize, 1) };
    let (brs, bcs) = if trans[1] { (1, b2[1] as isize) } else { (b2[1] as isize, 1) };
    // A 2-D operand is broadcast over the other's batch axes: batch stride 0.
    let batch_of = |s: &[usize]| s[..s.len() - 2].iter().product::<usize>();
    let stride = |s: &[usize], two: [usize; 2]| if s.len() == 2 { 0 } else { two[0] * two[1] };
    let call = MatMulCall {
        m,
        n,
        k,
        a: MatOperand { offset: cx.offset(a)?, rs: ars, cs: acs, complex: cx.complex(a), conj: conj[0] },
        b: MatOperand { offset: cx.offset(b)?, rs: brs, cs: bcs, complex: cx.complex(b), conj: conj[1] },
        c: cx.offset(cx.v)?,
        c_complex: cx.complex(cx.v),
        batch: batch_of(&sa).max(batch_of(&sb)),
        batch_strides: [stride(&sa, a2), stride(&sb, b2), if sum_batch { 0 } else { m * n }],
        sum_batch,
    };
    Ok(fold_batch(call))
}

/// Folds the batch of a product into one larger product where the memory layout allows:
/// into `m` when `a`'s rows continue from one batch to the next and `b` is shared (a
/// non-transposed `[P.., m, k]` times a 2-D weight), into `k` when summed products step
/// through `a`'s columns and `b`'s rows contiguously (`Σ_P aᵀ·b` of two row-major operands:
/// a broadcast weight's gradient). Otherwise the runtime loops over the batch.
fn fold_batch(mut c: MatMulCall) -> MatMulCall {
    if c.batch <= 1 {
        return MatMulCall { batch: 1, batch_strides: [0, 0, 0], sum_batch: false, ..c };
    }
    let [sa, sb, sc] = c.batch_strides.map(|s| s as isize);
    let (m, k) = (c.m as isize, c.k as isize);
    if !c.sum_batch && sb == 0 && sa == m * c.a.rs && sc == m * c.n as isize {
        c.m *= c.batch;
    } else if c.sum_batch && sa == k * c.a.cs && sb == k * c.b.rs {
        c.k *= c.batch;
    } else {
        return c;
    }
    MatMulCall { batch: 1, batch_strides: [0, 0, 0], sum_batch: false, ..c }
}

pub(super) fn conv(cx: &NodeCtx, geom: ConvGeom, conj: [bool; 2]) -> CompileResult<ConvCall> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let o = cx.dims4(cx.v)?;
    let shape = ConvShape { x: cx.dims4(x)?, w: cx.dims4(w)?, out: [o[2], o[3]], geom };
    let types = ConvTypes { x: cx.complex(x), w: cx.complex(w), conj };
    conv_call(cx, shape, types, x, w)
}

pub(super) fn conv_transpose(cx: &NodeCtx, geom: ConvGeom, conj: [bool; 2]) -> CompileResult<ConvCall> {
    let (dy, w) = (cx.input(0)?, cx.input(1)?);
    let d = cx.dims4(dy)?;
    let shape = ConvShape { x: cx.dims4(cx.v)?, w: cx.dims4(w)?, out: [d[2], d[3]], geom };
    let types = ConvTypes { x: cx.complex(dy), w: cx.complex(w), conj };
    conv_call(cx, shape, types, dy, w)
}

pub(super) fn weight_grad(cx: &NodeCtx, geom: ConvGeom, conj: [bool; 2]) -> CompileResult<ConvCall> {
    let (x, dy) = (cx.input(0)?, cx.input(1)?);
    let d = cx.dims4(dy)?;
    let shape = ConvShape { x: cx.dims4(x)?, w: cx.dims4(cx.v)?, out: [d[2], d[3]], geom };
    let types = ConvTypes { x: cx.complex(x), w: cx.complex(dy), conj };
    conv_call(cx, shape, types, x, dy)
}

fn conv_call(
    cx: &NodeCtx,
    shape: ConvShape,
    types: ConvTypes,
    a: crate::ir::Value,
    b: crate::ir::Value,
) -> CompileResult<ConvCall> {
    Ok(ConvCall {
        shape,
        types,
        x: cx.offset(a)?,
        w: cx.offset(b)?,
        y: cx.offset(cx.v)?,
        out_words: words(cx.complex(cx.v)),
    })
}
