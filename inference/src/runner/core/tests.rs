//! The runner's lifecycle, fed input by input: the events the node sees and the work asked
//! of the IO loop, for each path the node relies on.

use super::*;
use crate::request::{FinishReason, Prompt};

fn started(warm_up: bool) -> RunnerCore {
    let mut core = RunnerCore::new(warm_up);
    assert_eq!(
        core.handle(RunnerInput::Started(Ok(()))),
        vec![Output::Event(Event::State(RunnerStatus::Idle))]
    );
    core
}

fn cmd(core: &mut RunnerCore, command: NodeCommand) -> Vec<Output> {
    core.handle(RunnerInput::Command(command))
}

fn st(s: RunnerStatus) -> Output {
    Output::Event(Event::State(s))
}

fn err(id: Option<u64>, message: &str) -> Output {
    Output::Event(Event::Error {
        id,
        message: message.into(),
    })
}

fn load(sharding: Sharding, layers: Option<(usize, usize)>) -> NodeCommand {
    NodeCommand::Load {
        model: "/m.gguf".into(),
        layers,
        format: None,
        sharding,
    }
}

fn generate(id: u64) -> NodeCommand {
    NodeCommand::Generate {
        id,
        request: GenerateRequest::new(Prompt::Tokens(vec![1, 2]), 4),
    }
}

fn completion() -> Completion {
    Completion {
        text: "ok".into(),
        tokens: vec![5],
        logprobs: vec![-0.5],
        finish_reason: FinishReason::Length,
        prompt_tokens: 2,
        cached_tokens: 0,
        prompt_seconds: 0.0,
        generation_seconds: 0.0,
    }
}

fn failed(outputs: &[Output]) -> String {
    outputs
        .iter()
        .find_map(|o| match o {
            Output::Event(Event::State(RunnerStatus::Failed { reason })) => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no failed state in {outputs:?}"))
}

/// A ring of one, loaded and warmed up.
fn ready_whole() -> RunnerCore {
    let mut core = started(true);
    cmd(&mut core, load(Sharding::Pipeline, None));
    core.handle(RunnerInput::Loaded(Ok(true)));
    core.handle(RunnerInput::WarmedUp(Ok(())));
    core
}

fn seat(rank: usize, size: usize) -> Seat {
    Seat {
        rank,
        size,
        neighbours: "neighbour rank 1 (10.99.0.2:5000)".into(),
    }
}

/// Rank `rank` of a 2-rank pipeline, connected and loaded.
fn loaded_rank(rank: usize) -> RunnerCore {
    let mut core = started(true);
    let hosts = vec![
        vec!["0.0.0.0:5000".to_owned()],
        vec!["10.99.0.2:5000".into()],
    ];
    assert_eq!(
        cmd(
            &mut core,
            NodeCommand::Connect {
                rank,
                hosts: hosts.clone(),
                timeout_ms: 500
            }
        ),
        vec![
            st(RunnerStatus::Connecting),
            Output::Action(RunnerAction::Connect {
                rank,
                hosts,
                timeout_ms: 500
            })
        ]
    );
    assert_eq!(
        core.handle(RunnerInput::Connected(Ok(seat(rank, 2)))),
        vec![st(RunnerStatus::Connected)]
    );
    let layers = Some(if rank == 0 { (0, 2) } else { (2, 4) });
    assert_eq!(
        cmd(&mut core, load(Sharding::Pipeline, layers)),
        vec![Output::Action(RunnerAction::Load {
            model: "/m.gguf".into(),
            layers,
            format: None,
            sharding: Some(Sharding::Pipeline),
        })]
    );
    assert_eq!(
        core.handle(RunnerInput::Loaded(Ok(false))),
        vec![st(RunnerStatus::Loaded)]
    );
    core
}

#[test]
fn generate_before_load_is_refused() {
    let mut core = started(true);
    assert_eq!(
        cmd(&mut core, generate(4)),
        vec![err(Some(4), "no model is loaded yet")]
    );
    assert_eq!(
        cmd(&mut core, NodeCommand::WarmUp),
        vec![err(None, "WarmUp needs a loaded model")]
    );
    assert!(!core.exited());
}

#[test]
fn a_ring_of_one_loads_warms_up_and_gets_ready() {
    let mut core = started(true);
    // `Connect` to a ring of one answers at once.
    assert_eq!(
        cmd(
            &mut core,
            NodeCommand::Connect {
                rank: 0,
                hosts: vec![vec!["0.0.0.0:1".into()]],
                timeout_ms: 10
            }
        ),
        vec![st(RunnerStatus::Connected)]
    );
    assert_eq!(
        cmd(&mut core, load(Sharding::Tensor, None)),
        vec![Output::Action(RunnerAction::Load {
            model: "/m.gguf".into(),
            layers: None,
            format: None,
            sharding: None,
        })]
    );
    let progress = [(0, 1), (1, 6), (6, 6)];
    for (done, total) in progress {
        assert_eq!(
            core.handle(RunnerInput::LoadProgress { done, total }),
            vec![st(RunnerStatus::Loading {
                layers_loaded: done as u32,
                total: total as u32,
            })]
        );
    }
    assert_eq!(
        core.handle(RunnerInput::Loaded(Ok(true))),
        vec![
            st(RunnerStatus::Loaded),
            st(RunnerStatus::WarmingUp),
            Output::Action(RunnerAction::WarmUp)
        ]
    );
    assert_eq!(
        core.handle(RunnerInput::WarmedUp(Ok(()))),
        vec![st(RunnerStatus::Ready)]
    );
    assert_eq!(
        cmd(&mut core, NodeCommand::WarmUp),
        vec![err(
            None,
            "WarmUp is for ranks of a multi-rank ring; a ring of one warms up while loading"
        )]
    );
    assert_eq!(
        cmd(&mut core, load(Sharding::Pipeline, None)),
        vec![err(None, "a model is already loaded; start a new runner")]
    );
}

#[test]
fn without_warm_up_or_with_a_part_of_the_model_the_runner_is_ready_at_once() {
    for (warm_up, whole) in [(false, true), (true, false)] {
        let mut core = started(warm_up);
        cmd(&mut core, load(Sharding::Pipeline, Some((0, 2))));
        assert_eq!(
            core.handle(RunnerInput::Loaded(Ok(whole))),
            vec![st(RunnerStatus::Loaded), st(RunnerStatus::Ready)]
        );
    }
}

#[test]
fn requests_run_together_cancels_go_through_at_once_and_the_state_follows_the_batch() {
    let mut core = ready_whole();
    assert_eq!(
        cmd(&mut core, generate(1)),
        vec![
            st(RunnerStatus::Running),
            Output::Action(RunnerAction::Generate {
                id: 1,
                request: GenerateRequest::new(Prompt::Tokens(vec![1, 2]), 4)
            })
        ]
    );
    // While it runs: another request joins the batch, a bad frame is reported, a cancel is
    // forwarded at once.
    assert_eq!(
        cmd(&mut core, generate(2)),
        vec![Output::Action(RunnerAction::Generate {
            id: 2,
            request: GenerateRequest::new(Prompt::Tokens(vec![1, 2]), 4)
        })]
    );
    assert_eq!(
        cmd(&mut core, generate(2)),
        vec![err(Some(2), "request 2 is already running")]
    );
    assert_eq!(
        core.handle(RunnerInput::BadFrame("garbled".into())),
        vec![err(None, "garbled")]
    );
    assert_eq!(
        core.handle(RunnerInput::BadRequest {
            id: 5,
            reason: "bad prompt".into()
        }),
        vec![err(
            Some(5),
            "the runner could not read this request (bad prompt); nothing was run"
        )]
    );
    assert_eq!(
        cmd(&mut core, NodeCommand::Cancel { id: 1 }),
        vec![Output::Action(RunnerAction::Cancel { id: 1 })]
    );
    let token = |id| RunnerInput::Token {
        id,
        token: 5,
        text: "a".into(),
        logprob: -0.1,
        top_logprobs: None,
    };
    let token_event = |id| {
        Output::Event(Event::Token {
            id,
            token: 5,
            text: "a".into(),
            logprob: -0.1,
            top_logprobs: None,
        })
    };
    assert_eq!(core.handle(token(1)), vec![token_event(1)]);
    assert_eq!(core.handle(token(2)), vec![token_event(2)]);
    // One ends: its completion; the runner stays `running` while the other runs.
    assert_eq!(
        core.handle(RunnerInput::Generated {
            id: 1,
            result: Ok(completion()),
        }),
        vec![Output::Event(Event::Done {
            id: 1,
            completion: completion()
        })]
    );
    // A token of a request that ended is not passed on.
    assert!(core.handle(token(1)).is_empty());
    assert_eq!(
        core.handle(RunnerInput::Generated {
            id: 2,
            result: Err(GenerateFailure {
                message: "invalid request: the prompt is empty".into(),
                ring_lost: false
            })
        }),
        vec![
            err(Some(2), "invalid request: the prompt is empty"),
            st(RunnerStatus::Ready),
        ]
    );
}

#[test]
fn a_cancel_before_the_request_starts_still_stops_it() {
    let mut core = ready_whole();
    assert!(cmd(&mut core, NodeCommand::Cancel { id: 9 }).is_empty());
    let outputs = cmd(&mut core, generate(9));
    assert_eq!(
        outputs.last(),
        Some(&Output::Action(RunnerAction::Cancel { id: 9 }))
    );
}

#[test]
fn shutdown_exits_zero_and_rank_0_stops_the_ring_first() {
    let mut core = started(true);
    assert_eq!(
        cmd(&mut core, NodeCommand::Shutdown),
        vec![Output::Action(RunnerAction::Exit(0))]
    );
    assert!(core.exited());
    // Nothing happens after the exit.
    assert!(cmd(&mut core, generate(1)).is_empty());

    let mut ready = ready_whole();
    assert_eq!(
        cmd(&mut ready, NodeCommand::Shutdown),
        vec![Output::Action(RunnerAction::Exit(0))]
    );

    // Rank 0, loaded (warmed up or not): the stop goes around the ring, then the exit.
    let mut driver = loaded_rank(0);
    assert_eq!(
        cmd(&mut driver, NodeCommand::Shutdown),
        vec![
            Output::Action(RunnerAction::StopRing),
            Output::Action(RunnerAction::Exit(0))
        ]
    );

    // A serving rank exits 0 when rank 0 stops the ring, at once on its own shutdown.
    let mut follower = loaded_rank(1);
    cmd(&mut follower, NodeCommand::WarmUp);
    follower.handle(RunnerInput::WarmedUp(Ok(())));
    assert_eq!(
        follower.handle(RunnerInput::Served(Ok(12))),
        vec![Output::Action(RunnerAction::Exit(0))]
    );
    let mut follower = loaded_rank(1);
    assert_eq!(
        cmd(&mut follower, NodeCommand::Shutdown),
        vec![Output::Action(RunnerAction::Exit(0))]
    );
}

#[test]
fn a_shutdown_during_a_generation_waits_for_it() {
    let mut core = ready_whole();
    cmd(&mut core, generate(3));
    assert!(cmd(&mut core, NodeCommand::Shutdown).is_empty());
    // New requests are refused meanwhile.
    assert_eq!(
        cmd(&mut core, generate(4)),
        vec![err(Some(4), "the runner is shutting down")]
    );
    let outputs = core.handle(RunnerInput::Generated {
        id: 3,
        result: Ok(completion()),
    });
    assert_eq!(outputs.last(), Some(&Output::Action(RunnerAction::Exit(0))));
    assert_eq!(outputs[1], st(RunnerStatus::Ready));
}

#[test]
fn ranks_of_a_ring_warm_up_on_command_and_only_rank_0_generates() {
    let mut driver = loaded_rank(0);
    assert_eq!(
        cmd(&mut driver, generate(1)),
        vec![err(
            Some(1),
            "the instance is not warmed up yet (send WarmUp)"
        )]
    );
    assert_eq!(
        cmd(&mut driver, NodeCommand::WarmUp),
        vec![
            st(RunnerStatus::WarmingUp),
            Output::Action(RunnerAction::WarmUp)
        ]
    );
    assert_eq!(
        driver.handle(RunnerInput::WarmedUp(Ok(()))),
        vec![st(RunnerStatus::Ready)]
    );
    assert_eq!(
        cmd(&mut driver, NodeCommand::WarmUp),
        vec![err(None, "this rank is already warmed up")]
    );
    assert_eq!(cmd(&mut driver, generate(2))[0], st(RunnerStatus::Running));

    let mut follower = loaded_rank(1);
    assert_eq!(
        cmd(&mut follower, NodeCommand::WarmUp),
        vec![
            st(RunnerStatus::WarmingUp),
            Output::Action(RunnerAction::Serve)
        ]
    );
    assert_eq!(
        follower.handle(RunnerInput::WarmedUp(Ok(()))),
        vec![st(RunnerStatus::Ready)]
    );
    assert_eq!(
        cmd(&mut follower, generate(3)),
        vec![err(Some(3), "only rank 0 takes requests; this is rank 1")]
    );
    assert_eq!(
        cmd(
            &mut follower,
            NodeCommand::Connect {
                rank: 1,
                hosts: vec![],
                timeout_ms: 1
            }
        ),
        vec![err(
            None,
            "Connect comes once, before Load; start a new runner to join another ring"
        )]
    );
}

#[test]
fn failures_report_a_reason_and_exit_non_zero() {
    let mut core = RunnerCore::new(true);
    let out = core.handle(RunnerInput::Started(Err("no device".into())));
    assert_eq!(failed(&out), "MLX does not work in this process: no device");
    assert_eq!(out.last(), Some(&Output::Action(RunnerAction::Exit(1))));

    // A pipeline rank without its layers.
    let mut core = started(true);
    cmd(
        &mut core,
        NodeCommand::Connect {
            rank: 1,
            hosts: vec![vec![], vec![]],
            timeout_ms: 1,
        },
    );
    core.handle(RunnerInput::Connected(Ok(seat(1, 3))));
    let out = cmd(&mut core, load(Sharding::Pipeline, None));
    assert_eq!(
        failed(&out),
        "rank 1 of a 3-rank pipeline needs its layer range in Load"
    );

    // A ring that does not form.
    let mut core = started(true);
    cmd(
        &mut core,
        NodeCommand::Connect {
            rank: 0,
            hosts: vec![vec![], vec![]],
            timeout_ms: 1,
        },
    );
    let out = core.handle(RunnerInput::Connected(Err(
        "rank 0 of 2: rank 1 never came".into(),
    )));
    assert_eq!(failed(&out), "rank 0 of 2: rank 1 never came");
    assert_eq!(out.last(), Some(&Output::Action(RunnerAction::Exit(1))));

    // A load that fails, a warm-up that fails.
    let mut core = started(true);
    cmd(&mut core, load(Sharding::Pipeline, None));
    let out = core.handle(RunnerInput::Loaded(Err(LoadFailure::Failed(
        "cannot read /m".into(),
    ))));
    assert_eq!(failed(&out), "cannot read /m");
    let mut core = started(true);
    cmd(&mut core, load(Sharding::Pipeline, None));
    core.handle(RunnerInput::Loaded(Ok(true)));
    let out = core.handle(RunnerInput::WarmedUp(Err("MLX error: oops".into())));
    assert_eq!(failed(&out), "warm-up failed: MLX error: oops");

    // A serving rank that loses the ring names itself and its neighbours.
    let mut follower = loaded_rank(1);
    cmd(&mut follower, NodeCommand::WarmUp);
    follower.handle(RunnerInput::WarmedUp(Ok(())));
    let out = follower.handle(RunnerInput::Served(Err("peer lost".into())));
    assert_eq!(
        failed(&out),
        "rank 1 of 2 (neighbour rank 1 (10.99.0.2:5000)) lost the ring: peer lost"
    );
}

#[test]
fn rank_0_losing_the_ring_ends_the_request_then_the_runner() {
    let mut driver = loaded_rank(0);
    cmd(&mut driver, NodeCommand::WarmUp);
    driver.handle(RunnerInput::WarmedUp(Ok(())));
    cmd(&mut driver, generate(8));
    let out = driver.handle(RunnerInput::Generated {
        id: 8,
        result: Err(GenerateFailure {
            message: "the ring to the other ranks failed: lost".into(),
            ring_lost: true,
        }),
    });
    assert_eq!(
        out[0],
        err(Some(8), "the ring to the other ranks failed: lost")
    );
    assert_eq!(
        failed(&out),
        "rank 0 lost the ring (neighbour rank 1 (10.99.0.2:5000)): the ring to the other ranks \
         failed: lost"
    );
    assert_eq!(out.last(), Some(&Output::Action(RunnerAction::Exit(1))));
}

#[test]
fn a_load_timeout_is_reported_once_and_exits_3() {
    let mut core = started(true);
    cmd(&mut core, load(Sharding::Pipeline, None));
    assert_eq!(
        core.handle(RunnerInput::LoadTimedOut { seconds: 0 }),
        vec![st(RunnerStatus::Failed {
            reason: "model loading timed out after 0 s".into()
        })]
    );
    // Progress after the report says nothing; the loader's end exits 3.
    assert!(core
        .handle(RunnerInput::LoadProgress { done: 2, total: 6 })
        .is_empty());
    assert_eq!(
        core.handle(RunnerInput::Loaded(Err(LoadFailure::TimedOut))),
        vec![Output::Action(RunnerAction::Exit(3))]
    );
}
