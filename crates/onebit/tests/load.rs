//! `onebit serve` under load and faults, loopback only, bounded in time and
//! count: SmolLM2-135M-Instruct driven by many concurrent clients, greedy,
//! `max_tokens` 8, streaming and not; a quarter of the streaming clients hang
//! up mid-stream and some send half a request and hang up. Afterwards the
//! server is up (`/health` 200, nothing active or queued), every completed
//! answer equals that prompt's answer sent alone, and the server's RSS is
//! back near its baseline.
//!
//! Also mixed in (issue 15): idle sockets, slow-loris heads, a cross-site 403
//! (text/plain), a 405, and longer prompts prefilled in chunks beside the
//! short ones. And (issue 31) embeddings clients, whose vectors must equal
//! those of the same inputs sent alone, and slow-body clients: each sends a
//! request's body in pieces (within the minimum rate: answered, and the
//! answer checked like the others) while another connection trickles a body
//! below it (cut with a 408).
//!
//! Clients: `ONEBIT_LOAD_CLIENTS`, default 16 (CI); each repeats its kind
//! until `ONEBIT_LOAD_SECS` have passed, default 20 (CI, kept short for this
//! shared 2-core machine). The full run is 64 clients for 2 minutes:
//! `ONEBIT_LOAD_CLIENTS=64 ONEBIT_LOAD_SECS=120 cargo test -p onebit --test load`.
//!
//! "Near baseline": the baseline is the RSS after a warm-up that ran a full
//! batch (`--max-seqs` sequences at once) and the solo answers, so the
//! allocator's high-water mark for a batch is already reached; after the load
//! the RSS may exceed it by at most the prefix-cache budget (`--cache-mib`
//! 32, which the load fills with states legitimately) plus 48 MiB of
//! allocator slack. A leaked sequence state (KV cache for ~60 positions,
//! ~3 MiB on this model, plus its scratch) per request would exceed that
//! after a few dozen requests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{head, Server};

/// How long a client waits for an answer.
const TIMEOUT: Duration = Duration::from_secs(240);
const MAX_TOKENS: u32 = 8;
const CACHE_MIB: u64 = 32;
const SLACK_MIB: u64 = 48;
const PROMPTS: &[&str] = &[
    "What is the capital of France?",
    "Name a primary colour.",
    "Write one word about the sea.",
    "What is 2 + 2?",
    "Say hello in Spanish.",
    "Which planet is closest to the sun?",
    "Give me a synonym for happy.",
    "What do bees make?",
];

impl Server {
    /// The server the load test drives: 8 sequences at once, a deep queue.
    fn for_load() -> Server {
        Server::smollm(&[
            "--threads",
            "2",
            "--max-seqs",
            "8",
            "--max-queue",
            "256",
            "--cache-mib",
            &CACHE_MIB.to_string(),
        ])
    }

    fn smollm(args: &[&str]) -> Server {
        Server::start(onebit_testdata::SMOLLM2_135M, args)
    }

    fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, text) = request(self.port, "GET", "/metrics", b"").unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name}"))
    }
}

fn body(prompt: &str, stream: bool) -> Vec<u8> {
    json!({
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "stream": stream,
    })
    .to_string()
    .into_bytes()
}

fn connect(port: u16) -> std::io::Result<TcpStream> {
    common::connect(port, TIMEOUT)
}

/// One request on a fresh connection: status and de-chunked body.
fn request(port: u16, method: &str, path: &str, body: &[u8]) -> Result<(u16, String), String> {
    common::request(port, method, path, body, TIMEOUT)
}

/// The content of a whole chat answer.
fn content(status: u16, body: &str) -> Result<String, String> {
    if status != 200 {
        return Err(format!("status {status}: {body}"));
    }
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))?;
    v["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("no content: {body}"))
}

/// The content of a streamed answer, joined from its deltas.
fn streamed_content(status: u16, body: &str) -> Result<String, String> {
    if status != 200 {
        return Err(format!("status {status}: {body}"));
    }
    let mut out = String::new();
    let mut done = false;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("{e}: {data}"))?;
        if v.get("error").is_some() {
            return Err(format!("error event: {data}"));
        }
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            out.push_str(c);
        }
    }
    if !done {
        return Err(format!("stream without [DONE]: {body}"));
    }
    Ok(out)
}

/// What one client does.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Whole,
    Stream,
    /// Streams, reads the first bytes of the answer, hangs up.
    StreamHangUp,
    /// Sends half its body and hangs up.
    HalfRequest,
    /// Opens a socket, sends nothing, hangs up after a second.
    Idle,
    /// Dribbles a request head, one header a second, never finishing it.
    SlowLoris,
    /// Posts from a foreign Origin (403) and GETs a POST route (405).
    Refused,
    /// A ~300-token prompt, streamed: prefilled in chunks beside the others.
    LongPrompt,
    /// Two prompts' embeddings in one request.
    Embed,
    /// A whole request whose body comes in pieces, slowly but within the
    /// minimum rate, beside a connection trickling a body below it.
    SlowBody,
}

fn kind(i: usize) -> Kind {
    match i % 16 {
        0 | 4 | 12 => Kind::StreamHangUp,
        1 | 5 | 13 => Kind::Stream,
        7 => Kind::HalfRequest,
        8 => Kind::Idle,
        9 => Kind::SlowLoris,
        10 => Kind::Refused,
        11 => Kind::LongPrompt,
        14 => Kind::Embed,
        15 => Kind::SlowBody,
        _ => Kind::Whole,
    }
}

/// The inputs of client `i`'s embeddings request.
fn embed_body(i: usize) -> Vec<u8> {
    json!({"input": [PROMPTS[i % PROMPTS.len()], PROMPTS[(i + 1) % PROMPTS.len()]]})
        .to_string()
        .into_bytes()
}

/// The vectors of an embeddings answer, as sent (JSON numbers compare exactly).
fn vectors(status: u16, body: &str) -> Result<String, String> {
    if status != 200 {
        return Err(format!("status {status}: {body}"));
    }
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))?;
    let data = v["data"]
        .as_array()
        .ok_or_else(|| format!("no data: {body}"))?;
    if data.len() != 2 {
        return Err(format!("{} vectors for 2 inputs", data.len()));
    }
    Ok(Value::Array(data.iter().map(|d| d["embedding"].clone()).collect()).to_string())
}

fn long_prompt() -> String {
    format!(
        "Summarize this in one word: {}",
        "the sea is wide and blue; ".repeat(40)
    )
}

/// Runs one client; Some(answer) for a completed answer.
fn client(port: u16, i: usize) -> Result<Option<String>, String> {
    let prompt = PROMPTS[i % PROMPTS.len()];
    match kind(i) {
        Kind::Embed => {
            let (s, b) = request(port, "POST", "/v1/embeddings", &embed_body(i))?;
            vectors(s, &b).map(Some)
        }
        Kind::SlowBody => {
            // Below the rate: the head and one byte, then nothing.
            let b = body(prompt, false);
            let mut trickle = connect(port).map_err(|e| e.to_string())?;
            trickle
                .write_all(head("POST", "/v1/chat/completions", b.len()).as_bytes())
                .and_then(|_| trickle.write_all(&b[..1]))
                .map_err(|e| e.to_string())?;
            // Within it: four pieces 300 ms apart, inside the grace period.
            let mut s = connect(port).map_err(|e| e.to_string())?;
            s.write_all(head("POST", "/v1/chat/completions", b.len()).as_bytes())
                .map_err(|e| e.to_string())?;
            for piece in b.chunks(b.len().div_ceil(4)) {
                std::thread::sleep(Duration::from_millis(300));
                s.write_all(piece).map_err(|e| e.to_string())?;
            }
            let mut raw = Vec::new();
            let _ = s.read_to_end(&mut raw);
            let text = String::from_utf8_lossy(&raw).to_string();
            let (h, rest) = text
                .split_once("\r\n\r\n")
                .ok_or_else(|| format!("no response head: {text:?}"))?;
            let status = h
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let answer = content(status, rest)?;
            let mut cut = String::new();
            let _ = trickle.read_to_string(&mut cut);
            if !cut.starts_with("HTTP/1.1 408") {
                return Err(format!(
                    "a body below the minimum rate was not cut with 408: {cut:?}"
                ));
            }
            Ok(Some(answer))
        }
        Kind::Whole => {
            let (s, b) = request(port, "POST", "/v1/chat/completions", &body(prompt, false))?;
            content(s, &b).map(Some)
        }
        Kind::Stream => {
            let (s, b) = request(port, "POST", "/v1/chat/completions", &body(prompt, true))?;
            streamed_content(s, &b).map(Some)
        }
        Kind::StreamHangUp => {
            let b = body(prompt, true);
            let mut s = connect(port).map_err(|e| e.to_string())?;
            s.write_all(head("POST", "/v1/chat/completions", b.len()).as_bytes())
                .and_then(|_| s.write_all(&b))
                .map_err(|e| e.to_string())?;
            // Wait for the head and the first event, then drop the connection.
            let mut buf = [0u8; 512];
            let mut got = 0;
            while got < 200 {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(None)
        }
        Kind::HalfRequest => {
            let b = body(prompt, false);
            let mut s = connect(port).map_err(|e| e.to_string())?;
            s.write_all(head("POST", "/v1/chat/completions", b.len()).as_bytes())
                .and_then(|_| s.write_all(&b[..b.len() / 2]))
                .map_err(|e| e.to_string())?;
            Ok(None)
        }
        Kind::Idle => {
            let s = connect(port).map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_secs(1));
            drop(s);
            Ok(None)
        }
        Kind::SlowLoris => {
            let mut s = connect(port).map_err(|e| e.to_string())?;
            let _ = s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\n");
            for _ in 0..3 {
                std::thread::sleep(Duration::from_secs(1));
                if s.write_all(b"X-Slow: 1\r\n").is_err() {
                    break;
                }
            }
            Ok(None)
        }
        Kind::Refused => {
            let b = body(prompt, false);
            let mut s = connect(port).map_err(|e| e.to_string())?;
            // A cross-site page's post (issue 29: refused by its Origin).
            let h = head("POST", "/v1/chat/completions", b.len()).replace(
                "application/json",
                "text/plain\r\nOrigin: http://evil.example",
            );
            s.write_all(h.as_bytes())
                .and_then(|_| s.write_all(&b))
                .map_err(|e| e.to_string())?;
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            if !out.starts_with("HTTP/1.1 403") {
                return Err(format!("a cross-site post was not refused with 403: {out}"));
            }
            let (st, b) = request(port, "GET", "/v1/chat/completions", b"")?;
            if st != 405 || !b.contains("method_not_allowed") {
                return Err(format!("GET on a POST route: {st} {b}"));
            }
            Ok(None)
        }
        Kind::LongPrompt => {
            let (s, b) = request(
                port,
                "POST",
                "/v1/chat/completions",
                &body(&long_prompt(), true),
            )?;
            streamed_content(s, &b).map(|_| None)
        }
    }
}

fn wait_idle(server: &Server, within: Duration) {
    let t = Instant::now();
    loop {
        let active = server.metric("onebit_active_sequences");
        let queued = server.metric("onebit_queue_depth");
        if active == 0.0 && queued == 0.0 {
            return;
        }
        assert!(
            t.elapsed() < within,
            "server still busy after {within:?}: {active} active, {queued} queued"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn many_clients_with_hangups_leave_the_server_up_correct_and_lean() {
    let n_clients: usize = std::env::var("ONEBIT_LOAD_CLIENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let t0 = Instant::now();
    let server = Server::for_load();
    let port = server.port;

    // Each prompt alone: the reference answers, and each embeddings
    // client's vectors alone.
    let alone: Vec<String> = PROMPTS
        .iter()
        .map(|p| {
            let (s, b) = request(port, "POST", "/v1/chat/completions", &body(p, false)).unwrap();
            content(s, &b).unwrap()
        })
        .collect();
    let embed_alone: Vec<String> = (0..PROMPTS.len())
        .map(|i| {
            let (s, b) = request(port, "POST", "/v1/embeddings", &embed_body(i)).unwrap();
            vectors(s, &b).unwrap()
        })
        .collect();
    // Warm-up: one full batch at once, then the baseline.
    std::thread::scope(|s| {
        // Eight Whole clients (see `kind`).
        for i in [2, 3, 6, 18, 19, 22, 34, 35] {
            s.spawn(move || client(port, i).unwrap());
        }
    });
    wait_idle(&server, Duration::from_secs(60));
    let baseline = server.rss_kib();
    let t_load = Instant::now();

    let secs: u64 = std::env::var("ONEBIT_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let until = t_load + Duration::from_secs(secs);
    let results: Vec<(usize, Result<Option<String>, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n_clients)
            .map(|i| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let r = client(port, i);
                        let failed = r.is_err();
                        out.push((i, r));
                        if failed || Instant::now() >= until {
                            break out;
                        }
                        // Paced, so the quick kinds (half requests, 403s)
                        // do not churn through tens of thousands of sockets.
                        std::thread::sleep(Duration::from_millis(100));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let n_runs = results.len();
    let load_secs = t_load.elapsed().as_secs_f64();

    let mut completed = 0;
    for (i, r) in &results {
        match r {
            Ok(Some(answer)) => {
                completed += 1;
                let want = match kind(*i) {
                    Kind::Embed => &embed_alone[i % PROMPTS.len()],
                    _ => &alone[i % PROMPTS.len()],
                };
                assert_eq!(
                    answer,
                    want,
                    "client {i} ({:?}) answered differently from the prompt alone",
                    kind(*i)
                );
            }
            Ok(None) => {}
            Err(e) => panic!("client {i} ({:?}) failed: {e}", kind(*i)),
        }
    }

    wait_idle(&server, Duration::from_secs(120));
    let (status, health) = request(port, "GET", "/health", b"").unwrap();
    assert_eq!(status, 200, "{health}");
    // Still answering, and still the same answer.
    let (s, b) = request(
        port,
        "POST",
        "/v1/chat/completions",
        &body(PROMPTS[0], false),
    )
    .unwrap();
    assert_eq!(content(s, &b).unwrap(), alone[0]);

    let after = server.rss_kib();
    let allowed = baseline + (CACHE_MIB + SLACK_MIB) * 1024;
    eprintln!(
        "[load] {n_clients} clients, {n_runs} runs ({completed} completed answers, {} others) in {load_secs:.1} s; RSS baseline {} MiB, after {} MiB (allowed {} MiB); total {:.1} s",
        n_runs - completed,
        baseline / 1024,
        after / 1024,
        allowed / 1024,
        t0.elapsed().as_secs_f64()
    );
    assert!(
        after <= allowed,
        "RSS {} KiB after the load, baseline {} KiB (allowed {} KiB)",
        after,
        baseline,
        allowed
    );
    // Every run of an answering kind answered (a failure panicked above).
    let answering = results
        .iter()
        .filter(|(i, _)| {
            matches!(
                kind(*i),
                Kind::Whole | Kind::Stream | Kind::Embed | Kind::SlowBody
            )
        })
        .count();
    assert_eq!(completed, answering);
    assert!(completed >= n_clients / 2, "only {completed} answers");
}

/// The server's limits, each set low by its flag and refused with a sentence
/// naming it: context (`--ctx`), `max_tokens` (`--max-tokens`, also the
/// default), request body (`--max-body-mib`), rendered template
/// (`--max-template-kib`), `n` (`--max-n`).
#[test]
fn limits_are_configurable_and_refused_with_clear_errors() {
    let server = Server::smollm(&[
        "--threads",
        "1",
        "--ctx",
        "256",
        "--max-tokens",
        "4",
        "--max-body-mib",
        "1",
        "--max-template-kib",
        "2",
        "--max-n",
        "2",
    ]);
    let port = server.port;
    let chat = |v: Value| {
        let (s, b) = request(
            port,
            "POST",
            "/v1/chat/completions",
            v.to_string().as_bytes(),
        )
        .unwrap();
        (
            s,
            serde_json::from_str::<Value>(&b).unwrap_or(Value::String(b)),
        )
    };
    let msg = |c: &str| json!([{"role": "user", "content": c}]);

    // max_tokens above the cap: 400 naming it; absent: the cap is the default.
    let (s, v) = chat(json!({"messages": msg("Hi"), "max_tokens": 5, "temperature": 0}));
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["param"], "max_tokens", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 4"),
        "{v}"
    );
    let (s, v) = chat(json!({"messages": msg("Count from one to twenty."), "temperature": 0}));
    assert_eq!(s, 200, "{v}");
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() <= 4,
        "{v}"
    );

    // A prompt longer than the context.
    let long = "word ".repeat(300);
    let (s, b) = request(
        port,
        "POST",
        "/v1/completions",
        json!({"prompt": long, "max_tokens": 1})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("context_length_exceeded"), "{b}");

    // The rendered template over 2 KiB (the body itself is small).
    let (s, v) = chat(json!({"messages": msg(&"x".repeat(3000)), "max_tokens": 1}));
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("limit"),
        "{v}"
    );

    // A body over 1 MiB.
    let big = json!({"messages": msg(&"y".repeat(1 << 20)), "max_tokens": 1}).to_string();
    let (s, b) = request(port, "POST", "/v1/chat/completions", big.as_bytes()).unwrap();
    assert_eq!(s, 413, "{b}");

    // n above --max-n.
    let (s, v) = chat(json!({"messages": msg("Hi"), "max_tokens": 1, "n": 3}));
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["param"], "n", "{v}");

    let (s, _) = request(port, "GET", "/health", b"").unwrap();
    assert_eq!(s, 200);
}
