//! `ferry mount --cache-dir`: chunks read through the mount land in the local copy and are
//! read from it afterwards — with the server gone, and after a remount.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ferry_tests::{is_root, require_fuse, run, write_random, TestMount, TestServer};

/// Drops the kernel's cached pages of `p` (a file on the mount), so the next read goes to
/// ferry again.
fn drop_page_cache(p: &Path, mount: &TestMount) {
    let f = std::fs::File::open(p).unwrap_or_else(|e| {
        panic!(
            "open {}: {e}\nmount log:\n{}",
            p.display(),
            mount.log_text()
        )
    });
    // SAFETY: a valid open fd; POSIX_FADV_DONTNEED only drops clean cached pages.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

fn cmp(a: &Path, b: &Path) {
    run(Command::new("cmp").arg(a).arg(b));
}

#[test]
fn chunks_read_once_are_served_locally_even_with_the_server_gone() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("d")).unwrap();
    write_random(&src.path().join("d/big.bin"), (9 << 20) + 123, 7);
    write_random(&src.path().join("small"), 5000, 8);
    let cache = tempfile::tempdir().unwrap();
    let mut server = TestServer::start(src.path());
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let mount = TestMount::mount(
        &server.addr,
        &["--cache-dir", &cache_arg, "--attr-timeout", "600", "-v"],
    );
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("d/big.bin"))
        .arg(mount.path().join("small"))
        .arg(dst.path()));
    cmp(&src.path().join("d/big.bin"), &dst.path().join("big.bin"));
    // Stored in the background and recorded (durable) within the syncer's interval.
    std::thread::sleep(Duration::from_millis(1500));
    // The local copy has the same layout and bytes.
    assert!(
        std::fs::read(src.path().join("d/big.bin")).unwrap()
            == std::fs::read(cache.path().join("d/big.bin")).unwrap(),
        "local copy differs; mount log:\n{}",
        mount.log_text()
    );
    cmp(&src.path().join("small"), &cache.path().join("small"));

    // No server: only the local copy can answer now.
    unsafe { libc::kill(server.pid() as i32, libc::SIGKILL) };
    assert!(ferry_tests::wait_for(Duration::from_secs(5), || !server.is_running()));
    for f in ["d/big.bin", "small"] {
        drop_page_cache(&mount.path().join(f), &mount);
    }
    let again = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("d/big.bin"))
        .arg(again.path()));
    cmp(&src.path().join("d/big.bin"), &again.path().join("big.bin"));
    // Random reads too.
    let f = std::fs::File::open(mount.path().join("d/big.bin")).unwrap();
    let want = std::fs::read(src.path().join("d/big.bin")).unwrap();
    use std::os::unix::fs::FileExt;
    for off in [0u64, 4096 * 7, (5 << 20) + 3, (9 << 20) + 100] {
        let mut buf = vec![0u8; 4096];
        let n = f.read_at(&mut buf, off).unwrap();
        let end = (off as usize + n).min(want.len());
        assert_eq!(&buf[..n], &want[off as usize..end]);
    }
}

#[test]
fn a_remount_reads_what_an_earlier_mount_stored() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f.bin"), (3 << 20) + 17, 9);
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let server = TestServer::start(src.path());
    {
        let mount = TestMount::mount(&server.addr, &["--cache-dir", &cache_arg]);
        let dst = tempfile::tempdir().unwrap();
        run(Command::new("cp")
            .arg(mount.path().join("f.bin"))
            .arg(dst.path()));
        cmp(&src.path().join("f.bin"), &dst.path().join("f.bin"));
    }
    // The unmount flushed the state: every chunk is recorded for the file's version.
    {
        let c = ferry_tests::open_cache(cache.path());
        let st = c.state(&bytes::Bytes::from_static(b"f.bin")).unwrap();
        assert!(st.complete(), "{st:?}");
    }
    // A second mount serves the file from the local copy: no read reaches the server.
    let mount = TestMount::mount(&server.addr, &["--cache-dir", &cache_arg, "-v"]);
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("f.bin"))
        .arg(dst.path()));
    cmp(&src.path().join("f.bin"), &dst.path().join("f.bin"));
    // It also verifies what is complete but unverified (the first mount may have been
    // unmounted before its check).
    std::thread::sleep(Duration::from_millis(1500));
    drop(mount);
    {
        let c = ferry_tests::open_cache(cache.path());
        let st = c.state(&bytes::Bytes::from_static(b"f.bin")).unwrap();
        assert!(st.verified.is_some(), "{st:?}");
    }
    // The file changed on the server: the copy starts over at the new version.
    write_random(&src.path().join("f.bin"), 1 << 20, 10);
    let mount = TestMount::mount(&server.addr, &["--cache-dir", &cache_arg]);
    let dst2 = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("f.bin"))
        .arg(dst2.path()));
    cmp(&src.path().join("f.bin"), &dst2.path().join("f.bin"));
    drop(mount);
    cmp(&src.path().join("f.bin"), &cache.path().join("f.bin"));
}

#[test]
fn a_cache_dir_that_fills_up_does_not_break_reads() {
    require_fuse!();
    if !is_root() {
        eprintln!("skipped: needs root to mount a small tmpfs");
        return;
    }
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("big.bin"), 6 << 20, 11);
    let cache = ferry_tests::SmallTmpfs::mount("2m");
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &["--cache-dir", &cache_arg]);
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("big.bin"))
        .arg(dst.path()));
    cmp(&src.path().join("big.bin"), &dst.path().join("big.bin"));
    drop(mount);
    // The state is still readable, and claims nothing that is not on disk.
    let c = ferry_tests::open_cache(cache.path());
    if let Some(st) = c.state(&bytes::Bytes::from_static(b"big.bin")) {
        let local = std::fs::read(cache.path().join("big.bin")).unwrap();
        let want = std::fs::read(src.path().join("big.bin")).unwrap();
        for i in 0..st.chunks() {
            if st.has(i) {
                let (a, b) = (
                    (i as usize) << 20,
                    (((i + 1) as usize) << 20).min(want.len()),
                );
                assert_eq!(&local[a..b], &want[a..b], "chunk {i} recorded but wrong");
            }
        }
        assert!(!st.complete());
    }
}

#[test]
fn a_complete_verified_file_is_opened_with_passthrough() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f.bin"), (2 << 20) + 99, 12);
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let server = TestServer::start(src.path());
    let mut mount = TestMount::mount(&server.addr, &["--cache-dir", &cache_arg, "-v"]);
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("f.bin"))
        .arg(dst.path()));
    cmp(&src.path().join("f.bin"), &dst.path().join("f.bin"));
    // Recorded complete, verified against the server's BLAKE3, recorded verified.
    let c = ferry_cache::CacheDir::open(
        cache.path(),
        &ferry_cache::StateBase::new(ferry_tests::state_base()),
    );
    assert!(c.is_err(), "the mount holds the cache directory's lock");
    std::thread::sleep(Duration::from_millis(3000));
    // The next open reads the local file in the kernel.
    let again = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("f.bin"))
        .arg(again.path()));
    cmp(&src.path().join("f.bin"), &again.path().join("f.bin"));
    mount.signal_and_wait(libc::SIGTERM);
    let log = mount.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("local copy:"))
        .unwrap_or_else(|| panic!("no summary in the log:\n{log}"));
    assert!(line.contains("1 files verified"), "{line}");
    if is_root() {
        assert!(
            line.contains("1 passthrough opens") && log.contains("FUSE passthrough on"),
            "{line}\n{log}"
        );
    }
    let c = ferry_tests::open_cache(cache.path());
    let st = c.state(&bytes::Bytes::from_static(b"f.bin")).unwrap();
    assert!(st.complete() && st.verified.is_some(), "{st:?}");
}
