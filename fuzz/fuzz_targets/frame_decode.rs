//! The frame parser and every message decoder, on arbitrary bytes: errors are fine, panics,
//! hangs and out-of-bounds accesses are not. The payload decoder (raw, lz4 and zstd, length and
//! checksum checks) gets the tail of the input.
#![no_main]

use bytes::{Bytes, BytesMut};
use ferry_proto::{payload, Encoding, Frame, Handshake, Request, Response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = Frame::parse(&mut buf, 1 << 20) {
        let _ = Request::decode(frame.clone());
        let _ = Response::decode(frame.clone());
        let _ = Handshake::decode(frame);
    }
    if data.len() >= 13 {
        let encoding = match data[0] % 3 {
            0 => Encoding::Raw,
            1 => Encoding::Lz4,
            _ => Encoding::Zstd,
        };
        let decoded_len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) % (4 << 20);
        let checksum = u64::from_be_bytes(data[5..13].try_into().unwrap_or([0; 8]));
        let _ = payload::decode(
            encoding,
            decoded_len,
            checksum,
            Bytes::copy_from_slice(&data[13..]),
        );
    }
});
