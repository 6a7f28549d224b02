//! Quantizing f32 weights into Q4 tiles (for imports whose source type is not
//! Q4_0 or Q4_1). As ggml's reference quantizers, except that codes are
//! computed against the bf16 scale and minimum the tile will store.

use half::bf16;

use super::{encode, Q4Groups, Q4Kind, Q4Shape, GROUP};

fn round_bf16(x: f32) -> (f32, u16) {
    let b = bf16::from_f32(x);
    (b.to_f32(), b.to_bits())
}

/// Quantizes `w` ([n][k] row-major) into tiles of `kind`.
pub fn quantize(w: &[f32], shape: Q4Shape, kind: Q4Kind) -> Vec<u8> {
    assert_eq!(w.len(), shape.n * shape.k);
    let gpr = shape.k / GROUP;
    let mut g = Q4Groups {
        shape,
        kind,
        d: vec![0; shape.n * gpr],
        m: vec![0; shape.n * gpr],
        nib: vec![0; shape.n * shape.k],
    };
    for (gi, x) in w.chunks_exact(GROUP).enumerate() {
        let nib = &mut g.nib[gi * GROUP..(gi + 1) * GROUP];
        match kind {
            Q4Kind::Asymmetric => {
                let min = x.iter().copied().fold(f32::MAX, f32::min);
                let max = x.iter().copied().fold(f32::MIN, f32::max);
                let (m, mb) = round_bf16(min);
                let (d, db) = round_bf16((max - m) / 15.0);
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                g.d[gi] = db;
                g.m[gi] = mb;
                for (q, &v) in nib.iter_mut().zip(x) {
                    *q = (((v - m) * id + 0.5) as i32).clamp(0, 15) as u8;
                }
            }
            Q4Kind::Symmetric => {
                // The value of largest magnitude maps to -8 (ggml's Q4_0).
                let mut amax = 0f32;
                let mut max = 0f32;
                for &v in x {
                    if v.abs() > amax {
                        amax = v.abs();
                        max = v;
                    }
                }
                let (d, db) = round_bf16(max / -8.0);
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                g.d[gi] = db;
                for (q, &v) in nib.iter_mut().zip(x) {
                    let u = ((v * id + 8.5).floor() as i32).clamp(0, 15) as u8;
                    *q = u ^ 8; // two's complement of u - 8
                }
            }
        }
    }
    encode(&g)
}
