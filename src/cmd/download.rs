//! `shoal download MODEL`: fetches a Hugging Face model into the Hugging Face cache (the files
//! a node needs to run it whole: safetensors weights or the GGUF of the `:QUANT` asked for,
//! config, tokenizer and template), with a progress bar on stderr, and prints the snapshot
//! folder. `HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` work as with `huggingface-cli`.

use clap::Args;
use hub::{Hub, HubConfig, ModelId, Progress};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `shoal download` flags.
#[derive(Args, Debug)]
pub struct DownloadArgs {
    /// The model: `org/name`, `org/name@revision`, or `org/name:Q4_K_M` for a GGUF repo.
    pub model: String,
    /// Use only the cache (as HF_HUB_OFFLINE=1): check the model is there, fetch nothing.
    #[arg(long)]
    pub offline: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Files fetched at once.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
}

/// Runs `shoal download`.
pub fn run(args: &DownloadArgs) -> anyhow::Result<()> {
    let id = ModelId::parse(&args.model)?;
    let mut config = HubConfig::from_env();
    config.offline |= args.offline;
    config.parallel = args.parallel.clamp(1, 32);
    let hub = Hub::new(config)?;
    let progress = Arc::new(Progress::default());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let quant = id.quant.clone();
    let select = move |files: &[hub::RepoFile]| {
        hub::select::for_model(files, quant.as_deref()).unwrap_or_default()
    };
    let started = Instant::now();
    let snapshot = runtime.block_on(async {
        let download = hub.download(&id, &select, progress.clone());
        tokio::pin!(download);
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                done = &mut download => break done,
                _ = tick.tick() => if !args.quiet { draw(&progress, started.elapsed(), false) },
            }
        }
    });
    if !args.quiet {
        draw(&progress, started.elapsed(), true);
    }
    let snapshot = snapshot?;
    if snapshot.files.is_empty() {
        anyhow::bail!(
            "model `{id}` has no files shoal can run (safetensors weights, or a GGUF named by :QUANT)"
        );
    }
    println!("{}", snapshot.dir.display());
    Ok(())
}

/// Bytes as MB with one decimal.
fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// One line of progress: bar, bytes, rate, ETA, file.
pub fn line(t: &hub::progress::Totals, elapsed: Duration) -> String {
    let fraction = if t.total == 0 {
        1.0
    } else {
        t.done as f64 / t.total as f64
    };
    let width = 24;
    let filled = ((fraction * width as f64) as usize).min(width);
    let rate = t.fetched as f64 / elapsed.as_secs_f64().max(0.001);
    let eta = if rate > 0.0 {
        format!("{:.0}s", t.total.saturating_sub(t.done) as f64 / rate)
    } else {
        "?".into()
    };
    format!(
        "[{}{}] {:>3.0}% {}/{} {}/s ETA {eta} ({}/{} files){}",
        "#".repeat(filled),
        "-".repeat(width - filled),
        fraction * 100.0,
        mb(t.done),
        mb(t.total),
        mb(rate as u64),
        t.files_complete,
        t.files,
        t.current
            .as_deref()
            .map(|c| format!(" {c}"))
            .unwrap_or_default()
    )
}

fn draw(progress: &Progress, elapsed: Duration, last: bool) {
    let totals = progress.totals();
    if totals.files == 0 {
        // Nothing to fetch (offline, or not listed yet).
        return;
    }
    let text = line(&totals, elapsed);
    let mut err = std::io::stderr();
    let _ = write!(err, "\r\x1b[2K{text}{}", if last { "\n" } else { "" });
    let _ = err.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_shows_bytes_rate_eta_and_file() {
        let t = hub::progress::Totals {
            done: 50_000_000,
            total: 100_000_000,
            fetched: 50_000_000,
            files_complete: 1,
            files: 3,
            current: Some("model-00002-of-00003.safetensors".into()),
            current_source: None,
        };
        let l = line(&t, Duration::from_secs(5));
        assert_eq!(
            l,
            "[############------------]  50% 50.0 MB/100.0 MB 10.0 MB/s ETA 5s (1/3 files) model-00002-of-00003.safetensors"
        );
    }
}
