//! The chat page at `/`: one self-contained HTML file (no CDN, no external
//! request), compiled into the binary. It streams answers from
//! `/v1/chat/completions`, so it obeys the same key and Host rules as any
//! client: the page itself needs no key, its API calls send the one typed in.

use axum::http::{header, HeaderValue};
use axum::response::Response;

/// The page's source, `assets/chat.html`.
pub const HTML: &str = include_str!("../assets/chat.html");

/// `GET /`.
pub async fn page() -> Response {
    let mut r = Response::new(axum::body::Body::from(HTML));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Everything is inline: nothing may load from elsewhere.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

#[cfg(test)]
mod tests {
    use super::HTML;

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for needle in ["http://", "https://", "//cdn", "src=\"http"] {
            assert!(!HTML.contains(needle), "the page refers to {needle}");
        }
        assert!(HTML.contains("/v1/chat/completions"));
    }
}
