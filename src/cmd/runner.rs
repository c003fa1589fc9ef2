//! `shoal runner`: one model instance (or one rank of it) in its own process, spoken to over
//! stdin/stdout (see `inference::runner` for the protocol and lifecycle).

use clap::Args;

/// Flags of `shoal runner`.
#[derive(Args, Debug)]
pub struct RunnerArgs {
    /// Ask MLX for fast synchronisation (`MLX_METAL_FAST_SYNCH=1`). It matters to the JACCL
    /// backend over Thunderbolt on macOS; on Linux it only reaches MLX's environment. Without
    /// either flag, `SHOAL_FAST_SYNCH` (1/0, true/false, on/off) decides, if set.
    #[arg(long, overrides_with = "no_fast_synch")]
    pub fast_synch: bool,

    /// Ask MLX not to use fast synchronisation (`MLX_METAL_FAST_SYNCH=0`).
    #[arg(long, overrides_with = "fast_synch")]
    pub no_fast_synch: bool,
}

/// Serves the runner protocol on stdin/stdout; returns the exit code.
pub fn run(args: RunnerArgs) -> i32 {
    let choice = match (args.fast_synch, args.no_fast_synch) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    };
    inference::runner::apply_fast_synch(choice);
    inference::runner::serve(
        std::io::stdin(),
        std::io::stdout(),
        inference::runner::RunnerOptions::default(),
    )
}
