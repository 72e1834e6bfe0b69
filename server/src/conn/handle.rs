//! Executing one request: the export call on the blocking pool, under the read limits.
//!
//! Every request runs in its own task holding the connection's in-flight permit. It also
//! takes, in this order and until its response has been written ([`Held`]):
//! 1. for a background read, one of the connection's [`BACKGROUND_READS`] background slots,
//!    so a connection's background reads never hold more than that many places in the
//!    blocking pool or the memory budget: demand and prediction reads of the same
//!    connection (and of everyone else) do not queue behind a mirror's reads there;
//! 2. the bound of its response ([`response_bound`]: for a Read twice its length, raw
//!    and compressed; for a directory page its most entries) from the connection's account
//!    in the server's memory budget, shared fairly ([`crate::budget`]); once the response
//!    is encoded the reservation becomes its size.
//!
//! Hashes take one of two server-wide hash slots (each reads a whole file).
//!
//! Readers first for CPU and disk: background reads and hashes (only mirrors and local
//! copies ask for them) run on [`BACKGROUND_POOL`], threads at lower CPU and I/O priority
//! (`ferryd-bg-N`, [`ferry_util::background::Pool`]); demand and prediction reads, and
//! everything else, on tokio's blocking pool at normal priority. Where the link outruns the
//! machine (a fast LAN, loopback), a mirror's reads, checksums and compression then take
//! only the CPU and disk time readers leave.

use std::sync::Arc;

use ferry_proto::{
    features, payload, Class, Compression, FileHash, ReadData, Request, Response, Status,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::warn;

use crate::export::{self, OpError};
use crate::Shared;

/// Background reads one connection may have holding budget and a place in the blocking
/// pool at once (from taking their slot until their response is written).
pub(crate) const BACKGROUND_READS: usize = 2;

/// Threads for background reads and hashes (lower CPU and I/O priority); enough for a
/// few mirrors' reads to keep a fast disk busy.
pub(crate) static BACKGROUND_POOL: ferry_util::background::Pool =
    ferry_util::background::Pool::new("ferryd-bg", 4, 64);

/// Largest page of a listing with contents (ReadDirData), in encoded bytes, whatever the
/// frame limit: small pages keep the budget one holds small, and many travel at once.
const DIR_DATA_PAGE: u32 = 256 << 10;

/// Largest page of a tree's listings (ReadTree), in encoded bytes, whatever the frame
/// limit: a few thousand entries, a few round trips for a tree like /usr/include.
const TREE_PAGE: usize = 512 << 10;

/// Most entries in a page of a tree's listings, whatever the client asks.
const MAX_TREE_ENTRIES: usize = 16384;

/// Largest directory page served, whatever the client asks.
const MAX_DIR_PAGE: usize = 4096;

/// What every request of one connection shares: the session's terms and its limits.
#[derive(Debug)]
pub(crate) struct Session {
    /// Features negotiated for the session.
    pub(crate) features: u64,
    /// The negotiated chunk size (largest Read).
    pub(crate) chunk_size: u32,
    /// The negotiated frame limit.
    pub(crate) max_frame: u32,
    /// This connection's account in the server's memory budget.
    pub(crate) account: Arc<crate::budget::Account>,
    /// Slots for background reads ([`BACKGROUND_READS`]).
    pub(crate) background: Arc<Semaphore>,
    /// The client the connection belongs to (as the budget and the fair turns at reading,
    /// [`crate::fair`], count clients).
    pub(crate) client: u64,
    /// Where the CPU time of the work done for its client is counted (Load's share).
    pub(crate) work: crate::conn::writer::Work,
}

/// The class a request's response is written at: a Read's own class, Demand for every
/// other request.
pub(crate) fn request_class(request: &Request) -> Class {
    match request {
        Request::Read { class, .. } | Request::ReadDirData { class, .. } => *class,
        _ => Class::Demand,
    }
}

fn error_response(e: OpError) -> Response {
    Response::Error {
        status: e.status,
        message: e.message,
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, OpError> + Send + 'static,
) -> Result<T, OpError> {
    // Dropped (its connection ended) before the work started: the work never starts (no
    // effect once it has started or finished).
    let mut task = ferry_util::AbortOnDrop(tokio::task::spawn_blocking(f));
    (&mut task.0)
        .await
        .unwrap_or_else(|e| Err(OpError::new(Status::Io, format!("worker failed: {e}"))))
}

/// A fair turn at reading `bytes` for a demand or prediction read (background reads have
/// their own pool and per-connection limit).
async fn fair_turn(
    sh: &Arc<Shared>,
    session: &Session,
    class: Class,
    bytes: u64,
) -> Option<crate::fair::Turn> {
    if class == Class::Background {
        return None;
    }
    Some(
        sh.reads
            .turn(session.client, bytes, class == Class::Demand)
            .await,
    )
}

/// Like [`blocking`], on [`BACKGROUND_POOL`] for background work.
async fn blocking_as<T: Send + 'static>(
    class: Class,
    f: impl FnOnce() -> Result<T, OpError> + Send + 'static,
) -> Result<T, OpError> {
    if class != Class::Background {
        return blocking(f).await;
    }
    BACKGROUND_POOL
        .run(f)
        .await
        .unwrap_or_else(|e| Err(OpError::new(Status::Io, format!("worker failed: {e}"))))
}

/// Answers Hash (`sparse` false: BLAKE3 of every byte) or HashSparse (the sparse hash, holes
/// not read), from the cache of recent hashes when it holds this version's.
async fn hash(
    shared: &Arc<Shared>,
    sh: Arc<Shared>,
    session: &Session,
    path: bytes::Bytes,
    sparse: bool,
    chunk_size: u32,
) -> Result<Response, OpError> {
    // At most two files hashed at once; the wait is bounded by the client's own request
    // timeout.
    let Ok(_slot) = shared.hash_slots.clone().acquire_owned().await else {
        return Ok(error_response(OpError::new(Status::Busy, "server busy")));
    };
    let work = session.work.clone();
    blocking_as(Class::Background, move || {
        work.counted(|| hash_now(&sh, path, sparse, chunk_size))
    })
    .await
    .map(|h| {
        if sparse {
            Response::HashSparse(h)
        } else {
            Response::Hash(h)
        }
    })
}

/// The BLAKE3 of the file at `path` (of its data only when `sparse`), from the cache when
/// the file has not changed since it was last hashed.
fn hash_now(
    sh: &Shared,
    path: bytes::Bytes,
    sparse: bool,
    chunk_size: u32,
) -> Result<FileHash, OpError> {
    let (file, attr) = sh.export.open_file(&path)?;
    let key = (path, sparse);
    let cached = sh
        .hashes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key, attr.version());
    if let Some(blake3) = cached {
        return Ok(FileHash {
            version: attr.version(),
            blake3,
        });
    }
    let (version, blake3) = if sparse {
        export::hash_file_sparse(&file, attr)?
    } else {
        export::hash_file(&file, attr, chunk_size as usize)?
    };
    sh.hashes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, version, blake3);
    Ok(FileHash { version, blake3 })
}

/// What a response holds until it has been written: its in-flight slot (and, for a
/// background read, its background slot), and its bytes of the memory budget.
#[derive(Debug, Default)]
pub(crate) struct Held {
    pub(crate) slots: Vec<OwnedSemaphorePermit>,
    pub(crate) bytes: Option<crate::budget::Hold>,
}

/// The most bytes the response to `request` may buffer (encoded, plus for reads the raw
/// buffer beside the compressed one), reserved before it is computed.
fn response_bound(request: &Request, session: &Session) -> u64 {
    let frame = u64::from(session.max_frame);
    let bound = match request {
        Request::Read { len, .. } => 2 * u64::from(*len),
        // Contents (raw and compressed) and every entry's name, attributes and data header.
        Request::ReadDirData { max_entries, .. } => {
            (2 * dir_data_page(session)
                + 64
                + dir_page_entries(session, *max_entries) * (export::MAX_DIRENT_WIRE_LEN + 64))
                as u64
        }
        Request::ReadDir { max_entries, .. } => {
            (64 + dir_page_entries(session, *max_entries) * export::MAX_DIRENT_WIRE_LEN) as u64
        }
        // The page, and the first entry that goes in whatever its size.
        Request::ReadTree { .. } => (64 + tree_page(session) + export::MAX_DIRENT_WIRE_LEN) as u64,
        // Names and values up to the limit, and their framing (6 bytes an attribute at
        // most as many as a byte each).
        Request::DirXattrs { .. } | Request::DirXattrsPage { .. } => {
            2 * ferry_proto::MAX_DIR_XATTR_BYTES as u64 + 4096
        }
        Request::DataMap { .. } => 64 + 16 * ferry_proto::MAX_DATA_EXTENTS as u64,
        Request::IdNames { ids } => 8 + 262 * ids.len() as u64,
        // The hash's read buffer while it runs.
        Request::Hash { .. } | Request::HashSparse { .. } => {
            u64::from(session.chunk_size).max(1 << 20)
        }
        Request::Stat { .. }
        | Request::ReadLink { .. }
        | Request::StatFs
        | Request::Ping
        | Request::Load => 8192,
    };
    bound.min(2 * frame).max(64)
}

/// Bytes a response's body may take in this session: its frame less room for the header.
fn frame_room(session: &Session) -> usize {
    session.max_frame as usize - 64
}

/// Bytes of contents a ReadDirData page holds at most.
fn dir_data_page(session: &Session) -> usize {
    frame_room(session).min(DIR_DATA_PAGE as usize)
}

/// Encoded bytes of a tree's listings a page holds at most (about: the first entry goes in
/// whatever its size).
fn tree_page(session: &Session) -> usize {
    (frame_room(session) - export::MAX_DIRENT_WIRE_LEN).min(TREE_PAGE)
}

/// Entries a directory page holds at most, for a request of `max_entries`.
fn dir_page_entries(session: &Session, max_entries: u32) -> usize {
    let fit = frame_room(session) / export::MAX_DIRENT_WIRE_LEN;
    (max_entries as usize).clamp(1, MAX_DIR_PAGE.min(fit))
}

/// Takes what a request holds until its response is written: for a background read one
/// of the connection's background slots, then the bound of its response
/// ([`response_bound`]) from the connection's account of the memory budget (which waits
/// while the connection is over its fair share or the budget is used up). `Err`: the
/// answer to send instead (never, as these semaphores are never closed).
async fn take_permits(
    session: &Session,
    request: &Request,
    held: &mut Held,
) -> Result<(), Response> {
    let busy = || error_response(OpError::new(Status::Busy, "server busy"));
    if request_class(request) == Class::Background {
        held.slots.push(
            session
                .background
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| busy())?,
        );
    }
    // Hashes too: only mirrors and local copies ask, nobody waits on them.
    let background = request_class(request) == Class::Background
        || matches!(request, Request::Hash { .. } | Request::HashSparse { .. });
    held.bytes = Some(
        session
            .account
            .take(response_bound(request, session), background)
            .await,
    );
    Ok(())
}

/// Serves `request`; what it takes (budget, background slot) is added to `held`,
/// to be released once the response is written.
pub(crate) async fn handle(
    shared: &Arc<Shared>,
    session: &Session,
    request: Request,
    held: &mut Held,
) -> Response {
    let sh = shared.clone();
    let chunk_size = session.chunk_size;
    if let Request::Read { len, .. } = &request {
        if *len > chunk_size {
            return Response::Error {
                status: Status::TooLarge,
                message: format!("read of {len} bytes exceeds the chunk size {chunk_size}"),
            };
        }
    }
    if let Err(r) = take_permits(session, &request, held).await {
        return r;
    }
    let result = match request {
        Request::Ping => Ok(Response::Pong),
        Request::Load => Ok(Response::Load(
            sh.load(
                (session.features & features::LINK_LIMITS != 0)
                    .then(|| sh.link_limits.of(session.client)),
                sh.link_limits.work_share(session.client),
            ),
        )),
        Request::Stat { path } => blocking(move || sh.export.stat(&path))
            .await
            .map(Response::Attr),
        Request::ReadLink { path } => blocking(move || sh.export.readlink(&path))
            .await
            .map(Response::Link),
        Request::StatFs => blocking(move || sh.export.statfs())
            .await
            .map(Response::StatFs),
        Request::Hash { path } => hash(shared, sh, session, path, false, chunk_size).await,
        Request::HashSparse { path } => hash(shared, sh, session, path, true, chunk_size).await,
        Request::IdNames { ids } => blocking(move || Ok(crate::names::names(&ids)))
            .await
            .map(Response::IdNames),
        Request::DirXattrs { path } => {
            // Within the session's frame too (a 4 KiB chunk size gives 8 KiB frames).
            let max = frame_room(session);
            blocking(move || sh.export.dir_xattrs(&path, max))
                .await
                .map(Response::DirXattrs)
        }
        Request::DirXattrsPage { path, cookie } => {
            let max = frame_room(session);
            blocking(move || sh.export.dir_xattrs_page(&path, cookie, max))
                .await
                .map(|(entries, next)| Response::DirXattrsPage { entries, next })
        }
        Request::DataMap {
            path,
            offset,
            max_extents,
        } => {
            let max = (max_extents as usize).clamp(1, ferry_proto::MAX_DATA_EXTENTS);
            blocking(move || sh.export.data_map(&path, offset, max))
                .await
                .map(Response::DataMap)
        }
        Request::ReadDir {
            path,
            cookie,
            max_entries,
        } => {
            let n = dir_page_entries(session, max_entries);
            blocking(move || sh.export.read_dir(&path, cookie, n))
                .await
                .map(Response::DirPage)
        }
        Request::ReadTree { path, max_entries } => {
            let n = (max_entries as usize).clamp(1, MAX_TREE_ENTRIES);
            let max_bytes = tree_page(session);
            // Up to 16,384 entries' stats and as many directories opened: a turn at reading
            // like a read of the page's size, so a client asking for many cannot keep
            // another's reads and listings waiting for threads.
            let _turn = fair_turn(&sh, session, Class::Demand, max_bytes as u64).await;
            let work = session.work.clone();
            blocking(move || work.counted(|| sh.export.read_tree(&path, n, max_bytes)))
                .await
                .map(Response::Tree)
        }
        Request::ReadDirData {
            path,
            cookie,
            max_entries,
            max_file,
            compression,
            class,
        } => {
            // A page holds up to DIR_DATA_PAGE bytes of contents (its budget was taken as
            // for a read of that many).
            let max_bytes = dir_data_page(session);
            let n = dir_page_entries(session, max_entries);
            let max_file = u64::from(max_file.min(chunk_size));
            let page = export::DataPageLimits {
                max_entries: n,
                max_file,
                max_bytes,
                compression: effective(session, &sh.config, compression),
                uncached: class == Class::Background,
            };
            let _turn = fair_turn(&sh, session, class, max_bytes as u64).await;
            let work = session.work.clone();
            blocking_as(class, move || {
                work.counted(|| sh.export.read_dir_data(&path, cookie, page))
            })
            .await
            .map(Response::DirData)
        }
        Request::Read {
            path,
            offset,
            len,
            compression,
            class,
        } => {
            let compression = effective(session, &sh.config, compression);
            let read_hash = session.features & features::READ_HASH != 0;
            let _turn = fair_turn(&sh, session, class, u64::from(len)).await;
            let work = session.work.clone();
            blocking_as(class, move || {
                work.counted(|| {
                    let (file, attr) = sh.export.open_file(&path)?;
                    let uncached = class == Class::Background;
                    let (data, attr) =
                        export::read_at(&file, attr, offset, len as usize, uncached)?;
                    let decoded_len = data.len() as u32;
                    let checksum = payload::checksum(&data);
                    // The whole file in one read: its BLAKE3 comes along, so the client can
                    // verify its copy without asking again.
                    let file_hash = (read_hash && offset == 0 && data.len() as u64 == attr.size)
                        .then(|| *blake3::hash(&data).as_bytes());
                    let lane = payload::Lane::of(uncached);
                    let (encoding, data) = payload::encode(data, compression, lane);
                    Ok(ReadData {
                        version: attr.version(),
                        encoding,
                        decoded_len,
                        checksum,
                        file_hash,
                        data,
                    })
                })
            })
            .await
            .map(Response::Read)
        }
    };
    result.unwrap_or_else(|e| {
        if e.status == Status::Io {
            warn!("{}", e.message);
        }
        error_response(e)
    })
}

/// The compression a request gets: what it asked for, when the session has the feature
/// (lz4 without LZ4 is sent raw; zstd without ZSTD never gets here, it is a protocol
/// error), with zstd levels above the server's highest brought down to it.
pub(crate) fn effective(
    session: &Session,
    config: &crate::ServerConfig,
    asked: Compression,
) -> Compression {
    match asked {
        Compression::Lz4 if session.features & features::LZ4 == 0 => Compression::None,
        Compression::Zstd(level) => match config.max_compression_level {
            Some(max) => Compression::Zstd(level.min(max)),
            None => Compression::None,
        },
        c => c,
    }
}
