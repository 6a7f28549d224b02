//! What the server tests (serve.rs, load.rs, ...) share: a `onebit serve`
//! child on a free loopback port, killed when dropped, a minimal HTTP/1.1
//! client, and the tiny EmbeddingGemma model with a vocabulary.

// Each test file that includes this module uses only part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_onebit");

pub struct Server {
    pub child: Child,
    pub port: u16,
    /// stderr lines after the startup line.
    pub log: mpsc::Receiver<String>,
}

impl Server {
    /// `onebit serve --model <model> --port 0 <args>`, once it says where it
    /// listens (60 s at most; otherwise a panic with the stderr seen).
    pub fn start(model: &str, args: &[&str]) -> Server {
        let path = onebit_testdata::real_model(model);
        let mut child = Command::new(BIN)
            .args(["serve", "--model"])
            .arg(&path)
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start onebit serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        let port = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find("listening on http://") {
                        let addr = &line[at + "listening on http://".len()..];
                        let port = addr.split([':', ' ']).nth(1).unwrap();
                        break port.parse().unwrap();
                    }
                    seen.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("server did not start:\n{}", seen.join("\n"));
                }
            }
        };
        Server {
            child,
            port,
            log: rx,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A connection to the server with a read timeout.
pub fn connect(port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    Ok(s)
}

/// The request head for a JSON body of `len` bytes.
pub fn head(method: &str, path: &str, len: usize) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    )
}

/// One request on a fresh connection: status and de-chunked body. A server
/// may answer (413) before reading all of a large body, so a failed body
/// write or read is an error only when no response head came back.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(u16, String), String> {
    let mut s = connect(port, timeout).map_err(|e| e.to_string())?;
    s.write_all(head(method, path, body.len()).as_bytes())
        .map_err(|e| e.to_string())?;
    let sent = s.write_all(body);
    let mut raw = Vec::new();
    let read = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let Some((h, rest)) = text.split_once("\r\n\r\n") else {
        let why = sent
            .err()
            .or(read.err())
            .map_or(String::new(), |e| format!(" ({e})"));
        return Err(format!("no response head{why}: {text:?}"));
    };
    let status = h
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("bad status line")?;
    let chunked = h
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Ok((
        status,
        if chunked {
            dechunk(rest)
        } else {
            rest.to_string()
        },
    ))
}

/// The payload of a chunked body, up to its last whole chunk.
pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The tiny EmbeddingGemma f32 fixture (serve_embedding_gemma.rs,
/// serve_images.rs) with a SentencePiece vocabulary of its 384 ids written
/// in (the fixture has ids only): <unk>, <eos>, <bos> (2, as the fixture
/// says), the 256 byte tokens, then 125 word pieces; so text encodes.
pub fn embedding_gemma_with_vocab(dir: &onebit_testdata::TempDir) -> std::path::PathBuf {
    use onebit_formats::gguf::Value as GValue;
    let fx = onebit_testdata::Fixture::new("gemma-embedding");
    let g = onebit_formats::gguf::Gguf::open(fx.dir.join("f32.gguf")).unwrap();
    let mut w = onebit_formats::gguf::writer::GgufWriter::from_gguf(&g);
    let mut tokens = vec!["<unk>".to_string(), "<eos>".into(), "<bos>".into()];
    let mut types = vec![2i32, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    while tokens.len() < 384 {
        tokens.push(format!("\u{2581}w{}", tokens.len()));
        types.push(1);
    }
    let scores = (0..tokens.len())
        .map(|i| GValue::F32(-(i as f32)))
        .collect();
    w.set_kv("tokenizer.ggml.model", GValue::Str("llama".into()))
        .set_kv(
            "tokenizer.ggml.tokens",
            GValue::Array(tokens.into_iter().map(GValue::Str).collect()),
        )
        .set_kv("tokenizer.ggml.scores", GValue::Array(scores))
        .set_kv(
            "tokenizer.ggml.token_type",
            GValue::Array(types.into_iter().map(GValue::I32).collect()),
        )
        .set_kv("tokenizer.ggml.unknown_token_id", GValue::U32(0))
        .set_kv("tokenizer.ggml.eos_token_id", GValue::U32(1));
    dir.file("embeddinggemma-tiny.gguf", &w.to_bytes())
}

/// Runs `tests/serve/<name>` (a script of `runner.run` tests) with `args`
/// (the server's URL first); it must exit 0 and report no failure. On
/// failure the message holds its output and, when given, the server's log.
pub fn python_script(name: &str, args: &[String], log: Option<&mpsc::Receiver<String>>) {
    let script = onebit_testdata::dir().join("../tests/serve").join(name);
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let server = log.map_or_else(String::new, |l| {
        format!(
            "\nserver log:\n{}",
            l.try_iter().collect::<Vec<_>>().join("\n")
        )
    });
    assert!(
        out.status.success() && stdout.contains(" passed, 0 failed"),
        "{} failed (install its packages with scripts/python-deps.sh):\n{stdout}\n{}{server}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
}
