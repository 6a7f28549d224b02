use super::*;
use crate::blocks;
use half::{bf16, f16};

/// A deterministic pseudo-random stream (the q4nx tests' inputs).
pub(super) fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

fn ggml_blocks(dtype: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let bb = dtype.block_bytes();
    let mut out = vec![0u8; n * k / 32 * bb];
    for blk in out.chunks_exact_mut(bb) {
        for b in blk.iter_mut() {
            *b = r() as u8;
        }
        // Sane f16 scales: |d| in [2^-12, 2^-4), minimum in (-0.5, 0.5).
        let d = f16::from_f32((1 + r() % 255) as f32 / 4096.0);
        blk[0..2].copy_from_slice(&d.to_le_bytes());
        if dtype == GgmlType::Q4_1 {
            let m = f16::from_f32(((r() % 1000) as f32 - 500.0) / 1000.0);
            blk[2..4].copy_from_slice(&m.to_le_bytes());
        } else if r().is_multiple_of(2) {
            // Q4_0 scales are negative whenever the largest weight is positive.
            blk[1] |= 0x80;
        }
    }
    out
}

/// ggml's dequantization of the blocks with scales and minimums rounded to bf16.
fn expected(dtype: GgmlType, b: &[u8]) -> Vec<f32> {
    let mut b = b.to_vec();
    let bb = dtype.block_bytes();
    let round = |x: &mut [u8]| {
        let v = f16::from_le_bytes([x[0], x[1]]).to_f32();
        let r = f16::from_f32(bf16::from_f32(v).to_f32());
        x.copy_from_slice(&r.to_le_bytes());
    };
    for blk in b.chunks_exact_mut(bb) {
        round(&mut blk[0..2]);
        if dtype == GgmlType::Q4_1 {
            round(&mut blk[2..4]);
        }
    }
    let mut out = vec![0f32; b.len() / bb * 32];
    blocks::dequantize(dtype, &b, &mut out).unwrap();
    out
}

#[test]
fn repack_from_q4_1_and_q4_0_decodes_to_ggml_values_with_bf16_scales() {
    for (dtype, kind) in [
        (GgmlType::Q4_1, Q4Kind::Asymmetric),
        (GgmlType::Q4_0, Q4Kind::Symmetric),
    ] {
        // K = 640 is off the 256 grid: zero padding to 768.
        for (n, k) in [(64, 512), (32, 640), (96, 96)] {
            let b = ggml_blocks(dtype, n, k, n as u64 * 7 + k as u64);
            let s = Q4Shape::new(n, k).unwrap();
            let tiles = from_ggml(dtype, &b, s).unwrap();
            assert_eq!(tiles.len(), n / 32 * s.kp() / 256 * TILE_BYTES);
            let want = expected(dtype, &b);
            let (got_kind, got) = decode_tensor(&tiles, s).unwrap();
            assert_eq!(got_kind, kind);
            assert_eq!(got, want, "{dtype} {n}x{k}");
            let mut row = vec![0f32; k];
            decode_row(&tiles, s, n - 1, &mut row).unwrap();
            assert_eq!(row, want[(n - 1) * k..]);
            // Repacking for the kernels gives ggml blocks that decode the same.
            let (dt, back, _) = to_ggml(&tiles, s).unwrap();
            assert_eq!(dt, dtype);
            let mut dec = vec![0f32; n * k];
            blocks::dequantize(dt, &back, &mut dec).unwrap();
            assert_eq!(dec, want);
        }
    }
}

#[test]
fn tile_layout_by_the_bytes() {
    // One tile, every code zero but row 3 column 5 (nibble 9) and row 16
    // column 0 (nibble 4); scale 1 everywhere, minimum 0.5 at group 0 row 3.
    let s = Q4Shape::new(32, 256).unwrap();
    let mut g = Q4Groups {
        shape: s,
        kind: Q4Kind::Asymmetric,
        d: vec![bf16::from_f32(1.0).to_bits(); 32 * 8],
        m: vec![0; 32 * 8],
        nib: vec![0; 32 * 256],
    };
    g.m[3 * 8] = bf16::from_f32(0.5).to_bits();
    g.nib[3 * 256 + 5] = 9;
    g.nib[16 * 256] = 4;
    let t = encode(&g);
    // Scales and minimums at g * 32 + r; codes at h * 2048 + c * 8 + j.
    assert_eq!(&t[2 * 3..2 * 3 + 2], &bf16::from_f32(1.0).to_le_bytes());
    assert_eq!(
        &t[512 + 2 * 3..512 + 2 * 3 + 2],
        &bf16::from_f32(0.5).to_le_bytes()
    );
    assert_eq!(
        t[1024 + 5 * 8 + 1],
        0x90,
        "row 3 = 2*1 + 1: high nibble of j = 1"
    );
    assert_eq!(t[1024 + 2048], 0x04, "row 16: half 1, j = 0, low nibble");
    let mut out = vec![0f32; 32 * 256];
    decode_tile(&t, &mut out);
    assert_eq!(out[3 * 256 + 5], 9.5);
    assert_eq!(out[3 * 256 + 6], 0.5);
    assert_eq!(out[16 * 256], 4.0);
}

/// A tile with every code `nib`, scale `d` and minimum `m` everywhere.
fn uniform_tile(nib: u8, d: f32, m: f32) -> Vec<u8> {
    let s = Q4Shape::new(32, 256).unwrap();
    encode(&Q4Groups {
        shape: s,
        kind: Q4Kind::Asymmetric,
        d: vec![bf16::from_f32(d).to_bits(); 32 * 8],
        m: vec![bf16::from_f32(m).to_bits(); 32 * 8],
        nib: vec![nib; 32 * 256],
    })
}

/// Every reader of a 32 x 256*t tensor: (kind or error) and the first value.
fn read_all(data: &[u8], tiles: usize) -> Vec<std::result::Result<f32, String>> {
    let s = Q4Shape::new(32, 256 * tiles).unwrap();
    let last = 256 * tiles - 1;
    let whole = decode_tensor(data, s).map(|(_, v)| v[last]);
    let mut row = vec![0f32; s.k];
    let one = decode_row(data, s, 0, &mut row).map(|_| row[last]);
    let kern = to_ggml(data, s).map(|(dt, b, _)| {
        let mut v = vec![0f32; s.k];
        blocks::dequantize(dt, &b[..dt.row_bytes(s.k as u64).unwrap() as usize], &mut v).unwrap();
        v[last]
    });
    [whole, one, kern]
        .into_iter()
        .map(|r| r.map_err(|e| e.0))
        .collect()
}

#[test]
fn asymmetric_tile_with_zero_minimums_and_positive_scales_stays_asymmetric() {
    let t = uniform_tile(15, 1.0, 0.0);
    assert_eq!(tile_kind(&t), TileKind::Undecided);
    let mut out = vec![0f32; 32 * 256];
    decode_tile(&t, &mut out);
    assert_eq!(out[0], 15.0, "a lone undecided tile reads as asymmetric");
    // Alone, and beside an asymmetric tile with non-zero minimums.
    for data in [t.clone(), [uniform_tile(1, 1.0, 0.25), t.clone()].concat()] {
        let n = data.len() / TILE_BYTES;
        assert_eq!(tensor_kind(&data), Ok(Q4Kind::Asymmetric));
        for r in read_all(&data, n) {
            assert_eq!(r, Ok(15.0));
        }
    }
}

#[test]
fn symmetric_tensor_reads_its_undecided_tile_as_symmetric_through_every_reader() {
    // Tile 0: zero minimums and a negative scale (symmetric on its own);
    // tile 1: zero minimums and scale +1 (undecided), codes 0xC = -4.
    let sym = uniform_tile(0xC, -1.0, 0.0);
    let undecided = uniform_tile(0xC, 1.0, 0.0);
    assert_eq!(tile_kind(&sym), TileKind::Symmetric);
    assert_eq!(tile_kind(&undecided), TileKind::Undecided);
    let data = [sym, undecided].concat();
    assert_eq!(tensor_kind(&data), Ok(Q4Kind::Symmetric));
    for r in read_all(&data, 2) {
        assert_eq!(r, Ok(-4.0), "the undecided tile follows its tensor");
    }
}

#[test]
fn mixed_tensor_is_refused_by_every_reader() {
    let data = [uniform_tile(3, -1.0, 0.0), uniform_tile(3, 1.0, 0.5)].concat();
    for r in read_all(&data, 2) {
        let e = r.expect_err("mixed refused");
        assert!(e.contains("both tile kinds"), "{e}");
    }
    assert!(tensor_kind(&data).is_err());
}

#[test]
fn negative_zero_counts_as_zero() {
    // -0.0 minimums are zero; a -0.0 scale is not below zero.
    let t = uniform_tile(1, -0.0, -0.0);
    assert_eq!(tile_kind(&t), TileKind::Undecided);
    let t = uniform_tile(1, -1.0, -0.0);
    assert_eq!(tile_kind(&t), TileKind::Symmetric);
}

#[test]
fn geometry_is_checked() {
    assert!(Q4Shape::new(48, 256).unwrap_err().0.contains("32 rows"));
    assert!(Q4Shape::new(32, 100).unwrap_err().0.contains("32-column"));
    let s = Q4Shape::new(32, 256).unwrap();
    assert!(decode_tensor(&[0u8; 100], s)
        .unwrap_err()
        .0
        .contains("needs 1 tiles"));
    assert!(from_ggml(GgmlType::Q8_0, &[], s).is_err());
}

#[test]
fn quantize_is_close_and_of_the_asked_kind() {
    let (n, k) = (64, 320);
    let mut r = rng(5);
    let w: Vec<f32> = (0..n * k)
        .map(|_| ((r() % 20001) as f32 - 10000.0) / 100000.0)
        .collect();
    let s = Q4Shape::new(n, k).unwrap();
    for kind in [Q4Kind::Asymmetric, Q4Kind::Symmetric] {
        let t = quantize(&w, s, kind);
        let (got_kind, back) = decode_tensor(&t, s).unwrap();
        assert_eq!(got_kind, kind);
        for (gi, (a, b)) in w.chunks(32).zip(back.chunks(32)).enumerate() {
            let amax = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            let (lo, hi) = a
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            // Asymmetric: within a step of (max - min)/15, and a squared
            // error no larger than the reference choice's (codes against
            // min and (max - min)/15). Symmetric: Q4_0's step is amax/8
            // and the far end of the range (+8) clamps to 7.
            let bound = match kind {
                Q4Kind::Asymmetric => (hi - lo) / 15.0 * 1.01,
                Q4Kind::Symmetric => amax / 8.0 * 1.01,
            } + 1e-4;
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= bound, "{kind:?} group {gi}: {x} vs {y}");
            }
            if kind == Q4Kind::Asymmetric {
                let d = (hi - lo) / 15.0;
                let reference: f32 = a
                    .iter()
                    .map(|&x| {
                        let q = ((x - lo) / d).round().clamp(0.0, 15.0);
                        (q * d + lo - x).powi(2)
                    })
                    .sum();
                let ours: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
                // bf16 rounding of the stored pair aside.
                assert!(
                    ours <= reference * 1.05 + 1e-7,
                    "group {gi}: {ours} vs {reference}"
                );
            }
        }
    }
}

#[test]
fn q8_tiles_round_trip_q8_0_blocks() {
    for (n, k) in [(32, 128), (64, 96), (32, 640)] {
        let mut r = rng(k as u64);
        let bb = 34;
        let mut b = vec![0u8; n * k / 32 * bb];
        for blk in b.chunks_exact_mut(bb) {
            for x in blk.iter_mut() {
                *x = r() as u8;
            }
            // bf16-representable scales: the round trip is exact.
            let d = f16::from_f32(bf16::from_f32((1 + r() % 200) as f32 / 1024.0).to_f32());
            blk[0..2].copy_from_slice(&d.to_le_bytes());
        }
        let s = Q8Shape::new(n, k).unwrap();
        let t = q8_from_q8_0(&b, s).unwrap();
        assert_eq!(t.len(), s.bytes());
        assert_eq!(s.stored_shape()[2], 5120);
        let (back, inexact) = q8_to_q8_0(&t, s).unwrap();
        assert_eq!(inexact, 0);
        assert_eq!(back, b);
        let mut want = vec![0f32; n * k];
        blocks::dequantize(GgmlType::Q8_0, &b, &mut want).unwrap();
        let mut row = vec![0f32; k];
        q8_decode_row(&t, s, n - 1, &mut row).unwrap();
        assert_eq!(row, want[(n - 1) * k..]);
    }
}
