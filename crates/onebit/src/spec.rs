//! The drafting flags of `run`, `bench` and `serve` (`--lookup N`,
//! `--draft PATH`, `--draft-max K`) and the drafter they build: prompt
//! lookup, a draft model whose vocabulary is checked against the target's,
//! or both (lookup first, the model when lookup finds nothing). A draft
//! model runs on the target's thread pool: the two never run at once, and
//! one set of spinning workers keeps the other's from taking the cores.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Result};
use clap::Args;
use onebit_model::load::Opened;
use onebit_model::spec::{vocab_mismatch, DrafterSource, SpecPlan};
use onebit_model::{ExecConfig, Model};

use crate::open::{self, load_model, Loaded};

#[derive(Args, Clone, Debug, Default)]
pub struct SpecArgs {
    /// Speculative decoding by prompt lookup: guess the continuation of the
    /// latest earlier match of the last N tokens (else N - 1, ... 1) in the
    /// prompt and the output so far. With --draft: lookup first, the draft
    /// model when lookup finds no match.
    #[arg(long, value_name = "N")]
    pub lookup: Option<usize>,
    /// Speculative decoding with a draft model (a .gguf file or pack
    /// directory whose vocabulary equals the target's).
    #[arg(long, value_name = "PATH")]
    pub draft: Option<PathBuf>,
    /// The most tokens drafted per step; the draft length adapts below it
    /// to how many recent guesses were kept.
    #[arg(long, value_name = "K", default_value_t = 8)]
    pub draft_max: usize,
}

/// The plan the flags ask for (None without `--lookup`/`--draft`); a draft
/// model is loaded with the target's execution settings and refused when
/// its vocabulary differs, naming the first differing token.
pub fn plan(
    a: &SpecArgs,
    target: &Model,
    opened: &Opened,
    exec: &ExecConfig,
) -> Result<Option<SpecPlan>> {
    if a.draft_max == 0 {
        bail!("--draft-max must be at least 1");
    }
    if a.lookup == Some(0) {
        bail!("--lookup must be at least 1 (the longest n-gram matched)");
    }
    let model = match &a.draft {
        None => None,
        Some(path) => {
            let Loaded {
                mut model,
                opened: d,
            } = load_model(path, exec)?;
            let n_t = target.sem.dims.n_vocab;
            let n_d = model.sem.dims.n_vocab;
            let why = match (open::tokenizer(opened), open::tokenizer(&d)) {
                (Ok(tt), Ok(td)) => {
                    vocab_mismatch(n_t, |i| tt.id_to_token(i), n_d, |i| td.id_to_token(i))
                }
                // Without token texts (test fixtures) the sizes must agree.
                _ => {
                    (n_t != n_d).then(|| format!("the target has {n_t} tokens and the draft {n_d}"))
                }
            };
            if let Some(why) = why {
                bail!(
                    "draft model {} has another vocabulary than the target: {why}",
                    path.display()
                );
            }
            model.share_pool(target);
            Some(Arc::new(model))
        }
    };
    let source = match (a.lookup, model) {
        (Some(n), None) => DrafterSource::Lookup(n),
        (None, Some(m)) => DrafterSource::Model(m),
        (Some(n), Some(m)) => DrafterSource::LookupThenModel(n, m),
        (None, None) => return Ok(None),
    };
    Ok(Some(SpecPlan {
        source,
        draft_max: a.draft_max,
    }))
}
