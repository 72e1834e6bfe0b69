//! `ferry mirror` end to end: a real ferryd, the real binary, the tools users check with
//! (`diff -r`), kill -9 and resume, changes on the server, `ferry status`.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ferry_tests::{build_tree, run, walk, write_random, TestServer};

fn mirror_cmd(server: &TestServer, dir: &Path, extra: &[&str]) -> Command {
    let mut c = ferry_tests::ferry();
    c.arg("mirror")
        .arg(&server.addr)
        .arg(dir)
        .arg("--quiet")
        .args(extra);
    c
}

fn status_json(dir: &Path) -> serde_json::Value {
    let out = run(ferry_tests::ferry().arg("status").arg(dir).arg("--json"));
    serde_json::from_str(&out).unwrap()
}

/// The copy equals the source: contents and link targets (`diff -r --no-dereference`),
/// then type, mode, size, nanosecond mtime and link target of every entry. The state
/// folder is not part of the copy.
fn assert_same_tree(src: &Path, copy: &Path) {
    run(Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(src)
        .arg(copy));
    let want = walk(src);
    // Exactly the source: ferry's state is kept outside the copy.
    let got = walk(copy);
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(
            (&w.rel, w.mode, w.size, w.mtime, w.mtime_nsec, &w.target),
            (&g.rel, g.mode, g.size, g.mtime, g.mtime_nsec, &g.target),
        );
    }
    let (rs, rc) = (
        std::fs::metadata(src).unwrap(),
        std::fs::metadata(copy).unwrap(),
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (rs.mode(), rs.mtime(), rs.mtime_nsec()),
        (rc.mode(), rc.mtime(), rc.mtime_nsec())
    );
}

/// `ferry mirror` of `src` from a ferryd exporting it, into a fresh directory: the copy
/// equals the source ([`assert_same_tree`]) and its status says complete. Returns the
/// destination's holder, the copy, the server and the status.
fn mirror_anew(src: &Path) -> (tempfile::TempDir, PathBuf, TestServer, serde_json::Value) {
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    let server = TestServer::start(src);
    run(&mut mirror_cmd(&server, &copy, &[]));
    assert_same_tree(src, &copy);
    let s = status_json(&copy);
    assert_eq!(s["state"], "complete");
    (dst, copy, server, s)
}

#[test]
fn mirror_of_a_tree_equals_the_source_and_a_rerun_moves_nothing() {
    let src = tempfile::tempdir().unwrap();
    build_tree(src.path());
    let (_dst, copy, server, s) = mirror_anew(src.path());
    assert_eq!(s["files_total"], s["files_done"]);
    assert_eq!(s["files_total"], s["files_verified"]);
    assert_eq!(s["error_count"], 0);
    let total = s["bytes_total"].as_u64().unwrap();
    assert_eq!(s["bytes_fetched"].as_u64().unwrap(), total);

    // A second run finds everything complete and verified: nothing moves.
    run(&mut mirror_cmd(&server, &copy, &[]));
    let s = status_json(&copy);
    assert_eq!(s["state"], "complete");
    assert_eq!(s["bytes_fetched"], 0);
    assert_eq!(s["files_verified"], 0);
    assert_eq!(s["bytes_done"].as_u64().unwrap(), total);
    assert_same_tree(src.path(), &copy);
    // The human report says so too.
    let out = run(ferry_tests::ferry().arg("status").arg(&copy));
    assert!(out.contains("complete"), "{out}");
}

#[test]
fn kill_9_mid_mirror_then_resume_refetches_no_completed_chunk() {
    let src = tempfile::tempdir().unwrap();
    for i in 0..4 {
        write_random(
            &src.path().join(format!("big{i}.bin")),
            (24 << 20) + i * 4097,
            40 + i as u64,
        );
    }
    std::fs::create_dir(src.path().join("small")).unwrap();
    for i in 0..300 {
        write_random(
            &src.path().join(format!("small/f{i}")),
            100 + i * 37,
            i as u64,
        );
    }
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    let server = TestServer::start(src.path());
    let total: u64 = (0..4).map(|i| (24u64 << 20) + i * 4097).sum::<u64>()
        + (0..300).map(|i| 100 + i * 37).sum::<u64>();
    // Slowed down so the kills land mid-copy (about 20 MB/s), at random moments (printed, so
    // a failure can be replayed).
    let delays: Vec<u64> = {
        use rand::Rng;
        let mut rng = rand::rng();
        (0..3).map(|_| rng.random_range(300..1100)).collect()
    };
    eprintln!("kill -9 after {delays:?} ms");
    for (round, delay) in delays.iter().enumerate() {
        let mut child = mirror_cmd(&server, &copy, &["--bwlimit", "20M"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(*delay));
        let finished = child.try_wait().unwrap().is_some();
        let _ = child.kill();
        child.wait().unwrap();
        assert!(
            !finished,
            "round {round}: the mirror finished before the kill"
        );
        // What the journal says is present must be on disk: the resumed run fetches
        // exactly the rest.
        let present = ferry_tests::present_bytes(&copy);
        assert!(present < total);
        if round == 2 {
            run(&mut mirror_cmd(&server, &copy, &[]));
            let s = status_json(&copy);
            assert_eq!(s["state"], "complete");
            assert_eq!(
                s["bytes_fetched"].as_u64().unwrap(),
                total - present,
                "completed chunks were fetched again"
            );
        }
    }
    assert_same_tree(src.path(), &copy);
}

#[test]
fn a_file_changed_during_the_mirror_ends_as_the_new_version() {
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("grows.bin"), 16 << 20, 1);
    write_random(&src.path().join("other.bin"), 4 << 20, 2);
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    let server = TestServer::start(src.path());
    let child = mirror_cmd(&server, &copy, &["--bwlimit", "8M"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    // Rewritten in place with new bytes and a new size while the mirror copies it.
    write_random(&src.path().join("grows.bin"), (18 << 20) + 5, 3);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same_tree(src.path(), &copy);
    let s = status_json(&copy);
    assert!(s["files_changed"].as_u64().unwrap() >= 1, "{s}");
}

#[test]
fn a_busy_directory_and_a_bad_rate_get_one_line_errors() {
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("a"), 1000, 1);
    let dst = tempfile::tempdir().unwrap();
    let server = TestServer::start(src.path());
    let _held = ferry_tests::open_cache(dst.path());
    let out = mirror_cmd(&server, dst.path(), &[]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another ferry process"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let out = mirror_cmd(&server, dst.path(), &["--bwlimit", "fast"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bwlimit fast"));

    let out = ferry_tests::ferry()
        .arg("status")
        .arg(src.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no ferry state was found for it"));
}

#[test]
fn a_disk_too_small_gets_the_files_that_fit_and_a_clear_report_of_the_rest() {
    if !ferry_tests::is_root() {
        eprintln!("skipped: needs root to mount a small tmpfs");
        return;
    }
    let src = tempfile::tempdir().unwrap();
    // 3 MiB of room: the two 1.2 MB files fit, the 6 MB one does not (it comes first in
    // name order, and must not take the room of the others).
    write_random(&src.path().join("a-big.bin"), 6_000_000, 21);
    write_random(&src.path().join("b-fits.bin"), 1_200_000, 23);
    write_random(&src.path().join("c-fits.bin"), 1_200_000, 24);
    write_random(&src.path().join("small"), 1000, 22);
    let dst = ferry_tests::SmallTmpfs::mount("3m");
    let copy = dst.path().join("copy");
    let server = TestServer::start(src.path());
    let out = mirror_cmd(&server, &copy, &[]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/a-big.bin: not copied: it needs 5.7 MiB and")
            && err.contains("free some space and run again"),
        "{err}"
    );
    assert!(
        err.lines().last().unwrap().contains("mirror incomplete"),
        "{err}"
    );
    for f in ["b-fits.bin", "c-fits.bin", "small"] {
        assert_eq!(
            std::fs::read(copy.join(f)).unwrap(),
            std::fs::read(src.path().join(f)).unwrap(),
            "{f} fits and is copied"
        );
    }
    assert!(!copy.join("a-big.bin").exists(), "nothing of it written");
    // The status says so.
    let s = status_json(&copy);
    assert_eq!(s["state"], "incomplete", "{s}");
    assert_eq!(s["error_count"].as_u64(), Some(1), "{s}");
    assert_eq!(s["files_verified"].as_u64(), Some(3), "{s}");
    // The state opens, and claims nothing that is not on disk.
    let c = ferry_tests::open_cache(&copy);
    for (rel, st) in c.all() {
        let name = String::from_utf8_lossy(&rel).into_owned();
        let want = std::fs::read(src.path().join(&name)).unwrap();
        let local = std::fs::read(copy.join(&name)).unwrap();
        for i in 0..st.chunks() {
            if st.has(i) {
                let (a, b) = (
                    (i as usize) << 20,
                    (((i + 1) as usize) << 20).min(want.len()),
                );
                assert_eq!(
                    &local[a..b],
                    &want[a..b],
                    "{name} chunk {i} recorded but wrong"
                );
            }
        }
    }
}

#[test]
fn a_renamed_destination_is_taken_as_it_is_and_a_file_edited_in_it_is_fetched_again() {
    let src = tempfile::tempdir().unwrap();
    build_tree(src.path());
    write_random(&src.path().join("big-a"), 5 << 20, 41);
    write_random(&src.path().join("big-b"), 3 << 20, 42);
    let server = TestServer::start(src.path());
    let dst = tempfile::tempdir().unwrap();
    let (first, moved) = (dst.path().join("first"), dst.path().join("moved"));
    run(&mut mirror_cmd(&server, &first, &[]));
    std::fs::rename(&first, &moved).unwrap();
    // One byte of big-b changed in the copy, its size and mtime put back: only a hash
    // can tell.
    let b = moved.join("big-b");
    let mtime = std::fs::metadata(&b).unwrap().modified().unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&b)
            .unwrap();
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, 1000).unwrap();
        f.write_all_at(&[byte[0] ^ 0xff], 1000).unwrap();
        f.set_modified(mtime).unwrap();
    }
    // The renamed copy has no state under its new path: big-a is taken as it is (its hash
    // is the server's), big-b fetched again.
    run(&mut mirror_cmd(&server, &moved, &[]));
    assert_same_tree(src.path(), &moved);
    let s = status_json(&moved);
    let fetched = s["bytes_fetched"].as_u64().unwrap();
    assert!(
        (3 << 20..5 << 20).contains(&fetched),
        "fetched {fetched}: big-b (3 MiB) and the small files, not big-a: {s}"
    );
}

#[test]
fn a_remote_root_that_is_a_file_or_missing_gets_a_one_line_error_and_the_server_serves_on() {
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("a"), 1000, 1);
    std::fs::create_dir(src.path().join("d")).unwrap();
    write_random(&src.path().join("d/b"), 300_000, 2);
    let server = TestServer::start(src.path());
    // The root's listing is asked for beside its Stat: for a file or a missing path it is
    // dropped, and the Stat's answer is what the user reads.
    for (path, want) in [("/a", "is not a directory"), ("/missing", "/missing")] {
        let dst = tempfile::tempdir().unwrap();
        let out = ferry_tests::ferry()
            .arg("mirror")
            .arg(format!("{}:{path}", server.addr))
            .arg(dst.path())
            .arg("--quiet")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{path}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{path}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(!dst.path().join("a").exists() && !dst.path().join("b").exists());
    }
    let dst = tempfile::tempdir().unwrap();
    run(ferry_tests::ferry()
        .arg("mirror")
        .arg(format!("{}:/d", server.addr))
        .arg(dst.path())
        .arg("--quiet"));
    run(Command::new("cmp")
        .arg(src.path().join("d/b"))
        .arg(dst.path().join("b")));
}

#[test]
fn a_deep_narrow_tree_and_a_directory_larger_than_a_tree_page_are_mirrored_whole() {
    // The listings come in pages of a tree (ReadTree): a chain of 40 directories is more
    // levels than a page reaches past a directory of 6,000 entries (more than a page holds:
    // it ends cut short and is completed with ReadDir), and a symlink to a directory is
    // copied as a link, never listed through.
    let src = tempfile::tempdir().unwrap();
    let big = src.path().join("big");
    std::fs::create_dir(&big).unwrap();
    for i in 0..6000 {
        std::fs::write(big.join(format!("entry-{i:05}")), format!("{i}\n")).unwrap();
    }
    let mut deep = src.path().join("deep");
    for level in 0..40 {
        std::fs::create_dir(&deep).unwrap();
        write_random(&deep.join("f"), 100 + level * 997, level as u64);
        deep = deep.join(format!("level{level}"));
    }
    for w in 0..30 {
        let d = src.path().join(format!("wide/w{w}/x/y"));
        std::fs::create_dir_all(&d).unwrap();
        write_random(&d.join("z"), 5000, 100 + w);
    }
    std::os::unix::fs::symlink("deep", src.path().join("link-to-deep")).unwrap();
    let (_dst, copy, _server, s) = mirror_anew(src.path());
    assert!(copy.join("link-to-deep").is_symlink());
    assert_eq!(s["files_total"].as_u64().unwrap(), 6000 + 40 + 30);
    assert_eq!(s["files_total"], s["files_verified"]);
}

#[test]
fn a_large_file_is_verified_with_hashes_worked_out_while_it_travels() {
    // Over 64 MiB: ferryd's hash is asked for when the copy starts and the local copy is
    // read back as its prefix grows; a rerun finds it verified and moves nothing.
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("datafile"), (80 << 20) + 4321, 9);
    let (_dst, copy, server, s) = mirror_anew(src.path());
    assert_eq!(s["files_verified"], 1);
    run(&mut mirror_cmd(&server, &copy, &["--checksum"]));
    let s = status_json(&copy);
    assert_eq!(
        (s["state"].as_str(), s["bytes_fetched"].as_u64()),
        (Some("complete"), Some(0))
    );
}
