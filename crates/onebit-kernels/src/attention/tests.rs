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

/// The AVX2 and AVX-512 block kernels and the scalar reference give the
/// same bits, for every type and head group, over spans whose lengths
/// take the four-position score tiles with and without a remainder.
#[test]
fn simd_block_equals_scalar_reference() {
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
                let q: Vec<f32> = (0..nh * dk).map(|i| val(i + 11)).collect();
                for (h, g) in head_groups(s, nkv - 1, MAX_GROUP) {
                    for (from, to) in [(0, BLOCK), (3, 4), (7, 7 + BLOCK - 1)] {
                        for cap in [None, Some(5.0)] {
                            let qs = &q[h * dk..(h + g) * dk];
                            let mut a = vec![0f32; g * (dv + PART_HEAD)];
                            let mut b = a.clone();
                            let (k, v) = (kc.view(), vc.view());
                            let args = (s, nkv - 1, qs, k, v, from, to, 0.3, cap);
                            run_block(
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
                                args.8,
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
                                args.8,
                                &mut Vec::new(),
                                &mut b,
                            );
                            assert!(
                                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                                "{level:?} {ty} {s:?} heads {h}+{g} span {from}..{to} cap {cap:?}"
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
