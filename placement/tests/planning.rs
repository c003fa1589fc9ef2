//! Table tests of worker planning: start-up order, shut-down, and that it never deadlocks.

use placement::planning::{next_action, Action, PlanInput, RankView, RunnerStatus, ShutdownReason};
use RunnerStatus::*;

fn view(runner: Option<RunnerStatus>, model_ready: bool) -> RankView {
    RankView {
        node: "n".into(),
        runner,
        model_ready,
    }
}

fn plan(my_rank: usize, runners: &[Option<RunnerStatus>]) -> Action {
    next_action(&PlanInput {
        instance_live: true,
        my_rank,
        ranks: runners.iter().cloned().map(|r| view(r, true)).collect(),
    })
}

fn failed() -> RunnerStatus {
    Failed {
        reason: "out of memory".into(),
    }
}

#[test]
fn start_up_table() {
    let cases: Vec<(usize, Vec<Option<RunnerStatus>>, Action)> = vec![
        // Create, then connect: ranks below the last at once.
        (0, vec![None, None, None], Action::CreateRunner),
        (0, vec![Some(Idle), None, None], Action::Connect),
        (1, vec![None, Some(Idle), None], Action::Connect),
        // The last rank waits until every other rank is connecting.
        (
            2,
            vec![Some(Idle), Some(Connecting), Some(Idle)],
            Action::Wait,
        ),
        (2, vec![None, Some(Connecting), Some(Idle)], Action::Wait),
        (
            2,
            vec![Some(Connecting), Some(Connected), Some(Idle)],
            Action::Connect,
        ),
        (
            2,
            vec![Some(Loaded), Some(Connecting), Some(Idle)],
            Action::Connect,
        ),
        // Load once everyone is connected.
        (
            0,
            vec![Some(Connected), Some(Connected), Some(Connecting)],
            Action::Wait,
        ),
        (
            0,
            vec![Some(Connected), Some(Connected), Some(Connected)],
            Action::Load,
        ),
        (
            1,
            vec![
                Some(Loaded),
                Some(Connected),
                Some(Loading {
                    layers_loaded: 1,
                    total: 4,
                }),
            ],
            Action::Load,
        ),
        // Warm up: ranks below the last when every runner is loaded or warming.
        (
            0,
            vec![
                Some(Loaded),
                Some(Loaded),
                Some(Loading {
                    layers_loaded: 3,
                    total: 4,
                }),
            ],
            Action::Wait,
        ),
        (
            0,
            vec![Some(Loaded), Some(WarmingUp), Some(Loaded)],
            Action::WarmUp,
        ),
        (
            1,
            vec![Some(WarmingUp), Some(Loaded), Some(Loaded)],
            Action::WarmUp,
        ),
        // The last rank only when all others are warming.
        (
            2,
            vec![Some(WarmingUp), Some(Loaded), Some(Loaded)],
            Action::Wait,
        ),
        (
            2,
            vec![Some(WarmingUp), Some(WarmingUp), Some(Loaded)],
            Action::WarmUp,
        ),
        (
            2,
            vec![Some(Ready), Some(WarmingUp), Some(Loaded)],
            Action::WarmUp,
        ),
        // Nothing to do while busy or done.
        (0, vec![Some(Connecting), Some(Idle), None], Action::Wait),
        (0, vec![Some(Ready), Some(Ready), Some(Ready)], Action::Wait),
        (
            1,
            vec![Some(Running), Some(Ready), Some(Ready)],
            Action::Wait,
        ),
        // A ring of one never waits on anyone.
        (0, vec![Some(Idle)], Action::Connect),
        (0, vec![Some(Connected)], Action::Load),
        (0, vec![Some(Loaded)], Action::WarmUp),
        // Failures: siblings shut down; the failed runner itself waits for the supervisor.
        (
            0,
            vec![Some(Ready), Some(failed()), Some(Ready)],
            Action::ShutDown(ShutdownReason::SiblingFailed { rank: 1 }),
        ),
        (0, vec![None, Some(failed()), Some(failed())], Action::Wait),
        (
            1,
            vec![Some(Ready), Some(failed()), Some(Ready)],
            Action::Wait,
        ),
        (
            2,
            vec![Some(Ready), Some(Ready), Some(ShuttingDown)],
            Action::Wait,
        ),
    ];
    for (rank, runners, expected) in cases {
        assert_eq!(plan(rank, &runners), expected, "rank {rank} of {runners:?}");
    }
}

#[test]
fn downloads_come_before_connecting_and_gate_loading() {
    let mut input = PlanInput {
        instance_live: true,
        my_rank: 0,
        ranks: vec![view(Some(Idle), false), view(Some(Idle), true)],
    };
    assert_eq!(next_action(&input), Action::Download);
    input.ranks[0].model_ready = true;
    input.ranks[1].model_ready = false;
    input.ranks[0].runner = Some(Connected);
    input.ranks[1].runner = Some(Connected);
    assert_eq!(next_action(&input), Action::Wait, "rank 1 lacks the model");
    input.ranks[1].model_ready = true;
    assert_eq!(next_action(&input), Action::Load);
}

#[test]
fn a_deleted_instance_shuts_its_runners_down() {
    let mut input = PlanInput {
        instance_live: false,
        my_rank: 1,
        ranks: vec![view(Some(Ready), true), view(Some(Ready), true)],
    };
    assert_eq!(
        next_action(&input),
        Action::ShutDown(ShutdownReason::InstanceGone)
    );
    input.ranks[1].runner = Some(Shutdown);
    assert_eq!(next_action(&input), Action::Wait);
    input.ranks[1].runner = None;
    assert_eq!(next_action(&input), Action::Wait);
    input.my_rank = 7;
    input.instance_live = true;
    assert_eq!(
        next_action(&input),
        Action::Wait,
        "a rank out of range does nothing"
    );
}

/// Plays the rule on every arrival order of nodes, performing one action at a time and
/// completing transitional states (connecting, loading, warming) only when the real thing
/// could: connecting completes once all ranks are connecting; warm-up once all are warming.
/// Every schedule must end with all runners ready.
#[test]
fn start_up_never_deadlocks_whatever_the_order() {
    for n in 1..=4usize {
        // Each "arrival order" is a permutation; at every step the first node in the order that
        // can act does so.
        fn permutations(n: usize) -> Vec<Vec<usize>> {
            if n == 0 {
                return vec![vec![]];
            }
            let mut all = Vec::new();
            for p in permutations(n - 1) {
                for at in 0..=p.len() {
                    let mut q = p.clone();
                    q.insert(at, n - 1);
                    all.push(q);
                }
            }
            all
        }
        let orders = permutations(n);
        for order in orders {
            let mut ranks: Vec<RankView> = (0..n).map(|_| view(None, false)).collect();
            let mut steps = 0;
            loop {
                steps += 1;
                assert!(steps < 200, "no progress for order {order:?}: {ranks:?}");
                if ranks.iter().all(|r| r.runner == Some(Ready)) {
                    break;
                }
                let mut progressed = false;
                for &rank in &order {
                    let input = PlanInput {
                        instance_live: true,
                        my_rank: rank,
                        ranks: ranks.clone(),
                    };
                    let me = &mut ranks[rank];
                    match next_action(&input) {
                        Action::CreateRunner => me.runner = Some(Idle),
                        Action::Download => me.model_ready = true,
                        Action::Connect => me.runner = Some(Connecting),
                        Action::Load => {
                            me.runner = Some(Loading {
                                layers_loaded: 0,
                                total: 1,
                            })
                        }
                        Action::WarmUp => me.runner = Some(WarmingUp),
                        Action::ShutDown(_) => panic!("nothing failed"),
                        Action::Wait => {
                            // The environment completes what can complete: joining the ring
                            // once every rank is joining, warm-up once every rank warms up.
                            let at_least = |stage: usize| {
                                input.ranks.iter().all(|r| order_of(&r.runner) >= stage)
                            };
                            match me.runner.clone() {
                                Some(Connecting) if at_least(2) => me.runner = Some(Connected),
                                Some(Loading { .. }) => me.runner = Some(Loaded),
                                Some(WarmingUp) if at_least(6) => me.runner = Some(Ready),
                                _ => continue,
                            }
                        }
                    }
                    progressed = true;
                    break;
                }
                assert!(progressed, "deadlock for order {order:?}: {ranks:?}");
            }
        }
    }
}

/// Start-up position of a runner: none, idle, connecting, connected, loading, loaded, warming,
/// ready.
fn order_of(runner: &Option<RunnerStatus>) -> usize {
    match runner {
        None => 0,
        Some(Idle) => 1,
        Some(Connecting) => 2,
        Some(Connected) => 3,
        Some(Loading { .. }) => 4,
        Some(Loaded) => 5,
        Some(WarmingUp) => 6,
        Some(Ready) | Some(Running) => 7,
        Some(_) => 0,
    }
}

#[test]
fn runner_status_json() {
    let json = serde_json::to_string(&Loading {
        layers_loaded: 3,
        total: 10,
    })
    .unwrap();
    assert_eq!(json, r#"{"loading":{"layers_loaded":3,"total":10}}"#);
    assert_eq!(
        serde_json::to_string(&WarmingUp).unwrap(),
        r#""warming_up""#
    );
    let back: RunnerStatus = serde_json::from_str(r#"{"failed":{"reason":"oom"}}"#).unwrap();
    assert_eq!(
        back,
        Failed {
            reason: "oom".into()
        }
    );
    assert!(serde_json::from_str::<RunnerStatus>(r#""flying""#).is_err());
    // The replicated state's binary format carries it too.
    let bytes = postcard::to_allocvec(&back).unwrap();
    assert_eq!(postcard::from_bytes::<RunnerStatus>(&bytes).unwrap(), back);
    let action = Action::ShutDown(ShutdownReason::SiblingFailed { rank: 2 });
    let bytes = postcard::to_allocvec(&action).unwrap();
    assert_eq!(postcard::from_bytes::<Action>(&bytes).unwrap(), action);
}

#[test]
fn which_states_serve_and_which_hold_memory() {
    let loading = Loading {
        layers_loaded: 1,
        total: 2,
    };
    // (status, serves requests, holds its model's memory)
    let cases = [
        (Idle, false, false),
        (Connecting, false, false),
        (Connected, false, false),
        (loading, false, false),
        (Loaded, false, true),
        (WarmingUp, false, true),
        (Ready, true, true),
        (Running, true, true),
        (ShuttingDown, false, false),
        (Shutdown, false, false),
        (failed(), false, false),
    ];
    for (status, serving, holds) in cases {
        assert_eq!(status.is_serving(), serving, "{status:?}");
        assert_eq!(status.holds_memory(), holds, "{status:?}");
    }
}
