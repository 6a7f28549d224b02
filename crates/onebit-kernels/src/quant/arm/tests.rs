//! Every aarch64 level against the scalar reference, bit for bit: random and
//! edge-case rows (zero and extreme scales, zero and huge activations), row
//! and token counts that are not multiples of the tiles (1 x 4 tokens,
//! `smmla`'s 2 x 2), rows whose block count leaves a tail after the groups
//! of four blocks. Each test prints the levels it ran and those this CPU
//! could not run.

use super::*;
use crate::quant::test_inputs::{
    expect_few_rows, expect_same, few_rows_operands, operands, scalar_dots, Rng, QUANT_TYPES,
};
use crate::quant::{act_format, act_row_bytes};

/// The SIMD levels this CPU runs; prints them and the ones it cannot.
fn levels(test: &str) -> Vec<Isa> {
    let ran: Vec<Isa> = Isa::available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .collect();
    let names = |v: &[Isa]| v.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ");
    println!(
        "{test}: ran levels [{}]; this CPU could not run [{}]",
        names(&ran),
        names(&Isa::unavailable())
    );
    ran
}

fn check(levels: &[Isa], t: GgmlType, cols: usize, nrows: usize, ntok: usize, seed: u64) {
    let mut rng = Rng(seed);
    let wrb = t.row_bytes(cols as u64).unwrap() as usize;
    let arb = act_row_bytes(act_format(t), cols);
    for mode in 0..3 {
        let (w, a) = operands(&mut rng, t, cols, nrows, ntok, mode);
        let want = scalar_dots(t, cols, nrows, ntok, &w, &a);
        for &isa in levels {
            let ops = Operands {
                w: &w,
                wrb,
                a: &a,
                arb,
                cols,
            };
            let mut got = vec![f32::NAN; ntok * nrows];
            // SAFETY: `got` has ntok * nrows elements, ostride nrows.
            unsafe { gemm(isa, t, &ops, nrows, ntok, got.as_mut_ptr(), nrows) };
            expect_same(&got, &want, &format!("{isa:?} {t}"), cols, nrows, mode);
        }
    }
}

const SHAPES: [(usize, usize); 7] = [(1, 1), (2, 2), (4, 1), (5, 3), (9, 4), (3, 9), (8, 8)];

#[test]
fn blocks_of_32_equal_the_scalar_reference() {
    let levels = levels("blocks of 32");
    for t in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::MXFP4,
    ] {
        for (i, cols) in [32, 64, 128, 160, 224, 256, 288, 576, 640, 2048 + 96]
            .into_iter()
            .enumerate()
        {
            for (nrows, ntok) in SHAPES {
                let seed = 1000 * i as u64 + nrows as u64 * 10 + ntok as u64;
                check(&levels, t, cols, nrows, ntok, seed);
            }
        }
    }
}

#[test]
fn k_quants_equal_the_scalar_reference() {
    let levels = levels("K-quants");
    for t in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        for cols in [256, 512, 1024] {
            for (nrows, ntok) in SHAPES {
                let seed = cols as u64 + nrows as u64 * 10 + ntok as u64;
                check(&levels, t, cols, nrows, ntok, seed);
            }
        }
    }
}

/// The few-row kernels (a batched decode step, a speculative verify: 2 to
/// 16 tokens; `rows.rs`, and at i8mm the `smmla` tiles of 2 rows x 2 or 4
/// tokens): every k in 1..=16 and a few above, every type, every level; 7
/// rows (pairs and a lone row), columns that end in a partial group of 4
/// blocks. Each output equals the scalar reference, and each token's row
/// equals that token run alone (ntok = 1) at the same level.
#[test]
fn few_rows_equal_the_scalar_reference_and_each_row_alone() {
    let levels = levels("few rows");
    let nrows = 7;
    for t in QUANT_TYPES {
        for (cols, w, a) in few_rows_operands(t, nrows) {
            let wrb = t.row_bytes(cols as u64).unwrap() as usize;
            let arb = act_row_bytes(act_format(t), cols);
            for &isa in &levels {
                let run = |first: usize, ntok: usize| {
                    let ops = Operands {
                        w: &w,
                        wrb,
                        a: &a[first * arb..(first + ntok) * arb],
                        arb,
                        cols,
                    };
                    let mut got = vec![f32::NAN; ntok * nrows];
                    // SAFETY: `got` has ntok * nrows elements, ostride nrows.
                    unsafe { gemm(isa, t, &ops, nrows, ntok, got.as_mut_ptr(), nrows) };
                    got
                };
                expect_few_rows(
                    &format!("{isa:?} {t} cols {cols}"),
                    t,
                    cols,
                    nrows,
                    &w,
                    &a,
                    run,
                );
            }
        }
    }
}

#[test]
fn f32_equals_the_scalar_reference() {
    let levels = levels("F32");
    for cols in [1, 7, 8, 9, 64, 65, 640] {
        for (nrows, ntok) in [(1, 1), (5, 3), (9, 4)] {
            check(&levels, GgmlType::F32, cols, nrows, ntok, cols as u64);
        }
    }
}

#[test]
fn every_level_is_detected_consistently() {
    levels("detection");
    assert!(Isa::available().contains(&Isa::Scalar));
    assert!(Isa::best().supported());
    // Each level includes the one before: no gaps in what this CPU runs.
    let avail = Isa::available();
    assert_eq!(avail[..], Isa::all()[..avail.len()]);
    for &isa in Isa::all() {
        let has = gemm_fn(isa, GgmlType::Q4K).is_some();
        assert_eq!(has, isa != Isa::Scalar, "{isa:?}");
    }
}
