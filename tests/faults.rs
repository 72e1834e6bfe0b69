//! Fault injection: ferryd killed and restarted, connections reset, bits flipped, streams
//! stalled, ferry killed, a cache disk that fills up. A reader sees correct bytes or a clear
//! error after a bounded time — never wrong bytes, never a hang.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ferry_tests::proxy::{Fault, FaultProxy};
use ferry_tests::{
    is_root, require_fuse, run, status, wait_for, write_random, SmallTmpfs, TestMount, TestServer,
};

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// `ferry mirror REMOTE DIR -v` with extra arguments; panics with its output unless it
/// succeeds.
fn mirror(remote: &str, dir: &Path, args: &[&str]) {
    ferry_tests::mirror(remote, dir, &[&["-v"], args].concat());
}

fn diff(a: &Path, b: &Path) {
    run(Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg("--exclude=.ferry")
        .arg(a)
        .arg(b));
}

#[test]
fn ferryd_killed_and_restarted_during_a_cp_from_the_mount() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("big.bin"), 200 << 20, 1);
    let mut server = TestServer::start(src.path());
    // Paced so that the copy is still running when the server dies.
    let proxy = FaultProxy::start(&server.addr);
    proxy.set_rate(80 << 20);
    let mount = TestMount::mount(&proxy.addr, &["--timeout", "60"]);
    let dst = tempfile::tempdir().unwrap();
    let cp = Command::new("cp")
        .arg(mount.path().join("big.bin"))
        .arg(dst.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let copied = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    assert!(wait_for(Duration::from_secs(20), || copied(
        &dst.path().join("big.bin")
    ) >= 40 << 20));
    server.kill9();
    std::thread::sleep(Duration::from_millis(1500));
    server.restart();
    let out = cp.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "cp failed: {}\nmount log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        mount.log_text()
    );
    run(Command::new("cmp")
        .arg(src.path().join("big.bin"))
        .arg(dst.path().join("big.bin")));
    let s = status(&mount.path());
    eprintln!(
        "figures: ferryd killed at >= 40 MiB of 200 MiB, back after 1.5 s: {}",
        s["faults"]
    );
    assert!(n(&s["faults"]["reconnects"]) >= 1, "{s}");
    assert!(n(&s["faults"]["server_restarts"]) >= 1, "{s}");
    assert!(
        mount.log_text().contains("restarted (new server instance)"),
        "{}",
        mount.log_text()
    );
}

#[test]
fn connections_reset_every_50_mib_during_a_mirror() {
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("d")).unwrap();
    for i in 0..3 {
        write_random(
            &src.path().join(format!("d/f{i}")),
            (100 << 20) + i * 77,
            i as u64,
        );
    }
    for i in 0..200 {
        write_random(
            &src.path().join(format!("s{i}")),
            5000 + i * 13,
            50 + i as u64,
        );
    }
    let server = TestServer::start(src.path());
    let proxy = FaultProxy::start(&server.addr);
    proxy.set(Fault::ResetEvery(50 << 20));
    let dst = tempfile::tempdir().unwrap();
    mirror(&proxy.addr, &dst.path().join("m"), &[]);
    diff(src.path(), &dst.path().join("m"));
    assert!(proxy.resets() >= 4, "only {} resets", proxy.resets());
    let s = status(&dst.path().join("m"));
    eprintln!(
        "figures: {} resets over {} bytes: {}",
        proxy.resets(),
        proxy.bytes_down(),
        s["faults"]
    );
    assert_eq!(s["state"], "complete", "{s}");
    assert!(n(&s["faults"]["reconnects"]) >= 1, "{s}");
}

#[test]
fn flipped_bits_are_caught_and_fetched_again() {
    let src = tempfile::tempdir().unwrap();
    for i in 0..4 {
        write_random(&src.path().join(format!("f{i}")), 25 << 20, 10 + i as u64);
    }
    let server = TestServer::start(src.path());
    let proxy = FaultProxy::start(&server.addr);
    proxy.set(Fault::FlipEvery(7 << 20));
    let dst = tempfile::tempdir().unwrap();
    mirror(&proxy.addr, &dst.path().join("m"), &[]);
    diff(src.path(), &dst.path().join("m"));
    assert!(proxy.flips() >= 10, "only {} flips", proxy.flips());
    let s = status(&dst.path().join("m"));
    eprintln!(
        "figures: {} bits flipped over {} bytes: {}",
        proxy.flips(),
        proxy.bytes_down(),
        s["faults"]
    );
    // Nearly every flip lands in a payload (a flip in a frame header closes the stream,
    // which is reconnected): each is caught by the checksum and fetched again.
    assert!(n(&s["faults"]["checksum_failures"]) >= 5, "{s}");
    assert_eq!(s["hash_mismatches"], 0, "{s}");
}

#[test]
fn a_stalled_stream_is_detected_and_its_work_moves_to_the_others() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f.bin"), 64 << 20, 3);
    let server = TestServer::start(src.path());
    let proxy = FaultProxy::start(&server.addr);
    let mount = TestMount::mount(&proxy.addr, &["--stall-timeout", "2"]);
    // The first stream stops passing bytes either way; its socket stays open.
    proxy.stall(0);
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("f.bin"))
        .arg(dst.path()));
    run(Command::new("cmp")
        .arg(src.path().join("f.bin"))
        .arg(dst.path().join("f.bin")));
    let s = status(&mount.path());
    eprintln!("figures: stream 0 stalled: {}", s["faults"]);
    assert!(n(&s["faults"]["stalls"]) >= 1, "{s}\n{}", mount.log_text());
    assert!(wait_for(Duration::from_secs(10), || n(&status(
        &mount.path()
    )["faults"]["live_streams"])
        == 8));
}

#[test]
fn ferry_killed_during_mount_and_mirror_then_mounted_again_resumes() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("a.bin"), 30 << 20, 4);
    for i in 0..50 {
        write_random(&src.path().join(format!("s{i}")), 3000 + i, 60 + i as u64);
    }
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(
        &server.addr,
        &["--cache-dir", &cache_arg, "--mirror", "--bwlimit", "5M"],
    );
    assert!(wait_for(Duration::from_secs(20), || {
        n(&status(&mount.path())["bytes_done"]) >= 8 << 20
    }));
    // What was written is recorded within the syncer's 1 s interval; the copy is not done
    // yet at 5 MiB/s.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(status(&mount.path())["state"], "running");
    // kill -9: no unmount, no flush; the kernel's mount is left dead.
    let dir = mount.into_dir();
    let mount = TestMount::mount_at(dir, &server.addr, &["--cache-dir", &cache_arg, "--mirror"]);
    let done = wait_for(Duration::from_secs(60), || {
        status(&mount.path())["state"] == "complete"
    });
    let s = status(&mount.path());
    assert!(done, "{s}\n{}", mount.log_text());
    diff(src.path(), cache.path());
    diff(src.path(), &mount.path());
    // Chunks recorded before the kill were not fetched again.
    let total = n(&s["bytes_total"]);
    eprintln!(
        "figures: after kill -9 and remount, {} of {total} bytes fetched",
        s["bytes_fetched"]
    );
    assert!(n(&s["bytes_fetched"]) < total, "{s}");
}

#[test]
fn a_cache_disk_that_fills_during_the_mount_mirror_leaves_reads_working() {
    require_fuse!();
    if !is_root() {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let src = tempfile::tempdir().unwrap();
    for i in 0..4 {
        write_random(&src.path().join(format!("f{i}")), 12 << 20, 20 + i as u64);
    }
    let disk = SmallTmpfs::mount("20m");
    let cache_arg = disk.path().join("c").to_str().unwrap().to_string();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &["--cache-dir", &cache_arg, "--mirror"]);
    let failed = wait_for(Duration::from_secs(30), || {
        let s = status(&mount.path());
        n(&s["error_count"]) > 0 || s["state"] == "incomplete"
    });
    let s = status(&mount.path());
    eprintln!("figures: cache disk full: errors {}", s["errors"]);
    assert!(failed, "{s}");
    // Files that do not fit beside the others are reported before a byte is written
    // (`not copied: it needs …`); should the disk fill all the same (the readers' chunks
    // are written there too), the write's ENOSPC is reported.
    let said =
        |t: &str| t.contains("not copied: it needs") || t.contains("No space left on device");
    assert!(
        s["errors"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| said(e.as_str().unwrap())),
        "{s}"
    );
    assert!(said(&mount.log_text()), "{}", mount.log_text());
    // Every file still reads correctly through the mount.
    for i in 0..4 {
        let f = format!("f{i}");
        run(Command::new("cmp")
            .arg(src.path().join(&f))
            .arg(mount.path().join(&f)));
    }
    drop(mount);
    // The state claims nothing that is not on disk.
    let c = ferry_tests::open_cache(Path::new(&cache_arg));
    for (rel, st) in c.all() {
        let name = String::from_utf8_lossy(&rel).to_string();
        let want = std::fs::read(src.path().join(&name)).unwrap();
        let have = std::fs::read(disk.path().join("c").join(&name)).unwrap_or_default();
        for i in 0..st.chunks() {
            if st.has(i) {
                let (a, b) = (
                    (i as usize) << 20,
                    (((i + 1) as usize) << 20).min(want.len()),
                );
                assert_eq!(
                    &have[a..b],
                    &want[a..b],
                    "{name}: chunk {i} recorded but wrong"
                );
            }
        }
    }
}

#[test]
fn a_server_away_longer_than_the_timeout_gives_eio_then_the_same_handle_works_again() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f.bin"), 128 << 20, 7);
    let want = std::fs::read(src.path().join("f.bin")).unwrap();
    let mut server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &["--timeout", "2", "--attr-timeout", "600"]);
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(mount.path().join("f.bin")).unwrap();
    // Random access: no kernel readahead that could answer the reads below from its cache.
    use std::os::fd::AsRawFd;
    // SAFETY: an open fd; the advice only changes readahead.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    let mut buf = vec![0u8; 4096];
    f.read_at(&mut buf, 0).unwrap();
    assert!(buf[..] == want[..4096]);

    server.kill9();
    let t = std::time::Instant::now();
    let err = f.read_at(&mut buf, 100 << 20).unwrap_err();
    let waited = t.elapsed();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10),
        "EIO after {waited:?}"
    );
    assert!(
        mount.log_text().contains("cannot reach ferryd"),
        "{}",
        mount.log_text()
    );

    // The server comes back: the same open handle reads again, correctly.
    server.restart();
    let n = f.read_at(&mut buf, 110 << 20).unwrap();
    assert_eq!(n, 4096);
    assert!(buf[..] == want[110 << 20..(110 << 20) + 4096]);
}
