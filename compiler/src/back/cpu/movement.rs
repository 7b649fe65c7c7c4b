//! Data movement on the CPU: strided copies (expand, permute, slice, pad, concat) and FFTs,
//! with their extents, strides and offsets resolved from the IR.

use super::{words, CpuCall, NodeCtx};
use crate::error::{CompileError, CompileResult};
use crate::ir::FftNorm;

/// Largest rank a strided copy handles.
pub const MAX_RANK: usize = 8;

/// Row-major strides (in elements) of `shape`.
pub fn strides(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc *= shape[i] as isize;
    }
    s
}

/// A strided copy: for every index of `shape`, `dst[Σ i·dst_strides] = src[Σ i·src_strides]`,
/// elements of `src_words` f32 words widened to `dst_words` (a real source written into a
/// complex destination gets a zero imaginary part). Strides are in elements; offsets in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StridedCopy {
    /// Extents iterated (rank at most [`MAX_RANK`]).
    pub shape: Vec<usize>,
    /// Source byte offset in the arena.
    pub src: usize,
    /// Source strides (elements; 0 broadcasts).
    pub src_strides: Vec<isize>,
    /// Destination byte offset in the arena.
    pub dst: usize,
    /// Destination strides (elements).
    pub dst_strides: Vec<isize>,
    /// f32 words per source element (1 real/i32, 2 complex).
    pub src_words: usize,
    /// f32 words per destination element.
    pub dst_words: usize,
}

/// A transform along `axis` of a row-major c64 tensor of `shape`, scaled by `scale`.
#[derive(Clone, Debug, PartialEq)]
pub struct FftCall {
    /// Extents of input and output.
    pub shape: Vec<usize>,
    /// The transformed axis.
    pub axis: usize,
    /// Sign `+` (inverse) instead of `-`.
    pub inverse: bool,
    /// Scale applied to every output element (from the norm).
    pub scale: f64,
    /// Input byte offset.
    pub src: usize,
    /// Output byte offset.
    pub dst: usize,
}

/// The output shape of the node, checked against [`MAX_RANK`].
fn out_shape(cx: &NodeCtx) -> CompileResult<Vec<usize>> {
    let s = cx.shape(cx.v);
    if s.len() > MAX_RANK {
        return Err(CompileError::user_at(
            cx.graph().span(cx.v),
            format!(
                "a rank-{} tensor is moved here; the CPU back end moves tensors of rank at most {MAX_RANK}",
                s.len()
            ),
        ));
    }
    Ok(s)
}

/// A copy of operand 0 read through `src_strides` at byte offset `src` into the whole output.
fn copy_into_output(cx: &NodeCtx, src: usize, src_strides: Vec<isize>) -> CompileResult<StridedCopy> {
    let x = cx.input(0)?;
    let shape = out_shape(cx)?;
    Ok(StridedCopy {
        dst_strides: strides(&shape),
        shape,
        src,
        src_strides,
        dst: cx.offset(cx.v)?,
        src_words: words(cx.complex(x)),
        dst_words: words(cx.complex(cx.v)),
    })
}

pub(super) fn expand(cx: &NodeCtx) -> CompileResult<StridedCopy> {
    let x = cx.input(0)?;
    let (xs, os) = (cx.shape(x), out_shape(cx)?);
    let xst = strides(&xs);
    // Leading axes the input lacks, and its extent-1 axes, repeat: stride 0.
    let lead = os.len() - xs.len();
    let st = (0..os.len()).map(|d| if d < lead || xs[d - lead] == 1 { 0 } else { xst[d - lead] }).collect();
    copy_into_output(cx, cx.offset(x)?, st)
}

pub(super) fn permute(cx: &NodeCtx, perm: &[usize]) -> CompileResult<StridedCopy> {
    let x = cx.input(0)?;
    let xst = strides(&cx.shape(x));
    copy_into_output(cx, cx.offset(x)?, perm.iter().map(|&q| xst[q]).collect())
}

pub(super) fn slice(cx: &NodeCtx, axis: usize, start: usize) -> CompileResult<StridedCopy> {
    let x = cx.input(0)?;
    let xst = strides(&cx.shape(x));
    let src = cx.offset(x)? + start * xst[axis] as usize * words(cx.complex(x)) * 4;
    copy_into_output(cx, src, xst)
}

pub(super) fn pad(cx: &NodeCtx, axis: usize, before: usize) -> CompileResult<CpuCall> {
    let x = cx.input(0)?;
    let xs = cx.shape(x);
    let contiguous = strides(&out_shape(cx)?);
    let ow = words(cx.complex(cx.v));
    let out = cx.offset(cx.v)?;
    Ok(CpuCall::Pad {
        out,
        bytes: cx.node().ty.bytes(cx.program.plan.batch),
        copy: StridedCopy {
            src_strides: strides(&xs),
            shape: xs,
            src: cx.offset(x)?,
            dst: out + before * contiguous[axis] as usize * ow * 4,
            dst_strides: contiguous,
            src_words: words(cx.complex(x)),
            dst_words: ow,
        },
    })
}

pub(super) fn concat(cx: &NodeCtx, axis: usize) -> CompileResult<Vec<StridedCopy>> {
    let contiguous = strides(&out_shape(cx)?);
    let ow = words(cx.complex(cx.v));
    let out = cx.offset(cx.v)?;
    let mut pieces = Vec::new();
    let mut at = 0usize;
    for &x in &cx.node().inputs {
        let xs = cx.shape(x);
        pieces.push(StridedCopy {
            src_strides: strides(&xs),
            shape: xs.clone(),
            src: cx.offset(x)?,
            dst: out + at * contiguous[axis] as usize * ow * 4,
            dst_strides: contiguous.clone(),
            src_words: words(cx.complex(x)),
            dst_words: ow,
        });
        at += xs[axis];
    }
    Ok(pieces)
}

pub(super) fn fft(cx: &NodeCtx, axis: usize, inverse: bool, norm: FftNorm) -> CompileResult<FftCall> {
    let shape = cx.shape(cx.v);
    let scale = norm.scale(shape[axis], inverse);
    Ok(FftCall { shape, axis, inverse, scale, src: cx.offset(cx.input(0)?)?, dst: cx.offset(cx.v)? })
}
