//! The application state: what every route reads. [`App`] holds the
//! server-wide settings and counters and the [`Registry`] of every model it
//! serves; [`Served`] is one model loaded and running on its engine thread,
//! with what turns text into its tokens. Models load on demand, at most
//! `--max-loaded` at once, the least recently used evicted first; an idle
//! model unloads when its keep-alive ends, and its memory is freed when the
//! last request holding it ends. The bottom of the ordered modules
//! (routes -> protocols -> run -> app): it imports only leaf modules.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use onebit_model::spec::SpecPlan;
use onebit_model::Model;
use onebit_text::{ChatTemplate, Tokenizer};
use tokio::sync::Notify;

use crate::api::{ApiError, Limits};
use crate::constrain::Constrainer;
use crate::engine::{Engine, EngineConfig};
use crate::fields::KeepAlive;
use crate::images::Vision;
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

/// What the binary loads for one model: the model and what turns text into
/// its tokens.
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
    pub pooling: Result<Pooling, String>,
    pub about: ModelAbout,
    /// The vision tower's processor (`--mmproj`), for a model that takes
    /// images; `None`: images are refused naming the model.
    pub vision: Option<Vision>,
}

/// One model, loaded, with its engine thread (stopped and joined, and the
/// model's memory freed, when the last holder lets go).
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
    /// One line about the model (the startup line's).
    pub summary: String,
    /// How images are prepared for the model's vision tower, if it has one.
    pub vision: Option<Vision>,
    /// Bytes its sequences may hold beyond the weights: `max_seqs` states
    /// at the full context plus the prefix cache's budget (what
    /// `--max-memory` counts, with the file's size).
    pub state_bytes: u64,
    /// Last, so it drops after everything above: gives the freed memory
    /// back to the system.
    _trim: TrimOnDrop,
}

/// Hands the C allocator's free pages back to the system when dropped.
/// A model's tokenizer, templates and engine state live in glibc's
/// per-thread arenas (64 MiB heaps), which keep freed pages resident: after
/// unloading Gemma 3 270M beside SmolLM2, two such heaps held 128 MB and the
/// server's RSS stayed 100 MB above what SmolLM2 alone needs. The repacked
/// weights are their own mapping and go back without this.
struct TrimOnDrop;

impl Drop for TrimOnDrop {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free memory the allocator holds;
        // it takes no pointer and is safe to call from any thread at any
        // time (glibc locks each arena while it trims it).
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.engine.shutdown();
    }
}

impl Served {
    /// Starts `loaded`'s engine thread, named `name`.
    pub fn start(name: &str, loaded: Loaded, cfg: &EngineConfig, metrics: Arc<Metrics>) -> Served {
        let Loaded {
            model,
            tok,
            template,
            stops,
            summary,
            spec,
            pooling,
            about,
            vision,
        } = loaded;
        let drafting = spec.is_some();
        if let Some(p) = &spec {
            eprintln!("[serve] {name}: speculative decoding: {p:?}");
        }
        let ctx = model.max_context();
        let full = model.new_state().bytes_at(ctx) as u64;
        let cache = if cfg.prefix_cache {
            cfg.cache_bytes
                .unwrap_or_else(|| crate::engine::default_cache_bytes(&model)) as u64
        } else {
            0
        };
        let state_bytes = (cfg.max_seqs.max(1) as u64)
            .saturating_mul(full)
            .saturating_add(cache);
        let n_vocab = model.sem.dims.n_vocab;
        let n_embd = model.sem.dims.n_embd;
        let grammar_eos = stops.first().copied();
        let generative = generative(&model.sem, name);
        let engine = Engine::start(
            model,
            stops,
            EngineConfig {
                spec: spec.map(Arc::new),
                vision: vision.as_ref().and_then(|v| v.tower.clone()),
                ..cfg.clone()
            },
            metrics,
        );
        Served {
            name: name.to_string(),
            engine,
            max_token_bytes: max_token_bytes(&tok),
            tok: Arc::new(tok),
            template,
            grammar_eos,
            constrainer: OnceLock::new(),
            n_vocab,
            n_embd,
            ctx,
            drafting,
            pooling,
            generative,
            about,
            summary,
            vision,
            state_bytes,
            _trim: TrimOnDrop,
        }
    }

    /// The chat template knows `<think>` (a reasoning model).
    pub fn thinks(&self) -> bool {
        self.template
            .as_ref()
            .is_some_and(|t| t.source().contains("<think>"))
    }

    /// The model declares the harmony reply format ([`crate::harmony::declared`]:
    /// its template and its vocabulary's control tokens).
    pub fn harmony(&self) -> bool {
        self.template.as_ref().is_some_and(|t| {
            let control = |s: &str| {
                self.tok
                    .token_to_id(s)
                    .is_some_and(|id| self.tok.is_special(id))
            };
            crate::harmony::declared(t.source(), control).is_some()
        })
    }
}

/// The server: its settings, counters and the models it serves.
pub struct App {
    pub models: Registry,
    pub max_body_bytes: usize,
    pub body_timeout: Duration,
    pub allow_special_in_content: bool,
    /// Fields a request carries that the server does not read are a 400
    /// (`--strict-fields`), not a header and a log line.
    pub strict_fields: bool,
    /// Set on SIGTERM: `/health` answers 503 from then on.
    pub draining: AtomicBool,
    /// Largest `n`, largest `max_tokens` (0: up to the context).
    pub max_n: usize,
    pub max_tokens: usize,
    pub metrics: Arc<Metrics>,
    /// When the server started, in seconds since the epoch.
    pub started: u64,
    /// Where `/api/pull` and `/api/delete` go (None: they are refused).
    pub catalog: Option<Arc<dyn Catalog>>,
    /// Responses kept for the Responses API's `previous_response_id`.
    pub responses: crate::stored::ResponseStore,
    /// How the access log's lines are written.
    pub log_format: crate::reqlog::LogFormat,
}

impl App {
    /// The model a request names (`None`: it names none, the default),
    /// loaded; an unknown name is a 404 naming `model`.
    pub async fn model(&self, name: Option<&str>) -> Result<Arc<Served>, ApiError> {
        self.model_kept(name, None).await
    }

    /// As [`App::model`], the model then kept loaded `keep` after its
    /// requests end (`None`: the server's `--idle-unload`).
    pub async fn model_kept(
        &self,
        name: Option<&str>,
        keep: Option<KeepAlive>,
    ) -> Result<Arc<Served>, ApiError> {
        let e = self.models.find(name)?;
        // The access log names the model from here on, errors included.
        crate::reqlog::update(&crate::reqlog::current(), |r| {
            r.model = Some(e.name.clone())
        });
        self.models.acquire(&e, keep).await
    }

    /// The limits `api::parse` checks a request against on model `m`.
    pub fn limits(&self, m: &Served) -> Limits {
        Limits {
            max_n: self.max_n,
            max_tokens: self.max_tokens,
            drafting: m.drafting,
        }
    }

    /// The body, whatever its Content-Type (the handlers parse it as JSON;
    /// a browser's cross-site post was refused by its `Origin` before):
    /// 413 over the size limit (from Content-Length before reading, or
    /// while reading), 408 when it does not arrive whole within the body
    /// timeout.
    pub async fn read_body(&self, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
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
                } else if crate::conn::is_slow_body(&e) {
                    Err(ApiError::invalid(None, format!("{e} (the minimum body rate)")).status(408))
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
        queue_full(
            &self.metrics,
            "the server is busy: its request queue is full; retry shortly".into(),
        )
    }
}

/// A full queue (the engine's, or the wait for a model's load): counted, and
/// a 503 the client may retry, with `message` saying which.
fn queue_full(metrics: &Metrics, message: String) -> ApiError {
    Metrics::add(&metrics.requests_rejected_full, 1);
    ApiError {
        status: 503,
        message,
        kind: "server_error",
        param: None,
        code: Some("queue_full"),
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

/// How to load one model: the binary's loader (file formats are its
/// business, not this crate's).
pub type Loader = Arc<dyn Fn() -> anyhow::Result<Loaded> + Send + Sync>;

/// One step of a pull, as `/api/pull` streams it.
#[derive(Clone, Debug)]
pub enum PullStep {
    /// A file: its hash, size and bytes in so far.
    File {
        digest: String,
        total: u64,
        completed: u64,
    },
    /// Anything else (`pulling manifest`, a resume, `verifying sha256 digest`).
    Status(String),
}

/// Where models by name come from: the binary's local store and the Hub
/// behind it, for `/api/pull` and `/api/delete`. Blocking calls (the
/// server runs them off its runtime's thread).
pub trait Catalog: Send + Sync {
    /// Fetches the model `name` names (`ORG/REPO[:QUANT]`) into the store,
    /// telling `step` as it goes; the source to serve it as.
    /// An error is its HTTP status and message.
    fn pull(
        &self,
        name: &str,
        step: &mut dyn FnMut(PullStep),
    ) -> Result<ModelSource, (u16, String)>;
    /// Removes the model `name` from the store; an error is its HTTP
    /// status and message.
    fn delete(&self, name: &str) -> Result<(), (u16, String)>;
}

/// One model the server can serve: its name and how to load it.
pub struct ModelSource {
    /// The name requests pick it by (a file stem, a pack directory name, or
    /// the NAME of `--model NAME=PATH`).
    pub name: String,
    /// Bytes of its file or pack directory (what `/api/tags` reports before
    /// it is first loaded).
    pub bytes: u64,
    pub load: Loader,
}

enum State {
    Unloaded,
    Loading,
    Loaded {
        served: Arc<Served>,
        /// The registry's clock at the last request (least recently used
        /// is evicted first).
        used: u64,
        /// When an idle model unloads (None: never).
        expires: Option<Instant>,
    },
}

/// A model's row in the registry.
pub struct Entry {
    pub name: String,
    pub bytes: u64,
    load: Loader,
    state: Mutex<State>,
    /// Woken when a load ends (requests waiting for it go on).
    changed: Notify,
    /// Requests waiting for a load under way.
    waiting: AtomicUsize,
    /// What the last load said about the model (for `/api/tags`).
    about: Mutex<Option<ModelAbout>>,
    pub requests: AtomicU64,
    pub loads: AtomicU64,
    pub unloads: AtomicU64,
}

/// Every model the server serves, loaded on demand within `max_loaded`,
/// least recently used evicted first, idle ones unloaded when their
/// keep-alive ends.
pub struct Registry {
    /// The models served, in order (the first is the default); `/api/pull`
    /// adds to it, `/api/delete` takes from it.
    entries: RwLock<Vec<Arc<Entry>>>,
    pub max_loaded: usize,
    /// Bytes the loaded models may take together (`--max-memory`), each
    /// counted as [`Registry::footprint`]; None: no bound but `max_loaded`.
    pub max_memory: Option<u64>,
    /// How long a model stays loaded after a request that states no
    /// `keep_alive` (`--idle-unload`).
    pub idle: KeepAlive,
    engine: EngineConfig,
    metrics: Arc<Metrics>,
    clock: AtomicU64,
}

impl Registry {
    pub fn new(
        sources: Vec<ModelSource>,
        max_loaded: usize,
        idle: KeepAlive,
        engine: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Registry {
        let entries = sources.into_iter().map(entry).collect();
        Registry {
            entries: RwLock::new(entries),
            max_loaded: max_loaded.max(1),
            max_memory: None,
            idle,
            engine,
            metrics,
            clock: AtomicU64::new(0),
        }
    }

    /// The entry `name` picks: its name, or its name with Ollama's
    /// `:latest` tag; none given, the first (the default model).
    pub fn find(&self, name: Option<&str>) -> Result<Arc<Entry>, ApiError> {
        let entries = self.entries();
        let Some(name) = name else {
            return entries.first().cloned().ok_or_else(|| {
                ApiError::invalid(
                    "model",
                    "this server serves no model now; name one to pull it (POST /api/pull)",
                )
                .status(404)
                .with_code("model_not_found")
            });
        };
        let bare = name.strip_suffix(":latest").unwrap_or(name);
        entries
            .iter()
            .find(|e| e.name == name || e.name == bare)
            .cloned()
            .ok_or_else(|| {
                ApiError::invalid(
                    "model",
                    format!(
                        "model `{name}` is not served here; this server serves {}",
                        self.names().join(", ")
                    ),
                )
                .status(404)
                .with_code("model_not_found")
            })
    }

    pub fn names(&self) -> Vec<String> {
        self.entries().iter().map(|e| e.name.clone()).collect()
    }

    /// The models served now, in order.
    pub fn entries(&self) -> Vec<Arc<Entry>> {
        self.entries
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Serves `s` too (a model just pulled); one of its name already served
    /// is kept, and returned.
    pub fn add(&self, s: ModelSource) -> Arc<Entry> {
        let mut v = self.entries.write().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = v.iter().find(|e| e.name == s.name) {
            return e.clone();
        }
        let e = entry(s);
        v.push(e.clone());
        e
    }

    /// Stops serving `name`: unloaded (its memory freed when its running
    /// requests end) and out of the list.
    pub fn remove(&self, name: &str) -> Option<Arc<Entry>> {
        let e = {
            let mut v = self.entries.write().unwrap_or_else(|p| p.into_inner());
            let i = v.iter().position(|e| e.name == name)?;
            v.remove(i)
        };
        self.unload(&e, "deleted");
        Some(e)
    }

    /// The loaded model of `e`, loading it first (evicting the least
    /// recently used beyond `max_loaded`) or waiting for a load under way;
    /// its keep-alive starts again.
    pub async fn acquire(
        &self,
        e: &Arc<Entry>,
        keep: Option<KeepAlive>,
    ) -> Result<Arc<Served>, ApiError> {
        Metrics::add(&e.requests, 1);
        // Counted while this request waits for a load under way; the
        // guard takes it off however the wait ends.
        let mut waiting: Option<Waiting> = None;
        loop {
            let notified = e.changed.notified();
            tokio::pin!(notified);
            {
                let mut st = lock(&e.state);
                match &mut *st {
                    State::Loaded {
                        served,
                        used,
                        expires,
                    } => {
                        *used = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
                        *expires = expiry(keep.unwrap_or(self.idle));
                        return Ok(served.clone());
                    }
                    State::Loading => {
                        // The queue limits apply while the model loads: as
                        // many wait as the engine's queue takes at once
                        // when the load ends (with the request loading it,
                        // `--max-queue` in all), the rest are told to retry.
                        if waiting.is_none() {
                            let limit = self.engine.max_queue.saturating_sub(1);
                            if e.waiting.fetch_add(1, Ordering::Relaxed) >= limit {
                                e.waiting.fetch_sub(1, Ordering::Relaxed);
                                return Err(queue_full(
                                    &self.metrics,
                                    format!(
                                        "the server is busy: {} requests already wait for model `{}` to load (--max-queue); retry shortly",
                                        limit + 1,
                                        e.name
                                    ),
                                ));
                            }
                            waiting = Some(Waiting(e.clone()));
                        }
                        // Registered before the lock is released: a load
                        // that ends in between still wakes this waiter.
                        notified.as_mut().enable();
                    }
                    State::Unloaded => {
                        *st = State::Loading;
                        // This request loads it now: no longer waiting.
                        drop(waiting.take());
                        break;
                    }
                }
            }
            notified.await;
        }
        // A request that goes away mid-load (its future dropped) leaves the
        // entry unloaded for the next one to load, not stuck loading.
        let mut guard = LoadGuard { e, done: false };
        self.check_fits_alone(e)?;
        // Room for its file now; its states are known once it is loaded.
        self.make_room(e, e.bytes);
        let load = e.load.clone();
        let r = tokio::task::spawn_blocking(move || load()).await;
        let started = match r {
            Ok(Ok(loaded)) => Ok(Served::start(
                &e.name,
                loaded,
                &self.engine,
                self.metrics.clone(),
            )),
            Ok(Err(err)) => Err(format!("{err:#}")),
            Err(err) => Err(err.to_string()),
        };
        let mut st = lock(&e.state);
        let out = match started {
            Ok(served) => {
                let served = Arc::new(served);
                *lock(&e.about) = Some(served.about.clone());
                Metrics::add(&e.loads, 1);
                let footprint = e.bytes.saturating_add(served.state_bytes);
                *st = State::Loaded {
                    served: served.clone(),
                    used: self.clock.fetch_add(1, Ordering::Relaxed) + 1,
                    expires: expiry(keep.unwrap_or(self.idle)),
                };
                eprintln!("[serve] loaded {}", e.name);
                Ok((served, footprint))
            }
            Err(why) => {
                *st = State::Unloaded;
                Err(ApiError::server(format!(
                    "loading model `{}` failed: {why}",
                    e.name
                )))
            }
        };
        guard.done = true;
        drop(st);
        e.changed.notify_waiters();
        let (served, footprint) = out?;
        // Its states are known now, not before the load: make room for
        // them too.
        if !self.make_room(e, footprint) {
            let (_, used) = self.held_besides(e);
            if let Some(max) = self
                .max_memory
                .filter(|&max| used.saturating_add(footprint) > max)
            {
                eprintln!(
                    "[serve] {} takes about {} MB with its sequences' states, over --max-memory of {} MB; it stays loaded alone",
                    e.name,
                    footprint / 1_000_000,
                    max / 1_000_000
                );
            }
        }
        Ok(served)
    }

    /// What a loaded model counts against `--max-memory`: its file (the
    /// repacked weights take about as much) plus [`Served::state_bytes`].
    /// A model not loaded yet counts its file only.
    pub fn footprint(&self, e: &Entry) -> u64 {
        match &*lock(&e.state) {
            State::Loaded { served, .. } => e.bytes.saturating_add(served.state_bytes),
            _ => e.bytes,
        }
    }

    /// Refuses to load `e` when its file alone is over `max_memory`.
    fn check_fits_alone(&self, e: &Entry) -> Result<(), ApiError> {
        match self.max_memory {
            Some(max) if e.bytes > max => Err(ApiError::invalid(
                "model",
                format!(
                    "model `{}` needs at least {} MB (its file), over this server's --max-memory of {} MB",
                    e.name,
                    e.bytes / 1_000_000,
                    max / 1_000_000
                ),
            )
            .status(503)
            .with_code("insufficient_memory")),
            _ => Ok(()),
        }
    }

    /// The models loaded or loading other than `e`: how many, and their
    /// footprints together.
    fn held_besides(&self, e: &Arc<Entry>) -> (usize, u64) {
        let entries = self.entries();
        let others = entries
            .iter()
            .filter(|o| !Arc::ptr_eq(o, e))
            .filter(|o| !matches!(*lock(&o.state), State::Unloaded));
        others.fold((0, 0u64), |(n, used), o| {
            (n + 1, used.saturating_add(self.footprint(o)))
        })
    }

    /// Unloads least recently used models other than `e` until `e`, taking
    /// `need` bytes, fits: beside fewer than `max_loaded` others, and
    /// within `max_memory` with theirs. False when it does not fit and
    /// nothing is left to evict (only loads under way).
    fn make_room(&self, e: &Arc<Entry>, need: u64) -> bool {
        loop {
            let (held, used) = self.held_besides(e);
            let over_memory = self
                .max_memory
                .is_some_and(|max| used.saturating_add(need) > max);
            if held < self.max_loaded && !over_memory {
                return true;
            }
            let why = if over_memory {
                "evicted (least recently used) to stay within --max-memory"
            } else {
                "evicted (least recently used)"
            };
            match self.lru(e) {
                Some(o) => self.unload(&o, why),
                None => return false,
            }
        }
    }

    /// The least recently used loaded model other than `but`.
    fn lru(&self, but: &Arc<Entry>) -> Option<Arc<Entry>> {
        self.entries()
            .iter()
            .filter(|e| !Arc::ptr_eq(e, but))
            .filter_map(|e| match &*lock(&e.state) {
                State::Loaded { used, .. } => Some((*used, e.clone())),
                _ => None,
            })
            .min_by_key(|(used, _)| *used)
            .map(|(_, e)| e)
    }

    /// Unloads `e` if it is loaded: the registry lets go of it, and its
    /// memory is freed when the last running request on it ends.
    pub fn unload(&self, e: &Entry, why: &str) {
        let served = {
            let mut st = lock(&e.state);
            if !matches!(*st, State::Loaded { .. }) {
                return;
            }
            match std::mem::replace(&mut *st, State::Unloaded) {
                State::Loaded { served, .. } => served,
                _ => return,
            }
        };
        Metrics::add(&e.unloads, 1);
        eprintln!("[serve] unloaded {}: {why}", e.name);
        // The last holder joins the engine thread; off the runtime's thread.
        tokio::task::spawn_blocking(move || drop(served));
    }

    /// Unloads every idle model whose keep-alive has ended.
    pub fn sweep(&self) {
        let now = Instant::now();
        for e in &self.entries() {
            let due = match &*lock(&e.state) {
                State::Loaded {
                    served,
                    expires: Some(t),
                    ..
                } => *t <= now && Arc::strong_count(served) == 1,
                _ => false,
            };
            if due {
                self.unload(e, "idle past its keep-alive");
            }
        }
    }

    /// Sets when `e` unloads after its requests end.
    pub fn keep(&self, e: &Entry, keep: KeepAlive) {
        if let State::Loaded { expires, .. } = &mut *lock(&e.state) {
            *expires = expiry(keep);
        }
    }

    /// The loaded model of `e`, if it is loaded, and when it expires.
    pub fn loaded(&self, e: &Entry) -> Option<(Arc<Served>, Option<Instant>)> {
        match &*lock(&e.state) {
            State::Loaded {
                served, expires, ..
            } => Some((served.clone(), *expires)),
            _ => None,
        }
    }

    /// Per-model lines for `/metrics`, labelled `model="NAME"`.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let label = |n: &str| {
            n.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n")
        };
        for (metric, help, kind, get) in [
            (
                "onebit_model_loaded",
                "Whether the model is loaded (1) or not (0).",
                "gauge",
                (|r: &Registry, e: &Entry| u64::from(r.loaded(e).is_some()))
                    as fn(&Registry, &Entry) -> u64,
            ),
            (
                "onebit_model_requests_total",
                "Requests that named the model.",
                "counter",
                |_, e| e.requests.load(Ordering::Relaxed),
            ),
            (
                "onebit_model_loads_total",
                "Times the model was loaded.",
                "counter",
                |_, e| e.loads.load(Ordering::Relaxed),
            ),
            (
                "onebit_model_unloads_total",
                "Times the model was unloaded (evicted, idle, keep_alive 0).",
                "counter",
                |_, e| e.unloads.load(Ordering::Relaxed),
            ),
        ] {
            let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} {kind}");
            for e in &self.entries() {
                let _ = writeln!(
                    out,
                    "{metric}{{model=\"{}\"}} {}",
                    label(&e.name),
                    get(self, e)
                );
            }
        }
    }

    pub fn about(&self, e: &Entry) -> Option<ModelAbout> {
        lock(&e.about).clone()
    }

    /// Every loaded model (for health and shutdown).
    pub fn all_loaded(&self) -> Vec<Arc<Served>> {
        self.entries()
            .iter()
            .filter_map(|e| self.loaded(e).map(|l| l.0))
            .collect()
    }
}

fn entry(s: ModelSource) -> Arc<Entry> {
    Arc::new(Entry {
        name: s.name,
        bytes: s.bytes,
        load: s.load,
        state: Mutex::new(State::Unloaded),
        changed: Notify::new(),
        waiting: AtomicUsize::new(0),
        about: Mutex::new(None),
        requests: AtomicU64::new(0),
        loads: AtomicU64::new(0),
        unloads: AtomicU64::new(0),
    })
}

/// A request counted in [`Entry::waiting`] until it is dropped.
struct Waiting(Arc<Entry>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Resets a load that did not finish.
struct LoadGuard<'a> {
    e: &'a Entry,
    done: bool,
}

impl Drop for LoadGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            *lock(&self.e.state) = State::Unloaded;
            self.e.changed.notify_waiters();
        }
    }
}

fn expiry(k: KeepAlive) -> Option<Instant> {
    match k {
        KeepAlive::Forever => None,
        KeepAlive::For(d) => Some(Instant::now() + d),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
