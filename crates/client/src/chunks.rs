//! In-memory chunk store: single-flight fetching, a memory budget, LRU eviction.
//!
//! A chunk is `chunk_size` bytes of one version of one file (the last chunk may be
//! shorter). The first caller of [`ChunkStore::get`] for a chunk starts the fetch; every
//! other caller — another reader, or the prefetcher — awaits the same fetch, so each chunk
//! travels once however many readers want it.
//!
//! Memory: every chunk present or in flight counts against the budget. Prefetches are not
//! started when the budget is used up; demand reads always proceed and then evict the
//! least recently used. Chunks a sequential reader has read to their end leave at once
//! (the kernel page cache holds them now).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use ferry_proto::Version;
use tokio::sync::OnceCell;

use crate::error::ClientError;
use crate::pool::Client;

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

struct Entry {
    version: Version,
    slot: Arc<Slot>,
    /// Recency, for LRU eviction.
    tick: u64,
}

struct State {
    entries: HashMap<(u64, u64), Entry>,
    used: usize,
    tick: u64,
}

/// A local copy behind the store (ferry-cache's): consulted before the network, and
/// given every chunk fetched. Its methods block (local disk I/O); the store calls them on
/// the blocking pool.
pub trait ChunkBacking: Send + Sync + 'static {
    /// Chunk `index` (`len` bytes) of `key`, if the local copy holds it for exactly
    /// `key.version`.
    fn load(&self, key: &FileKey, index: u64, len: usize) -> Option<Bytes>;
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
    /// Chunks read from the local copy.
    pub local: u64,
    /// `get` calls answered by a chunk present or already in flight.
    pub shared: u64,
    /// Chunks evicted.
    pub evicted: u64,
}

/// The store. Shared by all open files of a mount (or all workers of a mirror).
pub struct ChunkStore {
    client: Client,
    chunk_size: u64,
    budget: usize,
    state: Mutex<State>,
    stats: Mutex<ChunkStats>,
    backing: Option<Arc<dyn ChunkBacking>>,
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
    /// chunk fetched is handed to it.
    pub fn with_backing(
        client: Client,
        budget: usize,
        backing: Option<Arc<dyn ChunkBacking>>,
    ) -> Arc<ChunkStore> {
        let chunk_size = u64::from(client.session().chunk_size);
        Arc::new(ChunkStore {
            client,
            chunk_size,
            budget,
            state: Mutex::new(State {
                entries: HashMap::new(),
                used: 0,
                tick: 1,
            }),
            stats: Mutex::new(ChunkStats::default()),
            backing,
        })
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
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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
        let mut st = self.lock();
        st.tick += 1;
        let tick = st.tick;
        if let Some(e) = st.entries.get_mut(&(key.id, index)) {
            if e.version == key.version {
                e.tick = tick;
                return Some((e.slot.clone(), true));
            }
        }
        if let Some(old) = st.entries.remove(&(key.id, index)) {
            st.used -= old.slot.len;
        }
        if only_if_room && st.used + len > self.budget {
            return None;
        }
        let slot = Arc::new(Slot {
            cell: OnceCell::new(),
            len,
        });
        st.entries.insert(
            (key.id, index),
            Entry {
                version: key.version,
                slot: slot.clone(),
                tick,
            },
        );
        st.used += len;
        self.evict_locked(&mut st);
        Some((slot, false))
    }

    /// Evicts completed chunks, least recently used first, until within budget.
    fn evict_locked(&self, st: &mut State) {
        while st.used > self.budget {
            let victim = st
                .entries
                .iter()
                .filter(|(_, e)| e.slot.cell.initialized())
                .min_by_key(|(_, e)| e.tick)
                .map(|(k, _)| *k);
            let Some(k) = victim else { break };
            if let Some(e) = st.entries.remove(&k) {
                st.used -= e.slot.len;
                self.stats.lock().unwrap_or_else(|e| e.into_inner()).evicted += 1;
            }
        }
    }

    async fn fill(&self, key: &FileKey, index: u64, slot: &Slot) -> Result<Bytes, ClientError> {
        let result = slot
            .cell
            .get_or_init(|| async {
                if slot.len == 0 {
                    return Ok((Bytes::new(), key.version));
                }
                let offset = index * self.chunk_size;
                if let Some(mut parts) =
                    self.load_local(key, offset, offset + slot.len as u64).await
                {
                    self.stats.lock().unwrap_or_else(|e| e.into_inner()).local += 1;
                    return Ok((parts.pop().unwrap_or_default(), key.version));
                }
                self.stats.lock().unwrap_or_else(|e| e.into_inner()).fetched += 1;
                let (data, version) = self
                    .client
                    .read(key.path.clone(), offset, slot.len as u32)
                    .await?;
                self.store_local(key, offset, &data, version);
                Ok((data, version))
            })
            .await
            .clone();
        // Failures are not cached (the next reader retries), and neither are bytes of
        // another version than the key's: the file changed on the server. Those bytes are
        // still one consistent version, and are what a local reader would see now.
        let keep = matches!(&result, Ok((_, v)) if *v == key.version);
        if !keep {
            let mut st = self.lock();
            if let Some(e) = st.entries.get(&(key.id, index)) {
                if std::ptr::eq(Arc::as_ptr(&e.slot), slot) {
                    let len = e.slot.len;
                    st.entries.remove(&(key.id, index));
                    st.used -= len;
                }
            }
        }
        result.map(|(data, _)| data)
    }

    /// The bytes `offset..end` of `key`, in chunk-sized pieces, when the local copy holds
    /// every chunk they touch (read on the blocking pool); `None` without a local copy or
    /// when it lacks one of them.
    async fn load_local(&self, key: &FileKey, offset: u64, end: u64) -> Option<Vec<Bytes>> {
        let b = self.backing.clone()?;
        let (k, cs, size) = (key.clone(), self.chunk_size, key.version.size);
        tokio::task::spawn_blocking(move || {
            let mut parts = Vec::new();
            let mut pos = offset;
            while pos < end {
                let i = pos / cs;
                let len = (size - i * cs).min(cs) as usize;
                let chunk = b.load(&k, i, len)?;
                let lo = (pos - i * cs) as usize;
                let hi = ((end - i * cs) as usize).min(chunk.len());
                if hi <= lo {
                    return None;
                }
                parts.push(chunk.slice(lo..hi));
                pos = i * cs + hi as u64;
            }
            Some(parts)
        })
        .await
        .ok()
        .flatten()
    }

    /// Hands `data`, just fetched at `offset`, to the local copy when it is a whole chunk
    /// of `key`'s version. Written in the background: the reader does not wait for the disk.
    fn store_local(&self, key: &FileKey, offset: u64, data: &Bytes, version: Version) {
        let Some(b) = &self.backing else { return };
        let whole = key.version.size.saturating_sub(offset).min(self.chunk_size);
        if version != key.version || offset % self.chunk_size != 0 || data.len() as u64 != whole {
            return;
        }
        let (b, k, d, index) = (
            b.clone(),
            key.clone(),
            data.clone(),
            offset / self.chunk_size,
        );
        tokio::task::spawn_blocking(move || b.store(&k, index, &d));
    }

    /// Exactly the bytes `offset..end` of `key`, outside the store (a random read): from
    /// the local copy when it holds every chunk touched, else from the network in
    /// chunk-sized requests sent together; whole chunks of `key`'s version fetched on the
    /// way go to the local copy. Short only at the end of the file. Bytes of another
    /// version than `key`'s (the file changed on the server) are still one consistent
    /// version: what a local reader would see now.
    ///
    /// # Errors
    /// A fetch failed.
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
            let task = tokio::spawn(async move { client.read(path, pos, len as u32).await });
            tasks.push((pos, len, task));
            pos += len;
        }
        let mut parts = Vec::with_capacity(tasks.len());
        for (at, len, t) in tasks {
            let (data, version) = t
                .await
                .map_err(|e| ClientError::Protocol(format!("read task failed: {e}")))??;
            self.store_local(key, at, &data, version);
            let short = (data.len() as u64) < len;
            parts.push(data);
            if short {
                break;
            }
        }
        Ok(concat(parts))
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
            self.stats.lock().unwrap_or_else(|e| e.into_inner()).shared += 1;
        }
        self.fill(key, index, &slot).await
    }

    /// Starts fetching chunk `index` in the background unless present, in flight, or
    /// over budget. Returns false when the budget stopped it.
    pub fn prefetch(self: &Arc<Self>, key: &FileKey, index: u64) -> bool {
        match self.slot(key, index, true) {
            None => false,
            Some((_, true)) => true,
            Some((slot, false)) => {
                let me = self.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    let _ = me.fill(&key, index, &slot).await;
                });
                true
            }
        }
    }

    /// Starts fetching chunk `index` in the background now, whatever the budget (a reader
    /// is about to wait for it); a no-op when present or in flight.
    pub fn start(self: &Arc<Self>, key: &FileKey, index: u64) {
        if let Some((slot, false)) = self.slot(key, index, false) {
            let me = self.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let _ = me.fill(&key, index, &slot).await;
            });
        }
    }

    /// Whether chunk `index` of `key` is present or on its way (not failed).
    pub fn held(&self, key: &FileKey, index: u64) -> bool {
        let st = self.lock();
        st.entries
            .get(&(key.id, index))
            .is_some_and(|e| e.version == key.version && !matches!(e.slot.cell.get(), Some(Err(_))))
    }

    /// Whether chunk `index` of `key` is present (complete and successful).
    pub fn contains(&self, key: &FileKey, index: u64) -> bool {
        let st = self.lock();
        st.entries
            .get(&(key.id, index))
            .is_some_and(|e| e.version == key.version && matches!(e.slot.cell.get(), Some(Ok(_))))
    }

    /// A sequential reader has read this chunk to its end: the kernel page cache holds
    /// those bytes now (and serves every other reader of the file from it), so the chunk
    /// leaves the store at once, making room for the window ahead.
    pub fn consumed(&self, key: &FileKey, index: u64) {
        let mut st = self.lock();
        let done = st
            .entries
            .get(&(key.id, index))
            .is_some_and(|e| e.version == key.version && e.slot.cell.initialized());
        if done {
            if let Some(e) = st.entries.remove(&(key.id, index)) {
                st.used -= e.slot.len;
            }
        }
    }

    /// Drops every chunk of file `id`.
    pub fn invalidate(&self, id: u64) {
        let mut st = self.lock();
        let keys: Vec<_> = st
            .entries
            .keys()
            .filter(|(f, _)| *f == id)
            .copied()
            .collect();
        for k in keys {
            if let Some(e) = st.entries.remove(&k) {
                st.used -= e.slot.len;
            }
        }
    }

    /// Bytes currently accounted (present or in flight).
    pub fn used(&self) -> usize {
        self.lock().used
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
