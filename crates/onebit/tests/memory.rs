//! Peak resident memory of a prefill and decode on the real models stays
//! within the model file plus the KV cache the run fills plus 10 %: the
//! repacked weights replace the file's pages rather than sit beside them.
//!
//! The peak is the child's `ru_maxrss`, read by a Python wrapper (the
//! standard library has no getrusage); it is a measurement of memory, not
//! of time, so it does not depend on how loaded the machine is.

use std::process::Command;

use onebit_model::load;
use onebit_testdata::{real_model, GEMMA3_270M, SMOLLM2_135M};

const PROMPT: usize = 512;

/// The child's peak RSS in bytes for `onebit bench` on `model`.
fn peak_rss(model: &std::path::Path) -> u64 {
    let script = "import resource, subprocess, sys\n\
                  subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n\
                  print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)";
    let prompt = PROMPT.to_string();
    let out = Command::new("python3")
        .args([
            "-c",
            script,
            env!("CARGO_BIN_EXE_onebit"),
            "bench",
            "--model",
        ])
        .arg(model)
        .args(["--threads", "2", "--prompt-tokens", &prompt])
        .args(["--gen-tokens", "16", "--repetitions", "1"])
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
    // f32 K and V rows for every attention layer, one per prompt position.
    let kv = (d.n_layer * d.n_head_kv * (d.head_dim_k + d.head_dim_v) * 4 * PROMPT) as u64;
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
