//! Verification: the BLAKE3 of a file's local copy against the server's hash of the same
//! version. A match is recorded through the syncer, after the file's chunks (so the journal
//! never says "verified" of a file whose chunks it does not list).
//!
//! The server's hash comes with the read when one read returned the whole file (servers with
//! READ_HASH), else it is asked for; an answer for another version means the file changed.
//!
//! Hashing a complete file reads all of it back: it runs on the background threads, after
//! waiting (boundedly) for demand reads in flight to finish.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use ferry_client::ClientError;
use ferry_proto::{Attr, Status, Version};
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

/// Verifies the local file of `rel` (of `generation`), every chunk of `attr`'s version
/// written. `whole_file_hash`: the server's hash, when one read returned the whole file.
pub(super) async fn written(
    ctx: &Ctx,
    rel: &Bytes,
    remote: &Bytes,
    attr: &Attr,
    generation: u64,
    whole_file_hash: Option<[u8; 32]>,
) -> Verdict {
    let version = attr.version();
    let local = ctx.cache.local_path(rel);
    // A sparse copy is hashed without reading its holes, on both ends.
    let sparse = whole_file_hash.is_none()
        && std::fs::metadata(&local).is_ok_and(|m| crate::sparse_hash_for(&ctx.client, &m));
    let (server, local_hash) = if attr.size == 0 || whole_file_hash.is_some() {
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
