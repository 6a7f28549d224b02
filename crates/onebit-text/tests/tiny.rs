//! Tokenizer behaviour on small vocabularies whose every merge we chose.

mod common;

use common::*;
use onebit_formats::gguf::Value;
use onebit_text::{StreamDecoder, TextError, Tokenizer};

// Ids in `spm_kvs`: specials 0..=4, byte b at 5 + b, then the pieces.
const SPACE: u32 = 261;
const AB: u32 = 265;
const SP_AB: u32 = 266;
const SP_C: u32 = 267;
const E_ACUTE: u32 = 268;
fn byte(b: u8) -> u32 {
    5 + b as u32
}

fn spm(prefix: bool) -> Tokenizer {
    build(&format!("spm-{prefix}"), &spm_kvs(prefix)).unwrap()
}

#[test]
fn spm_merges_follow_scores() {
    let t = spm(false);
    assert_eq!(t.vocab_size(), 271);
    assert_eq!(t.encode("ab c", true).unwrap(), vec![1, AB, SP_C]);
    assert_eq!(t.encode("ab c", false).unwrap(), vec![AB, SP_C]);
    assert_eq!(t.encode("é", false).unwrap(), vec![E_ACUTE]);
    // Not in the vocabulary: its UTF-8 bytes.
    assert_eq!(t.encode("ü", false).unwrap(), vec![byte(0xC3), byte(0xBC)]);
    assert_eq!(t.decode(&[byte(0xC3), byte(0xBC)], false).unwrap(), "ü");
    assert_eq!(t.decode(&[1, AB, SP_C], true).unwrap(), "ab c");
    assert_eq!(t.decode(&[1, AB, SP_C], false).unwrap(), "<s>ab c");
}

#[test]
fn spm_special_and_user_defined_tokens_are_parsed() {
    let t = spm(false);
    assert_eq!(
        t.encode("x<|turn|>\nab", false).unwrap(),
        vec![byte(b'x'), 3, 4, AB]
    );
    assert_eq!(
        t.decode(&[byte(b'x'), 3, 4, AB], false).unwrap(),
        "x<|turn|>\nab"
    );
    assert_eq!(t.decode(&[byte(b'x'), 3, 4, AB], true).unwrap(), "x\nab");
    assert_eq!(t.token_to_id("<|turn|>"), Some(3));
    assert_eq!(t.id_to_token(SP_AB).as_deref(), Some("▁ab"));
}

#[test]
fn spm_space_prefix_before_every_text_stretch() {
    // llama.cpp puts the prefix space at the start and after every special token.
    let t = spm(true);
    assert_eq!(t.encode("ab c", false).unwrap(), vec![SP_AB, SP_C]);
    assert_eq!(
        t.encode("x<|turn|>ab", false).unwrap(),
        vec![SPACE, byte(b'x'), 3, SP_AB]
    );
    // The prefix space is removed again when decoding.
    assert_eq!(t.decode(&[1, SP_AB, SP_C], true).unwrap(), "ab c");
    let mut s = StreamDecoder::with_skip_special(&t, true);
    let pieces: Vec<String> = [1, SP_AB, SP_C]
        .iter()
        .map(|&i| s.push(i).unwrap())
        .collect();
    assert_eq!(pieces, ["", "ab", " c"]);
    assert_eq!(s.finish(), "");
}

#[test]
fn special_token_facts() {
    let t = spm(false);
    let s = t.special();
    assert_eq!(
        (s.bos, s.eos.as_slice(), s.unk),
        (Some(1), &[2][..], Some(0))
    );
    assert!(
        s.add_bos && !s.add_eos,
        "SentencePiece adds BOS by default, as llama.cpp"
    );
    assert_eq!(s.bos_token.as_deref(), Some("<s>"));
    assert_eq!(s.eos_token.as_deref(), Some("</s>"));
    assert_eq!(s.stop_ids(), vec![2]);

    let kvs = with(
        &spm_kvs(false),
        "tokenizer.ggml.add_bos_token",
        Some(Value::Bool(false)),
    );
    let kvs = with(
        &kvs,
        "tokenizer.ggml.add_eos_token",
        Some(Value::Bool(true)),
    );
    let kvs = with(&kvs, "tokenizer.ggml.eot_token_id", Some(Value::U32(3)));
    let t = build("facts", &kvs).unwrap();
    assert_eq!(t.encode("ab", true).unwrap(), vec![AB, 2]);
    assert_eq!(t.special().eot, Some(3));
    assert_eq!(t.special().stop_ids(), vec![2, 3]);
}

#[test]
fn stream_holds_back_a_character_split_over_byte_tokens() {
    let t = spm(false);
    let ids = [AB, byte(0xF0), byte(0x9F), byte(0x99), byte(0x82), SP_C];
    assert_eq!(t.decode(&ids, false).unwrap(), "ab🙂 c");
    let mut s = StreamDecoder::new(&t);
    let pieces: Vec<String> = ids.iter().map(|&i| s.push(i).unwrap()).collect();
    assert_eq!(pieces, ["ab", "", "", "", "🙂", " c"]);
    assert_eq!(s.finish(), "");
    // A stream cut inside a character gives what decode gives at the end.
    let cut = [AB, byte(0xF0), byte(0x9F)];
    let mut s = StreamDecoder::new(&t);
    let mut out: String = cut.iter().map(|&i| s.push(i).unwrap()).collect();
    out.push_str(&s.finish());
    assert_eq!(out, t.decode(&cut, false).unwrap());
}

#[test]
fn unknown_ids_are_errors() {
    let t = spm(false);
    assert!(matches!(
        t.decode(&[271], false),
        Err(TextError::UnknownId {
            id: 271,
            vocab_size: 271
        })
    ));
    let mut s = StreamDecoder::new(&t);
    assert!(s.push(u32::MAX).is_err());
    assert_eq!(t.id_to_token(271), None);
}

#[test]
fn byte_level_bpe() {
    let t = build("bpe", &bpe_kvs()).unwrap();
    assert!(
        !t.special().add_bos,
        "gpt2 vocabularies add no BOS by default"
    );
    assert_eq!(t.special().eos, vec![0]);
    assert_eq!(t.encode("hi hi!", true).unwrap(), vec![5, 3, 5, 7]);
    assert_eq!(t.encode("hi<|end|>", true).unwrap(), vec![5, 0]);
    assert_eq!(t.encode("é", false).unwrap(), vec![10]);
    assert_eq!(t.decode(&[5, 3, 5, 7, 0], false).unwrap(), "hi hi!<|end|>");
    assert_eq!(t.decode(&[5, 3, 5, 7, 0], true).unwrap(), "hi hi!");
    let mut s = StreamDecoder::new(&t);
    let pieces: Vec<String> = [5, 8, 9, 3].iter().map(|&i| s.push(i).unwrap()).collect();
    assert_eq!(pieces, ["hi", "", "é", " "]);
}

#[test]
fn from_parts_uses_the_stated_facts() {
    let t = spm(false);
    let special = onebit_text::SpecialTokens {
        bos: Some(1),
        eos: vec![2],
        add_bos: true,
        add_eos: true,
        ..Default::default()
    };
    let t2 = Tokenizer::from_parts(t.inner().clone(), special);
    assert_eq!(t2.encode("ab", true).unwrap(), vec![1, AB, 2]);
    assert_eq!(t2.encode("ab", false).unwrap(), vec![AB]);
    assert_eq!(t2.vocab_size(), 271);
}

#[test]
fn tokenizer_is_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>();
    send_sync::<onebit_text::SpecialTokens>();
}
