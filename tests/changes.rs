//! Files that change on the server while they are read, end to end: a real ferryd, a real
//! FUSE mount, a slowed reader (this process, reading a MiB at a time, or `pv -L`), the
//! change made on the server's disk in the middle of the read. Whatever the reader gets
//! with success is one whole version (an append or an in-place rewrite: bytes the file held
//! at each offset); otherwise its read fails. Never a splice of two inodes, never zeros past
//! a shrink. Then close-to-open (a copy started after a change gets the new file), and
//! `ferry mirror` after changes on the server and in the local copy.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ferry_tests::{bin, run, set_mtime, TestMount, TestServer};
use rand::{RngCore, SeedableRng};

const MIB: usize = 1 << 20;
/// Small enough that reads after the change go to the server, not to chunks held.
const MOUNT_ARGS: &[&str] = &["--chunk-memory", "4", "--max-window", "2"];

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn setup(len: usize) -> (tempfile::TempDir, TestServer, Vec<u8>) {
    let export = tempfile::tempdir().unwrap();
    let data = random(len, 1);
    std::fs::write(export.path().join("f"), &data).unwrap();
    let server = TestServer::start(export.path());
    (export, server, data)
}

/// Reads `path` a MiB at a time with a pause after each, calling `change` once `at` bytes
/// were read; returns what was read and the error that ended the read, if any.
fn slow_read(path: &Path, at: usize, change: impl FnOnce()) -> (Vec<u8>, Option<std::io::Error>) {
    let mut f = std::fs::File::open(path).unwrap();
    let mut out = Vec::new();
    let mut change = Some(change);
    let mut buf = vec![0u8; MIB];
    loop {
        if out.len() >= at {
            if let Some(c) = change.take() {
                c();
            }
        }
        match f.read(&mut buf) {
            Ok(0) => return (out, None),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => return (out, Some(e)),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The first offset where `got` holds a byte that is neither `a`'s nor `b`'s there.
fn foreign_byte(got: &[u8], a: &[u8], b: &[u8]) -> Option<usize> {
    (0..got.len()).find(|&i| a.get(i) != Some(&got[i]) && b.get(i) != Some(&got[i]))
}

#[test]
fn a_file_renamed_over_while_read_is_never_spliced() {
    let (export, server, old) = setup(48 * MIB);
    let m = TestMount::mount(&server.addr, MOUNT_ARGS);
    let new = random(48 * MIB, 2);
    let (got, err) = slow_read(&m.path().join("f"), 8 * MIB, || {
        let tmp = export.path().join(".f.new");
        std::fs::write(&tmp, &new).unwrap();
        std::fs::rename(&tmp, export.path().join("f")).unwrap();
    });
    match err {
        None => assert!(got == old, "exit 0 must mean the whole old version"),
        Some(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
            assert!(got.len() < old.len() && got[..] == old[..got.len()]);
        }
    }
    // A new open (after the open TTL) reads the new file whole.
    std::thread::sleep(Duration::from_millis(1100));
    assert!(std::fs::read(m.path().join("f")).unwrap() == new);
}

#[test]
fn a_file_truncated_while_read_gives_no_invented_zeros() {
    let (export, server, old) = setup(48 * MIB);
    let m = TestMount::mount(&server.addr, MOUNT_ARGS);
    let (got, err) = slow_read(&m.path().join("f"), 8 * MIB, || {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(export.path().join("f"))
            .unwrap();
        f.set_len(20 * MIB as u64).unwrap();
    });
    // Every byte returned is the file's (old and new agree below 20 MiB).
    assert!(
        got.len() <= old.len() && got[..] == old[..got.len()],
        "bytes not the file's"
    );
    match err {
        // Exit 0: a prefix no shorter than the new size.
        None => assert!(
            got.len() >= 20 * MIB,
            "short read at {} without an error",
            got.len()
        ),
        Some(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
    }
}

/// Rewrites `f` in place (same size) with `new`, then puts its mtime back.
fn rewrite_in_place_keeping_mtime(f: &Path, new: &[u8]) {
    let m = std::fs::metadata(f).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(f)
        .and_then(|mut h| std::io::Write::write_all(&mut h, new))
        .unwrap();
    set_mtime(f, m.mtime(), m.mtime_nsec());
}

#[test]
fn an_in_place_rewrite_gives_bytes_the_file_held_and_strict_refuses_it() {
    let (export, server, old) = setup(48 * MIB);
    let new = random(48 * MIB, 3);
    let m = TestMount::mount(&server.addr, MOUNT_ARGS);
    let (got, err) = slow_read(&m.path().join("f"), 8 * MIB, || {
        rewrite_in_place_keeping_mtime(&export.path().join("f"), &new);
    });
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got.len(), old.len());
    assert_eq!(foreign_byte(&got, &old, &new), None);
    assert!(
        got != old,
        "the rewrite went unseen: the ctime is part of a version"
    );

    // -o strict: one version per handle, or EIO.
    std::fs::write(export.path().join("f"), &old).unwrap();
    let mut args = MOUNT_ARGS.to_vec();
    args.extend(["-o", "strict"]);
    let m = TestMount::mount(&server.addr, &args);
    let (got, err) = slow_read(&m.path().join("f"), 8 * MIB, || {
        rewrite_in_place_keeping_mtime(&export.path().join("f"), &new);
    });
    match err {
        None => assert!(
            got == old,
            "strict and exit 0 must mean the whole old version"
        ),
        Some(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
            assert!(got[..] == old[..got.len()], "strict mixed versions");
        }
    }
}

#[test]
fn an_open_after_an_append_reads_the_whole_new_file() {
    let (export, server, old) = setup(16 * MIB);
    let m = TestMount::mount(&server.addr, &[]);
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    run(Command::new("cp").arg(m.path().join("f")).arg(&copy));
    assert!(std::fs::read(&copy).unwrap() == old);
    let more = random(5 * MIB, 4);
    std::fs::OpenOptions::new()
        .append(true)
        .open(export.path().join("f"))
        .and_then(|mut h| std::io::Write::write_all(&mut h, &more))
        .unwrap();
    // Past the open TTL (1 s), well within the kernel's attribute timeout (10 s).
    std::thread::sleep(Duration::from_millis(1500));
    run(Command::new("cp").arg(m.path().join("f")).arg(&copy));
    let got = std::fs::read(&copy).unwrap();
    assert_eq!(
        got.len(),
        old.len() + more.len(),
        "the copy missed the append"
    );
    assert!(got[..old.len()] == old[..] && got[old.len()..] == more[..]);
}

#[test]
fn pv_reading_a_file_renamed_over_never_exits_0_with_a_splice() {
    let (export, server, old) = setup(32 * MIB);
    let m = TestMount::mount(&server.addr, MOUNT_ARGS);
    let dst = tempfile::tempdir().unwrap();
    let out = std::fs::File::create(dst.path().join("out")).unwrap();
    let mut pv = Command::new("pv")
        .args(["-q", "-L", "8m"])
        .arg(m.path().join("f"))
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let new = random(32 * MIB, 5);
    let tmp = export.path().join(".f.new");
    std::fs::write(&tmp, &new).unwrap();
    std::fs::rename(&tmp, export.path().join("f")).unwrap();
    let ok = pv.wait().unwrap().success();
    let got = std::fs::read(dst.path().join("out")).unwrap();
    if ok {
        assert!(got == old || got == new, "pv exited 0 with a splice");
    } else {
        assert!(got[..] == old[..got.len()]);
    }
}

fn status_json(dir: &Path) -> serde_json::Value {
    let out = run(ferry_tests::ferry().arg("status").arg(dir).arg("--json"));
    serde_json::from_str(&out).unwrap()
}

fn mirror(server: &TestServer, dir: &Path, extra: &[&str]) -> std::process::Output {
    ferry_tests::ferry()
        .arg("mirror")
        .arg(&server.addr)
        .arg(dir)
        .arg("--quiet")
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn mirror_after_an_in_place_rewrite_that_kept_the_mtime_copies_the_new_bytes() {
    let (export, server, _) = setup(3 * MIB);
    let dst = tempfile::tempdir().unwrap();
    let out = mirror(&server, dst.path(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = random(3 * MIB, 6);
    rewrite_in_place_keeping_mtime(&export.path().join("f"), &new);
    let out = mirror(&server, dst.path(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read(dst.path().join("f")).unwrap() == new);
}

#[test]
fn mirror_rerun_finds_a_local_edit_and_fetches_the_file_again() {
    let (export, server, data) = setup(3 * MIB);
    std::fs::write(export.path().join("small"), b"hello, world\n").unwrap();
    let dst = tempfile::tempdir().unwrap();
    assert!(mirror(&server, dst.path(), &[]).status.success());
    let src_mtime = std::fs::metadata(export.path().join("f")).unwrap().mtime();
    // A same-size local edit that puts the mtime back; a local touch of another file.
    let local = dst.path().join("f");
    let m = std::fs::metadata(&local).unwrap();
    let mut edited = data.clone();
    edited[MIB + 7] ^= 0xff;
    std::fs::write(&local, &edited).unwrap();
    set_mtime(&local, m.mtime(), m.mtime_nsec());
    set_mtime(&dst.path().join("small"), 1_000_000, 0);
    let out = mirror(&server, dst.path(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&local).unwrap() == data,
        "the local edit was kept"
    );
    assert_eq!(std::fs::metadata(&local).unwrap().mtime(), src_mtime);
    assert_eq!(
        std::fs::read(dst.path().join("small")).unwrap(),
        b"hello, world\n"
    );
    assert_eq!(
        std::fs::metadata(dst.path().join("small")).unwrap().mtime(),
        std::fs::metadata(export.path().join("small"))
            .unwrap()
            .mtime()
    );
}

#[test]
fn mirror_checksum_verifies_every_file_again() {
    let (_export, server, data) = setup(3 * MIB);
    let dst = tempfile::tempdir().unwrap();
    assert!(mirror(&server, dst.path(), &[]).status.success());
    // A rerun trusts the stamped copy: nothing verified, nothing fetched.
    assert!(mirror(&server, dst.path(), &[]).status.success());
    let s = status_json(dst.path());
    assert_eq!(
        (s["files_verified"].as_u64(), s["bytes_fetched"].as_u64()),
        (Some(0), Some(0))
    );
    // An edit that also puts back what the stamp records cannot be made by a user (the
    // ctime), so --checksum is what a suspicious operator runs: every file read and
    // compared with the server's hash again, nothing fetched.
    let out = mirror(&server, dst.path(), &["--checksum"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = status_json(dst.path());
    assert_eq!(
        (s["files_verified"].as_u64(), s["bytes_fetched"].as_u64()),
        (Some(1), Some(0))
    );
    assert!(std::fs::read(dst.path().join("f")).unwrap() == data);
}

#[test]
fn mirror_after_a_chmod_on_the_server_fetches_nothing_again() {
    let (export, server, data) = setup(8 * MIB);
    let dst = tempfile::tempdir().unwrap();
    assert!(mirror(&server, dst.path(), &[]).status.success());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        export.path().join("f"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let ino = std::fs::metadata(dst.path().join("f")).unwrap().ino();
    let out = mirror(&server, dst.path(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = std::fs::metadata(dst.path().join("f")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    assert_eq!(m.ino(), ino, "the copy was fetched again for a chmod");
    assert!(std::fs::read(dst.path().join("f")).unwrap() == data);
}

/// A change made on the server in the property test below.
#[derive(Debug, Clone)]
enum Change {
    /// Cut the file to this many bytes.
    Truncate(usize),
    /// Add this many random bytes at the end.
    Append(usize),
    /// Rewrite every byte in place (same size), then put the mtime back.
    Rewrite,
    /// Another file of this size takes the name (written aside, renamed over).
    RenameOver(usize),
}

fn change() -> impl proptest::strategy::Strategy<Value = Change> {
    use proptest::prelude::*;
    prop_oneof![
        (0..10 * MIB).prop_map(Change::Truncate),
        (1..3 * MIB).prop_map(Change::Append),
        Just(Change::Rewrite),
        (1..10 * MIB).prop_map(Change::RenameOver),
    ]
}

/// Whether every byte of `got` (read at `at`) is the byte one of `versions` held there.
fn held(got: &[u8], at: usize, versions: &[Vec<u8>]) -> Result<(), usize> {
    const BLOCK: usize = 256;
    for (b, block) in got.chunks(BLOCK).enumerate() {
        let off = at + b * BLOCK;
        let whole = |v: &Vec<u8>| v.get(off..off + block.len()) == Some(block);
        if versions.iter().any(whole) {
            continue;
        }
        for (i, byte) in block.iter().enumerate() {
            if !versions.iter().any(|v| v.get(off + i) == Some(byte)) {
                return Err(off + i);
            }
        }
    }
    Ok(())
}

/// The property: files changed on the server while a reader reads them through the mount
/// (truncate, append, rewrite in place with the mtime put back, rename over, in any order,
/// between any two reads of any size) — no read ever returns a byte that no version of the
/// opened file held at that offset, a read ends (returns 0) only at a size one of them had,
/// and every failure is EIO, ESTALE or ENOENT.
#[test]
fn no_read_returns_a_byte_no_version_of_the_file_held() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use std::os::unix::fs::FileExt;
    let export = tempfile::tempdir().unwrap();
    let server = TestServer::start(export.path());
    let m = TestMount::mount(&server.addr, MOUNT_ARGS);
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u32);
    let strategy = (
        4 * MIB..12 * MIB,
        proptest::collection::vec((0..8usize, change()), 1..4),
        proptest::collection::vec(4096..MIB, 8..64),
        any::<u64>(),
    );
    runner
        .run(&strategy, |(size, changes, reads, seed)| {
            case.set(case.get() + 1);
            let name = format!("f{}", case.get());
            let on_server = export.path().join(&name);
            let first = random(size, seed);
            std::fs::write(&on_server, &first).unwrap();
            let mut ends = vec![(first.len(), first.len())];
            let mut versions = vec![first];
            let mut same_inode = true;
            let f = std::fs::File::open(m.path().join(&name)).unwrap();
            // No kernel readahead: each read reaches the mount (its own read-ahead is small).
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open fd; the advice only changes readahead.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
            let mut pos = 0usize;
            for (k, &len) in reads.iter().enumerate() {
                for (i, (_, c)) in changes.iter().enumerate().filter(|(_, (at, _))| *at == k) {
                    let now = if same_inode {
                        versions.last().cloned().unwrap_or_default()
                    } else {
                        std::fs::read(&on_server).unwrap()
                    };
                    let before = now.len();
                    let next = match c {
                        Change::Truncate(n) => {
                            // set_len past the end extends with zeros.
                            let mut v = now;
                            v.resize(*n, 0);
                            v
                        }
                        Change::Append(n) => [now, random(*n, seed ^ i as u64)].concat(),
                        Change::Rewrite => random(now.len(), seed.rotate_left(i as u32 + 1)),
                        Change::RenameOver(n) => random(*n, !seed ^ i as u64),
                    };
                    match c {
                        Change::RenameOver(_) => {
                            let tmp = export.path().join(format!(".{name}.new"));
                            std::fs::write(&tmp, &next).unwrap();
                            std::fs::rename(&tmp, &on_server).unwrap();
                            same_inode = false;
                        }
                        Change::Rewrite => rewrite_in_place_keeping_mtime(&on_server, &next),
                        Change::Truncate(n) => std::fs::OpenOptions::new()
                            .write(true)
                            .open(&on_server)
                            .and_then(|h| h.set_len(*n as u64))
                            .unwrap(),
                        Change::Append(_) => std::fs::OpenOptions::new()
                            .append(true)
                            .open(&on_server)
                            .and_then(|mut h| std::io::Write::write_all(&mut h, &next[before..]))
                            .unwrap(),
                    }
                    if same_inode {
                        // An append passes through every size in between.
                        let grew = matches!(c, Change::Append(_));
                        ends.push(if grew {
                            (before, next.len())
                        } else {
                            (next.len(), next.len())
                        });
                        versions.push(next);
                    }
                }
                let mut buf = vec![0u8; len];
                match f.read_at(&mut buf, pos as u64) {
                    Ok(0) => {
                        prop_assert!(
                            ends.iter().any(|&(lo, hi)| (lo..=hi).contains(&pos)),
                            "end of file at {pos}: no version had that size"
                        );
                        break;
                    }
                    Ok(n) => {
                        if let Err(off) = held(&buf[..n], pos, &versions) {
                            prop_assert!(false, "byte at {off}: no version held it");
                        }
                        pos += n;
                    }
                    Err(e) => {
                        let errno = e.raw_os_error().unwrap_or(0);
                        prop_assert!(
                            [libc::EIO, libc::ESTALE, libc::ENOENT].contains(&errno),
                            "unexpected error {e}"
                        );
                        break;
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn ferry_status_answers_at_once_with_the_server_down() {
    let (_export, mut server, _) = setup(MIB);
    let m = TestMount::mount(&server.addr, &["--attr-timeout", "1"]);
    assert!(std::fs::read(m.path().join("f")).is_ok());
    server.kill9();
    // Past the attribute timeout: the kernel asks the mount about the root again.
    std::thread::sleep(Duration::from_millis(1500));
    // `timeout` guards against the old behaviour (a two-minute wait).
    let out = Command::new("timeout")
        .arg("20")
        .arg(bin("ferry"))
        .env("FERRY_STATE_DIR", ferry_tests::state_base())
        .arg("status")
        .arg(m.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("0 streams connected (server unreachable"),
        "{text}"
    );
}

#[test]
fn a_removed_export_is_an_error_and_a_log_line() {
    let outer = tempfile::tempdir().unwrap();
    let export = outer.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), b"hello").unwrap();
    let server = TestServer::start(&export);
    let m = TestMount::mount(&server.addr, &["--attr-timeout", "0"]);
    assert_eq!(std::fs::read(m.path().join("f")).unwrap(), b"hello");
    std::fs::remove_dir_all(&export).unwrap();
    std::fs::create_dir(&export).unwrap();
    let err = std::fs::read_dir(m.path())
        .and_then(|d| d.collect::<Result<Vec<_>, _>>())
        .expect_err("a removed export must not list as an empty directory");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        server
            .log_text()
            .contains("the export directory was removed"),
        "{}",
        server.log_text()
    );
}

#[test]
fn close_to_open_holds_in_a_directory_too_large_to_list_again() {
    let export = tempfile::tempdir().unwrap();
    let big = export.path().join("big");
    std::fs::create_dir(&big).unwrap();
    // Over 256 KiB of directory on the server: long names.
    let name = |i: usize| format!("{i:06}-{}", "n".repeat(120));
    for i in 0..4000 {
        std::fs::write(big.join(name(i)), format!("{i}\n")).unwrap();
    }
    assert!(std::fs::metadata(&big).unwrap().len() > 256 << 10);
    let server = TestServer::start(export.path());
    let m = TestMount::mount(&server.addr, &[]);
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg("-r")
        .arg(m.path().join("big"))
        .arg(dst.path()));
    run(Command::new("diff")
        .arg("-r")
        .arg(&big)
        .arg(dst.path().join("big")));
    // Changed on the server after the copy read it, past the open TTL: a new open sees it,
    // although the kernel's and the mount's listings are younger than the attribute TTL.
    let target = big.join(name(3999));
    std::fs::OpenOptions::new()
        .append(true)
        .open(&target)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"appended\n"))
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let got = std::fs::read(m.path().join("big").join(name(3999))).unwrap();
    assert_eq!(got, b"3999\nappended\n");
}

#[test]
fn a_local_copy_edited_by_hand_is_not_served_by_passthrough() {
    let (_export, server, data) = setup(2 * MIB + 99);
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let m = TestMount::mount(&server.addr, &["--cache-dir", &cache_arg]);
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp").arg(m.path().join("f")).arg(dst.path()));
    // Stored, recorded and verified (then stamped) in the background.
    let verified =
        || ferry_tests::status(&m.path())["mount"]["files_verified_by_reads"].as_u64() == Some(1);
    assert!(ferry_tests::wait_for(Duration::from_secs(20), verified));
    std::thread::sleep(Duration::from_millis(1500));
    // An operator edits the local copy in place, same size, mtime put back.
    let mut edited = data.clone();
    edited[MIB] ^= 0xff;
    rewrite_in_place_keeping_mtime(&cache.path().join("f"), &edited);
    // Nothing cached in the kernel: the next open must not read the edited file.
    std::fs::write("/proc/sys/vm/drop_caches", "3").ok();
    let got = std::fs::read(m.path().join("f")).unwrap();
    assert!(got == data, "a hand-edited local copy was served");
}
