//! The runner: one model instance, or one rank of it, in its own process (an MLX distributed
//! group lives and dies with its process), driven by its node over framed messages on
//! stdin/stdout ([`protocol`] has the messages and the lifecycle the node relies on).
//!
//! - **A ring of one**: `idle` → `loading {done, total}` → `loaded` → `warming_up` → `ready`
//!   ⇄ `running`.
//! - **A rank of a ring of n > 1**: `Connect` → `connecting` → `connected` (the ring joined
//!   under the node's deadline, or `failed` naming the neighbour that never came); `Load` →
//!   `loading` → `loaded` (its layer range for a pipeline, the whole model cut to its slice for
//!   tensor parallelism); `WarmUp` → `warming_up` → `ready`: rank 0 runs a one-token generation
//!   through the ring, the other ranks start serving the ring (their `ready` means "serving")
//!   and then only follow rank 0. Only rank 0 accepts `Generate`. `Shutdown` of rank 0 sends a
//!   stop around the ring, so every rank exits 0 on its own; a `Shutdown` of another rank exits
//!   it at once (its ring thread may be blocked inside MLX).
//! - Any fatal problem → `failed {reason}` and a non-zero exit: a ring that does not form, a
//!   load that fails or times out, a neighbour lost while serving or generating (rank 0's
//!   request in flight ends with an `Error` event first). Exit codes: 0 after a shutdown, 1
//!   after `failed`, 3 after a load timeout.
//!
//! Loading runs under a watchdog of `SHOAL_MODEL_LOAD_TIMEOUT` seconds (default 60) plus one
//! second per 5 GB of the shard, on every rank ([`crate::loader::Watchdog`]).
//!
//! The lifecycle is decided by a state machine without IO ([`core::RunnerCore`]: commands in,
//! events out); [`serve`] is the thin loop that reads frames, does the work it asks for and
//! writes its events ([`io`]).

pub mod core;
mod io;
pub mod process;
use wire::runner as protocol;

pub use crate::loader::{base_load_timeout, load_timeout, LOAD_TIMEOUT_ENV};
pub use io::{serve, RunnerOptions};
pub use process::{
    apply_fast_synch, exit_process, install_mlx_error_handler, parse_fast_synch, FAST_SYNCH_ENV,
    MLX_FAST_SYNCH_ENV,
};
