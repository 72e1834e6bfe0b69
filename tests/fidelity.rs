//! The copy is the source (issue 16). As root, `ferry mirror` gives files, directories and
//! symlinks the server's owners — by name (the server runs with its own user database, in a
//! private mount namespace, so names and numbers differ between the two ends), by number
//! (`--numeric-ids`) or fixed (`--chown`) — and a real PostgreSQL data directory mirrored
//! this way starts and answers queries. Hard links stay links, in the mirror and through the
//! mount (`cp -a`, `rsync -aH`).

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferry_tests::pg::{chown, root_or_skip, socket_dir, source_cluster, Postgres};
use ferry_tests::{bin, is_root, mirror, run, wait_for, TestMount, TestServer};

/// ferryd in a private mount namespace whose /etc/passwd and /etc/group are `passwd` and
/// `group`: the server names ids differently from this machine. Killed on drop.
struct NsServer {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl NsServer {
    fn start(export: &Path, passwd: &str, group: &str) -> NsServer {
        let dir = tempfile::tempdir().unwrap();
        let (p, g, port) = (
            dir.path().join("passwd"),
            dir.path().join("group"),
            dir.path().join("port"),
        );
        std::fs::write(&p, passwd).unwrap();
        std::fs::write(&g, group).unwrap();
        let script = format!(
            "mount --bind {} /etc/passwd && mount --bind {} /etc/group && exec {} --export {} --listen 127.0.0.1:0 --port-file {}",
            p.display(),
            g.display(),
            bin("ferryd").display(),
            export.display(),
            port.display()
        );
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut s = NsServer {
            child,
            addr: String::new(),
            _dir: dir,
        };
        assert!(
            wait_for(Duration::from_secs(10), || port.exists()),
            "ferryd in a namespace did not start"
        );
        s.addr = std::fs::read_to_string(&port).unwrap().trim().to_string();
        s
    }
}

impl Drop for NsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

/// This machine's ids of user `nobody` and group `nogroup`.
fn nobody() -> (u32, u32) {
    use nix::unistd::{Group, User};
    (
        User::from_name("nobody").unwrap().unwrap().uid.as_raw(),
        Group::from_name("nogroup").unwrap().unwrap().gid.as_raw(),
    )
}

#[test]
fn mirror_as_root_copies_owners_by_name_by_number_or_as_told() {
    if !root_or_skip("copying owners") {
        return;
    }
    let export = tempfile::tempdir().unwrap();
    let e = export.path();
    std::fs::create_dir(e.join("d")).unwrap();
    std::fs::write(e.join("named"), b"owned by nobody on the server").unwrap();
    std::fs::write(e.join("d/unnamed"), vec![7u8; 3 << 20]).unwrap();
    std::os::unix::fs::symlink("../named", e.join("d/link")).unwrap();
    // On the server, 1234 is nobody/nogroup; here it has no name. 4242/4343 have no name
    // on either side.
    chown(&e.join("named"), 1234, 1234);
    chown(&e.join("d"), 4242, 4343);
    chown(&e.join("d/unnamed"), 4242, 4343);
    chown(&e.join("d/link"), 4242, 4343);
    let server = NsServer::start(
        e,
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:1234:1234:nobody:/:/bin/false\n",
        "root:x:0:\nnogroup:x:1234:\n",
    );
    let here = nobody();

    let dst = tempfile::tempdir().unwrap();
    mirror(&server.addr, dst.path(), &[]);
    let d = dst.path();
    assert_eq!(owner(&d.join("named")), here, "mapped by name");
    assert_eq!(owner(&d.join("d")), (4242, 4343), "no name: by number");
    assert_eq!(owner(&d.join("d/unnamed")), (4242, 4343));
    assert_eq!(owner(&d.join("d/link")), (4242, 4343), "the symlink itself");
    assert_eq!(
        std::fs::read(d.join("named")).unwrap(),
        b"owned by nobody on the server"
    );

    let numeric = tempfile::tempdir().unwrap();
    mirror(&server.addr, numeric.path(), &["--numeric-ids"]);
    assert_eq!(owner(&numeric.path().join("named")), (1234, 1234));
    assert_eq!(owner(&numeric.path().join("d/link")), (4242, 4343));

    let told = tempfile::tempdir().unwrap();
    mirror(&server.addr, told.path(), &["--chown", "nobody:"]);
    assert_eq!(owner(&told.path().join("named")), (here.0, here.1));
    assert_eq!(owner(&told.path().join("d/unnamed")), (here.0, 4343));

    // A rerun of a complete copy whose owner was changed locally puts it back.
    chown(&d.join("d/unnamed"), 0, 0);
    mirror(&server.addr, d, &[]);
    assert_eq!(owner(&d.join("d/unnamed")), (4242, 4343));
}

#[test]
fn the_mount_shows_owners_by_number_or_with_idmap_names_by_name() {
    ferry_tests::require_fuse!();
    if !root_or_skip("owners on the server") {
        return;
    }
    let export = tempfile::tempdir().unwrap();
    let e = export.path();
    std::fs::create_dir(e.join("d")).unwrap();
    std::fs::write(e.join("d/named"), b"nobody's").unwrap();
    std::fs::write(e.join("d/unnamed"), b"no one's").unwrap();
    chown(&e.join("d/named"), 1234, 1234);
    chown(&e.join("d/unnamed"), 4242, 4343);
    let server = NsServer::start(
        e,
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:1234:1234:nobody:/:/bin/false\n",
        "root:x:0:\nnogroup:x:1234:\n",
    );
    let plain = TestMount::mount(&server.addr, &[]);
    assert_eq!(owner(&plain.path().join("d/named")), (1234, 1234));
    let named = TestMount::mount(&server.addr, &["-o", "idmap=names"]);
    let m = named.path();
    // Through a listing (ls -l: readdirplus) and through a lookup of its own.
    let listed: Vec<_> = std::fs::read_dir(m.join("d"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), owner(&e.path()))
        })
        .collect();
    assert!(listed.contains(&("named".into(), nobody())), "{listed:?}");
    assert_eq!(owner(&m.join("d/named")), nobody(), "mapped by name");
    assert_eq!(
        owner(&m.join("d/unnamed")),
        (4242, 4343),
        "no name: by number"
    );
    assert_eq!(owner(&m), (0, 0));
}

#[test]
fn a_bad_chown_is_one_clear_line() {
    let out = ferry_tests::ferry()
        .args([
            "mirror",
            "127.0.0.1:1",
            "/tmp/x",
            "--chown",
            "no-such-user-here:",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no user named no-such-user-here"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn a_mirrored_postgresql_data_directory_starts_and_answers() {
    let top = tempfile::tempdir().unwrap();
    let Some((pg, export, pg_owner)) = source_cluster(top.path()) else {
        return;
    };
    let server = TestServer::start(&export);
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("pgdata");
    std::fs::set_permissions(
        dst.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    run(ferry_tests::ferry()
        .arg("mirror")
        .arg(format!("{}:/pgdata", server.addr))
        .arg(&copy)
        .arg("--quiet"));
    assert_eq!(owner(&copy), pg_owner);
    assert_eq!(owner(&copy.join("base")), pg_owner);
    let db = Postgres::start(&pg, &copy, &socket_dir(top.path(), "sock2", pg_owner));
    assert_eq!(db.sql("select count(*), sum(id) from t"), "20000|200010000");
}

#[test]
fn a_postgresql_data_directory_copied_by_the_mounts_background_mirror_starts() {
    ferry_tests::require_fuse!();
    let top = tempfile::tempdir().unwrap();
    let Some((pg, export, pg_owner)) = source_cluster(top.path()) else {
        return;
    };
    let server = TestServer::start(&export);
    let cache = top.path().join("cache");
    let cache_arg = cache.to_str().unwrap().to_string();
    let mount = TestMount::mount(
        &format!("{}:/pgdata", server.addr),
        &["--cache-dir", &cache_arg, "--mirror"],
    );
    // `ferry status --watch` returns once the background mirror is complete.
    let out = run(ferry_tests::ferry()
        .arg("status")
        .arg(mount.path())
        .args(["--watch", "--json"]));
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["state"], "complete", "{last}");
    drop(mount);
    std::fs::set_permissions(
        top.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    assert_eq!(owner(&cache), pg_owner);
    let db = Postgres::start(&pg, &cache, &socket_dir(top.path(), "sock3", pg_owner));
    assert_eq!(db.sql("select count(*), sum(id) from t"), "20000|200010000");
}

/// An export with one file of three names (two directories) and one of one name.
fn linked_export() -> tempfile::TempDir {
    let export = tempfile::tempdir().unwrap();
    let e = export.path();
    std::fs::create_dir_all(e.join("a/b")).unwrap();
    std::fs::write(e.join("a/f"), vec![5u8; (2 << 20) + 17]).unwrap();
    std::fs::hard_link(e.join("a/f"), e.join("a/g")).unwrap();
    std::fs::hard_link(e.join("a/f"), e.join("a/b/h")).unwrap();
    std::fs::write(e.join("a/single"), b"one name").unwrap();
    export
}

fn ino_nlink(p: &Path) -> (u64, u64) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.ino(), m.nlink())
}

#[test]
fn mirror_keeps_hard_links_and_a_rerun_finds_them_in_place() {
    let export = linked_export();
    let server = TestServer::start(export.path());
    let dst = tempfile::tempdir().unwrap();
    mirror(&server.addr, dst.path(), &[]);
    let d = dst.path();
    let (ino, n) = ino_nlink(&d.join("a/f"));
    assert_eq!(n, 3, "three names, one file");
    assert_eq!(ino_nlink(&d.join("a/g")), (ino, 3));
    assert_eq!(ino_nlink(&d.join("a/b/h")), (ino, 3));
    assert_eq!(ino_nlink(&d.join("a/single")).1, 1);
    assert_eq!(
        std::fs::read(d.join("a/b/h")).unwrap(),
        vec![5u8; (2 << 20) + 17]
    );
    let status = || -> serde_json::Value {
        serde_json::from_str(&run(ferry_tests::ferry()
            .arg("status")
            .arg(d)
            .arg("--json")))
        .unwrap()
    };
    // A rerun reads and moves nothing, and keeps the links.
    mirror(&server.addr, d, &[]);
    let s = status();
    assert_eq!(s["bytes_fetched"].as_u64(), Some(0), "{s}");
    assert_eq!(s["files_verified"].as_u64(), Some(0), "{s}");
    assert_eq!(ino_nlink(&d.join("a/g")), (ino, 3));
    // A link broken locally is made again (the file's other names are checked again: the
    // unlink moved their ctime), and nothing is fetched.
    std::fs::remove_file(d.join("a/g")).unwrap();
    std::fs::write(d.join("a/g"), b"a local file").unwrap();
    mirror(&server.addr, d, &[]);
    assert_eq!(ino_nlink(&d.join("a/g")), (ino, 3));
    assert_eq!(status()["bytes_fetched"].as_u64(), Some(0));
}

#[test]
fn hard_links_through_the_mount_are_one_inode_and_cp_a_and_rsync_h_keep_them() {
    ferry_tests::require_fuse!();
    let export = linked_export();
    let server = TestServer::start(export.path());
    let m = TestMount::mount(&server.addr, &[]);
    let mnt = m.path();
    let (ino, n) = ino_nlink(&mnt.join("a/f"));
    assert_eq!(n, 3);
    assert_eq!(
        ino_nlink(&mnt.join("a/g")).0,
        ino,
        "one inode for all names"
    );
    assert_eq!(ino_nlink(&mnt.join("a/b/h")).0, ino);
    assert_ne!(ino_nlink(&mnt.join("a/single")).0, ino);

    let cp = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg("-a")
        .arg(mnt.join("a"))
        .arg(cp.path()));
    let (c, cn) = ino_nlink(&cp.path().join("a/f"));
    assert_eq!(cn, 3, "cp -a kept the links");
    assert_eq!(ino_nlink(&cp.path().join("a/b/h")).0, c);

    let rs = tempfile::tempdir().unwrap();
    run(Command::new("rsync")
        .arg("-aH")
        .arg(mnt.join("a"))
        .arg(rs.path()));
    let (r, rn) = ino_nlink(&rs.path().join("a/g"));
    assert_eq!(rn, 3, "rsync -aH kept the links");
    assert_eq!(ino_nlink(&rs.path().join("a/f")).0, r);
    run(Command::new("diff")
        .arg("-r")
        .arg(export.path().join("a"))
        .arg(rs.path().join("a")));
}

#[test]
fn a_sparse_file_gives_a_sparse_copy_and_its_holes_never_cross_the_wire() {
    use std::os::unix::fs::FileExt;
    let export = tempfile::tempdir().unwrap();
    let src = export.path().join("sparse.img");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(1 << 30).unwrap();
    // Data islands: at the start, mid-chunk, across a chunk boundary, at the very end.
    let island = |n: usize, seed: u8| -> Vec<u8> { (0..n).map(|i| (i as u8) ^ seed).collect() };
    for (at, n, seed) in [
        (0u64, 3 << 20, 1u8),
        ((300 << 20) + 12345, 100_000, 2),
        ((700 << 20) - 4096, 8192, 3),
        ((1 << 30) - 5000, 5000, 4),
    ] {
        f.write_all_at(&island(n, seed), at).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let allocated = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
    let server = TestServer::start(export.path());
    let dst = tempfile::tempdir().unwrap();
    mirror(&server.addr, dst.path(), &[]);
    let copy = dst.path().join("sparse.img");
    run(Command::new("cmp").arg(&src).arg(&copy));
    let (a, b) = (allocated(&src), allocated(&copy));
    assert!(
        b <= a + a / 10 + (64 << 10),
        "the copy allocates {b} bytes, the source {a}"
    );
    let s: serde_json::Value = serde_json::from_str(&run(ferry_tests::ferry()
        .arg("status")
        .arg(dst.path())
        .arg("--json")))
    .unwrap();
    let fetched = s["bytes_fetched"].as_u64().unwrap();
    assert!(
        fetched <= 8 << 20,
        "{fetched} bytes fetched for ~3.2 MiB of data: {s}"
    );
    assert_eq!(s["files_verified"].as_u64(), Some(1), "{s}");
    // A byte written into a hole of the copy (the copy is verified without reading its
    // holes: the sparse hash still sees it) is found by --checksum and fetched again.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
        f.write_all_at(b"x", 500 << 20).unwrap();
    }
    assert!(!Command::new("cmp")
        .arg(&src)
        .arg(&copy)
        .output()
        .unwrap()
        .status
        .success());
    mirror(&server.addr, dst.path(), &["--checksum"]);
    run(Command::new("cmp").arg(&src).arg(&copy));
    let (a, b) = (allocated(&src), allocated(&copy));
    assert!(
        b <= a + a / 10 + (64 << 10),
        "after the refetch the copy allocates {b} bytes, the source {a}"
    );
}

fn mirror_output(addr: &str, dst: &Path, extra: &[&str]) -> String {
    let out = ferry_tests::ferry()
        .arg("mirror")
        .arg(addr)
        .arg(dst)
        .arg("--quiet")
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

#[test]
fn fifos_and_devices_are_copied_as_root_and_sockets_are_counted() {
    use std::os::unix::fs::FileTypeExt;
    if !root_or_skip("device nodes") {
        return;
    }
    let export = tempfile::tempdir().unwrap();
    let e = export.path();
    run(Command::new("mkfifo")
        .args(["-m", "0640"])
        .arg(e.join("pipe")));
    run(Command::new("mknod")
        .arg(e.join("null"))
        .args(["c", "1", "3"]));
    let _sock = std::os::unix::net::UnixListener::bind(e.join("sock")).unwrap();
    chown(&e.join("pipe"), 4242, 4343);
    let server = TestServer::start(e);
    let dst = tempfile::tempdir().unwrap();
    let err = mirror_output(&server.addr, dst.path(), &[]);
    let d = dst.path();
    let pipe = std::fs::symlink_metadata(d.join("pipe")).unwrap();
    assert!(pipe.file_type().is_fifo());
    assert_eq!(pipe.mode() & 0o7777, 0o640);
    assert_eq!((pipe.uid(), pipe.gid()), (4242, 4343));
    let null = std::fs::symlink_metadata(d.join("null")).unwrap();
    assert!(null.file_type().is_char_device());
    assert_eq!(
        null.rdev(),
        std::fs::metadata(e.join("null")).unwrap().rdev()
    );
    assert!(!d.join("sock").exists(), "sockets are not copied");
    assert!(err.contains("1 special files not copied"), "{err}");
    let s: serde_json::Value = serde_json::from_str(&run(ferry_tests::ferry()
        .arg("status")
        .arg(d)
        .arg("--json")))
    .unwrap();
    assert_eq!(s["specials_skipped"].as_u64(), Some(1), "{s}");
}

#[test]
fn delete_removes_what_the_server_no_longer_has_and_names_it() {
    let export = tempfile::tempdir().unwrap();
    let e = export.path();
    std::fs::create_dir_all(e.join("keep/old")).unwrap();
    std::fs::write(e.join("keep/a"), b"a").unwrap();
    std::fs::write(e.join("keep/gone"), b"gone").unwrap();
    std::fs::write(e.join("keep/old/x"), vec![1u8; 3 << 20]).unwrap();
    std::os::unix::fs::symlink("a", e.join("keep/link")).unwrap();
    let server = TestServer::start(e);
    let dst = tempfile::tempdir().unwrap();
    let d = dst.path();
    mirror(&server.addr, d, &[]);
    std::fs::remove_file(e.join("keep/gone")).unwrap();
    std::fs::remove_dir_all(e.join("keep/old")).unwrap();
    std::fs::remove_file(e.join("keep/link")).unwrap();
    // Without --delete, nothing local goes.
    mirror(&server.addr, d, &[]);
    assert!(d.join("keep/gone").exists() && d.join("keep/old/x").exists());
    let err = mirror_output(&server.addr, d, &["--delete"]);
    for p in ["keep/gone", "keep/old", "keep/link"] {
        assert!(
            std::fs::symlink_metadata(d.join(p)).is_err(),
            "{p} is still there"
        );
        assert!(err.contains(&format!("/{p}")), "{p} not named: {err}");
    }
    assert!(err.contains("3 local entries deleted"), "{err}");
    assert_eq!(std::fs::read(d.join("keep/a")).unwrap(), b"a");
    run(Command::new("diff")
        .args(["-r", "--no-dereference", "--exclude=.ferry"])
        .arg(e)
        .arg(d));
    // The journal forgot them: a rerun has nothing more to say.
    let err = mirror_output(&server.addr, d, &["--delete"]);
    assert!(!err.contains("deleted"), "{err}");
}

/// `getfattr -d -m - --absolute-names` of `p`, minus the header (every attribute, ACLs
/// included, hex-encoded where binary).
fn all_xattrs(p: &Path) -> String {
    run(Command::new("getfattr")
        .args(["-d", "-m", "-", "-e", "hex", "--absolute-names"])
        .arg(p))
    .lines()
    .filter(|l| !l.starts_with("# file:"))
    .collect::<Vec<_>>()
    .join("\n")
}

#[test]
fn mirror_copies_xattrs_and_acls_and_drops_those_the_server_no_longer_has() {
    if !ferry_tests::have_tools(&["setfacl", "setfattr"]) {
        return;
    }
    let export = tempfile::tempdir().unwrap();
    let e = export.path();
    std::fs::create_dir(e.join("d")).unwrap();
    std::fs::write(e.join("d/f"), b"with attributes").unwrap();
    std::fs::write(e.join("plain"), b"none").unwrap();
    run(Command::new("setfattr")
        .args(["-n", "user.checksum", "-v", "sha256:abc"])
        .arg(e.join("d/f")));
    run(Command::new("setfattr")
        .args(["-n", "user.bin", "-v", "0x00ff10"])
        .arg(e.join("d/f")));
    run(Command::new("setfacl")
        .args(["-m", "u:nobody:r,g:nogroup:rw"])
        .arg(e.join("d/f")));
    run(Command::new("setfacl")
        .args(["-d", "-m", "u:nobody:rx"])
        .arg(e.join("d")));
    run(Command::new("setfattr")
        .args(["-n", "user.dir", "-v", "yes"])
        .arg(e.join("d")));
    // Names past what either end lists on the stack (512 bytes): 40 names of 40 bytes, on a
    // file and on a directory (kept from run to run: the copy's own list is read then).
    std::fs::write(e.join("d/many"), b"many attributes").unwrap();
    let long = |i: usize| format!("user.an-attribute-with-a-long-name-{i:04}");
    for i in 0..40 {
        for p in ["d/many", "d"] {
            run(Command::new("setfattr")
                .args(["-n", &long(i), "-v", &format!("value {i}")])
                .arg(e.join(p)));
        }
    }
    let server = TestServer::start(e);
    let dst = tempfile::tempdir().unwrap();
    let d = dst.path();
    mirror(&server.addr, d, &[]);
    for p in ["d", "d/f", "d/many", "plain"] {
        assert_eq!(all_xattrs(&e.join(p)), all_xattrs(&d.join(p)), "{p}");
    }
    assert!(all_xattrs(&d.join("d/f")).contains("system.posix_acl_access"));
    assert!(run(Command::new("getfacl").arg(d.join("d/f"))).contains("user:nobody:r--"));
    // Removed on the server (the ctime moves: a new version): removed from the copy.
    run(Command::new("setfattr")
        .args(["-x", "user.checksum"])
        .arg(e.join("d/f")));
    for i in (0..40).step_by(2) {
        for p in ["d/many", "d"] {
            run(Command::new("setfattr")
                .args(["-x", &long(i)])
                .arg(e.join(p)));
        }
    }
    mirror(&server.addr, d, &[]);
    assert_eq!(all_xattrs(&e.join("d/f")), all_xattrs(&d.join("d/f")));
    assert!(!all_xattrs(&d.join("d/f")).contains("user.checksum"));
    for p in ["d/many", "d"] {
        let many = all_xattrs(&d.join(p));
        assert_eq!(all_xattrs(&e.join(p)), many, "{p}");
        assert!(
            many.contains(&long(39)) && !many.contains(&long(38)),
            "{many}"
        );
    }
    // --no-xattrs copies none.
    let none = tempfile::tempdir().unwrap();
    mirror(&server.addr, none.path(), &["--no-xattrs"]);
    assert!(!all_xattrs(&none.path().join("d/f")).contains("user."));
}

/// Lays out a 256 MiB sparse file at `p` with islands of data (at the start, mid-chunk,
/// across a chunk boundary, at the very end).
fn sparse_file(p: &Path) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(p).unwrap();
    f.set_len(256 << 20).unwrap();
    let island = |n: usize, seed: u8| -> Vec<u8> { (0..n).map(|i| (i as u8) ^ seed).collect() };
    for (at, n, seed) in [
        (0u64, 1 << 20, 1u8),
        ((100 << 20) + 12345, 100_000, 2),
        ((200 << 20) - 4096, 8192, 3),
        ((256 << 20) - 5000, 5000, 4),
    ] {
        f.write_all_at(&island(n, seed), at).unwrap();
    }
    f.sync_all().unwrap();
}

/// `lseek(path, offset, whence)`: the offset, or the errno.
fn seek(f: &std::fs::File, offset: i64, whence: i32) -> Result<i64, i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: lseek on a valid descriptor.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

#[test]
fn holes_through_the_mount_are_found_by_seek_read_without_the_network_and_kept_as_holes() {
    ferry_tests::require_fuse!();
    let export = tempfile::tempdir().unwrap();
    let src = export.path().join("sparse.img");
    sparse_file(&src);
    let server = TestServer::start(export.path());
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap().to_string();
    let m = TestMount::mount(&server.addr, &["--cache-dir", &cache_arg]);
    let through = m.path().join("sparse.img");
    let (a, b) = (
        std::fs::File::open(&src).unwrap(),
        std::fs::File::open(&through).unwrap(),
    );
    // SEEK_DATA and SEEK_HOLE land where they land on the source, everywhere that matters.
    let mut probes = vec![0i64, 1, 4096, (1 << 20) - 1, 1 << 20, 100 << 20, 256 << 20];
    for (at, n) in [
        ((100 << 20) + 12345, 100_000),
        ((200 << 20) - 4096, 8192),
        ((256 << 20) - 5000, 5000),
    ] {
        probes.extend([at - 1, at, at + 1, at + n - 1, at + n, at + n + 1]);
    }
    for off in probes {
        for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
            assert_eq!(
                seek(&b, off, whence),
                seek(&a, off, whence),
                "lseek({off}, {whence})"
            );
        }
    }
    // Read through (every byte, holes included): the bytes are the source's, and the
    // server sent only about the data.
    run(Command::new("cmp").arg(&src).arg(&through));
    let s = ferry_tests::status(&m.path());
    let wire = s["mount"]["decoded_bytes"].as_u64().unwrap();
    assert!(
        wire <= 12 << 20,
        "{wire} bytes fetched for ~1.1 MiB of data: {s}"
    );
    // The local copy the reads made is as sparse as the source.
    let local = cache.path().join("sparse.img");
    let allocated = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
    assert!(ferry_tests::wait_for(Duration::from_secs(10), || {
        ferry_tests::status(&m.path())["mount"]["files_verified_by_reads"].as_u64() == Some(1)
    }));
    run(Command::new("cmp").arg(&src).arg(&local));
    let (sa, la) = (allocated(&src), allocated(&local));
    assert!(
        la <= sa + sa / 10 + (64 << 10),
        "the local copy allocates {la} bytes, the source {sa}"
    );
}

/// What two trees must agree on to be the same: for every path, its type, size, mode,
/// owner, link count, mtime (not of symlinks), extended attributes and ACLs, and how much
/// it allocates (within 10 % and 64 KiB).
fn assert_same_tree(src: &Path, copy: &Path, how: &str) {
    let want = ferry_tests::walk(src);
    let got = ferry_tests::walk(copy);
    let names = |w: &[ferry_tests::Meta]| w.iter().map(|m| m.rel.clone()).collect::<Vec<_>>();
    assert_eq!(names(&want), names(&got), "{how}: the names differ");
    for m in &want {
        let (a, b) = (src.join(&m.rel), copy.join(&m.rel));
        let (ma, mb) = (
            std::fs::symlink_metadata(&a).unwrap(),
            std::fs::symlink_metadata(&b).unwrap(),
        );
        let what = format!("{how}: {}", m.rel.display());
        assert_eq!(ma.file_type(), mb.file_type(), "{what}: type");
        assert_eq!(ma.mode(), mb.mode(), "{what}: mode");
        assert_eq!((ma.uid(), ma.gid()), (mb.uid(), mb.gid()), "{what}: owner");
        if ma.is_file() {
            assert_eq!(ma.len(), mb.len(), "{what}: size");
            assert_eq!(ma.nlink(), mb.nlink(), "{what}: link count");
            assert_eq!(ma.mtime(), mb.mtime(), "{what}: mtime");
            let (x, y) = (ma.blocks() * 512, mb.blocks() * 512);
            assert!(
                y <= x + x / 10 + (64 << 10),
                "{what}: allocates {y}, the source {x}"
            );
            run(Command::new("cmp").arg(&a).arg(&b));
        }
        if ma.is_file() || ma.is_dir() {
            assert_eq!(all_xattrs(&a), all_xattrs(&b), "{what}: xattrs and ACLs");
        } else if ma.file_type().is_symlink() {
            assert_eq!(
                std::fs::read_link(&a).unwrap(),
                std::fs::read_link(&b).unwrap(),
                "{what}"
            );
        }
    }
}

#[test]
fn rsync_ahaxs_out_of_the_mount_and_ferry_mirror_each_give_the_source() {
    ferry_tests::require_fuse!();
    if !ferry_tests::have_tools(&["rsync", "setfacl", "setfattr", "getfattr"]) {
        return;
    }
    let export = tempfile::tempdir().unwrap();
    let e = export.path().join("tree");
    std::fs::create_dir_all(e.join("etc/conf.d")).unwrap();
    std::fs::create_dir_all(e.join("data/base")).unwrap();
    std::fs::write(e.join("etc/app.conf"), b"port = 5432\n").unwrap();
    std::fs::write(e.join("etc/conf.d/secret"), b"token\n").unwrap();
    std::fs::set_permissions(
        e.join("etc/conf.d/secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(e.join("etc/conf.d"), std::fs::Permissions::from_mode(0o750)).unwrap();
    ferry_tests::write_random(&e.join("data/base/16384"), 3 << 20, 7);
    std::fs::hard_link(e.join("data/base/16384"), e.join("data/base/linked")).unwrap();
    sparse_file(&e.join("data/sparse.img"));
    std::os::unix::fs::symlink("../etc/app.conf", e.join("data/conf")).unwrap();
    run(Command::new("mkfifo").arg(e.join("data/pipe")));
    run(Command::new("setfattr")
        .args(["-n", "user.origin", "-v", "db1"])
        .arg(e.join("data/base/16384")));
    run(Command::new("setfattr")
        .args(["-n", "user.empty"])
        .arg(e.join("etc")));
    run(Command::new("setfacl")
        .args(["-m", "u:nobody:r,g:nogroup:rw,m:rw"])
        .arg(e.join("etc/app.conf")));
    run(Command::new("setfacl")
        .args(["-d", "-m", "u:nobody:rx"])
        .arg(e.join("data")));
    // Small files whose metadata creation does not give (the mirror creates a small file
    // with its mode and sets only what came out otherwise): bits the umask clears, a mode
    // without the owner's write (created writable), a file
    // without an ACL in a directory with a default one (the copy inherits one, and a mask
    // in its mode), and, as root, set-ID bits and a group other than the set-group-ID
    // directory's.
    let small = |p: &str, mode: u32| {
        std::fs::write(e.join(p), format!("{p}\n")).unwrap();
        std::fs::set_permissions(e.join(p), std::fs::Permissions::from_mode(mode)).unwrap();
    };
    small("etc/wide-open", 0o777);
    small("etc/read-only", 0o444);
    small("data/small.conf", 0o640);
    if is_root() {
        let (uid, gid) = nobody();
        for p in ["etc/conf.d", "etc/conf.d/secret", "data/base/16384"] {
            chown(&e.join(p), uid, gid);
        }
        small("etc/setuid-tool", 0o4755);
        std::fs::create_dir(e.join("shared")).unwrap();
        chown(&e.join("shared"), 0, gid);
        std::fs::set_permissions(e.join("shared"), std::fs::Permissions::from_mode(0o2775))
            .unwrap();
        small("shared/roots", 0o644);
        chown(&e.join("shared/roots"), 0, 0);
        small("shared/theirs", 0o664);
    }
    for (i, p) in [
        "etc/app.conf",
        "etc/conf.d/secret",
        "data/base/16384",
        "data/sparse.img",
    ]
    .iter()
    .enumerate()
    {
        ferry_tests::set_mtime(&e.join(p), 1_600_000_000 + i as i64, 123_456_789);
    }
    let server = TestServer::start(export.path());

    let m = TestMount::mount(&server.addr, &[]);
    let rs = tempfile::tempdir().unwrap();
    run(Command::new("rsync")
        .arg("-aHAXS")
        .arg(m.path().join("tree"))
        .arg(rs.path()));
    assert_same_tree(&e, &rs.path().join("tree"), "rsync -aHAXS out of the mount");
    let cp = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg("-a")
        .arg(m.path().join("tree"))
        .arg(cp.path()));
    assert_eq!(
        all_xattrs(&e.join("etc/app.conf")),
        all_xattrs(&cp.path().join("tree/etc/app.conf")),
        "cp -a keeps ACLs"
    );
    assert!(
        run(Command::new("getfacl").arg(m.path().join("tree/etc/app.conf")))
            .contains("group:nogroup:rw-")
    );

    let mi = tempfile::tempdir().unwrap();
    mirror(&server.addr, mi.path(), &[]);
    assert_same_tree(&e, &mi.path().join("tree"), "ferry mirror");
}

/// The same equality on trees of real shapes: a real PostgreSQL data directory (owned by
/// postgres, modes 0700/0600, a real database's files) and a real source tree (the system's
/// /usr/include/linux, when installed), out of the mount with `rsync -aHAXS` and with
/// `ferry mirror`.
#[test]
fn rsync_ahaxs_and_ferry_mirror_of_a_real_data_directory_and_source_tree_give_the_source() {
    ferry_tests::require_fuse!();
    if !ferry_tests::have_tools(&["rsync", "getfattr"]) {
        return;
    }
    let top = tempfile::tempdir().unwrap();
    let Some((_pg, export, _)) = source_cluster(top.path()) else {
        return;
    };
    let include = Path::new("/usr/include/linux");
    if include.is_dir() {
        run(Command::new("cp")
            .arg("-a")
            .arg(include)
            .arg(export.join("linux")));
    }
    let server = TestServer::start(&export);
    let m = TestMount::mount(&server.addr, &[]);
    let trees: Vec<&str> = ["pgdata", "linux"]
        .into_iter()
        .filter(|t| export.join(t).is_dir())
        .collect();
    let rs = tempfile::tempdir().unwrap();
    run(Command::new("rsync")
        .arg("-aHAXS")
        .args(trees.iter().map(|t| m.path().join(t)))
        .arg(rs.path()));
    let mi = tempfile::tempdir().unwrap();
    mirror(&server.addr, mi.path(), &[]);
    for tree in trees {
        assert_same_tree(&export.join(tree), &rs.path().join(tree), "rsync -aHAXS");
        assert_same_tree(&export.join(tree), &mi.path().join(tree), "ferry mirror");
    }
}

/// `getfattr -R -d` of `dir` under `root`, with paths relative to `root`.
fn tree_xattrs(root: &Path, dir: &str) -> String {
    run(Command::new("getfattr")
        .args(["-R", "-d", "-m", "-", "-e", "hex", dir])
        .current_dir(root))
}

#[test]
fn a_directory_with_over_a_mib_of_xattrs_is_copied_whole_by_mirror_and_mount() {
    // One DirXattrs answer holds 1 MiB of names and values: a directory past that (labels on
    // tens of thousands of files) comes in pages (XATTRS_PAGED), not as an error.
    ferry_tests::require_fuse!();
    if !ferry_tests::have_tools(&["setfattr", "getfattr"]) {
        return;
    }
    let export = tempfile::tempdir().unwrap();
    let e = export.path();
    std::fs::create_dir(e.join("d")).unwrap();
    let mut dump = String::new();
    for i in 0..1300 {
        std::fs::write(e.join(format!("d/f{i:04}")), format!("{i}\n")).unwrap();
        let value = format!("{i:04}-").repeat(180); // 900 bytes each: 1.2 MB in all
        dump.push_str(&format!("# file: d/f{i:04}\nuser.big=\"{value}\"\n\n"));
    }
    dump.push_str("# file: d\nuser.dir=\"the directory's own\"\n\n");
    std::fs::write(e.join("dump"), dump).unwrap();
    run(Command::new("setfattr")
        .arg("--restore=dump")
        .current_dir(e));
    std::fs::remove_file(e.join("dump")).unwrap();
    let want = tree_xattrs(e, "d");
    assert!(
        want.len() > (1 << 20) * 2,
        "{} bytes of getfattr output",
        want.len()
    );
    let server = TestServer::start(e);
    let dst = tempfile::tempdir().unwrap();
    let out = mirror_output(&server.addr, dst.path(), &[]);
    assert!(!out.contains("not copied"), "{out}");
    assert_eq!(tree_xattrs(dst.path(), "d"), want);
    let m = TestMount::mount(&server.addr, &[]);
    assert_eq!(tree_xattrs(&m.path(), "d"), want);
}
