//! Hostile input: the server closes the offending connection, logs why, and keeps serving
//! everyone else.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use ferry_tests::{read_all, require_fuse, write_random, TestMount, TestServer};

fn preamble() -> [u8; 8] {
    *b"FERRY\x01\x00\x00"
}

fn hello() -> Vec<u8> {
    hello_with(ferry_proto::features::LZ4)
}

/// Hello: this protocol version, `features`, chunk 1 MiB, client name "t".
fn hello_with(features: u64) -> Vec<u8> {
    hello_version(ferry_proto::PROTOCOL_VERSION, features)
}

/// Hello: protocol `version`, `features`, chunk 1 MiB, client name "t".
fn hello_version(version: u16, features: u64) -> Vec<u8> {
    hello_chunk(version, features, 1 << 20)
}

/// Hello: protocol `version`, `features`, chunks of `chunk` bytes, client name "t".
fn hello_chunk(version: u16, features: u64, chunk: u32) -> Vec<u8> {
    let mut body = vec![];
    body.extend_from_slice(&version.to_be_bytes());
    body.extend_from_slice(&features.to_be_bytes());
    body.extend_from_slice(&chunk.to_be_bytes());
    body.extend_from_slice(&1u16.to_be_bytes());
    body.push(b't');
    let mut f = vec![];
    f.extend_from_slice(&((body.len() + 5) as u32).to_be_bytes());
    f.push(0x01);
    f.extend_from_slice(&0u32.to_be_bytes());
    f.extend_from_slice(&body);
    f
}

/// Sends `bytes` and expects the server to close the connection within 5 s (after
/// possibly sending something first).
fn expect_closed(addr: &str, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The server may close while we are still writing: that is fine.
    let _ = s.write_all(bytes);
    let mut got = vec![];
    match s.read_to_end(&mut got) {
        Ok(_) => got,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => got,
        Err(e) => panic!("server did not close the connection: {e}"),
    }
}

#[test]
fn hostile_frames_close_only_their_connection() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("data"), 8 << 20, 1);
    let want = std::fs::read(src.path().join("data")).unwrap();
    let mut server = TestServer::start(src.path());
    let mount = TestMount::mount(&server.addr, &["--attr-timeout", "0"]);
    let path = mount.path().join("data");
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // A well-behaved client keeps reading the whole time.
        let reader = s.spawn(|| {
            let mut rounds = 0;
            while (!stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 2)
                && rounds < 10_000
            {
                // Drop the kernel's page cache for the file so reads go to the server.
                let f = std::fs::File::open(&path).unwrap();
                // SAFETY: posix_fadvise on an open descriptor.
                unsafe {
                    libc::posix_fadvise(
                        std::os::fd::AsRawFd::as_raw_fd(&f),
                        0,
                        0,
                        libc::POSIX_FADV_DONTNEED,
                    )
                };
                drop(f);
                assert!(read_all(&path) == want, "good client got wrong bytes");
                rounds += 1;
            }
            rounds
        });

        // If an assertion below fails, stop the reader so the scope can end and report it.
        struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let _stop_guard = StopOnDrop(&stop);
        // 1. Garbage instead of a preamble.
        expect_closed(&server.addr, &[0xde; 4096]);
        // 2. A TLS ClientHello at a plaintext server.
        expect_closed(
            &server.addr,
            &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03],
        );
        // 3. Valid preamble, then a handshake frame claiming 4 GiB.
        let mut b = preamble().to_vec();
        b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0, 0]);
        expect_closed(&server.addr, &b);
        // 4. Full handshake, then a request frame claiming 4 GiB.
        let mut b = preamble().to_vec();
        b.extend_from_slice(&hello());
        b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x13, 0, 0, 0, 1]);
        let reply = expect_closed(&server.addr, &b);
        assert!(
            reply.starts_with(b"FERRY"),
            "server answered the preamble first"
        );
        // 5. Full handshake, then a well-sized frame of an unknown kind.
        let mut b = preamble().to_vec();
        b.extend_from_slice(&hello());
        b.extend_from_slice(&[0, 0, 0, 5, 0x7e, 0, 0, 0, 1]);
        expect_closed(&server.addr, &b);
        // 6. A request with a truncated body (Read with no fields).
        let mut b = preamble().to_vec();
        b.extend_from_slice(&hello());
        b.extend_from_slice(&[0, 0, 0, 5, 0x13, 0, 0, 0, 1]);
        expect_closed(&server.addr, &b);
        // 7. A path escaping the export gets an error response, not a closed connection.
        let mut b = preamble().to_vec();
        b.extend_from_slice(&hello());
        let path = b"../../etc/passwd";
        let mut body = (path.len() as u16).to_be_bytes().to_vec();
        body.extend_from_slice(path);
        b.extend_from_slice(&((body.len() + 5) as u32).to_be_bytes());
        b.push(0x11);
        b.extend_from_slice(&7u32.to_be_bytes());
        b.extend_from_slice(&body);
        let mut s = TcpStream::connect(&server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&b).unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = vec![];
        // preamble (8) + welcome frame + error frame
        while got.len() < 8 + 9 + 2 {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed early");
            got.extend_from_slice(&buf[..n]);
        }
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(n) = s.read(&mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
        let pos = got
            .windows(5)
            .position(|w| w[4] == 0xff && w[0..4] != [0, 0, 0, 0]);
        assert!(pos.is_some(), "an Error frame came back: {got:02x?}");
        // 8. Many half-open connections do not stop service.
        let idle: Vec<_> = (0..50)
            .map(|_| TcpStream::connect(&server.addr).unwrap())
            .collect();

        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let rounds = reader.join().unwrap();
        assert!(rounds >= 2);
        drop(idle);
    });
    assert!(server.is_running(), "ferryd died");
    let log = server.log_text();
    assert!(
        log.contains("closed connection"),
        "reasons are logged: {log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    // A new client after all that.
    let again = TestMount::mount(&server.addr, &[]);
    assert!(read_all(&again.path().join("data")) == want);
}

#[test]
fn tls_request_to_a_plaintext_server_gets_a_clear_refusal() {
    let src = tempfile::tempdir().unwrap();
    let server = TestServer::start(src.path());
    let got = expect_closed(&server.addr, b"FERRY\x01\x01\x00");
    assert_eq!(got, b"FERRY\x01\xff\x02", "refusal: TLS unavailable");
}

/// A raw client past the handshake: the socket and bytes read past the Welcome.
fn handshaken(addr: &str) -> (TcpStream, bytes::BytesMut) {
    let (s, buf, _) = handshaken_with(addr, ferry_proto::features::LZ4);
    (s, buf)
}

/// [`handshaken`] offering `features`; also returns the session's features.
/// Sends `request` on `s` and asserts the server closes the connection without answering
/// it (a protocol error: a request the session has no feature for).
fn assert_closed_unanswered(s: &mut TcpStream, request: &ferry_proto::Request, what: &str) {
    use std::io::{Read, Write};
    let mut out = bytes::BytesMut::new();
    request.encode(1, &mut out);
    s.write_all(&out).unwrap();
    let mut rest = vec![];
    match s.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "{what}: answered: {rest:02x?}"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{what}"),
    }
}

fn handshaken_with(addr: &str, features: u64) -> (TcpStream, bytes::BytesMut, u64) {
    let (s, buf, welcome) = handshaken_chunk(addr, features, 1 << 20);
    (s, buf, welcome.features)
}

/// [`handshaken_with`] asking for chunks of `chunk` bytes; returns the Welcome.
fn handshaken_chunk(
    addr: &str,
    features: u64,
    chunk: u32,
) -> (TcpStream, bytes::BytesMut, ferry_proto::Welcome) {
    use ferry_proto::{Frame, Handshake};
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&preamble()).unwrap();
    s.write_all(&hello_chunk(ferry_proto::PROTOCOL_VERSION, features, chunk))
        .unwrap();
    let mut pre = [0u8; 8];
    s.read_exact(&mut pre).unwrap();
    let mut buf = bytes::BytesMut::new();
    let frame = loop {
        if let Some(f) = Frame::parse(&mut buf, 1 << 20).unwrap() {
            break f;
        }
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).unwrap();
        assert!(n > 0, "closed during the handshake");
        buf.extend_from_slice(&tmp[..n]);
    };
    let Handshake::Welcome(welcome) = Handshake::decode(frame).unwrap() else {
        panic!("no Welcome");
    };
    (s, buf, welcome)
}

#[test]
fn a_client_of_protocol_version_1_is_told_to_upgrade() {
    use ferry_proto::{Frame, Handshake};
    let src = tempfile::tempdir().unwrap();
    let server = TestServer::start(src.path());
    let mut bytes = preamble().to_vec();
    bytes.extend_from_slice(&hello_version(1, ferry_proto::features::LZ4));
    let got = expect_closed(&server.addr, &bytes);
    let mut buf = bytes::BytesMut::from(&got[8..]);
    let frame = Frame::parse(&mut buf, 1 << 20)
        .unwrap()
        .expect("a Failed frame");
    let Handshake::Failed { status, message } = Handshake::decode(frame).unwrap() else {
        panic!("no Failed message");
    };
    assert_eq!(status, ferry_proto::Status::Unsupported);
    assert!(message.contains("upgrade ferry"), "{message}");
}

#[test]
fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let src = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(src.path(), &["--idle-timeout", "1"]);
    let (mut s, _) = handshaken(&server.addr);
    let t = std::time::Instant::now();
    let mut rest = vec![];
    s.read_to_end(&mut rest).unwrap();
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

#[test]
fn sigterm_drains_the_replies_of_requests_in_flight() {
    assert_eq!(
        replies_after_sigterm(&[]),
        16,
        "every request in flight was answered before the close"
    );
}

#[test]
fn sigterm_answers_the_requests_read_but_not_yet_taken_up() {
    // Four requests at a time per connection: when the first reply starts, four are taken
    // up and the other twelve wait, read, for a place. Told to stop then, ferryd reads its
    // socket no more, but answers every request it had read (before: it took up none of
    // the twelve, and the client had to send them again elsewhere).
    assert_eq!(
        replies_after_sigterm(&["--max-inflight", "4"]),
        16,
        "every request read before the stop was answered before the close"
    );
}

/// Sixteen 1 MiB reads sent at once on one connection to a ferryd started with `args`, a
/// SIGTERM once the first reply starts; returns how many replies came (each checked)
/// before the server closed the connection, and checks that it exits.
fn replies_after_sigterm(args: &[&str]) -> usize {
    use ferry_proto::{Frame, Request, Response};
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f"), 16 << 20, 9);
    let want = std::fs::read(src.path().join("f")).unwrap();
    let mut server = TestServer::start_with(src.path(), args);
    let (mut s, mut buf) = handshaken(&server.addr);
    let mut out = bytes::BytesMut::new();
    for i in 0..16u32 {
        Request::Read {
            path: bytes::Bytes::from_static(b"f"),
            offset: u64::from(i) << 20,
            len: 1 << 20,
            compression: ferry_proto::Compression::None,
            class: ferry_proto::Class::Demand,
        }
        .encode(i + 1, &mut out);
    }
    s.write_all(&out).unwrap();
    // Once the first reply starts, the server has read all sixteen requests (they arrived
    // together, in one segment); then it is told to stop.
    let mut tmp = vec![0u8; 256 << 10];
    while buf.is_empty() {
        let n = s.read(&mut tmp).unwrap();
        assert!(n > 0);
        buf.extend_from_slice(&tmp[..n]);
    }
    // SAFETY: kill on the pid of a child we spawned.
    unsafe { libc::kill(server.pid() as i32, libc::SIGTERM) };
    let mut replies = 0;
    loop {
        while let Some(frame) = Frame::parse(&mut buf, 2 << 20).unwrap() {
            let id = frame.request_id;
            match Response::decode(frame).unwrap() {
                Response::Read(r) => {
                    let off = ((id - 1) as usize) << 20;
                    assert!(r.data[..] == want[off..off + (1 << 20)], "reply {id}");
                    replies += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let n = s.read(&mut tmp).unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    assert!(ferry_tests::wait_for(Duration::from_secs(15), || !server.is_running()));
    replies
}

/// Sends one request on a handshaken raw connection and returns its response.
fn ask(
    s: &mut TcpStream,
    buf: &mut bytes::BytesMut,
    id: u32,
    req: &ferry_proto::Request,
) -> ferry_proto::Response {
    ask_within(s, buf, id, req, 2 << 20)
}

/// [`ask`], failing on a response frame longer than `max_frame`.
fn ask_within(
    s: &mut TcpStream,
    buf: &mut bytes::BytesMut,
    id: u32,
    req: &ferry_proto::Request,
    max_frame: u32,
) -> ferry_proto::Response {
    use ferry_proto::{Frame, Response};
    let mut out = bytes::BytesMut::new();
    req.encode(id, &mut out);
    s.write_all(&out).unwrap();
    let mut tmp = vec![0u8; 64 << 10];
    loop {
        if let Some(frame) = Frame::parse(buf, max_frame).unwrap() {
            assert_eq!(frame.request_id, id);
            return Response::decode(frame).unwrap();
        }
        let n = s.read(&mut tmp).unwrap();
        assert!(n > 0, "the server closed the connection on {req:?}");
        buf.extend_from_slice(&tmp[..n]);
    }
}

#[test]
fn traversal_attempts_are_refused_and_nothing_outside_the_export_is_read() {
    use bytes::Bytes;
    use ferry_proto::{Request, Response, Status};
    let outside = tempfile::tempdir().unwrap();
    let secret = b"SECRET-OUTSIDE-THE-EXPORT-0123456789";
    std::fs::write(outside.path().join("secret"), secret).unwrap();
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("a")).unwrap();
    std::fs::write(src.path().join("a/inside"), b"inside").unwrap();
    std::os::unix::fs::symlink("/", src.path().join("rootlink")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), src.path().join("a/out")).unwrap();
    std::os::unix::fs::symlink("../..", src.path().join("a/up")).unwrap();
    let server = TestServer::start(src.path());
    // Hash needs its feature in the session (without it the request closes the connection).
    let (mut s, mut buf, _) = handshaken_with(
        &server.addr,
        ferry_proto::features::LZ4 | ferry_proto::features::HASH,
    );
    let long_name = "x".repeat(4096);
    let long_path = vec!["d"; 2100].join("/");
    let secret_path = outside.path().join("secret");
    let attempts: Vec<(&str, Bytes)> = vec![
        ("..", Bytes::from_static(b"..")),
        ("/etc/passwd", Bytes::from_static(b"/etc/passwd")),
        ("a/../../x", Bytes::from_static(b"a/../../x")),
        (
            "absolute path of the secret",
            Bytes::from(secret_path.to_str().unwrap().to_string()),
        ),
        ("./a/inside", Bytes::from_static(b"./a/inside")),
        ("a//inside", Bytes::from_static(b"a//inside")),
        ("NUL byte", Bytes::from_static(b"a/ins\0ide")),
        ("4096-byte name", Bytes::from(long_name)),
        ("path over 4096 bytes", Bytes::from(long_path)),
        (
            "through a symlink to /",
            Bytes::from_static(b"rootlink/etc/passwd"),
        ),
        (
            "through a symlink to ../..",
            Bytes::from_static(b"a/up/etc/passwd"),
        ),
        ("a symlink to a file outside", Bytes::from_static(b"a/out")),
        ("a symlink to /", Bytes::from_static(b"rootlink")),
    ];
    let mut id = 1;
    for (what, path) in &attempts {
        for req in [
            Request::Read {
                path: path.clone(),
                offset: 0,
                len: 4096,
                compression: ferry_proto::Compression::None,
                class: ferry_proto::Class::Demand,
            },
            Request::Hash { path: path.clone() },
            Request::ReadDir {
                path: path.clone(),
                cookie: 0,
                max_entries: 100,
            },
        ] {
            let r = ask(&mut s, &mut buf, id, &req);
            id += 1;
            match r {
                Response::Error { status, .. } => assert!(
                    matches!(
                        status,
                        Status::InvalidName
                            | Status::NameTooLong
                            | Status::SymlinkInPath
                            | Status::InvalidArgument
                            | Status::NotFound
                            | Status::NotDirectory
                    ),
                    "{what}: {req:?} got {status:?}"
                ),
                other => panic!("{what}: {req:?} was answered: {other:?}"),
            }
        }
    }
    // Symlinks are described, never followed: Stat of a link to / is the link itself.
    match ask(
        &mut s,
        &mut buf,
        id,
        &Request::Stat {
            path: Bytes::from_static(b"rootlink"),
        },
    ) {
        Response::Attr(a) => assert_eq!(a.kind, ferry_proto::FileKind::Symlink),
        other => panic!("{other:?}"),
    }
    id += 1;

    // A file swapped for a symlink to the secret, again and again, while it is read: every
    // answer is the file's own bytes or an error, never the secret.
    let victim = src.path().join("a/swap");
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let tmp_file = src.path().join("a/.swap-file");
            let tmp_link = src.path().join("a/.swap-link");
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::write(&tmp_file, b"harmless bytes").unwrap();
                std::fs::rename(&tmp_file, &victim).unwrap();
                let _ = std::fs::remove_file(&tmp_link);
                std::os::unix::fs::symlink(&secret_path, &tmp_link).unwrap();
                std::fs::rename(&tmp_link, &victim).unwrap();
            }
        });
        let mut answered = 0;
        for _ in 0..2000 {
            let r = ask(
                &mut s,
                &mut buf,
                id,
                &Request::Read {
                    path: Bytes::from_static(b"a/swap"),
                    offset: 0,
                    len: 4096,
                    compression: ferry_proto::Compression::None,
                    class: ferry_proto::Class::Demand,
                },
            );
            id += 1;
            if let Response::Read(d) = r {
                assert!(
                    d.data[..] != secret[..],
                    "the secret was read through a swapped symlink"
                );
                assert_eq!(&d.data[..], b"harmless bytes");
                answered += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(answered > 0, "the regular file was never read");
    });
    // The connection is still good for honest requests.
    match ask(
        &mut s,
        &mut buf,
        id,
        &Request::Read {
            path: Bytes::from_static(b"a/inside"),
            offset: 0,
            len: 100,
            compression: ferry_proto::Compression::None,
            class: ferry_proto::Class::Demand,
        },
    ) {
        Response::Read(d) => assert_eq!(&d.data[..], b"inside"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_read_with_a_class_in_a_session_without_priority_closes_the_connection() {
    use ferry_proto::{features, Class, Request};
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f"), 64 << 10, 3);
    let server = TestServer::start(src.path());
    for class in [Class::Prediction, Class::Background] {
        let (mut s, _, session) = handshaken_with(&server.addr, features::LZ4);
        assert_eq!(
            session & features::PRIORITY,
            0,
            "not offered, not negotiated"
        );
        let read = Request::Read {
            path: bytes::Bytes::from_static(b"f"),
            offset: 0,
            len: 4096,
            compression: ferry_proto::Compression::None,
            class,
        };
        assert_closed_unanswered(&mut s, &read, &class.to_string());
    }
    assert!(
        ferry_tests::wait_for(Duration::from_secs(5), || server
            .log_text()
            .contains("needs the PRIORITY feature")),
        "the reason is logged: {}",
        server.log_text()
    );
    // Demand (no class bits) is what an older client sends: still served.
    let (mut s, mut buf) = handshaken(&server.addr);
    let req = Request::Read {
        path: bytes::Bytes::from_static(b"f"),
        offset: 0,
        len: 4096,
        compression: ferry_proto::Compression::None,
        class: Class::Demand,
    };
    let want = std::fs::read(src.path().join("f")).unwrap();
    match ask(&mut s, &mut buf, 1, &req) {
        ferry_proto::Response::Read(d) => assert!(d.data[..] == want[..4096]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn zstd_and_load_without_the_zstd_feature_close_the_connection_and_a_pre_zstd_client_is_served() {
    use ferry_proto::{features, Class, Compression, Encoding, Request, Response};
    let src = tempfile::tempdir().unwrap();
    let rows: Vec<u8> = b"17\tdelta\t2026-11-24\n"
        .iter()
        .copied()
        .cycle()
        .take(256 << 10)
        .collect();
    std::fs::write(src.path().join("f"), &rows).unwrap();
    let server = TestServer::start(src.path());
    let read = |compression| Request::Read {
        path: bytes::Bytes::from_static(b"f"),
        offset: 0,
        len: 256 << 10,
        compression,
        class: Class::Demand,
    };
    // A client from before zstd (LZ4 only): a zstd read or a Load is a protocol error.
    for req in [read(Compression::Zstd(1)), Request::Load] {
        let (mut s, _, session) = handshaken_with(&server.addr, features::LZ4);
        assert_eq!(session & features::ZSTD, 0, "not offered, not negotiated");
        assert_closed_unanswered(&mut s, &req, "a zstd read or Load without ZSTD");
    }
    // It still gets lz4 when it asks for it.
    let (mut s, mut buf, _) = handshaken_with(&server.addr, features::LZ4);
    match ask(&mut s, &mut buf, 1, &read(Compression::Lz4)) {
        Response::Read(d) => assert_eq!(d.encoding, Encoding::Lz4),
        other => panic!("{other:?}"),
    }
    // With the feature: zstd, decoded to the file's bytes, and the server's load.
    let (mut s, mut buf, session) = handshaken_with(&server.addr, features::ALL);
    assert_ne!(session & features::ZSTD, 0);
    match ask(&mut s, &mut buf, 1, &read(Compression::Zstd(3))) {
        Response::Read(d) => {
            assert_eq!(d.encoding, Encoding::Zstd);
            assert!(d.data.len() * 20 < rows.len(), "{} bytes", d.data.len());
            // BOUND came with ALL: the checksum is XORed with what binds it to request 1.
            assert_ne!(session & features::BOUND, 0);
            let unbound =
                ferry_proto::payload::decode(d.encoding, d.decoded_len, d.checksum, d.data.clone());
            assert!(unbound.is_err(), "the checksum is not the plain one");
            let bound = d.checksum ^ d.binding(1, b"f", 0, 256 << 10);
            let got =
                ferry_proto::payload::decode(d.encoding, d.decoded_len, bound, d.data).unwrap();
            assert!(got[..] == rows[..]);
        }
        other => panic!("{other:?}"),
    }
    match ask(&mut s, &mut buf, 2, &Request::Load) {
        Response::Load(l) => assert!(l.cores >= 1 && l.boot_id != [0; 16], "{l:?}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn load_says_how_long_a_clients_connections_were_held_back_by_the_network() {
    use ferry_proto::{features, Class, Compression, Request, Response};
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f"), 16 << 20, 7);
    let server = TestServer::start(src.path());
    let link =
        |s: &mut TcpStream, buf: &mut bytes::BytesMut, id| match ask(s, buf, id, &Request::Load) {
            Response::Load(l) => l.link,
            other => panic!("{other:?}"),
        };
    // Without LINK_LIMITS, Load is the 26 bytes it always was.
    let (mut old, mut old_buf, session) =
        handshaken_with(&server.addr, features::ALL & !features::LINK_LIMITS);
    assert_eq!(session & features::LINK_LIMITS, 0);
    assert_eq!(link(&mut old, &mut old_buf, 1), None);
    drop(old);
    // Two connections of one client (one address, one Hello name): one asks, the other
    // asks for 16 MiB and reads none of it for 1.5 s, then all of it: the server had
    // bytes to send and the network (a full socket) held them back.
    let (mut asks, mut buf, session) = handshaken_with(&server.addr, features::ALL);
    assert_ne!(session & features::LINK_LIMITS, 0);
    let before = link(&mut asks, &mut buf, 1).expect("negotiated: reported");
    let mut stuck = pipeline(&server.addr, 16, |i| Request::Read {
        path: bytes::Bytes::from_static(b"f"),
        offset: u64::from(i) << 20,
        len: 1 << 20,
        compression: Compression::None,
        class: Class::Demand,
    });
    std::thread::sleep(Duration::from_millis(1500));
    let mut sink = vec![0u8; 1 << 20];
    let mut got = 0usize;
    while got < 16 << 20 {
        let n = stuck.read(&mut sink).unwrap();
        assert!(n > 0, "closed after {got} bytes");
        got += n;
    }
    // The server looks at each connection every quarter second.
    std::thread::sleep(Duration::from_millis(600));
    let after = link(&mut asks, &mut buf, 2).expect("reported");
    let sending = Duration::from_micros(after.sending_micros - before.sending_micros);
    let limited = Duration::from_micros(after.limited_micros - before.limited_micros);
    assert!(
        limited >= Duration::from_millis(1000),
        "held back {limited:?} of {sending:?} by a socket nobody read"
    );
    assert!(
        sending >= limited && sending < Duration::from_secs(30),
        "{limited:?} of {sending:?}"
    );
}

#[test]
fn with_priority_every_class_is_accepted_and_answered_with_the_right_bytes() {
    use ferry_proto::{features, payload, Class, Frame, Request, Response};
    use std::collections::HashMap;
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f"), 12 << 20, 5);
    let want = std::fs::read(src.path().join("f")).unwrap();
    let server = TestServer::start(src.path());
    let (mut s, mut buf, session) =
        handshaken_with(&server.addr, features::LZ4 | features::PRIORITY);
    assert_ne!(session & features::PRIORITY, 0, "PRIORITY negotiated");
    // One pipelined burst mixing every class and size: background 1 MiB reads first (more
    // than the per-connection background limit), then prediction and demand reads, a Ping
    // and a Stat; some may be lz4-compressed.
    let mut asked: HashMap<u32, Option<(u64, u32)>> = HashMap::new();
    let mut out = bytes::BytesMut::new();
    let mut id = 0u32;
    let mut read = |class: Class, offset: u64, len: u32, out: &mut bytes::BytesMut| {
        id += 1;
        assert!(id < 1000);
        Request::Read {
            path: bytes::Bytes::from_static(b"f"),
            offset,
            len,
            compression: if id.is_multiple_of(2) {
                ferry_proto::Compression::Lz4
            } else {
                ferry_proto::Compression::None
            },
            class,
        }
        .encode(id, out);
        asked.insert(id, Some((offset, len)));
    };
    for i in 0..8u64 {
        read(Class::Background, i << 20, 1 << 20, &mut out);
    }
    for i in 0..4u64 {
        read(Class::Prediction, (8 + i) << 20, 1 << 20, &mut out);
    }
    for i in 0..16u64 {
        read(Class::Demand, i * 700_001, 4096 + i as u32 * 1000, &mut out);
    }
    // A read past the end comes back short, whatever its class.
    read(Class::Background, (12 << 20) - 100, 4096, &mut out);
    let (ping, stat) = (1000, 1001);
    Request::Ping.encode(ping, &mut out);
    asked.insert(ping, None);
    Request::Stat {
        path: bytes::Bytes::from_static(b"f"),
    }
    .encode(stat, &mut out);
    asked.insert(stat, None);
    s.write_all(&out).unwrap();
    let mut tmp = vec![0u8; 256 << 10];
    loop {
        while let Some(frame) = Frame::parse(&mut buf, 2 << 20).unwrap() {
            let id = frame.request_id;
            let Some(what) = asked.remove(&id) else {
                panic!("response to id {id}, which is not outstanding");
            };
            match (what, Response::decode(frame).unwrap()) {
                (Some((offset, len)), Response::Read(r)) => {
                    let data =
                        payload::decode(r.encoding, r.decoded_len, r.checksum, r.data).unwrap();
                    let start = offset as usize;
                    let end = (start + len as usize).min(want.len());
                    assert!(data[..] == want[start..end], "read {id} at {offset}+{len}");
                }
                (None, Response::Pong) => assert_eq!(id, ping),
                (None, Response::Attr(a)) => {
                    assert_eq!(id, stat);
                    assert_eq!(a.size, 12 << 20);
                }
                (_, other) => panic!("request {id} got {other:?}"),
            }
        }
        if asked.is_empty() {
            break;
        }
        let n = s.read(&mut tmp).unwrap();
        assert!(n > 0, "closed with {} requests unanswered", asked.len());
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// ferryd's resident memory, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb << 10
}

/// Asserts that ferryd's resident memory is under `mib` MiB.
fn assert_rss_under(server: &TestServer, mib: u64) {
    let mem = rss(server.pid());
    assert!(mem < mib << 20, "ferryd holds {} MiB", mem >> 20);
}

/// A demand Read of the `i`th MiB of the export's file `big`, uncompressed.
fn mib_of_big(i: u32) -> ferry_proto::Request {
    ferry_proto::Request::Read {
        path: bytes::Bytes::from_static(b"big"),
        offset: u64::from(i) << 20,
        len: 1 << 20,
        compression: ferry_proto::Compression::None,
        class: ferry_proto::Class::Demand,
    }
}

/// An export whose directory `d` holds 3,000 files with 206-byte names: a page of its
/// listing ([`first_page_of_d`]) is about 1 MiB.
fn long_listing() -> tempfile::TempDir {
    export_with_files(3000, |i| format!("{i:05}-{}", "n".repeat(200))).0
}

/// The first page of `d`'s listing, as many entries as the server gives.
fn first_page_of_d() -> ferry_proto::Request {
    ferry_proto::Request::ReadDir {
        path: bytes::Bytes::from_static(b"d"),
        cookie: 0,
        max_entries: 4096,
    }
}

/// Connections `server` has closed for not reading their responses (from its log).
fn stalled_closes(server: &TestServer) -> usize {
    server
        .log_text()
        .matches("stopped reading its responses")
        .count()
}

/// Pipelines `n` requests made by `req(i)` on a handshaken raw connection, reading nothing.
fn pipeline(addr: &str, n: u32, req: impl Fn(u32) -> ferry_proto::Request) -> TcpStream {
    let (mut s, _) = handshaken(addr);
    let mut out = bytes::BytesMut::new();
    for i in 0..n {
        req(i).encode(i + 1, &mut out);
    }
    s.write_all(&out).unwrap();
    s
}

/// `ferry mirror` of `server`'s export, given at most `secs` seconds (`timeout`), succeeds
/// and its copy of `file` is the export's.
fn mirrors_within(secs: u32, server: &TestServer, export: &std::path::Path, file: &str) {
    let dst = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("timeout")
        .arg(secs.to_string())
        .arg(ferry_tests::bin("ferry"))
        .env("FERRY_STATE_DIR", ferry_tests::state_base())
        .args(["mirror", &server.addr])
        .arg(dst.path())
        .arg("--quiet")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log_text()
    );
    assert_eq!(
        read_all(&dst.path().join(file)),
        read_all(&export.join(file))
    );
}

#[test]
fn connections_that_never_read_their_responses_hold_their_share_only_and_are_closed() {
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("big"), 64 << 20, 1);
    write_random(&src.path().join("honest.bin"), 48 << 20, 2);
    // Twice the old freeze (60 s write timeout) would be needed if the stuck connections
    // could hold the whole budget.
    let server = TestServer::start_with(src.path(), &["--memory-budget", "32"]);
    let read = |i: u32| mib_of_big(i % 64);
    let stuck: Vec<TcpStream> = (0..4).map(|_| pipeline(&server.addr, 64, read)).collect();
    std::thread::sleep(Duration::from_millis(500));
    // An honest client copies its file meanwhile, in well under the old freeze. The stuck
    // connections sit on their shares of a budget in demand: closed (after 2 s over their
    // share, 5 s within it), well before the 60 s write timeout. A connection is closed
    // only while others need the budget (once the demand ends, holding its share is
    // harmless): honest copies go on until all four are, within a bound.
    let closed = || stalled_closes(&server);
    let started = std::time::Instant::now();
    loop {
        mirrors_within(40, &server, src.path(), "honest.bin");
        if closed() >= 4 || started.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    assert_eq!(closed(), 4, "{}", server.log_text());
    assert_rss_under(&server, 200);
    // Closed: reading each of them ends (after what the server had sent).
    for (i, mut s) in stuck.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut sink = vec![];
        let ended = match s.read_to_end(&mut sink) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(
            ended,
            "stuck connection {i} still open after {} bytes",
            sink.len()
        );
    }
}

#[test]
fn pipelined_directory_pages_count_against_the_memory_budget() {
    let src = long_listing();
    write_random(&src.path().join("f"), 3 << 20, 13);
    let server = TestServer::start_with(src.path(), &["--memory-budget", "32"]);
    let list = |_| first_page_of_d();
    // 20 connections × 64 pages of ~1 MiB, none read: over a GiB if pages were not counted.
    let _hogs: Vec<TcpStream> = (0..20).map(|_| pipeline(&server.addr, 64, list)).collect();
    std::thread::sleep(Duration::from_secs(3));
    assert_rss_under(&server, 250);
    // Everyone else is still served.
    let (mut s, mut buf) = handshaken(&server.addr);
    let r = ask(
        &mut s,
        &mut buf,
        1,
        &ferry_proto::Request::Stat {
            path: bytes::Bytes::from_static(b"d"),
        },
    );
    assert!(matches!(r, ferry_proto::Response::Attr(_)), "{r:?}");
    // And an honest mirror of the whole export (the 3,000 names too) completes.
    mirrors_within(60, &server, src.path(), "f");
}

/// CPU time (user and system) `pid` has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces), from the state on.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

#[test]
fn connections_that_never_took_a_byte_go_sooner_than_the_grace_of_those_that_read() {
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("big"), 16 << 20, 3);
    let server = TestServer::start_with(src.path(), &["--memory-budget", "8"]);
    let read = |i: u32| mib_of_big(i % 16);
    // Eight connections with their receive windows shut at once (as
    // bench/hostile_client.py's) ask for 16 MiB each and take nothing: each that gets a
    // response holds more than its share while the others wait.
    let stuck: Vec<TcpStream> = (0..8)
        .map(|_| {
            let (mut s, _) = handshaken(&server.addr);
            let small: libc::c_int = 4096;
            // SAFETY: a valid socket and an int option of the size given.
            let rc = unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&s),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&small as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0);
            let mut out = bytes::BytesMut::new();
            for i in 0..16 {
                read(i).encode(i + 1, &mut out);
            }
            s.write_all(&out).unwrap();
            s
        })
        .collect();
    let closed = || stalled_closes(&server);
    // The first goes well within the 2 s a client that has been reading is given.
    let first = ferry_tests::wait_for(Duration::from_millis(1500), || closed() >= 1);
    assert!(first, "none closed yet: {}", server.log_text());
    // And in turn all of them.
    let all = ferry_tests::wait_for(Duration::from_secs(20), || closed() == 8);
    assert!(all, "{} of 8 closed: {}", closed(), server.log_text());
    drop(stuck);
}

#[test]
fn requests_of_a_connection_that_has_gone_are_not_computed_for_no_one() {
    let src = long_listing();
    let server = TestServer::start_with(src.path(), &["--memory-budget", "8"]);
    let list = |_| first_page_of_d();
    // 40 connections pipeline 64 pages of 3,000 entries each (2,560 pages, about a minute
    // of this machine's CPU), then go.
    for _ in 0..40 {
        let s = pipeline(&server.addr, 64, list);
        s.shutdown(std::net::Shutdown::Both).unwrap();
    }
    // Each connection ends at its first write to the closed socket, and the pages it had
    // asked for go with it: the server falls idle.
    let idle = ferry_tests::wait_for(Duration::from_secs(10), || {
        let before = cpu_time(server.pid());
        std::thread::sleep(Duration::from_secs(1));
        cpu_time(server.pid()) - before < Duration::from_millis(100)
    });
    assert!(
        idle,
        "ferryd is still busy with the requests of connections that have gone"
    );
    // And serves the next client.
    let (mut s, mut buf) = handshaken(&server.addr);
    let r = ask(&mut s, &mut buf, 1, &list(0));
    assert!(matches!(r, ferry_proto::Response::DirPage(_)), "{r:?}");
}

#[test]
fn a_request_frame_longer_than_any_legal_request_closes_the_connection_at_once() {
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f"), 3 << 20, 9);
    let server = TestServer::start(src.path());
    // A Read frame announcing 1 MiB (within the negotiated frame limit, which bounds
    // responses), then all of it but its last byte.
    let mut f = vec![];
    f.extend_from_slice(&(1u32 << 20).to_be_bytes());
    f.push(0x13);
    f.extend_from_slice(&7u32.to_be_bytes());
    f.resize(4 + (1 << 20) - 1, 0);
    let closed = |s: &mut TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = vec![];
        match s.read_to_end(&mut rest) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    };
    let (mut s, _) = handshaken(&server.addr);
    let _ = s.write_all(&f);
    assert!(
        closed(&mut s),
        "the connection stays open, buffering the frame"
    );
    assert!(
        ferry_tests::wait_for(Duration::from_secs(5), || server
            .log_text()
            .contains("exceeds the maximum")),
        "{}",
        server.log_text()
    );
    // 300 connections at once doing the same (buffered up to the frame limit, they held
    // 416 MiB): each is closed, ferryd stays small, an honest client is served meanwhile.
    let mut held: Vec<TcpStream> = (0..300)
        .map(|_| {
            let (mut s, _) = handshaken(&server.addr);
            let _ = s.write_all(&f);
            s
        })
        .collect();
    assert_rss_under(&server, 200);
    mirrors_within(30, &server, src.path(), "f");
    assert!(held.iter_mut().all(closed), "a connection stays open");
}

#[test]
fn silent_sockets_from_one_address_do_not_lock_honest_clients_out() {
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f"), 3 << 20, 5);
    let server = TestServer::start_with(src.path(), &["--max-connections", "64"]);
    // 200 sockets from 127.0.0.2 that never say anything, reopened as the server drops
    // them, for as long as the honest client runs.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr: std::net::SocketAddr = server.addr.parse().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            rt.block_on(async move {
                let mut held = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    held.retain(|s: &tokio::net::TcpStream| {
                        let mut b = [0u8; 1];
                        !matches!(s.try_read(&mut b), Ok(0))
                    });
                    while held.len() < 200 {
                        let sock = tokio::net::TcpSocket::new_v4().unwrap();
                        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
                        match sock.connect(addr).await {
                            Ok(s) => held.push(s),
                            Err(_) => break,
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let mirrored = std::panic::catch_unwind(|| {
        mirrors_within(30, &server, src.path(), "f");
        // The 200 pre-authentication sockets cost ferryd next to nothing.
        assert_rss_under(&server, 200);
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flood.join().unwrap();
    if let Err(e) = mirrored {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn a_client_name_with_control_characters_is_logged_escaped() {
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f"), 1 << 20, 11);
    let server = TestServer::start_with(src.path(), &["-v"]);
    let name = b"evil\n2026-11-24T00:00:00Z  WARN forged line\x1b]0;owned\x07\x1b[31m";
    let mut body = vec![];
    body.extend_from_slice(&ferry_proto::PROTOCOL_VERSION.to_be_bytes());
    body.extend_from_slice(&ferry_proto::features::LZ4.to_be_bytes());
    body.extend_from_slice(&(1u32 << 20).to_be_bytes());
    body.extend_from_slice(&(name.len() as u16).to_be_bytes());
    body.extend_from_slice(name);
    let mut bytes = preamble().to_vec();
    bytes.extend_from_slice(&((body.len() + 5) as u32).to_be_bytes());
    bytes.push(0x01);
    bytes.extend_from_slice(&0u32.to_be_bytes());
    bytes.extend_from_slice(&body);
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.write_all(&bytes).unwrap();
    let mut pre = [0u8; 8];
    s.read_exact(&mut pre).unwrap();
    assert!(
        ferry_tests::wait_for(Duration::from_secs(5), || server
            .log_text()
            .contains("evil")),
        "{}",
        server.log_text()
    );
    let log = server.log_text();
    assert!(log.contains(r"evil\n2026"), "{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN forged") && !l.contains("evil")),
        "{log}"
    );
    assert!(!log.contains('\x1b') && !log.contains('\x07'), "{log:?}");
    // The server goes on serving: an honest client's copy is the file, ferryd stays small.
    mirrors_within(30, &server, src.path(), "f");
    assert_rss_under(&server, 200);
}

#[test]
fn dir_xattrs_pages_need_their_feature_and_a_forged_cookie_is_answered() {
    use ferry_proto::{features, Request, Response};
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("d")).unwrap();
    std::fs::write(src.path().join("d/f"), b"x").unwrap();
    let server = TestServer::start(src.path());
    let page = |cookie| Request::DirXattrsPage {
        path: bytes::Bytes::from_static(b"d"),
        cookie,
    };
    // A client from before pages (XATTRS only): a page request is a protocol error.
    let (mut s, _, session) = handshaken_with(&server.addr, features::LZ4 | features::XATTRS);
    assert_eq!(
        session & features::XATTRS_PAGED,
        0,
        "not offered, not negotiated"
    );
    assert_closed_unanswered(&mut s, &page(0), "DirXattrsPage without XATTRS_PAGED");
    // With it: the first page ends the directory; a cookie the server never gave gets a
    // page or an error, and the connection goes on serving.
    let (mut s, mut buf, session) = handshaken_with(&server.addr, features::ALL);
    assert_ne!(session & features::XATTRS_PAGED, 0);
    match ask(&mut s, &mut buf, 1, &page(0)) {
        Response::DirXattrsPage { next, .. } => assert_eq!(next, 0),
        other => panic!("{other:?}"),
    }
    match ask(&mut s, &mut buf, 2, &page(0x7fff_ffff_ffff)) {
        Response::DirXattrsPage { .. } | Response::Error { .. } => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ask(&mut s, &mut buf, 3, &Request::Ping),
        Response::Pong
    ));
}

#[test]
fn a_directory_s_extended_attributes_never_exceed_the_session_s_frame() {
    use ferry_proto::{features, Request, Response, Status};
    // 40 files with 3000 bytes of attributes each: 120 KB in all, far under the protocol's
    // 1 MiB, but over the 8 KiB frames of a session with 4 KiB chunks.
    let (src, dir) = export_with_files(40, |i| format!("f{i:02}"));
    for i in 0..40 {
        let f = dir.join(format!("f{i:02}"));
        let path = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
        let value = vec![b'v'; 3000];
        // SAFETY: both strings are NUL-terminated and `value` is as long as said.
        let rc = unsafe {
            libc::setxattr(
                path.as_ptr(),
                c"user.big".as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
    }
    let server = TestServer::start(src.path());
    let (mut s, mut buf, welcome) = handshaken_chunk(&server.addr, features::ALL, 4096);
    assert!(welcome.max_frame < 120_000, "{}", welcome.max_frame);
    // Each response's frame within the session's limit (ask_within fails otherwise).
    let mut ask = |id, req: &Request| ask_within(&mut s, &mut buf, id, req, welcome.max_frame);
    let d = || bytes::Bytes::from_static(b"d");
    match ask(1, &Request::DirXattrs { path: d() }) {
        Response::Error { status, .. } => assert_eq!(status, Status::TooLarge),
        other => panic!("{other:?}"),
    }
    // In pages, every file's attributes come.
    let (mut cookie, mut files, mut id) = (0, 0, 2);
    loop {
        let Response::DirXattrsPage { entries, next } =
            ask(id, &Request::DirXattrsPage { path: d(), cookie })
        else {
            panic!("not a page");
        };
        files += entries.len();
        if next == 0 {
            break;
        }
        (cookie, id) = (next, id + 1);
    }
    assert_eq!(files, 40);
    assert!(id > 2, "one page held it all");
}

/// An export holding directory `d` with `n` empty files named by `name`: the export and
/// the directory's path.
fn export_with_files(
    n: usize,
    name: impl Fn(usize) -> String,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let src = tempfile::tempdir().unwrap();
    let d = src.path().join("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..n {
        std::fs::write(d.join(name(i)), b"").unwrap();
    }
    (src, d)
}
