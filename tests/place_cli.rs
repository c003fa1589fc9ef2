//! `shoal place`: the built binary on a placement, a placement error, and malformed input.

use std::io::Write;
use std::process::{Command, Stdio};

const NODES: &str = r#"[
  {"id": "a", "ram_available": 500000000, "ram_total": 800000000, "backends": ["mlx_cpu"],
   "rdma_enabled": false, "interfaces": [{"name": "eth0", "ip": "10.0.0.1", "kind": "ethernet"}],
   "download": {}},
  {"id": "b", "ram_available": 500000000, "ram_total": 800000000, "backends": ["mlx_cpu"],
   "rdma_enabled": false, "interfaces": [{"name": "eth0", "ip": "10.0.0.2", "kind": "ethernet"}],
   "download": {}},
  {"id": "c", "ram_available": 1000000000, "ram_total": 2000000000, "backends": ["mlx_cpu"],
   "rdma_enabled": false, "interfaces": [{"name": "eth0", "ip": "10.0.0.3", "kind": "ethernet"}],
   "download": {}}
]"#;

const EDGES: &str = r#"[
  {"from": "a", "to": "b", "ip": "10.0.0.2"}, {"from": "b", "to": "a", "ip": "10.0.0.1"},
  {"from": "b", "to": "c", "ip": "10.0.0.3"}, {"from": "c", "to": "b", "ip": "10.0.0.2"},
  {"from": "c", "to": "a", "ip": "10.0.0.1"}, {"from": "a", "to": "c", "ip": "10.0.0.3"}
]"#;

fn document(storage_bytes: u64) -> String {
    format!(
        r#"{{"nodes": {NODES}, "edges": {EDGES},
  "model": {{"id": "m", "n_layers": 12, "storage_bytes": {storage_bytes}, "hidden_size": 2048,
            "num_key_value_heads": 8, "supports_tensor": true, "backends": ["mlx_cpu"]}},
  "request": {{"sharding": "pipeline", "backend": "ring", "min_nodes": 1, "required_nodes": []}}}}"#
    )
}

/// Runs `shoal place --input -` with `stdin`; returns stdout as JSON and the exit code.
fn place_stdin(stdin: &str) -> (serde_json::Value, i32) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["place", "--input", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start shoal");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("shoal place");
    let json = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    (json, out.status.code().expect("exit code"))
}

#[test]
fn places_the_three_node_example() {
    let (json, code) = place_stdin(&document(1_800_000_000));
    assert_eq!(code, 0);
    assert_eq!(json["ok"], true);
    let p = &json["placement"];
    assert_eq!(p["sharding"], "pipeline");
    assert_eq!(p["backend"], "ring");
    assert_eq!(p["jaccl"], serde_json::Value::Null);
    // The default instance id ("shoal-place") fixes the port.
    let port = p["port"].as_u64().unwrap();
    assert!((20480..=32767).contains(&port), "{port}");
    let ranks = p["ranks"].as_array().unwrap();
    let layers: Vec<(u64, u64)> = ranks
        .iter()
        .map(|r| {
            (
                r["start_layer"].as_u64().unwrap(),
                r["end_layer"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(layers, [(0, 3), (3, 6), (6, 12)]);
    let nodes: Vec<&str> = ranks.iter().map(|r| r["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["a", "b", "c"]);
    assert_eq!(
        ranks[1]["hosts"],
        serde_json::json!([
            format!("10.0.0.1:{port}"),
            format!("0.0.0.0:{port}"),
            format!("10.0.0.3:{port}")
        ])
    );
}

#[test]
fn reports_a_placement_error_with_exit_code_zero() {
    // Together the nodes have 2 GB; the model needs 3 GB.
    let file = std::env::temp_dir().join(format!("shoal-place-{}.json", std::process::id()));
    std::fs::write(&file, document(3_000_000_000)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["place", "--input"])
        .arg(&file)
        .output()
        .expect("shoal place");
    std::fs::remove_file(&file).ok();
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ok"], false);
    assert_eq!(json["error"]["code"], "no_ring_with_enough_memory");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("3000000000"), "{message}");
    assert!(message.contains("add nodes"), "{message}");
}

#[test]
fn malformed_input_exits_2_naming_the_field() {
    let bad = document(1).replacen(
        "\"ram_available\": 500000000",
        "\"ram_available\": \"lots\"",
        1,
    );
    let (json, code) = place_stdin(&bad);
    assert_eq!(code, 2);
    assert_eq!(json["ok"], false);
    assert_eq!(json["error"]["code"], "invalid_input");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("nodes[0].ram_available"), "{message}");

    let (json, code) = place_stdin("{\"nodes\": [");
    assert_eq!(code, 2);
    assert_eq!(json["error"]["code"], "invalid_input");

    let missing = document(1).replace("\"n_layers\": 12,", "");
    let (json, code) = place_stdin(&missing);
    assert_eq!(code, 2);
    assert!(json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("n_layers"));
}
