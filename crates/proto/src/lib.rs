//! ferry-proto: the ferry wire format, with no sockets, no clock and no async runtime.
//!
//! A connection starts with an 8-byte [`preamble`] in each direction (magic, version and
//! the transport about to be used: plain TCP or TLS). After it, and after TLS if chosen,
//! everything is a length-prefixed [`frame`]: `u32 length | u8 kind | u32 request id | body`.
//! The first frames are the handshake ([`Hello`] → [`Welcome`], then [`AuthProof`] →
//! [`AuthOk`] when the server asks for a token), which both sides run through the state
//! machines in [`handshake`]; then the client sends [`Request`]s and the
//! server answers each with a [`Response`] carrying the same request id, in any order.
//!
//! Layout:
//! - [`frame`]: frame header, incremental decoding that tells "need more bytes" from "invalid".
//! - [`message`]: handshake messages, requests, responses, their encode/decode.
//! - [`handshake`]: the handshake as two sans-IO state machines, client and server.
//! - [`preamble`]: the 8 bytes each side sends first, before TLS and frames.
//! - [`auth`]: token proofs and certificate fingerprints.
//! - [`attr`]: file attributes and file versions as they travel.
//! - [`extents`]: questions about a data map (does a range hold data, SEEK_DATA, SEEK_HOLE).
//! - [`payload`]: read payloads: raw, lz4 or zstd, and the xxh3-64 checksum of the decoded
//!   bytes.
//! - [`name`]: which names and paths a peer may send.
//! - [`status`]: protocol status codes (never raw errno numbers).
//! - [`metrics`]: the Prometheus text page both binaries serve (no I/O either).
//!
//! `docs/PROTOCOL.md` at the repository root describes the same format byte by byte.

pub mod attr;
pub mod auth;
pub mod class;
mod codec;
pub mod extents;
pub mod frame;
pub mod handshake;
pub mod message;
pub mod metrics;
pub mod name;
pub mod payload;
pub mod preamble;
pub mod status;

pub use attr::{Attr, FileKind, Timestamp, Version};
pub use class::Class;
pub use codec::DecodeError;
pub use frame::{Frame, FrameCheck, FrameError, FRAME_HEADER_LEN};
pub use handshake::{ClientHandshake, HandshakeError, ServerHandshake};
pub use message::{
    AuthMethod, AuthOk, AuthProof, DataEntry, DataMap, DataPage, DirEntry, DirPage, EntryXattrs,
    FileData, FileHash, Handshake, Hello, Id, IdName, LinkTime, ReadData, Request, Response,
    ServerLoad, StatFs, TreeDir, TreePage, Welcome, MAX_DATA_EXTENTS, MAX_DIR_XATTR_BYTES,
    MAX_ID_NAMES, MAX_REQUEST_FRAME,
};
pub use payload::{Compression, Encoding, PayloadError, ZSTD_MAX_LEVEL, ZSTD_MIN_LEVEL};
pub use status::Status;

/// Protocol version spoken by this crate. Bumped on incompatible changes.
pub const PROTOCOL_VERSION: u16 = 2;

/// The oldest protocol version this crate speaks: version 1's file versions lack the ctime,
/// so a peer speaking it could not tell an in-place rewrite that restored the mtime (both
/// sides refuse it with a message saying which to upgrade).
pub const MIN_PROTOCOL_VERSION: u16 = 2;

/// Feature bits exchanged in [`Hello`] and [`Welcome`]; the session uses the intersection.
pub mod features {
    /// Read payloads may be lz4-compressed (block format, see [`crate::payload`]).
    pub const LZ4: u64 = 1 << 0;
    /// The server answers [`crate::Request::Hash`] (whole-file BLAKE3).
    pub const HASH: u64 = 1 << 1;
    /// A read that returns a whole file carries the file's BLAKE3
    /// ([`crate::ReadData::file_hash`]).
    pub const READ_HASH: u64 = 1 << 2;
    /// Reads carry their [`crate::Class`] (bits 1–2 of the Read flags byte) and the server
    /// writes a connection's responses most urgent first.
    pub const PRIORITY: u64 = 1 << 3;
    /// The server answers [`crate::Request::ReadDirData`]: listings with the contents of
    /// their small files.
    pub const DIR_DATA: u64 = 1 << 4;
    /// The server answers [`crate::Request::IdNames`]: names of user and group ids.
    pub const ID_NAMES: u64 = 1 << 5;
    /// The server answers [`crate::Request::DataMap`]: where a file holds data.
    pub const DATA_MAP: u64 = 1 << 6;
    /// The server answers [`crate::Request::DirXattrs`]: extended attributes (and POSIX
    /// ACLs) of a directory's entries.
    pub const XATTRS: u64 = 1 << 7;
    /// The server answers [`crate::Request::HashSparse`]: a file's hash computed without
    /// reading its holes.
    pub const HASH_SPARSE: u64 = 1 << 8;
    /// Read payloads may be zstd frames: Read and ReadDirData requests may ask for a zstd
    /// level (bit 3 of their flags byte, then the level), and the Welcome states the highest
    /// level the server compresses at.
    pub const ZSTD: u64 = 1 << 9;
    /// The server answers [`crate::Request::DirXattrsPage`]: a directory's extended
    /// attributes in pages, however many its entries have.
    pub const XATTRS_PAGED: u64 = 1 << 10;
    /// Read responses, and the contents of files in ReadDirData pages, are bound to the
    /// request they answer: their checksum is XORed with [`crate::ReadData::binding`]
    /// ([`crate::FileData::binding`]), so a request or response header garbled on the way
    /// (a request id that names another request) fails the checksum.
    pub const BOUND: u64 = 1 << 11;
    /// [`crate::Response::Load`] also says how long this client's connections had bytes
    /// to send and for how much of it the network, not the server, set their pace
    /// ([`crate::ServerLoad::link`]).
    pub const LINK_LIMITS: u64 = 1 << 12;
    /// The server answers [`crate::Request::ReadTree`]: the listings of a directory and
    /// the directories under it in one page.
    pub const TREE: u64 = 1 << 13;
    /// Every feature this crate knows.
    pub const ALL: u64 = LZ4
        | HASH
        | READ_HASH
        | PRIORITY
        | DIR_DATA
        | ID_NAMES
        | DATA_MAP
        | XATTRS
        | HASH_SPARSE
        | ZSTD
        | XATTRS_PAGED
        | BOUND
        | LINK_LIMITS
        | TREE;
}

/// Default chunk size: the unit of reads, caching and checksums (1 MiB).
pub const DEFAULT_CHUNK_SIZE: u32 = 1 << 20;
/// Largest chunk size a peer may negotiate (16 MiB).
pub const MAX_CHUNK_SIZE: u32 = 16 << 20;
/// Smallest chunk size a peer may negotiate (4 KiB).
pub const MIN_CHUNK_SIZE: u32 = 4 << 10;
/// Largest frame accepted before the handshake has negotiated one (64 KiB).
pub const HANDSHAKE_MAX_FRAME: u32 = 64 << 10;
/// Room for a read response's header fields on top of its data, when sizing the frame limit.
pub const FRAME_OVERHEAD: u32 = 4 << 10;
