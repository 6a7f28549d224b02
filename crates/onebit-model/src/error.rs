use std::path::PathBuf;

use onebit_formats::FormatError;

/// Model-level errors; each names the file and the key or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{path}: `{key}`: {what}")]
    Key {
        path: PathBuf,
        key: String,
        what: String,
    },
    #[error("{path}: {what}")]
    Unsupported { path: PathBuf, what: String },
    #[error("{path}: tensor `{tensor}`: {what}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        what: String,
    },
    #[error("{0}")]
    Input(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
