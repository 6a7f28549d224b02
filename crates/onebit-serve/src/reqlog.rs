//! The access log: one line per request on stderr, written when its
//! response body is done (sent whole, or dropped by a client that hung up),
//! so a stream's line counts its whole run. The line holds the method, the
//! route (the request's path), the status, and, when the request reached a
//! model, its name, the prompt, completion and cached tokens, the time to
//! the first token and the whole duration. `--log-format text` (the
//! default) writes `key=value` words for people, `json` one JSON object per
//! line for machines; a field a request never reached is `-` or `null`.
//!
//! The invariant: every request the routes answer writes exactly one line,
//! whatever answered it (a handler, the access checks, a 404 fallback).
//! What a run adds is reported through a task-local [`RunLog`] the
//! middleware opens around the handler ([`current`]), so no handler signature
//! carries it.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use serde_json::{json, Value};

/// How the lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// `[access] POST /v1/chat/completions 200 model=.. prompt_tokens=..`.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// What a request's run tells its log line.
#[derive(Clone, Debug, Default)]
pub struct RunInfo {
    pub model: Option<String>,
    pub prompt_tokens: Option<usize>,
    pub completion_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
    pub first_token: Option<Instant>,
    /// Images the vision tower encoded for the request, and the seconds.
    pub images: usize,
    pub image_encode_secs: f64,
}

/// A request's [`RunInfo`], shared by the middleware and the run.
pub type RunLog = Arc<Mutex<RunInfo>>;

tokio::task_local! {
    static CURRENT: RunLog;
}

/// The running request's log slot (inside the middleware's scope: a
/// handler's own task; a task it spawns takes the slot along), or a
/// detached one outside any request.
pub fn current() -> RunLog {
    CURRENT.try_with(Arc::clone).unwrap_or_default()
}

/// Updates a slot (a poisoned lock, a panic elsewhere, is taken as it is).
pub fn update(log: &RunLog, f: impl FnOnce(&mut RunInfo)) {
    let mut g = log.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut g);
}

/// One finished request, as its line says it.
#[derive(Clone, Debug)]
pub struct Line {
    pub method: String,
    pub route: String,
    pub status: u16,
    pub run: RunInfo,
    pub ttft_ms: Option<f64>,
    pub duration_ms: f64,
}

impl Line {
    pub fn render(&self, format: LogFormat) -> String {
        let r = &self.run;
        match format {
            LogFormat::Json => {
                let mut v = json!({
                    "log": "access",
                    "method": self.method,
                    "route": self.route,
                    "status": self.status,
                    "model": r.model,
                    "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens,
                    "cached_tokens": r.cached_tokens,
                    "ttft_ms": self.ttft_ms.map(round1),
                    "duration_ms": round1(self.duration_ms),
                });
                // Only a request whose images were encoded says so.
                if r.images > 0 {
                    v["images_encoded"] = r.images.into();
                    v["image_encode_ms"] = round1(r.image_encode_secs * 1e3);
                }
                v.to_string()
            }
            LogFormat::Text => {
                let n = |v: Option<usize>| v.map_or("-".to_string(), |v| v.to_string());
                format!(
                    "[access] {} {} {} model={} prompt_tokens={} completion_tokens={} cached_tokens={} ttft_ms={} duration_ms={:.1}",
                    self.method,
                    self.route,
                    self.status,
                    r.model.as_deref().unwrap_or("-"),
                    n(r.prompt_tokens),
                    n(r.completion_tokens),
                    n(r.cached_tokens),
                    self.ttft_ms.map_or("-".to_string(), |t| format!("{t:.1}")),
                    self.duration_ms,
                ) + &if r.images > 0 {
                    format!(
                        " images_encoded={} image_encode_ms={:.1}",
                        r.images,
                        r.image_encode_secs * 1e3
                    )
                } else {
                    String::new()
                }
            }
        }
    }
}

fn round1(ms: f64) -> Value {
    json!((ms * 10.0).round() / 10.0)
}

/// The middleware: runs the request inside its log slot and gives back the
/// response with a body that writes the line when it is done.
pub async fn log(State(format): State<LogFormat>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().to_string();
    let route = req.uri().path().to_string();
    let slot = RunLog::default();
    let r = CURRENT.scope(slot.clone(), next.run(req)).await;
    let status = r.status().as_u16();
    let (parts, body) = r.into_parts();
    let logged = Logged {
        inner: body,
        pending: Some(Pending {
            method,
            route,
            status,
            start,
            slot,
            format,
        }),
    };
    Response::from_parts(parts, Body::new(logged))
}

/// What the line needs once the body is done.
struct Pending {
    method: String,
    route: String,
    status: u16,
    start: Instant,
    slot: RunLog,
    format: LogFormat,
}

impl Pending {
    fn line(self) -> Line {
        let run = self.slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let ms = |t: Instant| t.duration_since(self.start).as_secs_f64() * 1e3;
        Line {
            method: self.method,
            route: self.route,
            status: self.status,
            ttft_ms: run.first_token.map(ms),
            duration_ms: ms(Instant::now()),
            run,
        }
    }
}

/// A response body that writes its request's line when it is dropped
/// (after its last frame, or when the client went away); it passes every
/// frame, size hint and end through unchanged.
struct Logged {
    inner: Body,
    pending: Option<Pending>,
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(p) = self.pending.take() {
            let format = p.format;
            eprintln!("{}", p.line().render(format));
        }
    }
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        // `Body` is Unpin (a boxed body inside), so this one is too.
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_in_both_formats_carry_every_field() {
        let line = Line {
            method: "POST".into(),
            route: "/v1/chat/completions".into(),
            status: 200,
            run: RunInfo {
                model: Some("smol".into()),
                prompt_tokens: Some(12),
                completion_tokens: Some(3),
                cached_tokens: Some(8),
                first_token: None,
                images: 0,
                image_encode_secs: 0.0,
            },
            ttft_ms: Some(41.26),
            duration_ms: 90.04,
        };
        assert_eq!(
            line.render(LogFormat::Text),
            "[access] POST /v1/chat/completions 200 model=smol prompt_tokens=12 completion_tokens=3 cached_tokens=8 ttft_ms=41.3 duration_ms=90.0"
        );
        let v: Value = serde_json::from_str(&line.render(LogFormat::Json)).unwrap();
        assert_eq!(
            v,
            json!({"log": "access", "method": "POST", "route": "/v1/chat/completions", "status": 200,
                   "model": "smol", "prompt_tokens": 12, "completion_tokens": 3, "cached_tokens": 8,
                   "ttft_ms": 41.3, "duration_ms": 90.0})
        );
        // Images encoded for the request: said, with the time, in both.
        let seen = Line {
            run: RunInfo {
                images: 2,
                image_encode_secs: 0.01234,
                ..line.run.clone()
            },
            ..line.clone()
        };
        assert!(seen
            .render(LogFormat::Text)
            .ends_with(" duration_ms=90.0 images_encoded=2 image_encode_ms=12.3"));
        let v: Value = serde_json::from_str(&seen.render(LogFormat::Json)).unwrap();
        assert_eq!(
            (v["images_encoded"].as_u64(), v["image_encode_ms"].as_f64()),
            (Some(2), Some(12.3))
        );
        // A request that reached no model: dashes and nulls.
        let bare = Line {
            run: RunInfo::default(),
            ttft_ms: None,
            status: 404,
            ..line
        };
        assert!(bare.render(LogFormat::Text).contains(
            " 404 model=- prompt_tokens=- completion_tokens=- cached_tokens=- ttft_ms=- "
        ));
        let v: Value = serde_json::from_str(&bare.render(LogFormat::Json)).unwrap();
        assert_eq!(
            (v["model"].clone(), v["ttft_ms"].clone()),
            (Value::Null, Value::Null)
        );
    }
}
