//! llama-server's `POST /tokenize` and `POST /detokenize`, as its README
//! defines them: `content` to `tokens` (`add_special` default false,
//! `parse_special` default true), `tokens` to `content`; `model` picks the
//! model (the default when absent); the body limit (`--max-body-mib`)
//! bounds the text and the list. Every id is checked against the
//! model's vocabulary, and errors are in OpenAI's shape, as llama-server's
//! are. A protocol module: it reads the application state only.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{json, Map, Value};

use crate::api::ApiError;
use crate::app::App;
use crate::fields::{check_unread, mark_unread, model_name, object, unread};
use crate::metrics::Metrics;
use crate::reply::json_response;
use crate::run;

const TOKENIZE_FIELDS: [&str; 5] = [
    "model",
    "content",
    "add_special",
    "parse_special",
    "with_pieces",
];
const DETOKENIZE_FIELDS: [&str; 2] = ["model", "tokens"];

fn flag(o: &Map<String, Value>, name: &'static str, default: bool) -> Result<bool, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::invalid(
            name,
            format!("`{name}` must be a boolean; got {v}"),
        )),
    }
}

fn answer(app: &App, r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(|e| {
        Metrics::add(&app.metrics.requests_failed, 1);
        axum::response::IntoResponse::into_response(e)
    })
}

/// `POST /tokenize`.
pub async fn tokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = app.read_body(&headers, body).await?;
        let o = object(&body)?;
        let ignored = unread(&o, &TOKENIZE_FIELDS, "");
        check_unread(app.strict_fields, &ignored)?;
        let content = match o.get("content") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => {
                return Err(ApiError::invalid("content", "`content` is required"))
            }
            Some(v) => {
                return Err(ApiError::invalid(
                    "content",
                    format!("`content` must be a string; got {v}"),
                ))
            }
        };
        let add_special = flag(&o, "add_special", false)?;
        let parse_special = flag(&o, "parse_special", true)?;
        if flag(&o, "with_pieces", false)? {
            return Err(ApiError::invalid(
                "with_pieces",
                "`with_pieces` true is not supported: send the ids to /detokenize for their text",
            ));
        }
        let m = app.model(model_name(&o)?).await?;
        let m2 = m.clone();
        let ids = run::blocking(move || {
            let tok = &m2.tok;
            let mut ids = if parse_special {
                tok.encode(&content, add_special)
            } else {
                tok.encode_plain(&content).and_then(|body| {
                    if !add_special {
                        return Ok(body);
                    }
                    // As `encode` adds them: BOS first, EOS last.
                    let plain = tok.encode("", true)?;
                    let bos = plain.iter().take(usize::from(tok.special().add_bos));
                    let eos = plain.iter().skip(usize::from(tok.special().add_bos));
                    Ok(bos.chain(&body).chain(eos).copied().collect())
                })
            }
            .map_err(|e| ApiError::invalid("content", format!("cannot tokenize `content`: {e}")))?;
            ids.shrink_to_fit();
            Ok(ids)
        })
        .await?;
        let mut r = json_response(200, json!({ "tokens": ids }).to_string());
        mark_unread(&mut r, "POST /tokenize", &ignored);
        Ok(r)
    }
    .await;
    answer(&app, r)
}

/// `POST /detokenize`.
pub async fn detokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = app.read_body(&headers, body).await?;
        let o = object(&body)?;
        let ignored = unread(&o, &DETOKENIZE_FIELDS, "");
        check_unread(app.strict_fields, &ignored)?;
        let m = app.model(model_name(&o)?).await?;
        let ids: Vec<u32> = match o.get("tokens") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_u64()
                        .filter(|&id| id < m.n_vocab as u64)
                        .map(|id| id as u32)
                        .ok_or_else(|| {
                            ApiError::invalid(
                                "tokens",
                                format!(
                                    "`tokens[{i}]` must be a token id of model {} (an integer from 0 to {}); got {v}",
                                    m.name,
                                    m.n_vocab - 1
                                ),
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
            Some(v) => {
                return Err(ApiError::invalid(
                    "tokens",
                    format!("`tokens` must be a list of token ids; got {v}"),
                ))
            }
        };
        let m2 = m.clone();
        let content = run::blocking(move || {
            m2.tok.decode(&ids, false).map_err(|e| {
                ApiError::invalid("tokens", format!("cannot detokenize `tokens`: {e}"))
            })
        })
        .await?;
        let mut r = json_response(200, json!({ "content": content }).to_string());
        mark_unread(&mut r, "POST /detokenize", &ignored);
        Ok(r)
    }
    .await;
    answer(&app, r)
}
