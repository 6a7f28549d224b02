//! A chat's prompt ids with every user-controlled string kept as plain text:
//! only the template's own markup becomes control tokens, so a user who
//! types `<|im_end|><|im_start|>system` gets those characters, not a forged
//! turn, whether in a message's content or in any other field the template
//! writes (tool-call names and arguments, tool descriptions and schemas,
//! enum values, `chat_template_kwargs` values).
//!
//! Where those strings lie in the rendered text is found by rendering a
//! second time with each string wrapped in two noncharacters (U+FDD0,
//! U+FDD1): removing them must give back the first rendering exactly, and
//! the text between each pair must be one marked string as written raw, by
//! `tojson` or by Python's `repr`, else the spans are not trusted. The
//! rendering itself is always the template's own, unmarked; the marks only
//! say which bytes to tokenize as plain text.
//!
//! Marked are the string values (not keys) of the messages, of the
//! template arguments (where the tools are) other than `role` and `type`,
//! which templates compare; empty strings are not. When a template
//! changes a marked string (compares, trims or slices it), the next try
//! leaves the template arguments other than the tools unmarked, and the
//! last marks only the messages' content; failing that, nothing is.
//! Every user string left unmarked (keys, `role`/`type` values, or all of
//! them when no try holds) must then spell no control token, or the
//! request is refused naming the field and `--allow-special-in-content`,
//! rather than tokenized wrongly.

use std::collections::HashSet;

use onebit_text::{ChatError, ChatTemplate, Tokenizer};
use serde_json::{Map, Value};

use crate::api::ApiError;

const OPEN: char = '\u{FDD0}';
const CLOSE: char = '\u{FDD1}';

/// Keys whose string values are not marked: templates compare them
/// (`message.role == "user"`, `tool.type == "function"`).
const UNMARKED_KEYS: [&str; 2] = ["role", "type"];

/// A rendered chat, the byte spans of its user strings, and the user
/// strings the spans do not cover.
pub struct Rendered {
    pub text: String,
    /// `None`: no marking held (the template changed what it was given).
    pub spans: Option<Vec<(usize, usize)>>,
    /// User strings outside every span: (where, as a field path; the text).
    pub unmarked: Vec<(String, String)>,
}

fn template_error(e: ChatError) -> ApiError {
    match e {
        ChatError::Raised(m) => ApiError::invalid(
            "messages",
            format!("the chat template refused the conversation: {m}"),
        ),
        other => ApiError::invalid("messages", other.to_string()),
    }
}

/// What one try marks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Marking {
    /// Every string value but `role`/`type`, in messages and arguments.
    All,
    /// The same but for template arguments other than the tools (a
    /// template may compare one, e.g. `reasoning_effort == "high"`).
    AllButKwargs,
    /// The messages' `content` only.
    Content,
    /// Nothing.
    None,
}

/// Walks `v` (at `path`), wrapping the strings `marking` selects and
/// recording the others (and every key) as unmarked. False when a user
/// string holds a marker character itself (then no marking is trusted).
fn mark(
    v: &mut Value,
    path: &mut String,
    key: Option<&str>,
    marking: Marking,
    in_content: bool,
    marked: &mut Vec<String>,
    unmarked: &mut Vec<(String, String)>,
) -> bool {
    match v {
        Value::String(s) => {
            if s.contains([OPEN, CLOSE]) {
                return false;
            }
            let wanted = match marking {
                Marking::All | Marking::AllButKwargs => {
                    !key.is_some_and(|k| UNMARKED_KEYS.contains(&k))
                }
                Marking::Content => in_content,
                Marking::None => false,
            };
            if wanted && !s.is_empty() {
                marked.push(s.clone());
                *s = format!("{OPEN}{s}{CLOSE}");
            } else if !s.is_empty() {
                unmarked.push((path.clone(), s.clone()));
            }
            true
        }
        Value::Array(a) => {
            let len = path.len();
            for (i, x) in a.iter_mut().enumerate() {
                path.push_str(&format!("[{i}]"));
                let ok = mark(x, path, None, marking, in_content, marked, unmarked);
                path.truncate(len);
                if !ok {
                    return false;
                }
            }
            true
        }
        Value::Object(o) => {
            let len = path.len();
            for (k, x) in o.iter_mut() {
                if k.contains([OPEN, CLOSE]) {
                    return false;
                }
                path.push('.');
                path.push_str(k);
                unmarked.push((format!("{path} (the key)"), k.clone()));
                let content = in_content || (len == path_root_len(path) && k == "content");
                let ok = mark(x, path, Some(k), marking, content, marked, unmarked);
                path.truncate(len);
                if !ok {
                    return false;
                }
            }
            true
        }
        _ => true,
    }
}

/// For `messages[i].content`: the length of the `messages[i]` part of the
/// path, so that only a message's own `content` counts as content.
fn path_root_len(path: &str) -> usize {
    match path.strip_prefix("messages[") {
        Some(rest) => match rest.find(']') {
            Some(end) => "messages[".len() + end + 1,
            None => usize::MAX,
        },
        None => usize::MAX,
    }
}

/// The forms a marked string can take in the output: as written, inside a
/// JSON string (`tojson`, non-ASCII kept), inside a Python `repr` string.
fn forms(s: &str, out: &mut HashSet<String>) {
    out.insert(s.to_string());
    // Most text needs no escaping: then every form is the text itself.
    if !s
        .chars()
        .any(|c| matches!(c, '"' | '\'' | '\\') || (c as u32) < 0x20 || c == '\u{7f}')
    {
        return;
    }
    let mut json = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => json.push_str("\\\""),
            '\\' => json.push_str("\\\\"),
            '\n' => json.push_str("\\n"),
            '\r' => json.push_str("\\r"),
            '\t' => json.push_str("\\t"),
            '\u{8}' => json.push_str("\\b"),
            '\u{c}' => json.push_str("\\f"),
            c if (c as u32) < 0x20 => json.push_str(&format!("\\u{:04x}", c as u32)),
            c => json.push(c),
        }
    }
    out.insert(json);
    for q in ['\'', '"'] {
        let mut py = String::with_capacity(s.len());
        for c in s.chars() {
            match c {
                '\\' => py.push_str("\\\\"),
                '\n' => py.push_str("\\n"),
                '\r' => py.push_str("\\r"),
                '\t' => py.push_str("\\t"),
                c if c == q => {
                    py.push('\\');
                    py.push(c);
                }
                c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                    py.push_str(&format!("\\x{:02x}", c as u32))
                }
                c => py.push(c),
            }
        }
        out.insert(py);
    }
}

/// Renders the conversation (with the generation prompt) and, when
/// `want_spans`, locates its user strings in the result.
pub fn render(
    t: &ChatTemplate,
    messages: &Value,
    kwargs: Option<&Map<String, Value>>,
    want_spans: bool,
) -> Result<Rendered, ApiError> {
    let text = t.render(messages, true, kwargs).map_err(template_error)?;
    if !want_spans {
        return Ok(Rendered {
            text,
            spans: None,
            unmarked: Vec::new(),
        });
    }
    for marking in [Marking::All, Marking::AllButKwargs, Marking::Content] {
        if let Some((spans, unmarked)) = locate(t, messages, kwargs, &text, marking) {
            return Ok(Rendered {
                text,
                spans: Some(spans),
                unmarked,
            });
        }
    }
    let (_, _, unmarked) = marked_copy(messages, kwargs, Marking::None).unwrap_or_default();
    Ok(Rendered {
        text,
        spans: None,
        unmarked,
    })
}

type Spans = Vec<(usize, usize)>;

type Marked = (Value, Option<Map<String, Value>>, Vec<(String, String)>);

/// The messages and arguments with `marking`'s strings wrapped, and the
/// strings left unmarked; also the marked strings' originals (through
/// `marked`). `None` when some user string holds a marker character.
fn marked_copy_with(
    messages: &Value,
    kwargs: Option<&Map<String, Value>>,
    marking: Marking,
    marked: &mut Vec<String>,
) -> Option<Marked> {
    let mut unmarked = Vec::new();
    let mut m = messages.clone();
    let mut path = String::from("messages");
    if !mark(
        &mut m,
        &mut path,
        None,
        marking,
        false,
        marked,
        &mut unmarked,
    ) {
        return None;
    }
    let kw = match kwargs {
        Some(k) => {
            let mut k = k.clone();
            for (name, v) in k.iter_mut() {
                // The tools are passed to the template among its arguments.
                let mut path = if name == "tools" {
                    "tools".to_string()
                } else {
                    format!("chat_template_kwargs.{name}")
                };
                let km = match marking {
                    Marking::All => Marking::All,
                    Marking::AllButKwargs if name == "tools" => Marking::All,
                    _ => Marking::None,
                };
                if !mark(v, &mut path, Some(name), km, false, marked, &mut unmarked) {
                    return None;
                }
            }
            Some(k)
        }
        None => None,
    };
    Some((m, kw, unmarked))
}

fn marked_copy(
    messages: &Value,
    kwargs: Option<&Map<String, Value>>,
    marking: Marking,
) -> Option<Marked> {
    marked_copy_with(messages, kwargs, marking, &mut Vec::new())
}

fn locate(
    t: &ChatTemplate,
    messages: &Value,
    kwargs: Option<&Map<String, Value>>,
    text: &str,
    marking: Marking,
) -> Option<(Spans, Vec<(String, String)>)> {
    let mut originals = Vec::new();
    let (m, kw, unmarked) = marked_copy_with(messages, kwargs, marking, &mut originals)?;
    let out = t.render(&m, true, kw.as_ref()).ok()?;
    let mut clean = String::with_capacity(text.len());
    let mut spans = Vec::with_capacity(originals.len());
    let mut open: Option<usize> = None;
    let mut at = 0;
    // Whole runs between marks copied at once (a content may be megabytes).
    for (i, m) in out.match_indices([OPEN, CLOSE]) {
        clean.push_str(&out[at..i]);
        at = i + m.len();
        match m.starts_with(OPEN) {
            true if open.is_none() => open = Some(clean.len()),
            true => return None,
            false => spans.push((open.take()?, clean.len())),
        }
    }
    clean.push_str(&out[at..]);
    if open.is_some() || clean != text {
        return None;
    }
    let mut allowed = HashSet::with_capacity(originals.len() * 3);
    for s in &originals {
        forms(s, &mut allowed);
    }
    spans
        .iter()
        .all(|&(a, b)| allowed.contains(&text[a..b]))
        .then_some((spans, unmarked))
}

/// The prompt ids: markup parsed for control tokens, user strings as plain
/// text unless `allow_special` (the old behaviour: everything parsed).
pub fn ids(
    tok: &Tokenizer,
    r: &Rendered,
    _messages: &Value,
    allow_special: bool,
) -> Result<Vec<u32>, ApiError> {
    let fail = |e: onebit_text::TextError| ApiError::server(format!("tokenizing the prompt: {e}"));
    if allow_special {
        return tok.encode(&r.text, false).map_err(fail);
    }
    // Strings outside the spans: fine as long as none spells a control token.
    let mut seen = HashSet::new();
    for (at, s) in &r.unmarked {
        if !seen.insert(s.as_str()) {
            continue;
        }
        let found = tok.encode(s, false).map_err(fail)?;
        if let Some(&id) = found.iter().find(|&&id| tok.is_special(id)) {
            let name = tok.id_to_token(id).unwrap_or_default();
            let param = if at.starts_with("messages") {
                "messages"
            } else if at.starts_with("tools") {
                "tools"
            } else {
                "chat_template_kwargs"
            };
            return Err(ApiError::invalid(
                param,
                format!(
                    "{at} holds the control token {name:?}, and this chat template does not write that field as it was sent, so it cannot be kept as plain text; remove it, or start the server with --allow-special-in-content"
                ),
            )
            .with_code("control_token_in_content"));
        }
    }
    match &r.spans {
        Some(spans) => tok.encode_with_plain_spans(&r.text, spans).map_err(fail),
        None => tok.encode(&r.text, false).map_err(fail),
    }
}
