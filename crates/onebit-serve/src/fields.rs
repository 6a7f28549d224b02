//! Request-body checks the protocol modules share: the body as a JSON
//! object, fields the server does not read (named in the
//! `x-onebit-ignored-fields` header and the log, or refused by name under
//! `--strict-fields`), and embedding inputs. A leaf: it knows no route,
//! model or engine.
//!
//! Why answering is the default: the drop-in clients (LangChain, litellm,
//! Open WebUI) send fields of their own that change nothing for a local
//! server, and a 400 for each would break them where their authors meant no
//! harm; a typo is still seen, in the header and the log, and a deployment
//! that wants it refused starts the server with `--strict-fields`.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::api::ApiError;

/// The body as a JSON object, or a 400 saying what it is instead.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::invalid(None, "the body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(
            None,
            format!("the body is not valid JSON: {e}"),
        )),
    }
}

/// The response header that names the request fields the server did not
/// read (comma-separated, nested ones as `options.name`).
pub const IGNORED_HEADER: &str = "x-onebit-ignored-fields";

/// The keys of `o` not in `known`, in the body's order, each prefixed with
/// `prefix` (`options.` for Ollama's options).
pub fn unread(o: &Map<String, Value>, known: &[&str], prefix: &str) -> Vec<String> {
    o.keys()
        .filter(|k| !known.contains(&k.as_str()))
        .map(|k| format!("{prefix}{k}"))
        .collect()
}

/// Under `--strict-fields`, a 400 naming every field not read; otherwise Ok.
pub fn check_unread(strict: bool, unread: &[String]) -> Result<(), ApiError> {
    if !strict || unread.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        None,
        format!(
            "this server does not read the field{} {}, and it was started with --strict-fields (without it they are answered and named in the {IGNORED_HEADER} header)",
            if unread.len() == 1 { "" } else { "s" },
            unread
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .with_code("unknown_field"))
}

/// Names the fields not read in the response's header and one log line.
pub fn mark_unread(r: &mut axum::response::Response, route: &str, unread: &[String]) {
    if unread.is_empty() {
        return;
    }
    let list = unread.join(", ");
    eprintln!("[serve] {route}: answered without reading the field(s) {list:?}");
    // A header carries visible ASCII only: other characters of a name are `?`.
    let ascii: String = list
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect();
    if let Ok(v) = axum::http::HeaderValue::from_str(&ascii) {
        r.headers_mut().insert(IGNORED_HEADER, v);
    }
}

/// The body's `model`, when it names one (the body parsed on its own: the
/// model must be known before the request is checked against it).
pub fn model_field(body: &[u8]) -> Result<Option<String>, ApiError> {
    model_name(&object(body)?).map(|m| m.map(str::to_string))
}

/// `model` of a request object: a string, or absent/null for the default.
pub fn model_name(o: &Map<String, Value>) -> Result<Option<&str>, ApiError> {
    match o.get("model") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(ApiError::invalid(
            "model",
            format!("`model` must be a string (a model's name); got {v}"),
        )),
    }
}

/// Inputs one embedding request may carry at most.
pub const MAX_INPUTS: usize = 256;

/// One input of an embedding request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Text(String),
    /// Token ids as OpenAI's API allows them (checked against the
    /// vocabulary by [`crate::run::embed`], which knows the model).
    Tokens(Vec<u32>),
}

/// The inputs of an embedding request: one text or a list of texts, and
/// with `ids` also OpenAI's token-id forms, one list of ints or a list of
/// such lists. Every id must fit in 32 bits.
pub fn inputs(v: Option<&Value>, param: &'static str, ids: bool) -> Result<Vec<Input>, ApiError> {
    let expected = if ids {
        "a string, a list of strings, a list of token ids or a list of lists of token ids"
    } else {
        "a string or a list of strings"
    };
    let wrong = || ApiError::invalid(param, format!("`{param}` must be {expected}"));
    let token_list = |a: &[Value], at: String| -> Result<Vec<u32>, ApiError> {
        if a.is_empty() {
            return Err(ApiError::invalid(
                param,
                format!("`{at}` is an empty list of token ids"),
            ));
        }
        a.iter()
            .enumerate()
            .map(|(j, x)| {
                x.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        ApiError::invalid(
                            param,
                            format!(
                                "`{at}[{j}]` must be a token id (an integer from 0 to {}); got {x}",
                                u32::MAX
                            ),
                        )
                    })
            })
            .collect()
    };
    let list = match v {
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::invalid(
                param,
                format!("`{param}` is an empty list"),
            ))
        }
        Some(Value::Array(a)) if ids && a.iter().all(Value::is_number) => {
            vec![Input::Tokens(token_list(a, param.to_string())?)]
        }
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(Input::Text(s.clone())),
                Value::Array(t) if ids => token_list(t, format!("{param}[{i}]")).map(Input::Tokens),
                _ => Err(wrong()),
            })
            .collect::<Result<_, _>>()?,
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(param, format!("`{param}` is required")))
        }
        Some(_) => return Err(wrong()),
    };
    if list.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            param,
            format!(
                "at most {MAX_INPUTS} inputs per request; got {}",
                list.len()
            ),
        ));
    }
    Ok(list)
}

/// How long a model stays loaded after a request (Ollama's `keep_alive`,
/// `--idle-unload`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepAlive {
    /// Until the server stops (any negative value).
    Forever,
    /// This long after its last request ends (zero: at once).
    For(Duration),
}

/// A keep-alive as Ollama writes it: a number of seconds, or a duration
/// such as `5m`, `1h30m`, `45s`, `500ms` (Go's units: h, m, s, ms); a
/// negative value is forever.
pub fn parse_keep_alive(s: &str) -> Result<KeepAlive, String> {
    let t = s.trim();
    let bad = || {
        format!(
            "{s:?} is not a duration (seconds, or e.g. 5m, 1h30m, 45s, 500ms; negative: forever)"
        )
    };
    if let Ok(x) = t.parse::<f64>() {
        return seconds(x).ok_or_else(bad);
    }
    let (neg, mut rest) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t),
    };
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let x: f64 = rest[..n].parse().map_err(|_| bad())?;
        rest = &rest[n..];
        let unit = ["ms", "h", "m", "s"]
            .into_iter()
            .find(|u| rest.starts_with(u))
            .ok_or_else(bad)?;
        rest = &rest[unit.len()..];
        total += x * match unit {
            "ms" => 0.001,
            "h" => 3600.0,
            "m" => 60.0,
            _ => 1.0,
        };
    }
    seconds(if neg { -total } else { total }).ok_or_else(bad)
}

fn seconds(x: f64) -> Option<KeepAlive> {
    if x.is_nan() {
        None
    } else if x < 0.0 {
        Some(KeepAlive::Forever)
    } else {
        Duration::try_from_secs_f64(x).ok().map(KeepAlive::For)
    }
}

/// `keep_alive` of an Ollama request: absent or null is `None` (the
/// server's default); a number of seconds or a duration string.
pub fn keep_alive(o: &Map<String, Value>) -> Result<Option<KeepAlive>, ApiError> {
    let bad = |why: String| ApiError::invalid("keep_alive", format!("`keep_alive` {why}"));
    match o.get("keep_alive") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .and_then(seconds)
            .map(Some)
            .ok_or_else(|| bad(format!("{n} is not a number of seconds"))),
        Some(Value::String(s)) => parse_keep_alive(s).map(Some).map_err(bad),
        Some(v) => Err(bad(format!(
            "must be a number of seconds or a duration string; got {v}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_reads_ollama_durations() {
        let d = |s: f64| KeepAlive::For(Duration::from_secs_f64(s));
        for (text, want) in [
            ("0", d(0.0)),
            ("300", d(300.0)),
            ("5m", d(300.0)),
            ("1h30m", d(5400.0)),
            ("45s", d(45.0)),
            ("500ms", d(0.5)),
            ("1.5h", d(5400.0)),
            ("-1", KeepAlive::Forever),
            ("-1m", KeepAlive::Forever),
        ] {
            assert_eq!(parse_keep_alive(text), Ok(want), "{text}");
        }
        for bad in ["", "5x", "m", "five minutes", "1h-2m"] {
            assert!(parse_keep_alive(bad).is_err(), "{bad}");
        }
        let o = |v: Value| {
            let mut m = Map::new();
            m.insert("keep_alive".into(), v);
            keep_alive(&m)
        };
        assert_eq!(o(serde_json::json!(0)).unwrap(), Some(d(0.0)));
        assert_eq!(o(serde_json::json!(-1)).unwrap(), Some(KeepAlive::Forever));
        assert_eq!(o(serde_json::json!("10m")).unwrap(), Some(d(600.0)));
        assert_eq!(o(Value::Null).unwrap(), None);
        let e = o(serde_json::json!(true)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("keep_alive"));
    }

    #[test]
    fn embedding_inputs_take_texts_and_with_ids_token_lists() {
        use serde_json::json;
        let t = |s: &str| Input::Text(s.into());
        assert_eq!(inputs(Some(&json!("a")), "input", false).unwrap(), [t("a")]);
        assert_eq!(
            inputs(Some(&json!(["a", "b"])), "input", true).unwrap(),
            [t("a"), t("b")]
        );
        assert_eq!(
            inputs(Some(&json!([1, 2, 3])), "input", true).unwrap(),
            [Input::Tokens(vec![1, 2, 3])]
        );
        assert_eq!(
            inputs(Some(&json!([[1, 2], [4294967295u64]])), "input", true).unwrap(),
            [Input::Tokens(vec![1, 2]), Input::Tokens(vec![u32::MAX])]
        );
        // Ids are refused where the protocol takes text only (Ollama's).
        assert!(inputs(Some(&json!([1, 2])), "input", false).is_err());
        for bad in [
            json!([[1, -2]]),
            json!([4294967296u64]),
            json!([[]]),
            json!([1.5]),
            json!([]),
            json!({"a": 1}),
        ] {
            let e = inputs(Some(&bad), "input", true).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("input"), "{bad}");
        }
        let many = Value::Array(vec![json!("x"); MAX_INPUTS + 1]);
        assert!(inputs(Some(&many), "input", true).is_err());
    }

    #[test]
    fn unread_fields_are_named_and_refused_only_when_strict() {
        let o: Map<String, Value> =
            serde_json::from_str(r#"{"model": "m", "bogus": 1, "min_q": 2}"#).unwrap();
        let u = unread(&o, &["model"], "options.");
        assert_eq!(u, ["options.bogus", "options.min_q"]);
        assert!(check_unread(false, &u).is_ok());
        let e = check_unread(true, &u).unwrap_err();
        assert!(
            e.message.contains("`options.bogus`") && e.message.contains("`options.min_q`"),
            "{}",
            e.message
        );
        assert!(check_unread(true, &[]).is_ok());
    }
}
