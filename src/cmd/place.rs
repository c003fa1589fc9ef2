//! `shoal place`: a placement computed offline from a JSON description of a cluster.

use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `shoal place`.
#[derive(Args, Debug)]
pub struct PlaceArgs {
    /// JSON input file, or `-` for stdin.
    #[arg(long, short)]
    input: PathBuf,
}

/// Reads the input (a file, or stdin for `-`), prints the placement or error as JSON, and
/// exits 0, or 2 on malformed input (see the `placement` crate's docs).
pub fn run(args: &PlaceArgs) -> ExitCode {
    use std::io::Read;
    let text = if args.input.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map(|_| text)
    } else {
        std::fs::read_to_string(&args.input)
    };
    let text = match text {
        Ok(text) => text,
        Err(error) => {
            eprintln!("shoal place: cannot read {}: {error}", args.input.display());
            return ExitCode::from(2);
        }
    };
    let (stdout, code) = placement::cli::run(&text);
    print!("{stdout}");
    ExitCode::from(u8::try_from(code).unwrap_or(2))
}
