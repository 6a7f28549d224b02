//! What the pack and gpt-oss tests share: a model's logits over ids and the
//! two measures they compare a pack's logits with its GGUF's by (the lowest
//! per-position cosine, the share of positions with the same argmax);
//! importing a GGUF into a pack (or the refusal's text), bf16 rounding as a
//! pack keeps values, rewriting one tensor of a written pack; and
//! gpt-oss-20b's GGUF metadata.
//!
//! Each test binary uses a part of this module.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use onebit_formats::gguf::writer::GgufWriter;
use onebit_formats::gguf::{Gguf, Value};
use onebit_formats::safetensors::{self, SafeTensors, StOut};
use onebit_model::pack::import::{self, ImportOptions};
use onebit_model::{load, ExecConfig, Logits};

/// Every position's logits of `ids` on the model at `path`, one thread.
pub fn logits(path: &Path, ids: &[u32]) -> Vec<f32> {
    let exec = ExecConfig {
        threads: 1,
        ..Default::default()
    };
    let (m, _) = load::load(path, &exec).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut st = m.new_state();
    m.forward(&mut st, ids, Logits::All).unwrap()
}

/// The lowest cosine between the two arrays' rows of `nv` logits.
pub fn min_cos(a: &[f32], b: &[f32], nv: usize) -> f32 {
    a.chunks(nv)
        .zip(b.chunks(nv))
        .map(|(x, y)| {
            let d: f32 = x.iter().zip(y).map(|(p, q)| p * q).sum();
            let n = |v: &[f32]| v.iter().map(|p| p * p).sum::<f32>().sqrt();
            d / n(x) / n(y)
        })
        .fold(1.0, f32::min)
}

/// The share of rows of `nv` logits whose argmax the two arrays agree on.
pub fn top1_agreement(a: &[f32], b: &[f32], nv: usize) -> f32 {
    let n = a.len() / nv;
    a.chunks(nv)
        .zip(b.chunks(nv))
        .filter(|(x, y)| onebit_testdata::argmax(x) == onebit_testdata::argmax(y))
        .count() as f32
        / n as f32
}

/// Imports the GGUF at `gguf` with `opts` and writes the pack to `dir`;
/// returns the import's notes.
pub fn import_pack(gguf: &Path, dir: &Path, opts: ImportOptions) -> Vec<String> {
    let g = Gguf::open(gguf).unwrap();
    let imp = import::import(&g, opts, &mut |_, _, _| {}).unwrap();
    import::write(dir, &imp).unwrap();
    imp.notes
}

/// The text of the refusal importing the GGUF at `gguf` with `opts` gives.
pub fn import_err(gguf: &Path, opts: ImportOptions) -> String {
    let g = Gguf::open(gguf).unwrap();
    import::import(&g, opts, &mut |_, _, _| {})
        .err()
        .expect("refused")
        .to_string()
}

/// `x` through bf16, as a pack keeps it.
pub fn bf(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// The little-endian bf16 at byte `at` of `b`.
pub fn bf16_at(b: &[u8], at: usize) -> f32 {
    bf16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// GGUF Q4_1 blocks with each scale and minimum passed through bf16: what
/// a Q4 tile keeps.
pub fn rounded_q4_1(b: &[u8]) -> Vec<u8> {
    let mut b = b.to_vec();
    for blk in b.chunks_exact_mut(20) {
        for at in [0, 2] {
            let v = f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32();
            blk[at..at + 2].copy_from_slice(&f16::from_f32(bf(v)).to_le_bytes());
        }
    }
    b
}

/// Rewrites one tensor of the pack in `dir` (name, dtype, shape, bytes).
pub fn rewrite(dir: &Path, name: &str, f: impl Fn(&mut StOut)) {
    edit_tensor(dir, name, |t| {
        f(t);
        true
    });
}

/// Drops one tensor of the pack in `dir`.
pub fn drop_tensor(dir: &Path, name: &str) {
    edit_tensor(dir, name, |_| false);
}

/// Rewrites one tensor of the pack in `dir`; `f` returning false drops it.
fn edit_tensor(dir: &Path, name: &str, f: impl Fn(&mut StOut) -> bool) {
    let p = dir.join("model.q4nx");
    let st = SafeTensors::open(&p).unwrap();
    let mut out: Vec<StOut> = st
        .tensors
        .iter()
        .map(|t| StOut {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            data: st.bytes(t).to_vec(),
        })
        .collect();
    drop(st);
    let i = out.iter().position(|t| t.name == name).unwrap();
    if !f(&mut out[i]) {
        out.remove(i);
    }
    safetensors::write(&p, &out, &BTreeMap::new()).unwrap();
}

/// gpt-oss-20b's metadata as its GGUF states it (llama.cpp's converter),
/// no tensors, with `over`'s keys (after `gpt-oss.`) replaced or added.
pub fn gpt_oss_20b_meta(over: &[(&str, Value)]) -> GgufWriter {
    const A: &str = "gpt-oss";
    let mut kv: Vec<(&str, Value)> = vec![
        ("context_length", Value::U32(131072)),
        ("embedding_length", Value::U32(2880)),
        ("block_count", Value::U32(24)),
        ("feed_forward_length", Value::U32(2880)),
        ("attention.head_count", Value::U32(64)),
        ("attention.head_count_kv", Value::U32(8)),
        ("attention.key_length", Value::U32(64)),
        ("attention.value_length", Value::U32(64)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("attention.sliding_window", Value::U32(128)),
        ("rope.freq_base", Value::F32(150000.0)),
        ("rope.scaling.type", Value::Str("yarn".into())),
        ("rope.scaling.factor", Value::F32(32.0)),
        ("rope.scaling.original_context_length", Value::U32(4096)),
        ("expert_count", Value::U32(32)),
        ("expert_used_count", Value::U32(4)),
        ("expert_feed_forward_length", Value::U32(2880)),
        ("vocab_size", Value::U32(201088)),
    ];
    for (k, v) in over {
        kv.retain(|(x, _)| x != k);
        kv.push((k, v.clone()));
    }
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str(A.into()));
    for (k, v) in kv {
        w.kv(&format!("{A}.{k}"), v);
    }
    w
}
