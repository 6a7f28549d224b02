//! The engine on the tiny llama.cpp fixture models (attention-only llama,
//! short-conv LFM2, delta-net Qwen3.5): greedy sequences batched together get
//! the tokens each gets alone, and the prefix cache (rewinding attention
//! states, exact-prefix snapshots of recurrent ones) changes nothing but the
//! work done; for the attention-only model with every KV cache type.

use std::sync::Arc;

use onebit_model::state::KvType;
use onebit_model::ExecConfig;
use onebit_serve::engine::{Engine, EngineConfig, Event, Finish, GenParams, Job};
use onebit_serve::metrics::Metrics;
use tokio::sync::mpsc;

fn engine(family: &str, max_seqs: usize, cache: bool, kv_type: KvType) -> Engine {
    let path = onebit_testdata::fixture(family).join("f32.gguf");
    let (model, _) = onebit_model::load::load(
        &path,
        &ExecConfig {
            threads: 1,
            kv_type,
            ..ExecConfig::default()
        },
    )
    .unwrap();
    Engine::start(
        model,
        vec![],
        EngineConfig {
            max_seqs,
            max_queue: 64,
            prefill_chunk: 7, // small: prompts prefill over several steps
            prefix_cache: cache,
            cache_bytes: Some(64 << 20),
            spec: None,
            max_step: std::time::Duration::ZERO,
            fault: None,
            vision: None,
        },
        Arc::new(Metrics::default()),
    )
}

type Rx = mpsc::UnboundedReceiver<Event>;

fn job(prompt: &[u32], max_new: usize, tx: &mpsc::UnboundedSender<Event>, index: usize) -> Job {
    let params = GenParams {
        speculative: true,
        ..GenParams::greedy(max_new)
    };
    Job::new(Arc::new(prompt.to_vec()), params, index, tx.clone())
}

/// (tokens, cached) per choice once all are done.
fn collect(rx: &mut Rx, n: usize) -> Vec<(Vec<u32>, usize)> {
    let mut out = vec![(Vec::new(), 0); n];
    let mut done = 0;
    while done < n {
        match rx.blocking_recv().expect("engine alive") {
            Event::Started { index, cached } => out[index].1 = cached,
            Event::Encoded { .. } => {}
            Event::Token { index, id, .. } => out[index].0.push(id),
            Event::Done { finish, .. } => {
                assert_eq!(finish, Finish::Length);
                done += 1
            }
            Event::Failed { message, .. } => panic!("{message}"),
        }
    }
    out
}

fn run_one(e: &Engine, prompt: &[u32], max_new: usize) -> (Vec<u32>, usize) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    e.submit(vec![job(prompt, max_new, &tx, 0)]).ok().unwrap();
    collect(&mut rx, 1).pop().unwrap()
}

fn prompts() -> Vec<Vec<u32>> {
    let base: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 300 + 5).collect();
    let mut longer = base.clone();
    longer.extend([17, 99, 3]);
    let mut other = base[..10].to_vec();
    other.extend([250, 251, 252, 253, 254]);
    let mut fresh = base[..10].to_vec();
    fresh.extend([260, 261, 262]);
    vec![base, longer, other, vec![42, 43], fresh]
}

fn check(family: &str, kv: KvType) {
    let ps = prompts();
    let max_new = 6;
    let alone_engine = engine(family, 1, false, kv);
    let alone: Vec<Vec<u32>> = ps
        .iter()
        .map(|p| run_one(&alone_engine, p, max_new).0)
        .collect();
    alone_engine.shutdown();

    // All at once, batched, cache on.
    let e = engine(family, 4, true, kv);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let batched = &ps[..4];
    e.submit(
        batched
            .iter()
            .enumerate()
            .map(|(i, p)| job(p, max_new, &tx, i))
            .collect(),
    )
    .ok()
    .unwrap();
    let together = collect(&mut rx, batched.len());
    for (i, (t, _)) in together.iter().enumerate() {
        assert_eq!(t, &alone[i], "{family}: prompt {i} batched");
    }

    // One after another, cache on: hits, same tokens.
    let (t, cached) = run_one(&e, &ps[0], max_new);
    assert_eq!(t, alone[0], "{family}: repeat");
    assert_eq!(
        cached,
        ps[0].len() - 1,
        "{family}: a repeat reuses all but the last token"
    );
    let (t, cached) = run_one(&e, &ps[1], max_new);
    assert_eq!(t, alone[1], "{family}: extension");
    assert!(
        cached >= ps[0].len() - 1,
        "{family}: extension cached {cached}"
    );
    let (t, cached) = run_one(&e, &ps[4], max_new);
    assert_eq!(t, alone[4], "{family}: shared start");
    if family == "llama" {
        assert_eq!(cached, 10, "attention states rewind to the common prefix");
    }
    e.shutdown();
    assert!(!e.alive());
}

#[test]
fn attention_only_model() {
    for kv in KvType::ALL {
        check("llama", kv);
    }
}

#[test]
fn short_conv_model() {
    check("lfm2", KvType::default());
}

#[test]
fn delta_net_model() {
    check("qwen35", KvType::default());
}
