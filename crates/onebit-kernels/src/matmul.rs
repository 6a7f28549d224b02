//! Products of a weight matrix (any block format) with a batch of activation rows.
//!
//! `Precision::Quantized` is llama.cpp's scheme: each activation row is
//! quantized once per matmul into the encoding the weight type's dot product
//! consumes (Q8_0, Q8_1 or Q8_K), then integer block dot products.
//! `Precision::Float` dequantizes each weight row and keeps activations in f32:
//! slower, and exact to the weights' decoded values (the reference path).
//!
//! Each output element is the dot product of one weight row and one activation
//! row, computed with the same operations whatever the batch size, the tile it
//! falls in, the thread that computes it or the ISA level (the SIMD kernels in
//! `quant::x86` equal the scalar reference bit for bit), so batched and
//! one-at-a-time results agree bit for bit.
//!
//! Work: activations are quantized once per call (rows in parallel for a
//! batch); the weight rows are cut into chunks handed out by the pool's atomic
//! counter; a chunk computes its rows for every token in tiles (4 rows x 4
//! tokens with AVX-512), so a decoded weight block serves several tokens and a
//! loaded activation block several rows.
//!
//! Weights of the types the SIMD kernels repack (Q8_0 per row; Q4_0, Q4_1,
//! Q5_0, Q4_K, Q5_K, Q6_K by groups of 8 rows, the blocks of 32's rows past
//! the last group per row, so work chunks start on a multiple of 8 rows) are
//! repacked on first use (or by [`QMatrix::prepare_all`], a model's matrices
//! side by side in one huge-page mapping, see `arena`), dropping the
//! original's mapped pages, into a copy the size of the original; clones of a
//! `QMatrix` share it.
// The repacked and wide layouts are x86's; the aarch64 kernels read standard rows.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use onebit_formats::{blocks, ByteView, GgmlType};

use crate::arena::Slot;
use crate::pool::{OutPtr, Pool};
use crate::quant::{self, ActFormat};

#[cfg(target_arch = "x86_64")]
use crate::quant::x86::{self, Isa, Operands};

mod each;
#[cfg(target_arch = "aarch64")]
use crate::quant::{arm, Isa};
pub use each::{matmul_each, Input, Product};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// Activations quantized per block, integer dot products (fast; llama.cpp's scheme).
    #[default]
    Quantized,
    /// Weights dequantized to f32, f32 activations (reference).
    Float,
}

/// A weight matrix of `rows` outputs by `cols` inputs, rows stored one after another.
#[derive(Clone, Debug)]
pub struct QMatrix {
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: ByteView,
    /// The rows in the SIMD kernels' layout, made on first use; shared by clones.
    packed: Arc<OnceLock<Slot>>,
}

impl QMatrix {
    /// Checks that `data` holds exactly rows x cols elements of `dtype`.
    pub fn new(
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        data: ByteView,
    ) -> Result<QMatrix, String> {
        let rb = dtype
            .row_bytes(cols as u64)
            .ok_or_else(|| format!("row length {cols} is not a whole number of {dtype} blocks"))?;
        let want = rb.checked_mul(rows as u64).ok_or("size overflows")?;
        if want != data.len() as u64 {
            return Err(format!(
                "{rows}x{cols} {dtype} needs {want} bytes, found {}",
                data.len()
            ));
        }
        Ok(QMatrix {
            dtype,
            rows,
            cols,
            data,
            packed: Arc::new(OnceLock::new()),
        })
    }

    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows
    }

    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Decodes row `r` into `out` (cols values). Reads the repacked copy
    /// when there is one: the original's pages were dropped when it was
    /// made, and faulting them back (with the kernel's read-around) would
    /// hold a tied embedding in memory twice.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(p) = self.packed.get() {
            let rb = self.row_bytes();
            let mut row = vec![0u8; rb];
            x86::unpack_row(self.dtype, p, self.rows, rb, r, &mut row);
            blocks::dequantize(self.dtype, &row, out)
                .expect("QMatrix rows are whole blocks, checked at construction");
            return;
        }
        blocks::dequantize(self.dtype, self.row(r), out)
            .expect("QMatrix rows are whole blocks, checked at construction");
    }

    fn act_format(&self, precision: Precision) -> ActFormat {
        match precision {
            Precision::Quantized => quant::act_format(self.dtype),
            Precision::Float => ActFormat::F32,
        }
    }

    /// Whether the quantized kernels read a repacked copy of this matrix.
    pub fn repacks(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            (x86::packs(self.dtype) || x86::interleaves(self.dtype))
                && x86::gemm_fn(Isa::best(), self.dtype).is_some()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Makes the repacked copy now (at load) rather than on the first matmul;
    /// a no-op for types that are not repacked. Costs a copy of the matrix
    /// (same size) and one pass over it.
    /// When `data` views a mapped file, its pages are dropped from resident
    /// memory as they are packed (the kernels read only the copy; the few
    /// other reads, such as embedding rows of a tied output matrix, fault
    /// pages back in), so the process does not hold the matrix twice.
    pub fn prepare(&self, pool: &Pool) {
        QMatrix::prepare_all(pool, &[self]);
    }

    /// [`QMatrix::prepare`] for several matrices at once, their repacked
    /// copies one after another in one mapping (see `arena`), in the order
    /// given: list them in the order the forward reads them. Matrices
    /// already prepared, and clones listed twice, are packed once.
    pub fn prepare_all(pool: &Pool, ws: &[&QMatrix]) {
        Self::prepare_all_reporting(pool, ws, &mut |_, _| {});
    }

    /// [`prepare_all`](Self::prepare_all), calling `progress(done, total)`
    /// in bytes of prepared copies once before the first matrix and after
    /// each one (a progress bar's steps; `done == total` at the end).
    pub fn prepare_all_reporting(pool: &Pool, ws: &[&QMatrix], progress: &mut dyn FnMut(u64, u64)) {
        #[cfg(target_arch = "x86_64")]
        {
            let mut todo: Vec<&QMatrix> = Vec::new();
            for &w in ws {
                let fresh = w.packed.get().is_none()
                    && !todo.iter().any(|t| Arc::ptr_eq(&t.packed, &w.packed));
                if w.repacks() && fresh {
                    todo.push(w);
                }
            }
            let lens: Vec<usize> = todo.iter().map(|w| w.packed_len()).collect();
            // Packed largest first: packing maps some of the file's pages
            // around the rows it reads until the matrix is done (on Gemma
            // 3's 178 MB output, up to 25 MB), best while little else is
            // resident. Packing the output last raised Gemma 3's peak RSS
            // from 284 to 306 MB.
            let mut order: Vec<usize> = (0..todo.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
            let total: u64 = lens.iter().map(|&l| l as u64).sum();
            let mut done = 0u64;
            progress(0, total);
            let Some(slots) = Slot::shared(&lens, &order, |i, dst| {
                todo[i].pack_into(pool, dst);
                done += lens[i] as u64;
                progress(done, total);
            }) else {
                // Only if the lengths' sum overflows, which matrices that
                // each fit in memory do not reach; one mapping per matrix
                // is still correct.
                todo.iter().for_each(|w| {
                    w.packed_rows(pool);
                });
                return;
            };
            for (w, slot) in todo.iter().zip(slots) {
                // Set unless a concurrent first use packed it meanwhile.
                let _ = w.packed.set(slot);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (pool, ws, progress);
    }

    /// Drops the original's pages from resident memory again once the
    /// repacked copy exists (a no-op otherwise): packing a neighbouring
    /// matrix reads its file pages with the kernel's read-around, which can
    /// map pages of one packed earlier back in.
    pub fn release_original(&self) {
        if self.packed.get().is_some() {
            self.data.release_pages();
        }
    }

    /// Bytes of the repacked copy: the rows and the kernels' read-ahead pad.
    #[cfg(target_arch = "x86_64")]
    fn packed_len(&self) -> usize {
        self.rows * self.row_bytes() + x86::PAD
    }

    #[cfg(target_arch = "x86_64")]
    fn packed_rows(&self, pool: &Pool) -> &[u8] {
        self.packed
            .get_or_init(|| Slot::alone(self.packed_len(), |dst| self.pack_into(pool, dst)))
    }

    /// Writes the rows in the kernels' layout into `dst` (zeroed,
    /// [`QMatrix::packed_len`] bytes), dropping the original's pages as it
    /// goes.
    #[cfg(target_arch = "x86_64")]
    fn pack_into(&self, pool: &Pool, dst: &mut [u8]) {
        let rb = self.row_bytes();
        assert_eq!(dst.len(), self.packed_len(), "repacked copy size");
        // Filled in place (a copy per chunk joined at the end would hold
        // the matrix twice at the peak); each chunk's source pages are
        // dropped as soon as it is packed (a no-op unless the matrix views
        // a mapped file), so a large matrix such as a 262,144-row output
        // never sits in memory three times over.
        const CHUNK: usize = 256;
        let base = BytePtr(dst.as_mut_ptr());
        pool.for_each_chunk(self.rows.div_ceil(CHUNK), |c| {
            let (r0, r1) = (c * CHUNK, ((c + 1) * CHUNK).min(self.rows));
            let src = &self.data[r0 * rb..r1 * rb];
            let d = base;
            // SAFETY: `dst` has rows * rb (+ PAD) bytes (asserted above);
            // chunk c writes only bytes r0 * rb..r1 * rb of it, which no
            // other chunk touches, and `dst` is borrowed for the whole call.
            let out = unsafe { std::slice::from_raw_parts_mut(d.0.add(r0 * rb), src.len()) };
            // CHUNK is a whole number of row groups, so only the last
            // chunk ends in a partial group: the matrix's own tail.
            x86::pack_weight_rows(self.dtype, src, rb, out);
            self.data.slice(r0 * rb, src.len()).release_pages_behind();
        });
        // Once more over the whole matrix: a chunk packed on another
        // thread may have faulted a shared boundary page back in. The page
        // holding the last row stays for the next matrix in the file (or
        // the load's final `release_original`): released now, it would come
        // back with its neighbours when that matrix is packed.
        self.data.release_pages_behind();
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn packed_rows(&self, _pool: &Pool) -> &[u8] {
        &self.data
    }
}

/// How activation rows are laid out for the kernel that reads them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ActLayout {
    /// Standard blocks (scalar reference, K-quant and float kernels).
    Standard,
    /// Rearranged per group of 8 blocks for the packed one-token kernels.
    Packed,
    /// The wide layout of the several-token kernels (`x86::WIDE_GROUP`).
    Wide,
}

/// From how many tokens on `t` runs the wide kernels: each weight row is
/// expanded once per call into unsigned codes, so the inner loop is one
/// load and one dot product per row and token tile (prefill's rate). Below
/// it (decode, a batched decode step, a speculative verify) it runs the
/// few-row kernels of [`x86::gemm_fn`]: each interleaved group or row tile
/// is decoded once per tile of tokens and applied to all of them while it
/// is in registers, so the matrix streams once, as for one token, and the
/// expansion a wide call pays for every row is not paid. The crossover,
/// measured on an Intel Xeon (AVX-512, 2 threads, load 9-13: noisy; matmul
/// times of examples/kernels.rs at 1, 2, 4, 8, 16 and 32 tokens on the
/// Qwen2.5-1.5B, Gemma 3 and SmolLM2 shapes): at 4 tokens the few-row
/// kernels took 0.2-0.6x the wide ones' time for Q4_0, Q5_0, Q4_K, Q6_K and
/// Q4_1, but 2x for Q8_0 (whose one-token tiles pay the sign trick for
/// every token: the wide kernel sums (w + 128) * y instead); at 8 the
/// interleaved ones (Q4_0, Q5_0, Q4_K, Q6_K) 0.5-1.2x, Q4_1 1.0-2.0x; at 16
/// the interleaved ones 0.6-1.7x.
///
/// Q4_K on Intel runs the few-row kernels at every width. On an Intel Xeon
/// (Sapphire Rapids class VM, 2 threads, quiet, examples/kernels.rs at
/// AVX-512, alternating binaries) the few-row Q4_K kernel held 156-169
/// GMAC/s from 8 to 512 tokens, while the wide one took 3.0-5.9 ms against
/// 1.3 ms at 16 tokens (Qwen2.5-1.5B ffn up, 8960 x 1536) and 121-137
/// GMAC/s against 154-159 at 512; AVX2 the same (156 / 145 GMAC/s at 16 /
/// 512 few-row). A Qwen2.5-Coder-1.5B forward of 16 rows cost 6.7x one
/// row with the wide kernel. The wide kernel stays the choice elsewhere (it
/// gave the Zen 4 table's Q4_K prefill); both equal the scalar reference
/// bit for bit, so the choice never changes a result.
///
/// Q8_0 and Q4_1 on Intel go wide from 16 and 32 tokens instead of 4 and 8.
/// Same Xeon, 2 threads, examples/kernels.rs, once the one-token kernels
/// stopped multiplying subnormals: the SmolLM2 Q8_0 output (49152 x 576)
/// took 1.04-1.06 ms few-row against 1.96-2.15 wide at 4 tokens, 2.0 against
/// 2.55 at 8, and the same at 16 (3.8-3.9 against 3.9-4.1); SmolLM2's Q4_1
/// ffn down 47-51 against 62-63 us at 8 tokens, 90-93 against 100 at 16, the
/// same at 32; at 64 and 512 tokens the wide kernels win (Q8_0 141 against
/// 108 GMAC/s at 64, Q4_1 174 against 158). A SmolLM2 forward of 8 rows
/// went from 15.4-15.6 to 10.1-10.4 ms, of 16 from 21.7-23.2 to 17.3-17.8.
///
/// Q5_K on Intel runs the few-row kernels at every width too, once they
/// held two interleaved groups per AVX-512 vector (Qwen3-30B-A3B's expert
/// gate, 768 x 2048: 112-125 us against 378-393 wide at 16 tokens, 429-469
/// against 945-974 at 64, 5.2-5.5 ms against 6.6-7.0 at 512; same Xeon,
/// 2 threads, examples/kernels.rs, alternating binaries).
///
/// Q5_0 on Intel never goes wide, Q4_0 from 64 tokens and Q6_K from 32
/// (were 16), once their few-row kernels held two interleaved groups per
/// AVX-512 vector. Same Xeon, 2 threads, examples/kernels.rs, alternating
/// binaries: Gemma 3's Q5_0 ffn up (2048 x 640) took 124 us few-row against
/// 360 wide at 16 tokens, 1000-1020 against 1180 at 128 and 4000-4140
/// against 4100-4200 at 512; Llama-3.2-3B's Q4_0 ffn up (8192 x 3072) 1.80-
/// 1.86 ms against 2.37-2.74 at 16 tokens, 3.4-3.7 against 3.8-4.1 at 32,
/// about the same at 64; the Q6_K matrices at 16 tokens 135 against 179 us
/// (Gemma ffn down), 1.35 against 1.69 ms (Qwen2.5-1.5B ffn down), 25
/// against 33 ms (its output), and about the same at 32.
///
/// Q4_1 is interleaved like Q4_0 since 2026-12-05 and runs the same few-row
/// kernels (`gemm_qx8::<1>`): on the Intel Xeon SmolLM2's Q4_1 ffn up and
/// down held 100-190 GMAC/s few-row and wide alike from 32 to 512 tokens
/// (2 threads, noisy), so the Intel crossover stays 32; elsewhere it takes
/// Q4_0's (16) instead of the per-row layout's 8, unmeasured on AMD.
///
/// With the few-row tiles at 8 tokens (2026-12-05) the Intel crossovers
/// depend on the level. Same Xeon, 2 threads, examples/kernels.rs,
/// alternating builds. At AVX-512: SmolLM2's Q4_1 ffn up and down few-row
/// 127-230 against 206-378 us wide at 32 tokens, 262-268 against 321-326
/// at 64, 492-526 against 605-667 at 128, 1060-1146 against 1235-1445 at
/// 256 and about the same at 512 (wide from 512); Llama-3.2-3B's Q4_0 ffn
/// up 5.5 against 6.5-6.8 ms at 64, the same at 128 and wide ahead from
/// 256 (wide from 128); the Q6_K ffn downs of Gemma 3 and Qwen2.5-1.5B
/// few-row ahead or level to 128 and behind from 256 (wide from 128). At
/// AVX2 the few-row Q6_K tile lost from 8 tokens (Qwen2.5-1.5B's ffn down
/// 1.39-1.40 ms against 0.92-0.93 wide at 8, 2.63-2.65 against 1.50-1.54
/// at 16; level at 4, ahead at 2), so AVX2 on Intel goes wide from 8; its
/// Q4_0 and Q4_1 keep 64 and 32 (the few-row Q4_0 lost at 64 and above).
fn wide_from(t: GgmlType) -> usize {
    let intel = Isa::intel();
    #[cfg(target_arch = "x86_64")]
    let avx512 = Isa::best() == Isa::Avx512;
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    match t {
        GgmlType::Q4K | GgmlType::Q5K if intel => usize::MAX,
        GgmlType::Q5_0 if intel => usize::MAX,
        GgmlType::Q4_0 if intel && avx512 => 128,
        GgmlType::Q4_0 if intel => 64,
        GgmlType::Q6K if intel && avx512 => 128,
        GgmlType::Q6K if intel => 8,
        GgmlType::Q8_0 if intel => 16,
        GgmlType::Q4_1 if intel && avx512 => 512,
        GgmlType::Q4_1 if intel => 32,
        GgmlType::Q8_0 => 4,
        _ => 16,
    }
}

/// The activation layout for `w` at `precision` over `n_tok` tokens.
fn act_layout(w: &QMatrix, precision: Precision, n_tok: usize) -> ActLayout {
    if precision != Precision::Quantized {
        return ActLayout::Standard;
    }
    #[cfg(target_arch = "x86_64")]
    if n_tok >= wide_from(w.dtype) && x86::wide_fn(Isa::best(), w.dtype).is_some() {
        return ActLayout::Wide;
    }
    let _ = (w, n_tok);
    #[cfg(target_arch = "x86_64")]
    if w.repacks() && x86::packs(w.dtype) {
        return ActLayout::Packed;
    }
    ActLayout::Standard
}

/// The weight bytes the kernels read: the repacked copy for repacked types.
fn kernel_rows<'a>(w: &'a QMatrix, pool: &Pool, layout: ActLayout) -> &'a [u8] {
    #[cfg(target_arch = "x86_64")]
    if w.repacks() && (layout != ActLayout::Standard || x86::interleaves(w.dtype)) {
        return w.packed_rows(pool);
    }
    let _ = (pool, layout);
    &w.data
}

/// A pointer to a byte buffer that several threads fill disjoint parts of.
#[derive(Clone, Copy)]
struct BytePtr(*mut u8);
// SAFETY: only used to write bytes that no other thread reads or writes
// during the call (each chunk owns its rows); the buffer outlives the call.
unsafe impl Send for BytePtr {}
unsafe impl Sync for BytePtr {}

/// Buffers a matmul reuses from the previous call on the same thread, so
/// decode (a few hundred small matmuls a token) does not allocate: the
/// quantized activation rows, a staging row, and the output pointers of
/// [`matmul_many`]. Only the calling thread touches them; the pool's
/// workers read `acts` through the borrowed closure during the call.
#[derive(Default)]
struct Scratch {
    acts: Vec<u8>,
    tmp: Vec<u8>,
    dsts: Vec<OutPtr>,
    /// [`matmul_each`]'s quantized inputs, one after another.
    each: Vec<u8>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// Runs `f` with this thread's [`Scratch`] (a fresh one if a call on this
/// thread already holds it).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// Work chunks per thread for products below [`wide_from`] tokens
/// (decode, few rows): few and long, so each thread streams long runs of weight
/// rows. Many short chunks cost decode its bandwidth: every chunk starts its
/// weight stream cold (the kernels prefetch a fixed distance ahead of the
/// rows they read), and the threads' chunks alternate. On a Zen 4 VM (2
/// threads, medians of 5 alternating runs of SmolLM2 tg64), 8 chunks per
/// thread gave 213 tok/s, 2 gave 262 and 1 gave 260; per op, q/k/v went from
/// 0.58 to 0.45 ms a token and gate/up from 1.46 to 1.12. Two rather than
/// one leave the counter some room to balance a thread the OS delays.
const DECODE_CHUNKS_PER_THREAD: usize = 2;

/// Work chunks per thread for more tokens (prefill): each chunk is long in
/// time anyway, and more of them balance the threads better.
const PREFILL_CHUNKS_PER_THREAD: usize = 8;

/// Chunks per thread for a product that runs the wide kernels (`prefill`,
/// or on paths without them as many tokens as would) or not.
fn chunks_per_thread(prefill: bool) -> usize {
    if prefill {
        PREFILL_CHUNKS_PER_THREAD
    } else {
        DECODE_CHUNKS_PER_THREAD
    }
}

/// Rows per work chunk: about `per_thread` chunks per thread, a multiple of
/// 8 rows (the kernels' row tiles, and the interleaved layouts' row groups,
/// which a chunk must start on).
fn chunk_rows(rows: usize, threads: usize, per_thread: usize) -> usize {
    let per = rows.div_ceil(threads * per_thread);
    per.div_ceil(8).max(1) * 8
}

/// `out[t][r] = sum_k w[r][k] * x[t][k]` for `n_tok` rows of `x` (\[n_tok\]\[cols\]);
/// `out` is \[n_tok\]\[rows\].
pub fn matmul(
    pool: &Pool,
    precision: Precision,
    w: &QMatrix,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
) {
    assert_eq!(x.len(), n_tok * w.cols, "matmul input shape");
    assert_eq!(out.len(), n_tok * w.rows, "matmul output shape");
    if n_tok == 0 || w.rows == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let isa = Isa::best();
        let simd_type = match precision {
            Precision::Quantized => w.dtype,
            Precision::Float if w.dtype == GgmlType::F32 => GgmlType::F32,
            Precision::Float => GgmlType::F16, // no SIMD kernel: the path below
        };
        if x86::gemm_fn(isa, simd_type).is_some() {
            matmul_simd(pool, isa, precision, w, x, n_tok, out);
            return;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let kernel = match precision {
            Precision::Quantized => w.dtype,
            Precision::Float if w.dtype == GgmlType::F32 => GgmlType::F32,
            Precision::Float => GgmlType::F16, // no NEON kernel: the path below
        };
        if arm::gemm_fn(Isa::best(), kernel).is_some() {
            matmul_arm(pool, kernel, precision, w, x, n_tok, out);
            return;
        }
    }
    matmul_scalar(pool, precision, w, x, n_tok, out);
}

/// The aarch64 kernels ([`arm`]) over standard activation rows, the weight
/// rows cut into chunks as [`matmul_scalar`] does.
#[cfg(target_arch = "aarch64")]
fn matmul_arm(
    pool: &Pool,
    kernel: GgmlType,
    precision: Precision,
    w: &QMatrix,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
) {
    let isa = Isa::best();
    let fmt = w.act_format(precision);
    with_scratch(|sc| {
        let arb = quantize_rows(pool, fmt, ActLayout::Standard, x, w.cols, n_tok, sc);
        let acts = &sc.acts;
        let wrb = w.row_bytes();
        let prefill = n_tok >= wide_from(w.dtype);
        let chunk = chunk_rows(w.rows, pool.threads(), chunks_per_thread(prefill));
        let dst = OutPtr(out.as_mut_ptr());
        let rows = w.rows;
        pool.for_each_chunk(rows.div_ceil(chunk), |c| {
            let (r0, r1) = (c * chunk, ((c + 1) * chunk).min(rows));
            let ops = arm::Operands {
                w: &w.data[r0 * wrb..r1 * wrb],
                wrb,
                a: acts,
                arb,
                cols: w.cols,
            };
            let d = dst;
            // SAFETY: `out` has n_tok * rows elements and this chunk writes
            // exactly out[t * rows + r] for r in r0..r1, t < n_tok: in bounds, and
            // no other chunk touches them; `out` is borrowed for the whole call.
            unsafe { arm::gemm(isa, kernel, &ops, r1 - r0, n_tok, d.0.add(r0), rows) };
        });
    });
}

/// Several products of the same input: `outs[i] = ws[i] · x`, as
/// [`matmul`] computes each (the same bits), with the activations quantized
/// once and all matrices' rows in one pool dispatch. For q/k/v and gate/up,
/// whose weights share an activation format (Q5_0, Q8_0 and Q4_0 share Q8_0),
/// that saves the repeated quantization and two of three thread wake-ups.
/// Matrices that need different activation encodings fall back to one
/// [`matmul`] each.
pub fn matmul_many(
    pool: &Pool,
    precision: Precision,
    ws: &[&QMatrix],
    x: &[f32],
    n_tok: usize,
    outs: &mut [&mut [f32]],
) {
    assert_eq!(ws.len(), outs.len(), "matmul_many: one output per matrix");
    let Some(first) = ws.first() else { return };
    let cols = first.cols;
    for (w, o) in ws.iter().zip(outs.iter()) {
        assert_eq!(w.cols, cols, "matmul_many: matrices share the input width");
        assert_eq!(o.len(), n_tok * w.rows, "matmul_many output shape");
    }
    assert_eq!(x.len(), n_tok * cols, "matmul input shape");
    #[cfg(target_arch = "x86_64")]
    {
        let isa = Isa::best();
        let fmt = first.act_format(precision);
        let layout = act_layout(first, precision, n_tok);
        let shared = precision == Precision::Quantized
            && n_tok > 0
            && ws.iter().all(|w| {
                x86::gemm_fn(isa, w.dtype).is_some()
                    && w.act_format(precision) == fmt
                    && act_layout(w, precision, n_tok) == layout
            });
        if shared {
            with_scratch(|sc| {
                let arb = quantize_rows(pool, fmt, layout, x, cols, n_tok, sc);
                // Repacked copies made now, not inside the dispatch below.
                for w in ws {
                    kernel_rows(w, pool, layout);
                }
                let threads = pool.threads();
                let per_thread = chunks_per_thread(layout == ActLayout::Wide);
                let n_chunks: usize = ws
                    .iter()
                    .map(|w| w.rows.div_ceil(chunk_rows(w.rows, threads, per_thread)))
                    .sum();
                sc.dsts.clear();
                sc.dsts
                    .extend(outs.iter_mut().map(|o| OutPtr(o.as_mut_ptr())));
                let (acts, dsts) = (&sc.acts, &sc.dsts);
                pool.for_each_chunk(n_chunks, |c| {
                    // Chunk c: (matrix, first row, end row), the chunks of
                    // each matrix in turn.
                    let (mut m, mut c) = (0, c);
                    let mut per = chunk_rows(ws[0].rows, threads, per_thread);
                    while c >= ws[m].rows.div_ceil(per) {
                        c -= ws[m].rows.div_ceil(per);
                        m += 1;
                        per = chunk_rows(ws[m].rows, threads, per_thread);
                    }
                    let w = ws[m];
                    let (r0, r1) = (c * per, ((c + 1) * per).min(w.rows));
                    let wrb = w.row_bytes();
                    let ops = Operands {
                        w: &kernel_rows(w, pool, layout)[r0 * wrb..],
                        wrb,
                        a: acts,
                        arb,
                        cols,
                    };
                    let d = dsts[m];
                    // SAFETY: outs[m] has n_tok * rows elements (checked above);
                    // this chunk writes exactly outs[m][t * rows + r] for r in
                    // r0..r1, t < n_tok, which no other chunk touches; the outputs
                    // are borrowed for the whole call.
                    unsafe {
                        x86::gemm(
                            isa,
                            w.dtype,
                            layout == ActLayout::Wide,
                            &ops,
                            r1 - r0,
                            n_tok,
                            d.0.add(r0),
                            w.rows,
                        )
                    };
                });
            });
            return;
        }
    }
    for (w, o) in ws.iter().zip(outs.iter_mut()) {
        matmul(pool, precision, w, x, n_tok, o);
    }
}

/// Quantizes `n_tok` activation rows into the format `fmt` (standard blocks),
/// rearranged for the kernels that read `layout`, into `sc.acts` (its
/// capacity kept from call to call); returns the bytes per row there.
fn quantize_rows(
    pool: &Pool,
    fmt: ActFormat,
    layout: ActLayout,
    x: &[f32],
    cols: usize,
    n_tok: usize,
    sc: &mut Scratch,
) -> usize {
    let arb = quant::act_row_bytes(fmt, cols);
    #[cfg(target_arch = "x86_64")]
    let parb = match layout {
        ActLayout::Standard => arb,
        ActLayout::Packed => x86::packed_act_row_bytes(fmt, cols),
        ActLayout::Wide => x86::wide_act_row_bytes(fmt, cols),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let parb = arb;
    let one = |t: usize, dst: &mut [u8], tmp: &mut Vec<u8>| {
        let xr = &x[t * cols..(t + 1) * cols];
        if layout == ActLayout::Standard {
            quant::quantize_act(fmt, xr, dst);
        } else {
            tmp.resize(arb, 0);
            quant::quantize_act(fmt, xr, tmp);
            #[cfg(target_arch = "x86_64")]
            match layout {
                ActLayout::Wide => x86::pack_act_row_wide(fmt, tmp, dst),
                _ => x86::pack_act_row(fmt, tmp, dst),
            }
        }
    };
    // Packed rows are read in whole vectors, past the last row's end.
    let pad = if layout == ActLayout::Packed { 64 } else { 0 };
    let acts = &mut sc.acts;
    acts.clear();
    acts.resize(parb * n_tok + pad, 0);
    if n_tok < 8 {
        for (t, dst) in acts.chunks_exact_mut(parb).take(n_tok).enumerate() {
            one(t, dst, &mut sc.tmp);
        }
    } else {
        let parts = pool.map_ranges(n_tok, 4, |range| {
            let mut buf = vec![0u8; range.len() * parb];
            let mut tmp = Vec::new();
            for (dst, t) in buf.chunks_exact_mut(parb).zip(range) {
                one(t, dst, &mut tmp);
            }
            buf
        });
        let mut at = 0;
        for p in parts {
            acts[at..at + p.len()].copy_from_slice(&p);
            at += p.len();
        }
    }
    parb
}

#[cfg(target_arch = "x86_64")]
fn matmul_simd(
    pool: &Pool,
    isa: Isa,
    precision: Precision,
    w: &QMatrix,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
) {
    let fmt = w.act_format(precision);
    let layout = act_layout(w, precision, n_tok);
    with_scratch(|sc| {
        let arb = quantize_rows(pool, fmt, layout, x, w.cols, n_tok, sc);
        let acts = &sc.acts;
        let wdata = kernel_rows(w, pool, layout);
        let wrb = w.row_bytes();
        let kernel = if precision == Precision::Quantized {
            w.dtype
        } else {
            GgmlType::F32
        };
        let chunk = chunk_rows(
            w.rows,
            pool.threads(),
            chunks_per_thread(layout == ActLayout::Wide),
        );
        let n_chunks = w.rows.div_ceil(chunk);
        let dst = OutPtr(out.as_mut_ptr());
        let rows = w.rows;
        pool.for_each_chunk(n_chunks, |c| {
            let r0 = c * chunk;
            let r1 = (r0 + chunk).min(rows);
            let ops = Operands {
                // To the end: packed kernels read up to PAD bytes past row r1.
                w: &wdata[r0 * wrb..],
                wrb,
                a: acts,
                arb,
                cols: w.cols,
            };
            let d = dst;
            // SAFETY: `out` has n_tok * rows elements and this chunk writes
            // exactly out[t * rows + r] for r in r0..r1, t < n_tok: in bounds, and
            // no other chunk touches them; `out` is borrowed for the whole call.
            unsafe {
                x86::gemm(
                    isa,
                    kernel,
                    layout == ActLayout::Wide,
                    &ops,
                    r1 - r0,
                    n_tok,
                    d.0.add(r0),
                    rows,
                )
            };
        });
    });
}

/// The reference path: one `quant::dot` per output element.
fn matmul_scalar(
    pool: &Pool,
    precision: Precision,
    w: &QMatrix,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
) {
    let fmt = w.act_format(precision);
    with_scratch(|sc| {
        let arb = quantize_rows(pool, fmt, ActLayout::Standard, x, w.cols, n_tok, sc);
        let acts = &sc.acts;
        let dequant = precision == Precision::Float && w.dtype != GgmlType::F32;
        let prefill = n_tok >= wide_from(w.dtype);
        let chunk = chunk_rows(w.rows, pool.threads(), chunks_per_thread(prefill));
        let n_chunks = w.rows.div_ceil(chunk);
        let dst = OutPtr(out.as_mut_ptr());
        let rows = w.rows;
        pool.for_each_chunk(n_chunks, |c| {
            let range = c * chunk..((c + 1) * chunk).min(rows);
            let mut wrow = vec![0f32; if dequant { w.cols } else { 0 }];
            let mut wbytes = vec![0u8; if dequant { w.cols * 4 } else { 0 }];
            for r in range {
                let row: &[u8] = if dequant {
                    w.dequantize_row(r, &mut wrow);
                    for (b, v) in wbytes.chunks_exact_mut(4).zip(&wrow) {
                        b.copy_from_slice(&v.to_le_bytes());
                    }
                    &wbytes
                } else {
                    w.row(r)
                };
                let wt = if dequant { GgmlType::F32 } else { w.dtype };
                for t in 0..n_tok {
                    let v = quant::dot(wt, row, &acts[t * arb..(t + 1) * arb], w.cols);
                    let d = dst;
                    // SAFETY: t * rows + r < n_tok * rows = out.len(); row r
                    // belongs to this chunk only; `out` outlives the call.
                    unsafe { *d.0.add(t * rows + r) = v };
                }
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn matrix(t: GgmlType, rows: usize, cols: usize, seed: u64) -> QMatrix {
        let bytes = t.row_bytes(cols as u64).unwrap() as usize * rows;
        let mut z = seed;
        let mut data: Vec<u8> = (0..bytes)
            .map(|_| {
                z = z
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (z >> 56) as u8
            })
            .collect();
        // Finite scales (random bytes could make an f16 NaN).
        let scales: &[usize] = match t {
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q4_1 => &[0, 2],
            GgmlType::Q6K => &[208],
            _ => &[0],
        };
        for b in data.chunks_exact_mut(t.block_bytes()) {
            for &at in scales {
                b[at..at + 2].copy_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
            }
        }
        QMatrix::new(t, rows, cols, ByteView::from_vec(data)).unwrap()
    }

    #[test]
    fn many_equals_one_at_a_time_and_batches_equal_single_tokens() {
        let pool = Pool::new(2);
        let cols = 640;
        many_and_single_agree(
            &pool,
            cols,
            &[
                matrix(GgmlType::Q5_0, 37, cols, 1),
                matrix(GgmlType::Q8_0, 9, cols, 2),
                matrix(GgmlType::Q4_0, 64, cols, 3),
            ],
        );
        // K-quants: Q4_K interleaved by 8 rows (37 = 4 groups and a
        // standard tail), its batch through the wide kernel, one token
        // through the interleaved one.
        let cols = 512;
        many_and_single_agree(
            &pool,
            cols,
            &[
                matrix(GgmlType::Q4K, 37, cols, 4),
                matrix(GgmlType::Q6K, 9, cols, 5),
                matrix(GgmlType::Q4K, 16, cols, 6),
            ],
        );
    }

    /// Every batch width from one row to past the wide kernels' threshold
    /// (the few-row kernels below it, the wide ones from it on): each
    /// row's result is the bits of that row alone, for every type with a
    /// kernel, and matrices sharing activations give the bits of one
    /// matmul each.
    #[test]
    fn every_batch_width_equals_its_rows_alone() {
        let pool = Pool::new(2);
        let cols = 512;
        let ws = [
            matrix(GgmlType::Q4_0, 19, cols, 21),
            matrix(GgmlType::Q5_0, 19, cols, 22),
            matrix(GgmlType::Q4K, 19, cols, 23),
            matrix(GgmlType::Q6K, 19, cols, 24),
            matrix(GgmlType::Q8_0, 19, cols, 25),
            matrix(GgmlType::Q4_1, 19, cols, 26),
            matrix(GgmlType::Q5K, 19, cols, 27),
        ];
        for n in (1..=17).chain([24]) {
            many_and_single_agree_at(&pool, cols, &ws, n);
        }
    }

    #[test]
    fn repacked_rows_decode_as_the_original() {
        let pool = Pool::new(2);
        for (t, rows, cols) in [(GgmlType::Q4K, 21, 512), (GgmlType::Q4_0, 13, 640)] {
            let w = matrix(t, rows, cols, 9);
            let mut want = vec![vec![0f32; cols]; rows];
            for (r, o) in want.iter_mut().enumerate() {
                w.dequantize_row(r, o);
            }
            w.prepare(&pool);
            for (r, o) in want.iter().enumerate() {
                let mut got = vec![0f32; cols];
                w.dequantize_row(r, &mut got);
                assert_eq!(&got, o, "{t} row {r}");
            }
        }
    }

    fn many_and_single_agree(pool: &Pool, cols: usize, ws: &[QMatrix]) {
        many_and_single_agree_at(pool, cols, ws, 7);
    }

    fn many_and_single_agree_at(pool: &Pool, cols: usize, ws: &[QMatrix], n: usize) {
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 7919) % 997) as f32 / 498.0 - 1.0)
            .collect();
        let mut sep: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; n * w.rows]).collect();
        for (w, o) in ws.iter().zip(sep.iter_mut()) {
            matmul(pool, Precision::Quantized, w, &x, n, o);
        }
        let mut many: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; n * w.rows]).collect();
        {
            let refs: Vec<&QMatrix> = ws.iter().collect();
            let mut outs: Vec<&mut [f32]> = many.iter_mut().map(|v| &mut v[..]).collect();
            matmul_many(pool, Precision::Quantized, &refs, &x, n, &mut outs);
        }
        assert_eq!(sep, many);
        // One token at a time gives the same bits as the batch.
        for (w, o) in ws.iter().zip(&sep) {
            for t in 0..n {
                let mut one = vec![0f32; w.rows];
                matmul(
                    pool,
                    Precision::Quantized,
                    w,
                    &x[t * cols..(t + 1) * cols],
                    1,
                    &mut one,
                );
                assert_eq!(one, o[t * w.rows..(t + 1) * w.rows]);
            }
        }
    }
}
