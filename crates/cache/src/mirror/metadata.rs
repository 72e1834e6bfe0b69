//! Metadata of local entries: owners (see `owners.rs`), modes and nanosecond
//! access/modification times as the source's. The owner goes first: `chown` clears the
//! setuid and setgid bits, which the mode then sets. Blocking system calls: callers run them on the
//! background threads ([`crate::background`]).

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ferry_proto::{Attr, FileKind, Timestamp, Version};

use crate::state::CREATED_WRITABLE;

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
    rustix::fs::futimens(f, &times(attr))?;
    Ok(())
}

/// Gives a regular file just created by
/// [`CacheDir::restart_whole_file`](crate::state::CacheDir::restart_whole_file) (with the
/// source's permission bits) and written the metadata [`set_file_metadata`] then `xattrs`
/// give it, in fewer system calls where creation got it right already: no `fchown` when the
/// owner is this process's, no `fchmod` when the mode came out as the source's. Returns the
/// file's metadata after the last change (its stamp is taken from it).
///
/// What creation gives is checked, not assumed: a set-group-ID directory, the umask, a
/// directory's default ACL or set-ID bits make it differ, and the file then gets the whole
/// sequence ([`set_file_metadata`], then `xattrs`, in that order: a mode set after an access
/// ACL would change the ACL's mask).
pub(super) fn set_new_file_metadata(
    f: &File,
    attr: &Attr,
    owner: Option<(u32, u32)>,
    xattrs: impl Fn() -> std::io::Result<()>,
) -> std::io::Result<std::fs::Metadata> {
    use std::os::unix::fs::MetadataExt;
    // Who creates files: this process's effective ids, which it never changes.
    static CREATOR: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    let creator = *CREATOR.get_or_init(|| {
        (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    });
    let perm = u32::from(attr.perm) & 0o7777;
    // Creation cannot give another owner, set-ID bits or a mode without the owner's write
    // (the file is created writable by its owner): those take the whole sequence at once,
    // not after a check (a git tree's objects are all 0444).
    let creation_gives_mode = perm & (0o7000 | CREATED_WRITABLE) == CREATED_WRITABLE;
    if owner.is_none_or(|o| o == creator) && creation_gives_mode {
        rustix::fs::futimens(f, &times(attr))?;
        xattrs()?;
        let m = f.metadata()?;
        let owned = owner.is_none_or(|o| (m.uid(), m.gid()) == o);
        if owned && m.mode() & 0o7777 == perm {
            return Ok(m);
        }
    }
    set_file_metadata(f, attr, owner)?;
    xattrs()?;
    f.metadata()
}

/// The source's access and modification times of `attr`, for `futimens`/`utimensat`.
fn times(attr: &Attr) -> rustix::fs::Timestamps {
    let ts = |t: ferry_proto::Timestamp| rustix::fs::Timespec {
        tv_sec: t.sec,
        tv_nsec: i64::from(t.nsec) as _,
    };
    rustix::fs::Timestamps {
        last_access: ts(attr.atime),
        last_modification: ts(attr.mtime),
    }
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
    rustix::fs::utimensat(
        rustix::fs::CWD,
        local,
        &times(attr),
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
