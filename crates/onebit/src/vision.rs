//! The vision projector a model is run with: `--mmproj FILE` (as
//! llama-server takes it), else the `mmproj*.gguf` a pulled repository
//! carries beside the model in the local store. The invariant: a projector
//! is taken only when its encoder runs (`onebit_model::vision`) and its rows
//! fit the text model (`VisionTower::check_text_model`); otherwise it is
//! refused naming the file and the reason, so no model claims `vision` it
//! does not have, and images for it are refused naming the model.
//!
//! How an image is prepared for a projector is llama.cpp's `mtmd`, which
//! hard-codes it per projector type ([`spec`]): the size rule, the
//! resampling filter and the text around the image's tokens; mean, std,
//! image and patch size come from the file's `clip.vision.*` keys.

use std::path::{Path, PathBuf};

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use onebit_formats::gguf::Gguf;
use onebit_image::{Filter, Size, Spec};
use onebit_model::vision::VisionTower;
use onebit_model::Model;
use onebit_serve::images::{Tower, Vision};

/// The projector of the store's model at `model` (a GGUF whose snapshot
/// holds the `mmproj*.gguf` the pull chose for it), if any.
pub fn beside(model: &Path) -> Option<PathBuf> {
    let store = onebit_hub::Store::from_env();
    let l = store.list().into_iter().find(|l| l.path == model)?;
    l.files.into_iter().find(|f| {
        f.file_name().is_some_and(|n| {
            n.to_string_lossy()
                .to_ascii_lowercase()
                .starts_with("mmproj")
        })
    })
}

/// The key a projector file names its projector type in.
fn projector_type(g: &Gguf) -> Result<String> {
    for key in ["clip.projector_type", "clip.vision.projector_type"] {
        if let Some(p) = g.str_opt(key)? {
            return Ok(p.to_string());
        }
    }
    bail!(
        "{}: no clip.projector_type key: not a vision projector (mmproj) GGUF",
        g.path().display()
    )
}

/// `mtmd`'s preparation for `projector` (what `clip.cpp` and `mtmd.cpp`
/// hard-code for it), from the file's sizes and normalization:
/// - `gemma3`: fitted into `image_size` squared, bilinear, `image_size /
///   patch / 4` squared tokens (the 4 x 4 average pool; `scale_factor`
///   overrides the 4), between `<start_of_image>` and `<end_of_image>`;
/// - `qwen3vl_merger`: the image's own aspect, sides multiples of `patch x
///   merge` (`spatial_merge_size`, default 2), 8 to 4096 tokens, bicubic,
///   between `<|vision_start|>` and `<|vision_end|>`.
///
/// Any other projector is refused by name.
pub fn spec(
    projector: &str,
    image_size: usize,
    patch_size: usize,
    merge: Option<usize>,
    mean: [f32; 3],
    std: [f32; 3],
) -> Result<Vision> {
    if patch_size == 0 || image_size == 0 {
        bail!("projector {projector}: image size {image_size} and patch size {patch_size} must not be 0");
    }
    let (size, filter, begin, end) = match projector {
        "gemma3" => {
            let merge = merge.unwrap_or(4).max(1);
            let side = image_size / patch_size / merge;
            (
                Size::Fixed {
                    side: image_size,
                    tokens: side * side,
                },
                Filter::Bilinear,
                "<start_of_image>",
                "<end_of_image>",
            )
        }
        "qwen3vl_merger" => {
            let align = patch_size * merge.unwrap_or(2).max(1);
            (
                Size::Dynamic {
                    align,
                    min_pixels: 8 * align * align,
                    max_pixels: 4096 * align * align,
                },
                Filter::Bicubic,
                "<|vision_start|>",
                "<|vision_end|>",
            )
        }
        "gemma4v" | "gemma4uv" => bail!(
            "projector {projector} (Gemma 4's vision encoder) is not supported yet; gemma3 and qwen3vl_merger are"
        ),
        other => bail!(
            "projector {other:?} is not supported; gemma3 and qwen3vl_merger are"
        ),
    };
    if std.contains(&0.0) {
        bail!("projector {projector}: image_std {std:?} holds a 0");
    }
    Ok(Vision {
        projector: projector.to_string(),
        spec: Spec {
            size,
            filter,
            mean,
            std,
            pad: [0, 0, 0],
        },
        begin: begin.into(),
        end: end.into(),
        tower: None,
    })
}

fn triple(g: &Gguf, key: &str) -> Result<[f32; 3]> {
    let a = g
        .array_opt(key)?
        .with_context(|| format!("{}: no {key} key", g.path().display()))?;
    let v: Vec<f32> = a
        .iter()
        .filter_map(|x| x.as_f64())
        .map(|x| x as f32)
        .collect();
    match v[..] {
        [r, g_, b] if v.len() == a.len() => Ok([r, g_, b]),
        _ => bail!(
            "{}: {key} must be three numbers; got {} values",
            g.path().display(),
            a.len()
        ),
    }
}

/// What `mmproj` says about preparing images, read from its keys.
pub fn read(mmproj: &Path) -> Result<Vision> {
    let g =
        Gguf::open(mmproj).with_context(|| format!("cannot open --mmproj {}", mmproj.display()))?;
    let projector = projector_type(&g)?;
    let merge = match projector.as_str() {
        "gemma3" => g.u64_opt("clip.vision.projector.scale_factor")?,
        _ => g.u64_opt("clip.vision.spatial_merge_size")?,
    };
    spec(
        &projector,
        g.u64("clip.vision.image_size")? as usize,
        g.u64("clip.vision.patch_size")? as usize,
        merge.map(|m| m as usize),
        triple(&g, "clip.vision.image_mean")?,
        triple(&g, "clip.vision.image_std")?,
    )
    .with_context(|| mmproj.display().to_string())
}

/// The vision tower of `mmproj` for the text model `text`: what [`read`]
/// gives, with its encoder opened and checked against the text model (the
/// rows' width; a qwen3vl tower needs an IMROPE text model with its
/// deepstack count), and the keys' preparation checked against the
/// encoder's input size.
pub fn open(mmproj: &Path, text: &Model) -> Result<Vision> {
    let v = read(mmproj)?;
    let tower = VisionTower::open(mmproj)
        .with_context(|| format!("cannot open the vision tower --mmproj {}", mmproj.display()))?;
    attach(v, tower, text, &format!("--mmproj {}", mmproj.display()))
}

/// The vision tower a pack carries (`vision_weights.q4nx`, as FastFlowLM's
/// converter writes it), None when it has none: its preparation from the
/// keys the pack states (`onebit_model::pack::vision::stated`), checked
/// against the text model as an mmproj's is.
pub fn from_pack(dir: &Path, text: &Model) -> Result<Option<Vision>> {
    let Some(pv) = onebit_model::pack::vision::open(dir)
        .with_context(|| format!("cannot open the vision tower of the pack {}", dir.display()))?
    else {
        return Ok(None);
    };
    let key = |k: &str| {
        pv.key(&format!("clip.{k}"))
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
    };
    let p = pv.tower.preprocess();
    let merge = match p.projector {
        "gemma3" => key("vision.projector.scale_factor"),
        _ => key("vision.spatial_merge_size"),
    };
    let v = spec(
        p.projector,
        key("vision.image_size").context("the pack states no vision image size")?,
        key("vision.patch_size").context("the pack states no vision patch size")?,
        merge,
        p.mean,
        p.std,
    )
    .with_context(|| dir.display().to_string())?;
    let what = format!(
        "the pack's vision tower {}",
        dir.join(onebit_model::pack::vision::VISION_WEIGHTS)
            .display()
    );
    attach(v, pv.tower, text, &what).map(Some)
}

/// `tower` checked against the text model and the preparation `v` read
/// for it (`what` names where it came from), then attached.
fn attach(mut v: Vision, tower: VisionTower, text: &Model, what: &str) -> Result<Vision> {
    tower
        .check_text_model(&text.sem)
        .with_context(|| what.to_string())?;
    if text.weights.per_layer_input.is_some() {
        bail!(
            "{what}: the text model ({}) looks its per-layer embeddings up by token id, so it cannot take an image's rows",
            text.sem.family
        );
    }
    let p = tower.preprocess();
    if let Size::Fixed { side, tokens } = v.spec.size {
        if (side, side) != (p.width as usize, p.height as usize) || tokens != tower.n_tokens() {
            bail!(
                "{what}: its keys give {side} x {side} pixels and {tokens} image tokens, its encoder takes {} x {} and gives {}",
                p.width,
                p.height,
                tower.n_tokens()
            );
        }
    }
    for line in tower.lines() {
        eprintln!("[semantics] {line}");
    }
    v.tower = Some(Tower(Arc::new(tower)));
    Ok(v)
}

/// The tower for a model: `--mmproj` when given (refused loudly when it
/// cannot run), else a pack's own (`vision_weights.q4nx`, refused loudly
/// too), else one found beside the model (a note when it cannot).
pub fn for_model(model: &Path, mmproj: Option<&Path>, text: &Model) -> Result<Option<Vision>> {
    if let Some(p) = mmproj {
        return open(p, text).map(Some);
    }
    if onebit_model::pack::vision::has_vision(model) {
        return from_pack(model, text);
    }
    let Some(p) = beside(model) else {
        return Ok(None);
    };
    match open(&p, text) {
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            eprintln!(
                "[vision] {}: the projector beside it is not used ({e:#}); images will be refused",
                model.display()
            );
            Ok(None)
        }
    }
}

/// An image file (`--image FILE`, a chat's `/image FILE`) decoded within
/// the server's bounds: its size checked before it is read, its header
/// before it is decoded.
pub fn load_image(path: &Path) -> Result<onebit_image::Rgb8> {
    let at = format!("--image {}", path.display());
    let limits = onebit_image::Limits::default();
    let len = std::fs::metadata(path)
        .with_context(|| format!("cannot read {at}"))?
        .len();
    if len > limits.max_bytes as u64 {
        bail!(
            "the image at {at} is {len} bytes; at most {} are taken",
            limits.max_bytes
        );
    }
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {at}"))?;
    Ok(onebit_image::decode(&bytes, &at, &limits)?)
}

/// Images for a model: refused naming the model when it has no tower.
pub fn take_images<'a>(
    model: &Path,
    vision: Option<&'a Vision>,
    images: &[onebit_image::Rgb8],
) -> Result<Option<&'a Vision>> {
    if images.is_empty() {
        return Ok(vision);
    }
    let Some(v) = vision else {
        bail!(
            "model {} has no vision tower (no --mmproj given{}), so it takes text only",
            model.display(),
            if onebit_model::pack::Pack::is_pack(model) {
                format!(
                    ", no {} in the pack",
                    onebit_model::pack::vision::VISION_WEIGHTS
                )
            } else {
                String::new()
            }
        );
    };
    Ok(Some(v))
}

/// mtmd's media marker (`mtmd_default_marker()`): where a prompt given on
/// the command line places its images; without one they come first.
pub const MEDIA_MARKER: &str = "<__media__>";

/// The ids of `text`, in which each [`onebit_serve::images::MARK`] stands
/// for one of `images`, laid out for `vision` (its begin text, the image's
/// placeholder ids, its end text), each text piece tokenized by `encode`
/// (called with `true` for the first piece). Returns the ids and the
/// images' places.
pub fn lay_out(
    tok: &onebit_text::Tokenizer,
    text: &str,
    vision: &Vision,
    images: &[onebit_image::Rgb8],
    mut encode: impl FnMut(&str, bool) -> Result<Vec<u32>>,
) -> Result<(Vec<u32>, Vec<onebit_serve::images::PromptImage>)> {
    let prepared: Vec<_> = images
        .iter()
        .map(|d| Arc::new(onebit_image::prepare(d, &vision.spec)))
        .collect();
    let whole = onebit_serve::prompt::Rendered {
        text: text.to_string(),
        spans: None,
        unmarked: Vec::new(),
    };
    let mut first = true;
    let mut failed = None;
    let out = onebit_serve::image_prompt::lay_out(tok, &whole, vision, &prepared, |piece| {
        let bos = std::mem::take(&mut first);
        encode(&piece.text, bos).map_err(|e| {
            let m = format!("{e:#}");
            failed = Some(e);
            onebit_serve::api::ApiError::server(m)
        })
    });
    match (out, failed) {
        (Ok(v), _) => Ok(v),
        (Err(_), Some(e)) => Err(e),
        (Err(e), None) => bail!("{}", e.message),
    }
}

/// `text` with its images placed: at each [`MEDIA_MARKER`] in order, else
/// all ahead of it; a count of markers other than the images' is refused.
pub fn place_images(text: &str, n: usize) -> Result<String> {
    let marks = text.matches(MEDIA_MARKER).count();
    if n == 0 {
        return Ok(text.to_string());
    }
    let mark = onebit_serve::images::MARK.to_string();
    match marks {
        0 => Ok(mark.repeat(n) + text),
        m if m == n => Ok(text.replace(MEDIA_MARKER, &mark)),
        m => bail!("the prompt holds {m} {MEDIA_MARKER} markers for {n} images: give one per image, or none (the images then come first)"),
    }
}

/// Encodes `places`' images with `vision`'s tower; the rows, in order, and
/// the seconds it took.
pub fn encode(
    vision: &Vision,
    places: &[onebit_serve::images::PromptImage],
    threads: usize,
) -> Result<(Vec<onebit_model::vision::ImageEmbeddings>, f64)> {
    let tower = vision
        .tower
        .as_ref()
        .context("the vision tower is not open")?;
    let t0 = std::time::Instant::now();
    let pool = onebit_kernels::Pool::new(threads);
    let rows = places
        .iter()
        .map(|p| {
            tower
                .0
                .encode_sized(
                    &pool,
                    &p.image.pixels,
                    p.image.width as u32,
                    p.image.height as u32,
                )
                .context("encoding the image")
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((rows, t0.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use onebit_formats::gguf::writer::GgufWriter;
    use onebit_formats::gguf::Value;

    fn mmproj(dir: &Path, projector: &str, extra: &[(&str, Value)]) -> PathBuf {
        let mut w = GgufWriter::new();
        w.kv("general.architecture", Value::Str("clip".into()));
        w.kv("clip.projector_type", Value::Str(projector.into()));
        w.kv("clip.vision.image_size", Value::U32(896));
        w.kv("clip.vision.patch_size", Value::U32(14));
        let three = |x: f32| Value::Array(vec![Value::F32(x); 3]);
        w.kv("clip.vision.image_mean", three(0.5));
        w.kv("clip.vision.image_std", three(0.5));
        for (k, v) in extra {
            w.set_kv(k, v.clone());
        }
        let p = dir.join(format!("mmproj-{projector}.gguf"));
        std::fs::write(&p, w.to_bytes()).unwrap();
        p
    }

    #[test]
    fn projectors_are_prepared_as_mtmd_hard_codes_them() {
        let dir = std::env::temp_dir().join(format!("onebit-vision-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Gemma 3: 896 / 14 / 4 = 16 per side, 256 tokens, bilinear.
        let v = read(&mmproj(&dir, "gemma3", &[])).unwrap();
        assert_eq!(
            v.spec.size,
            Size::Fixed {
                side: 896,
                tokens: 256
            }
        );
        assert_eq!(v.spec.filter, Filter::Bilinear);
        assert_eq!(
            (v.begin.as_str(), v.end.as_str()),
            ("<start_of_image>", "<end_of_image>")
        );
        assert_eq!(v.spec.mean, [0.5; 3]);
        // Qwen3-VL: patch 16 x merge 2, bicubic, 8..4096 tokens.
        let q = read(&mmproj(
            &dir,
            "qwen3vl_merger",
            &[
                ("clip.vision.patch_size", Value::U32(16)),
                ("clip.vision.spatial_merge_size", Value::U32(2)),
            ],
        ))
        .unwrap();
        assert_eq!(
            q.spec.size,
            Size::Dynamic {
                align: 32,
                min_pixels: 8 * 1024,
                max_pixels: 4096 * 1024
            }
        );
        assert_eq!(q.spec.filter, Filter::Bicubic);
        // Others by name.
        let e = read(&mmproj(&dir, "gemma4v", &[])).unwrap_err();
        assert!(format!("{e:#}").contains("gemma4v"), "{e:#}");
        let e = read(&mmproj(&dir, "ultravox", &[])).unwrap_err();
        assert!(
            format!("{e:#}").contains("\"ultravox\" is not supported"),
            "{e:#}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
