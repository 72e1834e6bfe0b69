//! ferry-client: talks to `ferryd` over several TCP streams at once.
//!
//! - [`pool`]: [`Client`], a pool of connections. Each connection pipelines many requests
//!   (a writer task batches frames, a reader task matches responses to waiting callers by
//!   request id); each call goes to the least-loaded stream, so one big file's chunks are
//!   spread over all streams. Its stages: opening a stream (`pool/handshake.rs`, driving
//!   ferry-proto's handshake machine), a connection's tasks (`pool/conn.rs`), the fetch
//!   scheduler (`pool/schedule.rs`: classes, stream choice, the delay-controlled background
//!   window, piece size), reconnects (`pool/reconnect.rs`), the typed calls
//!   (`pool/calls.rs`).
//! - [`chunks`]: [`ChunkStore`], an in-memory, single-flight chunk cache: a chunk wanted
//!   by several readers (or by a reader and the prefetcher) is fetched once; its memory is
//!   budgeted and least-recently-used chunks are evicted.
//! - [`prefetch`]: [`Prefetcher`], the per-reader read-ahead policy: a window that doubles
//!   while the reader stays sequential, and nothing extra for random readers.
//! - [`s3`]: an S3-compatible bucket as a source, answering the pool's requests with
//!   HTTP requests to the store's gateways ([`s3::S3Source`]).
//! - [`digest`]: whole-file digests a source vouches for (BLAKE3, or an object's S3
//!   checksum or ETag) and their computation over a local copy.
//! - [`tls`]: TLS options ([`TlsClient`]) and the explanation of TLS failures.
//! - [`error`]: [`ClientError`], everything that can go wrong talking to a server.
//!
//! Nothing here knows about FUSE: the mount and the (later) mirror both build on it.

pub mod chunks;
pub mod codec;
pub mod digest;
pub mod error;
pub mod ids;
pub mod pool;
pub mod prefetch;
mod runs;
pub mod s3;
pub mod tls;

pub use chunks::{ChunkBacking, ChunkStats, ChunkStore, FileKey};
pub use codec::CompressionChoice;
pub use digest::{Digest, DigestKind, Digester, RemoteDigest};
pub use error::{ChangedRead, ClientError};
pub use pool::{
    Chunk, Client, ClientConfig, CompressionStatus, Listed, SchedulerStats, SessionInfo, SmallFile,
};
pub use prefetch::{PrefetchConfig, Prefetcher};

pub use runs::{is_small_file, small_file_runs, ListedEntry, Run, RUN_BYTES, SMALL_FILE_MAX};
pub use tls::{TlsClient, TlsConfigError, TlsError, TlsOptions, Token};
