//! A cancelled chat stops in the runner, not only at the client: two real nodes in network
//! namespaces, the SmolLM2 fixture placed on node A alone with one sequence at a time
//! (`SHOAL_MAX_SEQUENCES=1`), node B forwarding its chats to A. A long greedy stream (2000
//! tokens, end-of-text ignored: about two minutes here) is started and, once tokens flow,
//! stopped four ways:
//! `POST /v1/cancel/{id}` and the client going away, each on A (local) and through B
//! (forwarded). After each:
//!
//! - the stream ends at once (the cancelled stream with a finish and `[DONE]`);
//! - A's runner process stops computing: its CPU time grows by less than
//!   [`IDLE_CPU`] over [`IDLE_WINDOW`], where it grew by more than [`BUSY_CPU`] while it
//!   generated;
//! - its one slot is free: a new short chat answers within [`SLOT_FREE`], where a slot still
//!   held would make it wait for the rest of the 2000 tokens.
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;

use kit::blocking::Next;
use kit::sse::SseEvent;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::netns::Spec;
use support::{call, default_ready, logs, runner_pids, wait_for, ShoalNode, TestNet};

/// CPU time (seconds) A's runner may use, idle, over [`IDLE_WINDOW`].
const IDLE_CPU: f64 = 0.2;
/// How long the runner is watched once a stream was stopped.
const IDLE_WINDOW: Duration = Duration::from_secs(2);
/// CPU time (seconds) the runner uses at least over [`IDLE_WINDOW`] while it generates.
const BUSY_CPU: f64 = 0.5;
/// Within this a new chat must answer once a stream was stopped.
const SLOT_FREE: Duration = Duration::from_secs(15);

/// CPU time (user + system, seconds) process `pid` has used so far.
fn cpu_seconds(pid: u64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the runner's stat");
    // Fields after the command (which is in parentheses): state is field 3, utime 14, stime 15.
    let after = &stat[stat.rfind(')').expect("stat's command") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf only reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / per_second
}

/// CPU seconds `pid` uses over [`IDLE_WINDOW`] from now.
fn cpu_over_window(pid: u64) -> f64 {
    let before = cpu_seconds(pid);
    std::thread::sleep(IDLE_WINDOW);
    cpu_seconds(pid) - before
}

/// How a long stream is stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// `POST /v1/cancel/{id}` on the node the client talks to.
    Cancel,
    /// The client drops the connection.
    GoAway,
}

/// Starts a long stream through `client`, waits for tokens, checks the runner `pid` is busy,
/// stops the stream `how`, and checks the runner goes idle and its slot is free.
fn stop_and_check(client: &ShoalNode, pid: u64, how: Stop, nodes: &[ShoalNode]) {
    let request = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}],
        "temperature": 0,
        "max_tokens": 2000,
        // It must not end on its own while the test watches (about two minutes here).
        "ignore_eos": true,
        "stream": true,
    });
    let mut stream = client
        .api
        .chat_stream(&request, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{how:?}: the stream did not start: {e}\n{}", logs(nodes)));
    let mut id = String::new();
    let mut text = String::new();
    while text.len() < 12 {
        match stream.next(Duration::from_secs(60)) {
            Next::Event(SseEvent::Data(data)) => {
                let event: Value = serde_json::from_str(&data).unwrap_or_default();
                id = event["id"].as_str().unwrap_or_default().to_string();
                text.push_str(
                    event["choices"][0]["delta"]["content"]
                        .as_str()
                        .unwrap_or(""),
                );
            }
            other => panic!(
                "{how:?}: no tokens ({other:?}) after {text:?}\n{}",
                logs(nodes)
            ),
        }
    }
    let busy = cpu_over_window(pid);
    assert!(
        busy > BUSY_CPU,
        "{how:?}: the runner used only {busy:.2} CPU s in {IDLE_WINDOW:?} while generating"
    );
    let stopped = Instant::now();
    match how {
        Stop::Cancel => {
            let (status, answer) = call(client, "POST", &format!("/v1/cancel/{id}"), None);
            assert_eq!(status, 200, "{how:?}: cancel {id}: {answer}");
            // The stream ends at once, with a finish and [DONE].
            let mut ended = false;
            while let Next::Event(event) = stream.next(Duration::from_secs(10)) {
                if event == SseEvent::Done {
                    ended = true;
                    break;
                }
            }
            assert!(
                ended,
                "{how:?}: the cancelled stream did not end with [DONE]"
            );
        }
        Stop::GoAway => drop(stream),
    }
    // Give the stop a moment to travel (node, forward, runner), then watch the runner.
    std::thread::sleep(Duration::from_millis(500));
    let idle = cpu_over_window(pid);
    // The slot: a short chat answers now, not after the rest of the 2000 tokens.
    let asked = Instant::now();
    let (status, answer) = call(
        client,
        "POST",
        "/v1/chat/completions",
        Some(&json!({
            "model": "default",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": 12,
        })),
    );
    let answered = asked.elapsed();
    eprintln!(
        "{how:?} through node {}: runner CPU {busy:.2} s per {IDLE_WINDOW:?} generating, \
         {idle:.2} s after the stop; next chat answered in {answered:.1?} ({:.1?} after the stop)",
        client.node.ip(),
        stopped.elapsed()
    );
    assert!(
        idle < IDLE_CPU,
        "{how:?}: the runner still computes after the stop: {idle:.2} CPU s in {IDLE_WINDOW:?}\n{}",
        logs(nodes)
    );
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        status == 200 && text.contains("Paris") && answered < SLOT_FREE,
        "{how:?}: the next chat took {answered:?}: {status} {answer}"
    );
}

#[test]
fn a_stopped_stream_stops_in_the_runner_locally_and_forwarded() {
    let Some((test_net, mut nodes)) = TestNet::create(
        "shoalcx",
        &Spec {
            nodes: 2,
            ..Spec::default()
        },
    ) else {
        return;
    };
    for node in &mut nodes {
        node.env.push(("SHOAL_MAX_SEQUENCES".into(), "1".into()));
        node.start();
    }
    let (a_id, _) = wait_for(Duration::from_secs(30), || {
        let (status, id) = call(&nodes[0], "GET", "/node_id", None);
        (status == 200).then(|| id.as_str().unwrap_or_default().to_string())
    })
    .unwrap_or_else(|| panic!("node A does not answer\n{}", logs(&nodes)));
    let body = json!({"instance": {"model_id": "default", "required_nodes": [a_id]}});
    wait_for(Duration::from_secs(90), || {
        let (status, _) = call(&nodes[0], "POST", "/instance", Some(&body));
        (status == 200).then_some(())
    })
    .unwrap_or_else(|| panic!("no instance on A\n{}", logs(&nodes)));
    wait_for(Duration::from_secs(180), || {
        nodes.iter().all(default_ready).then_some(())
    })
    .unwrap_or_else(|| panic!("the instance is not ready on both nodes\n{}", logs(&nodes)));
    let runners = runner_pids(&nodes[0].node.netns);
    assert_eq!(runners.len(), 1, "A's runners: {runners:?}");
    assert!(
        runner_pids(&nodes[1].node.netns).is_empty(),
        "B runs a runner"
    );
    let pid = runners[0];
    // One sequence at a time in the runner: a slot still held would hold up the next chat.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("the runner's environ");
    let one_slot = format!("{}=1", inference::batch::MAX_SEQUENCES_ENV);
    assert!(
        environ.split(|b| *b == 0).any(|v| v == one_slot.as_bytes()),
        "the runner was not started with {one_slot}"
    );

    for (client, how) in [
        (0, Stop::Cancel),
        (0, Stop::GoAway),
        (1, Stop::Cancel),
        (1, Stop::GoAway),
    ] {
        stop_and_check(&nodes[client], pid, how, &nodes);
    }
    assert_eq!(
        runner_pids(&nodes[0].node.netns),
        vec![pid],
        "A's runner changed"
    );
    test_net.teardown(nodes);
}
