//! Images reach the vision tower end to end (issue 30): `onebit serve` on
//! the gemma3-vision fixture's text.gguf with `--mmproj` its mmproj.gguf,
//! driven by the official `openai` and `ollama` clients
//! (tests/serve/test_vision_clients.py): the first generated token is
//! llama.cpp's mtmd greedy token for the fixture's image and prompt (the
//! argmax of llamacpp.logits.bin's last row). Then `/metrics`: the same
//! image sent three times and another once were encoded twice (a repeat is
//! not encoded again), and encoding is timed. The prefill runs in chunks
//! smaller than the image, which must still run whole in one step.
//! `onebit run --image` and `onebit chat`'s `/image` give the same first
//! token. The same clients, and `run --image` with one image and two, on
//! the qwen3vl-vision fixture: Qwen3-VL's text side (IMROPE grid positions,
//! deepstack) gives mtmd's first token too.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{request, Server, BIN};

fn fixture() -> PathBuf {
    onebit_testdata::dir().join("llamacpp/gemma3-vision")
}

fn qfixture() -> PathBuf {
    onebit_testdata::dir().join("llamacpp/qwen3vl-vision")
}

/// A chat template that renders the fixture's prompt: "<bos>hi", then each
/// message's content (its image mark, then the text) without line breaks.
fn template(dir: &Path) -> PathBuf {
    let p = dir.join("hi.jinja");
    std::fs::write(
        &p,
        "{{ bos_token }}hi{% for message in messages %}{{ message['content'] | replace('\\n', '') }}{% endfor %}",
    )
    .unwrap();
    p
}

/// The same without BOS (the qwen3vl fixture's vocabulary adds none).
fn template_no_bos(dir: &Path) -> PathBuf {
    let p = dir.join("hi-no-bos.jinja");
    std::fs::write(
        &p,
        "hi{% for message in messages %}{{ message['content'] | replace('\\n', '') }}{% endfor %}",
    )
    .unwrap();
    p
}

/// The argmax of llama.cpp's logits (`file` in fixture `fx`) at the
/// prompt's last position.
fn first_token_of(fx: &Path, file: &str) -> u32 {
    let bytes = std::fs::read(fx.join(file)).unwrap();
    let n_vocab = 384; // meta.json text_hparams.n_vocab
    let row: Vec<f32> = bytes[bytes.len() - 4 * n_vocab..]
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (0..n_vocab)
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap() as u32
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

#[test]
fn the_clients_images_give_mtmds_first_token_and_a_repeat_is_not_encoded() {
    let dir = onebit_testdata::TempDir::new("serve-vision");
    let fx = fixture();
    let srv = Server::start(
        fx.join("text.gguf").to_str().unwrap(),
        &[
            "--mmproj",
            fx.join("mmproj.gguf").to_str().unwrap(),
            "--chat-template",
            template(dir.path()).to_str().unwrap(),
            "--threads",
            "2",
            // Chunks of 5 prompt tokens: the 3 before the image end one
            // early, the image's 16 rows run whole in the next step.
            "--prefill-chunk",
            "5",
        ],
    );
    let (st, caps) = request(
        srv.port,
        "POST",
        "/api/show",
        br#"{"model": "text"}"#,
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(st, 200, "{caps}");
    assert!(caps.contains("\"vision\""), "{caps}");
    common::python_script(
        "test_vision_clients.py",
        &[
            format!("http://127.0.0.1:{}", srv.port),
            fx.display().to_string(),
        ],
        None,
    );
    // A bad image for a model with a tower is still a 400 naming it.
    let cut = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1Pe";
    let body = serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": cut}},
        {"type": "text", "text": "what is this ok"},
    ]}], "max_tokens": 1});
    let (st, text) = request(
        srv.port,
        "POST",
        "/v1/chat/completions",
        body.to_string().as_bytes(),
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(st, 400, "{text}");
    assert!(text.contains("messages[0].content[0]"), "{text}");
    let (st, m) = request(srv.port, "GET", "/metrics", b"", Duration::from_secs(60)).unwrap();
    assert_eq!(st, 200);
    // image.rgb four times (OpenAI, Ollama, OpenAI, Ollama after other
    // text: its rows found by the pixels' hash), image2.rgb once.
    assert_eq!(metric(&m, "onebit_images_encoded_total"), 2.0, "{m}");
    assert_eq!(metric(&m, "onebit_images_reused_total"), 1.0, "{m}");
    assert_eq!(metric(&m, "onebit_image_encode_seconds_count"), 2.0, "{m}");
    assert!(metric(&m, "onebit_image_encode_seconds_sum") > 0.0, "{m}");
    // The access lines of the two requests whose images were encoded say
    // so, with the time; no other line does.
    let mut lines = Vec::new();
    while let Ok(l) = srv.log.recv_timeout(Duration::from_secs(5)) {
        if l.starts_with("[access]") {
            lines.push(l);
        }
        if lines.iter().any(|l| l.contains("GET /metrics")) {
            break;
        }
    }
    let encoded: Vec<_> = lines
        .iter()
        .filter(|l| l.contains(" images_encoded="))
        .collect();
    assert_eq!(encoded.len(), 2, "{lines:#?}");
    assert!(
        encoded
            .iter()
            .all(|l| l.contains("POST /v1/chat/completions 200")
                && l.contains(" images_encoded=1 image_encode_ms=")),
        "{encoded:#?}"
    );
}

/// A fixture image (`image.rgb`, `image2.rgb`) as a PNG (lossless, at the
/// encoder's size), by Pillow (scripts/python-deps.sh).
fn png(dir: &Path, name: &str) -> PathBuf {
    png_of(&fixture(), dir, name)
}

/// `png` of the image in `fx`, its size from its meta.json.
fn png_of(fx: &Path, dir: &Path, name: &str) -> PathBuf {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx.join("meta.json")).unwrap()).unwrap();
    let (w, h) = (&meta["image"]["width"], &meta["image"]["height"]);
    let tag = fx.file_name().unwrap().to_string_lossy();
    let png = dir.join(format!("{tag}-{name}.png"));
    let made = Command::new("python3")
        .args([
            "-c",
            &format!("import sys; from PIL import Image; Image.frombytes('RGB', ({w}, {h}), open(sys.argv[1], 'rb').read()).save(sys.argv[2])"),
        ])
        .arg(fx.join(name))
        .arg(&png)
        .status()
        .expect("python3 runs");
    assert!(
        made.success(),
        "Pillow writes the PNG (scripts/python-deps.sh)"
    );
    png
}

/// The text of llama.cpp's first token after gemma3-vision's `prompt2` (two
/// images: image.rgb, image2.rgb), by the model's own vocabulary. With
/// the images' rows left out (their placeholder ids looked up instead) the
/// token differs ("s" for "g"), as it does not for `prompt`, whose tokens
/// after the image decide the answer by a wide margin.
fn llamacpp_first_text() -> String {
    first_text_of(&fixture(), "llamacpp2.logits.bin")
}

/// The text of the argmax of `file`'s last row in fixture `fx`.
fn first_text_of(fx: &Path, file: &str) -> String {
    let g = onebit_formats::gguf::Gguf::open(fx.join("text.gguf")).unwrap();
    let tok = onebit_text::Tokenizer::from_gguf(&g).unwrap();
    let want = tok.decode(&[first_token_of(fx, file)], false).unwrap();
    assert!(!want.trim().is_empty());
    want.trim().to_string()
}

#[test]
fn chat_attaches_images_to_the_next_message() {
    let dir = onebit_testdata::TempDir::new("chat-vision");
    let fx = fixture();
    let mut child = Command::new(BIN)
        .args(["chat", "--max-tokens", "1", "--model"])
        .arg(fx.join("text.gguf"))
        .arg("--mmproj")
        .arg(fx.join("mmproj.gguf"))
        .arg("--chat-template")
        .arg(template(dir.path()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // meta.json's prompt2 after the template's "hi": mtmd's markers place
    // the two attached images.
    let input = format!(
        "/image {}\n/image {}\n<__media__>ok<__media__>what is this\n",
        png(dir.path(), "image.rgb").display(),
        png(dir.path(), "image2.rgb").display()
    );
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.trim(), llamacpp_first_text(), "{stderr}");
    assert!(stderr.contains("[stats] image encoded in"), "{stderr}");
}

#[test]
fn a_qwen3vl_tower_is_refused_for_a_text_model_without_imrope() {
    let out = Command::new(BIN)
        .args(["run", "--max-tokens", "1", "--prompt", "hi", "--model"])
        .arg(fixture().join("text.gguf"))
        .arg("--mmproj")
        .arg(qfixture().join("mmproj.gguf"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("qwen3vl_merger") && e.contains("IMROPE") && e.contains("gemma3"),
        "{e}"
    );
}

#[test]
fn qwen3vl_through_the_clients_gives_mtmds_first_token() {
    let dir = onebit_testdata::TempDir::new("serve-qwen3vl");
    let fx = qfixture();
    let srv = Server::start(
        fx.join("text.gguf").to_str().unwrap(),
        &[
            "--mmproj",
            fx.join("mmproj.gguf").to_str().unwrap(),
            "--chat-template",
            template_no_bos(dir.path()).to_str().unwrap(),
            "--threads",
            "2",
            // Chunks of 5 prompt tokens: the image's 24 rows (one grid of
            // positions) still run whole in one step.
            "--prefill-chunk",
            "5",
        ],
    );
    let (st, caps) = request(
        srv.port,
        "POST",
        "/api/show",
        br#"{"model": "text"}"#,
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(st, 200, "{caps}");
    assert!(caps.contains("\"vision\""), "{caps}");
    common::python_script(
        "test_vision_clients.py",
        &[
            format!("http://127.0.0.1:{}", srv.port),
            fx.display().to_string(),
        ],
        Some(&srv.log),
    );
}

#[test]
fn qwen3vl_run_with_one_image_and_two_gives_mtmds_first_token() {
    let dir = onebit_testdata::TempDir::new("run-qwen3vl");
    let fx = qfixture();
    for (prompt, images, logits) in [
        (
            "hi<__media__>what is this ok",
            &["image.rgb"][..],
            "llamacpp.logits.bin",
        ),
        (
            "hi<__media__>ok<__media__>what is this",
            &["image.rgb", "image2.rgb"][..],
            "llamacpp2.logits.bin",
        ),
    ] {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--max-tokens", "1", "--model"])
            .arg(fx.join("text.gguf"))
            .arg("--mmproj")
            .arg(fx.join("mmproj.gguf"));
        for name in images {
            cmd.arg("--image").arg(png_of(&fx, dir.path(), name));
        }
        let out = cmd.args(["--prompt", prompt]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            stdout.trim(),
            first_text_of(&fx, logits),
            "{prompt}: {stderr}"
        );
    }
}

#[test]
fn run_with_two_images_gives_mtmds_first_token() {
    let dir = onebit_testdata::TempDir::new("run-vision");
    let fx = fixture();
    let out = Command::new(BIN)
        .args(["run", "--max-tokens", "1", "--model"])
        .arg(fx.join("text.gguf"))
        .arg("--mmproj")
        .arg(fx.join("mmproj.gguf"))
        .arg("--image")
        .arg(png(dir.path(), "image.rgb"))
        .arg("--image")
        .arg(png(dir.path(), "image2.rgb"))
        // meta.json's prompt2: mtmd's markers where the images go.
        .args(["--prompt", "hi<__media__>ok<__media__>what is this"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.trim(), llamacpp_first_text(), "{stderr}");
    assert!(stderr.contains("[stats] images 2, encoded in"), "{stderr}");
}
