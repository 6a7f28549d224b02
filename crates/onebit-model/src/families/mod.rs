//! One file per model family, each holding only what that family does
//! differently. `common` reads what every family declares the same way; a
//! family file turns its metadata into `Semantics` and names any extra tensors.

pub mod common;
pub mod gemma3;
pub mod llama;

use onebit_formats::gguf::Gguf;

use crate::error::{ModelError, Result};
use crate::semantics::Semantics;

/// A family: its GGUF architecture name and how it reads its semantics.
pub struct Family {
    pub arch: &'static str,
    pub from_gguf: fn(&Gguf) -> Result<Semantics>,
}

/// Every family onebit runs, by GGUF `general.architecture`.
pub const FAMILIES: &[Family] = &[
    Family {
        arch: "llama",
        from_gguf: llama::from_gguf,
    },
    Family {
        arch: "gemma3",
        from_gguf: gemma3::from_gguf,
    },
];

/// Reads the semantics of a GGUF model, refusing an architecture we do not run.
pub fn semantics_from_gguf(g: &Gguf) -> Result<Semantics> {
    let arch = g.str("general.architecture")?;
    let fam = FAMILIES
        .iter()
        .find(|f| f.arch == arch)
        .ok_or_else(|| ModelError::Unsupported {
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
    (fam.from_gguf)(g)
}
