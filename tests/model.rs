//! A model-based property test of the read path: random sequences of open, read (at random
//! offsets and lengths), stat, readdir, readlink and close against the file system under
//! test, each compared with the same call on the source directory (the model).
//!
//! The same sequences run against two subjects behind one [`Target`] trait: a real FUSE
//! mount (through `std::fs`, so through the kernel), and `Fs` driven directly (no kernel:
//! what the FUSE adapter would call, including the kernel's side of lookup counting).

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::collections::BTreeSet;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use ferry_tests::{require_fuse, write_random, TestMount, TestServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[path = "model/direct.rs"]
mod direct;

/// Files of the source tree, with sizes around chunk (1 MiB) and page boundaries.
const FILES: &[(&str, usize)] = &[
    ("empty", 0),
    ("one", 1),
    ("page", 4096),
    ("a/small", 10_000),
    ("a/chunk", 1 << 20),
    ("a/b/chunk_plus", (1 << 20) + 1),
    ("a/b/three", (3 << 20) - 7),
    ("a/b/c/deep", 65_537),
];
const DIRS: &[&str] = &["", "a", "a/b", "a/b/c", "empty_dir"];
const LINKS: &[(&str, &str)] = &[
    ("a/rel", "b/three"),
    ("abs", "/etc/hostname"),
    ("dangling", "nowhere"),
];

#[derive(Debug, Clone)]
enum Op {
    Open(usize),
    Read {
        handle: usize,
        offset: u64,
        len: usize,
    },
    Stat(usize),
    ReadDir(usize),
    ReadLink(usize),
    Close(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let n_paths = FILES.len() + DIRS.len() + LINKS.len();
    prop_oneof![
        3 => (0..FILES.len()).prop_map(Op::Open),
        8 => (0..8usize, 0..(3u64 << 20) + 4096, prop_oneof![1..4097usize, 4096..(300usize << 10)])
            .prop_map(|(handle, offset, len)| Op::Read { handle, offset, len }),
        2 => (0..n_paths).prop_map(Op::Stat),
        1 => (0..DIRS.len()).prop_map(Op::ReadDir),
        1 => (0..LINKS.len()).prop_map(Op::ReadLink),
        1 => (0..8usize).prop_map(Op::Close),
    ]
}

fn path_of(i: usize) -> String {
    if i < FILES.len() {
        FILES[i].0.to_string()
    } else if i < FILES.len() + DIRS.len() {
        DIRS[i - FILES.len()].to_string()
    } else {
        LINKS[i - FILES.len() - DIRS.len()].0.to_string()
    }
}

/// What `stat` (without following symlinks) reports that the model compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    kind: Kind,
    len: u64,
    /// `st_mode`: type and permission bits.
    mode: u32,
    mtime: (i64, i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// The operations of a case, on one file system. Paths are relative to its root ("" is the
/// root); failures panic (every path of the tree exists).
trait Target {
    /// An open file.
    type File;
    /// Opens the regular file `path` for reading.
    fn open(&mut self, path: &str) -> Self::File;
    /// Reads at `offset` into `buf`; short only at the end of the file.
    fn read_at(&mut self, f: &Self::File, buf: &mut [u8], offset: u64) -> usize;
    /// Attributes of `path` itself (symlinks not followed).
    fn stat(&mut self, path: &str) -> Stat;
    /// Names in directory `path`, without `.` and `..`.
    fn read_dir(&mut self, path: &str) -> BTreeSet<String>;
    /// Target of symlink `path`.
    fn read_link(&mut self, path: &str) -> PathBuf;
    /// Closes `f`.
    fn close(&mut self, f: Self::File);
}

/// A directory through `std::fs`: the source (the model), or a real mount (the kernel path).
struct StdDir {
    root: PathBuf,
    /// Drop the kernel's cached pages of each file opened, so reads reach ferry (its chunk
    /// store, prefetcher and the server) rather than the page cache.
    drop_cache: bool,
}

impl Target for StdDir {
    type File = std::fs::File;

    fn open(&mut self, path: &str) -> std::fs::File {
        let f = std::fs::File::open(self.root.join(path)).unwrap();
        if self.drop_cache {
            use std::os::fd::AsRawFd;
            // SAFETY: an open fd; DONTNEED only drops clean cached pages.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        f
    }

    fn read_at(&mut self, f: &std::fs::File, buf: &mut [u8], offset: u64) -> usize {
        // pread until `buf` is full or the end of the file.
        let mut n = 0;
        while n < buf.len() {
            match f.read_at(&mut buf[n..], offset + n as u64).unwrap() {
                0 => break,
                k => n += k,
            }
        }
        n
    }

    fn stat(&mut self, path: &str) -> Stat {
        let m = std::fs::symlink_metadata(self.root.join(path)).unwrap();
        let t = m.file_type();
        Stat {
            kind: if t.is_file() {
                Kind::File
            } else if t.is_dir() {
                Kind::Dir
            } else if t.is_symlink() {
                Kind::Symlink
            } else {
                Kind::Other
            },
            len: m.len(),
            mode: m.mode(),
            mtime: (m.mtime(), m.mtime_nsec()),
        }
    }

    fn read_dir(&mut self, path: &str) -> BTreeSet<String> {
        std::fs::read_dir(self.root.join(path))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    fn read_link(&mut self, path: &str) -> PathBuf {
        std::fs::read_link(self.root.join(path)).unwrap()
    }

    fn close(&mut self, f: std::fs::File) {
        drop(f);
    }
}

/// Runs `ops` on `subject` and on the `model`; the first difference fails the case.
fn check<S: Target, M: Target>(
    ops: &[Op],
    model: &mut M,
    subject: &mut S,
) -> Result<(), TestCaseError> {
    // Open handles: (subject file, model file, name).
    let mut handles: Vec<(S::File, M::File, String)> = Vec::new();
    for op in ops {
        match op {
            Op::Open(i) => {
                let name = FILES[*i].0;
                if handles.len() < 8 {
                    handles.push((subject.open(name), model.open(name), name.to_string()));
                }
            }
            Op::Read {
                handle,
                offset,
                len,
            } => {
                if handles.is_empty() {
                    continue;
                }
                let (m, s, name) = &handles[handle % handles.len()];
                let (mut a, mut b) = (vec![0u8; *len], vec![0u8; *len]);
                let na = subject.read_at(m, &mut a, *offset);
                let nb = model.read_at(s, &mut b, *offset);
                prop_assert_eq!(na, nb, "read of {} at {}+{}: length", name, offset, len);
                prop_assert!(
                    a[..na] == b[..nb],
                    "read of {} at {}+{}: bytes differ",
                    name,
                    offset,
                    len
                );
            }
            Op::Stat(i) => {
                let p = path_of(*i);
                let (a, b) = (subject.stat(&p), model.stat(&p));
                prop_assert_eq!(a.kind, b.kind, "stat {}: kind", p);
                if a.kind != Kind::Dir {
                    prop_assert_eq!(a.len, b.len, "stat {}: size", p);
                }
                prop_assert_eq!(a.mode, b.mode, "stat {}: mode", p);
                prop_assert_eq!(a.mtime, b.mtime, "stat {}: mtime", p);
            }
            Op::ReadDir(i) => {
                let d = DIRS[*i];
                prop_assert_eq!(subject.read_dir(d), model.read_dir(d), "readdir {}", d);
            }
            Op::ReadLink(i) => {
                let l = LINKS[*i].0;
                prop_assert_eq!(subject.read_link(l), model.read_link(l), "readlink {}", l);
            }
            Op::Close(h) => {
                if !handles.is_empty() {
                    let i = h % handles.len();
                    let (a, b, _) = handles.remove(i);
                    subject.close(a);
                    model.close(b);
                }
            }
        }
    }
    for (a, b, _) in handles {
        subject.close(a);
        model.close(b);
    }
    Ok(())
}

fn build(root: &Path) -> PathBuf {
    for d in DIRS {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (i, (name, size)) in FILES.iter().enumerate() {
        write_random(&root.join(name), *size, 1000 + i as u64);
    }
    for (name, target) in LINKS {
        std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    }
    root.to_path_buf()
}

/// 64 random cases of up to 60 operations.
fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    })
}

fn model_of(src: &Path) -> StdDir {
    StdDir {
        root: src.to_path_buf(),
        drop_cache: false,
    }
}

#[test]
fn random_operation_sequences_match_the_source() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    build(src.path());
    let server = TestServer::start(src.path());
    // Small chunks (64 KiB) put more chunk boundaries inside the files; a second mount
    // uses the default chunk size.
    for args in [&["--chunk-size", "64"][..], &[][..]] {
        let mount = TestMount::mount(&server.addr, args);
        let r = runner().run(&proptest::collection::vec(op(), 1..60), |ops| {
            let mut subject = StdDir {
                root: mount.path(),
                drop_cache: true,
            };
            check(&ops, &mut model_of(src.path()), &mut subject)
        });
        if let Err(e) = r {
            panic!("{args:?}: {e}\nmount log:\n{}", mount.log_text());
        }
    }
}

/// The same sequences against `Fs` itself, over an in-process ferryd: no kernel, so the
/// file system's own answers are checked without the page cache in between; after each
/// case, every reference the case took is forgotten and must leave no inode behind.
#[test]
fn random_operation_sequences_match_the_source_through_fs() {
    let src = tempfile::tempdir().unwrap();
    build(src.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr = direct::serve(&rt, src.path());
    for chunk_size in [64 << 10, 1 << 20] {
        let fs = direct::connect(&rt, &addr, chunk_size);
        let r = runner().run(&proptest::collection::vec(op(), 1..60), |ops| {
            let mut subject = direct::FsTarget::new(&fs, rt.handle());
            check(&ops, &mut model_of(src.path()), &mut subject)?;
            subject.forget_all()
        });
        if let Err(e) = r {
            panic!("chunk size {chunk_size}: {e}");
        }
    }
}
