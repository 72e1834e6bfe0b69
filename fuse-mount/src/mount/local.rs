//! The mount's local copy (`cache_dir`): the cache directory opened and locked before
//! mounting, the syncer that records what reads store into it, and the verification of
//! files that reads complete (after which their opens use FUSE passthrough).
//!
//! Invariants: the directory is opened before anything is mounted, so a bad or busy one
//! is a one-line error and nothing is mounted; at unmount the syncer is flushed before the
//! process ends, so every chunk written is recorded and a remount reads it locally.

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_cache::{CacheDir, LocalCopy, StateBase, Syncer};
use ferry_client::Client;
use tracing::{info, warn};

use super::MountError;

/// How often written chunks are made durable and recorded.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// A mount's local copy and the tasks that keep its state.
pub(crate) struct Local {
    /// Read through by the file system ([`ferry_client::ChunkBacking`]).
    pub(crate) copy: Arc<LocalCopy>,
    syncer: Syncer,
    /// The syncer's task; ends once every [`Syncer`] handle is dropped.
    _sync_task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Local {
    /// Opens (and locks) `dir` and starts the syncer and the verification of completed
    /// files on `rt`. Files left complete but unverified by an earlier mount (a crash, an
    /// unmount before their check) are verified too.
    ///
    /// # Errors
    /// The directory cannot be created, read or locked.
    pub(crate) fn open(
        rt: &tokio::runtime::Handle,
        dir: &Path,
        state: &StateBase,
        client: &Client,
        root: Bytes,
        chunk_size: u32,
    ) -> Result<Local, MountError> {
        let cache = Arc::new(CacheDir::open(dir, state)?);
        let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel();
        for (rel, st) in cache.all() {
            if st.complete() && st.verified.is_none() {
                let _ = done_tx.send((rel, st.version, st.generation));
            }
        }
        let (syncer, sync_task) = {
            let _rt = rt.enter();
            // Its syncs wait (boundedly) while demand reads are in flight.
            Syncer::start_gated(
                cache.clone(),
                SYNC_INTERVAL,
                Arc::new(|m| warn!("{m}")),
                Some(done_tx),
                ferry_cache::background::DemandGate::client(client),
            )
        };
        let copy = Arc::new(LocalCopy::new(cache, root, chunk_size, syncer.clone()));
        // Files completed through the mount are verified, then opened with passthrough.
        rt.spawn(copy.clone().verify_completed(client.background(), done_rx));
        info!(
            "local copy in {}, its state in {}",
            dir.display(),
            copy.cache().meta().display()
        );
        Ok(Local {
            copy,
            syncer,
            _sync_task: sync_task,
        })
    }

    /// Records everything written (flushes the syncer) and logs the copy's counters;
    /// `passthrough_opens` comes from the file system.
    pub(crate) async fn close(self, passthrough_opens: u64) {
        self.syncer.flush().await;
        let c = &self.copy;
        info!(
            "local copy: {} chunks served locally, {} stored, {} store errors, {} files verified, {} mismatches, {} passthrough opens",
            c.served.load(Relaxed),
            c.stored.load(Relaxed),
            c.store_errors.load(Relaxed),
            c.verified.load(Relaxed),
            c.mismatches.load(Relaxed),
            passthrough_opens
        );
    }
}
