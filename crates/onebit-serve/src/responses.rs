//! OpenAI's Responses API: `POST /v1/responses` (whole and SSE),
//! `GET`/`DELETE /v1/responses/{id}`. A request is parsed here straight into
//! the engine's request type (its `input` items as chat messages, checked by
//! the `/v1` rules, so every user string goes through the template's
//! plain-text spans like a chat's), run by [`crate::run`], and its output
//! shaped into Responses' output items: a `reasoning` item (the `<think>`
//! block), a `message` with one `output_text` part, `function_call` items.
//!
//! Invariants: the streamed events build, in order, exactly the output the
//! whole answer has (one builder, `Output`, makes both); every field is
//! honoured, reported as ignored in `x-onebit-ignored-fields` (those that
//! change nothing here), or refused by name with a 400 in OpenAI's error
//! shape; a response made with `store` (the default) is kept in memory
//! within [`crate::stored`]'s bounds for `previous_response_id`.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{self, type_name, ApiError, Endpoint, Limits, Prompt, Request};
use crate::app::{App, Served};
use crate::constrain::{json_options, Grammar};
use crate::engine::Finish;
use crate::fields::{model_name, object};
use crate::images;
use crate::metrics::Metrics;
use crate::reply::{json_response, random_u64, unix_now};
use crate::run::{self, drive, Run, Update};
use crate::stored::{not_kept, Stored};
use crate::tools::{self, CallFormat, ToolStream};

/// The fields a request may carry. Those in [`NOTED`] change nothing here
/// and are named in the `x-onebit-ignored-fields` header; any other is a 400.
const FIELDS: [&str; 21] = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "max_output_tokens",
    "temperature",
    "top_p",
    "previous_response_id",
    "store",
    "stream",
    "metadata",
    "reasoning",
    "truncation",
    "include",
    "background",
    "user",
    "safety_identifier",
    "prompt_cache_key",
];

/// Identifiers and hints with no effect on a local server: accepted and
/// reported. (`prompt_cache_key`: the prefix cache needs no key.)
const NOTED: [&str; 3] = ["user", "safety_identifier", "prompt_cache_key"];

fn bad(param: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(param, message)
}

/// A field, absent and null alike meaning "not given".
fn field<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

/// A request, parsed: what runs, and what the answer echoes and stores.
pub struct Parsed {
    pub req: Request,
    /// The conversation this request continues and adds to (no
    /// instructions): the previous response's, then this `input`.
    pub history: Vec<Value>,
    pub echo: Echo,
    /// Accepted fields that change nothing here.
    pub noted: Vec<String>,
    pub store: bool,
}

/// Request fields the response object repeats.
#[derive(Clone, Default)]
pub struct Echo {
    pub instructions: Value,
    pub tools: Value,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub text: Value,
    pub max_output_tokens: Value,
    pub temperature: f32,
    pub top_p: f32,
    pub metadata: Value,
    pub previous_response_id: Value,
    pub user: Value,
    pub reasoning: Value,
}

/// Checks an item's keys: each is one `allowed` (or null, as clients
/// serialise an item's unset fields), else a 400 naming `at.key`.
fn item_keys(at: &str, o: &Map<String, Value>, allowed: &[&str]) -> Result<(), ApiError> {
    match o
        .iter()
        .find(|(k, v)| !v.is_null() && !allowed.contains(&k.as_str()))
    {
        None => Ok(()),
        Some((k, _)) => Err(bad(
            "input",
            format!(
                "{at}.{k} is not supported; this item carries {}",
                allowed.join(", ")
            ),
        )),
    }
}

/// A string field of an item, required.
fn item_str<'a>(at: &str, o: &'a Map<String, Value>, key: &str) -> Result<&'a str, ApiError> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(bad("input", format!("{at} has no `{key}`"))),
        Some(v) => Err(bad(
            "input",
            format!("{at}.{key} must be a string; got {}", type_name(v)),
        )),
    }
}

/// A message's content: a string, or text parts (`input_text`, and for an
/// assistant's turn sent back `output_text`/`refusal`) joined; a user's
/// `input_image` with a `data:` URL becomes an OpenAI `image_url` part (the
/// content then a list of parts, as the history keeps it); any other part
/// (a file, audio, an image by `file_id` or remote URL) is refused by name.
fn content_text(at: &str, role: &str, v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => Ok(Value::String(s.clone())),
        Value::Array(parts) => {
            let mut texts = Vec::new();
            let mut images = 0;
            // Which of `texts` are image URLs.
            let mut is_image = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                let at = format!("{at}.content[{j}]");
                let Value::Object(p) = p else {
                    return Err(bad(
                        "input",
                        format!("{at} must be an object; got {}", type_name(p)),
                    ));
                };
                let ty = p.get("type").and_then(Value::as_str).unwrap_or("");
                let text_ok = if role == "assistant" {
                    ty == "output_text" || ty == "input_text"
                } else {
                    ty == "input_text"
                };
                if text_ok {
                    item_keys(
                        &at,
                        p,
                        &[
                            "type",
                            "text",
                            "annotations",
                            "logprobs",
                            "prompt_cache_breakpoint",
                        ],
                    )?;
                    texts.push(item_str(&at, p, "text")?.to_string());
                } else if ty == "refusal" && role == "assistant" {
                    texts.push(item_str(&at, p, "refusal")?.to_string());
                } else if ty == "input_image" && role == "user" {
                    item_keys(&at, p, &["type", "image_url", "detail", "file_id"])?;
                    if p.get("file_id").is_some_and(|f| !f.is_null()) {
                        return Err(bad(
                            "input",
                            format!("{at}.file_id: this server keeps no files; send the image as a data: URL in `image_url`"),
                        ));
                    }
                    let url = item_str(&at, p, "image_url")?;
                    // Checked here to name the part; decoded again with the messages.
                    images::from_url(url, &at, "input")?;
                    images += 1;
                    images::check_count(images, "input")?;
                    texts.push(url.to_string());
                    is_image.push(texts.len() - 1);
                } else if ty.is_empty() {
                    return Err(bad("input", format!("{at} has no `type`")));
                } else if ty.starts_with("input_") || ty.starts_with("output_") {
                    return Err(bad(
                        "input",
                        format!(
                            "{at} is of type {ty:?}; the parts taken here are {}",
                            if role == "assistant" {
                                "output_text"
                            } else if role == "user" {
                                "input_text and input_image"
                            } else {
                                "input_text"
                            }
                        ),
                    ));
                } else {
                    return Err(bad(
                        "input",
                        format!("{at} is of type {ty:?}, not a content part this server knows"),
                    ));
                }
            }
            if images == 0 {
                return Ok(Value::String(texts.join("\n")));
            }
            // Images among the texts: OpenAI's parts, for `api::messages`.
            Ok(Value::Array(
                texts
                    .into_iter()
                    .enumerate()
                    .map(|(k, t)| match is_image.contains(&k) {
                        true => json!({"type": "image_url", "image_url": {"url": t}}),
                        false => json!({"type": "text", "text": t}),
                    })
                    .collect(),
            ))
        }
        v => Err(bad(
            "input",
            format!(
                "{at}.content must be a string or a list of content parts; got {}",
                type_name(v)
            ),
        )),
    }
}

/// The name of the call `call_id` among the assistant turns of `msgs`.
fn call_name(msgs: &[Value], call_id: &str) -> Option<String> {
    msgs.iter().rev().find_map(|m| {
        m.get("tool_calls")?.as_array()?.iter().find_map(|c| {
            (c["id"] == call_id).then(|| c["function"]["name"].as_str().map(str::to_string))?
        })
    })
}

/// `input` (a string, or a list of items) appended to `out` as chat
/// messages; `before` is the conversation it continues (for the names of
/// calls whose outputs it carries).
fn input_messages(v: &Value, before: &[Value], out: &mut Vec<Value>) -> Result<(), ApiError> {
    let items = match v {
        Value::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(a) => a,
        v => {
            return Err(bad(
                "input",
                format!(
                    "`input` must be a string or a list of items; got {}",
                    type_name(v)
                ),
            ))
        }
    };
    for (i, it) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Value::Object(o) = it else {
            return Err(bad(
                "input",
                format!("{at} must be an object; got {}", type_name(it)),
            ));
        };
        let ty = match o.get("type") {
            None | Some(Value::Null) if o.contains_key("role") => "message",
            Some(Value::String(t)) => t.as_str(),
            None | Some(Value::Null) => {
                return Err(bad("input", format!("{at} has no `type` (nor a `role`)")))
            }
            Some(v) => {
                return Err(bad(
                    "input",
                    format!("{at}.type must be a string; got {}", type_name(v)),
                ))
            }
        };
        match ty {
            "message" => {
                item_keys(&at, o, &["type", "role", "content", "id", "status", "phase"])?;
                let role = item_str(&at, o, "role")?;
                if !["user", "assistant", "system", "developer"].contains(&role) {
                    return Err(bad(
                        "input",
                        format!("{at}.role {role:?} is not one of user, assistant, system, developer"),
                    ));
                }
                let content = match o.get("content") {
                    None | Some(Value::Null) => {
                        return Err(bad("input", format!("{at} has no `content`")))
                    }
                    Some(c) => content_text(&at, role, c)?,
                };
                out.push(json!({"role": role, "content": content}));
            }
            "function_call" => {
                item_keys(
                    &at,
                    o,
                    &["type", "id", "call_id", "name", "arguments", "status"],
                )?;
                let call = json!({
                    "id": item_str(&at, o, "call_id")?,
                    "type": "function",
                    "function": {"name": item_str(&at, o, "name")?, "arguments": item_str(&at, o, "arguments")?},
                });
                // Calls after an assistant turn (its text, or calls before
                // them) belong to that turn.
                match out.last_mut() {
                    Some(m) if m["role"] == "assistant" => {
                        if !m["tool_calls"].is_array() {
                            m["tool_calls"] = json!([]);
                        }
                        if let Some(a) = m["tool_calls"].as_array_mut() {
                            a.push(call);
                        }
                    }
                    _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                item_keys(&at, o, &["type", "id", "call_id", "output", "status"])?;
                let id = item_str(&at, o, "call_id")?;
                let content = match o.get("output") {
                    None | Some(Value::Null) => {
                        return Err(bad("input", format!("{at} has no `output`")))
                    }
                    Some(c) => content_text(&format!("{at}.output"), "tool", c)?,
                };
                let mut msg = json!({"role": "tool", "tool_call_id": id, "content": content});
                let name = call_name(out, id).or_else(|| call_name(before, id));
                match name {
                    Some(n) => msg["name"] = json!(n),
                    None => {
                        return Err(bad(
                            "input",
                            format!("{at}.call_id {id:?} names no function_call earlier in the conversation"),
                        ))
                    }
                }
                out.push(msg);
            }
            // A reasoning item sent back: the model's earlier thoughts are
            // not part of the next prompt (as with chat completions).
            "reasoning" => {
                item_keys(
                    &at,
                    o,
                    &["type", "id", "summary", "content", "encrypted_content", "status"],
                )?;
            }
            other => {
                return Err(bad(
                    "input",
                    format!("{at} is of type {other:?}; this server takes message, function_call, function_call_output and reasoning items"),
                ))
            }
        }
    }
    Ok(())
}

/// `tools` in Responses' flat shape (`{"type": "function", "name", ...}`),
/// `tool_choice` and `parallel_tool_calls`, checked by the chat rules.
fn tool_spec(o: &Map<String, Value>) -> Result<Option<tools::ToolSpec>, ApiError> {
    let mut chat = Map::new();
    match field(o, "tools") {
        None => {}
        Some(Value::Array(list)) => {
            let mut converted = Vec::new();
            for (i, t) in list.iter().enumerate() {
                let at = format!("tools[{i}]");
                let Value::Object(t) = t else {
                    return Err(bad(
                        "tools",
                        format!("{at} must be an object; got {}", type_name(t)),
                    ));
                };
                match t.get("type").and_then(Value::as_str) {
                    Some("function") => {}
                    Some(other) => {
                        return Err(bad(
                            "tools",
                            format!("{at} is of type {other:?}; only function tools are served"),
                        ))
                    }
                    None => return Err(bad("tools", format!("{at} has no string `type`"))),
                }
                if let Some((k, _)) = t.iter().find(|(k, v)| {
                    !v.is_null()
                        && !["type", "name", "description", "parameters", "strict"]
                            .contains(&k.as_str())
                }) {
                    return Err(bad(
                        "tools",
                        format!("{at}.{k} is not supported; a function tool carries type, name, description, parameters, strict"),
                    ));
                }
                let mut f = Map::new();
                for k in ["name", "description", "parameters", "strict"] {
                    if let Some(v) = field(t, k) {
                        f.insert(k.into(), v.clone());
                    }
                }
                converted.push(json!({"type": "function", "function": f}));
            }
            chat.insert("tools".into(), Value::Array(converted));
        }
        Some(v) => {
            return Err(bad(
                "tools",
                format!("`tools` must be an array; got {}", type_name(v)),
            ))
        }
    }
    match field(o, "tool_choice") {
        None => {}
        Some(s @ Value::String(_)) => {
            chat.insert("tool_choice".into(), s.clone());
        }
        Some(Value::Object(c)) if c.get("type").and_then(Value::as_str) == Some("function") => {
            let Some(name) = c.get("name").and_then(Value::as_str) else {
                return Err(bad(
                    "tool_choice",
                    "`tool_choice` of type function needs a string `name`",
                ));
            };
            chat.insert(
                "tool_choice".into(),
                json!({"type": "function", "function": {"name": name}}),
            );
        }
        Some(v) => {
            return Err(bad(
                "tool_choice",
                format!("`tool_choice` must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"name\": ..}}; got {v}"),
            ))
        }
    }
    if let Some(p) = o.get("parallel_tool_calls") {
        chat.insert("parallel_tool_calls".into(), p.clone());
    }
    api::tool_spec(&chat)
}

/// `text`: `format` (text, json_object, json_schema: constrained decoding
/// as chat's `response_format`) and `verbosity` (only its default).
fn text_format(o: &Map<String, Value>) -> Result<Option<Grammar>, ApiError> {
    const P: &str = "text";
    let t = match field(o, "text") {
        None => return Ok(None),
        Some(Value::Object(t)) => t,
        Some(v) => {
            return Err(bad(
                P,
                format!("`text` must be an object; got {}", type_name(v)),
            ))
        }
    };
    if let Some((k, _)) = t
        .iter()
        .find(|(k, v)| !v.is_null() && !["format", "verbosity"].contains(&k.as_str()))
    {
        return Err(bad(
            P,
            format!("`text.{k}` is not supported; `text` carries format and verbosity"),
        ));
    }
    if let Some(v) = field(t, "verbosity") {
        if v != "medium" {
            return Err(bad(
                P,
                format!("`text.verbosity` {v} is not supported: the model's answer length is its own (only \"medium\", the default)"),
            ));
        }
    }
    let f = match field(t, "format") {
        None => return Ok(None),
        Some(Value::Object(f)) => f,
        Some(v) => {
            return Err(bad(
                "text.format",
                format!("`text.format` must be an object; got {}", type_name(v)),
            ))
        }
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::JsonSchema(json!({"type": "object"})))),
        Some("json_schema") => {
            if let Some((k, _)) = f.iter().find(|(k, v)| {
                !v.is_null()
                    && !["type", "name", "schema", "strict", "description"].contains(&k.as_str())
            }) {
                return Err(bad(
                    "text.format",
                    format!("`text.format.{k}` is not supported; a json_schema format carries type, name, schema, strict, description"),
                ));
            }
            match f.get("name") {
                Some(Value::String(_)) => {}
                _ => {
                    return Err(bad(
                        "text.format",
                        "`text.format` of type json_schema needs a string `name`",
                    ))
                }
            }
            let mut schema = match f.get("schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                None | Some(Value::Null) => {
                    return Err(bad(
                        "text.format",
                        "`text.format` of type json_schema needs a `schema` object",
                    ))
                }
                Some(v) => {
                    return Err(bad(
                        "text.format",
                        format!(
                            "`text.format.schema` must be a JSON schema object; got {}",
                            type_name(v)
                        ),
                    ))
                }
            };
            let strict = match f.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(bad(
                        "text.format",
                        format!(
                            "`text.format.strict` must be a boolean; got {}",
                            type_name(v)
                        ),
                    ))
                }
            };
            // Not strict: keywords the library does not know are ignored
            // rather than refused (as chat's response_format).
            if let Value::Object(s) = &mut schema {
                if !s.contains_key("x-guidance") {
                    let mut opts = json_options();
                    opts["lenient"] = json!(!strict);
                    s.insert("x-guidance".into(), opts);
                }
            }
            Ok(Some(Grammar::JsonSchema(schema)))
        }
        Some(other) => Err(bad(
            "text.format",
            format!("`text.format.type` {other:?} is not one of text, json_object, json_schema"),
        )),
        None => Err(bad("text.format", "`text.format` has no string `type`")),
    }
}

fn number(
    o: &Map<String, Value>,
    name: &'static str,
    lo: f64,
    hi: f64,
) -> Result<Option<f64>, ApiError> {
    match field(o, name) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if !(lo..=hi).contains(&x) {
                return Err(bad(
                    name,
                    format!("`{name}` must be between {lo} and {hi}; got {x}"),
                ));
            }
            Ok(Some(x))
        }
        Some(v) => Err(bad(
            name,
            format!("`{name}` must be a number; got {}", type_name(v)),
        )),
    }
}

fn boolean(o: &Map<String, Value>, name: &'static str) -> Result<Option<bool>, ApiError> {
    match field(o, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(bad(
            name,
            format!("`{name}` must be a boolean; got {}", type_name(v)),
        )),
    }
}

/// Parses a request body's object. `previous` looks a kept response up;
/// `thinks`: the model's template knows `<think>` (for `reasoning.effort`).
pub fn parse(
    o: &Map<String, Value>,
    limits: Limits,
    previous: impl Fn(&str) -> Option<Arc<Stored>>,
    thinks: bool,
) -> Result<Parsed, ApiError> {
    parse_for(o, limits, previous, thinks, false)
}

/// [`parse`] for a model that may declare harmony: then `reasoning.effort`
/// is the template's `reasoning_effort` (low, medium, high).
pub fn parse_for(
    o: &Map<String, Value>,
    limits: Limits,
    previous: impl Fn(&str) -> Option<Arc<Stored>>,
    thinks: bool,
    harmony: bool,
) -> Result<Parsed, ApiError> {
    if let Some(k) = o.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            None,
            format!(
                "unknown field `{k}`: /v1/responses reads only {}",
                FIELDS.join(", ")
            ),
        ));
    }
    let noted: Vec<String> = NOTED
        .iter()
        .filter(|k| field(o, k).is_some())
        .map(|k| k.to_string())
        .collect();
    for k in NOTED {
        if let Some(v) = field(o, k) {
            if !v.is_string() {
                return Err(ApiError::invalid(
                    None,
                    format!("`{k}` must be a string; got {}", type_name(v)),
                ));
            }
        }
    }
    let mut noted = noted;

    let previous_id = match field(o, "previous_response_id") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            return Err(bad(
                "previous_response_id",
                format!(
                    "`previous_response_id` must be a string; got {}",
                    type_name(v)
                ),
            ))
        }
    };
    let mut history: Vec<Value> = match &previous_id {
        None => Vec::new(),
        Some(id) => match previous(id) {
            Some(s) => s.history.as_array().cloned().unwrap_or_default(),
            None => {
                return Err(bad("previous_response_id", not_kept(id))
                    .status(404)
                    .with_code("previous_response_not_found"))
            }
        },
    };
    let before = history.clone();
    let mut added = Vec::new();
    match field(o, "input") {
        None => return Err(bad("input", "`input` is required")),
        Some(v) => input_messages(v, &before, &mut added)?,
    }
    if added.is_empty() {
        return Err(bad("input", "`input` has no message or item"));
    }
    history.extend(added);

    let instructions = match field(o, "instructions") {
        None => Value::Null,
        Some(s @ Value::String(_)) => s.clone(),
        Some(v) => {
            return Err(bad(
                "instructions",
                format!("`instructions` must be a string; got {}", type_name(v)),
            ))
        }
    };
    let mut msgs = Vec::with_capacity(history.len() + 1);
    if let Value::String(s) = &instructions {
        msgs.push(json!({"role": "system", "content": s}));
    }
    msgs.extend(history.iter().cloned());
    let mut one = Map::new();
    one.insert("messages".into(), Value::Array(msgs));
    let (prompt, found) = api::messages(&one).map_err(|e| ApiError {
        param: Some("input".into()),
        ..e
    })?;

    let max_tokens = match field(o, "max_output_tokens") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(x) if x >= 1 && (limits.max_tokens == 0 || x as usize <= limits.max_tokens) => {
                Some(x as usize)
            }
            Some(x) if x >= 1 => {
                return Err(bad(
                    "max_output_tokens",
                    format!(
                        "`max_output_tokens` must be at most {} on this server; got {x}",
                        limits.max_tokens
                    ),
                ))
            }
            _ => {
                return Err(bad(
                    "max_output_tokens",
                    format!("`max_output_tokens` must be an integer of at least 1; got {v}"),
                ))
            }
        },
    };
    let temperature = number(o, "temperature", 0.0, 2.0)?.unwrap_or(1.0) as f32;
    let top_p = number(o, "top_p", 0.0, 1.0)?.unwrap_or(1.0) as f32;
    if top_p <= 0.0 {
        return Err(bad("top_p", "`top_p` must be greater than 0"));
    }
    let stream = boolean(o, "stream")?.unwrap_or(false);
    let store = boolean(o, "store")?.unwrap_or(true);
    if boolean(o, "background")? == Some(true) {
        return Err(bad(
            "background",
            "`background` true is not supported: a response runs while its request is open",
        ));
    }
    match field(o, "truncation") {
        None => {}
        Some(v) if v == "disabled" => {}
        Some(v) => {
            return Err(bad(
                "truncation",
                format!("`truncation` {v} is not supported: a conversation longer than the context is refused (only \"disabled\")"),
            ))
        }
    }
    match field(o, "include") {
        None => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(v) => {
            return Err(bad(
                "include",
                format!("`include` {v} is not supported: nothing extra can be included"),
            ))
        }
    }
    let metadata = match field(o, "metadata") {
        None => json!({}),
        Some(Value::Object(m)) if m.values().all(Value::is_string) => Value::Object(m.clone()),
        Some(v) => {
            return Err(bad(
                "metadata",
                format!("`metadata` must be an object of strings; got {v}"),
            ))
        }
    };
    let mut template_kwargs = None;
    let reasoning = match field(o, "reasoning") {
        None => json!({"effort": null, "summary": null}),
        Some(Value::Object(r)) => {
            if let Some((k, _)) = r.iter().find(|(k, v)| {
                !v.is_null() && !["effort", "summary", "generate_summary"].contains(&k.as_str())
            }) {
                return Err(bad(
                    "reasoning",
                    format!(
                        "`reasoning.{k}` is not supported; `reasoning` carries effort and summary"
                    ),
                ));
            }
            match field(r, "effort") {
                None => {}
                Some(v) if harmony => {
                    let e = crate::harmony::effort(v).map_err(|why| bad("reasoning", why))?;
                    let mut kw = Map::new();
                    kw.insert("reasoning_effort".into(), Value::String(e));
                    template_kwargs = Some(kw);
                }
                Some(Value::String(e)) if thinks => {
                    // The template's switch: off for "none", on otherwise.
                    let mut kw = Map::new();
                    kw.insert("enable_thinking".into(), json!(e != "none"));
                    template_kwargs = Some(kw);
                    if e != "none" {
                        noted.push("reasoning.effort".into());
                    }
                }
                Some(v) => {
                    return Err(bad(
                        "reasoning",
                        if thinks {
                            format!("`reasoning.effort` must be a string; got {v}")
                        } else {
                            format!("`reasoning.effort` {v} needs a model that reasons; this model's chat template knows no <think>")
                        },
                    ))
                }
            }
            for k in ["summary", "generate_summary"] {
                if field(r, k).is_some() {
                    noted.push(format!("reasoning.{k}"));
                }
            }
            Value::Object(r.clone())
        }
        Some(v) => {
            return Err(bad(
                "reasoning",
                format!("`reasoning` must be an object; got {}", type_name(v)),
            ))
        }
    };

    let tools = tool_spec(o)?;
    let grammar = text_format(o)?;
    if grammar.is_some() && tools.as_ref().is_some_and(tools::ToolSpec::forced) {
        return Err(bad(
            "tool_choice",
            "`tool_choice` required or named constrains the output to a call; it cannot be combined with `text.format` json_schema or json_object",
        ));
    }
    let echo = Echo {
        instructions,
        tools: field(o, "tools").cloned().unwrap_or_else(|| json!([])),
        tool_choice: field(o, "tool_choice")
            .cloned()
            .unwrap_or_else(|| json!("auto")),
        parallel_tool_calls: tools.as_ref().is_none_or(|t| t.parallel),
        text: match field(o, "text") {
            Some(t) if t.get("format").is_some_and(|f| !f.is_null()) => t.clone(),
            _ => json!({"format": {"type": "text"}}),
        },
        max_output_tokens: max_tokens.map_or(Value::Null, |x| json!(x)),
        temperature,
        top_p,
        metadata,
        previous_response_id: previous_id.map_or(Value::Null, Value::String),
        user: field(o, "user").cloned().unwrap_or(Value::Null),
        reasoning,
    };
    let mut req = Request::new(Prompt::Chat(prompt));
    req.images = found;
    req.max_tokens = max_tokens;
    req.temperature = temperature;
    req.top_p = top_p;
    req.stream = stream;
    req.tools = tools;
    req.grammar = grammar;
    req.template_kwargs = template_kwargs;
    Ok(Parsed {
        req,
        history,
        echo,
        noted,
        store,
    })
}

/// An error in OpenAI's shape, counted.
fn respond(app: &App, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(r) => r,
        Err(e) => {
            Metrics::add(&app.metrics.requests_failed, 1);
            e.into_response()
        }
    }
}

/// `POST /v1/responses`.
pub async fn create(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    Metrics::add(&app.metrics.requests_chat, 1);
    let r = create_inner(app.clone(), &headers, body).await;
    respond(&app, r)
}

async fn create_inner(
    app: Arc<App>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = app.read_body(headers, body).await?;
    let (o, name) = run::blocking(move || {
        let o = object(&body)?;
        let name = model_name(&o)?.map(str::to_string);
        Ok((o, name))
    })
    .await?;
    let m = app.model(name.as_deref()).await?;
    run::check_generative(&m)?;
    let parsed = parse_for(
        &o,
        app.limits(&m),
        |id| app.responses.get(id),
        m.thinks(),
        m.harmony(),
    )?;
    let Parsed {
        req,
        history,
        echo,
        noted,
        store,
    } = parsed;
    let (app2, m2) = (app.clone(), m.clone());
    let mut p = run::blocking(move || run::prepare(&app2, &m2, Endpoint::Chat, req, "text.format"))
        .await
        .map_err(|e| match e.param.as_deref() {
            // The prompt is the `input` here.
            Some("messages") => ApiError {
                param: Some("input".into()),
                ..e
            },
            _ => e,
        })?;
    let run = run::submit(&app, &m, &mut p)?;
    let meta = Meta {
        id: format!("resp_{:016x}{:016x}", random_u64(), random_u64()),
        created: unix_now(),
        model: m.name.clone(),
        echo,
        prompt_tokens: p.ids.len(),
        tool_format: p.tool_format,
        tools: p.req.tools.clone(),
        history,
        store,
    };
    let affinity = run.affinity.clone();
    let mut r = if p.req.stream {
        stream_response(app, m, run, meta)
    } else {
        whole_response(&app, &m, run, meta).await?
    };
    crate::fields::mark_unread(&mut r, "POST /v1/responses", &noted);
    run::mark(&mut r, affinity);
    Ok(r)
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    echo: Echo,
    prompt_tokens: usize,
    tool_format: Option<&'static CallFormat>,
    /// The request's tools: under `auto`, a reply that is one bare JSON
    /// call to one of them is a call (`tools::parse_reply`'s rule).
    tools: Option<crate::tools::ToolSpec>,
    history: Vec<Value>,
    store: bool,
}

impl Meta {
    /// The response object with `status`, `output` and `usage`.
    fn response(
        &self,
        status: &str,
        output: &[Value],
        usage: Value,
        finish: Option<Finish>,
    ) -> Value {
        let e = &self.echo;
        let incomplete = match (status, finish) {
            ("incomplete", Some(Finish::Length)) => json!({"reason": "max_output_tokens"}),
            ("incomplete", _) => json!({"reason": null}),
            _ => Value::Null,
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "completed_at": if status == "in_progress" { Value::Null } else { json!(unix_now()) },
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": e.previous_response_id,
            "reasoning": e.reasoning,
            "store": self.store,
            "temperature": e.temperature,
            "text": e.text,
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": e.user,
            "metadata": e.metadata,
        })
    }

    /// Keeps the finished response and its conversation, when `store`.
    fn keep(&self, app: &App, response: &Value, out: &Output) {
        if !self.store {
            return;
        }
        let mut history = self.history.clone();
        history.push(out.turn());
        app.responses.put(
            self.id.clone(),
            Stored {
                history: Value::Array(history),
                response: response.clone(),
            },
        );
    }
}

fn usage(prompt: usize, (completion, cached, _): (usize, usize, Finish)) -> Value {
    json!({
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    })
}

/// The item being written.
enum Open {
    None,
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
}

/// Builds the output items, and the stream events that build them in the
/// same order: every piece goes through here, whole answer or streamed.
struct Output {
    items: Vec<Value>,
    open: Open,
    events: Vec<Value>,
    /// The answer's text and calls (for the stored conversation).
    text: String,
    calls: Vec<tools::Call>,
    call_ids: Vec<String>,
}

impl Output {
    fn new() -> Output {
        Output {
            items: Vec::new(),
            open: Open::None,
            events: Vec::new(),
            text: String::new(),
            calls: Vec::new(),
            call_ids: Vec::new(),
        }
    }

    fn event(&mut self, ty: &str, mut v: Value) {
        v["type"] = json!(ty);
        self.events.push(v);
    }

    /// Closes the open item with `status`.
    fn close(&mut self, status: &str) {
        let index = self.items.len();
        match std::mem::replace(&mut self.open, Open::None) {
            Open::None => {}
            Open::Reasoning { id, text } => {
                let part = json!({"type": "reasoning_text", "text": text});
                self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                );
                let item = json!({"id": id, "type": "reasoning", "summary": [], "content": [part], "status": status});
                self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                self.items.push(item);
            }
            Open::Message { id, text } => {
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                );
                let item = json!({"id": id, "type": "message", "role": "assistant", "status": status, "content": [part]});
                self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                self.items.push(item);
            }
        }
    }

    fn reasoning(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        let index = self.items.len();
        if !matches!(self.open, Open::Reasoning { .. }) {
            self.close("completed");
            let id = format!("rs_{:016x}", random_u64());
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": {"id": id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}}),
            );
            self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": {"type": "reasoning_text", "text": ""}}),
            );
            self.open = Open::Reasoning {
                id,
                text: String::new(),
            };
        }
        let Open::Reasoning { id, text } = &mut self.open else {
            return;
        };
        text.push_str(t);
        let id = id.clone();
        self.event(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t}),
        );
    }

    fn text(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        self.text.push_str(t);
        self.message_delta(t);
    }

    fn message_delta(&mut self, t: &str) {
        if !matches!(self.open, Open::Message { .. }) {
            self.close("completed");
            let index = self.items.len();
            let id = format!("msg_{:016x}", random_u64());
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": {"id": id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}}),
            );
            self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
            );
            self.open = Open::Message {
                id,
                text: String::new(),
            };
        }
        let index = self.items.len();
        let Open::Message { id, text } = &mut self.open else {
            return;
        };
        if t.is_empty() {
            return;
        }
        text.push_str(t);
        let id = id.clone();
        self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []}),
        );
    }

    /// A whole call: its item added, its arguments in one delta, done.
    fn call(&mut self, c: tools::Call) {
        self.close("completed");
        let index = self.items.len();
        let id = format!("fc_{:016x}", random_u64());
        let call_id = format!("call_{:016x}", random_u64());
        let mut item = json!({"id": id, "type": "function_call", "call_id": call_id, "name": c.name, "arguments": "", "status": "in_progress"});
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": c.arguments}),
        );
        self.event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": c.name, "arguments": c.arguments}),
        );
        item["arguments"] = json!(c.arguments);
        item["status"] = json!("completed");
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.items.push(item);
        self.call_ids.push(call_id);
        self.calls.push(c);
    }

    /// The end: the open item closed with `status`; an answer with no item
    /// at all gets an empty message.
    fn end(&mut self, status: &str) {
        if self.items.is_empty() && matches!(self.open, Open::None) {
            self.message_delta("");
        }
        self.close(status);
    }

    /// This answer as a chat turn, for the conversation kept.
    fn turn(&self) -> Value {
        let mut m = json!({"role": "assistant", "content": self.text});
        if !self.calls.is_empty() {
            if self.text.is_empty() {
                m["content"] = Value::Null;
            }
            m["tool_calls"] = self
                .calls
                .iter()
                .zip(&self.call_ids)
                .map(|(c, id)| json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                .collect();
        }
        m
    }
}

/// Follows one run into `out`: `emit` gets the events after each update.
struct Follow {
    ts: Option<ToolStream>,
    finish: Option<Finish>,
}

impl Follow {
    fn new(f: Option<&'static CallFormat>, tools: Option<&crate::tools::ToolSpec>) -> Follow {
        Follow {
            ts: f.map(|f| ToolStream::whole(f).with_tools(tools)),
            finish: None,
        }
    }

    fn update(&mut self, out: &mut Output, u: Update) {
        match u {
            Update::Delta { split, .. } => {
                out.reasoning(&split.reasoning);
                let text = match self.ts.as_mut() {
                    Some(ts) => ts.push(&split.content),
                    None => split.content,
                };
                out.text(&text);
            }
            Update::Finished { finish, .. } => self.finish = Some(finish),
        }
    }

    /// The end of the run: held text and calls out, the last item closed;
    /// the response's status.
    fn end(&mut self, out: &mut Output, finish: Finish) -> &'static str {
        if let Some(ts) = self.ts.as_mut() {
            let (rest, calls) = ts.finish();
            out.text(&rest);
            for c in calls {
                out.call(c);
            }
        }
        let status = match self.finish.unwrap_or(finish) {
            Finish::Stop => "completed",
            Finish::Length | Finish::Constraint => "incomplete",
        };
        out.end(status);
        status
    }
}

async fn whole_response(app: &App, m: &Served, run: Run, meta: Meta) -> Result<Response, ApiError> {
    let mut out = Output::new();
    let mut follow = Follow::new(meta.tool_format, meta.tools.as_ref());
    let per = drive(&m.tok, run, |u| {
        follow.update(&mut out, u);
        true
    })
    .await?;
    let first = per.first().copied().unwrap_or((0, 0, Finish::Stop));
    let status = follow.end(&mut out, first.2);
    let body = meta.response(
        status,
        &out.items,
        usage(meta.prompt_tokens, first),
        follow.finish.or(Some(first.2)),
    );
    meta.keep(app, &body, &out);
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
    let last = sse(&json!({"type": "error", "code": "server_error",
        "message": crate::conn::STREAM_FAILED, "param": null}));
    crate::conn::spawn_stream(tx.clone(), last, async move {
        let mut seq = 0u64;
        let mut send = |mut v: Value| {
            v["sequence_number"] = json!(seq);
            seq += 1;
            tx.send(sse(&v)).is_ok()
        };
        let created = meta.response("in_progress", &[], Value::Null, None);
        if !send(json!({"type": "response.created", "response": created}))
            || !send(json!({"type": "response.in_progress", "response": created}))
        {
            return;
        }
        let mut out = Output::new();
        let mut follow = Follow::new(meta.tool_format, meta.tools.as_ref());
        let tok = m.tok.clone();
        let gone = tx.clone();
        let driving = drive(&tok, run, |u| {
            follow.update(&mut out, u);
            std::mem::take(&mut out.events).into_iter().all(&mut send)
        });
        let result = tokio::select! {
            r = driving => r,
            _ = gone.closed() => return,
        };
        match result {
            Ok(per) => {
                let first = per.first().copied().unwrap_or((0, 0, Finish::Stop));
                let status = follow.end(&mut out, first.2);
                for e in std::mem::take(&mut out.events) {
                    if !send(e) {
                        return;
                    }
                }
                let body = meta.response(
                    status,
                    &out.items,
                    usage(meta.prompt_tokens, first),
                    follow.finish.or(Some(first.2)),
                );
                meta.keep(&app, &body, &out);
                let ty = if status == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                send(json!({"type": ty, "response": body}));
            }
            Err(e) => {
                Metrics::add(&app.metrics.requests_failed, 1);
                send(
                    json!({"type": "error", "code": e.code, "message": e.message, "param": e.param}),
                );
            }
        }
    });
    crate::reply::event_stream(rx)
}

fn not_found(id: &str) -> ApiError {
    ApiError::invalid("response_id", not_kept(id))
        .status(404)
        .with_code("response_not_found")
}

/// `GET /v1/responses/{id}`: a kept response as it was answered.
pub async fn get(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.responses.get(&id) {
        Some(s) => json_response(200, s.response.to_string()),
        None => respond(&app, Err(not_found(&id))),
    }
}

/// `DELETE /v1/responses/{id}`: forgets a kept response.
pub async fn delete(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if app.responses.delete(&id) {
        json_response(
            200,
            json!({"id": id, "object": "response.deleted", "deleted": true}).to_string(),
        )
    } else {
        respond(&app, Err(not_found(&id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        max_n: 1,
        max_tokens: 0,
        drafting: false,
    };

    fn p(body: &str) -> Result<Parsed, ApiError> {
        let o = object(body.as_bytes())?;
        parse(&o, L, |_| None, false)
    }

    fn chat_of(r: &Parsed) -> &Value {
        let Prompt::Chat(m) = &r.req.prompt else {
            panic!("not a chat")
        };
        m
    }

    /// Under `auto`, a reply that is one bare JSON call to a declared tool
    /// with valid arguments is a `function_call` item, as on chat
    /// completions (`tools::parse_reply`'s rule); without the tools it stays
    /// the message's text.
    #[test]
    fn a_bare_json_call_under_auto_is_a_function_call() {
        let spec = tools::ToolSpec {
            tools: vec![serde_json::json!({"type": "function", "function": {
                "name": "get_weather",
                "parameters": {"type": "object",
                    "properties": {"city": {"type": "string"}}, "required": ["city"]}}})],
            choice: crate::tools::ToolChoice::Auto,
            parallel: true,
        };
        let reply = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let run = |spec: Option<&tools::ToolSpec>| {
            let mut out = Output::new();
            let mut f = Follow::new(Some(&tools::HERMES), spec);
            f.update(
                &mut out,
                Update::Delta {
                    index: 0,
                    split: crate::text::Split {
                        reasoning: String::new(),
                        content: reply.into(),
                    },
                    logprobs: Vec::new(),
                },
            );
            f.end(&mut out, Finish::Stop);
            (out.text.clone(), out.calls.clone())
        };
        let (text, calls) = run(Some(&spec));
        assert_eq!(text, "");
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(calls[0].name, "get_weather");
        let (text, calls) = run(None);
        assert_eq!((text.as_str(), calls.len()), (reply, 0));
    }

    #[test]
    fn items_become_chat_turns() {
        let r = p(r#"{"instructions":"Be brief.","input":[
            {"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
            {"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"c","annotations":[]}]},
            {"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{\"x\":1}","status":"completed"},
            {"type":"function_call","call_id":"call_2","name":"g","arguments":"{}"},
            {"type":"function_call_output","call_id":"call_2","output":"two"},
            {"type":"function_call_output","call_id":"call_1","output":[{"type":"input_text","text":"one"}]},
            {"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"hm"}]},
            {"role":"developer","content":"d"}
        ],"max_output_tokens":7,"temperature":0.5,"top_p":0.9}"#)
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
            ["system", "user", "assistant", "tool", "tool", "system"]
        );
        assert_eq!(m[0]["content"], "Be brief.");
        assert_eq!(m[1]["content"], "a\nb");
        // The calls joined the assistant's turn, in order, ids as call_id.
        assert_eq!(m[2]["content"], "c");
        assert_eq!(m[2]["tool_calls"][0]["id"], "call_1");
        assert_eq!(m[2]["tool_calls"][1]["function"]["name"], "g");
        // Each output names its call's function.
        assert_eq!(
            (m[3]["name"].as_str(), m[3]["content"].as_str()),
            (Some("g"), Some("two"))
        );
        assert_eq!(
            (m[4]["name"].as_str(), m[4]["content"].as_str()),
            (Some("f"), Some("one"))
        );
        assert_eq!(r.req.max_tokens, Some(7));
        assert_eq!((r.req.temperature, r.req.top_p), (0.5, 0.9));
        // The history kept for a following response has no instructions.
        assert_eq!(r.history.len(), 5);
        assert!(r.store && !r.req.stream);
        // A plain string is one user turn.
        let r = p(r#"{"input":"hi"}"#).unwrap();
        assert_eq!(chat_of(&r), &json!([{"role": "user", "content": "hi"}]));
    }

    #[test]
    fn previous_response_id_continues_a_kept_conversation_and_names_a_missing_one() {
        let kept = Arc::new(Stored {
            history: json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
            response: json!({}),
        });
        let o = object(br#"{"previous_response_id":"resp_a","input":[{"type":"function_call_output","call_id":"call_9","output":"r"}]}"#).unwrap();
        let r = parse(&o, L, |id| (id == "resp_a").then(|| kept.clone()), false).unwrap();
        let m = chat_of(&r);
        assert_eq!(m.as_array().unwrap().len(), 3);
        assert_eq!(
            (m[2]["role"].as_str(), m[2]["name"].as_str()),
            (Some("tool"), Some("f"))
        );
        let o = object(br#"{"previous_response_id":"resp_b","input":"x"}"#).unwrap();
        let e = parse(&o, L, |_| None, false).err().unwrap();
        assert_eq!(
            (e.status, e.param.as_deref()),
            (404, Some("previous_response_id"))
        );
        assert!(e.message.contains("resp_b"), "{}", e.message);
    }

    #[test]
    fn tools_text_format_and_reasoning_parse() {
        let r = p(r#"{"input":"x","tools":[{"type":"function","name":"f","description":"d","parameters":{"type":"object"},"strict":true}],
            "tool_choice":{"type":"function","name":"f"},"parallel_tool_calls":false}"#)
        .unwrap();
        let t = r.req.tools.unwrap();
        assert_eq!(t.choice, tools::ToolChoice::Named("f".into()));
        assert!(!t.parallel);
        assert_eq!(
            t.tools[0]["function"]["parameters"],
            json!({"type": "object"})
        );
        let r = p(r#"{"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"},"strict":true}}}"#).unwrap();
        let Some(Grammar::JsonSchema(s)) = r.req.grammar else {
            panic!()
        };
        assert_eq!(s["x-guidance"]["lenient"], false);
        let r = p(r#"{"input":"x","text":{"format":{"type":"text"}},"user":"u","store":false}"#)
            .unwrap();
        assert!(r.req.grammar.is_none() && !r.store);
        assert_eq!(r.noted, ["user"]);
        // A reasoning model gets the template's switch.
        let o = object(br#"{"input":"x","reasoning":{"effort":"none"}}"#).unwrap();
        let r = parse(&o, L, |_| None, true).unwrap();
        assert_eq!(r.req.template_kwargs.unwrap()["enable_thinking"], false);
    }

    #[test]
    fn bad_requests_name_their_field() {
        for (body, param, words) in [
            (r#"{"input":"x","bogus":1}"#, None, "unknown field `bogus`"),
            (r#"{}"#, Some("input"), "`input` is required"),
            (r#"{"input":5}"#, Some("input"), "got a number"),
            (r#"{"input":[]}"#, Some("input"), "no message"),
            (
                r#"{"input":[{"role":"user","content":[{"type":"input_image","image_url":"https://x/u.png"}]}]}"#,
                Some("input"),
                "the image at input[0].content[0] is a https: URL; this server fetches nothing",
            ),
            (
                r#"{"input":[{"role":"user","content":[{"type":"input_image","file_id":"f"}]}]}"#,
                Some("input"),
                "input[0].content[0].file_id: this server keeps no files",
            ),
            (
                r#"{"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,%%"}]}]}"#,
                Some("input"),
                "the image at input[0].content[0] is not valid base64",
            ),
            (
                r#"{"input":[{"role":"assistant","content":[{"type":"input_image","image_url":"data:,"}]}]}"#,
                Some("input"),
                "is of type \"input_image\"; the parts taken here are output_text",
            ),
            (
                r#"{"input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}"#,
                Some("input"),
                "the parts taken here are input_text and input_image",
            ),
            (
                r#"{"input":[{"role":"wizard","content":"x"}]}"#,
                Some("input"),
                "input[0].role",
            ),
            (
                r#"{"input":[{"role":"user","content":"x","extra":1}]}"#,
                Some("input"),
                "input[0].extra",
            ),
            (
                r#"{"input":[{"type":"function_call","call_id":"c","name":"f"}]}"#,
                Some("input"),
                "input[0] has no `arguments`",
            ),
            (
                r#"{"input":[{"type":"function_call_output","call_id":"c","output":"x"}]}"#,
                Some("input"),
                "input[0].call_id \"c\"",
            ),
            (
                r#"{"input":[{"type":"item_reference","id":"x"}]}"#,
                Some("input"),
                "item_reference",
            ),
            (
                r#"{"input":"x","tools":[{"type":"file_search"}]}"#,
                Some("tools"),
                "tools[0] is of type \"file_search\"",
            ),
            (
                r#"{"input":"x","tools":[{"type":"function","name":"f","function":{}}]}"#,
                Some("tools"),
                "tools[0].function",
            ),
            (
                r#"{"input":"x","tool_choice":"required"}"#,
                Some("tool_choice"),
                "needs `tools`",
            ),
            (
                r#"{"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}}"#,
                Some("tool_choice"),
                "\"g\"",
            ),
            (
                r#"{"input":"x","text":{"format":{"type":"xml"}}}"#,
                Some("text.format"),
                "\"xml\"",
            ),
            (
                r#"{"input":"x","text":{"format":{"type":"json_schema","name":"n"}}}"#,
                Some("text.format"),
                "`schema`",
            ),
            (
                r#"{"input":"x","text":{"format":{"type":"json_schema","schema":{}}}}"#,
                Some("text.format"),
                "`name`",
            ),
            (
                r#"{"input":"x","text":{"verbosity":"low"}}"#,
                Some("text"),
                "verbosity",
            ),
            (
                r#"{"input":"x","max_output_tokens":0}"#,
                Some("max_output_tokens"),
                "at least 1",
            ),
            (
                r#"{"input":"x","max_output_tokens":"9"}"#,
                Some("max_output_tokens"),
                "integer",
            ),
            (
                r#"{"input":"x","temperature":2.5}"#,
                Some("temperature"),
                "between 0 and 2",
            ),
            (
                r#"{"input":"x","top_p":0}"#,
                Some("top_p"),
                "greater than 0",
            ),
            (r#"{"input":"x","stream":"yes"}"#, Some("stream"), "boolean"),
            (r#"{"input":"x","store":1}"#, Some("store"), "boolean"),
            (
                r#"{"input":"x","background":true}"#,
                Some("background"),
                "background",
            ),
            (
                r#"{"input":"x","truncation":"auto"}"#,
                Some("truncation"),
                "\"auto\"",
            ),
            (
                r#"{"input":"x","include":["reasoning.encrypted_content"]}"#,
                Some("include"),
                "include",
            ),
            (
                r#"{"input":"x","metadata":{"a":1}}"#,
                Some("metadata"),
                "strings",
            ),
            (
                r#"{"input":"x","reasoning":{"effort":"high"}}"#,
                Some("reasoning"),
                "<think>",
            ),
            (
                r#"{"input":"x","previous_response_id":5}"#,
                Some("previous_response_id"),
                "string",
            ),
            (
                r#"{"input":"x","instructions":["a"]}"#,
                Some("instructions"),
                "string",
            ),
            (r#"{"input":"x","user":5}"#, None, "`user` must be a string"),
        ] {
            let e = p(body)
                .err()
                .unwrap_or_else(|| panic!("{body} was accepted"));
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
            assert!(e.message.contains(words), "{body}: {}", e.message);
        }
    }

    /// Every event of a stream, in order, builds the output the whole
    /// answer holds: reasoning first, then the message, then each call.
    #[test]
    fn the_events_build_the_items_in_order() {
        let mut out = Output::new();
        out.reasoning("Let me ");
        out.reasoning("think.");
        out.text("Hello");
        out.text(", world");
        out.call(tools::Call {
            name: "f".into(),
            arguments: r#"{"a":1}"#.into(),
        });
        out.end("completed");
        let types: Vec<&str> = out
            .events
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let kinds: Vec<&str> = out
            .items
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(out.items[0]["content"][0]["text"], "Let me think.");
        assert_eq!(out.items[1]["content"][0]["text"], "Hello, world");
        assert_eq!(out.items[2]["arguments"], r#"{"a":1}"#);
        // Each output_item.done carries the item as the whole answer has it,
        // at its index; the deltas of each item add up to its text.
        let done: Vec<&Value> = out
            .events
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .collect();
        for (i, d) in done.iter().enumerate() {
            assert_eq!(
                (&d["item"], d["output_index"].as_u64()),
                (&out.items[i], Some(i as u64))
            );
        }
        let text: String = out
            .events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(text, "Hello, world");
        // The kept turn: the text and the call under the call_id answered.
        let turn = out.turn();
        assert_eq!(turn["content"], "Hello, world");
        assert_eq!(turn["tool_calls"][0]["id"], out.items[2]["call_id"]);
        // Nothing said: one empty message.
        let mut empty = Output::new();
        empty.end("completed");
        assert_eq!(empty.items.len(), 1);
        assert_eq!(empty.items[0]["content"][0]["text"], "");
    }
}
