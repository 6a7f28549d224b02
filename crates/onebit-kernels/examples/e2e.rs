//! End-to-end speed on a real GGUF, llama-bench style: prefill of N prompt
//! tokens in one batch (logits of the last only), then G decode steps of one
//! token. Prints the median and all runs.
//!
//! cargo run --release -p onebit-kernels --example e2e -- MODEL.gguf [pp=512] [tg=64] [reps=3] [threads=2]

use std::time::Instant;

use onebit_model::{load, ExecConfig, Logits};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: e2e MODEL.gguf [pp] [tg] [reps] [threads]");
    let num = |i: usize, d: usize| args.get(i).map_or(d, |s| s.parse().unwrap());
    let (pp, tg, reps, threads) = (num(2, 512), num(3, 64), num(4, 3), num(5, 2));
    let exec = ExecConfig {
        threads,
        ..Default::default()
    };
    let t0 = Instant::now();
    let (model, _) = load::load(std::path::Path::new(path), &exec).unwrap();
    eprintln!("load {:.2} s", t0.elapsed().as_secs_f64());
    let n_vocab = model.sem.dims.n_vocab as u32;
    let ids: Vec<u32> = (0..pp as u32)
        .map(|i| (1000 + i * 7919) % n_vocab)
        .collect();
    // Warm-up: page in the weights, let lazy preparation happen.
    let mut st = model.new_state();
    model
        .forward(&mut st, &ids[..pp.min(8)], Logits::Last)
        .unwrap();
    model.forward(&mut st, &[ids[0]], Logits::Last).unwrap();
    let (mut pps, mut tgs) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let mut st = model.new_state();
        if pp > 0 {
            let t = Instant::now();
            model.forward(&mut st, &ids, Logits::Last).unwrap();
            pps.push(pp as f64 / t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        for i in 0..tg {
            model
                .forward(&mut st, &[ids[i % ids.len().max(1)]], Logits::Last)
                .unwrap();
        }
        tgs.push(tg as f64 / t.elapsed().as_secs_f64());
    }
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "{}: pp{pp} {:.1} t/s [{}]  tg{tg} {:.1} t/s [{}]  ({threads} threads)",
        std::path::Path::new(path)
            .file_name()
            .unwrap()
            .to_string_lossy(),
        if pps.is_empty() {
            0.0
        } else {
            median(&mut pps.clone())
        },
        fmt(&pps),
        median(&mut tgs.clone()),
        fmt(&tgs)
    );
}
