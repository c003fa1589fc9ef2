//! A cluster with no hub at all: node A downloaded the model while the hub was up, then the
//! hub is gone; node B, with an empty cache, gets the listing and every file it needs from A
//! over iroh, and the model id placed as a 2-rank pipeline answers "Paris" on both nodes. A
//! machine on the same LAN that is not a cluster member asking A for a file on the file-copy
//! ALPN is refused.
//!
//! And a fault: the member serving a copy dies mid-file (SIGKILL, links throttled so the
//! copy takes seconds) and another member that holds the file finishes it, resuming from the
//! bytes already held: the copy's bytes over the network equal the files' sizes, the second
//! member sends from an offset past zero, and the files are the hub's, byte for byte.
//!
//! And a member that holds a corrupt file (one byte of its blob flipped on disk, size kept):
//! the copy it sends is detected at its end, discarded and not asked for again; the node
//! fetches that file from the hub instead (and only that file: the others come from the
//! member), and its files are the hub's, byte for byte.
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;
use support::{hf, hf_nodes};

use hf_nodes::HubNodes;
use serde_json::json;
use std::time::Duration;
use support::{call, logs, wait_for};

/// Asks `node_id` at `ip` for blob `hash` of the fixture from a fresh iroh endpoint (not a
/// member) in namespace `netns`; answers the server's first frame.
fn ask_as_stranger(netns: &str, ip: std::net::Ipv4Addr, node_id: &str, hash: &str) -> String {
    let (node_id, hash) = (node_id.to_string(), hash.to_string());
    hf::in_netns(netns, move || {
        hf::runtime().block_on(async move {
            let key: iroh::PublicKey = node_id.parse().expect("a node id is an iroh key");
            let endpoint = iroh::Endpoint::builder(iroh::endpoint::presets::Minimal)
                .relay_mode(iroh::RelayMode::Disabled)
                .clear_address_lookup()
                .bind()
                .await
                .expect("bind");
            let addr = iroh::EndpointAddr::new(key).with_ip_addr(std::net::SocketAddr::from((
                ip,
                mesh::net::DEFAULT_MESH_PORT,
            )));
            let alpn = mesh::net::namespaced_alpn(b"shoal/files/1/", "shoal");
            let connection = match endpoint.connect(addr, &alpn).await {
                Ok(c) => c,
                Err(e) => return format!("connection refused: {e}"),
            };
            let (mut send, mut recv) = connection.open_bi().await.expect("a stream");
            let ask =
                serde_json::to_vec(&json!({"model": hf::REPO, "hash": hash, "offset": 0})).unwrap();
            send.write_all(&(ask.len() as u32).to_le_bytes())
                .await
                .unwrap();
            send.write_all(&ask).await.unwrap();
            let mut len = [0u8; 4];
            if let Err(e) = recv.read_exact(&mut len).await {
                // The admission gate closes a connection from a node that has not passed the
                // handshake, saying why in the close reason.
                let why = connection
                    .close_reason()
                    .map(|r| r.to_string())
                    .unwrap_or_default();
                return format!("stream closed: {e}: {why}");
            }
            let mut body = vec![0u8; u32::from_le_bytes(len).min(1 << 16) as usize];
            recv.read_exact(&mut body).await.expect("the answer");
            String::from_utf8_lossy(&body).into_owned()
        })
    })
    .join()
    .expect("stranger thread")
}

#[test]
fn with_no_hub_members_copy_the_model_from_the_one_that_holds_it() {
    let Some(HubNodes {
        net,
        hub_node,
        mut nodes,
        server,
        caches,
        fixture,
    }) = hf_nodes::start("hfpeer", 2)
    else {
        return;
    };
    hf_nodes::download(&nodes[0]);
    // No hub from here on.
    drop(server);
    for node in &mut nodes {
        node.start();
    }
    let (a_id, _) = wait_for(Duration::from_secs(30), || {
        let (status, id) = call(&nodes[0], "GET", "/node_id", None);
        (status == 200).then(|| id.as_str().unwrap_or_default().to_string())
    })
    .unwrap_or_else(|| panic!("node A does not answer\n{}", logs(&nodes)));

    // A stranger on the LAN (the hub's machine, not a member) is refused a file A holds.
    let weight = std::fs::read(fixture.join("model-00001-of-00003.safetensors")).unwrap();
    let hash = hub::verify::hash_of(true, &weight);
    let answer = wait_for(Duration::from_secs(20), || {
        let a = ask_as_stranger(&hub_node.node.netns, nodes[0].node.ip(), &a_id, &hash);
        (!a.starts_with("connection refused")).then_some(a)
    })
    .map(|(a, _)| a)
    .unwrap_or_else(|| panic!("A's endpoint does not answer\n{}", logs(&nodes)));
    // Refused at the admission gate (it never passed the handshake), or by the files
    // protocol's member check behind it: either way no byte of the file.
    assert!(
        answer.contains("not a member") || answer.contains("not admitted"),
        "{answer}"
    );

    // Placement prefers the node that holds the files: a one-node pipeline goes to A, never
    // to B (which would have to copy the whole model first), whichever id is smaller.
    let (b_id, _) = wait_for(Duration::from_secs(30), || nodes[1].node_id())
        .unwrap_or_else(|| panic!("node B does not answer\n{}", logs(&nodes)));
    let one_node = wait_for(Duration::from_secs(60), || {
        let (status, previews) = call(
            &nodes[0],
            "GET",
            &format!("/instance/previews?model_id={}", hf::REPO),
            None,
        );
        if status != 200 || previews["nodes"].as_array().map_or(0, Vec::len) < 2 {
            return None;
        }
        previews["previews"].as_array()?.iter().find_map(|p| {
            (p["node_count"] == 1 && p["sharding"] == "Pipeline" && p["error"].is_null())
                .then(|| p.to_string())
        })
    })
    .map(|(p, _)| p)
    .unwrap_or_else(|| panic!("no one-node preview\n{}", logs(&nodes)));
    assert!(
        one_node.contains(&a_id) && !one_node.contains(&b_id),
        "a one-node placement should go to the holder {a_id}, not {b_id}: {one_node}"
    );

    let placed = wait_for(Duration::from_secs(90), || {
        let (status, created) = call(
            &nodes[0],
            "POST",
            "/place_instance",
            Some(&json!({"model_id": hf::REPO, "sharding": "Pipeline", "min_nodes": 2})),
        );
        (status == 200).then_some(created)
    });
    let Some((created, _)) = placed else {
        panic!("no two-node placement\n{}", logs(&nodes));
    };
    let id = created["instance_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(150), || {
        let (_, instance) = call(&nodes[0], "GET", &format!("/instance/{id}"), None);
        assert_ne!(instance["status"], "failed", "{instance}\n{}", logs(&nodes));
        (instance["status"] == "ready").then_some(())
    })
    .unwrap_or_else(|| panic!("the instance did not become ready\n{}", logs(&nodes)));
    for node in &nodes {
        hf_nodes::assert_says_paris(node, hf::REPO);
    }

    // Deleting the model: refused while an instance has a rank here, then it frees the
    // cache folder and the holding record, and a second delete finds nothing.
    let path = format!("/models/{}", hf::REPO);
    let (status, refused) = call(&nodes[0], "DELETE", &path, None);
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "model_in_use", "{refused}");
    let (status, _) = call(&nodes[0], "DELETE", &format!("/instance/{id}"), None);
    assert_eq!(status, 200);
    let repo_dir = hf_nodes::repo_dir(&caches[0]);
    assert!(repo_dir.is_dir(), "{}", repo_dir.display());
    let (deleted, _) = wait_for(Duration::from_secs(30), || {
        let (status, deleted) = call(&nodes[0], "DELETE", &path, None);
        (status == 200).then_some(deleted)
    })
    .unwrap_or_else(|| panic!("the model was never deleted\n{}", logs(&nodes)));
    let weights: u64 = (1..=3)
        .map(|i| {
            std::fs::metadata(fixture.join(format!("model-0000{i}-of-00003.safetensors")))
                .unwrap()
                .len()
        })
        .sum();
    assert!(
        deleted["freed_bytes"].as_u64().unwrap_or(0) >= weights,
        "{deleted} (weights are {weights} bytes)"
    );
    assert!(!repo_dir.exists(), "{}", repo_dir.display());
    let (_, state) = call(&nodes[0], "GET", "/state", None);
    let held = format!("files/{}", hf::REPO);
    assert!(
        state["nodes"][&a_id]["records"].get(&held).is_none(),
        "{held} still announced"
    );
    let (status, _) = call(&nodes[0], "DELETE", &path, None);
    assert_eq!(status, 404);
    hf_nodes::teardown(net, hub_node, nodes);
}

/// Limits what leaves `netns` on its bridge link (`eth0`) to `rate` (tc's token bucket).
fn throttle(netns: &str, rate: &str) {
    let status = std::process::Command::new("ip")
        .args([
            "netns", "exec", netns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
        ])
        .args(["rate", rate, "burst", "256kb", "latency", "200ms"])
        .status()
        .expect("tc");
    assert!(status.success(), "tc qdisc add in {netns}");
}

/// `node`'s download record of `model` (the first part), from its own `GET /state`.
fn download_record(node: &support::ShoalNode, me: &str) -> Option<serde_json::Value> {
    let (_, state) = call(node, "GET", "/state", None);
    let prefix = format!("download/{}/", hf::REPO);
    let records = state["nodes"][me]["records"].as_object()?;
    records
        .iter()
        .find(|(k, _)| k.starts_with(&prefix) && !k.ends_with("/support"))
        .map(|(_, v)| v.clone())
}

/// `text` without ANSI colour sequences (`ESC [ ... m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            let _ = chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(ch);
        }
    }
    out
}

/// `(offset, size)` of each `sending a file copy` line in a log.
fn copies_sent(log: &str) -> Vec<(u64, u64)> {
    let log = strip_ansi(log);
    let field = |line: &str, name: &str| -> Option<u64> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    log.lines()
        .filter(|l| l.contains("sending a file copy"))
        .filter_map(|l| Some((field(l, "offset")?, field(l, "size")?)))
        .collect()
}

#[test]
fn the_member_serving_a_copy_dies_mid_file_and_another_finishes_it() {
    let Some(HubNodes {
        net,
        hub_node,
        mut nodes,
        server,
        caches,
        fixture,
    }) = hf_nodes::start("hfcut", 3)
    else {
        return;
    };
    // Two holders (A, B) download the model from the hub; then the hub is gone.
    for holder in &nodes[..2] {
        hf_nodes::download(holder);
        // 200 Mbit/s out of each holder: copying the 270 MB model takes about 11 s.
        throttle(&holder.node.netns, "200mbit");
    }
    drop(server);
    let ids = hf_nodes::start_all(&mut nodes);
    let c = &ids[2];
    // One rank on C, which holds nothing: it copies the whole model from A or B.
    let body = json!({"instance": {"model_id": hf::REPO, "required_nodes": [c]}});
    let instance = hf_nodes::place(&nodes[2], "/instance", &body, &nodes);
    // Once C holds 60 MB from one holder, that holder dies.
    let (serving, _) = wait_for(Duration::from_secs(90), || {
        let r = download_record(&nodes[2], c)?;
        let from = r["from"].as_str()?;
        let serving = ids[..2].iter().position(|id| id == from)?;
        (r["done"].as_u64()? > 60 << 20).then_some(serving)
    })
    .unwrap_or_else(|| panic!("C is not copying from A or B\n{}", logs(&nodes)));
    nodes[serving].kill();
    let other = 1 - serving;
    let (ready, _) = hf_nodes::ready(&nodes[2], &instance, Duration::from_secs(150), &nodes)
        .unwrap_or_else(|| panic!("the instance did not become ready\n{}", logs(&nodes)));
    // GET /instance shows the rank's download.
    let shown = &ready["ranks"][0]["download"];
    assert_eq!(shown["state"], "complete", "{ready}");
    assert_eq!(shown["done"], shown["total"], "{ready}");

    // Complete and verified: C's files are the hub's; nothing came over the network twice.
    let record = download_record(&nodes[2], c).expect("C's download record");
    assert_eq!(record["state"], "complete", "{record}");
    assert_eq!(record["done"], record["total"], "{record}");
    // `fetched` counts bytes that came over the network for this download: never more than
    // the model (a resumed copy does not fetch the held part again); files the node already
    // held (the config the placing node read) count as done, not fetched.
    let (fetched, total) = (record["fetched"].as_u64(), record["total"].as_u64());
    assert!(
        fetched.is_some() && fetched <= total,
        "bytes held before the cut were fetched again: {record}"
    );
    hf_nodes::assert_hub_bytes(&hf_nodes::snapshot_dir(&caches[2]), &fixture);
    // The survivor resumed the cut copies: it sent from past the start, never the whole file.
    let sent = copies_sent(&std::fs::read_to_string(&nodes[other].log).unwrap());
    assert!(
        sent.iter()
            .any(|&(offset, size)| offset > 0 && offset < size),
        "the other holder sent no resumed copy: {sent:?}\n{}",
        logs(&nodes)
    );
    hf_nodes::assert_says_paris(&nodes[2], hf::REPO);
    hf_nodes::teardown(net, hub_node, nodes);
}

#[test]
fn a_corrupt_copy_from_a_member_is_refused_and_fetched_from_the_hub() {
    let Some(HubNodes {
        net,
        hub_node,
        mut nodes,
        server,
        caches,
        fixture,
    }) = hf_nodes::start("hfbad", 2)
    else {
        return;
    };
    // A downloads the model from the hub; then one byte in the middle of its copy of the
    // second weight file goes bad (the size stays, so A still lists it as held).
    hf_nodes::download(&nodes[0]);
    let victim = format!("model-00002-of-{:05}.safetensors", hf::PARTS);
    let blob = std::fs::canonicalize(hf_nodes::snapshot_dir(&caches[0]).join(&victim)).unwrap();
    let mut bytes = std::fs::read(&blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&blob, &bytes).unwrap();
    let served_before = server.report().0;

    let ids = hf_nodes::start_all(&mut nodes);
    // One rank on B, which holds nothing: it copies from A, which lists every file.
    let body = json!({"instance": {"model_id": hf::REPO, "required_nodes": [ids[1]]}});
    let instance = hf_nodes::place(&nodes[1], "/instance", &body, &nodes);
    let ready = hf_nodes::ready(&nodes[1], &instance, Duration::from_secs(150), &nodes);
    let b_log = strip_ansi(&std::fs::read_to_string(&nodes[1].log).unwrap());
    let refused: Vec<&str> = b_log
        .lines()
        .filter(|l| l.contains("arrived corrupt"))
        .collect();
    let Some((_, took)) = ready else {
        panic!(
            "the instance did not become ready; corrupt copies discarded: {}\n{}",
            refused.len(),
            logs(&nodes)
        );
    };
    eprintln!("ready on B in {took:?}; corrupt copies discarded: {refused:?}");
    // Detected once, named, and A not asked for that file again.
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains(&victim) && refused[0].contains("not asked for this file again"),
        "{refused:?}"
    );
    // The hub sent B the bad file whole, and nothing else: the rest came from A.
    let served_after = server.report().0;
    for part in 1..=hf::PARTS {
        let name = format!("model-{part:05}-of-{:05}.safetensors", hf::PARTS);
        let size = std::fs::metadata(fixture.join(&name)).unwrap().len();
        let sent = hf::bytes_of(&served_after, &name) - hf::bytes_of(&served_before, &name);
        let want = if name == victim { size } else { 0 };
        assert_eq!(sent, want, "the hub's bytes of {name} to B");
    }
    // B keeps the hub's bytes, never the corrupt ones, and answers.
    hf_nodes::assert_hub_bytes(&hf_nodes::snapshot_dir(&caches[1]), &fixture);
    hf_nodes::assert_says_paris(&nodes[1], hf::REPO);
    drop(server);
    hf_nodes::teardown(net, hub_node, nodes);
}
