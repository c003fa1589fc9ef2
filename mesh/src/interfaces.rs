//! The machine's network interfaces: IPv4 addresses (for mDNS on every link and for the
//! profile) and each interface's kind, read from sysfs on Linux.

use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

/// What kind of link an interface is, as far as the OS tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InterfaceKind {
    /// Wi-Fi.
    Wireless,
    /// IP over a Thunderbolt cable (`thunderbolt-net` on Linux, "Thunderbolt Bridge" on macOS).
    ThunderboltNet,
    /// Wired Ethernet (and Ethernet-like virtual links such as veth pairs).
    Ethernet,
    /// Anything else.
    Unknown,
}

/// One IPv4 address of one interface.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Interface {
    /// OS name (`eth0`, `en5`).
    pub name: String,
    /// The address.
    pub ip: Ipv4Addr,
    /// Prefix length of its subnet.
    pub prefix: u8,
    /// Link kind.
    pub kind: InterfaceKind,
}

impl Interface {
    /// True if `other` is in this interface's subnet.
    pub fn same_subnet(&self, other: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix.min(32)))
        };
        u32::from(self.ip) & mask == u32::from(other) & mask
    }
}

/// Every non-loopback IPv4 address of an interface that is up, sorted by name then address.
pub fn local_ipv4() -> Vec<Interface> {
    let mut out = Vec::new();
    for (name, ip, prefix) in getifaddrs_v4() {
        if ip.is_loopback() || ip.is_unspecified() {
            continue;
        }
        let kind = kind_of(&name);
        out.push(Interface {
            name,
            ip,
            prefix,
            kind,
        });
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
            InterfaceKind::ThunderboltNet
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
        return InterfaceKind::Wireless;
    }
    let driver = std::fs::read_link(dir.join("device/driver")).ok();
    let device = std::fs::canonicalize(dir.join("device")).ok();
    let through_thunderbolt = |p: &std::path::Path| p.to_string_lossy().contains("thunderbolt");
    if driver.as_deref().is_some_and(through_thunderbolt)
        || device.as_deref().is_some_and(through_thunderbolt)
    {
        return InterfaceKind::ThunderboltNet;
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
        assert_eq!(kind_from_sysfs(&root, "wlan0"), InterfaceKind::Wireless);
        assert_eq!(
            kind_from_sysfs(&root, "thunderbolt0"),
            InterfaceKind::ThunderboltNet
        );
        assert_eq!(kind_from_sysfs(&root, "eth0"), InterfaceKind::Ethernet);
        assert_eq!(kind_from_sysfs(&root, "tun0"), InterfaceKind::Unknown);
        assert_eq!(kind_from_sysfs(&root, "missing"), InterfaceKind::Unknown);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn subnets() {
        let i = Interface {
            name: "eth0".into(),
            ip: Ipv4Addr::new(10, 99, 0, 2),
            prefix: 24,
            kind: InterfaceKind::Ethernet,
        };
        assert!(i.same_subnet(Ipv4Addr::new(10, 99, 0, 7)));
        assert!(!i.same_subnet(Ipv4Addr::new(10, 98, 0, 7)));
    }

    #[test]
    fn local_addresses_exclude_loopback() {
        assert!(local_ipv4().iter().all(|i| !i.ip.is_loopback()));
    }
}
