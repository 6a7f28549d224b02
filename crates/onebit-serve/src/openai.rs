//! OpenAI's API: `/v1/chat/completions` and `/v1/completions` (whole and
//! SSE), `/v1/models`. A request is parsed by [`api::parse`] into the
//! engine's request type, run by [`crate::run`], and its events shaped into
//! OpenAI's answers here.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use onebit_text::Tokenizer;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::api::{self, ApiError, Endpoint};
use crate::app::{App, Entry, Served};
use crate::conn;
use crate::engine::Finish;
use crate::fields::{check_unread, mark_unread, model_field};
use crate::metrics::Metrics;
use crate::reply::{json_response, random_u64, unix_now};
use crate::run::{self, drive, LpEntry, Run, Update};
use crate::text::tidy_reasoning;
use crate::tool_args::ArgEvent;
use crate::tools::{self, CallFormat, ToolStream};

/// A model as `/v1/models` lists it: OpenAI's fields, and whether it is
/// loaded (with its context when it is).
fn model_object(app: &App, e: &Entry) -> Value {
    let mut v = json!({
        "id": e.name,
        "object": "model",
        "created": app.started,
        "owned_by": "onebit",
        "loaded": false,
    });
    if let Some((m, _)) = app.models.loaded(e) {
        v["loaded"] = json!(true);
        v["context_length"] = json!(m.ctx);
    }
    v
}

/// `GET /v1/models`: every model this server serves.
pub async fn models(State(app): State<Arc<App>>) -> Response {
    let data: Vec<Value> = app
        .models
        .entries()
        .iter()
        .map(|e| model_object(&app, e))
        .collect();
    json_response(200, json!({"object": "list", "data": data}).to_string())
}

/// `GET /v1/models/{id}`: one model, or a 404 naming it.
pub async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.models.find(Some(&id)) {
        Ok(e) => json_response(200, model_object(&app, &e).to_string()),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    Metrics::add(&app.metrics.requests_chat, 1);
    respond(
        &app,
        generate(app.clone(), Endpoint::Chat, &headers, body).await,
    )
}

/// `POST /v1/completions`.
pub async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    Metrics::add(&app.metrics.requests_completions, 1);
    respond(
        &app,
        generate(app.clone(), Endpoint::Completions, &headers, body).await,
    )
}

/// An error in OpenAI's shape, counted.
pub fn respond(app: &App, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(r) => r,
        Err(e) => {
            Metrics::add(&app.metrics.requests_failed, 1);
            e.into_response()
        }
    }
}

async fn generate(
    app: Arc<App>,
    ep: Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = app.read_body(headers, body).await?;
    let (body, name) = run::blocking(move || {
        let name = model_field(&body)?;
        Ok((body, name))
    })
    .await?;
    let m = app.model(name.as_deref()).await?;
    run::check_generative(&m)?;
    let (app2, m2) = (app.clone(), m.clone());
    let mut p = run::blocking(move || {
        let req = api::parse(&body, ep, app2.limits(&m2))?;
        check_unread(app2.strict_fields, &req.ignored)?;
        run::prepare(&app2, &m2, ep, req, "response_format")
    })
    .await?;
    let ignored = std::mem::take(&mut p.req.ignored);
    let run = run::submit(&app, &m, &mut p)?;
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
        model: m.name.clone(),
        ep,
        prompt_tokens: p.ids.len(),
        include_usage: p.req.include_usage,
        tool_format: p.tool_format,
        tools: p.req.tools.clone(),
    };
    let affinity = run.affinity.clone();
    let mut r = if p.req.stream {
        stream_response(app, m, run, meta)
    } else {
        whole_response(&m, run, meta).await?
    };
    run::mark(&mut r, affinity);
    let route = match ep {
        Endpoint::Chat => "POST /v1/chat/completions",
        Endpoint::Completions => "POST /v1/completions",
    };
    mark_unread(&mut r, route, &ignored);
    Ok(r)
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
    /// The request's tools (for the lenient rule under `tool_choice` auto).
    tools: Option<tools::ToolSpec>,
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

async fn whole_response(m: &Served, run: Run, meta: Meta) -> Result<Response, ApiError> {
    let n = run.cancels.len();
    let mut acc: Vec<Acc> = (0..n).map(|_| Acc::default()).collect();
    let per = drive(&m.tok, run, |u| {
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
                        let (content, calls) = tools::parse_reply(&a.content, f, meta.tools.as_ref());
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
                        "logprobs": if want_lp { json!({"content": chat_logprob_entries(&m.tok, &a.logprobs)}) } else { Value::Null },
                        "finish_reason": finish,
                    })
                }
                Endpoint::Completions => json!({
                    "index": i,
                    "text": a.content,
                    "logprobs": if want_lp { completion_logprobs(&m.tok, &a.logprobs, 0) } else { Value::Null },
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

fn stream_response(app: Arc<App>, m: Arc<Served>, run: Run, meta: Meta) -> Response {
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Bytes>();
    // A panic in the producer (a bug) ends the stream with an error event
    // in OpenAI's shape and [DONE].
    let failed = ApiError::server(conn::STREAM_FAILED).body();
    let last = Bytes::from(format!("data: {failed}\n\ndata: [DONE]\n\n"));
    conn::spawn_stream(out_tx.clone(), last, async move {
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
        let tok = m.tok.clone();
        let gone = out_tx.clone();
        let mut tool_streams: Vec<Option<ToolStream>> = (0..n)
            .map(|_| {
                meta.tool_format
                    .map(|f| ToolStream::new(f).with_tools(meta.tools.as_ref()))
            })
            .collect();
        // Per choice, the calls streamed so far: (name, arguments sent).
        let mut streamed: Vec<Vec<(String, String)>> = vec![Vec::new(); n];
        let driving = drive(&tok, run, |u| {
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
    crate::reply::event_stream(out_rx)
}
