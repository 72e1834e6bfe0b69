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

/// A deep, narrow tree of the shape of a real source tree: small files (most under the
/// size that comes with listings), a few larger ones, empty files, symlinks, nested
/// directories several levels down.
fn deep_source_tree(root: &std::path::Path) {
    for a in 0..4 {
        for depth in 0..5 {
            let mut d = root.join(format!("top{a}"));
            for level in 0..=depth {
                d = d.join(format!("level{level}"));
            }
            std::fs::create_dir_all(&d).unwrap();
            for f in 0..9u64 {
                let len = match f {
                    0 => 0,
                    8 => 300_000 + 1000 * a as usize, // larger than a listing carries
                    _ => 200 + (f as usize * 1733) % 20_000,
                };
                write_random(
                    &d.join(format!("f{f}.h")),
                    len,
                    a as u64 * 100 + depth * 10 + f,
                );
            }
            symlink(format!("f{}.h", depth % 8), d.join("link")).unwrap();
        }
    }
}

#[test]
fn cp_rsync_and_tar_of_a_deep_source_tree_equal_the_source() {
    // Each tool walks in its own order (cp and tar: listing order; rsync: sorted, its file
    // list first): listings ahead, runs of small files and first chunks serve them all, and
    // the files fetched ahead go to the page cache with their opens.
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    deep_source_tree(src.path());
    let server = TestServer::start(src.path());
    for tool in ["cp", "rsync", "tar"] {
        let dst = tempfile::tempdir().unwrap();
        let copy = dst.path().join("copy");
        let mount = TestMount::mount(&server.addr, &[]);
        match tool {
            "cp" => run(Command::new("cp").arg("-r").arg(mount.path()).arg(&copy)),
            "rsync" => run(Command::new("rsync")
                .arg("-a")
                .arg(format!("{}/", mount.path().display()))
                .arg(format!("{}/", copy.display()))),
            _ => {
                std::fs::create_dir(&copy).unwrap();
                run(Command::new("sh").arg("-c").arg(format!(
                    "tar -cf - -C '{}' . | tar -xf - -C '{}'",
                    mount.path().display(),
                    copy.display()
                )))
            }
        };
        run(Command::new("diff")
            .args(["-r", "--no-dereference"])
            .arg(src.path())
            .arg(&copy));
        assert_eq!(walk(src.path()).len(), walk(&copy).len(), "{tool}: objects");
        let given = ferry_tests::status(&mount.path())["mount"]["files_given_at_open"]
            .as_u64()
            .unwrap();
        // Small files fetched ahead reach the kernel's page cache with their open, their
        // reads never coming to the mount: most of the tree's 160 non-empty files (158-159
        // in local runs), never more.
        assert!(
            (80..=160).contains(&given),
            "{tool}: {given} files given to the page cache at their open"
        );
    }
}

#[test]
fn files_changed_on_the_server_after_they_were_fetched_ahead_are_read_as_they_are_now() {
    // A copy starts (files are being read), so listings ahead bring the small files'
    // contents; then the server's files change, vanish and appear. After the attributes'
    // TTL, a copy holds exactly what the server holds now: nothing fetched ahead for an
    // old version is served.
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    deep_source_tree(src.path());
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &["--attr-timeout", "1"]);
    let first = mount.path().join("top0/level0/f1.h");
    assert_eq!(
        std::fs::read(&first).unwrap(),
        std::fs::read(src.path().join("top0/level0/f1.h")).unwrap()
    );
    // Walk the tree, so every directory (and its small files) is fetched ahead.
    assert!(walk(&mount.path()).len() > 200);
    let mut changed = 0;
    for m in walk(src.path()) {
        let p = src.path().join(&m.rel);
        if m.target.is_some() || !p.is_file() {
            continue;
        }
        match changed % 3 {
            // New bytes, new size.
            0 => write_random(&p, 123 + changed, 9_000 + changed as u64),
            // Replaced by a renamed file.
            1 => {
                let tmp = p.with_extension("tmp");
                write_random(&tmp, 4_000 + changed, 7_000 + changed as u64);
                std::fs::rename(&tmp, &p).unwrap();
            }
            _ => std::fs::remove_file(&p).unwrap(),
        }
        changed += 1;
    }
    std::fs::write(src.path().join("top1/level0/new.h"), b"appeared").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    run(Command::new("cp").arg("-r").arg(mount.path()).arg(&copy));
    run(Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(src.path())
        .arg(&copy));
    assert!(changed > 100);
}

#[test]
fn a_tree_larger_than_the_chunk_memory_copies_whole() {
    // 1 MiB of chunk memory and about 8 MiB of small files: the files fetched ahead stop
    // at the budget and go on as the copy frees room; nothing is lost or repeated.
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    for d in 0..8 {
        let dir = src.path().join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..100u64 {
            write_random(
                &dir.join(format!("f{f}")),
                10_000 + f as usize * 7,
                d * 1000 + f,
            );
        }
    }
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &["--chunk-memory", "1"]);
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    run(Command::new("cp").arg("-r").arg(mount.path()).arg(&copy));
    run(Command::new("diff").arg("-r").arg(src.path()).arg(&copy));
}

#[test]
fn find_ls_lr_and_du_over_a_deep_tree_move_no_file_data() {
    // A walk that only lists gets listings ahead, never file contents (an opendir used to
    // fetch the first files of every directory it opened).
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    deep_source_tree(src.path());
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &[]);
    let decoded = || ferry_tests::status(&mount.path())["mount"]["decoded_bytes"].as_u64();
    run(Command::new("find").arg(mount.path()));
    run(Command::new("ls").arg("-lR").arg(mount.path()));
    run(Command::new("du").arg("-s").arg(mount.path()));
    // Anything fetched ahead would have landed by now.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(decoded(), Some(0), "{}", mount.log_text());
    // A read moves data, so the count is not zero by construction.
    let f = mount.path().join("top0/level0/f3.h");
    assert_eq!(
        std::fs::read(&f).unwrap(),
        std::fs::read(src.path().join("top0/level0/f3.h")).unwrap()
    );
    assert!(decoded().unwrap() > 0);
}

#[test]
fn a_walk_that_only_lists_reads_symlink_targets_ahead() {
    // `ls -l` asks for every link's target: read with each listing, they are there when it
    // asks, even with the server gone (one round trip each in turn otherwise).
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    deep_source_tree(src.path());
    let mut server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &["--timeout", "2"]);
    run(Command::new("find").arg(mount.path()));
    std::thread::sleep(std::time::Duration::from_millis(500));
    server.kill9();
    let mut links = 0;
    for m in walk(src.path()) {
        if let Some(target) = m.target {
            let got = std::fs::read_link(mount.path().join(&m.rel));
            assert_eq!(got.ok(), Some(target), "{}", m.rel.display());
            links += 1;
        }
    }
    assert_eq!(links, 20);
}
