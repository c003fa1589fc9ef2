//! `shoal service install` through the real binary: the unit it writes (under a scratch
//! `XDG_CONFIG_HOME`) runs this binary with the flags given and is accepted by
//! `systemd-analyze verify` where systemd is installed; `uninstall` removes it.

use std::process::Command;

#[test]
fn the_installed_unit_is_valid_and_uninstall_removes_it() {
    let dir = std::env::temp_dir().join(format!("shoal-service-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let shoal = env!("CARGO_BIN_EXE_shoal");
    let out = Command::new(shoal)
        .args([
            "service",
            "install",
            "--",
            "--model",
            "default",
            "--api-port",
            "52499",
        ])
        .env("XDG_CONFIG_HOME", &dir)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("systemctl --user"), "{said}");
    let unit_path = dir.join("systemd/user/shoal.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let exec = unit.lines().find(|l| l.starts_with("ExecStart=")).unwrap();
    assert_eq!(
        exec,
        format!("ExecStart=\"{shoal}\" \"--model\" \"default\" \"--api-port\" \"52499\"")
    );
    // systemd's own check of the file, where systemd is installed (a missing binary, a bad
    // key or a bad section is an error there).
    match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit_path)
        .output()
    {
        Ok(verify) => assert!(
            verify.status.success(),
            "systemd-analyze verify: {}{}",
            String::from_utf8_lossy(&verify.stdout),
            String::from_utf8_lossy(&verify.stderr)
        ),
        Err(e) => eprintln!("systemd-analyze is not installed ({e}): the unit's text was checked"),
    }
    let out = Command::new(shoal)
        .args(["service", "uninstall"])
        .env("XDG_CONFIG_HOME", &dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!unit_path.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
