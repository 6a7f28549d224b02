//! A model path as the commands use it: the runnable model, its tokenizer,
//! chat template and stop rules, whichever container they come from.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use onebit_model::load::{self, Container, Opened};
use onebit_model::{ExecConfig, Model};
use onebit_text::Tokenizer;

pub struct Loaded {
    pub model: Model,
    pub opened: Opened,
}

/// Opens and loads a model, printing its `[semantics]` lines and load time.
pub fn load_model(path: &Path, exec: &ExecConfig) -> Result<Loaded> {
    let t = Instant::now();
    let opened = load::open(path)?;
    for l in opened.sem.lines() {
        eprintln!("[semantics] {l}");
    }
    let model = opened.load(exec)?;
    eprintln!(
        "[load] {} in {:.2} s, {} threads",
        path.display(),
        t.elapsed().as_secs_f64(),
        model.threads()
    );
    Ok(Loaded { model, opened })
}

/// The tokenizer a container carries.
pub fn tokenizer(opened: &Opened) -> Result<Tokenizer> {
    match &opened.container {
        Container::Gguf(g) => Tokenizer::from_gguf(g)
            .with_context(|| format!("{}: cannot build the tokenizer", g.path().display())),
    }
}

/// Every end-of-generation id the tokenizer knows (EOS, EOT, turn ends).
pub fn stop_ids(tok: &Tokenizer) -> Vec<u32> {
    let mut s = tok.special().stop_ids();
    for name in ["<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>"] {
        if let Some(id) = tok.token_to_id(name) {
            s.push(id);
        }
    }
    s.sort_unstable();
    s.dedup();
    s
}
