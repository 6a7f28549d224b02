//! Models: semantics read from the model's own declarations, one file per
//! family, weight loading, the forward, per-sequence state and sampling.

pub mod error;
pub mod families;
pub mod forward;
pub mod load;
mod mixers;
pub mod moe;
pub mod pack;
mod rows;
pub mod sampler;
pub mod semantics;
pub mod spec;
pub mod state;
pub mod vision;
pub mod weights;

pub use error::{ModelError, Result};
pub use forward::{Embeds, ExecConfig, Logits, Model, SeqInput};
pub use semantics::Semantics;
pub use state::SeqState;
