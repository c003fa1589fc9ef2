//! `shoal-test-hub`: the test hub as a program, for benchmarks and trying things by hand.
//!
//! - `shoal-test-hub serve API_ADDR CDN_ADDR org/name=DIR...`: serves each folder as a repo
//!   (`HF_ENDPOINT=http://API_ADDR`); prints the two addresses, serves until killed.
//! - `shoal-test-hub split SRC_DIR OUT_DIR PARTS`: splits `SRC_DIR/model.safetensors`.

use hub::testhub::{split::split, Faults, ServedRepo, TestHub};
use std::collections::BTreeMap;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: shoal-test-hub serve API_ADDR CDN_ADDR org/name=DIR...\n       shoal-test-hub split SRC_DIR OUT_DIR PARTS"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("split") if args.len() == 4 => {
            let Ok(parts) = args[3].parse() else {
                return usage();
            };
            match split(args[1].as_ref(), args[2].as_ref(), parts) {
                Ok(files) => {
                    println!("{}", files.join("\n"));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("serve") if args.len() >= 4 => serve(&args[1], &args[2], &args[3..]),
        _ => usage(),
    }
}

fn serve(api: &str, cdn: &str, repos: &[String]) -> ExitCode {
    let (Ok(api), Ok(cdn)) = (api.parse(), cdn.parse()) else {
        eprintln!("error: addresses are IP:PORT");
        return ExitCode::from(2);
    };
    let mut served = BTreeMap::new();
    for r in repos {
        let Some((id, dir)) = r.split_once('=') else {
            return usage();
        };
        match ServedRepo::from_dir(dir.as_ref(), false) {
            Ok(repo) => {
                served.insert(id.to_string(), repo);
            }
            Err(e) => {
                eprintln!("error: cannot read {dir}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        match TestHub::start(served, None, Faults::default(), api, cdn).await {
            Ok(hub) => {
                println!("api http://{} cdn http://{}", hub.api, hub.cdn);
                std::future::pending::<()>().await;
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot listen: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
