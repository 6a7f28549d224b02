//! Per-sequence state: everything a sequence carries between forward calls
//! (attention KV caches, short-conv histories, delta-net recurrent states).
//! One value, cloned to snapshot and assigned to restore, so speculative
//! decoding and a prefix cache can rewind a sequence exactly. The KV caches
//! hold the run's [`KvType`]; snapshots, truncation and prefixes copy the
//! stored elements as they are, so a rewound sequence continues bit for bit.
//! A row's rotary position is its index, less the positions the grid images
//! before it saved ([`GridSpan`]); cutting a sequence inside such an image
//! is refused, since its rows' positions exist only as a whole.

pub use onebit_kernels::kv::{KvRows, KvType};

use crate::semantics::{LayerKind, Semantics};

#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    /// [positions][kv heads x head_dim_k] (`Semantics::kv_widths` of the layer's kind)
    pub k: KvRows,
    /// [positions][kv heads x head_dim_v]
    pub v: KvRows,
}

impl KvCache {
    /// An empty cache of `ty` for rows of `k_width` and `v_width` elements.
    pub fn new(ty: KvType, k_width: usize, v_width: usize) -> KvCache {
        KvCache {
            k: KvRows::new(ty, k_width),
            v: KvRows::new(ty, v_width),
        }
    }

    /// A copy of the first `n` positions.
    pub fn prefix(&self, n: usize) -> KvCache {
        KvCache {
            k: self.k.prefix(n),
            v: self.v.prefix(n),
        }
    }

    /// Keeps the first `n` positions.
    pub fn truncate(&mut self, n: usize) {
        self.k.truncate(n);
        self.v.truncate(n);
    }

    pub fn bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum LayerState {
    Attention(KvCache),
    /// The last (L - 1) conv inputs, oldest first: [(L - 1) * channels].
    ShortConv {
        history: Vec<f32>,
    },
    /// Conv history over the q|k|v channels and one d_k x d_v state per v head.
    DeltaNet {
        history: Vec<f32>,
        s: Vec<f32>,
    },
}

/// An image whose rows sit on a grid of multi-axis rotary positions
/// (`RopeSpec::sections`): rows `at..at + rows` (nx x ny of them) take
/// `n_pos` = max(nx, ny) text positions, so every later row's position is
/// `rows - n_pos` less than its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridSpan {
    pub at: usize,
    pub rows: usize,
    pub n_pos: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SeqState {
    /// Rows already run (the KV caches' length).
    pub pos: usize,
    /// The grid images among them, in order.
    pub grids: Vec<GridSpan>,
    pub layers: Vec<LayerState>,
    /// While set, the recurrent layers' states after every row run, so
    /// [`SeqState::rewind`] can go back to any position since
    /// [`SeqState::start_trail`] without re-running tokens (speculative decoding).
    pub trail: Option<Trail>,
}

/// Recurrent layers' states recorded since a start position: `start[i]` is
/// layer i's state at `pos0` (None for attention layers, which truncate), and
/// `rows[i][j]` its state after row `pos0 + j`.
#[derive(Clone, Debug, PartialEq)]
pub struct Trail {
    pub pos0: usize,
    start: Vec<Option<LayerState>>,
    rows: Vec<Vec<LayerState>>,
}

impl Trail {
    /// Records layer `il`'s state after its next row (called by the mixers).
    pub fn record(&mut self, il: usize, layer: LayerState) {
        self.rows[il].push(layer);
    }
}

impl SeqState {
    /// An empty sequence for a model: empty KV caches of type `kv`, zero
    /// conv histories and recurrent states; one slot per layer per pass of
    /// the layer stack (`Semantics::n_slots`).
    pub fn new(sem: &Semantics, kv: KvType) -> SeqState {
        let d = &sem.dims;
        let kinds = &sem.layer_kinds.value;
        let layers = (0..sem.n_slots())
            .map(|slot| match kinds[slot % kinds.len()] {
                kind @ (LayerKind::Full | LayerKind::Sliding) => {
                    // A layer that reads another layer's KV (Gemma 4's
                    // shared-KV layers) keeps an empty, zero-width cache.
                    let layer = slot % kinds.len();
                    let own = sem.kv_source.value[layer] == layer;
                    let (kw, vw) = if own { sem.kv_widths(kind) } else { (0, 0) };
                    LayerState::Attention(KvCache::new(kv, kw, vw))
                }
                LayerKind::ShortConv => {
                    let l = sem.short_conv.as_ref().map_or(1, |s| s.value);
                    LayerState::ShortConv {
                        history: vec![0.0; (l - 1) * d.n_embd],
                    }
                }
                LayerKind::DeltaNet => {
                    let dn = &sem
                        .delta_net
                        .as_ref()
                        .expect("linear layers have delta-net sizes")
                        .value;
                    let channels = 2 * dn.n_k_heads * dn.head_k_dim + dn.n_v_heads * dn.head_v_dim;
                    LayerState::DeltaNet {
                        history: vec![0.0; (dn.conv_kernel - 1) * channels],
                        s: vec![0.0; dn.n_v_heads * dn.head_k_dim * dn.head_v_dim],
                    }
                }
            })
            .collect();
        SeqState {
            pos: 0,
            grids: Vec::new(),
            layers,
            trail: None,
        }
    }

    /// The rotary (text) position of a row at index `row`, at or past the
    /// end of every grid image before it.
    pub fn text_pos(&self, row: usize) -> usize {
        let saved: usize = self
            .grids
            .iter()
            .filter(|g| g.at + g.rows <= row)
            .map(|g| g.rows - g.n_pos)
            .sum();
        row - saved
    }

    /// Whether the first `n` rows end inside a grid image.
    pub fn cuts_grid(&self, n: usize) -> bool {
        self.grids.iter().any(|g| g.at < n && n < g.at + g.rows)
    }

    /// A copy of the first `n` rows of an attention-only state (recurrent
    /// layers are cloned as they are), with the grid images among them.
    pub fn prefix(&self, n: usize) -> SeqState {
        SeqState {
            pos: n,
            grids: self
                .grids
                .iter()
                .filter(|g| g.at + g.rows <= n)
                .copied()
                .collect(),
            layers: self
                .layers
                .iter()
                .map(|l| match l {
                    LayerState::Attention(c) => LayerState::Attention(c.prefix(n)),
                    other => other.clone(),
                })
                .collect(),
            trail: None,
        }
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
        self.grids.clear();
        for l in &mut self.layers {
            match l {
                LayerState::Attention(c) => c.truncate(0),
                LayerState::ShortConv { history } => history.fill(0.0),
                LayerState::DeltaNet { history, s } => {
                    history.fill(0.0);
                    s.fill(0.0);
                }
            }
        }
    }

    /// Keeps the first `n` positions of an attention-only sequence (a prefix
    /// cache hit). Recurrent layers cannot rewind, nor can a cut fall inside
    /// a grid image: returns false for them.
    pub fn truncate(&mut self, n: usize) -> bool {
        if n == self.pos {
            return true;
        }
        let recurrent = self
            .layers
            .iter()
            .any(|l| !matches!(l, LayerState::Attention(_)));
        if n > self.pos || recurrent || self.cuts_grid(n) {
            return false;
        }
        self.grids.retain(|g| g.at + g.rows <= n);
        for l in &mut self.layers {
            if let LayerState::Attention(c) = l {
                c.truncate(n);
            }
        }
        self.pos = n;
        true
    }

    /// Starts recording recurrent states from the current position (a
    /// no-op for attention-only models, which rewind by truncating).
    pub fn start_trail(&mut self) {
        let recurrent = self
            .layers
            .iter()
            .any(|l| !matches!(l, LayerState::Attention(_)));
        self.trail = recurrent.then(|| Trail {
            pos0: self.pos,
            start: self
                .layers
                .iter()
                .map(|l| (!matches!(l, LayerState::Attention(_))).then(|| l.clone()))
                .collect(),
            rows: vec![Vec::new(); self.layers.len()],
        });
    }

    /// Back to position `n` (at most `pos`, and for a recurrent model at
    /// least the trail's start): KV rows truncated, recurrent states restored
    /// from the trail. Stops the trail. False, state untouched, if `n` is
    /// out of that range.
    pub fn rewind(&mut self, n: usize) -> bool {
        if n > self.pos || self.cuts_grid(n) {
            return false;
        }
        let trail = self.trail.take();
        if let Some(t) = &trail {
            if n < t.pos0 {
                self.trail = trail;
                return false;
            }
        } else if self
            .layers
            .iter()
            .any(|l| !matches!(l, LayerState::Attention(_)))
        {
            return n == self.pos;
        }
        for (i, l) in self.layers.iter_mut().enumerate() {
            match l {
                LayerState::Attention(c) => c.truncate(n),
                recurrent => {
                    let t = trail
                        .as_ref()
                        .expect("recurrent layers rewind from the trail");
                    *recurrent = match n - t.pos0 {
                        0 => t.start[i].clone().expect("recorded at start_trail"),
                        j => t.rows[i][j - 1].clone(),
                    };
                }
            }
        }
        self.grids.retain(|g| g.at + g.rows <= n);
        self.pos = n;
        true
    }

    /// Bytes the state would hold at `n` positions: every attention layer's
    /// K and V rows at each position, plus the fixed short-conv and
    /// delta-net states as they are.
    pub fn bytes_at(&self, n: usize) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(c) => {
                    c.k.ty().bytes(c.k.width() * n) + c.v.ty().bytes(c.v.width() * n)
                }
                LayerState::ShortConv { history } => 4 * history.len(),
                LayerState::DeltaNet { history, s } => 4 * (history.len() + s.len()),
            })
            .sum::<usize>()
    }

    /// Bytes held by the state.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(c) => c.bytes(),
                LayerState::ShortConv { history } => 4 * history.len(),
                LayerState::DeltaNet { history, s } => 4 * (history.len() + s.len()),
            })
            .sum::<usize>()
    }
}
