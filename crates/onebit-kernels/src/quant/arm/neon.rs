//! Base Advanced SIMD kernels (every aarch64 CPU): the 16 products of a
//! `dot` are formed as i16 (`smull`, `smull2`; |i8 x i8| <= 2^14 fits) and
//! added in pairs into the i32 lanes (`sadalp`), exactly.

use core::arch::aarch64::*;

/// acc + the 16 products a[i] * b[i], spread over the four lanes.
#[target_feature(enable = "neon")]
#[inline]
fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

arm_quad_by_dot!("neon");

arm_kernels!("neon");

/// This level's kernel for weight type `t`, if it has one.
pub fn gemm_fn(t: GgmlType) -> Option<GemmFn> {
    base_gemm_fn(t)
}
