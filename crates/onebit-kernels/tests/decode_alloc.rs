//! Decode does not allocate: once a thread has run a one-token matmul (and
//! `matmul_many`) of each shape, running them again allocates nothing, on
//! the calling thread or on the pool's workers; nor do matmuls of 2 to 7
//! rows (a batched decode step, a verify). A counting global allocator
//! (this test binary only) checks it; this file holds a single test so no
//! other test allocates while it counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use onebit_formats::{ByteView, GgmlType};
use onebit_kernels::{matmul, matmul_many, Pool, Precision, QMatrix};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; the
// counter is an atomic add with no other effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` came from `System`; the caller's contract is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A matrix of `t` with sane f16 scales (0.01) and pseudo-random codes.
fn matrix(t: GgmlType, rows: usize, cols: usize, seed: u64) -> QMatrix {
    let bytes = t.row_bytes(cols as u64).unwrap() as usize * rows;
    let mut z = seed;
    let mut data: Vec<u8> = (0..bytes)
        .map(|_| {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1);
            (z >> 56) as u8
        })
        .collect();
    let scales: &[usize] = match t {
        GgmlType::Q4K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[0],
    };
    let half = 0x211Eu16.to_le_bytes(); // f16, about 0.01
    for b in data.chunks_exact_mut(t.block_bytes()) {
        for &at in scales {
            b[at..at + 2].copy_from_slice(&half);
        }
    }
    QMatrix::new(t, rows, cols, ByteView::from_vec(data)).unwrap()
}

#[test]
fn one_token_matmuls_allocate_nothing_once_warm() {
    let pool = Pool::new(2);
    let cols = 512;
    let ws: Vec<QMatrix> = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::F32,
    ]
    .into_iter()
    .enumerate()
    .map(|(i, t)| matrix(t, 200 + 8 * i, cols, i as u64 + 1))
    .collect();
    // q/k/v-like: three matrices sharing Q8_0 activations.
    let many = [
        matrix(GgmlType::Q4_0, 96, cols, 11),
        matrix(GgmlType::Q5_0, 40, cols, 12),
        matrix(GgmlType::Q8_0, 40, cols, 13),
    ];
    let x: Vec<f32> = (0..cols).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
    let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; w.rows]).collect();
    let mut many_outs: Vec<Vec<f32>> = many.iter().map(|w| vec![0f32; w.rows]).collect();
    let refs: Vec<&QMatrix> = many.iter().collect();
    let step = |outs: &mut [Vec<f32>], many_outs: &mut [Vec<f32>]| {
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            matmul(&pool, Precision::Quantized, w, &x, 1, o);
        }
        let [a, b, c] = many_outs else { unreachable!() };
        let mut o: [&mut [f32]; 3] = [a, b, c];
        matmul_many(&pool, Precision::Quantized, &refs, &x, 1, &mut o);
    };
    // Warm: repacked copies, this thread's scratch buffers.
    step(&mut outs, &mut many_outs);
    step(&mut outs, &mut many_outs);
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..3 {
        step(&mut outs, &mut many_outs);
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(
        after - before,
        0,
        "one-token matmuls allocated {} times in 3 warm steps",
        after - before
    );
    // The outputs are real dot products, not left untouched.
    assert!(outs
        .iter()
        .chain(&many_outs)
        .all(|o| o.iter().any(|&v| v != 0.0)));

    // A batched decode step or a speculative verify: 2 to 7 rows run the
    // few-row kernels, which allocate nothing either. (Q8_0 runs its wide
    // kernel from 4 rows, whose per-call expansion buffer is allocated, so
    // it takes part with 2 and 3 rows only; from 8 rows the activations are
    // quantized in parallel parts, also allocated.)
    let xs: Vec<f32> = (0..7 * cols)
        .map(|i| (i % 23) as f32 / 11.0 - 1.0)
        .collect();
    let mut few_outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; 7 * w.rows]).collect();
    let few_step = |few_outs: &mut [Vec<f32>]| {
        for n in 2..=7 {
            for (w, o) in ws.iter().zip(few_outs.iter_mut()) {
                if w.dtype == GgmlType::Q8_0 && n >= 4 {
                    continue;
                }
                let (x, o) = (&xs[..n * cols], &mut o[..n * w.rows]);
                matmul(&pool, Precision::Quantized, w, x, n, o);
            }
        }
    };
    few_step(&mut few_outs);
    few_step(&mut few_outs);
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..3 {
        few_step(&mut few_outs);
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(
        after - before,
        0,
        "few-row matmuls (2 to 7 rows) allocated {} times in 3 warm steps",
        after - before
    );
    assert!(few_outs.iter().all(|o| o.iter().any(|&v| v != 0.0)));
}
