//! Elementwise and per-row ops in f32, written so that a row's result depends
//! only on that row (batched prefill must equal one token at a time, bit for bit).
//!
//! The GLU activations use [`exp_fast`], an exp built only from operations
//! AVX2 has one instruction for (fused multiply-add, add, multiply, integer
//! shift), so the 8-lane path computes exactly what the scalar path does for
//! every element, wherever the element sits in a slice.

use crate::isa::Isa;
use crate::pool::Pool;

/// RMSNorm of one row: `x / sqrt(mean(x^2) + eps) * w`. The sum of squares is
/// accumulated in f64: cheap at these widths and independent of row order.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), w.len());
    let scale = rms_scale(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// RMSNorm in place.
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// `1 / sqrt(mean(x^2) + eps)`, the squares summed by [`sum4_f64`].
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss = sum4_f64(x, |v| (v as f64) * (v as f64));
    (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32
}

/// The sum of `f(v)` over `x` in f64: element i into lane i % 4 (so the adds
/// need not wait on each other), lanes added as (l0 + l2) + (l1 + l3).
pub(crate) fn sum4_f64(x: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0f64; 4];
    let chunks = x.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        *a += f(v);
    }
    (acc[0] + acc[2]) + (acc[1] + acc[3])
}

/// Inputs of [`exp_fast`] are clamped to this range (its result is then
/// within a few ulp of `exp` on it, and finite and normal at both ends).
const EXP_LO: f32 = -87.0;
const EXP_HI: f32 = 88.0;
/// 1.5 * 2^23: adding it rounds a value below 2^22 in magnitude to an integer
/// (to nearest, ties to even) and leaves that integer in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 in two parts (Cody and Waite): LN2_HI has few enough bits that n * LN2_HI is exact.
const LN2_HI: f32 = 355.0 / 512.0; // 0.693359375
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes' expf polynomial: e^r = 1 + r + r^2 * P(r) on |r| <= ln2 / 2.
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// e^x within a few ulp of `f32::exp` for x in [-87, 88]; 0 below it (where
/// e^x is denormal or less), e^88 above it, NaN for NaN. Every step is a
/// single IEEE operation with an AVX2 twin, in the same order as
/// `avx2::exp8`.
#[inline]
pub fn exp_fast(x: f32) -> f32 {
    let below = x < EXP_LO;
    // min then max in the operand order of vminps/vmaxps: a NaN x passes through.
    let x = if EXP_HI < x { EXP_HI } else { x };
    let x = if EXP_LO > x { EXP_LO } else { x };
    let t = x.mul_add(LOG2E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p.mul_add(r, c);
    }
    let e = p.mul_add(r * r, r) + 1.0;
    // 2^n from n's integer bits: n is in [-126, 127] after the clamp.
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let scale = f32::from_bits((ni.wrapping_add(127) << 23) as u32);
    if below {
        0.0
    } else {
        e * scale
    }
}

/// `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp_fast(-x))
}

/// -2 sqrt(2 / pi) and -2 sqrt(2 / pi) * 0.044715.
const GELU_A: f32 = -1.595_769;
const GELU_B: f32 = -0.071_354_814;

/// GELU, tanh approximation (what Gemma's `gelu_pytorch_tanh` computes):
/// `0.5 x (1 + tanh(u))`, u = sqrt(2/pi) (x + 0.044715 x^3), evaluated as the
/// equal `x / (1 + e^(-2u))`, which needs one exp and no cancellation for x < 0.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    let t = x * (x * x).mul_add(GELU_B, GELU_A);
    x / (1.0 + exp_fast(t))
}

/// gpt-oss's clamped SwiGLU: the gate's sigmoid gain and the clamp limit
/// (llama.cpp's `ggml_swiglu_oai` constants for `openai-moe`, from the
/// model's reference implementation).
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;
pub const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// The gate activation of a gated feed-forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GluAct {
    Silu,
    GeluTanh,
    /// gpt-oss: x = min(gate, 7), y = clamp(up, -7, 7),
    /// out = x sigmoid(1.702 x) (y + 1) ([`swiglu_oai`]).
    SwigluOai,
}

/// gpt-oss's gated unit on one (gate, up) pair: x = min(gate, 7) and y =
/// clamp(up, -7, 7) as C++'s `std::min` / `std::clamp` (a NaN stays NaN),
/// then `(x / (1 + e^(-1.702 x))) * (y + 1)`.
#[inline]
pub fn swiglu_oai(gate: f32, up: f32) -> f32 {
    let l = SWIGLU_OAI_LIMIT;
    let x = if l < gate { l } else { gate };
    let y = if up < -l {
        -l
    } else if l < up {
        l
    } else {
        up
    };
    (x / (1.0 + exp_fast(-(SWIGLU_OAI_ALPHA * x)))) * (y + 1.0)
}

/// `gate[i] = act(gate[i]) * up[i]` (scalar reference; [`swiglu_oai`]'s
/// own form for `SwigluOai`).
fn glu_scalar(act: GluAct, gate: &mut [f32], up: &[f32]) {
    let f: fn(f32) -> f32 = match act {
        GluAct::Silu => silu,
        GluAct::GeluTanh => gelu_tanh,
        GluAct::SwigluOai => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = swiglu_oai(*g, u);
            }
            return;
        }
    };
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = f(*g) * u;
    }
}

/// The level the SIMD ops here run at: [`Isa::best`] (so `ONEBIT_ISA`
/// forces them like every kernel), capped at the highest level with code
/// here (AVX2 on x86-64; other architectures run the scalar path).
pub fn level() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        Isa::best().min(Isa::Avx2)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Isa::Scalar
    }
}

/// `gate[i] = act(gate[i]) * up[i]`, eight lanes at a time where AVX2 runs;
/// the same bits as the scalar path for every element.
pub fn glu(act: GluAct, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "glu: gate and up widths");
    #[cfg(target_arch = "x86_64")]
    if level() >= Isa::Avx2 {
        // SAFETY: level() >= Avx2 means AVX2, FMA and F16C were detected.
        return unsafe { avx2::glu(act, gate, up) };
    }
    glu_scalar(act, gate, up)
}

/// Elements per parallel chunk of an elementwise op: big enough that the
/// pool's dispatch is noise, small enough to split a prefill's rows evenly.
const PAR_CHUNK: usize = 16 * 1024;

/// [`glu`] over the pool, in chunks of whole elements (the result does not
/// depend on the split).
pub fn glu_par(pool: &Pool, act: GluAct, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "glu: gate and up widths");
    if gate.len() <= PAR_CHUNK || pool.threads() == 1 {
        return glu(act, gate, up);
    }
    let parts: Vec<std::sync::Mutex<(&mut [f32], &[f32])>> = gate
        .chunks_mut(PAR_CHUNK)
        .zip(up.chunks(PAR_CHUNK))
        .map(std::sync::Mutex::new)
        .collect();
    pool.for_each_chunk(parts.len(), |i| {
        let mut part = parts[i].lock().unwrap_or_else(|e| e.into_inner());
        let (g, u) = &mut *part;
        glu(act, g, u);
    });
}

/// `x[i] = gelu_tanh(x[i])`, eight lanes at a time where AVX2 runs (the
/// same bits as [`gelu_tanh`] for every element).
pub fn gelu_tanh_inplace(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if level() >= Isa::Avx2 {
        // SAFETY: level() >= Avx2 means AVX2, FMA and F16C were detected.
        return unsafe { avx2::gelu(x) };
    }
    x.iter_mut().for_each(|v| *v = gelu_tanh(*v));
}

/// [`gelu_tanh_inplace`] over the pool, in chunks of whole elements (the
/// result does not depend on the split): a vision tower's MLP activation.
pub fn gelu_tanh_par(pool: &Pool, x: &mut [f32]) {
    if x.len() <= PAR_CHUNK || pool.threads() == 1 {
        return gelu_tanh_inplace(x);
    }
    let parts: Vec<std::sync::Mutex<&mut [f32]>> =
        x.chunks_mut(PAR_CHUNK).map(std::sync::Mutex::new).collect();
    pool.for_each_chunk(parts.len(), |i| {
        let mut part = parts[i].lock().unwrap_or_else(|e| e.into_inner());
        gelu_tanh_inplace(&mut part);
    });
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::*;
    use core::arch::x86_64::*;

    /// [`exp_fast`] on eight lanes: the same operations in the same order.
    #[target_feature(enable = "avx2,fma")]
    pub fn exp8(x: __m256) -> __m256 {
        // Ordered compare: false for NaN, which then stays NaN below.
        let below = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_LO));
        // vminps(a, b) returns b when either is NaN: (HI, x) keeps a NaN x.
        let x = _mm256_min_ps(_mm256_set1_ps(EXP_HI), x);
        let x = _mm256_max_ps(_mm256_set1_ps(EXP_LO), x);
        let magic = _mm256_set1_ps(ROUND_MAGIC);
        let t = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), magic);
        let n = _mm256_sub_ps(t, magic);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_P[0]);
        for &c in &EXP_P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let e = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let ni = _mm256_sub_epi32(
            _mm256_castps_si256(t),
            _mm256_set1_epi32(ROUND_MAGIC.to_bits() as i32),
        );
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(ni, _mm256_set1_epi32(127)));
        _mm256_andnot_ps(below, _mm256_mul_ps(e, _mm256_castsi256_ps(bits)))
    }

    /// `x[i] = exp_fast(x[i] - m)`.
    #[target_feature(enable = "avx2,fma")]
    pub fn exp_sub(x: &mut [f32], m: f32) {
        let n8 = x.len() / 8 * 8;
        let mv = _mm256_set1_ps(m);
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= x.len().
            unsafe {
                let p = x.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, exp8(_mm256_sub_ps(_mm256_loadu_ps(p), mv)));
            }
            i += 8;
        }
        for v in &mut x[n8..] {
            *v = exp_fast(*v - m);
        }
    }

    /// `out[i] = exp_fast((x[i] - m) * s)`, as [`super::exp_scaled`]: the
    /// subtraction and the product are single IEEE operations, as there.
    #[target_feature(enable = "avx2,fma")]
    pub fn exp_scaled(x: &[f32], m: f32, s: f32, out: &mut [f32]) {
        let n = x.len().min(out.len());
        let n8 = n / 8 * 8;
        let (mv, sv) = (_mm256_set1_ps(m), _mm256_set1_ps(s));
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= both lengths.
            unsafe {
                let v = _mm256_loadu_ps(x.as_ptr().add(i));
                let e = exp8(_mm256_mul_ps(_mm256_sub_ps(v, mv), sv));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), e);
            }
            i += 8;
        }
        for (o, &v) in out[n8..n].iter_mut().zip(&x[n8..n]) {
            *o = exp_fast((v - m) * s);
        }
    }

    /// [`silu`] on eight lanes.
    #[target_feature(enable = "avx2,fma")]
    pub fn silu8(x: __m256) -> __m256 {
        let e = exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0)));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    /// [`gelu_tanh`] on eight lanes.
    #[target_feature(enable = "avx2,fma")]
    pub fn gelu8(x: __m256) -> __m256 {
        let inner = _mm256_fmadd_ps(
            _mm256_mul_ps(x, x),
            _mm256_set1_ps(GELU_B),
            _mm256_set1_ps(GELU_A),
        );
        let e = exp8(_mm256_mul_ps(x, inner));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    /// [`swiglu_oai`] on eight lanes. `vminps(a, b)` is `a < b ? a : b`
    /// and `vmaxps(a, b)` `a > b ? a : b`, so (limit, x) and (-limit, ..)
    /// in that order are `std::min` and `std::clamp`, NaN kept.
    #[target_feature(enable = "avx2,fma")]
    pub fn swiglu_oai8(g: __m256, u: __m256) -> __m256 {
        let l = _mm256_set1_ps(SWIGLU_OAI_LIMIT);
        let x = _mm256_min_ps(l, g);
        let y = _mm256_max_ps(_mm256_set1_ps(-SWIGLU_OAI_LIMIT), _mm256_min_ps(l, u));
        let ax = _mm256_mul_ps(_mm256_set1_ps(SWIGLU_OAI_ALPHA), x);
        let e = exp8(_mm256_xor_ps(ax, _mm256_set1_ps(-0.0)));
        let glu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_mul_ps(glu, _mm256_add_ps(y, _mm256_set1_ps(1.0)))
    }

    /// `x[i] = gelu_tanh(x[i])`.
    #[target_feature(enable = "avx2,fma")]
    pub fn gelu(x: &mut [f32]) {
        let n8 = x.len() / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= x.len().
            unsafe {
                let p = x.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, gelu8(_mm256_loadu_ps(p)));
            }
            i += 8;
        }
        for v in &mut x[n8..] {
            *v = gelu_tanh(*v);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn glu(act: GluAct, gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let n8 = n / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= len of both slices.
            unsafe {
                let p = gate.as_mut_ptr().add(i);
                let g = _mm256_loadu_ps(p);
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                let out = match act {
                    GluAct::Silu => _mm256_mul_ps(silu8(g), u),
                    GluAct::GeluTanh => _mm256_mul_ps(gelu8(g), u),
                    GluAct::SwigluOai => swiglu_oai8(g, u),
                };
                _mm256_storeu_ps(p, out);
            }
            i += 8;
        }
        glu_scalar(act, &mut gate[n8..n], &up[n8..n]);
    }
}

/// [`exp_fast`] on sixteen lanes, for kernels compiled at the AVX-512 level
/// (the attention tile's softmax): the same operations in the same order
/// as [`exp_fast`] and `avx2::exp8`, so the same bits per lane.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::*;
    use core::arch::x86_64::*;

    /// `exp_fast` of each lane.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    pub fn exp16(x: __m512) -> __m512 {
        // Ordered compare: false for NaN, which then stays NaN below.
        let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_LO));
        // vminps(a, b) returns b when either is NaN: (HI, x) keeps a NaN x.
        let x = _mm512_min_ps(_mm512_set1_ps(EXP_HI), x);
        let x = _mm512_max_ps(_mm512_set1_ps(EXP_LO), x);
        let magic = _mm512_set1_ps(ROUND_MAGIC);
        let t = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), magic);
        let n = _mm512_sub_ps(t, magic);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_P[0]);
        for &c in &EXP_P[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let e = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        let ni = _mm512_sub_epi32(
            _mm512_castps_si512(t),
            _mm512_set1_epi32(ROUND_MAGIC.to_bits() as i32),
        );
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(ni, _mm512_set1_epi32(127)));
        // +0.0 where x was below the range, as `exp_fast`'s `0.0`.
        _mm512_maskz_mov_ps(!below, _mm512_mul_ps(e, _mm512_castsi512_ps(bits)))
    }
}

/// In-place softmax: max-subtracted, [`exp_fast`] (eight lanes at a time
/// where AVX2 runs, the same bits), the sum in four f64 lanes.
pub fn softmax(x: &mut [f32]) {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.max(v);
        }
    }
    for (l, &v) in lanes.iter_mut().zip(tail) {
        *l = l.max(v);
    }
    let max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    exp_sub(x, max);
    let sum = sum4_f64(x, |v| v as f64);
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `x[i] = exp_fast(x[i] - m)`.
pub(crate) fn exp_sub(x: &mut [f32], m: f32) {
    #[cfg(target_arch = "x86_64")]
    if level() >= Isa::Avx2 {
        // SAFETY: level() >= Avx2 means AVX2, FMA and F16C were detected.
        return unsafe { avx2::exp_sub(x, m) };
    }
    for v in x.iter_mut() {
        *v = exp_fast(*v - m);
    }
}

/// `out[i] = exp_fast((x[i] - m) * s)`: the unnormalized weights of a
/// softmax of `x` at temperature `1 / s` shifted by `m` (the sampler's, with
/// `m` the largest logit), eight lanes at a time where AVX2 runs; the same
/// bits as that scalar expression for every element.
pub fn exp_scaled(x: &[f32], m: f32, s: f32, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "exp_scaled: input and output lengths");
    #[cfg(target_arch = "x86_64")]
    if level() >= Isa::Avx2 {
        // SAFETY: level() >= Avx2 means AVX2, FMA and F16C were detected.
        return unsafe { avx2::exp_scaled(x, m, s, out) };
    }
    for (o, &v) in out.iter_mut().zip(x) {
        *o = exp_fast((v - m) * s);
    }
}

/// Logit soft-capping: `cap * tanh(x / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_by_hand() {
        // x = [3, 4]: mean square = 12.5, rms = 3.5355339; w = [1, 2]
        let mut out = [0.0; 2];
        rmsnorm(&[3.0, 4.0], &[1.0, 2.0], 0.0, &mut out);
        assert!((out[0] - 3.0 / 3.535_534).abs() < 1e-6);
        assert!((out[1] - 8.0 / 3.535_534).abs() < 1e-6);
    }

    #[test]
    fn gelu_and_silu_known_values() {
        // Worked out by hand (to 9 digits) from the definitions:
        // gelu_tanh(x) = 0.5 x (1 + tanh(0.7978846 (x + 0.044715 x^3))),
        // silu(x) = x / (1 + e^-x).
        let gelu: [(f32, f64); 6] = [
            (1.0, 0.841_191_99),
            (-1.0, -0.158_808_01),
            (2.0, 1.954_597_7),
            (-3.0, -0.003_637_392_1),
            (0.5, 0.345_714_01),
            (10.0, 10.0),
        ];
        for (x, want) in gelu {
            let got = gelu_tanh(x) as f64;
            assert!(
                (got - want).abs() <= 2e-7 * want.abs().max(1e-3),
                "gelu_tanh({x}) = {got}, want {want}"
            );
        }
        let silu_v: [(f32, f64); 5] = [
            (1.0, 0.731_058_58),
            (-1.0, -0.268_941_42),
            (2.0, 1.761_594_2),
            (-3.0, -0.142_277_62),
            (10.0, 9.999_546),
        ];
        for (x, want) in silu_v {
            let got = silu(x) as f64;
            assert!(
                (got - want).abs() <= 2e-7 * want.abs(),
                "silu({x}) = {got}, want {want}"
            );
        }
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert_eq!(silu(0.0), 0.0);
        // Far tails: zero (of x's sign) and x itself, no NaN from inf / inf.
        assert!(gelu_tanh(-100.0).abs() < 1e-30 && silu(-200.0).abs() < 1e-30);
        assert_eq!(gelu_tanh(100.0), 100.0);
        assert_eq!(silu(200.0), 200.0);
        assert!(gelu_tanh(f32::NAN).is_nan() && silu(f32::NAN).is_nan());
    }

    /// Distance in ulps between two finite f32 of the same sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_fast_is_within_a_few_ulp_over_its_range() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = (x as f64).exp() as f32;
            worst = worst.max(ulps(exp_fast(x), want));
            x += 0.000_731;
        }
        assert!(worst <= 2, "exp_fast off by {worst} ulp");
        assert_eq!(exp_fast(0.0), 1.0);
    }

    #[test]
    fn fast_activations_track_exact_tanh_and_exp_over_a_sweep() {
        // gelu_tanh against 0.5 x (1 + tanh(u)) in f64, and silu against f64:
        // relative error of a few ulp wherever the result is not denormal.
        let gelu64 = |x: f64| {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x * x * x);
            // 0.5 x (1 + tanh(u)), written without f64's own cancellation at x << 0.
            x / (1.0 + (-2.0 * u).exp())
        };
        let (mut worst_g, mut worst_s) = (0f64, 0f64);
        let mut x = -12.0f32;
        while x <= 12.0 {
            let g = gelu64(x as f64);
            if g.abs() > 1e-30 {
                // The exponent -2u takes three f32 roundings (a relative
                // 1.8e-7 at most), which move e^(-2u) by a relative 1.8e-7 |2u|:
                // any f32 evaluation of the formula pays that at x << 0.
                let u2 = 2.0
                    * (2.0 / std::f64::consts::PI).sqrt()
                    * (x as f64)
                    * (1.0 + 0.044_715 * (x * x) as f64);
                let rel = (gelu_tanh(x) as f64 - g).abs() / g.abs();
                if rel / (1.0 + 0.25 * u2.abs()) > 4e-7 {
                    eprintln!("x {x} rel {rel:e} u2 {u2}");
                }
                worst_g = worst_g.max(rel / (1.0 + 0.5 * u2.abs()));
            }
            let s = x as f64 / (1.0 + (-(x as f64)).exp());
            if s != 0.0 {
                worst_s = worst_s.max((silu(x) as f64 - s).abs() / s.abs());
            }
            x += 0.000_37;
        }
        // 5e-7 is about 4 ulp of f32.
        assert!(worst_g < 5e-7, "gelu_tanh relative error {worst_g:e}");
        assert!(worst_s < 5e-7, "silu relative error {worst_s:e}");
        // The tanh it stands for: 2 sigmoid(2u) - 1 against f32::tanh where
        // that difference does not cancel (|tanh| >= 0.5).
        let mut worst_t = 0;
        let mut u = -9.0f32;
        while u <= 9.0 {
            let t = 2.0 / (1.0 + exp_fast(-2.0 * u)) - 1.0;
            if u.tanh().abs() >= 0.5 {
                worst_t = worst_t.max(ulps(t, u.tanh()));
            }
            u += 0.000_91;
        }
        assert!(worst_t <= 4, "tanh via exp_fast off by {worst_t} ulp");
    }

    #[test]
    fn exp_and_softmax_simd_equal_scalar() {
        let f = |i: usize| ((i * 7919 % 10007) as f32 / 10007.0 - 0.5) * 240.0;
        let mut x: Vec<f32> = (0..1003).map(f).collect();
        x[1] = f32::NAN;
        x[2] = f32::INFINITY;
        x[3] = f32::NEG_INFINITY;
        x[4] = -85.5;
        x[5] = -85.500_01;
        let want: Vec<f32> = x.iter().map(|&v| exp_fast(v - 1.5)).collect();
        assert_eq!(want[3], 0.0);
        assert_eq!(want[5], 0.0);
        assert!(want[4] > 0.0 && want[1].is_nan());
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx2.supported() {
            for start in 0..9 {
                let mut got = x[start..].to_vec();
                // SAFETY: Avx2.supported() means AVX2, FMA and F16C were detected.
                unsafe { avx2::exp_sub(&mut got, 1.5) };
                let same = got
                    .iter()
                    .zip(&want[start..])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "AVX2 exp differs from scalar at offset {start}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx512.supported() {
            use core::arch::x86_64::*;
            for c in x.chunks_exact(16) {
                let mut got = [0f32; 16];
                // SAFETY: Avx512.supported() means AVX-512F, AVX2 and FMA
                // were detected; `c` and `got` hold 16 f32 each.
                unsafe {
                    let v = _mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), _mm512_set1_ps(1.5));
                    _mm512_storeu_ps(got.as_mut_ptr(), avx512::exp16(v));
                }
                for (g, &v) in got.iter().zip(c) {
                    let w = exp_fast(v - 1.5);
                    assert_eq!(g.to_bits(), w.to_bits(), "AVX-512 exp of {v} - 1.5");
                }
            }
        }
        // softmax against f64, on values a softmax sees.
        let mut s: Vec<f32> = (0..77).map(|i| f(i) / 20.0).collect();
        let m = s
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
        // From the f32 differences x - max, as softmax rounds them.
        let e: Vec<f64> = s.iter().map(|&v| ((v - m as f32) as f64).exp()).collect();
        let z: f64 = e.iter().sum();
        softmax(&mut s);
        for (got, e) in s.iter().zip(&e) {
            assert!(
                (*got as f64 - e / z).abs() <= 4e-7 * (e / z),
                "{got} vs {}",
                e / z
            );
        }
    }

    /// `gelu_tanh_inplace` (AVX2 where it runs) and `gelu_tanh_par` give
    /// `gelu_tanh`'s bits for every element, every offset into the lanes.
    #[test]
    fn gelu_inplace_and_parallel_equal_the_scalar_function() {
        let n = 40_000 + 5;
        let mut x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 10007) as f32 / 10007.0 - 0.5) * 24.0)
            .collect();
        x[3] = f32::NAN;
        x[4] = f32::INFINITY;
        x[5] = f32::NEG_INFINITY;
        x[6] = -0.0;
        x[7] = 1e-40;
        let want: Vec<u32> = x.iter().map(|&v| gelu_tanh(v).to_bits()).collect();
        for start in 0..9 {
            let mut got = x[start..].to_vec();
            gelu_tanh_inplace(&mut got);
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want[start..], "offset {start} at {:?}", level());
        }
        for threads in [1, 2, 3] {
            let mut got = x.clone();
            gelu_tanh_par(&Pool::new(threads), &mut got);
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{threads} threads");
        }
        eprintln!("gelu ran at {:?}; {}", level(), Isa::levels_line());
    }

    /// `exp_scaled` (AVX2 where it runs) gives the scalar expression's bits
    /// for every element and every offset into the lanes, masked (-inf)
    /// logits included, and its weights are a softmax's by arithmetic:
    /// logits ln 1, ln 2, ln 4 at temperature 1 weigh 1/4, 1/2, 1 against
    /// the largest, and at temperature 2 their square roots.
    #[test]
    fn exp_scaled_equals_the_scalar_expression_and_weighs_a_softmax() {
        let n = 4_096 + 5;
        let mut x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 10007) as f32 / 10007.0 - 0.5) * 60.0)
            .collect();
        x[3] = f32::NEG_INFINITY;
        x[4] = 30.0;
        x[5] = -0.0;
        for (m, s) in [(30.0f32, 1.0f32), (30.0, 0.7), (31.5, 2.5), (30.0, 1e-3)] {
            let want: Vec<u32> = x.iter().map(|&v| exp_fast((v - m) * s).to_bits()).collect();
            for start in 0..9 {
                let mut got = vec![f32::NAN; n - start];
                exp_scaled(&x[start..], m, s, &mut got);
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(
                    got,
                    want[start..],
                    "offset {start}, m {m}, s {s} at {:?}",
                    level()
                );
            }
        }
        let l = [1f32.ln(), 2f32.ln(), 4f32.ln(), f32::NEG_INFINITY];
        for (s, want) in [
            (1.0f32, [0.25f64, 0.5, 1.0, 0.0]),
            (0.5, [0.5, 0.5f64.sqrt(), 1.0, 0.0]),
        ] {
            let mut got = [f32::NAN; 4];
            exp_scaled(&l, 4f32.ln(), s, &mut got);
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (*g as f64 - w).abs() <= 1e-6 * w.max(1e-30),
                    "{got:?} against {want:?}"
                );
            }
        }
        eprintln!("exp_scaled ran at {:?}; {}", level(), Isa::levels_line());
    }

    #[test]
    fn glu_simd_equals_scalar_and_parallel_equals_serial() {
        let n = 40_000 + 5;
        let f = |i: usize| ((i * 7919 % 10007) as f32 / 10007.0 - 0.5) * 24.0;
        let mut gate: Vec<f32> = (0..n).map(f).collect();
        gate[3] = f32::NAN;
        gate[4] = f32::INFINITY;
        gate[5] = f32::NEG_INFINITY;
        gate[6] = -0.0;
        gate[7] = 1e-40;
        // Up values mostly within +-1.7, every 5th within +-12 (past
        // SwigluOai's clamp at 7), and the edge values.
        let mut up: Vec<f32> = (0..n)
            .map(|i| f(i + 17) / if i % 5 == 0 { 1.0 } else { 7.0 })
            .collect();
        up[8] = f32::NAN;
        up[9] = f32::INFINITY;
        up[10] = -7.0;
        gate[11] = 7.0;
        for act in [GluAct::Silu, GluAct::GeluTanh, GluAct::SwigluOai] {
            let mut want = gate.clone();
            glu_scalar(act, &mut want, &up);
            // Element by element through the public scalar functions.
            let one = |g: f32, u: f32| match act {
                GluAct::Silu => silu(g) * u,
                GluAct::GeluTanh => gelu_tanh(g) * u,
                GluAct::SwigluOai => swiglu_oai(g, u),
            };
            for i in 0..n {
                assert_eq!(
                    one(gate[i], up[i]).to_bits(),
                    want[i].to_bits(),
                    "{act:?} {i}"
                );
            }
            #[cfg(target_arch = "x86_64")]
            if Isa::Avx2.supported() {
                // Every offset, so each element meets every lane and the tail.
                for start in 0..9 {
                    let mut got = gate[start..].to_vec();
                    // SAFETY: Avx2.supported() means AVX2, FMA and F16C were detected.
                    unsafe { avx2::glu(act, &mut got, &up[start..]) };
                    let same = got
                        .iter()
                        .zip(&want[start..])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{act:?}: AVX2 differs from scalar at offset {start}");
                }
            }
            for threads in [1, 2, 3] {
                let pool = Pool::new(threads);
                let mut got = gate.clone();
                glu_par(&pool, act, &mut got, &up);
                assert!(got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }

    #[test]
    fn swiglu_oai_by_arithmetic() {
        // (min(g, 7) * sigmoid(1.702 * min(g, 7))) * (clamp(u, -7, 7) + 1),
        // in f64; exp_fast is within a few ulp, so 1e-6 relative.
        let want = |g: f64, u: f64| {
            let x = g.min(7.0);
            let y = u.clamp(-7.0, 7.0);
            x / (1.0 + (-1.702 * x).exp()) * (y + 1.0)
        };
        for (g, u) in [
            (1.0, 2.0),
            (10.0, -9.0),
            (-3.0, 100.0),
            (0.5, -1.0),
            (7.5, 6.5),
            (-20.0, 1.0),
        ] {
            let got = swiglu_oai(g as f32, u as f32) as f64;
            let w = want(g, u);
            assert!(
                (got - w).abs() <= 2e-6 * w.abs().max(1e-30),
                "({g}, {u}): {got} vs {w}"
            );
        }
        // Clamped: a gate past 7 is 7; an up past +-7 is +-7, so up = -1
        // and up = -1000 differ (y + 1 = 0 versus -6).
        assert_eq!(swiglu_oai(100.0, 1.0), swiglu_oai(7.0, 1.0));
        assert_eq!(swiglu_oai(2.0, -1.0), 0.0);
        assert_eq!(swiglu_oai(2.0, -1000.0), swiglu_oai(2.0, -7.0));
        assert!(swiglu_oai(f32::NAN, 1.0).is_nan() && swiglu_oai(1.0, f32::NAN).is_nan());
    }

    #[test]
    fn softmax_sums_to_one_and_survives_large_inputs() {
        let mut x = [1000.0, 1000.0, -1000.0];
        softmax(&mut x);
        assert!((x[0] - 0.5).abs() < 1e-6 && (x[1] - 0.5).abs() < 1e-6 && x[2] == 0.0);
    }
}
