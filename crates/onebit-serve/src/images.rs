//! Images in a request, from every protocol alike: the bytes of each image
//! taken from where the client put it (a `data:` URL, Ollama's base64, an
//! Anthropic base64 source) and named by that place (`messages[0].content[1]`,
//! `messages[0].images[0]`), bounded in count and in bytes before anything
//! is decoded (decoding, the tower and the prompt's layout are
//! [`crate::image_prompt`]'s, on the blocking pool).
//!
//! The invariants: nothing is fetched (a remote URL is refused by name);
//! every refusal names the image; and each image's place in the prompt is
//! one [`MARK`] character in the message text. A leaf below `api`: its
//! refusals are [`Refused`], which `api` turns into its error.

use std::sync::Arc;

use base64::Engine as _;
use onebit_image::{Limits, Prepared, Spec};
use onebit_model::vision::VisionTower;

/// An image refused: the message (naming it), the request field it is in
/// (`messages`, `input`, `images`) and a machine code when there is one.
#[derive(Clone, Debug)]
pub struct Refused {
    pub param: &'static str,
    pub message: String,
    pub code: Option<&'static str>,
}

fn refused(param: &'static str, message: String) -> Refused {
    Refused {
        param,
        message,
        code: None,
    }
}

/// Where an image stands in the message text until the prompt is
/// tokenized: a noncharacter (U+FDD2), never part of interchanged text.
pub const MARK: char = '\u{FDD2}';

/// Images one request may carry at most.
pub const MAX_IMAGES: usize = 8;

/// One image of a request, undecoded.
#[derive(Clone, Debug)]
pub struct ImageIn {
    /// Where the client put it, as errors name it.
    pub at: String,
    pub bytes: Arc<Vec<u8>>,
}

/// What a model's vision tower takes and how its embeddings sit in the
/// prompt: the text before and after each image's tokens
/// (`<start_of_image>` / `<end_of_image>` for Gemma 3).
#[derive(Clone, Debug)]
pub struct Vision {
    /// The projector type (`clip.projector_type`), for messages.
    pub projector: String,
    pub spec: Spec,
    pub begin: String,
    pub end: String,
    /// The encoder the engine runs the images through; `None` only where
    /// a caller lays prompts out without one (the engine then fails such a
    /// sequence naming the model's missing tower).
    pub tower: Option<Tower>,
}

/// A model's vision tower, shared by the request handlers (its sizes) and
/// the engine thread (which encodes).
#[derive(Clone)]
pub struct Tower(pub Arc<VisionTower>);

impl std::fmt::Debug for Tower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tower({})", self.0.path().display())
    }
}

/// An image prepared for the tower, at its place in the prompt ids: the
/// ids `start..start + image.tokens` stand for its embeddings.
#[derive(Clone, Debug)]
pub struct PromptImage {
    pub start: usize,
    pub image: Arc<Prepared>,
}

/// The placeholder ids an image's rows take in the prompt: drawn from the
/// hash of its pixels (row `j`'s id mixes the hash with `j`), below
/// `n_vocab`. The model never looks them up; they are what the prefix cache
/// and the engine's image-rows cache compare, so the same picture gives the
/// same ids (its cached state is reused, it is not encoded again) and two
/// pictures differ in nearly every row (a cached prefix never runs one
/// image's rows for another's).
pub fn placeholders(image: &Prepared, n_vocab: usize) -> impl Iterator<Item = u32> + '_ {
    let h = image.hash64();
    let n = n_vocab.max(1) as u64;
    (0..image.tokens as u64).map(move |j| {
        // splitmix64 of (hash, row): a fixed, well-mixed function.
        let mut z = h ^ j.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z % n) as u32
    })
}

/// The encoded size of the bytes limit: base64 of `max` bytes.
fn encoded_limit(limits: &Limits) -> usize {
    limits.max_bytes.div_ceil(3) * 4 + 4
}

/// Base64 (standard alphabet, padding optional; whitespace is not base64)
/// decoded, named `at`; too long a text is refused before decoding.
pub fn base64(text: &str, at: &str, param: &'static str) -> Result<Vec<u8>, Refused> {
    let limits = Limits::default();
    if text.len() > encoded_limit(&limits) {
        return Err(refused(
            param,
            format!(
                "the image at {at} is about {} bytes; at most {} are taken",
                text.len() / 4 * 3,
                limits.max_bytes
            ),
        ));
    }
    base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
        .decode(text.trim_end())
        .map_err(|e| refused(param, format!("the image at {at} is not valid base64: {e}")))
}

/// An image URL's bytes: only `data:` URLs with base64 data are taken; the
/// server fetches nothing.
pub fn from_url(url: &str, at: &str, param: &'static str) -> Result<Vec<u8>, Refused> {
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        let what = if scheme.is_empty() || scheme.len() > 16 {
            "not a URL".to_string()
        } else {
            format!("a {scheme}: URL")
        };
        return Err(Refused {
            param,
            message: format!(
                "the image at {at} is {what}; this server fetches nothing: send the image inline as a data: URL (data:image/png;base64,...)"
            ),
            code: Some("image_url_not_inline"),
        });
    };
    let Some((head, data)) = rest.split_once(',') else {
        return Err(refused(
            param,
            format!("the image at {at} is a data: URL without a comma before its data"),
        ));
    };
    let mut parts = head.split(';');
    let media = parts.next().unwrap_or("").trim();
    if !media.is_empty() && !media.to_ascii_lowercase().starts_with("image/") {
        return Err(refused(
            param,
            format!("the image at {at} is a data: URL of type {media:?}; an image/* type is taken"),
        ));
    }
    if !parts.any(|p| p.trim().eq_ignore_ascii_case("base64")) {
        return Err(refused(
            param,
            format!("the image at {at} is a data: URL without `;base64`; its data must be base64"),
        ));
    }
    base64(data, at, param)
}

/// Refuses a request with more than [`MAX_IMAGES`] images.
pub fn check_count(n: usize, param: &'static str) -> Result<(), Refused> {
    if n > MAX_IMAGES {
        return Err(refused(
            param,
            format!("the request carries {n} images; at most {MAX_IMAGES} are taken"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

    #[test]
    fn data_urls_are_taken_and_remote_urls_refused_by_name() {
        let png = from_url(
            &format!("data:image/png;base64,{PNG_1X1}"),
            "messages[0].content[1]",
            "messages",
        )
        .unwrap();
        assert!(png.starts_with(b"\x89PNG"));
        // No media type, and base64 without padding, are taken too.
        let trimmed = PNG_1X1.trim_end_matches('=');
        assert_eq!(
            from_url(&format!("data:;base64,{trimmed}"), "x", "messages").unwrap(),
            png
        );
        for (url, want) in [
            (
                "https://example.com/cat.png",
                "is a https: URL; this server fetches nothing",
            ),
            ("file:///etc/passwd", "is a file: URL"),
            ("cat.png", "is not a URL"),
            ("data:image/png;base64", "without a comma"),
            ("data:text/plain;base64,aGk=", "of type \"text/plain\""),
            ("data:image/png,rawbytes", "without `;base64`"),
            ("data:image/png;base64,!!!!", "is not valid base64"),
        ] {
            let e = from_url(url, "messages[0].content[1]", "messages").unwrap_err();
            assert_eq!(e.param, "messages", "{url}");
            assert!(
                e.message.contains("messages[0].content[1]") && e.message.contains(want),
                "{url}: {}",
                e.message
            );
        }
    }

    #[test]
    fn too_long_a_base64_text_is_refused_before_decoding() {
        let huge = "A".repeat(encoded_limit(&Limits::default()) + 4);
        let e = base64(&huge, "images[0]", "images").unwrap_err();
        assert!(
            e.message.contains("images[0]") && e.message.contains("at most"),
            "{}",
            e.message
        );
    }
}
