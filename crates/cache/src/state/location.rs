//! Where a destination's state lives: outside the destination, so that it holds exactly
//! the source.
//!
//! A state base (`/var/lib/ferry` as root, `$XDG_STATE_HOME/ferry` or
//! `~/.local/state/ferry` otherwise, or `--state-dir`) holds one folder per destination,
//! named after the destination's last component and a hash of its canonical path
//! (`oradata-3f1c0e…`). The folder records which directory it belongs to (path, device,
//! inode and birth time, as a freed inode number is soon handed out again): state found for a directory that was since removed and made again is set
//! aside, not applied to files that are not the ones it describes.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The legacy state folder inside a destination (before state moved out of it): migrated
/// on the first open.
pub const LEGACY_STATE_DIR: &str = ".ferry";

/// The file in a state folder naming the destination it belongs to.
const OWNER_FILE: &str = "destination";

/// The directory that holds the state folders of destinations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateBase(PathBuf);

impl StateBase {
    /// A state base at `path`.
    pub fn new(path: impl Into<PathBuf>) -> StateBase {
        StateBase(path.into())
    }

    /// The default for this user: `/var/lib/ferry` as root, else `$XDG_STATE_HOME/ferry`,
    /// else `$HOME/.local/state/ferry`. `None` when neither variable is set.
    pub fn default_for_user() -> Option<StateBase> {
        if rustix::process::geteuid().is_root() {
            return Some(StateBase::new("/var/lib/ferry"));
        }
        let abs = |v: std::ffi::OsString| {
            let p = PathBuf::from(v);
            p.is_absolute().then_some(p)
        };
        if let Some(x) = std::env::var_os("XDG_STATE_HOME").and_then(abs) {
            return Some(StateBase::new(x.join("ferry")));
        }
        std::env::var_os("HOME")
            .and_then(abs)
            .map(|h| StateBase::new(h.join(".local/state/ferry")))
    }

    /// `explicit` (from `--state-dir` or `FERRY_STATE_DIR`) or the default for this user.
    ///
    /// # Errors
    /// No explicit base and no default (neither `XDG_STATE_HOME` nor `HOME` set).
    pub fn choose(explicit: Option<&Path>) -> Result<StateBase, super::CacheError> {
        match explicit {
            Some(p) => Ok(StateBase::new(p)),
            None => StateBase::default_for_user().ok_or(super::CacheError::NoStateBase),
        }
    }

    /// The base's path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The state folder of the destination whose canonical path is `dest`.
    pub fn folder_for(&self, dest: &Path) -> PathBuf {
        let name: String = dest
            .file_name()
            .map(|n| String::from_utf8_lossy(n.as_bytes()).into_owned())
            .unwrap_or_else(|| "root".into())
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(48)
            .collect();
        let hash = blake3::hash(dest.as_os_str().as_bytes()).to_hex();
        self.0.join(format!("{name}-{}", &hash[..16]))
    }
}

/// What a state folder says of the destination it belongs to.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Owner {
    pub(super) dest: PathBuf,
    pub(super) dev: u64,
    pub(super) ino: u64,
    /// Birth time in nanoseconds since the epoch (0 where the file system keeps none).
    pub(super) btime: u128,
}

impl Owner {
    pub(super) fn of(dest: &Path) -> std::io::Result<Owner> {
        let m = std::fs::metadata(dest)?;
        let btime = m
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        Ok(Owner {
            dest: dest.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
            btime,
        })
    }

    /// The owner recorded in `folder`, if any (and readable).
    pub(super) fn read(folder: &Path) -> Option<Owner> {
        let raw = std::fs::read(folder.join(OWNER_FILE)).ok()?;
        let mut lines = raw.split(|&b| b == b'\n');
        let dest = PathBuf::from(std::ffi::OsStr::from_bytes(lines.next()?));
        let ids = std::str::from_utf8(lines.next()?).ok()?;
        let mut ids = ids.split(' ');
        Some(Owner {
            dest,
            dev: ids.next()?.parse().ok()?,
            ino: ids.next()?.parse().ok()?,
            btime: ids.next()?.parse().ok()?,
        })
    }

    pub(super) fn write(&self, folder: &Path) -> std::io::Result<()> {
        let mut raw = self.dest.as_os_str().as_bytes().to_vec();
        raw.extend_from_slice(format!("\n{} {} {}\n", self.dev, self.ino, self.btime).as_bytes());
        let tmp = folder.join(format!("{OWNER_FILE}.tmp"));
        std::fs::write(&tmp, raw)?;
        std::fs::rename(tmp, folder.join(OWNER_FILE))
    }
}

/// Finds the state folder of `dest` (any path naming it) for reading, as `ferry status`
/// does: in `explicit` when given, else in this user's default base and then root's
/// (`/var/lib/ferry`), else the legacy `DEST/.ferry/`. `dest` may also be a state folder
/// itself.
pub fn find_state(dest: &Path, explicit: Option<&Path>) -> Option<PathBuf> {
    let is_state = |p: &Path| p.join("status.json").is_file() || p.join("journal").is_file();
    if is_state(dest) && dest.join(OWNER_FILE).is_file() {
        return Some(dest.to_path_buf());
    }
    let canon = std::fs::canonicalize(dest).ok()?;
    let mut bases = Vec::new();
    match explicit {
        Some(p) => bases.push(StateBase::new(p)),
        None => {
            bases.extend(StateBase::default_for_user());
            bases.push(StateBase::new("/var/lib/ferry"));
        }
    }
    bases
        .iter()
        .map(|b| b.folder_for(&canon))
        .find(|f| is_state(f))
        .or_else(|| {
            let legacy = canon.join(LEGACY_STATE_DIR);
            is_state(&legacy).then_some(legacy)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_differ_by_path_and_keep_a_readable_name() {
        let b = StateBase::new("/var/lib/ferry");
        let a = b.folder_for(Path::new("/restore/oradata"));
        let c = b.folder_for(Path::new("/other/oradata"));
        assert_ne!(a, c);
        let name = a.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("oradata-"), "{name}");
        assert_eq!(name.len(), "oradata-".len() + 16);
        let odd = b.folder_for(Path::new("/x/a b\n/../é"));
        assert!(odd.file_name().unwrap().to_str().unwrap().is_ascii());
        assert_eq!(
            b.folder_for(Path::new("/")).parent(),
            Some(Path::new("/var/lib/ferry"))
        );
    }

    #[test]
    fn the_owner_record_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let o = Owner::of(dir.path()).unwrap();
        o.write(dir.path()).unwrap();
        assert_eq!(Owner::read(dir.path()), Some(o));
    }
}
