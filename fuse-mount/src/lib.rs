//! ferry-mount: `ferry mount` mounts a ferryd export with FUSE, read-only. (The binary,
//! `src/main.rs` with its `cli` modules, also runs `ferry mirror` and `ferry status` and
//! renders their progress; the library has no terminal output.)
//!
//! - [`target`]: parsing `HOST[:PORT][:/PATH]`.
//! - [`fs`]: the file system itself, async and free of fuser types (so it can be tested
//!   without the kernel): inode table, attribute caching, directory listings, reads
//!   through the shared chunk store with per-handle read-ahead.
//! - [`fuse`]: the thin `fuser::Filesystem` adapter: each request becomes a task on the
//!   mount's tokio runtime, which replies when done (fuser replies are `Send`), so many
//!   FUSE requests are served at once by few threads.
//! - [`error`]: [`error::Error`] and the errno each failure becomes.
//! - [`mount`]: [`mount::MountSession`], the mount's lifetime: stale-mount recovery, the
//!   kernel readahead of the mount's bdi, the local copy and its background mirror,
//!   status and metrics, signals, clean unmount.

pub mod error;
pub mod fs;
pub mod fuse;
pub mod mount;
pub mod target;
