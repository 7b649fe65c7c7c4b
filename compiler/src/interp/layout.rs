//! Index arithmetic of the interpreter: strides, broadcasting and strided views as gather lists.

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The flat offsets `base + Σ idx[a]·stride[a]` of every multi-index of `shape`, row-major.
pub fn strided_offsets(shape: &[usize], stride: &[usize], base: usize) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let Some((&inner, outer)) = shape.split_last() else {
        out.push(base);
        return out;
    };
    let step = stride[outer.len()];
    let mut idx = vec![0usize; outer.len()];
    let mut cur = base;
    for _ in 0..n / inner {
        // One run along the last axis (a `while` loop: cheap in debug builds too).
        let mut k = 0;
        let mut at = cur;
        while k < inner {
            out.push(at);
            at += step;
            k += 1;
        }
        let mut a = outer.len();
        while a > 0 {
            a -= 1;
            idx[a] += 1;
            cur += stride[a];
            if idx[a] < outer[a] {
                break;
            }
            cur -= stride[a] * outer[a];
            idx[a] = 0;
        }
    }
    out
}

/// For every element of `to` (row-major), the flat index of the element of `from` that
/// NumPy broadcasting reads there. `from` must broadcast to `to`.
pub fn broadcast_map(from: &[usize], to: &[usize]) -> Result<Vec<usize>, String> {
    if from.len() > to.len() {
        return Err(format!("cannot broadcast {from:?} to {to:?}"));
    }
    let off = to.len() - from.len();
    let fs = strides(from);
    let mut st = vec![0usize; to.len()];
    for i in 0..from.len() {
        if from[i] == to[off + i] {
            st[off + i] = fs[i];
        } else if from[i] != 1 {
            return Err(format!("cannot broadcast {from:?} to {to:?}"));
        }
    }
    Ok(strided_offsets(to, &st, 0))
}
