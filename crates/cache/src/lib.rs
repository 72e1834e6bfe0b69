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
