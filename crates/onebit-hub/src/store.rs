//! The local store: the Hugging Face Hub's cache layout, shared with every
//! tool that uses it.
//!
//! ```text
//! <root>/models--ORG--REPO/blobs/<hash>              checked file contents
//! <root>/models--ORG--REPO/blobs/<hash>.incomplete   a download in progress
//! <root>/models--ORG--REPO/snapshots/<commit>/<file> -> ../../blobs/<hash>
//! <root>/models--ORG--REPO/refs/main                 the commit pulled last
//! <root>/.locks/models--ORG--REPO/<hash>.lock        one writer per blob
//! ```
//!
//! `<root>` is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`, as the
//! Hub's own client reads them. A model is found when the snapshot `refs/main`
//! names holds every file its selection needs.

use std::path::{Path, PathBuf};

use crate::reference::Ref;
use crate::select::{self, Kind, Selection};

#[derive(Clone, Debug)]
pub struct Store {
    pub root: PathBuf,
}

/// A model in the store.
#[derive(Clone, Debug)]
pub struct Local {
    /// `ORG/REPO:QUANT` (GGUF) or `ORG/REPO` (pack).
    pub name: String,
    pub repo: String,
    pub commit: String,
    pub kind: Kind,
    /// What a loader opens: the (first) GGUF file, or the pack directory.
    pub path: PathBuf,
    /// The snapshot's entries of the selection, model files first.
    pub files: Vec<PathBuf>,
    /// How many of `files` are the model's own (the rest are companions).
    pub n_model: usize,
    /// Bytes of the model's own files.
    pub size: u64,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store { root: root.into() }
    }

    /// The store the environment names (see the module header).
    pub fn from_env() -> Store {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let root = var("HF_HUB_CACHE")
            .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
            .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
            .unwrap_or_else(|| {
                var("HOME")
                    .unwrap_or_else(|| PathBuf::from("/root"))
                    .join(".cache/huggingface/hub")
            });
        Store { root }
    }

    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo.replace('/', "--")))
    }
    pub fn blob(&self, repo: &str, hash: &str) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(hash)
    }
    pub fn incomplete(&self, repo: &str, hash: &str) -> PathBuf {
        self.repo_dir(repo)
            .join("blobs")
            .join(format!("{hash}.incomplete"))
    }
    pub fn lock_path(&self, repo: &str, hash: &str) -> PathBuf {
        self.root
            .join(".locks")
            .join(format!("models--{}", repo.replace('/', "--")))
            .join(format!("{hash}.lock"))
    }
    pub fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// The commit `refs/main` names, else the only snapshot there is.
    pub fn head(&self, repo: &str) -> Option<String> {
        let dir = self.repo_dir(repo);
        if let Ok(s) = std::fs::read_to_string(dir.join("refs/main")) {
            let s = s.trim();
            if !s.is_empty() {
                return Some(s.to_string());
            }
        }
        let snaps: Vec<String> = std::fs::read_dir(dir.join("snapshots"))
            .ok()?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        (snaps.len() == 1).then(|| snaps[0].clone())
    }

    /// Points `refs/main` at `commit` (written aside, then renamed).
    pub fn set_head(&self, repo: &str, commit: &str) -> std::io::Result<()> {
        let refs = self.repo_dir(repo).join("refs");
        std::fs::create_dir_all(&refs)?;
        let tmp = refs.join(format!(".main.{}", std::process::id()));
        std::fs::write(&tmp, commit)?;
        std::fs::rename(&tmp, refs.join("main"))
    }

    /// Makes `snapshots/<commit>/<file>` a relative link to `blobs/<hash>`,
    /// replacing what was there in one rename.
    pub fn link(&self, repo: &str, commit: &str, file: &str, hash: &str) -> std::io::Result<()> {
        let at = self.snapshot(repo, commit).join(file);
        let parent = at.parent().expect("a snapshot entry has a parent");
        std::fs::create_dir_all(parent)?;
        let depth = 2 + file.matches('/').count();
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(hash);
        let tmp = parent.join(format!(
            ".{}.{}.link",
            at.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)?;
        std::fs::rename(&tmp, &at)
    }

    /// Files of a snapshot that resolve to a file, as relative `/` paths.
    pub fn snapshot_files(&self, repo: &str, commit: &str) -> Vec<String> {
        let root = self.snapshot(repo, commit);
        let mut out = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.filter_map(|e| e.ok()) {
                let p = e.path();
                if e.file_name().to_string_lossy().starts_with('.') {
                    continue;
                }
                if p.is_dir() {
                    stack.push(p);
                } else if p.is_file() {
                    if let Ok(rel) = p.strip_prefix(&root) {
                        out.push(rel.to_string_lossy().into_owned());
                    }
                }
            }
        }
        out.sort();
        out
    }

    fn local(&self, repo: &str, commit: &str, sel: Selection) -> Local {
        let snap = self.snapshot(repo, commit);
        let files: Vec<PathBuf> = sel.files().map(|f| snap.join(f)).collect();
        let size = sel
            .model
            .iter()
            .filter_map(|f| std::fs::metadata(snap.join(f)).ok())
            .map(|m| m.len())
            .sum();
        let n_model = sel.model.len();
        let (name, path) = match &sel.kind {
            Kind::Gguf { quant } => (format!("{repo}:{quant}"), snap.join(&sel.model[0])),
            Kind::Pack { dir } => (repo.to_string(), snap.join(dir)),
        };
        Local {
            name,
            repo: repo.into(),
            commit: commit.into(),
            kind: sel.kind,
            path,
            n_model,
            files,
            size,
        }
    }

    /// The model `r` names, if the store holds all of it.
    pub fn find(&self, r: &Ref) -> Option<Local> {
        let commit = self.head(&r.repo)?;
        let names = self.snapshot_files(&r.repo, &commit);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let sel = select::select(&r.repo, &names, r.quant.as_deref()).ok()?;
        Some(self.local(&r.repo, &commit, sel))
    }

    /// Every model in the store: each quant of each GGUF repository, each
    /// pack, sorted by name.
    pub fn list(&self) -> Vec<Local> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return out;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let dir = e.file_name().to_string_lossy().into_owned();
            let Some(repo) = dir
                .strip_prefix("models--")
                .and_then(|r| r.split_once("--"))
                .map(|(o, n)| format!("{o}/{n}"))
            else {
                continue;
            };
            let Some(commit) = self.head(&repo) else {
                continue;
            };
            let names = self.snapshot_files(&repo, &commit);
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let models = select::gguf_models(&names);
            if models.is_empty() {
                if let Ok(sel) = select::select(&repo, &names, None) {
                    out.push(self.local(&repo, &commit, sel));
                }
                continue;
            }
            for m in models {
                let Some(q) = m.quant else { continue };
                if let Ok(sel) = select::select(&repo, &names, Some(&q)) {
                    out.push(self.local(&repo, &commit, sel));
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Removes the model `r` names: its snapshot entries, and each blob no
    /// other entry of the repository still links to; the repository's whole
    /// directory when no model is left in it. Returns the model removed.
    pub fn remove(&self, r: &Ref) -> Result<Local, String> {
        let Some(local) = self.find(r) else {
            return Err(format!(
                "{r} is not in the store {}: `onebit list` shows what is",
                self.root.display()
            ));
        };
        // Companions stay while another model of the repository uses them.
        let others = self
            .list()
            .into_iter()
            .filter(|l| l.repo == local.repo && l.name != local.name)
            .count();
        let take = if others == 0 {
            local.files.len()
        } else {
            local.n_model
        };
        for f in &local.files[..take] {
            let blob = f.canonicalize().ok();
            std::fs::remove_file(f).map_err(|e| format!("{}: {e}", f.display()))?;
            if let Some(blob) = blob {
                if !self.linked_anywhere(&local.repo, &blob) {
                    let _ = std::fs::remove_file(&blob);
                }
            }
        }
        if others == 0 {
            let dir = self.repo_dir(&local.repo);
            std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        Ok(local)
    }

    fn linked_anywhere(&self, repo: &str, blob: &Path) -> bool {
        let snaps = self.repo_dir(repo).join("snapshots");
        let Ok(rd) = std::fs::read_dir(&snaps) else {
            return false;
        };
        rd.filter_map(|e| e.ok()).any(|e| {
            let commit = e.file_name().to_string_lossy().into_owned();
            self.snapshot_files(repo, &commit)
                .iter()
                .any(|f| e.path().join(f).canonicalize().is_ok_and(|c| c == *blob))
        })
    }
}
