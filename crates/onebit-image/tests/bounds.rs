//! Bad images are refused by name, before their pixels are allocated: a
//! header stating 30000 x 30000, a cut file, bytes that are no image, a
//! format not taken, too many bytes.

use std::time::Instant;

use onebit_image::{decode, probe, Limits};

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A PNG whose header states `w` x `h` RGB, with one tiny IDAT and IEND.
fn png_header(w: u32, h: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let chunk = |out: &mut Vec<u8>, kind: &[u8], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(
        &mut out,
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    );
    chunk(&mut out, b"IEND", &[]);
    out
}

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
        ("PNG", png_header(30000, 30000)),
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
    let e = probe(&png_header(8000, 8000), "x", &l).unwrap_err().0;
    assert!(e.contains("8000x8000 (64000000 pixels)"), "{e}");
    // One side too long, the area within bounds.
    let e = probe(&png_header(20000, 10), "x", &l).unwrap_err().0;
    assert!(e.contains("20000x10") && e.contains("a side"), "{e}");
    // Within bounds, the header alone passes the probe.
    assert_eq!(
        probe(&png_header(640, 480), "x", &l).unwrap(),
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
