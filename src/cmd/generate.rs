//! `shoal generate`: run a model in this process and stream its answer to the terminal.

use clap::Args;
use inference::loader::{load_shard, LoadOptions};
use inference::{
    ChatMessage, Engine, GenerateRequest, OutputConstraint, Prompt, SamplingParams, WeightFormat,
};
use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `shoal generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A GGUF file, a Hugging Face folder, or `default` for the SmolLM2 fixture.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// The prompt.
    #[arg(long, short, required_unless_present = "token_ids")]
    pub prompt: Option<String>,
    /// Use the token ids in this JSON file (a list of integers) as the prompt (benchmarks).
    #[arg(long, hide = true)]
    pub token_ids: Option<PathBuf>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message (with --chat).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Drop tokens below min_p times the top probability (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Random seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Repetition penalty (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Presence penalty (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Stop before this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past the end-of-text token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Decode under this JSON Schema (a file; `json` for any JSON object): structured
    /// output, and with `--streams` the cost of constraints in a batch (issue 45).
    #[arg(long)]
    pub json_schema: Option<PathBuf>,
    /// Weight representation: f32, f16, bf16 or quantized (default: fastest for the backend;
    /// env SHOAL_DTYPE).
    #[arg(long)]
    pub dtype: Option<String>,
    /// Print only the timing line as JSON on stdout (for benchmarks) instead of the text.
    #[arg(long)]
    pub json_stats: bool,
    /// Decode the request as this many sequences at once, through the batching loop a node
    /// runs, and print their combined speed as JSON (benchmarks; implies --json-stats).
    #[arg(long, hide = true, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub streams: Option<u16>,
}

/// Resolves `default` to the fixture path, and a Hugging Face model id (`org/name`) to its
/// snapshot in the Hugging Face cache (`shoal download` puts it there); anything else is a
/// path.
pub fn model_path(model: &str) -> PathBuf {
    if model == "default" {
        return models::locate::default_model_path();
    }
    if hub::ModelId::looks_like_id(model) {
        if let Ok(id) = hub::ModelId::parse(model) {
            return models::locate::ModelDirs::from_env(&[]).hf_path_or_future(&id);
        }
    }
    PathBuf::from(model)
}

/// Runs `shoal generate`.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let path = model_path(&args.model);
    if args.model == "default" && !path.exists() {
        anyhow::bail!(
            "the default model is not at {}: run `cargo xtask setup` first",
            path.display()
        );
    }
    if hub::ModelId::looks_like_id(&args.model) && !path.exists() {
        anyhow::bail!(
            "model `{}` is not in the Hugging Face cache: run `shoal download {}` first",
            args.model,
            args.model
        );
    }
    let format = args
        .dtype
        .as_deref()
        .map(str::parse::<WeightFormat>)
        .transpose()?;
    let load_start = Instant::now();
    let (model, tokenizer) = load_shard(
        &path,
        &LoadOptions {
            layers: None,
            format,
        },
        &mut |_, _| {},
    )?;
    let engine = Engine { model, tokenizer };
    let load_seconds = load_start.elapsed().as_secs_f64();
    let text = args.prompt.clone().unwrap_or_default();
    let prompt = if let Some(file) = &args.token_ids {
        let ids: Vec<u32> = serde_json::from_str(&std::fs::read_to_string(file)?)?;
        Prompt::Tokens(ids)
    } else if args.chat {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::new("system", s.clone()));
        }
        messages.push(ChatMessage::new("user", text));
        Prompt::Chat(messages)
    } else {
        Prompt::Text(text)
    };
    let request = GenerateRequest {
        prompt,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            min_p: args.min_p,
            seed: args.seed,
            repetition_penalty: args.repetition_penalty,
            presence_penalty: args.presence_penalty,
            frequency_penalty: args.frequency_penalty,
            ..SamplingParams::default()
        },
        max_tokens: args.max_tokens,
        stop: args.stop.clone(),
        stop_token_ids: vec![],
        ignore_eos: args.ignore_eos,
        constraint: match &args.json_schema {
            None => None,
            Some(path) if path.as_os_str() == "json" => Some(OutputConstraint::JsonObject),
            Some(path) => Some(OutputConstraint::JsonSchema {
                schema: std::fs::read_to_string(path)?,
            }),
        },
        images: Vec::new(),
    };
    let mut stdout = std::io::stdout().lock();
    if let Some(streams) = args.streams {
        let stats = super::generate_streams::run_streams(&engine, &request, streams.into())?;
        let line = serde_json::json!({
            "streams": streams,
            "load_seconds": load_seconds,
            "prompt_tokens": stats.prompt_tokens,
            "prompt_tps": stats.prompt_tps,
            "generation_tokens": stats.generation_tokens,
            "generation_tps": stats.generation_tps,
            "peak_rss_mb": peak_rss_mb(),
        });
        writeln!(stdout, "{line}")?;
        return Ok(());
    }
    let quiet = args.json_stats;
    let completion = engine.generate(&request, |ev| {
        if !quiet {
            let _ = stdout.write_all(ev.text.as_bytes());
            let _ = stdout.flush();
        }
        ControlFlow::Continue(())
    })?;
    if quiet {
        let stats = serde_json::json!({
            "load_seconds": load_seconds,
            "prompt_tokens": completion.prompt_tokens,
            "prompt_tps": completion.prompt_tps(),
            "generation_tokens": completion.completion_tokens(),
            "generation_tps": completion.generation_tps(),
            "peak_rss_mb": peak_rss_mb(),
        });
        writeln!(stdout, "{stats}")?;
    } else {
        writeln!(stdout)?;
        stdout.flush()?;
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s; generation: {} tokens, {:.1} tok/s ({:?}); load {:.2} s",
            completion.prompt_tokens,
            completion.prompt_tps(),
            completion.completion_tokens(),
            completion.generation_tps(),
            completion.finish_reason,
            load_seconds
        );
    }
    Ok(())
}

/// Peak resident memory of this process (Linux `VmHWM`), in MB.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
