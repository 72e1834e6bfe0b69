//! The mount's read-through use of a cache directory: every chunk fetched for a reader is
//! written into the local copy (and recorded once durable), and chunks the copy holds for
//! the version a reader opened are read from it without touching the network.
//!
//! The local copy is laid out as the mounted directory. A file is (re)started at a version
//! the first time a chunk of that version is stored: created or truncated to its size
//! (sparse), parents created as needed. Chunks of a version other than the one a reader
//! opened are never stored or served. If the cache's disk fails (full, read-only), storing
//! stops being attempted for a while and reads go on from the network.
//!
//! Threads: [`ChunkBacking::store`] runs on the chunk store's write-back threads (bounded
//! queue, lower priority; a chunk that does not fit is skipped there), `load` and
//! `complete_file` on tokio's blocking pool (they serve readers, at normal priority);
//! verifying completed files hashes on the background threads ([`crate::background`]) after
//! deferring to demand reads in flight. Every method here may block on the disk and none runs
//! on an async thread.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::{ChunkBacking, FileKey};

use crate::state::CacheDir;
use crate::syncer::Syncer;

/// Open local files kept (by export-relative path).
const OPEN_FILES: usize = 64;
/// After a failure to store, how long storing pauses.
const STORE_PAUSE: Duration = Duration::from_secs(30);

/// A cache directory behind a mount's chunk store.
pub struct LocalCopy {
    cache: Arc<CacheDir>,
    /// The mounted directory's path beneath the export (stripped from request paths).
    root: Bytes,
    chunk_size: u32,
    syncer: Syncer,
    files: Mutex<OpenFiles>,
    /// Held while deciding whether a file starts over, so two chunks of a new version
    /// arriving together do not both start it over.
    begin: Mutex<()>,
    paused_until: Mutex<Option<Instant>>,
    /// Chunks served from the local copy.
    pub served: AtomicU64,
    /// Chunks written into the local copy.
    pub stored: AtomicU64,
    /// Failures to store.
    pub store_errors: AtomicU64,
    /// Files verified complete (BLAKE3 equal to the server's).
    pub verified: AtomicU64,
    /// Complete files whose hash differed (dropped from the state, fetched again later).
    pub mismatches: AtomicU64,
}

impl std::fmt::Debug for LocalCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCopy")
            .field("root", &self.cache.root())
            .finish()
    }
}

#[derive(Default)]
struct OpenFiles {
    /// The open file of a path and its generation.
    map: HashMap<Bytes, (Arc<File>, u64)>,
    order: VecDeque<Bytes>,
}

impl LocalCopy {
    /// Uses `cache` for a mount of `root` (export-relative) with chunks of `chunk_size`.
    pub fn new(cache: Arc<CacheDir>, root: Bytes, chunk_size: u32, syncer: Syncer) -> LocalCopy {
        LocalCopy {
            cache,
            root,
            chunk_size,
            syncer,
            files: Mutex::new(OpenFiles::default()),
            begin: Mutex::new(()),
            paused_until: Mutex::new(None),
            served: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            verified: AtomicU64::new(0),
            mismatches: AtomicU64::new(0),
        }
    }

    /// Verifies the files the syncer reports complete (`completed`, from
    /// [`Syncer::start_with`]): the BLAKE3 of the local file against the server's, over the
    /// same version. A match is recorded (the file may then be opened with passthrough); a
    /// mismatch drops the file's state so its chunks are fetched again. Each hash waits while
    /// `client` has demand reads in flight (boundedly) and runs on the background threads.
    /// Runs until the channel closes.
    pub async fn verify_completed(
        self: Arc<Self>,
        client: ferry_client::Client,
        mut completed: tokio::sync::mpsc::UnboundedReceiver<(Bytes, ferry_proto::Version, u64)>,
    ) {
        while let Some((rel, version, generation)) = completed.recv().await {
            // The file may have started over since it was completed (the mirror rewrites a
            // small file it finds unverified): the hash would be of another generation's
            // file, perhaps half written. That generation is checked by whoever writes it.
            let current = || self.cache.generation(&rel) == Some(generation);
            if !current() {
                continue;
            }
            let remote = crate::mirror::remote_path(&self.root, &rel);
            let local = self.cache.local_path(&rel);
            // A sparse copy is hashed without reading its holes, on both ends.
            let sparse =
                std::fs::metadata(&local).is_ok_and(|m| crate::sparse_hash_for(&client, &m));
            let gate = crate::background::DemandGate::client(&client);
            // The stamp before the hash: an edit after it shows in a later check.
            let (theirs, mine) =
                crate::both_digests(&client, remote, local, sparse, gate, |local| {
                    let m = std::fs::symlink_metadata(local)?;
                    Ok(crate::mirror::metadata::stamp_of(&m))
                })
                .await;
            let ((mine, other), stamp) = match mine {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(
                        "verifying the local copy of /{}: {e}",
                        String::from_utf8_lossy(&rel)
                    );
                    continue;
                }
            };
            if !current() {
                continue;
            }
            match theirs {
                Ok(h) if h.version == version && h.matches(&mine, other.as_ref()) => {
                    tracing::debug!("verified /{}", String::from_utf8_lossy(&rel));
                    self.syncer.verified(rel.clone(), generation, mine);
                    self.syncer.stamped(rel, generation, stamp);
                    self.verified.fetch_add(1, Ordering::Relaxed);
                }
                Ok(h) if h.version == version => {
                    self.syncer.flush().await;
                    if self.cache.forget_generation(&rel, generation) {
                        self.mismatches.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            "local copy of /{} differs from the server's (BLAKE3): dropped, it is fetched again",
                            String::from_utf8_lossy(&rel)
                        );
                    }
                }
                // The file changed on the server: its next open starts it over.
                Ok(_) => {}
                Err(e) => tracing::debug!("hash of /{}: {e}", String::from_utf8_lossy(&rel)),
            }
        }
    }

    /// The cache directory.
    pub fn cache(&self) -> &Arc<CacheDir> {
        &self.cache
    }

    fn rel(&self, path: &Bytes) -> Option<Bytes> {
        if self.root.is_empty() {
            return Some(path.clone());
        }
        let rest = path.strip_prefix(self.root.as_ref())?;
        match rest.first() {
            None => Some(Bytes::new()),
            Some(b'/') => Some(path.slice(self.root.len() + 1..)),
            Some(_) => None,
        }
    }

    /// The open local file of `rel` of `generation` (kept open for the next chunks);
    /// `None` when the file is now of another generation.
    fn open(&self, rel: &Bytes, generation: u64) -> std::io::Result<Option<Arc<File>>> {
        if let Some((f, g)) = self
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .get(rel)
        {
            if *g == generation {
                return Ok(Some(f.clone()));
            }
        }
        match self.cache.open_current(rel, true)? {
            Some((f, st)) if st.generation == generation => {
                let f = Arc::new(f);
                self.remember(rel, f.clone(), generation);
                Ok(Some(f))
            }
            _ => Ok(None),
        }
    }

    fn remember(&self, rel: &Bytes, f: Arc<File>, generation: u64) {
        let mut g = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if g.map.insert(rel.clone(), (f, generation)).is_none() {
            g.order.push_back(rel.clone());
            while g.order.len() > OPEN_FILES {
                if let Some(old) = g.order.pop_front() {
                    g.map.remove(&old);
                }
            }
        }
    }

    fn paused(&self) -> bool {
        let g = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        g.is_some_and(|t| Instant::now() < t)
    }

    /// Writes chunk `index` into the local copy unless it is there already, being replaced
    /// or sealed; `Ok(true)` when it was written.
    fn try_store(&self, key: &FileKey, index: u64, data: &Bytes) -> std::io::Result<bool> {
        let Some(rel) = self.rel(&key.path) else {
            return Ok(false);
        };
        let (file, generation, _writing) = {
            let _one_at_a_time = self.begin.lock().unwrap_or_else(|e| e.into_inner());
            match self.cache.state(&rel) {
                Some(s) if s.version == key.version && s.chunk_size == self.chunk_size => {
                    if s.has(index) || !s.ready {
                        // Present, or being replaced by someone else (the mirror).
                        return Ok(false);
                    }
                    let Some(f) = self.open(&rel, s.generation)? else {
                        return Ok(false);
                    };
                    // Sealed: the mirror wrote every chunk and is setting the file's
                    // metadata; a write now would change its times.
                    let Some(writing) = self.cache.begin_write(&rel, s.generation) else {
                        return Ok(false);
                    };
                    (f, s.generation, writing)
                }
                _ => {
                    // First chunk of this version: the local file starts over (a new inode;
                    // old readers and passthrough opens keep the old one).
                    let (f, generation) =
                        self.cache
                            .restart_file(&rel, key.version, self.chunk_size)?;
                    let f = Arc::new(f);
                    self.remember(&rel, f.clone(), generation);
                    let Some(writing) = self.cache.begin_write(&rel, generation) else {
                        return Ok(false);
                    };
                    (f, generation, writing)
                }
            }
        };
        // A write that lands on a file which has started over since is harmless: it goes to
        // the old inode, and its record is refused (another generation). Zeros stay holes.
        ferry_util::sparse::write_sparse(&file, data, index * u64::from(self.chunk_size))?;
        self.syncer
            .written(rel, key.version, generation, index, file);
        Ok(true)
    }
}

impl ChunkBacking for LocalCopy {
    fn load(&self, key: &FileKey, index: u64, len: usize, range: Range<usize>) -> Option<Bytes> {
        let rel = self.rel(&key.path)?;
        let (generation, stamp) =
            self.cache
                .chunk_held(&rel, &key.version, self.chunk_size, index)?;
        if range.end > len || range.start >= range.end {
            return None;
        }
        let file = self.open(&rel, generation).ok()??;
        // A verified file is served only while it shows its stamp: one edited by hand since
        // is read from the server (and verified again by the next pass).
        if let Some(stamp) = stamp {
            let now = file
                .metadata()
                .ok()
                .map(|m| crate::mirror::metadata::stamp_of(&m));
            if now != Some(stamp) {
                return None;
            }
        }
        let mut buf = vec![0u8; range.end - range.start];
        let offset = index * u64::from(self.chunk_size) + range.start as u64;
        let mut filled = 0;
        while filled < buf.len() {
            match rustix::io::pread(&*file, &mut buf[filled..], offset + filled as u64) {
                Ok(0) => return None,
                Ok(n) => filled += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    tracing::warn!(
                        "local copy {}: {e}; reading from the server",
                        self.cache.local_path(&rel).display()
                    );
                    return None;
                }
            }
        }
        // The file may have started over while it was read.
        let still = self
            .cache
            .chunk_held(&rel, &key.version, self.chunk_size, index)
            .is_some_and(|(g, _)| g == generation);
        if !still {
            return None;
        }
        self.served.fetch_add(1, Ordering::Relaxed);
        Some(Bytes::from(buf))
    }

    fn may_hold(&self, key: &FileKey, index: u64) -> bool {
        self.rel(&key.path).is_some_and(|rel| {
            self.cache
                .chunk_held(&rel, &key.version, self.chunk_size, index)
                .is_some()
        })
    }

    fn complete_file(&self, key: &FileKey) -> Option<File> {
        let rel = self.rel(&key.path)?;
        let st = self.cache.state(&rel)?;
        if st.version != key.version || !st.complete() || st.verified.is_none() {
            return None;
        }
        let (f, now) = self.cache.open_current(&rel, false).ok()??;
        // The local file as it was verified: a file edited by hand since is read through
        // ferry (and verified again by the next pass).
        let stamp = f
            .metadata()
            .ok()
            .map(|m| crate::mirror::metadata::stamp_of(&m));
        (now.generation == st.generation && now.verified.is_some() && now.stamp == stamp)
            .then_some(f)
    }

    fn store(&self, key: &FileKey, index: u64, data: &Bytes) {
        if self.paused() {
            return;
        }
        match self.try_store(key, index, data) {
            Ok(true) => {
                self.stored.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(e) => {
                self.store_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "cache directory {}: {e}; reads go on from the server, storing paused for {} s",
                    self.cache.root().display(),
                    STORE_PAUSE.as_secs()
                );
                *self.paused_until.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(Instant::now() + STORE_PAUSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateBase;
    use std::os::unix::fs::{FileExt, MetadataExt};

    /// A cache directory in `dir` and its syncer (which syncs only when flushed).
    fn cache_in(
        dir: &std::path::Path,
    ) -> (
        Arc<CacheDir>,
        Syncer,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        let cache = Arc::new(
            CacheDir::open(&dir.join("copy"), &StateBase::new(dir.join("state"))).unwrap(),
        );
        let (syncer, task) = Syncer::start(
            cache.clone(),
            Duration::from_secs(3600),
            Arc::new(|e| panic!("{e}")),
        );
        (cache, syncer, task)
    }

    /// The race CI once lost (tests/s3.rs, no passthrough open after the mirror completed):
    /// the mirror wrote every chunk (recorded by the syncer only later), then set the file's
    /// times; a reader's store of a chunk it had fetched meanwhile landed after that and
    /// changed them, so the copy's mtime was not the source's and its stamp was refused.
    #[tokio::test]
    async fn a_readers_store_after_the_mirror_set_the_times_does_not_change_them() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, syncer, task) = cache_in(dir.path());
        let cs = 4096u32;
        let version = ferry_proto::Version {
            ino: 1,
            size: 2 * u64::from(cs),
            mtime: ferry_proto::Timestamp { sec: 1, nsec: 2 },
            ctime: ferry_proto::Timestamp { sec: 1, nsec: 2 },
            btime: ferry_proto::Timestamp::default(),
        };
        let rel = Bytes::from_static(b"f");
        let copy = LocalCopy::new(cache.clone(), Bytes::new(), cs, syncer.clone());
        let key = FileKey {
            id: 1,
            version,
            path: rel.clone(),
        };
        let chunk = Bytes::from(vec![7u8; cs as usize]);

        // The mirror: both chunks written, not yet recorded; sealed; times set.
        let (f, generation) = cache.restart_file(&rel, version, cs).unwrap();
        let f = Arc::new(f);
        for index in 0..2 {
            f.write_all_at(&chunk, index * u64::from(cs)).unwrap();
            syncer.written(rel.clone(), version, generation, index, f.clone());
        }
        cache.seal(&rel, generation);
        let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        f.set_modified(old).unwrap();
        let before = f.metadata().unwrap();
        std::thread::sleep(Duration::from_millis(20));

        // A reader's chunk arrives: the state does not show it held yet.
        assert!(!cache.state(&rel).unwrap().has(1));
        copy.store(&key, 1, &chunk);
        let after = f.metadata().unwrap();
        assert_eq!(
            (
                after.mtime(),
                after.mtime_nsec(),
                after.ctime(),
                after.ctime_nsec()
            ),
            (
                before.mtime(),
                before.mtime_nsec(),
                before.ctime(),
                before.ctime_nsec()
            ),
            "a reader wrote into a sealed file"
        );
        // Nor is it counted as stored (`ferry status` shows the count).
        assert_eq!(copy.stored.load(Ordering::Relaxed), 0);
        let other = FileKey {
            id: 2,
            version,
            path: Bytes::from_static(b"g"),
        };
        copy.store(&other, 0, &chunk);
        assert_eq!(copy.stored.load(Ordering::Relaxed), 1);

        // Lifted after the mirror's chunks are recorded: readers see them held.
        syncer.lift_seal(rel.clone(), generation);
        syncer.flush().await;
        assert!(cache.state(&rel).unwrap().complete());
        assert_eq!(cache.seals_tracked(), 0, "the seal is gone");
        drop((copy, syncer));
        task.await.unwrap().unwrap();
    }

    /// Runs the check of `rel` of `generation` that a completion through the mount asks for.
    async fn check(
        copy: &Arc<LocalCopy>,
        client: &ferry_client::Client,
        rel: &Bytes,
        version: ferry_proto::Version,
        generation: u64,
    ) {
        let (done, completed) = tokio::sync::mpsc::unbounded_channel();
        done.send((rel.clone(), version, generation)).unwrap();
        drop(done);
        copy.clone()
            .verify_completed(client.clone(), completed)
            .await;
    }

    /// The race CI once lost (tests/mount_mirror.rs, a file missing from the journal after
    /// the mirror completed): readers completed a small file; before its check ran, the
    /// mirror found it unverified and wrote it anew; the check hashed the new, half-written
    /// file, called it a mismatch and dropped the state of the mirror's generation.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_check_of_a_file_that_started_over_since_leaves_the_new_generation_alone() {
        let src = tempfile::tempdir().unwrap();
        let cs = 4096u32;
        let content: Vec<u8> = (0..3 * cs).map(|i| (i % 251) as u8).collect();
        std::fs::write(src.path().join("f"), &content).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let config = ferry_server::ServerConfig {
            export: src.path().to_path_buf(),
            ..Default::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(ferry_server::run(listener, config, async {
            let _ = stopped.await;
        }));
        let client = ferry_client::Client::connect(ferry_client::ClientConfig {
            addr,
            ..Default::default()
        })
        .await
        .unwrap();

        let dir = tempfile::tempdir().unwrap();
        let (cache, syncer, task) = cache_in(dir.path());
        let rel = Bytes::from_static(b"f");
        let version = client
            .stat(crate::mirror::remote_path(&Bytes::new(), &rel))
            .await
            .unwrap()
            .version();
        let copy = Arc::new(LocalCopy::new(
            cache.clone(),
            Bytes::new(),
            cs,
            syncer.clone(),
        ));

        // Readers completed the file (generation `first`)...
        let (f, first) = cache.restart_file(&rel, version, cs).unwrap();
        let f = Arc::new(f);
        f.write_all_at(&content, 0).unwrap();
        for index in 0..3 {
            syncer.written(rel.clone(), version, first, index, f.clone());
        }
        syncer.flush().await;
        assert!(cache.state(&rel).unwrap().complete());
        // ...then the mirror started it over and has written one chunk of three.
        let (g, second) = cache.restart_file(&rel, version, cs).unwrap();
        g.write_all_at(&content[..cs as usize], 0).unwrap();
        assert_ne!(first, second);

        // The readers' completion is checked now.
        check(&copy, &client, &rel, version, first).await;
        syncer.flush().await;

        let st = cache
            .state(&rel)
            .expect("the mirror's generation is still tracked");
        assert_eq!(st.generation, second);
        assert_eq!(copy.mismatches.load(Ordering::Relaxed), 0);
        assert_eq!(copy.verified.load(Ordering::Relaxed), 0);
        // A check of the current generation still finds a bad copy bad.
        check(&copy, &client, &rel, version, second).await;
        assert!(
            cache.state(&rel).is_none(),
            "the half-written copy is dropped"
        );
        assert_eq!(copy.mismatches.load(Ordering::Relaxed), 1);

        drop((copy, syncer, stop));
        task.await.unwrap().unwrap();
    }
}
