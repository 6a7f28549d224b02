//! Gemma 3's vision tower and image rows in the text forward, against
//! llama.cpp's mtmd on the random-weight fixture `testdata/llamacpp/gemma3-vision/`
//! (made by `scripts/gen-vision-fixtures.sh`; tolerances and their reasons in
//! its README, section "Vision towers"):
//!
//! - the image embeddings within 1e-6 x max |e| of an independent float64
//!   NumPy forward with exact tanh-GELU (`numpy.embd.bin`), and within 1e-3 x
//!   max |e| of llama.cpp's (`llamacpp.embd.bin`; ggml's GELU is an F16 table);
//! - the logits of every text position of the prompt holding the image,
//!   with llama.cpp's embeddings put in, within 1e-3 x M of llama.cpp's
//!   (`llamacpp.logits.bin`), and with our own embeddings, within 2e-3 x M;
//! - the same with the tower's matrices F16 (`mmproj-f16.gguf`, as real
//!   mmproj files hold them) against llama.cpp on that file: 2e-3 x M;
//! - two images: each image's rows attend both ways among themselves only;
//! - batch == sequential: the prompt in one call, chunk by chunk (the image
//!   whole in one call, as it must be), and beside a second sequence give the
//!   same bits.
//!
//! The pixels are the fixture's 8-bit image normalized here, by the test's
//! own arithmetic: `(v / 255 - mean) / std` per channel, CHW.

use std::path::PathBuf;

use onebit_formats::gguf::{writer::GgufWriter, Gguf, Value};
use onebit_kernels::kv::KvType;
use onebit_kernels::Precision;
use onebit_model::vision::{ResizeFilter, VisionTower};
use onebit_model::{load, Embeds, ExecConfig, Logits, Model, SeqInput};
use onebit_testdata::read_f32;

fn dir() -> PathBuf {
    onebit_testdata::fixture("gemma3-vision")
}

fn tower() -> VisionTower {
    VisionTower::open(dir().join("mmproj.gguf")).unwrap()
}

/// The fixture's image as the encoder's input.
fn pixels(t: &VisionTower) -> Vec<f32> {
    pixels_of(t, "image.rgb")
}

fn pixels_of(t: &VisionTower, file: &str) -> Vec<f32> {
    let p = t.preprocess();
    let (w, h) = (p.width as usize, p.height as usize);
    let rgb = std::fs::read(dir().join(file)).unwrap();
    assert_eq!(rgb.len(), w * h * 3);
    let mut out = vec![0f32; 3 * w * h];
    for c in 0..3 {
        for i in 0..w * h {
            out[c * w * h + i] = (rgb[i * 3 + c] as f32 / 255.0 - p.mean[c]) / p.std[c];
        }
    }
    out
}

enum Chunk {
    Text(Vec<u32>),
    Image(usize),
}

/// mtmd's chunks of a run (`llamacpp`: one image, `llamacpp2`: two).
fn chunks(run: &str) -> Vec<Chunk> {
    let file = dir().join(format!("{run}.chunks.json"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(v["non_causal"], true, "mtmd decoded the image non-causally");
    v["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| match c["type"].as_str().unwrap() {
            "text" => Chunk::Text(
                c["tokens"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap() as u32)
                    .collect(),
            ),
            _ => Chunk::Image(c["n_tokens"].as_u64().unwrap() as usize),
        })
        .collect()
}

/// The text model as llama.cpp ran it: f32 weights and activations, F32 KV,
/// a 128-token context.
fn text_model() -> Model {
    let exec = ExecConfig {
        threads: 2,
        precision: Precision::Float,
        max_context: 128,
        kv_type: KvType::F32,
    };
    load::load(&dir().join("text.gguf"), &exec).unwrap().0
}

/// The prompt's ids (placeholder 0 at image rows), where the images sit
/// and which positions are text.
fn prompt_of(run: &str) -> (Vec<u32>, Vec<usize>, Vec<usize>) {
    let mut ids = Vec::new();
    let mut at = Vec::new();
    let mut text = Vec::new();
    for c in chunks(run) {
        match c {
            Chunk::Text(t) => {
                text.extend(ids.len()..ids.len() + t.len());
                ids.extend(t);
            }
            Chunk::Image(n) => {
                at.push(ids.len());
                ids.extend(std::iter::repeat_n(0, n));
            }
        }
    }
    (ids, at, text)
}

/// The one-image prompt.
fn prompt() -> (Vec<u32>, usize, Vec<usize>) {
    let (ids, at, text) = prompt_of("llamacpp");
    assert_eq!(at.len(), 1, "one image chunk");
    (ids, at[0], text)
}

fn max_abs(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn tower_reads_its_rules_from_the_mmproj() {
    let t = tower();
    let p = t.preprocess();
    assert_eq!((p.width, p.height), (32, 32));
    assert_eq!(p.mean, [0.48, 0.5, 0.52]);
    assert_eq!(p.std, [0.26, 0.27, 0.28]);
    assert_eq!(p.filter, ResizeFilter::Bilinear);
    assert_eq!(p.projector, "gemma3");
    // 16 x 16 patches pooled 4 x 4 (llama.cpp's default: no scale_factor key).
    assert_eq!(t.n_tokens(), 16);
    assert_eq!(t.n_embd_out(), 64);
    assert!(t.bidirectional().value);
    assert_eq!(t.markers().begin, "<start_of_image>");
    let lines = t.lines().join("\n");
    for want in [
        "average 4 x 4",
        "GeluTanh",
        "both ways within one image",
        "GGUF clip.vision.image_mean",
    ] {
        assert!(lines.contains(want), "{want} missing from:\n{lines}");
    }
}

#[test]
fn embeddings_match_numpy_and_llamacpp() {
    let t = tower();
    let e = t.encode(&pixels(&t), 2).unwrap();
    assert_eq!((e.n_tokens, e.n_embd), (16, 64));
    let np = read_f32(dir().join("numpy.embd.bin"));
    let m = max_abs(&np);
    let d = max_diff(&e.rows, &np);
    println!("vs numpy float64: max |diff| {d:e} (M {m})");
    assert!(d <= 1e-6 * m, "vs numpy: {d} > 1e-6 x {m}");
    let ll = read_f32(dir().join("llamacpp.embd.bin"));
    let d = max_diff(&e.rows, &ll);
    println!("vs llama.cpp: max |diff| {d:e}");
    assert!(d <= 1e-3 * m, "vs llama.cpp: {d} > 1e-3 x {m}");
}

/// Logits of the text positions, with `emb` as the image's rows.
fn text_logits(model: &Model, emb: &[f32], bidirectional: bool) -> Vec<f32> {
    let (ids, at, text) = prompt();
    let mut st = model.new_state();
    let rows = Embeds {
        at,
        rows: emb,
        bidirectional,
        grid: None,
    };
    let all = model
        .forward_embeds(&mut st, &ids, &[rows], Logits::All)
        .unwrap();
    let v = model.sem.dims.n_vocab;
    text.iter()
        .flat_map(|&p| all[p * v..(p + 1) * v].to_vec())
        .collect()
}

#[test]
fn logits_match_llamacpp() {
    let model = text_model();
    let reference = read_f32(dir().join("llamacpp.logits.bin"));
    let m = max_abs(&reference);
    // llama.cpp's own image rows: the text side alone.
    let ll = read_f32(dir().join("llamacpp.embd.bin"));
    let ours = text_logits(&model, &ll, true);
    let d = max_diff(&ours, &reference);
    println!("llama.cpp's rows: max |diff| {d:e} (M {m})");
    assert!(d <= 1e-3 * m, "{d} > 1e-3 x {m}");
    // Our rows, end to end.
    let t = tower();
    let e = t.encode(&pixels(&t), 2).unwrap();
    let ours = text_logits(&model, &e.rows, e.bidirectional);
    let d = max_diff(&ours, &reference);
    println!("our rows: max |diff| {d:e}");
    assert!(d <= 2e-3 * m, "{d} > 2e-3 x {m}");
}

#[test]
fn image_rows_causal_would_differ() {
    // The fixture tells the attention rules apart: the same rows attended
    // causally move the logits far beyond the tolerance.
    let model = text_model();
    let reference = read_f32(dir().join("llamacpp.logits.bin"));
    let m = max_abs(&reference);
    let ll = read_f32(dir().join("llamacpp.embd.bin"));
    let d = max_diff(&text_logits(&model, &ll, false), &reference);
    println!("causal image rows: max |diff| {d:e}");
    assert!(
        d > 2e-2 * m,
        "causal image attention is indistinguishable here ({d})"
    );
}

#[test]
fn batch_equals_sequential() {
    let model = text_model();
    let t = tower();
    let e = t.encode(&pixels(&t), 2).unwrap();
    let (ids, at, _) = prompt();
    let v = model.sem.dims.n_vocab;
    let mut st = model.new_state();
    let whole = model
        .forward_embeds(&mut st, &ids, &[e.at(at)], Logits::All)
        .unwrap();
    // Chunk by chunk: the text before, the image whole, then the text after
    // one token at a time.
    let mut st = model.new_state();
    let mut seq = model.forward(&mut st, &ids[..at], Logits::All).unwrap();
    let end = at + e.n_tokens;
    seq.extend(
        model
            .forward_embeds(&mut st, &ids[at..end], &[e.at(0)], Logits::All)
            .unwrap(),
    );
    for &id in &ids[end..] {
        seq.extend(model.forward(&mut st, &[id], Logits::All).unwrap());
    }
    assert_eq!(whole.len(), ids.len() * v);
    assert!(whole == seq, "batched and sequential logits differ");
    // Beside another sequence (text only) in one call.
    let mut a = model.new_state();
    let mut b = model.new_state();
    let other: Vec<u32> = ids[..at].iter().rev().copied().collect();
    let mut seqs = [
        SeqInput {
            state: &mut b,
            tokens: &other,
            want: Logits::All,
        },
        SeqInput {
            state: &mut a,
            tokens: &ids,
            want: Logits::All,
        },
    ];
    let rows = [e.at(at)];
    let out = model
        .forward_batch_embeds(&mut seqs, &[&[], &rows])
        .unwrap();
    assert!(out[1] == whole, "beside another sequence the logits differ");
}

/// The fixture's mmproj with `edit` applied, written to a temporary file.
fn edited(tag: &str, edit: impl FnOnce(&mut GgufWriter)) -> Result<VisionTower, String> {
    let g = Gguf::open(dir().join("mmproj.gguf")).unwrap();
    let mut w = GgufWriter::from_gguf(&g);
    edit(&mut w);
    let tmp = onebit_testdata::TempDir::new(tag);
    let p = tmp.file("mmproj.gguf", &w.to_bytes());
    VisionTower::open(&p).map_err(|e| e.to_string())
}

#[test]
fn refusals_name_what_is_wrong() {
    let err = edited("vis-proj", |w| {
        w.set_kv("clip.projector_type", Value::Str("gemma4v".into()));
    })
    .err()
    .unwrap();
    assert!(
        err.contains("clip.projector_type") && err.contains("'gemma4v'"),
        "{err}"
    );
    let err = edited("vis-audio", |w| {
        w.set_kv("clip.has_vision_encoder", Value::Bool(false));
    })
    .err()
    .unwrap();
    assert!(err.contains("clip.has_vision_encoder"), "{err}");
    let err = edited("vis-extra", |w| {
        w.tensor_f32("v.blk.0.attn_q_norm.weight", &[16], &[1.0; 16]);
    })
    .err()
    .unwrap();
    assert!(err.contains("v.blk.0.attn_q_norm.weight"), "{err}");
    let err = edited("vis-pool", |w| {
        w.set_kv("clip.vision.projector.scale_factor", Value::U32(3));
    })
    .err()
    .unwrap();
    assert!(err.contains("clip.vision.projector.scale_factor"), "{err}");
    let err = edited("vis-side", |w| {
        w.set_kv("clip.vision.patch_size", Value::U32(1));
        w.set_kv("clip.vision.image_size", Value::U32(4096));
    })
    .err()
    .unwrap();
    assert!(
        err.contains("clip.vision.image_size") && err.contains("4096 patches a side"),
        "{err}"
    );
    let err = edited("vis-q8", |w| {
        let g = Gguf::open(dir().join("mmproj.gguf")).unwrap();
        let t = g.tensor("v.blk.0.attn_q.weight").unwrap().clone();
        let dims = t.dims.clone();
        let n = (dims[0] * dims[1]) as usize;
        w.set_tensor(
            "v.blk.0.attn_q.weight",
            &dims,
            onebit_formats::GgmlType::Q8_0,
            vec![0u8; n / 32 * 34],
        );
    })
    .err()
    .unwrap();
    assert!(
        err.contains("v.blk.0.attn_q.weight") && err.contains("Q8_0"),
        "{err}"
    );

    let t = tower();
    let err = t.encode(&[0.0; 10], 1).err().unwrap().to_string();
    assert!(err.contains("3 x 32 x 32"), "{err}");
    let mut sem = text_model().sem.clone();
    sem.dims.n_embd = 32;
    let err = t.check_text_model(&sem).err().unwrap().to_string();
    assert!(err.contains("64") && err.contains("32"), "{err}");
}

#[test]
fn f16_mmproj_matches_llamacpp() {
    // The tower stored as llama.cpp's converter writes real ones (matrices
    // F16; patch and position embeddings, norms and biases F32). We widen
    // the F16 weights at load; llama.cpp rounds the activations of an F16
    // matmul to F16 too, hence the looser bound (measured in the README).
    let t16 = VisionTower::open(dir().join("mmproj-f16.gguf")).unwrap();
    let e = t16.encode(&pixels(&t16), 2).unwrap();
    let ll = read_f32(dir().join("llamacpp-f16.embd.bin"));
    let m = max_abs(&ll);
    let d = max_diff(&e.rows, &ll);
    println!("f16 mmproj, embeddings: max |diff| {d:e} (M {m})");
    assert!(d <= 2e-3 * m, "{d} > 2e-3 x {m}");
    let reference = read_f32(dir().join("llamacpp-f16.logits.bin"));
    let m = max_abs(&reference);
    let d = max_diff(&text_logits(&text_model(), &e.rows, true), &reference);
    println!("f16 mmproj, logits: max |diff| {d:e} (M {m})");
    assert!(d <= 2e-3 * m, "{d} > 2e-3 x {m}");
}

/// Logits of the text positions of run `run`, image i's rows `rows[i]`;
/// `one_span`: all images' rows and the text between them as one both-ways
/// span (not llama.cpp's rule: it decodes each image chunk by itself).
fn text_logits_of(model: &Model, run: &str, rows: &[&[f32]], one_span: bool) -> Vec<f32> {
    let (ids, at, text) = prompt_of(run);
    let e = model.sem.dims.n_embd;
    let mut st = model.new_state();
    let all = if one_span {
        // The first image's start to the last image's end, the text
        // between as its token rows.
        let (lo, hi) = (at[0], at[at.len() - 1] + rows[rows.len() - 1].len() / e);
        let mut joined = Vec::new();
        let mut row = vec![0f32; e];
        for p in lo..hi {
            match at.iter().position(|&a| p >= a && p < a + rows[0].len() / e) {
                Some(i) => joined.extend_from_slice(&rows[i][(p - at[i]) * e..(p - at[i] + 1) * e]),
                None => {
                    model
                        .weights
                        .token_embd
                        .dequantize_row(ids[p] as usize, &mut row);
                    let s = model.sem.embed_scale.value.unwrap_or(1.0);
                    joined.extend(row.iter().map(|v| v * s));
                }
            }
        }
        let span = Embeds {
            at: lo,
            rows: &joined,
            bidirectional: true,
            grid: None,
        };
        model.forward_embeds(&mut st, &ids, &[span], Logits::All)
    } else {
        let spans: Vec<Embeds> = at
            .iter()
            .zip(rows)
            .map(|(&at, r)| Embeds {
                at,
                rows: r,
                bidirectional: true,
                grid: None,
            })
            .collect();
        model.forward_embeds(&mut st, &ids, &spans, Logits::All)
    }
    .unwrap();
    let v = model.sem.dims.n_vocab;
    text.iter()
        .flat_map(|&p| all[p * v..(p + 1) * v].to_vec())
        .collect()
}

#[test]
fn two_images_attend_both_ways_each_within_itself() {
    let model = text_model();
    let reference = read_f32(dir().join("llamacpp2.logits.bin"));
    let m = max_abs(&reference);
    let ll = read_f32(dir().join("llamacpp2.embd.bin"));
    let (a, b) = ll.split_at(ll.len() / 2);
    let d = max_diff(
        &text_logits_of(&model, "llamacpp2", &[a, b], false),
        &reference,
    );
    println!("two images, llama.cpp's rows: max |diff| {d:e} (M {m})");
    assert!(d <= 1e-3 * m, "{d} > 1e-3 x {m}");
    // Our rows for both images, end to end.
    let t = tower();
    let e1 = t.encode(&pixels_of(&t, "image.rgb"), 2).unwrap();
    let e2 = t.encode(&pixels_of(&t, "image2.rgb"), 2).unwrap();
    let d = max_diff(&e2.rows, b);
    assert!(d <= 1e-3 * max_abs(b), "second image's rows: {d}");
    let ours = text_logits_of(&model, "llamacpp2", &[&e1.rows, &e2.rows], false);
    let d = max_diff(&ours, &reference);
    println!("two images, our rows: max |diff| {d:e}");
    assert!(d <= 2e-3 * m, "{d} > 2e-3 x {m}");
    // The rule is per image: one both-ways span over both images is far off.
    let d = max_diff(
        &text_logits_of(&model, "llamacpp2", &[a, b], true),
        &reference,
    );
    println!("two images as one span: max |diff| {d:e}");
    assert!(
        d > 2e-2 * m,
        "one span over both images is indistinguishable here ({d})"
    );
}

#[test]
fn embedding_rows_that_do_not_fit_are_refused() {
    let model = text_model();
    let (ids, at, _) = prompt();
    let e = model.sem.dims.n_embd;
    let rows = vec![0.5f32; 16 * e];
    let run = |spans: &[Embeds]| {
        let mut st = model.new_state();
        model
            .forward_embeds(&mut st, &ids, spans, Logits::Last)
            .err()
            .map(|e| e.to_string())
    };
    fn span(at: usize, rows: &[f32]) -> Embeds<'_> {
        Embeds {
            at,
            rows,
            bidirectional: true,
            grid: None,
        }
    }
    // Past the end of the tokens.
    let err = run(&[span(ids.len() - 3, &rows)]).unwrap();
    assert!(err.contains("outside the"), "{err}");
    // Overlapping spans.
    let err = run(&[span(at, &rows), span(at + 2, &rows)]).unwrap();
    assert!(err.contains("overlapping"), "{err}");
    // Not whole rows.
    let err = run(&[span(at, &rows[..e + 1])]).unwrap();
    assert!(err.contains("not whole rows"), "{err}");
    // Not finite.
    let bad = vec![f32::NAN; e];
    let err = run(&[span(at, &bad)]).unwrap();
    assert!(err.contains("not finite"), "{err}");
    // A bidirectional span cut by the call's end (a batch of forward_batch_embeds).
    let mut st = model.new_state();
    let mut seqs = [SeqInput {
        state: &mut st,
        tokens: &ids[..at + 4],
        want: Logits::Last,
    }];
    let spans = [span(at, &rows)];
    let err = model
        .forward_batch_embeds(&mut seqs, &[&spans])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("outside the"), "{err}");
}

#[test]
fn image_rows_refused_where_per_layer_embeddings_need_token_ids() {
    // Gemma 4's per-layer inputs are looked up by token id: rows without
    // one are refused by name, not run with a placeholder's table row.
    let exec = ExecConfig {
        threads: 1,
        precision: Precision::Float,
        max_context: 128,
        kv_type: KvType::F32,
    };
    let path = onebit_testdata::fixture("gemma4").join("f32.gguf");
    let model = load::load(&path, &exec).unwrap().0;
    let rows = vec![0.5f32; model.sem.dims.n_embd];
    let mut st = model.new_state();
    let span = Embeds {
        at: 1,
        rows: &rows,
        bidirectional: true,
        grid: None,
    };
    let err = model
        .forward_embeds(&mut st, &[2, 0, 7], &[span], Logits::Last)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("gemma4") && err.contains("per-layer embeddings"),
        "{err}"
    );
}
