//! FEAT_DotProd kernels: a `dot` is one `sdot` (lane l += the four products
//! of bytes 4l..4l+4), exact in i32.

use core::arch::aarch64::*;

/// acc + the 16 products a[i] * b[i], four per lane (`sdot`).
#[target_feature(enable = "neon,dotprod")]
#[inline]
pub(super) fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` needs FEAT_DotProd, which this function's target
    // features (checked by the dispatcher before any call) provide; it
    // reads and writes only the three registers.
    unsafe {
        core::arch::asm!(
            "sdot {0:v}.4s, {1:v}.16b, {2:v}.16b",
            inout(vreg) acc,
            in(vreg) a,
            in(vreg) b,
            options(pure, nomem, nostack)
        );
    }
    acc
}

arm_quad_by_dot!("neon,dotprod");

arm_kernels!("neon,dotprod");

/// This level's kernel for weight type `t`, if it has one.
pub fn gemm_fn(t: GgmlType) -> Option<GemmFn> {
    base_gemm_fn(t)
}
