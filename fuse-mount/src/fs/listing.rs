//! Directory listings: open directory handles, the listings kept for lookups and small-file
//! pipelining, and tree-walk prediction (listings and files fetched ahead of a walker).
//!
//! - `opendir` fetches the whole listing (paged on the wire) and keeps it with the handle;
//!   `readdir`/`readdirplus` on that handle are served from memory (see `readdir.rs`).
//! - Listings ahead: after a listing, its subdirectories are listed in the background, then
//!   theirs, nearest to the walker first: positions in the walk are depth-first, siblings in
//!   listing order (`cp -r`, `tar`, `find`, `du`) or in name order (`rsync`, `ls -R`) as the
//!   walker's moves vote ([`DirsAhead::walked_to`]). At most [`DIRS_AHEAD`] are held
//!   ([`LISTINGS_AHEAD_IN_FLIGHT`] in flight); while the walk reads files, at most twice as
//!   many as it opened within the open TTL, but at least 128 from ferryd, 16 from S3 (older
//!   listings are listed again for its opens: [`DirsAhead::held_while_reading`]). While the
//!   walk only lists, the furthest makes way for a nearer one (while it reads files, none
//!   does: it would be listed again). One is used by its `opendir` if younger than the TTL,
//!   and listed again while a walk goes on if it grew older. Directories larger than
//!   [`DIR_AHEAD_MAX_SIZE`] are not listed ahead. Where a walk starts, its directory's
//!   listing comes with the listings under it in one page from a ferryd that sends them
//!   ([`fetch_tree`]; those held are not counted against what may be held:
//!   [`DirsAhead::held_alone`]). Off when the attribute TTL is zero.
//! - Symlink targets: read ahead with every listing (small, and `ls -l` asks for each).
//! - Files ahead, only while files are being read (one opened within [`READING`]): with each
//!   listing, the contents of its small files in runs of ReadDirData and the first chunk of
//!   the others ([`fetch_files_ahead`]; the whole of those of at most a quarter of the chunk
//!   memory among the walker's next files in its own order: [`Ahead`]), within the chunk
//!   memory and while less than [`RUNS_IN_FLIGHT`] of small files are on their way;
//!   what did not fit is taken up as the copy frees room, nearest to the walker first
//!   ([`PendingData`]), the runs sent in that order ([`send_runs`]); files read
//!   within the last minute are not fetched again, until the kernel is found to have
//!   dropped their pages ([`Fs::pages_dropped`]). Opening a file also fetches the files
//!   after it in its directory's kept listing, and those before it not fetched yet
//!   ([`PIPELINE_FILES`]); a small file found neither held nor on its way when opened
//!   (a walk's first) is asked for at once as a demand read, before those runs; a
//!   directory whose listing is no longer kept is listed
//!   again for that (rsync opens every file long after its file list). In a directory too
//!   large to list ahead, a walker in name order (rsync) has the files after it in name
//!   order fetched instead, a Read each ([`Fs::stat_ahead`]). A file that fits
//!   one chunk, held whole by its first open, goes into the kernel's page cache with that
//!   open ([`super::handles::Opened::pages`]): its reads never come to the mount.
//! - Lookups and reopens are answered from a listing kept within the TTL, or fetched ahead;
//!   else, for a small directory, from a new listing of it (one round trip for all its names).
//!   A kept listing still in use past half the TTL is listed again in the background, so a
//!   copy of a large directory that takes longer than the TTL keeps answering from it; so
//!   are those of the directories above one a copy enters ([`Fs::refresh_ancestors`]), for
//!   its opens when it comes back up.
//! - Classes: file contents fetched ahead are prediction requests (after readers' demand
//!   requests, before the mirror's); listings, ahead or not, are demand: they are small, and
//!   one queued behind file contents would hold up the whole walk.
//!
//! Invariants: a listing fetched ahead is used by one `opendir` at most, and only within one
//! TTL of when it was started (its entries then count as fetched at that time); one that
//! failed is fetched again by the `opendir` that wanted it. File contents fetched ahead are
//! held for the version their listing showed, so a file changed since is fetched afresh,
//! never served from them. `pipelined_until` only grows (but when the kernel dropped pages
//! of files read lately: [`Fs::pages_dropped`]), so no file's first chunk is asked for twice
//! from one listing while the kernel holds what was read.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::ids::NameMap;
use ferry_client::{
    is_small_file, small_file_runs, ChunkStore, Client, ClientError, FileKey, ListedEntry,
    SMALL_FILE_MAX,
};
use ferry_proto::name::join;
use ferry_proto::{features, Attr, Class, DirEntry, FileKind, Version};
use tokio::sync::oneshot;

use super::{key_at, lock, open_max_age, Fs};
use crate::error::Error;

/// How many files after the one being opened are fetched ahead.
const PIPELINE_FILES: usize = 512;
/// Directory listings kept for small-file pipelining and lookups.
const KEPT_LISTINGS: usize = 256;
/// A directory kept listed this recently is not listed again for its `opendir` (a lookup
/// listed it just before).
const RELIST_AFTER: Duration = Duration::from_secs(1);
/// Directory listings fetched ahead at most (in flight or waiting for their opendir): the
/// walker's `opendir` of one lets the next start, so listings stay this many directories
/// ahead of it. Not more: a listing not opened within the TTL is dropped, and a copy walks
/// a few dozen directories a second.
const DIRS_AHEAD: usize = 256;
/// Listings ahead in flight at most.
const LISTINGS_AHEAD_IN_FLIGHT: usize = 64;
/// Listings ahead held while files are read, at least (see `DirsAhead::held_while_reading`),
/// from ferryd. The walker's pace over the open TTL sets how many are held, but a walk's
/// first second has not shown its pace yet: with 16 held then, a copy in narrow places
/// (`python/json`, then `python/json/__pycache__`) caught up with the listings and waited a
/// round trip per level, and went no faster than it waited. `cp -r` and `tar` of a source
/// tree over the WAN took 4.0-4.4 s with 16, 2.8-3.3 s with 128 (as with 256); a minimum
/// grown from the pace seen so far stayed near 16. What it costs: a walker slower than the
/// open TTL lets the held listings expire and has them listed again, one directory read
/// each on ferryd.
const HELD_WHILE_READING_MIN: usize = 128;
/// The same from an S3 source, where a listing listed again is a LIST that scans everything
/// under its prefix.
const HELD_WHILE_READING_MIN_S3: usize = 16;
/// Directories found and waiting to be listed ahead, at most.
const TODO_MAX: usize = 1 << 16;
/// A file opened this recently means the walk reads files (a copy, not `find` or `ls -lR`).
const READING: Duration = Duration::from_secs(3);
/// Bytes of small files asked for in runs ahead of a walker and not yet arrived, at most
/// (more than a WAN's bandwidth-delay product: 1 Gbit/s × 40 ms is 5 MB). What does not fit
/// waits in [`PendingData`], put in the walk's order as the walker moves, so the nearest
/// directories go first. Without it the walk's first open sent every listing's runs at
/// once, and a WAN copy's first subdirectory, listed a moment later, waited 130-220 ms for
/// its first file behind the rest of the tree's first level.
const RUNS_IN_FLIGHT: u64 = 8 << 20;
/// Entries of the page of a tree's listings asked for when a walk starts ([`fetch_tree`]):
/// a small tree is known at once rather than a round trip per level, a large one's first
/// levels.
const TREE_AHEAD_ENTRIES: u32 = 1024;
/// Larger directories (by their size on the server) are not listed ahead.
pub(super) const DIR_AHEAD_MAX_SIZE: u64 = 256 << 10;

/// One directory entry as an open directory handle holds it.
#[derive(Debug, Clone)]
pub(super) struct DirItem {
    /// Entry name.
    pub(super) name: Bytes,
    /// Attributes.
    pub(super) attr: Attr,
    /// The server's position after it in the listing.
    pub(super) cookie: u64,
    /// When the server reported these attributes (the listing's time).
    pub(super) listed: Instant,
}

/// A recent listing of one directory, in server order (the order `cp -r`, `rsync` and `tar`
/// walk it in).
struct Listing {
    /// The directory's path.
    path: Bytes,
    items: Arc<Vec<DirItem>>,
    index: HashMap<Bytes, usize>,
    /// Entries before this index have been handed to the prefetcher already.
    pipelined_until: usize,
    /// The kernel dropped pages of files read lately ([`Fs::pages_dropped`]): the next open
    /// in this directory hands its files from [`PIPELINE_FILES`] entries before it on to
    /// the prefetcher again.
    rewound: bool,
    /// When the server listed it.
    listed: Instant,
    /// A new listing of it is on its way ([`Lister::refresh`]).
    refreshing: bool,
    /// A file of it was opened since it was first kept ([`refresh_unopened_ahead`]).
    opened: bool,
    /// It has regular files.
    has_files: bool,
    /// Positions in name order, made when first needed ([`Fs::stat_ahead`]): each entry's
    /// rank, and the entries by rank.
    by_name: std::sync::OnceLock<(Vec<u32>, Vec<u32>)>,
}

impl Listing {
    /// A listing of directory `path`: `entries`, which the server gave at `listed`.
    fn new(path: Bytes, entries: Vec<DirEntry>, listed: Instant) -> Listing {
        let has_files = entries.iter().any(|e| e.attr.kind == FileKind::File);
        let items: Vec<DirItem> = entries
            .into_iter()
            .map(|e| DirItem {
                name: e.name,
                attr: e.attr,
                cookie: e.cookie,
                listed,
            })
            .collect();
        Listing {
            path,
            index: items
                .iter()
                .enumerate()
                .map(|(i, it)| (it.name.clone(), i))
                .collect(),
            items: Arc::new(items),
            pipelined_until: 0,
            rewound: false,
            listed,
            refreshing: false,
            opened: false,
            has_files,
            by_name: std::sync::OnceLock::new(),
        }
    }

    /// Whether this listing is due to be listed again in the background (past half of
    /// `max_age`, and not being listed again already): then it is marked as being, and its
    /// path returned for [`Lister::refresh`].
    fn due_for_refresh(&mut self, max_age: Duration) -> Option<Bytes> {
        if self.refreshing || self.listed.elapsed() < max_age / 2 {
            return None;
        }
        self.refreshing = true;
        Some(self.path.clone())
    }

    /// Each entry's rank in name order, and the entries by rank.
    fn by_name(&self) -> &(Vec<u32>, Vec<u32>) {
        self.by_name.get_or_init(|| {
            let mut order: Vec<u32> = (0..self.items.len() as u32).collect();
            order.sort_by(|&a, &b| {
                self.items[a as usize]
                    .name
                    .cmp(&self.items[b as usize].name)
            });
            let mut rank = vec![0u32; order.len()];
            for (r, &i) in order.iter().enumerate() {
                rank[i as usize] = r as u32;
            }
            (rank, order)
        })
    }
}

/// Levels above a directory a copy enters whose kept listings are kept fresh
/// ([`Fs::refresh_ancestors`]).
const ANCESTORS_REFRESHED: usize = 16;

/// How many kept listings after one found too old for an open are listed again at once
/// ([`refresh_following`]).
const REFRESH_FOLLOWING: usize = 32;

/// Lists again, in the background, up to [`REFRESH_FOLLOWING`] kept listings that follow
/// `dir`'s in `ls.order` (the order they were first listed: a walk's) and are older than
/// half of `max_age`.
fn refresh_following(ls: &mut Listings, dir: u64, max_age: Duration, lister: &Lister) {
    refresh_after(ls, dir, max_age, lister, usize::MAX, |_| true);
}

/// How many kept listings after the one a file is opened in are looked at by
/// [`refresh_unopened_ahead`].
const REFRESH_AHEAD_SCAN: usize = 64;

/// At an open of a file in `dir`: lists again, in the background, the kept listings that
/// follow `dir`'s in `ls.order` (among the next [`REFRESH_AHEAD_SCAN`]), have files none of
/// which was opened yet, and are older than half of `max_age` (the open TTL), at most
/// [`REFRESH_FOLLOWING`] at a time. A walker that lists its directories well before it opens
/// their files (`rsync`'s incremental recursion: one to two seconds over the WAN) then finds
/// them young enough for its opens; otherwise the first open in each such directory waited
/// a round trip for a new listing (12-21 per WAN `rsync -a` of a source tree). A walker that
/// opens a directory's files right after listing it (`cp -r`, `tar`) has opened files in
/// the listings after its own, or is in them: nothing to list again. Not for an S3 source.
fn refresh_unopened_ahead(ls: &mut Listings, dir: u64, max_age: Duration, lister: &Lister) {
    refresh_after(ls, dir, max_age, lister, REFRESH_AHEAD_SCAN, |l| {
        l.has_files && !l.opened
    });
}

/// Lists again, in the background, up to [`REFRESH_FOLLOWING`] of the `scan` kept listings
/// that follow `dir`'s in `ls.order`, those `wanted` and older than half of `max_age`.
fn refresh_after(
    ls: &mut Listings,
    dir: u64,
    max_age: Duration,
    lister: &Lister,
    scan: usize,
    wanted: impl Fn(&Listing) -> bool,
) {
    let Some(at) = ls.order.iter().position(|&d| d == dir) else {
        return;
    };
    let mut started = 0;
    for i in at + 1..ls.order.len().min((at + 1).saturating_add(scan)) {
        let d = ls.order[i];
        let due = ls
            .by_dir
            .get_mut(&d)
            .filter(|l| wanted(l))
            .and_then(|l| l.due_for_refresh(max_age));
        if let Some(path) = due {
            lister.refresh(d, path);
            started += 1;
            if started >= REFRESH_FOLLOWING {
                break;
            }
        }
    }
}

/// The last [`KEPT_LISTINGS`] listings, by directory inode, oldest first in `order`.
#[derive(Default)]
struct Listings {
    by_dir: HashMap<u64, Listing>,
    order: VecDeque<u64>,
}

type ListingCell = Arc<tokio::sync::OnceCell<Result<Vec<DirEntry>, ClientError>>>;

/// A directory's position in a walk: its index in its parent's listing, after its parent's
/// position. Ordered as a depth-first walk in listing order meets them.
type Pos = Vec<u32>;

/// Subdirectory listings fetched ahead, by path, oldest first in `order`.
#[derive(Default)]
struct DirsAhead {
    by_path: HashMap<Bytes, (Instant, ListingCell)>,
    order: VecDeque<Bytes>,
    /// Directories found but not listed yet, by their position in the walk: listings ahead
    /// go in depth-first listing order, the order `cp -r`, `tar`, `find` and `du` walk in.
    todo: BTreeMap<Pos, Bytes>,
    /// The position in the walk of each directory found in it, siblings in the order the
    /// walker seems to take: listing order (`cp -r`, `tar`, `find`, `du`) or, when
    /// `by_name`, name order (`rsync`, `ls -R`).
    pos: HashMap<Bytes, Pos>,
    /// The positions in the other order.
    other: HashMap<Bytes, Pos>,
    /// Listings held that came in a tree page with their parent's (some may be gone from
    /// `by_path` since): not counted against what may be held while files are read.
    from_pages: HashSet<Bytes>,
    by_name: bool,
    /// Moves of the walker from one directory to the next that went forward in listing
    /// order only, and in name order only.
    votes: (u32, u32),
    /// The directory a walker opened last.
    walker_path: Option<Bytes>,
    /// Listings ahead in flight.
    in_flight: usize,
    /// When a walker last opened a directory.
    last_walk: Option<Instant>,
    /// The position of the directory a walker opened last.
    walker: Option<Pos>,
    /// Directories listed for an `opendir` recently (within the TTL), oldest first: none is
    /// listed ahead again while it is here, however often its parent's listing finds it.
    walked: HashMap<Bytes, Instant>,
    walked_order: VecDeque<Bytes>,
}

impl DirsAhead {
    /// A walker opened directory `path`: its position becomes the walker's, and the move
    /// from the last one votes for the order siblings are walked in. When name order wins,
    /// positions switch to it (and back).
    fn walked_to(&mut self, path: &Bytes) {
        let prev = self.walker_path.replace(path.clone());
        let (Some(now), Some(now_other)) = (self.pos.get(path), self.other.get(path)) else {
            return;
        };
        if let Some(prev) = prev {
            if let (Some(p), Some(o)) = (self.pos.get(&prev), self.other.get(&prev)) {
                let (forward, forward_other) = (now > p, now_other > o);
                let (listing, name) = if self.by_name {
                    (forward_other, forward)
                } else {
                    (forward, forward_other)
                };
                match (listing, name) {
                    (true, false) => self.votes.0 += 1,
                    (false, true) => self.votes.1 += 1,
                    _ => {}
                }
            }
        }
        let want_by_name = self.votes.1 > self.votes.0;
        if want_by_name != self.by_name {
            self.by_name = want_by_name;
            std::mem::swap(&mut self.pos, &mut self.other);
            let todo = std::mem::take(&mut self.todo);
            for (_, p) in todo {
                if let Some(k) = self.pos.get(&p) {
                    self.todo.insert(k.clone(), p);
                }
            }
        }
        self.walker = self.pos.get(path).cloned();
    }

    /// How many listings ahead may be held while files are read: twice as many as the
    /// walker opened within the last open TTL (what `walked` holds then), at least `min`
    /// ([`HELD_WHILE_READING_MIN`] or [`HELD_WHILE_READING_MIN_S3`]), at most [`DIRS_AHEAD`].
    /// Listings older than the open TTL are listed again before the walker gets there (its
    /// opens take versions from them), so more than the walker reaches within that time
    /// would each be listed again and again: a `cp -r` of a 919-directory tree out of a
    /// mount of an S3 bucket, whose walker opens a few dozen directories a second, listed
    /// the 256 held every second (an S3 LIST scans everything under its prefix): over five
    /// minutes, 66 s with this cap.
    fn held_while_reading(&self, min: usize) -> usize {
        (2 * self.walked.len()).clamp(min, DIRS_AHEAD)
    }

    /// Listings held that count against [`DirsAhead::held_while_reading`]: those listed
    /// ahead each on its own. Those that came in a tree page with their parent's do not:
    /// a page is small, and its listings the nearest to the walker after their parent.
    fn held_alone(&mut self) -> usize {
        self.forget_gone_pages();
        self.by_path.len() - self.from_pages.len()
    }

    /// Forgets the listings of tree pages no longer held (so `from_pages` stays within
    /// `by_path`).
    fn forget_gone_pages(&mut self) {
        self.from_pages.retain(|p| self.by_path.contains_key(p));
    }

    /// How far `pos` is from the walker, for ordering: ahead of it, nearest first, then
    /// behind it.
    fn rank<'a>(&self, pos: &'a Pos) -> (bool, &'a Pos) {
        (self.walker.as_ref().is_some_and(|w| pos < w), pos)
    }

    /// Drops listings nobody opened within `ttl` (while a walk goes on, they are listed
    /// again: a walk that spends long in one part of the tree still finds the next part
    /// listed ahead), and forgets walks older than it.
    fn expire(&mut self, ttl: Duration) {
        let walking = self.last_walk.is_some_and(|t| t.elapsed() < ttl);
        while let Some(front) = self.order.front() {
            match self.by_path.get(front) {
                Some((t, _)) if t.elapsed() < ttl => break,
                _ => {
                    if let Some(p) = self.order.pop_front() {
                        self.by_path.remove(&p);
                        let ahead = |k: &Pos| self.walker.as_ref().is_none_or(|w| k >= w);
                        if let Some(pos) = self.pos.get(&p).filter(|k| walking && ahead(k)) {
                            let pos = pos.clone();
                            self.todo.insert(pos, p);
                        }
                    }
                }
            }
        }
        while let Some(front) = self.walked_order.front() {
            match self.walked.get(front) {
                Some(t) if t.elapsed() < ttl => break,
                _ => {
                    if let Some(p) = self.walked_order.pop_front() {
                        self.walked.remove(&p);
                    }
                }
            }
        }
    }
}

/// The directory state of a mount (three mutexes, never held together).
pub(super) struct Dirs {
    /// Open directory handles and the listing each serves.
    open: Mutex<HashMap<u64, Arc<Vec<DirItem>>>>,
    listings: Arc<Mutex<Listings>>,
    ahead: Arc<Mutex<DirsAhead>>,
    /// When a file was last opened (see [`Lister::reading`]).
    last_open: Arc<Mutex<Option<Instant>>>,
    pending: Arc<Mutex<PendingData>>,
    runs: Arc<RunsInFlight>,
    links: Arc<Mutex<Links>>,
    /// Attributes of files in large directories, asked ahead of their opens.
    stats: Arc<Mutex<StatsAhead>>,
    /// Extended attributes by directory, asked for beside each listing.
    pub(super) xattrs: Arc<super::xattrs::Xattrs>,
    /// Owners by name (`-o idmap=names`), learned with each listing.
    pub(super) ids: Option<Arc<NameMap>>,
}

impl Dirs {
    pub(super) fn new(idmap_names: bool) -> Dirs {
        Dirs {
            open: Mutex::default(),
            listings: Arc::default(),
            ahead: Arc::default(),
            last_open: Arc::default(),
            pending: Arc::default(),
            runs: Arc::default(),
            links: Arc::default(),
            stats: Arc::default(),
            xattrs: Arc::default(),
            ids: idmap_names.then(|| Arc::new(NameMap::new())),
        }
    }
}

/// Files stat'ed ahead in a large directory ([`Fs::stat_ahead`]), at most this many held.
const STATS_HELD: usize = 4096;
/// How many files after the one opened are stat'ed ahead by a walker in name order (a Stat
/// each).
const STATS_AHEAD: usize = 128;
/// Entries of one page of a large directory's listing asked ahead of a walker in listing
/// order; the next is asked once the walker is into the last, so one to two pages are
/// ahead of it. A page must last longer than a round trip at the walker's pace, with the
/// files fetched ahead queued before it on the streams: a `cp -r` of 100,000 small files
/// opens about 4,000 a second, and over the WAN profile (40 ms) pages of 128 asked half
/// way through the last came late for most of them (docs/BENCHMARKS-TREES.md).
const PAGE_AHEAD: usize = 512;

/// Attributes asked ahead of opens in a large directory, by path: what the server said and
/// when the request was sent (so their age is never understated).
#[derive(Default)]
struct StatsAhead {
    fresh: HashMap<Bytes, (Attr, Instant)>,
    order: VecDeque<Bytes>,
    asked: std::collections::HashSet<Bytes>,
    /// Where the last open was in its directory, by directory: its position in the listing
    /// and in name order. Stats go ahead of a walker that follows one of the two orders
    /// (`cp -r` and tar the listing's, rsync names'); any other order would have every open
    /// send a new batch.
    last_open: HashMap<u64, (usize, usize)>,
    /// By directory, for a walker in listing order: the pages of it asked for again ahead
    /// of the walker ([`Fs::stat_ahead`]).
    paged: HashMap<u64, Paged>,
    /// By directory, for a walker in name order: the kept listing (its address) and the
    /// rank up to which its files were fetched ahead ([`Fs::stat_ahead`]).
    fetched_by_name: HashMap<u64, (usize, usize)>,
}

/// The pages of a large directory's kept listing asked ahead of a walker in listing order.
struct Paged {
    /// The kept listing they are positions in (its address): a new listing starts afresh.
    kept: usize,
    /// Each page's first position and when it was asked, in the order asked (each covers
    /// [`PAGE_AHEAD`] positions from its first).
    pages: VecDeque<(usize, Instant)>,
}

impl StatsAhead {
    /// Holds what the server said of `path` (asked at `sent`), the oldest going past
    /// [`STATS_HELD`].
    fn keep(&mut self, path: Bytes, attr: Attr, sent: Instant) {
        if self.fresh.insert(path.clone(), (attr, sent)).is_none() {
            self.order.push_back(path);
            while self.order.len() > STATS_HELD {
                if let Some(old) = self.order.pop_front() {
                    self.fresh.remove(&old);
                }
            }
        }
    }
}

/// What fetching listings ahead needs, for the tasks that do it (they go on listing the
/// subdirectories of what they fetched, so they cannot borrow the [`Fs`]).
#[derive(Clone)]
struct Lister {
    client: Client,
    store: Arc<ChunkStore>,
    ahead: Arc<Mutex<DirsAhead>>,
    listings: Arc<Mutex<Listings>>,
    ttl: Duration,
    /// How old a version an open may take (close-to-open).
    open_ttl: Duration,
    last_open: Arc<Mutex<Option<Instant>>>,
    pending: Arc<Mutex<PendingData>>,
    runs: Arc<RunsInFlight>,
    links: Arc<Mutex<Links>>,
    xattrs: Arc<super::xattrs::Xattrs>,
    ids: Option<Arc<NameMap>>,
}

/// The chunk store's key of entry `name` of directory `dir`.
fn key_of(dir: &Bytes, name: &Bytes, attr: &Attr) -> FileKey {
    key_at(Bytes::from(join(dir, name)), attr.version())
}

/// The entries of directory `path` (a plain listing: the walker goes on at once), its
/// symlinks' targets read behind it, and, when files are being read (`reading`), the
/// contents of its small files fetched behind it ([`fetch_files_ahead`]).
async fn fetch_listing(
    l: &Lister,
    path: Bytes,
    reading: bool,
) -> Result<Vec<DirEntry>, ClientError> {
    let client = &l.client;
    // The extended attributes of the directory's entries come beside its listing, so
    // `ls -l` or `cp -a` does not wait a round trip for them.
    l.xattrs.ahead(client, &path, l.ttl);
    let entries = client.read_dir(path.clone()).await?;
    if let Some(ids) = &l.ids {
        // Owners not met yet are named before the listing is used (one request).
        ids.learn(client, entries.iter().map(|e| &e.attr)).await;
    }
    arrived(l, path, &entries, reading);
    Ok(entries)
}

/// As [`fetch_listing`], where a walk starts: the directory's listing comes with the
/// listings under it in one page ([`fetch_tree`]), one round trip for both. `None` when
/// the page did not bring it (the caller lists it on its own).
async fn fetch_listing_and_tree(
    l: &Lister,
    path: Bytes,
    reading: bool,
) -> Option<(Vec<DirEntry>, Tree)> {
    l.xattrs.ahead(&l.client, &path, l.ttl);
    let mut tree = fetch_tree(l, path.clone()).await.ok()?;
    if tree.first().is_none_or(|(p, _)| *p != path) {
        return None;
    }
    let below = tree.split_off(1);
    let (_, entries) = tree.remove(0);
    arrived(l, path, &entries, reading);
    Some((entries, below))
}

/// A listing of `path` has arrived (asked for with files being read or not: `reading`).
fn arrived(l: &Lister, path: Bytes, entries: &[DirEntry], reading: bool) {
    // Not reading yet (a walk that only lists, or a copy before its first open): the
    // files wait in the pending queue, taken up once files are opened. Whether files are
    // read is asked again now the listing is here: one asked for before the walk's first
    // open and arriving after it (the first subdirectories') would otherwise wait for the
    // next open to be taken up, and the walker arrived there before its files (a WAN
    // copy's first subdirectory waited 60-195 ms on its first file).
    let fetch = reading || l.reading();
    listed(l, path, entries, fetch);
}

/// The listings of directory `path` and of the directories under it that one page of
/// the server's tree listings holds whole (ReadTree, at most [`TREE_AHEAD_ENTRIES`]
/// entries; `path`'s own listing first, completed if the page cut it short), by path,
/// breadth first, their owners named.
async fn fetch_tree(l: &Lister, path: Bytes) -> Result<Tree, ClientError> {
    let client = &l.client;
    let tree: Tree = client
        .read_tree_whole(path.clone(), TREE_AHEAD_ENTRIES)
        .await?
        .into_iter()
        .map(|(rel, e)| match rel.is_empty() {
            true => (path.clone(), e),
            false => (Bytes::from(join(&path, &rel)), e),
        })
        .collect();
    if let Some(ids) = &l.ids {
        let all = tree.iter().flat_map(|(_, e)| e);
        ids.learn(client, all.map(|e| &e.attr)).await;
    }
    Ok(tree)
}

/// What follows a listing of directory `path` (see [`fetch_listing`]): its symlinks'
/// targets read ahead, and its small files fetched now (`fetch`: files are being read) or
/// queued for later (the one copy of the entries this makes).
fn listed(l: &Lister, path: Bytes, entries: &[DirEntry], fetch: bool) {
    let (client, store) = (&l.client, &l.store);
    // Symlink targets are read ahead for every walk: `ls -l`, `find -printf %l` and the
    // copies all ask for them, one round trip each in turn otherwise.
    l.read_links_ahead(&path, entries);
    let stopped = if fetch {
        fetch_files_ahead(
            client,
            store,
            &l.runs,
            &path,
            entries,
            0..entries.len(),
            Ahead::Listing,
        )
    } else {
        0
    };
    if stopped < entries.len() && entries.iter().any(|e| e.attr.kind == FileKind::File) {
        // When full, the newest waits no more: the oldest are those the walk reaches
        // first (its opens fetch the rest from their kept listings).
        lock(&l.pending).push_back((path, Instant::now(), Arc::new(entries.to_vec()), stopped));
    }
}

/// Listings by directory path (a page of a tree's: [`fetch_tree`]).
type Tree = Vec<(Bytes, Vec<DirEntry>)>;

/// A directory's entries, when they were listed, and where a walk starts there, the
/// listings under it that came with them ([`Fs::listing`]).
type Listed = (Vec<DirEntry>, Instant, Option<Tree>);

/// Symlink targets read ahead, by path: the version of the link they were read for, and
/// when it was listed.
type Links = HashMap<Bytes, (Version, Instant, Bytes)>;

/// Symlink targets held at most.
const LINKS_MAX: usize = 1 << 16;

/// Listings whose files were not fetched when they arrived (no room in the chunk memory, or
/// no file being read yet), in the order they arrived (the walk's), with when, the listing,
/// and where fetching stopped: taken up as files are opened ([`Lister::top_up`]); the oldest
/// are kept, up to [`PENDING_ENTRIES`] entries in all.
#[derive(Default)]
struct PendingData {
    queue: VecDeque<Pending>,
    /// Entries of the listings in `queue`.
    entries: usize,
    /// The reader's directory the queue was last put in the walk's order from.
    sorted_for: Option<Bytes>,
}

/// A listing waiting for its files: the directory, when it was listed, its entries, and
/// where fetching stopped.
type Pending = (Bytes, Instant, Arc<Vec<DirEntry>>, usize);

impl PendingData {
    /// Queues `p` last, unless the queue would hold more than [`PENDING_ENTRIES`] with it
    /// (a larger listing alone is queued: a copy of a directory of 100,000 files takes it
    /// up as it frees room).
    fn push_back(&mut self, p: Pending) {
        if self.queue.is_empty() || self.entries + p.2.len() <= PENDING_ENTRIES {
            self.entries += p.2.len();
            self.queue.push_back(p);
        }
    }

    /// Puts back `p`, just taken, first.
    fn push_front(&mut self, p: Pending) {
        self.entries += p.2.len();
        self.queue.push_front(p);
    }

    fn pop_front(&mut self) -> Option<Pending> {
        let p = self.queue.pop_front()?;
        self.entries -= p.2.len();
        Some(p)
    }
}

/// Entries of the listings waiting for their files at most ([`PendingData`]; about 10 MiB).
/// Counted in entries, not listings: `rsync` lists a tree ahead of its first read, and
/// with the newest 256 listings kept the first directories it read had lost their files
/// ahead, each first read a round trip; keeping the oldest 256 would do the same to every
/// directory after them (a source tree has 919).
const PENDING_ENTRIES: usize = 1 << 16;

/// Fetches the files among `entries[range]` of directory `dir` ahead of a copy, while the
/// chunk memory has room: the contents of the small ones in runs of ReadDirData, all at
/// once ([`ferry_client::small_file_runs`]), each into a place the chunk store keeps for
/// it ([`ChunkStore::expect`]), and of the others the first chunk, or the whole file for
/// the walker's next ones (see [`Ahead`]). A copy opening them then finds them here or on
/// their way: one round trip per run instead of one per file. Files held already, or read
/// lately ([`ChunkStore::read_lately`]: a listing taken again while the copy goes on lists
/// them afresh), are skipped; a file whose contents do not come (changed, or left out by
/// the server) is fetched as usual. Without the server's DIR_DATA feature, or when
/// `entries` are not consecutive in the listing ([`Ahead::NextByName`]), small files too
/// come by Read, a Read each. Small files wait
/// while [`RUNS_IN_FLIGHT`] bytes of them are on their way (`in_flight`). Returns where it
/// stopped for want of room (`range.end` when it did not).
fn fetch_files_ahead<E: ListedEntry + Named>(
    client: &Client,
    store: &Arc<ChunkStore>,
    in_flight: &Arc<RunsInFlight>,
    dir: &Bytes,
    entries: &[E],
    range: std::ops::Range<usize>,
    ahead: Ahead,
) -> usize {
    let runs = ahead != Ahead::NextByName && client.session().features & features::DIR_DATA != 0;
    let mut stopped = range.end;
    let mut places: HashMap<usize, (FileKey, oneshot::Sender<Bytes>)> = HashMap::new();
    let on_the_way = in_flight.now.load(Ordering::Relaxed);
    let mut asked = 0;
    for (i, e) in entries.iter().enumerate().take(range.end).skip(range.start) {
        let a = e.attr();
        if a.kind != FileKind::File || a.size == 0 {
            continue;
        }
        let key = key_of(dir, e.name(), a);
        if store.read_lately(&key) {
            continue; // read already (the walker's copy has it)
        }
        if !runs || !is_small_file(a.kind, a.size) {
            // Larger files (or no ReadDirData): their first chunk, one Read each; those the
            // walker opens next, of at most a quarter of the chunk memory, whole.
            let next = match ahead {
                Ahead::Listing => false,
                Ahead::Next { from } => i >= from,
                Ahead::NextByName => true,
            };
            let last = if next && a.size <= store.budget() as u64 / 4 {
                (a.size - 1) / store.chunk_size()
            } else {
                0
            };
            // As a reader's window: from a source that prefers long reads (S3), the
            // chunks go in long reads, not one request each.
            if !store.prefetch_range(&key, 0, 0, last) {
                stopped = i;
                break;
            }
            continue;
        }
        let full = on_the_way + asked + a.size > RUNS_IN_FLIGHT && on_the_way + asked > 0;
        if full && !store.held(&key, 0) {
            stopped = i;
            break;
        }
        match store.expect(&key) {
            Some(tx) => {
                asked += a.size;
                places.insert(i, (key, tx));
            }
            // Held already, or on its way: not asked for again. Out of room: the rest wait
            // for the copy to get nearer (small-file pipelining).
            None if store.held(&key, 0) => {}
            None => {
                stopped = i;
                break;
            }
        }
    }
    if places.is_empty() {
        return stopped;
    }
    // Only as far as places were kept: a copy of a large directory tops this up at each
    // open, and runs over the rest of its listing grew with the square of the directory.
    for run in small_file_runs(entries, range.start..stopped, |i| places.contains_key(&i)) {
        let mut want: HashMap<Bytes, (FileKey, oneshot::Sender<Bytes>)> = HashMap::new();
        for i in run.entries.clone() {
            if let Some(p) = places.remove(&i) {
                want.insert(entries[i].name().clone(), p);
            }
        }
        let bytes = want.values().map(|(k, _)| k.version.size).sum();
        in_flight.add(bytes);
        in_flight.send(RunJob {
            client: client.with_class(Class::Prediction),
            dir: dir.clone(),
            run,
            want,
            _on_its_way: OnItsWay(in_flight.clone(), bytes),
        });
    }
    stopped
}

/// Which files [`fetch_files_ahead`] is given, and so what it fetches of the larger ones.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ahead {
    /// A listing in its order, as it arrives or taken up from [`PendingData`] (perhaps far
    /// ahead of the walker), or near a walker that goes in name order: not the walker's
    /// order. The larger files' first chunk.
    Listing,
    /// Files of the walker's directory's listing, those from entry `from` on after its last
    /// open (or all, as it enters the directory), the next it opens (`cp -r`, `tar`): the
    /// larger of those whole, within a quarter of the chunk memory each, so the link
    /// carries the next files while the walker copies this one. Not the file it opened
    /// nor those it skipped (its handle's reads decide how much of it is fetched: a
    /// database reading pages at random wants no whole file).
    Next { from: usize },
    /// The files after the walker in name order (`rsync`): not consecutive in the listing,
    /// so a Read each, the larger files whole as for [`Ahead::Next`].
    NextByName,
}

/// Bytes of small files in runs on their way ([`RUNS_IN_FLIGHT`]), and the most there were
/// at once; and the runs' sender ([`send_runs`]).
#[derive(Default)]
struct RunsInFlight {
    now: AtomicU64,
    peak: AtomicU64,
    sender: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<RunJob>>,
}

impl RunsInFlight {
    fn add(&self, bytes: u64) {
        let now = self.now.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// Sends `job`'s request after every run handed over before it ([`send_runs`]).
    fn send(&self, job: RunJob) {
        let tx = self.sender.get_or_init(|| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(send_runs(rx));
            tx
        });
        let _ = tx.send(job);
    }
}

/// A run of a listing's small files to ask for, and where each file's bytes go.
struct RunJob {
    client: Client,
    dir: Bytes,
    run: ferry_client::Run,
    want: HashMap<Bytes, (FileKey, oneshot::Sender<Bytes>)>,
    _on_its_way: OnItsWay,
}

/// Sends the runs handed to it in that order (nearest the walker first: [`Lister::top_up`]),
/// all in flight at once, from one task: a task each ran in the runtime's order, and the
/// server (serving a client's reads in the order they arrive) saw the walk's next files
/// after runs sent later. Ends when the mount drops the sender.
async fn send_runs(mut jobs: tokio::sync::mpsc::UnboundedReceiver<RunJob>) {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let mut running = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            job = jobs.recv() => match job {
                Some(job) => running.push(run_job(job)),
                None => break,
            },
            Some(()) = running.next(), if !running.is_empty() => {}
        }
    }
    while running.next().await.is_some() {}
}

/// Asks for one run's files and hands each its bytes (only those of the version its listing
/// showed: a file changed since is fetched as usual, as is every file when the run fails).
async fn run_job(job: RunJob) {
    let RunJob {
        client,
        dir,
        run,
        mut want,
        _on_its_way,
    } = job;
    let Ok((got, _)) = client
        .read_dir_data(dir, run.cookie, run.count, SMALL_FILE_MAX)
        .await
    else {
        return;
    };
    for l in got {
        let (Some(d), Some((key, tx))) = (l.data, want.remove(&l.entry.name)) else {
            continue;
        };
        if l.entry.attr.version() == key.version {
            let _ = tx.send(d.data);
        }
    }
}

/// A run's bytes counted in [`Lister::runs`] until it is answered (or dropped).
struct OnItsWay(Arc<RunsInFlight>, u64);

impl Drop for OnItsWay {
    fn drop(&mut self) {
        self.0.now.fetch_sub(self.1, Ordering::Relaxed);
    }
}

/// An entry with a name, for [`fetch_files_ahead`].
trait Named {
    fn name(&self) -> &Bytes;
}

impl Named for DirEntry {
    fn name(&self) -> &Bytes {
        &self.name
    }
}

impl Named for DirItem {
    fn name(&self) -> &Bytes {
        &self.name
    }
}

impl ListedEntry for DirItem {
    fn cookie(&self) -> u64 {
        self.cookie
    }
    fn attr(&self) -> &Attr {
        &self.attr
    }
}

impl Lister {
    /// Whether a walk's start brings the listings under it in a page
    /// ([`fetch_tree`]): from a ferryd that sends a tree's listings (not from S3).
    fn tree_ahead(&self) -> bool {
        self.client.s3().is_none() && self.client.session().features & features::TREE != 0
    }

    /// Whether files are being read: one was opened within [`READING`]. Only then do
    /// listings bring the contents of small files, and listings fetched ahead the first
    /// bytes of their files; a walk that only lists (`find`, `ls -lR`, `du`) moves no
    /// file data.
    fn reading(&self) -> bool {
        lock(&self.last_open).is_some_and(|t| t.elapsed() < READING)
    }

    /// Reads the targets of the symlinks among `entries` of directory `dir` ahead, for the
    /// copy's `readlink` (one round trip each otherwise, in turn).
    fn read_links_ahead(&self, dir: &Bytes, entries: &[DirEntry]) {
        let listed = Instant::now();
        for e in entries.iter().filter(|e| e.attr.kind == FileKind::Symlink) {
            let path = Bytes::from(join(dir, &e.name));
            let (client, links) = (
                self.client.with_class(Class::Prediction),
                self.links.clone(),
            );
            let (version, ttl) = (e.attr.version(), self.ttl);
            tokio::spawn(async move {
                if let Ok(target) = client.readlink(path.clone()).await {
                    let mut l = lock(&links);
                    if l.len() >= LINKS_MAX {
                        l.retain(|_, (_, t, _)| t.elapsed() < ttl);
                        if l.len() >= LINKS_MAX {
                            l.clear();
                        }
                    }
                    l.insert(path, (version, listed, target));
                }
            });
        }
    }

    /// Fetches the small files of listings that found no room when they arrived, or came
    /// before the walk read files ([`PendingData`]), while the chunk memory has room,
    /// oldest first; those listed longer than the TTL ago are dropped (their attributes
    /// are no longer the ones a copy would open). When the reader (a file being opened in
    /// `reader_dir`) is in another directory than at the last call, the waiting listings
    /// are put in the walk's order from it first: those at and after its directory,
    /// nearest first, then the rest as they were.
    ///
    /// Arrival order alone is the lister's, which may not be the reader's: `rsync` lists
    /// a tree ahead of its reads (incremental recursion), and the listings ahead arrived
    /// in listing order before its moves voted for name order. Taken oldest first without
    /// this order, the chunk memory filled with directories it reached seconds later, and
    /// 80-130 of its reads waited a round trip each (a WAN `rsync -a` of a source tree
    /// 6.9-9.3 s against 3.8-4.8).
    fn top_up(&self, reader_dir: &Bytes) {
        let moved = {
            let mut p = lock(&self.pending);
            (!p.queue.is_empty() && p.sorted_for.as_ref() != Some(reader_dir)).then(|| {
                p.sorted_for = Some(reader_dir.clone());
                Vec::from(std::mem::take(&mut p.queue))
            })
        };
        // Sorted outside the pending lock (the walk's positions have their own).
        if let Some(mut taken) = moved {
            {
                let a = lock(&self.ahead);
                if let Some(here) = a.pos.get(reader_dir) {
                    // Stable: the rest keep their order behind the walk's next ones. Each
                    // key (a position, cloned) is made once, not per comparison.
                    taken.sort_by_cached_key(|(dir, ..)| match a.pos.get(dir) {
                        Some(p) if p >= here => (false, Some(p.clone())),
                        _ => (true, None),
                    });
                }
            }
            let mut p = lock(&self.pending);
            let newer = std::mem::take(&mut p.queue);
            p.queue = taken.into();
            p.queue.extend(newer);
        }
        let mut p = lock(&self.pending);
        while let Some((dir, listed, entries, from)) = p.pop_front() {
            if listed.elapsed() >= self.ttl {
                continue;
            }
            let n = entries.len();
            let stopped = fetch_files_ahead(
                &self.client,
                &self.store,
                &self.runs,
                &dir,
                &entries,
                from..n,
                Ahead::Listing,
            );
            if stopped < n {
                p.push_front((dir, listed, entries, stopped));
                break;
            }
        }
    }

    /// Directory read-ahead (see the module docs): the listings of the subdirectories of
    /// `path` among `entries` are fetched now, in the background, for their `opendir`; as
    /// each arrives, the first bytes of its first files are fetched and its own
    /// subdirectories listed, up to [`DIRS_AHEAD`] listings held.
    fn list_subdirs_ahead(&self, path: &Bytes, entries: &[DirEntry]) {
        self.list_subdirs_ahead_paged(path, entries, None);
    }

    /// As [`Lister::list_subdirs_ahead`]; where a walk starts, `page` holds the listings
    /// under `path` that came with its own (from [`fetch_tree`], and when it was asked for)
    /// rather than being asked for now.
    fn list_subdirs_ahead_paged(
        &self,
        path: &Bytes,
        entries: &[DirEntry],
        page: Option<(Instant, Tree)>,
    ) {
        if self.ttl.is_zero() {
            return; // every opendir lists afresh
        }
        let mut a = lock(&self.ahead);
        // While files are read, a listing ahead serves their opens, which take versions
        // younger than the open TTL: older ones are listed again before the walker
        // arrives (their contents fetched ahead stay, held for their version).
        let ttl = if self.reading() && !self.open_ttl.is_zero() {
            self.ttl.min(self.open_ttl)
        } else {
            self.ttl
        };
        a.expire(ttl);
        let mut new_walk = false;
        let (base, base_other) = match (a.pos.get(path), a.other.get(path)) {
            (Some(p), Some(o)) => (p.clone(), o.clone()),
            _ => {
                // A directory outside the walk so far: a new walk starts here.
                new_walk = true;
                a.todo.clear();
                a.pos.clear();
                a.other.clear();
                a.walker = None;
                a.walker_path = None;
                a.votes = (0, 0);
                a.pos.insert(path.clone(), Pos::new());
                a.other.insert(path.clone(), Pos::new());
                (Pos::new(), Pos::new())
            }
        };
        let dirs: Vec<(usize, &DirEntry)> = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.attr.kind == FileKind::Directory && e.attr.size <= DIR_AHEAD_MAX_SIZE
            })
            .collect();
        let mut by_name: Vec<usize> = (0..dirs.len()).collect();
        by_name.sort_by(|&x, &y| dirs[x].1.name.cmp(&dirs[y].1.name));
        let mut name_rank = vec![0u32; dirs.len()];
        for (r, &d) in by_name.iter().enumerate() {
            name_rank[d] = r as u32;
        }
        for (d, &(i, e)) in dirs.iter().enumerate() {
            let child = Bytes::from(join(path, &e.name));
            let (listing, name) = (i as u32, name_rank[d]);
            let (mine, theirs) = if a.by_name {
                (name, listing)
            } else {
                (listing, name)
            };
            let (mut p, mut o) = (base.clone(), base_other.clone());
            p.push(mine);
            o.push(theirs);
            a.pos.insert(child.clone(), p.clone());
            a.other.insert(child.clone(), o);
            a.todo.insert(p, child);
        }
        while a.todo.len() > TODO_MAX {
            a.todo.pop_last(); // the furthest from the walker
        }
        if a.pos.len() > 16 * TODO_MAX {
            // A walk this large forgets where it was (the next directory starts a new one).
            a.pos.clear();
            a.other.clear();
        }
        if new_walk && !dirs.is_empty() {
            if let Some((started, below)) = page {
                // A walk's start whose listing came with the listings under it (a round
                // trip for a small tree's, rather than one per level).
                drop(a);
                self.hold_page(started, below);
                return;
            }
            if self.tree_ahead() {
                // A walk's start listed on its own: the listings under it come in one page
                // now, then the rest as usual.
                a.in_flight += 1;
                drop(a);
                let me = self.clone();
                let path = path.clone();
                let started = Instant::now();
                tokio::spawn(async move {
                    let below = match fetch_tree(&me, path).await {
                        Ok(mut tree) => tree.split_off(1.min(tree.len())),
                        Err(_) => Vec::new(),
                    };
                    lock(&me.ahead).in_flight -= 1;
                    me.hold_page(started, below);
                });
                return;
            }
        }
        self.launch(&mut a);
    }

    /// Holds the listings of a tree page under a walk's start (`below`, by path, breadth
    /// first, asked for at `started`) as if each had been listed ahead then, and gives each
    /// its turn to place its subdirectories in the walk; the last turn launches what is
    /// left.
    fn hold_page(&self, started: Instant, below: Tree) {
        let held: Vec<bool> = {
            let mut a = lock(&self.ahead);
            a.forget_gone_pages();
            // Not one walked or held already (listed since the page was asked for: its
            // files are pending or on their way from that listing).
            below
                .iter()
                .map(|(path, entries)| {
                    if a.walked.contains_key(path) || a.by_path.contains_key(path) {
                        return false;
                    }
                    let cell = tokio::sync::OnceCell::new_with(Some(Ok(entries.clone())));
                    a.by_path.insert(path.clone(), (started, Arc::new(cell)));
                    a.order.push_back(path.clone());
                    a.from_pages.insert(path.clone());
                    true
                })
                .collect()
        };
        // Taken as fetch_listing takes a listing, but for the files, which wait in the
        // pending queue to be fetched in the walk's order rather than the page's
        // (Lister::top_up).
        for ((path, entries), _) in below.iter().zip(&held).filter(|(_, &h)| h) {
            self.xattrs.ahead(&self.client, path, self.ttl);
            listed(self, path.clone(), entries, false);
        }
        // Breadth first: each parent's turn gives its subdirectories their places in the
        // walk before theirs come.
        for (path, entries) in &below {
            // Not one the walk no longer knows (another walk started since): its turn
            // would start a walk there.
            if lock(&self.ahead).pos.contains_key(path) {
                self.list_subdirs_ahead(path, entries);
            }
        }
        self.launch(&mut lock(&self.ahead));
    }

    /// Starts listings from `todo`, nearest to the walker first (depth-first listing order
    /// from the directory it opened last), while fewer than [`LISTINGS_AHEAD_IN_FLIGHT`]
    /// are in flight; of the [`DIRS_AHEAD`] held, the furthest makes way for a nearer one.
    fn launch(&self, a: &mut DirsAhead) {
        while a.in_flight < LISTINGS_AHEAD_IN_FLIGHT {
            // The next directory: the first after the walker's position, else the first.
            let next = a
                .walker
                .as_ref()
                .and_then(|w| a.todo.range(w.clone()..).next())
                .or_else(|| a.todo.iter().next())
                .map(|(k, _)| k.clone());
            let Some(next) = next else { break };
            let min = if self.client.s3().is_some() {
                HELD_WHILE_READING_MIN_S3
            } else {
                HELD_WHILE_READING_MIN
            };
            if self.reading() && a.held_alone() >= a.held_while_reading(min) {
                // Full while files are read: the walker moves at the pace of its copies and
                // reaches the listings held before they expire; one that made way would be
                // listed again soon (a `cp -r` of a 919-directory source tree listed them
                // 1,650-2,760 times with eviction, 1,160-1,190 without).
                break;
            }
            if a.by_path.len() >= DIRS_AHEAD {
                // Full: the held listing furthest from the walker makes way if the next is
                // nearer (and goes back to be listed when it is near again): a walk that only
                // lists (`find`, `ls -lR`) outruns the listings.
                let Some((far, far_rank)) = a
                    .by_path
                    .keys()
                    .filter_map(|p| a.pos.get(p).map(|k| (p.clone(), a.rank(k))))
                    .max_by(|x, y| x.1.cmp(&y.1))
                else {
                    break;
                };
                if far_rank <= a.rank(&next) {
                    break;
                }
                a.by_path.remove(&far);
                a.order.retain(|p| p != &far);
                if let Some(k) = a.pos.get(&far).cloned() {
                    a.todo.insert(k, far);
                }
            }
            let Some(child) = a.todo.remove(&next) else {
                break;
            };
            // Walked within the TTL (`expire` forgets older walks): its walker has listed it
            // already, also when a listing of its parent arrived again since and found it
            // anew (evicted and re-listed parents would otherwise list their walked subtrees
            // again and again: 6,634 listings for 919 directories in a `find` over a bucket).
            if a.walked.contains_key(&child) || a.by_path.contains_key(&child) {
                continue;
            }
            let cell = Arc::new(tokio::sync::OnceCell::new());
            a.by_path
                .insert(child.clone(), (Instant::now(), cell.clone()));
            a.order.push_back(child.clone());
            a.in_flight += 1;
            let me = self.clone();
            tokio::spawn(async move {
                // Listings ahead are sent as demand: they are small, and a listing queued
                // behind the files' contents (prediction) would hold up the whole walk.
                let reading = me.reading();
                let got = cell
                    .get_or_init(|| fetch_listing(&me, child.clone(), reading))
                    .await;
                lock(&me.ahead).in_flight -= 1;
                match got {
                    Ok(entries) => {
                        // (Its files are on their way if files are being read: fetch_listing.)
                        me.list_subdirs_ahead(&child, entries);
                    }
                    Err(_) => me.launch(&mut lock(&me.ahead)),
                }
            });
        }
    }

    /// Lists directory `parent` (at `path`) again and replaces its kept listing with the
    /// new one (where pipelining got to stays), in the background.
    fn refresh(&self, parent: u64, path: Bytes) {
        let me = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let got = me.client.read_dir(path.clone()).await;
            if let (Some(ids), Ok(entries)) = (&me.ids, &got) {
                ids.learn(&me.client, entries.iter().map(|e| &e.attr)).await;
            }
            let Ok(entries) = got else {
                if let Some(l) = lock(&me.listings).by_dir.get_mut(&parent) {
                    l.refreshing = false;
                }
                return;
            };
            // Made, sorted by name if the old one was, and the old one dropped, outside the
            // lock every lookup and open takes: for 100,000 names each is tens of
            // milliseconds.
            let sorted = lock(&me.listings)
                .by_dir
                .get(&parent)
                .is_some_and(|l| l.by_name.get().is_some());
            let mut new = Listing::new(path, entries, started);
            if sorted {
                new.by_name();
            }
            let _old = {
                let mut ls = lock(&me.listings);
                let Some(l) = ls.by_dir.get_mut(&parent) else {
                    return;
                };
                // Where pipelining got to stays, and whether its files were opened.
                new.pipelined_until = l.pipelined_until;
                new.rewound = l.rewound;
                new.opened = l.opened;
                std::mem::replace(l, new)
            };
        });
    }

    /// The listing fetched ahead for `path` and when it was started, if it has arrived
    /// (left for its `opendir`).
    fn peek(&self, path: &Bytes) -> Option<(Instant, Vec<DirEntry>)> {
        let a = lock(&self.ahead);
        let (started, cell) = a.by_path.get(path)?;
        match cell.get() {
            Some(Ok(entries)) => Some((*started, entries.clone())),
            _ => None,
        }
    }

    /// Records that `path` is being listed for an `opendir` (not listed ahead again), and
    /// takes the listing fetched ahead for it, if any.
    fn take(&self, path: &Bytes) -> Option<(Instant, ListingCell)> {
        let mut a = lock(&self.ahead);
        a.last_walk = Some(Instant::now());
        a.walked_to(path);
        if !self.ttl.is_zero() && a.walked.insert(path.clone(), Instant::now()).is_none() {
            a.walked_order.push_back(path.clone());
        }
        let hit = a.by_path.remove(path);
        if hit.is_some() {
            a.order.retain(|p| p != path);
            // A place to hold one more.
            self.launch(&mut a);
        }
        hit
    }
}

impl Fs {
    /// The kernel no longer holds the pages of files read lately (see [`Fs::read`]): they
    /// are fetched ahead again for a walk over them. The store forgets which were read
    /// ([`ChunkStore::read_lately`]), and each kept listing hands its files near the next
    /// one opened to the prefetcher afresh (files held or on their way are not asked for
    /// twice).
    pub(super) fn pages_dropped(&self) {
        tracing::debug!("the kernel dropped pages of files read lately: fetching them ahead again");
        self.store.forget_read_lately();
        for l in lock(&self.dirs.listings).by_dir.values_mut() {
            l.rewound = true;
        }
    }

    /// Opens directory `ino`: the whole listing is fetched now (paged on the wire) and
    /// served from memory to the kernel's readdir calls on this handle.
    ///
    /// # Errors
    /// As [`Fs::getattr`].
    pub async fn opendir(&self, ino: u64) -> Result<u64, Error> {
        let path = self.inodes.path_of(ino)?;
        let items = self.list_and_keep(ino, &path, true).await?;
        let fh = self.next_fh();
        lock(&self.dirs.open).insert(fh, items);
        // While files are being read (a copy), the first files of the directory are on
        // their way before the first is opened; a walk that only lists (`find`, `ls -lR`,
        // `du`) moves no file data.
        if self.lister().reading() {
            self.pipeline_files(ino, &path, 0);
            self.refresh_ancestors(&path);
        }
        Ok(fh)
    }

    /// The most bytes of small files in runs ahead of the walker that were on their way at
    /// once since the mount started (`RUNS_IN_FLIGHT`, 8 MiB, bounds it).
    pub fn small_file_runs_peak(&self) -> u64 {
        self.dirs.runs.peak.load(Ordering::Relaxed)
    }

    /// How long ago the listing of directory `dir` kept for lookups and opens was taken;
    /// `None` when none is kept.
    pub fn listing_age(&self, dir: u64) -> Option<Duration> {
        lock(&self.dirs.listings)
            .by_dir
            .get(&dir)
            .map(|l| l.listed.elapsed())
    }

    /// A copy that goes down into directory `path` comes back up to open the files after it
    /// in the directories above, often more than the open TTL later (a `cp -r` of a
    /// directory with a large subdirectory in the middle): then each such return would wait
    /// a round trip for a new listing before its first open. So the kept listings of the
    /// directories above, past half the open TTL, are listed again now, in the background,
    /// at most [`ANCESTORS_REFRESHED`] levels up. Not for an S3 source, where a listing is
    /// a LIST request that scans its prefix.
    fn refresh_ancestors(&self, path: &Bytes) {
        let max_age = open_max_age(&self.cfg);
        if max_age.is_zero() || self.client.s3().is_some() {
            return;
        }
        let mut at = path.clone();
        for _ in 0..ANCESTORS_REFRESHED {
            let (parent, _) = ferry_proto::name::split(&at);
            if parent.len() >= at.len() {
                return; // the export root
            }
            let Some(dir) = self.inodes.ino_of(&parent) else {
                return; // above the mount's root
            };
            let due = lock(&self.dirs.listings)
                .by_dir
                .get_mut(&dir)
                .and_then(|l| l.due_for_refresh(max_age));
            if let Some(path) = due {
                self.lister().refresh(dir, path);
            }
            at = parent;
        }
    }

    /// Lists directory `ino` (at `path`): the listing fetched ahead for it if there is one,
    /// else from the server; it is kept for small-file pipelining and lookups, and with
    /// `ahead` (a walk: `opendir`) its subdirectories are listed ahead.
    async fn list_and_keep(
        &self,
        ino: u64,
        path: &Bytes,
        ahead: bool,
    ) -> Result<Arc<Vec<DirItem>>, Error> {
        // Listed a moment ago (for a lookup): not again.
        let recent = {
            let ls = lock(&self.dirs.listings);
            ls.by_dir
                .get(&ino)
                .filter(|l| {
                    l.listed.elapsed() < RELIST_AFTER.min(self.cfg.attr_ttl).min(self.cfg.open_ttl)
                })
                .map(|l| l.items.clone())
        };
        if let Some(items) = recent {
            return Ok(items);
        }
        let (entries, listed, page) = self.listing(path, ahead).await?;
        if ahead {
            let page = page.map(|below| (listed, below));
            self.lister().list_subdirs_ahead_paged(path, &entries, page);
        }
        let listing = Listing::new(path.clone(), entries, listed);
        let items = listing.items.clone();
        let mut ls = lock(&self.dirs.listings);
        // Listings replaced or let go are dropped after the lock (a large one takes a while).
        let mut dropped = Vec::new();
        match ls.by_dir.insert(ino, listing) {
            Some(old) => dropped.push(old),
            None => {
                ls.order.push_back(ino);
                // The oldest go, but not those of the directories above this one: a copy
                // comes back up to open their files after this subtree, and a subtree of
                // more than KEPT_LISTINGS directories (`node/openssl/archs`) let them go, so
                // each return waited a round trip to list them again.
                let mut passed = 0;
                while ls.order.len() > KEPT_LISTINGS && passed < ls.order.len() {
                    let Some(old) = ls.order.pop_front() else {
                        break;
                    };
                    let above = ls.by_dir.get(&old).is_some_and(|l| {
                        path.len() > l.path.len()
                            && path.starts_with(&l.path)
                            && (l.path.is_empty() || path[l.path.len()] == b'/')
                    });
                    if above {
                        ls.order.push_back(old);
                        passed += 1;
                    } else {
                        dropped.extend(ls.by_dir.remove(&old));
                    }
                }
            }
        }
        drop(ls);
        drop(dropped);
        Ok(items)
    }

    /// The attributes of entry `name` of directory `parent` (at `parent_path`) from a
    /// listing, when a listing answers: one kept from within the TTL that holds the name,
    /// else, for a directory small enough to list ahead, its listing now (taken from the
    /// listings fetched ahead, or fetched: one round trip for all its entries rather than
    /// one per name; absent from it means absent now). `Ok(None)`: ask the server about
    /// the name alone.
    ///
    /// Tools that walk a tree look up (or reopen) every name of a directory after its
    /// attributes have expired: rsync builds its whole file list first, then opens each
    /// file, long after. Revalidating a directory at once keeps that to one round trip per
    /// directory. `max_age`: the oldest listing that may answer (the attribute TTL for a
    /// lookup, the open TTL for an open's revalidation).
    ///
    /// # Errors
    /// ENOENT for a name absent from a listing fetched now; listing errors.
    pub(super) async fn listed_attr(
        &self,
        parent: u64,
        parent_path: &Bytes,
        name: &[u8],
        max_age: Duration,
    ) -> Result<Option<(Attr, Instant)>, Error> {
        if max_age.is_zero() {
            return Ok(None);
        }
        {
            let mut ls = lock(&self.dirs.listings);
            if let Some(l) = ls.by_dir.get_mut(&parent) {
                let age = l.listed.elapsed();
                // In use past half its life: listed again in the background, so a copy of a
                // large directory (longer than the TTL) keeps finding its names here instead
                // of asking for each (one round trip per name).
                if let Some(path) = l.due_for_refresh(max_age) {
                    self.lister().refresh(parent, path);
                }
                if age < max_age {
                    return Ok(l.index.get(name).map(|&i| (l.items[i].attr, l.listed)));
                }
                // Too old for this open: the directories kept after it are likely next
                // (a walker that listed the tree first, as rsync does, opens files in the
                // same order later): they are listed again now, in the background, so the
                // walker's next opens find fresh listings instead of one round trip each.
                let ls = &mut *ls;
                refresh_following(ls, parent, max_age, &self.lister());
            }
        }
        // A listing fetched ahead for the directory answers too, and stays for its opendir.
        if let Some((started, entries)) = self.lister().peek(parent_path) {
            if started.elapsed() < max_age {
                return Ok(entries
                    .iter()
                    .find(|e| e.name.as_ref() == name)
                    .map(|e| (e.attr, started)));
            }
        }
        let small = match self.inodes.path_and_fresh_attr(parent, Duration::MAX) {
            Ok((_, Some(a))) => a.kind == FileKind::Directory && a.size <= DIR_AHEAD_MAX_SIZE,
            _ => false,
        };
        if !small {
            return Ok(None);
        }
        // While files are being read (rsync reopening each file of its list), the
        // directories below are listed again ahead too, with their files.
        let walking = self.lister().reading();
        let items = self.list_and_keep(parent, parent_path, walking).await?;
        match items.iter().find(|it| it.name.as_ref() == name) {
            Some(it) => Ok(Some((it.attr, it.listed))),
            None if items
                .first()
                .is_some_and(|it| it.listed.elapsed() < self.cfg.attr_ttl) =>
            {
                Err(Error::errno(libc::ENOENT, "no such entry"))
            }
            None => Ok(None),
        }
    }

    /// Forgets what listings say of directory `parent_path` (kept, or fetched ahead): an
    /// object in it was found replaced, so a lookup must ask again.
    pub(super) fn drop_listing(&self, parent_path: &Bytes) {
        if let Some(parent) = self.inodes.ino_of(parent_path) {
            let mut ls = lock(&self.dirs.listings);
            if ls.by_dir.remove(&parent).is_some() {
                ls.order.retain(|&d| d != parent);
            }
        }
        let mut a = lock(&self.dirs.ahead);
        if a.by_path.remove(parent_path).is_some() {
            a.order.retain(|p| p != parent_path);
        }
        drop(a);
        self.dirs.xattrs.forget(parent_path);
    }

    /// Attributes of `path` the server gave less than `max_age` ago, asked ahead of its
    /// open ([`Fs::stat_ahead`]).
    pub(super) fn stat_fresh(&self, path: &Bytes, max_age: Duration) -> Option<(Attr, Instant)> {
        let st = lock(&self.dirs.stats);
        st.fresh
            .get(path)
            .filter(|(_, t)| t.elapsed() < max_age)
            .copied()
    }

    /// Close-to-open in a large directory (whose listing takes longer than the open TTL to
    /// arrive): the attributes of the [`STATS_AHEAD`] regular files after `name` in the kept
    /// listing of directory `parent` (at `parent_path`) are asked now, so their opens (and
    /// lookups) find versions younger than the open TTL without a round trip each. A walker
    /// in listing order (`cp -r`, tar) gets them as pages of [`PAGE_AHEAD`] entries of the
    /// listing from a cookie, the next asked once it is into the last, and the one it is in
    /// asked again once half the open TTL old; one in name order (rsync) as a Stat per file
    /// for the [`STATS_AHEAD`] after it, many at once, with the contents of the files
    /// ahead of it in name order. Returns whether the walker goes in name order.
    pub(super) fn stat_ahead(&self, parent: u64, parent_path: &Bytes, name: &[u8]) -> bool {
        let mut data = None;
        let items = {
            let ls = lock(&self.dirs.listings);
            let Some(l) = ls.by_dir.get(&parent) else {
                return false;
            };
            let Some(&at) = l.index.get(name) else {
                return false;
            };
            let (rank, by_rank) = l.by_name();
            let r = rank[at] as usize;
            let mut st = lock(&self.dirs.stats);
            if st.last_open.len() > KEPT_LISTINGS {
                st.last_open.clear();
                st.paged.clear();
                st.fetched_by_name.clear();
            }
            let before = st.last_open.insert(parent, (at, r));
            let follows = |b: usize, now: usize| b < now && now - b <= 8;
            match before {
                Some((b, _)) if follows(b, at) => {
                    let kept = Arc::as_ptr(&l.items) as usize;
                    let paged = st.paged.entry(parent).or_insert_with(|| Paged {
                        kept,
                        pages: VecDeque::new(),
                    });
                    if paged.kept != kept {
                        *paged = Paged {
                            kept,
                            pages: VecDeque::new(),
                        };
                    }
                    // Pages the walker has passed are done with. The one it is in was
                    // asked within half the open TTL, or its versions will be too old for
                    // the opens before the walker is through it: a walker slowed down (a
                    // large file, a busy machine) would then wait a round trip per file,
                    // which slows it further, until the next page is due. Asked again
                    // from here instead.
                    while paged
                        .pages
                        .front()
                        .is_some_and(|&(p, _)| p + PAGE_AHEAD <= at + 1)
                    {
                        paged.pages.pop_front();
                    }
                    let stale = open_max_age(&self.cfg) / 2;
                    if paged
                        .pages
                        .front()
                        .is_some_and(|&(_, t)| t.elapsed() >= stale)
                    {
                        paged.pages.clear();
                    }
                    let until = paged.pages.back().map_or(0, |&(p, _)| p + PAGE_AHEAD);
                    let from = until.max(at + 1);
                    if until > at + PAGE_AHEAD || from >= l.items.len() {
                        return false;
                    }
                    paged.pages.push_back((from, Instant::now()));
                    let cookie = l.items[from - 1].cookie;
                    let (client, stats, dir) = (
                        self.client.clone(),
                        self.dirs.stats.clone(),
                        parent_path.clone(),
                    );
                    tokio::spawn(async move {
                        // A server may send fewer entries a page (its frames are smaller):
                        // the rest follow, so the page covers what was counted above.
                        let (mut cookie, mut left) = (cookie, PAGE_AHEAD);
                        while left > 0 {
                            let sent = Instant::now();
                            let Ok((entries, eof)) =
                                client.read_dir_page(dir.clone(), cookie, left as u32).await
                            else {
                                return; // the opens ask for their own
                            };
                            let Some(last) = entries.last() else { return };
                            (cookie, left) = (last.cookie, left.saturating_sub(entries.len()));
                            let mut st = lock(&stats);
                            for e in entries.iter().filter(|e| e.attr.kind == FileKind::File) {
                                st.keep(Bytes::from(join(&dir, &e.name)), e.attr, sent);
                            }
                            if eof {
                                return;
                            }
                        }
                    });
                    return false;
                }
                Some((_, br)) if follows(br, r) => {
                    // The files' contents too: fetching ahead in listing order (on each
                    // open) does not serve a walker in name order in a directory larger
                    // than the chunk memory. A Read each (ReadDirData takes consecutive
                    // entries), the next batch once the walker is half way through the last.
                    let kept = Arc::as_ptr(&l.items) as usize;
                    let until = match st.fetched_by_name.get(&parent) {
                        Some(&(k, u)) if k == kept => u,
                        _ => 0,
                    };
                    let from = until.max(r + 1);
                    if until <= r + PIPELINE_FILES / 2 && from < by_rank.len() {
                        let next: Vec<DirItem> = by_rank
                            .iter()
                            .skip(from)
                            .take(PIPELINE_FILES)
                            .map(|&i| l.items[i as usize].clone())
                            .collect();
                        data = Some((kept, from, next));
                    }
                    by_rank
                        .iter()
                        .skip(r + 1)
                        .map(|&i| &l.items[i as usize])
                        .filter(|it| it.attr.kind == FileKind::File)
                        .take(STATS_AHEAD)
                        .map(|it| Bytes::from(join(parent_path, &it.name)))
                        .collect::<Vec<_>>()
                }
                _ => return false,
            }
        };
        if let Some((kept, from, next)) = data {
            // Up to where the chunk memory ran out: the rest once the walker freed some.
            let n = next.len();
            let stopped = fetch_files_ahead(
                &self.client,
                &self.store,
                &self.dirs.runs,
                parent_path,
                &next,
                0..n,
                Ahead::NextByName,
            );
            lock(&self.dirs.stats)
                .fetched_by_name
                .insert(parent, (kept, from + stopped));
        }
        let mut st = lock(&self.dirs.stats);
        for path in items {
            let fresh = st
                .fresh
                .get(&path)
                .is_some_and(|(_, t)| t.elapsed() < self.cfg.open_ttl / 2);
            if fresh || !st.asked.insert(path.clone()) {
                continue;
            }
            let (client, stats) = (self.client.clone(), self.dirs.stats.clone());
            tokio::spawn(async move {
                let sent = Instant::now();
                let got = client.stat(path.clone()).await;
                let mut st = lock(&stats);
                st.asked.remove(&path);
                if let Ok(attr) = got {
                    st.keep(path, attr, sent);
                }
            });
        }
        true
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
    async fn listing(&self, path: &Bytes, walk: bool) -> Result<Listed, Error> {
        let lister = self.lister();
        let ahead = lister.take(path);
        tracing::trace!(
            "listing /{}: {}",
            String::from_utf8_lossy(path),
            match &ahead {
                None => "not fetched ahead".to_string(),
                Some((t, c)) => format!(
                    "fetched ahead {:?} ago, ready {}",
                    t.elapsed(),
                    c.initialized()
                ),
            }
        );
        if let Some((started, cell)) = ahead {
            if started.elapsed() < self.cfg.attr_ttl {
                let reading = lister.reading();
                let got = cell
                    .get_or_init(|| fetch_listing(&lister, path.clone(), reading))
                    .await;
                if let Ok(entries) = got {
                    return Ok((entries.clone(), started, None));
                }
                // A failed listing ahead is retried now, and its error reported if it
                // fails again.
            }
        }
        let at = Instant::now();
        let reading = lister.reading();
        if walk && lister.tree_ahead() && !lock(&lister.ahead).pos.contains_key(path) {
            // A walk starts here: one round trip rather than one to list it and one more
            // for the page.
            if let Some((entries, below)) =
                fetch_listing_and_tree(&lister, path.clone(), reading).await
            {
                return Ok((entries, at, Some(below)));
            }
        }
        Ok((
            fetch_listing(&lister, path.clone(), reading).await?,
            at,
            None,
        ))
    }

    /// The target of symlink `path` at `version` when it was read ahead within the TTL
    /// (taken: read once).
    pub(super) fn link_read_ahead(&self, path: &Bytes, version: Version) -> Option<Bytes> {
        let (v, listed, target) = lock(&self.dirs.links).remove(path)?;
        (v == version && listed.elapsed() < self.cfg.attr_ttl).then_some(target)
    }

    fn lister(&self) -> Lister {
        Lister {
            client: self.client.clone(),
            store: self.store.clone(),
            ahead: self.dirs.ahead.clone(),
            listings: self.dirs.listings.clone(),
            ttl: self.cfg.attr_ttl,
            open_ttl: self.cfg.open_ttl,
            last_open: self.dirs.last_open.clone(),
            pending: self.dirs.pending.clone(),
            runs: self.dirs.runs.clone(),
            links: self.dirs.links.clone(),
            xattrs: self.dirs.xattrs.clone(),
            ids: self.dirs.ids.clone(),
        }
    }

    /// Small-file pipelining (see the module docs) for the opening of file `ino`: chunk 0 of
    /// the files after it in its directory's kept listing, if there is one.
    pub(super) async fn pipeline_next_files(&self, ino: u64, key: &FileKey, by_name: bool) {
        *lock(&self.dirs.last_open) = Some(Instant::now());
        let Ok(path) = self.inodes.path_of(ino) else {
            return;
        };
        let (parent_path, name) = ferry_proto::name::split(&path);
        // A small file opened before its contents came ahead (a walk's first file, or one
        // whose listing's runs still wait for room) is asked for now as the reader's own
        // request, before the runs this open may send: its read would otherwise wait for a
        // run among them, queued behind the other predictions. Not one read lately (this
        // open may have just handed it to the page cache: most opens of a copy, answered
        // by that look alone) or held.
        if is_small_file(FileKind::File, key.version.size)
            && !self.store.read_lately(key)
            && !self.store.held(key, 0)
        {
            self.store.start_if_room(key, 0);
        }
        let lister = self.lister();
        lister.top_up(&parent_path);
        if by_name {
            return; // a walker in name order in a large directory: see Fs::stat_ahead
        }
        let Some(parent) = self.inodes.ino_of(&parent_path) else {
            return;
        };
        let kept = |fs: &Fs| {
            let ls = lock(&fs.dirs.listings);
            ls.by_dir
                .get(&parent)
                .and_then(|l| l.index.get(&name).copied())
        };
        let at = match kept(self) {
            Some(at) => at,
            None => {
                // No listing kept for the directory (a walker that listed the whole tree
                // first, as rsync does, opens its files long after): the directory is
                // listed now, one round trip for all its files, while this file's first
                // chunk is on its way already.
                let small = match self.inodes.path_and_fresh_attr(parent, Duration::MAX) {
                    Ok((_, Some(a))) => a.size <= DIR_AHEAD_MAX_SIZE,
                    _ => false,
                };
                if !small || self.cfg.attr_ttl.is_zero() {
                    return;
                }
                self.store.start(key, 0);
                if self
                    .list_and_keep(parent, &parent_path, true)
                    .await
                    .is_err()
                {
                    return;
                }
                let Some(at) = kept(self) else { return };
                at
            }
        };
        // Not from S3, where a listing is a LIST that scans its prefix.
        let max_age = open_max_age(&self.cfg);
        if !max_age.is_zero() && self.client.s3().is_none() {
            let mut ls = lock(&self.dirs.listings);
            if let Some(l) = ls.by_dir.get_mut(&parent) {
                l.opened = true;
            }
            refresh_unopened_ahead(&mut ls, parent, max_age, &lister);
        }
        self.pipeline_files(parent, &parent_path, at + 1);
    }

    /// Fetches the regular files of `parent`'s listing ahead ([`fetch_files_ahead`]: the
    /// small ones in runs, of the larger ones the first chunk, or the whole file from entry
    /// `from` on for a walk in listing order, [`Ahead::Next`]) up to position `from +
    /// PIPELINE_FILES`, from the first not handed out yet (so a walker that does not open
    /// files in listing order — rsync sorts by name — finds the ones it skipped on their
    /// way too), stopping when the chunk budget is spent (a later call resumes there).
    fn pipeline_files(&self, parent: u64, parent_path: &Bytes, from: usize) {
        if lock(&self.dirs.ahead).by_name {
            self.fetch_next_by_name(parent, parent_path, from);
        }
        let (start, end, all) = {
            let mut ls = lock(&self.dirs.listings);
            let Some(l) = ls.by_dir.get_mut(&parent) else {
                return;
            };
            if l.rewound {
                // Handed on again from near the walker (see Fs::pages_dropped): those
                // before it too, as a walker in name order may not have opened them yet;
                // not all, or in a directory of 100,000 files those it passed long ago
                // would take the memory meant for those ahead.
                l.rewound = false;
                l.pipelined_until = from.saturating_sub(PIPELINE_FILES);
            }
            let start = l.pipelined_until;
            let end = (from + PIPELINE_FILES).min(l.items.len());
            // Topped up once the lead is down to half, so the walker's opens ask for runs
            // of dozens of files, not a run of one file each (a request, and a seek into
            // the listing on the server, per file).
            if start >= end || start > from + PIPELINE_FILES / 2 {
                return;
            }
            (start, end, l.items.clone())
        };
        // Those already on their way are skipped. The larger files whole only for a walk in
        // listing order: for one in name order (rsync) the listing's order is not the
        // walker's, and files it reaches last would take the memory its next file's reads
        // need (a WAN `rsync -a` of the pgdata tree a tenth slower); its next ones in name
        // order came whole above.
        let ahead = if lock(&self.dirs.ahead).by_name {
            Ahead::Listing
        } else {
            Ahead::Next { from }
        };
        let done = fetch_files_ahead(
            &self.client,
            &self.store,
            &self.dirs.runs,
            parent_path,
            &all,
            start..end,
            ahead,
        );
        if let Some(l) = lock(&self.dirs.listings).by_dir.get_mut(&parent) {
            l.pipelined_until = l.pipelined_until.max(done);
        }
    }

    /// For a walker in name order (rsync): the larger files of `parent`'s kept listing that
    /// follow the one it opened (entry `from - 1`; from the first when `from` is 0, as it
    /// enters the directory) in name order, up to [`PIPELINE_FILES`] entries on, whole
    /// within a quarter of the chunk memory each ([`Ahead::NextByName`]): the files it reads
    /// next, carried by the link while it copies this one. Its small files come in runs in
    /// the listing's order ([`Fs::pipeline_files`]).
    fn fetch_next_by_name(&self, parent: u64, parent_path: &Bytes, from: usize) {
        let next: Vec<DirItem> = {
            let ls = lock(&self.dirs.listings);
            let Some(l) = ls.by_dir.get(&parent) else {
                return;
            };
            let (rank, order) = l.by_name();
            let first = match from.checked_sub(1) {
                None => 0,
                Some(opened) => match rank.get(opened) {
                    Some(&r) => r as usize + 1,
                    None => return,
                },
            };
            order
                .iter()
                .skip(first)
                .take(PIPELINE_FILES)
                .map(|&i| &l.items[i as usize])
                .filter(|it| {
                    it.attr.kind == FileKind::File && !is_small_file(it.attr.kind, it.attr.size)
                })
                .cloned()
                .collect()
        };
        if !next.is_empty() {
            fetch_files_ahead(
                &self.client,
                &self.store,
                &self.dirs.runs,
                parent_path,
                &next,
                0..next.len(),
                Ahead::NextByName,
            );
        }
    }
}
