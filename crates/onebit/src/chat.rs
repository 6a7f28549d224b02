//! `onebit chat`: a conversation in the terminal. Each line of standard input
//! is one user message; the whole conversation is rendered with the model's
//! chat template each turn, and only the tokens past what the sequence state
//! already holds are run (the state is rewound to the common prefix when the
//! re-rendered history differs, e.g. a template that drops old reasoning).
//! The answer goes to stdout, one turn after another; a `> ` prompt and the
//! stats go to stderr, so a pipe drives it like a person at a terminal. A
//! line `/image FILE` attaches an image to the next message, ahead of its
//! text as Ollama places it (a model without a vision tower refuses it by
//! name); its rows are encoded once and kept, and a rewind that would land
//! inside an image goes back to its start (its rows run in one call).

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use onebit_model::sampler::{Sampler, SamplerConfig};
use onebit_model::Logits;
use onebit_text::StreamDecoder;
use serde_json::{json, Value};

use crate::open::{self, load_model, Loaded};
use crate::ModelArgs;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A Jinja chat template to use instead of the model's.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// A system message opening the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Tokens generated per answer at most.
    #[arg(long, default_value_t = 512)]
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
    /// The vision projector GGUF (`mmproj`) of a model that takes images;
    /// a line `/image FILE` then attaches an image to the next message.
    #[arg(long, value_name = "FILE")]
    mmproj: Option<PathBuf>,
}

/// Length of the longest common prefix.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

pub fn chat(a: ChatArgs) -> Result<()> {
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let Loaded { model, opened } = load_model(&a.model.model, &a.model.exec())?;
    onebit_serve::generative(&model.sem, &a.model.model.display().to_string())
        .map_err(|why| anyhow::anyhow!("cannot chat: {why}"))?;
    let tower = crate::vision::for_model(&a.model.model, a.mmproj.as_deref(), &model)?;
    open::print_semantics(&opened, &a.model.exec(), a.model.verbose);
    let tok = open::tokenizer(&opened)?;
    let (template, _) = open::load_chat_template(&opened, &tok, a.chat_template.as_deref())?
        .with_context(|| {
            format!(
                "{} has no chat template; pass one with --chat-template FILE",
                a.model.model.display()
            )
        })?;
    // The container (the file's mapping) is not held through the session.
    drop(opened);
    let stops = open::stop_ids(&tok);
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        ..SamplerConfig::default()
    });
    let mut messages: Vec<Value> = Vec::new();
    if let Some(s) = &a.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    let mut state = model.new_state();
    // The tokens `state` holds, in order.
    let mut held: Vec<u32> = Vec::new();
    // Images of the conversation so far, of the next message, and the
    // rows of each one encoded (by its pixels' hash).
    let mut images: Vec<onebit_image::Rgb8> = Vec::new();
    let mut attached = 0usize;
    let mut encoded: Vec<([u8; 32], onebit_model::vision::ImageEmbeddings)> = Vec::new();
    let interactive = std::io::stdin().is_terminal();
    let mut out = std::io::stdout().lock();
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("cannot read standard input")?;
        if line.trim().is_empty() {
            continue;
        }
        if let Some(path) = line.strip_prefix("/image ") {
            let img = crate::vision::load_image(std::path::Path::new(path.trim()))?;
            crate::vision::take_images(&a.model.model, tower.as_ref(), std::slice::from_ref(&img))?;
            images.push(img);
            attached += 1;
            continue;
        }
        let content = crate::vision::place_images(&line, attached)?;
        attached = 0;
        messages.push(json!({"role": "user", "content": content}));
        // As transformers: the template writes any BOS itself.
        let text = template.render(&Value::Array(messages.clone()), true, None)?;
        let (ids, places) = match tower.as_ref().filter(|_| !images.is_empty()) {
            Some(v) => {
                crate::vision::lay_out(&tok, &text, v, &images, |s, _| Ok(tok.encode(s, false)?))?
            }
            None => (tok.encode(&text, false)?, Vec::new()),
        };
        if ids.len() >= model.max_context() {
            bail!(
                "the conversation has grown to {} tokens, the context's limit is {} (--ctx)",
                ids.len(),
                model.max_context()
            );
        }
        let mut keep = common_prefix(&held, &ids).min(ids.len() - 1);
        if let Some(p) = places
            .iter()
            .find(|p| p.start < keep && keep < p.start + p.image.tokens)
        {
            keep = p.start;
        }
        if !state.truncate(keep) {
            state.reset();
            keep = 0;
        }
        held.truncate(keep);
        // The rows of the images still to run, each encoded once.
        let ahead: Vec<_> = places.iter().filter(|p| p.start >= keep).cloned().collect();
        for p in &ahead {
            if !encoded.iter().any(|(h, _)| *h == p.image.hash) {
                let v = tower.as_ref().context("images need a vision tower")?;
                let (mut rows, secs) =
                    crate::vision::encode(v, std::slice::from_ref(p), model.threads())?;
                eprintln!("[stats] image encoded in {secs:.3} s");
                encoded.push((p.image.hash, rows.remove(0)));
            }
        }
        let embeds: Vec<_> = ahead
            .iter()
            .filter_map(|p| {
                let (_, r) = encoded.iter().find(|(h, _)| *h == p.image.hash)?;
                Some(r.at(p.start - keep))
            })
            .collect();
        let mut logits = model.forward_embeds(&mut state, &ids[keep..], &embeds, Logits::Last)?;
        held.extend_from_slice(&ids[keep..]);

        let mut dec = StreamDecoder::new(&tok);
        let mut answer = String::new();
        let mut generated = 0usize;
        loop {
            let next = sampler.sample(&logits);
            if stops.contains(&next) {
                break;
            }
            let piece = dec.push(next)?;
            answer.push_str(&piece);
            out.write_all(piece.as_bytes())?;
            out.flush()?;
            generated += 1;
            if generated >= a.max_tokens || state.pos >= model.max_context() {
                break;
            }
            logits = model.forward(&mut state, &[next], Logits::Last)?;
            held.push(next);
        }
        let rest = dec.finish();
        answer.push_str(&rest);
        out.write_all(rest.as_bytes())?;
        out.write_all(b"\n")?;
        out.flush()?;
        messages.push(json!({"role": "assistant", "content": answer}));
    }
    Ok(())
}
