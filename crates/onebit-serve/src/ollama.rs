//! Ollama's API (`/api/chat`, `/api/generate`, `/api/embed`, `/api/show`,
//! `/api/tags`, `/api/version`), as its official clients and Open WebUI
//! speak it: NDJSON streamed by default, `stream: false` for one object,
//! sampling under `options`, durations in nanoseconds, errors as
//! `{"error": "..."}`.
//!
//! A request is parsed here straight into the engine's request type
//! ([`Request`]) and runs through [`crate::run`] like an OpenAI request;
//! every error names the field as Ollama's clients spell it
//! (`options.num_predict`, `format`). Fields are decided one by one
//! (docs/ollama.md): those we honour (`keep_alive` among them: how long the
//! model stays loaded after the request, `0` unloading it at once and a
//! negative value never; a request with no prompt or messages only loads
//! or unloads), those clients send routinely that change nothing here
//! (`format: ""`), and everything else is refused by name
//! with a 400, never ignored in silence.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{self, ApiError, Endpoint, Prompt, Request, MAX_STOPS};
use crate::app::{App, Entry, ModelAbout, Served};
use crate::constrain::{json_options, Grammar};
use crate::engine::Finish;
use crate::fields::{
    check_unread, inputs, keep_alive, mark_unread, model_name, object, unread, Input, KeepAlive,
};
use crate::images::{self, ImageIn};
use crate::metrics::Metrics;
use crate::reply::{json_response, retry_after};
use crate::run::{self, drive, Update};
use crate::tools::{self, ToolStream};

/// Ollama's sampling defaults, used when `options` states none.
const DEFAULT_TEMPERATURE: f32 = 0.8;
const DEFAULT_TOP_K: usize = 40;
const DEFAULT_TOP_P: f32 = 0.9;

/// Ollama's error shape, with the same status the `/v1` routes would give.
fn error(e: ApiError) -> Response {
    let mut r = json_response(e.status, json!({"error": e.message}).to_string());
    retry_after(&mut r, e.status);
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

/// The `options` honoured (Ollama's docs/modelfile.md and api.md names).
const OPTIONS: [&str; 14] = [
    "num_ctx",
    "num_predict",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "num_keep",
];

/// The `options` that set how Ollama runs on the machine (threads, GPUs,
/// memory mapping, batch size): accepted with no effect here, where the
/// command line sets those (`--threads`, `--prefill-chunk`), and noted in
/// the log and the ignored-fields header, never refused.
const MACHINE_OPTIONS: [&str; 7] = [
    "num_thread",
    "num_gpu",
    "main_gpu",
    "use_mmap",
    "numa",
    "num_batch",
    "low_vram",
];

/// Option `key` (named `name`, `options.key`, in errors), null as absent.
fn opt<'a>(opts: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    opts.get(key).filter(|v| !v.is_null())
}

/// A number option within `lo..=hi`.
fn opt_number(
    opts: &Map<String, Value>,
    key: &str,
    name: &'static str,
    lo: f64,
    hi: f64,
) -> Result<Option<f64>, ApiError> {
    match opt(opts, key) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
            Some(x) => Err(ApiError::invalid(
                name,
                format!("`{name}` must be between {lo} and {hi}; got {x}"),
            )),
            None => Err(ApiError::invalid(
                name,
                format!("`{name}` must be a number; got {v}"),
            )),
        },
    }
}

/// An integer option.
fn opt_integer(
    opts: &Map<String, Value>,
    key: &str,
    name: &'static str,
) -> Result<Option<i64>, ApiError> {
    match opt(opts, key) {
        None => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| {
            ApiError::invalid(name, format!("`{name}` must be an integer; got {v}"))
        }),
    }
}

/// `options` into `req`: Ollama's sampling defaults where it states none,
/// each value checked by the `/v1` rules and refused under its own name.
/// Options this server does not read go to `req.ignored` (refused under
/// `--strict-fields`); the machine-level ones are added after that check.
fn apply_options(
    app: &App,
    m: &Served,
    o: &Map<String, Value>,
    req: &mut Request,
) -> Result<(), ApiError> {
    let opts = match o.get("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(bad("`options` must be an object")),
    };
    let mut unknown = Vec::new();
    let mut machine = Vec::new();
    for (k, v) in &opts {
        // A null option is an absent one (langchain-ollama sends them all).
        if OPTIONS.contains(&k.as_str()) || v.is_null() {
            continue;
        }
        if MACHINE_OPTIONS.contains(&k.as_str()) {
            machine.push(format!("options.{k}"));
        } else {
            unknown.push(format!("options.{k}"));
        }
    }
    check_unread(app.strict_fields, &unknown)?;
    req.ignored.extend(unknown);
    req.ignored.extend(machine);
    req.ctx_limit = match opt(&opts, "num_ctx") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n as usize <= m.ctx => Some(n as usize),
            _ => {
                return Err(ApiError::invalid(
                    "options.num_ctx",
                    format!(
                    "`options.num_ctx` must be an integer from 1 to {} (this server's context, fixed at start with --ctx); got {v}",
                    m.ctx
                ),
                ))
            }
        },
    };
    // onebit never shifts the context (a prompt that does not fit is
    // refused, a reply ends at the context's end), so every token is kept
    // whatever `num_keep` says; it is checked, not ignored.
    if let Some(k) = opt_integer(&opts, "num_keep", "options.num_keep")? {
        if k < -1 {
            return Err(ApiError::invalid(
                "options.num_keep",
                format!("`options.num_keep` must be -1 (all) or at least 0; got {k}"),
            ));
        }
    }
    req.min_p = opt_number(&opts, "min_p", "options.min_p", 0.0, 1.0)?.unwrap_or(0.0) as f32;
    req.typical_p =
        opt_number(&opts, "typical_p", "options.typical_p", 0.0, 1.0)?.unwrap_or(1.0) as f32;
    req.repeat_penalty = match opt_number(
        &opts,
        "repeat_penalty",
        "options.repeat_penalty",
        0.0,
        api::MAX_REPEAT_PENALTY,
    )? {
        None => 1.0,
        Some(x) if x <= 0.0 => {
            return Err(ApiError::invalid(
                "options.repeat_penalty",
                "`options.repeat_penalty` must be greater than 0 (1 is off)",
            ))
        }
        Some(x) => x as f32,
    };
    req.repeat_last_n = match opt_integer(&opts, "repeat_last_n", "options.repeat_last_n")? {
        Some(x) if x < -1 => {
            return Err(ApiError::invalid(
                "options.repeat_last_n",
                format!("`options.repeat_last_n` must be -1 (all), 0 (off) or more; got {x}"),
            ))
        }
        n => api::repeat_window(n),
    };
    const NUM_PREDICT: &str = "options.num_predict";
    req.max_tokens = match opt_integer(&opts, "num_predict", NUM_PREDICT)? {
        // -1: no limit, -2: fill the context; both are the context's room here.
        None | Some(-1) | Some(-2) => None,
        Some(x) if x < 1 => {
            return Err(ApiError::invalid(
                NUM_PREDICT,
                format!("`{NUM_PREDICT}` must be at least 1 (or -1, -2); got {x}"),
            ))
        }
        Some(x) if app.max_tokens > 0 && x as u64 > app.max_tokens as u64 => {
            return Err(ApiError::invalid(
                NUM_PREDICT,
                format!(
                    "`{NUM_PREDICT}` must be at most {} on this server; got {x}",
                    app.max_tokens
                ),
            ))
        }
        Some(x) => Some(x as usize),
    };
    req.temperature = opt_number(&opts, "temperature", "options.temperature", 0.0, 2.0)?
        .map_or(DEFAULT_TEMPERATURE, |x| x as f32);
    req.top_p = match opt_number(&opts, "top_p", "options.top_p", 0.0, 1.0)? {
        None => DEFAULT_TOP_P,
        Some(x) if x <= 0.0 => {
            return Err(ApiError::invalid(
                "options.top_p",
                "`options.top_p` must be greater than 0",
            ))
        }
        Some(x) => x as f32,
    };
    req.top_k = match opt_integer(&opts, "top_k", "options.top_k")? {
        None => DEFAULT_TOP_K,
        Some(x) if (-1..=i64::from(u32::MAX)).contains(&x) => x.max(0) as usize,
        Some(x) => {
            return Err(ApiError::invalid(
                "options.top_k",
                format!(
                    "`options.top_k` must be between -1 and {}; got {x}",
                    u32::MAX
                ),
            ))
        }
    };
    req.seed = match opt(&opts, "seed") {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .map(|x| x as u64)
                .or_else(|| v.as_u64())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "options.seed",
                        format!("`options.seed` must be an integer; got {v}"),
                    )
                })?,
        ),
    };
    req.stop = match opt(&opts, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() > MAX_STOPS => {
            return Err(ApiError::invalid(
                "options.stop",
                format!(
                    "`options.stop`: at most {MAX_STOPS} stop strings; got {}",
                    a.len()
                ),
            ))
        }
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                ApiError::invalid(
                    "options.stop",
                    "`options.stop` must be a string or a list of strings",
                )
            })?,
        Some(v) => {
            return Err(ApiError::invalid(
                "options.stop",
                format!("`options.stop` must be a string or a list of strings; got {v}"),
            ))
        }
    };
    req.presence_penalty = opt_number(
        &opts,
        "presence_penalty",
        "options.presence_penalty",
        -2.0,
        2.0,
    )?
    .unwrap_or(0.0) as f32;
    req.frequency_penalty = opt_number(
        &opts,
        "frequency_penalty",
        "options.frequency_penalty",
        -2.0,
        2.0,
    )?
    .unwrap_or(0.0) as f32;
    Ok(())
}

/// `stream` (default true).
fn stream_flag(o: &Map<String, Value>) -> Result<bool, ApiError> {
    match o.get("stream") {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad("`stream` must be a boolean")),
    }
}

/// `format`: `"json"` (any JSON object) or a JSON schema, strict (keywords
/// the library does not know are refused, not ignored), so the same
/// constrained decoding as `response_format`; `""`/null is plain text.
fn format(o: &Map<String, Value>) -> Result<Option<Grammar>, ApiError> {
    match o.get("format") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => {
            Ok(Some(Grammar::JsonSchema(json!({"type": "object"}))))
        }
        Some(Value::Object(schema)) => {
            let mut schema = schema.clone();
            if !schema.contains_key("x-guidance") {
                let mut opts = json_options();
                opts["lenient"] = json!(false);
                schema.insert("x-guidance".into(), opts);
            }
            Ok(Some(Grammar::JsonSchema(Value::Object(schema))))
        }
        Some(v) => Err(ApiError::invalid(
            "format",
            format!("`format` must be \"json\", a JSON schema object or empty; got {v}"),
        )),
    }
}

/// `tools`: Ollama's tool list is OpenAI's (`{"type": "function",
/// "function": {name, description, parameters}}`), checked by the same
/// rules; Ollama has no `tool_choice`, so it is `auto`.
fn apply_tools(o: &Map<String, Value>, req: &mut Request) -> Result<(), ApiError> {
    match o.get("tools") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        Some(t @ Value::Array(_)) => {
            let mut one = Map::new();
            one.insert("tools".into(), t.clone());
            req.tools = api::tool_spec(&one)?;
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
/// template that knows `<think>`. A harmony model (gpt-oss) always reasons:
/// `think` is then `"low"`, `"medium"` or `"high"`, its `reasoning_effort`,
/// as Ollama takes it, and a boolean leaves the effort at the template's
/// default.
fn apply_think(m: &Served, o: &Map<String, Value>, req: &mut Request) -> Result<(), ApiError> {
    match o.get("think") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Bool(_)) if m.harmony() => Ok(()),
        Some(v) if m.harmony() => {
            let e = crate::harmony::effort(v).map_err(|why| bad(format!("`think`: {why}")))?;
            req.template_kwargs
                .get_or_insert_with(Default::default)
                .insert("reasoning_effort".into(), Value::String(e));
            Ok(())
        }
        Some(Value::Bool(b)) => {
            let knows = m.thinks();
            if *b && !knows {
                return Err(bad(format!(
                    "`think` is true, but model {} does not think (its chat template knows no <think>)",
                    m.name
                )));
            }
            if knows {
                let mut kw = Map::new();
                kw.insert("enable_thinking".into(), json!(b));
                req.template_kwargs = Some(kw);
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

/// Ollama's `images` of a message or of a generate request: a list of
/// base64 strings, each named `{at}[k]`.
fn images_of(o: &Map<String, Value>, at: &str, into: &mut Vec<ImageIn>) -> Result<usize, ApiError> {
    let list = match o.get("images") {
        None | Some(Value::Null) => return Ok(0),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad(format!("`{at}` must be a list of base64 strings"))),
    };
    for (k, v) in list.iter().enumerate() {
        let name = format!("{at}[{k}]");
        let Value::String(b) = v else {
            return Err(bad(format!("`{name}` must be a base64 string")));
        };
        let bytes = images::base64(b, &name, "images").map_err(|e| bad(e.message))?;
        into.push(ImageIn {
            at: name,
            bytes: Arc::new(bytes),
        });
        images::check_count(into.len(), "images").map_err(|e| bad(e.message))?;
    }
    Ok(list.len())
}

/// `n` image marks before `text`: Ollama places a message's images ahead
/// of its text.
fn with_marks(n: usize, text: &str) -> String {
    let mut s: String = std::iter::repeat_n(images::MARK, n).collect();
    s.push_str(text);
    s
}

/// Ollama's messages as the engine's chat prompt: role and content (checked
/// by the `/v1` rules), `tool_name` as `name`, calls in OpenAI's shape;
/// `images` (base64) ahead of the message's text.
fn messages(o: &Map<String, Value>) -> Result<(Prompt, Vec<ImageIn>), ApiError> {
    let Some(Value::Array(ms)) = o.get("messages") else {
        return Err(bad("`messages` must be a list of messages"));
    };
    let mut found = Vec::new();
    let mut counts = Vec::with_capacity(ms.len());
    let list = ms
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(m) = m else {
                return Err(bad(format!("`messages[{i}]` must be an object")));
            };
            counts.push(images_of(m, &format!("messages[{i}].images"), &mut found)?);
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
                            "`messages[{i}].{other}` is not supported; a message carries role, content, thinking, tool_calls, tool_name and images"
                        )))
                    }
                }
            }
            Ok(Value::Object(out))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut one = Map::new();
    one.insert("messages".into(), Value::Array(list));
    let (mut v, _) = api::messages(&one)?;
    if let Value::Array(list) = &mut v {
        for (m, &n) in list.iter_mut().zip(&counts).filter(|(_, &n)| n > 0) {
            let text = m["content"].as_str().unwrap_or("").to_string();
            m["content"] = Value::String(with_marks(n, &text));
        }
    }
    Ok((Prompt::Chat(v), found))
}

/// `POST /api/chat`.
pub async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    Metrics::add(&app.metrics.requests_chat, 1);
    let r = async {
        let body = app.read_body(&headers, body).await?;
        let o = object(&body)?;
        let top = unread(&o, &CHAT_FIELDS, "");
        check_unread(app.strict_fields, &top)?;
        let (name, keep) = (model_name(&o)?, keep_alive(&o)?);
        let no_messages = match o.get("messages") {
            None | Some(Value::Null) => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(_) => false,
        };
        if no_messages {
            return load_or_unload(&app, name, keep, Shape::Chat).await;
        }
        let m = app.model_kept(name, keep).await?;
        let (prompt, found) = messages(&o)?;
        let mut req = Request::new(prompt);
        req.images = found;
        req.ignored = top;
        req.grammar = format(&o)?;
        apply_tools(&o, &mut req)?;
        apply_options(&app, &m, &o, &mut req)?;
        apply_think(&m, &o, &mut req)?;
        req.stream = stream_flag(&o)?;
        let ignored = req.ignored.clone();
        let mut r = answer(app.clone(), m, Endpoint::Chat, req, Shape::Chat).await?;
        mark_unread(&mut r, "POST /api/chat", &ignored);
        Ok(r)
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
        let body = app.read_body(&headers, body).await?;
        let o = object(&body)?;
        let top = unread(&o, &GENERATE_FIELDS, "");
        check_unread(app.strict_fields, &top)?;
        let (name, keep) = (model_name(&o)?, keep_alive(&o)?);
        let no_prompt = match o.get("prompt") {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(_) => false,
        };
        if no_prompt && o.get("system").is_none_or(Value::is_null) {
            return load_or_unload(&app, name, keep, Shape::Generate).await;
        }
        let m = app.model_kept(name, keep).await?;
        must_be_empty(&o, "suffix", "fill-in-the-middle is not implemented")?;
        must_be_empty(&o, "template", "the model's template (or --chat-template) is used")?;
        must_be_empty(&o, "context", "send the conversation to /api/chat instead")?;
        let mut found = Vec::new();
        let n_images = images_of(&o, "images", &mut found)?;
        let prompt = match o.get("prompt") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad("`prompt` must be a string")),
        };
        let prompt = if n_images > 0 {
            with_marks(n_images, &prompt)
        } else {
            prompt
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
        let (mut req, ep) = if raw || m.template.is_none() {
            if system.is_some() {
                return Err(bad(if raw {
                    "`system` needs the chat template, which `raw: true` turns off"
                } else {
                    "`system` needs a chat template, and this model has none (start the server with --chat-template FILE)"
                }));
            }
            (Request::new(Prompt::Text(prompt)), Endpoint::Completions)
        } else {
            let mut ms = Vec::new();
            if let Some(s) = system {
                ms.push(json!({"role": "system", "content": s}));
            }
            ms.push(json!({"role": "user", "content": prompt}));
            let mut req = Request::new(Prompt::Chat(Value::Array(ms)));
            apply_think(&m, &o, &mut req)?;
            (req, Endpoint::Chat)
        };
        req.images = found;
        req.ignored = top;
        req.grammar = format(&o)?;
        apply_options(&app, &m, &o, &mut req)?;
        req.stream = stream_flag(&o)?;
        let ignored = req.ignored.clone();
        let mut r = answer(app.clone(), m, ep, req, Shape::Generate).await?;
        mark_unread(&mut r, "POST /api/generate", &ignored);
        Ok(r)
    }
    .await;
    finish(&app, r)
}

/// A request with nothing to generate: Ollama's way to load a model (and
/// set its keep-alive), or with `keep_alive` 0 to unload it now.
async fn load_or_unload(
    app: &App,
    name: Option<&str>,
    keep: Option<KeepAlive>,
    shape: Shape,
) -> Result<Response, ApiError> {
    let e = app.models.find(name)?;
    let reason = if keep == Some(KeepAlive::For(Duration::ZERO)) {
        app.models.unload(&e, "keep_alive 0");
        "unload"
    } else {
        drop(app.models.acquire(&e, keep).await?);
        "load"
    };
    let mut v = shape.piece(&e.name, "", "");
    v["done"] = json!(true);
    v["done_reason"] = json!(reason);
    Ok(json_response(200, v.to_string()))
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

/// Renders and runs `req` on `m`; answers in `shape`, whole or as NDJSON.
async fn answer(
    app: Arc<App>,
    m: Arc<Served>,
    ep: Endpoint,
    req: Request,
    shape: Shape,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let (app2, m2) = (app.clone(), m.clone());
    let mut p = run::blocking(move || run::prepare(&app2, &m2, ep, req, "format")).await?;
    let run = run::submit(&app, &m, &mut p)?;
    let affinity = run.affinity.clone();
    let stream = p.req.stream;
    // Replies are parsed for tool calls (chat with `tools` only).
    let tool_format = p.tool_format.filter(|_| shape == Shape::Chat);
    let lenient = p.req.tools.clone();
    let clock = Clock {
        start,
        first: None,
        prompt_tokens: p.ids.len(),
    };
    let model = m.name.clone();
    if !stream {
        let mut clock = clock;
        let (mut content, mut thinking, mut finish) = (String::new(), String::new(), None);
        let per = drive(&m.tok, run, |u| {
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
                let (rest, calls) = tools::parse_reply(&content, f, lenient.as_ref());
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
        let mut resp = json_response(200, v.to_string());
        run::mark(&mut resp, affinity);
        return Ok(resp);
    }
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Bytes>();
    // A panic in the producer (a bug) ends the stream with Ollama's error line.
    let last = Bytes::from(format!(
        "{}\n",
        json!({"error": crate::conn::STREAM_FAILED})
    ));
    crate::conn::spawn_stream(out_tx.clone(), last, async move {
        let mut clock = clock;
        let line = |v: &Value| Bytes::from(format!("{v}\n"));
        let gone = out_tx.clone();
        let mut finish = None;
        let tok = m.tok.clone();
        // A call's text is held back while it is written and sent, parsed,
        // in one piece with `tool_calls` when the answer ends (as Ollama
        // streams calls).
        let mut calls_stream =
            tool_format.map(|f| ToolStream::whole(f).with_tools(lenient.as_ref()));
        let driving = drive(&tok, run, |u| match u {
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
    run::mark(&mut resp, affinity);
    Ok(resp)
}

const LEGACY_EMBED_FIELDS: [&str; 4] = ["model", "prompt", "options", "keep_alive"];

/// `POST /api/embeddings`, Ollama's legacy route: one `prompt`, one
/// `embedding`. Its vector is the same as `/api/embed`'s, L2-normalized
/// (Ollama's legacy route leaves its own unnormalized; cosine similarity,
/// what the vectors are used for, is the same either way).
pub async fn embeddings(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = app.read_body(&headers, body).await?;
        let o = object(&body)?;
        let mut ignored = unread(&o, &LEGACY_EMBED_FIELDS, "");
        ignored.extend(embed_options(&o)?);
        check_unread(app.strict_fields, &ignored)?;
        let prompt = match o.get("prompt") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::String(_)) => return Err(bad("`prompt` is empty")),
            None | Some(Value::Null) => {
                return Err(bad("`prompt` is required (the text to embed)"))
            }
            Some(v) => return Err(bad(format!("`prompt` must be a string; got {v}"))),
        };
        let m = app.model_kept(model_name(&o)?, keep_alive(&o)?).await?;
        let (mut vectors, _) = run::embed(&app, &m, vec![Input::Text(prompt)]).await?;
        let mut r = json_response(
            200,
            json!({"embedding": vectors.pop().unwrap_or_default()}).to_string(),
        );
        mark_unread(&mut r, "POST /api/embeddings", &ignored);
        Ok(r)
    }
    .await;
    finish(&app, r)
}

/// The `options` of an embedding request that set something (not null):
/// none changes a vector (sampling does not apply, and the machine-level
/// ones are the command line's), so all are named as not read. Null
/// values, which langchain-ollama sends for every option, are nothing.
fn embed_options(o: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    match o.get("options") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(opts)) => Ok(opts
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, _)| format!("options.{k}"))
            .collect()),
        Some(v) => Err(bad(format!("`options` must be an object; got {v}"))),
    }
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
        let body = app.read_body(&headers, body).await?;
        let o = object(&body)?;
        let mut ignored = unread(&o, &EMBED_FIELDS, "");
        ignored.extend(embed_options(&o)?);
        check_unread(app.strict_fields, &ignored)?;
        let m = app.model_kept(model_name(&o)?, keep_alive(&o)?).await?;
        match o.get("truncate") {
            None | Some(Value::Null) | Some(Value::Bool(_)) => {}
            Some(_) => return Err(bad("`truncate` must be a boolean")),
        }
        match o.get("dimensions") {
            None | Some(Value::Null) => {}
            Some(v) if v.as_u64() == Some(m.n_embd as u64) => {}
            Some(v) => {
                return Err(bad(format!(
                "`dimensions` must be {} for model {}: it declares no shorter embeddings; got {v}",
                m.n_embd, m.name
            )))
            }
        }
        let texts = inputs(o.get("input"), "input", false)?;
        let (vectors, n_tokens) = run::embed(&app, &m, texts).await?;
        let ns = start.elapsed().as_nanos() as u64;
        let mut r = json_response(
            200,
            json!({
                "model": m.name,
                "embeddings": vectors,
                "total_duration": ns,
                "load_duration": 0,
                "prompt_eval_count": n_tokens,
            })
            .to_string(),
        );
        mark_unread(&mut r, "POST /api/embed", &ignored);
        Ok(r)
    }
    .await;
    finish(&app, r)
}

fn details(a: &ModelAbout) -> Value {
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

/// A model as `/api/tags` and `/api/ps` list it; what its last load said
/// about it (a model never loaded yet has only its name and size).
fn listed(app: &App, e: &Entry) -> Value {
    let about = app.models.about(e).unwrap_or_default();
    json!({
        "name": e.name,
        "model": e.name,
        "modified_at": rfc3339(Duration::from_secs(app.started)),
        "size": e.bytes,
        "digest": "",
        "details": details(&about),
    })
}

/// `GET /api/tags`: every model this server serves.
pub async fn tags(State(app): State<Arc<App>>) -> Response {
    let models: Vec<Value> = app
        .models
        .entries()
        .iter()
        .map(|e| listed(&app, e))
        .collect();
    json_response(200, json!({"models": models}).to_string())
}

/// `GET /api/ps`: the models loaded now, and when each unloads if idle.
pub async fn ps(State(app): State<Arc<App>>) -> Response {
    let models: Vec<Value> = app
        .models
        .entries()
        .iter()
        .filter_map(|e| {
            let (m, expires) = app.models.loaded(e)?;
            let mut v = listed(&app, e);
            let left = expires.map(|t| t.saturating_duration_since(Instant::now()));
            // Never: far in the future, as Ollama says it.
            let at = left.map_or(Duration::from_secs(253_402_300_799), |d| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    + d
            });
            v["expires_at"] = json!(rfc3339(at));
            v["size_vram"] = json!(0);
            v["context_length"] = json!(m.ctx);
            Some(v)
        })
        .collect();
    json_response(200, json!({"models": models}).to_string())
}

/// `POST /api/show`.
pub async fn show(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = app.read_body(&headers, body).await?;
        let o = object(&body)?;
        let ignored = unread(&o, &["model", "name", "verbose", "system"], "");
        check_unread(app.strict_fields, &ignored)?;
        must_be_empty(&o, "system", "the system prompt is sent with each request")?;
        // Older clients send `name`.
        let name = match model_name(&o)? {
            Some(n) => Some(n),
            None => o.get("name").and_then(Value::as_str),
        };
        let m = app.model(name).await?;
        let arch = &m.about.arch;
        let caps = capabilities(
            m.generative.is_ok(),
            m.pooling.is_ok(),
            m.template.as_ref().map(|t| t.source()),
            m.vision.is_some(),
        );
        let mut r = json_response(
            200,
            json!({
                "modelfile": "",
                "parameters": "",
                "template": m.template.as_ref().map_or("", |t| t.source()),
                "details": details(&m.about),
                "model_info": {
                    "general.architecture": arch,
                    "general.parameter_count": m.about.parameters,
                    format!("{arch}.context_length"): m.ctx,
                    format!("{arch}.embedding_length"): m.n_embd,
                },
                "capabilities": caps,
                "modified_at": rfc3339(Duration::from_secs(app.started)),
            })
            .to_string(),
        );
        mark_unread(&mut r, "POST /api/show", &ignored);
        Ok(r)
    }
    .await;
    finish(&app, r)
}

/// What `/api/show` says a model can do, Ollama's names: `completion` when
/// it generates; `tools` when its chat template reads `tools` in a call
/// format the server parses ([`tools::detect`]: then a request's tools
/// reach the model the template's way); `thinking` when the template knows
/// `<think>` (what `think: true` needs); `embedding` when its embeddings
/// pool; `vision` when it generates and has a vision tower (`--mmproj`),
/// never otherwise (images are then refused).
fn capabilities(
    generates: bool,
    embeds: bool,
    template: Option<&str>,
    vision: bool,
) -> Vec<&'static str> {
    let mut caps = Vec::new();
    if generates {
        caps.push("completion");
        if vision {
            caps.push("vision");
        }
        if let Some(t) = template {
            if tools::detect(t).is_some() {
                caps.push("tools");
            }
            if t.contains("<think>") {
                caps.push("thinking");
            }
        }
    }
    if embeds {
        caps.push("embedding");
    }
    caps
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
    fn capabilities_follow_the_model_and_its_template() {
        // A template that reads `tools` and writes Hermes' <tool_call>, and
        // one that opens a <think> block.
        let tools = "{% if tools %}{{ tools | tojson }}{% endif %}<tool_call>";
        let think = "{{ messages }}<think>";
        assert_eq!(
            capabilities(true, true, Some(tools), false),
            ["completion", "tools", "embedding"]
        );
        assert_eq!(
            capabilities(true, false, Some(think), false),
            ["completion", "thinking"]
        );
        assert_eq!(
            capabilities(true, false, Some("{{ messages }}"), false),
            ["completion"]
        );
        assert_eq!(capabilities(true, false, None, false), ["completion"]);
        // A vision tower: `vision`, but only on a model that generates.
        assert_eq!(
            capabilities(true, false, None, true),
            ["completion", "vision"]
        );
        assert_eq!(capabilities(false, true, None, true), ["embedding"]);
        // An embedding model: no completion, whatever its template says.
        assert_eq!(capabilities(false, true, Some(tools), false), ["embedding"]);
    }

    #[test]
    fn parameter_sizes() {
        assert_eq!(parameter_size(134_515_008), "134.5M");
        assert_eq!(parameter_size(1_543_714_304), "1.5B");
    }
}
