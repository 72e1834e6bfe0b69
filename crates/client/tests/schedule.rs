//! The fetch scheduler against a real in-process ferryd: classes on the wire, background
//! reads in pieces while readers are active (same bytes, one version, no whole-file hash
//! from pieces), round-trip samples and the per-class byte counts.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use bytes::Bytes;
use ferry_client::{Client, ClientConfig};
use ferry_proto::{features, Class};

#[path = "support/server.rs"]
mod server;
use server::serve;

fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| (i * seed + i / 4093) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_reads_go_in_pieces_while_readers_are_active_and_return_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let big = pattern((3 << 20) + 777, 7);
    let small = pattern(200 << 10, 13);
    std::fs::write(dir.path().join("big"), &big).unwrap();
    std::fs::write(dir.path().join("small"), &small).unwrap();
    let (addr, _stop) = serve(dir.path()).await;
    let client = Client::connect(ClientConfig {
        addr,
        streams: 4,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_ne!(client.session().features & features::PRIORITY, 0);
    let chunk = u64::from(client.session().chunk_size);
    let bg = client.background();
    assert!(bg.is_background() && bg.class() == Class::Background);
    assert_eq!(
        client.with_class(Class::Prediction).class(),
        Class::Prediction
    );

    // No reader yet: whole chunks, and a whole small file comes with the server's hash.
    let s = client.scheduler_stats();
    assert!(!s.readers_active);
    assert_eq!(s.piece_size, chunk);
    let c = bg
        .read_chunk(Bytes::from_static(b"small"), 0, chunk as u32)
        .await
        .unwrap();
    assert_eq!(&c.data[..], &small[..]);
    assert_eq!(c.file_hash, Some(*blake3::hash(&small).as_bytes()));

    // A reader: background pieces shrink to about 1 ms of link time (how much that is
    // depends on the rate measured); reads are still whole and exact, and a whole-file
    // hash, when there is one, is the server's for exactly these bytes.
    let (d, _) = client
        .read(Bytes::from_static(b"big"), 4096, 4096)
        .await
        .unwrap();
    assert_eq!(&d[..], &big[4096..8192]);
    let s = client.scheduler_stats();
    assert!(s.readers_active, "{s:?}");
    assert!(s.piece_size <= chunk && s.piece_size >= 16 << 10, "{s:?}");
    assert!(s.base_rtt > std::time::Duration::ZERO, "{s:?}");
    for at in [0u64, 1 << 20, 2 << 20, 3 << 20] {
        let c = bg
            .read_chunk(Bytes::from_static(b"big"), at, chunk as u32)
            .await
            .unwrap();
        let end = (at + chunk).min(big.len() as u64) as usize;
        assert_eq!(&c.data[..], &big[at as usize..end], "at {at}");
        assert!(c.file_hash.is_none());
    }
    let c = bg
        .read_chunk(Bytes::from_static(b"small"), 0, chunk as u32)
        .await
        .unwrap();
    assert_eq!(&c.data[..], &small[..]);
    if let Some(h) = c.file_hash {
        assert_eq!(h, *blake3::hash(&small).as_bytes());
    }

    let s = client.scheduler_stats();
    assert_eq!(s.demand_bytes, 4096, "{s:?}");
    assert_eq!(
        s.background_bytes,
        (small.len() * 2 + big.len()) as u64,
        "{s:?}"
    );
    assert_eq!(s.prediction_bytes, 0);
    assert!(s.background_window >= s.piece_size, "{s:?}");
    assert_eq!(s.background_in_flight, 0);
}
