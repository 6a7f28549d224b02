//! The fuzz harnesses (`fuzz/harness.rs`) in CI, without a fuzzer: every
//! committed seed (`fuzz/corpus/<target>/`) and regression input
//! (`fuzz/regressions/<target>/`) as is, then a fixed number of seeded
//! mutations of them (bit flips, interesting integers, inserts, deletes,
//! splices, truncations). `ONEBIT_FUZZ_ITERS` raises the count (default 1500
//! per target, a few seconds in all). A failing input is written to the temp
//! directory and named in the failure, ready to commit as a regression.
//!
//! `cargo test -p onebit --test fuzz_regress -- --ignored write_seeds`
//! regenerates the generated seeds (tiny GGUF model, q4nx tiles).

#[path = "../../../fuzz/harness.rs"]
mod harness;

use onebit_testdata::Rng;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    for sub in ["corpus", "regressions"] {
        let d = fuzz_dir().join(sub).join(target);
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd.map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files {
            v.push((
                format!(
                    "{sub}/{target}/{}",
                    f.file_name().unwrap().to_string_lossy()
                ),
                std::fs::read(&f).unwrap(),
            ));
        }
    }
    v
}

const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 62,
    u64::MAX,
];

/// One to four mutations of `input` (and maybe a splice with `other`).
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(8) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next_u64() as u8;
            }
            2 if v.len() >= 8 => {
                let i = rng.below(v.len() - 7);
                let x = INTERESTING[rng.below(INTERESTING.len())];
                let w = [1, 2, 4, 8][rng.below(4)];
                v[i..i + w].copy_from_slice(&x.to_le_bytes()[..w]);
            }
            3 => {
                let i = rng.below(v.len() + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                v.splice(i..i, bytes);
            }
            4 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = 1 + rng.below((v.len() - i).min(64));
                v.drain(i..i + n);
            }
            5 if !v.is_empty() => {
                let n = rng.below(v.len());
                v.truncate(n);
            }
            6 if !other.is_empty() => {
                let i = rng.below(v.len() + 1);
                let a = rng.below(other.len());
                let n = 1 + rng.below((other.len() - a).min(256));
                v.splice(i..i, other[a..a + n].iter().copied());
            }
            _ if v.len() >= 2 => {
                // Copy a chunk of the input over another place of it.
                let a = rng.below(v.len());
                let b = rng.below(v.len());
                let n = 1 + rng.below((v.len() - a.max(b)).min(32));
                let chunk = v[a..a + n].to_vec();
                v[b..b + n].copy_from_slice(&chunk);
            }
            _ => v.push(rng.next_u64() as u8),
        }
    }
    v
}

fn iters() -> usize {
    std::env::var("ONEBIT_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500)
}

fn run_target(name: &str) {
    let f = harness::TARGETS
        .iter()
        .find(|t| t.0 == name)
        .unwrap_or_else(|| panic!("no target {name}"))
        .1;
    let seeds = inputs(name);
    assert!(!seeds.is_empty(), "no seeds in fuzz/corpus/{name}");
    let t = std::time::Instant::now();
    let check = |what: &str, data: &[u8]| {
        let r = std::panic::catch_unwind(|| f(data));
        if r.is_err() {
            let p = std::env::temp_dir().join(format!(
                "onebit-fuzz-{name}-{}",
                what.replace(['/', ' '], "_")
            ));
            std::fs::write(&p, data).unwrap();
            panic!(
                "target {name} panicked on {what}; input saved to {} (commit it under fuzz/regressions/{name}/)",
                p.display()
            );
        }
    };
    for (what, data) in &seeds {
        check(what, data);
    }
    let mut rng = Rng(0x6f6e_6562_6974 ^ name.len() as u64);
    let n = iters();
    for i in 0..n {
        let (_, a) = &seeds[rng.below(seeds.len())];
        let (_, b) = &seeds[rng.below(seeds.len())];
        let m = mutate(&mut rng, a, b);
        check(&format!("mutation {i}"), &m);
    }
    eprintln!(
        "[fuzz-regress] {name}: {} seeds + {n} mutations in {:.2} s",
        seeds.len(),
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn gguf() {
    run_target("gguf");
}

#[test]
fn safetensors() {
    run_target("safetensors");
}

#[test]
fn tokenizer() {
    run_target("tokenizer");
}

#[test]
fn chat_template() {
    run_target("chat_template");
}

#[test]
fn request() {
    run_target("request");
}

// ------------------------------------------------------------- seeds

use onebit_formats::gguf::{writer::GgufWriter, Value};

/// A one-layer llama with a 16-token byte-level vocabulary, n_embd 32:
/// small enough to load and run in the fuzz loop.
fn tiny_llama() -> Vec<u8> {
    let mut w = GgufWriter::new();
    let s = |x: &str| Value::Str(x.into());
    w.kv("general.architecture", s("llama"));
    for (k, v) in [
        ("block_count", 1u32),
        ("context_length", 64),
        ("embedding_length", 32),
        ("feed_forward_length", 64),
        ("attention.head_count", 2),
        ("attention.head_count_kv", 1),
    ] {
        w.kv(&format!("llama.{k}"), Value::U32(v));
    }
    w.kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    w.kv("llama.rope.freq_base", Value::F32(10000.0));
    w.kv("tokenizer.ggml.model", s("gpt2"));
    w.kv("tokenizer.ggml.pre", s("smollm"));
    let toks = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "H",
        "e",
        "l",
        "o",
        "Ġ",
        "w",
        "r",
        "d",
        "He",
        "ll",
        "Hell",
        "Hello",
        "Ġw",
    ];
    w.kv(
        "tokenizer.ggml.tokens",
        Value::Array(toks.iter().map(|t| s(t)).collect()),
    );
    w.kv(
        "tokenizer.ggml.token_type",
        Value::Array(
            (0..toks.len())
                .map(|i| Value::I32(if i < 3 { 3 } else { 1 }))
                .collect(),
        ),
    );
    w.kv(
        "tokenizer.ggml.merges",
        Value::Array(
            ["H e", "l l", "He ll", "Hell o", "Ġ w"]
                .iter()
                .map(|m| s(m))
                .collect(),
        ),
    );
    w.kv("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.kv("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.kv(
        "tokenizer.chat_template",
        s("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"),
    );
    let mut x = 0x1234_5678u32;
    let mut vals = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x % 2000) as f32 / 10000.0 - 0.1
            })
            .collect()
    };
    let (e, ff, v) = (32u64, 64u64, toks.len() as u64);
    w.tensor_f32("token_embd.weight", &[e, v], &vals((e * v) as usize));
    w.tensor_f32("output_norm.weight", &[e], &vec![1.0; e as usize]);
    w.tensor_f32("blk.0.attn_norm.weight", &[e], &vec![1.0; e as usize]);
    w.tensor_f32("blk.0.ffn_norm.weight", &[e], &vec![1.0; e as usize]);
    w.tensor_f32("blk.0.attn_q.weight", &[e, e], &vals((e * e) as usize));
    w.tensor_f32("blk.0.attn_k.weight", &[e, 16], &vals((e * 16) as usize));
    w.tensor_f32("blk.0.attn_v.weight", &[e, 16], &vals((e * 16) as usize));
    w.tensor_f32("blk.0.attn_output.weight", &[e, e], &vals((e * e) as usize));
    w.tensor_f32("blk.0.ffn_gate.weight", &[e, ff], &vals((e * ff) as usize));
    w.tensor_f32("blk.0.ffn_up.weight", &[e, ff], &vals((e * ff) as usize));
    w.tensor_f32("blk.0.ffn_down.weight", &[ff, e], &vals((e * ff) as usize));
    w.to_bytes()
}

/// A q4nx safetensors image: one Q4 tensor (one tile), a Q8 one, a BF16 norm.
fn tiny_q4nx(dir: &Path) -> Vec<u8> {
    use onebit_formats::q4nx::{self, Q4Kind, Q4Shape};
    use onebit_formats::safetensors::{self, StDtype, StOut};
    let shape = Q4Shape::new(32, 256).unwrap();
    let w: Vec<f32> = (0..32 * 256)
        .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
        .collect();
    let q4 = q4nx::quantize(&w, shape, Q4Kind::Asymmetric);
    let q4s = q4nx::quantize(&w, shape, Q4Kind::Symmetric);
    let norm: Vec<u8> = (0..64u16)
        .flat_map(|i| (0x3f80u16 + i).to_le_bytes())
        .collect();
    let tensors = vec![
        StOut {
            name: "model.layers.0.mlp.up_proj.weight".into(),
            dtype: StDtype::I8,
            shape: shape.stored_shape(),
            data: q4,
        },
        StOut {
            name: "model.layers.0.mlp.gate_proj.weight".into(),
            dtype: StDtype::I8,
            shape: shape.stored_shape(),
            data: q4s,
        },
        StOut {
            name: "model.norm.weight".into(),
            dtype: StDtype::BF16,
            shape: vec![64],
            data: norm,
        },
    ];
    let p = dir.join("seed.q4nx");
    let mut meta = std::collections::BTreeMap::new();
    meta.insert("format".to_string(), "q4nx".to_string());
    safetensors::write(&p, &tensors, &meta).unwrap();
    std::fs::read(&p).unwrap()
}

#[test]
#[ignore = "writes fuzz/corpus; run by hand to regenerate the seeds"]
fn write_seeds() {
    let put = |target: &str, name: &str, bytes: &[u8]| {
        let d = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), bytes).unwrap();
    };
    let model = tiny_llama();
    harness::gguf(&model);
    put("gguf", "tiny-llama.gguf", &model);
    let real = std::fs::read(onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M)).unwrap();
    put("gguf", "smollm2-first-4k.gguf", &real[..4096]);
    let tmp = onebit_testdata::TempDir::new("seeds");
    put("safetensors", "tiny.q4nx", &tiny_q4nx(tmp.path()));
}
