//! OpenAI's `POST /v1/embeddings`: the request parsed and checked here
//! (texts, or token ids of this model's vocabulary as OpenAI's API allows),
//! the vectors computed by [`crate::run::embed`] (the pooling rules are in
//! [`crate::pooling`]), the answer in OpenAI's shape (floats, or base64 of
//! little-endian f32).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{json, Value};

use crate::api::ApiError;
use crate::app::App;
use crate::fields::{check_unread, inputs, mark_unread, model_name, object, unread};
use crate::metrics::Metrics;
pub use crate::pooling::{PoolKind, Pooling};
use crate::reply::json_response;
use crate::run;

/// `POST /v1/embeddings`.
pub async fn embeddings(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    match embeddings_inner(&app, &headers, body).await {
        Ok(r) => r,
        Err(e) => {
            Metrics::add(&app.metrics.requests_failed, 1);
            axum::response::IntoResponse::into_response(e)
        }
    }
}

/// The request fields /v1/embeddings reads; any other is named in the
/// ignored-fields header (refused under `--strict-fields`).
const FIELDS: [&str; 5] = ["input", "model", "encoding_format", "dimensions", "user"];

async fn embeddings_inner(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = app.read_body(headers, body).await?;
    let o = object(&body)?;
    let ignored = unread(&o, &FIELDS, "");
    check_unread(app.strict_fields, &ignored)?;
    let texts = inputs(o.get("input"), "input", true)?;
    let as_base64 = match o.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "float" => false,
        Some(Value::String(s)) if s == "base64" => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("`encoding_format` must be \"float\" or \"base64\"; got {other}"),
            ))
        }
    };
    let m = app.model(model_name(&o)?).await?;
    let width = m.n_embd;
    match o.get("dimensions") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_u64() == Some(width as u64) => {}
        Some(other) => {
            return Err(ApiError::invalid(
                "dimensions",
                format!(
                    "`dimensions` must be {width} for model {}: it declares no shorter (Matryoshka) embeddings; got {other}",
                    m.name
                ),
            ))
        }
    }
    let (vectors, n_tokens) = run::embed(app, &m, texts).await?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if as_base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let mut r = json_response(
        200,
        json!({
            "object": "list",
            "data": data,
            "model": m.name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        })
        .to_string(),
    );
    mark_unread(&mut r, "POST /v1/embeddings", &ignored);
    Ok(r)
}

/// Standard base64 with padding (RFC 4648 section 4), as OpenAI sends
/// `encoding_format: "base64"` vectors: little-endian f32 bytes.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        // RFC 4648 section 10.
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded, "{plain:?}");
        }
    }
}
