//! Mesh: discovery, replicated state and liveness over iroh.
