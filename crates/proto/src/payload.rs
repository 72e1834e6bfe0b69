//! Read payloads. Each read response states how its data is encoded (raw, an lz4 block or
//! a zstd frame), the decoded length, and the xxh3-64 checksum of the decoded bytes, so the
//! receiver detects corruption the TCP checksum missed and never returns wrong bytes.
//!
//! The requester says which [`Compression`] it wants (per request); the sender still sends a
//! chunk raw when compressing it does not save at least 1/16 of its bytes.

use std::cell::RefCell;

use bytes::Bytes;

/// How a read payload's bytes are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// The bytes as read.
    Raw,
    /// One lz4 block (lz4_flex `block` format, no frame, no size prefix).
    Lz4,
    /// One zstd frame (RFC 8878) holding exactly the decoded bytes.
    Zstd,
}

impl Encoding {
    pub(crate) fn to_u8(self) -> u8 {
        match self {
            Encoding::Raw => 0,
            Encoding::Lz4 => 1,
            Encoding::Zstd => 2,
        }
    }
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Encoding::Raw),
            1 => Some(Encoding::Lz4),
            2 => Some(Encoding::Zstd),
            _ => None,
        }
    }
}

/// The lowest zstd level a request may ask for (zstd's `--fast=7`).
pub const ZSTD_MIN_LEVEL: i8 = -7;
/// The highest zstd level a request may ask for.
pub const ZSTD_MAX_LEVEL: i8 = 22;

/// The compression a reader asks for: carried in each Read and ReadDirData request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Compression {
    /// Send raw bytes.
    None,
    /// lz4 (block format); requires the LZ4 feature.
    Lz4,
    /// zstd at this level ([`ZSTD_MIN_LEVEL`]`..=`[`ZSTD_MAX_LEVEL`]; negative levels are
    /// zstd's fast ones); requires the ZSTD feature.
    Zstd(i8),
}

impl Compression {
    /// Whether the level is one a request may carry.
    pub fn is_valid(self) -> bool {
        match self {
            Compression::Zstd(l) => (ZSTD_MIN_LEVEL..=ZSTD_MAX_LEVEL).contains(&l),
            _ => true,
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Lz4 => f.write_str("lz4"),
            Compression::Zstd(l) => write!(f, "zstd:{l}"),
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;

    /// `none`, `lz4`, `zstd` (level 1) or `zstd:LEVEL`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "compression {s:?} is not one of none, lz4, zstd or zstd:LEVEL \
                 ({ZSTD_MIN_LEVEL} to {ZSTD_MAX_LEVEL})"
            )
        };
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd(1)),
            _ => {
                let level = s.strip_prefix("zstd:").ok_or_else(bad)?;
                let c = Compression::Zstd(level.parse().map_err(|_| bad())?);
                if c.is_valid() {
                    Ok(c)
                } else {
                    Err(bad())
                }
            }
        }
    }
}

/// A payload that failed to decode or verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// lz4 data was malformed or did not decode to the stated length.
    #[error("lz4 payload does not decode to {expected} bytes")]
    Lz4 {
        /// Decoded length stated by the sender.
        expected: u32,
    },
    /// zstd data was malformed or did not decode to the stated length.
    #[error("zstd payload does not decode to {expected} bytes")]
    Zstd {
        /// Decoded length stated by the sender.
        expected: u32,
    },
    /// A raw payload's length differs from the stated decoded length.
    #[error("raw payload is {actual} bytes, {expected} stated")]
    Length {
        /// Stated.
        expected: u32,
        /// Received.
        actual: usize,
    },
    /// The checksum of the decoded bytes does not match.
    #[error("checksum mismatch: got {actual:016x}, expected {expected:016x}")]
    Checksum {
        /// Stated by the sender.
        expected: u64,
        /// Computed here.
        actual: u64,
    },
}

/// The checksum carried with every read: xxh3-64 of the decoded bytes.
pub fn checksum(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data)
}

/// Compression is kept only when it saves at least 1/16 of the bytes; otherwise the
/// receiver's decode time is not worth it.
pub fn worth_compressing(raw_len: usize, compressed_len: usize) -> bool {
    compressed_len + raw_len / 16 <= raw_len
}

thread_local! {
    /// Compression scratch space, one per thread: incompressible chunks then cost no
    /// allocation at all, and compressible ones only an allocation of their compressed size.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// zstd compression contexts, one per level and thread (making one costs more than
    /// compressing a small chunk).
    static ZSTD_CCTX: RefCell<Vec<(i8, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(Vec::new()) };
    /// A zstd decompression context per thread.
    static ZSTD_DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Size of each sample [`looks_compressible`] compresses.
const SAMPLE: usize = 8 << 10;

/// A cheap guess whether `raw` is worth compressing: three samples (start, middle, end)
/// are compressed, about 1/40 of the work for a 1 MiB chunk. Incompressible data (random,
/// already compressed or encrypted files) then costs almost nothing; data that is only
/// partly compressible is still compressed whole, and [`worth_compressing`] decides.
pub fn looks_compressible(raw: &[u8]) -> bool {
    looks_compressible_with(raw, Compression::Lz4)
}

/// [`looks_compressible`] with the samples compressed as `with` would (zstd finds savings
/// where lz4 finds none: skewed byte frequencies without repeats).
fn looks_compressible_with(raw: &[u8], with: Compression) -> bool {
    if raw.len() < 4 * SAMPLE {
        return true;
    }
    let mid = raw.len() / 2 - SAMPLE / 2;
    [0, mid, raw.len() - SAMPLE].iter().any(|&at| {
        compress_to_scratch(&raw[at..at + SAMPLE], with, |out| {
            out.is_some_and(|out| worth_compressing(SAMPLE, out.len()))
        })
    })
}

/// Compresses `raw` as `with` says into this thread's scratch space and calls `then` with
/// the compressed bytes (`None`: they would not be smaller than `raw`, or `with` is
/// `None`).
fn compress_to_scratch<T>(
    raw: &[u8],
    with: Compression,
    then: impl FnOnce(Option<&[u8]>) -> T,
) -> T {
    SCRATCH.with(|scratch| {
        let mut out = scratch.borrow_mut();
        let n = match with {
            Compression::None => None,
            Compression::Lz4 => {
                let need = lz4_flex::block::get_maximum_output_size(raw.len());
                if out.len() < need {
                    out.resize(need, 0);
                }
                lz4_flex::block::compress_into(raw, &mut out[..need]).ok()
            }
            Compression::Zstd(level) => {
                // Only results that save 1/16 are kept, so a bound of the input's size is
                // enough (zstd fails cleanly when its output would not fit).
                let need = raw.len();
                if out.len() < need {
                    out.resize(need, 0);
                }
                zstd_compress(raw, level, &mut out[..need])
            }
        };
        then(n.filter(|&n| n < raw.len()).map(|n| &out[..n]))
    })
}

/// Compresses `raw` at `level` into `out` with this thread's context for that level:
/// the compressed length, or `None` when it does not fit in `out`.
fn zstd_compress(raw: &[u8], level: i8, out: &mut [u8]) -> Option<usize> {
    ZSTD_CCTX.with(|cctx| {
        let mut all = cctx.borrow_mut();
        let at = match all.iter().position(|(l, _)| *l == level) {
            Some(at) => at,
            None => {
                let c = zstd::bulk::Compressor::new(i32::from(level)).ok()?;
                all.push((level, c));
                all.len() - 1
            }
        };
        all[at].1.compress_to_buffer(raw, out).ok()
    })
}

/// Compresses `raw` as `with` says (no check whether it is worth it): for measuring codecs
/// on samples ([`encode`] is what senders use).
pub fn compress(raw: &[u8], with: Compression) -> Option<Bytes> {
    compress_to_scratch(raw, with, |out| out.map(Bytes::copy_from_slice))
}

/// Encodes `raw` for the wire as `with` asks when that shrinks it meaningfully, else raw.
/// Returns the encoding and the bytes to send.
pub fn encode(raw: Bytes, with: Compression) -> (Encoding, Bytes) {
    if with == Compression::None || raw.len() < 512 || !looks_compressible_with(&raw, with) {
        return (Encoding::Raw, raw);
    }
    let encoding = match with {
        Compression::Zstd(_) => Encoding::Zstd,
        _ => Encoding::Lz4,
    };
    compress_to_scratch(&raw, with, |out| match out {
        Some(out) if worth_compressing(raw.len(), out.len()) => {
            (encoding, Bytes::copy_from_slice(out))
        }
        _ => (Encoding::Raw, raw.clone()),
    })
}

/// Decodes and verifies a payload. Raw payloads are returned without copying.
pub fn decode(
    encoding: Encoding,
    decoded_len: u32,
    expected_checksum: u64,
    data: Bytes,
) -> Result<Bytes, PayloadError> {
    let out = match encoding {
        Encoding::Raw => {
            if data.len() != decoded_len as usize {
                return Err(PayloadError::Length {
                    expected: decoded_len,
                    actual: data.len(),
                });
            }
            data
        }
        Encoding::Zstd => {
            // Into capacity of exactly the stated length: a frame that would decode to more
            // (a decompression bomb) fails instead of allocating.
            let mut out = Vec::with_capacity(decoded_len as usize);
            let ok = ZSTD_DCTX.with(|d| {
                let mut d = d.borrow_mut();
                if d.is_none() {
                    *d = zstd::bulk::Decompressor::new().ok();
                }
                d.as_mut()
                    .is_some_and(|d| d.decompress_to_buffer(&data, &mut out).is_ok())
            });
            if !ok || out.len() != decoded_len as usize {
                return Err(PayloadError::Zstd {
                    expected: decoded_len,
                });
            }
            Bytes::from(out)
        }
        Encoding::Lz4 => {
            // Into fresh capacity (no zeroing first); the checked decoder never writes
            // past `decoded_len`.
            match lz4_flex::block::decompress(&data, decoded_len as usize) {
                Ok(out) if out.len() == decoded_len as usize => Bytes::from(out),
                _ => {
                    return Err(PayloadError::Lz4 {
                        expected: decoded_len,
                    })
                }
            }
        }
    };
    let actual = checksum(&out);
    if actual != expected_checksum {
        return Err(PayloadError::Checksum {
            expected: expected_checksum,
            actual,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressible_goes_lz4_and_back() {
        let raw = Bytes::from(vec![7u8; 100_000]);
        let (enc, wire) = encode(raw.clone(), Compression::Lz4);
        assert_eq!(enc, Encoding::Lz4);
        assert!(wire.len() < 1000);
        let back = decode(enc, raw.len() as u32, checksum(&raw), wire).unwrap();
        assert_eq!(back, raw);
    }

    #[test]
    fn incompressible_stays_raw() {
        let mut x = 0x1234_5678_u64;
        let raw: Vec<u8> = (0..65536)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let (enc, _) = encode(Bytes::from(raw), Compression::Lz4);
        assert_eq!(enc, Encoding::Raw);
    }

    #[test]
    fn zstd_at_every_level_goes_and_comes_back() {
        let raw: Bytes = (0..200_000u32)
            .map(|i| (i % 251 / 7) as u8)
            .collect::<Vec<_>>()
            .into();
        for level in [ZSTD_MIN_LEVEL, -1, 1, 3, 9, ZSTD_MAX_LEVEL] {
            let (enc, wire) = encode(raw.clone(), Compression::Zstd(level));
            assert_eq!(enc, Encoding::Zstd, "level {level}");
            // The fast levels skip much of the matching; the others find the period.
            let most = if level >= 1 {
                raw.len() / 4
            } else {
                raw.len() * 15 / 16
            };
            assert!(wire.len() <= most, "level {level}: {}", wire.len());
            let back = decode(enc, raw.len() as u32, checksum(&raw), wire).unwrap();
            assert_eq!(back, raw);
        }
    }

    #[test]
    fn a_zstd_frame_decoding_to_more_than_stated_is_refused_without_allocating_it() {
        // 64 MiB of zeros compress to a few KiB; stated as 4 KiB it must fail, not grow.
        let bomb = compress(&vec![0u8; 64 << 20], Compression::Zstd(1)).unwrap();
        assert!(bomb.len() < 64 << 10);
        assert!(matches!(
            decode(Encoding::Zstd, 4096, 0, bomb),
            Err(PayloadError::Zstd { expected: 4096 })
        ));
    }

    #[test]
    fn compression_names_parse_and_print() {
        for (s, c) in [
            ("none", Compression::None),
            ("lz4", Compression::Lz4),
            ("zstd", Compression::Zstd(1)),
            ("zstd:-7", Compression::Zstd(-7)),
            ("zstd:19", Compression::Zstd(19)),
        ] {
            assert_eq!(s.parse::<Compression>(), Ok(c));
        }
        assert_eq!(Compression::Zstd(-3).to_string(), "zstd:-3");
        for bad in ["zstd:23", "zstd:-8", "zstd:x", "gzip", ""] {
            let e = bad.parse::<Compression>().unwrap_err();
            assert!(e.contains("none, lz4, zstd or zstd:LEVEL"), "{e}");
        }
    }

    #[test]
    fn corruption_is_caught() {
        let raw = Bytes::from(vec![1u8; 4096]);
        let sum = checksum(&raw);
        let mut bad = raw.to_vec();
        bad[100] ^= 1;
        assert!(matches!(
            decode(Encoding::Raw, 4096, sum, Bytes::from(bad)),
            Err(PayloadError::Checksum { .. })
        ));
        assert!(matches!(
            decode(Encoding::Lz4, 4096, sum, Bytes::from_static(b"\xff\xff")),
            Err(PayloadError::Lz4 { .. })
        ));
    }
}
