//! `cargo xtask cluster -n N [--extra-link A,B]... [--release] [-- SHOAL ARGS]`: N shoal nodes
//! on this machine, each in its own network namespace on a shared bridge, until Ctrl-C.
//! `cargo xtask cluster --down` removes what a killed run left behind.

use crate::{cargo, paths::target_dir};
use kit::netns::{self, Netns, Spec};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Prefix of every namespace `cargo xtask cluster` creates.
pub const PREFIX: &str = "shoalx";

/// API port of every node (each has its own namespace, so they do not clash).
pub const API_PORT: u16 = 52415;

struct Options {
    nodes: usize,
    links: Vec<(usize, usize)>,
    release: bool,
    down: bool,
    shoal_args: Vec<String>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        nodes: 3,
        links: Vec::new(),
        release: false,
        down: false,
        shoal_args: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-n" | "--nodes" => {
                let value = it.next().ok_or("-n needs a number")?;
                options.nodes = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| format!("-n {value}: give a number of nodes from 1 to 64"))?;
            }
            "--extra-link" => {
                let value = it.next().ok_or("--extra-link needs A,B")?;
                let (a, b) = value
                    .split_once(',')
                    .and_then(|(a, b)| {
                        Some((
                            a.trim().parse::<usize>().ok()?,
                            b.trim().parse::<usize>().ok()?,
                        ))
                    })
                    .filter(|(a, b)| *a >= 1 && *b >= 1)
                    .ok_or_else(|| {
                        format!("--extra-link {value}: expected two node numbers like 1,2")
                    })?;
                options.links.push((a - 1, b - 1));
            }
            "--release" => options.release = true,
            "--down" => options.down = true,
            "--" => {
                options.shoal_args = it.by_ref().cloned().collect();
            }
            other => return Err(format!("cluster: unknown argument `{other}`")),
        }
    }
    Ok(options)
}

/// Removes every namespace (and the processes in it) of earlier `cargo xtask cluster` runs.
pub fn down() -> Result<(), String> {
    let names = netns::list(&format!("{PREFIX}-"));
    for name in &names {
        netns::delete(name);
    }
    eprintln!("removed {} namespace(s)", names.len());
    Ok(())
}

/// Runs the command.
pub fn cluster(args: &[String]) -> Result<(), String> {
    let options = parse(args)?;
    if options.down {
        return down();
    }
    netns::available()?;
    eprintln!("building shoal ...");
    let mut build = cargo();
    build.args(["build", "--package", "shoal", "--bin", "shoal"]);
    if options.release {
        build.arg("--release");
    }
    crate::util::run(&mut build)?;
    let binary = target_dir()
        .join(if options.release { "release" } else { "debug" })
        .join("shoal");
    let prefix = format!("{PREFIX}-{}", std::process::id());
    let spec = Spec {
        nodes: options.nodes,
        off_bridge: Vec::new(),
        links: options.links.clone(),
    };
    let mut netns = Netns::create(&prefix, &spec)?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .map_err(|e| format!("cannot handle Ctrl-C: {e}"))?;
    }
    let data_root = std::env::temp_dir().join(&prefix);
    let mut children: Vec<Child> = Vec::new();
    for (i, node) in netns.nodes.iter().enumerate() {
        let data_dir = data_root.join(format!("n{}", i + 1));
        let log = std::fs::File::create(data_root.join(format!("n{}.log", i + 1)))
            .or_else(|_| {
                std::fs::create_dir_all(&data_root)?;
                std::fs::File::create(data_root.join(format!("n{}.log", i + 1)))
            })
            .map_err(|e| format!("cannot create logs in {}: {e}", data_root.display()))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = node
            .command(&binary.display().to_string())
            .args(["--api-port", &API_PORT.to_string(), "--data-dir"])
            .arg(&data_dir)
            .args(&options.shoal_args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start node {}: {e}", i + 1))?;
        children.push(child);
    }
    println!(
        "{} node(s) running; logs in {}",
        netns.nodes.len(),
        data_root.display()
    );
    for (i, node) in netns.nodes.iter().enumerate() {
        let mut addrs: Vec<String> = node
            .bridge_ip
            .iter()
            .map(|ip| format!("http://{ip}:{API_PORT}"))
            .collect();
        addrs.extend(
            node.link_ips
                .iter()
                .map(|ip| format!("http://{ip}:{API_PORT} (extra link)")),
        );
        println!(
            "node {}: {}  (namespace {})",
            i + 1,
            addrs.join(", "),
            node.netns
        );
    }
    if let Some(first) = netns.nodes.first() {
        println!(
            "\ntry:  ip netns exec {} {} status --api {}:{API_PORT}\nCtrl-C stops the nodes and removes the namespaces.",
            first.netns,
            binary.display(),
            first.ip()
        );
    }
    while !stop.load(Ordering::SeqCst) {
        for (i, child) in children.iter_mut().enumerate() {
            if let Ok(Some(status)) = child.try_wait() {
                eprintln!("node {} exited ({status}); see its log", i + 1);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("stopping ...");
    for child in &mut children {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
    }
    std::thread::sleep(Duration::from_millis(500));
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    netns.teardown();
    Ok(())
}
