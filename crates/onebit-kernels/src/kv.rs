//! KV cache rows in the element types a cache may hold: f32, f16 (IEEE
//! half, rounded to nearest even) and q8_0 (GGML's block: 32 values, one f16
//! scale d = max|x| / 127, q = x * 127 / max|x| rounded ties to even, as the
//! matmuls quantize activations; stored here as two arrays, the quants and
//! the scales).
//!
//! Every stored element widens back to f32 exactly: an f16 widens exactly,
//! and a q8_0 element is d * q with d an f16 (11 significant bits) and |q| <=
//! 127 (7 bits), a product of at most 18 significant bits that one f32
//! multiplication gives without rounding. Attention over a cache is thus the
//! f32 attention over the widened cache, bit for bit.

use std::fmt;
use std::str::FromStr;

/// Elements per q8_0 block.
pub const Q8_0_BLOCK: usize = 32;

/// The element type of a KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    F32,
    /// Half the bytes of f32; llama.cpp's default cache type.
    #[default]
    F16,
    /// 34 bytes per 32 elements.
    Q8_0,
}

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes of `n` stored elements (`n` a multiple of the block for q8_0).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            KvType::F32 => 4 * n,
            KvType::F16 => 2 * n,
            KvType::Q8_0 => n + 2 * n.div_ceil(Q8_0_BLOCK),
        }
    }

    /// Whether heads of `head_dim` elements can be stored: q8_0 blocks must
    /// not straddle two heads. The error says what was expected.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), String> {
        if self == KvType::Q8_0 && !head_dim.is_multiple_of(Q8_0_BLOCK) {
            return Err(format!(
                "KV type q8_0 needs a head dimension that is a multiple of {Q8_0_BLOCK}, \
                 this model's is {head_dim}"
            ));
        }
        Ok(())
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<KvType, String> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown KV type {s:?}: expected f32, f16 or q8_0"))
    }
}

/// f32 to f16 bits, rounded to nearest even.
pub fn f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// f16 bits to f32 (exact).
pub fn f16_value(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

/// One q8_0 block with the activation quantizer of the matmuls
/// ([`crate::quant::quantize_q8_0`]: llama.cpp's x86 rule, id = 127 / max|x|,
/// ties to even): the quants into `q`, the scale's f16 bits returned.
pub fn quantize_q8_0_block(x: &[f32], q: &mut [i8]) -> u16 {
    use onebit_formats::blocks::layout::q8_0::{D, QS};
    let mut b = [0u8; 34];
    crate::quant::quantize_q8_0(x, &mut b);
    for (q, &c) in q.iter_mut().zip(&b[QS..QS + Q8_0_BLOCK]) {
        *q = c as i8;
    }
    u16::from_le_bytes([b[D], b[D + 1]])
}

/// The stored elements, row after row.
#[derive(Clone, Debug, PartialEq)]
enum Data {
    F32(Vec<f32>),
    F16(Vec<u16>),
    Q8_0 { q: Vec<i8>, d: Vec<u16> },
}

/// Rows of `width` elements (one position's K or V for all KV heads).
#[derive(Clone, Debug, PartialEq)]
pub struct KvRows {
    width: usize,
    rows: usize,
    data: Data,
}

/// A borrowed cache: the elements of row r, column c are at r * width + c.
#[derive(Clone, Copy, Debug)]
pub enum KvView<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    /// `d[i / 32]` scales `q[i]`.
    Q8_0 {
        q: &'a [i8],
        d: &'a [u16],
    },
}

impl KvView<'_> {
    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            KvView::F32(v) => v.len(),
            KvView::F16(v) => v.len(),
            KvView::Q8_0 { q, d } => q.len().min(d.len() * Q8_0_BLOCK),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element i widened to f32.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            KvView::F32(v) => v[i],
            KvView::F16(v) => f16_value(v[i]),
            KvView::Q8_0 { q, d } => f16_value(d[i / Q8_0_BLOCK]) * q[i] as f32,
        }
    }
}

impl KvRows {
    /// An empty cache of rows `width` wide; q8_0 needs `width` to be a
    /// multiple of the block (see [`KvType::check_head_dim`]).
    pub fn new(ty: KvType, width: usize) -> KvRows {
        assert!(
            ty != KvType::Q8_0 || width.is_multiple_of(Q8_0_BLOCK),
            "q8_0 KV rows of width {width}: checked at load"
        );
        let data = match ty {
            KvType::F32 => Data::F32(Vec::new()),
            KvType::F16 => Data::F16(Vec::new()),
            KvType::Q8_0 => Data::Q8_0 {
                q: Vec::new(),
                d: Vec::new(),
            },
        };
        KvRows {
            width,
            rows: 0,
            data,
        }
    }

    pub fn ty(&self) -> KvType {
        match self.data {
            Data::F32(_) => KvType::F32,
            Data::F16(_) => KvType::F16,
            Data::Q8_0 { .. } => KvType::Q8_0,
        }
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes the stored rows take.
    pub fn bytes(&self) -> usize {
        self.ty().bytes(self.rows * self.width)
    }

    pub fn view(&self) -> KvView<'_> {
        match &self.data {
            Data::F32(v) => KvView::F32(v),
            Data::F16(v) => KvView::F16(v),
            Data::Q8_0 { q, d } => KvView::Q8_0 { q, d },
        }
    }

    /// Room for `n` more rows without reallocating.
    pub fn reserve_rows(&mut self, n: usize) {
        let e = n * self.width;
        match &mut self.data {
            Data::F32(v) => v.reserve_exact(e),
            Data::F16(v) => v.reserve_exact(e),
            Data::Q8_0 { q, d } => {
                q.reserve_exact(e);
                d.reserve_exact(e / Q8_0_BLOCK);
            }
        }
    }

    /// Appends rows (a multiple of `width` values), converted to the type.
    /// The storage grows by a quarter at a time rather than doubling: after a
    /// long prompt, the first decoded token would otherwise leave the cache
    /// with twice the memory it uses.
    pub fn push(&mut self, x: &[f32]) {
        assert_eq!(x.len() % self.width.max(1), 0, "KvRows::push: row width");
        let n = x.len() / self.width.max(1);
        let (len, cap) = match &self.data {
            Data::F32(v) => (v.len(), v.capacity()),
            Data::F16(v) => (v.len(), v.capacity()),
            Data::Q8_0 { q, .. } => (q.len(), q.capacity()),
        };
        if cap - len < x.len() {
            self.reserve_rows(n.max(self.rows / 4));
        }
        match &mut self.data {
            Data::F32(v) => v.extend_from_slice(x),
            Data::F16(v) => v.extend(x.iter().map(|&f| f16_bits(f))),
            Data::Q8_0 { q, d } => {
                let at = q.len();
                q.resize(at + x.len(), 0);
                for (xb, qb) in x
                    .chunks_exact(Q8_0_BLOCK)
                    .zip(q[at..].chunks_exact_mut(Q8_0_BLOCK))
                {
                    d.push(quantize_q8_0_block(xb, qb));
                }
            }
        }
        self.rows += n;
    }

    /// Keeps the first `n` rows.
    pub fn truncate(&mut self, n: usize) {
        let n = n.min(self.rows);
        let e = n * self.width;
        match &mut self.data {
            Data::F32(v) => v.truncate(e),
            Data::F16(v) => v.truncate(e),
            Data::Q8_0 { q, d } => {
                q.truncate(e);
                d.truncate(e / Q8_0_BLOCK);
            }
        }
        self.rows = n;
    }

    /// A copy of the first `n` rows, allocated to their size.
    pub fn prefix(&self, n: usize) -> KvRows {
        let n = n.min(self.rows);
        let e = n * self.width;
        let data = match &self.data {
            Data::F32(v) => Data::F32(v[..e].to_vec()),
            Data::F16(v) => Data::F16(v[..e].to_vec()),
            Data::Q8_0 { q, d } => Data::Q8_0 {
                q: q[..e].to_vec(),
                d: d[..e / Q8_0_BLOCK].to_vec(),
            },
        };
        KvRows {
            width: self.width,
            rows: n,
            data,
        }
    }

    /// Row `r` widened to f32 (`out` is `width` long).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        let v = self.view();
        for (c, o) in out.iter_mut().enumerate().take(self.width) {
            *o = v.get(r * self.width + c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 (f16 keeps 10
        // fraction bits): ties go to the even one, 1.0 (0x3C00).
        assert_eq!(f16_bits(1.0 + 2f32.powi(-11)), 0x3C00);
        // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 (odd, 0x3C01) and
        // 1 + 2^-9 (even, 0x3C02): up to the even one.
        assert_eq!(f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02);
        // Just above the first tie rounds up, not to even.
        assert_eq!(f16_bits(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 0x3C01);
        // 65520 is halfway between 65504 (the largest f16) and 2^16: infinity.
        assert_eq!(f16_bits(65520.0), 0x7C00);
        assert_eq!(f16_bits(-2.0), 0xC000);
        // The smallest subnormal, 2^-24, and half of it (a tie to even: 0).
        assert_eq!(f16_bits(2f32.powi(-24)), 0x0001);
        assert_eq!(f16_bits(2f32.powi(-25)), 0x0000);
        for b in [0x3C00u16, 0x3C01, 0xC000, 0x0001, 0x7BFF] {
            assert_eq!(f16_bits(f16_value(b)), b);
        }
    }

    #[test]
    fn q8_0_block_by_hand() {
        // max |x| = 127 * 0.5: d = 0.5 exactly and id = 127 / 63.5 = 2;
        // x * id rounds ties to even (1.25 * 2 = 2.5 -> 2, -2.5 -> -2).
        let mut x = [0f32; 32];
        x[0] = 63.5;
        x[1] = 1.25;
        x[2] = -1.25;
        x[3] = -63.5;
        x[4] = 0.2;
        let mut q = [0i8; 32];
        let d = quantize_q8_0_block(&x, &mut q);
        assert_eq!(f16_value(d), 0.5);
        assert_eq!(&q[..5], &[127, 2, -2, -127, 0]);
        // All zeros: scale 0, quants 0.
        let d = quantize_q8_0_block(&[0.0; 32], &mut q);
        assert_eq!((d, q), (0, [0; 32]));
    }

    #[test]
    fn rows_push_truncate_prefix_per_type() {
        let x: Vec<f32> = (0..4 * 64).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        for ty in KvType::ALL {
            let mut r = KvRows::new(ty, 64);
            r.push(&x[..64]);
            r.push(&x[64..]);
            assert_eq!((r.rows(), r.ty()), (4, ty));
            assert_eq!(r.bytes(), ty.bytes(256));
            // Each row is stored as the type stores it, independently of
            // the rows pushed with it.
            let mut one = KvRows::new(ty, 64);
            one.push(&x[128..192]);
            let (mut a, mut b) = (vec![0f32; 64], vec![0f32; 64]);
            r.row_f32(2, &mut a);
            one.row_f32(0, &mut b);
            assert_eq!(a, b, "{ty}");
            let err = a
                .iter()
                .zip(&x[128..192])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // f16: half an ulp at |x| < 4 is 2^-10; q8_0: half a step, d / 2
            // = 3 / 254.
            let bound = match ty {
                KvType::F32 => 0.0,
                KvType::F16 => 2f32.powi(-10),
                KvType::Q8_0 => 3.0 / 254.0,
            };
            assert!(err <= bound, "{ty}: error {err} over {bound}");
            let p = r.prefix(3);
            r.truncate(3);
            assert_eq!(p, r.prefix(3));
            assert_eq!(r.rows(), 3);
            assert_eq!(r.view().len(), 3 * 64);
        }
        assert_eq!(KvType::Q8_0.bytes(64), 68);
        assert!(KvType::Q8_0.check_head_dim(48).is_err());
        assert!(KvType::F16.check_head_dim(48).is_ok());
        assert_eq!("q8_0".parse::<KvType>(), Ok(KvType::Q8_0));
        assert!("q4_0".parse::<KvType>().unwrap_err().contains("q4_0"));
    }
}
