//! The chat page at `/` in headless Chromium (tests/serve/test_page.py),
//! against a server with an API key and two models, SmolLM2 (first, so the
//! default) and Qwen2.5-Coder-0.5B-Instruct: the markdown renderer against
//! markdown-it-py, the model picker, streaming, Stop, a fenced code block from
//! Qwen's greedy answer rendered as `<pre><code>` with a copy button,
//! conversations that survive a reload, regenerate, edit-and-resend, delete
//! folded reasoning, and images attached and pasted (refused by SmolLM2,
//! which has no vision tower). Screenshots land in
//! target/page-{chat,code,reload,images}.png.

use std::process::Command;

mod common;
use common::Server;

#[test]
fn chat_page_in_headless_chromium() {
    let key = "page-test-key";
    let qwen = onebit_testdata::real_model(onebit_testdata::QWEN25_CODER_05B);
    let srv = Server::start(
        onebit_testdata::SMOLLM2_135M,
        &[
            "--model",
            qwen.to_str().unwrap(),
            "--max-loaded",
            "2",
            "--threads",
            "1",
            "--api-key",
            key,
        ],
    );
    let root = onebit_testdata::dir().join("..").canonicalize().unwrap();
    let shots = root.join("target/page-");
    let names = ["chat.png", "code.png", "reload.png", "images.png"];
    for n in names {
        let _ = std::fs::remove_file(format!("{}{n}", shots.display()));
    }
    let out = Command::new("python3")
        .arg(root.join("tests/serve/test_page.py"))
        .arg(format!("http://127.0.0.1:{}", srv.port))
        .arg(&shots)
        .arg(key)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("page ok"),
        "the page test failed (Chromium comes from scripts/browser-deps.sh, selenium and markdown-it-py from scripts/python-deps.sh):\n{stdout}\n{stderr}"
    );
    for n in names {
        let shot = format!("{}{n}", shots.display());
        assert!(
            std::path::Path::new(&shot).exists(),
            "no screenshot at {shot}"
        );
    }
    eprintln!("{stdout}");
}
