//! Codec and payload path: what ferryd does per chunk (checksum, lz4, zstd at several
//! levels or raw, frame header) and what the client does (frame parse, decode, lz4 or zstd
//! decompress, checksum verify), on database pages, mixed binaries and random data.

#![allow(clippy::unwrap_used)] // benchmarks may panic on setup failures

use bytes::{BufMut, Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferry_bench::{db_chunk, mixed_chunk, random_chunk};
use ferry_proto::{payload, Compression, Frame, ReadData, Request, Response, Version};

const CHUNK: usize = 1 << 20;

/// The codecs measured: lz4 and the zstd levels `--compression auto` chooses among.
const CODECS: [(&str, Compression); 6] = [
    ("lz4", Compression::Lz4),
    ("zstd-3", Compression::Zstd(-3)),
    ("zstd-1", Compression::Zstd(-1)),
    ("zstd1", Compression::Zstd(1)),
    ("zstd3", Compression::Zstd(3)),
    ("zstd6", Compression::Zstd(6)),
];

fn data_sets() -> Vec<(&'static str, Bytes)> {
    vec![
        ("db", db_chunk(CHUNK)),
        ("mixed", mixed_chunk(CHUNK)),
        ("random", random_chunk(CHUNK)),
    ]
}

fn server_side(c: &mut Criterion) {
    let mut g = c.benchmark_group("server_chunk");
    g.throughput(Throughput::Bytes(CHUNK as u64));
    for (name, data) in data_sets() {
        for (codec, with) in CODECS {
            g.bench_with_input(
                BenchmarkId::new(format!("checksum_{codec}_encode"), name),
                &data,
                |b, d| {
                    b.iter(|| {
                        let sum = payload::checksum(d);
                        let (enc, wire) =
                            payload::encode(d.clone(), with, payload::Lane::Foreground);
                        let resp = Response::Read(ReadData {
                            version: Version::default(),
                            encoding: enc,
                            decoded_len: d.len() as u32,
                            checksum: sum,
                            file_hash: None,
                            data: wire,
                        });
                        let mut head = BytesMut::with_capacity(64);
                        let tail = resp.encode(1, &mut head);
                        (head, tail)
                    })
                },
            );
        }
    }
    g.finish();
}

fn client_side(c: &mut Criterion) {
    let mut g = c.benchmark_group("client_chunk");
    g.throughput(Throughput::Bytes(CHUNK as u64));
    for (name, data) in data_sets() {
        for (codec, with) in CODECS {
            let (enc, wire) = payload::encode(data.clone(), with, payload::Lane::Foreground);
            let resp = Response::Read(ReadData {
                version: Version::default(),
                encoding: enc,
                decoded_len: data.len() as u32,
                checksum: payload::checksum(&data),
                file_hash: None,
                data: wire,
            });
            let mut frame = BytesMut::new();
            let tail = resp.encode(1, &mut frame);
            frame.put_slice(&tail);
            let frame = frame.freeze();
            g.bench_with_input(
                BenchmarkId::new(format!("parse_decode_verify_{codec}"), name),
                &frame,
                |b, f| {
                    b.iter(|| {
                        let mut buf = BytesMut::from(&f[..]);
                        let frame = Frame::parse(&mut buf, u32::MAX).unwrap().unwrap();
                        match Response::decode(frame).unwrap() {
                            Response::Read(r) => {
                                payload::decode(r.encoding, r.decoded_len, r.checksum, r.data)
                                    .unwrap()
                            }
                            _ => unreachable!(),
                        }
                    })
                },
            );
        }
    }
    g.finish();
}

fn small_frames(c: &mut Criterion) {
    // 1,000 pipelined Stat requests: the per-request cost of framing on the server.
    let mut stream = BytesMut::new();
    for i in 1..=1000u32 {
        Request::Stat {
            path: Bytes::from(format!("dir/sub/file{i:05}.dat")),
        }
        .encode(i, &mut stream);
    }
    let stream = stream.freeze();
    let mut g = c.benchmark_group("requests");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("parse_decode_1000_stat", |b| {
        b.iter(|| {
            let mut buf = BytesMut::from(&stream[..]);
            let mut n = 0;
            while let Some(f) = Frame::parse(&mut buf, 1 << 20).unwrap() {
                Request::decode(f).unwrap();
                n += 1;
            }
            n
        })
    });
    g.finish();
}

criterion_group!(benches, server_side, client_side, small_frames);
criterion_main!(benches);
