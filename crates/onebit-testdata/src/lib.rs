//! Where tests find their data.
//!
//! Fixtures live in the repository (`testdata/`); the real models live in a
//! cache outside it, filled by `scripts/fetch-models.sh`. A test that needs a
//! real model fails, never skips, when the model is missing: CI must not go
//! green without having run it.

use std::path::PathBuf;

/// The repository's `testdata/` directory.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// `testdata/llamacpp/<family>/`: tiny random-weight GGUFs with llama.cpp's logits.
pub fn fixture(family: &str) -> PathBuf {
    dir().join("llamacpp").join(family)
}

/// The real-model cache: `$ONEBIT_MODELS`, else `~/.cache/onebit/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ONEBIT_MODELS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/onebit/models")
}

pub const GEMMA3_270M: &str = "gemma-3-270m-q4_k_m.gguf";
pub const SMOLLM2_135M: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Path of a real model in the cache; panics with the fix when it is missing.
pub fn real_model(file: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(
        p.is_file(),
        "real model {} is missing: run scripts/fetch-models.sh (tests that need it fail rather than skip)",
        p.display()
    );
    p
}

/// Reads a little-endian f32 file (llama.cpp logits: [n_tokens][n_vocab]).
pub fn read_f32(path: impl Into<PathBuf>) -> Vec<f32> {
    let path = path.into();
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
