//! FastFlowLM packs: a directory with `model.q4nx` (safetensors of tiled
//! weights), the model's HF `config.json`, `tokenizer.json`,
//! `tokenizer_config.json` and, where present, `generation_config.json` and
//! `chat_template.jinja`; a model that sees images also `vision_weights.q4nx`
//! and `preprocessor_config.json` (its tower: [`vision`]).
//!
//! The reader maps the pack's HF-style names to the GGUF names the loader
//! asks for (`names`), and untiles each tiled tensor at open into the ggml
//! block type the kernels already run. A Q4 tensor's tile form is named by
//! its declared row width: 5,120 bytes the full tile ([tiles, 5120]), 1,280
//! the quarter tile ([N/16, Kp/128, 1280]), 4,608 the symmetric chunk
//! ([N/32, Kp/256, 4608]); any other width is refused by name. Asymmetric Q4
//! tiles become Q4_1 blocks, symmetric ones Q4_0, Q8 tiles Q8_0 (bf16 scales
//! become f16, exact at or above 2^-17). BF16/F16/F32 tensors are used in place
//! (memory-mapped). The kernels never read tiles.
//!
//! A family whose converter lays its pack out in its own way has an
//! [`OwnLayout`] ([`own_layout`]): its module reads, imports and verifies
//! the whole pack (gpt-oss: `gpt_oss`).

pub mod config;
pub mod gpt_oss;
pub mod import;
pub mod layout;
pub mod names;
pub mod verify;
pub mod vision;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use onebit_formats::q4nx::{self, Q4Kind, Q4Shape, TileForm, Q8W_TILE_BYTES, TILE_BYTES};
use onebit_formats::safetensors::{SafeTensors, StDtype, StTensor};
use onebit_formats::{ByteView, GgmlType};
use serde_json::Value as Json;

use crate::error::{ModelError, Result};
use crate::families::decls::Decls;
use crate::families::Family;
use crate::semantics::Semantics;
use crate::weights::{RawTensor, TensorSource};

pub use config::{SpecialFacts, TokenRef};

/// How a tensor is stored in the pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Form {
    Plain(&'static str),
    /// Q4 tiles of a form, and the tensor's kind.
    Q4(TileForm, &'static str),
    Q8,
    /// The MoE packs' wide Q8 tiles (32 x 256, 8,704 bytes).
    Q8w,
    /// gpt-oss's MXFP4 expert tiles (32 x 128, 2,560 bytes).
    Mx,
}

impl std::fmt::Display for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Form::Plain(d) => write!(f, "{d}"),
            Form::Q4(TileForm::Full, k) => write!(f, "I8 Q4 tiles, {k}"),
            Form::Q4(TileForm::Half, k) => write!(f, "I8 Q4 half tiles (32 x 128), {k}"),
            Form::Q4(TileForm::Quarter, k) => write!(f, "I8 Q4 quarter tiles (16 x 128), {k}"),
            Form::Q4(TileForm::Chunk4608, k) => write!(f, "I8 Q4 4,608-byte chunks, {k}"),
            Form::Q8 => write!(f, "I8 Q8 tiles"),
            Form::Q8w => write!(f, "I8 wide Q8 tiles (32 x 256, 8,704 bytes)"),
            Form::Mx => write!(f, "U8 MXFP4 tiles (32 x 128, 2,560 bytes)"),
        }
    }
}

/// One tensor of a pack, as read and as handed to the loader.
pub struct PackTensor {
    pub pack_name: String,
    pub gguf_name: String,
    pub form: Form,
    pub stored_shape: Vec<u64>,
    pub stored_bytes: usize,
    pub raw: RawTensor,
    /// Scales/minimums that f16 could not hold exactly when untiled.
    pub inexact_scales: usize,
}

/// An open pack.
pub struct Pack {
    dir: PathBuf,
    weights_path: PathBuf,
    /// config.json as written.
    pub config: Json,
    /// The text model's declarations ([`config::text_root`]).
    pub text: Json,
    pub tokenizer_config: Option<Json>,
    pub generation_config: Option<Json>,
    pub family: &'static Family,
    pub tensors: Vec<PackTensor>,
    index: HashMap<String, usize>,
    /// Pack tensors the family's name table does not name (e.g. a vision tower).
    pub unmapped: Vec<String>,
}

pub const WEIGHTS: &str = "model.q4nx";
pub const CONFIG: &str = "config.json";
pub const TOKENIZER: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
pub const GENERATION_CONFIG: &str = "generation_config.json";
pub const CHAT_TEMPLATE: &str = "chat_template.jinja";

/// An [`OwnLayout`]'s reader: the pack's tensors, loader-ready, and the
/// names it does not use, from the weights, the family's name table, the
/// text config and config.json's path.
pub type OwnRead =
    fn(&SafeTensors, &[names::Row], &Json, &Path) -> Result<(Vec<PackTensor>, Vec<String>)>;
/// An [`OwnLayout`]'s importer, as [`import::import`] calls it.
pub type OwnImport = fn(
    &onebit_formats::gguf::Gguf,
    &'static Family,
    &crate::families::ImportRules,
    import::ImportOptions,
    &mut dyn FnMut(usize, usize, &str),
) -> Result<import::Imported>;

/// A pack layout a family's own module reads, writes and verifies whole
/// (for converters whose output the name table and [`layout::PackLayout`]'s
/// per-tensor ops cannot describe: merged tensors, grouped tiles).
pub struct OwnLayout {
    /// Where the layout is read (the converter's files).
    pub source: &'static str,
    pub read: OwnRead,
    pub import: OwnImport,
    /// Checks of the layout's own invariants, for `inspect --verify`.
    pub verify: fn(&Pack) -> Result<Vec<verify::LayoutCheck>>,
}

/// The families whose packs have an [`OwnLayout`].
pub fn own_layout(family: &Family) -> Option<&'static OwnLayout> {
    match family.arch {
        "gpt-oss" => Some(&gpt_oss::LAYOUT),
        _ => None,
    }
}

fn read_json(path: &Path, required: bool) -> Result<Option<Json>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ModelError::Unsupported {
                path: path.to_path_buf(),
                what: format!("cannot read: {e}"),
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::Unsupported {
            path: path.to_path_buf(),
            what: format!("is not valid JSON: {e}"),
        })
}

impl Pack {
    /// Whether `dir` looks like a pack (holds `model.q4nx`).
    pub fn is_pack(dir: &Path) -> bool {
        dir.join(WEIGHTS).is_file()
    }

    pub fn open(dir: &Path) -> Result<Pack> {
        let config_path = dir.join(CONFIG);
        let config = read_json(&config_path, true)?.expect("required");
        let family = config::family_of(&config).ok_or_else(|| ModelError::Unsupported {
            path: config_path.clone(),
            what: format!(
                "names {}, not a family onebit runs (supported: {})",
                config::declared_names(&config),
                crate::families::FAMILIES
                    .iter()
                    .flat_map(|f| f.hf_names.iter().copied())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })?;
        let rows = names::table(family).ok_or_else(|| ModelError::Unsupported {
            path: config_path.clone(),
            what: format!(
                "family {} has no pack tensor-name table (packs of {} are read)",
                family.arch,
                crate::families::FAMILIES
                    .iter()
                    .filter(|f| f.pack.is_some())
                    .map(|f| f.arch)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })?;
        let text = config::text_root(&config);
        let tokenizer_config = read_json(&dir.join(TOKENIZER_CONFIG), false)?;
        let generation_config = read_json(&dir.join(GENERATION_CONFIG), false)?;
        let weights_path = dir.join(WEIGHTS);
        let st = SafeTensors::open(&weights_path)?;
        if let Some(own) = own_layout(family) {
            let (tensors, unmapped) = (own.read)(&st, &rows, &text, &config_path)?;
            return Ok(Pack::assemble(
                dir,
                weights_path,
                config,
                text,
                tokenizer_config,
                generation_config,
                family,
                tensors,
                unmapped,
            ));
        }

        let hidden = text
            .get("hidden_size")
            .and_then(Json::as_u64)
            .ok_or_else(|| ModelError::Key {
                path: config_path.clone(),
                key: "hidden_size".into(),
                what: "is required to read the tiled matrices' shapes".into(),
            })? as usize;

        let mut unmapped = Vec::new();
        let mut by_gguf: BTreeMap<String, &StTensor> = BTreeMap::new();
        for t in &st.tensors {
            match names::to_gguf(&rows, &t.name) {
                Some(g) => {
                    by_gguf.insert(g, t);
                }
                None => unmapped.push(t.name.clone()),
            }
        }
        // Tiled matrices do not state their logical shape. K is the hidden
        // size for every matrix reading the residual stream; the others
        // (`names::INPUT_FROM`: the attention output, the down projection,
        // ...) read what a partner matrix produces, so they come second.
        let n_of = |done: &[PackTensor], g: &str| {
            done.iter()
                .find(|t| t.gguf_name == g)
                .map(|t| t.raw.dims[1] as usize)
        };
        let mut tensors: Vec<PackTensor> = Vec::new();
        if let Some(pl) = layout::of(family) {
            let lay = (pl.resolve)(&text).map_err(|(key, what)| ModelError::Key {
                path: config_path.clone(),
                key,
                what: format!("{what} (the layout of {})", pl.source),
            })?;
            for (g, t) in &by_gguf {
                tensors.push(read_laid_out(&st, t, g, &lay, pl, hidden)?);
            }
        }
        for pass in [false, true] {
            if layout::of(family).is_some() {
                break;
            }
            for (g, t) in &by_gguf {
                let partners = names::input_from(g);
                if partners.is_some() != pass {
                    continue;
                }
                let tiled = t.dtype == StDtype::I8;
                let (hint, k_cols) = if !tiled {
                    (KHint::None, None)
                } else if let Some(partners) = partners {
                    let k = partners
                        .iter()
                        .find_map(|p| n_of(&tensors, p))
                        .ok_or_else(|| {
                            st.tensor_error(
                                &t.name,
                                format!(
                                    "its input width comes from `{}`, which the pack lacks",
                                    names::to_pack(&rows, &partners[0])
                                        .unwrap_or(partners[0].clone())
                                ),
                            )
                        })?;
                    (KHint::Rows(hidden), Some(k))
                } else {
                    (KHint::Cols(hidden), Some(hidden))
                };
                tensors.push(read_tensor(&st, t, g, hint, k_cols, false)?);
            }
        }
        Ok(Pack::assemble(
            dir,
            weights_path,
            config,
            text,
            tokenizer_config,
            generation_config,
            family,
            tensors,
            unmapped,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        dir: &Path,
        weights_path: PathBuf,
        config: Json,
        text: Json,
        tokenizer_config: Option<Json>,
        generation_config: Option<Json>,
        family: &'static Family,
        tensors: Vec<PackTensor>,
        unmapped: Vec<String>,
    ) -> Pack {
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.gguf_name.clone(), i))
            .collect();
        Pack {
            dir: dir.to_path_buf(),
            weights_path,
            config,
            text,
            tokenizer_config,
            generation_config,
            family,
            tensors,
            index,
            unmapped,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn by_gguf(&self, name: &str) -> Option<&PackTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// Semantics from config.json by the family's own rules.
    pub fn semantics(&self) -> Result<Semantics> {
        let dims = |name: &str| self.by_gguf(name).map(|t| t.raw.dims.clone());
        let d = Decls::config(&self.text, &self.dir.join(CONFIG), self.family.arch, &dims);
        (self.family.semantics)(&d)
    }

    /// BOS/EOS facts from the pack's JSON files.
    pub fn special_facts(&self) -> SpecialFacts {
        config::special_facts(
            &self.text,
            self.tokenizer_config.as_ref(),
            self.generation_config.as_ref(),
        )
    }

    /// The chat template: `chat_template.jinja`, else tokenizer_config.json's.
    pub fn chat_template(&self) -> Option<(String, String)> {
        let p = self.dir.join(CHAT_TEMPLATE);
        if let Ok(t) = std::fs::read_to_string(&p) {
            return Some((t, CHAT_TEMPLATE.into()));
        }
        self.tokenizer_config
            .as_ref()?
            .get("chat_template")?
            .as_str()
            .map(|t| (t.to_string(), format!("{TOKENIZER_CONFIG} chat_template")))
    }

    /// Census lines: tensors by stored dtype and tile kind.
    pub fn census(&self) -> Vec<String> {
        let mut by: BTreeMap<Form, (usize, usize, usize)> = BTreeMap::new();
        for t in &self.tensors {
            let e = by.entry(t.form).or_default();
            e.0 += 1;
            e.1 += t.stored_bytes;
            e.2 += t.inexact_scales;
        }
        let mut out: Vec<String> = by
            .into_iter()
            .map(|(f, (n, b, inexact))| {
                let mut s = format!("{f}: {n} tensors, {:.1} MiB", b as f64 / (1 << 20) as f64);
                if inexact > 0 {
                    s += &format!(", {inexact} scales rounded bf16 -> f16");
                }
                s
            })
            .collect();
        if !self.unmapped.is_empty() {
            out.push(format!(
                "not used (no name in the {} table): {} tensors, e.g. {}",
                self.family.arch,
                self.unmapped.len(),
                self.unmapped[0]
            ));
        }
        out
    }
}

impl TensorSource for Pack {
    fn path(&self) -> &Path {
        &self.weights_path
    }
    fn tensor(&self, name: &str) -> Option<RawTensor> {
        self.by_gguf(name).map(|t| t.raw.clone())
    }
}

#[derive(Clone, Copy)]
enum KHint {
    None,
    /// The matrix's input width K is known.
    Cols(usize),
    /// Its output count N is known.
    Rows(usize),
}

/// Reads one pack tensor into a loader-ready tensor. `shape_hint` says which
/// logical dimension is known for tiled tensors; `k_cols` is K when known.
fn read_tensor(
    st: &SafeTensors,
    t: &StTensor,
    gguf: &str,
    shape_hint: KHint,
    k_cols: Option<usize>,
    wide: bool,
) -> Result<PackTensor> {
    let err = |what: String| ModelError::from(st.tensor_error(&t.name, what));
    let bytes = st.bytes(t);
    let plain = |dtype: GgmlType, name: &'static str| -> Result<PackTensor> {
        // Row-major shape, outermost first; ggml dims are the reverse.
        // Size-1 dimensions of higher-rank tensors (conv taps [C, 1, L]) are dropped.
        let mut dims: Vec<u64> = t.shape.iter().rev().copied().collect();
        if dims.len() > 2 {
            dims.retain(|&d| d != 1);
        }
        Ok(PackTensor {
            pack_name: t.name.clone(),
            gguf_name: gguf.to_string(),
            form: Form::Plain(name),
            stored_shape: t.shape.clone(),
            stored_bytes: t.len,
            raw: RawTensor {
                dtype,
                dims,
                bytes: bytes.clone(),
            },
            inexact_scales: 0,
        })
    };
    match t.dtype {
        StDtype::BF16 => return plain(GgmlType::BF16, "BF16"),
        StDtype::F16 => return plain(GgmlType::F16, "F16"),
        StDtype::F32 => return plain(GgmlType::F32, "F32"),
        StDtype::I8 => {}
        StDtype::U8 => {
            return Err(err(
                "is U8; a pack's tiled matrices are I8 (FastFlowLM writes its tiles as int8)"
                    .into(),
            ))
        }
    }
    let tiled =
        |n: usize, k: usize, form: Form, dtype: GgmlType, data: Vec<u8>, inexact| PackTensor {
            pack_name: t.name.clone(),
            gguf_name: gguf.to_string(),
            form,
            stored_shape: t.shape.clone(),
            stored_bytes: t.len,
            raw: RawTensor {
                dtype,
                dims: vec![k as u64, n as u64],
                bytes: ByteView::from_vec(data),
            },
            inexact_scales: inexact,
        };
    match t.shape.as_slice() {
        // Q8 tiles: [N/32, Kp/128, 5120]; in a MoE pack wide Q8 tiles
        // instead, [N/32, Kp/256, 8704] (its 5,120-byte rows are Q4 full
        // tiles in that shape).
        &[nb, kb, w]
            if (wide && w as usize == Q8W_TILE_BYTES) || (!wide && w as usize == TILE_BYTES) =>
        {
            let (tiles, form) = if wide {
                (q4nx::Q8W_TILE, Form::Q8w)
            } else {
                (q4nx::Q8_TILE, Form::Q8)
            };
            let n = nb as usize * q4nx::ROWS;
            let kp = kb as usize * tiles.cols;
            let k = k_cols.unwrap_or(kp);
            if k > kp || tiles.kp(k) != kp {
                return Err(err(format!(
                    "{} hold {kp} columns, which does not pad input width {k}",
                    tiles.name
                )));
            }
            tiles.check_dims(n, k).map_err(|e| err(e.0))?;
            let (data, inexact) = tiles.to_q8_0(n, k, &bytes).map_err(|e| err(e.0))?;
            Ok(tiled(n, k, form, GgmlType::Q8_0, data, inexact))
        }
        // Q4 tiles: [tiles, bytes] (FastFlowLM's converter, full tiles) or
        // [N/rows, Kp/cols, bytes] (its own packs); the row width names the form.
        [.., w] if TileForm::from_row_bytes(*w as usize).is_some() && t.shape.len() <= 3 => {
            let form = TileForm::from_row_bytes(*w as usize).expect("matched");
            let (rows, cols) = (form.rows(), form.cols());
            let n_tiles = t.shape[..t.shape.len() - 1]
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d as usize))
                .ok_or_else(|| err(format!("shape {:?} overflows", t.shape)))?;
            let (n, k) = match shape_hint {
                KHint::Cols(k) => {
                    let tpr = k.div_ceil(cols);
                    if !n_tiles.is_multiple_of(tpr) {
                        return Err(err(format!(
                            "{n_tiles} tiles of the {} are not whole tile rows of input width {k} ({tpr} tiles each)",
                            form.name()
                        )));
                    }
                    (n_tiles / tpr * rows, k)
                }
                KHint::Rows(n) => {
                    let k = k_cols.ok_or_else(|| err("input width unknown".into()))?;
                    let want = (n / rows).checked_mul(k.div_ceil(cols));
                    if want != Some(n_tiles) || !n.is_multiple_of(rows) {
                        let want = want.map_or("more than a usize counts".into(), |w| w.to_string());
                        return Err(err(format!(
                            "{n_tiles} tiles of the {}, but {n} rows by {k} columns take {want}",
                            form.name()
                        )));
                    }
                    (n, k)
                }
                KHint::None => return Err(err("a tiled tensor where a vector was expected".into())),
            };
            let s = Q4Shape::of(form, n, k).map_err(|e| err(e.0))?;
            let in_3d = [(n / rows) as u64, s.tiles_per_row() as u64];
            if t.shape.len() == 3 && t.shape[..2] != in_3d {
                return Err(err(format!(
                    "shape {:?} is not [N/{rows}, Kp/{cols}, {w}] = {:?} for {n} rows by {k} columns",
                    t.shape,
                    s.stored_shape()
                )));
            }
            let (dtype, data, inexact) = q4nx::to_ggml(&bytes, s).map_err(|e| err(e.0))?;
            let kind = if dtype == GgmlType::Q4_0 {
                Q4Kind::Symmetric
            } else {
                Q4Kind::Asymmetric
            };
            Ok(tiled(n, k, Form::Q4(form, kind.name()), dtype, data, inexact))
        }
        [.., w] if t.shape.len() <= 3 => {
            Err(err(format!(
                "rows of {w} bytes are not a tile form onebit reads (5,120: the full Q4 tile or the Q8 tile; 1,280: the quarter tile; 4,608: the symmetric chunk; 8,704: a MoE pack's wide Q8 tile)"
            )))
        }
        other => Err(err(format!(
            "{} tensor of shape {other:?} is not a tiled form onebit reads ([tiles, 5120] or [N/16, Kp/128, 1280] or [N/32, Kp/256, 4608] Q4, [N/32, Kp/128, 5120] Q8)",
            t.dtype.name()
        ))),
    }
}

/// Reads one tensor of a pack with a [`layout::PackLayout`]: tiled matrices
/// take their input width from the layout (else the hidden size), 5,120-byte
/// rows are Q4 full tiles and 8,704-byte rows wide Q8 tiles; the layout's
/// ops are undone and expert stacks get their 3-D GGUF dims back.
fn read_laid_out(
    st: &SafeTensors,
    t: &StTensor,
    gguf: &str,
    lay: &layout::Layout,
    pl: &layout::PackLayout,
    hidden: usize,
) -> Result<PackTensor> {
    let err = |what: String| ModelError::from(st.tensor_error(&t.name, what));
    let k = lay.width_of(gguf).unwrap_or(hidden);
    let hint = if t.dtype == StDtype::I8 {
        KHint::Cols(k)
    } else {
        KHint::None
    };
    let mut pt = read_tensor(st, t, gguf, hint, Some(k), true)?;
    let ops = lay.ops_of(gguf);
    if !ops.is_empty() {
        let plain = layout::Plain {
            dtype: pt.raw.dtype,
            dims: pt.raw.dims.clone(),
            bytes: pt.raw.bytes.to_vec(),
        };
        let back = plain
            .restore(ops)
            .map_err(|e| err(format!("cannot undo the layout of {}: {e}", pl.source)))?;
        pt.raw = RawTensor {
            dtype: back.dtype,
            dims: back.dims,
            bytes: ByteView::from_vec(back.bytes),
        };
    }
    if layout::listed(pl.experts, gguf) {
        let e = lay.n_expert as u64;
        match pt.raw.dims.as_slice() {
            &[k, rows] if rows % e == 0 => pt.raw.dims = vec![k, rows / e, e],
            d => {
                return Err(err(format!(
                    "an expert stack of {e} experts must be a matrix whose rows split evenly among them, found dims {d:?}"
                )))
            }
        }
    }
    Ok(pt)
}

#[cfg(test)]
mod tests;
