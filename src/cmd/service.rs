//! `shoal service install` / `uninstall`: run the node as a per-user service that starts at
//! login (or at boot with lingering), restarts after a crash and logs to the system's log.
//!
//! On Linux a systemd user unit, `$XDG_CONFIG_HOME/systemd/user/shoal.service` (by default
//! `~/.config/systemd/user/`), whose `ExecStart` is this very binary with the node flags given
//! after `--`; its output goes to the journal (`journalctl --user -u shoal`). On macOS a
//! launchd agent, `~/Library/LaunchAgents/dev.shoal.node.plist`, logging to
//! `~/Library/Logs/shoal.log` (written as launchd documents it; not run on a Mac here).
//! Installing writes the file and prints the commands that start it; `--now` runs them.

use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};

/// `shoal service`.
#[derive(Args, Debug)]
pub struct ServiceArgs {
    #[command(subcommand)]
    pub action: ServiceAction,
}

/// What `shoal service` does.
#[derive(Subcommand, Debug)]
pub enum ServiceAction {
    /// Write the service for this binary with the node flags after `--` (e.g. `shoal service
    /// install -- --model default`), and print how to start it.
    Install {
        /// Also enable and start it now (`systemctl --user enable --now shoal`, or
        /// `launchctl load -w` on macOS).
        #[arg(long)]
        now: bool,
        /// The node's flags, as `shoal` takes them.
        #[arg(last = true)]
        node_args: Vec<String>,
    },
    /// Stop the service and remove its file.
    Uninstall,
}

/// The unit's name.
pub const UNIT: &str = "shoal.service";

/// Runs `shoal service`.
pub fn run(args: &ServiceArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    match &args.action {
        ServiceAction::Install { now, node_args } => install(&exe, node_args, *now),
        ServiceAction::Uninstall => uninstall(),
    }
}

/// Where systemd looks for this user's units.
pub fn systemd_user_dir() -> PathBuf {
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".config"));
    config.join("systemd").join("user")
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// One argument of `ExecStart=` as systemd reads it: double-quoted, with `\` and `"` escaped,
/// `%` (a specifier) doubled and `$` (a variable) doubled.
fn systemd_quote(arg: &str) -> String {
    let mut out = String::from("\"");
    for c in arg.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The systemd user unit that runs `exe` with `node_args`.
pub fn systemd_unit(exe: &Path, node_args: &[String]) -> String {
    let command: Vec<String> = std::iter::once(exe.display().to_string())
        .chain(node_args.iter().cloned())
        .map(|a| systemd_quote(&a))
        .collect();
    format!(
        "[Unit]\n\
         Description=shoal node: one machine of a cluster that serves language models\n\
         Documentation=https://github.com/shoal/shoal#operating\n\
         After=network-online.target\n\
         Wants=network-online.target\n\
         \n\
         [Service]\n\
         ExecStart={}\n\
         Restart=on-failure\n\
         RestartSec=5\n\
         Environment=NO_COLOR=1\n\
         # Its output goes to the journal: journalctl --user -u shoal -f\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        command.join(" ")
    )
}

/// The launchd agent that runs `exe` with `node_args` (macOS; built and unit-tested on Linux
/// too, so its text is checked where no Mac is).
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
pub fn launchd_plist(exe: &Path, node_args: &[String], log: &Path) -> String {
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let args: String = std::iter::once(exe.display().to_string())
        .chain(node_args.iter().cloned())
        .map(|a| format!("    <string>{}</string>\n", escape(&a)))
        .collect();
    let log = escape(&log.display().to_string());
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \
         \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
         <plist version=\"1.0\">\n<dict>\n  <key>Label</key>\n  <string>dev.shoal.node</string>\n  \
         <key>ProgramArguments</key>\n  <array>\n{args}  </array>\n  <key>RunAtLoad</key>\n  \
         <true/>\n  <key>KeepAlive</key>\n  <true/>\n  <key>StandardOutPath</key>\n  \
         <string>{log}</string>\n  <key>StandardErrorPath</key>\n  <string>{log}</string>\n\
         </dict>\n</plist>\n"
    )
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

fn run_command(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let status = std::process::Command::new(program)
        .args(args)
        .status()
        .with_context(|| format!("cannot run {program}"))?;
    anyhow::ensure!(
        status.success(),
        "{program} {} failed: {status}",
        args.join(" ")
    );
    Ok(())
}

#[cfg(not(target_os = "macos"))]
fn install(exe: &Path, node_args: &[String], now: bool) -> anyhow::Result<()> {
    let path = systemd_user_dir().join(UNIT);
    write(&path, &systemd_unit(exe, node_args))?;
    println!("Wrote {}.", path.display());
    if now {
        run_command("systemctl", &["--user", "daemon-reload"])?;
        run_command("systemctl", &["--user", "enable", "--now", "shoal"])?;
        println!("Started. Its log: journalctl --user -u shoal -f");
    } else {
        println!("Start it now and at every login with:");
        println!("  systemctl --user daemon-reload && systemctl --user enable --now shoal");
    }
    println!("To run it at boot without logging in: loginctl enable-linger $USER");
    println!(
        "Status: systemctl --user status shoal, or shoal status; log: journalctl --user -u shoal"
    );
    Ok(())
}

#[cfg(not(target_os = "macos"))]
fn uninstall() -> anyhow::Result<()> {
    let path = systemd_user_dir().join(UNIT);
    // Stopping a unit that is not running is fine; systemctl may be absent (a container).
    let _ = run_command("systemctl", &["--user", "disable", "--now", "shoal"]);
    match std::fs::remove_file(&path) {
        Ok(()) => println!("Removed {}.", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("No service installed ({} does not exist).", path.display())
        }
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
    let _ = run_command("systemctl", &["--user", "daemon-reload"]);
    Ok(())
}

#[cfg(target_os = "macos")]
fn plist_path() -> PathBuf {
    home().join("Library/LaunchAgents/dev.shoal.node.plist")
}

#[cfg(target_os = "macos")]
fn install(exe: &Path, node_args: &[String], now: bool) -> anyhow::Result<()> {
    let path = plist_path();
    let log = home().join("Library/Logs/shoal.log");
    write(&path, &launchd_plist(exe, node_args, &log))?;
    println!("Wrote {}.", path.display());
    let load = format!("launchctl load -w {}", path.display());
    if now {
        run_command("launchctl", &["load", "-w", &path.display().to_string()])?;
        println!("Started. Its log: {}", log.display());
    } else {
        println!("Start it now and at every login with:\n  {load}");
    }
    Ok(())
}

#[cfg(target_os = "macos")]
fn uninstall() -> anyhow::Result<()> {
    let path = plist_path();
    let _ = run_command("launchctl", &["unload", "-w", &path.display().to_string()]);
    match std::fs::remove_file(&path) {
        Ok(()) => println!("Removed {}.", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => println!("No service installed."),
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_runs_this_binary_with_the_flags_quoted_for_systemd() {
        let args = vec![
            "--model".to_string(),
            "my models/a \"b\".gguf".to_string(),
            "--namespace".to_string(),
            "50%$HOME".to_string(),
        ];
        let unit = systemd_unit(Path::new("/opt/shoal/shoal"), &args);
        let exec = unit.lines().find(|l| l.starts_with("ExecStart=")).unwrap();
        assert_eq!(
            exec,
            r#"ExecStart="/opt/shoal/shoal" "--model" "my models/a \"b\".gguf" "--namespace" "50%%$$HOME""#
        );
        assert!(unit.contains("Restart=on-failure"), "{unit}");
        assert!(unit.contains("WantedBy=default.target"), "{unit}");
    }

    #[test]
    fn the_plist_escapes_its_arguments() {
        let plist = launchd_plist(
            Path::new("/Applications/shoal/shoal"),
            &["--model".into(), "a<b>&c".into()],
            Path::new("/Users/me/Library/Logs/shoal.log"),
        );
        assert!(
            plist.contains("<string>a&lt;b&gt;&amp;c</string>"),
            "{plist}"
        );
        assert!(plist.contains("<string>dev.shoal.node</string>"), "{plist}");
    }
}
