//! Read payloads. Each read response states how its data is encoded (raw, an lz4 block or
//! a zstd frame), the decoded length, and the xxh3-64 checksum of the decoded bytes, so the
//! receiver detects corruption the TCP checksum missed and never returns wrong bytes.
//!
//! The requester says which [`Compression`] it wants (per request); the sender still sends a
//! chunk raw when compressing it does not save at least 1/16 of its bytes.

use std::cell::RefCell;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};

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
    /// A zstd decompression context per thread (a few hundred KiB: one-shot decoding into
    /// the caller's buffer needs no window of its own).
    static ZSTD_DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// What one compression needs: scratch space for the compressed bytes (incompressible chunks
/// then cost no allocation at all, compressible ones only one of their compressed size) and
/// a zstd context (making one costs more than compressing a small chunk).
struct Coder {
    scratch: Vec<u8>,
    /// The context and the level it is set to.
    zstd: Option<(i8, zstd::bulk::Compressor<'static>)>,
}

/// The coders of this process, shared by all its threads. Compressing is CPU work, so more
/// coders than CPUs would compress no faster; what bounds them bounds their memory: a coder
/// holds up to a chunk's bound of scratch and a context of up to about 3 MiB (level 6 on
/// 1 MiB chunks; 10 MiB at level 9). One per thread and level, as before, took 27-35
/// threads of a busy ferryd with every level its clients asked for to over 250 MiB.
struct Coders {
    idle: Mutex<Idle>,
    freed: Condvar,
}

struct Idle {
    coders: Vec<Coder>,
    /// Coders in existence (idle or in use).
    made: usize,
}

impl Coders {
    const fn new() -> Coders {
        Coders {
            idle: Mutex::new(Idle {
                coders: Vec::new(),
                made: 0,
            }),
            freed: Condvar::new(),
        }
    }
}

/// The coders of each [`Lane`].
static CODERS: [Coders; 2] = [Coders::new(), Coders::new()];

/// Which coders a compression uses. Background work has its own: a thread at low CPU
/// priority (the mirror's reads in ferryd) then never holds a coder that a reader's request
/// waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Foreground,
    Background,
}

impl Lane {
    /// The lane of a compression done for a background read (or not).
    pub fn of(background: bool) -> Lane {
        if background {
            Lane::Background
        } else {
            Lane::Foreground
        }
    }

    fn coders(self) -> &'static Coders {
        &CODERS[self as usize]
    }
}

/// At most this many coders exist in each lane: one per CPU, and at least two.
fn max_coders() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(2, std::num::NonZeroUsize::get)
            .max(2)
    })
}

impl Coders {
    /// Runs `f` with a coder, waiting for one while all are in use (for at most the time
    /// one compression takes: a coder is held only by a call of this function, which never
    /// nests). One already set to `level` is preferred.
    fn with<T>(&self, level: Option<i8>, f: impl FnOnce(&mut Coder) -> T) -> T {
        let coder = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                let same = idle
                    .coders
                    .iter()
                    .rposition(|c| level.is_some() && c.zstd.as_ref().map(|z| z.0) == level);
                if let Some(at) = same.or(idle.coders.len().checked_sub(1)) {
                    break idle.coders.swap_remove(at);
                }
                if idle.made < max_coders() {
                    idle.made += 1;
                    break Coder {
                        scratch: Vec::new(),
                        zstd: None,
                    };
                }
                idle = self
                    .freed
                    .wait(idle)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        // Given back even if `f` panics (its scratch and context stay valid).
        let mut back = Back(self, coder);
        f(&mut back.1)
    }
}

/// Gives its coder back to the pool when dropped.
struct Back<'a>(&'a Coders, Coder);

impl Drop for Back<'_> {
    fn drop(&mut self) {
        let coder = std::mem::replace(
            &mut self.1,
            Coder {
                scratch: Vec::new(),
                zstd: None,
            },
        );
        let mut idle = self.0.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.coders.push(coder);
        self.0.freed.notify_one();
    }
}

/// Size of each sample [`looks_compressible`] compresses.
const SAMPLE: usize = 8 << 10;

/// A cheap guess whether `raw` is worth compressing: three samples (start, middle, end)
/// are compressed, about 1/40 of the work for a 1 MiB chunk. Incompressible data (random,
/// already compressed or encrypted files) then costs almost nothing; data that is only
/// partly compressible is still compressed whole, and [`worth_compressing`] decides.
pub fn looks_compressible(raw: &[u8]) -> bool {
    looks_compressible_with(raw, Compression::Lz4, Lane::Foreground)
}

/// [`looks_compressible`] with the samples compressed as `with` would (zstd finds savings
/// where lz4 finds none: skewed byte frequencies without repeats).
fn looks_compressible_with(raw: &[u8], with: Compression, lane: Lane) -> bool {
    if raw.len() < 4 * SAMPLE {
        return true;
    }
    let mid = raw.len() / 2 - SAMPLE / 2;
    [0, mid, raw.len() - SAMPLE].iter().any(|&at| {
        compress_to_scratch(&raw[at..at + SAMPLE], with, lane.coders(), |out| {
            out.is_some_and(|out| worth_compressing(SAMPLE, out.len()))
        })
    })
}

/// Compresses `raw` as `with` says into the scratch space of one of `coders` and calls `then` with
/// the compressed bytes (`None`: they would not be smaller than `raw`, or `with` is
/// `None`).
fn compress_to_scratch<T>(
    raw: &[u8],
    with: Compression,
    coders: &Coders,
    then: impl FnOnce(Option<&[u8]>) -> T,
) -> T {
    let level = match with {
        Compression::Zstd(level) => Some(level),
        _ => None,
    };
    coders.with(level, |coder| {
        let out = &mut coder.scratch;
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
                zstd_compress(&mut coder.zstd, raw, level, &mut out[..need])
            }
        };
        then(n.filter(|&n| n < raw.len()).map(|n| &out[..n]))
    })
}

/// Compresses `raw` at `level` into `out` with the coder's context `zstd` (made, or set to
/// `level`, as needed): the compressed length, or `None` when it does not fit in `out`.
fn zstd_compress(
    zstd: &mut Option<(i8, zstd::bulk::Compressor<'static>)>,
    raw: &[u8],
    level: i8,
    out: &mut [u8],
) -> Option<usize> {
    match zstd {
        Some((at, c)) if *at != level => {
            if c.set_compression_level(i32::from(level)).is_err() {
                *zstd = None;
                return None;
            }
            *at = level;
        }
        Some(_) => {}
        None => *zstd = Some((level, zstd::bulk::Compressor::new(i32::from(level)).ok()?)),
    }
    let (_, c) = zstd.as_mut()?;
    c.compress_to_buffer(raw, out).ok()
}

/// Compresses `raw` as `with` says (no check whether it is worth it): for measuring codecs
/// on samples ([`encode`] is what senders use).
pub fn compress(raw: &[u8], with: Compression) -> Option<Bytes> {
    compress_to_scratch(raw, with, Lane::Foreground.coders(), |out| {
        out.map(Bytes::copy_from_slice)
    })
}

/// Encodes `raw` for the wire as `with` asks when that shrinks it meaningfully, else raw.
/// Returns the encoding and the bytes to send. `lane`: whose coders compress it.
pub fn encode(raw: Bytes, with: Compression, lane: Lane) -> (Encoding, Bytes) {
    if with == Compression::None || raw.len() < 512 || !looks_compressible_with(&raw, with, lane) {
        return (Encoding::Raw, raw);
    }
    let encoding = match with {
        Compression::Zstd(_) => Encoding::Zstd,
        _ => Encoding::Lz4,
    };
    compress_to_scratch(&raw, with, lane.coders(), |out| match out {
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
    use std::time::Duration;

    use super::*;

    /// 1 MiB that compresses about 3:1 at zstd -1: bytes of a small alphabet, skewed.
    fn skewed(len: usize) -> Bytes {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b"aaaabbbcd  \n0123"[(x % 16) as usize]
            })
            .collect()
    }

    #[test]
    fn threads_at_every_level_share_at_most_one_coder_per_cpu() {
        let coders = Coders::new();
        let raw = skewed(256 << 10);
        let sum = checksum(&raw);
        let all: Vec<Compression> = (-7..=6)
            .map(Compression::Zstd)
            .chain([Compression::Lz4])
            .collect();
        std::thread::scope(|s| {
            for t in 0..24 {
                let (raw, all, coders) = (&raw, &all, &coders);
                s.spawn(move || {
                    for i in 0..all.len() {
                        let with = all[(i + t) % all.len()];
                        let encoding = match with {
                            Compression::Lz4 => Encoding::Lz4,
                            _ => Encoding::Zstd,
                        };
                        let wire = compress_to_scratch(raw, with, coders, |out| {
                            Bytes::copy_from_slice(out.expect("it compresses"))
                        });
                        let back = decode(encoding, raw.len() as u32, sum, wire);
                        assert_eq!(back.as_ref(), Ok(raw), "{with}");
                    }
                });
            }
        });
        // 24 threads and 15 codecs: one context per thread and level would be 24 x 14.
        let idle = coders.idle.lock().unwrap();
        assert!(idle.made <= max_coders(), "{} coders", idle.made);
        assert_eq!(idle.coders.len(), idle.made);
    }

    #[test]
    fn a_foreground_compression_never_waits_for_a_background_coder() {
        let raw = skewed(64 << 10);
        let (held_tx, held) = std::sync::mpsc::channel();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let wait = Mutex::new(wait);
        std::thread::scope(|s| {
            for _ in 0..max_coders() {
                let (held_tx, wait) = (held_tx.clone(), &wait);
                s.spawn(move || {
                    Lane::Background.coders().with(Some(1), |_| {
                        held_tx.send(()).unwrap();
                        // Like a low-priority thread that does not get the CPU.
                        let _ = wait.lock().unwrap().recv();
                    })
                });
            }
            for _ in 0..max_coders() {
                held.recv_timeout(Duration::from_secs(10))
                    .expect("a background coder was taken");
            }
            let (done, got) = std::sync::mpsc::channel();
            let raw = raw.clone();
            s.spawn(move || done.send(encode(raw, Compression::Zstd(1), Lane::Foreground)));
            let got = got.recv_timeout(Duration::from_secs(10));
            drop(release);
            let (encoding, _) = got.expect("the foreground compression waited");
            assert_eq!(encoding, Encoding::Zstd);
        });
    }

    #[test]
    fn a_coder_comes_back_when_its_user_panics() {
        let coders = Coders::new();
        for _ in 0..3 {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                coders.with(None, |_| panic!("the user of the coder failed"))
            }));
            assert!(r.is_err());
            let idle = coders.idle.lock().unwrap();
            assert_eq!((idle.made, idle.coders.len()), (1, 1));
        }
    }

    #[test]
    fn compressible_goes_lz4_and_back() {
        let raw = Bytes::from(vec![7u8; 100_000]);
        let (enc, wire) = encode(raw.clone(), Compression::Lz4, Lane::Foreground);
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
        let (enc, _) = encode(Bytes::from(raw), Compression::Lz4, Lane::Foreground);
        assert_eq!(enc, Encoding::Raw);
    }

    #[test]
    fn zstd_at_every_level_goes_and_comes_back() {
        let raw: Bytes = (0..200_000u32)
            .map(|i| (i % 251 / 7) as u8)
            .collect::<Vec<_>>()
            .into();
        for level in [ZSTD_MIN_LEVEL, -1, 1, 3, 9, ZSTD_MAX_LEVEL] {
            let (enc, wire) = encode(raw.clone(), Compression::Zstd(level), Lane::Foreground);
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
