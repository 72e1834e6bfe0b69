//! Open file handles: what each reads (a [`FileKey`]: path and the version seen at open), its
//! read-ahead state, and whether the kernel serves it with FUSE passthrough.
//!
//! Invariants:
//! - A handle's key is fixed at open: its reads are served for that version only, up to the
//!   size seen then.
//! - Passthrough and cached opens of one file never coexist, because the kernel refuses to
//!   mix them on one inode: a handle may be passthrough only if no cached handle of the file
//!   is open, and an open beside a passthrough handle is served with direct I/O. The mode is
//!   decided and the handle inserted under one lock, so two opens cannot choose differently
//!   unseen. A handle the kernel refused passthrough for counts as cached.
//! - Chunks held from an earlier version of the file are dropped at the open that sees the
//!   new one; on a first open, chunks fetched ahead for this very version stay.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::{FileKey, Prefetcher};
use ferry_proto::{FileKind, Version};
use tracing::debug;

use super::{file_id, key_at, lock, open_max_age, Fs};
use crate::error::Error;

/// Whether `e` says the server could not be reached (rather than answered).
fn unreachable(e: &ferry_client::ClientError) -> bool {
    use ferry_client::ClientError as E;
    matches!(e, E::Timeout(_) | E::ConnectionLost | E::Unreachable { .. })
}

/// Whether a file has at least a chunk's worth of bytes not allocated on the server:
/// then its data map is worth a round trip (holes are then never fetched).
fn looks_sparse(attr: &ferry_proto::Attr, chunk_size: u64) -> bool {
    attr.blocks.saturating_mul(512).saturating_add(chunk_size) <= attr.size
}

/// One open file.
pub(super) struct Handle {
    pub(super) key: FileKey,
    pub(super) prefetcher: Mutex<Prefetcher>,
    pub(super) stats: Mutex<HandleStats>,
    opened: Instant,
    /// Reads of this handle go to the local copy in the kernel (FUSE passthrough).
    passthrough: AtomicBool,
    /// A read found the file changed on the server (logged once per handle).
    pub(super) changed: AtomicBool,
    /// Bytes a sequential reader has read of chunks it read in parts, by chunk index
    /// (see [`Fs::read`]).
    pub(super) parts_read: Mutex<HashMap<u64, u64>>,
    /// Reads of this handle go through the kernel's page cache (neither direct I/O nor
    /// passthrough): the kernel asks for what it does not hold.
    pub(super) page_cache: bool,
}

/// Chunks read in parts held in [`Handle::parts_read`] at most (a reader that seeks away
/// leaves some unfinished).
const PARTS_TRACKED: usize = 256;

impl Handle {
    /// A sequential reader read `len` bytes of chunk `index` (of `chunk_len` bytes) in a read
    /// that did not take it whole: whether it has now read every byte of it. The kernel
    /// sends a file's readahead in pieces that need not start at a chunk's start, several
    /// at once and out of order, so reaching a chunk's end does not mean its start was read.
    pub(super) fn read_part(&self, index: u64, len: usize, chunk_len: usize) -> bool {
        let mut parts = lock(&self.parts_read);
        if parts.len() >= PARTS_TRACKED && !parts.contains_key(&index) {
            parts.clear();
        }
        let read = parts.entry(index).or_insert(0);
        *read += len as u64;
        if *read >= chunk_len as u64 {
            parts.remove(&index);
            true
        } else {
            false
        }
    }
}

/// What one open file handle did, logged (debug) when it is released: enough to tell a
/// sequential reader that fell back to exact-byte reads, or a window that kept stalling.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct HandleStats {
    pub(super) reads: u64,
    pub(super) sequential: u64,
    pub(super) direct: u64,
    pub(super) unaligned: u64,
    pub(super) bytes: u64,
    /// Reads that found a chunk they needed not yet arrived.
    pub(super) waited: u64,
    pub(super) wait: Duration,
}

/// The open file handles of a mount.
#[derive(Default)]
pub(super) struct Handles {
    open: Mutex<HashMap<u64, Arc<Handle>>>,
    /// Opens the kernel took in passthrough mode.
    passthrough_opens: AtomicU64,
    /// Files put into the kernel's page cache whole at their open.
    given_at_open: AtomicU64,
}

impl Handles {
    /// The handle `fh`, if open.
    pub(super) fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        lock(&self.open).get(&fh).cloned()
    }
}

/// The result of an open.
#[derive(Debug)]
pub struct Opened {
    /// File handle to pass back on read/release.
    pub fh: u64,
    /// The kernel may keep its page cache from earlier opens.
    pub keep_cache: bool,
    /// The complete, verified local copy, for a passthrough open (`--cache-dir`).
    pub local: Option<std::fs::File>,
    /// Serve this handle with direct I/O: another handle of the file is open with
    /// passthrough, and the kernel allows no cached open beside it.
    pub direct_io: bool,
    /// The version opened.
    pub version: Version,
    /// The file changed since the mount last told the kernel its attributes: they must be
    /// invalidated before the open is answered (close-to-open), so the size the kernel
    /// reads up to is the new one.
    pub attr_changed: bool,
    /// The whole file, fetched ahead and in memory, for the kernel's page cache: the
    /// adapter stores it there before it answers the open (with `keep_cache`), so the
    /// reader's reads never come to the mount. Only for a first open of a small file that
    /// no other handle has open (see [`Fs::open`]).
    pub pages: Option<Bytes>,
}

impl Fs {
    /// Opens file `ino` for reading.
    ///
    /// Close-to-open: the file's version is taken from what the server said less than
    /// `open_ttl` ago (and less than `attr_ttl`), else asked for (see [`Fs::revalidate`]).
    ///
    /// # Errors
    /// EROFS for any write access; EISDIR; ESTALE for an unknown inode or one whose
    /// object was replaced on the server (the kernel then looks the name up again);
    /// server errors.
    pub async fn open(&self, ino: u64, write: bool) -> Result<Opened, Error> {
        if write {
            return Err(Error::errno(libc::EROFS, "read-only mount"));
        }
        // Close-to-open: the version is what the server said within the open TTL.
        let (path, known, fetched) = self.inodes.path_and_attr(ino)?;
        // In a directory too large to list again quickly (a listing of 100,000 names takes
        // longer than the open TTL to arrive), the files after this one are stat'ed ahead,
        // many at once, so their opens find fresh versions without a round trip each.
        let ttl = open_max_age(&self.cfg);
        let (parent_path, name) = ferry_proto::name::split(&path);
        let large_dir = self
            .inodes
            .ino_of(&parent_path)
            .filter(|_| !ttl.is_zero())
            .and_then(|p| {
                let (_, a) = self.inodes.path_and_fresh_attr(p, Duration::MAX).ok()?;
                a.filter(|a| a.size > super::listing::DIR_AHEAD_MAX_SIZE)
                    .map(|_| p)
            });
        let by_name = large_dir.is_some_and(|p| self.stat_ahead(p, &parent_path, &name));
        let ahead = large_dir
            .and_then(|_| self.stat_fresh(&path, ttl))
            .filter(|(a, _)| a.same_object(&known));
        let (attr, before) = if fetched.elapsed() < ttl {
            (known, known.version())
        } else if let Some((a, at)) = ahead {
            (a, self.refreshed(ino, &path, a, at)?)
        } else if self.client.live_streams() == 0 {
            // The server is unreachable: the last version the server reported (whose
            // chunks the local copy may hold) rather than an open that waits for it.
            debug!(
                "/{}: server unreachable, opened at the version seen {:?} ago",
                String::from_utf8_lossy(&path),
                fetched.elapsed()
            );
            (known, known.version())
        } else {
            // A large directory is not listed again for one open: its file is stat'ed.
            let ttl = if large_dir.is_some() {
                Duration::ZERO
            } else {
                ttl
            };
            match self.revalidate(ino, &path, ttl).await {
                Ok(r) => r,
                Err(e) if e.source.as_ref().is_some_and(unreachable) => {
                    debug!(
                        "/{}: {e}; opened at the version seen {:?} ago",
                        String::from_utf8_lossy(&path),
                        fetched.elapsed()
                    );
                    (known, known.version())
                }
                Err(e) => return Err(e),
            }
        };
        if attr.kind == FileKind::Directory {
            return Err(Error::errno(libc::EISDIR, "is a directory"));
        }
        let version = attr.version();
        // The kernel holds attributes of the version the mount held: stale now.
        let attr_changed = before != version;
        let (keep_cache, changed) = self.inodes.opened(ino, version);
        if changed {
            self.store.invalidate(file_id(&path));
        }
        let mut handle = Handle {
            key: key_at(path, version),
            prefetcher: Mutex::new(Prefetcher::new(self.cfg.prefetch)),
            stats: Mutex::new(HandleStats::default()),
            opened: Instant::now(),
            passthrough: AtomicBool::new(false),
            changed: AtomicBool::new(false),
            parts_read: Mutex::new(HashMap::new()),
            page_cache: false,
        };
        // Passthrough when the local copy holds this version complete and verified.
        let mut local = match self.store.backing() {
            Some(b) if self.cfg.passthrough => {
                let (b, k) = (b.clone(), handle.key.clone());
                tokio::task::spawn_blocking(move || b.complete_file(&k))
                    .await
                    .ok()
                    .flatten()
            }
            _ => None,
        };
        let fh = self.next_fh();
        let key = handle.key.clone();
        let (direct_io, alone) = {
            let mut handles = lock(&self.handles.open);
            let (mut alone, mut cached, mut passthrough) = (true, false, false);
            for o in handles.values().filter(|o| o.key.id == handle.key.id) {
                alone = false;
                // Only a mount with passthrough has modes to reconcile.
                if !self.cfg.passthrough {
                    break;
                }
                if o.passthrough.load(Ordering::Relaxed) {
                    passthrough = true;
                } else {
                    cached = true;
                }
            }
            if cached {
                local = None;
            }
            handle.passthrough.store(local.is_some(), Ordering::Relaxed);
            let direct_io = passthrough && local.is_none();
            handle.page_cache = local.is_none() && !direct_io;
            handles.insert(fh, Arc::new(handle));
            (direct_io, alone)
        };
        // A first open (the kernel holds no pages of the file, nor attributes of another
        // version) of a small file held whole in memory, which no other handle has open:
        // its bytes go into the page cache before the open is answered, so the reader's
        // reads are served there without a request each (a tree copy opens thousands of
        // small files fetched ahead). Not beside another handle: a read of it in flight
        // could hold the pages the store has to lock until its reply, which a FUSE thread
        // blocked in the store might be the one to send.
        let first = !keep_cache && !changed && !attr_changed;
        let pages = (first && alone && local.is_none() && !direct_io)
            .then(|| self.whole_in_memory(&key))
            .flatten();
        if pages.is_some() {
            self.store.consumed(&key, 0);
        }
        if local.is_none() {
            if looks_sparse(&attr, self.store.chunk_size()) && self.client.live_streams() > 0 {
                self.map_holes(&key).await;
            }
            self.pipeline_next_files(ino, &key, by_name).await;
        }
        Ok(Opened {
            fh,
            keep_cache: (keep_cache || pages.is_some()) && !direct_io,
            pages,
            local,
            direct_io,
            version,
            attr_changed,
        })
    }

    /// Whether file `ino`, as last listed or stat'ed, fits one chunk held in memory now: its
    /// first open would hand it to the kernel's page cache ([`Opened::pages`]).
    pub fn held_whole(&self, ino: u64) -> bool {
        let Ok((path, attr, _)) = self.inodes.path_and_attr(ino) else {
            return false;
        };
        self.whole_in_memory(&key_at(path, attr.version()))
            .is_some()
    }

    /// How many of file `ino`'s chunks (as last listed or stat'ed) are in memory now.
    pub fn chunks_in_memory(&self, ino: u64) -> u64 {
        let Ok((path, attr, _)) = self.inodes.path_and_attr(ino) else {
            return 0;
        };
        let key = key_at(path, attr.version());
        (0..attr.size.div_ceil(self.store.chunk_size()))
            .filter(|&c| self.store.contains(&key, c))
            .count() as u64
    }

    /// The whole of `key`'s file when it fits one chunk and that chunk is in memory now.
    fn whole_in_memory(&self, key: &FileKey) -> Option<Bytes> {
        let size = key.version.size;
        if size == 0 || size > self.store.chunk_size() {
            return None;
        }
        self.store.ready(key, 0).filter(|d| d.len() as u64 == size)
    }

    /// Fetches the data map of `key`'s file unless held: then its holes are never fetched
    /// (the chunk store makes their zeros) and `lseek` finds them. Returns the map, if the
    /// server gave one for `key`'s version.
    async fn map_holes(&self, key: &FileKey) -> Option<Arc<Vec<(u64, u64)>>> {
        if let Some(m) = self.store.data_map(key) {
            return Some(m);
        }
        match self.client.data_map(key.path.clone()).await {
            Ok(Some((version, extents))) => {
                self.store.set_data_map(key, version, extents);
                self.store.data_map(key)
            }
            Ok(None) => None,
            Err(e) => {
                debug!(
                    "/{}: data map: {e}; its holes are read as data",
                    String::from_utf8_lossy(&key.path)
                );
                None
            }
        }
    }

    /// `lseek(SEEK_DATA)` (`data`) or `lseek(SEEK_HOLE)` from `offset` in open file `fh` of
    /// inode `ino`, answered from the file's data map (fetched if the file looks sparse and
    /// no map is held); a file that does not look sparse is all data, as on a file system
    /// without holes.
    ///
    /// # Errors
    /// ENXIO past the end (or no data after `offset`); EBADF for an unknown handle.
    pub async fn seek(&self, ino: u64, fh: u64, offset: u64, data: bool) -> Result<u64, Error> {
        let h = self
            .handles
            .get(fh)
            .ok_or_else(|| Error::errno(libc::EBADF, "unknown file handle"))?;
        let size = h.key.version.size;
        let sparse = self
            .inodes
            .path_and_attr(ino)
            .is_ok_and(|(_, a, _)| looks_sparse(&a, self.store.chunk_size()));
        let map = match self.store.data_map(&h.key) {
            Some(m) => Some(m),
            None if sparse => self.map_holes(&h.key).await,
            None => None,
        };
        let all = [(0, size)];
        let extents = map.as_deref().map_or(&all[..], Vec::as_slice);
        let at = if data {
            ferry_proto::extents::seek_data(extents, size, offset)
        } else {
            ferry_proto::extents::seek_hole(extents, size, offset)
        };
        at.ok_or_else(|| Error::errno(libc::ENXIO, "no data past this offset"))
    }

    /// Counts an open the kernel took in passthrough mode.
    pub fn count_passthrough_open(&self) {
        self.handles
            .passthrough_opens
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a file whose bytes the kernel took into its page cache at its open.
    pub fn count_given_at_open(&self) {
        self.handles.given_at_open.fetch_add(1, Ordering::Relaxed);
    }

    /// Files given to the kernel's page cache at their open so far.
    pub fn given_at_open(&self) -> u64 {
        self.handles.given_at_open.load(Ordering::Relaxed)
    }

    /// Opens served with passthrough so far.
    pub fn passthrough_opens(&self) -> u64 {
        self.handles.passthrough_opens.load(Ordering::Relaxed)
    }

    /// The kernel did not take handle `fh` in passthrough mode: it is served normally.
    pub fn passthrough_refused(&self, fh: u64) {
        if let Some(h) = lock(&self.handles.open).get(&fh) {
            h.passthrough.store(false, Ordering::Relaxed);
        }
    }

    /// Closes a file handle (an unknown one is ignored), logging what it did.
    pub fn release(&self, fh: u64) {
        let Some(h) = lock(&self.handles.open).remove(&fh) else {
            return;
        };
        let st = *lock(&h.stats);
        if st.reads > 0 {
            let chunks = self.store.stats();
            debug!(
                path = %String::from_utf8_lossy(&h.key.path),
                secs = h.opened.elapsed().as_secs_f64(),
                reads = st.reads,
                sequential = st.sequential,
                direct = st.direct,
                unaligned = st.unaligned,
                bytes = st.bytes,
                waited = st.waited,
                wait_ms = st.wait.as_millis() as u64,
                store_fetched = chunks.fetched,
                store_evicted = chunks.evicted,
                "released"
            );
        }
    }
}
