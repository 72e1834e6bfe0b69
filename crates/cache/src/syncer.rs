//! The syncer: makes written chunks durable, then records them in the journal, in
//! batches (group commit). Shared by the mirror engine and the mount's local copy.
//!
//! A batch is committed at least every `interval`, when it grows large, and whenever
//! someone asks ([`Syncer::flush`]). Committing a batch: `fdatasync` of each file written
//! (or one `syncfs` of the cache's file system when more than 8 files are involved), then
//! the chunk and verification records in the order they were sent, then one journal sync.
//!
//! Readers first: a commit runs on the background threads ([`crate::background`]: lower CPU
//! and I/O priority); no reader ever waits for one. A gated syncer ([`Syncer::start_gated`],
//! the mirror's and the mount's) first waits, briefly and boundedly, while demand reads are in
//! flight, so its `fdatasync`/`syncfs` does not compete with them for the disk.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_proto::Version;
use tokio::sync::{mpsc, oneshot};

use crate::background::{self, DemandGate};
use crate::state::CacheDir;

/// Reports an error (the mirror counts it; the mount logs it).
pub type OnError = Arc<dyn Fn(String) + Send + Sync>;

/// Where files completed by a commit are announced (path, version, generation).
pub type Completed = mpsc::UnboundedSender<(Bytes, Version, u64)>;

/// Events for the syncer, in the order the file tasks produce them.
pub(crate) enum SyncEvent {
    /// Chunk `index` of `rel` at `version` was written to `file`, of `generation`.
    Written {
        rel: Bytes,
        version: Version,
        generation: u64,
        index: u64,
        file: Arc<File>,
    },
    /// `rel` at `version` matched the server's hash (recorded after its chunks).
    Verified {
        rel: Bytes,
        generation: u64,
        blake3: [u8; 32],
    },
    /// The verified local file of `rel`, its metadata set, shows `stamp` (recorded after
    /// its verification).
    Stamped {
        rel: Bytes,
        generation: u64,
        stamp: Version,
    },
    /// The seal of `rel` of `generation` is lifted (after everything sent before is
    /// recorded: see [`CacheDir::seal`]).
    Lift { rel: Bytes, generation: u64 },
    /// Reply once everything sent before is recorded and durable.
    Flush(oneshot::Sender<()>),
}

/// Handle to a running syncer. Dropping every handle ends it after a last commit.
#[derive(Clone)]
pub struct Syncer {
    tx: mpsc::UnboundedSender<SyncEvent>,
}

impl std::fmt::Debug for Syncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Syncer").finish()
    }
}

impl Syncer {
    /// Starts a syncer for `cache` on the current runtime. The returned task ends, with
    /// the first commit error if any, once every handle is dropped.
    pub fn start(
        cache: Arc<CacheDir>,
        interval: Duration,
        on_error: OnError,
    ) -> (Syncer, tokio::task::JoinHandle<std::io::Result<()>>) {
        Self::start_with(cache, interval, on_error, None)
    }

    /// As [`Syncer::start_with`], each commit first deferred while `gate` sees demand reads
    /// in flight ([`DemandGate::wait`]).
    pub fn start_gated(
        cache: Arc<CacheDir>,
        interval: Duration,
        on_error: OnError,
        completed: Option<Completed>,
        gate: DemandGate,
    ) -> (Syncer, tokio::task::JoinHandle<std::io::Result<()>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(syncer(cache, rx, interval, on_error, completed, gate));
        (Syncer { tx }, task)
    }

    /// As [`Syncer::start`]; files whose last chunk it records are sent to `completed`
    /// (path and version), e.g. to be verified.
    pub fn start_with(
        cache: Arc<CacheDir>,
        interval: Duration,
        on_error: OnError,
        completed: Option<Completed>,
    ) -> (Syncer, tokio::task::JoinHandle<std::io::Result<()>>) {
        Self::start_gated(cache, interval, on_error, completed, DemandGate::open())
    }

    /// Chunk `index` of `rel` at `version` was written to `file`, the local file of
    /// `generation` (from [`CacheDir::restart_file`] or [`CacheDir::open_current`]).
    pub fn written(
        &self,
        rel: Bytes,
        version: Version,
        generation: u64,
        index: u64,
        file: Arc<File>,
    ) {
        let _ = self.tx.send(SyncEvent::Written {
            rel,
            version,
            generation,
            index,
            file,
        });
    }

    /// The local file of `rel` of `generation` matched the server's hash.
    pub fn verified(&self, rel: Bytes, generation: u64, blake3: [u8; 32]) {
        let _ = self.tx.send(SyncEvent::Verified {
            rel,
            generation,
            blake3,
        });
    }

    /// The verified local file of `rel` of `generation`, its metadata set, shows `stamp`
    /// (see [`crate::state::FileState::stamp`]).
    pub fn stamped(&self, rel: Bytes, generation: u64, stamp: Version) {
        let _ = self.tx.send(SyncEvent::Stamped {
            rel,
            generation,
            stamp,
        });
    }

    /// Lifts the seal of `rel` of `generation` ([`CacheDir::seal`]) once everything sent
    /// before is recorded: readers then see every chunk written to it as held.
    pub fn lift_seal(&self, rel: Bytes, generation: u64) {
        let _ = self.tx.send(SyncEvent::Lift { rel, generation });
    }

    /// Waits until everything sent before is durable and recorded.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(SyncEvent::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// Makes written chunks durable and records them, in batches.
async fn syncer(
    cache: Arc<CacheDir>,
    mut rx: mpsc::UnboundedReceiver<SyncEvent>,
    interval: Duration,
    on_error: OnError,
    completed: Option<Completed>,
    gate: DemandGate,
) -> std::io::Result<()> {
    let mut batch: Vec<SyncEvent> = Vec::new();
    let mut first_at: Option<Instant> = None;
    let mut result = Ok(());
    loop {
        // Wait for the next event, or until the oldest queued one has waited `interval`.
        let next = match first_at {
            Some(t) => tokio::time::timeout_at((t + interval).into(), rx.recv())
                .await
                .ok(),
            None => Some(rx.recv().await),
        };
        let closed = matches!(next, Some(None));
        let due = match next {
            None => true, // the interval passed
            Some(None) => true,
            Some(Some(ev)) => {
                let flush = matches!(ev, SyncEvent::Flush(_));
                batch.push(ev);
                first_at.get_or_insert_with(Instant::now);
                if flush || batch.len() >= 1024 {
                    // Whatever else is already queued goes into the same commit.
                    while let Ok(ev) = rx.try_recv() {
                        batch.push(ev);
                    }
                    true
                } else {
                    false
                }
            }
        };
        if due {
            if !batch.is_empty() {
                gate.wait().await;
            }
            commit_batch(
                &cache,
                &mut batch,
                &on_error,
                completed.as_ref(),
                &mut result,
            )
            .await;
            first_at = None;
        }
        if closed {
            return result;
        }
    }
}

type Committed = (
    std::io::Result<()>,
    Vec<oneshot::Sender<()>>,
    Vec<(Bytes, Version, u64)>,
);

async fn commit_batch(
    cache: &Arc<CacheDir>,
    batch: &mut Vec<SyncEvent>,
    on_error: &OnError,
    completed: Option<&Completed>,
    result: &mut std::io::Result<()>,
) {
    if batch.is_empty() {
        return;
    }
    let events = std::mem::take(batch);
    let c = cache.clone();
    let r = background::run(move || -> Committed {
        // 1. Data durable: each written file, or the whole file system at once when many
        //    files are involved (many small files).
        let mut files: HashMap<*const File, Arc<File>> = HashMap::new();
        for ev in &events {
            if let SyncEvent::Written { file, .. } = ev {
                files
                    .entry(Arc::as_ptr(file))
                    .or_insert_with(|| file.clone());
            }
        }
        let synced = if files.len() > 8 {
            File::open(c.root()).and_then(|d| rustix::fs::syncfs(&d).map_err(Into::into))
        } else {
            files.values().try_for_each(|f| f.sync_data())
        };
        let mut waiters = Vec::new();
        let mut done = Vec::new();
        if let Err(e) = synced {
            for ev in events {
                match ev {
                    SyncEvent::Flush(w) => waiters.push(w),
                    // Nothing is recorded: readers' stores go on as before the seal.
                    SyncEvent::Lift { rel, generation } => c.lift_seal(&rel, generation),
                    _ => {}
                }
            }
            return (Err(e), waiters, done);
        }
        // 2. Then recorded, in order: chunks before the verification that needs them.
        for ev in events {
            match ev {
                SyncEvent::Written {
                    rel,
                    version,
                    generation,
                    index,
                    ..
                } => {
                    if c.mark_present(&rel, generation, index, 1) {
                        done.push((rel, version, generation));
                    }
                }
                SyncEvent::Verified {
                    rel,
                    generation,
                    blake3,
                } => c.mark_verified(&rel, generation, blake3),
                SyncEvent::Stamped {
                    rel,
                    generation,
                    stamp,
                } => c.mark_stamped(&rel, generation, stamp),
                SyncEvent::Lift { rel, generation } => c.lift_seal(&rel, generation),
                SyncEvent::Flush(w) => waiters.push(w),
            }
        }
        (c.commit(), waiters, done)
    })
    .await;
    match r {
        Ok((r, waiters, done)) => {
            match r {
                Ok(()) => {
                    if let Some(tx) = completed {
                        for d in done {
                            let _ = tx.send(d);
                        }
                    }
                }
                Err(e) => {
                    on_error(format!(
                        "cannot make the copy durable in {}: {e}",
                        cache.root().display()
                    ));
                    if result.is_ok() {
                        *result = Err(e);
                    }
                }
            }
            for w in waiters {
                let _ = w.send(());
            }
        }
        Err(e) => on_error(format!("sync task failed: {e}")),
    }
}
