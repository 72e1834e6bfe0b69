//! The mirror engine: walks the export and fills the cache directory with a complete,
//! verified copy, fetching many files and many chunks of big files at once.
//!
//! - **Walk.** Directories are listed several at a time; each entry found is created
//!   locally (directories, symlinks) or queued as a file job. Totals grow as the walk goes.
//! - **Files.** Up to `files_in_flight` files are copied at once; each fetches its missing
//!   chunks, all in flight together within the chunk memory budget, and writes them with
//!   `pwrite` on the blocking pool (many writes in parallel keep an NVMe queue busy). A file
//!   whose local state records the same remote version resumes: only missing chunks move.
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

use std::fs::File;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::{Client, ClientError};
use ferry_proto::name::join;
use ferry_proto::{Attr, FileKind, Status, Version};
use ferry_util::AbortOnDrop;
use tokio::sync::Semaphore;
use tracing::{debug, info};

use crate::progress::{Progress, State};
use crate::state::{CacheDir, CacheError};
use crate::syncer::Syncer;
use crate::STATE_DIR;

/// Tunables of a mirror run.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    /// Files copied at once.
    pub files_in_flight: usize,
    /// Bytes of chunks requested and not yet written, at most.
    pub chunk_memory: usize,
    /// Directories listed at once.
    pub listings_in_flight: usize,
    /// Compare each complete file's BLAKE3 with the server's.
    pub verify: bool,
    /// Cap on fetched bytes per second (wire bytes), if any.
    pub bwlimit: Option<u64>,
    /// Longest time written chunks wait to be made durable and recorded.
    pub sync_interval: Duration,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            files_in_flight: 512,
            chunk_memory: 64 << 20,
            listings_in_flight: 32,
            verify: true,
            bwlimit: None,
            sync_interval: Duration::from_secs(1),
        }
    }
}

/// Why a mirror run failed.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The cache directory could not be used.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The remote root could not be read.
    #[error("remote path {path}: {source}")]
    Root {
        /// The remote path.
        path: String,
        /// The error.
        source: ClientError,
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

#[derive(Debug)]
enum FileOutcome {
    Done,
    /// The file changed on the server; its new attributes when known.
    Changed(Option<Attr>),
    /// The hash did not match: copy again from nothing.
    Mismatch,
    /// The file is gone from the server.
    Vanished,
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
    sync: Syncer,
    limiter: Option<Limiter>,
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
        let root_name = format!("{}:/{}", self.label, String::from_utf8_lossy(&self.root));
        let root_attr = self
            .client
            .stat(self.root.clone())
            .await
            .map_err(|source| MirrorError::Root {
                path: root_name.clone(),
                source,
            })?;
        if root_attr.kind != FileKind::Directory {
            return Err(MirrorError::NotADirectory(root_name));
        }
        // The status file is allocated now, so it can be written even if the disk fills.
        if let Err(e) = self
            .progress
            .snapshot(State::Running, &self.label)
            .write(self.cache.meta())
        {
            debug!("status file: {e}");
        }
        let (sync, syncer) = match &self.syncer {
            Some(s) => (s.clone(), None),
            None => {
                let errors = self.progress.clone();
                let (s, task) = Syncer::start(
                    self.cache.clone(),
                    self.cfg.sync_interval,
                    Arc::new(move |m| errors.error(m)),
                );
                (s, Some(task))
            }
        };
        let units = (self.cfg.chunk_memory / UNIT).max(1);
        let ctx = Arc::new(Ctx {
            client: self.client.clone(),
            cache: self.cache.clone(),
            root: self.root.clone(),
            cfg: self.cfg.clone(),
            progress: self.progress.clone(),
            chunk_units: Arc::new(Semaphore::new(units)),
            total_units: units as u32,
            sync,
            limiter: self.cfg.bwlimit.map(Limiter::new),
        });
        // Ends with the run, also when the run is dropped (a mount stopping its mirror).
        let status = AbortOnDrop(tokio::spawn(status_writer(
            self.cache.clone(),
            self.progress.clone(),
            self.label.clone(),
        )));

        let dirs = walk(&ctx, root_attr).await;

        // Directory metadata last, deepest first: creating entries changes a directory's
        // mtime.
        let mut dirs = dirs;
        dirs.sort_by_key(|(rel, _)| {
            std::cmp::Reverse(
                rel.iter().filter(|&&b| b == b'/').count() + usize::from(!rel.is_empty()),
            )
        });
        for (rel, attr) in &dirs {
            let local = self.cache.local_path(rel);
            if let Err(e) = set_metadata(&local, attr, true) {
                self.progress
                    .error(format!("{}: setting mode and times: {e}", local.display()));
            }
        }

        // Everything written is recorded before the run reports.
        ctx.sync.flush().await;
        drop(ctx);
        let journal = match syncer {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        };
        drop(status);
        let p = &self.progress;
        let errors = p.error_count();
        let state = if errors == 0 {
            State::Complete
        } else {
            State::Incomplete
        };
        let _ = p.snapshot(state, &self.label).write(self.cache.meta());
        if let Err(e) = self.cache.compact_if_large() {
            debug!("journal compaction failed: {e}");
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

/// Lists the tree, creates directories and symlinks, runs file jobs. Returns every
/// directory (relative path, attributes), root included, for their metadata.
async fn walk(ctx: &Arc<Ctx>, root_attr: Attr) -> Vec<(Bytes, Attr)> {
    let mut dirs = vec![(Bytes::new(), root_attr)];
    let mut pending: Vec<Bytes> = vec![Bytes::new()];
    let mut listings = tokio::task::JoinSet::new();
    let mut jobs = tokio::task::JoinSet::new();
    let files = Arc::new(Semaphore::new(ctx.cfg.files_in_flight.max(1)));
    if let Err(e) = make_dir(&ctx.cache.local_path(b"")) {
        ctx.progress
            .error(format!("{}: {e}", ctx.cache.root().display()));
        return dirs;
    }
    loop {
        while listings.len() < ctx.cfg.listings_in_flight.max(1) {
            let Some(rel) = pending.pop() else { break };
            let c = ctx.clone();
            listings.spawn(async move {
                let remote = remote_path(&c.root, &rel);
                let r = c.client.read_dir(remote).await;
                (rel, r)
            });
        }
        let Some(done) = listings.join_next().await else {
            break;
        };
        let Ok((rel, listing)) = done else { continue };
        let entries = match listing {
            Ok(e) => e,
            Err(e) => {
                ctx.progress
                    .error(format!("listing /{}: {e}", String::from_utf8_lossy(&rel)));
                continue;
            }
        };
        for e in entries {
            if rel.is_empty() && e.name.as_ref() == STATE_DIR.as_bytes() {
                ctx.progress.error(format!(
                    "the export has a top-level entry named {STATE_DIR}, which a cache directory uses for its state: not mirrored"
                ));
                continue;
            }
            let child = Bytes::from(join(&rel, &e.name));
            match e.attr.kind {
                FileKind::Directory => {
                    let local = ctx.cache.local_path(&child);
                    match make_dir(&local) {
                        Ok(()) => {
                            pending.push(child.clone());
                            dirs.push((child, e.attr));
                            ctx.progress.others_done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(err) => ctx.progress.error(format!("{}: {err}", local.display())),
                    }
                }
                FileKind::File => {
                    ctx.progress.files_total.fetch_add(1, Ordering::Relaxed);
                    ctx.progress
                        .bytes_total
                        .fetch_add(e.attr.size, Ordering::Relaxed);
                    let Ok(permit) = files.clone().acquire_owned().await else {
                        break;
                    };
                    let c = ctx.clone();
                    jobs.spawn(async move {
                        copy_file(&c, child, e.attr).await;
                        drop(permit);
                    });
                }
                FileKind::Symlink => {
                    let c = ctx.clone();
                    jobs.spawn(async move { copy_symlink(&c, child, e.attr).await });
                }
                _ => debug!(
                    "/{}: not a file, directory or symlink: skipped",
                    String::from_utf8_lossy(&child)
                ),
            }
            // Reap finished jobs as we go so the set stays small.
            while jobs.try_join_next().is_some() {}
        }
    }
    ctx.progress.walk_done.store(true, Ordering::Relaxed);
    while jobs.join_next().await.is_some() {}
    dirs
}

pub(crate) fn remote_path(root: &Bytes, rel: &[u8]) -> Bytes {
    if rel.is_empty() {
        root.clone()
    } else {
        Bytes::from(join(root, rel))
    }
}

fn make_dir(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(m) if m.is_symlink() || m.is_file() => {
            std::fs::remove_file(p)?;
            std::fs::create_dir(p)
        }
        Ok(_) => Err(std::io::Error::other(
            "exists and is not a directory; move it away",
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(p),
        Err(e) => Err(e),
    }
}

async fn copy_symlink(ctx: &Ctx, rel: Bytes, attr: Attr) {
    let remote = remote_path(&ctx.root, &rel);
    let local = ctx.cache.local_path(&rel);
    let target = match ctx.client.readlink(remote).await {
        Ok(t) => t,
        Err(e) => {
            ctx.progress.error(format!(
                "reading symlink /{}: {e}",
                String::from_utf8_lossy(&rel)
            ));
            return;
        }
    };
    let r = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let want = std::ffi::OsStr::from_bytes(&target);
        match std::fs::symlink_metadata(&local) {
            Ok(m) if m.is_symlink() && std::fs::read_link(&local)?.as_os_str() == want => {}
            Ok(m) if m.is_dir() => {
                return Err(std::io::Error::other(
                    "a local directory is where the server has a symlink; move it away",
                ))
            }
            Ok(_) => {
                std::fs::remove_file(&local)?;
                std::os::unix::fs::symlink(want, &local)?;
            }
            Err(_) => std::os::unix::fs::symlink(want, &local)?,
        }
        set_metadata(&local, &attr, false)
    })
    .await;
    match r {
        Ok(Ok(())) => {
            ctx.progress.others_done.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Err(e)) => ctx
            .progress
            .error(format!("symlink /{}: {e}", String::from_utf8_lossy(&rel))),
        Err(e) => ctx.progress.error(format!("symlink task: {e}")),
    }
}

/// Sets the mode and access/modification times of an open regular file.
fn set_file_metadata(f: &File, attr: &Attr) -> std::io::Result<()> {
    rustix::fs::fchmod(
        f,
        rustix::fs::Mode::from_raw_mode(u32::from(attr.perm) & 0o7777),
    )?;
    let ts = |t: ferry_proto::Timestamp| rustix::fs::Timespec {
        tv_sec: t.sec,
        tv_nsec: i64::from(t.nsec) as _,
    };
    rustix::fs::futimens(
        f,
        &rustix::fs::Timestamps {
            last_access: ts(attr.atime),
            last_modification: ts(attr.mtime),
        },
    )?;
    Ok(())
}

/// Sets mode (unless a symlink) and access/modification times without following a
/// final symlink.
fn set_metadata(local: &Path, attr: &Attr, mode: bool) -> std::io::Result<()> {
    if mode && attr.kind != FileKind::Symlink {
        std::fs::set_permissions(
            local,
            std::fs::Permissions::from_mode(u32::from(attr.perm) & 0o7777),
        )?;
    }
    let ts = |t: ferry_proto::Timestamp| rustix::fs::Timespec {
        tv_sec: t.sec,
        tv_nsec: i64::from(t.nsec) as _,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        local,
        &rustix::fs::Timestamps {
            last_access: ts(attr.atime),
            last_modification: ts(attr.mtime),
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

/// Copies one regular file to completion (or records why not).
async fn copy_file(ctx: &Arc<Ctx>, rel: Bytes, mut attr: Attr) {
    let name = format!("/{}", String::from_utf8_lossy(&rel));
    let mut counted_total = attr.size;
    for attempt in 0..4 {
        if attempt > 0 && attr.size != counted_total {
            // Totals follow the file's new size.
            ctx.progress
                .bytes_total
                .fetch_add(attr.size, Ordering::Relaxed);
            ctx.progress
                .bytes_total
                .fetch_sub(counted_total, Ordering::Relaxed);
            counted_total = attr.size;
        }
        match copy_file_once(ctx, &rel, &attr).await {
            Ok(FileOutcome::Done) => {
                ctx.progress.files_done.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(FileOutcome::Vanished) => {
                info!("{name} vanished from the server during the mirror");
                ctx.progress.files_total.fetch_sub(1, Ordering::Relaxed);
                ctx.progress
                    .bytes_total
                    .fetch_sub(counted_total, Ordering::Relaxed);
                ctx.sync.flush().await;
                ctx.cache.forget(&rel);
                let _ = std::fs::remove_file(ctx.cache.local_path(&rel));
                return;
            }
            Ok(FileOutcome::Changed(new)) => {
                ctx.progress.files_changed.fetch_add(1, Ordering::Relaxed);
                info!("{name} changed on the server during the copy: copying the new version");
                attr = match new {
                    Some(a) => a,
                    None => match ctx.client.stat(remote_path(&ctx.root, &rel)).await {
                        Ok(a) if a.kind == FileKind::File => a,
                        Ok(_) => {
                            ctx.progress
                                .error(format!("{name} is no longer a regular file on the server"));
                            return;
                        }
                        Err(ClientError::Remote {
                            status: Status::NotFound,
                            ..
                        }) => {
                            ctx.progress.files_total.fetch_sub(1, Ordering::Relaxed);
                            ctx.progress
                                .bytes_total
                                .fetch_sub(counted_total, Ordering::Relaxed);
                            return;
                        }
                        Err(e) => {
                            ctx.progress.error(format!("{name}: {e}"));
                            return;
                        }
                    },
                };
            }
            Ok(FileOutcome::Mismatch) => {
                ctx.progress.hash_mismatches.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "{name}: the copy's BLAKE3 differs from the server's: fetching it again"
                );
                // Pending records of the bad copy land before it is reset.
                ctx.sync.flush().await;
                ctx.cache.forget(&rel);
            }
            Err(e) => {
                ctx.progress.error(format!("{name}: {e}"));
                return;
            }
        }
    }
    ctx.progress.error(format!(
        "{name}: kept changing or failing verification; giving up for this run"
    ));
}

/// Opens the local file for `rel` at `attr`'s version: reuses it when the state says it
/// holds (parts of) that version and its size is right, else creates it empty at the
/// right size (sparse). Returns the file, its generation and whether the existing state
/// applies.
fn open_local(
    cache: &CacheDir,
    rel: &Bytes,
    attr: &Attr,
    chunk_size: u32,
) -> std::io::Result<(File, u64, bool)> {
    let local = cache.local_path(rel);
    let version = attr.version();
    let st = cache.state(rel);
    if let Ok(m) = std::fs::symlink_metadata(&local) {
        if m.is_dir() {
            return Err(std::io::Error::other(
                "a local directory is where the server has a file; move it away",
            ));
        }
        if m.is_file()
            && m.len() == attr.size
            && st
                .as_ref()
                .is_some_and(|s| s.version == version && s.chunk_size == chunk_size)
        {
            // The same state after the open: the file is the inode the state describes.
            if let Some((f, now)) = cache.open_current(rel, true)? {
                if now.version == version && now.chunk_size == chunk_size {
                    return Ok((f, now.generation, true));
                }
            }
        }
    }
    let (f, generation) = cache.restart_file(rel, version, chunk_size)?;
    Ok((f, generation, false))
}

async fn copy_file_once(ctx: &Arc<Ctx>, rel: &Bytes, attr: &Attr) -> std::io::Result<FileOutcome> {
    let cs = ctx.client.session().chunk_size;
    let version = attr.version();
    if attr.size > 0 && attr.size <= u64::from(cs) {
        // A small file already complete (verified or not) takes the general path, which
        // resumes it without fetching it again.
        let complete = ctx
            .cache
            .state(rel)
            .is_some_and(|s| s.version == version && s.complete());
        if !complete {
            return copy_small_file(ctx, rel, attr).await;
        }
    }
    let (file, generation, resumed) = {
        let cache = ctx.cache.clone();
        let (r, a) = (rel.clone(), *attr);
        tokio::task::spawn_blocking(move || open_local(&cache, &r, &a, cs))
            .await
            .map_err(std::io::Error::other)??
    };
    let file = Arc::new(file);
    let st = ctx.cache.state(rel).filter(|s| s.generation == generation);
    let already = st.as_ref().map_or(0, |s| s.present_bytes());
    ctx.progress
        .bytes_done
        .fetch_add(already, Ordering::Relaxed);
    let mut done_here = already;
    if resumed
        && st
            .as_ref()
            .is_some_and(|s| s.complete() && s.verified.is_some())
    {
        // Complete and verified by an earlier run: only the metadata may need setting.
        let (local, a) = (ctx.cache.local_path(rel), *attr);
        tokio::task::spawn_blocking(move || set_metadata(&local, &a, true))
            .await
            .map_err(std::io::Error::other)??;
        return Ok(FileOutcome::Done);
    }
    let missing: Vec<u64> = match &st {
        Some(s) => s.missing().collect(),
        None => Vec::new(),
    };
    let remote = remote_path(&ctx.root, rel);
    let mut tasks = tokio::task::JoinSet::new();
    let mut early = Vec::new();
    for index in missing {
        let offset = index * u64::from(cs);
        let len = (attr.size - offset).min(u64::from(cs)) as usize;
        let units = (len.div_ceil(UNIT).max(1) as u32).min(ctx.total_units);
        let Ok(permit) = ctx.chunk_units.clone().acquire_many_owned(units).await else {
            break;
        };
        // Recorded meanwhile by someone else (a reader of the mount this mirror runs in).
        if ctx
            .cache
            .state(rel)
            .is_some_and(|s| s.generation == generation && s.has(index))
        {
            done_here += len as u64;
            ctx.progress
                .bytes_done
                .fetch_add(len as u64, Ordering::Relaxed);
            continue;
        }
        let c = ctx.clone();
        let (remote, rel, file) = (remote.clone(), rel.clone(), file.clone());
        tasks.spawn(async move {
            let r = fetch_chunk(&c, &remote, offset, len as u32, version).await;
            let r = match r {
                Ok((data, file_hash)) => {
                    let n = data.len() as u64;
                    let f = file.clone();
                    let w = tokio::task::spawn_blocking(move || f.write_all_at(&data, offset))
                        .await
                        .map_err(std::io::Error::other)
                        .and_then(|r| r);
                    match w {
                        Ok(()) => {
                            c.sync.written(rel, version, generation, index, file);
                            c.progress.bytes_done.fetch_add(n, Ordering::Relaxed);
                            Ok((n, file_hash))
                        }
                        Err(e) => Err(ChunkError::Io(e)),
                    }
                }
                Err(e) => Err(e),
            };
            drop(permit);
            r
        });
        // Stop early when a chunk already found the file changed or failing (its result is
        // kept and handled with the others).
        if let Some(r) = tasks.try_join_next() {
            let failed = !matches!(r, Ok(Ok(_)));
            early.push(r);
            if failed {
                break;
            }
        }
    }
    let mut outcome: Option<std::io::Result<FileOutcome>> = None;
    // The server's BLAKE3 of the whole file, when one read returned all of it.
    let mut whole_file_hash = None;
    let mut early = early.into_iter();
    loop {
        let r = match early.next() {
            Some(r) => r,
            None => match tasks.join_next().await {
                Some(r) => r,
                None => break,
            },
        };
        match r {
            Ok(Ok((n, h))) => {
                done_here += n;
                whole_file_hash = whole_file_hash.or(h);
            }
            Ok(Err(ChunkError::Changed)) => {
                outcome.get_or_insert(Ok(FileOutcome::Changed(None)));
            }
            Ok(Err(ChunkError::Vanished)) => {
                outcome.get_or_insert(Ok(FileOutcome::Vanished));
            }
            Ok(Err(ChunkError::Remote(e))) => {
                outcome.get_or_insert(Err(std::io::Error::other(e.to_string())));
            }
            Ok(Err(ChunkError::Io(e))) => {
                outcome.get_or_insert(Err(std::io::Error::new(
                    e.kind(),
                    format!("writing the local copy: {e}"),
                )));
            }
            Err(e) => {
                outcome.get_or_insert(Err(std::io::Error::other(e)));
            }
        }
    }
    if let Some(o) = outcome {
        // What this attempt counted as done is taken back; the next attempt counts anew.
        ctx.progress
            .bytes_done
            .fetch_sub(done_here, Ordering::Relaxed);
        return o;
    }
    // Every chunk is written (and on its way to being recorded).
    if ctx.cfg.verify {
        let local = ctx.cache.local_path(rel);
        let local_hash = tokio::task::spawn_blocking(move || crate::hash_file(&local));
        let server = if attr.size == 0 || whole_file_hash.is_some() {
            None
        } else {
            Some(ctx.client.hash(remote.clone()).await)
        };
        let local_hash = local_hash.await.map_err(std::io::Error::other)??;
        let expected = match server {
            // Empty, or read whole in one response that carried the server's hash of it
            // (of this very version: the read's version was checked).
            None => whole_file_hash.unwrap_or(*blake3::hash(b"").as_bytes()),
            Some(Ok(h)) if h.version == version => h.blake3,
            Some(Ok(h)) => {
                ctx.progress
                    .bytes_done
                    .fetch_sub(done_here, Ordering::Relaxed);
                debug!(
                    "hash answered for version {:?}, copied {:?}",
                    h.version, version
                );
                return Ok(FileOutcome::Changed(None));
            }
            Some(Err(ClientError::Remote {
                status: Status::NotFound,
                ..
            })) => {
                ctx.progress
                    .bytes_done
                    .fetch_sub(done_here, Ordering::Relaxed);
                return Ok(FileOutcome::Vanished);
            }
            Some(Err(e)) => {
                ctx.progress
                    .bytes_done
                    .fetch_sub(done_here, Ordering::Relaxed);
                return Err(std::io::Error::other(format!(
                    "asking the server for its hash: {e}"
                )));
            }
        };
        if local_hash != expected {
            ctx.progress
                .bytes_done
                .fetch_sub(done_here, Ordering::Relaxed);
            return Ok(FileOutcome::Mismatch);
        }
        ctx.progress.files_verified.fetch_add(1, Ordering::Relaxed);
        ctx.sync.verified(rel.clone(), generation, expected);
    }
    let (local, a) = (ctx.cache.local_path(rel), *attr);
    tokio::task::spawn_blocking(move || set_metadata(&local, &a, true))
        .await
        .map_err(std::io::Error::other)??;
    Ok(FileOutcome::Done)
}

/// A file that fits in one chunk: one read, then one blocking step that creates, writes and
/// sets the metadata of the local file (a tree of small files is bound by per-file work). Its
/// hash is computed over the bytes written, still in memory, and compared with the server's
/// hash of the same version (carried by the read when the server has READ_HASH, else asked for).
async fn copy_small_file(ctx: &Arc<Ctx>, rel: &Bytes, attr: &Attr) -> std::io::Result<FileOutcome> {
    let cs = ctx.client.session().chunk_size;
    let version = attr.version();
    let remote = remote_path(&ctx.root, rel);
    let units = ((attr.size as usize).div_ceil(UNIT).max(1) as u32).min(ctx.total_units);
    let permit = ctx
        .chunk_units
        .clone()
        .acquire_many_owned(units)
        .await
        .map_err(std::io::Error::other)?;
    let (data, file_hash) = match fetch_chunk(ctx, &remote, 0, attr.size as u32, version).await {
        Ok(r) => r,
        Err(ChunkError::Changed) => return Ok(FileOutcome::Changed(None)),
        Err(ChunkError::Vanished) => return Ok(FileOutcome::Vanished),
        Err(ChunkError::Remote(e)) => return Err(std::io::Error::other(e.to_string())),
        Err(ChunkError::Io(e)) => return Err(e),
    };
    let (file, generation) = {
        let (cache, r, a, d) = (ctx.cache.clone(), rel.clone(), *attr, data.clone());
        tokio::task::spawn_blocking(move || -> std::io::Result<(File, u64)> {
            let (mut f, generation) = cache.restart_file(&r, a.version(), cs)?;
            std::io::Write::write_all(&mut f, &d)?;
            set_file_metadata(&f, &a)?;
            Ok((f, generation))
        })
        .await
        .map_err(std::io::Error::other)?
        .map_err(|e| std::io::Error::new(e.kind(), format!("writing the local copy: {e}")))?
    };
    drop(permit);
    ctx.sync
        .written(rel.clone(), version, generation, 0, Arc::new(file));
    ctx.progress
        .bytes_done
        .fetch_add(attr.size, Ordering::Relaxed);
    if ctx.cfg.verify {
        let mine = *blake3::hash(&data).as_bytes();
        let theirs = match file_hash {
            Some(h) => h,
            None => match ctx.client.hash(remote).await {
                Ok(h) if h.version == version => h.blake3,
                Ok(_) => {
                    ctx.progress
                        .bytes_done
                        .fetch_sub(attr.size, Ordering::Relaxed);
                    return Ok(FileOutcome::Changed(None));
                }
                Err(e) => {
                    ctx.progress
                        .bytes_done
                        .fetch_sub(attr.size, Ordering::Relaxed);
                    return Err(std::io::Error::other(format!(
                        "asking the server for its hash: {e}"
                    )));
                }
            },
        };
        if mine != theirs {
            ctx.progress
                .bytes_done
                .fetch_sub(attr.size, Ordering::Relaxed);
            return Ok(FileOutcome::Mismatch);
        }
        ctx.progress.files_verified.fetch_add(1, Ordering::Relaxed);
        ctx.sync.verified(rel.clone(), generation, theirs);
    }
    Ok(FileOutcome::Done)
}

#[derive(Debug)]
enum ChunkError {
    Changed,
    Vanished,
    Remote(ClientError),
    Io(std::io::Error),
}

/// Fetches one chunk of `version`, retrying transient failures (a payload that failed its
/// checksum, a broken stream) a few times.
async fn fetch_chunk(
    ctx: &Ctx,
    remote: &Bytes,
    offset: u64,
    len: u32,
    version: Version,
) -> Result<(Bytes, Option<[u8; 32]>), ChunkError> {
    let mut tries = 0;
    loop {
        match ctx.client.read_chunk(remote.clone(), offset, len).await {
            Ok(chunk) => {
                let (data, v) = (chunk.data, chunk.version);
                if let Some(l) = &ctx.limiter {
                    l.take(chunk.wire_len as u64).await;
                }
                if v != version {
                    return Err(ChunkError::Changed);
                }
                if data.len() != len as usize {
                    // Shorter than the version's size says: the file is being changed.
                    return Err(ChunkError::Changed);
                }
                ctx.progress.chunks_fetched.fetch_add(1, Ordering::Relaxed);
                ctx.progress
                    .bytes_fetched
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                return Ok((data, chunk.file_hash));
            }
            Err(ClientError::Remote {
                status: Status::NotFound,
                ..
            }) => return Err(ChunkError::Vanished),
            Err(e) if tries < 3 && e.is_transient() => {
                tries += 1;
                ctx.progress
                    .chunks_refetched
                    .fetch_add(1, Ordering::Relaxed);
                debug!(
                    "chunk at {offset} of /{}: {e}; fetching again",
                    String::from_utf8_lossy(remote)
                );
                tokio::time::sleep(Duration::from_millis(100 << tries)).await;
            }
            Err(e) => return Err(ChunkError::Remote(e)),
        }
    }
}

async fn status_writer(cache: Arc<CacheDir>, progress: Arc<Progress>, label: String) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let s = progress.snapshot(State::Running, &label);
        if let Err(e) = s.write(cache.meta()) {
            debug!("status file: {e}");
        }
    }
}

/// A token bucket on wire bytes: callers sleep as long as the rate requires.
struct Limiter {
    rate: f64,
    state: std::sync::Mutex<(Instant, f64)>,
}

impl Limiter {
    fn new(rate: u64) -> Limiter {
        Limiter {
            rate: rate.max(1) as f64,
            state: std::sync::Mutex::new((Instant::now(), 0.0)),
        }
    }

    /// Accounts `n` bytes; sleeps until the average rate is back under the cap.
    async fn take(&self, n: u64) {
        let wait = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            // `s.1` is the time (s) by which the bytes so far are paid for, relative to s.0.
            let paid_until = (s.1 - now.duration_since(s.0).as_secs_f64()).max(0.0);
            let new = paid_until + n as f64 / self.rate;
            *s = (now, new);
            // Up to a quarter second of burst is allowed.
            (new - 0.25).max(0.0)
        };
        if wait > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
}
