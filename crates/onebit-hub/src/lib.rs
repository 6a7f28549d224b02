//! Models by name. A reference (`ORG/REPO[:QUANT]`, `hf.co/ORG/REPO[:QUANT]`)
//! names a repository on the Hugging Face Hub and, for a GGUF repository, a
//! quant; [`pull()`] fetches what it names into the local [`store`], which is
//! the Hub's own cache layout (`~/.cache/huggingface/hub`), so that files
//! other tools fetched are found and ours are found by them.
//!
//! Invariant: a file under its final name in the store was checked whole
//! against the Hub's hash (LFS sha256, or the git blob SHA-1 of a small
//! file); a download in progress lives only under `blobs/<hash>.incomplete`,
//! and one file is written by one pull at a time (an flock per blob).

pub mod client;
pub mod lock;
pub mod pull;
pub mod reference;
pub mod select;
pub mod store;
pub mod verify;

pub use pull::{pull, Progress, PullOptions, Pulled};
pub use reference::Ref;
pub use store::{Local, Store};
