//! Metadata of local entries: owners (see `owners.rs`), modes and nanosecond
//! access/modification times as the source's. The owner goes first: `chown` clears the
//! setuid and setgid bits, which the mode then sets. Blocking system calls: callers run them on the
//! background threads ([`crate::background`]).

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ferry_proto::{Attr, FileKind, Timestamp, Version};

/// Sets the owner (when given), mode and access/modification times of an open regular file.
pub(super) fn set_file_metadata(
    f: &File,
    attr: &Attr,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    if let Some((u, g)) = owner {
        rustix::fs::fchown(f, Some(uid(u)), Some(gid(g)))?;
    }
    rustix::fs::fchmod(
        f,
        rustix::fs::Mode::from_raw_mode(u32::from(attr.perm) & 0o7777),
    )?;
    let ts = |t: ferry_proto::Timestamp| rustix::fs::Timespec {
        tv_sec: t.sec,
        tv_nsec: i64::from(t.nsec) as _,
    };
    rustix::fs::futimens(
        f,
        &rustix::fs::Timestamps {
            last_access: ts(attr.atime),
            last_modification: ts(attr.mtime),
        },
    )?;
    Ok(())
}

/// Sets the owner (when given), mode (unless a symlink) and access/modification times
/// without following a final symlink.
pub(super) fn set_metadata(
    local: &Path,
    attr: &Attr,
    mode: bool,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    if let Some((u, g)) = owner {
        rustix::fs::chownat(
            rustix::fs::CWD,
            local,
            Some(uid(u)),
            Some(gid(g)),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )?;
    }
    if mode && attr.kind != FileKind::Symlink {
        std::fs::set_permissions(
            local,
            std::fs::Permissions::from_mode(u32::from(attr.perm) & 0o7777),
        )?;
    }
    let ts = |t: ferry_proto::Timestamp| rustix::fs::Timespec {
        tv_sec: t.sec,
        tv_nsec: i64::from(t.nsec) as _,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        local,
        &rustix::fs::Timestamps {
            last_access: ts(attr.atime),
            last_modification: ts(attr.mtime),
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

/// The identity and times of a local file as a stamp (see
/// [`crate::state::FileState::stamp`]): inode, size, mtime, ctime and birth time.
pub(crate) fn stamp_of(m: &std::fs::Metadata) -> Version {
    use std::os::unix::fs::MetadataExt;
    let t = |sec: i64, nsec: i64| Timestamp {
        sec,
        nsec: nsec.clamp(0, 999_999_999) as u32,
    };
    let btime = m
        .created()
        .ok()
        .and_then(|c| c.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(Timestamp::default(), |d| Timestamp {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        });
    Version {
        ino: m.ino(),
        size: m.size(),
        mtime: t(m.mtime(), m.mtime_nsec()),
        ctime: t(m.ctime(), m.ctime_nsec()),
        btime,
    }
}

/// The stamp of the local file at `local` (not following a final symlink).
pub(super) fn local_stamp(local: &Path) -> std::io::Result<Version> {
    Ok(stamp_of(&std::fs::symlink_metadata(local)?))
}

fn uid(u: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(u)
}

fn gid(g: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(g)
}
