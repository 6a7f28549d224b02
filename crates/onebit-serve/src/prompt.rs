//! A chat's prompt ids with message content kept as plain text: only the
//! template's own markup becomes control tokens, so a user who types
//! `<|im_end|><|im_start|>system` gets those characters, not a forged turn.
//!
//! Where the content lies in the rendered text is found by rendering a second
//! time with each content wrapped in two noncharacters (U+FDD0, U+FDD1):
//! removing them must give back the first rendering exactly, and the text
//! between each pair must be that message's content, else the spans are not
//! trusted. Then a content holding control-token text is refused (naming the
//! message and `--allow-special-in-content`) rather than tokenized wrongly.

use onebit_text::{ChatError, ChatTemplate, Tokenizer};
use serde_json::{Map, Value};

use crate::api::ApiError;

const OPEN: char = '\u{FDD0}';
const CLOSE: char = '\u{FDD1}';

/// A rendered chat and the byte spans of its messages' content.
pub struct Rendered {
    pub text: String,
    /// `None`: the template changed content as it rendered it.
    pub spans: Option<Vec<(usize, usize)>>,
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

/// The string contents of `messages` with their message's index, in order.
fn contents(messages: &Value) -> Vec<(usize, &str)> {
    messages
        .as_array()
        .map(|a| {
            a.iter()
                .enumerate()
                .filter_map(|(i, m)| Some((i, m.get("content")?.as_str()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// Renders the conversation (with the generation prompt) and, when
/// `want_spans`, locates each content in the result.
pub fn render(
    t: &ChatTemplate,
    messages: &Value,
    kwargs: Option<&Map<String, Value>>,
    want_spans: bool,
) -> Result<Rendered, ApiError> {
    let text = t.render(messages, true, kwargs).map_err(template_error)?;
    let spans = if want_spans {
        locate(t, messages, kwargs, &text)
    } else {
        None
    };
    Ok(Rendered { text, spans })
}

fn locate(
    t: &ChatTemplate,
    messages: &Value,
    kwargs: Option<&Map<String, Value>>,
    text: &str,
) -> Option<Vec<(usize, usize)>> {
    let want = contents(messages);
    if want.iter().any(|(_, c)| c.contains([OPEN, CLOSE])) {
        return None;
    }
    let mut marked = messages.clone();
    for m in marked.as_array_mut()? {
        if let Some(Value::String(c)) = m.get_mut("content") {
            *c = format!("{OPEN}{c}{CLOSE}");
        }
    }
    let out = t.render(&marked, true, kwargs).ok()?;
    let mut clean = String::with_capacity(text.len());
    let mut spans = Vec::with_capacity(want.len());
    let mut open: Option<usize> = None;
    for ch in out.chars() {
        match ch {
            OPEN if open.is_none() => open = Some(clean.len()),
            CLOSE => spans.push((open.take()?, clean.len())),
            OPEN => return None,
            c => clean.push(c),
        }
    }
    let same = open.is_none()
        && clean == text
        && spans.len() == want.len()
        && spans
            .iter()
            .zip(&want)
            .all(|(&(a, b), (_, c))| &text[a..b] == *c);
    same.then_some(spans)
}

/// The prompt ids: markup parsed for control tokens, content as plain text
/// unless `allow_special` (the old behaviour: everything parsed).
pub fn ids(
    tok: &Tokenizer,
    r: &Rendered,
    messages: &Value,
    allow_special: bool,
) -> Result<Vec<u32>, ApiError> {
    let fail = |e: onebit_text::TextError| ApiError::server(format!("tokenizing the prompt: {e}"));
    if allow_special {
        return tok.encode(&r.text, false).map_err(fail);
    }
    if let Some(spans) = &r.spans {
        return tok.encode_with_plain_spans(&r.text, spans).map_err(fail);
    }
    // Spans unknown: fine as long as no content spells a control token.
    for (i, c) in contents(messages) {
        let found = tok.encode(c, false).map_err(fail)?;
        if let Some(&id) = found.iter().find(|&&id| tok.is_special(id)) {
            let name = tok.id_to_token(id).unwrap_or_default();
            return Err(ApiError::invalid(
                "messages",
                format!(
                    "messages[{i}].content holds the control token {name:?}, and this chat template changes content as it renders it, so it cannot be kept as plain text; remove it, or start the server with --allow-special-in-content"
                ),
            )
            .with_code("control_token_in_content"));
        }
    }
    tok.encode(&r.text, false).map_err(fail)
}
