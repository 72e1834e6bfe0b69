//! In-memory chunk store: single-flight fetching, a memory budget, LRU eviction, and the
//! one home of the read policy "local copy, else network, then store".
//!
//! A chunk is `chunk_size` bytes of one version of one file (the last chunk may be
//! shorter). The first caller of [`ChunkStore::get`] for a chunk starts the fetch; every
//! other caller — another reader, or the prefetcher — awaits the same fetch, so each chunk
//! travels once however many readers want it.
//!
//! Classes: a chunk a reader waits for ([`ChunkStore::get`], [`ChunkStore::read_range`],
//! and [`ChunkStore::start`], which puts a reader's own chunks in flight before it waits)
//! is fetched with the client's own class (demand for a mount's client); one fetched
//! ahead ([`ChunkStore::prefetch`], [`ChunkStore::prefetch_range`], [`ChunkStore::expect`])
//! as prediction (or the client's class, if less urgent), so the server and the scheduler
//! put readers' waits first.
//!
//! Memory: every chunk present or in flight counts against the budget. Prefetches are not
//! started when the budget is used up; demand reads always proceed and then evict the
//! least recently used completed chunks (a chunk enters the LRU order when it completes;
//! chunks in flight are never evicted). Chunks a sequential reader has read to their end
//! leave at once (the kernel page cache holds them now); for a minute the store remembers
//! which files' first chunks left so ([`ChunkStore::read_lately`]), so that a tree walk's
//! predictions do not fetch them again (until the mount finds the kernel dropped such pages:
//! [`ChunkStore::forget_read_lately`]). Every operation takes one short
//! lock and is O(1) (`chunks/table.rs`); the counters are atomics.
//!
//! Runs: from a source that answers long reads best (an S3 store, where every GET costs a
//! request and the store a lookup of the object), chunks fetched ahead of a sequential
//! reader go together, up to [`RUN_BYTES`] in one read, in groups aligned to that size
//! ([`ChunkStore::prefetch_range`]); each chunk of a run still has its own slot, and one
//! whose bytes the run does not bring is fetched on its own.
//!
//! Local copy: a chunk the [`ChunkBacking`] holds for the key's version is read from it
//! instead of the network ([`ChunkStore::read_range`], `load_local`); every whole chunk
//! fetched of the key's version is handed to it through a write-back queue
//! (`chunks/writeback.rs`) drained by two named writer threads. That queue holds at most a
//! quarter of the store's budget (at least one chunk), in addition to the budget: when
//! the disk is slower than the network and the queue is full, the chunk is not stored
//! (counted in [`ChunkStats::store_skipped`]) and is fetched again by a later read or the
//! mirror. [`ChunkStore::flush`] waits for the queue to drain (at unmount).

mod table;
mod writeback;

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use ferry_proto::{Class, Version};
use tokio::sync::{oneshot, OnceCell};

use crate::error::{ChangedRead, ClientError};
use crate::pool::Client;
use table::Table;
use writeback::WriteBack;

/// Identifies the contents of one file: the caller's id for it plus its version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FileKey {
    /// Caller-chosen stable id (the mount uses its inode number).
    pub id: u64,
    /// Version the caller expects; chunks of other versions are never returned for it.
    pub version: Version,
    /// Path relative to the export root, as sent to the server.
    pub path: Bytes,
}

struct Slot {
    cell: OnceCell<Result<(Bytes, Version), ClientError>>,
    len: usize,
}

/// A local copy behind the store (ferry-cache's): consulted before the network, and
/// given every whole chunk fetched. Its methods block (local disk I/O); the store calls
/// them on the blocking pool (`load`) or its writer threads (`store`); `may_hold` is
/// the exception, called on async threads before a read decides to go to the blocking pool.
pub trait ChunkBacking: Send + Sync + 'static {
    /// Bytes `range` of chunk `index` (`len` bytes in all) of `key`, if the local copy
    /// holds the chunk for exactly `key.version`. Only the range is read: a 16 KiB random
    /// read of a chunk of 1 MiB costs 16 KiB of local I/O.
    fn load(&self, key: &FileKey, index: u64, len: usize, range: Range<usize>) -> Option<Bytes>;
    /// Whether the local copy may hold chunk `index` of `key`: a check of its state in
    /// memory, with no I/O, so that a read the local copy cannot answer does not wait for
    /// a blocking thread first. `false` only when `load` would certainly return `None`.
    fn may_hold(&self, _key: &FileKey, _index: u64) -> bool {
        true
    }
    /// Chunk `index` of `key`, just fetched, of `key.version`.
    fn store(&self, key: &FileKey, index: u64, data: &Bytes);
    /// The local file of `key`, opened for reading, if the copy holds all of
    /// `key.version` and verified it (then the kernel may read it directly).
    fn complete_file(&self, _key: &FileKey) -> Option<std::fs::File> {
        None
    }
}

/// Statistics for tests and benchmarks.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChunkStats {
    /// Chunks fetched from the server.
    pub fetched: u64,
    /// Chunks (and pieces of random reads) answered with zeros from a data map: wholly in
    /// a hole of a sparse file, never fetched.
    pub holes: u64,
    /// Chunks read from the local copy.
    pub local: u64,
    /// `get` calls answered by a chunk present or already in flight.
    pub shared: u64,
    /// Chunks evicted.
    pub evicted: u64,
    /// Whole chunks fetched that were not stored in the local copy because its
    /// write-back queue was full (the disk is slower than the network).
    pub store_skipped: u64,
    /// Bytes of chunks waiting in the write-back queue or being written now.
    pub store_queued_bytes: u64,
}

/// The counters behind [`ChunkStats`], updated without a lock.
#[derive(Default)]
struct Counters {
    fetched: AtomicU64,
    holes: AtomicU64,
    local: AtomicU64,
    shared: AtomicU64,
    evicted: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Most bytes one read ahead brings from a source that prefers long reads (see the module
/// docs). Measured over a 3-node Garage cluster at 1 Gbit/s: 1 MiB GETs of a 1 GiB object
/// put 8 % more bytes on the link than the object itself (each GET makes the store read the
/// object's list of blocks from another node), 8 MiB ones 1-2 %.
pub const RUN_BYTES: u64 = 8 << 20;

/// The store. Shared by all open files of a mount (or all workers of a mirror).
pub struct ChunkStore {
    client: Client,
    /// Chunks fetched ahead go in runs ([`ChunkStore::prefetch_range`]).
    runs: bool,
    /// The same pool, for fetches ahead of readers.
    predict: Client,
    chunk_size: u64,
    budget: usize,
    table: Mutex<Table<Arc<Slot>>>,
    counters: Counters,
    backing: Option<Arc<dyn ChunkBacking>>,
    /// Present with `backing`.
    write_back: Option<WriteBack>,
    /// Data maps of sparse files ([`ChunkStore::set_data_map`]).
    maps: Mutex<DataMaps>,
    /// Files whose first chunk a reader read lately ([`ChunkStore::read_lately`]).
    /// By file id: the version read and when; at most [`FIRST_READ_HELD`].
    first_read: Mutex<lru::LruCache<u64, (Version, std::time::Instant)>>,
}

/// Reads of first chunks remembered at most (about 40 bytes each).
const FIRST_READ_HELD: usize = 1 << 16;
/// How long a read of a first chunk keeps predictions from fetching it again.
const FIRST_READ_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// Data maps by file id: the version mapped and its data extents; at most
/// [`DATA_MAPS_HELD`], the oldest leaving first.
#[derive(Default)]
struct DataMaps {
    by_id: HashMap<u64, (Version, Extents)>,
    order: VecDeque<u64>,
}

/// A data map's data extents `(offset, length)`, sorted.
pub type Extents = Arc<Vec<(u64, u64)>>;

/// Data maps held at most.
const DATA_MAPS_HELD: usize = 1024;

/// Zeros for chunks in holes, shared (never written: it stays in untouched zero pages).
static ZEROS: [u8; ferry_proto::MAX_CHUNK_SIZE as usize] =
    [0; ferry_proto::MAX_CHUNK_SIZE as usize];

/// `len` zeros without allocating.
fn zeros(len: usize) -> Bytes {
    Bytes::from_static(&ZEROS[..len])
}

impl std::fmt::Debug for ChunkStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkStore")
            .field("chunk_size", &self.chunk_size)
            .field("budget", &self.budget)
            .finish()
    }
}

impl ChunkStore {
    /// A store over `client` holding at most about `budget` bytes.
    pub fn new(client: Client, budget: usize) -> Arc<ChunkStore> {
        Self::with_backing(client, budget, None)
    }

    /// A store with a local copy behind it: chunks it holds are read from it, and every
    /// whole chunk fetched is queued for it (see the module docs for the queue's budget).
    pub fn with_backing(
        client: Client,
        budget: usize,
        backing: Option<Arc<dyn ChunkBacking>>,
    ) -> Arc<ChunkStore> {
        let chunk_size = u64::from(client.session().chunk_size);
        let write_back = backing.as_ref().map(|b| {
            let room = (budget / 4).max(chunk_size as usize);
            WriteBack::start(b.clone(), room, writeback::WRITERS)
        });
        let predict = client.with_class(client.class().max(Class::Prediction));
        Arc::new(ChunkStore {
            predict,
            runs: client.run_bytes().is_some(),
            client,
            chunk_size,
            budget,
            table: Mutex::new(Table::new()),
            counters: Counters::default(),
            backing,
            write_back,
            maps: Mutex::new(DataMaps::default()),
            first_read: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(FIRST_READ_HELD).expect("nonzero"),
            )),
        })
    }

    /// Records the data map of `key`'s file (sorted data extents; the rest is holes) for
    /// `version`: while it is `key`'s version, chunks and ranges wholly in a hole are zeros
    /// made here, never fetched (and reach the local copy as holes).
    pub fn set_data_map(&self, key: &FileKey, version: Version, extents: Vec<(u64, u64)>) {
        let mut m = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if m.by_id
            .insert(key.id, (version, Arc::new(extents)))
            .is_none()
        {
            m.order.push_back(key.id);
        }
        while m.order.len() > DATA_MAPS_HELD {
            if let Some(old) = m.order.pop_front() {
                m.by_id.remove(&old);
            }
        }
    }

    /// The data map held for `key`'s version, if any.
    pub fn data_map(&self, key: &FileKey) -> Option<Extents> {
        let m = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        m.by_id
            .get(&key.id)
            .filter(|(v, _)| *v == key.version)
            .map(|(_, e)| e.clone())
    }

    /// Whether `offset..offset + len` of `key` lies wholly in a hole of its data map.
    fn in_hole(&self, key: &FileKey, offset: u64, len: u64) -> bool {
        self.data_map(key)
            .is_some_and(|e| !ferry_proto::extents::holds_data(&e, offset, len))
    }

    /// The local copy behind the store, if any.
    pub fn backing(&self) -> Option<&Arc<dyn ChunkBacking>> {
        self.backing.as_ref()
    }

    /// Chunk size in bytes.
    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Counters.
    pub fn stats(&self) -> ChunkStats {
        let c = &self.counters;
        ChunkStats {
            fetched: c.fetched.load(Ordering::Relaxed),
            holes: c.holes.load(Ordering::Relaxed),
            local: c.local.load(Ordering::Relaxed),
            shared: c.shared.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
            store_skipped: self.write_back.as_ref().map_or(0, WriteBack::skipped),
            store_queued_bytes: self.write_back.as_ref().map_or(0, |w| w.queued() as u64),
        }
    }

    /// Blocks until every chunk queued for the local copy has been handed to it (which
    /// then records it through its syncer: flush that next). Call it outside async tasks
    /// (e.g. at unmount, between `block_on`s), as it waits for the disk.
    pub fn flush(&self) {
        if let Some(w) = &self.write_back {
            w.flush();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table<Arc<Slot>>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Length of chunk `index` of a file of `size` bytes (0 past the end).
    fn chunk_len(&self, size: u64, index: u64) -> usize {
        let start = index.saturating_mul(self.chunk_size);
        size.saturating_sub(start).min(self.chunk_size) as usize
    }

    /// Finds or creates the slot for a chunk. `only_if_room`: do not create when the
    /// budget is used up (prefetch). Returns the slot and whether it was already there.
    fn slot(&self, key: &FileKey, index: u64, only_if_room: bool) -> Option<(Arc<Slot>, bool)> {
        let len = self.chunk_len(key.version.size, index);
        let id = (key.id, index);
        let mut t = self.lock();
        if let Some(slot) = t.touch(id, &key.version) {
            return Some((slot.clone(), true));
        }
        // A chunk of another version leaves first, so its bytes do not count.
        t.remove(id);
        if only_if_room && t.used() + len > self.budget {
            return None;
        }
        let slot = Arc::new(Slot {
            cell: OnceCell::new(),
            len,
        });
        t.insert(id, key.version, slot.clone(), len);
        let evicted = t.evict_to(self.budget);
        drop(t);
        bump(&self.counters.evicted, evicted);
        Some((slot, false))
    }

    /// Fetches the chunk into `slot` (local copy, else the network through `client`),
    /// unless someone else already is.
    async fn fill(
        &self,
        client: &Client,
        key: &FileKey,
        index: u64,
        slot: &Slot,
    ) -> Result<Bytes, ClientError> {
        self.fill_from(client, key, index, slot, None).await
    }

    /// As [`ChunkStore::fill`], first waiting for the bytes to arrive on `given` (see
    /// [`ChunkStore::expect`]) when there is one; when they do not, fetched as usual.
    async fn fill_from(
        &self,
        client: &Client,
        key: &FileKey,
        index: u64,
        slot: &Slot,
        given: Option<oneshot::Receiver<Bytes>>,
    ) -> Result<Bytes, ClientError> {
        let result = slot
            .cell
            .get_or_init(|| async {
                if slot.len == 0 {
                    return Ok((Bytes::new(), key.version));
                }
                if let Some(rx) = given {
                    if let Ok(data) = rx.await {
                        if data.len() == slot.len {
                            self.store_local(key, index * self.chunk_size, &data, key.version);
                            return Ok((data, key.version));
                        }
                    }
                }
                let offset = index * self.chunk_size;
                if self.in_hole(key, offset, slot.len as u64) {
                    bump(&self.counters.holes, 1);
                    let data = zeros(slot.len);
                    self.store_local(key, offset, &data, key.version);
                    return Ok((data, key.version));
                }
                if let Some(mut parts) =
                    self.load_local(key, offset, offset + slot.len as u64).await
                {
                    bump(&self.counters.local, 1);
                    return Ok((parts.pop().unwrap_or_default(), key.version));
                }
                bump(&self.counters.fetched, 1);
                let (data, version) = client
                    .read(key.path.clone(), offset, slot.len as u32)
                    .await?;
                self.store_local(key, offset, &data, version);
                Ok((data, version))
            })
            .await
            .clone();
        // Failures are not cached (the next reader retries), and neither are bytes of
        // another version than the key's: the file changed on the server. Those bytes are
        // one consistent version, what a local reader would see now: they go back to the
        // caller as [`ClientError::Changed`], who decides whether its reader may have them.
        let keep = matches!(&result, Ok((_, v)) if *v == key.version);
        let mine = |_: &Version, s: &Arc<Slot>| std::ptr::eq(Arc::as_ptr(s), slot);
        let mut t = self.lock();
        if keep {
            t.completed((key.id, index), |s| mine(&key.version, s));
        } else {
            t.remove_if((key.id, index), mine);
        }
        drop(t);
        match result {
            Ok((data, v)) if v == key.version => Ok(data),
            Ok((data, version)) => Err(ClientError::Changed(Box::new(ChangedRead {
                version,
                data,
            }))),
            Err(e) => Err(e),
        }
    }

    /// The bytes `offset..end` of `key`, in chunk-sized pieces, when the local copy holds
    /// every chunk they touch (read on the blocking pool); `None` without a local copy or
    /// when it lacks one of them.
    async fn load_local(&self, key: &FileKey, offset: u64, end: u64) -> Option<Vec<Bytes>> {
        let b = self.backing.clone()?;
        let (k, cs, size) = (key.clone(), self.chunk_size, key.version.size);
        if end <= offset || !(offset / cs..=(end - 1) / cs).all(|i| b.may_hold(key, i)) {
            return None;
        }
        tokio::task::spawn_blocking(move || {
            let mut parts = Vec::new();
            let mut pos = offset;
            while pos < end {
                let i = pos / cs;
                let len = size.saturating_sub(i * cs).min(cs) as usize;
                let lo = (pos - i * cs) as usize;
                let hi = ((end - i * cs) as usize).min(len);
                if hi <= lo {
                    return None;
                }
                let part = b.load(&k, i, len, lo..hi)?;
                if part.len() != hi - lo {
                    return None;
                }
                parts.push(part);
                pos = i * cs + hi as u64;
            }
            Some(parts)
        })
        .await
        .ok()
        .flatten()
    }

    /// Queues `data`, just fetched at `offset`, for the local copy when it is a whole
    /// chunk of `key`'s version. Written in the background by the write-back queue's
    /// threads: the reader does not wait for the disk, and a full queue skips the chunk.
    fn store_local(&self, key: &FileKey, offset: u64, data: &Bytes, version: Version) {
        let Some(w) = &self.write_back else { return };
        let whole = key.version.size.saturating_sub(offset).min(self.chunk_size);
        if version != key.version
            || !offset.is_multiple_of(self.chunk_size)
            || data.len() as u64 != whole
        {
            return;
        }
        // Zeros of a hole are written as a hole: they weigh little in the queue.
        let hole = data.as_ptr() == ZEROS.as_ptr();
        let weight = if hole {
            writeback::HOLE_WEIGHT
        } else {
            data.len()
        };
        w.offer(key.clone(), offset / self.chunk_size, data.clone(), weight);
    }

    /// Exactly the bytes `offset..end` of `key`, outside the store (a random read): from
    /// the local copy when it holds every chunk touched, else from the network in
    /// chunk-sized requests sent together; whole chunks of `key`'s version fetched on the
    /// way go to the local copy. Short only at the end of the file.
    ///
    /// # Errors
    /// A fetch failed; [`ClientError::Changed`] when a piece came from another version
    /// than `key`'s (with all the bytes fetched, up to the first short piece).
    pub async fn read_range(
        &self,
        key: &FileKey,
        offset: u64,
        end: u64,
    ) -> Result<Bytes, ClientError> {
        if let Some(parts) = self.load_local(key, offset, end).await {
            return Ok(concat(parts));
        }
        let cs = self.chunk_size;
        let mut tasks = Vec::new();
        let mut pos = offset;
        while pos < end {
            let len = (end - pos).min(cs - pos % cs);
            let client = self.client.clone();
            let path = key.path.clone();
            let task = if self.in_hole(key, pos, len) {
                bump(&self.counters.holes, 1);
                let done = (zeros(len as usize), key.version);
                tokio::spawn(async move { Ok(done) })
            } else {
                tokio::spawn(async move { client.read(path, pos, len as u32).await })
            };
            tasks.push((pos, len, task));
            pos += len;
        }
        let mut parts = Vec::with_capacity(tasks.len());
        let mut other = None;
        for (at, len, t) in tasks {
            let (data, version) = t
                .await
                .map_err(|e| ClientError::Protocol(format!("read task failed: {e}")))??;
            self.store_local(key, at, &data, version);
            if version != key.version {
                other = Some(version);
            }
            let short = (data.len() as u64) < len;
            parts.push(data);
            if short {
                break;
            }
        }
        match other {
            None => Ok(concat(parts)),
            Some(version) => Err(ClientError::Changed(Box::new(ChangedRead {
                version,
                data: concat(parts),
            }))),
        }
    }

    /// Chunk `index` of `key`, fetched if needed (single-flight).
    ///
    /// # Errors
    /// The fetch failed (the error is not cached).
    pub async fn get(&self, key: &FileKey, index: u64) -> Result<Bytes, ClientError> {
        let (slot, existed) = self
            .slot(key, index, false)
            .expect("demand reads always get a slot");
        if existed {
            bump(&self.counters.shared, 1);
        }
        self.fill(&self.client, key, index, &slot).await
    }

    /// Starts fetching chunk `index` in the background unless present, in flight, or
    /// over budget. Returns false when the budget stopped it.
    pub fn prefetch(self: &Arc<Self>, key: &FileKey, index: u64) -> bool {
        match self.slot(key, index, true) {
            None => false,
            Some((_, true)) => true,
            Some((slot, false)) => {
                self.fill_ahead(key, index, slot, None);
                true
            }
        }
    }

    /// Fills `slot`, chunk `index` of `key`, in a task of its own as a prediction (from
    /// `given` first, when there is one: see [`ChunkStore::fill_from`]).
    fn fill_ahead(
        self: &Arc<Self>,
        key: &FileKey,
        index: u64,
        slot: Arc<Slot>,
        given: Option<oneshot::Receiver<Bytes>>,
    ) {
        self.fill_in_task(key, index, slot, given, self.predict.clone());
    }

    /// Fills `slot`, chunk `index` of `key`, in a task of its own through `client` (the
    /// store's own, or its prediction handle), from `given` first when there is one.
    fn fill_in_task(
        self: &Arc<Self>,
        key: &FileKey,
        index: u64,
        slot: Arc<Slot>,
        given: Option<oneshot::Receiver<Bytes>>,
        client: Client,
    ) {
        let (me, key) = (self.clone(), key.clone());
        tokio::spawn(async move {
            let _ = me.fill_from(&client, &key, index, &slot, given).await;
        });
    }

    /// Starts fetching chunks `from..=to` of `key` ahead of a reader whose last chunk is
    /// `reader`, as [`ChunkStore::prefetch`] does each. From a source that prefers long
    /// reads, the chunks missing within one group of [`RUN_BYTES`] (aligned) go as one
    /// read; a group the window does not reach the end of yet waits for a later call,
    /// unless it starts within a group of the reader. Returns false when the budget
    /// stopped it.
    pub fn prefetch_range(
        self: &Arc<Self>,
        key: &FileKey,
        reader: u64,
        from: u64,
        to: u64,
    ) -> bool {
        if !self.runs {
            return (from..=to).all(|i| self.prefetch(key, i));
        }
        let per = RUN_BYTES / self.chunk_size;
        let last = key.version.size.saturating_sub(1) / self.chunk_size;
        let mut i = from;
        while i <= to {
            let group_end = (i / per + 1) * per - 1;
            let end = group_end.min(to);
            if end < group_end.min(last) && i > reader + per {
                // The window reaches into this group but not to its end: later.
                return true;
            }
            let mut run = Vec::new();
            for j in i..=end {
                let offset = j * self.chunk_size;
                let local = self.backing.as_ref().is_some_and(|b| b.may_hold(key, j))
                    || self.in_hole(key, offset, self.chunk_len(key.version.size, j) as u64);
                if local {
                    self.start_run(key, std::mem::take(&mut run));
                    if !self.prefetch(key, j) {
                        return false;
                    }
                    continue;
                }
                match self.slot(key, j, true) {
                    None => {
                        self.start_run(key, run);
                        return false;
                    }
                    Some((_, true)) => self.start_run(key, std::mem::take(&mut run)),
                    Some((slot, false)) => run.push((j, slot)),
                }
            }
            self.start_run(key, run);
            i = end + 1;
        }
        true
    }

    /// Fetches consecutive chunks `run` (their slots just made) with one read; each
    /// fetched on its own when the read does not bring its bytes.
    fn start_run(self: &Arc<Self>, key: &FileKey, run: Vec<(u64, Arc<Slot>)>) {
        let Some(&(first, _)) = run.first() else {
            return;
        };
        if run.len() == 1 {
            let (index, slot) = run.into_iter().next().expect("one");
            self.fill_ahead(key, index, slot, None);
            return;
        }
        let mut senders = Vec::with_capacity(run.len());
        for (index, slot) in run {
            let (tx, rx) = oneshot::channel();
            senders.push((tx, slot.len));
            self.fill_ahead(key, index, slot, Some(rx));
        }
        let total: usize = senders.iter().map(|(_, len)| len).sum();
        let (me, key) = (self.clone(), key.clone());
        tokio::spawn(async move {
            let offset = first * me.chunk_size;
            let read = me
                .predict
                .read(key.path.clone(), offset, total as u32)
                .await;
            // Another version, a short read or an error: the senders go unsent and each
            // chunk is fetched on its own (and the change found there, as for any chunk).
            if let Ok((data, version)) = read {
                if version == key.version && data.len() == total {
                    bump(&me.counters.fetched, senders.len() as u64);
                    let mut at = 0;
                    for (tx, len) in senders {
                        let _ = tx.send(data.slice(at..at + len));
                        at += len;
                    }
                }
            }
        });
    }

    /// Makes a place for the whole of small file `key` (one chunk) that another request is
    /// bringing (its directory listing's contents): readers of the chunk wait for the bytes
    /// sent on the returned sender, or, if it is dropped unsent, for a fetch as usual.
    /// `None` when the file does not fit in one chunk, is held or on its way already, or
    /// the budget has no room.
    pub fn expect(self: &Arc<Self>, key: &FileKey) -> Option<oneshot::Sender<Bytes>> {
        if key.version.size == 0 || key.version.size > self.chunk_size {
            return None;
        }
        let (slot, false) = self.slot(key, 0, true)? else {
            return None;
        };
        let (tx, rx) = oneshot::channel();
        self.fill_ahead(key, 0, slot, Some(rx));
        Some(tx)
    }

    /// Starts fetching chunk `index` in the background now, whatever the budget, with the
    /// client's own class: a reader is about to wait for it (a reader's own chunks, all in
    /// flight before it waits for the first). A no-op when present or in flight.
    pub fn start(self: &Arc<Self>, key: &FileKey, index: u64) {
        self.start_within(key, index, false);
    }

    /// As [`ChunkStore::start`], but only when the budget has room for the chunk: nothing
    /// held is evicted for it (a reader is not waiting yet, and the chunks ahead of a walk
    /// fill the budget; one evicted there is fetched again, one by one). Returns whether
    /// it is present or on its way now.
    pub fn start_if_room(self: &Arc<Self>, key: &FileKey, index: u64) -> bool {
        self.start_within(key, index, true)
    }

    /// [`ChunkStore::start`] (`only_if_room`: [`ChunkStore::start_if_room`]); whether the
    /// chunk is present or on its way now.
    fn start_within(self: &Arc<Self>, key: &FileKey, index: u64, only_if_room: bool) -> bool {
        match self.slot(key, index, only_if_room) {
            Some((slot, false)) => {
                self.fill_in_task(key, index, slot, None, self.client.clone());
                true
            }
            Some((_, true)) => true,
            None => false,
        }
    }

    /// Whether chunk `index` of `key` is present or on its way (not failed).
    pub fn held(&self, key: &FileKey, index: u64) -> bool {
        let t = self.lock();
        t.peek((key.id, index))
            .is_some_and(|(v, s)| *v == key.version && !matches!(s.cell.get(), Some(Err(_))))
    }

    /// Whether chunk `index` of `key` is present (complete and successful).
    pub fn contains(&self, key: &FileKey, index: u64) -> bool {
        let t = self.lock();
        t.peek((key.id, index))
            .is_some_and(|(v, s)| *v == key.version && matches!(s.cell.get(), Some(Ok(_))))
    }

    /// Chunk `index` of `key`'s version when it is present now (complete, of that version),
    /// without waiting or fetching; `None` when absent or still on its way.
    pub fn ready(&self, key: &FileKey, index: u64) -> Option<Bytes> {
        let t = self.lock();
        match t.peek((key.id, index)) {
            Some((v, s)) if *v == key.version => match s.cell.get() {
                Some(Ok((data, got))) if *got == key.version => Some(data.clone()),
                _ => None,
            },
            _ => None,
        }
    }

    /// A sequential reader has read this chunk to its end: the kernel page cache holds
    /// those bytes now (and serves every other reader of the file from it), so the chunk
    /// leaves the store at once, making room for the window ahead.
    pub fn consumed(&self, key: &FileKey, index: u64) {
        self.lock().remove_if((key.id, index), |v, s| {
            *v == key.version && s.cell.initialized()
        });
        if index == 0 {
            self.first_read
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .put(key.id, (key.version, std::time::Instant::now()));
        }
    }

    /// Whether a reader read the first chunk of `key`'s version to its end within the last
    /// minute ([`ChunkStore::consumed`]): a walk's predictions skip such a file rather than
    /// fetch it again (a directory listed again while a copy goes on hands its files to
    /// the prefetcher afresh; from an S3 store each costs a request). A reader of it still
    /// gets it: from the page cache, or fetched on demand.
    pub fn read_lately(&self, key: &FileKey) -> bool {
        let f = self.first_read.lock().unwrap_or_else(|e| e.into_inner());
        f.peek(&key.id)
            .is_some_and(|(v, at)| *v == key.version && at.elapsed() < FIRST_READ_FOR)
    }

    /// Forgets which files were read lately ([`ChunkStore::read_lately`]): the kernel was
    /// found not to hold the pages of one of them, so walks over them fetch them ahead again.
    pub fn forget_read_lately(&self) {
        self.first_read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Drops every chunk of file `id`.
    pub fn invalidate(&self, id: u64) {
        self.lock().invalidate(id);
    }

    /// The most bytes the store holds.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes currently accounted (present or in flight).
    pub fn used(&self) -> usize {
        self.lock().used()
    }
}

/// The parts joined into one buffer (no copy for a single part).
pub fn concat(mut parts: Vec<Bytes>) -> Bytes {
    match parts.len() {
        0 => Bytes::new(),
        1 => parts.pop().unwrap_or_default(),
        _ => {
            let mut out = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
            for p in parts {
                out.extend_from_slice(&p);
            }
            out.freeze()
        }
    }
}
