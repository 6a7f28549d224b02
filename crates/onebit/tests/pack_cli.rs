//! Packs through the command line: `onebit import` on the real models, the
//! written tokenizer.json against llama.cpp's ids, `onebit eval` of pack
//! against GGUF (default and --keep-q8), the Gemma 3 known answer, and
//! `onebit inspect`'s semantics lines and census.

use std::path::Path;
use std::process::Command;

use onebit_testdata::{real_model, token_refs, TempDir, GEMMA3_270M, SMOLLM2_135M};

fn ok(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(args)
        .output()
        .expect("onebit runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "onebit {args:?} failed: {stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

fn import(model: &Path, out: &Path, keep_q8: bool) -> String {
    let (m, o) = (model.to_str().unwrap(), out.to_str().unwrap());
    let mut args = vec!["import", "--model", m, "--out", o];
    if keep_q8 {
        args.push("--keep-q8");
    }
    ok(&args).1
}

fn eval_top1(model: &Path) -> f64 {
    let text = onebit_testdata::dir().join("eval/english.txt");
    let (out, _) = ok(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--text",
        text.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["predicted"].as_u64().unwrap() > 300, "{v}");
    v["top1"].as_f64().unwrap()
}

/// tokenizer.json as the `tokenizers` crate reads it, with the BOS facts of
/// tokenizer_config.json, gives llama.cpp's ids; so does `onebit tokenize`
/// on the pack.
fn check_tokenizer(pack: &Path, model_file: &str) {
    let tok = tokenizers::Tokenizer::from_file(pack.join("tokenizer.json")).unwrap();
    let tc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(pack.join("tokenizer_config.json")).unwrap())
            .unwrap();
    let bos = tc["bos_token"]
        .as_str()
        .and_then(|b| tok.token_to_id(b))
        .filter(|_| tc["add_bos_token"] == true);
    for (text, want) in token_refs(model_file) {
        let mut ids: Vec<u32> = bos.into_iter().collect();
        ids.extend(tok.encode(text.as_str(), false).unwrap().get_ids());
        assert_eq!(ids, want, "{model_file}: tokenizer.json on {text:?}");
        let (out, _) = ok(&[
            "tokenize",
            "--model",
            pack.to_str().unwrap(),
            "--text",
            &text,
        ]);
        let got: Vec<u32> = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(
            got, want,
            "{model_file}: onebit tokenize on the pack, {text:?}"
        );
    }
}

#[test]
fn real_models_import_to_packs_that_tokenize_and_answer_as_their_ggufs() {
    for (file, q8_note) in [(SMOLLM2_135M, "1 Q8_0"), (GEMMA3_270M, "10 Q8_0")] {
        let gguf = real_model(file);
        let tmp = TempDir::new("pack-cli");
        let pack = tmp.path().join("pack");
        let log = import(&gguf, &pack, false);
        assert!(
            log.contains(&format!("{q8_note} matrices re-quantized"))
                && log.contains("keeps only 4 bits"),
            "{log}"
        );
        check_tokenizer(&pack, file);

        let g = eval_top1(&gguf);
        let p = eval_top1(&pack);
        let pack8 = tmp.path().join("pack-q8");
        let log8 = import(&gguf, &pack8, true);
        assert!(log8.contains("kept as Q8 tiles"), "{log8}");
        let p8 = eval_top1(&pack8);
        eprintln!(
            "{file}: top-1 GGUF {:.2} %, pack {:.2} %, pack --keep-q8 {:.2} %",
            100.0 * g,
            100.0 * p,
            100.0 * p8
        );
        assert!((g - p).abs() <= 0.02, "{file}: pack {p} vs GGUF {g}");
        assert!(
            (g - p8).abs() <= 0.02,
            "{file}: --keep-q8 pack {p8} vs GGUF {g}"
        );

        let (out, _) = ok(&["inspect", "--model", pack8.to_str().unwrap()]);
        for want in [
            "[semantics] rope full:",
            "<- config.json rope_theta",
            "[semantics] bos: id",
            "[tensors] BF16:",
            "[tensors] I8 Q4 tiles, asymmetric:",
            "[tensors] I8 Q8 tiles:",
        ] {
            assert!(out.contains(want), "{file}: inspect lacks {want:?}:\n{out}");
        }
        if file == GEMMA3_270M {
            let (out, _) = ok(&[
                "run",
                "--model",
                pack.to_str().unwrap(),
                "--prompt",
                "The capital of France is Paris. The capital of Germany is",
                "--max-tokens",
                "1",
            ]);
            assert_eq!(out, " Berlin");
            assert!(ok(&["inspect", "--model", pack.to_str().unwrap()])
                .0
                .contains("embedding stored pre-scaled"));
        }
    }
}
