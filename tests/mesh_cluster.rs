//! Real `shoal` processes in Linux network namespaces (no `--peer`): they find each other by
//! mDNS, agree on one state, verify edges, detect a crash, and take a restarted node back.
//! Needs root (namespaces): fails otherwise, or with `SHOAL_ALLOW_SKIP=1` is skipped and
//! counted (see `kit::skip`).

mod support;
use kit::state_view::node_id;

use serde_json::Value;
use std::time::Duration;
use support::netns::Spec;
use support::{agreed, logs, wait_for, ShoalNode, TestNet};

fn has_edge(state: &Value, from: &str, to: &str, ip: &str) -> bool {
    state["nodes"][from]["records"]
        .get(format!("edge/{to}/{ip}"))
        .is_some_and(|e| e["to"].as_str() == Some(to))
}

/// When every survivor may declare a killed node dead, from the failure detector's own
/// parameters (`mesh::Config::default()`, what the nodes run with): phi passes its threshold
/// after `threshold / log10(e)` mean heartbeat intervals of silence (13.8 at threshold 6).
/// The mean is at least `min_mean_ms` (250 ms: 3.45 s of silence), and the last heartbeat
/// heard may be up to two gossip intervals older than the kill: the earliest. Under this
/// machine's load heartbeats arrive up to twice the gossip interval apart (mean 500 ms: 6.9 s),
/// and asking three nodes for their state takes up to a second: the latest. (Measured here:
/// 3.9 s; the old fixed bound was 5 s.)
fn death_detection_bounds() -> (Duration, Duration) {
    let config = mesh::Config::default();
    let detector = config.failure_detector;
    let intervals_of_silence = detector.phi_threshold / std::f64::consts::LOG10_E;
    let gossip = config.gossip_interval_ms as f64;
    let fastest_mean = (detector.min_mean_ms as f64).max(gossip);
    let slowest_mean = (detector.min_mean_ms as f64).max(2.0 * gossip);
    let earliest = intervals_of_silence * fastest_mean - 2.0 * gossip;
    let latest = intervals_of_silence * slowest_mean + 1000.0;
    (
        Duration::from_millis(earliest as u64),
        Duration::from_millis(latest as u64),
    )
}

#[test]
fn nodes_in_namespaces_discover_agree_detect_death_and_rejoin() {
    // Nodes 1-3 on the bridge; node 4 only on an extra link to node 1.
    let spec = Spec {
        nodes: 4,
        off_bridge: vec![3],
        links: vec![(0, 3)],
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalt", &spec) else {
        return;
    };

    // 1. Three nodes, no --peer: identical state within 3 s of their APIs answering.
    for node in nodes.iter_mut().take(3) {
        node.start();
    }
    let up = wait_for(Duration::from_secs(60), || {
        nodes[..3].iter().all(|n| n.state().is_some()).then_some(())
    });
    assert!(up.is_some(), "node APIs did not come up\n{}", logs(&nodes));
    let three: Vec<&ShoalNode> = nodes[..3].iter().collect();
    let converged = wait_for(Duration::from_secs(3), || agreed(&three, 3));
    let Some((states, took)) = converged else {
        panic!(
            "3 nodes did not reach identical state within 3 s\n{}",
            logs(&nodes)
        );
    };
    eprintln!("3 nodes converged {took:?} after their APIs answered");
    let ids: Vec<String> = states.iter().map(node_id).collect();

    // 2. A fourth node reachable only over an extra link to node 1 is discovered by everyone
    //    (through node 1) and gets verified edges on that link.
    nodes[3].start();
    let four: Vec<&ShoalNode> = nodes.iter().collect();
    let joined = wait_for(Duration::from_secs(30), || agreed(&four, 4));
    let Some((states, took)) = joined else {
        panic!("the 4th node did not join\n{}", logs(&nodes));
    };
    eprintln!("4th node joined in {took:?}");
    let id4 = node_id(&states[3]);
    let link1 = test_net.net.nodes[0].link_ips[0].to_string();
    let link4 = test_net.net.nodes[3].link_ips[0].to_string();
    let edges = wait_for(Duration::from_secs(15), || {
        let s = nodes[1].state()?;
        (has_edge(&s, &ids[0], &id4, &link4)
            && has_edge(&s, &id4, &ids[0], &link1)
            && has_edge(&s, &ids[0], &ids[1], "10.99.0.2")
            && has_edge(&s, &ids[1], &ids[2], "10.99.0.3"))
        .then_some(s)
    });
    let Some((state, _)) = edges else {
        panic!(
            "edges over the extra link were not recorded\n{}",
            logs(&nodes)
        );
    };
    // Node 2 cannot reach node 4's link address: no such edge, and no loopback or self edges.
    assert!(!has_edge(&state, &ids[1], &id4, &link4));
    for (author, node) in state["nodes"].as_object().unwrap() {
        for key in node["records"].as_object().unwrap().keys() {
            assert!(!key.contains("127.0.0."), "loopback edge {key}");
            assert!(
                !key.starts_with(&format!("edge/{author}/")),
                "self edge {key}"
            );
        }
    }
    let kinds = &state["nodes"][&ids[0]]["records"][format!("edge/{id4}/{link4}")];
    assert_eq!(kinds["local_interface"].as_str(), Some("tb4"));
    assert_eq!(kinds["remote_kind"].as_str(), Some("ethernet"));

    // 3. Killing node 3 is detected by every survivor within the detector's bounds.
    let (earliest, latest) = death_detection_bounds();
    nodes[2].kill();
    let survivors = [0usize, 1, 3];
    let detected = wait_for(latest, || {
        survivors
            .iter()
            .all(|&i| {
                nodes[i]
                    .state()
                    .is_some_and(|s| s["liveness"][&ids[2]]["alive"].as_bool() == Some(false))
            })
            .then_some(())
    });
    let Some((_, took)) = detected else {
        panic!(
            "the death of node 3 was not detected within {latest:?}\n{}",
            logs(&nodes)
        );
    };
    eprintln!(
        "death detected by all survivors in {took:?} (the detector's bounds: {earliest:?} to \
         {latest:?})"
    );
    assert!(
        took >= earliest,
        "node 3 was declared dead after {took:?}, sooner than the detector allows ({earliest:?})"
    );

    // 4. Restarted (same identity, new generation), it converges again.
    let old_generation = states[0]["nodes"][&ids[2]]["generation"].as_u64().unwrap();
    nodes[2].start();
    let four: Vec<&ShoalNode> = nodes.iter().collect();
    let rejoined = wait_for(Duration::from_secs(30), || {
        let states = agreed(&four, 4)?;
        let generation = states[0]["nodes"][&ids[2]]["generation"].as_u64()?;
        (generation > old_generation).then_some(states)
    });
    let Some((states, took)) = rejoined else {
        panic!("the restarted node did not converge\n{}", logs(&nodes));
    };
    eprintln!("restarted node converged in {took:?}");
    assert_eq!(node_id(&states[2]), ids[2], "a restart keeps the identity");
    test_net.teardown(nodes);
}

/// Multicast switched off on every link: `--peer` alone joins the nodes. Then a copy of
/// node 1's data directory started as a third node is found to share node 1's identity and
/// exits (status 3) while the others keep running.
#[test]
fn static_peers_without_multicast_and_duplicate_identity() {
    let spec = Spec {
        nodes: 3,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalp", &spec) else {
        return;
    };
    for node in &test_net.net.nodes {
        let ok = std::process::Command::new("ip")
            .args(["-n", &node.netns, "link", "set", "eth0", "multicast", "off"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cannot switch multicast off");
    }
    nodes[0].start();
    let first = wait_for(Duration::from_secs(60), || nodes[0].state());
    let Some((state, _)) = first else {
        panic!("node 1 did not come up\n{}", logs(&nodes));
    };
    let id1 = node_id(&state);
    nodes[1].extra_args = vec!["--peer".into(), format!("{id1}@10.99.0.1:52416")];
    nodes[1].start();
    let pair: Vec<&ShoalNode> = nodes[..2].iter().collect();
    let Some((states, took)) = wait_for(Duration::from_secs(30), || agreed(&pair, 2)) else {
        panic!("--peer did not join the nodes\n{}", logs(&nodes));
    };
    eprintln!("joined by --peer in {took:?}");
    let id2 = node_id(&states[1]);

    // A copied data directory: same key as node 1.
    std::fs::create_dir_all(&nodes[2].data_dir).unwrap();
    std::fs::copy(
        nodes[0].data_dir.join("node.key"),
        nodes[2].data_dir.join("node.key"),
    )
    .unwrap();
    nodes[2].extra_args = vec!["--peer".into(), format!("{id2}@10.99.0.2:52416")];
    nodes[2].start();
    let exited = wait_for(Duration::from_secs(40), || nodes[2].exit_code());
    let Some((code, took)) = exited else {
        panic!("the copy of node 1 did not exit\n{}", logs(&nodes));
    };
    eprintln!("duplicate identity detected; the newer process exited after {took:?}");
    assert_eq!(code, Some(3), "{}", logs(&nodes));
    assert!(nodes[2].log_tail().contains("already uses this identity"));
    assert!(
        nodes[0].exit_code().is_none(),
        "the original node must keep running"
    );
    assert!(nodes[1].exit_code().is_none());
    test_net.teardown(nodes);
}
