//! One file per model family, each holding only what that family does
//! differently. `common` reads what every family declares the same way;
//! `decls` hides whether a declaration came from GGUF metadata or a pack's
//! config.json, so one family file serves both containers.

pub mod common;
pub mod decls;
pub mod gemma3;
pub mod hunyuan;
pub mod lfm2;
pub mod llama;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod qwen35;

use onebit_formats::gguf::Gguf;

use crate::error::{ModelError, Result};
use crate::semantics::Semantics;
use decls::Decls;

/// A family: how containers name it and how it reads its semantics.
pub struct Family {
    /// GGUF `general.architecture`, also the prefix of its metadata keys.
    pub arch: &'static str,
    /// HF config.json `model_type` values and `architectures` entries.
    pub hf_names: &'static [&'static str],
    pub semantics: fn(&Decls) -> Result<Semantics>,
}

/// Every family onebit runs.
pub const FAMILIES: &[Family] = &[
    Family {
        arch: "llama",
        hf_names: &["llama", "LlamaForCausalLM"],
        semantics: llama::semantics,
    },
    Family {
        arch: "gemma3",
        hf_names: &[
            "gemma3",
            "gemma3_text",
            "Gemma3ForCausalLM",
            "Gemma3ForConditionalGeneration",
        ],
        semantics: gemma3::semantics,
    },
    Family {
        arch: "qwen2",
        hf_names: &["qwen2", "Qwen2ForCausalLM"],
        semantics: qwen2::semantics,
    },
    Family {
        arch: "qwen3",
        hf_names: &["qwen3", "Qwen3ForCausalLM"],
        semantics: qwen3::semantics,
    },
    Family {
        arch: "phi3",
        hf_names: &["phi3", "Phi3ForCausalLM"],
        semantics: phi3::semantics,
    },
    Family {
        arch: "hunyuan-dense",
        hf_names: &["hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM"],
        semantics: hunyuan::semantics,
    },
    Family {
        arch: "lfm2",
        hf_names: &["lfm2", "Lfm2ForCausalLM"],
        semantics: lfm2::semantics,
    },
    Family {
        arch: "qwen35",
        hf_names: &[
            "qwen3_5",
            "qwen3_5_text",
            "Qwen3_5ForCausalLM",
            "Qwen3_5ForConditionalGeneration",
        ],
        semantics: qwen35::semantics,
    },
];

pub fn by_arch(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.arch == arch)
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
