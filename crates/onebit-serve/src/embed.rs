//! Embeddings: `POST /v1/embeddings` (OpenAI's shape) and the pooling both
//! it and Ollama's `/api/embed` use. A text's embedding is its final normed
//! hidden states (the forward's `Logits::Hidden`) pooled as the model
//! declares (GGUF `<arch>.pooling_type`; mean for a generative model that
//! declares none), then L2-normalized. Each input runs alone on a fresh
//! sequence, on the engine thread between decode steps, so a text's vector
//! is the same whatever else the request or the server is doing.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use onebit_model::{Logits, Model};
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use crate::api::ApiError;
use crate::http::{json_response, queue_full, read_body, App};
use crate::metrics::Metrics;

/// How the rows of a text's hidden states become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The mean over every position.
    Mean,
    /// The first position's (the BOS/CLS token).
    Cls,
    /// The last position's.
    Last,
}

/// The pooling a model runs, and where that rule came from.
#[derive(Clone, Debug)]
pub struct Pooling {
    pub kind: PoolKind,
    pub source: String,
}

impl Pooling {
    /// From the value of GGUF `<arch>.pooling_type` (llama.cpp's enum:
    /// 0 none, 1 mean, 2 cls, 3 last, 4 rank); `None` when the key is absent,
    /// which for a generative model means mean pooling. An error names the
    /// value this server does not implement.
    pub fn from_gguf(value: Option<i64>, key: &str) -> Result<Pooling, String> {
        let (kind, source) = match value {
            None | Some(-1) => (
                PoolKind::Mean,
                format!("{key} absent: mean over the final normed hidden states"),
            ),
            Some(1) => (PoolKind::Mean, format!("GGUF {key} = 1 (mean)")),
            Some(2) => (PoolKind::Cls, format!("GGUF {key} = 2 (cls)")),
            Some(3) => (PoolKind::Last, format!("GGUF {key} = 3 (last)")),
            Some(0) => return Err(format!("{key} = 0 (none: per-token embeddings) is not implemented; only mean, cls and last pooling are")),
            Some(4) => return Err(format!("{key} = 4 (rank: a reranker's score) is not implemented; only mean, cls and last pooling are")),
            Some(x) => return Err(format!("{key} = {x} is not a pooling type llama.cpp defines (0 to 4)")),
        };
        Ok(Pooling { kind, source })
    }

    /// Pools `rows` ([n][width]) into one L2-normalized vector; the mean is
    /// kept in f64 up to the normalization.
    pub fn pool(&self, rows: &[f32], width: usize) -> Vec<f32> {
        normalize(&self.pooled(rows, width))
    }

    /// Pools `rows` ([n][width]), passes the pooled vector (rounded to f32,
    /// what the head's matrices read) through the model's pooled head
    /// (`Model::pooled_head`: EmbeddingGemma's dense layers), and
    /// L2-normalizes the result, in llama.cpp's order.
    pub fn pool_through(
        &self,
        rows: &[f32],
        width: usize,
        head: impl Fn(&[f32]) -> Vec<f32>,
    ) -> Vec<f32> {
        let pooled: Vec<f32> = self.pooled(rows, width).iter().map(|&a| a as f32).collect();
        let out: Vec<f64> = head(&pooled).into_iter().map(f64::from).collect();
        normalize(&out)
    }

    /// The pooled vector in f64: the mean, the first or the last row.
    fn pooled(&self, rows: &[f32], width: usize) -> Vec<f64> {
        let n = rows.len() / width;
        let mut v = vec![0f64; width];
        let pick: Box<dyn Iterator<Item = &[f32]>> = match self.kind {
            PoolKind::Mean => Box::new(rows.chunks_exact(width)),
            PoolKind::Cls => Box::new(rows.chunks_exact(width).take(1)),
            PoolKind::Last => Box::new(rows.chunks_exact(width).skip(n.saturating_sub(1))),
        };
        let mut count = 0usize;
        for r in pick {
            for (a, &x) in v.iter_mut().zip(r) {
                *a += f64::from(x);
            }
            count += 1;
        }
        let count = count.max(1) as f64;
        v.iter_mut().for_each(|a| *a /= count);
        v
    }
}

/// `v / |v|` (a zero vector stays zero), in f32.
fn normalize(v: &[f64]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    v.iter().map(|x| (x * scale) as f32).collect()
}

/// The inputs of a request: one text or a list of texts, each non-empty.
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

/// Inputs one request may carry at most.
pub const MAX_INPUTS: usize = 256;

/// The vectors of `texts` and the number of tokens they took.
pub async fn embed(app: &Arc<App>, texts: Vec<String>) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let pooling = app.pooling.clone().map_err(|why| {
        ApiError::invalid(
            "model",
            format!("model {} cannot give embeddings: {why}", app.model_name),
        )
    })?;
    // Tokenize on the blocking pool, as prompts are.
    let app2 = app.clone();
    let ids: Vec<Vec<u32>> = tokio::task::spawn_blocking(move || {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let ids = app2.tok.encode(t, true).map_err(|e| {
                    ApiError::invalid("input", format!("cannot tokenize input {i}: {e}"))
                })?;
                if ids.is_empty() {
                    return Err(ApiError::invalid(
                        "input",
                        format!("input {i} has no tokens"),
                    ));
                }
                if ids.len() > app2.ctx {
                    return Err(ApiError::invalid(
                        "input",
                        format!(
                            "input {i} has {} tokens, but this server's context holds {}",
                            ids.len(),
                            app2.ctx
                        ),
                    )
                    .with_code("context_length_exceeded"));
                }
                Ok(ids)
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| ApiError::server(format!("tokenizing failed: {e}")))??;
    let n_tokens = ids.iter().map(Vec::len).sum();
    let (tx, rx) = oneshot::channel();
    let task = Box::new(move |model: &Model| {
        let width = model.sem.dims.n_embd;
        let r = ids
            .iter()
            .map(|ids| {
                let mut state = model.new_state();
                model
                    .forward(&mut state, ids, Logits::Hidden)
                    .map(|rows| pooling.pool_through(&rows, width, |v| model.pooled_head(v)))
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, String>>();
        let _ = tx.send(r);
    });
    if app.engine.run_task(task).is_err() {
        return Err(queue_full(app));
    }
    let vectors = rx
        .await
        .map_err(|_| ApiError::server("the engine stopped before finishing the request"))?
        .map_err(ApiError::server)?;
    Ok((vectors, n_tokens))
}

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

/// The request fields /v1/embeddings reads; any other is refused by name.
const FIELDS: [&str; 5] = ["input", "model", "encoding_format", "dimensions", "user"];

async fn embeddings_inner(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(app, headers, body).await?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::invalid(None, "the body must be a JSON object"));
    };
    refuse_unknown(&o, &FIELDS)?;
    let texts = inputs(o.get("input"), "input")?;
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
    let width = app.n_embd;
    match o.get("dimensions") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_u64() == Some(width as u64) => {}
        Some(other) => {
            return Err(ApiError::invalid(
                "dimensions",
                format!(
                    "`dimensions` must be {width} for model {}: it declares no shorter (Matryoshka) embeddings; got {other}",
                    app.model_name
                ),
            ))
        }
    }
    let (vectors, n_tokens) = embed(app, texts).await?;
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
    Ok(json_response(
        200,
        json!({
            "object": "list",
            "data": data,
            "model": app.model_name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        })
        .to_string(),
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_types_follow_llamacpp_enum_and_unknown_ones_are_refused() {
        let k = "llama.pooling_type";
        assert_eq!(Pooling::from_gguf(None, k).unwrap().kind, PoolKind::Mean);
        assert_eq!(Pooling::from_gguf(Some(1), k).unwrap().kind, PoolKind::Mean);
        assert_eq!(Pooling::from_gguf(Some(2), k).unwrap().kind, PoolKind::Cls);
        assert_eq!(Pooling::from_gguf(Some(3), k).unwrap().kind, PoolKind::Last);
        for bad in [0, 4, 7] {
            let e = Pooling::from_gguf(Some(bad), k).unwrap_err();
            assert!(e.contains(k) && e.contains(&bad.to_string()), "{e}");
        }
    }

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

    #[test]
    fn pooling_arithmetic() {
        // Rows (3,0), (1,0), (0,4): mean (4/3, 4/3) normalizes to (1,1)/sqrt2;
        // cls (3,0) to (1,0); last (0,4) to (0,1).
        let rows = [3.0, 0.0, 1.0, 0.0, 0.0, 4.0];
        let p = |kind| Pooling {
            kind,
            source: String::new(),
        };
        let m = p(PoolKind::Mean).pool(&rows, 2);
        let h = std::f32::consts::FRAC_1_SQRT_2;
        assert!((m[0] - h).abs() < 1e-7 && (m[1] - h).abs() < 1e-7, "{m:?}");
        assert_eq!(p(PoolKind::Cls).pool(&rows, 2), vec![1.0, 0.0]);
        assert_eq!(p(PoolKind::Last).pool(&rows, 2), vec![0.0, 1.0]);
        // Rows (1,0), (0,5), (0,0): mean (1/3, 5/3), normalized (1,5)/sqrt26.
        // Rounding the mean to f32 first would give 0.19611615 (1/3 and 5/3
        // round differently); kept in f64 it is 1/sqrt26 to f32.
        let m = p(PoolKind::Mean).pool(&[1.0, 0.0, 0.0, 5.0, 0.0, 0.0], 2);
        let r = 26f64.sqrt();
        assert_eq!(m, vec![(1.0 / r) as f32, (5.0 / r) as f32]);
    }
}
