//! Per-file state and the cache directory that owns it.
//!
//! Locks: the state (`inner`: every file's [`FileState`] and the records not yet handed to
//! the journal) is only ever held for in-memory work, so async tasks that ask for a file's
//! state never wait for the disk. The journal has its own lock, held across its writes,
//! syncs and compaction (callers run those off the async threads: on the mirror's
//! [`crate::background`] threads or the chunk store's write-back threads); when both are
//! taken, the journal's comes first. Records reach the journal in the order they were made.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use ferry_proto::Version;

use crate::journal::{Journal, Record};

mod file;
pub mod location;
mod seals;

pub use file::{replay, FileState};
pub use location::{find_state, StateBase};
use location::{Owner, LEGACY_STATE_DIR};

/// The permission bit every whole file ([`CacheDir::restart_whole_file`]) is created with,
/// whatever its source's mode: its owner may write it.
pub(crate) const CREATED_WRITABLE: u32 = 0o200;

/// Errors opening a cache directory.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Creating or reading the directory failed.
    #[error("cache directory {path}: {source}")]
    Io {
        /// The path concerned.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Another process uses the directory.
    #[error("cache directory {0} is in use by another ferry process (its lock is held); stop it or choose another directory")]
    Locked(PathBuf),
    /// No state base was given and this user has no default.
    #[error("no directory for ferry's state: set HOME or XDG_STATE_HOME, or give --state-dir DIR")]
    NoStateBase,
    /// The destination holds state of an older ferry and the state folder holds state too.
    #[error("{legacy} holds the state of an older ferry, and {folder} holds state for the same directory too: remove one of them (the copy is kept; the next run re-verifies it)")]
    TwoStates {
        /// The legacy state folder inside the destination.
        legacy: PathBuf,
        /// The state folder outside it.
        folder: PathBuf,
    },
}

/// A cache directory: the local copy, and its state in a folder outside it
/// ([`location`]). One process at a time (an exclusive lock on the folder's `lock`).
pub struct CacheDir {
    root: PathBuf,
    meta: PathBuf,
    inner: Mutex<Inner>,
    journal: Mutex<Journal>,
    /// The mirror's seals and the readers' writes in flight ([`seals`]).
    seals: seals::Seals,
    _lock: std::fs::File,
}

struct Inner {
    /// Records made and not yet handed to the journal, in order.
    pending: Vec<Record>,
    /// The last generation handed out.
    generation: u64,
    files: HashMap<Bytes, FileState>,
    /// Records appended since the last compaction.
    since_compaction: u64,
}

impl std::fmt::Debug for CacheDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheDir")
            .field("root", &self.root)
            .finish()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Takes the exclusive lock of the state folder `meta` (of the destination `root`).
fn lock_folder(meta: &Path, root: &Path) -> Result<std::fs::File, CacheError> {
    let lock_path = meta.join("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err(&lock_path))?;
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(lock),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(CacheError::Locked(root.to_path_buf())),
        Err(e) => Err(io_err(&lock_path)(e.into())),
    }
}

/// Moves the state an older ferry kept in `legacy` (`DEST/.ferry/`) to the state folder
/// `meta`, then removes `legacy`, so the destination holds exactly the source.
fn migrate(legacy: &Path, meta: &Path, root: &Path) -> Result<(), CacheError> {
    // An older ferry still running there holds this lock.
    let _old = lock_folder(legacy, root)?;
    let ours = meta.join("journal");
    if std::fs::metadata(&ours).is_ok_and(|m| m.len() > 8) {
        return Err(CacheError::TwoStates {
            legacy: legacy.to_path_buf(),
            folder: meta.to_path_buf(),
        });
    }
    for f in ["journal", "status.json"] {
        let from = legacy.join(f);
        if from.is_file() {
            let to = meta.join(f);
            std::fs::copy(&from, &to).map_err(io_err(&from))?;
            std::fs::File::open(&to)
                .and_then(|f| f.sync_all())
                .map_err(io_err(&to))?;
        }
    }
    std::fs::File::open(meta)
        .and_then(|d| d.sync_all())
        .map_err(io_err(meta))?;
    std::fs::remove_dir_all(legacy).map_err(io_err(legacy))?;
    tracing::info!(
        "moved ferry's state out of the copy: {} → {}",
        legacy.display(),
        meta.display()
    );
    Ok(())
}

impl CacheDir {
    /// Opens (creating if needed) the cache directory `root` with its state folder in
    /// `base`, takes its lock and replays its journal. State an older ferry kept inside
    /// `root` (`.ferry/`) is moved to the state folder; state recorded for another
    /// directory that stood at this path is set aside.
    ///
    /// # Errors
    /// I/O errors; the directory is locked by another process; state both inside and
    /// outside the directory.
    pub fn open(root: &Path, base: &StateBase) -> Result<CacheDir, CacheError> {
        std::fs::create_dir_all(root).map_err(io_err(root))?;
        let root = std::fs::canonicalize(root).map_err(io_err(root))?;
        let meta = base.folder_for(&root);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&meta)
            .map_err(io_err(&meta))?;
        let lock = lock_folder(&meta, &root)?;
        let legacy = root.join(LEGACY_STATE_DIR);
        if crate::journal::is_journal(&legacy.join("journal")) {
            migrate(&legacy, &meta, &root)?;
        }
        let owner = Owner::of(&root).map_err(io_err(&root))?;
        match Owner::read(&meta) {
            Some(o) if o == owner => {}
            Some(o) => {
                tracing::info!(
                    "{}: its state belonged to another directory that stood at this path before (device {} inode {} born {}, now {} {} {}): starting afresh",
                    root.display(), o.dev, o.ino, o.btime, owner.dev, owner.ino, owner.btime
                );
                for f in ["journal", "status.json"] {
                    match std::fs::remove_file(meta.join(f)) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(io_err(&meta)(e))
                        }
                        _ => {}
                    }
                }
            }
            None => {}
        }
        owner.write(&meta).map_err(io_err(&meta))?;
        let jpath = meta.join("journal");
        let (journal, records) = Journal::open(&jpath).map_err(io_err(&jpath))?;
        let files = replay(&records);
        Ok(CacheDir {
            root,
            meta,
            inner: Mutex::new(Inner {
                pending: Vec::new(),
                generation: 0,
                files,
                since_compaction: records.len() as u64,
            }),
            journal: Mutex::new(journal),
            seals: seals::Seals::default(),
            _lock: lock,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The local copy's root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The state folder.
    pub fn meta(&self) -> &Path {
        &self.meta
    }

    /// Local path of export-relative `rel` (empty: the root).
    pub fn local_path(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(std::ffi::OsStr::from_bytes(rel))
        }
    }

    /// What is known of `rel`.
    pub fn state(&self, rel: &Bytes) -> Option<FileState> {
        self.lock().files.get(rel).cloned()
    }

    /// Whether chunk `index` of `rel` is present for exactly `version` in chunks of
    /// `chunk_size`: then the file's generation and verified stamp. Checked under the
    /// lock without copying the file's state (its chunk map grows with the file).
    pub fn chunk_held(
        &self,
        rel: &Bytes,
        version: &Version,
        chunk_size: u32,
        index: u64,
    ) -> Option<(u64, Option<Version>)> {
        let g = self.lock();
        let st = g.files.get(rel)?;
        (st.version == *version && st.chunk_size == chunk_size && st.has(index))
            .then_some((st.generation, st.stamp))
    }

    /// Every tracked file's state.
    pub fn all(&self) -> Vec<(Bytes, FileState)> {
        self.lock()
            .files
            .iter()
            .map(|(p, s)| (p.clone(), s.clone()))
            .collect()
    }

    /// `rel` now stands for `version`, with no chunk present (the caller has truncated or
    /// created the local file accordingly). Durable at the next [`CacheDir::commit`].
    /// Returns the new generation.
    pub fn begin(&self, rel: &Bytes, version: Version, chunk_size: u32) -> u64 {
        self.begin_with(rel, version, chunk_size, true)
    }

    fn begin_with(&self, rel: &Bytes, version: Version, chunk_size: u32, ready: bool) -> u64 {
        let mut g = self.lock();
        g.generation += 1;
        let mut st = FileState::new(version, chunk_size);
        st.generation = g.generation;
        st.ready = ready;
        g.files.insert(rel.clone(), st);
        g.pending.push(Record::Version {
            path: rel.clone(),
            version,
            chunk_size,
        });
        g.since_compaction += 1;
        g.generation
    }

    /// Opens the local file of `rel` as its state describes it, with that state: `None` if
    /// the file is untracked or being replaced. The state is checked again after the open,
    /// so the file returned is the inode of the generation returned.
    ///
    /// # Errors
    /// I/O errors opening the file.
    pub fn open_current(
        &self,
        rel: &Bytes,
        write: bool,
    ) -> std::io::Result<Option<(std::fs::File, FileState)>> {
        let Some(before) = self.state(rel).filter(|s| s.ready) else {
            return Ok(None);
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(self.local_path(rel))?;
        match self.state(rel) {
            Some(s) if s.ready && s.generation == before.generation => Ok(Some((f, s))),
            _ => Ok(None),
        }
    }

    /// Starts `rel` over at `version` and prepares its local file: the reset is made durable
    /// first when a local file exists (the journal may describe its bytes), then that file is
    /// unlinked — so readers and writers holding the old one keep the old inode — and a new,
    /// empty one of `size` bytes (sparse) is created and returned with its generation.
    ///
    /// # Errors
    /// I/O errors committing the journal or creating the file.
    pub fn restart_file(
        &self,
        rel: &Bytes,
        version: Version,
        chunk_size: u32,
    ) -> std::io::Result<(std::fs::File, u64)> {
        self.restart(rel, version, chunk_size, None)
    }

    /// As [`CacheDir::restart_file`], for a caller that writes all of the file's bytes next
    /// (a small file, in one write): the new file is left empty rather than sized, and is
    /// created with permission bits `mode` (the umask, or a default ACL of its directory,
    /// applies), so that its metadata is often right as created and costs no `fchmod`. A
    /// tree of small files is bound by such per-file system calls. The owner may write it
    /// whatever `mode` says (as with `restart_file`): a reader's store that opens it before
    /// the caller's seal is not refused by a read-only mode the caller sets afterwards.
    ///
    /// # Errors
    /// As [`CacheDir::restart_file`].
    pub fn restart_whole_file(
        &self,
        rel: &Bytes,
        version: Version,
        chunk_size: u32,
        mode: u32,
    ) -> std::io::Result<(std::fs::File, u64)> {
        self.restart(
            rel,
            version,
            chunk_size,
            Some(mode & 0o777 | CREATED_WRITABLE),
        )
    }

    /// [`CacheDir::restart_file`] (`whole` `None`: sized) or [`CacheDir::restart_whole_file`]
    /// (`Some(mode)`: empty, created with `mode`).
    fn restart(
        &self,
        rel: &Bytes,
        version: Version,
        chunk_size: u32,
        whole: Option<u32>,
    ) -> std::io::Result<(std::fs::File, u64)> {
        use std::os::unix::fs::OpenOptionsExt;
        let local = self.local_path(rel);
        let generation = self.begin_with(rel, version, chunk_size, false);
        self.seals.lift_others(rel, generation);
        let create = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(whole.unwrap_or(0o666))
                .open(&local)
        };
        // The common case, a new file in an existing directory, is one system call.
        let f = match create() {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if std::fs::symlink_metadata(&local).is_ok_and(|m| m.is_dir()) {
                    return Err(std::io::Error::other(
                        "a local directory is where the server has a file; move it away",
                    ));
                }
                // The journal may describe the old file's bytes: the reset is durable first.
                self.commit()?;
                match std::fs::remove_file(&local) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                create()?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = local.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                create()?
            }
            Err(e) => return Err(e),
        };
        if version.size > 0 && whole.is_none() {
            f.set_len(version.size)?;
        }
        if let Some(st) = self.lock().files.get_mut(rel) {
            if st.generation == generation {
                st.ready = true;
            }
        }
        Ok((f, generation))
    }

    /// Chunks `first..first + count` of `rel` are durable on disk (the caller synced
    /// them) in the file of `generation`. Ignored if `rel` started over meanwhile.
    /// Returns whether this completed the file.
    pub fn mark_present(&self, rel: &Bytes, generation: u64, first: u64, count: u32) -> bool {
        let mut g = self.lock();
        let Some(st) = g.files.get_mut(rel) else {
            return false;
        };
        if st.generation != generation {
            return false;
        }
        let was = st.complete();
        let rec = Record::Chunks {
            path: rel.clone(),
            first,
            count,
        };
        st.apply(&rec);
        let now = st.complete();
        g.pending.push(rec);
        g.since_compaction += 1;
        !was && now
    }

    /// The complete local copy of `rel` (the file of `generation`) matched the server's hash.
    pub fn mark_verified(&self, rel: &Bytes, generation: u64, blake3: [u8; 32]) {
        let rec = Record::Verified {
            path: rel.clone(),
            blake3,
        };
        self.record_if(rel, generation, FileState::complete, rec);
    }

    /// Applies `rec` to `rel`'s state and queues it for the journal, when the state is of
    /// `generation` and `ready` says so.
    fn record_if(&self, rel: &Bytes, generation: u64, ready: fn(&FileState) -> bool, rec: Record) {
        let mut g = self.lock();
        let Some(st) = g.files.get_mut(rel) else {
            return;
        };
        if st.generation != generation || !ready(st) {
            return;
        }
        st.apply(&rec);
        g.pending.push(rec);
        g.since_compaction += 1;
    }

    /// A reader's write of a chunk to `rel` of `generation` begins; `None`: the file is
    /// sealed, the write is skipped ([`seals`]).
    pub(crate) fn begin_write(
        &self,
        rel: &Bytes,
        generation: u64,
    ) -> Option<seals::WriteGuard<'_>> {
        self.seals.write(rel, generation)
    }

    /// Seals `rel` of `generation` before its metadata is set: waits for readers' writes to
    /// it in flight; later ones skip until the seal is lifted ([`seals`]). Blocks.
    pub(crate) fn seal(&self, rel: &Bytes, generation: u64) {
        self.seals.seal(rel, generation);
    }

    /// Lifts the seal of `rel` of `generation` (once everything written to it before is
    /// recorded: the syncer does).
    pub(crate) fn lift_seal(&self, rel: &Bytes, generation: u64) {
        self.seals.lift(rel, generation);
    }

    #[cfg(test)]
    pub(crate) fn seals_tracked(&self) -> usize {
        self.seals.tracked()
    }

    /// The verified local file of `rel` (of `generation`), its metadata set, shows `stamp`
    /// (its inode, size, mtime and ctime): see [`FileState::stamp`]. Recorded only while
    /// the local file still shows it (a stamp taken before someone else set the file's
    /// metadata is stale: theirs follows). Blocks (one `lstat`).
    pub fn mark_stamped(&self, rel: &Bytes, generation: u64, stamp: Version) {
        let now = std::fs::symlink_metadata(self.local_path(rel))
            .ok()
            .map(|m| crate::mirror::metadata::stamp_of(&m));
        if now != Some(stamp) {
            return;
        }
        let rec = Record::Stamp {
            path: rel.clone(),
            stamp,
        };
        self.record_if(rel, generation, |st| st.verified.is_some(), rec);
    }

    /// `rel`'s verified local copy holds version `to` too: the server's file changed in
    /// its ctime only (`chmod`, `chown`, a new link, an older journal without ctimes) and
    /// its hash is still the one the copy matched. The local file and its chunks stay;
    /// the stamp goes (the caller sets the metadata and stamps it again).
    pub fn rebase(&self, rel: &Bytes, generation: u64, to: Version) -> bool {
        let mut g = self.lock();
        let Some(st) = g.files.get_mut(rel) else {
            return false;
        };
        if st.generation != generation || !st.complete() || !st.version.differs_in_ctime_only(&to) {
            return false;
        }
        let Some(h) = st.verified else { return false };
        let (chunk_size, chunks) = (st.chunk_size, st.chunks());
        let mut new = FileState::new(to, chunk_size);
        new.generation = generation;
        let mut recs = vec![Record::Version {
            path: rel.clone(),
            version: to,
            chunk_size,
        }];
        let mut first = 0;
        while first < chunks {
            let count = (chunks - first).min(u64::from(u32::MAX)) as u32;
            recs.push(Record::Chunks {
                path: rel.clone(),
                first,
                count,
            });
            first += u64::from(count);
        }
        recs.push(Record::Verified {
            path: rel.clone(),
            blake3: h,
        });
        for r in &recs {
            new.apply(r);
        }
        *st = new;
        g.since_compaction += recs.len() as u64;
        g.pending.extend(recs);
        true
    }

    /// `rel` of `generation` is no longer tracked; a file that started over since (another
    /// generation) is left as it is. Whether it was forgotten.
    pub fn forget_generation(&self, rel: &Bytes, generation: u64) -> bool {
        let mut g = self.lock();
        if g.files
            .get(rel)
            .is_none_or(|st| st.generation != generation)
        {
            return false;
        }
        g.files.remove(rel);
        g.pending.push(Record::Forget { path: rel.clone() });
        g.since_compaction += 1;
        true
    }

    /// The generation of `rel`'s local file, if it is tracked.
    pub fn generation(&self, rel: &Bytes) -> Option<u64> {
        self.lock().files.get(rel).map(|st| st.generation)
    }

    /// `rel` is no longer tracked.
    pub fn forget(&self, rel: &Bytes) {
        let mut g = self.lock();
        if g.files.remove(rel).is_some() {
            g.pending.push(Record::Forget { path: rel.clone() });
            g.since_compaction += 1;
        }
    }

    /// Makes the records so far durable.
    ///
    /// # Errors
    /// I/O errors writing or syncing the journal.
    pub fn commit(&self) -> std::io::Result<()> {
        let mut j = self.journal();
        let records = std::mem::take(&mut self.lock().pending);
        for r in &records {
            j.push(r);
        }
        j.commit()
    }

    /// Rewrites the journal as the current state when it has grown well past it. The new
    /// journal is written and synced without holding the state: only the snapshot of the
    /// state is taken under it. Records made meanwhile go to the new journal.
    ///
    /// # Errors
    /// I/O errors (the old journal then stays in use, with every record).
    pub fn compact_if_large(&self) -> std::io::Result<()> {
        let mut j = self.journal();
        let (records, taken, before) = {
            let mut g = self.lock();
            let live = g.files.len() as u64 * 3;
            if g.since_compaction < 10_000 || g.since_compaction < 4 * live {
                return Ok(());
            }
            // The snapshot includes the records not yet in the journal: each is true already
            // (chunks are recorded once durable), so the new journal holds them too.
            let mut records = Vec::with_capacity(g.files.len() * 3);
            for (path, st) in &g.files {
                records.push(Record::Version {
                    path: path.clone(),
                    version: st.version,
                    chunk_size: st.chunk_size,
                });
                for (first, count) in st.runs() {
                    records.push(Record::Chunks {
                        path: path.clone(),
                        first,
                        count,
                    });
                }
                if let Some(h) = st.verified {
                    records.push(Record::Verified {
                        path: path.clone(),
                        blake3: h,
                    });
                }
                if let Some(stamp) = st.stamp {
                    records.push(Record::Stamp {
                        path: path.clone(),
                        stamp,
                    });
                }
            }
            let taken = std::mem::take(&mut g.pending);
            (records, taken, g.since_compaction)
        };
        match Journal::rewrite(&self.meta.join("journal"), &records) {
            Ok(new) => {
                *j = new;
                let mut g = self.lock();
                g.since_compaction = g.since_compaction - before + records.len() as u64;
                Ok(())
            }
            Err(e) => {
                // The old journal goes on; the records taken are still to be written to it,
                // before any made since.
                for r in &taken {
                    j.push(r);
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::Timestamp;

    fn v(size: u64) -> Version {
        Version {
            ino: 1,
            size,
            mtime: Timestamp { sec: 1, nsec: 2 },
            ctime: Timestamp { sec: 1, nsec: 2 },
            btime: Timestamp::default(),
        }
    }

    #[test]
    fn state_survives_reopen_and_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let p = Bytes::from_static(b"x/y");
        {
            let c = CacheDir::open(
                &dir.path().join("copy"),
                &StateBase::new(dir.path().join("state")),
            )
            .unwrap();
            let g = c.begin(&p, v(5000), 1024);
            c.mark_present(&p, g, 0, 3);
            c.mark_present(&p, g + 1, 3, 2); // another generation: ignored
            let g2 = c.begin(&Bytes::from_static(b"other"), v(1), 1024);
            assert!(g2 > g);
            c.commit().unwrap();
        }
        {
            let c = CacheDir::open(
                &dir.path().join("copy"),
                &StateBase::new(dir.path().join("state")),
            )
            .unwrap();
            let s = c.state(&p).unwrap();
            assert_eq!(s.present_count(), 3);
            c.mark_present(&p, s.generation, 3, 2);
            c.mark_verified(&p, s.generation, [9; 32]);
            c.commit().unwrap();
            let mut g = c.lock();
            g.since_compaction = 1_000_000;
            drop(g);
            c.compact_if_large().unwrap();
        }
        let c = CacheDir::open(
            &dir.path().join("copy"),
            &StateBase::new(dir.path().join("state")),
        )
        .unwrap();
        let s = c.state(&p).unwrap();
        assert!(s.complete());
        assert_eq!(s.verified, Some([9; 32]));
    }

    #[test]
    fn compaction_keeps_records_not_yet_committed_and_appends_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let p = Bytes::from_static(b"f");
        {
            let c = CacheDir::open(
                &dir.path().join("copy"),
                &StateBase::new(dir.path().join("state")),
            )
            .unwrap();
            let g = c.begin(&p, v(5000), 1024);
            c.mark_present(&p, g, 0, 2); // not committed before the compaction
            c.lock().since_compaction = 1_000_000;
            c.compact_if_large().unwrap();
            assert!(c.lock().since_compaction < 10);
            c.mark_present(&p, g, 2, 3);
            c.mark_verified(&p, g, [7; 32]);
            c.commit().unwrap();
        }
        let c = CacheDir::open(
            &dir.path().join("copy"),
            &StateBase::new(dir.path().join("state")),
        )
        .unwrap();
        let s = c.state(&p).unwrap();
        assert!(s.complete());
        assert_eq!(s.verified, Some([7; 32]));
    }

    #[test]
    fn a_chunk_written_before_a_restart_is_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let c = CacheDir::open(
            &dir.path().join("copy"),
            &StateBase::new(dir.path().join("state")),
        )
        .unwrap();
        let p = Bytes::from_static(b"f");
        let (_old, g1) = c.restart_file(&p, v(3000), 1024).unwrap();
        let (held, st) = c.open_current(&p, true).unwrap().unwrap();
        assert_eq!(st.generation, g1);
        // The file starts over at the same version (e.g. after a hash mismatch).
        let (_new, g2) = c.restart_file(&p, v(3000), 1024).unwrap();
        assert_ne!(g1, g2);
        // A writer still holding the old inode: its chunk is not recorded.
        std::os::unix::fs::FileExt::write_all_at(&held, b"x", 0).unwrap();
        assert!(!c.mark_present(&p, g1, 0, 3));
        assert_eq!(c.state(&p).unwrap().present_count(), 0);
        assert!(c.mark_present(&p, g2, 0, 3));
        assert!(c.state(&p).unwrap().complete());
    }

    #[test]
    fn a_second_process_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _a = CacheDir::open(
            &dir.path().join("copy"),
            &StateBase::new(dir.path().join("state")),
        )
        .unwrap();
        let err = CacheDir::open(
            &dir.path().join("copy"),
            &StateBase::new(dir.path().join("state")),
        )
        .unwrap_err();
        assert!(err.to_string().contains("in use by another ferry process"));
    }

    /// Records `p` at a version of 5000 bytes with its five chunks present, committed.
    fn five_chunks(c: &CacheDir, p: &Bytes) {
        let g = c.begin(p, v(5000), 1024);
        c.mark_present(p, g, 0, 5);
        c.commit().unwrap();
    }

    fn two(dir: &tempfile::TempDir) -> (PathBuf, StateBase) {
        (
            dir.path().join("copy"),
            StateBase::new(dir.path().join("state")),
        )
    }

    #[test]
    fn the_state_lives_outside_the_copy_and_an_older_ferrys_is_moved_out() {
        let dir = tempfile::tempdir().unwrap();
        let (root, base) = two(&dir);
        let p = Bytes::from_static(b"f");
        // What an older ferry left: DIR/.ferry/{lock,journal,status.json}.
        {
            let c = CacheDir::open(&root, &base).unwrap();
            five_chunks(&c, &p);
            let legacy = root.join(LEGACY_STATE_DIR);
            std::fs::create_dir(&legacy).unwrap();
            for f in ["journal", "lock", "status.json"] {
                let from = c.meta().join(f);
                if from.exists() {
                    std::fs::rename(from, legacy.join(f)).unwrap();
                } else {
                    std::fs::write(legacy.join(f), b"{}").unwrap();
                }
            }
            assert!(!c.meta().starts_with(&root));
        }
        let c = CacheDir::open(&root, &base).unwrap();
        assert!(c.state(&p).unwrap().complete(), "the journal came along");
        assert!(c.meta().join("status.json").is_file());
        assert!(!root.join(LEGACY_STATE_DIR).exists());
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
    }

    #[test]
    fn state_inside_and_outside_at_once_is_refused_and_an_exported_ferry_folder_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (root, base) = two(&dir);
        {
            let c = CacheDir::open(&root, &base).unwrap();
            c.begin(&Bytes::from_static(b"f"), v(1), 1024);
            c.commit().unwrap();
        }
        // A `.ferry` folder that came from the export (no journal of ours): kept as is.
        let legacy = root.join(LEGACY_STATE_DIR);
        std::fs::create_dir(&legacy).unwrap();
        std::fs::write(legacy.join("journal"), b"not ours").unwrap();
        drop(CacheDir::open(&root, &base).unwrap());
        assert_eq!(std::fs::read(legacy.join("journal")).unwrap(), b"not ours");
        // An older ferry's state beside ours: refused, nothing removed.
        std::fs::copy(
            base.folder_for(&std::fs::canonicalize(&root).unwrap())
                .join("journal"),
            legacy.join("journal"),
        )
        .unwrap();
        let err = CacheDir::open(&root, &base).unwrap_err().to_string();
        assert!(err.contains("remove one of them"), "{err}");
        assert!(legacy.join("journal").is_file());
    }

    #[test]
    fn state_of_a_directory_removed_and_made_again_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (root, base) = two(&dir);
        let p = Bytes::from_static(b"f");
        five_chunks(&CacheDir::open(&root, &base).unwrap(), &p);
        assert!(CacheDir::open(&root, &base).unwrap().state(&p).is_some());
        std::fs::remove_dir_all(&root).unwrap();
        // Another directory at the same path (likely under the same inode number).
        std::fs::create_dir(&root).unwrap();
        let c = CacheDir::open(&root, &base).unwrap();
        assert!(c.state(&p).is_none());
    }
}
