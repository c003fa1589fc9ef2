//! Tests that cannot run never pass silently.
//!
//! A test that needs something the machine lacks (root for network namespaces, the model
//! fixture, the venv) asks [`can_run`] first. By default a missing requirement fails the test
//! with a message saying what to install or run. With `SHOAL_ALLOW_SKIP=1` the test is skipped
//! instead, visibly: a `SKIPPED` line on stderr, and a line appended to the skip log
//! (`SHOAL_SKIP_LOG`, else `<target>/shoal-skips.log`), which `cargo xtask test` clears before
//! the run and counts after it. So a run either ran every test, or says how many it did not.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Set to `1` to skip (and count) tests that cannot run instead of failing them.
pub const ALLOW_VAR: &str = "SHOAL_ALLOW_SKIP";
/// Where skipped tests are recorded, one line each (set by `cargo xtask test`).
pub const LOG_VAR: &str = "SHOAL_SKIP_LOG";

/// What happens to a test that cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Skip (and count) instead of failing.
    pub allow: bool,
    /// The skip log.
    pub log: PathBuf,
}

/// What [`Policy::decide`] says about a test whose requirement is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Fail the test with this message.
    Fail(String),
    /// Skip it; this is its line in the skip log.
    Skip(String),
}

/// Whether `SHOAL_ALLOW_SKIP` allows skips in this process.
pub fn allowed() -> bool {
    std::env::var(ALLOW_VAR).is_ok_and(|v| v == "1")
}

/// The skip log of this process.
pub fn log_path() -> PathBuf {
    std::env::var_os(LOG_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::dirs::target_dir().join("shoal-skips.log"))
}

impl Policy {
    /// The policy the environment sets.
    pub fn from_env() -> Policy {
        Policy {
            allow: allowed(),
            log: log_path(),
        }
    }

    /// The verdict on `test`, which cannot run because of `why`; `fix` says what to do.
    pub fn decide(&self, test: &str, why: &str, fix: &str) -> Verdict {
        if self.allow {
            Verdict::Skip(format!("{test}: {why} ({fix})"))
        } else {
            Verdict::Fail(format!(
                "cannot run {test}: {why}. {fix}. (To skip such tests visibly instead, set \
                 {ALLOW_VAR}=1; `cargo xtask test` counts the skips.)"
            ))
        }
    }

    /// `true` when `check` passed and the test should go on. Otherwise fails the test (a
    /// panic), or when skips are allowed records the skip and returns `false`: the caller
    /// returns at once.
    pub fn can_run(&self, test: &str, check: Result<(), String>, fix: &str) -> bool {
        let Err(why) = check else {
            return true;
        };
        match self.decide(test, &why, fix) {
            Verdict::Fail(message) => panic!("{message}"),
            Verdict::Skip(line) => {
                eprintln!("SKIPPED {line}");
                if let Err(e) = append(&self.log, &line) {
                    panic!(
                        "{test} was skipped but the skip could not be counted in {}: {e}",
                        self.log.display()
                    );
                }
                false
            }
        }
    }
}

/// [`Policy::can_run`] with the environment's policy, for the calling test.
pub fn can_run(check: Result<(), String>, fix: &str) -> bool {
    Policy::from_env().can_run(&current_test(), check, fix)
}

/// `binary::test` of the calling test (libtest names each test's thread after it).
pub fn current_test() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            // Cargo names test binaries `name-<16 hex digits>`.
            Some((name, hash))
                if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                name.to_string()
            }
            _ => stem,
        })
        .unwrap_or_else(|| "?".into());
    let thread = std::thread::current();
    format!("{binary}::{}", thread.name().unwrap_or("?"))
}

fn append(log: &Path, line: &str) -> std::io::Result<()> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    // One write per line: appends of this size do not interleave between processes.
    file.write_all(format!("{}\n", line.replace('\n', " ")).as_bytes())
}

/// The skips recorded in `log` (none when it does not exist).
pub fn read_log(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// `N tests skipped: ...`, one skip a line; `None` when nothing was skipped.
pub fn summary(skips: &[String]) -> Option<String> {
    if skips.is_empty() {
        return None;
    }
    let mut text = format!(
        "{} test{} skipped:",
        skips.len(),
        if skips.len() == 1 { "" } else { "s" }
    );
    for line in skips {
        text.push_str("\n  ");
        text.push_str(line);
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kit-skip-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("skips.log")
    }

    fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> Option<String> {
        let err = std::panic::catch_unwind(f).err()?;
        err.downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
    }

    #[test]
    fn a_met_requirement_runs_and_records_nothing() {
        let log = scratch("met");
        for allow in [false, true] {
            let policy = Policy {
                allow,
                log: log.clone(),
            };
            assert!(policy.can_run("t", Ok(()), "nothing"));
        }
        assert!(read_log(&log).is_empty());
        assert!(summary(&read_log(&log)).is_none());
    }

    #[test]
    fn a_missing_requirement_fails_by_default_with_the_fix() {
        let log = scratch("fail");
        let policy = Policy {
            allow: false,
            log: log.clone(),
        };
        let message = panic_message(|| {
            policy.can_run(
                "mesh_cluster::t",
                Err("network namespaces need root".into()),
                "run as root",
            );
        })
        .expect("the test fails");
        assert!(message.contains("cannot run mesh_cluster::t"), "{message}");
        assert!(
            message.contains("network namespaces need root"),
            "{message}"
        );
        assert!(message.contains("run as root"), "{message}");
        assert!(message.contains("SHOAL_ALLOW_SKIP=1"), "{message}");
        assert!(read_log(&log).is_empty(), "a failure is not a skip");
    }

    #[test]
    fn allowed_skips_are_counted_in_the_log() {
        let log = scratch("count");
        let policy = Policy {
            allow: true,
            log: log.clone(),
        };
        assert!(!policy.can_run(
            "a::one",
            Err("no fixture".into()),
            "run `cargo xtask setup`"
        ));
        assert!(!policy.can_run("b::two", Err("two\nlines".into()), "fix"));
        let skips = read_log(&log);
        assert_eq!(
            skips,
            vec![
                "a::one: no fixture (run `cargo xtask setup`)".to_string(),
                "b::two: two lines (fix)".to_string()
            ]
        );
        let text = summary(&skips).unwrap();
        assert!(text.starts_with("2 tests skipped:\n  a::one"), "{text}");
        assert_eq!(
            summary(&skips[..1]).unwrap().lines().next(),
            Some("1 test skipped:")
        );
        let _ = std::fs::remove_dir_all(log.parent().unwrap());
    }

    /// What `tests/support`'s `TestNet::create` does for a multi-node test, run as a user who
    /// is not root: never a pass.
    #[test]
    fn a_multi_node_test_as_non_root_fails_or_is_a_counted_skip() {
        let not_root = || crate::netns::check_available(1000, || Ok(()));
        let test = "mesh_cluster::nodes_in_namespaces_discover_agree_detect_death_and_rejoin";
        let log = scratch("nonroot");
        let strict = Policy {
            allow: false,
            log: log.clone(),
        };
        let message = panic_message(|| {
            strict.can_run(test, not_root(), crate::netns::NEEDS);
        })
        .expect("without SHOAL_ALLOW_SKIP the test fails");
        assert!(
            message.contains("need root (running as uid 1000)"),
            "{message}"
        );
        assert!(message.contains("run the tests as root"), "{message}");
        assert!(read_log(&log).is_empty());
        let lenient = Policy {
            allow: true,
            log: log.clone(),
        };
        assert!(!lenient.can_run(test, not_root(), crate::netns::NEEDS));
        let skips = read_log(&log);
        assert_eq!(skips.len(), 1);
        assert!(skips[0].starts_with(test), "{skips:?}");
        let _ = std::fs::remove_dir_all(log.parent().unwrap());
    }

    #[test]
    fn the_current_test_is_named_after_its_thread() {
        let name = current_test();
        assert!(
            name.ends_with("::skip::tests::the_current_test_is_named_after_its_thread"),
            "{name}"
        );
        assert!(name.starts_with("kit::"), "{name}");
    }
}
