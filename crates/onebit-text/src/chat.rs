//! Chat templates: a model's Jinja template rendered the way transformers'
//! `apply_chat_template` renders it.
//!
//! transformers compiles the template in an `ImmutableSandboxedEnvironment`
//! with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension and its
//! `{% generation %}` tag, a `tojson` filter that is Python's `json.dumps`
//! (no HTML escaping, `ensure_ascii=False`), and the globals `raise_exception`
//! and `strftime_now`. It renders with `messages`, `add_generation_prompt`, the
//! special tokens (`bos_token`, `eos_token`, ...) and any extra keyword
//! arguments. Values print as Python's `str()` prints them (`None`, `True`,
//! `['a', 'b']`), and strings answer Python's methods (`strip`, `split`,
//! `startswith`, ...) through minijinja-contrib's pycompat.
//!
//! Templates come from model files, so they are not trusted to be small or
//! to stop: rendering runs on a fuel budget (minijinja instructions) and its
//! output is capped; exceeding either is an error, not a hang. What neither
//! bounds is memory a template spends on strings it builds without writing
//! them (a string doubled in a loop): templates come from the model or the
//! operator (`--chat-template`), never from a request.

use std::fmt::Write as _;
use std::io;

use minijinja::value::{Kwargs, Serde, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};

use crate::Tokenizer;

/// Bounds on one rendering.
#[derive(Clone, Copy, Debug)]
pub struct ChatLimits {
    /// Output larger than this is an error.
    pub max_output_bytes: usize,
    /// minijinja instructions one rendering may execute.
    pub fuel: u64,
}

impl Default for ChatLimits {
    fn default() -> Self {
        ChatLimits {
            max_output_bytes: 8 << 20,
            fuel: 20_000_000,
        }
    }
}

/// The special tokens a template sees, by the names transformers gives them.
#[derive(Clone, Debug, Default)]
pub struct TemplateTokens {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
}

impl TemplateTokens {
    /// The texts of the tokenizer's BOS, EOS, UNK and PAD tokens.
    pub fn from_tokenizer(tok: &Tokenizer) -> TemplateTokens {
        let s = tok.special();
        let text = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i));
        TemplateTokens {
            bos_token: s.bos_token.clone().or_else(|| text(s.bos)),
            eos_token: s.eos_token.clone().or_else(|| text(s.eos.first().copied())),
            unk_token: text(s.unk),
            pad_token: text(s.pad),
        }
    }
}

/// Why a template did not compile or render.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template is not valid Jinja (or uses syntax minijinja lacks).
    #[error("chat template does not compile: {0}")]
    Compile(String),
    /// The template called `raise_exception(message)`: the conversation breaks
    /// one of its rules (e.g. roles must alternate).
    #[error("chat template refused the conversation: {0}")]
    Raised(String),
    /// Rendering failed (a type error, an undefined method, ...).
    #[error("chat template failed to render: {0}")]
    Render(String),
    /// Output over `max_output_bytes`, or more work than `fuel` allows.
    #[error("chat template exceeded its limits: {0}")]
    Limit(String),
}

/// A compiled chat template with its special tokens.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    tokens: TemplateTokens,
    limits: ChatLimits,
    /// What `strftime_now` reads: seconds since the epoch, or [`CLOCK`] for
    /// the system clock.
    now: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

/// [`ChatTemplate::now`]'s value for "the system clock".
const CLOCK: i64 = i64::MIN;

const NAME: &str = "chat_template";
/// The prefix `raise_exception` gives its error so it can be told apart.
const RAISED: &str = "raise_exception: ";

impl ChatTemplate {
    /// Compiles `source` with default limits.
    pub fn new(source: &str, tokens: TemplateTokens) -> Result<ChatTemplate, ChatError> {
        ChatTemplate::with_limits(source, tokens, ChatLimits::default())
    }

    pub fn with_limits(
        source: &str,
        tokens: TemplateTokens,
        limits: ChatLimits,
    ) -> Result<ChatTemplate, ChatError> {
        // Environment::new has the builtin filters, tests and functions; no
        // auto-escaping (transformers' environment has none).
        let mut env = Environment::new();
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| ChatError::Compile(e.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.set_fuel(Some(limits.fuel));
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("{RAISED}{msg}"),
            ))
        });
        let now = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(CLOCK));
        let clock = now.clone();
        env.add_function("strftime_now", move |fmt: String| {
            let now = match clock.load(std::sync::atomic::Ordering::Relaxed) {
                CLOCK => std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64),
                pinned => pinned,
            };
            strftime(&fmt, now)
        });
        env.add_template_owned(NAME, rewrite_generation_tags(source))
            .map_err(|e| ChatError::Compile(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            tokens,
            limits,
            now,
        })
    }

    /// Pins what `strftime_now` reads to `secs` since the epoch (UTC), or
    /// back to the system clock with `None`: a template that prints today's
    /// date (gpt-oss's `Current date:`) renders reproducibly.
    pub fn pin_now(&self, secs: Option<i64>) {
        self.now
            .store(secs.unwrap_or(CLOCK), std::sync::atomic::Ordering::Relaxed);
    }

    /// The template as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation. `messages` is a JSON array of message objects
    /// (`role`, `content`, and whatever else the template reads); `extra` adds
    /// keyword arguments (`tools`, `enable_thinking`, ...), which override the
    /// special tokens as in transformers.
    pub fn render(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ChatError> {
        let mut ctx: Vec<(String, Value)> = Vec::new();
        let t = &self.tokens;
        for (name, v) in [
            ("bos_token", &t.bos_token),
            ("eos_token", &t.eos_token),
            ("unk_token", &t.unk_token),
            ("pad_token", &t.pad_token),
        ] {
            if let Some(v) = v {
                ctx.push((name.into(), Value::from(v.as_str())));
            }
        }
        if let Some(extra) = extra {
            for (k, v) in extra {
                ctx.retain(|(name, _)| name != k);
                ctx.push((k.clone(), Value::from(Serde(v))));
            }
        }
        ctx.retain(|(name, _)| name != "messages" && name != "add_generation_prompt");
        ctx.push(("messages".into(), Value::from(Serde(messages))));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        let ctx = Value::from_pairs(ctx);

        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatError::Compile(describe(&e)))?;
        let mut out = Capped {
            buf: Vec::new(),
            cap: self.limits.max_output_bytes,
            over: false,
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => {}
            Err(_) if out.over => {
                return Err(ChatError::Limit(format!(
                    "output over {} bytes",
                    self.limits.max_output_bytes
                )))
            }
            Err(e) => return Err(classify(&e)),
        }
        String::from_utf8(out.buf).map_err(|e| ChatError::Render(e.to_string()))
    }
}

/// The error's message and its cause chain, without minijinja's debug dump.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        let _ = write!(s, ": {c}");
        src = c.source();
    }
    s
}

fn classify(e: &Error) -> ChatError {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(me) = c.downcast_ref::<Error>() {
            if me.kind() == ErrorKind::OutOfFuel {
                return ChatError::Limit("rendering ran out of fuel (a runaway loop?)".into());
            }
            if let Some(msg) = me.detail().and_then(|d| d.strip_prefix(RAISED)) {
                return ChatError::Raised(msg.to_string());
            }
        }
        cur = c.source();
    }
    ChatError::Render(describe(e))
}

/// An `io::Write` that refuses to grow past `cap` bytes.
struct Capped {
    buf: Vec<u8>,
    cap: usize,
    over: bool,
}

impl io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.buf.len() + b.len() > self.cap {
            self.over = true;
            return Err(io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// transformers' `AssistantTracker` extension adds `{% generation %}` ...
/// `{% endgeneration %}` around assistant turns (for training masks); it
/// renders its body unchanged. minijinja has no custom tags, so the tags become
/// `{% if true %}` / `{% endif %}`, keeping their whitespace-control marks.
fn rewrite_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i..];
        // The close is searched after the open: in `{%}` the `%` is shared.
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        let word = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match word {
            Some(w) => {
                let _ = write!(out, "{{%{lead} {w} {trail}%}}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Prints values as Jinja2 does: `str()` of the Python value.
fn python_formatter(
    out: &mut minijinja::Output,
    _state: &mut State,
    value: &Value,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => Ok(()),
        ValueKind::String => out.write_str(value.as_str().unwrap_or_default()),
        _ => {
            let mut s = String::new();
            py_repr(value, &mut s, 0);
            out.write_str(&s)
        }
    }
    .map_err(Error::from)
}

/// Python's `repr` (strings quoted), which is also `str` for everything but
/// strings.
fn py_repr(v: &Value, out: &mut String, depth: usize) {
    if depth > 64 {
        out.push_str("...");
        return;
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&py_number(v)),
        ValueKind::String => py_str_repr(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(it) = v.try_iter() {
                for (i, item) in it.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&item, out, depth + 1);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(it) = v.try_iter() {
                for (i, k) in it.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&k, out, depth + 1);
                    out.push_str(": ");
                    py_repr(&v.get_item(&k).unwrap_or_default(), out, depth + 1);
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{v}");
        }
    }
}

fn py_str_repr(s: &str, out: &mut String) {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(q);
}

fn py_number(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    match f64::try_from(v.clone()) {
        Ok(f) => py_float(f),
        Err(_) => v.to_string(),
    }
}

/// Python's `float.__repr__`: the shortest round-tripping digits, positional
/// for exponents in [-4, 16), scientific (`1e-05`, `1e+16`) otherwise.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    let sci = format!("{f:e}"); // e.g. "-1.2345e-5"
    let (mant, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let mut s = String::new();
    if neg {
        s.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            s.push_str("0.");
            s.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            s.push_str(&digits);
        } else {
            let point = exp as usize + 1;
            if digits.len() <= point {
                s.push_str(&digits);
                s.extend(std::iter::repeat_n('0', point - digits.len()));
                s.push_str(".0");
            } else {
                s.push_str(&digits[..point]);
                s.push('.');
                s.push_str(&digits[point..]);
            }
        }
    } else {
        s.push_str(&digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let _ = write!(s, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    s
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`; `ensure_ascii` and `indent` by position
/// or name, the others by name.
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let pick = |pos: Option<Value>, name: &str| -> Result<Option<Value>, Error> {
        let kw: Option<Value> = kwargs.get(name)?;
        Ok(kw.or(pos).filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
        Some(v) => {
            let n = i64::try_from(v)?;
            Some(" ".repeat(n.clamp(0, 64) as usize))
        }
    };
    let (item_sep, key_sep) = match pick(None, "separators")? {
        Some(v) => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|p| p.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    )
                })?;
            match <[String; 2]>::try_from(parts) {
                Ok([a, b]) => (a, b),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let sort_keys = pick(None, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let opts = JsonOpts {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    opts.write(value, &mut out, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonOpts {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, v: &Value, out: &mut String, level: usize) -> Result<(), Error> {
        if level > 128 {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: value nested too deeply",
            ));
        }
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                let s = py_number(v);
                out.push_str(match s.as_str() {
                    "nan" => "NaN",
                    "inf" => "Infinity",
                    "-inf" => "-Infinity",
                    s => s,
                });
            }
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.write(item, out, level + 1)?;
                }
                self.newline(out, level);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<(String, Value)> =
                    v.try_iter()?.map(|k| (json_key(&k), k)).collect::<Vec<_>>();
                if self.sort_keys {
                    keys.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, (name, k)) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.string(name, out);
                    out.push_str(&self.key_sep);
                    self.write(&v.get_item(k)?, out, level + 1)?;
                }
                self.newline(out, level);
                out.push('}');
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "tojson: object of kind {} is not JSON serializable",
                        v.kind()
                    ),
                ))
            }
        }
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && (c as u32) > 0x7e => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A mapping key as `json.dumps` writes it: strings as they are, numbers,
/// booleans and None by their JSON text.
fn json_key(k: &Value) -> String {
    match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_string(),
        ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).into(),
        ValueKind::None | ValueKind::Undefined => "null".into(),
        ValueKind::Number => py_number(k),
        _ => k.to_string(),
    }
}

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Python's `datetime.strftime` for a UTC time in seconds since the epoch
/// (the codes templates use; an unknown code is kept as written).
pub fn strftime(fmt: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (tod / 3600, tod / 60 % 60, tod % 60);
    let wday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let h12 = if hh % 12 == 0 { 12 } else { hh % 12 };
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(code) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match code {
            'Y' => write!(out, "{y}"),
            'y' => write!(out, "{:02}", y.rem_euclid(100)),
            'm' => write!(out, "{m:02}"),
            'd' => write!(out, "{d:02}"),
            'e' => write!(out, "{d:2}"),
            'H' => write!(out, "{hh:02}"),
            'I' => write!(out, "{h12:02}"),
            'M' => write!(out, "{mm:02}"),
            'S' => write!(out, "{ss:02}"),
            'p' => write!(out, "{}", if hh < 12 { "AM" } else { "PM" }),
            'j' => write!(out, "{yday:03}"),
            'A' => write!(out, "{}", DAYS[wday]),
            'a' => write!(out, "{}", &DAYS[wday][..3]),
            'B' => write!(out, "{}", MONTHS[m as usize - 1]),
            'b' | 'h' => write!(out, "{}", &MONTHS[m as usize - 1][..3]),
            'w' => write!(out, "{}", (wday + 1) % 7),
            'u' => write!(out, "{}", wday + 1),
            'F' => write!(out, "{y}-{m:02}-{d:02}"),
            'D' => write!(out, "{m:02}/{d:02}/{:02}", y.rem_euclid(100)),
            'T' => write!(out, "{hh:02}:{mm:02}:{ss:02}"),
            'R' => write!(out, "{hh:02}:{mm:02}"),
            'c' => write!(
                out,
                "{} {} {d:2} {hh:02}:{mm:02}:{ss:02} {y}",
                &DAYS[wday][..3],
                &MONTHS[m as usize - 1][..3]
            ),
            'Z' => write!(out, "UTC"),
            'z' => write!(out, "+0000"),
            'n' => out.write_char('\n'),
            't' => out.write_char('\t'),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> Result<String, ChatError> {
        let t = ChatTemplate::new(src, TemplateTokens::default())?;
        let extra = ctx.as_object().cloned().unwrap_or_default();
        t.render(&serde_json::json!([]), false, Some(&extra))
    }

    #[test]
    fn python_float_repr() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (1e16, "1e+16"),
            (123.456, "123.456"),
            (-2.5e-7, "-2.5e-07"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
        ] {
            assert_eq!(py_float(f), s);
        }
    }

    #[test]
    fn values_print_as_python_str() {
        let out = render(
            "{{ a }}|{{ b }}|{{ c }}|{{ d }}|{{ e }}|{{ nothing }}",
            serde_json::json!({"a": null, "b": true, "c": [1, "x'", false], "d": {"k": 1.5}, "e": 3}),
        )
        .unwrap();
        assert_eq!(out, "None|True|[1, \"x'\", False]|{'k': 1.5}|3|");
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        // JSON objects keep their keys' order (serde_json's preserve_order),
        // as Python's json.dumps keeps a dict's.
        let ctx = serde_json::json!({"v": {"b": [1, 2.0, "é<&>\"\n"], "a": null}});
        assert_eq!(
            render("{{ v|tojson }}", ctx.clone()).unwrap(),
            "{\"b\": [1, 2.0, \"é<&>\\\"\\n\"], \"a\": null}"
        );
        assert_eq!(
            render("{{ v|tojson(indent=2, sort_keys=true) }}", ctx.clone()).unwrap(),
            "{\n  \"a\": null,\n  \"b\": [\n    1,\n    2.0,\n    \"é<&>\\\"\\n\"\n  ]\n}"
        );
        assert_eq!(
            render(
                "{{ v|tojson(separators=(',', ':'), ensure_ascii=true) }}",
                ctx
            )
            .unwrap(),
            "{\"b\":[1,2.0,\"\\u00e9<&>\\\"\\n\"],\"a\":null}"
        );
    }

    #[test]
    fn tojson_keeps_the_order_of_template_built_mappings() {
        assert_eq!(
            render("{{ {'z': 1, 'a': [true]}|tojson }}", serde_json::json!({})).unwrap(),
            "{\"z\": 1, \"a\": [true]}"
        );
    }

    #[test]
    fn raise_exception_is_its_own_error() {
        match render(
            "{{ raise_exception('roles must alternate') }}",
            serde_json::json!({}),
        ) {
            Err(ChatError::Raised(m)) => assert_eq!(m, "roles must alternate"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hostile_templates_hit_limits() {
        let t = ChatTemplate::with_limits(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            TemplateTokens::default(),
            ChatLimits {
                max_output_bytes: 1 << 30,
                fuel: 1_000_000,
            },
        )
        .unwrap();
        assert!(matches!(
            t.render(&serde_json::json!([]), false, None),
            Err(ChatError::Limit(_))
        ));
        let t = ChatTemplate::with_limits(
            "{% for i in range(10000) %}{{ 'y' * 10000 }}{% endfor %}",
            TemplateTokens::default(),
            ChatLimits {
                max_output_bytes: 1 << 20,
                fuel: u64::MAX,
            },
        )
        .unwrap();
        assert!(matches!(
            t.render(&serde_json::json!([]), false, None),
            Err(ChatError::Limit(_))
        ));
    }

    #[test]
    fn generation_tags_render_their_body() {
        let src = "{% for m in messages %}{%- generation -%} [{{ m.content }}] {%- endgeneration %}{% endfor %}";
        let t = ChatTemplate::new(src, TemplateTokens::default()).unwrap();
        let out = t
            .render(
                &serde_json::json!([{"role": "user", "content": "hi"}]),
                false,
                None,
            )
            .unwrap();
        assert_eq!(out, "[hi]");
    }

    #[test]
    fn strftime_matches_python() {
        // python: datetime.fromtimestamp(1700000000, timezone.utc).strftime(...)
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %j %B %y %I%p", 1_700_000_000),
            "14 Nov 2023 22:13:20 Tuesday 318 November 23 10PM"
        );
        assert_eq!(strftime("%Y-%m-%d", 951_782_400), "2000-02-29");
    }

    #[test]
    fn python_string_methods_and_loop_controls() {
        let out = render(
            "{% for w in s.strip().split(' ') %}{% if loop.index > 2 %}{% break %}{% endif %}{{ w.upper() }}{{ ',' if not loop.last }}{% endfor %}|{{ s.startswith('  a') }}",
            serde_json::json!({"s": "  a b c  "}),
        )
        .unwrap();
        assert_eq!(out, "A,B,|True");
    }
}
