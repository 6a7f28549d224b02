//! Row-parallel helpers shared by the forward and the mixers: every per-row
//! computation depends only on its own row, so rows split across threads
//! give the same bits as one pass.

use std::sync::Mutex;

use onebit_kernels::Pool;

/// `buf` at length `len`, for a kernel that overwrites every element (what
/// it held before is not cleared).
pub(crate) fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..]
}

/// Calls `f(first_row, parts)` on consecutive blocks of rows of `N`
/// matrices with `n` rows each (`widths[i]` elements per row of `bufs[i]`),
/// the blocks in parallel. A row's result must depend only on that row.
pub(crate) fn par_rows<const N: usize>(
    pool: &Pool,
    n: usize,
    widths: [usize; N],
    bufs: [&mut [f32]; N],
    f: impl Fn(usize, [&mut [f32]; N]) + Sync,
) {
    for (b, w) in bufs.iter().zip(widths) {
        assert_eq!(b.len(), n * w, "par_rows: buffer shape");
    }
    // Rows per block: at least 8 (a block should outweigh a dispatch), about
    // 4 blocks per thread.
    let per = n.div_ceil(pool.threads() * 4).max(8);
    if n <= per || pool.threads() == 1 {
        return f(0, bufs);
    }
    let mut rest = bufs;
    let mut blocks = Vec::with_capacity(n.div_ceil(per));
    for r0 in (0..n).step_by(per) {
        let rows = per.min(n - r0);
        let part: [&mut [f32]; N] = std::array::from_fn(|i| {
            let (a, b) = std::mem::take(&mut rest[i]).split_at_mut(rows * widths[i]);
            rest[i] = b;
            a
        });
        blocks.push(Mutex::new(Some((r0, part))));
    }
    pool.for_each_chunk(blocks.len(), |c| {
        let taken = blocks[c].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((r0, part)) = taken {
            f(r0, part);
        }
    });
}
