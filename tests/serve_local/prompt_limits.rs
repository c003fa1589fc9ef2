//! Prompts longer than the context, refused before they cost the node their size in memory
//! (part of `serve_local.rs`'s one-node test).

use super::{peak_rss_bytes, Node};
use serde_json::Value;
use std::time::{Duration, Instant};

/// A 1 MB system prompt (about 190,000 tokens against a context of 8,192; too few bytes for
/// the byte bound of [`huge_prompts_are_refused_before_tokenizing`]) is refused once its
/// first pieces are counted: the probe saw the node grow by 141 MB encoding it whole before
/// its 400. Checked first, while the node's peak is still its own.
pub(super) fn a_long_system_prompt_is_refused_in_bounded_memory(node: &Node) {
    let pid = node.node.pid().expect("the node runs");
    let before = peak_rss_bytes(pid as u64).unwrap_or(0);
    let system = "hello there ".repeat(1024 * 1024 / 12);
    let bodies = [
        (
            "/v1/chat/completions",
            serde_json::json!({
                "model": "default",
                "max_tokens": 8,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": "Hi"}],
            }),
        ),
        (
            "/v1/messages/count_tokens",
            serde_json::json!({
                "model": "default",
                "system": system,
                "messages": [{"role": "user", "content": "Hi"}],
            }),
        ),
    ];
    for (path, body) in bodies {
        refused_for_the_context(node, path, &body, "a 1 MB system prompt");
    }
    let after = peak_rss_bytes(pid as u64).unwrap_or(0);
    let grown = after.saturating_sub(before) / (1024 * 1024);
    eprintln!("node peak RSS grew {grown} MiB over the two 1 MB system prompts");
    // The body and its parsed copies (a few MB) stay; the encoding of it all must not.
    assert!(grown < 48, "the node's peak RSS grew {grown} MiB");
}

/// A 20 MB conversation against an 8,192-token context is refused at once, before it is
/// rendered and tokenized: the probe saw `count_tokens` take 9.8 s and grow the node by
/// 2.1 GB before its 400 (7 M tokens encoded whole); a chat of the same size likewise.
pub(super) fn huge_prompts_are_refused_before_tokenizing(node: &Node) {
    let pid = node.node.pid().expect("the node runs");
    let before = peak_rss_bytes(pid as u64).unwrap_or(0);
    let content = "hello there ".repeat(20 * 1024 * 1024 / 12);
    for path in ["/v1/messages/count_tokens", "/v1/chat/completions"] {
        let body = serde_json::json!({
            "model": "default",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": content}],
        });
        let took = refused_for_the_context(node, path, &body, "20 MB");
        // Reading and parsing 20 MB takes a fraction of a second; tokenizing it took 9.8 s.
        assert!(
            took < Duration::from_secs(4),
            "{path}: refused after {took:?}"
        );
    }
    let after = peak_rss_bytes(pid as u64).unwrap_or(0);
    let grown = after.saturating_sub(before) / (1024 * 1024);
    eprintln!("node peak RSS grew {grown} MiB over the two 20 MB conversations");
    // The bodies themselves (20 MB read, parsed to a JSON value and a chat request) stay;
    // the tokenized prompt (2.1 GB for count_tokens) must not.
    assert!(grown < 400, "the node's peak RSS grew {grown} MiB");
}

/// POSTs `body` (`what`) to `path` and asserts a 400 that names the context; how long the
/// answer took.
fn refused_for_the_context(node: &Node, path: &str, body: &Value, what: &str) -> Duration {
    let started = Instant::now();
    let failure = node
        .node
        .api
        .run(Duration::from_secs(60), |api| {
            api.json(kit::client::Method::POST, path, Some(body))
        })
        .expect_err("refused");
    let took = started.elapsed();
    eprintln!("{path}: {what} refused in {:.2} s", took.as_secs_f64());
    assert_eq!(
        failure.status.map(|s| s.as_u16()),
        Some(400),
        "{path}, {what}: {}",
        failure.message
    );
    assert!(
        failure.message.contains("context"),
        "{path}, {what}: {}",
        failure.message
    );
    took
}
