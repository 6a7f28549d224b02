//! `onebit pull`, `list`, `rm` and `--model NAME` against a local Hub
//! (tests/hub/hub.py: the Hub's URL layout, redirects, Range, etag and
//! x-linked-* headers, and the faults its `.hub.json` asks for), with
//! `HF_ENDPOINT` pointing at it and `HF_HUB_CACHE` at a fresh store.
//!
//! Golden values are not ours: each file's bytes are the fixture's, its
//! sha256 and git blob id are the ones the Hub stand-in computes with
//! Python's hashlib, the commit is the one its model-info API states, and a
//! model run by name must answer as the same file run by path.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::BIN;
use onebit_testdata::TempDir;

/// The stand-in Hub on a free port, killed when dropped.
struct Hub {
    child: Child,
    port: u16,
    root: PathBuf,
}

impl Hub {
    fn start(root: &Path) -> Hub {
        let script = onebit_testdata::dir().join("../tests/hub/hub.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(root)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3 tests/hub/hub.py");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("hub did not start: {line:?}"));
        Hub {
            child,
            port,
            root: root.to_path_buf(),
        }
    }
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
    fn get(&self, path: &str) -> serde_json::Value {
        let (status, body) =
            common::request(self.port, "GET", path, b"", Duration::from_secs(30)).unwrap();
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }
    /// The model info the Hub states for `repo`.
    fn info(&self, repo: &str) -> serde_json::Value {
        self.get(&format!("/api/models/{repo}/revision/main?blobs=true"))
    }
    /// The Hub's sha256 (LFS) or git blob id of one file.
    fn hash(&self, repo: &str, file: &str) -> String {
        let info = self.info(repo);
        let s = info["siblings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["rfilename"] == file)
            .unwrap_or_else(|| panic!("{repo} has no {file}"))
            .clone();
        s["lfs"]["sha256"]
            .as_str()
            .or(s["blobId"].as_str())
            .unwrap()
            .to_string()
    }
    /// Requests the Hub saw for the bytes of `file` (its /cdn/ path).
    fn transfers(&self, repo: &str, file: &str) -> Vec<serde_json::Value> {
        let path = format!("/cdn/{repo}/{file}");
        self.get("/_log")
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["path"] == path.as_str() && r["method"] == "GET")
            .cloned()
            .collect()
    }
    fn repo(&self, repo: &str) -> PathBuf {
        let d = self.root.join(repo);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `onebit ARGS` with the Hub and the store of `env`.
fn onebit(env: &Env, args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("HF_ENDPOINT", env.hub.endpoint())
        .env("HF_HUB_CACHE", &env.store)
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN")
        .stdin(Stdio::null());
    for (k, v) in &env.extra {
        c.env(k, v);
    }
    c.output().expect("run onebit")
}

fn ok(env: &Env, args: &[&str]) -> (String, String) {
    let o = onebit(env, args);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "onebit {args:?} failed:\n{err}");
    (out, err)
}

fn fails(env: &Env, args: &[&str]) -> String {
    let o = onebit(env, args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "onebit {args:?} succeeded:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

struct Env {
    _tmp: TempDir,
    hub: Hub,
    store: PathBuf,
    extra: Vec<(String, String)>,
}

fn env(tag: &str) -> Env {
    let tmp = TempDir::new(tag);
    let root = tmp.path().join("hub");
    std::fs::create_dir_all(&root).unwrap();
    let store = tmp.path().join("store");
    Env {
        hub: Hub::start(&root),
        _tmp: tmp,
        store,
        extra: Vec::new(),
    }
}

fn fixture(family: &str, file: &str) -> PathBuf {
    onebit_testdata::fixture(family).join(file)
}

fn link(from: &Path, to: &Path) {
    std::os::unix::fs::symlink(from, to).unwrap();
}

/// A GGUF repository: two quants of fixtures, F32 split in three parts, a
/// projector, a chat template and a README.
fn tiny_repo(hub: &Hub) -> Vec<u8> {
    let d = hub.repo("t/tiny-GGUF");
    link(
        &fixture("llama", "Q4_K_M.gguf"),
        &d.join("tiny-Q4_K_M.gguf"),
    );
    link(&fixture("qwen2", "Q8_0.gguf"), &d.join("tiny-q8_0.gguf"));
    let f32 = std::fs::read(fixture("llama", "f32.gguf")).unwrap();
    let third = f32.len() / 3;
    for (k, part) in [&f32[..third], &f32[third..2 * third], &f32[2 * third..]]
        .iter()
        .enumerate()
    {
        std::fs::write(d.join(format!("tiny-F32-{:05}-of-00003.gguf", k + 1)), part).unwrap();
    }
    std::fs::write(d.join("mmproj-tiny-F16.gguf"), b"GGUF projector stand-in").unwrap();
    link(
        &onebit_testdata::dir().join("chat-templates/gemma3.jinja"),
        &d.join("template.jinja"),
    );
    std::fs::write(d.join("README.md"), b"# tiny\n").unwrap();
    f32
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Where a snapshot entry points, relative to the snapshot's parent.
fn blob_of(entry: &Path) -> PathBuf {
    entry
        .parent()
        .unwrap()
        .join(std::fs::read_link(entry).unwrap())
}

#[test]
fn pull_by_quant_split_and_companions_into_the_hub_cache_layout_then_list_run_and_rm() {
    let e = env("pull-layout");
    let f32 = tiny_repo(&e.hub);
    let repo = "t/tiny-GGUF";
    let commit = e.hub.info(repo)["sha"].as_str().unwrap().to_string();

    // A quant named in lower case; the companions come along.
    let (out, _) = ok(&e, &["pull", "hf.co/t/tiny-GGUF:Q8_0"]);
    let snap = e.store.join("models--t--tiny-GGUF/snapshots").join(&commit);
    let q8 = PathBuf::from(out.trim());
    assert_eq!(q8, snap.join("tiny-q8_0.gguf"));
    assert_eq!(read(&q8), read(&fixture("qwen2", "Q8_0.gguf")));
    assert_eq!(
        blob_of(&q8),
        snap.join("../../blobs")
            .join(e.hub.hash(repo, "tiny-q8_0.gguf"))
    );
    assert_eq!(
        std::fs::read_to_string(e.store.join("models--t--tiny-GGUF/refs/main")).unwrap(),
        commit
    );
    // A small file is stored under its git blob id.
    assert_eq!(
        blob_of(&snap.join("template.jinja")),
        snap.join("../../blobs")
            .join(e.hub.hash(repo, "template.jinja"))
    );
    assert_eq!(
        read(&snap.join("mmproj-tiny-F16.gguf")),
        b"GGUF projector stand-in"
    );
    assert!(
        !snap.join("tiny-Q4_K_M.gguf").exists(),
        "another quant was fetched"
    );

    // A split GGUF: every part, in order, byte for byte.
    let (out, _) = ok(&e, &["pull", "t/tiny-GGUF:f32"]);
    assert_eq!(
        PathBuf::from(out.trim()),
        snap.join("tiny-F32-00001-of-00003.gguf")
    );
    let joined: Vec<u8> = (1..=3)
        .flat_map(|k| read(&snap.join(format!("tiny-F32-{k:05}-of-00003.gguf"))))
        .collect();
    assert!(joined == f32, "the split parts do not join to the file");

    // No quant: Q4_K_M, as llama.cpp. Pulled again: nothing is fetched.
    ok(&e, &["pull", repo]);
    let (_, err) = ok(&e, &["pull", repo]);
    assert!(err.contains("0 file(s) fetched"), "{err}");
    assert_eq!(e.hub.transfers(repo, "tiny-Q4_K_M.gguf").len(), 1);

    let (list, _) = ok(&e, &["list"]);
    let rows: Vec<&str> = list.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{list}");
    assert!(rows[0].starts_with("t/tiny-GGUF:F32 "), "{list}");
    assert!(
        rows[1].starts_with("t/tiny-GGUF:Q4_K_M ") && rows[1].contains(" llama "),
        "{list}"
    );
    assert!(
        rows[2].starts_with("t/tiny-GGUF:Q8_0 ") && rows[2].contains(" qwen2 "),
        "{list}"
    );
    assert!(rows[2].contains(&q8.display().to_string()), "{list}");

    // By name, a model runs as its file does.
    let by_path = ok(
        &e,
        &[
            "run",
            "--model",
            fixture("llama", "Q4_K_M.gguf").to_str().unwrap(),
            "--ids",
            "1,2,3",
            "--max-tokens",
            "4",
        ],
    )
    .0;
    let by_name = ok(
        &e,
        &[
            "run",
            "--model",
            "t/tiny-GGUF:Q4_K_M",
            "--ids",
            "1,2,3",
            "--max-tokens",
            "4",
        ],
    )
    .0;
    assert_eq!(by_name, by_path);

    // rm takes one quant; the blobs it alone used go, the rest stay.
    let q8_blob = blob_of(&q8);
    ok(&e, &["rm", "t/tiny-GGUF:Q8_0"]);
    assert!(!q8.exists() && !q8_blob.exists());
    assert!(snap.join("tiny-Q4_K_M.gguf").is_file());
    assert!(
        snap.join("template.jinja").is_file(),
        "a companion another quant uses went"
    );
    let (list, _) = ok(&e, &["list"]);
    assert!(!list.contains(":Q8_0"), "{list}");
    let err = fails(&e, &["rm", "t/tiny-GGUF:Q8_0"]);
    assert!(
        err.contains("t/tiny-GGUF:Q8_0 is not in the store"),
        "{err}"
    );
    ok(&e, &["rm", "t/tiny-GGUF:F32"]);
    ok(&e, &["rm", "t/tiny-GGUF:Q4_K_M"]);
    assert!(!e.store.join("models--t--tiny-GGUF").exists());
}

#[test]
fn a_wrong_quant_lists_the_quants_there_and_a_missing_name_says_how_to_pull() {
    let e = env("pull-quant");
    tiny_repo(&e.hub);
    let err = fails(&e, &["pull", "t/tiny-GGUF:Q2_K"]);
    assert!(
        err.contains("t/tiny-GGUF has no GGUF file of quant Q2_K; its quants: F32, Q4_K_M, Q8_0"),
        "{err}"
    );
    let err = fails(&e, &["run", "--model", "t/tiny-GGUF:Q8_0", "--ids", "1"]);
    assert!(
        err.contains("run `onebit pull t/tiny-GGUF:Q8_0`, or pass --pull"),
        "{err}"
    );
    let by_path = ok(
        &e,
        &[
            "run",
            "--model",
            fixture("qwen2", "Q8_0.gguf").to_str().unwrap(),
            "--ids",
            "1,2",
            "--max-tokens",
            "3",
        ],
    )
    .0;
    let (by_name, _) = ok(
        &e,
        &[
            "run",
            "--pull",
            "--model",
            "t/tiny-GGUF:Q8_0",
            "--ids",
            "1,2",
            "--max-tokens",
            "3",
        ],
    );
    assert_eq!(by_name, by_path);
    let err = fails(&e, &["pull", "t/nothing-here"]);
    assert!(
        err.contains("t/nothing-here: not found on the Hub"),
        "{err}"
    );
}

#[test]
fn a_pack_repository_is_pulled_whole() {
    let e = env("pull-pack");
    let d = e.hub.repo("t/tiny-NPU2");
    // The pack files as a FastFlowLM repository holds them.
    for (name, bytes) in [
        ("model.q4nx", vec![7u8; 3 << 20]),
        ("config.json", br#"{"model_type":"llama"}"#.to_vec()),
        ("tokenizer.json", b"{}".to_vec()),
        (".gitattributes", b"*.q4nx filter=lfs\n".to_vec()),
    ] {
        std::fs::write(d.join(name), bytes).unwrap();
    }
    let commit = e.hub.info("t/tiny-NPU2")["sha"]
        .as_str()
        .unwrap()
        .to_string();
    let (out, _) = ok(&e, &["pull", "t/tiny-NPU2"]);
    let snap = e.store.join("models--t--tiny-NPU2/snapshots").join(&commit);
    assert_eq!(PathBuf::from(out.trim()), snap);
    for f in ["model.q4nx", "config.json", "tokenizer.json"] {
        assert_eq!(read(&snap.join(f)), read(&d.join(f)), "{f}");
    }
    let err = fails(&e, &["pull", "t/tiny-NPU2:Q4_0"]);
    assert!(
        err.contains("is a FastFlowLM pack, which has no quants"),
        "{err}"
    );
}

#[test]
fn a_transfer_cut_halfway_resumes_and_ends_byte_identical() {
    let e = env("pull-resume");
    let d = e.hub.repo("t/cut-GGUF");
    let src = fixture("llama", "f32.gguf");
    link(&src, &d.join("cut-F32.gguf"));
    std::fs::write(
        e.hub.root.join("t/cut-GGUF.hub.json"),
        br#"{"cut_once": ["cut-F32.gguf"]}"#,
    )
    .unwrap();
    let size = read(&src).len() as u64;
    let sha = e.hub.hash("t/cut-GGUF", "cut-F32.gguf");
    let blobs = e.store.join("models--t--cut-GGUF/blobs");

    // No retries: the pull stops, the half stays as .incomplete only.
    let err = fails(&e, &["pull", "--retries", "0", "t/cut-GGUF"]);
    assert!(err.contains("pulling again resumes it"), "{err}");
    let partial = blobs.join(format!("{sha}.incomplete"));
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), size / 2);
    assert!(!blobs.join(&sha).exists());
    assert!(!e.store.join("models--t--cut-GGUF/snapshots").exists());

    // The next pull asks for the rest only.
    let (out, _) = ok(&e, &["pull", "t/cut-GGUF"]);
    assert!(read(Path::new(out.trim())) == read(&src));
    let t = e.hub.transfers("t/cut-GGUF", "cut-F32.gguf");
    assert_eq!(t.len(), 2, "{t:?}");
    assert_eq!(t[0]["range"], serde_json::Value::Null);
    assert_eq!(t[1]["range"], format!("bytes={}-", size / 2));
    assert!(!partial.exists());
}

#[test]
fn a_cut_within_one_pull_is_resumed_by_it() {
    let e = env("pull-retry");
    let d = e.hub.repo("t/cut-GGUF");
    let src = fixture("llama", "Q4_K_M.gguf");
    link(&src, &d.join("cut-Q4_K_M.gguf"));
    std::fs::write(
        e.hub.root.join("t/cut-GGUF.hub.json"),
        br#"{"cut_once": ["cut-Q4_K_M.gguf"]}"#,
    )
    .unwrap();
    let (out, err) = ok(&e, &["pull", "t/cut-GGUF"]);
    assert!(err.contains("resuming"), "{err}");
    assert!(read(Path::new(out.trim())) == read(&src));
    let size = read(&src).len() as u64;
    let t = e.hub.transfers("t/cut-GGUF", "cut-Q4_K_M.gguf");
    assert_eq!(t[1]["range"], format!("bytes={}-", size / 2), "{t:?}");
}

#[test]
fn bytes_that_do_not_match_the_sha256_are_refused_by_name_and_not_kept() {
    let e = env("pull-corrupt");
    let d = e.hub.repo("t/bad-GGUF");
    link(&fixture("llama", "Q4_K_M.gguf"), &d.join("bad-Q4_K_M.gguf"));
    std::fs::write(
        e.hub.root.join("t/bad-GGUF.hub.json"),
        br#"{"corrupt": ["bad-Q4_K_M.gguf"]}"#,
    )
    .unwrap();
    let sha = e.hub.hash("t/bad-GGUF", "bad-Q4_K_M.gguf");
    let err = fails(&e, &["pull", "t/bad-GGUF"]);
    assert!(
        err.contains("t/bad-GGUF/bad-Q4_K_M.gguf: its sha256 is ")
            && err.contains(&format!("but the Hub says {sha}; the download was deleted")),
        "{err}"
    );
    let repo = e.store.join("models--t--bad-GGUF");
    let blobs: Vec<_> = std::fs::read_dir(repo.join("blobs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .collect();
    assert!(blobs.is_empty(), "{blobs:?}");
    assert!(!repo.join("snapshots").exists() && !repo.join("refs/main").exists());
}

#[test]
fn two_concurrent_pulls_of_one_file_fetch_it_once_and_both_succeed() {
    let e = env("pull-race");
    let d = e.hub.repo("t/race-GGUF");
    let src = fixture("llama", "f32.gguf");
    link(&src, &d.join("race-F32.gguf"));
    // ~160 chunks of 64 KiB, 5 ms apart: the pulls overlap.
    std::fs::write(
        e.hub.root.join("t/race-GGUF.hub.json"),
        br#"{"chunk_delay_ms": 5}"#,
    )
    .unwrap();
    let spawn = || {
        Command::new(BIN)
            .args(["pull", "t/race-GGUF"])
            .env("HF_ENDPOINT", e.hub.endpoint())
            .env("HF_HUB_CACHE", &e.store)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    for o in [&a, &b] {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(a.stdout, b.stdout);
    let path = PathBuf::from(String::from_utf8_lossy(&a.stdout).trim());
    assert!(read(&path) == read(&src));
    assert_eq!(e.hub.transfers("t/race-GGUF", "race-F32.gguf").len(), 1);
    let left: Vec<_> = std::fs::read_dir(e.store.join("models--t--race-GGUF/blobs"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

#[test]
fn a_gated_repository_answers_401_and_the_error_says_to_set_hf_token() {
    let mut e = env("pull-gated");
    let d = e.hub.repo("t/gated-GGUF");
    link(&fixture("qwen2", "Q8_0.gguf"), &d.join("gated-Q8_0.gguf"));
    std::fs::write(
        e.hub.root.join("t/gated-GGUF.hub.json"),
        br#"{"gated": "hf_secret"}"#,
    )
    .unwrap();
    let err = fails(&e, &["pull", "t/gated-GGUF"]);
    assert!(
        err.contains("answered 401") && err.contains("set HF_TOKEN"),
        "{err}"
    );
    e.extra.push(("HF_TOKEN".into(), "hf_wrong".into()));
    let err = fails(&e, &["pull", "t/gated-GGUF"]);
    assert!(
        err.contains("HF_TOKEN is set, but its account has no access"),
        "{err}"
    );
    e.extra[0].1 = "hf_secret".into();
    let (out, _) = ok(&e, &["pull", "t/gated-GGUF"]);
    assert!(read(Path::new(out.trim())) == read(&fixture("qwen2", "Q8_0.gguf")));
}

#[test]
fn the_real_smollm2_pulled_by_name_answers_as_its_file() {
    let e = env("pull-smol");
    let d = e.hub.repo("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF");
    let real = onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M);
    link(&real, &d.join(onebit_testdata::SMOLLM2_135M));
    let name = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1";
    let (out, _) = ok(&e, &["pull", name]);
    assert!(read(Path::new(out.trim())) == read(&real));
    let args = ["--prompt", "The capital of France is", "--max-tokens", "8"];
    let by_path = ok(
        &e,
        &[&["run", "--model", real.to_str().unwrap()][..], &args].concat(),
    )
    .0;
    let by_name = ok(&e, &[&["run", "--model", name][..], &args].concat()).0;
    assert_eq!(by_name, by_path);
    assert!(by_path.contains("Paris"), "{by_path}");
}

/// `onebit serve ARGS` with the Hub and the store of `e`, once it listens:
/// the child and its port.
fn serve(e: &Env, args: &[&str]) -> (Child, u16) {
    let mut child = Command::new(BIN)
        .args(["serve", "--port", "0"])
        .args(args)
        .env("HF_ENDPOINT", e.hub.endpoint())
        .env("HF_HUB_CACHE", &e.store)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start onebit serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                if let Some(at) = line.find("listening on http://") {
                    let addr = &line[at + "listening on http://".len()..];
                    let port = addr.split([':', ' ']).nth(1).unwrap().parse().unwrap();
                    // Keep draining stderr so the server never blocks on it.
                    std::thread::spawn(move || for _ in rx {});
                    return (child, port);
                }
                seen.push(line);
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("server did not start:\n{}", seen.join("\n"));
            }
        }
    }
}

#[test]
fn the_official_clients_pull_list_ps_retrieve_and_delete_through_the_server() {
    let e = env("pull-serve");
    let repo = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF";
    let real = onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M);
    link(&real, &e.hub.repo(repo).join(onebit_testdata::SMOLLM2_135M));
    let model = format!("smol={}", real.display());
    let (mut child, port) = serve(&e, &["--model", &model, "--max-loaded", "2"]);
    let name = format!("{repo}:Q4_1");
    let script = onebit_testdata::dir().join("../tests/serve/test_pull_clients.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([&format!("http://127.0.0.1:{port}"), &name, "smol"])
        .output()
        .expect("python3 runs");
    let _ = child.kill();
    let _ = child.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("6 passed, 0 failed"),
        "{} failed (install its packages with scripts/python-deps.sh):\n{stdout}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !e.store
            .join("models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF")
            .exists(),
        "/api/delete left the model in the store"
    );
}

#[test]
fn a_split_gguf_missing_a_part_is_refused_by_name_not_loaded() {
    // The llama fixture whole, marked as part 1 of 2 as gguf-split marks it,
    // with no part 2 beside it.
    let src = fixture("llama", "Q4_K_M.gguf");
    let g = onebit_formats::gguf::Gguf::open(&src).unwrap();
    let mut w = onebit_formats::gguf::writer::GgufWriter::from_gguf(&g);
    w.set_kv("split.no", onebit_formats::gguf::Value::U16(0));
    w.set_kv("split.count", onebit_formats::gguf::Value::U16(2));
    let tmp = TempDir::new("pull-split-load");
    let part = tmp.file("m-Q4_K_M-00001-of-00002.gguf", &w.to_bytes());
    drop(g);
    let e = env("pull-split-load-env");
    let err = fails(&e, &["inspect", "--model", part.to_str().unwrap()]);
    assert!(
        err.contains("is part 1 of 2 of a split GGUF, but part 2")
            && err.contains("m-Q4_K_M-00002-of-00002.gguf) is not there"),
        "{err}"
    );
}
