//! Faults on a namespaced node's bridge link, made by nftables rules inside its namespace:
//! random loss with `numgen`, a partition as dropping everything. Used by the fault tests
//! (`mesh_faults`, `partition_under_load`). Needs root and `nft` (setup installs Debian's
//! nftables).

#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Stdio};

const TABLE: &str = "shoal_faults";

/// Replaces the fault rules in `netns` with ones that drop `percent` % of the packets going
/// out of and coming in on its bridge link (100: a partition; 0: none).
pub fn drop_on_link(netns: &str, percent: u32) {
    let _ = Command::new("ip")
        .args([
            "netns", "exec", netns, "nft", "delete", "table", "inet", TABLE,
        ])
        .stderr(Stdio::null())
        .status();
    if percent == 0 {
        return;
    }
    let verdict = if percent >= 100 {
        "counter drop".to_string()
    } else {
        format!("numgen random mod 100 < {percent} counter drop")
    };
    let script = format!(
        "table inet {TABLE} {{\n\
           chain out {{ type filter hook output priority 0; oifname \"eth0\" {verdict}; }}\n\
           chain in {{ type filter hook input priority 0; iifname \"eth0\" {verdict}; }}\n\
         }}\n"
    );
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("nft (setup installs Debian's nftables)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "nft rules in {netns}");
}

/// Packets the fault rules in `netns` dropped so far (both directions).
pub fn dropped(netns: &str) -> u64 {
    let out = Command::new("ip")
        .args([
            "netns", "exec", netns, "nft", "list", "table", "inet", TABLE,
        ])
        .output()
        .expect("nft list");
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "packets")
        .filter_map(|w| w[1].parse::<u64>().ok())
        .sum()
}
