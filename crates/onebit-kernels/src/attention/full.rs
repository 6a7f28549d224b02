//! Bidirectional attention where every query row sees every key (a vision
//! tower's patches: 4,096 rows at 896 px), blocked like a matrix product:
//! a tile of [`QT`] query rows of one head walks the keys in blocks of
//! [`KB`]; per block, the scores of the tile against the block (each a
//! fused multiply-add chain over the head's dimensions from +0.0, times the
//! scale), the online softmax update, and the weighted sum of the block's
//! value rows; K and V are read once per tile and block, and the inner
//! loops are register tiles (QT rows x 16 keys for the scores, QT rows x 16
//! value columns for the sums) over K transposed per KV head in tiles of 16
//! keys (each tile's d x 16 block contiguous, so a score tile streams one
//! run of memory instead of dk lines a whole row of keys apart, which fell
//! in the same few cache sets) and V per KV head in column tiles of 16
//! (each tile's keys x 16 block contiguous, zero-padded past dv; both
//! copied once per call).
//!
//! # The arithmetic (the invariant)
//!
//! Per (row, head), with m = -inf, l = 0, acc = 0, for each block of keys
//! k0..k0 + KB in order: s_j = (chain over d of q[d] * k_j[d], fused, from
//! +0.0) * scale; m' = max(m, max_j s_j) (a running `>` from the left);
//! p_j = [`exp_fast`](crate::ops::exp_fast)(s_j - m'); a = exp_fast(m - m');
//! l = l * a + [`sum16`](p) (16 lanes, key j into lane j % 16, then a fixed
//! halving reduction); acc[c] = acc[c] * a, then acc[c] = p_j * v_j[c] +
//! acc[c] fused, j in order; m = m'. The output is acc[c] / l.
//! [`attend_full_reference`] is that, written straight; the tiled kernel
//! computes exactly those operations for every element, at every level
//! (the scalar one and the AVX2 one are the same code compiled with those
//! features: `mul_add` is one fused operation wherever it runs, and the
//! lanes never mix; the AVX-512 one writes the two register tiles and the
//! softmax step in intrinsics, the same operations lane for lane, see
//! `z::softmax_row` for why its maximum may be taken in any order), so its
//! bits equal the reference's,
//! whatever the tile, the thread or the level; each row's result is that
//! row alone. The tests check both at every level this CPU runs.

use crate::isa::Isa;
use crate::ops::{exp_fast, exp_sub};
use crate::pool::{OutPtr, Pool};

use super::AttnShape;

/// Query rows per tile.
pub const QT: usize = 8;
/// Keys per block of the online softmax.
pub const KB: usize = 128;
/// Lanes of a register tile (keys of a score tile, columns of a value tile).
const L: usize = 16;

/// The 16-lane sum: value j into lane j % 16 in order, then lanes i and
/// i + 8, i + 4, i + 2, i + 1 added, halving.
pub fn sum16(p: &[f32]) -> f32 {
    let mut lanes = [0f32; L];
    for (j, &v) in p.iter().enumerate() {
        lanes[j % L] += v;
    }
    halve16(&mut lanes)
}

/// [`sum16`]'s reduction of its 16 lanes: lanes i and i + 8, i + 4, i + 2,
/// i + 1 added, halving; the SIMD softmax steps end with it too.
#[inline(always)]
fn halve16(lanes: &mut [f32; L]) -> f32 {
    let mut w = L / 2;
    while w > 0 {
        for i in 0..w {
            lanes[i] += lanes[i + w];
        }
        w /= 2;
    }
    lanes[0]
}

/// The scalar online-softmax step of one row's block of scores `si`
/// against the running maximum `m` (the reference's, see the header):
/// leaves `exp_fast(s - mn)` in `si` and returns `(mn, sum16(si))`.
fn softmax_row(si: &mut [f32], m: f32) -> (f32, f32) {
    let mut mn = m;
    for &x in si.iter() {
        if x > mn {
            mn = x;
        }
    }
    exp_sub(si, mn);
    (mn, sum16(si))
}

/// The reference (see the module header): `q` [n][n_head x dk], `k`
/// [n][n_head_kv x dk], `v` [n][n_head_kv x dv], `out` [n][n_head x dv].
pub fn attend_full_reference(
    s: AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    scale: f32,
    out: &mut [f32],
) {
    let (dk, dv, nh, nkv) = (s.head_dim_k, s.head_dim_v, s.n_head, s.n_head_kv);
    let group = nh / nkv;
    for t in 0..n {
        for h in 0..nh {
            let g = h / group;
            let qr = &q[t * nh * dk + h * dk..][..dk];
            let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
            let mut acc = vec![0f32; dv];
            for k0 in (0..n).step_by(KB) {
                let kn = KB.min(n - k0);
                let mut sc = vec![0f32; kn];
                for (j, sj) in sc.iter_mut().enumerate() {
                    let kr = &k[(k0 + j) * nkv * dk + g * dk..][..dk];
                    let mut a = 0f32;
                    for d in 0..dk {
                        a = qr[d].mul_add(kr[d], a);
                    }
                    *sj = a * scale;
                }
                let mut mn = m;
                for &x in &sc {
                    if x > mn {
                        mn = x;
                    }
                }
                for x in sc.iter_mut() {
                    *x = exp_fast(*x - mn);
                }
                let a = exp_fast(m - mn);
                l = l * a + sum16(&sc);
                for c in acc.iter_mut() {
                    *c *= a;
                }
                for (j, &p) in sc.iter().enumerate() {
                    let vr = &v[(k0 + j) * nkv * dv + g * dv..][..dv];
                    for c in 0..dv {
                        acc[c] = p.mul_add(vr[c], acc[c]);
                    }
                }
                m = mn;
            }
            let o = &mut out[t * nh * dv + h * dv..][..dv];
            for (o, a) in o.iter_mut().zip(&acc) {
                *o = a / l;
            }
        }
    }
}

/// [`attend_full_reference`]'s result, tiled, over the pool, at
/// [`super::level`].
#[allow(clippy::too_many_arguments)]
pub fn attend_full(
    pool: &Pool,
    s: AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    scale: f32,
    out: &mut [f32],
) {
    attend_full_at(super::level(), pool, s, q, k, v, n, scale, out)
}

/// [`attend_full`] at `isa` (supported by this CPU).
#[allow(clippy::too_many_arguments)]
pub fn attend_full_at(
    isa: Isa,
    pool: &Pool,
    s: AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    scale: f32,
    out: &mut [f32],
) {
    let (dk, dv, nh, nkv) = (s.head_dim_k, s.head_dim_v, s.n_head, s.n_head_kv);
    assert!(nkv > 0 && nh % nkv == 0, "attend_full: heads");
    assert_eq!(q.len(), n * nh * dk, "attend_full: q shape");
    assert_eq!(k.len(), n * nkv * dk, "attend_full: k shape");
    assert_eq!(v.len(), n * nkv * dv, "attend_full: v shape");
    assert_eq!(out.len(), n * nh * dv, "attend_full: out shape");
    assert!(isa.supported(), "attend_full at {isa:?}: not on this CPU");
    if n == 0 {
        return;
    }
    // K transposed per KV head in tiles of 16 keys ([g][j / 16][d][j % 16],
    // keys padded with zeros to a multiple of 16) and V per KV head in
    // column tiles of 16 ([g][c / 16][j][c % 16], columns padded to dvp).
    let np = n.div_ceil(L) * L;
    let dvp = dv.div_ceil(L) * L;
    let mut kt = vec![0f32; nkv * dk * np];
    let mut vp = vec![0f32; nkv * n * dvp];
    // Over the pool, by KV head and runs of 16-key tiles (a copy, so the
    // same values whatever the split).
    const COPY_TILES: usize = 16;
    let runs = np.div_ceil(L * COPY_TILES);
    let (ktp, vpp) = (OutPtr(kt.as_mut_ptr()), OutPtr(vp.as_mut_ptr()));
    pool.for_each_chunk(nkv * runs, |c| {
        let (g, run) = (c / runs, c % runs);
        let (ktp, vpp) = (ktp, vpp);
        for j in run * L * COPY_TILES..((run + 1) * L * COPY_TILES).min(n) {
            let kr = &k[j * nkv * dk + g * dk..][..dk];
            for (d, &x) in kr.iter().enumerate() {
                // SAFETY: element (g, j / 16, d, j % 16) of kt, in bounds
                // (j < n <= np, d < dk); chunk (g, run) alone writes its
                // keys j of head g.
                unsafe { *ktp.0.add(g * dk * np + (j / L) * dk * L + d * L + j % L) = x };
            }
            let vr = &v[j * nkv * dv + g * dv..][..dv];
            for (ct, src) in vr.chunks(L).enumerate() {
                let at = ((g * dvp / L + ct) * n + j) * L;
                // SAFETY: vp[at..at + src.len()] is key j's part of column
                // tile ct of head g, in bounds (ct < dvp / 16, j < n), and
                // written by chunk (g, run) alone.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), vpp.0.add(at), src.len()) };
            }
        }
    });
    let ctx = Ctx {
        s,
        q,
        kt: &kt,
        vp: &vp,
        n,
        np,
        dvp,
        scale,
    };
    // Work: (head, 4 query tiles) chunks.
    const TILES: usize = 4;
    let per_head = n.div_ceil(QT * TILES);
    let dst = OutPtr(out.as_mut_ptr());
    pool.for_each_chunk(nh * per_head, |c| {
        let (h, b) = (c / per_head, c % per_head);
        let mut sc = vec![0f32; QT * KB];
        let mut acc = vec![0f32; QT * dvp];
        let r1 = ((b + 1) * QT * TILES).min(n);
        let mut r0 = b * QT * TILES;
        while r0 < r1 {
            let rows = QT.min(r1 - r0);
            let d = dst;
            // SAFETY: the tile writes out[t][h * dv..(h + 1) * dv] for its
            // rows t only, which no other chunk writes; `out` has n rows
            // (asserted) and outlives the call; the level is supported.
            unsafe { run(isa, &ctx, h, r0, rows, &mut sc, &mut acc, d.0) };
            r0 += rows;
        }
    });
}

struct Ctx<'a> {
    s: AttnShape,
    q: &'a [f32],
    kt: &'a [f32],
    vp: &'a [f32],
    n: usize,
    np: usize,
    dvp: usize,
    scale: f32,
}

/// One tile at `isa`.
///
/// # Safety
/// `isa` is supported; `out` as in [`attend_full_at`].
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    isa: Isa,
    c: &Ctx,
    h: usize,
    r0: usize,
    rows: usize,
    sc: &mut [f32],
    acc: &mut [f32],
    out: *mut f32,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => tile_avx512(c, h, r0, rows, sc, acc, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => tile_avx2(c, h, r0, rows, sc, acc, out),
        _ => tile::<SCALAR>(c, h, r0, rows, sc, acc, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tile_avx512(
    c: &Ctx,
    h: usize,
    r0: usize,
    rows: usize,
    sc: &mut [f32],
    acc: &mut [f32],
    out: *mut f32,
) {
    tile::<ZMM>(c, h, r0, rows, sc, acc, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(
    c: &Ctx,
    h: usize,
    r0: usize,
    rows: usize,
    sc: &mut [f32],
    acc: &mut [f32],
    out: *mut f32,
) {
    tile::<YMM>(c, h, r0, rows, sc, acc, out)
}

/// The scalar level's register tile step, for scores and values alike:
/// `a[i] += coef(i, t) * rows[t]` for t in 0..steps, each lane one fused
/// multiply-add chain in t order, the order the SIMD paths keep.
#[inline(always)]
fn fma_rows(
    a: &mut [[f32; L]; QT],
    rows: &[f32],
    steps: usize,
    coef: impl Fn(usize, usize) -> f32,
) {
    for t in 0..steps {
        let r: &[f32; L] = rows[t * L..][..L].try_into().unwrap();
        for (i, ai) in a.iter_mut().enumerate() {
            let s = coef(i, t);
            for (x, &v) in ai.iter_mut().zip(r) {
                *x = s.mul_add(v, *x);
            }
        }
    }
}

/// [`tile`]'s code paths: plain Rust (the scalar level), AVX2 intrinsics,
/// AVX-512 intrinsics.
const SCALAR: u8 = 0;
const YMM: u8 = 1;
// Only x86's AVX-512 tile instantiates it; elsewhere its branches are dead.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const ZMM: u8 = 2;

/// The tile body, compiled into each level's function (see the header);
/// `V`: its two register tiles and the softmax step in plain Rust
/// ([`SCALAR`]), in AVX2 intrinsics ([`YMM`]: a row's 16 lanes in two
/// registers, the rows in two halves of four) or in AVX-512 intrinsics
/// ([`ZMM`]: one register per row); the same operations, lane for lane.
///
/// # Safety
/// `out` as in [`attend_full_at`]; rows r0..r0 + rows < n; `V` = YMM only
/// where AVX2 and FMA were detected, ZMM where AVX-512F too.
#[inline(always)]
unsafe fn tile<const V: u8>(
    c: &Ctx,
    h: usize,
    r0: usize,
    rows: usize,
    sc: &mut [f32],
    acc: &mut [f32],
    out: *mut f32,
) {
    let (dk, dv, nh, nkv) = (c.s.head_dim_k, c.s.head_dim_v, c.s.n_head, c.s.n_head_kv);
    let (n, np, dvp) = (c.n, c.np, c.dvp);
    let g = h / (nh / nkv);
    // The tile's query rows (rows past `rows` repeat the last: computed,
    // never stored).
    // The tile's query rows transposed, qt[d * QT + i] (rows past `rows`
    // repeat the last: computed, never stored), so a step's QT broadcasts
    // sit at fixed offsets.
    let mut qt = vec![0f32; dk * QT];
    for i in 0..QT {
        let qr = &c.q[(r0 + i.min(rows - 1)) * nh * dk + h * dk..][..dk];
        for (d, &x) in qr.iter().enumerate() {
            qt[d * QT + i] = x;
        }
    }
    let kt = &c.kt[g * dk * np..][..dk * np];
    let mut m = [f32::NEG_INFINITY; QT];
    let mut l = [0f32; QT];
    acc[..QT * dvp].fill(0.0);
    for k0 in (0..n).step_by(KB) {
        let kn = KB.min(n - k0);
        // Scores: QT rows x 16 keys per register tile, chains over d.
        for j0 in (0..kn).step_by(L) {
            let mut a = [[0f32; L]; QT];
            let kb = &kt[(k0 + j0) * dk..][..dk * L];
            #[cfg(target_arch = "x86_64")]
            if V == ZMM {
                z::scores(&mut a, kb.as_ptr(), qt.as_ptr(), dk);
            } else if V == YMM {
                y::scores(&mut a, kb.as_ptr(), qt.as_ptr(), dk);
            }
            if V == SCALAR {
                fma_rows(&mut a, kb, dk, |i, d| qt[d * QT + i]);
            }
            let w = L.min(kn - j0);
            for (i, ai) in a.iter().enumerate() {
                for (dst, &x) in sc[i * KB + j0..][..w].iter_mut().zip(ai) {
                    *dst = x * c.scale;
                }
            }
        }
        // The online softmax, row by row.
        let mut alpha = [0f32; QT];
        for i in 0..QT {
            let si = &mut sc[i * KB..i * KB + kn];
            let (mn, sum) = match V {
                #[cfg(target_arch = "x86_64")]
                ZMM => z::softmax_row(si, m[i]),
                #[cfg(target_arch = "x86_64")]
                YMM => y::softmax_row(si, m[i]),
                _ => softmax_row(si, m[i]),
            };
            alpha[i] = exp_fast(m[i] - mn);
            l[i] = l[i] * alpha[i] + sum;
            m[i] = mn;
        }
        // Values: QT rows x 16 columns per register tile, chains over keys.
        for c0 in (0..dvp).step_by(L) {
            let vb = &c.vp[((g * dvp + c0) / L * n + k0) * L..][..kn * L];
            let mut a = [[0f32; L]; QT];
            for (i, ai) in a.iter_mut().enumerate() {
                let src = &acc[i * dvp + c0..][..L];
                for (x, &s) in ai.iter_mut().zip(src) {
                    *x = s * alpha[i];
                }
            }
            #[cfg(target_arch = "x86_64")]
            if V == ZMM {
                z::values(&mut a, vb.as_ptr(), sc.as_ptr(), kn);
            } else if V == YMM {
                y::values(&mut a, vb.as_ptr(), sc.as_ptr(), kn);
            }
            if V == SCALAR {
                fma_rows(&mut a, vb, kn, |i, j| sc[i * KB + j]);
            }
            for (i, ai) in a.iter().enumerate() {
                acc[i * dvp + c0..][..L].copy_from_slice(ai);
            }
        }
    }
    for i in 0..rows {
        let o = out.add((r0 + i) * nh * dv + h * dv);
        for cc in 0..dv {
            *o.add(cc) = acc[i * dvp + cc] / l[i];
        }
    }
}

/// The AVX2 register tiles: row i's 16 lanes in two ymm, the tile's rows
/// in two passes of four (8 accumulators, the K or V loads and a
/// broadcast fit the 16 registers; eight rows at once would spill).
#[cfg(target_arch = "x86_64")]
mod y {
    use super::{KB, L, QT};
    use crate::ops::exp_fast;
    use std::arch::x86_64::*;

    /// Rows per pass.
    const H: usize = 4;

    /// As [`super::z::scores`].
    ///
    /// # Safety
    /// AVX2 and FMA; as [`super::z::scores`].
    #[inline(always)]
    pub unsafe fn scores(a: &mut [[f32; L]; QT], kt: *const f32, qt: *const f32, dk: usize) {
        for h0 in (0..QT).step_by(H) {
            let mut r = [[_mm256_setzero_ps(); 2]; H];
            let (mut kp, mut qp) = (kt, qt.add(h0));
            for _ in 0..dk {
                let k0 = _mm256_loadu_ps(kp);
                let k1 = _mm256_loadu_ps(kp.add(8));
                for (i, ri) in r.iter_mut().enumerate() {
                    let q = _mm256_set1_ps(*qp.add(i));
                    ri[0] = _mm256_fmadd_ps(q, k0, ri[0]);
                    ri[1] = _mm256_fmadd_ps(q, k1, ri[1]);
                }
                kp = kp.add(L);
                qp = qp.add(QT);
            }
            for (i, ri) in r.iter().enumerate() {
                _mm256_storeu_ps(a[h0 + i].as_mut_ptr(), ri[0]);
                _mm256_storeu_ps(a[h0 + i].as_mut_ptr().add(8), ri[1]);
            }
        }
    }

    /// As [`super::z::values`].
    ///
    /// # Safety
    /// AVX2 and FMA; as [`super::z::values`].
    #[inline(always)]
    pub unsafe fn values(a: &mut [[f32; L]; QT], v: *const f32, p: *const f32, kn: usize) {
        for h0 in (0..QT).step_by(H) {
            let mut r: [[__m256; 2]; H] = std::array::from_fn(|i| {
                let row = a[h0 + i].as_ptr();
                [_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8))]
            });
            for j in 0..kn {
                let v0 = _mm256_loadu_ps(v.add(j * L));
                let v1 = _mm256_loadu_ps(v.add(j * L + 8));
                for (i, ri) in r.iter_mut().enumerate() {
                    let pj = _mm256_set1_ps(*p.add((h0 + i) * KB + j));
                    ri[0] = _mm256_fmadd_ps(pj, v0, ri[0]);
                    ri[1] = _mm256_fmadd_ps(pj, v1, ri[1]);
                }
            }
            for (i, ri) in r.iter().enumerate() {
                _mm256_storeu_ps(a[h0 + i].as_mut_ptr(), ri[0]);
                _mm256_storeu_ps(a[h0 + i].as_mut_ptr().add(8), ri[1]);
            }
        }
    }

    /// As [`super::z::softmax_row`] (and for the same reasons the same
    /// bits), lanes 0-7 and 8-15 of the sum in two registers; a partial
    /// block's tail keys, which come last in every lane's order, go through
    /// the scalar steps.
    ///
    /// # Safety
    /// AVX2 and FMA.
    #[inline(always)]
    pub unsafe fn softmax_row(si: &mut [f32], m: f32) -> (f32, f32) {
        let kn = si.len();
        debug_assert!(kn <= KB);
        let full = kn / L;
        let p = si.as_mut_ptr();
        let mut mx = [_mm256_set1_ps(m); 2];
        for b in 0..full {
            for (h, x) in mx.iter_mut().enumerate() {
                *x = _mm256_max_ps(_mm256_loadu_ps(p.add(b * L + 8 * h)), *x);
            }
        }
        let mut lanes = [0f32; L];
        _mm256_storeu_ps(lanes.as_mut_ptr(), mx[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), mx[1]);
        let mut mn = f32::NEG_INFINITY;
        for &x in lanes.iter().chain(&si[full * L..]) {
            if x > mn {
                mn = x;
            }
        }
        let mv = _mm256_set1_ps(mn);
        let mut sum = [_mm256_setzero_ps(); 2];
        for b in 0..full {
            for (h, s) in sum.iter_mut().enumerate() {
                let q = p.add(b * L + 8 * h);
                let e = crate::ops::avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(q), mv));
                _mm256_storeu_ps(q, e);
                *s = _mm256_add_ps(*s, e);
            }
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), sum[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), sum[1]);
        for (j, x) in si[full * L..].iter_mut().enumerate() {
            *x = exp_fast(*x - mn);
            lanes[j] += *x;
        }
        (mn, super::halve16(&mut lanes))
    }
}

/// The AVX-512 register tiles: row i's 16 lanes in one zmm.
#[cfg(target_arch = "x86_64")]
mod z {
    use super::{KB, L, QT};
    use crate::ops::avx512::exp16;
    use std::arch::x86_64::*;

    /// One row's online-softmax step on its block of scores `si` (at most
    /// [`KB`]) against the running maximum `m`: leaves `exp_fast(s - mn)`
    /// in `si` and returns `(mn, sum16(si))`, the scalar step's bits.
    ///
    /// The maximum is taken per lane with `vmaxps(x, mx)` (= `x > mx ? x :
    /// mx`, so a NaN score is passed over as the reference's `>` passes it
    /// over), then across the lanes. Any order of the comparisons gives the
    /// same maximum except for the sign of a zero, which nothing downstream
    /// can tell apart: `s - mn` for mn = +0.0 or -0.0 differs only at
    /// s = -0.0 (+0.0 against -0.0), whose exp is 1.0 both ways, and `m -
    /// mn` likewise. The exps are [`exp16`] (lane for lane `exp_fast`) and
    /// their sum is accumulated key j into lane j % 16 from +0.0 in order,
    /// then halved as [`super::sum16`] does.
    ///
    /// # Safety
    /// AVX-512F, AVX2 and FMA.
    #[inline(always)]
    pub unsafe fn softmax_row(si: &mut [f32], m: f32) -> (f32, f32) {
        let kn = si.len();
        debug_assert!(kn <= KB);
        let (full, rem) = (kn / L, kn % L);
        let tail: __mmask16 = ((1u32 << rem) - 1) as u16;
        let p = si.as_mut_ptr();
        let mut mx = _mm512_set1_ps(m);
        for b in 0..full {
            mx = _mm512_max_ps(_mm512_loadu_ps(p.add(b * L)), mx);
        }
        if rem > 0 {
            let x = _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), tail, p.add(full * L));
            mx = _mm512_max_ps(x, mx);
        }
        let mut lanes = [0f32; L];
        _mm512_storeu_ps(lanes.as_mut_ptr(), mx);
        // Every lane started at m: the lanes' maximum is at least m.
        let mut mn = f32::NEG_INFINITY;
        for &x in &lanes {
            if x > mn {
                mn = x;
            }
        }
        let mv = _mm512_set1_ps(mn);
        let mut sum = _mm512_setzero_ps();
        for b in 0..full {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(b * L)), mv));
            _mm512_storeu_ps(p.add(b * L), e);
            sum = _mm512_add_ps(sum, e);
        }
        if rem > 0 {
            let x = _mm512_maskz_loadu_ps(tail, p.add(full * L));
            let e = exp16(_mm512_sub_ps(x, mv));
            _mm512_mask_storeu_ps(p.add(full * L), tail, e);
            sum = _mm512_mask_add_ps(sum, tail, sum, e);
        }
        _mm512_storeu_ps(lanes.as_mut_ptr(), sum);
        (mn, super::halve16(&mut lanes))
    }

    /// `a[i][l] = chain over d of qt[d * QT + i] * kt[d * L + l]` (fused, from +0.0).
    ///
    /// # Safety
    /// AVX-512F; `kt` readable at d * L + 0..16 and `qt` at d * QT + 0..QT,
    /// for d < dk.
    #[inline(always)]
    pub unsafe fn scores(a: &mut [[f32; L]; QT], kt: *const f32, qt: *const f32, dk: usize) {
        let mut r = [_mm512_setzero_ps(); QT];
        let (mut kp, mut qp) = (kt, qt);
        for _ in 0..dk {
            let kv = _mm512_loadu_ps(kp);
            for (i, ri) in r.iter_mut().enumerate() {
                *ri = _mm512_fmadd_ps(_mm512_set1_ps(*qp.add(i)), kv, *ri);
            }
            kp = kp.add(L);
            qp = qp.add(QT);
        }
        for i in 0..QT {
            _mm512_storeu_ps(a[i].as_mut_ptr(), r[i]);
        }
    }

    /// `a[i][l] = p_i[j] * v[j * L + l] + a[i][l]` (fused), j in 0..kn in order.
    ///
    /// # Safety
    /// AVX-512F; `v` readable at j * L + 0..16, `p` at i * KB + j, j < kn.
    #[inline(always)]
    pub unsafe fn values(a: &mut [[f32; L]; QT], v: *const f32, p: *const f32, kn: usize) {
        let mut r: [__m512; QT] = std::array::from_fn(|i| _mm512_loadu_ps(a[i].as_ptr()));
        for j in 0..kn {
            let vv = _mm512_loadu_ps(v.add(j * L));
            for (i, ri) in r.iter_mut().enumerate() {
                *ri = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(i * KB + j)), vv, *ri);
            }
        }
        for i in 0..QT {
            _mm512_storeu_ps(a[i].as_mut_ptr(), r[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u64, amp: f32) -> Vec<f32> {
        let mut z = seed;
        (0..len)
            .map(|_| {
                z = z
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
            })
            .collect()
    }

    fn levels() -> Vec<Isa> {
        Isa::all()
            .iter()
            .copied()
            .filter(|l| l.supported() && *l <= super::super::level())
            .collect()
    }

    /// Every level equals the reference bit for bit: rows not a multiple
    /// of the tile, keys not a multiple of 16 or of a block, head sizes not
    /// a multiple of 16 (SigLIP's 72), grouped heads.
    #[test]
    fn every_level_equals_the_reference() {
        let pool = Pool::new(2);
        for (n, nh, nkv, dh) in [
            (1, 1, 1, 8),
            (37, 2, 1, 72),
            (300, 2, 2, 16),
            (129, 4, 2, 20),
        ] {
            let s = AttnShape {
                n_head: nh,
                n_head_kv: nkv,
                head_dim_k: dh,
                head_dim_v: dh,
            };
            let q = data(n * nh * dh, 1 + n as u64, 1.5);
            let k = data(n * nkv * dh, 2 + n as u64, 1.5);
            let v = data(n * nkv * dh, 3 + n as u64, 1.0);
            let scale = 1.0 / (dh as f32).sqrt();
            let mut want = vec![0f32; n * nh * dh];
            attend_full_reference(s, &q, &k, &v, n, scale, &mut want);
            for isa in levels() {
                let mut got = vec![f32::NAN; n * nh * dh];
                attend_full_at(isa, &pool, s, &q, &k, &v, n, scale, &mut got);
                let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
                let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{isa:?} n {n} heads {nh}/{nkv} dh {dh}");
            }
        }
        let ran: Vec<&str> = levels().iter().map(|l| l.name()).collect();
        eprintln!(
            "attend_full levels run: {} (attention's own cap); {}",
            ran.join(" "),
            Isa::levels_line()
        );
    }

    /// The reference agrees with a plain softmax in f64 (it is attention).
    #[test]
    fn the_reference_is_attention() {
        let (n, dh) = (200, 12);
        let s = AttnShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: dh,
            head_dim_v: dh,
        };
        let q = data(n * dh, 5, 2.0);
        let k = data(n * dh, 6, 2.0);
        let v = data(n * dh, 7, 1.0);
        let mut got = vec![0f32; n * dh];
        attend_full_reference(s, &q, &k, &v, n, 0.3, &mut got);
        for t in 0..n {
            let sc: Vec<f64> = (0..n)
                .map(|j| {
                    (0..dh)
                        .map(|d| q[t * dh + d] as f64 * k[j * dh + d] as f64)
                        .sum::<f64>()
                        * 0.3
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for c in 0..dh {
                let o: f64 = (0..n).map(|j| w[j] * v[j * dh + c] as f64).sum::<f64>() / z;
                assert!((o - got[t * dh + c] as f64).abs() < 1e-4, "row {t} col {c}");
            }
        }
    }
}

#[cfg(test)]
mod timing {
    use super::*;
    use crate::kv::KvView;

    /// `cargo test -p onebit-kernels --lib attention::full::timing -- --ignored --nocapture`:
    /// this kernel against `attend_rows` on SigLIP's heads (16 x 72) over `n` rows.
    #[test]
    #[ignore]
    fn against_attend_rows() {
        let (n, nh, dh) = (1024, 16, 72);
        let s = AttnShape {
            n_head: nh,
            n_head_kv: nh,
            head_dim_k: dh,
            head_dim_v: dh,
        };
        let f = |i: usize| ((i * 7919 % 10007) as f32 / 10007.0 - 0.5) * 2.0;
        let q: Vec<f32> = (0..n * nh * dh).map(f).collect();
        let k: Vec<f32> = (0..n * nh * dh).map(|i| f(i + 3)).collect();
        let v: Vec<f32> = (0..n * nh * dh).map(|i| f(i + 7)).collect();
        let pool = Pool::new(2);
        let mut out = vec![0f32; n * nh * dh];
        let spans = vec![(0, n); n];
        for _ in 0..2 {
            let t = std::time::Instant::now();
            attend_full(&pool, s, &q, &k, &v, n, 0.1, &mut out);
            let a = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            super::super::attend_rows(
                &pool,
                s,
                &q,
                &spans,
                KvView::F32(&k),
                KvView::F32(&v),
                0.1,
                None,
                &mut out,
            );
            let b = t.elapsed().as_secs_f64();
            eprintln!(
                "n {n}: attend_full {:.1} ms, attend_rows {:.1} ms",
                a * 1e3,
                b * 1e3
            );
        }
    }
}
