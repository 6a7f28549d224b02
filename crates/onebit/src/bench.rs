//! `onebit bench`: prompt processing and decode speed, as llama-bench
//! measures them (a prompt of N synthetic tokens in one batch; G tokens
//! decoded one at a time; both from an empty context, or, with `--depth D`
//! as `llama-bench -d D`, after D tokens filled the context untimed),
//! repeated R times; min, median and max reported. With `--prompt-text`
//! the prompt is that text and decode goes on after it; with `--lookup` or
//! `--draft` decode is speculative and the drafting counts are reported;
//! with `--batch N`, N independent sequences decode together and the
//! aggregate and per-sequence decode rates are reported. With `--mmproj
//! FILE` (and no model) it times the vision tower instead: one synthetic
//! image at the tower's own size, encoded after one untimed warm-up, R times.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use onebit_model::sampler::{argmax, Sampler};
use onebit_model::spec::{decode_step, SpecStats};
use onebit_model::state::LayerState;
use onebit_model::Logits;

use crate::open::{load_model, Loaded};
use crate::ModelArgs;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 64)]
    pub gen_tokens: usize,
    /// Tokens in the context before each measurement (`llama-bench -d`);
    /// with --prompt-tokens 0 only decode at that depth is measured.
    #[arg(long, default_value_t = 0)]
    pub depth: usize,
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Bench this text (tokenized, BOS added) as the prompt instead of
    /// --prompt-tokens random ids; decode then continues after it.
    #[arg(long, value_name = "TEXT", conflicts_with = "depth")]
    pub prompt_text: Option<String>,
    /// With --lookup or --draft, decode speculatively (decode continues
    /// after the prompt) and report the acceptance rate and tokens per step.
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
    /// Decode under this JSON schema (the constrained decoding of
    /// `response_format`), to measure its per-token cost against a plain run.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["lookup", "draft"])]
    pub json_schema: Option<std::path::PathBuf>,
    /// Decode N independent sequences together, as `llama-batched-bench`'s
    /// parallel sequences: each has its own --depth tokens (untimed) and
    /// --prompt-tokens prompt of random ids, then every decode step runs one
    /// token of each sequence in one forward; reports the aggregate and the
    /// per-sequence decode tok/s.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        conflicts_with_all = ["prompt_text", "lookup", "draft", "json_schema"]
    )]
    pub batch: usize,
    /// Time this vision projector (mmproj GGUF) instead of a text model:
    /// encode one image at the tower's own size --repetitions times (after
    /// one untimed warm-up) and report images/s; --model is not needed, and
    /// the text bench's options are refused beside it.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = [
            "prompt_tokens", "gen_tokens", "depth", "prompt_text", "json_schema",
            "batch", "lookup", "draft", "draft_max", "ctx", "kv_type", "pull",
        ]
    )]
    pub mmproj: Option<std::path::PathBuf>,
}

struct Run {
    prompt_tps: f64,
    decode_tps: f64,
    ttft_ms: f64,
    spec: SpecStats,
}

pub fn bench(a: BenchArgs) -> Result<()> {
    if a.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    if let Some(p) = &a.mmproj {
        if a.model.model_arg.is_some() {
            bail!("--mmproj times the vision tower alone: --model is not taken with it (run the text bench without --mmproj)");
        }
        return bench_vision(p, &a);
    }
    if a.prompt_tokens == 0 && a.gen_tokens == 0 {
        bail!("--prompt-tokens and --gen-tokens are both 0: nothing to measure");
    }
    if a.batch == 0 {
        bail!("--batch must be at least 1 (the sequences decoded together)");
    }
    let Loaded { model, opened } = load_model(&a.model.model, &a.model.exec())?;
    crate::open::print_semantics(&opened, &a.model.exec(), a.model.verbose);
    let schema = match &a.json_schema {
        Some(p) => Some(schema_constraint(p, &opened)?),
        None => None,
    };
    let n_vocab = model.sem.dims.n_vocab as u64;
    let text_ids = match &a.prompt_text {
        Some(t) => Some(crate::open::tokenizer(&opened)?.encode(t, true)?),
        None => None,
    };
    let plan = crate::spec::plan(&a.spec, &model, &opened, &a.model.exec())?;
    // The opened file's pages are not needed once the weights are loaded.
    drop(opened);
    let a = BenchArgs {
        prompt_tokens: text_ids.as_ref().map_or(a.prompt_tokens, Vec::len),
        ..a
    };
    // A real prompt or drafting: decode goes on after the prompt.
    let after_prompt = a.prompt_text.is_some() || plan.is_some();
    // Drafting may run up to --draft-max tokens past the last one counted.
    let spec_extra = plan.as_ref().map_or(0, |p| p.draft_max);
    if after_prompt && a.prompt_tokens + a.gen_tokens + spec_extra > model.max_context() {
        bail!(
            "{} prompt plus {} generated tokens (and {spec_extra} drafted) exceed the context limit {} (--ctx)",
            a.prompt_tokens,
            a.gen_tokens,
            model.max_context()
        );
    }
    if a.depth + a.prompt_tokens.max(a.gen_tokens) > model.max_context() {
        bail!(
            "a depth of {} plus {} prompt or {} generated tokens exceeds the context limit {} (--ctx)",
            a.depth,
            a.prompt_tokens,
            a.gen_tokens,
            model.max_context()
        );
    }
    // Synthetic prompt ids from a fixed LCG: the same prompt every run.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    if a.batch > 1 {
        return bench_batch(&a, &model, &mut x, n_vocab);
    }
    let mut ids = synthetic_ids(&mut x, a.depth + a.prompt_tokens.max(1), n_vocab);
    let prompt = text_ids.unwrap_or_else(|| ids.split_off(a.depth));
    let fill = if a.prompt_text.is_some() {
        Vec::new()
    } else {
        ids
    };

    // llama-bench's label for a test at a depth.
    let at = if a.depth > 0 {
        format!(" @ d{}", a.depth)
    } else {
        String::new()
    };
    let mut runs = Vec::with_capacity(a.repetitions);
    for rep in 0..a.repetitions {
        let mut st = model.new_state();
        if !fill.is_empty() {
            model.forward(&mut st, &fill, Logits::None)?;
        }
        // Recurrent states cannot be cut back to the depth: keep a copy.
        let rewindable = st
            .layers
            .iter()
            .all(|l| matches!(l, LayerState::Attention(_)));
        let at_depth = (!rewindable).then(|| st.snapshot());
        let mut next = prompt[0];
        let mut prefill = 0.0;
        if a.prompt_tokens > 0 {
            let t0 = Instant::now();
            let logits = model.forward(&mut st, &prompt, Logits::Last)?;
            next = argmax(&logits);
            prefill = t0.elapsed().as_secs_f64();
        }
        let mut speculator = match &plan {
            Some(p) => Some(p.speculator(model.sem.dims.n_vocab, &Default::default())?),
            None => None,
        };
        let mut ctx: Vec<u32> = fill.iter().chain(&prompt).copied().collect();
        if after_prompt {
            if a.prompt_tokens == 0 {
                bail!("decoding after the prompt needs a prompt: --prompt-tokens is 0");
            }
        } else {
            // Decode from the depth, as llama-bench's tg test does, so the
            // two engines decode over the same cache lengths.
            match &at_depth {
                Some(snap) => st.restore(snap),
                None => {
                    st.truncate(a.depth);
                }
            }
            ctx = fill.clone();
        }
        ctx.push(next);
        let mut sampler = Sampler::new(Default::default());
        let t1 = Instant::now();
        if schema.is_none() {
            let mut produced = 0;
            while produced < a.gen_tokens {
                let got = decode_step(&model, &mut st, &ctx, &mut sampler, speculator.as_mut())?;
                produced += got.len();
                ctx.extend(got);
            }
        }
        let mut constrain_s = 0.0;
        let mut c = schema.as_ref().map(|(c, _)| c.fork());
        // With --json-schema (which excludes drafting), plain greedy steps
        // under the constraint.
        let constrained = if schema.is_some() { a.gen_tokens } else { 0 };
        for _ in 0..constrained {
            let mut l = model.forward(&mut st, &[next], Logits::Last)?;
            if let (Some(c), Some((fresh, stops))) = (c.as_mut(), &schema) {
                let tc = Instant::now();
                c.mask(&mut l).map_err(anyhow::Error::msg)?;
                next = argmax(&l);
                // A finished object: start the next one.
                if stops.contains(&next) {
                    *c = fresh.fork();
                } else {
                    c.commit(next).map_err(anyhow::Error::msg)?;
                    if c.finished() {
                        *c = fresh.fork();
                    }
                }
                constrain_s += tc.elapsed().as_secs_f64();
                continue;
            }
            next = argmax(&l);
        }
        let decode = t1.elapsed().as_secs_f64();
        let r = Run {
            prompt_tps: if a.prompt_tokens > 0 {
                a.prompt_tokens as f64 / prefill
            } else {
                0.0
            },
            decode_tps: if a.gen_tokens > 0 {
                a.gen_tokens as f64 / decode
            } else {
                0.0
            },
            ttft_ms: prefill * 1e3,
            spec: speculator.map(|s| s.stats).unwrap_or_default(),
        };
        if schema.is_some() && a.gen_tokens > 0 {
            eprintln!(
                "[bench] run {}/{}: the --json-schema constraint took {:.1} us/token, {:.1} % of decode",
                rep + 1,
                a.repetitions,
                constrain_s * 1e6 / a.gen_tokens as f64,
                100.0 * constrain_s / decode
            );
        }
        eprintln!(
            "[bench] run {}/{}{at}: pp{} {:.1} tok/s, tg{} {:.1} tok/s, ttft {:.1} ms",
            rep + 1,
            a.repetitions,
            a.prompt_tokens,
            r.prompt_tps,
            a.gen_tokens,
            r.decode_tps,
            r.ttft_ms
        );
        if plan.is_some() {
            eprintln!(
                "[bench] run {}/{}: {} accepted of {} drafted ({:.1} %), {:.2} tokens per verify step",
                rep + 1,
                a.repetitions,
                r.spec.accepted,
                r.spec.drafted,
                100.0 * r.spec.acceptance(),
                r.spec.tokens_per_step()
            );
        }
        runs.push(r);
    }
    let stat = |f: fn(&Run) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        (v[0], median, v[n - 1])
    };
    let (pp_min, pp_med, pp_max) = stat(|r| r.prompt_tps);
    let (tg_min, tg_med, tg_max) = stat(|r| r.decode_tps);
    let (tt_min, tt_med, _) = stat(|r| r.ttft_ms);
    if a.json {
        let o = serde_json::json!({
            "model": a.model.model.display().to_string(),
            "prompt_tokens": a.prompt_tokens,
            "gen_tokens": a.gen_tokens,
            "depth": a.depth,
            "kv_type": model.kv_type().name(),
            "threads": model.threads(),
            "repetitions": a.repetitions,
            "prompt_tps": pp_med,
            "prompt_tps_min": pp_min,
            "prompt_tps_max": pp_max,
            "decode_tps": tg_med,
            "decode_tps_min": tg_min,
            "decode_tps_max": tg_max,
            "ttft_ms": tt_med,
            "ttft_ms_min": tt_min,
            "draft_acceptance": plan.as_ref().map(|_| runs[0].spec.acceptance()),
            "tokens_per_step": plan.as_ref().map(|_| runs[0].spec.tokens_per_step()),
        });
        println!("{o}");
    } else {
        println!("| test | median tok/s | min | max |");
        println!("|---|---|---|---|");
        if a.prompt_tokens > 0 {
            println!(
                "| pp{}{at} | {pp_med:.1} | {pp_min:.1} | {pp_max:.1} |",
                a.prompt_tokens
            );
        }
        if a.gen_tokens > 0 {
            println!(
                "| tg{}{at} | {tg_med:.1} | {tg_min:.1} | {tg_max:.1} |",
                a.gen_tokens
            );
        }
        if plan.is_some() {
            let s = runs[0].spec;
            println!(
                "drafting: {:.1} % of {} drafted tokens accepted, {:.2} tokens per verify step",
                100.0 * s.acceptance(),
                s.drafted,
                s.tokens_per_step()
            );
        }
        println!(
            "time to first token: median {tt_med:.1} ms, min {tt_min:.1} ms ({} threads, {} KV)",
            model.threads(),
            model.kv_type()
        );
    }
    Ok(())
}

/// `bench --mmproj`: images encoded per second by the tower in `path`, one
/// synthetic image (a fixed LCG's pixels, normalized values in -1..1) at
/// the tower's own size, one warm-up then `a.repetitions` timed encodes on
/// one thread pool of `--threads`.
fn bench_vision(path: &std::path::Path, a: &BenchArgs) -> Result<()> {
    let t0 = Instant::now();
    let tower = onebit_model::vision::VisionTower::open(path)?;
    let load_s = t0.elapsed().as_secs_f64();
    if a.model.verbose {
        for l in tower.lines() {
            eprintln!("[semantics] {l}");
        }
    }
    let p = tower.preprocess();
    let n = 3 * p.width as usize * p.height as usize;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let pixels: Vec<f32> = (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let pool = onebit_kernels::Pool::new(a.model.threads);
    let isa = onebit_kernels::Isa::best().name();
    let enc = || -> Result<f64> {
        let t = Instant::now();
        let e = tower.encode_with(&pool, &pixels)?;
        std::hint::black_box(&e.rows);
        Ok(t.elapsed().as_secs_f64())
    };
    let warm = enc()?;
    let mut secs = Vec::with_capacity(a.repetitions);
    for _ in 0..a.repetitions {
        secs.push(enc()?);
    }
    secs.sort_by(f64::total_cmp);
    let med = secs[secs.len() / 2];
    let (min, max) = (secs[0], secs[secs.len() - 1]);
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    let (w, h, toks) = (p.width, p.height, tower.n_tokens());
    if a.json {
        println!(
            "{{\"mmproj\": {:?}, \"projector\": {:?}, \"width\": {w}, \"height\": {h}, \"n_tokens\": {toks}, \"threads\": {}, \"isa\": {isa:?}, \"load_s\": {load_s:.3}, \"warmup_ms\": {:.1}, \"ms_per_image\": {:.1}, \"ms_min\": {:.1}, \"ms_max\": {:.1}, \"images_per_s\": {:.4}}}",
            name,
            p.projector,
            pool.threads(),
            warm * 1e3,
            med * 1e3,
            min * 1e3,
            max * 1e3,
            1.0 / med
        );
    } else {
        println!(
            "{name}: {} {w} x {h} -> {toks} tokens, {} threads, isa {isa}, loaded in {load_s:.2} s",
            p.projector,
            pool.threads()
        );
        println!(
            "encode: {:.4} images/s, {:.1} ms per image (median of {}; min {:.1}, max {:.1}; warm-up {:.1})",
            1.0 / med,
            med * 1e3,
            secs.len(),
            min * 1e3,
            max * 1e3,
            warm * 1e3
        );
    }
    Ok(())
}

/// `n` ids from the LCG whose state is `x`, each below `n_vocab`.
fn synthetic_ids(x: &mut u64, n: usize, n_vocab: u64) -> Vec<u32> {
    (0..n)
        .map(|_| {
            *x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*x >> 33) % n_vocab) as u32
        })
        .collect()
}

/// Median, min and max of `v` (not empty).
fn median_min_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (median, v[0], v[n - 1])
}

/// `--batch N`: N sequences, each filled with its own --depth ids
/// (untimed), then its own prompt (timed: the N prompts one after another,
/// each in one forward, as a server admits them), then --gen-tokens greedy
/// steps, each one forward of N rows, one token per sequence
/// (`Model::forward_batch`, whose rows give each sequence's logits exactly
/// as a forward of it alone would). Aggregate decode tok/s is N x
/// --gen-tokens over the decode time, as `llama-batched-bench`'s S_TG; per
/// sequence, --gen-tokens over it.
fn bench_batch(
    a: &BenchArgs,
    model: &onebit_model::Model,
    x: &mut u64,
    n_vocab: u64,
) -> Result<()> {
    let n = a.batch;
    if a.depth + a.prompt_tokens.max(1) + a.gen_tokens > model.max_context() {
        bail!(
            "a depth of {} plus {} prompt and {} generated tokens exceeds the context limit {} (--ctx)",
            a.depth,
            a.prompt_tokens,
            a.gen_tokens,
            model.max_context()
        );
    }
    // Per sequence: its depth ids, then its prompt (at least one id: the
    // first token decode starts from when --prompt-tokens is 0).
    let seqs: Vec<(Vec<u32>, Vec<u32>)> = (0..n)
        .map(|_| {
            let mut ids = synthetic_ids(x, a.depth + a.prompt_tokens.max(1), n_vocab);
            let prompt = ids.split_off(a.depth);
            (ids, prompt)
        })
        .collect();
    let at = if a.depth > 0 {
        format!(" @ d{}", a.depth)
    } else {
        String::new()
    };
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    for rep in 0..a.repetitions {
        let mut states: Vec<_> = (0..n).map(|_| model.new_state()).collect();
        for (st, (fill, _)) in states.iter_mut().zip(&seqs) {
            if !fill.is_empty() {
                model.forward(st, fill, Logits::None)?;
            }
        }
        let mut next: Vec<u32> = seqs.iter().map(|(_, p)| p[0]).collect();
        let t0 = Instant::now();
        if a.prompt_tokens > 0 {
            for ((st, (_, prompt)), nx) in states.iter_mut().zip(&seqs).zip(next.iter_mut()) {
                *nx = argmax(&model.forward(st, prompt, Logits::Last)?);
            }
        }
        let prefill = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for _ in 0..a.gen_tokens {
            let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
            let mut inputs: Vec<onebit_model::SeqInput> = states
                .iter_mut()
                .zip(&toks)
                .map(|(state, t)| onebit_model::SeqInput {
                    state,
                    tokens: t,
                    want: Logits::Last,
                })
                .collect();
            let logits = model.forward_batch(&mut inputs)?;
            for (nx, l) in next.iter_mut().zip(&logits) {
                *nx = argmax(l);
            }
        }
        let decode = t1.elapsed().as_secs_f64();
        let pp_tps = if a.prompt_tokens > 0 {
            (n * a.prompt_tokens) as f64 / prefill
        } else {
            0.0
        };
        let tg_tps = if a.gen_tokens > 0 {
            (n * a.gen_tokens) as f64 / decode
        } else {
            0.0
        };
        eprintln!(
            "[bench] run {}/{}{at}: {n} sequences, pp{} {:.1} tok/s, tg{} {:.1} tok/s aggregate, {:.1} per sequence",
            rep + 1,
            a.repetitions,
            a.prompt_tokens,
            pp_tps,
            a.gen_tokens,
            tg_tps,
            tg_tps / n as f64
        );
        pp.push(pp_tps);
        tg.push(tg_tps);
    }
    let (pp_med, pp_min, pp_max) = median_min_max(pp);
    let (tg_med, tg_min, tg_max) = median_min_max(tg);
    let per = n as f64;
    if a.json {
        let o = serde_json::json!({
            "model": a.model.model.display().to_string(),
            "batch": n,
            "prompt_tokens": a.prompt_tokens,
            "gen_tokens": a.gen_tokens,
            "depth": a.depth,
            "kv_type": model.kv_type().name(),
            "threads": model.threads(),
            "repetitions": a.repetitions,
            "prompt_tps": pp_med,
            "prompt_tps_min": pp_min,
            "prompt_tps_max": pp_max,
            "decode_tps": tg_med,
            "decode_tps_min": tg_min,
            "decode_tps_max": tg_max,
            "decode_tps_per_seq": tg_med / per,
        });
        println!("{o}");
    } else {
        println!("| test | median tok/s | min | max |");
        println!("|---|---|---|---|");
        if a.prompt_tokens > 0 {
            println!(
                "| pp{} x{n}{at} | {pp_med:.1} | {pp_min:.1} | {pp_max:.1} |",
                a.prompt_tokens
            );
        }
        if a.gen_tokens > 0 {
            println!(
                "| tg{} x{n}{at} | {tg_med:.1} | {tg_min:.1} | {tg_max:.1} |",
                a.gen_tokens
            );
            println!(
                "| tg{} x{n}{at} per sequence | {:.1} | {:.1} | {:.1} |",
                a.gen_tokens,
                tg_med / per,
                tg_min / per,
                tg_max / per
            );
        }
        println!(
            "{n} sequences decoded together: aggregate = {n} x per sequence ({} threads, {} KV)",
            model.threads(),
            model.kv_type()
        );
    }
    Ok(())
}

/// The compiled schema of `--json-schema` and the model's stop ids.
fn schema_constraint(
    path: &std::path::Path,
    opened: &onebit_model::load::Opened,
) -> Result<(onebit_serve::constrain::Constraint, Vec<u32>)> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--json-schema {}", path.display()))?;
    let schema: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("--json-schema {}: not JSON", path.display()))?;
    let tok = crate::open::tokenizer(opened)?;
    let stops = crate::open::stop_ids(&tok);
    let Some(&eos) = stops.first() else {
        bail!("the model declares no stop token, so --json-schema cannot end an object");
    };
    let c = onebit_serve::constrain::Constrainer::new(&tok, eos)
        .map_err(anyhow::Error::msg)?
        .compile(&onebit_serve::constrain::Grammar::JsonSchema(schema))
        .map_err(|e| anyhow::anyhow!("--json-schema {}: {e}", path.display()))?;
    Ok((c, stops))
}
