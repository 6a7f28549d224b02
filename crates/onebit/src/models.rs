//! Models by name on the command line: `onebit pull`, `list` and `rm`, and
//! the resolution every `--model` goes through: an existing path is a path;
//! otherwise a reference (`ORG/REPO[:QUANT]`) names a model in the store,
//! pulled first when `--pull` is given, else refused with the command that
//! fetches it.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use onebit_hub::client::Hub;
use onebit_hub::select::Kind;
use onebit_hub::{Progress, PullOptions, Ref, Store};

#[derive(Args)]
pub struct PullArgs {
    /// ORG/REPO[:QUANT] or hf.co/ORG/REPO[:QUANT] (quant default Q4_K_M).
    #[arg(value_name = "REF")]
    pub reference: String,
    /// Times a broken transfer is resumed before the pull gives up.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
}

#[derive(Args)]
pub struct RmArgs {
    /// A name as `onebit list` prints it (ORG/REPO:QUANT, or ORG/REPO).
    #[arg(value_name = "NAME")]
    pub name: String,
}

/// Progress on stderr: a bar on a terminal, else a line per file start,
/// per tenth of it (at most one each 2 s), and per end.
pub struct Report {
    bar: Option<ProgressBar>,
    file: String,
    total: u64,
    done: u64,
    have: u64,
    started: Instant,
    last_line: Instant,
    last_tenth: u64,
}

impl Default for Report {
    fn default() -> Self {
        Report::new()
    }
}

impl Report {
    pub fn new() -> Report {
        Report {
            bar: None,
            file: String::new(),
            total: 0,
            done: 0,
            have: 0,
            started: Instant::now(),
            last_line: Instant::now(),
            last_tenth: 0,
        }
    }
    fn line(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = (self.done - self.have) as f64 / secs;
        let left = if rate > 0.0 {
            format!("{:.0} s left", (self.total - self.done) as f64 / rate)
        } else {
            "time left unknown".into()
        };
        format!(
            "[pull] {}: {} of {} ({:.0} %), {}/s, {left}",
            self.file,
            mb(self.done),
            mb(self.total),
            100.0 * self.done as f64 / self.total.max(1) as f64,
            mb(rate as u64),
        )
    }
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

impl Progress for Report {
    fn begin(&mut self, file: &str, _hash: &str, total: u64, have: u64) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        self.file = file.to_string();
        self.total = total;
        self.done = have;
        self.have = have;
        self.started = Instant::now();
        self.last_line = Instant::now();
        self.last_tenth = have * 10 / total.max(1);
        if have == total {
            return;
        }
        if std::io::stderr().is_terminal() {
            let b = ProgressBar::new(total);
            b.set_style(
                ProgressStyle::with_template(
                    "[pull] {msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {eta} left",
                )
                .expect("valid template"),
            );
            b.set_message(file.to_string());
            b.set_position(have);
            self.bar = Some(b);
        } else if have > 0 {
            eprintln!("[pull] {file}: resuming at {} of {}", mb(have), mb(total));
        } else {
            eprintln!("[pull] {file}: {}", mb(total));
        }
    }
    fn advance(&mut self, n: u64) {
        self.done += n;
        if let Some(b) = &self.bar {
            b.set_position(self.done);
            return;
        }
        let tenth = self.done * 10 / self.total.max(1);
        if tenth > self.last_tenth && self.last_line.elapsed() >= Duration::from_secs(2) {
            self.last_tenth = tenth;
            self.last_line = Instant::now();
            eprintln!("{}", self.line());
        }
    }
    fn end(&mut self, file: &str, fetched: bool) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        if fetched {
            eprintln!("[pull] {file}: done, checked");
        } else {
            eprintln!("[pull] {file}: already in the store");
        }
    }
    fn note(&mut self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(format!("[pull] {msg}")),
            None => eprintln!("[pull] {msg}"),
        }
    }
}

/// `onebit pull REF`: prints the path of the model pulled on stdout.
pub fn pull(a: PullArgs) -> Result<()> {
    let r = Ref::parse(&a.reference).map_err(anyhow::Error::msg)?;
    let path = pull_ref(&r, a.retries)?;
    println!("{}", path.display());
    Ok(())
}

fn pull_ref(r: &Ref, retries: u32) -> Result<PathBuf> {
    let store = Store::from_env();
    let hub = Hub::from_env();
    eprintln!(
        "[pull] {r} from {} into {}",
        hub.endpoint,
        store.root.display()
    );
    let pulled = onebit_hub::pull(
        &hub,
        &store,
        r,
        &PullOptions { retries },
        &mut Report::new(),
    )
    .map_err(anyhow::Error::msg)?;
    eprintln!(
        "[pull] {}: {} file(s) fetched, {} already there",
        pulled.local.name,
        pulled.fetched.len(),
        pulled.reused.len()
    );
    Ok(pulled.local.path)
}

/// `--model` as given: a path that exists, else a model of the store by
/// name (pulled first with `pull`).
pub fn resolve(model: &Path, pull: bool) -> Result<PathBuf> {
    let text = model.to_string_lossy();
    if model.exists() || !Ref::looks_like(&text) {
        return Ok(model.to_path_buf());
    }
    let r = Ref::parse(&text).map_err(anyhow::Error::msg)?;
    let store = Store::from_env();
    if let Some(l) = store.find(&r) {
        return Ok(l.path);
    }
    if pull {
        return pull_ref(&r, PullOptions::default().retries);
    }
    bail!(
        "model {r} is not in the store {} (and no file {} exists): run `onebit pull {r}`, or pass --pull",
        store.root.display(),
        model.display()
    )
}

/// `onebit list`: one line per model of the store.
pub fn list() -> Result<()> {
    let store = Store::from_env();
    let models = store.list();
    println!(
        "{:<50} {:<10} {:<8} {:>10} {:>8}  PATH",
        "NAME", "FAMILY", "QUANT", "SIZE", "CONTEXT"
    );
    for m in &models {
        let (family, ctx) = match onebit_model::load::open(&m.path) {
            Ok(o) => (o.sem.family.to_string(), o.sem.dims.n_ctx_train.to_string()),
            Err(_) => ("?".into(), "?".into()),
        };
        let quant = match &m.kind {
            Kind::Gguf { quant } => quant.clone(),
            Kind::Pack { .. } => "Q4NX".into(),
        };
        println!(
            "{:<50} {:<10} {:<8} {:>10} {:>8}  {}",
            m.name,
            family,
            quant,
            mb(m.size),
            ctx,
            m.path.display()
        );
    }
    if models.is_empty() {
        eprintln!(
            "[list] the store {} holds no model: `onebit pull ORG/REPO[:QUANT]` fetches one",
            store.root.display()
        );
    }
    Ok(())
}

/// `onebit rm NAME`.
pub fn rm(a: RmArgs) -> Result<()> {
    let r = Ref::parse(&a.name).map_err(anyhow::Error::msg)?;
    let store = Store::from_env();
    let gone = store.remove(&r).map_err(anyhow::Error::msg)?;
    eprintln!("[rm] removed {} ({})", gone.name, mb(gone.size));
    Ok(())
}
