//! The `onebit` command line. Every subcommand prints its result to stdout and
//! its diagnostics to stderr; a failure is one sentence naming the file, the
//! tensor or the key at fault, and a non-zero exit.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use onebit_kernels::Precision;
use onebit_model::load::{self, Container};
use onebit_model::sampler::{Sampler, SamplerConfig};
use onebit_model::spec::decode_step;
use onebit_model::state::KvType;
use onebit_model::{ExecConfig, Logits};
use onebit_text::StreamDecoder;

mod bench;
mod chat;
mod eval;
mod import;
mod models;
mod open;
use open::{load_model, Loaded};
mod serve;
mod spec;
mod vision;

#[derive(Parser)]
#[command(
    name = "onebit",
    version,
    about = "Quantized LLM inference on the CPU: GGUF files and FastFlowLM NPU2 packs, served over OpenAI's API"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate a continuation of a prompt (--prompt, else standard input);
    /// prints only the generated text.
    Run(RunArgs),
    /// A conversation in the terminal with the model's chat template: one
    /// user message per line of standard input, the answer on stdout.
    Chat(chat::ChatArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Print the embedding of each text as one JSON array per line: the final
    /// normed hidden states pooled as the model declares, L2-normalized.
    Embed {
        #[command(flatten)]
        model: ModelArgs,
        /// A text to embed (repeatable); without any, each line of standard
        /// input is one text.
        #[arg(long)]
        text: Vec<String>,
    },
    /// Print the token ids of a text as one JSON array.
    Tokenize {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long)]
        text: String,
        /// Special tokens off: no BOS/EOS added, and text that spells a
        /// control token (`<|im_end|>`) tokenized as plain text, which is how
        /// `onebit serve` encodes message content.
        #[arg(long)]
        no_special: bool,
    },
    /// Write the logits of every position of an id sequence (little-endian f32 [n_ids][n_vocab]).
    Logits {
        #[command(flatten)]
        model: ModelArgs,
        /// Comma-separated token ids.
        #[arg(long, value_delimiter = ',', required = true)]
        ids: Vec<u32>,
        #[arg(long)]
        out: PathBuf,
        /// One token per forward call instead of one batch.
        #[arg(long)]
        sequential: bool,
    },
    /// Print the model's semantics and a tensor census.
    Inspect {
        #[command(flatten)]
        model: ModelArgs,
        /// For a pack: check that its tiles read as the model they were
        /// written from (the tied output matrix's correlation with the
        /// embedding, and the rows of every matrix that decode to finite
        /// values); exits non-zero naming each tensor that fails.
        #[arg(long)]
        verify: bool,
    },
    /// Convert a GGUF file into a FastFlowLM pack directory.
    Import(import::ImportArgs),
    /// Teacher-forced top-1 accuracy and perplexity over a text file.
    Eval {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long)]
        text: PathBuf,
    },
    /// Measure prompt processing and decode speed.
    Bench(bench::BenchArgs),
    /// Fetch a model from the Hugging Face Hub (or HF_ENDPOINT) into the
    /// local store, the Hub's cache layout (HF_HUB_CACHE, else
    /// ~/.cache/huggingface/hub); prints the model's path.
    Pull(models::PullArgs),
    /// The models of the local store: name, family, quant, size, context, path.
    List,
    /// Remove a model from the local store.
    Rm(models::RmArgs),
}

impl Cmd {
    /// The model arguments of a command that loads one.
    fn model_args(&mut self) -> Option<&mut ModelArgs> {
        match self {
            Cmd::Run(a) => Some(&mut a.model),
            Cmd::Chat(a) => Some(&mut a.model),
            Cmd::Bench(a) => Some(&mut a.model),
            Cmd::Embed { model, .. }
            | Cmd::Tokenize { model, .. }
            | Cmd::Logits { model, .. }
            | Cmd::Inspect { model, .. }
            | Cmd::Eval { model, .. } => Some(model),
            Cmd::Serve(_) | Cmd::Import(_) | Cmd::Pull(_) | Cmd::List | Cmd::Rm(_) => None,
        }
    }
}

#[derive(Args)]
pub struct ModelArgs {
    /// A .gguf file, a pack directory, or a model of the local store by
    /// name (ORG/REPO[:QUANT], as `onebit pull` takes it). Required, except
    /// by `bench --mmproj` (checked in `main`).
    #[arg(long = "model", value_name = "MODEL")]
    pub model_arg: Option<PathBuf>,
    /// `--model` resolved to a path (set in `main`).
    #[arg(skip)]
    pub model: PathBuf,
    /// Pull the model named by --model first when the store lacks it.
    #[arg(long)]
    pub pull: bool,
    /// Worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Keep activations in f32 and dequantize weights (the slow reference path).
    #[arg(long)]
    pub f32_activations: bool,
    /// Context limit in tokens (0 = the model's trained context).
    #[arg(long, default_value_t = 0)]
    pub ctx: usize,
    /// What the KV cache stores: f32, f16 (half the memory) or q8_0 (about
    /// a quarter; needs head sizes that are multiples of 32).
    #[arg(long, default_value_t = KvType::F16)]
    pub kv_type: KvType,
    /// Print the model's `[semantics]` block (the rules it runs by, each with
    /// its source) on stderr while loading.
    #[arg(short, long)]
    pub verbose: bool,
}

impl ModelArgs {
    pub fn exec(&self) -> ExecConfig {
        ExecConfig {
            threads: self.threads,
            precision: if self.f32_activations {
                Precision::Float
            } else {
                Precision::Quantized
            },
            max_context: self.ctx,
            kv_type: self.kv_type,
        }
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt; without it (and without --ids), standard input is read
    /// to its end (less one final line end).
    #[arg(long, conflicts_with = "ids")]
    prompt: Option<String>,
    /// Comma-separated prompt token ids instead of --prompt (no tokenizer
    /// needed); the generated ids are printed as one JSON array.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["chat", "chat_template"])]
    ids: Option<Vec<u32>>,
    /// Apply the model's chat template to the prompt as one user message.
    #[arg(long)]
    chat: bool,
    /// A Jinja chat template to use instead of the model's (implies --chat).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The vision projector GGUF (`mmproj`) of a model that takes images,
    /// as llama.cpp's --mmproj (found beside a pulled model without it).
    #[arg(long, value_name = "FILE")]
    mmproj: Option<PathBuf>,
    /// An image (PNG, JPEG, WebP) placed before the prompt (repeatable;
    /// needs a vision tower).
    #[arg(long, value_name = "FILE", conflicts_with = "ids")]
    image: Vec<PathBuf>,
    #[command(flatten)]
    spec: spec::SpecArgs,
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    let vision_bench = matches!(&cli.cmd, Cmd::Bench(a) if a.mmproj.is_some());
    if let Some(m) = cli.cmd.model_args().filter(|_| !vision_bench) {
        let Some(arg) = m.model_arg.clone() else {
            eprintln!("error: the argument '--model <MODEL>' is required");
            return ExitCode::from(2);
        };
        match models::resolve(&arg, m.pull) {
            Ok(p) => m.model = p,
            Err(e) => {
                eprintln!("error: {}", error_text(&e));
                return ExitCode::FAILURE;
            }
        }
    }
    let r = match cli.cmd {
        Cmd::Run(a) => run(a),
        Cmd::Embed { model, text } => embed(model, text),
        Cmd::Chat(a) => chat::chat(a),
        Cmd::Serve(a) => serve::serve(a),
        Cmd::Tokenize {
            model,
            text,
            no_special,
        } => tokenize(model, &text, no_special),
        Cmd::Logits {
            model,
            ids,
            out,
            sequential,
        } => logits(model, &ids, &out, sequential),
        Cmd::Inspect { model, verify } => inspect(model, verify),
        Cmd::Import(a) => import::import(a),
        Cmd::Eval { model, text } => eval(model, &text),
        Cmd::Bench(a) => bench::bench(a),
        Cmd::Pull(a) => models::pull(a),
        Cmd::List => models::list(),
        Cmd::Rm(a) => models::rm(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: a cause whose text the message
/// already holds (an I/O error its caller quotes) is not repeated.
fn error_text(e: &anyhow::Error) -> String {
    let mut s = String::new();
    for cause in e.chain() {
        let t = cause.to_string();
        if s.contains(&t) {
            continue;
        }
        if !s.is_empty() {
            s.push_str(": ");
        }
        s.push_str(&t);
    }
    s
}

fn run(a: RunArgs) -> Result<()> {
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let prompt = match (&a.ids, a.prompt.clone()) {
        (Some(_), _) => None,
        (None, Some(p)) => Some(p),
        (None, None) => {
            let mut p = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut p)
                .context("cannot read the prompt from standard input (give it with --prompt)")?;
            // The line end `echo` or a text file puts after the last line.
            if p.ends_with('\n') {
                p.pop();
                if p.ends_with('\r') {
                    p.pop();
                }
            }
            Some(p)
        }
    };
    // Images are read and checked before the model loads: a bad one is
    // named at once.
    let images = a
        .image
        .iter()
        .map(|p| vision::load_image(p))
        .collect::<Result<Vec<_>>>()?;
    let exec = a.model.exec();
    let Loaded { model, opened } = load_model(&a.model.model, &exec)?;
    open::print_semantics(&opened, &exec, a.model.verbose);
    onebit_serve::generative(&model.sem, &a.model.model.display().to_string())
        .map_err(|why| anyhow::anyhow!("cannot run: {why}"))?;
    let tower = vision::for_model(&a.model.model, a.mmproj.as_deref(), &model)?;
    let vision = vision::take_images(&a.model.model, tower.as_ref(), &images)?
        .filter(|_| !images.is_empty());
    if let Some(ids) = &a.ids {
        if ids.is_empty() {
            bail!("--ids is empty");
        }
    }
    let tok = match &a.ids {
        Some(_) => None,
        None => Some(open::tokenizer(&opened)?),
    };
    // The images' places in the ids (mtmd's <__media__> markers, else
    // ahead of the prompt).
    let mut places = Vec::new();
    let ids = match (&a.ids, &tok, &prompt) {
        (Some(_), _, _) if vision.is_some() => {
            bail!("--image needs the prompt as text (--prompt), not --ids: ids give the image no place")
        }
        (Some(ids), _, _) => ids.clone(),
        (None, Some(tok), Some(prompt)) if a.chat || a.chat_template.is_some() => {
            let (template, _) = open::load_chat_template(&opened, tok, a.chat_template.as_deref())?
                .with_context(|| {
                    format!(
                        "{} has no chat template; pass one with --chat-template FILE",
                        a.model.model.display()
                    )
                })?;
            let content =
                vision::place_images(prompt, if vision.is_some() { images.len() } else { 0 })?;
            let messages = serde_json::json!([{"role": "user", "content": content}]);
            // As transformers: the template writes any BOS itself.
            let text = template.render(&messages, true, None)?;
            match vision {
                Some(v) => {
                    let (ids, at) =
                        vision::lay_out(tok, &text, v, &images, |s, _| Ok(tok.encode(s, false)?))?;
                    places = at;
                    ids
                }
                None => tok.encode(&text, false)?,
            }
        }
        (None, Some(tok), Some(prompt)) => match vision {
            Some(v) => {
                let text = vision::place_images(prompt, images.len())?;
                let (ids, at) =
                    vision::lay_out(tok, &text, v, &images, |s, bos| Ok(tok.encode(s, bos)?))?;
                places = at;
                ids
            }
            None => tok.encode(prompt, true)?,
        },
        _ => bail!("give --prompt TEXT, the prompt on standard input, or --ids 1,2,3"),
    };
    if ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    let stops = tok.as_ref().map(open::stop_ids).unwrap_or_default();
    let cfg = SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        ..SamplerConfig::default()
    };
    let plan = spec::plan(&a.spec, &model, &opened, &exec)?;
    let mut speculator = match &plan {
        Some(p) => Some(p.speculator(model.sem.dims.n_vocab, &cfg)?),
        None => None,
    };
    let mut sampler = Sampler::new(cfg);
    let mut state = model.new_state();

    // The images' rows, encoded by the tower (timed on its own).
    let (rows, encode_secs) = match vision {
        Some(v) => vision::encode(v, &places, model.threads())?,
        None => (Vec::new(), 0.0),
    };
    let embeds: Vec<_> = places
        .iter()
        .zip(&rows)
        .map(|(p, r)| r.at(p.start))
        .collect();
    let t0 = Instant::now();
    let logits = model.forward_embeds(&mut state, &ids, &embeds, Logits::Last)?;
    let prefill = t0.elapsed().as_secs_f64();

    let mut out = std::io::stdout().lock();
    let mut dec = tok.as_ref().map(StreamDecoder::new);
    let t1 = Instant::now();
    let mut ctx = ids.clone();
    let mut produced = vec![sampler.sample(&logits)];
    let mut generated = Vec::new();
    'gen: loop {
        for &next in &produced {
            if stops.contains(&next) {
                break 'gen;
            }
            if let Some(dec) = &mut dec {
                out.write_all(dec.push(next)?.as_bytes())?;
                out.flush()?;
            }
            generated.push(next);
            ctx.push(next);
            if generated.len() >= a.max_tokens || state.pos >= model.max_context() {
                break 'gen;
            }
        }
        produced = decode_step(&model, &mut state, &ctx, &mut sampler, speculator.as_mut())?;
    }
    match dec {
        Some(mut dec) => out.write_all(dec.finish().as_bytes())?,
        None => writeln!(out, "{}", serde_json::to_string(&generated)?)?,
    }
    out.flush()?;
    let decode = t1.elapsed().as_secs_f64();
    if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        eprintln!();
    }
    let generated = generated.len();
    eprintln!(
        "[stats] prompt tokens {}, prefill {:.1} tok/s, generated {}, decode {:.1} tok/s",
        ids.len(),
        ids.len() as f64 / prefill,
        generated,
        // the first generated token came from the prefill's logits
        if generated > 1 {
            (generated - 1) as f64 / decode
        } else {
            0.0
        },
    );
    if !places.is_empty() {
        eprintln!(
            "[stats] images {}, encoded in {:.3} s ({:.2} images/s)",
            places.len(),
            encode_secs,
            places.len() as f64 / encode_secs.max(1e-9)
        );
    }
    if let Some(sp) = &speculator {
        let s = sp.stats;
        eprintln!(
            "[spec] {} verify steps, {} drafted, {} accepted ({:.1} %), {:.2} tokens per step",
            s.steps,
            s.drafted,
            s.accepted,
            100.0 * s.acceptance(),
            s.tokens_per_step()
        );
    }
    Ok(())
}

fn embed(a: ModelArgs, texts: Vec<String>) -> Result<()> {
    let texts = if texts.is_empty() {
        std::io::stdin()
            .lines()
            .collect::<std::io::Result<Vec<String>>>()
            .context("cannot read the texts from standard input (give them with --text)")?
            .into_iter()
            .filter(|l| !l.trim().is_empty())
            .collect()
    } else {
        texts
    };
    let Loaded { model, opened } = load_model(&a.model, &a.exec())?;
    open::print_semantics(&opened, &a.exec(), a.verbose);
    let pooling = open::pooling(&opened)
        .map_err(|why| anyhow::anyhow!("{}: cannot give embeddings: {why}", a.model.display()))?;
    if a.verbose {
        eprintln!("[embed] pooling: {:?} <- {}", pooling.kind, pooling.source);
    }
    let tok = open::tokenizer(&opened)?;
    drop(opened);
    let mut out = std::io::stdout().lock();
    for (i, t) in texts.iter().enumerate() {
        let ids = tok.encode(t, true)?;
        if ids.is_empty() {
            bail!("text {i} encodes to no tokens");
        }
        let mut state = model.new_state();
        let rows = model.forward(&mut state, &ids, Logits::Hidden)?;
        let v = pooling.pool_through(&rows, model.sem.dims.n_embd, |v| model.pooled_head(v));
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
    }
    Ok(())
}

fn tokenize(a: ModelArgs, text: &str, no_special: bool) -> Result<()> {
    let tok = open::tokenizer(&load::open(&a.model)?)?;
    let ids = if no_special {
        tok.encode_plain(text)?
    } else {
        tok.encode(text, true)?
    };
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

fn logits(a: ModelArgs, ids: &[u32], out: &std::path::Path, sequential: bool) -> Result<()> {
    let Loaded { model, opened } = load_model(&a.model, &a.exec())?;
    open::print_semantics(&opened, &a.exec(), a.verbose);
    drop(opened);
    let mut state = model.new_state();
    let all = if sequential {
        let mut v = Vec::new();
        for &id in ids {
            v.extend(model.forward(&mut state, &[id], Logits::Last)?);
        }
        v
    } else {
        model.forward(&mut state, ids, Logits::All)?
    };
    let bytes: Vec<u8> = all.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(out, bytes).with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!(
        "[logits] {} positions x {} vocab -> {}",
        ids.len(),
        model.sem.dims.n_vocab,
        out.display()
    );
    Ok(())
}

fn eval(a: ModelArgs, text: &std::path::Path) -> Result<()> {
    let body =
        std::fs::read_to_string(text).with_context(|| format!("cannot read {}", text.display()))?;
    let Loaded { model, opened } = load_model(&a.model, &a.exec())?;
    open::print_semantics(&opened, &a.exec(), a.verbose);
    let tok = open::tokenizer(&opened)?;
    let ids = tok.encode(&body, true)?;
    let r = eval::eval(&model, &ids)?;
    println!(
        "{}",
        serde_json::json!({
            "model": a.model.display().to_string(),
            "predicted": r.tokens,
            "correct": r.correct,
            "top1": r.top1(),
            "perplexity": r.perplexity(),
        })
    );
    eprintln!(
        "[eval] {} predictions, top-1 {:.2} %, perplexity {:.3}",
        r.tokens,
        100.0 * r.top1(),
        r.perplexity()
    );
    Ok(())
}

fn inspect(a: ModelArgs, verify: bool) -> Result<()> {
    let opened = load::open(&a.model)?;
    if verify && !matches!(opened.container, Container::Pack(_)) {
        bail!(
            "--verify checks a FastFlowLM pack's tiles; {} is a GGUF file",
            a.model.display()
        );
    }
    for l in open::semantics_lines(&opened, &a.exec()) {
        println!("[semantics] {l}");
    }
    let g = match &opened.container {
        Container::Gguf(g) => g,
        Container::Pack(p) => {
            println!(
                "[file] {} FastFlowLM pack ({} family table), {} tensors",
                a.model.display(),
                p.family.arch,
                p.tensors.len() + p.unmapped.len()
            );
            if let Some((_, src)) = p.chat_template() {
                println!("[file] chat template from {src}");
            }
            for l in p.census() {
                println!("[tensors] {l}");
            }
            match onebit_model::pack::vision::open(p.dir()) {
                Ok(None) => {}
                Ok(Some(v)) => {
                    println!(
                        "[file] {}: the {} vision tower, {} tensors ({})",
                        onebit_model::pack::vision::VISION_WEIGHTS,
                        v.layout.projector,
                        v.tensor_names().len(),
                        v.layout.source
                    );
                    for l in v.tower.lines() {
                        println!("[semantics] {l}");
                    }
                }
                Err(e) => println!(
                    "[file] {}: not read: {e}",
                    onebit_model::pack::vision::VISION_WEIGHTS
                ),
            }
            if verify {
                verify_pack(p)?;
            }
            return Ok(());
        }
    };
    println!(
        "[file] {} GGUF v{}, {} tensors, {} metadata keys",
        a.model.display(),
        g.version,
        g.tensors.len(),
        g.metadata.len()
    );
    let mut census: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    for t in &g.tensors {
        let e = census.entry(t.dtype.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    for (ty, (n, bytes)) in census {
        println!(
            "[tensors] {ty}: {n} tensors, {:.1} MiB",
            bytes as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}

/// `inspect --verify` on a pack: one line per check, an error naming every
/// tensor that failed.
fn verify_pack(p: &onebit_model::pack::Pack) -> Result<()> {
    use onebit_model::pack::verify::{self, Tie};
    let r = verify::verify(p)?;
    match &r.tie {
        Tie::Checked {
            output,
            embedding,
            correlation,
            values,
            source,
        } => println!(
            "[verify] tie: {output} vs {embedding}: correlation {correlation:.4} over {values} values (tied: {source}; at least {} passes)",
            verify::MIN_TIE_CORRELATION
        ),
        Tie::NotChecked(why) => println!("[verify] tie: not checked: {why}"),
    }
    for m in &r.matrices {
        println!(
            "[verify] {} ({}): {:.2} % of {} rows finite",
            m.pack_name,
            m.form,
            100.0 * m.fraction(),
            m.rows
        );
    }
    for c in &r.layout {
        match &c.failure {
            None if c.values == 0 => println!("[verify] layout: {}", c.what),
            None => println!("[verify] layout: {}: {} bytes agree", c.what, c.values),
            Some(f) => println!("[verify] layout: {}: FAILS: {f}", c.what),
        }
    }
    let failures = r.failures();
    if !failures.is_empty() {
        bail!(
            "{} fails verification: {}",
            p.dir().display(),
            failures.join("; ")
        );
    }
    println!(
        "[verify] ok: {} matrices, every row finite{}{}",
        r.matrices.len(),
        if matches!(r.tie, Tie::Checked { .. }) {
            ", the output matrix reads as the embedding"
        } else {
            ""
        },
        if r.layout.is_empty() {
            ""
        } else {
            ", the layout's checks pass"
        }
    );
    Ok(())
}
