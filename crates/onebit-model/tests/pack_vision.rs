//! FastFlowLM's vision packs (issue 30): an mmproj's tower written as
//! FastFlowLM's converter writes it (`vision_weights.q4nx`, config.json's
//! `vision_config`, preprocessor_config.json; the byte layout itself is
//! checked against the converter's index formulas in
//! `pack::vision::tests`), then read back into the same `VisionTower`.
//!
//! - The tower read back holds the mmproj's weights rounded to BF16 (the
//!   converter stores every vision tensor BF16): an F32 or F16 value that
//!   BF16 cannot hold moves to the nearest BF16 value (ties to even), a
//!   BF16 value stays, bit for bit.
//! - Its rules are the mmproj's (every `[semantics]` value), read from the
//!   pack's HF keys with their own sources.
//! - Its image embeddings equal, bit for bit, those of the mmproj with its
//!   weights rounded to BF16 the same way; against llama.cpp's mtmd on the
//!   unrounded mmproj they are within the BF16 rounding (measured below).
//! - A pack (text + tower) runs the gemma3-vision prompt with the image;
//!   `inspect --verify`'s checks pass, and fail naming the tensor when a
//!   stored byte (a value or a padding zero) is changed.
//! - Refusals name the file, tensor or key: another converter layout
//!   (Qwen2.5-VL's, Gemma 4's), an unknown tensor, a non-BF16 tensor, a
//!   block shape config.json's sizes do not make, a missing or unsupported
//!   key; on import, a quantized mmproj tensor, a projector the converter
//!   has no layout for, a text model of another width.

use std::path::{Path, PathBuf};

use half::bf16;
use onebit_formats::gguf::{writer::GgufWriter, Gguf, Value};
use onebit_formats::safetensors::{self, SafeTensors, StDtype, StOut};
use onebit_formats::{blocks, GgmlType};
use onebit_kernels::kv::KvType;
use onebit_kernels::{Pool, Precision};
use onebit_model::pack::{import as imp, vision as pv, Pack};
use onebit_model::vision::VisionTower;
use onebit_model::{load, ExecConfig, Logits};
use onebit_testdata::{read_f32, TempDir};
use serde_json::{json, Value as Json};

fn g3() -> PathBuf {
    onebit_testdata::fixture("gemma3-vision")
}

fn q3() -> PathBuf {
    onebit_testdata::fixture("qwen3vl-vision")
}

fn max_abs(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

fn floats(dtype: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    blocks::dequantize(dtype, bytes, &mut v).unwrap();
    v
}

/// The whole pack: gemma3-vision's text.gguf imported as a pack, its
/// `mmproj` (file name in the fixture) written beside it.
fn gemma3_pack(tmp: &TempDir, mmproj: &str) -> PathBuf {
    let dir = tmp.path().join("pack");
    let text = Gguf::open(g3().join("text.gguf")).unwrap();
    let mut t = imp::import(&text, imp::ImportOptions::default(), &mut |_, _, _| {}).unwrap();
    let v = pv::import(&Gguf::open(g3().join(mmproj)).unwrap(), &t.config).unwrap();
    t.config = v.config.clone();
    imp::write(&dir, &t).unwrap();
    pv::write(&dir, &v).unwrap();
    dir
}

/// qwen3vl-vision's tower alone (its text side is another step): the
/// vision file, config.json and preprocessor_config.json.
fn qwen3vl_pack(tmp: &TempDir) -> PathBuf {
    let dir = tmp.path().join("qpack");
    std::fs::create_dir_all(&dir).unwrap();
    let text = json!({"model_type": "qwen3_vl_text", "hidden_size": 64, "rms_norm_eps": 1e-6});
    let v = pv::import(&Gguf::open(q3().join("mmproj.gguf")).unwrap(), &text).unwrap();
    write_config(&dir, &v.config);
    pv::write(&dir, &v).unwrap();
    dir
}

fn write_config(dir: &Path, c: &Json) {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(c).unwrap(),
    )
    .unwrap();
}

fn read_config(dir: &Path) -> Json {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

/// The mmproj with every tensor rounded to BF16 (stored BF16), in memory.
fn rounded(path: &Path) -> Gguf {
    let g = Gguf::open(path).unwrap();
    let mut w = GgufWriter::from_gguf(&g);
    for t in &g.tensors {
        let v = floats(t.dtype, &g.tensor_bytes(t), t.n_elements() as usize);
        let b = v
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect();
        w.set_tensor(&t.name, &t.dims, GgmlType::BF16, b);
    }
    Gguf::from_bytes(path, &w.to_bytes()).unwrap()
}

/// An 8-bit RGB file as the encoder's input (CHW, normalized).
fn pixels(file: &Path, w: usize, h: usize, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let rgb = std::fs::read(file).unwrap();
    assert_eq!(rgb.len(), w * h * 3);
    let mut out = vec![0f32; 3 * w * h];
    for c in 0..3 {
        for i in 0..w * h {
            out[c * w * h + i] = (rgb[i * 3 + c] as f32 / 255.0 - mean[c]) / std[c];
        }
    }
    out
}

fn encode(t: &VisionTower, image: &Path, w: usize, h: usize) -> Vec<f32> {
    let p = t.preprocess();
    let px = pixels(image, w, h, p.mean, p.std);
    t.encode_sized(&Pool::new(2), &px, w as u32, h as u32)
        .unwrap()
        .rows
}

/// The rules without their sources.
fn values(t: &VisionTower) -> Vec<String> {
    t.lines()
        .iter()
        .map(|l| l.split("  <- ").next().unwrap().to_string())
        .collect()
}

/// Every mmproj tensor is read back under its name with its dims, its
/// values rounded to BF16; the count of values that moved and of all.
fn check_weights(mmproj: &Gguf, v: &pv::PackVision) -> (usize, usize) {
    let (mut moved, mut all) = (0, 0);
    let mut names = v.tensor_names();
    names.sort();
    let mut want: Vec<String> = mmproj.tensors.iter().map(|t| t.name.clone()).collect();
    want.sort();
    assert_eq!(names, want, "the pack holds the mmproj's tensors");
    for t in &mmproj.tensors {
        let n = t.n_elements() as usize;
        let src = floats(t.dtype, &mmproj.tensor_bytes(t), n);
        let back = v.tensor(&t.name).unwrap();
        assert_eq!(back.dims, t.dims, "{}", t.name);
        assert_eq!(back.dtype, GgmlType::BF16, "{}", t.name);
        let got = floats(back.dtype, &back.bytes, n);
        for (i, (x, y)) in src.iter().zip(&got).enumerate() {
            assert_eq!(
                y.to_bits(),
                bf16::from_f32(*x).to_f32().to_bits(),
                "{} value {i}",
                t.name
            );
            moved += (x != y) as usize;
        }
        all += n;
    }
    (moved, all)
}

#[test]
fn gemma3_tower_reads_back_the_mmprojs_weights_rounded_to_bf16() {
    let tmp = TempDir::new("pv-g3-weights");
    for (file, dtype_note) in [("mmproj.gguf", "F32"), ("mmproj-f16.gguf", "F16 + F32")] {
        let dir = gemma3_pack(&tmp, file);
        let v = pv::open(&dir).unwrap().unwrap();
        let g = Gguf::open(g3().join(file)).unwrap();
        let (moved, all) = check_weights(&g, &v);
        println!("{file} ({dtype_note}): {moved} of {all} values moved by BF16 rounding");
        // Random F32 values nearly all carry bits BF16 lacks.
        assert!(moved > all / 2, "{moved} of {all}");
        assert_eq!(
            values(&v.tower),
            values(&VisionTower::from_gguf(&g).unwrap())
        );
    }
    // A BF16 mmproj reads back bit for bit: nothing moves.
    let b = rounded(&g3().join("mmproj.gguf"));
    let bf = tmp.file("mmproj-bf16.gguf", &{
        let mut w = GgufWriter::from_gguf(&b);
        w.set_kv("general.file_type", Value::U32(32));
        w.to_bytes()
    });
    let text = json!({"hidden_size": 64});
    let iv = pv::import(&Gguf::open(&bf).unwrap(), &text).unwrap();
    let dir = tmp.path().join("bf16");
    std::fs::create_dir_all(&dir).unwrap();
    write_config(&dir, &iv.config);
    pv::write(&dir, &iv).unwrap();
    let v = pv::open(&dir).unwrap().unwrap();
    let (moved, _) = check_weights(&Gguf::open(&bf).unwrap(), &v);
    assert_eq!(moved, 0);
}

#[test]
fn gemma3_pack_embeddings_are_the_bf16_mmprojs_and_near_llamacpps() {
    let tmp = TempDir::new("pv-g3-embd");
    let dir = gemma3_pack(&tmp, "mmproj.gguf");
    let v = pv::open(&dir).unwrap().unwrap();
    let lines = v.tower.lines().join("\n");
    for want in [
        "config.json vision_config.image_size",
        "config.json vision_config.layer_norm_eps",
        "config.json mm_tokens_per_image 16: 16 x 16 patches pooled to 4 x 4",
        "preprocessor_config.json image_mean",
        "config.json vision_config.hidden_act \"gelu_pytorch_tanh\" (tanh GELU)",
        "vision_weights.q4nx (FastFlowLM's gemma3 vision layout) gemma3 uses RESIZE_ALGO_BILINEAR",
    ] {
        assert!(lines.contains(want), "{want} missing from:\n{lines}");
    }
    let image = g3().join("image.rgb");
    let ours = encode(&v.tower, &image, 32, 32);
    let same = VisionTower::from_gguf(&rounded(&g3().join("mmproj.gguf"))).unwrap();
    assert!(
        ours == encode(&same, &image, 32, 32),
        "the pack's embeddings are not those of the mmproj rounded to BF16"
    );
    let ll = read_f32(g3().join("llamacpp.embd.bin"));
    let (m, d) = (max_abs(&ll), max_diff(&ours, &ll));
    println!(
        "pack (BF16 weights) vs llama.cpp (F32 weights): max |diff| {d:e} (M {m}, {:.2e} x M)",
        d / m
    );
    assert!(d <= 1e-2 * m, "{d} > 1e-2 x {m}");
}

#[test]
fn qwen3vl_pack_tower_alone_is_the_bf16_mmprojs() {
    let tmp = TempDir::new("pv-q3");
    let dir = qwen3vl_pack(&tmp);
    let v = pv::open(&dir).unwrap().unwrap();
    let g = Gguf::open(q3().join("mmproj.gguf")).unwrap();
    let (moved, all) = check_weights(&g, &v);
    println!("qwen3vl: {moved} of {all} values moved by BF16 rounding");
    assert_eq!(
        values(&v.tower),
        values(&VisionTower::from_gguf(&g).unwrap())
    );
    let lines = v.tower.lines().join("\n");
    // The blocks the mmproj marks (`clip.vision.is_deepstack_layers`).
    let deep: Vec<usize> = g
        .array_opt("clip.vision.is_deepstack_layers")
        .unwrap()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, v)| v.as_bool() == Some(true))
        .map(|(i, _)| i)
        .collect();
    assert!(
        lines.contains(&format!("deepstack after blocks: {deep:?}")),
        "{lines}"
    );
    assert!(
        lines.contains("config.json vision_config.layer_norm_eps"),
        "{lines}"
    );
    // The image at its own size (meta.json), which mtmd's fit keeps.
    let meta: Json =
        serde_json::from_str(&std::fs::read_to_string(q3().join("meta.json")).unwrap()).unwrap();
    let (w, h) = (
        meta["image"]["width"].as_u64().unwrap() as usize,
        meta["image"]["height"].as_u64().unwrap() as usize,
    );
    assert_eq!(v.tower.fit(w as u32, h as u32), (w as u32, h as u32));
    let image = q3().join("image.rgb");
    let ours = encode(&v.tower, &image, w, h);
    let same = VisionTower::from_gguf(&rounded(&q3().join("mmproj.gguf"))).unwrap();
    assert!(ours == encode(&same, &image, w, h));
    let ll = read_f32(q3().join("llamacpp.embd.bin"));
    let (m, d) = (max_abs(&ll), max_diff(&ours, &ll));
    println!(
        "qwen3vl pack vs llama.cpp: max |diff| {d:e} (M {m}, {:.2e} x M)",
        d / m
    );
    assert!(d <= 1e-2 * m, "{d} > 1e-2 x {m}");
    // The deepstack blocks are read from the HF key; without it the
    // converter's table (5, 11, 17) applies, which this tower lacks.
    let mut c = read_config(&dir);
    c["vision_config"]
        .as_object_mut()
        .unwrap()
        .remove("deepstack_visual_indexes");
    write_config(&dir, &c);
    let e = pv::open(&dir).err().unwrap().to_string();
    assert!(
        e.contains("model.visual.deepstack_merger_list.0.norm.weight")
            && e.contains("block 5")
            && e.contains("[5, 11, 17]")
            && e.contains("configs/qwen3vl.json")
            && e.contains("3 blocks"),
        "{e}"
    );
}

#[test]
fn a_gemma3_pack_runs_with_its_own_tower_and_verifies() {
    let tmp = TempDir::new("pv-g3-run");
    let dir = gemma3_pack(&tmp, "mmproj.gguf");
    let pack = Pack::open(&dir).unwrap();
    assert_eq!(pack.family.arch, "gemma3");
    let r = onebit_model::pack::verify::verify(&pack).unwrap();
    assert!(r.failures().is_empty(), "{:?}", r.failures());
    let names: Vec<&str> = r.layout.iter().map(|c| c.what.as_str()).collect();
    assert!(
        names
            .iter()
            .any(|n| n.contains("every stored byte re-made")),
        "{names:?}"
    );
    let remade = r
        .layout
        .iter()
        .find(|c| c.what.contains("re-made"))
        .unwrap();
    assert_eq!(
        remade.values,
        std::fs::metadata(dir.join(pv::VISION_WEIGHTS))
            .unwrap()
            .len() as usize
            - header_len(&dir.join(pv::VISION_WEIGHTS))
    );

    // The text model with the pack's tower: the prompt's logits near
    // llama.cpp's (its F32 text model and tower; the pack's are BF16).
    let exec = ExecConfig {
        threads: 2,
        precision: Precision::Float,
        max_context: 128,
        kv_type: KvType::F32,
    };
    let model = load::load(&dir, &exec).unwrap().0;
    let v = pv::open(&dir).unwrap().unwrap();
    assert_eq!(v.tower.n_embd_out(), model.sem.dims.n_embd);
    let p = v.tower.preprocess();
    let px = pixels(&g3().join("image.rgb"), 32, 32, p.mean, p.std);
    let e = v.tower.encode(&px, 2).unwrap();
    let chunks: Json =
        serde_json::from_str(&std::fs::read_to_string(g3().join("llamacpp.chunks.json")).unwrap())
            .unwrap();
    let (mut ids, mut at, mut text) = (Vec::new(), 0, Vec::new());
    for c in chunks["chunks"].as_array().unwrap() {
        if c["type"] == "text" {
            for t in c["tokens"].as_array().unwrap() {
                text.push(ids.len());
                ids.push(t.as_u64().unwrap() as u32);
            }
        } else {
            at = ids.len();
            ids.extend(std::iter::repeat_n(
                0,
                c["n_tokens"].as_u64().unwrap() as usize,
            ));
        }
    }
    assert!(e.bidirectional);
    let mut st = model.new_state();
    let all = model
        .forward_embeds(&mut st, &ids, &[e.at(at)], Logits::All)
        .unwrap();
    let nv = model.sem.dims.n_vocab;
    let ours: Vec<f32> = text
        .iter()
        .flat_map(|&p| all[p * nv..(p + 1) * nv].to_vec())
        .collect();
    let reference = read_f32(g3().join("llamacpp.logits.bin"));
    let (m, d) = (max_abs(&reference), max_diff(&ours, &reference));
    println!(
        "pack logits vs llama.cpp: max |diff| {d:e} (M {m}, {:.2e} x M)",
        d / m
    );
    assert!(d <= 3e-2 * m, "{d} > 3e-2 x {m}");
    let last = |x: &[f32]| onebit_testdata::argmax(&x[x.len() - nv..]);
    assert_eq!(last(&ours), last(&reference), "the first generated token");
}

fn header_len(p: &Path) -> usize {
    let b = std::fs::read(p).unwrap();
    8 + u64::from_le_bytes(b[..8].try_into().unwrap()) as usize
}

/// The stored tensors of a vision file, edited and written back.
fn edit_file(dir: &Path, edit: impl FnOnce(&mut Vec<StOut>)) {
    let p = dir.join(pv::VISION_WEIGHTS);
    let st = SafeTensors::open(&p).unwrap();
    let mut ts: Vec<StOut> = st
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
    edit(&mut ts);
    safetensors::write(&p, &ts, &Default::default()).unwrap();
}

#[test]
fn verify_names_a_changed_value_and_a_changed_padding_byte() {
    let tmp = TempDir::new("pv-verify");
    let dir = gemma3_pack(&tmp, "mmproj.gguf");
    let q = "vision_tower.vision_model.encoder.layers.1.self_attn.q_proj.weight";
    // The last byte of q_proj's blocks is padding (32 x 32 in 256 x 256).
    edit_file(&dir, |ts| {
        let t = ts.iter_mut().find(|t| t.name == q).unwrap();
        *t.data.last_mut().unwrap() = 0x3f;
    });
    let f = onebit_model::pack::verify::verify(&Pack::open(&dir).unwrap())
        .unwrap()
        .failures()
        .join("; ");
    assert!(
        f.contains(q) && f.contains("byte 131071 is 0x3f") && f.contains("0x00"),
        "{f}"
    );
    // It still reads (the reader takes no padding), so the tower runs.
    assert!(pv::open(&dir).is_ok());
}

fn refused(dir: &Path) -> String {
    match pv::open(dir) {
        Ok(_) => panic!("{} was read", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn packs_of_other_layouts_and_broken_ones_are_refused_by_name() {
    let tmp = TempDir::new("pv-refuse");
    let base = qwen3vl_pack(&tmp);
    let fresh = |tag: &str| {
        let d = tmp.path().join(tag);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["config.json", pv::VISION_WEIGHTS, pv::PREPROCESSOR_CONFIG] {
            std::fs::copy(base.join(f), d.join(f)).unwrap();
        }
        d
    };
    let one = |name: &str, dtype: StDtype| StOut {
        name: name.into(),
        dtype,
        shape: vec![4],
        data: vec![0; 4 * dtype.size()],
    };
    // Qwen2.5-VL's and Gemma 4's layouts: towers onebit does not run.
    for (name, what) in [
        ("model.visual.merger.ln_q.weight", "Qwen2.5-VL"),
        ("model.vision.patch_embd.weight", "Gemma 4"),
    ] {
        let d = fresh(what);
        edit_file(&d, |ts| ts.push(one(name, StDtype::BF16)));
        let e = refused(&d);
        assert!(
            e.contains(name) && e.contains(what) && e.contains("does not run"),
            "{e}"
        );
    }
    // A tensor the layout does not name.
    let d = fresh("unknown");
    edit_file(&d, |ts| {
        ts.push(one(
            "model.visual.blocks.0.attn.q_norm.weight",
            StDtype::BF16,
        ))
    });
    let e = refused(&d);
    assert!(
        e.contains("model.visual.blocks.0.attn.q_norm.weight") && e.contains("has no row"),
        "{e}"
    );
    // A tensor not BF16.
    let d = fresh("f32");
    edit_file(&d, |ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "model.visual.merger.norm.bias")
            .unwrap();
        let v: Vec<f32> = t
            .data
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        t.dtype = StDtype::F32;
        t.data = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    });
    let e = refused(&d);
    assert!(
        e.contains("model.visual.merger.norm.bias") && e.contains("is F32"),
        "{e}"
    );
    // Blocks whose shape config.json's sizes do not make.
    let d = fresh("ff");
    let mut c = read_config(&d);
    c["vision_config"]["intermediate_size"] = json!(1024);
    write_config(&d, &c);
    let e = refused(&d);
    assert!(
        e.contains("mlp.linear_fc1.weight") && e.contains("1024 rows by 32 columns"),
        "{e}"
    );
    // A key the blocks need, absent.
    let d = fresh("nokey");
    let mut c = read_config(&d);
    c["vision_config"]
        .as_object_mut()
        .unwrap()
        .remove("hidden_size");
    write_config(&d, &c);
    let e = refused(&d);
    assert!(
        e.contains("`vision_config.hidden_size`") && e.contains("is required"),
        "{e}"
    );
    // An activation the tower does not run.
    let d = fresh("act");
    let mut c = read_config(&d);
    c["vision_config"]["hidden_act"] = json!("relu");
    write_config(&d, &c);
    let e = refused(&d);
    assert!(
        e.contains("`vision_config.hidden_act`") && e.contains("relu"),
        "{e}"
    );
    // A pack without preprocessor_config.json: the model's published mean
    // and std, with that source.
    let d = fresh("nopre");
    std::fs::remove_file(d.join(pv::PREPROCESSOR_CONFIG)).unwrap();
    let v = pv::open(&d).unwrap().unwrap();
    assert_eq!(v.tower.preprocess().mean, [0.5; 3]);
    let lines = v.tower.lines().join("\n");
    assert!(
        lines.contains("Qwen/Qwen3-VL-4B-Instruct preprocessor_config.json image_mean (the pack has no preprocessor_config.json)"),
        "{lines}"
    );
    // No vision file: no tower.
    assert!(pv::open(tmp.path()).unwrap().is_none());
}

#[test]
fn imports_refuse_what_the_converter_cannot_write_by_name() {
    let tmp = TempDir::new("pv-import-refuse");
    let g = Gguf::open(g3().join("mmproj.gguf")).unwrap();
    let text = json!({"hidden_size": 64});
    let with = |tag: &str, edit: &dyn Fn(&mut GgufWriter)| -> String {
        let mut w = GgufWriter::from_gguf(&g);
        edit(&mut w);
        let p = tmp.file(&format!("{tag}.gguf"), &w.to_bytes());
        match pv::import(&Gguf::open(&p).unwrap(), &text) {
            Ok(_) => panic!("{tag} was imported"),
            Err(e) => e.to_string(),
        }
    };
    // A quantized matrix.
    let e = with("q8", &|w| {
        // 32 x 32 as Q8_0: per 32 values an f16 scale 1.0 and 32 codes.
        let block: Vec<u8> = half::f16::from_f32(1.0)
            .to_le_bytes()
            .into_iter()
            .chain([1u8; 32])
            .collect();
        w.set_tensor(
            "v.blk.0.attn_q.weight",
            &[32, 32],
            GgmlType::Q8_0,
            block.repeat(32),
        );
    });
    assert!(
        e.contains("v.blk.0.attn_q.weight") && e.contains("Q8_0"),
        "{e}"
    );
    // A projector the converter has no layout for (here also one onebit runs not).
    let e = with("proj", &|w| {
        w.set_kv("clip.projector_type", Value::Str("gemma4v".into()));
    });
    assert!(
        e.contains("clip.projector_type") && e.contains("gemma4v"),
        "{e}"
    );
    // A tensor the converter's table does not name (SigLIP's optional pre-LN).
    let e = with("preln", &|w| {
        w.tensor_f32("v.pre_ln.weight", &[32], &[1.0; 32]);
        w.tensor_f32("v.pre_ln.bias", &[32], &[0.0; 32]);
    });
    assert!(
        e.contains("v.pre_ln.weight") && e.contains("has no name in"),
        "{e}"
    );
    // A text model of another width.
    let e = match pv::import(&g, &json!({"hidden_size": 96})) {
        Ok(_) => panic!("imported for a 96-wide text model"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("projects to 64") && e.contains("96"), "{e}");
}

#[test]
fn keys_a_pack_leaves_out_take_the_stated_defaults() {
    let tmp = TempDir::new("pv-defaults");
    let dir = gemma3_pack(&tmp, "mmproj.gguf");
    let mut c = read_config(&dir);
    let vc = c["vision_config"].as_object_mut().unwrap();
    vc.remove("layer_norm_eps");
    vc.remove("hidden_act");
    c.as_object_mut().unwrap().remove("mm_tokens_per_image");
    write_config(&dir, &c);
    // The pooling from preprocessor_config.json's image_seq_length, then
    // (without it) from transformers' default.
    let v = pv::open(&dir).unwrap().unwrap();
    assert!(v
        .tower
        .lines()
        .join("\n")
        .contains("average 4 x 4  <- preprocessor_config.json image_seq_length 16"));
    std::fs::remove_file(dir.join(pv::PREPROCESSOR_CONFIG)).unwrap();
    let v = pv::open(&dir).unwrap().unwrap();
    let lines = v.tower.lines().join("\n");
    for want in [
        "vision norm eps: 1e-6  <- transformers SiglipVisionConfig default layer_norm_eps 1e-6 (no vision_config.layer_norm_eps stated)",
        "vision mlp activation: GeluTanh  <- transformers SiglipVisionConfig default hidden_act gelu_pytorch_tanh",
        "vision pooling: average 1 x 1  <- transformers Gemma3Config default mm_tokens_per_image 256",
    ] {
        assert!(lines.contains(want), "{want} missing from:\n{lines}");
    }
    assert_eq!(v.tower.n_tokens(), 256);
    // 64 tokens from 16 x 16 patches: pooled 2 x 2.
    c["mm_tokens_per_image"] = json!(64);
    write_config(&dir, &c);
    let v = pv::open(&dir).unwrap().unwrap();
    assert_eq!(v.tower.n_tokens(), 64);
    assert!(v
        .tower
        .lines()
        .join("\n")
        .contains("average 2 x 2  <- config.json mm_tokens_per_image 64"));
    // 48 tokens pool no square grid.
    c["mm_tokens_per_image"] = json!(48);
    write_config(&dir, &c);
    let e = refused(&dir);
    assert!(
        e.contains("`mm_tokens_per_image`") && e.contains("48 tokens"),
        "{e}"
    );

    // qwen3vl: the LayerNorm eps from the text config's rms_norm_eps (as
    // llama.cpp's converter takes it), else 1e-6.
    let q = qwen3vl_pack(&tmp);
    let mut c = read_config(&q);
    c["vision_config"]
        .as_object_mut()
        .unwrap()
        .remove("layer_norm_eps");
    c["text_config"]["rms_norm_eps"] = json!(1e-5);
    write_config(&q, &c);
    let lines = pv::open(&q).unwrap().unwrap().tower.lines().join("\n");
    assert!(
        lines.contains("vision norm eps: 1e-5  <- config.json text_config.rms_norm_eps"),
        "{lines}"
    );
    c["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("rms_norm_eps");
    write_config(&q, &c);
    let lines = pv::open(&q).unwrap().unwrap().tower.lines().join("\n");
    assert!(
        lines.contains("vision norm eps: 1e-6  <- llama.cpp conversion/qwen3vl.py default"),
        "{lines}"
    );
}
