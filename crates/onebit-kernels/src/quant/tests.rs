//! Arithmetic written out by hand, and the activation quantizers' contract.
//! The randomized comparison of every dot product with the float64 sum of the
//! dequantized operands is in `tests/quant_dot.rs`.

use super::*;

const F16_HALF: [u8; 2] = [0x00, 0x38]; // 0.5
const F16_QUARTER: [u8; 2] = [0x00, 0x34]; // 0.25
const F16_MINUS_ONE: [u8; 2] = [0x00, 0xBC]; // -1.0
const F16_TWO: [u8; 2] = [0x00, 0x40]; // 2.0

#[test]
fn q4_0_q8_0_by_hand() {
    // Weights: d = 0.5; byte 0 = 0x1F: element 0 code 15 (-> 15 - 8 = 7),
    // element 16 code 1 (-> -7); byte 1 = 0x80: element 1 code 0 (-> -8),
    // element 17 code 8 (-> 0); the other bytes 0x88 (codes 8 -> 0).
    let mut w = F16_HALF.to_vec();
    w.extend([0x1F, 0x80]);
    w.extend([0x88; 14]);
    // Activations: d = 0.25; codes 10 at 0, -2 at 1, 3 at 16, 100 at 17, 1 elsewhere.
    let mut a = F16_QUARTER.to_vec();
    let mut codes = [1i8; 32];
    codes[0] = 10;
    codes[1] = -2;
    codes[16] = 3;
    codes[17] = 100;
    a.extend(codes.iter().map(|&c| c as u8));
    // sumi = 7*10 + (-8)*(-2) + (-7)*3 + 0*100 + 0*(28 ones) = 70 + 16 - 21 = 65
    // dot  = (0.5 * 0.25) * 65 = 8.125
    assert_eq!(dot(GgmlType::Q4_0, &w, &a, 32), 8.125);
}

#[test]
fn mxfp4_q8_0_by_hand() {
    // Weights: e = 126, so the doubled codes scale by 2^(126 - 128) = 0.25
    // (E2M1 magnitudes times 2^(126 - 127) = 0.5). Byte 0 = 0xF7: element 0
    // code 7 (+6.0, doubled 12 -> 3.0), element 16 code 15 (-6.0 -> -3.0);
    // byte 1 = 0x19: element 1 code 9 (-0.5 -> -0.25), element 17 code 1
    // (+0.5 -> 0.25); the other bytes 0x00 (zeros).
    let mut w = vec![126u8, 0xF7, 0x19];
    w.extend([0u8; 14]);
    // Activations: d = 0.5; codes 4 at 0, 7 at 1, 2 at 16, -5 at 17, 9 elsewhere
    // (values 2, 3.5, 1, -2.5, 4.5).
    let mut a = F16_HALF.to_vec();
    let mut codes = [9i8; 32];
    codes[0] = 4;
    codes[1] = 7;
    codes[16] = 2;
    codes[17] = -5;
    a.extend(codes.iter().map(|&c| c as u8));
    // sumi = 12*4 + (-1)*7 + (-12)*2 + 1*(-5) = 12; dot = (0.5 * 0.25) * 12 = 1.5,
    // the elementwise 3*2 - 0.25*3.5 - 3*1 + 0.25*(-2.5) = 6 - 0.875 - 3 - 0.625.
    assert_eq!(dot(GgmlType::MXFP4, &w, &a, 32), 1.5);
}

#[test]
fn q4_1_q8_1_by_hand() {
    // Weights: d = 0.5, m = -1; byte 0 = 0x21: element 0 code 1, element 16
    // code 2; all other codes 0. Values: w0 = 0.5 - 1 = -0.5, w16 = 0, rest -1.
    let mut w = F16_HALF.to_vec();
    w.extend(F16_MINUS_ONE);
    w.push(0x21);
    w.extend([0u8; 15]);
    // Activations: d = 0.25, codes 4 at elements 0 and 16, 0 elsewhere, so
    // s = d * sum(codes) = 0.25 * 8 = 2. Values: a0 = a16 = 1, rest 0.
    let mut a = F16_QUARTER.to_vec();
    a.extend(F16_TWO);
    let mut codes = [0u8; 32];
    codes[0] = 4;
    codes[16] = 4;
    a.extend(codes);
    // sumi = 1*4 + 2*4 = 12; dot = (0.5 * 0.25) * 12 + m * s = 1.5 - 2 = -0.5,
    // which is w0*a0 + w16*a16 = -0.5 + 0.
    assert_eq!(dot(GgmlType::Q4_1, &w, &a, 32), -0.5);
}

#[test]
fn act_formats_pair_as_llama_cpp() {
    use GgmlType as T;
    for (w, f) in [
        (T::Q4_0, ActFormat::Q8_0),
        (T::Q5_0, ActFormat::Q8_0),
        (T::Q8_0, ActFormat::Q8_0),
        (T::MXFP4, ActFormat::Q8_0),
        (T::Q4_1, ActFormat::Q8_1),
        (T::Q5_1, ActFormat::Q8_1),
        (T::Q2K, ActFormat::Q8K),
        (T::Q3K, ActFormat::Q8K),
        (T::Q4K, ActFormat::Q8K),
        (T::Q5K, ActFormat::Q8K),
        (T::Q6K, ActFormat::Q8K),
        (T::F32, ActFormat::F32),
        (T::F16, ActFormat::F32),
        (T::BF16, ActFormat::F32),
    ] {
        assert_eq!(act_format(w), f, "{w}");
    }
    assert_eq!(act_row_bytes(ActFormat::F32, 3), 12);
    assert_eq!(act_row_bytes(ActFormat::Q8_0, 64), 68);
    assert_eq!(act_row_bytes(ActFormat::Q8_1, 64), 72);
    assert_eq!(act_row_bytes(ActFormat::Q8K, 512), 584);
}
