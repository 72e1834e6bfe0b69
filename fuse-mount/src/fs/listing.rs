//! Directory listings: open directory handles, the listings kept for small-file
//! pipelining, and directory read-ahead.
//!
//! - `opendir` fetches the whole listing (paged on the wire) and keeps it with the handle;
//!   `readdir`/`readdirplus` on that handle are served from memory (see `readdir.rs`).
//! - Small-file pipelining: tools that copy trees open files one after another in listing
//!   order, each costing a round trip for its first bytes. The listings of the last
//!   [`KEPT_LISTINGS`] directories are kept; when a file of one is opened, chunk 0 of the
//!   next [`PIPELINE_FILES`] regular files is fetched ahead (within the chunk memory budget).
//! - Directory read-ahead: after a listing, those of its subdirectories (up to
//!   [`DIRS_AHEAD`] in all, each up to [`DIR_AHEAD_MAX_SIZE`] bytes on the server) are
//!   fetched in the background, with chunk 0 of their first [`PIPELINE_FILES_AHEAD`] files,
//!   for their `opendir` to take. Off when the attribute TTL is zero.
//! - Classes: listings and first chunks fetched ahead are prediction requests (after
//!   readers' demand requests, before the mirror's); a listing an `opendir` waits for is
//!   demand.
//!
//! Invariants: a listing fetched ahead is used at most once, and only within one TTL of when
//! it was started (its entries then count as fetched at that time); one that failed is
//! fetched again by the `opendir` that wanted it. `pipelined_until` only grows, so no file's
//! first chunk is asked for twice from one listing.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use ferry_client::{ChunkStore, ClientError, FileKey};
use ferry_proto::name::join;
use ferry_proto::{Attr, Class, DirEntry, FileKind};

use super::{file_id, lock, Fs};
use crate::error::Error;

/// How many files after the one being opened get their first chunk fetched ahead.
const PIPELINE_FILES: usize = 128;
/// Directory listings kept for small-file pipelining.
const KEPT_LISTINGS: usize = 16;
/// Files of a subdirectory listed ahead whose first chunk is fetched with its listing.
const PIPELINE_FILES_AHEAD: usize = PIPELINE_FILES;
/// Subdirectory listings fetched ahead at most (in flight or waiting for their opendir).
const DIRS_AHEAD: usize = 64;
/// Larger directories (by their size on the server) are not listed ahead.
const DIR_AHEAD_MAX_SIZE: u64 = 256 << 10;

/// One directory entry as an open directory handle holds it.
#[derive(Debug, Clone)]
pub(super) struct DirItem {
    /// Entry name.
    pub(super) name: Bytes,
    /// Attributes.
    pub(super) attr: Attr,
    /// When the server reported these attributes (the listing's time).
    pub(super) listed: Instant,
}

/// A recent listing of one directory, in server order (the order `cp -r`, `rsync` and `tar`
/// walk it in).
struct Listing {
    items: Arc<Vec<DirItem>>,
    index: HashMap<Bytes, usize>,
    /// Entries before this index have been handed to the prefetcher already.
    pipelined_until: usize,
}

/// The last [`KEPT_LISTINGS`] listings, by directory inode, oldest first in `order`.
#[derive(Default)]
struct Listings {
    by_dir: HashMap<u64, Listing>,
    order: VecDeque<u64>,
}

type ListingCell = Arc<tokio::sync::OnceCell<Result<Vec<DirEntry>, ClientError>>>;

/// Subdirectory listings fetched ahead, by path, oldest first in `order`.
#[derive(Default)]
struct DirsAhead {
    by_path: HashMap<Bytes, (Instant, ListingCell)>,
    order: VecDeque<Bytes>,
}

/// The directory state of a mount (three mutexes, never held together).
#[derive(Default)]
pub(super) struct Dirs {
    /// Open directory handles and the listing each serves.
    open: Mutex<HashMap<u64, Arc<Vec<DirItem>>>>,
    listings: Mutex<Listings>,
    ahead: Mutex<DirsAhead>,
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

impl Fs {
    /// Opens directory `ino`: the whole listing is fetched now (paged on the wire) and
    /// served from memory to the kernel's readdir calls on this handle.
    ///
    /// # Errors
    /// As [`Fs::getattr`].
    pub async fn opendir(&self, ino: u64) -> Result<u64, Error> {
        let path = self.inodes.path_of(ino)?;
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
        let fh = self.next_fh();
        lock(&self.dirs.open).insert(fh, items.clone());
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
            let mut ls = lock(&self.dirs.listings);
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

    /// The listing held by directory handle `fh`.
    pub(super) fn dir_items(&self, fh: u64) -> Option<Arc<Vec<DirItem>>> {
        lock(&self.dirs.open).get(&fh).cloned()
    }

    /// Closes a directory handle.
    pub fn releasedir(&self, fh: u64) {
        lock(&self.dirs.open).remove(&fh);
    }

    /// The entries of directory `path` and when they were listed: the listing fetched
    /// ahead for it if there is a recent one (used once), else fetched now.
    async fn listing(&self, path: &Bytes) -> Result<(Vec<DirEntry>, Instant), Error> {
        let ahead = {
            let mut a = lock(&self.dirs.ahead);
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

    /// Directory read-ahead (see the module docs): the listings of the subdirectories of
    /// `path` among `entries` are fetched now, in the background, for their `opendir`.
    fn list_subdirs_ahead(&self, path: &Bytes, entries: &[DirEntry]) {
        if self.cfg.attr_ttl.is_zero() {
            return; // every opendir lists afresh
        }
        let mut a = lock(&self.dirs.ahead);
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
            // Nobody waits for these yet: prediction, after readers' own requests.
            let client = self.client.with_class(Class::Prediction);
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

    /// Small-file pipelining (see the module docs) for the opening of file `ino`: chunk 0 of
    /// the files after it in its directory's kept listing, if there is one.
    pub(super) fn pipeline_next_files(&self, ino: u64) {
        let Ok(path) = self.inodes.path_of(ino) else {
            return;
        };
        let (parent_path, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (path.slice(..i), path.slice(i + 1..)),
            None => (Bytes::new(), path.clone()),
        };
        let Some(parent) = self.inodes.ino_of(&parent_path) else {
            return;
        };
        let at = {
            let ls = lock(&self.dirs.listings);
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
            let ls = lock(&self.dirs.listings);
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
        if let Some(l) = lock(&self.dirs.listings).by_dir.get_mut(&parent) {
            l.pipelined_until = l.pipelined_until.max(done);
        }
    }
}
