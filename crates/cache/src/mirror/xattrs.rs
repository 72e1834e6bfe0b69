//! Extended attributes and POSIX ACLs of the copy (`system.posix_acl_access` and
//! `_default` are xattrs too): the server sends those of a directory's entries in one
//! request per directory ([`ferry_client::Client::dir_xattrs`]), asked beside the directory's
//! listing (not after it: a round trip per directory) and awaited when an entry's metadata is
//! set. Each entry gets the server's attributes (those this process may set: `trusted.*` and
//! most `security.*` need root, and are skipped otherwise), and loses the `user.*` and ACL
//! attributes the server's does not have. `--no-xattrs` turns it off.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::OnceCell;

use super::{remote_path, Ctx};

/// Attributes of a directory's entries, by entry name ("" for the directory itself).
type DirAttrs = HashMap<Bytes, Vec<(Bytes, Bytes)>>;

/// The server's extended attributes, per directory, for a run.
#[derive(Default)]
pub(super) struct XattrMap {
    dirs: Mutex<HashMap<Bytes, Arc<OnceCell<DirAttrs>>>>,
}

impl XattrMap {
    fn cell(&self, dir: &Bytes) -> Arc<OnceCell<DirAttrs>> {
        self.dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(dir.clone())
            .or_default()
            .clone()
    }

    /// Fetches the attributes of directory `dir`'s entries, once.
    async fn fetch(ctx: &Ctx, cell: &OnceCell<DirAttrs>, dir: &Bytes) {
        cell.get_or_init(|| async {
            match ctx.client.dir_xattrs(remote_path(&ctx.root, dir)).await {
                Ok(Some(entries)) => entries.into_iter().map(|e| (e.name, e.attrs)).collect(),
                Ok(None) => DirAttrs::new(),
                Err(e) => {
                    ctx.progress.error(format!(
                        "extended attributes in /{} not copied: {e}",
                        String::from_utf8_lossy(dir)
                    ));
                    DirAttrs::new()
                }
            }
        })
        .await;
    }

    /// Starts fetching the attributes of directory `dir`'s entries (the walk just listed it).
    pub(super) fn prefetch(ctx: &Arc<Ctx>, dir: &Bytes) {
        if !ctx.cfg.xattrs {
            return;
        }
        let (c, dir) = (ctx.clone(), dir.clone());
        tokio::spawn(async move {
            let cell = c.xattrs.cell(&dir);
            Self::fetch(&c, &cell, &dir).await;
        });
    }

    /// The server's attributes of `rel` (`None` when they are not copied in this run).
    pub(super) async fn of(ctx: &Ctx, rel: &Bytes) -> Option<Vec<(Bytes, Bytes)>> {
        if !ctx.cfg.xattrs {
            return None;
        }
        let (dir, name) = if rel.is_empty() {
            (Bytes::new(), Bytes::new())
        } else {
            ferry_proto::name::split(rel)
        };
        let cell = ctx.xattrs.cell(&dir);
        Self::fetch(ctx, &cell, &dir).await;
        Some(
            cell.get()
                .and_then(|m| m.get(&name))
                .cloned()
                .unwrap_or_default(),
        )
    }
}

/// Whether this process manages attribute `name` on the copy (sets it, and removes it when
/// the server's object lacks it): user attributes and POSIX ACLs.
fn managed(name: &[u8]) -> bool {
    name.starts_with(b"user.") || name.starts_with(b"system.posix_acl_")
}

/// Gives the local object at `local` (not following a final symlink) the attributes
/// `attrs`, and removes the managed ones it has beyond them. Attributes this process may
/// not set (EPERM, ENOTSUP) are skipped. Blocking.
pub(super) fn apply(local: &Path, attrs: &[(Bytes, Bytes)]) -> std::io::Result<()> {
    apply_to(Object::Path(local), attrs)
}

/// As [`apply`], on an open regular file (`local` its path, for messages): no path to look
/// up for each call.
pub(super) fn apply_fd(
    f: &std::fs::File,
    local: &Path,
    attrs: &[(Bytes, Bytes)],
) -> std::io::Result<()> {
    apply_to(Object::File(f, local), attrs)
}

/// What attributes are applied to: a path (not following a final symlink), or an open file
/// and its path.
#[derive(Clone, Copy)]
enum Object<'a> {
    Path(&'a Path),
    File(&'a std::fs::File, &'a Path),
}

fn apply_to(obj: Object<'_>, attrs: &[(Bytes, Bytes)]) -> std::io::Result<()> {
    use rustix::fs::XattrFlags;
    use std::os::unix::ffi::OsStrExt;
    let name = |n: &[u8]| std::ffi::OsStr::from_bytes(n).to_owned();
    let (mut small, mut large) = ([0u8; ferry_util::xattr::SMALL], Vec::new());
    let have = match ferry_util::xattr::names(&mut small, &mut large, |b| match obj {
        Object::Path(p) => rustix::fs::llistxattr(p, b),
        Object::File(f, _) => rustix::fs::flistxattr(f, b),
    }) {
        Ok(n) => n,
        Err(rustix::io::Errno::NOTSUP) => {
            if attrs.is_empty() {
                return Ok(());
            }
            &small[..0]
        }
        Err(e) => return Err(e.into()),
    };
    for old in have.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if managed(old) && !attrs.iter().any(|(n, _)| n.as_ref() == old) {
            let n = name(old);
            let removed = match obj {
                Object::Path(p) => rustix::fs::lremovexattr(p, n.as_os_str()),
                Object::File(f, _) => rustix::fs::fremovexattr(f, n.as_os_str()),
            };
            match removed {
                Ok(()) | Err(rustix::io::Errno::NODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    for (n, v) in attrs {
        let n = name(n);
        let set = match obj {
            Object::Path(p) => rustix::fs::lsetxattr(p, n.as_os_str(), v, XattrFlags::empty()),
            Object::File(f, _) => rustix::fs::fsetxattr(f, n.as_os_str(), v, XattrFlags::empty()),
        };
        match set {
            Ok(()) => {}
            Err(rustix::io::Errno::PERM | rustix::io::Errno::NOTSUP) => {
                let local = match obj {
                    Object::Path(p) | Object::File(_, p) => p,
                };
                tracing::debug!(
                    "{}: extended attribute {} not set (not allowed here)",
                    local.display(),
                    n.to_string_lossy()
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
