//! The chunk store against a real in-process ferryd on 127.0.0.1:0: single-flight
//! fetching, budget-respecting prefetch, and version handling.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::sync::Arc;

use bytes::Bytes;
use ferry_client::{ChunkBacking, ChunkStore, Client, ClientConfig, FileKey};

#[path = "support/server.rs"]
mod server;
use server::serve;

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

    // The file is rewritten on the server: a read under the old key says so, with the
    // bytes of the new version (one consistent version, for the caller to judge), and
    // nothing is cached under the old version.
    std::fs::write(dir.path().join("f"), vec![9u8; 8 << 20]).unwrap();
    match store.get(&key, 5).await {
        Err(ferry_client::ClientError::Changed(c)) => {
            assert_ne!(c.version, key.version);
            assert!(c.data.len() == 1 << 20 && c.data.iter().all(|&b| b == 9));
        }
        other => panic!("expected Changed, got {other:?}"),
    }
    assert!(!store.contains(&key, 5));
}

async fn store_over(
    dir: &std::path::Path,
    size: usize,
) -> (Client, FileKey, tokio::sync::oneshot::Sender<()>) {
    std::fs::write(dir.join("f"), pattern(size)).unwrap();
    let (addr, stop) = serve(dir).await;
    let client = Client::connect(ClientConfig {
        addr,
        streams: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let attr = client.stat(Bytes::from_static(b"f")).await.unwrap();
    let key = FileKey {
        id: 1,
        version: attr.version(),
        path: Bytes::from_static(b"f"),
    };
    (client, key, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_recently_used_leaves_first_and_consumed_or_invalidated_leave_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (client, key, _stop) = store_over(dir.path(), 8 << 20).await;
    let store = ChunkStore::new(client, 3 << 20);
    for i in 0..3 {
        store.get(&key, i).await.unwrap();
    }
    store.get(&key, 0).await.unwrap(); // 0 is now more recent than 1
    store.get(&key, 3).await.unwrap();
    assert!(store.contains(&key, 0));
    assert!(!store.contains(&key, 1), "the least recently used left");
    assert!(store.contains(&key, 2) && store.contains(&key, 3));
    assert_eq!(store.stats().evicted, 1);
    assert!(store.used() <= 3 << 20);

    store.consumed(&key, 2);
    assert!(!store.held(&key, 2));
    assert_eq!(store.used(), 2 << 20);
    store.invalidate(key.id);
    assert_eq!(store.used(), 0);
    assert!(!store.contains(&key, 0) && !store.contains(&key, 3));
    assert_eq!(
        store.stats().evicted,
        1,
        "consumed and invalidated are not evictions"
    );
}

/// A local copy whose disk is held up until the test lets each write go.
struct SlowDisk {
    go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    stored: std::sync::Mutex<Vec<u64>>,
}

impl ChunkBacking for SlowDisk {
    fn load(&self, _: &FileKey, _: u64, _: usize, _: std::ops::Range<usize>) -> Option<Bytes> {
        None
    }
    fn store(&self, _: &FileKey, index: u64, _: &Bytes) {
        let _ = self.go.lock().unwrap().recv();
        self.stored.lock().unwrap().push(index);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_local_copy_skips_chunks_rather_than_queue_them_without_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (client, key, _stop) = store_over(dir.path(), 8 << 20).await;
    let (go, rx) = std::sync::mpsc::channel();
    let disk = Arc::new(SlowDisk {
        go: std::sync::Mutex::new(rx),
        stored: std::sync::Mutex::new(Vec::new()),
    });
    // A budget of 4 MiB: the write-back queue holds a quarter of it, one chunk.
    let store =
        ChunkStore::with_backing(client, 4 << 20, Some(disk.clone() as Arc<dyn ChunkBacking>));
    for i in 0..4 {
        store.get(&key, i).await.unwrap();
        assert!(store.stats().store_queued_bytes <= 1 << 20);
    }
    let st = store.stats();
    assert_eq!(st.fetched, 4);
    assert_eq!(st.store_skipped, 3, "one chunk queued, the others skipped");
    go.send(()).unwrap();
    let s = store.clone();
    tokio::task::spawn_blocking(move || s.flush())
        .await
        .unwrap();
    assert_eq!(*disk.stored.lock().unwrap(), [0]);
    assert_eq!(store.stats().store_queued_bytes, 0);
}

/// A local copy in memory that holds some chunks and records what it was asked.
struct Held {
    chunks: std::collections::HashMap<u64, Vec<u8>>,
    loads: std::sync::Mutex<Vec<(u64, std::ops::Range<usize>)>>,
}

impl ChunkBacking for Held {
    fn load(
        &self,
        _: &FileKey,
        index: u64,
        len: usize,
        range: std::ops::Range<usize>,
    ) -> Option<Bytes> {
        self.loads.lock().unwrap().push((index, range.clone()));
        let c = self.chunks.get(&index)?;
        assert_eq!(c.len(), len);
        Some(Bytes::copy_from_slice(&c[range]))
    }
    fn may_hold(&self, _: &FileKey, index: u64) -> bool {
        self.chunks.contains_key(&index)
    }
    fn store(&self, _: &FileKey, _: u64, _: &Bytes) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_read_takes_only_its_bytes_from_the_local_copy_and_skips_it_when_absent() {
    let dir = tempfile::tempdir().unwrap();
    let (client, key, _stop) = store_over(dir.path(), 4 << 20).await;
    let data = pattern(4 << 20);
    let disk = Arc::new(Held {
        chunks: [(1, data[1 << 20..2 << 20].to_vec())].into(),
        loads: std::sync::Mutex::new(Vec::new()),
    });
    let store = ChunkStore::with_backing(
        client,
        16 << 20,
        Some(disk.clone() as Arc<dyn ChunkBacking>),
    );
    // 16 KiB inside the held chunk: exactly those bytes are loaded from the local copy.
    let at = (1 << 20) + 4096;
    let got = store.read_range(&key, at, at + (16 << 10)).await.unwrap();
    assert_eq!(&got[..], &data[at as usize..at as usize + (16 << 10)]);
    assert_eq!(*disk.loads.lock().unwrap(), [(1, 4096..4096 + (16 << 10))]);
    // Across the held chunk's end into one it lacks: the local copy is not asked at all,
    // the network answers.
    let at = (2 << 20) - 4096;
    let got = store.read_range(&key, at, at + 8192).await.unwrap();
    assert_eq!(&got[..], &data[at as usize..at as usize + 8192]);
    let at = 3 << 20;
    let got = store.read_range(&key, at, at + 4096).await.unwrap();
    assert_eq!(&got[..], &data[at as usize..at as usize + 4096]);
    assert_eq!(
        disk.loads.lock().unwrap().len(),
        1,
        "absent chunks are never loaded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_chunk_read_to_its_end_is_read_lately_for_that_version_only() {
    let dir = tempfile::tempdir().unwrap();
    let (client, key, _stop) = store_over(dir.path(), 5000).await;
    let store = ChunkStore::new(client, 8 << 20);
    assert!(!store.read_lately(&key));
    store.get(&key, 0).await.unwrap();
    assert!(!store.read_lately(&key), "fetched is not read");
    store.consumed(&key, 0);
    assert!(store.read_lately(&key));
    assert!(!store.held(&key, 0), "a consumed chunk leaves the store");
    // Another version of the file (changed since) is not.
    let mut other = key.clone();
    other.version.size += 1;
    assert!(!store.read_lately(&other));
    // Nor another chunk's reading.
    let next = FileKey { id: 2, ..key };
    store.consumed(&next, 1);
    assert!(!store.read_lately(&next));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_own_chunks_started_ahead_of_its_wait_go_as_its_class_and_prefetches_as_prediction(
) {
    let dir = tempfile::tempdir().unwrap();
    let (client, key, _stop) = store_over(dir.path(), 4 << 20).await;
    let data = pattern(4 << 20);
    let store = ChunkStore::new(client.clone(), 64 << 20);
    let before = client.scheduler_stats();
    // A reader's own chunk, put in flight before it waits (as the mount's reads do): a
    // reader waits for it, so it goes as the client's class (demand), not as a prediction
    // behind the reader's own read-ahead. Each fetch is let finish before the read, which
    // would otherwise run it itself, as demand, if it came first.
    store.start(&key, 1);
    wait_held(&store, &key, 1).await;
    assert_eq!(
        &store.get(&key, 1).await.unwrap()[..],
        &data[1 << 20..2 << 20]
    );
    let after = client.scheduler_stats();
    assert_eq!(after.demand_bytes - before.demand_bytes, 1 << 20);
    assert_eq!(after.prediction_bytes, before.prediction_bytes);
    // Read-ahead stays a prediction.
    assert!(store.prefetch(&key, 2));
    wait_held(&store, &key, 2).await;
    assert_eq!(
        &store.get(&key, 2).await.unwrap()[..],
        &data[2 << 20..3 << 20]
    );
    let last = client.scheduler_stats();
    assert_eq!(last.prediction_bytes - after.prediction_bytes, 1 << 20);
    assert_eq!(last.demand_bytes, after.demand_bytes);
}

/// Waits (at most 5 s) until chunk `index` of `key` is present in `store`.
async fn wait_held(store: &ChunkStore, key: &FileKey, index: u64) {
    for _ in 0..500 {
        if store.contains(key, index) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("chunk {index} never arrived");
}
