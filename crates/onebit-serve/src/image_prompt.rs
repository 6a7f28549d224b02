//! The images of a request made ready for the model, on the blocking pool:
//! each decoded within the pixel bounds (`onebit-image`; a bad one is a 400
//! naming it), then refused for a model without a vision tower (naming the
//! model), else resized and normalized as the tower declares; and the
//! prompt's ids laid out around each image's embeddings.
//!
//! The invariant: each image's [`MARK`] must appear in the rendered prompt
//! exactly once, in order, or the request is refused; the text between the
//! marks is tokenized with the user's strings still plain.

use std::sync::Arc;

use onebit_image::{Limits, Prepared};
use onebit_text::Tokenizer;

use crate::api::ApiError;
use crate::images::{check_count, placeholders, ImageIn, PromptImage, Vision, MARK};
use crate::prompt::Rendered;

/// The request's images decoded (bounds first, every one checked, the
/// first bad one named) and prepared for `vision`; for a model without a
/// tower, a 400 naming it once the images are known to be readable.
pub fn prepare(
    images: &[ImageIn],
    model: &str,
    vision: Option<&Vision>,
    param: &'static str,
) -> Result<Vec<Arc<Prepared>>, ApiError> {
    check_count(images.len(), param)?;
    let limits = Limits::default();
    let mut decoded = Vec::with_capacity(images.len());
    for img in images {
        let d = onebit_image::decode(&img.bytes, &img.at, &limits)
            .map_err(|e| ApiError::invalid(param, e.0).with_code("invalid_image"))?;
        decoded.push(d);
    }
    let Some(v) = vision else {
        return Err(no_tower(model, param));
    };
    Ok(decoded
        .iter()
        .map(|d| Arc::new(onebit_image::prepare(d, &v.spec)))
        .collect())
}

/// The refusal of an image for a model that has no vision tower.
pub fn no_tower(model: &str, param: &'static str) -> ApiError {
    ApiError::invalid(
        param,
        format!("model {model} has no vision tower (no --mmproj given), so it takes text only"),
    )
    .with_code("model_takes_text_only")
}

/// The prompt ids of a rendered chat holding one [`MARK`] per image: the
/// text between the marks tokenized as `ids` tokenizes a whole prompt (each
/// piece on its own, as `mtmd` tokenizes the text around an image), and in
/// each mark's place the tower's begin text, `tokens` placeholder ids (the
/// image's own, from its pixels' hash: [`placeholders`]) and its end text.
/// `ids` tokenizes one piece.
pub fn lay_out(
    tok: &Tokenizer,
    r: &Rendered,
    vision: &Vision,
    images: &[Arc<Prepared>],
    mut ids: impl FnMut(&Rendered) -> Result<Vec<u32>, ApiError>,
) -> Result<(Vec<u32>, Vec<PromptImage>), ApiError> {
    let marks: Vec<usize> = r.text.match_indices(MARK).map(|(i, _)| i).collect();
    if marks.len() != images.len() {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "the prompt holds {} image places for {} images: a message holds U+{:04X} (reserved to mark images), or the chat template writes a message's content other than once",
                marks.len(),
                images.len(),
                MARK as u32
            ),
        ));
    }
    let fail = |e: onebit_text::TextError| ApiError::server(format!("tokenizing the prompt: {e}"));
    let begin = tok.encode(&vision.begin, false).map_err(fail)?;
    let end = tok.encode(&vision.end, false).map_err(fail)?;
    let mut out = Vec::new();
    let mut placed = Vec::with_capacity(images.len());
    let mut from = 0;
    for (k, &at) in marks
        .iter()
        .chain(std::iter::once(&r.text.len()))
        .enumerate()
    {
        let piece = Rendered {
            text: r.text[from..at].to_string(),
            spans: r.spans.as_ref().map(|spans| {
                spans
                    .iter()
                    .map(|&(a, b)| (a.max(from), b.min(at)))
                    .filter(|(a, b)| a < b)
                    .map(|(a, b)| (a - from, b - from))
                    .collect()
            }),
            // The unmarked strings are checked once, with the first piece.
            unmarked: if k == 0 {
                r.unmarked.clone()
            } else {
                Vec::new()
            },
        };
        if !piece.text.is_empty() || k == 0 {
            out.extend(ids(&piece)?);
        }
        if let Some(img) = images.get(k) {
            out.extend(&begin);
            placed.push(PromptImage {
                start: out.len(),
                image: img.clone(),
            });
            out.extend(placeholders(img, tok.vocab_size()));
            out.extend(&end);
        }
        from = at + MARK.len_utf8();
    }
    Ok((out, placed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

    #[test]
    fn images_are_checked_then_refused_for_a_model_without_a_tower() {
        let good = ImageIn {
            at: "messages[0].content[1]".into(),
            bytes: Arc::new(crate::images::base64(PNG_1X1, "x", "messages").unwrap()),
        };
        let e = prepare(std::slice::from_ref(&good), "smol", None, "messages").unwrap_err();
        assert!(
            e.message
                .contains("model smol has no vision tower (no --mmproj given)"),
            "{}",
            e.message
        );
        // A bad image is named before the tower is asked for.
        let mut cut = good.bytes.as_ref().clone();
        cut.truncate(cut.len() - 20);
        let bad = ImageIn {
            at: "messages[0].content[2]".into(),
            bytes: Arc::new(cut),
        };
        let e = prepare(&[good.clone(), bad], "smol", None, "messages").unwrap_err();
        assert!(
            e.message.contains("messages[0].content[2]"),
            "{}",
            e.message
        );
        assert_eq!(e.code, Some("invalid_image"));
        let many = vec![good; crate::images::MAX_IMAGES + 1];
        let e = prepare(&many, "smol", None, "messages").unwrap_err();
        assert!(e.message.contains("at most 8"), "{}", e.message);
    }
}
