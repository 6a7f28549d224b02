//! Our forward against llama.cpp's logits on the random-weight fixtures
//! (testdata/llamacpp/<family>/, tolerances from its README):
//!
//! - f32 weights: max |diff| <= 1e-4 * M against `f32.logits.bin` (gemma3: 2e-5 * M
//!   against the float64 exact-GELU reference, since llama.cpp's GELU goes
//!   through an fp16 table);
//! - quantized weights with f32 activations (`Precision::Float`) against
//!   `<Q>.dequant.logits.bin` (llama.cpp on the ggml-dequantized weights): same
//!   bound (gemma3 5e-4 * M, the GELU table again). This checks block decoding;
//! - quantized weights with quantized activations against `<Q>.logits.bin`:
//!   cosine >= 0.998 at every position, max |diff| <= 0.05 * M, same argmax
//!   wherever the reference margin is >= 0.5.
//!
//! With an f16 KV cache, against llama.cpp's run with its default f16 KV
//! (`*.kvf16.logits.bin`): the quantized tolerances above, for f32 and
//! quantized weights alike (f16 rounding of K and V moves a logit by up to
//! 1e-3 * M in llama.cpp itself).
//!
//! And batched prefill equals one token at a time, bit for bit, for every
//! KV type.

use onebit_kernels::kv::KvType;
use onebit_kernels::Precision;
use onebit_model::semantics::LayerKind;
use onebit_model::{load, ExecConfig, Logits};
use onebit_testdata::{compare, Fixture};

fn run(
    fx: &Fixture,
    file: &str,
    precision: Precision,
    tokens: &[u32],
    sequential: bool,
    kv_type: KvType,
) -> Vec<f32> {
    // llama.cpp ran the fixtures with a 128-token context (phi3's LongRoPE
    // picks its factor table by context size).
    let exec = ExecConfig {
        threads: 2,
        precision,
        max_context: 128,
        kv_type,
    };
    let (model, _) =
        load::load(&fx.dir.join(file), &exec).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut st = model.new_state();
    if sequential {
        tokens
            .iter()
            .flat_map(|&t| model.forward(&mut st, &[t], Logits::Last).unwrap())
            .collect()
    } else {
        model.forward(&mut st, tokens, Logits::All).unwrap()
    }
}

/// Float paths: element-wise bound relative to M.
fn check_close(
    family: &str,
    tokens_key: &str,
    file: &str,
    precision: Precision,
    reference: &str,
    run_name: &str,
    rel: f32,
) {
    let fx = Fixture::new(family);
    let toks = fx.tokens(tokens_key);
    let ours = run(&fx, file, precision, &toks, false, KvType::F32);
    let m = fx.max_abs_logit(run_name);
    let c = compare(
        &ours,
        &fx.logits(reference),
        fx.n_vocab(),
        &fx.top1_margin(run_name),
    );
    eprintln!(
        "{family} {file} {tokens_key} {precision:?} vs {reference}: max|diff| {:.3e} = {:.2e} M, min cosine {:.7}",
        c.max_abs_diff,
        c.max_abs_diff / m,
        c.min_cosine
    );
    assert!(
        c.max_abs_diff <= rel * m,
        "{family}: max |diff| {} exceeds {rel} * M = {}",
        c.max_abs_diff,
        rel * m
    );
}

/// Quantized-activation path: per-position cosine, loose max, and argmax where clear.
fn check_quantized(family: &str, tokens_key: &str) {
    let q = Fixture::new(family).quant();
    check_within_quantized_tolerances(family, &q, tokens_key, KvType::F32);
}

/// `weights` (f32 or the quantized file) against llama.cpp's run with the
/// same KV type (F32: `<w>.logits.bin`, F16: `<w>.kvf16.logits.bin`), at
/// the quantized tolerances.
fn check_within_quantized_tolerances(family: &str, q: &str, tokens_key: &str, kv: KvType) {
    let fx = Fixture::new(family);
    let toks = fx.tokens(tokens_key);
    let suffix = if tokens_key == "tokens" {
        String::new()
    } else {
        format!(".{tokens_key}")
    };
    let run_name = format!("{q}{suffix}");
    let ours = run(
        &fx,
        &format!("{q}.gguf"),
        Precision::Quantized,
        &toks,
        false,
        kv,
    );
    let m = fx.max_abs_logit(&run_name);
    let reference = match kv {
        KvType::F32 => format!("{q}{suffix}.logits.bin"),
        KvType::F16 => format!("{q}{suffix}.kvf16.logits.bin"),
        KvType::Q8_0 => unreachable!("llama.cpp made no q8_0-KV fixture"),
    };
    let c = compare(
        &ours,
        &fx.logits(&reference),
        fx.n_vocab(),
        &fx.top1_margin(&run_name),
    );
    eprintln!(
        "{family} {q} {tokens_key} {kv} KV vs {reference}: max|diff| {:.3e} = {:.2e} M, min cosine {:.6}, argmax flips {:?}",
        c.max_abs_diff,
        c.max_abs_diff / m,
        c.min_cosine,
        c.argmax_flips
    );
    assert!(
        c.min_cosine >= 0.998,
        "{family}: min cosine {}",
        c.min_cosine
    );
    assert!(
        c.max_abs_diff <= 0.05 * m,
        "{family}: max |diff| {} > 0.05 M",
        c.max_abs_diff
    );
    for (t, margin) in &c.argmax_flips {
        assert!(
            *margin < 0.5,
            "{family}: argmax differs at position {t} where the reference margin is {margin}"
        );
    }
}

fn check_batch_equals_sequential(family: &str, file: &str, precision: Precision, tokens_key: &str) {
    check_batch_equals_sequential_kv(family, file, precision, tokens_key, KvType::F32);
}

fn check_batch_equals_sequential_kv(
    family: &str,
    file: &str,
    precision: Precision,
    tokens_key: &str,
    kv: KvType,
) {
    let fx = Fixture::new(family);
    let toks = fx.tokens(tokens_key);
    let batch = run(&fx, file, precision, &toks, false, kv);
    let seq = run(&fx, file, precision, &toks, true, kv);
    assert_eq!(
        batch.len(),
        seq.len(),
        "{family} {file} {kv} KV: batched and sequential runs gave different numbers of logits"
    );
    let same = batch
        .iter()
        .zip(&seq)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(
        same,
        "{family} {file} {kv} KV: batched and sequential logits differ"
    );
}

/// Every registered family: each has a fixture under testdata/llamacpp/
/// named by its GGUF architecture.
fn registry() -> Vec<&'static str> {
    onebit_model::families::FAMILIES
        .iter()
        .map(|f| f.arch)
        .collect()
}

/// Every registered family has a spec in the fixture generator
/// (`scripts/gen-fixtures.py`'s `FAMILIES` table, one row per fixture with
/// `arch="<GGUF architecture>"`), so its fixture can be regenerated.
#[test]
fn every_registered_family_has_a_generator_spec() {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gen-fixtures.py");
    let text =
        std::fs::read_to_string(&script).unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    let missing: Vec<&str> = registry()
        .into_iter()
        .filter(|arch| !text.contains(&format!("arch=\"{arch}\", seed=")))
        .collect();
    assert!(
        missing.is_empty(),
        "registered families without a FAMILIES row in {}: {missing:?}",
        script.display()
    );
}

/// Families whose f32 logits have their own tests below instead of the
/// every-family bound: gemma3 and gemma4 (llama.cpp's fp16 GELU table).
const OWN_F32_TESTS: &[&str] = &["gemma3", "gemma4"];

/// The families the every-family tests run: every registered family (those
/// of `OWN_F32_TESTS` only when `with_own`), or those the comma-separated
/// `ONEBIT_GOLDEN_FAMILIES` names (`scripts/test-arm.sh` runs two under
/// qemu). A name that is not a registered family is refused.
fn families(with_own: bool) -> Vec<&'static str> {
    let registered = registry();
    let mut all = registered.clone();
    if !with_own {
        all.retain(|f| !OWN_F32_TESTS.contains(f));
    }
    let Ok(list) = std::env::var("ONEBIT_GOLDEN_FAMILIES") else {
        return all;
    };
    let want: Vec<&str> = list.split(',').map(str::trim).collect();
    for w in &want {
        assert!(
            registered.contains(w),
            "ONEBIT_GOLDEN_FAMILIES names `{w}`, which is not a registered family ({registered:?})"
        );
    }
    all.retain(|f| want.contains(f));
    eprintln!("ONEBIT_GOLDEN_FAMILIES: running {all:?}");
    all
}

#[test]
fn f32_weights_match_llamacpp_in_every_family() {
    for family in families(false) {
        check_close(
            family,
            "tokens",
            "f32.gguf",
            Precision::Quantized,
            "f32.logits.bin",
            "f32",
            1e-4,
        );
    }
}

#[test]
fn dequantized_weights_match_llamacpp_in_every_family() {
    for family in families(false) {
        let q = Fixture::new(family).quant();
        check_close(
            family,
            "tokens",
            &format!("{q}.gguf"),
            Precision::Float,
            &format!("{q}.dequant.logits.bin"),
            &q,
            1e-4,
        );
    }
}

#[test]
fn quantized_activations_match_llamacpp_in_every_family() {
    for family in families(false) {
        check_quantized(family, "tokens");
    }
}

#[test]
fn gemma3_f32_matches_exact_gelu_reference() {
    for key in ["tokens", "tokens2"] {
        let (reference, run_name) = if key == "tokens" {
            ("f32.exact_gelu.logits.bin", "f32")
        } else {
            ("f32.tokens2.exact_gelu.logits.bin", "f32.tokens2")
        };
        check_close(
            "gemma3",
            key,
            "f32.gguf",
            Precision::Quantized,
            reference,
            run_name,
            2e-5,
        );
    }
}

#[test]
fn gemma3_f32_matches_llamacpp_within_its_gelu_table() {
    check_close(
        "gemma3",
        "tokens",
        "f32.gguf",
        Precision::Quantized,
        "f32.logits.bin",
        "f32",
        5e-4,
    );
    check_close(
        "gemma3",
        "tokens2",
        "f32.gguf",
        Precision::Quantized,
        "f32.tokens2.logits.bin",
        "f32.tokens2",
        5e-4,
    );
}

#[test]
fn gemma3_q5_0_dequantized_matches_llamacpp() {
    check_close(
        "gemma3",
        "tokens",
        "Q5_0.gguf",
        Precision::Float,
        "Q5_0.dequant.logits.bin",
        "Q5_0",
        5e-4,
    );
    check_close(
        "gemma3",
        "tokens2",
        "Q5_0.gguf",
        Precision::Float,
        "Q5_0.tokens2.dequant.logits.bin",
        "Q5_0.tokens2",
        5e-4,
    );
}

#[test]
fn gemma3_q5_0_quantized_matches_llamacpp() {
    check_quantized("gemma3", "tokens");
    check_quantized("gemma3", "tokens2");
}

#[test]
fn batched_prefill_equals_sequential_in_every_family() {
    let families = families(true);
    for family in &families {
        let q = Fixture::new(family).quant();
        check_batch_equals_sequential(family, "f32.gguf", Precision::Quantized, "tokens");
        check_batch_equals_sequential(family, &format!("{q}.gguf"), Precision::Quantized, "tokens");
        check_batch_equals_sequential(family, &format!("{q}.gguf"), Precision::Float, "tokens");
    }
    if families.contains(&"gemma3") {
        check_batch_equals_sequential("gemma3", "Q5_0.gguf", Precision::Quantized, "tokens2");
    }
}

#[test]
fn f16_kv_matches_llamacpp_f16_kv_in_every_family() {
    for family in registry() {
        let q = Fixture::new(family).quant();
        check_within_quantized_tolerances(family, "f32", "tokens", KvType::F16);
        check_within_quantized_tolerances(family, &q, "tokens", KvType::F16);
    }
    check_within_quantized_tolerances("gemma3", "f32", "tokens2", KvType::F16);
}

#[test]
fn batched_prefill_equals_sequential_for_every_kv_type() {
    for family in registry() {
        let fx = Fixture::new(family);
        let q = fx.quant();
        let file = format!("{q}.gguf");
        let sem = load::open(&fx.dir.join(&file)).unwrap().sem;
        let (d, (sk, sv)) = (&sem.dims, sem.head_dims(LayerKind::Sliding));
        for kv in [KvType::F16, KvType::Q8_0] {
            if [d.head_dim_k, d.head_dim_v, sk, sv]
                .iter()
                .any(|&h| kv.check_head_dim(h).is_err())
            {
                // Refused at load, by name (checked in refusals.rs).
                continue;
            }
            check_batch_equals_sequential_kv(family, &file, Precision::Quantized, "tokens", kv);
        }
    }
}

/// Gemma 4's fixtures: `gemma4` (per-layer embeddings), `gemma4-nople`
/// (none), `gemma4-moe` (expert layers: the dense MLP beside 8 routed
/// experts, top 2) and `gemma4-a4b` (26B-A4B's attention on the expert
/// layers: 2 KV heads on sliding layers, 1 on full ones, whose V is their
/// K projection); all with shared-KV layers and a sequence longer than
/// the sliding window. Bound 1e-3 * M (testdata/llamacpp/README.md):
/// llama.cpp's GELU goes through an fp16 table, in the FFN gates and in
/// the per-layer branch; we compute it in f32 (seen: 4.8e-4 M).
const GEMMA4: &[&str] = &["gemma4", "gemma4-nople", "gemma4-moe", "gemma4-a4b"];

#[test]
fn gemma4_f32_and_dequantized_match_llamacpp_within_its_gelu_table() {
    for fx in GEMMA4 {
        check_close(
            fx,
            "tokens",
            "f32.gguf",
            Precision::Quantized,
            "f32.logits.bin",
            "f32",
            1e-3,
        );
        check_close(
            fx,
            "tokens",
            "Q8_0.gguf",
            Precision::Float,
            "Q8_0.dequant.logits.bin",
            "Q8_0",
            1e-3,
        );
    }
}

#[test]
fn gemma4_quantized_and_f16_kv_match_llamacpp() {
    for fx in GEMMA4 {
        check_quantized(fx, "tokens");
        check_within_quantized_tolerances(fx, "f32", "tokens", KvType::F16);
        check_within_quantized_tolerances(fx, "Q8_0", "tokens", KvType::F16);
    }
}

/// Ours on an edited copy of a fixture's f32 GGUF, against the fixture's
/// `f32.logits.bin`, within `rel` * M: for edits after which llama.cpp
/// gives that file byte for byte (each checked with its driver when the
/// test was written).
fn check_edited_f32(
    family: &str,
    what: &str,
    rel: f32,
    edit: impl Fn(&mut onebit_formats::gguf::writer::GgufWriter),
) {
    use onebit_formats::gguf::{writer::GgufWriter, Gguf};
    let fx = Fixture::new(family);
    let g = Gguf::open(fx.dir.join("f32.gguf")).unwrap();
    let mut w = GgufWriter::from_gguf(&g);
    edit(&mut w);
    let dir = onebit_testdata::TempDir::new("golden-edited");
    let path = dir.file("f32.gguf", &w.to_bytes());
    let exec = ExecConfig {
        threads: 2,
        precision: Precision::Quantized,
        max_context: 128,
        kv_type: KvType::F32,
    };
    let (model, _) = load::load(&path, &exec).unwrap();
    let mut st = model.new_state();
    let ours = model
        .forward(&mut st, &fx.tokens("tokens"), Logits::All)
        .unwrap();
    let m = fx.max_abs_logit("f32");
    let c = compare(
        &ours,
        &fx.logits("f32.logits.bin"),
        fx.n_vocab(),
        &fx.top1_margin("f32"),
    );
    eprintln!(
        "{family} {what} vs f32.logits.bin: max|diff| {:.2e} M",
        c.max_abs_diff / m
    );
    assert!(
        c.max_abs_diff <= rel * m,
        "{family} {what}: max |diff| {} exceeds {rel} * M",
        c.max_abs_diff
    );
}

/// llama.cpp's gemma4 soft-caps the logits at 30 when a GGUF does not
/// state `final_logit_softcapping` (its hparams default, which gemma4.cpp
/// keeps, unlike gemma3.cpp): the gemma4 fixture states 30, so without the
/// key llama.cpp gives the same logits. A stated 0 is llama.cpp's "none":
/// gemma3's fixture states no cap, and with 0 stated llama.cpp gives the
/// same logits.
#[test]
fn a_soft_cap_not_stated_or_stated_as_0_runs_as_llamacpp_runs_it() {
    check_edited_f32("gemma4", "without final_logit_softcapping", 1e-3, |w| {
        w.remove_kv("gemma4.final_logit_softcapping");
    });
    check_edited_f32("gemma3", "with final_logit_softcapping 0", 5e-4, |w| {
        w.set_kv(
            "gemma3.final_logit_softcapping",
            onebit_formats::gguf::Value::F32(0.0),
        );
    });
}

/// A gemma4 variant's batched prefill equals one token at a time: f32
/// weights, Q8_0 weights with quantized and float activations, and Q8_0
/// with an F16 cache.
fn check_gemma4_batch_equals_sequential(family: &str) {
    check_batch_equals_sequential(family, "f32.gguf", Precision::Quantized, "tokens");
    check_batch_equals_sequential(family, "Q8_0.gguf", Precision::Quantized, "tokens");
    check_batch_equals_sequential(family, "Q8_0.gguf", Precision::Float, "tokens");
    check_batch_equals_sequential_kv(
        family,
        "Q8_0.gguf",
        Precision::Quantized,
        "tokens",
        KvType::F16,
    );
}

#[test]
fn gemma4_with_experts_batched_equals_sequential() {
    check_gemma4_batch_equals_sequential("gemma4-moe");
}

#[test]
fn gemma4_a4b_batched_equals_sequential() {
    // (A Q8_0 cache is refused on heads of 16: refusals.rs.)
    check_gemma4_batch_equals_sequential("gemma4-a4b");
}

#[test]
fn gemma4_without_per_layer_embeddings_batched_equals_sequential() {
    check_gemma4_batch_equals_sequential("gemma4-nople");
}

/// qwen3moe as people download it (`qwen3moe-q5k`: llama-quantize Q5_K_M,
/// so every expert's gate and up are Q5_K, attn_output and token_embd
/// Q5_K too): f32 and the dequantized weights within 1e-4 * M, quantized
/// activations within the quantized tolerances, and batched prefill (the
/// wide Q5_K kernels from 16 tokens on) equal to one token at a time (the
/// one-token kernels), bit for bit.
#[test]
fn qwen3moe_q5_k_m_matches_llamacpp_and_batched_equals_sequential() {
    let fam = "qwen3moe-q5k";
    let fx = Fixture::new(fam);
    let q = fx.quant();
    assert_eq!(q, "Q5_K_M");
    let tensors = fx.meta["files"][format!("{q}.gguf")]["tensors"]
        .as_array()
        .expect("meta.json lists the quantized file's tensors");
    let type_of = |name: &str| {
        tensors
            .iter()
            .find(|t| t["name"] == name)
            .and_then(|t| t["type"].as_str())
            .unwrap_or_else(|| panic!("{fam}: no tensor {name} in meta.json"))
            .to_string()
    };
    for l in 0..2 {
        for m in ["gate", "up"] {
            assert_eq!(type_of(&format!("blk.{l}.ffn_{m}_exps.weight")), "Q5_K");
        }
    }
    check_close(
        fam,
        "tokens",
        "f32.gguf",
        Precision::Quantized,
        "f32.logits.bin",
        "f32",
        1e-4,
    );
    check_close(
        fam,
        "tokens",
        &format!("{q}.gguf"),
        Precision::Float,
        &format!("{q}.dequant.logits.bin"),
        &q,
        1e-4,
    );
    check_quantized(fam, "tokens");
    check_batch_equals_sequential(fam, &format!("{q}.gguf"), Precision::Quantized, "tokens");
}
