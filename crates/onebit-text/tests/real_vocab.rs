//! The GGUF vocabularies of real models against llama.cpp's ids.

use std::time::Instant;

use onebit_formats::gguf::Gguf;
use onebit_text::{StreamDecoder, Tokenizer};

struct Case {
    text: String,
    ids: Vec<u32>,
}

fn cases(model: &str) -> Vec<Case> {
    let stem = model.trim_end_matches(".gguf");
    let path = onebit_testdata::dir()
        .join("refs")
        .join(format!("tokens-{stem}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().unwrap().to_string(),
            ids: c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect(),
        })
        .collect()
}

fn load(model: &str) -> Tokenizer {
    let g = Gguf::open(onebit_testdata::real_model(model)).unwrap();
    let t0 = Instant::now();
    let t = Tokenizer::from_gguf(&g).unwrap();
    eprintln!(
        "{model}: tokenizer built from GGUF metadata in {:?}",
        t0.elapsed()
    );
    t
}

fn check_model(model: &str) {
    let t = load(model);
    let cases = cases(model);
    assert!(!cases.is_empty());
    let mut failures = Vec::new();
    for c in &cases {
        let got = t.encode(&c.text, true).unwrap();
        if got != c.ids {
            failures.push(format!(
                "{:?}\n  want {:?}\n  got  {:?}",
                c.text, c.ids, got
            ));
        }
    }
    eprintln!(
        "{model}: {}/{} reference strings match llama.cpp",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(failures.is_empty(), "{model}:\n{}", failures.join("\n"));
}

fn check_round_trip(model: &str) {
    let t = load(model);
    for c in cases(model) {
        let mut ids = c.ids.clone();
        if t.special().add_bos && ids.first() == t.special().bos.as_ref() {
            ids.remove(0);
        }
        let text = t.decode(&ids, false).unwrap();
        assert_eq!(text, c.text, "{model}: decode of {ids:?}");

        let mut s = StreamDecoder::new(&t);
        let mut pieces = Vec::new();
        for &id in &ids {
            pieces.push(s.push(id).unwrap());
        }
        pieces.push(s.finish());
        assert_eq!(pieces.concat(), c.text, "{model}: stream pieces {pieces:?}");
        for p in &pieces {
            assert!(
                !p.contains('\u{FFFD}'),
                "{model}: piece {p:?} of {:?} splits a character",
                c.text
            );
        }
    }
}

#[test]
fn gemma3_ids_match_llama_cpp() {
    check_model(onebit_testdata::GEMMA3_270M);
}

#[test]
fn smollm2_ids_match_llama_cpp() {
    check_model(onebit_testdata::SMOLLM2_135M);
}

#[test]
fn gemma3_round_trip() {
    check_round_trip(onebit_testdata::GEMMA3_270M);
}

#[test]
fn smollm2_round_trip() {
    check_round_trip(onebit_testdata::SMOLLM2_135M);
}
