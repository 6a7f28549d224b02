//! `onebit serve`: load the model, its tokenizer, chat template and stop ids,
//! and hand them to `onebit-serve`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use onebit_kernels::Precision;
use onebit_model::ExecConfig;
use onebit_serve::ServeConfig;
use onebit_text::ChatLimits;

use crate::open::{self, load_model, Loaded};

#[derive(Args)]
pub struct ServeArgs {
    /// A .gguf file or a pack directory.
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port; the startup line names it.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// A Jinja chat template to use instead of the model's.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// Worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Requests (sequences) waiting for a slot at most; beyond, 503.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Sequences decoded together in one forward at most.
    #[arg(long, default_value_t = 8)]
    max_seqs: usize,
    /// Context limit per sequence in tokens (0 = the model's trained context).
    #[arg(long, default_value_t = 0)]
    ctx: usize,
    /// Do not reuse the states of earlier requests that share a prefix.
    #[arg(long)]
    no_prefix_cache: bool,
    /// Memory the prefix cache may hold, in MiB.
    #[arg(long, default_value_t = 1024)]
    cache_mib: usize,
    /// Largest `n` (choices per request) accepted.
    #[arg(long, default_value_t = 8)]
    max_n: usize,
    /// Largest `max_tokens` a request may ask for, and the default when it
    /// asks none (0 = up to the context).
    #[arg(long, default_value_t = 0)]
    max_tokens: usize,
    /// Largest request body accepted, in MiB; beyond, 413.
    #[arg(long, default_value_t = 4)]
    max_body_mib: usize,
    /// Largest prompt the chat template may render, in KiB; beyond, 400.
    #[arg(long, default_value_t = 8192)]
    max_template_kib: usize,
    /// Keep activations in f32 and dequantize weights (the slow reference path).
    #[arg(long)]
    f32_activations: bool,
    /// After SIGTERM or SIGINT, seconds running requests may take to finish
    /// before the process exits anyway. /health answers 503 from the signal
    /// on, and no new connection is accepted.
    #[arg(long, default_value_t = 25.0, value_name = "SECONDS")]
    shutdown_timeout: f64,
}

pub fn serve(a: ServeArgs) -> Result<()> {
    let exec = ExecConfig {
        threads: a.threads,
        precision: if a.f32_activations {
            Precision::Float
        } else {
            Precision::Quantized
        },
        max_context: a.ctx,
    };
    if !(a.shutdown_timeout.is_finite() && a.shutdown_timeout >= 0.0) {
        anyhow::bail!(
            "--shutdown-timeout must be a number of seconds >= 0, got {}",
            a.shutdown_timeout
        );
    }
    let name = a
        .model
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| a.model.display().to_string());
    let cfg = ServeConfig {
        host: a.host,
        port: a.port,
        model_name: name,
        max_seqs: a.max_seqs.max(1),
        max_queue: a.max_queue,
        max_n: a.max_n.max(1),
        max_tokens: a.max_tokens,
        max_body_bytes: a.max_body_mib.saturating_mul(1 << 20),
        prefix_cache: !a.no_prefix_cache,
        cache_bytes: a.cache_mib << 20,
        shutdown_timeout: std::time::Duration::from_secs_f64(a.shutdown_timeout),
        ..ServeConfig::default()
    };
    let (path, chat_template, max_template_kib) = (a.model, a.chat_template, a.max_template_kib);
    onebit_serve::serve(cfg, move || {
        load(&path, &exec, chat_template.as_deref(), max_template_kib)
    })
}

/// The model, tokenizer, chat template and stop ids, as the server runs them.
fn load(
    path: &Path,
    exec: &ExecConfig,
    chat_template: Option<&Path>,
    max_template_kib: usize,
) -> Result<onebit_serve::Loaded> {
    let Loaded { model, opened } = load_model(path, exec)?;
    let tok = open::tokenizer(&opened)?;
    let limits = ChatLimits {
        max_output_bytes: max_template_kib.saturating_mul(1 << 10),
        ..ChatLimits::default()
    };
    let template = match open::load_chat_template_with(&opened, &tok, chat_template, limits)? {
        Some((t, from)) => {
            eprintln!("[serve] chat template from {from}");
            Some(t)
        }
        None => {
            eprintln!(
                "[serve] {} has no chat template: chat requests will be refused (pass --chat-template FILE)",
                path.display()
            );
            None
        }
    };
    let stops = open::stop_ids(&tok);
    let summary = opened.sem.lines().into_iter().next().unwrap_or_default();
    Ok(onebit_serve::Loaded {
        model,
        tok,
        template,
        stops,
        summary,
    })
}
