//! Matmul kernel speed on random weights: best-of-N time per call (robust on
//! a shared machine), as weight GB/s and int8 GMAC/s.
//!
//! cargo run --release -p onebit-kernels --example kernels -- [threads=1] [isa: scalar|avx2|avx512|neon|dotprod|i8mm] [tokens=1,64,512] [filter]
//!
//! `filter` keeps the cases whose description contains it (e.g. `Qwen`);
//! `vision` times the vision tower's two kernels instead, at SigLIP So400m's
//! 896 px shapes (4,096 patches): `attend_full` over 16 heads of 72 and
//! `f16mm` on the 4304 x 1152 MLP matrix, as GFLOP/s.
//! With 1 thread the line also gives the best on-CPU time of the calling
//! thread (Linux's /proc/thread-self/schedstat): on a loaded machine the
//! wall time includes the time the thread waited for a core, that does not.
//! The kernel updates that count at scheduler ticks (a few ms), so it is
//! only given for calls that ran longer than 2 ms, and the best of several
//! such calls leans low by up to a tick: compare runs, do not quote it
//! alone. The mean over all calls (the ticks average out) follows it.

use std::time::Instant;

use onebit_formats::{ByteView, GgmlType};
use onebit_kernels::attention::{attend_full, AttnShape};
use onebit_kernels::{matmul, F16Matrix, Pool, Precision, QMatrix};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).map_or(1, |s| s.parse().unwrap());
    if let Some(isa) = args.get(2) {
        std::env::set_var("ONEBIT_ISA", isa);
    }
    println!(
        "isa {:?}, {threads} threads",
        onebit_kernels::quant::Isa::best()
    );
    let pool = Pool::new(threads);
    let cases = [
        (GgmlType::Q4_1, 1536, 576, "SmolLM2 ffn up"),
        (GgmlType::Q4_1, 576, 1536, "SmolLM2 ffn down"),
        (GgmlType::Q8_0, 49152, 576, "SmolLM2 output"),
        (GgmlType::Q5_0, 2048, 640, "Gemma ffn up"),
        (GgmlType::Q6K, 640, 2048, "Gemma ffn down"),
        (GgmlType::Q4K, 640, 1024, "Gemma attn out"),
        (GgmlType::Q8_0, 262144, 640, "Gemma output"),
        (GgmlType::Q4K, 1536, 1536, "Qwen1.5B attn q"),
        (GgmlType::Q4K, 8960, 1536, "Qwen1.5B ffn up"),
        (GgmlType::Q6K, 1536, 8960, "Qwen1.5B ffn down"),
        (GgmlType::Q6K, 151936, 1536, "Qwen1.5B output"),
        (GgmlType::Q4_0, 8192, 3072, "Llama3B ffn up"),
        (GgmlType::Q4_0, 196608, 3072, "Llama3B 24 x ffn up (DRAM)"),
        (GgmlType::Q4_1, 196608, 3072, "Q4_1 1.2 GB (DRAM)"),
        (GgmlType::Q5_0, 196608, 3072, "Q5_0 1.3 GB (DRAM)"),
        (GgmlType::Q4K, 196608, 3072, "Q4_K 1.1 GB (DRAM)"),
        (GgmlType::Q6K, 128256, 3072, "Llama3B output"),
        (GgmlType::Q5K, 768, 2048, "Qwen3-30B-A3B expert gate (Q5_K)"),
        (GgmlType::Q5K, 2048, 768, "Qwen3-30B-A3B expert down (Q5_K)"),
        (GgmlType::MXFP4, 2880, 2880, "gpt-oss-20b expert (MXFP4)"),
        (GgmlType::MXFP4, 184320, 2880, "MXFP4 1.0 GB (DRAM)"),
    ];
    let tokens: Vec<usize> = args.get(3).map_or(vec![1, 64, 512], |s| {
        s.split(',').map(|t| t.parse().unwrap()).collect()
    });
    let filter = args.get(4).cloned().unwrap_or_default();
    if filter == "vision" {
        vision(&pool, threads);
        return;
    }
    let mut seed = 1u64;
    for (t, rows, cols, what) in cases {
        if !what.contains(filter.as_str()) {
            continue;
        }
        let bytes = t.row_bytes(cols as u64).unwrap() as usize * rows;
        let mut data: Vec<u8> = (0..bytes)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 56) as u8
            })
            .collect();
        // Sane f16 scales: overwrite every block's first 2 bytes (and Q6_K's
        // d; MXFP4's exponent byte is 2^-1).
        let bb = t.block_bytes();
        for b in data.chunks_exact_mut(bb) {
            if t == GgmlType::MXFP4 {
                b[0] = 127;
                continue;
            }
            let at = if t == GgmlType::Q6K { 208 } else { 0 };
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
        let w = QMatrix::new(t, rows, cols, ByteView::from_vec(data)).unwrap();
        w.prepare(&pool);
        for &n_tok in &tokens {
            let x: Vec<f32> = (0..n_tok * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut out = vec![0f32; n_tok * rows];
            let reps = if n_tok == 1 { 30 } else { 7 };
            let mut best = f64::MAX;
            let mut best_cpu = f64::MAX;
            let mut sum_cpu = 0.0;
            for _ in 0..reps {
                let c0 = cpu_ns();
                let t0 = Instant::now();
                matmul(&pool, Precision::Quantized, &w, &x, n_tok, &mut out);
                best = best.min(t0.elapsed().as_secs_f64());
                if let (Some(a), Some(b)) = (c0, cpu_ns()) {
                    best_cpu = best_cpu.min((b - a) as f64 * 1e-9);
                    sum_cpu += (b - a) as f64 * 1e-9;
                }
            }
            let cpu = if threads == 1 && best_cpu < f64::MAX && best > 0.002 {
                let mean = sum_cpu / reps as f64;
                format!(
                    "  on-CPU {:8.1} us {:6.1} GB/s, mean {:8.1} us {:6.1} GB/s",
                    best_cpu * 1e6,
                    bytes as f64 / best_cpu / 1e9,
                    mean * 1e6,
                    bytes as f64 / mean / 1e9
                )
            } else {
                String::new()
            };
            println!(
                "{what:16} {t:5} {rows:6}x{cols:5} n={n_tok:3}: {:8.1} us  {:6.1} GB/s  {:6.1} GMAC/s{cpu}",
                best * 1e6,
                bytes as f64 / best / 1e9,
                (rows * cols * n_tok) as f64 / best / 1e9
            );
        }
    }
}

/// The vision kernels at SigLIP So400m 896 px: best of 3 wall times, and
/// with one thread the best on-CPU time.
fn vision(pool: &Pool, threads: usize) {
    let n = 4096;
    let (nh, dh) = (16, 72);
    let f = |i: usize| ((i * 7919 % 10007) as f32 / 10007.0 - 0.5) * 2.0;
    let time = |what: &str, flop: f64, run: &mut dyn FnMut()| {
        let (mut best, mut best_cpu) = (f64::MAX, f64::MAX);
        for _ in 0..3 {
            let c0 = cpu_ns();
            let t0 = Instant::now();
            run();
            best = best.min(t0.elapsed().as_secs_f64());
            if let (Some(a), Some(b)) = (c0, cpu_ns()) {
                best_cpu = best_cpu.min((b - a) as f64 * 1e-9);
            }
        }
        let cpu = if threads == 1 {
            format!(
                "  on-CPU {:8.1} ms {:6.1} GFLOP/s",
                best_cpu * 1e3,
                flop / best_cpu / 1e9
            )
        } else {
            String::new()
        };
        println!(
            "{what:34}: {:8.1} ms {:6.1} GFLOP/s{cpu}",
            best * 1e3,
            flop / best / 1e9
        );
    };
    let s = AttnShape {
        n_head: nh,
        n_head_kv: nh,
        head_dim_k: dh,
        head_dim_v: dh,
    };
    let q: Vec<f32> = (0..n * nh * dh).map(f).collect();
    let k: Vec<f32> = (0..n * nh * dh).map(|i| f(i + 3)).collect();
    let v: Vec<f32> = (0..n * nh * dh).map(|i| f(i + 7)).collect();
    let mut out = vec![0f32; n * nh * dh];
    let flop = 4.0 * (n * n * nh * dh) as f64;
    time("attend_full 4096 x 16 heads x 72", flop, &mut || {
        attend_full(pool, s, &q, &k, &v, n, 0.1, &mut out)
    });
    let (rows, cols) = (4304, 1152);
    let bits: Vec<u16> = (0..rows * cols)
        .map(|i| half::f16::from_f32(f(i) * 0.05).to_bits())
        .collect();
    let w = F16Matrix::from_bits(rows, cols, &bits);
    let x: Vec<f32> = (0..n * cols).map(f).collect();
    let mut y = vec![0f32; n * rows];
    let flop = 2.0 * (n * rows * cols) as f64;
    time("f16mm 4096 x 4304 x 1152", flop, &mut || {
        w.matmul(pool, &x, n, &mut y)
    });
}

/// Nanoseconds the calling thread has run on a CPU, if the OS says.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}
