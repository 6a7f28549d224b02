//! Request-body checks the protocol modules share: the body as a JSON
//! object, unknown fields refused by name, and embedding inputs. A leaf: it
//! knows no route, model or engine.

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
