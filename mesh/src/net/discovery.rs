//! mDNS discovery on every local IPv4 interface (iroh's stock lookup only uses the default
//! route's interface, so a second link such as a Thunderbolt cable would never be seen), under
//! a service name derived from the cluster namespace. Interfaces that appear later (a cable
//! plugged in) are added, ones that vanish are removed.

use crate::host::interfaces;
use crate::proto::id::NodeId;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;
use swarm_discovery::{Discoverer, DropGuard};
use tokio::sync::mpsc;

/// A node found by mDNS: its id and the addresses of its mesh endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The node.
    pub id: NodeId,
    /// Its endpoint's addresses.
    pub addrs: Vec<SocketAddr>,
}

/// The mDNS service name of a namespace: `shoal-` and 8 hex digits of a hash of it, so any
/// namespace text gives a valid, short DNS label and clusters stay apart.
pub fn service_name(namespace: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in namespace.as_bytes() {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("shoal-{hash:08x}")
}

/// A running discovery; dropping it stops the announcements.
pub struct Discovery {
    _guard_task: tokio::task::JoinHandle<()>,
}

/// Starts announcing `id` at `port` and looking for others on every local IPv4 interface.
/// Found nodes arrive on the returned channel (again each time they are seen).
pub fn start(
    namespace: &str,
    id: NodeId,
    port: u16,
) -> anyhow::Result<(Discovery, mpsc::UnboundedReceiver<Found>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut current: BTreeSet<Ipv4Addr> = interfaces::local_ipv4()
        .iter()
        .filter_map(|i| i.ipv4())
        .collect();
    let addrs: Vec<IpAddr> = current.iter().map(|ip| IpAddr::V4(*ip)).collect();
    let own_label = id.to_label();
    let callback = {
        let own_label = own_label.clone();
        move |peer_id: &str, peer: &swarm_discovery::Peer| {
            if peer_id == own_label {
                return;
            }
            let Some(id) = NodeId::from_label(peer_id) else {
                return;
            };
            let addrs: Vec<SocketAddr> = peer
                .addrs()
                .iter()
                .filter(|(ip, _)| ip.is_ipv4() && !ip.is_loopback())
                .map(|(ip, port)| SocketAddr::new(*ip, *port))
                .collect();
            if !addrs.is_empty() {
                let _ = tx.send(Found { id, addrs });
            }
        }
    };
    let guard: DropGuard = Discoverer::new_interactive(service_name(namespace), own_label)
        .with_addrs(port, addrs)
        .with_multicast_interfaces_v4(current.iter().copied().collect())
        .with_ip_class(swarm_discovery::IpClass::V4Only)
        .with_callback(callback)
        .spawn(&tokio::runtime::Handle::current())
        .map_err(|e| anyhow::anyhow!("cannot start mDNS discovery: {e}"))?;
    tracing::info!(
        service = %service_name(namespace),
        interfaces = ?current,
        "mDNS discovery on every IPv4 interface"
    );
    let task = tokio::spawn(async move {
        let mut ticker = tokio::time::interval(Duration::from_secs(2));
        loop {
            ticker.tick().await;
            let now: BTreeSet<Ipv4Addr> = interfaces::local_ipv4()
                .iter()
                .filter_map(|i| i.ipv4())
                .collect();
            for ip in now.difference(&current) {
                tracing::info!(%ip, "new interface: announcing on it");
                guard.add_interface_v4(*ip);
                guard.add(port, vec![IpAddr::V4(*ip)]);
            }
            for ip in current.difference(&now) {
                tracing::info!(%ip, "interface gone");
                guard.remove_interface_v4(*ip);
                guard.remove_addr(IpAddr::V4(*ip));
            }
            current = now;
        }
    });
    Ok((Discovery { _guard_task: task }, rx))
}

impl Drop for Discovery {
    fn drop(&mut self) {
        self._guard_task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_are_short_labels_per_namespace() {
        let a = service_name("shoal");
        assert_eq!(a.len(), 14);
        assert_ne!(a, service_name("lab"));
        assert_eq!(service_name(&"x".repeat(1000)).len(), 14);
        assert!(service_name("ünïcode namespace").is_ascii());
    }
}
