//! The mounted file system, async and free of fuser types.
//!
//! Inodes: the mount numbers objects itself (root = 1, then 2, 3, …) and maps each to its
//! path beneath the export; the server is path-based and stateless, so nothing here needs
//! re-establishing if a connection is replaced. A path whose server inode changes (file
//! replaced) gets a new mount inode, so the kernel never mixes the two.
//!
//! Caching: attributes and entries are cached by the kernel for `attr_ttl`. On open, the
//! file's version (server inode, size, mtime) is compared with the version at its previous
//! open: unchanged → the kernel keeps its page cache (FOPEN_KEEP_CACHE); changed → the
//! kernel drops it and the chunk store forgets the old chunks.
//!
//! Reads: sequential readers (per handle, see [`ferry_client::Prefetcher`]) fetch whole
//! chunks through the shared [`ChunkStore`] and push a growing window ahead of themselves;
//! random readers fetch exactly the bytes asked for, unless the chunks are already held.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::{
    ChunkBacking, ChunkStore, Client, ClientError, FileKey, PrefetchConfig, Prefetcher,
};
use ferry_proto::name::{join, validate_name};
use ferry_proto::{Attr, DirEntry, FileKind, StatFs, Version};

use crate::error::Error;
use tracing::debug;

/// The root inode number.
pub const ROOT_INO: u64 = 1;

/// File system settings.
#[derive(Debug, Clone)]
pub struct FsConfig {
    /// Path beneath the export that is the mount's root (empty = the export root).
    pub root: Bytes,
    /// How long the kernel may cache attributes and names.
    pub attr_ttl: Duration,
    /// Bytes of chunks held in memory (read-ahead window plus recently read).
    pub chunk_memory: usize,
    /// Read-ahead policy.
    pub prefetch: PrefetchConfig,
    /// Open complete, verified files of the local copy with FUSE passthrough.
    pub passthrough: bool,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            root: Bytes::new(),
            attr_ttl: Duration::from_secs(10),
            chunk_memory: 64 << 20,
            prefetch: PrefetchConfig::default(),
            passthrough: false,
        }
    }
}

struct Node {
    path: Bytes,
    attr: Attr,
    fetched: Instant,
    lookups: u64,
    /// Version seen at the last open, for FOPEN_KEEP_CACHE.
    open_version: Option<Version>,
}

#[derive(Default)]
struct Inodes {
    nodes: HashMap<u64, Node>,
    by_path: HashMap<Bytes, u64>,
}

/// How many files after the one being opened get their first chunk fetched ahead.
const PIPELINE_FILES: usize = 128;
/// Directory listings kept for small-file pipelining.
const KEPT_LISTINGS: usize = 16;

/// A recent listing of one directory, in server order (the order `cp -r`, `rsync` and `tar`
/// walk it in).
struct Listing {
    items: Arc<Vec<DirItem>>,
    index: HashMap<Bytes, usize>,
    /// Entries before this index have been handed to the prefetcher already.
    pipelined_until: usize,
}

/// Subdirectory listings fetched ahead, by path (see [`Fs::list_subdirs_ahead`]).
#[derive(Default)]
struct DirsAhead {
    by_path: HashMap<Bytes, (Instant, ListingCell)>,
    order: std::collections::VecDeque<Bytes>,
}

type ListingCell = Arc<tokio::sync::OnceCell<Result<Vec<DirEntry>, ClientError>>>;

/// Files of a subdirectory listed ahead whose first chunk is fetched with its listing.
const PIPELINE_FILES_AHEAD: usize = PIPELINE_FILES;

/// The chunk store's id for the file at `path` (relative to the export): a hash of the
/// path, so chunks can be fetched for files the kernel has not looked up yet.
fn file_id(path: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(path)
}

/// Starts fetching chunk 0 of entry `name` of directory `dir` if it is a non-empty regular
/// file. False when the chunk budget is spent.
fn prefetch_first_chunk(store: &Arc<ChunkStore>, dir: &Bytes, name: &Bytes, attr: &Attr) -> bool {
    if attr.kind != FileKind::File || attr.size == 0 {
        return true;
    }
    let path = Bytes::from(join(dir, name));
    let key = FileKey {
        id: file_id(&path),
        version: attr.version(),
        path,
    };
    store.prefetch(&key, 0)
}

/// Subdirectory listings fetched ahead at most (in flight or waiting for their opendir).
const DIRS_AHEAD: usize = 64;
/// Larger directories (by their size on the server) are not listed ahead.
const DIR_AHEAD_MAX_SIZE: u64 = 256 << 10;

#[derive(Default)]
struct Listings {
    by_dir: HashMap<u64, Listing>,
    order: std::collections::VecDeque<u64>,
}

struct Handle {
    key: FileKey,
    prefetcher: Mutex<Prefetcher>,
    stats: Mutex<HandleStats>,
    opened: Instant,
    /// Reads of this handle go to the local copy in the kernel (FUSE passthrough).
    passthrough: std::sync::atomic::AtomicBool,
}

/// What one open file handle did, logged (debug) when it is released: enough to tell a
/// sequential reader that fell back to exact-byte reads, or a window that kept stalling.
#[derive(Debug, Default, Clone, Copy)]
struct HandleStats {
    reads: u64,
    sequential: u64,
    direct: u64,
    unaligned: u64,
    bytes: u64,
    /// Reads that found a chunk they needed not yet arrived.
    waited: u64,
    wait: Duration,
}

/// One directory entry as the adapter hands it to the kernel.
#[derive(Debug, Clone)]
pub struct DirItem {
    /// Entry name.
    pub name: Bytes,
    /// Attributes.
    pub attr: Attr,
    /// When the server reported these attributes (the listing's time).
    pub listed: Instant,
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
}

/// The file system.
pub struct Fs {
    client: Client,
    store: Arc<ChunkStore>,
    cfg: FsConfig,
    inodes: Mutex<Inodes>,
    next_ino: AtomicU64,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirItem>>>>,
    listings: Mutex<Listings>,
    dirs_ahead: Mutex<DirsAhead>,
    next_fh: AtomicU64,
    passthrough_opens: AtomicU64,
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs").field("root", &self.cfg.root).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fs {
    /// A file system over `client`, rooted at `cfg.root`, whose attributes are `root_attr`.
    pub fn new(client: Client, cfg: FsConfig, root_attr: Attr) -> Fs {
        Self::with_backing(client, cfg, root_attr, None)
    }

    /// As [`Fs::new`], with a local copy behind the chunk store (`--cache-dir`).
    pub fn with_backing(
        client: Client,
        cfg: FsConfig,
        root_attr: Attr,
        backing: Option<Arc<dyn ChunkBacking>>,
    ) -> Fs {
        let store = ChunkStore::with_backing(client.clone(), cfg.chunk_memory, backing);
        let mut inodes = Inodes::default();
        inodes.nodes.insert(
            ROOT_INO,
            Node {
                path: cfg.root.clone(),
                attr: root_attr,
                fetched: Instant::now(),
                lookups: 1,
                open_version: None,
            },
        );
        inodes.by_path.insert(cfg.root.clone(), ROOT_INO);
        Fs {
            client,
            store,
            cfg,
            inodes: Mutex::new(inodes),
            next_ino: AtomicU64::new(ROOT_INO + 1),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            listings: Mutex::new(Listings::default()),
            dirs_ahead: Mutex::new(DirsAhead::default()),
            passthrough_opens: AtomicU64::new(0),
            next_fh: AtomicU64::new(1),
        }
    }

    /// Attribute and entry cache lifetime.
    pub fn ttl(&self) -> Duration {
        self.cfg.attr_ttl
    }

    /// Chunk size of the session: reported as `st_blksize`.
    pub fn chunk_size(&self) -> u32 {
        self.client.session().chunk_size
    }

    /// The chunk store (for statistics).
    pub fn store(&self) -> &Arc<ChunkStore> {
        &self.store
    }

    fn path_of(&self, ino: u64) -> Result<Bytes, Error> {
        lock(&self.inodes)
            .nodes
            .get(&ino)
            .map(|n| n.path.clone())
            .ok_or_else(|| Error::errno(libc::ESTALE, "unknown inode"))
    }

    /// Records that the kernel now holds one more reference to `path`; returns its inode.
    fn remember(&self, path: Bytes, attr: Attr, fetched: Instant) -> u64 {
        let mut inodes = lock(&self.inodes);
        if let Some(&ino) = inodes.by_path.get(&path) {
            if let Some(node) = inodes.nodes.get_mut(&ino) {
                if node.attr.ino == attr.ino && node.attr.kind == attr.kind {
                    // Keep the newer of what we hold and what arrives.
                    if fetched >= node.fetched {
                        node.attr = attr;
                        node.fetched = fetched;
                    }
                    node.lookups += 1;
                    return ino;
                }
            }
        }
        // New path, or the object at the path was replaced: a new inode.
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        inodes.nodes.insert(
            ino,
            Node {
                path: path.clone(),
                attr,
                fetched,
                lookups: 1,
                open_version: None,
            },
        );
        inodes.by_path.insert(path, ino);
        ino
    }

    fn child_path(&self, parent: u64, name: &[u8]) -> Result<Bytes, Error> {
        validate_name(name).map_err(ferry_client::ClientError::from)?;
        let parent_path = self.path_of(parent)?;
        Ok(Bytes::from(join(&parent_path, name)))
    }

    /// Looks `name` up in directory `parent`; the kernel holds a reference afterwards.
    ///
    /// # Errors
    /// ENOENT and the other statuses of the server; EIO on transport failures.
    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<(u64, Attr), Error> {
        let path = self.child_path(parent, name)?;
        let attr = self.client.stat(path.clone()).await?;
        Ok((self.remember(path, attr, Instant::now()), attr))
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut inodes = lock(&self.inodes);
        let Some(node) = inodes.nodes.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 {
            let path = node.path.clone();
            inodes.nodes.remove(&ino);
            if inodes.by_path.get(&path) == Some(&ino) {
                inodes.by_path.remove(&path);
            }
            drop(inodes);
            self.store.invalidate(file_id(&path));
        }
    }

    /// Fresh attributes of `ino` from the server.
    ///
    /// # Errors
    /// As [`Fs::lookup`].
    pub async fn getattr(&self, ino: u64) -> Result<Attr, Error> {
        let path = self.path_of(ino)?;
        let attr = self.client.stat(path).await?;
        if let Some(n) = lock(&self.inodes).nodes.get_mut(&ino) {
            n.attr = attr;
            n.fetched = Instant::now();
        }
        Ok(attr)
    }

    /// Target of the symlink `ino`.
    ///
    /// # Errors
    /// As [`Fs::lookup`].
    pub async fn readlink(&self, ino: u64) -> Result<Bytes, Error> {
        Ok(self.client.readlink(self.path_of(ino)?).await?)
    }

    /// Statistics of the export's file system.
    ///
    /// # Errors
    /// EIO on transport failures.
    pub async fn statfs(&self) -> Result<StatFs, Error> {
        Ok(self.client.statfs().await?)
    }

    /// Opens directory `ino`: the whole listing is fetched now (paged on the wire) and
    /// served from memory to the kernel's readdir calls on this handle.
    ///
    /// # Errors
    /// As [`Fs::lookup`].
    pub async fn opendir(&self, ino: u64) -> Result<u64, Error> {
        let path = self.path_of(ino)?;
        let (entries, listed) = self.listing(&path).await?;
        self.list_subdirs_ahead(&path, &entries);
        let items: Arc<Vec<DirItem>> = Arc::new(
            entries
                .into_iter()
                .map(|e| DirItem {
                    name: e.name,
                    attr: e.attr,
                    listed,
                })
                .collect(),
        );
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.dirs).insert(fh, items.clone());
        let listing = Listing {
            index: items
                .iter()
                .enumerate()
                .map(|(i, it)| (it.name.clone(), i))
                .collect(),
            items,
            pipelined_until: 0,
        };
        {
            let mut ls = lock(&self.listings);
            if ls.by_dir.insert(ino, listing).is_none() {
                ls.order.push_back(ino);
                while ls.order.len() > KEPT_LISTINGS {
                    if let Some(old) = ls.order.pop_front() {
                        ls.by_dir.remove(&old);
                    }
                }
            }
        }
        // The first files of the directory are on their way before the first is opened.
        self.pipeline_files(ino, &path, 0);
        Ok(fh)
    }

    /// The entries of directory `path` and when they were listed: the listing fetched
    /// ahead for it if there is a recent one (used once), else fetched now.
    async fn listing(&self, path: &Bytes) -> Result<(Vec<DirEntry>, Instant), Error> {
        let ahead = {
            let mut a = lock(&self.dirs_ahead);
            let hit = a.by_path.remove(path);
            a.order.retain(|p| p != path);
            hit
        };
        if let Some((started, cell)) = ahead {
            if started.elapsed() < self.cfg.attr_ttl {
                let client = self.client.clone();
                let p = path.clone();
                let got = cell
                    .get_or_init(|| async move { client.read_dir(p).await })
                    .await;
                if let Ok(entries) = got {
                    return Ok((entries.clone(), started));
                }
                // A failed listing ahead is retried now, and its error reported if it
                // fails again.
            }
        }
        let listed = Instant::now();
        Ok((self.client.read_dir(path.clone()).await?, listed))
    }

    /// Directory read-ahead: a tree copy opens the subdirectories of a directory it has
    /// listed, one after another, each costing a round trip for its listing. Their
    /// listings (up to [`DIRS_AHEAD`] in all, of directories up to [`DIR_AHEAD_MAX_SIZE`]
    /// bytes) are fetched now, in the background, for their `opendir` to take.
    fn list_subdirs_ahead(&self, path: &Bytes, entries: &[DirEntry]) {
        if self.cfg.attr_ttl.is_zero() {
            return; // every opendir lists afresh
        }
        let mut a = lock(&self.dirs_ahead);
        for e in entries {
            if a.by_path.len() >= DIRS_AHEAD {
                break;
            }
            if e.attr.kind != FileKind::Directory || e.attr.size > DIR_AHEAD_MAX_SIZE {
                continue;
            }
            let child = Bytes::from(join(path, &e.name));
            if a.by_path.contains_key(&child) {
                continue;
            }
            let cell = Arc::new(tokio::sync::OnceCell::new());
            a.by_path
                .insert(child.clone(), (Instant::now(), cell.clone()));
            a.order.push_back(child.clone());
            let client = self.client.clone();
            let store = self.store.clone();
            tokio::spawn(async move {
                let path = child.clone();
                let got = cell
                    .get_or_init(|| async move { client.read_dir(child).await })
                    .await;
                // And the first bytes of its first files, for when the copy gets there.
                if let Ok(entries) = got {
                    for e in entries.iter().take(PIPELINE_FILES_AHEAD) {
                        if !prefetch_first_chunk(&store, &path, &e.name, &e.attr) {
                            break;
                        }
                    }
                }
            });
        }
        // Listings nobody opened within the TTL are dropped.
        while let Some(front) = a.order.front() {
            match a.by_path.get(front) {
                Some((t, _)) if t.elapsed() < self.cfg.attr_ttl => break,
                _ => {
                    if let Some(p) = a.order.pop_front() {
                        a.by_path.remove(&p);
                    }
                }
            }
        }
    }

    /// The listing held by directory handle `fh`.
    pub fn dir_items(&self, fh: u64) -> Option<Arc<Vec<DirItem>>> {
        lock(&self.dirs).get(&fh).cloned()
    }

    /// Inode of entry `name` of directory `parent` for readdirplus, counting a kernel
    /// reference (undo with [`Fs::forget`] if the entry did not fit in the reply).
    pub fn remember_entry(&self, parent: u64, item: &DirItem) -> Option<u64> {
        let path = self.child_path(parent, &item.name).ok()?;
        Some(self.remember(path, item.attr, item.listed))
    }

    /// Inode of entry `name` for plain readdir (no reference counted): the known inode, or
    /// the server's inode number as an informational `d_ino`.
    pub fn peek_entry(&self, parent: u64, item: &DirItem) -> u64 {
        let Ok(path) = self.child_path(parent, &item.name) else {
            return item.attr.ino;
        };
        lock(&self.inodes)
            .by_path
            .get(&path)
            .copied()
            .unwrap_or(item.attr.ino)
    }

    /// Inode of the parent directory of `ino` (the root is its own parent).
    pub fn parent_of(&self, ino: u64) -> u64 {
        let inodes = lock(&self.inodes);
        let Some(node) = inodes.nodes.get(&ino) else {
            return ROOT_INO;
        };
        if ino == ROOT_INO {
            return ROOT_INO;
        }
        let parent = match node.path.iter().rposition(|&b| b == b'/') {
            Some(i) => node.path.slice(..i),
            None => Bytes::new(),
        };
        if parent.len() < self.cfg.root.len() {
            return ROOT_INO;
        }
        inodes.by_path.get(&parent).copied().unwrap_or(ROOT_INO)
    }

    /// Closes a directory handle.
    pub fn releasedir(&self, fh: u64) {
        lock(&self.dirs).remove(&fh);
    }

    /// Opens file `ino` for reading.
    ///
    /// # Errors
    /// EROFS for any write access; EISDIR; server errors.
    pub async fn open(&self, ino: u64, write: bool) -> Result<Opened, Error> {
        if write {
            return Err(Error::errno(libc::EROFS, "read-only mount"));
        }
        let (path, fresh) = {
            let inodes = lock(&self.inodes);
            let node = inodes
                .nodes
                .get(&ino)
                .ok_or_else(|| Error::errno(libc::ESTALE, "unknown inode"))?;
            let fresh = (node.fetched.elapsed() < self.cfg.attr_ttl).then_some(node.attr);
            (node.path.clone(), fresh)
        };
        let attr = match fresh {
            Some(a) => a,
            None => self.getattr(ino).await?,
        };
        if attr.kind == FileKind::Directory {
            return Err(Error::errno(libc::EISDIR, "is a directory"));
        }
        let version = attr.version();
        let (keep_cache, changed) = {
            let mut inodes = lock(&self.inodes);
            match inodes.nodes.get_mut(&ino) {
                Some(node) => {
                    let before = node.open_version.replace(version);
                    (
                        before == Some(version),
                        before.is_some_and(|v| v != version),
                    )
                }
                None => (false, false),
            }
        };
        // Chunks held from an earlier version go; on a first open, chunks fetched ahead
        // for this very version (small-file pipelining) stay.
        if changed {
            self.store.invalidate(file_id(&path));
        }
        let handle = Handle {
            key: FileKey {
                id: file_id(&path),
                version,
                path,
            },
            prefetcher: Mutex::new(Prefetcher::new(self.cfg.prefetch)),
            stats: Mutex::new(HandleStats::default()),
            opened: Instant::now(),
            passthrough: std::sync::atomic::AtomicBool::new(false),
        };
        // Passthrough when the local copy holds this version complete and verified, and no
        // handle of the file is open in the normal (cached) mode: the kernel refuses to mix
        // the two on one inode.
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
        // The mode is decided and the handle inserted under one lock, so two opens cannot
        // choose differently unseen.
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let direct_io = {
            let mut handles = lock(&self.handles);
            let (mut cached, mut passthrough) = (false, false);
            // Only a mount with passthrough has modes to reconcile.
            if self.cfg.passthrough {
                for o in handles.values().filter(|o| o.key.id == handle.key.id) {
                    if o.passthrough.load(Ordering::Relaxed) {
                        passthrough = true;
                    } else {
                        cached = true;
                    }
                }
            }
            if cached {
                local = None;
            }
            handle.passthrough.store(local.is_some(), Ordering::Relaxed);
            handles.insert(fh, Arc::new(handle));
            passthrough && local.is_none()
        };
        if local.is_none() {
            self.pipeline_next_files(ino);
        }
        Ok(Opened {
            fh,
            keep_cache: keep_cache && !direct_io,
            local,
            direct_io,
            version,
        })
    }

    /// Counts an open the kernel took in passthrough mode.
    pub fn count_passthrough_open(&self) {
        self.passthrough_opens.fetch_add(1, Ordering::Relaxed);
    }

    /// Opens served with passthrough so far.
    pub fn passthrough_opens(&self) -> u64 {
        self.passthrough_opens.load(Ordering::Relaxed)
    }

    /// The kernel did not take handle `fh` in passthrough mode: it is served normally.
    pub fn passthrough_refused(&self, fh: u64) {
        if let Some(h) = lock(&self.handles).get(&fh) {
            h.passthrough.store(false, Ordering::Relaxed);
        }
    }

    /// Small-file pipelining: tools that copy trees open files one after another in
    /// listing order, each costing a round trip for its first bytes. When a file of a
    /// recently listed directory is opened, the first chunk of the next
    /// [`PIPELINE_FILES`] regular files is fetched ahead (within the chunk memory budget),
    /// so their reads find the bytes already here.
    fn pipeline_next_files(&self, ino: u64) {
        let Ok(path) = self.path_of(ino) else { return };
        let (parent_path, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (path.slice(..i), path.slice(i + 1..)),
            None => (Bytes::new(), path.clone()),
        };
        let Some(parent) = lock(&self.inodes).by_path.get(&parent_path).copied() else {
            return;
        };
        let at = {
            let ls = lock(&self.listings);
            let Some(&at) = ls.by_dir.get(&parent).and_then(|l| l.index.get(&name)) else {
                return;
            };
            at
        };
        self.pipeline_files(parent, &parent_path, at + 1);
    }

    /// Fetches chunk 0 of the regular files of `parent`'s listing from position `from` up
    /// to `from + PIPELINE_FILES`, skipping those already handed out, stopping when the
    /// chunk budget is spent (a later call resumes there).
    fn pipeline_files(&self, parent: u64, parent_path: &Bytes, from: usize) {
        let (start, items) = {
            let ls = lock(&self.listings);
            let Some(l) = ls.by_dir.get(&parent) else {
                return;
            };
            let start = from.max(l.pipelined_until);
            let end = (from + PIPELINE_FILES).min(l.items.len());
            if start >= end {
                return;
            }
            (start, l.items[start..end].to_vec())
        };
        let mut done = start;
        for item in &items {
            if !prefetch_first_chunk(&self.store, parent_path, &item.name, &item.attr) {
                break;
            }
            done += 1;
        }
        if let Some(l) = lock(&self.listings).by_dir.get_mut(&parent) {
            l.pipelined_until = l.pipelined_until.max(done);
        }
    }

    /// Closes a file handle.
    pub fn release(&self, fh: u64) {
        let Some(h) = lock(&self.handles).remove(&fh) else {
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

    /// Reads up to `size` bytes at `offset` through handle `fh`. Short only at end of file
    /// (as of the version seen at open).
    ///
    /// # Errors
    /// EBADF for an unknown handle; EIO on transport failures or corruption.
    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes, Error> {
        let h = lock(&self.handles)
            .get(&fh)
            .cloned()
            .ok_or_else(|| Error::errno(libc::EBADF, "unknown file handle"))?;
        let file_size = h.key.version.size;
        if offset >= file_size || size == 0 {
            return Ok(Bytes::new());
        }
        let end = (offset + u64::from(size)).min(file_size);
        let plan = lock(&h.prefetcher).on_read(offset, end - offset, file_size);
        let cs = self.store.chunk_size();
        let first = offset / cs;
        let last = (end - 1) / cs;
        let cached = (first..=last).all(|i| self.store.held(&h.key, i));
        {
            let mut st = lock(&h.stats);
            st.reads += 1;
            st.bytes += end - offset;
            st.sequential += u64::from(plan.sequential);
            st.direct += u64::from(!plan.sequential && !cached);
            st.unaligned += u64::from(offset % cs != 0);
        }
        if !plan.sequential && !cached {
            return self.read_direct(&h.key, offset, end).await;
        }
        // Own chunks first, then the window ahead, all in flight before waiting.
        for i in first..=last {
            self.store.start(&h.key, i);
        }
        if !plan.ahead.is_empty() {
            let from = plan.ahead.start.div_ceil(cs).max(last + 1);
            let to = (plan.ahead.end - 1) / cs;
            for i in from..=to {
                if !self.store.prefetch(&h.key, i) {
                    break;
                }
            }
        }
        let mut parts = Vec::with_capacity((last - first + 1) as usize);
        for i in first..=last {
            let waiting = !self.store.contains(&h.key, i);
            let t0 = Instant::now();
            let chunk = self.store.get(&h.key, i).await?;
            if waiting {
                let mut st = lock(&h.stats);
                st.waited += 1;
                st.wait += t0.elapsed();
            }
            let start = i * cs;
            let lo = (offset.max(start) - start) as usize;
            let hi = ((end.min(start + cs) - start) as usize).min(chunk.len());
            if lo >= hi {
                break;
            }
            parts.push(chunk.slice(lo..hi));
            // Read to its end by a sequential reader, or whole by anyone: the page cache
            // has those bytes now.
            let to_end = end >= start + chunk.len() as u64;
            if to_end && (plan.sequential || lo == 0) {
                self.store.consumed(&h.key, i);
            }
        }
        Ok(ferry_client::chunks::concat(parts))
    }

    /// A random read: exactly the bytes asked for (see [`ChunkStore::read_range`]).
    async fn read_direct(&self, key: &FileKey, offset: u64, end: u64) -> Result<Bytes, Error> {
        Ok(self.store.read_range(key, offset, end).await?)
    }
}
