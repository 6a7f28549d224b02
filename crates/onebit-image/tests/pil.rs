//! Preprocessing against an independent reference: Pillow's resampling of a
//! real photograph (testdata/images, written by scripts/gen-image-fixtures.py)
//! for each case's size rule and filter, square and rectangular, up and
//! down. Every channel of every pixel must be within 1/255 of Pillow's.

// Channel-major and pixel-major indices side by side read clearest as loops.
#![allow(clippy::needless_range_loop)]

use onebit_image::{decode, prepare, Filter, Limits, Rgb8, Size, Spec};

const MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
const STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

fn dir() -> std::path::PathBuf {
    onebit_testdata::dir().join("images")
}

fn load(name: &str) -> Rgb8 {
    let bytes = std::fs::read(dir().join(name)).unwrap();
    decode(&bytes, name, &Limits::default()).unwrap()
}

/// Largest difference, in 1/255 units, and how many channels differ at all.
fn compare(ours: &[u8], theirs: &[u8]) -> (u8, usize) {
    assert_eq!(ours.len(), theirs.len());
    let mut max = 0;
    let mut n = 0;
    for (a, b) in ours.iter().zip(theirs) {
        let d = a.abs_diff(*b);
        max = max.max(d);
        n += usize::from(d > 0);
    }
    (max, n)
}

#[test]
fn resize_and_normalize_match_pillow_within_one_level() {
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("cases.json")).unwrap()).unwrap();
    let src = load("chelsea.png");
    assert_eq!((src.width, src.height), (120, 80));
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 7);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let size = if let Some(side) = c["size"]["fixed"].as_u64() {
            Size::Fixed {
                side: side as usize,
                tokens: 1,
            }
        } else {
            let d: Vec<usize> = c["size"]["dynamic"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            Size::Dynamic {
                align: d[0],
                min_pixels: d[1],
                max_pixels: d[2],
            }
        };
        let filter = match c["filter"].as_str().unwrap() {
            "bilinear" => Filter::Bilinear,
            "bicubic" => Filter::Bicubic,
            "lanczos" => Filter::Lanczos,
            f => panic!("{f}"),
        };
        let spec = Spec {
            size,
            filter,
            mean: MEAN,
            std: STD,
            pad: [0, 0, 0],
        };
        let want = load(&format!("pil/{name}.png"));
        let target = [
            c["target"][0].as_u64().unwrap(),
            c["target"][1].as_u64().unwrap(),
        ];
        assert_eq!(
            [want.width as u64, want.height as u64],
            target,
            "{name}: the reference's size"
        );
        let p = prepare(&src, &spec);
        assert_eq!(
            (p.width, p.height),
            (want.width, want.height),
            "{name}: target size"
        );
        // Back to levels: the normalization undone in f64, rounded.
        let n = p.width * p.height;
        let mut ours = vec![0u8; 3 * n];
        for i in 0..n {
            for ch in 0..3 {
                let v = f64::from(p.pixels[ch * n + i]) * f64::from(STD[ch]) + f64::from(MEAN[ch]);
                ours[i * 3 + ch] = (v * 255.0).round().clamp(0.0, 255.0) as u8;
            }
        }
        let (max, differ) = compare(&ours, &want.data);
        println!(
            "{name}: {}x{} ({:?}), max difference {max}/255, {differ} of {} channels differ",
            p.width,
            p.height,
            filter,
            3 * n
        );
        assert!(max <= 1, "{name}: a channel is {max}/255 off Pillow");
        // The normalization itself, by arithmetic on Pillow's levels.
        for i in 0..n {
            for ch in 0..3 {
                let want_v = (f32::from(want.data[i * 3 + ch]) / 255.0 - MEAN[ch]) / STD[ch];
                let got = p.pixels[ch * n + i];
                assert!(
                    (got - want_v).abs() <= 1.0 / 255.0 / STD[ch] + 1e-5,
                    "{name}: pixel {i} channel {ch}: {got} vs {want_v}"
                );
            }
        }
    }
}

#[test]
fn webp_and_jpeg_decode_to_the_picture() {
    let png = load("chelsea.png");
    // Lossless WebP: the same bytes.
    let webp = load("chelsea.webp");
    assert_eq!(webp, png, "lossless WebP decodes to the PNG's pixels");
    // JPEG: against Pillow's (libjpeg's) decoding of the same file; the
    // decoders' inverse DCTs and chroma upsampling differ slightly.
    let jpg = load("chelsea.jpg");
    let pil = load("pil/decoded-jpg.png");
    let (max, differ) = compare(&jpg.data, &pil.data);
    let mean: f64 = jpg
        .data
        .iter()
        .zip(&pil.data)
        .map(|(a, b)| f64::from(a.abs_diff(*b)))
        .sum::<f64>()
        / jpg.data.len() as f64;
    println!("jpeg vs Pillow: max {max}/255, mean {mean:.3}, {differ} channels differ");
    assert!(
        mean < 1.0 && max <= 8,
        "JPEG decodes far from Pillow's: max {max}, mean {mean}"
    );
}
