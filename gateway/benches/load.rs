//! Load benchmark: 32 concurrent streaming chats on loopback against the fake backend, which
//! sleeps a fixed delay before each token. Prints the time-to-first-token distribution and
//! the gateway's own added latency (first token seen by the client minus the backend's delay).
//! Bounded: 32 clients, 3 rounds, 127.0.0.1 only.
//!
//! Run: `cargo bench -p gateway --bench load` (figures, not assertions).

use bytes::Bytes;
use gateway::fake::{FakeBackend, FAKE_MODEL};
use gateway::{CancellationToken, GatewayConfig};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CONCURRENT: usize = 32;
const ROUNDS: usize = 3;
const TOKEN_DELAY: Duration = Duration::from_millis(20);
const TOKENS: usize = 16;

/// Times of one streamed request, from sending it.
struct Timing {
    first_byte: Duration,
    first_token: Duration,
    total: Duration,
}

async fn one_stream(addr: SocketAddr, seed: usize) -> Timing {
    let body = serde_json::json!({
        "model": FAKE_MODEL,
        "messages": [{"role": "user", "content": "tell me"}],
        "stream": true,
        "seed": seed,
    })
    .to_string();
    let started = Instant::now();
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let request = Request::post("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    assert!(response.status().is_success());
    let mut body = response.into_body();
    let mut first_byte = None;
    let mut first_token = None;
    let mut text = String::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("frame");
        if let Some(data) = frame.data_ref() {
            first_byte.get_or_insert_with(|| started.elapsed());
            text.push_str(&String::from_utf8_lossy(data));
            if first_token.is_none()
                && text.contains("\"content\":\"")
                && text.matches("data: ").count() >= 2
            {
                first_token = Some(started.elapsed());
            }
        }
    }
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "stream did not complete: {text}"
    );
    Timing {
        first_byte: first_byte.unwrap_or_default(),
        first_token: first_token.unwrap_or_default(),
        total: started.elapsed(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index]
}

fn report(name: &str, mut values: Vec<Duration>) {
    values.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<28} p50 {:>7.2} ms  p90 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  (n={})",
        ms(percentile(&values, 0.5)),
        ms(percentile(&values, 0.9)),
        ms(percentile(&values, 0.99)),
        ms(*values.last().unwrap_or(&Duration::ZERO)),
        values.len()
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let backend = Arc::new(FakeBackend::new(TOKEN_DELAY));
        let shutdown = CancellationToken::new();
        tokio::spawn(gateway::serve(listener, backend.clone(), GatewayConfig::default(), shutdown.clone()));

        let mut timings = Vec::new();
        let wall = Instant::now();
        for round in 0..ROUNDS {
            let tasks: Vec<_> = (0..CONCURRENT)
                .map(|i| tokio::spawn(one_stream(addr, round * CONCURRENT + i)))
                .collect();
            for task in tasks {
                timings.push(task.await.expect("stream task"));
            }
        }
        let wall = wall.elapsed();
        shutdown.cancel();

        println!(
            "gateway load: {ROUNDS} rounds x {CONCURRENT} concurrent streams, {TOKENS} tokens each, \
             fake backend {} ms per token, loopback",
            TOKEN_DELAY.as_millis()
        );
        report("time to first byte (role)", timings.iter().map(|t| t.first_byte).collect());
        report("time to first token", timings.iter().map(|t| t.first_token).collect());
        report(
            "added latency (TTFT - delay)",
            timings.iter().map(|t| t.first_token.saturating_sub(TOKEN_DELAY)).collect(),
        );
        let ideal = TOKEN_DELAY * TOKENS as u32;
        report("whole stream", timings.iter().map(|t| t.total).collect());
        println!(
            "ideal whole stream {:.0} ms; {} streams completed in {:.2} s wall ({} finished in the backend)",
            ideal.as_secs_f64() * 1000.0,
            timings.len(),
            wall.as_secs_f64(),
            backend.counters.finished.load(std::sync::atomic::Ordering::Relaxed),
        );
    });
}
