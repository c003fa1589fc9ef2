//! `cargo bench -p mesh --bench quic_copy [-- MIB ROUNDS]`: how fast bare iroh QUIC moves
//! bytes on this machine, next to plain TCP, in one run and alternating. It bounds what a
//! peer copy of model files (which runs over the node's iroh endpoint) can reach: if a bare
//! stream is no faster than the peer copy, the copy's own code is not what limits it.
//!
//! Two endpoints in this one process on 127.0.0.1 (relays, address lookup services and mDNS
//! off: nothing is announced; run it inside a network namespace anyway, as every node here
//! is). Each round sends MIB MiB (default 256) in 1 MiB writes: over TCP, over one QUIC
//! stream, over 4 streams of one connection, and over 4 connections, and prints MB/s.

use iroh::endpoint::{presets, Connection};
use iroh::{Endpoint, EndpointAddr};
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ALPN: &[u8] = b"shoal/bench-quic-copy/1";
const CHUNK: usize = 1 << 20;

async fn endpoint() -> Endpoint {
    Endpoint::builder(presets::Minimal)
        .relay_mode(iroh::RelayMode::Disabled)
        .clear_address_lookup()
        .clear_ip_transports()
        .bind_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind address")
        .alpns(vec![ALPN.to_vec()])
        .bind()
        .await
        .expect("bind an endpoint on 127.0.0.1")
}

fn addr_of(endpoint: &Endpoint) -> EndpointAddr {
    endpoint
        .bound_sockets()
        .into_iter()
        .fold(EndpointAddr::new(endpoint.id()), |a, s| a.with_ip_addr(s))
}

/// Reads every uni stream of every accepted connection to its end.
async fn serve(receiver: Endpoint) {
    while let Some(incoming) = receiver.accept().await {
        tokio::spawn(async move {
            let Ok(connection) = incoming.await else {
                return;
            };
            while let Ok(mut stream) = connection.accept_uni().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; CHUNK];
                    while let Ok(Some(n)) = stream.read(&mut buf).await {
                        std::hint::black_box(n);
                    }
                });
            }
        });
    }
}

/// Sends `bytes` on a new uni stream of `connection` and waits until the peer has it all.
async fn send(connection: &Connection, bytes: usize) {
    let mut stream = connection.open_uni().await.expect("open a stream");
    let chunk = bytes::Bytes::from(vec![7u8; CHUNK]);
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK);
        stream.write_chunk(chunk.slice(..n)).await.expect("write");
        left -= n;
    }
    stream.finish().expect("finish");
    stream.stopped().await.expect("the peer read the stream");
}

async fn quic(sender: &Endpoint, to: &EndpointAddr, bytes: usize, streams: usize, conns: usize) {
    let mut connections = Vec::new();
    for _ in 0..conns {
        connections.push(sender.connect(to.clone(), ALPN).await.expect("connect"));
    }
    let per = bytes / streams;
    let tasks: Vec<_> = (0..streams)
        .map(|i| {
            let connection = connections[i % conns].clone();
            tokio::spawn(async move { send(&connection, per).await })
        })
        .collect();
    for task in tasks {
        task.await.expect("sender task");
    }
    for connection in connections {
        connection.close(0u32.into(), b"done");
    }
}

async fn tcp(bytes: usize) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("tcp");
    let addr = listener.local_addr().expect("tcp addr");
    let reader = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0;
        loop {
            let n = socket.read(&mut buf).await.expect("read");
            if n == 0 {
                return total;
            }
            total += n;
        }
    });
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let chunk = vec![7u8; CHUNK];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK);
        socket.write_all(&chunk[..n]).await.expect("write");
        left -= n;
    }
    socket.shutdown().await.expect("shutdown");
    assert_eq!(reader.await.expect("reader"), bytes);
}

fn rate(bytes: usize, started: Instant) -> f64 {
    bytes as f64 / 1e6 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let mib = args.first().copied().unwrap_or(256);
    let rounds = args.get(1).copied().unwrap_or(3);
    let bytes = mib << 20;
    let receiver = endpoint().await;
    let to = addr_of(&receiver);
    tokio::spawn(serve(receiver.clone()));
    let sender = endpoint().await;
    let names = ["tcp", "quic 1 stream", "quic 4 streams", "quic 4 conns"];
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for round in 1..=rounds {
        for (i, name) in names.iter().enumerate() {
            let started = Instant::now();
            match i {
                0 => tcp(bytes).await,
                1 => quic(&sender, &to, bytes, 1, 1).await,
                2 => quic(&sender, &to, bytes, 4, 1).await,
                _ => quic(&sender, &to, bytes, 4, 4).await,
            }
            let r = rate(bytes, started);
            println!("round {round}: {name:>15}: {r:7.0} MB/s");
            figures[i].push(r);
        }
    }
    println!("{mib} MiB per copy, median of {rounds} rounds:");
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let tcp_rate = median(&mut figures[0].clone());
    for (name, v) in names.iter().zip(figures.iter_mut()) {
        let m = median(v);
        println!("  {name:>15}: {m:7.0} MB/s ({:.2}x TCP)", m / tcp_rate);
    }
}
