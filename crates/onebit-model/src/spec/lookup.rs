//! Prompt lookup: the guess is what followed the latest earlier occurrence
//! of the sequence's last n tokens (n from the longest allowed down to 1),
//! in the prompt and the output so far. No second model; the guesses are
//! point masses.

use super::{Draft, Drafter};
use crate::error::Result;

pub struct PromptLookup {
    /// The longest n-gram matched.
    pub max_ngram: usize,
    /// The shortest n-gram matched (1 alone; a drafter behind it may answer
    /// where only a single token matches).
    pub min_ngram: usize,
}

impl PromptLookup {
    pub fn new(max_ngram: usize) -> PromptLookup {
        PromptLookup {
            max_ngram: max_ngram.max(1),
            min_ngram: 1,
        }
    }

    /// Matches n-grams of `min_ngram..=max_ngram` tokens only (both at least 1).
    pub fn with_min(max_ngram: usize, min_ngram: usize) -> PromptLookup {
        let max_ngram = max_ngram.max(1);
        PromptLookup {
            max_ngram,
            min_ngram: min_ngram.clamp(1, max_ngram),
        }
    }
}

impl Drafter for PromptLookup {
    fn draft(&mut self, ctx: &[u32], k: usize) -> Result<Draft> {
        let len = ctx.len();
        for n in (self.min_ngram..=self.max_ngram.min(len.saturating_sub(1))).rev() {
            let tail = &ctx[len - n..];
            // Latest start i < len - n whose n tokens equal the tail.
            if let Some(i) = (0..len - n).rev().find(|&i| &ctx[i..i + n] == tail) {
                let from = i + n;
                let tokens: Vec<u32> = ctx[from..(from + k).min(len)].to_vec();
                let q = vec![None; tokens.len()];
                return Ok(Draft { tokens, q });
            }
        }
        Ok(Draft::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_longest_match() {
        let ctx = [4, 5, 6, 7, 1, 5, 6, 9, 4, 5, 6];
        // The 3-gram "4 5 6" occurred at 0, followed by 7 1 5 ...
        let mut l = PromptLookup::new(3);
        assert_eq!(l.draft(&ctx, 3).unwrap().tokens, vec![7, 1, 5]);
        // ... while with bigrams the latest "5 6" (at 5) is followed by 9 4.
        let mut l2 = PromptLookup::new(2);
        assert_eq!(l2.draft(&ctx, 2).unwrap().tokens, vec![9, 4]);
    }

    #[test]
    fn a_minimum_ngram_leaves_single_token_matches_out() {
        // Only the last token "6" recurs (at 2, followed by 7 8).
        let ctx = [5, 1, 6, 7, 8, 2, 6];
        assert_eq!(
            PromptLookup::new(3).draft(&ctx, 2).unwrap().tokens,
            vec![7, 8]
        );
        assert!(PromptLookup::with_min(3, 2)
            .draft(&ctx, 2)
            .unwrap()
            .tokens
            .is_empty());
        // A bigram match still drafts.
        let ctx2 = [1, 6, 7, 8, 1, 6];
        assert_eq!(
            PromptLookup::with_min(3, 2).draft(&ctx2, 2).unwrap().tokens,
            vec![7, 8]
        );
    }

    #[test]
    fn no_match_no_draft_and_the_end_cuts_the_guess() {
        let mut l = PromptLookup::new(2);
        assert!(l.draft(&[1, 2, 3], 4).unwrap().tokens.is_empty());
        // "2" last seen at 1, followed by "2": the guess stops at the end.
        assert_eq!(l.draft(&[1, 2, 2], 4).unwrap().tokens, vec![2]);
    }
}
