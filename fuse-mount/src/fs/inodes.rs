//! The inode table: mount inode numbers, the path each stands for, its last attributes and
//! the references the kernel holds.
//!
//! Invariants:
//! - The root is [`ROOT_INO`] and is never forgotten. Other objects get 2, 3, … in order of
//!   first sight; a number is never reused within a mount (the generation is always 0).
//! - `by_path` maps a path to the newest inode of that path; `nodes` may still hold an older
//!   inode of the same path (the object was replaced on the server) until the kernel
//!   forgets it, so the kernel never mixes the page cache of two objects.
//! - A node's lookup count is the number of references the kernel holds: one per `lookup`
//!   reply and per readdirplus entry it was sent. At zero the node is removed.
//! - A node's attributes are replaced only by ones at least as recent (`fetched`), so an
//!   older listing neither overwrites fresher attributes nor looks fresh to `open`.
//! - Hard links: a regular file with more than one link is one node whatever name it is
//!   found under (`by_object`, by server inode and birth time), so `stat` shows one inode
//!   number for all its names and `cp -a`, `rsync -H` and `tar` see the links. The node reads
//!   through the name it was first found under; its other names are in `aliases`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_proto::{Attr, FileKind, Version};

use super::{lock, ROOT_INO};
use crate::error::Error;

struct Node {
    path: Bytes,
    /// Other names of the same file (hard links), in `by_path` too.
    aliases: Vec<Bytes>,
    attr: Attr,
    /// When the server reported `attr`.
    fetched: Instant,
    lookups: u64,
    /// Version seen at the last open, for FOPEN_KEEP_CACHE.
    open_version: Option<Version>,
}

impl Node {
    /// Takes `attr`, reported by the server at `fetched`, if it is at least as recent as
    /// what the node holds (the newer of the two stays).
    fn take(&mut self, attr: Attr, fetched: Instant) {
        if fetched >= self.fetched {
            self.attr = attr;
            self.fetched = fetched;
        }
    }
}

struct Table {
    nodes: HashMap<u64, Node>,
    by_path: HashMap<Bytes, u64>,
    /// Nodes of regular files with several links, by server inode and birth time.
    by_object: HashMap<(u64, ferry_proto::Timestamp), u64>,
    next_ino: u64,
}

/// The inode table (one mutex; every method takes it once and never awaits under it).
pub(super) struct InodeTable {
    table: std::sync::Mutex<Table>,
    /// The mount root's path beneath the export.
    root: Bytes,
}

impl InodeTable {
    /// A table holding only the root, at `root` with attributes `root_attr`.
    pub(super) fn new(root: Bytes, root_attr: Attr) -> Self {
        let mut table = Table {
            nodes: HashMap::new(),
            by_path: HashMap::new(),
            by_object: HashMap::new(),
            next_ino: ROOT_INO + 1,
        };
        table.nodes.insert(
            ROOT_INO,
            Node {
                path: root.clone(),
                aliases: Vec::new(),
                attr: root_attr,
                fetched: Instant::now(),
                lookups: 1,
                open_version: None,
            },
        );
        table.by_path.insert(root.clone(), ROOT_INO);
        InodeTable {
            table: std::sync::Mutex::new(table),
            root,
        }
    }

    /// The path of `ino`.
    ///
    /// # Errors
    /// ESTALE for an inode the table does not hold.
    pub(super) fn path_of(&self, ino: u64) -> Result<Bytes, Error> {
        lock(&self.table)
            .nodes
            .get(&ino)
            .map(|n| n.path.clone())
            .ok_or_else(stale)
    }

    /// The newest inode of `path`, if the kernel holds one.
    pub(super) fn ino_of(&self, path: &Bytes) -> Option<u64> {
        lock(&self.table).by_path.get(path).copied()
    }

    /// Records that the kernel now holds one more reference to `path`, whose attributes
    /// (reported by the server at `fetched`) are `attr`; returns its inode.
    pub(super) fn remember(&self, path: Bytes, attr: Attr, fetched: Instant) -> u64 {
        let mut t = lock(&self.table);
        if let Some(&ino) = t.by_path.get(&path) {
            if let Some(node) = t.nodes.get_mut(&ino) {
                if node.attr.same_object(&attr) {
                    node.take(attr, fetched);
                    node.lookups += 1;
                    return ino;
                }
            }
        }
        // Another name of a file with several links, known already: the same inode.
        let linked = attr.kind == FileKind::File && attr.nlink > 1;
        if linked {
            if let Some(&ino) = t.by_object.get(&(attr.ino, attr.btime)) {
                if let Some(node) = t.nodes.get_mut(&ino) {
                    if node.attr.same_object(&attr) {
                        node.take(attr, fetched);
                        node.lookups += 1;
                        if node.path != path && !node.aliases.contains(&path) {
                            node.aliases.push(path.clone());
                        }
                        t.by_path.insert(path, ino);
                        return ino;
                    }
                }
            }
        }
        // New path, or the object at the path was replaced: a new inode.
        let ino = t.next_ino;
        t.next_ino += 1;
        if linked {
            t.by_object.insert((attr.ino, attr.btime), ino);
        }
        t.nodes.insert(
            ino,
            Node {
                path: path.clone(),
                aliases: Vec::new(),
                attr,
                fetched,
                lookups: 1,
                open_version: None,
            },
        );
        t.by_path.insert(path, ino);
        ino
    }

    /// Drops `n` references to `ino`; returns the node's path when that was the last (the
    /// node is then gone). The root stays whatever the kernel says.
    pub(super) fn forget(&self, ino: u64, n: u64) -> Option<Bytes> {
        if ino == ROOT_INO {
            return None;
        }
        let mut t = lock(&self.table);
        let node = t.nodes.get_mut(&ino)?;
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups > 0 {
            return None;
        }
        let path = node.path.clone();
        let node = t.nodes.remove(&ino)?;
        // A newer inode of the same path keeps its entry.
        for p in std::iter::once(&node.path).chain(&node.aliases) {
            if t.by_path.get(p) == Some(&ino) {
                t.by_path.remove(p);
            }
        }
        let object = (node.attr.ino, node.attr.btime);
        if t.by_object.get(&object) == Some(&ino) {
            t.by_object.remove(&object);
        }
        Some(path)
    }

    /// The references the kernel holds to `ino`, if the table has it.
    pub(super) fn lookups(&self, ino: u64) -> Option<u64> {
        lock(&self.table).nodes.get(&ino).map(|n| n.lookups)
    }

    /// Fresh attributes of `ino` from the server, reported at `fetched`, and the version
    /// the node held before.
    ///
    /// # Errors
    /// ESTALE for an inode the table does not hold, or when `attr` is of another object
    /// than the node's (the path's object was replaced on the server: it gets a new inode
    /// at its next lookup; this one keeps its attributes).
    pub(super) fn refresh(&self, ino: u64, attr: Attr, fetched: Instant) -> Result<Version, Error> {
        let mut t = lock(&self.table);
        let n = t.nodes.get_mut(&ino).ok_or_else(stale)?;
        if !n.attr.same_object(&attr) {
            return Err(Error::errno(
                libc::ESTALE,
                "replaced on the server (look it up again)",
            ));
        }
        let before = n.attr.version();
        n.take(attr, fetched);
        Ok(before)
    }

    /// The path of `ino`, its attributes and when the server reported them.
    ///
    /// # Errors
    /// ESTALE for an inode the table does not hold.
    pub(super) fn path_and_attr(&self, ino: u64) -> Result<(Bytes, Attr, Instant), Error> {
        let t = lock(&self.table);
        let node = t.nodes.get(&ino).ok_or_else(stale)?;
        Ok((node.path.clone(), node.attr, node.fetched))
    }

    /// The path of `ino` and its attributes if they were fetched less than `ttl` ago.
    ///
    /// # Errors
    /// ESTALE for an inode the table does not hold.
    pub(super) fn path_and_fresh_attr(
        &self,
        ino: u64,
        ttl: Duration,
    ) -> Result<(Bytes, Option<Attr>), Error> {
        let t = lock(&self.table);
        let node = t.nodes.get(&ino).ok_or_else(stale)?;
        let fresh = (node.fetched.elapsed() < ttl).then_some(node.attr);
        Ok((node.path.clone(), fresh))
    }

    /// Records that `ino` is opened at `version`. Returns (the version equals that of the
    /// previous open: the kernel may keep its page cache; a previous open saw a different
    /// version: cached chunks are stale).
    pub(super) fn opened(&self, ino: u64, version: Version) -> (bool, bool) {
        match lock(&self.table).nodes.get_mut(&ino) {
            Some(node) => {
                let before = node.open_version.replace(version);
                (
                    before == Some(version),
                    before.is_some_and(|v| v != version),
                )
            }
            None => (false, false),
        }
    }

    /// Inode of the parent directory of `ino`: the node of the parent path, or the root
    /// when that is unknown or above the mount's root (the root is its own parent).
    pub(super) fn parent_of(&self, ino: u64) -> u64 {
        let t = lock(&self.table);
        let Some(node) = t.nodes.get(&ino) else {
            return ROOT_INO;
        };
        if ino == ROOT_INO {
            return ROOT_INO;
        }
        let (parent, _) = ferry_proto::name::split(&node.path);
        if parent.len() < self.root.len() {
            return ROOT_INO;
        }
        t.by_path.get(&parent).copied().unwrap_or(ROOT_INO)
    }
}

fn stale() -> Error {
    Error::errno(libc::ESTALE, "unknown inode")
}
