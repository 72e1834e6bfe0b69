//! The pool against a real in-process ferryd that goes away and comes back: requests wait
//! and then succeed on reconnected streams; a server that stays away gives a clear error
//! after the request timeout.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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
    all_streams_open(
        &client,
        4,
        Duration::from_secs(10),
        "every stream came back",
    )
    .await;
}

/// Waits up to `within` for `client` to have `n` streams open, and asserts it has.
async fn all_streams_open(client: &Client, n: usize, within: Duration, what: &str) {
    let t = Instant::now();
    while client.live_streams() < n && t.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(client.live_streams(), n, "{what}");
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
    // The pool starts on its first stream and the others join as they open: with all four
    // open, the reads below can spread (on a busy machine they could all be done before the
    // second stream joined).
    all_streams_open(
        &client,
        4,
        Duration::from_secs(10),
        "all four streams opened",
    )
    .await;
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

/// Rewrites the frames going down: takes one (kind, request id, body; without its length)
/// and returns the frames to send in its place.
type Rewrite = Box<dyn FnMut(Vec<u8>) -> Vec<Vec<u8>> + Send>;

/// Relays `upstream` on a fresh loopback port, passing every frame the server sends (over
/// all connections, in order) through `rewrite`.
async fn rewriting_proxy(upstream: std::net::SocketAddr, rewrite: Rewrite) -> String {
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let rewrite = Arc::new(Mutex::new(rewrite));
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
            let rewrite = rewrite.clone();
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
                    let out = (rewrite.lock().unwrap())(frame);
                    for f in out {
                        if down_wr.write_u32(f.len() as u32).await.is_err()
                            || down_wr.write_all(&f).await.is_err()
                        {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// The first `n` frames of `kind` get an unknown message kind, as a flipped bit in a frame
/// header on the way would give them; the counter says how many were garbled.
fn garble_kind(kind: u8, n: usize) -> (Rewrite, Arc<AtomicUsize>) {
    let garbled = Arc::new(AtomicUsize::new(0));
    let count = garbled.clone();
    let rewrite: Rewrite = Box::new(move |mut f| {
        if f[0] == kind && count.load(Ordering::SeqCst) < n {
            count.fetch_add(1, Ordering::SeqCst);
            f[0] = kind ^ 0x10;
        }
        vec![f]
    });
    (rewrite, garbled)
}

/// The first two frames of `kind` are sent with each other's request ids, as flipped bits
/// in their ids would give them (the first waits for the second).
fn swap_ids(kind: u8) -> Rewrite {
    let mut held: Option<Vec<u8>> = None;
    let mut done = false;
    Box::new(move |mut f| {
        if f[0] != kind || done {
            return vec![f];
        }
        match held.take() {
            None => {
                held = Some(f);
                vec![]
            }
            Some(mut first) => {
                done = true;
                let id = first[1..5].to_vec();
                first[1..5].copy_from_slice(&f[1..5]);
                f[1..5].copy_from_slice(&id);
                vec![first, f]
            }
        }
    })
}

/// A client of `streams` streams to an in-process ferryd serving `dir` behind a
/// [`rewriting_proxy`]; the server stops when the returned sender is dropped.
async fn client_behind(
    dir: &std::path::Path,
    rewrite: Rewrite,
    streams: usize,
) -> (Client, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    let (stop, _task) = serve_on(listener, dir);
    let addr = rewriting_proxy(server, rewrite).await;
    let client = Client::connect(ClientConfig {
        addr,
        streams,
        ..Default::default()
    })
    .await
    .unwrap();
    (client, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_garbled_on_the_way_is_asked_again_and_one_that_keeps_coming_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(2 << 20))
        .map(|i: usize| (i * 13 + i / 777) as u8)
        .collect();
    std::fs::write(dir.path().join("f"), &data).unwrap();

    // Twice garbled: the third answer is read.
    let (rewrite, garbled) = garble_kind(0x93, 2);
    let (client, _stop) = client_behind(dir.path(), rewrite, 2).await;
    let (d, _) = client
        .read(Bytes::from_static(b"f"), 1 << 20, 1 << 20)
        .await
        .unwrap();
    assert_eq!(&d[..], &data[1 << 20..]);
    assert_eq!(garbled.load(Ordering::SeqCst), 2);
    // Each garbled answer asked again (and maybe more: a retry can meet the closing stream).
    assert!(client.counters().retries.load(Ordering::Relaxed) >= 2);

    // Garbled every time: a protocol error after a bounded number of tries, not a loop.
    let (rewrite, garbled) = garble_kind(0x93, usize::MAX);
    let (client, _stop) = client_behind(dir.path(), rewrite, 2).await;
    let err = client
        .read(Bytes::from_static(b"f"), 0, 4096)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Decode(_)), "{err}");
    assert_eq!(
        garbled.load(Ordering::SeqCst),
        ferry_client::pool::UNDECODABLE_TRIES as usize
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_responses_whose_request_ids_were_garbled_into_each_other_are_refetched_not_returned()
{
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(2 << 20))
        .map(|i: usize| (i * 17 + i / 991) as u8)
        .collect();
    std::fs::write(dir.path().join("f"), &data).unwrap();
    // One stream: both reads wait on it when their answers come, each under the other's id.
    let (client, _stop) = client_behind(dir.path(), swap_ids(0x93), 1).await;
    let f = Bytes::from_static(b"f");
    let (a, b) = tokio::join!(
        client.read(f.clone(), 0, 64 << 10),
        client.read(f.clone(), 1 << 20, 64 << 10)
    );
    assert!(a.unwrap().0[..] == data[..64 << 10], "wrong bytes at 0");
    assert!(
        b.unwrap().0[..] == data[1 << 20..(1 << 20) + (64 << 10)],
        "wrong bytes at 1 MiB"
    );
    assert!(client.counters().checksum_failures.load(Ordering::Relaxed) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_whose_request_ids_were_garbled_into_each_other_are_refetched_not_returned() {
    let dir = tempfile::tempdir().unwrap();
    for d in ["a", "b"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
        for i in 0..3 {
            std::fs::write(
                dir.path().join(d).join(format!("{d}{i}")),
                format!("{d}{i}\n"),
            )
            .unwrap();
        }
    }
    let (client, _stop) = client_behind(dir.path(), swap_ids(0x97), 1).await;
    let (a, b) = tokio::join!(
        client.read_dir_data(Bytes::from_static(b"a"), 0, 100, 4096),
        client.read_dir_data(Bytes::from_static(b"b"), 0, 100, 4096)
    );
    for (d, listed) in [("a", a.unwrap().0), ("b", b.unwrap().0)] {
        let mut names: Vec<_> = listed
            .iter()
            .map(|l| {
                let name = String::from_utf8(l.entry.name.to_vec()).unwrap();
                let data = l.data.as_ref().expect("contents came along");
                assert_eq!(&data.data[..], format!("{name}\n").as_bytes());
                name
            })
            .collect();
        names.sort();
        assert_eq!(
            names,
            [0, 1, 2].map(|i| format!("{d}{i}")),
            "listing of {d}"
        );
    }
    assert!(client.counters().checksum_failures.load(Ordering::Relaxed) >= 2);
}

/// What [`gate_proxy`] does with every connection but the first until it is released.
#[derive(Clone, Copy)]
enum Gate {
    /// Accepts it and relays nothing (as a handshake stuck in the queue of a full link).
    Hold,
    /// Closes it at once.
    Close,
}

/// Relays `upstream` on a fresh loopback port: the first connection at once, the others as
/// `gate` says until `open` turns true, then all of them.
async fn gate_proxy(
    upstream: std::net::SocketAddr,
    gate: Gate,
    open: tokio::sync::watch::Receiver<bool>,
) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut first = true;
        loop {
            let Ok((mut down, _)) = listener.accept().await else {
                return;
            };
            let gated = !std::mem::take(&mut first) && !*open.borrow();
            let mut open = open.clone();
            tokio::spawn(async move {
                if gated {
                    match gate {
                        Gate::Hold => {
                            let _ = open.wait_for(|o| *o).await;
                        }
                        Gate::Close => return,
                    }
                }
                let mut up = tokio::net::TcpStream::connect(upstream).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
            });
        }
    });
    addr
}

/// A client of 4 streams through [`gate_proxy`]: it must be usable on its first stream
/// alone, and have all 4 once the gate opens.
async fn starts_on_first_stream(gate: Gate) {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(2 << 20))
        .map(|i: usize| (i * 13 + i / 777) as u8)
        .collect();
    std::fs::write(dir.path().join("f"), &data).unwrap();
    let (server, _stop) = server::serve(dir.path()).await;
    let (open, gate_rx) = tokio::sync::watch::channel(false);
    let addr = gate_proxy(server.parse().unwrap(), gate, gate_rx).await;
    let connect = Client::connect(ClientConfig {
        addr,
        streams: 4,
        connect_timeout: Duration::from_secs(60),
        ..Default::default()
    });
    let client = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .expect("connect waited for streams that could not open yet")
        .unwrap();
    assert_eq!(client.live_streams(), 1);
    let (got, _) = client
        .read(Bytes::from_static(b"f"), 0, 1 << 20)
        .await
        .unwrap();
    assert_eq!(&got[..], &data[..1 << 20]);

    open.send(true).unwrap();
    all_streams_open(
        &client,
        4,
        Duration::from_secs(15),
        "the other streams joined",
    )
    .await;
    let (got, _) = client
        .read(Bytes::from_static(b"f"), 1 << 20, 1 << 20)
        .await
        .unwrap();
    assert_eq!(&got[..], &data[1 << 20..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_starts_on_its_first_stream_and_the_slow_ones_join_as_they_open() {
    starts_on_first_stream(Gate::Hold).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_fail_to_open_at_first_are_opened_later() {
    starts_on_first_stream(Gate::Close).await;
}
