//! Speculative decoding from the command line: `run --ids` on a fixture
//! without a vocabulary, `--lookup` and `--draft` giving the plain output,
//! a draft model with another vocabulary refused naming the first differing
//! token, and `bench --prompt-text` reporting the drafting counts.

use std::process::{Command, Output};

use onebit_testdata::{fixture, real_model, Fixture, GEMMA3_270M, SMOLLM2_135M};

fn onebit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(args)
        .output()
        .expect("onebit runs")
}

fn ok(args: &[&str]) -> (String, String) {
    let out = onebit(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "onebit {args:?} failed: {stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

#[test]
fn run_ids_with_lookup_and_a_draft_model_print_the_plain_ids() {
    for family in ["llama", "qwen35"] {
        let fx = Fixture::new(family);
        let target = fixture(family).join("f32.gguf");
        let draft = fixture(family).join(format!("{}.gguf", fx.quant()));
        let ids: Vec<String> = fx.tokens("tokens")[..12]
            .iter()
            .map(u32::to_string)
            .collect();
        let ids = ids.join(",");
        let base = [
            "run",
            "--model",
            target.to_str().unwrap(),
            "--ids",
            &ids,
            "--max-tokens",
            "20",
        ];
        let (plain, _) = ok(&base);
        let parsed: Vec<u32> = serde_json::from_str(plain.trim()).expect("a JSON array of ids");
        assert_eq!(parsed.len(), 20, "{family}: {plain}");
        for extra in [
            &["--lookup", "2"][..],
            &["--draft", draft.to_str().unwrap(), "--draft-max", "3"][..],
        ] {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            let (out, err) = ok(&args);
            assert_eq!(out, plain, "{family} {extra:?}");
            assert!(err.contains("[spec] "), "{family} {extra:?}: {err}");
        }
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused_by_its_first_differing_token() {
    let t = real_model(SMOLLM2_135M);
    let d = real_model(GEMMA3_270M);
    let out = onebit(&[
        "run",
        "--model",
        t.to_str().unwrap(),
        "--draft",
        d.to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && out.status.code() != Some(101),
        "{err}"
    );
    // Id 0 is SmolLM2's <|endoftext|> and Gemma 3's <pad>.
    assert!(
        err.contains(
            "has another vocabulary than the target: token 0 is \"<|endoftext|>\" in the target and \"<pad>\" in the draft"
        ),
        "{err}"
    );
}

#[test]
fn smollm2_repeat_task_with_lookup_gives_the_plain_text_and_bench_reports_drafting() {
    let m = real_model(SMOLLM2_135M);
    let m = m.to_str().unwrap();
    let prompt = "Repeat the following text exactly: The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.\nThe quick brown fox";
    let base = [
        "run",
        "--model",
        m,
        "--threads",
        "2",
        "--prompt",
        prompt,
        "--max-tokens",
        "16",
    ];
    let (plain, _) = ok(&base);
    let args: Vec<&str> = base.iter().chain(&["--lookup", "3"]).copied().collect();
    let (spec, err) = ok(&args);
    assert_eq!(spec, plain);
    assert!(err.contains("accepted"), "{err}");
    let (table, _) = ok(&[
        "bench",
        "--model",
        m,
        "--threads",
        "2",
        "--prompt-text",
        prompt,
        "--gen-tokens",
        "8",
        "--repetitions",
        "1",
        "--lookup",
        "3",
    ]);
    assert!(table.contains("drafting: "), "{table}");
    assert!(table.contains("tokens per verify step"), "{table}");
}
