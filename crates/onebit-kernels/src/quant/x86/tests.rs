//! Every SIMD level against the scalar reference, bit for bit: random and
//! edge-case rows (zero and extreme scales, zero activations), row counts and
//! token counts that are not multiples of the tile, rows whose block count
//! leaves a tail after the groups of 8.

use super::*;
use crate::quant::test_inputs::{
    self, expect_few_rows, expect_same, few_ks, few_rows_operands, operands, scalar_dots, weights,
    Rng, QUANT_TYPES,
};
use crate::quant::{act_format, act_row_bytes, quantize_act};

/// Says which SIMD levels the tests of this file run and which this CPU
/// lacks (they are skipped, never silently).
fn say_levels(test: &str) {
    println!("{test}: {}", Isa::levels_line());
}

fn check(t: GgmlType, cols: usize, nrows: usize, ntok: usize, seed: u64) {
    let mut rng = Rng(seed);
    for mode in 0..3 {
        let (w, a) = operands(&mut rng, t, cols, nrows, ntok, mode);
        check_rows(t, cols, nrows, ntok, &w, &a, mode);
    }
}

/// Every level's kernels (one-token and wide) on weight rows `w` and
/// quantized activation rows `a` against the scalar reference.
fn check_rows(t: GgmlType, cols: usize, nrows: usize, ntok: usize, w: &[u8], a: &[u8], mode: u32) {
    let fmt = act_format(t);
    let wrb = t.row_bytes(cols as u64).unwrap() as usize;
    let arb = act_row_bytes(fmt, cols);
    {
        let want = scalar_dots(t, cols, nrows, ntok, w, a);
        let (wk, ak, parb) = if packs(t) {
            // The whole matrix: per row, or (Q4_0) groups of 8 rows
            // interleaved and the rest per row.
            let mut wp = vec![0u8; w.len() + PAD];
            pack_weight_rows(t, w, wrb, &mut wp[..w.len()]);
            let parb = packed_act_row_bytes(fmt, cols);
            // Padding of NaN-looking bytes: masked lanes must not leak.
            let mut ap = vec![0xFFu8; ntok * parb + PAD];
            for (s, d) in a.chunks_exact(arb).zip(ap.chunks_exact_mut(parb)) {
                pack_act_row(fmt, s, d);
            }
            (wp, ap, parb)
        } else if interleaves(t) {
            // The whole matrix: groups of 8 rows interleaved, the rest standard.
            let mut wp = vec![0u8; w.len()];
            pack_weight_rows(t, w, wrb, &mut wp);
            (wp, a.to_vec(), arb)
        } else {
            (w.to_vec(), a.to_vec(), arb)
        };
        for isa in Isa::available().into_iter().filter(|&i| i != Isa::Scalar) {
            let ops = Operands {
                w: &wk,
                wrb,
                a: &ak,
                arb: parb,
                cols,
            };
            let mut got = vec![f32::NAN; ntok * nrows];
            // SAFETY: `got` has ntok * nrows elements, ostride nrows.
            unsafe { gemm(isa, t, false, &ops, nrows, ntok, got.as_mut_ptr(), nrows) };
            expect_same(&got, &want, &format!("{isa:?} {t}"), cols, nrows, mode);
            if wide_fn(isa, t).is_none() {
                continue;
            }
            // The wide (prefill) kernel reads the same packed weights and
            // wide activation rows, and must give the same bits.
            let warb = wide_act_row_bytes(fmt, cols);
            let mut aw = vec![0u8; ntok * warb];
            for (s, d) in a.chunks_exact(arb).zip(aw.chunks_exact_mut(warb)) {
                pack_act_row_wide(fmt, s, d);
            }
            let ops = Operands {
                w: &wk,
                wrb,
                a: &aw,
                arb: warb,
                cols,
            };
            let mut got = vec![f32::NAN; ntok * nrows];
            // SAFETY: `got` has ntok * nrows elements, ostride nrows.
            unsafe { gemm(isa, t, true, &ops, nrows, ntok, got.as_mut_ptr(), nrows) };
            expect_same(&got, &want, &format!("{isa:?} wide {t}"), cols, nrows, mode);
        }
    }
}

/// (rows, tokens) of the SIMD-vs-scalar checks: single rows and tokens,
/// partial and whole 8-row groups, more tokens than rows, and tails.
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (4, 1),
    (5, 3),
    (9, 4),
    (3, 9),
    (8, 8),
    (16, 1),
    (17, 2),
    (24, 3),
];

#[test]
fn blocks_of_32_equal_the_scalar_reference() {
    say_levels("blocks_of_32_equal_the_scalar_reference");
    for t in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::MXFP4,
    ] {
        for (i, cols) in [32, 64, 128, 192, 224, 256, 288, 576, 640, 1536, 2048 + 96]
            .into_iter()
            .enumerate()
        {
            for &(nrows, ntok) in SHAPES {
                check(
                    t,
                    cols,
                    nrows,
                    ntok,
                    1000 * i as u64 + nrows as u64 * 10 + ntok as u64,
                );
            }
        }
    }
}

#[test]
fn k_quants_equal_the_scalar_reference() {
    say_levels("k_quants_equal_the_scalar_reference");
    for t in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        for cols in [256, 512, 1024, 2048] {
            // 8-row groups (Q4_K's interleaved layout) with and without a
            // tail of standard rows, one token and several.
            for &(nrows, ntok) in SHAPES.iter().chain(&[
                (8, 5),
                // Two whole groups over whole token tiles of the wide
                // interleaved kernels (6 with VNNI, else 4) and an edge.
                (16, 13),
            ]) {
                check(
                    t,
                    cols,
                    nrows,
                    ntok,
                    cols as u64 + nrows as u64 * 10 + ntok as u64,
                );
            }
        }
    }
}

/// The few-row kernels (a batched decode step, a speculative verify: 2 to
/// 16 tokens, each weight group decoded once per tile of tokens): every k in
/// 1..=16 and a few above, every type with a kernel, every level; the rows
/// span two whole interleaved groups and a tail of 3 standard or per-row
/// packed rows, and the columns end in a partial group of blocks. Each
/// output equals the scalar reference, and each token's row equals that
/// token run alone (ntok = 1) at the same level.
#[test]
fn few_rows_equal_the_scalar_reference_and_each_row_alone() {
    say_levels("few_rows_equal_the_scalar_reference_and_each_row_alone");
    let kmax = *few_ks().iter().max().unwrap();
    let nrows = 19;
    for t in QUANT_TYPES {
        for (cols, w, a) in few_rows_operands(t, nrows) {
            let fmt = act_format(t);
            let wrb = t.row_bytes(cols as u64).unwrap() as usize;
            let arb = act_row_bytes(fmt, cols);
            let mut wk = vec![0u8; w.len() + PAD];
            pack_weight_rows(t, &w, wrb, &mut wk[..w.len()]);
            let (ak, parb) = if packs(t) {
                let parb = packed_act_row_bytes(fmt, cols);
                let mut ap = vec![0xFFu8; kmax * parb + PAD];
                for (s, d) in a.chunks_exact(arb).zip(ap.chunks_exact_mut(parb)) {
                    pack_act_row(fmt, s, d);
                }
                (ap, parb)
            } else {
                (a.clone(), arb)
            };
            for isa in Isa::available().into_iter().filter(|&i| i != Isa::Scalar) {
                let run = |first: usize, ntok: usize| {
                    let ops = Operands {
                        w: &wk,
                        wrb,
                        a: &ak[first * parb..],
                        arb: parb,
                        cols,
                    };
                    let mut got = vec![f32::NAN; ntok * nrows];
                    // SAFETY: `got` has ntok * nrows elements, ostride nrows.
                    unsafe { gemm(isa, t, false, &ops, nrows, ntok, got.as_mut_ptr(), nrows) };
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

/// The wide kernels run in blocks of rows and of tokens (an L2-sized
/// buffer of expanded rows, an L2-sized run of activation rows): a matrix
/// of several row blocks, each ending in a partial row tile, times several
/// token blocks, each ending in a partial token tile, gives the scalar
/// reference's bits everywhere.
#[test]
fn wide_kernels_equal_the_scalar_reference_across_cache_blocks() {
    say_levels("wide_kernels_equal_the_scalar_reference_across_cache_blocks");
    let cols = 2048;
    for t in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::MXFP4,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ] {
        let ws = match t {
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => cols / 256 * WIDE_KW,
            _ => cols / 256 * WIDE_GROUP,
        };
        let arb = wide_act_row_bytes(act_format(t), cols);
        // The block sizes as the kernels round them (TR and TT divide 4).
        let rb = super::body::WIDE_W_BYTES / ws / 4 * 4;
        let tb = super::body::WIDE_A_BYTES / arb / 4 * 4;
        assert!(
            rb >= 8 && tb >= 8,
            "blocks too small to test: {rb} rows, {tb} tokens"
        );
        // Two and a bit row blocks, two and a bit token blocks, odd edges.
        check(t, cols, 2 * rb + 5, 2 * tb + 3, 77);
        if matches!(t, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K) {
            // The interleaved K-quant kernels block whole groups of 8 rows
            // (a multiple of their tile's groups: 2 with VNNI, else 1):
            // two blocks, then three groups (with VNNI a 2-group tile and a
            // 1-group edge), then 5 standard rows.
            let gx = if t != GgmlType::Q6K {
                super::body::WIDE_KX8
            } else {
                super::body::WIDE_Q6X8
            };
            let gb = super::body::WIDE_W_BYTES / (cols / 256 * gx) / 2 * 2;
            assert!(gb >= 4, "group blocks too small to test: {gb} groups");
            check(t, cols, 2 * 8 * gb + 3 * 8 + 5, 2 * tb + 3, 78);
        }
    }
}

/// The largest codes against the largest activations of either sign, so
/// every partial integer sum a kernel keeps in 16 bits is at its bound.
#[test]
fn extreme_codes_and_activations_stay_exact() {
    say_levels("extreme_codes_and_activations_stay_exact");
    for t in QUANT_TYPES {
        let cols = 512;
        // Two interleaved groups (the AVX-512 level holds both in one
        // vector for Q4_K) and a tail row.
        let (nrows, ntok) = (17, 3);
        let fmt = act_format(t);
        let arb = act_row_bytes(fmt, cols);
        let mut rng = Rng(5);
        for code in [0x00u8, 0xFF, 0x77] {
            // Random scales as the other tests make them, every other byte
            // (codes, K-quant sub-block scales) set to `code`.
            let mut w: Vec<u8> = (0..nrows)
                .flat_map(|_| weights(&mut rng, t, cols, 0))
                .collect();
            let keep = test_inputs::f16_fields(t);
            let keep_e = test_inputs::e8m0_fields(t);
            for blk in w.chunks_exact_mut(t.block_bytes()) {
                for (i, b) in blk.iter_mut().enumerate() {
                    if !keep.iter().any(|&at| i == at || i == at + 1) && !keep_e.contains(&i) {
                        *b = code;
                    }
                }
            }
            // Activation rows all +1, all -1 (Q8_K puts the largest
            // magnitude at -128), alternating.
            let mut a = vec![0u8; ntok * arb];
            for (k, row) in a.chunks_exact_mut(arb).enumerate() {
                let x: Vec<f32> = (0..cols)
                    .map(|i| match k {
                        0 => 1.0,
                        1 => -1.0,
                        _ => {
                            if i % 2 == 0 {
                                1.0
                            } else {
                                -1.0
                            }
                        }
                    })
                    .collect();
                quantize_act(fmt, &x, row);
            }
            check_rows(t, cols, nrows, ntok, &w, &a, code as u32);
        }
    }
}

#[test]
fn f32_equals_the_scalar_reference() {
    say_levels("f32_equals_the_scalar_reference");
    for cols in [1, 7, 8, 9, 64, 65, 640] {
        for (nrows, ntok) in [(1, 1), (5, 3), (9, 4)] {
            check(GgmlType::F32, cols, nrows, ntok, cols as u64);
        }
    }
}

#[test]
fn packing_keeps_the_size_and_every_level_is_detected_consistently() {
    assert!(Isa::available().contains(&Isa::Scalar));
    assert!(Isa::best().supported());
    let line = Isa::levels_line();
    println!("{line}");
    for i in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
        // Each level is named once, on the side that matches this CPU.
        let (run, lacks) = line.split_once("; not on this CPU: ").unwrap();
        let listed = |part: &str| part.split(' ').any(|w| w == i.name());
        assert_eq!(listed(run), i.supported(), "{line}");
        assert_eq!(listed(lacks), !i.supported(), "{line}");
    }
    for t in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::MXFP4,
    ] {
        // Packing permutes bytes (bits, for Q5_0's fifth bits): the count of
        // set bits is kept, and the packed row is as long as the original.
        let row: Vec<u8> = (0..t.row_bytes(576).unwrap() as usize)
            .map(|i| (i * 37) as u8)
            .collect();
        let mut out = vec![0u8; row.len()];
        pack_weight_row(t, &row, &mut out);
        let ones = |v: &[u8]| v.iter().map(|b| b.count_ones()).sum::<u32>();
        assert_eq!(ones(&out), ones(&row), "{t}");
    }
}

#[test]
fn interleaving_restores_every_row_and_moves_each_byte() {
    let mut rng = Rng(11);
    for (t, nrows, cols) in [
        (GgmlType::Q4_0, 8, 256),
        (GgmlType::Q4_0, 19, 640),
        (GgmlType::Q4_1, 8, 256),
        (GgmlType::Q4_1, 19, 640),
        (GgmlType::Q5_0, 8, 256),
        (GgmlType::Q5_0, 19, 640),
        (GgmlType::Q4K, 8, 256),
        (GgmlType::Q4K, 13, 512),
        (GgmlType::Q4K, 16, 256),
        (GgmlType::Q4K, 3, 256),
        (GgmlType::Q5K, 8, 256),
        (GgmlType::Q5K, 21, 512),
        (GgmlType::Q6K, 8, 256),
        (GgmlType::Q6K, 21, 512),
    ] {
        let wrb = t.row_bytes(cols).unwrap() as usize;
        let w: Vec<u8> = (0..nrows * wrb).map(|_| rng.next() as u8).collect();
        let mut packed = vec![0u8; w.len()];
        pack_weight_rows(t, &w, wrb, &mut packed);
        if nrows >= 8 && t == GgmlType::Q6K {
            // Q6K_X8: row 5's d (block bytes 208..210) at 10..12, its
            // bytes 4..8 (unit 1) at 16 + 32 + 4 * 5.
            assert_eq!(packed[10..12], w[5 * wrb + 208..5 * wrb + 210]);
            assert_eq!(
                packed[16 + 32 + 20..16 + 32 + 24],
                w[5 * wrb + 4..5 * wrb + 8]
            );
        }
        if nrows >= 8 && t == GgmlType::Q4_0 {
            // Q4_0_X8: row 5's d at bytes 10..12, its code bytes 4..8
            // (block bytes 6..10, unit 1) at 16 + 32 + 4 * 5; block 1 of
            // the group 144 bytes on.
            assert_eq!(packed[10..12], w[5 * wrb..5 * wrb + 2]);
            assert_eq!(
                packed[16 + 32 + 20..16 + 32 + 24],
                w[5 * wrb + 6..5 * wrb + 10]
            );
            assert_eq!(packed[144 + 16..144 + 20], w[20..24]);
        }
        if nrows >= 8 && t == GgmlType::Q4_1 {
            // Q4_1_X8: row 5's d at bytes 10..12, its min (block bytes
            // 2..4) at 16 + 10, its code bytes 4..8 (block bytes 8..12,
            // unit 1) at 32 + 32 + 4 * 5; block 1 of the group 160 bytes
            // on, its row 0's first code bytes (row bytes 24..28) at 32.
            assert_eq!(packed[10..12], w[5 * wrb..5 * wrb + 2]);
            assert_eq!(packed[26..28], w[5 * wrb + 2..5 * wrb + 4]);
            assert_eq!(
                packed[32 + 32 + 20..32 + 32 + 24],
                w[5 * wrb + 8..5 * wrb + 12]
            );
            assert_eq!(packed[160 + 32..160 + 36], w[24..28]);
        }
        if nrows >= 8 && t == GgmlType::Q5_0 {
            // Q5_0_X8: row 5's d at 10..12, its fifth bits at 16 + 20 in
            // the unit-byte order, its code bytes 4..8 (block bytes 10..14,
            // unit 1) at 48 + 32 + 4 * 5.
            assert_eq!(packed[10..12], w[5 * wrb..5 * wrb + 2]);
            let qh = u32::from_le_bytes(w[5 * wrb + 2..5 * wrb + 6].try_into().unwrap());
            let x = u32::from_le_bytes(packed[36..40].try_into().unwrap());
            for u in 0..4 {
                for i in 0..4 {
                    assert_eq!((x >> (8 * u + i)) & 1, (qh >> (4 * u + i)) & 1);
                    assert_eq!((x >> (8 * u + 4 + i)) & 1, (qh >> (16 + 4 * u + i)) & 1);
                }
            }
            assert_eq!(
                packed[48 + 32 + 20..48 + 32 + 24],
                w[5 * wrb + 10..5 * wrb + 14]
            );
        }
        if nrows >= 8 && t == GgmlType::Q4K {
            // The layout itself (Q4K_X8): row 5's d at bytes 10..12, its
            // first scale byte at 32 + 4 * 5, its code bytes 4..8 (code
            // vector (0, 1), unit 4) at 32 + 32 * 4 + 4 * 5.
            assert_eq!(packed[10..12], w[5 * wrb..5 * wrb + 2]);
            assert_eq!(packed[16 + 10], w[5 * wrb + 2]);
            assert_eq!(packed[32 + 20], w[5 * wrb + 4]);
            assert_eq!(
                packed[32 + 128 + 20..32 + 128 + 24],
                w[5 * wrb + 20..5 * wrb + 24]
            );
        }
        if nrows >= 8 && t == GgmlType::Q5K {
            // Q5K_X8: row 5's dmin at 16 + 10, its qh bytes 4..8 (block
            // bytes 20..24, unit 4) at 32 + 32 * 4 + 4 * 5, its first code
            // bytes (block bytes 48..52, unit 11) at 32 + 32 * 11 + 4 * 5;
            // the next super-block's group 8 * 176 bytes on.
            assert_eq!(packed[26..28], w[5 * wrb + 2..5 * wrb + 4]);
            assert_eq!(
                packed[32 + 128 + 20..32 + 128 + 24],
                w[5 * wrb + 20..5 * wrb + 24]
            );
            assert_eq!(
                packed[32 + 352 + 20..32 + 352 + 24],
                w[5 * wrb + 48..5 * wrb + 52]
            );
            if cols >= 512 {
                assert_eq!(packed[Q5K_X8..Q5K_X8 + 2], w[176..178]);
            }
        }
        let mut back = vec![0u8; wrb];
        for r in 0..nrows {
            unpack_row(t, &packed, nrows, wrb, r, &mut back);
            assert_eq!(
                back,
                w[r * wrb..(r + 1) * wrb],
                "rows {nrows} cols {cols}: row {r}"
            );
        }
        assert_eq!(unpack_weight_rows(t, &packed, nrows, wrb), w);
    }
}

#[test]
fn unpacking_restores_every_row() {
    let mut rng = Rng(7);
    for t in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::MXFP4,
    ] {
        for cols in [32, 96, 256, 576, 640, 2048 + 96] {
            let row: Vec<u8> = (0..t.row_bytes(cols).unwrap() as usize)
                .map(|_| rng.next() as u8)
                .collect();
            let mut packed = vec![0u8; row.len()];
            pack_weight_row(t, &row, &mut packed);
            let mut back = vec![0u8; row.len()];
            unpack_weight_row(t, &packed, &mut back);
            assert_eq!(back, row, "{t} cols {cols}");
        }
    }
}
