//! Reachability: every node probes each IPv4 address that each other live node advertises in
//! its profile with `GET http://IP:API_PORT/node_id`, and keeps an `edge/<node>/<ip>` record
//! only while the answer is that node's id. Loopback addresses and this node are never probed.

use crate::host::interfaces::{self, Interface, InterfaceKind};
use crate::host::profile::{HostProfile, PROFILE_KEY};
use crate::net::Mesh;
use crate::proto::id::NodeId;
use anyhow::{anyhow, bail};
use bytes::Bytes;
use http_body_util::BodyExt;
use placement::{Edge, Link};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Prefix of edge record keys.
pub const EDGE_PREFIX: &str = "edge/";

/// Failed probes in a row before an edge is removed.
pub const FAILURES_TO_REMOVE: u32 = 2;

/// The published record of a verified link: placement's [`Edge`] (this node → the node that
/// answered, at the address it answered on) plus the interfaces at both ends, which operators
/// see in `shoal status`. In JSON it is one flat object: `{"from", "to", "ip",
/// "remote_interface", "remote_kind", "local_interface", "local_kind"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeRecord {
    /// The link as placement takes it.
    #[serde(flatten)]
    pub edge: Edge,
    /// The remote node's interface with that address.
    pub remote_interface: String,
    /// Kind of that interface.
    pub remote_kind: InterfaceKind,
    /// Our interface on the same subnet, if any.
    pub local_interface: Option<String>,
    /// Kind of our interface.
    pub local_kind: Option<InterfaceKind>,
}

impl EdgeRecord {
    /// The edge as placement takes it, if `author` (who wrote and signed the record) is the
    /// edge's `from`: a node can only vouch for links it verified itself.
    pub fn placement_edge(&self, author: &str) -> Option<Edge> {
        (self.edge.from == author).then(|| self.edge.clone())
    }
}

/// The record key of the edge to `node` at `ip`.
pub fn edge_key(node: &NodeId, ip: IpAddr) -> String {
    format!("{EDGE_PREFIX}{node}/{ip}")
}

/// One HTTP/1.1 GET (hyper) with a deadline; returns the status and at most 16 MiB of body.
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<(u16, Vec<u8>)> {
    http_get_with(addr, path, None, timeout).await
}

/// [`http_get`] with `Authorization: Bearer KEY` when `bearer` is given (a node that
/// requires API keys).
pub async fn http_get_with(
    addr: SocketAddr,
    path: &str,
    bearer: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let request = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
        let driver = tokio::spawn(connection);
        let mut request = hyper::Request::get(path).header(hyper::header::HOST, addr.to_string());
        if let Some(key) = bearer {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let request = request.body(http_body_util::Empty::<Bytes>::new())?;
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
pub async fn probe_node_id(ip: IpAddr, port: u16, timeout: Duration) -> anyhow::Result<NodeId> {
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
    let own_ips: BTreeSet<IpAddr> = own.iter().map(|i| i.link.ip).collect();
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
                .and_then(|v| serde_json::from_str::<HostProfile>(v).ok())
            else {
                continue;
            };
            for iface in profile.interfaces {
                let ip = iface.link.ip;
                if ip.is_loopback() || ip.is_unspecified() || own_ips.contains(&ip) {
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
                let answer = probe_node_id(iface.link.ip, port, Duration::from_secs(1)).await;
                (node, iface, answer)
            });
        }
        let wanted: BTreeSet<String> = targets
            .iter()
            .map(|(n, i, _)| edge_key(n, i.link.ip))
            .collect();
        while let Some(Ok((node, iface, answer))) = probes.join_next().await {
            let key = edge_key(&node, iface.link.ip);
            match answer {
                Ok(answered) if answered == node => {
                    failures.remove(&key);
                    let local = own.iter().find(|l| l.same_subnet(iface.link.ip));
                    let edge = EdgeRecord {
                        edge: Edge {
                            from: mesh.id().to_string(),
                            to: node.to_string(),
                            link: Link::Ip(iface.link.ip),
                        },
                        remote_interface: iface.link.name.clone(),
                        remote_kind: iface.link.kind,
                        local_interface: local.map(|l| l.link.name.clone()),
                        local_kind: local.map(|l| l.link.kind),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(from: &str) -> EdgeRecord {
        EdgeRecord {
            edge: Edge {
                from: from.into(),
                to: "b".into(),
                link: Link::Ip("10.0.0.2".parse().unwrap()),
            },
            remote_interface: "eth0".into(),
            remote_kind: InterfaceKind::Ethernet,
            local_interface: Some("tb4".into()),
            local_kind: Some(InterfaceKind::Thunderbolt),
        }
    }

    #[test]
    fn edge_records_are_flat_json_and_only_their_author_vouches_for_them() {
        let r = record("a");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "from": "a", "to": "b", "ip": "10.0.0.2",
                "remote_interface": "eth0", "remote_kind": "ethernet",
                "local_interface": "tb4", "local_kind": "thunderbolt",
            })
        );
        assert_eq!(serde_json::from_value::<EdgeRecord>(json).unwrap(), r);
        assert_eq!(r.placement_edge("a"), Some(r.edge.clone()));
        assert_eq!(record("c").placement_edge("a"), None);
        let key = edge_key(&NodeId::from_index(1), "10.0.0.2".parse().unwrap());
        assert!(key.starts_with(EDGE_PREFIX) && key.ends_with("/10.0.0.2"));
    }
}
