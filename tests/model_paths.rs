//! A node names models only by id or by paths inside its model folders: a request naming any
//! other path (`../../etc/passwd`, `/etc/passwd`) gets the same "model not found" as a name
//! that exists nowhere, never a message naming or opening the file; and a model in the node's
//! Hugging Face cache (laid out as `huggingface-cli` leaves it) is listed by `GET /v1/models`
//! under its id and can be previewed.
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;
use support::hf;

use serde_json::{json, Value};
use std::time::Duration;
use support::netns::Spec;
use support::{wait_for, TestNet};

const LIMIT: Duration = Duration::from_secs(60);

/// Lays the fixture out in `cache` as the Hugging Face cache holds a download.
fn cache_fixture(cache: &std::path::Path, fixture: &std::path::Path) -> String {
    let cache = hub::HfCache::at(cache);
    let id = hub::ModelId::parse(hf::REPO).unwrap();
    let commit = "3f1c2a8e9b7d6c5a4f3e2d1c0b9a8f7e6d5c4b3a";
    for entry in std::fs::read_dir(fixture).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let data = std::fs::read(entry.path()).unwrap();
        let etag = hub::verify::hash_of(name.ends_with(".safetensors"), &data);
        let blob = cache.blob(&id, &etag);
        std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
        std::fs::hard_link(entry.path(), &blob)
            .or_else(|_| std::fs::copy(entry.path(), &blob).map(|_| ()))
            .unwrap();
        cache.link(&id, commit, &name, &etag).unwrap();
    }
    cache.write_ref(&id, "main", commit).unwrap();
    commit.to_string()
}

#[test]
fn paths_outside_the_model_folders_are_never_opened_and_cached_ids_are_listed() {
    if !kit::skip::can_run(hf::fixture_repo().map(|_| ()), "run `cargo xtask setup`") {
        return;
    }
    let Some((net, mut nodes)) = TestNet::create(
        "mpath",
        &Spec {
            nodes: 1,
            ..Spec::default()
        },
    ) else {
        return;
    };
    let cache = net.dir.join("hf");
    cache_fixture(&cache, &hf::fixture_repo().unwrap());
    let node = &mut nodes[0];
    node.env
        .push(("HF_HUB_CACHE".into(), cache.display().to_string()));
    // No hub here: a model id that is neither cached nor held by a member cannot be fetched.
    node.env.push(("HF_HUB_OFFLINE".into(), "1".into()));
    node.start();
    let call = |method: &str, path: &str, body: Option<&Value>| -> (u16, String) {
        match node.api.call(method.parse().unwrap(), path, body, LIMIT) {
            Ok(a) => (a.status.as_u16(), a.text()),
            Err(e) => (0, e.to_string()),
        }
    };
    wait_for(LIMIT, || {
        (call("GET", "/node_id", None).0 == 200).then_some(())
    })
    .unwrap_or_else(|| panic!("node up\n{}", node.log_tail()));

    let place = |model: &str| call("POST", "/place_instance", Some(&json!({"model_id": model})));
    let (absent_status, absent) = place("/no/such/model.gguf");
    assert_eq!(absent_status, 404, "{absent}");
    for evil in [
        "../../etc/passwd",
        "/etc/passwd",
        "/proc/self/environ",
        "./../../../etc/shadow",
    ] {
        let (status, text) = place(evil);
        assert_eq!(status, absent_status, "{evil}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        let a: Value = serde_json::from_str(&absent).unwrap_or_default();
        assert_eq!(v["error"]["code"], a["error"]["code"], "{evil}: {text}");
        assert!(
            !text.contains("cannot read") && !text.contains("root:"),
            "{evil}: {text}"
        );
        let (status, text) = call("GET", &format!("/instance/previews?model_id={evil}"), None);
        assert_eq!(status, 404, "{evil}: {text}");
    }

    // A model id that is not downloaded: placing it fetches it, and here (offline, no member
    // holds it) that fails with the reason; previews say how to fetch it.
    let (status, text) = place("org/not-downloaded");
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains("model_download_failed") && text.contains("offline"),
        "{text}"
    );
    let (status, text) = call(
        "GET",
        "/instance/previews?model_id=org/not-downloaded",
        None,
    );
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("shoal download org/not-downloaded"), "{text}");

    // The cached model is listed under its id and previews place it.
    let (status, text) = call("GET", "/v1/models", None);
    assert_eq!(status, 200, "{text}");
    let models: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(ids.contains(&hf::REPO), "{ids:?}");
    let (status, text) = call(
        "GET",
        &format!("/instance/previews?model_id={}", hf::REPO),
        None,
    );
    assert_eq!(status, 200, "{text}");
    let previews: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(previews["model"]["n_layers"], 30, "{text}");
    net.teardown(nodes);
}

/// `shoal --model PATH` with a folder outside every model folder: the machine's owner named it
/// on the command line, so the node serves it (it used to answer "does not exist in this
/// cluster"), while a request from the network naming a path outside stays refused.
#[test]
fn a_folder_its_owner_names_on_the_command_line_is_served() {
    if !kit::skip::can_run(hf::fixture_repo().map(|_| ()), "run `cargo xtask setup`") {
        return;
    }
    let Some((net, mut nodes)) = TestNet::create(
        "mowner",
        &Spec {
            nodes: 1,
            ..Spec::default()
        },
    ) else {
        return;
    };
    let folder = net.dir.join("outside").join("my-smol");
    std::fs::create_dir_all(&folder).unwrap();
    for entry in std::fs::read_dir(hf::fixture_repo().unwrap())
        .unwrap()
        .flatten()
    {
        let to = folder.join(entry.file_name());
        std::fs::hard_link(entry.path(), &to)
            .or_else(|_| std::fs::copy(entry.path(), &to).map(|_| ()))
            .unwrap();
    }
    let node = &mut nodes[0];
    node.extra_args = vec!["--model".into(), folder.display().to_string()];
    node.env.push(("HF_HUB_OFFLINE".into(), "1".into()));
    node.start();
    let node = &nodes[0];
    let call = |method: &str, path: &str, body: Option<&Value>| -> (u16, Value) {
        match node.api.call(method.parse().unwrap(), path, body, LIMIT) {
            Ok(a) => (
                a.status.as_u16(),
                serde_json::from_str(&a.text()).unwrap_or(Value::Null),
            ),
            Err(e) => (0, Value::String(e.to_string())),
        }
    };
    let Some((id, _)) = support::ready_model_id(node, Duration::from_secs(120)) else {
        panic!("the owner's model never became ready\n{}", node.log_tail());
    };
    let (status, answer) = call(
        "POST",
        "/v1/chat/completions",
        Some(&json!({"model": id, "max_tokens": 12, "temperature": 0,
                     "messages": [{"role": "user", "content": "What is the capital of France?"}]})),
    );
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("Paris"), "{id}: {answer}");
    // The network still cannot name paths outside: a copy in another folder is not opened.
    let beside = net.dir.join("beside");
    std::fs::create_dir_all(&beside).unwrap();
    for entry in std::fs::read_dir(&folder).unwrap().flatten() {
        std::fs::hard_link(entry.path(), beside.join(entry.file_name())).unwrap();
    }
    let (status, text) = call(
        "POST",
        "/place_instance",
        Some(&json!({"model_id": beside.display().to_string()})),
    );
    assert_eq!(status, 404, "{text}");
    net.teardown(nodes);
}
