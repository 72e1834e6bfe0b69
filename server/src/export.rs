//! The exported directory: every access is confined beneath it by the kernel.
//!
//! Paths from clients are first checked by [`ferry_proto::name::validate_path`], then
//! resolved with `openat2(root, path, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`: the kernel
//! refuses any `..` escape and any symlink in any component, so no link — not even one
//! swapped in between two requests — can lead outside the export. Symlinks themselves are
//! reported (`lstat`) and their targets returned as data, never followed.
//!
//! Everything here is blocking; the connection handler runs it on tokio's blocking pool.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use bytes::Bytes;
use ferry_proto::name::{validate_path, NameError};
use ferry_proto::{
    Attr, Compression, DataEntry, DataMap, DataPage, DirEntry, DirPage, EntryXattrs, FileData,
    FileKind, StatFs, Status, Timestamp, TreeDir, TreePage, Version,
};
use rustix::fs::{
    AtFlags, FileType, Mode, OFlags, ResolveFlags, Statx, StatxFlags, StatxTimestamp,
};
use rustix::io::Errno;

/// A failed operation: a protocol status and a detail for the log / client message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    /// Status sent to the client.
    pub status: Status,
    /// Detail (no server paths beyond the export-relative one).
    pub message: String,
}

impl OpError {
    pub(crate) fn new(status: Status, message: impl Into<String>) -> Self {
        OpError {
            status,
            message: message.into(),
        }
    }
}

/// Maps an OS error to a protocol status. Every errno not listed is an I/O error.
pub(crate) fn status_of(e: Errno) -> Status {
    match e {
        Errno::NOENT => Status::NotFound,
        Errno::NOTDIR => Status::NotDirectory,
        Errno::ISDIR => Status::IsDirectory,
        Errno::ACCESS | Errno::PERM => Status::PermissionDenied,
        // RESOLVE_NO_SYMLINKS reports a symlink component as ELOOP.
        Errno::LOOP => Status::SymlinkInPath,
        // RESOLVE_BENEATH reports an escape attempt as EXDEV.
        Errno::XDEV => Status::InvalidName,
        Errno::NAMETOOLONG => Status::NameTooLong,
        _ => Status::Io,
    }
}

fn op_err(e: Errno, what: &str, path: &[u8]) -> OpError {
    OpError::new(
        status_of(e),
        format!("{what} {:?}: {e}", String::from_utf8_lossy(path)),
    )
}

/// The exported directory, held open by descriptor so renaming or replacing the path
/// after start-up cannot redirect the server.
#[derive(Debug)]
pub struct Export {
    root: OwnedFd,
    /// The root was found removed (logged once).
    vanished: std::sync::atomic::AtomicBool,
}

/// `statx` of an open descriptor (the object itself, never a symlink's target): the basic
/// fields and the birth time.
pub(crate) fn fstatx(fd: impl AsFd) -> rustix::io::Result<Statx> {
    rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, STATX_WANTED)
}

/// What every `statx` asks for.
const STATX_WANTED: StatxFlags = StatxFlags::BASIC_STATS.union(StatxFlags::BTIME);

/// Converts a `statx` result to protocol attributes (the birth time is 0 where the file
/// system does not report one).
pub(crate) fn attr_of(st: &Statx) -> Attr {
    let kind = match FileType::from_raw_mode(u32::from(st.stx_mode)) {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Directory,
        FileType::Symlink => FileKind::Symlink,
        FileType::Fifo => FileKind::Fifo,
        FileType::CharacterDevice => FileKind::CharDevice,
        FileType::BlockDevice => FileKind::BlockDevice,
        FileType::Socket => FileKind::Socket,
        FileType::Unknown => FileKind::File,
    };
    let ts = |t: &StatxTimestamp| Timestamp {
        sec: t.tv_sec,
        nsec: t.tv_nsec.min(999_999_999),
    };
    let btime = if st.stx_mask & StatxFlags::BTIME.bits() != 0 {
        ts(&st.stx_btime)
    } else {
        Timestamp::default()
    };
    Attr {
        ino: st.stx_ino,
        kind,
        perm: st.stx_mode & 0o7777,
        nlink: st.stx_nlink,
        uid: st.stx_uid,
        gid: st.stx_gid,
        rdev: rustix::fs::makedev(st.stx_rdev_major, st.stx_rdev_minor),
        size: st.stx_size,
        blocks: st.stx_blocks,
        atime: ts(&st.stx_atime),
        mtime: ts(&st.stx_mtime),
        ctime: ts(&st.stx_ctime),
        btime,
    }
}

/// Largest encoded size of one directory entry in a page.
pub(crate) const MAX_DIRENT_WIRE_LEN: usize = dirent_wire_len(ferry_proto::name::MAX_NAME_LEN);

/// Encoded bytes of a directory entry whose name is `name_len` bytes long (name, cookie,
/// attributes), as in every listing page.
const fn dirent_wire_len(name_len: usize) -> usize {
    2 + name_len + 8 + Attr::LEN
}

impl Export {
    /// Opens `dir` as the export root.
    ///
    /// # Errors
    /// The path does not exist, is not a directory, or cannot be opened.
    pub fn open(dir: &Path) -> std::io::Result<Export> {
        let root = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| std::io::Error::other(format!("cannot open export {}: {e}", dir.display())))?;
        Ok(Export {
            root,
            vanished: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Fails when the exported directory was removed on the server: the directory opened
    /// at start-up is then empty for good (a directory made at the same path since is
    /// another one), which must not pass for an empty export. Logged once.
    fn check_root(&self) -> Result<(), OpError> {
        let gone = rustix::fs::fstat(&self.root).is_ok_and(|st| st.st_nlink == 0);
        if !gone {
            return Ok(());
        }
        let why = "the export directory was removed on the server; ferryd serves the directory it opened at start-up: restart ferryd to export the one at that path now";
        if !self
            .vanished
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::error!("{why}");
        }
        Err(OpError::new(Status::Io, why))
    }

    /// Resolves `path` beneath the root. A final symlink is opened as the link itself
    /// only with `O_PATH | O_NOFOLLOW`; any other symlink component fails with ELOOP.
    fn open_beneath(&self, path: &[u8], flags: OFlags) -> Result<OwnedFd, OpError> {
        validate_path(path).map_err(|e| {
            let status = match e {
                NameError::TooLong => Status::NameTooLong,
                NameError::Empty | NameError::Dot | NameError::BadByte => Status::InvalidName,
            };
            OpError::new(status, format!("{:?}: {e}", String::from_utf8_lossy(path)))
        })?;
        if path.is_empty() {
            self.check_root()?;
        }
        let p: &[u8] = if path.is_empty() { b"." } else { path };
        rustix::fs::openat2(
            &self.root,
            p,
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| {
            if e == Errno::NOENT {
                if let Err(gone) = self.check_root() {
                    return gone;
                }
            }
            op_err(e, "open", path)
        })
    }

    /// `lstat` of `path`.
    ///
    /// # Errors
    /// Invalid or escaping path, missing object, symlink in a parent component.
    pub fn stat(&self, path: &[u8]) -> Result<Attr, OpError> {
        let fd = self.open_beneath(path, OFlags::PATH)?;
        let st = fstatx(&fd).map_err(|e| op_err(e, "stat", path))?;
        Ok(attr_of(&st))
    }

    /// Target of the symlink at `path`.
    ///
    /// # Errors
    /// As [`Export::stat`]; `InvalidArgument` when it is not a symlink.
    pub fn readlink(&self, path: &[u8]) -> Result<Bytes, OpError> {
        let fd = self.open_beneath(path, OFlags::PATH)?;
        let target = rustix::fs::readlinkat(&fd, c"", Vec::new()).map_err(|e| match e {
            Errno::NOENT | Errno::INVAL => OpError::new(Status::InvalidArgument, "not a symlink"),
            e => op_err(e, "readlink", path),
        })?;
        Ok(Bytes::from(target.into_bytes()))
    }

    /// Statistics of the file system holding the export.
    ///
    /// # Errors
    /// `statvfs` failed.
    pub fn statfs(&self) -> Result<StatFs, OpError> {
        let s = rustix::fs::fstatvfs(&self.root).map_err(|e| op_err(e, "statfs", b""))?;
        Ok(StatFs {
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            bsize: s.f_bsize as u32,
            namelen: s.f_namemax as u32,
            frsize: s.f_frsize as u32,
        })
    }

    /// One page of the directory at `path`, starting after `cookie` (0 = start).
    ///
    /// # Errors
    /// As [`Export::stat`]; `NotDirectory` when it is not a directory.
    pub fn read_dir(
        &self,
        path: &[u8],
        cookie: u64,
        max_entries: usize,
    ) -> Result<DirPage, OpError> {
        let mut entries = Vec::new();
        let eof = self.list(path, cookie, max_entries, |_, entry| {
            entries.push(entry);
            Ok(true)
        })?;
        Ok(DirPage { entries, eof })
    }

    /// One page of directory `path` with the whole contents of its regular files of 1 to
    /// `page.max_file` bytes, the page's encoded size kept within `page.max_bytes`. A file
    /// that changes while read, is replaced, or cannot be read is listed without its data
    /// (the client then reads it).
    ///
    /// # Errors
    /// As [`Export::read_dir`].
    pub fn read_dir_data(
        &self,
        path: &[u8],
        cookie: u64,
        page: DataPageLimits,
    ) -> Result<DataPage, OpError> {
        let DataPageLimits {
            max_entries,
            max_file,
            max_bytes,
            compression,
            uncached,
        } = page;
        // 5 bytes of page header, then per entry its listing fields, the data flag and,
        // with data, 49 bytes of fields before the (at most raw-sized) bytes.
        let mut used = 5;
        let mut entries = Vec::new();
        let eof = self.list(path, cookie, max_entries, |dirfd, entry| {
            let mut need = dirent_wire_len(entry.name.len()) + 1;
            let wanted = entry.attr.kind == FileKind::File
                && entry.attr.size > 0
                && entry.attr.size <= max_file;
            if wanted {
                need += 49 + entry.attr.size as usize;
            }
            if used + need > max_bytes && !entries.is_empty() {
                return Ok(false); // the next page starts with this entry
            }
            let data = if wanted && used + need <= max_bytes {
                small_file(dirfd, &entry, compression, uncached)
            } else {
                None
            };
            let entry = match &data {
                Some((attr, _)) => DirEntry {
                    attr: *attr,
                    ..entry
                },
                None => entry,
            };
            used += dirent_wire_len(entry.name.len()) + 1;
            if let Some((_, d)) = &data {
                used += 49 + d.data.len();
            }
            entries.push(DataEntry {
                entry,
                data: data.map(|(_, d)| d),
            });
            Ok(true)
        })?;
        Ok(DataPage { entries, eof })
    }

    /// The listings of directory `path` and of the directories under it, breadth first
    /// (each in listing order), at most `max_entries` entries and about `max_bytes` encoded
    /// in all. The page ends with the first listing that does not fit whole (its `eof`
    /// false, at least one entry of it in the page). A subdirectory that cannot be listed
    /// (gone, no permission, its path too long) is left out: the client asks for it itself
    /// and hears why.
    ///
    /// # Errors
    /// As [`Export::read_dir`], for `path` itself.
    pub fn read_tree(
        &self,
        path: &[u8],
        max_entries: usize,
        max_bytes: usize,
    ) -> Result<TreePage, OpError> {
        let mut dirs: Vec<TreeDir> = Vec::new();
        let mut queue = std::collections::VecDeque::from([Bytes::new()]);
        // The page's directory count, then per directory its path, eof and entry count.
        let mut used = 4;
        let mut count = 0;
        // What the queued directories' headers alone will take: none is queued that the
        // page could not hold, so the queue's paths stay within the page's bytes too
        // (thousands of deep paths would otherwise be held unbudgeted while it is built).
        let mut queued = 0;
        let mut queue_closed = false;
        let head_of = |rel: &[u8]| 2 + rel.len() + 1 + 4;
        while let Some(rel) = queue.pop_front() {
            queued -= head_of(&rel).min(queued);
            let full = if rel.is_empty() {
                Bytes::copy_from_slice(path)
            } else {
                Bytes::from(ferry_proto::name::join(path, &rel))
            };
            if full.len() >= ferry_proto::name::MAX_PATH_LEN {
                continue;
            }
            let head = head_of(&rel);
            if count >= max_entries || (!dirs.is_empty() && used + head > max_bytes) {
                break;
            }
            let first = dirs.is_empty();
            let mut entries = Vec::new();
            let mut taken = head;
            let listed = self.list(&full, 0, max_entries - count, |_, entry| {
                let need = dirent_wire_len(entry.name.len());
                // The first entry of the page goes in whatever its size: a page makes
                // progress.
                if used + taken + need > max_bytes && !(first && entries.is_empty()) {
                    return Ok(false);
                }
                taken += need;
                entries.push(entry);
                Ok(true)
            });
            let eof = match listed {
                Ok(eof) => eof,
                Err(e) if first => return Err(e),
                Err(_) => continue,
            };
            if !eof && entries.is_empty() {
                break;
            }
            used += taken;
            count += entries.len();
            for e in entries
                .iter()
                .filter(|e| e.attr.kind == FileKind::Directory)
            {
                let child = Bytes::from(ferry_proto::name::join(&rel, &e.name));
                queue_closed = queue_closed || used + queued + head_of(&child) > max_bytes;
                if queue_closed {
                    break;
                }
                queued += head_of(&child);
                queue.push_back(child);
            }
            dirs.push(TreeDir { rel, entries, eof });
            if !eof {
                break;
            }
        }
        Ok(TreePage { dirs })
    }

    /// Lists directory `path` from `cookie`, at most `max_entries` entries, each with its
    /// attributes (`lstat`), handed to `each` with the directory's fd; `each` returns false
    /// to end the page before that entry. Returns whether the listing reached its end.
    fn list(
        &self,
        path: &[u8],
        cookie: u64,
        max_entries: usize,
        mut each: impl FnMut(&OwnedFd, DirEntry) -> Result<bool, OpError>,
    ) -> Result<bool, OpError> {
        let fd = self.open_beneath(path, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let dirfd = fd
            .try_clone()
            .map_err(|e| OpError::new(Status::Io, format!("dup: {e}")))?;
        let mut dir = rustix::fs::Dir::new(fd).map_err(|e| op_err(e, "opendir", path))?;
        if cookie != 0 {
            dir.seek(cookie as i64)
                .map_err(|e| op_err(e, "seekdir", path))?;
        }
        let mut taken = 0;
        while let Some(item) = dir.read() {
            let ent = item.map_err(|e| op_err(e, "readdir", path))?;
            let name = ent.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if taken >= max_entries {
                return Ok(false);
            }
            // statat on a single validated name with AT_SYMLINK_NOFOLLOW: no traversal.
            let entry = match rustix::fs::statx(
                &dirfd,
                ent.file_name(),
                AtFlags::SYMLINK_NOFOLLOW,
                STATX_WANTED,
            ) {
                Ok(st) => DirEntry {
                    name: Bytes::copy_from_slice(name),
                    cookie: ent.offset() as u64,
                    attr: attr_of(&st),
                },
                // Removed between readdir and stat: it is simply not listed.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(op_err(e, "stat entry in", path)),
            };
            if !each(&dirfd, entry)? {
                return Ok(false);
            }
            taken += 1;
        }
        Ok(true)
    }

    /// Opens a regular file for reading. Non-regular files are refused before they are
    /// opened for reading, so a FIFO or device is never opened (which could block or
    /// have side effects).
    ///
    /// # Errors
    /// As [`Export::stat`]; `IsDirectory` / `InvalidArgument` for non-regular files.
    pub fn open_file(&self, path: &[u8]) -> Result<(File, Attr), OpError> {
        let probe = self.stat(path)?;
        match probe.kind {
            FileKind::File => {}
            FileKind::Directory => return Err(OpError::new(Status::IsDirectory, "is a directory")),
            _ => return Err(OpError::new(Status::InvalidArgument, "not a regular file")),
        }
        let fd = self.open_beneath(path, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)?;
        let st = fstatx(&fd).map_err(|e| op_err(e, "stat", path))?;
        let attr = attr_of(&st);
        if attr.kind != FileKind::File {
            // Replaced by something else between the two steps.
            return Err(OpError::new(Status::InvalidArgument, "not a regular file"));
        }
        Ok((File::from(fd), attr))
    }
}

/// The extended attributes of the object `fd` refers to (opened for reading): `(name,
/// value)` pairs; none where the file system has none. `budget` is what may still be used
/// (names and values); going over it fails with `TooLarge`.
fn fd_xattrs(
    fd: &OwnedFd,
    path: &[u8],
    budget: &mut usize,
) -> Result<Vec<(Bytes, Bytes)>, OpError> {
    use std::os::unix::ffi::OsStrExt;
    let (mut small, mut large) = ([0u8; ferry_util::xattr::SMALL], Vec::new());
    let names =
        match ferry_util::xattr::names(&mut small, &mut large, |b| rustix::fs::flistxattr(fd, b)) {
            Ok(n) => n,
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(op_err(e, "listxattr", path)),
        };
    let mut out = Vec::new();
    if names.is_empty() {
        return Ok(out);
    }
    let mut value = vec![0u8; 64 << 10];
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let m = match rustix::fs::fgetxattr(fd, std::ffi::OsStr::from_bytes(name), &mut value[..]) {
            Ok(m) => m,
            // Removed since it was listed, or not readable by this process.
            Err(Errno::NODATA | Errno::ACCESS | Errno::PERM) => continue,
            Err(e) => return Err(op_err(e, "getxattr", path)),
        };
        let cost = name.len() + m + 8;
        if cost > *budget {
            return Err(OpError::new(
                Status::TooLarge,
                format!(
                    "{:?}: extended attributes in one directory over what one response holds \
                     ({} bytes, or the session's frame)",
                    String::from_utf8_lossy(path),
                    ferry_proto::MAX_DIR_XATTR_BYTES
                ),
            ));
        }
        *budget -= cost;
        out.push((
            Bytes::copy_from_slice(name),
            Bytes::copy_from_slice(&value[..m]),
        ));
    }
    Ok(out)
}

impl Export {
    /// The extended attributes of directory `path` itself (empty name) and of its regular
    /// files, directories and FIFOs that have any (symlinks and devices are not opened),
    /// at most `max_bytes` encoded (the session's frame less its header) and at most
    /// [`ferry_proto::MAX_DIR_XATTR_BYTES`].
    ///
    /// # Errors
    /// As [`Export::read_dir`]; `TooLarge` over the budget.
    pub fn dir_xattrs(&self, path: &[u8], max_bytes: usize) -> Result<Vec<EntryXattrs>, OpError> {
        Ok(self.xattrs_from(path, 0, max_bytes, false)?.0)
    }

    /// One page of [`Export::dir_xattrs`] from `cookie` (0: the directory's own attributes
    /// first): the entries until the next one's would pass `max_bytes` encoded (at most
    /// [`ferry_proto::MAX_DIR_XATTR_BYTES`]), and the cookie the next page starts from (0:
    /// the directory is done).
    ///
    /// # Errors
    /// As [`Export::read_dir`]; `TooLarge` only when one entry's attributes (with the
    /// directory's own, on the first page) pass the limit alone.
    pub fn dir_xattrs_page(
        &self,
        path: &[u8],
        cookie: u64,
        max_bytes: usize,
    ) -> Result<(Vec<EntryXattrs>, u64), OpError> {
        self.xattrs_from(path, cookie, max_bytes, true)
    }

    /// At most `max_bytes` encoded (and [`ferry_proto::MAX_DIR_XATTR_BYTES`]) from `cookie`:
    /// [`Export::dir_xattrs`] (not `paged`: `TooLarge` over the limit) or
    /// [`Export::dir_xattrs_page`] (`paged`: the page ends before the entry that passes it).
    fn xattrs_from(
        &self,
        path: &[u8],
        cookie: u64,
        max_bytes: usize,
        paged: bool,
    ) -> Result<(Vec<EntryXattrs>, u64), OpError> {
        // Each attribute's name and value with 8 bytes for its framing (fd_xattrs); each
        // entry's name and 4 bytes for its own (below); 16 for the page's.
        let mut budget = max_bytes
            .min(ferry_proto::MAX_DIR_XATTR_BYTES)
            .saturating_sub(16);
        let mut out = Vec::new();
        if cookie == 0 {
            let me = self.open_beneath(path, OFlags::RDONLY | OFlags::DIRECTORY)?;
            let attrs = fd_xattrs(&me, path, &mut budget)?;
            if !attrs.is_empty() {
                out.push(EntryXattrs {
                    name: Bytes::new(),
                    attrs,
                });
            }
        }
        // The position after the last entry done, and where the next page starts.
        let (mut last, mut next) = (cookie, 0);
        self.list(path, cookie, usize::MAX, |dirfd, entry| {
            let before = std::mem::replace(&mut last, entry.cookie);
            let flags = match entry.attr.kind {
                FileKind::File | FileKind::Fifo => {
                    OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY
                }
                FileKind::Directory => OFlags::RDONLY | OFlags::DIRECTORY,
                _ => return Ok(true),
            };
            // One validated name, not followed: no traversal.
            let fd = match rustix::fs::openat(
                dirfd,
                entry.name.as_ref(),
                flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                // Gone or replaced (by a symlink) since listed, or not readable: none.
                Err(_) => return Ok(true),
            };
            let framed = fd_xattrs(&fd, path, &mut budget).and_then(|a| {
                let entry = if a.is_empty() {
                    0
                } else {
                    entry.name.len() + 4
                };
                if entry > budget {
                    return Err(OpError::new(Status::TooLarge, "page full"));
                }
                budget -= entry;
                Ok(a)
            });
            let attrs = match framed {
                Ok(a) => a,
                // This entry starts the next page; the page's first entry (with the
                // directory's own attributes on the first page) cannot move: too large.
                Err(e) if paged && e.status == Status::TooLarge && before != cookie => {
                    next = before;
                    return Ok(false);
                }
                Err(e) => return Err(e),
            };
            if !attrs.is_empty() {
                out.push(EntryXattrs {
                    name: entry.name,
                    attrs,
                });
            }
            Ok(true)
        })?;
        Ok((out, next))
    }

    /// Where regular file `path` holds data from `offset` on: at most `max` extents, found
    /// with `SEEK_DATA`/`SEEK_HOLE` over one unchanged version (the version is compared
    /// before and after; mapped again up to three times, then `Busy`). A file system without
    /// holes reports one extent for the whole file.
    ///
    /// # Errors
    /// As [`Export::open_file`]; `Busy` for a file that keeps changing.
    pub fn data_map(&self, path: &[u8], offset: u64, max: usize) -> Result<DataMap, OpError> {
        use rustix::fs::SeekFrom;
        let (file, _) = self.open_file(path)?;
        let stat = |f: &File| {
            fstatx(f)
                .map(|st| attr_of(&st))
                .map_err(|e| op_err(e, "stat", path))
        };
        for _ in 0..3 {
            let before = stat(&file)?;
            let size = before.size;
            let (mut extents, mut pos, mut next) = (Vec::new(), offset.min(size), size);
            while pos < size {
                if extents.len() >= max.max(1) {
                    next = pos;
                    break;
                }
                let data = match rustix::fs::seek(&file, SeekFrom::Data(pos)) {
                    Ok(d) => d,
                    Err(Errno::NXIO) => break,
                    Err(e) => return Err(op_err(e, "seek data in", path)),
                };
                if data >= size {
                    break;
                }
                let hole = rustix::fs::seek(&file, SeekFrom::Hole(data))
                    .map_err(|e| op_err(e, "seek hole in", path))?
                    .min(size);
                extents.push((data, hole - data));
                pos = hole;
            }
            if stat(&file)?.version() == before.version() {
                return Ok(DataMap {
                    version: before.version(),
                    extents,
                    next,
                });
            }
        }
        Err(OpError::new(
            Status::Busy,
            format!(
                "{:?} kept changing while mapped",
                String::from_utf8_lossy(path)
            ),
        ))
    }
}

/// The bounds and options of one page of [`Export::read_dir_data`].
#[derive(Debug, Clone, Copy)]
pub struct DataPageLimits {
    /// Most entries in the page.
    pub max_entries: usize,
    /// Regular files of 1 to this many bytes come with their contents.
    pub max_file: u64,
    /// Most encoded bytes in the page.
    pub max_bytes: usize,
    /// How contents may be compressed.
    pub compression: Compression,
    /// Read without keeping the pages in the page cache (background reads).
    pub uncached: bool,
}

/// The whole contents of small regular file `entry` of directory `dirfd`, with the
/// attributes of the file they were read from; `None` when it is no longer the regular file
/// listed (replaced, or a symlink now), changed while read, or cannot be read (the client
/// then reads it with Read and sees why).
fn small_file(
    dirfd: &OwnedFd,
    entry: &DirEntry,
    compression: Compression,
    uncached: bool,
) -> Option<(Attr, FileData)> {
    // O_NOFOLLOW and O_NONBLOCK: a name swapped for a symlink or a FIFO since the listing
    // is neither followed nor waited on; only the file whose inode was listed is read.
    let fd = rustix::fs::openat(
        dirfd,
        entry.name.as_ref(),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let attr = attr_of(&fstatx(&fd).ok()?);
    if attr.kind != FileKind::File || attr.version() != entry.attr.version() {
        return None;
    }
    let (data, attr) = read_at(&File::from(fd), attr, 0, attr.size as usize, uncached).ok()?;
    if data.len() as u64 != attr.size {
        return None;
    }
    let checksum = ferry_proto::payload::checksum(&data);
    let blake3 = *blake3::hash(&data).as_bytes();
    let decoded_len = data.len() as u32;
    let lane = ferry_proto::payload::Lane::of(uncached);
    let (encoding, data) = ferry_proto::payload::encode(data, compression, lane);
    Some((
        attr,
        FileData {
            encoding,
            decoded_len,
            checksum,
            blake3,
            data,
        },
    ))
}

/// Reads up to `len` bytes at `offset`, short only at end of file. Returns the bytes and
/// the attributes of the file they came from; if the file changes during the read
/// (size or mtime moves), the read is repeated so the bytes belong to one version.
/// A large range none of which is cached is read past the page cache
/// ([`ferry_util::direct::read_cold`]); otherwise, with `uncached`, pages the read brings
/// into the page cache are dropped again ([`ferry_util::direct::pread_uncached`]).
///
/// # Errors
/// I/O errors, or a file that keeps changing.
pub fn read_at(
    file: &File,
    attr: Attr,
    offset: u64,
    len: usize,
    uncached: bool,
) -> Result<(Bytes, Attr), OpError> {
    let mut before = attr;
    for _ in 0..3 {
        let want = len.min(before.size.saturating_sub(offset) as usize);
        let bytes = read_once(file, offset, want, uncached)?;
        let after = attr_of(
            &fstatx(file.as_fd()).map_err(|e| OpError::new(Status::Io, format!("fstat: {e}")))?,
        );
        if after.version() == before.version() {
            return Ok((bytes, after));
        }
        before = after;
    }
    Err(OpError::new(
        Status::Busy,
        "file kept changing while being read",
    ))
}

/// Up to `want` bytes at `offset`, short only at end of file: past the page cache where
/// [`ferry_util::direct::read_cold`] takes the range, else read into spare capacity (a
/// 1 MiB buffer is not zeroed only to be overwritten), uncached for background reads.
fn read_once(file: &File, offset: u64, want: usize, uncached: bool) -> Result<Bytes, OpError> {
    let io = |e: std::io::Error| OpError::new(Status::Io, format!("read: {e}"));
    if let Some((buf, start, got)) =
        ferry_util::direct::read_cold(file, offset, want, !uncached).map_err(io)?
    {
        return Ok(Bytes::from(buf).slice(start..start + got));
    }
    let mut buf: Vec<u8> = Vec::with_capacity(want);
    while buf.len() < want {
        let at = offset + buf.len() as u64;
        let read = if uncached {
            // Background reads (a mirror's) leave the page cache as they found it.
            ferry_util::direct::pread_uncached(file, &mut buf, at)
        } else {
            match rustix::io::pread(file, rustix::buffer::spare_capacity(&mut buf), at) {
                Err(rustix::io::Errno::INTR) => continue,
                r => r.map_err(std::io::Error::from),
            }
        };
        if read.map_err(io)? == 0 {
            break;
        }
    }
    Ok(Bytes::from(buf))
}

/// BLAKE3 of the whole file, read in chunks of `buf_len` bytes (past the page cache where
/// none of a chunk is cached, [`ferry_util::direct::read_cold`]; else uncached,
/// [`ferry_util::direct::pread_uncached`]). The version must be the same
/// before and after (else the file is hashed again, up to three times), so the hash belongs
/// to exactly the version it is reported with.
///
/// # Errors
/// I/O errors, or a file that keeps changing.
pub fn hash_file(file: &File, attr: Attr, buf_len: usize) -> Result<(Version, [u8; 32]), OpError> {
    let mut before = attr;
    // Pieces read through the page cache (allocated at the first such piece).
    let mut buf: Vec<u8> = Vec::new();
    // Pieces read past the page cache (aligned; allocated at the first such piece).
    let mut cold: Vec<u8> = Vec::new();
    for _ in 0..3 {
        let mut hasher = blake3::Hasher::new();
        let mut offset = 0u64;
        loop {
            buf.clear();
            // A piece none of which is cached: past the page cache.
            match ferry_util::direct::read_cold_into(file, offset, buf_len, false, &mut cold) {
                Ok(Some((start, got))) => {
                    if got == 0 {
                        break;
                    }
                    hasher.update(&cold[start..start + got]);
                    offset += got as u64;
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Err(OpError::new(Status::Io, format!("read: {e}"))),
            }
            // Only mirrors ask for hashes: the page cache is left as it was found.
            buf.reserve_exact(buf_len);
            match ferry_util::direct::pread_uncached(file, &mut buf, offset) {
                Ok(0) => break,
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    offset += n as u64;
                }
                Err(e) => return Err(OpError::new(Status::Io, format!("read: {e}"))),
            }
        }
        let after = attr_of(
            &fstatx(file.as_fd()).map_err(|e| OpError::new(Status::Io, format!("fstat: {e}")))?,
        );
        if after.version() == before.version() && offset == after.size {
            return Ok((after.version(), *hasher.finalize().as_bytes()));
        }
        before = after;
    }
    Err(OpError::new(
        Status::Busy,
        "file kept changing while being hashed",
    ))
}

/// The sparse hash of `file` ([`ferry_util::sparse::hash_sparse`]: its holes are not read)
/// and the version it belongs to, as [`hash_file`] checks it.
///
/// # Errors
/// `Io` on read errors; `Busy` when the file kept changing.
pub fn hash_file_sparse(file: &File, attr: Attr) -> Result<(Version, [u8; 32]), OpError> {
    let mut before = attr;
    for _ in 0..3 {
        let h = ferry_util::sparse::hash_sparse(file, before.size);
        let after = attr_of(
            &fstatx(file.as_fd()).map_err(|e| OpError::new(Status::Io, format!("fstat: {e}")))?,
        );
        match h {
            Ok(h) if after.version() == before.version() => return Ok((after.version(), h)),
            Err(e) if after.version() == before.version() => {
                return Err(OpError::new(Status::Io, format!("read: {e}")))
            }
            _ => before = after,
        }
    }
    Err(OpError::new(
        Status::Busy,
        "file kept changing while being hashed",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, Export) {
        let outer = tempfile::tempdir().unwrap();
        let root = outer.path().join("export");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(outer.path().join("secret"), b"outside").unwrap();
        std::fs::write(root.join("f"), b"hello world").unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        symlink("/", root.join("to_root")).unwrap();
        symlink("../secret", root.join("up")).unwrap();
        symlink("f", root.join("d/rel")).unwrap();
        let e = Export::open(&root).unwrap();
        (outer, e)
    }

    #[test]
    fn a_removed_export_is_an_error_not_an_empty_directory() {
        let outer = tempfile::tempdir().unwrap();
        let root = outer.path().join("export");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("f"), b"x").unwrap();
        let e = Export::open(&root).unwrap();
        assert!(e.stat(b"").is_ok());
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::create_dir(&root).unwrap(); // recreated: another directory
        for p in [&b""[..], b"f"] {
            let err = e.stat(p).unwrap_err();
            assert_eq!(err.status, Status::Io);
            assert!(err.message.contains("restart ferryd"), "{}", err.message);
        }
    }

    #[test]
    fn a_tree_comes_breadth_first_within_its_bounds_and_never_through_a_symlink() {
        let (t, e) = setup();
        let root = t.path().join("export");
        std::fs::create_dir_all(root.join("d/e/g")).unwrap();
        std::fs::write(root.join("d/e/g/h"), b"h").unwrap();
        std::fs::create_dir(root.join("a")).unwrap();
        let page = e.read_tree(b"", 1000, 1 << 20).unwrap();
        let rels: Vec<&[u8]> = page.dirs.iter().map(|d| &d.rel[..]).collect();
        assert_eq!(rels[0], b"");
        let mut sorted = rels.clone();
        sorted.sort();
        assert_eq!(sorted, [&b""[..], b"a", b"d", b"d/e", b"d/e/g"]);
        // Breadth first: each directory after its parent, every level before the next.
        let depth =
            |r: &[u8]| r.iter().filter(|&&b| b == b'/').count() + usize::from(!r.is_empty());
        assert!(
            rels.windows(2).all(|w| depth(w[0]) <= depth(w[1])),
            "{rels:?}"
        );
        assert!(page.dirs.iter().all(|d| d.eof));
        // The symlinks to / and out of the export are entries, not listings.
        let top = &page.dirs[0].entries;
        let kind = |n: &[u8]| top.iter().find(|e| &e.name[..] == n).unwrap().attr.kind;
        assert_eq!(kind(b"to_root"), FileKind::Symlink);
        assert_eq!(kind(b"up"), FileKind::Symlink);
        // At most max_entries in all: the page ends with the listing cut short.
        let page = e.read_tree(b"", 2, 1 << 20).unwrap();
        assert_eq!(page.dirs.len(), 1);
        assert_eq!((page.dirs[0].entries.len(), page.dirs[0].eof), (2, false));
        // Directories the page cannot hold are not queued: a bound that fits the root's
        // listing and the first header under it ends the page there.
        let root_bytes: usize = 4
            + 7
            + e.read_dir(b"", 0, 100)
                .unwrap()
                .entries
                .iter()
                .map(|x| dirent_wire_len(x.name.len()))
                .sum::<usize>();
        let bound = root_bytes + 7 + 1;
        let page = e.read_tree(b"", 1000, bound).unwrap();
        let size: usize = 4 + page
            .dirs
            .iter()
            .map(|d| {
                7 + d.rel.len()
                    + d.entries
                        .iter()
                        .map(|x| dirent_wire_len(x.name.len()))
                        .sum::<usize>()
            })
            .sum::<usize>();
        assert!(size <= bound, "{size} > {bound}");
        assert!(page.dirs[0].eof && page.dirs[0].rel.is_empty());
        assert!(page.dirs.len() <= 2);
        // A byte bound below one entry still gives one: a page makes progress.
        let page = e.read_tree(b"d", 1000, 1).unwrap();
        assert_eq!((page.dirs.len(), page.dirs[0].entries.len()), (1, 1));
        assert!(!page.dirs[0].eof);
        // A subtree; not a directory; out of the export.
        let page = e.read_tree(b"d/e", 1000, 1 << 20).unwrap();
        let rels: Vec<&[u8]> = page.dirs.iter().map(|d| &d.rel[..]).collect();
        assert_eq!(rels, [&b""[..], b"g"]);
        assert_eq!(
            e.read_tree(b"f", 1000, 1 << 20).unwrap_err().status,
            Status::NotDirectory
        );
        assert_ne!(
            e.read_tree(b"to_root", 1000, 1 << 20).unwrap_err().status,
            Status::Ok
        );
        assert_ne!(
            e.read_tree(b"../", 1000, 1 << 20).unwrap_err().status,
            Status::Ok
        );
    }

    #[test]
    fn stat_and_read() {
        let (_t, e) = setup();
        let a = e.stat(b"f").unwrap();
        assert_eq!((a.kind, a.size), (FileKind::File, 11));
        let (f, attr) = e.open_file(b"f").unwrap();
        let (data, _) = read_at(&f, attr, 6, 100, false).unwrap();
        assert_eq!(&data[..], b"world");
        assert_eq!(e.stat(b"").unwrap().kind, FileKind::Directory);
    }

    #[test]
    fn symlinks_are_reported_never_followed() {
        let (_t, e) = setup();
        assert_eq!(e.stat(b"to_root").unwrap().kind, FileKind::Symlink);
        assert_eq!(&e.readlink(b"up").unwrap()[..], b"../secret");
        for p in [&b"to_root/etc/passwd"[..], b"up", b"to_root"] {
            let err = e.open_file(p).unwrap_err();
            assert_ne!(err.status, Status::Ok, "{p:?}");
        }
        assert_eq!(
            e.stat(b"to_root/etc").unwrap_err().status,
            Status::SymlinkInPath
        );
    }

    #[test]
    fn traversal_refused() {
        let (_t, e) = setup();
        for p in [
            &b"../secret"[..],
            b"/etc/passwd",
            b"d/../../secret",
            b"f\0x",
            b"d//f",
        ] {
            assert_eq!(e.stat(p).unwrap_err().status, Status::InvalidName, "{p:?}");
        }
        assert_eq!(
            e.stat(&[b'a'; 4096]).unwrap_err().status,
            Status::NameTooLong
        );
    }

    #[test]
    fn paged_listing_is_complete() {
        let t = tempfile::tempdir().unwrap();
        for i in 0..1000 {
            std::fs::write(t.path().join(format!("n{i}")), b"").unwrap();
        }
        let e = Export::open(t.path()).unwrap();
        let mut names = std::collections::BTreeSet::new();
        let mut cookie = 0;
        loop {
            let page = e.read_dir(b"", cookie, 77).unwrap();
            for ent in &page.entries {
                assert!(names.insert(ent.name.clone()), "duplicate entry");
                cookie = ent.cookie;
            }
            if page.eof {
                break;
            }
        }
        assert_eq!(names.len(), 1000);
    }

    #[test]
    fn listings_with_contents_are_complete_bounded_and_follow_no_link() {
        let t = tempfile::tempdir().unwrap();
        let mut want = std::collections::BTreeMap::new();
        for i in 0..300u32 {
            // Incompressible (an LCG's high bytes), so pages fill with as many bytes as files.
            let mut x = u64::from(i) + 1;
            let body: Vec<u8> = (0..(i * 37 % 3000))
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (x >> 56) as u8
                })
                .collect();
            std::fs::write(t.path().join(format!("n{i}")), &body).unwrap();
            want.insert(format!("n{i}"), body);
        }
        std::fs::write(t.path().join("big"), vec![7u8; 50_000]).unwrap();
        std::fs::create_dir(t.path().join("sub")).unwrap();
        symlink("n1", t.path().join("link")).unwrap();
        let e = Export::open(t.path()).unwrap();
        let (mut cookie, mut seen, mut pages) = (0, 0, 0);
        loop {
            // Files up to 4000 bytes come with contents; pages of at most 64 KiB.
            let page = e
                .read_dir_data(
                    b"",
                    cookie,
                    DataPageLimits {
                        max_entries: 1000,
                        max_file: 4000,
                        max_bytes: 64 << 10,
                        compression: Compression::Lz4,
                        uncached: false,
                    },
                )
                .unwrap();
            pages += 1;
            let mut size = 5;
            for ent in &page.entries {
                seen += 1;
                cookie = ent.entry.cookie;
                let name = String::from_utf8_lossy(&ent.entry.name).into_owned();
                size += 2 + ent.entry.name.len() + 8 + Attr::LEN + 1;
                match (want.get(&name), &ent.data) {
                    (Some(body), Some(d)) => {
                        let got = ferry_proto::payload::decode(
                            d.encoding,
                            d.decoded_len,
                            d.checksum,
                            d.data.clone(),
                        )
                        .unwrap();
                        assert_eq!(&got[..], &body[..], "{name}");
                        assert_eq!(d.blake3, *blake3::hash(body).as_bytes());
                        assert_eq!(ent.entry.attr.size, body.len() as u64);
                        size += 49 + d.data.len();
                    }
                    // Empty files, the big file, the directory and the symlink: no data.
                    (Some(body), None) => assert!(body.is_empty(), "{name} came without contents"),
                    (None, d) => assert!(d.is_none(), "{name} came with contents"),
                }
            }
            assert!(size <= 64 << 10, "page of {size} bytes");
            if page.eof {
                break;
            }
        }
        assert_eq!(seen, 303);
        assert!(
            pages > 5,
            "contents of ~450 KB in 64 KiB pages: {pages} pages"
        );
    }
}
