//! A model-based property test of the read path: random sequences of open, read (at random
//! offsets and lengths), stat, readdir, readlink and close against a real mount, each
//! compared with the same call on the source directory (the model).

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::collections::BTreeSet;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use ferry_tests::{require_fuse, write_random, TestMount, TestServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

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

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Runs `ops` on the mount and on the source; the first difference fails the case.
fn check(ops: &[Op], src: &Path, mnt: &Path) -> Result<(), TestCaseError> {
    // Open handles: (mount file, source file, name).
    let mut handles: Vec<(std::fs::File, std::fs::File, String)> = Vec::new();
    for op in ops {
        match op {
            Op::Open(i) => {
                let name = FILES[*i].0;
                if handles.len() < 8 {
                    let m = std::fs::File::open(mnt.join(name)).unwrap();
                    // The kernel's cached pages of the file are dropped, so reads reach ferry
                    // (its chunk store, prefetcher and the server) rather than the page cache.
                    use std::os::fd::AsRawFd;
                    // SAFETY: an open fd; DONTNEED only drops clean cached pages.
                    unsafe { libc::posix_fadvise(m.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                    handles.push((
                        m,
                        std::fs::File::open(src.join(name)).unwrap(),
                        name.to_string(),
                    ));
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
                let na = read_full(m, &mut a, *offset);
                let nb = read_full(s, &mut b, *offset);
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
                let (a, b) = (
                    std::fs::symlink_metadata(mnt.join(&p)).unwrap(),
                    std::fs::symlink_metadata(src.join(&p)).unwrap(),
                );
                prop_assert_eq!(a.file_type(), b.file_type(), "stat {}: kind", p);
                if !a.is_dir() {
                    prop_assert_eq!(a.len(), b.len(), "stat {}: size", p);
                }
                prop_assert_eq!(a.mode(), b.mode(), "stat {}: mode", p);
                prop_assert_eq!(
                    (a.mtime(), a.mtime_nsec()),
                    (b.mtime(), b.mtime_nsec()),
                    "stat {}: mtime",
                    p
                );
            }
            Op::ReadDir(i) => {
                let d = DIRS[*i];
                prop_assert_eq!(names(&mnt.join(d)), names(&src.join(d)), "readdir {}", d);
            }
            Op::ReadLink(i) => {
                let l = LINKS[*i].0;
                prop_assert_eq!(
                    std::fs::read_link(mnt.join(l)).unwrap(),
                    std::fs::read_link(src.join(l)).unwrap(),
                    "readlink {}",
                    l
                );
            }
            Op::Close(h) => {
                if !handles.is_empty() {
                    let i = h % handles.len();
                    handles.remove(i);
                }
            }
        }
    }
    Ok(())
}

/// pread until `buf` is full or the end of the file.
fn read_full(f: &std::fs::File, buf: &mut [u8], offset: u64) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], offset + n as u64).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
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
        let mut runner = TestRunner::new(Config {
            cases: 64,
            failure_persistence: None,
            ..Config::default()
        });
        let r = runner.run(&proptest::collection::vec(op(), 1..60), |ops| {
            check(&ops, src.path(), &mount.path())
        });
        if let Err(e) = r {
            panic!("{args:?}: {e}\nmount log:\n{}", mount.log_text());
        }
    }
}
