//! A whole tree through the mount: metadata to the nanosecond, symlinks of every kind,
//! big directories, rsync, and the errors readers and writers get.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::os::unix::fs::{symlink, PermissionsExt};
use std::process::Command;

use ferry_tests::{build_tree, require_fuse, run, walk, write_random, TestMount, TestServer};

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
