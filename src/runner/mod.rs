//! The runner, from the node's side and from its own.
//!
//! - [`process`]: `shoal runner`, the process itself (one model instance, or one rank of
//!   it, serving `inference::runner`'s protocol on stdin/stdout);
//! - [`settings`]: the node's settings for its runners, built once from its flags;
//! - [`supervisor`]: the node's handle on one such process (start it, send it lifecycle
//!   commands, queue generations, stop it);
//! - [`scheduler`]: the state machine between requesters and one runner (up to the batch's
//!   size at once, the rest FIFO in a bounded queue, cancellation, every request ending
//!   exactly once).
//!
//! - [`table`]: this node's runners as their readers (routing, the model list, the API) see
//!   them; the table ([`table::LocalRunner`]) is driven by the executor ([`crate::reconcile`]).

pub mod process;
pub mod scheduler;
pub mod settings;
pub mod supervisor;
pub mod table;

pub use process::{run, RunnerArgs};
pub use settings::{RunnerSettings, DEFAULT_MAX_QUEUE, DEFAULT_STEP_TIMEOUT_S};
pub use supervisor::{RunnerCommand, Supervisor};
