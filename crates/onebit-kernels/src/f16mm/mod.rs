//! Products of an F16 weight matrix with many f32 activation rows (a vision
//! tower's 4,096 patches), the weights kept F16 in memory (half the bytes
//! of widening them) and widened to f32 in registers.
//!
//! # The arithmetic (the invariant every level keeps)
//!
//! `out[t][r]` is one chain of fused multiply-adds over the inputs in
//! order, from +0.0: `acc = w[r][k] * x[t][k] + acc` for k = 0, 1, ..,
//! cols - 1, each weight widened exactly from f16 to f32, each step rounded
//! once (`f32::mul_add`). [`matmul_reference`] is that loop, written
//! straight over the row-major weights. Every kernel computes exactly this
//! chain for every element, whatever tile, work chunk, thread, batch size
//! or ISA level it falls in: a SIMD lane holds one output element, the
//! lanes never mix, and a chain cut at a block of [`KC`] inputs is stored
//! to the output as f32 and loaded back unchanged. So every level equals
//! the reference bit for bit, and each row of a many-row product equals
//! that row alone; the tests check both at every level this CPU runs.
//!
//! # Layout
//!
//! [`F16Matrix`] holds the weights repacked at load into panels of [`NR`]
//! = 16 output rows: panel p, input k holds the 16 weights w[16p..16p+16]\[k\]
//! side by side (32 bytes, still F16), so one input's weights for 16
//! outputs are one load (a 512-bit vector after `vcvtph2ps`, two 256-bit
//! ones, four NEON ones after `fcvtl`/`fcvtl2`). The last panel is padded
//! with zero weights; its padding columns are computed but never stored.
//!
//! # Blocking
//!
//! A micro-kernel computes a tile of MR activation rows by NP panels
//! (AVX-512: 8 x 3 panels = 24 zmm accumulators, 15 % faster than 8 x 2
//! on Zen 4 at SigLIP's MLP shape; AVX2: 6 x 1 panel = 12 ymm;
//! NEON: 6 x 1 panel = 24 q registers): per input, NP panel loads widened,
//! MR broadcasts of activations, MR x NP x (16 / lanes) FMAs. The work is
//! cut into chunks of [`TB`] activation rows by a range of panels (more
//! panel ranges when there are few rows, so every thread has work); a chunk
//! walks the inputs in blocks of [`KC`], and per block every panel group
//! over every row tile, so a block of activations (TB x KC f32, 96 KiB)
//! stays in L2 and a panel group's block of weights (KC x 48 f16, 24 KiB)
//! in L1 while the tiles reuse them.
//!
//! # Levels
//!
//! Scalar (the reference's chain, on the panel layout), AVX2 (+ FMA +
//! F16C), AVX-512 (F, with F16C's 512-bit `vcvtph2ps`), NEON (`fcvtl` in
//! inline assembly: Rust's f16 vector types are unstable; `fmla` by
//! element). AVX512-FP16's native half multiply-adds are not used on
//! purpose: they round every product and sum to f16 (11 significant bits),
//! which would change the results against this reference (and lose the
//! accuracy the f32 chain keeps, for a tower whose activations are f32);
//! the gain would be at most 2x on the FMAs while the f32 chain already runs
//! at the FMA units' rate. `ONEBIT_ISA` caps the level, as everywhere.

use crate::isa::Isa;
use crate::pool::{OutPtr, Pool};

#[cfg(target_arch = "aarch64")]
mod arm;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Output rows per panel.
pub const NR: usize = 16;
/// Inputs per block of the chunk loop (a cut in the chain: stored, reloaded).
pub const KC: usize = 256;
/// Activation rows per work chunk: a multiple of every level's MR (8, 6).
pub const TB: usize = 96;

/// An F16 weight matrix of `rows` outputs by `cols` inputs, in panels.
#[derive(Clone, Debug)]
pub struct F16Matrix {
    rows: usize,
    cols: usize,
    /// `rows.div_ceil(NR)` panels of `cols * NR` f16 bit patterns.
    panels: Vec<u16>,
}

impl F16Matrix {
    /// From row-major f16 bit patterns (\[rows\]\[cols\]).
    pub fn from_bits(rows: usize, cols: usize, bits: &[u16]) -> F16Matrix {
        assert_eq!(bits.len(), rows * cols, "F16Matrix: rows x cols values");
        let np = rows.div_ceil(NR);
        let mut panels = vec![0u16; np * cols * NR];
        for (r, row) in bits.chunks_exact(cols.max(1)).enumerate().take(rows) {
            let (p, l) = (r / NR, r % NR);
            let base = p * cols * NR + l;
            for (k, &b) in row.iter().enumerate() {
                panels[base + k * NR] = b;
            }
        }
        F16Matrix { rows, cols, panels }
    }

    /// From row-major little-endian f16 bytes (a GGUF F16 tensor's data).
    pub fn from_le_bytes(rows: usize, cols: usize, bytes: &[u8]) -> F16Matrix {
        assert_eq!(bytes.len(), 2 * rows * cols, "F16Matrix: rows x cols f16");
        let bits: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        F16Matrix::from_bits(rows, cols, &bits)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the panels (the weights and the last panel's padding).
    pub fn bytes(&self) -> usize {
        2 * self.panels.len()
    }

    /// Weight `w[r][k]` as f32.
    pub fn weight(&self, r: usize, k: usize) -> f32 {
        f16_to_f32(self.panels[(r / NR) * self.cols * NR + k * NR + r % NR])
    }

    /// `out[t][r] = sum_k w[r][k] * x[t][k]` for `n_tok` rows of `x`
    /// (\[n_tok\]\[cols\]); `out` is \[n_tok\]\[rows\]. At [`level`].
    pub fn matmul(&self, pool: &Pool, x: &[f32], n_tok: usize, out: &mut [f32]) {
        self.matmul_at(level(), pool, x, n_tok, out);
    }

    /// [`F16Matrix::matmul`] at `isa` (at most [`level`]).
    pub fn matmul_at(&self, isa: Isa, pool: &Pool, x: &[f32], n_tok: usize, out: &mut [f32]) {
        assert_eq!(x.len(), n_tok * self.cols, "f16 matmul input shape");
        assert_eq!(out.len(), n_tok * self.rows, "f16 matmul output shape");
        assert!(isa.supported(), "f16 matmul at {isa:?}: not on this CPU");
        if n_tok == 0 || self.rows == 0 {
            return;
        }
        if self.cols == 0 {
            out.fill(0.0);
            return;
        }
        let tiles = Tiles::of(isa);
        let n_panels = self.rows.div_ceil(NR);
        let n_tb = n_tok.div_ceil(TB);
        // Panel ranges per row chunk: enough chunks for 4 per thread, each
        // range a whole number of panel groups.
        let groups = n_panels.div_ceil(tiles.np);
        let want = (4 * pool.threads()).div_ceil(n_tb);
        let per = groups.div_ceil(want.clamp(1, groups)) * tiles.np;
        let n_pr = n_panels.div_ceil(per);
        let dst = OutPtr(out.as_mut_ptr());
        pool.for_each_chunk(n_tb * n_pr, |c| {
            let (tb, pr) = (c / n_pr, c % n_pr);
            let t = tb * TB..((tb + 1) * TB).min(n_tok);
            let p = pr * per..((pr + 1) * per).min(n_panels);
            let d = dst;
            // SAFETY: chunk c writes only out[t][r] for its rows t and the
            // rows r of its panels, which no other chunk writes; `out` has
            // n_tok * rows elements (asserted) and outlives the call.
            unsafe { self.chunk(&tiles, x, t, p, d.0) };
        });
    }

    /// One work chunk: activation rows `t` by panels `p`, all inputs.
    ///
    /// # Safety
    /// `out` points at an [n_tok][rows] buffer, no other thread touching
    /// rows `t` x panels `p` during the call; `t` within n_tok.
    unsafe fn chunk(
        &self,
        tiles: &Tiles,
        x: &[f32],
        t: std::ops::Range<usize>,
        p: std::ops::Range<usize>,
        out: *mut f32,
    ) {
        let (cols, rows) = (self.cols, self.rows);
        let mut tmp = [0f32; MAX_MR * MAX_NP * NR];
        let mut k0 = 0;
        while k0 < cols {
            let kn = KC.min(cols - k0);
            let mut p0 = p.start;
            while p0 < p.end {
                let np = tiles.np.min(p.end - p0);
                let c0 = p0 * NR;
                let width = (np * NR).min(rows - c0);
                let mut t0 = t.start;
                while t0 < t.end {
                    let m = tiles.mr.min(t.end - t0);
                    let w = self.panels.as_ptr().add(p0 * cols * NR + k0 * NR);
                    let xp = x.as_ptr().add(t0 * cols + k0);
                    let o = out.add(t0 * rows + c0);
                    let a = Tile {
                        w,
                        ps: cols * NR,
                        x: xp,
                        xs: cols,
                        kn,
                        first: k0 == 0,
                        out: o,
                        os: rows,
                    };
                    if width == np * NR {
                        (tiles.run)(&a, m, np);
                    } else {
                        // A partial last panel: through a full-width copy.
                        let ts = np * NR;
                        for i in 0..m {
                            for j in 0..width {
                                tmp[i * ts + j] = *o.add(i * rows + j);
                            }
                        }
                        let b = Tile {
                            out: tmp.as_mut_ptr(),
                            os: ts,
                            ..a
                        };
                        (tiles.run)(&b, m, np);
                        for i in 0..m {
                            for j in 0..width {
                                *o.add(i * rows + j) = tmp[i * ts + j];
                            }
                        }
                    }
                    t0 += m;
                }
                p0 += np;
            }
            k0 += kn;
        }
    }
}

/// The largest tile any level runs (for the partial-panel buffer).
const MAX_MR: usize = 8;
const MAX_NP: usize = 3;

/// One micro-kernel call: rows `m` (at most the level's MR) of activations
/// from `x` by `np` panels from `w`, over `kn` inputs; `first`: the chains
/// start at +0.0, else they continue from the f32 values in `out`.
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    /// Panel p0's weights at input k0; the next panel `ps` values on.
    pub w: *const u16,
    pub ps: usize,
    /// Row t0's activations at input k0; the next row `xs` values on.
    pub x: *const f32,
    pub xs: usize,
    pub kn: usize,
    pub first: bool,
    /// out[t0][16 p0]; the next row `os` values on; np * 16 columns written.
    pub out: *mut f32,
    pub os: usize,
}

/// A level's micro-kernel and its tile shape.
struct Tiles {
    mr: usize,
    np: usize,
    /// Runs a tile of m <= mr rows by np' <= np panels.
    run: unsafe fn(&Tile, usize, usize),
}

impl Tiles {
    fn of(isa: Isa) -> Tiles {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Tiles {
                mr: 8,
                np: 3,
                run: x86::run_avx512,
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Tiles {
                mr: 6,
                np: 1,
                run: x86::run_avx2,
            },
            #[cfg(target_arch = "aarch64")]
            Isa::Neon | Isa::Dotprod | Isa::I8mm => Tiles {
                mr: 6,
                np: 1,
                run: arm::run_neon,
            },
            Isa::Scalar => Tiles {
                mr: 4,
                np: 1,
                run: run_scalar,
            },
        }
    }
}

/// The level the kernels run at: [`Isa::best`] (every level has code).
pub fn level() -> Isa {
    Isa::best()
}

/// The scalar level on the panel layout: the reference's chain per element.
///
/// # Safety
/// `a` describes readable panels and activations and a writable tile of
/// `m` rows by `np * NR` columns.
unsafe fn run_scalar(a: &Tile, m: usize, np: usize) {
    for i in 0..m {
        for j in 0..np * NR {
            let o = a.out.add(i * a.os + j);
            let mut acc = if a.first { 0.0 } else { *o };
            let w = a.w.add((j / NR) * a.ps + j % NR);
            let x = a.x.add(i * a.xs);
            for k in 0..a.kn {
                acc = f16_to_f32(*w.add(k * NR)).mul_add(*x.add(k), acc);
            }
            *o = acc;
        }
    }
}

/// The reference: `out[t][r]` = the chain `acc = w[r][k] * x[t][k] + acc`
/// (fused, k in order, from +0.0) over row-major f16 weights `w`
/// (\[rows\]\[cols\] bit patterns).
pub fn matmul_reference(
    w: &[u16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
) {
    assert_eq!(w.len(), rows * cols);
    assert_eq!(x.len(), n_tok * cols);
    assert_eq!(out.len(), n_tok * rows);
    for t in 0..n_tok {
        let xr = &x[t * cols..(t + 1) * cols];
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let mut acc = 0f32;
            for (&wk, &xk) in wr.iter().zip(xr) {
                acc = f16_to_f32(wk).mul_add(xk, acc);
            }
            out[t * rows + r] = acc;
        }
    }
}

/// An f16 bit pattern widened exactly to f32.
#[inline]
pub fn f16_to_f32(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}
