//! `onebit serve` with many models: three names over the two real models
//! (SmolLM2-135M under its file stem and again as `smol2`, Gemma 3 270M as
//! `gemma`) with `--max-loaded 2`. Each request gets its own model's greedy
//! answer, the same as `onebit run` on that model; loading a third evicts
//! the least recently used; `keep_alive: 0` unloads; an unknown name is a
//! 404 in each protocol's error shape.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::Server;

const PROMPT: &str = "The capital of France is";
const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1";

fn call(port: u16, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let data = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let (s, b) = common::request(port, method, path, &data, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let v = serde_json::from_str(&b).unwrap_or_else(|e| panic!("{path}: {e}: {b}"));
    (s, v)
}

/// `onebit run`'s greedy continuation of PROMPT on `model` (6 tokens).
fn run_greedy(model: &std::path::Path) -> String {
    let out = Command::new(common::BIN)
        .args([
            "run",
            "--threads",
            "1",
            "--max-tokens",
            "6",
            "--prompt",
            PROMPT,
            "--model",
        ])
        .arg(model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The served continuation of PROMPT by model `name` (6 greedy tokens).
fn served(port: u16, name: &str) -> String {
    let (s, v) = call(
        port,
        "POST",
        "/v1/completions",
        &json!({"model": name, "prompt": PROMPT, "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(s, 200, "{name}: {v}");
    assert_eq!(v["model"], name, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// The names `/api/ps` lists as loaded, sorted.
fn loaded(port: u16) -> Vec<String> {
    let (s, v) = call(port, "GET", "/api/ps", &Value::Null);
    assert_eq!(s, 200, "{v}");
    let mut names: Vec<String> = v["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// Waits (10 s at most) for `/api/ps` to list exactly `want`.
fn wait_loaded(port: u16, want: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = loaded(port);
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "loaded {now:?}, want {want:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The context each sequence may hold (`--ctx`), for the RSS budget.
const CTX: usize = 2048;

/// SmolLM2's file plus an f16 KV cache of `CTX` positions, plus 10 %.
fn smol_budget(smol: &std::path::Path) -> u64 {
    let d = onebit_model::load::open(smol)
        .expect("SmolLM2 opens")
        .sem
        .dims;
    let kv = (d.n_layer * d.n_head_kv * (d.head_dim_k + d.head_dim_v) * 2 * CTX) as u64;
    let size = std::fs::metadata(smol).expect("model file").len();
    (size + kv) * 11 / 10
}

/// The server's resident memory (VmRSS) once it is under `budget`, waiting
/// up to 10 s (an unloaded engine thread ends after its last step); fails
/// with the last reading otherwise.
fn wait_rss_below(srv: &Server, budget: u64) -> u64 {
    let read = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", srv.child.id())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmRSS in /proc/PID/status");
        kib * 1024
    };
    let t = Instant::now();
    loop {
        let rss = read();
        if rss <= budget {
            return rss;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "RSS {:.1} MB after unloading, over the {:.1} MB budget (SmolLM2's file + KV + 10 %)",
            rss as f64 / 1e6,
            budget as f64 / 1e6
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn three_models_two_loaded_picked_by_name_evicted_lru_and_unloaded_by_keep_alive() {
    let smol = onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M);
    let gemma = onebit_testdata::real_model(onebit_testdata::GEMMA3_270M);
    let want_smol = run_greedy(&smol);
    let want_gemma = run_greedy(&gemma);
    assert_ne!(want_smol, want_gemma, "the two models must answer apart");
    let srv = Server::start(
        onebit_testdata::SMOLLM2_135M,
        &[
            "--threads",
            "1",
            "--max-loaded",
            "2",
            "--ctx",
            &CTX.to_string(),
            "--model",
            &format!("gemma={}", gemma.display()),
            "--model",
            &format!("smol2={}", smol.display()),
        ],
    );
    let port = srv.port;

    // Every model is listed; only the default one is loaded at start.
    let (s, v) = call(port, "GET", "/v1/models", &Value::Null);
    assert_eq!(s, 200, "{v}");
    let listed: Vec<(&str, bool)> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["loaded"].as_bool().unwrap()))
        .collect();
    assert_eq!(listed, [(SMOL, true), ("gemma", false), ("smol2", false)]);
    let (s, v) = call(port, "GET", "/v1/models/gemma", &Value::Null);
    assert_eq!((s, v["id"].as_str()), (200, Some("gemma")), "{v}");
    wait_loaded(port, &[SMOL]);

    // Alternating: each its own model's answer. Loading smol2 as the third
    // evicts SMOL, used least recently (before gemma); then SMOL again
    // evicts smol2 (gemma was used after it).
    assert_eq!(served(port, "gemma"), want_gemma);
    wait_loaded(port, &[SMOL, "gemma"]);
    assert_eq!(served(port, "smol2"), want_smol);
    wait_loaded(port, &["gemma", "smol2"]);
    assert_eq!(served(port, "gemma"), want_gemma);
    assert_eq!(served(port, SMOL), want_smol);
    wait_loaded(port, &[SMOL, "gemma"]);
    // Ollama's `:latest` tag names the same model.
    let (s, v) = call(
        port,
        "POST",
        "/api/generate",
        &json!({"model": "gemma:latest", "prompt": PROMPT, "raw": true, "stream": false,
                "options": {"temperature": 0, "num_predict": 6}, "keep_alive": 0}),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["response"].as_str().unwrap(), want_gemma, "{v}");
    // keep_alive 0: gemma unloads once its request is done.
    wait_loaded(port, &[SMOL]);
    // And its memory goes back: RSS within 10 % of what SmolLM2 needs, its
    // file plus its KV cache (as tests/memory.rs counts it: K and V rows of
    // every layer, here f16 for each of the --ctx positions a sequence may
    // hold). Gemma 3's file alone is 253 MB.
    let rss = wait_rss_below(&srv, smol_budget(&smol));
    eprintln!(
        "[models] RSS {:.1} MB after gemma unloaded",
        rss as f64 / 1e6
    );
    // A request with nothing to generate and keep_alive 0 unloads at once.
    let (s, v) = call(
        port,
        "POST",
        "/api/generate",
        &json!({"model": SMOL, "keep_alive": 0}),
    );
    assert_eq!((s, v["done_reason"].as_str()), (200, Some("unload")), "{v}");
    wait_loaded(port, &[]);
    // And the next request loads it again.
    assert_eq!(served(port, SMOL), want_smol);

    // Unknown names: 404, in OpenAI's shape on /v1, Ollama's on /api.
    let (s, v) = call(
        port,
        "POST",
        "/v1/chat/completions",
        &json!({"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(s, 404, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    assert_eq!(v["error"]["param"], "model", "{v}");
    let (s, v) = call(
        port,
        "POST",
        "/api/chat",
        &json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}], "stream": false}),
    );
    assert_eq!(s, 404, "{v}");
    assert!(v["error"].as_str().unwrap().contains("nope"), "{v}");
    let (s, _) = call(port, "GET", "/v1/models/nope", &Value::Null);
    assert_eq!(s, 404);

    // Metrics per model: loads and unloads as above.
    let (_, text) = common::request(port, "GET", "/metrics", b"", Duration::from_secs(30)).unwrap();
    let metric = |line: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {line} in\n{text}"))
    };
    assert_eq!(metric("onebit_model_loads_total{model=\"gemma\"}"), 1);
    assert_eq!(metric("onebit_model_unloads_total{model=\"gemma\"}"), 1);
    assert_eq!(metric("onebit_model_loads_total{model=\"smol2\"}"), 1);
    assert_eq!(
        metric(&format!("onebit_model_loads_total{{model=\"{SMOL}\"}}")),
        3
    );
    assert_eq!(
        metric(&format!("onebit_model_loaded{{model=\"{SMOL}\"}}")),
        1
    );
    assert_eq!(metric("onebit_model_loaded{model=\"gemma\"}"), 0);
}

/// `--max-memory` bounds the loaded models together, each counted as its
/// file plus `--max-seqs` states at the full context (and its prefix cache,
/// off here): at 300 MB SmolLM2 (98 MB + 12 MB) and Gemma 3 270M (253 MB +
/// its KV) each fit alone but not together, so loading one unloads the
/// other although `--max-loaded` allows three; Qwen2.5-0.5B (491 MB) does
/// not fit at all and is refused by name with a 503, not loaded.
#[test]
fn max_memory_evicts_to_fit_and_refuses_a_model_larger_than_the_bound() {
    let smol = onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M);
    let gemma = onebit_testdata::real_model(onebit_testdata::GEMMA3_270M);
    let qwen = onebit_testdata::real_model(onebit_testdata::QWEN25_CODER_05B);
    const BOUND: u64 = 300_000_000;
    let footprint = |p: &std::path::Path| {
        let sem = onebit_model::load::open(p).expect("model opens").sem;
        let d = &sem.dims;
        // f16 K and V rows of every layer at each of the 512 positions: at
        // most what a state at the full context holds (sliding layers hold
        // fewer).
        let kv = (d.n_layer * d.n_head_kv * (d.head_dim_k + d.head_dim_v) * 2 * 512) as u64;
        std::fs::metadata(p).unwrap().len() + kv
    };
    let (fs, fg) = (footprint(&smol), footprint(&gemma));
    assert!(fs < BOUND && fg < BOUND && fs + fg > BOUND, "{fs} {fg}");
    assert!(std::fs::metadata(&qwen).unwrap().len() > BOUND);

    let srv = Server::start(
        onebit_testdata::SMOLLM2_135M,
        &[
            "--threads",
            "1",
            "--max-loaded",
            "3",
            "--max-memory",
            "300M",
            "--max-seqs",
            "1",
            "--no-prefix-cache",
            "--ctx",
            "512",
            "--model",
            &format!("gemma={}", gemma.display()),
            "--model",
            &format!("qwen={}", qwen.display()),
        ],
    );
    let port = srv.port;
    wait_loaded(port, &[SMOL]);
    served(port, "gemma");
    wait_loaded(port, &["gemma"]);

    let (s, v) = call(
        port,
        "POST",
        "/v1/completions",
        &json!({"model": "qwen", "prompt": PROMPT, "max_tokens": 1}),
    );
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_memory", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("`qwen`") && msg.contains("--max-memory of 300 MB"),
        "{msg}"
    );
    assert_eq!(loaded(port), ["gemma"], "the refused model evicted another");

    served(port, SMOL);
    wait_loaded(port, &[SMOL]);
    let log: Vec<String> = srv.log.try_iter().collect();
    assert!(
        log.iter()
            .any(|l| l.contains("unloaded gemma") && l.contains("--max-memory")),
        "{log:?}"
    );
}

/// Requests that arrive while their model loads wait for it, within the
/// queue limits: with `--max-queue 3`, two wait beside the one that loads
/// it (the three then fill the engine's queue at once); of eight sent at
/// once while Gemma 3 loads, the others are told to retry (503
/// `queue_full`, naming the model being loaded), and every accepted one
/// gets the model's greedy answer.
#[test]
fn requests_arriving_while_their_model_loads_wait_within_the_queue_limits() {
    let gemma = onebit_testdata::real_model(onebit_testdata::GEMMA3_270M);
    let want = run_greedy(&gemma);
    let srv = Server::start(
        onebit_testdata::SMOLLM2_135M,
        &[
            "--threads",
            "1",
            "--max-loaded",
            "2",
            "--max-seqs",
            "1",
            "--max-queue",
            "3",
            "--model",
            &format!("gemma={}", gemma.display()),
        ],
    );
    let port = srv.port;
    wait_loaded(port, &[SMOL]);
    let go = std::sync::Arc::new(std::sync::Barrier::new(8));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                call(
                    port,
                    "POST",
                    "/v1/completions",
                    &json!({"model": "gemma", "prompt": PROMPT, "max_tokens": 6, "temperature": 0}),
                )
            })
        })
        .collect();
    let (mut answered, mut waited_out) = (0, 0);
    for c in clients {
        let (s, v) = c.join().unwrap();
        match s {
            200 => {
                assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want, "{v}");
                answered += 1;
            }
            503 => {
                assert_eq!(v["error"]["code"], "queue_full", "{v}");
                if v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("wait for model `gemma` to load")
                {
                    waited_out += 1;
                }
            }
            _ => panic!("{s}: {v}"),
        }
    }
    eprintln!("[models] {answered} answered, {waited_out} told to retry while gemma loaded");
    // The loader and the two it lets wait, at least; some refused while it
    // loaded (gemma takes a second or more to load, the eight arrive at once).
    assert!(answered >= 3, "{answered} answered");
    assert!(waited_out >= 1, "none refused while the model loaded");
    assert!(answered + waited_out <= 8);
}

/// Sixteen clients spread over three models, two loaded at a time, for 30
/// s (each client's requests go round the three): every request is
/// answered, each with its own model's greedy text (as it answered alone),
/// while the models load and evict under them.
#[test]
fn sixteen_clients_over_three_models_lose_nothing() {
    let gemma = onebit_testdata::real_model(onebit_testdata::GEMMA3_270M);
    let smol = onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M);
    let gemma_arg = format!("gemma={}", gemma.display());
    let smol2_arg = format!("smol2={}", smol.display());
    let srv = Server::start(
        onebit_testdata::SMOLLM2_135M,
        &[
            "--model",
            &gemma_arg,
            "--model",
            &smol2_arg,
            "--max-loaded",
            "2",
            "--threads",
            "2",
        ],
    );
    let port = srv.port;
    let names = [SMOL, "gemma", "smol2"];
    let want: Vec<String> = names.iter().map(|n| served(port, n)).collect();
    assert_eq!(want[0], want[2], "one file under two names answers alike");
    let until = Instant::now() + Duration::from_secs(30);
    let clients: Vec<_> = (0..16)
        .map(|c| {
            std::thread::spawn(move || {
                let mut got = Vec::new();
                for r in 0.. {
                    if r > 0 && Instant::now() >= until {
                        break;
                    }
                    let i = (c + r) % 3;
                    got.push((i, served(port, names[i])));
                }
                got
            })
        })
        .collect();
    let mut answered = 0;
    for c in clients {
        for (i, text) in c.join().expect("a client panicked") {
            assert_eq!(text, want[i], "{}", names[i]);
            answered += 1;
        }
    }
    eprintln!("[models] {answered} requests answered in 30 s by 16 clients");
    assert!(answered >= 16);
}
