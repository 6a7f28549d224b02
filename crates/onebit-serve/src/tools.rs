//! Tool calls: the formats models write them in (as data), which one a
//! template speaks, the generic fallback for templates that know no tools,
//! parsing a reply (whole or streamed) into OpenAI's `tool_calls`, and the
//! grammar that forces a valid call under `tool_choice` required or named.

use serde_json::{json, Map, Value};

use crate::constrain::{json_options, json_options_with, Grammar};
use crate::schema_check;
use crate::tool_args::{ArgEvent, ArgScanner};

/// How a call's payload is written between the markers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// One `{"name": .., <args_key>: {..}}` per block.
    Object,
    /// One block holding a list of such objects.
    Array,
    /// `{"tool_calls": [{"name": .., "arguments": {..}}, ..]}` as the whole reply.
    Envelope,
    /// A Python list of calls with keyword arguments: `[f(a='x', n=2), g()]`.
    Pythonic,
    /// Gemma's own: `call:name{key:<ESC>text<ESC>,n:2,o:{k:true},l:[1,2]}`,
    /// strings between the given escape marker, other values bare.
    Gemma(&'static str),
    /// A harmony call as `harmony::HarmonySplitter` writes it: one
    /// `{"name": .., "arguments": BODY}` per block, BODY the model's text. A
    /// block whose BODY is no JSON gives BODY as content; an unclosed block
    /// (a call cut by `max_tokens`: the splitter closes every other) is
    /// dropped.
    Harmony,
}

impl Body {
    /// Whether a forced call can be written in this body under a JSON
    /// grammar (harmony: its own call message, the arguments JSON); the
    /// others (Python literals, Gemma's syntax) are forced in the generic
    /// JSON envelope instead (a grammar of those syntaxes from a JSON schema
    /// is not built here).
    pub fn json_forcible(self) -> bool {
        matches!(
            self,
            Body::Object | Body::Array | Body::Envelope | Body::Harmony
        )
    }
}

/// A tool-call format: what the model writes to call a function.
#[derive(Debug, PartialEq, Eq)]
pub struct CallFormat {
    pub name: &'static str,
    /// A template speaks this format when its source holds one of these.
    pub detect: &'static [&'static str],
    /// Text that opens a call block; "" means the reply itself is the call
    /// (it starts with `{`).
    pub open: &'static str,
    /// Text that closes a block; "" means it runs to the end of the reply.
    pub close: &'static str,
    pub body: Body,
    /// The key holding the arguments.
    pub args_key: &'static str,
    /// The reply was forced to be calls (`tool_choice` required or named):
    /// text beside the calls can only be a call cut by `max_tokens`, which
    /// is dropped, never given as content.
    pub forced: bool,
}

/// Hermes / Qwen2.5 / Qwen3 / SmolLM3: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`.
pub const HERMES: CallFormat = CallFormat {
    name: "hermes",
    detect: &["<tool_call>"],
    open: "<tool_call>",
    close: "</tool_call>",
    body: Body::Object,
    args_key: "arguments",
    forced: false,
};

/// Mistral (v3 tokenizer on): `[TOOL_CALLS][{"name": .., "arguments": {..}}]`.
pub const MISTRAL: CallFormat = CallFormat {
    name: "mistral",
    detect: &["[TOOL_CALLS]"],
    open: "[TOOL_CALLS]",
    close: "",
    body: Body::Array,
    args_key: "arguments",
    forced: false,
};

/// Llama 3.1–3.3 JSON tool calling: the reply is `{"name": .., "parameters": {..}}`
/// (after `<|python_tag|>` in some fine-tunes).
pub const LLAMA3: CallFormat = CallFormat {
    name: "llama3-json",
    detect: &["<|python_tag|>", "\"parameters\": "],
    open: "",
    close: "",
    body: Body::Object,
    args_key: "parameters",
    forced: false,
};

/// LFM2 / LFM2.5: `<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>`.
/// A forced call is written in the generic JSON envelope instead (a
/// grammar of Python literals from a JSON schema is not built here).
pub const LFM2: CallFormat = CallFormat {
    name: "lfm2-pythonic",
    detect: &["<|tool_list_start|>", "<|tool_call_start|>"],
    open: "<|tool_call_start|>",
    close: "<|tool_call_end|>",
    body: Body::Pythonic,
    args_key: "arguments",
    forced: false,
};

/// FunctionGemma (Gemma 3 270M tuned for calls): declarations between
/// `<start_function_declaration>` markers, a call as
/// `<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>`
/// (ai.google.dev "FunctionGemma formatting and best practices").
pub const FUNCTIONGEMMA: CallFormat = CallFormat {
    name: "functiongemma",
    detect: &["<start_function_call>", "<start_function_declaration>"],
    open: "<start_function_call>",
    close: "<end_function_call>",
    body: Body::Gemma("<escape>"),
    args_key: "arguments",
    forced: false,
};

/// Gemma 4: the same call syntax between `<|tool_call>` and `<tool_call|>`,
/// strings between `<|"|>`.
pub const GEMMA4: CallFormat = CallFormat {
    name: "gemma4",
    detect: &["<|tool_call>"],
    open: "<|tool_call>",
    close: "<tool_call|>",
    body: Body::Gemma("<|\"|>"),
    args_key: "arguments",
    forced: false,
};

/// The character that opens and closes [`HARMONY`]'s markers; removed from
/// the model's text, so only the splitter writes it.
pub const HARMONY_RESERVED: char = '\u{1}';

/// Harmony (gpt-oss): calls are messages addressed `to=functions.NAME`;
/// `harmony::HarmonySplitter` turns each into one of these blocks. Selected
/// by the model's declared reply format (`harmony::declared`), never by
/// detection in the template.
pub const HARMONY: CallFormat = CallFormat {
    name: "harmony",
    detect: &[],
    open: "\u{1}harmony-call\u{1}",
    close: "\u{1}harmony-end\u{1}",
    body: Body::Harmony,
    args_key: "arguments",
    forced: false,
};

/// The fallback for templates that know no tools: the tools are described in
/// a system message and the model answers with a JSON envelope.
pub const GENERIC: CallFormat = CallFormat {
    name: "generic-json",
    detect: &[],
    open: "",
    close: "",
    body: Body::Envelope,
    args_key: "arguments",
    forced: false,
};

/// The forced variants of the formats a forced call is written in
/// ([`Body::json_forcible`] ones and the generic envelope).
const FORCED_HERMES: CallFormat = CallFormat {
    forced: true,
    ..HERMES
};
const FORCED_MISTRAL: CallFormat = CallFormat {
    forced: true,
    ..MISTRAL
};
const FORCED_LLAMA3: CallFormat = CallFormat {
    forced: true,
    ..LLAMA3
};
const FORCED_HARMONY: CallFormat = CallFormat {
    forced: true,
    ..HARMONY
};
const FORCED_GENERIC: CallFormat = CallFormat {
    forced: true,
    ..GENERIC
};

/// `f` for a reply forced to be calls (see [`CallFormat::forced`]); a
/// format that cannot be forced is written as the generic envelope.
pub fn forced(f: &'static CallFormat) -> &'static CallFormat {
    [
        &FORCED_HERMES,
        &FORCED_MISTRAL,
        &FORCED_LLAMA3,
        &FORCED_HARMONY,
    ]
    .into_iter()
    .find(|g| g.name == f.name)
    .unwrap_or(&FORCED_GENERIC)
}

/// The formats tried in order on a template's source.
pub const FORMATS: [&CallFormat; 6] = [&HERMES, &MISTRAL, &LFM2, &FUNCTIONGEMMA, &GEMMA4, &LLAMA3];

/// The format a template speaks, or `None` when it knows no tools (it never
/// reads `tools`, or writes calls in a way not listed here).
pub fn detect(template: &str) -> Option<&'static CallFormat> {
    if !template.contains("tools") {
        return None;
    }
    FORMATS
        .into_iter()
        .find(|f| f.detect.iter().any(|d| template.contains(d)))
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// A request's tools, checked.
#[derive(Clone, Debug)]
pub struct ToolSpec {
    /// As sent, each `{"type": "function", "function": {..}}`.
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolSpec {
    fn functions(&self) -> impl Iterator<Item = &Value> {
        self.tools.iter().map(|t| &t["function"])
    }

    /// The functions a forced reply may call: the named one, or all.
    fn allowed(&self) -> impl Iterator<Item = &Value> {
        self.functions().filter(|func| match &self.choice {
            ToolChoice::Named(n) => func["name"].as_str() == Some(n),
            _ => true,
        })
    }

    /// The declared function names.
    pub fn names(&self) -> Vec<&str> {
        self.functions()
            .filter_map(|f| f["name"].as_str())
            .collect()
    }

    /// The model's output must be a call.
    pub fn forced(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }

    /// Replies are parsed for calls.
    pub fn parsed(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The lenient rule ([`lenient_call`]) applies: `tool_choice` auto.
    pub fn lenient(&self) -> bool {
        self.choice == ToolChoice::Auto
    }
}

/// One parsed call: the function name and its arguments as a JSON string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

fn call_of(v: &Value, args_key: &str) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get(args_key)
        .or_else(|| v.get("arguments"))
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(Call { name, arguments })
}

/// The calls one JSON payload holds.
fn calls_in(payload: &str, f: &CallFormat) -> Option<Vec<Call>> {
    match f.body {
        Body::Pythonic => return pythonic_calls(payload),
        Body::Gemma(esc) => return gemma_call(payload, esc).map(|c| vec![c]),
        _ => {}
    }
    let mut de = serde_json::Deserializer::from_str(payload.trim()).into_iter::<Value>();
    let v = de.next()?.ok()?;
    // Nothing but whitespace (or Llama's `;` between calls) may follow.
    let rest = payload.trim()[de.byte_offset()..].trim();
    if !rest.is_empty() {
        let more = if f.body == Body::Object && f.open.is_empty() {
            calls_in(rest.strip_prefix(';')?, f)?
        } else {
            return None;
        };
        let mut first = calls_in_value(&v, f)?;
        first.extend(more);
        return Some(first);
    }
    calls_in_value(&v, f)
}

fn calls_in_value(v: &Value, f: &CallFormat) -> Option<Vec<Call>> {
    let list = match (f.body, v) {
        (Body::Object | Body::Harmony, Value::Object(_)) => {
            return Some(vec![call_of(v, f.args_key)?])
        }
        (Body::Array, Value::Array(a)) => a,
        (Body::Array, Value::Object(_)) => return Some(vec![call_of(v, f.args_key)?]),
        (Body::Envelope, Value::Object(o)) => o.get("tool_calls")?.as_array()?,
        _ => return None,
    };
    list.iter().map(|c| call_of(c, f.args_key)).collect()
}

/// One Gemma call, `call:name{key:value,..}`: a value is a string between
/// `esc` markers, an object `{..}`, a list `[..]`, or a bare JSON scalar
/// (a number, true, false, null; other bare text is taken as a string).
pub fn gemma_call(payload: &str, esc: &str) -> Option<Call> {
    let s = payload.trim().strip_prefix("call:")?;
    let brace = s.find('{')?;
    let name = s[..brace].trim();
    let ident = |c: char| c.is_alphanumeric() || "_-.".contains(c);
    if name.is_empty() || !name.chars().all(ident) {
        return None;
    }
    let mut g = Gem { s, i: brace, esc };
    let args = g.value(0)?;
    if !args.is_object() || !g.s[g.i..].trim().is_empty() {
        return None;
    }
    Some(Call {
        name: name.to_string(),
        arguments: args.to_string(),
    })
}

/// A cursor over Gemma's value syntax.
struct Gem<'a> {
    s: &'a str,
    i: usize,
    esc: &'a str,
}

impl Gem<'_> {
    fn rest(&self) -> &str {
        &self.s[self.i..]
    }

    fn ws(&mut self) {
        let r = self.rest();
        self.i += r.len() - r.trim_start().len();
    }

    fn eat(&mut self, c: char) -> bool {
        self.ws();
        if self.rest().starts_with(c) {
            self.i += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > 64 {
            return None;
        }
        self.ws();
        if let Some(r) = self.rest().strip_prefix(self.esc) {
            let end = r.find(self.esc)?;
            let text = r[..end].to_string();
            self.i += self.esc.len() + end + self.esc.len();
            return Some(Value::String(text));
        }
        if self.eat('{') {
            let mut o = Map::new();
            if self.eat('}') {
                return Some(Value::Object(o));
            }
            loop {
                self.ws();
                let colon = self.rest().find(':')?;
                let key = self.rest()[..colon].trim().to_string();
                if key.is_empty() || key.contains([',', '{', '}', '[', ']']) {
                    return None;
                }
                self.i += colon + 1;
                let v = self.value(depth + 1)?;
                o.insert(key, v);
                if self.eat(',') {
                    continue;
                }
                return self.eat('}').then_some(Value::Object(o));
            }
        }
        if self.eat('[') {
            let mut a = Vec::new();
            if self.eat(']') {
                return Some(Value::Array(a));
            }
            loop {
                a.push(self.value(depth + 1)?);
                if self.eat(',') {
                    continue;
                }
                return self.eat(']').then_some(Value::Array(a));
            }
        }
        let r = self.rest();
        let end = r.find([',', '}', ']']).unwrap_or(r.len());
        let bare = r[..end].trim().to_string();
        if bare.is_empty() {
            return None;
        }
        self.i += end;
        Some(serde_json::from_str::<Value>(&bare).unwrap_or(Value::String(bare)))
    }
}

/// `[f(a='x', n=2), g()]`: Python literals (strings in either quotes,
/// numbers, True/False/None and JSON's true/false/null, lists, dicts) as
/// JSON arguments, in the order written.
pub fn pythonic_calls(text: &str) -> Option<Vec<Call>> {
    let mut p = Py {
        s: text.trim().as_bytes(),
        i: 0,
    };
    p.eat(b'[')?;
    let mut calls = Vec::new();
    loop {
        p.ws();
        if p.eat(b']').is_some() {
            break;
        }
        if !calls.is_empty() {
            p.eat(b',')?;
            p.ws();
        }
        let name = p.ident()?;
        p.ws();
        p.eat(b'(')?;
        let mut args = Map::new();
        loop {
            p.ws();
            if p.eat(b')').is_some() {
                break;
            }
            if !args.is_empty() {
                p.eat(b',')?;
                p.ws();
                if p.eat(b')').is_some() {
                    break;
                }
            }
            let k = p.ident()?;
            p.ws();
            p.eat(b'=')?;
            p.ws();
            let v = p.value(0)?;
            args.insert(k, v);
        }
        calls.push(Call {
            name,
            arguments: Value::Object(args).to_string(),
        });
    }
    (p.i == p.s.len()).then_some(calls)
}

struct Py<'a> {
    s: &'a [u8],
    i: usize,
}

impl Py<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.s.get(self.i) == Some(&c)).then(|| self.i += 1)
    }
    fn ident(&mut self) -> Option<String> {
        let start = self.i;
        while self
            .s
            .get(self.i)
            .is_some_and(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
        {
            self.i += 1;
        }
        (self.i > start).then(|| String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }
    /// One literal; `depth` bounds nesting.
    fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > 64 {
            return None;
        }
        self.ws();
        let c = *self.s.get(self.i)?;
        match c {
            b'\'' | b'"' => self.string(c).map(Value::String),
            b'[' | b'(' => {
                let close = if c == b'[' { b']' } else { b')' };
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    if self.eat(close).is_some() {
                        return Some(Value::Array(items));
                    }
                    if !items.is_empty() {
                        self.eat(b',')?;
                        self.ws();
                        if self.eat(close).is_some() {
                            return Some(Value::Array(items));
                        }
                    }
                    items.push(self.value(depth + 1)?);
                }
            }
            b'{' => {
                self.i += 1;
                let mut m = Map::new();
                loop {
                    self.ws();
                    if self.eat(b'}').is_some() {
                        return Some(Value::Object(m));
                    }
                    if !m.is_empty() {
                        self.eat(b',')?;
                        self.ws();
                    }
                    let q = *self.s.get(self.i)?;
                    let k = if q == b'\'' || q == b'"' {
                        self.string(q)?
                    } else {
                        self.ident()?
                    };
                    self.ws();
                    self.eat(b':')?;
                    let v = self.value(depth + 1)?;
                    m.insert(k, v);
                }
            }
            _ => {
                let w = self.ident()?;
                match w.as_str() {
                    "True" | "true" => Some(Value::Bool(true)),
                    "False" | "false" => Some(Value::Bool(false)),
                    "None" | "null" => Some(Value::Null),
                    num => {
                        // A number: ident() stops before a sign or exponent sign.
                        let mut t = num.to_string();
                        while let Some(&c) = self.s.get(self.i) {
                            if matches!(c, b'+' | b'-') && (t.ends_with('e') || t.ends_with('E')) {
                                self.i += 1;
                                t.push(c as char);
                                t.push_str(&self.ident().unwrap_or_default());
                            } else {
                                break;
                            }
                        }
                        serde_json::from_str::<serde_json::Number>(&t)
                            .ok()
                            .map(Value::Number)
                    }
                }
            }
        }
    }
    fn string(&mut self, q: u8) -> Option<String> {
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let c = *self.s.get(self.i)?;
            self.i += 1;
            match c {
                b'\\' => {
                    let e = *self.s.get(self.i)?;
                    self.i += 1;
                    out.push(match e {
                        b'n' => b'\n',
                        b't' => b'\t',
                        b'r' => b'\r',
                        other => other,
                    });
                }
                c if c == q => return String::from_utf8(out).ok(),
                c => out.push(c),
            }
        }
    }
}

/// Splits a whole reply into its text and its calls. A reply whose call
/// blocks do not parse is all text (the client sees what the model wrote).
pub fn parse(text: &str, f: &CallFormat) -> (String, Vec<Call>) {
    let (content, calls) = parse_any(text, f);
    if f.forced {
        // The grammar admitted calls only: the rest is a cut call's markup.
        return (String::new(), calls);
    }
    (content, calls)
}

fn parse_any(text: &str, f: &CallFormat) -> (String, Vec<Call>) {
    if f.body == Body::Harmony {
        return parse_harmony(text, f);
    }
    if f.open.is_empty() {
        let t = text.trim_start();
        let t = t.strip_prefix("<|python_tag|>").unwrap_or(t);
        if t.starts_with('{') || (f.body == Body::Array && t.starts_with('[')) {
            if let Some(calls) = calls_in(t, f) {
                if !calls.is_empty() {
                    return (String::new(), calls);
                }
            }
        }
        return (text.to_string(), Vec::new());
    }
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(f.open) {
        content.push_str(&rest[..at]);
        let after = &rest[at + f.open.len()..];
        let (payload, next, closed) = if f.close.is_empty() {
            (after, "", true)
        } else {
            match after.find(f.close) {
                Some(end) => (&after[..end], &after[end + f.close.len()..], true),
                // Unclosed: the stop came first, or max_tokens cut it.
                None => (after, "", false),
            }
        };
        match calls_in(payload, f) {
            Some(c) => calls.extend(c),
            // A cut last block stays text beside the whole calls before it.
            None if !closed && !calls.is_empty() => {
                content.push_str(&rest[at..]);
                rest = "";
                break;
            }
            None => return (text.to_string(), Vec::new()),
        }
        rest = next;
    }
    content.push_str(rest);
    if calls.is_empty() {
        return (text.to_string(), calls);
    }
    (content.trim().to_string(), calls)
}

/// [`Body::Harmony`] blocks: each whole one a call (or, when its BODY is no
/// JSON, BODY as content), an unclosed one dropped.
fn parse_harmony(text: &str, f: &CallFormat) -> (String, Vec<Call>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(f.open) {
        content.push_str(&rest[..at]);
        let after = &rest[at + f.open.len()..];
        let Some(end) = after.find(f.close) else {
            rest = "";
            break;
        };
        let payload = &after[..end];
        match calls_in(payload, f) {
            Some(c) => calls.extend(c),
            None => {
                // `{"name": <string>, "arguments": BODY}`: BODY is what the
                // model wrote.
                let body = payload
                    .find(", \"arguments\": ")
                    .map(|i| &payload[i + ", \"arguments\": ".len()..])
                    .and_then(|b| b.strip_suffix('}'))
                    .unwrap_or("");
                content.push_str(body);
            }
        }
        rest = &after[end + f.close.len()..];
    }
    content.push_str(rest);
    let content = content.replace(HARMONY_RESERVED, "");
    if calls.is_empty() {
        return (content, calls);
    }
    (content.trim().to_string(), calls)
}

/// The lenient rule (issue 29), under `tool_choice: auto`: a reply that is
/// exactly one JSON object, bare or in one fenced block (```` ``` ```` or
/// ```` ```json ````), holding only `name`, a declared tool's, and
/// `arguments` (or `parameters`), an object that passes that tool's
/// parameter schema ([`schema_check`]; none declared: any object), is that
/// tool's call. Small models (Qwen2.5-Coder 0.5B and 1.5B) write their calls
/// so rather than in their template's markup. A name not declared,
/// arguments that fail (or use a keyword the checker cannot check), two
/// objects, other keys, or any text around the object: no call, the reply
/// stays content.
pub fn lenient_call(text: &str, spec: &ToolSpec) -> Option<Call> {
    let t = text.trim();
    let body = match t.strip_prefix("```") {
        Some(fenced) => {
            let inner = fenced.strip_suffix("```")?;
            let (info, rest) = inner.split_once(char::is_whitespace)?;
            if !(info.is_empty() || info == "json") {
                return None;
            }
            rest.trim()
        }
        None => t,
    };
    if !body.starts_with('{') {
        return None;
    }
    // One value and nothing after it (serde_json refuses trailing text).
    let v: Value = serde_json::from_str(body).ok()?;
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?;
    let mut others = o.keys().filter(|k| *k != "name");
    let key = others.next()?;
    if others.next().is_some() || !(key == "arguments" || key == "parameters") {
        return None;
    }
    let args = &o[key];
    let f = spec
        .functions()
        .find(|f| f["name"].as_str() == Some(name))?;
    let params = match f.get("parameters") {
        Some(p @ (Value::Object(_) | Value::Bool(_))) => p.clone(),
        _ => json!({"type": "object"}),
    };
    if !args.is_object() || schema_check::check(args, &params).is_err() {
        return None;
    }
    Some(Call {
        name: name.to_string(),
        arguments: args.to_string(),
    })
}

/// [`parse`], then, when it finds no call and `spec` says `tool_choice`
/// auto, the lenient rule ([`lenient_call`]) on the whole reply.
pub fn parse_reply(text: &str, f: &CallFormat, spec: Option<&ToolSpec>) -> (String, Vec<Call>) {
    let (content, calls) = parse(text, f);
    if calls.is_empty() && !f.forced {
        if let Some(call) = spec
            .filter(|s| s.lenient())
            .and_then(|s| lenient_call(text, s))
        {
            return (String::new(), vec![call]);
        }
    }
    (content, calls)
}

/// How a streamed reply's start stands for the lenient rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lenient {
    /// Not applied (no `tool_choice` auto), or already decided by the start.
    Off,
    /// Only whitespace (or the start of a fence) so far.
    Undecided,
    /// The reply begins with `{` or a fence: all of it is held to the end.
    Holding,
}

/// What a reply's first text says for the lenient rule.
enum Start {
    Wait,
    Object,
    Fence,
    Other,
}

fn lenient_start(text: &str) -> Start {
    let t = text.trim_start();
    if t.is_empty() || "```".starts_with(t) {
        return Start::Wait;
    }
    if t.starts_with('{') {
        return Start::Object;
    }
    let Some(info) = t.strip_prefix("```") else {
        return Start::Other;
    };
    match info.find(char::is_whitespace) {
        Some(end) if info[..end].is_empty() || &info[..end] == "json" => Start::Fence,
        Some(_) => Start::Other,
        None if "json".starts_with(info) => Start::Wait,
        None => Start::Other,
    }
}

/// Streams a reply's text while holding back what may be a call, which is
/// parsed whole when the reply ends. With [`ToolStream::with_tools`] under
/// `tool_choice: auto`, a reply that begins with `{` or a fence is held
/// whole until it ends, when the lenient rule decides ([`lenient_call`]).
pub struct ToolStream {
    f: &'static CallFormat,
    /// Text not yet given out: a possible start of the open marker, or (once
    /// a call has begun) everything since.
    held: String,
    in_call: bool,
    /// Any non-whitespace text has gone out (a reply-is-the-call format then
    /// cannot be a call any more).
    spoke: bool,
    /// For JSON formats, the scanner streaming calls' arguments.
    args: Option<ArgScanner>,
    /// Whether calls' arguments are scanned as they are written (`new`), or
    /// the calls only given whole at the end (`whole`: nothing recorded).
    scan_args: bool,
    /// The request's tools, for the lenient rule.
    tools: Option<ToolSpec>,
    lenient: Lenient,
}

impl ToolStream {
    /// Holds calls back and records their arguments' fragments as they
    /// are written ([`ToolStream::take_events`]).
    pub fn new(f: &'static CallFormat) -> ToolStream {
        ToolStream {
            f,
            held: String::new(),
            in_call: false,
            spoke: false,
            args: None,
            scan_args: true,
            tools: None,
            lenient: Lenient::Off,
        }
    }

    /// Applies the lenient rule ([`lenient_call`]) when `spec` says
    /// `tool_choice` auto: a reply that begins with `{` or a fence is held
    /// back whole until it ends.
    pub fn with_tools(mut self, spec: Option<&ToolSpec>) -> ToolStream {
        if let Some(s) = spec.filter(|s| s.lenient() && !self.f.forced) {
            self.tools = Some(s.clone());
            self.lenient = Lenient::Undecided;
        }
        self
    }

    /// Holds calls back and gives them whole at [`ToolStream::finish`], with
    /// no fragment events (Ollama's stream sends a call in one piece).
    pub fn whole(f: &'static CallFormat) -> ToolStream {
        ToolStream {
            scan_args: false,
            ..ToolStream::new(f)
        }
    }

    /// Calls begun and argument fragments found since the last call (JSON
    /// formats; the others give their calls whole at [`ToolStream::finish`]).
    pub fn take_events(&mut self) -> Vec<ArgEvent> {
        self.args.as_mut().map(ArgScanner::take).unwrap_or_default()
    }

    /// A call has begun: `text` is the held text from the call's start.
    fn begin_call(&mut self, text: &str) {
        self.in_call = true;
        if !self.scan_args {
            return;
        }
        let depth = match self.f.body {
            Body::Object | Body::Harmony => 1,
            Body::Array => 2,
            Body::Envelope => 3,
            Body::Pythonic | Body::Gemma(_) => return,
        };
        let mut sc = ArgScanner::new(depth, self.f.args_key);
        sc.feed(text);
        self.args = Some(sc);
    }

    /// The text that can go out now.
    pub fn push(&mut self, piece: &str) -> String {
        if self.lenient == Lenient::Holding {
            self.held.push_str(piece);
            return String::new();
        }
        if self.lenient == Lenient::Undecided && !self.in_call {
            self.held.push_str(piece);
            match lenient_start(&self.held) {
                Start::Wait => return String::new(),
                // A format whose call is the reply itself holds it anyway
                // (and streams its arguments); the rule is tried at the end.
                Start::Object if !self.f.open.is_empty() => {
                    self.lenient = Lenient::Holding;
                    return String::new();
                }
                Start::Fence => {
                    self.lenient = Lenient::Holding;
                    return String::new();
                }
                Start::Object | Start::Other => {
                    self.lenient = Lenient::Off;
                    return self.push_format("");
                }
            }
        }
        self.push_format(piece)
    }

    /// [`ToolStream::push`] by the format's own markers.
    fn push_format(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        if self.in_call {
            if let Some(sc) = self.args.as_mut() {
                sc.feed(piece);
            }
            return String::new();
        }
        if self.f.open.is_empty() {
            if self.spoke {
                return std::mem::take(&mut self.held);
            }
            let t = self.held.trim_start();
            if t.is_empty() || "<|python_tag|>".starts_with(t) {
                return String::new();
            }
            let t = t.strip_prefix("<|python_tag|>").unwrap_or(t).trim_start();
            if t.is_empty() {
                return String::new();
            }
            if t.starts_with('{') || (self.f.body == Body::Array && t.starts_with('[')) {
                let held = self.held.clone();
                self.begin_call(&held);
                return String::new();
            }
            self.spoke = true;
            return std::mem::take(&mut self.held);
        }
        if let Some(at) = self.held.find(self.f.open) {
            let out = self.held[..at].to_string();
            self.held.drain(..at);
            let after = self.held[self.f.open.len()..].to_string();
            self.begin_call(&after);
            return out;
        }
        // Hold back the longest tail that could begin the marker.
        let keep = (1..self.f.open.len().min(self.held.len() + 1))
            .rev()
            .find(|&k| {
                self.held.is_char_boundary(self.held.len() - k)
                    && self.f.open.starts_with(&self.held[self.held.len() - k..])
            })
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// At the end: the text still to go out and the calls.
    pub fn finish(&mut self) -> (String, Vec<Call>) {
        let held = std::mem::take(&mut self.held);
        if self.lenient != Lenient::Off {
            // Held from the start: the whole reply, decided now.
            return parse_reply(&held, self.f, self.tools.as_ref());
        }
        if !self.in_call {
            // Forced: a marker cut short by max_tokens is no content either.
            return (if self.f.forced { String::new() } else { held }, Vec::new());
        }
        parse_reply(&held, self.f, self.tools.as_ref())
    }
}

/// The schema of one call to function `f` (its `parameters` as arguments,
/// or `params` when given: the reference [`hoist`] leaves in their place).
fn call_schema(function: &Value, args_key: &str, params: Option<Value>) -> Value {
    let params = params.unwrap_or_else(|| object_parameters(function));
    json!({
        "type": "object",
        "properties": {"name": {"const": function["name"]}, args_key: params},
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// A function's `parameters` schema when it is an object, else any object.
fn object_parameters(function: &Value) -> Value {
    match function.get("parameters") {
        Some(p @ Value::Object(_)) => p.clone(),
        _ => json!({"type": "object"}),
    }
}

/// The most calls one forced reply may hold when parallel calls are on
/// (`tool_choice` required, `parallel_tool_calls` true): the grammar lets
/// the model end after any call from the first, and ends the reply itself
/// after this many. Without a bound a small model repeats one call until
/// `max_tokens` cuts it (Gemma 3 270M did, issue 29), and the cut reply
/// held no call at all. Eight covers the fan-outs agents ask for (a few
/// cities, files or queries at once) at some 20 tokens a call.
pub const MAX_PARALLEL_CALLS: usize = 8;

/// The grammar that forces a valid call (several when `parallel`, at most
/// [`MAX_PARALLEL_CALLS`]) to one of the allowed functions, in format `f`. `special` gives the id of a marker
/// that is one control token in the vocabulary.
pub fn forced_grammar(
    spec: &ToolSpec,
    f: &CallFormat,
    special: impl Fn(&str) -> Option<u32>,
) -> Grammar {
    // A tool's `$ref`s point into its own schema; placed inside the wrapper
    // they would resolve against the wrapper's root, so a schema that has
    // any is moved under the root's `$defs` and its references rebased.
    let mut defs = Map::new();
    let allowed: Vec<Value> = spec
        .allowed()
        .enumerate()
        .map(|(i, func)| {
            let params = func
                .get("parameters")
                .filter(|p| p.is_object() && has_ref(p))
                .map(|p| hoist(p, i, &mut defs));
            call_schema(func, f.args_key, params)
        })
        .collect();
    let one = if allowed.len() == 1 {
        allowed[0].clone()
    } else {
        json!({"anyOf": allowed})
    };
    let lit = |s: &str| match special(s) {
        Some(id) => format!("<[{id}]>"),
        None => serde_json::to_string(s).unwrap_or_default(),
    };
    let with_opts = |mut v: Value| {
        if let Value::Object(o) = &mut v {
            o.insert("x-guidance".into(), json_options());
            if !defs.is_empty() {
                o.insert("$defs".into(), Value::Object(defs.clone()));
            }
        }
        v
    };
    let many = spec.parallel && !matches!(spec.choice, ToolChoice::Named(_));
    let list = |items: Value| {
        let most = if many { MAX_PARALLEL_CALLS } else { 1 };
        json!({"type": "array", "items": items, "minItems": 1, "maxItems": most})
    };
    let lark = match f.body {
        Body::Object if !f.open.is_empty() => {
            let block = format!(
                "{} \"\\n\" %json {} \"\\n\" {}",
                lit(f.open),
                with_opts(one),
                lit(f.close)
            );
            if many {
                format!(
                    "start: call (\"\\n\" call) ~ 0..{}\ncall: {block}\n",
                    MAX_PARALLEL_CALLS - 1
                )
            } else {
                format!("start: {block}\n")
            }
        }
        Body::Object => format!("start: %json {}\n", with_opts(one)),
        Body::Array => format!("start: {} %json {}\n", lit(f.open), with_opts(list(one))),
        Body::Harmony => harmony_forced(spec, &lit),
        // A forced LFM2 or Gemma call is written as the JSON envelope
        // (see [`Body::json_forcible`]).
        Body::Envelope | Body::Pythonic | Body::Gemma(_) => {
            let env = json!({
                "type": "object",
                "properties": {"tool_calls": list(one)},
                "required": ["tool_calls"],
                "additionalProperties": false,
            });
            format!("start: %json {}\n", with_opts(env))
        }
    };
    Grammar::Lark(lark)
}

/// A forced harmony reply, in gpt-oss's own markup (the prompt ends with
/// `<|start|>assistant`): an optional `analysis` message, free text, then
/// one call message to an allowed function,
/// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`,
/// ARGS valid for that function's own parameter schema (so its `$ref`s
/// resolve in it). One call: a harmony turn ends at its `<|call|>`. The
/// markers are the vocabulary's control tokens (`lit`).
fn harmony_forced(spec: &ToolSpec, lit: &dyn Fn(&str) -> String) -> String {
    let calls: Vec<String> = spec
        .allowed()
        .map(|func| {
            let mut params = object_parameters(func);
            if let Value::Object(o) = &mut params {
                // gpt-oss writes its arguments compact (openai-harmony's
                // examples: `{"location":"San Francisco"}`).
                o.insert("x-guidance".into(), json_options_with(",", ":"));
            }
            let name = func["name"].as_str().unwrap_or_default();
            format!(
                "{} {} {} \"json\" {} %json {params} {}",
                lit("<|channel|>"),
                lit(&format!("commentary to=functions.{name} ")),
                lit("<|constrain|>"),
                lit("<|message|>"),
                lit("<|call|>"),
            )
        })
        .collect();
    format!(
        "start: analysis? call\nanalysis: {} \"analysis\" {} /(.|\\n)*/ {} {} \"assistant\"\ncall: {}\n",
        lit("<|channel|>"),
        lit("<|message|>"),
        lit("<|end|>"),
        lit("<|start|>"),
        calls.join(" | ")
    )
}

/// Keywords whose values are data, not schemas: a `$ref` key inside them
/// is no reference.
const DATA_KEYWORDS: [&str; 4] = ["const", "enum", "default", "examples"];

/// Whether a schema holds a `$ref` (outside data keywords).
fn has_ref(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.iter().any(|(k, v)| {
            (k == "$ref" && v.is_string()) || (!DATA_KEYWORDS.contains(&k.as_str()) && has_ref(v))
        }),
        Value::Array(a) => a.iter().any(has_ref),
        _ => false,
    }
}

/// Moves tool `i`'s parameter schema to `defs["tool_i"]` with every local
/// reference (`#`, `#/$defs/X`, any `#/...` pointer) rebased onto it, and
/// gives the reference that stands in its place.
fn hoist(params: &Value, i: usize, defs: &mut Map<String, Value>) -> Value {
    let key = format!("onebit_tool_{i}");
    let base = format!("#/$defs/{key}");
    fn rebase(v: &mut Value, base: &str) {
        match v {
            Value::Object(o) => {
                for (k, v) in o.iter_mut() {
                    match v {
                        Value::String(r) if k == "$ref" && r.starts_with('#') => {
                            let rest = r[1..].trim_end_matches('/').to_string();
                            *r = format!("{base}{rest}");
                        }
                        _ if DATA_KEYWORDS.contains(&k.as_str()) => {}
                        _ => rebase(v, base),
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|v| rebase(v, base)),
            _ => {}
        }
    }
    let mut p = params.clone();
    rebase(&mut p, &base);
    defs.insert(key, p);
    json!({"$ref": base})
}

/// The system text the fallback adds: the tools and how to call them.
pub fn fallback_instruction(spec: &ToolSpec) -> String {
    let mut s = String::from(
        "You can call the following tools. Each line is one tool, with a JSON Schema of its arguments:\n",
    );
    for f in spec.functions() {
        s.push_str(&f.to_string());
        s.push('\n');
    }
    s.push_str(
        "To call tools, reply with only this JSON and nothing else: {\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<the arguments>}}]}\n",
    );
    match &spec.choice {
        ToolChoice::Required => s.push_str("You must call a tool now."),
        ToolChoice::Named(n) => s.push_str(&format!("You must call the tool {n} now.")),
        _ => s.push_str("If no tool is needed, answer normally."),
    }
    s
}

/// For a template that knows no tools: the tools go into the system
/// message, an assistant's calls become its content (the envelope it would
/// have written), and a tool's reply becomes a user message naming the call.
pub fn fallback_messages(messages: &Value, spec: Option<&ToolSpec>) -> Value {
    let Some(list) = messages.as_array() else {
        return messages.clone();
    };
    let mut out: Vec<Value> = Vec::with_capacity(list.len() + 1);
    let names: Map<String, Value> = list
        .iter()
        .filter_map(|m| m.get("tool_calls")?.as_array())
        .flatten()
        .filter_map(|c| {
            Some((
                c.get("id")?.as_str()?.to_string(),
                c["function"]["name"].clone(),
            ))
        })
        .collect();
    for m in list {
        let mut m = m.clone();
        match m["role"].as_str() {
            Some("assistant") if m.get("tool_calls").is_some_and(Value::is_array) => {
                let calls: Vec<Value> = m["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let f = &c["function"];
                        let args = match &f["arguments"] {
                            Value::String(s) => {
                                serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
                            }
                            other => other.clone(),
                        };
                        json!({"name": f["name"], "arguments": args})
                    })
                    .collect();
                let env = json!({"tool_calls": calls}).to_string();
                let text = match m["content"].as_str() {
                    Some(c) if !c.is_empty() => format!("{c}\n{env}"),
                    _ => env,
                };
                let o = m.as_object_mut().expect("a message is an object");
                o.remove("tool_calls");
                o.insert("content".into(), Value::String(text));
            }
            Some("tool") => {
                let id = m["tool_call_id"].as_str().unwrap_or("");
                let name = names
                    .get(id)
                    .and_then(Value::as_str)
                    .or_else(|| m["name"].as_str())
                    .unwrap_or("the tool");
                let text = format!(
                    "Result of {name}{}: {}",
                    if id.is_empty() {
                        String::new()
                    } else {
                        format!(" (call {id})")
                    },
                    m["content"].as_str().unwrap_or("")
                );
                m = json!({"role": "user", "content": text});
            }
            _ => {}
        }
        out.push(m);
    }
    if let Some(spec) = spec.filter(|s| s.choice != ToolChoice::None) {
        let instr = fallback_instruction(spec);
        match out.first_mut() {
            Some(first) if first["role"] == "system" => {
                let c = first["content"].as_str().unwrap_or("");
                first["content"] = Value::String(format!("{c}\n\n{instr}"));
            }
            _ => out.insert(0, json!({"role": "system", "content": instr})),
        }
    }
    Value::Array(out)
}

/// Calls' `arguments` as objects where they are JSON strings (as OpenAI
/// clients send them): templates write them with `tojson`, and vLLM and
/// llama.cpp hand templates objects.
pub fn arguments_as_objects(messages: &Value) -> Value {
    let mut out = messages.clone();
    for m in out.as_array_mut().into_iter().flatten() {
        for c in m
            .get_mut("tool_calls")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            // Calls are checked objects (api::parse); whatever else is left alone.
            let Some(f) = c.get_mut("function").and_then(Value::as_object_mut) else {
                continue;
            };
            if let Some(Value::String(s)) = f.get("arguments") {
                if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
                    f.insert("arguments".into(), v);
                }
            }
        }
    }
    out
}

/// Adjacent user messages merged (a tool reply after a user turn, for a
/// template that demands alternating roles).
pub fn merge_adjacent_users(messages: Value) -> Value {
    let Value::Array(list) = messages else {
        return messages;
    };
    let mut out: Vec<Value> = Vec::with_capacity(list.len());
    for m in list {
        if let Some(prev) = out.last_mut() {
            if prev["role"] == "user" && m["role"] == "user" {
                let a = prev["content"].as_str().unwrap_or("").to_string();
                let b = m["content"].as_str().unwrap_or("");
                prev["content"] = Value::String(format!("{a}\n\n{b}"));
                continue;
            }
        }
        out.push(m);
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(choice: ToolChoice, parallel: bool) -> ToolSpec {
        ToolSpec {
            tools: vec![
                json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
                json!({"type": "function", "function": {"name": "get_time"}}),
            ],
            choice,
            parallel,
        }
    }

    #[test]
    fn formats_are_chosen_from_the_template_text() {
        let chatml = include_str!("../../../testdata/chat-templates/chatml-think-tools.jinja");
        assert_eq!(detect(chatml), Some(&HERMES));
        let gemma = include_str!("../../../testdata/chat-templates/gemma3.jinja");
        assert_eq!(detect(gemma), None);
        let llama = include_str!("../../../testdata/chat-templates/llama3-dated.jinja");
        let want = if llama.contains("tools") && llama.contains("\"parameters\": ") {
            Some(&LLAMA3)
        } else {
            None
        };
        assert_eq!(detect(llama), want);
        assert_eq!(
            detect("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"),
            Some(&MISTRAL)
        );
    }

    #[test]
    fn hermes_blocks_parse_with_text_around_them() {
        let out = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse(out, &HERMES);
        assert_eq!(content, "Let me look.");
        assert_eq!(
            calls,
            [
                Call {
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into()
                },
                Call {
                    name: "get_time".into(),
                    arguments: "{}".into()
                }
            ]
        );
    }

    #[test]
    fn a_cut_last_block_stays_text_beside_the_whole_calls() {
        let whole = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n";
        let out = format!("{whole}<tool_call>\n{{\"name\": \"get_ti");
        let (content, calls) = parse(&out, &HERMES);
        assert_eq!(calls.len(), 1);
        assert_eq!(content, "<tool_call>\n{\"name\": \"get_ti");
        // Unclosed but whole (the stop token came before the close tag): a call.
        let (content, calls) = parse("<tool_call>{\"name\": \"get_time\"}", &HERMES);
        assert_eq!((content.as_str(), calls.len()), ("", 1));
    }

    #[test]
    fn a_broken_block_leaves_the_reply_as_text() {
        let out =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>";
        assert_eq!(parse(out, &HERMES), (out.to_string(), vec![]));
        assert_eq!(parse("just text", &HERMES), ("just text".into(), vec![]));
    }

    #[test]
    fn llama_mistral_and_envelope_payloads() {
        let (c, calls) = parse(
            "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}",
            &LLAMA3,
        );
        assert_eq!(
            (c.as_str(), calls[0].arguments.as_str()),
            ("", r#"{"tz":"UTC"}"#)
        );
        let (_, calls) = parse(
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": 1}}]",
            &MISTRAL,
        );
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, r#"{"x":1}"#);
        let (_, calls) = parse(
            " {\"tool_calls\": [{\"name\": \"get_time\", \"arguments\": {}}]}",
            &GENERIC,
        );
        assert_eq!(calls[0].name, "get_time");
        // Text that merely starts with a brace but is no envelope stays text.
        assert_eq!(parse("{not json", &GENERIC).1, vec![]);
    }

    /// Issue 29: under auto, one bare or fenced JSON call to a declared
    /// tool with arguments that pass its schema is a call; anything else
    /// stays content, exactly as written.
    #[test]
    fn the_lenient_rule_takes_one_valid_json_call_and_nothing_else() {
        let auto = spec(ToolChoice::Auto, true);
        let call = |t: &str| parse_reply(t, &HERMES, Some(&auto));
        let want = vec![Call {
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        }];
        for t in [
            r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n",
            "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Paris\"\n  }\n}\n```",
            "```\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
        ] {
            assert_eq!(call(t), (String::new(), want.clone()), "{t}");
        }
        // get_time declares no parameters: any object passes.
        assert_eq!(call(r#"{"name": "get_time", "arguments": {}}"#).1.len(), 1);
        for t in [
            // A name not declared.
            r#"{"name": "get_wether", "arguments": {"city": "Paris"}}"#,
            // Arguments that fail the schema: `city` is required, a string.
            r#"{"name": "get_weather", "arguments": {"town": "Paris"}}"#,
            r#"{"name": "get_weather", "arguments": {"city": 75}}"#,
            r#"{"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}"#,
            r#"{"name": "get_weather"}"#,
            r#"{"name": "get_weather", "arguments": {"city": "Paris"}, "id": 1}"#,
            // Two objects, a list, two fences.
            "{\"name\": \"get_time\", \"arguments\": {}}\n{\"name\": \"get_time\", \"arguments\": {}}",
            r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}]"#,
            "```json\n{\"name\": \"get_time\", \"arguments\": {}}\n```\n```json\n{}\n```",
            // Text around the object, a fence that is not JSON's.
            "Here: {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} is the call",
            "```python\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
        ] {
            assert_eq!(call(t), (t.to_string(), vec![]), "{t}");
        }
        // Only under auto, and only with the request's tools.
        let t = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        assert_eq!(parse_reply(t, &HERMES, None).1, vec![]);
        let none = spec(ToolChoice::None, true);
        assert_eq!(parse_reply(t, &HERMES, Some(&none)).1, vec![]);
        // The generic fallback's format takes it too (its envelope aside).
        assert_eq!(parse_reply(t, &GENERIC, Some(&auto)).1, want);
    }

    /// A streamed reply that begins with `{` or a fence goes out only when
    /// it ends, and then as the whole-reply rule decides; any other start
    /// goes out as it comes.
    #[test]
    fn a_streamed_lenient_call_is_held_and_decided_at_the_end() {
        let auto = spec(ToolChoice::Auto, true);
        for text in [
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
            " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            "{\"name\": \"nope\", \"arguments\": {}}",
            "```\nplain code\n```",
        ] {
            for size in [1, 3, 8] {
                let mut s = ToolStream::new(&HERMES).with_tools(Some(&auto));
                let mut out = String::new();
                for chunk in text.as_bytes().chunks(size) {
                    out.push_str(&s.push(std::str::from_utf8(chunk).unwrap()));
                    assert_eq!(out, "", "{text:?} in pieces of {size}");
                }
                let (rest, calls) = s.finish();
                out.push_str(&rest);
                assert_eq!((out, calls), parse_reply(text, &HERMES, Some(&auto)));
            }
        }
        let mut s = ToolStream::new(&HERMES).with_tools(Some(&auto));
        assert_eq!(s.push(" "), "");
        assert_eq!(s.push("Hi {"), " Hi {");
        let mut s = ToolStream::new(&HERMES).with_tools(Some(&auto));
        assert_eq!(s.push("``"), "");
        assert_eq!(s.push("`js"), "");
        assert_eq!(s.push("x\n"), "```jsx\n");
        // Without auto nothing is held.
        let mut s = ToolStream::new(&HERMES).with_tools(Some(&spec(ToolChoice::None, true)));
        assert_eq!(s.push("{\"a\""), "{\"a\"");
    }

    #[test]
    fn streaming_holds_a_split_marker_and_gives_the_same_calls() {
        let out = "Sure.<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        // Pieces of 3 bytes: the marker arrives split across pieces.
        let mut s = ToolStream::new(&HERMES);
        let mut text = String::new();
        let b = out.as_bytes();
        for chunk in b.chunks(3) {
            text.push_str(&s.push(std::str::from_utf8(chunk).unwrap()));
            assert!(!text.contains('<'), "{text}");
        }
        let (rest, calls) = s.finish();
        text.push_str(&rest);
        assert_eq!(text, "Sure.");
        assert_eq!(calls, parse(out, &HERMES).1);
        // A `<` that does not begin the marker goes out.
        let mut s = ToolStream::new(&HERMES);
        assert_eq!(s.push("a <b"), "a <b");
        assert_eq!(s.push("<too"), "");
        assert_eq!(s.push("k"), "<took");
    }

    #[test]
    fn streaming_a_reply_that_is_the_call() {
        let mut s = ToolStream::new(&GENERIC);
        assert_eq!(s.push("  "), "");
        assert_eq!(s.push("{\"tool_calls\": [{\"name\": \"get_time\", "), "");
        assert_eq!(s.push("\"arguments\": {}}]}"), "");
        assert_eq!(s.finish().1[0].name, "get_time");
        let mut s = ToolStream::new(&GENERIC);
        assert_eq!(s.push(" Hi"), " Hi");
        assert_eq!(s.push(" {"), " {");
        assert_eq!(s.finish(), (String::new(), vec![]));
    }

    /// `whole` (Ollama's stream) gives the same text and calls as `new`,
    /// and records no fragment events, which no one would take.
    #[test]
    fn a_whole_stream_records_no_argument_events() {
        let pieces = [
            "Ok <tool_call>",
            "{\"name\": \"get_time\", ",
            "\"arguments\": {\"tz\": \"UTC\"}}",
            "</tool_call>",
        ];
        let (mut a, mut b) = (ToolStream::new(&HERMES), ToolStream::whole(&HERMES));
        let (mut ta, mut tb) = (String::new(), String::new());
        for p in pieces {
            ta.push_str(&a.push(p));
            tb.push_str(&b.push(p));
        }
        assert!(!a.take_events().is_empty());
        assert!(b.take_events().is_empty());
        let (fa, fb) = (a.finish(), b.finish());
        assert_eq!((ta, fa), (tb, fb));
    }

    #[test]
    fn forced_grammar_names_only_the_allowed_function() {
        let Grammar::Lark(g) = forced_grammar(
            &spec(ToolChoice::Named("get_time".into()), true),
            &HERMES,
            |_| None,
        ) else {
            panic!()
        };
        assert!(g.contains("\"const\":\"get_time\""), "{g}");
        assert!(!g.contains("get_weather"), "{g}");
        // Named: exactly one call, no repetition.
        assert!(g.starts_with("start: \"<tool_call>\""), "{g}");
        let Grammar::Lark(g) = forced_grammar(&spec(ToolChoice::Required, true), &HERMES, |_| None)
        else {
            panic!()
        };
        assert!(
            g.contains("anyOf") && g.contains("call (\"\\n\" call) ~ 0..7"),
            "{g}"
        );
        // Parallel calls in a list are bounded too (issue 29).
        let Grammar::Lark(g) =
            forced_grammar(&spec(ToolChoice::Required, true), &GENERIC, |_| None)
        else {
            panic!()
        };
        assert!(g.contains("\"minItems\":1,\"maxItems\":8"), "{g}");
        let Grammar::Lark(g) = forced_grammar(&spec(ToolChoice::Required, false), &MISTRAL, |s| {
            (s == "[TOOL_CALLS]").then_some(5)
        }) else {
            panic!()
        };
        assert!(g.starts_with("start: <[5]> %json"), "{g}");
        assert!(g.contains("\"maxItems\":1"), "{g}");
    }

    /// Issue 31, item 7a: a forced reply cut by max_tokens gives its whole
    /// calls and no content (the cut call's markup used to be the content).
    #[test]
    fn a_forced_reply_cut_short_has_no_content() {
        let whole = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n";
        let cut = "<tool_call>\n{\"name\": \"book\", \"argu";
        let f = forced(&HERMES);
        assert!(f.forced && f.open == HERMES.open);
        assert_eq!(parse(cut, f), (String::new(), vec![]));
        let (content, calls) = parse(&format!("{whole}{cut}"), f);
        assert_eq!((content.as_str(), calls.len()), ("", 1));
        // Unforced, the text stays (the model may have said something).
        assert_eq!(parse(cut, &HERMES).0, cut);
        // Streamed: nothing of the cut call goes out as content, also when
        // the cut falls inside the marker.
        for text in [cut, "<tool_", "\n<tool_call>"] {
            let mut s = ToolStream::new(f);
            let mut out = s.push(text);
            let (rest, _) = s.finish();
            out.push_str(&rest);
            assert!(!out.contains("tool"), "{text:?}: {out:?}");
        }
        // Every forced format keeps its own markers; the others write the envelope.
        assert_eq!(forced(&MISTRAL).open, MISTRAL.open);
        assert_eq!(forced(&LFM2).body, Body::Envelope);
        assert!(forced(&GENERIC).forced);
    }

    /// Issue 31, item 6: under a forced choice each tool's `$ref`s resolve
    /// in its own schema (moved under the root's `$defs`), not against the
    /// wrapper the grammar builds.
    #[test]
    fn forced_tool_schemas_keep_their_own_refs() {
        let person = json!({
            "type": "object",
            "properties": {"who": {"$ref": "#/$defs/Person"}, "again": {"$ref": "#"},
                           "note": {"const": {"$ref": "#/not/a/ref"}}},
            "$defs": {"Person": {"type": "object", "properties": {"name": {"type": "string"}}}},
        });
        let spec = ToolSpec {
            tools: vec![
                json!({"type": "function", "function": {"name": "plain", "parameters": {"type": "object"}}}),
                json!({"type": "function", "function": {"name": "book", "parameters": person}}),
            ],
            choice: ToolChoice::Required,
            parallel: false,
        };
        let Grammar::Lark(g) = forced_grammar(&spec, &HERMES, |_| None) else {
            panic!()
        };
        let at = g.find("%json ").unwrap() + 6;
        let mut de = serde_json::Deserializer::from_str(&g[at..]).into_iter::<Value>();
        let root = de.next().unwrap().unwrap();
        let moved = &root["$defs"]["onebit_tool_1"];
        assert_eq!(
            moved["properties"]["who"]["$ref"],
            "#/$defs/onebit_tool_1/$defs/Person"
        );
        assert_eq!(
            moved["properties"]["again"]["$ref"],
            "#/$defs/onebit_tool_1"
        );
        // Data is not rewritten; a tool with no reference stays in place.
        assert_eq!(moved["properties"]["note"]["const"]["$ref"], "#/not/a/ref");
        assert!(root["$defs"].get("onebit_tool_0").is_none());
        assert_eq!(
            root["anyOf"][1]["properties"]["arguments"],
            json!({"$ref": "#/$defs/onebit_tool_1"})
        );
        // Following each pointer from the root lands on the tool's own parts.
        let follow = |r: &str| {
            r[2..]
                .split('/')
                .try_fold(&root, |v, seg| v.get(seg))
                .cloned()
        };
        assert_eq!(
            follow("#/$defs/onebit_tool_1/$defs/Person"),
            Some(json!({"type": "object", "properties": {"name": {"type": "string"}}}))
        );
    }

    #[test]
    fn lfm2_pythonic_calls() {
        let out = "Checking.<|tool_call_start|>[get_weather(city='Paris', unit=\"celsius\"), get_time(tz='Europe/Paris', n=-2, x=1.5e-3, ok=True, none=None, l=[1, 'a'], d={'k': False})]<|tool_call_end|>";
        let (content, calls) = parse(out, &LFM2);
        assert_eq!(content, "Checking.");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris","unit":"celsius"}"#);
        assert_eq!(
            calls[1].arguments,
            r#"{"tz":"Europe/Paris","n":-2,"x":0.0015,"ok":true,"none":null,"l":[1,"a"],"d":{"k":false}}"#
        );
        assert_eq!(pythonic_calls("[f()]").unwrap()[0].arguments, "{}");
        assert_eq!(
            pythonic_calls("[f(a='it\\'s')]").unwrap()[0].arguments,
            r#"{"a":"it's"}"#
        );
        for bad in ["f()", "[f(a=)]", "[f(a='x')", "[f(a=b c)]", "[f(1)]"] {
            assert_eq!(pythonic_calls(bad), None, "{bad}");
        }
        assert_eq!(
            detect("{% if tools %}List of tools: <|tool_list_start|>[{% endif %}"),
            Some(&LFM2)
        );
    }

    #[test]
    fn string_arguments_become_objects() {
        let m = json!([{"role": "assistant", "content": null, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": [1]}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}},
        ]}]);
        let out = arguments_as_objects(&m);
        assert_eq!(
            out[0]["tool_calls"][0]["function"]["arguments"],
            json!({"x": [1]})
        );
        assert_eq!(out[0]["tool_calls"][1]["function"]["arguments"], "not json");
    }

    #[test]
    fn fallback_rewrites_calls_and_results() {
        let msgs = json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        ]);
        let out = fallback_messages(&msgs, Some(&spec(ToolChoice::Auto, true)));
        assert_eq!(out[0]["role"], "system");
        assert!(out[0]["content"].as_str().unwrap().contains("get_weather"));
        assert_eq!(
            out[2]["content"],
            r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}"#
        );
        assert_eq!(out[3]["role"], "user");
        assert_eq!(
            out[3]["content"],
            "Result of get_weather (call call_1): 18 C"
        );
    }
    #[test]
    fn gemma_calls_from_the_functiongemma_template() {
        let t = include_str!("../../../testdata/chat-templates/functiongemma-tools.jinja");
        assert_eq!(detect(t), Some(&FUNCTIONGEMMA));
        assert_eq!(
            detect("{% if tools %}..{% endif %}<|tool_call>call:"),
            Some(&GEMMA4)
        );
        let out = "Let me check.<start_function_call>call:get_weather{city:<escape>Paris, {France}<escape>,days:3,metric:true,opts:{hours:[6,12],tz:<escape>CET<escape>},note:null}<end_function_call>";
        let (content, calls) = parse(out, &FUNCTIONGEMMA);
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(
            args,
            json!({"city": "Paris, {France}", "days": 3, "metric": true,
                   "opts": {"hours": [6, 12], "tz": "CET"}, "note": null})
        );
        // Two blocks: two calls; Gemma 4's markers and string delimiter.
        let two = "<|tool_call>call:a{x:<|\"|>1<|\"|>}<tool_call|><|tool_call>call:b{}<tool_call|>";
        let (content, calls) = parse(two, &GEMMA4);
        assert_eq!(content, "");
        assert_eq!(
            calls,
            vec![
                Call {
                    name: "a".into(),
                    arguments: r#"{"x":"1"}"#.into()
                },
                Call {
                    name: "b".into(),
                    arguments: "{}".into()
                },
            ]
        );
        for bad in [
            "get_weather{}",
            "call:{x:1}",
            "call:f{x:<escape>open}",
            "call:f{x:1",
            "call:f{x:1}}",
            "call:f{:1}",
            "call:f[1]",
        ] {
            assert_eq!(gemma_call(bad, "<escape>"), None, "{bad}");
        }
        // A broken block leaves the reply as text.
        let broken = "<start_function_call>call:f{x:<escape>1}<end_function_call>";
        assert_eq!(parse(broken, &FUNCTIONGEMMA), (broken.to_string(), vec![]));
    }

    #[test]
    fn gemma_calls_stream_to_the_same_calls() {
        let out = "Sure.<start_function_call>call:get_time{tz:<escape>Europe/Paris<escape>}<end_function_call>";
        for size in [1, 2, 5, 7] {
            let mut s = ToolStream::new(&FUNCTIONGEMMA);
            let mut text = String::new();
            for chunk in out.as_bytes().chunks(size) {
                text.push_str(&s.push(std::str::from_utf8(chunk).unwrap()));
                assert!(!text.contains('<'), "{text}");
            }
            let (rest, calls) = s.finish();
            text.push_str(&rest);
            assert_eq!(text, "Sure.");
            assert_eq!(calls, parse(out, &FUNCTIONGEMMA).1);
            assert_eq!(calls[0].arguments, r#"{"tz":"Europe/Paris"}"#);
        }
    }

    #[test]
    fn forced_gemma_calls_use_the_json_envelope() {
        assert!(!FUNCTIONGEMMA.body.json_forcible() && !GEMMA4.body.json_forcible());
        assert!(HERMES.body.json_forcible() && !LFM2.body.json_forcible());
        let Grammar::Lark(g) =
            forced_grammar(&spec(ToolChoice::Required, false), &FUNCTIONGEMMA, |_| None)
        else {
            panic!("a lark grammar")
        };
        assert!(
            g.contains("tool_calls") && !g.contains("start_function_call"),
            "{g}"
        );
    }
    #[test]
    fn json_call_arguments_stream_before_the_call_ends() {
        use crate::tool_args::ArgEvent;
        let out = "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
        let cut = out.find("\"days").unwrap();
        let mut s = ToolStream::new(&HERMES);
        let mut text = s.push(&out[..cut]);
        let early = s.take_events();
        assert_eq!(
            early,
            vec![
                ArgEvent::Call {
                    index: 0,
                    name: "get_weather".into()
                },
                ArgEvent::Args {
                    index: 0,
                    fragment: r#"{"city":"Paris","#.into()
                },
            ]
        );
        text.push_str(&s.push(&out[cut..]));
        let mut args = String::new();
        for e in early.into_iter().chain(s.take_events()) {
            if let ArgEvent::Args { fragment, .. } = e {
                args.push_str(&fragment);
            }
        }
        let (rest, calls) = s.finish();
        text.push_str(&rest);
        assert_eq!(text, "Sure.");
        assert_eq!(calls[0].arguments, args);
        // Formats that are not JSON give no events (their calls come whole).
        let mut s = ToolStream::new(&FUNCTIONGEMMA);
        s.push("<start_function_call>call:f{x:1}");
        assert!(s.take_events().is_empty());
    }
}
