//! A pull: the repository's file list, the selection a reference makes of
//! it, and each file fetched into the store, resumed when a transfer breaks
//! and checked before it takes its final name. Files already in the store
//! (ours or another tool's: the blob of that hash exists) are linked, not
//! fetched. `refs/main` moves to the pulled commit only when every file is in.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::time::Duration;

use crate::client::{Hub, Sibling};
use crate::lock::Lock;
use crate::reference::Ref;
use crate::select::{self, Kind};
use crate::store::{Local, Store};
use crate::verify::{hash_file, Algo};

/// Told of a pull's progress (a terminal bar, plain lines, Ollama's stream).
pub trait Progress {
    /// A file starts: `have` of `total` bytes are already there.
    fn begin(&mut self, file: &str, hash: &str, total: u64, have: u64);
    /// `n` more bytes arrived.
    fn advance(&mut self, n: u64);
    /// The file is checked and in place (`fetched` false: it already was).
    fn end(&mut self, file: &str, fetched: bool);
    /// Anything else worth a line (a resume, a check).
    fn note(&mut self, msg: &str);
}

/// Progress nobody watches.
pub struct Quiet;
impl Progress for Quiet {
    fn begin(&mut self, _: &str, _: &str, _: u64, _: u64) {}
    fn advance(&mut self, _: u64) {}
    fn end(&mut self, _: &str, _: bool) {}
    fn note(&mut self, _: &str) {}
}

#[derive(Clone, Debug)]
pub struct PullOptions {
    /// Times a broken transfer is resumed before the pull gives up (the
    /// partial file stays, and the next pull resumes it).
    pub retries: u32,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions { retries: 3 }
    }
}

#[derive(Debug)]
pub struct Pulled {
    pub local: Local,
    /// Files transferred by this pull.
    pub fetched: Vec<String>,
    /// Files that were in the store already.
    pub reused: Vec<String>,
}

/// Pulls what `r` names from `hub` into `store`.
pub fn pull(
    hub: &Hub,
    store: &Store,
    r: &Ref,
    opts: &PullOptions,
    progress: &mut dyn Progress,
) -> Result<Pulled, String> {
    let info = hub.info(&r.repo, "main")?;
    let names: Vec<&str> = info.siblings.iter().map(|s| s.name.as_str()).collect();
    let sel = select::select(&r.repo, &names, r.quant.as_deref()).map_err(|e| e.to_string())?;
    let mut fetched = Vec::new();
    let mut reused = Vec::new();
    for file in sel.files() {
        let sib = info
            .siblings
            .iter()
            .find(|s| &s.name == file)
            .expect("selected from the siblings");
        if fetch_file(hub, store, &r.repo, &info.commit, sib, opts, progress)? {
            fetched.push(file.clone());
        } else {
            reused.push(file.clone());
        }
    }
    store.set_head(&r.repo, &info.commit).map_err(|e| {
        format!(
            "{}: cannot write refs/main: {e}",
            store.repo_dir(&r.repo).display()
        )
    })?;
    let pinned = Ref {
        repo: r.repo.clone(),
        quant: match &sel.kind {
            Kind::Gguf { quant } => Some(quant.clone()),
            Kind::Pack { .. } => None,
        },
    };
    let local = store.find(&pinned).ok_or_else(|| {
        format!(
            "{r}: pulled, but the snapshot {} does not read back as the model",
            store.snapshot(&r.repo, &info.commit).display()
        )
    })?;
    Ok(Pulled {
        local,
        fetched,
        reused,
    })
}

/// One file into the store and its snapshot; true when bytes were fetched.
fn fetch_file(
    hub: &Hub,
    store: &Store,
    repo: &str,
    commit: &str,
    sib: &Sibling,
    opts: &PullOptions,
    progress: &mut dyn Progress,
) -> Result<bool, String> {
    let file = &sib.name;
    let what = format!("{repo}/{file}");
    let meta = hub.meta(repo, commit, file)?;
    if let Some(c) = &meta.commit {
        if c != commit {
            return Err(format!(
                "{what}: the Hub's x-repo-commit {c} is not the commit {commit} its model info named"
            ));
        }
    }
    let hash = meta.hash.clone();
    let Some(algo) = Algo::of(&hash) else {
        return Err(format!(
            "{what}: the Hub's etag {hash:?} is neither a sha256 nor a git blob id, so the file cannot be checked"
        ));
    };
    // The model-info API and the headers must agree on what the file is.
    let listed = match algo {
        Algo::Sha256 => sib.sha256.as_ref(),
        Algo::GitSha1 => sib.blob_id.as_ref(),
    };
    if let Some(l) = listed.filter(|l| **l != hash) {
        return Err(format!(
            "{what}: the model info lists {} {l}, the file's headers say {hash}",
            algo.name()
        ));
    }
    if let Some(s) = sib.size.filter(|s| *s != meta.size) {
        return Err(format!(
            "{what}: the model info lists {s} bytes, the file's headers say {}",
            meta.size
        ));
    }
    let blob = store.blob(repo, &hash);
    let link = |progress: &mut dyn Progress, fetched: bool| -> Result<bool, String> {
        store
            .link(repo, commit, file, &hash)
            .map_err(|e| format!("{what}: cannot link it into the snapshot: {e}"))?;
        progress.end(file, fetched);
        Ok(fetched)
    };
    if blob.is_file() {
        progress.begin(file, &hash, meta.size, meta.size);
        return link(progress, false);
    }
    let _lock = Lock::acquire(&store.lock_path(repo, &hash)).map_err(|e| {
        format!(
            "{what}: cannot lock {}: {e}",
            store.lock_path(repo, &hash).display()
        )
    })?;
    // Another pull of the same file may have finished while we waited.
    if blob.is_file() {
        progress.begin(file, &hash, meta.size, meta.size);
        return link(progress, false);
    }
    let inc = store.incomplete(repo, &hash);
    std::fs::create_dir_all(inc.parent().unwrap())
        .map_err(|e| format!("{}: {e}", inc.parent().unwrap().display()))?;
    let mut attempt = 0;
    loop {
        let have = std::fs::metadata(&inc).map_or(0, |m| m.len());
        let have = if have > meta.size { 0 } else { have };
        progress.begin(file, &hash, meta.size, have);
        match transfer(hub, &what, &meta.location, &inc, have, meta.size, progress) {
            Ok(()) => break,
            Err(Broken::Fatal(e)) => return Err(e),
            Err(Broken::Resumable(e)) => {
                let at = std::fs::metadata(&inc).map_or(0, |m| m.len());
                if attempt >= opts.retries {
                    return Err(format!(
                        "{what}: the transfer broke at {at} of {} bytes ({e}); the partial file {} is kept, and pulling again resumes it",
                        meta.size,
                        inc.display()
                    ));
                }
                attempt += 1;
                progress.note(&format!(
                    "{file}: the transfer broke at {at} of {} bytes ({e}); resuming",
                    meta.size
                ));
                std::thread::sleep(Duration::from_millis(200 * attempt as u64));
            }
        }
    }
    progress.note(&format!("{file}: checking its {}", algo.name()));
    let got = hash_file(&inc, algo).map_err(|e| format!("{}: {e}", inc.display()))?;
    if got != hash {
        let _ = std::fs::remove_file(&inc);
        return Err(format!(
            "{what}: its {} is {got}, but the Hub says {hash}; the download was deleted",
            algo.name()
        ));
    }
    std::fs::rename(&inc, &blob).map_err(|e| {
        format!(
            "{what}: cannot move {} to {}: {e}",
            inc.display(),
            blob.display()
        )
    })?;
    link(progress, true)
}

enum Broken {
    /// Worth another try from where the file ends.
    Resumable(String),
    /// Not worth one (refused, out of space...).
    Fatal(String),
}

/// Appends bytes `have..size` of the file at `location` to `inc`.
fn transfer(
    hub: &Hub,
    what: &str,
    location: &str,
    inc: &std::path::Path,
    have: u64,
    size: u64,
    progress: &mut dyn Progress,
) -> Result<(), Broken> {
    let fatal = |e: std::io::Error| Broken::Fatal(format!("{}: {e}", inc.display()));
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(inc)
        .map_err(fatal)?;
    if have == size {
        return Ok(());
    }
    let mut opened = hub.open(what, location, have).map_err(Broken::Resumable)?;
    let mut written = have;
    if opened.start != have {
        // The server sent the whole file: start over.
        out.set_len(0).map_err(fatal)?;
        written = 0;
        progress.begin(what, "", size, 0);
    }
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match opened.body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out.flush().map_err(fatal)?;
                return Err(Broken::Resumable(e.to_string()));
            }
        };
        if written + n as u64 > size {
            drop(out);
            let _ = std::fs::remove_file(inc);
            return Err(Broken::Fatal(format!(
                "{what}: the server sent more than the {size} bytes the Hub lists; the download was deleted"
            )));
        }
        out.write_all(&buf[..n]).map_err(fatal)?;
        written += n as u64;
        progress.advance(n as u64);
    }
    out.sync_all().map_err(fatal)?;
    if written < size {
        return Err(Broken::Resumable(format!(
            "the body ended at {written} of {size} bytes"
        )));
    }
    Ok(())
}
