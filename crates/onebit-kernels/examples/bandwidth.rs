//! A read-bandwidth probe: `threads` threads each sum their share of a large
//! array (far larger than any cache), best of several passes, in GB/s. The
//! decode speed limit of a model is this bandwidth over the bytes of weights
//! a token reads (scripts/bench-vs-llamacpp.sh prints that fraction).
//!
//! cargo run --release -p onebit-kernels --example bandwidth -- [threads=2] [MiB=1024] [passes=5]
//!
//! Prints one line: `read bandwidth: <GB/s> GB/s (<threads> threads, <MiB> MiB, best of <passes>)`.

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: usize| -> usize {
        args.get(i).map_or(default, |s| {
            s.parse()
                .unwrap_or_else(|_| panic!("argument {i} should be a whole number, got {s:?}"))
        })
    };
    let threads = arg(1, 2).max(1);
    let mib = arg(2, 1024).max(1);
    let passes = arg(3, 5).max(1);
    let n = mib * (1 << 20) / 8;
    // Written once so every page is mapped before timing.
    let data: Vec<u64> = (0..n as u64).collect();
    let per = n.div_ceil(threads);
    let mut best = f64::MAX;
    let mut check = 0u64;
    for _ in 0..passes {
        let t0 = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = data
                .chunks(per)
                .map(|part| s.spawn(move || sum(part)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        best = best.min(t0.elapsed().as_secs_f64());
        check = sums.iter().fold(0, |a, &b| a.wrapping_add(b));
    }
    // The sum of 0..n, so the reads cannot be optimized away unnoticed.
    let want = (n as u64).wrapping_mul(n as u64 - 1) / 2;
    assert_eq!(check, want, "the probe's sum is wrong");
    println!(
        "read bandwidth: {:.1} GB/s ({threads} threads, {mib} MiB, best of {passes})",
        (n * 8) as f64 / best / 1e9
    );
}

/// Wrapping sum in eight independent lanes (the compiler vectorizes it).
fn sum(v: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = v.chunks_exact(8);
    for c in &mut it {
        for (a, x) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*x);
        }
    }
    let tail = it.remainder().iter().fold(0u64, |a, &b| a.wrapping_add(b));
    acc.iter().fold(tail, |a, &b| a.wrapping_add(b))
}
