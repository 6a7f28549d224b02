//! Images in, for a vision tower: PNG, JPEG and WebP bytes checked against
//! the [`Limits`] before anything is decoded (the byte count, then the
//! width and height the header states: a 30000 x 30000 header is refused
//! without allocating its pixels), decoded to 8-bit RGB, resized and
//! normalized as the tower's processor declares ([`Spec`]), and hashed.
//!
//! The invariant: [`prepare`] gives, for the same bytes and spec, the
//! pixels llama.cpp's `mtmd` feeds its encoder: the same target size (a
//! fixed square, or the "smart resize" to multiples of patch x merge within
//! a pixel budget, in f32 as `mtmd` computes it), the same aspect-keeping
//! fit (scaled by the smaller ratio, centred on black), the same resampling
//! (Pillow's, [`resize()`]) and the same normalization ((x / 255 - mean) /
//! std in f32). Every failure is an [`ImageError`] whose message names the
//! image by the place the caller gave (`messages[0].content[1]`).

use std::fmt;
use std::io::Cursor;

use image::{ImageFormat, ImageReader};
use sha2::{Digest, Sha256};

pub mod resize;

pub use resize::{fit, resize};

/// How far an image may go before it is decoded.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of the encoded image at most.
    pub max_bytes: usize,
    /// Width x height, as the header states it, at most.
    pub max_pixels: u64,
    /// Width and height, each, at most.
    pub max_side: u32,
}

impl Default for Limits {
    /// 20 MiB, 16 megapixels (4096 x 4096; about 64 MiB while decoding),
    /// 16384 pixels a side.
    fn default() -> Limits {
        Limits {
            max_bytes: 20 << 20,
            max_pixels: 16 << 20,
            max_side: 16384,
        }
    }
}

/// An image refused: one sentence naming it and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageError(pub String);

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ImageError {}

/// 8-bit RGB, row-major, three bytes a pixel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rgb8 {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// A resampling filter, as Pillow defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    Bilinear,
    Bicubic,
    Lanczos,
}

/// The size a tower takes its input at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Size {
    /// Every image fitted into `side` x `side` (Gemma 3's SigLIP: 896),
    /// giving `tokens` embeddings (256).
    Fixed { side: usize, tokens: usize },
    /// The image's own aspect ratio, each side a multiple of `align`
    /// (patch size x spatial merge: Qwen3-VL's 16 x 2), the area within
    /// `min_pixels..=max_pixels`; one token per `align` x `align` cell.
    Dynamic {
        align: usize,
        min_pixels: usize,
        max_pixels: usize,
    },
}

/// How a tower's processor prepares an image.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spec {
    pub size: Size,
    pub filter: Filter,
    /// Per channel (R, G, B), on pixel values in 0..=1.
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// The colour around a fitted image (black in every `mtmd` tower here).
    pub pad: [u8; 3],
}

/// An image ready for the tower.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The tower's input size.
    pub width: usize,
    pub height: usize,
    /// Channel-major: 3 x height x width, normalized.
    pub pixels: Vec<f32>,
    /// SHA-256 of the input size and the resized bytes: equal for the same
    /// picture at the same size, whatever file it came in.
    pub hash: [u8; 32],
    /// Embeddings the tower gives for it.
    pub tokens: usize,
}

impl Prepared {
    /// The hash's first 8 bytes as a number (a cache key).
    pub fn hash64(&self) -> u64 {
        u64::from_le_bytes(self.hash[..8].try_into().unwrap_or([0; 8]))
    }
}

/// The encoded formats taken.
fn format_name(f: ImageFormat) -> Option<&'static str> {
    match f {
        ImageFormat::Png => Some("PNG"),
        ImageFormat::Jpeg => Some("JPEG"),
        ImageFormat::WebP => Some("WebP"),
        _ => None,
    }
}

/// Reads `bytes`' header: its format and stated size, checked against
/// `limits`. Allocates nothing for the pixels.
pub fn probe(
    bytes: &[u8],
    at: &str,
    limits: &Limits,
) -> Result<(&'static str, u32, u32), ImageError> {
    if bytes.len() > limits.max_bytes {
        return Err(ImageError(format!(
            "the image at {at} is {} bytes; at most {} are taken",
            bytes.len(),
            limits.max_bytes
        )));
    }
    if bytes.is_empty() {
        return Err(ImageError(format!("the image at {at} is empty")));
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError(format!("the image at {at} cannot be read: {e}")))?;
    let name = match reader.format() {
        Some(f) => format_name(f).ok_or_else(|| {
            ImageError(format!(
                "the image at {at} is {f:?}; PNG, JPEG and WebP are taken"
            ))
        })?,
        None => {
            return Err(ImageError(format!(
                "the image at {at} is not a PNG, JPEG or WebP image (it starts with {})",
                hex_head(bytes)
            )))
        }
    };
    let (w, h) = reader.into_dimensions().map_err(|e| {
        ImageError(format!(
            "the image at {at} is not a readable {name}: its header cannot be read ({e})"
        ))
    })?;
    if w == 0 || h == 0 {
        return Err(ImageError(format!(
            "the image at {at} is {w}x{h}: it has no pixels"
        )));
    }
    let area = u64::from(w) * u64::from(h);
    if w > limits.max_side || h > limits.max_side || area > limits.max_pixels {
        return Err(ImageError(format!(
            "the image at {at} is {w}x{h} ({area} pixels); at most {} pixels and {} a side are taken",
            limits.max_pixels, limits.max_side
        )));
    }
    Ok((name, w, h))
}

fn hex_head(bytes: &[u8]) -> String {
    let hex: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("bytes {}", hex.join(" "))
}

/// Decodes `bytes` (PNG, JPEG or WebP, within `limits`) to RGB: an alpha
/// channel is dropped, grey is spread to the three channels, 16-bit
/// samples are scaled to 8.
pub fn decode(bytes: &[u8], at: &str, limits: &Limits) -> Result<Rgb8, ImageError> {
    let (name, w, h) = probe(bytes, at, limits)?;
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError(format!("the image at {at} cannot be read: {e}")))?;
    // A second bound, in the decoder: what the header stated, and an
    // allocation cap of 16-bit RGBA at that size (the largest form a
    // decoder holds), so a decoder that reads a different size stops.
    let mut l = image::Limits::default();
    l.max_image_width = Some(w);
    l.max_image_height = Some(h);
    l.max_alloc = Some(u64::from(w) * u64::from(h) * 8 + (1 << 20));
    reader.limits(l);
    let img = reader.decode().map_err(|e| {
        ImageError(format!(
            "the image at {at} is not a readable {name} ({w}x{h}): {e}"
        ))
    })?;
    let rgb = img.into_rgb8();
    let (width, height) = (rgb.width() as usize, rgb.height() as usize);
    Ok(Rgb8 {
        width,
        height,
        data: rgb.into_raw(),
    })
}

impl Spec {
    /// The size an image of `width` x `height` enters the tower at.
    pub fn target(&self, width: usize, height: usize) -> (usize, usize) {
        match self.size {
            Size::Fixed { side, .. } => (side, side),
            Size::Dynamic {
                align,
                min_pixels,
                max_pixels,
            } => smart_size(width, height, align, min_pixels, max_pixels),
        }
    }

    /// Embeddings an input of `width` x `height` (a [`Spec::target`]) gives.
    pub fn tokens(&self, width: usize, height: usize) -> usize {
        match self.size {
            Size::Fixed { tokens, .. } => tokens,
            Size::Dynamic { align, .. } => (width / align) * (height / align),
        }
    }
}

/// `mtmd`'s dynamic size (transformers' `smart_resize`), in f32 as it
/// computes it: each side rounded to the nearest multiple of `align` (at
/// least one); if the area is then above `max_pixels`, both sides scaled by
/// sqrt(area / max) and rounded down to multiples; if below `min_pixels`,
/// scaled up and rounded up.
pub fn smart_size(
    width: usize,
    height: usize,
    align: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> (usize, usize) {
    let f = align as f32;
    let round = |x: f32| (x / f).round() as usize * align;
    let ceil = |x: f32| (x / f).ceil() as usize * align;
    let floor = |x: f32| (x / f).floor() as usize * align;
    let (w, h) = (width as f32, height as f32);
    let mut wb = round(w).max(align);
    let mut hb = round(h).max(align);
    if max_pixels > 0 && hb * wb > max_pixels {
        let beta = (h * w / max_pixels as f32).sqrt();
        hb = floor(h / beta).max(align);
        wb = floor(w / beta).max(align);
    } else if min_pixels > 0 && hb * wb < min_pixels {
        let beta = (min_pixels as f32 / (h * w)).sqrt();
        hb = ceil(h * beta);
        wb = ceil(w * beta);
    }
    (wb, hb)
}

/// The tower's input from a decoded image: resized to [`Spec::target`]
/// (fitted, aspect kept), normalized channel-major, hashed.
pub fn prepare(img: &Rgb8, spec: &Spec) -> Prepared {
    let (tw, th) = spec.target(img.width, img.height);
    let sized = fit(img, tw, th, spec.filter, spec.pad);
    let mut hash = Sha256::new();
    hash.update((tw as u32).to_le_bytes());
    hash.update((th as u32).to_le_bytes());
    hash.update(&sized.data);
    let n = tw * th;
    let mut pixels = vec![0f32; 3 * n];
    for (i, p) in sized.data.chunks_exact(3).enumerate() {
        for (c, &v) in p.iter().enumerate() {
            pixels[c * n + i] = (f32::from(v) / 255.0 - spec.mean[c]) / spec.std[c];
        }
    }
    Prepared {
        width: tw,
        height: th,
        pixels,
        hash: hash.finalize().into(),
        tokens: spec.tokens(tw, th),
    }
}
