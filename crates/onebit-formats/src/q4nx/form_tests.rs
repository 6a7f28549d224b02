//! The four Q4 tile forms against tiles written here, byte by byte, from
//! the layout in `docs/q4nx-format.md` (not by the encoder under test):
//! every reader (whole tensor, one row, the repacking into ggml blocks)
//! gives the values the arithmetic of the layout gives, in both kinds, with
//! scale 0, -0, negative scales and all-zero minimums; the kind rule holds
//! per tensor in the quarter tile as in the full tile; the encoder writes the
//! same bytes as the hand-written tiles.

use super::tests::rng;
use super::*;
use crate::blocks;
use half::bf16;

/// A tile's contents before layout: per (group, row) scale and minimum as
/// bf16 bits, per (row, column) the nibble.
struct Block {
    rows: usize,
    cols: usize,
    d: Vec<u16>,
    m: Vec<u16>,
    q: Vec<u8>,
}

impl Block {
    fn d(&self, g: usize, r: usize) -> f32 {
        bf16::from_bits(self.d[g * self.rows + r]).to_f32()
    }
    fn m(&self, g: usize, r: usize) -> f32 {
        bf16::from_bits(self.m[g * self.rows + r]).to_f32()
    }
    /// w = d * q + m (asymmetric: q unsigned; symmetric: q two's complement, m = 0).
    fn value(&self, r: usize, c: usize, sym: bool) -> f32 {
        let nib = self.q[r * self.cols + c];
        let q = if sym {
            if nib >= 8 {
                nib as f32 - 16.0
            } else {
                nib as f32
            }
        } else {
            nib as f32
        };
        let m = if sym { 0.0 } else { self.m(c / 32, r) };
        self.d(c / 32, r) * q + m
    }
}

/// A value exactly representable in bf16 and in f16: +-(1 + i/8) * 2^-e.
fn exact(r: &mut impl FnMut() -> u64, negative: bool) -> u16 {
    let v = (1.0 + (r() % 8) as f32 / 8.0) * (2f32).powi(-((r() % 8) as i32 + 3));
    bf16::from_f32(if negative { -v } else { v }).to_bits()
}

fn block(rows: usize, cols: usize, sym: bool, seed: u64) -> Block {
    let mut r = rng(seed);
    let groups = cols / 32;
    let d = (0..groups * rows)
        .map(|_| {
            // Symmetric: some scales negative (as Q4_0's are).
            let neg = sym && r().is_multiple_of(2);
            exact(&mut r, neg)
        })
        .collect();
    let m = (0..groups * rows)
        .map(|_| {
            if sym {
                0
            } else {
                let neg = r().is_multiple_of(2);
                exact(&mut r, neg)
            }
        })
        .collect();
    let q = (0..rows * cols).map(|_| (r() % 16) as u8).collect();
    Block {
        rows,
        cols,
        d,
        m,
        q,
    }
}

fn put16(t: &mut [u8], at: usize, v: u16) {
    t[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// The nibble of row r into byte `at`: even rows low, odd rows high.
fn put_nibble(t: &mut [u8], at: usize, r: usize, q: u8) {
    t[at] |= if r % 2 == 1 { q << 4 } else { q };
}

/// The 32-row tiles of `bytes` bytes: d at 2*(g*32 + r), m at `m_at` +
/// 2*(g*32 + r), code of (r, c) in byte `codes_at` + (r/16)*`half` + c*8 +
/// (r%16)/2.
fn tile_32(b: &Block, bytes: usize, m_at: usize, codes_at: usize, half: usize) -> Vec<u8> {
    let mut t = vec![0u8; bytes];
    for g in 0..b.cols / 32 {
        for r in 0..32 {
            put16(&mut t, 2 * (g * 32 + r), b.d[g * 32 + r]);
            put16(&mut t, m_at + 2 * (g * 32 + r), b.m[g * 32 + r]);
        }
    }
    for r in 0..32 {
        for c in 0..b.cols {
            let at = codes_at + (r / 16) * half + c * 8 + (r % 16) / 2;
            put_nibble(&mut t, at, r, b.q[r * b.cols + c]);
        }
    }
    t
}

/// 5,120 bytes: d at 2*(g*32 + r), m at 512 + 2*(g*32 + r), code of (r, c) in
/// byte 1024 + (r/16)*2048 + c*8 + (r%16)/2.
fn full_tile(b: &Block) -> Vec<u8> {
    assert_eq!((b.rows, b.cols), (32, 256));
    tile_32(b, 5120, 512, 1024, 2048)
}

/// 2,560 bytes (the converter's `_pack_q4nx` with 32-row, 128-column
/// blocks and `keep_block_in_2D`): d at 2*(g*32 + r), m at 256 + 2*(g*32 + r),
/// code of (r, c) in byte 512 + (r/16)*1024 + c*8 + (r%16)/2.
fn half_tile(b: &Block) -> Vec<u8> {
    assert_eq!((b.rows, b.cols), (32, 128));
    tile_32(b, 2560, 256, 512, 1024)
}

/// 1,280 bytes: d at 2*(g*16 + r), m at 128 + 2*(g*16 + r), code of (r, c)
/// in byte 256 + c*8 + r/2.
fn quarter_tile(b: &Block) -> Vec<u8> {
    assert_eq!((b.rows, b.cols), (16, 128));
    let mut t = vec![0u8; 1280];
    for g in 0..4 {
        for r in 0..16 {
            put16(&mut t, 2 * (g * 16 + r), b.d[g * 16 + r]);
            put16(&mut t, 128 + 2 * (g * 16 + r), b.m[g * 16 + r]);
        }
    }
    for r in 0..16 {
        for c in 0..128 {
            put_nibble(&mut t, 256 + c * 8 + r / 2, r, b.q[r * 128 + c]);
        }
    }
    t
}

/// 4,608 bytes: d at 2*(g*32 + r), no minimums, code of (r, c) in byte
/// 512 + c*16 + r/2 (column order: a column's 32 rows in 16 bytes).
fn chunk(b: &Block) -> Vec<u8> {
    assert_eq!((b.rows, b.cols), (32, 256));
    let mut t = vec![0u8; 4608];
    for g in 0..8 {
        for r in 0..32 {
            put16(&mut t, 2 * (g * 32 + r), b.d[g * 32 + r]);
        }
    }
    for r in 0..32 {
        for c in 0..256 {
            put_nibble(&mut t, 512 + c * 16 + r / 2, r, b.q[r * 256 + c]);
        }
    }
    t
}

fn write_tile(form: TileForm, b: &Block) -> Vec<u8> {
    match form {
        TileForm::Full => full_tile(b),
        TileForm::Half => half_tile(b),
        TileForm::Quarter => quarter_tile(b),
        TileForm::Chunk4608 => chunk(b),
    }
}

/// A tensor of `pr` x `pc` hand-written tiles (row-major block order) and
/// the values the layout says it holds ([n][k]).
fn tensor(
    form: TileForm,
    pr: usize,
    pc: usize,
    sym: bool,
    seed: u64,
) -> (Q4Shape, Vec<u8>, Vec<f32>) {
    let (rows, cols) = (form.rows(), form.cols());
    let (n, k) = (pr * rows, pc * cols);
    let mut data = Vec::new();
    let mut want = vec![0f32; n * k];
    for p in 0..pr {
        for q in 0..pc {
            let b = block(rows, cols, sym, seed + (p * pc + q) as u64);
            data.extend(write_tile(form, &b));
            for r in 0..rows {
                for c in 0..cols {
                    want[(p * rows + r) * k + q * cols + c] = b.value(r, c, sym);
                }
            }
        }
    }
    (Q4Shape::of(form, n, k).unwrap(), data, want)
}

/// Every tensor reader's values: whole tensor, each row, the ggml repack.
fn read_every_way(s: Q4Shape, data: &[u8]) -> Result<[Vec<f32>; 3]> {
    let (_, whole) = decode_tensor(data, s)?;
    let mut rows = vec![0f32; s.n * s.k];
    for (i, o) in rows.chunks_exact_mut(s.k).enumerate() {
        decode_row(data, s, i, o)?;
    }
    let (dt, b, inexact) = to_ggml(data, s)?;
    assert_eq!(inexact, 0, "scales chosen exact in f16");
    let mut kern = vec![0f32; s.n * s.k];
    blocks::dequantize(dt, &b, &mut kern).unwrap();
    Ok([whole, rows, kern])
}

#[test]
fn each_form_and_kind_reads_the_values_its_layout_holds() {
    let mut ran = Vec::new();
    for form in TileForm::ALL {
        for sym in [false, true] {
            if !sym && form == TileForm::Chunk4608 {
                continue; // the chunk has no minimums
            }
            let (s, data, want) = tensor(form, 2, 3, sym, 17);
            assert_eq!(data.len(), 6 * form.bytes());
            let kind = if sym {
                Q4Kind::Symmetric
            } else {
                Q4Kind::Asymmetric
            };
            assert_eq!(tensor_kind_of(form, &data), Ok(kind), "{form:?}");
            for (how, got) in ["tensor", "rows", "ggml"]
                .iter()
                .zip(read_every_way(s, &data).unwrap())
            {
                assert!(got == want, "{form:?} {kind:?}: {how} reader differs");
            }
            // The encoder writes the bytes the layout says.
            let mut g = Q4Groups {
                shape: s,
                kind,
                d: vec![0; s.n * s.k / 32],
                m: vec![0; s.n * s.k / 32],
                nib: vec![0; s.n * s.k],
            };
            let (rows, cols, tpr) = (form.rows(), form.cols(), s.tiles_per_row());
            for p in 0..s.n / rows {
                for q in 0..tpr {
                    let b = block(rows, cols, sym, 17 + (p * tpr + q) as u64);
                    for r in 0..rows {
                        let row = p * rows + r;
                        for gl in 0..cols / 32 {
                            let gg = q * cols / 32 + gl;
                            g.d[row * s.k / 32 + gg] = b.d[gl * rows + r];
                            g.m[row * s.k / 32 + gg] = b.m[gl * rows + r];
                        }
                        for c in 0..cols {
                            g.nib[row * s.k + q * cols + c] = b.q[r * cols + c];
                        }
                    }
                }
            }
            assert!(
                encode(&g) == data,
                "{form:?} {kind:?}: encoder bytes differ"
            );
            ran.push(format!("{form:?}/{}", kind.name()));
        }
    }
    eprintln!("forms and kinds read: {}", ran.join(", "));
}

#[test]
fn the_declared_row_width_names_the_form_and_nothing_else_does() {
    assert_eq!(TileForm::from_row_bytes(5120), Some(TileForm::Full));
    assert_eq!(TileForm::from_row_bytes(1280), Some(TileForm::Quarter));
    assert_eq!(TileForm::from_row_bytes(4608), Some(TileForm::Chunk4608));
    for w in [0, 640, 1024, 2560, 4266, 4096, 5121, 10240] {
        assert_eq!(TileForm::from_row_bytes(w), None, "{w}");
    }
    // Shapes as FastFlowLM writes them: [N/16, Kp/128, 1280] for K = 640.
    let s = Q4Shape::of(TileForm::Quarter, 1024, 640).unwrap();
    assert_eq!(s.stored_shape(), vec![64, 5, 1280]);
    assert_eq!(s.bytes(), 1024 * 640 * 5 / 8);
    let s = Q4Shape::of(TileForm::Chunk4608, 64, 640).unwrap();
    assert_eq!(s.stored_shape(), vec![2, 3, 4608]);
    assert_eq!(Q4Shape::new(64, 640).unwrap().stored_shape(), vec![6, 5120]);
    // The half tile (gpt-oss packs only, so no width names it): [N/32, Kp/128, 2560].
    let s = Q4Shape::of(TileForm::Half, 64, 2880).unwrap();
    assert_eq!(s.stored_shape(), vec![2, 23, 2560]);
    assert_eq!(s.bytes(), 64 * 2944 * 5 / 8);
    // Quarter tiles take 16-row matrices; the others 32.
    assert!(Q4Shape::of(TileForm::Quarter, 48, 128).is_ok());
    let e = Q4Shape::of(TileForm::Chunk4608, 48, 256).unwrap_err().0;
    assert!(e.contains("32 rows") && e.contains("4,608"), "{e}");
}

/// A quarter tile with every scale `d`, minimum `m` and code `nib`, written
/// from the layout.
fn uniform_quarter(nib: u8, d: f32, m: f32) -> Vec<u8> {
    let b = Block {
        rows: 16,
        cols: 128,
        d: vec![bf16::from_f32(d).to_bits(); 64],
        m: vec![bf16::from_f32(m).to_bits(); 64],
        q: vec![nib; 16 * 128],
    };
    quarter_tile(&b)
}

/// The last value of row 0 of a 16 x 128*t quarter-tile tensor by every reader.
fn last_value_every_way(data: &[u8]) -> Vec<std::result::Result<f32, String>> {
    let t = data.len() / 1280;
    let s = Q4Shape::of(TileForm::Quarter, 16, 128 * t).unwrap();
    match read_every_way(s, data) {
        Ok(v) => v.iter().map(|x| Ok(x[s.k - 1])).collect(),
        Err(e) => {
            // Each reader on its own, so each refusal is seen.
            let mut row = vec![0f32; s.k];
            vec![
                decode_tensor(data, s).map(|_| 0.0).map_err(|e| e.0),
                decode_row(data, s, 0, &mut row)
                    .map(|_| 0.0)
                    .map_err(|e| e.0),
                to_ggml(data, s).map(|_| 0.0).map_err(|e| e.0),
                Err(e.0),
            ]
        }
    }
}

#[test]
fn quarter_tile_kind_rule_is_the_full_tiles_edge_values_included() {
    // All-zero minimums, positive scales: undecided, reads asymmetric alone
    // and beside an asymmetric tile.
    let undecided = uniform_quarter(15, 1.0, 0.0);
    assert_eq!(
        tile_kind_of(TileForm::Quarter, &undecided),
        TileKind::Undecided
    );
    for data in [
        undecided.clone(),
        [uniform_quarter(1, 1.0, 0.25), undecided.clone()].concat(),
    ] {
        for v in last_value_every_way(&data) {
            assert_eq!(v, Ok(15.0));
        }
    }
    // A symmetric tile (zero minimums, a negative scale) makes its undecided
    // neighbour symmetric in every reader: code 0xC = -4.
    let data = [
        uniform_quarter(0xC, -1.0, 0.0),
        uniform_quarter(0xC, 1.0, 0.0),
    ]
    .concat();
    assert_eq!(
        tensor_kind_of(TileForm::Quarter, &data),
        Ok(Q4Kind::Symmetric)
    );
    for v in last_value_every_way(&data) {
        assert_eq!(v, Ok(-4.0), "the undecided tile follows its tensor");
    }
    // -0 minimums are zero; a -0 scale is not below zero; scale 0 reads 0.
    let t = uniform_quarter(1, -0.0, -0.0);
    assert_eq!(tile_kind_of(TileForm::Quarter, &t), TileKind::Undecided);
    for v in last_value_every_way(&t) {
        assert_eq!(v.map(f32::abs), Ok(0.0));
    }
    let t = uniform_quarter(1, -1.0, -0.0);
    assert_eq!(tile_kind_of(TileForm::Quarter, &t), TileKind::Symmetric);
    // One non-zero minimum anywhere (group 3, row 15) decides asymmetric.
    let mut t = uniform_quarter(1, -1.0, 0.0);
    put16(
        &mut t,
        128 + 2 * (3 * 16 + 15),
        bf16::from_f32(0.5).to_bits(),
    );
    assert_eq!(tile_kind_of(TileForm::Quarter, &t), TileKind::Asymmetric);
    // Both kinds in one tensor: refused by every reader.
    let data = [uniform_quarter(3, -1.0, 0.0), uniform_quarter(3, 1.0, 0.5)].concat();
    let all = last_value_every_way(&data);
    assert_eq!(all.len(), 4);
    for v in all {
        let e = v.expect_err("mixed refused");
        assert!(e.contains("both tile kinds"), "{e}");
    }
}

#[test]
fn chunk_is_symmetric_by_its_size_and_refuses_asymmetric_weights() {
    // Every scale positive: a full tile would be undecided; a chunk is not.
    let b = Block {
        rows: 32,
        cols: 256,
        d: vec![bf16::from_f32(0.5).to_bits(); 256],
        m: vec![0; 256],
        q: vec![0x9; 32 * 256],
    };
    let t = chunk(&b);
    assert_eq!(tile_kind_of(TileForm::Chunk4608, &t), TileKind::Symmetric);
    let s = Q4Shape::of(TileForm::Chunk4608, 32, 256).unwrap();
    for v in read_every_way(s, &t).unwrap() {
        assert!(v.iter().all(|&x| x == -3.5), "0x9 = -7, times 0.5");
    }
    let e = from_ggml(GgmlType::Q4_1, &[0u8; 8 * 20], s).unwrap_err().0;
    assert!(e.contains("asymmetric") && e.contains("4,608"), "{e}");
}

#[test]
fn quarter_pad_columns_are_zero_bytes_that_read_as_zero_and_are_dropped() {
    // K = 96: one quarter tile per 16 rows, columns 96..128 are padding.
    let (n, k) = (16, 96);
    let mut r = rng(3);
    let mut blocks_q4_1 = vec![0u8; n * k / 32 * 20];
    for blk in blocks_q4_1.chunks_exact_mut(20) {
        blk.iter_mut().for_each(|b| *b = r() as u8);
        blk[0..2].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
        blk[2..4].copy_from_slice(&half::f16::from_f32(-1.0).to_le_bytes());
    }
    let s = Q4Shape::of(TileForm::Quarter, n, k).unwrap();
    let t = from_ggml(GgmlType::Q4_1, &blocks_q4_1, s).unwrap();
    assert_eq!(t.len(), 1280);
    // Group 3 (columns 96..128): scale and minimum bytes 0, codes 0.
    for row in 0..16 {
        assert_eq!(&t[2 * (3 * 16 + row)..][..2], &[0, 0]);
        assert_eq!(&t[128 + 2 * (3 * 16 + row)..][..2], &[0, 0]);
    }
    assert!(t[256 + 96 * 8..].iter().all(|&b| b == 0));
    let mut tile = vec![1f32; 16 * 128];
    decode_tile_of(TileForm::Quarter, &t, Q4Kind::Asymmetric, &mut tile);
    assert!(tile
        .chunks(128)
        .all(|row| row[96..].iter().all(|&v| v == 0.0)));
    let (_, v) = decode_tensor(&t, s).unwrap();
    assert_eq!(v.len(), n * k, "padding dropped");
}

#[test]
fn a_matrix_written_in_any_form_reads_back_to_the_same_weights() {
    // Q4_1 and Q4_0 blocks of a 64 x 640 matrix (K off the 256 grid).
    let (n, k) = (64, 640);
    for dtype in [GgmlType::Q4_1, GgmlType::Q4_0] {
        let bb = dtype.block_bytes();
        let mut r = rng(dtype as u64 + 11);
        let mut b = vec![0u8; n * k / 32 * bb];
        for blk in b.chunks_exact_mut(bb) {
            blk.iter_mut().for_each(|x| *x = r() as u8);
            let neg = dtype == GgmlType::Q4_0 && r().is_multiple_of(2);
            let d = bf16::from_bits(exact(&mut r, neg));
            blk[0..2].copy_from_slice(&half::f16::from_f32(d.to_f32()).to_le_bytes());
            if dtype == GgmlType::Q4_1 {
                let m = bf16::from_bits(exact(&mut r, true)).to_f32();
                blk[2..4].copy_from_slice(&half::f16::from_f32(m).to_le_bytes());
            }
        }
        let mut want = vec![0f32; n * k];
        blocks::dequantize(dtype, &b, &mut want).unwrap();
        let mut forms = 0;
        for form in TileForm::ALL {
            let s = Q4Shape::of(form, n, k).unwrap();
            let Ok(t) = from_ggml(dtype, &b, s) else {
                assert!(dtype == GgmlType::Q4_1 && form == TileForm::Chunk4608);
                continue;
            };
            assert_eq!(t.len(), s.bytes());
            let (dt, back, inexact) = to_ggml(&t, s).unwrap();
            assert_eq!((dt, inexact), (dtype, 0));
            assert!(back == b, "{dtype} through {form:?}: blocks differ");
            for got in read_every_way(s, &t).unwrap() {
                assert!(got == want, "{dtype} through {form:?}");
            }
            forms += 1;
        }
        assert_eq!(forms, if dtype == GgmlType::Q4_0 { 4 } else { 3 });
    }
}
