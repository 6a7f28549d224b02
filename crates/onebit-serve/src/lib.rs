//! `onebit serve`: an OpenAI-compatible HTTP server over one loaded model.
//!
//! The binary hands over a loaded [`Model`], its [`Tokenizer`], chat template
//! and stop ids; this crate knows nothing of file formats. One engine thread
//! owns the model and batches every active sequence into each forward
//! ([`engine`]); the HTTP side (axum on a current-thread tokio runtime)
//! parses and checks requests ([`api`]), renders templates, tokenizes, and
//! turns the engine's tokens into OpenAI's response shapes ([`http`], [`text`]).
//!
//! The port is bound before the model loads, so a fleet's load balancer or
//! Kubernetes sees the replica at once: [`gate`] answers `/health/live` from
//! the start, `/health` with 503 until the model is ready and again from the
//! moment SIGTERM/SIGINT arrives (draining), and forwards everything else to
//! the routes of [`http`] once they exist.

pub mod access;
pub mod affinity;
pub mod api;
pub mod cache;
pub mod conn;
pub mod constrain;
pub mod embed;
pub mod engine;
pub mod gate;
pub mod http;
pub mod metrics;
pub mod ollama;
pub mod page;
pub mod prompt;
pub mod text;
pub mod tool_args;
pub mod tools;

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use onebit_model::spec::SpecPlan;
use onebit_model::Model;
use onebit_text::{ChatTemplate, Tokenizer};

use crate::engine::{Engine, EngineConfig};
use crate::gate::{Gate, Phase};
use crate::metrics::Metrics;

#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub host: String,
    /// 0 picks a free port (the startup line says which).
    pub port: u16,
    /// The name `/v1/models` lists and responses carry.
    pub model_name: String,
    /// Sequences decoded together at most.
    pub max_seqs: usize,
    /// Sequences waiting for a slot at most; beyond, 503.
    pub max_queue: usize,
    /// Largest `n` a request may ask for.
    pub max_n: usize,
    /// Largest `max_tokens` a request may ask for (and the default when it
    /// states none); 0: up to the context.
    pub max_tokens: usize,
    pub prefix_cache: bool,
    pub cache_bytes: usize,
    pub max_body_bytes: usize,
    pub prefill_chunk: usize,
    /// Who may use the server (keys, hosts).
    pub access: access::Access,
    /// Origins CORS admits (`*`: any); empty: CORS off.
    pub cors_origins: Vec<String>,
    pub header_timeout: Duration,
    /// The whole request body must arrive within this.
    pub body_timeout: Duration,
    pub max_connections: usize,
    pub shutdown_timeout: Duration,
    /// Special-token text inside message content becomes control tokens
    /// (the old behaviour); otherwise it is tokenized as plain text.
    pub allow_special_in_content: bool,
}

/// What the server runs: the model and what turns text into its tokens.
pub struct Loaded {
    pub model: Model,
    pub tok: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub stops: Vec<u32>,
    /// One line about the model for the startup line.
    pub summary: String,
    /// Speculative decoding (`--lookup`/`--draft`), for requests that keep it on.
    pub spec: Option<SpecPlan>,
    /// How embeddings pool, or why this model gives none.
    pub pooling: Result<embed::Pooling, String>,
    pub about: ModelAbout,
}

/// What Ollama's `/api/tags` and `/api/show` report about the model.
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

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            model_name: "model".into(),
            max_seqs: 8,
            max_queue: 64,
            max_n: 8,
            max_tokens: 0,
            prefix_cache: true,
            cache_bytes: 1 << 30,
            max_body_bytes: 4 << 20,
            prefill_chunk: 512,
            access: access::Access::default(),
            cors_origins: Vec::new(),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 1024,
            shutdown_timeout: Duration::from_secs(30),
            allow_special_in_content: false,
        }
    }
}

/// Binds the port, loads the model with `load` (on a blocking thread, while
/// `/health` answers 503), then serves until SIGINT or SIGTERM; after the
/// signal `/health` answers 503, no new connection is accepted, and running
/// requests get `cfg.shutdown_timeout` to finish.
pub fn serve(
    cfg: ServeConfig,
    load: impl FnOnce() -> Result<Loaded> + Send + 'static,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let r = rt.block_on(run(cfg, load));
    // A tokenization still running on the blocking pool is not waited for.
    rt.shutdown_timeout(Duration::from_secs(1));
    r
}

async fn run(
    cfg: ServeConfig,
    load: impl FnOnce() -> Result<Loaded> + Send + 'static,
) -> Result<()> {
    let cors = access::cors_layer(&cfg.cors_origins).map_err(anyhow::Error::msg)?;
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local: SocketAddr = listener.local_addr()?;
    eprintln!("[serve] bound to http://{local}; loading the model (GET /health answers 503 until it is ready)");
    let gate = Arc::new(Gate::default());
    let metrics = Arc::new(Metrics::default());
    let (signalled_tx, mut signalled) = tokio::sync::watch::channel(false);
    let on_signal = {
        let gate = gate.clone();
        let drain_for = cfg.shutdown_timeout;
        async move {
            shutdown_signal().await;
            gate.set_phase(Phase::Draining);
            let _ = signalled_tx.send(true);
            eprintln!("[serve] shutting down: finishing running requests (at most {drain_for:?})");
        }
    };
    let server = tokio::spawn(conn::serve(
        listener,
        gate::router(gate.clone()),
        conn::ConnLimits {
            header_timeout: cfg.header_timeout,
            max_connections: cfg.max_connections,
            shutdown_timeout: cfg.shutdown_timeout,
            ..conn::ConnLimits::default()
        },
        metrics.clone(),
        on_signal,
    ));

    let loaded = tokio::select! {
        r = tokio::task::spawn_blocking(load) => match r {
            Ok(r) => r?,
            Err(e) => anyhow::bail!("loading the model failed: {e}"),
        },
        _ = signalled.wait_for(|s| *s) => {
            eprintln!("[serve] stopped before the model was loaded");
            return Ok(());
        }
    };
    let Loaded {
        model,
        tok,
        template,
        stops,
        summary,
        spec,
        pooling,
        about,
    } = loaded;
    let drafting = spec.is_some();
    if let Some(p) = &spec {
        eprintln!("[serve] speculative decoding: {p:?}");
    }
    let ctx = model.max_context();
    let n_vocab = model.sem.dims.n_vocab;
    let n_embd = model.sem.dims.n_embd;
    let grammar_eos = stops.first().copied();
    let generative = generative(&model.sem, &cfg.model_name);
    let engine = Engine::start(
        model,
        stops,
        EngineConfig {
            max_seqs: cfg.max_seqs.max(1),
            max_queue: cfg.max_queue,
            prefill_chunk: cfg.prefill_chunk,
            prefix_cache: cfg.prefix_cache,
            cache_bytes: cfg.cache_bytes,
            spec: spec.map(Arc::new),
        },
        metrics.clone(),
    );
    let has_template = template.is_some();
    let max_token_bytes = http::max_token_bytes(&tok);
    let app = Arc::new(http::App {
        engine,
        tok: Arc::new(tok),
        max_token_bytes,
        max_body_bytes: cfg.max_body_bytes,
        body_timeout: cfg.body_timeout,
        allow_special_in_content: cfg.allow_special_in_content,
        draining: AtomicBool::new(false),
        template,
        grammar_eos,
        constrainer: std::sync::OnceLock::new(),
        model_name: cfg.model_name.clone(),
        n_vocab,
        ctx,
        limits: api::Limits {
            max_n: cfg.max_n,
            max_tokens: cfg.max_tokens,
            drafting,
        },
        metrics,
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        pooling,
        n_embd,
        generative,
        about,
    });
    let mut access = cfg.access.clone();
    access.bound_host = cfg.host.to_ascii_lowercase();
    access.cors_origins = cfg.cors_origins.clone();
    gate.open(http::router(app.clone(), Arc::new(access), cors));
    eprintln!(
        "[serve] {} ({summary}) listening on http://{local} - context {ctx}, {} sequences per step, queue {}, prefix cache {}, chat template {}",
        cfg.model_name,
        cfg.max_seqs,
        cfg.max_queue,
        if cfg.prefix_cache { "on" } else { "off" },
        if has_template { "yes" } else { "none (chat requests answer 400)" },
    );
    if !local.ip().is_loopback() && cfg.access.api_keys.is_empty() {
        eprintln!(
            "[serve] warning: listening on {local}, beyond this machine, with no API key: anyone who can reach it can use it (set --api-key, ONEBIT_API_KEY or --api-key-file)"
        );
    }
    // Running requests finish within the timeout (conn::serve bounds it).
    server.await.context("the HTTP server task failed")?;
    let app2 = app.clone();
    tokio::task::spawn_blocking(move || app2.engine.shutdown())
        .await
        .ok();
    eprintln!("[serve] stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("[serve] signal received");
}

/// Ok for a model that generates; the reason for one that does not (an
/// embedding model: bidirectional attention has no next token).
pub fn generative(sem: &onebit_model::Semantics, name: &str) -> Result<(), String> {
    match sem.mask.value {
        onebit_model::semantics::Mask::Causal => Ok(()),
        onebit_model::semantics::Mask::Bidirectional => Err(format!(
            "model `{name}` ({}) is an embedding model with bidirectional attention and no generative head; it serves /v1/embeddings and /api/embed only",
            sem.family
        )),
    }
}
