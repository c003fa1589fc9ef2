//! Shared by the tests: seeded tiny random models written as Hugging Face folders, the SmolLM2
//! fixture, and running the ranks of a multi-rank instance as processes, each in its own Linux
//! network namespace when the tests run as root (else on loopback).
#![allow(dead_code)]

pub mod batched;
pub mod family_check;
pub mod qmm_case;
pub mod reference;
pub mod tensor_ranks;

pub use kit::netns;

use mlx_rs::Array;
use std::path::Path;
use text::sampling::Rng;

/// The vision fixtures `cargo xtask setup` makes with mlx-vlm (`kit::dirs::vision_fixtures_dir`),
/// checked to be there.
pub fn vision_fixtures() -> std::path::PathBuf {
    let dir = kit::dirs::vision_fixtures_dir();
    assert!(
        dir.join("gemma3/pixel_values.safetensors").exists(),
        "{} is missing: run `cargo xtask setup`",
        dir.display()
    );
    dir
}

/// Writes a tiny model of `arch` ("llama", "qwen2", "qwen3") with seeded random weights.
pub fn write_tiny_model(dir: &Path, arch: &str, seed: u64, context: usize) {
    let (hidden, layers, heads, kv_heads, head_dim, ffn, vocab) =
        (64usize, 4usize, 4usize, 2usize, 16usize, 128usize, 96usize);
    let mut rng = Rng::new(seed);
    let mut tensors: Vec<(String, Array)> = Vec::new();
    let mut rand = |name: String, shape: &[usize], scale: f32, offset: f32| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| offset + scale * (rng.next_f64() as f32 * 2.0 - 1.0))
            .collect();
        let s: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        tensors.push((name, Array::from_slice(&v, &s)));
    };
    rand(
        "model.embed_tokens.weight".into(),
        &[vocab, hidden],
        1.0,
        0.0,
    );
    for l in 0..layers {
        let p = |n: &str| format!("model.layers.{l}.{n}");
        let w = 1.0 / (hidden as f32).sqrt();
        rand(
            p("self_attn.q_proj.weight"),
            &[heads * head_dim, hidden],
            w,
            0.0,
        );
        rand(
            p("self_attn.k_proj.weight"),
            &[kv_heads * head_dim, hidden],
            w,
            0.0,
        );
        rand(
            p("self_attn.v_proj.weight"),
            &[kv_heads * head_dim, hidden],
            w,
            0.0,
        );
        rand(
            p("self_attn.o_proj.weight"),
            &[hidden, heads * head_dim],
            w,
            0.0,
        );
        if arch == "qwen2" {
            rand(p("self_attn.q_proj.bias"), &[heads * head_dim], 0.1, 0.0);
            rand(p("self_attn.k_proj.bias"), &[kv_heads * head_dim], 0.1, 0.0);
            rand(p("self_attn.v_proj.bias"), &[kv_heads * head_dim], 0.1, 0.0);
        }
        if arch == "qwen3" {
            rand(p("self_attn.q_norm.weight"), &[head_dim], 0.2, 1.0);
            rand(p("self_attn.k_norm.weight"), &[head_dim], 0.2, 1.0);
        }
        rand(p("mlp.gate_proj.weight"), &[ffn, hidden], w, 0.0);
        rand(p("mlp.up_proj.weight"), &[ffn, hidden], w, 0.0);
        rand(
            p("mlp.down_proj.weight"),
            &[hidden, ffn],
            1.0 / (ffn as f32).sqrt(),
            0.0,
        );
        rand(p("input_layernorm.weight"), &[hidden], 0.2, 1.0);
        rand(p("post_attention_layernorm.weight"), &[hidden], 0.2, 1.0);
    }
    rand("model.norm.weight".into(), &[hidden], 0.2, 1.0);
    let tie = arch != "llama";
    if !tie {
        rand(
            "lm_head.weight".into(),
            &[vocab, hidden],
            1.0 / (hidden as f32).sqrt(),
            0.0,
        );
    }
    std::fs::create_dir_all(dir).unwrap();
    Array::save_safetensors(
        tensors.iter().map(|(n, a)| (n.as_str(), a)),
        None,
        dir.join("model.safetensors"),
    )
    .unwrap();
    let config = serde_json::json!({
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": ffn,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": context,
        "tie_word_embeddings": tie,
        "eos_token_id": 1,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    // A word-level tokenizer: token i is the word `w{i}`.
    let vocab_map: serde_json::Map<String, serde_json::Value> = (0..vocab)
        .map(|i| (format!("w{i}"), serde_json::json!(i)))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab_map, "unk_token": "w0"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"eos_token": "w1", "chat_template": "{% for m in messages %}{{ m.role }} {{ m.content }} {% endfor %}"}).to_string(),
    )
    .unwrap();
}

/// A fresh temporary directory under the target dir (removed by the caller or left for debugging).
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("shoal-inference-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Logits as host floats.
pub fn host(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(mlx_rs::Dtype::Float32).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Index of the largest value (the greedy token).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The SmolLM2 fixture that `cargo xtask setup` downloads.
pub fn smollm2() -> std::path::PathBuf {
    let path = kit::dirs::default_model_path();
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask setup`",
        path.display()
    );
    path
}

/// The SmolLM2 fixture loaded once per test binary in f32 (tests of one binary run on threads
/// and take turns with it).
pub fn smollm2_f32() -> std::sync::MutexGuard<'static, inference::Engine> {
    static ENGINE: std::sync::OnceLock<std::sync::Mutex<inference::Engine>> =
        std::sync::OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let engine = inference::Engine::load(smollm2(), Some(inference::WeightFormat::F32));
            std::sync::Mutex::new(engine.unwrap())
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// "<|im_start|>user\nWhat is the capital of France?" as SmolLM2 token ids.
pub const SMOLLM2_PROMPT: &str = "1,4093,198,1780,314,260,3575,282,4649,47";

/// The last position's logits of `engine` on [`SMOLLM2_PROMPT`].
pub fn prompt_logits(engine: &inference::Engine) -> Vec<f32> {
    let ids: Vec<u32> = SMOLLM2_PROMPT
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect();
    let mut cache = engine.model.new_cache();
    let logits = engine
        .model
        .forward(inference::ShardInput::Tokens(&ids), &mut cache, true)
        .unwrap();
    inference::sequence_forward::last_logits_to_host(&logits).unwrap()
}

/// Namespaces of these tests are named `shi<pid><tag>-...`.
const NETNS_PREFIX: &str = "shi";

/// Deletes namespaces named like `prefix` (left by an earlier run with the same pid) and those
/// of test processes that no longer run (killed before they could clean up).
fn remove_stale_namespaces(prefix: &str) {
    for name in netns::list(NETNS_PREFIX) {
        let pid: String = name[NETNS_PREFIX.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let dead = !pid.is_empty() && !Path::new(&format!("/proc/{pid}")).exists();
        if dead || name.starts_with(prefix) {
            netns::delete(&name);
        }
    }
}

/// Where the ranks of a multi-process test run. As root with `ip` available, each rank gets
/// its own network namespace (`10.99.0.(rank+1)` on a bridge in a hub namespace), listens on
/// `0.0.0.0:PORT` and dials its neighbours at their namespace addresses, as real nodes do.
/// Otherwise (or with `SHOAL_TEST_LOOPBACK` set) every rank runs on loopback: a test that
/// names separate machines runs less, so that fails it unless skips are allowed, and counts
/// as a skip then. Dropping it kills what runs in
/// the namespaces and deletes them, also when the test panics.
pub struct RankNet {
    netns: Option<(netns::Netns, String)>,
    ports: Vec<u16>,
}

impl RankNet {
    /// Places `size` ranks; `tag` must be unique among the tests of one binary, `base_port`
    /// among the tests that may run at once on loopback.
    pub fn new(tag: &str, size: usize, base_port: u16) -> RankNet {
        let ports = (0..size).map(|r| base_port + r as u16).collect();
        let allowed = if std::env::var_os("SHOAL_TEST_LOOPBACK").is_some() {
            Err("SHOAL_TEST_LOOPBACK is set".to_string())
        } else {
            netns::available()
        };
        // Ranks on loopback run less than the test names (no separate network stacks): a
        // fallback fails the test unless skips are allowed, and is counted as a skip then.
        let fix = "run the tests as root with iproute2 (or set SHOAL_ALLOW_SKIP=1 to run the \
                   ranks on loopback, counted as a skip)";
        let allowed = if kit::skip::can_run(allowed, fix) {
            Ok(())
        } else {
            Err("namespaces unavailable".to_string())
        };
        let netns = match allowed {
            Ok(()) => {
                // Short, unique per test process and test: namespace names are file names.
                let prefix = format!("{NETNS_PREFIX}{}{tag}", std::process::id());
                remove_stale_namespaces(&prefix);
                let spec = netns::Spec {
                    nodes: size,
                    ..Default::default()
                };
                match netns::Netns::create(&prefix, &spec) {
                    Ok(n) => Some((n, prefix)),
                    Err(e) => {
                        let why = format!("{tag}: cannot make namespaces ({e})");
                        kit::skip::can_run(Err(why), fix);
                        eprintln!("note: {tag}: ranks run on loopback");
                        None
                    }
                }
            }
            Err(why) => {
                eprintln!("note: {tag}: {why}; ranks run on loopback");
                None
            }
        };
        RankNet { netns, ports }
    }

    /// The prefix of this placement's namespaces, if it made any.
    pub fn netns_prefix(&self) -> Option<String> {
        self.netns.as_ref().map(|(_, prefix)| prefix.clone())
    }

    /// Whether the ranks run in their own namespaces.
    pub fn in_namespaces(&self) -> bool {
        self.netns.is_some()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.ports.len()
    }

    /// `rank`'s ring view: itself where it listens, its neighbours where they listen, the
    /// others at the RFC 5737 placeholder (never contacted).
    pub fn hosts(&self, rank: usize) -> Vec<Vec<String>> {
        let n = self.size();
        (0..n)
            .map(|r| {
                let neighbour = r == (rank + 1) % n || r == (rank + n - 1) % n;
                let addr = match &self.netns {
                    _ if r != rank && !neighbour => "198.51.100.1:0".to_string(),
                    Some(_) if r == rank => format!("0.0.0.0:{}", self.ports[r]),
                    Some((ns, _)) => format!("{}:{}", ns.nodes[r].ip(), self.ports[r]),
                    None => format!("127.0.0.1:{}", self.ports[r]),
                };
                vec![addr]
            })
            .collect()
    }

    /// A command that runs `program` as `rank` (inside its namespace, if any).
    pub fn command(&self, rank: usize, program: &Path) -> std::process::Command {
        match &self.netns {
            Some((ns, _)) => ns.nodes[rank].command(&program.display().to_string()),
            None => std::process::Command::new(program),
        }
    }
}

/// Re-runs this test binary once per rank (placed by `net`), running only `child_test` (an
/// ignored test, hence `--ignored`) with `env_var` set to that rank's spec, and waits for all
/// of them. Returns each rank's stdout; panics with the rank's output if one failed or did
/// not print `RANK {rank} {marker}`.
pub fn run_ranks(
    net: &RankNet,
    child_test: &str,
    env_var: &str,
    specs: &[String],
    marker: &str,
) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = specs
        .iter()
        .enumerate()
        .map(|(rank, spec)| {
            net.command(rank, &exe)
                .args([
                    child_test,
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(env_var, spec)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .enumerate()
        .map(|(rank, child)| {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success() && stdout.contains(&format!("RANK {rank} {marker}")),
                "rank {rank} of {} failed ({}):\n{stdout}\n{}",
                specs.len(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            stdout
        })
        .collect()
}

/// A ring view as one spec field (JSON), and back.
pub fn hosts_field(hosts: &[Vec<String>]) -> String {
    serde_json::to_string(hosts).unwrap()
}

/// See [`hosts_field`].
pub fn parse_hosts_field(field: &str) -> Vec<Vec<String>> {
    serde_json::from_str(field).unwrap()
}
