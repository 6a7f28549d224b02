//! The engine with speculative decoding: 8 concurrent greedy sequences get
//! exactly the tokens they get without drafting, on the attention-only,
//! short-conv and delta-net fixtures, with prompt lookup and with a draft
//! model, while sequences that switched drafting off share the same steps.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use onebit_model::spec::{DrafterSource, SpecPlan};
use onebit_model::{ExecConfig, Model};
use onebit_serve::engine::{Engine, EngineConfig, Event, GenParams, Job};
use onebit_serve::metrics::Metrics;
use tokio::sync::mpsc;

fn load(path: &std::path::Path) -> Model {
    let exec = ExecConfig {
        threads: 1,
        ..ExecConfig::default()
    };
    onebit_model::load::load(path, &exec).unwrap().0
}

fn engine(family: &str, spec: Option<SpecPlan>, metrics: Arc<Metrics>) -> Engine {
    let model = load(&onebit_testdata::fixture(family).join("f32.gguf"));
    Engine::start(
        model,
        vec![],
        EngineConfig {
            max_seqs: 8,
            max_queue: 64,
            prefill_chunk: 16,
            prefix_cache: false,
            cache_bytes: Some(0),
            spec: spec.map(Arc::new),
            max_step: std::time::Duration::ZERO,
            fault: None,
            vision: None,
        },
        metrics,
    )
}

/// Eight prompts: repeats of a pattern (lookup's drafts are right), and
/// plain runs of ids (its drafts come from the output's own loops).
fn prompts() -> Vec<Vec<u32>> {
    (0..8u32)
        .map(|i| {
            let pat: Vec<u32> = (0..5 + i).map(|j| (j * 31 + i * 7) % 300 + 5).collect();
            if i % 2 == 0 {
                pat.iter().chain(&pat).chain(&pat[..3]).copied().collect()
            } else {
                pat
            }
        })
        .collect()
}

/// All prompts at once; `speculative(i)` says whether sequence i drafts.
fn run(e: &Engine, max_new: usize, speculative: impl Fn(usize) -> bool) -> Vec<Vec<u32>> {
    let ps = prompts();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let jobs = ps
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let params = GenParams {
                speculative: speculative(i),
                ..GenParams::greedy(max_new)
            };
            Job::new(Arc::new(p.clone()), params, i, tx.clone())
        })
        .collect();
    e.submit(jobs).ok().unwrap();
    let mut out = vec![Vec::new(); ps.len()];
    let mut done = 0;
    while done < ps.len() {
        match rx.blocking_recv().expect("engine alive") {
            Event::Token { index, id, .. } => out[index].push(id),
            Event::Done { .. } => done += 1,
            Event::Failed { message, .. } => panic!("{message}"),
            Event::Started { .. } | Event::Encoded { .. } => {}
        }
    }
    out
}

#[test]
fn eight_concurrent_sequences_are_bit_identical_with_drafting() {
    let max_new = 24;
    for family in ["llama", "lfm2", "qwen35"] {
        let plain_engine = engine(family, None, Arc::new(Metrics::default()));
        let plain = run(&plain_engine, max_new, |_| false);
        plain_engine.shutdown();
        let mut kept = 0;
        let drafter = || {
            Arc::new(load(&onebit_testdata::fixture(family).join(format!(
                "{}.gguf",
                onebit_testdata::Fixture::new(family).quant()
            ))))
        };
        for (what, source) in [
            ("lookup", DrafterSource::Lookup(3)),
            ("draft model", DrafterSource::Model(drafter())),
            (
                "lookup, else the draft model",
                DrafterSource::LookupThenModel(3, drafter()),
            ),
        ] {
            let metrics = Arc::new(Metrics::default());
            let plan = SpecPlan {
                source,
                draft_max: 5,
            };
            let e = engine(family, Some(plan), metrics.clone());
            // Every sequence drafting, then every other one.
            let all = run(&e, max_new, |_| true);
            let mixed = run(&e, max_new, |i| i % 2 == 0);
            e.shutdown();
            for i in 0..plain.len() {
                assert_eq!(all[i], plain[i], "{family} {what}: sequence {i}");
                assert_eq!(mixed[i], plain[i], "{family} {what}: sequence {i}, mixed");
            }
            let drafted = metrics.draft_tokens.load(Ordering::Relaxed);
            let accepted = metrics.draft_tokens_accepted.load(Ordering::Relaxed);
            eprintln!("{family} {what}: {accepted} of {drafted} drafted tokens accepted");
            assert!(
                accepted < drafted,
                "{family} {what}: some drafts rejected ({accepted} of {drafted})"
            );
            kept += accepted;
        }
        assert!(kept > 0, "{family}: some drafts kept");
    }
}
