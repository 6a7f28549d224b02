//! Packs through the command line: `onebit import` on the real models, the
//! written tokenizer.json against llama.cpp's ids, `onebit eval` of pack
//! against GGUF (default and --keep-q8), the Gemma 3 known answer, and
//! `onebit inspect`'s semantics lines and census. Both models' hidden sizes
//! (576, 640) are off the 256 grid, so `--tiles auto` writes quarter tiles;
//! Gemma 3 is also imported with `--tiles full` (the same top-1), checked by
//! `inspect --verify` (the tie test), and a copy with one tensor's quarter
//! tiles declared as full tiles is named by it. The gpt-oss fixture's pack
//! goes through `import` and `inspect --verify` (its layout's checks).

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

fn import(model: &Path, out: &Path, extra: &[&str]) -> String {
    let (m, o) = (model.to_str().unwrap(), out.to_str().unwrap());
    let mut args = vec!["import", "--model", m, "--out", o];
    args.extend(extra);
    ok(&args).1
}

/// A copy of `pack` whose tensor `name`, stored as quarter tiles
/// [N/16, Kp/128, 1280], is declared as [N*Kp/8192, 5120] full tiles: the
/// same bytes, read in the wrong form.
fn copy_with_wrong_form(pack: &Path, to: &Path, name: &str) {
    use std::io::{Read, Write};
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(pack).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "model.q4nx" {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    let mut f = std::fs::File::open(pack.join("model.q4nx")).unwrap();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).unwrap();
    let mut header = vec![0u8; u64::from_le_bytes(len) as usize];
    f.read_exact(&mut header).unwrap();
    let mut h: serde_json::Value = serde_json::from_slice(&header).unwrap();
    let shape: Vec<u64> = serde_json::from_value(h[name]["shape"].clone()).unwrap();
    assert_eq!(shape[2], 1280, "{name} is not in quarter tiles: {shape:?}");
    assert_eq!(shape[1] % 2, 0, "{name}: K must be on the 256 grid too");
    h[name]["shape"] = serde_json::json!([shape[0] * shape[1] / 4, 5120]);
    let mut header = serde_json::to_vec(&h).unwrap();
    header.resize(header.len().div_ceil(8) * 8, b' ');
    let mut out = std::fs::File::create(to.join("model.q4nx")).unwrap();
    out.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    out.write_all(&header).unwrap();
    std::io::copy(&mut f, &mut out).unwrap();
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
        let log = import(&gguf, &pack, &[]);
        assert!(
            log.contains(&format!("{q8_note} matrices re-quantized"))
                && log.contains("keeps only 4 bits"),
            "{log}"
        );
        assert!(
            log.contains("quarter tile (16 x 128, 1,280 bytes) for every Q4 matrix")
                && log.contains("off the 256-column grid"),
            "{log}"
        );
        check_tokenizer(&pack, file);

        let g = eval_top1(&gguf);
        let p = eval_top1(&pack);
        let pack8 = tmp.path().join("pack-q8");
        let log8 = import(&gguf, &pack8, &["--keep-q8"]);
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
            "[tensors] I8 Q4 quarter tiles (16 x 128), asymmetric:",
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
            gemma_tile_forms(&gguf, &pack, p, &tmp);
        }
    }
}

/// Gemma 3's quarter-tile pack (`pack`, top-1 `quarter_top1`) against the
/// same GGUF in full tiles, and `inspect --verify` on it and on a copy with
/// one tensor read in the wrong form.
fn gemma_tile_forms(gguf: &Path, pack: &Path, quarter_top1: f64, tmp: &TempDir) {
    let full = tmp.path().join("pack-full");
    let log = import(gguf, &full, &["--tiles", "full"]);
    assert!(log.contains("full tile (32 x 256, 5,120 bytes)"), "{log}");
    let (out, _) = ok(&["inspect", "--model", full.to_str().unwrap()]);
    assert!(out.contains("[tensors] I8 Q4 tiles, asymmetric:"), "{out}");
    assert!(!out.contains("quarter"), "{out}");
    let f = eval_top1(&full);
    eprintln!(
        "gemma 3 270m: top-1 quarter tiles {:.2} %, full tiles {:.2} %",
        100.0 * quarter_top1,
        100.0 * f
    );
    assert!(
        (quarter_top1 - f).abs() <= 0.01,
        "quarter {quarter_top1} vs full {f}"
    );

    let (out, _) = ok(&["inspect", "--model", pack.to_str().unwrap(), "--verify"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("[verify] tie: lm_head.weight vs model.embed_tokens.weight"))
        .unwrap_or_else(|| panic!("no tie line:\n{out}"));
    let corr: f64 = line
        .split("correlation ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    eprintln!("{line}");
    assert!(corr >= 0.99, "{line}");
    assert!(out.contains("[verify] ok: 127 matrices"), "{out}");

    let name = "model.layers.3.mlp.down_proj.weight";
    let wrong = tmp.path().join("pack-wrong-form");
    copy_with_wrong_form(pack, &wrong, name);
    let o = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(["inspect", "--model", wrong.to_str().unwrap(), "--verify"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    let last = stderr.lines().last().unwrap_or("");
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        last.starts_with("error: ") && last.contains(name) && last.contains("fails verification"),
        "{last}"
    );
}

/// The gpt-oss fixture through the command line: `import` says what it
/// re-quantized, `inspect --verify` prints the layout's checks (the biases
/// kept in the expert tiles, the laid-out bytes, the router copy) and
/// passes; a pack with one kept bias changed fails, naming the tensor.
#[test]
fn gpt_oss_fixture_imports_and_verifies_through_the_cli() {
    let fx = onebit_testdata::Fixture::new("gpt-oss");
    let tmp = TempDir::new("pack-cli-oss");
    let pack = tmp.path().join("pack");
    let log = import(&fx.dir.join("MXFP4_MOE.gguf"), &pack, &[]);
    assert!(log.contains("Q8_0 matrices re-quantized to Q4_1"), "{log}");
    let p = pack.to_str().unwrap();
    let (out, _) = ok(&["inspect", "--model", p, "--verify"]);
    for want in [
        "U8 MXFP4 tiles (32 x 128, 2,560 bytes): 12 tensors",
        "I8 Q4 half tiles (32 x 128), asymmetric: 17 tensors",
        "[verify] layout: expert biases kept in the MXFP4 tiles",
        "[verify] layout: router:",
        "the layout's checks pass",
    ] {
        assert!(out.contains(want), "no `{want}` in:\n{out}");
    }
    // One bias byte of layer 0's first expert tile changed.
    let q4nx = pack.join("model.q4nx");
    let st = onebit_formats::safetensors::SafeTensors::open(&q4nx).unwrap();
    let name = "model.layers.0.ffn_gate_up_down_exps.weight";
    let at = st.tensor(name).unwrap().start + 128;
    drop(st);
    let mut b = std::fs::read(&q4nx).unwrap();
    b[at] ^= 0x01;
    std::fs::write(&q4nx, b).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(["inspect", "--model", p, "--verify"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a changed bias passed verify");
    assert!(err.contains(name) && err.contains("expert biases"), "{err}");
}

/// The gemma3-vision fixture with its mmproj through the command line:
/// `import --mmproj` writes the tower as FastFlowLM's converter does
/// (vision_weights.q4nx, preprocessor_config.json, config.json in HF's
/// multimodal form), `inspect --verify` checks it, and `run --image` on the
/// pack, with no --mmproj, gives llama.cpp's mtmd first token for the
/// fixture's prompt (the argmax of llamacpp.logits.bin's last row; the
/// pack's weights are BF16, llama.cpp's F32, and the token is the same).
#[test]
fn a_vision_fixture_imports_with_its_mmproj_and_its_pack_sees_images() {
    let fx = onebit_testdata::fixture("gemma3-vision");
    let tmp = TempDir::new("pack-cli-vision");
    let pack = tmp.path().join("pack");
    let mmproj = fx.join("mmproj.gguf");
    let log = import(
        &fx.join("text.gguf"),
        &pack,
        &["--mmproj", mmproj.to_str().unwrap()],
    );
    assert!(log.contains("vision: gemma3 tower laid out as"), "{log}");
    for f in [
        "model.q4nx",
        "vision_weights.q4nx",
        "preprocessor_config.json",
        "config.json",
        "tokenizer.json",
    ] {
        assert!(pack.join(f).is_file(), "{f} not written");
    }
    let p = pack.to_str().unwrap();
    let (out, _) = ok(&["inspect", "--model", p, "--verify"]);
    for want in [
        "[file] vision_weights.q4nx: the gemma3 vision tower, 39 tensors",
        "[semantics] vision pooling: average 4 x 4  <- config.json mm_tokens_per_image 16",
        "[verify] layout: vision_weights.q4nx: the gemma3 tower",
        "every stored byte re-made from the tensors read (padding zero):",
        "the layout's checks pass",
    ] {
        assert!(out.contains(want), "no `{want}` in:\n{out}");
    }
    let png = tmp.path().join("image.png");
    let made = Command::new("python3")
        .args([
            "-c",
            "import sys; from PIL import Image; Image.frombytes('RGB', (32, 32), open(sys.argv[1], 'rb').read()).save(sys.argv[2])",
        ])
        .arg(fx.join("image.rgb"))
        .arg(&png)
        .status()
        .expect("python3 runs");
    assert!(
        made.success(),
        "Pillow writes the PNG (scripts/python-deps.sh)"
    );
    let (out, err) = ok(&[
        "run",
        "--max-tokens",
        "1",
        "--model",
        p,
        "--image",
        png.to_str().unwrap(),
        "--prompt",
        "hi<__media__>what is this ok",
    ]);
    let logits = onebit_testdata::read_f32(fx.join("llamacpp.logits.bin"));
    let n_vocab = 384; // meta.json text_hparams.n_vocab
    let first = onebit_testdata::argmax(&logits[logits.len() - n_vocab..]) as u32;
    let g = onebit_formats::gguf::Gguf::open(fx.join("text.gguf")).unwrap();
    let want = onebit_text::Tokenizer::from_gguf(&g)
        .unwrap()
        .decode(&[first], false)
        .unwrap();
    assert_eq!(out.trim(), want.trim(), "{err}");
    assert!(
        err.contains("[semantics] vision image size: 32  <- config.json vision_config.image_size")
            && err.contains("[stats] images 1, encoded in"),
        "{err}"
    );
}
