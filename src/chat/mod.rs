//! Chat routing, in one place: pick the instance of the requested model by load
//! ([`pick`]), run it here when this node holds its rank 0 ([`local`]: render the prompt
//! ([`prompt`]), queue it on the runner, relay the runner's events ([`relay`])), else forward
//! it to the node that does ([`crate::forward`]).
//!
//! Chat goes to the ready instance of the model with the fewest queued requests.

pub mod local;
pub mod pick;
pub mod prompt;
pub mod relay;
pub mod tools_prompt;

pub use local::chat_here;
pub use pick::pick_instance;
