//! Mesh: how shoal nodes find each other and agree on one picture of the cluster, leaderless.
//!
//! The crate is split the way iroh-gossip is, and its folders say so:
//! - [`proto`]: the sans-IO core, in the style of iroh-gossip's `proto/` and quickwit's
//!   chitchat. A [`Replica`] holds the replicated state (records with one author each, merged
//!   per author and key by version, scuttlebutt style), heartbeats and a phi-accrual failure
//!   detector; it takes bytes and milliseconds in and sends through a [`Transport`]. The
//!   [`sim`]ulator drives hundreds of replicas in one process with a fake clock, a gossip
//!   overlay, loss and partitions. No tokio, no iroh, no OS clock.
//! - [`net`]: the iroh driver of one replica (endpoint, mDNS discovery, the gossip topic for
//!   fresh changes, anti-entropy on its own ALPN, the node's identity).
//! - [`host`]: facts about this machine that the node publishes (profile, interfaces, the
//!   verified edges its probes find), in placement's types.

pub mod host;
pub mod net;
pub mod proto;

pub use host::{gpu, interfaces, probe, profile};
pub use net::{Mesh, MeshOptions, StaticPeer};
pub use proto::id::NodeId;
pub use proto::replica::{Config, Event, Replica, Stats, WriteError};
pub use proto::sim;
pub use proto::transport::Transport;
