//! `shoal runner` as a real child process: frames on stdin/stdout, the SmolLM2 fixture, a
//! failed load, and the load watchdog's exit.

use inference::{ChatMessage, GenerateRequest, Prompt};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use wire::runner::{read_frame, write_frame, Event, NodeCommand, RunnerStatus, Sharding};

fn fixture() -> String {
    let p = kit::dirs::default_model_path();
    assert!(
        p.exists(),
        "{} is missing: run `cargo xtask setup`",
        p.display()
    );
    p.display().to_string()
}

fn spawn(envs: &[(&str, &str)]) -> (Child, ChildStdin, ChildStdout) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"))
        .arg("runner")
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    (child, stdin, stdout)
}

fn until_state(out: &mut ChildStdout, done: impl Fn(&RunnerStatus) -> bool) -> Vec<Event> {
    let mut events = Vec::new();
    loop {
        let e: Event = read_frame(out).unwrap();
        let stop = matches!(&e, Event::State(s) if done(s));
        events.push(e);
        if stop {
            return events;
        }
    }
}

#[test]
fn runner_process_loads_and_answers() {
    let (mut child, mut stdin, mut stdout) = spawn(&[]);
    write_frame(
        &mut stdin,
        &NodeCommand::Load {
            model: fixture(),
            layers: None,
            format: None,
            sharding: Sharding::Pipeline,
        },
    )
    .unwrap();
    let events = until_state(&mut stdout, |s| {
        matches!(s, RunnerStatus::Ready | RunnerStatus::Failed { .. })
    });
    assert!(
        matches!(events.last(), Some(Event::State(RunnerStatus::Ready))),
        "{events:?}"
    );
    let question = Prompt::Chat(vec![ChatMessage::new(
        "user",
        "What is the capital of France?",
    )]);
    write_frame(
        &mut stdin,
        &NodeCommand::Generate {
            id: 5,
            request: GenerateRequest::new(question, 16),
        },
    )
    .unwrap();
    let events = until_state(&mut stdout, |s| *s == RunnerStatus::Ready);
    let streamed: String = events
        .iter()
        .filter_map(|e| {
            if let Event::Token { text, .. } = e {
                Some(text.as_str())
            } else {
                None
            }
        })
        .collect();
    let done = events
        .iter()
        .find_map(|e| {
            if let Event::Done { id: 5, completion } = e {
                Some(completion)
            } else {
                None
            }
        })
        .unwrap();
    assert!(done.text.contains("Paris"), "{:?}", done.text);
    assert_eq!(streamed, done.text);
    write_frame(&mut stdin, &NodeCommand::Shutdown).unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn runner_process_reports_failures_and_exits() {
    let (mut child, mut stdin, mut stdout) = spawn(&[]);
    write_frame(
        &mut stdin,
        &NodeCommand::Load {
            model: "/nonexistent.gguf".into(),
            layers: None,
            format: None,
            sharding: Sharding::Pipeline,
        },
    )
    .unwrap();
    let events = until_state(&mut stdout, |s| matches!(s, RunnerStatus::Failed { .. }));
    assert!(
        matches!(events.last(), Some(Event::State(RunnerStatus::Failed { reason })) if reason.contains("/nonexistent.gguf"))
    );
    assert_eq!(child.wait().unwrap().code(), Some(1));

    // A load timeout of (almost) zero: the watchdog reports and exits the process. (One of the
    // fixture's 30 layers, kept quantized: its 4 MB add nothing to the base, where the whole
    // model's 98 MB as run would add a second, and the load would finish in it.)
    let (mut child, mut stdin, mut stdout) = spawn(&[("SHOAL_MODEL_LOAD_TIMEOUT", "0.000001")]);
    write_frame(
        &mut stdin,
        &NodeCommand::Load {
            model: fixture(),
            layers: Some((0, 1)),
            format: Some(inference::WeightFormat::Quantized),
            sharding: Sharding::Pipeline,
        },
    )
    .unwrap();
    let events = until_state(&mut stdout, |s| matches!(s, RunnerStatus::Failed { .. }));
    let Some(Event::State(RunnerStatus::Failed { reason })) = events.last() else {
        unreachable!()
    };
    assert_eq!(reason, "model loading timed out after 0 s");
    assert_eq!(child.wait().unwrap().code(), Some(3));
}
