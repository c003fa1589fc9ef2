//! A rank that hangs without closing its sockets: three real `shoal` nodes in Linux network
//! namespaces run the SmolLM2 fixture as a 3-rank pipeline under a few streaming chats, and
//! the middle rank's runner is frozen (SIGSTOP). MLX's ring waits forever on a peer that
//! keeps its connection open, so only the per-step deadline can end it. The nodes run with
//! its default (60 s: `--step-timeout` is not given, so the deadline a user gets is the one
//! tested): every stream must end with an error event and `[DONE]` no sooner than the
//! deadline (nothing else ended it) and within the deadline plus 20 s, the instance must be placed again (epoch 1) and answer "Paris", and the frozen
//! runner must be gone (killed by its node when the ring it belonged to was replaced).
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;

use kit::blocking::{BlockingStream, Next};
use kit::sse::SseEvent;
use serde_json::json;
use std::time::{Duration, Instant};
use support::{call, logs, process_ended, signal, three_rank_pipeline, wait_for, ShoalNode};

/// The step deadline the nodes run with: the default.
const STEP_TIMEOUT_S: u64 = runners::DEFAULT_STEP_TIMEOUT_S as u64;

/// Streams that run when the rank freezes.
const STREAMS: usize = 3;

fn paris(node: &ShoalNode) -> String {
    let request = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 16,
    });
    let (status, answer) = call(node, "POST", "/v1/chat/completions", Some(&request));
    assert_eq!(status, 200, "{answer}\n{}", node.log_tail());
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A long streaming chat, read until its first chunk.
fn started<'a>(node: &'a ShoalNode, n: usize, all: &[ShoalNode]) -> BlockingStream<'a> {
    let request = json!({
        "model": "default",
        "messages": [{"role": "user", "content": format!("Count from {n} to 1000, separated by commas.")}],
        "temperature": 0,
        "max_tokens": 2000,
        "stream": true,
    });
    let mut stream = node
        .api
        .chat_stream(&request, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("stream {n} did not start: {e}\n{}", logs(all)));
    let begun = Instant::now();
    loop {
        match stream.next(Duration::from_secs(60).saturating_sub(begun.elapsed())) {
            Next::Event(SseEvent::Data(data)) if data.contains("chat.completion.chunk") => {
                return stream
            }
            Next::Event(SseEvent::Data(_)) => {}
            other => panic!("stream {n}: no chunk came ({other:?})\n{}", logs(all)),
        }
    }
}

/// Reads `stream` to its end: whether an error event came, and whether `[DONE]` did.
fn read_to_end(stream: &mut BlockingStream<'_>, until: Instant) -> (bool, bool, String) {
    let mut error = false;
    let mut last = String::new();
    loop {
        match stream.next(until.saturating_duration_since(Instant::now())) {
            Next::Event(SseEvent::Done) => return (error, true, last),
            Next::Event(SseEvent::Data(data)) => {
                error |= data.contains("\"error\"");
                last = data;
            }
            other => return (error, false, format!("{last} / then {other:?}")),
        }
    }
}

#[test]
fn a_frozen_rank_ends_every_stream_and_the_instance_is_placed_again() {
    let Some((test_net, nodes, created)) = three_rank_pipeline("shoalh", &[]) else {
        return;
    };
    let instance = created["instance_id"].as_str().expect("id").to_string();
    let ranks: Vec<String> = created["placement"]["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| r["node"].as_str().unwrap_or_default().to_string())
        .collect();
    let before = paris(&nodes[0]);
    assert!(before.contains("Paris"), "{before}");

    // The node that runs rank 1, and its runner's pid.
    let middle = nodes
        .iter()
        .position(|n| {
            n.state()
                .is_some_and(|s| s["node_id"].as_str() == Some(ranks[1].as_str()))
        })
        .expect("rank 1's node is one of ours");
    let (_, view) = call(
        &nodes[middle],
        "GET",
        &format!("/instance/{instance}"),
        None,
    );
    let frozen = view["runner_pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("rank 1's node runs a runner: {view}"));
    // The streams go through a node other than the frozen rank's.
    let client = &nodes[(middle + 1) % nodes.len()];
    let mut streams: Vec<BlockingStream<'_>> =
        (1..=STREAMS).map(|n| started(client, n, &nodes)).collect();
    signal(frozen, "STOP");
    let stopped_at = Instant::now();
    let until = stopped_at + Duration::from_secs(STEP_TIMEOUT_S + 20);
    for (n, stream) in streams.iter_mut().enumerate() {
        let (error, done, last) = read_to_end(stream, until);
        assert!(
            error && done,
            "stream {} did not end with an error and [DONE] within {:?} of the freeze \
             (error {error}, done {done}): {last}\n{}",
            n + 1,
            until - stopped_at,
            logs(&nodes)
        );
    }
    let all_ended = stopped_at.elapsed();
    drop(streams);
    eprintln!("rank 1 frozen: all {STREAMS} streams ended with an error after {all_ended:?}");
    assert!(
        all_ended >= Duration::from_secs(STEP_TIMEOUT_S - 2),
        "the streams ended {all_ended:?} after the freeze, before the {STEP_TIMEOUT_S} s step \
         deadline: something else ended them"
    );

    // The instance is placed again and answers as before; the frozen runner is gone.
    let replaced = wait_for(Duration::from_secs(240), || {
        let (_, view) = call(client, "GET", &format!("/instance/{instance}"), None);
        (view["epoch"].as_u64() >= Some(1) && view["status"] == "ready").then_some(view)
    });
    let Some((view, took)) = replaced else {
        let (_, view) = call(client, "GET", &format!("/instance/{instance}"), None);
        panic!("not placed again: {view}\n{}", logs(&nodes));
    };
    eprintln!(
        "placed again (epoch {}, {} ranks) {took:?} after the streams ended",
        view["epoch"],
        view["placement"]["ranks"].as_array().map_or(0, Vec::len)
    );
    let after = paris(client);
    assert_eq!(after, before, "the replaced instance answers as before");
    let gone = wait_for(Duration::from_secs(30), || {
        process_ended(frozen).then_some(())
    });
    if gone.is_none() {
        // Let it go before failing, so nothing stopped is left behind.
        signal(frozen, "KILL");
        panic!(
            "the frozen runner {frozen} was left running\n{}",
            logs(&nodes)
        );
    }
    test_net.teardown(nodes);
}
