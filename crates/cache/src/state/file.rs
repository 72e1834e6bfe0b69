//! What the cache knows of one file: the remote version its local bytes belong to, which
//! chunks of it are present (durable), whether it was verified, and which start of the
//! local file (generation) that describes. Built by replaying the journal's records.
//!
//! Invariant: `present_count` is the number of bits set in `present`, and only indexes
//! below [`FileState::chunks`] are ever set.

use std::collections::HashMap;

use bytes::Bytes;
use ferry_proto::Version;

use crate::journal::Record;

/// What the cache knows of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    /// The remote version the local bytes belong to.
    pub version: Version,
    /// Chunk size of `present`'s indexes.
    pub chunk_size: u32,
    present: Vec<u64>,
    present_count: u64,
    /// The server's BLAKE3 the whole local file matched, once verified.
    pub verified: Option<[u8; 32]>,
    /// The local file's inode, size, mtime and ctime once verified and its metadata set:
    /// while the local file still shows them, it is that verified copy.
    pub stamp: Option<Version>,
    /// Which start of the file this is (in memory only; 0 after a replay). Every
    /// [`CacheDir::restart_file`](super::CacheDir::restart_file) gives a new one, so a chunk written to an older inode of
    /// the file is never recorded as present in the new one.
    pub generation: u64,
    /// Whether the local file of this generation exists (false while it is being replaced).
    pub ready: bool,
}

impl FileState {
    /// A file of `version` with no chunk present.
    pub fn new(version: Version, chunk_size: u32) -> FileState {
        let chunks = version.size.div_ceil(u64::from(chunk_size.max(1)));
        FileState {
            version,
            chunk_size,
            present: vec![0; chunks.div_ceil(64) as usize],
            present_count: 0,
            verified: None,
            stamp: None,
            generation: 0,
            ready: true,
        }
    }

    /// Number of chunks of the file.
    pub fn chunks(&self) -> u64 {
        self.version
            .size
            .div_ceil(u64::from(self.chunk_size.max(1)))
    }

    /// Whether chunk `i` is present.
    pub fn has(&self, i: u64) -> bool {
        i < self.chunks() && self.present[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: u64) {
        if i < self.chunks() && !self.has(i) {
            self.present[(i / 64) as usize] |= 1 << (i % 64);
            self.present_count += 1;
        }
    }

    /// Chunks present.
    pub fn present_count(&self) -> u64 {
        self.present_count
    }

    /// Bytes present (the last chunk may be short).
    pub fn present_bytes(&self) -> u64 {
        let cs = u64::from(self.chunk_size);
        let n = self.chunks();
        if n == 0 {
            return 0;
        }
        let last = self.version.size - (n - 1) * cs;
        self.present_count * cs - if self.has(n - 1) { cs - last } else { 0 }
    }

    /// Whether every chunk is present.
    pub fn complete(&self) -> bool {
        self.present_count == self.chunks()
    }

    /// Indexes of the chunks not present, in order.
    pub fn missing(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.chunks()).filter(|&i| !self.has(i))
    }

    /// Present chunks as `(first, count)` runs, for compaction.
    pub(super) fn runs(&self) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        let mut i = 0;
        let n = self.chunks();
        while i < n {
            if self.has(i) {
                let start = i;
                while i < n && self.has(i) && i - start < u64::from(u32::MAX) {
                    i += 1;
                }
                out.push((start, (i - start) as u32));
            } else {
                i += 1;
            }
        }
        out
    }

    pub(super) fn apply(&mut self, rec: &Record) {
        match rec {
            Record::Chunks { first, count, .. } => {
                for i in *first..first.saturating_add(u64::from(*count)) {
                    self.set(i);
                }
                self.stamp = None;
            }
            Record::Stamp { stamp, .. } => {
                if self.verified.is_some() {
                    self.stamp = Some(*stamp);
                }
            }
            Record::Verified { blake3, .. } => {
                if self.complete() {
                    self.verified = Some(*blake3);
                }
            }
            Record::Version { .. } | Record::Forget { .. } => {}
        }
    }
}

/// Applies replayed records to a state map.
pub fn replay(records: &[Record]) -> HashMap<Bytes, FileState> {
    let mut files: HashMap<Bytes, FileState> = HashMap::new();
    for r in records {
        match r {
            Record::Version {
                path,
                version,
                chunk_size,
            } => {
                files.insert(path.clone(), FileState::new(*version, *chunk_size));
            }
            Record::Forget { path } => {
                files.remove(path);
            }
            other => {
                if let Some(st) = files.get_mut(other.path()) {
                    st.apply(other);
                }
            }
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::Timestamp;

    fn v(size: u64) -> Version {
        Version {
            ino: 1,
            size,
            mtime: Timestamp { sec: 1, nsec: 2 },
            ctime: Timestamp { sec: 1, nsec: 2 },
            btime: Timestamp::default(),
        }
    }

    #[test]
    fn bitmap_counts_and_short_last_chunk() {
        let mut s = FileState::new(v(2 * 1024 + 10), 1024);
        assert_eq!(s.chunks(), 3);
        assert_eq!(s.missing().collect::<Vec<_>>(), [0, 1, 2]);
        s.apply(&Record::Chunks {
            path: Bytes::new(),
            first: 2,
            count: 1,
        });
        assert_eq!(s.present_bytes(), 10);
        s.apply(&Record::Chunks {
            path: Bytes::new(),
            first: 0,
            count: 2,
        });
        assert!(s.complete());
        assert_eq!(s.present_bytes(), 2 * 1024 + 10);
        assert_eq!(s.runs(), [(0, 3)]);
        // Out-of-range chunks are ignored.
        s.apply(&Record::Chunks {
            path: Bytes::new(),
            first: 5,
            count: 9,
        });
        assert_eq!(s.present_count(), 3);
    }

    #[test]
    fn empty_file_is_complete() {
        let s = FileState::new(v(0), 1024);
        assert!(s.complete());
        assert_eq!(s.present_bytes(), 0);
    }
}
