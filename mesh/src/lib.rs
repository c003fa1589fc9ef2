//! Mesh: how shoal nodes find each other and agree on one picture of the cluster, leaderless.
//!
//! The core is sans-IO, in the style of iroh-gossip's `proto/` and quickwit's chitchat: a
//! [`Replica`] holds the replicated state (records with one author each, merged per author and
//! key by version, scuttlebutt style), heartbeats and a phi-accrual failure detector; it takes
//! bytes and milliseconds in and sends through a [`Transport`]. The [`sim`] module drives
//! hundreds of replicas in one process with a fake clock, loss and partitions; the `net`
//! module drives one over iroh (gossip for fresh changes, anti-entropy on its own ALPN).

pub mod codec;
pub mod delta;
pub mod digest;
pub mod failure_detector;
pub mod id;
pub mod interfaces;
pub mod net;
pub mod probe;
pub mod profile;
pub mod record;
pub mod replica;
pub mod rng;
pub mod sim;
pub mod state;
pub mod transport;

pub use id::NodeId;
pub use net::{Mesh, MeshOptions, StaticPeer};
pub use replica::{Config, Event, Replica, Stats, WriteError};
pub use transport::Transport;
