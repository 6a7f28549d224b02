//! Routes, request handling and the OpenAI response shapes (whole and SSE).

use std::convert::Infallible;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use onebit_model::sampler::SamplerConfig;
use onebit_text::{ChatTemplate, StreamDecoder, Tokenizer};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::access::{self, Access};
use crate::affinity::{prefix_hash, AFFINITY_HEADER};
use crate::api::{self, ApiError, Endpoint, Limits, Prompt, Request};
use crate::constrain::{Constrainer, Constraint, Grammar};
use crate::engine::{Engine, Event, Finish, GenParams, Job, TokenLogprob};
use crate::metrics::Metrics;
use crate::prompt;
use crate::text::{tidy_reasoning, Split, StopMatcher, ThinkSplitter};
use crate::tool_args::ArgEvent;
use crate::tools::{self, CallFormat, ToolStream};

pub struct App {
    pub engine: Engine,
    pub tok: Arc<Tokenizer>,
    /// The most bytes of text one token stands for (see [`max_token_bytes`]).
    pub max_token_bytes: usize,
    pub max_body_bytes: usize,
    pub body_timeout: Duration,
    pub allow_special_in_content: bool,
    /// Set on SIGTERM: `/health` answers 503 from then on.
    pub draining: AtomicBool,
    pub template: Option<ChatTemplate>,
    /// The token a finished grammar ends with (the first stop token).
    pub grammar_eos: Option<u32>,
    /// llguidance's per-model state, built at the first constrained request.
    pub constrainer: std::sync::OnceLock<Result<Constrainer, String>>,
    pub model_name: String,
    pub n_vocab: usize,
    pub ctx: usize,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub started: u64,
    /// How embeddings pool, or why this model gives none.
    pub pooling: Result<crate::embed::Pooling, String>,
    pub n_embd: usize,
    /// Whether the model generates, or why not (an embedding model).
    pub generative: Result<(), String>,
    /// What `/api/tags` and `/api/show` say about the model.
    pub about: crate::ModelAbout,
}

/// The routes, behind (outermost first) the Host and key checks, then CORS
/// when origins are configured. CORS sits inside the Host check (a rebinding
/// page gets 403 even for a preflight) and outside the key check (a browser's
/// preflight carries no key).
pub fn router(
    app: Arc<App>,
    access: Arc<Access>,
    cors: Option<tower_http::cors::CorsLayer>,
) -> Router {
    let mut r = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/embeddings", post(crate::embed::embeddings))
        .route("/api/chat", post(crate::ollama::chat))
        .route("/api/generate", post(crate::ollama::generate))
        .route("/api/embed", post(crate::ollama::embed))
        .route("/api/show", post(crate::ollama::show))
        .route("/api/tags", get(crate::ollama::tags))
        .route("/api/version", get(crate::ollama::version))
        .route("/", get(crate::page::page))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(access::not_found)
        .with_state(app);
    if let Some(c) = cors {
        r = r.layer(c);
    }
    // Wrapped whole, so the checks see the method router's finished 405
    // (its Allow header is set after the layers of each route run).
    Router::new()
        .fallback_service(r)
        .layer(axum::middleware::from_fn_with_state(access, access::check))
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

pub(crate) fn json_response(status: u16, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = json_response(self.status, self.body());
        if self.status == 503 {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    static N: AtomicU64 = AtomicU64::new(0);
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

async fn health(State(app): State<Arc<App>>) -> Response {
    if app.draining.load(Ordering::Relaxed) {
        json_response(
            503,
            json!({"status": "draining", "message": "the server is shutting down"}).to_string(),
        )
    } else if app.engine.alive() {
        json_response(200, json!({"status": "ok"}).to_string())
    } else {
        json_response(
            503,
            json!({"status": "error", "message": "the engine has stopped"}).to_string(),
        )
    }
}

async fn models(State(app): State<Arc<App>>) -> Response {
    json_response(
        200,
        json!({"object": "list", "data": [{
            "id": app.model_name,
            "object": "model",
            "created": app.started,
            "owned_by": "onebit",
            "context_length": app.ctx,
        }]})
        .to_string(),
    )
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut r = Response::new(Body::from(app.metrics.render()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    Metrics::add(&app.metrics.requests_chat, 1);
    respond(
        &app,
        generate(app.clone(), Endpoint::Chat, &headers, body).await,
    )
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    Metrics::add(&app.metrics.requests_completions, 1);
    respond(
        &app,
        generate(app.clone(), Endpoint::Completions, &headers, body).await,
    )
}

/// The JSON body: 415 unless it says it is JSON, 413 over the size limit
/// (from Content-Length before reading, or while reading), 408 when it does
/// not arrive whole within the body timeout.
pub(crate) async fn read_body(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    access::require_json(headers)?;
    let too_big = || {
        ApiError::invalid(
            None,
            format!(
                "the request body is over this server's limit of {} bytes (--max-body-mib)",
                app.max_body_bytes
            ),
        )
        .status(413)
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > app.max_body_bytes as u64) {
        return Err(too_big());
    }
    match tokio::time::timeout(
        app.body_timeout,
        axum::body::to_bytes(body, app.max_body_bytes),
    )
    .await
    {
        Err(_) => Err(ApiError::invalid(
            None,
            format!(
                "the request body did not arrive within {:?} (--body-timeout)",
                app.body_timeout
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

fn respond(app: &App, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(r) => r,
        Err(e) => {
            Metrics::add(&app.metrics.requests_failed, 1);
            e.into_response()
        }
    }
}

/// The engine's queue is full: the rejection is counted and the client gets
/// a 503 it may retry (every route that submits work answers this way).
pub(crate) fn queue_full(app: &App) -> ApiError {
    Metrics::add(&app.metrics.requests_rejected_full, 1);
    ApiError {
        status: 503,
        message: "the server is busy: its request queue is full; retry shortly".into(),
        kind: "server_error",
        param: None,
        code: Some("queue_full"),
    }
}

/// A request ready to run: its prompt ids and what shapes the output.
pub(crate) struct Prepared {
    pub(crate) req: Request,
    pub(crate) ids: Arc<Vec<u32>>,
    /// The template knows `<think>`: split a reasoning block off.
    pub(crate) think: bool,
    /// The rendered prompt ends inside an open `<think>` block.
    pub(crate) think_open: bool,
    /// Replies are parsed for tool calls in this format.
    pub(crate) tool_format: Option<&'static CallFormat>,
    /// The output grammar, compiled.
    pub(crate) constraint: Option<Constraint>,
    /// Control tokens are kept in the text (a call marker is one).
    pub(crate) keep_special: bool,
}

/// Compiles a request's grammar; a schema or grammar the library cannot
/// handle is a 400 naming the parameter and llguidance's reason.
fn compile(app: &App, g: &Grammar, param: &'static str) -> Result<Constraint, ApiError> {
    let c = app.constrainer.get_or_init(|| match app.grammar_eos {
        Some(eos) => Constrainer::new(&app.tok, eos),
        None => Err("the model declares no stop token to end a grammar with".into()),
    });
    let c = c.as_ref().map_err(|e| {
        ApiError::invalid(
            param,
            format!("constrained decoding is unavailable for this model: {e}"),
        )
    })?;
    let k = c.compile(g).map_err(|e| {
        let what = match param {
            "grammar" => "the grammar (`grammar`)",
            "response_format" => "the JSON schema (`response_format`)",
            _ => "the tools' parameter schemas (`tools`)",
        };
        ApiError::invalid(
            param,
            format!("{what} cannot be used for constrained decoding: {e}"),
        )
        .with_code("unsupported_schema")
    })?;
    // A forced call's arguments are JSON: their numbers get the digit bound.
    Ok(if param == "tools" {
        k.bound_numbers()
    } else {
        k
    })
}

/// Parses, renders and tokenizes: run on the blocking pool, never on the
/// runtime's thread (a large prompt takes seconds to tokenize).
pub(crate) fn prepare(app: &App, ep: Endpoint, body: &[u8]) -> Result<Prepared, ApiError> {
    if let Err(why) = &app.generative {
        return Err(ApiError::invalid("model", why.clone()));
    }
    let req = api::parse(body, ep, app.limits)?;
    if let Some(&(bad, _)) = req
        .logit_bias
        .iter()
        .find(|(id, _)| *id as usize >= app.n_vocab)
    {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "`logit_bias` names token {bad}, outside the vocabulary ({} tokens)",
                app.n_vocab
            ),
        ));
    }
    let mut tool_format = None;
    let mut keep_special = false;
    let mut grammar = req.grammar.clone().map(|g| {
        let param = if matches!(g, Grammar::Lark(_)) {
            "grammar"
        } else {
            "response_format"
        };
        (g, param)
    });
    let (ids, think, think_open) = match &req.prompt {
        Prompt::Chat(messages) => {
            let t = app.template.as_ref().ok_or_else(|| {
                ApiError::invalid(
                    "messages",
                    format!("model {} has no chat template, so it cannot take chat requests; start the server with --chat-template FILE, or use /v1/completions", app.model_name),
                )
                .with_code("no_chat_template")
            })?;
            // Tools: the template's own way when it knows tools, else the
            // generic fallback (tools in a system message, calls as JSON).
            let spec = req.tools.as_ref();
            let known = tools::detect(t.source());
            let has_tool_turns = messages.as_array().is_some_and(|a| {
                a.iter()
                    .any(|m| m["role"] == "tool" || m.get("tool_calls").is_some())
            });
            let mut kwargs = req.template_kwargs.clone();
            let fallback;
            let messages = match known {
                Some(_) => {
                    if let Some(spec) = spec.filter(|s| s.parsed()) {
                        kwargs
                            .get_or_insert_with(Default::default)
                            .insert("tools".into(), Value::Array(spec.tools.clone()));
                    }
                    if has_tool_turns {
                        fallback = tools::arguments_as_objects(messages);
                        &fallback
                    } else {
                        messages
                    }
                }
                None if spec.is_some() || has_tool_turns => {
                    let m = tools::fallback_messages(messages, spec);
                    fallback = if has_tool_turns {
                        tools::merge_adjacent_users(m)
                    } else {
                        m
                    };
                    &fallback
                }
                None => messages,
            };
            if let Some(spec) = spec.filter(|s| s.parsed()) {
                let f = match known {
                    // No grammar for Python literals or Gemma's syntax: a
                    // forced LFM2 or Gemma call is written (and parsed) as
                    // the generic JSON envelope.
                    Some(f) if spec.forced() && !f.body.json_forcible() => &tools::GENERIC,
                    Some(f) => f,
                    None => &tools::GENERIC,
                };
                tool_format = Some(if spec.forced() { tools::forced(f) } else { f });
                let special = |s: &str| app.tok.token_to_id(s).filter(|&id| app.tok.is_special(id));
                keep_special = !f.open.is_empty() && special(f.open).is_some();
                if spec.forced() {
                    grammar = Some((tools::forced_grammar(spec, f, special), "tools"));
                }
            }
            let r = prompt::render(t, messages, kwargs.as_ref(), !app.allow_special_in_content)?;
            check_bytes(app, ep, r.text.len())?;
            let ids = prompt::ids(&app.tok, &r, messages, app.allow_special_in_content)?;
            let text = r.text;
            let think = t.source().contains("<think>");
            let open = think && {
                let tail = text.trim_end();
                tail.rfind("<think>") > tail.rfind("</think>")
            };
            (ids, think, open)
        }
        Prompt::Text(s) => (
            check_bytes(app, ep, s.len()).and_then(|_| {
                app.tok.encode(s, true).map_err(|e| {
                    ApiError::invalid("prompt", format!("cannot tokenize the prompt: {e}"))
                })
            })?,
            false,
            false,
        ),
        Prompt::Tokens(t) => {
            if let Some(bad) = t.iter().find(|&&id| id as usize >= app.n_vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!(
                        "token id {bad} is outside the vocabulary ({} tokens)",
                        app.n_vocab
                    ),
                ));
            }
            (t.clone(), false, false)
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt has no tokens"));
    }
    if ids.len() >= app.ctx {
        return Err(ApiError::invalid(
            prompt_param(ep),
            format!(
                "the prompt has {} tokens, but this server's context holds {} (prompt plus at least one generated token)",
                ids.len(),
                app.ctx
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let constraint = match &grammar {
        Some((g, param)) => Some(compile(app, g, param)?),
        None => None,
    };
    Ok(Prepared {
        req,
        ids: Arc::new(ids),
        think,
        think_open,
        tool_format,
        constraint,
        keep_special,
    })
}

fn prompt_param(ep: Endpoint) -> &'static str {
    if ep == Endpoint::Chat {
        "messages"
    } else {
        "prompt"
    }
}

/// Refuses, before tokenizing, a prompt text too long for the context
/// whatever its tokens: `bytes` of text need at least
/// `bytes / max_token_bytes` tokens.
fn check_bytes(app: &App, ep: Endpoint, bytes: usize) -> Result<(), ApiError> {
    let least = bytes / app.max_token_bytes;
    if least < app.ctx {
        return Ok(());
    }
    Err(ApiError::invalid(
        prompt_param(ep),
        format!(
            "the prompt is {bytes} bytes, so at least {least} tokens (no token is longer than {} bytes), but this server's context holds {}",
            app.max_token_bytes, app.ctx
        ),
    )
    .with_code("context_length_exceeded"))
}

async fn generate(
    app: Arc<App>,
    ep: Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(&app, headers, body).await?;
    let app2 = app.clone();
    let mut p = tokio::task::spawn_blocking(move || prepare(&app2, ep, &body))
        .await
        .map_err(|e| ApiError::server(format!("preparing the prompt failed: {e}")))??;
    let mut constraints: Vec<Option<Constraint>> = (0..p.req.n)
        .map(|i| {
            if i + 1 < p.req.n {
                p.constraint.as_ref().map(Constraint::fork)
            } else {
                p.constraint.take()
            }
        })
        .collect();
    let req = &p.req;
    let room = app.ctx - p.ids.len();
    // Not stated: as much as the context holds, within the server's cap.
    let cap = match app.limits.max_tokens {
        0 => usize::MAX,
        m => m,
    };
    let max_new = req.max_tokens.map_or(room, |m| m.min(room)).min(cap);
    let base_seed = req.seed.unwrap_or_else(random_u64);
    let (tx, rx) = mpsc::unbounded_channel();
    let submitted = Instant::now();
    let cancels: Vec<Arc<AtomicBool>> = (0..req.n)
        .map(|_| Arc::new(AtomicBool::new(false)))
        .collect();
    let jobs = (0..req.n)
        .map(|i| Job {
            prompt: p.ids.clone(),
            params: GenParams {
                max_new,
                sampler: SamplerConfig {
                    temperature: req.temperature,
                    top_k: req.top_k,
                    top_p: req.top_p,
                    seed: base_seed.wrapping_add(i as u64),
                },
                presence_penalty: req.presence_penalty,
                frequency_penalty: req.frequency_penalty,
                logprobs: req.logprobs,
                speculative: req.speculative,
                logit_bias: req.logit_bias.clone(),
            },
            index: i,
            tx: tx.clone(),
            cancel: cancels[i].clone(),
            submitted,
            constraint: constraints[i].take(),
        })
        .collect();
    drop(tx);
    if app.engine.submit(jobs).is_err() {
        return Err(queue_full(&app));
    }
    let run = Run {
        rx,
        cancels,
        stops: req.stop.clone(),
        think: p.think,
        think_open: p.think_open,
        logprobs: req.logprobs.is_some(),
        keep_special: p.keep_special,
    };
    let meta = Meta {
        id: format!(
            "{}-{:016x}",
            if ep == Endpoint::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            random_u64()
        ),
        created: unix_now(),
        model: app.model_name.clone(),
        ep,
        prompt_tokens: p.ids.len(),
        include_usage: req.include_usage,
        tool_format: p.tool_format,
    };
    let affinity = prefix_hash(&p.ids);
    let mut r = if req.stream {
        stream_response(app, run, meta)
    } else {
        whole_response(&app, run, meta).await?
    };
    r.headers_mut().insert(AFFINITY_HEADER, affinity);
    Ok(r)
}

pub(crate) struct Run {
    pub(crate) rx: mpsc::UnboundedReceiver<Event>,
    pub(crate) cancels: Vec<Arc<AtomicBool>>,
    pub(crate) stops: Vec<String>,
    pub(crate) think: bool,
    pub(crate) think_open: bool,
    pub(crate) logprobs: bool,
    pub(crate) keep_special: bool,
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    ep: Endpoint,
    prompt_tokens: usize,
    include_usage: bool,
    /// Replies are parsed for tool calls in this format.
    tool_format: Option<&'static CallFormat>,
}

/// A call as OpenAI returns it, with a fresh id.
fn call_json(c: &tools::Call) -> Value {
    json!({
        "id": format!("call_{:016x}", random_u64()),
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    })
}

/// The `delta`s of streamed call events: a call's first delta carries its
/// id, type and name (arguments ""), the next ones argument fragments.
/// `sent` records each call's name and the arguments sent so far.
fn call_event_deltas(events: Vec<ArgEvent>, sent: &mut Vec<(String, String)>) -> Vec<Value> {
    events
        .into_iter()
        .map(|e| match e {
            ArgEvent::Call { index, name } => {
                sent.push((name.clone(), String::new()));
                let mut first = call_json(&tools::Call {
                    name,
                    arguments: String::new(),
                });
                first["index"] = json!(index);
                json!({"tool_calls": [first]})
            }
            ArgEvent::Args { index, fragment } => {
                if let Some((_, args)) = sent.get_mut(index) {
                    args.push_str(&fragment);
                }
                json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
            }
        })
        .collect()
}

/// `s` in pieces of about `n` bytes, cut at character boundaries.
fn fragments(s: &str, n: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < s.len() {
        let mut end = (start + n).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        out.push(&s[start..end]);
        start = end;
    }
    out
}

/// One generated token as logprobs report it.
pub(crate) struct LpEntry {
    id: u32,
    lp: TokenLogprob,
}

/// What happened to one choice since the last report.
pub(crate) enum Update {
    Delta {
        index: usize,
        split: Split,
        logprobs: Vec<LpEntry>,
    },
    Finished {
        index: usize,
        finish: Finish,
    },
}

struct Choice<'t> {
    dec: StreamDecoder<'t>,
    stop: StopMatcher,
    think: ThinkSplitter,
    tokens: usize,
    cached: usize,
    finish: Option<Finish>,
}

/// Turns engine events into per-choice text updates; returns per choice
/// (completion tokens, cached tokens, finish).
pub(crate) async fn drive(
    tok: &Tokenizer,
    mut run: Run,
    n: usize,
    mut emit: impl FnMut(Update) -> bool,
) -> Result<Vec<(usize, usize, Finish)>, ApiError> {
    let mut choices: Vec<Choice> = (0..n)
        .map(|_| Choice {
            dec: StreamDecoder::with_skip_special(tok, !run.keep_special),
            stop: StopMatcher::new(run.stops.clone()),
            think: ThinkSplitter::new(run.think, run.think_open),
            tokens: 0,
            cached: 0,
            finish: None,
        })
        .collect();
    while choices.iter().any(|c| c.finish.is_none()) {
        let Some(ev) = run.rx.recv().await else {
            return Err(ApiError::server(
                "the engine stopped before finishing the request",
            ));
        };
        let (index, piece, lp, end) = match ev {
            Event::Started { index, cached } => {
                choices[index].cached = cached;
                continue;
            }
            Event::Failed { message, .. } => return Err(ApiError::server(message)),
            Event::Token { index, id, logprob } => {
                let c = &mut choices[index];
                if c.finish.is_some() {
                    continue; // already ended by a stop string
                }
                c.tokens += 1;
                let piece = c
                    .dec
                    .push(id)
                    .map_err(|e| ApiError::server(format!("detokenizing: {e}")))?;
                (index, piece, logprob.map(|lp| LpEntry { id, lp }), None)
            }
            Event::Done { index, finish } => {
                let c = &mut choices[index];
                if c.finish.is_some() {
                    continue;
                }
                let mut rest = c.dec.finish();
                if finish == Finish::Length {
                    // Cut by max_tokens mid-character: the decoder holds the
                    // incomplete bytes back and would give them as U+FFFD.
                    let whole = rest.trim_end_matches('\u{FFFD}').len();
                    rest.truncate(whole);
                }
                (index, rest, None, Some(finish))
            }
        };
        let c = &mut choices[index];
        let mut text = c.stop.push(&piece);
        let mut end = end;
        if c.stop.stopped {
            run.cancels[index].store(true, Ordering::Relaxed);
            end = Some(Finish::Stop);
        } else if end.is_some() {
            text.push_str(&c.stop.finish());
        }
        let mut split = c.think.push(&text);
        if end.is_some() {
            let rest = c.think.finish();
            split.reasoning.push_str(&rest.reasoning);
            split.content.push_str(&rest.content);
        }
        let logprobs: Vec<LpEntry> = lp.into_iter().filter(|_| run.logprobs).collect();
        if (!split.is_empty() || !logprobs.is_empty())
            && !emit(Update::Delta {
                index,
                split,
                logprobs,
            })
        {
            break;
        }
        if let Some(finish) = end {
            c.finish = Some(finish);
            if !emit(Update::Finished { index, finish }) {
                break;
            }
        }
    }
    Ok(choices
        .iter()
        .map(|c| (c.tokens, c.cached, c.finish.unwrap_or(Finish::Stop)))
        .collect())
}

fn usage(prompt_tokens: usize, per_choice: &[(usize, usize, Finish)]) -> Value {
    let completion: usize = per_choice.iter().map(|c| c.0).sum();
    let cached = per_choice.first().map_or(0, |c| c.1);
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

fn chat_logprob_entries(tok: &Tokenizer, entries: &[LpEntry]) -> Value {
    let one = |id: u32, lp: f32| {
        let t = token_text(tok, id);
        json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
    };
    Value::Array(
        entries
            .iter()
            .map(|e| {
                let mut v = one(e.id, e.lp.logprob);
                v["top_logprobs"] =
                    Value::Array(e.lp.top.iter().map(|&(i, l)| one(i, l)).collect());
                v
            })
            .collect(),
    )
}

/// The legacy completions logprobs object for a run of tokens.
fn completion_logprobs(tok: &Tokenizer, entries: &[LpEntry], offset0: usize) -> Value {
    let mut offset = offset0;
    let mut tokens = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for e in entries {
        let t = token_text(tok, e.id);
        offsets.push(offset);
        offset += t.len();
        tokens.push(Value::String(t));
        lps.push(json!(e.lp.logprob));
        let mut m = serde_json::Map::new();
        for &(i, l) in &e.lp.top {
            m.insert(token_text(tok, i), json!(l));
        }
        tops.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

#[derive(Default)]
struct Acc {
    content: String,
    reasoning: String,
    logprobs: Vec<LpEntry>,
    finish: Option<Finish>,
}

async fn whole_response(app: &App, run: Run, meta: Meta) -> Result<Response, ApiError> {
    let n = run.cancels.len();
    let mut acc: Vec<Acc> = (0..n).map(|_| Acc::default()).collect();
    let per = drive(&app.tok, run, n, |u| {
        match u {
            Update::Delta {
                index,
                split,
                logprobs,
            } => {
                let a = &mut acc[index];
                a.content.push_str(&split.content);
                a.reasoning.push_str(&split.reasoning);
                a.logprobs.extend(logprobs);
            }
            Update::Finished { index, finish } => acc[index].finish = Some(finish),
        }
        true
    })
    .await?;
    let want_lp = acc.iter().any(|a| !a.logprobs.is_empty());
    let choices: Vec<Value> = acc
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let finish = a.finish.unwrap_or(per[i].2).as_str();
            match meta.ep {
                Endpoint::Chat => {
                    let mut msg = json!({"role": "assistant", "content": a.content});
                    let mut finish = finish;
                    if let Some(f) = meta.tool_format {
                        let (content, calls) = tools::parse(&a.content, f);
                        if f.forced && calls.is_empty() {
                            msg["content"] = Value::Null; // a cut call, no text
                        }
                        if !calls.is_empty() {
                            msg["content"] = if content.is_empty() {
                                Value::Null
                            } else {
                                json!(content)
                            };
                            msg["tool_calls"] = calls.iter().map(call_json).collect();
                            if finish == "stop" {
                                finish = "tool_calls";
                            }
                        }
                    }
                    if !a.reasoning.is_empty() {
                        msg["reasoning_content"] = json!(tidy_reasoning(&a.reasoning));
                    }
                    json!({
                        "index": i,
                        "message": msg,
                        "logprobs": if want_lp { json!({"content": chat_logprob_entries(&app.tok, &a.logprobs)}) } else { Value::Null },
                        "finish_reason": finish,
                    })
                }
                Endpoint::Completions => json!({
                    "index": i,
                    "text": a.content,
                    "logprobs": if want_lp { completion_logprobs(&app.tok, &a.logprobs, 0) } else { Value::Null },
                    "finish_reason": finish,
                }),
            }
        })
        .collect();
    let body = json!({
        "id": meta.id,
        "object": if meta.ep == Endpoint::Chat { "chat.completion" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": "onebit",
        "choices": choices,
        "usage": usage(meta.prompt_tokens, &per),
    });
    Ok(json_response(200, body.to_string()))
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn stream_response(app: Arc<App>, run: Run, meta: Meta) -> Response {
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Bytes>();
    tokio::spawn(async move {
        let n = run.cancels.len();
        let chat = meta.ep == Endpoint::Chat;
        let chunk = |choice: Value| {
            let mut v = json!({
                "id": meta.id,
                "object": if chat { "chat.completion.chunk" } else { "text_completion" },
                "created": meta.created,
                "model": meta.model,
                "system_fingerprint": "onebit",
                "choices": [choice],
            });
            if meta.include_usage {
                v["usage"] = Value::Null;
            }
            sse(&v)
        };
        if chat {
            for i in 0..n {
                let c = json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
                if out_tx.send(chunk(c)).is_err() {
                    return;
                }
            }
        }
        let mut offsets = vec![0usize; n];
        let tok = app.tok.clone();
        let gone = out_tx.clone();
        let mut tool_streams: Vec<Option<ToolStream>> = (0..n)
            .map(|_| meta.tool_format.map(ToolStream::new))
            .collect();
        // Per choice, the calls streamed so far: (name, arguments sent).
        let mut streamed: Vec<Vec<(String, String)>> = vec![Vec::new(); n];
        let driving = drive(&tok, run, n, |u| {
            // Tool-call deltas that go out after this update's chunk.
            let mut after: Vec<Value> = Vec::new();
            let c = match u {
                Update::Delta {
                    index,
                    mut split,
                    logprobs,
                } => {
                    if let Some(ts) = tool_streams[index].as_mut() {
                        split.content = ts.push(&split.content);
                        after = call_event_deltas(ts.take_events(), &mut streamed[index])
                            .into_iter()
                            .map(|d| json!({"index": index, "delta": d, "logprobs": null, "finish_reason": null}))
                            .collect();
                        if split.is_empty() && logprobs.is_empty() {
                            return after.into_iter().all(|c| out_tx.send(chunk(c)).is_ok());
                        }
                    }
                    let lp = (!logprobs.is_empty()).then_some(&logprobs);
                    if chat {
                        let mut delta = serde_json::Map::new();
                        if !split.reasoning.is_empty() {
                            delta.insert("reasoning_content".into(), json!(split.reasoning));
                        }
                        if !split.content.is_empty() || split.reasoning.is_empty() {
                            delta.insert("content".into(), json!(split.content));
                        }
                        json!({
                            "index": index,
                            "delta": delta,
                            "logprobs": lp.map_or(Value::Null, |l| json!({"content": chat_logprob_entries(&tok, l)})),
                            "finish_reason": null,
                        })
                    } else {
                        let v = json!({
                            "index": index,
                            "text": split.content,
                            "logprobs": lp.map_or(Value::Null, |l| completion_logprobs(&tok, l, offsets[index])),
                            "finish_reason": null,
                        });
                        offsets[index] += split.content.len();
                        v
                    }
                }
                Update::Finished { index, finish } => {
                    let mut reason = finish.as_str();
                    if let Some(ts) = tool_streams[index].as_mut() {
                        let (rest, calls) = ts.finish();
                        let mut deltas = Vec::new();
                        if !rest.is_empty() {
                            deltas.push(json!({"content": rest}));
                        }
                        let sent = &streamed[index];
                        for (k, c) in calls.iter().enumerate() {
                            // A call already streamed gets what is left of its
                            // arguments; the others go out whole now.
                            let left = match sent.get(k) {
                                Some((name, args)) if *name == c.name => {
                                    c.arguments.strip_prefix(args.as_str())
                                }
                                Some(_) => None,
                                None => {
                                    let mut first = call_json(c);
                                    first["index"] = json!(k);
                                    first["function"]["arguments"] = json!("");
                                    deltas.push(json!({"tool_calls": [first]}));
                                    Some(c.arguments.as_str())
                                }
                            };
                            for frag in fragments(left.unwrap_or_default(), 16) {
                                deltas.push(json!({"tool_calls": [{"index": k, "function": {"arguments": frag}}]}));
                            }
                        }
                        if !calls.is_empty() && finish == Finish::Stop {
                            reason = "tool_calls";
                        }
                        for d in deltas {
                            let c = json!({"index": index, "delta": d, "logprobs": null, "finish_reason": null});
                            if out_tx.send(chunk(c)).is_err() {
                                return false;
                            }
                        }
                    }
                    if chat {
                        json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason})
                    } else {
                        json!({"index": index, "text": "", "logprobs": null, "finish_reason": finish.as_str()})
                    }
                }
            };
            out_tx.send(chunk(c)).is_ok()
                && after.into_iter().all(|c| out_tx.send(chunk(c)).is_ok())
        });
        // A client that hangs up (hyper drops the body) ends the run at once,
        // also while its prompt is still prefilling and no token has come:
        // dropping `driving` drops the engine's receiver, and the engine
        // frees the sequence before its next step.
        let result = tokio::select! {
            r = driving => r,
            _ = gone.closed() => return,
        };
        match result {
            Ok(per) => {
                if meta.include_usage {
                    let v = json!({
                        "id": meta.id,
                        "object": if chat { "chat.completion.chunk" } else { "text_completion" },
                        "created": meta.created,
                        "model": meta.model,
                        "system_fingerprint": "onebit",
                        "choices": [],
                        "usage": usage(meta.prompt_tokens, &per),
                    });
                    let _ = out_tx.send(sse(&v));
                }
            }
            Err(e) => {
                Metrics::add(&app.metrics.requests_failed, 1);
                let _ = out_tx.send(sse(&serde_json::from_str(&e.body()).unwrap_or(Value::Null)));
            }
        }
        let _ = out_tx.send(Bytes::from_static(b"data: [DONE]\n\n"));
    });
    let body = futures_util::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
