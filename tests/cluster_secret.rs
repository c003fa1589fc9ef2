//! The cluster secret between real `shoal` processes in Linux network namespaces on one
//! bridge: two nodes with the same secret (one from `SHOAL_CLUSTER_SECRET`, one from the file
//! `shoal secret` wrote in its data directory) find each other with nothing else typed; a node
//! with the right namespace and a wrong secret, even one told the first node's address with
//! `--peer`, never appears in their state, sees no one, and both sides say why in their logs;
//! a node with no secret stays outside too. Needs root (namespaces): fails otherwise, or with
//! `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;

use serde_json::Value;
use std::time::Duration;
use support::netns::Spec;
use support::{logs, shoal_bin, wait_for, ShoalNode, TestNet};

/// The ids a node's state lists.
fn listed(node: &ShoalNode) -> Option<Vec<String>> {
    let state: Value = node.state()?;
    Some(state["nodes"].as_object()?.keys().cloned().collect())
}

#[test]
fn only_nodes_with_the_same_secret_see_each_other() {
    let spec = Spec {
        nodes: 4,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoals", &spec) else {
        return;
    };

    // `shoal secret` makes a secret in node 1's data directory and says how to start the rest.
    let made = std::process::Command::new(shoal_bin())
        .args(["secret", "--data-dir"])
        .arg(&nodes[0].data_dir)
        .output()
        .expect("run shoal secret");
    assert!(made.status.success(), "{made:?}");
    let printed = String::from_utf8_lossy(&made.stdout).to_string();
    let secret = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("SHOAL_CLUSTER_SECRET="))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no start line printed:\n{printed}"))
        .to_string();
    assert_eq!(secret.len(), 64, "{printed}");
    let file = std::fs::read_to_string(nodes[0].data_dir.join("cluster.secret")).unwrap();
    assert_eq!(file.trim(), secret);
    // Asked again, it shows the same secret rather than replacing it.
    let again = std::process::Command::new(shoal_bin())
        .args(["secret", "--data-dir"])
        .arg(&nodes[0].data_dir)
        .output()
        .expect("run shoal secret");
    assert!(String::from_utf8_lossy(&again.stdout).contains(&secret));

    nodes[1].env = vec![("SHOAL_CLUSTER_SECRET".into(), secret.clone())];
    nodes[0].start();
    nodes[1].start();
    let up = wait_for(Duration::from_secs(60), || {
        Some((nodes[0].node_id()?, nodes[1].node_id()?))
    });
    let Some(((id1, id2), _)) = up else {
        panic!(
            "the nodes with the secret did not come up\n{}",
            logs(&nodes)
        );
    };
    let mut pair = vec![id1.clone(), id2.clone()];
    pair.sort();
    let joined = wait_for(Duration::from_secs(30), || {
        (listed(&nodes[0])? == pair && listed(&nodes[1])? == pair).then_some(())
    });
    assert!(
        joined.is_some(),
        "two nodes with one secret did not find each other\n{}",
        logs(&nodes)
    );

    // A wrong secret (told node 1's address as well) and no secret at all.
    nodes[2].env = vec![(
        "SHOAL_CLUSTER_SECRET".into(),
        "not the secret of this cluster".into(),
    )];
    nodes[2].extra_args = vec!["--peer".into(), format!("{id1}@10.99.0.1:52416")];
    nodes[3].extra_args = vec!["--peer".into(), format!("{id1}@10.99.0.1:52416")];
    nodes[2].start();
    nodes[3].start();
    let outsiders = wait_for(Duration::from_secs(60), || {
        Some((nodes[2].node_id()?, nodes[3].node_id()?))
    });
    let Some(((id3, id4), _)) = outsiders else {
        panic!("the other nodes did not come up\n{}", logs(&nodes));
    };
    // Long enough for mDNS, several --peer retries (every 5 s) and gossip rounds.
    std::thread::sleep(Duration::from_secs(15));
    for (i, node) in nodes.iter().enumerate().take(2) {
        let ids = listed(node).unwrap_or_default();
        assert_eq!(ids, pair, "node {} lists others\n{}", i + 1, logs(&nodes));
    }
    assert_eq!(
        listed(&nodes[2]),
        Some(vec![id3.clone()]),
        "{}",
        logs(&nodes)
    );
    assert_eq!(
        listed(&nodes[3]),
        Some(vec![id4.clone()]),
        "{}",
        logs(&nodes)
    );

    let full_log = |i: usize| std::fs::read_to_string(&nodes[i].log).unwrap_or_default();
    let wrong_log = full_log(2);
    assert!(
        wrong_log.contains("does not share this node's cluster secret"),
        "the node with a wrong secret does not say why it is alone:\n{wrong_log}"
    );
    let warnings = wrong_log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("does not share this node's cluster secret"))
        .count();
    assert_eq!(
        warnings, 1,
        "the refusal is warned about once, later retries only at debug:\n{wrong_log}"
    );
    let first_log = full_log(0);
    assert!(
        first_log.contains("refused a node that does not know this cluster's secret"),
        "node 1 does not log the refusal\n{}",
        logs(&nodes)
    );
    assert!(first_log.contains("cluster secret set"));
    assert!(full_log(3).contains("no cluster secret"));
    test_net.teardown(nodes);
}
