//! `POST /v1/cancel/{id}`: the generations this node's gateway is answering, by the id their
//! answer carries (`chatcmpl-...`, `msg_...`, `resp_...`), so that a client can stop one
//! from another connection. Cancelling ends the answer normally (its finish reason `stop`,
//! with the text so far) and stops the generation wherever it runs: the backend's
//! cancellation token reaches a forwarded request's rank-0 node too.
//!
//! Only the caller that started a generation may cancel it: on a node with API keys, a cancel
//! presenting another key (or none) is answered exactly as an unknown id is (404
//! `request_not_found`), so that an id seen in a log or guessed confirms nothing to a holder of
//! another key. On a node without keys anyone may cancel, as before.
//!
//! Each entry lives as long as its answer, so the table is bounded by the requests in flight.

use crate::access::Caller;
use crate::body::{json_response, GatewayBody};
use crate::error::{echo, ApiError, ErrorKind};
use hyper::{Response, StatusCode};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The running generations, shared by every connection of one server.
#[derive(Debug, Clone, Default)]
pub struct Running(Arc<Mutex<BTreeMap<String, (CancellationToken, Caller)>>>);

/// An entry of [`Running`], removed when dropped.
#[derive(Debug)]
pub struct Registration {
    running: Running,
    id: String,
}

impl Running {
    /// Registers `id`, started by `owner`, until the returned registration is dropped.
    pub fn register(&self, id: &str, token: CancellationToken, owner: Caller) -> Registration {
        if let Ok(mut map) = self.0.lock() {
            map.insert(id.to_string(), (token, owner));
        }
        Registration {
            running: self.clone(),
            id: id.to_string(),
        }
    }

    /// Cancels `id` for `caller`; false if no such generation is running here or another
    /// caller started it (the two are not told apart, see the module docs).
    pub fn cancel(&self, id: &str, caller: &Caller) -> bool {
        let token = self.0.lock().ok().and_then(|map| {
            map.get(id)
                .filter(|(_, owner)| caller.may_act_for(owner))
                .map(|(token, _)| token.clone())
        });
        token.map(|t| t.cancel()).is_some()
    }

    /// `POST /v1/cancel/{id}` from `caller`: 200 `{"id", "cancelled": true}`, or 404
    /// `request_not_found` for an id that is not running here or that another key started.
    pub fn answer_cancel(
        &self,
        id: &str,
        caller: &Caller,
    ) -> Result<Response<GatewayBody>, ApiError> {
        if !self.cancel(id, caller) {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!(
                    "no request `{}` of yours is running on this node; cancel a request on \
                     the node that received it, with the id its answer carries and the API key \
                     that started it",
                    echo(id)
                ),
            )
            .with_code("request_not_found"));
        }
        Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"id": id, "cancelled": true}),
        ))
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
        let anyone = Caller::default();
        let entry = running.register("a", token.clone(), anyone);
        assert_eq!(running.len(), 1);
        assert!(!running.cancel("b", &anyone));
        assert!(running.cancel("a", &anyone));
        assert!(token.is_cancelled());
        drop(entry);
        assert!(running.is_empty());
        assert!(!running.cancel("a", &anyone));
    }

    #[test]
    fn only_the_key_that_started_a_generation_cancels_it() {
        let policy = crate::access::AccessPolicy::new(
            &[],
            &[
                "chat-key-a-0123456789".into(),
                "chat-key-b-0123456789".into(),
            ],
            &[],
        )
        .unwrap();
        let caller = |key: &str| {
            let mut h = hyper::HeaderMap::new();
            h.insert("x-api-key", key.parse().unwrap());
            policy
                .authorize(crate::access::Scope::Chat, &h, None)
                .unwrap()
        };
        let (a, b) = (
            caller("chat-key-a-0123456789"),
            caller("chat-key-b-0123456789"),
        );
        let running = Running::default();
        let token = CancellationToken::new();
        let _entry = running.register("chatcmpl-1", token.clone(), a);
        assert!(!running.cancel("chatcmpl-1", &b), "another key");
        assert!(!running.cancel("chatcmpl-1", &Caller::default()), "no key");
        assert!(!token.is_cancelled());
        assert!(running.cancel("chatcmpl-1", &a));
        assert!(token.is_cancelled());
    }
}
