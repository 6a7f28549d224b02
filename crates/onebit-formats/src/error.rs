use std::path::PathBuf;

/// Every error names the file and, where there is one, the key or tensor at
/// fault, so a user can tell which download is broken and how.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Malformed { path: PathBuf, what: String },
    #[error("{path}: metadata key `{key}`: {what}")]
    Key {
        path: PathBuf,
        key: String,
        what: String,
    },
    #[error("{path}: tensor `{tensor}`: {what}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        what: String,
    },
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;
