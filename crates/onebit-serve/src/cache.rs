//! Prefix cache: states of finished (and, for recurrent models, prefilled)
//! sequences, kept by the tokens they hold, so a request that starts the same
//! way skips recomputing that start.
//!
//! Attention-only states rewind: any common prefix of a cached sequence can
//! be reused by copying that many KV rows. Recurrent layers (short conv,
//! delta-net) cannot rewind, so their entries are reused only when the whole
//! cached token list is a prefix of the new prompt. Since batched prefill
//! gives the same logits as any split of it, bit for bit, output is the same
//! with the cache on or off.

use onebit_model::state::LayerState;
use onebit_model::SeqState;

struct Entry {
    tokens: Vec<u32>,
    state: SeqState,
    bytes: usize,
    last_used: u64,
}

pub struct PrefixCache {
    entries: Vec<Entry>,
    max_bytes: usize,
    bytes: usize,
    tick: u64,
}

/// Whether a state can be cut back to any shorter prefix.
pub fn rewindable(s: &SeqState) -> bool {
    s.layers
        .iter()
        .all(|l| matches!(l, LayerState::Attention(_)))
}

/// The first `n` positions of an attention-only state, copying only those
/// rows (and the grid images among them: the engine never cuts one).
fn prefix_copy(s: &SeqState, n: usize) -> SeqState {
    s.prefix(n)
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn new(max_bytes: usize) -> PrefixCache {
        PrefixCache {
            entries: Vec::new(),
            max_bytes,
            bytes: 0,
            tick: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The state of the longest cached prefix of `prompt`, leaving at least
    /// one prompt token to run (its logits give the first sampled token), and
    /// how many positions it holds. None on a miss.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(SeqState, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let mut best: Option<(usize, usize)> = None; // (entry, usable length)
        for (i, e) in self.entries.iter().enumerate() {
            let n = if rewindable(&e.state) {
                common_prefix(&e.tokens, prompt).min(limit)
            } else if e.tokens.len() <= limit && prompt.starts_with(&e.tokens) {
                e.tokens.len()
            } else {
                0
            };
            if n > 0 && best.is_none_or(|(_, b)| n > b) {
                best = Some((i, n));
            }
        }
        let (i, n) = best?;
        self.tick += 1;
        let e = &mut self.entries[i];
        e.last_used = self.tick;
        let state = if n == e.state.pos {
            e.state.clone()
        } else {
            prefix_copy(&e.state, n)
        };
        Some((state, n))
    }

    /// Keeps `state`, which holds exactly `tokens`.
    pub fn insert(&mut self, tokens: Vec<u32>, state: SeqState) {
        debug_assert_eq!(tokens.len(), state.pos);
        if tokens.is_empty() {
            return;
        }
        let bytes = state.bytes() + tokens.len() * 4;
        if bytes > self.max_bytes {
            return;
        }
        self.tick += 1;
        let rewind = rewindable(&state);
        // Already covered by a longer rewindable entry (or the same tokens)?
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.tokens.starts_with(&tokens) && (e.tokens.len() == tokens.len() || rewind))
        {
            e.last_used = self.tick;
            return;
        }
        // Entries this one supersedes.
        let mut freed = 0;
        self.entries.retain(|e| {
            let covered = rewind && tokens.starts_with(&e.tokens);
            if covered {
                freed += e.bytes;
            }
            !covered
        });
        self.bytes -= freed;
        while self.bytes + bytes > self.max_bytes && !self.entries.is_empty() {
            let (i, _) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .expect("non-empty");
            self.bytes -= self.entries.swap_remove(i).bytes;
        }
        self.bytes += bytes;
        self.entries.push(Entry {
            tokens,
            state,
            bytes,
            last_used: self.tick,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onebit_model::state::{KvCache, KvType};

    /// One layer whose K and V rows (32 wide, the q8_0 block) hold the
    /// token of their position and a ramp, stored as `ty`.
    fn attn_state_of(ty: KvType, tokens: &[u32]) -> SeqState {
        let mut c = KvCache::new(ty, 32, 32);
        for &t in tokens {
            let row: Vec<f32> = (0..32).map(|i| t as f32 + i as f32 * 0.1).collect();
            c.k.push(&row);
            c.v.push(&row);
        }
        SeqState {
            pos: tokens.len(),
            grids: Vec::new(),
            layers: vec![LayerState::Attention(c)],
            trail: None,
        }
    }

    fn attn_state(tokens: &[u32]) -> SeqState {
        attn_state_of(KvType::F32, tokens)
    }

    #[test]
    fn longest_common_prefix_is_reused_and_cut() {
        for ty in KvType::ALL {
            let mut c = PrefixCache::new(1 << 20);
            c.insert(vec![1, 2, 3, 4], attn_state_of(ty, &[1, 2, 3, 4]));
            c.insert(vec![1, 2, 9], attn_state_of(ty, &[1, 2, 9]));
            let (s, n) = c.lookup(&[1, 2, 3, 7, 8]).unwrap();
            assert_eq!(n, 3);
            assert_eq!(s, attn_state_of(ty, &[1, 2, 3]), "{ty}");
            // identical prompt: all but the last token
            let (_, n) = c.lookup(&[1, 2, 3, 4]).unwrap();
            assert_eq!(n, 3);
            assert!(c.lookup(&[5, 1]).is_none());
            assert!(c.lookup(&[1]).is_none());
        }
    }

    #[test]
    fn superseded_and_evicted_entries_go() {
        let mut c = PrefixCache::new(1 << 20);
        c.insert(vec![1, 2], attn_state(&[1, 2]));
        c.insert(vec![1, 2, 3], attn_state(&[1, 2, 3]));
        assert_eq!(c.len(), 1);
        c.insert(vec![1, 2], attn_state(&[1, 2]));
        assert_eq!(c.len(), 1);
        let one = attn_state(&[1, 2, 3]).bytes() + 12;
        let mut c = PrefixCache::new(2 * one);
        c.insert(vec![1, 2, 3], attn_state(&[1, 2, 3]));
        c.insert(vec![4, 5, 6], attn_state(&[4, 5, 6]));
        c.lookup(&[1, 2, 3, 0]);
        c.insert(vec![7, 8, 9], attn_state(&[7, 8, 9]));
        assert_eq!(c.len(), 2);
        assert!(
            c.lookup(&[4, 5, 6, 0]).is_none(),
            "least recently used goes first"
        );
        assert!(c.lookup(&[1, 2, 3, 0]).is_some());
    }

    #[test]
    fn recurrent_states_match_only_whole_entries() {
        let mut c = PrefixCache::new(1 << 20);
        let rec = |t: &[u32]| SeqState {
            pos: t.len(),
            grids: Vec::new(),
            layers: vec![LayerState::ShortConv {
                history: vec![t.len() as f32],
            }],
            trail: None,
        };
        c.insert(vec![1, 2, 3], rec(&[1, 2, 3]));
        assert!(c.lookup(&[1, 2, 4, 5]).is_none());
        assert!(
            c.lookup(&[1, 2, 3]).is_none(),
            "one token must be left to run"
        );
        let (s, n) = c.lookup(&[1, 2, 3, 4]).unwrap();
        assert_eq!((n, s), (3, rec(&[1, 2, 3])));
        c.insert(vec![1, 2], rec(&[1, 2]));
        assert_eq!(c.len(), 2, "a shorter recurrent state is not derivable");
    }
}
