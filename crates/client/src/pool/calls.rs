//! The typed calls: one method per request kind, each checking that the answer is the
//! kind asked for. Reads decode and verify their payload (a checksum failure is fetched
//! again, up to three times); directory listings are fetched page by page and their
//! entry names validated.
//!
//! A background read larger than the scheduler's piece size (pool/schedule.rs) is fetched
//! as consecutive pieces, sent together, each its own request and checksum-verified, and
//! returned as one [`Chunk`]. Invariant: the pieces of one chunk are of one version —
//! when they are not (the file changed between them) the read is made again whole, in one
//! request; `file_hash` is only ever the server's, from one read that returned the whole
//! file.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use ferry_proto::{
    features, payload, Attr, Class, DirEntry, FileData, FileHash, FileKind, PayloadError, Request,
    Response, StatFs, Status, Version,
};
use tracing::warn;

use super::{Chunk, Client, Listed, SmallFile};
use crate::error::ClientError;

impl Client {
    /// Attributes of `path` (not following a final symlink).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn stat(&self, path: Bytes) -> Result<Attr, ClientError> {
        match self.call(Request::Stat { path }).await? {
            Response::Attr(a) => Ok(a),
            r => Err(unexpected(&r)),
        }
    }

    /// BLAKE3 of the whole regular file at `path`, with the version it was computed over.
    ///
    /// # Errors
    /// As [`Client::call`]; [`ClientError::Protocol`] if the server lacks the HASH feature.
    pub async fn hash(&self, path: Bytes) -> Result<FileHash, ClientError> {
        if self.session().features & features::HASH == 0 {
            return Err(ClientError::Protocol(
                "the server cannot hash files (ferryd too old): upgrade ferryd".into(),
            ));
        }
        match self.call(Request::Hash { path }).await? {
            Response::Hash(h) => Ok(h),
            r => Err(unexpected(&r)),
        }
    }

    /// The server's hash of regular file `path`: the sparse hash (its holes not read, see
    /// `ferry_util::sparse::hash_sparse`) when `sparse` and the server can, else the
    /// BLAKE3 of all its bytes.
    ///
    /// # Errors
    /// As [`Client::hash`].
    pub async fn hash_of(&self, path: Bytes, sparse: bool) -> Result<FileHash, ClientError> {
        if !(sparse && self.can_hash_sparse()) {
            return self.hash(path).await;
        }
        match self.call(Request::HashSparse { path }).await? {
            Response::HashSparse(h) => Ok(h),
            r => Err(unexpected(&r)),
        }
    }

    /// The source's digest of regular file `path`, to check a local copy against: ferryd's
    /// BLAKE3 ([`Client::hash_of`]; sparse when `sparse` and the server can), or an S3
    /// object's checksum or ETag ([`crate::s3`]), with the version it belongs to.
    ///
    /// # Errors
    /// As [`Client::hash`]; every S3 gateway unreachable.
    pub async fn remote_digest(
        &self,
        path: Bytes,
        sparse: bool,
    ) -> Result<crate::digest::RemoteDigest, ClientError> {
        let Some(s3) = self.s3() else {
            let h = self.hash_of(path, sparse).await?;
            return Ok(crate::digest::RemoteDigest {
                version: h.version,
                digest: Some(crate::Digest::blake3(
                    h.blake3,
                    sparse && self.can_hash_sparse(),
                )),
            });
        };
        // Each gateway in turn until one answers.
        let mut last = String::new();
        for endpoint in 0..s3.endpoints() {
            match s3.digest(endpoint, &path).await {
                Ok(Ok((version, digest))) => {
                    return Ok(crate::digest::RemoteDigest { version, digest })
                }
                Ok(Err(Response::Error { status, message })) => {
                    return Err(ClientError::Remote { status, message })
                }
                Ok(Err(r)) => return Err(unexpected(&r)),
                Err(e) => last = e.0,
            }
        }
        Err(ClientError::S3(format!("{}: {last}", s3.label())))
    }

    /// Whether the server answers HashSparse.
    pub fn can_hash_sparse(&self) -> bool {
        self.session().features & features::HASH_SPARSE != 0
    }

    /// The names of `ids` on the server, in order (an empty name: none there). More than
    /// [`ferry_proto::MAX_ID_NAMES`] ids are asked in several requests.
    ///
    /// # Errors
    /// As [`Client::call`]; [`ClientError::Protocol`] if the server lacks the ID_NAMES
    /// feature.
    pub async fn id_names(
        &self,
        ids: &[ferry_proto::Id],
    ) -> Result<Vec<ferry_proto::IdName>, ClientError> {
        if self.session().features & features::ID_NAMES == 0 {
            return Err(ClientError::Protocol(
                "the server cannot name user and group ids (ferryd too old): upgrade ferryd, or use --numeric-ids".into(),
            ));
        }
        let mut out = Vec::with_capacity(ids.len());
        for part in ids.chunks(ferry_proto::MAX_ID_NAMES) {
            match self.call(Request::IdNames { ids: part.to_vec() }).await? {
                Response::IdNames(n) if n.len() == part.len() => out.extend(n),
                r => return Err(unexpected(&r)),
            }
        }
        Ok(out)
    }

    /// Where regular file `path` holds data: its version and its data extents `(offset,
    /// length)` in order (the rest is holes), asked page by page. `None` when the server
    /// lacks the DATA_MAP feature (then treat the whole file as data). A file that changed
    /// between pages is mapped again from the start (up to three times).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn data_map(
        &self,
        path: Bytes,
    ) -> Result<Option<(ferry_proto::Version, Vec<(u64, u64)>)>, ClientError> {
        if self.session().features & features::DATA_MAP == 0 {
            return Ok(None);
        }
        'again: for _ in 0..3 {
            let (mut extents, mut offset, mut version) = (Vec::new(), 0u64, None);
            loop {
                let req = Request::DataMap {
                    path: path.clone(),
                    offset,
                    max_extents: ferry_proto::MAX_DATA_EXTENTS as u32,
                };
                let m = match self.call(req).await? {
                    Response::DataMap(m) => m,
                    r => return Err(unexpected(&r)),
                };
                if version.is_some_and(|v| v != m.version) {
                    continue 'again;
                }
                version = Some(m.version);
                extents.extend(m.extents);
                if m.next >= m.version.size {
                    return Ok(Some((m.version, extents)));
                }
                if m.next <= offset {
                    // No progress: no map (the whole file counts as data).
                    return Ok(None);
                }
                offset = m.next;
            }
        }
        Err(ClientError::Remote {
            status: ferry_proto::Status::Busy,
            message: "the file kept changing while mapped".into(),
        })
    }

    /// The extended attributes of directory `path` and of its entries that have any
    /// (`None` when the server lacks the XATTRS feature): in pages of at most
    /// [`ferry_proto::MAX_DIR_XATTR_BYTES`] when the server has XATTRS_PAGED, else in one.
    ///
    /// # Errors
    /// As [`Client::call`] (`TooLarge` over [`ferry_proto::MAX_DIR_XATTR_BYTES`] in one
    /// entry, or in the whole directory from a server without XATTRS_PAGED).
    pub async fn dir_xattrs(
        &self,
        path: Bytes,
    ) -> Result<Option<Vec<ferry_proto::EntryXattrs>>, ClientError> {
        let features = self.session().features;
        if features & features::XATTRS == 0 {
            return Ok(None);
        }
        if features & features::XATTRS_PAGED == 0 {
            return match self.call(Request::DirXattrs { path }).await? {
                Response::DirXattrs(e) => Ok(Some(e)),
                r => Err(unexpected(&r)),
            };
        }
        let (mut all, mut cookie) = (Vec::new(), 0);
        loop {
            let request = Request::DirXattrsPage {
                path: path.clone(),
                cookie,
            };
            match self.call(request).await? {
                Response::DirXattrsPage { entries, next } => {
                    all.extend(entries);
                    if next == 0 {
                        return Ok(Some(all));
                    }
                    if next == cookie {
                        return Err(ClientError::Protocol(
                            "server sent an extended attributes page that does not advance".into(),
                        ));
                    }
                    cookie = next;
                }
                r => return Err(unexpected(&r)),
            }
        }
    }

    /// Target of the symlink at `path`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn readlink(&self, path: Bytes) -> Result<Bytes, ClientError> {
        match self.call(Request::ReadLink { path }).await? {
            Response::Link(t) => Ok(t),
            r => Err(unexpected(&r)),
        }
    }

    /// File system statistics of the export.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn statfs(&self) -> Result<StatFs, ClientError> {
        match self.call(Request::StatFs).await? {
            Response::StatFs(s) => Ok(s),
            r => Err(unexpected(&r)),
        }
    }

    /// The whole listing of the directory at `path`, fetched page by page. Entry names
    /// are validated: a server sending `..` or a name with `/` is a protocol error.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn read_dir(&self, path: Bytes) -> Result<Vec<DirEntry>, ClientError> {
        self.read_dir_from(path, 0).await
    }

    /// The listing of the directory at `path` after the entry whose cookie is `cookie` (0:
    /// the whole listing), fetched page by page, as [`Client::read_dir`].
    ///
    /// # Errors
    /// As [`Client::read_dir`].
    pub async fn read_dir_from(
        &self,
        path: Bytes,
        mut cookie: u64,
    ) -> Result<Vec<DirEntry>, ClientError> {
        let mut all = Vec::new();
        loop {
            let (entries, eof) = self.read_dir_page(path.clone(), cookie, 4096).await?;
            let progressed = !entries.is_empty();
            if let Some(last) = entries.last() {
                cookie = last.cookie;
            }
            all.extend(entries);
            if eof {
                return Ok(all);
            }
            if !progressed {
                return Err(ClientError::Protocol(
                    "server sent an empty directory page without eof".into(),
                ));
            }
        }
    }

    /// One page of the listing of the directory at `path`: at most `max_entries` entries
    /// after the entry whose cookie is `cookie` (0: from the start), names validated as in
    /// [`Client::read_dir`], and whether the listing ended.
    ///
    /// # Errors
    /// As [`Client::read_dir`].
    pub async fn read_dir_page(
        &self,
        path: Bytes,
        cookie: u64,
        max_entries: u32,
    ) -> Result<(Vec<DirEntry>, bool), ClientError> {
        let request = Request::ReadDir {
            path,
            cookie,
            max_entries,
        };
        let page = match self.call(request).await? {
            Response::DirPage(p) => p,
            r => return Err(unexpected(&r)),
        };
        for e in &page.entries {
            ferry_proto::name::validate_name(&e.name).map_err(ClientError::BadEntryName)?;
        }
        Ok((page.entries, page.eof))
    }

    /// The listings of the directory at `path` and of directories under it, as one page of
    /// the server's gives them (ReadTree): the directory itself first, then subdirectories
    /// of those before, breadth first, each listing whole (a page's last listing, cut short,
    /// is completed with ReadDir). Each with its path under `path` (empty for `path`
    /// itself). A subdirectory whose listing is not here is the caller's to ask for.
    ///
    /// # Errors
    /// As [`Client::read_dir`]; `Unsupported` without the TREE feature; `Protocol` when a
    /// listing in the page is not of a subdirectory listed before it.
    pub async fn read_tree(
        &self,
        path: Bytes,
        max_entries: u32,
    ) -> Result<Vec<(Bytes, Vec<DirEntry>)>, ClientError> {
        self.tree(path, max_entries, true).await
    }

    /// As [`Client::read_tree`], but a subdirectory's listing the page cut short is left
    /// out rather than completed (only that of `path` itself is): one round trip for the
    /// listings that came whole, for a caller that lists the rest when it needs them.
    ///
    /// # Errors
    /// As [`Client::read_tree`].
    pub async fn read_tree_whole(
        &self,
        path: Bytes,
        max_entries: u32,
    ) -> Result<Vec<(Bytes, Vec<DirEntry>)>, ClientError> {
        self.tree(path, max_entries, false).await
    }

    /// A page of ReadTree, its cut listing completed if `complete_below` or it is
    /// `path`'s, else left out.
    async fn tree(
        &self,
        path: Bytes,
        max_entries: u32,
        complete_below: bool,
    ) -> Result<Vec<(Bytes, Vec<DirEntry>)>, ClientError> {
        if self.session().features & features::TREE == 0 {
            return Err(ClientError::Remote {
                status: Status::Unsupported,
                message: "the server does not send a tree's listings".into(),
            });
        }
        let request = Request::ReadTree {
            path: path.clone(),
            max_entries,
        };
        let page = match self.call(request).await? {
            Response::Tree(p) => p,
            r => return Err(unexpected(&r)),
        };
        let mut all = Vec::with_capacity(page.dirs.len());
        for dir in checked_tree(page)? {
            let mut entries = dir.entries;
            if !dir.eof && !complete_below && !dir.rel.is_empty() {
                continue;
            }
            if !dir.eof {
                let full = if dir.rel.is_empty() {
                    path.clone()
                } else {
                    Bytes::from(ferry_proto::name::join(&path, &dir.rel))
                };
                let after = entries.last().map_or(0, |e| e.cookie);
                entries.extend(self.read_dir_from(full, after).await?);
            }
            all.push((dir.rel, entries));
        }
        Ok(all)
    }

    /// One page of directory `path` from `cookie` (at most `max_entries` entries) with the
    /// whole contents of its regular files of 1 to `max_file` bytes, where the server sent
    /// them (ReadDirData; see [`crate::small_file_runs`] for pages that fetch the contents
    /// of a listing already known, several at once). Contents are decoded and verified;
    /// any that fail leave their entry without contents, for the caller to read as usual.
    /// Counted as reads. Returns the entries and whether the listing ended.
    ///
    /// # Errors
    /// As [`Client::read_dir`]; `Unsupported` without the DIR_DATA feature.
    pub async fn read_dir_data(
        &self,
        path: Bytes,
        cookie: u64,
        max_entries: u32,
        max_file: u32,
    ) -> Result<(Vec<Listed>, bool), ClientError> {
        let features = self.session().features;
        if features & features::DIR_DATA == 0 {
            return Err(ClientError::Remote {
                status: Status::Unsupported,
                message: "the server does not send listings with contents".into(),
            });
        }
        let class = if features & features::PRIORITY != 0 {
            self.class
        } else {
            Class::Demand
        };
        let bound = features & features::BOUND != 0;
        let mut failures = 0;
        'page: loop {
            let asked = self.inner.codec.small_files();
            let page = match self
                .call(Request::ReadDirData {
                    path: path.clone(),
                    cookie,
                    max_entries,
                    max_file,
                    compression: asked,
                    class,
                })
                .await?
            {
                Response::DirData(p) => p,
                r => return Err(unexpected(&r)),
            };
            let mut all = Vec::with_capacity(page.entries.len());
            for e in page.entries {
                ferry_proto::name::validate_name(&e.entry.name)
                    .map_err(ClientError::BadEntryName)?;
                let data = match e.data.map(|d| self.small_file(&e.entry, d, asked)) {
                    None => None,
                    Some(Ok(data)) => data,
                    Some(Err(err)) => {
                        self.inner
                            .counters
                            .checksum_failures
                            .fetch_add(1, Ordering::Relaxed);
                        let what = format!(
                            "contents of /{}/{} in a listing: {err}",
                            String::from_utf8_lossy(&path),
                            String::from_utf8_lossy(&e.entry.name)
                        );
                        if !bound {
                            // Only the contents are in doubt: the file is read as usual.
                            warn!("{what}; reading it again");
                            None
                        } else {
                            // Bound: the entry's name and attributes, or the page's request
                            // id, may be what was garbled.
                            failures += 1;
                            if failures >= 3 {
                                return Err(ClientError::Payload(err));
                            }
                            warn!("{what}; fetching the page again");
                            continue 'page;
                        }
                    }
                };
                all.push(Listed {
                    entry: e.entry,
                    data,
                });
            }
            return Ok((all, page.eof));
        }
    }

    /// Decodes and verifies the contents of `entry` from a [`Response::DirData`] page:
    /// `None` when they are not the whole file its attributes describe (the file is then
    /// read as usual), an error when they fail to decode or verify. `asked`: the compression
    /// the page was asked for with.
    fn small_file(
        &self,
        entry: &DirEntry,
        d: FileData,
        asked: ferry_proto::Compression,
    ) -> Result<Option<SmallFile>, PayloadError> {
        if entry.attr.kind != FileKind::File || u64::from(d.decoded_len) != entry.attr.size {
            return Ok(None);
        }
        let wire = d.data.len() as u64;
        let data = payload::decode(d.encoding, d.decoded_len, d.checksum, d.data)?;
        let c = &self.inner.counters;
        c.wire_bytes.fetch_add(wire, Ordering::Relaxed);
        c.decoded_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.codec.delivered(asked, data.len() as u64);
        c.reads.fetch_add(1, Ordering::Relaxed);
        self.inner
            .schedule
            .on_delivered(self.class, data.len() as u64);
        self.inner.codec.offer(&data);
        Ok(Some(SmallFile {
            data,
            blake3: d.blake3,
            wire_len: wire as usize,
        }))
    }

    /// Reads up to `len` bytes (≤ chunk size) at `offset`: decoded and checksum-verified.
    ///
    /// # Errors
    /// As [`Client::call`], and [`ClientError::Payload`] on corruption.
    pub async fn read(
        &self,
        path: Bytes,
        offset: u64,
        len: u32,
    ) -> Result<(Bytes, Version), ClientError> {
        let c = self.read_chunk(path, offset, len).await?;
        Ok((c.data, c.version))
    }

    /// As [`Client::read`], with everything the response carries.
    ///
    /// # Errors
    /// As [`Client::read`].
    pub async fn read_chunk(
        &self,
        path: Bytes,
        offset: u64,
        len: u32,
    ) -> Result<Chunk, ClientError> {
        if self.class == Class::Background {
            let piece = self.inner.schedule.piece();
            if u64::from(len) > piece {
                return self.read_pieces(path, offset, len, piece as u32).await;
            }
        }
        self.read_verified(path, offset, len).await
    }

    /// A background read in pieces of `piece` bytes, sent together (the scheduler admits
    /// them as the background window allows), joined into one chunk.
    async fn read_pieces(
        &self,
        path: Bytes,
        offset: u64,
        len: u32,
        piece: u32,
    ) -> Result<Chunk, ClientError> {
        let mut tasks = tokio::task::JoinSet::new();
        let mut at = 0u32;
        let mut index = 0usize;
        while at < len {
            let n = piece.min(len - at);
            let (me, p) = (self.clone(), path.clone());
            let i = index;
            tasks.spawn(async move { (i, me.read_verified(p, offset + u64::from(at), n).await) });
            at += n;
            index += 1;
        }
        let mut parts: Vec<Option<(Chunk, u32)>> = vec![None; index];
        while let Some(joined) = tasks.join_next().await {
            let (i, r) =
                joined.map_err(|e| ClientError::Protocol(format!("read task failed: {e}")))?;
            // The piece's length asked for, to tell a short (end of file) piece.
            let asked = piece.min(len - piece * i as u32);
            parts[i] = Some((r?, asked));
        }
        let version = parts
            .first()
            .and_then(|p| p.as_ref())
            .map(|(c, _)| c.version);
        if parts
            .iter()
            .any(|p| p.as_ref().map(|(c, _)| c.version) != version)
        {
            // The file changed between pieces: one version, whole.
            return self.read_verified(path, offset, len).await;
        }
        let mut data = Vec::with_capacity(parts.len());
        let mut wire_len = 0;
        for (c, asked) in parts.into_iter().flatten() {
            let short = c.data.len() < asked as usize;
            wire_len += c.wire_len;
            data.push(c.data);
            if short {
                break; // the end of the file
            }
        }
        Ok(Chunk {
            data: crate::chunks::concat(data),
            version: version.unwrap_or_default(),
            wire_len,
            file_hash: None,
        })
    }

    /// One read (one request), fetched again when its payload fails the checksum.
    async fn read_verified(
        &self,
        path: Bytes,
        offset: u64,
        len: u32,
    ) -> Result<Chunk, ClientError> {
        let mut failures = 0;
        loop {
            match self.read_chunk_once(path.clone(), offset, len).await {
                Err(ClientError::Payload(e)) => {
                    self.inner
                        .counters
                        .checksum_failures
                        .fetch_add(1, Ordering::Relaxed);
                    failures += 1;
                    warn!(
                        "read of /{} at {offset}: {e}; fetching it again",
                        String::from_utf8_lossy(&path)
                    );
                    if failures >= 3 {
                        return Err(ClientError::Payload(e));
                    }
                }
                r => return r,
            }
        }
    }

    async fn read_chunk_once(
        &self,
        path: Bytes,
        offset: u64,
        len: u32,
    ) -> Result<Chunk, ClientError> {
        // The class goes on the wire only when the server knows about classes.
        let class = if self.session().features & features::PRIORITY != 0 {
            self.class
        } else {
            Class::Demand
        };
        let asked = self.inner.codec.current();
        let r = match self
            .call(Request::Read {
                path,
                offset,
                len,
                compression: asked,
                class,
            })
            .await?
        {
            Response::Read(r) => r,
            r => return Err(unexpected(&r)),
        };
        if r.decoded_len > len {
            return Err(ClientError::Protocol(format!(
                "server returned {} bytes for a read of {len}",
                r.decoded_len
            )));
        }
        let c = &self.inner.counters;
        c.wire_bytes
            .fetch_add(r.data.len() as u64, Ordering::Relaxed);
        c.decoded_bytes
            .fetch_add(u64::from(r.decoded_len), Ordering::Relaxed);
        self.inner.codec.delivered(asked, u64::from(r.decoded_len));
        c.reads.fetch_add(1, Ordering::Relaxed);
        self.inner
            .schedule
            .on_delivered(self.class, u64::from(r.decoded_len));
        let version = r.version;
        let wire_len = r.data.len();
        let file_hash = r.file_hash;
        let data = payload::decode(r.encoding, r.decoded_len, r.checksum, r.data)?;
        self.inner.codec.offer(&data);
        Ok(Chunk {
            data,
            version,
            wire_len,
            file_hash,
        })
    }
}

/// A response of the wrong kind for its request.
fn unexpected(r: &Response) -> ClientError {
    ClientError::Protocol(format!("unexpected response kind 0x{:02x}", r.kind()))
}

/// The listings of a tree page, checked: the first is of the directory asked for, each
/// later one of a subdirectory listed before it (once), every name a valid name, and only
/// the last cut short (with at least one entry). A server that breaks this could make a
/// walk create a directory it never listed, or loop.
fn checked_tree(page: ferry_proto::TreePage) -> Result<Vec<ferry_proto::TreeDir>, ClientError> {
    let last = page.dirs.len().checked_sub(1).ok_or_else(|| {
        ClientError::Protocol("a tree page without the directory asked for".into())
    })?;
    let mut expected: HashSet<Bytes> = HashSet::new();
    for (i, dir) in page.dirs.iter().enumerate() {
        let fits = if i == 0 {
            dir.rel.is_empty()
        } else {
            expected.remove(&dir.rel)
        };
        if !fits {
            return Err(ClientError::Protocol(format!(
                "a tree page listed {:?}, which is not a subdirectory listed before it",
                String::from_utf8_lossy(&dir.rel)
            )));
        }
        if !dir.eof && (i != last || dir.entries.is_empty()) {
            return Err(ClientError::Protocol(
                "a tree page cut short a listing before its last, or one with no entries".into(),
            ));
        }
        for e in &dir.entries {
            ferry_proto::name::validate_name(&e.name).map_err(ClientError::BadEntryName)?;
            if e.attr.kind == FileKind::Directory {
                expected.insert(Bytes::from(ferry_proto::name::join(&dir.rel, &e.name)));
            }
        }
    }
    Ok(page.dirs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may panic on setup failures

    use super::*;
    use crate::ClientConfig;

    /// A client of the ferryd at `addr` with `streams` streams.
    async fn connect(addr: String, streams: usize) -> Client {
        Client::connect(ClientConfig {
            addr,
            streams,
            ..Default::default()
        })
        .await
        .unwrap()
    }

    /// An in-process ferryd serving `dir` until the returned sender is dropped; its address.
    async fn serve(dir: &std::path::Path) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let config = ferry_server::ServerConfig {
            export: dir.to_path_buf(),
            ..Default::default()
        };
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(ferry_server::run(listener, config, async {
            let _ = rx.await;
        }));
        (addr, stop)
    }

    fn dir_entry(name: &str, kind: FileKind) -> DirEntry {
        DirEntry {
            name: Bytes::copy_from_slice(name.as_bytes()),
            cookie: 1,
            attr: Attr {
                kind,
                ..Attr::bare_directory(1, 0, 0)
            },
        }
    }

    fn tree_dir(rel: &str, entries: Vec<DirEntry>, eof: bool) -> ferry_proto::TreeDir {
        ferry_proto::TreeDir {
            rel: Bytes::copy_from_slice(rel.as_bytes()),
            entries,
            eof,
        }
    }

    #[test]
    fn a_tree_page_is_taken_only_as_listings_of_directories_it_announced() {
        let page = |dirs| ferry_proto::TreePage { dirs };
        let top = || {
            vec![
                dir_entry("a", FileKind::Directory),
                dir_entry("f", FileKind::File),
                dir_entry("l", FileKind::Symlink),
            ]
        };
        let good = page(vec![
            tree_dir("", top(), true),
            tree_dir("a", vec![dir_entry("b", FileKind::Directory)], true),
            tree_dir("a/b", vec![dir_entry("x", FileKind::File)], false),
        ]);
        assert_eq!(checked_tree(good).unwrap().len(), 3);
        for (bad, why) in [
            (page(vec![]), "empty"),
            (
                page(vec![tree_dir("a", top(), true)]),
                "first is not the one asked",
            ),
            (
                page(vec![
                    tree_dir("", top(), true),
                    tree_dir("../etc", vec![], true),
                ]),
                "out of the tree",
            ),
            (
                page(vec![tree_dir("", top(), true), tree_dir("f", vec![], true)]),
                "a file listed as a directory",
            ),
            (
                page(vec![tree_dir("", top(), true), tree_dir("l", vec![], true)]),
                "a symlink listed through",
            ),
            (
                page(vec![
                    tree_dir("", top(), true),
                    tree_dir("a", vec![], true),
                    tree_dir("a", vec![], true),
                ]),
                "listed twice",
            ),
            (
                page(vec![
                    tree_dir("", top(), false),
                    tree_dir("a", vec![], true),
                ]),
                "cut short before the last",
            ),
            (
                page(vec![tree_dir("", vec![], false)]),
                "cut short with nothing",
            ),
            (
                page(vec![tree_dir(
                    "",
                    vec![dir_entry("x/y", FileKind::File)],
                    true,
                )]),
                "a name with a slash",
            ),
        ] {
            assert!(checked_tree(bad).is_err(), "{why}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tree_larger_than_a_page_comes_as_whole_listings() {
        let dir = tempfile::tempdir().unwrap();
        // More entries than a page holds, then directories under them.
        for i in 0..6000 {
            std::fs::write(dir.path().join(format!("f{i:05}")), b"x").unwrap();
        }
        std::fs::create_dir_all(dir.path().join("d/e")).unwrap();
        let (addr, _stop) = serve(dir.path()).await;
        let client = connect(addr, 1).await;
        let tree = client.read_tree(Bytes::new(), 16384).await.unwrap();
        // The root, cut short and completed; its subdirectories are the caller's to ask.
        assert_eq!(tree.len(), 1);
        assert_eq!(tree[0].1.len(), 6001);
        let tree = client
            .read_tree(Bytes::from_static(b"d"), 16384)
            .await
            .unwrap();
        let rels: Vec<&[u8]> = tree.iter().map(|(r, _)| &r[..]).collect();
        assert_eq!(rels, [&b""[..], b"e"]);
        assert_eq!(tree[0].1.len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tree_s_whole_listings_leave_out_a_subdirectory_s_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        for (sub, n) in [("a", 3), ("b", 4)] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
            for i in 0..n {
                std::fs::write(dir.path().join(sub).join(format!("f{i}")), b"x").unwrap();
            }
        }
        let (addr, _stop) = serve(dir.path()).await;
        let client = connect(addr, 1).await;
        // Room for the root's 2 entries, one of its listings (3 or 4, whichever the server
        // lists first) and part of the other.
        let completed = client.read_tree(Bytes::new(), 8).await.unwrap();
        let whole = client.read_tree_whole(Bytes::new(), 8).await.unwrap();
        let sizes = |t: &[(Bytes, Vec<DirEntry>)]| -> Vec<(Vec<u8>, usize)> {
            t.iter().map(|(r, e)| (r.to_vec(), e.len())).collect()
        };
        assert_eq!(completed.len(), 3, "{:?}", sizes(&completed));
        assert!(completed.iter().all(|(r, e)| e.len()
            == match &r[..] {
                b"" => 2,
                b"a" => 3,
                _ => 4,
            }));
        // The one cut short is left out; the rest as read_tree gives them.
        assert_eq!(whole.len(), 2, "{:?}", sizes(&whole));
        assert_eq!(sizes(&whole), sizes(&completed[..2]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_in_pieces_is_the_same_bytes_as_one_read_without_a_file_hash() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(300 << 10) + 5)
            .map(|i: usize| (i * 11 + i / 777) as u8)
            .collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let (addr, _stop) = serve(dir.path()).await;
        let client = connect(addr, 2).await.background();
        let path = Bytes::from_static(b"f");
        let whole = client
            .read_verified(path.clone(), 0, 1 << 20)
            .await
            .unwrap();
        assert_eq!(&whole.data[..], &data[..]);
        assert!(
            whole.file_hash.is_some(),
            "one read returned the whole file"
        );
        // Uneven pieces, past the end of the file, from an offset.
        for (offset, len, piece) in [(0, 1 << 20, 16 << 10), (4096, 200 << 10, 48 << 10)] {
            let c = client
                .read_pieces(path.clone(), offset, len, piece)
                .await
                .unwrap();
            let end = (offset + u64::from(len)).min(data.len() as u64) as usize;
            assert_eq!(&c.data[..], &data[offset as usize..end]);
            assert_eq!(c.version, whole.version);
            assert!(c.file_hash.is_none());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_server_reports_its_cpus_and_auto_measures_the_link() {
        let dir = tempfile::tempdir().unwrap();
        // Compressible rows, 16 MiB: enough windows of traffic for auto to measure.
        let row = b"42\tcharlie\t17.50\t2026-11-24\n";
        let data: Vec<u8> = row.iter().copied().cycle().take(16 << 20).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let (addr, _stop) = serve(dir.path()).await;
        let client = connect(addr, 2).await;
        match client.call(Request::Load).await.unwrap() {
            Response::Load(l) => {
                assert!(l.cores >= 1, "{l:?}");
                assert!(l.idle_permille <= u32::from(l.cores) * 1000 + 50, "{l:?}");
                assert!(l.link.is_some(), "LINK_LIMITS negotiated: {l:?}");
            }
            r => panic!("{r:?}"),
        }
        assert_eq!(client.compression().choice, crate::CompressionChoice::Auto);
        let path = Bytes::from_static(b"f");
        let data = Bytes::from(data);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        // Four readers, each reading one chunk after another, so requests are outstanding
        // at nearly every look: a window counts for the link only then, and one reader's
        // gaps between its reads kept every window from counting on a loaded machine.
        let mut readers = tokio::task::JoinSet::new();
        for r in 0..4u64 {
            let (client, path, data) = (client.clone(), path.clone(), data.clone());
            readers.spawn(async move {
                let mut offset = r << 20;
                while client.compression().link.is_none() && std::time::Instant::now() < deadline {
                    let c = client
                        .read_verified(path.clone(), offset, 1 << 20)
                        .await
                        .unwrap();
                    assert_eq!(&c.data[..], &data[offset as usize..][..c.data.len()]);
                    offset = (offset + (4 << 20)) % data.len() as u64;
                }
            });
        }
        while let Some(r) = readers.join_next().await {
            r.unwrap();
        }
        let z = client.compression();
        assert!(z.link.is_some_and(|l| l > 0.0), "{z:?}");
        assert!(z.ratio > 4.0, "rows compress: {z:?}");
    }
}
