//! Test inputs and checks shared by the SIMD-vs-scalar tests of every
//! architecture (`x86/tests.rs`, `arm/tests.rs`): a seeded generator, weight
//! rows with random codes and ordinary, zero or extreme scales, activation
//! rows, the scalar reference's results, and bit-for-bit equality of results
//! (one shape, and the few-row shapes against each token alone).

use onebit_formats::GgmlType;

use super::{act_format, act_row_bytes, dot, quantize_act};

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub(crate) fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.unit()).sum::<f32>() - 2.0
    }
}

/// f16 scale offsets per block for the types under test (K-quants: d, dmin).
pub(crate) fn f16_fields(t: GgmlType) -> &'static [usize] {
    match t {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[],
    }
}

/// E8M0 exponent-byte offsets per block (MXFP4's shared scale).
pub(crate) fn e8m0_fields(t: GgmlType) -> &'static [usize] {
    match t {
        GgmlType::MXFP4 => &[0],
        _ => &[],
    }
}

/// A row with random codes and scales; `mode` 0: scales in +-[1e-3, 1],
/// 1: some scales zero, 2: extreme scales (f16 max, subnormal, -0).
pub(crate) fn weights(rng: &mut Rng, t: GgmlType, n: usize, mode: u32) -> Vec<u8> {
    if t == GgmlType::F32 {
        return (0..n)
            .flat_map(|_| (rng.normal() * if mode == 2 { 1e30 } else { 1.0 }).to_le_bytes())
            .collect();
    }
    let bb = t.block_bytes();
    let mut row: Vec<u8> = (0..n / t.block_len() * bb)
        .map(|_| rng.next() as u8)
        .collect();
    for b in row.chunks_exact_mut(bb) {
        for &at in f16_fields(t) {
            let v = match (mode, rng.next() % 4) {
                (1, 0) => 0.0,
                (2, 0) => 65504.0,
                (2, 1) => 6e-8,
                (2, 2) => -0.0,
                _ => (rng.unit() * 0.999 + 1e-3) * if rng.next() & 1 == 0 { 1.0 } else { -1.0 },
            };
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        for &at in e8m0_fields(t) {
            // 2^(e - 127): around 1 (118..=129), the smallest (0, 1: f32
            // subnormal halves), 1 itself, and the largest whose codes stay
            // finite (252).
            b[at] = match (mode, rng.next() % 4) {
                (1, 0) => 0,
                (2, 0) => 1,
                (2, 1) => 252,
                (2, 2) => 127,
                _ => 118 + (rng.next() % 12) as u8,
            };
        }
    }
    row
}

pub(crate) fn acts(rng: &mut Rng, n: usize, mode: u32) -> Vec<f32> {
    (0..n)
        .map(|i| match mode {
            1 if i % 64 < 40 => 0.0,
            2 => rng.normal() * 1e7,
            _ => rng.normal(),
        })
        .collect()
}

pub(crate) fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// `nrows` weight rows of `cols` elements ([`weights`] in `mode`), then
/// `ntok` activation rows ([`acts`] in `mode`) quantized in the format `t`'s
/// dot product reads, drawn from `rng` in that order.
pub(crate) fn operands(
    rng: &mut Rng,
    t: GgmlType,
    cols: usize,
    nrows: usize,
    ntok: usize,
    mode: u32,
) -> (Vec<u8>, Vec<u8>) {
    let fmt = act_format(t);
    let arb = act_row_bytes(fmt, cols);
    let w: Vec<u8> = (0..nrows)
        .flat_map(|_| weights(rng, t, cols, mode))
        .collect();
    let mut a = vec![0u8; ntok * arb];
    for row in a.chunks_exact_mut(arb) {
        quantize_act(fmt, &acts(rng, cols, mode), row);
    }
    (w, a)
}

/// The scalar reference's dot products of weight rows `w` with activation
/// rows `a` (rows of `cols` elements), token-major: element tk * nrows + r.
pub(crate) fn scalar_dots(
    t: GgmlType,
    cols: usize,
    nrows: usize,
    ntok: usize,
    w: &[u8],
    a: &[u8],
) -> Vec<f32> {
    let wrb = t.row_bytes(cols as u64).unwrap() as usize;
    let arb = act_row_bytes(act_format(t), cols);
    let mut want = vec![0f32; ntok * nrows];
    for tk in 0..ntok {
        for r in 0..nrows {
            want[tk * nrows + r] = dot(
                t,
                &w[r * wrb..(r + 1) * wrb],
                &a[tk * arb..(tk + 1) * arb],
                cols,
            );
        }
    }
    want
}

/// Every element of `got` is [`same`] as the scalar reference's `want`
/// (token-major, `nrows` a token); a failure names `what`, the shape and
/// the element.
pub(crate) fn expect_same(
    got: &[f32],
    want: &[f32],
    what: &str,
    cols: usize,
    nrows: usize,
    mode: u32,
) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            same(*g, *w),
            "{what} cols {cols} rows {nrows} mode {mode}: \
             element {i} (token {}, row {}): {g} vs scalar {w}",
            i / nrows,
            i % nrows
        );
    }
}

/// The quantized types every level has kernels for.
pub(crate) const QUANT_TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::MXFP4,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// The token counts of the few-row tests (a batched decode step, a
/// speculative verify): every k in 1..=16 and a few above.
pub(crate) fn few_ks() -> Vec<usize> {
    (1..=16).chain([17, 23, 33]).collect()
}

/// The few-row tests' operands for type `t`: per column count (K-quants
/// 512, the blocks of 32 224 and 640, ending in a partial group of
/// blocks), `nrows` random weight rows and as many activation rows as the
/// largest of [`few_ks`], seeded by the type and column count.
pub(crate) fn few_rows_operands(t: GgmlType, nrows: usize) -> Vec<(usize, Vec<u8>, Vec<u8>)> {
    let kmax = *few_ks().iter().max().unwrap();
    let colss: &[usize] = match t {
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => &[512],
        _ => &[224, 640],
    };
    colss
        .iter()
        .map(|&cols| {
            let mut rng = Rng(cols as u64 * 31 + t as u64);
            let (w, a) = operands(&mut rng, t, cols, nrows, kmax, 0);
            (cols, w, a)
        })
        .collect()
}

/// For every k of [`few_ks`]: `run(0, k)` (k tokens from the first, token
/// major, `nrows` a token) equals the scalar reference on weight rows `w`
/// and activation rows `a`, and each token's row equals `run(j, 1)`, that
/// token alone. A failure names `what` (level, type, columns), k, the token
/// and the row.
pub(crate) fn expect_few_rows(
    what: &str,
    t: GgmlType,
    cols: usize,
    nrows: usize,
    w: &[u8],
    a: &[u8],
    run: impl Fn(usize, usize) -> Vec<f32>,
) {
    let ks = few_ks();
    let kmax = *ks.iter().max().unwrap();
    let want = scalar_dots(t, cols, nrows, kmax, w, a);
    let alone: Vec<Vec<f32>> = (0..kmax).map(|j| run(j, 1)).collect();
    for &k in &ks {
        let got = run(0, k);
        for j in 0..k {
            for r in 0..nrows {
                let (g, want) = (got[j * nrows + r], want[j * nrows + r]);
                let what = format!("{what} k {k}: token {j} row {r}");
                assert!(same(g, want), "{what}: {g} vs scalar {want}");
                assert!(same(g, alone[j][r]), "{what}: {g} vs alone {}", alone[j][r]);
            }
        }
    }
}
