//! [`ShoalNode`]: one `shoal` node process inside a network namespace ([`crate::netns`]), with
//! its data directory, its log and a client of its API reached from inside the namespace. The
//! integration tests (`tests/support`) and `cargo xtask`'s testbed (e2e runs, benchmarks) both
//! start nodes through it, so a node is started, signalled, asked and stopped one way.

use crate::blocking::Blocking;
use crate::client::{Api, Method};
use crate::netns::Node;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Every node's API port (each node has its own namespace, so they do not collide).
pub const API_PORT: u16 = 52415;

/// How long the helpers here wait for one answer of the node's API.
const ASK_LIMIT: Duration = Duration::from_secs(10);

/// A `shoal` node process inside a namespace; killed when dropped.
pub struct ShoalNode {
    /// Its namespace and addresses.
    pub node: Node,
    /// The `shoal` binary it runs.
    pub binary: PathBuf,
    /// Its data directory (kept across restarts: same identity).
    pub data_dir: PathBuf,
    /// Its log file (stderr and stdout, appended to by every start).
    pub log: PathBuf,
    /// Extra `shoal` arguments (e.g. `--peer`).
    pub extra_args: Vec<String>,
    /// Extra environment variables (e.g. `HF_HUB_CACHE`).
    pub env: Vec<(String, String)>,
    /// Its `RUST_LOG`.
    pub log_filter: String,
    /// Its API, reached from inside its namespace.
    pub api: Blocking,
    child: Option<Child>,
}

impl ShoalNode {
    /// Node `index` (1-based: its files are `n<index>` and `n<index>.log` under `dir`) of
    /// `binary` in `node`'s namespace, not started yet.
    pub fn new(binary: &Path, node: Node, dir: &Path, index: usize) -> ShoalNode {
        let api = Blocking::new(api_of(&node));
        ShoalNode {
            node,
            binary: binary.to_path_buf(),
            api,
            data_dir: dir.join(format!("n{index}")),
            log: dir.join(format!("n{index}.log")),
            extra_args: Vec::new(),
            env: Vec::new(),
            log_filter: "info,mesh=debug".into(),
            child: None,
        }
    }

    /// Starts (or restarts) the process; its log is appended to.
    pub fn try_start(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("cannot open {}: {e}", self.log.display()))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = self
            .node
            .command(&self.binary.display().to_string())
            .args(["--api-port", &API_PORT.to_string(), "--data-dir"])
            .arg(&self.data_dir)
            .args(&self.extra_args)
            .env("RUST_LOG", &self.log_filter)
            .env("NO_COLOR", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// [`ShoalNode::try_start`] for tests: a node that cannot start fails the test.
    pub fn start(&mut self) {
        if let Err(e) = self.try_start() {
            panic!("{e}");
        }
    }

    /// A new client of its API (for a thread of its own), as [`ShoalNode::api`] reaches it.
    pub fn new_api(&self) -> Api {
        api_of(&self.node)
    }

    /// Its node id (`GET /node_id`), once it answers.
    pub fn node_id(&self) -> Option<String> {
        let answer = self
            .api
            .call(Method::GET, "/node_id", None, ASK_LIMIT)
            .ok()?;
        if answer.status.as_u16() != 200 {
            return None;
        }
        let value = answer.value();
        value
            .as_str()
            .or_else(|| value["node_id"].as_str())
            .map(str::to_string)
    }

    /// Makes [`ShoalNode::api`] a client holding `key` (the operator's admin key).
    pub fn hold_key(&mut self, key: &str) {
        self.api = Blocking::new(api_of(&self.node).with_key(key));
    }

    /// The process id while it runs (`ip netns exec` becomes `shoal` itself).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process was started and has not ended.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The exit status if the process has ended.
    pub fn exit_code(&mut self) -> Option<Option<i32>> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        Some(status.code())
    }

    /// Sends signal `name` (`STOP`, `CONT`, `TERM`, ...) to the node's process; panics when
    /// it was never started or `kill` fails (a test's signal that does not arrive proves
    /// nothing).
    pub fn signal(&self, name: &str) {
        let pid = self.pid().expect("the node runs");
        if let Err(e) = signal(u64::from(pid), name) {
            panic!("{e}");
        }
    }

    /// SIGKILL: a crash, no goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL if it has not ended by `grace`: how a testbed ends a run.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(Some(_))) {
                // Ended and reaped: its pid may be someone else's now.
                return;
            }
            let _ = signal(u64::from(child.id()), "TERM");
            let deadline = std::time::Instant::now() + grace;
            while std::time::Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `GET /state` through `shoal status --json`, run inside the node's namespace with the
    /// node's environment (its API key, if it has one): what an operator's status command
    /// sees.
    pub fn state(&self) -> Option<Value> {
        let out = self
            .node
            .command(&self.binary.display().to_string())
            .args(["status", "--json", "--api"])
            .arg(format!("{}:{API_PORT}", self.node.ip()))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The last 30 lines of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        self.log_last(30)
    }

    /// The last `lines` lines of its log.
    pub fn log_last(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ShoalNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The API of the node in `node`'s namespace, reached from inside it.
fn api_of(node: &Node) -> Api {
    Api::at(std::net::SocketAddr::from((node.ip(), API_PORT))).in_netns(&node.netns)
}

/// Sends signal `name` to process `pid` with `kill`, as an operator would.
pub fn signal(pid: u64, name: &str) -> Result<(), String> {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        Err(format!("kill -{name} {pid} failed"))
    }
}
