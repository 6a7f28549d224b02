//! The hash a Hub file is known by, and the check of a file against it. An
//! LFS file's etag is the sha256 of its bytes (64 hex digits); a small file
//! kept in git is known by its git blob id, the SHA-1 of `blob <len>\0`
//! followed by its bytes (40 hex digits). Any other etag cannot be checked,
//! and a file that cannot be checked is refused rather than trusted.

use std::io::Read;
use std::path::Path;

use sha1::Sha1;
use sha2::{Digest, Sha256};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    Sha256,
    GitSha1,
}

impl Algo {
    /// What an etag of this length and alphabet is, if it is a hash we know.
    pub fn of(hash: &str) -> Option<Algo> {
        if !hash.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        match hash.len() {
            64 => Some(Algo::Sha256),
            40 => Some(Algo::GitSha1),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Algo::Sha256 => "sha256",
            Algo::GitSha1 => "git blob SHA-1",
        }
    }
}

/// An etag as the Hub sends it (`"abc"`, `W/"abc"`) as a bare lower-case hash.
pub fn normalize_etag(etag: &str) -> String {
    etag.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_ascii_lowercase()
}

/// The hash of `path`'s bytes by `algo`, lower-case hex.
pub fn hash_file(path: &Path, algo: Algo) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let mut buf = vec![0u8; 1 << 20];
    enum H {
        S256(Sha256),
        S1(Sha1),
    }
    let mut h = match algo {
        Algo::Sha256 => H::S256(Sha256::new()),
        Algo::GitSha1 => {
            let mut s = Sha1::new();
            s.update(format!("blob {len}\0").as_bytes());
            H::S1(s)
        }
    };
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        match &mut h {
            H::S256(s) => s.update(&buf[..n]),
            H::S1(s) => s.update(&buf[..n]),
        }
    }
    Ok(match h {
        H::S256(s) => hex(&s.finalize()),
        H::S1(s) => hex(&s.finalize()),
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests() {
        let dir = onebit_testdata::TempDir::new("hub-verify");
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        // `git hash-object` of "hello\n", and `sha256sum` of it.
        assert_eq!(
            hash_file(&p, Algo::GitSha1).unwrap(),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(
            hash_file(&p, Algo::Sha256).unwrap(),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(normalize_etag("W/\"ABCdef\""), "abcdef");
        assert_eq!(Algo::of(&"a".repeat(64)), Some(Algo::Sha256));
        assert_eq!(Algo::of(&"a".repeat(40)), Some(Algo::GitSha1));
        assert_eq!(Algo::of("xyz"), None);
    }
}
