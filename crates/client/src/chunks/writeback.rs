//! The write-back queue between the chunk store and its local copy: whole chunks fetched
//! from the network wait here for a writer thread to hand them to
//! [`ChunkBacking::store`] (blocking disk I/O), so readers never wait for the disk.
//!
//! Invariants:
//! - The bytes of the chunks queued plus those being written never exceed the budget. A
//!   chunk that does not fit is not stored (counted in `skipped`): the disk is slower than
//!   the network, and the chunk will be fetched again by the next read or the mirror.
//!   Memory is a budget, not a hope.
//! - A fixed number of named writer threads (`ferry-store-N`) drain the queue in order.
//!   When the queue is dropped they finish what is queued, then exit. They run at lower CPU
//!   and I/O priority ([`ferry_util::lower_current_thread`]): storing is background work, and
//!   the readers whose chunks they store have their bytes already.
//! - [`WriteBack::flush`] returns once every chunk offered before it has been handed to the
//!   backing (which records it through its own syncer).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use bytes::Bytes;

use super::{ChunkBacking, FileKey};

/// Writer threads draining the queue: enough to overlap two writes, few enough to leave
/// the disk's queue to the mirror.
pub(crate) const WRITERS: usize = 2;

struct Job {
    key: FileKey,
    index: u64,
    data: Bytes,
    /// What it counts against the queue's budget.
    weight: usize,
}

/// What a chunk of zeros from a data map weighs in the queue: it is written as a hole (a
/// punch, no data), so it costs the disk little.
pub(crate) const HOLE_WEIGHT: usize = 4096;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Bytes of the chunks queued or being written.
    bytes: usize,
    closed: bool,
}

struct Shared {
    backing: Arc<dyn ChunkBacking>,
    budget: usize,
    queue: Mutex<Queue>,
    /// Signalled when a job is queued or the queue closes.
    work: Condvar,
    /// Signalled when `bytes` drops to zero.
    idle: Condvar,
    skipped: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A byte-bounded queue of chunks to store, drained by writer threads.
pub(crate) struct WriteBack {
    shared: Arc<Shared>,
}

impl WriteBack {
    /// Starts `writers` threads storing into `backing`, with at most `budget` bytes queued
    /// or being written.
    pub(crate) fn start(backing: Arc<dyn ChunkBacking>, budget: usize, writers: usize) -> Self {
        let shared = Arc::new(Shared {
            backing,
            budget,
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            skipped: AtomicU64::new(0),
        });
        for n in 0..writers.max(1) {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("ferry-store-{n}"))
                .spawn(move || {
                    ferry_util::lower_current_thread();
                    writer(&s)
                });
            if let Err(e) = spawned {
                // With no writer the queue fills up and chunks are skipped: reads go on.
                tracing::warn!("cannot start a local-copy writer thread: {e}");
            }
        }
        WriteBack { shared }
    }

    /// Queues chunk `index` of `key` for storing. Returns false, and counts a skip, when it
    /// does not fit in the budget.
    pub(crate) fn offer(&self, key: FileKey, index: u64, data: Bytes, weight: usize) -> bool {
        let s = &self.shared;
        let mut q = s.lock();
        if q.bytes + weight > s.budget {
            drop(q);
            s.skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        q.bytes += weight;
        q.jobs.push_back(Job {
            key,
            index,
            data,
            weight,
        });
        drop(q);
        s.work.notify_one();
        true
    }

    /// Blocks until every chunk queued so far has been handed to the backing.
    pub(crate) fn flush(&self) {
        let s = &self.shared;
        let mut q = s.lock();
        while q.bytes > 0 {
            q = s.idle.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Bytes queued or being written.
    pub(crate) fn queued(&self) -> usize {
        self.shared.lock().bytes
    }

    /// Chunks not stored because the queue was full.
    pub(crate) fn skipped(&self) -> u64 {
        self.shared.skipped.load(Ordering::Relaxed)
    }
}

impl Drop for WriteBack {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.work.notify_all();
    }
}

/// One writer thread: takes the oldest job, stores it, releases its bytes; exits when the
/// queue is closed and empty.
fn writer(s: &Shared) {
    loop {
        let job = {
            let mut q = s.lock();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    break job;
                }
                if q.closed {
                    return;
                }
                q = s.work.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let stored = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.backing.store(&job.key, job.index, &job.data);
        }));
        if stored.is_err() {
            // The chunk is simply not stored; the queue must keep draining.
            tracing::error!(
                "storing chunk {} of /{} in the local copy panicked",
                job.index,
                String::from_utf8_lossy(&job.key.path)
            );
        }
        let mut q = s.lock();
        q.bytes -= job.weight;
        if q.bytes == 0 {
            s.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::{Timestamp, Version};
    use std::sync::mpsc;

    /// A backing whose `store` waits for a go-ahead per chunk (a disk slower than the
    /// network), recording what it stored.
    struct Gated {
        go: Mutex<mpsc::Receiver<()>>,
        stored: Mutex<Vec<u64>>,
    }

    impl ChunkBacking for Gated {
        fn load(&self, _: &FileKey, _: u64, _: usize, _: std::ops::Range<usize>) -> Option<Bytes> {
            None
        }
        fn store(&self, _: &FileKey, index: u64, _: &Bytes) {
            let _ = self.go.lock().unwrap_or_else(|e| e.into_inner()).recv();
            self.stored
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(index);
        }
    }

    fn key() -> FileKey {
        FileKey {
            id: 1,
            version: Version {
                ino: 1,
                size: 1 << 20,
                mtime: Timestamp { sec: 1, nsec: 0 },
                ctime: Timestamp { sec: 1, nsec: 0 },
                btime: Timestamp::default(),
            },
            path: Bytes::from_static(b"f"),
        }
    }

    #[test]
    fn a_full_queue_skips_and_never_exceeds_its_budget() {
        let (go, rx) = mpsc::channel();
        let backing = Arc::new(Gated {
            go: Mutex::new(rx),
            stored: Mutex::new(Vec::new()),
        });
        // Room for three chunks of 100 bytes; one writer, held up by the disk.
        let wb = WriteBack::start(backing.clone(), 350, 1);
        let mut accepted = Vec::new();
        for i in 0..10 {
            if wb.offer(key(), i, Bytes::from(vec![0u8; 100]), 100) {
                accepted.push(i);
            }
            assert!(wb.queued() <= 350);
        }
        // The chunk being written still counts: nothing left the queue.
        assert_eq!(accepted, [0, 1, 2]);
        assert_eq!(wb.skipped(), 7);
        for _ in 0..3 {
            go.send(()).unwrap();
        }
        wb.flush();
        assert_eq!(wb.queued(), 0);
        // Room again once written.
        assert!(wb.offer(key(), 20, Bytes::from(vec![0u8; 100]), 100));
        go.send(()).unwrap();
        wb.flush();
        let stored = backing.stored.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(*stored, [0, 1, 2, 20]);
    }

    #[test]
    fn a_chunk_larger_than_the_budget_is_skipped() {
        let (_go, rx) = mpsc::channel();
        let backing = Arc::new(Gated {
            go: Mutex::new(rx),
            stored: Mutex::new(Vec::new()),
        });
        let wb = WriteBack::start(backing, 50, 2);
        assert!(!wb.offer(key(), 0, Bytes::from(vec![0u8; 51]), 51));
        assert_eq!(wb.skipped(), 1);
        wb.flush();
    }
}
