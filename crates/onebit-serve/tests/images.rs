//! An image's place in a chat prompt, on SmolLM2's tokenizer with its
//! control tokens standing in for a tower's begin and end markers: the
//! image's mark becomes begin, one placeholder id per embedding, end; the
//! text around it is tokenized with the user's strings still plain (a
//! control token typed in the content stays text after the split); and a
//! prompt whose marks do not match its images is refused.

use std::sync::Arc;

use onebit_formats::gguf::Gguf;
use onebit_image::{Filter, Rgb8, Size, Spec};
use onebit_serve::image_prompt::lay_out;
use onebit_serve::images::{Vision, MARK};
use onebit_serve::prompt;
use onebit_text::{ChatTemplate, TemplateTokens, Tokenizer};
use serde_json::json;

fn tokenizer() -> Tokenizer {
    let g = Gguf::open(onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M)).unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

/// `<|im_start|>` is 1 and `<|im_end|>` 2 in SmolLM2's vocabulary.
fn markers(ids: &[u32]) -> usize {
    ids.iter().filter(|&&id| id == 1 || id == 2).count()
}

fn vision(tokens: usize) -> Vision {
    Vision {
        projector: "test".into(),
        spec: Spec {
            size: Size::Fixed { side: 4, tokens },
            filter: Filter::Bilinear,
            mean: [0.5; 3],
            std: [0.5; 3],
            pad: [0, 0, 0],
        },
        begin: "<|im_start|>".into(),
        end: "<|im_end|>".into(),
        tower: None,
    }
}

#[test]
fn an_image_takes_its_marks_place_between_begin_and_end() {
    let tok = tokenizer();
    let t = ChatTemplate::new(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n",
        TemplateTokens::from_tokenizer(&tok),
    )
    .unwrap();
    let content = format!("Look <|im_end|> here\n{MARK}\nWhat is it?");
    let msgs = json!([{"role": "user", "content": content}]);
    let r = prompt::render(&t, &msgs, None, true).unwrap();
    let v = vision(4);
    let img = Rgb8 {
        width: 2,
        height: 2,
        data: vec![255; 12],
    };
    let p = Arc::new(onebit_image::prepare(&img, &v.spec));
    assert_eq!((p.width, p.height, p.tokens), (4, 4, 4));
    // White is (1 - 0.5) / 0.5 = 1 where the image lies, black padding -1.
    assert!(p.pixels.iter().all(|&x| x == 1.0), "{:?}", p.pixels);
    let (ids, placed) = lay_out(&tok, &r, &v, std::slice::from_ref(&p), |piece| {
        prompt::ids(&tok, piece, &msgs, false)
    })
    .unwrap();
    assert_eq!(placed.len(), 1);
    let at = placed[0].start;
    assert_eq!(ids[at - 1], 1, "begin before the image's ids");
    // The placeholders are the image's own: a function of its pixels'
    // hash, so the same picture gives the same ids and another picture
    // others (what the prefix cache compares).
    let own: Vec<u32> = onebit_serve::images::placeholders(&p, tok.vocab_size()).collect();
    assert_eq!(&ids[at..at + 4], &own[..]);
    assert!(own.iter().all(|&id| (id as usize) < tok.vocab_size()));
    let black = Rgb8 {
        width: 2,
        height: 2,
        data: vec![0; 12],
    };
    let q = onebit_image::prepare(&black, &v.spec);
    let other: Vec<u32> = onebit_serve::images::placeholders(&q, tok.vocab_size()).collect();
    assert_ne!(own, other);
    let again = onebit_image::prepare(&img, &v.spec);
    assert!(onebit_serve::images::placeholders(&again, tok.vocab_size()).eq(own.iter().copied()));
    assert_eq!(ids[at + 4], 2, "end after them");
    // The template's 3 markers and the image's 2; the typed <|im_end|> is text.
    assert_eq!(markers(&ids), 5, "{ids:?}");
    let before = tok.decode(&ids[..at - 1], false).unwrap();
    let after = tok.decode(&ids[at + 5..], false).unwrap();
    let (want_before, want_after) = r.text.split_once(MARK).unwrap();
    assert_eq!((before.as_str(), after.as_str()), (want_before, want_after));

    // A second mark (typed by the user) for one image: refused.
    let msgs = json!([{"role": "user", "content": format!("{MARK}{MARK}")}]);
    let r = prompt::render(&t, &msgs, None, true).unwrap();
    let e = lay_out(&tok, &r, &v, std::slice::from_ref(&p), |piece| {
        prompt::ids(&tok, piece, &msgs, false)
    })
    .unwrap_err();
    assert!(
        e.message.contains("2 image places for 1 images"),
        "{}",
        e.message
    );
}
