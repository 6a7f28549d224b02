//! Resampling as Pillow's `Image.resize` computes it for 8-bit RGB, which
//! is what llama.cpp's `mtmd` reproduces (`img_tool::resize_pillow`): a
//! separable pass over the width, then one over the height, each output
//! sample a normalized filter window over the input (widened by the scale
//! when shrinking), the weights in fixed point with 22 fraction bits and
//! each pass rounded and clamped back to a byte. The invariant: for the
//! same input, size and filter, the bytes equal Pillow's (the tests check
//! them against Pillow's own output).

use crate::{Filter, Rgb8};

/// Fraction bits of the fixed-point weights: 32 bits less 8 for the pixel
/// and 2 of headroom for the sum.
const PRECISION_BITS: u32 = 32 - 8 - 2;

impl Filter {
    /// The filter's half-width in input pixels at scale 1.
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    /// The filter's weight at distance `x` from an output sample's centre.
    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            // Keys' cubic with a = -0.5 (Pillow's; PyTorch uses -0.75).
            Filter::Bicubic => {
                let a = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * a
                } else {
                    0.0
                }
            }
            Filter::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let px = x * std::f64::consts::PI;
        px.sin() / px
    }
}

/// One axis's windows: for output sample `i`, the first input sample
/// `first[i]`, and `ksize` fixed-point weights from `weights[i * ksize]`,
/// of which `count[i]` are used.
struct Windows {
    first: Vec<usize>,
    count: Vec<usize>,
    ksize: usize,
    weights: Vec<i32>,
}

fn windows(in_size: usize, out_size: usize, filter: Filter) -> Windows {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut first = Vec::with_capacity(out_size);
    let mut count = Vec::with_capacity(out_size);
    let mut weights = vec![0i32; out_size * ksize];
    let mut row = vec![0f64; ksize];
    // A reciprocal multiplied, not a division: Pillow's rounding.
    let ss = 1.0 / filterscale;
    for i in 0..out_size {
        let center = (i as f64 + 0.5) * scale;
        // Truncation toward zero, as C's cast (both bounds are then clamped).
        let lo = ((center - support + 0.5) as i64).max(0) as usize;
        let hi = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let n = hi.saturating_sub(lo);
        let mut total = 0.0;
        for (k, w) in row.iter_mut().enumerate().take(n) {
            *w = filter.weight(((lo + k) as f64 - center + 0.5) * ss);
            total += *w;
        }
        let out = &mut weights[i * ksize..(i + 1) * ksize];
        for (o, &raw) in out.iter_mut().zip(&row[..n]) {
            let w = if total != 0.0 { raw / total } else { raw };
            let f = w * f64::from(1u32 << PRECISION_BITS);
            // Half away from zero, then truncation: Pillow's rounding.
            *o = if w < 0.0 {
                (f - 0.5) as i32
            } else {
                (f + 0.5) as i32
            };
        }
        first.push(lo);
        count.push(n);
    }
    Windows {
        first,
        count,
        ksize,
        weights,
    }
}

fn to_byte(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

fn horizontal(src: &Rgb8, out_w: usize, filter: Filter) -> Rgb8 {
    let win = windows(src.width, out_w, filter);
    let mut data = vec![0u8; out_w * src.height * 3];
    for y in 0..src.height {
        let row = &src.data[y * src.width * 3..(y + 1) * src.width * 3];
        let out = &mut data[y * out_w * 3..(y + 1) * out_w * 3];
        for x in 0..out_w {
            let k = &win.weights[x * win.ksize..x * win.ksize + win.count[x]];
            let mut acc = [1i32 << (PRECISION_BITS - 1); 3];
            for (j, &w) in k.iter().enumerate() {
                let p = (win.first[x] + j) * 3;
                for (a, &v) in acc.iter_mut().zip(&row[p..p + 3]) {
                    *a += i32::from(v) * w;
                }
            }
            for (o, &a) in out[x * 3..x * 3 + 3].iter_mut().zip(&acc) {
                *o = to_byte(a);
            }
        }
    }
    Rgb8 {
        width: out_w,
        height: src.height,
        data,
    }
}

fn vertical(src: &Rgb8, out_h: usize, filter: Filter) -> Rgb8 {
    let win = windows(src.height, out_h, filter);
    let stride = src.width * 3;
    let mut data = vec![0u8; stride * out_h];
    let mut acc = vec![0i32; stride];
    for y in 0..out_h {
        acc.fill(1i32 << (PRECISION_BITS - 1));
        let k = &win.weights[y * win.ksize..y * win.ksize + win.count[y]];
        for (j, &w) in k.iter().enumerate() {
            let row = &src.data[(win.first[y] + j) * stride..(win.first[y] + j + 1) * stride];
            for (a, &p) in acc.iter_mut().zip(row) {
                *a += i32::from(p) * w;
            }
        }
        for (o, &a) in data[y * stride..(y + 1) * stride].iter_mut().zip(&acc) {
            *o = to_byte(a);
        }
    }
    Rgb8 {
        width: src.width,
        height: out_h,
        data,
    }
}

/// `src` resampled to `width` x `height` (both at least 1) with `filter`,
/// byte for byte as Pillow's `Image.resize(.., resample=filter)`.
pub fn resize(src: &Rgb8, width: usize, height: usize, filter: Filter) -> Rgb8 {
    assert!(width > 0 && height > 0, "resize to an empty size");
    let wide = if width != src.width {
        horizontal(src, width, filter)
    } else {
        src.clone()
    };
    if height != src.height {
        vertical(&wide, height, filter)
    } else {
        wide
    }
}

/// `src` fitted into `width` x `height` keeping its aspect ratio, as
/// llama.cpp's default padding (`PAD_CEIL`) does: scaled by the smaller of
/// the two ratios (in f32), each side rounded up and capped at the target,
/// then centred (offsets rounded down) on a canvas of `pad`.
pub fn fit(src: &Rgb8, width: usize, height: usize, filter: Filter, pad: [u8; 3]) -> Rgb8 {
    if src.width == width && src.height == height {
        return src.clone();
    }
    let scale = (width as f32 / src.width as f32).min(height as f32 / src.height as f32);
    let nw = ((src.width as f32 * scale).ceil() as usize).clamp(1, width);
    let nh = ((src.height as f32 * scale).ceil() as usize).clamp(1, height);
    let inner = resize(src, nw, nh, filter);
    let mut data = Vec::with_capacity(width * height * 3);
    for _ in 0..width * height {
        data.extend_from_slice(&pad);
    }
    let (ox, oy) = ((width - nw) / 2, (height - nh) / 2);
    for y in 0..nh {
        let to = ((oy + y) * width + ox) * 3;
        data[to..to + nw * 3].copy_from_slice(&inner.data[y * nw * 3..(y + 1) * nw * 3]);
    }
    Rgb8 {
        width,
        height,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn solid(w: usize, h: usize, v: [u8; 3]) -> Rgb8 {
        Rgb8 {
            width: w,
            height: h,
            data: (0..w * h).flat_map(|_| v).collect(),
        }
    }

    #[test]
    fn a_flat_image_stays_flat_under_every_filter() {
        // Normalized weights sum to one (2^22 after rounding, give or take
        // a unit per tap), so a flat colour survives any resize.
        for f in [Filter::Bilinear, Filter::Bicubic, Filter::Lanczos] {
            for (w, h) in [(7, 5), (40, 3), (1, 1), (33, 90)] {
                let out = resize(&solid(13, 11, [0, 128, 255]), w, h, f);
                assert_eq!((out.width, out.height), (w, h));
                assert!(
                    out.data.chunks(3).all(|p| p == [0, 128, 255]),
                    "{f:?} {w}x{h}"
                );
            }
        }
    }

    #[test]
    fn bilinear_halving_averages_pairs() {
        // Shrinking 2:1 widens the triangle to two input pixels each side:
        // centre (2i+1) sees inputs 2i and 2i+1 at weight 3/4 and their
        // neighbours at 1/4, normalized (arithmetic of the filter, by hand).
        let src = Rgb8 {
            width: 4,
            height: 1,
            data: [0u8, 100, 200, 40]
                .iter()
                .flat_map(|&v| [v, v, v])
                .collect(),
        };
        let out = resize(&src, 2, 1, Filter::Bilinear);
        // out0: inputs 0..3 at (0.75, 0.75, 0.25) over 1.75 -> (0*.75+100*.75+200*.25)/1.75
        let o0 = (0.0 * 0.75 + 100.0 * 0.75 + 200.0 * 0.25) / 1.75;
        // out1: inputs 1..4 at (0.25, 0.75, 0.75) over 1.75
        let o1 = (100.0 * 0.25 + 200.0 * 0.75 + 40.0 * 0.75) / 1.75;
        assert_eq!(out.data[0], (o0 + 0.5) as u8);
        assert_eq!(out.data[3], (o1 + 0.5) as u8);
    }

    #[test]
    fn fit_letterboxes_the_short_side() {
        // 20x10 into 8x8: scale 0.4, inner 8x4, centred at y = 2.
        let out = fit(&solid(20, 10, [9, 9, 9]), 8, 8, Filter::Bilinear, [0, 0, 0]);
        for y in 0..8 {
            let v = out.data[(y * 8 + 3) * 3];
            assert_eq!(v, if (2..6).contains(&y) { 9 } else { 0 }, "row {y}");
        }
    }
}
