//! `onebit serve`: the models to serve (`--model` repeated, `--models-dir`),
//! each with its name and a loader for the model, its tokenizer, chat
//! template and stop ids, handed to `onebit-serve`, which loads them on
//! demand.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use onebit_kernels::Precision;
use onebit_model::state::KvType;
use onebit_model::ExecConfig;
use onebit_serve::fields::parse_keep_alive;
use onebit_serve::{ModelSource, ServeConfig};
use onebit_text::ChatLimits;

use crate::open::{self, load_model, Loaded};

#[derive(Args)]
pub struct ServeArgs {
    /// A .gguf file or a pack directory to serve, as `PATH` (named by its
    /// file stem or directory name) or `NAME=PATH`. Repeatable: the
    /// request's `model` picks one by name; the first is the default, for
    /// requests that name none, and loads at start.
    #[arg(long, value_name = "[NAME=]PATH")]
    model: Vec<String>,
    /// Serve every .gguf file and pack directory in DIR too (after the
    /// --model ones), each named by its file stem or directory name.
    #[arg(long, value_name = "DIR")]
    models_dir: Option<PathBuf>,
    /// Serve every model of the local store too (`onebit list`; the Hub's
    /// cache layout), each named as `onebit list` prints it.
    #[arg(long)]
    store: bool,
    /// Pull a --model given by name (ORG/REPO[:QUANT]) that the store lacks.
    #[arg(long)]
    pull: bool,
    /// Models loaded at once at most; a request for another unloads the
    /// least recently used.
    #[arg(long, default_value_t = 1)]
    max_loaded: usize,
    /// Memory the loaded models may take together (512M, 8G, 16GiB or
    /// bytes), each counted as its file plus --max-seqs states at the full
    /// context plus its prefix cache; loading one more unloads the least
    /// recently used until it fits, and a model whose file alone is larger
    /// is refused (503). Default: no bound but --max-loaded.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<u64>,
    /// How long a model stays loaded after its last request, unless the
    /// request's Ollama `keep_alive` says otherwise: seconds or a duration
    /// (5m, 1h, 30s); negative: never unload.
    #[arg(long, default_value = "5m", value_parser = parse_keep_alive)]
    idle_unload: onebit_serve::fields::KeepAlive,
    /// Speculative decoding for every request that does not send
    /// `"speculative": false`.
    #[command(flatten)]
    spec: crate::spec::SpecArgs,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port; the startup line names it.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// A Jinja chat template to use instead of the model's.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// The vision projector GGUF (`mmproj`) of the first --model, as
    /// llama-server's --mmproj; without it, a model pulled with a projector
    /// beside it uses that one. Without a tower, images are refused.
    #[arg(long, value_name = "FILE")]
    mmproj: Option<PathBuf>,
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
    /// Memory the prefix cache may hold, in MiB (default: one sequence's
    /// state at the full context, at most 1024).
    #[arg(long)]
    cache_mib: Option<usize>,
    /// Largest `n` (choices per request) accepted.
    #[arg(long, default_value_t = 8)]
    max_n: usize,
    /// Largest `max_tokens` a request may ask for, and the default when it
    /// asks none (0 = up to the context).
    #[arg(long, default_value_t = 4096)]
    max_tokens: usize,
    /// Largest request body accepted, in MiB; beyond, 413.
    #[arg(long, default_value_t = 4)]
    max_body_mib: usize,
    /// Largest prompt the chat template may render, in KiB; beyond, 400.
    #[arg(long, default_value_t = 8192)]
    max_template_kib: usize,
    /// Prompt tokens prefilled per engine step, over all sequences; decode
    /// steps of running sequences interleave between chunks.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// While any sequence is decoding, a step runs only the prompt tokens
    /// the machine runs in this many milliseconds (its measured rate), so a
    /// stream's gap between tokens stays near this while a long prompt or an
    /// embedding request is prefilled (0: --prefill-chunk alone).
    #[arg(long, default_value_t = 300)]
    max_step_ms: u64,
    /// A key clients must send as `Authorization: Bearer KEY` on /v1/* and
    /// /metrics (repeatable). Also read from ONEBIT_API_KEY, which keeps it
    /// out of the process list. Without any key the server is open.
    #[arg(long, value_name = "KEY")]
    api_key: Vec<String>,
    /// A file of API keys, one per line (blank lines and # comments skipped).
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// Let /metrics answer without a key.
    #[arg(long)]
    metrics_public: bool,
    /// A host name the `Host` header may carry besides localhost, the --host
    /// value and IP addresses (repeatable; `*` accepts any). Other names get
    /// 403, which stops DNS-rebinding pages.
    #[arg(long, value_name = "NAME")]
    allow_host: Vec<String>,
    /// A browser origin allowed to call the API, e.g. https://app.example
    /// (repeatable; `*` for any). Without one, CORS is off.
    #[arg(long, value_name = "ORIGIN")]
    cors_origin: Vec<String>,
    /// Seconds a connection may take to send a request head, counted from
    /// its opening or the end of its previous response (so also the idle
    /// keep-alive limit).
    #[arg(long, default_value_t = 10)]
    header_timeout: u64,
    /// Seconds a request body may take to arrive whole; beyond, 408.
    #[arg(long, default_value_t = 30)]
    body_timeout: u64,
    /// Open connections at most; beyond, the oldest idle one is closed, or
    /// the new one when all are busy.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Seconds SIGTERM/SIGINT lets running requests finish before exiting.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
    /// Tokenize control-token text typed inside message content (e.g.
    /// `<|im_end|>`) as the control tokens; by default it is plain text, so a
    /// user message cannot forge the template's turns.
    #[arg(long)]
    allow_special_in_content: bool,
    /// Refuse (400, naming them) request fields this server does not read;
    /// by default they are answered, named in the `x-onebit-ignored-fields`
    /// header and the log.
    #[arg(long)]
    strict_fields: bool,
    /// How the access log (one line per request on stderr: method, route,
    /// status, model, tokens, time to first token, duration) is written:
    /// text (`key=value` words) or json (one object per line).
    #[arg(long, value_enum, default_value_t = LogFormatArg::Text)]
    log_format: LogFormatArg,
    /// Keep activations in f32 and dequantize weights (the slow reference path).
    #[arg(long)]
    f32_activations: bool,
    /// What the KV cache stores: f32, f16 (half the memory) or q8_0 (about
    /// a quarter; needs head sizes that are multiples of 32).
    #[arg(long, default_value_t = KvType::F16)]
    kv_type: KvType,
    /// Print the model's `[semantics]` block (its rules, each with its
    /// source) on stderr while loading.
    #[arg(short, long)]
    verbose: bool,
}

/// `--log-format` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

/// The keys from --api-key, ONEBIT_API_KEY and --api-key-file.
fn api_keys(a: &ServeArgs) -> Result<Vec<String>> {
    let mut keys: Vec<String> = a.api_key.clone();
    if let Ok(k) = std::env::var("ONEBIT_API_KEY") {
        if !k.trim().is_empty() {
            keys.push(k.trim().to_string());
        }
    }
    if let Some(f) = &a.api_key_file {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the API key file {}", f.display()))?;
        let before = keys.len();
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_string),
        );
        if keys.len() == before {
            bail!(
                "the API key file {} holds no key (one per line)",
                f.display()
            );
        }
    }
    if let Some(bad) = keys
        .iter()
        .find(|k| k.is_empty() || k.chars().any(char::is_whitespace))
    {
        bail!("API key {bad:?} is empty or holds whitespace; keys are sent as `Authorization: Bearer KEY`");
    }
    Ok(keys)
}

pub fn serve(a: ServeArgs) -> Result<()> {
    let api_keys = api_keys(&a)?;
    let exec = ExecConfig {
        threads: a.threads,
        precision: if a.f32_activations {
            Precision::Float
        } else {
            Precision::Quantized
        },
        max_context: a.ctx,
        kv_type: a.kv_type,
    };
    let paths = models(&a.model, a.models_dir.as_deref(), a.store, a.pull)?;
    if paths.len() > 1 && (a.spec.lookup.is_some() || a.spec.draft.is_some()) {
        bail!(
            "--lookup and --draft serve one model; {} are given (--model, --models-dir)",
            paths.len()
        );
    }
    let cfg = ServeConfig {
        host: a.host,
        port: a.port,
        max_loaded: a.max_loaded.max(1),
        max_memory: a.max_memory,
        idle_unload: a.idle_unload,
        max_seqs: a.max_seqs.max(1),
        max_queue: a.max_queue,
        max_n: a.max_n.max(1),
        max_tokens: a.max_tokens,
        max_body_bytes: a.max_body_mib.saturating_mul(1 << 20),
        prefix_cache: !a.no_prefix_cache,
        cache_bytes: a.cache_mib.map(|m| m << 20),
        prefill_chunk: a.prefill_chunk.max(1),
        max_step: Duration::from_millis(a.max_step_ms),
        access: onebit_serve::access::Access {
            api_keys,
            metrics_public: a.metrics_public,
            allow_hosts: a
                .allow_host
                .iter()
                .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
                .collect(),
            bound_host: String::new(),
            cors_origins: Vec::new(),
        },
        cors_origins: a.cors_origin,
        header_timeout: Duration::from_secs(a.header_timeout.max(1)),
        body_timeout: Duration::from_secs(a.body_timeout.max(1)),
        max_connections: a.max_connections.max(1),
        shutdown_timeout: Duration::from_secs(a.shutdown_timeout),
        allow_special_in_content: a.allow_special_in_content,
        strict_fields: a.strict_fields,
        log_format: match a.log_format {
            LogFormatArg::Text => onebit_serve::reqlog::LogFormat::Text,
            LogFormatArg::Json => onebit_serve::reqlog::LogFormat::Json,
        },
    };
    let how = Arc::new(HowToLoad {
        exec,
        chat_template: a.chat_template,
        max_template_kib: a.max_template_kib,
        spec: Arc::new(a.spec),
        verbose: a.verbose,
    });
    let mut mmproj = a.mmproj;
    let sources = paths
        .into_iter()
        .map(|(name, path)| how.source(name, path, mmproj.take()))
        .collect();
    let catalog: Arc<dyn onebit_serve::app::Catalog> = Arc::new(StoreCatalog { how });
    onebit_serve::serve_with(cfg, sources, Some(catalog))
}

/// What every model served is loaded with.
struct HowToLoad {
    exec: ExecConfig,
    chat_template: Option<PathBuf>,
    max_template_kib: usize,
    spec: Arc<crate::spec::SpecArgs>,
    verbose: bool,
}

impl HowToLoad {
    fn source(
        self: &Arc<Self>,
        name: String,
        path: PathBuf,
        mmproj: Option<PathBuf>,
    ) -> ModelSource {
        let how = self.clone();
        ModelSource {
            name,
            bytes: size_of(&path),
            load: Arc::new(move || {
                load(
                    &path,
                    &how.exec,
                    how.chat_template.as_deref(),
                    how.max_template_kib,
                    &how.spec,
                    how.verbose,
                    mmproj.as_deref(),
                )
            }),
        }
    }
}

/// `/api/pull` and `/api/delete`: the local store and the Hub behind it
/// (`HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_CACHE` as `onebit pull` reads them).
struct StoreCatalog {
    how: Arc<HowToLoad>,
}

impl onebit_serve::app::Catalog for StoreCatalog {
    fn pull(
        &self,
        name: &str,
        step: &mut dyn FnMut(onebit_serve::app::PullStep),
    ) -> std::result::Result<ModelSource, (u16, String)> {
        let r = onebit_hub::Ref::parse(name).map_err(|e| (400, e))?;
        let store = onebit_hub::Store::from_env();
        let hub = onebit_hub::client::Hub::from_env();
        let mut progress = Steps {
            step,
            hash: String::new(),
            total: 0,
            done: 0,
            last: std::time::Instant::now(),
        };
        let pulled = onebit_hub::pull(&hub, &store, &r, &Default::default(), &mut progress)
            .map_err(|e| {
                let status = if e.contains("not found on the Hub")
                    || e.contains("has no GGUF file of quant")
                {
                    404
                } else if e.contains("HF_TOKEN") {
                    403
                } else {
                    502
                };
                (status, e)
            })?;
        eprintln!("[serve] pulled {name}: {}", pulled.local.path.display());
        Ok(self.how.source(name.to_string(), pulled.local.path, None))
    }

    fn delete(&self, name: &str) -> std::result::Result<(), (u16, String)> {
        let r = onebit_hub::Ref::parse(name)
            .map_err(|e| (404, format!("model {name:?} is not in the store: {e}")))?;
        onebit_hub::Store::from_env()
            .remove(&r)
            .map(|_| ())
            .map_err(|e| (404, e))
    }
}

/// A pull's progress as `/api/pull` steps, a file's at most every 100 ms.
struct Steps<'a> {
    step: &'a mut dyn FnMut(onebit_serve::app::PullStep),
    hash: String,
    total: u64,
    done: u64,
    last: std::time::Instant,
}

impl Steps<'_> {
    fn file(&mut self) {
        (self.step)(onebit_serve::app::PullStep::File {
            digest: self.hash.clone(),
            total: self.total,
            completed: self.done,
        });
        self.last = std::time::Instant::now();
    }
}

impl onebit_hub::Progress for Steps<'_> {
    fn begin(&mut self, _file: &str, hash: &str, total: u64, have: u64) {
        if !hash.is_empty() {
            self.hash = hash.to_string();
        }
        self.total = total;
        self.done = have;
        self.file();
    }
    fn advance(&mut self, n: u64) {
        self.done += n;
        if self.last.elapsed() >= Duration::from_millis(100) {
            self.file();
        }
    }
    fn end(&mut self, _file: &str, _fetched: bool) {
        self.done = self.total;
        self.file();
    }
    fn note(&mut self, msg: &str) {
        (self.step)(onebit_serve::app::PullStep::Status(msg.to_string()));
    }
}

/// The (name, path) of every model to serve: each `--model [NAME=]PATH`
/// (a PATH that does not exist but reads as ORG/REPO[:QUANT] is a model of
/// the store, named so), then every .gguf file and directory in `dir`,
/// sorted, then with `store` every model of the store; a name given twice
/// is refused with both paths.
fn models(
    args: &[String],
    dir: Option<&Path>,
    store: bool,
    pull: bool,
) -> Result<Vec<(String, PathBuf)>> {
    let mut out: Vec<(String, PathBuf)> = Vec::new();
    for arg in args {
        let (name, path) = match arg.split_once('=') {
            Some((n, p)) if !Path::new(arg).exists() && !n.is_empty() && !n.contains('/') => {
                (Some(n.to_string()), PathBuf::from(p))
            }
            _ => (None, PathBuf::from(arg)),
        };
        let by_name = !path.exists() && onebit_hub::Ref::looks_like(&path.to_string_lossy());
        let resolved = crate::models::resolve(&path, pull)?;
        let name = match name {
            Some(n) => n,
            None if by_name => onebit_hub::Ref::parse(&path.to_string_lossy())
                .map_err(anyhow::Error::msg)?
                .to_string(),
            None => stem(&path),
        };
        out.push((name, resolved));
    }
    if let Some(dir) = dir {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read --models-dir {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_dir()
                    || p.extension().is_some_and(|x| x == "gguf") && !stem(p).starts_with("mmproj")
            })
            .collect();
        found.sort();
        if found.is_empty() {
            bail!(
                "--models-dir {} holds no .gguf file or pack directory",
                dir.display()
            );
        }
        out.extend(found.into_iter().map(|p| (stem(&p), p)));
    }
    if store {
        let s = onebit_hub::Store::from_env();
        let found = s.list();
        if found.is_empty() && out.is_empty() {
            bail!(
                "--store: the store {} holds no model (`onebit pull ORG/REPO[:QUANT]` fetches one)",
                s.root.display()
            );
        }
        for l in found {
            if !out.iter().any(|(_, p)| *p == l.path) {
                out.push((l.name, l.path));
            }
        }
    }
    if out.is_empty() {
        bail!("no model to serve: give --model PATH (repeatable), --models-dir DIR or --store");
    }
    for (i, (name, path)) in out.iter().enumerate() {
        if let Some((_, first)) = out[..i].iter().find(|(n, _)| n == name) {
            bail!(
                "two models are named {name:?}: {} and {} (name one with --model NAME=PATH)",
                first.display(),
                path.display()
            );
        }
    }
    Ok(out)
}

/// A model's name from its path: the file name less `.gguf`, or the
/// directory name of a pack.
fn stem(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| p.display().to_string())
}

/// Bytes of a file, or of the files of a directory (0 when unreadable:
/// loading it will say why).
fn size_of(p: &Path) -> u64 {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => std::fs::read_dir(p)
            .map(|d| {
                d.filter_map(|e| e.ok()?.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// The model, tokenizer, chat template and stop ids, as the server runs them.
fn load(
    path: &Path,
    exec: &ExecConfig,
    chat_template: Option<&Path>,
    max_template_kib: usize,
    spec: &crate::spec::SpecArgs,
    verbose: bool,
    mmproj: Option<&Path>,
) -> Result<onebit_serve::Loaded> {
    let Loaded { model, opened } = load_model(path, exec)?;
    let vision = crate::vision::for_model(path, mmproj, &model)?;
    open::print_semantics(&opened, exec, verbose);
    let tok = open::tokenizer(&opened)?;
    let limits = ChatLimits {
        max_output_bytes: max_template_kib.saturating_mul(1 << 10),
        ..ChatLimits::default()
    };
    let template = match open::load_chat_template_with(&opened, &tok, chat_template, limits)? {
        Some((t, from)) => {
            eprintln!("[serve] chat template from {from}");
            let control = |s: &str| tok.token_to_id(s).is_some_and(|id| tok.is_special(id));
            if let Some(f) = onebit_serve::harmony::declared(t.source(), control) {
                eprintln!("[semantics] {}", onebit_serve::harmony::semantics_line(f));
            }
            Some(t)
        }
        None => {
            eprintln!(
                "[serve] {} has no chat template, and its family none known: chat requests will be refused (pass --chat-template FILE)",
                path.display()
            );
            None
        }
    };
    let stops = open::stop_ids(&tok);
    let spec = crate::spec::plan(spec, &model, &opened, exec)?;
    let summary = opened.sem.lines().into_iter().next().unwrap_or_default();
    let pooling = open::pooling(&opened);
    let about = open::about(&opened, path);
    Ok(onebit_serve::Loaded {
        model,
        tok,
        template,
        stops,
        summary,
        spec,
        pooling,
        about,
        vision,
    })
}

/// A size in bytes: a number with an optional unit, K/M/G/T in powers of
/// 1,000 (kB, MB and GB alike) or KiB/MiB/GiB/TiB in powers of 1,024.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        format!("`{s}` is not a size (a number with an optional unit: 512M, 8G, 16GiB)")
    })?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        u => {
            return Err(format!(
                "`{s}`: unknown unit `{u}` (K, M, G, T or KiB, MiB, GiB, TiB)"
            ))
        }
    };
    let bytes = n * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is not a size from 1 byte up"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    #[test]
    fn sizes_read_in_decimal_and_binary_units() {
        assert_eq!(parse_size("512M"), Ok(512_000_000));
        assert_eq!(parse_size("8G"), Ok(8_000_000_000));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("16GiB"), Ok(16 * (1 << 30)));
        assert_eq!(parse_size("300mib"), Ok(300 * (1 << 20)));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["", "G", "8X", "-1G", "0", "1e99T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
