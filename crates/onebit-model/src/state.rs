//! Per-sequence state: everything a sequence carries between forward calls.
//! One value, cloned to snapshot and assigned to restore, so speculative
//! decoding and a prefix cache can rewind a sequence exactly.

#[derive(Clone, Debug, Default)]
pub struct KvCache {
    /// [positions][n_head_kv * head_dim_k]
    pub k: Vec<f32>,
    /// [positions][n_head_kv * head_dim_v]
    pub v: Vec<f32>,
}

impl KvCache {
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        self.k.extend_from_slice(k);
        self.v.extend_from_slice(v);
    }
}

#[derive(Clone, Debug, Default)]
pub struct SeqState {
    /// Positions already run.
    pub pos: usize,
    kv: Vec<KvCache>,
}

impl SeqState {
    pub fn new(n_layer: usize) -> SeqState {
        SeqState {
            pos: 0,
            kv: vec![KvCache::default(); n_layer],
        }
    }
    pub fn kv_mut(&mut self, layer: usize) -> &mut KvCache {
        &mut self.kv[layer]
    }
    /// A copy to restore later.
    pub fn snapshot(&self) -> SeqState {
        self.clone()
    }
    pub fn restore(&mut self, snap: &SeqState) {
        self.clone_from(snap);
    }
    /// Back to an empty sequence, keeping allocations.
    pub fn reset(&mut self) {
        self.pos = 0;
        for c in &mut self.kv {
            c.k.clear();
            c.v.clear();
        }
    }
    /// Bytes held by the caches.
    pub fn bytes(&self) -> usize {
        self.kv.iter().map(|c| (c.k.len() + c.v.len()) * 4).sum()
    }
}
