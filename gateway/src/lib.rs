//! Gateway: the HTTP APIs every node serves.
