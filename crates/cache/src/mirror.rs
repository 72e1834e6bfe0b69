//! The mirror engine: walks the export and fills the cache directory with a complete,
//! verified copy, fetching many files and many chunks of big files at once.
//!
//! - **Walk.** Directories are listed several at a time; each entry found is created
//!   locally (directories, symlinks) or queued as a file job. Totals grow as the walk goes.
//! - **Files.** Up to `files_in_flight` files are copied at once; each fetches its missing
//!   chunks, all in flight together within the chunk memory budget, and writes them with
//!   `pwrite` on the background threads, at most `write_queue` bytes handed to them at once.
//!   A file whose local state records the same remote version resumes: only missing chunks
//!   move.
//! - **Durability.** A syncer task batches written chunks: it makes them durable (`fdatasync`
//!   of each file, or one `syncfs` for a large batch), then records them in the journal and
//!   commits it. So a chunk is recorded only once its bytes are on disk, and a crash loses at
//!   most the last second's records, never their truth.
//! - **Verification.** When a file is complete, the BLAKE3 of the local copy is compared
//!   with the server's (computed over one version); a mismatch refetches the whole file once.
//!   Verified files are recorded, and a rerun skips them without reading them.
//! - **Changes.** A chunk read answered for another version than the file's means the file
//!   changed on the server: it starts over at the new version (up to three times).
//! - **Metadata.** Modes and nanosecond access/modification times as the source, for files,
//!   symlinks (times only) and directories (after their contents). Ownership is not copied.
//!
//! Layout: this file holds the run (configuration, errors, the shared context, the status
//! writer); `walk` the tree walk, `file` a file's attempts, `chunked` and `small`
//! one attempt at a large or small file, `verify` the hash comparison, `fetch` chunk
//! reads and the rate limit, `metadata` modes and times.
//!
//! Readers first: blocking file-system calls and CPU work (creating directories, writing,
//! hashing, setting metadata, the status file, syncs, compaction) run on the background
//! threads ([`crate::background`]: lower CPU and I/O priority), never on the async threads
//! (in a mount those also answer FUSE requests) nor on tokio's shared blocking pool (which
//! serves the mount's reads of the local copy). Work off the network path (hashing a complete
//! file, a sync batch, the compaction) first waits, briefly and boundedly, while demand reads
//! are in flight ([`crate::background::DemandGate`]).
//!
//! Memory: a chunk holds its share of `chunk_memory` from before it is requested until its
//! `pwrite` returned, so chunks requested, fetched and not yet written never exceed it; of
//! those, at most `write_queue` bytes are queued at or being written by the background
//! threads (a fetched chunk waits for room, holding its memory, so a disk slower than the
//! network stops new requests instead of growing a backlog).

mod chunked;
mod fetch;
mod file;
pub(crate) mod metadata;
mod owners;
mod small;
mod space;
mod verify;
mod walk;
mod xattrs;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_client::{Client, ClientError};
use ferry_proto::name::join;
use ferry_proto::FileKind;
use ferry_util::AbortOnDrop;
use tokio::sync::Semaphore;
use tracing::debug;

use crate::background::{self, DemandGate};
use crate::progress::{Progress, State};
use crate::state::{CacheDir, CacheError};
use crate::syncer::Syncer;
use fetch::Limiter;
use metadata::set_metadata;
use walk::walk;

pub use owners::Owners;

/// Tunables of a mirror run.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    /// Files copied at once.
    pub files_in_flight: usize,
    /// Bytes of chunks requested and not yet written, at most.
    pub chunk_memory: usize,
    /// Bytes of fetched chunks handed to the background threads and not yet written, at
    /// most (the bounded background write queue; within `chunk_memory`).
    pub write_queue: usize,
    /// Directories listed at once.
    pub listings_in_flight: usize,
    /// Compare each complete file's BLAKE3 with the server's.
    pub verify: bool,
    /// Verify every local file already complete again against the server's BLAKE3 now
    /// (`--checksum`), instead of trusting those whose local file still shows the stamp
    /// recorded when they were verified.
    pub checksum: bool,
    /// Cap on fetched bytes per second (wire bytes), if any.
    pub bwlimit: Option<u64>,
    /// How owners are set (by name as root, by default).
    pub owners: Owners,
    /// Remove local entries the server does not have (`--delete`).
    pub delete: bool,
    /// Copy extended attributes and POSIX ACLs (off with `--no-xattrs`).
    pub xattrs: bool,
    /// Longest time written chunks wait to be made durable and recorded.
    pub sync_interval: Duration,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            files_in_flight: 512,
            chunk_memory: 64 << 20,
            write_queue: WRITE_QUEUE,
            // Each may hold a first page's contents (up to 256 KiB) until written: 64 MiB
            // at most. On the WAN profile the src tree took 3.0 s with 32 (and no contents in
            // first pages), 2.5 s with 64 and 2.35 s with 128 (2026-11-25); on 2026-11-28,
            // alternated run by run, 1.94-2.06 s with 64, 1.78-1.93 with 128, 1.72-1.83
            // with 256 and 1.68-1.78 with 1024: a deep tree's frontier is wider than 64
            // directories at times, and each one left waiting is a round trip later.
            listings_in_flight: 256,
            verify: true,
            checksum: false,
            owners: Owners::Auto,
            delete: false,
            xattrs: true,
            bwlimit: None,
            sync_interval: Duration::from_secs(1),
        }
    }
}

/// Default of [`MirrorConfig::write_queue`]: two default chunks (1 MiB) for each of the
/// default 8 streams, enough to keep the disk busy while the next chunks arrive.
pub const WRITE_QUEUE: usize = 16 << 20;

/// Why a mirror run failed.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The cache directory could not be used.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The remote root could not be read.
    #[error("remote path {path}: {error}")]
    Root {
        /// The remote path.
        path: String,
        /// The error (its text already includes its causes).
        error: ClientError,
    },
    /// The remote root is not a directory.
    #[error("remote path {0} is not a directory: give the directory to mirror")]
    NotADirectory(String),
    /// The local state could not be made durable.
    #[error("cannot record progress in {path}: {source}")]
    Journal {
        /// The state folder.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Some entries could not be copied.
    #[error("mirror incomplete: {0} error(s); see the messages above or `ferry status`, then run it again to resume")]
    Incomplete(u64),
}

/// What one run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Regular files in the tree.
    pub files: u64,
    /// Bytes of regular files in the tree.
    pub bytes: u64,
    /// Bytes fetched by this run.
    pub fetched: u64,
    /// Files verified by this run.
    pub verified: u64,
}

/// A mirror of `root` on the server into a cache directory.
#[derive(Debug)]
pub struct Mirror {
    client: Client,
    cache: Arc<CacheDir>,
    root: Bytes,
    label: String,
    cfg: MirrorConfig,
    progress: Arc<Progress>,
    /// A syncer shared with others (a mount's), instead of one of the run's own.
    syncer: Option<Syncer>,
}

struct Ctx {
    client: Client,
    cache: Arc<CacheDir>,
    root: Bytes,
    cfg: MirrorConfig,
    progress: Arc<Progress>,
    chunk_units: Arc<Semaphore>,
    /// Units of `chunk_units` in all (a chunk never asks for more).
    total_units: u32,
    /// Units (of [`UNIT`] bytes) of the write queue: held from handing a chunk to the
    /// background threads until its write returned.
    write_units: Arc<Semaphore>,
    /// Units of `write_units` in all.
    total_write_units: u32,
    /// Defers hashing, syncs and compaction while demand reads are in flight.
    gate: DemandGate,
    sync: Syncer,
    limiter: Option<Limiter>,
    /// Server owners to local ones.
    owners: owners::OwnerMap,
    /// The server's extended attributes, per directory.
    xattrs: xattrs::XattrMap,
    /// Free space on the copy's file system, reserved by the files in flight.
    space: Arc<space::Space>,
}

/// Units of the chunk memory semaphore.
const UNIT: usize = 64 << 10;

impl Mirror {
    /// A mirror of `root` (export-relative) into `cache`; `label` names the remote in
    /// messages and the status file.
    pub fn new(
        client: Client,
        cache: Arc<CacheDir>,
        root: Bytes,
        label: String,
        cfg: MirrorConfig,
    ) -> Mirror {
        let progress = Arc::new(Progress::default());
        progress.attach_client(&client);
        Mirror {
            client,
            cache,
            root,
            label,
            cfg,
            progress,
            syncer: None,
        }
    }

    /// Records through `syncer` (e.g. a mount's, so that stopping the mount can flush what
    /// the mirror wrote) instead of a syncer of the run's own.
    pub fn with_syncer(mut self, syncer: Syncer) -> Mirror {
        self.syncer = Some(syncer);
        self
    }

    /// The run's live counters.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// Runs the mirror to the end: every regular file complete and verified, every
    /// directory and symlink in place with its metadata.
    ///
    /// # Errors
    /// The remote root cannot be read; the journal cannot be written; or some entries
    /// failed ([`MirrorError::Incomplete`], after everything else was done).
    pub async fn run(&self) -> Result<Summary, MirrorError> {
        let sep = if self.label.starts_with("s3://") {
            "/"
        } else {
            ":/"
        };
        let root_name = format!("{}{sep}{}", self.label, String::from_utf8_lossy(&self.root));
        let known = walk::Known::of(&self.cache);
        // The root's listing is asked for beside its Stat, not a round trip after it.
        let root_listing = walk::RootListing::start(&self.client, self.root.clone(), &known);
        let root_attr =
            self.client
                .stat(self.root.clone())
                .await
                .map_err(|error| MirrorError::Root {
                    path: root_name.clone(),
                    error,
                })?;
        if root_attr.kind != FileKind::Directory {
            return Err(MirrorError::NotADirectory(root_name));
        }
        // The status file is allocated now, so it can be written even if the disk fills.
        let first = self.progress.snapshot(State::Running, &self.label);
        let meta = self.cache.meta().to_path_buf();
        match background::run(move || first.write(&meta)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => debug!("status file: {e}"),
            Err(e) => debug!("status file: {e}"),
        }
        // A mirror on a background handle (a mount's) yields to the mount's readers; one on
        // a foreground handle (`ferry mirror`) has no readers, and its own requests would
        // count as theirs.
        let gate = if self.client.is_background() {
            DemandGate::client(&self.client)
        } else {
            DemandGate::open()
        };
        let (sync, syncer) = match &self.syncer {
            Some(s) => (s.clone(), None),
            None => {
                let errors = self.progress.clone();
                let (s, task) = Syncer::start_gated(
                    self.cache.clone(),
                    self.cfg.sync_interval,
                    Arc::new(move |m| errors.error(m)),
                    None,
                    gate.clone(),
                );
                (s, Some(task))
            }
        };
        let units = (self.cfg.chunk_memory / UNIT).max(1);
        let write_units = (self.cfg.write_queue / UNIT).max(1);
        let ctx = Arc::new(Ctx {
            client: self.client.clone(),
            cache: self.cache.clone(),
            root: self.root.clone(),
            cfg: self.cfg.clone(),
            progress: self.progress.clone(),
            chunk_units: Arc::new(Semaphore::new(units)),
            total_units: units as u32,
            write_units: Arc::new(Semaphore::new(write_units)),
            total_write_units: write_units as u32,
            gate: gate.clone(),
            sync,
            limiter: self.cfg.bwlimit.map(Limiter::new),
            owners: owners::OwnerMap::new(self.cfg.owners),
            xattrs: xattrs::XattrMap::default(),
            space: space::Space::new(self.cache.root().to_path_buf()),
        });
        // Ends with the run, also when the run is dropped (a mount stopping its mirror).
        let status = StatusWriter::start(
            self.cache.clone(),
            self.progress.clone(),
            self.label.clone(),
        );

        let dirs = walk(&ctx, root_attr, known, root_listing).await;

        // Directory metadata last, deepest first: creating entries changes a directory's
        // mtime.
        let mut with = Vec::with_capacity(dirs.len());
        for (rel, attr) in dirs {
            let owner = ctx.owners.local(&attr);
            let xa = xattrs::XattrMap::of(&ctx, &rel).await;
            with.push((rel, attr, owner, xa));
        }
        let mut dirs = with;
        dirs.sort_by_key(|(rel, _, _, _)| {
            std::cmp::Reverse(
                rel.iter().filter(|&&b| b == b'/').count() + usize::from(!rel.is_empty()),
            )
        });
        let (cache, progress) = (self.cache.clone(), self.progress.clone());
        let set = background::run(move || {
            for (rel, attr, owner, xa) in &dirs {
                let local = cache.local_path(rel);
                let r = set_metadata(&local, attr, true, *owner)
                    .and_then(|()| xa.as_ref().map_or(Ok(()), |x| xattrs::apply(&local, x)));
                if let Err(e) = r {
                    progress.error(format!("{}: setting mode and times: {e}", local.display()));
                }
            }
        });
        if let Err(e) = set.await {
            self.progress
                .error(format!("setting directory modes and times: {e}"));
        }

        // Everything written is recorded before the run reports.
        ctx.sync.flush().await;
        drop(ctx);
        let journal = match syncer {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        };
        // No "running" write of the status writer lands after the final state.
        drop(status);
        let p = &self.progress;
        let errors = p.error_count();
        let state = if errors == 0 {
            State::Complete
        } else {
            State::Incomplete
        };
        let last = p.snapshot(state, &self.label);
        let cache = self.cache.clone();
        let written = background::run(move || last.write(cache.meta())).await;
        if let Err(e) = written.map_err(std::io::Error::from).and_then(|r| r) {
            debug!("status file: {e}");
        }
        gate.wait().await;
        let cache = self.cache.clone();
        match background::run(move || cache.compact_if_large()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => debug!("journal compaction failed: {e}"),
            Err(e) => debug!("journal compaction: {e}"),
        }
        journal.map_err(|source| MirrorError::Journal {
            path: self.cache.meta().to_path_buf(),
            source,
        })?;
        if errors > 0 {
            return Err(MirrorError::Incomplete(errors));
        }
        Ok(Summary {
            files: p.files_total.load(Ordering::Relaxed),
            bytes: p.bytes_total.load(Ordering::Relaxed),
            fetched: p.bytes_fetched.load(Ordering::Relaxed),
            verified: p.files_verified.load(Ordering::Relaxed),
        })
    }
}

/// The server path of export-relative `rel` under `root` (empty: `root` itself).
pub(crate) fn remote_path(root: &Bytes, rel: &[u8]) -> Bytes {
    if rel.is_empty() {
        root.clone()
    } else {
        Bytes::from(join(root, rel))
    }
}

/// The status file, rewritten every second while the run goes on (on the background
/// threads).
/// Dropping it stops the rewrites, waiting for one in progress, so that no "running" lands
/// after whatever the caller writes next (the final state, or "interrupted").
struct StatusWriter {
    shared: Arc<StatusShared>,
    _task: AbortOnDrop<()>,
}

#[derive(Default)]
struct StatusShared {
    stopped: std::sync::atomic::AtomicBool,
    /// Held while a rewrite is in progress.
    writing: std::sync::Mutex<()>,
}

impl StatusWriter {
    fn start(cache: Arc<CacheDir>, progress: Arc<Progress>, label: String) -> StatusWriter {
        let shared = Arc::new(StatusShared::default());
        let task = AbortOnDrop(tokio::spawn(status_writer(
            cache,
            progress,
            label,
            shared.clone(),
        )));
        StatusWriter {
            shared,
            _task: task,
        }
    }
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Waits for a rewrite in progress (one small write into space allocated up front).
        drop(self.shared.writing.lock());
    }
}

async fn status_writer(
    cache: Arc<CacheDir>,
    progress: Arc<Progress>,
    label: String,
    shared: Arc<StatusShared>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let s = progress.snapshot(State::Running, &label);
        let (cache, shared) = (cache.clone(), shared.clone());
        let written = background::run(move || {
            let _one = shared.writing.lock().unwrap_or_else(|e| e.into_inner());
            if shared.stopped.load(Ordering::SeqCst) {
                return Ok(());
            }
            s.write(cache.meta())
        });
        match written.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => debug!("status file: {e}"),
            Err(e) => debug!("status file: {e}"),
        }
    }
}
