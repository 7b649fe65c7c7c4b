//! Data movement on the CPU: strided copies (expand, permute, slice, pad, concat), one-hot,
//! row gathers and scatter-adds, dropout masks. Shapes are resolved at load; nothing here allocates.

pub use cvc_compiler::back::cpu::{strides, RowsCall, StridedCopy, MAX_RANK};

/// Runs `c` over the arena at `base`.
///
/// # Safety
/// The offsets and strides must stay inside the arena.
pub unsafe fn copy(c: &StridedCopy, base: *mut u8) {
    let rank = c.shape.len();
    let total: usize = c.shape.iter().product();
    if total == 0 {
        return;
    }
    let src = base.add(c.src) as *const u32;
    let dst = base.add(c.dst) as *mut u32;
    let mut idx = [0usize; MAX_RANK];
    let (mut so, mut d) = (0isize, 0isize);
    let inner = if rank == 0 { 1 } else { c.shape[rank - 1] };
    let (sis, dis) = if rank == 0 { (0, 0) } else { (c.src_strides[rank - 1], c.dst_strides[rank - 1]) };
    let (sw, dw) = (c.src_words as isize, c.dst_words as isize);
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
            so += c.src_strides[ax];
            d += c.dst_strides[ax];
            if idx[ax] < c.shape[ax] {
                break;
            }
            so -= c.src_strides[ax] * c.shape[ax] as isize;
            d -= c.dst_strides[ax] * c.shape[ax] as isize;
            idx[ax] = 0;
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

/// `out[i, :] = table[idx[i], :]`; an index outside the table gives a zero row.
///
/// # Safety
/// The call's offsets must address `rows·row_words` f32 of table, `n` i32 indices and
/// `n·row_words` f32 of output, the output overlapping neither.
pub unsafe fn gather_rows(base: *mut u8, r: &RowsCall) {
    let t = base.add(r.src) as *const f32;
    let ix = base.add(r.idx) as *const i32;
    let o = base.add(r.out) as *mut f32;
    let w = r.row_words;
    for i in 0..r.n {
        let row = *ix.add(i);
        let dst = o.add(i * w);
        if row >= 0 && (row as usize) < r.rows {
            std::ptr::copy_nonoverlapping(t.add(row as usize * w), dst, w);
        } else {
            std::ptr::write_bytes(dst, 0, w);
        }
    }
}

/// `out = 0`, then `out[idx[i], :] += src[i, :]` in index order (indices outside `0..rows`
/// add nothing).
///
/// # Safety
/// The call's offsets must address `n·row_words` f32 of source, `n` i32 indices and
/// `rows·row_words` f32 of output, the output overlapping neither.
pub unsafe fn scatter_add_rows(base: *mut u8, r: &RowsCall) {
    let s = base.add(r.src) as *const f32;
    let ix = base.add(r.idx) as *const i32;
    let o = base.add(r.out) as *mut f32;
    let w = r.row_words;
    std::ptr::write_bytes(o, 0, r.rows * w);
    for i in 0..r.n {
        let row = *ix.add(i);
        if row >= 0 && (row as usize) < r.rows {
            let (src, dst) = (s.add(i * w), o.add(row as usize * w));
            for k in 0..w {
                *dst.add(k) += *src.add(k);
            }
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
