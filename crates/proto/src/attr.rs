//! File attributes and versions as they travel.

use bytes::{BufMut, Bytes};

use crate::codec::{get_i64, get_u32, get_u64, get_u8, DecodeError};

/// The type of a file system object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Directory,
    /// Symbolic link (never followed by the server).
    Symlink,
    /// Named pipe.
    Fifo,
    /// Character device.
    CharDevice,
    /// Block device.
    BlockDevice,
    /// Unix socket.
    Socket,
}

impl FileKind {
    fn to_u8(self) -> u8 {
        match self {
            FileKind::File => 1,
            FileKind::Directory => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::CharDevice => 5,
            FileKind::BlockDevice => 6,
            FileKind::Socket => 7,
        }
    }

    fn from_u8(v: u8) -> Result<Self, DecodeError> {
        Ok(match v {
            1 => FileKind::File,
            2 => FileKind::Directory,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::CharDevice,
            6 => FileKind::BlockDevice,
            7 => FileKind::Socket,
            _ => {
                return Err(DecodeError::InvalidValue {
                    field: "file kind",
                    value: v.into(),
                })
            }
        })
    }
}

/// Seconds and nanoseconds since the Unix epoch, as `stat` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Timestamp {
    /// Whole seconds (may be negative for times before 1970).
    pub sec: i64,
    /// Nanoseconds, `0..1_000_000_000`.
    pub nsec: u32,
}

impl Timestamp {
    fn encode(&self, dst: &mut impl BufMut) {
        dst.put_i64(self.sec);
        dst.put_u32(self.nsec);
    }
    fn decode(buf: &mut Bytes) -> Result<Self, DecodeError> {
        let sec = get_i64(buf, "timestamp")?;
        let nsec = get_u32(buf, "timestamp")?;
        if nsec >= 1_000_000_000 {
            return Err(DecodeError::InvalidValue {
                field: "timestamp nanoseconds",
                value: nsec.into(),
            });
        }
        Ok(Timestamp { sec, nsec })
    }
}

/// Identifies one version of a file's contents: if any field differs, cached bytes of
/// the old version must not be served for the new one. The ctime catches what the others
/// miss: a rewrite in place that keeps the size and puts the mtime back (any write, and
/// every `utimensat`, sets the ctime to now, which no unprivileged program can set back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Version {
    /// Server-side inode number (a replaced file gets a new one).
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time to the nanosecond.
    pub mtime: Timestamp,
    /// Status change time to the nanosecond.
    pub ctime: Timestamp,
    /// Birth time to the nanosecond (0 where the file system does not report one): with
    /// the inode number, what tells a file from a later one that reuses its inode number
    /// (ext4 hands a freed number out again at once).
    pub btime: Timestamp,
}

impl Version {
    /// Encoded length in bytes.
    pub const LEN: usize = 8 + 8 + 12 + 12 + 12;

    /// Whether `other` is a version of the same file (the same inode number and birth
    /// time), whatever its contents.
    pub fn same_file(&self, other: &Version) -> bool {
        self.ino == other.ino && self.btime == other.btime
    }

    /// Whether `other` differs from this version in its ctime only: the same file, size and
    /// mtime (a `chmod`, `chown`, a new hard link — or a rewrite in place that put the
    /// mtime back). Bytes of one are not the other's without a check (a hash). A birth
    /// time of 0 on either side (not known: a record made before versions had one) does not
    /// tell files apart here.
    pub fn differs_in_ctime_only(&self, other: &Version) -> bool {
        let unknown = Timestamp::default();
        self.ino == other.ino
            && (self.btime == other.btime || self.btime == unknown || other.btime == unknown)
            && self.size == other.size
            && self.mtime == other.mtime
            && self.ctime != other.ctime
    }

    /// Appends the encoding to `dst`.
    pub fn encode(&self, dst: &mut impl BufMut) {
        dst.put_u64(self.ino);
        dst.put_u64(self.size);
        self.mtime.encode(dst);
        self.ctime.encode(dst);
        self.btime.encode(dst);
    }

    /// Decodes from the front of `buf`.
    pub fn decode(buf: &mut Bytes) -> Result<Self, DecodeError> {
        Ok(Version {
            ino: get_u64(buf, "version")?,
            size: get_u64(buf, "version")?,
            mtime: Timestamp::decode(buf)?,
            ctime: Timestamp::decode(buf)?,
            btime: Timestamp::decode(buf)?,
        })
    }
}

/// Attributes of one object, as `lstat` (never `stat`) reports them on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attr {
    /// Server inode number.
    pub ino: u64,
    /// Object type.
    pub kind: FileKind,
    /// Permission bits including setuid/setgid/sticky (`st_mode & 0o7777`).
    pub perm: u16,
    /// Hard link count.
    pub nlink: u32,
    /// Owner user id on the server.
    pub uid: u32,
    /// Owner group id on the server.
    pub gid: u32,
    /// Device number for device files.
    pub rdev: u64,
    /// Size in bytes (for symlinks: the target's length).
    pub size: u64,
    /// Allocated 512-byte blocks on the server.
    pub blocks: u64,
    /// Last access.
    pub atime: Timestamp,
    /// Last modification.
    pub mtime: Timestamp,
    /// Last status change.
    pub ctime: Timestamp,
    /// Birth time (0 where the file system does not report one).
    pub btime: Timestamp,
}

impl Attr {
    /// Encoded length in bytes.
    pub const LEN: usize = 8 + 1 + 2 + 4 + 4 + 4 + 8 + 8 + 8 + 4 * 12;

    /// Whether `other` describes the same object: the same inode number, birth time and
    /// kind (a file replaced on the server, even by one that reuses its inode number, is
    /// another object).
    pub fn same_object(&self, other: &Attr) -> bool {
        self.ino == other.ino && self.btime == other.btime && self.kind == other.kind
    }

    /// Attributes of a directory that has no others to show (a mount's `.` and `..`, an
    /// object store's prefix): mode 0755, two links, owned by `uid`:`gid`, size and times 0.
    pub fn bare_directory(ino: u64, uid: u32, gid: u32) -> Attr {
        Attr {
            ino,
            kind: FileKind::Directory,
            perm: 0o755,
            nlink: 2,
            uid,
            gid,
            rdev: 0,
            size: 0,
            blocks: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            btime: Timestamp::default(),
        }
    }

    /// The version of the contents these attributes describe.
    pub fn version(&self) -> Version {
        Version {
            ino: self.ino,
            size: self.size,
            mtime: self.mtime,
            ctime: self.ctime,
            btime: self.btime,
        }
    }

    /// Appends the encoding to `dst`.
    pub fn encode(&self, dst: &mut impl BufMut) {
        dst.put_u64(self.ino);
        dst.put_u8(self.kind.to_u8());
        dst.put_u16(self.perm);
        dst.put_u32(self.nlink);
        dst.put_u32(self.uid);
        dst.put_u32(self.gid);
        dst.put_u64(self.rdev);
        dst.put_u64(self.size);
        dst.put_u64(self.blocks);
        self.atime.encode(dst);
        self.mtime.encode(dst);
        self.ctime.encode(dst);
        self.btime.encode(dst);
    }

    /// Decodes from the front of `buf`.
    pub fn decode(buf: &mut Bytes) -> Result<Self, DecodeError> {
        let ino = get_u64(buf, "attr")?;
        let kind = FileKind::from_u8(get_u8(buf, "attr")?)?;
        let perm = crate::codec::get_u16(buf, "attr")?;
        if perm > 0o7777 {
            return Err(DecodeError::InvalidValue {
                field: "permission bits",
                value: perm.into(),
            });
        }
        Ok(Attr {
            ino,
            kind,
            perm,
            nlink: get_u32(buf, "attr")?,
            uid: get_u32(buf, "attr")?,
            gid: get_u32(buf, "attr")?,
            rdev: get_u64(buf, "attr")?,
            size: get_u64(buf, "attr")?,
            blocks: get_u64(buf, "attr")?,
            atime: Timestamp::decode(buf)?,
            mtime: Timestamp::decode(buf)?,
            ctime: Timestamp::decode(buf)?,
            btime: Timestamp::decode(buf)?,
        })
    }
}
