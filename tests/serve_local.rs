//! One real node serving the real SmolLM2 fixture, end to end: the `shoal` binary runs with
//! `--model default` inside a Linux network namespace made for the test (nodes never touch
//! the host's network), and the official `openai` Python client, also run inside the
//! namespace, drives it: the gateway's model-agnostic checks (gateway/tests/openai_client.py,
//! the `anthropic` client's gateway/tests/anthropic_client.py and the `ollama` client's
//! gateway/tests/ollama_client.py, and the Responses API's gateway/tests/responses_client.py),
//! a greedy "Paris", the prompt cache (a repeated long prompt reports `cached_tokens` in each
//! API and answers the same), `top_logprobs` and `logit_bias`, 32 concurrent streams (time to first token printed), and the
//! loss of the runner mid-stream (an error, never a hang).
//!
//! Needs root (for `ip netns`), the model fixture and the Python venv, all of which
//! `cargo xtask setup` provides; without root it fails, or with `SHOAL_ALLOW_SKIP=1` is
//! skipped and counted (see `kit::skip`).

#[path = "serve_local/prompt_limits.rs"]
mod prompt_limits;

use inference::memory::MemoryOf;
use kit::netns::{self, Netns, Spec};
use kit::node_process::{ShoalNode, API_PORT};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A network namespace with only loopback up (the kit's, with the node off the bridge),
/// deleted on drop (even when the test panics). Without root the test fails here, or with
/// `SHOAL_ALLOW_SKIP=1` is skipped and counted.
fn namespace(tag: &str) -> Option<Netns> {
    if !kit::skip::can_run(netns::available(), netns::NEEDS) {
        return None;
    }
    let prefix = format!("shoal-t{}-{tag}", std::process::id());
    // Namespaces of that name can only be leftovers of a killed run with the same pid.
    for name in netns::list(&prefix) {
        netns::delete(&name);
    }
    let spec = Spec {
        nodes: 1,
        off_bridge: vec![0],
        links: Vec::new(),
    };
    Some(Netns::create(&prefix, &spec).unwrap_or_else(|e| {
        panic!("cannot create network namespace {prefix} (this test needs root): {e}")
    }))
}

/// A `shoal` node process in its own namespace (the kit's [`ShoalNode`], serving the default
/// model); stopped (SIGTERM, then SIGKILL) on drop, before the namespace goes.
struct Node {
    /// Declared before `ns`, so it stops before the namespace is deleted.
    node: ShoalNode,
    ns: Netns,
}

impl Node {
    /// `None` when the test is skipped (see [`namespace`]). `extra` are more flags.
    fn start(tag: &str, extra: &[&str]) -> Option<Node> {
        let ns = namespace(tag)?;
        let inside = &ns.nodes[0];
        let scratch = std::env::temp_dir();
        let mut node = ShoalNode::new(
            env!("CARGO_BIN_EXE_shoal").as_ref(),
            inside.clone(),
            &scratch,
            0,
        );
        // The node's own data directory (identity, state), so tests running at once never
        // share one; removed on drop.
        node.log = scratch.join(format!("{}.log", inside.netns));
        node.data_dir = scratch.join(format!("{}.data", inside.netns));
        let _ = std::fs::remove_file(&node.log);
        let _ = std::fs::remove_dir_all(&node.data_dir);
        node.extra_args = ["--model", "default"]
            .iter()
            .chain(extra)
            .map(|a| a.to_string())
            .collect();
        node.log_filter = "info".into();
        node.start();
        Some(Node { node, ns })
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{API_PORT}/v1")
    }

    fn log_tail(&self) -> String {
        self.node.log_last(40)
    }

    /// GET `path` inside the namespace; `None` while the server does not answer 2xx.
    fn get_json(&self, path: &str) -> Option<Value> {
        self.node
            .api
            .run(Duration::from_secs(5), |api| {
                api.json(kit::client::Method::GET, path, None)
            })
            .ok()
    }

    /// Waits until `/v1/models` lists `default` as ready.
    fn wait_ready(&mut self, limit: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if let Some(code) = self.node.exit_code() {
                panic!(
                    "the node exited (code {code:?}) before it was ready:\n{}",
                    self.log_tail()
                );
            }
            let ready = self.get_json("/v1/models").is_some_and(|models| {
                models["data"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["id"] == "default" && m["ready"] == true)
            });
            if ready {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "the default model was not ready within {limit:?}:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs a Python script with the venv's interpreter inside the namespace; panics with
    /// its output unless it exits 0 and printed "all passed".
    fn python(&self, script: &Path, args: &[&str], limit: Duration) -> String {
        let python = kit::dirs::python();
        assert!(
            python.exists(),
            "{} is missing: the openai Python client is installed by `cargo xtask setup`",
            python.display()
        );
        let mut cmd = self.ns.nodes[0].command(&python.display().to_string());
        cmd.arg(script).args(args);
        let out = run_with_limit(cmd, limit);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && stdout.contains("all passed"),
            "{} {args:?} failed ({}):\n{stdout}\n{}\nnode log:\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
        stdout
    }
}

impl Node {
    /// SIGTERM, as an init system stops a service: the node exits 0 within 10 s, its runner
    /// (`runner_pid`) is gone, and nothing at error level is logged while it stops (iroh
    /// once logged "Endpoint dropped without calling Endpoint::close").
    fn stop_as_an_operator_would(&mut self, runner_pid: u64) {
        let before = std::fs::metadata(&self.node.log).map_or(0, |m| m.len() as usize);
        self.node.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        let code = loop {
            if let Some(code) = self.node.exit_code() {
                break code;
            }
            assert!(
                Instant::now() < deadline,
                "the node did not stop within 10 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = std::fs::read(&self.node.log).unwrap_or_default();
        let stopping = String::from_utf8_lossy(&log[before.min(log.len())..]).into_owned();
        assert!(
            code == Some(0),
            "the node exited with code {code:?} on SIGTERM:\n{stopping}"
        );
        assert!(
            !stopping.lines().any(|l| l.contains("ERROR")),
            "errors while stopping:\n{stopping}"
        );
        assert!(
            !std::path::Path::new(&format!("/proc/{runner_pid}")).exists(),
            "the runner {runner_pid} outlived its node"
        );
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.node.stop(Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&self.node.data_dir);
    }
}

/// Runs `cmd`, killing it after `limit` (then panicking): a hung client must fail the test,
/// not hang it.
fn run_with_limit(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect output");
            panic!(
                "command ran past {limit:?}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().expect("collect output")
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The JSON line a script printed (the one with `key`).
fn json_line(stdout: &str, key: &str) -> Value {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get(key).is_some())
        .unwrap_or_else(|| panic!("no JSON line with `{key}` in:\n{stdout}"))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The whole life of one node: ready, correct, concurrent, and a runner lost mid-stream.
/// One test (one model load) rather than several, to keep CI on two cores short.
#[test]
fn one_node_serves_smollm2_in_a_namespace() {
    let Some(mut node) = Node::start("serve", &[]) else {
        return;
    };
    let took = node.wait_ready(Duration::from_secs(240));
    eprintln!("node ready after {:.1} s", took.as_secs_f64());
    let url = node.base_url();
    let checks = repo_file("tests/node_checks.py");
    let minute = Duration::from_secs(60);

    // Node and instance are visible through the cluster API.
    let node_id = node.get_json("/node_id").expect("GET /node_id");
    assert!(node_id.as_str().is_some_and(|s| !s.is_empty()), "{node_id}");
    let state = node.get_json("/state").expect("GET /state");
    let instances = state["instances"].as_object().expect("instances in state");
    assert_eq!(instances.len(), 1, "{state}");
    let (instance_id, instance) = instances.iter().next().expect("one instance");
    assert_eq!(instance["model_id"], "default");
    assert_eq!(
        instance["runners"][node_id.as_str().unwrap()]["state"],
        "ready",
        "{instance}"
    );
    let runner_pid = instance["runner_pid"].as_u64().expect("runner pid");
    let by_id = node
        .get_json(&format!("/instance/{instance_id}"))
        .expect("GET /instance/{id}");
    assert_eq!(by_id["instance_id"], instance_id.as_str());

    // A greedy answer that a 135M model gets right, under both names of the default model.
    for model in ["default", "SmolLM2-135M-Instruct"] {
        let out = node.python(&checks, &[&url, model, "paris"], minute);
        eprintln!("{model}: {}", json_line(&out, "answer"));
    }

    prompt_cache_reports_cached_tokens(&node);
    prompt_limits::a_long_system_prompt_is_refused_in_bounded_memory(&node);
    prompt_limits::huge_prompts_are_refused_before_tokenizing(&node);
    sampling_controls(&node, &url, &checks);

    // The gateway's model-agnostic checks with the official client, and a call that
    // `tool_choice` forces, which must come back typed.
    let out = node.python(
        &repo_file("gateway/tests/openai_client.py"),
        &[&url, "default"],
        Duration::from_secs(300),
    );
    eprintln!("forced call: {}", json_line(&out, "forced_call"));

    // The other APIs, with their official clients: same model-agnostic checks (greedy stream
    // equals the whole answer, stops, limits, errors in each API's shape).
    let root = format!("http://127.0.0.1:{API_PORT}");
    let out = node.python(
        &repo_file("gateway/tests/anthropic_client.py"),
        &[&root, "default"],
        Duration::from_secs(300),
    );
    eprintln!("anthropic: {}", json_line(&out, "anthropic"));
    eprintln!("forced tool_use: {}", json_line(&out, "forced_tool_use"));
    let out = node.python(
        &repo_file("gateway/tests/ollama_client.py"),
        &[&root, "default"],
        Duration::from_secs(300),
    );
    eprintln!("ollama: {}", json_line(&out, "ollama"));
    let out = node.python(
        &repo_file("gateway/tests/responses_client.py"),
        &[&url, "default"],
        Duration::from_secs(300),
    );
    eprintln!("responses: {}", json_line(&out, "responses"));

    // 32 concurrent streams on one instance: all complete (queued, none lost or hung).
    let out = node.python(
        &checks,
        &[&url, "default", "load", "32", "8"],
        Duration::from_secs(400),
    );
    let load = json_line(&out, "ttft");
    let ttft: Vec<f64> = load["ttft"]
        .as_array()
        .expect("ttft list")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert_eq!(ttft.len(), 32);
    eprintln!(
        "32 concurrent streams, 8 tokens each: time to first token min {:.2} s, p50 {:.2} s, \
         p90 {:.2} s, max {:.2} s; all done in {:.1} s",
        ttft[0],
        percentile(&ttft, 0.5),
        percentile(&ttft, 0.9),
        ttft[ttft.len() - 1],
        load["wall"].as_f64().unwrap_or(0.0)
    );

    // The runner dies mid-stream: the client gets an error within seconds, then 503s.
    node.python(
        &checks,
        &[&url, "default", "lost", &runner_pid.to_string()],
        minute,
    );
    let state = node.get_json("/state").expect("GET /state after the loss");
    let runner = &state["instances"][instance_id.as_str()]["runners"][node_id.as_str().unwrap()];
    assert_eq!(runner["state"], "failed", "{state}");
}

/// POSTs `body` to `path`, expecting a 2xx JSON answer.
fn post(node: &Node, path: &str, body: &Value) -> Value {
    node.node
        .api
        .run(Duration::from_secs(120), |api| {
            api.json(kit::client::Method::POST, path, Some(body))
        })
        .unwrap_or_else(|e| panic!("POST {path}: {}\nnode log:\n{}", e.message, node.log_tail()))
}

/// The prompt cache end to end: a request repeating a long system prompt reuses the first
/// one's state, says so in each API's usage, and answers as the first did.
fn prompt_cache_reports_cached_tokens(node: &Node) {
    let system = "You are a careful assistant for a museum of maritime history. ".repeat(30);
    let question = "What is the capital of France? Answer in one word.";
    let chat = serde_json::json!({
        "model": "default",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": 8,
        "temperature": 0,
    });
    let first = post(node, "/v1/chat/completions", &chat);
    let second = post(node, "/v1/chat/completions", &chat);
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let content = |v: &Value| v["choices"][0]["message"]["content"].clone();
    assert!(prompt > 300, "{first}");
    assert_eq!(
        cached(&second),
        Some(prompt - 1),
        "the repeated prompt came from the cache, all but its last token: {second}"
    );
    assert_eq!(
        content(&second),
        content(&first),
        "same answer with the cache"
    );
    eprintln!(
        "prompt cache: {} of {prompt} prompt tokens cached, answer {} both times",
        prompt - 1,
        content(&second)
    );
    // Anthropic and the Responses API report it in their own words (another question, the
    // same long system prompt: at least that is cached).
    let other = "Name one colour.";
    let message = post(
        node,
        "/v1/messages",
        &serde_json::json!({
            "model": "default", "system": system, "max_tokens": 4,
            "messages": [{"role": "user", "content": other}],
        }),
    );
    let read = message["usage"]["cache_read_input_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(read > 300 && read < prompt, "{message}");
    let response = post(
        node,
        "/v1/responses",
        &serde_json::json!({
            "model": "default", "instructions": system, "input": other,
            "max_output_tokens": 4,
        }),
    );
    let details = response["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(details > 300, "{response}");
}

/// `top_logprobs` and `logit_bias` on the real engine, with the official client
/// (node_checks.py `sampling`), which names tokens by id through the fixture's vocabulary:
/// each id's text decoded alone (the lowest id where two decode the same).
fn sampling_controls(node: &Node, url: &str, checks: &Path) {
    let model = inference::loader::describe_model(&kit::dirs::default_model_path())
        .expect("read the fixture's tokenizer");
    let vocab = model.config.vocab_size;
    let mut ids = serde_json::Map::new();
    for id in (0..vocab as u32).rev() {
        if let Ok(text) = model.tokenizer.decode(&[id], false) {
            ids.insert(text, id.into());
        }
    }
    let file = node.node.data_dir.with_extension("vocab.json");
    std::fs::write(&file, Value::Object(ids).to_string()).expect("write the vocabulary");
    let out = node.python(
        checks,
        &[
            url,
            "default",
            "sampling",
            &file.display().to_string(),
            &vocab.to_string(),
        ],
        Duration::from_secs(300),
    );
    let _ = std::fs::remove_file(&file);
    eprintln!("sampling controls: {}", json_line(&out, "forced"));
}

/// `VmHWM` (peak resident set) of process `pid`, in bytes.
fn peak_rss_bytes(pid: u64) -> Option<u64> {
    rss_bytes(pid, "VmHWM:")
}

/// The `/proc/PID/status` line `field` (a size in kB) of process `pid`, in bytes.
fn rss_bytes(pid: u64, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Limits that say what they do: a node batching at most 4 requests with 8 more waiting
/// takes 64 concurrent streams; each completes or is refused with 429 and `Retry-After` in
/// OpenAI's error shape, none hangs, the runner's peak memory stays within what placement
/// counts for the instance, and the runner is ready again afterwards; then SIGTERM stops the
/// node cleanly (exit 0, runner gone, no error logged).
#[test]
fn sixty_four_streams_against_small_limits_complete_or_get_429() {
    let Some(mut node) = Node::start("limits", &["--max-sequences", "4", "--max-queue", "8"])
    else {
        return;
    };
    node.wait_ready(Duration::from_secs(240));
    let url = node.base_url();
    let checks = repo_file("tests/node_checks.py");
    let out = node.python(
        &checks,
        &[&url, "default", "limit", "64", "16"],
        Duration::from_secs(400),
    );
    let counts = json_line(&out, "completed");
    let (done, refused) = (
        counts["completed"].as_u64().unwrap_or(0),
        counts["refused"].as_u64().unwrap_or(0),
    );
    eprintln!("64 streams against 4 + 8: {done} completed, {refused} refused with 429");
    assert_eq!(done + refused, 64, "{counts}");
    assert!(
        done >= 12,
        "at least the batch and its queue are served: {counts}"
    );
    assert!(refused >= 1, "64 at once exceed 4 + 8: {counts}");
    // Memory that placement counts is memory the runner holds: its peak resident set after
    // 64 streams is within the instance's count (weights as they run, KV budget, overhead).
    let state = node.get_json("/state").expect("GET /state");
    let instance = state["instances"]
        .as_object()
        .and_then(|m| m.values().next())
        .expect("one instance");
    let pid = instance["runner_pid"].as_u64().expect("runner pid");
    let peak = peak_rss_bytes(pid).expect("the runner's VmHWM");
    let opened =
        inference::loader::open_model(&kit::dirs::default_model_path()).expect("open the fixture");
    let counted = inference::memory::InstanceMemory::of(&opened.config, opened.bytes_on_disk)
        .total()
        .max(opened.bytes_on_disk);
    eprintln!(
        "runner peak RSS {} MiB, placement counts {} MiB",
        peak >> 20,
        counted >> 20
    );
    assert!(
        peak <= counted,
        "the runner's peak RSS ({peak} bytes) exceeds what placement counts ({counted})"
    );
    // Nothing is left over: the instance takes requests again.
    node.python(
        &checks,
        &[&url, "default", "paris"],
        Duration::from_secs(60),
    );
    // Finished requests are kept by the prompt cache at the size of their positions (about
    // 60 of them, 2.6 MiB here), not with a growth step's room (256 positions, 11.25 MiB):
    // twenty more distinct chats grow the runner by far less than twenty steps.
    let before = rss_bytes(pid, "VmRSS:").expect("the runner's VmRSS");
    node.python(
        &checks,
        &[&url, "default", "distinct", "20"],
        Duration::from_secs(240),
    );
    let after = rss_bytes(pid, "VmRSS:").expect("the runner's VmRSS");
    let grown = after.saturating_sub(before);
    eprintln!("20 distinct chats grew the runner by {} MiB", grown >> 20);
    assert!(
        grown < 20 * (5 << 20),
        "20 distinct chats grew the runner by {grown} bytes: finished caches keep spare room"
    );
    node.stop_as_an_operator_would(pid);
}
