//! The mounted file system, async and free of fuser types, so it can be driven (and tested)
//! without a kernel: `fuse.rs` only translates requests and replies.
//!
//! [`Fs`] is the glue between the stages, each in its own module:
//!
//! - `fs/inodes.rs`: the inode table. The mount numbers objects itself (root = 1, then 2, 3, …)
//!   and maps each to its path beneath the export; the server is path-based and stateless,
//!   so nothing here needs re-establishing if a connection is replaced. A path whose server
//!   inode changes (file replaced) gets a new mount inode, so the kernel never mixes the two.
//! - `fs/listing.rs`: directory handles, the listing cache, directory read-ahead and small-file
//!   pipelining.
//! - `fs/readdir.rs`: `readdir`/`readdirplus` over an open directory handle, `.` and `..`, and
//!   the lookup references readdirplus hands the kernel, through the [`DirReplier`] trait.
//! - `fs/handles.rs`: open file handles, `FOPEN_KEEP_CACHE` and passthrough bookkeeping.
//! - `fs/read.rs`: the read path of one handle.
//!
//! Caching: attributes and entries are cached by the kernel for `attr_ttl`. On open, the
//! file's version (server inode, size, mtime) is compared with the version at its previous
//! open: unchanged → the kernel keeps its page cache (FOPEN_KEEP_CACHE); changed → the
//! kernel drops it and the chunk store forgets the old chunks.
//!
//! Locks: each table has its own mutex and no code path holds two of them at once, so
//! there is no lock order to keep.

mod handles;
mod inodes;
mod listing;
mod read;
mod readdir;
mod xattrs;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::{ChunkBacking, ChunkStore, Client, FileKey, PrefetchConfig};
use ferry_proto::name::{join, validate_name};
use ferry_proto::{Attr, StatFs};
use ferry_util::lock;

use crate::error::Error;

pub use handles::Opened;
pub use readdir::DirReplier;

use handles::Handles;
use inodes::InodeTable;
use listing::Dirs;

/// The root inode number.
pub const ROOT_INO: u64 = 1;

/// Default of [`FsConfig::open_ttl`].
pub const OPEN_TTL: Duration = Duration::from_secs(1);

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
    /// Close-to-open: an open takes the file's version from what the server said less
    /// than this long ago (a listing fetched ahead of a tree walk, a lookup, a stat), else
    /// asks the server first (one round trip).
    pub open_ttl: Duration,
    /// A handle reads one version only: any change on the server fails its reads (EIO).
    pub strict: bool,
    /// Show owners and groups mapped by name (`-o idmap=names`): the server names its
    /// ids, each name is looked up here; otherwise the server's numbers.
    pub idmap_names: bool,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            root: Bytes::new(),
            attr_ttl: Duration::from_secs(10),
            chunk_memory: 64 << 20,
            prefetch: PrefetchConfig::default(),
            passthrough: false,
            open_ttl: OPEN_TTL,
            strict: false,
            idmap_names: false,
        }
    }
}

/// The file system.
pub struct Fs {
    client: Client,
    store: Arc<ChunkStore>,
    cfg: FsConfig,
    inodes: InodeTable,
    handles: Handles,
    dirs: Dirs,
    /// File and directory handles share one sequence, so a handle number is never reused.
    next_fh: AtomicU64,
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs").field("root", &self.cfg.root).finish()
    }
}

/// The chunk store's id for the file at `path` (relative to the export): a hash of the
/// path, so chunks can be fetched for files the kernel has not looked up yet.
fn file_id(path: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(path)
}

/// The chunk store's key of `version` of the file at `path`.
fn key_at(path: Bytes, version: ferry_proto::Version) -> FileKey {
    FileKey {
        id: file_id(&path),
        version,
        path,
    }
}

/// The longest a version the server reported may serve an open (close-to-open): the open
/// TTL, and never longer than the attributes' TTL.
fn open_max_age(cfg: &FsConfig) -> Duration {
    cfg.open_ttl.min(cfg.attr_ttl)
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
        Fs {
            client,
            store,
            inodes: InodeTable::new(cfg.root.clone(), root_attr),
            dirs: Dirs::new(cfg.idmap_names),
            cfg,
            handles: Handles::default(),
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

    fn next_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    fn child_path(&self, parent: u64, name: &[u8]) -> Result<Bytes, Error> {
        validate_name(name).map_err(ferry_client::ClientError::from)?;
        let parent_path = self.inodes.path_of(parent)?;
        Ok(Bytes::from(join(&parent_path, name)))
    }

    /// Looks `name` up in directory `parent`; the kernel holds a reference afterwards.
    ///
    /// # Errors
    /// ENOENT and the other statuses of the server; EIO on transport failures.
    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<(u64, Attr), Error> {
        let path = self.child_path(parent, name)?;
        let parent_path = self.inodes.path_of(parent)?;
        let listed = self
            .listed_attr(parent, &parent_path, name, self.cfg.attr_ttl)
            .await?;
        // In a directory too large to list again, what was asked ahead of a walker's opens
        // ([`Fs::stat_ahead`]) answers its lookups too.
        let ahead = || self.stat_fresh(&path, self.cfg.attr_ttl);
        let (attr, fetched) = match listed.or_else(ahead) {
            Some(found) => found,
            None => (self.client.stat(path.clone()).await?, Instant::now()),
        };
        Ok((
            self.inodes.remember(path, attr, fetched),
            self.shown(attr).await,
        ))
    }

    /// `attr` as the kernel is shown it: owners mapped by name with `-o idmap=names`
    /// (learning the names of ids not met yet: one request), else as the server has them.
    async fn shown(&self, attr: Attr) -> Attr {
        match &self.dirs.ids {
            Some(ids) => {
                ids.learn(&self.client, std::iter::once(&attr)).await;
                ids.map(attr)
            }
            None => attr,
        }
    }

    /// As [`Fs::shown`], for attributes whose owners were learned already (a listing's).
    fn shown_now(&self, attr: &Attr) -> Attr {
        match &self.dirs.ids {
            Some(ids) => ids.map(*attr),
            None => *attr,
        }
    }

    /// The kernel dropped `n` references to `ino`. At none left, the inode is gone (its
    /// number is never reused) and its chunks are dropped.
    pub fn forget(&self, ino: u64, n: u64) {
        if let Some(path) = self.inodes.forget(ino, n) {
            self.store.invalidate(file_id(&path));
        }
    }

    /// The kernel references `ino` holds (lookups, and readdirplus entries it was sent, not
    /// yet forgotten); `None` for an inode the mount does not know (never seen, or
    /// forgotten). The root always has one.
    pub fn lookup_count(&self, ino: u64) -> Option<u64> {
        self.inodes.lookups(ino)
    }

    /// Fresh attributes of `ino` from the server; while it is unreachable (no stream
    /// connected), the last ones it gave.
    ///
    /// # Errors
    /// ESTALE for an unknown inode, or one whose object was replaced on the server (the
    /// kernel then looks the name up again); otherwise as [`Fs::lookup`].
    pub async fn getattr(&self, ino: u64) -> Result<Attr, Error> {
        let (path, known, fetched) = self.inodes.path_and_attr(ino)?;
        if self.client.live_streams() == 0 {
            // The server is unreachable: what it last said, rather than a stat (or the
            // kernel's permission check before `ferry status` reads the root's status)
            // that waits for it.
            tracing::debug!(
                "/{}: server unreachable, attributes as of {:?} ago",
                String::from_utf8_lossy(&path),
                fetched.elapsed()
            );
            return Ok(self.shown_now(&known));
        }
        let attr = self.client.stat(path.clone()).await?;
        self.refreshed(ino, &path, attr, Instant::now())?;
        Ok(self.shown(attr).await)
    }

    /// Records `attr`, reported at `fetched`, as `ino`'s (at `path`); returns the version
    /// the mount held before.
    ///
    /// # Errors
    /// ESTALE when `attr` is another object's: the listings of its directory are
    /// forgotten too, so the kernel's next lookup finds the new object.
    fn refreshed(
        &self,
        ino: u64,
        path: &Bytes,
        attr: Attr,
        fetched: Instant,
    ) -> Result<ferry_proto::Version, Error> {
        self.inodes.refresh(ino, attr, fetched).inspect_err(|e| {
            if e.errno == libc::ESTALE {
                tracing::debug!(
                    "/{} was replaced on the server: its inode {ino} is stale",
                    String::from_utf8_lossy(path)
                );
                self.drop_listing(&ferry_proto::name::split(path).0);
            }
        })
    }

    /// Attributes of `ino` (at `path`) the server reported less than `max_age` ago: from
    /// its directory's listing when one answers ([`Fs::listed_attr`]: a tool reopening many
    /// files of a directory after their attributes expired pays one round trip for all),
    /// else as [`Fs::getattr`]. Returns them and the version the mount held before.
    ///
    /// # Errors
    /// As [`Fs::getattr`].
    async fn revalidate(
        &self,
        ino: u64,
        path: &Bytes,
        max_age: Duration,
    ) -> Result<(Attr, ferry_proto::Version), Error> {
        let (parent_path, name) = ferry_proto::name::split(path);
        if !name.is_empty() {
            if let Some(parent) = self.inodes.ino_of(&parent_path) {
                let listed = self
                    .listed_attr(parent, &parent_path, &name, max_age)
                    .await?;
                if let Some((attr, fetched)) = listed {
                    let before = self.refreshed(ino, path, attr, fetched)?;
                    return Ok((attr, before));
                }
            }
        }
        let attr = self.client.stat(path.clone()).await?;
        let before = self.refreshed(ino, path, attr, Instant::now())?;
        Ok((attr, before))
    }

    /// Target of the symlink `ino`.
    ///
    /// # Errors
    /// As [`Fs::getattr`].
    pub async fn readlink(&self, ino: u64) -> Result<Bytes, Error> {
        let (path, attr) = self.inodes.path_and_fresh_attr(ino, self.cfg.attr_ttl)?;
        if let Some(target) = attr.and_then(|a| self.link_read_ahead(&path, a.version())) {
            return Ok(target);
        }
        Ok(self.client.readlink(path).await?)
    }

    /// The extended attributes (and POSIX ACLs) of `ino`, as the server has them: asked for
    /// a directory's entries at once, beside its listing.
    ///
    /// # Errors
    /// ESTALE for an unknown inode; EIO when the server could not say.
    pub async fn xattrs(&self, ino: u64) -> Result<Vec<(Bytes, Bytes)>, Error> {
        let path = self.inodes.path_of(ino)?;
        let (dir, name) = if ino == ROOT_INO {
            (path, Bytes::new())
        } else {
            ferry_proto::name::split(&path)
        };
        self.dirs
            .xattrs
            .of(&self.client, &dir, &name, self.cfg.attr_ttl)
            .await
    }

    /// Statistics of the export's file system.
    ///
    /// # Errors
    /// EIO on transport failures.
    pub async fn statfs(&self) -> Result<StatFs, Error> {
        Ok(self.client.statfs().await?)
    }
}
