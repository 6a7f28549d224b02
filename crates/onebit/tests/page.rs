//! The chat page at `/` in headless Chromium (tests/serve/test_page.py):
//! SmolLM2 is asked the capital of France through the page, with an API key
//! set on the server, and the streamed answer must say Paris. The screenshot
//! lands in target/page-chat.png.

use std::process::Command;

mod common;
use common::Server;

#[test]
fn chat_page_streams_an_answer_in_headless_chromium() {
    let key = "page-test-key";
    let srv = Server::start(
        onebit_testdata::SMOLLM2_135M,
        &["--threads", "1", "--api-key", key],
    );
    let root = onebit_testdata::dir().join("..");
    let shot = root.join("target/page-chat.png");
    let _ = std::fs::remove_file(&shot);
    let out = Command::new("python3")
        .arg(root.join("tests/serve/test_page.py"))
        .arg(format!("http://127.0.0.1:{}", srv.port))
        .arg(&shot)
        .arg(key)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("page ok"),
        "the page test failed (Chromium comes from scripts/browser-deps.sh, selenium from scripts/python-deps.sh):\n{stdout}\n{stderr}"
    );
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    eprintln!("{stdout}");
}
