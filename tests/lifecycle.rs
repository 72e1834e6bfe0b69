//! Mount lifecycle: background start, signals, a dead mount replaced, an unreachable
//! server, sub-paths, and other users with --allow-other.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_tests::{
    bin, is_mounted, is_root, pids_with_arg, read_all, require_fuse, wait_for, which, TestMount,
    TestServer,
};

#[test]
fn background_mount_returns_when_ready_and_exits_on_unmount() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("hello"), b"world").unwrap();
    let server = TestServer::start(src.path());
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mnt_s = mnt.to_string_lossy().into_owned();
    let status = ferry_tests::ferry()
        .args(["mount", &server.addr, &mnt_s])
        .status()
        .unwrap();
    // Guard: whatever happens below, no mount or daemon is left behind.
    struct Cleanup(std::path::PathBuf, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            ferry_tests::force_unmount(&self.0);
            for pid in pids_with_arg(&self.1) {
                // SAFETY: signalling a process we started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
    let _guard = Cleanup(mnt.clone(), mnt_s.clone());
    assert!(status.success());
    // Ready means ready: no waiting needed before the first read.
    assert!(is_mounted(&mnt));
    assert_eq!(read_all(&mnt.join("hello")), b"world");
    let daemons = pids_with_arg(&mnt_s);
    assert_eq!(daemons.len(), 1, "one background ferry process");
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(
        wait_for(Duration::from_secs(10), || pids_with_arg(&mnt_s).is_empty()),
        "ferry did not exit after being unmounted"
    );
}

#[test]
fn sigterm_and_sigint_unmount_cleanly_even_when_busy() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), b"x").unwrap();
    let server = TestServer::start(src.path());
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut mount = TestMount::mount(&server.addr, &[]);
        let mnt = mount.path();
        // An open file keeps the mount busy: ferry still gets it unmounted.
        let busy = std::fs::File::open(mnt.join("f")).unwrap();
        let st = mount.signal_and_wait(sig).expect("exit status");
        assert!(st.success(), "exit status after signal {sig}: {st}");
        drop(busy);
        assert!(
            wait_for(Duration::from_secs(5), || !is_mounted(&mnt)),
            "still mounted after {sig}"
        );
    }
}

#[test]
fn dead_mount_of_a_killed_ferry_is_replaced() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), b"again").unwrap();
    let server = TestServer::start(src.path());
    let mut mount = TestMount::mount(&server.addr, &[]);
    let mnt = mount.path();
    mount.signal_and_wait(libc::SIGKILL);
    // The kernel keeps a dead mount: ENOTCONN for anything it must ask the daemon
    // (opendir always asks; a stat may still be answered from the attribute cache).
    assert!(is_mounted(&mnt));
    let err = std::fs::read_dir(&mnt).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
    let dir = mount.into_dir();
    let again = TestMount::mount_at(dir, &server.addr, &[]);
    assert_eq!(read_all(&again.path().join("f")), b"again");
}

#[test]
fn unreachable_server_fails_fast_with_one_line() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    for fg in [false, true] {
        let start = Instant::now();
        let mut cmd = ferry_tests::ferry();
        cmd.args(["mount", &format!("127.0.0.1:{port}")])
            .arg(dir.path());
        if fg {
            cmd.arg("-f");
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("ferry:")).collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(lines[0].contains("cannot connect to 127.0.0.1"), "{err}");
        assert!(!is_mounted(dir.path()));
    }
}

#[test]
fn bad_arguments_get_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    for (remote, want) in [
        ("host:notaport", "bad port"),
        ("host:/a/../b", "bad remote path"),
        ("", "missing host"),
    ] {
        let out = ferry_tests::ferry()
            .args(["mount", remote])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{remote:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let out = Command::new(bin("ferryd"))
        .args(["--export", "/nonexistent/dir"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot export /nonexistent/dir"));
}

#[test]
fn sub_path_mounts_only_that_directory() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("u01/oradata")).unwrap();
    std::fs::write(src.path().join("u01/oradata/system01.dbf"), b"blocks").unwrap();
    std::fs::write(src.path().join("top"), b"not visible").unwrap();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&format!("{}:/u01/oradata", server.addr), &[]);
    let names: Vec<_> = std::fs::read_dir(mount.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["system01.dbf"]);
    assert_eq!(read_all(&mount.path().join("system01.dbf")), b"blocks");
    // A sub-path that does not exist is refused before mounting.
    let dir = tempfile::tempdir().unwrap();
    let out = ferry_tests::ferry()
        .args(["mount", &format!("{}:/no/such", server.addr)])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}

#[test]
fn allow_other_lets_another_user_read() {
    require_fuse!();
    if !is_root() || which("setpriv").is_none() {
        eprintln!("skipping: needs root and setpriv to act as another user");
        return;
    }
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("datafile"), b"restore me").unwrap();
    std::fs::set_permissions(
        src.path().join("datafile"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::set_permissions(src.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = TestServer::start(src.path());
    let as_nobody = |path: &std::path::Path| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
            .arg(path)
            .output()
            .unwrap()
    };
    for (args, allowed) in [(&["--allow-other"][..], true), (&[][..], false)] {
        let mount = TestMount::mount(&server.addr, args);
        // The temp dirs above the mount must be traversable by the other user.
        let parent = mount.path().parent().unwrap().to_path_buf();
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = as_nobody(&mount.path().join("datafile"));
        assert_eq!(
            out.status.success(),
            allowed,
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if allowed {
            assert_eq!(out.stdout, b"restore me");
        }
    }
}
