//! ggml block formats (filled in below).
