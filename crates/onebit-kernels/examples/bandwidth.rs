//! A read-bandwidth probe: `threads` threads each sum their share of a large
//! array (far larger than any cache), best of several passes, in GB/s. The
//! decode speed limit of a model is this bandwidth over the bytes of weights
//! a token reads (scripts/bench-vs-llamacpp.sh prints that fraction).
//!
//! The array lives where the weights live: an anonymous mapping advised to
//! use 2 MiB pages (`arena.rs`), so the probe pays the same page walks as a
//! decode step. With 4 KiB pages it reads less than the weights stream at
//! (an Intel Xeon VM: 17.8 GB/s from a Vec while a Qwen2.5-1.5B step read
//! its 1.12 GB at about 21), and every "% of the limit" would flatter. The
//! 4 KiB reading is printed too, after the first figure, for comparison.
//!
//! cargo run --release -p onebit-kernels --example bandwidth -- [threads=2] [MiB=1024] [passes=5]
//!
//! Prints one line: `read bandwidth: <GB/s> GB/s (<threads> threads, <MiB>
//! MiB, best of <passes>, <H> MiB in huge pages; 4 KiB pages: <GB/s> GB/s)`.

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

    let before = anon_huge_kib();
    let mut map =
        memmap2::MmapMut::map_anon(n * 8).expect("an anonymous mapping of the probe's size");
    #[cfg(target_os = "linux")]
    {
        // Advice only, as for the weights: without transparent huge pages
        // the mapping keeps 4 KiB pages (the huge-page count below says so).
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    // Written once so every page is mapped before timing.
    for (i, c) in map.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&(i as u64).to_le_bytes());
    }
    let huge_mib = anon_huge_kib().saturating_sub(before) / 1024;
    let words: Vec<&[u8]> = map.chunks(n.div_ceil(threads) * 8).collect();
    let huge = probe(&words, passes, n, sum_bytes);

    let data: Vec<u64> = (0..n as u64).collect();
    let parts: Vec<&[u64]> = data.chunks(n.div_ceil(threads)).collect();
    let small = probe(&parts, passes, n, sum);
    println!(
        "read bandwidth: {huge:.1} GB/s ({threads} threads, {mib} MiB, best of {passes}, \
         {huge_mib} MiB in huge pages; 4 KiB pages: {small:.1} GB/s)"
    );
}

/// Best GB/s over `passes` of every part summed on its own thread; checks
/// the total is the sum of 0..n, so the reads cannot be optimized away.
fn probe<T: Sync + ?Sized>(
    parts: &[&T],
    passes: usize,
    n: usize,
    f: impl Fn(&T) -> u64 + Sync,
) -> f64 {
    let mut best = f64::MAX;
    let mut check = 0u64;
    for _ in 0..passes {
        let t0 = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let f = &f;
            let hs: Vec<_> = parts.iter().map(|&p| s.spawn(move || f(p))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        best = best.min(t0.elapsed().as_secs_f64());
        check = sums.iter().fold(0, |a, &b| a.wrapping_add(b));
    }
    let want = (n as u64).wrapping_mul(n as u64 - 1) / 2;
    assert_eq!(check, want, "the probe's sum is wrong");
    (n * 8) as f64 / best / 1e9
}

/// This process's anonymous memory in transparent huge pages, KiB (0 where
/// the kernel does not say).
fn anon_huge_kib() -> usize {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("AnonHugePages:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Wrapping sum of little-endian u64 words in eight independent lanes.
fn sum_bytes(b: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = b.chunks_exact(64);
    for c in &mut it {
        for (a, w) in acc.iter_mut().zip(c.chunks_exact(8)) {
            *a = a.wrapping_add(u64::from_le_bytes(w.try_into().unwrap()));
        }
    }
    let tail = it.remainder().chunks_exact(8).fold(0u64, |a, w| {
        a.wrapping_add(u64::from_le_bytes(w.try_into().unwrap()))
    });
    acc.iter().fold(tail, |a, &b| a.wrapping_add(b))
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
