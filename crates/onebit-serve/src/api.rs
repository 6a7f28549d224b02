//! Requests as OpenAI defines them, checked field by field: every problem is
//! a 4xx in OpenAI's error shape naming the parameter at fault.

use std::fmt::Display;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::constrain::Grammar;
use crate::images::{self, ImageIn};
use crate::tools::{ToolChoice, ToolSpec};

/// An error answer: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// `what` (as the message names it) is not of the `expected` kind.
    fn wrong_type(
        param: impl Into<Option<&'static str>>,
        what: impl Display,
        expected: &str,
        v: &Value,
    ) -> ApiError {
        ApiError::invalid(
            param,
            format!("{what} must be {expected}; got {}", type_name(v)),
        )
    }

    /// Parameter `name` is outside `lo..=hi`.
    fn out_of_range(
        name: &'static str,
        lo: impl Display,
        hi: impl Display,
        x: impl Display,
    ) -> ApiError {
        ApiError::invalid(
            name,
            format!("`{name}` must be between {lo} and {hi}; got {x}"),
        )
    }

    pub fn invalid(param: impl Into<Option<&'static str>>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.into().map(str::to_string),
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn status(mut self, status: u16) -> ApiError {
        self.status = status;
        self
    }

    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 500,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> String {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
        .to_string()
    }
}

impl From<images::Refused> for ApiError {
    fn from(r: images::Refused) -> ApiError {
        let e = ApiError::invalid(r.param, r.message);
        match r.code {
            Some(c) => e.with_code(c),
            None => e,
        }
    }
}

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Chat messages, normalised: `role` is one the templates know, `content`
    /// a string (text parts joined) or null.
    Chat(Value),
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Prompt,
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Some(k): return logprobs with the k most likely alternatives.
    pub logprobs: Option<usize>,
    pub n: usize,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Candidates under `min_p` times the likeliest are dropped; 0: off.
    pub min_p: f32,
    /// Locally typical sampling's mass; 1: off.
    pub typical_p: f32,
    /// llama.cpp's and Ollama's `repeat_penalty`; 1: off.
    pub repeat_penalty: f32,
    /// The tokens (of prompt and reply, the latest) `repeat_penalty` looks
    /// at; `None`: the whole context (`repeat_last_n` -1).
    pub repeat_last_n: Option<usize>,
    /// The context this request may use, when smaller than the model's
    /// (Ollama's `num_ctx`): the prompt and reply together stay within it.
    pub ctx_limit: Option<usize>,
    /// Body fields this server does not read, by name (`options.mirostat`
    /// for a nested one), for the `x-onebit-ignored-fields` header; and the
    /// machine-level options accepted with no effect here (`num_thread`).
    pub ignored: Vec<String>,
    /// Extra template arguments (`chat_template_kwargs`, as vLLM and llama.cpp take them).
    pub template_kwargs: Option<Map<String, Value>>,
    /// The extra field `speculative`: false turns the server's drafting off
    /// for this request (true, the default, keeps it on).
    pub speculative: bool,
    /// `tools` with `tool_choice` and `parallel_tool_calls` (chat only).
    pub tools: Option<ToolSpec>,
    /// `response_format` json_object / json_schema, or `grammar` (Lark).
    pub grammar: Option<Grammar>,
    /// `logit_bias`: (token id, bias in [-100, 100]); ids checked against
    /// the vocabulary by the caller.
    pub logit_bias: Vec<(u32, f32)>,
    /// The images of the prompt, in the order of their marks in it.
    pub images: Vec<ImageIn>,
}

impl Request {
    /// A request for `prompt` with every other field as [`parse`] leaves it
    /// when the body states nothing else (OpenAI's defaults), for protocols
    /// that parse their own body into this type.
    pub fn new(prompt: Prompt) -> Request {
        let none = Limits {
            max_n: 1,
            max_tokens: 0,
            drafting: false,
        };
        let mut r = parse(br#"{"prompt": "-"}"#, Endpoint::Completions, none)
            .expect("a body with only a prompt is a valid request");
        r.prompt = prompt;
        r
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

pub const MAX_TOP_LOGPROBS: usize = 20;
pub const MAX_STOPS: usize = 16;
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// How an error names the JSON type a field was given.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A field, absent and null alike meaning "not given".
fn field<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
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
                return Err(ApiError::out_of_range(name, lo, hi, x));
            }
            Ok(Some(x))
        }
        Some(v) => Err(ApiError::wrong_type(
            name,
            format!("`{name}`"),
            "a number",
            v,
        )),
    }
}

/// A top-level number as the client wrote it: serde_json keeps an integer
/// beyond 64 bits only as the nearest f64 (2^64 would print as
/// 1.8446744073709552e19), so the error quotes the body's own text.
fn sent(body: &[u8], name: &str, n: &serde_json::Number) -> String {
    serde_json::from_slice::<std::collections::HashMap<String, Box<serde_json::value::RawValue>>>(
        body,
    )
    .ok()
    .and_then(|m| m.get(name).map(|r| r.get().trim().to_string()))
    .unwrap_or_else(|| n.to_string())
}

/// An integer field within `lo..=hi`; `body` is the request as sent, for
/// quoting a number too large for 64 bits.
fn integer(
    body: &[u8],
    o: &Map<String, Value>,
    name: &'static str,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, ApiError> {
    match field(o, name) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            let Some(x) = n.as_i64().or_else(|| n.as_u64().map(|_| i64::MAX)) else {
                let integral = n.as_f64().is_some_and(|x| x.fract() == 0.0);
                return Err(ApiError::invalid(
                    name,
                    if integral && hi == i64::MAX {
                        format!(
                            "`{name}` must be an integer of at most {}; got {}",
                            u64::MAX,
                            sent(body, name, n)
                        )
                    } else if integral {
                        format!(
                            "`{name}` must be an integer between {lo} and {hi}; got {}",
                            sent(body, name, n)
                        )
                    } else {
                        format!("`{name}` must be an integer; got {}", sent(body, name, n))
                    },
                ));
            };
            if !(lo..=hi).contains(&x) {
                return Err(ApiError::out_of_range(name, lo, hi, x));
            }
            Ok(Some(x))
        }
        Some(v) => Err(ApiError::wrong_type(
            name,
            format!("`{name}`"),
            "an integer",
            v,
        )),
    }
}

fn boolean(o: &Map<String, Value>, name: &'static str) -> Result<Option<bool>, ApiError> {
    match field(o, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::wrong_type(
            name,
            format!("`{name}`"),
            "a boolean",
            v,
        )),
    }
}

/// Limits the server imposes on requests.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_n: usize,
    /// Largest `max_tokens` a request may ask for; 0: up to the context.
    pub max_tokens: usize,
    /// The server drafts tokens (`--lookup`/`--draft`).
    pub drafting: bool,
}

/// Parses and checks a request body.
pub fn parse(body: &[u8], ep: Endpoint, limits: Limits) -> Result<Request, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::wrong_type(None, "the body", "a JSON object", &v));
    };

    let mut images = Vec::new();
    let prompt = match ep {
        Endpoint::Chat => {
            let (m, found) = messages(&o)?;
            images = found;
            Prompt::Chat(m)
        }
        Endpoint::Completions => completion_prompt(&o)?,
    };

    let max_tokens = match integer(body, &o, "max_completion_tokens", i64::MIN, i64::MAX)? {
        Some(x) => Some(("max_completion_tokens", x)),
        None => integer(body, &o, "max_tokens", i64::MIN, i64::MAX)?.map(|x| ("max_tokens", x)),
    };
    let max_tokens = match max_tokens {
        Some((name, x)) if x < 1 => {
            return Err(ApiError::invalid(
                if name == "max_tokens" {
                    "max_tokens"
                } else {
                    "max_completion_tokens"
                },
                format!("`{name}` must be at least 1; got {x}"),
            ))
        }
        Some((name, x)) if limits.max_tokens > 0 && x as u64 > limits.max_tokens as u64 => {
            return Err(ApiError::invalid(
                if name == "max_tokens" {
                    "max_tokens"
                } else {
                    "max_completion_tokens"
                },
                format!(
                    "`{name}` must be at most {} on this server; got {x}",
                    limits.max_tokens
                ),
            ))
        }
        Some((_, x)) => Some(x as usize),
        None => None,
    };

    let temperature = number(&o, "temperature", 0.0, 2.0)?.unwrap_or(1.0) as f32;
    let top_p = number(&o, "top_p", 0.0, 1.0)?.unwrap_or(1.0) as f32;
    if top_p <= 0.0 {
        return Err(ApiError::invalid("top_p", "`top_p` must be greater than 0"));
    }
    let top_k = integer(body, &o, "top_k", -1, i64::from(u32::MAX))?
        .unwrap_or(0)
        .max(0) as usize;
    let seed = match field(&o, "seed") {
        None => None,
        Some(Value::Number(n)) => Some(
            n.as_i64()
                .map(|x| x as u64)
                .or_else(|| n.as_u64())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "seed",
                        format!(
                            "`seed` must be an integer between {} and {}; got {}",
                            i64::MIN,
                            u64::MAX,
                            sent(body, "seed", n)
                        ),
                    )
                })?,
        ),
        Some(v) => return Err(ApiError::wrong_type("seed", "`seed`", "an integer", v)),
    };

    let stop = match field(&o, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOPS {
                return Err(ApiError::invalid(
                    "stop",
                    format!("at most {MAX_STOPS} stop strings; got {}", a.len()),
                ));
            }
            a.iter()
                .map(|s| {
                    s.as_str().map(str::to_string).ok_or_else(|| {
                        ApiError::invalid("stop", "`stop` must be a string or a list of strings")
                    })
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => {
            return Err(ApiError::wrong_type(
                "stop",
                "`stop`",
                "a string or a list of strings",
                v,
            ))
        }
    };

    let stream = boolean(&o, "stream")?.unwrap_or(false);
    let include_usage = match field(&o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => boolean(so, "include_usage")
            .map_err(|e| ApiError {
                param: Some("stream_options.include_usage".into()),
                ..e
            })?
            .unwrap_or(false),
        Some(v) => {
            return Err(ApiError::wrong_type(
                "stream_options",
                "`stream_options`",
                "an object",
                v,
            ))
        }
    };

    let logprobs = match ep {
        Endpoint::Chat => {
            let on = boolean(&o, "logprobs")?.unwrap_or(false);
            let top = integer(body, &o, "top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
            if top.is_some() && !on {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs` set to true",
                ));
            }
            on.then_some(top.unwrap_or(0) as usize)
        }
        Endpoint::Completions => {
            integer(body, &o, "logprobs", 0, MAX_TOP_LOGPROBS as i64)?.map(|k| k as usize)
        }
    };

    let n = integer(body, &o, "n", 1, i64::MAX)?.unwrap_or(1) as usize;
    if n > limits.max_n {
        return Err(ApiError::invalid(
            "n",
            format!(
                "`n` must be at most {} on this server; got {n}",
                limits.max_n
            ),
        ));
    }
    let presence_penalty = number(&o, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32;
    let frequency_penalty = number(&o, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32;
    // llama-server's and vLLM's sampler extensions, under their names.
    let min_p = number(&o, "min_p", 0.0, 1.0)?.unwrap_or(0.0) as f32;
    let typical_p = number(&o, "typical_p", 0.0, 1.0)?.unwrap_or(1.0) as f32;
    let repeat_penalty =
        number(&o, "repeat_penalty", 0.0, MAX_REPEAT_PENALTY)?.unwrap_or(1.0) as f32;
    if repeat_penalty <= 0.0 {
        return Err(ApiError::invalid(
            "repeat_penalty",
            "`repeat_penalty` must be greater than 0 (1 is off)",
        ));
    }
    let repeat_last_n = repeat_window(integer(body, &o, "repeat_last_n", -1, i64::from(u32::MAX))?);

    if ep == Endpoint::Completions && boolean(&o, "echo")?.unwrap_or(false) {
        return Err(ApiError::invalid("echo", "`echo` is not supported"));
    }
    if let Some(bo) = field(&o, "best_of") {
        if bo.as_i64() != Some(1) && bo.as_i64() != Some(n as i64) {
            return Err(ApiError::invalid(
                "best_of",
                "`best_of` other than `n` is not supported",
            ));
        }
    }
    let mut template_kwargs = match field(&o, "chat_template_kwargs") {
        None => None,
        Some(Value::Object(m)) => Some(m.clone()),
        Some(v) => {
            return Err(ApiError::wrong_type(
                "chat_template_kwargs",
                "`chat_template_kwargs`",
                "an object",
                v,
            ))
        }
    };

    // OpenAI's `reasoning_effort`: the template's `reasoning_effort`
    // argument (gpt-oss prints it as harmony's `Reasoning:` line); one in
    // `chat_template_kwargs` is more specific and wins.
    if let Some(v) = field(&o, "reasoning_effort") {
        let e =
            crate::harmony::effort(v).map_err(|why| ApiError::invalid("reasoning_effort", why))?;
        template_kwargs
            .get_or_insert_with(Default::default)
            .entry("reasoning_effort")
            .or_insert(Value::String(e));
    }

    let speculative = boolean(&o, "speculative")?;
    if speculative == Some(true) && !limits.drafting {
        return Err(ApiError::invalid(
            "speculative",
            "`speculative` true needs a server started with --lookup N or --draft PATH",
        ));
    }
    let tools = match ep {
        Endpoint::Chat => tool_spec(&o)?,
        Endpoint::Completions => None,
    };
    let grammar = grammar(&o)?;
    if grammar.is_some() && tools.as_ref().is_some_and(ToolSpec::forced) {
        return Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` required or named constrains the output to a call; it cannot be combined with `response_format` or `grammar`",
        ));
    }
    let logit_bias = logit_bias(&o)?;

    let known: &[&str] = match ep {
        Endpoint::Chat => &CHAT_FIELDS,
        Endpoint::Completions => &COMPLETION_FIELDS,
    };
    let ignored = o
        .keys()
        .filter(|k| !known.contains(&k.as_str()) && !SHARED_FIELDS.contains(&k.as_str()))
        .cloned()
        .collect();

    Ok(Request {
        min_p,
        typical_p,
        repeat_penalty,
        repeat_last_n,
        ctx_limit: None,
        ignored,
        speculative: speculative.unwrap_or(true),
        prompt,
        max_tokens,
        temperature,
        top_p,
        top_k,
        seed,
        stop,
        stream,
        include_usage,
        logprobs,
        n,
        presence_penalty,
        frequency_penalty,
        template_kwargs,
        tools,
        grammar,
        logit_bias,
        images,
    })
}

/// The largest `repeat_penalty` taken (llama.cpp sets none; past this a
/// seen token is all but banned, which `logit_bias` says more plainly).
pub const MAX_REPEAT_PENALTY: f64 = 10.0;

/// The tokens `repeat_penalty` looks back over by default (Ollama's
/// `repeat_last_n` default, docs/modelfile.md).
pub const DEFAULT_REPEAT_LAST_N: usize = 64;

/// `repeat_last_n` as the engine takes it: absent, the default; -1, the
/// whole context (`None`); 0, no token (the penalty off).
pub fn repeat_window(n: Option<i64>) -> Option<usize> {
    match n {
        None => Some(DEFAULT_REPEAT_LAST_N),
        Some(-1) => None,
        Some(x) => Some(x.max(0) as usize),
    }
}

/// The body fields both `/v1` generation routes read.
const SHARED_FIELDS: [&str; 25] = [
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "chat_template_kwargs",
    "speculative",
    "response_format",
    "grammar",
    "logit_bias",
    "best_of",
    // An end user's id for abuse monitoring: nothing to do with it here.
    "user",
    "logprobs",
];

/// The fields only `/v1/chat/completions` reads.
const CHAT_FIELDS: [&str; 6] = [
    "messages",
    "reasoning_effort",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];

/// The fields only `/v1/completions` reads.
const COMPLETION_FIELDS: [&str; 2] = ["prompt", "echo"];

/// A function name as OpenAI allows it.
fn good_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// `tools`, `tool_choice`, `parallel_tool_calls`.
pub fn tool_spec(o: &Map<String, Value>) -> Result<Option<ToolSpec>, ApiError> {
    let tools = match field(o, "tools") {
        None => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(v) => return Err(ApiError::wrong_type("tools", "`tools`", "an array", v)),
    };
    let mut names: Vec<&str> = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let bad = |what: &str| ApiError::invalid("tools", format!("tools[{i}] {what}"));
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(
                "must have `type` \"function\" (the only kind of tool served)",
            ));
        }
        let Some(Value::Object(f)) = t.get("function") else {
            return Err(bad("has no `function` object"));
        };
        let name = match f.get("name") {
            Some(Value::String(n)) if good_name(n) => n.as_str(),
            Some(Value::String(n)) => {
                return Err(bad(&format!(
                    "function.name {n:?} must be 1 to 64 letters, digits, `_`, `-` or `.`"
                )))
            }
            _ => return Err(bad("has no string `function.name`")),
        };
        if names.contains(&name) {
            return Err(bad(&format!("declares function {name:?} a second time")));
        }
        names.push(name);
        match f.get("parameters") {
            None | Some(Value::Null) | Some(Value::Object(_)) => {}
            Some(v) => {
                return Err(ApiError::wrong_type(
                    "tools",
                    format!("tools[{i}].function.parameters"),
                    "a JSON schema object",
                    v,
                ))
            }
        }
    }
    let choice = match field(o, "tool_choice") {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` {other:?} is not one of auto, none, required, or {{\"type\": \"function\", \"function\": {{\"name\": ..}}}}"),
                ))
            }
        },
        Some(Value::Object(c)) => {
            let name = c
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "`tool_choice` as an object must be {\"type\": \"function\", \"function\": {\"name\": ..}}",
                    )
                })?;
            if !names.contains(&name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` names function {name:?}, which `tools` does not declare"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(v) => {
            return Err(ApiError::wrong_type(
                "tool_choice",
                "`tool_choice`",
                "a string or an object",
                v,
            ))
        }
    };
    if tools.is_empty() && choice != ToolChoice::None {
        return Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` needs `tools`",
        ));
    }
    let parallel = boolean(o, "parallel_tool_calls")?.unwrap_or(true);
    if tools.is_empty() {
        return Ok(None);
    }
    Ok(Some(ToolSpec {
        tools,
        choice,
        parallel,
    }))
}

/// `response_format` and `grammar` (a Lark grammar as llguidance takes it).
fn grammar(o: &Map<String, Value>) -> Result<Option<Grammar>, ApiError> {
    let from_format = match field(o, "response_format") {
        None => None,
        Some(Value::Object(rf)) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Grammar::JsonSchema(json!({"type": "object"}))),
            Some("json_schema") => {
                let Some(Value::Object(js)) = rf.get("json_schema") else {
                    return Err(ApiError::invalid(
                        "response_format",
                        "`response_format` of type json_schema needs a `json_schema` object",
                    ));
                };
                let schema = match js.get("schema") {
                    Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
                    None | Some(Value::Null) => json!({}),
                    Some(v) => {
                        return Err(ApiError::wrong_type(
                            "response_format",
                            "`response_format.json_schema.schema`",
                            "a JSON schema object",
                            v,
                        ))
                    }
                };
                let strict = match js.get("strict") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(v) => {
                        return Err(ApiError::wrong_type(
                            "response_format",
                            "`response_format.json_schema.strict`",
                            "a boolean",
                            v,
                        ))
                    }
                };
                // Not strict: keywords the library does not know are
                // ignored rather than refused.
                let mut schema = schema;
                if let Value::Object(o) = &mut schema {
                    if !o.contains_key("x-guidance") {
                        let mut opts = crate::constrain::json_options();
                        opts["lenient"] = json!(!strict);
                        o.insert("x-guidance".into(), opts);
                    }
                }
                Some(Grammar::JsonSchema(schema))
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!(
                    "`response_format.type` {other:?} is not one of text, json_object, json_schema"
                ),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    "response_format",
                    "`response_format` has no `type`",
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::wrong_type(
                "response_format",
                "`response_format`",
                "an object",
                v,
            ))
        }
    };
    let lark = match field(o, "grammar") {
        None => None,
        Some(Value::String(g)) => Some(Grammar::Lark(g.clone())),
        Some(v) => {
            return Err(ApiError::wrong_type(
                "grammar",
                "`grammar`",
                "a string (a Lark grammar)",
                v,
            ))
        }
    };
    match (from_format, lark) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "grammar",
            "give `response_format` or `grammar`, not both",
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// `logit_bias`: `{"token id": bias}`, biases in [-100, 100].
fn logit_bias(o: &Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let m = match field(o, "logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(v) => {
            return Err(ApiError::wrong_type(
                "logit_bias",
                "`logit_bias`",
                "an object of token id to bias",
                v,
            ))
        }
    };
    m.iter()
        .map(|(k, v)| {
            let id: u32 = k.parse().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` key {k:?} is not a token id"),
                )
            })?;
            let b = v.as_f64().ok_or_else(|| {
                ApiError::wrong_type("logit_bias", format!("`logit_bias[{k:?}]`"), "a number", v)
            })?;
            if !(-100.0..=100.0).contains(&b) {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias[{k:?}]` must be between -100 and 100; got {b}"),
                ));
            }
            Ok((id, b as f32))
        })
        .collect()
}

/// `messages`, checked and normalised (see [`Prompt::Chat`]), and the
/// images of their `image_url` parts, each standing in its message's text
/// as one [`images::MARK`].
pub fn messages(o: &Map<String, Value>) -> Result<(Value, Vec<ImageIn>), ApiError> {
    let mut found = Vec::new();
    let list = match o.get("messages") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("messages", "`messages` is required"))
        }
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(ApiError::wrong_type(
                "messages",
                "`messages`",
                "an array",
                v,
            ))
        }
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(ApiError::wrong_type(
                "messages",
                format!("messages[{i}]"),
                "an object",
                m,
            ));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.as_str(),
            Some(Value::String(r)) => {
                return Err(ApiError::invalid(
                    "messages",
                    format!(
                        "messages[{i}].role {r:?} is not one of {}",
                        ROLES.join(", ")
                    ),
                ))
            }
            Some(v) => {
                return Err(ApiError::wrong_type(
                    "messages",
                    format!("messages[{i}].role"),
                    "a string",
                    v,
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("messages[{i}] has no `role`"),
                ))
            }
        };
        let content = match m.get("content") {
            None | Some(Value::Null) if role == "assistant" => Value::Null,
            None | Some(Value::Null) => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("messages[{i}] ({role}) has no `content`"),
                ))
            }
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => {
                let mut texts = Vec::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => texts.push(t.clone()),
                        (Some("image_url"), _) => {
                            let at = format!("messages[{i}].content[{j}]");
                            let url = match p.get("image_url") {
                                Some(Value::String(u)) => u.as_str(),
                                Some(Value::Object(u)) => match u.get("url") {
                                    Some(Value::String(u)) => u.as_str(),
                                    _ => {
                                        return Err(ApiError::invalid(
                                            "messages",
                                            format!("{at}.image_url has no string `url`"),
                                        ))
                                    }
                                },
                                _ => {
                                    return Err(ApiError::invalid(
                                        "messages",
                                        format!("{at} has no `image_url` object with a `url`"),
                                    ))
                                }
                            };
                            let bytes = images::from_url(url, &at, "messages")?;
                            found.push(ImageIn {
                                at,
                                bytes: Arc::new(bytes),
                            });
                            images::check_count(found.len(), "messages")?;
                            texts.push(images::MARK.to_string());
                        }
                        (Some(t @ ("input_audio" | "file" | "video_url" | "input_video")), _) => {
                            return Err(ApiError::invalid(
                                "messages",
                                format!("messages[{i}].content[{j}] is of type {t:?}; this server takes text and images only"),
                            ))
                        }
                        (Some("text"), _) => {
                            return Err(ApiError::invalid(
                                "messages",
                                format!("messages[{i}].content[{j}] has no string `text`"),
                            ))
                        }
                        (Some(other), _) => {
                            return Err(ApiError::invalid(
                                "messages",
                                format!("messages[{i}].content[{j}] is of type {other:?}; the content part types taken are \"text\" and \"image_url\""),
                            ))
                        }
                        (None, _) => {
                            return Err(ApiError::invalid(
                                "messages",
                                format!("messages[{i}].content[{j}] has no `type`"),
                            ))
                        }
                    }
                }
                Value::String(texts.join("\n"))
            }
            Some(v) => {
                return Err(ApiError::wrong_type(
                    "messages",
                    format!("messages[{i}].content"),
                    "a string or a list of content parts",
                    v,
                ))
            }
        };
        if let Some(calls) = field(m, "tool_calls") {
            check_tool_calls(i, calls)?;
        }
        // Keep what else the message carries (name, tool_calls, tool_call_id, ...).
        let mut nm = m.clone();
        // `developer` is OpenAI's newer name for `system`; templates know `system`.
        nm.insert(
            "role".into(),
            Value::String(if role == "developer" { "system" } else { role }.into()),
        );
        nm.insert("content".into(), content);
        out.push(Value::Object(nm));
    }
    Ok((Value::Array(out), found))
}

/// A message's `tool_calls` in OpenAI's shape: a list of objects, each
/// with a `function` object holding a string `name` and `arguments` as a
/// JSON string or an object. Anything else is refused naming the message and
/// the call, on every template: a template would otherwise read a missing
/// field as null (`{"name": null}`) and the tool-call rewriting would index
/// into a non-object.
fn check_tool_calls(i: usize, calls: &Value) -> Result<(), ApiError> {
    let Value::Array(list) = calls else {
        return Err(ApiError::wrong_type(
            "messages",
            format!("messages[{i}].tool_calls"),
            "a list of tool calls",
            calls,
        ));
    };
    for (j, c) in list.iter().enumerate() {
        let at = format!("messages[{i}].tool_calls[{j}]");
        let Value::Object(c) = c else {
            return Err(ApiError::wrong_type(
                "messages",
                at,
                "an object like {\"type\": \"function\", \"function\": {\"name\": .., \"arguments\": ..}}",
                c,
            ));
        };
        if let Some(t) = field(c, "type") {
            if t != "function" {
                return Err(ApiError::invalid(
                    "messages",
                    format!("{at}.type must be \"function\"; got {t}"),
                ));
            }
        }
        if let Some(id) = field(c, "id") {
            if !id.is_string() {
                return Err(ApiError::wrong_type(
                    "messages",
                    format!("{at}.id"),
                    "a string",
                    id,
                ));
            }
        }
        let f = match c.get("function") {
            Some(Value::Object(f)) => f,
            None => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("{at} has no `function`"),
                ))
            }
            Some(v) => {
                return Err(ApiError::wrong_type(
                    "messages",
                    format!("{at}.function"),
                    "an object",
                    v,
                ))
            }
        };
        match f.get("name") {
            Some(Value::String(n)) if !n.is_empty() => {}
            Some(Value::String(_)) => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("{at}.function.name must not be empty"),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("{at}.function has no `name`"),
                ))
            }
            Some(v) => {
                return Err(ApiError::wrong_type(
                    "messages",
                    format!("{at}.function.name"),
                    "a string",
                    v,
                ))
            }
        }
        match field(f, "arguments") {
            None | Some(Value::String(_)) | Some(Value::Object(_)) => {}
            Some(v) => {
                return Err(ApiError::wrong_type(
                    "messages",
                    format!("{at}.function.arguments"),
                    "a JSON string or an object",
                    v,
                ))
            }
        }
    }
    Ok(())
}

fn completion_prompt(o: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let bad = |what: String| ApiError::invalid("prompt", what);
    match o.get("prompt") {
        None | Some(Value::Null) => Err(bad("`prompt` is required".into())),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) => {
            if a.is_empty() {
                return Err(bad("`prompt` must not be empty".into()));
            }
            if a.iter().all(Value::is_number) {
                return tokens(a).map(Prompt::Tokens);
            }
            if a.len() > 1 {
                return Err(bad(
                    "one prompt per request: send a string, or a list of one string or of token ids".into(),
                ));
            }
            match &a[0] {
                Value::String(s) => Ok(Prompt::Text(s.clone())),
                Value::Array(t) if !t.is_empty() => tokens(t).map(Prompt::Tokens),
                v => Err(bad(format!("`prompt` list holds {}", type_name(v)))),
            }
        }
        Some(v) => Err(bad(format!(
            "`prompt` must be a string or a list; got {}",
            type_name(v)
        ))),
    }
}

fn tokens(a: &[Value]) -> Result<Vec<u32>, ApiError> {
    a.iter()
        .map(|t| {
            t.as_u64()
                .filter(|&x| x <= u64::from(u32::MAX))
                .map(|x| x as u32)
                .ok_or_else(|| {
                    ApiError::invalid("prompt", "token ids must be non-negative integers")
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        max_n: 4,
        max_tokens: 0,
        drafting: false,
    };

    fn chat(body: &str) -> Result<Request, ApiError> {
        parse(body.as_bytes(), Endpoint::Chat, L)
    }

    /// Issue 31, items 4 and 7b: a call that is not an object (or lacks a
    /// string name, or has arguments of another kind) is a 400 naming the
    /// message and the call; it used to panic or render `{"name": null}`.
    #[test]
    fn malformed_tool_calls_in_the_history_name_message_and_call() {
        for (calls, at) in [
            ("[1]", "messages[1].tool_calls[0]"),
            (r#"["x"]"#, "messages[1].tool_calls[0]"),
            ("[[]]", "messages[1].tool_calls[0]"),
            ("[null]", "messages[1].tool_calls[0]"),
            (r#""x""#, "messages[1].tool_calls"),
            ("{}", "messages[1].tool_calls"),
            (
                r#"[{"id":"a","type":"function","function":{"name":"f"}},2]"#,
                "messages[1].tool_calls[1]",
            ),
            (
                r#"[{"function":"f"}]"#,
                "messages[1].tool_calls[0].function",
            ),
            (
                r#"[{"type":"function"}]"#,
                "messages[1].tool_calls[0] has no `function`",
            ),
            (
                r#"[{"function":{"arguments":"{}"}}]"#,
                "messages[1].tool_calls[0].function has no `name`",
            ),
            (
                r#"[{"function":{"name":null}}]"#,
                "messages[1].tool_calls[0].function.name",
            ),
            (
                r#"[{"function":{"name":""}}]"#,
                "messages[1].tool_calls[0].function.name",
            ),
            (
                r#"[{"function":{"name":"f","arguments":[1]}}]"#,
                "messages[1].tool_calls[0].function.arguments",
            ),
            (
                r#"[{"type":"tool","function":{"name":"f"}}]"#,
                "messages[1].tool_calls[0].type",
            ),
        ] {
            let body = format!(
                r#"{{"messages":[{{"role":"user","content":"x"}},{{"role":"assistant","content":null,"tool_calls":{calls}}}]}}"#
            );
            let e = chat(&body).expect_err(calls);
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some("messages")),
                "{calls}"
            );
            assert!(e.message.contains(at), "{calls}: {}", e.message);
        }
        // Well-formed calls, arguments as a string, an object, or absent; null
        // tool_calls is no calls.
        for calls in [
            r#"[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]"#,
            r#"[{"function":{"name":"f","arguments":{"a":1}}},{"function":{"name":"g"}}]"#,
            "null",
            "[]",
        ] {
            let body = format!(
                r#"{{"messages":[{{"role":"user","content":"x"}},{{"role":"assistant","content":null,"tool_calls":{calls}}}]}}"#
            );
            assert!(chat(&body).is_ok(), "{calls}");
        }
    }

    /// Issue 31, item 8: an integer beyond 64 bits is quoted as sent, not
    /// as the f64 serde_json keeps (2^64 = 18446744073709551616 exactly;
    /// 2^64 + 1 has no f64 of its own).
    #[test]
    fn integers_beyond_64_bits_are_quoted_as_sent() {
        for big in ["18446744073709551616", "18446744073709551617"] {
            for field in ["max_tokens", "max_completion_tokens", "seed", "n"] {
                let body =
                    format!(r#"{{"messages":[{{"role":"user","content":"x"}}],"{field}":{big}}}"#);
                let e = chat(&body).expect_err(field);
                assert_eq!((e.status, e.param.as_deref()), (400, Some(field)));
                assert!(
                    e.message.contains(&format!("got {big}")) && !e.message.contains("e19"),
                    "{field}: {}",
                    e.message
                );
            }
        }
        // The largest u64 is still a seed.
        let r = chat(r#"{"messages":[{"role":"user","content":"x"}],"seed":18446744073709551615}"#)
            .unwrap();
        assert_eq!(r.seed, Some(u64::MAX));
    }

    #[test]
    fn good_request_with_defaults_and_unknown_fields() {
        let r = chat(r#"{"model":"x","messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"user","content":"hi"}],"whatever":{"a":1},"stop":"\n","max_completion_tokens":5,"max_tokens":9}"#).unwrap();
        let Prompt::Chat(m) = &r.prompt else { panic!() };
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[0]["content"], "a\nb");
        assert_eq!(r.max_tokens, Some(5));
        assert_eq!(r.stop, ["\n"]);
        assert_eq!((r.n, r.temperature, r.logprobs), (1, 1.0, None));
        // Issue 29: the field not read is named, the read ones are not.
        assert_eq!(r.ignored, ["whatever"]);
        assert_eq!(
            (r.min_p, r.typical_p, r.repeat_penalty),
            (0.0, 1.0, 1.0),
            "the extensions default to off"
        );
    }

    /// Issue 29: llama-server's sampler extensions are read on `/v1`, and
    /// checked by name.
    #[test]
    fn sampler_extensions_are_read_and_checked() {
        let r = chat(r#"{"messages":[{"role":"user","content":"hi"}],"min_p":0.05,"typical_p":0.9,"repeat_penalty":1.1,"repeat_last_n":-1,"totally_bogus_field":1}"#).unwrap();
        assert_eq!((r.min_p, r.typical_p, r.repeat_penalty), (0.05, 0.9, 1.1));
        assert_eq!(r.repeat_last_n, None, "-1 is the whole context");
        assert_eq!(r.ignored, ["totally_bogus_field"]);
        let r =
            chat(r#"{"messages":[{"role":"user","content":"hi"}],"repeat_penalty":1.2}"#).unwrap();
        assert_eq!(r.repeat_last_n, Some(DEFAULT_REPEAT_LAST_N));
        for (field, value) in [
            ("min_p", "1.5"),
            ("typical_p", "-0.1"),
            ("repeat_penalty", "0"),
            ("repeat_penalty", "11"),
            ("repeat_last_n", "-2"),
        ] {
            let body =
                format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"{field}":{value}}}"#);
            let e = chat(&body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn bad_requests_name_their_parameter() {
        for (body, param) in [
            ("{", None),
            ("[]", None),
            (r#"{"messages":[]}"#, Some("messages")),
            (r#"{"messages":"hi"}"#, Some("messages")),
            (
                r#"{"messages":[{"role":"wizard","content":"x"}]}"#,
                Some("messages"),
            ),
            (r#"{"messages":[{"role":"user"}]}"#, Some("messages")),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
                Some("messages"),
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                Some("max_tokens"),
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":"5"}"#,
                Some("max_tokens"),
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"temperature":3}"#,
                Some("temperature"),
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"n":5}"#,
                Some("n"),
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"stop":[1]}"#,
                Some("stop"),
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#,
                Some("top_logprobs"),
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                Some("stream"),
            ),
        ] {
            let e = chat(body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
        }
    }

    const TOOL: &str =
        r#"{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}"#;

    #[test]
    fn tools_response_format_and_logit_bias_parse() {
        let r = chat(&format!(
            r#"{{"messages":[{{"role":"user","content":"x"}}],"tools":[{TOOL}],"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}},"parallel_tool_calls":false,"logit_bias":{{"7":-100,"9":2.5}}}}"#
        ))
        .unwrap();
        let t = r.tools.unwrap();
        assert_eq!(t.choice, ToolChoice::Named("get_weather".into()));
        assert!(!t.parallel && t.forced());
        assert_eq!(r.logit_bias, [(7, -100.0), (9, 2.5)]);
        // Tools given, no choice: auto.
        let r = chat(&format!(
            r#"{{"messages":[{{"role":"user","content":"x"}}],"tools":[{TOOL}]}}"#
        ))
        .unwrap();
        assert_eq!(r.tools.unwrap().choice, ToolChoice::Auto);
        let r = chat(r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","strict":true,"schema":{"type":"object"}}}}"#).unwrap();
        let Some(Grammar::JsonSchema(s)) = r.grammar else {
            panic!()
        };
        // strict: keywords llguidance does not know are refused, not ignored.
        assert_eq!(s["x-guidance"]["lenient"], false);
        let r = chat(r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object"}}}}"#).unwrap();
        let Some(Grammar::JsonSchema(s)) = r.grammar else {
            panic!()
        };
        assert_eq!(s["x-guidance"]["lenient"], true);
        let r = chat(
            r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}}"#,
        )
        .unwrap();
        assert!(r.grammar.is_none());
    }

    #[test]
    fn bad_tool_and_format_fields_name_their_parameter() {
        let m = r#""messages":[{"role":"user","content":"x"}]"#;
        for (rest, param) in [
            (r#""tools":{}"#.to_string(), "tools"),
            (r#""tools":[{"type":"retrieval"}]"#.into(), "tools"),
            (
                r#""tools":[{"type":"function","function":{"name":"a b"}}]"#.into(),
                "tools",
            ),
            (format!(r#""tools":[{TOOL},{TOOL}]"#), "tools"),
            (r#""tool_choice":"required""#.into(), "tool_choice"),
            (
                format!(r#""tools":[{TOOL}],"tool_choice":"always""#),
                "tool_choice",
            ),
            (
                format!(
                    r#""tools":[{TOOL}],"tool_choice":{{"type":"function","function":{{"name":"other"}}}}"#
                ),
                "tool_choice",
            ),
            (
                format!(r#""tools":[{TOOL}],"parallel_tool_calls":"yes""#),
                "parallel_tool_calls",
            ),
            (
                format!(r#""tools":[{TOOL}],"tool_choice":"required","grammar":"start: \"a\"""#),
                "tool_choice",
            ),
            (
                r#""response_format":{"type":"xml"}"#.into(),
                "response_format",
            ),
            (
                r#""response_format":{"type":"json_schema"}"#.into(),
                "response_format",
            ),
            (
                r#""response_format":{"type":"json_object"},"grammar":"start: \"a\"""#.into(),
                "grammar",
            ),
            (r#""grammar":5"#.into(), "grammar"),
            (r#""logit_bias":{"x":1}"#.into(), "logit_bias"),
            (r#""logit_bias":{"1":100.5}"#.into(), "logit_bias"),
            (r#""logit_bias":{"1":-101}"#.into(), "logit_bias"),
            (r#""logit_bias":[1]"#.into(), "logit_bias"),
        ] {
            let body = format!("{{{m},{rest}}}");
            let e = chat(&body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
        // The edges of the bias range are allowed.
        assert!(chat(&format!(r#"{{{m},"logit_bias":{{"1":100,"2":-100}}}}"#)).is_ok());
    }

    #[test]
    fn speculative_switches_drafting_and_is_refused_without_a_drafter() {
        let drafting = Limits {
            drafting: true,
            ..L
        };
        let p = |b: &str, l: Limits| parse(b.as_bytes(), Endpoint::Completions, l);
        assert!(p(r#"{"prompt":"a"}"#, drafting).unwrap().speculative);
        assert!(
            !p(r#"{"prompt":"a","speculative":false}"#, drafting)
                .unwrap()
                .speculative
        );
        assert!(
            p(r#"{"prompt":"a","speculative":true}"#, drafting)
                .unwrap()
                .speculative
        );
        // Off is always fine; on needs a server that drafts.
        assert!(
            !p(r#"{"prompt":"a","speculative":false}"#, L)
                .unwrap()
                .speculative
        );
        for (body, l) in [
            (r#"{"prompt":"a","speculative":true}"#, L),
            (r#"{"prompt":"a","speculative":"no"}"#, drafting),
        ] {
            let e = p(body, l).unwrap_err();
            assert_eq!(
                e.param.as_deref(),
                Some("speculative"),
                "{body}: {}",
                e.message
            );
        }
    }

    #[test]
    fn completion_prompts() {
        let p = |b: &str| parse(b.as_bytes(), Endpoint::Completions, L).map(|r| r.prompt);
        assert!(matches!(p(r#"{"prompt":"a"}"#), Ok(Prompt::Text(s)) if s == "a"));
        assert!(matches!(p(r#"{"prompt":["a"]}"#), Ok(Prompt::Text(_))));
        assert!(matches!(p(r#"{"prompt":[1,2]}"#), Ok(Prompt::Tokens(t)) if t == [1, 2]));
        assert!(p(r#"{"prompt":["a","b"]}"#).is_err());
        assert!(p(r#"{"prompt":[-1]}"#).is_err());
        assert!(p(r#"{}"#).is_err());
    }
}
