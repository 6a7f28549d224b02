//! The chat page at `/`: one self-contained HTML file (no CDN, no external
//! request), compiled into the binary. It streams answers from
//! `/v1/chat/completions`, so it obeys the same key and Host rules as any
//! client: the page itself needs no key, its API calls send the one typed in.
//! Invariant: model text never becomes HTML. The page's own markdown renderer
//! builds elements and text nodes (no `innerHTML` write, no HTML parsing), and
//! the CSP below forbids loading anything from elsewhere. Conversations live
//! in the browser's localStorage, never on the server.

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

    /// The page's sinks that parse HTML or run strings as code: none may
    /// appear, except the one read of `innerHTML` in the test hook
    /// (`window.onebitRender`), which serializes what the renderer built.
    #[test]
    fn the_page_never_parses_text_as_html_or_code() {
        for sink in [
            "insertAdjacentHTML",
            "outerHTML",
            "document.write",
            "DOMParser",
            "createContextualFragment",
            "eval(",
            "new Function",
            "setTimeout(\"",
            ".srcdoc",
        ] {
            assert!(!HTML.contains(sink), "the page uses {sink}");
        }
        let reads: Vec<&str> = HTML.lines().filter(|l| l.contains("innerHTML")).collect();
        assert_eq!(reads.len(), 1, "innerHTML outside the test hook: {reads:?}");
        assert!(
            reads[0].contains("window.onebitRender") && reads[0].contains("return d.innerHTML"),
            "{}",
            reads[0]
        );
    }
}
