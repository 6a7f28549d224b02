//! Running a request on a model, whatever protocol it came in: the prompt
//! rendered and tokenized ([`prepare`], on the blocking pool), its jobs set
//! up and submitted once ([`submit`]: seeds, the `max_tokens` cap, grammars),
//! the engine's events turned into per-choice text ([`drive`]), and an
//! embedding run ([`embed`]). The protocols (OpenAI, Ollama) above it only
//! parse requests and shape answers; below it is only the application state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::http::HeaderValue;
use axum::response::Response;
use onebit_model::sampler::SamplerConfig;
use onebit_text::{StreamDecoder, Tokenizer};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::affinity::{prefix_hash, AFFINITY_HEADER};
use crate::api::{ApiError, Endpoint, Prompt, Request};
use crate::app::{App, Served};
use crate::constrain::{Constraint, Grammar};
use crate::engine::{EmbedJob, Event, Finish, GenParams, Job, TokenLogprob, SHUTTING_DOWN};
use crate::fields::Input;
use crate::harmony::{self, HarmonySplitter};
use crate::image_prompt;
use crate::images::PromptImage;
use crate::prompt;
use crate::reply::random_u64;
use crate::reqlog::{self, RunLog};
use crate::text::{Split, StopMatcher, ThinkSplitter};
use crate::tools::{self, CallFormat};

/// Runs `f` on the blocking pool, never on the runtime's thread (a large
/// body takes a while to parse, a large prompt seconds to tokenize).
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::server(format!("preparing the request failed: {e}")))?
}

/// Ok for a model that generates; a 400 naming `model` for one that does
/// not (an embedding model).
pub fn check_generative(m: &Served) -> Result<(), ApiError> {
    match &m.generative {
        Ok(()) => Ok(()),
        Err(why) => Err(ApiError::invalid("model", why.clone())),
    }
}

/// A request ready to run: its prompt ids and what shapes the output.
pub struct Prepared {
    pub req: Request,
    pub ids: Arc<Vec<u32>>,
    /// The template knows `<think>`: split a reasoning block off.
    pub think: bool,
    /// The rendered prompt ends inside an open `<think>` block.
    pub think_open: bool,
    /// The model declares the harmony format ([`harmony::declared`]): the
    /// reply is split by its channels instead.
    pub harmony: bool,
    /// Replies are parsed for tool calls in this format.
    pub tool_format: Option<&'static CallFormat>,
    /// The output grammar, compiled.
    pub constraint: Option<Constraint>,
    /// Control tokens are kept in the text (a call marker is one).
    pub keep_special: bool,
    /// The prompt's images, prepared for the tower, at their ids.
    pub images: Vec<PromptImage>,
}

/// Compiles a request's grammar; a schema or grammar the library cannot
/// handle is a 400 naming the parameter and llguidance's reason.
fn compile(m: &Served, g: &Grammar, param: &'static str) -> Result<Constraint, ApiError> {
    let c = m.constrainer.get_or_init(|| match m.grammar_eos {
        Some(eos) => crate::constrain::Constrainer::new(&m.tok, eos),
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
            "format" => "the JSON schema (`format`)",
            "text.format" => "the JSON schema (`text.format`)",
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

/// Renders and tokenizes `req` for model `m`; run it on the blocking pool.
/// `grammar_param` is the field the client wrote its output format in
/// (`response_format` for OpenAI, `format` for Ollama), so an error about
/// it names that field.
pub fn prepare(
    app: &App,
    m: &Served,
    ep: Endpoint,
    req: Request,
    grammar_param: &'static str,
) -> Result<Prepared, ApiError> {
    check_generative(m)?;
    if let Some(&(bad, _)) = req
        .logit_bias
        .iter()
        .find(|(id, _)| *id as usize >= m.n_vocab)
    {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "`logit_bias` names token {bad}, outside the vocabulary ({} tokens)",
                m.n_vocab
            ),
        ));
    }
    // Images: each decoded within bounds (a bad one named), then refused
    // for a model without a vision tower, else prepared for it.
    let pixels = if req.images.is_empty() {
        Vec::new()
    } else {
        image_prompt::prepare(&req.images, &m.name, m.vision.as_ref(), prompt_param(ep))?
    };
    let mut placed = Vec::new();
    let mut tool_format = None;
    let mut keep_special = false;
    let mut grammar = req.grammar.clone().map(|g| {
        let param = if matches!(g, Grammar::Lark(_)) {
            "grammar"
        } else {
            grammar_param
        };
        (g, param)
    });
    let mut is_harmony = false;
    let (ids, think, think_open) = match &req.prompt {
        Prompt::Chat(messages) => {
            let t = m.template.as_ref().ok_or_else(|| {
                ApiError::invalid(
                    "messages",
                    format!("model {} has no chat template, so it cannot take chat requests; start the server with --chat-template FILE, or use /v1/completions", m.name),
                )
                .with_code("no_chat_template")
            })?;
            // Tools: the template's own way when it knows tools, else the
            // generic fallback (tools in a system message, calls as JSON).
            let spec = req.tools.as_ref();
            is_harmony = m.harmony();
            let harmony_messages;
            let messages = if is_harmony {
                harmony_messages = harmony::messages_for_template(messages);
                &harmony_messages
            } else {
                messages
            };
            let known = if is_harmony {
                Some(&tools::HARMONY)
            } else {
                tools::detect(t.source())
            };
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
                let special = |s: &str| m.tok.token_to_id(s).filter(|&id| m.tok.is_special(id));
                keep_special = !f.open.is_empty() && special(f.open).is_some();
                if spec.forced() {
                    grammar = Some((tools::forced_grammar(spec, f, special), "tools"));
                }
            }
            let r = prompt::render(t, messages, kwargs.as_ref(), !app.allow_special_in_content)?;
            check_bytes(m, ep, r.text.len())?;
            let allow = app.allow_special_in_content;
            let ids = match m.vision.as_ref().filter(|_| !pixels.is_empty()) {
                Some(v) => {
                    let (ids, at) = image_prompt::lay_out(&m.tok, &r, v, &pixels, |piece| {
                        prompt::ids(&m.tok, piece, messages, allow)
                    })?;
                    placed = at;
                    ids
                }
                None => prompt::ids(&m.tok, &r, messages, allow)?,
            };
            let text = r.text;
            // Harmony's markers are control tokens the splitter reads.
            keep_special |= is_harmony;
            let think = !is_harmony && t.source().contains("<think>");
            let open = think && {
                let tail = text.trim_end();
                tail.rfind("<think>") > tail.rfind("</think>")
            };
            (ids, think, open)
        }
        Prompt::Text(s) => {
            check_bytes(m, ep, s.len())?;
            let encode = |s: &str, bos: bool| {
                m.tok.encode(s, bos).map_err(|e| {
                    ApiError::invalid("prompt", format!("cannot tokenize the prompt: {e}"))
                })
            };
            let ids = match m.vision.as_ref().filter(|_| !pixels.is_empty()) {
                Some(v) => {
                    let whole = prompt::Rendered {
                        text: s.clone(),
                        spans: None,
                        unmarked: Vec::new(),
                    };
                    // BOS before the first piece only.
                    let mut first = true;
                    let (ids, at) = image_prompt::lay_out(&m.tok, &whole, v, &pixels, |piece| {
                        let bos = std::mem::take(&mut first);
                        encode(&piece.text, bos)
                    })?;
                    placed = at;
                    ids
                }
                None => encode(s, true)?,
            };
            (ids, false, false)
        }
        Prompt::Tokens(t) => {
            if let Some(bad) = t.iter().find(|&&id| id as usize >= m.n_vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!(
                        "token id {bad} is outside the vocabulary ({} tokens)",
                        m.n_vocab
                    ),
                ));
            }
            (t.clone(), false, false)
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt has no tokens"));
    }
    if ids.len() >= m.ctx {
        return Err(ApiError::invalid(
            prompt_param(ep),
            format!(
                "the prompt has {} tokens, but this server's context holds {} (prompt plus at least one generated token)",
                ids.len(),
                m.ctx
            ),
        )
        .with_code("context_length_exceeded"));
    }
    if let Some(c) = req.ctx_limit.filter(|&c| ids.len() >= c) {
        return Err(ApiError::invalid(
            "options.num_ctx",
            format!(
                "the prompt has {} tokens, but `options.num_ctx` {c} holds fewer (prompt plus at least one generated token); this server never cuts a prompt to fit",
                ids.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let constraint = match &grammar {
        Some((g, param)) => Some(compile(m, g, param)?),
        None => None,
    };
    Ok(Prepared {
        req,
        ids: Arc::new(ids),
        think,
        think_open,
        harmony: is_harmony,
        tool_format,
        constraint,
        keep_special,
        images: placed,
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
fn check_bytes(m: &Served, ep: Endpoint, bytes: usize) -> Result<(), ApiError> {
    let least = bytes / m.max_token_bytes;
    if least < m.ctx {
        return Ok(());
    }
    Err(ApiError::invalid(
        prompt_param(ep),
        format!(
            "the prompt is {bytes} bytes, so at least {least} tokens (no token is longer than {} bytes), but this server's context holds {}",
            m.max_token_bytes, m.ctx
        ),
    )
    .with_code("context_length_exceeded"))
}

/// Tokens a request may generate: what it asks (all the context's room
/// when it asks none), within the room and the server's `--max-tokens`.
pub fn max_new(asked: Option<usize>, room: usize, cap: usize) -> usize {
    let cap = match cap {
        0 => usize::MAX,
        c => c,
    };
    asked.map_or(room, |a| a.min(room)).min(cap)
}

/// The request's choices as jobs on `m`'s engine: choice `i` samples with
/// seed `seed + i`, each gets its own fork of the grammar. A full queue is
/// a 503 (and nothing of the request is queued).
pub fn submit(app: &App, m: &Served, p: &mut Prepared) -> Result<Run, ApiError> {
    let req = &p.req;
    let n = req.n.max(1);
    let mut constraints: Vec<Option<Constraint>> = (0..n)
        .map(|i| {
            if i + 1 < n {
                p.constraint.as_ref().map(Constraint::fork)
            } else {
                p.constraint.take()
            }
        })
        .collect();
    let ctx = req.ctx_limit.map_or(m.ctx, |c| c.min(m.ctx));
    let max_new = max_new(req.max_tokens, ctx - p.ids.len(), app.max_tokens);
    let base_seed = req.seed.unwrap_or_else(random_u64);
    let (tx, rx) = mpsc::unbounded_channel();
    let submitted = Instant::now();
    let cancels: Vec<Arc<AtomicBool>> = (0..n).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let jobs = (0..n)
        .map(|i| Job {
            prompt: p.ids.clone(),
            params: GenParams {
                max_new,
                sampler: SamplerConfig {
                    temperature: req.temperature,
                    top_k: req.top_k,
                    top_p: req.top_p,
                    min_p: req.min_p,
                    typical_p: req.typical_p,
                    seed: base_seed.wrapping_add(i as u64),
                },
                presence_penalty: req.presence_penalty,
                frequency_penalty: req.frequency_penalty,
                repeat_penalty: req.repeat_penalty,
                repeat_last_n: req.repeat_last_n,
                logprobs: req.logprobs,
                speculative: req.speculative,
                logit_bias: req.logit_bias.clone(),
            },
            index: i,
            tx: tx.clone(),
            cancel: cancels[i].clone(),
            submitted,
            constraint: constraints[i].take(),
            images: p.images.clone(),
        })
        .collect();
    drop(tx);
    if m.engine.submit(jobs).is_err() {
        return Err(app.queue_full());
    }
    let log = reqlog::current();
    reqlog::update(&log, |r| {
        r.model = Some(m.name.clone());
        r.prompt_tokens = Some(p.ids.len());
        r.completion_tokens = Some(0);
    });
    Ok(Run {
        rx,
        cancels,
        stops: req.stop.clone(),
        think: p.think,
        think_open: p.think_open,
        harmony: p
            .harmony
            .then_some(p.tool_format.is_some_and(|f| f.name == tools::HARMONY.name)),
        logprobs: req.logprobs.is_some(),
        keep_special: p.keep_special,
        affinity: prefix_hash(&p.ids),
        log,
    })
}

/// A submitted request: the engine's events and what turns them into text.
pub struct Run {
    pub rx: mpsc::UnboundedReceiver<Event>,
    pub cancels: Vec<Arc<AtomicBool>>,
    pub stops: Vec<String>,
    pub think: bool,
    pub think_open: bool,
    /// A harmony reply: `Some(calls)`, `calls` when its calls become
    /// [`tools::HARMONY`] blocks ([`HarmonySplitter::new`]).
    pub harmony: Option<bool>,
    pub logprobs: bool,
    pub keep_special: bool,
    /// The prompt's routing hint (see [`crate::affinity`]).
    pub affinity: HeaderValue,
    /// The request's access-log slot: tokens and the first token's time.
    pub log: RunLog,
}

/// Marks a completion response with its prompt's routing hint: every
/// completion, whatever its protocol, carries it.
pub fn mark(r: &mut Response, affinity: HeaderValue) {
    r.headers_mut().insert(AFFINITY_HEADER, affinity);
}

/// One generated token as logprobs report it.
pub struct LpEntry {
    pub id: u32,
    pub lp: TokenLogprob,
}

/// What happened to one choice since the last report.
pub enum Update {
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

/// What splits a choice's text into reasoning and content.
enum Splitter {
    Think(ThinkSplitter),
    Harmony(HarmonySplitter),
}

impl Splitter {
    fn push(&mut self, text: &str) -> Split {
        match self {
            Splitter::Think(t) => t.push(text),
            Splitter::Harmony(h) => h.push(text),
        }
    }

    fn finish(&mut self, finish: Finish) -> Split {
        match self {
            Splitter::Think(t) => t.finish(),
            Splitter::Harmony(h) => h.finish(finish == Finish::Length),
        }
    }
}

struct Choice<'t> {
    dec: StreamDecoder<'t>,
    stop: StopMatcher,
    think: Splitter,
    tokens: usize,
    cached: usize,
    finish: Option<Finish>,
}

/// Turns engine events into per-choice text updates; returns per choice
/// (completion tokens, cached tokens, finish).
pub async fn drive(
    tok: &Tokenizer,
    mut run: Run,
    mut emit: impl FnMut(Update) -> bool,
) -> Result<Vec<(usize, usize, Finish)>, ApiError> {
    let n = run.cancels.len();
    let mut choices: Vec<Choice> = (0..n)
        .map(|_| Choice {
            dec: StreamDecoder::with_skip_special(tok, !run.keep_special),
            stop: StopMatcher::new(run.stops.clone()),
            think: match run.harmony {
                Some(calls) => Splitter::Harmony(HarmonySplitter::new(calls)),
                None => Splitter::Think(ThinkSplitter::new(run.think, run.think_open)),
            },
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
                if index == 0 {
                    reqlog::update(&run.log, |r| r.cached_tokens = Some(cached));
                }
                continue;
            }
            Event::Failed { message, .. } => return Err(engine_failed(message)),
            Event::Encoded {
                images, seconds, ..
            } => {
                reqlog::update(&run.log, |r| {
                    r.images += images;
                    r.image_encode_secs += seconds;
                });
                continue;
            }
            Event::Token { index, id, logprob } => {
                let c = &mut choices[index];
                if c.finish.is_some() {
                    continue; // already ended by a stop string
                }
                c.tokens += 1;
                reqlog::update(&run.log, |r| {
                    r.first_token.get_or_insert_with(Instant::now);
                    r.completion_tokens = Some(r.completion_tokens.unwrap_or(0) + 1);
                });
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
        if let Some(finish) = end {
            let rest = c.think.finish(finish);
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

/// The vectors of `inputs` (texts or token ids) on model `m` and the number
/// of tokens they took: each input runs on a fresh sequence, prefilled in chunks beside the other
/// requests under the engine's step budget, so its vector is the same
/// whatever else the server does. A text too long for the context whatever
/// its tokens is refused before tokenizing, as a prompt is; a client that
/// hangs up frees the request before the next step.
pub async fn embed(
    app: &App,
    m: &Arc<Served>,
    inputs: Vec<Input>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let pooling = m.pooling.clone().map_err(|why| {
        ApiError::invalid(
            "model",
            format!("model {} cannot give embeddings: {why}", m.name),
        )
    })?;
    for (i, input) in inputs.iter().enumerate() {
        let Input::Text(t) = input else { continue };
        let least = t.len() / m.max_token_bytes;
        if least > m.ctx {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "input {i} is {} bytes, so at least {least} tokens (no token is longer than {} bytes), but this server's context holds {}",
                    t.len(),
                    m.max_token_bytes,
                    m.ctx
                ),
            )
            .with_code("context_length_exceeded"));
        }
    }
    // Tokenize on the blocking pool, as prompts are.
    let m2 = m.clone();
    let ids: Vec<Vec<u32>> = blocking(move || {
        inputs
            .iter()
            .enumerate()
            .map(|(i, input)| {
                let ids = match input {
                    Input::Text(t) => m2.tok.encode(t, true).map_err(|e| {
                        ApiError::invalid("input", format!("cannot tokenize input {i}: {e}"))
                    })?,
                    Input::Tokens(ids) => {
                        if let Some(bad) = ids.iter().find(|&&id| id as usize >= m2.n_vocab) {
                            return Err(ApiError::invalid(
                                "input",
                                format!(
                                    "input {i} has token id {bad}, outside model {}'s vocabulary ({} tokens)",
                                    m2.name, m2.n_vocab
                                ),
                            ));
                        }
                        ids.clone()
                    }
                };
                if ids.is_empty() {
                    return Err(ApiError::invalid(
                        "input",
                        format!("input {i} has no tokens"),
                    ));
                }
                if ids.len() > m2.ctx {
                    return Err(ApiError::invalid(
                        "input",
                        format!(
                            "input {i} has {} tokens, but this server's context holds {}",
                            ids.len(),
                            m2.ctx
                        ),
                    )
                    .with_code("context_length_exceeded"));
                }
                Ok(ids)
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    let n_tokens = ids.iter().map(Vec::len).sum();
    reqlog::update(&reqlog::current(), |r| r.prompt_tokens = Some(n_tokens));
    let (tx, rx) = oneshot::channel();
    let job = EmbedJob {
        inputs: ids,
        pooling,
        reply: tx,
        submitted: Instant::now(),
    };
    if m.engine.embed(job).is_err() {
        return Err(app.queue_full());
    }
    let vectors = rx
        .await
        .map_err(|_| ApiError::server("the engine stopped before finishing the request"))?
        .map_err(engine_failed)?;
    Ok((vectors, n_tokens))
}

/// The error a client gets for a request the engine failed: a 503 it may
/// retry elsewhere when the server cut it at the end of its shutdown
/// timeout, a 500 otherwise.
pub fn engine_failed(message: String) -> ApiError {
    if message == SHUTTING_DOWN {
        return ApiError {
            status: 503,
            message,
            kind: "server_error",
            param: None,
            code: Some("shutting_down"),
        };
    }
    ApiError::server(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_new_is_the_least_of_ask_room_and_cap() {
        // Asked 10 with room 100 and no cap (0): 10. Asked none: the room,
        // within the cap. Asked past the room: the room.
        assert_eq!(max_new(Some(10), 100, 0), 10);
        assert_eq!(max_new(None, 100, 0), 100);
        assert_eq!(max_new(None, 100, 40), 40);
        assert_eq!(max_new(Some(500), 100, 0), 100);
        assert_eq!(max_new(Some(50), 100, 40), 40);
    }
}
