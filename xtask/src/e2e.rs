//! `cargo xtask e2e`: one model across three real nodes, end to end, as a user meets it.
//!
//! Three `shoal` nodes start in network namespaces with no configuration (they find each
//! other by mDNS on the private bridge), the SmolLM2 fixture is placed across all three
//! (pipeline, `min_nodes` 3), and the official `openai` client chats through each node's
//! gateway (greedy: the same answer everywhere, and it says Paris). Then a long stream runs
//! and, at its first token, every process of the node holding the middle rank is killed: the
//! client must get an error within seconds, and the model must be placed again on the two
//! survivors and answer. Prints each step, the figures, and which step failed and why.
//! Bounded (about three minutes at most); namespaces are removed whatever happens.

use crate::testbed::{self, Poll, Testbed};
use kit::instances::{describe, instances_in_state, read_instance, InstanceInfo};
use serde_json::{json, Value};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The model every node knows without configuration.
const MODEL: &str = "default";
const NODES: usize = 3;
const STEPS: usize = 8;

/// Progress lines and the step that failed.
struct Steps {
    current: usize,
    name: &'static str,
    started: Instant,
    run_started: Instant,
}

impl Steps {
    fn new() -> Steps {
        Steps {
            current: 0,
            name: "",
            started: Instant::now(),
            run_started: Instant::now(),
        }
    }

    fn next(&mut self, name: &'static str) {
        self.current += 1;
        self.name = name;
        self.started = Instant::now();
        eprintln!("[e2e {}/{STEPS}] {name} ...", self.current);
    }

    fn done(&self, what: &str) {
        eprintln!(
            "[e2e {}/{STEPS}] {}: ok in {:.1} s{}",
            self.current,
            self.name,
            self.started.elapsed().as_secs_f64(),
            if what.is_empty() {
                String::new()
            } else {
                format!(" ({what})")
            }
        );
    }

    fn failed(&self, why: &str) -> String {
        format!(
            "e2e FAILED at step {}/{STEPS} ({}), after {:.1} s: {why}",
            self.current,
            self.name,
            self.run_started.elapsed().as_secs_f64()
        )
    }
}

/// Figures the run measured, printed at the end.
#[derive(Default)]
struct Figures {
    mesh_s: f64,
    ready_s: f64,
    answer: String,
    error_after_s: Option<f64>,
    tokens_after_kill: Option<u64>,
    replaced_s: Option<f64>,
}

/// Runs the command, building the binary it runs.
pub fn e2e(args: &[String]) -> Result<(), String> {
    let release = match args {
        [] => false,
        [flag] if flag == "--release" => true,
        _ => return Err("e2e: the only option is --release".into()),
    };
    e2e_with(None, release)
}

/// Runs the end-to-end check with `binary` (for `cargo xtask test`: the one its tests just
/// built), or a fresh build.
pub fn e2e_with(binary: Option<std::path::PathBuf>, release: bool) -> Result<(), String> {
    testbed::catch_ctrl_c()?;
    let mut steps = Steps::new();
    let mut figures = Figures::default();
    let mut testbed = None;
    let result = run(&mut steps, &mut figures, &mut testbed, binary, release);
    if let Err(why) = &result {
        let mut report = steps.failed(why);
        if let Some(tb) = &testbed {
            report.push_str(&format!(
                "\n\nlast lines of each node's log (all in {}):\n{}",
                tb.log_dir().display(),
                tb.all_logs(25)
            ));
        }
        drop(testbed); // stop the nodes and remove the namespaces before reporting
        return Err(report);
    }
    drop(testbed);
    println!(
        "e2e passed in {:.1} s: mesh formed in {:.1} s; 3-node pipeline ready {:.1} s after \
         placing; every node answered {:?}; after killing the middle rank's node the stream \
         failed {:.1} s later ({} tokens after the kill); the model answered again from the two \
         survivors {:.1} s after the kill",
        steps.run_started.elapsed().as_secs_f64(),
        figures.mesh_s,
        figures.ready_s,
        figures.answer,
        figures.error_after_s.unwrap_or(f64::NAN),
        figures.tokens_after_kill.unwrap_or(0),
        figures.replaced_s.unwrap_or(f64::NAN),
    );
    Ok(())
}

fn run(
    steps: &mut Steps,
    figures: &mut Figures,
    slot: &mut Option<Testbed>,
    binary: Option<std::path::PathBuf>,
    release: bool,
) -> Result<(), String> {
    steps.next("build shoal and start 3 nodes in network namespaces");
    let binary = match binary {
        Some(binary) => binary,
        None => testbed::build_shoal(release)?,
    };
    let tb = slot.insert(Testbed::start("e2e", NODES, &binary, |_| Vec::new())?);
    steps.done(&format!("logs in {}", tb.log_dir().display()));

    steps.next("nodes find each other with no configuration");
    let ids = tb.node_ids(Duration::from_secs(30))?;
    tb.wait_mesh(&ids, Duration::from_secs(30))?;
    figures.mesh_s = steps.started.elapsed().as_secs_f64();
    steps.done("every node sees 3 alive");

    steps.next("place the SmolLM2 fixture across all 3 nodes (pipeline)");
    let request = json!({"model_id": MODEL, "sharding": "Pipeline", "min_nodes": NODES});
    let placed = tb.request(0, "POST /place_instance", |api| {
        api.place_instance(&request)
    })?;
    let id = read_instance(&placed, None)
        .map(|i| i.id)
        .ok_or_else(|| format!("POST /place_instance answered no instance id: {placed}"))?;
    let placed_at = Instant::now();
    let mut last = String::new();
    let instance = tb.wait_for(
        "every rank ready",
        Duration::from_secs(120),
        Duration::from_millis(500),
        |tb| {
            for i in 0..NODES {
                tb.check_alive(i)?;
            }
            let v = match tb.request(0, "GET /instance", |api| api.instance(&id)) {
                Ok(v) => v,
                Err(e) => return Ok(Poll::Waiting(e)),
            };
            let info = read_instance(&v, Some(&id))
                .ok_or_else(|| format!("GET /instance/{id} is unreadable: {v}"))?;
            if let Some(why) = &info.failed {
                return Err(format!("a runner failed: {why}"));
            }
            let now = describe(&info);
            if now != last {
                eprintln!("    {:>5.1} s  {now}", placed_at.elapsed().as_secs_f64());
                last = now.clone();
            }
            Ok(if info.ready {
                Poll::Ready(info)
            } else {
                Poll::Waiting(now)
            })
        },
    );
    let instance = instance.map_err(|e| fail_with_state(tb, e))?;
    if instance.rank_nodes.len() != NODES {
        return Err(format!(
            "the instance has {} rank(s), not {NODES}: {:?}",
            instance.rank_nodes.len(),
            instance.rank_nodes
        ));
    }
    figures.ready_s = placed_at.elapsed().as_secs_f64();
    let index_of = |node: &str| ids.iter().position(|id| id == node);
    let order: Vec<usize> = instance
        .rank_nodes
        .iter()
        .map(|n| index_of(n).ok_or_else(|| format!("rank on unknown node {n}")))
        .collect::<Result<_, _>>()?;
    steps.done(&format!(
        "instance {id}; ranks 0,1,2 on nodes {}",
        order
            .iter()
            .map(|i| (i + 1).to_string())
            .collect::<Vec<_>>()
            .join(",")
    ));

    steps.next("chat through each node's gateway with the openai client");
    let urls: Vec<String> = (0..NODES).map(|i| tb.url(i)).collect();
    let out = tb.client(
        0,
        &[["paris".into(), MODEL.into()].as_slice(), urls.as_slice()].concat(),
        Duration::from_secs(90),
    )?;
    figures.answer = json_line(&out, "answers")
        .and_then(|v| {
            v["answers"]
                .as_object()?
                .values()
                .next()?
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_default();
    steps.done("3 identical greedy answers mentioning Paris");

    steps.next("kill the middle rank's node mid-stream; the client gets an error");
    let (first, middle) = (order[0], order[1]);
    let pids = tb.pids(middle);
    if pids.is_empty() {
        return Err(format!(
            "no process found in node {}'s namespace",
            middle + 1
        ));
    }
    let pid_list = pids
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    eprintln!(
        "    streaming through node {} (rank 0); node {} (rank 1) will be killed: pids {pid_list}",
        first + 1,
        middle + 1
    );
    let result = tb.client(
        first,
        &["lost".into(), MODEL.into(), tb.url(first), pid_list],
        Duration::from_secs(60),
    );
    tb.forget(middle);
    let out = result?;
    let lost = json_line(&out, "error_after_s").unwrap_or(Value::Null);
    figures.error_after_s = lost["error_after_s"].as_f64();
    figures.tokens_after_kill = lost["tokens_after_kill"].as_u64();
    let killed_unix = lost["killed_unix"].as_f64().unwrap_or_else(now_unix);
    steps.done(&format!(
        "error {:.1} s after the kill",
        figures.error_after_s.unwrap_or(f64::NAN)
    ));

    steps.next("the model is placed again on the two survivors");
    let survivors: Vec<usize> = (0..NODES).filter(|&i| i != middle).collect();
    let dead = &ids[middle];
    let mut last = String::new();
    let replaced = tb.wait_for(
        "a ready instance of the model on the survivors only",
        Duration::from_secs(90),
        Duration::from_millis(250),
        |tb| {
            for &i in &survivors {
                tb.check_alive(i)?;
            }
            let state = match tb.get(survivors[0], "/state") {
                Ok(state) => state,
                Err(e) => return Ok(Poll::Waiting(e)),
            };
            let found: Vec<InstanceInfo> = instances_in_state(&state)
                .into_iter()
                .filter(|i| !i.rank_nodes.is_empty() && !i.rank_nodes.contains(dead))
                .collect();
            let now = found
                .iter()
                .map(|i| {
                    format!(
                        "{}: {} on {} node(s)",
                        i.id,
                        describe(i),
                        i.rank_nodes.len()
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            if now != last {
                eprintln!(
                    "    {:>5.1} s after the kill  {}",
                    now_unix() - killed_unix,
                    if now.is_empty() {
                        "no instance without the dead node yet"
                    } else {
                        &now
                    }
                );
                last = now.clone();
            }
            Ok(match found.into_iter().find(|i| i.ready) {
                Some(ready) => Poll::Ready(ready),
                None => Poll::Waiting(now),
            })
        },
    );
    let replaced = replaced.map_err(|e| fail_with_state(tb, e))?;
    steps.done(&format!(
        "instance {} on {} node(s), {:.1} s after the kill",
        replaced.id,
        replaced.rank_nodes.len(),
        now_unix() - killed_unix
    ));

    steps.next("the survivors answer again");
    let urls: Vec<String> = survivors.iter().map(|&i| tb.url(i)).collect();
    tb.client(
        survivors[0],
        &[["paris".into(), MODEL.into()].as_slice(), urls.as_slice()].concat(),
        Duration::from_secs(60),
    )?;
    figures.replaced_s = Some(now_unix() - killed_unix);
    steps.done("");

    steps.next("clean up");
    Ok(())
}

/// Adds the instances as node 1 sees them to an error.
fn fail_with_state(tb: &Testbed, e: String) -> String {
    let seen = (0..tb.len())
        .find_map(|i| tb.get(i, "/state").ok())
        .map(|s| {
            instances_in_state(&s)
                .iter()
                .map(|i| format!("{} ({} on {:?})", i.id, describe(i), i.rank_nodes))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_else(|| "no node answered GET /state".into());
    format!("{e}\ninstances in the state: {seen}")
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The first JSON line of a client's output with `key`.
pub fn json_line(out: &str, key: &str) -> Option<Value> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get(key).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_are_found_by_key() {
        let out = "ok: x\n{\"a\": 1}\n{\"answers\": {\"u\": \"Paris.\"}}\nall passed\n";
        assert_eq!(json_line(out, "answers").unwrap()["answers"]["u"], "Paris.");
        assert!(json_line(out, "nope").is_none());
    }
}
