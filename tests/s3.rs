//! ferry over an S3-compatible object store (issue 19): a real Garage cluster of three
//! nodes with replication factor 3 on 127.0.0.1 (`scripts/garage-cluster.sh`), objects put
//! with signed requests as a backup tool would, then `ferry mirror s3://…` and
//! `ferry mount s3://…` read with the tools users run.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use ferry_tests::s3::Garage;

const MIB: u64 = 1024 * 1024;
use ferry_tests::{require_fuse, require_s3, run, set_mtime, write_random, TestMount};

/// A tree of real shapes: a real header directory (when the machine has one), a file of
/// several chunks, an empty file, names with spaces and `+`, a deep path.
fn source_tree(root: &Path) {
    if !copy_headers("linux/netfilter", &root.join("netfilter")) {
        ferry_tests::build_tree(&root.join("generated"));
    }
    write_random(&root.join("big.bin"), 5 * 1024 * 1024 + 12345, 7);
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::create_dir_all(root.join("dir with space/deep/er")).unwrap();
    std::fs::write(root.join("dir with space/a+b c.txt"), b"plus and space\n").unwrap();
    std::fs::write(root.join("dir with space/deep/er/last.txt"), b"deep\n").unwrap();
}

/// `cp -a` of `/usr/include/DIR` to `to`; false (nothing copied) when the machine has no
/// such headers.
fn copy_headers(dir: &str, to: &Path) -> bool {
    let headers = Path::new("/usr/include").join(dir);
    if !headers.is_dir() {
        return false;
    }
    run(std::process::Command::new("cp")
        .arg("-a")
        .arg(headers)
        .arg(to));
    true
}

/// A cluster of `nodes` nodes whose bucket holds, under `prefix`, the tree `make` writes
/// into the returned directory; with the number of objects put.
fn bucket_with(
    nodes: usize,
    prefix: &str,
    make: impl FnOnce(&Path),
) -> (Garage, tempfile::TempDir, usize) {
    let g = Garage::start(nodes);
    let src = tempfile::tempdir().unwrap();
    make(src.path());
    let n = g.put_tree(src.path(), prefix);
    (g, src, n)
}

/// `diff -r` of the regular files' contents and the tree's names.
fn assert_same_contents(a: &Path, b: &Path) {
    run(std::process::Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(a)
        .arg(b));
}

fn status_json(dir: &Path) -> serde_json::Value {
    let out = run(ferry_tests::ferry().arg("status").arg(dir).arg("--json"));
    serde_json::from_str(&out).unwrap()
}

fn mirror(g: &Garage, prefix: &str, dir: &Path, extra: &[&str]) -> std::process::Output {
    g.ferry()
        .arg("mirror")
        .arg(g.url(prefix))
        .arg(dir)
        .arg("--quiet")
        .args(g.args())
        .args(extra)
        .output()
        .unwrap()
}

/// `ferry mount` of the whole bucket with the cluster's endpoints, the key and `extra`.
fn mount_bucket(g: &Garage, extra: &[&str]) -> TestMount {
    mount_prefix(g, "", extra)
}

/// `ferry mount s3://BUCKET/PREFIX`, as [`mount_bucket`].
fn mount_prefix(g: &Garage, prefix: &str, extra: &[&str]) -> TestMount {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("mnt")).unwrap();
    let mut args: Vec<String> = g.args();
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    TestMount::mount_env(dir, &g.url(prefix), &args, &g.credentials())
}

fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "ferry failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn mirror_of_a_bucket_is_its_objects_verified_and_a_rerun_moves_nothing() {
    require_s3!();
    let (g, src, n) = bucket_with(3, "src", source_tree);
    // What S3 has and a tree cannot show: a directory marker, a key with an empty segment,
    // an object beside the prefix (not under it).
    g.put("src/dir with space/", b"", false);
    g.put("src/bad//name", b"x", false);
    g.put("elsewhere.txt", b"not under the prefix", false);
    // A directory of more objects than one listing page (1,000) holds.
    std::fs::create_dir(src.path().join("many")).unwrap();
    let many: Vec<(String, Vec<u8>)> = (0..1100)
        .map(|i| {
            let body = format!("object {i}\n").into_bytes();
            std::fs::write(src.path().join(format!("many/{i:05}")), &body).unwrap();
            (format!("src/many/{i:05}"), body)
        })
        .collect();
    g.put_many(many);
    let n = n + 1100;

    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    ok(&mirror(&g, "src", &copy, &["--chunk-size", "1024"]));
    // The GETs went to all three gateways.
    let gets: Vec<usize> = (1..=3).map(|k| g.gets(k, "src/many/")).collect();
    let conns: usize = (1..=3).map(|k| g.get_clients(k, "src/many/").len()).sum();
    eprintln!("GETs by gateway: {gets:?} over {conns} connections");
    // Over many connections at once, each kept alive for several requests.
    assert!(
        (8..=1100 / 4).contains(&conns),
        "1,100 GETs over {conns} connections"
    );
    assert!(
        gets.iter().all(|&n| n >= 1100 / 10),
        "GETs of 1,100 objects by gateway: {gets:?}"
    );
    // The prefix `bad/` is a directory; its key with an empty segment is left out.
    assert_eq!(std::fs::read_dir(copy.join("bad")).unwrap().count(), 0);
    std::fs::create_dir(src.path().join("bad")).unwrap();
    assert_same_contents(src.path(), &copy);
    let s = status_json(&copy);
    assert_eq!(s["state"], "complete");
    assert_eq!(s["files_total"].as_u64().unwrap(), n as u64);
    assert_eq!(s["files_total"], s["files_verified"]);
    assert_eq!(s["error_count"], 0);

    // Again: everything is complete and verified, nothing moves.
    ok(&mirror(&g, "src", &copy, &["--chunk-size", "1024"]));
    let s = status_json(&copy);
    assert_eq!(s["state"], "complete");
    assert_eq!(s["bytes_fetched"], 0);
    assert_eq!(s["files_verified"], 0);

    // A copy edited by hand, size and mtime kept: --checksum compares it with the object's
    // checksum or ETag and fetches it again.
    let big = copy.join("big.bin");
    let m = std::fs::metadata(&big).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&big).unwrap();
    f.write_all_at(b"X", 3 * 1024 * 1024).unwrap();
    drop(f);
    use std::os::unix::fs::MetadataExt;
    set_mtime(&big, m.mtime(), m.mtime_nsec());
    ok(&mirror(
        &g,
        "src",
        &copy,
        &["--chunk-size", "1024", "--checksum"],
    ));
    assert_same_contents(src.path(), &copy);
    let s = status_json(&copy);
    assert!(s["bytes_fetched"].as_u64().unwrap() >= 1024 * 1024, "{s}");
}

#[test]
fn the_mount_reads_a_bucket_with_cp_and_a_replaced_object_is_an_error_never_a_splice() {
    require_fuse!();
    require_s3!();
    let (g, src, _) = bucket_with(3, "t", source_tree);
    // An object large enough that a random reader has fetched only what it read.
    let old = tempfile::NamedTempFile::new().unwrap();
    write_random(old.path(), 24 << 20, 11);
    let old_bytes = std::fs::read(old.path()).unwrap();
    g.put("t2/replaced.bin", &old_bytes, false);

    let m = mount_bucket(&g, &["--open-timeout", "0"]);
    let mnt = m.path();

    // cp -r of the tree out of the mount is the tree.
    let out = tempfile::tempdir().unwrap();
    run(std::process::Command::new("cp")
        .arg("-r")
        .arg(mnt.join("t"))
        .arg(out.path().join("t")));
    assert_same_contents(src.path(), &out.path().join("t"));
    // Sizes and kinds as the objects'; times are Last-Modified (now, give or take).
    let md = std::fs::metadata(mnt.join("t/big.bin")).unwrap();
    assert_eq!(
        md.len(),
        std::fs::metadata(src.path().join("big.bin")).unwrap().len()
    );
    let age = std::time::SystemTime::now()
        .duration_since(md.modified().unwrap())
        .unwrap_or_default();
    assert!(age < Duration::from_secs(600), "mtime {age:?} old");
    assert!(std::fs::metadata(mnt.join("t/dir with space"))
        .unwrap()
        .is_dir());

    // One handle, one version: after the object is replaced, a part of it not read yet
    // is an error, never the new object's bytes.
    let mut f = std::fs::File::open(mnt.join("t2/replaced.bin")).unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact(&mut head).unwrap();
    assert_eq!(head, old_bytes[..4096]);
    let mut new_bytes = old_bytes.clone();
    for b in new_bytes.iter_mut() {
        *b ^= 0x5a;
    }
    g.put("t2/replaced.bin", &new_bytes, false);
    f.seek(SeekFrom::Start(20 << 20)).unwrap();
    let mut tail = vec![0u8; 4096];
    match f.read_exact(&mut tail) {
        Err(e) => assert!(
            matches!(e.raw_os_error(), Some(libc::ESTALE) | Some(libc::EIO)),
            "{e}"
        ),
        Ok(()) => assert_eq!(
            tail,
            old_bytes[20 << 20..(20 << 20) + 4096],
            "a read of the old handle returned bytes of the new object"
        ),
    }
    drop(f);
    // A new open sees the new object, whole.
    assert!(std::fs::read(mnt.join("t2/replaced.bin")).unwrap() == new_bytes);
}

#[test]
fn a_gateway_killed_during_a_copy_is_skipped_and_the_copy_is_whole() {
    require_fuse!();
    require_s3!();
    let g = Garage::start(3);
    let data = tempfile::NamedTempFile::new().unwrap();
    write_random(data.path(), 64 << 20, 3);
    let bytes = std::fs::read(data.path()).unwrap();
    g.put("big/one.bin", &bytes, true);
    let src = tempfile::tempdir().unwrap();
    source_tree(src.path());
    g.put_tree(src.path(), "tree");

    let m = mount_bucket(&g, &[]);
    let out = tempfile::tempdir().unwrap();
    let mut cp = std::process::Command::new("cp")
        .arg(m.path().join("big/one.bin"))
        .arg(out.path().join("one.bin"))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    g.kill_node(2);
    assert!(cp.wait().unwrap().success());
    assert!(std::fs::read(out.path().join("one.bin")).unwrap() == bytes);

    // The mirror, started with the node down, skips its gateway.
    let copy = out.path().join("copy");
    ok(&mirror(&g, "tree", &copy, &[]));
    assert_same_contents(src.path(), &copy);
}

#[test]
fn bad_s3_input_is_one_clear_line() {
    require_s3!();
    let g = Garage::start(1);
    g.put("x/a.txt", b"a", false);
    let dst = tempfile::tempdir().unwrap();
    let fail = |mut c: std::process::Command, want: &str| {
        let out = c.output().unwrap();
        assert!(!out.status.success(), "{c:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{c:?}: {err}");
        assert!(
            err.trim().lines().count() == 1,
            "{c:?}: more than one line: {err}"
        );
    };
    let copy = dst.path().join("c");
    let base = |url: String| {
        let mut c = g.ferry();
        c.arg("mirror")
            .arg(url)
            .arg(&copy)
            .arg("--quiet")
            .args(g.args());
        c
    };
    // A bucket that does not exist.
    fail(base("s3://no-such-bucket/x".into()), "no such bucket");
    // A wrong secret.
    let mut c = base(g.url("x"));
    c.env("AWS_SECRET_ACCESS_KEY", "wrong");
    fail(c, "access denied");
    // Options of the other kind of source.
    let mut c = base(g.url("x"));
    c.arg("--tls");
    fail(c, "--tls");
    let mut c = g.ferry();
    c.arg("mirror")
        .arg("s3://b1x/x")
        .arg(&copy)
        .args(["--endpoint", "ftp://127.0.0.1:1"]);
    fail(c, "bad S3 endpoint");
    let mut c = g.ferry();
    c.arg("mirror")
        .arg("127.0.0.1:1")
        .arg(&copy)
        .args(["--endpoint", "http://127.0.0.1:1"]);
    fail(c, "s3://BUCKET");
    // A prefix with no objects under it.
    fail(base(g.url("nothing-here")), "no object \"nothing-here\"");
}

#[test]
fn the_mount_s_background_mirror_fills_a_verified_local_copy_of_a_bucket() {
    require_fuse!();
    require_s3!();
    let (g, src, n) = bucket_with(3, "", source_tree);
    let cache = tempfile::tempdir().unwrap();
    let m = mount_bucket(
        &g,
        &["--cache-dir", cache.path().to_str().unwrap(), "--mirror"],
    );
    // Readers meanwhile get the right bytes.
    run(std::process::Command::new("cmp")
        .arg(m.path().join("big.bin"))
        .arg(src.path().join("big.bin")));
    let done = ferry_tests::wait_for(Duration::from_secs(60), || {
        ferry_tests::status(&m.path())["state"] == "complete"
    });
    let s = ferry_tests::status(&m.path());
    assert!(done, "mirror did not complete: {s}\n{}", m.log_text());
    assert_eq!(s["files_total"].as_u64().unwrap(), n as u64, "{s}");
    assert_eq!(s["files_total"], s["files_done"], "{s}");
    assert_eq!(s["error_count"], 0, "{s}");
    // The local copy is the bucket, and reads are served from it.
    assert_same_contents(src.path(), cache.path());
    let before = ferry_tests::status(&m.path())["mount"]["passthrough_opens"]
        .as_u64()
        .unwrap();
    run(std::process::Command::new("cmp")
        .arg(m.path().join("big.bin"))
        .arg(src.path().join("big.bin")));
    let after = ferry_tests::status(&m.path())["mount"]["passthrough_opens"]
        .as_u64()
        .unwrap();
    assert!(
        after > before,
        "no passthrough open: {before} -> {after}\n{}",
        m.log_text()
    );
}

/// Random reads from a bucket into a local copy take the whole chunks they touch and keep
/// them (a ranged GET costs the store a block and a request whatever its length): after
/// two 4 KiB reads far apart (so the mount does not take them for a sequential reader),
/// chunks 40 and 12 of a 48 MiB file are whole in the local copy, and their neighbours
/// are not (nothing was read ahead).
#[test]
fn random_reads_of_a_bucket_into_a_local_copy_keep_the_whole_chunks_they_touch() {
    use std::os::fd::AsRawFd;
    require_fuse!();
    require_s3!();
    let (g, src, _) = bucket_with(3, "", |root: &Path| {
        write_random(&root.join("big.bin"), 48 * MIB as usize, 11);
    });
    let source = std::fs::read(src.path().join("big.bin")).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let m = mount_bucket(&g, &["--cache-dir", cache.path().to_str().unwrap()]);
    let f = std::fs::File::open(m.path().join("big.bin")).unwrap();
    // SAFETY: a valid descriptor; advice only (the kernel then reads no more than asked).
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    let mut buf = [0u8; 4096];
    for at in [40 * MIB + 8192, 12 * MIB + 100_000] {
        f.read_exact_at(&mut buf, at).unwrap();
        assert_eq!(
            &buf[..],
            &source[at as usize..at as usize + 4096],
            "at {at}"
        );
    }
    let copy = cache.path().join("big.bin");
    let whole = |i: u64| {
        let mut b = vec![0u8; MIB as usize];
        let at = (i * MIB) as usize;
        std::fs::File::open(&copy)
            .and_then(|c| c.read_exact_at(&mut b, i * MIB))
            .is_ok_and(|()| b[..] == source[at..at + MIB as usize])
    };
    // The write-back queue stores them in the background.
    let kept = ferry_tests::wait_for(Duration::from_secs(20), || whole(40) && whole(12));
    assert!(
        kept,
        "chunks 40 and 12 are not whole in the local copy\n{}",
        m.log_text()
    );
    for i in [11, 13, 39, 41] {
        assert!(!whole(i), "chunk {i} was stored, though no read touched it");
    }
    drop(f);
}

/// A sequential reader of an object gets it in long ranged GETs, not one per chunk: every
/// GET costs a request (and, on a store such as Garage, a read of the object's block list
/// from another node), so chunks read ahead go together, up to 8 MiB each. `cmp` of a
/// 40 MiB object (40 chunks) out of the mount equals the object, in under 20 reads; and
/// `ferry mirror` of a 41-chunk object copies it in aligned runs (under 12 reads).
#[test]
fn a_sequential_reader_and_the_mirror_get_an_object_in_long_ranged_gets() {
    require_fuse!();
    require_s3!();
    let (g, src, _) = bucket_with(3, "", |root: &Path| {
        write_random(&root.join("seq.bin"), 40 * MIB as usize, 5);
    });
    let m = mount_bucket(&g, &[]);
    run(std::process::Command::new("cmp")
        .arg(src.path().join("seq.bin"))
        .arg(m.path().join("seq.bin")));
    let reads = status_json(&m.path())["faults"]["chunks"].as_u64().unwrap();
    assert!(
        (1..20).contains(&reads),
        "{reads} reads for 40 chunks read in order\n{}",
        m.log_text()
    );
    drop(m);

    // `ferry mirror` of an object of 41 chunks: its aligned groups of eight, one GET each.
    write_random(&src.path().join("seq.bin"), 40 * MIB as usize + 4097, 6);
    g.put_tree(src.path(), "");
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    ok(&mirror(&g, "", &copy, &[]));
    assert_same_contents(src.path(), &copy);
    let s = status_json(&copy);
    assert_eq!(s["chunks_fetched"], 41, "{s}");
    assert_eq!(s["bytes_fetched"], 40 * MIB + 4097, "{s}");
    let reads = s["faults"]["chunks"].as_u64().unwrap();
    assert!((1..12).contains(&reads), "{reads} reads for 41 chunks: {s}");
}

#[test]
fn https_endpoints_are_checked_against_the_ca_given() {
    require_s3!();
    let g = Garage::start(1);
    let data = tempfile::tempdir().unwrap();
    write_random(&data.path().join("a.bin"), (3 << 20) + 17, 5);
    g.put(
        "t/a.bin",
        &std::fs::read(data.path().join("a.bin")).unwrap(),
        true,
    );
    let front = ferry_tests::s3::TlsFront::start(g.endpoints());
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    let cmd = |ca: Option<&Path>| {
        let mut c = g.ferry();
        c.env_remove("AWS_CA_BUNDLE")
            .arg("mirror")
            .arg(g.url("t"))
            .arg(&copy)
            .arg("--quiet")
            .args(["--endpoint", &front.url, "--region", "garage"]);
        if let Some(ca) = ca {
            c.arg("--ca").arg(ca);
        }
        c.output().unwrap()
    };
    // A CA that did not sign it: refused, in one line that says why.
    let out = cmd(None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("certificate"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // The CA that did: the copy, over TLS.
    ok(&cmd(Some(&front.ca)));
    assert_same_contents(data.path(), &copy);
}

#[test]
fn an_object_uploaded_in_parts_without_a_checksum_is_copied_and_its_copy_rechecked() {
    require_s3!();
    let g = Garage::start(1);
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("parts.bin"), (12 << 20) + 99, 9);
    let bytes = std::fs::read(src.path().join("parts.bin")).unwrap();
    g.put_multipart("m/parts.bin", &bytes, 5 << 20);
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    ok(&mirror(&g, "m", &copy, &[]));
    assert_same_contents(src.path(), &copy);
    let s = status_json(&copy);
    assert_eq!(s["files_verified"], 1, "{s}");
    // --checksum of an intact copy: nothing fetched (the store has no digest of it; the
    // BLAKE3 recorded at completion is what it is checked against).
    ok(&mirror(&g, "m", &copy, &["--checksum"]));
    assert_eq!(status_json(&copy)["bytes_fetched"], 0);
    // Edited by hand, size and mtime kept: found against that BLAKE3 and fetched again (not
    // taken back as the source's by its size and mtime: the store has no digest to confirm it).
    let f = copy.join("parts.bin");
    let m = std::fs::metadata(&f).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .write_all_at(b"Y", 7 << 20)
        .unwrap();
    use std::os::unix::fs::MetadataExt;
    set_mtime(&f, m.mtime(), m.mtime_nsec());
    ok(&mirror(&g, "m", &copy, &["--checksum"]));
    assert_same_contents(src.path(), &copy);
    assert!(status_json(&copy)["bytes_fetched"].as_u64().unwrap() > 0);
}

/// Each whole-object checksum a store keeps, read and computed right end to end. Objects
/// of more than one chunk: put whole with SHA-256, CRC64NVME, CRC32C, CRC32 and none (its
/// ETag is the MD5), and in parts with a full-object CRC64NVME, CRC32C and none (their
/// ETags are no MD5: the checksum is the only digest). They are copied and verified, and
/// `--checksum` of the intact copy fetches nothing. A copy seeded by hand (`cp -a`: sizes
/// and mtimes match) is taken by comparing each file's digest of the store's kind with the
/// store's, without a byte fetched, except the file changed by hand and the object in
/// parts without a checksum (nothing to confirm it by): those are fetched.
#[test]
fn copies_seeded_by_hand_are_taken_by_the_store_s_sha256_crc64nvme_crc32c_crc32_or_md5() {
    use ferry_client::DigestKind as K;
    require_s3!();
    let g = Garage::start(1);
    let src = tempfile::tempdir().unwrap();
    // (name, checksum, put in parts of 5 MiB)
    let objects = [
        ("sha256.bin", Some(K::Sha256), false),
        ("crc64nvme.bin", Some(K::Crc64Nvme), false),
        ("crc32c.bin", Some(K::Crc32c), false),
        ("crc32.bin", Some(K::Crc32), false),
        ("md5.bin", None, false),
        ("parts-crc64nvme.bin", Some(K::Crc64Nvme), true),
        ("parts-crc32c.bin", Some(K::Crc32c), true),
        ("parts-none.bin", None, true),
    ];
    for (i, (name, kind, in_parts)) in objects.into_iter().enumerate() {
        let p = src.path().join(name);
        let len = if in_parts { 11 * MIB } else { 2 * MIB } as usize + 1000 * i;
        write_random(&p, len, 30 + i as u64);
        let (key, bytes) = (format!("c/{name}"), std::fs::read(&p).unwrap());
        if in_parts {
            g.put_multipart_checked(&key, &bytes, 5 << 20, kind);
        } else {
            g.put_checked(&key, &bytes, kind);
        }
    }
    let dst = tempfile::tempdir().unwrap();
    let a = dst.path().join("a");
    ok(&mirror(&g, "c", &a, &[]));
    assert_same_contents(src.path(), &a);
    let s = status_json(&a);
    assert_eq!(s["files_verified"], 8, "{s}");
    assert_eq!(s["hash_mismatches"], 0, "{s}");
    ok(&mirror(&g, "c", &a, &["--checksum"]));
    let s = status_json(&a);
    assert_eq!(s["bytes_fetched"], 0, "{s}");
    assert_eq!(s["files_verified"], 8, "{s}");

    let b = dst.path().join("b");
    run(std::process::Command::new("cp").arg("-a").arg(&a).arg(&b));
    // One changed by hand, its size and mtime kept.
    let f = b.join("sha256.bin");
    let m = std::fs::metadata(&f).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .write_all_at(b"Z", MIB + 5)
        .unwrap();
    use std::os::unix::fs::MetadataExt;
    set_mtime(&f, m.mtime(), m.mtime_nsec());
    ok(&mirror(&g, "c", &b, &[]));
    assert_same_contents(src.path(), &b);
    let s = status_json(&b);
    let unconfirmed = std::fs::metadata(src.path().join("parts-none.bin"))
        .unwrap()
        .len();
    assert_eq!(
        s["bytes_fetched"],
        m.len() + unconfirmed,
        "only the changed file and the one without a digest are fetched: {s}"
    );
    assert_eq!(s["files_verified"], 8, "{s}");
}

/// A tree whose modes, owners and times matter: private directories and files, another
/// owner, nanosecond mtimes, a setuid file, a symlink, and a real header directory.
fn owned_tree(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    std::fs::create_dir_all(root.join("data")).unwrap();
    std::fs::create_dir_all(root.join("conf")).unwrap();
    std::fs::write(root.join("data/f1"), b"private\n").unwrap();
    write_random(&root.join("data/big.bin"), 5 * 1024 * 1024 + 3, 11);
    std::fs::write(root.join("conf/x.conf"), b"key = value\n").unwrap();
    std::fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    std::os::unix::fs::symlink("data/f1", root.join("link")).unwrap();
    copy_headers("linux/netfilter", &root.join("headers"));
    mode(&root.join("data/f1"), 0o600);
    mode(&root.join("data/big.bin"), 0o640);
    mode(&root.join("conf/x.conf"), 0o640);
    mode(&root.join("run.sh"), 0o4755);
    set_mtime(&root.join("data/f1"), 981_173_106, 123_456_789);
    set_mtime(&root.join("data/big.bin"), 1_500_000_000, 5);
    set_mtime(&root.join("conf/x.conf"), 1_600_000_000, 500_000_000);
    for p in ["data/f1", "data/big.bin", "data"] {
        ferry_tests::pg::chown(&root.join(p), 1234, 2345);
    }
    mode(&root.join("conf"), 0o750);
    mode(&root.join("data"), 0o700);
}

/// Each file and symlink of `src` is in `copy` with its mode (less setuid and setgid, which
/// are never taken from metadata), owner and mtime (files) or target (links); with `dirs`,
/// each directory with its mode and owner.
fn assert_same_attributes(src: &Path, copy: &Path, dirs: bool) {
    let theirs: std::collections::HashMap<_, _> = ferry_tests::walk(copy)
        .into_iter()
        .map(|m| (m.rel.clone(), m))
        .collect();
    let mut checked = 0;
    for m in ferry_tests::walk(src) {
        let Some(c) = theirs.get(&m.rel) else {
            panic!("{} is not in {}", m.rel.display(), copy.display());
        };
        let what = format!("{} in {}", m.rel.display(), copy.display());
        match m.mode & 0o170_000 {
            0o100_000 => {
                assert_eq!(c.mode, m.mode & !0o6000, "mode of {what}");
                assert_eq!(c.owner, m.owner, "owner of {what}");
                assert_eq!(
                    (c.mtime, c.mtime_nsec),
                    (m.mtime, m.mtime_nsec),
                    "mtime of {what}"
                );
                assert_eq!(c.size, m.size, "size of {what}");
            }
            0o120_000 => assert_eq!(c.target, m.target, "target of {what}"),
            _ if dirs && !m.rel.as_os_str().is_empty() => {
                assert_eq!(c.mode, m.mode, "mode of {what}");
                assert_eq!(c.owner, m.owner, "owner of {what}");
            }
            _ => continue,
        }
        checked += 1;
    }
    assert!(checked >= 7, "only {checked} entries compared");
}

#[test]
fn modes_owners_times_and_links_kept_by_rclone_and_s3fs_are_the_copy_s() {
    require_fuse!();
    require_s3!();
    if !ferry_tests::pg::root_or_skip("owners kept in object metadata")
        || !ferry_tests::have_tools(&["rclone", "s3fs"])
    {
        return;
    }
    let g = Garage::start(1);
    let src = tempfile::tempdir().unwrap();
    owned_tree(src.path());
    // Uploaded as users do: rclone with its metadata and links, and cp -a into s3fs.
    run(g
        .rclone()
        .args(["copy", "--metadata", "--links"])
        .arg(src.path())
        .arg("g:ferry-test/rc"));
    g.copy_in_with_s3fs(src.path(), "sf");

    let dst = tempfile::tempdir().unwrap();
    for (prefix, dirs) in [("rc", false), ("sf", true)] {
        let copy = dst.path().join(prefix);
        ok(&mirror(&g, prefix, &copy, &[]));
        assert_same_contents(src.path(), &copy);
        assert_same_attributes(src.path(), &copy, dirs);
        // The listing's HEADs and the reads described each object alike: nothing moves.
        ok(&mirror(&g, prefix, &copy, &[]));
        let s = status_json(&copy);
        assert_eq!(s["bytes_fetched"], 0, "{prefix}: {s}");
        assert_eq!(s["state"], "complete", "{prefix}: {s}");
    }
    // rclone keeps no directories: they get the documented default.
    let m = std::fs::metadata(dst.path().join("rc/data")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(m.mode() & 0o7777, 0o755);

    // Through the mount: the same attributes, the links, and cp -a out of it.
    let mnt = mount_bucket(&g, &[]);
    let f1 = std::fs::symlink_metadata(mnt.path().join("rc/data/f1")).unwrap();
    assert_eq!((f1.mode(), f1.uid(), f1.gid()), (0o100_600, 1234, 2345));
    assert_eq!((f1.mtime(), f1.mtime_nsec()), (981_173_106, 123_456_789));
    for p in ["rc/link", "sf/link"] {
        assert_eq!(
            std::fs::read_link(mnt.path().join(p)).unwrap(),
            Path::new("data/f1"),
            "{p}"
        );
    }
    let out = tempfile::tempdir().unwrap();
    run(std::process::Command::new("cp")
        .arg("-a")
        .arg(mnt.path().join("sf"))
        .arg(out.path().join("sf")));
    assert_same_contents(src.path(), &out.path().join("sf"));
    assert_same_attributes(src.path(), &out.path().join("sf"), true);
    drop(mnt);

    // --s3-metadata off: the defaults, and rclone's link is the file it is stored as.
    let plain = dst.path().join("plain");
    ok(&mirror(&g, "rc", &plain, &["--s3-metadata", "off"]));
    let m = std::fs::metadata(plain.join("data/f1")).unwrap();
    assert_eq!((m.mode(), m.uid()), (0o100_644, 0));
    assert_ne!(m.mtime(), 981_173_106);
    assert_eq!(
        std::fs::read(plain.join("link.rclonelink")).unwrap(),
        b"data/f1"
    );
}

#[test]
fn a_postgresql_data_directory_written_through_s3fs_mirrors_and_starts() {
    require_fuse!();
    require_s3!();
    let top = tempfile::tempdir().unwrap();
    let Some((pg, export, pg_owner)) = ferry_tests::pg::source_cluster(top.path()) else {
        return;
    };
    if !ferry_tests::have_tools(&["rclone", "s3fs"]) {
        return;
    }
    let g = Garage::start(1);
    g.copy_in_with_s3fs(&export.join("pgdata"), "pgdata");
    let dst = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dst.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let copy = dst.path().join("pgdata");
    ok(&mirror(&g, "pgdata", &copy, &[]));
    use std::os::unix::fs::MetadataExt;
    for p in [&copy, &copy.join("base"), &copy.join("PG_VERSION")] {
        let m = std::fs::metadata(p).unwrap();
        assert_eq!((m.uid(), m.gid()), pg_owner, "{}", p.display());
    }
    assert_eq!(std::fs::metadata(&copy).unwrap().mode() & 0o777, 0o700);
    // Every file and directory with the source's owner and mode (a file the server cannot
    // open is named here, not left to PostgreSQL's "Permission denied" at start).
    let source: std::collections::HashMap<_, _> = ferry_tests::walk(&export.join("pgdata"))
        .into_iter()
        .map(|m| (m.rel.clone(), (m.owner, m.mode)))
        .collect();
    let wrong: Vec<String> = ferry_tests::walk(&copy)
        .into_iter()
        .filter(|m| source.get(&m.rel).is_some_and(|s| *s != (m.owner, m.mode)))
        .map(|m| {
            format!(
                "{}: {:?} {:o}, source {:?}",
                m.rel.display(),
                m.owner,
                m.mode,
                source[&m.rel]
            )
        })
        .collect();
    assert!(wrong.is_empty(), "owner or mode differs: {wrong:#?}");
    let sock = ferry_tests::pg::socket_dir(top.path(), "sock2", pg_owner);
    let db = ferry_tests::pg::Postgres::start(&pg, &copy, &sock);
    assert_eq!(db.sql("select count(*), sum(id) from t"), "20000|200010000");
}

#[test]
fn a_profile_s_credential_process_gives_the_credentials_and_a_failing_one_is_one_line() {
    // As aws-vault, SSO helpers and vaults give credentials: a command in the profile that
    // prints them (with an expiry); no keys in the environment or the files.
    require_s3!();
    let g = Garage::start(1);
    g.put(
        "cp/a.txt",
        b"signed with a credential_process's keys\n",
        false,
    );
    let keys: std::collections::HashMap<String, String> = g.credentials().into_iter().collect();
    let dir = tempfile::tempdir().unwrap();
    let (runs, script, conf) = (
        dir.path().join("runs"),
        dir.path().join("creds.sh"),
        dir.path().join("config"),
    );
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho run >> '{}'\nprintf '{{\"Version\":1,\"AccessKeyId\":\"%s\",\"SecretAccessKey\":\"%s\",\"Expiration\":\"%s\"}}' '{}' '{}' \"$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)\"\n",
            runs.display(),
            keys["AWS_ACCESS_KEY_ID"],
            keys["AWS_SECRET_ACCESS_KEY"]
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(
        &conf,
        format!(
            "[profile vault]\ncredential_process = {}\n[profile expired]\ncredential_process = sh -c 'echo \"the session expired: run aws sso login\" >&2; exit 2'\n",
            script.display()
        ),
    )
    .unwrap();
    let ferry = |profile: &str, dst: &Path| {
        let mut c = ferry_tests::ferry();
        c.arg("mirror")
            .arg(g.url("cp"))
            .arg(dst)
            .arg("--quiet")
            .args(g.args())
            .args(["--profile", profile])
            .env("AWS_CONFIG_FILE", &conf)
            .env("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("none"))
            .env("AWS_ACCESS_KEY_ID", "")
            .env("AWS_SECRET_ACCESS_KEY", "")
            .env("AWS_SESSION_TOKEN", "")
            .env("AWS_PROFILE", "");
        c.output().unwrap()
    };
    let dst = tempfile::tempdir().unwrap();
    let out = ferry("vault", &dst.path().join("c"));
    ok(&out);
    assert_eq!(
        std::fs::read(dst.path().join("c/a.txt")).unwrap(),
        b"signed with a credential_process's keys\n"
    );
    assert!(std::fs::read_to_string(&runs).unwrap().lines().count() >= 1);
    let out = ferry("expired", &dst.path().join("d"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("credential_process") && err.contains("run aws sso login"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// `ferry mirror s3://…` killed with SIGKILL mid-copy and run again ends with the same
/// copy, and the second run fetches only what the first had not kept: the chunks the
/// journal names as present are not asked of the store again.
#[test]
fn kill_9_mid_mirror_of_a_bucket_then_resume_fetches_only_the_rest() {
    require_s3!();
    let (g, src, _) = bucket_with(3, "r", |root: &Path| {
        write_random(&root.join("big.bin"), (40 << 20) + 4097, 21);
        std::fs::create_dir(root.join("small")).unwrap();
        for i in 0..20 {
            write_random(&root.join(format!("small/f{i}")), 300 + i * 71, i as u64);
        }
    });
    let total: u64 = (40 << 20) + 4097 + (0..20).map(|i| 300 + i * 71).sum::<u64>();
    let dst = tempfile::tempdir().unwrap();
    let copy = dst.path().join("copy");
    // Slowed down (8 MB/s: at least five seconds) and killed 1.2 s after its status shows
    // 12 MiB done (one journal commit, every second, later): mid-object, with chunks kept.
    let mut child = g
        .ferry()
        .arg("mirror")
        .arg(g.url("r"))
        .arg(&copy)
        .arg("--quiet")
        .args(g.args())
        .args(["--chunk-size", "1024", "--bwlimit", "8M"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = ferry_tests::wait_for(Duration::from_secs(30), || {
        let out = ferry_tests::ferry()
            .arg("status")
            .arg(&copy)
            .arg("--json")
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|s| s["bytes_done"].as_u64())
            .is_some_and(|b| b >= 12 << 20)
    });
    std::thread::sleep(Duration::from_millis(1200));
    let finished = child.try_wait().unwrap().is_some();
    let _ = child.kill();
    child.wait().unwrap();
    assert!(started, "the mirror never showed 12 MiB done");
    assert!(!finished, "the mirror finished before the kill");
    let present = ferry_tests::present_bytes(&copy);
    eprintln!("{present} of {total} bytes kept by the killed run");
    assert!(
        (1..total).contains(&present),
        "{present} of {total} bytes kept"
    );

    ok(&mirror(&g, "r", &copy, &["--chunk-size", "1024"]));
    assert_same_contents(src.path(), &copy);
    let s = status_json(&copy);
    assert_eq!(s["state"], "complete");
    assert_eq!(s["error_count"], 0, "{s}");
    // The object cut short is verified whole once its last chunk is in.
    assert!(s["files_verified"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(
        s["bytes_fetched"].as_u64().unwrap(),
        total - present,
        "chunks kept by the first run were fetched again: {s}"
    );
}

/// Virtual-hosted addressing sends the bucket in the host name (`BUCKET.s3.garage.localhost`,
/// Garage's `root_domain`): the mirror runs in a mount namespace whose /etc/hosts names only
/// that host, so a request of the other style (whose host is `s3.garage.localhost`) cannot
/// even connect, and does not.
#[test]
fn virtual_hosted_requests_name_the_bucket_in_the_host_and_reach_the_server() {
    require_s3!();
    if !ferry_tests::is_root() {
        ferry_tests::skip("a mount namespace (for /etc/hosts) needs root");
        return;
    }
    let (g, src, _) = bucket_with(1, "vh", source_tree);
    let bucket = g.url("");
    let bucket = bucket
        .trim_start_matches("s3://")
        .trim_end_matches('/')
        .to_string();
    let port = g.endpoints().rsplit(':').next().unwrap().to_string();
    let work = tempfile::tempdir().unwrap();
    let hosts = work.path().join("hosts");
    std::fs::write(
        &hosts,
        format!("127.0.0.1 localhost\n127.0.0.1 {bucket}.s3.garage.localhost\n"),
    )
    .unwrap();
    let ferry = ferry_tests::ferry();
    let run_as = |style: &str, copy: &Path| {
        let mut c = std::process::Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind "$1" /etc/hosts && shift && exec "$@""#)
            .arg("sh")
            .arg(&hosts)
            .arg(ferry.get_program())
            .arg("mirror")
            .arg(g.url("vh"))
            .arg(copy)
            .arg("--quiet")
            .args(["--endpoint", &format!("http://s3.garage.localhost:{port}")])
            .args(["--region", "garage", "--s3-addressing", style])
            .envs(ferry.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .envs(g.credentials());
        c.output().unwrap()
    };
    let copy = work.path().join("copy");
    ok(&run_as("virtual", &copy));
    assert_same_contents(src.path(), &copy);
    assert_eq!(status_json(&copy)["state"], "complete");

    let other = work.path().join("other");
    let out = run_as("path", &other);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("s3.garage.localhost"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// A tree of real shapes for walks: the kernel's headers (29 directories, ~760 small
/// files, when the machine has them; a generated tree otherwise) and a deep narrow path.
fn header_tree(root: &Path) {
    if !copy_headers("linux", &root.join("linux")) {
        ferry_tests::build_tree(&root.join("generated"));
    }
    let deep = root.join("a/b/c/d/e");
    std::fs::create_dir_all(&deep).unwrap();
    for i in 0..5 {
        write_random(&deep.join(format!("f{i}.h")), 100 + i * 3001, i as u64);
    }
}

/// Tree-walk prediction over an S3 source: `cp -r`, `rsync -r` and `tar -c` of a prefix
/// of small objects out of a mount of that prefix equal the tree (nothing beside the
/// prefix shows), and for each, objects came ahead of the walker (prediction-class bytes, which only the tree prediction asks for when every
/// object is smaller than a chunk: read-ahead within a file never starts), each in one
/// GET.
#[test]
fn cp_rsync_and_tar_of_a_bucket_s_tree_get_its_objects_ahead_of_the_walk() {
    require_fuse!();
    require_s3!();
    let (g, src, n) = bucket_with(3, "hdr", header_tree);
    // Beside the prefix mounted, not under it.
    g.put("hdr.txt", b"beside", false);
    g.put("hdrx/y.h", b"beside too", false);
    let total: u64 = ferry_tests::walk(src.path())
        .iter()
        .filter(|m| m.mode & 0o170000 == 0o100000)
        .map(|m| m.size)
        .sum();
    for tool in ["cp", "rsync", "tar"] {
        let dst = tempfile::tempdir().unwrap();
        let copy = dst.path().join("copy");
        let lists = || (1..=3).map(|k| g.lists(k)).sum::<usize>();
        let lists_before = lists();
        let m = mount_prefix(&g, "hdr", &[]);
        match tool {
            "cp" => run(std::process::Command::new("cp")
                .arg("-r")
                .arg(m.path())
                .arg(&copy)),
            "rsync" => run(std::process::Command::new("rsync")
                .arg("-r")
                .arg(format!("{}/", m.path().display()))
                .arg(format!("{}/", copy.display()))),
            _ => {
                std::fs::create_dir(&copy).unwrap();
                run(std::process::Command::new("sh").arg("-c").arg(format!(
                    "tar -cf - -C '{}' . | tar -xf - -C '{}'",
                    m.path().display(),
                    copy.display()
                )))
            }
        };
        assert_same_contents(src.path(), &copy);
        let s = status_json(&m.path());
        let k = &s["scheduler"];
        let ahead = k["prediction_bytes"].as_u64().unwrap();
        let listed = lists() - lists_before;
        eprintln!(
            "{tool}: {n} objects, {total} bytes; prediction {ahead}, demand {}, reads {}, LISTs {listed}",
            k["demand_bytes"], s["faults"]["chunks"]
        );
        // Nearly all came ahead (the walker waited for few), and each once: a listing
        // taken again while the copy goes on does not fetch what the walker read already.
        let demand = k["demand_bytes"].as_u64().unwrap();
        assert!(
            ahead > 0 && demand < total / 2,
            "{tool}: objects did not come ahead of the walk: {s}\n{}",
            m.log_text()
        );
        let reads = s["faults"]["chunks"].as_u64().unwrap();
        assert!(
            reads <= (n + n / 50) as u64,
            "{tool}: {reads} reads for {n} objects: {s}"
        );
    }
}

/// Readers first over an S3 source: while the mount's background mirror fills a local
/// copy of a large object, 4 KiB random reads of another object get the right bytes, and
/// the scheduler governs the S3 mirror as it does ferryd's: whole chunks while no reader
/// is active, small pieces and a small window while one is; the mirror completes after.
#[test]
fn random_reads_beside_a_bucket_s_background_mirror_shrink_its_pieces_and_get_the_right_bytes() {
    use std::os::fd::AsRawFd;
    require_fuse!();
    require_s3!();
    let (g, src, _) = bucket_with(3, "", |root: &Path| {
        write_random(&root.join("big.bin"), 96 * MIB as usize, 21);
        write_random(&root.join("db.dat"), 16 * MIB as usize, 22);
    });
    let want = std::fs::read(src.path().join("db.dat")).unwrap();
    let cache = tempfile::tempdir().unwrap();
    // Capped so that the mirror still runs while the reads below happen.
    let m = mount_bucket(
        &g,
        &[
            "--cache-dir",
            cache.path().to_str().unwrap(),
            "--mirror",
            "--bwlimit",
            "8M",
        ],
    );
    let sched = || ferry_tests::status(&m.path())["scheduler"].clone();
    // The mirror alone: whole chunks.
    let started = ferry_tests::wait_for(Duration::from_secs(20), || {
        sched()["background_bytes"].as_u64().unwrap() > 2 * MIB
    });
    assert!(started, "the mirror did not start\n{}", m.log_text());
    let alone = sched();
    assert_eq!(alone["readers_active"], false, "{alone}");
    assert_eq!(alone["piece_size"], MIB, "{alone}");

    let f = std::fs::File::open(m.path().join("db.dat")).unwrap();
    // SAFETY: a valid descriptor; advice only (the kernel then reads no more than asked).
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut buf = [0u8; 4096];
    let mut seen = Vec::new();
    for i in 0..400 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = (x % (want.len() as u64 - 4096)) & !4095;
        f.read_exact_at(&mut buf, at).unwrap();
        assert_eq!(&buf[..], &want[at as usize..at as usize + 4096], "at {at}");
        if i % 50 == 49 {
            seen.push(sched());
        }
    }
    let during = seen
        .iter()
        .find(|k| k["readers_active"] == true)
        .unwrap_or_else(|| panic!("no sample saw the reader: {seen:?}"));
    eprintln!("mirror alone: {alone}\nbeside the reader: {during}");
    assert!(
        during["piece_size"].as_u64().unwrap() < MIB,
        "background pieces stayed whole beside a reader: {during}"
    );
    assert!(
        during["background_window"].as_u64().unwrap()
            < alone["background_window"].as_u64().unwrap(),
        "the background window did not shrink beside a reader: {alone} -> {during}"
    );
    drop(f);

    let done = ferry_tests::wait_for(Duration::from_secs(90), || {
        ferry_tests::status(&m.path())["state"] == "complete"
    });
    let s = ferry_tests::status(&m.path());
    assert!(done, "mirror did not complete: {s}\n{}", m.log_text());
    assert_eq!(s["error_count"], 0, "{s}");
    assert!(s["scheduler"]["demand_bytes"].as_u64().unwrap() > 0, "{s}");
    assert_same_contents(src.path(), cache.path());
}

/// A slow walk through a mount of a bucket lists each directory about once: listings ahead
/// of a walker that reads files are listed again when they grow older than the open TTL
/// (its opens take versions from them), so only about as many are held as the walker
/// reaches in that time. A walker of 200 directories at under 20 a second (a `cat` of one
/// object in each, then a pause) gets every object's bytes, with at most five LISTs per
/// directory (665 measured; before, all 200 were held and listed again every second: 1,441).
#[test]
fn a_slow_walk_through_a_bucket_lists_each_directory_about_once() {
    require_fuse!();
    require_s3!();
    let dirs = 200;
    let (g, _src, _) = bucket_with(1, "", |root: &Path| {
        for d in 0..dirs {
            let dir = root.join(format!("w/d{d:03}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("a.txt"), format!("directory {d}\n")).unwrap();
            std::fs::write(dir.join("b.txt"), b"b\n").unwrap();
        }
    });
    let m = mount_bucket(&g, &[]);
    let before = g.lists(1);
    let out = run(std::process::Command::new("sh").arg("-c").arg(format!(
        "cd '{}/w' && for d in *; do ls \"$d\" > /dev/null; cat \"$d/a.txt\"; sleep 0.05; done",
        m.path().display()
    )));
    let want: String = (0..dirs).map(|d| format!("directory {d}\n")).collect();
    assert_eq!(out, want);
    let listed = g.lists(1) - before;
    eprintln!("{listed} LISTs for a walk of {dirs} directories");
    assert!(
        listed <= 5 * dirs,
        "{listed} LISTs for a walk of {dirs} directories\n{}",
        m.log_text()
    );
}
