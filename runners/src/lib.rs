//! A node's runners, from the node's side: one runner process per instance the node holds a
//! rank of (`shoal runner`, serving the protocol of `wire::runner` on stdin/stdout).
//!
//! - [`settings`]: the node's settings for its runners, built once from its flags;
//! - [`supervisor`]: the node's handle on one such process (start it, send it lifecycle
//!   commands, queue generations, stop it);
//! - [`scheduler`]: the state machine between requesters and one runner (up to the batch's
//!   size at once, the rest FIFO in a bounded queue, cancellation, every request ending
//!   exactly once);
//! - [`table`]: [`Runners`], this node's runners by instance id, as chat routing, the model
//!   list and the API read them and as the node's executor drives them;
//! - [`relay`]: one request's runner events into the gateway's stream of chat events.
//!
//! **Why a crate of its own.** Supervising processes and scheduling requests onto them is a
//! job of its own with its own tests (the scheduler's table of cases); the binary only decides
//! (through the control plane) when to start, command and stop them.

pub mod relay;
pub mod scheduler;
pub mod settings;
pub mod supervisor;
pub mod table;

pub use settings::{RunnerSettings, DEFAULT_MAX_QUEUE, DEFAULT_STEP_TIMEOUT_S};
pub use supervisor::{RunnerCommand, Supervisor};
pub use table::{LocalRunner, Runners, SHUTDOWN_GRACE};
