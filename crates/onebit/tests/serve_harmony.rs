//! Issue 26: a tool round trip through `onebit serve` with the official
//! `openai` client on a gpt-oss model (tests/serve/test_harmony_tools.py):
//! under `tool_choice: required` the reply is a call in harmony's own
//! markup (the forced grammar), parsed into OpenAI's `tool_calls`, whole and
//! streamed, with no harmony markup anywhere; the call's result goes back as
//! a `tool` message and the model answers it.
//!
//! The model is the gpt-oss fixture (testdata/llamacpp/gpt-oss: its layers,
//! checked against llama.cpp by the golden tests) with gpt-oss's vocabulary
//! and chat template from o200k_harmony.gguf (scripts/fetch-models.sh) and
//! token embedding and output matrices of that vocabulary's size, seeded
//! random: what it says is noise, but every token it may say under the
//! grammar is the format's, so the round trip exercises the template, the
//! grammar, the splitter and the parse on the real vocabulary.

mod common;

use std::path::PathBuf;

use common::Server;
use onebit_formats::dtype::GgmlType;
use onebit_formats::gguf::writer::GgufWriter;
use onebit_formats::gguf::{Gguf, Value as GValue};
use onebit_testdata::{Fixture, Rng, TempDir};

fn gpt_oss_with_harmony_vocab(dir: &TempDir) -> PathBuf {
    let fx = Fixture::new("gpt-oss");
    let g = Gguf::open(fx.dir.join("f32.gguf")).unwrap();
    let vocab = Gguf::open(onebit_testdata::real_model(onebit_testdata::O200K_HARMONY)).unwrap();
    let mut w = GgufWriter::from_gguf(&g);
    for (key, v) in &vocab.metadata {
        if key.starts_with("tokenizer.") {
            w.set_kv(key, v.clone());
        }
    }
    let n_vocab = vocab
        .array_opt("tokenizer.ggml.tokens")
        .unwrap()
        .expect("o200k_harmony.gguf lists its tokens")
        .len() as u64;
    let n_embd = g.tensor("token_embd.weight").unwrap().dims[0];
    w.set_kv("gpt-oss.vocab_size", GValue::U32(n_vocab as u32));
    let mut rng = Rng(0x6f2d_6f73);
    for name in ["token_embd.weight", "output.weight"] {
        let values: Vec<f32> = (0..n_embd * n_vocab)
            .map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            .collect();
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.set_tensor(name, &[n_embd, n_vocab], GgmlType::F32, data);
    }
    dir.file("gpt-oss-harmony-tiny.gguf", &w.to_bytes())
}

#[test]
fn the_openai_client_makes_a_forced_tool_round_trip_in_harmony() {
    let dir = TempDir::new("serve-harmony");
    let model = gpt_oss_with_harmony_vocab(&dir);
    let srv = Server::start(model.to_str().unwrap(), &["--threads", "2"]);
    common::python_script(
        "test_harmony_tools.py",
        &[format!("http://127.0.0.1:{}", srv.port)],
        Some(&srv.log),
    );
}
