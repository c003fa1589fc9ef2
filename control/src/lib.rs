//! shoal's control plane: what each node should do, given the replicated state. Pure
//! functions over plain data, with no IO, no clock and no async runtime, so that every node
//! reaches the same conclusions from the same state and tests can drive it by table or
//! under the mesh simulator.
//!
//! * [`intent`]: the records nodes write (`instance/<id>`, `deleted/<id>`, `runner/<id>`) and
//!   the rules every node applies to them (the effective copy, re-placement, ring ids).
//! * [`Snapshot`]: the state at one moment as plain data (authors, their liveness, their
//!   records); [`InstanceView`]: one live instance with its placement, rank statuses and the
//!   start-up plan of a rank.
//! * [`commitments`]: the memory live instances hold on each node, taken off what a new
//!   placement may use.
//! * [`fetch`]: the part of a model each rank reads and where this node's fetch of it stands.
//! * [`files`]: the records of models' files (`download/<model>/<part>`, `files/<repo>`).
//! * [`PlacementCache`]: each placement computed once per (instance, epoch) and kept.
//! * [`reconcile()`] and [`publish`]: the decisions of one reconcile pass, as [`Effect`]s
//!   that the node's executor (`src/executor.rs` in the binary) applies.
//!
//! # DESIGN note: what lives here and what in `placement`
//! Worker planning ([`placement::next_action`]) stays in the placement crate. It is a rule
//! over [`placement::PlanInput`] and [`placement::RunnerStatus`], the lifecycle type the
//! runner protocol and the state already share from placement; moving the rule here would
//! split the lifecycle type from the one rule that orders it, and placement's own table
//! tests of the rule (placement/tests/planning.rs) would have to follow. This crate is the
//! layer above: it knows the records, the snapshot and the node's runners, and it calls
//! `next_action` for each rank the node holds. The dependency runs one way
//! (control → placement), and both stay free of IO.
//!
//! The adapters that read a mesh replica into a [`Snapshot`] and mesh profiles into
//! placement's node profiles stay in the binary (`src/mesh_state.rs`), so this crate does not
//! depend on the mesh (the mesh simulator is only a dev-dependency, for the simulation test).
//!
//! Concurrent writes are ordered without clocks: two copies of one instance are ordered by
//! descent first (a later copy that leaves out at least as much supersedes), then (fewest
//! exclusions, epoch, exclusions) ([`intent::effective`]); different instances
//! are independent and listed by id. Every node picks the same winner whatever order the
//! records arrived in.

pub mod cache;
pub mod commitments;
pub mod fetch;
pub mod files;
#[cfg(any(test, feature = "test-support"))]
pub mod fixture;
pub mod intent;
pub mod reconcile;
pub mod snapshot;
pub mod view;

pub use cache::PlacementCache;
pub use fetch::{Fetch, FetchState, Part};
pub use files::{
    DownloadKey, DownloadRecord, DownloadState, HeldFile, Holding, DOWNLOAD_PREFIX, FILES_PREFIX,
};
pub use intent::{
    effective, instance_slug, DeletedRecord, InstanceRecord, Intent, RunnerRecord, DELETED_PREFIX,
    INSTANCE_PREFIX, KEEP_DELETIONS, RUNNER_PREFIX,
};
pub use reconcile::{
    publish, reconcile, ring_hosts, Effect, LifecycleCommand, LocalRunners, ModelFile, RunnerFacts,
};
pub use snapshot::{settling, Author, Snapshot, SETTLE_AFTER_RETURN_MS};
pub use view::{short, InstanceView};
