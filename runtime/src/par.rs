//! Host work of a training step split over threads: at a large batch the loop gathers,
//! stages and counts hundreds of MB per step while the GPU computes (a U-Net at batch 6144
//! moves 700 MB of inputs and counts 25 M pixels), which one thread could not finish within
//! the step's kernels.

/// Bytes below which a copy or count stays on the calling thread (spawning costs more).
const MIN_BYTES_PER_THREAD: usize = 4 << 20;

/// The most threads host work uses: the machine's cores, at most 8 (memory bandwidth is
/// shared; beyond that a copy gets no faster).
fn max_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8)
}

/// Threads for `bytes` of work: one per [`MIN_BYTES_PER_THREAD`], at most [`max_threads`].
pub fn threads_for(bytes: usize) -> usize {
    (bytes / MIN_BYTES_PER_THREAD).clamp(1, max_threads())
}

/// Runs `f(i, item_chunk, out_chunk)` over `threads` contiguous chunks of `items` and the
/// matching chunks of `out` (`per_item` elements of `out` each), on scoped threads (the
/// first chunk on the calling thread).
pub fn zip_chunks<I: Sync, O: Send>(
    items: &[I],
    out: &mut [O],
    per_item: usize,
    threads: usize,
    f: impl Fn(&[I], &mut [O]) + Sync,
) {
    debug_assert_eq!(out.len(), items.len() * per_item);
    let per = items.len().div_ceil(threads.max(1)).max(1);
    if threads <= 1 || items.len() <= per {
        f(items, out);
        return;
    }
    std::thread::scope(|s| {
        let mut pairs = items.chunks(per).zip(out.chunks_mut(per * per_item));
        let first = pairs.next();
        for (i, o) in pairs {
            let f = &f;
            s.spawn(move || f(i, o));
        }
        if let Some((i, o)) = first {
            f(i, o);
        }
    });
}

/// `dst.copy_from_slice(src)` over [`threads_for`] threads.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    let threads = threads_for(src.len());
    copy_with(dst, src, threads);
}

/// `dst.copy_from_slice(src)` over `threads` threads.
pub fn copy_with(dst: &mut [u8], src: &[u8], threads: usize) {
    assert_eq!(dst.len(), src.len(), "copy between slices of different lengths");
    let chunk = src.len().div_ceil(threads.max(1)).max(1);
    let items: Vec<&[u8]> = src.chunks(chunk).collect();
    if items.len() <= 1 {
        dst.copy_from_slice(src);
        return;
    }
    std::thread::scope(|s| {
        let mut pairs = items.iter().zip(dst.chunks_mut(chunk));
        let first = pairs.next();
        for (i, o) in pairs {
            s.spawn(move || o.copy_from_slice(i));
        }
        if let Some((i, o)) = first {
            o.copy_from_slice(i);
        }
    });
}

/// `f` over `threads` contiguous chunks of `items`, each returning a partial result, in
/// chunk order.
pub fn map_chunks<I: Sync, R: Send>(items: &[I], threads: usize, f: impl Fn(&[I]) -> R + Sync) -> Vec<R> {
    let per = items.len().div_ceil(threads.max(1)).max(1);
    if threads <= 1 || items.len() <= per {
        return vec![f(items)];
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = items.chunks(per).skip(1).map(|c| s.spawn(|| f(c))).collect();
        let mut out = vec![f(&items[..per])];
        // A panic in a worker is a bug in `f`: pass it on.
        out.extend(handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))));
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_work_equals_the_single_threaded_work() {
        let src: Vec<u8> = (0..10_007u32).map(|i| (i.wrapping_mul(2654435761u32) >> 13) as u8).collect();
        for threads in [1, 2, 3, 7, 64] {
            let mut dst = vec![0u8; src.len()];
            copy_with(&mut dst, &src, threads);
            assert_eq!(dst, src, "{threads} threads");
            let items: Vec<u32> = (0..101).collect();
            let mut out = vec![0u32; 3 * items.len()];
            zip_chunks(&items, &mut out, 3, threads, |i, o| {
                for (x, o) in i.iter().zip(o.chunks_mut(3)) {
                    o.copy_from_slice(&[*x, 2 * x, 3 * x]);
                }
            });
            assert_eq!(out, items.iter().flat_map(|&x| [x, 2 * x, 3 * x]).collect::<Vec<_>>());
            let sums = map_chunks(&items, threads, |c| c.iter().sum::<u32>());
            assert!(sums.len() <= threads.max(1));
            assert_eq!(sums.iter().sum::<u32>(), items.iter().sum::<u32>());
        }
    }
}
