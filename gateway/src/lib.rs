//! Gateway: the HTTP APIs every node serves.

pub mod cluster_api;
