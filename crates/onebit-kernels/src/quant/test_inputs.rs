//! Test inputs shared by the SIMD-vs-scalar tests of every architecture
//! (`x86/tests.rs`, `arm/tests.rs`): a seeded generator, weight rows with
//! random codes and ordinary, zero or extreme scales, activation rows, and
//! bit-for-bit equality of results.

use onebit_formats::GgmlType;

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
