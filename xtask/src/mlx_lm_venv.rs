//! The venv with pinned mlx-lm, shared by the benchmarks (`cargo xtask bench inference`,
//! `bench concurrency`: mlx-lm as the peer to beat) and setup's family fixtures (mlx-lm as the
//! reference implementation): `pip install 'mlx[cpu]==<setup's MLX>' mlx-lm==<MLX_LM_VERSION>`,
//! the MLX that shoal links, so both sides run the same kernels.
//!
//! It lives at `<cache>/bench/mlx-lm-venv`, where the benchmark made it first, so machines that
//! already have it keep it.

use crate::mlx_build::MLX_VERSION;
use crate::paths::cache_dir;
use crate::util::run;
use std::path::{Path, PathBuf};
use std::process::Command;

/// mlx-lm's release that the benchmarks measure and the fixtures are made with (it asks for
/// `mlx>=0.32.2`; the venv gets exactly setup's [`MLX_VERSION`]).
pub(crate) const MLX_LM_VERSION: &str = "0.32.2";

/// What the venv installs: pinned MLX (the CPU build) and mlx-lm.
pub(crate) fn requirements() -> [String; 2] {
    [
        format!("mlx[cpu]=={MLX_VERSION}"),
        format!("mlx-lm=={MLX_LM_VERSION}"),
    ]
}

/// The venv's folder.
pub(crate) fn venv_dir() -> PathBuf {
    cache_dir().join("bench").join("mlx-lm-venv")
}

/// The versions of MLX and of `dist` (whose module is `module`) installed for `python`, if
/// both import.
fn installed(python: &Path, dist: &str, module: &str) -> Option<(String, String)> {
    let out = Command::new(python)
        .args([
            "-c",
            &format!(
                "import importlib.metadata as m, mlx.core, {module}; \
                 print(m.version('mlx'), m.version('{dist}'))"
            ),
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    Some((words.next()?.to_owned(), words.next()?.to_owned()))
}

/// A venv at `venv` holding setup's MLX and `dist == version` (importable as `module`), made
/// or brought to those versions on first use; its Python. Shared by mlx-lm's venv and
/// mlx-vlm's (`crate::mlx_vlm_venv`).
pub(crate) fn pinned_venv(
    venv: &Path,
    dist: &str,
    module: &str,
    version: &str,
) -> Result<PathBuf, String> {
    let python = venv.join("bin").join("python");
    let pinned = (MLX_VERSION.to_owned(), version.to_owned());
    let requirements = [
        format!("mlx[cpu]=={MLX_VERSION}"),
        format!("{dist}=={version}"),
    ];
    if installed(&python, dist, module).as_ref() != Some(&pinned) {
        eprintln!(
            "installing mlx {MLX_VERSION} and {dist} {version} in {} ...",
            venv.display()
        );
        if !python.exists() {
            std::fs::create_dir_all(venv.parent().expect("the venv has a parent"))
                .map_err(|e| format!("cannot create {}: {e}", venv.display()))?;
            run(Command::new("python3").args(["-m", "venv"]).arg(venv)).map_err(|e| {
                format!("{e}\n(python3's venv module is missing: apt-get install python3-venv)")
            })?;
        }
        run(Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet"])
            .args(&requirements))
        .map_err(|e| format!("{e}\n(pip needs PyPI; the packages are {requirements:?})"))?;
    }
    match installed(&python, dist, module) {
        Some(versions) if versions == pinned => Ok(python),
        other => Err(format!(
            "the venv {} holds mlx/{dist} {other:?}, not the pinned {pinned:?}; delete it and \
             run again",
            venv.display()
        )),
    }
}

/// The venv with the pinned mlx-lm (made, or brought to the pinned versions, on first use);
/// its Python and the versions it holds (`(mlx, mlx-lm)`).
pub(crate) fn mlx_lm_venv() -> Result<(PathBuf, (String, String)), String> {
    let python = pinned_venv(&venv_dir(), "mlx-lm", "mlx_lm", MLX_LM_VERSION)?;
    Ok((python, (MLX_VERSION.to_owned(), MLX_LM_VERSION.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_venv_is_pinned_to_shoals_mlx() {
        let [mlx, lm] = requirements();
        assert_eq!(mlx, format!("mlx[cpu]=={MLX_VERSION}"));
        assert_eq!(lm, "mlx-lm==0.32.2");
        assert!(venv_dir().ends_with("bench/mlx-lm-venv"));
    }
}
