//! `readdir` and `readdirplus` over an open directory handle, into any [`DirReplier`] (the
//! FUSE adapter's implements it over fuser's reply buffers; tests record what they get).
//!
//! Positions: offset 0 is `.`, 1 is `..`, and 2 + i is entry i of the listing the handle
//! holds; each entry is added with the offset that resumes after it, which is what the
//! kernel passes back on its next call. A listing is fixed at `opendir`, so any offset
//! resumes exactly where an earlier reply stopped.
//!
//! Reference counting (the kernel sends `forget` for every entry of a readdirplus reply it
//! was sent): an entry counts as a lookup only if it was actually added to the reply; one
//! that did not fit is uncounted at once. `.` and `..` never count (the kernel skips them),
//! so they get only plausible placeholder attributes. Plain `readdir` counts nothing: it
//! reports the known mount inode, or failing that the server inode as an informational
//! `d_ino`.

use ferry_proto::Attr;

use super::listing::DirItem;
use super::Fs;
use crate::error::Error;

/// Where `readdir`/`readdirplus` put their entries: fuser's reply buffers in the FUSE
/// adapter, a recording list in tests.
pub trait DirReplier {
    /// Adds the entry `name` with mount inode `ino` and attributes `attr` (a plain readdir
    /// reply uses only `attr.kind`); `offset` is the position that resumes after it.
    /// Returns true when the reply is full: the entry was **not** added, and no more will be.
    fn add(&mut self, ino: u64, offset: u64, name: &[u8], attr: &Attr) -> bool;
}

/// A position of a directory listing as the kernel walks it.
enum DirPos<'a> {
    Dot,
    DotDot,
    Entry(&'a DirItem),
}

/// The positions from `offset` on, each with the offset that resumes after it.
fn dir_positions(items: &[DirItem], offset: u64) -> impl Iterator<Item = (u64, DirPos<'_>)> {
    (offset..2 + items.len() as u64).map(move |pos| {
        let at = match pos {
            0 => DirPos::Dot,
            1 => DirPos::DotDot,
            p => DirPos::Entry(&items[(p - 2) as usize]),
        };
        (pos + 1, at)
    })
}

/// Placeholder attributes of `.` or `..` (directory inode `ino`): the kernel takes no
/// reference for them and does not cache them.
fn dot_attr(ino: u64) -> Attr {
    Attr::bare_directory(ino, 0, 0)
}

/// Whether a reply's entries count as kernel lookups.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Plus,
}

impl Fs {
    /// Plain `readdir` of directory `ino` through its handle `fh`, from position `offset`,
    /// into `reply` until it is full or the listing ends. Takes no kernel references.
    ///
    /// # Errors
    /// EBADF for an unknown directory handle.
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        reply: &mut impl DirReplier,
    ) -> Result<(), Error> {
        self.fill_dir(ino, fh, offset, reply, Mode::Plain)
    }

    /// `readdirplus`: as [`Fs::readdir`], with each entry's attributes; every entry actually
    /// added to `reply` (not `.` or `..`) counts as a kernel lookup, to be undone by
    /// [`Fs::forget`].
    ///
    /// # Errors
    /// EBADF for an unknown directory handle.
    pub fn readdirplus(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        reply: &mut impl DirReplier,
    ) -> Result<(), Error> {
        self.fill_dir(ino, fh, offset, reply, Mode::Plus)
    }

    fn fill_dir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        reply: &mut impl DirReplier,
        mode: Mode,
    ) -> Result<(), Error> {
        let items = self
            .dir_items(fh)
            .ok_or_else(|| Error::errno(libc::EBADF, "unknown directory handle"))?;
        for (next, at) in dir_positions(&items, offset) {
            let full = match at {
                DirPos::Dot => reply.add(ino, next, b".", &dot_attr(ino)),
                DirPos::DotDot => {
                    let parent = self.inodes.parent_of(ino);
                    reply.add(parent, next, b"..", &dot_attr(parent))
                }
                DirPos::Entry(item) if mode == Mode::Plain => {
                    reply.add(self.peek_entry(ino, item), next, &item.name, &item.attr)
                }
                DirPos::Entry(item) => {
                    // An entry whose name cannot be resolved is skipped (its position still
                    // advances, so offsets stay stable).
                    let Ok(path) = self.child_path(ino, &item.name) else {
                        continue;
                    };
                    let child = self.inodes.remember(path, item.attr, item.listed);
                    let full = reply.add(child, next, &item.name, &self.shown_now(&item.attr));
                    if full {
                        // Not sent: the kernel holds no reference for it.
                        self.forget(child, 1);
                    }
                    full
                }
            };
            if full {
                break;
            }
        }
        Ok(())
    }

    /// Inode of entry `item` of `parent` for plain readdir (no reference counted): the known
    /// inode, or the server's inode number as an informational `d_ino`.
    fn peek_entry(&self, parent: u64, item: &DirItem) -> u64 {
        match self.child_path(parent, &item.name) {
            Ok(path) => self.inodes.ino_of(&path).unwrap_or(item.attr.ino),
            Err(_) => item.attr.ino,
        }
    }
}
