//! A whole tree through the mount: metadata to the nanosecond, symlinks of every kind,
//! big directories, rsync, and the errors readers and writers get.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::Command;

use ferry_tests::{require_fuse, run, walk, write_random, TestMount, TestServer};

/// Sets atime/mtime to the nanosecond, without following a final symlink.
fn set_mtime(p: &Path, sec: i64, nsec: i64) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
    ];
    // SAFETY: valid path and two timespecs, as utimensat requires.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat {}", p.display());
}

fn build_tree(root: &Path) {
    let d = |p: &str| std::fs::create_dir_all(root.join(p)).unwrap();
    d("a/b/c");
    d("empty");
    d("a/empty2");
    d("big");
    for (i, size) in [0usize, 1, 4095, 4096, 65537, (1 << 20) - 1, (1 << 20) + 1]
        .iter()
        .enumerate()
    {
        write_random(&root.join(format!("a/f{size}")), *size, i as u64);
    }
    std::fs::write(root.join("a/b/c/deep.txt"), b"deep\n").unwrap();
    std::fs::write(root.join("name with spaces & ünïcode"), b"x").unwrap();
    symlink("b/c/deep.txt", root.join("a/rel_link")).unwrap();
    symlink("../../nowhere", root.join("a/dangling")).unwrap();
    symlink("/etc/hostname", root.join("abs_link")).unwrap();
    symlink("a/b", root.join("dir_link")).unwrap();
    for i in 0..20_000 {
        std::fs::write(root.join(format!("big/entry{i:05}")), b"").unwrap();
    }
    let mode = |p: &str, m: u32| {
        std::fs::set_permissions(root.join(p), std::fs::Permissions::from_mode(m)).unwrap()
    };
    mode("a/f0", 0o600);
    mode("a/f1", 0o755);
    mode("a/f4095", 0o4751);
    mode("a/f4096", 0o444);
    mode("empty", 0o1777);
    mode("a/empty2", 0o700);
    // Distinct nanosecond mtimes everywhere, set last (children before parents).
    let mut n = 0;
    let all = walk(root);
    for m in all.iter().rev() {
        n += 1;
        set_mtime(
            &root.join(&m.rel),
            1_600_000_000 + n,
            (n * 7_777_777) % 1_000_000_000,
        );
    }
    set_mtime(root, 1_500_000_000, 123_456_789);
}

#[test]
fn listing_and_metadata_equal_the_source() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    build_tree(src.path());
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &[]);
    let want = walk(src.path());
    let got = walk(&mount.path());
    assert_eq!(want.len(), got.len(), "number of objects");
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w, g);
    }
    assert!(want.len() > 20_000);
}

#[test]
fn rsync_copy_equals_the_source() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    build_tree(src.path());
    let dst = tempfile::tempdir().unwrap();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &[]);
    run(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", mount.path().display()))
        .arg(format!("{}/", dst.path().display())));
    run(Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(src.path())
        .arg(dst.path()));
    // rsync -a keeps modes, mtimes and link targets: the copy's metadata equals the source.
    let want = walk(src.path());
    let got = walk(dst.path());
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(
            (&w.rel, w.mode, w.mtime, &w.target),
            (&g.rel, g.mode, g.mtime, &g.target)
        );
    }
}

#[test]
fn missing_names_are_enoent_and_writes_are_erofs() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("file"), b"data").unwrap();
    std::fs::create_dir(src.path().join("dir")).unwrap();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &[]);
    let m = mount.path();
    let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error());

    assert_eq!(
        errno(std::fs::metadata(m.join("nope")).map(|_| ())),
        Some(libc::ENOENT)
    );
    assert_eq!(
        errno(std::fs::metadata(m.join("dir/nope/deeper")).map(|_| ())),
        Some(libc::ENOENT)
    );
    assert_eq!(
        errno(std::fs::File::open(m.join("nope")).map(|_| ())),
        Some(libc::ENOENT)
    );

    let erofs = Some(libc::EROFS);
    assert_eq!(
        errno(std::fs::File::create(m.join("new")).map(|_| ())),
        erofs,
        "create"
    );
    assert_eq!(
        errno(
            std::fs::OpenOptions::new()
                .write(true)
                .open(m.join("file"))
                .map(|_| ())
        ),
        erofs,
        "open for write"
    );
    assert_eq!(
        errno(
            std::fs::OpenOptions::new()
                .append(true)
                .open(m.join("file"))
                .map(|_| ())
        ),
        erofs,
        "open for append"
    );
    assert_eq!(errno(std::fs::remove_file(m.join("file"))), erofs, "unlink");
    assert_eq!(errno(std::fs::create_dir(m.join("newdir"))), erofs, "mkdir");
    assert_eq!(errno(std::fs::remove_dir(m.join("dir"))), erofs, "rmdir");
    assert_eq!(
        errno(std::fs::rename(m.join("file"), m.join("moved"))),
        erofs,
        "rename"
    );
    assert_eq!(
        errno(std::fs::set_permissions(
            m.join("file"),
            std::fs::Permissions::from_mode(0o777)
        )),
        erofs,
        "chmod"
    );
    assert_eq!(errno(symlink("x", m.join("link"))), erofs, "symlink");
    assert_eq!(
        errno(std::fs::hard_link(m.join("file"), m.join("hard"))),
        erofs,
        "link"
    );
    // Nothing changed on the server.
    assert_eq!(std::fs::read(src.path().join("file")).unwrap(), b"data");
    assert_eq!(std::fs::read_dir(src.path()).unwrap().count(), 2);
}

#[test]
fn cp_r_of_a_deep_tree_equals_the_source() {
    // cp -r walks directories in listing order: the path the directory read-ahead
    // (subdirectory listings and first chunks fetched before cp gets there) serves.
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    for a in 0..6 {
        for b in 0..6 {
            let d = src.path().join(format!("d{a}/e{b}"));
            std::fs::create_dir_all(&d).unwrap();
            for f in 0..12 {
                write_random(
                    &d.join(format!("f{f}")),
                    3000 + f * 777,
                    (a * 1000 + b * 100 + f) as u64,
                );
            }
        }
        std::fs::write(src.path().join(format!("d{a}/empty")), b"").unwrap();
    }
    let dst = tempfile::tempdir().unwrap();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &[]);
    run(Command::new("cp")
        .arg("-r")
        .arg(mount.path())
        .arg(dst.path().join("copy")));
    run(Command::new("diff")
        .arg("-r")
        .arg(src.path())
        .arg(dst.path().join("copy")));
}

#[test]
fn a_subdirectory_listed_ahead_is_listed_afresh_after_the_ttl() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("sub")).unwrap();
    std::fs::write(src.path().join("sub/old"), b"old").unwrap();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &["--attr-timeout", "1"]);
    // Listing the root fetches sub's listing ahead.
    let root: Vec<_> = std::fs::read_dir(mount.path()).unwrap().collect();
    assert_eq!(root.len(), 1);
    std::fs::write(src.path().join("sub/new"), b"new").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut names: Vec<String> = std::fs::read_dir(mount.path().join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["new", "old"]);
    assert_eq!(std::fs::read(mount.path().join("sub/new")).unwrap(), b"new");
}
