//! The read path through a real mount: byte-identical copies at awkward sizes, concurrent
//! readers, random preads.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::os::unix::fs::FileExt;
use std::process::Command;

use ferry_tests::{read_all, require_fuse, run, write_random, TestMount, TestServer};
use rand::{Rng, SeedableRng};

const CHUNK: usize = 1 << 20;

#[test]
fn cp_is_byte_identical_at_every_awkward_size() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let sizes = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17, 200 << 20];
    for (i, size) in sizes.iter().enumerate() {
        write_random(&src.path().join(format!("f{size}")), *size, i as u64);
    }
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &[]);
    for size in sizes {
        let name = format!("f{size}");
        run(Command::new("cp")
            .arg(mount.path().join(&name))
            .arg(dst.path().join(&name)));
        run(Command::new("cmp")
            .arg(src.path().join(&name))
            .arg(dst.path().join(&name)));
        assert_eq!(
            std::fs::metadata(dst.path().join(&name)).unwrap().len(),
            size as u64
        );
    }
}

#[test]
fn compressible_and_mixed_data_round_trip() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    // Highly compressible (lz4 on the wire) then incompressible halves in one file, so
    // chunks of both encodings are assembled into one stream.
    let mut data: Vec<u8> = (0..20 * CHUNK).map(|i| b"pgbench row  "[i % 13]).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut tail = vec![0u8; 5 * CHUNK + 333];
    rng.fill(&mut tail[..]);
    data.extend_from_slice(&tail);
    std::fs::write(src.path().join("mixed"), &data).unwrap();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &[]);
    assert!(
        read_all(&mount.path().join("mixed")) == data,
        "contents differ"
    );
    // Without compression the same bytes arrive.
    let plain = TestMount::mount(&server.addr, &["--no-compression", "--streams", "1"]);
    assert!(
        read_all(&plain.path().join("mixed")) == data,
        "contents differ without lz4"
    );
}

#[test]
fn eight_concurrent_readers_of_one_file() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("big"), 64 << 20, 42);
    let want = std::fs::read(src.path().join("big")).unwrap();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &[]);
    let path = mount.path().join("big");
    let results: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8).map(|_| s.spawn(|| read_all(&path))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, got) in results.iter().enumerate() {
        assert!(*got == want, "reader {i} got different bytes");
    }
}

#[test]
fn thousand_random_preads_match_the_source() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    let size = 24 * CHUNK + 4321;
    write_random(&src.path().join("r"), size, 3);
    let want = std::fs::read(src.path().join("r")).unwrap();
    let server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &[]);
    let f = std::fs::File::open(mount.path().join("r")).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    for i in 0..1000 {
        // Offsets anywhere, a few past the end; lengths from 1 byte to 3 chunks.
        let off = rng.random_range(0..size as u64 + 1000);
        let len = match i % 4 {
            0 => rng.random_range(1..64),
            1 => rng.random_range(1..16384),
            2 => rng.random_range(1..CHUNK),
            _ => rng.random_range(1..3 * CHUNK),
        };
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let n = f.read_at(&mut buf[got..], off + got as u64).unwrap();
            if n == 0 {
                break;
            }
            got += n;
        }
        let lo = (off as usize).min(size);
        let hi = (off as usize + len).min(size);
        assert_eq!(got, hi - lo, "read {i}: length at offset {off}");
        assert!(
            buf[..got] == want[lo..hi],
            "read {i}: bytes at offset {off} len {len}"
        );
    }
}
