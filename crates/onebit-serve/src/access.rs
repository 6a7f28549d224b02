//! Who may use the server, checked before any route runs: the `Host` header
//! against DNS rebinding (403), the browser's `Origin` against cross-site
//! requests (403), the API key on `/v1/*`, `/api/*`, `/tokenize`,
//! `/detokenize` and `/metrics` (401; `Authorization: Bearer` or Anthropic's
//! `x-api-key`), and the JSON body of a 405 (axum's
//! own is empty). CORS is tower-http's layer ([`cors_layer`]), admitting
//! the same origins.
//!
//! Cross-site requests are stopped by `Origin`, Ollama's way: a browser
//! names the page's origin on every cross-origin request and every POST, a
//! form's included. Allowed are the loopback origins (`localhost`,
//! `127.0.0.1`, `[::1]`, http or https, any port), the app schemes
//! (`app://`, `file://`, `tauri://`), the server's own origin (its chat
//! page) and every `--cors-origin`; any other origin, and `Origin: null`
//! (a sandboxed or file page, a redirect), is a 403. A request with no
//! `Origin` comes from no page (curl, an SDK, a server), so its body is
//! taken whatever its Content-Type says as long as it parses as JSON; one
//! a browser marks `Sec-Fetch-Site: cross-site` or `same-site` without an
//! `Origin` is refused all the same.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::api::ApiError;

/// The access rules, from the command line.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Accepted bearer keys; empty: no key needed.
    pub api_keys: Vec<String>,
    /// `/metrics` answers without a key.
    pub metrics_public: bool,
    /// Host names accepted besides `localhost`, the bound host and IP
    /// literals (lower case); `*` accepts any.
    pub allow_hosts: Vec<String>,
    /// The host the server was bound to (lower case).
    pub bound_host: String,
    /// The origins CORS admits (`*`: any), so that a 401 made before the
    /// CORS layer runs still carries its headers.
    pub cors_origins: Vec<String>,
}

impl Access {
    /// Whether a `Host` header value names this server. IP literals always
    /// do: a page can only reach an address by name through DNS, so only a
    /// name can be rebound.
    pub fn host_allowed(&self, host: &str) -> bool {
        if self.allow_hosts.iter().any(|h| h == "*") {
            return true;
        }
        let name = host_name(host).to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        if name.parse::<IpAddr>().is_ok() || name == "localhost" || name == self.bound_host {
            return true;
        }
        self.allow_hosts.iter().any(|h| h == name)
    }

    /// The `Access-Control-Allow-Origin` value for a request from
    /// `origin`, as the CORS layer would give it; `None` for an origin not
    /// admitted.
    fn cors_allow(&self, origin: Option<&HeaderValue>, host: &str) -> Option<HeaderValue> {
        let origin = origin?;
        if self.cors_origins.iter().any(|o| o == "*") {
            return Some(HeaderValue::from_static("*"));
        }
        origin_allowed(&self.cors_origins, origin.as_bytes(), host).then(|| origin.clone())
    }

    /// Whether `path` needs the key.
    fn guarded(&self, path: &str) -> bool {
        !self.api_keys.is_empty()
            && (path.starts_with("/v1/")
                || path == "/v1"
                || path.starts_with("/api/")
                || path == "/tokenize"
                || path == "/detokenize"
                || (path == "/metrics" && !self.metrics_public))
    }

    /// Whether the request's key names one of ours: `Authorization: Bearer
    /// KEY`, or `x-api-key: KEY` as Anthropic's clients send it (either
    /// may be given; a request with both passes when either is valid).
    fn key_ok(&self, headers: &HeaderMap) -> Result<(), &'static str> {
        let bearer = headers.get(header::AUTHORIZATION);
        let x_key = headers.get(X_API_KEY);
        if bearer.is_none() && x_key.is_none() {
            return Err("no API key was given: send it as `Authorization: Bearer KEY` (or `x-api-key: KEY`)");
        }
        let mut keys: Vec<&[u8]> = Vec::new();
        if let Some(v) = x_key {
            keys.push(v.as_bytes());
        }
        let mut scheme_bad = false;
        if let Some(v) = bearer {
            let v = v.to_str().unwrap_or("");
            let (scheme, key) = v.split_once(' ').unwrap_or((v, ""));
            if scheme.eq_ignore_ascii_case("bearer") {
                keys.push(key.trim().as_bytes());
            } else {
                scheme_bad = true;
            }
        }
        // Every key is compared in full, whatever matched before: the time
        // taken does not tell which bytes were right.
        let hit = keys.iter().fold(false, |acc, key| {
            self.api_keys
                .iter()
                .fold(acc, |acc, k| acc | same_bytes(k.as_bytes(), key))
        });
        if hit {
            Ok(())
        } else if scheme_bad && keys.is_empty() {
            Err("the Authorization header must use the Bearer scheme: `Authorization: Bearer KEY`")
        } else {
            Err("the API key given is not valid for this server")
        }
    }
}

/// Anthropic's key header.
const X_API_KEY: &str = "x-api-key";

/// Equality whose time depends on the lengths only.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).unwrap_or(&0) ^ b.get(i).unwrap_or(&0);
    }
    diff == 0
}

/// The schemes of desktop apps' pages (Electron's `app://`, a local
/// `file://`, Tauri's `tauri://`), allowed as Ollama allows them.
const APP_SCHEMES: [&str; 3] = ["app", "file", "tauri"];

/// The loopback names an `http`/`https` origin may carry on any port.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Whether a browser page of `origin` may use the server reached as
/// `host`: a loopback origin, an app scheme, the server's own origin
/// (`http(s)://` + `host`), or one of `listed` (`*`: any). `null` is not.
pub fn origin_allowed(listed: &[String], origin: &[u8], host: &str) -> bool {
    let Ok(origin) = std::str::from_utf8(origin) else {
        return false;
    };
    if listed.iter().any(|o| o == "*" || o == origin) {
        return true;
    }
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    let scheme = scheme.to_ascii_lowercase();
    if APP_SCHEMES.contains(&scheme.as_str()) {
        return true;
    }
    if scheme != "http" && scheme != "https" {
        return false;
    }
    let authority = rest.to_ascii_lowercase();
    if !host.is_empty() && authority == host.to_ascii_lowercase() {
        return true;
    }
    // The name without a port (a v6 literal keeps its brackets).
    let name = match authority.rsplit_once(':') {
        Some((n, port))
            if port.bytes().all(|b| b.is_ascii_digit())
                && (!n.starts_with('[') || n.ends_with(']')) =>
        {
            n
        }
        _ => authority.as_str(),
    };
    LOOPBACK.contains(&name)
}

/// A 403 for a browser request from an origin not allowed, in the shape of
/// the API the path belongs to.
fn origin_refused(path: &str, why: String) -> Response {
    let e = ApiError::invalid(None, why)
        .status(403)
        .with_code("origin_not_allowed");
    if path.starts_with("/api/") || path == "/api" {
        let mut r = serde_json::json!({"error": e.message})
            .to_string()
            .into_response();
        *r.status_mut() = axum::http::StatusCode::FORBIDDEN;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return r;
    }
    e.into_response()
}

/// The cross-site check: `Some(403)` for a page's request the rules above
/// refuse.
fn cross_site(a: &Access, req: &Request, host: &str) -> Option<Response> {
    let path = req.uri().path();
    match req.headers().get(header::ORIGIN) {
        Some(o) if o.as_bytes() == b"null" => Some(origin_refused(
            path,
            "requests from `Origin: null` (a sandboxed or local page, or a redirect) are refused; serve the page from an origin and start the server with --cors-origin ORIGIN".into(),
        )),
        Some(o) if !origin_allowed(&a.cors_origins, o.as_bytes(), host) => Some(origin_refused(
            path,
            format!(
                "requests from the page origin {:?} are refused (cross-site); start the server with --cors-origin {} to allow it",
                String::from_utf8_lossy(o.as_bytes()),
                String::from_utf8_lossy(o.as_bytes())
            ),
        )),
        Some(_) => None,
        None => {
            let site = req.headers().get("sec-fetch-site").map(HeaderValue::as_bytes);
            matches!(site, Some(b"cross-site") | Some(b"same-site")).then(|| {
                origin_refused(
                    path,
                    "a browser request from another site with no Origin is refused".into(),
                )
            })
        }
    }
}

/// The host part of a `Host` value: `name`, `name:port`, `[v6]:port`.
fn host_name(h: &str) -> &str {
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match h.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => h,
    }
}

/// The middleware: Host first (a rebinding page must learn nothing, not even
/// that a key is needed), then the key, then the route; a 405 gets a JSON body.
/// Two `Host` headers are a 400 (RFC 9112, 3.2: a server must answer 400
/// to more than one), and the authority of an absolute-form target
/// (`GET http://name/v1/models`) must name this server as `Host` must: both
/// are checked when both are given.
pub async fn check(State(a): State<Arc<Access>>, req: Request, next: Next) -> Response {
    let hosts = req.headers().get_all(header::HOST).iter().count();
    if hosts > 1 {
        return ApiError::invalid(
            None,
            format!("the request has {hosts} Host headers; HTTP/1.1 allows exactly one"),
        )
        .with_code("bad_host")
        .into_response();
    }
    if let Some(auth) = req.uri().authority() {
        if !a.host_allowed(auth.as_str()) {
            return ApiError::invalid(
                None,
                format!("the request target names the host {:?}, which is not this server's; start it with --allow-host NAME to accept that name", auth.as_str()),
            )
            .status(403)
            .with_code("host_not_allowed")
            .into_response();
        }
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    match host {
        None => {
            return ApiError::invalid(None, "the request has no Host header")
                .status(403)
                .with_code("host_not_allowed")
                .into_response()
        }
        Some(h) if !a.host_allowed(&h) => {
            return ApiError::invalid(
                None,
                format!("Host {h:?} is not this server's; start it with --allow-host NAME to accept that name"),
            )
            .status(403)
            .with_code("host_not_allowed")
            .into_response()
        }
        Some(_) => {}
    }
    let host = host.unwrap_or_default();
    if let Some(refused) = cross_site(&a, &req, &host) {
        return refused;
    }
    if a.guarded(req.uri().path()) && req.method() != Method::OPTIONS {
        if let Err(why) = a.key_ok(req.headers()) {
            let e = ApiError::invalid(None, why)
                .status(401)
                .with_code("invalid_api_key");
            // Anthropic's routes answer in Anthropic's error shape.
            let mut r = if req.uri().path().starts_with("/v1/messages") {
                crate::reply::anthropic_error(&e)
            } else {
                e.into_response()
            };
            let h = r.headers_mut();
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            // The key check runs outside the CORS layer (a preflight has no
            // key): without these a browser reports a CORS failure, not the 401.
            if let Some(allow) = a.cors_allow(req.headers().get(header::ORIGIN), &host) {
                if allow != "*" {
                    h.insert(header::VARY, HeaderValue::from_static("origin"));
                }
                h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
            }
            return r;
        }
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let r = next.run(req).await;
    if r.status().as_u16() != 405 {
        return r;
    }
    let allow = r.headers().get(header::ALLOW).cloned();
    let allowed = allow
        .as_ref()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let mut out = ApiError::invalid(
        None,
        format!("{path} does not take {method} requests; it takes {allowed}"),
    )
    .status(405)
    .with_code("method_not_allowed")
    .into_response();
    if let Some(v) = allow {
        out.headers_mut().insert(header::ALLOW, v);
    }
    out
}

/// The 404 of a path no route serves: Ollama's shape (`{"error": ".."}`)
/// under `/api/`, OpenAI's elsewhere.
pub async fn not_found(uri: axum::http::Uri) -> Response {
    let e = ApiError::invalid(None, format!("no such endpoint: {}", uri.path())).status(404);
    if uri.path().starts_with("/api/") || uri.path() == "/api" {
        let mut r = serde_json::json!({"error": e.message})
            .to_string()
            .into_response();
        *r.status_mut() = axum::http::StatusCode::NOT_FOUND;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return r;
    }
    e.into_response()
}

/// CORS for the origins [`origin_allowed`] admits: the loopback and app
/// origins, the server's own, and the configured ones (`*`: any). Other
/// origins never reach it: the check before refuses them.
pub fn cors_layer(origins: &[String]) -> Result<CorsLayer, String> {
    for o in origins {
        HeaderValue::from_str(o).map_err(|_| {
            format!("--cors-origin {o:?} is not a valid origin (like https://example.com)")
        })?;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let listed = origins.to_vec();
        AllowOrigin::predicate(move |origin, parts| {
            let host = parts
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            origin_allowed(&listed, origin.as_bytes(), host)
        })
    };
    Ok(CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
        .max_age(std::time::Duration::from_secs(600)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(hosts: &[&str]) -> Access {
        Access {
            allow_hosts: hosts.iter().map(|s| s.to_string()).collect(),
            bound_host: "127.0.0.1".into(),
            ..Access::default()
        }
    }

    #[test]
    fn hosts_by_name_need_allowing_ip_literals_do_not() {
        let a = access(&["myhost.lan"]);
        for ok in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
            "10.0.0.5:80",
            "myhost.lan:8080",
            "myhost.lan.",
        ] {
            assert!(a.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "myhost.lan.evil",
        ] {
            assert!(!a.host_allowed(bad), "{bad}");
        }
        assert!(access(&["*"]).host_allowed("evil.example"));
    }

    /// The middleware over a router with `/v1/models` and `/health` and the
    /// crate's 404, behind a CORS layer for `https://app.example` as
    /// `http::router` stacks them; the status and head of one request.
    fn run(a: Access, req: axum::http::Request<axum::body::Body>) -> (u16, HeaderMap, String) {
        use tower::ServiceExt;
        let inner = axum::Router::new()
            .route("/v1/models", axum::routing::get(|| async { "models" }))
            .route("/health", axum::routing::get(|| async { "ok" }))
            .fallback(not_found)
            .layer(cors_layer(&a.cors_origins).unwrap());
        let app = axum::Router::new()
            .fallback_service(inner)
            .layer(axum::middleware::from_fn_with_state(Arc::new(a), check));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let r = app.oneshot(req).await.unwrap();
            let (parts, body) = r.into_parts();
            let b = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            (
                parts.status.as_u16(),
                parts.headers,
                String::from_utf8_lossy(&b).into_owned(),
            )
        })
    }

    fn get(
        uri: &str,
        headers: &[(header::HeaderName, &str)],
    ) -> axum::http::Request<axum::body::Body> {
        let mut b = axum::http::Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(k, *v);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    fn keyed() -> Access {
        Access {
            api_keys: vec!["k1".into()],
            cors_origins: vec!["https://app.example".into()],
            ..access(&[])
        }
    }

    /// Issue 31, item 8: two Host headers are a 400 (RFC 9112, 3.2), where
    /// the first used to win.
    #[test]
    fn two_host_headers_are_a_400() {
        let (status, _, body) = run(
            keyed(),
            get(
                "/health",
                &[(header::HOST, "localhost"), (header::HOST, "evil.example")],
            ),
        );
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("2 Host headers"), "{body}");
        let (status, _, _) = run(keyed(), get("/health", &[(header::HOST, "localhost")]));
        assert_eq!(status, 200);
    }

    /// Issue 31, item 8: an absolute-form target's authority is checked as
    /// `Host` is (it used to be served whatever it named).
    #[test]
    fn an_absolute_form_target_names_an_allowed_host() {
        let auth = [
            (header::HOST, "localhost"),
            (header::AUTHORIZATION, "Bearer k1"),
        ];
        let (status, _, body) = run(keyed(), get("http://evil.example/v1/models", &auth));
        assert_eq!(status, 403, "{body}");
        assert!(
            body.contains("evil.example") && body.contains("host_not_allowed"),
            "{body}"
        );
        let (status, _, body) = run(keyed(), get("http://localhost:8080/v1/models", &auth));
        assert_eq!((status, body.as_str()), (200, "models"));
        let (status, _, _) = run(
            Access {
                allow_hosts: vec!["*".into()],
                ..keyed()
            },
            get("http://evil.example/v1/models", &auth),
        );
        assert_eq!(status, 200);
    }

    /// Issue 31, item 8: a 401 for an admitted origin carries the CORS
    /// header the layer inside would have added (a browser shows the 401,
    /// not a CORS failure); other origins get none.
    #[test]
    fn a_401_carries_cors_headers_for_an_admitted_origin() {
        let from = |o: &str| {
            get(
                "/v1/models",
                &[(header::HOST, "localhost"), (header::ORIGIN, o)],
            )
        };
        let (status, h, _) = run(keyed(), from("https://app.example"));
        assert_eq!(status, 401);
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://app.example"
        );
        assert_eq!(h[header::VARY], "origin");
        // Another origin is refused before the key is looked at.
        let (status, h, body) = run(keyed(), from("https://evil.example"));
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("origin_not_allowed"), "{body}");
        assert!(h.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none());
        let any = Access {
            cors_origins: vec!["*".into()],
            ..keyed()
        };
        let (_, h, _) = run(any, from("https://other.example"));
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        // The layer's own answer for a keyed request agrees.
        let (status, h, _) = run(
            keyed(),
            get(
                "/v1/models",
                &[
                    (header::HOST, "localhost"),
                    (header::ORIGIN, "https://app.example"),
                    (header::AUTHORIZATION, "Bearer k1"),
                ],
            ),
        );
        assert_eq!(status, 200);
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://app.example"
        );
    }

    /// Issue 31, item 8: an `/api/*` 404 is in Ollama's shape, a `/v1/*`
    /// one in OpenAI's.
    #[test]
    fn not_found_speaks_the_shape_of_its_api() {
        let open = Access {
            api_keys: vec![],
            ..keyed()
        };
        let (status, _, body) = run(
            open.clone(),
            get("/api/nope", &[(header::HOST, "localhost")]),
        );
        assert_eq!(status, 404);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["error"].as_str().is_some_and(|m| m.contains("/api/nope")),
            "{body}"
        );
        let (status, _, body) = run(open, get("/v1/nope", &[(header::HOST, "localhost")]));
        assert_eq!(status, 404);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"]["message"].is_string(), "{body}");
    }

    /// Issue 29: the origins a browser page may call from, Ollama's rule.
    #[test]
    fn origins_allowed_are_loopback_apps_own_and_listed() {
        let listed = vec!["https://app.example".to_string()];
        let ok = |o: &str| origin_allowed(&listed, o.as_bytes(), "myhost.lan:8080");
        for o in [
            "http://localhost",
            "http://localhost:3000",
            "https://127.0.0.1:8443",
            "http://[::1]:5173",
            "HTTP://LOCALHOST:1",
            "app://anything",
            "file://",
            "tauri://localhost",
            "https://app.example",
            // The server's own origin (its chat page, reached by name).
            "http://myhost.lan:8080",
        ] {
            assert!(ok(o), "{o}");
        }
        for o in [
            "null",
            "https://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:80",
            "http://evil.example/localhost",
            "https://app.example:444",
            "http://myhost.lan:9090",
            "ftp://localhost",
            "localhost",
            "",
        ] {
            assert!(!ok(o), "{o}");
        }
        assert!(origin_allowed(&["*".into()], b"https://any.example", ""));
    }

    /// Issue 29: a page on another origin is refused whatever it posts; no
    /// Origin (curl, an SDK) is served; `Sec-Fetch-Site: cross-site`
    /// without an Origin is refused; `/api/*` answers in Ollama's shape.
    #[test]
    fn cross_site_requests_are_refused_by_origin() {
        let open = Access {
            api_keys: vec![],
            ..keyed()
        };
        let h = |extra: &[(header::HeaderName, &'static str)]| {
            let mut v = vec![(header::HOST, "localhost:8080")];
            v.extend_from_slice(extra);
            v
        };
        for (origin, want) in [
            ("https://evil.example", 403),
            ("null", 403),
            ("https://app.example", 200),
            ("http://localhost:3000", 200),
            ("http://localhost:8080", 200),
        ] {
            let (status, _, body) = run(
                open.clone(),
                get("/v1/models", &h(&[(header::ORIGIN, origin)])),
            );
            assert_eq!(status, want, "{origin}: {body}");
        }
        let (status, _, _) = run(open.clone(), get("/v1/models", &h(&[])));
        assert_eq!(status, 200);
        let site = header::HeaderName::from_static("sec-fetch-site");
        let (status, _, _) = run(
            open.clone(),
            get("/v1/models", &h(&[(site.clone(), "cross-site")])),
        );
        assert_eq!(status, 403);
        let (status, _, _) = run(
            open.clone(),
            get("/v1/models", &h(&[(site, "same-origin")])),
        );
        assert_eq!(status, 200);
        let (status, _, body) = run(
            open,
            get("/api/nope", &h(&[(header::ORIGIN, "https://evil.example")])),
        );
        assert_eq!(status, 403);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["error"]
                .as_str()
                .is_some_and(|m| m.contains("--cors-origin")),
            "{body}"
        );
    }

    #[test]
    fn keys_compare_whole() {
        assert!(same_bytes(b"abc", b"abc"));
        assert!(!same_bytes(b"abc", b"abd"));
        assert!(!same_bytes(b"abc", b"abcd"));
        assert!(!same_bytes(b"", b"a"));
        let a = Access {
            api_keys: vec!["k1".into(), "k2".into()],
            ..access(&[])
        };
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            m
        };
        assert!(a.key_ok(&h("Bearer k2")).is_ok());
        assert!(a.key_ok(&h("bearer k1")).is_ok());
        assert!(a.key_ok(&h("Bearer k3")).is_err());
        assert!(a.key_ok(&h("Basic k1")).is_err());
        assert!(a.key_ok(&HeaderMap::new()).is_err());
        // Anthropic's clients send the key as x-api-key; either header may
        // carry it, and a wrong one in the other does not spoil it.
        let x = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(X_API_KEY, HeaderValue::from_str(v).unwrap());
            m
        };
        assert!(a.key_ok(&x("k1")).is_ok());
        assert!(a.key_ok(&x("k3")).is_err());
        assert!(a.key_ok(&x("Bearer k1")).is_err());
        let mut both = x("k2");
        both.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer nope"),
        );
        assert!(a.key_ok(&both).is_ok());
        let mut both = x("nope");
        both.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k1"));
        assert!(a.key_ok(&both).is_ok());
        both.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k9"));
        assert!(a.key_ok(&both).is_err());
        assert!(a.guarded("/v1/models") && a.guarded("/metrics") && !a.guarded("/health"));
    }
}
