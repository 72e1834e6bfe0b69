//! What ferryd would send for a file: reads it in chunks and reports the bytes on the wire
//! with ferry's encoder (sampling probe, lz4 kept when it saves 1/16) next to lz4 on every
//! chunk, so a probe that skips compressible chunks shows up.
//!
//!     cargo run --release -p ferry-bench --example wire_ratio -- FILE [CHUNK_KIB]

use std::io::Read;

use bytes::Bytes;
use ferry_proto::payload;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: wire_ratio FILE [CHUNK_KIB]");
        std::process::exit(2);
    };
    let chunk = args
        .next()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1024)
        << 10;
    let mut f = std::fs::File::open(&path)?;
    let (mut raw, mut ferry, mut every, mut skipped, mut skipped_would) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut buf = vec![0u8; chunk];
    loop {
        let mut n = 0;
        while n < chunk {
            match f.read(&mut buf[n..])? {
                0 => break,
                k => n += k,
            }
        }
        if n == 0 {
            break;
        }
        let data = Bytes::copy_from_slice(&buf[..n]);
        raw += n as u64;
        let (enc, wire) = payload::encode(
            data.clone(),
            ferry_proto::Compression::Lz4,
            payload::Lane::Foreground,
        );
        ferry += wire.len() as u64;
        let full = lz4_flex::block::compress(&data).len();
        let best = if payload::worth_compressing(n, full) {
            full
        } else {
            n
        };
        every += best as u64;
        if enc == ferry_proto::Encoding::Raw && best < n {
            skipped += 1;
            skipped_would += (n - best) as u64;
        }
    }
    let mib = |b: u64| b as f64 / 1048576.0;
    println!("{path}: {:.1} MiB in {} KiB chunks", mib(raw), chunk >> 10);
    println!(
        "  ferry encoder: {:.1} MiB on the wire, ratio {:.2}",
        mib(ferry),
        raw as f64 / ferry as f64
    );
    println!(
        "  lz4 every chunk: {:.1} MiB, ratio {:.2}",
        mib(every),
        raw as f64 / every as f64
    );
    println!(
        "  chunks the probe sent raw that lz4 would shrink: {skipped} (would save {:.1} MiB)",
        mib(skipped_would)
    );
    Ok(())
}
