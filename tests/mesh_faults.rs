//! The mesh on a bad network: real `shoal` processes in Linux network namespaces, with faults
//! made by nftables rules inside one node's namespace (random loss with `numgen`, a partition as
//! dropping everything), by a queue that holds every packet for a while (delay), and by signals (a node frozen with SIGSTOP and resumed). The state
//! converges under loss with no node wrongly declared dead, a partition is seen from both
//! sides and heals, and a frozen node is declared dead and taken back when it resumes.
//!
//! Delay: this machine's kernel has no netem (`CONFIG_NET_SCH_NETEM` is not set), so packets
//! are delayed through iptables' NFQUEUE target by a thread of the test that holds each one
//! (`support/link_delay.rs`); the delay is measured, not assumed. Needs root and `nft` (setup installs
//! Debian's nftables): fails otherwise, or with `SHOAL_ALLOW_SKIP=1` is skipped and counted.

mod support;
use kit::state_view::node_id;
use support::{link_delay, link_faults};

use kit::blocking::Blocking;
use kit::client::Api;
use link_delay::LinkDelay;
use link_faults::{drop_on_link, dropped};
use std::time::Duration;
use support::netns::Spec;
use support::{agreed, logs, wait_for, ShoalNode, TestNet};

/// The delay on node 3's link in phase 1b, each way.
const DELAY: Duration = Duration::from_millis(100);

/// Whether `observer` considers `subject` alive (`None`: no answer or not listed).
fn alive(observer: &ShoalNode, subject: &str) -> Option<bool> {
    kit::state_view::is_alive(&observer.state()?, subject)
}

/// Every (observer, subject) pair, 1-based, seen with the subject dead while watching for
/// `span` (every half second).
fn false_deaths_during(nodes: &[ShoalNode], ids: &[String], span: Duration) -> Vec<(usize, usize)> {
    let mut false_deaths = Vec::new();
    let until = std::time::Instant::now() + span;
    while std::time::Instant::now() < until {
        for (i, observer) in nodes.iter().enumerate() {
            for (j, id) in ids.iter().enumerate() {
                if i != j && alive(observer, id) == Some(false) {
                    false_deaths.push((i + 1, j + 1));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    false_deaths
}

#[test]
fn loss_a_partition_and_a_frozen_node() {
    let spec = Spec {
        nodes: 3,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalf", &spec) else {
        return;
    };
    let netns3 = test_net.net.nodes[2].netns.clone();
    for node in nodes.iter_mut() {
        node.start();
    }
    let all: Vec<&ShoalNode> = nodes.iter().collect();
    let Some((states, _)) = wait_for(Duration::from_secs(60), || agreed(&all, 3)) else {
        panic!("3 nodes did not converge\n{}", logs(&nodes));
    };
    let ids: Vec<String> = states.iter().map(node_id).collect();

    // 1. 25% loss each way on node 3's link for 20 s: nobody is declared dead, and the
    //    state still converges (profiles are rewritten every few seconds meanwhile).
    drop_on_link(&netns3, 25);
    let false_deaths = false_deaths_during(&nodes, &ids, Duration::from_secs(20));
    let converged = wait_for(Duration::from_secs(20), || agreed(&all, 3));
    let lost = dropped(&netns3);
    eprintln!(
        "25% loss: {lost} packets dropped; converged again in {:?}; false deaths seen: \
         {false_deaths:?}",
        converged.as_ref().map(|c| c.1)
    );
    assert!(lost > 0, "the loss rules dropped nothing");
    assert!(
        false_deaths.is_empty(),
        "nodes declared dead under 25% loss (observer, subject): {false_deaths:?}\n{}",
        logs(&nodes)
    );
    assert!(
        converged.is_some(),
        "no convergence under 25% loss\n{}",
        logs(&nodes)
    );

    // The loss ends before the delay is measured: under 25% loss the "before" round trip
    // pays retransmissions (0.6-1.0 s measured), and the delay's margin drowns in them.
    drop_on_link(&netns3, 0);

    // 1b. 100 ms each way on node 3's link for 15 s: the delay is there (a request from node
    //     1 to node 3's API takes at least one more round trip of it), nobody is declared
    //     dead, and the state converges.
    let to_node3 = Blocking::new(
        Api::at((nodes[2].node.ip(), support::API_PORT).into()).in_netns(&nodes[0].node.netns),
    );
    let round_trip = || {
        let started = std::time::Instant::now();
        let answer = to_node3.call(
            "GET".parse().unwrap(),
            "/node_id",
            None,
            Duration::from_secs(30),
        );
        assert!(answer.is_ok(), "node 3's API from node 1: {answer:?}");
        started.elapsed()
    };
    // The fastest of three: the first call may also pay for a connection.
    let before = (0..3).map(|_| round_trip()).min().unwrap();
    let delay = LinkDelay::start(&netns3, DELAY);
    let during = (0..3).map(|_| round_trip()).min().unwrap();
    let false_deaths = false_deaths_during(&nodes, &ids, Duration::from_secs(15));
    let converged = wait_for(Duration::from_secs(20), || agreed(&all, 3));
    let held = delay.held();
    delay.stop();
    eprintln!(
        "{DELAY:?} each way: node 1 -> node 3 /node_id took {before:?} before, {during:?} \
         during; {held} packets held; converged in {:?}; false deaths {false_deaths:?}",
        converged.as_ref().map(|c| c.1)
    );
    assert!(
        during >= before + 2 * DELAY,
        "the delay is not there: {before:?} before, {during:?} during"
    );
    assert!(
        false_deaths.is_empty(),
        "nodes declared dead under {DELAY:?} of delay (observer, subject): {false_deaths:?}\n{}",
        logs(&nodes)
    );
    assert!(
        converged.is_some(),
        "no convergence under delay\n{}",
        logs(&nodes)
    );

    // 2. A partition: node 3 cut off. Both sides see the other dead; healed, all converge.
    drop_on_link(&netns3, 100);
    let split = wait_for(Duration::from_secs(15), || {
        (alive(&nodes[0], &ids[2]) == Some(false)
            && alive(&nodes[1], &ids[2]) == Some(false)
            && alive(&nodes[2], &ids[0]) == Some(false)
            && alive(&nodes[2], &ids[1]) == Some(false))
        .then_some(())
    });
    let Some((_, took)) = split else {
        panic!(
            "the partition was not seen from both sides\n{}",
            logs(&nodes)
        );
    };
    eprintln!("partition seen from both sides in {took:?}");
    drop_on_link(&netns3, 0);
    let Some((_, took)) = wait_for(Duration::from_secs(30), || agreed(&all, 3)) else {
        panic!("the partition did not heal\n{}", logs(&nodes));
    };
    eprintln!("partition healed: converged in {took:?}");

    // 3. Node 2 frozen: declared dead by the others; resumed, taken back.
    nodes[1].signal("STOP");
    let frozen = wait_for(Duration::from_secs(15), || {
        (alive(&nodes[0], &ids[1]) == Some(false) && alive(&nodes[2], &ids[1]) == Some(false))
            .then_some(())
    });
    nodes[1].signal("CONT");
    let Some((_, took)) = frozen else {
        panic!("a frozen node was not declared dead\n{}", logs(&nodes));
    };
    eprintln!("frozen node declared dead in {took:?}");
    let Some((_, took)) = wait_for(Duration::from_secs(30), || agreed(&all, 3)) else {
        panic!("the resumed node was not taken back\n{}", logs(&nodes));
    };
    eprintln!("resumed node taken back in {took:?}");
    drop(all);
    test_net.teardown(nodes);
}
