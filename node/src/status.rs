//! `shoal status`'s tables, from a node's `/state` document: nodes with liveness and memory,
//! verified edges with the kind of interface at each end, and each node's model downloads (its
//! `download/<model>/<part>` records). Plain text from plain JSON, so the command (`cmd/status.rs`
//! in the binary) only fetches and prints, and the rendering is tested here.

use control::{DownloadRecord, DownloadState, DOWNLOAD_PREFIX};
use serde::Deserialize as _;
use serde_json::Value;
use std::fmt::Write as _;

fn short(id: &str) -> &str {
    id.get(..10).unwrap_or(id)
}

fn gib(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), |b| {
        format!("{:.1}", b as f64 / (1u64 << 30) as f64)
    })
}

/// Formats a `/state` document as tables.
pub fn render(state: &Value) -> String {
    let mut out = String::new();
    let empty = serde_json::Map::new();
    let nodes = state["nodes"].as_object().unwrap_or(&empty);
    let me = state["node_id"].as_str().unwrap_or("");
    let _ = writeln!(
        out,
        "cluster seen from {} (digest {})",
        short(me),
        state["digest"].as_str().unwrap_or("-")
    );
    let _ = writeln!(out, "\nNODES");
    let _ = writeln!(
        out,
        "{:<12} {:<16} {:<6} {:>6} {:>14} {:<9} {:<28} INTERFACES",
        "ID", "NAME", "ALIVE", "PHI", "MEM GiB", "BACKEND", "GPU (free/total GiB)"
    );
    let mut edges = Vec::new();
    for (id, node) in nodes {
        let records = &node["records"];
        let profile = &records["profile"];
        let live = &state["liveness"][id];
        let alive = if live["alive"].as_bool().unwrap_or(false) {
            "yes"
        } else {
            "DEAD"
        };
        let phi = live["phi"]
            .as_f64()
            .map_or("-".into(), |p| format!("{p:.1}"));
        let memory = format!(
            "{}/{}",
            gib(profile["memory_available"].as_u64()),
            gib(profile["memory_total"].as_u64())
        );
        // The best backend first (`mlx_cuda`/`mlx_metal` when the node's MLX drives its GPU).
        let backend = profile["backends"][0].as_str().unwrap_or("-");
        let gpus: Vec<String> = profile["gpus"]
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|g| {
                        format!(
                            "{} {}/{}",
                            g["name"].as_str().unwrap_or("?"),
                            gib(g["memory_free"].as_u64()),
                            gib(g["memory_total"].as_u64())
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let gpus = if gpus.is_empty() {
            "-".to_string()
        } else {
            gpus.join(", ")
        };
        let interfaces: Vec<String> = profile["interfaces"]
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|i| {
                        format!(
                            "{}={}({})",
                            i["name"].as_str().unwrap_or("?"),
                            i["ip"].as_str().unwrap_or("?"),
                            i["kind"].as_str().unwrap_or("?")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let marker = if id == me { "*" } else { "" };
        let _ = writeln!(
            out,
            "{:<12} {:<16} {:<6} {:>6} {:>14} {:<9} {:<28} {}",
            format!("{}{marker}", short(id)),
            profile["name"].as_str().unwrap_or("?"),
            alive,
            phi,
            memory,
            backend,
            gpus,
            interfaces.join(" ")
        );
        if let Some(map) = records.as_object() {
            for (key, edge) in map.iter().filter(|(k, _)| k.starts_with("edge/")) {
                let _ = key;
                edges.push((id.clone(), edge.clone()));
            }
        }
    }
    let _ = writeln!(out, "\nEDGES ({})", edges.len());
    let _ = writeln!(
        out,
        "{:<12} {:<12} {:<16} {:<24} REMOTE",
        "FROM", "TO", "IP", "LOCAL"
    );
    for (from, edge) in edges {
        let local = format!(
            "{}({})",
            edge["local_interface"].as_str().unwrap_or("?"),
            edge["local_kind"].as_str().unwrap_or("?")
        );
        let remote = format!(
            "{}({})",
            edge["remote_interface"].as_str().unwrap_or("?"),
            edge["remote_kind"].as_str().unwrap_or("?")
        );
        let _ = writeln!(
            out,
            "{:<12} {:<12} {:<16} {:<24} {}",
            short(&from),
            short(edge["to"].as_str().unwrap_or("?")),
            edge["ip"].as_str().unwrap_or("?"),
            local,
            remote
        );
    }
    render_downloads(&mut out, nodes);
    out
}

/// The DOWNLOADS table: one row per `download/<model>/<part>` record of any node.
fn render_downloads(out: &mut String, nodes: &serde_json::Map<String, Value>) {
    let rows: Vec<(&String, DownloadRecord)> = nodes
        .iter()
        .flat_map(|(id, node)| {
            node["records"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| k.starts_with(DOWNLOAD_PREFIX))
                .filter_map(move |(_, v)| Some((id, DownloadRecord::deserialize(v).ok()?)))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nDOWNLOADS ({})", rows.len());
    let _ = writeln!(
        out,
        "{:<12} {:<40} {:<11} {:>21} {:>10} {:>6} {:<12} FILE",
        "NODE", "MODEL / PART", "STATE", "DONE MB", "MB/s", "ETA", "FROM"
    );
    let mb = |bytes: f64| bytes / 1e6;
    for (id, r) in rows {
        let (done, total) = (mb(r.done as f64), mb(r.total as f64));
        let pct = if total > 0.0 {
            100.0 * done / total
        } else {
            0.0
        };
        let eta = r
            .eta_s
            .filter(|_| r.state == DownloadState::Downloading)
            .map_or("-".into(), |s| format!("{s:.0}s"));
        let from = Some(r.from.as_str())
            .filter(|f| !f.is_empty())
            .unwrap_or("-");
        // A member's node id is shortened; a hub endpoint is shown as it is.
        let from = if from.len() == 64 && from.bytes().all(|b| b.is_ascii_hexdigit()) {
            short(from)
        } else {
            from
        };
        let state = match r.error {
            Some(_) => DownloadState::Failed,
            None => r.state,
        };
        let _ = writeln!(
            out,
            "{:<12} {:<40} {:<11} {:>21} {:>10.1} {:>6} {:<12} {}",
            short(id),
            format!("{} / {}", r.model, r.part),
            state.name(),
            format!("{done:.1}/{total:.1} ({pct:.0}%)"),
            mb(r.rate_bytes_per_s),
            eta,
            from,
            r.error.as_deref().or(r.file.as_deref()).unwrap_or("-")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_nodes_and_edges() {
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let state = serde_json::json!({
            "node_id": a,
            "digest": "0123",
            "nodes": {
                a.clone(): {"generation": 1, "max_version": 3, "records": {
                    "profile": {"name": "alpha", "memory_total": 8u64 << 30, "memory_available": 4u64 << 30,
                                "interfaces": [{"name": "eth0", "ip": "10.0.0.1", "prefix": 24, "kind": "ethernet"}]},
                    format!("edge/{b}/10.0.0.2"): {"to": b, "ip": "10.0.0.2", "remote_interface": "eth0",
                        "remote_kind": "thunderbolt-net", "local_interface": "tb0", "local_kind": "thunderbolt-net"}
                }},
                b.clone(): {"generation": 1, "max_version": 1, "records": {"profile": {"name": "beta",
                    "backends": ["mlx_cuda", "mlx_cpu"],
                    "gpus": [{"vendor": "nvidia", "name": "NVIDIA H200", "memory_total": 140u64 << 30, "memory_free": 130u64 << 30}]}}}
            },
            "liveness": {a.clone(): {"alive": true, "phi": null}, b.clone(): {"alive": false, "phi": 9.5}}
        });
        let text = render(&state);
        assert!(text.contains("alpha"));
        assert!(text.contains("4.0/8.0"));
        assert!(text.contains("DEAD"));
        assert!(text.contains("EDGES (1)"));
        assert!(text.contains("tb0(thunderbolt-net)"));
        assert!(text.contains("eth0=10.0.0.1(ethernet)"));
        assert!(text.contains("mlx_cuda"), "{text}");
        assert!(text.contains("NVIDIA H200 130.0/140.0"), "{text}");
        assert!(!text.contains("DOWNLOADS"), "{text}");
    }

    #[test]
    fn renders_downloads() {
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let state = serde_json::json!({
            "node_id": a,
            "nodes": {a.clone(): {"records": {
                "download/org/m/layers-0-15-of-30": {"model": "org/m", "part": "layers-0-15-of-30",
                    "state": "downloading", "done": 50_000_000u64, "total": 200_000_000u64,
                    "rate_bytes_per_s": 25_000_000.0, "eta_s": 6.0, "from": b,
                    "file": "model-00001-of-00003.safetensors"},
                "download/org/m/support": {"model": "org/m", "part": "support", "state": "failed",
                    "done": 0, "total": 0, "from": "https://huggingface.co", "error": "gated"}
            }}},
            "liveness": {}
        });
        let text = render(&state);
        assert!(text.contains("DOWNLOADS (2)"), "{text}");
        assert!(text.contains("org/m / layers-0-15-of-30"), "{text}");
        assert!(text.contains("50.0/200.0 (25%)"), "{text}");
        assert!(text.contains("25.0"), "{text}");
        assert!(text.contains(" 6s "), "{text}");
        assert!(text.contains("bbbbbbbbbb "), "{text}");
        assert!(text.contains("model-00001-of-00003.safetensors"), "{text}");
        assert!(text.contains("failed") && text.contains("gated"), "{text}");
    }
}
