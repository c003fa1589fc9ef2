//! A safe handle on MLX's distributed "ring" backend (TCP links between ring neighbours).
//!
//! mlx-rs has no distributed API, so this wraps mlx-c's FFI. The contract of the ring backend,
//! measured on Linux (see `shared/notes/mlx-on-linux.md`):
//! - `MLX_RANK` and `MLX_HOSTFILE` select this process's rank and the host file, a JSON list
//!   indexed by rank of `["ip:port", ...]` entries;
//! - a rank listens on its own entry, accepts its left neighbour and connects to its right one;
//!   entries of other ranks are parsed but never contacted;
//! - connecting retries for about 31 s, but accepting never times out, so [`RingGroup::join`]
//!   runs the join on a helper thread under a deadline;
//! - send/recv only work between direct neighbours, and the group cannot be re-created inside a
//!   process: one ring per process.

use mlx_rs::{Array, Dtype, StreamOrDevice};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// Where this process sits in a ring: its rank and every rank's addresses, in rank order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// This process's rank, `0..hosts.len()`.
    pub rank: usize,
    /// One entry per rank: `ip:port` strings (several per rank open parallel links). This
    /// rank's own entry is where it listens; placeholders are fine for non-neighbours.
    pub hosts: Vec<Vec<String>>,
}

impl RingConfig {
    /// The host file's JSON text, as MLX reads it.
    pub fn hostfile_json(&self) -> String {
        let ranks: Vec<String> = self
            .hosts
            .iter()
            .map(|addrs| {
                let quoted: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
                format!("[{}]", quoted.join(", "))
            })
            .collect();
        format!("[{}]", ranks.join(", "))
    }

    /// The rank this one accepts a link from.
    pub fn left(&self) -> usize {
        (self.rank + self.hosts.len() - 1) % self.hosts.len()
    }

    /// The rank this one connects to.
    pub fn right(&self) -> usize {
        (self.rank + 1) % self.hosts.len()
    }

    fn validate(&self) -> Result<(), RingError> {
        if self.hosts.is_empty() || self.rank >= self.hosts.len() {
            return Err(RingError::Config(format!(
                "rank {} is outside a ring of {} hosts",
                self.rank,
                self.hosts.len()
            )));
        }
        let width = self.hosts[0].len();
        if width == 0 || self.hosts.iter().any(|h| h.len() != width) {
            return Err(RingError::Config(
                "every rank must list the same, non-zero number of addresses".into(),
            ));
        }
        for addr in self.hosts.iter().flatten() {
            let valid = addr.rsplit_once(':').is_some_and(|(ip, port)| {
                ip.parse::<std::net::Ipv4Addr>().is_ok() && port.parse::<u16>().is_ok()
            });
            if !valid {
                return Err(RingError::Config(format!(
                    "`{addr}` is not an IPv4 `ip:port` (the ring backend is IPv4 only)"
                )));
            }
        }
        Ok(())
    }
}

/// Why joining or using the ring failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// The configuration cannot describe a ring.
    Config(String),
    /// MLX could not form the group (usually: the right neighbour refused every connection).
    Join(String),
    /// The left neighbour never connected before the deadline.
    Timeout {
        /// How long the join waited.
        waited: Duration,
        /// The neighbour ranks and addresses the join depended on.
        waiting_for: String,
    },
    /// A collective or point-to-point operation failed (e.g. a peer was lost).
    Op(String),
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Config(m) => write!(f, "invalid ring configuration: {m}"),
            RingError::Join(m) => write!(f, "could not join the ring: {m}"),
            RingError::Timeout {
                waited,
                waiting_for,
            } => write!(
                f,
                "ring did not form within {} s: waited for {waiting_for}",
                waited.as_secs()
            ),
            RingError::Op(m) => write!(f, "ring operation failed: {m}"),
        }
    }
}

impl std::error::Error for RingError {}

/// Checks that this rank can listen where its entry says, before MLX tries: MLX's ring gives
/// up at once on a port in use and says only that it failed to initialise. (Bound with
/// `SO_REUSEADDR` like MLX's own socket, so a closed connection in `TIME_WAIT` does not count.)
fn ports_free(config: &RingConfig) -> Result<(), RingError> {
    if config.hosts.len() < 2 {
        return Ok(());
    }
    for entry in &config.hosts[config.rank] {
        let Ok(addr) = entry.parse::<std::net::SocketAddr>() else {
            continue; // validate() refused what matters; MLX reports the rest
        };
        if let Err(e) = std::net::TcpListener::bind(addr) {
            return Err(RingError::Join(format!(
                "this rank cannot listen on {addr}: {e} (another process or connection on this \
                 node holds the port; `ss -tanp | grep :{}` shows which)",
                addr.port()
            )));
        }
    }
    Ok(())
}

/// A formed ring group. One per process; dropping it does not let a new one form.
pub struct RingGroup {
    raw: mlx_sys::mlx_distributed_group,
    rank: usize,
    size: usize,
    /// The ring's sockets to its neighbours (found after joining), for [`Self::wait_for_peer`].
    peer_fds: Vec<std::os::fd::RawFd>,
}

impl fmt::Debug for RingGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingGroup")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

// SAFETY: the group is an immutable handle to MLX's communicator; MLX serialises its use on
// the stream that runs the collective.
unsafe impl Send for RingGroup {}
unsafe impl Sync for RingGroup {}

impl RingGroup {
    /// Writes the host file into `dir`, sets `MLX_RANK`/`MLX_HOSTFILE` and joins the ring,
    /// giving up after `deadline`. On timeout the joining thread stays blocked inside MLX: the
    /// caller (a runner process) must report the error and exit.
    pub fn join(config: &RingConfig, dir: &Path, deadline: Duration) -> Result<Self, RingError> {
        config.validate()?;
        ports_free(config)?;
        let hostfile = write_hostfile(config, dir)?;
        // mlx-rs installs its error handler on first use; without it a failing MLX call
        // would print and exit(-1). Any evaluated op installs it.
        Array::from_int(0)
            .eval()
            .map_err(|e| RingError::Join(format!("MLX is not usable: {e}")))?;
        // SAFETY (edition 2021: set_var is safe but racy): a runner sets these before it
        // starts other threads that read the environment.
        std::env::set_var("MLX_RANK", config.rank.to_string());
        std::env::set_var("MLX_HOSTFILE", &hostfile);

        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("ring-join".into())
            .spawn(move || {
                let mut group = unsafe { mlx_sys::mlx_distributed_group_new() };
                let backend = c"ring";
                let rc =
                    unsafe { mlx_sys::mlx_distributed_init(&mut group, true, backend.as_ptr()) };
                let _ = tx.send((rc, RawGroup(group)));
            })
            .map_err(|e| RingError::Join(format!("cannot start the join thread: {e}")))?;
        let (rc, RawGroup(raw)) = rx.recv_timeout(deadline).map_err(|_| RingError::Timeout {
            waited: deadline,
            waiting_for: describe_neighbours(config),
        })?;
        if rc != 0 || raw.ctx.is_null() {
            return Err(RingError::Join(format!(
                "MLX's ring backend failed to initialise ({}); check that every rank runs and \
                 that the addresses are reachable",
                describe_neighbours(config)
            )));
        }
        let rank = unsafe { mlx_sys::mlx_distributed_group_rank(raw) };
        let size = unsafe { mlx_sys::mlx_distributed_group_size(raw) };
        let peer_fds = ring_sockets(config);
        if peer_fds.is_empty() && config.hosts.len() > 1 {
            tracing::warn!("the ring's sockets were not found; idle ranks will spin in MLX");
        }
        Ok(RingGroup {
            raw,
            rank: rank as usize,
            size: size as usize,
            peer_fds,
        })
    }

    /// Blocks, without using the CPU, until a neighbour sends something (or hangs up).
    ///
    /// MLX's ring backend waits for data by retrying a non-blocking `recv` in a loop: a rank
    /// that waits inside an MLX receive or collective keeps a core busy. Ranks that wait for
    /// the next step (serving ranks between requests, rank 0 while the others compute) call
    /// this first, so they sleep in `poll(2)` on the ring's sockets until the data is there.
    /// Nothing is read. Returns at once if the sockets are unknown.
    pub fn wait_for_peer(&self) -> Result<(), RingError> {
        if self.peer_fds.is_empty() {
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> = self
            .peer_fds
            .iter()
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        loop {
            // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if n > 0 {
                // Data, a hang-up or an error: the MLX operation that follows reports which.
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if n < 0 && err.kind() != std::io::ErrorKind::Interrupted {
                return Err(RingError::Op(format!(
                    "waiting on the ring's sockets: {err}"
                )));
            }
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Element-wise sum of `x` over all ranks (lazy until evaluated).
    pub fn all_sum(&self, x: &Array) -> Result<Array, RingError> {
        self.op("all_sum", |res, s| unsafe {
            mlx_sys::mlx_distributed_all_sum(res, x.as_ptr(), self.raw, s)
        })
    }

    /// Concatenation of every rank's `x` along the first axis, in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array, RingError> {
        self.op("all_gather", |res, s| unsafe {
            mlx_sys::mlx_distributed_all_gather(res, x.as_ptr(), self.raw, s)
        })
    }

    /// Sends `x` to a neighbouring rank; evaluate the returned array to perform the send.
    pub fn send(&self, x: &Array, dst: usize) -> Result<Array, RingError> {
        self.check_neighbour(dst)?;
        self.op("send", |res, s| unsafe {
            mlx_sys::mlx_distributed_send(res, x.as_ptr(), dst as i32, self.raw, s)
        })
    }

    /// Receives an array of `shape` and `dtype` from a neighbouring rank.
    pub fn recv(&self, shape: &[i32], dtype: Dtype, src: usize) -> Result<Array, RingError> {
        self.check_neighbour(src)?;
        self.op("recv", |res, s| unsafe {
            mlx_sys::mlx_distributed_recv(
                res,
                shape.as_ptr(),
                shape.len(),
                dtype as mlx_sys::mlx_dtype,
                src as i32,
                self.raw,
                s,
            )
        })
    }

    fn check_neighbour(&self, other: usize) -> Result<(), RingError> {
        let left = (self.rank + self.size - 1) % self.size;
        let right = (self.rank + 1) % self.size;
        if other == self.rank || (other != left && other != right) {
            return Err(RingError::Op(format!(
                "rank {} can only exchange with its ring neighbours {left} and {right}, not {other}",
                self.rank
            )));
        }
        Ok(())
    }

    fn op(
        &self,
        name: &str,
        f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
    ) -> Result<Array, RingError> {
        let stream = StreamOrDevice::cpu();
        let mut res = unsafe { mlx_sys::mlx_array_new() };
        let rc = f(&mut res, stream.as_ref().as_ptr());
        // SAFETY: `res` is a fresh array handle that MLX filled (or left empty on failure);
        // wrapping it hands its ownership to mlx-rs, which frees it.
        let array = unsafe { Array::from_ptr(res) };
        if rc != 0 {
            return Err(RingError::Op(format!("{name} was rejected by MLX")));
        }
        Ok(array)
    }
}

impl Drop for RingGroup {
    fn drop(&mut self) {
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.raw);
        }
    }
}

/// The TCP sockets MLX opened to this rank's neighbours: connected IPv4 sockets whose local
/// port is this rank's listening port (accepted from the left neighbour) or whose peer is the
/// right neighbour's address. Found through `/proc/self/fd` (MLX does not expose them).
fn ring_sockets(config: &RingConfig) -> Vec<std::os::fd::RawFd> {
    let port_of = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
    };
    let own_ports: Vec<u16> = config.hosts[config.rank]
        .iter()
        .filter_map(|a| port_of(a))
        .collect();
    let right: Vec<std::net::SocketAddrV4> = config.hosts[config.right()]
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect();
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut fds: Vec<std::os::fd::RawFd> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| {
            let is_socket = std::fs::read_link(format!("/proc/self/fd/{fd}"))
                .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
            if !is_socket {
                return false;
            }
            match (socket_addr(fd, false), socket_addr(fd, true)) {
                (Some(local), Some(peer)) => {
                    own_ports.contains(&local.port()) || right.contains(&peer)
                }
                _ => false,
            }
        })
        .collect();
    fds.sort_unstable();
    fds
}

/// The local (or, with `peer`, remote) IPv4 address of socket `fd`, if it has one.
fn socket_addr(fd: std::os::fd::RawFd, peer: bool) -> Option<std::net::SocketAddrV4> {
    // SAFETY: the buffer is a zeroed sockaddr_in with its length; the calls only write into it.
    unsafe {
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let ptr = &mut addr as *mut libc::sockaddr_in as *mut libc::sockaddr;
        let rc = if peer {
            libc::getpeername(fd, ptr, &mut len)
        } else {
            libc::getsockname(fd, ptr, &mut len)
        };
        if rc != 0 || addr.sin_family as i32 != libc::AF_INET {
            return None;
        }
        Some(std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
            u16::from_be(addr.sin_port),
        ))
    }
}

struct RawGroup(mlx_sys::mlx_distributed_group);
// SAFETY: the handle moves once from the join thread to the caller.
unsafe impl Send for RawGroup {}

fn describe_neighbours(config: &RingConfig) -> String {
    let (left, right) = (config.left(), config.right());
    if config.hosts.len() == 1 {
        return "nothing (a ring of one)".into();
    }
    format!(
        "left neighbour rank {left} to connect to {} and right neighbour rank {right} at {}",
        config.hosts[config.rank].join(","),
        config.hosts[right].join(",")
    )
}

fn write_hostfile(config: &RingConfig, dir: &Path) -> Result<PathBuf, RingError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| RingError::Config(format!("cannot create {}: {e}", dir.display())))?;
    let path = dir.join(format!("hostfile-rank{}.json", config.rank));
    std::fs::write(&path, config.hostfile_json())
        .map_err(|e| RingError::Config(format!("cannot write {}: {e}", path.display())))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_whose_port_is_held_says_so_before_mlx_tries() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let config = RingConfig {
            rank: 1,
            hosts: vec![
                vec!["10.0.0.1:5000".into()],
                vec![format!("127.0.0.1:{port}")],
            ],
        };
        let Err(RingError::Join(why)) = ports_free(&config) else {
            panic!("a held port passed the check");
        };
        assert!(why.contains(&format!("127.0.0.1:{port}")), "{why}");
        drop(held);
        ports_free(&config).unwrap();
    }

    fn ring(rank: usize, n: usize) -> RingConfig {
        RingConfig {
            rank,
            hosts: (0..n)
                .map(|i| vec![format!("10.0.0.{}:5000", i + 1)])
                .collect(),
        }
    }

    #[test]
    fn hostfile_is_the_json_list_mlx_reads() {
        let config = RingConfig {
            rank: 0,
            hosts: vec![
                vec!["0.0.0.0:38101".into()],
                vec!["127.0.0.1:38102".into()],
                vec!["198.51.100.1:0".into()],
            ],
        };
        assert_eq!(
            config.hostfile_json(),
            r#"[["0.0.0.0:38101"], ["127.0.0.1:38102"], ["198.51.100.1:0"]]"#
        );
    }

    #[test]
    fn neighbours_wrap_around() {
        assert_eq!((ring(0, 3).left(), ring(0, 3).right()), (2, 1));
        assert_eq!((ring(2, 3).left(), ring(2, 3).right()), (1, 0));
    }

    #[test]
    fn bad_configurations_are_refused() {
        let mut c = ring(3, 3);
        assert!(matches!(c.validate(), Err(RingError::Config(_))));
        c.rank = 0;
        c.hosts[1] = vec!["[::1]:5000".into()];
        assert!(matches!(c.validate(), Err(RingError::Config(m)) if m.contains("IPv4")));
        c.hosts[1] = vec!["10.0.0.2:5000".into(), "10.0.0.2:5001".into()];
        assert!(matches!(c.validate(), Err(RingError::Config(m)) if m.contains("same")));
        assert_eq!(ring(1, 3).validate(), Ok(()));
    }
}
