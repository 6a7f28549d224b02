//! The outermost router: liveness and readiness for load balancers and
//! Kubernetes, in front of the API routes.
//!
//! | route | loading | ready | draining |
//! |---|---|---|---|
//! | `GET /health/live` | 200 | 200 | 200 |
//! | `GET /health` | 503 `loading` | the API's own `/health` | 503 `draining` |
//! | anything else | 503 `loading`, `Retry-After: 1` | the API's routes | the API's routes (on connections already open) |
//!
//! A replica is "ready" only between the end of the model load and the
//! shutdown signal, so a proxy health-checking `/health` sends it nothing
//! before it can answer and stops sending the moment it begins to drain.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;
use tower::ServiceExt;

/// Where a replica is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Loading = 0,
    Ready = 1,
    Draining = 2,
}

/// The API's routes once they exist, and the phase.
#[derive(Default)]
pub struct Gate {
    api: OnceLock<Router>,
    phase: AtomicU8,
}

impl Gate {
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            _ => Phase::Draining,
        }
    }

    /// Moves to `p`; draining is final (a late `open` does not undo it).
    pub fn set_phase(&self, p: Phase) {
        let _ = self
            .phase
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now != Phase::Draining as u8).then_some(p as u8)
            });
    }

    /// Installs the API's routes and reports ready.
    pub fn open(&self, api: Router) {
        let _ = self.api.set(api);
        self.set_phase(Phase::Ready);
    }
}

/// The router the listener serves.
pub fn router(gate: Arc<Gate>) -> Router {
    Router::new()
        .route("/health/live", get(live))
        .fallback(forward)
        .with_state(gate)
}

fn status(code: StatusCode, body: serde_json::Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

async fn live() -> Response {
    status(StatusCode::OK, json!({"status": "alive"}))
}

async fn forward(State(gate): State<Arc<Gate>>, req: Request) -> Response {
    let phase = gate.phase();
    let health = req.uri().path() == "/health";
    match (gate.api.get(), phase) {
        (_, Phase::Draining) if health => status(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "draining", "message": "this replica is shutting down"}),
        ),
        (Some(api), _) => match api.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        },
        (None, _) => {
            let mut r = status(
                StatusCode::SERVICE_UNAVAILABLE,
                if health {
                    json!({"status": "loading", "message": "the model is loading"})
                } else {
                    json!({"error": {
                        "message": "the model is still loading; retry shortly",
                        "type": "server_error",
                        "param": null,
                        "code": "loading",
                    }})
                },
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r.into_response()
        }
    }
}
