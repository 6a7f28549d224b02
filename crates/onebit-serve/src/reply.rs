//! The pieces every response is made of: a JSON body with its status, the
//! OpenAI error shape for an [`ApiError`], and the ids and times responses
//! carry. A leaf: it knows no route, protocol or model.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::api::ApiError;

/// `body` (JSON text) with `status`.
pub fn json_response(status: u16, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A 503 says when to retry.
pub fn retry_after(r: &mut Response, status: u16) {
    if status == 503 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = json_response(self.status, self.body());
        retry_after(&mut r, self.status);
        r
    }
}

/// The `error.type` Anthropic gives an answer of `status`.
pub fn anthropic_kind(status: u16) -> &'static str {
    match status {
        400 | 415 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 | 504 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// An error in Anthropic's shape, `{"type": "error", "error": {"type",
/// "message"}}`, with the status the OpenAI routes would give.
pub fn anthropic_error(e: &ApiError) -> Response {
    let body = serde_json::json!({
        "type": "error",
        "error": {"type": anthropic_kind(e.status), "message": e.message},
    });
    let mut r = json_response(e.status, body.to_string());
    retry_after(&mut r, e.status);
    r
}

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh random value (ids of responses and calls, unseeded sampling).
pub fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    static N: AtomicU64 = AtomicU64::new(0);
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// A server-sent-events response whose body is what `rx` receives, in
/// order, until every sender is gone.
pub fn event_stream(rx: tokio::sync::mpsc::UnboundedReceiver<axum::body::Bytes>) -> Response {
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
