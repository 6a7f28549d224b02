//! Packs made by the importer, read back: exact repacking of Q4_1 tensors on
//! SmolLM2, every converter family's fixture end to end against its GGUF, and
//! the refusals a pack reader owes (mixed tile kinds, quarter tiles).

use std::collections::BTreeMap;

use half::{bf16, f16};
use onebit_formats::gguf::Gguf;
use onebit_formats::q4nx::{self, Q4Shape};
use onebit_formats::safetensors::{self, SafeTensors, StDtype, StOut};
use onebit_formats::{blocks, GgmlType};
use onebit_model::load;
use onebit_model::pack::{import, names, Pack};
use onebit_model::{ExecConfig, Logits};
use onebit_testdata::{real_model, Fixture, TempDir, SMOLLM2_135M};

fn import_to(gguf: &std::path::Path, dir: &std::path::Path, keep_q8: bool) {
    let g = Gguf::open(gguf).unwrap();
    let imp = import::import(&g, import::ImportOptions { keep_q8 }, &mut |_, _, _| {}).unwrap();
    import::write(dir, &imp).unwrap();
}

/// GGUF Q4_1 blocks with d and m passed through bf16: what the format keeps.
fn rounded_q4_1(b: &[u8]) -> Vec<u8> {
    let mut b = b.to_vec();
    for blk in b.chunks_exact_mut(20) {
        for at in [0, 2] {
            let v = f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32();
            let r = f16::from_f32(bf16::from_f32(v).to_f32());
            blk[at..at + 2].copy_from_slice(&r.to_le_bytes());
        }
    }
    b
}

/// llama.cpp's q/k row permutation undone (HF row t*hd/2 + p <- GGUF row 2p + t).
fn unpermute(b: &[u8], row_bytes: usize, heads: usize) -> Vec<u8> {
    let rows = b.len() / row_bytes;
    let hd = rows / heads;
    let mut out = Vec::with_capacity(b.len());
    for h in 0..heads {
        for t in 0..2 {
            for p in 0..hd / 2 {
                let src = h * hd + 2 * p + t;
                out.extend_from_slice(&b[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    out
}

/// Every Q4_1 tensor of SmolLM2's GGUF, read back from its pack, equals the
/// GGUF's: codes identical, scales and minimums equal to the GGUF's rounded
/// to bf16 (compared as bytes of the repacked Q4_1 blocks, and as values
/// decoded from the tiles by the tile decoder), q/k rows un-permuted.
#[test]
fn smollm2_pack_decodes_to_exactly_the_gguf_q4_1_weights() {
    let path = real_model(SMOLLM2_135M);
    let tmp = TempDir::new("pack-smol");
    import_to(&path, tmp.path(), false);
    let g = Gguf::open(&path).unwrap();
    let pack = Pack::open(tmp.path()).unwrap();
    let st = SafeTensors::open(tmp.path().join("model.q4nx")).unwrap();
    let rows = names::table("llama").unwrap();
    let n_head = g.u64("llama.attention.head_count").unwrap() as usize;
    let n_kv = g.u64("llama.attention.head_count_kv").unwrap() as usize;
    let mut checked = 0;
    for t in g.tensors.iter().filter(|t| t.dtype == GgmlType::Q4_1) {
        let (k, n) = (t.dims[0] as usize, t.dims[1] as usize);
        let rb = GgmlType::Q4_1.row_bytes(k as u64).unwrap() as usize;
        let mut want = rounded_q4_1(&g.tensor_bytes(t));
        if t.name.ends_with("attn_q.weight") {
            want = unpermute(&want, rb, n_head);
        } else if t.name.ends_with("attn_k.weight") {
            want = unpermute(&want, rb, n_kv);
        }
        let got = pack.by_gguf(&t.name).unwrap();
        assert_eq!(got.raw.dtype, GgmlType::Q4_1, "{}", t.name);
        assert_eq!(got.raw.dims, t.dims, "{}", t.name);
        assert!(
            got.raw.bytes[..] == want[..],
            "{}: repacked blocks differ",
            t.name
        );
        // The tiles themselves, decoded by the tile reader.
        let stored = st.tensor(&names::to_pack(&rows, &t.name).unwrap()).unwrap();
        let (_, vals) =
            q4nx::decode_tensor(&st.bytes(stored), Q4Shape::new(n, k).unwrap()).unwrap();
        let mut ref_vals = vec![0f32; n * k];
        blocks::dequantize(GgmlType::Q4_1, &want, &mut ref_vals).unwrap();
        assert!(vals == ref_vals, "{}: decoded tiles differ", t.name);
        checked += 1;
    }
    assert!(checked >= 200, "only {checked} Q4_1 tensors");
    // Every repack was exact: no bf16 scale needed rounding to f16.
    assert!(pack.tensors.iter().all(|t| t.inexact_scales == 0));
}

fn logits(path: &std::path::Path, ids: &[u32]) -> Vec<f32> {
    let exec = ExecConfig {
        threads: 1,
        ..Default::default()
    };
    let (m, _) = load::load(path, &exec).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut st = m.new_state();
    m.forward(&mut st, ids, Logits::All).unwrap()
}

fn min_cos(a: &[f32], b: &[f32], nv: usize) -> f32 {
    a.chunks(nv)
        .zip(b.chunks(nv))
        .map(|(x, y)| {
            let d: f32 = x.iter().zip(y).map(|(p, q)| p * q).sum();
            let n = |v: &[f32]| v.iter().map(|p| p * p).sum::<f32>().sqrt();
            d / n(x) / n(y)
        })
        .fold(1.0, f32::min)
}

/// Every converter family's f32 fixture, imported (weights become BF16) and
/// run: names, layouts and quirks (llama's un-permuted q/k with halves RoPE,
/// gemma3's pre-scaled embedding, lfm2's conv taps) give the GGUF's logits
/// up to bf16 rounding; the pack's semantics restate the GGUF's.
#[test]
fn fixtures_of_every_converter_family_import_and_match_their_gguf() {
    for fam in ["llama", "qwen2", "qwen3", "gemma3", "lfm2"] {
        let fx = Fixture::new(fam);
        let gguf = fx.dir.join("f32.gguf");
        let tmp = TempDir::new(&format!("pack-fx-{fam}"));
        import_to(&gguf, tmp.path(), false);
        let gs = load::open(&gguf).unwrap().sem;
        let ps = load::open(tmp.path()).unwrap().sem;
        assert_eq!(gs.dims, ps.dims, "{fam}");
        assert_eq!(gs.layer_kinds.value, ps.layer_kinds.value, "{fam}");
        assert_eq!(gs.sliding_window.value, ps.sliding_window.value, "{fam}");
        for (a, b) in [
            (&gs.rope_full, &ps.rope_full),
            (&gs.rope_sliding, &ps.rope_sliding),
        ] {
            assert_eq!(a.value.base, b.value.base, "{fam}");
            assert_eq!(a.value.scaling, b.value.scaling, "{fam}");
            assert_eq!(a.value.n_rot, b.value.n_rot, "{fam}");
            assert_eq!(a.value.freq_factors, b.value.freq_factors, "{fam}");
        }
        assert_eq!(gs.attn_scale.value, ps.attn_scale.value, "{fam}");
        assert_eq!(gs.qk_norm.value, ps.qk_norm.value, "{fam}");
        assert_eq!(gs.norm_eps.value, ps.norm_eps.value, "{fam}");
        assert_eq!(
            gs.short_conv.map(|s| s.value),
            ps.short_conv.map(|s| s.value),
            "{fam}"
        );

        let ids = fx.tokens("tokens");
        let nv = fx.n_vocab();
        let (a, b) = (logits(&gguf, &ids), logits(tmp.path(), &ids));
        let agree = a
            .chunks(nv)
            .zip(b.chunks(nv))
            .filter(|(x, y)| onebit_testdata::argmax(x) == onebit_testdata::argmax(y))
            .count() as f32
            / ids.len() as f32;
        let cos = min_cos(&a, &b, nv);
        eprintln!("{fam}: top-1 agreement {agree}, min cosine {cos}");
        assert!(
            cos > 0.999 && agree >= 0.95,
            "{fam}: agreement {agree}, min cos {cos}"
        );
    }
}

/// A quantized fixture whose matrices are Q4_0 (qwen3) is repacked exactly
/// as symmetric tiles and reads back as Q4_0 blocks.
#[test]
fn q4_0_fixture_repacks_as_symmetric_tiles() {
    let fx = Fixture::new("qwen3");
    let gguf = fx.dir.join("Q4_0.gguf");
    let tmp = TempDir::new("pack-q4_0");
    import_to(&gguf, tmp.path(), false);
    let pack = Pack::open(tmp.path()).unwrap();
    let census = pack.census().join("\n");
    assert!(census.contains("I8 Q4 tiles, symmetric"), "{census}");
    let g = Gguf::open(&gguf).unwrap();
    let t = g.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(t.dtype, GgmlType::Q4_0);
    let got = pack.by_gguf("blk.0.ffn_down.weight").unwrap();
    assert_eq!(got.raw.dtype, GgmlType::Q4_0);
    let mut a = vec![0f32; t.n_elements() as usize];
    let mut b = a.clone();
    blocks::dequantize(GgmlType::Q4_0, &g.tensor_bytes(t), &mut a).unwrap();
    blocks::dequantize(GgmlType::Q4_0, &got.raw.bytes, &mut b).unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x - y).abs() <= x.abs() / 256.0,
            "{x} vs {y} beyond bf16 scale rounding"
        );
    }
}

/// Rewrites one tensor of a pack (name, dtype, shape, bytes).
fn rewrite(dir: &std::path::Path, name: &str, f: impl Fn(&mut StOut)) {
    let p = dir.join("model.q4nx");
    let st = SafeTensors::open(&p).unwrap();
    let mut out: Vec<StOut> = st
        .tensors
        .iter()
        .map(|t| StOut {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            data: st.bytes(t).to_vec(),
        })
        .collect();
    drop(st);
    f(out.iter_mut().find(|t| t.name == name).unwrap());
    safetensors::write(&p, &out, &BTreeMap::new()).unwrap();
}

#[test]
fn a_mixed_kind_tensor_or_a_quarter_tile_is_refused_by_name() {
    let fx = Fixture::new("qwen3");
    let tmp = TempDir::new("pack-mixed");
    import_to(&fx.dir.join("Q4_0.gguf"), tmp.path(), false);
    let name = "model.layers.1.mlp.up_proj.weight";
    // Symmetric tensor; give its last tile non-zero minimums.
    rewrite(tmp.path(), name, |t| {
        let n = t.data.len();
        t.data[n - 5120 + 512] = 0x80;
        t.data[n - 5120 + 513] = 0x3f;
    });
    let e = Pack::open(tmp.path())
        .err()
        .expect("mixed refused")
        .to_string();
    assert!(e.contains(name) && e.contains("both tile kinds"), "{e}");

    let tmp = TempDir::new("pack-quarter");
    import_to(&fx.dir.join("Q4_0.gguf"), tmp.path(), false);
    rewrite(tmp.path(), name, |t| {
        t.shape = vec![t.data.len() as u64 / 1280, 1280];
        t.dtype = StDtype::I8;
    });
    let e = Pack::open(tmp.path())
        .err()
        .expect("quarter refused")
        .to_string();
    assert!(e.contains(name) && e.contains("quarter tile"), "{e}");
}
