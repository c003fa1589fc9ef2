//! The node's identity (an iroh secret key kept in the data directory) and its generation
//! (a number that grows with every start, so peers can tell a restart from stale records).

use anyhow::{bail, Context};
use iroh::SecretKey;
use std::io::Write;
use std::path::Path;

/// File name of the secret key inside the data directory.
pub const KEY_FILE: &str = "node.key";
const GENERATION_FILE: &str = "generation";

/// Loads the secret key from `dir`, or creates one (readable by the owner only).
pub fn load_or_create_key(dir: &Path) -> anyhow::Result<SecretKey> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    let path = dir.join(KEY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let Ok(bytes) = <[u8; 32]>::try_from(bytes.as_slice()) else {
                bail!(
                    "{} is not a 32-byte key ({} bytes); move it away to get a new identity",
                    path.display(),
                    bytes.len()
                );
            };
            Ok(SecretKey::from_bytes(&bytes))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = SecretKey::generate();
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options
                .open(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            file.write_all(&key.to_bytes())?;
            file.sync_all()?;
            Ok(key)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The generation of this start: above the last one recorded in `dir`, and at least the
/// current Unix time in milliseconds (so a data directory restored from a backup still moves
/// forward).
pub fn next_generation(dir: &Path) -> anyhow::Result<u64> {
    let path = dir.join(GENERATION_FILE);
    let last = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let generation = (last + 1).max(now);
    std::fs::write(&path, generation.to_string())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_persists_and_generation_grows() {
        let dir = std::env::temp_dir().join(format!("shoal-identity-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = load_or_create_key(&dir).unwrap();
        let b = load_or_create_key(&dir).unwrap();
        assert_eq!(a.public(), b.public());
        let g1 = next_generation(&dir).unwrap();
        let g2 = next_generation(&dir).unwrap();
        assert!(g2 > g1);
        std::fs::write(dir.join(KEY_FILE), b"short").unwrap();
        let err = load_or_create_key(&dir).unwrap_err().to_string();
        assert!(err.contains("32-byte"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
