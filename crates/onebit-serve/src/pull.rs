//! Ollama's `/api/pull` and `/api/delete`: a model by name fetched into the
//! binary's store (the [`Catalog`]) and served from then on, or removed from
//! the store and no longer served. A protocol module: it parses the body
//! itself, runs the blocking pull off the runtime's thread and streams its
//! steps in Ollama's shape (`{"status":"pulling manifest"}`, then per file
//! `{"status":"pulling <digest>","digest","total","completed"}`, then
//! `verifying sha256 digest`, `writing manifest`, `success`; a failure is
//! one `{"error": ...}` line).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use serde_json::{json, Map, Value};

use crate::api::ApiError;
use crate::app::{App, Catalog, PullStep};
use crate::fields::{check_unread, mark_unread, object, unread};
use crate::reply::json_response;

const PULL_FIELDS: [&str; 4] = ["model", "name", "stream", "insecure"];

fn error(e: ApiError) -> Response {
    json_response(e.status, json!({"error": e.message}).to_string())
}

/// `model` (or the older `name`) of a pull or delete body.
fn name_of(o: &Map<String, Value>) -> Result<String, ApiError> {
    match o.get("model").or_else(|| o.get("name")) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(v) => Err(ApiError::invalid(
            "model",
            format!("`model` must be a model's name, ORG/REPO[:QUANT]; got {v}"),
        )),
        None => Err(ApiError::invalid(
            "model",
            "`model` is missing: name the model, ORG/REPO[:QUANT]",
        )),
    }
}

fn catalog(app: &App) -> Result<Arc<dyn Catalog>, ApiError> {
    app.catalog.clone().ok_or_else(|| {
        ApiError::invalid(None, "this server has no model store to pull into").status(501)
    })
}

fn status_line(s: &PullStep) -> Value {
    match s {
        PullStep::File {
            digest,
            total,
            completed,
        } => json!({
            "status": format!("pulling {}", &digest[..digest.len().min(12)]),
            "digest": format!("sha256:{digest}"),
            "total": total,
            "completed": completed,
        }),
        PullStep::Status(s) => json!({ "status": s }),
    }
}

/// `POST /api/pull`.
pub async fn pull(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = app.read_body(&headers, body).await?;
        let o = object(&body)?;
        let unknown = unread(&o, &PULL_FIELDS, "");
        check_unread(app.strict_fields, &unknown)?;
        let name = name_of(&o)?;
        let stream = match o.get("stream") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(ApiError::invalid("stream", format!("`stream` must be a boolean; got {v}"))),
        };
        match o.get("insecure") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(v) => {
                return Err(ApiError::invalid(
                    "insecure",
                    format!("`insecure` is not taken ({v}): the Hub this server pulls from is set by HF_ENDPOINT where it runs"),
                ))
            }
        }
        let cat = catalog(&app)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
        let task = {
            let app = app.clone();
            let name = name.clone();
            tokio::task::spawn_blocking(move || {
                let _ = tx.send(json!({"status": "pulling manifest"}));
                let r = cat.pull(&name, &mut |s| {
                    let _ = tx.send(status_line(&s));
                });
                match r {
                    Ok(source) => {
                        let _ = tx.send(json!({"status": "verifying sha256 digest"}));
                        let _ = tx.send(json!({"status": "writing manifest"}));
                        app.models.add(source);
                        let _ = tx.send(json!({"status": "success"}));
                        Ok(())
                    }
                    Err((status, msg)) => {
                        let _ = tx.send(json!({"error": msg}));
                        Err((status, msg))
                    }
                }
            })
        };
        if !stream {
            return match task.await {
                Ok(Ok(())) => {
                    let mut r = json_response(200, json!({"status": "success"}).to_string());
                    mark_unread(&mut r, "POST /api/pull", &unknown);
                    Ok(r)
                }
                Ok(Err((status, msg))) => Err(ApiError::invalid("model", msg).status(status)),
                Err(e) => Err(ApiError::server(format!("the pull stopped: {e}"))),
            };
        }
        let body = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|v| {
                (
                    Ok::<_, std::convert::Infallible>(format!("{v}\n")),
                    rx,
                )
            })
        });
        let mut resp = Response::new(Body::from_stream(body));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        );
        mark_unread(&mut resp, "POST /api/pull", &unknown);
        Ok(resp)
    }
    .await;
    r.unwrap_or_else(error)
}

/// `DELETE /api/delete`.
pub async fn delete(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = app.read_body(&headers, body).await?;
        let o = object(&body)?;
        let unknown = unread(&o, &["model", "name"], "");
        check_unread(app.strict_fields, &unknown)?;
        let name = name_of(&o)?;
        let cat = catalog(&app)?;
        let gone = {
            let name = name.clone();
            tokio::task::spawn_blocking(move || cat.delete(&name))
                .await
                .map_err(|e| ApiError::server(format!("the delete stopped: {e}")))?
        };
        gone.map_err(|(status, msg)| ApiError::invalid("model", msg).status(status))?;
        app.models.remove(&name);
        let mut r = json_response(200, String::new());
        mark_unread(&mut r, "DELETE /api/delete", &unknown);
        Ok(r)
    }
    .await;
    r.unwrap_or_else(error)
}
