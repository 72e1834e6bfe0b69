//! The pool against a real in-process ferryd that goes away and comes back: requests wait
//! and then succeed on reconnected streams; a server that stays away gives a clear error
//! after the request timeout.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::{Client, ClientConfig, ClientError};

#[path = "support/server.rs"]
mod server;
use server::serve_on;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_for_a_restarted_server_and_then_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(3 << 20))
        .map(|i: usize| (i * 31 + i / 999) as u8)
        .collect();
    std::fs::write(dir.path().join("f"), &data).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, task) = serve_on(listener, dir.path());
    let client = Client::connect(ClientConfig {
        addr: addr.to_string(),
        streams: 4,
        request_timeout: Duration::from_secs(20),
        ..Default::default()
    })
    .await
    .unwrap();
    let (first, _) = client
        .read(Bytes::from_static(b"f"), 0, 1 << 20)
        .await
        .unwrap();
    assert_eq!(&first[..], &data[..1 << 20]);

    // The server goes away (all streams close) and comes back on the same port.
    stop.send(()).unwrap();
    task.await.unwrap();
    let reader = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .read(Bytes::from_static(b"f"), 2 << 20, 1 << 20)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!reader.is_finished(), "the read waits for the server");
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (_stop2, _task2) = serve_on(listener, dir.path());
    let (third, _) = reader.await.unwrap().unwrap();
    assert_eq!(&third[..], &data[2 << 20..3 << 20]);

    let c = client.counters();
    assert!(c.reconnects.load(Ordering::Relaxed) >= 1);
    assert_eq!(c.server_restarts.load(Ordering::Relaxed), 1);
    // Every stream comes back.
    let t = Instant::now();
    while client.live_streams() < 4 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(client.live_streams(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stays_away_gives_a_clear_error_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"hello").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, task) = serve_on(listener, dir.path());
    let client = Client::connect(ClientConfig {
        addr: addr.to_string(),
        streams: 2,
        request_timeout: Duration::from_secs(2),
        ..Default::default()
    })
    .await
    .unwrap();
    stop.send(()).unwrap();
    task.await.unwrap();
    let t = Instant::now();
    let err = client.stat(Bytes::from_static(b"f")).await.unwrap_err();
    let waited = t.elapsed();
    assert!(matches!(err, ClientError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains("no connection for 2 s"), "{err}");
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(6),
        "{waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_reads_keep_to_one_chunk_per_stream_and_readers_get_through() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(16 << 20))
        .map(|i: usize| (i * 7 + i / 4099) as u8)
        .collect();
    std::fs::write(dir.path().join("f"), &data).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_stop, _task) = serve_on(listener, dir.path());
    let client = Client::connect(ClientConfig {
        addr: addr.to_string(),
        streams: 4,
        ..Default::default()
    })
    .await
    .unwrap();
    let chunk = u64::from(client.session().chunk_size);
    let bg = client.background();
    let tasks: Vec<_> = (0..64u64)
        .map(|i| {
            let bg = bg.clone();
            tokio::spawn(async move {
                bg.read(Bytes::from_static(b"f"), (i % 16) << 20, 1 << 20)
                    .await
                    .unwrap()
            })
        })
        .collect();
    // While they run: never more than one chunk of background bytes on any stream, and a
    // foreground read is answered.
    let mut most_streams_busy = 0;
    let fg = {
        let client = client.clone();
        tokio::spawn(async move { client.read(Bytes::from_static(b"f"), 5 << 20, 4096).await })
    };
    while tasks.iter().any(|t| !t.is_finished()) {
        let per_stream = bg.background_in_flight();
        assert!(per_stream.iter().all(|&b| b <= chunk), "{per_stream:?}");
        most_streams_busy = most_streams_busy.max(per_stream.iter().filter(|&&b| b > 0).count());
        tokio::task::yield_now().await;
    }
    assert!(
        most_streams_busy >= 2,
        "background work used {most_streams_busy} stream(s)"
    );
    let (d, _) = fg.await.unwrap().unwrap();
    assert_eq!(&d[..], &data[5 << 20..(5 << 20) + 4096]);
    for (i, t) in tasks.into_iter().enumerate() {
        let (d, _) = t.await.unwrap();
        let off = (i % 16) << 20;
        assert_eq!(&d[..], &data[off..off + (1 << 20)]);
    }
}

/// Relays `upstream` on a fresh loopback port; the first `garble` Read responses going
/// down (over all connections) get an unknown message kind, as a flipped bit in a frame
/// header on the way would give them.
async fn garbling_proxy(upstream: std::net::SocketAddr, garble: usize) -> String {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let left = Arc::new(AtomicUsize::new(garble));
    tokio::spawn(async move {
        loop {
            let Ok((down, _)) = listener.accept().await else {
                return;
            };
            let up = tokio::net::TcpStream::connect(upstream).await.unwrap();
            let (mut down_rd, mut down_wr) = down.into_split();
            let (mut up_rd, mut up_wr) = up.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut down_rd, &mut up_wr).await;
            });
            let left = left.clone();
            tokio::spawn(async move {
                // The server's preamble, then frames: length u32 (of kind, id and body),
                // kind u8, id u32, body.
                let mut preamble = [0u8; ferry_proto::preamble::PREAMBLE_LEN];
                if up_rd.read_exact(&mut preamble).await.is_err()
                    || down_wr.write_all(&preamble).await.is_err()
                {
                    return;
                }
                loop {
                    let Ok(len) = up_rd.read_u32().await else {
                        return;
                    };
                    let mut frame = vec![0u8; len as usize];
                    if up_rd.read_exact(&mut frame).await.is_err() {
                        return;
                    }
                    // 0x93: a Read response.
                    if frame[0] == 0x93
                        && left
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok()
                    {
                        frame[0] = 0x83;
                    }
                    if down_wr.write_u32(len).await.is_err()
                        || down_wr.write_all(&frame).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_garbled_on_the_way_is_asked_again_and_one_that_keeps_coming_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(2 << 20))
        .map(|i: usize| (i * 13 + i / 777) as u8)
        .collect();
    std::fs::write(dir.path().join("f"), &data).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    let (_stop, _task) = serve_on(listener, dir.path());

    // Twice garbled: the third answer is read.
    let addr = garbling_proxy(server, 2).await;
    let client = Client::connect(ClientConfig {
        addr,
        streams: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let (d, _) = client
        .read(Bytes::from_static(b"f"), 1 << 20, 1 << 20)
        .await
        .unwrap();
    assert_eq!(&d[..], &data[1 << 20..]);
    assert_eq!(client.counters().retries.load(Ordering::Relaxed), 2);

    // Garbled every time: a protocol error after a bounded number of tries, not a loop.
    let addr = garbling_proxy(server, usize::MAX).await;
    let client = Client::connect(ClientConfig {
        addr,
        streams: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let err = client
        .read(Bytes::from_static(b"f"), 0, 4096)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Decode(_)), "{err}");
    assert_eq!(
        client.counters().retries.load(Ordering::Relaxed),
        u64::from(ferry_client::pool::UNDECODABLE_TRIES - 1)
    );
}
