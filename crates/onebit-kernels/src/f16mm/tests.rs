use super::*;

/// Seeded f16 weights of about 0.05 (some exact zeros, negatives and
/// subnormals among them) and activations in -2..2.
fn inputs(rows: usize, cols: usize, n_tok: usize, seed: u64) -> (Vec<u16>, Vec<f32>) {
    let mut z = seed;
    let mut next = || {
        z = z
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        z >> 33
    };
    let w: Vec<u16> = (0..rows * cols)
        .map(|i| match i % 97 {
            0 => 0,
            1 => 0x0003, // subnormal
            _ => {
                let v = (next() % 2001) as f32 / 20000.0 - 0.05;
                half::f16::from_f32(v).to_bits()
            }
        })
        .collect();
    let x: Vec<f32> = (0..n_tok * cols)
        .map(|_| (next() % 40001) as f32 / 10000.0 - 2.0)
        .collect();
    (w, x)
}

fn levels() -> Vec<Isa> {
    Isa::available()
}

/// Every level equals the reference bit for bit, on shapes that leave
/// partial tiles everywhere: rows not a multiple of 16 (a padded panel) or
/// of 32 (a lone panel at AVX-512), inputs past a KC block and not a
/// multiple of it, activation rows not a multiple of any MR or of TB.
#[test]
fn every_level_equals_the_reference() {
    let pool = Pool::new(2);
    for (rows, cols, n_tok) in [
        (1, 1, 1),
        (16, 8, 1),
        (37, 300, 7),
        (48, 513, 13),
        (64, 256, 97),
        (5, 40, 200),
        (33, 600, 23),
        // 5 and 7 panels: groups of 3 and a last group of 2 or 1.
        (80, 64, 9),
        (100, 70, 17),
    ] {
        let (w, x) = inputs(rows, cols, n_tok, (rows * 1000 + cols) as u64);
        let mut want = vec![0f32; n_tok * rows];
        matmul_reference(&w, rows, cols, &x, n_tok, &mut want);
        let m = F16Matrix::from_bits(rows, cols, &w);
        for isa in levels() {
            let mut got = vec![f32::NAN; n_tok * rows];
            m.matmul_at(isa, &pool, &x, n_tok, &mut got);
            let same = want
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{isa:?} {rows}x{cols}, {n_tok} rows: first difference at {:?}",
                want.iter()
                    .zip(&got)
                    .position(|(a, b)| a.to_bits() != b.to_bits())
            );
        }
    }
    eprintln!("f16mm {}", Isa::levels_line());
}

/// Each row of a many-row product equals that row run alone, at every
/// level (and on one thread or two).
#[test]
fn each_row_equals_it_alone() {
    let (rows, cols, n_tok) = (50, 290, 31);
    let (w, x) = inputs(rows, cols, n_tok, 7);
    let m = F16Matrix::from_bits(rows, cols, &w);
    for threads in [1, 2] {
        let pool = Pool::new(threads);
        for isa in levels() {
            let mut all = vec![0f32; n_tok * rows];
            m.matmul_at(isa, &pool, &x, n_tok, &mut all);
            for t in 0..n_tok {
                let mut one = vec![0f32; rows];
                m.matmul_at(isa, &pool, &x[t * cols..(t + 1) * cols], 1, &mut one);
                assert_eq!(
                    one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    all[t * rows..(t + 1) * rows]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>(),
                    "{isa:?}, {threads} threads, row {t}"
                );
            }
        }
    }
    eprintln!("f16mm rows alone: {}", Isa::levels_line());
}

/// The panels hold the weights: `weight` reads back every input, and the
/// byte constructor equals the bit one.
#[test]
fn panels_hold_the_weights() {
    let (rows, cols) = (21, 9);
    let (w, _) = inputs(rows, cols, 0, 3);
    let bytes: Vec<u8> = w.iter().flat_map(|b| b.to_le_bytes()).collect();
    let m = F16Matrix::from_le_bytes(rows, cols, &bytes);
    for r in 0..rows {
        for k in 0..cols {
            assert_eq!(
                m.weight(r, k).to_bits(),
                f16_to_f32(w[r * cols + k]).to_bits()
            );
        }
    }
    assert_eq!(m.bytes(), 2 * 2 * NR * cols);
}

/// The reference's chain is fused: on inputs where a separate multiply
/// and add round differently (some of these do), it gives the fused bits.
#[test]
fn the_reference_fuses() {
    let (_, x) = inputs(1, 2, 400, 11);
    let w = [
        half::f16::from_f32(0.0371).to_bits(),
        half::f16::from_f32(-0.0423).to_bits(),
    ];
    let (w0, w1) = (f16_to_f32(w[0]), f16_to_f32(w[1]));
    let mut differ = 0;
    for xs in x.chunks_exact(2) {
        let mut out = [0f32];
        matmul_reference(&w, 1, 2, xs, 1, &mut out);
        let fused = w1.mul_add(xs[1], w0.mul_add(xs[0], 0.0));
        assert_eq!(out[0].to_bits(), fused.to_bits());
        differ += usize::from((w0 * xs[0] + w1 * xs[1]).to_bits() != fused.to_bits());
    }
    assert!(differ > 0, "no input told fused from unfused");
}
