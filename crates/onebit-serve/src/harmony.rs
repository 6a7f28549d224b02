//! OpenAI's harmony format (gpt-oss): which models speak it, as a declared
//! rule, and a reply split into its messages as it is generated.
//!
//! A harmony reply is a run of messages, each a header and a body:
//! `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`
//! (the prompt ends with `<|start|>assistant`, so the first header has no
//! role). A header may name a recipient, `to=functions.NAME`, in its role
//! part or after its channel, and a content type, `<|constrain|>json` or a
//! bare `json`. `<|call|>` and `<|return|>` end the reply (they are stop
//! tokens, never in the text); `<|end|>` ends one message.
//!
//! The splitter's invariant: no harmony markup reaches the client. An
//! `analysis` body goes to `reasoning`, a `final` or `commentary` body to
//! `content`; a body addressed to `functions.NAME` becomes a call block of
//! [`tools::HARMONY`] in `content` (`{"name": NAME, "arguments": BODY}`
//! between markers no model text holds), streamed as it is written, which
//! the tool-call machinery parses as it parses any format. A header that
//! names no known channel, or text that never opens one, is plain content;
//! a header or call cut by `max_tokens` is dropped.

use serde_json::Value;

use crate::text::Split;
use crate::tools;

/// A reply format a model declares, and what declares it: the template
/// must write all of `template_has` and the vocabulary hold every one of
/// `control_tokens` as a control token.
#[derive(Debug)]
pub struct ReplyFormat {
    pub name: &'static str,
    pub template_has: &'static [&'static str],
    pub control_tokens: &'static [&'static str],
    /// Where the rule comes from, for the `[semantics]` line.
    pub source: &'static str,
}

/// Harmony: the format gpt-oss was trained on.
pub const HARMONY: ReplyFormat = ReplyFormat {
    name: "harmony",
    template_has: &["<|channel|>", "<|message|>", "<|start|>"],
    control_tokens: &[
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
    ],
    source: "OpenAI harmony response format (openai-harmony; gpt-oss chat_template.jinja writes <|start|>role<|channel|>channel<|message|>; o200k_harmony declares the markers as control tokens)",
};

/// The reply formats onebit parses by rule, tried in order.
pub const FORMATS: [&ReplyFormat; 1] = [&HARMONY];

/// The format a model with this template and these control tokens
/// declares, or `None` (a plain reply, or `<think>` and tool formats found
/// by their own rules).
pub fn declared(template: &str, is_control: impl Fn(&str) -> bool) -> Option<&'static ReplyFormat> {
    FORMATS.into_iter().find(|f| {
        f.template_has.iter().all(|t| template.contains(t))
            && f.control_tokens.iter().all(|t| is_control(t))
    })
}

/// The reasoning efforts harmony knows (its system message's `Reasoning:` line).
pub const EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// A requested reasoning effort (OpenAI's `reasoning_effort`, Responses'
/// `reasoning.effort`), checked: one of [`EFFORTS`], else why not.
pub fn effort(v: &Value) -> Result<String, String> {
    match v.as_str() {
        Some(e) if EFFORTS.contains(&e) => Ok(e.to_string()),
        _ => Err(format!(
            "reasoning effort must be one of {}; got {v}",
            EFFORTS.join(", ")
        )),
    }
}

/// The `[semantics]` line for a model's reply format.
pub fn semantics_line(f: &ReplyFormat) -> String {
    format!("reply format: {}  <- {}", f.name, f.source)
}

const START: &str = "<|start|>";
const END: &str = "<|end|>";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";
/// Texts that end a message's body.
const BODY_ENDS: [&str; 4] = [END, START, CALL, RETURN];
/// Longer than any header (`<|channel|>commentary to=functions.NAME <|constrain|>json`
/// with a long name): text this long that opens no body is plain content.
const MAX_HEADER: usize = 512;
/// Every marker, removed from plain content.
const MARKERS: [&str; 7] = [START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN];

/// Where a message's body goes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Dest {
    Reasoning,
    Content,
    /// A call to `functions.NAME` (the block is open in `content`).
    Call,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// At the start of a header; `first`: the reply's first, whose text may
    /// instead turn out not to be harmony at all.
    Header {
        first: bool,
    },
    Body(Dest),
    /// After `<|end|>`: the next message's `<|start|>` is due.
    Between,
    /// Not harmony: everything is content.
    Plain,
}

/// What a header says.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    channel: Option<String>,
    recipient: Option<String>,
}

/// Reads a header's text (between `<|start|>` or the reply's start and
/// `<|message|>`): `[role][ to=R]<|channel|>C[ to=R][ <|constrain|>T | T]`.
fn parse_header(h: &str) -> Header {
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| !c.is_whitespace() && *c != '<')
            .collect()
    };
    let channel = h
        .find(CHANNEL)
        .map(|i| word(&h[i + CHANNEL.len()..]))
        .filter(|c| !c.is_empty());
    let recipient = h
        .match_indices("to=")
        .find(|(i, _)| *i == 0 || h[..*i].ends_with(|c: char| c.is_whitespace() || c == '>'))
        .map(|(i, _)| word(&h[i + 3..]))
        .filter(|r| !r.is_empty());
    Header { channel, recipient }
}

/// Splits a harmony reply, streamed, into reasoning, content and call
/// blocks (see the module's note).
#[derive(Debug)]
pub struct HarmonySplitter {
    state: State,
    held: String,
    /// Calls become [`tools::HARMONY`] blocks; else a call's body is content.
    calls: bool,
}

impl HarmonySplitter {
    /// `calls`: the request's tools are parsed (its reply goes through a
    /// [`tools::ToolStream`] or `tools::parse_reply` with [`tools::HARMONY`]).
    pub fn new(calls: bool) -> HarmonySplitter {
        HarmonySplitter {
            state: State::Header { first: true },
            held: String::new(),
            calls,
        }
    }

    pub fn push(&mut self, piece: &str) -> Split {
        let mut out = Split::default();
        self.held.push_str(piece);
        loop {
            match self.state.clone() {
                State::Plain => {
                    // Markers are removed whole: a tail that may begin one waits.
                    let cut = self.held.len() - held_back(&self.held, &MARKERS);
                    out.content.push_str(&strip_markers(&self.held[..cut]));
                    self.held.drain(..cut);
                    return out;
                }
                State::Header { first } => {
                    if first && !could_be_header(&self.held) {
                        self.state = State::Plain;
                        continue;
                    }
                    let Some(at) = self.held.find(MESSAGE) else {
                        if self.held.len() > MAX_HEADER {
                            // No header is this long: not harmony.
                            self.state = State::Plain;
                            continue;
                        }
                        return out;
                    };
                    let header = parse_header(&self.held[..at]);
                    self.held.drain(..at + MESSAGE.len());
                    let dest = match (&header.recipient, header.channel.as_deref()) {
                        (Some(r), _) if r.starts_with("functions.") && self.calls => {
                            let name = &r["functions.".len()..];
                            out.content.push_str(tools::HARMONY.open);
                            out.content.push_str(&format!(
                                "{{\"name\": {}, \"arguments\": ",
                                Value::String(name.to_string())
                            ));
                            Dest::Call
                        }
                        // A builtin tool's call (browser, python): not the user's.
                        (Some(r), _) if !r.starts_with("functions.") => Dest::Reasoning,
                        (_, Some("analysis")) => Dest::Reasoning,
                        // final, commentary (a preamble), a channel not known:
                        // the user's text.
                        _ => Dest::Content,
                    };
                    self.state = State::Body(dest);
                }
                State::Body(dest) => {
                    let end = BODY_ENDS
                        .iter()
                        .filter_map(|m| self.held.find(m).map(|i| (i, *m)))
                        .min();
                    let (text, next) = match end {
                        Some((i, m)) => {
                            let text = self.held[..i].to_string();
                            // `<|start|>` opens the next header at once.
                            self.held.drain(..i + m.len());
                            let next = if m == START {
                                State::Header { first: false }
                            } else {
                                State::Between
                            };
                            (text, Some(next))
                        }
                        None => {
                            let keep = held_back(&self.held, &MARKERS);
                            let cut = self.held.len() - keep;
                            let text = self.held[..cut].to_string();
                            self.held.drain(..cut);
                            (text, None)
                        }
                    };
                    let text = strip_markers(&text);
                    match dest {
                        Dest::Reasoning => out.reasoning.push_str(&text),
                        Dest::Content | Dest::Call => out.content.push_str(&text),
                    }
                    match next {
                        Some(n) => {
                            if dest == Dest::Call {
                                out.content.push('}');
                                out.content.push_str(tools::HARMONY.close);
                            }
                            self.state = n;
                        }
                        None => return out,
                    }
                }
                State::Between => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(START) {
                        self.held = rest.to_string();
                        self.state = State::Header { first: false };
                    } else if t.is_empty() || START.starts_with(t) {
                        return out;
                    } else {
                        // Text outside any message: plain content from here.
                        self.state = State::Plain;
                    }
                }
            }
        }
    }

    /// End of the reply; `cut`: by `max_tokens` (not a stop token). A cut
    /// header or call is dropped, a cut message body kept where it was going;
    /// a call ended by a stop (`<|call|>`) is closed.
    pub fn finish(&mut self, cut: bool) -> Split {
        let mut out = Split::default();
        let held = std::mem::take(&mut self.held);
        match std::mem::replace(&mut self.state, State::Between) {
            State::Plain => out.content = strip_markers(&held),
            State::Header { first } => {
                // Not harmony after all (a short reply), or a header never
                // finished: the text, if it is any, as content.
                if first && !cut && !held.contains(CHANNEL) {
                    out.content = strip_markers(&held);
                }
            }
            State::Body(Dest::Reasoning) => out.reasoning = strip_markers(&held),
            State::Body(Dest::Content) => out.content = strip_markers(&held),
            State::Body(Dest::Call) => {
                if !cut {
                    out.content = strip_markers(&held);
                    out.content.push('}');
                    out.content.push_str(tools::HARMONY.close);
                }
            }
            State::Between => {}
        }
        out
    }
}

/// Whether `s`, the start of a reply, may still be (or is) a harmony header.
fn could_be_header(s: &str) -> bool {
    let t = s.trim_start();
    if t.is_empty() {
        return true;
    }
    for open in [CHANNEL, START, "to=", "assistant"] {
        if t.starts_with(open) || open.starts_with(t) {
            return true;
        }
    }
    false
}

/// The longest tail of `s` that could begin one of `marks`.
fn held_back(s: &str, marks: &[&str]) -> usize {
    (1..=s.len())
        .rev()
        .find(|&k| {
            s.is_char_boundary(s.len() - k)
                && marks
                    .iter()
                    .any(|m| m.len() > k && m.starts_with(&s[s.len() - k..]))
        })
        .unwrap_or(0)
}

fn strip_markers(s: &str) -> String {
    let mut out = s.replace(tools::HARMONY_RESERVED, "");
    for m in MARKERS {
        out = out.replace(m, "");
    }
    out
}

/// Messages as gpt-oss's template reads them: an assistant's reasoning is
/// `thinking` there, `reasoning_content` in OpenAI's shape (and what
/// onebit's replies carry), so a client sending a reply back gets it
/// rendered (the template drops it unless a tool call follows). An
/// assistant's `content` or `thinking` of null (OpenAI's shape of a message
/// that only calls tools) is left out: the template tests `"..." in
/// message.content` whenever the key is there, which a null fails (in
/// Jinja2 as in minijinja).
pub fn messages_for_template(messages: &Value) -> Value {
    let mut out = messages.clone();
    for m in out.as_array_mut().into_iter().flatten() {
        let Some(o) = m.as_object_mut() else { continue };
        if o.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        for key in ["content", "thinking"] {
            if o.get(key).is_some_and(Value::is_null) {
                o.remove(key);
            }
        }
        if o.contains_key("thinking") {
            continue;
        }
        if let Some(r) = o
            .get("reasoning_content")
            .filter(|r| r.is_string())
            .cloned()
        {
            o.insert("thinking".into(), r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `pieces` through a splitter; returns the joined reasoning and content.
    fn split(calls: bool, pieces: &[&str], cut: bool) -> Split {
        let mut s = HarmonySplitter::new(calls);
        let mut all = Split::default();
        for p in pieces {
            let x = s.push(p);
            all.reasoning += &x.reasoning;
            all.content += &x.content;
        }
        let x = s.finish(cut);
        all.reasoning += &x.reasoning;
        all.content += &x.content;
        all
    }

    /// Every way to cut `text` into two pieces gives the same split, and so
    /// do pieces of one character.
    fn all_cuts(calls: bool, text: &str, cut: bool) -> Split {
        let whole = split(calls, &[text], cut);
        for (i, _) in text.char_indices() {
            assert_eq!(
                split(calls, &[&text[..i], &text[i..]], cut),
                whole,
                "cut at {i}"
            );
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(split(calls, &refs, cut), whole, "one char at a time");
        whole
    }

    #[test]
    fn headers_read_recipient_in_either_place() {
        let h = parse_header("<|channel|>commentary to=functions.get_weather <|constrain|>json");
        assert_eq!(h.channel.as_deref(), Some("commentary"));
        assert_eq!(h.recipient.as_deref(), Some("functions.get_weather"));
        let h = parse_header("assistant to=functions.f<|channel|>commentary json");
        assert_eq!(
            (h.channel.as_deref(), h.recipient.as_deref()),
            (Some("commentary"), Some("functions.f"))
        );
        let h = parse_header(" to=functions.f<|channel|>commentary");
        assert_eq!(h.recipient.as_deref(), Some("functions.f"));
        let h = parse_header("assistant<|channel|>final");
        assert_eq!((h.channel.as_deref(), h.recipient), (Some("final"), None));
        // "to=" inside a word is no recipient.
        assert_eq!(parse_header("<|channel|>photo=x").recipient, None);
    }

    #[test]
    fn reasoning_then_final() {
        let s = all_cuts(
            false,
            "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.",
            false,
        );
        assert_eq!(s.reasoning, "User asks 2+2. Easy.");
        assert_eq!(s.content, "2 + 2 = 4.");
    }

    #[test]
    fn reasoning_then_call_both_recipient_places() {
        for text in [
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary<|message|>{\"city\": \"Paris\"}",
        ] {
            let s = all_cuts(true, text, false);
            assert_eq!(s.reasoning, "Need weather.");
            let (content, calls) = tools::parse(&s.content, &tools::HARMONY);
            assert_eq!(content, "", "{text}");
            assert_eq!(
                calls,
                [tools::Call {
                    name: "get_weather".into(),
                    arguments: "{\"city\":\"Paris\"}".into()
                }],
                "{text}"
            );
        }
        // The first header names the recipient itself (no analysis first).
        let s = all_cuts(
            true,
            " to=functions.now<|channel|>commentary json<|message|>{}",
            false,
        );
        let (_, calls) = tools::parse(&s.content, &tools::HARMONY);
        assert_eq!(calls[0].name, "now");
    }

    #[test]
    fn malformed_is_plain_content_never_markup() {
        // No harmony at all.
        let s = all_cuts(false, "Just an answer.", false);
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("", "Just an answer.")
        );
        // A channel not known: its body is content.
        let s = all_cuts(false, "<|channel|>thoughts<|message|>hmm", false);
        assert_eq!(s.content, "hmm");
        // No channel at all.
        let s = all_cuts(false, "<|message|>bare", false);
        assert_eq!(s.content, "bare");
        // Text between messages: plain from there, markers removed.
        let s = all_cuts(
            false,
            "<|channel|>final<|message|>a<|end|>b<|start|>c",
            false,
        );
        assert_eq!(s.content, "abc");
        // A call whose body is no JSON: its text, as content.
        let s = all_cuts(
            true,
            "<|channel|>commentary to=functions.f<|message|>not json",
            false,
        );
        let (content, calls) = tools::parse(&s.content, &tools::HARMONY);
        assert!(calls.is_empty());
        assert_eq!(content, "not json");
        for t in [&s.content, &s.reasoning] {
            assert!(!t.contains("<|"), "{t:?}");
        }
    }

    #[test]
    fn cut_by_max_tokens_leaves_no_markup() {
        // In a call's arguments.
        let s = all_cuts(
            true,
            "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ",
            true,
        );
        assert_eq!(s.reasoning, "x");
        let (content, calls) = tools::parse(&s.content, &tools::HARMONY);
        assert_eq!((content.as_str(), calls.len()), ("", 0));
        // In a header.
        let s = all_cuts(
            false,
            "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|chan",
            true,
        );
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("x", ""));
        // In a final body: what was written is content.
        let s = all_cuts(false, "<|channel|>final<|message|>Hel", true);
        assert_eq!(s.content, "Hel");
    }

    /// A reply streamed token by token through the splitter and the tool
    /// stream (as /v1 streams it): reasoning, content, the call announced
    /// with its name and its arguments in fragments, the same as the whole
    /// reply parsed at once (as /v1 answers it unstreamed).
    fn stream(text: &str, pieces: usize, cut: bool) -> (Split, Vec<tools::Call>, String) {
        let mut hs = HarmonySplitter::new(true);
        let mut ts = tools::ToolStream::new(&tools::HARMONY);
        let (mut got, mut whole) = (Split::default(), String::new());
        let mut args = String::new();
        let chars: Vec<char> = text.chars().collect();
        let step = chars.len().div_ceil(pieces);
        let mut feed = |x: Split, ts: &mut tools::ToolStream, whole: &mut String| {
            got.reasoning += &x.reasoning;
            whole.push_str(&x.content);
            got.content += &ts.push(&x.content);
            for e in ts.take_events() {
                if let crate::tool_args::ArgEvent::Args { fragment, .. } = e {
                    args += &fragment;
                }
            }
        };
        for c in chars.chunks(step.max(1)) {
            let p: String = c.iter().collect();
            feed(hs.push(&p), &mut ts, &mut whole);
        }
        feed(hs.finish(cut), &mut ts, &mut whole);
        let (rest, calls) = ts.finish();
        got.content += &rest;
        let (w_content, w_calls) = tools::parse(&whole, &tools::HARMONY);
        assert_eq!(w_calls, calls, "streamed and whole calls");
        assert_eq!(w_content, got.content.trim(), "streamed and whole content");
        (got, calls, args)
    }

    #[test]
    fn streamed_call_equals_whole_and_streams_its_arguments() {
        let text = "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": [1, 2]}";
        for pieces in [1, 3, 17, text.chars().count()] {
            let (s, calls, args) = stream(text, pieces, false);
            assert_eq!(s.reasoning, "Call it.");
            assert_eq!(s.content, "");
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].name, "get_weather");
            assert_eq!(calls[0].arguments, "{\"city\":\"Paris\",\"days\":[1,2]}");
            assert_eq!(args, calls[0].arguments, "{pieces} pieces");
        }
        // Cut inside the arguments: no call, no markup.
        let cut = &text[..text.len() - 10];
        for pieces in [1, 5, cut.chars().count()] {
            let (s, calls, _) = stream(cut, pieces, true);
            assert!(calls.is_empty());
            assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("Call it.", ""));
        }
        // Reasoning then final, streamed.
        let (s, calls, _) = stream(
            "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>final<|message|>The answer.",
            4,
            false,
        );
        assert!(calls.is_empty());
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("r", "The answer.")
        );
    }

    #[test]
    fn calls_off_leave_the_body_as_content() {
        let s = all_cuts(
            false,
            "<|channel|>commentary to=functions.f<|message|>{\"a\": 1}",
            false,
        );
        assert_eq!(s.content, "{\"a\": 1}");
    }

    #[test]
    fn declared_by_template_and_control_tokens() {
        let tmpl = "{{ '<|start|>system<|message|>' }}<|channel|>";
        let all = |_: &str| true;
        assert_eq!(declared(tmpl, all).map(|f| f.name), Some("harmony"));
        // The vocabulary lacks <|call|> as a control token: no.
        assert!(declared(tmpl, |t| t != "<|call|>").is_none());
        // A template that never writes a channel: no.
        assert!(declared("<|start|><|message|>", all).is_none());
    }

    #[test]
    fn reasoning_content_is_thinking_for_the_template() {
        let m = serde_json::json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": []},
            {"role": "assistant", "content": "", "reasoning_content": "r", "thinking": "t"},
        ]);
        let out = messages_for_template(&m);
        assert_eq!(out[1]["thinking"], "r");
        assert_eq!(out[2]["thinking"], "t");
        assert!(out[0].get("thinking").is_none());
    }

    /// An assistant tool-call turn as OpenAI's clients send it (content
    /// null) reaches the template without `content`, and a null `thinking`
    /// goes too; a user's message is left as sent.
    #[test]
    fn null_content_of_an_assistant_turn_is_left_out() {
        let m = serde_json::json!([
            {"role": "user", "content": null},
            {"role": "assistant", "content": null, "thinking": null,
             "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            {"role": "assistant", "content": "", "tool_calls": []},
        ]);
        let out = messages_for_template(&m);
        assert!(out[1].get("content").is_none() && out[1].get("thinking").is_none());
        assert!(out[1].get("tool_calls").is_some());
        assert_eq!(out[2]["content"], "");
        assert!(out[0].get("content").is_some_and(Value::is_null));
    }
}
