//! Anthropic's Messages API: `POST /v1/messages` (whole and SSE) and
//! `POST /v1/messages/count_tokens`, as the official `anthropic` client
//! speaks it. A request is parsed here straight into the engine's request
//! type (its messages' content blocks as chat messages, checked by the
//! `/v1` rules, so every user string goes through the template's plain-text
//! spans), run by [`crate::run`], and its output shaped into content
//! blocks: `thinking` (the `<think>` block), `text`, `tool_use`.
//!
//! Invariants: the streamed events (message_start, then each block's
//! content_block_start / _delta / _stop with one `ping` after the first
//! start, then message_delta with the stop reason and usage, message_stop)
//! build exactly the blocks the whole answer has (one builder, `Blocks`,
//! makes both); `stop_reason` is `stop_sequence` (with the sequence) only
//! when one of `stop_sequences` ended the text, `max_tokens` when the limit
//! did, `tool_use` when the answer holds a call, else `end_turn`; every
//! field is honoured, reported in `x-onebit-ignored-fields` (those that
//! change nothing here), or refused by name; every error is in Anthropic's
//! shape, `{"type": "error", "error": {"type", "message"}}`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{self, type_name, ApiError, Endpoint, Limits, Prompt, Request, MAX_STOPS};
use crate::app::{App, Served};
use crate::engine::Finish;
use crate::fields::{model_name, object};
use crate::images;
use crate::metrics::Metrics;
use crate::reply::{anthropic_error, anthropic_kind, json_response, random_u64};
use crate::run::{self, drive, Run, Update};
use crate::text::StopMatcher;
use crate::tools::{self, CallFormat, ToolStream};

/// The fields `/v1/messages` reads. Those in [`NOTED`] change nothing here
/// and are named in the `x-onebit-ignored-fields` header; any other is a 400.
/// `temperature`, `top_p` and `top_k` are Anthropic's sampling fields (the
/// current client no longer offers them; its `extra_body` still sends them).
const FIELDS: [&str; 16] = [
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
    "metadata",
    "service_tier",
    "cache_control",
    "anthropic_version",
];

/// The fields `/v1/messages/count_tokens` reads.
const COUNT_FIELDS: [&str; 7] = [
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "cache_control",
];

/// Accepted, with no effect here: `metadata` (an end-user id), the
/// service tier, and the API version a body may name. (`cache_control`,
/// at the top or on a block, is honoured by the prefix cache, always on.)
const NOTED: [&str; 3] = ["metadata", "service_tier", "anthropic_version"];

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::invalid(None, message)
}

fn field<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

/// A block's keys: each one of `allowed` (or null), else a 400 naming it.
fn block_keys(at: &str, o: &Map<String, Value>, allowed: &[&str]) -> Result<(), ApiError> {
    match o
        .iter()
        .find(|(k, v)| !v.is_null() && !allowed.contains(&k.as_str()))
    {
        None => Ok(()),
        Some((k, _)) => Err(bad(format!(
            "{at}.{k} is not supported; this block carries {}",
            allowed.join(", ")
        ))),
    }
}

fn block_str<'a>(at: &str, o: &'a Map<String, Value>, key: &str) -> Result<&'a str, ApiError> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(bad(format!("{at} has no `{key}`"))),
        Some(v) => Err(bad(format!(
            "{at}.{key} must be a string; got {}",
            type_name(v)
        ))),
    }
}

/// Text blocks (`system`, a tool result's content): a string, or a list of
/// `text` blocks joined; an image or document is refused by name.
fn text_blocks(at: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::new();
            for (j, b) in blocks.iter().enumerate() {
                let at = format!("{at}[{j}]");
                let Value::Object(b) = b else {
                    return Err(bad(format!(
                        "{at} must be a content block; got {}",
                        type_name(b)
                    )));
                };
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        block_keys(&at, b, &["type", "text", "cache_control", "citations"])?;
                        texts.push(block_str(&at, b, "text")?.to_string());
                    }
                    Some("image") => {
                        return Err(bad(format!(
                            "{at} is an image block; images are taken in a user turn's content only"
                        )))
                    }
                    Some("document") => {
                        return Err(bad(format!(
                            "{at} is a document block; this server takes text and images only"
                        )))
                    }
                    Some(t) => {
                        return Err(bad(format!(
                            "{at} is a block of type {t:?}; only text blocks go here"
                        )))
                    }
                    None => return Err(bad(format!("{at} has no string `type`"))),
                }
            }
            Ok(texts.join("\n"))
        }
        v => Err(bad(format!(
            "{at} must be a string or a list of text blocks; got {}",
            type_name(v)
        ))),
    }
}

/// An image block's `source` as a `data:` URL: `{"type": "base64",
/// "media_type", "data"}` (checked here, to name the block); a `url` or
/// `file` source is refused (the server fetches and keeps nothing).
fn image_source(at: &str, b: &Map<String, Value>) -> Result<String, ApiError> {
    let Some(Value::Object(src)) = b.get("source") else {
        return Err(bad(format!("{at} has no `source` object")));
    };
    let at = format!("{at}.source");
    match src.get("type").and_then(Value::as_str) {
        Some("base64") => {
            block_keys(&at, src, &["type", "media_type", "data"])?;
            let media = block_str(&at, src, "media_type")?;
            let data = block_str(&at, src, "data")?;
            images::base64(data, &at, "messages").map_err(|e| bad(e.message))?;
            Ok(format!("data:{media};base64,{data}"))
        }
        Some(t @ ("url" | "file")) => Err(bad(format!(
            "the image at {at} is of type {t:?}; this server fetches and keeps nothing: send the image as a base64 source"
        ))),
        Some(t) => Err(bad(format!(
            "{at}.type {t:?} is not an image source this server takes (base64)"
        ))),
        None => Err(bad(format!("{at} has no string `type`"))),
    }
}

/// The name of the `tool_use` block `id` among `msgs`' assistant turns.
fn tool_name(msgs: &[Value], id: &str) -> Option<String> {
    msgs.iter().rev().find_map(|m| {
        m.get("tool_calls")?.as_array()?.iter().find_map(|c| {
            (c["id"] == id).then(|| c["function"]["name"].as_str().map(str::to_string))?
        })
    })
}

/// `system` and `messages` as chat messages: text blocks joined, a
/// `tool_use` block as a call of the assistant's turn (its input as the
/// arguments), each `tool_result` as a tool message before the user's text;
/// thinking blocks sent back are not part of the prompt.
fn chat_messages(o: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    let mut images = 0;
    if let Some(s) = field(o, "system") {
        out.push(json!({"role": "system", "content": text_blocks("system", s)?}));
    }
    let list = match o.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(bad("`messages` must not be empty")),
        None | Some(Value::Null) => return Err(bad("`messages` is required")),
        Some(v) => {
            return Err(bad(format!(
                "`messages` must be a list of messages; got {}",
                type_name(v)
            )))
        }
    };
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(m) = m else {
            return Err(bad(format!("{at} must be an object; got {}", type_name(m))));
        };
        block_keys(&at, m, &["role", "content"])?;
        let role = block_str(&at, m, "role")?;
        if role != "user" && role != "assistant" {
            return Err(bad(format!(
                "{at}.role {role:?} is not one of user, assistant (the system prompt goes in `system`)"
            )));
        }
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                out.push(json!({"role": role, "content": s}));
                continue;
            }
            Some(Value::Array(b)) => b,
            None | Some(Value::Null) => return Err(bad(format!("{at} has no `content`"))),
            Some(v) => {
                return Err(bad(format!(
                    "{at}.content must be a string or a list of content blocks; got {}",
                    type_name(v)
                )))
            }
        };
        let mut texts: Vec<String> = Vec::new();
        // A user turn's text and image blocks in order, as OpenAI's parts.
        let mut parts: Vec<Value> = Vec::new();
        let mut calls: Vec<Value> = Vec::new();
        let mut results: Vec<Value> = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("{at}.content[{j}]");
            let Value::Object(b) = b else {
                return Err(bad(format!(
                    "{at} must be a content block; got {}",
                    type_name(b)
                )));
            };
            let ty = b.get("type").and_then(Value::as_str);
            match (role, ty) {
                (_, Some("text")) => {
                    block_keys(&at, b, &["type", "text", "cache_control", "citations"])?;
                    let t = block_str(&at, b, "text")?.to_string();
                    parts.push(json!({"type": "text", "text": t}));
                    texts.push(t);
                }
                ("user", Some("image")) => {
                    block_keys(&at, b, &["type", "source", "cache_control"])?;
                    let url = image_source(&at, b)?;
                    images += 1;
                    images::check_count(images, "messages").map_err(|e| bad(e.message))?;
                    parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
                }
                (_, Some("image")) => {
                    return Err(bad(format!(
                        "{at} is an image block; images are taken in a user turn's content only"
                    )))
                }
                (_, Some("document")) => {
                    return Err(bad(format!(
                        "{at} is a document block; this server takes text and images only"
                    )))
                }
                ("assistant", Some("tool_use")) => {
                    block_keys(&at, b, &["type", "id", "name", "input", "cache_control"])?;
                    let input = match b.get("input") {
                        Some(v @ Value::Object(_)) => v.to_string(),
                        None | Some(Value::Null) => "{}".into(),
                        Some(v) => {
                            return Err(bad(format!(
                                "{at}.input must be an object; got {}",
                                type_name(v)
                            )))
                        }
                    };
                    calls.push(json!({
                        "id": block_str(&at, b, "id")?,
                        "type": "function",
                        "function": {"name": block_str(&at, b, "name")?, "arguments": input},
                    }));
                }
                ("user", Some("tool_result")) => {
                    block_keys(
                        &at,
                        b,
                        &[
                            "type",
                            "tool_use_id",
                            "content",
                            "is_error",
                            "cache_control",
                        ],
                    )?;
                    let id = block_str(&at, b, "tool_use_id")?;
                    let content = match field(b, "content") {
                        None => String::new(),
                        Some(c) => text_blocks(&format!("{at}.content"), c)?,
                    };
                    match field(b, "is_error") {
                        None | Some(Value::Bool(_)) => {}
                        Some(v) => {
                            return Err(bad(format!(
                                "{at}.is_error must be a boolean; got {}",
                                type_name(v)
                            )))
                        }
                    }
                    let Some(name) = tool_name(&out, id) else {
                        return Err(bad(format!(
                            "{at}.tool_use_id {id:?} names no tool_use block earlier in the conversation"
                        )));
                    };
                    results.push(json!({"role": "tool", "tool_call_id": id, "name": name, "content": content}));
                }
                ("assistant", Some("thinking" | "redacted_thinking")) => {}
                (_, Some(t)) => {
                    return Err(bad(format!(
                    "{at} is a block of type {t:?}, which a {role} turn cannot carry here (text{})",
                    if role == "user" {
                        ", tool_result"
                    } else {
                        ", tool_use, thinking"
                    }
                )))
                }
                (_, None) => return Err(bad(format!("{at} has no string `type`"))),
            }
        }
        if role == "assistant" {
            let content = if texts.is_empty() && !calls.is_empty() {
                Value::Null
            } else {
                json!(texts.join("\n"))
            };
            let mut msg = json!({"role": "assistant", "content": content});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        } else {
            out.extend(results);
            if parts.len() > texts.len() {
                out.push(json!({"role": "user", "content": parts}));
            } else if !texts.is_empty() {
                out.push(json!({"role": "user", "content": texts.join("\n")}));
            }
        }
    }
    Ok(out)
}

/// `tools` (client tools: name, description, input_schema) and
/// `tool_choice` (auto, any, tool, none) by the chat rules.
fn tool_spec(o: &Map<String, Value>) -> Result<Option<tools::ToolSpec>, ApiError> {
    let mut chat = Map::new();
    let mut parallel = true;
    match field(o, "tools") {
        None => {}
        Some(Value::Array(list)) => {
            let mut converted = Vec::new();
            for (i, t) in list.iter().enumerate() {
                let at = format!("tools[{i}]");
                let Value::Object(t) = t else {
                    return Err(bad(format!("{at} must be an object; got {}", type_name(t))));
                };
                match field(t, "type").map(|v| v.as_str()) {
                    None | Some(Some("custom")) => {}
                    Some(Some(other)) => {
                        return Err(bad(format!(
                            "{at} is of type {other:?}; only client tools (name, description, input_schema) are served"
                        )))
                    }
                    Some(None) => return Err(bad(format!("{at}.type must be a string"))),
                }
                block_keys(
                    &at,
                    t,
                    &[
                        "type",
                        "name",
                        "description",
                        "input_schema",
                        "cache_control",
                        "strict",
                    ],
                )?;
                let name = block_str(&at, t, "name")?;
                let schema = match t.get("input_schema") {
                    Some(s @ Value::Object(_)) => s.clone(),
                    None | Some(Value::Null) => {
                        return Err(bad(format!("{at} has no `input_schema`")))
                    }
                    Some(v) => {
                        return Err(bad(format!(
                            "{at}.input_schema must be a JSON schema object; got {}",
                            type_name(v)
                        )))
                    }
                };
                let mut f = json!({"name": name, "parameters": schema});
                if let Some(d) = field(t, "description") {
                    f["description"] = d.clone();
                }
                converted.push(json!({"type": "function", "function": f}));
            }
            chat.insert("tools".into(), Value::Array(converted));
        }
        Some(v) => {
            return Err(bad(format!(
                "`tools` must be a list of tools; got {}",
                type_name(v)
            )))
        }
    }
    match field(o, "tool_choice") {
        None => {}
        Some(Value::Object(c)) => {
            block_keys(
                "tool_choice",
                c,
                &["type", "name", "disable_parallel_tool_use"],
            )?;
            let choice = match c.get("type").and_then(Value::as_str) {
                Some("auto") => json!("auto"),
                Some("any") => json!("required"),
                Some("none") => json!("none"),
                Some("tool") => match c.get("name").and_then(Value::as_str) {
                    Some(n) => json!({"type": "function", "function": {"name": n}}),
                    None => return Err(bad("`tool_choice` of type tool needs a string `name`")),
                },
                _ => {
                    return Err(bad(
                        "`tool_choice.type` must be one of auto, any, tool, none",
                    ))
                }
            };
            match field(c, "disable_parallel_tool_use") {
                None => {}
                Some(Value::Bool(b)) => parallel = !b,
                Some(v) => {
                    return Err(bad(format!(
                        "`tool_choice.disable_parallel_tool_use` must be a boolean; got {}",
                        type_name(v)
                    )))
                }
            }
            chat.insert("tool_choice".into(), choice);
        }
        Some(v) => {
            return Err(bad(format!(
                "`tool_choice` must be an object like {{\"type\": \"auto\"}}; got {}",
                type_name(v)
            )))
        }
    }
    chat.insert("parallel_tool_calls".into(), json!(parallel));
    // The chat checks name their fields as OpenAI's do; say them as here.
    api::tool_spec(&chat).map_err(|e| {
        bad(e
            .message
            .replace("function.parameters", "input_schema")
            .replace("function.name", "name")
            .replace("function ", "tool "))
    })
}

/// What a parsed request runs and how its answer is shaped.
pub struct Parsed {
    pub req: Request,
    /// `stop_sequences`, matched here (the answer names the one that hit).
    pub stops: Vec<String>,
    pub noted: Vec<String>,
}

fn number(o: &Map<String, Value>, name: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match field(o, name) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if !(lo..=hi).contains(&x) {
                return Err(bad(format!(
                    "`{name}` must be between {lo} and {hi}; got {x}"
                )));
            }
            Ok(Some(x))
        }
        Some(v) => Err(bad(format!(
            "`{name}` must be a number; got {}",
            type_name(v)
        ))),
    }
}

/// Parses a request body's object; `count` parses a count_tokens body (no
/// `max_tokens`, nothing about sampling); `thinks`: the model's template
/// knows `<think>`.
pub fn parse(
    o: &Map<String, Value>,
    limits: Limits,
    thinks: bool,
    count: bool,
) -> Result<Parsed, ApiError> {
    let known: &[&str] = if count { &COUNT_FIELDS } else { &FIELDS };
    if let Some(k) = o.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(bad(format!(
            "unknown field `{k}`: {} reads only {}",
            if count {
                "/v1/messages/count_tokens"
            } else {
                "/v1/messages"
            },
            known.join(", ")
        )));
    }
    let mut noted: Vec<String> = NOTED
        .iter()
        .filter(|k| field(o, k).is_some())
        .map(|k| k.to_string())
        .collect();
    if let Some(v) = field(o, "metadata") {
        if !v.is_object() {
            return Err(bad(format!(
                "`metadata` must be an object; got {}",
                type_name(v)
            )));
        }
    }
    let msgs = chat_messages(o)?;
    let mut one = Map::new();
    one.insert("messages".into(), Value::Array(msgs));
    let (prompt, found) = api::messages(&one).map_err(|e| bad(e.message))?;
    let mut req = Request::new(Prompt::Chat(prompt));
    req.images = found;
    req.tools = tool_spec(o)?;

    let mut kwargs = Map::new();
    match field(o, "thinking") {
        None => {}
        Some(Value::Object(t)) => {
            block_keys("thinking", t, &["type", "budget_tokens", "display"])?;
            let on = match t.get("type").and_then(Value::as_str) {
                Some("enabled") => {
                    match t.get("budget_tokens") {
                        Some(Value::Number(n)) if n.as_u64().is_some_and(|b| b >= 1) => {}
                        _ => {
                            return Err(bad(
                                "`thinking.budget_tokens` must be a positive integer when thinking is enabled",
                            ))
                        }
                    }
                    // The model thinks as long as it does: the budget is
                    // not enforced (max_tokens bounds the whole answer).
                    noted.push("thinking.budget_tokens".into());
                    true
                }
                Some("adaptive") => true,
                Some("disabled") => false,
                _ => {
                    return Err(bad(
                        "`thinking.type` must be one of enabled, adaptive, disabled",
                    ))
                }
            };
            if field(t, "display").is_some() {
                noted.push("thinking.display".into());
            }
            if on && !thinks {
                return Err(bad(
                    "`thinking` is enabled, but this model does not think (its chat template knows no <think>)",
                ));
            }
            if thinks {
                kwargs.insert("enable_thinking".into(), json!(on));
            }
        }
        Some(v) => {
            return Err(bad(format!(
                "`thinking` must be an object like {{\"type\": \"enabled\", \"budget_tokens\": N}}; got {}",
                type_name(v)
            )))
        }
    }
    if !kwargs.is_empty() {
        req.template_kwargs = Some(kwargs);
    }
    if count {
        return Ok(Parsed {
            req,
            stops: Vec::new(),
            noted,
        });
    }

    req.max_tokens = match o.get("max_tokens") {
        None | Some(Value::Null) => {
            return Err(bad(
                "`max_tokens` is required (as Anthropic's API requires it)",
            ))
        }
        Some(v) => match v.as_u64() {
            Some(x) if x >= 1 && (limits.max_tokens == 0 || x as usize <= limits.max_tokens) => {
                Some(x as usize)
            }
            Some(x) if x >= 1 => {
                return Err(bad(format!(
                    "`max_tokens` must be at most {} on this server; got {x}",
                    limits.max_tokens
                )))
            }
            _ => {
                return Err(bad(format!(
                    "`max_tokens` must be an integer of at least 1; got {v}"
                )))
            }
        },
    };
    let stops = match field(o, "stop_sequences") {
        None => Vec::new(),
        Some(Value::Array(a)) if a.len() > MAX_STOPS => {
            return Err(bad(format!(
                "at most {MAX_STOPS} `stop_sequences`; got {}",
                a.len()
            )))
        }
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| match s {
                Value::String(s) if !s.is_empty() => Ok(s.clone()),
                _ => Err(bad("`stop_sequences` must be a list of non-empty strings")),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(bad(format!(
                "`stop_sequences` must be a list of strings; got {}",
                type_name(v)
            )))
        }
    };
    req.stream = match field(o, "stream") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(bad(format!(
                "`stream` must be a boolean; got {}",
                type_name(v)
            )))
        }
    };
    // Anthropic's ranges: temperature 0..1 (default 1), top_p 0..1.
    req.temperature = number(o, "temperature", 0.0, 1.0)?.unwrap_or(1.0) as f32;
    req.top_p = match number(o, "top_p", 0.0, 1.0)? {
        Some(x) if x <= 0.0 => return Err(bad("`top_p` must be greater than 0")),
        Some(x) => x as f32,
        None => 1.0,
    };
    req.top_k = match field(o, "top_k") {
        None => 0,
        Some(v) => match v.as_u64() {
            Some(k) if k <= u64::from(u32::MAX) => k as usize,
            _ => {
                return Err(bad(format!(
                    "`top_k` must be a non-negative integer; got {v}"
                )))
            }
        },
    };
    Ok(Parsed { req, stops, noted })
}

/// An error in Anthropic's shape, counted.
fn respond(app: &App, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(r) => r,
        Err(e) => {
            Metrics::add(&app.metrics.requests_failed, 1);
            anthropic_error(&e)
        }
    }
}

/// Names the accepted fields that changed nothing (header and log line).
fn with_noted(mut r: Response, noted: &[String]) -> Response {
    crate::fields::mark_unread(&mut r, "POST /v1/messages", noted);
    r
}

/// The body's object and the model it names, loaded.
async fn read(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Map<String, Value>, Arc<Served>), ApiError> {
    let body = app.read_body(headers, body).await?;
    let (o, name) = run::blocking(move || {
        let o = object(&body)?;
        let name = model_name(&o)?.map(str::to_string);
        Ok((o, name))
    })
    .await?;
    let m = app.model(name.as_deref()).await?;
    run::check_generative(&m)?;
    Ok((o, m))
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as this model's
/// template renders the conversation (system, tools and all).
pub async fn count_tokens(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let (o, m) = read(&app, &headers, body).await?;
        let parsed = parse(&o, app.limits(&m), m.thinks(), true)?;
        let (app2, m2) = (app.clone(), m.clone());
        let req = parsed.req;
        let p =
            run::blocking(move || run::prepare(&app2, &m2, Endpoint::Chat, req, "tools")).await?;
        Ok(with_noted(
            json_response(200, json!({"input_tokens": p.ids.len()}).to_string()),
            &parsed.noted,
        ))
    }
    .await;
    respond(&app, r)
}

/// `POST /v1/messages`.
pub async fn messages(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    Metrics::add(&app.metrics.requests_chat, 1);
    let r = async {
        let (o, m) = read(&app, &headers, body).await?;
        let Parsed { req, stops, noted } = parse(&o, app.limits(&m), m.thinks(), false)?;
        let (app2, m2) = (app.clone(), m.clone());
        let mut p =
            run::blocking(move || run::prepare(&app2, &m2, Endpoint::Chat, req, "tools")).await?;
        let run = run::submit(&app, &m, &mut p)?;
        let meta = Meta {
            id: format!("msg_{:016x}{:016x}", random_u64(), random_u64()),
            model: m.name.clone(),
            prompt_tokens: p.ids.len(),
            tool_format: p.tool_format,
            tools: p.req.tools.clone(),
            stops,
        };
        let affinity = run.affinity.clone();
        let mut r = if p.req.stream {
            stream_response(app.clone(), m, run, meta)
        } else {
            whole_response(&m, run, meta).await?
        };
        run::mark(&mut r, affinity);
        Ok(with_noted(r, &noted))
    }
    .await;
    respond(&app, r)
}

struct Meta {
    id: String,
    model: String,
    prompt_tokens: usize,
    tool_format: Option<&'static CallFormat>,
    /// The request's tools: under `auto`, a reply that is one bare JSON
    /// call to one of them is a call (`tools::parse_reply`'s rule).
    tools: Option<crate::tools::ToolSpec>,
    stops: Vec<String>,
}

/// The block being written.
enum Open {
    None,
    Thinking(String),
    Text(String),
}

/// Builds the content blocks, and the stream events that build them in
/// the same order.
struct Blocks {
    content: Vec<Value>,
    open: Open,
    events: Vec<Value>,
    pinged: bool,
}

impl Blocks {
    fn new() -> Blocks {
        Blocks {
            content: Vec::new(),
            open: Open::None,
            events: Vec::new(),
            pinged: false,
        }
    }

    fn start(&mut self, block: Value) {
        self.events.push(json!({"type": "content_block_start", "index": self.content.len(), "content_block": block}));
        if !self.pinged {
            self.pinged = true;
            self.events.push(json!({"type": "ping"}));
        }
    }

    fn close(&mut self) {
        let index = self.content.len();
        let block = match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return,
            Open::Thinking(t) => json!({"type": "thinking", "thinking": t, "signature": ""}),
            Open::Text(t) => json!({"type": "text", "text": t}),
        };
        self.events
            .push(json!({"type": "content_block_stop", "index": index}));
        self.content.push(block);
    }

    fn thinking(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        if !matches!(self.open, Open::Thinking(_)) {
            self.close();
            self.start(json!({"type": "thinking", "thinking": "", "signature": ""}));
            self.open = Open::Thinking(String::new());
        }
        if let Open::Thinking(s) = &mut self.open {
            s.push_str(t);
        }
        self.events.push(json!({"type": "content_block_delta", "index": self.content.len(), "delta": {"type": "thinking_delta", "thinking": t}}));
    }

    fn text(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        if !matches!(self.open, Open::Text(_)) {
            self.close();
            self.start(json!({"type": "text", "text": ""}));
            self.open = Open::Text(String::new());
        }
        if let Open::Text(s) = &mut self.open {
            s.push_str(t);
        }
        self.events.push(json!({"type": "content_block_delta", "index": self.content.len(), "delta": {"type": "text_delta", "text": t}}));
    }

    /// A whole call as a `tool_use` block; a call whose arguments are not
    /// a JSON object (a tool's input must be one) stays text.
    fn tool_use(&mut self, c: &tools::Call) -> bool {
        let input = match serde_json::from_str::<Value>(&c.arguments) {
            Ok(v @ Value::Object(_)) => v,
            _ => return false,
        };
        self.close();
        let id = format!("toolu_{:016x}{:08x}", random_u64(), random_u64() as u32);
        let index = self.content.len();
        self.start(json!({"type": "tool_use", "id": id, "name": c.name, "input": {}}));
        self.events.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}));
        self.events
            .push(json!({"type": "content_block_stop", "index": index}));
        self.content
            .push(json!({"type": "tool_use", "id": id, "name": c.name, "input": input}));
        true
    }
}

/// Follows one run: the stop sequences matched on the answer's text, calls
/// held back and parsed at the end.
struct Follow {
    stop: StopMatcher,
    stops: Vec<String>,
    seen: String,
    matched: Option<String>,
    ts: Option<ToolStream>,
    finish: Option<Finish>,
    cancel: Vec<Arc<AtomicBool>>,
    calls: usize,
}

impl Follow {
    fn new(meta: &Meta, run: &Run) -> Follow {
        Follow {
            stop: StopMatcher::new(meta.stops.clone()),
            stops: meta.stops.clone(),
            seen: String::new(),
            matched: None,
            ts: meta
                .tool_format
                .map(|f| ToolStream::whole(f).with_tools(meta.tools.as_ref())),
            finish: None,
            cancel: run.cancels.clone(),
            calls: 0,
        }
    }

    /// False once a stop sequence has ended the answer.
    fn update(&mut self, out: &mut Blocks, u: Update) -> bool {
        match u {
            Update::Delta { split, .. } => {
                out.thinking(&split.reasoning);
                self.seen.push_str(&split.content);
                let safe = self.stop.push(&split.content);
                let text = match self.ts.as_mut() {
                    Some(ts) => ts.push(&safe),
                    None => safe,
                };
                out.text(&text);
                if self.stop.stopped {
                    // The earliest stop sequence in the text is the one that
                    // ended it (none came before, or it would have ended sooner).
                    self.matched = self
                        .stops
                        .iter()
                        .filter_map(|s| self.seen.find(s.as_str()).map(|at| (at, s)))
                        .min_by_key(|(at, _)| *at)
                        .map(|(_, s)| s.clone());
                    for c in &self.cancel {
                        c.store(true, Ordering::Relaxed);
                    }
                    return false;
                }
                true
            }
            Update::Finished { finish, .. } => {
                self.finish = Some(finish);
                true
            }
        }
    }

    /// The end: held text and calls out; the stop reason and sequence.
    fn end(&mut self, out: &mut Blocks, finish: Finish) -> (&'static str, Option<String>) {
        if !self.stop.stopped {
            let rest = self.stop.finish();
            let text = match self.ts.as_mut() {
                Some(ts) => ts.push(&rest),
                None => rest,
            };
            out.text(&text);
        }
        if let Some(ts) = self.ts.as_mut() {
            let (rest, calls) = ts.finish();
            out.text(&rest);
            for c in &calls {
                if out.tool_use(c) {
                    self.calls += 1;
                } else {
                    out.text(&c.arguments);
                }
            }
        }
        out.close();
        if let Some(s) = self.matched.take() {
            return ("stop_sequence", Some(s));
        }
        let reason = match self.finish.unwrap_or(finish) {
            Finish::Length => "max_tokens",
            _ if self.calls > 0 => "tool_use",
            _ => "end_turn",
        };
        (reason, None)
    }
}

fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "input_tokens": prompt.saturating_sub(cached),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": completion,
    })
}

async fn whole_response(m: &Served, run: Run, meta: Meta) -> Result<Response, ApiError> {
    let mut out = Blocks::new();
    let mut follow = Follow::new(&meta, &run);
    let per = drive(&m.tok, run, |u| follow.update(&mut out, u)).await?;
    let (tokens, cached, finish) = per.first().copied().unwrap_or((0, 0, Finish::Stop));
    let (reason, seq) = follow.end(&mut out, finish);
    let body = json!({
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": out.content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(meta.prompt_tokens, tokens, cached),
    });
    Ok(json_response(200, body.to_string()))
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!(
        "event: {}\ndata: {v}\n\n",
        v["type"].as_str().unwrap_or("message")
    ))
}

fn stream_response(app: Arc<App>, m: Arc<Served>, run: Run, meta: Meta) -> Response {
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    // A panic in the producer (a bug) ends the stream with an error event.
    let last = sse(&json!({"type": "error", "error": {"type": "api_error",
        "message": crate::conn::STREAM_FAILED}}));
    crate::conn::spawn_stream(tx.clone(), last, async move {
        let send = |v: Value| tx.send(sse(&v)).is_ok();
        let start = json!({"type": "message_start", "message": {
            "id": meta.id,
            "type": "message",
            "role": "assistant",
            "model": meta.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": usage(meta.prompt_tokens, 0, 0),
        }});
        if !send(start) {
            return;
        }
        let mut out = Blocks::new();
        let mut follow = Follow::new(&meta, &run);
        let tok = m.tok.clone();
        let gone = tx.clone();
        let driving = drive(&tok, run, |u| {
            let more = follow.update(&mut out, u);
            std::mem::take(&mut out.events).into_iter().all(send) && more
        });
        let result = tokio::select! {
            r = driving => r,
            _ = gone.closed() => return,
        };
        match result {
            Ok(per) => {
                let (tokens, cached, finish) = per.first().copied().unwrap_or((0, 0, Finish::Stop));
                let (reason, seq) = follow.end(&mut out, finish);
                if !out.pinged {
                    out.events.push(json!({"type": "ping"}));
                }
                for e in std::mem::take(&mut out.events) {
                    if !send(e) {
                        return;
                    }
                }
                send(json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": seq},
                    "usage": usage(meta.prompt_tokens, tokens, cached),
                }));
                send(json!({"type": "message_stop"}));
            }
            Err(e) => {
                Metrics::add(&app.metrics.requests_failed, 1);
                send(
                    json!({"type": "error", "error": {"type": anthropic_kind(e.status), "message": e.message}}),
                );
            }
        }
    });
    crate::reply::event_stream(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolChoice;

    const L: Limits = Limits {
        max_n: 1,
        max_tokens: 0,
        drafting: false,
    };

    fn p(body: &str) -> Result<Parsed, ApiError> {
        let o = object(body.as_bytes())?;
        parse(&o, L, false, false)
    }

    fn chat_of(r: &Parsed) -> &Value {
        let Prompt::Chat(m) = &r.req.prompt else {
            panic!("not a chat")
        };
        m
    }

    #[test]
    fn blocks_become_chat_turns() {
        let r = p(r#"{"model":"m","max_tokens":9,"system":[{"type":"text","text":"s1"},{"type":"text","text":"s2","cache_control":{"type":"ephemeral"}}],
            "messages":[
              {"role":"user","content":"q"},
              {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":""},{"type":"text","text":"t"},
                 {"type":"tool_use","id":"toolu_1","name":"f","input":{"a":1}},{"type":"tool_use","id":"toolu_2","name":"g","input":{}}]},
              {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"two"}]},
                 {"type":"tool_result","tool_use_id":"toolu_1","content":"one","is_error":false},{"type":"text","text":"and?"}]}
            ],"stop_sequences":["END"],"temperature":0,"top_k":5,"metadata":{"user_id":"u"}}"#)
        .unwrap();
        let m = chat_of(&r);
        let roles: Vec<&str> = m
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["role"].as_str().unwrap())
            .collect();
        assert_eq!(
            roles,
            ["system", "user", "assistant", "tool", "tool", "user"]
        );
        assert_eq!(m[0]["content"], "s1\ns2");
        assert_eq!(m[2]["content"], "t");
        assert_eq!(m[2]["tool_calls"][0]["id"], "toolu_1");
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], r#"{"a":1}"#);
        assert_eq!(
            (m[3]["name"].as_str(), m[3]["content"].as_str()),
            (Some("g"), Some("two"))
        );
        assert_eq!(
            (m[4]["name"].as_str(), m[4]["content"].as_str()),
            (Some("f"), Some("one"))
        );
        assert_eq!(m[5]["content"], "and?");
        assert_eq!(r.stops, ["END"]);
        // Matched here, not by the run: the answer must name the one that hit.
        assert!(r.req.stop.is_empty());
        assert_eq!(
            (r.req.max_tokens, r.req.temperature, r.req.top_k),
            (Some(9), 0.0, 5)
        );
        assert_eq!(r.noted, ["metadata"]);
    }

    #[test]
    fn tools_and_tool_choice_map_to_the_chat_rules() {
        let tool =
            r#"{"name":"f","description":"d","input_schema":{"type":"object","properties":{}}}"#;
        for (choice, want, parallel) in [
            (r#"{"type":"auto"}"#, ToolChoice::Auto, true),
            (
                r#"{"type":"any","disable_parallel_tool_use":true}"#,
                ToolChoice::Required,
                false,
            ),
            (
                r#"{"type":"tool","name":"f"}"#,
                ToolChoice::Named("f".into()),
                true,
            ),
            (r#"{"type":"none"}"#, ToolChoice::None, true),
        ] {
            let r = p(&format!(
                r#"{{"max_tokens":5,"messages":[{{"role":"user","content":"x"}}],"tools":[{tool}],"tool_choice":{choice}}}"#
            ))
            .unwrap();
            let t = r.req.tools.unwrap();
            assert_eq!((t.choice, t.parallel), (want, parallel), "{choice}");
            assert_eq!(t.tools[0]["function"]["parameters"]["type"], "object");
        }
        let o = object(br#"{"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}"#).unwrap();
        let r = parse(&o, L, false, true).unwrap();
        assert!(r.req.tools.is_some());
    }

    #[test]
    fn thinking_switches_a_reasoning_template() {
        let body = br#"{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budget_tokens":1024}}"#;
        let o = object(body).unwrap();
        let r = parse(&o, L, true, false).unwrap();
        assert_eq!(r.req.template_kwargs.unwrap()["enable_thinking"], true);
        assert_eq!(r.noted, ["thinking.budget_tokens"]);
        let e = parse(&o, L, false, false).err().unwrap();
        assert!(e.message.contains("<think>"), "{}", e.message);
        let o = object(br#"{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"disabled"}}"#).unwrap();
        let r = parse(&o, L, true, false).unwrap();
        assert_eq!(r.req.template_kwargs.unwrap()["enable_thinking"], false);
    }

    #[test]
    fn bad_requests_name_their_field() {
        let m = r#""messages":[{"role":"user","content":"x"}]"#;
        for (body, words) in [
            (format!(r#"{{{m}}}"#), "`max_tokens` is required"),
            (format!(r#"{{{m},"max_tokens":0}}"#), "at least 1"),
            (format!(r#"{{{m},"max_tokens":"5"}}"#), "max_tokens"),
            (format!(r#"{{{m},"max_tokens":5,"bogus":1}}"#), "unknown field `bogus`"),
            (r#"{"max_tokens":5,"messages":[]}"#.into(), "`messages` must not be empty"),
            (r#"{"max_tokens":5}"#.into(), "`messages` is required"),
            (r#"{"max_tokens":5,"messages":[{"role":"system","content":"x"}]}"#.into(), "messages[0].role \"system\""),
            (r#"{"max_tokens":5,"messages":[{"role":"user","content":5}]}"#.into(), "messages[0].content"),
            (r#"{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}"#.into(), "messages[0].content[0].source has no string `type`"),
            (r#"{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}"#.into(), "the image at messages[0].content[0].source is of type \"url\"; this server fetches and keeps nothing"),
            (r#"{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"!!"}}]}]}"#.into(), "the image at messages[0].content[0].source is not valid base64"),
            (r#"{"max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"image","source":{}}]}]}"#.into(), "images are taken in a user turn's content only"),
            (r#"{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}"#.into(), "document block"),
            (r#"{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{}}]}]}]}"#.into(), "image block"),
            (r#"{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"nope","content":"x"}]}]}"#.into(), "tool_use_id \"nope\""),
            (r#"{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]}"#.into(), "\"tool_use\", which a user turn"),
            (r#"{"max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":[1]}]}]}"#.into(), "input must be an object"),
            (r#"{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text"}]}]}"#.into(), "has no `text`"),
            (r#"{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"x","extra":1}]}]}"#.into(), "content[0].extra"),
            (format!(r#"{{{m},"max_tokens":5,"system":5}}"#), "system"),
            (format!(r#"{{{m},"max_tokens":5,"system":[{{"type":"image"}}]}}"#), "image block"),
            (format!(r#"{{{m},"max_tokens":5,"tools":[{{"type":"web_search_20250305","name":"web_search"}}]}}"#), "web_search_20250305"),
            (format!(r#"{{{m},"max_tokens":5,"tools":[{{"name":"f"}}]}}"#), "tools[0] has no `input_schema`"),
            (format!(r#"{{{m},"max_tokens":5,"tools":[{{"name":"f","input_schema":{{}}}},{{"name":"f","input_schema":{{}}}}]}}"#), "a second time"),
            (format!(r#"{{{m},"max_tokens":5,"tool_choice":{{"type":"any"}}}}"#), "needs `tools`"),
            (format!(r#"{{{m},"max_tokens":5,"tools":[{{"name":"f","input_schema":{{}}}}],"tool_choice":{{"type":"tool","name":"g"}}}}"#), "\"g\""),
            (format!(r#"{{{m},"max_tokens":5,"tools":[{{"name":"f","input_schema":{{}}}}],"tool_choice":{{"type":"sometimes"}}}}"#), "tool_choice.type"),
            (format!(r#"{{{m},"max_tokens":5,"tool_choice":"auto"}}"#), "tool_choice"),
            (format!(r#"{{{m},"max_tokens":5,"stop_sequences":"x"}}"#), "stop_sequences"),
            (format!(r#"{{{m},"max_tokens":5,"stop_sequences":[""]}}"#), "non-empty"),
            (format!(r#"{{{m},"max_tokens":5,"temperature":1.5}}"#), "`temperature` must be between 0 and 1"),
            (format!(r#"{{{m},"max_tokens":5,"top_k":-1}}"#), "top_k"),
            (format!(r#"{{{m},"max_tokens":5,"stream":1}}"#), "stream"),
            (format!(r#"{{{m},"max_tokens":5,"thinking":{{"type":"enabled"}}}}"#), "budget_tokens"),
            (format!(r#"{{{m},"max_tokens":5,"thinking":{{"type":"maybe"}}}}"#), "thinking.type"),
            (format!(r#"{{{m},"max_tokens":5,"metadata":"u"}}"#), "metadata"),
        ] {
            let e = p(&body).err().unwrap_or_else(|| panic!("{body} was accepted"));
            assert_eq!(e.status, 400, "{body}");
            assert!(e.message.contains(words), "{body}: {}", e.message);
        }
        // count_tokens reads no max_tokens nor sampling fields.
        let o = object(br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":5}"#).unwrap();
        let e = parse(&o, L, false, true).err().unwrap();
        assert!(
            e.message.contains("unknown field `max_tokens`"),
            "{}",
            e.message
        );
    }

    /// The stream's events build the blocks the whole answer holds, in
    /// Anthropic's order, with one ping after the first block starts.
    #[test]
    fn the_events_build_the_blocks_in_order() {
        let mut b = Blocks::new();
        b.thinking("hm");
        b.text("Hi");
        b.text("!");
        assert!(b.tool_use(&tools::Call {
            name: "f".into(),
            arguments: r#"{"a":1}"#.into(),
        }));
        // Arguments that are no object stay out of a tool_use block.
        assert!(!b.tool_use(&tools::Call {
            name: "f".into(),
            arguments: "[1]".into(),
        }));
        b.close();
        let kinds: Vec<String> = b
            .events
            .iter()
            .map(|e| {
                let t = e["type"].as_str().unwrap();
                match e["delta"]["type"].as_str() {
                    Some(d) => format!("{t}:{d}"),
                    None => t.to_string(),
                }
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "content_block_start",
                "ping",
                "content_block_delta:thinking_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta:text_delta",
                "content_block_delta:text_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta:input_json_delta",
                "content_block_stop",
            ]
        );
        assert_eq!(
            b.content,
            json!([
                {"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "text", "text": "Hi!"},
                {"type": "tool_use", "id": b.content[2]["id"], "name": "f", "input": {"a": 1}},
            ])
            .as_array()
            .unwrap()
            .clone()
        );
        // Each event's index is its block's.
        let idx: Vec<u64> = b
            .events
            .iter()
            .filter_map(|e| e["index"].as_u64())
            .collect();
        assert_eq!(idx, [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]);
    }
}
