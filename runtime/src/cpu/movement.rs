//! Data movement on the CPU: strided copies (expand, permute, slice, pad, concat), one-hot,
//! dropout masks. Shapes are resolved at load; nothing here allocates.

/// Largest rank a movement op handles (shapes are checked at load).
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
/// elements of `src_f32` floats widened to `dst_f32` floats (a real source written into a
/// complex destination gets a zero imaginary part). Strides are in elements.
#[derive(Clone, Debug)]
pub struct StridedCopy {
    /// Extents iterated.
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

impl StridedCopy {
    /// Runs the copy over the arena at `base`.
    ///
    /// # Safety
    /// The offsets and strides must stay inside the arena.
    pub unsafe fn run(&self, base: *mut u8) {
        let rank = self.shape.len();
        let total: usize = self.shape.iter().product();
        if total == 0 {
            return;
        }
        let src = base.add(self.src) as *const u32;
        let dst = base.add(self.dst) as *mut u32;
        let mut idx = [0usize; MAX_RANK];
        let (mut so, mut d) = (0isize, 0isize);
        let inner = if rank == 0 { 1 } else { self.shape[rank - 1] };
        let (sis, dis) =
            if rank == 0 { (0, 0) } else { (self.src_strides[rank - 1], self.dst_strides[rank - 1]) };
        let (sw, dw) = (self.src_words as isize, self.dst_words as isize);
        let mut done = 0;
        while done < total {
            for j in 0..inner as isize {
                let s = src.offset((so + j * sis) * sw);
                let t = dst.offset((d + j * dis) * dw);
                *t = *s;
                if dw == 2 {
                    *t.add(1) = if sw == 2 { *s.add(1) } else { 0 };
                }
            }
            done += inner;
            // Advance the odometer over the outer axes.
            let mut ax = rank.saturating_sub(1);
            while ax > 0 {
                ax -= 1;
                idx[ax] += 1;
                so += self.src_strides[ax];
                d += self.dst_strides[ax];
                if idx[ax] < self.shape[ax] {
                    break;
                }
                so -= self.src_strides[ax] * self.shape[ax] as isize;
                d -= self.dst_strides[ax] * self.shape[ax] as isize;
                idx[ax] = 0;
            }
        }
    }
}

/// Zero-fills `bytes` bytes at `offset`.
///
/// # Safety
/// The range must lie inside the arena.
pub unsafe fn zero(base: *mut u8, offset: usize, bytes: usize) {
    std::ptr::write_bytes(base.add(offset), 0, bytes);
}

/// One-hot rows: `out[r, c] = (labels[r] == c)` for `rows` labels.
///
/// # Safety
/// Offsets must address `rows` i32 labels and `rows·classes` f32 outputs.
pub unsafe fn one_hot(base: *mut u8, labels: usize, out: usize, rows: usize, classes: usize) {
    let l = base.add(labels) as *const i32;
    let o = base.add(out) as *mut f32;
    std::ptr::write_bytes(o, 0, rows * classes);
    for r in 0..rows {
        let c = *l.add(r);
        if c >= 0 && (c as usize) < classes {
            *o.add(r * classes + c as usize) = 1.0;
        }
    }
}

/// Inverted-dropout mask: `1/(1-p)` where [`cvc_compiler::ir::dropout_keep`] keeps the element.
///
/// # Safety
/// `step` addresses one i32; `out` addresses `n` f32.
pub unsafe fn dropout_mask(base: *mut u8, step: usize, out: usize, n: usize, p: f64, salt: u32) {
    let s = *(base.add(step) as *const i32) as u32;
    let o = base.add(out) as *mut f32;
    let scale = (1.0 / (1.0 - p)) as f32;
    for i in 0..n {
        let keep = cvc_compiler::ir::dropout_keep(p, salt, s, i as u32);
        *o.add(i) = if keep { scale } else { 0.0 };
    }
}
