//! Test fixtures shared by control's own tests, its integration tests and the node's tests
//! (public, behind the `test-support` feature, so that the node's reconciler tests build the
//! same records, not a copy of them; production builds leave them out).

use crate::intent::{InstanceRecord, Intent};
use crate::snapshot::Author;
use placement::{fixture, CollectiveBackend, ComputeBackend, Input, ModelCard, Request, Sharding};

/// `n` nodes `a`, `b`, ... on one switch (10.0.0.1...), each with `ram` bytes free, every
/// pair linked both ways.
pub fn cluster_input(n: usize, ram: u64, min_nodes: u32, id: &str) -> Input {
    let names: Vec<String> = (0..n).map(fixture::letter_id).collect();
    named_cluster_input(&names, ram, min_nodes, id)
}

/// [`cluster_input`] on nodes with the given ids (node `i` at 10.0.0.`i+1`).
pub fn named_cluster_input(names: &[String], ram: u64, min_nodes: u32, id: &str) -> Input {
    let nodes: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| fixture::node(name, ram, &format!("10.0.0.{}", i + 1)))
        .collect();
    let edges = fixture::full_mesh(&nodes);
    Input {
        nodes,
        edges,
        model: ModelCard {
            id: "default".into(),
            n_layers: 30,
            storage_bytes: 1_000_000_000,
            hidden_size: 576,
            num_key_value_heads: 3,
            supports_tensor: true,
            tensor_divisors: vec![],
            layer_weights: vec![],
            rank0_bytes: 0,
            no_cut_before: vec![],
            backends: vec![ComputeBackend::MlxCpu],
        },
        request: Request {
            sharding: Sharding::Pipeline,
            backend: CollectiveBackend::Ring,
            min_nodes,
            required_nodes: vec![],
            instance_id: id.into(),
        },
    }
}

/// An epoch-0 intent `default-1` by node `a` on [`cluster_input`]: a 1 GB model of 30 layers.
pub fn record(n: usize, ram: u64, min_nodes: u32) -> InstanceRecord {
    InstanceRecord::new(Intent {
        instance_id: "default-1".into(),
        model: "default".into(),
        model_id: "default".into(),
        created_by: "a".into(),
        input: cluster_input(n, ram, min_nodes, "default-1"),
    })
}

/// An author's part of the state: alive (or dead) with these `(key, JSON text)` records.
pub fn author(alive: bool, records: &[(String, String)]) -> Author {
    Author {
        alive,
        dead: !alive,
        records: records.iter().cloned().collect(),
    }
}

/// `v` as the JSON text a record holds.
pub fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("a fixture encodes")
}
