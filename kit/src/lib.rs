//! The test kit: what shoal's integration tests, `cargo xtask` and `shoal bench` share.
//!
//! Why a crate of its own: these helpers used to be shared by `#[path]` includes of xtask
//! files (the namespace code, the runner-state reader) and written again where an include did
//! not fit (the cache directory was resolved in five places, with different fallbacks). One
//! crate gives each helper one home, one set of tests, and a name every user imports.
//!
//! - [`dirs`]: the one resolver of shoal's cache, data and config directories, the default
//!   model and the Python venv (the node uses it too).
//! - [`netns`]: local clusters in Linux network namespaces.
//! - [`release_tarball`]: the relocatable release `cargo xtask dist` writes and its test
//!   unpacks.
//! - [`skip`]: how a test that cannot run says so: it fails, or is skipped visibly and counted.
//! - [`node_process`]: a `shoal` node process in a namespace, as the tests and the xtask's
//!   testbed start it.
//! - [`state_view`], [`runner_states`], [`instances`]: reading nodes, links, runners and
//!   instances out of the cluster API.
//! - [`sse`]: the server-sent-events reader of chat streams.
//! - [`client`], [`blocking`]: a typed client of the cluster API (also into a namespace), async
//!   and blocking; [`timing`]: a streamed chat timed as `shoal bench` reports it.
//!
//! Without the default `api` feature the kit is std and libc only (directories, namespaces,
//! skips).

pub mod dirs;
pub mod netns;
pub mod release_tarball;
pub mod skip;

#[cfg(feature = "api")]
pub mod blocking;
#[cfg(feature = "api")]
pub mod client;
#[cfg(feature = "api")]
pub mod instances;
#[cfg(feature = "api")]
pub mod node_process;
#[cfg(feature = "api")]
pub mod runner_states;
#[cfg(feature = "api")]
pub mod sse;
#[cfg(feature = "api")]
pub mod state_view;
#[cfg(feature = "api")]
pub mod timing;
