//! A relocatable release of the `shoal` binary: what `cargo xtask dist` writes and the dist
//! test unpacks elsewhere.
//!
//! `shoal-VERSION-ARCH-linux.tar.gz` holds one folder: the binary (debug info stripped, its
//! run path `$ORIGIN/lib/mlx/lib` in place of the build cache's absolute one), and under `lib/`
//! the libraries it loads from outside the system's C and C++ runtime, laid out as MLX's
//! wheel lays them out so that each finds the next through its own run path: `lib/mlx/lib/
//! libmlx.so` (which looks in `$ORIGIN/../../mlx_cpu.libs`) and `lib/mlx_cpu.libs/` (LAPACK,
//! BLAS, the Fortran runtime they need). Beside them a README naming what the tarball needs
//! from the system (the newest glibc symbol version any bundled file uses, measured here), the
//! licenses of what it bundles, and `SHA256SUMS` of the tarball next to it.
//!
//! Linux only: on macOS MLX is a framework the binary finds through the system (untested here).
//! The tools it runs are `ldd`, `patchelf`, `strip`, `objdump`, `tar` and `sha256sum`
//! (`cargo xtask setup` installs `patchelf`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Libraries every Linux system has in its C and C++ runtime: not bundled.
const SYSTEM_LIBRARIES: &[&str] = &[
    "linux-vdso",
    "ld-linux",
    "libc.so",
    "libm.so",
    "libdl.so",
    "librt.so",
    "libpthread.so",
    "libstdc++.so",
    "libgcc_s.so",
];

/// The binary's run path inside the tarball's folder.
pub const RUN_PATH: &str = "$ORIGIN/lib/mlx/lib";

/// What [`package`] wrote.
#[derive(Debug, Clone)]
pub struct Tarball {
    /// The `.tar.gz`.
    pub path: PathBuf,
    /// The folder it was made from (left in place beside it).
    pub folder: PathBuf,
    /// Every library bundled, as file names under `lib/`.
    pub bundled: Vec<String>,
    /// The newest glibc symbol version a bundled file needs (`2.34`).
    pub glibc: String,
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "{:?} {:?} failed: {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The libraries `ldd` resolves for `file` (name, path), without `LD_LIBRARY_PATH`.
pub fn resolved_libraries(file: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let text = run(Command::new("ldd").arg(file).env_remove("LD_LIBRARY_PATH"))?;
    let mut libs = Vec::new();
    for line in text.lines() {
        let Some((name, rest)) = line.trim().split_once(" => ") else {
            continue;
        };
        if rest.starts_with("not found") {
            return Err(format!("{}: {name} is not found", file.display()));
        }
        let path = rest.split(" (").next().unwrap_or_default().trim();
        if !path.is_empty() {
            libs.push((name.to_owned(), PathBuf::from(path)));
        }
    }
    Ok(libs)
}

fn is_system(name: &str) -> bool {
    SYSTEM_LIBRARIES.iter().any(|s| name.starts_with(s))
}

/// The newest `GLIBC_x.y` version `file`'s dynamic symbols ask for.
fn glibc_needed(file: &Path) -> Result<Option<(u32, u32)>, String> {
    let text = run(Command::new("objdump").arg("-T").arg(file))?;
    Ok(text
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .max())
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
}

/// Packs `binary` as `shoal-<version>-<arch>-linux` under `out` (see the module docs).
pub fn package(binary: &Path, out: &Path, version: &str) -> Result<Tarball, String> {
    let name = format!("shoal-{version}-{}-linux", std::env::consts::ARCH);
    let folder = out.join(&name);
    let _ = std::fs::remove_dir_all(&folder);
    let (mlx_lib, libs) = (folder.join("lib/mlx/lib"), folder.join("lib/mlx_cpu.libs"));
    for dir in [&mlx_lib, &libs, &folder.join("LICENSES")] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let shipped = folder.join("shoal");
    copy(binary, &shipped)?;
    run(Command::new("strip").arg("--strip-debug").arg(&shipped))?;
    run(Command::new("patchelf")
        .args(["--set-rpath", RUN_PATH])
        .arg(&shipped))?;

    let mut bundled = BTreeSet::new();
    let mut mlx_root = None;
    for (lib, path) in resolved_libraries(binary)? {
        if is_system(&lib) {
            continue;
        }
        let file = path
            .file_name()
            .ok_or_else(|| format!("{} has no file name", path.display()))?;
        let to = if lib.starts_with("libmlx") {
            // .../mlx/lib/libmlx.so: the wheel's root is two folders up.
            mlx_root = path
                .parent()
                .and_then(Path::parent)
                .and_then(Path::parent)
                .map(Path::to_path_buf);
            mlx_lib.join(file)
        } else {
            libs.join(&lib)
        };
        copy(&path, &to)?;
        bundled.insert(
            to.strip_prefix(folder.join("lib"))
                .unwrap_or(&to)
                .display()
                .to_string(),
        );
    }
    let Some(mlx_root) = mlx_root else {
        return Err(format!("{} does not load libmlx.so", binary.display()));
    };
    // Everything the wheel ships beside libmlx.so: `ldd` does not list every file libmlx
    // needs (its BLAS shares a soname with the LAPACK already loaded), the loader still opens
    // it by name.
    let wheel_libs = mlx_root.join("mlx_cpu.libs");
    for entry in std::fs::read_dir(&wheel_libs)
        .into_iter()
        .flatten()
        .flatten()
    {
        let to = libs.join(entry.file_name());
        if !to.exists() {
            copy(&entry.path(), &to)?;
            bundled.insert(format!(
                "mlx_cpu.libs/{}",
                entry.file_name().to_string_lossy()
            ));
        }
    }

    let mut glibc = (0, 0);
    let walk = std::iter::once(shipped.clone())
        .chain(
            std::fs::read_dir(&mlx_lib)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path()),
        )
        .chain(
            std::fs::read_dir(&libs)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path()),
        );
    for file in walk {
        if let Some(v) = glibc_needed(&file)? {
            glibc = glibc.max(v);
        }
    }
    let glibc = format!("{}.{}", glibc.0, glibc.1);
    write_licenses(&mlx_root, &folder.join("LICENSES"))?;
    std::fs::write(folder.join("README.txt"), readme(version, &glibc, &bundled))
        .map_err(|e| e.to_string())?;

    let tarball = out.join(format!("{name}.tar.gz"));
    run(Command::new("tar")
        .arg("-C")
        .arg(out)
        .args(["-czf"])
        .arg(&tarball)
        .arg(&name))?;
    let sums = run(Command::new("sha256sum")
        .arg(format!("{name}.tar.gz"))
        .current_dir(out))?;
    std::fs::write(out.join("SHA256SUMS"), sums).map_err(|e| e.to_string())?;
    Ok(Tarball {
        path: tarball,
        folder,
        bundled: bundled.into_iter().collect(),
        glibc,
    })
}

/// The licenses of what the tarball bundles: MLX's (from its wheel's metadata) and the Fortran
/// runtime's (from the system's package documentation), where present.
fn write_licenses(mlx_root: &Path, to: &Path) -> Result<(), String> {
    let mut found = 0;
    for dist_info in std::fs::read_dir(mlx_root).into_iter().flatten().flatten() {
        let licenses = dist_info.path().join("licenses");
        for file in std::fs::read_dir(&licenses).into_iter().flatten().flatten() {
            let name = format!("mlx-{}", file.file_name().to_string_lossy());
            copy(&file.path(), &to.join(name))?;
            found += 1;
        }
    }
    for package in ["libgfortran5", "libquadmath0"] {
        let copyright = Path::new("/usr/share/doc").join(package).join("copyright");
        if copyright.exists() {
            copy(&copyright, &to.join(format!("{package}.copyright")))?;
        }
    }
    if found == 0 {
        return Err(format!("no license files under {}", mlx_root.display()));
    }
    Ok(())
}

fn readme(version: &str, glibc: &str, bundled: &BTreeSet<String>) -> String {
    let libs: Vec<String> = bundled.iter().map(|l| format!("  lib/{l}")).collect();
    format!(
        "shoal {version}\n\n\
         Run it from this folder, on every machine of the cluster:\n\n  \
         ./shoal                       # a node; it finds the others on the network\n  \
         ./shoal --model default       # a node that places the default model at start\n  \
         ./shoal --help\n\n\
         Move the folder anywhere (the binary finds lib/ beside itself); nothing else is \
         installed.\n\n\
         Needs from the system: Linux on {arch} with glibc {glibc} or newer, libstdc++ and \
         libgcc_s (present wherever a C++ program runs). The CPU kernels choose their \
         instructions at run time (AVX2 where the CPU has it).\n\n\
         Bundled (their licenses are in LICENSES/):\n{}\n\n\
         shoal itself is licensed MIT OR Apache-2.0.\n",
        libs.join("\n"),
        arch = std::env::consts::ARCH,
    )
}
