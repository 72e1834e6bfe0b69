//! Extended attributes and POSIX ACLs through the mount (`getxattr`, `listxattr`).
//!
//! The server answers for a whole directory at once (DirXattrs: the directory and each of
//! its entries that has any), so `ls -l`, `getfacl -R`, `cp -a` and `rsync -X`, which ask
//! for every entry, cost one round trip per directory, not one per file. A directory's
//! attributes are asked for together with its listing ([`Xattrs::ahead`], from the listing
//! code, also for listings fetched ahead of a walker), so a tree walk that reads them
//! seldom waits at all. What the server said is used for the attribute timeout, like the
//! attributes themselves; then asked again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::Client;
use tokio::sync::OnceCell;

use super::lock;
use crate::error::Error;

/// The attributes of a directory's entries by entry name (the directory itself under the
/// empty name); `None` when the server cannot tell (no XATTRS feature, or an error: then
/// asked again on the next use).
type DirMap = HashMap<Bytes, Vec<(Bytes, Bytes)>>;
type Cell = Arc<OnceCell<Option<Arc<DirMap>>>>;

/// Directories whose attributes are held at most.
const DIRS_HELD: usize = 4096;

/// The mount's extended attributes, by directory path.
#[derive(Default)]
pub(super) struct Xattrs {
    inner: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    dirs: HashMap<Bytes, (Instant, Cell)>,
    order: VecDeque<Bytes>,
}

/// Fetches the attributes of directory `dir`'s entries: `None` when the server has no
/// XATTRS feature or the request failed (logged).
async fn fetch(client: &Client, dir: &Bytes) -> Option<Arc<DirMap>> {
    match client.dir_xattrs(dir.clone()).await {
        Ok(Some(entries)) => Some(Arc::new(
            entries.into_iter().map(|e| (e.name, e.attrs)).collect(),
        )),
        Ok(None) => Some(Arc::new(DirMap::new())),
        Err(e) => {
            tracing::warn!(
                "extended attributes of /{}: {e}",
                String::from_utf8_lossy(dir)
            );
            None
        }
    }
}

impl Xattrs {
    /// The cell of `dir` asked for less than `ttl` ago, or a new one (whose fetch the
    /// caller starts); the bool says whether it is new.
    fn cell(&self, dir: &Bytes, ttl: Duration) -> (Cell, bool) {
        let mut h = lock(&self.inner);
        if let Some((asked, cell)) = h.dirs.get(dir) {
            let failed = cell.get().is_some_and(Option::is_none);
            if asked.elapsed() < ttl && !failed {
                return (cell.clone(), false);
            }
        }
        let cell = Cell::default();
        if h.dirs
            .insert(dir.clone(), (Instant::now(), cell.clone()))
            .is_none()
        {
            h.order.push_back(dir.clone());
        }
        while h.order.len() > DIRS_HELD {
            if let Some(old) = h.order.pop_front() {
                h.dirs.remove(&old);
            }
        }
        (cell, true)
    }

    /// Asks for the attributes of `dir`'s entries now, in the background, unless they were
    /// asked for less than `ttl` ago (called beside each listing fetched).
    pub(super) fn ahead(&self, client: &Client, dir: &Bytes, ttl: Duration) {
        if client.session().features & ferry_proto::features::XATTRS == 0 {
            return;
        }
        let (cell, new) = self.cell(dir, ttl);
        if new {
            let (client, dir) = (client.clone(), dir.clone());
            tokio::spawn(async move {
                cell.get_or_init(|| fetch(&client, &dir)).await;
            });
        }
    }

    /// The extended attributes of entry `name` of directory `dir` (`name` empty: `dir`
    /// itself).
    ///
    /// # Errors
    /// EIO when the server could not say.
    pub(super) async fn of(
        &self,
        client: &Client,
        dir: &Bytes,
        name: &Bytes,
        ttl: Duration,
    ) -> Result<Vec<(Bytes, Bytes)>, Error> {
        let (cell, _) = self.cell(dir, ttl);
        let map = cell.get_or_init(|| fetch(client, dir)).await.clone();
        let map = map.ok_or_else(|| {
            Error::errno(
                libc::EIO,
                &format!(
                    "extended attributes of /{}: the server did not answer",
                    String::from_utf8_lossy(dir)
                ),
            )
        })?;
        Ok(map.get(name).cloned().unwrap_or_default())
    }

    /// Forgets what is held for `dir` (its listing was dropped: something changed there).
    pub(super) fn forget(&self, dir: &Bytes) {
        lock(&self.inner).dirs.remove(dir);
    }
}
