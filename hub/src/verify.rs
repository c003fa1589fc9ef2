//! Checking content against the hub's hash as it arrives: sha256 for LFS files, the git blob
//! sha1 (`sha1("blob <size>\0" + bytes)`) for small ones.

use sha2::Digest;

/// A running hash of a file's content, of the kind its expected hash is.
pub enum ContentHash {
    /// sha256 (LFS files).
    Sha256(Box<sha2::Sha256>),
    /// git blob sha1 (small files).
    GitBlob(Box<sha1_smol::Sha1>),
}

impl ContentHash {
    /// A hash for a file of `size` bytes; `lfs` picks sha256, else the git blob sha1.
    pub fn new(lfs: bool, size: u64) -> ContentHash {
        if lfs {
            ContentHash::Sha256(Box::default())
        } else {
            let mut h = sha1_smol::Sha1::new();
            h.update(format!("blob {size}\0").as_bytes());
            ContentHash::GitBlob(Box::new(h))
        }
    }

    /// Adds bytes.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            ContentHash::Sha256(h) => h.update(data),
            ContentHash::GitBlob(h) => h.update(data),
        }
    }

    /// The hash in lowercase hex.
    pub fn hex(self) -> String {
        match self {
            ContentHash::Sha256(h) => hex(&h.finalize()),
            ContentHash::GitBlob(h) => h.hexdigest(),
        }
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hash of a whole file's bytes (for tests and the test hub).
pub fn hash_of(lfs: bool, data: &[u8]) -> String {
    let mut h = ContentHash::new(lfs, data.len() as u64);
    h.update(data);
    h.hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_hashes() {
        // `git hash-object` of "hello\n", and sha256 of "abc".
        assert_eq!(
            hash_of(false, b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(
            hash_of(true, b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
