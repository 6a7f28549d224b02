//! x86 SIMD kernels, chosen at run time, and the weight/activation layouts they read.
//!
//! Two levels beside the scalar reference: `avx2` (AVX2 + FMA + F16C) and
//! `avx512` (adds AVX-512 F/BW/VL/VNNI; the kernels still use 256-bit
//! vectors, but with `vpdpbusd`/`vpdpwssd` and 32 registers for larger tiles).
//! Both levels' kernels are written once, as macros (`simd_kernels!` in
//! `body.rs` and one per family: `shared.rs`, `one_token.rs`, `k_quants.rs`,
//! `rows.rs`, `wide.rs`, `wide_k.rs`), instantiated per level over that level's
//! primitives (`dp`, `dp16`, `q8_*`, `expand_bits`).
//!
//! # Exactness
//!
//! Every kernel computes exactly what [`crate::quant::scalar`] computes: the
//! integer sums are exact (any order gives the same i32), and the float
//! operations are the same IEEE operations in the same order, unfused. For
//! blocks of 32, a 256-bit vector holds eight blocks' integer sums, one per
//! 32-bit lane, and the float terms are added lane-wise: block b into lane
//! b % 8, as the scalar reference does. So SIMD results equal the scalar
//! reference bit for bit on every input, which the tests check.
//!
//! # Packed layout (blocks of 32)
//!
//! To get one block per lane without a horizontal reduction, Q4_0, Q4_1, Q5_0,
//! Q8_0 and MXFP4 weight rows are repacked at load in groups of n = 8 blocks (the
//! last group of a row has n = nb % 8 when that is not 0); a group is as many
//! bytes as the blocks it replaces, so a packed matrix is as big as the
//! original (plus [`PAD`] bytes). In a group, code vector k (4n bytes at
//! codes + 4n * k) holds in its lane l elements 4k..4k+4 of block l:
//!
//! | type | group layout (bytes) |
//! |---|---|
//! | Q4_0 | d\[n\] f16, qs: vector k' (0..4) = bytes 4k'..4k'+4 of each block's qs; low nibbles are code vector k', high nibbles vector k'+4 |
//! | Q4_1 | d\[n\], m\[n\], qs as Q4_0 |
//! | Q5_0 | d\[n\], fifth bits (4n bytes): bit 4n*k + 4l + i = bit 4k+i of block l's qh, qs as Q4_0 |
//! | Q8_0 | d\[n\], qs: vector k = bytes 4k..4k+4 of each block's codes |
//! | MXFP4 | e\[n\] (E8M0 bytes), qs as Q4_0 |
//!
//! Kernels load whole 32-byte vectors; in a partial group the lanes past n
//! read the next bytes (or the padding) and their float terms are masked to
//! +0.0 before they are added (a lane is never -0.0, so it is unchanged).
//! A partial group of 2 or 4 blocks (rows of 576 or 640 elements end in one)
//! is instead read 32 bytes at a time, 8/n short code vectors per load, and
//! the integer lanes of the same block are added before the float terms.
//!
//! Activations for those kernels are quantized as usual (Q8_0/Q8_1) and then
//! rearranged per row the same way: per group, d\[n\] as f32, then s\[n\] as f32
//! for Q8_1 or, for Q8_0, each block's code sum as i32 (so a kernel need not
//! sum the codes for Q4_0's and Q5_0's offsets once per row), then the code
//! vectors.
//!
//! # Interleaved layout (Q4_0, Q4_1, Q5_0, K-quants)
//!
//! Q4_0, Q4_1, Q5_0, Q4_K, Q5_K and Q6_K matrices are repacked by groups of 8 rows
//! ([`Q4_0_X8`], [`Q4_1_X8`], [`Q5_0_X8`], [`Q4K_X8`], [`Q5K_X8`], [`Q6K_X8`]): per block (super-block), each
//! row's block cut in 4-byte units, unit u of the 8 rows side by side, so a
//! 256-bit vector holds one row per 32-bit lane. A row's integer sums then stay in its lane (no horizontal
//! reduction), each activation word is broadcast to all lanes, and the
//! scales apply lane-wise; the float formula runs per lane in the scalar
//! reference's order. One token (decode) streams each group once; the wide
//! prefill kernels of Q4_K / Q5_K / Q6_K expand each group once per call into
//! unsigned codes and decoded scales, still one row per lane, and run tiles
//! of 1 or 2 groups times several tokens over them; those of Q4_0 / Q5_0
//! gather a row's blocks back into standard blocks as they expand them. Rows
//! past a matrix's last whole group stay standard (Q4_0, Q4_1, Q5_0: packed per row
//! as above) and run the standard-layout kernels (the wide K-quant ones
//! gather them into the [`WIDE_KW`] layout).
//!
//! For Q4_0, Q4_1 and Q5_0 the blocks of 32 keep the per-row kernels' float order: a
//! row's block b adds into its accumulator b % 8, so the one-token kernel
//! keeps eight float vectors (lane = row), block b into vector b % 8, and
//! transposes them at the end into each row's eight lanes for `reduce8`.

use onebit_formats::GgmlType;

use super::ActFormat;

#[macro_use]
mod body;
#[macro_use]
mod shared;
#[macro_use]
mod one_token;
#[macro_use]
mod k_quants;
#[macro_use]
mod rows;
#[macro_use]
mod wide;
#[macro_use]
mod wide_k;
pub mod avx2;
pub mod avx512;

/// The instruction-set levels, shared with the other architectures.
pub use super::isa::Isa;

/// Whether `t` rows are repacked for the SIMD kernels.
pub fn packs(t: GgmlType) -> bool {
    matches!(
        t,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::MXFP4
    )
}

/// Bytes every packed buffer (weights, activations) carries past its last
/// row: kernels load whole 32-byte vectors from partial groups.
pub const PAD: usize = 64;

/// Offsets in a packed weight group of `n` blocks: (mins or fifth bits, codes).
/// Code vector k starts at codes + 4n * k.
const fn wgroup(t: GgmlType, n: usize) -> (usize, usize) {
    match t {
        GgmlType::Q4_0 => (2 * n, 2 * n),
        GgmlType::Q4_1 => (2 * n, 4 * n),
        GgmlType::Q5_0 => (2 * n, 6 * n),
        GgmlType::MXFP4 => (n, n),
        _ => (2 * n, 2 * n), // Q8_0
    }
}

/// Repacks one weight row (standard blocks, `out` the same length).
pub fn pack_weight_row(t: GgmlType, row: &[u8], out: &mut [u8]) {
    assert!(packs(t), "{t} rows are not repacked");
    assert_eq!(row.len(), out.len());
    for_each_block(t, row.len(), |at, n, l| {
        let blk = &row[at.block..at.block + t.block_bytes()];
        for (b, g, len) in block_runs(t, n, l) {
            out[at.group + g..at.group + g + len].copy_from_slice(&blk[b..b + len]);
        }
        if t == GgmlType::Q5_0 {
            // Bit 4n*k + 4l + i of the fifth-bit area = bit 4k + i of qh.
            let qh = u32::from_le_bytes(blk[2..6].try_into().unwrap());
            for j in 0..32 {
                let (byte, bit) = fifth_bit(n, l, j);
                let o = &mut out[at.group + 2 * n + byte];
                *o = (*o & !(1 << bit)) | ((((qh >> j) & 1) as u8) << bit);
            }
        }
    });
}

/// Whether `t` matrices are interleaved by groups of [`ROW_GROUP`] rows for
/// the SIMD kernels (Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K; see [`Q4_0_X8`],
/// [`Q4_1_X8`], [`Q5_0_X8`], [`Q4K_X8`], [`Q5K_X8`], [`Q6K_X8`]). Q4_0, Q4_1
/// and Q5_0 also [`packs`]: their rows past the last whole group are packed
/// per row.
pub fn interleaves(t: GgmlType) -> bool {
    matches!(
        t,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
    )
}

/// Bytes of one interleaved Q4_0 block group: eight rows' 18-byte blocks,
/// d\[8\] as f16 at 0 (row r at 2r), then unit u (0..4) of row r at
/// 16 + 32u + 4r, where unit u is the code bytes 4u..4u + 4 (block bytes
/// 2 + 4u..6 + 4u): their low nibbles are elements 4u.., their high nibbles
/// elements 16 + 4u... A matrix's block b of rows 8g..8g + 8 is at
/// 8g * row bytes + b * Q4_0_X8.
pub const Q4_0_X8: usize = 8 * 18;

/// Bytes of one interleaved Q4_1 block group: eight rows' 20-byte blocks,
/// d\[8\] as f16 at 0 (row r at 2r), the mins m\[8\] as f16 at 16 (row r at
/// 16 + 2r), then unit u (0..4) of row r at 32 + 32u + 4r, the code bytes
/// 4u..4u + 4 (block bytes 4 + 4u..8 + 4u), low nibbles elements 4u..,
/// high nibbles 16 + 4u... The byte places are [`Q4K_X8`]'s (d, dmin,
/// then 4-byte units), so the two share `q4k_x8_at`.
pub const Q4_1_X8: usize = 8 * 20;

/// Bytes of one interleaved Q5_0 block group: eight rows' 22-byte blocks,
/// d\[8\] as f16 at 0 (row r at 2r), row r's fifth bits at 16 + 4r as four
/// bytes, byte u holding in bits 0..4 the fifth bits of elements
/// 4u..4u + 4 (qh bits 4u..) and in bits 4..8 those of elements
/// 16 + 4u..16 + 4u + 4 (qh bits 16 + 4u..), see [`q5_qh_x8`]; then unit u
/// (0..4) of row r at 48 + 32u + 4r, the code bytes 4u..4u + 4 (block bytes
/// 6 + 4u..10 + 4u), low nibbles elements 4u.., high nibbles 16 + 4u...
pub const Q5_0_X8: usize = 8 * 22;

/// A Q5_0 block's qh (bit j = fifth bit of element j) as the interleaved
/// layout stores it: bit 8u + i = qh bit 4u + i, bit 8u + 4 + i = qh bit
/// 16 + 4u + i (u, i < 4), so one byte holds the fifth bits of one code
/// unit's low and high nibbles.
pub fn q5_qh_x8(qh: u32) -> u32 {
    let mut out = 0;
    for u in 0..4 {
        for i in 0..4 {
            out |= ((qh >> (4 * u + i)) & 1) << (8 * u + i);
            out |= ((qh >> (16 + 4 * u + i)) & 1) << (8 * u + 4 + i);
        }
    }
    out
}

/// The inverse of [`q5_qh_x8`].
pub fn q5_qh_std(x: u32) -> u32 {
    let mut qh = 0;
    for u in 0..4 {
        for i in 0..4 {
            qh |= ((x >> (8 * u + i)) & 1) << (4 * u + i);
            qh |= ((x >> (8 * u + 4 + i)) & 1) << (16 + 4 * u + i);
        }
    }
    qh
}

/// Rows per interleaved group: one row per 32-bit lane of a 256-bit vector.
pub const ROW_GROUP: usize = 8;

/// Bytes of one interleaved Q4_K super-block group: eight rows' 144-byte
/// super-blocks `s`, rearranged so that every 32-bit lane of a vector holds
/// one row. d\[8\] as f16 at 0, dmin\[8\] at 16, then 4-byte units: unit u
/// (u < 35) of row r at 32 + 32u + 4r, where unit u is bytes 4 + 4u..8 + 4u
/// of row r's block (units 0..3: the 12 packed scale bytes; units 3..35:
/// the 128 code bytes, so code vector (c, k) = unit 3 + 8c + k holds bytes
/// 32c + 4k..32c + 4k + 4 of each row's codes: their low nibbles are
/// elements 64c + 4k.., their high nibbles elements 64c + 32 + 4k..).
/// A matrix's rows past its last whole group of 8 stay standard, so an
/// interleaved matrix is as big as the original and row r's bytes stay in
/// the span of rows 8 * (r / 8)..8 * (r / 8) + 8.
pub const Q4K_X8: usize = 8 * 144;

/// Bytes of one interleaved Q5_K super-block group: [`Q4K_X8`]'s layout
/// over the 176-byte block, whose 32 fifth-bit bytes (qh) come before the
/// codes: d\[8\] at 0, dmin\[8\] at 16, unit u (u < 43) of row r at 32 + 32u +
/// 4r, unit u being bytes 4 + 4u..8 + 4u of row r's block (units 0..3 the
/// scales, 3..11 qh, so unit 3 + k holds qh bytes 4k..4k + 4, whose bit s
/// is the fifth bit of sub-block s's elements 4k..4k + 4; units 11..43 the
/// codes, code vector (c, k) = unit 11 + 8c + k as Q4_K's).
pub const Q5K_X8: usize = 8 * 176;

/// Bytes of one interleaved Q6_K super-block group: d\[8\] as f16 at 0, then
/// unit u (u < 52) of row r at 16 + 32u + 4r, where unit u is bytes
/// 4u..4u + 4 of row r's 210-byte block: units 0..32 the low-bit bytes
/// (ql), 32..48 the high-bit bytes (qh), 48..52 the 16 scales. As for
/// [`Q4K_X8`], rows past the last whole group stay standard.
pub const Q6K_X8: usize = 8 * 210;

/// Where byte `b` of row `r`'s Q4_K, Q5_K (or Q4_1) block lands in an
/// interleaved group.
fn q4k_x8_at(b: usize, r: usize) -> usize {
    match b {
        0..=1 => 2 * r + b,
        2..=3 => 16 + 2 * r + (b - 2),
        _ => 32 + 32 * ((b - 4) / 4) + 4 * r + (b - 4) % 4,
    }
}

/// (group bytes, offset of code unit 0) of the interleaved blocks of 32
/// the kernels' `K` names: Q4_0 (0), Q4_1 (1), Q5_0 (2).
const fn x8_group(k: u8) -> (usize, usize) {
    match k {
        0 => (Q4_0_X8, 16),
        1 => (Q4_1_X8, 32),
        _ => (Q5_0_X8, 48),
    }
}

/// The type of the interleaved blocks of 32 the kernels' `K` names (as
/// [`x8_group`]).
const fn x8_type(k: u8) -> GgmlType {
    match k {
        0 => GgmlType::Q4_0,
        1 => GgmlType::Q4_1,
        _ => GgmlType::Q5_0,
    }
}

/// Where byte `b` of row `r`'s Q4_0 block lands in an interleaved group.
fn q4_0_x8_at(b: usize, r: usize) -> usize {
    match b {
        0..=1 => 2 * r + b,
        _ => 16 + 32 * ((b - 2) / 4) + 4 * r + (b - 2) % 4,
    }
}

/// Where byte `b` of row `r`'s Q5_0 block lands in an interleaved group
/// (its qh bytes 2..6 land whole at 16 + 4r and are then permuted by
/// [`q5_qh_x8`]).
fn q5_0_x8_at(b: usize, r: usize) -> usize {
    match b {
        0..=1 => 2 * r + b,
        2..=5 => 16 + 4 * r + (b - 2),
        _ => 48 + 32 * ((b - 6) / 4) + 4 * r + (b - 6) % 4,
    }
}

/// Where byte `b` of row `r`'s Q6_K block lands in an interleaved group.
fn q6k_x8_at(b: usize, r: usize) -> usize {
    match b {
        208..=209 => 2 * r + (b - 208),
        _ => 16 + 32 * (b / 4) + 4 * r + b % 4,
    }
}

/// Where byte `b` of row `r`'s block lands in its interleaved group.
type X8At = fn(usize, usize) -> usize;

/// The runs (start, length) of a block of `t` that move together in its
/// interleaved group, and where run `b` of row `r` goes.
fn x8_runs(t: GgmlType) -> (Vec<(usize, usize)>, X8At) {
    if t == GgmlType::Q4_0 {
        let runs = [(0, 2)]
            .into_iter()
            .chain((2..18).step_by(4).map(|b| (b, 4)))
            .collect();
        (runs, q4_0_x8_at)
    } else if t == GgmlType::Q5_0 {
        let runs = [(0, 2)]
            .into_iter()
            .chain((2..22).step_by(4).map(|b| (b, 4)))
            .collect();
        (runs, q5_0_x8_at)
    } else if t == GgmlType::Q4K || t == GgmlType::Q5K || t == GgmlType::Q4_1 {
        let runs = [(0, 2), (2, 2)]
            .into_iter()
            .chain((4..t.block_bytes()).step_by(4).map(|b| (b, 4)))
            .collect();
        (runs, q4k_x8_at)
    } else {
        let runs = (0..208)
            .step_by(4)
            .map(|b| (b, 4))
            .chain([(208, 2)])
            .collect();
        (runs, q6k_x8_at)
    }
}

/// Repacks consecutive whole rows of `t` (`wrb` bytes each; the first is
/// a multiple of [`ROW_GROUP`] in its matrix when `t` [`interleaves`], and
/// the rows past the last whole group are the matrix's last rows) into the
/// SIMD kernels' layout; `out` is as long as `rows`.
pub fn pack_weight_rows(t: GgmlType, rows: &[u8], wrb: usize, out: &mut [u8]) {
    assert_eq!(rows.len(), out.len());
    assert_eq!(rows.len() % wrb, 0);
    if packs(t) && !interleaves(t) {
        for (s, o) in rows.chunks_exact(wrb).zip(out.chunks_exact_mut(wrb)) {
            pack_weight_row(t, s, o);
        }
        return;
    }
    assert!(interleaves(t), "{t} rows are not repacked");
    let gb = ROW_GROUP * wrb;
    let whole = rows.len() / gb * gb;
    let bb = t.block_bytes();
    let (runs, at) = x8_runs(t);
    for (g, o) in rows[..whole].chunks_exact(gb).zip(out.chunks_exact_mut(gb)) {
        for r in 0..ROW_GROUP {
            let row = &g[r * wrb..(r + 1) * wrb];
            for (s, blk) in row.chunks_exact(bb).enumerate() {
                let grp = &mut o[s * 8 * bb..(s + 1) * 8 * bb];
                for &(b, n) in &runs {
                    let to = at(b, r);
                    grp[to..to + n].copy_from_slice(&blk[b..b + n]);
                }
                if t == GgmlType::Q5_0 {
                    let q = &mut grp[16 + 4 * r..20 + 4 * r];
                    let x = q5_qh_x8(u32::from_le_bytes(q[..].try_into().unwrap()));
                    q.copy_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
    if packs(t) {
        for (s, o) in rows[whole..]
            .chunks_exact(wrb)
            .zip(out[whole..].chunks_exact_mut(wrb))
        {
            pack_weight_row(t, s, o);
        }
    } else {
        out[whole..].copy_from_slice(&rows[whole..]);
    }
}

/// Undoes [`pack_weight_rows`] for row `r` of a repacked matrix of `nrows`
/// rows of `wrb` bytes (`packed` from its first row on).
pub fn unpack_row(t: GgmlType, packed: &[u8], nrows: usize, wrb: usize, r: usize, out: &mut [u8]) {
    assert_eq!(out.len(), wrb);
    let g0 = r / ROW_GROUP * ROW_GROUP;
    if packs(t) && (!interleaves(t) || g0 + ROW_GROUP > nrows) {
        unpack_weight_row(t, &packed[r * wrb..(r + 1) * wrb], out);
        return;
    }
    assert!(interleaves(t), "{t} rows are not repacked");
    if g0 + ROW_GROUP > nrows {
        out.copy_from_slice(&packed[r * wrb..(r + 1) * wrb]);
        return;
    }
    let grp = &packed[g0 * wrb..(g0 + ROW_GROUP) * wrb];
    let bb = t.block_bytes();
    let (runs, at) = x8_runs(t);
    for (s, blk) in out.chunks_exact_mut(bb).enumerate() {
        let src = &grp[s * 8 * bb..(s + 1) * 8 * bb];
        for &(b, n) in &runs {
            let from = at(b, r % ROW_GROUP);
            blk[b..b + n].copy_from_slice(&src[from..from + n]);
        }
        if t == GgmlType::Q5_0 {
            let qh = q5_qh_std(u32::from_le_bytes(blk[2..6].try_into().unwrap()));
            blk[2..6].copy_from_slice(&qh.to_le_bytes());
        }
    }
}

/// The standard rows of `nrows` consecutive repacked rows (the first a
/// multiple of [`ROW_GROUP`] in its matrix, the rows past the last whole
/// group the matrix's last), for kernels that read standard rows.
pub fn unpack_weight_rows(t: GgmlType, packed: &[u8], nrows: usize, wrb: usize) -> Vec<u8> {
    let mut out = vec![0u8; nrows * wrb];
    for (r, o) in out.chunks_exact_mut(wrb).enumerate() {
        unpack_row(t, packed, nrows, wrb, r, o);
    }
    out
}

/// Where block `l` of a packed group sits: the group's start in the row
/// (`group`) and the block's start in the standard row (`block`).
struct BlockAt {
    group: usize,
    block: usize,
}

/// Calls `f(at, n, l)` for every block of a row of `len` bytes of type `t`:
/// block l of a group of n (the last group of a row may be partial).
fn for_each_block(t: GgmlType, len: usize, mut f: impl FnMut(BlockAt, usize, usize)) {
    let bb = t.block_bytes();
    let nb = len / bb;
    for g in 0..nb.div_ceil(8) {
        let n = (nb - 8 * g).min(8);
        for l in 0..n {
            let at = BlockAt {
                group: g * 8 * bb,
                block: (g * 8 + l) * bb,
            };
            f(at, n, l);
        }
    }
}

/// The byte runs the packed layout moves for block `l` of a group of `n`:
/// (offset in the block, offset in the group, length). Q5_0's fifth bits
/// move bit by bit ([`fifth_bit`]).
fn block_runs(t: GgmlType, n: usize, l: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let (mo, qo) = wgroup(t, n);
    let (qs_at, nvec) = match t {
        GgmlType::Q4_0 => (2, 4),
        GgmlType::Q4_1 => (4, 4),
        GgmlType::Q5_0 => (6, 4),
        GgmlType::MXFP4 => (1, 4),
        _ => (2, 8),
    };
    let min = (t == GgmlType::Q4_1).then_some((2, mo + 2 * l, 2));
    // The scale: d (f16), or MXFP4's exponent byte.
    let scale = if t == GgmlType::MXFP4 {
        (0, l, 1)
    } else {
        (0, 2 * l, 2)
    };
    std::iter::once(scale)
        .chain(min)
        .chain((0..nvec).map(move |k| (qs_at + 4 * k, qo + 4 * n * k + 4 * l, 4)))
}

/// (byte, bit) in a packed Q5_0 group's fifth-bit area of bit `j` of block
/// `l`'s qh: bit 4n*k + 4l + i for j = 4k + i.
fn fifth_bit(n: usize, l: usize, j: usize) -> (usize, usize) {
    let at = 4 * n * (j / 4) + 4 * l + j % 4;
    (at / 8, at % 8)
}

/// Undoes [`pack_weight_row`]: the standard blocks of one packed row.
pub fn unpack_weight_row(t: GgmlType, packed: &[u8], out: &mut [u8]) {
    assert!(packs(t), "{t} rows are not repacked");
    assert_eq!(packed.len(), out.len());
    for_each_block(t, packed.len(), |at, n, l| {
        let blk = &mut out[at.block..at.block + t.block_bytes()];
        for (b, g, len) in block_runs(t, n, l) {
            blk[b..b + len].copy_from_slice(&packed[at.group + g..at.group + g + len]);
        }
        if t == GgmlType::Q5_0 {
            let mut qh = 0u32;
            for j in 0..32 {
                let (byte, bit) = fifth_bit(n, l, j);
                qh |= (((packed[at.group + 2 * n + byte] >> bit) & 1) as u32) << j;
            }
            blk[2..6].copy_from_slice(&qh.to_le_bytes());
        }
    });
}

/// Bytes one block takes in a packed activation row: d as f32, s as f32
/// (Q8_1) or the code sum as i32 (Q8_0), codes.
const fn act_block(_fmt: ActFormat) -> usize {
    40
}

/// Bytes of one packed activation row of `n` elements (Q8_0 or Q8_1).
pub fn packed_act_row_bytes(fmt: ActFormat, n: usize) -> usize {
    n / 32 * act_block(fmt)
}

/// Rearranges one standard Q8_0/Q8_1 activation row into the packed layout:
/// per group of n <= 8 blocks, d\[n\] as f32, then s\[n\] as f32 (Q8_1) or each
/// block's code sum as i32 (Q8_0), then code vector k (k = 0..8) at
/// 8n + 4n * k holding bytes 4k..4k+4 of each block's codes.
pub fn pack_act_row(fmt: ActFormat, row: &[u8], out: &mut [u8]) {
    let bb = fmt.block_bytes();
    let nb = row.len() / bb;
    let pb = act_block(fmt);
    assert_eq!(out.len(), nb * pb);
    let qs = if fmt == ActFormat::Q8_1 { 4 } else { 2 };
    for g in 0..nb.div_ceil(8) {
        let n = (nb - 8 * g).min(8);
        let src = &row[g * 8 * bb..(g * 8 + n) * bb];
        let dst = &mut out[g * 8 * pb..(g * 8 + n) * pb];
        let codes = 8 * n;
        for l in 0..n {
            let b = &src[l * bb..(l + 1) * bb];
            let d = onebit_formats::blocks::f16_at(b, 0);
            dst[4 * l..4 * l + 4].copy_from_slice(&d.to_le_bytes());
            let second = if fmt == ActFormat::Q8_1 {
                onebit_formats::blocks::f16_at(b, 2).to_le_bytes()
            } else {
                let sum: i32 = b[qs..qs + 32].iter().map(|&c| c as i8 as i32).sum();
                sum.to_le_bytes()
            };
            dst[4 * n + 4 * l..4 * n + 4 * l + 4].copy_from_slice(&second);
            for k in 0..8 {
                let at = codes + 4 * n * k + 4 * l;
                dst[at..at + 4].copy_from_slice(&b[qs + 4 * k..qs + 4 * k + 4]);
            }
        }
    }
}

/// Operands of one kernel call: `nrows` weight rows of `wrb` bytes (packed
/// when [`packs`] says so) and `ntok` activation rows of `arb` bytes (packed
/// likewise), rows of `cols` elements. For packed types both slices extend
/// [`PAD`] bytes past their last row.
#[derive(Clone, Copy)]
pub struct Operands<'a> {
    pub w: &'a [u8],
    pub wrb: usize,
    pub a: &'a [u8],
    pub arb: usize,
    pub cols: usize,
}

/// Computes `out[t * ostride + r] = w[r] · a[t]` for r < nrows, t < ntok.
///
/// # Safety
/// The CPU supports the level the function was taken from; `w` holds
/// `nrows * wrb` bytes and `a` holds `ntok * arb` (checked by [`gemm`]);
/// `out` is valid for writes at every `t * ostride + r` and nothing else reads
/// or writes those elements during the call.
pub type GemmFn = unsafe fn(&Operands, usize, usize, *mut f32, usize);

/// The kernel for weight type `t` at level `isa`, if there is one.
pub fn gemm_fn(isa: Isa, t: GgmlType) -> Option<GemmFn> {
    match isa {
        Isa::Scalar => None,
        Isa::Avx2 => avx2::gemm_fn(t),
        Isa::Avx512 => avx512::gemm_fn(t),
    }
}

/// Checked entry to a kernel: [`wide_fn`]`(isa, t)` when `wide` (activation
/// rows in the wide layout, `ops.arb` = [`wide_act_row_bytes`]), else
/// [`gemm_fn`]`(isa, t)` (packed or standard activation rows).
///
/// # Safety
/// `out` is valid for writes at every `t * ostride + r` (r < nrows, t < ntok)
/// and no other thread accesses those elements during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(
    isa: Isa,
    t: GgmlType,
    wide: bool,
    ops: &Operands,
    nrows: usize,
    ntok: usize,
    out: *mut f32,
    ostride: usize,
) {
    let f = if wide {
        wide_fn(isa, t)
    } else {
        gemm_fn(isa, t)
    };
    let f = f.expect("no SIMD kernel for this type and shape at this level");
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    let pad = if packs(t) { PAD } else { 0 };
    let apad = if wide { 0 } else { pad };
    assert!(ops.w.len() >= nrows * ops.wrb + pad && ops.a.len() >= ntok * ops.arb + apad);
    assert_eq!(Some(ops.wrb as u64), t.row_bytes(ops.cols as u64));
    if wide {
        assert_eq!(ops.arb, wide_act_row_bytes(super::act_format(t), ops.cols));
    }
    // SAFETY: the level is supported (checked above), the operand lengths are
    // checked above, and the caller vouches for `out`.
    unsafe { f(ops, nrows, ntok, out, ostride) }
}

/// Bytes of one group of 8 blocks (256 elements) in the wide layouts that
/// the prefill kernels ([`wide_fn`]) read, for weights and activations alike:
/// d\[8\] as f32 at 0, a second \[8\] at 32 (weights: Q4_1's mins as f32;
/// Q8_0-format activations: each block's code sum as i32; Q8_1: s as f32),
/// then code vector k (k = 0..8) at 64 + 32k holding in lane l elements
/// 4k..4k+4 of block l. A row's last group is padded to 8 blocks with
/// zeros, so every load is a whole vector and padded lanes add +0.0.
///
/// A row's last group of 2 or 4 blocks keeps its code vectors compact, as
/// the packed rows do: code vector k at 64 + 4n·k, lane l of it at + 4l
/// ([`wide_code_stride`]), so the kernels read n vectors instead of 8 and
/// fold the lanes (a 576-column row, 18 blocks, is 2.25 groups: 18 vectors
/// a row instead of 24).
///
/// Weight codes are unsigned (Q4: 0..15, Q5: 0..31, Q8_0: w + 128), so one
/// `u8 x i8` dot product per code vector serves every type; the offset is
/// taken off by starting each integer sum at -offset * sum(y). Weight rows
/// are expanded from the packed layout a row tile at a time inside the
/// kernel (once per call, into a few KiB reused by every token tile), so the
/// expansion costs nothing in memory and is amortized over the tokens.
pub const WIDE_GROUP: usize = 320;

/// Bytes between code vectors k and k + 1 of a wide group of `n` blocks:
/// 4n for a partial group of 2 or 4 blocks (compact, so the kernels fold
/// lanes), else 32 (lanes past `n` zero).
pub fn wide_code_stride(n: usize) -> usize {
    if n == 2 || n == 4 {
        4 * n
    } else {
        32
    }
}

/// Bytes of one expanded Q4_K/Q5_K/Q6_K super-block in the wide K-quant
/// kernels: the 256 codes as 8 code vectors (lane l of vector k = elements
/// 4k..4k+4 of the l-th run of 32; unsigned, Q4_K 0..15, Q5_K 0..31, Q6_K
/// 0..63) at 0; i32 scales per lane at 256 (Q6_K: the runs' first halves;
/// their second halves at 288); at 320 sixteen i16 that multiply the
/// activations' 16-element sums (Q4_K, Q5_K: each run's min, twice; Q6_K:
/// 32 x each sub-block's scale); d at 352 and the dmin at 356 as f32.
pub const WIDE_KW: usize = 384;

/// Bytes of one Q8_K activation block in the wide layout: codes as in
/// [`WIDE_KW`] at 0, the sixteen i16 sums at 256, d (f32) at 288.
pub const WIDE_KA: usize = 320;

/// Bytes of one wide activation row of `n` elements.
pub fn wide_act_row_bytes(fmt: ActFormat, n: usize) -> usize {
    match fmt {
        ActFormat::Q8K => n / 256 * WIDE_KA,
        _ => (n / 32).div_ceil(8) * WIDE_GROUP,
    }
}

/// Rearranges one standard Q8_0/Q8_1 activation row into the wide layout
/// ([`WIDE_GROUP`]); `out` must be zero where the row has no blocks.
pub fn pack_act_row_wide(fmt: ActFormat, row: &[u8], out: &mut [u8]) {
    let bb = fmt.block_bytes();
    let nb = row.len() / bb;
    assert_eq!(out.len(), wide_act_row_bytes(fmt, nb * fmt.block_len()));
    if fmt == ActFormat::Q8K {
        for (src, dst) in row.chunks_exact(bb).zip(out.chunks_exact_mut(WIDE_KA)) {
            for c in 0..8 {
                for k in 0..8 {
                    let from = 4 + 32 * c + 4 * k;
                    dst[32 * k + 4 * c..32 * k + 4 * c + 4].copy_from_slice(&src[from..from + 4]);
                }
            }
            dst[256..288].copy_from_slice(&src[260..292]);
            dst[288..292].copy_from_slice(&src[0..4]);
        }
        return;
    }
    let qs = if fmt == ActFormat::Q8_1 { 4 } else { 2 };
    for (b, src) in row.chunks_exact(bb).enumerate() {
        let (g, l) = (b / 8, b % 8);
        let cv = wide_code_stride((nb - 8 * g).min(8));
        let dst = &mut out[g * WIDE_GROUP..(g + 1) * WIDE_GROUP];
        let d = onebit_formats::blocks::f16_at(src, 0);
        dst[4 * l..4 * l + 4].copy_from_slice(&d.to_le_bytes());
        let second = if fmt == ActFormat::Q8_1 {
            onebit_formats::blocks::f16_at(src, 2).to_le_bytes()
        } else {
            let sum: i32 = src[qs..qs + 32].iter().map(|&c| c as i8 as i32).sum();
            sum.to_le_bytes()
        };
        dst[32 + 4 * l..36 + 4 * l].copy_from_slice(&second);
        for k in 0..8 {
            let at = 64 + cv * k + 4 * l;
            dst[at..at + 4].copy_from_slice(&src[qs + 4 * k..qs + 4 * k + 4]);
        }
    }
}

/// The wide (several-token) kernel for weight type `t` at level `isa`, if
/// there is one. It reads packed weight rows (K-quants: standard rows) and
/// wide activation rows.
pub fn wide_fn(isa: Isa, t: GgmlType) -> Option<GemmFn> {
    match isa {
        Isa::Scalar => None,
        Isa::Avx2 => avx2::wide_fn(t),
        Isa::Avx512 => avx512::wide_fn(t),
    }
}

#[cfg(test)]
mod tests;
