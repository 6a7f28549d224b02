//! The engine with a vision tower, on the gemma3-vision fixture: two
//! sequences with images submitted together (meta.json's `prompt`, one
//! image, and `prompt2`, two) batch in the same steps, in prompt chunks of
//! 7 tokens, smaller than an image's 16 rows; each one's first token and its
//! logprob are llama.cpp mtmd's (the last rows of llamacpp.logits.bin and
//! llamacpp2.logits.bin) within the fixture's logit tolerance. The image
//! both share is encoded once.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use onebit_image::{Filter, Rgb8, Size, Spec};
use onebit_model::vision::VisionTower;
use onebit_model::ExecConfig;
use onebit_serve::engine::{Engine, EngineConfig, Event, GenParams, Job};
use onebit_serve::images::{placeholders, PromptImage, Tower};
use onebit_serve::metrics::Metrics;
use tokio::sync::mpsc;

const N_VOCAB: usize = 384; // meta.json text_hparams.n_vocab

fn dir() -> std::path::PathBuf {
    onebit_testdata::dir().join("llamacpp/gemma3-vision")
}

/// The fixture image `name` prepared as mtmd does for the tower: 32 x 32
/// already (no resize), normalized by meta.json's mean and std.
fn image(name: &str) -> Arc<onebit_image::Prepared> {
    let spec = Spec {
        size: Size::Fixed {
            side: 32,
            tokens: 16,
        },
        filter: Filter::Bilinear,
        mean: [0.48, 0.5, 0.52],
        std: [0.26, 0.27, 0.28],
        pad: [0, 0, 0],
    };
    let rgb = Rgb8 {
        width: 32,
        height: 32,
        data: std::fs::read(dir().join(name)).unwrap(),
    };
    Arc::new(onebit_image::prepare(&rgb, &spec))
}

/// The prompt ids of text chunks (llamacpp*.chunks.json) around images.
fn prompt(
    texts: &[&[u32]],
    images: &[Arc<onebit_image::Prepared>],
) -> (Vec<u32>, Vec<PromptImage>) {
    let mut ids = Vec::new();
    let mut placed = Vec::new();
    for (k, t) in texts.iter().enumerate() {
        ids.extend_from_slice(t);
        if let Some(img) = images.get(k) {
            placed.push(PromptImage {
                start: ids.len(),
                image: img.clone(),
            });
            ids.extend(placeholders(img, N_VOCAB));
        }
    }
    (ids, placed)
}

/// llama.cpp's argmax and its log-softmax at the last row of `file`, and
/// the row's max |logit|.
fn reference(file: &str) -> (u32, f32, f32) {
    let b = std::fs::read(dir().join(file)).unwrap();
    let row: Vec<f32> = b[b.len() - 4 * N_VOCAB..]
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let best = (0..N_VOCAB)
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap();
    let max = row[best];
    let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
    let m = row.iter().fold(0f32, |a, x| a.max(x.abs()));
    (best as u32, row[best] - lse, m)
}

fn job(
    ids: Vec<u32>,
    images: Vec<PromptImage>,
    tx: &mpsc::UnboundedSender<Event>,
    index: usize,
) -> Job {
    let params = GenParams {
        logprobs: Some(1),
        ..GenParams::greedy(1)
    };
    Job {
        images,
        ..Job::new(Arc::new(ids), params, index, tx.clone())
    }
}

#[test]
fn two_image_prompts_batched_in_small_chunks_give_mtmds_first_tokens() {
    let (model, _) = onebit_model::load::load(
        &dir().join("text.gguf"),
        &ExecConfig {
            threads: 2,
            kv_type: onebit_model::state::KvType::F32,
            ..ExecConfig::default()
        },
    )
    .unwrap();
    let tower = VisionTower::open(dir().join("mmproj.gguf")).unwrap();
    let metrics = Arc::new(Metrics::default());
    let engine = Engine::start(
        model,
        vec![],
        EngineConfig {
            max_seqs: 4,
            max_queue: 8,
            prefill_chunk: 7,
            prefix_cache: false,
            cache_bytes: Some(0),
            spec: None,
            max_step: std::time::Duration::ZERO,
            fault: None,
            vision: Some(Tower(Arc::new(tower))),
        },
        metrics.clone(),
    );
    let (a, b) = (image("image.rgb"), image("image2.rgb"));
    // llamacpp.chunks.json and llamacpp2.chunks.json.
    let one = prompt(
        &[
            &[2, 310, 4],
            &[5, 294, 270, 263, 282, 298, 292, 308, 281, 309],
        ],
        std::slice::from_ref(&a),
    );
    let two = prompt(
        &[
            &[2, 310, 4],
            &[5, 309, 4],
            &[5, 294, 270, 263, 282, 298, 292, 308, 281],
        ],
        &[a.clone(), b],
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    assert!(engine
        .submit(vec![job(one.0, one.1, &tx, 0), job(two.0, two.1, &tx, 1)])
        .is_ok());
    drop(tx);
    let mut first = [None, None];
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Token { index, id, logprob } => {
                first[index] = Some((id, logprob.unwrap().logprob));
            }
            Event::Failed { message, .. } => panic!("{message}"),
            _ => {}
        }
    }
    for (k, file) in ["llamacpp.logits.bin", "llamacpp2.logits.bin"]
        .into_iter()
        .enumerate()
    {
        let (want, want_lp, m) = reference(file);
        let (id, lp) = first[k].unwrap();
        assert_eq!(id, want, "{file}");
        // testdata/llamacpp/README.md: logits within 2e-3 x M; a
        // log-softmax value moves by at most twice that.
        assert!(
            (lp - want_lp).abs() <= 2.0 * 2e-3 * m,
            "{file}: {lp} vs {want_lp}"
        );
    }
    // image.rgb is in both prompts: encoded once, found the second time.
    assert_eq!(metrics.images_encoded.load(Ordering::Relaxed), 2);
    assert_eq!(metrics.images_reused.load(Ordering::Relaxed), 1);
    engine.shutdown();
}
