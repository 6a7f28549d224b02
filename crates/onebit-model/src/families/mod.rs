//! One file per model family, each holding only what that family does
//! differently, and its registry row (`FAMILY`): names, key table, semantics,
//! pack tensor names, import rules. `common` reads what every family declares
//! the same way; `decls` hides whether a declaration came from GGUF metadata
//! or a pack's config.json, so one family file serves both containers.
//! Adding a family: docs/adding-a-family.md.

pub mod common;
pub mod decls;
pub mod gemma3;
pub mod gemma4;
pub mod gemma_embedding;
pub mod gpt_oss;
pub mod hunyuan;
pub mod lfm2;
pub mod lfm2moe;
pub mod llama;
pub mod moe;
pub mod nanbeige;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod qwen35;
pub mod qwen35moe;
pub mod qwen3moe;
pub mod qwen3vl;
pub mod qwen3vlmoe;

use onebit_formats::gguf::Gguf;
use onebit_formats::q4nx::Q4Kind;
use serde_json::Value as Json;

use crate::error::{ModelError, Result};
use crate::semantics::{Semantics, Sourced};
use decls::Decls;

/// A family: one row, declared in the family's own file (`pub const
/// FAMILY`) and listed once in [`FAMILIES`]. The loaders, the pack reader,
/// the importer and the tests read families only through these rows.
pub struct Family {
    /// GGUF `general.architecture`, also the prefix of its metadata keys.
    pub arch: &'static str,
    /// HF config.json `model_type` values and `architectures` entries.
    pub hf_names: &'static [&'static str],
    /// Reads the semantics (every rule with its source) from the
    /// declarations, through the family's key table.
    pub semantics: fn(&Decls) -> Result<Semantics>,
    /// How FastFlowLM packs of this family name their tensors; `None`: packs
    /// of this family are refused by name.
    pub pack: Option<PackNames>,
    /// How `onebit import` writes a pack of this family; `None`: refused.
    pub import: Option<ImportRules>,
}

/// A (GGUF name, pack name) row; `{i}` is the layer index. A pack name ""
/// removes the common row of that GGUF name.
pub type NameRow = (&'static str, &'static str);

/// The family's pack tensor names: the common table (`pack::names::COMMON`)
/// with these rows replacing those of the same GGUF name.
pub struct PackNames {
    pub rows: &'static [NameRow],
}

/// The import converter's rules for a family (what FastFlowLM's converter
/// does for it).
pub struct ImportRules {
    /// config.json `model_type` and `architectures` to write.
    pub model_type: &'static str,
    pub hf_arch: &'static str,
    /// The Q4 kind matrices are re-quantized to.
    pub q4_kind: Q4Kind,
    /// GGUF q/k rows were permuted for adjacent-pair RoPE by llama.cpp's
    /// converter: the importer puts them back in HF order.
    pub unpermute_qk: bool,
    /// The embedding is stored pre-multiplied by sqrt(hidden size).
    pub prescale_embedding: bool,
    /// The config.json spelling of the norm epsilon.
    pub eps_key: &'static str,
    /// Writes the family's own config.json keys (layer types, ...).
    pub config: fn(&Semantics, &mut Json),
}

/// No family-specific config.json keys.
pub fn no_config(_: &Semantics, _: &mut Json) {}

/// Every family onebit runs: one line each.
pub const FAMILIES: &[&Family] = &[
    &llama::FAMILY,
    &gemma3::FAMILY,
    &qwen2::FAMILY,
    &qwen3::FAMILY,
    &phi3::FAMILY,
    &hunyuan::FAMILY,
    &lfm2::FAMILY,
    &qwen35::FAMILY,
    &nanbeige::FAMILY,
    &gemma4::FAMILY,
    &qwen3moe::FAMILY,
    &lfm2moe::FAMILY,
    &qwen35moe::FAMILY,
    &gpt_oss::FAMILY,
    &qwen3vl::FAMILY,
    &qwen3vlmoe::FAMILY,
];

/// Embedding-only families (bidirectional attention, no generation): loaded
/// like the others, kept out of [`FAMILIES`] because the every-family tests
/// there compare logits and continue sequences, which these do not have.
pub const EMBEDDING_FAMILIES: &[&Family] = &[&gemma_embedding::FAMILY];

/// A chat template a family is known to use, with where its text comes
/// from: the fallback for a model file that carries no template.
pub struct KnownTemplate {
    pub text: &'static str,
    pub source: &'static str,
}

/// Families' known chat templates (each declared in its family's file), by
/// architecture. A family absent here has none: a model of it without a
/// template of its own takes no chat (ChatML, llama.cpp's fallback, is
/// wrong for most families).
pub const CHAT_TEMPLATES: &[(&str, &KnownTemplate)] =
    &[(gemma3::FAMILY.arch, &gemma3::CHAT_TEMPLATE)];

/// The known chat template of family `arch`, with its source.
pub fn known_chat_template(arch: &str) -> Option<Sourced<&'static str>> {
    CHAT_TEMPLATES
        .iter()
        .find(|(a, _)| *a == arch)
        .map(|(a, t)| {
            Sourced::new(
                t.text,
                format!("the {a} family's known template: {}", t.source),
            )
        })
}

pub fn by_arch(arch: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .chain(EMBEDDING_FAMILIES)
        .copied()
        .find(|f| f.arch == arch)
}

/// The family a config.json name (`model_type` or an `architectures` entry) names.
pub fn by_hf_name(name: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.hf_names.contains(&name))
}

/// Reads the semantics of a GGUF model, refusing an architecture we do not run.
pub fn semantics_from_gguf(g: &Gguf) -> Result<Semantics> {
    let arch = g.str("general.architecture")?;
    let fam = by_arch(arch).ok_or_else(|| ModelError::Unsupported {
        path: g.path().to_path_buf(),
        what: format!(
            "general.architecture `{arch}` is not a family onebit runs (supported: {})",
            FAMILIES
                .iter()
                .map(|f| f.arch)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })?;
    let dims = |name: &str| g.tensor(name).map(|t| t.dims.clone());
    (fam.semantics)(&Decls::gguf(g, fam.arch, &dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_chat_templates_are_the_reference_texts_and_name_their_source() {
        // gemma3's is Google's template as testdata keeps it (the file the
        // chat-template renderings of onebit-text are checked against).
        let reference = include_str!("../../../../testdata/chat-templates/gemma3.jinja");
        let t = known_chat_template("gemma3").expect("gemma3 has a known template");
        assert_eq!(t.value, reference);
        assert!(
            t.source.contains("gemma3") && t.source.contains("google/gemma-3"),
            "{}",
            t.source
        );
        // Every row names a family onebit runs, once.
        for (i, (arch, _)) in CHAT_TEMPLATES.iter().enumerate() {
            assert!(by_arch(arch).is_some(), "{arch}");
            assert!(
                !CHAT_TEMPLATES[..i].iter().any(|(a, _)| a == arch),
                "{arch}"
            );
        }
        // A family with no row has none: no guess (such as ChatML).
        assert!(known_chat_template("llama").is_none());
    }
}
