//! Shared, cheaply clonable views of tensor bytes: a memory-mapped file or an
//! owned buffer (weights repacked or converted at load).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

#[derive(Clone)]
pub struct ByteView {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
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
        ByteView { owner, start, len }
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
