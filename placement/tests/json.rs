//! The JSON field names and defaults other crates and the CLI rely on.

use placement::views::ring_port;
use placement::{cli, Input, DEFAULT_INSTANCE_ID};
use serde_json::json;

fn document() -> serde_json::Value {
    json!({
        "nodes": [
            {"id": "b", "ram_available": 2000, "ram_total": 4000, "backends": ["mlx_metal", "mlx_cpu"],
             "rdma_enabled": true,
             "interfaces": [{"name": "en0", "ip": "10.0.0.2", "kind": "ethernet"},
                            {"name": "bridge0", "ip": "fe80::2", "kind": "thunderbolt"}],
             "download": {"m": 0.5}},
            {"id": "a", "ram_available": 2000, "ram_total": 4000, "backends": ["mlx_cuda"],
             "rdma_enabled": false, "interfaces": [{"name": "wlan0", "ip": "10.0.0.1", "kind": "wifi"}],
             "download": {}}
        ],
        "edges": [
            {"from": "a", "to": "b", "ip": "10.0.0.2"},
            {"from": "b", "to": "a", "rdma": {"from_iface": "rdma_en3", "to_iface": "rdma_en1"}}
        ],
        "model": {"id": "m", "n_layers": 4, "storage_bytes": 1000, "hidden_size": 64,
                  "num_key_value_heads": 2, "supports_tensor": false,
                  "tensor_divisors": [{"what": "attention heads", "count": 4}],
                  "layer_weights": [1, 20, 20, 20], "rank0_bytes": 300, "no_cut_before": [3],
                  "backends": ["mlx_cpu"]},
        "request": {"sharding": "tensor", "backend": "jaccl", "min_nodes": 2, "required_nodes": ["a"],
                    "instance_id": "i-1"}
    })
}

#[test]
fn the_documented_field_names_round_trip() {
    let value = document();
    let input: Input = serde_json::from_value(value.clone()).expect("documented shape parses");
    assert_eq!(input.nodes[0].interfaces[1].ip.to_string(), "fe80::2");
    assert_eq!(serde_json::to_value(&input).unwrap(), value);
}

#[test]
fn optional_fields_have_documented_defaults() {
    let mut value = document();
    let model = value["model"].as_object_mut().unwrap();
    model.remove("tensor_divisors");
    model.remove("layer_weights");
    model.remove("rank0_bytes");
    model.remove("no_cut_before");
    let request = value["request"].as_object_mut().unwrap();
    request.remove("min_nodes");
    request.remove("required_nodes");
    request.remove("instance_id");
    // Without `rdma_enabled` no node has RDMA, and a JACCL request (even on one node) is
    // refused (`no_rdma_ring`, as exo does): ask for the ring backend to see the default port.
    request.insert("backend".into(), "ring".into());
    for node in value["nodes"].as_array_mut().unwrap() {
        let node = node.as_object_mut().unwrap();
        node.remove("rdma_enabled");
        node.remove("interfaces");
        node.remove("download");
    }
    value.as_object_mut().unwrap().remove("edges");
    let input: Input = serde_json::from_value(value).unwrap();
    assert_eq!(input.request.min_nodes, 1);
    assert!(input.request.required_nodes.is_empty());
    assert_eq!(input.request.instance_id, DEFAULT_INSTANCE_ID);
    assert!(input.edges.is_empty());
    assert!(!input.nodes[0].rdma_enabled);
    assert!(input.model.tensor_divisors.is_empty() && input.model.layer_weights.is_empty());
    assert_eq!(input.model.rank0_bytes, 0);
    assert!(input.model.no_cut_before.is_empty());

    // The CLI's default port is the default instance id's.
    let (out, code) = cli::run(&serde_json::to_string(&input).unwrap());
    assert_eq!(code, 0);
    let out: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["placement"]["port"], ring_port(DEFAULT_INSTANCE_ID));
}

#[test]
fn unknown_fields_and_bad_edges_are_malformed() {
    let cases = [
        ("/model/extra", json!(1), "model.extra"),
        (
            "/edges/0/rdma",
            json!({"from_iface": "x", "to_iface": "y"}),
            "edges[0]",
        ),
        ("/request/sharding", json!("Pipeline"), "request.sharding"),
        (
            "/nodes/1/interfaces/0/ip",
            json!("10.0.0.300"),
            "nodes[1].interfaces[0].ip",
        ),
    ];
    for (pointer, value, field) in cases {
        let mut doc = document();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        doc.pointer_mut(parent)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert(key.into(), value);
        let (out, code) = cli::run(&doc.to_string());
        assert_eq!(code, 2, "{pointer}");
        let out: serde_json::Value = serde_json::from_str(&out).unwrap();
        let message = out["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("`{field}`")),
            "{pointer}: {message}"
        );
    }
}

#[test]
fn inputs_and_placements_round_trip_through_postcard() {
    let input: Input = serde_json::from_value(document()).unwrap();
    let bytes = postcard::to_allocvec(&input).unwrap();
    assert_eq!(postcard::from_bytes::<Input>(&bytes).unwrap(), input);
    let mut pipeline = input.clone();
    pipeline.request =
        serde_json::from_value(json!({"sharding": "pipeline", "backend": "ring"})).unwrap();
    pipeline
        .edges
        .push(serde_json::from_value(json!({"from": "b", "to": "a", "ip": "10.0.0.1"})).unwrap());
    pipeline.nodes[1]
        .backends
        .push(placement::ComputeBackend::MlxCpu);
    pipeline.model.storage_bytes = 3000;
    let placed = placement::place(&pipeline).expect("two-node placement");
    let bytes = postcard::to_allocvec(&placed).unwrap();
    assert_eq!(
        postcard::from_bytes::<placement::Placement>(&bytes).unwrap(),
        placed
    );
}
