//! Bad images are refused by name, before their pixels are allocated: a
//! header stating 30000 x 30000, a cut file, bytes that are no image, a
//! format not taken, too many bytes.

use std::time::Instant;

use onebit_image::{decode, probe, Limits};

/// The test photograph's JPEG with its frame header (SOF0) restating its
/// size as `w` x `h`.
fn jpeg_header(w: u16, h: u16) -> Vec<u8> {
    let mut jpg = std::fs::read(onebit_testdata::dir().join("images/chelsea.jpg")).unwrap();
    let sof = jpg
        .windows(2)
        .position(|m| m == [0xff, 0xc0])
        .expect("a baseline frame header");
    // marker (2), length (2), precision (1), then height and width.
    jpg[sof + 5..sof + 7].copy_from_slice(&h.to_be_bytes());
    jpg[sof + 7..sof + 9].copy_from_slice(&w.to_be_bytes());
    jpg
}

#[test]
fn a_huge_header_is_refused_without_decoding() {
    let l = Limits::default();
    for (what, bytes) in [
        ("PNG", onebit_testdata::png_with_header(30000, 30000)),
        ("JPEG", jpeg_header(30000, 30000)),
    ] {
        let t = Instant::now();
        let e = decode(&bytes, "messages[0].content[1]", &l).unwrap_err().0;
        assert!(
            e.contains("messages[0].content[1]") && e.contains("30000x30000"),
            "{what}: {e}"
        );
        // 30000^2 RGB would be 2.7 GB: refused from the header at once.
        assert!(
            t.elapsed().as_millis() < 500,
            "{what}: took {:?}",
            t.elapsed()
        );
        println!("{what}: {e}");
    }
    // Each side within bounds, the area not.
    let e = probe(&onebit_testdata::png_with_header(8000, 8000), "x", &l)
        .unwrap_err()
        .0;
    assert!(e.contains("8000x8000 (64000000 pixels)"), "{e}");
    // One side too long, the area within bounds.
    let e = probe(&onebit_testdata::png_with_header(20000, 10), "x", &l)
        .unwrap_err()
        .0;
    assert!(e.contains("20000x10") && e.contains("a side"), "{e}");
    // Within bounds, the header alone passes the probe.
    assert_eq!(
        probe(&onebit_testdata::png_with_header(640, 480), "x", &l).unwrap(),
        ("PNG", 640, 480)
    );
}

#[test]
fn a_truncated_or_corrupt_image_is_named() {
    let png = std::fs::read(onebit_testdata::dir().join("images/chelsea.png")).unwrap();
    let l = Limits::default();
    let e = decode(&png[..png.len() / 2], "messages[0].content[1]", &l)
        .unwrap_err()
        .0;
    assert!(
        e.contains("messages[0].content[1]") && e.contains("not a readable PNG (120x80)"),
        "{e}"
    );
    // A byte flipped inside the compressed data: a CRC or inflate error.
    let mut bad = png.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    let e = decode(&bad, "images[0]", &l).unwrap_err().0;
    assert!(e.contains("images[0]") && e.contains("PNG"), "{e}");
    // Cut inside the header.
    let e = decode(&png[..20], "images[0]", &l).unwrap_err().0;
    assert!(e.contains("images[0]") && e.contains("header"), "{e}");
}

#[test]
fn what_is_not_png_jpeg_or_webp_is_refused_by_name() {
    let l = Limits::default();
    let e = decode(b"hello, world", "images[2]", &l).unwrap_err().0;
    assert!(
        e.contains("images[2]") && e.contains("not a PNG, JPEG or WebP") && e.contains("68 65 6c"),
        "{e}"
    );
    let e = decode(b"GIF89a\x01\x00\x01\x00\x00\x00\x00", "images[0]", &l)
        .unwrap_err()
        .0;
    assert!(
        e.contains("Gif") && e.contains("PNG, JPEG and WebP are taken"),
        "{e}"
    );
    let e = decode(b"", "images[0]", &l).unwrap_err().0;
    assert!(e.contains("empty"), "{e}");
    let small = Limits {
        max_bytes: 100,
        ..Limits::default()
    };
    let e = decode(&[0u8; 101], "images[0]", &small).unwrap_err().0;
    assert!(e.contains("101 bytes; at most 100"), "{e}");
}
