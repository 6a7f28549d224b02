//! Activation quantization and the scalar dot products, checked against
//! definitions written out here: for every weight type, `dot(w, quantize_act(x))`
//! must equal the float64 sum of the dequantized weights times the
//! activations *as quantized* (decoded by the small decoders below, written
//! from the block definitions, not by the library) to f32 rounding.

use onebit_formats::blocks::dequantize;
use onebit_formats::GgmlType;
use onebit_kernels::quant::{act_format, act_row_bytes, dot, quantize_act, ActFormat};

/// splitmix64: a small deterministic generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn sign(&mut self) -> f64 {
        if self.next() & 1 == 0 {
            1.0
        } else {
            -1.0
        }
    }
    /// Roughly normal (sum of uniforms).
    fn normal(&mut self) -> f64 {
        (0..4).map(|_| self.unit()).sum::<f64>() - 2.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Offsets of the f16 scale fields in each block type, and of an f32 one.
fn scale_fields(t: GgmlType) -> (&'static [usize], Option<usize>) {
    use GgmlType as T;
    match t {
        T::Q4_0 | T::Q5_0 | T::Q8_0 => (&[0], None),
        T::Q4_1 | T::Q5_1 | T::Q8_1 | T::Q4K | T::Q5K => (&[0, 2], None),
        T::Q2K => (&[80, 82], None),
        T::Q3K => (&[108], None),
        T::Q6K => (&[208], None),
        T::Q8K => (&[], Some(0)),
        T::F32 | T::F16 | T::BF16 | T::MXFP4 => (&[], None),
    }
}

/// A weight row of `n` elements of type `t` that decodes to finite values:
/// random codes, scales of either sign between 1e-3 and 1.
fn random_weights(rng: &mut Rng, t: GgmlType, n: usize) -> Vec<u8> {
    match t {
        GgmlType::F32 => (0..n)
            .flat_map(|_| (rng.normal() as f32).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f64(rng.normal()).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| half::bf16::from_f64(rng.normal()).to_le_bytes())
            .collect(),
        GgmlType::MXFP4 => {
            // Random codes; the E8M0 exponent byte between 118 and 129
            // (scales 2^-10 .. 2^1), so the values stay in the range above.
            let mut row = rng.bytes(n / 32 * 17);
            for block in row.chunks_exact_mut(17) {
                block[0] = 118 + (rng.unit() * 12.0) as u8;
            }
            row
        }
        _ => {
            let (f16s, f32_at) = scale_fields(t);
            let mut row = rng.bytes(n / t.block_len() * t.block_bytes());
            for block in row.chunks_exact_mut(t.block_bytes()) {
                for &at in f16s {
                    let v = rng.sign() * 10f64.powf(-3.0 * rng.unit());
                    block[at..at + 2].copy_from_slice(&half::f16::from_f64(v).to_le_bytes());
                }
                if let Some(at) = f32_at {
                    let v = (rng.sign() * 10f64.powf(-3.0 * rng.unit())) as f32;
                    block[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            row
        }
    }
}

/// Activations with a scale that changes from block to block and a few outliers.
fn random_acts(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(n);
    for _ in 0..n / 32 {
        let scale = 10f64.powf(4.0 * rng.unit() - 2.0);
        for _ in 0..32 {
            let outlier = if rng.unit() < 0.02 { 30.0 } else { 1.0 };
            x.push((rng.normal() * scale * outlier) as f32);
        }
    }
    x
}

fn f16_at(b: &[u8], at: usize) -> f64 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f64()
}

/// The activation row as quantized, decoded from the format definitions:
/// Q8_0 = {f16 d, 32 x i8}, value d*q; Q8_1 = {f16 d, f16 s, 32 x i8}, value
/// d*q (s is returned per block); Q8_K = {f32 d, 256 x i8, 16 x i16}, value d*q.
fn decode_act(fmt: ActFormat, bytes: &[u8], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut vals = Vec::with_capacity(n);
    let mut sums = Vec::new();
    match fmt {
        ActFormat::F32 => {
            vals.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64),
            );
        }
        ActFormat::Q8_0 => {
            for b in bytes.chunks_exact(34) {
                let d = f16_at(b, 0);
                vals.extend(b[2..34].iter().map(|&q| d * (q as i8) as f64));
            }
        }
        ActFormat::Q8_1 => {
            for b in bytes.chunks_exact(36) {
                let d = f16_at(b, 0);
                sums.push(f16_at(b, 2));
                vals.extend(b[4..36].iter().map(|&q| d * (q as i8) as f64));
            }
        }
        ActFormat::Q8K => {
            for b in bytes.chunks_exact(292) {
                let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
                vals.extend(b[4..260].iter().map(|&q| d * (q as i8) as f64));
            }
        }
    }
    assert_eq!(vals.len(), n);
    (vals, sums)
}

fn quantize(fmt: ActFormat, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; act_row_bytes(fmt, x.len())];
    quantize_act(fmt, x, &mut out);
    out
}

/// (expected value, magnitude sum|w||a|) in float64. Q4_1/Q5_1 weights pair
/// with Q8_1, whose dot product (llama.cpp's) takes the weights' min times the
/// activations' stored block sum s rather than times the decoded values.
fn expected(w: GgmlType, w_row: &[u8], act: &[u8], n: usize) -> (f64, f64) {
    let mut wf = vec![0f32; n];
    dequantize(w, w_row, &mut wf).unwrap();
    let fmt = act_format(w);
    let (a, s) = decode_act(fmt, act, n);
    let (mut sum, mut mag) = (0f64, 0f64);
    if fmt == ActFormat::Q8_1 {
        for (b, block) in w_row.chunks_exact(w.block_bytes()).enumerate() {
            let m = f16_at(block, 2); // Q4_1 and Q5_1 keep m at byte 2
            for i in 32 * b..32 * b + 32 {
                sum += (wf[i] as f64 - m) * a[i];
                mag += (wf[i] as f64 * a[i]).abs();
            }
            sum += m * s[b];
            mag += (m * s[b]).abs();
        }
    } else {
        for (w, a) in wf.iter().zip(&a) {
            sum += *w as f64 * a;
            mag += (*w as f64 * a).abs();
        }
    }
    (sum, mag)
}

const WEIGHT_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
    GgmlType::MXFP4,
];

#[test]
fn every_dot_equals_the_f64_sum_of_its_decoded_operands() {
    let mut rng = Rng(0x5EED);
    for &w in WEIGHT_TYPES {
        let fmt = act_format(w);
        for n in [256, 1024, 4096] {
            for trial in 0..6 {
                let w_row = random_weights(&mut rng, w, n);
                let x = random_acts(&mut rng, n);
                let act = quantize(fmt, &x);
                let got = dot(w, &w_row, &act, n);
                let (want, mag) = expected(w, &w_row, &act, n);
                assert!(
                    (got as f64 - want).abs() <= 1e-5 * mag,
                    "{w} n={n} trial {trial}: dot {got:e}, f64 sum {want:e}, |diff| {:e} > 1e-5 * {mag:e}",
                    (got as f64 - want).abs()
                );
                // Deterministic: the same inputs give the same bits.
                let again = dot(w, &w_row.clone(), &act.clone(), n);
                assert_eq!(
                    got.to_bits(),
                    again.to_bits(),
                    "{w}: dot is not deterministic"
                );
            }
        }
    }
}

#[test]
fn dot_reads_the_activation_bytes_quantize_act_wrote() {
    // One hot activations pick out single weights: dot(w, e_i) = w_i * a_i.
    let mut rng = Rng(7);
    for &w in WEIGHT_TYPES {
        let n = 256;
        let w_row = random_weights(&mut rng, w, n);
        let mut wf = vec![0f32; n];
        dequantize(w, &w_row, &mut wf).unwrap();
        for i in [0, 1, 15, 16, 31, 32, 100, 128, 200, 255] {
            let mut x = vec![0f32; n];
            x[i] = 1.0;
            let act = quantize(act_format(w), &x);
            let (want, mag) = expected(w, &w_row, &act, n);
            let got = dot(w, &w_row, &act, n) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * mag.max(1e-30),
                "{w}[{i}]: {got} vs {want}"
            );
            if act_format(w) != ActFormat::Q8_1 {
                // Only element i contributes: w_i times the decoded 1.0
                // (127 * f16(1/127) for Q8_0, exactly 1 for Q8_K and F32).
                let (a, _) = decode_act(act_format(w), &act, n);
                let wi = wf[i] as f64 * a[i];
                assert!(
                    (got - wi).abs() <= 1e-6 * wi.abs(),
                    "{w}[{i}]: {got} vs w_i * a_i {wi}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Activation quantization

const QUANT_FORMATS: &[ActFormat] = &[ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8K];

/// The stored scale of each block, as f64.
fn block_scales(fmt: ActFormat, bytes: &[u8]) -> Vec<f64> {
    match fmt {
        ActFormat::Q8_0 => bytes.chunks_exact(34).map(|b| f16_at(b, 0)).collect(),
        ActFormat::Q8_1 => bytes.chunks_exact(36).map(|b| f16_at(b, 0)).collect(),
        ActFormat::Q8K => bytes
            .chunks_exact(292)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect(),
        ActFormat::F32 => unreachable!(),
    }
}

#[test]
fn round_trip_error_is_at_most_half_a_step() {
    let mut rng = Rng(99);
    for &fmt in QUANT_FORMATS {
        let bl = fmt.block_len();
        for _ in 0..20 {
            let x = random_acts(&mut rng, 1024);
            let q = quantize(fmt, &x);
            let (y, _) = decode_act(fmt, &q, x.len());
            let scales = block_scales(fmt, &q);
            for (b, (xb, yb)) in x.chunks(bl).zip(y.chunks(bl)).enumerate() {
                let amax = xb.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
                let d = amax / 127.0; // the exact step
                let stored = scales[b].abs();
                // Half a step, plus what rounding the scale to f16 (Q8_0/Q8_1)
                // moves the largest code, plus f32 rounding.
                let bound = d / 2.0 + 127.0 * (stored - d).abs() + 1e-6 * amax;
                for (i, (&xv, &yv)) in xb.iter().zip(yb).enumerate() {
                    assert!(
                        (xv as f64 - yv).abs() <= bound,
                        "{fmt:?} block {b}[{i}]: {xv} -> {yv}, error > {bound:e} (d {d:e}, stored {stored:e})"
                    );
                }
                if fmt == ActFormat::Q8K {
                    // Q8_K's f32 scale: the bound is d/2 up to f32 rounding.
                    assert!(
                        (stored - d).abs() <= 1e-6 * d,
                        "{fmt:?}: stored scale {stored} vs {d}"
                    );
                }
            }
        }
    }
}

#[test]
fn q8_1_sum_and_q8_k_bsums_describe_the_codes() {
    let mut rng = Rng(3);
    let x = random_acts(&mut rng, 512);
    let q = quantize(ActFormat::Q8_1, &x);
    for (b, xb) in q.chunks_exact(36).zip(x.chunks(32)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let sum: i32 = b[4..].iter().map(|&c| c as i8 as i32).sum();
        // s = f16(d * sum) with d = amax/127 in f32, before its f16 rounding.
        assert_eq!(
            half::f16::from_le_bytes([b[2], b[3]]),
            half::f16::from_f32(amax / 127.0 * sum as f32)
        );
    }
    let q = quantize(ActFormat::Q8K, &x);
    for b in q.chunks_exact(292) {
        for j in 0..16 {
            let sum: i32 = b[4 + 16 * j..4 + 16 * j + 16]
                .iter()
                .map(|&c| c as i8 as i32)
                .sum();
            let stored = i16::from_le_bytes([b[260 + 2 * j], b[261 + 2 * j]]);
            assert_eq!(stored as i32, sum, "bsum {j}");
        }
    }
}

#[test]
fn ties_round_to_even() {
    // amax = 127 makes the multiplier exactly 1 (Q8_0/Q8_1: 127/amax; Q8_K:
    // -127/max = -1), so each value's code is its own rounding.
    let mut x = vec![0f32; 256];
    x[..8].copy_from_slice(&[127.0, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5, -1.5]);
    let even = [127i8, 2, 4, -2, 0, 0, 2, -2];
    for fmt in [ActFormat::Q8_0, ActFormat::Q8_1] {
        let q = quantize(fmt, &x);
        let at = if fmt == ActFormat::Q8_0 { 2 } else { 4 };
        let codes: Vec<i8> = q[at..at + 8].iter().map(|&c| c as i8).collect();
        assert_eq!(codes, even, "{fmt:?}");
        assert_eq!(f16_at(&q, 0), 1.0);
    }
    // Q8_K: the largest magnitude (+127) gets code -127 and d is negative.
    let q = quantize(ActFormat::Q8K, &x);
    let codes: Vec<i8> = q[4..12].iter().map(|&c| c as i8).collect();
    assert_eq!(codes, even.map(|c| -c));
    assert_eq!(f32::from_le_bytes([q[0], q[1], q[2], q[3]]), -1.0);
}

#[test]
fn zero_row_gives_zeros() {
    for &fmt in QUANT_FORMATS {
        let q = quantize(fmt, &[0f32; 512]);
        assert!(
            q.iter().all(|&b| b == 0),
            "{fmt:?}: a zero row must encode as zero bytes"
        );
        let (y, _) = decode_act(fmt, &q, 512);
        assert!(y.iter().all(|&v| v == 0.0));
    }
    let mut rng = Rng(11);
    for &w in WEIGHT_TYPES {
        let w_row = random_weights(&mut rng, w, 256);
        let act = quantize(act_format(w), &[0f32; 256]);
        assert_eq!(dot(w, &w_row, &act, 256), 0.0, "{w}");
    }
}

#[test]
fn extreme_values_stay_finite() {
    let tiny = f32::from_bits(1); // smallest subnormal
    let rows: Vec<Vec<f32>> = vec![
        // Huge and subnormal values in one block.
        [1e30, -1e30, 1e-40, -1e-40, tiny, 0.0, 3.0, -7e29].repeat(32),
        // Only subnormals.
        [1e-40, -2e-41, tiny, -tiny].repeat(64),
        // Just past what an f16 Q8_0 scale holds (65504 * 127 ~ 8.3e6).
        [9e6, -1.0, 4e6, 0.5].repeat(64),
        // Largest finite f32.
        [f32::MAX, f32::MIN, 1.0, 0.0].repeat(64),
    ];
    let mut rng = Rng(5);
    for x in &rows {
        for &fmt in QUANT_FORMATS {
            let q = quantize(fmt, x);
            let (y, s) = decode_act(fmt, &q, x.len());
            if x[0] == f32::MAX {
                // 127 * (f32::MAX / 127) may round past f32::MAX; no NaN, though.
                assert!(
                    y.iter().chain(&s).all(|v| !v.is_nan()),
                    "{fmt:?}: NaN from f32::MAX"
                );
                continue;
            }
            assert!(
                y.iter().chain(&s).all(|v| (*v as f32).is_finite()),
                "{fmt:?}: {x:?} -> {y:?}"
            );
        }
        if x[0] == f32::MAX {
            continue; // the dot itself may overflow f32 there
        }
        for &w in WEIGHT_TYPES {
            let w_row = random_weights(&mut rng, w, 256);
            let act = quantize(act_format(w), x);
            let d = dot(w, &w_row, &act, 256);
            assert!(d.is_finite(), "{w}: dot {d}");
        }
    }
    // A Q8_0 block past f16's range saturates its scale rather than going infinite,
    // and values that still fit keep their codes.
    let x = [9e6f32, -1.0, 4e6, 0.5].repeat(8);
    let q = quantize(ActFormat::Q8_0, &x);
    assert_eq!(f16_at(&q, 0), 65504.0);
    assert_eq!(q[2] as i8, 127);
    assert_eq!(q[4] as i8, (4e6f64 / 65504.0).round() as i8);
}
