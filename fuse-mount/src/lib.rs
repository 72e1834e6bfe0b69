//! ferry-mount: `ferry mount` mounts a ferryd export with FUSE, read-only; `ferry mirror`
//! copies a whole export into a local directory; `ferry status` reports on one.
//!
//! - [`target`]: parsing `HOST[:PORT][:/PATH]`.
//! - [`fs`]: the file system itself, async and free of fuser types (so it can be tested
//!   without the kernel): inode table, attribute caching, directory listings, reads
//!   through the shared chunk store with per-handle read-ahead.
//! - [`fuse`]: the thin `fuser::Filesystem` adapter: each request becomes a task on the
//!   mount's tokio runtime, which replies when done (fuser replies are `Send`), so many
//!   FUSE requests are served at once by few threads.
//! - [`error`]: [`error::Error`] and the errno each failure becomes.
//! - [`mount`]: session setup: mount options, stale-mount recovery, the kernel readahead
//!   of the mount's bdi, signals, clean unmount.
//! - [`mirror_cli`]: `ferry mirror` (the ferry-cache engine without FUSE, with a progress
//!   bar) and `ferry status`.

pub mod error;
pub mod fs;
pub mod fuse;
pub mod mirror_cli;
pub mod mount;
pub mod target;
