//! Shared, cheaply clonable views of tensor bytes: a memory-mapped file or an
//! owned buffer (weights repacked or converted at load).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// The page size [`ByteView::release_pages_behind`] rounds to: x86-64's
/// base page (where weights are repacked, the one caller); elsewhere the
/// largest base page a Linux kernel uses, a multiple of the smaller ones.
#[cfg(target_arch = "x86_64")]
const PAGE: usize = 4 << 10;
#[cfg(not(target_arch = "x86_64"))]
const PAGE: usize = 64 << 10;

#[derive(Clone)]
pub struct ByteView {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    /// The owner again when it is a read-only map of a file (see
    /// [`ByteView::file_mapped`]): its pages can be dropped and read back.
    file_map: Option<Arc<memmap2::Mmap>>,
    start: usize,
    len: usize,
}

impl ByteView {
    /// A view of `owner[start..start + len]`. Panics when the range is outside
    /// the owner; callers validate ranges against the file first.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, start: usize, len: usize) -> Self {
        let total = (*owner).as_ref().len();
        assert!(
            start <= total && len <= total - start,
            "ByteView out of range"
        );
        ByteView {
            owner,
            file_map: None,
            start,
            len,
        }
    }
    /// A view of `map[start..start + len]`, where `map` is a read-only map of
    /// a file that nothing writes while it is open (what `crate::Gguf::open`
    /// makes), so [`ByteView::release_pages`] may drop its pages.
    pub fn file_mapped(map: Arc<memmap2::Mmap>, start: usize, len: usize) -> Self {
        let mut v = ByteView::new(map.clone(), start, len);
        v.file_map = Some(map);
        v
    }
    /// Drops this view's pages from the process's resident memory when it is
    /// a view of a file map (a no-op otherwise): for weights that were copied
    /// (repacked) at load and are rarely read again, so the process does not
    /// hold both copies. A later read faults the pages back in from the file.
    /// Pages at the ends that the view shares with its neighbours go too;
    /// they come back the same way.
    pub fn release_pages(&self) {
        #[cfg(unix)]
        if let Some(map) = &self.file_map {
            // SAFETY: MADV_DONTNEED on a read-only private file mapping only
            // discards clean pages: no byte ever changes (the next access
            // reads the same file contents back), so references into the map
            // stay valid. The file not being modified while mapped is the
            // map's own invariant (see `Gguf::open`). The range is within the
            // map (checked at construction). A failure leaves the pages
            // resident, which is harmless, so it is ignored.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, self.start, self.len)
            };
        }
    }
    /// [`ByteView::release_pages`] for views released in ascending file
    /// order (a matrix's row chunks; the experts of a stacked tensor, one
    /// after another), except that the page holding the view's last byte
    /// stays resident: the next view shares it, and releasing it first made
    /// that view's first read fault it back in together with the cached
    /// pages around it (the kernel maps up to `fault_around_bytes`, 64 KiB,
    /// around a fault), this view's released ones among them, which nothing
    /// released again until the load ended. With experts of a few dozen KiB
    /// that kept most of the file resident beside the repacked copies. The
    /// next view's release, which starts at its first byte's page, takes
    /// the kept page.
    pub fn release_pages_behind(&self) {
        #[cfg(unix)]
        if let Some(map) = &self.file_map {
            let begin = map.as_ptr() as usize + self.start;
            let keep_from = (begin + self.len) & !(PAGE - 1);
            if keep_from <= begin {
                return;
            }
            // SAFETY: as in `release_pages`: only clean pages of a read-only
            // private file map are discarded, so no byte changes; the range
            // is a prefix of this view's, so within the map.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    self.start,
                    keep_from - begin,
                )
            };
        }
    }
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        ByteView::new(Arc::new(v), 0, len)
    }
    /// A narrower view of this one.
    pub fn slice(&self, start: usize, len: usize) -> Self {
        assert!(
            start <= self.len && len <= self.len - start,
            "ByteView slice out of range"
        );
        ByteView {
            owner: self.owner.clone(),
            file_map: self.file_map.clone(),
            start: self.start + start,
            len,
        }
    }
}

impl Deref for ByteView {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

impl fmt::Debug for ByteView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ByteView({} bytes)", self.len)
    }
}
