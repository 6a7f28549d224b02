//! Peak resident memory of a prefill and decode on the real models stays
//! within the model file plus the KV cache the run fills plus 10 %: the
//! repacked weights replace the file's pages rather than sit beside them.
//! At 4,096 tokens an f16 cache keeps the peak within the file plus the f16
//! KV, which an f32 cache (twice the bytes) would not fit.
//!
//! The peak is the child's `ru_maxrss`, read by a Python wrapper (the
//! standard library has no getrusage); it is a measurement of memory, not
//! of time, so it does not depend on how loaded the machine is.

use std::process::Command;

use onebit_model::load;
use onebit_testdata::{real_model, GEMMA3_270M, SMOLLM2_135M};

const PROMPT: usize = 512;
/// Tokens decoded after the prompt: their K and V rows are held too.
const GEN: usize = 16;

/// The child's peak RSS in bytes for `onebit bench` on `model`.
fn peak_rss(model: &std::path::Path) -> u64 {
    let prompt = PROMPT.to_string();
    let gen = GEN.to_string();
    peak_rss_of(
        model,
        &[
            "--prompt-tokens",
            &prompt,
            "--gen-tokens",
            &gen,
            "--kv-type",
            "f32",
        ],
    )
}

/// The child's peak RSS in bytes for `onebit bench` on `model` with `args`.
fn peak_rss_of(model: &std::path::Path, args: &[&str]) -> u64 {
    let script = "import resource, subprocess, sys\n\
                  subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n\
                  print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)";
    let out = Command::new("python3")
        .args([
            "-c",
            script,
            env!("CARGO_BIN_EXE_onebit"),
            "bench",
            "--model",
        ])
        .arg(model)
        .args(["--threads", "2", "--repetitions", "1"])
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kib: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("ru_maxrss in KiB");
    kib * 1024
}

fn check(file: &str) {
    let path = real_model(file);
    let sem = load::open(&path).expect("the model opens").sem;
    let d = &sem.dims;
    // f32 K and V rows for every attention layer, one per position the run
    // holds: the prompt's and the decoded tokens'.
    let kv = (d.n_layer * d.n_head_kv * (d.head_dim_k + d.head_dim_v) * 4 * (PROMPT + GEN)) as u64;
    let size = std::fs::metadata(&path).expect("model file").len();
    let budget = (size + kv) * 11 / 10;
    // The lower of two runs: thread timing moves the allocator's high-water
    // mark by about a megabyte from run to run.
    let peak = peak_rss(&path).min(peak_rss(&path));
    let mb = |b: u64| b as f64 / 1e6;
    eprintln!(
        "{file}: peak {:.1} MB, budget {:.1} MB (file {:.1} + KV {:.1}, + 10 %)",
        mb(peak),
        mb(budget),
        mb(size),
        mb(kv)
    );
    assert!(
        peak <= budget,
        "{file}: peak RSS {:.1} MB is over file {:.1} MB + KV {:.1} MB + 10 % = {:.1} MB",
        mb(peak),
        mb(size),
        mb(kv),
        mb(budget)
    );
}

#[test]
fn smollm2_peak_rss_within_file_plus_kv_cache() {
    check(SMOLLM2_135M);
}

#[test]
fn gemma3_peak_rss_within_file_plus_kv_cache() {
    check(GEMMA3_270M);
}

#[test]
fn smollm2_f16_kv_at_4096_tokens_takes_half_the_f32_kv() {
    const N: usize = 4096;
    let path = real_model(SMOLLM2_135M);
    let sem = load::open(&path).expect("the model opens").sem;
    let d = &sem.dims;
    // f16 K and V rows for every attention layer, one per position.
    let kv16 = (d.n_layer * d.n_head_kv * (d.head_dim_k + d.head_dim_v) * 2 * N) as u64;
    let size = std::fs::metadata(&path).expect("model file").len();
    let budget = (size + kv16) * 11 / 10;
    let n = N.to_string();
    let args = [
        "--prompt-tokens",
        &n,
        "--gen-tokens",
        "1",
        "--kv-type",
        "f16",
    ];
    let peak = peak_rss_of(&path, &args);
    let mb = |b: u64| b as f64 / 1e6;
    eprintln!(
        "f16 KV at {N}: peak {:.1} MB, budget {:.1} MB (file {:.1} + f16 KV {:.1}, + 10 %; \
         an f32 KV alone would be {:.1})",
        mb(peak),
        mb(budget),
        mb(size),
        mb(kv16),
        mb(2 * kv16)
    );
    // The budget must not leave room for the f32 cache, or the check proves nothing.
    assert!(size + 2 * kv16 > budget);
    assert!(
        peak <= budget,
        "peak RSS {:.1} MB is over file {:.1} MB + f16 KV {:.1} MB + 10 % = {:.1} MB",
        mb(peak),
        mb(size),
        mb(kv16),
        mb(budget)
    );
}
