//! `shoal secret`: makes the `cluster.secret` file in the data directory (or shows it) and
//! prints how to start the other machines. A node reads it at start
//! ([`node::start::resolve_secret`]: the flag or variable first, then this file).

use anyhow::Context;
use clap::Args;
use mesh::net::admission::{ClusterSecret, SECRET_FILE};
use std::path::{Path, PathBuf};

/// `shoal secret`: makes this node's cluster secret (or shows the one it has).
#[derive(Args, Debug)]
pub struct SecretArgs {
    /// Replace the secret this data directory holds with a new one (rotation: then start every
    /// node with the new one; until they all have it, the cluster is split in two).
    #[arg(long)]
    pub new: bool,

    /// The data directory whose secret to make or show (default: the node's).
    #[arg(long, env = "SHOAL_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

/// Runs `shoal secret`.
pub fn run(args: &SecretArgs) -> anyhow::Result<()> {
    let dir = args.data_dir.clone().unwrap_or_else(paths::data_dir);
    let path = dir.join(SECRET_FILE);
    let existing = std::fs::read_to_string(&path).ok();
    let (text, made) = match existing {
        Some(text) if !args.new => (text.trim().to_string(), false),
        _ => {
            let text = ClusterSecret::generate_text();
            write_private(&dir, &path, &text)?;
            (text, true)
        }
    };
    let tag = ClusterSecret::from_text(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        .tag();
    if made {
        println!("A new cluster secret is in {} (tag {tag}).", path.display());
        println!("A node started with this data directory uses it from now on.");
    } else {
        println!("The cluster secret in {} (tag {tag}):", path.display());
    }
    println!();
    println!("Start every other machine of the cluster with:");
    println!("  SHOAL_CLUSTER_SECRET={text} shoal");
    println!("or write the secret to the cluster.secret file in its data directory.");
    println!("Keep it private: whoever has it can join the cluster.");
    Ok(())
}

/// Writes `text` to `path` readable by the owner only, whole or not at all.
fn write_private(dir: &Path, path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let temporary = dir.join(format!("{SECRET_FILE}.new-{}", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(&temporary)
        .with_context(|| format!("cannot create {}", temporary.display()))?;
    file.write_all(format!("{text}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use node::start::resolve_secret as resolve;

    #[test]
    fn the_flag_wins_then_the_file_then_none() {
        let dir = std::env::temp_dir().join(format!("shoal-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert!(resolve(None, &dir).unwrap().is_none());
        write_private(&dir, &dir.join(SECRET_FILE), "file secret of enough length").unwrap();
        let from_file = resolve(None, &dir).unwrap().unwrap();
        let expected = ClusterSecret::from_text("file secret of enough length").unwrap();
        assert_eq!(from_file.tag(), expected.tag());
        let from_flag = resolve(Some("flag secret of enough length"), &dir)
            .unwrap()
            .unwrap();
        assert_ne!(from_flag.tag(), expected.tag());
        let err = resolve(Some("short"), &dir).unwrap_err().to_string();
        assert!(err.contains("SHOAL_CLUSTER_SECRET"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
