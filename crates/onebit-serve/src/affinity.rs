//! A routing hint for proxies in front of several replicas: a hash of the
//! prompt's leading tokens, returned in a response header.

use axum::http::HeaderValue;

/// The response header that carries [`prefix_hash`].
pub const AFFINITY_HEADER: &str = "x-onebit-prefix-hash";

/// Prompt tokens [`prefix_hash`] covers at most.
pub const AFFINITY_TOKENS: usize = 256;

/// A routing hint: FNV-1a (64 bits) of the prompt's first
/// [`AFFINITY_TOKENS`] token ids (little-endian u32), as 16 hex digits. Two
/// prompts that share that many tokens get the same value, so a client can
/// send it back as `X-Session-Id` and a proxy hashing on that header sends
/// the follow-ups to the replica whose prefix cache holds the prompt.
pub fn prefix_hash(ids: &[u32]) -> HeaderValue {
    HeaderValue::from_str(&format!("{:016x}", fnv1a(ids)))
        .expect("hex digits are a valid header value")
}

fn fnv1a(ids: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for id in &ids[..ids.len().min(AFFINITY_TOKENS)] {
        for b in id.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_of_bytes_matches_the_published_vectors() {
        // FNV-1a 64: the offset basis for no input, and "a" (0x61) as the
        // low byte of a token id followed by its three zero bytes, computed
        // by the published recurrence step by step.
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in [0x61u8, 0, 0, 0] {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(fnv1a(&[0x61]), h);
        // The first step alone is the published FNV-1a 64 of "a".
        assert_eq!(
            (0xcbf2_9ce4_8422_2325u64 ^ 0x61).wrapping_mul(0x100_0000_01b3),
            0xaf63_dc4c_8601_ec8c
        );
    }

    #[test]
    fn the_hash_covers_exactly_the_leading_tokens() {
        let a: Vec<u32> = (0..400).collect();
        let mut b = a.clone();
        b[AFFINITY_TOKENS] = 7; // past the covered prefix: same hash
        assert_eq!(prefix_hash(&a), prefix_hash(&b));
        b[AFFINITY_TOKENS - 1] = 7; // inside it: another hash
        assert_ne!(prefix_hash(&a), prefix_hash(&b));
        assert_eq!(prefix_hash(&a[..10]).len(), 16);
    }
}
