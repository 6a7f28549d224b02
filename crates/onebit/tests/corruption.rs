//! Corrupt model files through the real binary: a real GGUF (SmolLM2-135M)
//! and a real pack imported from it, truncated at many offsets (header,
//! metadata, tensor infos, data) and with bytes flipped in the header, the
//! metadata and the tensor infos. `inspect`, `run --max-tokens 1` and
//! `logits` run on each case: every truncation exits non-zero with an
//! `error:` sentence; a flip may also succeed (a flipped weight, a flipped
//! letter of a token, a rope base still positive), but nothing panics (exit
//! 101, "panicked"), dies of a signal or hangs (each command has a deadline).
//!
//! The pack is SmolLM2 as `onebit import` writes it by default: quarter
//! tiles (16 x 128, 1,280 bytes), its hidden size 576 being off the 256
//! grid. Every truncation and every change of its JSON header is refused
//! with a sentence, including each quarter-tile shape's row width changed to
//! a size that is no form or to another form's size.
//!
//! Counts (printed by each test): GGUF 35 truncations and 124 flips (3
//! commands each: inspect, run, logits); pack 12 truncations of model.q4nx,
//! 25 changes in its JSON header and 23 config.json edits (inspect and run),
//! plus the import that makes the pack (~13 s). About 25 s of test time in
//! all on two busy cores; each test runs its cases two at a time.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use onebit_formats::gguf::{writer::GgufWriter, Gguf, Value};
use onebit_testdata::{real_model, Rng, TempDir, SMOLLM2_135M};

const BIN: &str = env!("CARGO_BIN_EXE_onebit");
/// Per command. A healthy case takes well under a second; a hang is a bug.
const DEADLINE: Duration = Duration::from_secs(60);

struct Outcome {
    code: Option<i32>,
    stderr: String,
    elapsed: Duration,
}

/// Runs the binary with a deadline; kills it and reports a hang past it.
fn onebit(args: &[OsString]) -> Result<Outcome, String> {
    let t = Instant::now();
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("onebit starts");
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = pipe.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Ok(Outcome {
                code: status.code(),
                stderr: reader.join().unwrap(),
                elapsed: t.elapsed(),
            });
        }
        if t.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("hung: no exit after {DEADLINE:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The commands each case runs on a model path.
fn commands(model: &Path, out: &Path, with_logits: bool) -> Vec<Vec<OsString>> {
    let m = || model.as_os_str().to_owned();
    let mut v = vec![
        vec!["inspect".into(), "--model".into(), m()],
        vec![
            "run".into(),
            "--model".into(),
            m(),
            "--prompt".into(),
            "Hi".into(),
            "--max-tokens".into(),
            "1".into(),
            "--threads".into(),
            "1".into(),
        ],
    ];
    if with_logits {
        v.push(vec![
            "logits".into(),
            "--model".into(),
            m(),
            "--ids".into(),
            "1,2,3".into(),
            "--out".into(),
            out.as_os_str().to_owned(),
            "--threads".into(),
            "1".into(),
        ]);
    }
    v
}

#[derive(Default)]
struct Tally {
    cases: usize,
    commands: usize,
    failed_cleanly: usize,
    succeeded: usize,
    problems: Vec<String>,
    slowest: Duration,
}

impl Tally {
    /// Runs every command of one case; `must_fail`: success is a problem too.
    fn case(&mut self, what: &str, cmds: &[Vec<OsString>], must_fail: bool) {
        self.cases += 1;
        for args in cmds {
            self.commands += 1;
            let name = args[0].to_string_lossy().into_owned();
            let o = match onebit(args) {
                Ok(o) => o,
                Err(e) => {
                    self.problems.push(format!("{what}: {name}: {e}"));
                    continue;
                }
            };
            self.slowest = self.slowest.max(o.elapsed);
            let last = o.stderr.lines().last().unwrap_or("").to_string();
            match o.code {
                Some(0) if must_fail => self.problems.push(format!(
                    "{what}: {name}: succeeded on a file that must be refused"
                )),
                Some(0) => self.succeeded += 1,
                Some(101) => self
                    .problems
                    .push(format!("{what}: {name}: exit 101 (panic): {}", o.stderr)),
                None => self
                    .problems
                    .push(format!("{what}: {name}: killed by a signal: {}", o.stderr)),
                Some(_) if o.stderr.contains("panicked") => self
                    .problems
                    .push(format!("{what}: {name}: panicked: {}", o.stderr)),
                Some(_) if !last.starts_with("error: ") || last.len() < 20 => self.problems.push(
                    format!("{what}: {name}: failed without an error sentence: {last:?}"),
                ),
                Some(_) => self.failed_cleanly += 1,
            }
        }
    }

    fn report(&self, name: &str) {
        eprintln!(
            "[{name}] {} cases, {} commands: {} refused with an error, {} succeeded, slowest command {:.2} s",
            self.cases,
            self.commands,
            self.failed_cleanly,
            self.succeeded,
            self.slowest.as_secs_f64()
        );
        assert!(
            self.problems.is_empty(),
            "{} problems:\n{}",
            self.problems.len(),
            self.problems.join("\n")
        );
    }
}

/// Runs `cases` two at a time, each on its own copy made by `prepare` in its
/// worker's directory; the tally of all.
fn run_cases<C: Sync>(
    cases: &[C],
    workers: &[PathBuf],
    prepare: impl Fn(&C, &Path) -> (String, Vec<Vec<OsString>>, bool) + Sync,
    cleanup: impl Fn(&C, &Path) + Sync,
) -> Tally {
    let tally = Mutex::new(Tally::default());
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for dir in workers {
            let (tally, next, prepare, cleanup) = (&tally, &next, &prepare, &cleanup);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = cases.get(i) else { break };
                let (what, cmds, must_fail) = prepare(c, dir);
                let mut local = Tally::default();
                local.case(&what, &cmds, must_fail);
                cleanup(c, dir);
                let mut t = tally.lock().unwrap();
                t.cases += local.cases;
                t.commands += local.commands;
                t.failed_cleanly += local.failed_cleanly;
                t.succeeded += local.succeeded;
                t.slowest = t.slowest.max(local.slowest);
                t.problems.extend(local.problems);
            });
        }
    });
    tally.into_inner().unwrap()
}

// ---------------------------------------------------------------- GGUF layout

/// Where things are in a GGUF file.
struct Kv {
    key: String,
    /// Offset of the key's length field.
    at: usize,
    ty: u32,
    /// Offset of the value (for arrays: of the element type).
    value_at: usize,
    end: usize,
}

struct Info {
    at: usize,
    n_dims: u32,
    /// Offset of n_dims (the name precedes it).
    n_dims_at: usize,
    end: usize,
}

struct Layout {
    kvs: Vec<Kv>,
    infos: Vec<Info>,
    infos_end: usize,
    data_start: usize,
}

fn layout(b: &[u8]) -> Layout {
    let u32_at = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
    let u64_at = |p: usize| u64::from_le_bytes(b[p..p + 8].try_into().unwrap()) as usize;
    fn skip(b: &[u8], ty: u32, p: usize) -> usize {
        let u32_at = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
        let u64_at = |p: usize| u64::from_le_bytes(b[p..p + 8].try_into().unwrap()) as usize;
        match ty {
            0 | 1 | 7 => p + 1,
            2 | 3 => p + 2,
            4..=6 => p + 4,
            10..=12 => p + 8,
            8 => p + 8 + u64_at(p),
            9 => {
                let (et, n) = (u32_at(p), u64_at(p + 4));
                let mut q = p + 12;
                for _ in 0..n {
                    q = skip(b, et, q);
                }
                q
            }
            _ => panic!("unexpected type {ty}"),
        }
    }
    let n_tensors = u64_at(8);
    let n_kv = u64_at(16);
    let mut p = 24;
    let mut kvs = Vec::new();
    for _ in 0..n_kv {
        let at = p;
        let len = u64_at(p);
        let key = String::from_utf8(b[p + 8..p + 8 + len].to_vec()).unwrap();
        p += 8 + len;
        let ty = u32_at(p);
        let value_at = p + 4;
        p = skip(b, ty, value_at);
        kvs.push(Kv {
            key,
            at,
            ty,
            value_at,
            end: p,
        });
    }
    let mut infos = Vec::new();
    for _ in 0..n_tensors {
        let at = p;
        p += 8 + u64_at(p);
        let n_dims = u32_at(p);
        let n_dims_at = p;
        p += 4 + 8 * n_dims as usize + 4 + 8;
        infos.push(Info {
            at,
            n_dims,
            n_dims_at,
            end: p,
        });
    }
    Layout {
        kvs,
        infos,
        infos_end: p,
        data_start: p.div_ceil(32) * 32,
    }
}

impl Layout {
    fn kv(&self, key: &str) -> &Kv {
        self.kvs.iter().find(|k| k.key == key).expect(key)
    }
}

/// A byte change: at `at`, write `bytes`; `must_fail` when no reading of the
/// result can be a valid model.
struct Flip {
    what: String,
    at: usize,
    bytes: Vec<u8>,
    must_fail: bool,
}

fn flip(what: impl Into<String>, at: usize, bytes: &[u8], must_fail: bool) -> Flip {
    Flip {
        what: what.into(),
        at,
        bytes: bytes.to_vec(),
        must_fail,
    }
}

fn gguf_flips(b: &[u8], l: &Layout) -> Vec<Flip> {
    let mut v = vec![
        flip("magic byte 0", 0, b"X", true),
        flip("magic byte 3", 3, b"f", true),
        flip("version 3 -> 1", 4, &[1], true),
        flip("version 3 -> 7", 4, &[7], true),
        flip("version big-endian", 4, &[0, 0, 0, 3], true),
        flip("tensor count high byte", 15, &[0x40], true),
        flip("tensor count + 1", 8, &[(b[8]).wrapping_add(1)], false),
        flip("metadata count high byte", 23, &[0x7f], true),
        flip("metadata count + 1", 16, &[b[16] + 1], false),
    ];
    // Metadata: key lengths, types, scalar values, array headers, strings.
    for key in [
        "general.architecture",
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.rope.freq_base",
        "tokenizer.ggml.model",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.chat_template",
    ] {
        let kv = l.kv(key);
        v.push(flip(
            format!("{key}: key length high byte"),
            kv.at + 7,
            &[0x10],
            true,
        ));
        v.push(flip(
            format!("{key}: key length - 1"),
            kv.at,
            &[b[kv.at] - 1],
            false,
        ));
        v.push(flip(
            format!("{key}: type 13"),
            kv.value_at - 4,
            &[13],
            true,
        ));
        match kv.ty {
            4 => {
                v.push(flip(
                    format!("{key}: value u32::MAX"),
                    kv.value_at,
                    &[0xff; 4],
                    false,
                ));
                v.push(flip(format!("{key}: value 0"), kv.value_at, &[0; 4], false));
            }
            6 => v.push(flip(
                format!("{key}: value NaN"),
                kv.value_at,
                &f32::NAN.to_le_bytes(),
                false,
            )),
            8 => {
                v.push(flip(
                    format!("{key}: string length high byte"),
                    kv.value_at + 6,
                    &[0x01],
                    true,
                ));
                v.push(flip(
                    format!("{key}: invalid UTF-8 in the string"),
                    kv.value_at + 8,
                    &[0xff],
                    true,
                ));
            }
            9 => {
                v.push(flip(
                    format!("{key}: element type 13"),
                    kv.value_at,
                    &[13],
                    true,
                ));
                v.push(flip(
                    format!("{key}: element count high byte"),
                    kv.value_at + 4 + 5,
                    &[0x01],
                    true,
                ));
                v.push(flip(
                    format!("{key}: element count low byte changed"),
                    kv.value_at + 4,
                    &[b[kv.value_at + 4].wrapping_sub(1)],
                    false,
                ));
            }
            _ => {}
        }
    }
    // Tensor infos of a few tensors spread over the list.
    for &i in &[0usize, 1, 37, 150, l.infos.len() - 1] {
        let t = &l.infos[i];
        let nd = t.n_dims_at;
        let dims = nd + 4;
        let ty = dims + 8 * t.n_dims as usize;
        let off = ty + 4;
        v.push(flip(
            format!("tensor {i}: name length high byte"),
            t.at + 6,
            &[0x01],
            true,
        ));
        v.push(flip(format!("tensor {i}: n_dims 0"), nd, &[0], true));
        v.push(flip(format!("tensor {i}: n_dims 9"), nd, &[9], true));
        v.push(flip(
            format!("tensor {i}: dims[0] doubled"),
            dims + 1,
            &[b[dims + 1].wrapping_add(b[dims + 1])],
            false,
        ));
        v.push(flip(
            format!("tensor {i}: last dim high byte"),
            dims + 8 * (t.n_dims as usize - 1) + 6,
            &[0x01],
            true,
        ));
        v.push(flip(format!("tensor {i}: type 99"), ty, &[99], true));
        v.push(flip(format!("tensor {i}: type F16"), ty, &[1], false));
        v.push(flip(
            format!("tensor {i}: offset + 1 (misaligned)"),
            off,
            &[b[off].wrapping_add(1)],
            true,
        ));
        v.push(flip(
            format!("tensor {i}: offset high byte"),
            off + 7,
            &[0x20],
            true,
        ));
    }
    // Seeded random bytes in the metadata and tensor-info regions, and a few
    // in the weights (which may well run).
    let mut rng = Rng(0x0b17_c0de);
    for _ in 0..6 {
        let at = rng.in_range(24, l.kvs.last().unwrap().end);
        let x = (rng.below(255) + 1) as u8;
        v.push(flip(
            format!("metadata byte {at} ^ {x:#x}"),
            at,
            &[b[at] ^ x],
            false,
        ));
    }
    for _ in 0..4 {
        let at = rng.in_range(l.infos[0].at, l.infos_end);
        let x = (rng.below(255) + 1) as u8;
        v.push(flip(
            format!("tensor-info byte {at} ^ {x:#x}"),
            at,
            &[b[at] ^ x],
            false,
        ));
    }
    for _ in 0..3 {
        let at = rng.in_range(l.data_start, b.len());
        v.push(flip(
            format!("weight byte {at}"),
            at,
            &[b[at] ^ 0x5a],
            false,
        ));
    }
    v
}

fn gguf_truncations(l: &Layout, len: usize) -> Vec<(String, usize)> {
    let mut v: Vec<(String, usize)> = [0, 1, 3, 4, 7, 8, 12, 16, 20, 23]
        .iter()
        .map(|&n| (format!("header at {n}"), n))
        .collect();
    let tokens = l.kv("tokenizer.ggml.tokens");
    let merges = l.kv("tokenizer.ggml.merges");
    let template = l.kv("tokenizer.chat_template");
    for (what, at) in [
        ("first key length", 28),
        ("first key", 40),
        ("first value type", l.kvs[0].value_at - 2),
        (
            "llama.block_count value",
            l.kv("llama.block_count").value_at + 2,
        ),
        ("tokens array header", tokens.value_at + 6),
        ("tokens array", (tokens.value_at + tokens.end) / 2),
        (
            "token_type array",
            l.kv("tokenizer.ggml.token_type").value_at + 1000,
        ),
        ("merges array", (merges.value_at + merges.end) / 2),
        ("chat template", template.value_at + 100),
        ("last metadata value", l.kvs.last().unwrap().end - 1),
    ] {
        v.push((format!("metadata: {what}"), at));
    }
    let infos = &l.infos;
    for (what, at) in [
        ("start", infos[0].at),
        ("first name", infos[0].at + 12),
        ("tensor 10 n_dims", infos[10].n_dims_at + 2),
        ("tensor 100 dims", infos[100].n_dims_at + 9),
        ("tensor 200 type", infos[200].end - 10),
        ("last offset", infos.last().unwrap().end - 3),
        ("end", l.infos_end),
        ("alignment padding", l.data_start - 1),
    ] {
        v.push((format!("tensor infos: {what}"), at));
    }
    let data = len - l.data_start;
    for (what, at) in [
        ("start", l.data_start),
        ("first tensor", l.data_start + 1000),
        ("a quarter in", l.data_start + data / 4),
        ("half", l.data_start + data / 2),
        ("three quarters", l.data_start + data * 3 / 4),
        ("one page short", len - 4096),
        ("one byte short", len - 1),
    ] {
        v.push((format!("data: {what}"), at));
    }
    v
}

fn workers(tmp: &TempDir) -> Vec<PathBuf> {
    (0..2)
        .map(|i| {
            let d = tmp.path().join(format!("w{i}"));
            std::fs::create_dir_all(&d).unwrap();
            d
        })
        .collect()
}

fn pwrite(path: &Path, at: usize, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, at as u64).unwrap();
}

#[test]
fn gguf_truncated_at_many_offsets_is_refused() {
    let src = real_model(SMOLLM2_135M);
    let bytes = std::fs::read(&src).unwrap();
    let l = layout(&bytes);
    let cases = gguf_truncations(&l, bytes.len());
    let tmp = TempDir::new("trunc-gguf");
    let w = workers(&tmp);
    // Truncations inside the header region are written as prefixes; those in
    // the data, from one full copy per worker cut shorter and shorter.
    let (small, mut large): (Vec<_>, Vec<_>) =
        cases.into_iter().partition(|(_, at)| *at < l.data_start);
    large.sort_by_key(|c| std::cmp::Reverse(c.1));
    let prefix = |c: &(String, usize), dir: &Path| {
        let p = dir.join("m.gguf");
        std::fs::write(&p, &bytes[..c.1]).unwrap();
        (
            format!("truncated at {} ({})", c.1, c.0),
            commands(&p, &dir.join("l.bin"), true),
            true,
        )
    };
    let mut t = run_cases(&small, &w, prefix, |_, _| {});
    // One worker: the cuts must come in decreasing order on one copy.
    let full = w[0].join("full.gguf");
    std::fs::copy(&src, &full).unwrap();
    let cut = |c: &(String, usize), dir: &Path| {
        let p = dir.join("full.gguf");
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(c.1 as u64).unwrap();
        (
            format!("truncated at {} ({})", c.1, c.0),
            commands(&p, &dir.join("l.bin"), true),
            true,
        )
    };
    let t2 = run_cases(&large, &w[..1], cut, |_, _| {});
    t.cases += t2.cases;
    t.commands += t2.commands;
    t.failed_cleanly += t2.failed_cleanly;
    t.succeeded += t2.succeeded;
    t.slowest = t.slowest.max(t2.slowest);
    t.problems.extend(t2.problems);
    t.report("gguf truncations");
}

#[test]
fn gguf_with_flipped_bytes_never_panics() {
    let src = real_model(SMOLLM2_135M);
    let bytes = std::fs::read(&src).unwrap();
    let l = layout(&bytes);
    let flips = gguf_flips(&bytes, &l);
    let tmp = TempDir::new("flip-gguf");
    let w = workers(&tmp);
    for d in &w {
        std::fs::copy(&src, d.join("m.gguf")).unwrap();
    }
    let t = run_cases(
        &flips,
        &w,
        |f, dir| {
            let p = dir.join("m.gguf");
            pwrite(&p, f.at, &f.bytes);
            (
                format!("{} (byte {})", f.what, f.at),
                commands(&p, &dir.join("l.bin"), true),
                f.must_fail,
            )
        },
        |f, dir| {
            pwrite(
                &dir.join("m.gguf"),
                f.at,
                &bytes[f.at..f.at + f.bytes.len()],
            )
        },
    );
    t.report("gguf flips");
}

// ---------------------------------------------------------------- packs

/// Imports SmolLM2 into a pack once per test binary run.
fn pack_of_smollm(tmp: &TempDir) -> PathBuf {
    let out = tmp.path().join("pack");
    let o = onebit(&[
        "import".into(),
        "--model".into(),
        real_model(SMOLLM2_135M).into(),
        "--out".into(),
        out.clone().into(),
    ])
    .unwrap();
    assert_eq!(o.code, Some(0), "import failed: {}", o.stderr);
    assert!(
        o.stderr
            .contains("quarter tile (16 x 128, 1,280 bytes) for every Q4 matrix"),
        "{}",
        o.stderr
    );
    out
}

fn copy_pack(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

enum PackCase {
    Truncate(String, usize),
    Flip(Flip),
    Config(String, serde_json::Value, bool),
}

#[test]
fn pack_truncated_flipped_and_misconfigured_never_panics() {
    let tmp = TempDir::new("corrupt-pack");
    let pack = pack_of_smollm(&tmp);
    let weights = pack.join("model.q4nx");
    let q = std::fs::read(&weights).unwrap();
    let hlen = u64::from_le_bytes(q[..8].try_into().unwrap()) as usize;
    let data = 8 + hlen;
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pack.join("config.json")).unwrap()).unwrap();

    let mut cases = Vec::new();
    for (what, at) in [
        ("empty", 0),
        ("header length", 5),
        ("header start", 9),
        ("header middle", 8 + hlen / 2),
        ("header end", data - 1),
        ("data start", data),
        ("data + 1000", data + 1000),
        ("data quarter", data + (q.len() - data) / 4),
        ("data half", data + (q.len() - data) / 2),
        ("data three quarters", data + (q.len() - data) * 3 / 4),
        ("one page short", q.len() - 4096),
        ("one byte short", q.len() - 1),
    ] {
        cases.push(PackCase::Truncate(what.into(), at));
    }
    // The header is JSON: flip structural characters, digits and the length.
    // Every change is refused.
    cases.push(PackCase::Flip(flip(
        "header length + 1",
        0,
        &[q[0] + 1],
        true,
    )));
    cases.push(PackCase::Flip(flip("header length huge", 7, &[0x10], true)));
    let header = &q[8..data];
    // The quarter tiles' declared row width: to sizes that are no form, and
    // to the chunk's and the full tile's sizes (same bytes, wrong geometry).
    let quarter: Vec<usize> = header
        .windows(6)
        .enumerate()
        .filter(|(_, w)| w == b",1280]")
        .map(|(i, _)| i + 9)
        .collect();
    assert!(
        quarter.len() >= 200,
        "{} quarter-tile tensors",
        quarter.len()
    );
    let mut qrng = Rng(0x1280_1280);
    for to in [b"1281", b"1024", b"4608", b"5120", b"0280"] {
        let at = quarter[qrng.below(quarter.len())];
        cases.push(PackCase::Flip(flip(
            format!("quarter row width 1280 -> {}", String::from_utf8_lossy(to)),
            at,
            to,
            true,
        )));
    }
    let mut rng = Rng(0x5eed_f00d);
    let find_all = |c: u8| -> Vec<usize> {
        header
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == c)
            .map(|(i, _)| i + 8)
            .collect()
    };
    for (c, to) in [
        (b'{', b'['),
        (b'"', b' '),
        (b':', b','),
        (b'[', b'{'),
        (b'5', b'7'),
        (b'0', b'9'),
        (b'1', b'-'),
        (b'I', b'U'),
        (b'B', b'F'),
    ] {
        let all = find_all(c);
        for _ in 0..2 {
            let at = all[rng.below(all.len())];
            cases.push(PackCase::Flip(flip(
                format!("header {:?} -> {:?}", c as char, to as char),
                at,
                &[to],
                true,
            )));
        }
    }
    for (key, v, must_fail) in [
        ("hidden_size", serde_json::json!(0), true),
        ("hidden_size", serde_json::json!(577), true),
        ("hidden_size", serde_json::json!(1u64 << 62), true),
        ("hidden_size", serde_json::json!(u64::MAX), true),
        ("num_hidden_layers", serde_json::json!(0), true),
        ("num_hidden_layers", serde_json::json!(31), false),
        ("num_hidden_layers", serde_json::json!(1u64 << 33), true),
        ("num_attention_heads", serde_json::json!(0), true),
        ("num_attention_heads", serde_json::json!(u64::MAX), true),
        ("num_key_value_heads", serde_json::json!(2), true),
        ("num_key_value_heads", serde_json::json!(9), false),
        ("head_dim", serde_json::json!(1u64 << 62), true),
        ("head_dim", serde_json::json!(u64::MAX), true),
        ("head_dim", serde_json::json!(-1), true),
        ("intermediate_size", serde_json::json!(1u64 << 62), true),
        ("vocab_size", serde_json::json!(1u64 << 62), true),
        ("vocab_size", serde_json::json!(1), false),
        (
            "max_position_embeddings",
            serde_json::json!(u64::MAX),
            false,
        ),
        ("rms_norm_eps", serde_json::json!(-1.0), true),
        ("rope_theta", serde_json::json!(0), true),
        ("rope_theta", serde_json::json!("fast"), true),
        ("architectures", serde_json::json!(["NotAModel"]), false),
        ("model_type", serde_json::Value::Null, false),
    ] {
        let mut c = config.clone();
        c[key] = v.clone();
        cases.push(PackCase::Config(
            format!("config.json {key} = {v}"),
            c,
            must_fail,
        ));
    }
    let n_trunc = cases
        .iter()
        .filter(|c| matches!(c, PackCase::Truncate(..)))
        .count();
    let n_flip = cases
        .iter()
        .filter(|c| matches!(c, PackCase::Flip(..)))
        .count();
    eprintln!(
        "[pack] {n_trunc} truncations of model.q4nx, {n_flip} header flips, {} config.json edits",
        cases.len() - n_trunc - n_flip
    );

    let w = workers(&tmp);
    for d in &w {
        copy_pack(&pack, &d.join("p"));
    }
    let cfg_bytes = std::fs::read(pack.join("config.json")).unwrap();
    // Truncations rewrite the (large) weights of the worker's copy; put them
    // last and restore from the original after each.
    let t = run_cases(
        &cases,
        &w,
        |c, dir| {
            let p = dir.join("p");
            let what = match c {
                PackCase::Truncate(what, at) => {
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .open(p.join("model.q4nx"))
                        .unwrap();
                    f.set_len(*at as u64).unwrap();
                    format!("model.q4nx truncated at {at} ({what})")
                }
                PackCase::Flip(f) => {
                    pwrite(&p.join("model.q4nx"), f.at, &f.bytes);
                    format!("model.q4nx {} (byte {})", f.what, f.at)
                }
                PackCase::Config(what, c, _) => {
                    std::fs::write(p.join("config.json"), c.to_string()).unwrap();
                    what.clone()
                }
            };
            let must_fail = match c {
                PackCase::Truncate(..) => true,
                PackCase::Flip(f) => f.must_fail,
                PackCase::Config(_, _, m) => *m,
            };
            (what, commands(&p, &dir.join("l.bin"), false), must_fail)
        },
        |c, dir| {
            let p = dir.join("p");
            match c {
                PackCase::Truncate(..) => {
                    std::fs::copy(&weights, p.join("model.q4nx")).unwrap();
                }
                PackCase::Flip(f) => {
                    pwrite(&p.join("model.q4nx"), f.at, &q[f.at..f.at + f.bytes.len()])
                }
                PackCase::Config(..) => std::fs::write(p.join("config.json"), &cfg_bytes).unwrap(),
            }
        },
    );
    t.report("pack corruption");
}

// ------------------------------------------------- regressions (fixtures)

/// A llama fixture with one declaration changed.
fn fixture_with(key: &str, v: Value) -> (TempDir, PathBuf) {
    let src = onebit_testdata::fixture("llama").join("Q4_K_M.gguf");
    let g = Gguf::open(&src).unwrap();
    let mut w = GgufWriter::from_gguf(&g);
    w.set_kv(key, v);
    let tmp = TempDir::new("corrupt-kv");
    let p = tmp.file("m.gguf", &w.to_bytes());
    (tmp, p)
}

fn refused(path: &Path, needle: &str) {
    for args in commands(path, &path.with_extension("bin"), true) {
        let o = onebit(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert_eq!(o.code, Some(1), "{args:?}: {}", o.stderr);
        let last = o.stderr.lines().last().unwrap_or("");
        assert!(
            last.starts_with("error: ") && last.contains(needle),
            "{args:?}: {last}"
        );
        assert!(
            o.elapsed < Duration::from_secs(20),
            "{args:?} took {:?}",
            o.elapsed
        );
    }
}

/// Was a hang: a block count of 2^32-1 sized per-layer tables before any
/// tensor was looked at.
#[test]
fn a_block_count_of_billions_is_refused_quickly() {
    let (_t, p) = fixture_with("llama.block_count", Value::U32(u32::MAX));
    refused(&p, "llama.block_count");
}

/// Was a panic (multiply with overflow at load): heads x head dim.
#[test]
fn a_head_dim_that_overflows_is_refused() {
    let (_t, p) = fixture_with("llama.attention.key_length", Value::U64(1 << 62));
    refused(&p, "llama.attention.key_length");
    let (_t, p) = fixture_with("llama.feed_forward_length", Value::U64(u64::MAX));
    refused(&p, "llama.feed_forward_length");
}
