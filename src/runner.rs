//! `shoal runner`: one model instance in its own process, spoken to over stdin/stdout
//! (see `inference::runner` for the protocol and lifecycle).

use clap::Args;

/// Flags of `shoal runner`.
#[derive(Args, Debug)]
pub struct RunnerArgs {}

/// Serves the runner protocol on stdin/stdout; returns the exit code.
pub fn run(_args: RunnerArgs) -> i32 {
    inference::runner::serve(
        std::io::stdin(),
        std::io::stdout(),
        inference::runner::RunnerOptions::default(),
    )
}
