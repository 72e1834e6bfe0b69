//! The chunk store against a real in-process ferryd on 127.0.0.1:0: single-flight
//! fetching, budget-respecting prefetch, and version handling.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::sync::Arc;

use bytes::Bytes;
use ferry_client::{ChunkStore, Client, ClientConfig, FileKey};

async fn serve(dir: &std::path::Path) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let config = ferry_server::ServerConfig {
        export: dir.to_path_buf(),
        ..Default::default()
    };
    tokio::spawn(async move {
        ferry_server::run(listener, config, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (addr, tx)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_readers_of_one_chunk_fetch_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(3 << 20);
    std::fs::write(dir.path().join("f"), &data).unwrap();
    let (addr, _stop) = serve(dir.path()).await;
    let client = Client::connect(ClientConfig {
        addr,
        streams: 4,
        ..Default::default()
    })
    .await
    .unwrap();
    let attr = client.stat(Bytes::from_static(b"f")).await.unwrap();
    let store = ChunkStore::new(client.clone(), 64 << 20);
    let key = FileKey {
        id: 1,
        version: attr.version(),
        path: Bytes::from_static(b"f"),
    };
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            let key = key.clone();
            tokio::spawn(async move { store.get(&key, 1).await.unwrap() })
        })
        .collect();
    for t in tasks {
        assert_eq!(&t.await.unwrap()[..], &data[1 << 20..2 << 20]);
    }
    assert_eq!(store.stats().fetched, 1, "one fetch for eight readers");
    // The last chunk is short; past the end is empty without asking the server.
    assert_eq!(store.get(&key, 2).await.unwrap().len(), 1 << 20);
    assert!(store.get(&key, 3).await.unwrap().is_empty());
    assert_eq!(store.stats().fetched, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_stops_at_the_budget_and_changed_files_are_not_cached() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), pattern(8 << 20)).unwrap();
    let (addr, _stop) = serve(dir.path()).await;
    let client = Client::connect(ClientConfig {
        addr,
        streams: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let attr = client.stat(Bytes::from_static(b"f")).await.unwrap();
    // Room for three chunks.
    let store: Arc<ChunkStore> = ChunkStore::new(client.clone(), 3 << 20);
    let key = FileKey {
        id: 1,
        version: attr.version(),
        path: Bytes::from_static(b"f"),
    };
    let started: Vec<bool> = (0..8).map(|i| store.prefetch(&key, i)).collect();
    assert_eq!(
        started,
        [true, true, true, false, false, false, false, false]
    );
    assert!(store.used() <= 3 << 20);

    // The file is replaced on the server: reads under the old key still return one
    // consistent version (the new one), but it is not cached under the old version.
    std::fs::write(dir.path().join("f"), vec![9u8; 8 << 20]).unwrap();
    let got = store.get(&key, 5).await.unwrap();
    assert!(got.iter().all(|&b| b == 9));
    assert!(!store.contains(&key, 5));
}
