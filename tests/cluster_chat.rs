//! Two real `shoal` nodes in Linux network namespaces (found by mDNS, no configuration): an
//! instance of the SmolLM2 fixture is created through node A on node A alone, the same greedy
//! chat through node B (forwarded over iroh to A) and through A (served there) gives the
//! same text (and so do the Anthropic, Ollama and Responses APIs; `top_logprobs` and
//! `logit_bias` travel with a forwarded chat), and deleting the instance
//! through B stops A's runner. Then an instance on A created through B loses node A
//! mid-stream: the client gets an error within seconds and B places the instance again on
//! itself.
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;

use kit::blocking::Next;
use kit::sse::SseEvent;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::netns::Spec;
use support::{default_ready, process_ended, wait_for, ShoalNode, TestNet};

/// The cluster secret and keys of the first test's nodes.
const SECRET: &str = "c1a55e7c1a55e7c1a55e7c1a55e7c1a55e7c1a55e7c1a55e7c1a55e7c1a55e7c";
const ADMIN_KEY: &str = "cluster-chat-admin-key-012345678";
const CHAT_KEY: &str = "cluster-chat-chat-key-0123456789";

/// Longest wait for one answer.
const LIMIT: Duration = Duration::from_secs(120);

/// A request to the node's own API from inside its namespace: (HTTP status, body as text);
/// status 0 when no answer came (the node is down or not listening yet).
fn call(node: &ShoalNode, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let method = method.parse().expect("an HTTP method");
    match node.api.call(method, path, body, LIMIT) {
        Ok(answer) => (answer.status.as_u16(), answer.text()),
        Err(e) => (0, e.to_string()),
    }
}

fn json_of(node: &ShoalNode, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let (status, text) = call(node, method, path, body);
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn greedy(node: &ShoalNode) -> String {
    let request = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 16,
    });
    let (status, answer) = json_of(node, "POST", "/v1/chat/completions", Some(&request));
    assert_eq!(status, 200, "{answer}\n{}", node.log_tail());
    let tokens = answer["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert!((1..=16).contains(&tokens), "{answer}");
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    format!("{text} ({tokens} tokens)")
}

/// A greedy chat asking for `top_logprobs` and one with `logit_bias` +100 on " Paris":
/// each token with its 3 alternatives (texts only: a forwarded and a direct chat may differ
/// in the last digits where one came from the prompt cache), then the forced tokens.
fn sampling_controls(node: &ShoalNode) -> (Vec<(String, Vec<String>)>, Vec<String>) {
    let model = inference::loader::describe_model(&kit::dirs::default_model_path())
        .expect("read the fixture's tokenizer");
    let paris = model.tokenizer.encode(" Paris").expect("tokenize")[0];
    let ask = |extra: Value| {
        let mut request = json!({
            "model": "default",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0, "max_tokens": 3, "logprobs": true,
        });
        request
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, answer) = json_of(node, "POST", "/v1/chat/completions", Some(&request));
        assert_eq!(status, 200, "{answer}\n{}", node.log_tail());
        answer["choices"][0]["logprobs"]["content"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let text = |v: &Value| v["token"].as_str().unwrap_or_default().to_owned();
    let top: Vec<(String, Vec<String>)> = ask(json!({"top_logprobs": 3}))
        .iter()
        .map(|c| {
            let alternatives: Vec<String> = c["top_logprobs"]
                .as_array()
                .map(|a| a.iter().map(text).collect())
                .unwrap_or_default();
            assert_eq!(alternatives.len(), 3, "{c}");
            assert_eq!(alternatives[0], text(c), "the greedy token first: {c}");
            (text(c), alternatives)
        })
        .collect();
    let forced: Vec<String> = ask(json!({"logit_bias": {paris.to_string(): 100}}))
        .iter()
        .map(text)
        .collect();
    assert_eq!(forced, vec![" Paris"; 3], "+100 forces the token");
    (top, forced)
}

/// The same greedy question through each of the other APIs (Anthropic Messages, Ollama chat,
/// OpenAI Responses), whole answers: `(api, text and token count)`; plus Anthropic's
/// count_tokens, which must equal the Messages answer's `usage.input_tokens`, a chat with
/// tools, an earlier call and its result (rendered by the template where the instance runs),
/// and a chat whose `tool_choice` names the function, which must come back as a typed call.
fn greedy_other_apis(node: &ShoalNode) -> Vec<(&'static str, String)> {
    let question = "What is the capital of France?";
    let user = json!([{"role": "user", "content": question}]);
    let post = |path: &str, body: Value| {
        let (status, answer) = json_of(node, "POST", path, Some(&body));
        assert_eq!(status, 200, "{path}: {answer}\n{}", node.log_tail());
        answer
    };
    let m = post(
        "/v1/messages",
        json!({"model": "default", "max_tokens": 16, "temperature": 0, "messages": user}),
    );
    let counted = post(
        "/v1/messages/count_tokens",
        json!({"model": "default", "messages": user}),
    );
    assert_eq!(
        counted["input_tokens"], m["usage"]["input_tokens"],
        "{counted} {m}"
    );
    let o = post(
        "/api/chat",
        json!({"model": "default", "stream": false, "messages": user,
               "options": {"temperature": 0, "num_predict": 16}}),
    );
    let r = post(
        "/v1/responses",
        json!({"model": "default", "temperature": 0, "max_output_tokens": 16, "input": question}),
    );
    // A limit beyond any context is echoed as asked (it came back as 4294967295, the
    // saturated bound the request runs with), and the answer ends on its own.
    let huge = post(
        "/v1/responses",
        json!({"model": "default", "temperature": 0, "max_output_tokens": 1_000_000_000_000u64,
               "input": question}),
    );
    assert_eq!(huge["max_output_tokens"], 1_000_000_000_000u64, "{huge}");
    assert_eq!(huge["status"], "completed", "{huge}");
    let t = post(
        "/v1/chat/completions",
        json!({"model": "default", "max_tokens": 16, "temperature": 0,
               "tools": [{"type": "function", "function": {"name": "get_weather",
                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
               "messages": [
                   {"role": "user", "content": "What is the weather in Paris?"},
                   {"role": "assistant", "content": null, "tool_calls": [{"id": "a1B2c3D4e",
                    "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "Sunny, 24 degrees."}]}),
    );
    // `tool_choice` names the function: the node forces the call's opening into the prompt
    // and the model writes the arguments; a typed call must come back (SmolLM2's template
    // does not render `tools`, so the system message describes the tool).
    let f = post(
        "/v1/chat/completions",
        json!({"model": "default", "max_tokens": 24, "temperature": 0,
               "tools": [{"type": "function", "function": {"name": "get_weather",
                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                         "required": ["city"]}}}],
               "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
               "messages": [
                   {"role": "system", "content": "You can call the function get_weather(city: string). To call it, write <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": ...}}</tool_call>."},
                   {"role": "user", "content": "What is the weather in Paris?"}]}),
    );
    let call = &f["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function", "no call came back: {f}");
    assert_eq!(call["function"]["name"], "get_weather", "{f}");
    let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
    let arguments: Value = serde_json::from_str(arguments)
        .unwrap_or_else(|e| panic!("the call's arguments are not JSON ({e}): {f}"));
    assert!(
        arguments["city"].as_str().is_some_and(|c| !c.is_empty()),
        "the call's arguments do not fit the schema: {f}"
    );
    let text = |v: &Value, pointer: &str| {
        v.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    vec![
        (
            "anthropic",
            format!(
                "{} ({} tokens)",
                text(&m, "/content/0/text"),
                m["usage"]["output_tokens"]
            ),
        ),
        (
            "ollama",
            format!(
                "{} ({} tokens)",
                text(&o, "/message/content"),
                o["eval_count"]
            ),
        ),
        (
            "responses",
            format!(
                "{} ({} tokens)",
                text(&r, "/output/0/content/0/text"),
                r["usage"]["output_tokens"]
            ),
        ),
        (
            "chat with tools",
            format!(
                "{} ({} prompt tokens, {} tokens)",
                text(&t, "/choices/0/message/content"),
                t["usage"]["prompt_tokens"],
                t["usage"]["completion_tokens"]
            ),
        ),
        (
            "forced call",
            format!(
                "get_weather({arguments}), {} tokens",
                f["usage"]["completion_tokens"]
            ),
        ),
    ]
}

/// Starts a long greedy stream through `client`, kills `victim` once the first chunk came,
/// and checks that the stream then ends with an error event and `[DONE]`; returns how long
/// after the kill it ended.
fn stream_then_kill(client: &ShoalNode, victim: &mut ShoalNode, logs: &str) -> Duration {
    let request = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}],
        "temperature": 0,
        "max_tokens": 2000,
        "stream": true,
    });
    let mut stream = client
        .api
        .chat_stream(&request, LIMIT)
        .unwrap_or_else(|e| panic!("the stream did not start: {e}\n{logs}"));
    let mut seen: Vec<String> = Vec::new();
    let first_chunk = Instant::now();
    while !seen.iter().any(|l| l.contains("chat.completion.chunk")) {
        match stream.next(Duration::from_secs(60).saturating_sub(first_chunk.elapsed())) {
            Next::Event(SseEvent::Data(data)) => seen.push(data),
            other => panic!("no chunk came ({other:?}): {seen:?}\n{}", logs),
        }
    }
    victim.kill();
    let killed = Instant::now();
    // Each event as its line of the body: `data: ...`.
    let mut rest: Vec<String> = Vec::new();
    while let Next::Event(event) = stream.next(Duration::from_secs(30)) {
        let done = event == SseEvent::Done;
        rest.push(match event {
            SseEvent::Data(data) => format!("data: {data}"),
            SseEvent::Done => "data: [DONE]".into(),
        });
        if done {
            break;
        }
    }
    let ended = killed.elapsed();
    drop(stream);
    let tail = rest[rest.len().saturating_sub(3)..].join("\n");
    assert!(
        rest.last().is_some_and(|l| l.contains("[DONE]")),
        "the stream did not end after the node was killed:\n{tail}\n{}",
        logs
    );
    assert!(
        rest.iter().any(|l| l.contains("\"error\"")),
        "the stream did not report the loss:\n{tail}"
    );
    ended
}

#[test]
fn chat_through_either_node_and_delete_from_the_other() {
    let spec = Spec {
        nodes: 2,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalc", &spec) else {
        return;
    };
    // Secured as the README says: the forwarded chats below cross the admission the secret
    // sets up, and the test's client holds the admin key.
    for node in &mut nodes {
        for (name, value) in [
            ("SHOAL_CLUSTER_SECRET", SECRET),
            ("SHOAL_API_KEY", ADMIN_KEY),
            ("SHOAL_CHAT_API_KEY", CHAT_KEY),
        ] {
            node.env.push((name.into(), value.into()));
        }
        node.hold_key(ADMIN_KEY);
        node.start();
    }
    let (first, second) = nodes.split_at_mut(1);
    let (a, b) = (&mut first[0], &second[0]);
    let logs = |a: &ShoalNode, b: &ShoalNode| {
        format!(
            "--- node A ---\n{}\n--- node B ---\n{}",
            a.log_tail(),
            b.log_tail()
        )
    };

    // Both nodes see both nodes alive.
    let met = wait_for(Duration::from_secs(60), || {
        let sa = a.state()?;
        let sb = b.state()?;
        let alive = |s: &Value| {
            s["liveness"]
                .as_object()
                .is_some_and(|l| l.len() == 2 && l.values().all(|n| n["alive"] == true))
        };
        let id = |s: &Value| s["node_id"].as_str().unwrap_or_default().to_string();
        (alive(&sa) && alive(&sb)).then(|| (id(&sa), id(&sb)))
    });
    let Some(((id_a, id_b), took)) = met else {
        panic!("the nodes did not find each other\n{}", logs(a, b));
    };
    eprintln!("nodes met in {took:?}");

    // An instance on node A only, created through A.
    let (status, created) = json_of(
        a,
        "POST",
        "/instance",
        Some(&json!({"instance": {"model_id": "default", "required_nodes": [id_a]}})),
    );
    assert_eq!(status, 200, "{created}\n{}", logs(a, b));
    let instance = created["instance_id"]
        .as_str()
        .expect("instance id")
        .to_string();
    let ranks = created["placement"]["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 1, "{created}");
    assert_eq!(ranks[0]["node"], id_a.as_str());

    // Both nodes see it ready (B through A's runner record).
    let ready = wait_for(Duration::from_secs(240), || {
        (default_ready(a) && default_ready(b)).then_some(())
    });
    let Some((_, took)) = ready else {
        panic!("the instance did not become ready\n{}", logs(a, b));
    };
    eprintln!("instance ready on both nodes' view in {took:?}");
    let (_, on_b) = json_of(b, "GET", &format!("/instance/{instance}"), None);
    assert_eq!(on_b["status"], "ready", "{on_b}");
    assert_eq!(on_b["runners"][&id_a]["state"], "ready", "{on_b}");
    let pid = {
        let (_, on_a) = json_of(a, "GET", &format!("/instance/{instance}"), None);
        on_a["runner_pid"].as_u64().expect("A runs the runner")
    };
    assert!(on_b["runner_pid"].is_null(), "B runs no runner: {on_b}");

    // The same greedy answer through B (forwarded to A) and through A.
    let start = Instant::now();
    let forwarded = greedy(b);
    let forwarded_took = start.elapsed();
    let start = Instant::now();
    let direct = greedy(a);
    let direct_took = start.elapsed();
    eprintln!(
        "through B (forwarded): {forwarded:?} in {forwarded_took:?}; through A: {direct:?} in \
         {direct_took:?}"
    );
    assert!(direct.contains("Paris"), "{direct}");
    assert_eq!(forwarded, direct, "forwarding changed the answer");
    // A user's client holds only the chat key: its chat through B is forwarded as well; a
    // client without a key is refused before anything is forwarded.
    let user = |key: Option<&str>| {
        let api =
            kit::client::Api::at((b.node.ip(), support::API_PORT).into()).in_netns(&b.node.netns);
        let api = key.map_or(api.clone(), |k| api.with_key(k));
        kit::blocking::Blocking::new(api)
            .call(
                "POST".parse().unwrap(),
                "/v1/chat/completions",
                Some(&json!({"model": "default", "temperature": 0, "max_tokens": 16,
                             "messages": [{"role": "user", "content": "What is the capital of France?"}]})),
                LIMIT,
            )
            .map(|a| (a.status.as_u16(), a.value()))
            .unwrap_or_else(|e| (0, Value::String(e.to_string())))
    };
    let (status, with_chat_key) = user(Some(CHAT_KEY));
    assert_eq!(status, 200, "{with_chat_key}");
    let text = with_chat_key["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    // Not empty: every string starts with "".
    assert!(
        !text.is_empty() && forwarded.starts_with(text),
        "{text:?} vs {forwarded:?}"
    );
    assert_eq!(user(None).0, 401);
    let (through_b, through_a) = (sampling_controls(b), sampling_controls(a));
    eprintln!("top_logprobs and logit_bias through B (forwarded): {through_b:?}");
    assert_eq!(
        through_b, through_a,
        "forwarding changed top_logprobs or logit_bias"
    );

    // Every other API gives the same greedy answer, forwarded through B and served on A.
    let through_b = greedy_other_apis(b);
    let through_a = greedy_other_apis(a);
    eprintln!("other APIs through B (forwarded): {through_b:?}");
    assert_eq!(through_b, through_a, "forwarding changed an API's answer");
    // The same prompt through every API gives chat completions' answer; a chat with tools has
    // the tools rendered into its prompt, so its answer is its own (equal through B and A above).
    for (api, answer) in &through_a {
        if *api == "chat with tools" {
            assert!(!answer.trim().is_empty(), "chat with tools gave no answer");
            continue;
        }
        if *api == "forced call" {
            continue;
        }
        assert_eq!(
            answer, &direct,
            "{api} answers differently from chat completions"
        );
    }

    // Streaming through B: chunks, then [DONE].
    let request = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "Say hello."}],
        "temperature": 0,
        "max_tokens": 8,
        "stream": true,
    });
    let (status, sse) = call(b, "POST", "/v1/chat/completions", Some(&request));
    assert_eq!(status, 200, "{sse}");
    assert!(sse.contains("chat.completion.chunk"), "{sse}");
    assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");

    // Deleting through B (not the author) removes it on A: runner gone, no instance.
    let (status, deleted) = json_of(b, "DELETE", &format!("/instance/{instance}"), None);
    assert_eq!(status, 200, "{deleted}");
    let gone = wait_for(Duration::from_secs(30), || {
        let sa = a.state()?;
        let none = sa["instances"].as_object().is_some_and(|i| i.is_empty());
        let exited = process_ended(pid);
        (none && exited).then_some(())
    });
    let Some((_, took)) = gone else {
        panic!("the deletion did not reach node A\n{}", logs(a, b));
    };
    eprintln!("deleted through B; A's runner gone after {took:?}");
    let (status, after) = json_of(
        b,
        "POST",
        "/v1/chat/completions",
        Some(&json!({
            "model": "default",
            "messages": [{"role": "user", "content": "hi"}],
        })),
    );
    assert_eq!(status, 503, "{after}");

    // An instance on A created through B; a long stream through B; A is killed mid-stream:
    // the client gets an error within seconds, and B (the node that remains) places the
    // instance again on itself and answers.
    let (status, created) = json_of(
        b,
        "POST",
        "/instance",
        Some(&json!({"instance": {"model_id": "default", "required_nodes": [id_a]}})),
    );
    assert_eq!(status, 200, "{created}");
    let instance = created["instance_id"]
        .as_str()
        .expect("instance id")
        .to_string();
    assert_eq!(created["placement"]["ranks"][0]["node"], id_a.as_str());
    let ready = wait_for(Duration::from_secs(120), || default_ready(b).then_some(()));
    assert!(
        ready.is_some(),
        "the second instance did not become ready\n{}",
        logs(a, b)
    );
    let ended = stream_then_kill(b, a, &logs(a, b));
    eprintln!("node A killed mid-stream: the client got an error and [DONE] after {ended:?}");
    let replaced = wait_for(Duration::from_secs(120), || {
        let (_, view) = json_of(b, "GET", &format!("/instance/{instance}"), None);
        (view["epoch"] == 1
            && view["placement"]["ranks"][0]["node"] == id_b.as_str()
            && view["status"] == "ready")
            .then_some(view)
    });
    let Some((view, took)) = replaced else {
        panic!("the instance was not placed again on B\n{}", logs(a, b));
    };
    eprintln!(
        "placed again on node B (epoch 1, ring port {}) {took:?} after the stream ended",
        view["placement"]["port"]
    );
    assert_eq!(view["excluded"], json!([id_a]));
    let answer = greedy(b);
    assert!(answer.contains("Paris"), "{answer}");

    test_net.teardown(nodes);
}

/// Two nodes, one instance across both (a pipeline of two ranks, placed by min_nodes 2): the
/// nodes start their runners in the planned order, join one MLX ring, and the same greedy
/// answer comes through either node. Then node B dies mid-stream: the client gets an error,
/// node A places the instance again on itself alone, it answers the same, and deleting it
/// stops A's runner.
#[test]
fn a_two_rank_pipeline_across_both_nodes_answers_through_either() {
    let spec = Spec {
        nodes: 2,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalr", &spec) else {
        return;
    };
    for node in &mut nodes {
        node.start();
    }
    let (a, b) = (&nodes[0], &nodes[1]);
    let logs = || {
        format!(
            "--- node A ---\n{}\n--- node B ---\n{}",
            a.log_tail(),
            b.log_tail()
        )
    };
    // Placement needs the verified edges between the nodes: retry until it succeeds.
    let placed = wait_for(Duration::from_secs(60), || {
        let (status, created) = json_of(
            a,
            "POST",
            "/place_instance",
            Some(&json!({"model_id": "default", "sharding": "Pipeline", "min_nodes": 2})),
        );
        (status == 200).then_some(created)
    });
    let Some((created, took)) = placed else {
        panic!("no two-node placement\n{}", logs());
    };
    eprintln!(
        "placed on two nodes after {took:?}: {}",
        created["placement"]
    );
    let instance = created["instance_id"].as_str().expect("id").to_string();
    let ranks = created["placement"]["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 2, "{created}");
    // Previews: every sharding x backend x node count, with the placement or the error. Asked
    // of B, which may not have A's verified links in its state yet (gossip): until it does,
    // its 2-node pipeline preview finds no ring, so the previews are read again until it is
    // placed (the instance itself was placed by A, which had them).
    let two_node_pipeline_placed = |previews: &serde_json::Value| {
        previews["previews"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| {
                p["sharding"] == "Pipeline"
                    && p["instance_meta"] == "MlxRing"
                    && p["node_count"] == 2
                    && p["placement"]["ranks"].as_array().map(Vec::len) == Some(2)
            })
    };
    let mut previews = serde_json::Value::Null;
    let seen = wait_for(Duration::from_secs(30), || {
        let (status, answer) = json_of(b, "GET", "/instance/previews?model_id=default", None);
        assert_eq!(status, 200, "{answer}");
        previews = answer;
        two_node_pipeline_placed(&previews).then_some(())
    });
    assert!(
        seen.is_some(),
        "B's previews never placed the 2-node pipeline: {previews}"
    );
    let list = previews["previews"].as_array().expect("previews");
    assert_eq!(list.len(), 8, "{previews}");
    let find = |sharding: &str, meta: &str, count: u64| {
        list.iter()
            .find(|p| {
                p["sharding"] == sharding && p["instance_meta"] == meta && p["node_count"] == count
            })
            .cloned()
            .unwrap_or_else(|| panic!("no preview {sharding} {meta} {count}: {previews}"))
    };
    let two = find("Pipeline", "MlxRing", 2);
    assert_eq!(
        two["placement"]["ranks"].as_array().map(Vec::len),
        Some(2),
        "{two}"
    );
    let rdma = find("Pipeline", "MlxJaccl", 2);
    assert_eq!(rdma["error"]["code"], "no_rdma_ring", "{rdma}");
    // SmolLM2 has 3 key/value heads: no tensor split over two nodes.
    let tensor = find("Tensor", "MlxRing", 2);
    assert_eq!(tensor["error"]["code"], "tensor_indivisible", "{tensor}");
    let ready = wait_for(Duration::from_secs(240), || {
        (default_ready(a) && default_ready(b)).then_some(())
    });
    let Some((_, took)) = ready else {
        let (_, view) = json_of(a, "GET", &format!("/instance/{instance}"), None);
        panic!(
            "the two-rank instance did not become ready: {view}\n{}",
            logs()
        );
    };
    eprintln!("two-rank instance ready in {took:?}");
    let through_a = greedy(a);
    let through_b = greedy(b);
    eprintln!("two ranks: through A {through_a:?}, through B {through_b:?}");
    assert!(through_a.contains("Paris"), "{through_a}");
    assert_eq!(through_a, through_b);
    // B dies mid-stream of a request through A: the client gets an error, and A places
    // the instance again on itself alone (min_nodes 2 shrinks to the one node left).
    let id_a = a.state().expect("A's state")["node_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let before = logs();
    let (first, second) = nodes.split_at_mut(1);
    let (a, b) = (&first[0], &mut second[0]);
    let ended = stream_then_kill(a, b, &before);
    eprintln!("node B killed mid-stream: the client got an error and [DONE] after {ended:?}");
    let replaced = wait_for(Duration::from_secs(120), || {
        let (_, view) = json_of(a, "GET", &format!("/instance/{instance}"), None);
        (view["epoch"] == 1
            && view["placement"]["ranks"].as_array().map(Vec::len) == Some(1)
            && view["placement"]["ranks"][0]["node"] == id_a.as_str()
            && view["status"] == "ready")
            .then_some(view)
    });
    let Some((view, took)) = replaced else {
        let (_, view) = json_of(a, "GET", &format!("/instance/{instance}"), None);
        panic!("not placed again on A: {view}\n{}", a.log_tail());
    };
    eprintln!(
        "placed again on node A alone (epoch 1, ring port {}) {took:?} after the stream ended",
        view["placement"]["port"]
    );
    let alone = greedy(a);
    assert_eq!(alone, through_a, "one rank and two ranks answer alike");
    let pid = view["runner_pid"].as_u64().expect("A runs the new rank");
    let (status, _) = json_of(a, "DELETE", &format!("/instance/{instance}"), None);
    assert_eq!(status, 200);
    let gone = wait_for(Duration::from_secs(30), || process_ended(pid).then_some(()));
    assert!(
        gone.is_some(),
        "A's runner left after the deletion\n{}",
        a.log_tail()
    );
    test_net.teardown(nodes);
}
