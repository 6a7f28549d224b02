//! Packs made by the importer, read back: exact repacking of Q4_1 tensors on
//! SmolLM2 (in quarter tiles, as `--tiles auto` writes a 576-wide model),
//! every converter family's fixture end to end against its GGUF, the same
//! weights from every tile form, and the refusals a pack reader owes (mixed
//! tile kinds in either Q4 form, a chunk size that is no form).

mod common;

use common::{import_err, import_pack, logits, min_cos, rewrite, rounded_q4_1, top1_agreement};
use onebit_formats::gguf::Gguf;
use onebit_formats::q4nx::{self, Q4Shape, TileForm};
use onebit_formats::safetensors::SafeTensors;
use onebit_formats::{blocks, GgmlType};
use onebit_model::load;
use onebit_model::pack::{self, import, names, Pack};
use onebit_testdata::{real_model, Fixture, TempDir, SMOLLM2_135M};

fn import_as(gguf: &std::path::Path, dir: &std::path::Path, tiles: import::Tiles) {
    let opts = import::ImportOptions {
        keep_q8: false,
        tiles,
    };
    import_pack(gguf, dir, opts);
}

fn import_to(gguf: &std::path::Path, dir: &std::path::Path) {
    import_as(gguf, dir, import::Tiles::Auto)
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
    import_to(&path, tmp.path());
    let g = Gguf::open(&path).unwrap();
    let pack = Pack::open(tmp.path()).unwrap();
    let st = SafeTensors::open(tmp.path().join("model.q4nx")).unwrap();
    let rows = names::table(onebit_model::families::by_arch("llama").unwrap()).unwrap();
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
        // The tiles themselves, decoded by the tile reader: quarter tiles
        // [N/16, Kp/128, 1280], hidden size 576 being off the 256 grid.
        let stored = st.tensor(&names::to_pack(&rows, &t.name).unwrap()).unwrap();
        let s = Q4Shape::of(TileForm::Quarter, n, k).unwrap();
        assert_eq!(stored.shape, s.stored_shape(), "{}", t.name);
        assert_eq!(stored.shape[2], 1280, "{}", t.name);
        let (_, vals) = q4nx::decode_tensor(&st.bytes(stored), s).unwrap();
        let mut ref_vals = vec![0f32; n * k];
        blocks::dequantize(GgmlType::Q4_1, &want, &mut ref_vals).unwrap();
        assert!(vals == ref_vals, "{}: decoded tiles differ", t.name);
        checked += 1;
    }
    assert!(checked >= 200, "only {checked} Q4_1 tensors");
    // Every repack was exact: no bf16 scale needed rounding to f16.
    assert!(pack.tensors.iter().all(|t| t.inexact_scales == 0));
}

/// The per-pair RoPE divisors a spec applies: read from the container's
/// tensor, or the proportional form the forward builds (compared against
/// the GGUF's `rope_freqs`, which llama.cpp's converter wrote).
fn factors(path: &std::path::Path, r: &onebit_model::semantics::RopeSpec) -> Option<Vec<f32>> {
    if let Some(name) = &r.freq_factors {
        let t = load::open(path)
            .unwrap()
            .container
            .tensors()
            .tensor(name)
            .unwrap();
        let mut v = vec![0f32; r.n_rot / 2];
        blocks::dequantize(t.dtype, &t.bytes, &mut v).unwrap();
        return Some(v);
    }
    r.proportional
        .map(|p| onebit_model::semantics::proportional_factors(r.n_rot / 2, p))
}

/// Every converter family's f32 fixture, imported (weights become BF16) and
/// run: names, layouts and quirks (llama's un-permuted q/k with halves RoPE,
/// gemma3's pre-scaled embedding, lfm2's conv taps) give the GGUF's logits
/// up to bf16 rounding; the pack's semantics restate the GGUF's.
#[test]
fn fixtures_of_every_converter_family_import_and_match_their_gguf() {
    let importable = onebit_model::families::FAMILIES
        .iter()
        .filter(|f| f.import.is_some())
        .map(|f| f.arch);
    let fixtures: Vec<Fixture> = importable.clone().flat_map(Fixture::all_of).collect();
    // Every converter family has a fixture; gemma4 has two configurations.
    assert!(
        fixtures.len() > importable.count(),
        "fixtures: {:?}",
        fixtures
            .iter()
            .map(|f| f.dir.display().to_string())
            .collect::<Vec<_>>()
    );
    for fx in fixtures {
        let fam = fx.dir.file_name().unwrap().to_string_lossy().into_owned();
        let gguf = fx.dir.join("f32.gguf");
        let tmp = TempDir::new(&format!("pack-fx-{fam}"));
        let arch = fx.meta["arch"].as_str().expect("meta.json names the arch");
        let family = onebit_model::families::by_arch(arch).unwrap();
        if onebit_model::pack::own_layout(family).is_some() {
            // A family whose pack layout is its own module's (gpt-oss:
            // MXFP4 experts only, so not from an f32 GGUF): its own tests
            // (tests/pack_gpt_oss.rs).
            continue;
        }
        let laid_out = onebit_model::pack::layout::of(family).is_some();
        if load::open(&gguf).unwrap().sem.moe.is_some() && !laid_out {
            // Packs with experts are refused by name (gemma4-moe), except
            // for a family whose MoE pack layout is declared (qwen35moe,
            // tests/pack_moe.rs).
            let g = Gguf::open(&gguf).unwrap();
            let opts = import::ImportOptions {
                keep_q8: false,
                tiles: import::Tiles::Auto,
            };
            let e = import::import(&g, opts, &mut |_, _, _| {})
                .err()
                .unwrap_or_else(|| panic!("{fam}: a pack with experts was written"))
                .to_string();
            assert!(
                e.contains("expert_count") && e.contains("mixture-of-experts"),
                "{fam}: {e}"
            );
            continue;
        }
        import_to(&gguf, tmp.path());
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
            assert_eq!(
                factors(&gguf, &a.value),
                factors(tmp.path(), &b.value),
                "{fam}"
            );
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
        let agree = top1_agreement(&a, &b, nv);
        let cos = min_cos(&a, &b, nv);
        eprintln!("{fam}: top-1 agreement {agree}, min cosine {cos}");
        assert!(
            cos > 0.999 && agree >= 0.95,
            "{fam}: agreement {agree}, min cos {cos}"
        );
    }
}

/// Gemma 4's per-layer projection reads the per-layer width (32 in the
/// fixture), not the hidden size (64). Tiles do not state a matrix's input
/// width: a quantized pack (Q4 quarter tiles, and Q8 tiles) gets it from the
/// rows of the layer's per-layer gate. With Q8 tiles (values kept up to
/// bf16 scales) the pack's logits follow the GGUF's.
#[test]
fn gemma4_quantized_pack_takes_the_per_layer_projection_width_from_its_gate() {
    let fx = Fixture::new("gemma4");
    let gguf = fx.dir.join("Q8_0.gguf");
    let g = Gguf::open(&gguf).unwrap();
    let n_layer = g.u64("gemma4.block_count").unwrap() as usize;
    let width = g.u64("gemma4.embedding_length_per_layer_input").unwrap();
    for keep_q8 in [false, true] {
        let tmp = TempDir::new("pack-g4q");
        let opts = import::ImportOptions {
            keep_q8,
            tiles: import::Tiles::Auto,
        };
        import_pack(&gguf, tmp.path(), opts);
        let pack = Pack::open(tmp.path()).unwrap();
        // The per-layer token table is read by row like the embedding: BF16,
        // not tiles.
        let table = pack.by_gguf("per_layer_token_embd.weight").unwrap();
        assert_eq!(table.form, pack::Form::Plain("BF16"));
        for i in 0..n_layer {
            let name = format!("blk.{i}.proj.weight");
            let t = pack.by_gguf(&name).unwrap();
            assert_eq!(t.raw.dims, vec![width, 64], "{name} (keep_q8 {keep_q8})");
            assert_eq!(t.raw.dims, g.tensor(&name).unwrap().dims, "{name}");
        }
        if keep_q8 {
            let ids = fx.tokens("tokens");
            let (a, b) = (logits(&gguf, &ids), logits(tmp.path(), &ids));
            let cos = min_cos(&a, &b, fx.n_vocab());
            eprintln!("gemma4 Q8 tiles: min cosine {cos}");
            assert!(cos > 0.995, "min cos {cos}");
        }
    }
}

/// A Gemma 4 pack stores no `rope_freqs`: the importer restates it as
/// proportional RoPE, which only divisors of 1 then 1e30 are. Any other
/// table (a model whose full layers scale their angles) is refused by the
/// tensor's name, not written as something else.
#[test]
fn gemma4_import_refuses_rope_divisors_it_cannot_restate() {
    use onebit_formats::gguf::writer::GgufWriter;
    let g = Gguf::open(Fixture::new("gemma4").dir.join("f32.gguf")).unwrap();
    let pairs = g.tensor("rope_freqs.weight").unwrap().dims[0] as usize;
    let mut w = GgufWriter::from_gguf(&g);
    let odd: Vec<f32> = (0..pairs).map(|i| 1.0 + i as f32).collect();
    w.set_tensor(
        "rope_freqs.weight",
        &[pairs as u64],
        GgmlType::F32,
        odd.iter().flat_map(|v| v.to_le_bytes()).collect(),
    );
    let tmp = TempDir::new("pack-g4-freqs");
    let path = tmp.file("v.gguf", &w.to_bytes());
    let e = import_err(&path, import::ImportOptions::default());
    assert!(
        e.contains("rope_freqs.weight") && e.contains("proportional"),
        "{e}"
    );
}

/// A Gemma 4 GGUF whose full layers (with their own KV) have no `attn_v`
/// takes V from K there (llama.cpp); its pack states that as HF's
/// `attention_k_eq_v` (with `num_global_key_value_heads`), reads back to
/// the same rules and runs as the GGUF does (up to bf16 weights). V from
/// K on one full layer only is no HF config: the import is refused by name.
#[test]
fn gemma4_v_from_k_imports_as_attention_k_eq_v_or_is_refused() {
    use onebit_formats::gguf::writer::GgufWriter;
    let fx = Fixture::new("gemma4");
    let g = Gguf::open(fx.dir.join("f32.gguf")).unwrap();
    let tmp = TempDir::new("pack-g4-keqv");
    let edited = |drop: &[&str]| {
        let mut w = GgufWriter::from_gguf(&g);
        for t in drop {
            w.remove_tensor(t);
        }
        tmp.file(&format!("v{}.gguf", drop.len()), &w.to_bytes())
    };
    // SSFSFSF, layers 5 and 6 share: the full layers with their own KV are 2 and 4.
    let both = edited(&["blk.2.attn_v.weight", "blk.4.attn_v.weight"]);
    let dir = tmp.path().join("pack");
    import_to(&both, &dir);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["attention_k_eq_v"], true, "{config}");
    assert_eq!(config["num_global_key_value_heads"], 2, "{config}");
    let (gs, ps) = (
        load::open(&both).unwrap().sem,
        load::open(&dir).unwrap().sem,
    );
    assert_eq!(
        gs.v_from_k.value,
        [false, false, true, false, true, false, false]
    );
    assert_eq!(gs.v_from_k.value, ps.v_from_k.value);
    let ids = fx.tokens("tokens");
    let (a, b) = (logits(&both, &ids), logits(&dir, &ids));
    let cos = min_cos(&a, &b, fx.n_vocab());
    assert!(cos > 0.999, "min cosine {cos}");

    let one = edited(&["blk.2.attn_v.weight"]);
    let e = import_err(&one, import::ImportOptions::default());
    assert!(
        e.contains("cannot state this GGUF's attention") && e.contains("layers [2]"),
        "{e}"
    );
}

/// A quantized fixture whose matrices are Q4_0 (qwen3) is repacked exactly
/// as symmetric tiles and reads back as Q4_0 blocks.
#[test]
fn q4_0_fixture_repacks_as_symmetric_tiles() {
    let fx = Fixture::new("qwen3");
    let gguf = fx.dir.join("Q4_0.gguf");
    let tmp = TempDir::new("pack-q4_0");
    import_to(&gguf, tmp.path());
    let pack = Pack::open(tmp.path()).unwrap();
    let census = pack.census().join("\n");
    assert!(
        census.contains("I8 Q4 quarter tiles (16 x 128), symmetric"),
        "{census}"
    );
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

/// A symmetric tensor with one tile given a non-zero minimum is refused by
/// name, in full tiles and in quarter tiles alike.
#[test]
fn a_mixed_kind_tensor_is_refused_by_name_in_either_q4_form() {
    let fx = Fixture::new("qwen3");
    let name = "model.layers.1.mlp.up_proj.weight";
    for (form, mins_at) in [(TileForm::Full, 512), (TileForm::Quarter, 128)] {
        let tmp = TempDir::new("pack-mixed");
        import_as(
            &fx.dir.join("Q4_0.gguf"),
            tmp.path(),
            import::Tiles::Force(form),
        );
        let tb = form.bytes();
        rewrite(tmp.path(), name, |t| {
            assert_eq!(*t.shape.last().unwrap(), tb as u64);
            let n = t.data.len();
            t.data[n - tb + mins_at] = 0x80;
            t.data[n - tb + mins_at + 1] = 0x3f;
        });
        let e = Pack::open(tmp.path())
            .err()
            .expect("mixed refused")
            .to_string();
        assert!(
            e.contains(name) && e.contains("both tile kinds"),
            "{form:?}: {e}"
        );
    }
}

/// Rows of a width that is no tile form are refused naming the tensor and
/// the width; so is a 3-D quarter-tile shape that does not fit the matrix.
#[test]
fn a_chunk_size_that_is_no_form_is_refused_by_name() {
    let fx = Fixture::new("qwen3");
    let name = "model.layers.1.mlp.up_proj.weight";
    for w in [1024u64, 2560, 4266] {
        let tmp = TempDir::new("pack-width");
        import_to(&fx.dir.join("Q4_0.gguf"), tmp.path());
        rewrite(tmp.path(), name, |t| {
            let len = t.data.len() as u64 / w * w;
            t.data.truncate(len as usize);
            t.shape = vec![len / w, w];
        });
        let e = Pack::open(tmp.path()).err().expect("refused").to_string();
        assert!(
            e.contains(name) && e.contains(&format!("rows of {w} bytes are not a tile form")),
            "{w}: {e}"
        );
    }
    // [N/16, Kp/128, 1280] with the two leading dims swapped.
    let tmp = TempDir::new("pack-shape");
    import_to(&fx.dir.join("Q4_0.gguf"), tmp.path());
    rewrite(tmp.path(), name, |t| t.shape.swap(0, 1));
    let e = Pack::open(tmp.path()).err().expect("refused").to_string();
    assert!(e.contains(name) && e.contains("Kp/128"), "{e}");
}

/// One GGUF imported in every tile form: the packs read back to the same
/// kernel blocks, byte for byte (exact repacks of Q4_0; re-quantization of
/// Q5_1 to lfm2's Q4_0 and of Q4_K/Q6_K to llama's Q4_1 per 32-column group,
/// which no form changes). The chunk holds Q4_0 only: the Q4_1 model is
/// compared in the two other forms, and qwen3's re-quantized (Q4_1)
/// matrices come out of the chunk pack as Q4_0.
#[test]
fn every_tile_form_of_a_pack_reads_back_to_the_same_weights() {
    use TileForm::*;
    for (fam, file, forms) in [
        ("qwen3", "Q4_0.gguf", vec![Full, Quarter, Chunk4608]),
        ("lfm2", "Q5_1.gguf", vec![Full, Quarter, Chunk4608]),
        ("llama", "Q4_K_M.gguf", vec![Full, Quarter]),
    ] {
        let fx = Fixture::new(fam);
        let packs: Vec<(TileForm, TempDir)> = forms
            .iter()
            .map(|&f| {
                let tmp = TempDir::new("pack-forms");
                import_as(&fx.dir.join(file), tmp.path(), import::Tiles::Force(f));
                (f, tmp)
            })
            .collect();
        let base = Pack::open(packs[0].1.path()).unwrap();
        for (form, dir) in &packs[1..] {
            let p = Pack::open(dir.path()).unwrap();
            let mut q4 = 0;
            for t in &base.tensors {
                let u = p.by_gguf(&t.gguf_name).unwrap();
                if *form == Chunk4608 && t.raw.dtype == GgmlType::Q4_1 {
                    // Re-quantized to Q4_0, the one kind the chunk holds.
                    assert_eq!(u.raw.dtype, GgmlType::Q4_0, "{fam} {}", t.gguf_name);
                    continue;
                }
                assert_eq!(u.raw.dtype, t.raw.dtype, "{fam} {form:?} {}", t.gguf_name);
                assert_eq!(u.raw.dims, t.raw.dims, "{fam} {form:?} {}", t.gguf_name);
                assert!(
                    u.raw.bytes[..] == t.raw.bytes[..],
                    "{fam} {form:?} {}: weights differ from the full-tile pack's",
                    t.gguf_name
                );
                if let pack::Form::Q4(f, _) = u.form {
                    assert_eq!(f, *form, "{fam} {}", t.gguf_name);
                    q4 += 1;
                }
            }
            assert!(q4 >= 10, "{fam} {form:?}: {q4} Q4 tensors");
        }
    }
}

/// `verify` on gemma3's fixture in quarter tiles (tied: lm_head is written
/// from the embedding): the tie holds and every row is finite. A copy with
/// one matrix's quarter tiles declared as full tiles fails on that matrix's
/// rows; a copy with lm_head's tile rows reversed fails the tie test.
#[test]
fn verify_names_a_matrix_read_in_the_wrong_form_and_a_broken_tie() {
    use onebit_model::pack::verify;
    let fx = Fixture::new("gemma3");
    let gguf = fx.dir.join("Q5_0.gguf");
    let fresh = || {
        let tmp = TempDir::new("pack-verify");
        import_as(&gguf, tmp.path(), import::Tiles::Force(TileForm::Quarter));
        tmp
    };
    let tmp = fresh();
    let r = verify::verify(&Pack::open(tmp.path()).unwrap()).unwrap();
    let verify::Tie::Checked { correlation, .. } = r.tie else {
        panic!("the gemma3 fixture is tied");
    };
    assert!(correlation >= 0.99, "{correlation}");
    assert!(r.matrices.len() >= 7 * 7, "{}", r.matrices.len());
    assert!(r.failures().is_empty(), "{:?}", r.failures());

    let name = "model.layers.2.mlp.down_proj.weight";
    rewrite(tmp.path(), name, |t| {
        assert_eq!(t.shape, vec![256 / 16, 2, 1280]);
        t.shape = vec![256 / 32, 5120];
    });
    let r = verify::verify(&Pack::open(tmp.path()).unwrap()).unwrap();
    let f = r.failures();
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0].starts_with(name) && f[0].contains("non-finite"),
        "{f:?}"
    );

    let tmp = fresh();
    rewrite(tmp.path(), "lm_head.weight", |t| {
        let row = 2 * 1280; // one tile row: 16 rows of the matrix
        let rows: Vec<Vec<u8>> = t.data.chunks(row).rev().map(<[u8]>::to_vec).collect();
        t.data = rows.concat();
    });
    let r = verify::verify(&Pack::open(tmp.path()).unwrap()).unwrap();
    let f = r.failures();
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0].starts_with("lm_head.weight") && f[0].contains("correlation"),
        "{f:?}"
    );
}
