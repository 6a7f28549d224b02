//! EmbeddingGemma (llama.cpp arch `gemma-embedding`) against llama.cpp's
//! pooled embeddings (testdata/llamacpp/gemma-embedding: a tiny random
//! model, 4 layers SSFS with a window of 8, mean pooling, dense_2/dense_3),
//! through the same pooling and head code `/v1/embeddings` and
//! `onebit embed` run; and the refusals of generation on it.

mod common;

use std::process::Command;

use onebit_formats::gguf::Gguf;
use onebit_kernels::Precision;
use onebit_model::{load, ExecConfig, Logits, Model, SeqState};
use onebit_serve::embed::Pooling;
use onebit_testdata::{read_f32, Fixture, TempDir};

fn sequences(fx: &Fixture) -> Vec<Vec<u32>> {
    let t: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fx.dir.join("tokens.json")).unwrap()).unwrap();
    t["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// Our normalized embedding per sequence of the fixture, for `file`.
fn ours(file: &str, precision: Precision) -> (Vec<Vec<f32>>, Model) {
    let fx = Fixture::new("gemma-embedding");
    let path = fx.dir.join(file);
    let exec = ExecConfig {
        threads: 2,
        precision,
        max_context: 128,
        ..ExecConfig::default()
    };
    let (model, _) = load::load(&path, &exec).unwrap();
    let g = Gguf::open(&path).unwrap();
    let key = "gemma-embedding.pooling_type";
    let pooling = Pooling::from_gguf(g.get(key).and_then(|v| v.as_i64()), key).unwrap();
    let n_embd = model.sem.dims.n_embd;
    let out = sequences(&fx)
        .iter()
        .map(|ids| {
            let mut state = model.new_state();
            let rows = model.forward(&mut state, ids, Logits::Hidden).unwrap();
            pooling.pool_through(&rows, n_embd, |v| model.pooled_head(v))
        })
        .collect();
    (out, model)
}

fn reference(file: &str, n_embd: usize) -> Vec<Vec<f32>> {
    let fx = Fixture::new("gemma-embedding");
    read_f32(fx.dir.join(file))
        .chunks_exact(n_embd)
        .map(<[f32]>::to_vec)
        .collect()
}

#[test]
fn f32_embeddings_match_llamacpp_pooled_embeddings() {
    let (v, model) = ours("f32.gguf", Precision::Quantized);
    let r = reference("f32.embeddings.bin", model.sem.dims.n_embd);
    assert_eq!(v.len(), r.len());
    for (i, (a, b)) in v.iter().zip(&r).enumerate() {
        let c = cosine(a, b);
        eprintln!(
            "sequence {i} ({} dims): cosine {c:.9} vs llama.cpp f32",
            a.len()
        );
        assert!(c >= 0.9999, "sequence {i}: cosine {c} < 0.9999");
    }
}

#[test]
fn quantized_embeddings_against_llamacpp() {
    let (v, model) = ours("Q8_0.gguf", Precision::Quantized);
    let r = reference("Q8_0.embeddings.bin", model.sem.dims.n_embd);
    for (i, (a, b)) in v.iter().zip(&r).enumerate() {
        let c = cosine(a, b);
        eprintln!("sequence {i}: Q8_0 cosine {c:.9} vs llama.cpp Q8_0");
        // meta.json: llama.cpp's own f32 vs Q8_0 cosines are >= 0.99984.
        assert!(c >= 0.999, "sequence {i}: Q8_0 cosine {c} < 0.999");
    }
}

#[test]
fn a_continued_sequence_is_refused_by_name() {
    let (_, model) = ours("f32.gguf", Precision::Quantized);
    let mut state: SeqState = model.new_state();
    model
        .forward(&mut state, &[2, 5, 7], Logits::Hidden)
        .unwrap();
    let e = model
        .forward(&mut state, &[9], Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bidirectional"), "{e}");
    let why = onebit_serve::generative(&model.sem, "tiny").unwrap_err();
    assert!(why.contains("embedding model"), "{why}");
}

#[test]
fn served_through_the_openai_client_and_refused_for_generation() {
    let dir = TempDir::new("embgemma");
    let model = common::embedding_gemma_with_vocab(&dir);
    let srv = common::Server::start(model.to_str().unwrap(), &["--threads", "1"]);
    common::python_script(
        "test_embedding_gemma.py",
        &[format!("http://127.0.0.1:{}", srv.port)],
        None,
    );
}

#[test]
fn onebit_embed_gives_the_same_vector_twice_and_run_is_refused() {
    let dir = TempDir::new("embgemma-cli");
    let model = common::embedding_gemma_with_vocab(&dir);
    let out = Command::new(common::BIN)
        .args(["embed", "--model"])
        .arg(&model)
        .args(["--text", "The cat sat.", "--text", "The cat sat."])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Vec<f32>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].len(), 64);
    assert_eq!(lines[0], lines[1]);
    let out = Command::new(common::BIN)
        .args(["run", "--model"])
        .arg(&model)
        .args(["--prompt", "hi"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "run on an embedding model succeeded");
    assert!(err.contains("embedding model"), "{err}");
}
