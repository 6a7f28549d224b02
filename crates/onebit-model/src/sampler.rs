//! Choosing the next token from logits: greedy, or temperature with top-k,
//! typical-p, top-p and min-p, from a seeded generator so a seed reproduces
//! a run; and the logit penalties applied before it (`logit_bias`,
//! llama.cpp's and Ollama's `repeat_penalty`).
//!
//! The filters run in one fixed order, Ollama's (top-k, then temperature,
//! then the probability filters), with llama.cpp's order among those:
//! typical-p, top-p, min-p. Each filter keeps at least one candidate, and a
//! filter at its neutral value (top_k 0, typical_p 1, top_p 1, min_p 0)
//! changes nothing.
//!
//! A vocabulary of 262,144 is ranked only as far as a choice needs: greedy
//! is a lane-wise argmax, temperature alone draws from the weights in id
//! order, top-p and min-p rank a growing head, top-k selects (both over
//! the tokens at or above a floor found from block maxima); only
//! typical-p ranks everything. Each shortcut is tested against the full
//! ranking ([`Sampler::distribution`]).
//!
//! A token's weight is `exp((logit - max) / T)` in f32 through the kernels'
//! `exp_fast` (within a few ulp of `exp`, eight lanes at a time where AVX2
//! runs, the same bits on every level), summed in f64; a draw walks blocks
//! of `DRAW_BLOCK` weights by their sums, then the one it lands in. Both
//! were f64 `exp` and a walk of every weight: 1.4 ms a token at temperature
//! alone over 262,144 logits, a sixth of Gemma 3 270M's decode step.

use onebit_kernels::ops::exp_scaled;

#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = no limit.
    pub top_k: usize,
    /// 1 = no limit.
    pub top_p: f32,
    /// Drops candidates less likely than `min_p` times the most likely; 0 = off.
    pub min_p: f32,
    /// Locally typical sampling: keeps the candidates whose surprise is
    /// closest to the distribution's entropy, up to this mass; 1 = off.
    pub typical_p: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            seed: 0,
        }
    }
}

pub struct Sampler {
    cfg: SamplerConfig,
    rng: SplitMix64,
    /// Every token's weight ([`Sampler::weigh`]), kept between tokens.
    weights: Vec<f32>,
    /// Their sums by blocks of [`DRAW_BLOCK`], kept between tokens.
    blocks: Vec<f64>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = SplitMix64(cfg.seed);
        Sampler {
            cfg,
            rng,
            weights: Vec::new(),
            blocks: Vec::new(),
        }
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.temperature <= 0.0 {
            return argmax(logits);
        }
        if self.plain(logits.len()) {
            return self.sample_plain(logits);
        }
        if self.heads(logits.len()) {
            let (idx, w) = self.head_candidates(logits);
            return self.pick(&idx, &w);
        }
        let (idx, probs) = self.distribution(logits);
        self.pick(&idx, &probs)
    }

    /// True when top-p or min-p cut the whole vocabulary (top-k keeps every
    /// token, typical-p is off): the candidates are a prefix of the ranked
    /// tokens, found by [`Sampler::head_candidates`] without ranking them all.
    fn heads(&self, vocab: usize) -> bool {
        (self.cfg.top_k == 0 || self.cfg.top_k >= vocab) && self.cfg.typical_p >= 1.0
    }

    /// The candidates top-p and min-p keep, highest first, with their
    /// weights (unnormalized: [`Sampler::pick`] normalizes): the
    /// [`Sampler::distribution`] prefix, found by ranking a head of the
    /// vocabulary (the best 256 tokens, then 4,096, then all of them) until
    /// the cut falls inside it. The mass top-p compares with is
    /// summed in id order rather than rank order, so a cut can differ from
    /// [`Sampler::distribution`]'s only where the two sums differ in their
    /// last bits.
    fn head_candidates(&mut self, logits: &[f32]) -> (Vec<u32>, Vec<f64>) {
        let total = self.weigh(logits);
        let w = &self.weights;
        let w = |i: usize| w[i] as f64;
        let mass = if self.cfg.top_p < 1.0 {
            self.cfg.top_p as f64 * total
        } else {
            f64::INFINITY
        };
        let n = logits.len();
        let mut m = n.min(256);
        loop {
            let keys = head_keys(logits, m);
            let floor = w(keys[0] as u32 as usize) * self.cfg.min_p.max(0.0) as f64;
            let mut acc = 0.0;
            for (j, &key) in keys[..m].iter().enumerate() {
                let p = w(key as u32 as usize);
                if j > 0 && p < floor {
                    return cut(&keys[..j], &w);
                }
                acc += p;
                if acc >= mass {
                    return cut(&keys[..=j], &w);
                }
            }
            if m == n {
                return cut(&keys, &w);
            }
            // A second head 16 times the first, then everything: each
            // selection reads the whole vocabulary.
            m = if m < 4096 { n.min(16 * m) } else { n };
        }
    }

    /// Fills `self.weights` with every token's weight, [`exp_scaled`] as
    /// [`Sampler::distribution`] computes it (max by total_cmp, as its first
    /// candidate's: the same bits), and `self.blocks` with their [`block_sums`]; returns
    /// the total, those sums added in order.
    fn weigh(&mut self, logits: &[f32]) -> f64 {
        let max = max_total(logits);
        self.weights.resize(logits.len(), 0.0);
        exp_scaled(logits, max, 1.0 / self.cfg.temperature, &mut self.weights);
        block_sums(&self.weights, &mut self.blocks);
        self.blocks.iter().sum()
    }

    /// True when temperature is the only filter (top-k keeps every token,
    /// typical-p, top-p and min-p are off): OpenAI's default when a request
    /// sets only `temperature`.
    fn plain(&self, vocab: usize) -> bool {
        self.heads(vocab) && self.cfg.top_p >= 1.0 && self.cfg.min_p <= 0.0
    }

    /// Temperature sampling without ordering the vocabulary: every token's
    /// weight is [`Sampler::distribution`]'s, and the draw walks
    /// the tokens in id order instead of highest first. The distribution is the same; only which
    /// token a given uniform draw lands on differs. Ordering 262,144 logits
    /// (Gemma 3) cost 5 ms a token, more than half a decode step.
    fn sample_plain(&mut self, logits: &[f32]) -> u32 {
        self.weigh(logits);
        draw(&mut self.rng, &self.weights, &self.blocks) as u32
    }

    /// True when sampling is greedy (temperature 0).
    pub fn greedy(&self) -> bool {
        self.cfg.temperature <= 0.0
    }

    /// The candidates `sample` draws from and their probabilities (summing
    /// to 1), highest first: top-k, temperature, typical-p, top-p and min-p
    /// applied. Greedy sampling is the point mass on the argmax.
    pub fn distribution(&self, logits: &[f32]) -> (Vec<u32>, Vec<f64>) {
        if self.cfg.temperature <= 0.0 {
            return (vec![argmax(logits)], vec![1.0]);
        }
        // Candidates sorted by logit, highest first (`f32::total_cmp`); ties
        // by lower id. Sorted as keys: every key is unique (the id is in
        // it), so an unstable sort and selection give exactly the order and
        // the set a stable sort by that comparison gives.
        let k = if self.cfg.top_k == 0 {
            logits.len()
        } else {
            self.cfg.top_k.min(logits.len())
        };
        let keys = head_keys(logits, k);
        let mut idx: Vec<u32> = keys.iter().map(|&key| key as u32).collect();
        let ranked: Vec<f32> = idx.iter().map(|&i| logits[i as usize]).collect();
        let mut w = vec![0f32; ranked.len()];
        exp_scaled(&ranked, ranked[0], 1.0 / self.cfg.temperature, &mut w);
        let mut probs: Vec<f64> = w.iter().map(|&p| p as f64).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if self.cfg.typical_p < 1.0 {
            // ln p from the exponent: (logit - max) / T - ln(total), the
            // f32 exponent `exp_scaled` took (one `ln` per token cost 5 ms
            // over 262,144).
            let (m, s, ln_total) = (ranked[0], 1.0 / self.cfg.temperature, total.ln());
            let lnp: Vec<f64> = ranked
                .iter()
                .map(|&l| ((l - m) * s) as f64 - ln_total)
                .collect();
            typical(&mut idx, &mut probs, &lnp, self.cfg.typical_p as f64);
        }
        // Nucleus: the smallest prefix whose mass reaches top_p.
        if self.cfg.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= self.cfg.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            idx.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= total);
        }
        // min-p: candidates at least min_p times as likely as the first
        // (the most likely; probs are highest first), so a prefix.
        if self.cfg.min_p > 0.0 {
            let floor = probs[0] * self.cfg.min_p as f64;
            let keep = probs.iter().take_while(|&&p| p >= floor).count().max(1);
            probs.truncate(keep);
            idx.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= total);
        }
        (idx, probs)
    }

    /// A uniform draw in [0, 1) from the seeded generator.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Draws one of `idx` with the (not necessarily normalized) weights `probs`.
    pub fn pick(&mut self, idx: &[u32], probs: &[f64]) -> u32 {
        let mut blocks = Vec::new();
        block_sums(probs, &mut blocks);
        idx[draw(&mut self.rng, probs, &blocks)]
    }
}

/// The largest of `logits` by `f32::total_cmp` (0 for none): the largest
/// [`ascending`] bits, turned back into the value.
fn max_total(logits: &[f32]) -> f32 {
    if logits.is_empty() {
        return 0.0;
    }
    let m = max_ascending(logits);
    // The inverse of `ascending`: a set top bit came from a positive value.
    f32::from_bits(if m >> 31 == 1 { m & 0x7FFF_FFFF } else { !m })
}

/// The largest [`ascending`] bits of `v` (0, the least, for none), sixteen
/// lanes at a time.
fn max_ascending(v: &[f32]) -> u32 {
    let mut lanes = [0u32; 16];
    for c in v.chunks(16) {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = (*l).max(ascending(x));
        }
    }
    lanes.into_iter().max().unwrap_or(0)
}

/// Weights per block of a draw's first level: the walk over 262,144
/// weights, each subtraction waiting on the one before, cost about a third
/// of a millisecond; over the block sums it takes 1 / 256 of that, plus one
/// block's walk.
const DRAW_BLOCK: usize = 256;

/// `sums[b]` = the sum of `weights[b * DRAW_BLOCK..][..DRAW_BLOCK]` in f64,
/// element i into lane i % 8, the lanes added pairwise (independent adds
/// the compiler can vectorize).
fn block_sums<W: Copy + Into<f64>>(weights: &[W], sums: &mut Vec<f64>) {
    sums.clear();
    sums.extend(weights.chunks(DRAW_BLOCK).map(|b| {
        let mut lanes = [0f64; 8];
        for c in b.chunks(8) {
            for (l, &w) in lanes.iter_mut().zip(c) {
                *l += w.into();
            }
        }
        let [a, b, c, d, e, f, g, h] = lanes;
        ((a + e) + (c + g)) + ((b + f) + (d + h))
    }));
}

/// The position a uniform draw lands on among `weights`, whose
/// [`block_sums`] are `blocks`: r = u x (the sums added in order) walks
/// the blocks, subtracting each sum it passes, then the weights of the
/// block it lands in. The same distribution as one walk over every weight;
/// only which token a given u picks differs, by rounding, at a boundary.
fn draw<W: Copy + Into<f64>>(rng: &mut SplitMix64, weights: &[W], blocks: &[f64]) -> usize {
    let total: f64 = blocks.iter().sum();
    let mut r = rng.next_f64() * total;
    let last_with_mass = |ws: &[W]| ws.iter().rposition(|&p| p.into() > 0.0);
    for (b, &s) in blocks.iter().enumerate() {
        if r < s {
            let ws = &weights[b * DRAW_BLOCK..weights.len().min((b + 1) * DRAW_BLOCK)];
            for (i, &p) in ws.iter().enumerate() {
                let p: f64 = p.into();
                if r < p {
                    return b * DRAW_BLOCK + i;
                }
                r -= p;
            }
            // Rounding left r past the block's weights: its last one with
            // mass (s > 0, so there is one).
            if let Some(i) = last_with_mass(ws) {
                return b * DRAW_BLOCK + i;
            }
        }
        r -= s;
    }
    // Rounding left r past the end: the last candidate with any mass (a
    // masked token, at probability 0, is never chosen).
    last_with_mass(weights).unwrap_or(0)
}

/// The ids of `keys` ([`rank_key`]s) and their weights by id.
fn cut(keys: &[u64], w: &impl Fn(usize) -> f64) -> (Vec<u32>, Vec<f64>) {
    let idx: Vec<u32> = keys.iter().map(|&k| k as u32).collect();
    let p = idx.iter().map(|&i| w(i as usize)).collect();
    (idx, p)
}

/// A key whose ascending order is `logit` descending by `f32::total_cmp`,
/// then `id` ascending: total_cmp's order as unsigned bits (sign set: all
/// bits flipped; else the sign bit set), flipped for descending, above the
/// id. A full sort by an indirect float comparison took 10 ms for Gemma 3's
/// 262,144 logits, longer than its decode step.
fn rank_key(logit: f32, id: u32) -> u64 {
    (u64::from(!ascending(logit)) << 32) | u64::from(id)
}

/// `f32::total_cmp`'s order as unsigned bits: sign set, all bits flipped;
/// else the sign bit set.
fn ascending(v: f32) -> u32 {
    let b = v.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Logits per block of [`head_keys`]'s first pass.
const HEAD_BLOCK: usize = 64;

/// The keys of the `m` best-ranked tokens (m <= logits.len()), in
/// rank order. Where `m` is at most a quarter of the blocks of
/// [`HEAD_BLOCK`] logits, the m-th largest block maximum is a floor every
/// one of the m best reaches (the m block maxima are m tokens at or above
/// it), so only the tokens at or above it are keyed and ranked: two reads
/// of the vocabulary instead of keying and selecting all of it (top-k 40
/// over Gemma 3's 262,144 logits took 0.41 ms a token, now 0.19). Otherwise, or
/// when ties leave most tokens at the floor, all of them are ranked.
fn head_keys(logits: &[f32], m: usize) -> Vec<u64> {
    let n = logits.len();
    let blocks = n.div_ceil(HEAD_BLOCK);
    let mut keys = if m == 0 {
        Vec::new()
    } else if m <= blocks / 4 {
        let mut maxima: Vec<u32> = logits.chunks(HEAD_BLOCK).map(max_ascending).collect();
        let (_, &mut floor, _) = maxima.select_nth_unstable_by(m - 1, |a, b| b.cmp(a));
        logits
            .iter()
            .enumerate()
            .filter(|&(_, &v)| ascending(v) >= floor)
            .map(|(i, &v)| rank_key(v, i as u32))
            .collect()
    } else {
        rank_keys(logits)
    };
    rank_head(&mut keys, m);
    keys.truncate(m);
    keys
}

/// Every token's [`rank_key`], in id order.
fn rank_keys(logits: &[f32]) -> Vec<u64> {
    logits
        .iter()
        .enumerate()
        .map(|(i, &l)| rank_key(l, i as u32))
        .collect()
}

/// Puts the `m` smallest of `keys` (the best-ranked tokens) first, in
/// order: selected then sorted when `m` is short of all of them, else the
/// radix sort, which wants `keys` in id order ([`rank_keys`]).
fn rank_head(keys: &mut Vec<u64>, m: usize) {
    if m < keys.len() {
        keys.select_nth_unstable(m - 1);
        keys[..m].sort_unstable();
    } else {
        sort_by_rank(keys);
    }
}

/// Sorts `keys` ([`rank_key`]s built in id order) ascending: a stable
/// radix sort by the upper 32 bits, 11 at a time, leaves equal logits in
/// the id order they came in, which is the whole key's order. Three passes
/// over the vocabulary instead of a comparison sort's log2(n).
fn sort_by_rank(keys: &mut Vec<u64>) {
    let mut tmp = vec![0u64; keys.len()];
    for shift in [32u32, 43, 54] {
        let mut start = [0usize; 1 << 11];
        for &k in keys.iter() {
            start[((k >> shift) & 0x7FF) as usize] += 1;
        }
        let mut at = 0;
        for c in start.iter_mut() {
            let n = *c;
            *c = at;
            at += n;
        }
        for &k in keys.iter() {
            let d = ((k >> shift) & 0x7FF) as usize;
            tmp[start[d]] = k;
            start[d] += 1;
        }
        std::mem::swap(keys, &mut tmp);
    }
}

/// Locally typical sampling (Meister et al. 2022, as llama.cpp's
/// `typical_p`): candidates ordered by how far their surprise `-ln p` lies
/// from the entropy `H = -sum p ln p`, the closest kept until their mass
/// reaches `mass` (at least one); the survivors renormalized and put back
/// highest first, ties by lower id as before.
fn typical(idx: &mut Vec<u32>, probs: &mut Vec<f64>, lnp: &[f64], mass: f64) {
    let mut kept = typical_order(probs, lnp, mass);
    // Back to the distribution's order (probability, highest first).
    kept.sort_unstable();
    let total: f64 = kept.iter().map(|&i| probs[i]).sum();
    *idx = kept.iter().map(|&i| idx[i]).collect();
    *probs = kept.iter().map(|&i| probs[i] / total).collect();
}

/// The candidates [`typical`] keeps, most typical first: the shortest
/// prefix of the order by gap |-ln p - H| (ties by position) whose mass
/// reaches `mass`, or all of them; `ln[i]` is ln probs\[i\] (read only where
/// the probability is positive). Each gap is computed once, and only a head
/// of the order is ranked (the 256 smallest gaps, then 4,096, then all)
/// until the prefix ends inside it: sorting all of Gemma 3's 262,144
/// candidates with the gaps computed inside the comparison took 8 ms a
/// token.
fn typical_order(probs: &[f64], ln: &[f64], mass: f64) -> Vec<usize> {
    let entropy: f64 = -probs
        .iter()
        .zip(ln)
        .filter(|&(&p, _)| p > 0.0)
        .map(|(&p, &l)| p * l)
        .sum::<f64>();
    // A gap is non-negative (or +inf, or a NaN without its sign), so its
    // bits order as `total_cmp` orders it; the position breaks ties.
    let mut keys: Vec<(u64, u32)> = probs
        .iter()
        .zip(ln)
        .enumerate()
        .map(|(i, (&p, &l))| {
            let gap = if p > 0.0 {
                (-l - entropy).abs()
            } else {
                f64::INFINITY
            };
            (gap.to_bits(), i as u32)
        })
        .collect();
    let n = keys.len();
    let mut m = n.min(256);
    loop {
        if m < n {
            keys.select_nth_unstable(m - 1);
            keys[..m].sort_unstable();
        } else {
            keys.sort_unstable();
        }
        let mut acc = 0.0;
        for (j, &(_, i)) in keys[..m].iter().enumerate() {
            acc += probs[i as usize];
            if acc >= mass {
                return keys[..=j].iter().map(|&(_, i)| i as usize).collect();
            }
        }
        if m == n {
            return keys.iter().map(|&(_, i)| i as usize).collect();
        }
        m = if m < 4096 { n.min(16 * m) } else { n };
    }
}

/// `repeat_penalty` as llama.cpp and Ollama apply it: every distinct token
/// of `window` (the last `repeat_last_n` tokens of prompt and reply) has a
/// positive logit divided by `penalty` and a negative one multiplied by it,
/// once however often it occurs. 1 is off; ids outside `logits` are ignored.
pub fn repeat_penalize(logits: &mut [f32], window: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut seen = std::collections::HashSet::with_capacity(window.len());
    for &id in window {
        if !seen.insert(id) {
            continue;
        }
        if let Some(l) = logits.get_mut(id as usize) {
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

/// The hook a constraint uses: every token `allowed` refuses gets -inf, so
/// neither greedy nor sampling can choose it.
pub fn mask_logits(logits: &mut [f32], allowed: impl Fn(usize) -> bool) {
    for (i, l) in logits.iter_mut().enumerate() {
        if !allowed(i) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// OpenAI's `logit_bias`: each (token, bias) adds the bias to the token's
/// logit; -100 and 100 in effect ban and force it. Ids are checked by the
/// caller; one outside `logits` is ignored.
pub fn bias_logits(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l += b;
        }
    }
}

/// Index of the largest logit; the lowest index among equals (0.0 and -0.0
/// are equal), NaNs passed over, and 0 when logits\[0\] is NaN or nothing
/// beats it: exactly what a scan keeping the first strictly larger value
/// returns (`argmax_scan`, which the tests hold it to).
///
/// It runs as `LANES` such scans side by side, lane l over the indices
/// congruent to l, then takes the best lane (its value, then its index).
/// The lanes compile to vector compares and blends; the one scan's
/// dependence on the previous best did not, and a greedy step over Gemma
/// 3's 262,144 logits spent 0.15 ms in it (1.7 % of a decode step on the
/// Intel Xeon VM; a verify step pays it once per row).
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    if logits.first().is_none_or(|v| v.is_nan()) {
        return 0;
    }
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut at = [u32::MAX; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        let base = (c * LANES) as u32;
        for l in 0..LANES {
            let v = chunk[l];
            let win = v > best[l];
            best[l] = if win { v } else { best[l] };
            at[l] = if win { base + l as u32 } else { at[l] };
        }
    }
    let base = (logits.len() - tail.len()) as u32;
    for (l, &v) in tail.iter().enumerate() {
        if v > best[l] {
            best[l] = v;
            at[l] = base + l as u32;
        }
    }
    // Every lane's value is its first occurrence of its maximum; the
    // answer is the lowest index holding the largest of them. A lane that
    // saw only -inf and NaN (at u32::MAX) never wins; if all did, the scan
    // would have stayed at 0.
    let mut pick: Option<(f32, u32)> = None;
    for l in 0..LANES {
        if at[l] == u32::MAX {
            continue;
        }
        pick = match pick {
            Some((v, i)) if best[l] < v || (best[l] == v && at[l] > i) => Some((v, i)),
            _ => Some((best[l], at[l])),
        };
    }
    pick.map_or(0, |(_, i)| i)
}

/// The definition [`argmax`] keeps: one scan, moving to each value strictly
/// larger than the best so far.
#[cfg(test)]
fn argmax_scan(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// SplitMix64: tiny, fast, and fully determined by its seed.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_temperature_sampling_follows_the_softmax() {
        // Logits ln(1), ln(2), ln(3), ln(4) and a masked token at
        // temperature 1: probabilities 0.1, 0.2, 0.3, 0.4 and 0 by
        // arithmetic. At temperature 2 the weights are the square roots.
        let l = [
            1f32.ln(),
            2f32.ln(),
            f32::NEG_INFINITY,
            3f32.ln(),
            4f32.ln(),
        ];
        for (t, want) in [
            (1.0f32, [0.1, 0.2, 0.0, 0.3, 0.4]),
            (2.0, {
                let r = [1f64, 2f64.sqrt(), 0.0, 3f64.sqrt(), 2.0];
                let s: f64 = r.iter().sum();
                [r[0] / s, r[1] / s, 0.0, r[3] / s, r[4] / s]
            }),
        ] {
            let cfg = SamplerConfig {
                temperature: t,
                seed: 3,
                ..SamplerConfig::default()
            };
            let mut s = Sampler::new(cfg);
            assert!(s.plain(l.len()));
            let n = 40_000;
            let mut seen = [0usize; 5];
            for _ in 0..n {
                seen[s.sample(&l) as usize] += 1;
            }
            assert_eq!(seen[2], 0, "a masked token was drawn");
            for (i, &p) in want.iter().enumerate() {
                let f = seen[i] as f64 / n as f64;
                // Four standard deviations of a binomial frequency.
                let sd = (p * (1.0 - p) / n as f64).sqrt();
                assert!(
                    (f - p).abs() <= 4.0 * sd + 1e-12,
                    "token {i} at T {t}: {f} vs {p}"
                );
            }
        }
        // Any filter on takes the sorted path.
        for cfg in [
            SamplerConfig {
                temperature: 1.0,
                top_k: 2,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                temperature: 1.0,
                top_p: 0.9,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                temperature: 1.0,
                min_p: 0.1,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                temperature: 1.0,
                typical_p: 0.9,
                ..SamplerConfig::default()
            },
        ] {
            assert!(!Sampler::new(cfg).plain(l.len()));
        }
    }

    /// `head_keys` keeps the m best tokens of the full ranking (the
    /// comparison sort by logit then id), in order, on vocabularies large
    /// enough for its block floor: spread logits, a few far above the rest,
    /// heavy ties at the top, masked tokens and NaNs, for m around the
    /// floor's limit (a quarter of the blocks) and past it.
    #[test]
    fn the_head_keys_are_the_best_of_the_full_ranking() {
        let n = 40 * HEAD_BLOCK + 13;
        let blocks = n.div_ceil(HEAD_BLOCK);
        let mut rng = SplitMix64(23);
        for shape in 0..5 {
            let v: Vec<f32> = (0..n)
                .map(|i| {
                    let x = rng.next_u64();
                    let u = (x >> 40) as f32 / (1u64 << 24) as f32;
                    match shape {
                        0 => u * 20.0 - 10.0,
                        1 if i % 997 == 5 => 30.0 + u,
                        1 => u,
                        // Every third token ties at the top.
                        2 if x.is_multiple_of(3) => 4.0,
                        2 => u,
                        3 if x.is_multiple_of(2) => f32::NEG_INFINITY,
                        3 => u,
                        _ if x.is_multiple_of(50) => f32::NAN,
                        _ => (u * 8.0).round(),
                    }
                })
                .collect();
            let mut want: Vec<u32> = (0..n as u32).collect();
            want.sort_by(|a, b| v[*b as usize].total_cmp(&v[*a as usize]).then(a.cmp(b)));
            for m in [1, 2, 7, blocks / 4, blocks / 4 + 1, 100, n] {
                let got: Vec<u32> = head_keys(&v, m).iter().map(|&k| k as u32).collect();
                assert_eq!(got, want[..m], "shape {shape}, m {m}");
            }
        }
    }

    /// `max_total` is std's `max_by(total_cmp)`, bit for bit, on values
    /// with signed zeros, infinities, NaNs of both signs and subnormals, at
    /// lengths around its lanes.
    #[test]
    fn max_total_is_the_largest_by_total_cmp() {
        let set = [
            0.0,
            -0.0,
            2.5,
            -7.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            1e-40,
            -1e-40,
        ];
        let mut rng = SplitMix64(7);
        for len in [1usize, 3, 16, 17, 40] {
            for _ in 0..200 {
                let v: Vec<f32> = (0..len)
                    .map(|_| {
                        let x = rng.next_u64();
                        if x.is_multiple_of(4) {
                            f32::from_bits((x >> 20) as u32)
                        } else {
                            set[(x >> 8) as usize % set.len()]
                        }
                    })
                    .collect();
                let want = v.iter().copied().max_by(|a, b| a.total_cmp(b)).unwrap();
                assert_eq!(max_total(&v).to_bits(), want.to_bits(), "{v:?}");
            }
        }
        assert_eq!(max_total(&[]), 0.0);
    }

    /// The two-level draw lands where one walk over every weight lands, for
    /// weights whose sums are exact in f64 (multiples of 1/8 below 4), so
    /// no rounding separates the two: every block boundary, zero weights
    /// (never chosen) and a last block shorter than the others.
    #[test]
    fn the_draw_by_blocks_lands_where_the_walk_over_every_weight_lands() {
        let n = 5 * DRAW_BLOCK + 37;
        let w: Vec<f32> = (0..n)
            .map(|i| {
                if i % 7 == 3 {
                    0.0
                } else {
                    ((i * 13) % 32) as f32 / 8.0
                }
            })
            .collect();
        let mut blocks = Vec::new();
        block_sums(&w, &mut blocks);
        assert_eq!(blocks.len(), 6);
        let total: f64 = w.iter().map(|&p| p as f64).sum();
        let flat = |u: f64| {
            let mut r = u * total;
            w.iter()
                .position(|&p| {
                    let hit = r < p as f64;
                    r -= p as f64;
                    hit
                })
                .expect("u < 1 lands inside")
        };
        let (mut a, mut b) = (SplitMix64(5), SplitMix64(5));
        let mut per_block = [0usize; 6];
        for _ in 0..20_000 {
            let got = draw(&mut a, &w, &blocks);
            let want = flat(b.next_f64());
            assert_eq!(got, want);
            assert!(w[got] > 0.0, "a zero weight was chosen");
            per_block[got / DRAW_BLOCK] += 1;
        }
        assert!(per_block.iter().all(|&c| c > 0), "{per_block:?}");
    }

    #[test]
    fn top_p_and_min_p_over_a_ranked_head_keep_the_sorted_candidates() {
        // The head search must keep exactly the candidates the full sort
        // keeps, with the same probabilities once normalized, whether the
        // cut falls in the first head of 256, a later one, or nowhere (top-p
        // near 1 at a high temperature keeps most of 5,000 tokens).
        let mut rng = SplitMix64(5);
        // Multiples of 1/64: about 770 values over 5,000 tokens, so equal
        // logits (ranked by id) are everywhere.
        let logits: Vec<f32> = (0..5000)
            .map(|_| ((rng.next_f64() * 12.0 - 6.0) * 64.0).round() as f32 / 64.0)
            .collect();
        let mut heads_seen = 0;
        for (t, top_p, min_p) in [
            (0.7f32, 0.9f32, 0.0f32),
            (1.0, 0.5, 0.0),
            (2.0, 0.99, 0.0),
            (8.0, 0.999, 0.0),
            (1.0, 1.0, 0.05),
            (3.0, 1.0, 0.3),
            (1.0, 0.95, 0.01),
        ] {
            let cfg = SamplerConfig {
                temperature: t,
                top_p,
                min_p,
                ..SamplerConfig::default()
            };
            let mut s = Sampler::new(cfg);
            assert!(s.heads(logits.len()) && !s.plain(logits.len()));
            let (want_idx, want_p) = s.distribution(&logits);
            let (idx, w) = s.head_candidates(&logits);
            assert_eq!(idx, want_idx, "T {t} top_p {top_p} min_p {min_p}");
            let total: f64 = w.iter().sum();
            for (a, b) in w.iter().zip(&want_p) {
                assert!((a / total - b).abs() <= 1e-12 * b.max(1e-300) + 1e-300);
            }
            if idx.len() > 256 {
                heads_seen += 1;
            }
        }
        // At least one cut fell past the first head.
        assert!(heads_seen >= 2, "{heads_seen}");
    }

    #[test]
    fn candidates_come_in_the_comparison_order_of_logit_then_id() {
        // The order by the indirect comparison (logit descending by
        // total_cmp, then id ascending), stable-sorted, is the definition;
        // the keyed sort must give the same list, for the whole vocabulary
        // and after a top-k selection, on values with ties, signed zeros,
        // infinities and NaNs of both signs.
        let set = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            3.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            1e-40,
            -1e-40,
        ];
        let mut rng = SplitMix64(11);
        for len in [1usize, 7, 64, 500] {
            for round in 0..50 {
                // Half the rounds mix in arbitrary floats and floats a few
                // ulps from ±1, which differ in every bit of the key, the
                // lowest too, not only in the set's few.
                let v: Vec<f32> = (0..len)
                    .map(|_| {
                        let x = rng.next_u64();
                        let near_one = f32::from_bits(1f32.to_bits() + (x >> 8) as u32 % 64);
                        if round % 2 == 1 && x % 3 == 1 {
                            f32::from_bits((x >> 16) as u32)
                        } else if round % 2 == 1 && x % 3 == 2 {
                            if x & 16 == 0 {
                                near_one
                            } else {
                                -near_one
                            }
                        } else {
                            set[(x % set.len() as u64) as usize]
                        }
                    })
                    .collect();
                let mut want: Vec<u32> = (0..len as u32).collect();
                want.sort_by(|a, b| v[*b as usize].total_cmp(&v[*a as usize]).then(a.cmp(b)));
                let top_k = [0, 1, 5, len][round % 4];
                let s = Sampler::new(SamplerConfig {
                    temperature: 1.0,
                    top_k,
                    ..SamplerConfig::default()
                });
                let (idx, _) = s.distribution(&v);
                let k = if top_k == 0 { len } else { top_k.min(len) };
                assert_eq!(idx, want[..k], "{v:?} top_k {top_k}");
            }
        }
    }

    #[test]
    fn argmax_equals_the_one_scan_on_ties_signed_zeros_nans_and_tails() {
        // Lengths around the lane count, values from a small set so ties
        // are common, with -0.0, infinities and NaNs mixed in; the scan is
        // the definition. A seeded generator makes it reproducible.
        let set = [
            0.0,
            -0.0,
            1.0,
            1.0,
            -1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            2.5,
        ];
        let mut rng = SplitMix64(7);
        let mut checked = 0;
        for len in [1usize, 2, 15, 16, 17, 31, 32, 33, 100, 1000] {
            for round in 0..400 {
                // Some rounds draw only from the awkward values.
                let pool = if round % 4 == 0 { &set[5..8] } else { &set[..] };
                let v: Vec<f32> = (0..len)
                    .map(|_| pool[(rng.next_u64() % pool.len() as u64) as usize])
                    .collect();
                assert_eq!(argmax(&v), argmax_scan(&v), "{v:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, 4000);
        // The cases named in the doc comment, by hand.
        assert_eq!(argmax(&[f32::NAN, 5.0, 6.0]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 40]), 0);
        assert_eq!(argmax(&[-0.0, 0.0]), 0);
        let mut v = vec![-1.0f32; 40];
        v[3] = 4.0;
        v[35] = 4.0;
        assert_eq!(argmax(&v), 3);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn a_masked_token_is_never_chosen_greedy_or_sampled() {
        // Id 1 has by far the largest logit; masked, it must never come out.
        let mut l = [0.0, 50.0, 0.0, 1.0];
        mask_logits(&mut l, |i| i != 1);
        assert_eq!(argmax(&l), 3);
        let mut s = Sampler::new(SamplerConfig {
            temperature: 2.0,
            top_k: 0,
            top_p: 1.0,
            seed: 9,
            ..SamplerConfig::default()
        });
        for _ in 0..500 {
            assert_ne!(s.sample(&l), 1);
        }
    }

    #[test]
    fn logit_bias_adds_to_the_named_tokens_only() {
        let mut l = [1.0, 2.0, 3.0];
        bias_logits(&mut l, &[(0, 5.0), (2, -100.0), (7, 1.0)]);
        assert_eq!(l, [6.0, 2.0, -97.0]);
        assert_eq!(argmax(&l), 0);
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplerConfig::default());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 5.0,
            top_k: 1,
            top_p: 1.0,
            seed: 7,
            ..SamplerConfig::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.0, 1.0, 0.5]), 1);
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // probs at T=1: softmax([10, 0, 0]) puts 0.99991 on id 0: top_p 0.9 keeps it alone.
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
            seed: 3,
            ..SamplerConfig::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&[10.0, 0.0, 0.0]), 0);
        }
    }

    #[test]
    fn same_seed_same_choices_and_frequencies_follow_probabilities() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 42,
            ..SamplerConfig::default()
        };
        // ln 3 apart: p = [0.75, 0.25]
        let logits = [1.0986123, 0.0];
        let a: Vec<u32> = (0..2000)
            .map({
                let mut s = Sampler::new(cfg.clone());
                move |_| s.sample(&logits)
            })
            .collect();
        let b: Vec<u32> = (0..2000)
            .map({
                let mut s = Sampler::new(cfg.clone());
                move |_| s.sample(&logits)
            })
            .collect();
        assert_eq!(a, b);
        let zeros = a.iter().filter(|&&x| x == 0).count() as f64 / 2000.0;
        assert!((zeros - 0.75).abs() < 0.04, "{zeros}");
    }

    /// Logits ln 4, ln 2, ln 1, ln 1: at temperature 1 the probabilities
    /// are exactly 1/2, 1/4, 1/8, 1/8.
    const QUARTERS: [f32; 4] = [
        2.0 * std::f32::consts::LN_2,
        std::f32::consts::LN_2,
        0.0,
        0.0,
    ];

    fn filtered(cfg: SamplerConfig) -> (Vec<u32>, Vec<f64>) {
        Sampler::new(SamplerConfig {
            temperature: 1.0,
            ..cfg
        })
        .distribution(&QUARTERS)
    }

    fn close(got: &[f64], want: &[f64]) -> bool {
        got.len() == want.len() && got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6)
    }

    #[test]
    fn min_p_keeps_candidates_within_a_fraction_of_the_best() {
        // min_p 0.4: the floor is 0.4 * 1/2 = 0.2, so 1/2 and 1/4 stay,
        // renormalized to 2/3 and 1/3.
        let (idx, p) = filtered(SamplerConfig {
            min_p: 0.4,
            ..Default::default()
        });
        assert_eq!(idx, [0, 1]);
        assert!(close(&p, &[2.0 / 3.0, 1.0 / 3.0]), "{p:?}");
        // min_p 0.2: the floor 0.1 is under every candidate.
        let (idx, _) = filtered(SamplerConfig {
            min_p: 0.2,
            ..Default::default()
        });
        assert_eq!(idx, [0, 1, 2, 3]);
    }

    #[test]
    fn typical_p_keeps_the_tokens_whose_surprise_is_nearest_the_entropy() {
        // p = 1/2, 1/4, 1/8, 1/8: entropy H = 1.75 ln 2; the surprises
        // -ln p are 1, 2, 3, 3 (times ln 2), so the gaps |-ln p - H| are
        // 0.75, 0.25, 1.25, 1.25: token 1 is the most typical, then 0.
        let (idx, p) = filtered(SamplerConfig {
            typical_p: 0.2,
            ..Default::default()
        });
        // Token 1's mass 1/4 reaches 0.2 alone: the likeliest token goes.
        assert_eq!(idx, [1]);
        assert!(close(&p, &[1.0]), "{p:?}");
        let (idx, p) = filtered(SamplerConfig {
            typical_p: 0.3,
            ..Default::default()
        });
        // 1/4 + 1/2 reaches 0.3; back in probability order, renormalized.
        assert_eq!(idx, [0, 1]);
        assert!(close(&p, &[2.0 / 3.0, 1.0 / 3.0]), "{p:?}");
        // Off (1): nothing removed.
        assert_eq!(filtered(SamplerConfig::default()).0, [0, 1, 2, 3]);
    }

    /// `typical_order` keeps what sorting every candidate by the gap
    /// computed in the comparison (the definition, as the filter first
    /// ran) keeps, in that order: peaked and flat distributions, zero
    /// probabilities, and masses whose prefix ends inside the first head,
    /// the second, and past both.
    #[test]
    fn the_typical_head_is_the_prefix_of_the_full_order_by_gap() {
        let mut rng = SplitMix64(31);
        for (n, peak) in [(10_000usize, 8.0f64), (10_000, 0.5), (300, 3.0)] {
            let w: Vec<f64> = (0..n)
                .map(|i| {
                    let u = rng.next_f64();
                    if i % 13 == 4 {
                        0.0
                    } else {
                        (peak * u * u * u).exp() * if i % 97 == 0 { 50.0 } else { 1.0 }
                    }
                })
                .collect();
            let total: f64 = w.iter().sum();
            let probs: Vec<f64> = w.iter().map(|x| x / total).collect();
            let entropy: f64 = -probs
                .iter()
                .filter(|&&p| p > 0.0)
                .map(|&p| p * p.ln())
                .sum::<f64>();
            let gap = |p: f64| {
                if p > 0.0 {
                    (-p.ln() - entropy).abs()
                } else {
                    f64::INFINITY
                }
            };
            let mut want: Vec<usize> = (0..n).collect();
            want.sort_by(|&a, &b| gap(probs[a]).total_cmp(&gap(probs[b])).then(a.cmp(&b)));
            for mass in [0.01, 0.2, 0.5, 0.9, 0.999, 1.0, 2.0] {
                let mut acc = 0.0;
                let keep = want
                    .iter()
                    .position(|&i| {
                        acc += probs[i];
                        acc >= mass
                    })
                    .map_or(n, |j| j + 1);
                let ln: Vec<f64> = probs.iter().map(|p| p.ln()).collect();
                assert_eq!(
                    typical_order(&probs, &ln, mass),
                    want[..keep],
                    "n {n}, mass {mass}"
                );
            }
        }
    }

    #[test]
    fn repeat_penalty_divides_positive_and_multiplies_negative_logits_once() {
        let mut l = [2.0, -1.0, 3.0, 0.5];
        // Token 0 twice (penalized once), 1 once, 7 outside the vocabulary.
        repeat_penalize(&mut l, &[0, 1, 0, 7], 2.0);
        assert_eq!(l, [1.0, -2.0, 3.0, 0.5]);
        let mut l = [2.0, -1.0];
        repeat_penalize(&mut l, &[0, 1], 1.0);
        assert_eq!(l, [2.0, -1.0]);
    }
}
