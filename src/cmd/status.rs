//! `shoal status`: asks a node for its `/state` and prints the cluster as tables (nodes with
//! liveness and memory, verified edges, downloads: [`node::status::render`]) or as JSON.

use clap::Args;
use node::status::render;
use serde_json::Value;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `shoal status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The node to ask, as HOST:PORT or http://HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:52415")]
    pub api: String,
    /// Print the raw `/state` JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// The node's admin API key, when it requires one (`shoal --api-key`).
    #[arg(long, env = "SHOAL_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

fn resolve(api: &str) -> Result<SocketAddr, String> {
    let hostport = api
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches('/');
    hostport
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {api:?}: {e} (expected HOST:PORT)"))?
        .next()
        .ok_or_else(|| format!("{api:?} resolves to no address"))
}

/// Runs the command.
pub fn run(args: &StatusArgs) -> ExitCode {
    let result = (|| {
        let addr = resolve(&args.api)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let (status, body) = runtime
            .block_on(mesh::probe::http_get_with(
                addr,
                "/state",
                args.api_key.as_deref(),
                Duration::from_secs(5),
            ))
            .map_err(|e| {
                format!("cannot reach the node at {addr}: {e:#}; is `shoal` running there?")
            })?;
        if status == 401 || status == 403 {
            return Err(format!(
                "{addr} needs an admin API key: pass --api-key KEY (or set SHOAL_API_KEY)"
            ));
        }
        if status != 200 {
            return Err(format!("{addr} answered {status} to GET /state"));
        }
        let state: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("{addr} sent a /state that is not JSON: {e}"))?;
        Ok(if args.json {
            serde_json::to_string_pretty(&state).unwrap_or_default()
        } else {
            render(&state)
        })
    })();
    match result {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(resolve("http://127.0.0.1:52415/").unwrap().port(), 52415);
        assert!(resolve("no port").is_err());
    }
}
