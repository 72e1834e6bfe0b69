//! [`MountError`]: why a mount could not be set up, or not be taken down.
//!
//! Each variant reads as one line with its source appended (`ferry_util::error_line` in the
//! binary), so `ferry mount` reports every start-up failure as one line.

use std::path::PathBuf;

use ferry_cache::state::CacheError;
use ferry_client::ClientError;

/// Why [`super::MountSession::start`] (or an unmount) failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// `mirror` without `cache_dir`: the mirror needs somewhere to write.
    #[error(
        "--mirror fills a local copy: give --cache-dir DIR too (a directory on fast local disk)"
    )]
    MirrorNeedsCacheDir,
    /// `bwlimit` without `mirror`: only the background mirror is capped.
    #[error("--bwlimit caps the background mirror: give --mirror too (reads through the mount are never capped)")]
    BwlimitNeedsMirror,
    /// `rescan` without `mirror`: only the background mirror goes over the export again.
    #[error("--rescan repeats the background mirror's passes: give --mirror too")]
    RescanNeedsMirror,
    /// The mount point cannot be examined (missing, no permission, …).
    #[error("mount point {}", path.display())]
    Mountpoint {
        /// The mount point.
        path: PathBuf,
        /// What examining it returned.
        #[source]
        source: std::io::Error,
    },
    /// The mount point is a file, not a directory.
    #[error("mount point {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A live FUSE file system is mounted there already.
    #[error("{} is already a mounted {fstype} file system: unmount it first (fusermount3 -u {})", path.display(), path.display())]
    AlreadyMounted {
        /// The mount point.
        path: PathBuf,
        /// The type of what is mounted (`fuse.ferry`, `fuse.sshfs`, …).
        fstype: String,
    },
    /// The mount point's path contains a NUL byte (no system call can take it).
    #[error("mount point {} contains NUL", path.display())]
    PathHasNul {
        /// The mount point.
        path: PathBuf,
        /// Where the NUL is.
        #[source]
        source: std::ffi::NulError,
    },
    /// Neither `umount2` nor `fusermount3 -u -z` could detach a mount.
    #[error("cannot unmount {} (try `fusermount3 -u -z {}`)", path.display(), path.display())]
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// What `umount2` returned.
        #[source]
        source: std::io::Error,
    },
    /// The tokio runtime could not be built (threads, epoll).
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    /// Connecting to ferryd failed (unreachable, refused, TLS, token).
    #[error(transparent)]
    Connect(ClientError),
    /// The remote directory to mount cannot be looked up.
    #[error("remote path /{path} on {addr}")]
    RemoteRoot {
        /// The path beneath the export.
        path: String,
        /// The server (HOST:PORT).
        addr: String,
        /// What the server answered.
        #[source]
        source: ClientError,
    },
    /// The remote path names a file, not a directory.
    #[error("remote path /{0} is not a directory")]
    RemoteNotADirectory(String),
    /// The cache directory (`cache_dir`) cannot be opened or is in use.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The metrics address cannot be listened on.
    #[error("--metrics {addr}: cannot listen there")]
    Metrics {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// What binding returned.
        #[source]
        source: std::io::Error,
    },
    /// The kernel (or fusermount3) refused the mount.
    #[error("cannot mount on {} (is /dev/fuse available and fuse3 installed?)", path.display())]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// What mounting returned.
        #[source]
        source: std::io::Error,
    },
}
