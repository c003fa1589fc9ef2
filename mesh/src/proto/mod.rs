//! The protocol core, sans-IO: the replicated state, its records, deltas and digests, the wire
//! codec, the failure detector and the [`replica::Replica`] that ties them together, plus the
//! [`sim`]ulator that drives hundreds of replicas in one process.
//!
//! Nothing here touches a socket, a clock or OS randomness: time comes in as milliseconds,
//! messages as bytes, and what must be sent goes out through a [`transport::Transport`]. That
//! is what lets the simulator and a table of cases drive the same code the node runs. This
//! folder never imports `net` (iroh, tokio) or `host` (the machine).

pub mod beat;
pub mod codec;
pub mod delta;
pub mod digest;
pub mod failure_detector;
pub mod id;
pub mod record;
pub mod replica;
pub mod rng;
pub mod sim;
pub mod state;
pub mod transport;
pub mod view;
