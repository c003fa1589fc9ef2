//! Runners of multi-rank instances driven over the runner protocol (v2), as the node drives
//! them: every rank is a real process (this test binary re-run, serving the protocol over a
//! socket on its stdin), in its own network namespace when the tests run as root, joined by
//! the real MLX ring.
//!
//! - a 2-rank pipeline and a 2-rank tensor-parallel instance of seeded tiny models, and a
//!   3-rank SmolLM2 pipeline, generate the same greedy tokens as a runner holding the whole
//!   model, and rank 0's `Shutdown` stops every rank with exit code 0;
//! - a rank whose neighbour never comes reports `failed` naming it within its deadline;
//! - a rank killed mid-generation ends rank 0's request with an error and `failed` within
//!   seconds, and the ranks still alive exit non-zero on their own.

mod common;

use common::{smollm2, temp_dir, write_tiny_model, RankNet};
use inference::runner::{serve, RunnerOptions};
use inference::{Completion, GenerateRequest, Prompt, WeightFormat};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::runner::{read_frame, write_frame, Event, NodeCommand, RunnerStatus, Sharding};

const CHILD_ENV: &str = "SHOAL_RUNNER_RING_CHILD";
/// Longest wait for any one expected event (loading SmolLM2 takes about a second).
const PATIENCE: Duration = Duration::from_secs(90);

/// The child: serves the runner protocol over the socket its parent passed as stdin, then
/// exits with the runner's exit code (as `shoal runner` does).
/// Not a test of its own: ignored in a plain run (so it is never counted as passing), run by
/// [`RunnerProc::spawn`] with `--ignored --exact` and `CHILD_ENV` set.
#[test]
#[ignore = "one rank's runner process: its parent test runs it"]
fn runner_ring_child() {
    assert!(
        std::env::var_os(CHILD_ENV).is_some(),
        "a rank's runner process: run only by its parent test, with {CHILD_ENV} set"
    );
    let fd = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
    let socket = UnixStream::from(fd);
    let code = serve(
        socket.try_clone().unwrap(),
        socket,
        RunnerOptions {
            on_load_timeout: Arc::new(|| std::process::exit(3)),
            ..RunnerOptions::default()
        },
    );
    inference::runner::exit_process(code);
}

/// One runner process, its socket and its events (read on a thread, so waits can time out).
struct RunnerProc {
    rank: usize,
    child: Child,
    commands: UnixStream,
    events: mpsc::Receiver<Event>,
    seen: Vec<Event>,
}

impl Drop for RunnerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RunnerProc {
    fn spawn(net: Option<&RankNet>, rank: usize) -> RunnerProc {
        let exe = std::env::current_exe().unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut cmd = match net {
            Some(net) => net.command(rank, &exe),
            None => std::process::Command::new(&exe),
        };
        let child = cmd
            .args([
                "runner_ring_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let mut reader = ours.try_clone().unwrap();
        std::thread::spawn(move || {
            while let Ok(e) = read_frame::<Event>(&mut reader) {
                if tx.send(e).is_err() {
                    return;
                }
            }
        });
        RunnerProc {
            rank,
            child,
            commands: ours,
            events: rx,
            seen: Vec::new(),
        }
    }

    fn send(&mut self, c: &NodeCommand) {
        write_frame(&mut self.commands, c).unwrap();
    }

    /// Events up to and including the first that `stop` accepts; panics after `within`.
    fn until(&mut self, within: Duration, stop: impl Fn(&Event) -> bool) -> Vec<Event> {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let e = match self.events.recv_timeout(left) {
                Ok(e) => e,
                Err(_) => panic!(
                    "rank {}: no expected event within {within:?}; got {got:?} after {:?}",
                    self.rank, self.seen
                ),
            };
            self.seen.push(e.clone());
            let done = stop(&e);
            got.push(e);
            if done {
                return got;
            }
        }
    }

    /// Waits for a state; a `failed` on the way panics with its reason.
    fn expect_state(&mut self, want: RunnerStatus) {
        let rank = self.rank;
        let events = self.until(PATIENCE, |e| {
            matches!(e, Event::State(s) if *s == want || matches!(s, RunnerStatus::Failed { .. }))
        });
        match events.last() {
            Some(Event::State(s)) if *s == want => {}
            other => panic!("rank {rank}: waited for {want:?}, got {other:?}"),
        }
    }

    /// Runs one request to its end: the completion, or the error message.
    fn generate(&mut self, id: u64, request: GenerateRequest) -> Result<Completion, String> {
        self.send(&NodeCommand::Generate { id, request });
        let events = self.until(PATIENCE, |e| {
            matches!(e, Event::Done { id: i, .. } | Event::Error { id: Some(i), .. } if *i == id)
        });
        match events.last() {
            Some(Event::Done { completion, .. }) => Ok(completion.clone()),
            Some(Event::Error { message, .. }) => Err(message.clone()),
            _ => unreachable!(),
        }
    }

    /// Waits for the process to end; its exit code.
    fn exit_code(&mut self, within: Duration) -> Option<i32> {
        self.exit_status(within).code()
    }

    /// How the process ended (a signal is named in its `Display`).
    fn exit_status(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "rank {} did not exit within {within:?}",
                self.rank
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// CPU seconds (user + system) the process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// A serving rank waits for the next step asleep: MLX's ring spins in its receive loop, so
/// the stages wait in `poll(2)` first. Spinning would use about a core (at least half of one
/// on a loaded machine); asleep, a few milliseconds.
fn assert_idle(r: &RunnerProc) {
    let pid = r.child.id();
    let before = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_seconds(pid) - before;
    eprintln!("idle serving rank {}: {used:.2} CPU s in 2 s", r.rank);
    assert!(
        used < 0.3,
        "rank {} spins while idle: {used} CPU s in 2 s",
        r.rank
    );
}

/// How one instance is split.
struct Split {
    sharding: Sharding,
    /// Per rank: its layers (pipeline) or `None` (tensor).
    layers: Vec<Option<(usize, usize)>>,
}

fn base_port(slot: u16) -> u16 {
    50000 + (std::process::id() % 300) as u16 * 40 + slot * 8
}

/// Starts every rank and takes them through `Connect`, `Load` and `WarmUp` in the order the
/// node's planning uses: ranks below n−1 first, rank n−1 once the others are under way.
fn start_instance(net: &RankNet, model: &Path, split: &Split) -> Vec<RunnerProc> {
    let n = net.size();
    let mut ranks: Vec<RunnerProc> = (0..n).map(|r| RunnerProc::spawn(Some(net), r)).collect();
    for r in ranks.iter_mut() {
        r.expect_state(RunnerStatus::Idle);
    }
    for (rank, r) in ranks.iter_mut().enumerate() {
        r.send(&NodeCommand::Connect {
            rank,
            hosts: net.hosts(rank),
            timeout_ms: 60_000,
        });
        if rank + 1 < n {
            r.expect_state(RunnerStatus::Connecting);
        }
    }
    for r in ranks.iter_mut() {
        r.expect_state(RunnerStatus::Connected);
    }
    for (rank, r) in ranks.iter_mut().enumerate() {
        r.send(&NodeCommand::Load {
            model: model.display().to_string(),
            layers: split.layers[rank],
            format: Some(WeightFormat::F32),
            sharding: split.sharding,
        });
    }
    for r in ranks.iter_mut() {
        r.expect_state(RunnerStatus::Loaded);
    }
    for r in ranks.iter_mut() {
        r.send(&NodeCommand::WarmUp);
        r.expect_state(RunnerStatus::WarmingUp);
    }
    for r in ranks.iter_mut() {
        r.expect_state(RunnerStatus::Ready);
    }
    ranks
}

/// A runner holding the whole model (a ring of one) answers `request`.
fn single_rank(model: &Path, request: &GenerateRequest) -> Completion {
    let mut r = RunnerProc::spawn(None, 0);
    r.expect_state(RunnerStatus::Idle);
    r.send(&NodeCommand::Load {
        model: model.display().to_string(),
        layers: None,
        format: Some(WeightFormat::F32),
        sharding: Sharding::Pipeline,
    });
    r.expect_state(RunnerStatus::Ready);
    let c = r.generate(1, request.clone()).unwrap();
    r.send(&NodeCommand::Shutdown);
    assert_eq!(r.exit_code(Duration::from_secs(10)), Some(0));
    c
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    let mut req = GenerateRequest::new(Prompt::Tokens(prompt), max_tokens);
    req.ignore_eos = true;
    req
}

/// Greedy tokens of the instance equal the single runner's; returns the largest logprob
/// difference of the chosen tokens.
fn compare(label: &str, want: &Completion, got: &Completion) -> f32 {
    assert_eq!(got.tokens, want.tokens, "{label}: greedy tokens differ");
    let worst = want
        .logprobs
        .iter()
        .zip(&got.logprobs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // The same f32 operations, split differently (partial sums in another order for tensor
    // parallelism): rounding-level differences only.
    assert!(worst < 1e-3, "{label}: logprobs differ by {worst}");
    eprintln!(
        "{label}: {} tokens equal, logprob max |Δ| {worst:e}; prompt {:.0} tok/s, generation \
         {:.1} tok/s (one runner: {:.0} / {:.1})",
        got.tokens.len(),
        got.prompt_tps(),
        got.generation_tps(),
        want.prompt_tps(),
        want.generation_tps()
    );
    worst
}

/// Rank 0's `Shutdown` stops every rank: all exit 0 on their own.
fn shut_down(mut ranks: Vec<RunnerProc>) {
    ranks[0].send(&NodeCommand::Shutdown);
    for r in ranks.iter_mut() {
        let status = r.exit_status(Duration::from_secs(15));
        assert_eq!(status.code(), Some(0), "rank {}: {status}", r.rank);
    }
}

fn place(net: &RankNet) -> &'static str {
    if net.in_namespaces() {
        "namespaces"
    } else {
        "loopback"
    }
}

#[test]
fn tiny_llama_two_rank_pipeline_runners_match_one_runner() {
    let dir = temp_dir("runner-ring-llama");
    write_tiny_model(&dir, "llama", 21, 512);
    // 300 prompt tokens: more than one prefill chunk (256) goes around the ring.
    let prompt: Vec<u32> = (0..300).map(|i| (i * 5 + 1) % 96).collect();
    let request = greedy(prompt, 12);
    let want = single_rank(&dir, &request);
    let net = RankNet::new("rpp", 2, base_port(0));
    let split = Split {
        sharding: Sharding::Pipeline,
        layers: vec![Some((0, 2)), Some((2, 4))],
    };
    let mut ranks = start_instance(&net, &dir, &split);
    let got = ranks[0].generate(7, request.clone()).unwrap();
    compare(&format!("2-rank pipeline ({})", place(&net)), &want, &got);
    assert_idle(&ranks[1]);
    // A second request starts from a clean cache on every rank.
    let again = ranks[0].generate(8, request).unwrap();
    assert_eq!(again.tokens, want.tokens);
    // Only rank 0 takes requests.
    let refused = ranks[1].generate(9, greedy(vec![1], 1)).unwrap_err();
    assert!(refused.contains("only rank 0"), "{refused}");
    shut_down(ranks);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tiny_qwen3_two_rank_tensor_runners_match_one_runner() {
    let dir = temp_dir("runner-ring-qwen3");
    write_tiny_model(&dir, "qwen3", 22, 512);
    // 300 prompt tokens: more than one prefill chunk (256).
    let prompt: Vec<u32> = (0..300).map(|i| (i * 7 + 3) % 96).collect();
    let request = greedy(prompt, 10);
    let want = single_rank(&dir, &request);
    let net = RankNet::new("rtp", 2, base_port(1));
    let split = Split {
        sharding: Sharding::Tensor,
        layers: vec![None, None],
    };
    let mut ranks = start_instance(&net, &dir, &split);
    let got = ranks[0].generate(7, request).unwrap();
    compare(&format!("2-rank tensor ({})", place(&net)), &want, &got);
    assert_idle(&ranks[1]);
    shut_down(ranks);
    std::fs::remove_dir_all(&dir).ok();
}

/// Also the failure path: after the equality check, rank 1 (the middle of the ring) is killed
/// during a long generation.
#[test]
fn smollm2_three_rank_pipeline_runners_match_one_runner_and_survive_a_lost_rank() {
    let model = smollm2();
    let prompt: Vec<u32> = common::SMOLLM2_PROMPT
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect();
    let request = greedy(prompt.clone(), 8);
    let want = single_rank(&model, &request);
    let net = RankNet::new("r3", 3, base_port(2));
    let split = Split {
        sharding: Sharding::Pipeline,
        layers: vec![Some((0, 10)), Some((10, 20)), Some((20, 30))],
    };
    let mut ranks = start_instance(&net, &model, &split);
    let got = ranks[0].generate(7, request).unwrap();
    compare(
        &format!("3-rank SmolLM2 pipeline ({})", place(&net)),
        &want,
        &got,
    );

    ranks[0].send(&NodeCommand::Generate {
        id: 8,
        request: greedy(prompt, 1000),
    });
    ranks[0].until(PATIENCE, |e| matches!(e, Event::Token { id: 8, .. }));
    let killed_at = Instant::now();
    let _ = ranks[1].child.kill();
    let events = ranks[0].until(Duration::from_secs(20), |e| {
        matches!(e, Event::State(RunnerStatus::Failed { .. }))
    });
    let ended = killed_at.elapsed();
    let error = events.iter().find_map(|e| match e {
        Event::Error {
            id: Some(8),
            message,
        } => Some(message.clone()),
        _ => None,
    });
    assert!(
        error.is_some(),
        "the request in flight ends with an error: {events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::Done { id: 8, .. })),
        "{events:?}"
    );
    let Some(Event::State(RunnerStatus::Failed { reason })) = events.last() else {
        unreachable!()
    };
    assert!(reason.contains("rank 0 lost the ring"), "{reason}");
    eprintln!("rank 1 killed: rank 0 failed after {ended:?}: {reason}");
    assert_eq!(ranks[0].exit_code(Duration::from_secs(10)), Some(1));
    // The last rank lost its left neighbour: it fails and exits by itself.
    ranks[2].until(Duration::from_secs(20), |e| {
        matches!(e, Event::State(RunnerStatus::Failed { .. }))
    });
    assert_eq!(ranks[2].exit_code(Duration::from_secs(10)), Some(1));
}

#[test]
fn a_rank_whose_neighbour_never_comes_fails_naming_it() {
    let net = RankNet::new("rlone", 2, base_port(3));
    let mut r = RunnerProc::spawn(Some(&net), 0);
    r.expect_state(RunnerStatus::Idle);
    let started = Instant::now();
    r.send(&NodeCommand::Connect {
        rank: 0,
        hosts: net.hosts(0),
        timeout_ms: 3_000,
    });
    r.expect_state(RunnerStatus::Connecting);
    let events = r.until(Duration::from_secs(40), |e| {
        matches!(e, Event::State(RunnerStatus::Failed { .. }))
    });
    let Some(Event::State(RunnerStatus::Failed { reason })) = events.last() else {
        unreachable!()
    };
    let waited = started.elapsed();
    assert!(
        reason.contains("rank 1"),
        "the reason names the neighbour: {reason}"
    );
    assert!(
        reason.contains(&net.hosts(0)[1][0]),
        "and its address: {reason}"
    );
    eprintln!("lonely rank 0 failed after {waited:?}: {reason}");
    assert_eq!(r.exit_code(Duration::from_secs(10)), Some(1));
    // Nothing is left behind.
    if let Some(prefix) = net.netns_prefix() {
        drop(net);
        assert!(
            common::netns::list(&prefix).is_empty(),
            "namespaces {prefix}-* left behind"
        );
    }
}
