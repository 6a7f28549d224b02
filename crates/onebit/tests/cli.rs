//! The command line as users and scripts meet it: known answers on the real
//! models, llama.cpp's token ids, golden logits through `onebit logits`, and
//! errors that name what is wrong without panicking.

use std::process::{Command, Output};

use onebit_testdata::{
    compare, real_model, token_refs, Fixture, TempDir, GEMMA3_270M, SMOLLM2_135M,
};

fn onebit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(args)
        .output()
        .expect("onebit runs")
}

fn ok(args: &[&str]) -> String {
    let out = onebit(args);
    assert!(
        out.status.success(),
        "onebit {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// A failure: non-zero exit, not a panic (101), and stderr returned.
fn fails(args: &[&str]) -> String {
    let out = onebit(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "onebit {args:?} should fail");
    assert_ne!(
        out.status.code(),
        Some(101),
        "onebit {args:?} panicked: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// Three greedy tokens of a real model's continuation of `prompt`.
fn continuation(model_file: &str, prompt: &str) -> String {
    let m = real_model(model_file);
    ok(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        prompt,
        "--max-tokens",
        "3",
    ])
}

#[test]
fn gemma3_270m_answers_berlin() {
    let out = continuation(
        GEMMA3_270M,
        "The capital of France is Paris. The capital of Germany is",
    );
    assert!(out.starts_with(" Berlin"), "continuation was {out:?}");
}

#[test]
fn smollm2_answers_paris() {
    let out = continuation(SMOLLM2_135M, "The capital of France is");
    assert!(out.starts_with(" Paris"), "continuation was {out:?}");
}

#[test]
fn run_prints_only_the_text_and_one_stats_line() {
    let m = real_model(SMOLLM2_135M);
    let out = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args([
            "run",
            "--model",
            m.to_str().unwrap(),
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "4",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        !stdout.contains("The capital"),
        "the prompt is echoed: {stdout:?}"
    );
    assert!(!stdout.contains('['), "decoration on stdout: {stdout:?}");
    let stats: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("[stats]"))
        .collect();
    assert_eq!(stats.len(), 1, "{stderr}");
    for field in ["prompt tokens 5", "prefill", "decode", "tok/s"] {
        assert!(stats[0].contains(field), "{}", stats[0]);
    }
}

#[test]
fn tokenize_gives_llamacpp_ids_on_both_models() {
    for model in [GEMMA3_270M, SMOLLM2_135M] {
        let m = real_model(model);
        for (text, ids) in token_refs(model) {
            let out = ok(&["tokenize", "--model", m.to_str().unwrap(), "--text", &text]);
            let got: Vec<u32> = out
                .trim()
                .trim_matches(['[', ']'])
                .split(',')
                .map(|s| s.parse().unwrap())
                .collect();
            assert_eq!(got, ids, "{model}: {text:?}");
        }
    }
}

#[test]
fn logits_command_matches_llamacpp_and_sequential_matches_batch() {
    let dir = TempDir::new("cli-logits");
    for (family, file, reference, run, bound) in [
        ("llama", "f32.gguf", "f32.logits.bin", "f32", 1e-4f32),
        (
            "gemma3",
            "f32.gguf",
            "f32.exact_gelu.logits.bin",
            "f32",
            2e-5,
        ),
    ] {
        let fx = Fixture::new(family);
        let ids: Vec<String> = fx.tokens("tokens").iter().map(|t| t.to_string()).collect();
        let ids = ids.join(",");
        let model = fx.dir.join(file);
        let batch = dir.path().join(format!("{family}.batch"));
        let seq = dir.path().join(format!("{family}.seq"));
        ok(&[
            "logits",
            "--model",
            model.to_str().unwrap(),
            "--ids",
            &ids,
            "--out",
            batch.to_str().unwrap(),
            // The f32 references are llama.cpp's runs with an f32 KV cache.
            "--kv-type",
            "f32",
        ]);
        ok(&[
            "logits",
            "--model",
            model.to_str().unwrap(),
            "--ids",
            &ids,
            "--out",
            seq.to_str().unwrap(),
            "--sequential",
            "--kv-type",
            "f32",
        ]);
        let ours = onebit_testdata::read_f32(&batch);
        let c = compare(
            &ours,
            &fx.logits(reference),
            fx.n_vocab(),
            &fx.top1_margin(run),
        );
        assert!(
            c.max_abs_diff <= bound * fx.max_abs_logit(run),
            "{family}: {c:?}"
        );
        assert_eq!(
            std::fs::read(&batch).unwrap(),
            std::fs::read(&seq).unwrap(),
            "{family}: batch != sequential"
        );
    }
}

#[test]
fn inspect_prints_semantics_with_sources() {
    let fx = Fixture::new("gemma3");
    let out = ok(&[
        "inspect",
        "--model",
        fx.dir.join("Q5_0.gguf").to_str().unwrap(),
    ]);
    assert!(
        out.contains(
            "[semantics] layer kinds: 7: sliding x6 at [0, 1, 2, 3, 4, 6], full x1 at [5]"
        ),
        "{out}"
    );
    assert!(out.contains("rope sliding: base 10000"), "{out}");
    assert!(out.contains("<- GGUF gemma3.rope.freq_base_swa"), "{out}");
    assert!(out.contains("[tensors] Q5_0"), "{out}");
}

#[test]
fn errors_name_the_problem_and_never_panic() {
    let e = fails(&["run", "--model", "/nonexistent/model.gguf", "--prompt", "x"]);
    assert!(e.contains("/nonexistent/model.gguf"), "{e}");

    let dir = TempDir::new("cli-errors");
    let junk = dir.file("junk.gguf", b"not a gguf at all");
    let e = fails(&["inspect", "--model", junk.to_str().unwrap()]);
    assert!(
        e.contains("junk.gguf") && e.contains("not a GGUF file"),
        "{e}"
    );

    // The fixtures have no vocabulary: run must say so rather than guess.
    let fx = Fixture::new("llama");
    let e = fails(&[
        "run",
        "--model",
        fx.dir.join("f32.gguf").to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    assert!(e.contains("tokenizer"), "{e}");

    // An id outside the vocabulary is refused by value.
    let out = dir.path().join("x.bin");
    let e = fails(&[
        "logits",
        "--model",
        fx.dir.join("f32.gguf").to_str().unwrap(),
        "--ids",
        "1,384",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(e.contains("384") && e.contains("vocabulary"), "{e}");

    // An unknown KV type is refused by name with the accepted ones; q8_0 on
    // 16-wide heads (qwen2's fixture) by the file and the head size.
    let qwen2 = Fixture::new("qwen2").dir.join("f32.gguf");
    let qwen2 = qwen2.to_str().unwrap();
    let e = fails(&["inspect", "--model", qwen2, "--kv-type", "q4_0"]);
    assert!(e.contains("q4_0") && e.contains("f32, f16 or q8_0"), "{e}");
    let args = ["logits", "--model", qwen2, "--ids", "1", "--out"];
    let e = fails(&[&args[..], &[out.to_str().unwrap(), "--kv-type", "q8_0"]].concat());
    assert!(
        e.contains("f32.gguf") && e.contains("q8_0") && e.contains("is 16"),
        "{e}"
    );

    // A truncated real file names the tensor that no longer fits.
    let bytes = std::fs::read(fx.dir.join("Q4_K_M.gguf")).unwrap();
    let cut = dir.file("cut.gguf", &bytes[..bytes.len() / 2]);
    let e = fails(&["inspect", "--model", cut.to_str().unwrap()]);
    assert!(
        e.contains("cut.gguf") && e.contains("outside the file"),
        "{e}"
    );
}

/// `bench --mmproj` times the vision tower alone: a text model or a text
/// bench option beside it is refused by name, never silently ignored.
#[test]
fn bench_mmproj_refuses_the_text_bench_options_by_name() {
    let mmproj = onebit_testdata::fixture("gemma3-vision").join("mmproj.gguf");
    let mmproj = mmproj.to_str().unwrap();
    for (flag, value) in [
        ("--gen-tokens", "5"),
        ("--prompt-tokens", "8"),
        ("--batch", "2"),
        ("--draft-max", "4"),
        ("--kv-type", "f32"),
    ] {
        let e = fails(&["bench", "--mmproj", mmproj, flag, value]);
        assert!(e.contains("--mmproj") && e.contains(flag), "{flag}: {e}");
    }
    let smol = real_model(SMOLLM2_135M);
    let e = fails(&[
        "bench",
        "--mmproj",
        mmproj,
        "--model",
        smol.to_str().unwrap(),
    ]);
    assert!(e.contains("--mmproj") && e.contains("--model"), "{e}");
}

/// Runs onebit with `stdin` piped in.
fn with_stdin(args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("onebit runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn run_is_quiet_by_default_and_verbose_prints_the_semantics() {
    let m = real_model(SMOLLM2_135M);
    let m = m.to_str().unwrap();
    let args = ["run", "--model", m, "--prompt", "Hi", "--max-tokens", "1"];
    let quiet = onebit(&args);
    let stderr = String::from_utf8_lossy(&quiet.stderr);
    assert!(quiet.status.success(), "{stderr}");
    assert!(!stderr.contains("[semantics]"), "{stderr}");
    let loud = onebit(&[&args[..], &["-v"]].concat());
    let stderr = String::from_utf8_lossy(&loud.stderr);
    assert!(loud.status.success(), "{stderr}");
    assert!(stderr.contains("[semantics] "), "{stderr}");
}

#[test]
fn run_reads_the_prompt_from_stdin() {
    let m = real_model(SMOLLM2_135M);
    let out = with_stdin(
        &["run", "--model", m.to_str().unwrap(), "--max-tokens", "3"],
        // As `echo` sends it: the one trailing newline is not part of the prompt.
        "The capital of France is\n",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same known answer as with --prompt.
    assert!(stdout.starts_with(" Paris"), "continuation was {stdout:?}");
}

#[test]
fn a_missing_file_names_its_cause_once() {
    let e = fails(&["run", "--model", "/nonexistent/model.gguf", "--prompt", "x"]);
    assert_eq!(e.matches("os error 2").count(), 1, "{e}");
    assert!(e.contains("/nonexistent/model.gguf"), "{e}");
}

#[test]
fn chat_keeps_the_conversation_through_a_pipe() {
    let m = real_model(SMOLLM2_135M);
    let m = m.to_str().unwrap();
    // Two turns; the second ("And of Germany?") only makes sense with the
    // first in the conversation. Each answer is one stdout line, the first
    // exactly what `run --chat` answers the same single question.
    let q1 = "What is the capital of France? Answer with one word.";
    let args = ["chat", "--model", m, "--max-tokens", "12"];
    let two = with_stdin(
        &args,
        &format!("{q1}\nAnd of Germany? Answer with one word.\n"),
    );
    let stdout = String::from_utf8_lossy(&two.stdout).to_string();
    assert!(
        two.status.success(),
        "{}",
        String::from_utf8_lossy(&two.stderr)
    );
    let one = ok(&[
        "run",
        "--model",
        m,
        "--chat",
        "--prompt",
        q1,
        "--max-tokens",
        "12",
    ]);
    let turns: Vec<&str> = stdout.lines().collect();
    assert_eq!(turns.len(), 2, "{stdout:?}");
    assert_eq!(turns[0], one, "{stdout:?}");
    assert!(turns[0].contains("Paris"), "{stdout:?}");
    assert!(turns[1].contains("Berlin"), "{stdout:?}");
}

#[test]
fn embed_gives_unit_vectors_the_same_from_flags_and_stdin() {
    let m = real_model(SMOLLM2_135M);
    let m = m.to_str().unwrap();
    let (a, b) = ("The cat sat on the mat.", "Paris is in France.");
    let flags = ok(&["embed", "--model", m, "--text", a, "--text", b]);
    let piped = with_stdin(&["embed", "--model", m], &format!("{a}\n{b}\n"));
    assert!(
        piped.status.success(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    assert_eq!(flags, String::from_utf8(piped.stdout).unwrap());
    let vectors: Vec<Vec<f64>> = flags
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(vectors.len(), 2);
    for v in &vectors {
        // SmolLM2-135M's hidden size, from its GGUF llama.embedding_length.
        assert_eq!(v.len(), 576);
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }
    assert_ne!(vectors[0], vectors[1]);
}

#[test]
fn embed_refuses_a_pooling_type_it_does_not_implement_by_key() {
    use onebit_formats::gguf::{writer::GgufWriter, Gguf, Value};
    let src = Fixture::new("llama").dir.join("f32.gguf");
    let g = Gguf::open(&src).unwrap();
    let dir = TempDir::new("cli-embed");
    // 4 is llama.cpp's LLAMA_POOLING_TYPE_RANK: refused by key and value.
    let mut w = GgufWriter::from_gguf(&g);
    w.set_kv("llama.pooling_type", Value::U32(4));
    let rank = dir.file("rank.gguf", &w.to_bytes());
    let e = fails(&["embed", "--model", rank.to_str().unwrap(), "--text", "x"]);
    assert!(
        e.contains("llama.pooling_type = 4") && e.contains("rank"),
        "{e}"
    );
    // 2 (cls) is implemented: the same file gets past pooling, to the
    // tokenizer the fixture lacks.
    let mut w = GgufWriter::from_gguf(&g);
    w.set_kv("llama.pooling_type", Value::U32(2));
    let cls = dir.file("cls.gguf", &w.to_bytes());
    let e = fails(&["embed", "--model", cls.to_str().unwrap(), "--text", "x"]);
    assert!(!e.contains("pooling") && e.contains("tokenizer"), "{e}");
}

/// The stderr lines `onebit serve` writes up to its "listening" line; the
/// server is then killed.
fn serve_startup(extra: &[&str]) -> Vec<String> {
    use std::io::BufRead;
    let m = real_model(SMOLLM2_135M);
    let mut child = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(["serve", "--model", m.to_str().unwrap(), "--port", "0"])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let done = line.contains("listening on");
        lines.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

#[test]
fn serve_is_quiet_by_default_and_verbose_prints_the_semantics() {
    let quiet = serve_startup(&[]);
    assert!(quiet.last().unwrap().contains("listening on"), "{quiet:?}");
    assert!(
        !quiet.iter().any(|l| l.starts_with("[semantics]")),
        "{quiet:?}"
    );
    let loud = serve_startup(&["-v"]);
    assert!(
        loud.iter().any(|l| l.starts_with("[semantics]")),
        "{loud:?}"
    );
}

/// `bench --batch N` decodes N sequences together: the table has the
/// aggregate and per-sequence rows, the JSON's aggregate is N times its
/// per-sequence rate, and a batch of 0 or one combined with drafting is
/// refused by name.
#[test]
fn bench_batch_reports_aggregate_and_per_sequence_and_refuses_what_it_cannot_run() {
    let m = real_model(SMOLLM2_135M);
    let m = m.to_str().unwrap();
    let base = [
        "bench",
        "--model",
        m,
        "--threads",
        "2",
        "--prompt-tokens",
        "3",
        "--gen-tokens",
        "4",
        "--depth",
        "5",
        "--repetitions",
        "1",
        "--batch",
        "3",
    ];
    let table = ok(&base);
    assert!(table.contains("| pp3 x3 @ d5 |"), "{table}");
    assert!(table.contains("| tg4 x3 @ d5 |"), "{table}");
    assert!(table.contains("| tg4 x3 @ d5 per sequence |"), "{table}");
    let args: Vec<&str> = base.iter().chain(&["--json"]).copied().collect();
    let o: serde_json::Value = serde_json::from_str(ok(&args).trim()).expect("one JSON object");
    assert_eq!(o["batch"], 3, "{o}");
    let (agg, per) = (
        o["decode_tps"].as_f64().unwrap(),
        o["decode_tps_per_seq"].as_f64().unwrap(),
    );
    assert!(agg > 0.0 && (agg - 3.0 * per).abs() <= 1e-9 * agg, "{o}");
    let mut zero = base;
    zero[base.len() - 1] = "0";
    assert!(fails(&zero).contains("--batch must be at least 1"));
    let args: Vec<&str> = base.iter().chain(&["--lookup", "2"]).copied().collect();
    let err = fails(&args);
    assert!(err.contains("--batch") && err.contains("--lookup"), "{err}");
}

/// Issue 29: progress is drawn while a model loads when stderr is a
/// terminal (a pseudo-terminal from Python's `pty` module, `TERM` set as a
/// terminal sets it), and none of it reaches a pipe, where only the
/// `[load]` line is written.
#[test]
fn load_progress_is_drawn_on_a_terminal_only() {
    let m = real_model(SMOLLM2_135M);
    let m = m.to_str().unwrap();
    let args = ["run", "--model", m, "--prompt", "Hi", "--max-tokens", "1"];
    let piped = onebit(&args);
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(piped.status.success(), "{stderr}");
    let loads: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("[load] "))
        .collect();
    assert!(loads.len() == 1 && loads[0].contains(" in "), "{stderr}");
    assert!(!stderr.contains(['\r', '\x1b']), "{stderr:?}");
    let script = r#"
import os, pty, subprocess, sys
master, slave = pty.openpty()
p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave,
                     env=dict(os.environ, TERM="xterm-256color"))
os.close(slave)
out = b""
while True:
    try:
        b = os.read(master, 65536)
    except OSError:
        break
    if not b:
        break
    out += b
sys.stdout.write(out.decode("utf-8", "replace"))
sys.exit(p.wait())
"#;
    let tty = Command::new("python3")
        .args(["-c", script, env!("CARGO_BIN_EXE_onebit")])
        .args(args)
        .output()
        .expect("python3 runs");
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{shown}");
    // A spinner frame (indicatif's: braille dots) beside the file's name
    // while the file opens, a bar of the prepared weight bytes, then the
    // plain line (with the whole path) once the load is done.
    let name = std::path::Path::new(m)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let frames = "⠁⠂⠄⡀⢀⠠⠐⠈";
    let spun = shown.split(['\r', '\n']).any(|l| {
        frames
            .chars()
            .any(|f| l.contains(&format!("[load] {f} {name}")))
    });
    assert!(spun, "{shown:?}");
    assert!(
        shown.contains(&format!("[load] {name} preparing weights [")) && shown.contains(" MiB/"),
        "no bar of the prepared bytes on a terminal: {shown:?}"
    );
    assert!(shown.contains(&format!("[load] {m} in ")), "{shown:?}");
}
