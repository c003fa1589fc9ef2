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
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_key(dir, &path),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Writes a new key to a private temporary file and links it into place, so two nodes
/// started at once on one data directory agree on one key: the link either succeeds or finds
/// the other's complete file, never a half-written one.
fn create_key(dir: &Path, path: &Path) -> anyhow::Result<SecretKey> {
    let key = SecretKey::generate();
    static ATTEMPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let attempt = ATTEMPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let temporary = dir.join(format!("{KEY_FILE}.new-{}-{attempt}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(&key.to_bytes())?;
            file.sync_all()
        })
        .with_context(|| format!("cannot create {}", temporary.display()));
    let linked = written.and_then(|()| match std::fs::hard_link(&temporary, path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
    });
    let _ = std::fs::remove_file(&temporary);
    if linked? {
        Ok(key)
    } else {
        // Another process made the key first; its file is complete (it was linked whole).
        load_or_create_key(dir)
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

    #[test]
    fn nodes_starting_together_agree_on_one_key() {
        let dir = std::env::temp_dir().join(format!("shoal-identity-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let keys: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| load_or_create_key(&dir).unwrap().public()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(KEY_FILE)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
