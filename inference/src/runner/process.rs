//! What a runner process sets up and how it ends: MLX's fast-synch setting, MLX's error
//! handler, and the exit that skips C++ static destructors.

use crate::error::Result;

pub use wire::runner::env::FAST_SYNCH_ENV;

/// The variable MLX reads. It matters to the JACCL backend over Thunderbolt on macOS; on Linux
/// (the ring backend over TCP) nothing reads it: the setting only reaches MLX's environment.
pub const MLX_FAST_SYNCH_ENV: &str = "MLX_METAL_FAST_SYNCH";

/// Parses a fast-synch setting; `None` for anything else (left to MLX's default).
pub fn parse_fast_synch(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

/// Passes a fast-synch choice (`Some(true)`/`Some(false)`, or `None` for
/// [`FAST_SYNCH_ENV`]'s value, if any) on to MLX's environment. Call before MLX starts.
pub fn apply_fast_synch(choice: Option<bool>) {
    let choice = choice.or_else(|| {
        std::env::var(FAST_SYNCH_ENV)
            .ok()
            .and_then(|v| parse_fast_synch(&v))
    });
    if let Some(on) = choice {
        // Set before MLX or any other thread starts (`shoal runner` calls this first).
        std::env::set_var(MLX_FAST_SYNCH_ENV, if on { "1" } else { "0" });
    }
}

/// Makes sure MLX reports errors to mlx-rs (which returns them as `Err`) instead of its
/// default handler, which prints and calls `exit(-1)`. mlx-rs installs its handler before its
/// first operation; this runs one so that it is in place before anything else happens.
pub fn install_mlx_error_handler() -> Result<()> {
    let a = mlx_rs::Array::from_f32(1.0);
    let b = mlx_rs::ops::add(&a, &a)?;
    b.eval()?;
    Ok(())
}

/// Ends a runner process with `code` once [`super::serve`] has returned, without C++ static
/// destructors.
///
/// MLX's stream threads (and a ring's socket threads) can still be running then, and the
/// `exit()` path destroys MLX's globals under them, which now and then aborts: `runner_ring`
/// saw a clean shutdown end in SIGABRT about once in 30 runs on a loaded 2-core machine.
/// Everything the runner owes its node has been written by then, so flush the standard streams
/// and leave with `_exit`.
pub fn exit_process(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    #[cfg(unix)]
    // SAFETY: `_exit` ends the process; nothing runs after it.
    unsafe {
        libc::_exit(code)
    }
    #[cfg(not(unix))]
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_synch_settings_parse() {
        for on in ["1", "true", "ON", " yes "] {
            assert_eq!(parse_fast_synch(on), Some(true), "{on}");
        }
        for off in ["0", "false", "Off", "no"] {
            assert_eq!(parse_fast_synch(off), Some(false), "{off}");
        }
        assert_eq!(parse_fast_synch("maybe"), None);
        assert_eq!(parse_fast_synch(""), None);
    }
}
