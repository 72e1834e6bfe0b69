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
//! directory. Modes and owners: files 0644, directories 0755, owned by the user running
//! ferry.
//!
//! Versions: an object's inode number is a hash of its key, its size and mtime are the
//! object's, and its birth time is a hash of its ETag, so a replaced object is another file
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
    Addressing, Env, ProcessEnv, S3Config, S3ConfigError, S3Credentials, S3Options,
};
use self::http::{Http, Object};
use crate::digest::Digest;

/// Listings kept for paging (a listing is fetched whole at its first page).
const LISTINGS: usize = 64;
/// How long a kept listing serves later pages.
const LISTING_TTL: Duration = Duration::from_secs(30);
/// ETags remembered for `If-Match`.
const ETAGS: usize = 1 << 16;

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

    fn file_attr(&self, key: &[u8], o: &Object) -> Attr {
        let t = Timestamp {
            sec: o.last_modified,
            nsec: 0,
        };
        Attr {
            ino: hash64(key),
            kind: FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            size: o.size,
            blocks: o.size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            btime: etag_stamp(&o.etag),
        }
    }

    fn dir_attr(&self, path: &[u8]) -> Attr {
        let mut k = b"dir:".to_vec();
        k.extend_from_slice(path);
        let ino = if path.is_empty() { 1 } else { hash64(&k) };
        Attr::bare_directory(ino, self.uid, self.gid)
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
            Request::ReadLink { .. } => Ok(error(
                Status::InvalidArgument,
                "an S3 bucket has no symbolic links",
            )),
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
            return Ok(Response::Attr(self.dir_attr(&path)));
        }
        let Some(key) = Self::key_of(&path) else {
            return Ok(not_utf8());
        };
        // Both at once (one round trip): a name that is both is shown as the directory.
        let prefix = format!("{key}/");
        let (is_dir, head) = tokio::join!(
            self.http.prefix_exists(endpoint, &prefix),
            self.http.head(endpoint, key)
        );
        if is_dir? {
            return Ok(Response::Attr(self.dir_attr(&path)));
        }
        match head? {
            Ok(o) => {
                self.remember(&path, &o.etag);
                Ok(Response::Attr(self.file_attr(&path, &o)))
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
        let mut entries: Vec<(String, Attr)> = Vec::with_capacity(objects.len() + prefixes.len());
        let mut dirs = std::collections::BTreeSet::new();
        for p in prefixes {
            let name = p.strip_prefix(&prefix).unwrap_or(&p).trim_end_matches('/');
            if usable_name(name) && !name.contains('/') {
                dirs.insert(name.to_string());
                let full = Bytes::from(format!("{prefix}{name}"));
                entries.push((name.to_string(), self.dir_attr(&full)));
            } else {
                debug!(
                    "{}: prefix {p:?} is not a usable name; left out",
                    self.label()
                );
            }
        }
        for o in objects {
            let name = o.key.strip_prefix(&prefix).unwrap_or(&o.key);
            if name.is_empty() {
                continue; // the directory marker
            }
            if !usable_name(name) || name.contains('/') || dirs.contains(name) {
                debug!("{}: key {:?} left out of the tree", self.label(), o.key);
                continue;
            }
            let key = Bytes::from(o.key.clone());
            self.remember(&key, &o.etag);
            entries.push((name.to_string(), self.file_attr(&key, &o)));
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
        let Some(key) = Self::key_of(&path) else {
            return Ok(not_utf8());
        };
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
            let version: Version = self.file_attr(&path, &got.object).version();
            let whole = offset == 0 && got.data.len() as u64 == got.object.size;
            let mut file_hash = None;
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
                file_hash = Some(*blake3::hash(&got.data).as_bytes());
            }
            let checksum = xxhash_rust::xxh3::xxh3_64(&got.data);
            return Ok(Response::Read(ReadData {
                version,
                encoding: Encoding::Raw,
                decoded_len: got.data.len() as u32,
                checksum,
                file_hash,
                data: got.data,
            }));
        }
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
        let Some(key) = Self::key_of(path) else {
            return Ok(Err(not_utf8()));
        };
        Ok(match self.http.head(endpoint, key).await? {
            Ok(o) => {
                self.remember(path, &o.etag);
                let v = self.file_attr(path, &o).version();
                Ok((v, o.digest))
            }
            Err(r) => Err(r),
        })
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
}
