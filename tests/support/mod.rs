//! Helpers for tests that run real `shoal` processes in Linux network namespaces. The
//! namespaces, the skip rule and the cluster-API client come from the kit, as for
//! `cargo xtask cluster`.

#![allow(dead_code)]

pub use kit::netns;

pub mod hf;
pub mod hf_nodes;
pub mod hub_world;
pub mod link_delay;
pub mod link_faults;

use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[allow(unused_imports)] // each test binary uses its own share of the kit
pub use kit::node_process::{ShoalNode, API_PORT};

/// The `shoal` binary cargo built for these tests.
pub fn shoal_bin() -> &'static str {
    env!("CARGO_BIN_EXE_shoal")
}

/// The states of `nodes` if they are identical (same digest), each lists exactly `expected`
/// nodes, and each considers all of them alive.
pub fn agreed(nodes: &[&ShoalNode], expected: usize) -> Option<Vec<Value>> {
    let states: Vec<Value> = nodes.iter().map(|n| n.state()).collect::<Option<_>>()?;
    kit::state_view::agreed(&states, expected).then_some(states)
}

/// Polls `check` every 100 ms until it returns `Some` or `limit` passes.
pub fn wait_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return Some((value, start.elapsed()));
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The namespaced tests of one test binary take turns: two clusters of real nodes sharing
/// this machine's two cores slow each other past the bounds the tests derive from the
/// protocols' parameters (a death detected in 3.9 s against 5 s allowed, measured with two
/// tests side by side), and a flaky bound says nothing.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

thread_local! {
    /// How many [`Turn`]s this thread holds (a test that builds a second net keeps its turn).
    static TURNS_HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// This test's turn on the machine, held from [`TestNet::create`] until its net is gone.
struct Turn(Option<std::sync::MutexGuard<'static, ()>>);

impl Turn {
    fn take() -> Turn {
        let held = TURNS_HELD.with(|h| h.replace(h.get() + 1));
        if held > 0 {
            return Turn(None);
        }
        // A test that panicked while holding it leaves it poisoned: the next one goes on.
        Turn(Some(TURN.lock().unwrap_or_else(|p| p.into_inner())))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        TURNS_HELD.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

/// What every multi-node test starts from: fresh namespaces, a scratch directory, and one node
/// (not started yet) per namespace. [`TestNet::teardown`] checks that nothing is left behind.
/// While it exists no other namespaced test of the same binary runs (see [`TURN`]).
pub struct TestNet {
    /// The namespaces.
    pub net: netns::Netns,
    /// Data directories and logs of the nodes.
    pub dir: PathBuf,
    prefix: String,
    _turn: Turn,
}

impl TestNet {
    /// Namespaces named `<tag><pid>...` laid out as `spec`, with a node for each. Where
    /// namespaces are not available the test fails here, or with `SHOAL_ALLOW_SKIP=1` this
    /// returns `None` after counting the skip, and the caller returns (see `kit::skip`).
    pub fn create(tag: &str, spec: &netns::Spec) -> Option<(TestNet, Vec<ShoalNode>)> {
        if !kit::skip::can_run(netns::available(), netns::NEEDS) {
            return None;
        }
        let turn = Turn::take();
        let prefix = format!("{tag}{}", std::process::id());
        let net = netns::Netns::create(&prefix, spec).expect("create namespaces");
        let dir = std::env::temp_dir().join(&prefix);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let nodes = net
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| ShoalNode::new(shoal_bin().as_ref(), n.clone(), &dir, i + 1))
            .collect();
        Some((
            TestNet {
                net,
                dir,
                prefix,
                _turn: turn,
            },
            nodes,
        ))
    }

    /// Stops the nodes, deletes the namespaces (asserting none is left) and the scratch files.
    pub fn teardown(self, nodes: Vec<ShoalNode>) {
        drop(nodes);
        let TestNet {
            net,
            dir,
            prefix,
            _turn,
        } = self;
        drop(net);
        assert!(netns::list(&prefix).is_empty(), "namespaces left behind");
        let _ = std::fs::remove_dir_all(&dir);
        drop(_turn);
    }
}

/// The last lines of every node's log, for failure messages.
pub fn logs(nodes: &[ShoalNode]) -> String {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| format!("--- node {} ---\n{}", i + 1, n.log_tail()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One API call to `node` (inside its namespace): the status (0 when it did not answer) and
/// the JSON body (`null` when not JSON).
pub fn call(
    node: &ShoalNode,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    match node.api.call(
        method.parse().unwrap(),
        path,
        body,
        std::time::Duration::from_secs(120),
    ) {
        Ok(a) => (
            a.status.as_u16(),
            serde_json::from_str(&a.text()).unwrap_or(serde_json::Value::Null),
        ),
        Err(e) => (0, serde_json::Value::String(e.to_string())),
    }
}

/// Runs `tests/SCRIPT` with the venv's Python (`kit::dirs::python`) inside `node`'s
/// namespace, with `args`, for at most `limit` (then killed): its output, for the official
/// clients' checks of a real node.
pub fn run_script(
    node: &ShoalNode,
    script: &str,
    args: &[&str],
    limit: Duration,
) -> std::process::Output {
    let python = kit::dirs::python();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let mut child = node
        .node
        .command(&python.display().to_string())
        .arg(&script)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the venv's python");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() && started.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(200));
    }
    if child.try_wait().expect("wait").is_none() {
        let _ = child.kill();
    }
    child.wait_with_output().expect("the script's output")
}

/// The id of the first model `node` lists as ready in `GET /v1/models`, waiting up to `limit`
/// for one (a model named on the command line is placed by the node itself), with the wait.
pub fn ready_model_id(node: &ShoalNode, limit: Duration) -> Option<(String, Duration)> {
    wait_for(limit, || {
        let (200, models) = call(node, "GET", "/v1/models", None) else {
            return None;
        };
        models["data"]
            .as_array()?
            .iter()
            .find(|m| m["ready"] == true)
            .and_then(|m| m["id"].as_str().map(str::to_string))
    })
}

/// Whether `node` lists the model `default` (the fixture) as ready in `GET /v1/models`.
pub fn default_ready(node: &ShoalNode) -> bool {
    let (200, models) = call(node, "GET", "/v1/models", None) else {
        return false;
    };
    models["data"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["id"] == "default" && m["ready"] == true)
}

/// Sends signal `name` (`STOP`, `CONT`, `TERM`, ...) to process `pid`, with `kill` as an
/// operator would; fails the test if it cannot.
pub fn signal(pid: u64, name: &str) {
    if let Err(e) = kit::node_process::signal(pid, name) {
        panic!("{e}");
    }
}

/// Whether process `pid` has ended: gone, or a zombie its parent has not reaped yet.
pub fn process_ended(pid: u64) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// The pids of the runner processes (`shoal runner ...`) inside namespace `netns`.
pub fn runner_pids(netns: &str) -> Vec<u64> {
    let Ok(out) = std::process::Command::new("ip")
        .args(["netns", "pids", netns])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<u64>().ok())
        .filter(|pid| !process_ended(*pid))
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline.split(|b| *b == 0).nth(1) == Some(b"runner".as_slice())
        })
        .collect()
}

/// CPU time (user + system, seconds) process `pid` has used so far; 0 once it is gone.
pub fn cpu_seconds(pid: u64) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command (which is in parentheses): state is field 3, utime 14, stime 15.
    let Some(after) = stat.rfind(')').and_then(|at| stat.get(at + 2..)) else {
        return 0.0;
    };
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf only reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) as f64 / per_second
}

/// The CPU seconds each of `pids` uses over `window` from now (a runner's work, without
/// trusting anything it reports about itself).
pub fn cpu_over(pids: &[u64], window: std::time::Duration) -> Vec<f64> {
    let before: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    std::thread::sleep(window);
    pids.iter()
        .zip(before)
        .map(|(p, b)| cpu_seconds(*p) - b)
        .collect()
}

/// Three nodes in fresh namespaces (`tag` as in [`TestNet::create`]) started with `env`
/// added, running the fixture as a 3-rank pipeline, ready on every node: the
/// `/place_instance` answer. Placement needs the verified edges between the nodes, so it is
/// retried until it succeeds (90 s); loading may take 300 s. `None`: skipped.
pub fn three_rank_pipeline(
    tag: &str,
    env: &[(&str, &str)],
) -> Option<(TestNet, Vec<ShoalNode>, Value)> {
    three_rank_pipeline_beside(tag, env, 0)
}

/// [`three_rank_pipeline`] with `strangers` more nodes on the same LAN, started without
/// `env` (so without the cluster secret it may carry), after the three members in the list.
/// With `SHOAL_API_KEY` in `env`, the members' [`ShoalNode::api`] holds that admin key.
pub fn three_rank_pipeline_beside(
    tag: &str,
    env: &[(&str, &str)],
    strangers: usize,
) -> Option<(TestNet, Vec<ShoalNode>, Value)> {
    let spec = netns::Spec {
        nodes: 3 + strangers,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let (test_net, mut all) = TestNet::create(tag, &spec)?;
    let key = env
        .iter()
        .find(|(k, _)| *k == "SHOAL_API_KEY")
        .map(|(_, v)| *v);
    for (i, node) in all.iter_mut().enumerate() {
        if i < 3 {
            node.env
                .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            if let Some(key) = key {
                node.hold_key(key);
            }
        }
        node.start();
    }
    let nodes = &all[..3];
    let request =
        serde_json::json!({"model_id": "default", "sharding": "Pipeline", "min_nodes": 3});
    let placed = wait_for(Duration::from_secs(90), || {
        let (status, created) = call(&nodes[0], "POST", "/place_instance", Some(&request));
        (status == 200).then_some(created)
    });
    let Some((created, took)) = placed else {
        panic!("no three-node placement\n{}", logs(nodes));
    };
    let ranks = kit::instances::ranks(&created).map_or(0, Vec::len);
    assert_eq!(ranks, 3, "{created}");
    eprintln!("placed on three nodes after {took:?}");
    let ready = wait_for(Duration::from_secs(300), || {
        nodes.iter().all(default_ready).then_some(())
    });
    let Some((_, took)) = ready else {
        let id = created["instance_id"].as_str().unwrap_or_default();
        let (_, view) = call(&nodes[0], "GET", &format!("/instance/{id}"), None);
        panic!("the pipeline did not become ready: {view}\n{}", logs(nodes));
    };
    eprintln!("three-rank pipeline ready in {took:?}");
    Some((test_net, all, created))
}

/// The first of `nodes` that does not hold rank 0 of the instance `/place_instance` answered
/// with (`created`): a node that forwards every chat to the one that does.
pub fn node_without_rank0<'a>(nodes: &'a [ShoalNode], created: &Value) -> &'a ShoalNode {
    let rank0 = created["placement"]["ranks"][0]["node"]
        .as_str()
        .unwrap_or_default();
    nodes
        .iter()
        .find(|n| n.node_id().is_some_and(|id| id != rank0))
        .expect("a node without rank 0")
}

/// Whether the default model fixture is there (`cargo xtask setup` makes it); a test that
/// needs it and finds none fails, or with `SHOAL_ALLOW_SKIP=1` is skipped (see `kit::skip`).
pub fn default_model_present() -> bool {
    kit::skip::can_run(
        if kit::dirs::default_model_path().is_file() {
            Ok(())
        } else {
            Err("the model fixture is missing".to_string())
        },
        "run `cargo xtask setup`",
    )
}
