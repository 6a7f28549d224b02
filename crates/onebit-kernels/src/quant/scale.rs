//! The scale of a Q8_0/Q8_1 activation block from its largest magnitude, in
//! one place for every quantizer (the scalar and AVX2 ones in `act.rs`, the
//! NEON ones in `arm/act.rs`), so they all give the same bits. A leaf: it
//! imports nothing from the quantizers.

use half::f16;

/// The largest finite f16, the scale a Q8_0/Q8_1 block saturates to.
pub const F16_MAX: f32 = 65504.0;

/// (d before f16 rounding, multiplier) of a Q8_0/Q8_1 block with this amax.
#[inline]
pub(crate) fn q8_scales(amax: f32) -> (f32, f32) {
    let mut d = amax / 127.0;
    let id = if f16::from_f32(d).is_infinite() {
        // amax/127 does not fit an f16 scale: saturate the scale and the codes.
        d = F16_MAX;
        1.0 / F16_MAX
    } else if amax == 0.0 {
        0.0
    } else {
        // Not finite only when amax is subnormal; then d rounds to 0 anyway.
        let id = 127.0 / amax;
        if id.is_finite() {
            id
        } else {
            0.0
        }
    };
    (d, id)
}
