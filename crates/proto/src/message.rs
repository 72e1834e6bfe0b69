//! Messages: the handshake, requests and responses, with their encodings.
//!
//! Kinds (the frame's kind byte):
//!
//! | kind | message | direction |
//! |------|---------|-----------|
//! | 0x01 | [`Hello`] | client → server |
//! | 0x02 | [`Welcome`] | server → client |
//! | 0x03 | [`AuthProof`] | client → server |
//! | 0x04 | [`AuthOk`] | server → client |
//! | 0x10..=0x17 | [`Request`] | client → server |
//! | 0x90..=0x97 | [`Response`] (success) | server → client |
//! | 0xff | [`Response::Error`] (also a failed handshake) | server → client |
//!
//! Request kinds stay below 0x7f so that `kind | 0x80` never collides with 0xff. Request
//! id 0 belongs to the handshake; requests use ids from 1.

use bytes::{BufMut, Bytes, BytesMut};

use crate::attr::Attr;
use crate::class::Class;
use crate::codec::{
    expect_end, get_array, get_bytes16, get_string16, get_u16, get_u32, get_u64, get_u8,
    put_bytes16, DecodeError,
};
use crate::features;
use crate::frame::Frame;
use crate::payload::{Compression, Encoding, ZSTD_MIN_LEVEL};
use crate::status::Status;
use crate::Version;

const K_HELLO: u8 = 0x01;
const K_WELCOME: u8 = 0x02;
const K_AUTH_PROOF: u8 = 0x03;
const K_AUTH_OK: u8 = 0x04;
const K_PING: u8 = 0x10;
const K_STAT: u8 = 0x11;
const K_READDIR: u8 = 0x12;
const K_READ: u8 = 0x13;
const K_READLINK: u8 = 0x14;
const K_STATFS: u8 = 0x15;
const K_HASH: u8 = 0x16;
const K_READDIR_DATA: u8 = 0x17;
const K_ID_NAMES: u8 = 0x18;
const K_DATA_MAP: u8 = 0x19;
const K_DIR_XATTRS: u8 = 0x1a;
const K_HASH_SPARSE: u8 = 0x1b;
const K_LOAD: u8 = 0x1c;
const K_DIR_XATTRS_PAGE: u8 = 0x1d;
const K_READ_TREE: u8 = 0x1e;
/// A success response's kind is its request's kind with this bit set.
const RESPONSE_BIT: u8 = 0x80;
// Success response kinds, named so that `match` sees them as constants: a duplicate arm is
// then an unreachable-pattern warning, which guards comparing against `kind | RESPONSE_BIT`
// would hide.
const K_PONG: u8 = K_PING | RESPONSE_BIT;
const K_ATTR: u8 = K_STAT | RESPONSE_BIT;
const K_DIR_PAGE: u8 = K_READDIR | RESPONSE_BIT;
const K_READ_DATA: u8 = K_READ | RESPONSE_BIT;
const K_LINK: u8 = K_READLINK | RESPONSE_BIT;
const K_STATFS_DATA: u8 = K_STATFS | RESPONSE_BIT;
const K_HASH_DATA: u8 = K_HASH | RESPONSE_BIT;
const K_DIR_DATA: u8 = K_READDIR_DATA | RESPONSE_BIT;
const K_ID_NAMES_DATA: u8 = K_ID_NAMES | RESPONSE_BIT;
const K_DATA_MAP_DATA: u8 = K_DATA_MAP | RESPONSE_BIT;
const K_DIR_XATTRS_DATA: u8 = K_DIR_XATTRS | RESPONSE_BIT;
const K_HASH_SPARSE_DATA: u8 = K_HASH_SPARSE | RESPONSE_BIT;
const K_LOAD_DATA: u8 = K_LOAD | RESPONSE_BIT;
const K_DIR_XATTRS_PAGE_DATA: u8 = K_DIR_XATTRS_PAGE | RESPONSE_BIT;
const K_TREE_PAGE: u8 = K_READ_TREE | RESPONSE_BIT;
/// In a Read response's encoding byte: the whole file's BLAKE3 follows the checksum.
const FILE_HASH_FLAG: u8 = 0x80;
const K_ERROR: u8 = 0xff;

/// The client's opening message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Highest protocol version the client speaks.
    pub version: u16,
    /// Feature bits the client supports ([`crate::features`]).
    pub features: u64,
    /// Chunk size the client would like (the server may choose smaller).
    pub chunk_size: u32,
    /// Free-form client identification for the server's log (e.g. "ferry 0.1.0 mount").
    pub client_name: String,
}

/// How the client must prove itself after [`Welcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMethod {
    /// No authentication; requests may follow at once.
    None,
    /// Pre-shared token, challenge-response: the client answers with [`AuthProof`]
    /// computed over this fresh server challenge, so a recorded exchange cannot be replayed.
    Token {
        /// 32 random bytes, new for every connection.
        challenge: [u8; 32],
    },
}

/// The server's answer to [`Hello`]: the session's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    /// Protocol version for this session (≤ the client's).
    pub version: u16,
    /// Features in effect: the intersection of both sides'.
    pub features: u64,
    /// Chunk size in effect: the largest read a request may ask for.
    pub chunk_size: u32,
    /// Largest frame either side may send from now on (length field value).
    pub max_frame: u32,
    /// Requests the client may have outstanding on this connection; more are refused
    /// with [`Status::Busy`] or make the server stop reading until some complete.
    pub max_inflight: u32,
    /// Random id of this server process: changes when the server restarts, so clients
    /// know to re-check the file versions they cache.
    pub instance_id: [u8; 16],
    /// What the client must do before sending requests.
    pub auth: AuthMethod,
    /// The highest zstd level the server compresses at (it compresses at this level when
    /// asked for more); present exactly when the session has the ZSTD feature.
    pub zstd_max_level: Option<i8>,
}

/// The client's answer to a token challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthProof {
    /// 32 random bytes chosen by the client.
    pub client_nonce: [u8; 32],
    /// Keyed hash of the challenge and the client nonce under the shared token.
    pub proof: [u8; 32],
}

/// The server accepted the proof, and proves in turn that it knows the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthOk {
    /// Keyed hash of the client nonce and the challenge under the shared token.
    pub server_proof: [u8; 32],
}

/// Handshake messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handshake {
    /// See [`Hello`].
    Hello(Hello),
    /// See [`Welcome`].
    Welcome(Welcome),
    /// See [`AuthProof`].
    AuthProof(AuthProof),
    /// See [`AuthOk`].
    AuthOk(AuthOk),
    /// The handshake failed; the connection closes after this.
    Failed {
        /// Why, as a status.
        status: Status,
        /// Human-readable detail for the client's one-line error.
        message: String,
    },
}

/// A request; every path is relative to the export root and validated by the receiver
/// (see [`crate::name`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Liveness and round-trip measurement. Answer: [`Response::Pong`].
    Ping,
    /// Attributes of the object at `path`, not following a final symlink. Answer: [`Response::Attr`].
    Stat {
        /// Relative path; empty for the root.
        path: Bytes,
    },
    /// One page of a directory listing with attributes. Answer: [`Response::DirPage`].
    ReadDir {
        /// The directory.
        path: Bytes,
        /// 0 for the first page, else the `cookie` of the last entry received.
        cookie: u64,
        /// Most entries wanted in this page (the server may send fewer).
        max_entries: u32,
    },
    /// Bytes of a regular file. Answer: [`Response::Read`].
    Read {
        /// The file.
        path: Bytes,
        /// Byte offset.
        offset: u64,
        /// Bytes wanted, at most the negotiated chunk size; fewer come back at end of file.
        len: u32,
        /// How the payload may be compressed (lz4 requires the LZ4 feature, zstd the ZSTD
        /// feature).
        compression: Compression,
        /// How urgent the read is; anything but [`Class::Demand`] requires the PRIORITY
        /// feature.
        class: Class,
    },
    /// Target of a symlink. Answer: [`Response::Link`].
    ReadLink {
        /// The link.
        path: Bytes,
    },
    /// File system statistics of the export. Answer: [`Response::StatFs`].
    StatFs,
    /// BLAKE3 of a whole regular file, to verify a complete copy (requires the HASH
    /// feature). Answer: [`Response::Hash`].
    Hash {
        /// The file.
        path: Bytes,
    },
    /// The sparse hash of a whole regular file (requires the HASH_SPARSE feature): BLAKE3
    /// of its contents in a form that does not depend on its holes, computed without
    /// reading them (defined in PROTOCOL.md §7.14; `ferry_util::sparse::hash_sparse`).
    /// Answer: [`Response::HashSparse`].
    HashSparse {
        /// The file.
        path: Bytes,
    },
    /// One page of a directory listing, with the whole contents of its small regular files
    /// (requires the DIR_DATA feature): a tree of small files moves at one round trip per
    /// page instead of one per file. Answer: [`Response::DirData`].
    ReadDirData {
        /// The directory.
        path: Bytes,
        /// 0 for the first page, else the `cookie` of the last entry received.
        cookie: u64,
        /// Most entries wanted in this page (the server may send fewer).
        max_entries: u32,
        /// Regular files of 1 to this many bytes come with their contents (at most the
        /// chunk size); 0 asks for none.
        max_file: u32,
        /// How contents may be compressed (as in [`Request::Read`]).
        compression: Compression,
        /// How urgent the listing is (anything but demand requires PRIORITY).
        class: Class,
    },
    /// The listings of a directory and of the directories under it, breadth first, in one
    /// page of at most `max_entries` entries in all (requires the TREE feature): a walk
    /// learns a tree's shape in a few round trips instead of one per level. Answer:
    /// [`Response::Tree`].
    ReadTree {
        /// The directory.
        path: Bytes,
        /// Most entries wanted in the page, over all its directories (the server may send
        /// fewer).
        max_entries: u32,
    },
    /// The names of user and group ids on the server (requires the ID_NAMES feature), so
    /// a copy can map owners by name as tar and rsync do. At most [`MAX_ID_NAMES`] ids.
    /// Answer: [`Response::IdNames`].
    IdNames {
        /// The ids asked about.
        ids: Vec<Id>,
    },
    /// Where a regular file holds data, from `offset` on (`SEEK_DATA`/`SEEK_HOLE` on the
    /// server; requires the DATA_MAP feature), so the holes of a sparse file never cross the
    /// wire. Answer: [`Response::DataMap`].
    DataMap {
        /// The file.
        path: Bytes,
        /// Where to start.
        offset: u64,
        /// Most extents wanted (the server may send fewer, at most [`MAX_DATA_EXTENTS`]).
        max_extents: u32,
    },
    /// How busy the server's CPUs are (requires the ZSTD feature), so a client can judge
    /// which compression the server can afford. Answer: [`Response::Load`].
    Load,
    /// The extended attributes of a directory and of its entries that have any (requires
    /// the XATTRS feature): one request per directory, so a copy keeps xattrs and POSIX
    /// ACLs without a round trip per file. Answer: [`Response::DirXattrs`].
    DirXattrs {
        /// The directory.
        path: Bytes,
    },
    /// One page of what [`Request::DirXattrs`] answers (requires the XATTRS_PAGED
    /// feature), so a directory whose entries' attributes exceed [`MAX_DIR_XATTR_BYTES`]
    /// (SELinux labels on tens of thousands of files) is copied whole.
    /// Answer: [`Response::DirXattrsPage`].
    DirXattrsPage {
        /// The directory.
        path: Bytes,
        /// 0 for the first page (the directory's own attributes come with it), else the
        /// `next` of the page before.
        cookie: u64,
    },
}

/// The extended attributes of one directory entry ([`Response::DirXattrs`]): the entry's
/// name (empty for the directory itself) and its `(name, value)` pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryXattrs {
    /// The entry's name; empty for the directory itself.
    pub name: Bytes,
    /// Its extended attributes, `(name, value)`.
    pub attrs: Vec<(Bytes, Bytes)>,
}

/// How busy the server's CPUs were lately ([`Response::Load`]), in thousandths of one core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerLoad {
    /// CPUs of the server's machine.
    pub cores: u16,
    /// Idle time of the machine's CPUs (idle and I/O wait), per mille of one core: 2000
    /// is two cores with nothing to do.
    pub idle_permille: u32,
    /// CPU time the server process used, per mille of one core.
    pub process_permille: u32,
    /// The server machine's boot id (Linux `/proc/sys/kernel/random/boot_id`; zeros when
    /// unknown): a client with the same id runs on the same machine, so both ends share
    /// one set of CPUs.
    pub boot_id: [u8; 16],
    /// Only with the [`LINK_LIMITS`](crate::features::LINK_LIMITS) feature: how this
    /// client's connections sent.
    pub link: Option<LinkTime>,
}

/// How a client's connections (its address and Hello name) sent, summed over them: two
/// counters that only grow while the client has a connection open ([`ServerLoad::link`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkTime {
    /// Microseconds the connections were sending: they had bytes acknowledged, or the
    /// server waited for the socket to take more.
    pub sending_micros: u64,
    /// Of those, microseconds the network set the pace: TCP was not application-limited
    /// (its last delivery-rate sample had a full window in flight: the path, not the
    /// server, held it back), or the server waited for the socket to take bytes it had
    /// ready. Over `sending_micros`, near 1 when the link is the limit, near 0 when the
    /// server sent everything as soon as it had it (a walk of small files, a compressor
    /// short of CPU).
    pub limited_micros: u64,
}

/// Most bytes of names and values one [`Response::DirXattrs`] carries.
pub const MAX_DIR_XATTR_BYTES: usize = 1 << 20;

/// Most extents in one [`Response::DataMap`].
pub const MAX_DATA_EXTENTS: usize = 4096;

/// A page of a file's data map ([`Request::DataMap`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataMap {
    /// The file's version, unchanged while it was mapped.
    pub version: Version,
    /// Data extents `(offset, length)`, in order, not overlapping, from the request's offset
    /// on; everything between them (and after the last, up to `next`) is a hole.
    pub extents: Vec<(u64, u64)>,
    /// Where the next page starts; the file's size when the map is complete.
    pub next: u64,
}

/// Most ids one [`Request::IdNames`] may ask about.
pub const MAX_ID_NAMES: usize = 1024;

/// The largest length field of a legal request frame (after the handshake): an IdNames of
/// [`MAX_ID_NAMES`] ids, or a ReadDirData of the longest path (with a zstd level). A server need never buffer
/// more of a request than this, whatever the negotiated frame limit (which bounds
/// responses).
pub const MAX_REQUEST_FRAME: u32 = {
    let ids = 5 + 2 + 5 * MAX_ID_NAMES;
    let path = 5 + 20 + crate::name::MAX_PATH_LEN;
    (if ids > path { ids } else { path }) as u32
};

/// A user or a group id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Id {
    /// A user id.
    User(u32),
    /// A group id.
    Group(u32),
}

impl Id {
    fn encode(&self, b: &mut BytesMut) {
        let (kind, id) = match self {
            Id::User(u) => (0u8, *u),
            Id::Group(g) => (1u8, *g),
        };
        b.put_u8(kind);
        b.put_u32(id);
    }

    fn decode(b: &mut Bytes) -> Result<Id, DecodeError> {
        let kind = get_u8(b, "id kind")?;
        let id = get_u32(b, "id")?;
        match kind {
            0 => Ok(Id::User(id)),
            1 => Ok(Id::Group(id)),
            k => Err(DecodeError::InvalidValue {
                field: "id kind",
                value: k.into(),
            }),
        }
    }
}

/// The name of one id on the server: empty when it has none there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdName {
    /// The id.
    pub id: Id,
    /// Its name (at most 255 bytes), empty when the server knows none.
    pub name: Bytes,
}

/// The BLAKE3 of a whole file and the version it was computed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHash {
    /// The file's version while it was hashed (unchanged from start to end).
    pub version: Version,
    /// BLAKE3-256 of all its bytes.
    pub blake3: [u8; 32],
}

/// One directory entry with its attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Entry name (validated as a name by the receiver).
    pub name: Bytes,
    /// Opaque position after this entry, to resume the listing.
    pub cookie: u64,
    /// Attributes (`lstat`).
    pub attr: Attr,
}

/// A page of directory entries. `.` and `..` are never included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirPage {
    /// Entries in this page.
    pub entries: Vec<DirEntry>,
    /// True when the listing has no entries after these.
    pub eof: bool,
}

/// One directory's listing in a [`TreePage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeDir {
    /// Its path under the directory asked for: empty for that directory, else names
    /// joined by `/`, each a subdirectory listed earlier in the page.
    pub rel: Bytes,
    /// Its entries, in listing order.
    pub entries: Vec<DirEntry>,
    /// True when the listing has no entries after these (else it goes on from the last
    /// entry's cookie, as a [`Request::ReadDir`] would).
    pub eof: bool,
}

/// The answer to a [`Request::ReadTree`]: the directory asked for first, then
/// subdirectories of those in the page, breadth first. A subdirectory not in the page is
/// the client's to ask for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreePage {
    /// The listings.
    pub dirs: Vec<TreeDir>,
}

/// The whole contents of a small file, as they travel in a [`DataPage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileData {
    /// How `data` is encoded.
    pub encoding: Encoding,
    /// Length after decoding: the file's size in its entry's attributes.
    pub decoded_len: u32,
    /// xxh3-64 of the decoded bytes.
    pub checksum: u64,
    /// BLAKE3-256 of the decoded bytes (the whole file).
    pub blake3: [u8; 32],
    /// Encoded bytes.
    pub data: Bytes,
}

/// One entry of a [`DataPage`]: the entry, and the file's contents when they came along.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataEntry {
    /// Name, cookie and attributes, as in a [`DirPage`]. With `data`, the attributes are
    /// those of the file the bytes were read from, unchanged while it was read.
    pub entry: DirEntry,
    /// The whole file, for regular files of 1 to `max_file` bytes the server chose to send.
    pub data: Option<FileData>,
}

/// A page of directory entries with small files' contents. `.` and `..` are never included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPage {
    /// Entries in this page.
    pub entries: Vec<DataEntry>,
    /// True when the listing has no entries after these.
    pub eof: bool,
}

/// Data read from a file, as it travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadData {
    /// The version of the file the bytes were read from.
    pub version: Version,
    /// How `data` is encoded.
    pub encoding: Encoding,
    /// Length after decoding (may be less than asked at end of file).
    pub decoded_len: u32,
    /// xxh3-64 of the decoded bytes.
    pub checksum: u64,
    /// BLAKE3 of the whole file, when these bytes are the whole file (read from offset 0 to
    /// its end) and the session has the READ_HASH feature: a small file is then verified end
    /// to end without a Hash request.
    pub file_hash: Option<[u8; 32]>,
    /// Encoded bytes.
    pub data: Bytes,
}

impl Response {
    /// With [`features::BOUND`]: XORs each checksum this response carries with its binding
    /// to `request`, sent under `request_id` ([`ReadData::binding`], [`FileData::binding`]).
    /// The server applies it before sending and the client again on receipt, which takes it
    /// out (XOR undoes itself): what the client then checks is the plain checksum, and a
    /// response that does not answer that request fails it. Other responses carry no
    /// checksum and are left as they are.
    pub fn bind(&mut self, request_id: u32, request: &Request) {
        match (request, self) {
            (
                Request::Read {
                    path, offset, len, ..
                },
                Response::Read(r),
            ) => r.checksum ^= r.binding(request_id, path, *offset, *len),
            (Request::ReadDirData { path, cookie, .. }, Response::DirData(p)) => {
                for e in &mut p.entries {
                    if let Some(d) = &mut e.data {
                        d.checksum ^= d.binding(request_id, path, *cookie, &e.entry);
                    }
                }
            }
            _ => {}
        }
    }
}

impl ReadData {
    /// What binds these bytes to the request they answer (with [`features::BOUND`]): the
    /// server sends `checksum` XORed with this, the client XORs it out again with the
    /// request it sent (id, path, offset, length). A bit flipped on the way in the request
    /// or in any field of the response (the request id included) then fails the checksum
    /// like one flipped in the data, instead of giving a reader another file's or another
    /// offset's bytes. XXH3-64 of: id u32 | offset u64 | len u32 | path length u16 | path |
    /// version | encoding byte as sent | decoded_len u32 | file hash (when sent).
    pub fn binding(&self, request_id: u32, path: &[u8], offset: u64, len: u32) -> u64 {
        let mut b = BytesMut::with_capacity(64 + path.len() + Version::LEN);
        b.put_u32(request_id);
        b.put_u64(offset);
        b.put_u32(len);
        put_bytes16(&mut b, path);
        self.version.encode(&mut b);
        let flag = if self.file_hash.is_some() {
            FILE_HASH_FLAG
        } else {
            0
        };
        b.put_u8(self.encoding.to_u8() | flag);
        b.put_u32(self.decoded_len);
        if let Some(h) = &self.file_hash {
            b.put_slice(h);
        }
        xxhash_rust::xxh3::xxh3_64(&b)
    }
}

impl FileData {
    /// As [`ReadData::binding`], for a file's contents in a [`DataPage`] answering a
    /// ReadDirData of directory `dir` from `cookie`: XXH3-64 of id u32 | cookie u64 | dir
    /// length u16 | dir | name length u16 | name | the entry's attributes | encoding byte |
    /// decoded_len u32 | blake3.
    pub fn binding(&self, request_id: u32, dir: &[u8], cookie: u64, entry: &DirEntry) -> u64 {
        let mut b = BytesMut::with_capacity(128 + dir.len() + entry.name.len());
        b.put_u32(request_id);
        b.put_u64(cookie);
        put_bytes16(&mut b, dir);
        put_bytes16(&mut b, &entry.name);
        entry.attr.encode(&mut b);
        b.put_u8(self.encoding.to_u8());
        b.put_u32(self.decoded_len);
        b.put_slice(&self.blake3);
        xxhash_rust::xxh3::xxh3_64(&b)
    }
}

/// File system statistics, as `statvfs` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatFs {
    /// Total blocks of `frsize` bytes.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks available to unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Preferred block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
    /// Fragment size (unit of `blocks`).
    pub frsize: u32,
}

/// A response to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Answer to [`Request::Ping`].
    Pong,
    /// Answer to [`Request::Stat`].
    Attr(Attr),
    /// Answer to [`Request::ReadDir`].
    DirPage(DirPage),
    /// Answer to [`Request::Read`].
    Read(ReadData),
    /// Answer to [`Request::ReadLink`]: the target, as stored.
    Link(Bytes),
    /// Answer to [`Request::StatFs`].
    StatFs(StatFs),
    /// Answer to [`Request::Hash`].
    Hash(FileHash),
    /// Answer to [`Request::HashSparse`] (the same fields as [`Response::Hash`]).
    HashSparse(FileHash),
    /// Answer to [`Request::IdNames`]: one entry per id asked about, in the same order.
    IdNames(Vec<IdName>),
    /// Answer to [`Request::DataMap`].
    DataMap(DataMap),
    /// Answer to [`Request::DirXattrs`]: the entries (and the directory, with an empty
    /// name) that have extended attributes.
    DirXattrs(Vec<EntryXattrs>),
    /// Answer to [`Request::DirXattrsPage`].
    DirXattrsPage {
        /// As in [`Response::DirXattrs`], at most [`MAX_DIR_XATTR_BYTES`] of names and
        /// values.
        entries: Vec<EntryXattrs>,
        /// The cookie of the next page; 0 when the directory is done.
        next: u64,
    },
    /// Answer to [`Request::ReadDirData`].
    DirData(DataPage),
    /// Answer to [`Request::ReadTree`].
    Tree(TreePage),
    /// Answer to [`Request::Load`].
    Load(ServerLoad),
    /// Any request failed.
    Error {
        /// Why.
        status: Status,
        /// Detail for logs (never needed to act on the error).
        message: String,
    },
}

fn put_frame(dst: &mut BytesMut, kind: u8, request_id: u32, body: &[u8]) {
    Frame::put_header(dst, kind, request_id, body.len());
    dst.put_slice(body);
}

fn get_status(buf: &mut Bytes) -> Result<Status, DecodeError> {
    let v = get_u16(buf, "status")?;
    Status::from_u16(v).ok_or(DecodeError::InvalidValue {
        field: "status",
        value: v.into(),
    })
}

fn decode_error(mut b: Bytes) -> Result<(Status, String), DecodeError> {
    let status = get_status(&mut b)?;
    let message = get_string16(&mut b, "error message")?;
    expect_end(&b)?;
    Ok((status, message))
}

fn encode_error(dst: &mut BytesMut, request_id: u32, status: Status, message: &str) {
    let mut body = BytesMut::with_capacity(4 + message.len());
    body.put_u16(status as u16);
    put_bytes16(&mut body, message.as_bytes());
    put_frame(dst, K_ERROR, request_id, &body);
}

impl Handshake {
    /// Appends this message as a frame (request id 0) to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        let mut b = BytesMut::new();
        let kind = match self {
            Handshake::Hello(h) => {
                b.put_u16(h.version);
                b.put_u64(h.features);
                b.put_u32(h.chunk_size);
                put_bytes16(&mut b, h.client_name.as_bytes());
                K_HELLO
            }
            Handshake::Welcome(w) => {
                b.put_u16(w.version);
                b.put_u64(w.features);
                b.put_u32(w.chunk_size);
                b.put_u32(w.max_frame);
                b.put_u32(w.max_inflight);
                b.put_slice(&w.instance_id);
                match &w.auth {
                    AuthMethod::None => b.put_u8(0),
                    AuthMethod::Token { challenge } => {
                        b.put_u8(1);
                        b.put_slice(challenge);
                    }
                }
                if w.features & features::ZSTD != 0 {
                    b.put_i8(w.zstd_max_level.unwrap_or(ZSTD_MIN_LEVEL));
                }
                K_WELCOME
            }
            Handshake::AuthProof(p) => {
                b.put_slice(&p.client_nonce);
                b.put_slice(&p.proof);
                K_AUTH_PROOF
            }
            Handshake::AuthOk(ok) => {
                b.put_slice(&ok.server_proof);
                K_AUTH_OK
            }
            Handshake::Failed { status, message } => {
                encode_error(dst, 0, *status, message);
                return;
            }
        };
        put_frame(dst, kind, 0, &b);
    }

    /// Decodes a handshake frame.
    pub fn decode(frame: Frame) -> Result<Handshake, DecodeError> {
        let mut b = frame.body;
        let msg = match frame.kind {
            K_HELLO => Handshake::Hello(Hello {
                version: get_u16(&mut b, "hello")?,
                features: get_u64(&mut b, "hello")?,
                chunk_size: get_u32(&mut b, "hello")?,
                client_name: get_string16(&mut b, "client name")?,
            }),
            K_WELCOME => {
                let mut w = Welcome {
                    version: get_u16(&mut b, "welcome")?,
                    features: get_u64(&mut b, "welcome")?,
                    chunk_size: get_u32(&mut b, "welcome")?,
                    max_frame: get_u32(&mut b, "welcome")?,
                    max_inflight: get_u32(&mut b, "welcome")?,
                    instance_id: get_array(&mut b, "instance id")?,
                    auth: match get_u8(&mut b, "auth method")? {
                        0 => AuthMethod::None,
                        1 => AuthMethod::Token {
                            challenge: get_array(&mut b, "challenge")?,
                        },
                        v => {
                            return Err(DecodeError::InvalidValue {
                                field: "auth method",
                                value: v.into(),
                            })
                        }
                    },
                    zstd_max_level: None,
                };
                if w.features & features::ZSTD != 0 {
                    let level = get_u8(&mut b, "zstd max level")? as i8;
                    if !Compression::Zstd(level).is_valid() {
                        return Err(DecodeError::InvalidValue {
                            field: "zstd max level",
                            value: (level as u8).into(),
                        });
                    }
                    w.zstd_max_level = Some(level);
                }
                Handshake::Welcome(w)
            }
            K_AUTH_PROOF => Handshake::AuthProof(AuthProof {
                client_nonce: get_array(&mut b, "auth proof")?,
                proof: get_array(&mut b, "auth proof")?,
            }),
            K_AUTH_OK => Handshake::AuthOk(AuthOk {
                server_proof: get_array(&mut b, "auth ok")?,
            }),
            K_ERROR => {
                let (status, message) = decode_error(b)?;
                if status == Status::Ok {
                    return Err(DecodeError::InvalidValue {
                        field: "error status",
                        value: 0,
                    });
                }
                return Ok(Handshake::Failed { status, message });
            }
            k => return Err(DecodeError::UnknownKind(k)),
        };
        expect_end(&b)?;
        Ok(msg)
    }
}

/// The entries of a [`Response::DirXattrs`] or [`Response::DirXattrsPage`].
fn put_entry_xattrs(b: &mut BytesMut, entries: &[EntryXattrs]) {
    b.put_u32(entries.len() as u32);
    for e in entries {
        put_bytes16(b, &e.name);
        b.put_u16(e.attrs.len() as u16);
        for (n, v) in &e.attrs {
            put_bytes16(b, n);
            b.put_u32(v.len() as u32);
            b.put_slice(v);
        }
    }
}

fn get_entry_xattrs(b: &mut Bytes) -> Result<Vec<EntryXattrs>, DecodeError> {
    let n = get_u32(b, "entry count")? as usize;
    let mut entries = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let name = get_bytes16(b, "entry name")?;
        let k = get_u16(b, "xattr count")? as usize;
        let mut attrs = Vec::with_capacity(k);
        for _ in 0..k {
            let an = get_bytes16(b, "xattr name")?;
            let len = get_u32(b, "xattr value length")? as usize;
            if len > b.len() {
                return Err(DecodeError::Truncated("xattr value"));
            }
            attrs.push((an, b.split_to(len)));
        }
        entries.push(EntryXattrs { name, attrs });
    }
    Ok(entries)
}

impl Request {
    /// The frame kind of this request.
    pub fn kind(&self) -> u8 {
        match self {
            Request::Ping => K_PING,
            Request::Stat { .. } => K_STAT,
            Request::ReadDir { .. } => K_READDIR,
            Request::Read { .. } => K_READ,
            Request::ReadLink { .. } => K_READLINK,
            Request::StatFs => K_STATFS,
            Request::Hash { .. } => K_HASH,
            Request::HashSparse { .. } => K_HASH_SPARSE,
            Request::ReadDirData { .. } => K_READDIR_DATA,
            Request::IdNames { .. } => K_ID_NAMES,
            Request::DataMap { .. } => K_DATA_MAP,
            Request::DirXattrs { .. } => K_DIR_XATTRS,
            Request::DirXattrsPage { .. } => K_DIR_XATTRS_PAGE,
            Request::ReadTree { .. } => K_READ_TREE,
            Request::Load => K_LOAD,
        }
    }

    /// Appends this request as a frame to `dst`.
    pub fn encode(&self, request_id: u32, dst: &mut BytesMut) {
        let mut b = BytesMut::new();
        match self {
            Request::Ping | Request::StatFs | Request::Load => {}
            Request::Stat { path }
            | Request::ReadLink { path }
            | Request::Hash { path }
            | Request::HashSparse { path }
            | Request::DirXattrs { path } => put_bytes16(&mut b, path),
            Request::ReadDir {
                path,
                cookie,
                max_entries,
            } => {
                put_bytes16(&mut b, path);
                b.put_u64(*cookie);
                b.put_u32(*max_entries);
            }
            Request::DirXattrsPage { path, cookie } => {
                put_bytes16(&mut b, path);
                b.put_u64(*cookie);
            }
            Request::ReadTree { path, max_entries } => {
                put_bytes16(&mut b, path);
                b.put_u32(*max_entries);
            }
            Request::Read {
                path,
                offset,
                len,
                compression,
                class,
            } => {
                put_bytes16(&mut b, path);
                b.put_u64(*offset);
                b.put_u32(*len);
                put_read_flags(&mut b, *compression, *class);
            }
            Request::ReadDirData {
                path,
                cookie,
                max_entries,
                max_file,
                compression,
                class,
            } => {
                put_bytes16(&mut b, path);
                b.put_u64(*cookie);
                b.put_u32(*max_entries);
                b.put_u32(*max_file);
                put_read_flags(&mut b, *compression, *class);
            }
            Request::IdNames { ids } => {
                b.put_u16(ids.len() as u16);
                for id in ids {
                    id.encode(&mut b);
                }
            }
            Request::DataMap {
                path,
                offset,
                max_extents,
            } => {
                put_bytes16(&mut b, path);
                b.put_u64(*offset);
                b.put_u32(*max_extents);
            }
        }
        put_frame(dst, self.kind(), request_id, &b);
    }

    /// Decodes a request frame.
    pub fn decode(frame: Frame) -> Result<Request, DecodeError> {
        let mut b = frame.body;
        let req = match frame.kind {
            K_PING => Request::Ping,
            K_LOAD => Request::Load,
            K_STATFS => Request::StatFs,
            K_STAT => Request::Stat {
                path: get_bytes16(&mut b, "path")?,
            },
            K_READLINK => Request::ReadLink {
                path: get_bytes16(&mut b, "path")?,
            },
            K_HASH => Request::Hash {
                path: get_bytes16(&mut b, "path")?,
            },
            K_HASH_SPARSE => Request::HashSparse {
                path: get_bytes16(&mut b, "path")?,
            },
            K_READDIR => Request::ReadDir {
                path: get_bytes16(&mut b, "path")?,
                cookie: get_u64(&mut b, "readdir")?,
                max_entries: get_u32(&mut b, "readdir")?,
            },
            K_READ => {
                let path = get_bytes16(&mut b, "path")?;
                let offset = get_u64(&mut b, "read")?;
                let len = get_u32(&mut b, "read")?;
                let (compression, class) = get_read_flags(&mut b, "read flags")?;
                Request::Read {
                    path,
                    offset,
                    len,
                    compression,
                    class,
                }
            }
            K_READDIR_DATA => {
                let path = get_bytes16(&mut b, "path")?;
                let cookie = get_u64(&mut b, "readdir data")?;
                let max_entries = get_u32(&mut b, "readdir data")?;
                let max_file = get_u32(&mut b, "readdir data")?;
                let (compression, class) = get_read_flags(&mut b, "readdir data flags")?;
                Request::ReadDirData {
                    path,
                    cookie,
                    max_entries,
                    max_file,
                    compression,
                    class,
                }
            }
            K_ID_NAMES => {
                let n = at_most(
                    get_u16(&mut b, "id count")?.into(),
                    MAX_ID_NAMES,
                    "id count",
                )?;
                let ids = (0..n)
                    .map(|_| Id::decode(&mut b))
                    .collect::<Result<_, _>>()?;
                Request::IdNames { ids }
            }
            K_DIR_XATTRS => Request::DirXattrs {
                path: get_bytes16(&mut b, "path")?,
            },
            K_DIR_XATTRS_PAGE => Request::DirXattrsPage {
                path: get_bytes16(&mut b, "path")?,
                cookie: get_u64(&mut b, "xattrs page")?,
            },
            K_READ_TREE => Request::ReadTree {
                path: get_bytes16(&mut b, "path")?,
                max_entries: get_u32(&mut b, "read tree")?,
            },
            K_DATA_MAP => Request::DataMap {
                path: get_bytes16(&mut b, "path")?,
                offset: get_u64(&mut b, "data map")?,
                max_extents: get_u32(&mut b, "data map")?,
            },
            k => return Err(DecodeError::UnknownKind(k)),
        };
        expect_end(&b)?;
        Ok(req)
    }
}

/// `n` when it is at most `max`, else an invalid `field`.
fn at_most(n: usize, max: usize, field: &'static str) -> Result<usize, DecodeError> {
    if n > max {
        return Err(DecodeError::InvalidValue {
            field,
            value: n as u64,
        });
    }
    Ok(n)
}

/// Writes the flags byte of Read and ReadDirData and, for zstd, its level (see
/// [`get_read_flags`]).
fn put_read_flags(b: &mut BytesMut, compression: Compression, class: Class) {
    let codec = match compression {
        Compression::None => 0,
        Compression::Lz4 => 1,
        Compression::Zstd(_) => 1 << 3,
    };
    b.put_u8(codec | class.to_bits() << 1);
    if let Compression::Zstd(level) = compression {
        b.put_i8(level);
    }
}

/// The flags byte of Read and ReadDirData: bit 0 lz4 wanted, bits 1-2 the class, bit 3 zstd
/// wanted (then a signed level byte follows), the rest zero. Bits 0 and 3 are never both
/// set.
fn get_read_flags(b: &mut Bytes, field: &'static str) -> Result<(Compression, Class), DecodeError> {
    let flags = get_u8(b, field)?;
    let class = Class::from_bits(flags >> 1 & 0b11);
    let (true, Some(class)) = (flags & !0b1111 == 0 && flags & 0b1001 != 0b1001, class) else {
        return Err(DecodeError::InvalidValue {
            field,
            value: flags.into(),
        });
    };
    let compression = if flags & 0b1000 != 0 {
        let level = get_u8(b, "zstd level")? as i8;
        let c = Compression::Zstd(level);
        if !c.is_valid() {
            return Err(DecodeError::InvalidValue {
                field: "zstd level",
                value: (level as u8).into(),
            });
        }
        c
    } else if flags & 1 != 0 {
        Compression::Lz4
    } else {
        Compression::None
    };
    Ok((compression, class))
}

fn get_eof(b: &mut Bytes, field: &'static str) -> Result<bool, DecodeError> {
    match get_u8(b, field)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(DecodeError::InvalidValue {
            field,
            value: v.into(),
        }),
    }
}

fn put_dir_entry(b: &mut BytesMut, e: &DirEntry) {
    put_bytes16(b, &e.name);
    b.put_u64(e.cookie);
    e.attr.encode(b);
}

fn get_dir_entry(b: &mut Bytes) -> Result<DirEntry, DecodeError> {
    Ok(DirEntry {
        name: get_bytes16(b, "entry name")?,
        cookie: get_u64(b, "entry cookie")?,
        attr: Attr::decode(b)?,
    })
}

/// Smallest possible encoded directory entry (name length 0 + cookie + attr), used to
/// bound allocations by the bytes actually present.
const MIN_DIRENT_LEN: usize = 2 + 8 + Attr::LEN;

impl Response {
    /// The frame kind of this response.
    pub fn kind(&self) -> u8 {
        match self {
            Response::Pong => K_PONG,
            Response::Attr(_) => K_ATTR,
            Response::DirPage(_) => K_DIR_PAGE,
            Response::Read(_) => K_READ_DATA,
            Response::Link(_) => K_LINK,
            Response::StatFs(_) => K_STATFS_DATA,
            Response::Hash(_) => K_HASH_DATA,
            Response::HashSparse(_) => K_HASH_SPARSE_DATA,
            Response::IdNames(_) => K_ID_NAMES_DATA,
            Response::DataMap(_) => K_DATA_MAP_DATA,
            Response::DirXattrs(_) => K_DIR_XATTRS_DATA,
            Response::DirXattrsPage { .. } => K_DIR_XATTRS_PAGE_DATA,
            Response::Load(_) => K_LOAD_DATA,
            Response::DirData(_) => K_DIR_DATA,
            Response::Tree(_) => K_TREE_PAGE,
            Response::Error { .. } => K_ERROR,
        }
    }

    /// Whether this is the right kind of answer to `request` (an error always is).
    pub fn answers(&self, request: &Request) -> bool {
        matches!(self, Response::Error { .. }) || self.kind() == request.kind() | RESPONSE_BIT
    }

    /// Appends the frame header and all fields to `head`, and returns the trailing data
    /// payload (read data) to be sent right after it, so large payloads are never copied
    /// into the header buffer.
    pub fn encode(&self, request_id: u32, head: &mut BytesMut) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            Response::Pong => {}
            Response::Load(l) => {
                b.put_u16(l.cores);
                b.put_u32(l.idle_permille);
                b.put_u32(l.process_permille);
                b.put_slice(&l.boot_id);
                if let Some(t) = l.link {
                    b.put_u64(t.sending_micros);
                    b.put_u64(t.limited_micros);
                }
            }
            Response::Attr(a) => a.encode(&mut b),
            Response::DirPage(p) => {
                b.put_u8(u8::from(p.eof));
                b.put_u32(p.entries.len() as u32);
                for e in &p.entries {
                    put_dir_entry(&mut b, e);
                }
            }
            Response::Tree(t) => {
                b.put_u32(t.dirs.len() as u32);
                for d in &t.dirs {
                    put_bytes16(&mut b, &d.rel);
                    b.put_u8(u8::from(d.eof));
                    b.put_u32(d.entries.len() as u32);
                    for e in &d.entries {
                        put_dir_entry(&mut b, e);
                    }
                }
            }
            Response::DirData(p) => {
                b.put_u8(u8::from(p.eof));
                b.put_u32(p.entries.len() as u32);
                for e in &p.entries {
                    put_dir_entry(&mut b, &e.entry);
                    match &e.data {
                        None => b.put_u8(0),
                        Some(d) => {
                            b.put_u8(1);
                            b.put_u8(d.encoding.to_u8());
                            b.put_u32(d.decoded_len);
                            b.put_u64(d.checksum);
                            b.put_slice(&d.blake3);
                            b.put_u32(d.data.len() as u32);
                            b.put_slice(&d.data);
                        }
                    }
                }
            }
            Response::Read(r) => {
                r.version.encode(&mut b);
                let flag = if r.file_hash.is_some() {
                    FILE_HASH_FLAG
                } else {
                    0
                };
                b.put_u8(r.encoding.to_u8() | flag);
                b.put_u32(r.decoded_len);
                b.put_u64(r.checksum);
                if let Some(h) = &r.file_hash {
                    b.put_slice(h);
                }
                Frame::put_header(head, self.kind(), request_id, b.len() + r.data.len());
                head.put_slice(&b);
                return r.data.clone();
            }
            Response::Link(t) => put_bytes16(&mut b, t),
            Response::StatFs(s) => {
                for v in [s.blocks, s.bfree, s.bavail, s.files, s.ffree] {
                    b.put_u64(v);
                }
                for v in [s.bsize, s.namelen, s.frsize] {
                    b.put_u32(v);
                }
            }
            Response::Hash(h) | Response::HashSparse(h) => {
                h.version.encode(&mut b);
                b.put_slice(&h.blake3);
            }
            Response::IdNames(names) => {
                b.put_u16(names.len() as u16);
                for n in names {
                    n.id.encode(&mut b);
                    put_bytes16(&mut b, &n.name);
                }
            }
            Response::DirXattrs(entries) => put_entry_xattrs(&mut b, entries),
            Response::DirXattrsPage { entries, next } => {
                b.put_u64(*next);
                put_entry_xattrs(&mut b, entries);
            }
            Response::DataMap(m) => {
                m.version.encode(&mut b);
                b.put_u64(m.next);
                b.put_u32(m.extents.len() as u32);
                for (o, l) in &m.extents {
                    b.put_u64(*o);
                    b.put_u64(*l);
                }
            }
            Response::Error { status, message } => {
                encode_error(head, request_id, *status, message);
                return Bytes::new();
            }
        }
        put_frame(head, self.kind(), request_id, &b);
        Bytes::new()
    }

    /// Decodes a response frame. Read data is a zero-copy slice of the frame.
    pub fn decode(frame: Frame) -> Result<Response, DecodeError> {
        let mut b = frame.body;
        let resp = match frame.kind {
            K_PONG => Response::Pong,
            K_LOAD_DATA => Response::Load(ServerLoad {
                cores: get_u16(&mut b, "load")?,
                idle_permille: get_u32(&mut b, "load")?,
                process_permille: get_u32(&mut b, "load")?,
                boot_id: get_array(&mut b, "boot id")?,
                // Present exactly when the session has LINK_LIMITS (the server sends it then).
                link: if b.is_empty() {
                    None
                } else {
                    Some(LinkTime {
                        sending_micros: get_u64(&mut b, "link time")?,
                        limited_micros: get_u64(&mut b, "link time")?,
                    })
                },
            }),
            K_ATTR => Response::Attr(Attr::decode(&mut b)?),
            K_DIR_PAGE => {
                let eof = get_eof(&mut b, "dir page eof")?;
                let n = get_u32(&mut b, "dir page")? as usize;
                let mut entries = Vec::with_capacity(n.min(b.len() / MIN_DIRENT_LEN));
                for _ in 0..n {
                    entries.push(get_dir_entry(&mut b)?);
                }
                Response::DirPage(DirPage { entries, eof })
            }
            K_TREE_PAGE => {
                let n = get_u32(&mut b, "tree dirs")? as usize;
                // A directory takes at least its path length, eof and entry count.
                let mut dirs = Vec::with_capacity(n.min(b.len() / 7));
                for _ in 0..n {
                    let rel = get_bytes16(&mut b, "tree dir path")?;
                    let eof = get_eof(&mut b, "tree dir eof")?;
                    let m = get_u32(&mut b, "tree dir")? as usize;
                    let mut entries = Vec::with_capacity(m.min(b.len() / MIN_DIRENT_LEN));
                    for _ in 0..m {
                        entries.push(get_dir_entry(&mut b)?);
                    }
                    dirs.push(TreeDir { rel, entries, eof });
                }
                Response::Tree(TreePage { dirs })
            }
            K_DIR_DATA => {
                let eof = get_eof(&mut b, "dir data eof")?;
                let n = get_u32(&mut b, "dir data")? as usize;
                let mut entries = Vec::with_capacity(n.min(b.len() / (MIN_DIRENT_LEN + 1)));
                for _ in 0..n {
                    let entry = get_dir_entry(&mut b)?;
                    let data = match get_u8(&mut b, "entry data flag")? {
                        0 => None,
                        1 => {
                            let enc = get_u8(&mut b, "encoding")?;
                            let encoding =
                                Encoding::from_u8(enc).ok_or(DecodeError::InvalidValue {
                                    field: "encoding",
                                    value: enc.into(),
                                })?;
                            let decoded_len = get_u32(&mut b, "entry data")?;
                            let checksum = get_u64(&mut b, "entry data")?;
                            let blake3 = get_array(&mut b, "entry blake3")?;
                            let len = get_u32(&mut b, "entry data")? as usize;
                            if b.len() < len {
                                return Err(DecodeError::Truncated("entry data"));
                            }
                            Some(FileData {
                                encoding,
                                decoded_len,
                                checksum,
                                blake3,
                                data: b.split_to(len),
                            })
                        }
                        v => {
                            return Err(DecodeError::InvalidValue {
                                field: "entry data flag",
                                value: v.into(),
                            })
                        }
                    };
                    entries.push(DataEntry { entry, data });
                }
                Response::DirData(DataPage { entries, eof })
            }
            K_READ_DATA => {
                let version = Version::decode(&mut b)?;
                let enc = get_u8(&mut b, "encoding")?;
                let encoding =
                    Encoding::from_u8(enc & !FILE_HASH_FLAG).ok_or(DecodeError::InvalidValue {
                        field: "encoding",
                        value: enc.into(),
                    })?;
                let decoded_len = get_u32(&mut b, "read")?;
                let checksum = get_u64(&mut b, "read")?;
                let file_hash = if enc & FILE_HASH_FLAG != 0 {
                    Some(get_array(&mut b, "file hash")?)
                } else {
                    None
                };
                return Ok(Response::Read(ReadData {
                    version,
                    encoding,
                    decoded_len,
                    checksum,
                    file_hash,
                    data: b,
                }));
            }
            K_LINK => Response::Link(get_bytes16(&mut b, "target")?),
            K_STATFS_DATA => Response::StatFs(StatFs {
                blocks: get_u64(&mut b, "statfs")?,
                bfree: get_u64(&mut b, "statfs")?,
                bavail: get_u64(&mut b, "statfs")?,
                files: get_u64(&mut b, "statfs")?,
                ffree: get_u64(&mut b, "statfs")?,
                bsize: get_u32(&mut b, "statfs")?,
                namelen: get_u32(&mut b, "statfs")?,
                frsize: get_u32(&mut b, "statfs")?,
            }),
            K_HASH_DATA => Response::Hash(FileHash {
                version: Version::decode(&mut b)?,
                blake3: get_array(&mut b, "blake3")?,
            }),
            K_HASH_SPARSE_DATA => Response::HashSparse(FileHash {
                version: Version::decode(&mut b)?,
                blake3: get_array(&mut b, "blake3")?,
            }),
            K_ID_NAMES_DATA => {
                let n = at_most(
                    get_u16(&mut b, "id count")?.into(),
                    MAX_ID_NAMES,
                    "id count",
                )?;
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    let id = Id::decode(&mut b)?;
                    let name = get_bytes16(&mut b, "id name")?;
                    at_most(name.len(), 255, "id name length")?;
                    names.push(IdName { id, name });
                }
                Response::IdNames(names)
            }
            K_DIR_XATTRS_DATA => Response::DirXattrs(get_entry_xattrs(&mut b)?),
            K_DIR_XATTRS_PAGE_DATA => {
                let next = get_u64(&mut b, "xattrs page next")?;
                Response::DirXattrsPage {
                    entries: get_entry_xattrs(&mut b)?,
                    next,
                }
            }
            K_DATA_MAP_DATA => {
                let version = Version::decode(&mut b)?;
                let next = get_u64(&mut b, "data map next")?;
                let n = at_most(
                    get_u32(&mut b, "extent count")? as usize,
                    MAX_DATA_EXTENTS,
                    "extent count",
                )?;
                let mut extents = Vec::with_capacity(n);
                for _ in 0..n {
                    extents.push((get_u64(&mut b, "extent")?, get_u64(&mut b, "extent")?));
                }
                Response::DataMap(DataMap {
                    version,
                    extents,
                    next,
                })
            }
            K_ERROR => {
                let (status, message) = decode_error(b)?;
                if status == Status::Ok {
                    return Err(DecodeError::InvalidValue {
                        field: "error status",
                        value: 0,
                    });
                }
                return Ok(Response::Error { status, message });
            }
            k => return Err(DecodeError::UnknownKind(k)),
        };
        expect_end(&b)?;
        Ok(resp)
    }
}
