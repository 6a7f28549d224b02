//! Models.
