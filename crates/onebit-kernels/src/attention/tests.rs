//! Attention against a float64 reference and across levels, batches and
//! thread counts: the same bits whatever the split.

use super::*;
use crate::kv::{KvRows, KvType};

fn shape(n_head: usize, n_head_kv: usize, head_dim_k: usize, head_dim_v: usize) -> AttnShape {
    AttnShape {
        n_head,
        n_head_kv,
        head_dim_k,
        head_dim_v,
    }
}

/// One row attended alone on one thread.
#[allow(clippy::too_many_arguments)]
fn attend_one(
    s: AttnShape,
    q: &[f32],
    k: KvView,
    v: KvView,
    from: usize,
    to: usize,
    scale: f32,
    cap: Option<f32>,
) -> Vec<f32> {
    let mut out = vec![0f32; s.n_head * s.head_dim_v];
    attend_rows(
        &Pool::new(1),
        s,
        q,
        &[(from, to)],
        k,
        v,
        scale,
        cap,
        &mut out,
    );
    out
}

#[test]
fn one_head_two_positions_by_hand() {
    // q = [1, 0]; keys [1, 0] and [0, 1]: scores 1 and 0 (scale 1);
    // weights e/(e+1) = 0.7310586 and 0.2689414; values [10], [20].
    let s = shape(1, 1, 2, 1);
    let (k, v) = ([1.0, 0.0, 0.0, 1.0], [10.0, 20.0]);
    let (k, v) = (KvView::F32(&k), KvView::F32(&v));
    let out = attend_one(s, &[1.0, 0.0], k, v, 0, 2, 1.0, None);
    assert!((out[0] - (10.0 * 0.731_058_6 + 20.0 * 0.268_941_4)).abs() < 1e-4);
    // A window that starts at position 1 sees only the second value.
    let out = attend_one(s, &[1.0, 0.0], k, v, 1, 2, 1.0, None);
    assert_eq!(out[0], 20.0);
}

#[test]
fn grouped_heads_share_kv() {
    // 2 query heads, 1 kv head: both read the same single value.
    let s = shape(2, 1, 1, 1);
    let out = attend_one(
        s,
        &[1.0, -1.0],
        KvView::F32(&[0.5]),
        KvView::F32(&[7.0]),
        0,
        1,
        1.0,
        None,
    );
    assert_eq!(out, [7.0, 7.0]);
}

fn val(i: usize) -> f32 {
    ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 1.3
}

/// A cache of `n_pos` rows of `width` values stored as `ty`.
fn cache(ty: KvType, n_pos: usize, width: usize, salt: usize) -> KvRows {
    let mut r = KvRows::new(ty, width);
    let x: Vec<f32> = (0..n_pos * width).map(|i| val(i + salt)).collect();
    r.push(&x);
    r
}

/// The same rows widened to f32.
fn widened(r: &KvRows) -> Vec<f32> {
    let mut x = vec![0f32; r.rows() * r.width()];
    for (p, row) in x.chunks_exact_mut(r.width()).enumerate() {
        r.row_f32(p, row);
    }
    x
}

/// (n_head, n_head_kv, head_dim_k, head_dim_v, rows): query groups of 1,
/// 3, 4, 5 (4 + 1) and 8 (4 + 4) heads; value widths with 16-, 8- and
/// 1-column parts; row counts that take the per-row path and the
/// per-block one (fewer rows than 2 * threads).
const CASES: [(usize, usize, usize, usize, usize); 8] = [
    (6, 2, 20, 13, 5),
    (4, 1, 256, 256, 7),
    (5, 1, 24, 24, 6),
    (8, 1, 9, 31, 4),
    (3, 3, 16, 8, 4),
    (4, 1, 32, 40, 1),
    (6, 2, 20, 13, 2),
    (9, 3, 64, 64, 1),
];

/// Positions in the test caches: three blocks and a part.
const N_POS: usize = 2 * BLOCK + BLOCK / 2 + 7;

#[test]
fn rows_equal_one_at_a_time_for_every_kv_type() {
    for ty in KvType::ALL {
        for (nh, nkv, dk, dv, rows) in CASES {
            if ty.check_head_dim(dk).is_err() || ty.check_head_dim(dv).is_err() {
                continue;
            }
            let s = shape(nh, nkv, dk, dv);
            let (kc, vc) = (cache(ty, N_POS, nkv * dk, 0), cache(ty, N_POS, nkv * dv, 5));
            let q: Vec<f32> = (0..rows * nh * dk).map(|i| val(i + 11)).collect();
            // Spans of odd and even lengths (the K rows go in pairs),
            // over one to three blocks, one that starts late (a sliding
            // window).
            let spans: Vec<(usize, usize)> = (0..rows)
                .map(|r| (r * 37, N_POS - rows + r + 1 - (r % 3) * BLOCK))
                .collect();
            for cap in [Some(5.0), None] {
                for threads in [1, 2, 3] {
                    let pool = Pool::new(threads);
                    let mut batch = vec![0f32; rows * nh * dv];
                    let (k, v) = (kc.view(), vc.view());
                    attend_rows(&pool, s, &q, &spans, k, v, 0.3, cap, &mut batch);
                    for (r, &(from, to)) in spans.iter().enumerate() {
                        let qr = &q[r * nh * dk..(r + 1) * nh * dk];
                        let one = attend_one(s, qr, k, v, from, to, 0.3, cap);
                        let got = &batch[r * nh * dv..(r + 1) * nh * dv];
                        assert!(
                            one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{ty}: {s:?} rows {rows} row {r} threads {threads} cap {cap:?}"
                        );
                    }
                }
            }
        }
    }
}

/// Attention over an f16 or q8_0 cache is the f32 attention over the
/// cache's widened values, bit for bit: the types differ only in what
/// they store.
#[test]
fn every_type_attends_as_f32_over_its_widened_values() {
    let (nh, nkv, dk, dv) = (9, 3, 64, 64);
    let s = shape(nh, nkv, dk, dv);
    let q: Vec<f32> = (0..nh * dk).map(|i| val(i + 11)).collect();
    for ty in [KvType::F16, KvType::Q8_0] {
        let (kc, vc) = (cache(ty, N_POS, nkv * dk, 0), cache(ty, N_POS, nkv * dv, 5));
        let (kw, vw) = (widened(&kc), widened(&vc));
        let a = attend_one(s, &q, kc.view(), vc.view(), 0, N_POS, 0.125, None);
        let b = attend_one(
            s,
            &q,
            KvView::F32(&kw),
            KvView::F32(&vw),
            0,
            N_POS,
            0.125,
            None,
        );
        assert_eq!(a, b, "{ty}");
    }
}

/// Against softmax attention in f64 over the same (widened) values: a
/// block left out of the running max or the fold, or a fold with the
/// wrong rescaling, is far outside the bound.
#[test]
fn blocked_softmax_matches_a_float64_reference() {
    let (nh, nkv, dk, dv) = (4, 2, 32, 24);
    let s = shape(nh, nkv, dk, dv);
    let q: Vec<f32> = (0..nh * dk).map(|i| val(i + 11) * 2.0).collect();
    let kc = cache(KvType::F32, N_POS, nkv * dk, 0);
    let vw = widened(&cache(KvType::F32, N_POS, nkv * dv, 5));
    // The largest scores sit in later blocks, so the running max
    // changes after the first block: by a few units, then by hundreds in
    // the second block and by somewhat less in the last (beyond what e^x
    // spans in f32 without the max subtracted).
    for boost in [3.0, 100.0] {
        let mut kw = widened(&kc);
        let row = nkv * dk;
        for x in &mut kw[(BLOCK + 10) * row..(BLOCK + 13) * row] {
            *x *= boost;
        }
        for x in &mut kw[(N_POS - 3) * row..] {
            *x *= boost * 0.6;
        }
        for (from, to) in [(0, N_POS), (5, 2 * BLOCK + 1), (BLOCK, BLOCK + 1)] {
            let got = attend_one(
                s,
                &q,
                KvView::F32(&kw),
                KvView::F32(&vw),
                from,
                to,
                0.2,
                None,
            );
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let sc: Vec<f64> = (from..to)
                    .map(|p| {
                        let kr = &kw[p * nkv * dk + kvh * dk..][..dk];
                        let qh = &q[h * dk..(h + 1) * dk];
                        0.2 * qh
                            .iter()
                            .zip(kr)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = w.iter().sum();
                for c in 0..dv {
                    let want: f64 = (from..to)
                        .zip(&w)
                        .map(|(p, w)| w * vw[p * nkv * dv + kvh * dv + c] as f64)
                        .sum::<f64>()
                        / l;
                    let g = got[h * dv + c] as f64;
                    assert!(
                        (g - want).abs() <= 2e-6 * (1.0 + want.abs()),
                        "boost {boost} span {from}..{to} head {h} col {c}: {g} vs {want}"
                    );
                }
            }
        }
    }
}

/// The levels this CPU runs attention at, scalar first.
fn levels() -> Vec<Isa> {
    Isa::all()
        .iter()
        .copied()
        .filter(|l| l.supported() && *l <= level())
        .collect()
}

/// The AVX2 and AVX-512 block kernels and the scalar reference give the
/// same bits, for every type and tile of one to four query vectors (to
/// eight at the AVX-512 level: two to a 512-bit register), over
/// parts of a block whose lengths take the four-position score tiles with
/// and without a remainder: all vectors over the same positions, and each
/// over its own (a verify step's last block, where the earlier rows stop
/// short; a sliding window's first, where the later rows start late; and
/// ranges that overlap only in part).
#[test]
fn simd_tile_equals_scalar_reference() {
    #[cfg(target_arch = "x86_64")]
    {
        if !Isa::Avx2.supported() {
            eprintln!("attention levels: ran scalar; this CPU cannot run avx2");
            return;
        }
        let levels: Vec<Isa> = [Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.supported())
            .collect();
        for (ty, &level) in KvType::ALL
            .iter()
            .flat_map(|t| levels.iter().map(move |l| (*t, l)))
        {
            for (nh, nkv, dk, dv, _) in CASES {
                if ty.check_head_dim(dk).is_err() || ty.check_head_dim(dv).is_err() {
                    continue;
                }
                let s = shape(nh, nkv, dk, dv);
                let (kc, vc) = (cache(ty, N_POS, nkv * dk, 0), cache(ty, N_POS, nkv * dv, 5));
                let q: Vec<f32> = (0..TILE_WIDE * dk).map(|i| val(i + 11)).collect();
                let tile = if level == Isa::Avx512 {
                    TILE_WIDE
                } else {
                    TILE
                };
                for n in 1..=tile {
                    let tiles: [Vec<(usize, usize)>; 6] = [
                        vec![(0, BLOCK); n],
                        vec![(3, 4); n],
                        vec![(7, 7 + BLOCK - 1); n],
                        (0..n).map(|g| (BLOCK, BLOCK + 9 - n + g)).collect(),
                        (0..n).map(|g| (2 * BLOCK - 50 + g, 2 * BLOCK)).collect(),
                        (0..n).map(|g| (5 * g, 40 + 13 * (g % 3))).collect(),
                    ];
                    for ranges in &tiles {
                        for cap in [None, Some(5.0)] {
                            let qs = &q[..n * dk];
                            let mut a = vec![0f32; n * (dv + PART_HEAD)];
                            let mut b = a.clone();
                            let (k, v) = (kc.view(), vc.view());
                            let args = (s, nkv - 1, qs, &ranges[..], k, v, 0.3, cap);
                            run_tile(
                                true,
                                level == Isa::Avx512,
                                args.0,
                                args.1,
                                args.2,
                                args.3,
                                args.4,
                                args.5,
                                args.6,
                                args.7,
                                (dk, dv),
                                &mut Vec::new(),
                                &mut a,
                            );
                            block_scalar(
                                args.0,
                                args.1,
                                args.2,
                                args.3,
                                args.4,
                                args.5,
                                args.6,
                                args.7,
                                &mut Vec::new(),
                                &mut b,
                            );
                            assert!(
                                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                                "{level:?} {ty} {s:?} ranges {ranges:?} cap {cap:?}"
                            );
                        }
                    }
                }
            }
        }
        eprintln!("attention {}", Isa::levels_line());
    }
    #[cfg(not(target_arch = "x86_64"))]
    eprintln!("attention levels: ran scalar; no SIMD attention on this architecture");
}

/// One row over `span` alone, at the scalar level on one thread.
#[allow(clippy::too_many_arguments)]
fn alone(
    s: AttnShape,
    q: &[f32],
    span: (usize, usize),
    k: KvView,
    v: KvView,
    scale: f32,
    cap: Option<f32>,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let mut out = vec![0f32; s.n_head * s.head_dim_v];
    let spans = [span];
    let mut seq = [SeqAttn {
        q,
        spans: &spans,
        k,
        v,
        out: &mut out,
    }];
    attend_seqs_at(Isa::Scalar, &Pool::new(1), s, &mut seq, scale, cap, sinks);
    out
}

/// The spans of a step's `rows` new rows at positions p0.. (causal among
/// themselves), with a sliding window of `window` positions or none.
fn step_spans(p0: usize, rows: usize, window: Option<usize>) -> Vec<(usize, usize)> {
    (0..rows)
        .map(|i| {
            let p = p0 + i;
            (window.map_or(0, |w| (p + 1).saturating_sub(w)), p + 1)
        })
        .collect()
}

/// A verify step: k = 1..=16 (and 17, 20, 33: more than one row group)
/// new rows of one sequence, causal among themselves, at depths whose rows
/// cross a block boundary and the four-position score tiles, with and
/// without a sliding window, sinks and a soft-cap, on 1 and 3 threads, at
/// every level: each row is the bits of that row attended alone at the
/// scalar level. Query groups of 6 (Qwen2.5-1.5B's), 4, 1 and 7 heads; head
/// sizes not a multiple of 8.
#[test]
fn a_verify_steps_rows_each_equal_the_row_alone_at_every_level() {
    let shapes = [
        (12, 2, 64, 64),
        (4, 1, 32, 40),
        (3, 3, 16, 8),
        (14, 2, 20, 13),
    ];
    let levels = levels();
    for (nh, nkv, dk, dv) in shapes {
        let s = shape(nh, nkv, dk, dv);
        let sinks: Vec<f32> = (0..nh).map(|h| val(h + 3) * 4.0).collect();
        for ty in KvType::ALL {
            if ty.check_head_dim(dk).is_err() || ty.check_head_dim(dv).is_err() {
                continue;
            }
            // Depths: within block 0, across the first block boundary,
            // across the second.
            for p0 in [5usize, 2 * BLOCK - 6, BLOCK - 3] {
                let max_rows = 33;
                let (kc, vc) = (
                    cache(ty, p0 + max_rows, nkv * dk, 1),
                    cache(ty, p0 + max_rows, nkv * dv, 7),
                );
                let (k, v) = (kc.view(), vc.view());
                for rows in (1..=16).chain([17, 20, 33]) {
                    let q: Vec<f32> = (0..rows * nh * dk).map(|i| val(3 * i + rows)).collect();
                    // No window; one that starts inside the rows' first
                    // block; one shorter than the step.
                    for (window, sk, cap) in [
                        (None, None, None),
                        (Some(100), Some(&sinks[..]), Some(5.0)),
                        (Some(7), None, None),
                    ] {
                        let spans = step_spans(p0, rows, window);
                        let want: Vec<Vec<f32>> = spans
                            .iter()
                            .enumerate()
                            .map(|(r, &sp)| {
                                let qr = &q[r * nh * dk..(r + 1) * nh * dk];
                                alone(s, qr, sp, k, v, 0.3, cap, sk)
                            })
                            .collect();
                        for &isa in &levels {
                            for threads in [1, 3] {
                                let mut out = vec![0f32; rows * nh * dv];
                                let mut seq = [SeqAttn {
                                    q: &q,
                                    spans: &spans,
                                    k,
                                    v,
                                    out: &mut out,
                                }];
                                let pool = Pool::new(threads);
                                attend_seqs_at(isa, &pool, s, &mut seq, 0.3, cap, sk);
                                for (r, w) in want.iter().enumerate() {
                                    let got = &out[r * nh * dv..(r + 1) * nh * dv];
                                    assert!(
                                        w.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                                        "{isa:?} {ty} {s:?} p0 {p0} rows {rows} row {r} \
                                         window {window:?} threads {threads}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!("attention verify rows: ran {levels:?}");
}

/// A batched step: one row each of six sequences over their own caches
/// (depths inside one block, across several, one empty span), and a
/// sequence's three verify rows, in one call: each row is the bits of
/// that row alone, at every level and on 1, 2 and 3 threads.
#[test]
fn a_batched_steps_rows_each_equal_the_row_alone_at_every_level() {
    let (nh, nkv, dk, dv) = (12, 2, 64, 64);
    let s = shape(nh, nkv, dk, dv);
    let levels = levels();
    for ty in KvType::ALL {
        // (depth before the step, rows, window)
        let seqs = [
            (0, 1, None),
            (40, 1, None),
            (3 * BLOCK + 17, 1, None),
            (BLOCK - 1, 1, Some(50)),
            (700, 1, Some(300)),
            (2 * BLOCK - 2, 3, None),
        ];
        let caches: Vec<(KvRows, KvRows)> = seqs
            .iter()
            .enumerate()
            .map(|(i, &(d, rows, _))| {
                (
                    cache(ty, d + rows, nkv * dk, 100 * i),
                    cache(ty, d + rows, nkv * dv, 100 * i + 9),
                )
            })
            .collect();
        let mut spans: Vec<Vec<(usize, usize)>> = seqs
            .iter()
            .map(|&(d, rows, w)| step_spans(d, rows, w))
            .collect();
        // A row that sees nothing gets zeros.
        spans[1][0] = (40, 40);
        let qs: Vec<Vec<f32>> = seqs
            .iter()
            .enumerate()
            .map(|(i, &(_, rows, _))| (0..rows * nh * dk).map(|j| val(j * 5 + i)).collect())
            .collect();
        let want: Vec<Vec<f32>> = (0..seqs.len())
            .flat_map(|i| {
                let (k, v) = (caches[i].0.view(), caches[i].1.view());
                let (q, spans) = (&qs[i], &spans[i]);
                (0..spans.len())
                    .map(move |r| {
                        let qr = &q[r * nh * dk..(r + 1) * nh * dk];
                        alone(s, qr, spans[r], k, v, 0.125, None, None)
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(want[1].iter().all(|&x| x == 0.0));
        for &isa in &levels {
            for threads in [1, 2, 3] {
                let mut outs: Vec<Vec<f32>> = seqs
                    .iter()
                    .map(|&(_, rows, _)| vec![f32::NAN; rows * nh * dv])
                    .collect();
                let mut batch: Vec<SeqAttn> = outs
                    .iter_mut()
                    .enumerate()
                    .map(|(i, out)| SeqAttn {
                        q: &qs[i],
                        spans: &spans[i],
                        k: caches[i].0.view(),
                        v: caches[i].1.view(),
                        out,
                    })
                    .collect();
                attend_seqs_at(isa, &Pool::new(threads), s, &mut batch, 0.125, None, None);
                let got: Vec<&[f32]> = outs.iter().flat_map(|o| o.chunks_exact(nh * dv)).collect();
                for (r, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert!(
                        w.iter()
                            .zip(g.iter())
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?} {ty} row {r} threads {threads}"
                    );
                }
            }
        }
    }
    eprintln!("attention batched rows: ran {levels:?}");
}

/// The plan reads each cache block once per step for a sequence's rows (up
/// to a row group) and all query heads of a KV head: every (sequence, row
/// group, KV head, block) that some row reaches is in exactly one item,
/// with all its vectors, for a verify step (as many KV heads as threads:
/// a unit each, whole; more threads: its blocks spread over them), one with
/// a sliding window, a batched decode step (many sequences: a unit per
/// item) and a step of three row groups (three reads). Only when the
/// blocks are fewer than twice the threads (a short context) are a
/// block's vectors cut over several items, in whole tiles, each vector in
/// one.
#[test]
fn the_plan_reads_each_block_once_per_kv_head_and_row_group() {
    use std::collections::HashMap;
    let (nkv, group, ph) = (2, 6, 2 + 64);
    let verify = step_spans(1000, 8, None);
    let windowed = step_spans(1000, 5, Some(300));
    let decode: Vec<Vec<(usize, usize)>> =
        (0..8).map(|i| step_spans(500 + 97 * i, 1, None)).collect();
    let long = step_spans(300, 40, None);
    let short = step_spans(100, 3, None);
    // (spans, threads, whether units are spread over the threads, whether
    // a block's vectors may be cut)
    type Case<'a> = (Vec<&'a [(usize, usize)]>, usize, bool, bool);
    let cases: [Case; 7] = [
        (vec![&verify[..]], 2, false, false),
        (vec![&verify[..]], 4, true, false),
        (vec![&windowed[..]], 3, true, false),
        (decode.iter().map(|d| &d[..]).collect(), 2, false, false),
        (vec![&long[..]], 3, false, false),
        (vec![&windowed[..]], 4, true, true),
        (vec![&short[..]], 3, true, true),
    ];
    for (spans, threads, spread, cut) in cases {
        let p = plan(&spans, nkv, group, ph, threads);
        assert_eq!(p.parts_len > 0, spread, "{spans:?} on {threads} threads");
        // Every item is in one chunk.
        let chunked: usize = p.chunks.iter().map(|c| c.len()).sum();
        assert_eq!(chunked, p.items.len());
        // Items reading each (sequence, row group, KV head, block), and
        // each vector's count there.
        // (sequence, row group, KV head, block) -> (items, per vector)
        type Reads = HashMap<(usize, usize, usize, usize), (usize, Vec<usize>)>;
        let mut reads = Reads::new();
        for item in &p.items {
            let (u, bs, vecs) = match item {
                Item::Whole(u) => {
                    let u = &p.units[*u];
                    (u, u.blocks.clone(), 0..u.rows * group)
                }
                Item::Block { unit, b, vecs } => (&p.units[*unit], *b..*b + 1, vecs.clone()),
            };
            if vecs.len() < u.rows * group {
                assert!(cut, "{spans:?}: a block's vectors cut over items");
                let nvec = u.rows * group;
                let tiles = vecs.start % TILE == 0 && (vecs.len() % TILE == 0 || vecs.end == nvec);
                assert!(vecs.len() <= TILE || tiles, "{vecs:?}");
            }
            for b in bs {
                let e = reads
                    .entry((u.seq, u.row0, u.kvh, b))
                    .or_insert((0, vec![0; u.rows * group]));
                e.0 += 1;
                vecs.clone().for_each(|j| e.1[j] += 1);
            }
        }
        let mut want = 0;
        for (si, sp) in spans.iter().enumerate() {
            for row0 in (0..sp.len()).step_by(ROW_GROUP) {
                let rows = &sp[row0..(row0 + ROW_GROUP).min(sp.len())];
                let lo = rows.iter().map(|r| r.0 / BLOCK).min().unwrap();
                let hi = rows.iter().map(|r| (r.1 - 1) / BLOCK).max().unwrap();
                for kvh in 0..nkv {
                    for b in lo..=hi {
                        let (n, per_vec) = &reads[&(si, row0, kvh, b)];
                        assert!(cut || *n == 1, "{spans:?}: block {b} read {n} times");
                        assert!(per_vec.iter().all(|&c| c == 1), "{spans:?}: {per_vec:?}");
                        want += 1;
                    }
                }
            }
        }
        assert_eq!(reads.len(), want);
    }
}

#[test]
fn a_sink_weighs_in_the_denominator_by_hand() {
    // As `one_head_two_positions_by_hand` with a sink of 0.5: weights
    // e^1, e^0 over e^1 + e^0 + e^0.5 (the sink takes its share and gives
    // no value): 10 e / (e + 1 + e^0.5) + 20 / (e + 1 + e^0.5).
    let s = shape(1, 1, 2, 1);
    let (k, v) = ([1.0, 0.0, 0.0, 1.0], [10.0, 20.0]);
    let (k, v) = (KvView::F32(&k), KvView::F32(&v));
    let mut out = [0f32];
    let sinks = [0.5f32];
    let pool = Pool::new(1);
    attend_rows_sinks(
        &pool,
        s,
        &[1.0, 0.0],
        &[(0, 2)],
        k,
        v,
        1.0,
        None,
        Some(&sinks),
        &mut out,
    );
    let e = std::f64::consts::E;
    let want = (10.0 * e + 20.0) / (e + 1.0 + 0.5f64.exp());
    assert!((out[0] as f64 - want).abs() < 1e-4, "{} vs {want}", out[0]);
    // A very large sink takes almost all the weight: the output goes to 0.
    attend_rows_sinks(
        &pool,
        s,
        &[1.0, 0.0],
        &[(0, 2)],
        k,
        v,
        1.0,
        None,
        Some(&[40.0]),
        &mut out,
    );
    assert!(out[0].abs() < 1e-12, "{}", out[0]);
}

/// Sinks against the f64 softmax with one more logit per head, on the
/// per-row and the per-block paths, on 1 and 3 threads (same bits), and a
/// sink of -inf is no sink, bit for bit.
#[test]
fn sinks_match_a_float64_reference_and_minus_infinity_is_none() {
    let (nh, nkv, dk, dv) = (4, 2, 32, 24);
    let s = shape(nh, nkv, dk, dv);
    let kc = cache(KvType::F32, N_POS, nkv * dk, 0);
    let vc = cache(KvType::F32, N_POS, nkv * dv, 5);
    let (kw, vw) = (widened(&kc), widened(&vc));
    // Sinks below, near and above the heads' score ranges.
    let sinks = [-3.0f32, 0.4, 2.5, 9.0];
    for rows in [1usize, 6] {
        let q: Vec<f32> = (0..rows * nh * dk).map(|i| val(i + 11) * 2.0).collect();
        let spans: Vec<(usize, usize)> = (0..rows).map(|r| (r * 9, N_POS - r * 40)).collect();
        let run = |threads: usize, sk: Option<&[f32]>| {
            let mut out = vec![0f32; rows * nh * dv];
            let pool = Pool::new(threads);
            attend_rows_sinks(
                &pool,
                s,
                &q,
                &spans,
                kc.view(),
                vc.view(),
                0.2,
                None,
                sk,
                &mut out,
            );
            out
        };
        let got = run(1, Some(&sinks));
        assert_eq!(
            got,
            run(3, Some(&sinks)),
            "rows {rows}: threads change the bits"
        );
        let none = run(2, None);
        let minus_inf = run(2, Some(&[f32::NEG_INFINITY; 4]));
        assert!(
            none.iter()
                .zip(&minus_inf)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rows {rows}: a -inf sink changed the output"
        );
        for (r, &(from, to)) in spans.iter().enumerate() {
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let qh = &q[(r * nh + h) * dk..][..dk];
                let sc: Vec<f64> = (from..to)
                    .map(|p| {
                        let kr = &kw[p * nkv * dk + kvh * dk..][..dk];
                        0.2 * qh
                            .iter()
                            .zip(kr)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                    })
                    .collect();
                let sink = sinks[h] as f64;
                let m = sc.iter().copied().fold(sink, f64::max);
                let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = w.iter().sum::<f64>() + (sink - m).exp();
                for c in 0..dv {
                    let want: f64 = (from..to)
                        .zip(&w)
                        .map(|(p, w)| w * vw[p * nkv * dv + kvh * dv + c] as f64)
                        .sum::<f64>()
                        / l;
                    let g = got[(r * nh + h) * dv + c] as f64;
                    assert!(
                        (g - want).abs() <= 2e-6 * (1.0 + want.abs()),
                        "rows {rows} row {r} head {h} col {c}: {g} vs {want}"
                    );
                }
            }
        }
    }
}
