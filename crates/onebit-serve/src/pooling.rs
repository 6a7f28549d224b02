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

    /// Pools `rows` ([n][width]) into one L2-normalized vector; the mean is
    /// kept in f64 up to the normalization.
    pub fn pool(&self, rows: &[f32], width: usize) -> Vec<f32> {
        normalize(&self.pooled(rows, width))
    }

    /// Pools `rows` ([n][width]), passes the pooled vector (rounded to f32,
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
        let n = rows.len() / width;
        let mut v = vec![0f64; width];
        let pick: Box<dyn Iterator<Item = &[f32]>> = match self.kind {
            PoolKind::Mean => Box::new(rows.chunks_exact(width)),
            PoolKind::Cls => Box::new(rows.chunks_exact(width).take(1)),
            PoolKind::Last => Box::new(rows.chunks_exact(width).skip(n.saturating_sub(1))),
        };
        let mut count = 0usize;
        for r in pick {
            for (a, &x) in v.iter_mut().zip(r) {
                *a += f64::from(x);
            }
            count += 1;
        }
        let count = count.max(1) as f64;
        v.iter_mut().for_each(|a| *a /= count);
        v
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
}
