//! `shoal bench`: prompt and generation speed of a model on every placement the cluster
//! offers, through the HTTP API like any client (exo's `exo_bench`).
//!
//! For each preview of `GET /instance/previews?model_id=` with the asked sharding and node
//! count: `POST /instance`, wait until every rank is ready, size a prompt to about `pp` tokens
//! (corrected from the server's `usage.prompt_tokens`), run `warmup` then `repeat` streamed,
//! greedy requests of `max_tokens = tg` with `ignore_eos`, and `DELETE /instance/{id}`.
//! Prompt tok/s is prompt tokens over the time to the first token; generation tok/s is
//! (completion tokens − 1) over the time from the first token to the last, both as seen by
//! the client (so they include HTTP and, through a node without rank 0, forwarding).
//!
//! **Why a crate of its own.** It is a client of the cluster API (over `kit`'s typed client),
//! not part of the node: as a crate it keeps the node itself off the test kit.

mod instance;
mod prompt;
mod report;

use clap::Args;
use instance::{readiness, select_previews, Preview, Readiness, ShardingChoice};
use kit::client::{percent_encode, Api};
use kit::timing::Sample;
use report::Row;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Arguments of `shoal bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The node to drive, as http://HOST:PORT.
    #[arg(long, default_value = "http://127.0.0.1:52415")]
    pub api: String,
    /// The model to place and measure (an id the node knows, or `default`).
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Prompt sizes in tokens, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "128")]
    pub pp: Vec<u32>,
    /// Tokens to generate per request, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "128")]
    pub tg: Vec<u32>,
    /// Measure placements over at least this many nodes.
    #[arg(long, default_value_t = 1)]
    pub min_nodes: usize,
    /// Measure placements over at most this many nodes (default: any).
    #[arg(long)]
    pub max_nodes: Option<usize>,
    /// Which shardings to measure.
    #[arg(long, value_enum, default_value = "both")]
    pub sharding: ShardingChoice,
    /// Measured requests per prompt size and generation length.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Unmeasured requests first, per prompt size and generation length.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Seconds allowed for an instance to become ready, and for each request.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Also write every row, with each request's figures, to this JSON file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

/// Validated options.
#[derive(Debug, Clone)]
struct Options {
    api: Api,
    model: String,
    pp: Vec<u32>,
    tg: Vec<u32>,
    min_nodes: usize,
    max_nodes: usize,
    sharding: ShardingChoice,
    repeat: usize,
    warmup: usize,
    timeout: Duration,
    json_out: Option<PathBuf>,
}

impl Options {
    fn from_args(args: &BenchArgs) -> Result<Options, String> {
        let api = Api::parse(&args.api, gateway::DEFAULT_API_PORT)?;
        if args.model.trim().is_empty() {
            return Err("--model: name a model, for example `default`".into());
        }
        for (name, list) in [("--pp", &args.pp), ("--tg", &args.tg)] {
            if list.is_empty() || list.contains(&0) {
                return Err(format!(
                    "{name}: give one or more token counts of at least 1, like `{name} 128,512`"
                ));
            }
        }
        let max_nodes = args.max_nodes.unwrap_or(usize::MAX);
        if args.min_nodes == 0 || max_nodes < args.min_nodes {
            return Err(format!(
                "--min-nodes {} --max-nodes {}: need 1 <= min <= max",
                args.min_nodes, max_nodes
            ));
        }
        if args.repeat == 0 {
            return Err("--repeat: measure at least once".into());
        }
        if args.timeout == 0 {
            return Err("--timeout: give a number of seconds of at least 1".into());
        }
        Ok(Options {
            api,
            model: args.model.trim().to_string(),
            pp: args.pp.clone(),
            tg: args.tg.clone(),
            min_nodes: args.min_nodes,
            max_nodes,
            sharding: args.sharding,
            repeat: args.repeat,
            warmup: args.warmup,
            timeout: Duration::from_secs(args.timeout),
            json_out: args.json_out.clone(),
        })
    }
}

/// Runs the command: exit 0 when every preview was measured, 1 when any failed, 2 for bad
/// arguments.
pub fn run(args: &BenchArgs) -> ExitCode {
    let options = match Options::from_args(args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(&options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(o: &Options) -> Result<(), String> {
    let answer = o.api.previews(&o.model).await.map_err(|e| {
        format!(
            "asking {} for placements of `{}`: {e}",
            o.api.url(),
            o.model
        )
    })?;
    let (previews, impossible) = select_previews(&answer, o.sharding, o.min_nodes, o.max_nodes)?;
    for why in &impossible {
        eprintln!("skipped (cannot be placed): {why}");
    }
    if previews.is_empty() {
        return Err(format!(
            "no placement of `{}` with the asked sharding and node count can be made{}",
            o.model,
            if impossible.is_empty() {
                String::new()
            } else {
                format!(": {}", impossible.join("; "))
            }
        ));
    }
    eprintln!(
        "measuring {} placement(s) of `{}` through {}",
        previews.len(),
        o.model,
        o.api.url()
    );
    let mut measured: Vec<Result<Row, String>> = Vec::new();
    let mut interrupted = false;
    for preview in &previews {
        eprintln!("== {} on {} node(s)", preview.sharding, preview.nodes);
        // Ctrl-C drops the measurement; its guard deletes the instance it created.
        tokio::select! {
            () = measure_preview(o, preview, &mut measured) => {}
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted");
                interrupted = true;
            }
        }
        if interrupted {
            break;
        }
    }
    let mut failures: Vec<String> = measured
        .iter()
        .filter_map(|r| r.as_ref().err().cloned())
        .collect();
    if interrupted {
        failures.push("interrupted by Ctrl-C".into());
    }
    let rows: Vec<Row> = measured.into_iter().filter_map(Result::ok).collect();
    println!("\n{}", report::table(&rows));
    if let Some(path) = &o.json_out {
        let doc = json!({
            "api": o.api.url(),
            "model": o.model,
            "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
            "failures": failures,
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} measurement(s) failed:\n  {}",
            failures.len(),
            failures.join("\n  ")
        ))
    }
}

/// Creates the instance, measures it, deletes it; pushes the rows (or the failure) measured.
async fn measure_preview(o: &Options, preview: &Preview, rows: &mut Vec<Result<Row, String>>) {
    let label = format!("{} on {} node(s)", preview.sharding, preview.nodes);
    let created = o.api.create_instance(&preview.instance).await;
    let id = match created.map_err(|e| e.to_string()).and_then(|answer| {
        instance::instance_id(&answer)
            .ok_or_else(|| format!("POST /instance answered no instance id: {answer}"))
    }) {
        Ok(id) => id,
        Err(e) => {
            rows.push(Err(format!("{label}: creating the instance: {e}")));
            return;
        }
    };
    eprintln!("created instance {id}");
    let model = preview
        .instance
        .get("model_id")
        .and_then(Value::as_str)
        .unwrap_or(&o.model)
        .to_string();
    let mut guard = DeleteOnDrop {
        api: o.api.clone(),
        id: id.clone(),
        armed: true,
    };
    let result = async {
        wait_ready(o, &id).await?;
        measure_instance(o, preview, &id, &model, rows).await
    }
    .await;
    if let Err(e) = result {
        rows.push(Err(format!("{label}: {e}")));
    }
    guard.armed = false;
    if let Err(e) = delete_and_wait(o, &id).await {
        rows.push(Err(format!("{label}: deleting instance {id}: {e}")));
    }
}

/// Deletes the instance if the measurement was abandoned (Ctrl-C drops the future), from a
/// thread of its own since no runtime may be left to run async code.
struct DeleteOnDrop {
    api: Api,
    id: String,
    armed: bool,
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (api, id) = (self.api.clone(), self.id.clone());
        let done = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                let deleted = runtime.block_on(tokio::time::timeout(
                    Duration::from_secs(10),
                    api.delete_instance(&id),
                ));
                match deleted {
                    Ok(Ok(_)) => eprintln!("deleted instance {id}"),
                    _ => eprintln!(
                        "could not delete instance {id}; remove it with curl -X DELETE {}/instance/{}",
                        api.url(),
                        percent_encode(&id)
                    ),
                }
            }
        });
        let _ = done.join();
    }
}

async fn wait_ready(o: &Options, id: &str) -> Result<(), String> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let status = match o.api.instance(id).await {
            Ok(instance) => readiness(&instance),
            Err(e) => {
                Readiness::Waiting(format!("GET /instance/{} failed: {e}", percent_encode(id)))
            }
        };
        match status {
            Readiness::Ready => {
                eprintln!(
                    "instance {id} ready after {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            Readiness::Failed(why) => return Err(format!("instance {id} failed: {why}")),
            Readiness::Waiting(text) => {
                if text != last {
                    eprintln!("  {:>6.1} s  {text}", started.elapsed().as_secs_f64());
                    last = text;
                }
            }
        }
        if started.elapsed() > o.timeout {
            return Err(format!(
                "instance {id} was not ready within {} s (--timeout); last: {last}",
                o.timeout.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn delete_and_wait(o: &Options, id: &str) -> Result<(), String> {
    o.api.delete_instance(id).await.map_err(|e| e.to_string())?;
    // Let the runners shut down before the next placement starts its own.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        match o.api.instance(id).await {
            Err(e) if e.status.is_some_and(|s| s.as_u16() == 404) => {
                eprintln!("deleted instance {id}");
                return Ok(());
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    eprintln!("instance {id} still listed 30 s after DELETE; going on");
    Ok(())
}

/// A chat body: greedy, `max_tokens` tokens, EOS ignored.
fn chat_body(model: &str, prompt: &str, max_tokens: u32, stream: bool) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// Finds how many words make a prompt of `target` tokens on this model.
async fn calibrate(o: &Options, model: &str, target: u32) -> Result<(usize, u64), String> {
    let target = u64::from(target);
    let mut words = prompt::first_word_count(target);
    let mut best: Option<(usize, u64)> = None;
    for _ in 0..prompt::MAX_CALIBRATION_ROUNDS {
        let body = chat_body(model, &prompt::build_prompt(words), 1, false);
        let answer = tokio::time::timeout(o.timeout, o.api.chat(&body))
            .await
            .map_err(|_| format!("sizing the prompt took over {} s", o.timeout.as_secs()))?
            .map_err(|e| format!("sizing the prompt: {e}"))?;
        let got = answer["usage"]["prompt_tokens"]
            .as_u64()
            .ok_or_else(|| format!("the chat answer has no usage.prompt_tokens: {answer}"))?;
        if best.is_none_or(|(_, b)| got.abs_diff(target) < b.abs_diff(target)) {
            best = Some((words, got));
        }
        if got == target {
            break;
        }
        let next = prompt::next_word_count(words, got, target);
        if next == words {
            break;
        }
        words = next;
    }
    best.ok_or_else(|| "no calibration round ran".to_string())
}

async fn measure_instance(
    o: &Options,
    preview: &Preview,
    id: &str,
    model: &str,
    rows: &mut Vec<Result<Row, String>>,
) -> Result<(), String> {
    for &pp in &o.pp {
        let (words, tokens) = calibrate(o, model, pp).await?;
        eprintln!("pp {pp}: {words} words make a prompt of {tokens} tokens");
        let text = prompt::build_prompt(words);
        for &tg in &o.tg {
            let body = chat_body(model, &text, tg, true);
            for i in 0..o.warmup {
                o.api
                    .timed_chat(&body, o.timeout)
                    .await
                    .map_err(|e| format!("warm-up {} (pp {pp}, tg {tg}): {e}", i + 1))?;
            }
            let mut samples: Vec<Sample> = Vec::new();
            for i in 0..o.repeat {
                let s = o
                    .api
                    .timed_chat(&body, o.timeout)
                    .await
                    .map_err(|e| format!("run {} (pp {pp}, tg {tg}): {e}", i + 1))?;
                eprintln!(
                    "  pp {pp} tg {tg} run {}/{}: prompt {} tok, TTFT {:.0} ms ({:.1} tok/s); {} tok at {} tok/s",
                    i + 1,
                    o.repeat,
                    s.prompt_tokens,
                    s.ttft_s * 1000.0,
                    s.prompt_tps().unwrap_or(0.0),
                    s.completion_tokens,
                    s.generation_tps()
                        .map_or("-".into(), |t| format!("{t:.2}"))
                );
                if s.completion_tokens < u64::from(tg) {
                    eprintln!(
                        "  note: generation stopped after {} of {tg} tokens (does the node honour ignore_eos?)",
                        s.completion_tokens
                    );
                }
                samples.push(s);
            }
            rows.push(Ok(Row {
                sharding: preview.sharding.clone(),
                nodes: preview.nodes,
                instance_id: id.to_string(),
                pp,
                tg,
                samples,
            }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn options(args: &[&str]) -> Result<Options, String> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        Options::from_args(&cli.bench)
    }

    #[test]
    fn defaults_follow_exo_bench() {
        let o = options(&[]).unwrap();
        assert_eq!(o.api.url(), "http://127.0.0.1:52415");
        assert_eq!((o.pp.clone(), o.tg.clone()), (vec![128], vec![128]));
        assert_eq!((o.min_nodes, o.max_nodes), (1, usize::MAX));
        assert_eq!(o.sharding, ShardingChoice::Both);
        assert_eq!((o.repeat, o.warmup), (3, 1));
        assert_eq!(o.timeout, Duration::from_secs(600));
    }

    #[test]
    fn lists_and_ranges_parse() {
        let o = options(&[
            "--pp",
            "128,512",
            "--tg",
            "64",
            "--min-nodes",
            "2",
            "--max-nodes",
            "3",
            "--sharding",
            "tensor",
            "--api",
            "10.99.0.1:52415",
        ])
        .unwrap();
        assert_eq!(o.pp, vec![128, 512]);
        assert_eq!((o.min_nodes, o.max_nodes), (2, 3));
        assert_eq!(o.sharding, ShardingChoice::Tensor);
        assert_eq!(o.api.url(), "http://10.99.0.1:52415");
    }

    #[test]
    fn bad_arguments_are_refused_with_the_flag_named() {
        for (args, flag) in [
            (&["--pp", "0"][..], "--pp"),
            (&["--tg", "64,0"], "--tg"),
            (&["--min-nodes", "3", "--max-nodes", "2"], "--min-nodes"),
            (&["--min-nodes", "0"], "--min-nodes"),
            (&["--repeat", "0"], "--repeat"),
            (&["--timeout", "0"], "--timeout"),
            (&["--api", "https://x"], "--api"),
            (&["--model", " "], "--model"),
        ] {
            let e = options(args).unwrap_err();
            assert!(e.contains(flag), "{args:?}: {e}");
        }
        assert!(options(&["--pp", "x"]).is_err());
        assert!(options(&["--sharding", "diagonal"]).is_err());
    }

    #[test]
    fn chat_bodies_ask_for_greedy_full_length_streams() {
        let b = chat_body("m", "the the", 64, true);
        assert_eq!(b["max_tokens"], 64);
        assert_eq!(b["temperature"], 0);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert!(chat_body("m", "x", 1, false).get("stream").is_none());
    }
}
