//! A node's profile record: what the machine is (name, OS, CPU, memory, interfaces and their
//! kind, compute backends) and where its HTTP API listens. Written under the `profile` key.
//!
//! This is the published host record, not placement's input: it holds facts placement does not
//! use (host name, OS, CPU, the API port, subnet prefixes) and lacks what placement adds from
//! elsewhere (the node id is the record's author). [`HostProfile::placement_profile`] is the one
//! place where it becomes a [`placement::NodeProfile`]; the kinds in it (backends, interface
//! kinds) are placement's own types.

use crate::host::gpu::{self, Gpu, MlxBuild};
use crate::host::interfaces::{self, Interface};
use placement::ComputeBackend;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Record key of the profile.
pub const PROFILE_KEY: &str = "profile";

/// What a node tells the cluster about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostProfile {
    /// Host name.
    pub name: String,
    /// `linux`, `macos`, ...
    pub os: String,
    /// Kernel or OS release.
    pub os_version: String,
    /// CPU model.
    pub cpu: String,
    /// Logical CPUs.
    pub cpu_cores: u32,
    /// Total memory, bytes.
    pub memory_total: u64,
    /// Available memory, bytes (rounded to 64 MiB so small changes do not churn the state).
    pub memory_available: u64,
    /// Compute backends this node can run, best first: `mlx_cuda` or `mlx_metal` when the
    /// machine has that GPU and the node's MLX build drives it, then `mlx_cpu`.
    pub backends: Vec<ComputeBackend>,
    /// The machine's GPUs with their memory (empty without one; absent in records of nodes
    /// from before GPUs were reported).
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// IPv4 interfaces with their kind.
    pub interfaces: Vec<Interface>,
    /// Port of the HTTP API (the same on every address).
    pub api_port: u16,
    /// The shoal release the node runs (empty in records of nodes from before releases were
    /// reported).
    #[serde(default)]
    pub version: String,
    /// The protocol it speaks ([`crate::net::release::PROTOCOL`] of its build; 0 unknown).
    #[serde(default)]
    pub protocol: u32,
}

const ROUND: u64 = 64 << 20;

impl HostProfile {
    /// Reads the profile of this machine, for a node whose MLX is `build`.
    pub fn gather(api_port: u16, build: MlxBuild) -> HostProfile {
        let (total, available) = memory();
        let gpus = gpu::Probe::default().gpus(total);
        HostProfile {
            name: read_trimmed("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown".into()),
            os: std::env::consts::OS.to_string(),
            os_version: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default(),
            cpu: cpu_model(),
            cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            memory_total: total,
            memory_available: available / ROUND * ROUND,
            backends: gpu::backends(build, &gpus),
            gpus,
            interfaces: interfaces::local_ipv4(),
            api_port,
            version: String::new(),
            protocol: 0,
        }
    }

    /// The profile saying the node runs `release`.
    pub fn with_release(self, release: &crate::net::release::Release) -> HostProfile {
        HostProfile {
            version: release.version.clone(),
            protocol: release.protocol,
            ..self
        }
    }

    /// The profile as placement takes it, for the node `id` that authored it. The host does not
    /// detect RDMA, and download progress is not part of this record: both start empty.
    ///
    /// On a node that runs MLX on CUDA the memory placement counts is the GPU's, not the
    /// host's: the weights live in device memory. MLX drives one device per process (device 0,
    /// the first GPU `nvidia-smi` lists), so that device's free memory is what counts (its total
    /// when the driver does not report free memory). On Apple GPUs memory is shared and the
    /// host's figures stand.
    pub fn placement_profile(&self, id: &str) -> placement::NodeProfile {
        let cuda_device = self
            .gpus
            .iter()
            .find(|g| g.vendor == "nvidia")
            .filter(|_| self.backends.contains(&ComputeBackend::MlxCuda));
        let (ram_available, ram_total) = match cuda_device {
            Some(gpu) if gpu.memory_free > 0 => (gpu.memory_free, gpu.memory_total),
            Some(gpu) => (gpu.memory_total, gpu.memory_total),
            None => (self.memory_available, self.memory_total),
        };
        placement::NodeProfile {
            id: id.to_string(),
            ram_available,
            ram_total,
            backends: self.backends.clone(),
            rdma_enabled: false,
            interfaces: self.interfaces.iter().map(|i| i.link.clone()).collect(),
            download: BTreeMap::new(),
        }
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// (total, available) memory in bytes, from `/proc/meminfo`.
fn memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    parse_meminfo(&text)
}

/// Parses `MemTotal` and `MemAvailable` (kB) out of `/proc/meminfo` text.
pub fn parse_meminfo(text: &str) -> (u64, u64) {
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo() {
        let text = "MemTotal:       16384000 kB\nMemFree:  1 kB\nMemAvailable:    8192000 kB\n";
        assert_eq!(parse_meminfo(text), (16384000 * 1024, 8192000 * 1024));
        assert_eq!(parse_meminfo("garbage"), (0, 0));
    }

    #[test]
    fn gathers_this_machine() {
        let p = HostProfile::gather(1234, MlxBuild::Cpu);
        assert_eq!(p.api_port, 1234);
        assert!(p.cpu_cores >= 1);
        if cfg!(target_os = "linux") {
            assert!(p.memory_total > 0);
            assert!(p.memory_available <= p.memory_total);
            assert_eq!(p.backends, vec![ComputeBackend::MlxCpu]);
        }
    }

    #[test]
    fn converts_to_placement_input_and_keeps_the_json_shape() {
        use crate::host::interfaces::InterfaceKind;
        let p = HostProfile {
            name: "h".into(),
            os: "linux".into(),
            os_version: "6".into(),
            cpu: "x".into(),
            cpu_cores: 2,
            memory_total: 8 << 30,
            memory_available: 4 << 30,
            backends: vec![ComputeBackend::MlxCpu],
            gpus: vec![],
            interfaces: vec![Interface::new(
                "eth0",
                "10.0.0.1".parse().unwrap(),
                24,
                InterfaceKind::Ethernet,
            )],
            api_port: 52415,
            version: "0.1.0".into(),
            protocol: 1,
        };
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["backends"], serde_json::json!(["mlx_cpu"]));
        assert_eq!(json["gpus"], serde_json::json!([]));
        // A record from a node that did not report GPUs still reads.
        let mut old = json.clone();
        old.as_object_mut().unwrap().remove("gpus");
        let back: HostProfile = serde_json::from_value(old).unwrap();
        assert!(back.gpus.is_empty());
        assert_eq!(json["memory_available"], 4u64 << 30);
        assert_eq!(json["interfaces"][0]["kind"], "ethernet");
        assert_eq!(json["interfaces"][0]["prefix"], 24);
        let placed = p.placement_profile("a");
        assert_eq!(placed.id, "a");
        assert_eq!(placed.ram_available, 4 << 30);
        assert_eq!(placed.ram_total, 8 << 30);
        assert_eq!(placed.backends, vec![ComputeBackend::MlxCpu]);
        assert_eq!(placed.interfaces, vec![p.interfaces[0].link.clone()]);
        assert!(!placed.rdma_enabled && placed.download.is_empty());
    }

    #[test]
    fn a_cuda_node_offers_its_first_gpus_memory_to_placement() {
        let gpu = |free: u64, total: u64| Gpu {
            vendor: "nvidia".into(),
            name: "NVIDIA H200".into(),
            memory_total: total << 30,
            memory_free: free << 30,
        };
        let mut p = HostProfile {
            name: "g".into(),
            os: "linux".into(),
            os_version: "6".into(),
            cpu: "x".into(),
            cpu_cores: 16,
            memory_total: 128 << 30,
            memory_available: 120 << 30,
            backends: vec![ComputeBackend::MlxCuda, ComputeBackend::MlxCpu],
            gpus: vec![gpu(130, 141), gpu(141, 141)],
            interfaces: vec![],
            api_port: 52415,
            version: "0.1.0".into(),
            protocol: 1,
        };
        let placed = p.placement_profile("g");
        assert_eq!(
            (placed.ram_available, placed.ram_total),
            (130 << 30, 141 << 30)
        );
        // A driver that reports no free memory: the device's total.
        p.gpus = vec![gpu(0, 80)];
        assert_eq!(p.placement_profile("g").ram_available, 80 << 30);
        // A CPU build of MLX on the same machine does not use the GPU: host memory counts.
        p.backends = vec![ComputeBackend::MlxCpu];
        assert_eq!(p.placement_profile("g").ram_available, 120 << 30);
    }
}
