//! ferry-util: the small I/O-side helpers that ferryd, the mount and the mirror share, so
//! each is written once.
//!
//! - [`metrics`]: the `/metrics` HTTP serving loop (the page and the response bytes are
//!   built by the pure `ferry_proto::metrics`; this crate only does the socket part).
//! - [`task`]: [`AbortOnDrop`], a task that ends with its owner; [`lock`], a mutex locked
//!   whatever a panicking holder left.
//! - [`process`]: process set-up of the binaries ([`limit_malloc_arenas`]), errors as one
//!   line ([`error_line`]) and, with the `cli` feature, [`one_line_usage_error`].
//! - [`priority`]: [`lower_current_thread`], lower CPU and I/O priority for background
//!   threads (the mirror's, the write-back queue's), so readers come first.
//! - [`background`]: [`background::Pool`], named threads at that lower priority with a
//!   bounded queue (the mirror's work, ferryd's background reads).
//! - [`direct`]: direct I/O for the local copy's bulk data (written and read back past the
//!   page cache, which belongs to readers).
//! - [`sparse`]: sparse writes (holes punched, all-zero blocks left unallocated).
//! - [`human`]: [`human_bytes`], sizes as people read them in logs and progress lines.
//! - [`token`]: [`read_token_file`], a `--token-file` read the same way by ferryd and the
//!   clients.

pub mod background;
pub mod cpu;
pub mod direct;
pub mod human;
pub mod metrics;
pub mod priority;
pub mod process;
pub mod sparse;
pub mod task;
pub mod token;
pub mod xattr;

pub use human::human_bytes;
pub use metrics::serve_metrics;
pub use priority::lower_current_thread;
#[cfg(feature = "cli")]
pub use process::one_line_usage_error;
pub use process::{error_line, limit_malloc_arenas, usage_error_line};
pub use task::{lock, AbortOnDrop};
pub use token::read_token_file;
