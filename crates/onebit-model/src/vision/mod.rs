//! Vision towers: an image's normalized pixels in, rows of the text model's
//! hidden size out, read from an mmproj GGUF (llama.cpp's `clip.*` keys and
//! `v.*` / `mm.*` tensors) the way llama.cpp's `mtmd` computes them.
//!
//! Invariant: one encoder a file (`gemma3.rs`, the SigLIP tower of
//! `tools/mtmd/models/siglip.cpp` with projector `gemma3`; `qwen3vl.rs`,
//! `models/qwen3vl.cpp`), chosen by the file's `clip.projector_type` from
//! [`PROJECTORS`]; every other projector
//! type, an audio-only mmproj and a tensor the encoder does not run are
//! refused by name, never approximated. Every rule the encoder follows is a
//! [`Sourced`] value printed as a `[semantics]` line ([`VisionTower::lines`]).
//!
//! The tower's keys and tensors come from an mmproj GGUF ([`VisionTower::from_gguf`])
//! or from any other container that hands them over under the mmproj's key
//! and tensor names, with the mmproj's ggml dims ([`VisionTower::from_decls`]
//! with a [`TowerTensors`]; a FastFlowLM pack's `vision_weights.q4nx`,
//! `crate::pack::vision`): the encoder is the same either way.
//!
//! The image side's contract ([`Preprocess`]): the caller resizes the image
//! to `width` x `height` with `filter` (llama.cpp hard-codes the filter per
//! projector), scales each channel to `(v / 255 - mean) / std` and hands
//! [`VisionTower::encode`] the CHW f32 tensor. The text side's: the rows of
//! [`ImageEmbeddings`] replace the token embeddings between the template's
//! [`ImageMarkers`] ([`crate::forward::Embeds`]), attending to each other
//! both ways where [`ImageEmbeddings::bidirectional`] says so.

use std::path::{Path, PathBuf};

use onebit_formats::gguf::Gguf;
use onebit_kernels::Pool;

use crate::error::{ModelError, Result};
use crate::families::decls::{keys, Decls};
use crate::forward::Embeds;
use crate::semantics::{Semantics, Sourced};
use crate::weights::TensorSource;

/// Where a tower's tensors come from: by their mmproj (GGUF) names, with
/// ggml dims, in F32, F16 or BF16.
pub trait TowerTensors: TensorSource {
    /// Every tensor the source holds, by GGUF name.
    fn names(&self) -> Vec<String>;
}

impl TowerTensors for Gguf {
    fn names(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.name.clone()).collect()
    }
}

pub mod gemma3;
pub mod qwen3vl;

keys! {
    PROJECTOR_TYPE = "projector_type", [];
    VISION_PROJECTOR_TYPE = "vision.projector_type", [];
    HAS_VISION = "has_vision_encoder", [];
}

/// The resample filter the image is resized with, as llama.cpp hard-codes
/// it per projector (`clip.cpp`'s `image_resize_algo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeFilter {
    Bilinear,
    Bicubic,
    Nearest,
}

/// How the caller turns an image into [`VisionTower::encode`]'s input.
#[derive(Clone, Debug, PartialEq)]
pub struct Preprocess {
    /// The encoder's input size in pixels (no padding, no tiling).
    pub width: u32,
    pub height: u32,
    /// Per channel (R, G, B): `(v / 255 - mean) / std`.
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub filter: ResizeFilter,
    /// The projector type (`clip.projector_type`), e.g. `gemma3`.
    pub projector: &'static str,
}

/// The text the chat template puts around an image's rows (llama.cpp's
/// mtmd `img_beg` / `img_end` for the projector); the rows themselves take
/// [`VisionTower::n_tokens`] positions between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageMarkers {
    pub begin: &'static str,
    pub end: &'static str,
}

/// One image's rows for the text model.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageEmbeddings {
    pub n_tokens: usize,
    /// The text model's hidden size.
    pub n_embd: usize,
    /// \[n_tokens\]\[n_embd\]
    pub rows: Vec<f32>,
    /// The rows attend to each other both ways in the text model.
    pub bidirectional: bool,
    /// The rows as `(nx, ny)`: ny rows of nx tokens, row-major (Qwen3-VL's
    /// merged patch grid), which a text model with multi-axis RoPE places
    /// on that grid of positions; None for a tower without one (Gemma 3).
    pub grid: Option<(usize, usize)>,
}

impl ImageEmbeddings {
    /// These rows standing in for tokens `at..at + n_tokens` of a sequence.
    pub fn at(&self, at: usize) -> Embeds<'_> {
        Embeds {
            at,
            rows: &self.rows,
            bidirectional: self.bidirectional,
            grid: self.grid,
        }
    }
}

/// The encoders onebit runs, by `clip.projector_type`.
pub const PROJECTORS: &[&str] = &[gemma3::PROJECTOR, qwen3vl::PROJECTOR];

enum Encoder {
    Gemma3(gemma3::Tower),
    Qwen3vl(qwen3vl::Tower),
}

/// A vision tower opened from an mmproj GGUF.
pub struct VisionTower {
    path: PathBuf,
    encoder: Encoder,
}

impl VisionTower {
    /// Opens `path` and reads its encoder; refuses, naming the key or
    /// tensor, what onebit does not run.
    pub fn open(path: impl AsRef<Path>) -> Result<VisionTower> {
        let path = path.as_ref();
        let g = Gguf::open(path)?;
        Self::from_gguf(&g)
    }

    /// The tower of an opened mmproj GGUF.
    pub fn from_gguf(g: &Gguf) -> Result<VisionTower> {
        let dims = |name: &str| g.tensor(name).map(|t| t.dims.clone());
        let d = Decls::gguf(g, "clip", &dims);
        if let Some(arch) = g.get("general.architecture").and_then(|v| v.as_str()) {
            if arch != "clip" {
                return Err(ModelError::Key {
                    path: g.path().to_path_buf(),
                    key: "general.architecture".into(),
                    what: format!(
                        "is '{arch}': not an mmproj file (llama.cpp's projector files say 'clip')"
                    ),
                });
            }
        }
        Self::from_decls(g, &d)
    }

    /// The tower whose keys `d` declares (by their mmproj spellings,
    /// `clip.*`) and whose tensors `src` holds (by their mmproj names).
    pub fn from_decls(src: &dyn TowerTensors, d: &Decls) -> Result<VisionTower> {
        if d.bool_opt(HAS_VISION)? != Some(true) {
            return Err(d.err(
                HAS_VISION,
                "is absent or false: this mmproj has no vision encoder (audio input is not supported)",
            ));
        }
        let (key, name) = match d.str_opt(PROJECTOR_TYPE)? {
            Some(p) => (PROJECTOR_TYPE, p),
            None => match d.str_opt(VISION_PROJECTOR_TYPE)? {
                Some(p) => (VISION_PROJECTOR_TYPE, p),
                None => return Err(d.err(PROJECTOR_TYPE, "is required but absent")),
            },
        };
        let encoder = match name.as_str() {
            gemma3::PROJECTOR => Encoder::Gemma3(gemma3::Tower::load(src, d, d.src(key))?),
            qwen3vl::PROJECTOR => Encoder::Qwen3vl(qwen3vl::Tower::load(src, d, d.src(key))?),
            other => {
                return Err(d.err(
                    key,
                    format!(
                        "projector type '{other}' is not supported; onebit's vision towers: {}",
                        PROJECTORS.join(", ")
                    ),
                ))
            }
        };
        Ok(VisionTower {
            path: src.path().to_path_buf(),
            encoder,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How the caller resizes and normalizes an image for [`Self::encode`].
    pub fn preprocess(&self) -> Preprocess {
        match &self.encoder {
            Encoder::Gemma3(t) => t.preprocess(),
            Encoder::Qwen3vl(t) => t.preprocess(),
        }
    }

    /// The text around an image's rows.
    pub fn markers(&self) -> ImageMarkers {
        match &self.encoder {
            Encoder::Gemma3(_) => gemma3::MARKERS,
            Encoder::Qwen3vl(_) => qwen3vl::MARKERS,
        }
    }

    /// Rows (text positions) one image of the [`Self::preprocess`] size takes.
    pub fn n_tokens(&self) -> usize {
        match &self.encoder {
            Encoder::Gemma3(t) => t.n_tokens(),
            Encoder::Qwen3vl(t) => {
                let p = t.preprocess();
                t.n_tokens_for(p.width as usize, p.height as usize)
            }
        }
    }

    /// The size an image of `width` x `height` is resized to: the fixed
    /// input size, or for a dynamic-resolution tower (qwen3vl) mtmd's fit.
    pub fn fit(&self, width: u32, height: u32) -> (u32, u32) {
        match &self.encoder {
            Encoder::Gemma3(t) => {
                let p = t.preprocess();
                (p.width, p.height)
            }
            Encoder::Qwen3vl(t) => t.fit(width, height),
        }
    }

    /// The width of the rows: the text model's hidden size it was made for.
    pub fn n_embd_out(&self) -> usize {
        match &self.encoder {
            Encoder::Gemma3(t) => t.n_embd_out(),
            Encoder::Qwen3vl(t) => t.n_embd_out(),
        }
    }

    /// Whether an image's rows attend to each other both ways, with its source.
    pub fn bidirectional(&self) -> &Sourced<bool> {
        match &self.encoder {
            Encoder::Gemma3(t) => &t.rules.bidirectional,
            Encoder::Qwen3vl(t) => &t.rules.bidirectional,
        }
    }

    /// The `[semantics]` lines of the tower, one rule each, with its source.
    pub fn lines(&self) -> Vec<String> {
        match &self.encoder {
            Encoder::Gemma3(t) => t.lines(),
            Encoder::Qwen3vl(t) => t.lines(),
        }
    }

    /// Refuses a text model that cannot take the tower's rows: rows of
    /// another width than its input (n_embd, times 1 + its deepstack
    /// features), or (qwen3vl) a model without the multi-axis RoPE the
    /// rows' grid positions need (IMROPE: Qwen3-VL's and Qwen3.5's).
    pub fn check_text_model(&self, sem: &Semantics) -> Result<()> {
        let family = sem.family;
        let refuse = |what: String| {
            Err(ModelError::Unsupported {
                path: self.path.clone(),
                what,
            })
        };
        if let Encoder::Qwen3vl(t) = &self.encoder {
            if sem.rope_full.value.sections.is_none() {
                return refuse(format!(
                    "the {} tower's rows take IMROPE grid positions (rope.dimension_sections); the text model ({family}) has single-axis RoPE, so it cannot take them",
                    qwen3vl::PROJECTOR
                ));
            }
            let (tower, text) = (t.rules.deepstack.value.len(), sem.body.value.deepstack);
            if tower != text {
                return refuse(format!(
                    "the {} tower gives {tower} deepstack features per row, the text model ({family}) adds {text} (n_deepstack_layers): not its mmproj",
                    qwen3vl::PROJECTOR
                ));
            }
        }
        let width = sem.input_width();
        if width != self.n_embd_out() {
            return refuse(format!(
                "the vision tower projects to {} values per row, the text model ({family}) takes {width} (hidden size {}{}): not its mmproj",
                self.n_embd_out(),
                sem.dims.n_embd,
                match sem.body.value.deepstack {
                    0 => String::new(),
                    k => format!(" x (1 + {k} deepstack features)"),
                }
            ));
        }
        Ok(())
    }

    /// Encodes one image: `pixels` is CHW, 3 x height x width of
    /// [`Self::preprocess`], already normalized. `threads`: 0 = all cores.
    pub fn encode(&self, pixels: &[f32], threads: usize) -> Result<ImageEmbeddings> {
        self.encode_with(&Pool::new(threads), pixels)
    }

    /// [`Self::encode`] on the caller's thread pool.
    pub fn encode_with(&self, pool: &Pool, pixels: &[f32]) -> Result<ImageEmbeddings> {
        let p = self.preprocess();
        self.encode_sized(pool, pixels, p.width, p.height)
    }

    /// Encodes an image of `width` x `height` (a size [`Self::fit`] gives;
    /// a fixed-size tower takes only its own).
    pub fn encode_sized(
        &self,
        pool: &Pool,
        pixels: &[f32],
        width: u32,
        height: u32,
    ) -> Result<ImageEmbeddings> {
        let p = self.preprocess();
        if matches!(self.encoder, Encoder::Gemma3(_)) && (width, height) != (p.width, p.height) {
            return Err(ModelError::Input(format!(
                "image of {width} x {height}; the {} encoder takes {} x {} only",
                p.projector, p.width, p.height
            )));
        }
        let want = 3 * width as usize * height as usize;
        if pixels.len() != want {
            return Err(ModelError::Input(format!(
                "image tensor of {} values; the {} encoder takes 3 x {} x {} = {want} (CHW, normalized)",
                pixels.len(),
                p.projector,
                height,
                width
            )));
        }
        if let Some(i) = pixels.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::Input(format!(
                "image tensor value {i} is not finite"
            )));
        }
        match &self.encoder {
            Encoder::Gemma3(t) => Ok(t.encode(pool, pixels)),
            Encoder::Qwen3vl(t) => t.encode(pool, pixels, width as usize, height as usize),
        }
    }
}
