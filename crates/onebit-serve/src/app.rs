//! The application state: what every route reads. [`App`] holds the
//! server-wide settings and counters; [`Served`] one model that is loaded
//! and running on its engine thread, with what turns text into its tokens.
//! The bottom of the ordered modules (routes -> protocols -> run -> app):
//! it imports only leaf modules.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use onebit_text::{ChatTemplate, Tokenizer};

use crate::access;
use crate::api::{ApiError, Limits};
use crate::constrain::Constrainer;
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::pooling::Pooling;

/// What Ollama's `/api/tags` and `/api/show` report about a model.
#[derive(Clone, Debug, Default)]
pub struct ModelAbout {
    /// The architecture (GGUF `general.architecture`, a pack's family).
    pub arch: String,
    /// "gguf" or "fastflowlm".
    pub format: String,
    /// Bytes of the file or pack directory.
    pub bytes: u64,
    /// The weight type holding most bytes (e.g. "Q4_K").
    pub quantization: String,
    /// Parameters, from the tensor shapes.
    pub parameters: u64,
}

/// One model, loaded, with its engine thread.
pub struct Served {
    /// The name `/v1/models` lists and responses carry.
    pub name: String,
    pub engine: Engine,
    pub tok: Arc<Tokenizer>,
    /// The most bytes of text one token stands for (see [`max_token_bytes`]).
    pub max_token_bytes: usize,
    pub template: Option<ChatTemplate>,
    /// The token a finished grammar ends with (the first stop token).
    pub grammar_eos: Option<u32>,
    /// llguidance's per-model state, built at the first constrained request.
    pub constrainer: OnceLock<Result<Constrainer, String>>,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub ctx: usize,
    /// The engine drafts tokens (`--lookup`/`--draft`).
    pub drafting: bool,
    /// How embeddings pool, or why this model gives none.
    pub pooling: Result<Pooling, String>,
    /// Whether the model generates, or why not (an embedding model).
    pub generative: Result<(), String>,
    /// What `/api/tags` and `/api/show` say about the model.
    pub about: ModelAbout,
}

impl Served {
    /// The chat template knows `<think>` (a reasoning model).
    pub fn thinks(&self) -> bool {
        self.template
            .as_ref()
            .is_some_and(|t| t.source().contains("<think>"))
    }
}

/// The server: its settings, counters and the model it serves.
pub struct App {
    pub served: Arc<Served>,
    pub max_body_bytes: usize,
    pub body_timeout: Duration,
    pub allow_special_in_content: bool,
    /// Set on SIGTERM: `/health` answers 503 from then on.
    pub draining: AtomicBool,
    /// Largest `n`, largest `max_tokens` (0: up to the context).
    pub max_n: usize,
    pub max_tokens: usize,
    pub metrics: Arc<Metrics>,
    /// When the server started, in seconds since the epoch.
    pub started: u64,
}

impl App {
    /// The model a request names (`None`: it names none).
    pub async fn model(&self, _name: Option<&str>) -> Result<Arc<Served>, ApiError> {
        Ok(self.served.clone())
    }

    /// The limits `api::parse` checks a request against on model `m`.
    pub fn limits(&self, m: &Served) -> Limits {
        Limits {
            max_n: self.max_n,
            max_tokens: self.max_tokens,
            drafting: m.drafting,
        }
    }

    /// The JSON body: 415 unless it says it is JSON, 413 over the size
    /// limit (from Content-Length before reading, or while reading), 408
    /// when it does not arrive whole within the body timeout.
    pub async fn read_body(&self, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
        access::require_json(headers)?;
        let too_big = || {
            ApiError::invalid(
                None,
                format!(
                    "the request body is over this server's limit of {} bytes (--max-body-mib)",
                    self.max_body_bytes
                ),
            )
            .status(413)
        };
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_body_bytes as u64) {
            return Err(too_big());
        }
        match tokio::time::timeout(
            self.body_timeout,
            axum::body::to_bytes(body, self.max_body_bytes),
        )
        .await
        {
            Err(_) => Err(ApiError::invalid(
                None,
                format!(
                    "the request body did not arrive within {:?} (--body-timeout)",
                    self.body_timeout
                ),
            )
            .status(408)),
            Ok(Err(e)) => {
                // Over the limit, or the connection failed mid-body.
                if std::error::Error::source(&e)
                    .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                {
                    Err(too_big())
                } else {
                    Err(ApiError::invalid(
                        None,
                        format!("cannot read the body: {e}"),
                    ))
                }
            }
            Ok(Ok(b)) => Ok(b),
        }
    }

    /// The engine's queue is full: the rejection is counted and the client
    /// gets a 503 it may retry (every route that submits work answers so).
    pub fn queue_full(&self) -> ApiError {
        Metrics::add(&self.metrics.requests_rejected_full, 1);
        ApiError {
            status: 503,
            message: "the server is busy: its request queue is full; retry shortly".into(),
            kind: "server_error",
            param: None,
            code: Some("queue_full"),
        }
    }
}

/// The most bytes of text any one token decodes to, from the vocabulary's
/// own spelling of each token, which is never shorter than the bytes it
/// stands for (GPT-2's byte alphabet spells a byte in one or two; the
/// SentencePiece `▁` is three bytes for a one-byte space; `<0xAB>` is six).
/// A text of B bytes therefore needs at least B / this many tokens.
pub fn max_token_bytes(tok: &Tokenizer) -> usize {
    (0..tok.vocab_size() as u32)
        .filter_map(|id| tok.id_to_token(id))
        .map(|t| t.len())
        .max()
        .unwrap_or(1)
        .max(1)
}
