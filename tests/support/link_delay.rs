//! Delay on a namespaced node's bridge link, without netem (this kernel has none): iptables
//! rules in the node's namespace send every packet in and out of `eth0` to an NFQUEUE, and a
//! thread of the test, inside that namespace, holds each packet for the delay before it lets
//! it pass. Packets keep their order (one queue, released first in, first out). The rules use
//! `--queue-bypass`, so packets pass untouched whenever no thread listens. Needs root and
//! `iptables` (setup installs Debian's).

#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The queue number the rules send packets to.
const QUEUE: u16 = 7;

/// The rules (chain, interface option) that queue the link's packets.
const RULES: [(&str, &str); 2] = [("OUTPUT", "-o"), ("INPUT", "-i")];

/// A delay on one node's link while it lives; [`LinkDelay::stop`] (or drop) takes it away.
pub struct LinkDelay {
    netns: String,
    stop: Arc<AtomicBool>,
    held: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn iptables(netns: &str, action: &str, chain: &str, dir: &str) -> bool {
    Command::new("ip")
        .args([
            "netns", "exec", netns, "iptables", action, chain, dir, "eth0",
        ])
        .args([
            "-j",
            "NFQUEUE",
            "--queue-num",
            &QUEUE.to_string(),
            "--queue-bypass",
        ])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl LinkDelay {
    /// Delays every packet in and out of `netns`'s bridge link by `delay` (so a round trip
    /// through the link takes at least twice that longer).
    pub fn start(netns: &str, delay: Duration) -> LinkDelay {
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let (stop, held, netns) = (stop.clone(), held.clone(), netns.to_string());
            std::thread::spawn(move || hold_packets(&netns, delay, &stop, &held, ready_tx))
        };
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the delay thread did not bind its queue")
            .unwrap_or_else(|e| panic!("NFQUEUE {QUEUE} in {netns}: {e}"));
        for (chain, dir) in RULES {
            assert!(
                iptables(netns, "-I", chain, dir),
                "iptables {chain} in {netns} (setup installs Debian's iptables)"
            );
        }
        LinkDelay {
            netns: netns.to_string(),
            stop,
            held,
            thread: Some(thread),
        }
    }

    /// Packets held so far.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Removes the rules and lets every held packet go.
    pub fn stop(mut self) {
        self.end();
    }

    fn end(&mut self) {
        for (chain, dir) in RULES {
            while iptables(&self.netns, "-D", chain, dir) {}
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for LinkDelay {
    fn drop(&mut self) {
        self.end();
    }
}

/// The thread: enters `netns`, binds the queue, and releases each packet `delay` after it
/// came, until `stop` (then releases the rest at once).
fn hold_packets(
    netns: &str,
    delay: Duration,
    stop: &AtomicBool,
    held: &AtomicU64,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let queue = (|| -> Result<nfq::Queue, String> {
        kit::netns::enter(netns).map_err(|e| format!("enter {netns}: {e}"))?;
        let mut queue = nfq::Queue::open().map_err(|e| format!("open: {e}"))?;
        queue.bind(QUEUE).map_err(|e| format!("bind: {e}"))?;
        queue
            .set_queue_max_len(QUEUE, 65_535)
            .map_err(|e| format!("max len: {e}"))?;
        // A full queue lets packets pass rather than drop them: this adds delay, not loss.
        queue
            .set_fail_open(QUEUE, true)
            .map_err(|e| format!("fail open: {e}"))?;
        queue
            .set_copy_range(QUEUE, 64)
            .map_err(|e| format!("copy range: {e}"))?;
        queue.set_nonblocking(true);
        Ok(queue)
    })();
    let mut queue = match queue {
        Ok(queue) => {
            let _ = ready.send(Ok(()));
            queue
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut waiting: std::collections::VecDeque<(Instant, nfq::Message)> = Default::default();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        while let Ok(mut message) = queue.recv() {
            message.set_verdict(nfq::Verdict::Accept);
            waiting.push_back((Instant::now() + delay, message));
            held.fetch_add(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        while waiting
            .front()
            .is_some_and(|(due, _)| stopping || *due <= now)
        {
            let (_, message) = waiting.pop_front().expect("a front");
            let _ = queue.verdict(message);
        }
        if stopping {
            let _ = queue.unbind(QUEUE);
            return;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}
