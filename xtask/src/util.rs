//! Small helpers shared by the xtask commands: progress lines and child processes.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// One numbered step of a long command, printing `[i/n] name: ...` progress lines on stderr.
pub struct Step {
    label: String,
    started: Instant,
}

impl Step {
    pub fn new(index: usize, total: usize, name: &str) -> Step {
        Step {
            label: format!("[{index}/{total}] {name}"),
            started: Instant::now(),
        }
    }

    pub fn progress(&self, what: &str) {
        eprintln!("{}: {what} ...", self.label);
    }

    pub fn cached(&self, what: &str) {
        eprintln!("{}: ok, already done ({what})", self.label);
    }

    pub fn done(&self, what: &str) {
        eprintln!(
            "{}: done in {:.1}s ({what})",
            self.label,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Runs a command with inherited output; a failure names the command.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed ({status})", describe(cmd)))
    }
}

/// Runs a command with its output captured; on failure the last lines of its output are shown,
/// so a long native build prints one progress line instead of hundreds.
pub fn run_quiet(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(40)..].join("\n");
    Err(format!(
        "{} failed ({}):\n{tail}",
        describe(cmd),
        out.status
    ))
}

fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

pub fn command_exists(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name} >/dev/null 2>&1")])
        .status()
        .is_ok_and(|s| s.success())
}

/// The sha256 of a file, by coreutils' `sha256sum` (present on every Debian and Ubuntu).
pub fn sha256_file(path: &Path) -> Result<String, String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run sha256sum: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "sha256sum {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(str::to_owned)
        .ok_or_else(|| format!("sha256sum printed nothing for {}", path.display()))
}
