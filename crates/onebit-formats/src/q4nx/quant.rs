//! Quantizing f32 weights into Q4 tiles (for imports whose source type is not
//! Q4_0 or Q4_1). As ggml's reference quantizers, except that codes are
//! computed against the bf16 scale and minimum the tile will store.

use half::bf16;

use super::{encode, Q4Groups, Q4Kind, Q4Shape, GROUP};

fn round_bf16(x: f32) -> (f32, u16) {
    let b = bf16::from_f32(x);
    (b.to_f32(), b.to_bits())
}

/// Quantizes `w` (\[n\]\[k\] row-major) into tiles of `kind`, in the form of
/// `shape`. Panics if that form cannot hold `kind` ([`super::TileForm::holds`]).
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
                let (m, d) = fit_asymmetric(x);
                let (m, mb) = round_bf16(m);
                let (d, db) = round_bf16(d);
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                g.d[gi] = db;
                g.m[gi] = mb;
                for (q, &v) in nib.iter_mut().zip(x) {
                    *q = (((v - m) * id).round() as i32).clamp(0, 15) as u8;
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

/// Squared error of codes round((x - m) / d) against x.
fn sq_err(x: &[f32], m: f32, d: f32) -> f32 {
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    x.iter()
        .map(|&v| {
            let q = ((v - m) * id).round().clamp(0.0, 15.0);
            let e = q * d + m - v;
            e * e
        })
        .sum()
}

/// A minimum and scale for one asymmetric group: ggml's reference choice
/// (min, (max - min) / 15), then (as ggml's `make_qkx2_quants` for K-quants)
/// a search over slightly different scales, each followed by the
/// least-squares minimum and scale for its codes; the pair with the smallest
/// squared error wins. On Gemma 3 270M's matrices this cuts the
/// re-quantization error by about a tenth against the reference.
fn fit_asymmetric(x: &[f32]) -> (f32, f32) {
    let min = x.iter().copied().fold(f32::MAX, f32::min);
    let max = x.iter().copied().fold(f32::MIN, f32::max);
    if max <= min {
        return (min, 0.0);
    }
    let (mut best_m, mut best_d) = (min, (max - min) / 15.0);
    let mut best = sq_err(x, best_m, best_d);
    for step in 0..=20 {
        let iscale = (15.0 - 1.0 + 0.1 * step as f32) / (max - min);
        let (mut sl, mut sl2, mut sxl, mut sx) = (0f32, 0f32, 0f32, 0f32);
        for &v in x {
            let l = ((v - min) * iscale).round().clamp(0.0, 15.0);
            sl += l;
            sl2 += l * l;
            sxl += v * l;
            sx += v;
        }
        let n = x.len() as f32;
        let det = n * sl2 - sl * sl;
        if det <= 0.0 {
            continue;
        }
        let d = (n * sxl - sx * sl) / det;
        let m = (sl2 * sx - sl * sxl) / det;
        if d <= 0.0 {
            continue;
        }
        let e = sq_err(x, m, d);
        if e < best {
            (best, best_m, best_d) = (e, m, d);
        }
    }
    (best_m, best_d)
}
