//! Compression end to end (issue 18): zstd at a fixed level and `auto` give the source and
//! say what they used; a server without zstd serves a client asking for it with lz4; corrupt
//! zstd payloads are caught and fetched again; bad values are refused with one line.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::io::Write;
use std::path::Path;
use std::process::Command;

use ferry_tests::proxy::{Fault, FaultProxy};
use ferry_tests::{bin, mirror, require_fuse, run, status, write_random, TestMount, TestServer};

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A text file of `len` bytes shaped like a database export: rows of numbers and names, as
/// compressible as such files are (about 3× with lz4, more with zstd).
fn write_rows(path: &Path, len: usize, seed: u64) {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let names = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf",
    ];
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut written = 0;
    let mut row = 0u64;
    while written < len {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let line = format!(
            "{row}\t{}\t{}\t{:.2}\t2026-11-{:02}\n",
            names[(x >> 33) as usize % names.len()],
            (x >> 40) % 100_000,
            ((x >> 20) % 1_000_000) as f64 / 100.0,
            1 + (x >> 50) % 28
        );
        let take = line.len().min(len - written);
        out.write_all(&line.as_bytes()[..take]).unwrap();
        written += take;
        row += 1;
    }
}

fn diff(a: &Path, b: &Path) {
    run(Command::new("diff").arg("-r").arg(a).arg(b));
}

/// A source with compressible rows and one incompressible file.
fn source() -> tempfile::TempDir {
    let src = tempfile::tempdir().unwrap();
    for i in 0..3 {
        write_rows(&src.path().join(format!("rows{i}.tsv")), 6 << 20, i);
    }
    write_random(&src.path().join("random.bin"), 3 << 20, 9);
    write_rows(&src.path().join("small.tsv"), 3000, 77);
    src
}

#[test]
fn zstd_at_a_fixed_level_and_auto_give_the_source_and_say_what_they_used() {
    let src = source();
    let server = TestServer::start(src.path());
    let dst = tempfile::tempdir().unwrap();
    let fixed = dst.path().join("fixed");
    mirror(&server.addr, &fixed, &["--compression", "zstd:3"]);
    diff(src.path(), &fixed);
    let s = status(&fixed);
    eprintln!("figures: zstd:3: {} {}", s["faults"], s["scheduler"]);
    assert_eq!(s["scheduler"]["compression"], "zstd:3", "{s}");
    assert_eq!(s["scheduler"]["compression_choice"], "zstd:3", "{s}");
    // 18 MiB of rows at zstd's ratio (over 3) and 3 MiB raw: well under half on the wire.
    let (wire, decoded) = (
        n(&s["faults"]["wire_bytes"]),
        n(&s["faults"]["decoded_bytes"]),
    );
    assert!(decoded >= 21 << 20, "{s}");
    assert!(wire * 2 < decoded, "wire {wire} of {decoded}");

    let auto = dst.path().join("auto");
    mirror(&server.addr, &auto, &[]);
    diff(src.path(), &auto);
    let s = status(&auto);
    eprintln!("figures: auto: {} {}", s["faults"], s["scheduler"]);
    assert_eq!(s["scheduler"]["compression_choice"], "auto", "{s}");
    let used = s["scheduler"]["compression"].as_str().unwrap();
    assert!(
        used == "none" || used == "lz4" || used.starts_with("zstd:"),
        "{s}"
    );
}

#[test]
fn a_server_without_zstd_serves_a_client_asking_for_it_with_lz4() {
    let src = source();
    let server = TestServer::start_with(src.path(), &["--max-compression-level", "off"]);
    let dst = tempfile::tempdir().unwrap();
    let m = dst.path().join("m");
    mirror(&server.addr, &m, &["--compression", "zstd:3"]);
    diff(src.path(), &m);
    let s = status(&m);
    assert_eq!(s["scheduler"]["compression"], "lz4", "{s}");
    let (wire, decoded) = (
        n(&s["faults"]["wire_bytes"]),
        n(&s["faults"]["decoded_bytes"]),
    );
    assert!(
        wire * 3 < decoded * 2,
        "lz4 saved little: wire {wire} of {decoded}"
    );
}

#[test]
fn a_zstd_level_above_the_servers_cap_is_served_at_the_cap() {
    let src = source();
    let server = TestServer::start_with(src.path(), &["--max-compression-level", "-1"]);
    let dst = tempfile::tempdir().unwrap();
    let m = dst.path().join("m");
    mirror(&server.addr, &m, &["--compression", "zstd:19"]);
    diff(src.path(), &m);
    assert_eq!(status(&m)["scheduler"]["compression"], "zstd:-1");
}

#[test]
fn flipped_bits_in_zstd_payloads_are_caught_and_fetched_again() {
    let src = tempfile::tempdir().unwrap();
    for i in 0..4 {
        write_rows(&src.path().join(format!("rows{i}.tsv")), 24 << 20, i);
    }
    let server = TestServer::start(src.path());
    let proxy = FaultProxy::start(&server.addr);
    proxy.set(Fault::FlipEvery(2 << 20));
    let dst = tempfile::tempdir().unwrap();
    let m = dst.path().join("m");
    mirror(&proxy.addr, &m, &["--compression", "zstd:1"]);
    diff(src.path(), &m);
    let s = status(&m);
    eprintln!(
        "figures: {} bits flipped over {} bytes: {}",
        proxy.flips(),
        proxy.bytes_down(),
        s["faults"]
    );
    assert!(proxy.flips() >= 5, "only {} flips", proxy.flips());
    // A flip in a zstd frame fails its decode or the checksum of what it decodes to; one
    // in a frame header closes the stream instead. Either way the chunk comes again.
    assert!(n(&s["faults"]["checksum_failures"]) >= 2, "{s}");
    assert_eq!(s["hash_mismatches"], 0, "{s}");
}

#[test]
fn cp_out_of_a_mount_with_compression_as_an_o_option() {
    require_fuse!();
    let src = source();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &["-o", "compression=zstd:-3"]);
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg("-r")
        .arg(format!("{}/.", mount.path().display()))
        .arg(dst.path()));
    diff(src.path(), dst.path());
    let s = status(&mount.path());
    assert_eq!(s["scheduler"]["compression"], "zstd:-3", "{s}");
    let text = run(ferry_tests::ferry().arg("status").arg(mount.path()));
    assert!(text.contains("compress zstd:-3, ratio"), "{text}");
}

#[test]
fn bad_compression_values_are_refused_with_one_line() {
    let out = ferry_tests::ferry()
        .args([
            "mirror",
            "127.0.0.1:1",
            "/nonexistent-ferry-dest",
            "--compression",
            "gzip",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"gzip\"") && err.contains("auto, none, lz4, zstd or zstd:LEVEL"),
        "{err}"
    );
    let out = Command::new(bin("ferryd"))
        .args(["--export", "/", "--max-compression-level", "23"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("give -7 to 22, or off"), "{err}");
}
