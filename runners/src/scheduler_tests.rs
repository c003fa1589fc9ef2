//! The scheduler's unit tests: a scheduler driven by hand, with a `sleep` as its runner.

use super::*;
use wire::request::{Completion, FinishReason, Prompt};

/// A scheduler driven by hand: events go in as if from the runner, commands come out as
/// they would go to it. The "runner" process is a `sleep` that the test kills.
struct Harness {
    inputs: mpsc::UnboundedSender<SchedulerInput>,
    commands: std::sync::mpsc::Receiver<NodeCommand>,
    state: watch::Receiver<RunnerStatus>,
    load: Arc<std::sync::atomic::AtomicUsize>,
    child: Arc<Mutex<Child>>,
    hung: Arc<std::sync::atomic::AtomicBool>,
}

impl Harness {
    fn new() -> Harness {
        Harness::with_limit(1)
    }

    /// A scheduler that keeps up to `max_running` requests in the runner.
    fn with_limit(max_running: usize) -> Harness {
        Harness::with_settings(max_running, Duration::from_secs(600))
    }

    /// A scheduler with the given batch limit and step timeout.
    fn with_settings(max_running: usize, step_timeout: Duration) -> Harness {
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep starts");
        let child = Arc::new(Mutex::new(child));
        let (commands_tx, commands) = std::sync::mpsc::channel();
        let (state_tx, state) = watch::channel(RunnerStatus::Idle);
        let (inputs, inputs_rx) = mpsc::unbounded_channel();
        let load = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let scheduler = Scheduler::new(
            commands_tx,
            state_tx,
            child.clone(),
            load.clone(),
            max_running,
            step_timeout,
        );
        let hung = scheduler.hung_flag();
        tokio::spawn(scheduler.run(inputs_rx));
        Harness {
            hung,
            inputs,
            commands,
            state,
            load,
            child,
        }
    }

    fn submit(&self, id: u64) -> mpsc::UnboundedReceiver<Event> {
        let (events, rx) = mpsc::unbounded_channel();
        let request = GenerateRequest::new(Prompt::Tokens(vec![1, 2, 3]), 4);
        self.inputs
            .send(SchedulerInput::Submit {
                id,
                request: Box::new(request),
                events,
            })
            .unwrap();
        rx
    }

    fn runner(&self, event: Event) {
        self.inputs.send(SchedulerInput::Runner(event)).unwrap();
    }

    /// The next command sent to the runner, if one comes within a second.
    async fn next_command(&self) -> Option<NodeCommand> {
        for _ in 0..100 {
            if let Ok(c) = self.commands.try_recv() {
                return Some(c);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn completion() -> Completion {
    Completion {
        text: "hi".into(),
        tokens: vec![7],
        logprobs: vec![-0.5],
        finish_reason: FinishReason::Length,
        prompt_tokens: 3,
        cached_tokens: 0,
        prompt_seconds: 0.0,
        generation_seconds: 0.0,
    }
}

fn generate_id(command: Option<NodeCommand>) -> u64 {
    match command {
        Some(NodeCommand::Generate { id, .. }) => id,
        other => panic!("expected a Generate, got {other:?}"),
    }
}

#[tokio::test]
async fn requests_run_one_at_a_time_in_order_and_queued_cancels_never_reach_the_runner() {
    let h = Harness::new();
    let mut first = h.submit(1);
    let second = h.submit(2);
    let mut third = h.submit(3);
    h.settle().await;
    assert!(
        h.next_command().await.is_none(),
        "nothing is sent before the runner is ready"
    );
    assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 3);

    h.runner(Event::State(RunnerStatus::Ready));
    assert_eq!(generate_id(h.next_command().await), 1);
    h.inputs.send(SchedulerInput::Cancel(2)).unwrap();
    drop(second);
    h.runner(Event::State(RunnerStatus::Running));
    h.runner(Event::Token {
        id: 1,
        token: 7,
        text: "hi".into(),
        logprob: -0.5,
        top_logprobs: None,
    });
    h.settle().await;
    assert!(h.next_command().await.is_none(), "one request at a time");
    h.runner(Event::Done {
        id: 1,
        completion: completion(),
    });
    h.runner(Event::State(RunnerStatus::Ready));
    assert_eq!(
        first.recv().await,
        Some(Event::Token {
            id: 1,
            token: 7,
            text: "hi".into(),
            logprob: -0.5,
            top_logprobs: None,
        })
    );
    assert_eq!(
        first.recv().await,
        Some(Event::Done {
            id: 1,
            completion: completion()
        })
    );
    // Request 2 was cancelled while queued: the next one sent is 3.
    assert_eq!(generate_id(h.next_command().await), 3);
    assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 1);

    // Cancelling the running request forwards a Cancel to the runner, once.
    h.inputs.send(SchedulerInput::Cancel(3)).unwrap();
    h.inputs.send(SchedulerInput::Cancel(3)).unwrap();
    assert_eq!(h.next_command().await, Some(NodeCommand::Cancel { id: 3 }));
    assert!(h.next_command().await.is_none());
    h.runner(Event::Error {
        id: Some(3),
        message: "stopped".into(),
    });
    assert_eq!(
        third.recv().await,
        Some(Event::Error {
            id: Some(3),
            message: "stopped".into()
        })
    );
    assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 0);
    let _ = h.child.lock().unwrap().kill();
}

#[tokio::test]
async fn up_to_the_limit_run_at_once_and_the_next_starts_when_one_ends() {
    let h = Harness::with_limit(2);
    h.runner(Event::State(RunnerStatus::Ready));
    let mut first = h.submit(1);
    let mut second = h.submit(2);
    let _third = h.submit(3);
    assert_eq!(generate_id(h.next_command().await), 1);
    // The runner is `running` now: the second still goes in, the third waits.
    h.runner(Event::State(RunnerStatus::Running));
    assert_eq!(generate_id(h.next_command().await), 2);
    assert!(h.next_command().await.is_none(), "two at once at most");
    // Tokens of the two interleave, each to its own requester.
    for id in [2, 1, 2] {
        h.runner(Event::Token {
            id,
            token: id as u32,
            text: "x".into(),
            logprob: 0.0,
            top_logprobs: None,
        });
    }
    // Cancelling one running request reaches the runner; the other keeps going.
    h.inputs.send(SchedulerInput::Cancel(1)).unwrap();
    assert_eq!(h.next_command().await, Some(NodeCommand::Cancel { id: 1 }));
    h.runner(Event::Done {
        id: 1,
        completion: completion(),
    });
    assert_eq!(generate_id(h.next_command().await), 3);
    let tokens = |rx: &mut mpsc::UnboundedReceiver<Event>| {
        let mut v = Vec::new();
        while let Ok(Event::Token { token, .. }) = rx.try_recv() {
            v.push(token);
        }
        v
    };
    h.settle().await;
    assert_eq!(tokens(&mut first), vec![1]);
    assert_eq!(tokens(&mut second), vec![2, 2]);
    assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 2);
    let _ = h.child.lock().unwrap().kill();
}

#[tokio::test]
async fn runner_death_fails_running_and_queued_requests_and_later_ones() {
    let mut h = Harness::new();
    h.runner(Event::State(RunnerStatus::Ready));
    let mut running = h.submit(1);
    let mut queued = h.submit(2);
    assert_eq!(generate_id(h.next_command().await), 1);
    h.child.lock().unwrap().kill().unwrap();
    h.inputs
        .send(SchedulerInput::RunnerGone(
            "the runner process exited".into(),
        ))
        .unwrap();
    for rx in [&mut running, &mut queued] {
        match rx.recv().await {
            Some(Event::State(RunnerStatus::Failed { reason })) => {
                assert!(reason.contains("exited"), "{reason}")
            }
            other => panic!("expected instance lost, got {other:?}"),
        }
    }
    let state = h
        .state
        .wait_for(|s| matches!(s, RunnerStatus::Failed { .. }))
        .await
        .unwrap()
        .clone();
    assert!(matches!(state, RunnerStatus::Failed { .. }));
    let mut late = h.submit(3);
    assert!(matches!(
        late.recv().await,
        Some(Event::State(RunnerStatus::Failed { .. }))
    ));
    assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn lifecycle_commands_pass_through_until_the_runner_fails() {
    let h = Harness::new();
    let connect = NodeCommand::Connect {
        rank: 0,
        hosts: vec![vec!["0.0.0.0:50000".into()]],
        timeout_ms: 1000,
    };
    h.inputs
        .send(SchedulerInput::Lifecycle(connect.clone()))
        .unwrap();
    assert_eq!(h.next_command().await, Some(connect));
    h.runner(Event::State(RunnerStatus::Failed {
        reason: "neighbour 10.0.0.2 never came".into(),
    }));
    h.settle().await;
    h.inputs
        .send(SchedulerInput::Lifecycle(NodeCommand::WarmUp))
        .unwrap();
    assert!(
        h.next_command().await.is_none(),
        "a failed runner gets no more commands"
    );
    let _ = h.child.lock().unwrap().kill();
}

#[tokio::test]
async fn a_runner_that_reports_failure_fails_its_requests_with_the_reason() {
    let h = Harness::new();
    let mut waiting = h.submit(1);
    h.runner(Event::State(RunnerStatus::Failed {
        reason: "model loading timed out after 60 s".into(),
    }));
    assert_eq!(
        waiting.recv().await,
        Some(instance_lost("model loading timed out after 60 s"))
    );
    let _ = h.child.lock().unwrap().kill();
}

#[tokio::test]
async fn a_runner_that_stops_making_progress_is_ended_and_its_requests_told_why() {
    let h = Harness::with_settings(2, Duration::from_millis(400));
    let mut first = h.submit(1);
    h.runner(Event::State(RunnerStatus::Ready));
    assert_eq!(generate_id(h.next_command().await), 1);
    // Steps that only compute a prompt chunk keep it alive past the timeout.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        h.runner(Event::Stepped);
    }
    assert!(first.try_recv().is_err(), "a runner that steps is not hung");
    assert_eq!(*h.state.borrow(), RunnerStatus::Ready);
    // Then nothing comes: the request ends with the reason, the runner is killed.
    let started = std::time::Instant::now();
    let Some(Event::State(RunnerStatus::Failed { reason })) = first.recv().await else {
        panic!("the request did not end");
    };
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert!(h.hung.load(std::sync::atomic::Ordering::SeqCst), "{reason}");
    assert!(reason.contains("0.4 s"), "{reason}");
    assert!(
        matches!(&*h.state.borrow(), RunnerStatus::Failed { reason: r } if *r == reason),
        "{:?}",
        *h.state.borrow()
    );
    let exited = h
        .child
        .lock()
        .unwrap()
        .wait()
        .expect("the runner was killed");
    assert!(!exited.success());
    assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 0);
    // A request after that ends at once with the same reason.
    let mut later = h.submit(2);
    assert_eq!(later.recv().await, Some(instance_lost(reason)));
}

#[tokio::test]
async fn an_idle_runner_is_never_taken_for_hung() {
    let h = Harness::with_settings(1, Duration::from_millis(200));
    h.runner(Event::State(RunnerStatus::Ready));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(*h.state.borrow(), RunnerStatus::Ready);
    assert!(h.child.lock().unwrap().try_wait().unwrap().is_none());
    let _ = h.child.lock().unwrap().kill();
}
