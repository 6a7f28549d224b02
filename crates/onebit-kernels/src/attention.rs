//! Causal softmax attention of one query position over a KV cache.

use crate::ops::softmax;

/// Shapes of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
}

/// Attention for one query row over cache positions `from..to` (the query's own
/// position is `to - 1`). `q` is [n_head * head_dim_k], already scaled by nothing;
/// `k_cache` rows are [n_head_kv * head_dim_k] per position, `v_cache` likewise.
/// Query head h reads KV head h / (n_head / n_head_kv). Writes [n_head * head_dim_v].
#[allow(clippy::too_many_arguments)]
pub fn attend(
    shape: AttnShape,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    from: usize,
    to: usize,
    scale: f32,
    softcap: Option<f32>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let AttnShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
    } = shape;
    let group = n_head / n_head_kv;
    let kv_row_k = n_head_kv * dk;
    let kv_row_v = n_head_kv * dv;
    for h in 0..n_head {
        let kvh = h / group;
        let qh = &q[h * dk..(h + 1) * dk];
        scores.clear();
        for p in from..to {
            let kh = &k_cache[p * kv_row_k + kvh * dk..p * kv_row_k + (kvh + 1) * dk];
            let mut s = 0f32;
            for (a, b) in qh.iter().zip(kh) {
                s += a * b;
            }
            let mut s = s * scale;
            if let Some(cap) = softcap {
                s = cap * (s / cap).tanh();
            }
            scores.push(s);
        }
        softmax(scores);
        let oh = &mut out[h * dv..(h + 1) * dv];
        oh.fill(0.0);
        for (i, p) in (from..to).enumerate() {
            let w = scores[i];
            let vh = &v_cache[p * kv_row_v + kvh * dv..p * kv_row_v + (kvh + 1) * dv];
            for (o, &v) in oh.iter_mut().zip(vh) {
                *o += w * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_head_two_positions_by_hand() {
        // q = [1, 0]; keys [1, 0] and [0, 1]: scores 1 and 0 (scale 1);
        // weights e/(e+1) = 0.7310586 and 0.2689414; values [10], [20].
        let shape = AttnShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 1,
        };
        let mut out = [0.0];
        attend(
            shape,
            &[1.0, 0.0],
            &[1.0, 0.0, 0.0, 1.0],
            &[10.0, 20.0],
            0,
            2,
            1.0,
            None,
            &mut Vec::new(),
            &mut out,
        );
        assert!((out[0] - (10.0 * 0.731_058_6 + 20.0 * 0.268_941_4)).abs() < 1e-4);
        // A window that starts at position 1 sees only the second value.
        attend(
            shape,
            &[1.0, 0.0],
            &[1.0, 0.0, 0.0, 1.0],
            &[10.0, 20.0],
            1,
            2,
            1.0,
            None,
            &mut Vec::new(),
            &mut out,
        );
        assert_eq!(out[0], 20.0);
    }

    #[test]
    fn grouped_heads_share_kv() {
        // 2 query heads, 1 kv head: both read the same single value.
        let shape = AttnShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim_k: 1,
            head_dim_v: 1,
        };
        let mut out = [0.0; 2];
        attend(
            shape,
            &[1.0, -1.0],
            &[0.5],
            &[7.0],
            0,
            1,
            1.0,
            None,
            &mut Vec::new(),
            &mut out,
        );
        assert_eq!(out, [7.0, 7.0]);
    }
}
