//! The `ferry` binary's own modules: argument parsing and everything that talks to the
//! terminal. The library (`ferry_mount`, `ferry_cache`) takes plain config structs and
//! reports through counters and [`ferry_cache::Status`]; rendering them is done here.
//!
//! - [`args`]: the clap definitions of `ferry mount`, `ferry mirror`, `ferry status`, and
//!   rate parsing (`--bwlimit 100M`).
//! - [`options`]: sshfs/fstab style `-o opt,opt=val` expanded into flags.
//! - [`config`]: arguments checked and turned into `MountConfig`, `ClientConfig`, ….
//! - [`logging`]: the log filter and destination, and panics logged.
//! - [`daemon`]: `ferry mount`: in the foreground, or forked into the background once the
//!   mount is ready.
//! - [`mirror`]: `ferry mirror`: the mirror engine with a progress bar or progress lines.
//! - [`status`]: `ferry status [--json] [--watch]`.
//! - [`render`]: the progress lines and bars `mirror` and `status` share.

pub mod args;
pub mod config;
pub mod daemon;
pub mod logging;
pub mod mirror;
pub mod options;
pub mod render;
pub mod status;
