//! Local clusters in Linux network namespaces: one namespace per node, joined by a bridge that
//! lives in its own "hub" namespace (so nothing touches the host's interfaces), with private
//! 10.x addresses that exist only inside them, plus optional point-to-point veth links between
//! two nodes (a stand-in for a Thunderbolt cable). Used by `cargo xtask cluster`, the xtask's
//! testbed and the integration tests; it shells to `ip`, and [`connect_in`] opens a TCP
//! connection from inside a namespace (for the cluster-API client).
//!
//! Dropping a [`Netns`] kills every process left in its namespaces and deletes them.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// Subnet of the shared bridge: node `i` (0-based) gets `10.99.0.(i+1)/24`.
pub const BRIDGE_SUBNET: [u8; 3] = [10, 99, 0];

/// What to build.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// Number of nodes.
    pub nodes: usize,
    /// Nodes (0-based) left off the bridge: reachable only through extra links.
    pub off_bridge: Vec<usize>,
    /// Extra point-to-point links between two nodes (0-based).
    pub links: Vec<(usize, usize)>,
}

/// One node's namespace and addresses.
#[derive(Debug, Clone)]
pub struct Node {
    /// Namespace name.
    pub netns: String,
    /// Address on the bridge, if on it.
    pub bridge_ip: Option<Ipv4Addr>,
    /// Addresses on extra links.
    pub link_ips: Vec<Ipv4Addr>,
}

impl Node {
    /// The first address of this node (bridge, else its first link).
    pub fn ip(&self) -> Ipv4Addr {
        self.bridge_ip
            .or_else(|| self.link_ips.first().copied())
            .unwrap_or(Ipv4Addr::LOCALHOST)
    }

    /// A command run inside this node's namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns, program]);
        cmd
    }
}

/// A set of namespaces; deleted on drop.
#[derive(Debug)]
pub struct Netns {
    /// The nodes, in order.
    pub nodes: Vec<Node>,
    hub: String,
    torn_down: bool,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` (install iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// What [`available`] and the tests say to do when namespaces cannot be made.
pub const NEEDS: &str = "run the tests as root on Linux with iproute2 installed \
                         (`cargo xtask setup` installs it)";

/// `Ok` if this process can create namespaces (root and `ip` present), else why not.
pub fn available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    check_available(euid, || ip(&["netns", "list"]))
}

/// [`available`] for a process of effective user id `euid` whose `ip netns list` answers
/// `ip_netns` (injectable, so tests can be "not root").
pub fn check_available(
    euid: u32,
    ip_netns: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    if euid != 0 {
        return Err(format!(
            "network namespaces need root (running as uid {euid})"
        ));
    }
    ip_netns().map_err(|e| format!("`ip netns` is not usable: {e}"))
}

/// Moves the calling thread into namespace `netns`: the sockets it opens from now on (and
/// those of threads it starts) live there; other threads stay where they are. The one place
/// the tests and the xtask call `setns`; callers do it on a thread of their own.
pub fn enter(netns: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(format!("/run/netns/{netns}"))?;
    // SAFETY: setns on an open namespace file changes only the calling thread's namespace.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A TCP connection to `addr` made from inside namespace `netns` (the socket stays there
/// after the call), within `timeout`. A short-lived thread enters the namespace, so the
/// caller's own threads never change namespace. Needs root, as namespaces do.
pub fn connect_in(
    netns: &str,
    addr: std::net::SocketAddr,
    timeout: std::time::Duration,
) -> std::io::Result<std::net::TcpStream> {
    let netns = netns.to_string();
    std::thread::spawn(move || {
        enter(&netns)?;
        std::net::TcpStream::connect_timeout(&addr, timeout)
    })
    .join()
    .map_err(|_| std::io::Error::other("the namespace thread panicked"))?
}

/// Namespaces whose names start with `prefix`.
pub fn list(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output();
    let Ok(out) = out else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

/// Kills every process in namespace `name`, then deletes it.
pub fn delete(name: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
    let _ = ip(&["netns", "del", name]);
}

impl Netns {
    /// Creates the namespaces, bridge and links of `spec`, named `prefix-...`.
    pub fn create(prefix: &str, spec: &Spec) -> Result<Netns, String> {
        let hub = format!("{prefix}-hub");
        let mut netns = Netns {
            nodes: Vec::new(),
            hub: hub.clone(),
            torn_down: false,
        };
        // From here on, a failure drops `netns`, which removes what was made.
        ip(&["netns", "add", &hub])?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for i in 0..spec.nodes {
            let name = format!("{prefix}-n{}", i + 1);
            ip(&["netns", "add", &name])?;
            netns.nodes.push(Node {
                netns: name.clone(),
                bridge_ip: None,
                link_ips: Vec::new(),
            });
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            if spec.off_bridge.contains(&i) {
                continue;
            }
            let port = format!("vh{}", i + 1);
            ip(&[
                "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &name,
            ])?;
            ip(&["-n", &hub, "link", "set", &port, "master", "br0", "up"])?;
            let [a, b, c] = BRIDGE_SUBNET;
            let addr = Ipv4Addr::new(a, b, c, (i + 1) as u8);
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &name, "link", "set", "eth0", "up"])?;
            netns.nodes[i].bridge_ip = Some(addr);
        }
        for (k, &(a, b)) in spec.links.iter().enumerate() {
            if a >= spec.nodes || b >= spec.nodes || a == b {
                return Err(format!(
                    "extra link {},{}: nodes are numbered 1..={} and must differ",
                    a + 1,
                    b + 1,
                    spec.nodes
                ));
            }
            let (ns_a, ns_b) = (netns.nodes[a].netns.clone(), netns.nodes[b].netns.clone());
            let (if_a, if_b) = (format!("tb{}", b + 1), format!("tb{}", a + 1));
            ip(&[
                "-n", &ns_a, "link", "add", &if_a, "type", "veth", "peer", "name", &if_b, "netns",
                &ns_b,
            ])?;
            let subnet = 100 + k as u8;
            let ip_a = Ipv4Addr::new(10, subnet, 0, 1);
            let ip_b = Ipv4Addr::new(10, subnet, 0, 2);
            ip(&[
                "-n",
                &ns_a,
                "addr",
                "add",
                &format!("{ip_a}/30"),
                "dev",
                &if_a,
            ])?;
            ip(&[
                "-n",
                &ns_b,
                "addr",
                "add",
                &format!("{ip_b}/30"),
                "dev",
                &if_b,
            ])?;
            ip(&["-n", &ns_a, "link", "set", &if_a, "up"])?;
            ip(&["-n", &ns_b, "link", "set", &if_b, "up"])?;
            netns.nodes[a].link_ips.push(ip_a);
            netns.nodes[b].link_ips.push(ip_b);
        }
        Ok(netns)
    }

    /// Kills what runs inside and deletes every namespace (also done on drop).
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        for node in &self.nodes {
            delete(&node.netns);
        }
        delete(&self.hub);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_with_a_working_ip_may_make_namespaces() {
        let ok = || Ok(());
        assert_eq!(check_available(0, ok), Ok(()));
        let not_root = check_available(1000, || panic!("not asked")).unwrap_err();
        assert!(
            not_root.contains("need root") && not_root.contains("1000"),
            "{not_root}"
        );
        let no_ip = check_available(0, || Err("cannot run `ip`".into())).unwrap_err();
        assert!(no_ip.contains("`ip netns` is not usable"), "{no_ip}");
    }

    #[test]
    fn a_node_without_addresses_is_on_loopback() {
        let node = Node {
            netns: "x".into(),
            bridge_ip: None,
            link_ips: vec![],
        };
        assert_eq!(node.ip(), Ipv4Addr::LOCALHOST);
        let node = Node {
            link_ips: vec![Ipv4Addr::new(10, 100, 0, 2)],
            ..node
        };
        assert_eq!(node.ip(), Ipv4Addr::new(10, 100, 0, 2));
    }
}
