//! How much arithmetic between loads costs a weight stream its bandwidth:
//! `threads` threads each read their share of a 1 GiB array in 2 MiB pages
//! (as `bandwidth.rs` and the weights), two streams per thread side by side
//! as the AVX-512 pair tiles read groups g and g + 1, and spend `k`
//! `vpdpbusd` on each of two independent chains per 256 bytes read (the
//! one-token Q4_0 pair tile issues 8 `vpdpbusd` and about 34 port-0/5
//! operations per 288 bytes). Prints GB/s for each k, with and without a
//! software prefetch (T1, 2 KiB ahead), best of 5 passes.
//!
//! cargo run --release -p onebit-kernels --example stream_compute -- [threads=2] [k,k,...=0,4,8,12,16] [group bytes=9216] [prefetch distances=0,2048]
//!
//! AVX-512 VNNI only (it says so and exits elsewhere).
//!
//! Intel Xeon VM, 2026-12-05, 2 threads, `bandwidth.rs` 35.2 GB/s just
//! before: without a prefetch the stream loses bandwidth as the arithmetic
//! grows (k = 0, 8, 16, 24: 32.1, 24.4, 20.9, 19.0 GB/s); with the T1
//! prefetch 2 KiB ahead it keeps it (34.5, 33.4, 32.5, 32.0), and with the
//! kernels' own distance (8 KiB) and group (13,824 bytes, a Q4_0 row of
//! 3,072) 32.7 at k = 8 and 33.2 at 16. The one-token Q4_0 and Q4_K pair
//! tiles read a 1.2 GB matrix at 33.7-33.9 GB/s in the same minute
//! (`kernels.rs 2 avx512 1 DRAM`): the kernels stream at the probe's rate,
//! and what a decode step loses to the limit lies around them (a step of
//! a mixture of experts runs about 140 products of 2-5 MB, each chunk of
//! which starts a cold stream), not in their arithmetic. A version whose
//! chains ran through the accumulators timed `vpdpbusd`'s latency instead
//! (k x 4-5 cycles a step) and read as if arithmetic cost bandwidth.

#[cfg(target_arch = "x86_64")]
fn main() {
    use std::time::Instant;
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).map_or(2, |s| s.parse().expect("threads"));
    let ks: Vec<usize> = args.get(2).map_or(vec![0, 4, 8, 12, 16], |s| {
        s.split(',').map(|k| k.parse().expect("k")).collect()
    });
    if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni")) {
        println!("stream_compute needs AVX-512 VNNI; this CPU has not");
        return;
    }
    const BYTES: usize = 1 << 30;
    // Two streams of `group` bytes side by side (default 9,216: an
    // interleaved Q4_0 matrix of 2,048 columns, 8 rows x 1,152 bytes).
    let group: usize = args
        .get(3)
        .map_or(9216, |s| s.parse().expect("group bytes"));
    let pfs: Vec<usize> = args.get(4).map_or(vec![0, 2048], |s| {
        s.split(',')
            .map(|k| k.parse().expect("prefetch distance"))
            .collect()
    });
    let mut map = memmap2::MmapMut::map_anon(BYTES).expect("an anonymous mapping of 1 GiB");
    #[cfg(target_os = "linux")]
    {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    for (i, b) in map.iter_mut().enumerate() {
        *b = i as u8;
    }
    let per = BYTES / threads / (2 * group) * (2 * group);
    for &k in &ks {
        for &pf in &pfs {
            let mut best = f64::MAX;
            let mut check = 0u64;
            for _ in 0..5 {
                let t0 = Instant::now();
                let sums: Vec<u64> = std::thread::scope(|s| {
                    let hs: Vec<_> = (0..threads)
                        .map(|t| {
                            let part = &map[t * per..(t + 1) * per];
                            // SAFETY: AVX-512 F and VNNI were detected above.
                            s.spawn(move || unsafe { run(part, group, k, pf) })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).collect()
                });
                best = best.min(t0.elapsed().as_secs_f64());
                check = sums.iter().fold(check, |a, &b| a.wrapping_add(b));
            }
            println!(
                "k {k:2} vpdpbusd x 2 chains per 256 bytes, prefetch {pf:4}: {:5.1} GB/s ({threads} threads; check {})",
                (per * threads) as f64 / best / 1e9,
                check % 1000
            );
        }
    }
}

/// Reads `part` as pairs of `group`-byte streams, 128 bytes of each per
/// step, with `k` `vpdpbusd` on each of two chains per step; returns a
/// value that depends on every byte, so nothing is optimized away.
///
/// Safety: the CPU has AVX-512 F and VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn run(part: &[u8], group: usize, k: usize, pf: usize) -> u64 {
    use core::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let p = part.as_ptr();
    let mut g = 0;
    while g + 2 * group <= part.len() {
        let (a0, a1) = (p.add(g), p.add(g + group));
        let mut o = 0;
        while o < group {
            if pf > 0 {
                let q = o + pf;
                let lo = if q < group { q } else { group + q };
                for off in [lo, lo + 64] {
                    // A prefetch never faults; `wrapping_add` keeps the
                    // address arithmetic defined past the end.
                    _mm_prefetch::<_MM_HINT_T1>(a0.wrapping_add(off) as *const i8);
                    _mm_prefetch::<_MM_HINT_T1>(a1.wrapping_add(off) as *const i8);
                }
            }
            // SAFETY: o + 128 <= group, and a1 + group <= the part's end.
            let v = [
                _mm512_loadu_si512(a0.add(o) as *const _),
                _mm512_loadu_si512(a0.add(o + 64) as *const _),
                _mm512_loadu_si512(a1.add(o) as *const _),
                _mm512_loadu_si512(a1.add(o + 64) as *const _),
            ];
            // The chains start from this step's loads and use only them:
            // nothing carries from step to step but the four adds, so the
            // core may overlap as many steps as its window holds (a chain
            // through the accumulators would time vpdpbusd's latency
            // instead, k x 4-5 cycles a step).
            let (mut x, mut y) = (v[0], v[2]);
            for _ in 0..k {
                x = _mm512_dpbusd_epi32(x, v[1], v[3]);
                y = _mm512_dpbusd_epi32(y, v[3], v[1]);
            }
            acc[0] = _mm512_add_epi64(acc[0], x);
            acc[1] = _mm512_add_epi64(acc[1], v[1]);
            acc[2] = _mm512_add_epi64(acc[2], y);
            acc[3] = _mm512_add_epi64(acc[3], v[3]);
            o += 128;
        }
        g += 2 * group;
    }
    let mut lanes = [0u64; 8];
    let s = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    _mm512_storeu_si512(lanes.as_mut_ptr() as *mut _, s);
    lanes.iter().fold(0, |a, &b| a.wrapping_add(b))
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("stream_compute is an x86-64 (AVX-512 VNNI) probe");
}
