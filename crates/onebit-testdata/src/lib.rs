//! Where tests find their data.
//!
//! Fixtures live in the repository (`testdata/`); the real models live in a
//! cache outside it, filled by `scripts/fetch-models.sh`. A test that needs a
//! real model fails, never skips, when the model is missing: CI must not go
//! green without having run it.

use std::path::PathBuf;

/// The repository's `testdata/` directory.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// `testdata/llamacpp/<family>/`: tiny random-weight GGUFs with llama.cpp's logits.
pub fn fixture(family: &str) -> PathBuf {
    dir().join("llamacpp").join(family)
}

/// The real-model cache: `$ONEBIT_MODELS`, else `~/.cache/onebit/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ONEBIT_MODELS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/onebit/models")
}

pub const GEMMA3_270M: &str = "gemma-3-270m-q4_k_m.gguf";
pub const SMOLLM2_135M: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (file_type 15): Qwen2.5's tool template.
pub const QWEN25_CODER_05B: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
/// gpt-oss's vocabulary (o200k_harmony) and chat template, no weights: built
/// from a registry package's o200k by `scripts/gen-o200k-harmony.py`.
pub const O200K_HARMONY: &str = "o200k_harmony.gguf";

/// Path of a real model in the cache; panics with the fix when it is missing.
pub fn real_model(file: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(
        p.is_file(),
        "real model {} is missing: run scripts/fetch-models.sh (tests that need it fail rather than skip)",
        p.display()
    );
    p
}

/// Reads a little-endian f32 file (llama.cpp logits: \[n_tokens\]\[n_vocab\]).
pub fn read_f32(path: impl Into<PathBuf>) -> Vec<f32> {
    let path = path.into();
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// One llama.cpp fixture family: its files, token lists and `meta.json`.
pub struct Fixture {
    pub dir: PathBuf,
    pub meta: serde_json::Value,
}

impl Fixture {
    /// Every fixture directory whose model is of GGUF architecture `arch`
    /// (a family may have several configurations, e.g. `gemma4` and
    /// `gemma4-nople`), sorted by name.
    pub fn all_of(arch: &str) -> Vec<Fixture> {
        let root = dir().join("llamacpp");
        let mut names: Vec<String> = std::fs::read_dir(&root)
            .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("meta.json").is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
            .iter()
            .map(|n| Fixture::new(n))
            .filter(|f| f.meta["arch"] == arch)
            .collect()
    }

    pub fn new(family: &str) -> Fixture {
        let dir = fixture(family);
        let meta_path = dir.join("meta.json");
        let text = std::fs::read_to_string(&meta_path)
            .unwrap_or_else(|e| panic!("{}: {e}", meta_path.display()));
        Fixture {
            dir,
            meta: serde_json::from_str(&text).expect("meta.json parses"),
        }
    }
    /// `tokens` or `tokens2` from tokens.json.
    pub fn tokens(&self, which: &str) -> Vec<u32> {
        let p = self.dir.join("tokens.json");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        v[which]
            .as_array()
            .unwrap_or_else(|| panic!("{}: no `{which}`", p.display()))
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }
    pub fn n_vocab(&self) -> usize {
        self.meta["hparams"]["n_vocab"]
            .as_u64()
            .expect("hparams.n_vocab") as usize
    }
    /// The run entry of meta.json: `f32`, `Q5_0`, `f32.tokens2`, ...
    fn run(&self, run: &str) -> &serde_json::Value {
        let r = &self.meta["runs"][run];
        assert!(r.is_object(), "meta.json has no run `{run}`");
        r
    }
    /// M: the largest |logit| of a run's reference.
    pub fn max_abs_logit(&self, run: &str) -> f32 {
        self.run(run)["stats"]["max_abs_logit"].as_f64().unwrap() as f32
    }
    /// Best minus second-best reference logit, per position.
    pub fn top1_margin(&self, run: &str) -> Vec<f32> {
        self.run(run)["top1_margin"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    }
    /// The quantized weight type of this family (the one non-f32 run).
    pub fn quant(&self) -> String {
        self.meta["runs"]
            .as_object()
            .unwrap()
            .keys()
            .find(|k| *k != "f32" && !k.contains('.'))
            .expect("a quantized run")
            .clone()
    }
    pub fn logits(&self, file: &str) -> Vec<f32> {
        read_f32(self.dir.join(file))
    }
}

/// Comparison of two \[n_tokens\]\[n_vocab\] logit arrays.
#[derive(Debug)]
pub struct Comparison {
    pub max_abs_diff: f32,
    pub min_cosine: f64,
    /// Positions whose argmax differs, with the reference margin there.
    pub argmax_flips: Vec<(usize, f32)>,
}

pub fn compare(ours: &[f32], reference: &[f32], n_vocab: usize, margins: &[f32]) -> Comparison {
    assert_eq!(ours.len(), reference.len(), "logit arrays differ in length");
    let mut max_abs_diff = 0f32;
    let mut min_cosine = f64::INFINITY;
    let mut argmax_flips = Vec::new();
    for (t, (a, b)) in ours
        .chunks(n_vocab)
        .zip(reference.chunks(n_vocab))
        .enumerate()
    {
        let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
        for (&x, &y) in a.iter().zip(b) {
            assert!(x.is_finite(), "non-finite logit at position {t}");
            max_abs_diff = max_abs_diff.max((x - y).abs());
            dot += x as f64 * y as f64;
            na += x as f64 * x as f64;
            nb += y as f64 * y as f64;
        }
        min_cosine = min_cosine.min(dot / (na.sqrt() * nb.sqrt()));
        if argmax(a) != argmax(b) {
            argmax_flips.push((t, margins.get(t).copied().unwrap_or(f32::NAN)));
        }
    }
    Comparison {
        max_abs_diff,
        min_cosine,
        argmax_flips,
    }
}

pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// A temporary directory removed on drop (no dev-dependency needed for it).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "onebit-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
    /// Writes `bytes` to a file in this directory and returns its path.
    pub fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// llama.cpp's ids for the reference strings of a real model
/// (`testdata/refs/tokens-<model stem>.json`): (text, ids) pairs.
pub fn token_refs(model_file: &str) -> Vec<(String, Vec<u32>)> {
    let stem = model_file.trim_end_matches(".gguf");
    let path = dir().join("refs").join(format!("tokens-{stem}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("refs parse");
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let ids = c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect();
            (c["text"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}

/// A small deterministic generator (xorshift64*) for seeded test inputs:
/// the same seed gives the same sequence on every machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in 0..n (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
    /// In lo..hi (lo when the range is empty).
    pub fn in_range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo)
    }
}

/// A PNG file whose header (IHDR) states `w` x `h` 8-bit RGB, followed by
/// one tiny zlib stream (IDAT) and IEND, each chunk with its CRC-32: what a
/// decoder reads before it allocates, for the tests of image bounds.
pub fn png_with_header(w: u32, h: u32) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = 0xffff_ffffu32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    for (kind, data) in [
        (
            &b"IHDR"[..],
            [&w.to_be_bytes()[..], &h.to_be_bytes(), &[8, 2, 0, 0, 0]].concat(),
        ),
        (
            b"IDAT",
            vec![0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
        ),
        (b"IEND", vec![]),
    ] {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let body = [kind, &data].concat();
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    }
    out
}
