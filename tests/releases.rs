//! Releases across a cluster, with real nodes in namespaces and two builds of the binary that
//! differ only in their release: a copy of this test's `shoal` whose build stamp (the one
//! string every part of the binary reads its release from, `node/src/release.rs`) is rewritten in
//! place, byte for byte the same length.
//!
//! - A node whose protocol differs is refused: both nodes log the refusal naming both
//!   releases, and neither counts the other in its cluster.
//! - A rolling upgrade where the protocol is unchanged, one node at a time: while a chat loop
//!   runs through one node, the other is stopped and started again as a newer release; the
//!   loop never fails, the upgraded node rejoins, `/state` shows each node's release, and it
//!   answers chats (by forwarding to the older node's instance, the first time); then the
//!   other way round, until both run the newer release.

mod support;

use mesh::net::release::PROTOCOL;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::netns::Spec;
use support::{call, shoal_bin, wait_for, ShoalNode, TestNet};

/// The stamp of a release.
fn stamp(version: &str, protocol: u32) -> String {
    format!("shoal-build;version={version};protocol={protocol};")
}

/// A copy of this test's `shoal` under `dir` whose stamp says `version` and `protocol`
/// (the same lengths as this build's), checked with `--version`.
fn build_of(dir: &Path, version: &str, protocol: u32) -> PathBuf {
    let ours = stamp(env!("CARGO_PKG_VERSION"), PROTOCOL);
    let theirs = stamp(version, protocol);
    assert_eq!(ours.len(), theirs.len(), "{ours} vs {theirs}");
    let mut bytes = std::fs::read(shoal_bin()).unwrap();
    let at: Vec<usize> = bytes
        .windows(ours.len())
        .enumerate()
        .filter(|(_, w)| *w == ours.as_bytes())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "the binary holds its stamp once: {at:?}");
    bytes[at[0]..at[0] + theirs.len()].copy_from_slice(theirs.as_bytes());
    let path = dir.join(format!("shoal-{version}-p{protocol}"));
    std::fs::write(&path, bytes).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(&path)
        .arg("--version")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        printed.trim(),
        format!("shoal {version} (protocol {protocol})"),
        "{printed}"
    );
    path
}

/// The release `state` (one node's `/state`) shows for node `id`, as `version (protocol)`.
fn release_in(state: &Value, id: &str) -> Option<String> {
    let profile = &state["nodes"][id]["records"]["profile"];
    let profile = match profile {
        Value::String(text) => serde_json::from_str(text).ok()?,
        other => other.clone(),
    };
    let version = profile["version"].as_str().filter(|v| !v.is_empty())?;
    Some(format!("{version} ({})", profile["protocol"]))
}

/// The other node ids `node` holds alive.
fn others_alive(node: &ShoalNode) -> Option<Vec<String>> {
    let state = node.state()?;
    let me = kit::state_view::node_id(&state);
    Some(
        kit::state_view::alive_nodes(&state)
            .into_iter()
            .filter(|id| *id != me)
            .collect(),
    )
}

#[test]
fn a_node_of_another_protocol_is_refused_naming_both_releases() {
    let Some((net, mut nodes)) = TestNet::create(
        "verx",
        &Spec {
            nodes: 2,
            ..Spec::default()
        },
    ) else {
        return;
    };
    let other = PROTOCOL + 1;
    let version = env!("CARGO_PKG_VERSION");
    nodes[1].binary = build_of(&net.dir, version, other);
    for node in nodes.iter_mut() {
        node.start();
    }
    let ours = format!("shoal {version} (protocol {PROTOCOL})");
    let theirs = format!("shoal {version} (protocol {other})");
    let names_both = |log: &str| {
        log.lines()
            .any(|l| l.contains(&ours) && l.contains(&theirs) && l.contains("ERROR"))
    };
    let whole_log = |node: &ShoalNode| std::fs::read_to_string(&node.log).unwrap_or_default();
    let logged = wait_for(Duration::from_secs(60), || {
        (names_both(&whole_log(&nodes[0])) && names_both(&whole_log(&nodes[1]))).then_some(())
    });
    let logs = || format!("{}\n---\n{}", nodes[0].log_tail(), nodes[1].log_tail());
    assert!(
        logged.is_some(),
        "both nodes must log the refusal\n{}",
        logs()
    );
    // Several more rounds of discovery: still apart.
    std::thread::sleep(Duration::from_secs(8));
    for node in &nodes {
        assert_eq!(others_alive(node), Some(vec![]), "{}", logs());
    }
    let line = whole_log(&nodes[0])
        .lines()
        .find(|l| names_both(l))
        .unwrap_or_default()
        .to_string();
    assert!(line.contains("run the same shoal release"), "{line}");
    eprintln!("refusal: {line}");
    net.teardown(nodes);
}

/// One greedy chat through `node`; its text.
fn chat(node: &ShoalNode) -> Result<String, String> {
    let (status, answer) = call(
        node,
        "POST",
        "/v1/chat/completions",
        Some(
            &json!({"model": "default", "temperature": 0, "max_tokens": 8,
                     "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
        ),
    );
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (status == 200 && text.contains("Paris"))
        .then_some(text)
        .ok_or_else(|| format!("{status} {answer}"))
}

/// Stops `node` and starts `binary` on its data directory (the same identity).
fn upgrade(node: &mut ShoalNode, binary: &Path) {
    node.stop(Duration::from_secs(10));
    node.binary = binary.to_path_buf();
    node.start();
}

/// Chats through one node, one after another, until finished.
struct ChatLoop {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>)>,
}

fn chat_loop(api: kit::client::Api) -> ChatLoop {
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let api = kit::blocking::Blocking::new(api);
            let (mut ok, mut failed) = (0usize, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let answer = api.call(
                    "POST".parse().unwrap(),
                    "/v1/chat/completions",
                    Some(&json!({"model": "default", "temperature": 0, "max_tokens": 8,
                                 "messages": [{"role": "user", "content": "What is the capital of France?"}]})),
                    Duration::from_secs(30),
                );
                match answer {
                    Ok(a) if a.status.as_u16() == 200 => ok += 1,
                    Ok(a) => failed.push(format!("{} {}", a.status, a.value())),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (ok, failed)
        })
    };
    ChatLoop { stop, thread }
}

impl ChatLoop {
    /// Stops the loop and checks it answered every chat (`what` names it, `logs` on failure).
    fn finish(self, what: &str, logs: &str) {
        self.stop.store(true, Ordering::Relaxed);
        let (ok, failed) = self.thread.join().unwrap();
        eprintln!(
            "chat loop through {what}: {ok} answered, {} failed",
            failed.len()
        );
        assert!(ok >= 3, "the loop through {what} answered {ok} chats");
        assert!(
            failed.is_empty(),
            "chats through {what} failed: {failed:?}\n{logs}"
        );
    }
}

#[test]
fn a_rolling_upgrade_keeps_answering() {
    if !support::default_model_present() {
        return;
    }
    let Some((net, mut nodes)) = TestNet::create(
        "upgr",
        &Spec {
            nodes: 2,
            ..Spec::default()
        },
    ) else {
        return;
    };
    let version = env!("CARGO_PKG_VERSION");
    // A newer release of the same length that speaks the same protocol.
    let newer: String = version
        .chars()
        .rev()
        .enumerate()
        .map(|(i, c)| match (i, c.to_digit(10)) {
            (0, Some(d)) => char::from_digit((d + 1) % 10, 10).unwrap_or(c),
            _ => c,
        })
        .collect::<String>()
        .chars()
        .rev()
        .collect();
    let upgraded = build_of(&net.dir, &newer, PROTOCOL);
    for node in nodes.iter_mut() {
        node.start();
    }
    let logs =
        |nodes: &[ShoalNode]| format!("{}\n---\n{}", nodes[0].log_tail(), nodes[1].log_tail());
    let met = wait_for(Duration::from_secs(60), || {
        let a = others_alive(&nodes[0])?;
        let b = others_alive(&nodes[1])?;
        (a.len() == 1 && b.len() == 1).then(|| (b[0].clone(), a[0].clone()))
    });
    let Some(((id_a, id_b), _)) = met else {
        panic!("the nodes did not meet\n{}", logs(&nodes));
    };
    let (status, created) = call(
        &nodes[0],
        "POST",
        "/instance",
        Some(&json!({"instance": {"model_id": "default", "required_nodes": [id_a]}})),
    );
    assert_eq!(status, 200, "{created}\n{}", logs(&nodes));
    let ready = wait_for(Duration::from_secs(180), || chat(&nodes[0]).ok());
    assert!(ready.is_some(), "no answer through A\n{}", logs(&nodes));

    // Upgrade B while a chat loop runs through A (whose instance serves it).
    let looper = chat_loop(nodes[0].new_api());
    std::thread::sleep(Duration::from_secs(2));
    upgrade(&mut nodes[1], &upgraded);
    let rejoined = wait_for(Duration::from_secs(60), || {
        let state = nodes[0].state()?;
        let b = release_in(&state, &id_b)?;
        let a = release_in(&state, &id_a)?;
        let alive = kit::state_view::is_alive(&state, &id_b) == Some(true);
        (alive && b == format!("{newer} ({PROTOCOL})")).then_some((a, b))
    });
    let Some(((release_a, release_b), took)) = rejoined else {
        panic!(
            "the upgraded node did not rejoin with its release\n{}",
            logs(&nodes)
        );
    };
    eprintln!("B rejoined as {release_b} in {took:?}; A is {release_a}");
    assert_eq!(release_a, format!("{version} ({PROTOCOL})"));
    // The upgraded node answers, forwarding to the older node's instance.
    let forwarded = wait_for(Duration::from_secs(60), || chat(&nodes[1]).ok());
    assert!(
        forwarded.is_some(),
        "no answer through the upgraded node\n{}",
        logs(&nodes)
    );
    std::thread::sleep(Duration::from_secs(2));
    looper.finish("A, while B was upgraded", &logs(&nodes));

    // Then A: an instance on the upgraded B serves a loop through B while A is upgraded.
    let (status, created) = call(
        &nodes[1],
        "POST",
        "/instance",
        Some(&json!({"instance": {"model_id": "default", "required_nodes": [id_b]}})),
    );
    assert_eq!(status, 200, "{created}\n{}", logs(&nodes));
    let on_b = created["instance_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ready = wait_for(Duration::from_secs(180), || {
        let (_, info) = call(&nodes[1], "GET", &format!("/instance/{on_b}"), None);
        (info["status"] == "ready").then_some(())
    });
    assert!(
        ready.is_some(),
        "B's instance never became ready\n{}",
        logs(&nodes)
    );
    let looper = chat_loop(nodes[1].new_api());
    std::thread::sleep(Duration::from_secs(2));
    upgrade(&mut nodes[0], &upgraded);
    let both = wait_for(Duration::from_secs(60), || {
        let state = nodes[1].state()?;
        let want = format!("{newer} ({PROTOCOL})");
        let alive = kit::state_view::is_alive(&state, &id_a) == Some(true);
        (alive && release_in(&state, &id_a)? == want && release_in(&state, &id_b)? == want)
            .then_some(())
    });
    assert!(
        both.is_some(),
        "A did not rejoin upgraded\n{}",
        logs(&nodes)
    );
    assert!(
        chat(&nodes[0]).is_ok(),
        "no answer through the upgraded A\n{}",
        logs(&nodes)
    );
    std::thread::sleep(Duration::from_secs(2));
    looper.finish("B, while A was upgraded", &logs(&nodes));
    net.teardown(nodes);
}
