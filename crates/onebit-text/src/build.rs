//! `tokenizers::Tokenizer` from checked GGUF vocabulary metadata.
//!
//! Two kinds, as llama.cpp has them:
//!
//! * SentencePiece (`"llama"`): llama.cpp tokenizes by repeatedly joining the
//!   adjacent pair whose joined text is a token with the highest score. A BPE
//!   whose merges are every `(left, right)` split of every token, ranked by the
//!   score of the joined token, does the same; with byte fallback for characters
//!   not in the vocabulary and spaces written as `▁`.
//! * Byte-level BPE (`"gpt2"`): the merges are in the file; text is split by the
//!   expressions `tokenizer.ggml.pre` names, then mapped to GPT-2's byte alphabet.
//!
//! Control tokens (type 3) and the unknown token become special added tokens,
//! so they are recognised in text; user-defined tokens (type 4) become plain
//! added tokens, matched in raw text before anything else, which is what
//! llama.cpp's special-token partition does with both.

use std::path::Path;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, NormalizerWrapper, SplitDelimiterBehavior};

use crate::gguf_vocab::{token_type, GgufVocab, Kind, KEY_MERGES, KEY_PRE, KEY_SCORES, KEY_TOKENS};
use crate::pretok;
use crate::{SpecialTokens, TextError};

/// SentencePiece's word-boundary mark.
const SPM_SPACE: &str = "\u{2581}";

/// Texts llama.cpp takes for the end of a turn when `tokenizer.ggml.eot_token_id`
/// is absent, in the order tried here (llama.cpp scans a hash map, so when a
/// vocabulary holds several its pick is arbitrary; ours is this order).
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
];
/// Texts llama.cpp treats as end of generation besides the eos/eot/eom ids.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    // o200k_harmony (gpt-oss): the end of a reply, and a tool call's end.
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
];

/// llama.cpp's exception to [`EOG_TEXTS`] (`llama-vocab.cpp`, the "workaround
/// for o200k_harmony"): a vocabulary whose end-of-generation texts include
/// all of `when` does not end generation on `drop`. In harmony `<|end|>`
/// closes one message (the reasoning) and the reply goes on; `<|return|>`
/// and `<|call|>` end it. The dropped id is no end of turn either.
struct EogDrop {
    when: &'static [&'static str],
    drop: &'static str,
}

const EOG_DROPS: &[EogDrop] = &[EogDrop {
    when: &["<|return|>", "<|call|>"],
    drop: "<|end|>",
}];

pub(crate) fn build(
    v: &GgufVocab<'_>,
    path: &Path,
) -> Result<(tokenizers::Tokenizer, SpecialTokens), TextError> {
    let (mut tok, add_bos_default) = match v.kind {
        Kind::Spm => (build_spm(v, path)?, true),
        Kind::ByteBpe => build_byte_bpe(v, path)?,
    };

    // Control, unknown and user-defined tokens, matched in text before the model sees it.
    let mut added = Vec::new();
    for (i, t) in v.tokens.iter().enumerate() {
        let ty = v.token_type(i);
        let special = ty == token_type::CONTROL || ty == token_type::UNKNOWN;
        if special || ty == token_type::USER_DEFINED {
            added.push(AddedToken::from(t.to_string(), special).normalized(false));
        }
    }
    if !added.is_empty() {
        tok.add_tokens(&added);
    }

    let name = |id: Option<u32>| id.map(|i| v.tokens[i as usize].to_string());
    let find = |texts: &[&str]| -> Vec<u32> {
        texts
            .iter()
            .filter_map(|t| tok.token_to_id(t))
            .collect::<Vec<_>>()
    };
    let mut eot = v.eot.or_else(|| find(EOT_TEXTS).first().copied());
    let mut eog: Vec<u32> = Vec::new();
    for id in v
        .eos
        .into_iter()
        .chain(eot)
        .chain(v.eom)
        .chain(find(EOG_TEXTS))
    {
        if !eog.contains(&id) {
            eog.push(id);
        }
    }
    let text_of = |id: u32| v.tokens.get(id as usize).map(|t| t.as_ref());
    for rule in EOG_DROPS {
        let has = |t: &str| eog.iter().any(|&id| text_of(id) == Some(t));
        if rule.when.iter().all(|t| has(t)) && has(rule.drop) {
            eog.retain(|&id| text_of(id) != Some(rule.drop));
            if eot.is_some_and(|id| text_of(id) == Some(rule.drop)) {
                eot = None;
            }
        }
    }
    let special = SpecialTokens {
        bos: v.bos,
        eos: v.eos.into_iter().collect(),
        add_bos: v.add_bos.unwrap_or(add_bos_default),
        add_eos: v.add_eos.unwrap_or(false),
        unk: v.unk,
        pad: v.pad,
        eot,
        eom: v.eom,
        eog,
        bos_token: name(v.bos),
        eos_token: name(v.eos),
    };
    if special.add_bos && special.bos.is_none() {
        return Err(TextError::MissingSpecial { which: "BOS" });
    }
    if special.add_eos && special.eos.is_empty() {
        return Err(TextError::MissingSpecial { which: "EOS" });
    }

    // Written into an exported tokenizer.json; `Tokenizer::encode` adds BOS/EOS
    // itself from `SpecialTokens` and does not rely on it.
    let mut single: Vec<String> = Vec::new();
    let mut pair: Vec<String> = Vec::new();
    let mut specials: Vec<(String, u32)> = Vec::new();
    if let (true, Some(b), Some(bt)) = (special.add_bos, special.bos, &special.bos_token) {
        single.push(bt.clone());
        pair.push(bt.clone());
        specials.push((bt.clone(), b));
    }
    single.push("$A".into());
    pair.push("$A".into());
    if let (true, Some(&e), Some(et)) = (special.add_eos, special.eos.first(), &special.eos_token) {
        single.push(et.clone());
        pair.push(et.clone());
        specials.push((et.clone(), e));
    }
    pair.push("$B:1".into());
    if !specials.is_empty() {
        // A token whose text the template syntax cannot hold (a `:` or space) is
        // simply left out of the export; encoding does not depend on it.
        let processor = TemplateProcessing::builder()
            .try_single(single)
            .and_then(|b| b.try_pair(pair))
            .ok()
            .and_then(|b| b.special_tokens(specials).build().ok());
        if let Some(p) = processor {
            tok.with_post_processor(Some(p));
        }
    }
    Ok((tok, special))
}

fn build_spm(v: &GgufVocab<'_>, path: &Path) -> Result<tokenizers::Tokenizer, TextError> {
    let scores = v.scores.as_ref().expect("checked at read: SPM has scores");
    let index = &v.index;

    // Every split of every token into two tokens is a merge producing it.
    let mut merges: Vec<(u128, u32, u32)> = Vec::new();
    for (id, t) in v.tokens.iter().enumerate() {
        for (p, _) in t.char_indices().skip(1) {
            let Some(&l) = index.get(&t[..p]) else {
                continue;
            };
            if let Some(&r) = index.get(&t[p..]) {
                // llama.cpp joins the pair with the best-scoring result first;
                // ties go to the lower id, then to the better-scoring halves.
                let key = (desc(scores[id]) as u128) << 96
                    | (id as u128) << 64
                    | (desc(scores[l as usize]) as u128) << 32
                    | desc(scores[r as usize]) as u128;
                merges.push((key, l, r));
            }
        }
    }
    merges.sort_unstable_by_key(|m| m.0);
    let merges: Vec<(String, String)> = merges
        .into_iter()
        .map(|(_, l, r)| {
            (
                v.tokens[l as usize].to_string(),
                v.tokens[r as usize].to_string(),
            )
        })
        .collect();
    let vocab: Vocab = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();

    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = v.unk {
        bpe = bpe.unk_token(v.tokens[u as usize].to_string());
    }
    let bpe = bpe.build().map_err(|e| TextError::Build {
        path: path.to_path_buf(),
        key: KEY_SCORES.into(),
        what: e.to_string(),
    })?;

    let mut tok = tokenizers::Tokenizer::new(bpe);
    let replace = Replace::new(" ", SPM_SPACE).expect("a literal pattern compiles");
    // llama.cpp puts a space before every stretch of text that starts the input
    // or follows a special token; Prepend on each non-added segment is that.
    let add_space_prefix = v.add_space_prefix.unwrap_or(true);
    let normalizer: NormalizerWrapper = if add_space_prefix {
        NormalizerSequence::new(vec![Prepend::new(SPM_SPACE.into()).into(), replace.into()]).into()
    } else {
        replace.into()
    };
    tok.with_normalizer(Some(normalizer));
    let mut decoders: Vec<DecoderWrapper> = vec![
        tokenizers::decoders::DecoderWrapper::Replace(
            Replace::new(SPM_SPACE, " ").expect("a literal pattern compiles"),
        ),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tok.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tok)
}

/// A key that sorts higher scores first (a total order on f32, reversed).
fn desc(score: f32) -> u32 {
    let bits = score.to_bits();
    // Map to an unsigned order-preserving key, then reverse it.
    let ordered = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    };
    !ordered
}

/// GPT-2's map from bytes to printable characters.
fn byte_to_char() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        map[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("below the surrogates")
        };
    }
    map
}

fn build_byte_bpe(
    v: &GgufVocab<'_>,
    path: &Path,
) -> Result<(tokenizers::Tokenizer, bool), TextError> {
    let spec = pretok::lookup(v.pre).ok_or_else(|| {
        TextError::Metadata(onebit_formats::FormatError::Key {
            path: path.to_path_buf(),
            key: KEY_PRE.into(),
            what: format!(
                "is {:?}, a pre-tokenizer onebit does not know; known: {}",
                v.pre.unwrap_or_default(),
                pretok::known_names().join(", ")
            ),
        })
    })?;

    // Normal tokens are stored in GPT-2's byte spelling; one that is not (some
    // converters leave bytes that do not decode raw) is respelled so the merges,
    // which use the byte spelling, can name it.
    let table = byte_to_char();
    let alphabet: std::collections::HashSet<char> = table.iter().copied().collect();
    let mut vocab = Vocab::with_capacity(v.tokens.len());
    for (i, t) in v.tokens.iter().enumerate() {
        let ty = v.token_type(i);
        let plain = ty != token_type::CONTROL
            && ty != token_type::USER_DEFINED
            && ty != token_type::UNKNOWN;
        let spelled = if plain && !t.chars().all(|c| alphabet.contains(&c)) {
            t.bytes().map(|b| table[b as usize]).collect()
        } else {
            t.to_string()
        };
        if let Some(prev) = vocab.insert(spelled.clone(), i as u32) {
            return Err(TextError::Metadata(onebit_formats::FormatError::Key {
                path: path.to_path_buf(),
                key: KEY_TOKENS.into(),
                what: format!("tokens {prev} and {i} both spell {spelled:?} in the byte alphabet"),
            }));
        }
    }

    let merges_in = v.merges.as_ref().expect("checked at read: gpt2 has merges");
    let mut seen = std::collections::HashSet::with_capacity(merges_in.len());
    let mut merges = Vec::with_capacity(merges_in.len());
    for (i, &(l, r)) in merges_in.iter().enumerate() {
        let joined = format!("{l}{r}");
        for part in [l, r, joined.as_str()] {
            if !vocab.contains_key(part) {
                return Err(TextError::Metadata(onebit_formats::FormatError::Key {
                    path: path.to_path_buf(),
                    key: KEY_MERGES.into(),
                    what: format!(
                        "merge {i} \"{l} {r}\" names {part:?}, which is not in `{KEY_TOKENS}`"
                    ),
                }));
            }
        }
        // llama.cpp keeps the first rank of a repeated merge.
        if seen.insert((l, r)) {
            merges.push((l.to_string(), r.to_string()));
        }
    }

    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(spec.ignore_merges);
    if let Some(u) = v.unk {
        builder = builder.unk_token(v.tokens[u as usize].to_string());
    }
    let bpe = builder.build().map_err(|e| TextError::Build {
        path: path.to_path_buf(),
        key: KEY_MERGES.into(),
        what: e.to_string(),
    })?;

    let mut pieces: Vec<PreTokenizerWrapper> = Vec::new();
    for s in spec.splits {
        let split = Split::new(
            SplitPattern::Regex((*s).into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TextError::Build {
            path: path.to_path_buf(),
            key: KEY_PRE.into(),
            what: format!("split expression {s:?}: {e}"),
        })?;
        pieces.push(split.into());
    }
    pieces.push(tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, false, false).into());

    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(PreSequence::new(pieces)));
    tok.with_decoder(Some(ByteLevel::new(false, false, false)));
    Ok((tok, spec.add_bos))
}
