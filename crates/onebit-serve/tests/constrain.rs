//! Constrained decoding on the real tokenizers (SmolLM2's byte-level BPE,
//! Gemma 3's SentencePiece): the token bytes llguidance sees are the bytes
//! each token decodes to, a grammar's mask admits exactly the tokens that
//! keep the text inside the grammar, and a finished grammar allows only the
//! stop token.

use onebit_formats::gguf::Gguf;
use onebit_serve::constrain::{token_bytes, Constrainer, Grammar};
use onebit_text::Tokenizer;
use serde_json::json;

fn tokenizer(model: &str) -> Tokenizer {
    let g = Gguf::open(onebit_testdata::real_model(model)).unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

fn both() -> [(&'static str, Tokenizer); 2] {
    [
        ("SmolLM2", tokenizer(onebit_testdata::SMOLLM2_135M)),
        ("Gemma 3", tokenizer(onebit_testdata::GEMMA3_270M)),
    ]
}

#[test]
fn token_bytes_are_what_each_token_decodes_to() {
    for (name, tok) in both() {
        let bytes = token_bytes(&tok);
        assert_eq!(bytes.len(), tok.vocab_size(), "{name}");
        // The text " Paris, {\"a\": 1}\n" encoded, then each token's bytes
        // joined: the same text back.
        let text = " Paris, {\"a\": 1}\n\u{e9}t\u{e9}";
        let ids = tok.encode(text, false).unwrap();
        let joined: Vec<u8> = ids
            .iter()
            .flat_map(|&i| bytes[i as usize].clone())
            .collect();
        assert_eq!(String::from_utf8(joined).unwrap(), text, "{name}: {ids:?}");
        // Control tokens carry llguidance's marker byte, so no text is one.
        let eos = tok.special().stop_ids()[0];
        assert_eq!(bytes[eos as usize][0], 0xFF, "{name}");
    }
}

#[test]
fn a_grammar_masks_to_its_continuations_then_to_the_stop_token() {
    for (name, tok) in both() {
        let eos = tok.special().stop_ids()[0];
        let c = Constrainer::new(&tok, eos).unwrap();
        let mut k = c
            .compile(&Grammar::Lark(r#"start: "yes" | "no""#.into()))
            .unwrap();
        let n = tok.vocab_size();
        let mut logits = vec![0.0f32; n];
        k.mask(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..n as u32)
            .filter(|&i| logits[i as usize] == 0.0)
            .collect();
        // Every allowed token is a prefix of "yes" or "no", and the whole
        // words are among them when the vocabulary has them.
        for &i in &allowed {
            let t = tok.decode(&[i], false).unwrap();
            assert!(
                !t.is_empty() && ("yes".starts_with(&t) || "no".starts_with(&t)),
                "{name}: {t:?} allowed"
            );
        }
        let yes = tok.encode("yes", false).unwrap();
        assert!(allowed.contains(&yes[0]), "{name}");
        for &i in &yes {
            k.commit(i).unwrap();
        }
        let mut logits = vec![0.0f32; n];
        k.mask(&mut logits).unwrap();
        let left: Vec<usize> = (0..n).filter(|&i| logits[i] == 0.0).collect();
        assert_eq!(left, [eos as usize], "{name}");
    }
}

#[test]
fn a_strict_schema_with_an_unknown_keyword_is_refused_by_name() {
    let tok = tokenizer(onebit_testdata::SMOLLM2_135M);
    let c = Constrainer::new(&tok, tok.special().stop_ids()[0]).unwrap();
    let schema = json!({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}, "x-guidance": {"lenient": false}});
    let e = c.compile(&Grammar::JsonSchema(schema)).err().unwrap();
    assert!(e.contains("no-such-format"), "{e}");
    let lenient = json!({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}, "x-guidance": {"lenient": true}});
    assert!(c.compile(&Grammar::JsonSchema(lenient)).is_ok());
}
