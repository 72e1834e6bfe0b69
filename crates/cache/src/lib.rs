//! ferry's local copy of an export.
//!
//! A cache directory holds the copy laid out exactly as the export (plain files, sparse
//! while they fill; directories, symlinks, modes and nanosecond mtimes as the source) and
//! nothing else. Its state lives outside it, in a state folder ([`state::location`]:
//! `/var/lib/ferry/NAME-HASH/` as root) whose journal records for every file the remote
//! version the local bytes belong to, which chunks of it are present (durable on disk), and
//! whether the whole file was verified against the server's BLAKE3.
//!
//! - [`background`]: the mirror's low-priority threads ([`background::run`]) and the
//!   rule by which its CPU and disk work defers to demand reads ([`background::DemandGate`]).
//! - [`journal`]: the on-disk record format (checksummed, append-only, replayed on open,
//!   compacted).
//! - [`state`]: per-file state and the [`CacheDir`] that owns the directory.
//! - [`mirror`]: the engine that walks the export and fills the copy ([`mirror::Mirror`]).
//! - [`progress`]: counters, and the status file `ferry status` reads.
//! - [`supervisor`]: the mount's background mirror: passes retried with backoff, the
//!   phase its status shows.
//! - [`syncer`]: group commit of written chunks (durable first, recorded second).
//! - [`local`]: [`LocalCopy`], the mount's read-through use of a cache directory.

pub mod background;
pub mod journal;
pub mod local;
pub mod mirror;
pub mod progress;
pub mod state;
pub mod supervisor;
pub mod syncer;

pub use local::LocalCopy;
pub use mirror::{Mirror, MirrorConfig, MirrorError, Owners};
pub use progress::{Faults, MountStatus, Progress, SchedulerStatus, State, Status};
pub use state::{find_state, CacheDir, FileState, StateBase};
pub use supervisor::{MirrorPhase, MirrorSupervisor, MirrorTask};
pub use syncer::Syncer;

/// Whether a local file (`meta`) is verified with the sparse hash: it leaves at least
/// [`ferry_proto::extents::SPARSE_SLACK`] unallocated and the server can
/// ([`ferry_client::Client::hash_of`]); both ends then skip its holes. The choice is made
/// from the local file, so a later check of the same file makes it again.
pub fn sparse_hash_for(client: &ferry_client::Client, meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    client.can_hash_sparse() && ferry_proto::extents::looks_sparse(meta.blocks() * 512, meta.len())
}

/// The local side of a verification: [`hash_file`], or with `sparse` the sparse hash
/// ([`ferry_util::sparse::hash_sparse`]).
///
/// # Errors
/// The file cannot be opened or read.
pub fn hash_local(path: &std::path::Path, sparse: bool) -> std::io::Result<[u8; 32]> {
    if !sparse {
        return hash_file(path);
    }
    let f = std::fs::File::open(path)?;
    let size = f.metadata()?.len();
    ferry_util::sparse::hash_sparse(&f, size)
}

/// The local side of a verification against a [`ferry_client::RemoteDigest`]: the copy's
/// BLAKE3 ([`hash_local`], recorded in the journal) and, when the source vouches with
/// another kind (an S3 object's checksum or MD5 ETag), that digest too, in the same pass.
///
/// # Errors
/// The file cannot be opened or read.
pub fn hash_local_with(
    path: &std::path::Path,
    sparse: bool,
    other: Option<ferry_client::DigestKind>,
) -> std::io::Result<([u8; 32], Option<ferry_client::Digest>)> {
    let Some(kind) = other else {
        return hash_local(path, sparse).map(|h| (h, None));
    };
    let mut h = blake3::Hasher::new();
    let mut d = ferry_client::Digester::new(kind);
    ferry_util::direct::read_all(path, |b| {
        h.update(b);
        d.update(b);
    })?;
    Ok((*h.finalize().as_bytes(), Some(d.finish())))
}

/// A local copy's side of a verification: its BLAKE3, and its digest of the source's
/// other kind when the source vouches with one.
pub type LocalDigest = ([u8; 32], Option<ferry_client::Digest>);

/// The local side of a verification: `prepare` of the copy at `local` (e.g. a sync), then its
/// [`hash_local_with`], on the background threads once `gate` lets background work run.
pub(crate) async fn local_digest<T: Send + 'static>(
    local: std::path::PathBuf,
    sparse: bool,
    other: Option<ferry_client::DigestKind>,
    gate: background::DemandGate,
    prepare: impl FnOnce(&std::path::Path) -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<(LocalDigest, T)> {
    gate.wait().await;
    background::run_long(move || {
        let t = prepare(&local)?;
        hash_local_with(&local, sparse, other).map(|h| (h, t))
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Both sides of a verification: the source's digest of `remote`, and [`local_digest`] of
/// the copy. At once where the local kind is known ahead (ferryd: BLAKE3); after the source's
/// answer where it is not (S3: the object says which).
pub(crate) async fn both_digests<T: Send + 'static>(
    client: &ferry_client::Client,
    remote: bytes::Bytes,
    local: std::path::PathBuf,
    sparse: bool,
    gate: background::DemandGate,
    prepare: impl FnOnce(&std::path::Path) -> std::io::Result<T> + Send + 'static,
) -> (
    Result<ferry_client::RemoteDigest, ferry_client::ClientError>,
    std::io::Result<(LocalDigest, T)>,
) {
    if client.s3().is_none() {
        return tokio::join!(
            client.remote_digest(remote, sparse),
            local_digest(local, sparse, None, gate, prepare)
        );
    }
    let theirs = client.remote_digest(remote, sparse).await;
    let other = theirs.as_ref().ok().and_then(|t| t.other_kind());
    let mine = local_digest(local, sparse, other, gate, prepare).await;
    (theirs, mine)
}

/// BLAKE3 of the file at `path` (the local side of every verification), read past the
/// page cache where possible ([`ferry_util::direct`]).
///
/// # Errors
/// The file cannot be opened or read.
pub fn hash_file(path: &std::path::Path) -> std::io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    ferry_util::direct::read_all(path, |b| {
        h.update(b);
    })?;
    Ok(*h.finalize().as_bytes())
}
