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
    let r = shape.len();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let mut idx = vec![0usize; r];
    let mut cur = base;
    for _ in 0..n {
        out.push(cur);
        for a in (0..r).rev() {
            idx[a] += 1;
            cur += stride[a];
            if idx[a] < shape[a] {
                break;
            }
            cur -= stride[a] * shape[a];
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

/// NumPy broadcast of two resolved shapes.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let r = a.len().max(b.len());
    let get = |s: &[usize], i: usize| if i + s.len() >= r { s[i + s.len() - r] } else { 1 };
    (0..r)
        .map(|i| match (get(a, i), get(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        })
        .collect()
}
