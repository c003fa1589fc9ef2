//! The runner protocol end to end over real pipes: load with progress and states, generate
//! with streamed tokens, cancel, bad frames (a bad request's own frame answered by its id),
//! failures and the load watchdog.

mod common;

use common::{temp_dir, write_tiny_model};
use inference::runner::{load_timeout, serve, RunnerOptions};
use inference::{FinishReason, GenerateRequest, Prompt, WeightFormat};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use wire::runner::{read_frame, write_frame, Event, NodeCommand, RunnerStatus, Sharding};

struct Runner {
    commands: std::io::PipeWriter,
    events: std::io::PipeReader,
    handle: std::thread::JoinHandle<i32>,
}

fn start(options: RunnerOptions) -> Runner {
    let (cmd_r, cmd_w) = std::io::pipe().unwrap();
    let (ev_r, ev_w) = std::io::pipe().unwrap();
    let handle = std::thread::spawn(move || serve(cmd_r, ev_w, options));
    Runner {
        commands: cmd_w,
        events: ev_r,
        handle,
    }
}

impl Runner {
    fn send(&mut self, c: &NodeCommand) {
        write_frame(&mut self.commands, c).unwrap();
    }
    fn next(&mut self) -> Event {
        read_frame(&mut self.events).unwrap()
    }
    /// Events up to and including the first that matches.
    fn until(&mut self, stop: impl Fn(&Event) -> bool) -> Vec<Event> {
        let mut v = Vec::new();
        loop {
            let e = self.next();
            let done = stop(&e);
            v.push(e);
            if done {
                return v;
            }
        }
    }
}

fn options() -> RunnerOptions {
    RunnerOptions {
        load_timeout_base: Duration::from_secs(60),
        on_load_timeout: Arc::new(|| {}),
        warm_up: true,
    }
}

fn is_state(e: &Event, s: &RunnerStatus) -> bool {
    matches!(e, Event::State(x) if x == s)
}

#[test]
fn load_generate_cancel_and_shutdown() {
    let dir = temp_dir("runner");
    write_tiny_model(&dir, "qwen3", 11, 256);
    let mut r = start(options());
    assert!(is_state(&r.next(), &RunnerStatus::Idle));
    r.send(&NodeCommand::Load {
        model: dir.display().to_string(),
        layers: None,
        format: Some(WeightFormat::F32),
        sharding: Sharding::Pipeline,
    });
    let events = r.until(|e| {
        is_state(e, &RunnerStatus::Ready) || matches!(e, Event::State(RunnerStatus::Failed { .. }))
    });
    let states: Vec<&RunnerStatus> = events
        .iter()
        .filter_map(|e| {
            if let Event::State(s) = e {
                Some(s)
            } else {
                None
            }
        })
        .collect();
    assert!(
        matches!(states.first(), Some(RunnerStatus::Loading { .. })),
        "{states:?}"
    );
    assert!(
        states.iter().any(
            |s| matches!(s, RunnerStatus::Loading { layers_loaded, total } if layers_loaded == total && *total == 6)
        ),
        "{states:?}"
    );
    let tail: Vec<_> = states
        .iter()
        .rev()
        .take(3)
        .rev()
        .cloned()
        .cloned()
        .collect();
    assert_eq!(
        tail,
        vec![
            RunnerStatus::Loaded,
            RunnerStatus::WarmingUp,
            RunnerStatus::Ready
        ]
    );

    let mut req = GenerateRequest::new(Prompt::Tokens(vec![4, 8, 15, 16]), 5);
    req.ignore_eos = true;
    r.send(&NodeCommand::Generate {
        id: 1,
        request: req.clone(),
    });
    let events = r.until(|e| is_state(e, &RunnerStatus::Ready));
    assert!(is_state(&events[0], &RunnerStatus::Running));
    let tokens: Vec<u32> = events
        .iter()
        .filter_map(|e| {
            if let Event::Token { id: 1, token, .. } = e {
                Some(*token)
            } else {
                None
            }
        })
        .collect();
    let done = events
        .iter()
        .find_map(|e| {
            if let Event::Done { id: 1, completion } = e {
                Some(completion.clone())
            } else {
                None
            }
        })
        .unwrap();
    assert_eq!(tokens, done.tokens);
    assert_eq!(done.finish_reason, FinishReason::Length);

    // A garbled frame is reported and skipped; the runner stays usable.
    let body = br#"{"v":2,"msg":{"type":"frobnicate"}}"#;
    r.commands
        .write_all(&(body.len() as u32).to_le_bytes())
        .unwrap();
    r.commands.write_all(body).unwrap();
    assert!(matches!(r.next(), Event::Error { id: None, .. }));
    // A request whose message cannot be read is answered with an error for its id (the node
    // ends it at once instead of waiting for its step deadline), and nothing runs.
    let body = br#"{"v":2,"msg":{"type":"generate","id":9,"request":{"prompt":42}}}"#;
    r.commands
        .write_all(&(body.len() as u32).to_le_bytes())
        .unwrap();
    r.commands.write_all(body).unwrap();
    match r.next() {
        Event::Error {
            id: Some(9),
            message,
        } => assert!(message.contains("could not read this request"), "{message}"),
        other => panic!("expected an error for request 9, got {other:?}"),
    }

    // Cancel a long generation: it ends early with `cancelled`.
    req.max_tokens = 200;
    r.send(&NodeCommand::Generate {
        id: 2,
        request: req,
    });
    r.send(&NodeCommand::Cancel { id: 2 });
    let events = r.until(|e| is_state(e, &RunnerStatus::Ready));
    let done = events
        .iter()
        .find_map(|e| {
            if let Event::Done { id: 2, completion } = e {
                Some(completion.clone())
            } else {
                None
            }
        })
        .unwrap();
    assert_eq!(done.finish_reason, FinishReason::Cancelled);
    assert!(done.tokens.len() < 200);

    // Bad requests are errors for that request only.
    r.send(&NodeCommand::Generate {
        id: 3,
        request: GenerateRequest::new(Prompt::Tokens(vec![]), 3),
    });
    let events = r.until(|e| is_state(e, &RunnerStatus::Ready));
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Error { id: Some(3), message } if message.contains("empty"))));

    r.send(&NodeCommand::Shutdown);
    assert_eq!(r.handle.join().unwrap(), 0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_missing_model_fails_with_a_reason() {
    let mut r = start(options());
    assert!(is_state(&r.next(), &RunnerStatus::Idle));
    r.send(&NodeCommand::Load {
        model: "/nonexistent/model.gguf".into(),
        layers: None,
        format: None,
        sharding: Sharding::Pipeline,
    });
    let events = r.until(|e| matches!(e, Event::State(RunnerStatus::Failed { .. })));
    let Event::State(RunnerStatus::Failed { reason }) = events.last().unwrap() else {
        unreachable!()
    };
    assert!(reason.contains("/nonexistent/model.gguf"), "{reason}");
    assert_eq!(r.handle.join().unwrap(), 1);
}

#[test]
fn the_load_watchdog_reports_a_timeout() {
    assert_eq!(
        load_timeout(Duration::from_secs(60), 12_000_000_000),
        Duration::from_secs(180)
    );
    let dir = temp_dir("runner-watchdog");
    write_tiny_model(&dir, "llama", 12, 64);
    let fired = Arc::new(AtomicBool::new(false));
    let flag = fired.clone();
    let mut r = start(RunnerOptions {
        load_timeout_base: Duration::ZERO,
        on_load_timeout: Arc::new(move || flag.store(true, Ordering::SeqCst)),
        warm_up: false,
    });
    assert!(is_state(&r.next(), &RunnerStatus::Idle));
    r.send(&NodeCommand::Load {
        model: dir.display().to_string(),
        layers: None,
        format: Some(WeightFormat::F32),
        sharding: Sharding::Pipeline,
    });
    let events = r.until(|e| matches!(e, Event::State(RunnerStatus::Failed { .. })));
    let Event::State(RunnerStatus::Failed { reason }) = events.last().unwrap() else {
        unreachable!()
    };
    assert_eq!(reason, "model loading timed out after 0 s");
    // The callback (which exits the real runner) runs right after the report.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !fired.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(fired.load(Ordering::SeqCst));
    drop(r.commands);
    let _ = r.handle.join();
    std::fs::remove_dir_all(&dir).ok();
}
