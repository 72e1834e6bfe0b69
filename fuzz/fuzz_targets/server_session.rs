//! ferryd's connection handling after the preamble — handshake, request decoding, every
//! request kind against a small export — on arbitrary client bytes. The input is prefixed
//! with a valid Hello half of the time, so that request handling is reached.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn export() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("ferry-fuzz-export-{}", std::process::id()));
        let _ = std::fs::create_dir_all(d.join("a/b"));
        let _ = std::fs::write(d.join("f"), vec![7u8; 200_000]);
        let _ = std::fs::write(d.join("a/small"), b"hello");
        let _ = std::fs::write(d.join("a/b/c"), b"");
        let _ = std::os::unix::fs::symlink("/", d.join("root"));
        let _ = std::os::unix::fs::symlink("../f", d.join("a/up"));
        d
    })
}

fn hello() -> Vec<u8> {
    let mut out = bytes::BytesMut::new();
    ferry_proto::Handshake::Hello(ferry_proto::Hello {
        version: 1,
        features: ferry_proto::features::ALL,
        chunk_size: 64 << 10,
        client_name: "fuzz".into(),
    })
    .encode(&mut out);
    out.to_vec()
}

fuzz_target!(|data: &[u8]| {
    let input = match data.split_first() {
        Some((flag, rest)) if flag & 1 == 1 => [hello(), rest.to_vec()].concat(),
        _ => data.to_vec(),
    };
    ferry_server::fuzz_serve(export(), &input);
});
