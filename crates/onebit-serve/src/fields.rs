//! Request-body checks the protocol modules share: the body as a JSON
//! object, unknown fields refused by name, and embedding inputs. A leaf: it
//! knows no route, model or engine.

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

/// A 400 naming the first field not in `known`.
pub fn refuse_unknown(o: &Map<String, Value>, known: &[&str]) -> Result<(), ApiError> {
    match o.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(ApiError::invalid(
            None,
            format!(
                "unknown field `{k}`: this endpoint reads only {}",
                known.join(", ")
            ),
        )),
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

/// The inputs of an embedding request: one text or a list of texts.
pub fn inputs(v: Option<&Value>, param: &'static str) -> Result<Vec<String>, ApiError> {
    let texts = match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|x| {
                x.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::invalid(
                        param,
                        format!("`{param}` must be a string or a list of strings (token-id inputs are not supported)"),
                    )
                })
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(param, format!("`{param}` is an empty list")))
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(param, format!("`{param}` is required")))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                param,
                format!("`{param}` must be a string or a list of strings"),
            ))
        }
    };
    if texts.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            param,
            format!(
                "at most {MAX_INPUTS} inputs per request; got {}",
                texts.len()
            ),
        ));
    }
    Ok(texts)
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
}
