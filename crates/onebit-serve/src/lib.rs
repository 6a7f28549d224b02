//! `onebit serve`: an OpenAI- and Ollama-compatible HTTP server over one or
//! more models, picked by the request's `model` and loaded on demand.
//!
//! The binary hands over, per model, a name and a loader that gives the
//! loaded [`Model`](onebit_model::Model), its tokenizer, chat template and
//! stop ids; this crate knows nothing of file formats. One engine thread
//! owns the model and batches every active sequence into each forward
//! ([`engine`]); the HTTP side (axum on a current-thread tokio runtime) is
//! laid out by role, each module importing only those below it (a test,
//! `module_order`, reads the sources and holds this):
//!
//! 1. [`routes`]: which path goes to which handler;
//! 2. the protocols, one module each: [`openai`] (chat and completions),
//!    [`ollama`], [`embed`] (OpenAI's embeddings), [`tokenize`]
//!    (llama-server's `/tokenize`, `/detokenize`), each parsing its request
//!    straight into the engine's request type ([`api::Request`]) and shaping
//!    the answers;
//! 3. [`run`]: prompts rendered and tokenized, jobs set up and submitted,
//!    engine events turned into text, for every protocol alike;
//! 4. [`app`]: the application state;
//! 5. leaves, which import no module above: [`api`], [`engine`], [`cache`],
//!    [`metrics`], [`text`], [`harmony`], [`tools`], [`constrain`], [`prompt`], ...
//!
//! The port is bound before the model loads, so a fleet's load balancer or
//! Kubernetes sees the replica at once: [`gate`] answers `/health/live` from
//! the start, `/health` with 503 until the model is ready and again from the
//! moment SIGTERM/SIGINT arrives (draining), and forwards everything else to
//! the [`routes`] once they exist.

pub mod access;
pub mod affinity;
pub mod anthropic;
pub mod api;
pub mod app;
pub mod cache;
pub mod conn;
pub mod constrain;
pub mod embed;
pub mod engine;
pub mod fields;
pub mod gate;
pub mod harmony;
pub mod image_prompt;
pub mod images;
pub mod metrics;
pub mod ollama;
pub mod openai;
pub mod pace;
pub mod page;
pub mod pooling;
pub mod prompt;
pub mod pull;
pub mod reply;
pub mod reqlog;
pub mod responses;
pub mod routes;
pub mod run;
pub mod schema_check;
pub mod stored;
pub mod text;
pub mod tokenize;
pub mod tool_args;
pub mod tools;

#[cfg(test)]
mod module_order;

pub use app::{generative, Loaded, ModelAbout, ModelSource};

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::app::{App, Registry};
use crate::engine::EngineConfig;
use crate::fields::KeepAlive;
use crate::gate::{Gate, Phase};
use crate::metrics::Metrics;

#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub host: String,
    /// 0 picks a free port (the startup line says which).
    pub port: u16,
    /// Models loaded at once at most; loading one more unloads the least
    /// recently used.
    pub max_loaded: usize,
    /// Bytes the loaded models may take together (each its file plus its
    /// sequences' states at the full context and its prefix cache); None:
    /// no bound but `max_loaded`.
    pub max_memory: Option<u64>,
    /// How long a model stays loaded after its last request, unless the
    /// request's `keep_alive` says otherwise.
    pub idle_unload: KeepAlive,
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
    /// The prefix cache's budget; None: one full context's state of the
    /// model, at most 1 GiB (`engine::default_cache_bytes`).
    pub cache_bytes: Option<usize>,
    pub max_body_bytes: usize,
    pub prefill_chunk: usize,
    /// While a sequence decodes, a step runs only the prompt tokens the
    /// machine runs in this long (zero: `prefill_chunk` alone bounds it).
    pub max_step: Duration,
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
    /// Request fields the server does not read are a 400; otherwise they
    /// are answered and named in `x-onebit-ignored-fields` and the log.
    pub strict_fields: bool,
    /// How the access log's lines are written ([`reqlog`]).
    pub log_format: reqlog::LogFormat,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            max_loaded: 1,
            max_memory: None,
            idle_unload: KeepAlive::For(Duration::from_secs(300)),
            max_seqs: 8,
            max_queue: 64,
            max_n: 8,
            max_tokens: 0,
            prefix_cache: true,
            cache_bytes: None,
            max_body_bytes: 4 << 20,
            prefill_chunk: 512,
            max_step: Duration::from_millis(300),
            access: access::Access::default(),
            cors_origins: Vec::new(),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 1024,
            shutdown_timeout: Duration::from_secs(30),
            allow_special_in_content: false,
            strict_fields: false,
            log_format: reqlog::LogFormat::Text,
        }
    }
}

/// Binds the port, loads the first of `models` (the default, on a blocking
/// thread, while `/health` answers 503), then serves until SIGINT or
/// SIGTERM, loading the others when a request names them; after the signal
/// `/health` answers 503, no new connection is accepted, and running
/// requests get `cfg.shutdown_timeout` to finish.
pub fn serve(cfg: ServeConfig, models: Vec<ModelSource>) -> Result<()> {
    serve_with(cfg, models, None)
}

/// As [`serve`], with `catalog` behind `/api/pull` and `/api/delete`.
pub fn serve_with(
    cfg: ServeConfig,
    models: Vec<ModelSource>,
    catalog: Option<Arc<dyn app::Catalog>>,
) -> Result<()> {
    anyhow::ensure!(!models.is_empty(), "no model to serve");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let r = rt.block_on(start(cfg, models, catalog));
    // A tokenization still running on the blocking pool is not waited for.
    rt.shutdown_timeout(Duration::from_secs(1));
    r
}

async fn start(
    cfg: ServeConfig,
    models: Vec<ModelSource>,
    catalog: Option<Arc<dyn app::Catalog>>,
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
    // At the end of the shutdown timeout, what still runs is cut: each
    // request fails with SHUTTING_DOWN (a 503, a stream's error event).
    let app_slot: Arc<OnceLock<Arc<App>>> = Arc::default();
    let cut = {
        let slot = app_slot.clone();
        move || {
            for m in slot
                .get()
                .map(|a| a.models.all_loaded())
                .unwrap_or_default()
            {
                m.engine.cut(engine::SHUTTING_DOWN);
            }
        }
    };
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
        cut,
    ));

    let mut registry = Registry::new(
        models,
        cfg.max_loaded,
        cfg.idle_unload,
        EngineConfig {
            max_seqs: cfg.max_seqs.max(1),
            max_queue: cfg.max_queue,
            prefill_chunk: cfg.prefill_chunk,
            max_step: cfg.max_step,
            prefix_cache: cfg.prefix_cache,
            cache_bytes: cfg.cache_bytes,
            spec: None,
            fault: None,
            vision: None,
        },
        metrics.clone(),
    );
    registry.max_memory = cfg.max_memory;
    let app = Arc::new(App {
        models: registry,
        max_body_bytes: cfg.max_body_bytes,
        body_timeout: cfg.body_timeout,
        allow_special_in_content: cfg.allow_special_in_content,
        strict_fields: cfg.strict_fields,
        draining: AtomicBool::new(false),
        max_n: cfg.max_n,
        max_tokens: cfg.max_tokens,
        metrics,
        started: reply::unix_now(),
        catalog,
        responses: Default::default(),
        log_format: cfg.log_format,
    });
    let _ = app_slot.set(app.clone());
    // The default model loads before the routes open.
    let first = tokio::select! {
        r = app.model(None) => r.map_err(|e| anyhow::anyhow!("{}", e.message))?,
        _ = signalled.wait_for(|s| *s) => {
            eprintln!("[serve] stopped before the model was loaded");
            return Ok(());
        }
    };
    let mut access = cfg.access.clone();
    access.bound_host = cfg.host.to_ascii_lowercase();
    access.cors_origins = cfg.cors_origins.clone();
    gate.open(routes::router(app.clone(), Arc::new(access), Some(cors)));
    let names = app.models.names();
    eprintln!(
        "[serve] {} ({}) listening on http://{local} - context {}, {} sequences per step, queue {}, prefix cache {}, chat template {}; {} model{} ({}), at most {} loaded",
        first.name,
        first.summary,
        first.ctx,
        cfg.max_seqs,
        cfg.max_queue,
        if cfg.prefix_cache { "on" } else { "off" },
        if first.template.is_some() { "yes" } else { "none (chat requests answer 400)" },
        names.len(),
        if names.len() == 1 { "" } else { "s" },
        names.join(", "),
        app.models.max_loaded,
    );
    drop(first);
    if !local.ip().is_loopback() && cfg.access.api_keys.is_empty() {
        eprintln!(
            "[serve] warning: listening on {local}, beyond this machine, with no API key: anyone who can reach it can use it (set --api-key, ONEBIT_API_KEY or --api-key-file)"
        );
    }
    // Idle models unload when their keep-alive ends.
    let sweeper = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                app.models.sweep();
            }
        })
    };
    // Running requests finish within the timeout (conn::serve bounds it).
    server.await.context("the HTTP server task failed")?;
    sweeper.abort();
    let loaded = app.models.all_loaded();
    tokio::task::spawn_blocking(move || {
        for m in loaded {
            m.engine.shutdown();
        }
    })
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
