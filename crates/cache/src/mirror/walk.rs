//! The walk: lists directories several at a time (`listings_in_flight`), creates each
//! directory and symlink found, and hands regular files to file jobs (at most
//! `files_in_flight` at once). Totals grow as the walk goes. From a server that sends a
//! tree's listings in a page (ReadTree, [`list`]) a listing brings those of the directories
//! under it, as far as the page reaches, and the small files' contents come in runs of
//! ReadDirData ([`ferry_client::small_file_runs`], up to [`RUNS_IN_FLIGHT`] at once); from
//! one that does not, they come with the listing's first page (a ReadDirData), and the rest
//! in runs behind it. Not in runs in directories where an earlier run left files (a resume
//! fetches only what is missing).
//!
//! Invariants: a directory exists locally before anything is created in it (its listing is
//! asked for, or one that came in a tree page taken, only once it is made; the root's is
//! asked for beside the Stat of the root, and handled once the root is made); the state
//! folder's name at the top level is never mirrored. Owners' names are learned while a
//! listing's subdirectories are made and their listings asked for; only the files' jobs,
//! which set owners, wait for them.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use ferry_client::{
    is_small_file, small_file_runs, Client, ClientError, Listed, Run, SmallFile, SMALL_FILE_MAX,
};
use ferry_proto::name::join;
use ferry_proto::{features, Attr, DirEntry, FileKind};
use ferry_util::AbortOnDrop;
use tokio::sync::Semaphore;
use tracing::debug;

use super::file::copy_file;
use super::metadata::{local_stamp, set_metadata};
use super::{remote_path, Ctx};
use crate::background;
use crate::state::CacheDir;

/// Runs of small files fetched at once ([`ferry_client::small_file_runs`]): with
/// [`ferry_client::RUN_BYTES`] each, the most their contents hold in memory before they are
/// written. With a tree's listings in a few pages, nearly every small file comes in a run,
/// and on a WAN the runs in flight set the pace: 32 took a source tree 2.06-2.15 s, 128
/// 1.65-1.83 s (ferryd's memory budget holds about as many of their pages at once).
const RUNS_IN_FLIGHT: usize = 128;

/// Lists the tree, creates directories and symlinks, runs file jobs. Returns every
/// directory (relative path, attributes), root included, for their metadata.
///
/// `first`: the root's listing, asked for beside the Stat of the root ([`RootListing`]);
/// `known`: [`Known`].
pub(super) async fn walk(
    ctx: &Arc<Ctx>,
    root_attr: Attr,
    known: Known,
    first: RootListing,
) -> Vec<(Bytes, Attr)> {
    let mut dirs = vec![(Bytes::new(), root_attr)];
    let mut links = Links::default();
    let mut asker = Asker {
        pending: vec![(Bytes::new(), false)],
        listings: tokio::task::JoinSet::new(),
        first: Some(first),
        known,
        ready: HashMap::new(),
    };
    let mut jobs = tokio::task::JoinSet::new();
    let files = Arc::new(Semaphore::new(ctx.cfg.files_in_flight.max(1)));
    let runs = Arc::new(Semaphore::new(RUNS_IN_FLIGHT));
    let root = ctx.cache.local_path(b"");
    let made = background::run(move || make_dir(&root))
        .await
        .unwrap_or_else(|e| Err(e.into()));
    if let Err(e) = made {
        ctx.progress
            .error(format!("{}: {e}", ctx.cache.root().display()));
        return dirs;
    }
    // The root's owner is learned beside its first listing's processing, not a round
    // trip before it (its metadata is set last).
    let mut first_owner = Some(root_attr);
    loop {
        asker.ask(ctx);
        let Some(done) = asker.listings.join_next().await else {
            break;
        };
        let Ok((rel, listing)) = done else { continue };
        let (entries, mut came) = match listing {
            Ok((e, below)) => {
                // Listings of directories under this one, from the same tree page: each is
                // taken once its directory is made.
                for (under, l) in below {
                    asker.ready.insert(Bytes::from(join(&rel, &under)), l);
                }
                e
            }
            Err(e) => {
                ctx.progress
                    .error(format!("listing /{}: {e}", String::from_utf8_lossy(&rel)));
                continue;
            }
        };
        // The owners' names (a round trip when new ones appear, as at the root) are
        // learned while the subdirectories are made and their listings asked for: only
        // the files' metadata waits for them.
        let root_owner = first_owner.take();
        let learn = ctx.owners.learn(
            &ctx.client,
            root_owner.iter().chain(entries.iter().map(|e| &e.attr)),
        );
        let subdirs = async {
            if ctx.cfg.delete {
                delete_extras(ctx, &rel, &entries).await;
            }
            let made = make_dirs(ctx, &rel, &entries).await;
            for (e, made) in entries.iter().zip(made) {
                let Some(made) = made else { continue };
                let child = Bytes::from(join(&rel, &e.name));
                match made {
                    Ok(()) => {
                        asker.pending.push((child.clone(), is_leaf(&e.attr)));
                        dirs.push((child, e.attr));
                        ctx.progress.others_done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(err) => ctx
                        .progress
                        .error(format!("{}: {err}", ctx.cache.local_path(&child).display())),
                }
            }
            asker.ask(ctx);
        };
        tokio::join!(learn, subdirs);
        // Small files came with the listing's first page, or come in runs of ReadDirData
        // (a few round trips per directory, not one per file), except where an earlier run
        // left files (most are complete here already: a resume fetches only what is
        // missing).
        let with_runs = asker.known.with_contents(&ctx.client, &rel);
        let mut in_runs = vec![false; entries.len()];
        for (i, e) in entries.iter().enumerate() {
            let child = Bytes::from(join(&rel, &e.name));
            match e.attr.kind {
                FileKind::Directory => {} // made above
                FileKind::File if e.attr.nlink > 1 && !links.first(&child, &e.attr) => {
                    // Another name of a file met already: linked to it at the end.
                    ctx.progress.files_total.fetch_add(1, Ordering::Relaxed);
                }
                FileKind::File => {
                    ctx.progress.files_total.fetch_add(1, Ordering::Relaxed);
                    ctx.progress
                        .bytes_total
                        .fetch_add(e.attr.size, Ordering::Relaxed);
                    let data = came.remove(&e.name);
                    if data.is_none() && with_runs && is_small_file(e.attr.kind, e.attr.size) {
                        in_runs[i] = true;
                        continue;
                    }
                    let Ok(permit) = files.clone().acquire_owned().await else {
                        break;
                    };
                    let (c, attr) = (ctx.clone(), e.attr);
                    jobs.spawn(async move {
                        copy_file(&c, child, attr, data).await;
                        drop(permit);
                    });
                }
                FileKind::Symlink => {
                    let (c, attr) = (ctx.clone(), e.attr);
                    jobs.spawn(async move { copy_symlink(&c, child, attr).await });
                }
                FileKind::Fifo | FileKind::CharDevice | FileKind::BlockDevice
                    if e.attr.kind == FileKind::Fifo || is_root() =>
                {
                    let (c, attr) = (ctx.clone(), e.attr);
                    jobs.spawn(async move { copy_special(&c, child, attr).await });
                }
                _ => {
                    debug!(
                        "/{}: a socket, or a device and not root: skipped",
                        String::from_utf8_lossy(&child)
                    );
                    ctx.progress
                        .specials_skipped
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            // Reap finished jobs as we go so the set stays small.
            while jobs.try_join_next().is_some() {}
        }
        let entries = Arc::new(entries);
        for run in small_file_runs(&entries, 0..entries.len(), |i| in_runs[i]) {
            let (c, es, rel) = (ctx.clone(), entries.clone(), rel.clone());
            let (files, runs) = (files.clone(), runs.clone());
            jobs.spawn(async move { copy_run(&c, &rel, &es, run, &files, &runs).await });
        }
    }
    ctx.progress.walk_done.store(true, Ordering::Relaxed);
    while jobs.join_next().await.is_some() {}
    links.make(ctx).await;
    dirs
}

/// Asks for the listings of the directories found (at most `listings_in_flight` at once).
struct Asker {
    /// Directories made and not listed yet, and whether each has no subdirectory
    /// ([`is_leaf`]).
    pending: Vec<(Bytes, bool)>,
    listings: tokio::task::JoinSet<(Bytes, Result<Listings, ClientError>)>,
    /// The root's listing, asked for before the walk started.
    first: Option<RootListing>,
    known: Known,
    /// Listings that came in a tree page before their directory was made, by path.
    ready: HashMap<Bytes, Listing>,
}

impl Asker {
    fn ask(&mut self, ctx: &Arc<Ctx>) {
        while self.listings.len() < ctx.cfg.listings_in_flight.max(1) {
            let Some((rel, leaf)) = self.pending.pop() else {
                break;
            };
            let c = ctx.clone();
            let ready = self.ready.remove(&rel);
            let with_data = self.known.with_contents(&ctx.client, &rel);
            // The entries' extended attributes are asked for beside the listing, not after
            // it: their files' metadata waits for them, and on a WAN a round trip per
            // directory in turn adds up.
            super::xattrs::XattrMap::prefetch(ctx, &rel);
            let asked = if rel.is_empty() {
                self.first.take()
            } else {
                None
            };
            self.listings.spawn(async move {
                let r = match (asked, ready) {
                    (_, Some(l)) => Ok((l, Vec::new())),
                    (Some(mut root), None) => (&mut root.0 .0).await.unwrap_or_else(|e| {
                        Err(ClientError::Protocol(format!("the root's listing: {e}")))
                    }),
                    (None, None) => {
                        list(&c.client, remote_path(&c.root, &rel), with_data, leaf).await
                    }
                };
                (rel, r)
            });
        }
    }
}

/// Whether a directory has no subdirectory, as its link count says where the file system
/// keeps the convention (ext4, XFS, tmpfs: two, its name and its `.`, plus one per
/// subdirectory's `..`; btrfs and others say 1, and are taken for having some). Past the
/// first page of a tree's listings (a source tree's held 203 of its 919 directories), many
/// of the directories left are such leaves (499 of the 919), and a ReadTree apiece held a
/// tree page's worth of the server's memory budget (512 KiB of its 48 MiB) while it waited
/// for a turn, and brought their small files only in runs a round trip later; a
/// ReadDirData brings them with the listing. A wrong guess costs no correctness: the
/// subdirectories a listing shows are listed in turn.
fn is_leaf(attr: &Attr) -> bool {
    attr.kind == FileKind::Directory && attr.nlink == 2
}

/// The listing of directory `rel`, and with it those of directories under it when the
/// server sends a tree's listings in a page (ReadTree: on a WAN a walk that lists a
/// directory only once its parent's listing came spends its time in round trips, one per
/// level, with few listings in flight where the tree is narrow; their small files then
/// come in runs, many directories' at once). Not for a `leaf` (a directory with no
/// subdirectory, [`is_leaf`]): it has no tree under it to bring. Else, with `with_data`, its
/// first page is a ReadDirData: a directory of a few hundred KiB of small files comes
/// whole, contents and all, in one round trip, instead of a listing and then runs. The
/// rest of a longer listing comes in plain pages; its small files then come in runs.
/// Returns the entries and the contents that came, by name (each of the version its entry
/// says), and the listings under it that came, by path under it.
async fn list(
    client: &Client,
    remote: Bytes,
    with_data: bool,
    leaf: bool,
) -> Result<Listings, ClientError> {
    if client.session().features & features::TREE != 0 && !leaf {
        let mut tree = client
            .read_tree(remote, TREE_PAGE_ENTRIES)
            .await?
            .into_iter();
        let Some((_, entries)) = tree.next() else {
            return Err(ClientError::Protocol("an empty tree page".into()));
        };
        let below = tree.map(|(rel, e)| (rel, (e, HashMap::new()))).collect();
        return Ok(((entries, HashMap::new()), below));
    }
    if !with_data {
        return Ok(((client.read_dir(remote).await?, HashMap::new()), Vec::new()));
    }
    let (page, eof) = client
        .read_dir_data(remote.clone(), 0, FIRST_PAGE_ENTRIES, SMALL_FILE_MAX)
        .await?;
    let mut came = HashMap::new();
    let mut entries = Vec::with_capacity(page.len());
    for l in page {
        if let Some(d) = l.data {
            came.insert(l.entry.name.clone(), d);
        }
        entries.push(l.entry);
    }
    if !eof {
        // A page without entries is no progress: the plain listing from the start.
        let after = entries.last().map_or(0, |e| e.cookie);
        entries.extend(client.read_dir_from(remote, after).await?);
    }
    Ok(((entries, came), Vec::new()))
}

/// A directory's entries and the contents of small files that came with them, by name.
type Listing = (Vec<DirEntry>, HashMap<Bytes, SmallFile>);

/// A directory's [`Listing`], and those of directories under it that came with it, by
/// path under it.
type Listings = (Listing, Vec<(Bytes, Listing)>);

/// Entries asked for in a page of a tree's listings (the server ends it sooner when its
/// bytes fill it).
const TREE_PAGE_ENTRIES: u32 = 16384;

/// The root's listing, asked for before the walk starts: beside the Stat of the root that
/// tells whether it is a directory at all (a round trip less at the start; dropped,
/// unanswered, when the root is no directory).
pub(super) struct RootListing(AbortOnDrop<Result<Listings, ClientError>>);

impl RootListing {
    /// Asks for the listing of `root` (remote path) as the walk would
    /// ([`Known::with_contents`]).
    pub(super) fn start(client: &Client, root: Bytes, known: &Known) -> RootListing {
        let with_data = known.with_contents(client, b"");
        let client = client.clone();
        RootListing(AbortOnDrop(tokio::spawn(async move {
            list(&client, root, with_data, false).await
        })))
    }
}

/// Directories where an earlier run left files (relative paths).
pub(super) struct Known(HashSet<Bytes>);

impl Known {
    /// The directories of the files `cache` records.
    pub(super) fn of(cache: &CacheDir) -> Known {
        Known(
            cache
                .all()
                .into_iter()
                .map(|(rel, _)| ferry_proto::name::split(&rel).0)
                .collect(),
        )
    }

    /// Whether directory `rel` is listed with the contents of its small files (and the
    /// rest fetched in runs): when the server sends them, and no earlier run left files in
    /// it (most of those are likely complete here already: a resume fetches only what is
    /// missing).
    fn with_contents(&self, client: &Client, rel: &[u8]) -> bool {
        client.session().features & features::DIR_DATA != 0 && !self.0.contains(rel)
    }
}

/// Entries asked for in a listing's first page (ReadDirData): the server ends the page
/// sooner when its contents fill it.
const FIRST_PAGE_ENTRIES: u32 = 4096;

/// One run of small files of directory `rel` (`entries` is its listing): their contents
/// in one ReadDirData, then each file copied with them (at most `files` files at once).
/// A file whose contents did not come, or came for another version, is copied as usual.
async fn copy_run(
    ctx: &Arc<Ctx>,
    rel: &Bytes,
    entries: &[DirEntry],
    run: Run,
    files: &Arc<Semaphore>,
    runs: &Semaphore,
) {
    let mut got: HashMap<Bytes, Listed> = HashMap::new();
    {
        let Ok(_slot) = runs.acquire().await else {
            return;
        };
        let remote = remote_path(&ctx.root, rel);
        match ctx
            .client
            .read_dir_data(remote, run.cookie, run.count, SMALL_FILE_MAX)
            .await
        {
            Ok((listed, _)) => {
                got = listed
                    .into_iter()
                    .map(|l| (l.entry.name.clone(), l))
                    .collect()
            }
            Err(e) => debug!(
                "contents of a run of /{}: {e}; copying its files one by one",
                String::from_utf8_lossy(rel)
            ),
        }
    }
    let mut jobs = tokio::task::JoinSet::new();
    for e in &entries[run.entries] {
        if !is_small_file(e.attr.kind, e.attr.size) {
            continue;
        }
        let data = got
            .remove(&e.name)
            .filter(|l| l.entry.attr.version() == e.attr.version())
            .and_then(|l| l.data);
        let Ok(permit) = files.clone().acquire_owned().await else {
            break;
        };
        let (c, child, attr) = (ctx.clone(), Bytes::from(join(rel, &e.name)), e.attr);
        jobs.spawn(async move {
            copy_file(&c, child, attr, data).await;
            drop(permit);
        });
        while jobs.try_join_next().is_some() {}
    }
    while jobs.join_next().await.is_some() {}
}

/// Creates the local directories of the subdirectories listed in `rel`, all in one step on
/// the background threads, before anything is created in them. One result per entry: `None`
/// for entries that are not directories.
async fn make_dirs(
    ctx: &Ctx,
    rel: &Bytes,
    entries: &[DirEntry],
) -> Vec<Option<std::io::Result<()>>> {
    let paths: Vec<Option<PathBuf>> = entries
        .iter()
        .map(|e| {
            (e.attr.kind == FileKind::Directory).then(|| ctx.cache.local_path(&join(rel, &e.name)))
        })
        .collect();
    if paths.iter().all(Option::is_none) {
        return paths.into_iter().map(|_| None).collect();
    }
    let n = paths.len();
    background::run(move || paths.into_iter().map(|p| p.map(|p| make_dir(&p))).collect())
        .await
        .unwrap_or_else(|e| {
            let e = e.to_string();
            (0..n)
                .map(|_| Some(Err(std::io::Error::other(e.clone()))))
                .collect()
        })
}

/// Makes `p` a directory: kept if it is one, replacing a file or symlink.
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
    let owner = ctx.owners.local(&attr);
    let r = background::run(move || -> std::io::Result<()> {
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
        set_metadata(&local, &attr, false, owner)
    })
    .await;
    count_other(ctx, "symlink", &rel, r);
}

/// Counts an entry other than a regular file made (`r`), or reports why it was not.
fn count_other(
    ctx: &Ctx,
    what: &str,
    rel: &Bytes,
    r: Result<std::io::Result<()>, background::BackgroundError>,
) {
    match r {
        Ok(Ok(())) => {
            ctx.progress.others_done.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Err(e)) => ctx
            .progress
            .error(format!("{what} /{}: {e}", String::from_utf8_lossy(rel))),
        Err(e) => ctx.progress.error(format!("{what} task: {e}")),
    }
}

/// Hard links: files with more than one name on the server (the same inode number and birth
/// time). The first name met is copied; the others become links to its local file once every
/// file is copied ([`Links::make`]), so the copy has the server's links, and a rerun finds
/// them in place.
#[derive(Default)]
struct Links {
    /// The first name of each file with several, by (inode, birth time).
    first: HashMap<(u64, ferry_proto::Timestamp), Bytes>,
    /// Other names, with the first name of their file.
    others: Vec<(Bytes, Bytes)>,
}

impl Links {
    /// Whether `rel` (with `attr`, of more than one link) is the first name of its file met;
    /// if not, it is recorded to be linked to that one.
    fn first(&mut self, rel: &Bytes, attr: &Attr) -> bool {
        match self.first.entry((attr.ino, attr.btime)) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(rel.clone());
                true
            }
            std::collections::hash_map::Entry::Occupied(o) => {
                self.others.push((rel.clone(), o.get().clone()));
                false
            }
        }
    }

    /// Makes every other name a hard link to its first name's local file (kept when it is
    /// one already), and records the first name's local file anew (a link changes its
    /// ctime, which its stamp holds).
    async fn make(self, ctx: &Ctx) {
        if self.others.is_empty() {
            return;
        }
        ctx.sync.flush().await;
        let mut relinked: HashSet<Bytes> = HashSet::new();
        for (rel, first) in self.others {
            let (from, to) = (ctx.cache.local_path(&first), ctx.cache.local_path(&rel));
            let r = background::run(move || -> std::io::Result<bool> {
                use std::os::unix::fs::MetadataExt;
                let want = std::fs::metadata(&from)?.ino();
                match std::fs::symlink_metadata(&to) {
                    Ok(m) if m.ino() == want => return Ok(false),
                    Ok(m) if m.is_dir() => {
                        return Err(std::io::Error::other(
                            "a local directory is where the server has a file; move it away",
                        ))
                    }
                    Ok(_) => std::fs::remove_file(&to)?,
                    Err(_) => {}
                }
                std::fs::hard_link(&from, &to)?;
                Ok(true)
            })
            .await;
            match r {
                Ok(Ok(made)) => {
                    ctx.cache.forget(&rel);
                    ctx.progress.files_done.fetch_add(1, Ordering::Relaxed);
                    if made {
                        relinked.insert(first);
                    }
                }
                Ok(Err(e)) => ctx.progress.error(format!(
                    "/{}: linking it to /{}: {e}",
                    String::from_utf8_lossy(&rel),
                    String::from_utf8_lossy(&first)
                )),
                Err(e) => ctx.progress.error(format!("link task: {e}")),
            }
        }
        for first in relinked {
            let Some(st) = ctx.cache.state(&first).filter(|s| s.stamp.is_some()) else {
                continue;
            };
            let local = ctx.cache.local_path(&first);
            if let Ok(Ok(stamp)) = background::run(move || local_stamp(&local)).await {
                ctx.sync.stamped(first, st.generation, stamp);
            }
        }
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Creates a FIFO or (as root) a device node like the server's, with its owner, mode and
/// times; one of the right kind (and device number) already there is kept.
async fn copy_special(ctx: &Ctx, rel: Bytes, attr: Attr) {
    let local = ctx.cache.local_path(&rel);
    let owner = ctx.owners.local(&attr);
    let xa = super::xattrs::XattrMap::of(ctx, &rel).await;
    let r = background::run(move || -> std::io::Result<()> {
        use rustix::fs::FileType;
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let (ty, rdev) = match attr.kind {
            FileKind::Fifo => (FileType::Fifo, 0),
            FileKind::CharDevice => (FileType::CharacterDevice, attr.rdev),
            _ => (FileType::BlockDevice, attr.rdev),
        };
        let same = |m: &std::fs::Metadata| {
            let t = m.file_type();
            let kind = match attr.kind {
                FileKind::Fifo => t.is_fifo(),
                FileKind::CharDevice => t.is_char_device(),
                _ => t.is_block_device(),
            };
            kind && (attr.kind == FileKind::Fifo || m.rdev() == rdev)
        };
        match std::fs::symlink_metadata(&local) {
            Ok(m) if same(&m) => {}
            Ok(m) if m.is_dir() => {
                return Err(std::io::Error::other(
                    "a local directory is where the server has a special file; move it away",
                ))
            }
            Ok(_) => {
                std::fs::remove_file(&local)?;
                make_node(&local, ty, attr.perm, rdev)?;
            }
            Err(_) => make_node(&local, ty, attr.perm, rdev)?,
        }
        set_metadata(&local, &attr, true, owner)?;
        match &xa {
            Some(x) => super::xattrs::apply(&local, x),
            None => Ok(()),
        }
    })
    .await;
    count_other(ctx, "special file", &rel, r);
}

fn make_node(p: &Path, ty: rustix::fs::FileType, perm: u16, rdev: u64) -> std::io::Result<()> {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        ty,
        rustix::fs::Mode::from_raw_mode(u32::from(perm) & 0o7777),
        rdev,
    )?;
    Ok(())
}

/// How many deleted paths the summary names.
const DELETED_LISTED: usize = 1000;

/// `--delete`: removes the entries of local directory `rel` that the server's listing
/// (`entries`) does not have (a directory with everything in it), forgetting what the
/// journal knew of them; each is counted and named in the summary. The state folder at the
/// root is never touched.
async fn delete_extras(ctx: &Ctx, rel: &Bytes, entries: &[DirEntry]) {
    let names: HashSet<Vec<u8>> = entries.iter().map(|e| e.name.to_vec()).collect();
    let dir = ctx.cache.local_path(rel);
    let gone = background::run(move || -> std::io::Result<Vec<(Vec<u8>, bool)>> {
        use std::os::unix::ffi::OsStrExt;
        let mut gone = Vec::new();
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(gone),
            Err(e) => return Err(e),
        };
        for ent in rd {
            let ent = ent?;
            let name = ent.file_name().as_bytes().to_vec();
            if names.contains(&name) {
                continue;
            }
            let path = ent.path();
            let is_dir = ent.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
            gone.push((name, is_dir));
        }
        Ok(gone)
    })
    .await;
    let gone = match gone {
        Ok(Ok(g)) => g,
        Ok(Err(e)) => {
            ctx.progress.error(format!(
                "--delete in /{}: {e}",
                String::from_utf8_lossy(rel)
            ));
            return;
        }
        Err(e) => {
            ctx.progress.error(format!("--delete task: {e}"));
            return;
        }
    };
    if gone.is_empty() {
        return;
    }
    let tracked = ctx.cache.all();
    for (name, is_dir) in gone {
        let child = Bytes::from(join(rel, &name));
        if is_dir {
            let mut prefix = child.to_vec();
            prefix.push(b'/');
            for (p, _) in tracked.iter().filter(|(p, _)| p.starts_with(&prefix)) {
                ctx.cache.forget(p);
            }
        }
        ctx.cache.forget(&child);
        let shown = format!("/{}", String::from_utf8_lossy(&child));
        tracing::info!("{shown}: gone from the server, deleted (--delete)");
        ctx.progress.deleted.fetch_add(1, Ordering::Relaxed);
        let mut listed = ctx
            .progress
            .deleted_paths
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if listed.len() < DELETED_LISTED {
            listed.push(shown);
        }
    }
}
