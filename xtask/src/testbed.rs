//! A cluster of real `shoal` nodes for end-to-end runs and benchmarks: N nodes, each in its own
//! network namespace on a private bridge (see `kit::netns`), their HTTP APIs reached with the
//! kit's cluster-API client from inside each node's namespace, the Python `openai` client run
//! inside one, and everything killed and removed when the testbed is dropped, also after a
//! failure or Ctrl-C.

use crate::paths::{target_dir, workspace_root};
use crate::pyenv::venv_python;
use kit::client::{Api, ApiFailure, Method};
use kit::netns::{Netns, Node, Spec};
use kit::node_process::ShoalNode;
pub use kit::node_process::API_PORT;
use kit::state_view::{alive_nodes, verified_edges};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static HANDLER: OnceLock<Result<(), String>> = OnceLock::new();

/// Catches Ctrl-C so that a run can stop at its next check and clean up (once per process).
pub fn catch_ctrl_c() -> Result<(), String> {
    HANDLER
        .get_or_init(|| {
            ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst))
                .map_err(|e| format!("cannot handle Ctrl-C: {e}"))
        })
        .clone()
}

/// `Err` once Ctrl-C was pressed.
pub fn check_interrupt() -> Result<(), String> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        Err("interrupted by Ctrl-C".into())
    } else {
        Ok(())
    }
}

/// Sleeps, waking early on Ctrl-C.
pub fn pause(d: Duration) -> Result<(), String> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        check_interrupt()?;
        std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
    }
    check_interrupt()
}

/// The `shoal` binary of this workspace, built (debug, or release) if needed.
pub fn build_shoal(release: bool) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("SHOAL_BIN").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let mut build = crate::cargo();
    build.args(["build", "--package", "shoal", "--bin", "shoal"]);
    if release {
        build.arg("--release");
    }
    crate::util::run(&mut build)?;
    Ok(target_dir()
        .join(if release { "release" } else { "debug" })
        .join("shoal"))
}

/// What a probe of [`Testbed::wait_for`] found.
pub enum Poll<T> {
    /// Done, with this.
    Ready(T),
    /// Not yet; the text says where things stand.
    Waiting(String),
}

/// How long one API request may take.
const REQUEST_LIMIT: Duration = Duration::from_secs(10);

/// N nodes in namespaces.
pub struct Testbed {
    nodes: Vec<ShoalNode>,
    /// Declared after `nodes` so that the processes are stopped before the namespaces go.
    netns: Netns,
    data_root: PathBuf,
}

impl Testbed {
    /// Starts `count` nodes named `tag`; `args(i)` gives node `i`'s extra `shoal` arguments.
    pub fn start(
        tag: &str,
        count: usize,
        binary: &Path,
        args: impl Fn(usize) -> Vec<String>,
    ) -> Result<Testbed, String> {
        kit::netns::available()?;
        remove_stale(tag);
        let prefix = format!("shoal{tag}-{}", std::process::id());
        let spec = Spec {
            nodes: count,
            off_bridge: Vec::new(),
            links: Vec::new(),
        };
        let netns = Netns::create(&prefix, &spec)?;
        let data_root = std::env::temp_dir().join(&prefix);
        let _ = std::fs::remove_dir_all(&data_root);
        std::fs::create_dir_all(&data_root)
            .map_err(|e| format!("cannot create {}: {e}", data_root.display()))?;
        let log_filter = std::env::var("RUST_LOG").unwrap_or("info".into());
        let mut nodes = Vec::with_capacity(count);
        for (i, ns) in netns.nodes.iter().enumerate() {
            let mut node = ShoalNode::new(binary, ns.clone(), &data_root, i + 1);
            node.extra_args = args(i);
            node.log_filter = log_filter.clone();
            node.try_start()
                .map_err(|e| format!("node {}: {e}", i + 1))?;
            nodes.push(node);
        }
        Ok(Testbed {
            nodes,
            netns,
            data_root,
        })
    }

    /// Starts node `i` again after [`Testbed::forget`] (same data directory: same identity).
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        self.forget(i);
        self.nodes[i]
            .try_start()
            .map_err(|e| format!("node {}: {e}", i + 1))
    }

    /// Node `i`'s API as a new client, for a thread of its own.
    pub fn api(&self, i: usize) -> Api {
        self.nodes[i].new_api()
    }

    /// The pid of node `i`'s `shoal` process while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].pid()
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    fn ns(&self, i: usize) -> &Node {
        &self.netns.nodes[i]
    }

    /// Node `i`'s API, as reached from any namespace of the testbed.
    pub fn url(&self, i: usize) -> String {
        format!("http://{}:{API_PORT}", self.ns(i).ip())
    }

    /// Where the logs are.
    pub fn log_dir(&self) -> &Path {
        &self.data_root
    }

    /// The last lines of node `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        self.nodes[i].log_last(lines)
    }

    /// Every node's log tail, for failure reports.
    pub fn all_logs(&self, lines: usize) -> String {
        (0..self.len())
            .map(|i| {
                format!(
                    "--- node {} ({}) ---\n{}",
                    i + 1,
                    self.nodes[i].log.display(),
                    self.log_tail(i, lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `Err` if node `i` exited (unless it was killed on purpose).
    pub fn check_alive(&mut self, i: usize) -> Result<(), String> {
        match self.nodes[i].exit_code() {
            Some(code) => Err(format!(
                "node {} exited (code {code:?}); its log:\n{}",
                i + 1,
                self.log_tail(i, 30)
            )),
            None => Ok(()),
        }
    }

    /// A request to node `i`'s API from its own namespace, bounded; a failure names the node.
    pub fn request<'a, T, F>(
        &'a self,
        i: usize,
        what: &str,
        request: impl FnOnce(&'a Api) -> F,
    ) -> Result<T, String>
    where
        F: std::future::Future<Output = Result<T, ApiFailure>>,
    {
        self.nodes[i]
            .api
            .run(REQUEST_LIMIT, request)
            .map_err(|e| format!("{what} on node {}: {e}", i + 1))
    }

    /// Places the default model as a pipeline over at least `min_nodes` nodes, through node
    /// 0's API; returns the number of ranks it got.
    pub fn place_pipeline(&self, min_nodes: usize) -> Result<usize, String> {
        let body = serde_json::json!({
            "model_id": "default",
            "sharding": "Pipeline",
            "min_nodes": min_nodes,
        });
        let placed = self.request(0, "POST /place_instance", |api| {
            api.json(kit::client::Method::POST, "/place_instance", Some(&body))
        })?;
        Ok(placed["placement"]["ranks"].as_array().map_or(0, Vec::len))
    }

    /// GET on node `i` from its own namespace, as JSON.
    pub fn get(&self, i: usize, path: &str) -> Result<Value, String> {
        self.request(i, &format!("GET {path}"), |api| {
            api.json(Method::GET, path, None)
        })
    }

    /// Polls `probe` every `every` until it is ready, up to `limit`. The probe's `Err` ends
    /// the wait at once (something broke); a timeout names `what` and the last `Waiting` text.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        limit: Duration,
        every: Duration,
        mut probe: impl FnMut(&mut Testbed) -> Result<Poll<T>, String>,
    ) -> Result<T, String> {
        let started = Instant::now();
        loop {
            check_interrupt()?;
            let last = match probe(self)? {
                Poll::Ready(value) => return Ok(value),
                Poll::Waiting(why) => why,
            };
            if started.elapsed() > limit {
                return Err(format!(
                    "{what}: not within {} s; last: {last}",
                    limit.as_secs()
                ));
            }
            pause(every)?;
        }
    }

    /// Node ids by node index, once every node answers `/node_id`.
    pub fn node_ids(&mut self, limit: Duration) -> Result<Vec<String>, String> {
        let count = self.len();
        self.wait_for(
            "every node's API answers",
            limit,
            Duration::from_millis(200),
            |tb| {
                let mut ids = Vec::new();
                for i in 0..count {
                    tb.check_alive(i)?;
                    match tb.nodes[i].node_id() {
                        Some(id) => ids.push(id),
                        None => {
                            return Ok(Poll::Waiting(format!(
                                "node {} does not answer /node_id yet",
                                i + 1
                            )))
                        }
                    }
                }
                Ok(Poll::Ready(ids))
            },
        )
    }

    /// Waits until every node's `/state` shows all `ids` alive and a verified edge from each
    /// to each other (what placement needs).
    pub fn wait_mesh(&mut self, ids: &[String], limit: Duration) -> Result<(), String> {
        let count = self.len();
        self.wait_for(
            "every node sees every node alive",
            limit,
            Duration::from_millis(250),
            |tb| {
                for i in 0..count {
                    tb.check_alive(i)?;
                    let state = match tb.get(i, "/state") {
                        Ok(state) => state,
                        Err(e) => return Ok(Poll::Waiting(e)),
                    };
                    let seen = alive_nodes(&state);
                    let missing = ids.iter().filter(|id| !seen.contains(id)).count();
                    if missing > 0 {
                        return Ok(Poll::Waiting(format!(
                            "node {} sees {} of {count} nodes alive",
                            i + 1,
                            count - missing,
                        )));
                    }
                    // Placement needs verified links between every pair.
                    let edges = verified_edges(&state);
                    let pairs = count * (count - 1);
                    let verified = ids
                        .iter()
                        .flat_map(|a| ids.iter().map(move |b| (a, b)))
                        .filter(|(a, b)| a != b && edges.contains(&((*a).clone(), (*b).clone())))
                        .count();
                    if verified < pairs {
                        return Ok(Poll::Waiting(format!(
                            "node {} sees {verified} of {pairs} links verified",
                            i + 1
                        )));
                    }
                }
                Ok(Poll::Ready(()))
            },
        )
    }

    /// Process ids of everything running in node `i`'s namespace (the node and its runners).
    pub fn pids(&self, i: usize) -> Vec<u32> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.ns(i).netns])
            .output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
    }

    /// Marks node `i` as gone (it was killed on purpose) and reaps it.
    pub fn forget(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Runs the venv's Python on `xtask/e2e_client.py` inside node `from`'s namespace; the
    /// output on success (it printed "all passed"), else an error with the script's output.
    pub fn client(&self, from: usize, args: &[String], limit: Duration) -> Result<String, String> {
        self.script(from, "e2e_client.py", args, limit)
    }

    /// A command running `program` inside node `i`'s namespace (a peer server the benchmarks
    /// start beside a node).
    pub fn command_in(&self, i: usize, program: &Path) -> Command {
        self.ns(i).command(&program.display().to_string())
    }

    /// Runs the venv's Python on `xtask/<script>` inside node `from`'s namespace, as
    /// [`Testbed::client`] does.
    pub fn script(
        &self,
        from: usize,
        script: &str,
        args: &[String],
        limit: Duration,
    ) -> Result<String, String> {
        let python = venv_python();
        if !python.exists() {
            return Err(format!(
                "{} is missing: run `cargo xtask setup` (it installs the openai client)",
                python.display()
            ));
        }
        let script = workspace_root().join("xtask").join(script);
        let mut cmd = self.ns(from).command(&python.display().to_string());
        cmd.arg(&script).args(args);
        let out = run_bounded(cmd, limit)?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        for line in stdout.lines() {
            eprintln!("    | {line}");
        }
        if out.status.success() && stdout.contains("all passed") {
            Ok(stdout)
        } else {
            let failed = stdout
                .lines()
                .find(|l| l.starts_with("FAILED"))
                .map(str::to_string)
                .unwrap_or_else(|| format!("the client exited ({})", out.status));
            Err(format!(
                "{failed}\n{}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Runs `program args` inside node `from`'s namespace, bounded, output inherited.
    pub fn run_in(
        &self,
        from: usize,
        program: &Path,
        args: &[String],
        limit: Duration,
    ) -> Result<(), String> {
        let mut cmd = self.ns(from).command(&program.display().to_string());
        cmd.args(args);
        let out = run_bounded(cmd, limit)?;
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        print!("{}", String::from_utf8_lossy(&out.stdout));
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{} exited ({})", program.display(), out.status))
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        // SIGTERM to all first, so they drain together, then each gets what is left of 3 s.
        for node in &mut self.nodes {
            if let Some(pid) = node.pid().filter(|_| node.alive()) {
                let _ = kit::node_process::signal(u64::from(pid), "TERM");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for node in &mut self.nodes {
            node.stop(deadline.saturating_duration_since(Instant::now()));
        }
        self.netns.teardown();
    }
}

/// Removes namespaces of earlier runs of this kind whose process is gone (killed with -9,
/// so their own cleanup never ran).
fn remove_stale(tag: &str) {
    let family = format!("shoal{tag}-");
    let mut stale: Vec<String> = Vec::new();
    for name in kit::netns::list(&family) {
        let pid = name[family.len()..].split('-').next().unwrap_or("");
        let alive = !pid.is_empty() && Path::new("/proc").join(pid).exists();
        if !alive {
            stale.push(name);
        }
    }
    for name in &stale {
        kit::netns::delete(name);
    }
    if !stale.is_empty() {
        eprintln!(
            "removed {} namespace(s) left by an earlier killed run",
            stale.len()
        );
    }
}

/// Runs a command with captured output, killing it after `limit` (and on Ctrl-C).
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    // Read the pipes on threads so a chatty child cannot block on a full pipe.
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out_thread = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = std::io::Read::read_to_end(s, &mut buf);
        }
        buf
    });
    let err_thread = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = std::io::Read::read_to_end(s, &mut buf);
        }
        buf
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(status);
        }
        if started.elapsed() > limit || check_interrupt().is_err() {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out_thread.join().unwrap_or_default();
    let stderr = err_thread.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => {
            check_interrupt()?;
            Err(format!(
                "{:?} ran past {} s and was stopped; its output:\n{}{}",
                cmd.get_program(),
                limit.as_secs(),
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            ))
        }
    }
}
