//! The subcommands besides running a node, one file each: `place`, `status`, `generate` (and
//! its several-streams form for benchmarks),
//! `download`, `secret`, `service` (a user service of the node), and the hidden `runner` (one model instance's process, started by
//! its node). `shoal bench` is its own crate (`bench`).

pub mod download;
pub mod generate;
pub mod generate_streams;
pub mod place;
pub mod runner;
pub mod secret;
pub mod service;
pub mod status;

use std::process::ExitCode;

/// A command's exit status: success, or its error (with its causes) on stderr and failure.
pub fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
