//! The engine under faults (issue 31), on the tiny llama.cpp fixtures:
//! embedding requests run in chunks beside decoding sequences and still give
//! the vector of one whole forward, bit for bit; a hung-up embedding request
//! is freed; a cut fails every request with the shutdown message; a panic
//! while one sequence is sampled fails that sequence alone and the engine
//! goes on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onebit_model::{ExecConfig, Logits, Model};
use onebit_serve::engine::{
    EmbedJob, EmbedReply, Engine, EngineConfig, Event, FaultHook, Finish, GenParams, Job,
    SHUTTING_DOWN,
};
use onebit_serve::metrics::Metrics;
use onebit_serve::pooling::{PoolKind, Pooling};
use tokio::sync::{mpsc, oneshot};

fn load(family: &str) -> Model {
    let path = onebit_testdata::fixture(family).join("f32.gguf");
    let exec = ExecConfig {
        threads: 1,
        ..ExecConfig::default()
    };
    onebit_model::load::load(&path, &exec).unwrap().0
}

fn engine(family: &str, fault: Option<FaultHook>, metrics: Arc<Metrics>) -> Engine {
    Engine::start(
        load(family),
        vec![],
        EngineConfig {
            max_seqs: 4,
            max_queue: 16,
            // Small: prompts and embedding inputs run over many steps.
            prefill_chunk: 5,
            max_step: Duration::ZERO,
            prefix_cache: true,
            cache_bytes: Some(16 << 20),
            spec: None,
            fault,
            vision: None,
        },
        metrics,
    )
}

fn job(prompt: &[u32], max_new: usize, tx: &mpsc::UnboundedSender<Event>, index: usize) -> Job {
    Job::new(
        Arc::new(prompt.to_vec()),
        GenParams::greedy(max_new),
        index,
        tx.clone(),
    )
}

/// Per choice: its tokens, and Ok(finish) or Err(the failure's message).
type Outcome = (Vec<u32>, Result<Finish, String>);

fn collect(rx: &mut mpsc::UnboundedReceiver<Event>, n: usize) -> Vec<Outcome> {
    let mut out: Vec<Outcome> = (0..n).map(|_| (Vec::new(), Ok(Finish::Stop))).collect();
    let mut ended = 0;
    while ended < n {
        match rx.blocking_recv().expect("the engine ended the run") {
            Event::Started { .. } | Event::Encoded { .. } => {}
            Event::Token { index, id, .. } => out[index].0.push(id),
            Event::Done { index, finish } => {
                out[index].1 = Ok(finish);
                ended += 1;
            }
            Event::Failed { index, message } => {
                out[index].1 = Err(message);
                ended += 1;
            }
        }
    }
    out
}

fn prompts() -> Vec<Vec<u32>> {
    (0..3u32)
        .map(|i| {
            (0..9 + 4 * i)
                .map(|j| (j * 29 + i * 11) % 280 + 7)
                .collect()
        })
        .collect()
}

fn mean() -> Pooling {
    Pooling {
        kind: PoolKind::Mean,
        source: "test".into(),
    }
}

fn embed_job(inputs: Vec<Vec<u32>>) -> (EmbedJob, oneshot::Receiver<EmbedReply>) {
    let (tx, rx) = oneshot::channel();
    (
        EmbedJob {
            inputs,
            pooling: mean(),
            reply: tx,
            submitted: Instant::now(),
        },
        rx,
    )
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < Duration::from_secs(30), "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn embeddings_in_chunks_beside_decoding_give_the_whole_forwards_vectors() {
    let texts: Vec<Vec<u32>> = vec![
        (0..23).map(|j| (j * 13 + 5) % 290 + 3).collect(),
        vec![9, 8, 7],
        (0..12).map(|j| (j * 7 + 1) % 250 + 10).collect(),
    ];
    // The reference: each text in one forward of its own, pooled whole.
    let reference = load("llama");
    let width = reference.sem.dims.n_embd;
    let want: Vec<Vec<f32>> = texts
        .iter()
        .map(|t| {
            let mut st = reference.new_state();
            let rows = reference.forward(&mut st, t, Logits::Hidden).unwrap();
            mean().pool_through(&rows, width, |v| reference.pooled_head(v))
        })
        .collect();
    let gen_alone: Vec<Vec<u32>> = {
        let e = engine("llama", None, Arc::new(Metrics::default()));
        prompts()
            .iter()
            .map(|p| {
                let (tx, mut rx) = mpsc::unbounded_channel();
                e.submit(vec![job(p, 8, &tx, 0)]).ok().unwrap();
                collect(&mut rx, 1).pop().unwrap().0
            })
            .collect()
    };

    // Three sequences decoding while the request runs, 5 prompt tokens a
    // step: the 23-token text takes five steps.
    let e = engine("llama", None, Arc::new(Metrics::default()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let jobs = prompts()
        .iter()
        .enumerate()
        .map(|(i, p)| job(p, 8, &tx, i))
        .collect();
    e.submit(jobs).ok().unwrap();
    let (ej, erx) = embed_job(texts.clone());
    assert!(e.embed(ej).is_ok());
    let got = erx.blocking_recv().unwrap().unwrap();
    assert_eq!(got.len(), texts.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g, w,
            "text {i}: chunked beside decoding, not the whole forward's vector"
        );
    }
    for (i, (toks, end)) in collect(&mut rx, 3).into_iter().enumerate() {
        assert_eq!(end, Ok(Finish::Length));
        assert_eq!(toks, gen_alone[i], "sequence {i} beside the embeddings");
    }
}

#[test]
fn a_hung_up_embedding_request_is_freed_and_a_cut_fails_everything() {
    let metrics = Arc::new(Metrics::default());
    let e = engine("llama", None, metrics.clone());
    let active = || metrics.active_sequences.load(Ordering::Relaxed);
    // Long enough to run for many steps at 5 tokens a step.
    let long: Vec<Vec<u32>> = (0..8)
        .map(|k| (0..200).map(|j| (j * 17 + k) % 290 + 3).collect())
        .collect();
    let (ej, erx) = embed_job(long.clone());
    assert!(e.embed(ej).is_ok());
    wait_for("the request never became active", || active() == 1);
    let before = metrics.sequences_cancelled.load(Ordering::Relaxed);
    drop(erx);
    wait_for("the hung-up request was not freed", || active() == 0);
    assert_eq!(
        metrics.sequences_cancelled.load(Ordering::Relaxed),
        before + 1
    );

    // A cut: the running embedding request, a decoding sequence and a
    // queued one all fail with the message; the engine then refuses work.
    let (ej, erx) = embed_job(long.clone());
    assert!(e.embed(ej).is_ok());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let p = prompts();
    e.submit(vec![job(&p[0], 100_000, &tx, 0)]).ok().unwrap();
    wait_for("not both running", || active() == 2);
    e.cut(SHUTTING_DOWN);
    assert_eq!(erx.blocking_recv().unwrap(), Err(SHUTTING_DOWN.to_string()));
    let (_, end) = collect(&mut rx, 1).pop().unwrap();
    assert_eq!(end, Err(SHUTTING_DOWN.to_string()));
    assert!(e.submit(vec![job(&p[1], 1, &tx, 0)]).is_err());
    wait_for("the engine thread did not end", || !e.alive());
}

#[test]
fn a_panic_in_one_sequence_fails_it_alone_and_the_engine_goes_on() {
    let p = prompts();
    let alone: Vec<Vec<u32>> = {
        let e = engine("llama", None, Arc::new(Metrics::default()));
        p.iter()
            .map(|q| {
                let (tx, mut rx) = mpsc::unbounded_channel();
                e.submit(vec![job(q, 6, &tx, 0)]).ok().unwrap();
                collect(&mut rx, 1).pop().unwrap().0
            })
            .collect()
    };
    // The hook panics whenever the second prompt's sequence is sampled.
    let bad = p[1].clone();
    let hook = FaultHook(Arc::new(move |prompt: &[u32]| {
        if prompt == bad.as_slice() {
            panic!("a deliberate fault in one sequence");
        }
    }));
    let e = engine("llama", Some(hook), Arc::new(Metrics::default()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    e.submit(
        p.iter()
            .enumerate()
            .map(|(i, q)| job(q, 6, &tx, i))
            .collect(),
    )
    .ok()
    .unwrap();
    // Only the engine holds senders now: were its thread to die, the
    // receiver would end and the test fail rather than wait.
    drop(tx);
    let out = collect(&mut rx, 3);
    let failed = out[1].1.as_ref().unwrap_err();
    assert!(failed.contains("internal error"), "{failed}");
    for i in [0, 2] {
        assert_eq!(out[i].1, Ok(Finish::Length), "sequence {i}");
        assert_eq!(out[i].0, alone[i], "sequence {i} beside the panicking one");
    }
    // The engine lives on and serves the next request as before.
    assert!(e.alive());
    let (tx, mut rx) = mpsc::unbounded_channel();
    e.submit(vec![job(&p[2], 6, &tx, 0)]).ok().unwrap();
    assert_eq!(collect(&mut rx, 1).pop().unwrap().0, alone[2]);
}
