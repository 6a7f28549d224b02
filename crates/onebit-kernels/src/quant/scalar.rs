//! Scalar reference dot products, one per weight type.
//!
//! Each takes a weight row (whole blocks of its type), an activation row in
//! the format [`super::act_format`] names, and the element count; lengths are
//! checked by [`super::dot`]. SIMD kernels are tested against these.
//!
//! Within a block every product of codes is summed exactly in i32; the block's
//! float term (the integer sum times the product of the scales, plus the
//! min-correction where the format has mins) is then added to an f32
//! accumulator. The float formulas follow ggml's portable `ggml_vec_dot_*`
//! (scale products formed first, e.g. `(dx * dy) * sumi`), never fused.
//!
//! Blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1) accumulate into 8 lanes,
//! block b into lane b % 8, reduced pairwise at the end as the float dots
//! below. That is the order a 256-bit SIMD kernel computes in when it holds
//! eight blocks' integer sums in one vector (one block per 32-bit lane), so the
//! SIMD kernels in `x86/` reproduce these functions bit for bit.
//!
//! K-quants form the whole super-block's integer sum before scaling (as ggml's
//! x86 kernels do), and add the super-blocks' float terms to one accumulator
//! in order.
//!
//! The float (F32/F16/BF16) dots multiply elementwise and add into 8 lanes
//! (element i into lane i % 8), then reduce the lanes pairwise:
//! ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).

use onebit_formats::blocks::{
    e8m0_half, f16_at, f32_at, k4_scale_min, layout, q3k_scales, q5_codes, u32_at, MXFP4_CODES,
    QK_K,
};
use onebit_formats::GgmlType;

const QK8: usize = 32;

/// Sums products into 8 lanes (element i into lane i % 8), reduced pairwise.
#[inline]
fn sum_lanes(products: impl Iterator<Item = f32>) -> f32 {
    let mut acc = [0f32; 8];
    for (i, p) in products.enumerate() {
        acc[i & 7] += p;
    }
    reduce8(&acc)
}

/// The pairwise reduction of 8 lanes: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)),
/// what a 256 -> 128 -> 64 -> 32-bit halving reduction computes.
#[inline]
pub fn reduce8(acc: &[f32; 8]) -> f32 {
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

fn act_f32(act: &[u8]) -> impl Iterator<Item = f32> + '_ {
    act.chunks_exact(4).map(|c| f32_at(c, 0))
}

/// F32 weights · F32 activations.
pub fn dot_f32_f32(w: &[u8], act: &[u8], n: usize) -> f32 {
    let w = w[..4 * n].chunks_exact(4).map(|c| f32_at(c, 0));
    sum_lanes(w.zip(act_f32(act)).map(|(w, x)| w * x))
}

/// F16 weights · F32 activations (weights widened exactly to f32).
pub fn dot_f16_f32(w: &[u8], act: &[u8], n: usize) -> f32 {
    let w = w[..2 * n].chunks_exact(2).map(|c| f16_at(c, 0));
    sum_lanes(w.zip(act_f32(act)).map(|(w, x)| w * x))
}

/// BF16 weights · F32 activations (weights widened exactly to f32).
pub fn dot_bf16_f32(w: &[u8], act: &[u8], n: usize) -> f32 {
    let w = w[..2 * n]
        .chunks_exact(2)
        .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16));
    sum_lanes(w.zip(act_f32(act)).map(|(w, x)| w * x))
}

/// The 32 codes of a Q8_0/Q8_1 activation block as i32.
#[inline]
fn codes8(qs: &[u8]) -> impl Iterator<Item = i32> + '_ {
    qs.iter().map(|&q| q as i8 as i32)
}

/// Visits matching blocks of a weight row and an activation row.
#[inline]
fn blocks<'a>(
    w: GgmlType,
    w_row: &'a [u8],
    act_block_bytes: usize,
    act: &'a [u8],
    n: usize,
) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
    let nb = n / w.block_len();
    w_row
        .chunks_exact(w.block_bytes())
        .zip(act.chunks_exact(act_block_bytes))
        .take(nb)
}

/// Q4_0 · Q8_0: sum over blocks of (dx * dy) * sum((q - 8) * y).
pub fn dot_q4_0_q8_0(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q4_0 as x;
    use layout::q8_0 as y;
    let mut acc = [0f32; 8];
    for (b, (bx, by)) in blocks(GgmlType::Q4_0, w, 34, act, n).enumerate() {
        let qx = &bx[x::QS..x::QS + 16];
        let qy = &by[y::QS..y::QS + QK8];
        let mut sumi = 0i32;
        for j in 0..16 {
            let lo = (qx[j] & 0x0F) as i32 - 8;
            let hi = (qx[j] >> 4) as i32 - 8;
            sumi += lo * qy[j] as i8 as i32 + hi * qy[j + 16] as i8 as i32;
        }
        acc[b % 8] += (f16_at(bx, x::D) * f16_at(by, y::D)) * sumi as f32;
    }
    reduce8(&acc)
}

/// Q4_1 · Q8_1: sum over blocks of (dx * dy) * sum(q * y) + mx * sy.
pub fn dot_q4_1_q8_1(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q4_1 as x;
    use layout::q8_1 as y;
    let mut acc = [0f32; 8];
    for (b, (bx, by)) in blocks(GgmlType::Q4_1, w, 36, act, n).enumerate() {
        let qx = &bx[x::QS..x::QS + 16];
        let qy = &by[y::QS..y::QS + QK8];
        let mut sumi = 0i32;
        for j in 0..16 {
            let lo = (qx[j] & 0x0F) as i32;
            let hi = (qx[j] >> 4) as i32;
            sumi += lo * qy[j] as i8 as i32 + hi * qy[j + 16] as i8 as i32;
        }
        let scaled = (f16_at(bx, x::D) * f16_at(by, y::D)) * sumi as f32;
        acc[b % 8] += scaled + f16_at(bx, x::M) * f16_at(by, y::S);
    }
    reduce8(&acc)
}

/// Q5_0 · Q8_0: as Q4_0 with 5-bit codes offset by 16.
pub fn dot_q5_0_q8_0(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q5_0 as x;
    use layout::q8_0 as y;
    let mut acc = [0f32; 8];
    for (b, (bx, by)) in blocks(GgmlType::Q5_0, w, 34, act, n).enumerate() {
        let qx = q5_codes(u32_at(bx, x::QH), &bx[x::QS..x::QS + 16]);
        let sumi: i32 = qx
            .iter()
            .zip(codes8(&by[y::QS..y::QS + QK8]))
            .map(|(&q, y)| (q as i32 - 16) * y)
            .sum();
        acc[b % 8] += (f16_at(bx, x::D) * f16_at(by, y::D)) * sumi as f32;
    }
    reduce8(&acc)
}

/// Q5_1 · Q8_1: as Q4_1 with 5-bit codes.
pub fn dot_q5_1_q8_1(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q5_1 as x;
    use layout::q8_1 as y;
    let mut acc = [0f32; 8];
    for (b, (bx, by)) in blocks(GgmlType::Q5_1, w, 36, act, n).enumerate() {
        let qx = q5_codes(u32_at(bx, x::QH), &bx[x::QS..x::QS + 16]);
        let sumi: i32 = qx
            .iter()
            .zip(codes8(&by[y::QS..y::QS + QK8]))
            .map(|(&q, y)| q as i32 * y)
            .sum();
        let scaled = (f16_at(bx, x::D) * f16_at(by, y::D)) * sumi as f32;
        acc[b % 8] += scaled + f16_at(bx, x::M) * f16_at(by, y::S);
    }
    reduce8(&acc)
}

/// Q8_0 · Q8_0: sum over blocks of (dx * dy) * sum(x * y).
pub fn dot_q8_0_q8_0(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q8_0 as x;
    use layout::q8_0 as y;
    let mut acc = [0f32; 8];
    for (b, (bx, by)) in blocks(GgmlType::Q8_0, w, 34, act, n).enumerate() {
        let sumi: i32 = codes8(&bx[x::QS..x::QS + QK8])
            .zip(codes8(&by[y::QS..y::QS + QK8]))
            .map(|(a, b)| a * b)
            .sum();
        acc[b % 8] += (f16_at(bx, x::D) * f16_at(by, y::D)) * sumi as f32;
    }
    reduce8(&acc)
}

/// MXFP4 · Q8_0: sum over blocks of (dy * 2^(e-128)) * sum(c * y), where c
/// is the code's doubled E2M1 value ([`MXFP4_CODES`], integers -12..=12), so
/// the block's sum is exact in i32 and the power of two folds into the
/// activation scale exactly (ggml's `ggml_vec_dot_mxfp4_q8_0` order: the
/// scale product first). Lanes as Q4_0.
pub fn dot_mxfp4_q8_0(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::mxfp4 as x;
    use layout::q8_0 as y;
    let mut acc = [0f32; 8];
    for (b, (bx, by)) in blocks(GgmlType::MXFP4, w, 34, act, n).enumerate() {
        let qx = &bx[x::QS..x::QS + 16];
        let qy = &by[y::QS..y::QS + QK8];
        let mut sumi = 0i32;
        for j in 0..16 {
            let lo = MXFP4_CODES[(qx[j] & 0x0F) as usize] as i32;
            let hi = MXFP4_CODES[(qx[j] >> 4) as usize] as i32;
            sumi += lo * qy[j] as i8 as i32 + hi * qy[j + 16] as i8 as i32;
        }
        acc[b % 8] += (f16_at(by, y::D) * e8m0_half(bx[x::E])) * sumi as f32;
    }
    reduce8(&acc)
}

/// Q8_1 weights · Q8_0 activations (Q8_1's `s` is not needed).
pub fn dot_q8_1_q8_0(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q8_0 as y;
    use layout::q8_1 as x;
    let mut acc = [0f32; 8];
    for (b, (bx, by)) in blocks(GgmlType::Q8_1, w, 34, act, n).enumerate() {
        let sumi: i32 = codes8(&bx[x::QS..x::QS + QK8])
            .zip(codes8(&by[y::QS..y::QS + QK8]))
            .map(|(a, b)| a * b)
            .sum();
        acc[b % 8] += (f16_at(bx, x::D) * f16_at(by, y::D)) * sumi as f32;
    }
    reduce8(&acc)
}

// ---------------------------------------------------------------------------
// K-quants · Q8_K

const Q8K_BYTES: usize = 4 + QK_K + 2 * (QK_K / 16);

/// A Q8_K activation block's parts: d, the 256 codes, the 16 group sums.
#[inline]
fn q8k_parts(by: &[u8]) -> (f32, [i32; QK_K], [i32; QK_K / 16]) {
    use layout::q8_k::*;
    let mut q = [0i32; QK_K];
    for (q, &b) in q.iter_mut().zip(&by[QS..QS + QK_K]) {
        *q = b as i8 as i32;
    }
    let mut bsums = [0i32; QK_K / 16];
    for (j, s) in bsums.iter_mut().enumerate() {
        let at = BSUMS + 2 * j;
        *s = i16::from_le_bytes([by[at], by[at + 1]]) as i32;
    }
    (f32_at(by, D), q, bsums)
}

/// Q2_K · Q8_K: dy * (dx * sum_s(sc_s * sum(q * y)) - dmin * sum_s(m_s * bsum_s)).
pub fn dot_q2_k_q8_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q2_k::*;
    let mut acc = 0f32;
    for (bx, by) in blocks(GgmlType::Q2K, w, Q8K_BYTES, act, n) {
        let (dy, qy, bsums) = q8k_parts(by);
        let scales = &bx[SCALES..SCALES + 16];
        let summs: i32 = scales
            .iter()
            .zip(&bsums)
            .map(|(&sc, &s)| (sc >> 4) as i32 * s)
            .sum();
        let mut isum = 0i32;
        for half in 0..2 {
            let qs = &bx[QS + 32 * half..QS + 32 * half + 32];
            for j in 0..4 {
                for part in 0..2 {
                    let sc = (scales[8 * half + 2 * j + part] & 0x0F) as i32;
                    let base = 128 * half + 32 * j;
                    let s: i32 = (16 * part..16 * part + 16)
                        .map(|l| ((qs[l] >> (2 * j)) & 3) as i32 * qy[base + l])
                        .sum();
                    isum += sc * s;
                }
            }
        }
        let dall = dy * f16_at(bx, D);
        let dmin = dy * f16_at(bx, DMIN);
        acc += dall * isum as f32 - dmin * summs as f32;
    }
    acc
}

/// Q3_K · Q8_K: (dx * dy) * sum_s(scale_s * sum(q * y)), codes -4..=3.
pub fn dot_q3_k_q8_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q3_k::*;
    let mut acc = 0f32;
    for (bx, by) in blocks(GgmlType::Q3K, w, Q8K_BYTES, act, n) {
        let (dy, qy, _) = q8k_parts(by);
        let scales = q3k_scales(&bx[SCALES..SCALES + 12]);
        let hmask = &bx[HMASK..HMASK + 32];
        let mut isum = 0i32;
        for half in 0..2 {
            let qs = &bx[QS + 32 * half..QS + 32 * half + 32];
            for j in 0..4 {
                let bit = 4 * half + j;
                for part in 0..2 {
                    let base = 128 * half + 32 * j;
                    let s: i32 = (16 * part..16 * part + 16)
                        .map(|l| {
                            let low = ((qs[l] >> (2 * j)) & 3) as i32;
                            let q = if (hmask[l] >> bit) & 1 != 0 {
                                low
                            } else {
                                low - 4
                            };
                            q * qy[base + l]
                        })
                        .sum();
                    isum += scales[8 * half + 2 * j + part] as i32 * s;
                }
            }
        }
        acc += (f16_at(bx, D) * dy) * isum as f32;
    }
    acc
}

/// Q4_K · Q8_K: d * sum_j(sc_j * sum(q * y)) - dmin * sum_j(m_j * bsums of j),
/// with d = dx * dy and dmin = dminx * dy.
pub fn dot_q4_k_q8_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q4_k::*;
    let mut acc = 0f32;
    for (bx, by) in blocks(GgmlType::Q4K, w, Q8K_BYTES, act, n) {
        let (dy, qy, bsums) = q8k_parts(by);
        let scales = &bx[SCALES..SCALES + 12];
        let (mut isum, mut summ) = (0i32, 0i32);
        for c in 0..4 {
            let qs = &bx[QS + 32 * c..QS + 32 * c + 32];
            for (nib, sub) in [(0, 2 * c), (4, 2 * c + 1)] {
                let (sc, m) = k4_scale_min(scales, sub);
                let s: i32 = qs
                    .iter()
                    .zip(&qy[32 * sub..32 * sub + 32])
                    .map(|(&q, &y)| ((q >> nib) & 0x0F) as i32 * y)
                    .sum();
                isum += sc as i32 * s;
                summ += m as i32 * (bsums[2 * sub] + bsums[2 * sub + 1]);
            }
        }
        let d = f16_at(bx, D) * dy;
        let dmin = f16_at(bx, DMIN) * dy;
        acc += d * isum as f32 - dmin * summ as f32;
    }
    acc
}

/// Q5_K · Q8_K: as Q4_K with 5-bit codes.
pub fn dot_q5_k_q8_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q5_k::*;
    let mut acc = 0f32;
    for (bx, by) in blocks(GgmlType::Q5K, w, Q8K_BYTES, act, n) {
        let (dy, qy, bsums) = q8k_parts(by);
        let scales = &bx[SCALES..SCALES + 12];
        let qh = &bx[QH..QH + 32];
        let (mut isum, mut summ) = (0i32, 0i32);
        for c in 0..4 {
            let qs = &bx[QS + 32 * c..QS + 32 * c + 32];
            for (nib, sub) in [(0, 2 * c), (4, 2 * c + 1)] {
                let (sc, m) = k4_scale_min(scales, sub);
                let s: i32 = (0..32)
                    .map(|l| {
                        let q = ((qs[l] >> nib) & 0x0F) | (((qh[l] >> sub) & 1) << 4);
                        q as i32 * qy[32 * sub + l]
                    })
                    .sum();
                isum += sc as i32 * s;
                summ += m as i32 * (bsums[2 * sub] + bsums[2 * sub + 1]);
            }
        }
        let d = f16_at(bx, D) * dy;
        let dmin = f16_at(bx, DMIN) * dy;
        acc += d * isum as f32 - dmin * summ as f32;
    }
    acc
}

/// Q6_K · Q8_K: (dx * dy) * sum_s(sc_s * sum((q - 32) * y)).
pub fn dot_q6_k_q8_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q6_k::*;
    let mut acc = 0f32;
    for (bx, by) in blocks(GgmlType::Q6K, w, Q8K_BYTES, act, n) {
        let (dy, qy, _) = q8k_parts(by);
        let scales = &bx[SCALES..SCALES + 16];
        let mut isum = 0i32;
        for half in 0..2 {
            let ql = &bx[QL + 64 * half..QL + 64 * half + 64];
            let qh = &bx[QH + 32 * half..QH + 32 * half + 32];
            // Element 128*half + 32*k + l: nibble from ql[l + 32*(k & 1)]
            // (low for k < 2), top bits from bits 2k.. of qh[l].
            for k in 0..4 {
                for part in 0..2 {
                    let base = 128 * half + 32 * k;
                    let s: i32 = (16 * part..16 * part + 16)
                        .map(|l| {
                            let byte = ql[l + 32 * (k & 1)];
                            let nib = if k < 2 { byte & 0x0F } else { byte >> 4 };
                            let q = (nib | (((qh[l] >> (2 * k)) & 3) << 4)) as i32 - 32;
                            q * qy[base + l]
                        })
                        .sum();
                    isum += (scales[8 * half + 2 * k + part] as i8) as i32 * s;
                }
            }
        }
        acc += (f16_at(bx, D) * dy) * isum as f32;
    }
    acc
}

/// Q8_K weights · Q8_K activations: (dx * dy) * sum(x * y).
pub fn dot_q8_k_q8_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    use layout::q8_k::*;
    let mut acc = 0f32;
    for (bx, by) in blocks(GgmlType::Q8K, w, Q8K_BYTES, act, n) {
        let sumi: i32 = bx[QS..QS + QK_K]
            .iter()
            .zip(&by[QS..QS + QK_K])
            .map(|(&a, &b)| a as i8 as i32 * b as i8 as i32)
            .sum();
        acc += (f32_at(bx, D) * f32_at(by, D)) * sumi as f32;
    }
    acc
}
