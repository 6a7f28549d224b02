//! `onebit serve` end to end: the real binary on SmolLM2-135M-Instruct, on a
//! free loopback port, driven with plain HTTP (a tiny client over TcpStream)
//! and with the official `openai` Python package (tests/serve/*.py).
//!
//! Every server is killed when its test ends, pass or fail.

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::Server;

const CAPITAL: &str = "What is the capital of France? Answer with one word.";

impl Server {
    fn smollm(extra: &[&str]) -> Server {
        let args = [&["--threads", "1"], extra].concat();
        Server::start(onebit_testdata::SMOLLM2_135M, &args)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (s, b) = http(self.port, "POST", path, body.to_string().as_bytes());
        let v = serde_json::from_str(&b).unwrap_or_else(|e| panic!("{path}: {e}: {b}"));
        (s, v)
    }

    fn get(&self, path: &str) -> (u16, String) {
        http(self.port, "GET", path, b"")
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
    }

    /// Content of a chat answer, with its whole body.
    fn chat(&self, body: &Value) -> (String, Value) {
        let (status, v) = self.post("/v1/chat/completions", body);
        assert_eq!(status, 200, "{v}");
        let content = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        (content, v)
    }
}

fn greedy(prompt: &str, max_tokens: u32) -> Value {
    json!({"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": max_tokens})
}

/// One HTTP/1.1 request on a fresh connection; the body, de-chunked.
fn http(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    common::request(port, method, path, body, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// The `data:` payloads of an SSE body, `[DONE]` excluded (and required last).
fn sse_events(body: &str) -> Vec<Value> {
    let datas: Vec<&str> = body
        .split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .collect();
    assert_eq!(datas.last(), Some(&"[DONE]"), "{body}");
    datas[..datas.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn known_answer_determinism_streaming_and_logprobs() {
    let srv = Server::smollm(&[]);
    assert_eq!(srv.get("/health").0, 200);

    // Known answer, and three identical requests give identical text.
    let (first, v) = srv.chat(&greedy(CAPITAL, 24));
    assert!(first.contains("Paris"), "{v}");
    assert!(!first.contains("<|im_end|>") && !first.contains("<|im_start|>"));
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["object"], "chat.completion");
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );
    for _ in 0..2 {
        assert_eq!(srv.chat(&greedy(CAPITAL, 24)).0, first);
    }

    // A short max_tokens ends with "length".
    let (_, v) = srv.chat(&greedy(CAPITAL, 2));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 2);

    // Streamed chunks concatenate to the whole answer; usage comes last.
    let mut body = greedy(CAPITAL, 24);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, text) = http(
        srv.port,
        "POST",
        "/v1/chat/completions",
        body.to_string().as_bytes(),
    );
    assert_eq!(status, 200);
    let events = sse_events(&text);
    let id = events[0]["id"].clone();
    assert!(events.iter().all(|e| e["id"] == id));
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = events
        .iter()
        .filter_map(|e| e["choices"].get(0)?["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, first);
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert!(
        last["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "{last}"
    );
    let finish: Vec<&Value> = events
        .iter()
        .filter_map(|e| e["choices"].get(0).map(|c| &c["finish_reason"]))
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, [&json!("stop")]);

    // Logprobs: under greedy the chosen token tops its alternatives.
    let mut body = greedy(CAPITAL, 8);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let (_, v) = srv.chat(&body);
    let entries = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!entries.is_empty());
    for e in entries {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let max = top
            .iter()
            .map(|t| t["logprob"].as_f64().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(e["logprob"].as_f64().unwrap(), max, "{e}");
        assert_eq!(e["token"], top[0]["token"]);
        assert!(max <= 0.0);
    }
    let joined: String = entries
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert!(first.starts_with(&joined), "{joined:?} vs {first:?}");

    // Stop strings are cut from the content, and end with "stop".
    let mut body = greedy(CAPITAL, 24);
    body["stop"] = json!(["Paris", "zzz"]);
    let (content, v) = srv.chat(&body);
    assert!(!content.contains("Paris"), "{v}");
    assert!(first.starts_with(&content));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // The legacy completions endpoint, and the model list.
    let (status, v) = srv.post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(
        v["choices"][0]["text"].as_str().unwrap().contains("Paris"),
        "{v}"
    );
    let (_, models) = srv.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");

    // Metrics in Prometheus text.
    let (status, m) = srv.get("/metrics");
    assert_eq!(status, 200);
    for name in [
        "onebit_requests_total{endpoint=\"chat_completions\"}",
        "onebit_prompt_tokens_total",
        "onebit_generated_tokens_total",
        "onebit_queue_depth",
        "onebit_time_to_first_token_seconds_bucket",
        "onebit_decode_tokens_per_second_count",
    ] {
        assert!(m.contains(name), "{name} missing from\n{m}");
    }
    assert!(srv.metric("onebit_generated_tokens_total") > 0.0);
}

#[test]
fn concurrent_greedy_requests_match_each_alone() {
    let srv = Server::smollm(&["--max-seqs", "8"]);
    let prompts = [
        "What is the capital of France? Answer with one word.",
        "Name a primary color.",
        "What is 2+2?",
        "Say hello in Spanish.",
        "What is the largest planet?",
        "Write one word that rhymes with cat.",
        "What color is the sky on a clear day?",
        "Give me a synonym for happy.",
    ];
    let alone: Vec<String> = prompts.iter().map(|p| srv.chat(&greedy(p, 12)).0).collect();
    let port = srv.port;
    let together: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let (status, b) = http(
                        port,
                        "POST",
                        "/v1/chat/completions",
                        greedy(p, 12).to_string().as_bytes(),
                    );
                    assert_eq!(status, 200, "{b}");
                    let v: Value = serde_json::from_str(&b).unwrap();
                    v["choices"][0]["message"]["content"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    // n > 1 greedy: every choice is the single greedy answer.
    let mut body = greedy(prompts[2], 12);
    body["n"] = json!(3);
    let (_, v) = srv.chat(&body);
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], alone[2].as_str());
    }
}

#[test]
fn prefix_cache_on_and_off_give_the_same_text() {
    let on = Server::smollm(&[]);
    let off = Server::smollm(&["--no-prefix-cache"]);
    let sys = "You are a concise assistant who answers geography questions in one short sentence.";
    let conv = |q: &str| {
        json!({"messages": [{"role": "system", "content": sys}, {"role": "user", "content": q}],
               "temperature": 0, "max_tokens": 12})
    };
    let questions = [
        "What is the capital of France?",
        "What is the capital of Italy?",
        "What is the capital of France?",
    ];
    for (i, q) in questions.iter().enumerate() {
        let (a, va) = on.chat(&conv(q));
        let (b, vb) = off.chat(&conv(q));
        assert_eq!(a, b, "question {i}");
        let cached = |v: &Value| {
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(cached(&vb), 0);
        if i == 0 {
            assert_eq!(cached(&va), 0);
        } else {
            // Everything up to the question is shared; a repeat shares all
            // but the last prompt token.
            assert!(cached(&va) > 20, "{va}");
            assert!(cached(&va) < va["usage"]["prompt_tokens"].as_u64().unwrap());
        }
    }
    assert!(on.metric("onebit_prompt_tokens_cached_total") > 0.0);
    assert_eq!(off.metric("onebit_prompt_tokens_cached_total"), 0.0);
}

#[test]
fn bad_input_gets_4xx_json_errors() {
    let srv = Server::smollm(&["--ctx", "64", "--max-n", "4"]);
    let long = "word ".repeat(200);
    let ok_msgs = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("malformed JSON", b"{\"messages\": [".to_vec(), 400),
        ("not an object", b"[1, 2]".to_vec(), 400),
        (
            "messages not a list",
            json!({"messages": "hi"}).to_string().into_bytes(),
            400,
        ),
        (
            "empty messages",
            json!({"messages": []}).to_string().into_bytes(),
            400,
        ),
        (
            "unknown role",
            json!({"messages": [{"role": "wizard", "content": "x"}]})
                .to_string()
                .into_bytes(),
            400,
        ),
        (
            "content of a wrong type",
            json!({"messages": [{"role": "user", "content": 5}]})
                .to_string()
                .into_bytes(),
            400,
        ),
        (
            "max_tokens 0",
            json!({"messages": ok_msgs, "max_tokens": 0})
                .to_string()
                .into_bytes(),
            400,
        ),
        (
            "max_tokens a string",
            json!({"messages": ok_msgs, "max_tokens": "8"})
                .to_string()
                .into_bytes(),
            400,
        ),
        (
            "temperature out of range",
            json!({"messages": ok_msgs, "temperature": 9})
                .to_string()
                .into_bytes(),
            400,
        ),
        (
            "n too large",
            json!({"messages": ok_msgs, "n": 5})
                .to_string()
                .into_bytes(),
            400,
        ),
        (
            "stop of a wrong type",
            json!({"messages": ok_msgs, "stop": 3})
                .to_string()
                .into_bytes(),
            400,
        ),
        (
            "prompt over the context",
            json!({"messages": [{"role": "user", "content": long}]})
                .to_string()
                .into_bytes(),
            400,
        ),
        (
            "body over the size limit",
            {
                let mut b = b"{\"messages\": [{\"role\": \"user\", \"content\": \"".to_vec();
                b.extend(std::iter::repeat_n(b'a', 5 << 20));
                b.extend(b"\"}]}");
                b
            },
            413,
        ),
    ];
    for (what, body, want) in cases {
        let (status, text) = http(srv.port, "POST", "/v1/chat/completions", &body);
        assert_eq!(status, want, "{what}: {text}");
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
        assert!(v["error"]["type"].is_string(), "{what}: {v}");
    }
    let (status, v) = srv.post("/v1/completions", &json!({"prompt": long}));
    assert_eq!(status, 400);
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (status, _) = srv.post("/v1/completions", &json!({"prompt": [1, 2, 999999]}));
    assert_eq!(status, 400);
    assert_eq!(http(srv.port, "GET", "/v1/nothing", b"").0, 404);
    // Still serving.
    let (status, _) = srv.post(
        "/v1/chat/completions",
        &json!({"messages": ok_msgs, "max_tokens": 2}),
    );
    assert_eq!(status, 200);
    assert_eq!(srv.get("/health").0, 200);
}

#[test]
fn full_queue_answers_503_and_a_gone_client_frees_its_sequence() {
    let srv = Server::smollm(&["--max-seqs", "1", "--max-queue", "1"]);
    let port = srv.port;
    let long = json!({"messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
                      "temperature": 0, "max_tokens": 48});
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let body = long.to_string();
                s.spawn(move || http(port, "POST", "/v1/chat/completions", body.as_bytes()).0)
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.contains(&200), "{statuses:?}");
    assert!(statuses.contains(&503), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| [200, 503].contains(s)),
        "{statuses:?}"
    );

    // A client that goes away mid-generation frees its sequence at once.
    let before = srv.metric("onebit_sequences_cancelled_total");
    let body = json!({"messages": [{"role": "user", "content": "Count from one to one thousand."}],
                      "temperature": 0, "max_tokens": 2000, "stream": true})
    .to_string();
    let mut s = common::connect(port, Duration::from_secs(120)).unwrap();
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut buf = [0u8; 256];
    let _ = s.read(&mut buf); // the stream has started
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(20);
    while srv.metric("onebit_active_sequences") > 0.0
        || srv.metric("onebit_sequences_cancelled_total") <= before
    {
        assert!(
            Instant::now() < deadline,
            "the abandoned sequence was not freed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(srv.metric("onebit_generated_tokens_total") < 2000.0 + 4.0 * 48.0);
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let mut srv = Server::smollm(&[]);
    assert_eq!(srv.chat(&greedy("Hi", 2)).1["object"], "chat.completion");
    let st = Command::new("kill")
        .args(["-TERM", &srv.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = srv.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "server still running 20 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let log: Vec<String> = srv.log.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("[serve] stopped")), "{log:?}");
}

/// One request on a fresh connection: status, the head's header lines
/// (names lowercased) and the de-chunked body.
fn http_head(
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, Vec<(String, String)>, String) {
    let mut s = common::connect(port, Duration::from_secs(120)).unwrap();
    s.write_all(common::head(method, path, body.len()).as_bytes())
        .unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (h, rest) = text.split_once("\r\n\r\n").expect("a response head");
    let mut lines = h.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        common::dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, headers, body)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn gemma3_chats_through_its_family_template_when_its_file_has_none() {
    // Gemma 3 270M's GGUF carries no tokenizer.chat_template: the gemma3
    // family's known template serves chat.
    let body = greedy("Name a colour.", 8).to_string();
    let srv = Server::start(onebit_testdata::GEMMA3_270M, &["--threads", "1"]);
    let (status, family_head, family) =
        http_head(srv.port, "POST", "/v1/chat/completions", body.as_bytes());
    assert_eq!(status, 200, "{family}");
    let family: Value = serde_json::from_str(&family).unwrap();
    // The family template's own rule (roles alternate) comes back as a 400.
    let (status, v) = srv.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("alternate"),
        "{v}"
    );
    // Completions need no template.
    let (status, v) = srv.post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is Paris. The capital of Germany is", "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    assert!(
        v["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(" Berlin"),
        "{v}"
    );
    drop(srv);

    // The same request under testdata's gemma3.jinja, given by hand: the
    // same prompt tokens (count and hash of their ids) and the same answer.
    let tmpl = onebit_testdata::dir().join("chat-templates/gemma3.jinja");
    let srv = Server::start(
        onebit_testdata::GEMMA3_270M,
        &["--threads", "1", "--chat-template", tmpl.to_str().unwrap()],
    );
    let (status, given_head, given) =
        http_head(srv.port, "POST", "/v1/chat/completions", body.as_bytes());
    assert_eq!(status, 200, "{given}");
    let given: Value = serde_json::from_str(&given).unwrap();
    assert_eq!(
        family["usage"]["prompt_tokens"],
        given["usage"]["prompt_tokens"]
    );
    let hash = |h: &[(String, String)]| header(h, "x-onebit-prefix-hash").map(str::to_string);
    assert!(hash(&family_head).is_some(), "{family_head:?}");
    assert_eq!(hash(&family_head), hash(&given_head));
    assert_eq!(
        family["choices"][0]["message"]["content"],
        given["choices"][0]["message"]["content"]
    );
}

#[test]
fn a_model_with_no_known_template_refuses_chat() {
    // SmolLM2 (family llama, which has no known template) with its
    // tokenizer.chat_template removed.
    let src = onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M);
    let g = onebit_formats::gguf::Gguf::open(&src).unwrap();
    let mut w = onebit_formats::gguf::writer::GgufWriter::from_gguf(&g);
    w.remove_kv("tokenizer.chat_template");
    let dir = onebit_testdata::TempDir::new("no-template");
    let path = dir.file("smollm2-no-template.gguf", &w.to_bytes());
    drop(g);
    let srv = Server::start(path.to_str().unwrap(), &["--threads", "1"]);
    let (status, v) = srv.post("/v1/chat/completions", &greedy("Hi", 2));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "no_chat_template");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--chat-template"));
}

#[test]
fn run_chat_uses_the_template() {
    let out = Command::new(common::BIN)
        .args([
            "run",
            "--chat",
            "--max-tokens",
            "16",
            "--threads",
            "1",
            "--prompt",
            CAPITAL,
            "--model",
        ])
        .arg(onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Paris"), "{text}");
    assert!(!text.contains("<|im_end|>"));

    // Gemma 3 270M carries no template: its family's, and a [semantics]
    // line says where that came from.
    let out = Command::new(common::BIN)
        .args([
            "run",
            "--chat",
            "--max-tokens",
            "4",
            "--threads",
            "1",
            "--prompt",
            "hi",
            "--model",
        ])
        .arg(onebit_testdata::real_model(onebit_testdata::GEMMA3_270M))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("[semantics] chat template") && err.contains("gemma3.jinja"),
        "{err}"
    );
}

#[test]
fn openai_python_client() {
    python_client(&Server::smollm(&[]), "test_openai_client.py");
}

/// Runs `tests/serve/<script>` against `srv`; it must report no failure.
fn python_client(srv: &Server, script: &str) {
    common::python_script(script, &[srv.url()], None);
}

#[test]
fn ollama_python_client() {
    python_client(&Server::smollm(&[]), "test_ollama_client.py");
}

#[test]
fn embeddings_through_the_openai_client() {
    python_client(&Server::smollm(&[]), "test_embeddings.py");
}

#[test]
fn ollama_routes_need_the_key_like_v1() {
    let srv = Server::smollm(&["--api-key", "sekrit"]);
    for (method, path) in [
        ("GET", "/api/tags"),
        ("GET", "/api/version"),
        ("POST", "/api/chat"),
    ] {
        let (status, body) = http(srv.port, method, path, b"{}");
        assert_eq!(status, 401, "{path}: {body}");
    }
    // The page itself is public (it holds no data); its API calls send the key.
    let (status, body) = srv.get("/");
    assert_eq!(status, 200);
    assert!(body.contains("<title>onebit chat</title>"), "{body}");
}

fn template(name: &str) -> String {
    onebit_testdata::dir()
        .join("chat-templates")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn openai_tool_calls() {
    let hermes = Server::smollm(&["--chat-template", &template("chatml-think-tools.jinja")]);
    let plain = Server::smollm(&[]);
    let gemma = Server::smollm(&["--chat-template", &template("functiongemma-tools.jinja")]);
    common::python_script(
        "test_tools.py",
        &[hermes.url(), plain.url(), gemma.url()],
        None,
    );
    logit_bias_bans_and_forces(&plain);
}

/// `logit_bias` -100 bans the greedy first token (another comes), +100 on a
/// token makes it the only one chosen.
fn logit_bias_bans_and_forces(srv: &Server) {
    let g = onebit_formats::gguf::Gguf::open(onebit_testdata::real_model(
        onebit_testdata::SMOLLM2_135M,
    ))
    .unwrap();
    let tok = onebit_text::Tokenizer::from_gguf(&g).unwrap();
    let (first, _) = srv.chat(&greedy(CAPITAL, 1));
    let ids = tok.encode(&first, false).unwrap();
    assert_eq!(ids.len(), 1, "{first:?} is one token");
    let mut ban = greedy(CAPITAL, 1);
    ban["logit_bias"] = json!({ ids[0].to_string(): -100 });
    let (other, _) = srv.chat(&ban);
    assert_ne!(other, first);
    // Token 1000 is not the answer; forced, it is every token.
    let forced_text = tok.decode(&[1000], false).unwrap();
    assert_ne!(forced_text, first);
    let mut force = greedy(CAPITAL, 3);
    force["logit_bias"] = json!({"1000": 100});
    let (text, _) = srv.chat(&force);
    assert_eq!(text, forced_text.repeat(3));
}

/// The Responses and Messages APIs through the official `openai` and
/// `anthropic` clients: SmolLM2 with its own template (behind a key, which
/// the Anthropic client sends as `x-api-key`) and with a template that knows
/// tools.
#[test]
fn responses_and_anthropic_messages_clients() {
    let plain = Server::smollm(&["--api-key", "sekrit"]);
    let tools = Server::smollm(&["--chat-template", &template("chatml-think-tools.jinja")]);
    common::python_script("test_responses.py", &[plain.url(), tools.url()], None);
    common::python_script("test_anthropic.py", &[plain.url(), tools.url()], None);
}

/// Issue 29: tool calls arrive from models that write them as plain JSON
/// (Qwen2.5-Coder 0.5B under `auto`, through LangChain's bind_tools), and
/// required parallel calls end by themselves (Gemma 3 270M).
#[test]
fn tool_calls_arrive_from_small_models() {
    let small = ["--threads", "1", "--ctx", "2048"];
    let qwen = Server::start(onebit_testdata::QWEN25_CODER_05B, &small);
    let gemma = Server::start(onebit_testdata::GEMMA3_270M, &small);
    common::python_script("test_tools_arrive.py", &[qwen.url(), gemma.url()], None);
}

/// Issue 29's client matrix, the OpenAI-speaking rest: langchain-openai
/// (invoke, stream, structured output in every method, embeddings) and
/// litellm's `openai/` route, unchanged.
#[test]
fn langchain_openai_and_litellm_clients() {
    let srv = Server::smollm(&[]);
    python_client(&srv, "test_langchain_openai.py");
    python_client(&srv, "test_litellm.py");
}

#[test]
fn openai_structured_output() {
    let smol = Server::smollm(&["--max-seqs", "8"]);
    let gemma = Server::start(
        onebit_testdata::GEMMA3_270M,
        &[
            "--threads",
            "1",
            "--max-seqs",
            "8",
            "--chat-template",
            &template("gemma3.jinja"),
        ],
    );
    common::python_script("test_structured.py", &[smol.url(), gemma.url()], None);
}

/// Issue 29's Ollama client matrix (tests/serve/test_ollama_matrix.py):
/// curl -d, the `ollama` client, langchain-ollama and litellm against one
/// server holding SmolLM2 (the default), Qwen2.5-Coder-0.5B (a template
/// that takes tools) and Gemma 3 270M, two loaded at once.
#[test]
fn ollama_client_matrix() {
    let qwen = onebit_testdata::real_model(onebit_testdata::QWEN25_CODER_05B);
    let gemma = onebit_testdata::real_model(onebit_testdata::GEMMA3_270M);
    let srv = Server::smollm(&[
        "--model",
        qwen.to_str().unwrap(),
        "--model",
        gemma.to_str().unwrap(),
        "--max-loaded",
        "2",
    ]);
    python_client(&srv, "test_ollama_matrix.py");
}

/// Issue 29: a page on another origin, in headless Chromium, posting JSON
/// and a form (tests/serve/test_browser_origin.py): refused by a server
/// that does not list its origin, served by one started with
/// `--cors-origin` for it.
#[test]
fn a_page_elsewhere_is_refused_unless_its_origin_is_listed() {
    let page_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let origin = format!("http://elsewhere.test:{page_port}");
    let refusing = Server::smollm(&[]);
    let allowing = Server::smollm(&["--cors-origin", &origin]);
    common::python_script(
        "test_browser_origin.py",
        &[page_port.to_string(), refusing.url(), allowing.url()],
        None,
    );
}

/// Issue 29: under `--strict-fields` a field the server does not read is a
/// 400 naming it, on `/v1` and `/api` alike; the machine-level Ollama
/// options and null values are still accepted.
#[test]
fn strict_fields_refuses_what_it_does_not_read() {
    let srv = Server::smollm(&["--strict-fields"]);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (path, body, name) in [
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "max_tokens": 1, "totally_bogus_field": 1}),
            "`totally_bogus_field`",
        ),
        (
            "/api/chat",
            json!({"messages": msgs, "stream": false, "options": {"mirostat": 2}}),
            "`options.mirostat`",
        ),
        (
            "/v1/embeddings",
            json!({"input": "x", "pooling": "max"}),
            "`pooling`",
        ),
    ] {
        let (status, v) = srv.post(path, &body);
        assert_eq!(status, 400, "{path}: {v}");
        assert!(v.to_string().contains(name), "{path}: {v}");
        assert!(v.to_string().contains("--strict-fields"), "{path}: {v}");
    }
    let (status, v) = srv.post(
        "/api/chat",
        &json!({"messages": msgs, "stream": false,
                "options": {"num_thread": 2, "mirostat": null, "num_predict": 1}}),
    );
    assert_eq!(status, 200, "{v}");
}

/// The next `n` access-log lines of `srv` (10 s at most), other lines skipped.
fn access_lines(srv: &Server, n: usize, prefix: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        if let Ok(l) = srv.log.recv_timeout(Duration::from_millis(100)) {
            if l.starts_with(prefix) {
                out.push(l);
            }
        }
    }
    assert_eq!(out.len(), n, "{out:?}");
    out
}

/// Issue 29: one access-log line per request on stderr, with its method,
/// route, status, model, tokens, time to first token and duration: here a
/// 200 (whole, then streamed and served from the prefix cache), a 400 and
/// a 404, in `--log-format json`, and the same words in the text default.
#[test]
fn access_log_has_a_line_per_request_with_its_fields() {
    let srv = Server::smollm(&["--log-format", "json"]);
    // Five tokens asked and none to stop on early: finish "length", five tokens.
    let ask = json!({"messages": [{"role": "user", "content": "Count from one to fifty in words."}],
                     "temperature": 0, "max_tokens": 5});
    let (_, whole) = srv.chat(&ask);
    assert_eq!(whole["choices"][0]["finish_reason"], "length", "{whole}");
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (s, body) = http(
        srv.port,
        "POST",
        "/v1/chat/completions",
        streamed.to_string().as_bytes(),
    );
    assert_eq!(s, 200, "{body}");
    let usage = sse_events(&body).last().unwrap()["usage"].clone();
    let (s, _) = srv.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
    );
    assert_eq!(s, 400);
    let (s, _) = srv.get("/v1/no-such-route");
    assert_eq!(s, 404);
    let lines: Vec<Value> = access_lines(&srv, 4, "{")
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let model = onebit_testdata::SMOLLM2_135M.trim_end_matches(".gguf");
    for (l, usage) in lines[..2].iter().zip([&whole["usage"], &usage]) {
        assert_eq!(
            (
                &l["log"],
                &l["method"],
                &l["route"],
                &l["status"],
                &l["model"]
            ),
            (
                &json!("access"),
                &json!("POST"),
                &json!("/v1/chat/completions"),
                &json!(200),
                &json!(model)
            ),
            "{l}"
        );
        assert_eq!(l["completion_tokens"], 5, "{l}");
        assert_eq!(l["prompt_tokens"], usage["prompt_tokens"], "{l}");
        assert_eq!(
            l["cached_tokens"], usage["prompt_tokens_details"]["cached_tokens"],
            "{l}"
        );
        let (ttft, total) = (
            l["ttft_ms"].as_f64().unwrap(),
            l["duration_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < ttft && ttft <= total, "{l}");
    }
    // The same prompt again: its prefix came from the cache.
    assert!(
        lines[1]["cached_tokens"].as_u64().unwrap() > 0,
        "{}",
        lines[1]
    );
    // The 400 reached the model (it names it) but ran nothing; the 404 reached none.
    assert_eq!(
        (&lines[2]["status"], &lines[2]["model"]),
        (&json!(400), &json!(model))
    );
    assert_eq!(lines[2]["completion_tokens"], Value::Null);
    assert_eq!(
        (
            &lines[3]["method"],
            &lines[3]["route"],
            &lines[3]["status"],
            &lines[3]["model"]
        ),
        (
            &json!("GET"),
            &json!("/v1/no-such-route"),
            &json!(404),
            &Value::Null
        )
    );
    assert!(lines[2..]
        .iter()
        .all(|l| l["ttft_ms"].is_null() && l["duration_ms"].as_f64().unwrap() >= 0.0));
    drop(srv);
    // Text, the default: the same fields as words.
    let srv = Server::smollm(&[]);
    srv.chat(&ask);
    srv.get("/v1/no-such-route");
    let lines = access_lines(&srv, 2, "[access] ");
    let words: Vec<Vec<&str>> = lines.iter().map(|l| l.split(' ').collect()).collect();
    assert_eq!(
        words[0][1..4],
        ["POST", "/v1/chat/completions", "200"],
        "{lines:?}"
    );
    assert_eq!(words[0][4], format!("model={model}"));
    assert_eq!(words[0][6], "completion_tokens=5");
    for (w, key) in words[0][5..].iter().zip([
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "ttft_ms",
        "duration_ms",
    ]) {
        let v = w
            .strip_prefix(&format!("{key}="))
            .unwrap_or_else(|| panic!("{w}"));
        assert!(v.parse::<f64>().is_ok(), "{w}");
    }
    assert_eq!(
        words[1][1..],
        [
            "GET",
            "/v1/no-such-route",
            "404",
            "model=-",
            "prompt_tokens=-",
            "completion_tokens=-",
            "cached_tokens=-",
            "ttft_ms=-"
        ]
        .iter()
        .copied()
        .chain([words[1][9]])
        .collect::<Vec<_>>()[..]
    );
    assert!(words[1][9].starts_with("duration_ms="), "{lines:?}");
}
