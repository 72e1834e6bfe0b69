//! Runs of a listing whose small files are fetched together.
//!
//! A directory is listed first without contents (one quick page of names for most), so a
//! walker can go on at once; then the contents of its small files come in pages of
//! ReadDirData, one per run of consecutive entries, all runs at once: ReadDirData resumes
//! from the cookie of the entry before the run and asks for exactly the run's entries.
//! A tree of small files then costs a few round trips per directory, whatever its size,
//! instead of one per file, and a large directory's contents travel over every stream.
//!
//! Invariants: a run holds only wanted small files and entries the server sends no
//! contents for (directories, symlinks, empty or large files), so no byte crosses the wire
//! twice; its files' sizes plus per-entry overhead stay within [`RUN_BYTES`], so the server's
//! page (256 KiB in ferryd) holds the whole run.

use std::ops::Range;

use ferry_proto::{Attr, DirEntry, FileKind};

/// Regular files of 1 byte to this size are fetched with their listing (mount and mirror).
pub const SMALL_FILE_MAX: u32 = 64 << 10;

/// Most bytes of one run: its small files' sizes plus [`ENTRY_OVERHEAD`] per entry.
pub const RUN_BYTES: u64 = 192 << 10;

/// What an entry costs in a page beyond its contents: its name, cookie, attributes and
/// the contents' fields, rounded up.
const ENTRY_OVERHEAD: u64 = 400;

/// Most entries asked for in one run.
const RUN_ENTRIES: usize = 1024;

/// One run: ask ReadDirData for `count` entries from `cookie`; they are `entries` of the
/// listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The cookie of the entry before the run (0 for the listing's start).
    pub cookie: u64,
    /// Entries in the run.
    pub count: u32,
    /// Their positions in the listing.
    pub entries: Range<usize>,
}

/// Whether the server would send the contents of an entry of this kind and size when
/// asked with `SMALL_FILE_MAX`.
pub fn is_small_file(kind: FileKind, size: u64) -> bool {
    kind == FileKind::File && size > 0 && size <= u64::from(SMALL_FILE_MAX)
}

/// An entry of a listing as [`small_file_runs`] sees it.
pub trait ListedEntry {
    /// The cookie the server gave it.
    fn cookie(&self) -> u64;
    /// Its attributes.
    fn attr(&self) -> &Attr;
}

impl ListedEntry for DirEntry {
    fn cookie(&self) -> u64 {
        self.cookie
    }
    fn attr(&self) -> &Attr {
        &self.attr
    }
}

fn small(e: &impl ListedEntry) -> bool {
    is_small_file(e.attr().kind, e.attr().size)
}

/// The runs that fetch the small files of `entries[range]` (`entries` in listing order,
/// each entry with the cookie the server gave it) for which `wanted` is true. A small file
/// not wanted (already held) ends a run, as the server would send it again. The work is in
/// proportion to the range, not the listing (a copy of a directory of 100,000 files asks
/// for a window at each open).
pub fn small_file_runs<E: ListedEntry>(
    entries: &[E],
    range: Range<usize>,
    wanted: impl Fn(usize) -> bool,
) -> Vec<Run> {
    let mut runs = Vec::new();
    let end_of = range.end.min(entries.len());
    let mut i = range.start;
    while i < end_of {
        if !(small(&entries[i]) && wanted(i)) {
            i += 1;
            continue;
        }
        let start = i;
        let mut bytes = 0;
        // One past the last wanted small file taken.
        let mut end = start;
        while i < end_of && i - start < RUN_ENTRIES {
            let e = &entries[i];
            let cost = ENTRY_OVERHEAD + if small(e) { e.attr().size } else { 0 };
            if small(e) && !wanted(i) {
                break;
            }
            if bytes + cost > RUN_BYTES && i > start {
                break;
            }
            bytes += cost;
            i += 1;
            if small(e) {
                end = i;
            }
        }
        runs.push(Run {
            cookie: if start == 0 {
                0
            } else {
                entries[start - 1].cookie()
            },
            count: (end - start) as u32,
            entries: start..end,
        });
        i = end;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use ferry_proto::Timestamp;
    use proptest::prelude::*;

    fn entry(i: usize, kind: FileKind, size: u64) -> DirEntry {
        DirEntry {
            name: Bytes::from(format!("e{i}")),
            cookie: 1000 + i as u64,
            attr: Attr {
                ino: i as u64,
                kind,
                perm: 0o644,
                nlink: 1,
                uid: 0,
                gid: 0,
                rdev: 0,
                size,
                blocks: 0,
                atime: Timestamp::default(),
                mtime: Timestamp::default(),
                ctime: Timestamp::default(),
                btime: Timestamp::default(),
            },
        }
    }

    #[test]
    fn runs_skip_large_and_held_files_and_resume_at_the_previous_cookie() {
        let es = vec![
            entry(0, FileKind::File, 10),
            entry(1, FileKind::Directory, 4096),
            entry(2, FileKind::File, 10),
            entry(3, FileKind::File, 10), // held
            entry(4, FileKind::File, 1 << 30),
            entry(5, FileKind::File, 10),
            entry(6, FileKind::File, 0),
        ];
        let runs = small_file_runs(&es, 0..es.len(), |i| i != 3);
        assert_eq!(
            runs,
            vec![
                Run {
                    cookie: 0,
                    count: 3,
                    entries: 0..3
                },
                Run {
                    cookie: 1004,
                    count: 1,
                    entries: 5..6
                },
            ]
        );
    }

    proptest! {
        /// Every wanted small file is in exactly one run; no run holds a small file not
        /// wanted; runs stay within their byte bound (or hold one entry); cookies resume
        /// right before each run.
        #[test]
        fn runs_cover_each_wanted_file_once(
            sizes in proptest::collection::vec((0u8..3, 0u64..100_000, any::<bool>()), 0..300),
        ) {
            let es: Vec<DirEntry> = sizes
                .iter()
                .enumerate()
                .map(|(i, &(k, size, _))| {
                    let kind = [FileKind::File, FileKind::Directory, FileKind::Symlink][k as usize];
                    entry(i, kind, size)
                })
                .collect();
            let wanted = |i: usize| sizes[i].2;
            let runs = small_file_runs(&es, 0..es.len(), wanted);
            let mut seen = vec![0; es.len()];
            for r in &runs {
                prop_assert_eq!(r.count as usize, r.entries.len());
                let before = if r.entries.start == 0 { 0 } else { es[r.entries.start - 1].cookie };
                prop_assert_eq!(r.cookie, before);
                let mut bytes = 0;
                for i in r.entries.clone() {
                    seen[i] += 1;
                    if small(&es[i]) {
                        prop_assert!(wanted(i));
                        bytes += es[i].attr.size;
                    }
                    bytes += ENTRY_OVERHEAD;
                }
                prop_assert!(bytes <= RUN_BYTES || r.count == 1);
            }
            for (i, e) in es.iter().enumerate() {
                if small(e) && wanted(i) {
                    prop_assert_eq!(seen[i], 1);
                }
            }
        }
    }
}
