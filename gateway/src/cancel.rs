//! `POST /v1/cancel/{id}`: the generations this node's gateway is answering, by the id their
//! answer carries (`chatcmpl-...`, `msg_...`, `resp_...`), so that a client can stop one
//! from another connection. Cancelling ends the answer normally (its finish reason `stop`,
//! with the text so far) and stops the generation wherever it runs: the backend's
//! cancellation token reaches a forwarded request's rank-0 node too.
//!
//! Each entry lives as long as its answer, so the table is bounded by the requests in flight.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The running generations, shared by every connection of one server.
#[derive(Debug, Clone, Default)]
pub struct Running(Arc<Mutex<BTreeMap<String, CancellationToken>>>);

/// An entry of [`Running`], removed when dropped.
#[derive(Debug)]
pub struct Registration {
    running: Running,
    id: String,
}

impl Running {
    /// Registers `id` until the returned registration is dropped.
    pub fn register(&self, id: &str, token: CancellationToken) -> Registration {
        if let Ok(mut map) = self.0.lock() {
            map.insert(id.to_string(), token);
        }
        Registration {
            running: self.clone(),
            id: id.to_string(),
        }
    }

    /// Cancels `id`; false if no such generation is running here.
    pub fn cancel(&self, id: &str) -> bool {
        let token = self.0.lock().ok().and_then(|map| map.get(id).cloned());
        token.map(|t| t.cancel()).is_some()
    }

    /// How many generations are registered.
    pub fn len(&self) -> usize {
        self.0.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut map) = self.running.0.lock() {
            map.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_live_as_long_as_their_registration() {
        let running = Running::default();
        let token = CancellationToken::new();
        let entry = running.register("a", token.clone());
        assert_eq!(running.len(), 1);
        assert!(!running.cancel("b"));
        assert!(running.cancel("a"));
        assert!(token.is_cancelled());
        drop(entry);
        assert!(running.is_empty());
        assert!(!running.cancel("a"));
    }
}
