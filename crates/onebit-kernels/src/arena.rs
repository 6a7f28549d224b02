//! Memory for weights in the kernels' layouts: one anonymous mapping that
//! holds many matrices' repacked rows, one after another in the order the
//! forward reads them, and asks Linux for 2 MiB pages.
//!
//! Decode streams every weight once per token, so how that memory is mapped
//! shows in its speed. With 4 KiB pages a token crosses a page (and, on a
//! VM, a nested page walk) every 4 KiB; a model's small matrices (a SmolLM2
//! layer's are 0.07 to 1.1 MB) are too small for a huge page of their own,
//! so they share one mapping. Laid out in reading order, the kernels'
//! prefetch past the end of one matrix lands on the start of the next.
//! On a Zen 4 VM (2 threads, medians of 5 alternating tg64 runs) SmolLM2
//! decoded at 263 tok/s with a huge-page-advised mapping per matrix, 270
//! from one mapping without the advice, and 296 from one mapping with it;
//! Gemma 3 270M at 110, 105 and 116.
//!
//! The advice is only advice: where transparent huge pages are off, or the
//! mapping cannot be made, the bytes live in ordinary memory and every
//! result is the same.
// Only x86 repacks weights; the aarch64 kernels read the file's rows.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;

/// Zeroed bytes: an anonymous mapping advised to use huge pages, or heap
/// memory when no mapping can be made.
pub(crate) enum Region {
    Map(memmap2::MmapMut),
    Heap(Vec<u8>),
}

impl Region {
    /// `len` zeroed bytes (memmap2 maps a page for a zero length and
    /// exposes no bytes).
    pub(crate) fn zeroed(len: usize) -> Region {
        match memmap2::MmapMut::map_anon(len) {
            Ok(map) => {
                #[cfg(target_os = "linux")]
                {
                    // Advice only: without transparent huge pages the
                    // mapping keeps 4 KiB pages, which is fine.
                    let _ = map.advise(memmap2::Advice::HugePage);
                }
                Region::Map(map)
            }
            Err(_) => Region::Heap(vec![0; len]),
        }
    }
}

impl Deref for Region {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Region::Map(m) => m,
            Region::Heap(v) => v,
        }
    }
}

impl DerefMut for Region {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Region::Map(m) => m,
            Region::Heap(v) => v,
        }
    }
}

/// One matrix's bytes inside a shared [`Region`].
pub(crate) struct Slot {
    region: Arc<Region>,
    range: Range<usize>,
}

impl Slot {
    /// A region of its own, filled by `fill`.
    pub(crate) fn alone(len: usize, fill: impl FnOnce(&mut [u8])) -> Slot {
        let mut region = Region::zeroed(len);
        fill(&mut region[..len]);
        Slot {
            region: Arc::new(region),
            range: 0..len,
        }
    }

    /// One region for all `lens`, the slots one after another (each
    /// starting on a cache line), `fill(i, bytes)` writing slot i, the
    /// slots filled in the order `fill_order` gives (a permutation of
    /// `0..lens.len()`; slots it leaves out stay zeroed); the slots in
    /// layout order. None when the lengths overflow.
    pub(crate) fn shared(
        lens: &[usize],
        fill_order: &[usize],
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> Option<Vec<Slot>> {
        let mut ranges = Vec::with_capacity(lens.len());
        let mut at = 0usize;
        for &len in lens {
            let end = at.checked_add(len)?;
            ranges.push(at..end);
            at = end.checked_next_multiple_of(64)?;
        }
        let mut region = Region::zeroed(at);
        let mut parts: Vec<Option<&mut [u8]>> = Vec::with_capacity(ranges.len());
        let mut rest = &mut region[..];
        let mut taken = 0;
        for r in &ranges {
            let (_, tail) = rest.split_at_mut(r.start - taken);
            let (mine, tail) = tail.split_at_mut(r.len());
            parts.push(Some(mine));
            rest = tail;
            taken = r.end;
        }
        for &i in fill_order {
            if let Some(bytes) = parts.get_mut(i).and_then(Option::take) {
                fill(i, bytes);
            }
        }
        drop(parts);
        let region = Arc::new(region);
        Some(
            ranges
                .into_iter()
                .map(|range| Slot {
                    region: region.clone(),
                    range,
                })
                .collect(),
        )
    }
}

impl Deref for Slot {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.region[self.range.clone()]
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Slot({} bytes at {})",
            self.range.len(),
            self.range.start
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_slots_hold_what_was_written_each_on_a_cache_line() {
        let lens = [5, 0, 130, 64];
        let mut filled = Vec::new();
        let slots = Slot::shared(&lens, &[2, 0, 3, 1, 2], |i, b| {
            filled.push(i);
            assert_eq!(b.len(), lens[i]);
            assert!(b.iter().all(|&x| x == 0), "a region starts zeroed");
            b.iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = (i * 50 + j) as u8);
        })
        .unwrap();
        // In the order asked, each slot once.
        assert_eq!(filled, [2, 0, 3, 1]);
        for (i, s) in slots.iter().enumerate() {
            assert_eq!(s.len(), lens[i]);
            assert_eq!(s.range.start % 64, 0);
            assert!(s.iter().enumerate().all(|(j, &x)| x == (i * 50 + j) as u8));
        }
        // Back to back: 5 -> 64, 0 -> 64, 130 -> 256.
        let starts: Vec<usize> = slots.iter().map(|s| s.range.start).collect();
        assert_eq!(starts, [0, 64, 64, 256]);
        assert!(Slot::shared(&[usize::MAX, 1], &[0, 1], |_, _| {}).is_none());
    }
}
