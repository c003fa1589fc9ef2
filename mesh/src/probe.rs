//! Reachability: every node probes each IPv4 address that each other live node advertises in
//! its profile with `GET http://IP:API_PORT/node_id`, and keeps an `edge/<node>/<ip>` record
//! only while the answer is that node's id. Loopback addresses and this node are never probed.

use crate::id::NodeId;
use crate::interfaces::{self, Interface, InterfaceKind};
use crate::net::Mesh;
use crate::profile::{NodeProfile, PROFILE_KEY};
use anyhow::{anyhow, bail};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Prefix of edge record keys.
pub const EDGE_PREFIX: &str = "edge/";

/// Failed probes in a row before an edge is removed.
pub const FAILURES_TO_REMOVE: u32 = 2;

/// A verified link from this node to another node's address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    /// The node that answered.
    pub to: String,
    /// The address it answered on.
    pub ip: Ipv4Addr,
    /// Its interface with that address.
    pub remote_interface: String,
    /// Kind of that interface.
    pub remote_kind: InterfaceKind,
    /// Our interface on the same subnet, if any.
    pub local_interface: Option<String>,
    /// Kind of our interface.
    pub local_kind: Option<InterfaceKind>,
}

/// The record key of the edge to `node` at `ip`.
pub fn edge_key(node: &NodeId, ip: Ipv4Addr) -> String {
    format!("{EDGE_PREFIX}{node}/{ip}")
}

/// One HTTP/1.1 GET (hyper) with a deadline; returns the status and at most 16 MiB of body.
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let request = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
        let driver = tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, addr.to_string())
            .body(http_body_util::Empty::<Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = http_body_util::Limited::new(response.into_body(), 16 << 20)
            .collect()
            .await
            .map_err(|e| anyhow!("reading the body: {e}"))?
            .to_bytes();
        driver.abort();
        Ok::<_, anyhow::Error>((status, body.to_vec()))
    };
    match tokio::time::timeout(timeout, request).await {
        Ok(result) => result,
        Err(_) => bail!("no answer from {addr} within {timeout:?}"),
    }
}

/// Asks `ip:port` for its node id.
pub async fn probe_node_id(ip: Ipv4Addr, port: u16, timeout: Duration) -> anyhow::Result<NodeId> {
    let (status, body) = http_get(SocketAddr::from((ip, port)), "/node_id", timeout).await?;
    if status != 200 {
        bail!("GET /node_id answered {status}");
    }
    let text: String = serde_json::from_slice(&body)?;
    Ok(text.parse()?)
}

/// What to probe: (node, its interface, its API port) for every other live node's advertised,
/// non-loopback IPv4 address that is not one of ours.
fn targets(mesh: &Mesh, own: &[Interface]) -> Vec<(NodeId, Interface, u16)> {
    let own_ips: BTreeSet<Ipv4Addr> = own.iter().map(|i| i.ip).collect();
    mesh.read(|replica, _| {
        let mut out = Vec::new();
        for (id, state) in &replica.state().nodes {
            if *id == replica.id() || !replica.is_alive(id) {
                continue;
            }
            let Some(profile) = state
                .records
                .get(PROFILE_KEY)
                .and_then(|r| r.value.as_deref())
                .and_then(|v| serde_json::from_str::<NodeProfile>(v).ok())
            else {
                continue;
            };
            for iface in profile.interfaces {
                if iface.ip.is_loopback()
                    || iface.ip.is_unspecified()
                    || own_ips.contains(&iface.ip)
                {
                    continue;
                }
                out.push((*id, iface, profile.api_port));
            }
        }
        out
    })
}

/// Probes forever every `period`, keeping this node's `edge/...` records up to date.
pub async fn run(mesh: Arc<Mesh>, period: Duration) {
    let mut failures: BTreeMap<String, u32> = BTreeMap::new();
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let own = interfaces::local_ipv4();
        let targets = targets(&mesh, &own);
        let mut probes = tokio::task::JoinSet::new();
        for (node, iface, port) in targets.iter().cloned() {
            probes.spawn(async move {
                let answer = probe_node_id(iface.ip, port, Duration::from_secs(1)).await;
                (node, iface, answer)
            });
        }
        let wanted: BTreeSet<String> = targets.iter().map(|(n, i, _)| edge_key(n, i.ip)).collect();
        while let Some(Ok((node, iface, answer))) = probes.join_next().await {
            let key = edge_key(&node, iface.ip);
            match answer {
                Ok(answered) if answered == node => {
                    failures.remove(&key);
                    let local = own.iter().find(|l| l.same_subnet(iface.ip));
                    let edge = Edge {
                        to: node.to_string(),
                        ip: iface.ip,
                        remote_interface: iface.name.clone(),
                        remote_kind: iface.kind,
                        local_interface: local.map(|l| l.name.clone()),
                        local_kind: local.map(|l| l.kind),
                    };
                    if let Err(e) = mesh.set(&key, &edge) {
                        tracing::warn!("cannot record edge {key}: {e:#}");
                    }
                }
                other => {
                    if let Ok(wrong) = other {
                        tracing::debug!(%key, answered = %wrong.short(), "another node answered");
                    }
                    let count = failures.entry(key.clone()).or_insert(0);
                    *count += 1;
                    if *count >= FAILURES_TO_REMOVE && mesh.delete(&key) {
                        tracing::info!(%key, "edge stopped answering: removed");
                    }
                }
            }
        }
        // Edges to nodes that died or addresses no longer advertised.
        for key in mesh.own_keys(EDGE_PREFIX) {
            if !wanted.contains(&key) {
                mesh.delete(&key);
                failures.remove(&key);
            }
        }
    }
}
