//! Property tests: every message round-trips through its encoding, and decoding arbitrary
//! bytes returns an error (or a message) but never panics or over-allocates.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use bytes::{BufMut, Bytes, BytesMut};
use ferry_proto::*;
use proptest::prelude::*;

const ENCODINGS: [Encoding; 3] = [Encoding::Raw, Encoding::Lz4, Encoding::Zstd];

fn compression() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::None),
        Just(Compression::Lz4),
        (ZSTD_MIN_LEVEL..=ZSTD_MAX_LEVEL).prop_map(Compression::Zstd),
    ]
}

fn bytes16() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..300).prop_map(Bytes::from)
}

fn timestamp() -> impl Strategy<Value = Timestamp> {
    (any::<i64>(), 0u32..1_000_000_000).prop_map(|(sec, nsec)| Timestamp { sec, nsec })
}

fn kind() -> impl Strategy<Value = FileKind> {
    prop_oneof![
        Just(FileKind::File),
        Just(FileKind::Directory),
        Just(FileKind::Symlink),
        Just(FileKind::Fifo),
        Just(FileKind::CharDevice),
        Just(FileKind::BlockDevice),
        Just(FileKind::Socket),
    ]
}

fn attr() -> impl Strategy<Value = Attr> {
    (
        (
            any::<u64>(),
            kind(),
            0u16..=0o7777,
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
        ),
        (any::<u64>(), any::<u64>(), any::<u64>()),
        (timestamp(), timestamp(), timestamp(), timestamp()),
    )
        .prop_map(
            |(
                (ino, kind, perm, nlink, uid, gid),
                (rdev, size, blocks),
                (atime, mtime, ctime, btime),
            )| {
                Attr {
                    ino,
                    kind,
                    perm,
                    nlink,
                    uid,
                    gid,
                    rdev,
                    size,
                    blocks,
                    atime,
                    mtime,
                    ctime,
                    btime,
                }
            },
        )
}

fn status() -> impl Strategy<Value = Status> {
    proptest::sample::select(&Status::ALL[1..])
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        Just(Request::Ping),
        Just(Request::Load),
        Just(Request::StatFs),
        bytes16().prop_map(|path| Request::Stat { path }),
        bytes16().prop_map(|path| Request::ReadLink { path }),
        bytes16().prop_map(|path| Request::Hash { path }),
        bytes16().prop_map(|path| Request::HashSparse { path }),
        (bytes16(), any::<u64>(), any::<u32>()).prop_map(|(path, cookie, max_entries)| {
            Request::ReadDir {
                path,
                cookie,
                max_entries,
            }
        }),
        (
            bytes16(),
            any::<u64>(),
            any::<u32>(),
            compression(),
            prop::sample::select(Class::ALL.to_vec())
        )
            .prop_map(|(path, offset, len, compression, class)| Request::Read {
                path,
                offset,
                len,
                compression,
                class,
            }),
        (
            bytes16(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            compression(),
            prop::sample::select(Class::ALL.to_vec())
        )
            .prop_map(
                |(path, cookie, max_entries, max_file, compression, class)| {
                    Request::ReadDirData {
                        path,
                        cookie,
                        max_entries,
                        max_file,
                        compression,
                        class,
                    }
                }
            ),
        proptest::collection::vec(id(), 0..40).prop_map(|ids| Request::IdNames { ids }),
        bytes16().prop_map(|path| Request::DirXattrs { path }),
        (bytes16(), any::<u64>())
            .prop_map(|(path, cookie)| Request::DirXattrsPage { path, cookie }),
        (bytes16(), any::<u32>())
            .prop_map(|(path, max_entries)| Request::ReadTree { path, max_entries }),
        (bytes16(), any::<u64>(), any::<u32>()).prop_map(|(path, offset, max_extents)| {
            Request::DataMap {
                path,
                offset,
                max_extents,
            }
        }),
    ]
}

fn id() -> impl Strategy<Value = Id> {
    prop_oneof![
        any::<u32>().prop_map(Id::User),
        any::<u32>().prop_map(Id::Group)
    ]
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        Just(Response::Pong),
        (
            any::<u16>(),
            any::<u32>(),
            any::<u32>(),
            any::<[u8; 16]>(),
            any::<Option<(u64, u64)>>()
        )
            .prop_map(|(cores, idle_permille, process_permille, boot_id, link)| {
                Response::Load(ServerLoad {
                    cores,
                    idle_permille,
                    process_permille,
                    boot_id,
                    link: link.map(|(sending_micros, limited_micros)| LinkTime {
                        sending_micros,
                        limited_micros,
                    }),
                })
            }),
        proptest::collection::vec(
            (
                bytes16(),
                proptest::collection::vec((bytes16(), bytes16()), 0..4)
            ),
            0..6
        )
        .prop_map(|v| Response::DirXattrs(
            v.into_iter()
                .map(|(name, attrs)| EntryXattrs { name, attrs })
                .collect()
        )),
        (
            proptest::collection::vec(
                (
                    bytes16(),
                    proptest::collection::vec((bytes16(), bytes16()), 0..4)
                ),
                0..6
            ),
            any::<u64>()
        )
            .prop_map(|(v, next)| Response::DirXattrsPage {
                entries: v
                    .into_iter()
                    .map(|(name, attrs)| EntryXattrs { name, attrs })
                    .collect(),
                next
            }),
        (
            attr(),
            any::<u64>(),
            proptest::collection::vec((any::<u64>(), any::<u64>()), 0..30)
        )
            .prop_map(|(a, next, extents)| Response::DataMap(DataMap {
                version: a.version(),
                extents,
                next
            })),
        proptest::collection::vec(
            (id(), proptest::collection::vec(any::<u8>(), 0..=255)),
            0..20
        )
        .prop_map(|v| Response::IdNames(
            v.into_iter()
                .map(|(id, name)| IdName {
                    id,
                    name: Bytes::from(name)
                })
                .collect()
        )),
        attr().prop_map(Response::Attr),
        (
            proptest::collection::vec((bytes16(), any::<u64>(), attr()), 0..20),
            any::<bool>()
        )
            .prop_map(|(es, eof)| Response::DirPage(DirPage {
                entries: es
                    .into_iter()
                    .map(|(name, cookie, attr)| DirEntry { name, cookie, attr })
                    .collect(),
                eof
            })),
        (
            attr(),
            0u8..3,
            any::<u32>(),
            any::<u64>(),
            proptest::option::of(any::<[u8; 32]>()),
            proptest::collection::vec(any::<u8>(), 0..2000)
        )
            .prop_map(
                |(a, lz4, decoded_len, checksum, file_hash, data)| Response::Read(ReadData {
                    version: a.version(),
                    encoding: ENCODINGS[usize::from(lz4)],
                    decoded_len,
                    checksum,
                    file_hash,
                    data: Bytes::from(data)
                })
            ),
        (
            proptest::collection::vec(
                (
                    bytes16(),
                    any::<u64>(),
                    attr(),
                    proptest::option::of((
                        0u8..3,
                        any::<u32>(),
                        any::<u64>(),
                        any::<[u8; 32]>(),
                        proptest::collection::vec(any::<u8>(), 0..300)
                    ))
                ),
                0..12
            ),
            any::<bool>()
        )
            .prop_map(|(es, eof)| Response::DirData(DataPage {
                entries: es
                    .into_iter()
                    .map(|(name, cookie, attr, data)| DataEntry {
                        entry: DirEntry { name, cookie, attr },
                        data: data.map(|(lz4, decoded_len, checksum, blake3, d)| FileData {
                            encoding: ENCODINGS[usize::from(lz4)],
                            decoded_len,
                            checksum,
                            blake3,
                            data: Bytes::from(d),
                        }),
                    })
                    .collect(),
                eof
            })),
        proptest::collection::vec(
            (
                bytes16(),
                proptest::collection::vec((bytes16(), any::<u64>(), attr()), 0..6),
                any::<bool>()
            ),
            0..6
        )
        .prop_map(|dirs| Response::Tree(TreePage {
            dirs: dirs
                .into_iter()
                .map(|(rel, es, eof)| TreeDir {
                    rel,
                    entries: es
                        .into_iter()
                        .map(|(name, cookie, attr)| DirEntry { name, cookie, attr })
                        .collect(),
                    eof,
                })
                .collect(),
        })),
        bytes16().prop_map(Response::Link),
        (attr(), any::<[u8; 32]>()).prop_map(|(a, blake3)| Response::Hash(FileHash {
            version: a.version(),
            blake3
        })),
        (attr(), any::<[u8; 32]>()).prop_map(|(a, blake3)| Response::HashSparse(FileHash {
            version: a.version(),
            blake3
        })),
        any::<[u64; 5]>().prop_map(|v| Response::StatFs(StatFs {
            blocks: v[0],
            bfree: v[1],
            bavail: v[2],
            files: v[3],
            ffree: v[4],
            bsize: 4096,
            namelen: 255,
            frsize: 4096
        })),
        (status(), "[ -~]{0,100}")
            .prop_map(|(status, message)| Response::Error { status, message }),
    ]
}

fn handshake() -> impl Strategy<Value = Handshake> {
    prop_oneof![
        (any::<u16>(), any::<u64>(), any::<u32>(), "[ -~]{0,50}").prop_map(
            |(version, features, chunk_size, client_name)| Handshake::Hello(Hello {
                version,
                features,
                chunk_size,
                client_name
            })
        ),
        (
            any::<(u16, u64, u32, u32, u32)>(),
            any::<[u8; 16]>(),
            proptest::option::of(any::<[u8; 32]>()),
            ZSTD_MIN_LEVEL..=ZSTD_MAX_LEVEL,
        )
            .prop_map(
                |(
                    (version, features, chunk_size, max_frame, max_inflight),
                    instance_id,
                    ch,
                    level,
                )| {
                    Handshake::Welcome(Welcome {
                        version,
                        features,
                        zstd_max_level: (features & ferry_proto::features::ZSTD != 0)
                            .then_some(level),
                        chunk_size,
                        max_frame,
                        max_inflight,
                        instance_id,
                        auth: match ch {
                            None => AuthMethod::None,
                            Some(challenge) => AuthMethod::Token { challenge },
                        },
                    })
                }
            ),
        (any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(|(client_nonce, proof)| {
            Handshake::AuthProof(AuthProof {
                client_nonce,
                proof,
            })
        }),
        any::<[u8; 32]>().prop_map(|server_proof| Handshake::AuthOk(AuthOk { server_proof })),
        (status(), "[ -~]{0,100}")
            .prop_map(|(status, message)| Handshake::Failed { status, message }),
    ]
}

fn one_frame(mut buf: BytesMut) -> Frame {
    let f = Frame::parse(&mut buf, u32::MAX).unwrap().unwrap();
    assert!(buf.is_empty(), "exactly one frame");
    f
}

proptest! {
    #[test]
    fn requests_round_trip(req in request(), id in any::<u32>()) {
        let mut buf = BytesMut::new();
        req.encode(id, &mut buf);
        let f = one_frame(buf);
        prop_assert_eq!(f.request_id, id);
        prop_assert_eq!(Request::decode(f).unwrap(), req);
    }

    #[test]
    fn responses_round_trip(resp in response(), id in any::<u32>()) {
        let mut buf = BytesMut::new();
        let tail = resp.encode(id, &mut buf);
        buf.put_slice(&tail);
        let f = one_frame(buf);
        prop_assert_eq!(f.request_id, id);
        prop_assert_eq!(Response::decode(f).unwrap(), resp);
    }

    #[test]
    fn handshakes_round_trip(msg in handshake()) {
        let mut buf = BytesMut::new();
        msg.encode(&mut buf);
        prop_assert_eq!(Handshake::decode(one_frame(buf)).unwrap(), msg);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096), max in 0u32..1_000_000) {
        let mut buf = BytesMut::from(&data[..]);
        while let Ok(Some(frame)) = Frame::parse(&mut buf, max) {
            let _ = Request::decode(frame.clone());
            let _ = Response::decode(frame.clone());
            let _ = Handshake::decode(frame);
        }
    }

    #[test]
    fn arbitrary_bodies_never_panic(kind in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let frame = Frame { kind, request_id: 1, body: Bytes::from(body) };
        let _ = Request::decode(frame.clone());
        let _ = Response::decode(frame.clone());
        let _ = Handshake::decode(frame);
    }

    #[test]
    fn payloads_round_trip(
        data in proptest::collection::vec(0u8..4, 0..20_000),
        spread in 1u8..=255,
        with in compression(),
    ) {
        // Values 0..4 scaled by `spread`: from very compressible to barely.
        let raw = Bytes::from(data.iter().map(|b| b.wrapping_mul(spread)).collect::<Vec<_>>());
        let (enc, wire) = payload::encode(raw.clone(), with, payload::Lane::Foreground);
        match with {
            Compression::None => prop_assert_eq!(enc, Encoding::Raw),
            Compression::Lz4 => prop_assert_ne!(enc, Encoding::Zstd),
            Compression::Zstd(_) => prop_assert_ne!(enc, Encoding::Lz4),
        }
        if enc != Encoding::Raw {
            prop_assert!(wire.len() < raw.len());
        }
        let back = payload::decode(enc, raw.len() as u32, payload::checksum(&raw), wire).unwrap();
        prop_assert_eq!(back, raw);
    }

    #[test]
    fn corrupt_compressed_payloads_are_errors(
        data in proptest::collection::vec(0u8..4, 4096..20_000),
        with in prop::sample::select(vec![Compression::Lz4, Compression::Zstd(-3), Compression::Zstd(3)]),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let raw = Bytes::from(data);
        let (enc, wire) = payload::encode(raw.clone(), with, payload::Lane::Foreground);
        prop_assert_ne!(enc, Encoding::Raw);
        let mut bad = wire.to_vec();
        bad[at.index(wire.len())] ^= flip;
        // Wrong bytes never come back: a decode error, a checksum mismatch, or (a flip in a
        // part of a zstd frame header that does not change the contents) the same bytes.
        if let Ok(back) = payload::decode(enc, raw.len() as u32, payload::checksum(&raw), Bytes::from(bad)) {
            prop_assert_eq!(back, raw);
        }
    }

    #[test]
    fn truncated_frames_are_incomplete(req in request()) {
        let mut buf = BytesMut::new();
        req.encode(9, &mut buf);
        let full = buf.len();
        for cut in 0..full {
            let mut part = BytesMut::from(&buf[..cut]);
            prop_assert_eq!(Frame::parse(&mut part, u32::MAX), Ok(None));
        }
    }
}

proptest! {
    /// BOUND: a bit flipped anywhere in a Read response before its data (the request id
    /// included), or in the request it answers, changes the checksum the client expects,
    /// so the bytes are fetched again instead of returned.
    #[test]
    fn a_flipped_bit_in_a_read_response_header_or_its_request_fails_the_bound_checksum(
        a in attr(),
        id in any::<u32>(),
        path in bytes16(),
        offset in any::<u64>(),
        len in any::<u32>(),
        hash in proptest::option::of(any::<[u8; 32]>()),
        bit in any::<proptest::sample::Index>(),
    ) {
        let data = Bytes::from_static(b"some bytes");
        let plain = payload::checksum(&data);
        let mut r = ReadData {
            version: a.version(),
            encoding: Encoding::Raw,
            decoded_len: data.len() as u32,
            checksum: plain,
            file_hash: hash,
            data,
        };
        r.checksum ^= r.binding(id, &path, offset, len);
        let mut buf = BytesMut::new();
        let tail = Response::Read(r.clone()).encode(id, &mut buf);
        let fields = buf.len();
        buf.extend_from_slice(&tail);
        // Bits of the id (after the length and kind) up to the end of the fixed fields.
        let at = bit.index((fields - 5) * 8) + 5 * 8;
        buf[at / 8] ^= 1 << (at % 8);
        if let Ok(Some(f)) = Frame::parse(&mut buf, u32::MAX) {
            let got_id = f.request_id;
            if let Ok(Response::Read(g)) = Response::decode(f) {
                prop_assert_ne!(g.checksum ^ g.binding(got_id, &path, offset, len), plain);
            }
        }
        // A request garbled on its way: the server bound the bytes to what it received.
        let mut other = path.to_vec();
        other.push(b'x');
        prop_assert_ne!(r.checksum ^ r.binding(id, &other, offset, len), plain);
        prop_assert_ne!(r.checksum ^ r.binding(id, &path, offset ^ 1, len), plain);
        prop_assert_ne!(r.checksum ^ r.binding(id, &path, offset, len ^ 1), plain);
        prop_assert_eq!(r.checksum ^ r.binding(id, &path, offset, len), plain);
    }
}

#[test]
fn dir_page_count_cannot_force_allocation() {
    // A page claiming 4 billion entries in a tiny body must fail, not allocate.
    let mut body = BytesMut::new();
    body.put_u8(0);
    body.put_u32(u32::MAX);
    let f = Frame {
        kind: 0x92,
        request_id: 1,
        body: body.freeze(),
    };
    assert!(Response::decode(f).is_err());
}

/// The hex dump under `heading` in docs/PROTOCOL.md (the first code block after it, or the
/// `n`th), as bytes.
fn doc_dump(heading: &str, n: usize) -> Vec<u8> {
    let doc = include_str!("../../../docs/PROTOCOL.md");
    let at = doc.find(heading).expect("heading in PROTOCOL.md");
    let block = doc[at..].split("```").nth(2 * n + 1).expect("code block");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .flat_map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>())
        .map(|h| u8::from_str_radix(h, 16).expect("hex byte"))
        .collect()
}

fn example_time() -> Timestamp {
    Timestamp {
        sec: 1_700_000_000,
        nsec: 500_000_000,
    }
}

#[test]
fn the_worked_examples_of_protocol_md_are_what_the_encoders_produce() {
    let t = example_time();
    let attr = Attr {
        ino: 0x1234,
        kind: FileKind::File,
        perm: 0o644,
        nlink: 1,
        uid: 1000,
        gid: 1000,
        rdev: 0,
        size: 6,
        blocks: 8,
        atime: t,
        mtime: t,
        ctime: t,
        btime: t,
    };
    let mut got = BytesMut::new();
    let tail = Response::Attr(attr).encode(2, &mut got);
    got.extend_from_slice(&tail);
    assert_eq!(got.to_vec(), doc_dump("### 13.4 Stat of `a`", 1), "§13.4");

    let data = Bytes::from_static(b"hello\n");
    let read = Response::Read(ReadData {
        version: attr.version(),
        encoding: Encoding::Raw,
        decoded_len: 6,
        checksum: xxhash_rust::xxh3::xxh3_64(&data),
        file_hash: None,
        data: data.clone(),
    });
    let mut got = BytesMut::new();
    let tail = read.encode(3, &mut got);
    got.extend_from_slice(&tail);
    assert_eq!(got.to_vec(), doc_dump("### 13.5 Read of `a`", 1), "§13.5");
}

/// The largest legal requests fit in [`ferry_proto::MAX_REQUEST_FRAME`], which a server
/// buffers at most of a request.
#[test]
fn the_largest_legal_requests_fit_the_request_frame_limit() {
    use ferry_proto::{Class, Id, MAX_ID_NAMES, MAX_REQUEST_FRAME};
    let path = Bytes::from(vec![b'a'; ferry_proto::name::MAX_PATH_LEN - 1]);
    let ids = (0..MAX_ID_NAMES as u32).map(Id::User).collect();
    for req in [
        Request::IdNames { ids },
        Request::ReadDirData {
            path: path.clone(),
            cookie: u64::MAX,
            max_entries: u32::MAX,
            max_file: u32::MAX,
            compression: Compression::Zstd(ZSTD_MIN_LEVEL),
            class: Class::Background,
        },
        Request::Read {
            path: path.clone(),
            offset: u64::MAX,
            len: u32::MAX,
            compression: Compression::Zstd(ZSTD_MAX_LEVEL),
            class: Class::Demand,
        },
        Request::HashSparse { path },
    ] {
        let mut buf = BytesMut::new();
        req.encode(1, &mut buf);
        assert!(
            Frame::check(&buf, MAX_REQUEST_FRAME).is_ok(),
            "{} bytes",
            buf.len()
        );
    }
}
