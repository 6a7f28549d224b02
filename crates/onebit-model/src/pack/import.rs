//! GGUF -> FastFlowLM pack weights and config.json, as FastFlowLM's converter
//! lays them out (names, tiles, family quirks), with two deliberate
//! differences: Q8_0 matrices are re-quantized to the family's type instead
//! of being sent through the Q4 packer (which keeps 4 bits of each code), or
//! kept as Q8 tiles on request; and the tokenizer is written from our GGUF
//! vocabulary (by the caller, which owns the tokenizer).
//!
//! - Q4_0 / Q4_1 matrices are tiled exactly (scales and minimums round to bf16).
//! - Every other quantized matrix is dequantized and quantized to the family
//!   default (`ImportRules::q4_kind` in the family's row: Q4_1, asymmetric,
//!   for llama, qwen2, qwen3, gemma3; Q4_0, symmetric, for lfm2).
//! - F32 / F16 / BF16 tensors, the embedding tables (`names::LOOKUP_TABLES`),
//!   norms and conv taps become BF16; RoPE divisor tables stay F32.
//! - A tensor the family's name table drops (pack name "") is not written:
//!   the family's config.json keys restate it (Gemma 4's `rope_freqs`).
//! - `unpermute_qk` (llama): q_proj / k_proj rows un-permuted (llama.cpp's
//!   converter permuted them for adjacent-pair RoPE), so the pack rotates halves.
//! - `prescale_embedding` (gemma3): the embedding stored as BF16 already
//!   multiplied by sqrt(hidden).
//! - The family's own config.json keys come from its `ImportRules::config`.
//! - `lm_head.weight` written from the embedding when the GGUF has no output.

use std::collections::BTreeMap;
use std::path::Path;

use half::bf16;
use onebit_formats::gguf::{Gguf, TensorInfo};
use onebit_formats::q4nx::{self, Q4Kind, Q4Shape, Q8Shape, Q8wShape, TileForm};
use onebit_formats::safetensors::{self, StDtype, StOut};
use onebit_formats::{blocks, GgmlType};
use serde_json::{json, Value as Json};

use super::layout::{self, PackLayout, Plain};
use super::names;
use crate::error::{ModelError, Result};
use crate::families::decls::Decls;
use crate::families::{self, ImportRules};
use crate::semantics::{LayerKind, RopeScaling, Semantics};

#[derive(Clone, Copy, Debug, Default)]
pub struct ImportOptions {
    /// Keep Q8_0 matrices as Q8 tiles (readable by onebit; FastFlowLM's
    /// runtime reads the family's Q4 type).
    pub keep_q8: bool,
    /// The Q4 tile form to write.
    pub tiles: Tiles,
}

/// Which Q4 tile form an import writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tiles {
    /// What FastFlowLM writes: quarter tiles for every Q4 matrix of a model
    /// whose hidden size is off the 256-column grid (its Gemma3-270M pack,
    /// K = 640), full tiles otherwise; half tiles for gpt-oss (its own
    /// layout, `super::gpt_oss`).
    #[default]
    Auto,
    /// One form for every Q4 matrix (for testing the readers).
    Force(TileForm),
}

impl Tiles {
    /// The form for a model of hidden size `hidden`, and why.
    pub fn resolve(self, hidden: usize) -> (TileForm, String) {
        match self {
            Tiles::Force(f) => (f, format!("{} for every Q4 matrix (forced)", f.name())),
            Tiles::Auto if !hidden.is_multiple_of(q4nx::COLS) => (
                TileForm::Quarter,
                format!(
                    "{} for every Q4 matrix: hidden size {hidden} is off the {}-column grid, so FastFlowLM writes quarter tiles (--tiles auto)",
                    TileForm::Quarter.name(),
                    q4nx::COLS
                ),
            ),
            Tiles::Auto => (
                TileForm::Full,
                format!(
                    "{} for every Q4 matrix: hidden size {hidden} is on the {}-column grid (--tiles auto)",
                    TileForm::Full.name(),
                    q4nx::COLS
                ),
            ),
        }
    }
}

/// What an import produced, before it is written.
pub struct Imported {
    pub tensors: Vec<StOut>,
    pub config: Json,
    /// The GGUF's semantics (what the pack's config.json restates).
    pub sem: Semantics,
    /// One line per decision worth telling the user.
    pub notes: Vec<String>,
}

fn kind_name_of(k: Q4Kind) -> &'static str {
    k.ggml().name()
}

/// llama.cpp's permutation of q/k rows, undone: within each head of `hd`
/// rows, GGUF row `2p + t` is HF row `t * hd/2 + p`.
fn unpermute_rows(data: &[u8], row_bytes: usize, n_heads: usize) -> Vec<u8> {
    let rows = data.len() / row_bytes;
    let hd = rows / n_heads;
    let mut out = vec![0u8; data.len()];
    for h in 0..n_heads {
        for p in 0..hd / 2 {
            for t in 0..2 {
                let src = h * hd + 2 * p + t;
                let dst = h * hd + t * (hd / 2) + p;
                out[dst * row_bytes..(dst + 1) * row_bytes]
                    .copy_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    out
}

/// `v` as little-endian bf16.
pub(super) fn to_bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
        .collect()
}

/// Converts the weights of `g` and derives config.json. `progress(done,
/// total, name)` is called once per tensor.
pub fn import(
    g: &Gguf,
    opts: ImportOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Imported> {
    let path = g.path().to_path_buf();
    let arch = g.str("general.architecture")?.to_string();
    let refuse = || ModelError::Unsupported {
        path: path.clone(),
        what: format!(
            "general.architecture `{arch}`: the pack converter handles {}",
            families::FAMILIES
                .iter()
                .filter(|f| f.import.is_some())
                .map(|f| f.arch)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let family = families::by_arch(&arch).ok_or_else(refuse)?;
    let rules = family.import.as_ref().ok_or_else(refuse)?;
    if let Some(own) = super::own_layout(family) {
        return (own.import)(g, family, rules, opts, progress);
    }
    if let Some(pl) = layout::of(family) {
        return import_laid_out(g, family, rules, pl, opts, progress);
    }
    let default_kind = rules.q4_kind;
    let rows = names::table(family).ok_or_else(|| ModelError::Unsupported {
        path: path.clone(),
        what: format!("family {arch} has import rules but no pack tensor-name table"),
    })?;
    let mut sem = families::semantics_from_gguf(g)?;
    if let Some(m) = &sem.moe {
        return Err(ModelError::Unsupported {
            path: path.clone(),
            what: format!(
                "{arch} with routed experts ({}): packs of mixture-of-experts models are not implemented",
                m.source
            ),
        });
    }
    restate_dropped_factors(g, family, &mut sem)?;
    let d = &sem.dims;
    let mut notes = Vec::new();
    let (form, why) = opts.tiles.resolve(d.n_embd);
    notes.push(format!("tiles: {why}"));
    // The chunk holds only the symmetric kind: re-quantize to Q4_0 there.
    let default_kind = match form.fixed_kind() {
        Some(k) if k != default_kind => {
            notes.push(format!(
                "the {} holds only {} weights: matrices re-quantized to {} instead of {arch}'s {}; {} matrices cannot be written in it",
                form.name(),
                k.name(),
                kind_name_of(k),
                kind_name_of(default_kind),
                kind_name_of(default_kind)
            ));
            k
        }
        _ => default_kind,
    };
    let terr = |name: &str, what: String| ModelError::Tensor {
        path: path.clone(),
        tensor: name.to_string(),
        what,
    };

    let plan = plan_names(g, family, &rows, &mut notes)?;
    let rope_tables: Vec<&String> = [&sem.rope_full.value, &sem.rope_sliding.value]
        .into_iter()
        .flat_map(|r| {
            r.freq_factors
                .iter()
                .chain(r.long_factors.iter().map(|(n, _)| n))
        })
        .collect();
    let kind_name = |k: Q4Kind| k.ggml().name();
    let mut requantized: BTreeMap<String, usize> = BTreeMap::new();
    let mut q8_seen = 0usize;
    let mut tensors = Vec::with_capacity(plan.len());
    for (gname, pname, info) in planned(g, &plan, progress) {
        let bytes = g.tensor_bytes(info);
        let is_row_table =
            names::LOOKUP_TABLES.contains(&gname.as_str()) && pname != "lm_head.weight";
        let is_matrix =
            info.dims.len() == 2 && !is_row_table && !gname.ends_with("shortconv.conv.weight");
        // llama: q/k rows back in HF order.
        let permute_heads = if rules.unpermute_qk && gname.ends_with("attn_q.weight") {
            Some(d.n_head)
        } else if rules.unpermute_qk && gname.ends_with("attn_k.weight") {
            Some(d.n_head_kv)
        } else {
            None
        };
        if !is_matrix {
            // Kept unquantized: BF16 with the HF shape (reversed ggml dims).
            let n = info.n_elements() as usize;
            let mut v = vec![0f32; n];
            blocks::dequantize(info.dtype, &bytes, &mut v)
                .map_err(|e| terr(gname, e.to_string()))?;
            if gname == "token_embd.weight" && is_row_table && rules.prescale_embedding {
                let s = (d.n_embd as f32).sqrt();
                v.iter_mut().for_each(|x| *x *= s);
                notes.push(format!(
                    "{arch}: {pname} stored as BF16 pre-scaled by sqrt({}) = {s}",
                    d.n_embd
                ));
            }
            // RoPE divisors stay F32: bf16 would move the angles (llama3's
            // 1.5534146 becomes 1.5546875).
            let (dtype, data) = if rope_tables.contains(&gname) {
                (
                    StDtype::F32,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )
            } else {
                (StDtype::BF16, to_bf16_bytes(&v))
            };
            tensors.push(StOut {
                name: pname.clone(),
                dtype,
                shape: info.dims.iter().rev().copied().collect(),
                data,
            });
            continue;
        }
        let (k, n) = (info.dims[0] as usize, info.dims[1] as usize);
        let row_bytes = info.dtype.row_bytes(k as u64).ok_or_else(|| {
            terr(
                gname,
                format!("row of {k} is not whole {} blocks", info.dtype),
            )
        })? as usize;
        let data: Vec<u8> = match permute_heads {
            Some(h) => {
                if !n.is_multiple_of(h) || !(n / h).is_multiple_of(2) {
                    return Err(terr(
                        gname,
                        format!("{n} rows do not split into {h} heads of even size"),
                    ));
                }
                unpermute_rows(&bytes, row_bytes, h)
            }
            None => bytes.to_vec(),
        };
        let out = match info.dtype {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                let mut v = vec![0f32; n * k];
                blocks::dequantize(info.dtype, &data, &mut v)
                    .map_err(|e| terr(gname, e.to_string()))?;
                StOut {
                    name: pname.clone(),
                    dtype: StDtype::BF16,
                    shape: vec![n as u64, k as u64],
                    data: to_bf16_bytes(&v),
                }
            }
            dt @ (GgmlType::Q4_0 | GgmlType::Q4_1) => {
                let s = Q4Shape::of(form, n, k).map_err(|e| terr(gname, e.0))?;
                StOut {
                    name: pname.clone(),
                    dtype: StDtype::I8,
                    shape: s.stored_shape(),
                    data: q4nx::from_ggml(dt, &data, s).map_err(|e| terr(gname, e.0))?,
                }
            }
            GgmlType::Q8_0 if opts.keep_q8 => {
                q8_seen += 1;
                let s = Q8Shape::new(n, k).map_err(|e| terr(gname, e.0))?;
                StOut {
                    name: pname.clone(),
                    dtype: StDtype::I8,
                    shape: s.stored_shape(),
                    data: q4nx::q8_from_q8_0(&data, s).map_err(|e| terr(gname, e.0))?,
                }
            }
            dt => {
                if dt == GgmlType::Q8_0 {
                    q8_seen += 1;
                }
                *requantized.entry(dt.name().to_string()).or_default() += 1;
                let s = Q4Shape::of(form, n, k).map_err(|e| terr(gname, e.0))?;
                // Bands of one tile row: tiles are in row-major block order,
                // so the bands' tiles concatenate into the tensor's.
                let band = Q4Shape::of(form, form.rows(), k).expect("checked above");
                let band_bytes = row_bytes * form.rows();
                let n_bands = n / form.rows();
                let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
                let per = n_bands.div_ceil(threads).max(1);
                let parts: Vec<Result<Vec<u8>>> = std::thread::scope(|sc| {
                    let hs: Vec<_> = data
                        .chunks(per * band_bytes)
                        .map(|chunk| {
                            sc.spawn(move || -> Result<Vec<u8>> {
                                let mut tiles = Vec::new();
                                let mut v = vec![0f32; band.n * k];
                                for rows in chunk.chunks_exact(band_bytes) {
                                    blocks::dequantize(dt, rows, &mut v)
                                        .map_err(|e| terr(gname, e.to_string()))?;
                                    tiles.extend(q4nx::quantize(&v, band, default_kind));
                                }
                                Ok(tiles)
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().expect("quantizer thread"))
                        .collect()
                });
                let mut tiles = Vec::with_capacity(s.bytes());
                for p in parts {
                    tiles.extend(p?);
                }
                let out = StOut {
                    name: pname.clone(),
                    dtype: StDtype::I8,
                    shape: s.stored_shape(),
                    data: tiles,
                };
                if default_kind == Q4Kind::Symmetric
                    && q4nx::tensor_kind_of(form, &out.data).ok() != Some(Q4Kind::Symmetric)
                {
                    return Err(terr(
                        gname,
                        "quantized symmetric, but no scale came out negative, so a reader would take it for asymmetric".into(),
                    ));
                }
                out
            }
        };
        tensors.push(out);
    }
    for (dt, count) in requantized.iter().filter(|(dt, _)| *dt != "Q8_0") {
        notes.push(format!(
            "{count} {dt} matrices re-quantized to {} (the {arch} default)",
            kind_name(default_kind)
        ));
    }
    if q8_seen > 0 {
        notes.push(if opts.keep_q8 {
            format!("{q8_seen} Q8_0 matrices kept as Q8 tiles (--keep-q8)")
        } else {
            format!(
                "{q8_seen} Q8_0 matrices re-quantized to {}: FastFlowLM's converter sends Q8_0 through its Q4 packer, which keeps only 4 bits of each code (--keep-q8 keeps Q8 tiles)",
                kind_name(default_kind)
            )
        });
    }
    let config = config_json(g, &sem, rules)?;
    check_restated(g, family, &sem, &config, &plan)?;
    Ok(Imported {
        tensors,
        config,
        sem,
        notes,
    })
}

/// The attention rules config.json states in HF's terms (KV heads per layer
/// kind, V from K), read back from the written config.json and the planned
/// tensors as a pack reader reads them, must be the GGUF's: a GGUF whose
/// rules HF's config cannot state (Gemma 4: V from K on some full layers
/// only, or full layers with their own KV head count but a V projection)
/// is refused by name rather than written as another model.
fn check_restated(
    g: &Gguf,
    family: &families::Family,
    sem: &Semantics,
    config: &Json,
    plan: &[(String, String)],
) -> Result<()> {
    let dims = |name: &str| {
        plan.iter()
            .any(|(n, _)| n == name)
            .then(|| g.tensor(name).map(|t| t.dims.clone()))
            .flatten()
    };
    let text = super::config::text_root(config);
    let d = Decls::config(&text, Path::new(super::CONFIG), family.arch, &dims);
    let refuse = |what: String| ModelError::Unsupported {
        path: g.path().to_path_buf(),
        what: format!(
            "the {} pack's config.json cannot state this GGUF's attention: {what}",
            family.arch
        ),
    };
    let back = (family.semantics)(&d).map_err(|e| refuse(e.to_string()))?;
    let rules = |s: &Semantics| {
        (
            [LayerKind::Full, LayerKind::Sliding].map(|k| s.kv_heads(k)),
            s.v_from_k.value.clone(),
        )
    };
    if rules(sem) != rules(&back) {
        let on = |s: &Semantics| {
            let v = &s.v_from_k.value;
            (0..v.len()).filter(|&i| v[i]).collect::<Vec<_>>()
        };
        return Err(refuse(format!(
            "KV heads (full, sliding) {:?} with V from K on layers {:?} ({}) would read back as {:?} on layers {:?}",
            rules(sem).0,
            on(sem),
            sem.v_from_k.source,
            rules(&back).0,
            on(&back)
        )));
    }
    Ok(())
}

/// RoPE divisors in a tensor the family's packs do not store (Gemma 4's
/// `rope_freqs`, dropped by its name table) are restated as HF's
/// "proportional" RoPE: the tensor must read 1 for the rotated pairs, then
/// 1e30 (no rotation), as llama.cpp's converter writes it; other values
/// cannot be restated and are refused by name.
fn restate_dropped_factors(g: &Gguf, family: &families::Family, sem: &mut Semantics) -> Result<()> {
    for rope in [&mut sem.rope_full, &mut sem.rope_sliding] {
        let Some(name) = rope.value.freq_factors.clone() else {
            continue;
        };
        if !names::dropped(family, &name) {
            continue;
        }
        let terr = |what: String| ModelError::Tensor {
            path: g.path().to_path_buf(),
            tensor: name.clone(),
            what,
        };
        let t = g
            .tensor(&name)
            .ok_or_else(|| terr("is named by the semantics but absent".into()))?;
        let n = t.n_elements() as usize;
        if n != rope.value.n_rot / 2 {
            return Err(terr(format!(
                "has {n} values for {} rotary pairs",
                rope.value.n_rot / 2
            )));
        }
        let mut v = vec![0f32; n];
        blocks::dequantize(t.dtype, &g.tensor_bytes(t), &mut v).map_err(|e| terr(e.to_string()))?;
        let rotated = v.iter().take_while(|&&x| x == 1.0).count();
        if v[rotated..].iter().any(|&x| x != 1e30) {
            return Err(terr(format!(
                "the {} pack restates it as proportional RoPE (1 for each rotated pair, then 1e30), but it holds other divisors",
                family.arch
            )));
        }
        rope.value.freq_factors = None;
        rope.value.proportional = Some(rotated);
    }
    Ok(())
}

/// config.json in HF form, restating the GGUF's semantics (the family's own
/// keys written by its import rules).
pub fn config_json(g: &Gguf, sem: &Semantics, rules: &ImportRules) -> Result<Json> {
    let d = &sem.dims;
    let mut c = json!({
        "architectures": [rules.hf_arch],
        "model_type": rules.model_type,
        "hidden_size": d.n_embd,
        "intermediate_size": d.n_ff,
        "num_hidden_layers": d.n_layer,
        "num_attention_heads": d.n_head,
        "num_key_value_heads": d.n_head_kv,
        "head_dim": d.head_dim_k,
        "vocab_size": d.n_vocab,
        "rope_theta": sem.rope_full.value.base,
        "tie_word_embeddings": sem.tied_output.value,
        "torch_dtype": "bfloat16",
    });
    let eps_key = rules.eps_key;
    // The f32 epsilon as its shortest decimal (1e-6, not 9.99999997e-7).
    c[eps_key] = json!(sem
        .norm_eps
        .value
        .to_string()
        .parse::<f64>()
        .unwrap_or(sem.norm_eps.value as f64));
    if d.n_ctx_train > 0 {
        c["max_position_embeddings"] = json!(d.n_ctx_train);
    }
    if let Some(b) = g.u64_opt("tokenizer.ggml.bos_token_id")? {
        c["bos_token_id"] = json!(b);
    }
    if let Some(e) = g.u64_opt("tokenizer.ggml.eos_token_id")? {
        c["eos_token_id"] = json!(e);
    }
    if let RopeScaling::Linear { factor } = sem.rope_full.value.scaling {
        c["rope_scaling"] = json!({"rope_type": "linear", "factor": factor});
    }
    (rules.config)(sem, &mut c);
    Ok(c)
}

/// Writes `model.q4nx` and `config.json` into `dir` (created if needed).
pub fn write(dir: &Path, imp: &Imported) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::Unsupported {
        path: dir.to_path_buf(),
        what: format!("cannot create the pack directory: {e}"),
    })?;
    let meta = BTreeMap::from([("format".to_string(), "q4nx".to_string())]);
    safetensors::write(&dir.join(super::WEIGHTS), &imp.tensors, &meta)?;
    let cfg = dir.join(super::CONFIG);
    std::fs::write(
        &cfg,
        serde_json::to_string_pretty(&imp.config).expect("JSON serializes") + "\n",
    )
    .map_err(|e| ModelError::Unsupported {
        path: cfg,
        what: format!("cannot write: {e}"),
    })
}

/// The import of a family whose converter lays tensors out
/// ([`layout::PackLayout`], FastFlowLM's MoE packs): the layout's ops
/// applied (GGUF -> stored), expert stacks flattened expert-major; the
/// layout's BF16 and F32 tensors in those types; Q4_1 full tiles
/// ([N/32, Kp/256, 5120]) for its Q4 matrices (Q4_1 sources repacked
/// exactly, others re-quantized; with `keep_q8`, Q8_0 sources kept as wide
/// Q8 tiles); wide Q8 tiles for every other quantized matrix (Q8_0 sources
/// exact up to bf16 scales, others re-quantized to Q8_0). Float matrices
/// stay BF16, as for every family (the converter quantizes them).
fn import_laid_out(
    g: &Gguf,
    family: &families::Family,
    rules: &ImportRules,
    pl: &PackLayout,
    opts: ImportOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Imported> {
    let path = g.path().to_path_buf();
    let arch = family.arch;
    let terr = |name: &str, what: String| ModelError::Tensor {
        path: path.clone(),
        tensor: name.to_string(),
        what,
    };
    if let Tiles::Force(f) = opts.tiles {
        if f != TileForm::Full {
            return Err(ModelError::Unsupported {
                path: path.clone(),
                what: format!(
                    "--tiles {}: {} packs hold their Q4 matrices in full tiles only ({})",
                    f.name(),
                    arch,
                    pl.source
                ),
            });
        }
    }
    let rows = names::table(family).ok_or_else(|| ModelError::Unsupported {
        path: path.clone(),
        what: format!("family {arch} has import rules but no pack tensor-name table"),
    })?;
    let sem = families::semantics_from_gguf(g)?;
    let config = config_json(g, &sem, rules)?;
    let lay = (pl.resolve)(&config).map_err(|(key, what)| ModelError::Key {
        path: path.clone(),
        key,
        what: format!("{what} (writing the layout of {})", pl.source),
    })?;
    let mut notes = vec![format!(
        "{arch}: laid out as {}: experts in Q4_1 full tiles [N/32, Kp/256, 5120], other quantized matrices in wide Q8 tiles [N/32, Kp/256, 8704], V heads in grouped order, q_proj as queries then gates",
        pl.source
    )];
    let plan = plan_names(g, family, &rows, &mut notes)?;
    let mut requantized: BTreeMap<String, usize> = BTreeMap::new();
    let (mut kept_float, mut rounded) = (0usize, 0usize);
    let mut tensors = Vec::with_capacity(plan.len());
    for (gname, pname, info) in planned(g, &plan, progress) {
        let mut t = Plain {
            dtype: info.dtype,
            dims: info.dims.clone(),
            bytes: g.tensor_bytes(info).to_vec(),
        };
        let lm_head = pname == "lm_head.weight";
        // The layout's names are GGUF names of the tensor itself; lm_head
        // written from the embedding is a matrix like output.weight.
        let key = if lm_head {
            "output.weight"
        } else {
            gname.as_str()
        };
        if layout::listed(pl.experts, key) {
            t.dims = match t.dims.as_slice() {
                &[k, r, e] => vec![k, r * e],
                d => {
                    return Err(terr(
                        gname,
                        format!("an expert stack must be 3-D, found dims {d:?}"),
                    ))
                }
            };
        }
        let plain_as = if layout::listed(pl.f32, key) {
            Some(StDtype::F32)
        } else if layout::listed(pl.bf16, key) || t.dims.len() == 1 {
            Some(StDtype::BF16)
        } else if !t.dtype.is_quantized() {
            kept_float += 1;
            Some(StDtype::BF16)
        } else {
            None
        };
        let ops = lay.ops_of(key);
        if let Some(dt) = plain_as {
            let f = t
                .to_f32()
                .and_then(|f| f.store(ops))
                .map_err(|e| terr(gname, e))?;
            let v: Vec<f32> = f
                .bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect();
            tensors.push(StOut {
                name: pname.clone(),
                dtype: dt,
                shape: f.dims.iter().rev().copied().collect(),
                data: if dt == StDtype::F32 {
                    f.bytes
                } else {
                    to_bf16_bytes(&v)
                },
            });
            continue;
        }
        if t.dims.len() != 2 {
            return Err(terr(
                gname,
                format!(
                    "dims {:?}: a quantized tensor the {arch} layout stores must be a matrix",
                    t.dims
                ),
            ));
        }
        let t = t.store(ops).map_err(|e| terr(gname, e))?;
        let (k, n) = (t.dims[0] as usize, t.dims[1] as usize);
        let q4 = layout::listed(pl.q4, key) && !(opts.keep_q8 && t.dtype == GgmlType::Q8_0);
        let out = if q4 {
            let s = Q4Shape::of(TileForm::Full, n, k).map_err(|e| terr(gname, e.0))?;
            let data = if t.dtype == GgmlType::Q4_1 {
                q4nx::from_ggml(GgmlType::Q4_1, &t.bytes, s).map_err(|e| terr(gname, e.0))?
            } else {
                *requantized
                    .entry(format!("{} -> Q4_1", t.dtype.name()))
                    .or_default() += 1;
                banded(&t, q4nx::ROWS, |v| {
                    let band = Q4Shape::of(TileForm::Full, q4nx::ROWS, k).expect("checked above");
                    Ok(q4nx::quantize(v, band, Q4Kind::Asymmetric))
                })
                .map_err(|e| terr(gname, e))?
            };
            StOut {
                name: pname.clone(),
                dtype: StDtype::I8,
                shape: vec![
                    (n / q4nx::ROWS) as u64,
                    s.tiles_per_row() as u64,
                    q4nx::TILE_BYTES as u64,
                ],
                data,
            }
        } else {
            let s = Q8wShape::new(n, k).map_err(|e| terr(gname, e.0))?;
            let data = if t.dtype == GgmlType::Q8_0 {
                let (d, r) = q4nx::q8w_from_q8_0(&t.bytes, s).map_err(|e| terr(gname, e.0))?;
                rounded += r;
                d
            } else {
                *requantized
                    .entry(format!("{} -> Q8_0", t.dtype.name()))
                    .or_default() += 1;
                banded(&t, q4nx::ROWS, |v| {
                    let band = Q8wShape::new(q4nx::ROWS, k).map_err(|e| e.0)?;
                    q4nx::q8w_from_q8_0(&q4nx::quantize_q8_0_bf16(v), band)
                        .map(|(d, _)| d)
                        .map_err(|e| e.0)
                })
                .map_err(|e| terr(gname, e))?
            };
            StOut {
                name: pname.clone(),
                dtype: StDtype::I8,
                shape: s.stored_shape(),
                data,
            }
        };
        tensors.push(out);
    }
    for (what, count) in &requantized {
        notes.push(format!(
            "{count} matrices re-quantized {what} (the {arch} converter's types)"
        ));
    }
    if rounded > 0 {
        notes.push(format!("{rounded} Q8_0 scales rounded f16 -> bf16"));
    }
    if kept_float > 0 {
        notes.push(format!(
            "{kept_float} float matrices kept as BF16 (FastFlowLM's converter quantizes them)"
        ));
    }
    if opts.keep_q8 {
        notes.push("--keep-q8: Q8_0 experts kept as wide Q8 tiles (FastFlowLM's runtime reads Q4_1 experts)".into());
    }
    Ok(Imported {
        tensors,
        config,
        sem,
        notes,
    })
}

/// Tiles of a matrix made band by band (`rows` rows each, one tile row):
/// each band's values decoded to f32 and handed to `tile`; tiles are in
/// row-major block order, so the bands' tiles concatenate.
pub(super) fn banded(
    t: &Plain,
    rows: usize,
    tile: impl Fn(&[f32]) -> std::result::Result<Vec<u8>, String>,
) -> std::result::Result<Vec<u8>, String> {
    let k = t.dims[0];
    let rb = t
        .dtype
        .row_bytes(k)
        .ok_or_else(|| format!("a row of {k} is not whole {} blocks", t.dtype))?
        as usize;
    let n = t.dims[1] as usize;
    if !n.is_multiple_of(rows) {
        return Err(format!("{n} rows are not whole tile rows of {rows}"));
    }
    let mut out = Vec::new();
    let mut v = vec![0f32; rows * k as usize];
    for band in t.bytes.chunks_exact(rb * rows) {
        blocks::dequantize(t.dtype, band, &mut v).map_err(|e| e.to_string())?;
        out.extend(tile(&v)?);
    }
    Ok(out)
}

/// The tensors to write, in GGUF order, each with its pack name (a tensor
/// the family's table maps to no name is refused; one its config.json
/// restates is left out, with a note), plus lm_head from the embedding when
/// the GGUF ties its output.
pub(super) fn plan_names(
    g: &Gguf,
    family: &crate::families::Family,
    rows: &[names::Row],
    notes: &mut Vec<String>,
) -> Result<Vec<(String, String)>> {
    let arch = family.arch;
    let mut plan = Vec::new();
    for t in &g.tensors {
        if names::dropped(family, &t.name) {
            notes.push(format!(
                "{}: not written; the {arch} pack's config.json restates it",
                t.name
            ));
            continue;
        }
        let pack = names::to_pack(rows, &t.name).ok_or_else(|| ModelError::Tensor {
            path: g.path().to_path_buf(),
            tensor: t.name.clone(),
            what: format!("has no name in the {arch} pack table, so it cannot be imported"),
        })?;
        plan.push((t.name.clone(), pack));
    }
    if g.tensor("output.weight").is_none() {
        plan.push(("token_embd.weight".into(), "lm_head.weight".into()));
        notes
            .push("no output.weight in the GGUF: lm_head.weight written from the embedding".into());
    }
    Ok(plan)
}

/// The planned tensors in order, each with its GGUF tensor; calls
/// `progress(done, total, pack name)` before each and `progress(total,
/// total, "done")` once after the last.
pub(super) fn planned<'a>(
    g: &'a Gguf,
    plan: &'a [(String, String)],
    progress: &'a mut dyn FnMut(usize, usize, &str),
) -> impl Iterator<Item = (&'a String, &'a String, &'a TensorInfo)> + 'a {
    let total = plan.len();
    let mut rest = plan.iter().enumerate();
    let mut finished = false;
    std::iter::from_fn(move || match rest.next() {
        Some((done, (gname, pname))) => {
            progress(done, total, pname);
            Some((
                gname,
                pname,
                g.tensor(gname).expect("planned from the file"),
            ))
        }
        None => {
            if !finished {
                finished = true;
                progress(total, total, "done");
            }
            None
        }
    })
}
