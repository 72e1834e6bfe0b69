//! `ferry mirror` end to end: a real ferryd, the real binary, the tools users check with
//! (`diff -r`), kill -9 and resume, changes on the server, `ferry status`.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ferry_tests::{bin, build_tree, run, walk, write_random, TestServer};

fn mirror_cmd(server: &TestServer, dir: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(bin("ferry"));
    c.arg("mirror")
        .arg(&server.addr)
        .arg(dir)
        .arg("--quiet")
        .args(extra);
    c
}

fn status_json(dir: &Path) -> serde_json::Value {
    let out = run(Command::new(bin("ferry"))
        .arg("status")
        .arg(dir)
        .arg("--json"));
    serde_json::from_str(&out).unwrap()
}

/// The copy equals the source: contents and link targets (`diff -r --no-dereference`),
/// then type, mode, size, nanosecond mtime and link target of every entry. The state
/// folder is not part of the copy.
fn assert_same_tree(src: &Path, copy: &Path) {
    run(Command::new("diff")
        .args(["-r", "--no-dereference", "--exclude=.ferry"])
        .arg(src)
        .arg(copy));
    let want = walk(src);
    let got: Vec<_> = walk(copy)
        .into_iter()
        .filter(|m| !m.rel.starts_with(".ferry"))
        .collect();
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

#[test]
fn mirror_of_a_tree_equals_the_source_and_a_rerun_moves_nothing() {
    let src = tempfile::tempdir().unwrap();
    build_tree(src.path());
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    let server = TestServer::start(src.path());
    run(&mut mirror_cmd(&server, &copy, &[]));
    assert_same_tree(src.path(), &copy);
    let s = status_json(&copy);
    assert_eq!(s["state"], "complete");
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
    let out = run(Command::new(bin("ferry")).arg("status").arg(&copy));
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
    // Slowed down so the kills land mid-copy (about 20 MB/s).
    for (round, delay) in [700u64, 900, 500].iter().enumerate() {
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
        let present: u64 = {
            let c = ferry_cache::CacheDir::open(&copy).unwrap();
            c.all().iter().map(|(_, s)| s.present_bytes()).sum()
        };
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
    let _held = ferry_cache::CacheDir::open(dst.path()).unwrap();
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

    let out = Command::new(bin("ferry"))
        .arg("status")
        .arg(src.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no ferry state"));
}
