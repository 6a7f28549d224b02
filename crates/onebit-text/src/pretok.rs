//! `tokenizer.ggml.pre` -> how a byte-level BPE vocabulary splits text before merging.
//!
//! The names and their split expressions are llama.cpp's (`llama-vocab.cpp`): a
//! GGUF's pre name says which of llama.cpp's known tokenizers reproduces the
//! original one, and several names share one split. Each expression is applied
//! in turn to the pieces the previous one left (llama.cpp's `unicode_regex_split`),
//! keeping both matches and the text between them. Where llama.cpp rewrote an
//! expression for its own regex engine, the original form from the model's
//! `tokenizer.json` is listed, which is what `fancy-regex` wants.

/// One known pre-tokenizer.
pub(crate) struct PreSpec {
    /// The `tokenizer.ggml.pre` values that select it.
    pub names: &'static [&'static str],
    /// Split expressions, applied in order.
    pub splits: &'static [&'static str],
    /// Look a whole piece up in the vocabulary before merging (llama.cpp `ignore_merges`).
    pub ignore_merges: bool,
    /// llama.cpp's default for `tokenizer.ggml.add_bos_token` when the key is absent.
    pub add_bos: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp's `gpt-4o` split (o200k, gpt-oss's o200k_harmony), as llama.cpp
/// writes it for its own regex engine, not the tokenizer.json original: the
/// rewrite is not equivalent (combining marks are no letters in it, and a
/// non-ASCII letter counts as both upper and lower case), and onebit's ids
/// are llama.cpp's, so the rewrite it is. The original splits Devanagari,
/// whose vowel signs are marks, differently (`testdata/refs/tokens-o200k_harmony.json`
/// records tiktoken's ids where they differ).
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

pub(crate) const PRE_TOKENIZERS: &[PreSpec] = &[
    PreSpec {
        names: &["default"],
        splits: &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &[
            "gpt2",
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v1-en",
            "jina-v2-es",
            "jina-v2-de",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
        ],
        splits: &[GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &["llama3", "llama-v3", "llama-bpe", "falcon3"],
        splits: &[LLAMA3],
        ignore_merges: true,
        add_bos: true,
    },
    PreSpec {
        names: &["dbrx", "smaug-bpe", "chatglm-bpe"],
        splits: &[LLAMA3],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &["qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"],
        splits: &[QWEN2],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &[
            "smollm",
            "starcoder",
            "refact",
            "command-r",
            "codeshell",
            "exaone",
            "minerva-7b",
        ],
        splits: &[r"\p{N}", GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &["deepseek-llm"],
        splits: &[
            r"[\r\n]",
            r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}+",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &["deepseek-coder"],
        splits: &[
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &["deepseek-v3"],
        splits: &[
            r"\p{N}{1,3}",
            r"[一-龥぀-ゟ゠-ヿ]+",
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &["falcon"],
        splits: &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &["tekken"],
        splits: &[TEKKEN],
        ignore_merges: true,
        add_bos: true,
    },
    PreSpec {
        names: &["gpt-4o"],
        splits: &[GPT4O],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &["poro-chat", "bloom", "gpt3-finnish"],
        splits: &[BLOOM],
        ignore_merges: false,
        add_bos: false,
    },
    PreSpec {
        names: &["viking"],
        splits: &[BLOOM, r"\p{N}"],
        ignore_merges: false,
        add_bos: false,
    },
];

/// The pre-tokenizer a `tokenizer.ggml.pre` value names; an absent value is
/// llama.cpp's `"default"`.
pub(crate) fn lookup(pre: Option<&str>) -> Option<&'static PreSpec> {
    let name = pre.unwrap_or("default");
    PRE_TOKENIZERS.iter().find(|p| p.names.contains(&name))
}

/// Every known name, for error messages.
pub(crate) fn known_names() -> Vec<&'static str> {
    PRE_TOKENIZERS
        .iter()
        .flat_map(|p| p.names.iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_split_compiles_and_names_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for p in PRE_TOKENIZERS {
            for n in p.names {
                assert!(seen.insert(*n), "pre name {n} listed twice");
            }
            for s in p.splits {
                tokenizers::pre_tokenizers::split::Split::new(
                    tokenizers::pre_tokenizers::split::SplitPattern::Regex(s.to_string()),
                    tokenizers::SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap_or_else(|e| panic!("{:?}: {s}: {e}", p.names));
            }
        }
        assert!(lookup(Some("smollm")).is_some());
        assert!(lookup(None).is_some());
        assert!(lookup(Some("no-such-pre")).is_none());
    }
}
