//! How a text's hidden states become one embedding: the pooling a model
//! declares (GGUF `<arch>.pooling_type`; mean for a generative model that
//! declares none), then L2 normalization. Pure arithmetic: a leaf.

/// How the rows of a text's hidden states become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The mean over every position.
    Mean,
    /// The first position's (the BOS/CLS token).
    Cls,
    /// The last position's.
    Last,
}

/// The pooling a model runs, and where that rule came from.
#[derive(Clone, Debug)]
pub struct Pooling {
    pub kind: PoolKind,
    pub source: String,
}

impl Pooling {
    /// From the value of GGUF `<arch>.pooling_type` (llama.cpp's enum:
    /// 0 none, 1 mean, 2 cls, 3 last, 4 rank); `None` when the key is absent,
    /// which for a generative model means mean pooling. An error names the
    /// value this server does not implement.
    pub fn from_gguf(value: Option<i64>, key: &str) -> Result<Pooling, String> {
        let (kind, source) = match value {
            None | Some(-1) => (
                PoolKind::Mean,
                format!("{key} absent: mean over the final normed hidden states"),
            ),
            Some(1) => (PoolKind::Mean, format!("GGUF {key} = 1 (mean)")),
            Some(2) => (PoolKind::Cls, format!("GGUF {key} = 2 (cls)")),
            Some(3) => (PoolKind::Last, format!("GGUF {key} = 3 (last)")),
            Some(0) => return Err(format!("{key} = 0 (none: per-token embeddings) is not implemented; only mean, cls and last pooling are")),
            Some(4) => return Err(format!("{key} = 4 (rank: a reranker's score) is not implemented; only mean, cls and last pooling are")),
            Some(x) => return Err(format!("{key} = {x} is not a pooling type llama.cpp defines (0 to 4)")),
        };
        Ok(Pooling { kind, source })
    }

    /// Pools `rows` (\[n\]\[width\]) into one L2-normalized vector; the mean is
    /// kept in f64 up to the normalization.
    pub fn pool(&self, rows: &[f32], width: usize) -> Vec<f32> {
        normalize(&self.pooled(rows, width))
    }

    /// Pools `rows` (\[n\]\[width\]), passes the pooled vector (rounded to f32,
    /// what the head's matrices read) through the model's pooled head
    /// (`Model::pooled_head`: EmbeddingGemma's dense layers), and
    /// L2-normalizes the result, in llama.cpp's order.
    pub fn pool_through(
        &self,
        rows: &[f32],
        width: usize,
        head: impl Fn(&[f32]) -> Vec<f32>,
    ) -> Vec<f32> {
        let pooled: Vec<f32> = self.pooled(rows, width).iter().map(|&a| a as f32).collect();
        let out: Vec<f64> = head(&pooled).into_iter().map(f64::from).collect();
        normalize(&out)
    }

    /// The pooled vector in f64: the mean, the first or the last row.
    fn pooled(&self, rows: &[f32], width: usize) -> Vec<f64> {
        let mut sum = self.start(width);
        sum.push(rows);
        sum.pooled()
    }

    /// An empty running pool for a text whose hidden rows arrive in chunks
    /// (a prompt prefilled over several engine steps): pushing the rows in
    /// order, in any chunks, gives the same bits as pooling them at once.
    pub fn start(&self, width: usize) -> PoolSum {
        PoolSum {
            kind: self.kind,
            width,
            sum: vec![0f64; width],
            count: 0,
        }
    }
}

/// A pool over rows that arrive in order, chunk by chunk (see
/// [`Pooling::start`]): the f64 running sum of the rows pooled so far (all
/// for the mean, the first for cls, the latest for last) and their count.
#[derive(Clone, Debug)]
pub struct PoolSum {
    kind: PoolKind,
    width: usize,
    sum: Vec<f64>,
    count: usize,
}

impl PoolSum {
    /// Adds the next `rows` (\[n\]\[width\]) of the text.
    pub fn push(&mut self, rows: &[f32]) {
        let w = self.width;
        let pick: &[f32] = match self.kind {
            PoolKind::Mean => rows,
            PoolKind::Cls if self.count == 0 => &rows[..w.min(rows.len())],
            PoolKind::Cls => &[],
            PoolKind::Last => {
                if rows.len() < w {
                    return;
                }
                // Only the latest row counts: start the sum again.
                self.sum.iter_mut().for_each(|a| *a = 0.0);
                self.count = 0;
                &rows[rows.len() - w..]
            }
        };
        for r in pick.chunks_exact(w) {
            for (a, &x) in self.sum.iter_mut().zip(r) {
                *a += f64::from(x);
            }
            self.count += 1;
        }
    }

    fn pooled(mut self) -> Vec<f64> {
        let count = self.count.max(1) as f64;
        self.sum.iter_mut().for_each(|a| *a /= count);
        self.sum
    }

    /// The pooled vector (rounded to f32) through the model's pooled head,
    /// L2-normalized: what [`Pooling::pool_through`] gives for all the rows.
    pub fn finish_through(self, head: impl Fn(&[f32]) -> Vec<f32>) -> Vec<f32> {
        let pooled: Vec<f32> = self.pooled().iter().map(|&a| a as f32).collect();
        let out: Vec<f64> = head(&pooled).into_iter().map(f64::from).collect();
        normalize(&out)
    }
}

/// `v / |v|` (a zero vector stays zero), in f32.
fn normalize(v: &[f64]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    v.iter().map(|x| (x * scale) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_types_follow_llamacpp_enum_and_unknown_ones_are_refused() {
        let k = "llama.pooling_type";
        assert_eq!(Pooling::from_gguf(None, k).unwrap().kind, PoolKind::Mean);
        assert_eq!(Pooling::from_gguf(Some(1), k).unwrap().kind, PoolKind::Mean);
        assert_eq!(Pooling::from_gguf(Some(2), k).unwrap().kind, PoolKind::Cls);
        assert_eq!(Pooling::from_gguf(Some(3), k).unwrap().kind, PoolKind::Last);
        for bad in [0, 4, 7] {
            let e = Pooling::from_gguf(Some(bad), k).unwrap_err();
            assert!(e.contains(k) && e.contains(&bad.to_string()), "{e}");
        }
    }

    #[test]
    fn pooling_arithmetic() {
        // Rows (3,0), (1,0), (0,4): mean (4/3, 4/3) normalizes to (1,1)/sqrt2;
        // cls (3,0) to (1,0); last (0,4) to (0,1).
        let rows = [3.0, 0.0, 1.0, 0.0, 0.0, 4.0];
        let p = |kind| Pooling {
            kind,
            source: String::new(),
        };
        let m = p(PoolKind::Mean).pool(&rows, 2);
        let h = std::f32::consts::FRAC_1_SQRT_2;
        assert!((m[0] - h).abs() < 1e-7 && (m[1] - h).abs() < 1e-7, "{m:?}");
        assert_eq!(p(PoolKind::Cls).pool(&rows, 2), vec![1.0, 0.0]);
        assert_eq!(p(PoolKind::Last).pool(&rows, 2), vec![0.0, 1.0]);
        // Rows (1,0), (0,5), (0,0): mean (1/3, 5/3), normalized (1,5)/sqrt26.
        // Rounding the mean to f32 first would give 0.19611615 (1/3 and 5/3
        // round differently); kept in f64 it is 1/sqrt26 to f32.
        let m = p(PoolKind::Mean).pool(&[1.0, 0.0, 0.0, 5.0, 0.0, 0.0], 2);
        let r = 26f64.sqrt();
        assert_eq!(m, vec![(1.0 / r) as f32, (5.0 / r) as f32]);
    }

    #[test]
    fn pooling_in_chunks_gives_the_bits_of_pooling_at_once() {
        // Seven rows of width 3 whose f64 sums are order-sensitive (1e16 + 1
        // - 1e16 is 0, not 1, when summed left to right): split anyhow, the
        // running pool adds them in the same order, so the bits agree.
        let rows: Vec<f32> = [
            1e16, 1.0, 0.1, 1.0, -3.0, 0.2, -1e16, 2.0, 0.3, 0.5, 1e-8, 0.4, 3.0, 7.0, 0.5, -2.0,
            1.5, 0.6, 0.25, 4.0, 0.7,
        ]
        .to_vec();
        for kind in [PoolKind::Mean, PoolKind::Cls, PoolKind::Last] {
            let p = Pooling {
                kind,
                source: String::new(),
            };
            let whole = p.pool_through(&rows, 3, |v| v.to_vec());
            for cuts in [vec![7], vec![1, 6], vec![3, 1, 3], vec![1; 7]] {
                let mut sum = p.start(3);
                let mut at = 0;
                for n in cuts {
                    sum.push(&rows[at * 3..(at + n) * 3]);
                    at += n;
                }
                let chunked = sum.finish_through(|v| v.to_vec());
                assert_eq!(chunked, whole, "{kind:?}");
            }
        }
        // The arithmetic itself: last is row 6 normalized, cls row 0.
        let last = Pooling {
            kind: PoolKind::Last,
            source: String::new(),
        }
        .pool(&rows, 3);
        let c = f64::from(0.7f32);
        let k = 1.0 / (0.25f64 * 0.25 + 16.0 + c * c).sqrt();
        assert_eq!(
            last,
            vec![(0.25 * k) as f32, (4.0 * k) as f32, (c * k) as f32]
        );
    }
}
