//! The entry to the kernel bodies, written once over a level's primitives
//! and instantiated by `avx2.rs` and `avx512.rs` with their
//! `#[target_feature]` set: the tile drivers, the wide kernels' cache-block
//! sizes, and [`simd_kernels!`], which holds the level's dispatch tables and
//! expands each family's macro (`shared.rs`, `one_token.rs`, `k_quants.rs`,
//! `rows.rs`, `wide.rs`, `wide_k.rs`) into the level's module, so every family sees
//! the others' items and the level's primitives by name.
//!
//! Every function here is an `unsafe fn` with the level's target features:
//! callers must run on a CPU with those features (the dispatcher checks them
//! once, see [`super::Isa::supported`]) and pass in-bounds pointers as
//! [`super::GemmFn`] describes. Reads are unaligned loads within the operand
//! slices; the only writes are the `out` elements of the tile.

/// Runs `$tile::<R, T, ...>` over nrows x ntok in TR x TT tiles and
/// 1-row / 1-token edges.
macro_rules! drive {
    ($tile:ident, $ops:expr, $nrows:expr, $ntok:expr, $out:expr, $os:expr $(, $g:expr)*) => {{
        let (ops, nrows, ntok, out, os) = ($ops, $nrows, $ntok, $out, $os);
        let mut r = 0;
        while r + TR <= nrows {
            let mut t = 0;
            while t + TT <= ntok {
                $tile::<TR, TT $(, $g)*>(ops, r, t, out, os);
                t += TT;
            }
            while t < ntok {
                $tile::<TR, 1 $(, $g)*>(ops, r, t, out, os);
                t += 1;
            }
            r += TR;
        }
        while r < nrows {
            let mut t = 0;
            while t + TT <= ntok {
                $tile::<1, TT $(, $g)*>(ops, r, t, out, os);
                t += TT;
            }
            while t < ntok {
                $tile::<1, 1 $(, $g)*>(ops, r, t, out, os);
                t += 1;
            }
            r += 1;
        }
    }};
}

/// Runs `$call` with `$t` the first token of each tile and `$T` (a const)
/// its width over tokens `0..$ntok`: tiles of `TT` tokens (or first of a
/// wider constant `$w`), then of 2, then one, so no token runs alone unless one is left (the few-row kernels:
/// each tile decodes a weight group once for all its tokens).
macro_rules! token_tiles {
    ($ntok:expr, |$t:ident, $T:ident| $call:expr) => {
        token_tiles!($ntok, TT, |$t, $T| $call)
    };
    // Tiles of the constant `$w` tokens first, then of TT (when narrower).
    ($ntok:expr, $w:ident, |$t:ident, $T:ident| $call:expr) => {{
        let ntok = $ntok;
        let mut $t = 0;
        while $w > TT && $t + $w <= ntok {
            {
                const $T: usize = $w;
                $call;
            }
            $t += $w;
        }
        while $t + TT <= ntok {
            {
                const $T: usize = TT;
                $call;
            }
            $t += TT;
        }
        while $t + 2 <= ntok {
            {
                const $T: usize = 2;
                $call;
            }
            $t += 2;
        }
        if $t < ntok {
            const $T: usize = 1;
            $call;
        }
    }};
}

/// Runs a wide kernel in cache blocks: a block of rows (a multiple of TR,
/// about `WIDE_W_BYTES` once expanded) is expanded by `$expand` into a
/// buffer of `$ws` bytes per row, each weight row once per call; then, a
/// block of tokens at a time (a multiple of TT, about `WIDE_A_BYTES` of
/// activations, so they stay in L2 while every row tile of the block reads
/// them), `$tile::<R, T, K>` runs each TR-row tile (single rows at the edge)
/// against every TT-token tile (single tokens at the edge). An output's
/// value does not depend on the blocks: every tile computes each of its
/// elements with the same operations.
macro_rules! drive_wide {
    ($expand:ident, $tile:ident, $k:expr, $ops:expr, $nrows:expr, $ntok:expr, $out:expr, $os:expr, $ws:expr, $n:expr) => {{
        let (ops, nrows, ntok, out, os, ws, n) = ($ops, $nrows, $ntok, $out, $os, $ws, $n);
        let rb = (super::body::WIDE_W_BYTES / ws.max(1) / TR).max(1) * TR;
        let tb = (super::body::WIDE_A_BYTES / ops.arb.max(1) / TT).max(1) * TT;
        let mut buf = vec![0u8; rb.min(nrows) * ws];
        let bp = buf.as_mut_ptr();
        let mut r_blk = 0;
        while r_blk < nrows {
            let r_end = (r_blk + rb).min(nrows);
            for r in r_blk..r_end {
                $expand::<{ $k }>(ops, nrows, r, bp.add((r - r_blk) * ws));
            }
            let mut t_blk = 0;
            while t_blk < ntok {
                let t_end = (t_blk + tb).min(ntok);
                let mut r = r_blk;
                while r < r_end {
                    let rr = (r_end - r).min(TR);
                    let w0 = bp.add((r - r_blk) * ws);
                    if rr == TR {
                        let mut t = t_blk;
                        while t + TT <= t_end {
                            $tile::<TR, TT, { $k }>(w0, ws, ops, n, r, t, out, os);
                            t += TT;
                        }
                        while t < t_end {
                            $tile::<TR, 1, { $k }>(w0, ws, ops, n, r, t, out, os);
                            t += 1;
                        }
                    } else {
                        for i in 0..rr {
                            let w = w0.add(i * ws);
                            let mut t = t_blk;
                            while t + TT <= t_end {
                                $tile::<1, TT, { $k }>(w, ws, ops, n, r + i, t, out, os);
                                t += TT;
                            }
                            while t < t_end {
                                $tile::<1, 1, { $k }>(w, ws, ops, n, r + i, t, out, os);
                                t += 1;
                            }
                        }
                    }
                    r += rr;
                }
                t_blk = t_end;
            }
            r_blk = r_end;
        }
    }};
}

/// Expanded weight bytes per block of rows in the wide kernels (L2-sized,
/// with the activation block beside it).
pub(super) const WIDE_W_BYTES: usize = 192 * 1024;
/// Activation bytes per block of tokens in the wide kernels.
pub(super) const WIDE_A_BYTES: usize = 96 * 1024;
/// Bytes of one expanded super-block of a group of 8 interleaved Q4_K rows
/// in the wide interleaved kernel (`expand_q4_kx8`): 64 code vectors, then
/// per sub-block the scales as i32 and as i16 pairs and the mins as i16
/// pairs, then d and dmin as f32.
pub(super) const WIDE_KX8: usize = 2880;
/// The same for Q6_K (`expand_q6_kx8`): 64 code vectors, the 16 scales as
/// i32 and as i16 pairs, 32 x the scales as i16 pairs, d as f32.
pub(super) const WIDE_Q6X8: usize = 3360;

/// Instantiates the kernels. Expects in scope: `FEAT`-enabled primitives
/// `dp(acc, u8s, i8s)`, `dpa(acc, u8s, i8s)` (the same sum, the product
/// added to `acc` last: the one-token kernels' form), `dp16(acc, i16s, i16s)`, `q8_prep(w)`,
/// `q8_pair(acc, prepped, y)` (the exact i8 x i8 dot product), `expand_bits(u32)`,
/// `sel_bits(x, sel)` (0x10 in the bytes where `x` has `sel`'s one bit),
/// the constant `Q8_BIAS` (whether the wide Q8_0 kernel may sum (w + 128) * y
/// in i32), and the tile shape `TR` x `TT`.
macro_rules! simd_kernels {
    ($feat:literal) => {
        use onebit_formats::GgmlType;

        use super::{GemmFn, Operands};
        use crate::quant::scalar::reduce8;

        /// This level's kernel for weight type `t`, if it has one.
        pub fn gemm_fn(t: GgmlType) -> Option<GemmFn> {
            let f: GemmFn = match t {
                GgmlType::Q4_0 => gemm_qx8::<0>,
                GgmlType::Q4_1 => gemm_qx8::<1>,
                GgmlType::Q5_0 => gemm_qx8::<2>,
                GgmlType::Q8_0 => gemm_q8_0,
                GgmlType::MXFP4 => gemm_q4::<3>,
                GgmlType::Q4K => gemm_q4_kx8::<4>,
                GgmlType::Q5K => gemm_q4_kx8::<5>,
                GgmlType::Q6K => gemm_q6_kx8,
                GgmlType::F32 => gemm_f32,
                _ => return None,
            };
            Some(f)
        }

        /// This level's wide kernel for weight type `t`, if it has one.
        /// Q8_0 needs the unsigned-offset trick (`Q8_BIAS`).
        pub fn wide_fn(t: GgmlType) -> Option<GemmFn> {
            let f: GemmFn = match t {
                GgmlType::Q4_0 => gemm_wide::<0>,
                GgmlType::Q4_1 => gemm_wide::<1>,
                GgmlType::Q5_0 => gemm_wide::<2>,
                GgmlType::Q8_0 if Q8_BIAS => gemm_wide::<3>,
                GgmlType::MXFP4 => gemm_wide::<5>,
                GgmlType::Q4K => gemm_wide_kx8::<4>,
                GgmlType::Q5K => gemm_wide_kx8::<5>,
                GgmlType::Q6K => gemm_wide_kx8::<6>,
                _ => return None,
            };
            Some(f)
        }

        x86_shared!($feat);
        x86_one_token!($feat);
        x86_k_quants!($feat);
        x86_rows!($feat);
        x86_wide!($feat);
        x86_wide_k!($feat);
    };
}
