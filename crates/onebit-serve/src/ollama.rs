//! Ollama's API (`/api/chat`, `/api/generate`, `/api/embed`, `/api/show`,
//! `/api/tags`, `/api/version`), as its official clients and Open WebUI
//! speak it: NDJSON streamed by default, `stream: false` for one object,
//! sampling under `options`, durations in nanoseconds, errors as
//! `{"error": "..."}`.
//!
//! A request is translated into the OpenAI request the `/v1` routes take
//! (so every value is checked by the same rules) and runs on the same engine.
//! Fields are decided one by one (docs/ollama.md): those we honour, those
//! clients send routinely that change nothing here (`keep_alive`: the model
//! is always loaded; `format: ""`; empty `images`), and everything else is
//! refused by name with a 400, never ignored in silence.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use onebit_model::sampler::SamplerConfig;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{ApiError, Endpoint};
use crate::embed::{self, refuse_unknown};
use crate::engine::{Finish, GenParams, Job};
use crate::http::{
    drive, json_response, prepare, queue_full, random_u64, read_body, App, Run, Update,
};
use crate::metrics::Metrics;
use crate::tools::{self, ToolStream};

/// Ollama's sampling defaults, used when `options` states none.
const DEFAULT_TEMPERATURE: f64 = 0.8;
const DEFAULT_TOP_K: i64 = 40;
const DEFAULT_TOP_P: f64 = 0.9;

/// Ollama's error shape, with the same status the `/v1` routes would give.
fn error(e: ApiError) -> Response {
    let mut r = json_response(e.status, json!({"error": e.message}).to_string());
    if e.status == 503 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::invalid(None, message)
}

/// `2024-05-01T12:00:00.123Z` for a time since the epoch (Ollama's
/// `created_at`, `modified_at`).
fn rfc3339(t: Duration) -> String {
    let secs = t.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        t.subsec_millis()
    )
}

fn now() -> String {
    rfc3339(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(bad("the body must be a JSON object")),
        Err(e) => Err(bad(format!("the body is not valid JSON: {e}"))),
    }
}

/// A field that must be absent, null, empty or false to mean nothing here.
fn must_be_empty(o: &Map<String, Value>, name: &str, why: &str) -> Result<(), ApiError> {
    let empty = match o.get(name) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(m)) => m.is_empty(),
        Some(_) => false,
    };
    if empty {
        Ok(())
    } else {
        Err(bad(format!("`{name}` is not supported: {why}")))
    }
}

/// `model` must be a string when given (this server answers for its one
/// model under any name, as its `/v1` routes do).
fn check_model(o: &Map<String, Value>) -> Result<(), ApiError> {
    match o.get("model") {
        None | Some(Value::String(_)) => Ok(()),
        Some(_) => Err(bad("`model` must be a string")),
    }
}

/// The `options` Ollama samples with, into the OpenAI request `req`.
const OPTIONS: [&str; 9] = [
    "num_predict",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "num_ctx",
];

fn apply_options(
    app: &App,
    o: &Map<String, Value>,
    req: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let opts = match o.get("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(bad("`options` must be an object")),
    };
    // repeat_penalty 1 (off) is what it would be here anyway.
    let known = |k: &str| OPTIONS.contains(&k) || k == "repeat_penalty";
    if let Some(k) = opts.keys().find(|k| !known(k)) {
        return Err(bad(format!(
            "option `{k}` is not supported; this server reads {} (and repeat_penalty 1)",
            OPTIONS.join(", ")
        )));
    }
    if let Some(v) = opts.get("repeat_penalty").filter(|v| !v.is_null()) {
        if v.as_f64() != Some(1.0) {
            return Err(bad(format!(
                "option `repeat_penalty` {v} is not supported (only 1, off); use presence_penalty or frequency_penalty"
            )));
        }
    }
    if let Some(v) = opts.get("num_ctx").filter(|v| !v.is_null()) {
        match v.as_u64() {
            Some(n) if n as usize <= app.ctx => {}
            _ => {
                return Err(bad(format!(
                    "option `num_ctx` must be an integer of at most {} (this server's context, fixed at start with --ctx); got {v}",
                    app.ctx
                )))
            }
        }
    }
    match opts.get("num_predict").filter(|v| !v.is_null()) {
        None => {}
        // -1: no limit, -2: fill the context; both are the context's room here.
        Some(v) if v.as_i64() == Some(-1) || v.as_i64() == Some(-2) => {}
        Some(v) => {
            req.insert("max_tokens".into(), v.clone());
        }
    }
    req.insert(
        "temperature".into(),
        opts.get("temperature")
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(json!(DEFAULT_TEMPERATURE)),
    );
    req.insert(
        "top_k".into(),
        opts.get("top_k")
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(json!(DEFAULT_TOP_K)),
    );
    req.insert(
        "top_p".into(),
        opts.get("top_p")
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(json!(DEFAULT_TOP_P)),
    );
    for k in ["seed", "stop", "presence_penalty", "frequency_penalty"] {
        if let Some(v) = opts.get(k).filter(|v| !v.is_null()) {
            req.insert(k.into(), v.clone());
        }
    }
    Ok(())
}

/// An error from the OpenAI checks, with the parameter said as Ollama's.
fn rename(mut e: ApiError) -> ApiError {
    let ollama = match e.param.as_deref() {
        Some("max_tokens") => "options.num_predict",
        Some("temperature") => "options.temperature",
        Some("top_k") => "options.top_k",
        Some("top_p") => "options.top_p",
        Some("seed") => "options.seed",
        Some("stop") => "options.stop",
        Some("response_format") => "format",
        _ => return e,
    };
    let openai = e.param.take().unwrap_or_default();
    e.message = e
        .message
        .replace(&format!("`{openai}`"), &format!("`{ollama}`"));
    e
}

/// `stream` (default true) and the common refusals.
fn stream_flag(o: &Map<String, Value>) -> Result<bool, ApiError> {
    match o.get("stream") {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad("`stream` must be a boolean")),
    }
}

/// `format`: `"json"` (any JSON object) or a JSON schema, as the OpenAI
/// request's `response_format` (so the same constrained decoding and the
/// same 400 for a schema it cannot handle); `""`/null is plain text.
fn apply_format(o: &Map<String, Value>, req: &mut Map<String, Value>) -> Result<(), ApiError> {
    let rf = match o.get("format") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) if s.is_empty() => return Ok(()),
        Some(Value::String(s)) if s == "json" => json!({"type": "json_object"}),
        Some(Value::Object(schema)) => json!({
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": schema, "strict": true},
        }),
        Some(v) => {
            return Err(bad(format!(
                "`format` must be \"json\", a JSON schema object or empty; got {v}"
            )))
        }
    };
    req.insert("response_format".into(), rf);
    Ok(())
}

/// `tools`: Ollama's tool list is OpenAI's (`{"type": "function",
/// "function": {name, description, parameters}}`), passed on as it is and
/// checked by the same rules; Ollama has no `tool_choice`, so it is `auto`.
fn apply_tools(o: &Map<String, Value>, req: &mut Map<String, Value>) -> Result<(), ApiError> {
    match o.get("tools") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        Some(t @ Value::Array(_)) => {
            req.insert("tools".into(), t.clone());
            Ok(())
        }
        Some(_) => Err(bad("`tools` must be a list of tools")),
    }
}

/// An assistant turn's `tool_calls` as Ollama writes them
/// (`{"function": {"name", "arguments": {...}}}`, arguments an object) in
/// OpenAI's shape (an id, `type`, arguments as a JSON string), which the
/// `/v1` checks and the templates take.
fn openai_calls(i: usize, calls: &Value) -> Result<Value, ApiError> {
    let Value::Array(calls) = calls else {
        return Err(bad(format!("`messages[{i}].tool_calls` must be a list")));
    };
    calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let f = c.get("function").and_then(Value::as_object);
            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
            let (Some(f), Some(name)) = (f, name) else {
                return Err(bad(format!(
                    "`messages[{i}].tool_calls[{k}]` needs a `function` with a string `name`"
                )));
            };
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => "{}".to_string(),
                Some(Value::String(s)) => s.clone(),
                Some(v @ Value::Object(_)) => v.to_string(),
                Some(v) => {
                    return Err(bad(format!(
                    "`messages[{i}].tool_calls[{k}].function.arguments` must be an object; got {v}"
                )))
                }
            };
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| format!("call_{i}_{k}"), str::to_string);
            Ok(json!({"id": id, "type": "function",
                      "function": {"name": name, "arguments": arguments}}))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// A parsed call in Ollama's answer shape: arguments as an object (as
/// parsed; a model's arguments that are not a JSON object stay a string).
fn ollama_call(c: &tools::Call) -> Value {
    let args = serde_json::from_str::<Value>(&c.arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!(c.arguments));
    json!({"function": {"name": c.name, "arguments": args}})
}

/// `think`: passed to the template as `enable_thinking`; `true` needs a
/// template that knows `<think>`.
fn apply_think(
    app: &App,
    o: &Map<String, Value>,
    req: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    match o.get("think") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Bool(b)) => {
            let knows = app
                .template
                .as_ref()
                .is_some_and(|t| t.source().contains("<think>"));
            if *b && !knows {
                return Err(bad(format!(
                    "`think` is true, but model {} does not think (its chat template knows no <think>)",
                    app.model_name
                )));
            }
            if knows {
                req.insert("chat_template_kwargs".into(), json!({"enable_thinking": b}));
            }
            Ok(())
        }
        Some(_) => Err(bad("`think` must be a boolean")),
    }
}

const CHAT_FIELDS: [&str; 8] = [
    "model",
    "messages",
    "stream",
    "options",
    "format",
    "keep_alive",
    "tools",
    "think",
];

/// Ollama's messages as OpenAI's: role and content; images refused.
fn messages(o: &Map<String, Value>) -> Result<Value, ApiError> {
    let Some(Value::Array(ms)) = o.get("messages") else {
        return Err(bad("`messages` must be a list of messages"));
    };
    ms.iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(m) = m else {
                return Err(bad(format!("`messages[{i}]` must be an object")));
            };
            must_be_empty(m, "images", "this server runs text models")
                .map_err(|e| bad(format!("`messages[{i}]`: {}", e.message)))?;
            let mut out = Map::new();
            for (k, v) in m {
                match k.as_str() {
                    "role" | "content" => {
                        out.insert(k.clone(), v.clone());
                    }
                    // Ollama's own name for a tool reply's function.
                    "tool_name" => {
                        out.insert("name".into(), v.clone());
                    }
                    "tool_calls" => {
                        out.insert(k.clone(), openai_calls(i, v)?);
                    }
                    "images" | "thinking" => {}
                    other => {
                        return Err(bad(format!(
                            "`messages[{i}].{other}` is not supported; a message carries role, content, thinking, tool_calls, tool_name and (empty) images"
                        )))
                    }
                }
            }
            Ok(Value::Object(out))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// `POST /api/chat`.
pub async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    Metrics::add(&app.metrics.requests_chat, 1);
    let r = async {
        let body = read_body(&app, &headers, body).await?;
        let o = object(&body)?;
        refuse_unknown(&o, &CHAT_FIELDS)?;
        check_model(&o)?;
        let mut req = Map::new();
        req.insert("messages".into(), messages(&o)?);
        apply_format(&o, &mut req)?;
        apply_tools(&o, &mut req)?;
        apply_options(&app, &o, &mut req)?;
        apply_think(&app, &o, &mut req)?;
        let stream = stream_flag(&o)?;
        run(app.clone(), Endpoint::Chat, req, stream, Shape::Chat).await
    }
    .await;
    finish(&app, r)
}

const GENERATE_FIELDS: [&str; 13] = [
    "model",
    "prompt",
    "suffix",
    "system",
    "template",
    "context",
    "stream",
    "raw",
    "format",
    "images",
    "options",
    "keep_alive",
    "think",
];

/// `POST /api/generate`: the prompt as one user message under the model's
/// template (after `system`), or as plain text with `raw: true` or when the
/// model has no template.
pub async fn generate(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    Metrics::add(&app.metrics.requests_completions, 1);
    let r = async {
        let body = read_body(&app, &headers, body).await?;
        let o = object(&body)?;
        refuse_unknown(&o, &GENERATE_FIELDS)?;
        check_model(&o)?;
        must_be_empty(&o, "suffix", "fill-in-the-middle is not implemented")?;
        must_be_empty(&o, "template", "the model's template (or --chat-template) is used")?;
        must_be_empty(&o, "context", "send the conversation to /api/chat instead")?;
        must_be_empty(&o, "images", "this server runs text models")?;
        let prompt = match o.get("prompt") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad("`prompt` must be a string")),
        };
        let system = match o.get("system") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(bad("`system` must be a string")),
        };
        let raw = match o.get("raw") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("`raw` must be a boolean")),
        };
        let mut req = Map::new();
        let ep = if raw || app.template.is_none() {
            if system.is_some() {
                return Err(bad(if raw {
                    "`system` needs the chat template, which `raw: true` turns off"
                } else {
                    "`system` needs a chat template, and this model has none (start the server with --chat-template FILE)"
                }));
            }
            req.insert("prompt".into(), json!(prompt));
            Endpoint::Completions
        } else {
            let mut ms = Vec::new();
            if let Some(s) = system {
                ms.push(json!({"role": "system", "content": s}));
            }
            ms.push(json!({"role": "user", "content": prompt}));
            req.insert("messages".into(), Value::Array(ms));
            apply_think(&app, &o, &mut req)?;
            Endpoint::Chat
        };
        apply_format(&o, &mut req)?;
        apply_options(&app, &o, &mut req)?;
        let stream = stream_flag(&o)?;
        run(app.clone(), ep, req, stream, Shape::Generate).await
    }
    .await;
    finish(&app, r)
}

fn finish(app: &App, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(r) => r,
        Err(e) => {
            Metrics::add(&app.metrics.requests_failed, 1);
            error(e)
        }
    }
}

/// Which of Ollama's answer shapes: `message` (chat) or `response`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Chat,
    Generate,
}

impl Shape {
    /// A piece of the answer as this shape carries it.
    fn piece(self, model: &str, content: &str, thinking: &str) -> Value {
        let mut v = json!({"model": model, "created_at": now()});
        match self {
            Shape::Chat => {
                let mut m = json!({"role": "assistant", "content": content});
                if !thinking.is_empty() {
                    m["thinking"] = json!(thinking);
                }
                v["message"] = m;
            }
            Shape::Generate => {
                v["response"] = json!(content);
                if !thinking.is_empty() {
                    v["thinking"] = json!(thinking);
                }
            }
        }
        v
    }
}

/// Times and counts of one run, as Ollama reports them.
struct Clock {
    start: Instant,
    first: Option<Instant>,
    prompt_tokens: usize,
}

impl Clock {
    fn done(&self, v: &mut Value, finish: Finish, eval_count: usize) {
        let end = Instant::now();
        let first = self.first.unwrap_or(end);
        let ns = |d: Duration| d.as_nanos() as u64;
        v["done"] = json!(true);
        v["done_reason"] = json!(finish.as_str());
        v["total_duration"] = json!(ns(end - self.start));
        v["load_duration"] = json!(0);
        v["prompt_eval_count"] = json!(self.prompt_tokens);
        v["prompt_eval_duration"] = json!(ns(first - self.start));
        v["eval_count"] = json!(eval_count);
        v["eval_duration"] = json!(ns(end - first));
    }
}

/// Checks, renders and runs the OpenAI request `req`; answers in `shape`.
async fn run(
    app: Arc<App>,
    ep: Endpoint,
    req: Map<String, Value>,
    stream: bool,
    shape: Shape,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let body = Value::Object(req).to_string().into_bytes();
    let app2 = app.clone();
    let mut p = tokio::task::spawn_blocking(move || prepare(&app2, ep, &body))
        .await
        .map_err(|e| ApiError::server(format!("preparing the prompt failed: {e}")))?
        .map_err(rename)?;
    let room = app.ctx - p.ids.len();
    let cap = match app.limits.max_tokens {
        0 => usize::MAX,
        m => m,
    };
    let r = &p.req;
    let max_new = r.max_tokens.map_or(room, |m| m.min(room)).min(cap);
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Job {
        prompt: p.ids.clone(),
        params: GenParams {
            max_new,
            sampler: SamplerConfig {
                temperature: r.temperature,
                top_k: r.top_k,
                top_p: r.top_p,
                seed: r.seed.unwrap_or_else(random_u64),
            },
            presence_penalty: r.presence_penalty,
            frequency_penalty: r.frequency_penalty,
            logprobs: None,
            // The server's drafter, if any: greedy output is unchanged by it
            // and sampled output keeps the target's distribution.
            speculative: true,
            logit_bias: Vec::new(),
        },
        constraint: p.constraint.take(),
        index: 0,
        tx,
        cancel: cancel.clone(),
        submitted: start,
    };
    if app.engine.submit(vec![job]).is_err() {
        return Err(queue_full(&app));
    }
    let run = Run {
        rx,
        cancels: vec![cancel],
        stops: r.stop.clone(),
        think: p.think,
        think_open: p.think_open,
        logprobs: false,
        keep_special: p.keep_special,
    };
    // Replies are parsed for tool calls (chat with `tools` only).
    let tool_format = p.tool_format.filter(|_| shape == Shape::Chat);
    let clock = Clock {
        start,
        first: None,
        prompt_tokens: p.ids.len(),
    };
    let model = app.model_name.clone();
    if !stream {
        let mut clock = clock;
        let (mut content, mut thinking, mut finish) = (String::new(), String::new(), None);
        let per = drive(&app.tok, run, 1, |u| {
            match u {
                Update::Delta { split, .. } => {
                    clock.first.get_or_insert_with(Instant::now);
                    content.push_str(&split.content);
                    thinking.push_str(&split.reasoning);
                }
                Update::Finished { finish: f, .. } => finish = Some(f),
            }
            true
        })
        .await?;
        let calls = match tool_format {
            Some(f) => {
                let (rest, calls) = tools::parse(&content, f);
                if !calls.is_empty() || f.forced {
                    content = rest;
                }
                calls
            }
            None => Vec::new(),
        };
        let mut v = shape.piece(&model, &content, crate::text::tidy_reasoning(&thinking));
        if !calls.is_empty() {
            v["message"]["tool_calls"] = calls.iter().map(ollama_call).collect();
        }
        clock.done(&mut v, finish.unwrap_or(per[0].2), per[0].0);
        return Ok(json_response(200, v.to_string()));
    }
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Bytes>();
    tokio::spawn(async move {
        let mut clock = clock;
        let line = |v: &Value| Bytes::from(format!("{v}\n"));
        let gone = out_tx.clone();
        let mut finish = None;
        let tok = app.tok.clone();
        // A call's text is held back while it is written and sent, parsed,
        // in one piece with `tool_calls` when the answer ends (as Ollama
        // streams calls).
        let mut calls_stream = tool_format.map(ToolStream::whole);
        let driving = drive(&tok, run, 1, |u| match u {
            Update::Delta { mut split, .. } => {
                clock.first.get_or_insert_with(Instant::now);
                if let Some(ts) = calls_stream.as_mut() {
                    split.content = ts.push(&split.content);
                    if split.is_empty() {
                        return true;
                    }
                }
                let mut v = shape.piece(&model, &split.content, &split.reasoning);
                v["done"] = json!(false);
                out_tx.send(line(&v)).is_ok()
            }
            Update::Finished { finish: f, .. } => {
                finish = Some(f);
                let Some(ts) = calls_stream.as_mut() else {
                    return true;
                };
                let (rest, calls) = ts.finish();
                if rest.is_empty() && calls.is_empty() {
                    return true;
                }
                let mut v = shape.piece(&model, &rest, "");
                if !calls.is_empty() {
                    v["message"]["tool_calls"] = calls.iter().map(ollama_call).collect();
                }
                v["done"] = json!(false);
                out_tx.send(line(&v)).is_ok()
            }
        });
        let result = tokio::select! {
            r = driving => r,
            _ = gone.closed() => return,
        };
        let v = match result {
            Ok(per) => {
                let mut v = shape.piece(&model, "", "");
                clock.done(&mut v, finish.unwrap_or(per[0].2), per[0].0);
                v
            }
            Err(e) => {
                Metrics::add(&app.metrics.requests_failed, 1);
                json!({"error": e.message})
            }
        };
        let _ = out_tx.send(line(&v));
    });
    let body = futures_util::stream::unfold(out_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    let mut resp = Response::new(Body::from_stream(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
}

const EMBED_FIELDS: [&str; 6] = [
    "model",
    "input",
    "truncate",
    "options",
    "keep_alive",
    "dimensions",
];

/// `POST /api/embed`.
pub async fn embed(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let start = Instant::now();
        let body = read_body(&app, &headers, body).await?;
        let o = object(&body)?;
        refuse_unknown(&o, &EMBED_FIELDS)?;
        check_model(&o)?;
        must_be_empty(&o, "options", "embeddings take no sampling options")?;
        match o.get("truncate") {
            None | Some(Value::Null) | Some(Value::Bool(_)) => {}
            Some(_) => return Err(bad("`truncate` must be a boolean")),
        }
        match o.get("dimensions") {
            None | Some(Value::Null) => {}
            Some(v) if v.as_u64() == Some(app.n_embd as u64) => {}
            Some(v) => {
                return Err(bad(format!(
                "`dimensions` must be {} for model {}: it declares no shorter embeddings; got {v}",
                app.n_embd, app.model_name
            )))
            }
        }
        let texts = embed::inputs(o.get("input"), "input")?;
        let (vectors, n_tokens) = embed::embed(&app, texts).await?;
        let ns = start.elapsed().as_nanos() as u64;
        Ok(json_response(
            200,
            json!({
                "model": app.model_name,
                "embeddings": vectors,
                "total_duration": ns,
                "load_duration": 0,
                "prompt_eval_count": n_tokens,
            })
            .to_string(),
        ))
    }
    .await;
    finish(&app, r)
}

fn details(app: &App) -> Value {
    let a = &app.about;
    json!({
        "parent_model": "",
        "format": a.format,
        "family": a.arch,
        "families": [a.arch],
        "parameter_size": parameter_size(a.parameters),
        "quantization_level": a.quantization,
    })
}

/// `135.0M`, `1.5B`: Ollama's way of saying a parameter count.
fn parameter_size(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{:.1}M", n as f64 / 1e6)
    }
}

/// `GET /api/tags`: the one model this server runs.
pub async fn tags(State(app): State<Arc<App>>) -> Response {
    let modified = rfc3339(Duration::from_secs(app.started));
    json_response(
        200,
        json!({"models": [{
            "name": app.model_name,
            "model": app.model_name,
            "modified_at": modified,
            "size": app.about.bytes,
            "digest": "",
            "details": details(&app),
        }]})
        .to_string(),
    )
}

/// `POST /api/show`.
pub async fn show(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = read_body(&app, &headers, body).await?;
        let o = object(&body)?;
        refuse_unknown(&o, &["model", "name", "verbose", "system"])?;
        must_be_empty(&o, "system", "the system prompt is sent with each request")?;
        let arch = &app.about.arch;
        let mut caps = vec!["completion"];
        if app.pooling.is_ok() {
            caps.push("embedding");
        }
        if app
            .template
            .as_ref()
            .is_some_and(|t| t.source().contains("<think>"))
        {
            caps.push("thinking");
        }
        Ok(json_response(
            200,
            json!({
                "modelfile": "",
                "parameters": "",
                "template": app.template.as_ref().map_or("", |t| t.source()),
                "details": details(&app),
                "model_info": {
                    "general.architecture": arch,
                    "general.parameter_count": app.about.parameters,
                    format!("{arch}.context_length"): app.ctx,
                    format!("{arch}.embedding_length"): app.n_embd,
                },
                "capabilities": caps,
                "modified_at": rfc3339(Duration::from_secs(app.started)),
            })
            .to_string(),
        ))
    }
    .await;
    finish(&app, r)
}

/// `GET /api/version`: onebit's own version.
pub async fn version() -> Response {
    json_response(
        200,
        json!({"version": env!("CARGO_PKG_VERSION")}).to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        // Known instants: the epoch, 2000-03-01 (after a leap day of a
        // century divisible by 400), and 2024-02-29T12:34:56.789Z
        // (1709210096 s, from `date -u -d 2024-02-29T12:34:56Z +%s`).
        assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(Duration::from_secs(951_868_800)),
            "2000-03-01T00:00:00.000Z"
        );
        assert_eq!(
            rfc3339(Duration::from_millis(1_709_210_096_789)),
            "2024-02-29T12:34:56.789Z"
        );
    }

    #[test]
    fn parameter_sizes() {
        assert_eq!(parameter_size(134_515_008), "134.5M");
        assert_eq!(parameter_size(1_543_714_304), "1.5B");
    }
}
