//! Facts about this machine that the node publishes in its own records: its profile (memory,
//! CPU, backends), its network interfaces and their kind, and the verified edges that the
//! reachability probes find. These are the records placement reads, in placement's own types.

pub mod gpu;
pub mod interfaces;
pub mod probe;
pub mod profile;
