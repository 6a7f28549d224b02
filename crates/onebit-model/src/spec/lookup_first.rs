//! Prompt lookup first (matches of at least two tokens), a draft model when
//! lookup finds nothing: where the
//! text repeats its input (a rename, a quoted passage) the guess costs no
//! forward at all; elsewhere the draft model guesses as it would alone.
//! Invariant: a step's guess is exactly what one of the two drafters would
//! have guessed for the same context (lookup's when it has one), so the
//! target's verify keeps output identical to plain decoding either way. The
//! draft model's state follows the sequence even across steps lookup
//! answered: [`DraftModel`] runs the tokens it has not seen when next asked.

use super::{Draft, DraftModel, Drafter, PromptLookup};
use crate::error::Result;

pub struct LookupFirst {
    lookup: PromptLookup,
    model: DraftModel,
}

impl LookupFirst {
    pub fn new(lookup: PromptLookup, model: DraftModel) -> LookupFirst {
        LookupFirst { lookup, model }
    }
}

impl Drafter for LookupFirst {
    fn draft(&mut self, ctx: &[u32], k: usize) -> Result<Draft> {
        let d = self.lookup.draft(ctx, k)?;
        if !d.tokens.is_empty() {
            return Ok(d);
        }
        self.model.draft(ctx, k)
    }
}
