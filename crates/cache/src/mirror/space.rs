//! Free space on the copy's file system: a file starts only when what it will allocate fits
//! beside what the files in flight may still allocate, so a disk too small for the tree
//! gets the files that fit finished, and the rest reported without a byte written, instead
//! of many files each left partly written when the disk fills.
//!
//! What a file needs is what the server's copy allocates (a sparse file needs its data, not
//! its size), less what the copy holds already (a resume). Reservations are conservative:
//! bytes a file in flight has written count twice (in the free space and in its
//! reservation) until it ends, so a file that does not fit now waits for one in flight to
//! end, and is reported only when none is left to wait for.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How long a measurement of the free space is used before it is taken again.
const FRESH: Duration = Duration::from_millis(100);

/// The copy's free space and the reservations of files in flight.
pub(super) struct Space {
    root: PathBuf,
    inner: Mutex<Inner>,
    released: Notify,
}

struct Inner {
    /// Bytes reserved by files in flight.
    reserved: u64,
    /// Files holding a reservation.
    holders: usize,
    /// Free bytes (for an unprivileged user) when last measured, and when.
    avail: u64,
    measured: Option<Instant>,
}

/// A file's room; given back on drop.
pub(super) struct Room {
    space: Arc<Space>,
    bytes: u64,
}

/// A file that cannot fit: what it needs and what is free.
#[derive(Debug)]
pub(super) struct NoRoom {
    pub(super) need: u64,
    pub(super) avail: u64,
}

impl Space {
    pub(super) fn new(root: PathBuf) -> Arc<Space> {
        Arc::new(Space {
            root,
            inner: Mutex::new(Inner {
                reserved: 0,
                holders: 0,
                avail: 0,
                measured: None,
            }),
            released: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Room for `need` bytes: at once when they fit beside the reservations, else once a
    /// file in flight ends and they do; [`NoRoom`] when they do not fit and no file is in
    /// flight. A file system whose free space cannot be read is taken to have room.
    pub(super) async fn reserve(self: &Arc<Self>, need: u64) -> Result<Room, NoRoom> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut g = self.lock();
                if g.measured.is_none_or(|t| t.elapsed() > FRESH) {
                    match rustix::fs::statvfs(&self.root) {
                        Ok(s) => g.avail = s.f_bavail.saturating_mul(s.f_frsize),
                        Err(_) => g.avail = u64::MAX,
                    }
                    g.measured = Some(Instant::now());
                }
                if g.reserved.saturating_add(need) <= g.avail || need == 0 {
                    g.reserved += need;
                    g.holders += 1;
                    return Ok(Room {
                        space: self.clone(),
                        bytes: need,
                    });
                }
                if g.holders == 0 {
                    return Err(NoRoom {
                        need,
                        avail: g.avail,
                    });
                }
            }
            released.await;
        }
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        let mut g = self.space.lock();
        g.reserved -= self.bytes;
        g.holders -= 1;
        // What the file wrote now shows in the free space: measure it again.
        g.measured = None;
        drop(g);
        self.space.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_wait_for_room_and_are_refused_only_when_nothing_is_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let space = Space::new(dir.path().to_path_buf());
        let avail = {
            let s = rustix::fs::statvfs(dir.path()).unwrap();
            s.f_bavail * s.f_frsize
        };
        // More than is free, nothing in flight: refused at once.
        let no = space.reserve(avail.saturating_mul(2)).await.err().unwrap();
        assert_eq!(no.need, avail.saturating_mul(2));
        // Two thirds, then two thirds again: the second waits for the first.
        let first = space.reserve(avail / 3 * 2).await.unwrap();
        let s2 = space.clone();
        let second = tokio::spawn(async move { s2.reserve(avail / 3 * 2).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !second.is_finished(),
            "waits while the first holds its room"
        );
        drop(first);
        assert!(second.await.unwrap(), "fits once the first is done");
        assert_eq!(space.lock().holders, 0);
    }
}
