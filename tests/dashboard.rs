//! The dashboard in a real browser against a real cluster: three `shoal` nodes in network
//! namespaces (found by mDNS), and Debian's headless Chromium, driven by Selenium from the
//! venv, inside the first node's namespace. `tests/dashboard_checks.py` does what a person
//! would (its docstring lists the checks): the topology with 3 nodes and their edges, the
//! fixture placed by clicking a preview and its ranks becoming ready, a chat that streams an
//! answer saying Paris (and one stopped, its runners seen busy before Stop and idle after, from
//! their CPU time in /proc: `RUNNER_CPU` on the script's stdout), a killed node shown dead and the instance placed
//! again, a failed placement's reason, deletion, a phone-sized screen, no console errors.
//! The node is killed here, when the script asks (`KILL <id>` on its stdout).
//!
//! The page's node requires an admin API key (`SHOAL_API_KEY`, the other two stay open): the
//! script first checks that the page asks for it and refuses a wrong one, then runs every
//! check above with the right one, so the whole dashboard is proven to work behind a key.
//!
//! One cluster serves every check, so the whole run stays short. Screenshots are kept in
//! `<target>/tmp/dashboard/`.
//!
//! Needs root (namespaces), the model fixture, the venv and Chromium (`cargo xtask setup`
//! installs them all): fails otherwise, or with `SHOAL_ALLOW_SKIP=1` is skipped and counted.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::netns::Spec;
use support::{wait_for, ShoalNode, TestNet};

/// The admin API key the page's node (node 1) requires.
const API_KEY: &str = "dashboard-test-key-0123456789";

/// Chromium and its driver, as Debian installs them.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

fn browser_ready() -> Result<(), String> {
    for path in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(path).exists() {
            return Err(format!("{path} is missing"));
        }
    }
    let python = kit::dirs::venv_python();
    let selenium = std::process::Command::new(&python)
        .args(["-c", "import selenium"])
        .stderr(Stdio::null())
        .status();
    if !selenium.is_ok_and(|s| s.success()) {
        return Err(format!("{} cannot import selenium", python.display()));
    }
    if !kit::dirs::default_model_path().exists() {
        return Err("the model fixture is missing".into());
    }
    Ok(())
}

/// Where the screenshots go: kept after the test.
fn out_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("screenshot directory");
    dir
}

/// Every node sees all three alive, each with verified edges to both others.
fn formed(nodes: &[ShoalNode]) -> bool {
    nodes.iter().all(|node| {
        let Some(state) = node.state() else {
            return false;
        };
        let alive = state["liveness"]
            .as_object()
            .is_some_and(|l| l.len() == 3 && l.values().all(|n| n["alive"] == true));
        let edges = state["nodes"].as_object().is_some_and(|authors| {
            authors.values().all(|a| {
                let to: std::collections::BTreeSet<&str> = a["records"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| k.starts_with("edge/"))
                    .filter_map(|(_, e)| e["to"].as_str())
                    .collect();
                to.len() == 2
            })
        });
        alive && edges
    })
}

#[test]
fn the_dashboard_shows_the_cluster_places_chats_and_follows_a_death() {
    if !kit::skip::can_run(
        browser_ready(),
        "run `cargo xtask setup` (Chromium, chromedriver, the venv with Selenium, the fixture)",
    ) {
        return;
    }
    let spec = Spec {
        nodes: 3,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalw", &spec) else {
        return;
    };
    nodes[0].env.push(("SHOAL_API_KEY".into(), API_KEY.into()));
    for node in &mut nodes {
        node.start();
    }
    let Some((_, took)) = wait_for(Duration::from_secs(60), || formed(&nodes).then_some(())) else {
        panic!(
            "the nodes did not form a cluster\n{}",
            support::logs(&nodes)
        );
    };
    eprintln!("3 nodes met, with all 6 edges verified, in {took:?}");
    let ids: Vec<String> = nodes
        .iter()
        .map(|n| {
            n.state().expect("state")["node_id"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();

    let out = out_dir();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard_checks.py");
    let url = format!("http://{}:{}/", nodes[0].node.ip(), support::API_PORT);
    let started = Instant::now();
    let mut browser = nodes[0]
        .node
        .command(&kit::dirs::venv_python().to_string_lossy())
        .arg(script)
        .args(["--url", &url, "--key", API_KEY, "--out"])
        .arg(&out)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the browser checks");
    let mut to_script = browser.stdin.take().expect("stdin");
    let from_script = BufReader::new(browser.stdout.take().expect("stdout"));
    let mut lines = Vec::new();
    for line in from_script.lines() {
        let Ok(line) = line else { break };
        eprintln!("browser: {line}");
        if let Some(victim) = line.strip_prefix("KILL ") {
            let index = ids
                .iter()
                .position(|id| id == victim)
                .unwrap_or_else(|| panic!("the script asked to kill an unknown node {victim}"));
            assert_ne!(index, 0, "the page's own node must stay up");
            nodes[index].kill();
            writeln!(to_script, "killed").expect("answer the script");
            to_script.flush().expect("answer the script");
        } else if line == "RUNNER_CPU" {
            let pids: Vec<u64> = nodes
                .iter()
                .flat_map(|n| support::runner_pids(&n.node.netns))
                .collect();
            let used = support::cpu_over(&pids, Duration::from_secs(2));
            let words: Vec<String> = used.iter().map(|s| format!("{s:.3}")).collect();
            writeln!(to_script, "cpu {}", words.join(" ")).expect("answer the script");
            to_script.flush().expect("answer the script");
        }
        lines.push(line);
    }
    let status = browser.wait().expect("the browser checks");
    let took = started.elapsed();
    assert!(
        status.success(),
        "the dashboard checks failed ({status}):\n{}\n{}",
        lines.join("\n"),
        support::logs(&nodes)
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("all dashboard checks passed")),
        "{}",
        lines.join("\n")
    );
    let shots: Vec<String> = std::fs::read_dir(&out)
        .expect("screenshots")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".png"))
        .collect();
    assert!(shots.len() >= 7, "screenshots: {shots:?}");
    eprintln!(
        "browser checks passed in {took:?}; screenshots in {}",
        out.display()
    );
    test_net.teardown(nodes);
}

/// The chat attaches an image for a model that sees images (issue 47): one node serving the
/// tiny Gemma 3 vision fixture (f32, made by mlx-vlm at `cargo xtask setup`); Chromium chooses
/// the fixture image in the chat's file input, then pastes it, and each answer begins with
/// mlx-vlm's greedy answer (`tests/dashboard_image_checks.py`). The main test above checks that
/// a text-only model offers no attachment.
#[test]
fn the_dashboard_chat_attaches_an_image_for_a_vision_model() {
    let fixture = kit::dirs::vision_fixtures_dir().join("gemma3/f32");
    let ready = browser_ready().and_then(|()| {
        if fixture.join("reference.json").exists() {
            Ok(())
        } else {
            Err(format!("{} is missing", fixture.display()))
        }
    });
    if !kit::skip::can_run(
        ready,
        "run `cargo xtask setup` (Chromium, chromedriver, the venv with Selenium, the fixtures)",
    ) {
        return;
    }
    let spec = Spec {
        nodes: 1,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalwi", &spec) else {
        return;
    };
    nodes[0].extra_args = vec!["--model".into(), fixture.display().to_string()];
    nodes[0].env.push(("HF_HUB_OFFLINE".into(), "1".into()));
    nodes[0].start();
    let model = wait_for(Duration::from_secs(300), || {
        let (_, models) = support::call(&nodes[0], "GET", "/v1/models", None);
        models["data"]
            .as_array()?
            .iter()
            .find_map(|m| (m["ready"] == true).then(|| m["id"].as_str().unwrap_or("").to_string()))
    })
    .map(|(id, _)| id)
    .unwrap_or_else(|| {
        panic!(
            "the vision model did not become ready\n{}",
            support::logs(&nodes)
        )
    });
    // Its own folder: the main test's `out_dir` empties `dashboard/`.
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-image");
    let _ = std::fs::remove_dir_all(&out);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard_image_checks.py");
    let url = format!("http://{}:{}/", nodes[0].node.ip(), support::API_PORT);
    let images = kit::dirs::vision_fixtures_dir().join("images");
    let output = nodes[0]
        .node
        .command(&kit::dirs::venv_python().to_string_lossy())
        .arg(script)
        .args(["--url", &url, "--model", &model, "--out"])
        .arg(&out)
        .arg("--reference")
        .arg(fixture.join("reference.json"))
        .arg("--images")
        .arg(&images)
        .stdin(Stdio::null())
        .output()
        .expect("run the browser checks");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("all dashboard image checks passed"),
        "the dashboard image checks failed ({}):\n{stdout}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        support::logs(&nodes)
    );
    eprintln!("{stdout}");
    test_net.teardown(nodes);
}
