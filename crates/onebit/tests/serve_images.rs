//! Images in (issue 30), through the real binary: every protocol's image
//! part reaches the same checks, and each bad input is a 400 naming the
//! image and the problem, with the server's memory bounded: a remote URL
//! (nothing is fetched), wrong base64, a truncated PNG, a 30000 x 30000
//! header, too many images; a good image for a model without a vision
//! tower, and any image for an embedding model, are refused naming the
//! model. `onebit run --image` and `--mmproj` refuse the same way.

mod common;

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use common::{request, Server, BIN};

fn b64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= c.len() {
                out.push(T[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn photo() -> Vec<u8> {
    std::fs::read(onebit_testdata::dir().join("images/chelsea.png")).unwrap()
}

fn data_url(bytes: &[u8]) -> String {
    format!("data:image/png;base64,{}", b64(bytes))
}

fn chat_with(url: &str) -> Value {
    json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]}], "max_tokens": 4})
}

/// Posts `body`; the status and the error message (OpenAI's, Ollama's or
/// Anthropic's shape).
fn post(port: u16, path: &str, body: &Value) -> (u16, String) {
    let (status, text) = request(
        port,
        "POST",
        path,
        body.to_string().as_bytes(),
        Duration::from_secs(120),
    )
    .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let msg = v["error"]["message"]
        .as_str()
        .or(v["error"].as_str())
        .unwrap_or(&text)
        .to_string();
    (status, msg)
}

fn rss_kib(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[test]
fn images_are_checked_and_refused_by_name_on_every_protocol() {
    let s = Server::start(onebit_testdata::SMOLLM2_135M, &["--max-body-mib", "8"]);
    let port = s.port;
    let png = photo();
    let no_tower = "has no vision tower (no --mmproj given)";

    // OpenAI: a good image, for a model without a tower.
    let (st, m) = post(port, "/v1/chat/completions", &chat_with(&data_url(&png)));
    assert_eq!(st, 400, "{m}");
    assert!(m.contains(no_tower) && m.contains("SmolLM2"), "{m}");

    let hwm_before = rss_kib(s.child.id(), "VmHWM:");
    let cases: Vec<(Value, &str)> = vec![
        (
            chat_with("https://example.com/cat.png"),
            "the image at messages[0].content[1] is a https: URL; this server fetches nothing",
        ),
        (
            chat_with("data:image/png;base64,iVBORw0KGgo*AAA"),
            "the image at messages[0].content[1] is not valid base64",
        ),
        (
            chat_with(&data_url(&png[..png.len() / 2])),
            "the image at messages[0].content[1] is not a readable PNG (120x80)",
        ),
        (
            chat_with(&data_url(&onebit_testdata::png_with_header(30000, 30000))),
            "the image at messages[0].content[1] is 30000x30000 (900000000 pixels)",
        ),
        (
            json!({"messages": [{"role": "user", "content": (0..9)
                .map(|_| json!({"type": "image_url", "image_url": {"url": data_url(&png)}}))
                .collect::<Vec<_>>()}]}),
            "at most 8 are taken",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}),
            "is of type \"input_audio\"; this server takes text and images only",
        ),
    ];
    for (body, want) in &cases {
        let (st, m) = post(port, "/v1/chat/completions", body);
        assert_eq!(st, 400, "{want}: {m}");
        assert!(m.contains(want), "want {want:?}, got {m:?}");
    }
    // The 30000 x 30000 header (2.7 GB of pixels) was refused from its
    // header: the server's peak memory barely moved.
    let grown = rss_kib(s.child.id(), "VmHWM:").saturating_sub(hwm_before);
    println!("peak RSS grew {grown} KiB over the bad images");
    assert!(grown < 64 * 1024, "peak RSS grew {grown} KiB");

    // Ollama: `images` on chat and generate.
    let (st, m) = post(
        port,
        "/api/chat",
        &json!({"messages": [{"role": "user", "content": "hi", "images": [b64(&png)]}], "stream": false}),
    );
    assert_eq!(st, 400, "{m}");
    assert!(m.contains(no_tower), "{m}");
    let (st, m) = post(
        port,
        "/api/chat",
        &json!({"messages": [{"role": "user", "content": "hi", "images": ["not base64!"]}], "stream": false}),
    );
    assert_eq!(st, 400, "{m}");
    assert!(
        m.contains("the image at messages[0].images[0] is not valid base64"),
        "{m}"
    );
    let (st, m) = post(
        port,
        "/api/generate",
        &json!({"prompt": "hi", "images": [b64(&onebit_testdata::png_with_header(30000, 30000))], "stream": false}),
    );
    assert_eq!(st, 400, "{m}");
    assert!(m.contains("the image at images[0] is 30000x30000"), "{m}");
    let (st, m) = post(
        port,
        "/api/generate",
        &json!({"prompt": "hi", "images": [b64(&png)], "stream": false}),
    );
    assert_eq!(st, 400, "{m}");
    assert!(m.contains(no_tower), "{m}");

    // Responses `input_image`, Anthropic image blocks.
    let (st, m) = post(
        port,
        "/v1/responses",
        &json!({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "hi"},
            {"type": "input_image", "image_url": data_url(&png)}]}]}),
    );
    assert_eq!(st, 400, "{m}");
    assert!(m.contains(no_tower), "{m}");
    let (st, m) = post(
        port,
        "/v1/messages",
        &json!({"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(&png[..40])}},
            {"type": "text", "text": "hi"}]}]}),
    );
    assert_eq!(st, 400, "{m}");
    assert!(
        m.contains("the image at messages[0].content[0] is not a readable PNG"),
        "{m}"
    );

    // `/api/show`: no `vision` without a tower.
    let (st, text) = request(port, "POST", "/api/show", br#"{}"#, Duration::from_secs(30)).unwrap();
    assert_eq!(st, 200, "{text}");
    let caps: Value = serde_json::from_str::<Value>(&text).unwrap()["capabilities"].clone();
    assert!(
        caps.as_array().unwrap().iter().all(|c| c != "vision"),
        "{caps}"
    );

    // And the server still answers text.
    let (st, text) = request(
        port,
        "POST",
        "/v1/chat/completions",
        br#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}"#,
        Duration::from_secs(120),
    )
    .unwrap();
    assert_eq!(st, 200, "{text}");
}

#[test]
fn an_image_for_an_embedding_model_is_refused_naming_it() {
    // The tiny EmbeddingGemma fixture with a vocabulary added, served.
    let dir = onebit_testdata::TempDir::new("imagein-emb");
    let model = common::embedding_gemma_with_vocab(&dir);
    let srv = Server::start(model.to_str().unwrap(), &[]);
    let port = srv.port;
    let (st, m) = post(
        port,
        "/v1/chat/completions",
        &chat_with(&data_url(&photo())),
    );
    drop(srv);
    assert_eq!(st, 400, "{m}");
    assert!(
        m.contains("embeddinggemma-tiny") && m.contains("is an embedding model"),
        "{m}"
    );
}

#[test]
fn run_takes_an_image_only_with_a_tower() {
    let model = onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M);
    let dir = onebit_testdata::TempDir::new("imagein-run");
    let cut = dir.path().join("cut.png");
    let png = photo();
    std::fs::write(&cut, &png[..png.len() / 2]).unwrap();
    let run = |extra: &[&std::ffi::OsStr]| {
        let out = Command::new(BIN)
            .args(["run", "--max-tokens", "1", "--prompt", "hi", "--model"])
            .arg(&model)
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let photo_path = onebit_testdata::dir().join("images/chelsea.png");
    let e = run(&["--image".as_ref(), photo_path.as_os_str()]);
    assert!(e.contains("has no vision tower (no --mmproj given)"), "{e}");
    let e = run(&["--image".as_ref(), cut.as_os_str()]);
    assert!(
        e.contains(&format!(
            "the image at --image {} is not a readable PNG",
            cut.display()
        )),
        "{e}"
    );
    // A projector file that is not one; and one whose encoder is not built.
    let e = run(&["--mmproj".as_ref(), model.as_os_str()]);
    assert!(e.contains("no clip.projector_type key"), "{e}");
}
