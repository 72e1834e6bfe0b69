//! An S3-compatible object store as a source: the same engine (chunk store, read-ahead,
//! tree prediction, local copy, background mirror, passthrough, resume) over a bucket.
//!
//! The seam is a stream of the pool ([`crate::Client`]): where a ferryd stream writes a
//! request frame and waits for the response frame, an S3 stream answers the same
//! [`Request`] with HTTP requests to one gateway of the store and gives back the same
//! [`Response`]. So everything above the pool — the scheduler's classes and windows,
//! retries on another stream, the chunk store, the mount, the mirror — works unchanged;
//! an S3 session simply has fewer features (no compression, no directory contents in
//! listings, no xattrs, no server-side BLAKE3), and the engine already falls back for
//! each of them as it does with an older ferryd.
//!
//! The namespace as a tree: keys split at `/`; a common prefix is a directory; an object
//! is a regular file (size, Last-Modified as its times). A key that no file name can carry
//! (empty segments, `.`, `..`, over 255 bytes) is left out, and so is a directory marker
//! (a key ending in `/`). A name that is both an object and a prefix is shown as the
//! directory. Modes, owners and times: from the objects' metadata as rclone, s3fs and
//! s3cmd keep them ([`meta`]) when the session reads it (`--s3-metadata`: always, never,
//! or when one of the first keys under the source's path has some); a directory's from its
//! marker object (`DIR/`, as s3fs writes it). An object whose metadata says it is a
//! symbolic link is one (its bytes are the target); rclone's `NAME.rclonelink` is shown as
//! `NAME`. Otherwise: files 0644 with Last-Modified as their times, directories 0755 with
//! the session's start, owned by the user running ferry. A listing carries no metadata, so
//! reading it costs a request per object listed ([`S3Source::described`]: a GET of a small
//! object, whose bytes serve the read that follows, a HEAD of a larger one): every answer
//! describes an object alike, whether a listing, a HEAD or a GET gave it, so a file's
//! version never changes with the request that saw it.
//!
//! Versions: an object's inode number is a hash of its key, its size and times are the
//! object's (ctime its Last-Modified), and its birth time is a hash of its ETag, so a replaced object is another file
//! to the engine: an open handle reads one object version and gets ESTALE after a
//! replacement, never a splice. Every ranged GET carries `If-Match` with the ETag the
//! source last saw for the key, and every response states the version its bytes belong to
//! (the ETag, Last-Modified and size of the GET itself), which the engine checks as it
//! checks ferryd's.
//!
//! Verification: a read that returns a whole object is checked here against the object's
//! S3 checksum (`x-amz-checksum-*`, full-object kinds) or its single-part ETag (MD5) before
//! it is handed on; a larger file's copy is checked by the mirror against the same
//! ([`S3Source::digest`], [`crate::digest`]). Objects with neither (multipart uploads
//! without checksums) are checked per GET by version only, and their BLAKE3 is recorded
//! when the copy completes.

mod config;
mod http;
mod meta;
mod process;

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_proto::{
    Attr, DirEntry, DirPage, Encoding, FileKind, ReadData, Request, Response, StatFs, Status,
    Timestamp, Version,
};
use lru::LruCache;
use tracing::debug;

pub use self::config::{
    Addressing, Env, Metadata, ProcessEnv, S3Config, S3ConfigError, S3Credentials, S3Options,
};
use self::http::{Http, Object};
use self::meta::{Meta, S_IFLNK};
use crate::digest::Digest;

/// Listings kept for paging (a listing is fetched whole at its first page).
const LISTINGS: usize = 64;
/// How long a kept listing serves later pages.
const LISTING_TTL: Duration = Duration::from_secs(30);
/// ETags remembered for `If-Match`.
const ETAGS: usize = 1 << 16;
/// Objects' descriptions (metadata included) kept for the listings that show them.
const HEADS: usize = 1 << 16;
/// Directories' markers (or their absence) kept, each for [`LISTING_TTL`]: as many as a
/// large tree has directories, since every listing of a parent asks for its subdirectories'
/// markers (with 64 kept, a copy of a tree of 919 directories out of a mount asked again for
/// the markers of a directory each time it was listed again).
const MARKERS: usize = 1 << 16;
/// Keys looked at to decide whether the bucket's objects carry metadata (`auto`).
const SAMPLE: usize = 16;
/// Requests one listing runs at once to describe its objects (HEADs, GETs of small ones).
const HEADS_AT_ONCE: usize = 128;
/// The longest symbolic link target read from an object.
const LINK_MAX: u32 = 4096;
/// Bytes of small objects' bodies kept from the listings that read them whole.
const BODIES: usize = 32 << 20;
/// The name ending of rclone's symbolic links (`--links`).
const RCLONE_LINK: &str = ".rclonelink";

/// A small object read whole while a listing described it (metadata mode), kept for the
/// reads that follow: one GET instead of a HEAD and then a GET.
#[derive(Debug, Clone)]
struct Body {
    at: Instant,
    object: Object,
    data: Bytes,
}

/// [`Body`]s by key, at most [`BODIES`] bytes of them.
#[derive(Debug)]
struct Bodies {
    map: LruCache<Bytes, Body>,
    bytes: usize,
}

impl Bodies {
    fn put(&mut self, key: Bytes, body: Body) {
        self.bytes += body.data.len();
        if let Some(old) = self.map.put(key, body) {
            self.bytes -= old.data.len();
        }
        while self.bytes > BODIES {
            match self.map.pop_lru() {
                Some((_, b)) => self.bytes -= b.data.len(),
                None => break,
            }
        }
    }

    fn take(&mut self, key: &Bytes) -> Option<Body> {
        let b = self.map.pop(key)?;
        self.bytes -= b.data.len();
        Some(b)
    }
}

/// A listing kept for paging, with when it was fetched.
type Kept = (Instant, Arc<Vec<DirEntry>>);

/// A directory's whole listing, an error status, or a lost gateway.
type Listed = Result<Result<Arc<Vec<DirEntry>>, Response>, Unreachable>;

/// A LIST in flight, shared by the listings of its directory asked for meanwhile.
type Flight = Arc<tokio::sync::OnceCell<Listed>>;

/// An S3 bucket answering the pool's requests. Shared by all its streams.
pub struct S3Source {
    http: Http,
    /// Whether this session sends `READ_HASH` answers (always: see the module docs).
    uid: u32,
    gid: u32,
    /// Key → the ETag last seen for it.
    etags: Mutex<LruCache<Bytes, Arc<str>>>,
    /// Directory → its whole listing, for the pages after the first.
    listings: Mutex<LruCache<Bytes, Kept>>,
    /// Directory → the LIST in flight for it.
    flights: Mutex<std::collections::HashMap<Bytes, Flight>>,
    /// Whether objects' metadata gives modes, owners and times, once decided.
    use_meta: tokio::sync::OnceCell<bool>,
    /// Key → the object as its last HEAD or whole GET described it, metadata included.
    heads: Mutex<LruCache<Bytes, Object>>,
    /// Directory → its marker's metadata (the object `DIR/`), and when it was read.
    markers: Mutex<LruCache<Bytes, (Instant, Option<Meta>)>>,
    /// Path shown → its key, where they differ (rclone's `NAME.rclonelink` shown as `NAME`).
    aliases: Mutex<LruCache<Bytes, Bytes>>,
    /// Small objects read whole by listings, for the reads that follow.
    bodies: Mutex<Bodies>,
    /// When the session began (whole seconds): the times of directories without a marker.
    started: Timestamp,
    instance: [u8; 16],
}

impl std::fmt::Debug for S3Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Source")
            .field("bucket", &self.http.config().bucket)
            .field("endpoints", &self.http.config().endpoints.len())
            .finish()
    }
}

/// The gateway could not be reached: the stream is lost (the pool sends the request
/// elsewhere and probes the gateway until it answers again).
#[derive(Debug, Clone)]
pub(crate) struct Unreachable(pub(crate) String);

/// A request's outcome: an answer (possibly an error status), or a lost gateway.
pub(crate) type Answered = Result<Response, Unreachable>;

fn error(status: Status, message: impl Into<String>) -> Response {
    Response::Error {
        status,
        message: message.into(),
    }
}

fn not_utf8() -> Response {
    error(Status::InvalidName, "S3 keys are UTF-8")
}

/// A stable 64-bit number of `s` (never 0 or 1: 1 is the root's).
fn hash64(s: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(s).max(2)
}

/// The birth time standing for an ETag: another ETag, another file.
fn etag_stamp(etag: &str) -> Timestamp {
    let h = xxhash_rust::xxh3::xxh3_64(etag.as_bytes());
    Timestamp {
        sec: (h >> 34) as i64,
        nsec: (h as u32) % 1_000_000_000,
    }
}

/// What a HEAD of a directory's marker says of the directory: its metadata when the marker
/// exists, `None` when the store has none (404: the directory gets the documented defaults),
/// and the store's error otherwise. Taking a failed HEAD (a store still busy after its tries,
/// a refused request) for "no marker" described the directory with the defaults: a mirror
/// then made a PostgreSQL `base/` owned by whoever ran ferry, and said nothing.
fn marker_meta(head: Result<Object, Response>) -> Result<Option<Meta>, Box<Response>> {
    match head {
        Ok(o) => Ok(o.meta),
        Err(Response::Error {
            status: Status::NotFound,
            ..
        }) => Ok(None),
        Err(r) => Err(Box::new(r)),
    }
}

/// The outcomes of `requests`, in their order, run [`HEADS_AT_ONCE`] at a time; the first
/// lost gateway ends them all.
async fn at_once<T, F>(requests: impl Iterator<Item = F>) -> Result<Vec<T>, Unreachable>
where
    F: std::future::Future<Output = Result<T, Unreachable>>,
{
    use futures_util::StreamExt;
    let mut running = futures_util::stream::FuturesOrdered::new();
    let mut out = Vec::new();
    for r in requests {
        if running.len() >= HEADS_AT_ONCE {
            if let Some(done) = running.next().await {
                out.push(done?);
            }
        }
        running.push_back(r);
    }
    while let Some(done) = running.next().await {
        out.push(done?);
    }
    Ok(out)
}

/// Whether a key's segment can be a file name here.
fn usable_name(n: &str) -> bool {
    !n.is_empty() && n != "." && n != ".." && n.len() <= 255 && !n.contains('\0')
}

impl S3Source {
    /// A source for `config`, with an HTTP client for its endpoints.
    ///
    /// # Errors
    /// The CA file cannot be read or parsed; the HTTP client cannot be built.
    pub fn new(config: S3Config, timeout: Duration) -> Result<S3Source, crate::ClientError> {
        let mut id = [0u8; 16];
        let digest = blake3::hash(
            format!(
                "{}\0{}",
                config.bucket,
                config
                    .endpoints
                    .iter()
                    .map(url::Url::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            )
            .as_bytes(),
        );
        id.copy_from_slice(&digest.as_bytes()[..16]);
        let http = Http::new(config, timeout)?;
        Ok(S3Source {
            http,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            etags: Mutex::new(LruCache::new(NonZeroUsize::new(ETAGS).expect("nonzero"))),
            listings: Mutex::new(LruCache::new(NonZeroUsize::new(LISTINGS).expect("nonzero"))),
            flights: Mutex::new(std::collections::HashMap::new()),
            use_meta: tokio::sync::OnceCell::new(),
            heads: Mutex::new(LruCache::new(NonZeroUsize::new(HEADS).expect("nonzero"))),
            markers: Mutex::new(LruCache::new(NonZeroUsize::new(MARKERS).expect("nonzero"))),
            aliases: Mutex::new(LruCache::new(NonZeroUsize::new(ETAGS).expect("nonzero"))),
            bodies: Mutex::new(Bodies {
                map: LruCache::unbounded(),
                bytes: 0,
            }),
            started: Timestamp {
                sec: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64),
                nsec: 0,
            },
            instance: id,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &S3Config {
        self.http.config()
    }

    /// A stable id of this bucket behind these endpoints (the session's instance id).
    pub fn instance(&self) -> [u8; 16] {
        self.instance
    }

    /// `s3://BUCKET`, for messages.
    pub fn label(&self) -> String {
        format!("s3://{}", self.config().bucket)
    }

    /// Gateways.
    pub fn endpoints(&self) -> usize {
        self.config().endpoints.len()
    }

    /// Whether gateway `endpoint` answers (a HEAD of the bucket).
    pub(crate) async fn probe(&self, endpoint: usize) -> Result<(), String> {
        match self.http.head_bucket(endpoint).await {
            Ok(200) => Ok(()),
            Ok(404) => Err(format!("{}: no such bucket", self.label())),
            Ok(403) => Err(format!(
                "{}: access denied (check the credentials and region)",
                self.label()
            )),
            Ok(s) => Err(format!("{}: HEAD of the bucket answered {s}", self.label())),
            Err(Unreachable(e)) => Err(e),
        }
    }

    fn remember(&self, key: &Bytes, etag: &str) {
        let mut e = self.etags.lock().unwrap_or_else(|e| e.into_inner());
        if e.get(key).is_none_or(|old| &**old != etag) {
            e.put(key.clone(), Arc::from(etag));
        }
    }

    /// The attributes of object `key` as `o` describes it, with its metadata when `meta`
    /// (the session reads metadata: [`S3Source::use_meta`]).
    fn file_attr(&self, key: &[u8], o: &Object, meta: bool) -> Attr {
        let stored = Timestamp {
            sec: o.last_modified,
            nsec: 0,
        };
        let m = if meta { o.meta } else { None };
        let link = m.is_some_and(|m| m.kind() == S_IFLNK);
        let mtime = m.and_then(|m| m.mtime).unwrap_or(stored);
        Attr {
            ino: hash64(key),
            kind: if link {
                FileKind::Symlink
            } else {
                FileKind::File
            },
            perm: if link {
                0o777
            } else {
                m.and_then(|m| m.perm(false)).unwrap_or(0o644)
            },
            nlink: 1,
            uid: m.and_then(|m| m.uid).unwrap_or(self.uid),
            gid: m.and_then(|m| m.gid).unwrap_or(self.gid),
            rdev: 0,
            size: o.size,
            blocks: o.size.div_ceil(512),
            atime: m.and_then(|m| m.atime).unwrap_or(mtime),
            mtime,
            // When the store took this version (a metadata change is a new one too).
            ctime: stored,
            btime: etag_stamp(&o.etag),
        }
    }

    /// The attributes of directory `path`, with its marker's metadata if it has one (else
    /// 0755, the user running ferry, and the session's start as its times).
    fn dir_attr(&self, path: &[u8], m: Option<&Meta>) -> Attr {
        let mut k = b"dir:".to_vec();
        k.extend_from_slice(path);
        let ino = if path.is_empty() { 1 } else { hash64(&k) };
        let mut a = Attr::bare_directory(ino, self.uid, self.gid);
        (a.mtime, a.ctime, a.atime) = (self.started, self.started, self.started);
        if let Some(m) = m {
            a.perm = m.perm(true).unwrap_or(a.perm);
            a.uid = m.uid.unwrap_or(a.uid);
            a.gid = m.gid.unwrap_or(a.gid);
            if let Some(t) = m.mtime {
                (a.mtime, a.ctime, a.atime) = (t, t, m.atime.unwrap_or(t));
            }
        }
        a
    }

    /// Whether this session reads modes, owners and times from objects' metadata: as
    /// configured, or for `auto`, whether one of the first keys under `near` (the path of
    /// the session's first request) carries some. Decided once per session, so every
    /// answer describes a version alike.
    async fn use_meta(&self, endpoint: usize, near: &[u8]) -> Result<bool, Unreachable> {
        match self.config().metadata {
            Metadata::On => return Ok(true),
            Metadata::Off => return Ok(false),
            Metadata::Auto => {}
        }
        self.use_meta
            .get_or_try_init(|| async {
                let near = String::from_utf8_lossy(near);
                let keys = self.http.sample(endpoint, &near, SAMPLE).await?;
                let heads = self.head_all(endpoint, &keys).await?;
                let found = heads.iter().any(|h| matches!(h, Ok(o) if o.meta.is_some()));
                tracing::info!(
                    "{}: modes, owners and times {} (--s3-metadata auto)",
                    self.label(),
                    if found {
                        "from object metadata (rclone, s3fs, s3cmd): a request per object listed"
                    } else {
                        "as defaults: no metadata on the first objects"
                    }
                );
                debug!(
                    "{}: {} of the first {} keys under {near:?} carry metadata: modes, owners and times {}",
                    self.label(),
                    heads.iter().filter(|h| matches!(h, Ok(o) if o.meta.is_some())).count(),
                    keys.len(),
                    if found { "from metadata" } else { "the defaults" }
                );
                Ok(found)
            })
            .await
            .copied()
    }

    /// HEADs of `keys`, in their order, [`HEADS_AT_ONCE`] at a time.
    async fn head_all(
        &self,
        endpoint: usize,
        keys: &[String],
    ) -> Result<Vec<Result<Object, Response>>, Unreachable> {
        at_once(keys.iter().map(|k| self.http.head(endpoint, k))).await
    }

    /// `objects` of one listing as the store describes them now, metadata included: a
    /// small object (1 byte to [`crate::SMALL_FILE_MAX`]) by a GET of the whole of it, its
    /// bytes kept for the read that follows ([`Bodies`]), a larger one by a HEAD; a
    /// description kept from before serves while the object's ETag and Last-Modified are
    /// the listing's. An object gone since the listing is left out; one replaced since is
    /// described as it is now.
    async fn described(
        &self,
        endpoint: usize,
        objects: Vec<Object>,
    ) -> Result<Result<Vec<Object>, Response>, Unreachable> {
        let mut out = Vec::with_capacity(objects.len());
        let (mut small, mut large) = (Vec::new(), Vec::new());
        {
            let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
            for o in objects {
                match heads.get(o.key.as_bytes()) {
                    Some(h) if h.etag == o.etag && h.last_modified == o.last_modified => {
                        out.push(h.clone());
                    }
                    _ if (1..=u64::from(crate::SMALL_FILE_MAX)).contains(&o.size) => small.push(o),
                    _ => large.push(o),
                }
            }
        }
        let (heads, gets) = tokio::join!(
            at_once(large.iter().map(|o| self.http.head(endpoint, &o.key))),
            at_once(small.iter().map(|o| {
                self.http
                    .get_range(endpoint, &o.key, 0, o.size as u32, None)
            }))
        );
        let gets = gets?;
        let mut described = heads?;
        described.reserve(gets.len());
        for g in gets {
            described.push(g.map(|got| {
                let whole = got.data.len() as u64 == got.object.size
                    && got
                        .digest
                        .as_ref()
                        .is_none_or(|d| &Digest::of(d.kind, &got.data) == d);
                if whole {
                    self.bodies.lock().unwrap_or_else(|e| e.into_inner()).put(
                        Bytes::from(got.object.key.clone()),
                        Body {
                            at: Instant::now(),
                            object: got.object.clone(),
                            data: got.data,
                        },
                    );
                }
                got.object
            }));
        }
        for a in described {
            match a {
                Ok(o) => {
                    self.heads
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .put(Bytes::from(o.key.clone()), o.clone());
                    out.push(o);
                }
                Err(Response::Error {
                    status: Status::NotFound,
                    ..
                }) => {}
                Err(r) => return Ok(Err(r)),
            }
        }
        Ok(Ok(out))
    }

    /// The body of `key` a listing read, if it is still the version last seen for the key
    /// and recent; taken out of the keep.
    fn kept_body(&self, key: &Bytes) -> Option<Body> {
        let b = self
            .bodies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(key)?;
        let current = self
            .etags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .is_some_and(|e| **e == *b.object.etag);
        (current && b.at.elapsed() < LISTING_TTL).then_some(b)
    }

    /// The metadata of directory `path`'s marker (the object `PATH/`, as s3fs writes it),
    /// kept for [`LISTING_TTL`]; `None` without one; the store's error when its HEAD failed
    /// otherwise ([`marker_meta`]).
    async fn marker(
        &self,
        endpoint: usize,
        path: &[u8],
    ) -> Result<Result<Option<Meta>, Response>, Unreachable> {
        if path.is_empty() {
            return Ok(Ok(None));
        }
        if let Some((at, m)) = self
            .markers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
        {
            if at.elapsed() < LISTING_TTL {
                return Ok(Ok(*m));
            }
        }
        let key = format!("{}/", String::from_utf8_lossy(path));
        let m = match marker_meta(self.http.head(endpoint, &key).await?) {
            Ok(m) => m,
            Err(r) => return Ok(Err(*r)),
        };
        self.markers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(Bytes::copy_from_slice(path), (Instant::now(), m));
        Ok(Ok(m))
    }

    /// The key of the object shown at `path`.
    fn key_for(&self, path: &Bytes) -> Bytes {
        self.aliases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .cloned()
            .unwrap_or_else(|| path.clone())
    }

    /// Answers one request through gateway `endpoint`.
    pub(crate) async fn answer(&self, endpoint: usize, request: Request) -> Answered {
        tracing::trace!("S3 request to endpoint {endpoint}: {request:?}");
        match request {
            Request::Ping => self
                .http
                .head_bucket(endpoint)
                .await
                .map(|_| Response::Pong),
            Request::Stat { path } => self.stat(endpoint, path).await,
            Request::ReadDir {
                path,
                cookie,
                max_entries,
            } => self.read_dir(endpoint, path, cookie, max_entries).await,
            Request::Read {
                path, offset, len, ..
            } => self.read(endpoint, path, offset, len).await,
            Request::ReadLink { path } => self.read_link(endpoint, path).await,
            // An object store has no free space to speak of.
            Request::StatFs => Ok(Response::StatFs(StatFs {
                bsize: 1 << 20,
                frsize: 1 << 20,
                namelen: 255,
                ..StatFs::default()
            })),
            other => Ok(error(
                Status::Unsupported,
                format!(
                    "request 0x{:02x} is not available from an S3 source",
                    other.kind()
                ),
            )),
        }
    }

    /// The key of `path` (`None`: not UTF-8, which no S3 key is).
    fn key_of(path: &Bytes) -> Option<&str> {
        std::str::from_utf8(path).ok()
    }

    async fn stat(&self, endpoint: usize, path: Bytes) -> Answered {
        if path.is_empty() {
            return Ok(Response::Attr(self.dir_attr(&path, None)));
        }
        let key_b = self.key_for(&path);
        let (Some(shown), Some(key)) = (Self::key_of(&path), Self::key_of(&key_b)) else {
            return Ok(not_utf8());
        };
        let meta = self.use_meta(endpoint, &path).await?;
        // All at once (one round trip): a name that is both is shown as the directory.
        let prefix = format!("{shown}/");
        let marker = async {
            if meta {
                self.marker(endpoint, &path).await
            } else {
                Ok(Ok(None))
            }
        };
        let (is_dir, head, marker) = tokio::join!(
            self.http.prefix_exists(endpoint, &prefix),
            self.http.head(endpoint, key),
            marker
        );
        if is_dir? {
            return Ok(match marker? {
                Ok(m) => Response::Attr(self.dir_attr(&path, m.as_ref())),
                Err(r) => r,
            });
        }
        match head? {
            Ok(o) => {
                self.remember(&key_b, &o.etag);
                Ok(Response::Attr(self.file_attr(&key_b, &o, meta)))
            }
            Err(Response::Error {
                status: Status::NotFound,
                ..
            }) => Ok(error(
                Status::NotFound,
                format!("no object {key:?} and no key under {prefix:?}"),
            )),
            Err(r) => Ok(r),
        }
    }

    /// The whole listing of directory `path`, kept for its later pages.
    ///
    /// Listings of one directory asked for while one is in flight share it (a LIST costs the
    /// store a scan of everything under the prefix; a mount's walk may ask for the same
    /// directory again before the first answer, e.g. a listing ahead dropped and started
    /// anew): the answer then reflects the store from at most one LIST's duration before.
    async fn listing(&self, endpoint: usize, path: &Bytes, fresh: bool) -> Listed {
        if !fresh {
            let mut l = self.listings.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, v)) = l.get(path) {
                if at.elapsed() < LISTING_TTL {
                    return Ok(Ok(v.clone()));
                }
            }
        }
        let flight = self
            .flights
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(path.clone())
            .or_default()
            .clone();
        let got = flight
            .get_or_init(|| self.fetch_listing(endpoint, path))
            .await
            .clone();
        // Done: the next listing of the directory is a LIST of its own.
        let mut f = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        if f.get(path).is_some_and(|c| Arc::ptr_eq(c, &flight)) {
            f.remove(path);
        }
        got
    }

    /// One LIST of directory `path`, as a listing ([`S3Source::listing`]).
    async fn fetch_listing(&self, endpoint: usize, path: &Bytes) -> Listed {
        let Some(dir) = Self::key_of(path) else {
            return Ok(Err(not_utf8()));
        };
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let (objects, prefixes) = match self.http.list(endpoint, &prefix).await? {
            Ok(l) => l,
            Err(r) => return Ok(Err(r)),
        };
        if !dir.is_empty() && objects.is_empty() && prefixes.is_empty() {
            return Ok(Err(error(
                Status::NotFound,
                format!("no objects under {prefix}"),
            )));
        }
        let meta = self.use_meta(endpoint, prefix.as_bytes()).await?;
        let mut dirs = std::collections::BTreeSet::new();
        for p in prefixes {
            let name = p.strip_prefix(&prefix).unwrap_or(&p).trim_end_matches('/');
            if usable_name(name) && !name.contains('/') {
                dirs.insert(name.to_string());
            } else {
                debug!(
                    "{}: prefix {p:?} is not a usable name; left out",
                    self.label()
                );
            }
        }
        let name_of = |o: &Object| o.key.strip_prefix(&prefix).unwrap_or(&o.key).to_string();
        let mut files: Vec<Object> = objects
            .into_iter()
            .filter(|o| {
                let name = name_of(o);
                // An empty name is the directory's marker.
                let keep = name.is_empty()
                    || (usable_name(&name) && !name.contains('/') && !dirs.contains(&name));
                if !keep {
                    debug!("{}: key {:?} left out of the tree", self.label(), o.key);
                }
                keep && !name.is_empty()
            })
            .collect();
        let full = |name: &str| Bytes::from(format!("{prefix}{name}"));
        let mut dir_meta = vec![None; dirs.len()];
        if meta {
            files = match self.described(endpoint, files).await? {
                Ok(f) => f,
                Err(r) => return Ok(Err(r)),
            };
            let paths: Vec<Bytes> = dirs.iter().map(|d| full(d)).collect();
            let markers = at_once(paths.iter().map(|p| self.marker(endpoint, p))).await?;
            dir_meta = match markers.into_iter().collect::<Result<Vec<_>, _>>() {
                Ok(m) => m,
                Err(r) => return Ok(Err(r)),
            };
        }
        let mut entries: Vec<(String, Attr)> = Vec::with_capacity(files.len() + dirs.len());
        for (name, m) in dirs.iter().zip(&dir_meta) {
            entries.push((name.clone(), self.dir_attr(&full(name), m.as_ref())));
        }
        let names: std::collections::HashSet<String> = files.iter().map(name_of).collect();
        for o in files {
            let mut name = name_of(&o);
            let key = Bytes::from(o.key.clone());
            let attr = self.file_attr(&key, &o, meta);
            // rclone's symlink NAME.rclonelink is shown as NAME (unless NAME is taken).
            if attr.kind == FileKind::Symlink {
                if let Some(bare) = name.strip_suffix(RCLONE_LINK) {
                    if usable_name(bare) && !names.contains(bare) && !dirs.contains(bare) {
                        self.aliases
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .put(full(bare), key.clone());
                        name = bare.to_string();
                    }
                }
            }
            self.remember(&key, &o.etag);
            entries.push((name, attr));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let list: Vec<DirEntry> = entries
            .into_iter()
            .enumerate()
            .map(|(i, (name, attr))| DirEntry {
                name: Bytes::from(name),
                cookie: i as u64 + 1,
                attr,
            })
            .collect();
        let list = Arc::new(list);
        self.listings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(path.clone(), (Instant::now(), list.clone()));
        Ok(Ok(list))
    }

    async fn read_dir(&self, endpoint: usize, path: Bytes, cookie: u64, max: u32) -> Answered {
        // A first page lists anew; later pages page through the same listing.
        let list = match self.listing(endpoint, &path, cookie == 0).await? {
            Ok(l) => l,
            Err(r) => return Ok(r),
        };
        let start = (cookie as usize).min(list.len());
        let n = (max.max(1) as usize).min(list.len() - start);
        Ok(Response::DirPage(DirPage {
            entries: list[start..start + n].to_vec(),
            eof: start + n == list.len(),
        }))
    }

    async fn read(&self, endpoint: usize, path: Bytes, offset: u64, len: u32) -> Answered {
        let path = self.key_for(&path);
        let Some(key) = Self::key_of(&path) else {
            return Ok(not_utf8());
        };
        let meta = self.use_meta(endpoint, &path).await?;
        if let Some(b) = self.kept_body(&path) {
            // Read whole (and checked) by the listing that described it.
            let start = (offset as usize).min(b.data.len());
            let end = (start + len as usize).min(b.data.len());
            let data = b.data.slice(start..end);
            let whole = start == 0 && end == b.data.len();
            if !whole {
                self.bodies
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .put(path.clone(), b.clone());
            }
            return Ok(self.read_data(&path, &b.object, meta, data, whole));
        }
        let etag = self
            .etags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&path)
            .cloned();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let got = match self
                .http
                .get_range(endpoint, key, offset, len, etag.as_deref())
                .await?
            {
                Ok(g) => g,
                Err(r) => return Ok(r),
            };
            self.remember(&path, &got.object.etag);
            let whole = offset == 0 && got.data.len() as u64 == got.object.size;
            if whole {
                // The whole object: checked against what the store says of it.
                if let Some(want) = &got.digest {
                    let mine = Digest::of(want.kind, &got.data);
                    if &mine != want {
                        if attempts < 3 {
                            debug!(
                                "{}: {key}: bytes do not match its {:?}; again",
                                self.label(),
                                want.kind
                            );
                            continue;
                        }
                        return Ok(error(
                            Status::Io,
                            format!("{key}: the bytes received do not match the object's {:?} three times", want.kind),
                        ));
                    }
                }
            }
            return Ok(self.read_data(&path, &got.object, meta, got.data, whole));
        }
    }

    /// The answer to a Read: `data` of object `key` as `object` describes it (`whole`: all
    /// of it, checked, so its BLAKE3 goes with it).
    fn read_data(
        &self,
        key: &[u8],
        object: &Object,
        meta: bool,
        data: Bytes,
        whole: bool,
    ) -> Response {
        let version: Version = self.file_attr(key, object, meta).version();
        Response::Read(ReadData {
            version,
            encoding: Encoding::Raw,
            decoded_len: data.len() as u32,
            checksum: xxhash_rust::xxh3::xxh3_64(&data),
            file_hash: whole.then(|| *blake3::hash(&data).as_bytes()),
            data,
        })
    }

    /// The store's digest of object `path` and the version it belongs to (`None`: the
    /// store has none that the local copy can be checked against).
    ///
    /// # Errors
    /// The gateway is unreachable ([`crate::ClientError::ConnectionLost`]) or answers an
    /// error.
    pub(crate) async fn digest(
        &self,
        endpoint: usize,
        path: &Bytes,
    ) -> Result<Result<(Version, Option<Digest>), Response>, Unreachable> {
        let path = &self.key_for(path);
        let Some(key) = Self::key_of(path) else {
            return Ok(Err(not_utf8()));
        };
        let meta = self.use_meta(endpoint, path).await?;
        Ok(match self.http.head(endpoint, key).await? {
            Ok(o) => {
                self.remember(path, &o.etag);
                let v = self.file_attr(path, &o, meta).version();
                Ok((v, o.digest))
            }
            Err(r) => Err(r),
        })
    }

    /// The target of the symbolic link at `path`: the object's bytes, when its metadata
    /// says it is a link (s3fs and rclone write links so).
    async fn read_link(&self, endpoint: usize, path: Bytes) -> Answered {
        let path = self.key_for(&path);
        let Some(key) = Self::key_of(&path) else {
            return Ok(not_utf8());
        };
        let not_link = || {
            Ok(error(
                Status::InvalidArgument,
                format!("{key}: not a symbolic link"),
            ))
        };
        if !self.use_meta(endpoint, &path).await? {
            return not_link();
        }
        match self
            .http
            .get_range(endpoint, key, 0, LINK_MAX, None)
            .await?
        {
            Ok(g) if g.object.meta.is_some_and(|m| m.kind() == S_IFLNK) => {
                if g.data.len() as u64 != g.object.size || g.data.is_empty() {
                    return Ok(error(
                        Status::InvalidArgument,
                        format!(
                            "{key}: a symbolic link's target of {} bytes (1 to {LINK_MAX} are links)",
                            g.object.size
                        ),
                    ));
                }
                Ok(Response::Link(g.data))
            }
            Ok(_) => not_link(),
            Err(r) => Ok(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_stamps() {
        assert!(usable_name("a.txt"));
        for bad in ["", ".", "..", "a\0b"] {
            assert!(!usable_name(bad), "{bad:?}");
        }
        assert!(!usable_name(&"x".repeat(256)));
        assert_ne!(etag_stamp("\"a\""), etag_stamp("\"b\""));
        assert!(etag_stamp("\"a\"").nsec < 1_000_000_000);
        assert!(hash64(b"") >= 2);
    }

    #[test]
    fn only_a_missing_marker_gives_a_directory_the_defaults() {
        let meta = Meta::from_headers([("x-amz-meta-uid", "101"), ("x-amz-meta-gid", "104")]);
        assert!(meta.is_some());
        let marker = Object {
            key: "pgdata/base/".into(),
            size: 0,
            last_modified: 0,
            etag: "e".into(),
            digest: None,
            meta,
        };
        assert_eq!(marker_meta(Ok(marker)).ok(), Some(meta));
        assert_eq!(
            marker_meta(Err(error(Status::NotFound, "no such key"))).ok(),
            Some(None)
        );
        // A store still busy after its tries, or one that refused the HEAD: an error, not a
        // directory owned by whoever runs ferry.
        for st in [Status::Io, Status::PermissionDenied] {
            let r = marker_meta(Err(error(st, "503 SlowDown"))).map_err(|r| *r);
            assert!(
                matches!(r, Err(Response::Error { status, .. }) if status == st),
                "{r:?}"
            );
        }
    }
}
