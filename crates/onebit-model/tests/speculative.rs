//! Speculative decoding gives exactly the plain greedy run: every family's
//! fixture (f32 and quantized) and both real models, with drafters that are
//! right, wrong and half right (rejections in the middle of a draft, so the
//! KV truncation and the conv / delta-net rollback run), prompt lookup and a
//! draft model. The state left behind equals the plain run's bit for bit.
//! At temperature 1 the first speculated token follows the target's softmax
//! (chi-square), with point-mass and model-like drafts.

use std::sync::Arc;

use onebit_formats::dtype::GgmlType;
use onebit_formats::gguf::writer::GgufWriter;
use onebit_formats::gguf::Gguf;
use onebit_kernels::Precision;
use onebit_model::sampler::{Sampler, SamplerConfig};
use onebit_model::spec::{decode_step, Dist, Draft, DraftModel, Drafter, PromptLookup, Speculator};
use onebit_model::{load, ExecConfig, Logits, Model, SeqState};
use onebit_testdata::{real_model, Fixture, Rng, TempDir, GEMMA3_270M, SMOLLM2_135M};

/// Every registered family (each has its fixture, named by its GGUF
/// architecture): a family added to the registry is speculated here too.
fn families() -> impl Iterator<Item = &'static str> {
    onebit_model::families::FAMILIES.iter().map(|f| f.arch)
}

fn exec() -> ExecConfig {
    ExecConfig {
        threads: 2,
        precision: Precision::Quantized,
        max_context: 256,
        ..Default::default()
    }
}

fn load_file(path: &std::path::Path) -> Model {
    load::load(path, &exec())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .0
}

/// Greedy decoding of at least `n` tokens after `prompt`: the tokens and the
/// final state (it has run every token but the last produced).
fn generate(
    m: &Model,
    prompt: &[u32],
    n: usize,
    mut spec: Option<&mut Speculator>,
) -> (Vec<u32>, SeqState) {
    let mut st = m.new_state();
    if prompt.len() > 1 {
        m.forward(&mut st, &prompt[..prompt.len() - 1], Logits::None)
            .unwrap();
    }
    let mut ctx = prompt.to_vec();
    let mut sampler = Sampler::new(SamplerConfig::default());
    while ctx.len() - prompt.len() < n {
        let got = decode_step(m, &mut st, &ctx, &mut sampler, spec.as_deref_mut()).unwrap();
        assert!(!got.is_empty());
        ctx.extend(got);
    }
    (ctx[prompt.len()..].to_vec(), st)
}

/// How a test drafter distorts the true continuation.
#[derive(Clone, Copy, Debug)]
enum Quality {
    Right,
    Wrong,
    /// The first half of each draft right, the rest wrong.
    Half,
}

/// Proposes the plain run's continuation (`truth` = prompt + output),
/// distorted as `quality` says.
struct Oracle {
    truth: Vec<u32>,
    quality: Quality,
    n_vocab: u32,
}

impl Drafter for Oracle {
    fn draft(&mut self, ctx: &[u32], k: usize) -> onebit_model::Result<Draft> {
        assert_eq!(
            &self.truth[..ctx.len()],
            ctx,
            "the context follows the plain run"
        );
        let end = (ctx.len() + k).min(self.truth.len());
        let tokens: Vec<u32> = self.truth[ctx.len()..end]
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let wrong = match self.quality {
                    Quality::Right => false,
                    Quality::Wrong => true,
                    Quality::Half => i >= k.div_ceil(2),
                };
                if wrong {
                    (t + 1) % self.n_vocab
                } else {
                    t
                }
            })
            .collect();
        let q = vec![None; tokens.len()];
        Ok(Draft { tokens, q })
    }
}

/// Plain vs each drafter on `m`: same tokens, same final state. Returns the
/// counts of the half-right run (rejections mid-draft must have happened).
fn check_all_drafters(what: &str, m: &Model, prompt: &[u32], n: usize) {
    let n_vocab = m.sem.dims.n_vocab as u32;
    let (plain, _) = generate(m, prompt, n + 12, None);
    let truth: Vec<u32> = prompt.iter().chain(&plain).copied().collect();
    for quality in [Quality::Right, Quality::Wrong, Quality::Half] {
        let oracle = Oracle {
            truth: truth.clone(),
            quality,
            n_vocab,
        };
        let mut sp = Speculator::new(Box::new(oracle), 5);
        let (out, st) = generate(m, prompt, n, Some(&mut sp));
        let (plain_n, plain_st) = generate(m, prompt, out.len(), None);
        assert_eq!(out, plain_n, "{what}: {quality:?} drafts change the output");
        assert!(
            st == plain_st,
            "{what}: {quality:?} drafts leave another state"
        );
        let s = sp.stats;
        match quality {
            Quality::Right => {
                assert_eq!(s.accepted, s.drafted, "{what}: {s:?}");
                // Kept drafts grow by 2 from 4 up to the cap of 5.
                let (mut produced, mut k, mut drafted, mut steps) = (0, 4, 0, 0);
                while produced < n {
                    (drafted, produced, steps) = (drafted + k, produced + k + 1, steps + 1);
                    k = (k + 2).min(5);
                }
                assert_eq!((s.steps, s.drafted), (steps, drafted), "{what}: {s:?}");
            }
            Quality::Wrong => {
                assert_eq!(s.accepted, 0, "{what}: {s:?}");
                // Each miss skips drafting for 1, 2, 4, ... (at most 16)
                // steps: drafts at steps 0, 2, 5, 10, 19, ...; the first
                // of 4 tokens (the starting length), then of 1.
                let (mut step, mut backoff, mut drafted) = (0, 1, 0);
                while step < s.steps {
                    drafted += if step == 0 { 4 } else { 1 };
                    step += backoff + 1;
                    backoff = (2 * backoff).min(16);
                }
                assert_eq!(s.drafted, drafted, "{what}: misses back off: {s:?}");
            }
            Quality::Half => assert!(
                s.accepted > 0 && s.accepted < s.drafted,
                "{what}: half-right drafts must be cut mid-way: {s:?}"
            ),
        }
    }
    let mut sp = Speculator::new(Box::new(PromptLookup::new(3)), 6);
    let (out, st) = generate(m, prompt, n, Some(&mut sp));
    let (plain_n, plain_st) = generate(m, prompt, out.len(), None);
    assert_eq!(out, plain_n, "{what}: prompt lookup changes the output");
    assert!(st == plain_st, "{what}: prompt lookup leaves another state");
    eprintln!("{what}: lookup {:?}", sp.stats);
}

/// The fixture's tokens, then their first 12 again: lookup finds the
/// repeat, and random-weight models often loop, which it finds too.
fn fixture_prompt(fx: &Fixture) -> Vec<u32> {
    let t = fx.tokens("tokens");
    t[..20].iter().chain(&t[..12]).copied().collect()
}

#[test]
fn every_family_fixture_speculates_bit_identically() {
    for family in families() {
        let fx = Fixture::new(family);
        for w in ["f32".to_string(), fx.quant()] {
            let m = load_file(&fx.dir.join(format!("{w}.gguf")));
            check_all_drafters(&format!("{family} {w}"), &m, &fixture_prompt(&fx), 20);
        }
    }
}

/// A copy of a fixture with every f32 weight matrix perturbed by seeded
/// noise: a random-weight draft with the target's vocabulary.
fn perturbed_copy(src: &std::path::Path, dir: &TempDir, seed: u64) -> std::path::PathBuf {
    let g = Gguf::open(src).unwrap();
    let mut w = GgufWriter::from_gguf(&g);
    let mut rng = Rng(seed);
    for t in &g.tensors {
        if t.dtype != GgmlType::F32 || t.dims.len() < 2 {
            continue;
        }
        let bytes = g.tensor_bytes(t);
        let data: Vec<u8> = bytes
            .chunks_exact(4)
            .flat_map(|b| {
                let v = f32::from_le_bytes(b.try_into().unwrap());
                let noise = (rng.below(2001) as f32 - 1000.0) / 1000.0;
                (v * (1.0 + 0.5 * noise)).to_le_bytes()
            })
            .collect();
        w.set_tensor(&t.name, &t.dims, t.dtype, data);
    }
    dir.file("draft.gguf", &w.to_bytes())
}

#[test]
fn a_random_weight_draft_model_gives_the_plain_output() {
    let dir = TempDir::new("spec-draft");
    for family in ["llama", "lfm2", "qwen35"] {
        let fx = Fixture::new(family);
        let target = load_file(&fx.dir.join("f32.gguf"));
        let draft = Arc::new(load_file(&perturbed_copy(
            &fx.dir.join("f32.gguf"),
            &dir,
            7,
        )));
        let prompt = fixture_prompt(&fx);
        let (plain, plain_st) = generate(&target, &prompt, 40, None);
        let dm = DraftModel::new(draft, target.sem.dims.n_vocab, SamplerConfig::default()).unwrap();
        let mut sp = Speculator::new(Box::new(dm), 4);
        let (out, st) = generate(&target, &prompt, 40, Some(&mut sp));
        let (plain_n, plain_n_st) = generate(&target, &prompt, out.len(), None);
        assert_eq!(out, plain_n, "{family}: the draft model changes the output");
        assert!(
            st == plain_n_st,
            "{family}: the draft model leaves another state"
        );
        assert_eq!(&out[..40], &plain[..40]);
        let _ = plain_st;
        let s = sp.stats;
        eprintln!("{family} draft model: {s:?}");
        assert!(s.drafted > 0 && s.accepted < s.drafted, "{family}: {s:?}");
    }
}

#[test]
fn a_draft_model_with_another_vocabulary_size_is_refused() {
    let fx = Fixture::new("llama");
    let draft = Arc::new(load_file(&fx.dir.join("f32.gguf")));
    let e = DraftModel::new(draft, 385, SamplerConfig::default())
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        onebit_model::ModelError::Input(
            "the draft model has 384 vocabulary entries, the target 385".into()
        )
        .to_string()
    );
}

/// The prompt ids of "Repeat the following text exactly: ..." would need the
/// tokenizer; the real-model tests use llama.cpp-checked ids from testdata
/// refs instead, repeated so lookup has something to find.
fn real_prompt(file: &str) -> Vec<u32> {
    let refs = onebit_testdata::token_refs(file);
    let mut ids: Vec<u32> = Vec::new();
    for (_, t) in refs.iter().take(3) {
        ids.extend(t);
    }
    let again: Vec<u32> = ids[..ids.len().min(24)].to_vec();
    ids.extend(again);
    ids
}

#[test]
fn smollm2_speculates_bit_identically() {
    let m = load_file(&real_model(SMOLLM2_135M));
    check_all_drafters("SmolLM2", &m, &real_prompt(SMOLLM2_135M), 16);
}

#[test]
fn gemma3_speculates_bit_identically() {
    let m = load_file(&real_model(GEMMA3_270M));
    check_all_drafters("gemma3-270m", &m, &real_prompt(GEMMA3_270M), 16);
}

/// A drafter that proposes one token: `token`, or with `q` a draw from q
/// (the rejection rule assumes the guess was drawn from q).
struct Fixed {
    token: u32,
    q: Option<Dist>,
    rng: Rng,
}

impl Drafter for Fixed {
    fn draft(&mut self, _: &[u32], _: usize) -> onebit_model::Result<Draft> {
        let token = match &self.q {
            None => self.token,
            Some((ids, ps)) => {
                let mut r = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let mut t = ids[ids.len() - 1];
                for (&i, &p) in ids.iter().zip(ps) {
                    if r < p {
                        t = i;
                        break;
                    }
                    r -= p;
                }
                t
            }
        };
        Ok(Draft {
            tokens: vec![token],
            q: vec![self.q.clone()],
        })
    }
}

/// Chi-square of first-token counts against the softmax of `logits`
/// (bins with expected count < 5 pooled).
fn chi_square(counts: &[usize], logits: &[f32], n: usize) -> (f64, usize) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let z: f64 = e.iter().sum();
    let (mut chi, mut bins) = (0.0, 0);
    let (mut pool_e, mut pool_o) = (0.0, 0.0);
    for (i, &ei) in e.iter().enumerate() {
        let exp = n as f64 * ei / z;
        if exp < 5.0 {
            pool_e += exp;
            pool_o += counts[i] as f64;
        } else {
            chi += (counts[i] as f64 - exp).powi(2) / exp;
            bins += 1;
        }
    }
    if pool_e > 0.0 {
        chi += (pool_o - pool_e).powi(2) / pool_e;
        bins += 1;
    }
    (chi, bins - 1)
}

#[test]
fn temperature_one_keeps_the_target_distribution() {
    let fx = Fixture::new("lfm2");
    let m = load_file(&fx.dir.join("f32.gguf"));
    // The prompt length whose next-token distribution has its top
    // probability nearest 0.5: several bins carry mass, so a wrong
    // acceptance or residual rule shows.
    let toks = fx.tokens("tokens");
    let all = m.forward(&mut m.new_state(), &toks, Logits::All).unwrap();
    let v = m.sem.dims.n_vocab;
    let top = |row: &[f32]| {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        1.0 / row.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>()
    };
    let len = (1..=toks.len())
        .min_by(|&a, &b| {
            let d = |n: usize| (top(&all[(n - 1) * v..n * v]) - 0.5).abs();
            d(a).total_cmp(&d(b))
        })
        .unwrap();
    let prompt = &toks[..len];
    let mut st = m.new_state();
    if len > 1 {
        m.forward(&mut st, &prompt[..len - 1], Logits::None)
            .unwrap();
    }
    let target = m
        .forward(&mut st.clone(), &prompt[len - 1..], Logits::Last)
        .unwrap();
    eprintln!(
        "prompt of {len} tokens: top probability {:.3}",
        top(&target)
    );
    let n_vocab = target.len();
    let mut sorted: Vec<u32> = (0..n_vocab as u32).collect();
    sorted.sort_by(|&a, &b| target[b as usize].total_cmp(&target[a as usize]));
    let (best, second) = (sorted[0], sorted[1]);
    // A model-like q: most mass on the second-best token.
    let q_model: Dist = (vec![second, best], vec![0.7, 0.3]);
    // (name, token, q): None = plain decoding.
    type Case = (&'static str, Option<(u32, Option<Dist>)>);
    let cases: [Case; 4] = [
        ("plain", None),
        ("point mass on the best", Some((best, None))),
        ("point mass on the second", Some((second, None))),
        ("model-like q", Some((second, Some(q_model)))),
    ];
    let n = 4000;
    for (name, d) in cases {
        let mut counts = vec![0usize; n_vocab];
        for seed in 0..n as u64 {
            // A fresh speculator per seed: every step verifies a draft.
            let mut sp = d.clone().map(|(token, q)| {
                let rng = Rng(seed + 1);
                Speculator::new(Box::new(Fixed { token, q, rng }), 1)
            });
            let mut s = st.clone();
            let mut sampler = Sampler::new(SamplerConfig {
                temperature: 1.0,
                seed,
                ..Default::default()
            });
            let got = decode_step(&m, &mut s, prompt, &mut sampler, sp.as_mut()).unwrap();
            counts[got[0] as usize] += 1;
        }
        let (chi, df) = chi_square(&counts, &target, n);
        // The 0.999 quantile of chi-square: below df + 3.1 sqrt(2 df) + 10
        // for the df here (Wilson-Hilferty gives about df + 3.09 sqrt(2df)).
        let bound = df as f64 + 3.1 * (2.0 * df as f64).sqrt() + 10.0;
        eprintln!("{name}: chi-square {chi:.1} over {df} degrees of freedom (bound {bound:.1})");
        assert!(
            chi < bound,
            "{name}: chi-square {chi:.1} > {bound:.1} ({df} df)"
        );
    }
}

#[test]
fn rewind_restores_any_position_on_the_trail_and_refuses_the_rest() {
    for family in ["llama", "lfm2", "qwen35"] {
        let fx = Fixture::new(family);
        let m = load_file(&fx.dir.join("f32.gguf"));
        let t = fx.tokens("tokens");
        let run = |n: usize| {
            let mut st = m.new_state();
            m.forward(&mut st, &t[..n], Logits::None).unwrap();
            st
        };
        let mut st = run(3);
        st.start_trail();
        m.forward(&mut st, &t[3..7], Logits::None).unwrap();
        let before = st.clone();
        // Past the end, or (recurrent layers) before the trail's start.
        assert!(!st.rewind(8), "{family}");
        let recurrent = family != "llama";
        assert_eq!(st.rewind(2), !recurrent, "{family}");
        if recurrent {
            assert!(st == before, "{family}: a refused rewind changes nothing");
        }
        for n in [3, 5, 7] {
            let mut s = before.clone();
            assert!(s.rewind(n), "{family}: {n}");
            assert!(s.trail.is_none(), "{family}: the trail stops");
            assert!(s == run(n), "{family}: rewound to {n} equals {n} run");
        }
    }
}
