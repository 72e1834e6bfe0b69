//! The mount point on the kernel side: checking it before mounting (and replacing a dead
//! mount a killed ferry left there), raising the kernel readahead of a new mount, and
//! detaching a mount.
//!
//! A dead FUSE mount (its daemon killed) stays in the mount table and answers ENOTCONN;
//! it is recognised by probing with `opendir`, which the kernel always sends to the
//! daemon (a `stat` may be answered from the attribute cache even when the daemon is
//! gone). A live FUSE mount is never replaced: mounting over it would hide it.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::MountError;

/// Mount points in this namespace, decoded from /proc/self/mountinfo: (path, fs type).
pub(super) fn mounts() -> Vec<(PathBuf, String)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some((
                PathBuf::from(unescape(f.get(4)?)),
                f.get(sep + 1)?.to_string(),
            ))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `p` made absolute without resolving symlinks (as mountinfo shows mount points).
pub(crate) fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Detaches whatever is mounted at `p` (lazy: works even while busy or dead).
///
/// # Errors
/// Neither `umount2` (root) nor `fusermount3 -u -z` (the mount's owner) could detach it.
pub fn detach(p: &Path) -> Result<(), MountError> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|source| MountError::PathHasNul {
        path: p.to_path_buf(),
        source,
    })?;
    // SAFETY: a valid NUL-terminated path; umount2 has no other memory effects.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc == 0 {
        return Ok(());
    }
    let umount_err = std::io::Error::last_os_error();
    // Not root: fusermount3 may unmount FUSE mounts of the calling user.
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(p)
        .status();
    match status {
        Ok(s) if s.success() => Ok(()),
        _ => Err(MountError::Unmount {
            path: p.to_path_buf(),
            source: umount_err,
        }),
    }
}

/// Checks the mount point; replaces a dead mount left by a killed process.
///
/// # Errors
/// The path is missing or not a directory, or a live FUSE file system is mounted there, or
/// a dead mount there cannot be detached.
pub(crate) fn prepare(p: &Path) -> Result<(), MountError> {
    let abs = absolute(p);
    let fuse_here = mounts()
        .into_iter()
        .rev()
        .find(|(mp, _)| *mp == abs)
        .filter(|(_, fstype)| fstype.starts_with("fuse"));
    let dead = |e: &std::io::Error| e.raw_os_error() == Some(libc::ENOTCONN);
    let probe = if fuse_here.is_some() {
        std::fs::read_dir(p).map(|_| ())
    } else {
        std::fs::metadata(p).map(|_| ())
    };
    let unusable = |source| MountError::Mountpoint {
        path: p.to_path_buf(),
        source,
    };
    match probe {
        Err(e) if dead(&e) => {
            warn!(
                "{}: replacing a dead mount left by an earlier ferry",
                p.display()
            );
            detach(p)?;
        }
        Err(e) => return Err(unusable(e)),
        Ok(()) => {
            if let Some((_, fstype)) = fuse_here {
                return Err(MountError::AlreadyMounted {
                    path: p.to_path_buf(),
                    fstype,
                });
            }
        }
    }
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(MountError::NotADirectory(p.to_path_buf())),
        Err(e) => Err(unusable(e)),
    }
}

/// Raises the kernel readahead of the mount (fuser can only lower it during init). A
/// failure is logged, not fatal: the mount works, sequential reads may be slower.
pub(crate) fn set_read_ahead(mountpoint: &Path, kb: u32) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = meta.dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    );
    match std::fs::write(&path, format!("{kb}\n")) {
        Ok(()) => info!("kernel readahead {kb} KiB ({path})"),
        Err(e) => {
            warn!("cannot raise kernel readahead ({path}: {e}); sequential reads may be slower")
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may panic on setup failures

    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn unusable_mount_points_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            prepare(&file),
            Err(MountError::NotADirectory(p)) if p == file
        ));
        assert!(matches!(
            prepare(&dir.path().join("missing")),
            Err(MountError::Mountpoint { .. })
        ));
        prepare(dir.path()).unwrap();
    }
}
