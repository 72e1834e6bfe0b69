//! `ferry mount --cache-dir DIR --mirror`: a background mirror fills the local copy while
//! readers use the mount; `ferry status MOUNTPOINT` reports it.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ferry_tests::{
    is_root, require_fuse, run, status, wait_for, write_random, TestMount, TestServer,
};

fn source_tree(root: &Path) {
    std::fs::create_dir_all(root.join("d/e")).unwrap();
    write_random(&root.join("big.bin"), (40 << 20) + 4321, 1);
    for i in 0..40 {
        write_random(
            &root.join(format!("d/f{i}")),
            1000 + i * 7919,
            100 + i as u64,
        );
    }
    write_random(&root.join("d/e/mid.bin"), (3 << 20) + 5, 2);
    std::fs::write(root.join("d/empty"), b"").unwrap();
    std::os::unix::fs::symlink("../big.bin", root.join("d/link")).unwrap();
}

#[test]
fn reads_during_a_running_mirror_are_correct_and_the_mirror_completes() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    source_tree(src.path());
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let server = TestServer::start(src.path());
    // Capped so that the mirror is still running while the reads below happen.
    let mut mount = TestMount::mount(
        &server.addr,
        &["--cache-dir", &cache_arg, "--mirror", "--bwlimit", "6M"],
    );
    let s = status(&mount.path());
    // The documented schema (docs/CONFIGURATION.md): every field is there.
    for key in [
        "state",
        "pid",
        "remote",
        "started_unix",
        "updated_unix",
        "elapsed_secs",
        "walk_done",
        "bytes_total",
        "bytes_done",
        "bytes_fetched",
        "files_total",
        "files_done",
        "files_verified",
        "chunks_fetched",
        "chunks_refetched",
        "hash_mismatches",
        "files_changed",
        "rate_bytes_per_sec",
        "eta_secs",
        "error_count",
        "errors",
        "faults",
        "scheduler",
        "mount",
    ] {
        assert!(s.get(key).is_some(), "status lacks {key}: {s}");
    }
    for key in [
        "retries",
        "checksum_failures",
        "reconnects",
        "stalls",
        "server_restarts",
        "live_streams",
        "inflight_requests",
        "wire_bytes",
        "decoded_bytes",
        "chunks",
    ] {
        assert!(s["faults"].get(key).is_some(), "faults lacks {key}: {s}");
    }
    for key in [
        "mountpoint",
        "cache_dir",
        "mirror",
        "bwlimit",
        "wire_bytes",
        "decoded_bytes",
        "chunks_served_locally",
        "chunks_stored",
        "store_errors",
        "files_verified_by_reads",
        "passthrough_opens",
    ] {
        assert!(s["mount"].get(key).is_some(), "mount lacks {key}: {s}");
    }
    for key in [
        "base_rtt_us",
        "queue_delay_us",
        "target_us",
        "background_window",
        "background_in_flight",
        "piece_size",
        "rate_bytes_per_sec",
        "demand_bytes",
        "prediction_bytes",
        "background_bytes",
        "readers_active",
        "cpu_wait_permille",
        "background_pace",
    ] {
        assert!(
            s["scheduler"].get(key).is_some(),
            "scheduler lacks {key}: {s}"
        );
    }
    assert_eq!(s["mount"]["mirror"], true, "{s}");
    assert_eq!(s["mount"]["bwlimit"], 6 << 20, "{s}");
    assert!(
        ["running", "mounted"].contains(&s["state"].as_str().unwrap()),
        "{s}"
    );

    // Random reads of the big file while the mirror fills it.
    let want = std::fs::read(src.path().join("big.bin")).unwrap();
    let f = std::fs::File::open(mount.path().join("big.bin")).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % want.len() as u64) as usize;
        let len = ((x >> 40) % (300 << 10)) as usize + 1;
        let mut buf = vec![0u8; len];
        let n = f.read_at(&mut buf, off as u64).unwrap();
        assert_eq!(n, len.min(want.len() - off));
        assert!(buf[..n] == want[off..off + n], "bytes differ at {off}+{n}");
    }
    // Whole-tree copies with the tools users run.
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg("-r")
        .arg(mount.path().join("d"))
        .arg(dst.path()));
    run(Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(src.path().join("d"))
        .arg(dst.path().join("d")));
    let s = status(&mount.path());
    assert_eq!(
        s["state"], "running",
        "the mirror should still be running (capped at 6 MiB/s): {s}"
    );
    run(Command::new("cmp")
        .arg(mount.path().join("big.bin"))
        .arg(src.path().join("big.bin")));

    // The mirror completes: the local copy equals the source.
    let done = wait_for(Duration::from_secs(60), || {
        status(&mount.path())["state"] == "complete"
    });
    let s = status(&mount.path());
    assert!(done, "mirror did not complete: {s}\n{}", mount.log_text());
    assert_eq!(s["files_total"], 43, "{s}");
    assert_eq!(s["files_done"], 43, "{s}");
    assert_eq!(s["error_count"], 0, "{s}");
    // Readers and the mirror each had their share, counted by class.
    let k = &s["scheduler"];
    assert!(k["background_bytes"].as_u64().unwrap() > 0, "{s}");
    assert!(k["demand_bytes"].as_u64().unwrap() > 0, "{s}");
    assert!(k["base_rtt_us"].as_u64().unwrap() > 0, "{s}");
    run(Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg("--exclude=.ferry")
        .arg(src.path())
        .arg(cache.path()));
    // The cache directory's own status says the same.
    let d = status(cache.path());
    assert_eq!(d["state"], "complete", "{d}");

    // Opens of complete, verified files are served from local disk.
    let again = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("d/e/mid.bin"))
        .arg(again.path()));
    run(Command::new("cmp")
        .arg(again.path().join("mid.bin"))
        .arg(src.path().join("d/e/mid.bin")));
    if is_root() {
        let s = status(&mount.path());
        assert!(
            s["mount"]["passthrough_opens"].as_u64().unwrap() >= 1,
            "{s}"
        );
    }
    // Unmounted cleanly: every file's record is in the journal.
    mount.signal_and_wait(libc::SIGTERM);
    let c = ferry_tests::open_cache(cache.path());
    let all = c.all();
    let mut names: Vec<String> = all
        .iter()
        .map(|(rel, _)| String::from_utf8_lossy(rel).into_owned())
        .collect();
    names.sort();
    assert_eq!(
        all.len(),
        43,
        "the journal lists {names:?}\n{}",
        mount.log_text()
    );
    for (rel, st) in all {
        assert!(
            st.complete() && st.verified.is_some(),
            "{}: {st:?}",
            String::from_utf8_lossy(&rel)
        );
    }
}

#[test]
fn an_unmounted_mirror_resumes_at_the_next_mount() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("a.bin"), 24 << 20, 5);
    write_random(&src.path().join("b.bin"), (8 << 20) + 1, 6);
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let server = TestServer::start(src.path());
    let mut mount = TestMount::mount(
        &server.addr,
        &["--cache-dir", &cache_arg, "--mirror", "--bwlimit", "4M"],
    );
    assert!(wait_for(Duration::from_secs(20), || {
        status(&mount.path())["bytes_done"].as_u64().unwrap() >= 6 << 20
    }));
    mount.signal_and_wait(libc::SIGTERM);
    // Left interrupted, with what was fetched recorded.
    let d = status(cache.path());
    assert_eq!(d["state"], "interrupted", "{d}");
    let kept = ferry_tests::present_bytes(cache.path());
    assert!(kept >= 4 << 20, "only {kept} bytes recorded");

    let mount = TestMount::mount(&server.addr, &["--cache-dir", &cache_arg, "--mirror"]);
    let done = wait_for(Duration::from_secs(60), || {
        status(&mount.path())["state"] == "complete"
    });
    let s = status(&mount.path());
    assert!(done, "{s}\n{}", mount.log_text());
    // The second pass fetched only what the first had not recorded.
    let total = (24u64 << 20) + (8 << 20) + 1;
    assert_eq!(s["bytes_total"], total, "{s}");
    assert!(
        s["bytes_fetched"].as_u64().unwrap() <= total - kept,
        "refetched recorded chunks: {s}, {kept} were recorded"
    );
    run(Command::new("diff")
        .arg("-r")
        .arg("--exclude=.ferry")
        .arg(src.path())
        .arg(cache.path()));
}

#[test]
fn with_rescan_the_local_copy_follows_changes_on_the_server() {
    // `--rescan SECS`: after its first complete pass the background mirror goes over the
    // export again, so a file rewritten and one added on the server reach the local copy
    // without a remount, and reads see the new bytes. One removed on the server is gone
    // from the mount and kept in the local copy (no pass deletes).
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("d")).unwrap();
    write_random(&src.path().join("a.bin"), (3 << 20) + 17, 1);
    write_random(&src.path().join("d/small"), 5000, 2);
    write_random(&src.path().join("d/gone.bin"), 70_000, 3);
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(
        &server.addr,
        &["--cache-dir", &cache_arg, "--mirror", "--rescan", "1"],
    );
    let complete = || status(&mount.path())["state"] == "complete";
    assert!(
        wait_for(Duration::from_secs(30), complete),
        "{}\n{}",
        status(&mount.path()),
        mount.log_text()
    );
    assert_eq!(status(&mount.path())["mount"]["rescan_secs"], 1);
    run(Command::new("diff")
        .arg("-r")
        .arg(src.path())
        .arg(cache.path()));

    // The export changes while mounted.
    write_random(&src.path().join("a.bin"), (2 << 20) + 99, 11);
    write_random(&src.path().join("d/new.bin"), 200_000, 12);
    std::fs::remove_file(src.path().join("d/gone.bin")).unwrap();
    let same = |rel: &str| {
        std::fs::read(src.path().join(rel)).ok() == std::fs::read(cache.path().join(rel)).ok()
    };
    let followed = wait_for(Duration::from_secs(60), || {
        same("a.bin") && same("d/new.bin") && complete()
    });
    assert!(
        followed,
        "the local copy did not follow: {}\n{}",
        status(&mount.path()),
        mount.log_text()
    );
    assert!(cache.path().join("d/gone.bin").exists());
    run(Command::new("diff")
        .arg("-r")
        .arg("--exclude=gone.bin")
        .arg(src.path())
        .arg(cache.path()));
    // A pass after the change fetched the changed and new files only (d/small was kept as
    // verified), and a pass after it nothing.
    let fetched = status(&mount.path())["bytes_fetched"].as_u64().unwrap();
    assert!(fetched <= (2 << 20) + 99 + 200_000, "{fetched}");
    assert!(
        mount.log_text().contains("going over the export again"),
        "{}",
        mount.log_text()
    );
    // Reads through the mount: the new bytes.
    run(Command::new("cmp")
        .arg(src.path().join("a.bin"))
        .arg(mount.path().join("a.bin")));
    // Gone through the mount too, once the kernel's entry for it expires (--attr-timeout,
    // 10 s by default).
    assert!(wait_for(Duration::from_secs(30), || !mount
        .path()
        .join("d/gone.bin")
        .exists()));
}

#[test]
fn mirror_options_without_their_prerequisites_are_refused() {
    for (args, needle) in [
        (&["--mirror"][..], "--cache-dir"),
        (&["--bwlimit", "10M"][..], "--mirror"),
        (&["--rescan", "60"][..], "--mirror"),
        (
            &["--cache-dir", "/tmp", "--mirror", "--rescan", "0"][..],
            "--rescan",
        ),
    ] {
        let mnt = tempfile::tempdir().unwrap();
        let out = ferry_tests::ferry()
            .arg("mount")
            .arg("127.0.0.1:1")
            .arg(mnt.path())
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn status_of_a_plain_directory_says_what_to_give() {
    let d = tempfile::tempdir().unwrap();
    let out = ferry_tests::ferry()
        .arg("status")
        .arg(d.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a ferry mount"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn status_watch_follows_the_mount_mirror_to_the_end() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    for i in 0..3 {
        write_random(&src.path().join(format!("f{i}")), 10 << 20, 70 + i);
    }
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(
        &server.addr,
        &["--cache-dir", &cache_arg, "--mirror", "--bwlimit", "10M"],
    );
    // Not a terminal: one JSON object per line, the last one complete; exit 0.
    let out = run(ferry_tests::ferry()
        .arg("status")
        .arg(mount.path())
        .args(["--watch", "--json"]));
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 2, "{lines:?}");
    assert_eq!(lines[0]["state"], "running");
    let last = lines.last().unwrap();
    assert_eq!(last["state"], "complete");
    assert_eq!(last["bytes_done"], 30u64 << 20);
    assert_eq!(last["files_done"], 3);
}
