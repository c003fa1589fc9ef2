//! Placement: where a model instance runs. Pure functions over plain data.
//!
//! In shoal every node computes every placement itself from the replicated state, so this
//! crate is deterministic to the byte: no IO, no clock, no randomness, no hash-map order. The
//! same [`Input`], whatever the order of its nodes, edges and interfaces, gives the same
//! [`Placement`] on every machine.
//!
//! * [`place()`]: choose a ring ([`ring`]: the smallest qualifying directed cycle, by a bounded
//!   search), rank it canonically (from its smallest node id, along its edges), split the
//!   layers ([`split`]), and tell each rank how to reach the others ([`views`]).
//! * [`planning::next_action`]: what a node's runner should do next during start-up.
//! * [`cli::run`]: `shoal place --input FILE|-`, JSON in and out.
//!
//! Errors are [`PlaceError`] values with a stable [`PlaceError::code`] and a sentence that
//! says what to do.
//!
//! # The JSON format (`shoal place`)
//!
//! Input: one object. Memory is in bytes. Node ids are opaque strings (iroh public keys),
//! ordered by their bytes.
//!
//! * `nodes`: `[{"id", "ram_available", "ram_total", "backends": ["mlx_cpu" | "mlx_metal" |
//!   "mlx_cuda"], "rdma_enabled", "interfaces": [{"name", "ip", "kind": "thunderbolt" |
//!   "ethernet" | "wifi" | "unknown"}], "download": {"<model id>": 0.0..1.0}}]`
//!   (`rdma_enabled`, `interfaces` and `download` may be left out);
//! * `edges`: `[{"from", "to", "ip"}]` (`from` reached `to` at `to`'s address `ip`) or
//!   `[{"from", "to", "rdma": {"from_iface", "to_iface"}}]`; edges naming unknown nodes are
//!   ignored;
//! * `model`: `{"id", "n_layers", "storage_bytes", "hidden_size", "num_key_value_heads",
//!   "supports_tensor", "tensor_divisors", "layer_weights", "rank0_bytes", "no_cut_before",
//!   "backends"}`;
//!   `tensor_divisors` (`[{"what", "count"}]`, counts a tensor ring's size must also divide)
//!   defaults to none, `layer_weights` (one relative size per layer, for layers that differ)
//!   to equal layers, `rank0_bytes` (what rank 0 alone holds besides its share: a vision
//!   tower) to 0, `no_cut_before` (layers no pipeline stage may begin at) to none;
//! * `request`: `{"sharding": "pipeline" | "tensor", "backend": "ring" | "jaccl",
//!   "min_nodes", "required_nodes", "instance_id"}`; `min_nodes` defaults to 1,
//!   `required_nodes` to none, and `instance_id` (from which the ring port is derived) to
//!   [`DEFAULT_INSTANCE_ID`] (`"shoal-place"`).
//!
//! Output: `{"ok": true, "placement": {"sharding", "backend", "port", "ranks": [{"node",
//! "start_layer", "end_layer", "hosts"}], "jaccl": null | {"devices", "coordinators"}}}` or
//! `{"ok": false, "error": {"code", "message"}}`; exit code 0 either way. Layer ranges are
//! half-open (`start_layer..end_layer`). Malformed input exits 2 with the error code
//! `invalid_input` and a message naming the field (`nodes[1].ram_available: invalid type...`).
//!
//! Three nodes on a switch, 500/500/1000 MB free, a 12-layer model of 1.8 GB (so no two nodes hold it):
//!
//! ```
//! let input = r#"{
//!   "nodes": [
//!     {"id": "a", "ram_available": 500000000, "ram_total": 800000000, "backends": ["mlx_cpu"],
//!      "rdma_enabled": false, "interfaces": [{"name": "eth0", "ip": "10.0.0.1", "kind": "ethernet"}],
//!      "download": {}},
//!     {"id": "b", "ram_available": 500000000, "ram_total": 800000000, "backends": ["mlx_cpu"],
//!      "rdma_enabled": false, "interfaces": [{"name": "eth0", "ip": "10.0.0.2", "kind": "ethernet"}],
//!      "download": {}},
//!     {"id": "c", "ram_available": 1000000000, "ram_total": 2000000000, "backends": ["mlx_cuda"],
//!      "rdma_enabled": false, "interfaces": [{"name": "eth0", "ip": "10.0.0.3", "kind": "ethernet"}],
//!      "download": {"llama": 0.25}}
//!   ],
//!   "edges": [
//!     {"from": "a", "to": "b", "ip": "10.0.0.2"}, {"from": "b", "to": "a", "ip": "10.0.0.1"},
//!     {"from": "b", "to": "c", "ip": "10.0.0.3"}, {"from": "c", "to": "b", "ip": "10.0.0.2"},
//!     {"from": "c", "to": "a", "ip": "10.0.0.1"}, {"from": "a", "to": "c", "ip": "10.0.0.3"}
//!   ],
//!   "model": {"id": "llama", "n_layers": 12, "storage_bytes": 1800000000, "hidden_size": 2048,
//!             "num_key_value_heads": 8, "supports_tensor": true, "backends": ["mlx_cpu", "mlx_cuda"]},
//!   "request": {"sharding": "pipeline", "backend": "ring", "min_nodes": 1, "required_nodes": [],
//!               "instance_id": "demo"}
//! }"#;
//! let (stdout, exit_code) = placement::cli::run(input);
//! assert_eq!(exit_code, 0);
//! let expected = r#"{
//!   "ok": true,
//!   "placement": {
//!     "sharding": "pipeline",
//!     "backend": "ring",
//!     "port": 21398,
//!     "ranks": [
//!       {
//!         "node": "a",
//!         "start_layer": 0,
//!         "end_layer": 3,
//!         "hosts": [
//!           "0.0.0.0:21398",
//!           "10.0.0.2:21398",
//!           "10.0.0.3:21398"
//!         ]
//!       },
//!       {
//!         "node": "b",
//!         "start_layer": 3,
//!         "end_layer": 6,
//!         "hosts": [
//!           "10.0.0.1:21398",
//!           "0.0.0.0:21398",
//!           "10.0.0.3:21398"
//!         ]
//!       },
//!       {
//!         "node": "c",
//!         "start_layer": 6,
//!         "end_layer": 12,
//!         "hosts": [
//!           "10.0.0.1:21398",
//!           "10.0.0.2:21398",
//!           "0.0.0.0:21398"
//!         ]
//!       }
//!     ],
//!     "jaccl": null
//!   }
//! }
//! "#;
//! assert_eq!(stdout, expected);
//! ```
//!
//! With three ranks every other rank is a neighbour; from four ranks on, ranks that are not
//! neighbours read `198.51.100.1:0`.
//!
//! # Speed
//!
//! See [`ring`] for how the search's cost grows. `cargo bench -p placement` (criterion,
//! `placement/benches/place.rs`) on the 2-core build machine, 2026-11-30: free memory varies
//! per node (8 to 20 GB), the model needs a third of the cluster's memory, so the ring grows
//! with the cluster; times are criterion's median of `place`, input checks included.
//!
//! | nodes | full mesh (ring size) | bidirectional ring | two switches, 2 uplinks |
//! |------:|----------------------:|-------------------:|------------------------:|
//! |     4 |          7 µs (2)     |        6 µs (2)    |        7 µs (2)         |
//! |     8 |         20 µs (2)     |       12 µs (2)    |       18 µs (2)         |
//! |    16 |         90 µs (4)     |       99 µs (16)   |       52 µs (5)         |
//! |    32 |        0.42 ms (8)    |      0.45 ms (32)  |       20 ms (9)         |
//! |    64 |        1.75 ms (16)   |      2.0 ms (64)   |       64 ms (budget)    |
//!
//! Beyond: a 128-node full mesh 7.5 ms, 256 nodes 48 ms, 512 nodes (the most
//! [`input::MAX_NODES`] allows) about 0.2 s; a 64-node full mesh where the model fits nowhere
//! (the error path searches once per filter stage) 1.6 ms. Full meshes grow about as `n²·⁵`,
//! rings about as `n²`; up to 256 nodes both are searched exactly (within budget). Two
//! switches joined by only two uplinks are the hard case for the bounds: at 32 nodes the exact
//! search takes 20 ms; at 64 some ring sizes end on [`ring::SIZE_BUDGET`], so the cost is
//! capped but the ring found may not be the smallest or the best one (here it is then too
//! tight for the layer split: `node_short_of_memory`). Two switches joined by a normal uplink
//! are a full mesh in IP terms, the fast case.

pub mod accel;
pub mod cli;
pub mod edge;
pub mod error;
#[cfg(any(test, feature = "test-support"))]
pub mod fixture;
pub mod input;
pub mod model;
pub mod node;
pub mod pipeline_split;
pub mod place;
pub mod planning;
pub mod previews;
pub mod request;
pub mod ring;
pub mod split;
mod topology;
pub mod views;

pub use edge::{Edge, Link, RdmaLink};
pub use error::PlaceError;
pub use input::Input;
pub use model::{InstanceMemory, ModelCard, TensorDivisor};
pub use node::{ComputeBackend, Interface, InterfaceKind, NodeId, NodeProfile};
pub use place::{place, JacclPlan, Placement, RankPlacement};
pub use planning::{
    next_action, Action, InstanceStatus, PlanInput, RankView, RunnerStatus, ShutdownReason,
};
pub use previews::{previews, PreviewPlacement};
pub use request::{CollectiveBackend, Request, Sharding, DEFAULT_INSTANCE_ID};
