//! Verification: the BLAKE3 of a file's local copy against the server's hash of the same
//! version. A match is recorded through the syncer, after the file's chunks (so the journal
//! never says "verified" of a file whose chunks it does not list).
//!
//! The server's hash comes with the read when one read returned the whole file (servers with
//! READ_HASH), else it is asked for; an answer for another version means the file changed.
//!
//! Hashing a complete file reads all of it back: it runs on the background threads, after
//! waiting (boundedly) for demand reads in flight to finish.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use ferry_client::ClientError;
use ferry_proto::{Attr, Status, Version};
use ferry_util::lock;
use tracing::debug;

use super::file::FileOutcome;
use super::Ctx;

/// What a verification found.
pub(super) enum Verdict {
    /// The hashes match; recorded.
    Match,
    /// The attempt ends with this; what it counted as done is taken back.
    Failed(std::io::Result<FileOutcome>),
    /// The local copy could not be read: the attempt ends with this error.
    Unreadable(std::io::Error),
}

impl Verdict {
    /// `None` on a match; else how the attempt ends, with the `done` bytes it counted taken
    /// back from the progress where the next attempt counts them anew.
    pub(super) fn with_taken_back(
        self,
        ctx: &Ctx,
        done: u64,
    ) -> Option<std::io::Result<FileOutcome>> {
        match self {
            Verdict::Match => None,
            Verdict::Failed(o) => {
                ctx.progress.bytes_done.fetch_sub(done, Ordering::Relaxed);
                Some(o)
            }
            Verdict::Unreadable(e) => Some(Err(e)),
        }
    }
}

/// Both hashes of a large file, worked out while its chunks arrive instead of after the
/// last: the server's asked for when the copy starts (ferryd hashes the file beside sending
/// it), the local copy's read back as its written prefix grows, [`PREFIX_STEP`] at a time on
/// the background threads. After the last chunk only the tail is left to read: a 1 GiB datafile
/// over 100 Mbit/s spent 1.1 s of a 3.1-s copy in the two hashes after it.
pub(super) struct Alongside {
    server: ferry_util::AbortOnDrop<Result<ferry_client::RemoteDigest, ClientError>>,
    local: Arc<Prefix>,
}

/// The local copy's BLAKE3 over its written prefix.
struct Prefix {
    path: std::path::PathBuf,
    chunk: u64,
    size: u64,
    state: Mutex<PrefixState>,
}

struct PrefixState {
    /// `None` while a read-back holds it.
    hasher: Option<blake3::Hasher>,
    /// Bytes hashed so far (a multiple of the chunk size until the end).
    hashed: u64,
    /// Chunks written beyond the hashed prefix.
    written: BTreeSet<u64>,
    /// The read-back under way.
    job: Option<tokio::task::JoinHandle<()>>,
    failed: Option<std::io::Error>,
}

/// Bytes of written prefix a read-back waits for (fewer reads, each long enough for direct
/// I/O to stream).
const PREFIX_STEP: u64 = 16 << 20;

/// Files smaller than this are hashed after their last chunk as before: their hashes take
/// little time there.
pub(super) const ALONGSIDE_MIN: u64 = 64 << 20;

impl Alongside {
    /// Starts both hashes of `remote` (local copy at `local`, `size` bytes in chunks of
    /// `chunk`), none of its chunks written yet.
    pub(super) fn start(
        ctx: &Ctx,
        remote: Bytes,
        local: std::path::PathBuf,
        size: u64,
        chunk: u64,
    ) -> Alongside {
        let client = ctx.client.clone();
        Alongside {
            server: ferry_util::AbortOnDrop(tokio::spawn(async move {
                client.remote_digest(remote, false).await
            })),
            local: Prefix::new(local, size, chunk),
        }
    }

    /// What the chunks' tasks tell of their writes.
    pub(super) fn tracker(&self) -> Written {
        Written(self.local.clone())
    }
}

/// Told of each chunk written, for [`Alongside`].
#[derive(Clone)]
pub(super) struct Written(Arc<Prefix>);

impl Written {
    /// Chunks `first..first + count` are written: the prefix they complete is read back.
    pub(super) fn chunks(&self, first: u64, count: u64) {
        lock(&self.0.state).written.extend(first..first + count);
        Prefix::advance(&self.0);
    }
}

impl Prefix {
    /// The hash of the file at `path`, `size` bytes in chunks of `chunk`, none written yet.
    fn new(path: std::path::PathBuf, size: u64, chunk: u64) -> Arc<Prefix> {
        Arc::new(Prefix {
            path,
            chunk,
            size,
            state: Mutex::new(PrefixState {
                hasher: Some(blake3::Hasher::new()),
                hashed: 0,
                written: BTreeSet::new(),
                job: None,
                failed: None,
            }),
        })
    }

    /// The end of the written prefix: chunks written in a row from the hashed end on.
    fn prefix_end(&self, s: &PrefixState) -> u64 {
        let mut i = s.hashed / self.chunk;
        while s.written.contains(&i) {
            i += 1;
        }
        (i * self.chunk).min(self.size)
    }

    /// Reads back the written prefix beyond what is hashed, when it has grown by
    /// [`PREFIX_STEP`] (or reaches the end) and no read-back is under way.
    fn advance(me: &Arc<Prefix>) {
        let mut s = lock(&me.state);
        if s.job.is_some() || s.failed.is_some() {
            return;
        }
        let from = s.hashed;
        let to = me.prefix_end(&s);
        if to <= from || (to < from + PREFIX_STEP && to < me.size) {
            return;
        }
        let Some(mut hasher) = s.hasher.take() else {
            return;
        };
        let p = me.clone();
        s.job = Some(tokio::spawn(async move {
            let path = p.path.clone();
            let read = crate::background::run_long(move || {
                ferry_util::direct::read_range(&path, from, to, |b| {
                    hasher.update(b);
                })
                .map(|()| hasher)
            })
            .await;
            let mut s = lock(&p.state);
            s.job = None;
            match read {
                Ok(Ok(h)) => {
                    s.hasher = Some(h);
                    s.hashed = to;
                    let first_unhashed = to / p.chunk;
                    s.written = s.written.split_off(&first_unhashed);
                }
                Ok(Err(e)) => s.failed = Some(e),
                Err(e) => s.failed = Some(std::io::Error::other(e)),
            }
            drop(s);
            Prefix::advance(&p);
        }));
    }

    /// The local copy's BLAKE3, every chunk written: the read-back under way awaited, the
    /// rest read.
    async fn finish(me: Arc<Prefix>) -> std::io::Result<[u8; 32]> {
        loop {
            let job = lock(&me.state).job.take();
            match job {
                Some(j) => {
                    let _ = j.await;
                }
                None => break,
            }
        }
        let (mut hasher, from) = {
            let mut s = lock(&me.state);
            if let Some(e) = s.failed.take() {
                return Err(e);
            }
            let h = s
                .hasher
                .take()
                .ok_or_else(|| std::io::Error::other("reading back the local copy failed"))?;
            (h, s.hashed)
        };
        let (path, size) = (me.path.clone(), me.size);
        crate::background::run_long(move || {
            ferry_util::direct::read_range(&path, from, size, |b| {
                hasher.update(b);
            })
            .map(|()| *hasher.finalize().as_bytes())
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

/// Verifies the local file of `rel` (of `generation`), every chunk of `attr`'s version
/// written. `whole_file_hash`: the server's hash, when one read returned the whole file;
/// `alongside`: both hashes worked out while the chunks arrived.
pub(super) async fn written(
    ctx: &Ctx,
    rel: &Bytes,
    remote: &Bytes,
    attr: &Attr,
    generation: u64,
    whole_file_hash: Option<[u8; 32]>,
    alongside: Option<Alongside>,
) -> Verdict {
    let version = attr.version();
    let local = ctx.cache.local_path(rel);
    // A sparse copy is hashed without reading its holes, on both ends.
    let sparse = whole_file_hash.is_none()
        && std::fs::metadata(&local).is_ok_and(|m| crate::sparse_hash_for(&ctx.client, &m));
    let (server, local_hash) =
        if let Some(a) = alongside.filter(|_| !sparse && whole_file_hash.is_none()) {
            let mut server = a.server;
            let (s, h) = tokio::join!(
                async {
                    (&mut server.0).await.unwrap_or_else(|e| {
                        Err(ClientError::Protocol(format!("the server's hash: {e}")))
                    })
                },
                Prefix::finish(a.local)
            );
            (Some(s), h.map(|h| ((h, None), ())))
        } else if attr.size == 0 || whole_file_hash.is_some() {
            let gate = ctx.gate.clone();
            let h = crate::local_digest(local, sparse, None, gate, |_| Ok(())).await;
            (None, h)
        } else {
            let (s, h) = crate::both_digests(
                &ctx.client,
                remote.clone(),
                local,
                sparse,
                ctx.gate.clone(),
                |_| Ok(()),
            )
            .await;
            (Some(s), h)
        };
    let ((local_hash, local_other), ()) = match local_hash {
        Ok(h) => h,
        Err(e) => return Verdict::Unreadable(e),
    };
    let expected = match server {
        // Empty, or read whole in one response that carried the server's hash of it
        // (of this very version: the read's version was checked).
        None => whole_file_hash.unwrap_or(*blake3::hash(b"").as_bytes()),
        Some(Ok(h)) if h.version == version => {
            if !h.matches(&local_hash, local_other.as_ref()) {
                return Verdict::Failed(Ok(FileOutcome::Mismatch));
            }
            // What is recorded: the copy's BLAKE3 (the source's when it gave one).
            local_hash
        }
        Some(Ok(h)) => {
            debug!(
                "hash answered for version {:?}, copied {:?}",
                h.version, version
            );
            return Verdict::Failed(Ok(FileOutcome::Changed(None)));
        }
        Some(Err(ClientError::Remote {
            status: Status::NotFound,
            ..
        })) => return Verdict::Failed(Ok(FileOutcome::Vanished)),
        Some(Err(e)) => {
            return Verdict::Failed(Err(std::io::Error::other(format!(
                "asking the server for its hash: {e}"
            ))))
        }
    };
    if local_hash != expected {
        return Verdict::Failed(Ok(FileOutcome::Mismatch));
    }
    ctx.progress.files_verified.fetch_add(1, Ordering::Relaxed);
    ctx.sync.verified(rel.clone(), generation, expected);
    Verdict::Match
}

/// Verifies a small file from `mine`, the BLAKE3 of the bytes written (computed with the
/// write, from memory). `file_hash`: the server's hash carried by the read, if any.
pub(super) async fn in_memory(
    ctx: &Ctx,
    rel: &Bytes,
    remote: Bytes,
    version: Version,
    generation: u64,
    mine: [u8; 32],
    file_hash: Option<[u8; 32]>,
) -> Verdict {
    let theirs = match file_hash {
        Some(h) => h,
        None => match ctx.client.hash(remote).await {
            Ok(h) if h.version == version => h.blake3,
            Ok(_) => return Verdict::Failed(Ok(FileOutcome::Changed(None))),
            Err(e) => {
                return Verdict::Failed(Err(std::io::Error::other(format!(
                    "asking the server for its hash: {e}"
                ))))
            }
        },
    };
    if mine != theirs {
        return Verdict::Failed(Ok(FileOutcome::Mismatch));
    }
    ctx.progress.files_verified.fetch_add(1, Ordering::Relaxed);
    ctx.sync.verified(rel.clone(), generation, theirs);
    Verdict::Match
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may panic on setup failures

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prefix_read_back_as_chunks_land_in_any_order_hashes_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let size: usize = (40 << 20) + 12_345;
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4099) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let chunk = 1u64 << 20;
        let n = (size as u64).div_ceil(chunk);
        let p = Prefix::new(path, size as u64, chunk);
        let w = Written(p.clone());
        // Out of order, as chunks land: a stride through all of them, some twice.
        for k in 0..n {
            w.chunks((k * 7) % n, 1);
            if k % 5 == 0 {
                w.chunks((k * 3) % n, 1);
            }
            tokio::task::yield_now().await;
        }
        // A read-back started before the end (the first 16 MiB came together early).
        let job = lock(&p.state).job.take();
        if let Some(j) = job {
            j.await.unwrap();
        }
        assert!(lock(&p.state).hashed >= PREFIX_STEP);
        let h = Prefix::finish(p).await.unwrap();
        assert_eq!(h, *blake3::hash(&data).as_bytes());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_local_copy_that_cannot_be_read_back_is_an_error_not_a_hash() {
        let dir = tempfile::tempdir().unwrap();
        let p = Prefix::new(dir.path().join("missing"), 32 << 20, 1 << 20);
        Written(p.clone()).chunks(0, 32);
        assert!(Prefix::finish(p).await.is_err());
    }
}
