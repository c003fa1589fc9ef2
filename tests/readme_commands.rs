//! Every command the README shows is run or checked here, so the guide cannot rot: its fenced
//! `sh` and `python` blocks are read from README.md itself.
//!
//! - `shoal …` lines run the real binary with the README's arguments and `--help` appended:
//!   clap refuses an unknown subcommand or flag before it prints help, so a renamed flag fails.
//! - `curl …` lines run for real against a node serving the default model in a namespace
//!   (`HOST` is its address, `INSTANCE_ID` its instance): each path is one the node serves, each
//!   body parses, and a chat with `default` answers 200.
//! - `python` blocks run with the official clients against the same node.
//! - `cargo xtask X` names a command the xtask dispatches.
//! - The rest (`scp`, `tar`, `claude`, `export`, `openssl` inside `$(…)`) is named in [`SKIPPED`]
//!   with the test that covers it, and an unknown program fails the test.

mod support;

use serde_json::Value;
use std::time::Duration;
use support::netns::Spec;
use support::{call, wait_for, ShoalNode, TestNet};

/// Programs the README shows that this test does not run, and why.
const SKIPPED: &[(&str, &str)] = &[
    (
        "scp",
        "copies to another machine: tests/dist.rs unpacks the tarball instead",
    ),
    ("tar", "unpacks the tarball: tests/dist.rs"),
    (
        "claude",
        "Claude Code is not installed here: the Anthropic API is tests/api_clients",
    ),
    ("export", "sets the environment of the next line"),
];

/// The README's fenced blocks of `lang`, each as its lines.
fn blocks(readme: &str, lang: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // Inside a fence: `Some(lines)` collecting one of `lang`, `None` another language's.
    let mut inside: Option<Option<Vec<String>>> = None;
    for line in readme.lines() {
        if let Some(info) = line.strip_prefix("```") {
            inside = match inside.take() {
                Some(collected) => {
                    out.extend(collected);
                    None
                }
                None => Some((info.trim() == lang).then(Vec::new)),
            };
            continue;
        }
        if let Some(Some(block)) = inside.as_mut() {
            block.push(line.to_string());
        }
    }
    out
}

/// A block's commands: continued lines (a trailing `\\`, or a quote left open) joined,
/// comments (`  # …` and whole-line) dropped.
fn commands(block: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in block {
        let line = match line.find("  #") {
            Some(i) if !in_quotes(&format!("{pending}{}", &line[..i])) => &line[..i],
            _ => line.as_str(),
        };
        let line = line.trim_end();
        if pending.is_empty() && (line.trim_start().starts_with('#') || line.trim().is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(line);
                if in_quotes(&pending) {
                    pending.push(' ');
                } else {
                    out.push(std::mem::take(&mut pending).trim().to_string());
                }
            }
        }
    }
    out
}

/// Whether `text` leaves a quote open (a `#` after it is inside the quote).
fn in_quotes(text: &str) -> bool {
    text.matches('\'').count() % 2 == 1 || text.matches('"').count() % 2 == 1
}

/// A command line split as `sh` would (quotes, no expansion; `$(…)` becomes one word).
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut chars = command.chars().peekable();
    let mut started = false;
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                started = true;
                for q in chars.by_ref() {
                    if q == c {
                        break;
                    }
                    word.push(q);
                }
            }
            '$' if chars.peek() == Some(&'(') => {
                started = true;
                let mut depth = 0;
                for q in chars.by_ref() {
                    word.push(q);
                    match q {
                        '(' => depth += 1,
                        ')' if depth == 1 => break,
                        ')' => depth -= 1,
                        _ => {}
                    }
                }
                word = format!("${word}");
            }
            // A README placeholder (`<64 hex digits>`) is one word.
            '<' => {
                started = true;
                word.push('<');
                for q in chars.by_ref() {
                    word.push(q);
                    if q == '>' {
                        break;
                    }
                }
            }
            c if c.is_whitespace() => {
                if started {
                    out.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            c => {
                started = true;
                word.push(c);
            }
        }
    }
    if started {
        out.push(word);
    }
    out
}

/// The words after leading `NAME=value` assignments.
fn program_words(command: &str) -> Vec<String> {
    words(command)
        .into_iter()
        .skip_while(|w| {
            w.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            })
        })
        .collect()
}

/// The program of each `&&`-joined part.
fn parts(command: &str) -> Vec<String> {
    command.split("&&").map(|p| p.trim().to_string()).collect()
}

#[test]
fn every_readme_shoal_command_parses_with_the_real_binary() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let xtask =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/xtask/src/main.rs")).unwrap();
    let mut shoal_lines = 0;
    for block in blocks(&readme, "sh") {
        for command in commands(&block) {
            for part in parts(&command) {
                let w = program_words(&part);
                let Some(program) = w.first() else { continue };
                let program = program.rsplit('/').next().unwrap_or(program);
                match program {
                    "shoal" | "shoal-*" => {
                        shoal_lines += 1;
                        let args: Vec<String> = w[1..]
                            .iter()
                            .map(|a| {
                                if a.starts_with("$(") {
                                    "0123456789abcdef0123456789abcdef".to_string()
                                } else {
                                    a.clone()
                                }
                            })
                            .collect();
                        let out = std::process::Command::new(support::shoal_bin())
                            .args(&args)
                            .arg("--help")
                            .output()
                            .unwrap();
                        assert!(
                            out.status.success(),
                            "README: `{part}` does not parse: {}",
                            String::from_utf8_lossy(&out.stderr)
                        );
                    }
                    "cargo" => {
                        assert_eq!(
                            w.get(1).map(String::as_str),
                            Some("xtask"),
                            "README: `{part}`"
                        );
                        let sub = w.get(2).cloned().unwrap_or_default();
                        assert!(
                            xtask.contains(&format!("\"{sub}\" =>")),
                            "README: `{part}`: the xtask has no command `{sub}`"
                        );
                    }
                    "curl" => {}
                    other => assert!(
                        SKIPPED.iter().any(|(p, _)| *p == other),
                        "README: `{part}` runs `{other}`, which this test neither runs nor skips"
                    ),
                }
            }
        }
    }
    assert!(shoal_lines >= 6, "only {shoal_lines} shoal commands found");
}

/// The `-X`, URL path and `-d` body of a curl command, `HOST` standing for the node.
fn curl_request(w: &[String]) -> (String, String, Option<String>) {
    let mut method = None;
    let mut url = None;
    let mut body = None;
    let mut i = 1;
    while i < w.len() {
        match w[i].as_str() {
            "-X" => {
                method = w.get(i + 1).cloned();
                i += 1;
            }
            "-H" => i += 1,
            "-d" => {
                body = w.get(i + 1).cloned();
                i += 1;
            }
            other if other.starts_with("http") => url = Some(other.to_string()),
            _ => {}
        }
        i += 1;
    }
    let url = url.expect("a URL");
    let path = url
        .splitn(4, '/')
        .nth(3)
        .map(|p| format!("/{p}"))
        .unwrap_or_else(|| "/".into());
    let method = method.unwrap_or_else(|| if body.is_some() { "POST" } else { "GET" }.into());
    (method, path, body)
}

#[test]
fn every_readme_curl_and_python_example_runs_against_a_real_node() {
    if !support::default_model_present() {
        return;
    }
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let Some((net, mut nodes)) = TestNet::create(
        "rdme",
        &Spec {
            nodes: 1,
            ..Spec::default()
        },
    ) else {
        return;
    };
    nodes[0].extra_args = vec!["--model".into(), "default".into()];
    nodes[0].start();
    let node: &ShoalNode = &nodes[0];
    let ready = wait_for(Duration::from_secs(120), || {
        let (status, models) = call(node, "GET", "/v1/models", None);
        (status == 200
            && models["data"]
                .as_array()?
                .iter()
                .any(|m| m["id"] == "default" && m["ready"] == true))
        .then_some(())
    });
    assert!(
        ready.is_some(),
        "the default model never became ready\n{}",
        node.log_tail()
    );
    let instance = {
        let (_, state) = call(node, "GET", "/state", None);
        kit::instances::instances_in_state(&state)
            .into_iter()
            .next()
            .map(|i| i.id)
            .unwrap_or_default()
    };
    let mut ran = 0;
    for block in blocks(&readme, "sh") {
        for command in commands(&block) {
            let w = program_words(&command);
            if w.first().map(String::as_str) != Some("curl") {
                continue;
            }
            let (method, path, body) = curl_request(&w);
            let path = path.replace("INSTANCE_ID", &instance);
            let body: Option<Value> = body.map(|b| {
                serde_json::from_str(&b)
                    .unwrap_or_else(|e| panic!("README: `{command}`: its body is not JSON: {e}"))
            });
            let (status, answer) = call(node, &method, &path, body.as_ref());
            eprintln!("README curl {method} {path}: {status}");
            // Served: any answer but an unknown path's (a model not found is a 404 too).
            let unknown_path = (status == 404 && answer["error"]["code"] != "model_not_found")
                || status == 405
                || status == 0;
            assert!(!unknown_path, "README: `{command}`: {status} {answer}");
            if body.as_ref().is_some_and(|b| b["model"] == "default") {
                assert_eq!(status, 200, "README: `{command}`: {answer}");
                let text = answer["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default();
                assert!(text.contains("Paris"), "README: `{command}`: {answer}");
            }
            ran += 1;
        }
    }
    assert!(ran >= 5, "only {ran} curl commands ran");

    // The python examples, with the official clients from the test venv, in the node's
    // namespace.
    let python = kit::dirs::cache_dir().join("venv/bin/python");
    let host = format!("{}", node.node.ip());
    for block in blocks(&readme, "python") {
        let mut code = block.join("\n").replace("HOST", &host);
        // Each call's result is checked to be an answer, not only made.
        code = code
            .lines()
            .map(|l| {
                if l.contains(".create(") || l.contains(".chat(") {
                    format!("print(repr({}", l.trim_end())
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let code = balance_prints(&code);
        let out = node
            .node
            .command(&python.display().to_string())
            .args(["-c", &code])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "README python block failed:\n{code}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout.lines().count(), 3, "three answers wanted:\n{stdout}");
        eprintln!("README python: {stdout}");
    }
    net.teardown(nodes);
}

/// Closes the `print(repr(` each call line opened, after its last line.
fn balance_prints(code: &str) -> String {
    let mut out = Vec::new();
    let mut open = false;
    let mut depth = 0i32;
    for line in code.lines() {
        let mut line = line.to_string();
        if line.starts_with("print(repr(") {
            open = true;
            depth = 0;
        }
        if open {
            depth += line.matches('(').count() as i32 - line.matches(')').count() as i32;
            if depth == 2 {
                line.push_str("))");
                open = false;
            }
        }
        out.push(line);
    }
    out.join("\n")
}

#[test]
fn the_readers_of_the_readme_split_as_sh_does() {
    assert_eq!(
        words(r#"shoal --api-key "$(openssl rand -hex 24)" -d '{"a": 1}'"#),
        [
            "shoal",
            "--api-key",
            "$(openssl rand -hex 24)",
            "-d",
            r#"{"a": 1}"#
        ]
    );
    assert_eq!(
        program_words("SHOAL_CLUSTER_SECRET=<64 hex digits> shoal"),
        ["shoal"]
    );
    let block = [
        "curl x -d '{\"a\":' \\".to_string(),
        "  '1}'   # comment".to_string(),
        "# alone".to_string(),
    ];
    assert_eq!(commands(&block), ["curl x -d '{\"a\":'    '1}'"]);
}
