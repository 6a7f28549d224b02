//! An exclusive advisory lock on a file (flock(2)): two pulls of one blob
//! take turns, and a lock held by a process that dies is released by the
//! kernel with its descriptors, so no stale lock outlives an interrupted pull.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;

/// Held while alive; unlocked when dropped (closing the file releases it).
pub struct Lock {
    _file: File,
}

impl Lock {
    /// Blocks until `path` (created if missing) is locked exclusively.
    pub fn acquire(path: &Path) -> std::io::Result<Lock> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        loop {
            // SAFETY: flock takes a descriptor and a flag and touches no
            // memory of ours; the descriptor is valid, owned by `file`,
            // which outlives the call.
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if r == 0 {
                return Ok(Lock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}
