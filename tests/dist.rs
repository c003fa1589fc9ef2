//! The relocatable release (`cargo xtask dist`, [`kit::release_tarball`]): the binary these
//! tests run, packed as the xtask packs it and unpacked into a fresh folder, runs with `HOME`
//! and `SHOAL_CACHE_DIR` pointing at empty folders and no `LD_LIBRARY_PATH`, inside network
//! namespaces: nothing of the build tree or the build cache is read. One node answers a chat
//! with the model its `--model` names; two nodes form a cluster, place a 2-rank pipeline and
//! answer (their cache holds only the model file, as after a download).

mod support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::netns::Spec;
use support::{call, shoal_bin, wait_for, ShoalNode, TestNet};

/// Packs this test binary's `shoal`, unpacks it under `dir/unpacked` and returns the unpacked
/// binary, checking that `ldd` finds every library inside the unpacked folder's `lib/` or the
/// system, none in the build cache.
fn unpacked_binary(dir: &Path) -> PathBuf {
    let out = dir.join("dist");
    std::fs::create_dir_all(&out).unwrap();
    let tarball = kit::release_tarball::package(shoal_bin().as_ref(), &out, "test").unwrap();
    assert!(
        tarball.bundled.iter().any(|l| l.ends_with("libmlx.so")),
        "{:?}",
        tarball.bundled
    );
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).unwrap();
    assert!(sums.contains(".tar.gz"), "{sums}");
    let unpacked = dir.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    let status = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&tarball.path)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(status.success());
    // Nothing of the packing folder may be used: it goes.
    std::fs::remove_dir_all(&out).unwrap();
    let folder = std::fs::read_dir(&unpacked)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let binary = folder.join("shoal");
    let cache = kit::dirs::cache_dir();
    let libs = kit::release_tarball::resolved_libraries(&binary).unwrap();
    for (name, path) in &libs {
        assert!(
            !path.starts_with(&cache),
            "{name} resolves into the build cache: {}",
            path.display()
        );
    }
    let mlx = libs.iter().find(|(n, _)| n.starts_with("libmlx")).unwrap();
    assert!(mlx.1.starts_with(&folder), "{}", mlx.1.display());
    let readme = std::fs::read_to_string(folder.join("README.txt")).unwrap();
    assert!(
        readme.contains(&format!("glibc {}", tarball.glibc)),
        "{readme}"
    );
    binary
}

/// `node` runs `binary` with an empty home and cache of its own (or `cache`), and no library
/// path.
fn relocate(node: &mut ShoalNode, binary: &Path, dir: &Path, cache: Option<&Path>) {
    let home = dir.join(format!("home-{}", node.node.netns));
    std::fs::create_dir_all(&home).unwrap();
    let cache = match cache {
        Some(c) => c.to_path_buf(),
        None => {
            let c = dir.join(format!("cache-{}", node.node.netns));
            std::fs::create_dir_all(&c).unwrap();
            c
        }
    };
    node.binary = binary.to_path_buf();
    node.env.extend([
        ("HOME".into(), home.display().to_string()),
        ("SHOAL_CACHE_DIR".into(), cache.display().to_string()),
        ("LD_LIBRARY_PATH".into(), String::new()),
        ("HF_HUB_OFFLINE".into(), "1".into()),
    ]);
}

fn chat(node: &ShoalNode, model: &str) -> (u16, Value) {
    call(
        node,
        "POST",
        "/v1/chat/completions",
        Some(&json!({"model": model, "max_tokens": 12, "temperature": 0,
                     "messages": [{"role": "user", "content": "What is the capital of France?"}]})),
    )
}

fn ready_model(node: &ShoalNode) -> Option<String> {
    let (status, models) = call(node, "GET", "/v1/models", None);
    (status == 200).then_some(())?;
    models["data"]
        .as_array()?
        .iter()
        .find(|m| m["ready"] == true)
        .and_then(|m| m["id"].as_str().map(str::to_string))
}

fn tools_present() -> bool {
    let model = kit::dirs::default_model_path();
    kit::skip::can_run(
        if model.is_file() && which("patchelf") {
            Ok(())
        } else {
            Err(format!(
                "needs patchelf and the model fixture {}",
                model.display()
            ))
        },
        "run `cargo xtask setup`",
    )
}

fn which(tool: &str) -> bool {
    std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_unpacked_tarball_answers_with_an_empty_home_and_cache() {
    if !tools_present() {
        return;
    }
    let Some((net, mut nodes)) = TestNet::create(
        "dist",
        &Spec {
            nodes: 1,
            ..Spec::default()
        },
    ) else {
        return;
    };
    let binary = unpacked_binary(&net.dir);
    let node = &mut nodes[0];
    relocate(node, &binary, &net.dir, None);
    node.extra_args = vec![
        "--model".into(),
        kit::dirs::default_model_path().display().to_string(),
    ];
    node.start();
    let node = &nodes[0];
    let Some((id, took)) = wait_for(Duration::from_secs(120), || ready_model(node)) else {
        panic!("the model never became ready\n{}", node.log_tail());
    };
    eprintln!("ready after {took:?}: {id}");
    let (status, answer) = chat(node, &id);
    assert_eq!(status, 200, "{answer}\n{}", node.log_tail());
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("Paris"), "{answer}");
    net.teardown(nodes);
}

#[test]
fn two_unpacked_nodes_place_a_pipeline_and_answer() {
    if !tools_present() {
        return;
    }
    let Some((net, mut nodes)) = TestNet::create(
        "distc",
        &Spec {
            nodes: 2,
            ..Spec::default()
        },
    ) else {
        return;
    };
    let binary = unpacked_binary(&net.dir);
    for (i, node) in nodes.iter_mut().enumerate() {
        // A cache holding only the default model, as `shoal download` leaves it.
        let cache = net.dir.join(format!("cache{i}"));
        let model = kit::dirs::default_model_path();
        let relative = model.strip_prefix(kit::dirs::cache_dir()).unwrap();
        std::fs::create_dir_all(cache.join(relative).parent().unwrap()).unwrap();
        std::fs::hard_link(&model, cache.join(relative))
            .or_else(|_| std::fs::copy(&model, cache.join(relative)).map(|_| ()))
            .unwrap();
        relocate(node, &binary, &net.dir, Some(&cache));
        node.start();
    }
    let logs = || format!("{}\n---\n{}", nodes[0].log_tail(), nodes[1].log_tail());
    let placed = wait_for(Duration::from_secs(90), || {
        let (status, created) = call(
            &nodes[0],
            "POST",
            "/place_instance",
            Some(&json!({"model_id": "default", "sharding": "Pipeline", "min_nodes": 2})),
        );
        (status == 200).then_some(created)
    });
    let Some((created, _)) = placed else {
        panic!("no two-node placement\n{}", logs());
    };
    let ranks = created["placement"]["ranks"].as_array().map_or(0, Vec::len);
    assert_eq!(ranks, 2, "{created}");
    for node in &nodes {
        let answered = wait_for(Duration::from_secs(120), || {
            let (status, answer) = chat(node, "default");
            (status == 200).then_some(answer)
        });
        let Some((answer, _)) = answered else {
            panic!("no answer through {}\n{}", node.node.netns, logs());
        };
        let text = answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default();
        assert!(text.contains("Paris"), "{answer}");
    }
    net.teardown(nodes);
}
