//! The machine's network interfaces: IPv4 addresses (for mDNS on every link and for the
//! profile) and each interface's kind, read from sysfs on Linux.

pub use placement::InterfaceKind;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};

/// One address of one interface as the host publishes it: placement's
/// [`placement::Interface`] (name, address, kind) plus the subnet's prefix length, which the
/// probes need to pair a remote address with the local interface on the same link. In JSON the
/// two are one flat object: `{"name", "ip", "kind", "prefix"}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Interface {
    /// The interface as placement sees it.
    #[serde(flatten)]
    pub link: placement::Interface,
    /// Prefix length of its subnet.
    pub prefix: u8,
}

impl Interface {
    /// An IPv4 interface.
    pub fn new(name: &str, ip: Ipv4Addr, prefix: u8, kind: InterfaceKind) -> Interface {
        Interface {
            link: placement::Interface {
                name: name.to_string(),
                ip: IpAddr::V4(ip),
                kind,
            },
            prefix,
        }
    }

    /// The address, if it is IPv4 (every address [`local_ipv4`] finds is).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        match self.link.ip {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        }
    }

    /// True if `other` is in this interface's subnet (IPv4 only).
    pub fn same_subnet(&self, other: IpAddr) -> bool {
        let (IpAddr::V4(ip), IpAddr::V4(other)) = (self.link.ip, other) else {
            return false;
        };
        let mask = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix.min(32)))
        };
        u32::from(ip) & mask == u32::from(other) & mask
    }
}

/// Every non-loopback IPv4 address of an interface that is up, sorted by name then address.
pub fn local_ipv4() -> Vec<Interface> {
    let mut out = Vec::new();
    for (name, ip, prefix) in getifaddrs_v4() {
        if ip.is_loopback() || ip.is_unspecified() {
            continue;
        }
        out.push(Interface::new(&name, ip, prefix, kind_of(&name)));
    }
    out.sort();
    out.dedup();
    out
}

fn getifaddrs_v4() -> Vec<(String, Ipv4Addr, u8)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below; we only read entries whose
    // pointers are non-null, and copy everything out before freeing.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cursor = head;
        while !cursor.is_null() {
            let entry = &*cursor;
            cursor = entry.ifa_next;
            let up = entry.ifa_flags & (libc::IFF_UP as libc::c_uint) != 0;
            if !up || entry.ifa_addr.is_null() || entry.ifa_name.is_null() {
                continue;
            }
            if i32::from((*entry.ifa_addr).sa_family) != libc::AF_INET {
                continue;
            }
            let addr = &*(entry.ifa_addr as *const libc::sockaddr_in);
            let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
            let prefix = if entry.ifa_netmask.is_null() {
                32
            } else {
                let mask = &*(entry.ifa_netmask as *const libc::sockaddr_in);
                u32::from_be(mask.sin_addr.s_addr).count_ones() as u8
            };
            let name = std::ffi::CStr::from_ptr(entry.ifa_name)
                .to_string_lossy()
                .into_owned();
            out.push((name, ip, prefix));
        }
        libc::freeifaddrs(head);
    }
    out
}

/// The kind of interface `name`, from sysfs on Linux; by name on other systems.
pub fn kind_of(name: &str) -> InterfaceKind {
    #[cfg(target_os = "linux")]
    {
        kind_from_sysfs(std::path::Path::new("/sys/class/net"), name)
    }
    #[cfg(not(target_os = "linux"))]
    {
        if name.starts_with("bridge") {
            InterfaceKind::Thunderbolt
        } else if name.starts_with("en") {
            InterfaceKind::Ethernet
        } else {
            InterfaceKind::Unknown
        }
    }
}

/// Reads an interface's kind under a sysfs root (`/sys/class/net`): a `wireless` or `phy80211`
/// entry means Wi-Fi; a device whose driver is `thunderbolt-net` (or whose path goes through
/// a Thunderbolt bus) means Thunderbolt; link type 1 (ARPHRD_ETHER) means Ethernet.
pub fn kind_from_sysfs(root: &std::path::Path, name: &str) -> InterfaceKind {
    let dir = root.join(name);
    if dir.join("wireless").exists() || dir.join("phy80211").exists() {
        return InterfaceKind::Wifi;
    }
    let driver = std::fs::read_link(dir.join("device/driver")).ok();
    let device = std::fs::canonicalize(dir.join("device")).ok();
    let through_thunderbolt = |p: &std::path::Path| p.to_string_lossy().contains("thunderbolt");
    if driver.as_deref().is_some_and(through_thunderbolt)
        || device.as_deref().is_some_and(through_thunderbolt)
    {
        return InterfaceKind::Thunderbolt;
    }
    match std::fs::read_to_string(dir.join("type")) {
        Ok(t) if t.trim() == "1" => InterfaceKind::Ethernet,
        _ => InterfaceKind::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_from_a_fake_sysfs() {
        let root = std::env::temp_dir().join(format!("shoal-sysfs-{}", std::process::id()));
        let make = |name: &str, kind_type: &str| {
            let dir = root.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("type"), kind_type).unwrap();
            dir
        };
        std::fs::create_dir_all(make("wlan0", "1").join("wireless")).unwrap();
        let tb = make("thunderbolt0", "1");
        let driver = root.join("drivers/thunderbolt-net");
        std::fs::create_dir_all(&driver).unwrap();
        std::fs::create_dir_all(tb.join("device")).unwrap();
        std::os::unix::fs::symlink(&driver, tb.join("device/driver")).unwrap();
        make("eth0", "1\n");
        make("tun0", "65534");
        assert_eq!(kind_from_sysfs(&root, "wlan0"), InterfaceKind::Wifi);
        assert_eq!(
            kind_from_sysfs(&root, "thunderbolt0"),
            InterfaceKind::Thunderbolt
        );
        assert_eq!(kind_from_sysfs(&root, "eth0"), InterfaceKind::Ethernet);
        assert_eq!(kind_from_sysfs(&root, "tun0"), InterfaceKind::Unknown);
        assert_eq!(kind_from_sysfs(&root, "missing"), InterfaceKind::Unknown);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn subnets() {
        let i = Interface::new(
            "eth0",
            Ipv4Addr::new(10, 99, 0, 2),
            24,
            InterfaceKind::Ethernet,
        );
        assert!(i.same_subnet(Ipv4Addr::new(10, 99, 0, 7).into()));
        assert!(!i.same_subnet(Ipv4Addr::new(10, 98, 0, 7).into()));
    }

    #[test]
    fn local_addresses_exclude_loopback() {
        assert!(local_ipv4().iter().all(|i| !i.link.ip.is_loopback()));
    }

    #[test]
    fn json_is_one_flat_object_in_placement_terms() {
        let i = Interface::new(
            "tb0",
            Ipv4Addr::new(10, 0, 0, 1),
            30,
            InterfaceKind::Thunderbolt,
        );
        let json = serde_json::to_value(&i).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name": "tb0", "ip": "10.0.0.1", "kind": "thunderbolt", "prefix": 30})
        );
        assert_eq!(serde_json::from_value::<Interface>(json).unwrap(), i);
        let link: placement::Interface = serde_json::from_value(serde_json::json!(
            {"name": "tb0", "ip": "10.0.0.1", "kind": "thunderbolt"}
        ))
        .unwrap();
        assert_eq!(link, i.link);
    }
}
