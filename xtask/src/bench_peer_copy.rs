//! `cargo xtask bench peer-copy [--repeat 3] [--release]`: a peer copy of the SmolLM2
//! fixture's weight files between two shoal nodes against a plain TCP copy of the same bytes
//! over the same link, printed side by side, alternating.
//!
//! Two nodes in two network namespaces on one bridge: A holds the model (fetched once from
//! the test hub, which then stops), B starts each peer round with an empty cache, an instance
//! is placed on B alone, and B copies every file from A over iroh (QUIC, hashed against the
//! hub's sha256 as it arrives, written into B's Hugging Face cache). The figure is B's own
//! measure in its download record (`transfer_s`: from the end of the settle wait to the last
//! weight file verified), for the weight files' bytes. The TCP round sends the same three files
//! from A's namespace to B's over one TCP connection (Python's `socket.sendfile`, the receiver
//! writing to a file), timed by the receiver from accept to end of stream.

use crate::bench_download::{build, fixture, REPO};
use kit::blocking::Blocking;
use kit::client::{Api, Method};
use kit::netns::{Netns, Node, Spec};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const API_PORT: u16 = 52415;
const TCP_PORT: u16 = 9300;

const TCP_RECEIVE: &str = r#"
import socket, sys, time
ip, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((ip, port))
srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
start = time.perf_counter()
buf = bytearray(1 << 20)
view = memoryview(buf)
n = 0
with open(out, "wb") as f:
    while True:
        k = conn.recv_into(buf)
        if not k:
            break
        f.write(view[:k])
        n += k
print(n, time.perf_counter() - start, flush=True)
"#;

const TCP_SEND: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
for path in sys.argv[3:]:
    with open(path, "rb") as f:
        s.sendfile(f)
s.shutdown(socket.SHUT_WR)
s.close()
"#;

/// A `shoal` node in a namespace; killed on drop.
struct NodeProc {
    child: Child,
    api: Blocking,
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_node(
    shoal: &Path,
    node: &Node,
    data: &Path,
    cache: &Path,
    endpoint: &str,
    log: &Path,
) -> Result<NodeProc, String> {
    let log = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let child = node
        .command(&shoal.to_string_lossy())
        .args(["--api-port", &API_PORT.to_string(), "--data-dir"])
        .arg(data)
        .env("HF_HUB_CACHE", cache)
        .env("HF_ENDPOINT", endpoint)
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting shoal: {e}"))?;
    let api = Blocking::new(Api::at((node.ip(), API_PORT).into()).in_netns(&node.netns));
    Ok(NodeProc { child, api })
}

fn call(node: &NodeProc, method: Method, path: &str, body: Option<&Value>) -> Option<Value> {
    let answer = node
        .api
        .call(method, path, body, Duration::from_secs(30))
        .ok()?;
    answer.status.is_success().then(|| answer.value())
}

fn wait<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> Result<T, String> {
    let start = Instant::now();
    loop {
        crate::testbed::check_interrupt()?;
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(format!("{what}: not within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One peer round: B (fresh cache) copies the model from A; B's measure of the weights' copy.
fn peer_round(
    shoal: &Path,
    b: &Node,
    scratch: &Path,
    run: usize,
    a_id: &str,
    endpoint: &str,
) -> Result<f64, String> {
    let cache = scratch.join(format!("b-cache{run}"));
    let node = start_node(
        shoal,
        b,
        &scratch.join("b-data"),
        &cache,
        endpoint,
        &scratch.join(format!("b{run}.log")),
    )?;
    let me = wait(Duration::from_secs(30), "B answers", || {
        call(&node, Method::GET, "/node_id", None)?
            .as_str()
            .map(str::to_owned)
    })?;
    // B must see A's holding record before it asks (else it would ask the hub, which is gone).
    let holding = format!("files/{REPO}");
    wait(Duration::from_secs(60), "B sees A's files", || {
        let state = call(&node, Method::GET, "/state", None)?;
        state["nodes"][a_id]["records"].get(&holding).map(|_| ())
    })?;
    let created = call(
        &node,
        Method::POST,
        "/instance",
        Some(&json!({"instance": {"model_id": REPO, "required_nodes": [me]}})),
    )
    .ok_or("placing the model on B failed")?;
    let instance = created["instance_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let prefix = format!("download/{REPO}/layers");
    let record = wait(Duration::from_secs(300), "B's copy completes", || {
        let state = call(&node, Method::GET, "/state", None)?;
        let records = state["nodes"][&me]["records"].as_object()?.clone();
        let (_, r) = records.into_iter().find(|(k, _)| k.starts_with(&prefix))?;
        match r["state"].as_str()? {
            "complete" => Some(Ok(r)),
            "failed" => Some(Err(format!("B's download failed: {r}"))),
            _ => None,
        }
    })??;
    let _ = call(
        &node,
        Method::DELETE,
        &format!("/instance/{instance}"),
        None,
    );
    drop(node);
    let _ = std::fs::remove_dir_all(&cache);
    record["transfer_s"]
        .as_f64()
        .ok_or_else(|| format!("no transfer_s in B's record: {record}"))
}

/// One TCP round: the weight files from A's namespace to B's over one connection.
fn tcp_round(a: &Node, b: &Node, files: &[PathBuf], scratch: &Path) -> Result<f64, String> {
    let python = kit::dirs::venv_python();
    let out = scratch.join("tcp.out");
    let mut receiver = b
        .command(&python.to_string_lossy())
        .args([
            "-c",
            TCP_RECEIVE,
            &b.ip().to_string(),
            &TCP_PORT.to_string(),
        ])
        .arg(&out)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("TCP receiver: {e}"))?;
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(
        receiver.stdout.take().expect("piped"),
    ));
    let ready = lines.next().and_then(Result::ok);
    if ready.as_deref() != Some("ready") {
        let _ = receiver.kill();
        return Err(format!("the TCP receiver did not start ({ready:?})"));
    }
    let sent = a
        .command(&python.to_string_lossy())
        .args(["-c", TCP_SEND, &b.ip().to_string(), &TCP_PORT.to_string()])
        .args(files)
        .status()
        .map_err(|e| format!("TCP sender: {e}"))?;
    let result = lines.next().and_then(Result::ok).unwrap_or_default();
    let _ = receiver.wait();
    let _ = std::fs::remove_file(&out);
    if !sent.success() {
        return Err("the TCP sender failed".into());
    }
    let mut fields = result.split_whitespace();
    let bytes: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let want: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    if bytes != want {
        return Err(format!("the TCP copy moved {bytes} bytes, not {want}"));
    }
    fields
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("the TCP receiver printed {result:?}"))
}

/// `cargo xtask bench peer-copy`.
pub fn bench_peer_copy(args: &[String]) -> Result<(), String> {
    let mut repeat = 3;
    let mut release = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--repeat" => {
                repeat = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--repeat needs a number")?
            }
            "--release" => release = true,
            other => return Err(format!("bench peer-copy: unknown flag {other}")),
        }
    }
    kit::netns::available()?;
    crate::testbed::catch_ctrl_c()?;
    let repo = fixture()?;
    let weights: Vec<PathBuf> = {
        let mut w: Vec<PathBuf> = std::fs::read_dir(&repo)
            .map_err(|e| e.to_string())?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        w.sort();
        w
    };
    let weight_bytes: u64 = weights
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let (shoal, test_hub) = build(release)?;
    let prefix = format!("bpc{}", std::process::id());
    let net = Netns::create(
        &prefix,
        &Spec {
            nodes: 3,
            ..Spec::default()
        },
    )?;
    let (hub_ns, a, b) = (&net.nodes[0], &net.nodes[1], &net.nodes[2]);
    let endpoint = format!("http://{}:8080", hub_ns.ip());
    let scratch = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let result = (|| {
        // A fetches the model from the test hub once; the hub then stops for good.
        let a_cache = scratch.join("a-cache");
        let mut server = hub_ns
            .command(&test_hub.to_string_lossy())
            .args([
                "serve",
                &format!("{}:8080", hub_ns.ip()),
                &format!("{}:8081", hub_ns.ip()),
            ])
            .arg(format!("{REPO}={}", repo.display()))
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the test hub: {e}"))?;
        if let Some(out) = server.stdout.take() {
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
        }
        let fetched = a
            .command(&shoal.to_string_lossy())
            .args(["download", "--quiet", REPO])
            .env("HF_ENDPOINT", &endpoint)
            .env("HF_HUB_CACHE", &a_cache)
            .status();
        let _ = server.kill();
        let _ = server.wait();
        if !fetched.is_ok_and(|s| s.success()) {
            return Err("A's download from the test hub failed".to_string());
        }
        let node_a = start_node(
            &shoal,
            a,
            &scratch.join("a-data"),
            &a_cache,
            &endpoint,
            &scratch.join("a.log"),
        )?;
        let a_id = wait(Duration::from_secs(30), "A answers", || {
            call(&node_a, Method::GET, "/node_id", None)?
                .as_str()
                .map(str::to_owned)
        })?;
        let mut rows = Vec::new();
        for run in 1..=repeat {
            let p = peer_round(&shoal, b, &scratch, run, &a_id, &endpoint)?;
            let t = tcp_round(a, b, &weights, &scratch)?;
            eprintln!("round {run}: peer copy {p:.2} s, TCP {t:.2} s");
            rows.push((p, t));
        }
        drop(node_a);
        Ok(rows)
    })();
    drop(net);
    let _ = std::fs::remove_dir_all(&scratch);
    let rows = result?;
    let mb = weight_bytes as f64 / 1e6;
    println!(
        "peer copy of {REPO}'s {} weight files ({mb:.1} MB) between two namespaces on one \
         bridge ({}), vs plain TCP of the same bytes over the same link:",
        weights.len(),
        if release { "release" } else { "debug" }
    );
    println!(
        "{:>6}  {:>20}  {:>20}  {:>6}",
        "run", "shoal peer copy", "plain TCP", "ratio"
    );
    let line = |label: &str, p: f64, t: f64| {
        println!(
            "{label:>6}  {:>7.2} s {:>7.0} MB/s  {:>7.2} s {:>7.0} MB/s  {:>5.2}x",
            p,
            mb / p.max(1e-9),
            t,
            mb / t.max(1e-9),
            t / p.max(1e-9)
        )
    };
    for (i, &(p, t)) in rows.iter().enumerate() {
        line(&(i + 1).to_string(), p, t);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p, t) = (
        median(rows.iter().map(|r| r.0).collect()),
        median(rows.iter().map(|r| r.1).collect()),
    );
    line("median", p, t);
    println!("(ratio = TCP time / peer-copy time; goal >= 0.5x)");
    Ok(())
}
