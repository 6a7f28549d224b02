//! The router: which path goes to which handler, behind the access checks.
//! The top of the ordered modules (routes -> protocols -> run -> app): the
//! protocol modules hold the handlers; the few answered here (`/health`,
//! `/metrics`, unknown paths) read only the application state.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::routing::{delete, get, post};
use axum::Router;
use serde_json::json;

use crate::access::{self, Access};
use crate::app::App;
use crate::reply::json_response;
use crate::reqlog;
use crate::{anthropic, embed, ollama, openai, page, pull, responses, tokenize};

/// The routes, behind (outermost first) the access log, the Host and key checks, then CORS
/// when origins are configured. CORS sits inside the Host check (a rebinding
/// page gets 403 even for a preflight) and outside the key check (a browser's
/// preflight carries no key).
pub fn router(
    app: Arc<App>,
    access: Arc<Access>,
    cors: Option<tower_http::cors::CorsLayer>,
) -> Router {
    let log_format = app.log_format;
    let mut r = Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*id}", get(openai::model))
        .route("/v1/embeddings", post(embed::embeddings))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route("/api/show", post(ollama::show))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/api/pull", post(pull::pull))
        .route("/api/delete", delete(pull::delete))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/", get(page::page))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(access::not_found)
        .with_state(app);
    if let Some(c) = cors {
        r = r.layer(c);
    }
    // Wrapped whole, so the checks see the method router's finished 405
    // (its Allow header is set after the layers of each route run).
    Router::new()
        .fallback_service(r)
        .layer(axum::middleware::from_fn_with_state(access, access::check))
        // Outermost: every answer, the checks' refusals too, gets its line.
        .layer(axum::middleware::from_fn_with_state(
            log_format,
            reqlog::log,
        ))
}

async fn health(State(app): State<Arc<App>>) -> Response {
    if app.draining.load(Ordering::Relaxed) {
        json_response(
            503,
            json!({"status": "draining", "message": "the server is shutting down"}).to_string(),
        )
    } else if app.models.all_loaded().iter().all(|m| m.engine.alive()) {
        json_response(200, json!({"status": "ok"}).to_string())
    } else {
        json_response(
            503,
            json!({"status": "error", "message": "the engine has stopped"}).to_string(),
        )
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut text = app.metrics.render();
    app.models.render_metrics(&mut text);
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}
