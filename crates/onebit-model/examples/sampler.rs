//! Time per sampled token of [`Sampler::sample`] over a vocabulary of
//! Gemma 3's size (262,144) or the one given, for the configurations a
//! server meets: greedy, temperature alone (OpenAI's default), top-p,
//! min-p, top-k and typical-p. Best of several rounds of 200 draws (robust
//! on a shared machine), in microseconds.
//!
//! cargo run --release -p onebit-model --example sampler -- [vocab=262144]
//!
//! The logits are a fixed pseudo-random spread of about 20 nats with a few
//! tokens far above it, the shape of a trained model's next-token logits
//! (a handful of candidates, a long tail), so top-p stops early as it does
//! on real text.

use std::time::Instant;

use onebit_model::sampler::{Sampler, SamplerConfig};

fn main() {
    let vocab: usize = std::env::args()
        .nth(1)
        .map_or(262_144, |s| s.parse().expect("vocab: a whole number"));
    let logits: Vec<f32> = (0..vocab)
        .map(|i| {
            let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            let base = (h as f32 / (1u64 << 24) as f32) * 20.0 - 10.0;
            if i % 4099 == 7 {
                base + 18.0
            } else {
                base
            }
        })
        .collect();
    let configs: [(&str, SamplerConfig); 6] = [
        ("greedy", SamplerConfig::default()),
        ("temperature 1", cfg(|c| c.temperature = 1.0)),
        ("top_p 0.95", cfg(|c| c.top_p = 0.95)),
        ("min_p 0.05", cfg(|c| c.min_p = 0.05)),
        ("top_k 40", cfg(|c| c.top_k = 40)),
        ("typical_p 0.9", cfg(|c| c.typical_p = 0.9)),
    ];
    println!("vocab {vocab}");
    for (name, c) in configs {
        let mut s = Sampler::new(c);
        let mut best = f64::MAX;
        let mut check = 0u64;
        for _ in 0..5 {
            let t0 = Instant::now();
            for _ in 0..200 {
                check = check.wrapping_add(u64::from(s.sample(&logits)));
            }
            best = best.min(t0.elapsed().as_secs_f64() / 200.0);
        }
        println!(
            "{name:>14}: {:8.1} us a token (ids summed {check})",
            best * 1e6
        );
    }
}

fn cfg(f: impl FnOnce(&mut SamplerConfig)) -> SamplerConfig {
    let mut c = SamplerConfig {
        temperature: 1.0,
        seed: 1,
        ..SamplerConfig::default()
    };
    f(&mut c);
    c
}
